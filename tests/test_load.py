"""Loading both families of files: the bundled project format (registry/, testdata/) and the
public document formats as they are (kind: ModelGraph, PascalCase chip files, kind:
CoefficientSet, the two-document Scenario + Deployment stream).

Public-format behaviour is tested on synthetic files written into tmp_path, so these tests never
depend on the shared reference copies; a second group compares the shared copies with the
bundled registry and is skipped where ../shared is absent.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from jaxprice import (JaxpriceError, Registry, load_coefficient_set, load_deployment, load_model_graph,
                      load_scenario)
from jaxprice._src.formats import default_registry_root, load_chips, load_public_chip
from jaxprice._src.resolve import scenario_path

BUNDLED = default_registry_root()
SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference"


def _registry_build():
    """registry/build.py as a module: its GRAPH_CORRECTIONS (what the bundled graphs add to the
    reference's) and _apply_corrections."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("registry_build", BUNDLED / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
DSV3 = "deepseek-v3-h200-fp8-sglang-tp8"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(),
                                  reason=f"the public reference copies are not at {SHARED}")


# ----------------------------------------------------------------------------- bundled format


def test_every_bundled_model_loads():
    files = sorted((BUNDLED / "models").glob("*.yaml"))
    assert len(files) >= 11
    reg = Registry()
    for f in files:
        g = reg.model(f.stem)
        assert g.name == f.stem and g.path == str(f)
        assert g.hidden_size > 0 and g.vocab_size > 0
        assert set(g.expanded_stack()) <= set(g.layer_kinds)
        assert all(isinstance(nodes, tuple) and nodes for nodes in g.layer_kinds.values())


def test_every_bundled_chip_and_network_loads():
    chips, nets = load_chips(BUNDLED / "chips.yaml")
    assert {"a100-80", "b200", "b300", "gb200-nvl72", "h100", "h200", "l40s"} <= set(chips)
    h200 = chips["h200"]
    assert (h200.bf16_tflops, h200.fp8_tflops, h200.nvfp4_tflops, h200.hbm_tbs, h200.memory_gib,
            h200.nvlink_gbps, h200.sm_count) == (989.5, 1979.0, None, 4.8, 141.0, 450, 132)
    assert chips["gb200-nvl72"].gpus_per_rack == 72 and chips["gb200-nvl72"].rack_gbps == 900
    assert chips["h100"].sm_count is None
    assert nets["ib-400g"].internode_gbps == 50
    assert Registry().network("roce-200g").internode_gbps == 25


def test_every_bundled_coefficient_set_loads():
    files = sorted((BUNDLED / "coefficients").glob("*.yaml"))
    assert {f.stem for f in files} >= {"cost-model-primitives", "cost-model-collectives",
                                       "cost-model-attention", "cost-model-host-overheads",
                                       "cost-model-recurrent", "cost-model-memory"}
    for f in files:
        cset = load_coefficient_set(f)
        assert cset.name == f.stem and cset.entries
        for e in cset.entries:
            assert isinstance(e.units, str) and e.scope
            assert all(isinstance(v, tuple) for v in e.scope.values())


def test_bundled_scenario_fields():
    s = load_scenario(scenario_path(DSV3))
    assert (s.name, s.model, s.hardware, s.fabric, s.nodes, s.gpus_per_node) == (
        DSV3, "deepseek-v3", "h200", None, 1, 8)
    assert s.coefficient_sets == ("cost-model-primitives", "cost-model-collectives",
                                  "cost-model-host-overheads", "cost-model-attention",
                                  "cost-model-recurrent", "cost-model-memory")
    assert s.parallel == {"tp": 8, "pp": 1, "dp": 1, "enable_expert_parallel": False}
    assert s.engine["quantization"] == "fp8" and s.engine["cache_dtype"] == "fp8"
    assert s.engine["cudagraph_mode"] == "PIECEWISE" and s.engine["max_num_seqs"] == 256
    assert s.engine_version == "0.29.0" and s.pool_nodes == 1


