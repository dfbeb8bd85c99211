"""More Hugging Face families for `jaxprice import-model` (jaxprice/_src/hf.py): Gemma 4 (sliding
and global layers of different head widths and KV heads, k = v global layers, routed experts
beside a dense MLP), MiMo-V2-Flash (sliding / full layers of their own heads, K and V of
different widths), Step-3.5 / 3.7-Flash (sliding layers, dense-first MoE with a shared expert),
DeciLM / Llama-3.3-Nemotron-Super (per-layer blocks, some without attention, six MLP widths) and
Kimi-K3 (KDA and MLA layers, latent MoE, attention residuals; as SGLang runs it: vLLM has none).

Every expected number is worked out by hand from the shipped config.json (testdata/hf, verbatim
from aiconfigurator-core 0.12.0) and the engines' model code (vLLM gemma4.py, mimo_v2_flash.py,
step3p5.py, nemotron_nas.py; SGLang kimi_k3.py; the commits are cited beside the builders), not by
calling the importer twice. Parameter totals are compared with the published ones: Gemma 4 26B-A4B
25.2B total / 3.8B active, Gemma 4 31B 30.7B (both text decoder, without the vision tower),
MiMo-V2-Flash 309B / 15B, Step-3.5-Flash 196B / 11B (the wheel's Step-3.7-Flash file states the
same shapes), Llama-3.3-Nemotron-Super 49B; no Kimi-K3 total was available offline, so its count
is checked by hand only (2.78T, 104.8B active) and against the resolved weights. The graph holds what vLLM
holds: a k = v layer's qkv_proj carries a V slot loaded with the K weights, so the graph's total
is the published one plus those duplicated rows. One price per family (8 GPUs, decode 1 and 8)
and one `size` run; the rest compiles nothing.
"""

from __future__ import annotations

import argparse
import re

import pytest
from clirefusal import import_refused

from jaxprice._src.hf import import_result

from hfgraph import HF, check_prices_decode, cfg as _cfg, node as _node, params as _params, seq as _seq, write as _write  # noqa: E402,F401
G26, G26FP4, G31 = "google--gemma-4-26B-A4B", "nvidia--Gemma-4-26B-A4B-NVFP4", "nvidia--Gemma-4-31B-IT-NVFP4"
MIMO2, STEP, STEP8 = "XiaomiMiMo--MiMo-V2-Flash", "stepfun-ai--Step-3.7-Flash", "stepfun-ai--Step-3.7-Flash-FP8"
SUPER49, K3 = "nvidia--Llama-3_3-Nemotron-Super-49B-v1", "moonshotai--Kimi-K3"


def _deployment(folder, tp=8, chip="h200"):
    from jaxprice._src.cli_price import model_deployment
    args = argparse.Namespace(chip=chip, tp=tp, dp=None, weights=None, ep=False, gpus_per_node=None, fabric=None)
    return model_deployment(str(HF / folder), args)


# ----------------------------------------------------------------------------- Gemma 4

