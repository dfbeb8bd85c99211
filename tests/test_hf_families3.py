"""GLM-4.5 / 4.6 / 4.7 (Glm4MoeForCausalLM), GLM-4.7-Flash (Glm4MoeLiteForCausalLM), Gemma 2, Gemma 3
and Phi-3 / Phi-4 for `jaxprice import-model` (jaxprice/_src/hf.py: _fam_glm4_moe, _fam_deepseek,
_fam_gemma, _fam_phi3).

Every expected number is worked out by hand from the shipped config.json (testdata/hf; where each
came from: testdata/hf/SOURCES.md) and the vLLM model files cited beside the builders (glm4_moe.py,
glm4_moe_mtp.py, glm4_moe_lite.py, gemma2.py, gemma3.py, phi3.py), not by calling the importer twice.
Parameter totals are compared with the published ones: GLM-4.7 355B total / 32B active (the GLM-4.5
report's sizes, which GLM-4.6 / 4.7 keep; the graph holds no MTP layer, as this file states none),
GLM-4.7-Flash 30B-A3B, Phi-4 14.7B, Gemma-2-9B 9.24B, Gemma-3-1B 1.0B (the graph's GEMMs and
embedding; the norms are not in it). Configs changed in a test (a copy under tmp_path) say what they
change. One price per family; the rest compiles nothing.
"""

from __future__ import annotations

import argparse

import pytest
from clirefusal import import_refused

from jaxprice._src.hf import import_result

from hfgraph import HF, check_prices_decode, cfg as _cfg, node as _node, params as _params, seq as _seq, write as _write  # noqa: E402,F401
GLM, PHI4, G2, G3 = "zai-org--GLM-4.7-FP8", "microsoft--phi-4", "google--gemma-2-9b-it", "google--gemma-3-1b-it"
FLASH = "zai-org--GLM-4.7-Flash"


def _memory(folder, tp):
    from jaxprice._src.cli_price import model_deployment
    args = argparse.Namespace(chip="h200", tp=tp, dp=None, weights=None, ep=False, gpus_per_node=None, fabric=None)
    return model_deployment(str(HF / folder), args).plan.memory


# ----------------------------------------------------------------------------- GLM-4.7