def test_a_scenario_by_name_by_string_and_by_path():
    by_name = load_deployment(DSV3)
    assert load_deployment(str(scenario_path(DSV3))).plan == by_name.plan
    assert load_deployment(scenario_path(DSV3)).plan == by_name.plan
    assert load_deployment(DSV3 + ".yaml").plan == by_name.plan


# ----------------------------------------------------------------------------- synthetic files

HIDDEN, VOCAB = 1024, 32000
NODES = [
    {"op": "Elementwise", "role": "input_norm"},
    {"op": "GEMM", "role": "qkv_proj", "n": 1536, "k": HIDDEN},
    {"op": "Attention", "kind": "gqa", "n_q": 8, "n_kv": 2, "d_h": 128},
    {"op": "GEMM", "role": "o_proj", "n": HIDDEN, "k": HIDDEN},
    {"op": "AllReduce", "role": "attn_out", "emit": "tensor_parallel"},
    {"op": "Elementwise", "role": "post_attn_norm"},
    {"op": "GEMM", "role": "mlp_gate_up", "n": 8192, "k": HIDDEN},
    {"op": "GEMM", "role": "mlp_down", "n": HIDDEN, "k": 4096},
    {"op": "AllReduce", "role": "mlp_out", "emit": "tensor_parallel_unless_sp_moe"},
]
HEAD = [{"op": "Elementwise", "role": "final_norm"},
        {"op": "GEMM", "role": "lm_head", "n": VOCAB, "k": HIDDEN}]
CHIP = {"bf16_tflops": 100.0, "fp8_tflops": 200.0, "hbm_tbs": 1.0, "memory_gib": 16.0,
        "nvlink_gbps": 100.0, "gpus_per_node": 4}
PUBLIC_CHIP_KEYS = {"bf16_tflops": "TFlopsPeak", "fp8_tflops": "TFlopsFP8", "hbm_tbs": "BwPeakTBs",
                    "memory_gib": "MemoryGiB", "nvlink_gbps": "IntraNodeBwGBps", "gpus_per_node": "GPUsPerNode"}


def _coefficients():
    """(name, value, units) of the synthetic set, all scoped to hardware tinychip."""
    out = [("hbm_derate", 0.75, "dimensionless"), ("gemm_eps_max_bf16", 0.9, "dimensionless"),
           ("gemm_m_half_bf16", 100, "tokens"), ("attention_decode_floor", 5.0, "us_per_call"),
           ("attention_decode_rate", 400000.0, "bytes_per_us")]
    for op in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
        for n in (2, 4):
            out += [(f"collective_floor_{op}_fp16_{n}rank_tinychip", 10.0, "us_per_transfer"),
                    (f"collective_peak_rate_{op}_fp16_{n}rank_tinychip", 50000.0, "bytes_per_us"),
                    (f"collective_transition_rate_{op}_fp16_{n}rank_tinychip", 20000.0, "bytes_per_us")]
    return out


def _dump(path: Path, doc, *, comment="") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(comment + yaml.safe_dump(doc, sort_keys=False))
    return path


def write_public(root: Path, layout: str = "checkout") -> Path:
    """A public catalog + registry (layout "checkout": catalog/ and registry/ folders, like the
    BLIS checkouts; "flat": everything at the root). Returns the root."""
    cat = root / "catalog" if layout == "checkout" else root
    reg = root / "registry" if layout == "checkout" else root
    _dump(cat / "models" / "tiny" / "graph.yaml", {
        "kind": "ModelGraph", "name": "tiny",
        "derived_from": {"format": "hf_config_json", "path": "config.json", "sha256": "0" * 64,
                         "deriver_version": 1},
        "global": {"hidden_size": HIDDEN, "vocab_size": VOCAB, "tie_word_embeddings": False,
                   "weight_dtype": "bf16"},
        "layer_kinds": [{"id": "dense", "nodes": NODES,
                         "edges": [[i, i + 1] for i in range(len(NODES) - 1)]}],
        "stack": {"pattern": ["dense"], "repeat": 4},
        "head": HEAD})
    chip = {PUBLIC_CHIP_KEYS[k]: v for k, v in CHIP.items()}
    _dump(cat / "hardware" / "tinychip.yaml",
          {"_comment": "a synthetic part", "Provenance": "test", **chip,
           "_comment_interconnect": "per-GPU, one direction"}, comment="# a test chip\n")
    _dump(cat / "networks" / "tinynet.yaml",
          {"_comment": "synthetic", "Provenance": "test", "InterNodeBwGBps": 10, "RDMA": True})
    _dump(reg / "coefficients" / "tiny-set.yaml", {
        "kind": "CoefficientSet", "name": "tiny-set",
        "coefficients": [{name: {"value": v, "units": u, "method": "measured", "fitted": True,
                                 "scope": {"hardware": ["tinychip"]},
                                 "sources": [{"kind": "model", "cite": "test", "role": "primary"}],
                                 "rationale": "synthetic"}} for name, v, u in _coefficients()]})
    return root