def test_gemma4_26b_a4b_five_sliding_one_global_experts_beside_the_mlp():
    d = import_result(HF / G26)
    doc = d.doc
    assert d.architecture == "Gemma4ForConditionalGeneration" and d.family == "gemma4"
    assert doc["modality"] == "text_decoder_of_multimodal" and doc["tie_word_embeddings"] is True
    # layer_types: 5 sliding then 1 full, 5 times (30 layers)
    assert _seq(doc) == (["swa_moe"] * 5 + ["full_moe"]) * 5
    kinds = doc["layer_kinds"]
    # sliding: 16 q heads, 8 KV heads of 256, window 1024; qkv (16 + 2 x 8) x 256
    assert _node(kinds["swa_moe"], "Attention") == {"op": "Attention", "kind": "swa", "n_q": 16, "n_kv": 8,
                                                    "d_h": 256, "window": 1024}
    assert _node(kinds["swa_moe"], "GEMM", "qkv_proj") == {"op": "GEMM", "role": "qkv_proj", "n": 8192, "k": 2816}
    # global: global_head_dim 512, k = v with num_global_key_value_heads 2; vLLM's QKVParallelLinear
    # keeps the V slot (loaded with K): (16 + 2 x 2) x 512
    assert _node(kinds["full_moe"], "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 16, "n_kv": 2,
                                                     "d_h": 512}
    assert _node(kinds["full_moe"], "GEMM", "qkv_proj")["n"] == 10240
    assert _node(kinds["full_moe"], "GEMM", "o_proj") == {"op": "GEMM", "role": "o_proj", "n": 2816, "k": 8192}
    for nodes in kinds.values():
        assert _node(nodes, "GEMM", "mlp_gate_up")["n"] == 2 * 2112 and _node(nodes, "GEMM", "mlp_down")["k"] == 2112
        assert _node(nodes, "GroupedGEMM", "moe_experts") == {"op": "GroupedGEMM", "role": "moe_experts", "n": 704,
                                                              "k": 2816, "experts": 128, "top_k": 8}
        # the dense MLP and the experts each all-reduce (reduce_results on both)
        assert [n["role"] for n in nodes if n["op"] == "AllReduce"] == ["attn_out", "mlp_out", "moe_out"]
        assert sum(n["op"] == "Elementwise" for n in nodes) == 8       # 4 layer norms + 3 MoE norms + router's
    assert doc["max_model_len"] == 262144 and "speculator" not in doc and doc["weight_dtype"] == "bf16"
    # 25 x (8192 + 4096) x 2816 + 5 x (10240 + 8192) x 2816 attention; 30 x 3 x 2112 x 2816 MLP;
    # 30 x 128 x 3 x 704 x 2816 experts; 262144 x 2816 head (tied)
    t, a = _params(doc)
    assert t == 25 * 12288 * 2816 + 5 * 18432 * 2816 + 30 * (3 * 2112 + 128 * 3 * 704) * 2816 + 262144 * 2816
    dup_v = 5 * 2 * 512 * 2816          # the V slot of the k = v layers, not a published parameter
    assert t - dup_v == pytest.approx(25.2e9, rel=2e-3)
    assert a == 25 * 12288 * 2816 + 5 * 18432 * 2816 + 30 * (3 * 2112 + 8 * 3 * 704) * 2816 + 262144 * 2816
    assert a - dup_v == pytest.approx(3.8e9, rel=1e-2)
    assert any("k = v" in x for x in d.inferred) and any("beside the dense MLP" in x for x in d.inferred)
    assert any(x.startswith("multimodal (vision_config):") for x in d.inferred)      # audio_config null: none


def test_gemma4_resolves_its_weights_and_windowed_kv_by_hand():
    """8 x H200 at bf16: each rank holds 1/8 of the layers and the head at 2 bytes, the embedding
    tied to the head and held once (KNOWN DIVERGENCE [tied-embedding]); KV per token and rank: 25 sliding layers x 2 x (8 / 8) x 256 x 2 B = 25,600 (window
    1024), 5 global layers x 2 x max(1, 2 / 8) x 512 x 2 B = 10,240 (vLLM replicates the 2 KV heads)."""
    d = _deployment(G26)
    doc = import_result(HF / G26).doc
    t, _ = _params(doc)
    assert d.plan.memory["weights_bytes"] == pytest.approx(2 * t / 8, rel=1e-12)
    assert d.plan.memory["kv_window_bytes_per_token"] == ((1024.0, 25600.0),)
    assert d.plan.memory["kv_bytes_per_token"] == 25600.0 + 10240.0


def test_gemma4_31b_dense_nvfp4_keeps_attention_and_head_at_bf16():
    d = import_result(HF / G31)
    doc = d.doc
    assert _seq(doc) == (["swa_dense"] * 5 + ["full_dense"]) * 10
    kinds = doc["layer_kinds"]
    assert _node(kinds["swa_dense"], "Attention") == {"op": "Attention", "kind": "swa", "n_q": 32, "n_kv": 16,
                                                      "d_h": 256, "window": 1024}
    assert _node(kinds["full_dense"], "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 32, "n_kv": 4,
                                                       "d_h": 512}
    # hf_quant_config.json: NVFP4, every layer's self_attn* and lm_head excluded
    assert doc["weight_dtype"] == "nvfp4"
    for nodes in kinds.values():
        assert _node(nodes, "GEMM", "qkv_proj")["weight_dtype"] == "bf16"
        assert _node(nodes, "GEMM", "o_proj")["weight_dtype"] == "bf16"
        assert "weight_dtype" not in _node(nodes, "GEMM", "mlp_gate_up")
        assert not [n for n in nodes if n["op"] == "GroupedGEMM"]          # enable_moe_block false
    assert _node(doc["head"], "GEMM", "lm_head")["weight_dtype"] == "bf16"
    # 50 x (16384 + 8192) x 5376 + 10 x (20480 + 16384) x 5376 + 60 x 3 x 21504 x 5376 + 262144 x 5376
    t, a = _params(doc)
    assert t == a == 50 * 24576 * 5376 + 10 * 36864 * 5376 + 60 * 3 * 21504 * 5376 + 262144 * 5376
    assert t - 10 * 4 * 512 * 5376 == pytest.approx(30.7e9, rel=2e-3)
    # KV per token and rank (FP8 cache, jaxprice price's default beside 4-bit weights): 50 x 2 x 2 x
    # 256 x 1 B windowed, 10 x 2 x max(1, 4 / 8) x 512 x 1 B global
    dep = _deployment(G31)
    assert dep.plan.memory["kv_window_bytes_per_token"] == ((1024.0, 51200.0),)
    assert dep.plan.memory["kv_bytes_per_token"] == 51200.0 + 10240.0