def test_glm47_three_dense_layers_then_moe_with_a_shared_expert():
    d = import_result(HF / GLM)
    doc = d.doc
    assert d.architecture == "Glm4MoeForCausalLM" and d.family == "glm4_moe"
    # first_k_dense_replace 3 of 92 layers
    assert _seq(doc) == ["attn_dense"] * 3 + ["attn_moe"] * 89
    kinds = doc["layer_kinds"]
    for nodes in kinds.values():
        # 96 q heads, 8 KV heads of head_dim 128: qkv (96 + 2 x 8) x 128, o_proj from 96 x 128
        assert _node(nodes, "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 96, "n_kv": 8, "d_h": 128}
        assert _node(nodes, "GEMM", "qkv_proj") == {"op": "GEMM", "role": "qkv_proj", "n": 14336, "k": 5120}
        assert _node(nodes, "GEMM", "o_proj") == {"op": "GEMM", "role": "o_proj", "n": 5120, "k": 12288}
    assert _node(kinds["attn_dense"], "GEMM", "mlp_gate_up")["n"] == 2 * 12288
    assert _node(kinds["attn_dense"], "GEMM", "mlp_down") == {"op": "GEMM", "role": "mlp_down", "n": 5120, "k": 12288}
    # 160 routed experts (top 8) and the one shared expert, all 1536 wide
    assert _node(kinds["attn_moe"], "GroupedGEMM", "experts") == {
        "op": "GroupedGEMM", "role": "experts", "n": 1536, "k": 5120, "experts": 160, "top_k": 8, "shared_experts": 1}
    assert doc["tie_word_embeddings"] is False and doc["weight_dtype"] == "bf16" and doc["max_model_len"] == 202752
    assert "speculator" not in doc          # the file states no num_nextn_predict_layers
    t, a = _params(doc)
    attn = 92 * (14336 + 12288) * 5120
    dense = 3 * 3 * 12288 * 5120
    head_emb = 2 * 151552 * 5120
    assert t == attn + dense + 89 * (160 + 1) * 3 * 1536 * 5120 + head_emb == 352_722_616_320
    assert a == attn + dense + 89 * (8 + 1) * 3 * 1536 * 5120 + head_emb
    # published (GLM-4.5 report, kept by 4.6 / 4.7): 355B total, 32B active without the embedding;
    # the checkpoint's MTP layer (~4B) and the routers are not in this graph
    assert t == pytest.approx(355e9, rel=1e-2)
    assert a - 151552 * 5120 == pytest.approx(32e9, rel=3e-2)


def test_glm47_resolves_its_kv_and_weights_by_hand():
    """8 x H200 at bf16: 92 layers x 2 x (8 KV heads / 8) x 128 x 2 B = 47,104 KV bytes per token and
    rank; weights 2 B x 352,722,616,320 / 8 (an untied head: its embedding counted once, as a GEMM)."""
    mem = _memory(GLM, 8)
    assert mem["kv_bytes_per_token"] == 92 * 2 * 1 * 128 * 2 == 47104.0
    assert mem["kv_window_bytes_per_token"] == ()
    assert mem["weights_bytes"] == pytest.approx(2 * 352_722_616_320 / 8, rel=1e-12)


def test_glm_mtp_layer_is_one_moe_layer_and_the_config_keys_are_checked(tmp_path):
    """A copy stating num_nextn_predict_layers 1 and use_qk_norm (as GLM-4.5 / 4.7's own config.json
    do): vLLM's glm4_moe_mtp.py drafts with one Glm4MoeDecoderLayer past the last (MoE); q/k norms
    are noted. n_shared_experts null builds no shared expert (vLLM Glm4MoE)."""
    cfg = dict(_cfg(GLM), num_nextn_predict_layers=1, use_qk_norm=True)
    d = import_result(_write(tmp_path, "mtp", cfg))
    assert d.doc["speculator"] == {"method": "glm4_moe_mtp", "num_spec_tokens": 1,
                                   "stack": {"pattern": ["attn_moe"], "repeat": 1}}
    assert any(x.startswith("GLM MTP") for x in d.inferred) and any("use_qk_norm" in x for x in d.inferred)
    none = import_result(_write(tmp_path, "noshared", dict(_cfg(GLM), n_shared_experts=None))).doc
    assert "shared_experts" not in _node(none["layer_kinds"]["attn_moe"], "GroupedGEMM", "experts")
    import_refused(_write(tmp_path, "past", dict(_cfg(GLM), first_k_dense_replace=93)), "first_k_dense_replace", 93,
                   "more than the model's 92 layers")
    import_refused(_write(tmp_path, "alldense", dict(_cfg(GLM), first_k_dense_replace=92)), "first_k_dense_replace",
                   92, "no layer of 92 would be MoE")
    bad = {k: v for k, v in _cfg(GLM).items() if k != "moe_intermediate_size"}
    import_refused(_write(tmp_path, "nowidth", bad), "moe_intermediate_size", None, "required key is missing")


# ----------------------------------------------------------------------------- GLM-4.7-Flash

def test_glm47_flash_is_mla_with_glm_experts():
    """Glm4MoeLiteForCausalLM (vLLM glm4_moe_lite.py): DeepSeek-V2 MLA (q LoRA 768, KV latent 512 + rope
    64, nope 192, v 256, 20 heads), one dense layer, then 64 experts (top 4) and a shared one, 1536 wide."""
    d = import_result(HF / FLASH)
    doc = d.doc
    assert d.architecture == "Glm4MoeLiteForCausalLM" and d.family == "glm4_moe_lite"
    assert _seq(doc) == ["attn_dense"] + ["attn_moe"] * 46
    moe = doc["layer_kinds"]["attn_moe"]
    assert _node(moe, "Attention") == {"op": "Attention", "kind": "mla", "n_q": 20, "n_kv": 1, "d_h": 576,
                                       "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 192,
                                       "v_head_dim": 256}
    assert _node(moe, "GEMM", "qkv_a_proj") == {"op": "GEMM", "role": "qkv_a_proj", "n": 768 + 512 + 64, "k": 2048}
    assert _node(moe, "GEMM", "q_b_proj")["n"] == 20 * (192 + 64)
    assert _node(moe, "GEMM", "kv_b_proj") == {"op": "GEMM", "role": "kv_b_proj", "n": 20 * (192 + 256), "k": 512}
    assert _node(moe, "GEMM", "o_proj") == {"op": "GEMM", "role": "o_proj", "n": 2048, "k": 20 * 256}
    assert _node(moe, "GroupedGEMM", "experts") == {"op": "GroupedGEMM", "role": "experts", "n": 1536, "k": 2048,
                                                    "experts": 64, "top_k": 4, "shared_experts": 1}
    t, a = _params(doc)
    mla = 47 * (1344 * 2048 + 5120 * 768 + 8960 * 512 + 2048 * 5120)
    head_emb = 2 * 154880 * 2048
    assert t == mla + 3 * 10240 * 2048 + 46 * 65 * 3 * 1536 * 2048 + head_emb == 29_937_106_944
    assert t == pytest.approx(30e9, rel=1e-2)                        # published: 30B (30B-A3B)
    assert a == mla + 3 * 10240 * 2048 + 46 * 5 * 3 * 1536 * 2048 + head_emb
    # "A3B" (the name's rounded figure): 3.26B without the embedding and the head
    assert a - 2 * 154880 * 2048 == pytest.approx(3e9, rel=0.1)
    # one GPU: the MLA latent, 47 x (512 + 64) x 2 B per token
    mem = _memory(FLASH, 1)
    assert mem["kv_bytes_per_token"] == 47 * 576 * 2 == 54144.0 and mem["weights_bytes"] == 2 * t


def test_glm47_flash_takes_no_deepseek_default(tmp_path):
    """The MLA sizes DeepSeek-V3's config class would fill in are required here; the MTP layer (a copy
    stating num_nextn_predict_layers 1) drafts with one MoE layer (vLLM glm4_moe_lite_mtp.py)."""
    bad = {k: v for k, v in _cfg(FLASH).items() if k != "q_lora_rank"}
    import_refused(_write(tmp_path, "noq", bad), "q_lora_rank", None, "required key is missing")
    doc = import_result(_write(tmp_path, "mtp", dict(_cfg(FLASH), num_nextn_predict_layers=1))).doc
    assert doc["speculator"] == {"method": "glm4_moe_lite_mtp", "num_spec_tokens": 1,
                                 "stack": {"pattern": ["attn_moe"], "repeat": 1}}
    noq = import_result(_write(tmp_path, "nullq", dict(_cfg(FLASH), q_lora_rank=None))).doc
    assert _node(noq["layer_kinds"]["attn_moe"], "GEMM", "q_proj")["n"] == 20 * 256


# ----------------------------------------------------------------------------- Phi-4 / Phi-3

def test_phi4_is_llama_layers_with_a_window_over_the_whole_context():
    d = import_result(HF / PHI4)
    doc = d.doc
    assert d.architecture == "Phi3ForCausalLM" and d.family == "phi3"
    # sliding_window 16384 = max_position_embeddings 16384: full attention in every layer
    assert _seq(doc) == ["dense"] * 40
    nodes = doc["layer_kinds"]["dense"]
    assert _node(nodes, "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 40, "n_kv": 10, "d_h": 128}
    assert _node(nodes, "GEMM", "qkv_proj")["n"] == (40 + 2 * 10) * 128
    assert _node(nodes, "GEMM", "mlp_gate_up") == {"op": "GEMM", "role": "mlp_gate_up", "n": 35840, "k": 5120}
    assert any("16384 >= max_position_embeddings 16384" in x for x in d.inferred)
    t, _ = _params(doc)
    assert t == 40 * (7680 * 5120 + 5120 * 5120 + 3 * 17920 * 5120) + 2 * 100352 * 5120 == 14_659_092_480
    assert t == pytest.approx(14.7e9, rel=5e-3)          # published: 14.7B
    # one GPU at bf16: 40 x 2 x 10 x 128 x 2 B per token
    mem = _memory(PHI4, 1)
    assert mem["kv_bytes_per_token"] == 204800.0 and mem["kv_window_bytes_per_token"] == ()
    assert mem["weights_bytes"] == 2 * 14_659_092_480


def test_phi3_mini_window_makes_every_layer_sliding(tmp_path):
    """Phi-3-mini-4k's shape of window (a copy of the Phi-4 file with sliding_window 2047 under
    max_position_embeddings 4096): vLLM applies the config's window to every layer."""
    cfg = dict(_cfg(PHI4), sliding_window=2047, max_position_embeddings=4096, original_max_position_embeddings=4096)
    doc = import_result(_write(tmp_path, "mini", cfg)).doc
    assert _seq(doc) == ["swa_dense"] * 40
    assert _node(doc["layer_kinds"]["swa_dense"], "Attention")["window"] == 2047
    # an explicit null (vLLM: no window) is full attention, and no note about a window is made
    d = import_result(_write(tmp_path, "null", dict(_cfg(PHI4), sliding_window=None)))
    assert _seq(d.doc) == ["dense"] * 40 and not any("sliding_window" in x for x in d.inferred)


# ----------------------------------------------------------------------------- Gemma 2 / Gemma 3

def test_gemma2_9b_alternates_sliding_and_global_layers():
    d = import_result(HF / G2)
    doc = d.doc
    assert d.architecture == "Gemma2ForCausalLM" and d.family == "gemma2"
    # no layer_types: transformers' Gemma2Config alternates from a sliding layer 0 (vLLM reads layer_types)
    assert _seq(doc) == ["swa_dense", "full_dense"] * 21
    kinds = doc["layer_kinds"]
    assert _node(kinds["swa_dense"], "Attention") == {"op": "Attention", "kind": "swa", "n_q": 16, "n_kv": 8,
                                                      "d_h": 256, "window": 4096}
    assert _node(kinds["full_dense"], "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 16, "n_kv": 8,
                                                       "d_h": 256}
    for nodes in kinds.values():
        # head_dim 256 x 16 heads = 4096 > hidden 3584: o_proj 4096 -> 3584
        assert _node(nodes, "GEMM", "o_proj") == {"op": "GEMM", "role": "o_proj", "n": 3584, "k": 4096}
        assert [n["role"] for n in nodes if n["op"] == "Elementwise"] == [
            "input_norm", "post_attn_norm", "pre_ffn_norm", "post_ffn_norm"]
    assert doc["tie_word_embeddings"] is True and doc["max_model_len"] == 8192
    assert any("softcapping" in x for x in d.inferred)
    t, _ = _params(doc)
    assert t == 42 * (8192 * 3584 + 3584 * 4096 + 3 * 14336 * 3584) + 256000 * 3584 == 9_241_100_288
    assert t == pytest.approx(9.24e9, rel=1e-3)          # published: 9.24B
    # one GPU: 21 sliding and 21 global layers of 2 x 8 x 256 x 2 B = 8,192 B each
    mem = _memory(G2, 1)
    assert mem["kv_window_bytes_per_token"] == ((4096.0, 21 * 8192.0),)
    assert mem["kv_bytes_per_token"] == 42 * 8192.0


def test_gemma3_1b_five_sliding_one_global():
    d = import_result(HF / G3)
    doc = d.doc
    assert d.architecture == "Gemma3ForCausalLM" and d.family == "gemma3"
    # sliding_window_pattern 6: layers 5, 11, 17, 23 global
    seq = _seq(doc)
    assert [i for i, k in enumerate(seq) if k == "full_dense"] == [5, 11, 17, 23] and len(seq) == 26
    swa = doc["layer_kinds"]["swa_dense"]
    assert _node(swa, "Attention") == {"op": "Attention", "kind": "swa", "n_q": 4, "n_kv": 1, "d_h": 256, "window": 512}
    assert _node(swa, "GEMM", "qkv_proj") == {"op": "GEMM", "role": "qkv_proj", "n": 1536, "k": 1152}
    t, _ = _params(doc)
    assert t == 26 * (1536 * 1152 + 1152 * 1024 + 3 * 6912 * 1152) + 262144 * 1152 == 999_751_680
    assert t == pytest.approx(1.0e9, rel=1e-3)           # published: 1B
    mem = _memory(G3, 1)
    assert mem["kv_window_bytes_per_token"] == ((512.0, 22 * 1024.0),)     # 2 x 1 x 256 x 2 B a layer
    assert mem["kv_bytes_per_token"] == 26 * 1024.0


def test_gemma3_multimodal_config_takes_the_text_defaults_it_leaves_out(tmp_path):
    """Gemma 3's multimodal config.json states only the text sizes that differ from transformers'
    Gemma3TextConfig (the 4B's text_config: hidden_size, intermediate_size, num_hidden_layers,
    sliding_window, rope_scaling). A copy of the 1B file with its three sizes nested under text_config
    and nothing else: 8 heads, 4 KV heads of 256, vocab 262,208, a global layer every 6th, window 4096,
    tied; max_model_len not scaled by the linear RoPE factor (vLLM: Gemma 3's is already scaled)."""
    src = _cfg(G3)
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "text_config": {k: src[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers")}
           | {"model_type": "gemma3_text", "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
           "vision_config": {"model_type": "siglip_vision_model"}}
    d = import_result(_write(tmp_path, "mm", cfg))
    doc = d.doc
    assert doc["modality"] == "text_decoder_of_multimodal" and doc["vocab_size"] == 262208
    assert doc["tie_word_embeddings"] is True and doc["max_model_len"] == 131072
    assert _node(doc["layer_kinds"]["swa_dense"], "Attention") == {
        "op": "Attention", "kind": "swa", "n_q": 8, "n_kv": 4, "d_h": 256, "window": 4096}
    assert [i for i, k in enumerate(_seq(doc)) if k == "full_dense"] == [5, 11, 17, 23]
    for key in ("num_attention_heads absent: 8", "num_key_value_heads absent: 4", "vocab_size absent: 262208",
                "sliding_window_pattern absent: 6"):
        assert any(x.startswith(key) and "Gemma3TextConfig" in x for x in d.inferred), key
    # the shapes no default stands in for stay required
    del cfg["text_config"]["intermediate_size"]
    import_refused(_write(tmp_path, "bad", cfg), "text_config.intermediate_size", None, "required key is missing")


def test_gemma_layer_types_are_checked(tmp_path):
    import_refused(_write(tmp_path, "short", dict(_cfg(G2), layer_types=["sliding_attention"] * 41)),
                   "layer_types", 41, "41 entries for 42 layers")
    import_refused(_write(tmp_path, "kind", dict(_cfg(G3), layer_types=["chunked_attention"] * 26)),
                   "layer_types", "chunked_attention", "unknown layer type")


# ----------------------------------------------------------------------------- it prices

@pytest.mark.parametrize("folder,tp", [(GLM, "8"), (FLASH, "1"), (PHI4, "2"), (G2, "1"), (G3, "1")])
def test_each_family_prices_decode_steps(folder, tp, capsys):
    """`jaxprice price CONFIG --chip h200 --tp TP --decode 1,8`: finite, positive times per row."""
    check_prices_decode(folder, "h200", tp, capsys)
