"""Hugging Face config.json -> model graph (jaxprice/_src/hf.py, `jaxprice import-model`).

Parity: each of the 11 bundled models, imported from its config (testdata/hf/), prices as its
bundled graph does (every resource, NoOverlap and Overlap, decode 1..256 x context 1k..32k and a
mixed prefill batch, two scenarios each) with the same kernel and piece counts and the same
weight and KV bytes per token. Where the bundled graph and the config disagree (listed in
testdata/hf/SOURCES.md) the difference is asserted node by node, and the graph with the
difference reverted prices as the bundled one. On a scenario where the imported and the bundled
deployments resolve to the same static plan and coefficient vector (which makes every price of
every batch identical) the grid is priced once, on the first scenario, to save a compile. The
further models load, resolve on a chip where they fit and price finitely. Each grid is one
price_many call per deployment.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

import jaxprice as jp
from jaxprice import JaxpriceError
from jaxprice._src.formats import load_model_graph
from jaxprice._src.hf import ARCHITECTURES, graph_from_doc, graph_yaml, import_result
from jaxprice._src.resolve import scenario_path

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "testdata" / "hf"
REG = ROOT / "registry"

# bundled graph -> (config folder, two scenarios, the scenario's model replaced by this graph when
# the model has no bundled scenario of its own)
BUNDLED = {
    "llama-3.1-8b-instruct": ("meta-llama--Llama-3.1-8B-Instruct",
                              ["llama-3.1-70b-instruct-h200-fp8-vllm-tp1", "llama-3.1-70b-instruct-b200-fp4-vllm-tp2"]),
    "llama-3.1-70b-instruct": ("meta-llama--Llama-3.1-70B-Instruct",
                               ["llama-3.1-70b-instruct-h200-fp8-vllm-tp2", "llama-3.1-70b-instruct-b200-fp4-trt-tp4"]),
    "mixtral-8x7b-v0.1": ("mistralai--Mixtral-8x7B-v0.1",
                          ["llama-3.1-70b-instruct-h200-fp8-vllm-tp2", "llama-3.1-70b-instruct-h100-fp8-vllm-tp4"]),
    "deepseek-v3": ("deepseek-ai--DeepSeek-V3", ["deepseek-v3-h200-fp8-sglang-tp8", "deepseek-v3-b200-fp4-sglang-tp4"]),
    "deepseek-v4-pro": ("deepseek-ai--DeepSeek-V4-Pro",
                        ["deepseek-v4-pro-b200-fp4-sglang-tp8", "deepseek-v4-pro-b300-fp4-vllm-tp4"]),
    "glm-5": ("zai-org--GLM-5-FP8", ["glm-5-h200-fp8-sglang-tp8", "glm-5-b200-fp4-sglang-tp4"]),
    "gpt-oss-120b": ("openai--gpt-oss-120b", ["gpt-oss-120b-h200-fp4-vllm-tp1", "gpt-oss-120b-b200-fp4-trt-tp4"]),
    "kimi-k2.5": ("moonshotai--Kimi-K2.5", ["kimi-k2.5-b200-fp4-vllm-tp4", "kimi-k2.5-b300-fp4-vllm-tp8"]),
    "minimax-m2.5": ("MiniMaxAI--MiniMax-M2.5", ["minimax-m2.5-h200-fp8-vllm-tp4", "minimax-m2.5-b200-fp4-vllm-tp2-ep4-dp2"]),
    "minimax-m3": ("MiniMaxAI--MiniMax-M3", ["minimax-m3-b200-fp4-vllm-tp2", "minimax-m3-b300-fp4-vllm-tp2-ep4-dp2"]),
    "qwen3.5-397b-a17b": ("Qwen--Qwen3.5-397B-A17B",
                          ["qwen3.5-397b-a17b-h100-fp8-sglang-tp8", "qwen3.5-397b-a17b-b200-bf16-sglang-tp8"]),
}


# ----------------------------------------------------------------------------- documented differences
# (testdata/hf/SOURCES.md "Where a bundled graph and its config disagree"): the exact node fields
# that differ, and how to revert them to the bundled graph's reading.

def _revert_lm_head(doc):
    doc["head"][1].pop("weight_dtype")


def _revert_kimi(doc):
    doc["weight_dtype"] = "int4"
    for nodes in doc["layer_kinds"].values():
        for n in nodes:
            n.pop("weight_dtype", None)
            if n.get("role") in ("q_a_layernorm", "kv_a_layernorm"):
                n.pop("bytes_per_token")
        roles = [n.get("role") for n in nodes]
        if "shared_expert_gate_up" in roles:
            i = roles.index("shared_expert_gate_up")
            del nodes[i:i + 2]
            nodes[i - 1]["shared_experts"] = 1


def _revert_m3(doc):
    doc["modality"] = "text_decoder_of_multimodal"


DIFFERENCES = {
    "glm-5": ({"head[1].weight_dtype": ("bf16", None)}, _revert_lm_head),
    "minimax-m2.5": ({"head[1].weight_dtype": ("bf16", None)}, _revert_lm_head),
    "minimax-m3": ({"modality": ("text_only", "text_decoder_of_multimodal")}, _revert_m3),
    "kimi-k2.5": ({"weight_dtype": ("bf16", "int4"),
                   "attn_dense[2].bytes_per_token": (6144, None), "attn_dense[3].bytes_per_token": (2048, None),
                   "attn_moe[2].bytes_per_token": (6144, None), "attn_moe[3].bytes_per_token": (2048, None),
                   "attn_moe[10].weight_dtype": ("int4", None), "attn_moe[10].shared_experts": (None, 1),
                   "attn_moe.nodes": ("+shared_expert_gate_up(n=4096,k=7168), +shared_expert_down(n=7168,k=2048)", None)},
                  _revert_kimi),
}


def _graph_diff(doc, ref):
    """{path: (imported, bundled)} over the fields a graph prices."""
    out = {}
    for key in ("hidden_size", "vocab_size", "tie_word_embeddings", "weight_dtype", "modality"):
        if doc[key] != getattr(ref, key):
            out[key] = (doc[key], getattr(ref, key))
    if list(doc["layer_kinds"]) != list(ref.layer_kinds):
        out["layer_kinds"] = (list(doc["layer_kinds"]), list(ref.layer_kinds))
    g = graph_from_doc(doc, "imported")
    if g.expanded_stack() != ref.expanded_stack():
        out["stack"] = (doc["stack"], ref.stack)
    if g.speculator != ref.speculator:
        out["speculator"] = (g.speculator, ref.speculator)
    for where, mine, theirs in [(k, g.layer_kinds[k], ref.layer_kinds.get(k, ())) for k in g.layer_kinds] + \
                               [("head", g.head, ref.head)]:
        extra = [n for n in mine if n.get("role", "").startswith("shared_expert_")]
        mine = [n for n in mine if n not in extra]
        if extra:
            out[f"{where}.nodes"] = (", ".join(f"+{n['role']}(n={n['n']},k={n['k']})" for n in extra), None)
        for i, (a, b) in enumerate(zip(mine, theirs)):
            for f in sorted(set(a) | set(b)):
                if a.get(f) != b.get(f):
                    out[f"{where}[{i}].{f}"] = (a.get(f), b.get(f))
        if len(mine) != len(theirs):
            out[f"{where}.length"] = (len(mine), len(theirs))
    return out


# ----------------------------------------------------------------------------- helpers

def _scenario(tmp, name, model, **engine):
    docs = list(yaml.safe_load_all(scenario_path(name).read_text()))
    docs[0]["model"] = str(model)
    docs[1]["pools"][0]["engine"].update(engine)
    p = Path(tmp) / f"{name}--{Path(str(model)).name}{'-'.join(map(str, engine.values()))}.yaml"
    p.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return p


def _grid(threshold):
    """decode 1..256 x context 1k..32k, and one mixed prefill batch, padded to 256 rows."""
    bs = [jp.Batch.decode(n, c, pad_to=256, decode_threshold=threshold)
          for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) for c in (1024, 2048, 4096, 8192, 16384, 32768)]
    bs.append(jp.Batch.from_requests([2048, 512] + [1] * 64, [0, 1024] + [4095] * 64, pad_to=256,
                                     decode_threshold=threshold))
    return jp.Batch.stack(bs)


def _prices(d):
    r = jp.price_many(d.plan, d.coefficients, _grid(d.resolution["decode_threshold"]))
    return np.column_stack([np.asarray(r.resources), np.asarray(r.overlap), np.asarray(r.no_overlap)])


def _max_rel(a, b):
    scale = np.maximum(np.abs(b), 1e-12)
    return float(np.max(np.abs(a - b) / scale))


@pytest.fixture(scope="module")
def tmpdir_(tmp_path_factory):
    return tmp_path_factory.mktemp("hf")


def _deploy(tmp, scen, bundled, model_ref, roots=None, **engine):
    """The deployment of `scen` with its model replaced by `model_ref` (a config folder, or a graph
    name found in `roots`), and the reference deployment with the bundled graph."""
    ref = jp.load_deployment(_scenario(tmp, scen, bundled, **engine))
    kw = {"registry_roots": roots} if roots else {}
    imp = jp.load_deployment(_scenario(tmp, scen, model_ref, **engine), **kw)
    return ref, imp


def _same_sizes(ref, imp):
    for key in ("kernels_per_step", "piecewise_segments", "total_layers"):
        assert imp.resolution[key] == ref.resolution[key], key
    for key in ("weights_bytes", "kv_bytes_per_token"):
        assert imp.plan.memory[key] == pytest.approx(ref.plan.memory[key], rel=1e-12), key


PARITY = {}      # (model, scenario) -> max relative difference, for the report below


# ----------------------------------------------------------------------------- parity

@pytest.mark.parametrize("model", sorted(BUNDLED))
def test_imported_config_prices_as_the_bundled_graph(model, tmpdir_):
    folder, scenarios = BUNDLED[model]
    res = import_result(HF / folder)
    ref_graph = load_model_graph(REG / "models" / f"{model}.yaml")
    assert res.doc["name"] == model
    diff = _graph_diff(res.doc, ref_graph)
    expected, revert = DIFFERENCES.get(model, ({}, None))
    assert diff == expected
    roots = None
    if revert:
        doc = copy.deepcopy(res.doc)
        revert(doc)
        assert _graph_diff(doc, ref_graph) == {}
        root = Path(tmpdir_) / f"reg-{model}" / "models"
        root.mkdir(parents=True)
        res_r = copy.copy(res)
        res_r.doc = doc
        (root / f"{model}.yaml").write_text(graph_yaml(res_r))
        roots = [root.parent, REG]
    for i, scen in enumerate(scenarios):
        ref, imp = _deploy(tmpdir_, scen, model, model if revert else HF / folder, roots)
        _same_sizes(ref, imp)
        if i == 0 or imp.plan != ref.plan:
            a, b = _prices(imp), _prices(ref)
            assert np.all(np.isfinite(a)) and np.all(b[:, -1] > 0)
            rel = _max_rel(a, b)
            PARITY[(model, scen)] = rel
            print(f"parity {model} on {scen}: max relative difference {rel:.2e}")
            assert rel <= 0.01, (model, scen, rel)
        else:
            # the same static plan and coefficient vector: every price of every batch is identical
            # (this saves a compile; the first scenario priced the grid through the same code)
            assert np.array_equal(np.asarray(imp.coefficients.values), np.asarray(ref.coefficients.values))
            assert imp.coefficients.names == ref.coefficients.names


@pytest.mark.parametrize("model,bound", [("glm-5", 0.02), ("minimax-m2.5", 0.05), ("kimi-k2.5", 0.60)])
def test_where_the_config_keeps_modules_unquantized_the_import_prices_them_so(model, bound, tmpdir_):
    """The unreverted import: the modules the checkpoint leaves unquantized (lm_head; Kimi's
    attention, dense MLPs and shared experts) read more bytes than the bundled graph charges.
    Served as the checkpoint states (the bundled kimi scenarios serve an NVFP4 checkpoint)."""
    folder, scenarios = BUNDLED[model]
    engine = {"quantization": "compressed-tensors"} if model == "kimi-k2.5" else {}
    ref, imp = _deploy(tmpdir_, scenarios[0], model, HF / folder, **engine)
    assert imp.plan.memory["weights_bytes"] > ref.plan.memory["weights_bytes"]
    assert imp.plan.memory["kv_bytes_per_token"] == ref.plan.memory["kv_bytes_per_token"]
    a, b = _prices(imp), _prices(ref)
    hbm = 1
    assert np.all(a[:, hbm] >= b[:, hbm] * (1 - 1e-12))
    rel = _max_rel(a[:, hbm], b[:, hbm])
    print(f"{model}: unreverted import, HBM time up to {rel:.1%} above the bundled graph")
    assert 0.001 < rel < bound


# ----------------------------------------------------------------------------- further models

EXTRAS = {   # config folder -> a scenario it fits (its model replaced)
    "meta-llama--Meta-Llama-3.1-8B": "llama-3.1-70b-instruct-h200-fp8-vllm-tp1",
    "meta-llama--Meta-Llama-3.1-405B": "llama-3.1-70b-instruct-b200-fp8-vllm-tp8",
    "nvidia--Llama-3.1-70B-Instruct-FP8": "llama-3.1-70b-instruct-h200-fp8-vllm-tp2",
    "Qwen--Qwen3-8B": "llama-3.1-70b-instruct-h200-fp8-vllm-tp1",
    "Qwen--Qwen3-32B-FP8-Static-PerTensor": "llama-3.1-70b-instruct-h200-fp8-vllm-tp1",
    "Qwen--Qwen3-30B-A3B": "minimax-m2.5-h200-fp8-vllm-tp4",
    "Qwen--Qwen3-235B-A22B-FP8": "minimax-m2.5-h200-fp8-vllm-tp8",
    "mistralai--Mixtral-8x22B-v0.1": "llama-3.1-70b-instruct-h200-fp8-vllm-tp8",
    "moonshotai--Kimi-K2-Instruct": "deepseek-v3-b200-fp8-sglang-tp8",
    "deepseek-ai--DeepSeek-R1": "deepseek-v3-h200-fp8-sglang-tp8",
    "deepseek-ai--DeepSeek-V3.2": "glm-5-h200-fp8-sglang-tp8",
    "nvidia--DeepSeek-V3.2-NVFP4": "glm-5-b200-fp4-sglang-tp4",
    "deepseek-ai--DeepSeek-V4-Flash": "deepseek-v4-pro-b200-fp4-vllm-tp8",
    "openai--gpt-oss-20b": "gpt-oss-120b-h200-fp4-vllm-tp1",
    "zai-org--GLM-5.1": "glm-5-b200-fp8-sglang-tp8",
    "nvidia--GLM-5-NVFP4": "glm-5-b200-fp4-sglang-tp4",
    "MiniMaxAI--MiniMax-M2.7": "minimax-m2.5-h200-fp8-vllm-tp4",
    "Qwen--Qwen3.5-27B": "qwen3.5-397b-a17b-b300-bf16-sglang-tp4",
    "Qwen--Qwen3.5-35B-A3B": "qwen3.5-397b-a17b-b300-bf16-sglang-tp4",
    "nvidia--Qwen3.5-122B-A10B-NVFP4": "qwen3.5-397b-a17b-b200-fp4-sglang-tp2",
}


@pytest.mark.parametrize("folder", sorted(EXTRAS))
def test_further_models_load_resolve_where_they_fit_and_price_finitely(folder, tmpdir_):
    d = jp.load_deployment(_scenario(tmpdir_, EXTRAS[folder], HF / folder))
    assert d.graph.path.endswith("config.json") and d.graph.name
    mem = d.plan.memory
    assert 0 < mem["weights_bytes"] < d.chip.memory_gib * 2**30
    assert mem["kv_capacity_tokens"] > 0
    r = jp.price_many(d.plan, d.coefficients, jp.Batch.stack(
        [jp.Batch.decode(n, c, pad_to=64, decode_threshold=d.resolution["decode_threshold"])
         for n in (1, 64) for c in (1024, 32768)]))
    assert np.all(np.isfinite(np.asarray(r.resources))) and np.all(np.asarray(r.overlap) > 0)
    # a longer context never prices a decode step cheaper
    ov = np.asarray(r.no_overlap)
    assert ov[1] >= ov[0] and ov[3] >= ov[2]


def test_the_suite_covers_every_architecture_family_the_issue_lists():
    archs = {import_result(HF / f).architecture for f in list(EXTRAS) + [v[0] for v in BUNDLED.values()]}
    for a in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM",
              "DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "DeepseekV32ForCausalLM",
              "DeepseekV4ForCausalLM", "GptOssForCausalLM", "GlmMoeDsaForCausalLM", "MiniMaxM2ForCausalLM",
              "MiniMaxM3ForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration"):
        assert a in archs
    assert len(EXTRAS) >= 10


# ----------------------------------------------------------------------------- what the importer reads

def _nodes(doc, role):
    return [n for nodes in doc["layer_kinds"].values() for n in nodes if n.get("role") == role] + \
        [n for n in doc["head"] if n.get("role") == role]


@pytest.mark.parametrize("folder", ["MiniMaxAI--MiniMax-M2.5", "MiniMaxAI--MiniMax-M2.7", "MiniMaxAI--MiniMax-M3"])
def test_minimax_m2_normalises_q_and_k_over_the_tensor_parallel_group(folder):
    # vLLM's MiniMax-M2 (MiniMaxText01RMSNormTP.forward_qk) all-reduces each token's q and k
    # variances, 2 x fp32, in every layer; MiniMax-M3 normalises per head, locally
    d = import_result(HF / folder)
    qk = _nodes(d.doc, "qk_norm")
    if "M3" in folder:
        assert qk == []
        return
    assert qk == [{"op": "AllReduce", "role": "qk_norm", "emit": "tensor_parallel", "bytes_per_token": 8}]
    roles = [n.get("role") for n in d.doc["layer_kinds"]["attn_moe"]]
    assert roles.index("qk_norm") == roles.index("qkv_proj") + 1
    assert any("one all-reduce of 8 bytes per token" in x for x in d.inferred)


@pytest.mark.parametrize("folder,dims", [("moonshotai--Kimi-K2.5", (128, 128)), ("deepseek-ai--DeepSeek-V3", (128, 128)),
                                         ("zai-org--GLM-5-FP8", None)])
def test_mla_attention_carries_its_prefill_head_dimensions(folder, dims):
    # MLA prefill runs uncompressed (qk_nope + qk_rope, v); a sparse MLA layer (GLM-5's DSA)
    # stays latent and states none
    d = import_result(HF / folder)
    attn = [n for nodes in d.doc["layer_kinds"].values() for n in nodes
            if n.get("op") == "Attention" and not n.get("role")]
    assert attn and all((n.get("qk_nope_head_dim"), n.get("v_head_dim")) == (dims or (None, None)) for n in attn)


def test_quantization_formats_and_modules_left_at_their_own_format():
    # FP8 block-wise (DeepSeek-V3): everything fp8
    d = import_result(HF / "deepseek-ai--DeepSeek-V3")
    assert d.doc["weight_dtype"] == "fp8" and not _nodes(d.doc, "lm_head")[0].get("weight_dtype")
    assert any("FP8 block-wise [128, 128]" in x for x in d.inferred)
    # FP8 per tensor from hf_quant_config.json (ModelOpt), lm_head excluded
    d = import_result(HF / "Qwen--Qwen3-32B-FP8-Static-PerTensor")
    assert d.doc["weight_dtype"] == "fp8" and _nodes(d.doc, "lm_head")[0]["weight_dtype"] == "bf16"
    assert d.quant_path.endswith("hf_quant_config.json")
    # NVFP4 (ModelOpt) with the attention left at bf16: experts and dense MLP nvfp4
    d = import_result(HF / "nvidia--GLM-5-NVFP4")
    assert d.doc["weight_dtype"] == "bf16"
    assert {n.get("weight_dtype") for n in _nodes(d.doc, "experts")} == {"nvfp4"}
    assert {n.get("weight_dtype") for n in _nodes(d.doc, "mlp_gate_up")} == {"nvfp4"}
    assert {n.get("weight_dtype") for n in _nodes(d.doc, "o_proj")} == {None}
    # MXFP4 experts only (gpt-oss modules_to_not_convert: self_attn, router, embeddings, lm_head)
    d = import_result(HF / "openai--gpt-oss-120b")
    assert d.doc["weight_dtype"] == "bf16" and {n.get("weight_dtype") for n in _nodes(d.doc, "experts")} == {"mxfp4"}
    # compressed-tensors int4 weight-only, with re:.*self_attn.* and shared experts ignored
    d = import_result(HF / "moonshotai--Kimi-K2.5")
    assert d.doc["weight_dtype"] == "bf16" and _nodes(d.doc, "experts")[0]["weight_dtype"] == "int4"
    assert _nodes(d.doc, "shared_expert_gate_up")[0].get("weight_dtype") is None
    # an explicit --quant-config wins over the config's own block
    d = import_result(HF / "meta-llama--Meta-Llama-3.1-8B", HF / "nvidia--Llama-3.1-70B-Instruct-FP8" / "hf_quant_config.json")
    assert d.doc["weight_dtype"] == "fp8"


def _write(tmp, name, cfg):
    p = Path(tmp) / name
    p.mkdir(parents=True, exist_ok=True)
    (p / "config.json").write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg)
    return p / "config.json"


LLAMA = json.loads((HF / "meta-llama--Llama-3.1-8B-Instruct" / "config.json").read_text())


def test_mistral_and_qwen2_take_their_transformers_defaults(tmp_path):
    cfg = dict(LLAMA, architectures=["MistralForCausalLM"])
    d = import_result(_write(tmp_path, "mistral", cfg))
    attn = [n for n in d.doc["layer_kinds"]["swa_dense"] if n["op"] == "Attention"][0]
    assert attn["kind"] == "swa" and attn["window"] == 4096          # MistralConfig sliding_window=4096
    assert any("sliding_window absent: 4096" in x for x in d.inferred)
    cfg = dict(LLAMA, architectures=["MistralForCausalLM"], sliding_window=None)
    assert list(import_result(_write(tmp_path, "mistral-none", cfg)).doc["layer_kinds"]) == ["dense"]
    cfg = dict(LLAMA, architectures=["Qwen2ForCausalLM"], sliding_window=4096)  # use_sliding_window False
    assert list(import_result(_write(tmp_path, "qwen2", cfg)).doc["layer_kinds"]) == ["dense"]
    cfg = dict(cfg, use_sliding_window=True, max_window_layers=28)
    d = import_result(_write(tmp_path, "qwen2-swa", cfg))
    assert graph_from_doc(d.doc, "x").expanded_stack() == ["dense"] * 28 + ["swa_dense"] * 4
    cfg = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}
    attn = [n for n in import_result(_write(tmp_path, "mha", cfg)).doc["layer_kinds"]["dense"] if n["op"] == "Attention"][0]
    assert attn["n_kv"] == attn["n_q"] == 32


def test_a_multimodal_config_prices_its_text_model_and_says_so():
    d = import_result(HF / "Qwen--Qwen3.5-397B-A17B")
    assert d.doc["modality"] == "text_decoder_of_multimodal"
    assert any(x.startswith("multimodal (vision_config): the text decoder is priced") for x in d.inferred)


def test_import_model_writes_a_graph_that_loads_back(tmp_path, capsys):
    from jaxprice.cli import main
    out = tmp_path / "g.yaml"
    assert main(["import-model", str(HF / "zai-org--GLM-5-FP8" / "config.json"), "--out", str(out)]) == 0
    text = out.read_text()
    sha = hashlib.sha256((HF / "zai-org--GLM-5-FP8" / "config.json").read_bytes()).hexdigest()
    assert f'config_sha256: "{sha}"' in text and 'hf_repo: "zai-org/GLM-5-FP8"' in text
    assert "# inferred: index_wk_weights_proj kept at the base width" in text
    g, h = load_model_graph(out), jp.import_hf_config(HF / "zai-org--GLM-5-FP8")
    for f in ("name", "hidden_size", "vocab_size", "weight_dtype", "modality", "layer_kinds", "stack", "head",
              "speculator"):
        assert getattr(g, f) == getattr(h, f), f
    assert load_model_graph(HF / "zai-org--GLM-5-FP8").layer_kinds == h.layer_kinds   # a folder, as a graph
    assert main(["import-model", str(HF / "openai--gpt-oss-20b")]) == 0              # stdout
    by_path = capsys.readouterr().out
    assert by_path.startswith("# Imported by `jaxprice import-model`")
    assert main(["import-model", "openai/gpt-oss-20b"]) == 0                          # a bundled one by name
    by_name = capsys.readouterr().out
    assert by_name.split("\n", 1)[1] == by_path.split("\n", 1)[1]     # the same graph (the paths differ)


def test_a_scenario_names_a_config_relative_to_itself(tmp_path):
    _write(tmp_path, "m", LLAMA)
    docs = list(yaml.safe_load_all(scenario_path("llama-3.1-70b-instruct-h200-fp8-vllm-tp1").read_text()))
    docs[0]["model"] = "m/config.json"
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    d = jp.load_deployment(p)
    assert d.graph.path == str(tmp_path / "m" / "config.json") and d.graph.name == "m"


# ----------------------------------------------------------------------------- refusals

def _refused(path, field, value, reason):
    with pytest.raises(JaxpriceError) as info:
        import_result(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path))
    if field:
        assert f"field '{field}'" in msg
    if value is not None:
        assert f"value {value!r}" in msg
    assert re.search(reason, msg), msg
    return msg


@pytest.mark.parametrize("change,field,value,reason", [
    (lambda c: c.update(num_attention_heads=0), "num_attention_heads", 0, "impossible value: must be at least 1"),
    (lambda c: c.update(hidden_size=-4096), "hidden_size", -4096, "a size cannot be negative"),
    (lambda c: c.update(hidden_size=4097), "hidden_size", 4097, "not divisible by num_attention_heads 32"),
    (lambda c: c.update(num_key_value_heads=5), "num_key_value_heads", 5, "not a multiple"),
    (lambda c: c.update(intermediate_size="14336"), "intermediate_size", "14336", "expected an integer"),
    (lambda c: c.update(tie_word_embeddings="no"), "tie_word_embeddings", "no", "expected true or false"),
    (lambda c: c.pop("num_hidden_layers"), "num_hidden_layers", None, "required key is missing"),
    (lambda c: c.pop("vocab_size"), "vocab_size", None, "required key is missing"),
    (lambda c: c.update(architectures=["BertModel"]), "architectures", "BertModel",
     "unsupported architecture \\(supported: LlamaForCausalLM, MistralForCausalLM"),
    (lambda c: c.update(torch_dtype="float64"), "torch_dtype", "float64", "unknown dtype"),
    (lambda c: c.update(quantization_config={"quant_method": "bitsandbytes"}), "quantization_config.quant_method",
     "bitsandbytes", "unsupported quantization \\(supported quant_method: fp8"),
    (lambda c: c.update(quantization_config={"quant_method": "fp8", "weight_block_size": [0, 128]}),
     "quantization_config.weight_block_size", [0, 128], "two positive integers"),     # was "FP8 block-wise [0, 128]"
])
def test_a_bad_config_is_refused_naming_file_key_and_value(tmp_path, change, field, value, reason):
    cfg = copy.deepcopy(LLAMA)
    change(cfg)
    _refused(_write(tmp_path, "bad", cfg), field, value, reason)


def test_moe_and_hybrid_configs_are_checked_too(tmp_path):
    moe = json.loads((HF / "mistralai--Mixtral-8x7B-v0.1" / "config.json").read_text())
    _refused(_write(tmp_path, "a", dict(moe, num_experts_per_tok=9)), "num_experts_per_tok", 9, "more experts per token")
    q = json.loads((HF / "Qwen--Qwen3.5-397B-A17B" / "config.json").read_text())
    q["text_config"]["layer_types"] = q["text_config"]["layer_types"][:-1]
    _refused(_write(tmp_path, "b", q), "text_config.layer_types", 59, "59 entries for 60 layers")
    q = json.loads((HF / "Qwen--Qwen3.5-397B-A17B" / "config.json").read_text())
    q["text_config"]["linear_num_value_heads"] = 0
    _refused(_write(tmp_path, "c", q), "text_config.linear_num_value_heads", 0, "at least 1")


def test_not_json_and_the_cli_error_is_one_line(tmp_path, capsys):
    p = _write(tmp_path, "nj", "{ not json")
    _refused(p, None, None, "not JSON")
    from jaxprice.cli import main
    assert main(["import-model", str(p), "--out", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not JSON" in err and "Traceback" not in err
    assert not (tmp_path / "o.yaml").exists()
    assert main(["import-model", str(tmp_path)]) == 2                      # a folder with no config.json
    assert "holds no config.json" in capsys.readouterr().err


def test_every_supported_architecture_has_a_family_row():
    from jaxprice._src.hf import FAMILIES, MAPPINGS
    for arch, (fam, _) in ARCHITECTURES.items():
        assert fam in FAMILIES and fam in MAPPINGS, arch


# ----------------------------------------------------------------------------- provenance

def test_sources_lists_every_shipped_file_with_its_sha256():
    text = (HF / "SOURCES.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|", text, flags=re.M))
    files = sorted(str(p.relative_to(HF)) for p in HF.glob("*/*.json"))
    assert sorted(rows) == files
    for f in files:
        assert hashlib.sha256((HF / f).read_bytes()).hexdigest() == rows[f], f
    for model, (folder, _) in BUNDLED.items():
        sha = re.search(r'config_sha256: "([0-9a-f]{64})"', (REG / "models" / f"{model}.yaml").read_text()).group(1)
        matches = hashlib.sha256((HF / folder / "config.json").read_bytes()).hexdigest() == sha
        assert matches == (model not in ("deepseek-v4-pro", "kimi-k2.5", "minimax-m2.5", "minimax-m3")), model