def test_gemma4_26b_nvfp4_quantizes_only_the_routed_experts():
    """Its exclusions glob every layer's mlp*, router* and self_attn*: the routed experts (a role of
    their own, so that ``mlp*`` does not reach them) are NVFP4, the rest bf16."""
    doc = import_result(HF / G26FP4).doc
    assert doc["weight_dtype"] == "bf16"
    for nodes in doc["layer_kinds"].values():
        assert _node(nodes, "GroupedGEMM", "moe_experts")["weight_dtype"] == "nvfp4"
        assert all("weight_dtype" not in n for n in nodes if n["op"] == "GEMM")


def test_gemma4_variants(tmp_path):
    # no k = v: the global layers keep num_key_value_heads (8), still global_head_dim wide
    cfg = _cfg(G26)
    cfg["text_config"]["attention_k_eq_v"] = False
    doc = import_result(_write(tmp_path, "a", cfg)).doc
    assert _node(doc["layer_kinds"]["full_moe"], "Attention")["n_kv"] == 8
    # no global_head_dim: head_dim
    cfg = _cfg(G31)
    del cfg["text_config"]["global_head_dim"]
    doc = import_result(_write(tmp_path, "b", cfg)).doc
    assert _node(doc["layer_kinds"]["full_dense"], "Attention")["d_h"] == 256
    # a text-only Gemma4ForCausalLM (the text config at the top level)
    cfg = dict(_cfg(G26)["text_config"], architectures=["Gemma4ForCausalLM"])
    d = import_result(_write(tmp_path, "c", cfg))
    assert d.doc["modality"] == "text_only" and _seq(d.doc) == (["swa_moe"] * 5 + ["full_moe"]) * 5


@pytest.mark.parametrize("change,field,value,reason", [
    (lambda t: t.update(num_kv_shared_layers=10), "text_config.num_kv_shared_layers", 10, "KV-shared"),
    (lambda t: t.update(hidden_size_per_layer_input=256), "text_config.hidden_size_per_layer_input", 256,
     "per-layer embeddings"),
    (lambda t: t.update(layer_types=t["layer_types"][:29]), "text_config.layer_types", 29, "29 entries for 30"),
    (lambda t: t.update(layer_types=["chunked_attention"] * 30), "text_config.layer_types", "chunked_attention",
     "unknown layer type"),
    (lambda t: t.pop("sliding_window"), "text_config.sliding_window", None, "required key is missing"),
    (lambda t: t.update(num_global_key_value_heads=3), "text_config.num_global_key_value_heads", 3,
     "not a multiple"),
    (lambda t: t.update(top_k_experts=129), "text_config.top_k_experts", 129, "more experts per token"),
])
def test_a_bad_gemma4_config_is_refused(tmp_path, change, field, value, reason):
    cfg = _cfg(G26)
    change(cfg["text_config"])
    import_refused(_write(tmp_path, "bad", cfg), field, value, reason)


# ----------------------------------------------------------------------------- MiMo-V2-Flash

