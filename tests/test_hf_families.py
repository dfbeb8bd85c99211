"""The Hugging Face families added to `jaxprice import-model` (jaxprice/_src/hf.py): Qwen3-VL and
Qwen3-VL-MoE (the Qwen3 / Qwen3-MoE text decoder under text_config, DeepStack adds on the first
layers), Llama 4 (chunked local attention on the RoPE layers, interleaved MoE with a shared
expert) and MiMo (Qwen2 with an MTP drafter).

Every expected number below is worked out by hand from the shipped config.json (testdata/hf,
verbatim from aiconfigurator-core 0.12.0) and vLLM's model code (qwen3_vl.py, qwen3_vl_moe.py,
llama4.py, mimo.py, mimo_mtp.py), not by calling the importer twice. The parameter counts are
the published ones: Qwen3-VL-8B (8.2B text), Qwen3-VL-30B-A3B (30.5B / 3.3B active, text),
Qwen3-VL-235B-A22B (235B / 22B), Llama-4-Scout (109B / 17B, with its 0.9B vision tower),
Llama-4-Maverick (400B / 17B), MiMo-7B (7.6B without its MTP layer). No JAX compile.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from clirefusal import import_refused

from jaxprice._src.hf import import_result

from hfgraph import HF, cfg as _cfg, node as _node, params as _params, seq as _seq, write as _write  # noqa: E402,F401
VL8, VL30, VL235 = "Qwen--Qwen3-VL-8B-Instruct", "Qwen--Qwen3-VL-30B-A3B-Instruct", "Qwen--Qwen3-VL-235B-A22B-Instruct"
SCOUT, MAVERICK = "meta-llama--Llama-4-Scout-17B-16E-Instruct", "meta-llama--Llama-4-Maverick-17B-128E-Instruct"
MIMO = "XiaomiMiMo--MiMo-7B-Base"


# ----------------------------------------------------------------------------- Qwen3-VL

def test_qwen3_vl_8b_is_qwen3_with_deepstack_adds_on_its_first_three_layers():
    d = import_result(HF / VL8)
    doc = d.doc
    assert d.architecture == "Qwen3VLForConditionalGeneration" and d.family == "qwen3_vl"
    assert list(doc["layer_kinds"]) == ["dense_deepstack", "dense"]
    assert _seq(doc) == ["dense_deepstack"] * 3 + ["dense"] * 33          # deepstack_visual_indexes [8, 16, 24]
    for kid in doc["layer_kinds"]:
        nodes = doc["layer_kinds"][kid]
        assert _node(nodes, "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 32, "n_kv": 8, "d_h": 128}
        assert _node(nodes, "GEMM", "qkv_proj")["n"] == (32 + 2 * 8) * 128
        assert _node(nodes, "GEMM", "mlp_gate_up") == {"op": "GEMM", "role": "mlp_gate_up", "n": 2 * 12288, "k": 4096}
    # read the hidden state and the DeepStack row, write the sum: 3 x 4096 x 2 bytes
    assert _node(doc["layer_kinds"]["dense_deepstack"], "Elementwise", "deepstack_add")["bytes_per_token"] == 24576
    assert "deepstack_add" not in [n.get("role") for n in doc["layer_kinds"]["dense"]]
    assert doc["modality"] == "text_decoder_of_multimodal" and "speculator" not in doc
    assert doc["max_model_len"] == 262144 and doc["weight_dtype"] == "bf16" and doc["tie_word_embeddings"] is False
    assert any(x.startswith("multimodal (vision_config)") and "(text-only requests)" in x for x in d.inferred)
    # 36 x (4096 x 6144 + 4096 x 4096 + 3 x 4096 x 12288) + 2 x 151936 x 4096 (untied)
    layer = 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 12288
    assert _params(doc) == (36 * layer + 2 * 151936 * 4096,) * 2
    assert _params(doc)[0] == pytest.approx(8.19e9, rel=1e-3)


@pytest.mark.parametrize("folder,layers,hidden,nq,nkv,moe_n,total,active", [
    # 48 x (2048 x 5120 + 4096 x 2048 + 128 x 3 x 768 x 2048) + 2 x 151936 x 2048: 30.5B; 8 of 128 active: 3.3B
    (VL30, 48, 2048, 32, 4, 768, 30.52e9, 3.34e9),
    # 94 x (4096 x 9216 + 8192 x 4096 + 128 x 3 x 1536 x 4096) + 2 x 151936 x 4096: 235.0B; active 22.1B
    (VL235, 94, 4096, 64, 4, 1536, 235.04e9, 22.14e9),
])
def test_qwen3_vl_moe_is_qwen3_moe_with_deepstack(folder, layers, hidden, nq, nkv, moe_n, total, active):
    d = import_result(HF / folder)
    doc = d.doc
    assert d.family == "qwen3_vl_moe"
    assert _seq(doc) == ["attn_moe_deepstack"] * 3 + ["attn_moe"] * (layers - 3)   # decoder_sparse_step 1
    for nodes in doc["layer_kinds"].values():
        assert _node(nodes, "Attention") == {"op": "Attention", "kind": "gqa", "n_q": nq, "n_kv": nkv, "d_h": 128}
        assert _node(nodes, "GroupedGEMM", "experts") == {"op": "GroupedGEMM", "role": "experts", "n": moe_n,
                                                          "k": hidden, "experts": 128, "top_k": 8}
    assert doc["max_model_len"] == 262144
    t, a = _params(doc)
    assert t == layers * (hidden * (nq + 2 * nkv) * 128 + nq * 128 * hidden + 128 * 3 * moe_n * hidden) \
        + 2 * 151936 * hidden
    assert t == pytest.approx(total, rel=1e-3) and a == pytest.approx(active, rel=1e-3)


def test_qwen3_vl_variants(tmp_path):
    # mlp_only_layers: that layer dense at intermediate_size (6144), still a DeepStack layer
    cfg = _cfg(VL30)
    cfg["text_config"]["mlp_only_layers"] = [1]
    doc = import_result(_write(tmp_path, "a", cfg)).doc
    assert _seq(doc)[:4] == ["attn_moe_deepstack", "attn_dense_deepstack", "attn_moe_deepstack", "attn_moe"]
    assert _node(doc["layer_kinds"]["attn_dense_deepstack"], "GEMM", "mlp_gate_up")["n"] == 2 * 6144
    # no deepstack_visual_indexes: transformers' [8, 16, 24]; an empty list: no adds
    cfg = _cfg(VL8)
    del cfg["vision_config"]["deepstack_visual_indexes"]
    d = import_result(_write(tmp_path, "b", cfg))
    assert _seq(d.doc)[:4] == ["dense_deepstack"] * 3 + ["dense"]
    assert any("deepstack_visual_indexes absent: [8, 16, 24]" in x for x in d.inferred)
    cfg["vision_config"]["deepstack_visual_indexes"] = []
    assert _seq(import_result(_write(tmp_path, "c", cfg)).doc) == ["dense"] * 36
    # head_dim absent: Qwen3VLTextConfig's 128; null: hidden_size // heads (4096 // 32 = 128, so use 64 heads)
    cfg = _cfg(VL8)
    cfg["text_config"].update(num_attention_heads=64)
    del cfg["text_config"]["head_dim"]
    d = import_result(_write(tmp_path, "d", cfg))
    assert _node(d.doc["layer_kinds"]["dense"], "Attention")["d_h"] == 128
    assert any(x.startswith("head_dim absent: 128") for x in d.inferred)
    cfg["text_config"]["head_dim"] = None
    assert _node(import_result(_write(tmp_path, "e", cfg)).doc["layer_kinds"]["dense"], "Attention")["d_h"] == 64
    # the top level's tie_word_embeddings where text_config states none
    cfg = _cfg(VL8)
    cfg["tie_word_embeddings"] = True
    assert import_result(_write(tmp_path, "f", cfg)).doc["tie_word_embeddings"] is True
    # a sliding window stated in text_config is not read (Qwen3VLMoeTextConfig forces none)
    cfg = _cfg(VL8)
    cfg["text_config"].update(sliding_window=4096, use_sliding_window=True)
    assert _seq(import_result(_write(tmp_path, "g", cfg)).doc) == _seq(import_result(HF / VL8).doc)


@pytest.mark.parametrize("folder,change,field,value,reason", [
    (VL8, lambda c: c.pop("text_config"), "text_config", None, "required key is missing"),
    (VL30, lambda c: c.update(text_config=None), "text_config", None, "required key is missing"),
    (VL8, lambda c: c["text_config"].pop("num_key_value_heads"), "text_config.num_key_value_heads", None,
     "required key is missing"),
    (VL8, lambda c: c["vision_config"].update(deepstack_visual_indexes=list(range(37))),
     "vision_config.deepstack_visual_indexes", None, "37 DeepStack levels for the text model's 36 layers"),
    (VL8, lambda c: c["vision_config"].update(deepstack_visual_indexes="8,16"),
     "vision_config.deepstack_visual_indexes", "8,16", "expected a list"),
    (VL8, lambda c: c.update(vision_config=[1]), "vision_config", "[1]", "expected a mapping"),
    (VL30, lambda c: c["text_config"].update(decoder_sparse_step=49), "text_config.decoder_sparse_step", 49,
     "more than the model's 48 layers"),
    (VL30, lambda c: c["text_config"].update(mlp_only_layers=list(range(48))), "text_config.mlp_only_layers", None,
     "no layer of 48 would be MoE"),
])
def test_a_bad_qwen3_vl_config_isimport_refused(tmp_path, folder, change, field, value, reason):
    cfg = _cfg(folder)
    change(cfg)
    import_refused(_write(tmp_path, "bad", cfg), field, value, reason)


# ----------------------------------------------------------------------------- Llama 4

def _llama4_expected(n, step, every=4):
    """The layer kinds vLLM's llama4.py builds: MoE where (i + 1) % step == 0; NoPE (global) where
    (i + 1) % 4 == 0 (transformers' no_rope_layer_interval), else chunked."""
    return [("attn" if (i + 1) % every == 0 else "chunked") + ("_moe" if (i + 1) % step == 0 else "_dense")
            for i in range(n)]


def test_llama4_scout_every_layer_moe_three_in_four_chunked():
    d = import_result(HF / SCOUT)
    doc = d.doc
    assert d.family == "llama4" and doc["modality"] == "text_decoder_of_multimodal"
    seq = _seq(doc)
    assert seq == _llama4_expected(48, 1) and seq.count("chunked_moe") == 36 and seq.count("attn_moe") == 12
    kinds = doc["layer_kinds"]
    assert _node(kinds["chunked_moe"], "Attention") == {"op": "Attention", "kind": "swa", "n_q": 40, "n_kv": 8,
                                                        "d_h": 128, "window": 8192}
    assert _node(kinds["attn_moe"], "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 40, "n_kv": 8, "d_h": 128}
    for kid in kinds:
        assert _node(kinds[kid], "GroupedGEMM", "experts") == {
            "op": "GroupedGEMM", "role": "experts", "n": 8192, "k": 5120, "experts": 16, "top_k": 1,
            "shared_experts": 1}
    # llama3 rope: max_position_embeddings not scaled (vLLM _get_and_verify_max_len)
    assert doc["max_model_len"] == 10485760 and "speculator" not in doc
    assert any("as swa with window attention_chunk_size 8192" in x for x in d.inferred)
    # attention 48 x (5120 x 7168 + 5120 x 5120) = 3.02B; experts 48 x (16 + 1) x 3 x 8192 x 5120 = 102.7B;
    # head and embedding 2 x 202048 x 5120 = 2.07B: 107.8B (+ the 0.9B vision tower = 109B); active
    # 3.02 + 48 x 2 x 125.8M + 2.07 = 17.2B
    t, a = _params(doc)
    assert t == 48 * (5120 * 7168 + 5120 * 5120 + 17 * 3 * 8192 * 5120) + 2 * 202048 * 5120
    assert t == pytest.approx(107.77e9, rel=1e-3) and a == pytest.approx(17.17e9, rel=1e-3)


def test_llama4_maverick_alternates_dense_and_moe():
    doc = import_result(HF / MAVERICK).doc
    seq = _seq(doc)
    assert seq == _llama4_expected(48, 2)
    assert seq[:4] == ["chunked_dense", "chunked_moe", "chunked_dense", "attn_moe"]
    assert (seq.count("chunked_dense"), seq.count("chunked_moe"), seq.count("attn_moe")) == (24, 12, 12)
    kinds = doc["layer_kinds"]
    assert _node(kinds["chunked_dense"], "GEMM", "mlp_gate_up")["n"] == 2 * 16384         # intermediate_size_mlp
    assert _node(kinds["chunked_moe"], "GroupedGEMM", "experts")["experts"] == 128
    assert doc["max_model_len"] == 1048576                                                # rope_scaling null
    # 24 MoE layers x 129 x 3 x 8192 x 5120 = 389.6B; 24 dense x 3 x 16384 x 5120 = 6.04B; attention
    # 3.02B; head and embedding 2.07B: 400.7B; active 3.02 + 6.04 + 24 x 2 x 125.8M + 2.07 = 17.2B
    t, a = _params(doc)
    assert t == 48 * (5120 * 7168 + 5120 * 5120) + 24 * 129 * 3 * 8192 * 5120 + 24 * 3 * 16384 * 5120 \
        + 2 * 202048 * 5120
    assert t == pytest.approx(400.70e9, rel=1e-3) and a == pytest.approx(17.17e9, rel=1e-3)


def test_llama4_weights_and_windowed_kv_resolve_as_the_graph_implies():
    """Resolved (no compile) on 8 x H200 at bf16: each rank holds 1/8 of the 400.7B parameters at
    2 bytes; the 36 chunked layers' KV (k and v, 8 heads x 128 x 2 bytes, / tp 8) is windowed at 8192."""
    from jaxprice._src.cli_price import model_deployment
    args = argparse.Namespace(chip="h200", tp=8, dp=None, weights=None, ep=False, gpus_per_node=None, fabric=None)
    d = model_deployment(str(HF / MAVERICK), args)
    t, _ = _params(import_result(HF / MAVERICK).doc)
    assert d.plan.memory["weights_bytes"] == pytest.approx(2 * t / 8, rel=1e-9)
    assert d.plan.memory["kv_window_bytes_per_token"] == ((8192.0, 36 * 2 * 8 * 128 * 2 / 8),)


def test_llama4_variants(tmp_path):
    # no chunking (an explicit null): every layer global attention
    cfg = _cfg(SCOUT)
    cfg["text_config"]["attention_chunk_size"] = None
    assert set(_seq(import_result(_write(tmp_path, "a", cfg)).doc)) == {"attn_moe"}
    # an explicit no_rope_layers wins over the interval; an empty one is the default (transformers)
    cfg = _cfg(MAVERICK)
    cfg["text_config"]["no_rope_layers"] = [0, 1] * 24
    seq = _seq(import_result(_write(tmp_path, "b", cfg)).doc)
    assert seq[:4] == ["attn_dense", "chunked_moe", "attn_dense", "chunked_moe"]
    cfg["text_config"]["no_rope_layers"] = []
    assert _seq(import_result(_write(tmp_path, "c", cfg)).doc) == _llama4_expected(48, 2)
    # moe_layers that agree with interleave_moe_layer_step are accepted
    cfg["text_config"]["moe_layers"] = list(range(1, 48, 2))
    assert _seq(import_result(_write(tmp_path, "d", cfg)).doc) == _llama4_expected(48, 2)
    # a text-only Llama4ForCausalLM (the text config at the top level)
    cfg = dict(_cfg(SCOUT)["text_config"], architectures=["Llama4ForCausalLM"])
    d = import_result(_write(tmp_path, "e", cfg))
    assert d.doc["modality"] == "text_only" and _seq(d.doc) == _llama4_expected(48, 1)


@pytest.mark.parametrize("change,field,value,reason", [
    (lambda t: t.update(interleave_moe_layer_step=49), "text_config.interleave_moe_layer_step", 49,
     "more than the model's 48 layers"),
    (lambda t: t.update(interleave_moe_layer_step=0), "text_config.interleave_moe_layer_step", 0,
     "no layer of 48 would be MoE although num_local_experts 128"),
    (lambda t: t.update(moe_layers=list(range(0, 48, 2))), "text_config.moe_layers", None,
     "differs from the layers interleave_moe_layer_step 2 makes MoE"),
    (lambda t: t.update(moe_layers=[48]), "text_config.moe_layers", 48, "expected layer indices from 0 to 47"),
    (lambda t: t.update(no_rope_layers=[1] * 47), "text_config.no_rope_layers", 47, "47 entries for 48 layers"),
    (lambda t: t.update(no_rope_layers=[2] * 48), "text_config.no_rope_layers", 2, "expected 1 \\(RoPE"),
    (lambda t: t.update(attention_chunk_size=0), "text_config.attention_chunk_size", 0, "at least 1"),
    (lambda t: t.update(intermediate_size_mlp=-1), "text_config.intermediate_size_mlp", -1, "cannot be negative"),
    (lambda t: t.pop("intermediate_size"), "text_config.intermediate_size", None, "required key is missing"),
    (lambda t: t.update(num_experts_per_tok=129), "text_config.num_experts_per_tok", 129, "more experts per token"),
])
def test_a_bad_llama4_config_isimport_refused(tmp_path, change, field, value, reason):
    cfg = _cfg(MAVERICK)
    change(cfg["text_config"])
    import_refused(_write(tmp_path, "bad", cfg), field, value, reason)


def test_llama4_without_text_config_isimport_refused(tmp_path):
    cfg = _cfg(SCOUT)
    cfg.update(cfg.pop("text_config"))           # the keys at the top level, the architecture multimodal
    import_refused(_write(tmp_path, "bad", cfg), "text_config", None, "Llama4ForConditionalGeneration nests")


# ----------------------------------------------------------------------------- MiMo

def test_mimo_is_qwen2_with_one_mtp_drafter_layer():
    d = import_result(HF / MIMO)
    doc = d.doc
    assert d.family == "mimo" and doc["modality"] == "text_only"
    assert _seq(doc) == ["dense"] * 36                    # use_sliding_window false: no window
    nodes = doc["layer_kinds"]["dense"]
    assert _node(nodes, "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 32, "n_kv": 8, "d_h": 128}
    assert _node(nodes, "GEMM", "mlp_down") == {"op": "GEMM", "role": "mlp_down", "n": 4096, "k": 11008}
    # num_nextn_predict_layers 1; vLLM's MiMo MTP drafts one token per step (spec_step_idx 0 only)
    assert doc["speculator"] == {"method": "mimo_mtp", "num_spec_tokens": 1,
                                 "stack": {"pattern": ["dense"], "repeat": 1}}
    assert doc["max_model_len"] == 32768
    # 36 x (4096 x 6144 + 4096 x 4096 + 3 x 4096 x 11008) + 2 x 151680 x 4096 = 7.62B
    assert _params(doc)[0] == 36 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 11008) + 2 * 151680 * 4096
    assert _params(doc)[0] == pytest.approx(7.62e9, rel=1e-3)


def test_mimo_variants_and_refusals(tmp_path):
    cfg = _cfg(MIMO)
    cfg["num_nextn_predict_layers"] = 0
    assert "speculator" not in import_result(_write(tmp_path, "a", cfg)).doc
    cfg = _cfg(MIMO)
    cfg["use_sliding_window"] = True          # Qwen2's rule: layers from max_window_layers (32) on windowed
    doc = import_result(_write(tmp_path, "b", cfg)).doc
    assert _seq(doc) == ["dense"] * 32 + ["swa_dense"] * 4
    assert _node(doc["layer_kinds"]["swa_dense"], "Attention")["window"] == 32768
    cfg = _cfg(MIMO)
    cfg["num_nextn_predict_layers"] = -1
    import_refused(_write(tmp_path, "c", cfg), "num_nextn_predict_layers", -1, "cannot be negative")


def test_import_model_by_bundled_name_prints_the_coverage_notes(capsys):
    from jaxprice.cli import main
    assert main(["import-model", "Qwen/Qwen3-VL-8B-Instruct"]) == 0
    out = capsys.readouterr().out
    assert "# inferred: multimodal (vision_config): the text decoder is priced, the other towers are not " \
           "(text-only requests)" in out and "role: deepstack_add" in out
    assert main(["import-model", "llama-4-maverick-17b-128e-instruct"]) == 0
    out = capsys.readouterr().out
    assert "kind: swa" in out and "window: 8192" in out and "chunked local attention (36 RoPE layers)" in out


def test_llama4_module_names_meet_the_quantization_lists(tmp_path):
    """Llama 4 spells its MLPs feed_forward.*: an FP8 checkpoint that keeps attention, the shared
    expert and the dense MLPs at bf16 quantizes only the routed experts; the shared expert then
    becomes its own pair of bf16 GEMMs (8192 wide)."""
    cfg = _cfg(MAVERICK)
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}},
        "ignore": ["re:.*self_attn.*", "re:.*router", "re:.*shared_expert.*", "re:.*feed_forward\\.(gate|up|down)_proj",
                   "lm_head"]}
    doc = import_result(_write(tmp_path, "q", cfg)).doc
    assert doc["weight_dtype"] == "bf16"
    moe = doc["layer_kinds"]["chunked_moe"]
    assert _node(moe, "GroupedGEMM", "experts")["weight_dtype"] == "fp8" and "shared_experts" not in _node(
        moe, "GroupedGEMM", "experts")
    assert _node(moe, "GEMM", "shared_expert_gate_up") == {"op": "GEMM", "role": "shared_expert_gate_up",
                                                           "n": 2 * 8192, "k": 5120}
    dense = doc["layer_kinds"]["chunked_dense"]
    assert all("weight_dtype" not in n for n in dense if n["op"] == "GEMM")
    assert all("weight_dtype" not in n for n in doc["head"])


def test_the_readme_lists_every_architecture_the_importer_reads():
    """README.md's list of importable architectures is the importer's table, name for name."""
    from jaxprice._src.hf import ARCHITECTURES
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = text.index("The importer reads these architectures")
    listed = re.findall(r"`(\w+For\w+)`", text[start:text.index("A coefficient\nentry reads", start)])
    assert sorted(listed) == sorted(ARCHITECTURES)
