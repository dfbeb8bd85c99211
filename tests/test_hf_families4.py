"""IBM Granite 3.x (GraniteForCausalLM) and Granite 3.x MoE (GraniteMoeForCausalLM) for
`jaxprice import-model` (jaxprice/_src/hf.py: _fam_granite, _fam_granite_moe).

Every expected number is worked out by hand from the config (testdata/hf; where it came from:
testdata/hf/SOURCES.md) and the vLLM model files cited beside the builders (granite.py, granitemoe.py),
not by calling the importer twice. Parameter totals are compared with the published ones:
Granite-3.1-1B-A400M 1.33B total (the Hub's count; "1B-A400M" in the name), Granite-3.x-8B 8.17B (the
graph's GEMMs and embedding; the norms and the routers are not in it). The dense Granite has no bundled
config: its test writes the Granite-3.x-8B sizes (hidden 4096, 40 layers, 32 heads / 8 KV heads, MLP
12800, vocab 49159, tied) to a copy under tmp_path. One price call in all.
"""

from __future__ import annotations

import argparse

import pytest
from clirefusal import import_refused

from jaxprice._src.hf import import_result

from hfgraph import HF, check_prices_decode, cfg as _cfg, node as _node, params as _params, seq as _seq, write as _write  # noqa: E402,F401

MOE = "ibm-granite--granite-3.1-1b-a400m-instruct"


def _memory(path, tp):
    from jaxprice._src.cli_price import model_deployment
    args = argparse.Namespace(chip="h200", tp=tp, dp=None, weights=None, ep=False, gpus_per_node=None, fabric=None)
    return model_deployment(str(path), args).plan.memory