def test_mimo_v2_flash_hybrid_pattern_and_k_v_of_two_widths():
    d = import_result(HF / MIMO2)
    doc = d.doc
    assert d.family == "mimo_v2" and doc["modality"] == "text_only" and doc["weight_dtype"] == "fp8"
    cfg = _cfg(MIMO2)
    full = [i for i, p in enumerate(cfg["hybrid_layer_pattern"]) if p == 0]
    assert full == [0, 5, 11, 17, 23, 29, 35, 41, 47]
    expect = ["full_dense"] + ["full_moe" if i in full else "swa_moe" for i in range(1, 48)]
    assert _seq(doc) == expect
    kinds = doc["layer_kinds"]
    # K 192, V 128: one node at d_h 160 (KV bytes 2 x 160 = 192 + 128; pair FLOPs 4 x 160 = 2 x 192 + 2 x 128)
    assert _node(kinds["full_moe"], "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 64, "n_kv": 4, "d_h": 160}
    assert _node(kinds["swa_moe"], "Attention") == {"op": "Attention", "kind": "swa", "n_q": 64, "n_kv": 8,
                                                    "d_h": 160, "window": 128}
    assert _node(kinds["full_moe"], "GEMM", "qkv_proj")["n"] == 64 * 192 + 4 * 192 + 4 * 128
    assert _node(kinds["swa_moe"], "GEMM", "qkv_proj")["n"] == 64 * 192 + 8 * 192 + 8 * 128
    assert _node(kinds["swa_moe"], "GEMM", "o_proj") == {"op": "GEMM", "role": "o_proj", "n": 4096, "k": 64 * 128}
    assert _node(kinds["full_dense"], "GEMM", "mlp_gate_up")["n"] == 2 * 16384
    assert _node(kinds["swa_moe"], "GroupedGEMM", "experts") == {"op": "GroupedGEMM", "role": "experts", "n": 2048,
                                                                 "k": 4096, "experts": 256, "top_k": 8}
    assert doc["max_model_len"] == 262144 and "speculator" not in doc
    t, a = _params(doc)
    attn = 9 * (13568 + 8192) * 4096 + 39 * (14848 + 8192) * 4096
    assert t == attn + 3 * 16384 * 4096 + 47 * 256 * 3 * 2048 * 4096 + 2 * 152576 * 4096
    assert a == attn + 3 * 16384 * 4096 + 47 * 8 * 3 * 2048 * 4096 + 2 * 152576 * 4096
    assert t == pytest.approx(309e9, rel=5e-3) and a == pytest.approx(15e9, rel=3e-2)
    # KV per token and rank on 8 x H200 (FP8 cache beside fp8 weights): 39 x 2 x 1 x 160 x 1 B
    # windowed at 128, 9 x 2 x max(1, 4 / 8) x 160 x 1 B full
    dep = _deployment(MIMO2)
    assert dep.plan.memory["kv_window_bytes_per_token"] == ((128.0, 12480.0),)
    assert dep.plan.memory["kv_bytes_per_token"] == 12480.0 + 2880.0


@pytest.mark.parametrize("change,field,value,reason", [
    (lambda c: c.update(hybrid_layer_pattern=c["hybrid_layer_pattern"][:47]), "hybrid_layer_pattern", 47,
     "47 entries for 48"),
    (lambda c: c.update(hybrid_layer_pattern=[2] * 48), "hybrid_layer_pattern", 2, "expected 0 or 1"),
    (lambda c: c.update(moe_layer_freq=[0] * 48), "moe_layer_freq", None, "no layer of 48 would be MoE"),
    (lambda c: c.update(moe_layer_freq=1), "moe_layer_freq", 1, "expected a list"),
    (lambda c: c.update(swa_num_key_value_heads=5), "swa_num_key_value_heads", 5, "not a multiple"),
    (lambda c: c.pop("swa_head_dim"), "swa_head_dim", None, "required key is missing"),
])
def test_a_bad_mimo_v2_config_is_refused(tmp_path, change, field, value, reason):
    cfg = _cfg(MIMO2)
    change(cfg)
    import_refused(_write(tmp_path, "bad", cfg), field, value, reason)


# ----------------------------------------------------------------------------- Step-3.7-Flash

def test_step_3p7_flash_dense_first_then_moe_with_a_shared_expert():
    d = import_result(HF / STEP)
    doc = d.doc
    assert d.family == "step3p5" and doc["weight_dtype"] == "bf16"
    # layer_types: full every 4th layer from 0; first_k_dense_replace 3
    expect = [("attn" if i % 4 == 0 else "swa") + ("_dense" if i < 3 else "_moe") for i in range(45)]
    assert _seq(doc) == expect
    kinds = doc["layer_kinds"]
    assert _node(kinds["swa_moe"], "Attention") == {"op": "Attention", "kind": "swa", "n_q": 64, "n_kv": 8,
                                                    "d_h": 128, "window": 512}
    assert _node(kinds["attn_dense"], "GEMM", "mlp_gate_up")["n"] == 2 * 11264
    # one share_expert of share_expert_dim 1280, the routed experts' width: no separate width
    assert _node(kinds["attn_moe"], "GroupedGEMM", "experts") == {
        "op": "GroupedGEMM", "role": "experts", "n": 1280, "k": 4096, "experts": 288, "top_k": 8, "shared_experts": 1}
    assert doc["max_model_len"] == 65536 and "speculator" not in doc
    assert any("first_k_dense_replace 3" in x for x in d.inferred)
    assert any("no MTP drafter" in x for x in d.inferred)
    t, a = _params(doc)
    attn = 45 * (80 * 128 + 64 * 128) * 4096
    assert t == attn + 3 * 3 * 11264 * 4096 + 42 * 289 * 3 * 1280 * 4096 + 2 * 128896 * 4096
    assert a == attn + 3 * 3 * 11264 * 4096 + 42 * 9 * 3 * 1280 * 4096 + 2 * 128896 * 4096
    assert t == pytest.approx(196e9, rel=5e-3) and a == pytest.approx(11e9, rel=3e-2)
    # KV per token and rank (bf16 cache beside bf16 weights, 8 x H200): 33 sliding x 2 x 1 x 128 x 2 B
    # windowed at 512, 12 full layers alike
    dep = _deployment(STEP)
    assert dep.plan.memory["kv_window_bytes_per_token"] == ((512.0, 16896.0),)
    assert dep.plan.memory["kv_bytes_per_token"] == 16896.0 + 6144.0
    # the FP8 checkpoint: block-wise fp8 everywhere, same graph
    fp8 = import_result(HF / STEP8).doc
    assert fp8["weight_dtype"] == "fp8" and fp8["layer_kinds"] == doc["layer_kinds"]


def test_step_variants(tmp_path):
    # vLLM's own keys: moe_layers_enum, moe_num_experts / moe_top_k, attention_other_setting for the
    # sliding layers, the head-wise gate; without moe_layers_enum or first_k_dense_replace every
    # layer but the first is MoE (vLLM step3p5.py)
    cfg = _cfg(STEP)
    for k in ("num_experts", "num_experts_per_tok", "first_k_dense_replace"):
        cfg.pop(k)
    cfg.update(moe_num_experts=64, moe_top_k=4, moe_layers_enum="1,2,44", use_head_wise_attn_gate=True,
               attention_other_setting={"attention_type": "sliding_attention", "num_attention_heads": 96,
                                        "num_attention_groups": 8, "head_dim": 128})
    doc = import_result(_write(tmp_path, "a", cfg)).doc
    seq = _seq(doc)
    assert [i for i, k in enumerate(seq) if k.endswith("_moe")] == [1, 2, 44]
    assert _node(doc["layer_kinds"]["swa_moe"], "Attention")["n_q"] == 96
    assert _node(doc["layer_kinds"]["attn_moe"], "Attention")["n_q"] == 64
    assert _node(doc["layer_kinds"]["swa_moe"], "GEMM", "attn_gate_proj") == {
        "op": "GEMM", "role": "attn_gate_proj", "n": 96, "k": 4096}
    moe = _node(doc["layer_kinds"]["swa_moe"], "GroupedGEMM", "experts")
    assert (moe["experts"], moe["top_k"]) == (64, 4)
    cfg = _cfg(STEP)
    cfg.pop("first_k_dense_replace")
    seq = _seq(import_result(_write(tmp_path, "b", cfg)).doc)
    assert seq[0] == "attn_dense" and all(k.endswith("_moe") for k in seq[1:])


def test_step_other_heads_follow_the_stated_layer_types_window_or_not(tmp_path):
    # vLLM step3p5.py gives attention_other_setting's heads to the layers whose stated layer_types
    # entry is its attention_type, with a window or without one (sliding_window absent: full
    # attention on every layer), and to no layer where layer_types is absent (even layers sliding)
    other = {"attention_type": "sliding_attention", "num_attention_heads": 96, "num_attention_groups": 8,
             "head_dim": 128}
    cfg = dict(_cfg(STEP), attention_other_setting=other)
    cfg.pop("sliding_window")
    doc = import_result(_write(tmp_path, "nowindow", cfg)).doc
    attn = [_node(doc["layer_kinds"][k], "Attention") for k in _seq(doc)]
    assert [a["n_q"] for a in attn] == [64 if t == "full_attention" else 96 for t in cfg["layer_types"]]
    assert {a["kind"] for a in attn} == {"gqa"}
    cfg = dict(_cfg(STEP), attention_other_setting=other)
    cfg.pop("layer_types")
    doc = import_result(_write(tmp_path, "notypes", cfg)).doc
    attn = [_node(doc["layer_kinds"][k], "Attention") for k in _seq(doc)]
    assert [a["kind"] for a in attn] == ["swa" if i % 2 == 0 else "gqa" for i in range(45)]
    assert {a["n_q"] for a in attn} == {64}


@pytest.mark.parametrize("change,field,value,reason", [
    (lambda c: c.update(moe_layers_enum="1,x"), "moe_layers_enum", "1,x", "comma-separated"),
    (lambda c: c.update(moe_layers_enum="1,45"), "moe_layers_enum", 45, "expected layer indices from 0 to 44"),
    (lambda c: c.update(first_k_dense_replace=46), "first_k_dense_replace", 46, "more than the model's 45"),
    (lambda c: c.update(first_k_dense_replace=45), "first_k_dense_replace", 45, "no layer of 45 would be MoE"),
    (lambda c: c.update(layer_types=["full_attention"] * 44), "layer_types", 44, "44 entries for 45"),
    (lambda c: c.pop("share_expert_dim"), "share_expert_dim", None, "required key is missing"),
])
def test_a_bad_step_config_is_refused(tmp_path, change, field, value, reason):
    cfg = _cfg(STEP)
    change(cfg)
    import_refused(_write(tmp_path, "bad", cfg), field, value, reason)


# ----------------------------------------------------------------------------- DeciLM (Nemotron Super)

def _decilm_width(mult, h=8192):
    """vLLM's _ffn_mult_to_intermediate_size, by hand: int(2 mult h / 3) up to a multiple of 256."""
    x = int(2 * mult * h / 3)
    return x if x % 256 == 0 else x + 256 - x % 256


def test_decilm_nemotron_super_49b_heterogeneous_blocks():
    d = import_result(HF / SUPER49)
    doc = d.doc
    assert d.family == "nemotron_nas" and doc["modality"] == "text_only"
    blocks = _cfg(SUPER49)["block_configs"]
    # widths: 5.25 -> 28672, 2.625 -> 14336, 1.3125 -> 7168, 1.0 -> 5461 -> 5632, 0.5 -> 2730 -> 2816,
    # 3.28125 -> 17920
    assert [_decilm_width(m) for m in (5.25, 2.625, 1.3125, 1.0, 0.5, 3.28125)] == [28672, 14336, 7168, 5632, 2816,
                                                                                    17920]
    expect = [("" if b["attention"]["no_op"] else "attn8_") + f"mlp{_decilm_width(b['ffn']['ffn_mult'])}"
              for b in blocks]
    seq = _seq(doc)
    assert seq == expect and len(seq) == 80
    assert sum(k.startswith("attn8") for k in seq) == 49       # 31 blocks without attention: no KV
    kinds = doc["layer_kinds"]
    assert _node(kinds["attn8_mlp28672"], "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 64, "n_kv": 8,
                                                           "d_h": 128}
    assert [n["op"] for n in kinds["mlp7168"]] == ["Elementwise", "GEMM", "GEMM", "AllReduce"]
    assert _node(kinds["mlp7168"], "GEMM", "mlp_gate_up") == {"op": "GEMM", "role": "mlp_gate_up", "n": 14336,
                                                              "k": 8192}
    assert not any("num_key_value_heads absent" in x for x in d.inferred)
    # 49 x (10240 + 8192) x 8192 attention; MLPs 3 x width x 8192 over 49, 6, 10, 8, 6, 1 blocks of
    # 28672, 14336, 7168, 5632, 2816, 17920; head and embedding 2 x 128256 x 8192: 49.87B (published 49B)
    t, a = _params(doc)
    mlp = 3 * 8192 * (49 * 28672 + 6 * 14336 + 10 * 7168 + 8 * 5632 + 6 * 2816 + 17920)
    assert t == a == 49 * 18432 * 8192 + mlp + 2 * 128256 * 8192 == 49_866_080_256
    assert t == pytest.approx(49e9, rel=2e-2)
    # KV per token and rank on 8 x H200 at bf16: 49 layers x 2 x (8 / 8) x 128 x 2 B
    dep = _deployment(SUPER49)
    assert dep.plan.memory["kv_bytes_per_token"] == 49 * 512.0
    assert dep.plan.memory["kv_window_bytes_per_token"] == ()


@pytest.mark.parametrize("change,field,value,reason", [
    (lambda b: b.pop(), "block_configs", 79, "79 entries for 80"),
    (lambda b: b[3]["attention"].update(replace_with_linear=True), "block_configs[3].attention.replace_with_linear",
     True, "linear replacement"),
    (lambda b: b[0]["attention"].update(n_heads_in_group=7), "block_configs[0].attention.n_heads_in_group", 7,
     "not a multiple"),
    (lambda b: b[0]["ffn"].update(ffn_mult=-1.0), "block_configs[0].ffn.ffn_mult", -1.0, "positive number"),
    (lambda b: b.__setitem__(2, "x"), "block_configs[2]", "x", "expected a mapping"),
])
def test_a_bad_decilm_config_is_refused(tmp_path, change, field, value, reason):
    cfg = _cfg(SUPER49)
    change(cfg["block_configs"])
    import_refused(_write(tmp_path, "bad", cfg), field, value, reason)


def test_decilm_variants(tmp_path):
    # a block no-op in both halves runs nothing and is left out (said so); intermediate_size where no
    # ffn_mult is stated, ffn_mult where both are (vLLM nemotron_nas.py: ffn_mult whenever the block has it)
    cfg = _cfg(SUPER49)
    cfg["block_configs"][79] = {"attention": {"no_op": True}, "ffn": {"no_op": True}}
    cfg["block_configs"][0]["ffn"] = {"intermediate_size": 1024}
    cfg["block_configs"][1]["ffn"] = {"intermediate_size": 1024, "ffn_mult": 1.3125}
    d = import_result(_write(tmp_path, "a", cfg))
    seq = _seq(d.doc)
    assert len(seq) == 79 and seq[0] == "attn8_mlp1024" and seq[1] == f"attn8_mlp{_decilm_width(1.3125)}"
    assert any("layers [79] are no-op in both halves" in x for x in d.inferred)


# ----------------------------------------------------------------------------- Kimi-K3

def test_kimi_k3_kda_and_mla_layers_latent_moe_mxfp4_experts():
    """SGLang's Kimi-K3 (vLLM has none): 69 KDA and 24 MLA layers by linear_attn_config (1-based),
    layer 0 dense, the routed experts on the 3584-wide latent, MXFP4 (the rest bf16 by the ignore list)."""
    d = import_result(HF / K3)
    doc = d.doc
    assert d.family == "kimi_k3" and doc["modality"] == "text_decoder_of_multimodal"
    full = _cfg(K3)["text_config"]["linear_attn_config"]["full_attn_layers"]
    expect = [("mla" if i + 1 in full else "kda") + ("_dense" if i == 0 else "_moe") for i in range(93)]
    seq = _seq(doc)
    assert seq == expect and seq.count("kda_moe") == 68 and seq.count("mla_moe") == 24
    kinds = doc["layer_kinds"]
    kda = kinds["kda_moe"]
    assert _node(kda, "RecurrentUpdate") == {"op": "RecurrentUpdate", "recurrent_kind": "kda", "n_heads": 96,
                                             "d_h": 128, "state_size": 128, "conv_kernel": 4,
                                             "intermediate_size": 3 * 12288, "state_dtype": "fp32"}
    assert _node(kda, "GEMM", "kda_qkv_proj")["n"] == 3 * 96 * 128
    assert _node(kda, "GEMM", "kda_g_proj") == {"op": "GEMM", "role": "kda_g_proj", "n": 12288, "k": 7168}  # full rank
    mla = kinds["mla_moe"]
    assert _node(mla, "Attention") == {"op": "Attention", "kind": "mla", "n_q": 96, "n_kv": 1, "d_h": 576,
                                       "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                                       "v_head_dim": 128}
    assert _node(mla, "GEMM", "attn_gate_proj") == {"op": "GEMM", "role": "attn_gate_proj", "n": 96 * 128, "k": 7168}
    assert _node(mla, "GEMM", "q_b_proj") == {"op": "GEMM", "role": "q_b_proj", "n": 96 * 192, "k": 1536}
    assert _node(mla, "GroupedGEMM", "experts") == {
        "op": "GroupedGEMM", "role": "experts", "n": 3072, "k": 3584, "experts": 896, "top_k": 16, "latent_size": 3584,
        "weight_dtype": "mxfp4"}
    assert _node(mla, "GEMM", "moe_latent_in") == {"op": "GEMM", "role": "moe_latent_in", "n": 3584, "k": 7168,
                                                   "replicated": True, "weight_dtype": "bf16"}
    assert _node(mla, "GEMM", "shared_expert_gate_up")["n"] == 2 * 2 * 3072          # 2 shared x 3072, gated
    # the latent (3584) and the shared output (7168) all-reduced as one bf16 buffer
    assert _node(mla, "AllReduce", "mlp_out")["bytes_per_token"] == 2 * (3584 + 7168)
    # attention residuals: two reads of up to ceil(92 / 12) = 8 snapshots + 2 rows of 7168 x 2 B
    assert [n["bytes_per_token"] for n in mla if n.get("role") == "attn_res_aggregate"] == [10 * 7168 * 2] * 2
    assert doc["weight_dtype"] == "bf16" and _node(kinds["kda_dense"], "GEMM", "mlp_gate_up")["n"] == 2 * 33792
    assert all("weight_dtype" not in n for n in kda if n["op"] == "GEMM" and n["role"].startswith("kda"))
    # parameters: KDA 443,580,416 a layer, MLA 232,194,048, the dense MLP 3 x 33792 x 7168, each MoE
    # layer 3 x 6144 x 7168 shared + 2 x 3584 x 7168 latent + 896 x 3 x 3072 x 3584 experts, head and
    # embedding 2 x 163840 x 7168: 2.78T, 104.8B active (16 experts)
    kda_p = (36864 + 12288 + 96 + 128) * 7168 + 12288 * 128 + 7168 * 12288
    mla_p = 2112 * 7168 + 18432 * 1536 + 24576 * 512 + 2 * 12288 * 7168
    assert (kda_p, mla_p) == (443_580_416, 232_194_048)
    dense, moe_fixed, expert = 3 * 33792 * 7168, 3 * 6144 * 7168 + 2 * 3584 * 7168, 3 * 3072 * 3584
    t, a = _params(doc)
    assert t == 69 * kda_p + 24 * mla_p + dense + 92 * (moe_fixed + 896 * expert) + 2 * 163840 * 7168
    assert a == 69 * kda_p + 24 * mla_p + dense + 92 * (moe_fixed + 16 * expert) + 2 * 163840 * 7168
    assert t == pytest.approx(2.779e12, rel=1e-3) and a == pytest.approx(104.75e9, rel=1e-3)
    # 8 x B300: MXFP4 experts at 0.5 + 1/32 byte (block scales held), the rest bf16 / 8 but the replicated
    # latent projections and f_a whole on every rank; MLA KV 24 x 576 x 2 B (latent, not split); the KDA
    # state 69 x 96 x 128 x 128 x 4 B / 8 per request
    dep = _deployment(K3, chip="b300")
    experts = 92 * 896 * expert
    replicated = 92 * 2 * 3584 * 7168 + 69 * 128 * 7168
    assert dep.plan.memory["weights_bytes"] == pytest.approx(
        (experts * (0.5 + 1 / 32) + 2 * (t - experts - replicated)) / 8 + 2 * replicated, rel=1e-12)
    assert dep.plan.memory["kv_bytes_per_token"] == 24 * 576 * 2
    assert dep.plan.memory["recurrent_state_bytes_per_request"] == 69 * 96 * 128 * 128 * 4 / 8


@pytest.mark.parametrize("change,field,value,reason", [
    (lambda t: t["linear_attn_config"].update(kda_layers=[0, 1]), "text_config.linear_attn_config.kda_layers", 0,
     "1-based layer numbers"),
    (lambda t: t["linear_attn_config"].update(kda_layers=[4]), "text_config.linear_attn_config.kda_layers", 4,
     "both KDA and full attention"),
    (lambda t: t["linear_attn_config"].pop("num_heads"), "text_config.linear_attn_config.num_heads", None,
     "required key is missing"),
    (lambda t: t.update(mamba_ssm_dtype="int8"), "text_config.mamba_ssm_dtype", "int8", "unknown state dtype"),
    (lambda t: t.update(first_k_dense_replace=93), "text_config.first_k_dense_replace", 93, "no layer of 93"),
])
def test_a_bad_kimi_k3_config_is_refused(tmp_path, change, field, value, reason):
    cfg = _cfg(K3)
    change(cfg["text_config"])
    import_refused(_write(tmp_path, "bad", cfg), field, value, reason)


def test_kimi_k3_variants(tmp_path):
    # no latent, no attention residuals, a low-rank KDA gate: experts on the hidden state
    cfg = _cfg(K3)
    t = cfg["text_config"]
    t.update(routed_expert_hidden_size=None, attn_res_block_size=None)
    t["linear_attn_config"]["use_full_rank_gate"] = False
    doc = import_result(_write(tmp_path, "a", cfg)).doc
    nodes = doc["layer_kinds"]["kda_moe"]
    assert _node(nodes, "GroupedGEMM", "experts")["k"] == 7168 and "attn_res_aggregate" not in str(nodes)
    assert [(n["n"], n["k"]) for n in nodes if n.get("role") == "kda_g_proj"] == [(128, 7168), (12288, 128)]


# ----------------------------------------------------------------------------- it prices, sizes

@pytest.mark.parametrize("folder,chip", [(G26, "h200"), (MIMO2, "h200"), (STEP, "h200"), (SUPER49, "h200"),
                                         (K3, "b300")])
def test_each_family_prices_decode_steps_on_eight_gpus(folder, chip, capsys):
    """`jaxprice price CONFIG --chip h200 --tp 8 --decode 1,8`: finite, positive times per row (Kimi-K3,
    2.8T parameters, on B300s: its weights do not fit 8 H200s)."""
    check_prices_decode(folder, chip, 8, capsys)


def test_size_takes_a_gemma4_config(capsys):
    """`jaxprice size` searches an imported Gemma 4 as it does a bundled graph (steady evaluator, one
    GPU, one concurrency) and prints vLLM's launch line for it."""
    from jaxprice.cli import main
    argv = ["size", str(HF / G26), "--chip", "h200", "--gpus", "1", "--isl", "1024", "--osl", "256",
            "--evaluator", "steady", "--concurrency", "4", "--quiet", "--max-num-seqs", "256",
            "--max-num-batched-tokens", "8192", "--graph-modes", "PIECEWISE", "--weights", "bf16"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "vllm serve google/gemma-4-26B-A4B --tensor-parallel-size 1" in out, out
    best = re.search(r"best: .*?: ([0-9.]+) tok/s per GPU", out)
    assert best and float(best.group(1)) > 0, out
