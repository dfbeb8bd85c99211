"""`jaxprice import-model CONFIG --as ARCHITECTURE` (and ``as_architecture=`` of import_result /
import_hf_config): a config of an architecture the importer does not read, priced as a known
architecture's layers, never silently (jaxprice/_src/hf.py: _architecture, _check_as_structure,
_unread_keys).

The hand-worked case is InternLM3-8B-Instruct's config under an architecture name the importer does
not read (SeedOssForCausalLM: Seed-OSS, Llama layers with biases in vLLM's seed_oss.py); InternLM3's own
InternLM3ForCausalLM vLLM registers as LlamaForCausalLM (vllm/model_executor/models/registry.py:
"InternLM3ForCausalLM": ("llama", "LlamaForCausalLM")), and so does the importer (the last test). Its
sizes are the checkpoint's config.json as quoted in the public GitHub index (a Swift test's
``realConfigJSON``, mlx-swift port of InternLM3: hidden 4096, 48 layers, 32 heads / 2 KV heads of 128,
MLP 10240, vocab 128512, untied, dynamic RoPE factor 6); the token ids and the other bookkeeping keys
the checkpoint's file also states are added as transformers writes them. NumPy only: nothing is jitted.
"""

from __future__ import annotations

import argparse
import copy

import pytest
from clirefusal import assert_refused, refused

from jaxprice import import_hf_config
from jaxprice._src.hf import ARCHITECTURES, import_result

from hfgraph import HF, node as _node, params as _params, seq as _seq, write as _write  # noqa: E402

INTERNLM3 = {
    "architectures": ["SeedOssForCausalLM"], "auto_map": {"AutoConfig": "configuration_internlm3.InternLM3Config"},
    "bias": False, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 10240, "max_position_embeddings": 32768,
    "model_type": "internlm3", "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 2,
    "pad_token_id": 2, "qkv_bias": False, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 6.0, "rope_type": "dynamic"}, "rope_theta": 50000000, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.47.1", "use_cache": True, "vocab_size": 128512}


def _memory(path, tp):
    from jaxprice._src.cli_price import model_deployment
    args = argparse.Namespace(chip="h200", tp=tp, dp=None, weights=None, ep=False, gpus_per_node=None, fabric=None)
    return model_deployment(str(path), args).plan.memory


