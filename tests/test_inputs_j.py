"""Bug-bash of today's Hugging Face families and the recurrent-state KV accounting (helper j):
each test failed before its fix. No compile."""

import argparse

import pytest

from jaxprice._src import cli_price, serve


def _model(name, chip, tp=1):
    return cli_price.load_scenario_deployment(name, None, argparse.Namespace(
        chip=chip, tp=str(tp), dp=None, ep=None, weights=None, gpus_per_node=None, fabric=None))


@pytest.fixture(scope="module")
def qwen35():
    return _model("qwen3.5-35b-a3b", "h100")


@pytest.mark.parametrize("ref_len", [128 + 1024, 1024 + 64, 8 + 16])
def test_a_hybrid_runs_resident_requests_never_hold_more_than_the_pool(qwen35, ref_len):
    """Qwen3.5-35B-A3B on one H100: 3.32 GB of KV pool, 60 MiB of GDN state per request. The
    state was spread over the tokens at the run's typical length, so requests shorter than that
    fit many times over: `serve --isl 128 --osl 2048 --concurrency 256` held 256 requests, 5.1 x
    the pool (Nemotron 3 Nano on one H100 at C=1024: 6.7 x). Now the pool keeps the state of at
    most max_num_seqs requests (lowered to those that fit at the typical length) and the rest
    holds tokens: every resident set the scheduler may hold (at most max_num_seqs requests, at
    most kv_blocks blocks) fits the pool, one max_model_len request still fits, and at the typical
    length the capacity is the same. No compile."""
    m = qwen35.plan.memory
    S, b = m["recurrent_state_bytes_per_request"], m["kv_bytes_per_token"]
    assert S == pytest.approx(60 * 2 ** 20, rel=1e-3) and b == 20480
    pool = m["kv_capacity_tokens"] * b
    out, src = serve.engine_settings(qwen35, ref_len=float(ref_len))
    held = out["max_num_seqs"] * S + (out["kv_blocks"] + 1) * out["block_size"] * b
    assert held <= pool * (1 + 1e-12)
    typical = int(pool // (S + b * ref_len))           # the requests that fit at the typical length
    one_long = int((pool - b * out["max_model_len"]) // S)      # beside one max_model_len request
    assert out["max_num_seqs"] == min(typical, one_long) < 1024
    assert "recurrent state" in src["max_num_seqs"][1]
    assert (out["kv_blocks"] + 1) * out["block_size"] >= out["max_model_len"]
    if typical <= one_long:        # at the typical length the capacity is the spread one
        spread = serve.windowed_kv_capacity(m["kv_capacity_tokens"], b, (), float(ref_len), 16, S)
        assert abs(out["kv_capacity_tokens"] - spread) <= ref_len + S / b     # one request's worth at most


def test_a_model_without_recurrent_layers_keeps_max_num_seqs():
    dense = _model("mimo-7b-base", "h100")
    out, src = serve.engine_settings(dense, ref_len=1100.0)
    assert out["max_num_seqs"] == 1024 and out["kv_capacity_tokens"] == dense.plan.memory["kv_capacity_tokens"]


@pytest.mark.parametrize("expand", [None, {}, [2], "2", True])
def test_nemotron_h_expand_that_is_not_a_number_is_left_alone(tmp_path, expand):
    """import-model does not read a Nemotron-H config's ``expand`` (vLLM sizes the Mamba2 mixer
    as mamba_num_heads x mamba_head_dim) and only notes a number that disagrees; ``"expand":
    null`` raised TypeError (None * hidden_size) out of import-model, a traceback."""
    import json
    from pathlib import Path

    from jaxprice._src import hf
    src = Path(__file__).resolve().parents[1] / "testdata/hf/nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16/config.json"
    cfg = json.loads(src.read_text())
    base = hf.import_result(src, name="nano")
    cfg["expand"] = expand
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    got = hf.import_result(tmp_path / "config.json", name="nano")
    assert got.doc["layer_kinds"] == base.doc["layer_kinds"]
    assert not any("expand not read" in s for s in got.inferred)
    cfg["expand"] = 3                                # a number that disagrees: noted, not read
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert any("expand not read" in s for s in hf.import_result(tmp_path / "config.json", name="nano").inferred)


@pytest.mark.parametrize("key, empty", [("layers_block_type", []), ("hybrid_override_pattern", "")])
def test_nemotron_h_with_no_layer_is_refused_in_one_line(tmp_path, key, empty):
    """Nemotron 3 Ultra states no num_hidden_layers (its count is the pattern's length): an empty
    layers_block_type (or hybrid_override_pattern) gave a model of 0 layers, and import-model
    died with TypeError in _compress. Now refused naming the key."""
    import json
    from pathlib import Path

    from clirefusal import import_refused
    hf_dir = Path(__file__).resolve().parents[1] / "testdata/hf"
    src = hf_dir / "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4/config.json"
    cfg = json.loads(src.read_text())
    assert cfg.get("num_hidden_layers") is None
    cfg[key] = empty
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    import_refused(tmp_path / "config.json", key, empty, "names no layer")
