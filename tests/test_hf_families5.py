"""Phi-3.5-MoE (PhiMoEForCausalLM) and StarCoder2 (Starcoder2ForCausalLM) for `jaxprice import-model`
(jaxprice/_src/hf.py: _fam_phimoe, _fam_starcoder2, built as vLLM's phimoe.py and starcoder2.py build the
layers).

No file in the public GitHub index is either checkpoint's config.json with its repository known, so each
test writes the model's sizes to a copy under tmp_path. Phi-3.5-MoE-instruct's are as its config states
them and the index quotes them (hidden 4096, 32 layers, 32 heads / 8 KV heads, experts 6400 wide, 16 local
experts, top 2, vocab 32064, untied, sliding window 131072 = max_position_embeddings, longrope from 4096).
StarCoder2-15B's are its config.json as a note in the index quotes it whole (hidden 6144, 40 layers, 48
heads / 4 KV heads, MLP 24576, vocab 49152, untied, sliding window 4096 of 16384, use_bias,
gelu_pytorch_tanh). Every expected number is worked out by hand from those sizes, not by calling the
importer twice; the totals are compared with the published ones (Phi-3.5-MoE's model card: 42B parameters,
6.6B active; StarCoder2-15B's: "a 15B parameter model"; the graph's GEMMs and embedding, the biases, norms
and routers not in it). NumPy only: nothing is jitted.
"""

from __future__ import annotations

import argparse

import pytest
from clirefusal import import_refused

from jaxprice._src.hf import import_result

from hfgraph import node as _node, params as _params, seq as _seq, write as _write  # noqa: E402

PHI35_MOE = {
    "architectures": ["PhiMoEForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_phimoe.PhiMoEConfig",
                 "AutoModelForCausalLM": "modeling_phimoe.PhiMoEForCausalLM"},
    "bos_token_id": 1, "eos_token_id": 32000, "hidden_act": "silu", "hidden_dropout": 0.0, "hidden_size": 4096,
    "initializer_range": 0.02, "input_jitter_noise": 0.01, "intermediate_size": 6400, "lm_head_bias": True,
    "max_position_embeddings": 131072, "model_type": "phimoe", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 16,
    "original_max_position_embeddings": 4096, "output_router_logits": False, "rms_norm_eps": 1e-05,
    "rope_scaling": {"long_mscale": 1.243163121016122, "original_max_position_embeddings": 4096,
                     "short_mscale": 1.243163121016122, "type": "longrope"},
    "rope_theta": 10000.0, "router_aux_loss_coef": 0.0, "router_jitter_noise": 0.01, "sliding_window": 131072,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": True,
    "vocab_size": 32064}


def _memory(path, tp):
    from jaxprice._src.cli_price import model_deployment
    args = argparse.Namespace(chip="h200", tp=tp, dp=None, weights=None, ep=False, gpus_per_node=None, fabric=None)
    return model_deployment(str(path), args).plan.memory


