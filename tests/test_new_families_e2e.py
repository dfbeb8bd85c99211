"""The new Hugging Face families (Gemma 4, ModelOpt NVFP4 / MIXED_PRECISION checkpoints, Kimi-K3)
as a practitioner sizing a fleet uses them: the plan's KV geometry checked by hand from the
config, the sliding layers' reads bounded by their window, the weight formats size offers for a
checkpoint that is already NVFP4, and the launch line of a model vLLM has no implementation of."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

import jaxprice as jp
from jaxprice._src import launch, serve
from jaxprice._src import size as S
from jaxprice._src.cli_price import model_deployment
from jaxprice._src.layouts import build_scenario, load_model, weight_formats

HF = Path(__file__).resolve().parent.parent / "testdata" / "hf"
GEMMA = str(HF / "google--gemma-4-26B-A4B")


def _deployment(model, chip, tp, kv_cache_dtype=None):
    args = argparse.Namespace(chip=chip, tp=tp, dp=None, ep=False, weights=None, gpus_per_node=None, fabric=None,
                              coefficients=None, gpu_memory_utilization=None, kv_cache_dtype=kv_cache_dtype,
                              cudagraph_mode=None, max_num_seqs=None, max_num_batched_tokens=None, block_size=None,
                              kv_capacity_tokens=None, max_model_len=None)
    return model_deployment(model, args)


@pytest.fixture(scope="module")
def gemma():
    return _deployment(GEMMA, "h200", 8)


def test_gemma4_kv_geometry_by_hand(gemma):
    """gemma-4-26B-A4B on 8 H200, a bf16 cache (bf16 weights): a sliding layer keeps 8 KV heads of
    256 over tp 8, one head per rank, K and V: 1 x 256 x 2 x 2 B = 1,024 B per token; a global layer
    2 KV heads of 512 (k = v in the checkpoint, yet K and V are cached: V is normed apart from K),
    replicated to one per rank: 1 x 512 x 2 x 2 B = 2,048 B. 25 sliding + 5 global layers: 35,840 B
    per token, 25,600 of it in layers with a 1,024-token window."""
    m = gemma.plan.memory
    assert m["kv_bytes_per_token"] == 25 * 1024 + 5 * 2048 == 35840
    assert tuple(m["kv_window_bytes_per_token"]) == ((1024.0, 25600.0),)
    # vLLM's hybrid KV-cache manager frees a sliding layer's blocks past its window: at a 32k
    # resident length a request holds 10,240 + 25,600 x (1024 + 16) / 32768 B per token, 3.2 x the
    # tokens full attention everywhere would hold
    cap = serve.windowed_kv_capacity(m["kv_capacity_tokens"], m["kv_bytes_per_token"],
                                     m["kv_window_bytes_per_token"], 32768.0, 16)
    held = 10240 + 25600 * 1040 / 32768
    assert cap == pytest.approx(m["kv_capacity_tokens"] * 35840 / held, rel=1e-12)
    assert 3.1 < cap / m["kv_capacity_tokens"] < 3.3


def test_gemma4_sliding_reads_are_bounded_by_the_window(gemma):
    """256 decodes at context 1,024 and at 4,096: only the 5 global layers read more (3,072 more
    tokens x 2,048 B x 256 requests each, at the measured GQA decode rate); the 25 sliding layers
    read their 1,024-token window at both."""
    d = gemma
    rate = d.coefficients["attention_decode_rate"]
    batches = jp.Batch.stack([jp.Batch.decode(256, c, pad_to=256, decode_threshold=8) for c in (1024, 4096)])
    r = jp.price_many(d.plan, d.coefficients, batches)
    hbm = np.asarray(r.resources)[:, 1]
    assert hbm[1] - hbm[0] == pytest.approx(5 * 256 * 3072 * 2048 / rate, rel=1e-9)


def test_a_modelopt_nvfp4_checkpoint_is_served_as_it_is():
    """nvidia/Gemma-4-26B-A4B-NVFP4 (NVFP4 experts, the rest left bf16) and Qwen3.6-35B-A3B-NVFP4
    (MIXED_PRECISION: NVFP4 experts, FP8 elsewhere) ARE the published NVFP4 checkpoints: size
    offers them as they are, not an all-NVFP4 model (attention included) no one publishes, which it
    chose before with a launch line telling to 'serve a published nvfp4 checkpoint of this model in
    its place'. A checkpoint of wider or other 4-bit nodes keeps the NVFP4 option (the bf16 Gemma,
    Kimi-K3's MXFP4 experts)."""
    reg = jp.Registry()
    b200, b300 = reg.chip("b200"), reg.chip("b300")
    for name, own in (("nvidia--Gemma-4-26B-A4B-NVFP4", "bf16"), ("nvidia--Qwen3.6-35B-A3B-NVFP4", "fp8"),
                      ("nvidia--Gemma-4-31B-IT-NVFP4", "nvfp4")):
        graph, _, _ = load_model(str(HF / name))
        assert weight_formats(graph, b200) == [own], name
    assert weight_formats(load_model(GEMMA)[0], b200) == ["bf16", "fp8", "nvfp4"]
    assert weight_formats(load_model(str(HF / "moonshotai--Kimi-K3"))[0], b300) == ["bf16", "nvfp4"]
    with pytest.raises(jp.JaxpriceError, match="from its bf16 checkpoint: bf16; the checkpoint holds nvfp4 for "
                                               "moe_experts"):
        S.size(str(HF / "nvidia--Gemma-4-26B-A4B-NVFP4"), chip="b200", gpus=8, isl=1024, osl=256,
               weights=["nvfp4"])