def test_internlm3_as_llama_counts_parameters_and_kv_bytes_by_hand(tmp_path, capsys):
    from jaxprice.cli import main
    path = _write(tmp_path, "internlm--internlm3-8b-instruct", INTERNLM3)
    d = import_result(path, as_architecture="LlamaForCausalLM")
    doc = d.doc
    assert (d.architecture, d.priced_as, d.family) == ("SeedOssForCausalLM", "LlamaForCausalLM", "dense")
    assert _seq(doc) == ["dense"] * 48
    nodes = doc["layer_kinds"]["dense"]
    assert _node(nodes, "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 32, "n_kv": 2, "d_h": 128}
    # qkv: (32 + 2 x 2) heads x 128 = 4608 rows of 4096; o_proj 4096 x (32 x 128); gate+up 2 x 10240
    assert _node(nodes, "GEMM", "qkv_proj") == {"op": "GEMM", "role": "qkv_proj", "n": 4608, "k": 4096}
    assert _node(nodes, "GEMM", "o_proj") == {"op": "GEMM", "role": "o_proj", "n": 4096, "k": 4096}
    assert _node(nodes, "GEMM", "mlp_gate_up") == {"op": "GEMM", "role": "mlp_gate_up", "n": 20480, "k": 4096}
    assert _node(nodes, "GEMM", "mlp_down") == {"op": "GEMM", "role": "mlp_down", "n": 4096, "k": 10240}
    t, a = _params(doc)
    # by hand, per layer: qkv 4608 x 4096 = 18,874,368; o 4096 x 4096 = 16,777,216; MLP 3 x 10240 x 4096 =
    # 125,829,120; sum 161,480,704; x 48 = 7,751,073,792. Embedding and head (untied) 2 x 128512 x 4096 =
    # 1,052,770,304. Total 8,803,844,096: the "8-billion parameter" InternLM3-8B-Instruct (8.8B)
    assert t == a == 48 * (4608 * 4096 + 4096 * 4096 + 3 * 10240 * 4096) + 2 * 128512 * 4096 == 8_803_844_096
    # never silent: the first two notes say what it was priced as and what it did not read (bias and
    # qkv_bias; the token ids, eps, rope_theta, auto_map, hidden_act silu ... change no price: counted only)
    assert d.inferred[0].startswith("priced as LlamaForCausalLM's layers (--as LlamaForCausalLM, family dense): "
                                    "the config's SeedOssForCausalLM is not an architecture the importer reads")
    assert d.inferred[1] == ("config keys LlamaForCausalLM's layers did not read (priced as if absent): bias, "
                             "qkv_bias; 11 more that change no price (token ids, norm epsilons, rope_theta, "
                             "dropout, ...) not listed")
    # the CLI writes the same notes into the graph and says them on the terminal; the graph then prices
    out = tmp_path / "internlm3.yaml"
    assert main(["import-model", str(path), "--as", "LlamaForCausalLM", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "note: priced as LlamaForCausalLM's layers" in err and "did not read (priced as if absent): bias" in err
    assert "(SeedOssForCausalLM priced as LlamaForCausalLM, 48 layers, weights bf16)" in err
    text = out.read_text()
    assert "# architecture: SeedOssForCausalLM, priced as LlamaForCausalLM's layers (--as; family dense)" in text
    assert ("# inferred: config keys LlamaForCausalLM's layers did not read (priced as if absent): bias, "
            "qkv_bias") in text
    # KV cache by hand: 48 layers x 2 (K, V) x 2 KV heads x 128 x 2 B (bf16) = 49,152 B per token on one GPU;
    # at --tp 2 each rank holds one KV head: 24,576 B
    assert _memory(out, 1)["kv_bytes_per_token"] == 48 * 2 * 2 * 128 * 2 == 49152.0
    mem = _memory(out, 2)
    assert mem["kv_bytes_per_token"] == 48 * 2 * 1 * 128 * 2 == 24576.0
    assert mem["weights_bytes"] == pytest.approx(2 * 8_803_844_096 / 2, rel=1e-12)
    # the public function takes the same keyword
    assert import_hf_config(path, as_architecture="LlamaForCausalLM").expanded_stack() == ["dense"] * 48


def test_an_unknown_architecture_is_refused_naming_the_option(tmp_path):
    path = _write(tmp_path, "internlm3", INTERNLM3)
    msg = refused(lambda: import_result(path), str(path), "field 'architectures'", "value 'SeedOssForCausalLM'",
                  "unsupported architecture (supported: LlamaForCausalLM", "--as ARCHITECTURE", "as_architecture=")
    assert msg.startswith(str(path))


@pytest.mark.parametrize("change,field,value,words", [
    # routed experts under a dense family: priced as one dense MLP they would be plainly wrong
    (dict(num_experts=64, num_experts_per_tok=8), "num_experts", 64, "routed experts, which LlamaForCausalLM's"),
    (dict(n_routed_experts=256), "n_routed_experts", 256, "MixtralForCausalLM"),
    (dict(num_local_experts=8), "num_local_experts", 8, "dense MLP, family dense"),
    # a hybrid stack under attention-only layers
    (dict(layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 12),
     "layer_types", "linear_attention", "hybrid layer types (linear_attention)"),
    (dict(layer_types=["mamba", "full_attention"] * 24), "layer_types", "mamba", "attention-only layers"),
    (dict(hybrid_override_pattern="M-M*" * 12), "hybrid_override_pattern", "M-M*" * 12, "hybrid (linear-attention"),
    (dict(attn_layer_period=8, attn_layer_offset=4), "attn_layer_period", 8, "state-space"),
    # MLA: the KV cache is a latent, not heads
    (dict(kv_lora_rank=512, q_lora_rank=1536), "kv_lora_rank", 512, "MLA attention"),
    # a sliding / global pattern the family does not read would make every layer sliding
    (dict(sliding_window=4096, sliding_window_pattern=4), "sliding_window_pattern", 4, "state layer_types"),
])
def test_structure_the_chosen_layers_cannot_price_is_refused(tmp_path, change, field, value, words):
    cfg = dict(copy.deepcopy(INTERNLM3), **change)
    path = _write(tmp_path, "x", cfg)
    msg = refused(lambda: import_result(path, as_architecture="LlamaForCausalLM"), f"field '{field}'", words)
    assert msg.startswith(str(path))
    if value is not None:
        assert f"value {value!r}" in msg
    # one expert (a dense model's num_experts: 1) and a null are not MoE
    if field == "num_experts":
        ok = _write(tmp_path, "one", dict(INTERNLM3, num_experts=1, n_routed_experts=None))
        assert import_result(ok, as_architecture="LlamaForCausalLM").family == "dense"


def test_a_moe_config_read_as_a_moe_architecture(tmp_path):
    """--as MixtralForCausalLM reads num_local_experts / num_experts_per_tok: no refusal, and the keys
    Mixtral's layers do not read are listed."""
    cfg = dict(INTERNLM3, architectures=["SomeMoeForCausalLM"], num_local_experts=8, num_experts_per_tok=2,
               router_aux_loss_coef=0.02)
    d = import_result(_write(tmp_path, "moe", cfg), as_architecture="MixtralForCausalLM")
    assert d.family == "moe" and _seq(d.doc) == ["attn_moe"] * 48
    assert _node(d.doc["layer_kinds"]["attn_moe"], "GroupedGEMM", "experts")["experts"] == 8
    assert "bias, qkv_bias, router_aux_loss_coef;" in d.inferred[1]


def test_as_is_checked_and_a_known_architecture_is_read_natively(tmp_path, capsys):
    path = _write(tmp_path, "internlm3", INTERNLM3)
    # a name the importer does not read: refused with the list, and the spelling it was near
    refused(lambda: import_result(path, as_architecture="LlamaForCausalLm"), "field 'as_architecture'",
            "did you mean LlamaForCausalLM?", "known: LlamaForCausalLM, MistralForCausalLM")
    refused(lambda: import_result(path, as_architecture="GPT2LMHeadModel"), "not an architecture the importer reads")
    refused(lambda: import_result(path, as_architecture=""), "must be an architecture name")
    assert_refused(capsys, ["import-model", str(path), "--as", "Llama"], "field '--as'", "value 'Llama'",
                   "known: LlamaForCausalLM")
    # a known architecture is read natively: --as naming another family is refused (the native reading
    # reads every key its family knows; another could only drop some) ...
    llama = HF / "meta-llama--Llama-3.1-8B-Instruct"
    refused(lambda: import_result(llama, as_architecture="MistralForCausalLM"), "field 'architectures'",
            "value 'LlamaForCausalLM'", "is read natively (family dense)", "leave it out")
    # ... and --as naming its own architecture changes nothing but a note
    native, same = import_result(llama), import_result(llama, as_architecture="LlamaForCausalLM")
    assert same.doc == native.doc and same.priced_as is None
    assert same.inferred[0] == "--as LlamaForCausalLM: the config's own architecture, read natively (no change)"
    assert "LlamaForCausalLM" in ARCHITECTURES


def test_a_config_without_architectures_takes_the_named_one(tmp_path):
    cfg = {k: v for k, v in INTERNLM3.items() if k != "architectures"}
    path = _write(tmp_path, "bare", cfg)
    refused(lambda: import_result(path), "field 'architectures'", "required key is missing")
    d = import_result(path, as_architecture="LlamaForCausalLM")
    assert d.architecture == "(none stated)" and "the config states no architectures" in d.inferred[0]


def test_a_qwen2_shaped_config_with_its_window_off_is_full_attention(tmp_path):
    """vLLM takes use_sliding_window false as no window whatever the architecture (a Qwen2-derived
    config read --as LlamaForCausalLM states sliding_window 4096 beside it): full attention, not swa."""
    cfg = dict(INTERNLM3, sliding_window=4096, use_sliding_window=False, max_window_layers=28)
    d = import_result(_write(tmp_path, "q", cfg), as_architecture="LlamaForCausalLM")
    assert _seq(d.doc) == ["dense"] * 48
    assert "use_sliding_window false: sliding_window not applied" in " ".join(d.inferred)
    assert "max_window_layers" in d.inferred[1]         # not read by Llama's layers: listed
    on = import_result(_write(tmp_path, "on", dict(cfg, use_sliding_window=True)), as_architecture="LlamaForCausalLM")
    assert _seq(on.doc) == ["swa_dense"] * 48


def test_a_nested_text_config_lists_its_unread_keys_with_their_prefix(tmp_path):
    text = dict({k: v for k, v in INTERNLM3.items() if k != "architectures"}, no_rope_layers=[1, 1, 1, 0] * 12)
    cfg = {"architectures": ["SomeVLForConditionalGeneration"], "text_config": text,
           "vision_config": {"hidden_size": 1024}}
    d = import_result(_write(tmp_path, "vl", cfg), as_architecture="LlamaForCausalLM")
    assert d.doc["modality"] == "text_decoder_of_multimodal" and _seq(d.doc) == ["dense"] * 48
    assert "text_config.bias, text_config.qkv_bias, text_config.no_rope_layers;" in d.inferred[1]


def test_vllms_llama_aliases_are_read_natively_as_llama(tmp_path):
    """InternLM3ForCausalLM (and InternLM, Aquila, Xverse) vLLM runs as LlamaForCausalLM
    (vllm/model_executor/models/registry.py): read natively, no --as, the same graph as the --as
    reading of the same sizes, with no 'priced as' note."""
    native = _write(tmp_path, "internlm--internlm3-8b-instruct", dict(INTERNLM3, architectures=["InternLM3ForCausalLM"]))
    d = import_result(native)
    assert (d.architecture, d.priced_as, d.family) == ("InternLM3ForCausalLM", None, "dense")
    assert not any("priced as" in n for n in d.inferred)
    as_llama = import_result(_write(tmp_path / "as", "x", INTERNLM3), as_architecture="LlamaForCausalLM")
    assert d.doc["layer_kinds"] == as_llama.doc["layer_kinds"] and _params(d.doc) == _params(as_llama.doc)
    for arch in ("InternLMForCausalLM", "AquilaForCausalLM", "XverseForCausalLM"):
        assert ARCHITECTURES[arch] == ARCHITECTURES["LlamaForCausalLM"]