def test_phi35_moe_every_layer_routes_16_experts_top_2(tmp_path):
    path = _write(tmp_path, "microsoft--Phi-3.5-MoE-instruct", PHI35_MOE)
    d = import_result(path)
    doc = d.doc
    assert d.architecture == "PhiMoEForCausalLM" and d.family == "phimoe" and d.priced_as is None
    assert _seq(doc) == ["attn_moe"] * 32
    nodes = doc["layer_kinds"]["attn_moe"]
    # 32 q heads, 8 KV heads of 4096 / 32 = 128: qkv (32 + 2 x 8) x 128 = 6144 rows; o_proj 4096 x 4096.
    # The window (131072) covers max_position_embeddings (131072): full attention, as Phi-3's
    assert _node(nodes, "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 32, "n_kv": 8, "d_h": 128}
    assert _node(nodes, "GEMM", "qkv_proj") == {"op": "GEMM", "role": "qkv_proj", "n": 6144, "k": 4096}
    assert _node(nodes, "GEMM", "o_proj") == {"op": "GEMM", "role": "o_proj", "n": 4096, "k": 4096}
    # vLLM PhiMoE: FusedMoE(num_local_experts 16, top_k num_experts_per_tok 2, config.intermediate_size 6400)
    assert _node(nodes, "GroupedGEMM", "experts") == {"op": "GroupedGEMM", "role": "experts", "n": 6400, "k": 4096,
                                                      "experts": 16, "top_k": 2}
    assert not any(n["op"] == "GEMM" and n["role"].startswith(("mlp", "shared")) for n in nodes)
    assert doc["tie_word_embeddings"] is False and doc["weight_dtype"] == "bf16"
    assert doc["max_model_len"] == 131072            # longrope: vLLM does not scale the context by it
    assert any(x.startswith("sliding_window 131072 >= max_position_embeddings 131072") for x in d.inferred)
    t, a = _params(doc)
    attn = 6144 * 4096 + 4096 * 4096                 # 41,943,040 per layer
    expert = 3 * 6400 * 4096                         # 78,643,200
    emb = 2 * 32064 * 4096                           # embedding and lm_head, untied: 262,668,288
    # total 32 x (41,943,040 + 16 x 78,643,200) + 262,668,288; active the same with 2 experts
    assert t == 32 * (attn + 16 * expert) + emb == 41_870_163_968
    assert a == 32 * (attn + 2 * expert) + emb == 6_638_010_368
    assert t == pytest.approx(42e9, rel=5e-3)        # published (the model card): 42B
    assert a == pytest.approx(6.6e9, rel=1e-2)       # published: 6.6B active
    # one GPU at bf16: 32 layers x 2 x 8 KV heads x 128 x 2 B = 131,072 B per token; tp 2: 4 KV heads a rank
    mem = _memory(path, 1)
    assert mem["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * 2 == 131072.0 and mem["kv_window_bytes_per_token"] == ()
    assert mem["weights_bytes"] == 2 * 41_870_163_968
    assert _memory(path, 2)["kv_bytes_per_token"] == 32 * 2 * 4 * 128 * 2 == 65536.0


def test_phimoe_keys_are_required_and_checked(tmp_path):
    """vLLM's PhiMoE reads num_local_experts, num_experts_per_tok and intermediate_size (its own config class's
    defaults are not Phi-3.5-MoE's sizes): each is required; its sparsemixer routing is top-2 only."""
    for key in ("num_local_experts", "num_experts_per_tok", "intermediate_size"):
        bad = {k: v for k, v in PHI35_MOE.items() if k != key}
        import_refused(_write(tmp_path, key, bad), key, None, "required key is missing")
    import_refused(_write(tmp_path, "top4", dict(PHI35_MOE, num_experts_per_tok=4)), "num_experts_per_tok", 4,
                   "top-2 only")


def test_phimoe_window_head_and_quantization(tmp_path):
    """A window shorter than the context makes every layer sliding (vLLM's global window); a stated tie is
    not applied (vLLM builds its own lm_head); an FP8 checkpoint keeps the lm_head at bf16 (quant_config=None)."""
    d = import_result(_write(tmp_path, "w", dict(PHI35_MOE, sliding_window=4096, tie_word_embeddings=True)))
    assert _node(d.doc["layer_kinds"]["attn_moe"], "Attention") == {"op": "Attention", "kind": "swa", "n_q": 32,
                                                                    "n_kv": 8, "d_h": 128, "window": 4096}
    assert d.doc["tie_word_embeddings"] is False
    assert any("never tied" in x for x in d.inferred)
    q = import_result(_write(tmp_path, "fp8", dict(PHI35_MOE, quantization_config={"quant_method": "fp8"})))
    assert q.doc["weight_dtype"] == "fp8"
    assert _node(q.doc["head"], "GEMM", "lm_head")["weight_dtype"] == "bf16"


STARCODER2_15B = {
    "_name_or_path": "/aot/checkpoints/15b/config.json", "architectures": ["Starcoder2ForCausalLM"],
    "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 6144, "initializer_range": 0.01275, "intermediate_size": 24576, "max_position_embeddings": 16384,
    "mlp_type": "default", "model_type": "starcoder2", "norm_epsilon": 1e-05, "norm_type": "layer_norm",
    "num_attention_heads": 48, "num_hidden_layers": 40, "num_key_value_heads": 4, "rms_norm_eps": 1e-05,
    "rope_theta": 100000, "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "float32",
    "transformers_version": "4.37.0.dev0", "use_bias": True, "use_cache": True, "vocab_size": 49152}


def test_starcoder2_15b_is_sliding_gqa_with_a_non_gated_mlp(tmp_path):
    path = _write(tmp_path, "bigcode--starcoder2-15b", STARCODER2_15B)
    d = import_result(path)
    doc = d.doc
    assert d.architecture == "Starcoder2ForCausalLM" and d.family == "starcoder2"
    # vLLM's global window (4096 < 16384 positions): every layer sliding
    assert _seq(doc) == ["swa_dense"] * 40
    nodes = doc["layer_kinds"]["swa_dense"]
    # head_dim 6144 / 48 = 128; qkv (48 + 2 x 4) x 128 = 7168 rows of 6144
    assert _node(nodes, "Attention") == {"op": "Attention", "kind": "swa", "n_q": 48, "n_kv": 4, "d_h": 128,
                                         "window": 4096}
    assert _node(nodes, "GEMM", "qkv_proj") == {"op": "GEMM", "role": "qkv_proj", "n": 7168, "k": 6144}
    # Starcoder2MLP: c_fc 6144 -> 24576, c_proj 24576 -> 6144; no gate
    assert _node(nodes, "GEMM", "mlp_up") == {"op": "GEMM", "role": "mlp_up", "n": 24576, "k": 6144}
    assert _node(nodes, "GEMM", "mlp_down") == {"op": "GEMM", "role": "mlp_down", "n": 6144, "k": 24576}
    assert not any(n["op"] == "GEMM" and n["role"] == "mlp_gate_up" for n in nodes)
    assert doc["weight_dtype"] == "bf16" and doc["max_model_len"] == 16384     # fp32 checkpoint served at bf16
    t, _ = _params(doc)
    # per layer: qkv 7168 x 6144 = 44,040,192; o 6144 x 6144 = 37,748,736; MLP 2 x 24576 x 6144 = 301,989,888;
    # sum 383,778,816, x 40 = 15,351,152,640; embedding and head (untied) 2 x 49152 x 6144 = 603,979,776
    assert t == 40 * (7168 * 6144 + 6144 * 6144 + 2 * 24576 * 6144) + 2 * 49152 * 6144 == 15_955_132_416
    assert 15e9 <= t < 16e9                          # the model card's "15B parameter model" (a rounded name)
    # KV per token: 40 layers x 2 x 4 KV heads x 128 x 2 B = 81,920 B, every layer held to its 4096-token window
    mem = _memory(path, 1)
    assert mem["kv_bytes_per_token"] == 40 * 2 * 4 * 128 * 2 == 81920.0
    assert mem["kv_window_bytes_per_token"] == ((4096.0, 81920.0),)
    assert mem["weights_bytes"] == 2 * 15_955_132_416


def test_starcoder2_defaults_and_head_dim(tmp_path):
    """Where the config states no tie, transformers' Starcoder2Config ties the head (PretrainedConfig's
    default), and vLLM with it; a stated head_dim is not read (hidden_size // num_attention_heads); a
    window covering the context is full attention."""
    cfg = {k: v for k, v in STARCODER2_15B.items() if k != "tie_word_embeddings"}
    d = import_result(_write(tmp_path, "tied", dict(cfg, head_dim=64, sliding_window=16384)))
    assert d.doc["tie_word_embeddings"] is True
    assert any(x.startswith("tie_word_embeddings absent: true") for x in d.inferred)
    assert _seq(d.doc) == ["dense"] * 40
    assert _node(d.doc["layer_kinds"]["dense"], "Attention")["d_h"] == 128
    assert any("head_dim 64: not read" in x for x in d.inferred)
    import_refused(_write(tmp_path, "nomlp", {k: v for k, v in cfg.items() if k != "intermediate_size"}),
                   "intermediate_size", None, "required key is missing")