def test_the_vllm_line_of_kimi_k3_says_vllm_has_none():
    """vLLM has no Kimi-K3 model (the graph is SGLang's): size's `vllm serve` line says it would
    not start and names --engine sglang, after every flag; another model's line has no such note."""
    lay = S.Layout(8, 1, False, "bf16", 256, 8192, "FULL_AND_PIECEWISE")
    for name, lacks in (("moonshotai--Kimi-K3", True), ("google--gemma-4-26B-A4B", False)):
        graph, _, _ = load_model(str(HF / name))
        scen = build_scenario(graph.name, "b300", lay, isl=1024, osl=1024, graph=graph)
        line = launch.vllm_command(scen, lay, graph)
        flags, _, notes = line.partition("    # ")
        assert flags.startswith("vllm serve ") and "--tensor-parallel-size 8" in flags
        assert ("vLLM has no Kimi-K3 model" in notes and "--engine sglang" in notes) is lacks, name
        assert "vLLM has no" not in flags


def test_the_deployment_line_names_the_formats_the_checkpoint_holds(gemma):
    """price / serve's first line: a ModelOpt checkpoint whose experts are NVFP4 beside a bf16 rest
    read 'bf16 weights' alone before; it names the experts' format. A uniform checkpoint's line is
    as it was."""
    from jaxprice._src.cli_price import describe_deployment
    nv = _deployment(str(HF / "nvidia--Gemma-4-26B-A4B-NVFP4"), "b200", 8)
    assert "bf16 weights (nvfp4 for moe_experts), fp8 cache" in describe_deployment(nv)
    assert "bf16 weights, auto cache" in describe_deployment(gemma)


def test_a_checkpoint_with_a_calibrated_fp8_kv_cache_is_priced_and_launched_with_it():
    """nvidia/Gemma-4-26B-A4B-NVFP4's hf_quant_config.json states kv_cache_quant_algo FP8, which
    vLLM's auto cache takes (vllm-project/vllm#29980): its experts are NVFP4 and the rest bf16, and
    the 16-bit rule alone gave it a bf16 cache, twice the KV bytes vLLM holds. Now an FP8 cache: half
    the bf16 Gemma's 35,840 B per token, and the launch line states it. Kimi-K3 (compressed-tensors,
    kv_cache_scheme null) and the bf16 Gemma keep auto."""
    from jaxprice._src.layouts import checkpoint_kv_cache
    nv = _deployment(str(HF / "nvidia--Gemma-4-26B-A4B-NVFP4"), "b200", 8)
    assert nv.scenario.engine["cache_dtype"] == "fp8"
    assert nv.plan.memory["kv_bytes_per_token"] == 35840 / 2
    for name in ("moonshotai--Kimi-K3", "google--gemma-4-26B-A4B", "nvidia--DeepSeek-V4-Flash-NVFP4"):
        assert checkpoint_kv_cache(load_model(str(HF / name))[0]) is None, name
    graph = load_model(str(HF / "nvidia--Gemma-4-26B-A4B-NVFP4"))[0]
    lay = S.Layout(1, 1, False, "bf16", 256, 8192, "FULL_AND_PIECEWISE")
    line = launch.vllm_command(build_scenario(graph.name, "b200", lay, isl=1024, osl=1024, graph=graph), lay, graph)
    assert "--kv-cache-dtype fp8 " in line and "--quantization" not in line


def test_vllms_auto_cache_is_the_checkpoints_calibrated_fp8_one(gemma):
    """`--kv-cache-dtype auto` (vLLM's default, and a scenario's cache_dtype: auto) is what vLLM
    runs: nvidia/Gemma-4-26B-A4B-NVFP4's calibrated FP8 cache (kv_cache_quant_algo FP8), as with
    no flag; it priced a bf16 cache, twice the KV bytes, before. The bf16 Gemma's auto stays bf16."""
    from jaxprice._src.cli_price import describe_deployment
    nv = _deployment(str(HF / "nvidia--Gemma-4-26B-A4B-NVFP4"), "b200", 8, kv_cache_dtype="auto")
    assert nv.plan.memory["kv_bytes_per_token"] == 35840 / 2
    assert ", fp8 cache," in describe_deployment(nv)
    assert _deployment(GEMMA, "h200", 8, kv_cache_dtype="auto").plan.memory["kv_bytes_per_token"] == 35840


def test_the_yaml_import_of_a_checkpoint_keeps_its_calibrated_fp8_cache(tmp_path):
    """`import-model` writes a YAML graph a user then prices in place of the config.json: it
    states the checkpoint's calibrated cache (kv_cache_dtype: fp8), so the YAML and the config
    price the same KV bytes (the YAML priced a bf16 cache, twice the bytes, before); a config with
    none writes no key, and a hand-written value other than fp8 is refused in one line."""
    from jaxprice._src.formats import load_model_graph
    from jaxprice._src.hf import graph_yaml, import_result
    from jaxprice._src.layouts import checkpoint_kv_cache
    text = graph_yaml(import_result(str(HF / "nvidia--Gemma-4-26B-A4B-NVFP4")))
    assert "\nkv_cache_dtype: \"fp8\"\n" in text
    f = tmp_path / "gemma-nvfp4.yaml"
    f.write_text(text)
    assert checkpoint_kv_cache(load_model_graph(str(f))) == "fp8"
    assert _deployment(str(f), "b200", 8).plan.memory["kv_bytes_per_token"] == 35840 / 2
    assert "kv_cache_dtype" not in graph_yaml(import_result(GEMMA))
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace('kv_cache_dtype: "fp8"', 'kv_cache_dtype: "int4"'))
    with pytest.raises(jp.JaxpriceError, match=r"kv_cache_dtype.*int4"):
        load_model_graph(str(bad))