def test_granite_moe_every_layer_routes_32_experts_with_no_shared_one():
    d = import_result(HF / MOE)
    doc = d.doc
    assert d.architecture == "GraniteMoeForCausalLM" and d.family == "granite_moe"
    assert _seq(doc) == ["attn_moe"] * 24
    nodes = doc["layer_kinds"]["attn_moe"]
    # 16 q heads, 8 KV heads of hidden 1024 / 16 = 64: qkv (16 + 2 x 8) x 64 = 2048, o_proj 1024 -> 1024
    assert _node(nodes, "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 16, "n_kv": 8, "d_h": 64}
    assert _node(nodes, "GEMM", "qkv_proj") == {"op": "GEMM", "role": "qkv_proj", "n": 2048, "k": 1024}
    assert _node(nodes, "GEMM", "o_proj") == {"op": "GEMM", "role": "o_proj", "n": 1024, "k": 1024}
    # vLLM GraniteMoeMoE: FusedMoE(num_local_experts 32, top_k num_experts_per_tok 8, config.intermediate_size 512)
    assert _node(nodes, "GroupedGEMM", "experts") == {"op": "GroupedGEMM", "role": "experts", "n": 512, "k": 1024,
                                                      "experts": 32, "top_k": 8}
    assert not any(n["op"] == "GEMM" and n["role"].startswith("mlp") for n in nodes)
    assert doc["tie_word_embeddings"] is True and doc["max_model_len"] == 131072 and doc["weight_dtype"] == "bf16"
    # the four multipliers are named in the notes, not modelled
    note = next(x for x in d.inferred if x.startswith("Granite scalar multipliers"))
    for k in ("embedding_multiplier 12.0", "residual_multiplier 0.22", "attention_multiplier 0.015625",
              "logits_scaling 6.0"):
        assert k in note
    t, a = _params(doc)
    attn = 2048 * 1024 + 1024 * 1024
    expert = 3 * 512 * 1024
    emb = 49155 * 1024                                   # tied: counted once
    assert t == 24 * (attn + 32 * expert) + emb == 1_333_791_744
    assert a == 24 * (attn + 8 * expert) + emb == 427_822_080
    assert t == pytest.approx(1.33e9, rel=5e-3)          # published (the Hub's count): 1.33B
    # "A400M" (the name's rounded figure): 378M without the embedding, 428M with it
    assert a - emb == pytest.approx(400e6, rel=0.06)
    # one GPU at bf16: 24 layers x 2 x 8 KV heads x 64 x 2 B per token
    mem = _memory(HF / MOE, 1)
    assert mem["kv_bytes_per_token"] == 24 * 2 * 8 * 64 * 2 == 49152.0 and mem["kv_window_bytes_per_token"] == ()
    assert mem["weights_bytes"] == 2 * 1_333_791_744


def test_granite_moe_keys_are_required_and_checked(tmp_path):
    """vLLM reads num_local_experts, num_experts_per_tok and intermediate_size with no default: each is
    required; more experts per token than experts is refused."""
    for key in ("num_local_experts", "num_experts_per_tok", "intermediate_size"):
        bad = {k: v for k, v in _cfg(MOE).items() if k != key}
        import_refused(_write(tmp_path, key, bad), key, None, "required key is missing")
    import_refused(_write(tmp_path, "topk", dict(_cfg(MOE), num_experts_per_tok=33)), "num_experts_per_tok", 33,
                   "more experts per token than experts")


def test_granite_dense_is_llama_layers(tmp_path):
    """GraniteForCausalLM (vLLM granite.py) at Granite-3.x-8B's sizes: Llama layers, tied head."""
    cfg = {"architectures": ["GraniteForCausalLM"], "model_type": "granite", "attention_multiplier": 0.0078125,
           "embedding_multiplier": 12.0, "hidden_size": 4096, "intermediate_size": 12800, "logits_scaling": 16.0,
           "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 40,
           "num_key_value_heads": 8, "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None,
           "rope_theta": 10000000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 49159}
    path = _write(tmp_path, "granite-8b", cfg)
    d = import_result(path)
    doc = d.doc
    assert d.architecture == "GraniteForCausalLM" and d.family == "granite"
    assert _seq(doc) == ["dense"] * 40
    nodes = doc["layer_kinds"]["dense"]
    assert _node(nodes, "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 32, "n_kv": 8, "d_h": 128}
    assert _node(nodes, "GEMM", "qkv_proj") == {"op": "GEMM", "role": "qkv_proj", "n": 6144, "k": 4096}
    assert _node(nodes, "GEMM", "mlp_gate_up") == {"op": "GEMM", "role": "mlp_gate_up", "n": 25600, "k": 4096}
    assert _node(nodes, "GEMM", "mlp_down") == {"op": "GEMM", "role": "mlp_down", "n": 4096, "k": 12800}
    assert any(x.startswith("Granite scalar multipliers") and "logits_scaling 16.0" in x for x in d.inferred)
    t, _ = _params(doc)
    assert t == 40 * (6144 * 4096 + 4096 * 4096 + 3 * 12800 * 4096) + 49159 * 4096 == 8_170_532_864
    assert t == pytest.approx(8.17e9, rel=5e-3)          # published: 8.17B
    mem = _memory(path.parent, 2)
    # two GPUs: 40 layers x 2 x (8 / 2) KV heads x 128 x 2 B per token and rank
    assert mem["kv_bytes_per_token"] == 40 * 2 * 4 * 128 * 2 == 81920.0
    assert mem["weights_bytes"] == pytest.approx(2 * 8_170_532_864 / 2, rel=1e-12)
    # a config stating none of the multipliers makes no note of them
    plain = {k: v for k, v in cfg.items() if not k.endswith(("_multiplier", "_scaling"))}
    assert not any("multiplier" in x for x in import_result(_write(tmp_path, "plain", plain)).inferred)


def test_granite_moe_prices_decode_steps(capsys):
    """`jaxprice price CONFIG --chip h200 --tp 1 --decode 1,8`: finite, positive times per row."""
    check_prices_decode(MOE, "h200", 1, capsys)
