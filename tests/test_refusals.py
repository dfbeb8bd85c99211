"""Every bad input is refused before jit, with a message naming the file, the field and the value.

Each test writes one small bad file into tmp_path (usually a bundled scenario with one field
edited, or a graph / chip / coefficient set in a tmp registry root that shadows the bundled
one: ``Registry([tmp_root, bundled_root])``, earlier roots win), and asserts:

* the exception is a JaxpriceError whose text is exactly "FILE, field 'F', value V: reason";
* the error's ``file``/``field``/``value`` attributes say the same;
* nothing was touched: every file under tmp_path is byte-for-byte as before, and none was added.

References: reference-kernel.md section 8 (refusals), sections 1.2-1.5 (fields), 7.2 (snapping).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from jaxprice import Batch, JaxpriceError, Registry, load_deployment
from jaxprice._src.formats import default_registry_root
from jaxprice._src.resolve import _snap, scenario_path

BUNDLED = default_registry_root()
DSV3 = "deepseek-v3-h200-fp8-sglang-tp8"
LLAMA = "llama-3.1-70b-instruct-h200-fp8-vllm-tp8"
GLM5 = "glm-5-h200-fp8-sglang-tp8"
POOL = "Deployment.pools[0]."
ENGINE = POOL + "engine."
_UNSET = object()


# ----------------------------------------------------------------------------- helpers


def snapshot(root: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


def refused(call, *, file, reason, field=None, value=_UNSET, untouched=None):
    """Run `call`, assert a JaxpriceError reading "FILE, field 'F', value V: ...reason...",
    and that nothing under `untouched` changed. `reason` is a regular expression."""
    before = snapshot(untouched) if untouched is not None else None
    prefix = re.escape(str(file))
    if field is not None:
        prefix += re.escape(f", field '{field}'")
    if value is not _UNSET:
        prefix += re.escape(f", value {value!r}")
    with pytest.raises(JaxpriceError, match="^" + prefix + ": .*" + reason) as info:
        call()
    err = info.value
    assert err.file == str(file)
    if field is not None:
        assert err.field == field
    if value is not _UNSET:
        assert err.value == value or (isinstance(value, float) and math.isnan(value))
    if untouched is not None:
        assert snapshot(untouched) == before, "a refusal changed or added files"
    return err


def scenario_docs(name):
    return list(yaml.safe_load_all(scenario_path(name).read_text()))


def write_scenario(tmp_path, name, edit=None, filename=None) -> Path:
    """A copy of a bundled scenario in tmp_path, with `edit(scenario_doc, deployment_doc)` applied."""
    scen, dep = scenario_docs(name)
    if edit is not None:
        edit(scen, dep)
    path = tmp_path / (filename or f"{name}.yaml")
    path.write_text(yaml.safe_dump_all([scen, dep], sort_keys=False))
    return path


def engine(dep):
    return dep["pools"][0]["engine"]


def parallel(dep):
    return dep["pools"][0]["parallel"]


def bundled_model_doc(name):
    return yaml.safe_load((BUNDLED / "models" / f"{name}.yaml").read_text())


def write_yaml(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def tmp_registry(tmp_path) -> tuple[Path, Registry]:
    root = tmp_path / "reg"
    root.mkdir(exist_ok=True)
    return root, Registry([root, BUNDLED])


def resolve_with(path, reg, **kw):
    return lambda: load_deployment(path, registry=reg, **kw)


def entry(name, value, units, **scope):
    return {"name": name, "value": value, "units": units, "scope": {k: list(v) for k, v in scope.items()}}


def coefficient_set(path, name, entries):
    return write_yaml(path, {"format": "jaxprice-coefficients/1", "name": name, "entries": entries})


PUBLIC_CHIP = {"Provenance": "test", "TFlopsPeak": 989.5, "TFlopsFP8": 1979.0, "BwPeakTBs": 4.8,
               "MemoryGiB": 141.0, "IntraNodeBwGBps": 450, "SMCount": 132}


def public_chip(root, name, **changes):
    doc = {"_comment": "synthetic test chip", **PUBLIC_CHIP, **changes}
    doc = {k: v for k, v in doc.items() if v is not None}
    return write_yaml(root / "hardware" / f"{name}.yaml", doc)


# ----------------------------------------------------------------------------- documents


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("kind: Scenario\nname: broken\nmodel: deepseek-v3\n"
                    "cluster:\n  hardware: h200: oops\n---\nkind: Deployment\npools: []\n")
    refused(lambda: load_deployment(path), file=path, reason=r"malformed YAML at line 5, column \d+",
            untouched=tmp_path)


def test_malformed_yaml_in_a_graph_names_the_graph_file(tmp_path):
    root, reg = tmp_registry(tmp_path)
    graph = root / "models" / "deepseek-v3.yaml"
    graph.parent.mkdir(parents=True)
    graph.write_text("format: jaxprice-model/1\nname: deepseek-v3\nlayer_kinds: {a: [\n")
    path = write_scenario(tmp_path, DSV3)
    refused(resolve_with(path, reg), file=graph, reason="malformed YAML at line", untouched=tmp_path)


def test_missing_scenario_file(tmp_path):
    path = tmp_path / "nope.yaml"
    refused(lambda: load_deployment(path), file=path, reason="no such scenario file", untouched=tmp_path)


@pytest.mark.parametrize("count", [1, 3])
def test_document_count_other_than_two(tmp_path, count):
    docs = scenario_docs(DSV3)
    docs = docs[:1] if count == 1 else docs + [{"kind": "Deployment", "pools": []}]
    path = tmp_path / "docs.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    refused(lambda: load_deployment(path), file=path,
            reason=f"expected two documents \\(Scenario, then Deployment\\), found {count}",
            untouched=tmp_path)


def test_first_document_must_be_a_scenario(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: s.update(kind="Scenarios"))
    refused(lambda: load_deployment(path), file=path, field="kind", value="Scenarios",
            reason="the first document must be kind: Scenario", untouched=tmp_path)


def test_second_document_must_be_a_deployment(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: d.update(kind="Deploy"))
    refused(lambda: load_deployment(path), file=path, field="kind", value="Deploy",
            reason="the second document must be kind: Deployment", untouched=tmp_path)


def test_documents_in_the_wrong_order(tmp_path):
    scen, dep = scenario_docs(DSV3)
    path = tmp_path / "swapped.yaml"
    path.write_text(yaml.safe_dump_all([dep, scen]))
    refused(lambda: load_deployment(path), file=path, field="kind", value="Deployment",
            reason="the first document must be kind: Scenario", untouched=tmp_path)


@pytest.mark.parametrize("index", [1, -1])
def test_pool_index_out_of_range(tmp_path, index):
    path = write_scenario(tmp_path, DSV3)
    refused(lambda: load_deployment(path, pool_index=index), file=path, field="Deployment.pools",
            value=index, reason=r"pool index out of range \(the deployment has 1\)", untouched=tmp_path)


# ----------------------------------------------------------------------------- unknown keys


def test_unknown_key_in_scenario(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: s.update(replicas=2))
    refused(lambda: load_deployment(path), file=path, field="Scenario.replicas", value=2,
            reason="unknown key", untouched=tmp_path)


def test_unknown_key_in_cluster(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: s["cluster"].update(gpus=8))
    refused(lambda: load_deployment(path), file=path, field="Scenario.cluster.gpus", value=8,
            reason="unknown key", untouched=tmp_path)


def test_unknown_key_in_deployment(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: d.update(autoscale=True))
    refused(lambda: load_deployment(path), file=path, field="Deployment.autoscale", value=True,
            reason="unknown key", untouched=tmp_path)


def test_unknown_key_in_engine(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: engine(d).update(max_num_seq=256))
    refused(lambda: load_deployment(path), file=path, field=ENGINE + "max_num_seq", value=256,
            reason=r"unknown key \(allowed: .*max_num_seqs", untouched=tmp_path)


def test_unknown_key_in_parallel(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: parallel(d).update(ep=8))
    refused(lambda: load_deployment(path), file=path, field=POOL + "parallel.ep", value=8,
            reason="unknown key", untouched=tmp_path)


def test_unknown_key_in_speculative(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: engine(d).update(
        speculative={"method": "deepseek_mtp", "num_spec_tokens": 1, "draft_tp": 1}))
    refused(lambda: load_deployment(path), file=path, field=ENGINE + "speculative.draft_tp", value=1,
            reason="unknown key", untouched=tmp_path)


def test_unknown_key_in_a_graph_node(tmp_path):
    root, reg = tmp_registry(tmp_path)
    doc = bundled_model_doc("deepseek-v3")
    doc["layer_kinds"]["attn_dense"][1]["bias"] = True
    graph = write_yaml(root / "models" / "deepseek-v3.yaml", doc)
    path = write_scenario(tmp_path, DSV3)
    refused(resolve_with(path, reg), file=graph, field="layer_kinds.attn_dense.nodes[1].bias",
            value=True, reason="unknown key", untouched=tmp_path)


def test_unknown_key_in_a_public_graph_node(tmp_path):
    root, reg = tmp_registry(tmp_path)
    graph = write_yaml(root / "models" / "tiny" / "graph.yaml", {
        "kind": "ModelGraph", "name": "tiny",
        "global": {"hidden_size": 64, "vocab_size": 100, "weight_dtype": "bf16"},
        "layer_kinds": [{"id": "dense", "nodes": [{"op": "GEMM", "n": 128, "k": 64, "bias": 1}]}],
        "stack": {"pattern": ["dense"], "repeat": 2}})
    refused(lambda: reg.model("tiny"), file=graph, field="layer_kinds.dense.nodes[0].bias", value=1,
            reason="unknown key", untouched=tmp_path)


def test_unknown_key_in_a_project_chip(tmp_path):
    root, reg = tmp_registry(tmp_path)
    chips = yaml.safe_load((BUNDLED / "chips.yaml").read_text())
    chips["chips"] = {"h200": dict(chips["chips"]["h200"], tdp_watts=700)}
    chips["networks"] = {}
    chip_file = write_yaml(root / "chips.yaml", chips)
    path = write_scenario(tmp_path, DSV3)
    refused(resolve_with(path, reg), file=chip_file, field="chips.h200.tdp_watts", value=700,
            reason="unknown key", untouched=tmp_path)


def test_unknown_key_in_a_public_chip(tmp_path):
    root, reg = tmp_registry(tmp_path)
    chip_file = public_chip(root, "h200", TDPWatts=700)
    path = write_scenario(tmp_path, DSV3)
    refused(resolve_with(path, reg), file=chip_file, field="TDPWatts", value=700,
            reason="unknown key", untouched=tmp_path)


def test_unknown_key_in_a_project_coefficient_entry(tmp_path):
    root, reg = tmp_registry(tmp_path)
    bad = entry("hbm_derate", 0.9, "dimensionless", hardware=["h200"])
    bad["confidence"] = "high"
    cset = coefficient_set(root / "coefficients" / "extra.yaml", "extra", [bad])
    path = write_scenario(tmp_path, DSV3, lambda s, d: s["coefficients"].append("extra"))
    refused(resolve_with(path, reg), file=cset, field="entries[0].confidence", value="high",
            reason="unknown key", untouched=tmp_path)


def test_unknown_key_in_a_public_coefficient_entry(tmp_path):
    root, reg = tmp_registry(tmp_path)
    cset = write_yaml(root / "coefficients" / "extra.yaml", {
        "kind": "CoefficientSet", "name": "extra", "coefficients": [
            {"hbm_derate": {"value": 0.9, "units": "dimensionless", "scope": {"hardware": ["h200"]},
                            "confidence": "high"}}]})
    path = write_scenario(tmp_path, DSV3, lambda s, d: s["coefficients"].append("extra"))
    refused(resolve_with(path, reg), file=cset, field="coefficients[0].hbm_derate.confidence",
            value="high", reason="unknown key", untouched=tmp_path)


def test_unknown_scope_dimension(tmp_path):
    root, reg = tmp_registry(tmp_path)
    cset = coefficient_set(root / "coefficients" / "extra.yaml", "extra",
                           [entry("hbm_derate", 0.9, "dimensionless", hardware=["h200"], dp=[1])])
    path = write_scenario(tmp_path, DSV3, lambda s, d: s["coefficients"].append("extra"))
    refused(resolve_with(path, reg), file=cset, field="entries[0].scope.dp", value=[1],
            reason="unknown scope dimension", untouched=tmp_path)


# ----------------------------------------------------------------------------- unknown names


def test_unknown_model(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: s.update(model="deepseek-v9"))
    refused(lambda: load_deployment(path), file=path, field="Scenario.model", value="deepseek-v9",
            reason="unknown model", untouched=tmp_path)


def test_unknown_chip(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: s["cluster"].update(hardware="h300"))
    refused(lambda: load_deployment(path), file=path, field="Scenario.cluster.hardware", value="h300",
            reason="unknown chip", untouched=tmp_path)


def test_unknown_fabric(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: s["cluster"].update(fabric="ib-9000g"))
    refused(lambda: load_deployment(path), file=path, field="Scenario.cluster.fabric",
            value="ib-9000g", reason="unknown fabric", untouched=tmp_path)


def test_unknown_coefficient_set(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: s["coefficients"].append("cost-model-typo"))
    refused(lambda: load_deployment(path), file=path, field="Scenario.coefficients",
            value="cost-model-typo", reason="unknown coefficient set", untouched=tmp_path)


def test_unknown_quantization(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: engine(d).update(quantization="fp6"))
    refused(lambda: load_deployment(path), file=path, field=ENGINE + "quantization", value="fp6",
            reason="unknown quantization", untouched=tmp_path)


def test_unknown_cudagraph_mode(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: engine(d).update(cudagraph_mode="SOMETIMES"))
    refused(lambda: load_deployment(path), file=path, field=ENGINE + "cudagraph_mode",
            value="SOMETIMES", reason="unknown cudagraph mode", untouched=tmp_path)


def test_unknown_dcp_comm_backend(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: engine(d).update(dcp_comm_backend="nccl"))
    refused(lambda: load_deployment(path), file=path, field=ENGINE + "dcp_comm_backend", value="nccl",
            reason="unknown dcp_comm_backend", untouched=tmp_path)


def test_non_integer_engine_field(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: engine(d).update(block_size="sixteen"))
    refused(lambda: load_deployment(path), file=path, field=ENGINE + "block_size", value="sixteen",
            reason="expected a number", untouched=tmp_path)


# ----------------------------------------------------------------------------- widths


def test_pipeline_parallelism_is_not_priced(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: parallel(d).update(pp=2))
    refused(lambda: load_deployment(path), file=path, field=POOL + "parallel.pp", value=2,
            reason="pipeline parallelism is not priced", untouched=tmp_path)


@pytest.mark.parametrize("key", ["pcp", "dcp"])
def test_context_parallelism_is_not_priced(tmp_path, key):
    path = write_scenario(tmp_path, DSV3, lambda s, d: parallel(d).update({key: 2}))
    refused(lambda: load_deployment(path), file=path, field=POOL + f"parallel.{key}", value=2,
            reason=r"context parallelism \(pcp/dcp > 1\) is not priced", untouched=tmp_path)


@pytest.mark.parametrize("key", ["tp", "dp"])
def test_width_below_one(tmp_path, key):
    path = write_scenario(tmp_path, DSV3, lambda s, d: parallel(d).update({key: 0}))
    refused(lambda: load_deployment(path), file=path, field=POOL + f"parallel.{key}", value=0,
            reason="must be >= 1", untouched=tmp_path)


def test_expert_parallel_width_above_the_expert_count(tmp_path):
    # mixtral has 8 experts; EP over tp 8 x dp 2 = 16 ranks (two 8-GPU nodes) leaves a rank none
    def edit(s, d):
        s["model"] = "mixtral-8x7b-v0.1"
        s["cluster"].update(nodes=2, gpus_per_node=8)
        d["pools"][0]["nodes"] = 2
        parallel(d).update(tp=8, dp=2, enable_expert_parallel=True)
    path = write_scenario(tmp_path, LLAMA, edit)
    refused(lambda: load_deployment(path), file=path, field=POOL + "parallel", value="tp*dp = 16",
            reason="the expert-parallel width 16 exceeds the expert count 8", untouched=tmp_path)


def test_expert_parallel_width_equal_to_the_expert_count_resolves(tmp_path):
    def edit(s, d):
        s["model"] = "mixtral-8x7b-v0.1"
        parallel(d).update(tp=4, dp=2, enable_expert_parallel=True)
    dep = load_deployment(write_scenario(tmp_path, LLAMA, edit))
    assert dep.resolution["ep"] == 8
    assert dep.plan.scalars["experts_per_rank"] == 1.0


# ----------------------------------------------------------------------------- graph


def _graph_refusal(tmp_path, edit, *, field, value, reason):
    root, reg = tmp_registry(tmp_path)
    doc = bundled_model_doc("deepseek-v3")
    edit(doc)
    graph = write_yaml(root / "models" / "deepseek-v3.yaml", doc)
    path = write_scenario(tmp_path, DSV3)
    refused(resolve_with(path, reg), file=graph, field=field, value=value, reason=reason,
            untouched=tmp_path)


def test_unknown_emit_condition(tmp_path):
    def edit(doc):
        assert doc["layer_kinds"]["attn_dense"][8]["emit"] == "tensor_parallel"
        doc["layer_kinds"]["attn_dense"][8]["emit"] = "tensor_paralel"
    _graph_refusal(tmp_path, edit, field="layer_kinds.attn_dense.nodes[8].emit",
                   value="tensor_paralel", reason="unrecognised emit condition")


def test_stack_names_an_undeclared_kind(tmp_path):
    def edit(doc):
        doc["stack"]["pattern"] = ["attn_moe2"]
    _graph_refusal(tmp_path, edit, field="stack.pattern", value="attn_moe2",
                   reason="the stack names an undeclared layer kind")


def test_unknown_op(tmp_path):
    def edit(doc):
        doc["layer_kinds"]["attn_dense"][0]["op"] = "LayerNorm"
    _graph_refusal(tmp_path, edit, field="layer_kinds.attn_dense.nodes[0].op", value="LayerNorm",
                   reason="unknown op")


def test_unknown_attention_kind(tmp_path):
    def edit(doc):
        doc["layer_kinds"]["attn_dense"][6]["kind"] = "linear"
    _graph_refusal(tmp_path, edit, field="layer_kinds.attn_dense.nodes[6].kind", value="linear",
                   reason="unknown attention kind")


def test_top_k_above_experts(tmp_path):
    def edit(doc):
        node = doc["layer_kinds"]["attn_moe"][10]
        assert node["op"] == "GroupedGEMM"
        node["top_k"] = 300
    _graph_refusal(tmp_path, edit, field="layer_kinds.attn_moe.nodes[10].top_k", value=300,
                   reason="top_k exceeds experts")


def test_non_integer_node_dimension(tmp_path):
    def edit(doc):
        doc["layer_kinds"]["attn_dense"][1]["n"] = 2112.5
    _graph_refusal(tmp_path, edit, field="layer_kinds.attn_dense.nodes[1].n", value=2112.5,
                   reason="expected an integer")


def test_collective_without_an_emit_condition(tmp_path):
    def edit(doc):
        del doc["layer_kinds"]["attn_dense"][8]["emit"]
    root, reg = tmp_registry(tmp_path)
    doc = bundled_model_doc("deepseek-v3")
    edit(doc)
    graph = write_yaml(root / "models" / "deepseek-v3.yaml", doc)
    refused(lambda: reg.model("deepseek-v3"), file=graph, field="layer_kinds.attn_dense.nodes[8].emit",
            reason="a collective must carry an emit condition", untouched=tmp_path)


@pytest.mark.parametrize("change,field,value,reason", [
    ({"qk_nope_head_dim": 128}, "v_head_dim", None, "needs qk_nope_head_dim, v_head_dim and qk_rope_head_dim"),
    ({"kind": "gqa", "n_kv": 8, "qk_nope_head_dim": 128, "v_head_dim": 128}, "qk_nope_head_dim", 128,
     "an mla attention's prefill head dimensions"),
])
def test_mla_prefill_head_dimensions_stated_badly(tmp_path, change, field, value, reason):
    root, reg = tmp_registry(tmp_path)
    doc = bundled_model_doc("deepseek-v3")
    node = next(n for n in doc["layer_kinds"]["attn_dense"] if n["op"] == "Attention")
    for k in ("qk_nope_head_dim", "v_head_dim"):
        node.pop(k, None)
    node.update(change)
    where = doc["layer_kinds"]["attn_dense"].index(node)
    graph = write_yaml(root / "models" / "deepseek-v3.yaml", doc)
    shown = {} if value is None else {"value": value}          # a missing field shows no value
    refused(lambda: reg.model("deepseek-v3"), file=graph, field=f"layer_kinds.attn_dense.nodes[{where}].{field}",
            reason=reason, untouched=tmp_path, **shown)


def test_collective_carrying_no_bytes(tmp_path):
    root, reg = tmp_registry(tmp_path)
    doc = bundled_model_doc("deepseek-v3")
    doc["layer_kinds"]["attn_dense"][8]["bytes_per_token"] = 0
    graph = write_yaml(root / "models" / "deepseek-v3.yaml", doc)
    refused(lambda: reg.model("deepseek-v3"), file=graph, field="layer_kinds.attn_dense.nodes[8].bytes_per_token",
            value=0, reason="a collective.s bytes_per_token must be > 0", untouched=tmp_path)


# ----------------------------------------------------------------------------- cache dtypes


@pytest.mark.parametrize("scenario,cache,reason", [
    (DSV3, "fp8_inc", "fp8_inc caches are for Intel Gaudi only"),
    (DSV3, "fp8_ds_mla", r"a \*_ds_mla cache needs a sparse_mla model"),
    (LLAMA, "nvfp4_ds_mla", r"a \*_ds_mla cache needs a sparse_mla model"),
    (DSV3, "nvfp4", "a plain nvfp4 cache does not serve latent"),
    (DSV3, "nvfp4_4over6", "a plain nvfp4 cache does not serve latent"),
    (DSV3, "fp8_e3m4", "not a vLLM cache dtype"),
    (DSV3, "int8", "not a vLLM cache dtype"),
    (LLAMA, "turboquant_k8v4", "page is not sized"),
    (LLAMA, "fp8_per_token_head", "page is not sized"),
])
def test_cache_dtype_refusals(tmp_path, scenario, cache, reason):
    path = write_scenario(tmp_path, scenario, lambda s, d: engine(d).update(cache_dtype=cache))
    refused(lambda: load_deployment(path), file=path, field=ENGINE + "cache_dtype", value=cache,
            reason=reason, untouched=tmp_path)


def test_plain_nvfp4_cache_on_a_gqa_model_resolves(tmp_path):
    path = write_scenario(tmp_path, LLAMA, lambda s, d: engine(d).update(cache_dtype="nvfp4"))
    assert load_deployment(path).plan.memory["kv_bytes_per_token"] == 2 * 1 * 128 * 0.5625 * 80


def test_bad_mamba_cache_dtype(tmp_path):
    path = write_scenario(tmp_path, DSV3, lambda s, d: engine(d).update(mamba_cache_dtype="int4"))
    refused(lambda: load_deployment(path), file=path, field=ENGINE + "mamba_cache_dtype", value="int4",
            reason="not a mamba cache dtype", untouched=tmp_path)


# ----------------------------------------------------------------------------- DSA (sparse MLA)


def test_dsa_block_size_not_a_multiple_of_64(tmp_path):
    path = write_scenario(tmp_path, GLM5, lambda s, d: engine(d).update(block_size=16))
    refused(lambda: load_deployment(path), file=path, field=ENGINE + "block_size", value=16,
            reason="sparse MLA \\(DSA\\) needs a block size that is a multiple of 64", untouched=tmp_path)


@pytest.mark.parametrize("chip", ["a100-80", "l40s"])
def test_dsa_before_hopper(tmp_path, chip):
    path = write_scenario(tmp_path, GLM5, lambda s, d: s["cluster"].update(hardware=chip))
    refused(lambda: load_deployment(path), file=path, field="Scenario.cluster.hardware", value=chip,
            reason="sparse MLA \\(DSA\\) has no backend before Hopper", untouched=tmp_path)


# ----------------------------------------------------------------------------- coefficients


def test_missing_required_coefficient_hbm_derate(tmp_path):
    def edit(s, d):
        s["coefficients"] = [c for c in s["coefficients"] if c != "cost-model-primitives"]
    path = write_scenario(tmp_path, DSV3, edit)
    refused(lambda: load_deployment(path), file=path, field="Scenario.coefficients", value="hbm_derate",
            reason=r"required coefficient is missing \(achieved HBM bandwidth\)", untouched=tmp_path)


def test_missing_required_gemm_ramp(tmp_path):
    # a primitives set holding only hbm_derate: the fp8 GEMM ramp is required
    root, reg = tmp_registry(tmp_path)
    coefficient_set(root / "coefficients" / "cost-model-primitives.yaml", "cost-model-primitives",
                    [entry("hbm_derate", 0.9, "dimensionless", hardware=["h200"])])
    path = write_scenario(tmp_path, DSV3)
    refused(resolve_with(path, reg), file=path, field="Scenario.coefficients", value="gemm_eps_max_fp8",
            reason="required coefficient is missing", untouched=tmp_path)


def test_missing_collectives_set(tmp_path):
    def edit(s, d):
        s["coefficients"] = [c for c in s["coefficients"] if c != "cost-model-collectives"]
    path = write_scenario(tmp_path, DSV3, edit)
    refused(lambda: load_deployment(path), file=path, field="Scenario.coefficients",
            value="collective_*_all_reduce_fp16_*rank_h200",
            reason="no measured all_reduce collective", untouched=tmp_path)


@pytest.mark.parametrize("present", ["gemm_n_half_fp8", "gemm_k_half_fp8"])
def test_only_one_of_n_half_and_k_half(tmp_path, present):
    root, reg = tmp_registry(tmp_path)
    coefficient_set(root / "coefficients" / "shape.yaml", "shape",
                    [entry(present, 4096, "elements", hardware=["h200"])])
    path = write_scenario(tmp_path, DSV3, lambda s, d: s["coefficients"].append("shape"))
    refused(resolve_with(path, reg), file=path, field="Scenario.coefficients", value=present,
            reason="needs both gemm_n_half and gemm_k_half; only one is present", untouched=tmp_path)


def _collectives(chip, widths):
    out = []
    for op in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
        for n in widths:
            out += [entry(f"collective_floor_{op}_fp16_{n}rank_{chip}", 5.0 + n, "us_per_transfer",
                          hardware=[chip]),
                    entry(f"collective_peak_rate_{op}_fp16_{n}rank_{chip}", 1.5e5, "bytes_per_us",
                          hardware=[chip]),
                    entry(f"collective_transition_rate_{op}_fp16_{n}rank_{chip}", 1e5, "bytes_per_us",
                          hardware=[chip])]
    return out


def test_collective_width_gap(tmp_path):
    # a collectives set measuring only 2 and 16 ranks on h200: tp 8 falls in the gap
    root, reg = tmp_registry(tmp_path)
    coefficient_set(root / "coefficients" / "cost-model-collectives.yaml", "cost-model-collectives",
                    _collectives("h200", (2, 16)))
    path = write_scenario(tmp_path, DSV3)
    refused(resolve_with(path, reg), file=path, field="Scenario.coefficients",
            value="collective_floor_all_reduce_fp16_8rank_h200",
            reason=r"collective width gap: all_reduce over 8 ranks .*measured widths: \[2, 16\]",
            untouched=tmp_path)


def test_snap_unit():
    kw = dict(op="all_reduce", chip="h200", file="f.yaml")
    assert _snap(1, [2, 4, 8], **kw) == 2          # below the smallest: the smallest
    assert _snap(4, [2, 4, 8], **kw) == 4          # exact
    assert _snap(32, [2, 4, 8], **kw) == 8         # above 16: the largest
    with pytest.raises(JaxpriceError, match="collective width gap"):
        _snap(8, [2, 4], **kw)                     # gap
    with pytest.raises(JaxpriceError, match="collective width gap"):
        _snap(16, [2, 4, 8], **kw)                 # 16 is not above 16
    with pytest.raises(JaxpriceError, match="no measured all_reduce collective"):
        _snap(2, [], **kw)


def test_no_entry_applies_to_the_scope(tmp_path):
    root, reg = tmp_registry(tmp_path)
    coefficient_set(root / "coefficients" / "only-b200.yaml", "only-b200",
                    [entry("hbm_derate", 0.9, "dimensionless", hardware=["b200"]),
                     entry("gemm_eps_max_fp8", 0.8, "dimensionless", hardware=["h200"], tp=[4])])
    path = write_scenario(tmp_path, DSV3, lambda s, d: s.update(coefficients=["only-b200"]))
    refused(resolve_with(path, reg), file=path, field="Scenario.coefficients", value=["only-b200"],
            reason="no entry in any coefficient set applies to this deployment's scope "
                   r"\(hardware=h200, model=deepseek-v3, tp=8, ep=1, nodes_spanned=1, engine=vllm\)",
            untouched=tmp_path)


def test_coefficient_without_units(tmp_path):
    root, reg = tmp_registry(tmp_path)
    cset = coefficient_set(root / "coefficients" / "extra.yaml", "extra",
                           [{"name": "hbm_derate", "value": 0.9, "units": 3,
                             "scope": {"hardware": ["h200"]}}])
    path = write_scenario(tmp_path, DSV3, lambda s, d: s["coefficients"].append("extra"))
    refused(resolve_with(path, reg), file=cset, field="entries[0].units", value=3,
            reason="every coefficient states its units", untouched=tmp_path)



def test_coefficient_with_unknown_units(tmp_path):
    # plain "ms" would otherwise be taken as SI seconds and be off by 1e3
    root, reg = tmp_registry(tmp_path)
    cset = coefficient_set(root / "coefficients" / "extra.yaml", "extra",
                           [{"name": "attention_decode_floor", "value": 0.02, "units": "ms",
                             "scope": {"hardware": ["h200"]}}])
    path = write_scenario(tmp_path, DSV3, lambda s, d: s["coefficients"].append("extra"))
    refused(resolve_with(path, reg), file=cset, field="entries[0].units", value="ms",
            reason="unknown units", untouched=tmp_path)


def test_plain_us_units_are_microseconds(tmp_path):
    root, reg = tmp_registry(tmp_path)
    coefficient_set(root / "coefficients" / "extra.yaml", "extra",
                    [{"name": "host_output_token", "value": 50.0, "units": "us",
                      "scope": {"hardware": ["h200"]}}])
    path = write_scenario(tmp_path, DSV3, lambda s, d: s["coefficients"].append("extra"))
    assert resolve_with(path, reg)().coefficients["host_output_token"] == pytest.approx(50e-6)


def test_unknown_key_in_a_speculator(tmp_path):
    # a stated number of passes would be silently ignored: the engine's num_spec_tokens sets them
    root, reg = tmp_registry(tmp_path)
    doc = bundled_model_doc("deepseek-v3")
    doc["speculator"]["passes"] = 3
    graph = write_yaml(root / "models" / "deepseek-v3.yaml", doc)
    path = write_scenario(tmp_path, DSV3)
    refused(resolve_with(path, reg), file=graph, field="speculator.passes", value=3,
            reason="unknown key", untouched=tmp_path)

# ----------------------------------------------------------------------------- chips and placement


def test_int8_gemms_on_a_chip_without_an_8bit_peak(tmp_path):
    # a synthetic h200 with no TFlopsFP8, serving a llama checkpoint stored in int8
    root, reg = tmp_registry(tmp_path)
    chip = public_chip(root, "h200", TFlopsFP8=None)
    doc = bundled_model_doc("llama-3.1-70b-instruct")
    doc["weight_dtype"] = "int8"
    write_yaml(root / "models" / "llama-3.1-70b-instruct.yaml", doc)

    def edit(s, d):
        engine(d).pop("quantization", None)
    path = write_scenario(tmp_path, LLAMA, edit)
    refused(resolve_with(path, reg), file=chip, field="fp8_tflops", value=None,
            reason="int8 GEMMs need an 8-bit peak; the chip states none", untouched=tmp_path)


def test_a_chip_without_an_sm_count_resolves(tmp_path):
    root, reg = tmp_registry(tmp_path)
    public_chip(root, "h200", SMCount=None)
    dep = load_deployment(write_scenario(tmp_path, DSV3), registry=reg)
    assert dep.chip.sm_count is None
    assert dep.resolution["kernels_per_step"] == 972


def test_a_chip_missing_a_required_figure(tmp_path):
    root, reg = tmp_registry(tmp_path)
    chip = public_chip(root, "h200", BwPeakTBs=None)
    path = write_scenario(tmp_path, DSV3)
    refused(resolve_with(path, reg), file=chip, field="BwPeakTBs", reason="required key is missing",
            untouched=tmp_path)


def test_non_positive_hbm_bandwidth(tmp_path):
    root, reg = tmp_registry(tmp_path)
    chip = public_chip(root, "h200", BwPeakTBs=0)
    path = write_scenario(tmp_path, DSV3)
    refused(resolve_with(path, reg), file=chip, field="hbm_tbs", value=0.0,
            reason="HBM bandwidth resolved to a non-positive value", untouched=tmp_path)


def test_non_positive_compute_peak(tmp_path):
    root, reg = tmp_registry(tmp_path)
    chip = public_chip(root, "h200", TFlopsFP8=0, TFlopsPeak=0)
    path = write_scenario(tmp_path, DSV3)
    refused(resolve_with(path, reg), file=chip, field="bf16_tflops", value=0,
            reason="compute peak resolved to 0", untouched=tmp_path)


def test_collective_crossing_nodes_without_a_fabric(tmp_path):
    # EP over tp 8 x dp 4 = 32 ranks on 8-GPU nodes: the All2All group spans 4 nodes
    def edit(s, d):
        s["cluster"].update(nodes=4, gpus_per_node=8)
        d["pools"][0]["nodes"] = 4
        parallel(d).update(dp=4, enable_expert_parallel=True)
    path = write_scenario(tmp_path, DSV3, edit)
    refused(lambda: load_deployment(path), file=path, field="Scenario.cluster.fabric",
            reason="a All2All group of 32 ranks crosses nodes but the cluster names no fabric",
            untouched=tmp_path)


def test_the_same_group_with_a_fabric_resolves(tmp_path):
    def edit(s, d):
        s["cluster"].update(nodes=4, gpus_per_node=8, fabric="ib-400g")
        d["pools"][0]["nodes"] = 4
        parallel(d).update(dp=4, enable_expert_parallel=True)
    dep = load_deployment(write_scenario(tmp_path, DSV3, edit))
    a2a = [c for c in dep.resolution["collectives"] if c["op"] == "All2All"][0]
    assert (a2a["width"], a2a["snapped"], a2a["nic"]) == (32, 16, True)
    assert dep.resolution["nodes_spanned"] == 4


# ----------------------------------------------------------------------------- batches


@pytest.mark.parametrize("sched,comp,field,value", [
    ([1, -1, 1], [10, 10, 10], "scheduled[1]", -1.0),
    ([1, 1.5], [10, 10], "scheduled[1]", 1.5),
    ([1, 1], [10, float("nan")], "computed[1]", float("nan")),
    ([1, 1], [float("inf"), 3], "computed[0]", float("inf")),
    ([4, 1], [-2, 3], "computed[0]", -2.0),
])
def test_bad_token_counts_in_a_batch(sched, comp, field, value):
    refused(lambda: Batch.from_requests(sched, comp, pad_to=8), file="batch", field=field,
            value=value, reason="token counts must be non-negative integers")


def test_bad_prompt_length_in_a_batch():
    refused(lambda: Batch.from_requests([1, 1], [3, 3], prompt_len=[4, 2.5]), file="batch",
            field="prompt_len[1]", value=2.5, reason="token counts must be non-negative integers")


def test_batch_names_its_source():
    refused(lambda: Batch.from_requests([1, -3], [0, 0], source="trace.csv"), file="trace.csv",
            field="scheduled[1]", value=-3.0, reason="non-negative integers")


def test_batch_length_mismatch_and_padding():
    refused(lambda: Batch.from_requests([1, 1, 1], [3, 3]), file="batch", field="computed",
            reason="has 2 values for 3 requests")
    refused(lambda: Batch.from_requests([1, 1, 1], [3, 3, 3], pad_to=2), file="batch", field="pad_to",
            value=2, reason="3 requests do not fit in 2 rows")
    refused(lambda: Batch.from_requests([1], [3], decode_threshold=-1), file="batch",
            field="decode_threshold", value=-1, reason="must be a non-negative integer")


def test_a_good_batch_is_built():
    b = Batch.from_requests([1, 64], [99, 0], pad_to=4, decode_threshold=8)
    np.testing.assert_array_equal(np.asarray(b.scheduled), [1, 64, 0, 0])
    np.testing.assert_array_equal(np.asarray(b.prompt_len), [100, 64, 0, 0])
    np.testing.assert_array_equal(np.asarray(b.mask), [True, True, False, False])


# ----------------------------------------------------------------------------- nothing else touched


def test_refusals_leave_the_bundled_files_and_a_shared_registry_alone(tmp_path):
    def stat(root):
        return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in Path(root).rglob("*") if p.is_file()}
    testdata = scenario_path(DSV3).parent
    before = (stat(BUNDLED), stat(testdata))
    reg = Registry()
    good = load_deployment(DSV3, registry=reg)
    for edit in (lambda s, d: parallel(d).update(pp=2),
                 lambda s, d: engine(d).update(cache_dtype="fp8_inc"),
                 lambda s, d: s.update(model="nope")):
        with pytest.raises(JaxpriceError):
            load_deployment(write_scenario(tmp_path, DSV3, edit, filename="bad.yaml"), registry=reg)
    again = load_deployment(DSV3, registry=reg)
    assert again.plan == good.plan
    np.testing.assert_array_equal(np.asarray(again.coefficients.values), np.asarray(good.coefficients.values))
    assert (stat(BUNDLED), stat(testdata)) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]
    assert os.access(scenario_path(DSV3), os.R_OK)