def write_project(root: Path) -> Path:
    """The same content in the project's own registry format."""
    _dump(root / "models" / "tiny.yaml", {
        "format": "jaxprice-model/1", "name": "tiny", "hidden_size": HIDDEN, "vocab_size": VOCAB,
        "tie_word_embeddings": False, "weight_dtype": "bf16", "modality": "text_only",
        "layer_kinds": {"dense": NODES}, "stack": {"prologue": [], "pattern": ["dense"], "repeat": 4,
                                                   "epilogue": []},
        "head": HEAD})
    _dump(root / "chips.yaml", {"format": "jaxprice-chips/1",
                                "chips": {"tinychip": {**CHIP, "provenance": "test"}},
                                "networks": {"tinynet": {"internode_gbps": 10, "rdma": True}}})
    _dump(root / "coefficients" / "tiny-set.yaml", {
        "format": "jaxprice-coefficients/1", "name": "tiny-set", "source": "test",
        "entries": [{"name": n, "value": v, "units": u, "scope": {"hardware": ["tinychip"]}}
                    for n, v, u in _coefficients()]})
    return root


def write_scenario(path: Path, *, tp=2, coefficients=("tiny-set",), **engine) -> Path:
    scen = {"kind": "Scenario", "name": "tiny-tinychip", "engine_version": "0.31.0", "model": "tiny",
            "coefficients": list(coefficients),
            "cluster": {"hardware": "tinychip", "fabric": "tinynet", "nodes": 1, "gpus_per_node": 4}}
    dep = {"kind": "Deployment", "name": "tiny-tinychip", "pools": [{
        "role": "colocated", "nodes": 1, "parallel": {"tp": tp, "pp": 1, "dp": 1},
        "engine": {"cache_dtype": "bfloat16", "block_size": 16, "max_num_seqs": 64,
                   "cudagraph_mode": "PIECEWISE", **engine}}]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# a synthetic scenario\n" + yaml.safe_dump_all([scen, dep], sort_keys=False))
    return path


def test_public_model_graph(tmp_path):
    g = load_model_graph(write_public(tmp_path) / "catalog" / "models" / "tiny" / "graph.yaml")
    assert (g.name, g.hidden_size, g.vocab_size, g.weight_dtype, g.tie_word_embeddings) == (
        "tiny", HIDDEN, VOCAB, "bf16", False)
    assert list(g.layer_kinds) == ["dense"] and len(g.layer_kinds["dense"]) == len(NODES)
    assert g.expanded_stack() == ["dense"] * 4
    assert [n["emit"] for n in g.layer_kinds["dense"]][:2] == ["", ""]      # emit defaults to always
    assert g.layer_kinds["dense"][4]["emit"] == "tensor_parallel"
    assert len(g.head) == 2 and g.speculator is None and g.modality == "text_only"


def test_public_chip_and_network(tmp_path):
    root = write_public(tmp_path)
    chip = load_public_chip(root / "catalog" / "hardware" / "tinychip.yaml")
    assert chip.name == "tinychip"
    assert (chip.bf16_tflops, chip.fp8_tflops, chip.nvfp4_tflops, chip.hbm_tbs, chip.memory_gib,
            chip.nvlink_gbps, chip.sm_count, chip.gpus_per_node, chip.gpus_per_rack) == (
        100.0, 200.0, None, 1.0, 16.0, 100.0, None, 4, None)
    assert Registry([root]).network("tinynet").internode_gbps == 10


def test_public_coefficient_set(tmp_path):
    cset = load_coefficient_set(write_public(tmp_path) / "registry" / "coefficients" / "tiny-set.yaml")
    assert cset.name == "tiny-set" and len(cset.entries) == len(_coefficients())
    e = cset.entries[0]
    assert (e.name, e.value, e.units, e.scope) == ("hbm_derate", 0.75, "dimensionless",
                                                   {"hardware": ("tinychip",)})


def test_project_format_files(tmp_path):
    root = write_project(tmp_path)
    g = load_model_graph(root / "models" / "tiny.yaml")
    assert g.expanded_stack() == ["dense"] * 4 and g.layer_kinds["dense"][1]["n"] == 1536
    chips, nets = load_chips(root / "chips.yaml")
    assert chips["tinychip"].bf16_tflops == 100.0 and chips["tinychip"].tf32_tflops is None
    assert nets["tinynet"].internode_gbps == 10
    cset = load_coefficient_set(root / "coefficients" / "tiny-set.yaml")
    assert cset.entries[0].cite == "test" and cset.entries[2].value == 100.0


@pytest.mark.parametrize("layout", ["checkout", "flat"])
def test_a_public_checkout_resolves_to_hand_derived_numbers(tmp_path, layout):
    root = write_public(tmp_path / "pub", layout)
    dep = load_deployment(write_scenario(tmp_path / "s.yaml"), registry_roots=[root])
    res, mem, a = dep.resolution, dep.plan.memory, dep.plan.arrays
    # per layer: 2 Elementwise + 4 GEMM + 2 (Attention) + 2 AllReduce (tp 2) = 10; head 2
    assert res["kernels_per_step"] == 4 * 10 + 2
    assert res["piecewise_segments"] == 4 + 1
    # KV: 2 tensors x max(1, 2 // 2) heads x 128 x 2 bytes (bfloat16) x 4 layers
    assert mem["kv_bytes_per_token"] == 2 * 1 * 128 * 2 * 4
    layer = (1536 * HIDDEN + HIDDEN * HIDDEN + 8192 * HIDDEN + HIDDEN * 4096) * 2 / 2
    assert mem["weights_bytes"] == 4 * layer + 2 * (VOCAB * HIDDEN * 2 / 2)
    # column-parallel GEMMs shard N, row-parallel ones K; no two column-parallel GEMMs adjoin
    np.testing.assert_array_equal(a["gemm_n"], [1536 / 2, HIDDEN, 8192 / 2, HIDDEN])
    np.testing.assert_array_equal(a["gemm_k"], [HIDDEN, HIDDEN / 2, HIDDEN, 4096 / 2])
    assert res["rate_classes"] == [("bf16", "bf16", 100e12)]
    ar = [c for c in res["collectives"] if c["op"] == "AllReduce"][0]
    a2a = [c for c in res["collectives"] if c["op"] == "All2All"][0]
    assert (ar["width"], ar["snapped"], ar["nic"]) == (2, 2, False)
    assert (a2a["width"], a2a["snapped"]) == (1, 2)
    c = dep.coefficients
    assert c["hbm_derate"] == 0.75 and c["gemm_m_half_bf16"] == 100
    assert c["collective_floor_all_reduce_fp16_2rank_tinychip"] == pytest.approx(10e-6)
    assert c["collective_peak_rate_all_reduce_fp16_2rank_tinychip"] == pytest.approx(5e10)
    assert c["attention_decode_floor"] == pytest.approx(5e-6)
    assert dep.chip.sm_count is None and dep.graph.name == "tiny"


def test_public_and_project_formats_resolve_to_the_same_plan(tmp_path):
    pub = write_public(tmp_path / "pub")
    own = write_project(tmp_path / "own")
    for tp in (1, 2, 4):
        scen = write_scenario(tmp_path / f"s{tp}.yaml", tp=tp)
        a = load_deployment(scen, registry_roots=[pub])
        b = load_deployment(scen, registry_roots=[own])
        assert a.plan == b.plan
        assert a.coefficients.names == b.coefficients.names
        np.testing.assert_array_equal(np.asarray(a.coefficients.values), np.asarray(b.coefficients.values))
    assert a.resolution["tp"] == 4


def test_earlier_roots_win_across_layouts(tmp_path):
    # a public-layout graph in the first root shadows the bundled project-format one
    doc = {"kind": "ModelGraph", "name": "deepseek-v3",
           "global": {"hidden_size": HIDDEN, "vocab_size": VOCAB, "weight_dtype": "bf16"},
           "layer_kinds": [{"id": "dense", "nodes": NODES}], "stack": {"pattern": ["dense"], "repeat": 3}}
    _dump(tmp_path / "models" / "deepseek-v3" / "graph.yaml", doc)
    _dump(tmp_path / "hardware" / "h200.yaml", {
        "TFlopsPeak": 989.5, "BwPeakTBs": 5.0, "MemoryGiB": 141.0, "IntraNodeBwGBps": 450})
    first = Registry([tmp_path, BUNDLED])
    assert first.model("deepseek-v3").hidden_size == HIDDEN
    assert first.chip("h200").hbm_tbs == 5.0
    last = Registry([BUNDLED, tmp_path])
    assert last.model("deepseek-v3").hidden_size == 7168
    assert last.chip("h200").hbm_tbs == 4.8


def test_a_coefficient_set_named_by_path(tmp_path):
    root = write_public(tmp_path / "pub")
    path = root / "registry" / "coefficients" / "tiny-set.yaml"
    moved = tmp_path / "elsewhere" / "my-set.yaml"
    moved.parent.mkdir()
    moved.write_bytes(path.read_bytes())
    path.unlink()
    dep = load_deployment(write_scenario(tmp_path / "s.yaml", coefficients=[str(moved)]),
                          registry_roots=[root])
    assert dep.coefficients["hbm_derate"] == 0.75


def test_an_edited_coefficient_file_is_read_again(tmp_path):
    root = write_project(tmp_path / "own")
    scen = write_scenario(tmp_path / "s.yaml")
    assert load_deployment(scen, registry_roots=[root]).coefficients["hbm_derate"] == 0.75
    f = root / "coefficients" / "tiny-set.yaml"
    f.write_text(f.read_text().replace("value: 0.75", "value: 0.7"))
    assert load_deployment(scen, registry_roots=[root]).coefficients["hbm_derate"] == 0.7


def test_a_file_of_neither_format_is_refused(tmp_path):
    f = _dump(tmp_path / "x.yaml", {"kind": "Chip", "name": "x"})
    with pytest.raises(JaxpriceError, match=r"x\.yaml, field 'kind', value 'Chip': not a model graph"):
        load_model_graph(f)
    with pytest.raises(JaxpriceError, match=r"x\.yaml, field 'format': not a coefficient set"):
        load_coefficient_set(f)
    with pytest.raises(JaxpriceError, match=r"x\.yaml, field 'format': not a jaxprice chips file"):
        load_chips(f)


def test_comments_and_edges_are_accepted_but_other_public_keys_are_not(tmp_path):
    root = write_public(tmp_path)
    f = root / "catalog" / "hardware" / "tinychip.yaml"
    doc = yaml.safe_load(f.read_text())
    doc["_comment_more"] = "fine"
    _dump(f, doc)
    assert load_public_chip(f).bf16_tflops == 100.0
    doc["HBMGiB"] = 16
    _dump(f, doc)
    with pytest.raises(JaxpriceError, match=r"tinychip\.yaml, field 'HBMGiB', value 16: unknown key"):
        load_public_chip(f)


# ----------------------------------------------------------------------------- the shared copies


@needs_shared
def test_shared_public_files_load():
    reg = Registry([SHARED])
    graphs = sorted((SHARED / "catalog" / "models").glob("*/graph.yaml"))
    assert len(graphs) >= 11
    for g in graphs:
        assert reg.model(g.parent.name).name == g.parent.name
    for h in sorted((SHARED / "catalog" / "hardware").glob("*.yaml")):
        assert reg.chip(h.stem).bf16_tflops > 0
    for n in sorted((SHARED / "catalog" / "networks").glob("*.yaml")):
        assert reg.network(n.stem).internode_gbps > 0
    for c in sorted((SHARED / "registry" / "coefficients").glob("*.yaml")):
        assert reg.coefficient_set(c.stem).entries


@needs_shared
def test_shared_graphs_chips_and_sets_equal_the_bundled_ones():
    pub, own = Registry([SHARED]), Registry()
    fields = ("name", "hidden_size", "vocab_size", "tie_word_embeddings", "weight_dtype", "modality",
              "layer_kinds", "stack", "head", "speculator", "capture_breaks")
    build = _registry_build()
    assert set(build.GRAPH_CORRECTIONS) == {"minimax-m2.5", "deepseek-v3", "kimi-k2.5"}
    for f in sorted((BUNDLED / "models").glob("*.yaml")):
        if f.read_text().startswith(build.IMPORTED):      # no graph upstream (test_registry_build)
            continue
        a, b = pub.model(f.stem), own.model(f.stem)
        kinds = {k: [dict(n) for n in v] for k, v in a.layer_kinds.items()}
        # the bundled graph = the reference's + its corrections, one comment line per layer kind
        lines = build._apply_corrections(f.stem, f.stem, kinds)
        assert len(lines) == sum(len(kids) for kids, _, _ in build.GRAPH_CORRECTIONS.get(f.stem, ()))
        assert {k: tuple(v) for k, v in kinds.items()} == b.layer_kinds, f.stem
        assert [getattr(a, k) for k in fields if k != "layer_kinds"] == \
            [getattr(b, k) for k in fields if k != "layer_kinds"], f.stem
    for h in sorted((SHARED / "catalog" / "hardware").glob("*.yaml")):
        a, b = dataclasses.asdict(pub.chip(h.stem)), dataclasses.asdict(own.chip(h.stem))
        # neither states a TF32 rate: both derive it as half the BF16 rate
        assert a["tf32_tflops"] == b["tf32_tflops"] == b["bf16_tflops"] / 2
        a.pop("source"), b.pop("source")
        assert a == b, h.stem
    for c in sorted((BUNDLED / "coefficients").glob("*.yaml")):
        a, b = pub.coefficient_set(c.stem), own.coefficient_set(c.stem)
        assert [(e.name, e.value, e.units, e.scope) for e in a.entries] == \
            [(e.name, e.value, e.units, e.scope) for e in b.entries], c.stem


@needs_shared
def test_shared_scenarios_resolve_as_the_bundled_ones_do():
    pub, own = Registry([SHARED]), Registry()
    files = sorted((SHARED / "scenarios" / "aisimulate").glob("*.yaml"))
    assert len(files) == 88
    corrected = set(_registry_build().GRAPH_CORRECTIONS)
    for f in files:
        a = load_deployment(f, registry=pub)
        b = load_deployment(f.stem, registry=own)
        if a.scenario.model not in corrected:
            assert a.plan == b.plan, f.stem
        elif a.scenario.model == "minimax-m2.5":
            # the QK-norm all-reduce (8 bytes per token) adds one collective class (resolved at
            # every width, launched only under tensor parallelism)
            extra = [c for c in b.resolution["collectives"] if c["bytes_per_token"] == 8.0]
            assert len(extra) == 1 and (extra[0]["names"] is not None) == (b.resolution["tp"] > 1), f.stem
            assert [c for c in b.resolution["collectives"] if c not in extra] == a.resolution["collectives"], f.stem
        else:
            # MLA prefill priced uncompressed: (128 + 64 + 128) / 2 = 160 per head, not d_h = 576;
            # nothing else moves
            A, B = a.plan.arrays, b.plan.arrays
            np.testing.assert_array_equal(B["attn_flops_per_pair"] * 576, A["attn_flops_per_pair"] * 160)
            assert all(np.array_equal(A[k], B[k]) for k in A if k != "attn_flops_per_pair"), f.stem
            assert a.resolution == b.resolution, f.stem
        assert a.coefficients.names == b.coefficients.names, f.stem
        np.testing.assert_array_equal(np.asarray(a.coefficients.values), np.asarray(b.coefficients.values))


@needs_shared
def test_shared_deepseek_v3_numbers():
    dep = load_deployment(SHARED / "scenarios" / "aisimulate" / f"{DSV3}.yaml", registry_roots=[SHARED])
    assert dep.resolution["kernels_per_step"] == 972
    assert dep.resolution["piecewise_segments"] == 62
    assert dep.plan.memory["kv_bytes_per_token"] == 35136
    assert round(dep.plan.memory["weights_bytes"] / 2 ** 30, 1) == 78.1


def test_a_scenarios_model_may_be_a_graph_file(tmp_path):
    """A scenario's model: a graph file `jaxprice import-model` wrote (absolute, or relative to the
    scenario), resolved to the very plan its config.json gives; a .yaml reference naming no file
    is refused as such (it was 'unknown model', as if a registry name)."""
    from jaxprice._src.hf import graph_yaml, import_result
    config = Path("testdata/hf/Qwen--Qwen3-8B/config.json").resolve()
    (tmp_path / "qwen3-8b.yaml").write_text(graph_yaml(import_result(str(config), None)))
    base = Path(scenario_path("llama-3.1-70b-instruct-b200-fp4-trt-tp2")).read_text()
    assert "model: llama-3.1-70b-instruct\n" in base

    def scen(name, model):
        path = tmp_path / name
        path.write_text(base.replace("model: llama-3.1-70b-instruct\n", f"model: {model}\n"))
        return path
    want = load_deployment(scen("by_config.yaml", config)).plan.digest
    assert load_deployment(scen("by_graph.yaml", tmp_path / "qwen3-8b.yaml")).plan.digest == want
    assert load_deployment(scen("relative.yaml", "qwen3-8b.yaml")).plan.digest == want
    with pytest.raises(JaxpriceError, match="no such model graph file") as err:
        load_deployment(scen("missing.yaml", "nothere.yaml"))
    assert "nothere.yaml" in str(err.value) and "\n" not in str(err.value)


def test_a_scenarios_coefficient_set_file_resolves_next_to_it(tmp_path, monkeypatch):
    """A scenario's `coefficients:` entry spelled as a file (a fitted set beside it) is found next to
    the scenario, as its model file is, not only from the working folder; one found nowhere is
    refused naming both places."""
    import shutil
    shutil.copy(BUNDLED / "coefficients" / "cost-model-memory.yaml", tmp_path / "mem.yaml")
    base = Path(scenario_path("llama-3.1-70b-instruct-b200-fp4-trt-tp2")).read_text()
    assert "- cost-model-memory\n" in base
    (tmp_path / "s.yaml").write_text(base.replace("- cost-model-memory\n", "- mem.yaml\n"))
    (tmp_path / "bad.yaml").write_text(base.replace("- cost-model-memory\n", "- nothere.yaml\n"))
    monkeypatch.chdir(tmp_path.parent)                      # not the scenario's folder
    want, got = load_deployment("llama-3.1-70b-instruct-b200-fp4-trt-tp2"), load_deployment(tmp_path / "s.yaml")
    assert got.plan.digest == want.plan.digest and got.coefficients.names == want.coefficients.names
    np.testing.assert_array_equal(got.coefficients.values, want.coefficients.values)
    with pytest.raises(JaxpriceError, match="nor nothere.yaml as given or next to") as err:
        load_deployment(tmp_path / "bad.yaml")
    assert "\n" not in str(err.value)
