"""Resolution: a deployment into a Plan, once (reference-kernel.md sections 1, 2, 3.13, 7.2, 8).

Every number asserted here is derived by hand from the graph, the scenario and the spec, not
read back from the code: widths, coefficient scoping, collective snapping, emit conditions,
GEMM fusion, kernel counts, piecewise segments, weights per rank and KV bytes per token.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

from jaxprice import JaxpriceError, Registry, load_deployment, load_scenario, resolve
from jaxprice._src.formats import default_registry_root
from jaxprice._src.resolve import KERNELS_PER_OP, held_fraction, scenario_path

BUNDLED = default_registry_root()
SCENARIO_DIR = scenario_path("deepseek-v3-h200-fp8-sglang-tp8").parent
SCENARIOS = sorted(SCENARIO_DIR.glob("*.yaml"))
REG = Registry()
GiB = 2.0 ** 30


def scenario(name, *, parallel=None, engine=None, **changes):
    """A bundled scenario with some parallel/engine fields changed (in memory only)."""
    s = load_scenario(scenario_path(name))
    if parallel:
        changes["parallel"] = {**s.parallel, **parallel}
    if engine is not None:
        changes["engine"] = {k: v for k, v in {**s.engine, **engine}.items() if v is not None}
    return dataclasses.replace(s, **changes)


def resolved(name, registry=REG, **kw):
    return resolve(scenario(name, **kw), registry)


def collective(dep, op):
    return [c for c in dep.resolution["collectives"] if c["op"] == op][0]


# ----------------------------------------------------------------------------- all 88 scenarios


def test_the_bundled_scenarios_are_the_88():
    assert len(SCENARIOS) == 88
    assert sum("gpt-oss-120b-h100-fp4" in p.name or "gpt-oss-120b-h200-fp4" in p.name
               for p in SCENARIOS) == 8


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_scenario_loads_and_resolves(path):
    dep = load_deployment(path, registry=REG)
    plan, res, scen = dep.plan, dep.resolution, dep.scenario
    assert scen.name == path.stem == plan.name
    assert (res["tp"], res["dp"]) == (scen.parallel.get("tp", 1), scen.parallel.get("dp", 1))
    # the plan holds NumPy arrays only (static under jit), all finite
    for key, arr in plan.arrays.items():
        assert type(arr) is np.ndarray, key
        assert np.all(np.isfinite(arr)), key
    assert hash(plan) == hash(resolve(scen, REG).plan)
    assert res["kernels_per_step"] > res["total_layers"] > 0
    assert res["piecewise_segments"] >= res["total_layers"] + 1
    # weights fit on the part, KV is positive, every coefficient is finite and named once
    assert 0 < plan.memory["weights_bytes"] < dep.chip.memory_gib * GiB
    assert plan.memory["kv_bytes_per_token"] > 0
    assert len(set(dep.coefficients.names)) == len(dep.coefficients.names) > 0
    # every rate-class index points into the class tables (an index past the end would be
    # clamped silently by the kernel's gather: prefill attention once ran at the FP8 peak so)
    n_classes = len(plan.arrays["class_peak"])
    assert n_classes == len(plan.coef["classes"]) == plan.scalars["n_classes"]
    for key in ("gemm_class", "expert_class", "rec_scan_class", "mhc_mix_class"):
        assert np.all(plan.arrays.get(key, np.zeros(0, int)) < n_classes), key
    assert plan.scalars["bf16_class"] < n_classes and plan.scalars["head_class"] < n_classes
    assert np.all(np.isfinite(np.asarray(dep.coefficients.values)))
    assert dep.coefficients["hbm_derate"] > 0
    assert all(peak > 0 for _, _, peak in res["rate_classes"])
    assert all(0 <= c < len(res["rate_classes"]) for c in plan.arrays["gemm_class"])


# ----------------------------------------------------------------------------- DeepSeek-V3 H200 tp8


DSV3 = "deepseek-v3-h200-fp8-sglang-tp8"
# deepseek-v3 graph (registry/models/deepseek-v3.yaml): 3 attn_dense + 58 attn_moe layers
ATTN_GEMMS = 2112 * 7168 + 24576 * 1536 + 32768 * 512 + 7168 * 16384        # qkv_a, q_b, kv_b, o
DENSE_MLP = 36864 * 7168 + 7168 * 18432                                     # gate_up, down
EXPERT = 3 * 2048 * 7168                                                    # one expert (gate, up, down)
VOCAB, HIDDEN = 129280, 7168


def test_4bit_weights_are_held_with_their_block_scales_and_read_without():
    # minimax-m2.5 (every GEMM at the served format, checkpoint fp8) served fp8 and nvfp4: the
    # layers hold 0.5 payload + 1/16 scale bytes per weight under nvfp4 (x 0.5625 of fp8's), the
    # embedding stays at the checkpoint's width; the head and every priced read are payload only.
    fp8 = resolved("minimax-m2.5-b200-fp4-vllm-tp4", engine={"quantization": "fp8"})
    fp4 = resolved("minimax-m2.5-b200-fp4-vllm-tp4", engine={"quantization": "nvfp4"})
    emb = 200064 * 3072 * 1.0 / 4
    head8, head4 = (d.plan.scalars["head_weight_bytes"] for d in (fp8, fp4))
    assert head4 == head8 / 2
    layers8 = fp8.plan.memory["weights_bytes"] - head8 - emb
    assert fp4.plan.memory["weights_bytes"] == pytest.approx(layers8 * (0.5 + 1 / 16) + head4 + emb, rel=1e-12)
    np.testing.assert_allclose(fp4.plan.arrays["weight_bytes"], fp8.plan.arrays["weight_bytes"] / 2, rtol=1e-12)
    np.testing.assert_allclose(fp4.plan.arrays["expert_bytes"], fp8.plan.arrays["expert_bytes"] / 2, rtol=1e-12)
    # and the KV cache it leaves is the budget less the larger weights (nothing else moved)
    m4, m8 = fp4.plan.memory, fp8.plan.memory
    assert m8["kv_capacity_tokens"] > 0
    gone = m4["weights_bytes"] - m8["weights_bytes"] + sum(m4[k] - m8[k] for k in
                                                         ("activation_bytes", "cudagraph_bytes", "comm_buffer_bytes"))
    assert m8["kv_capacity_tokens"] - m4["kv_capacity_tokens"] == pytest.approx(gone / m4["kv_bytes_per_token"], rel=1e-9)
    # per format: nvfp4 1 + (1/16) / 0.5, mxfp4 and mxfp8 1 + (1/32) / payload; int4 and fp8 as read
    assert [held_fraction(f) for f in ("nvfp4", "mxfp4", "mxfp8", "int4", "fp8", "bf16")] == \
        [1.125, 1.0625, 1.03125, 1.0, 1.0, 1.0]


def test_deepseek_v3_h200_tp8_hand_derived():
    dep = load_deployment(DSV3)
    res, mem = dep.resolution, dep.plan.memory
    # kernels: attn_dense = 4 Elementwise + 6 GEMM + 2 (Attention) + 2 AllReduce (tp > 1) = 14;
    # attn_moe = 4 Elementwise + 4 GEMM + 2 (Attention) + 4 (GroupedGEMM) + 2 AllReduce = 16, its
    # All2All dropped (EP off, dp 1: MoE group 1); head = norm + lm_head = 2.
    assert (14, 16) == (4 + 6 + 2 + 2, 4 + 4 + 2 + 4 + 2)
    assert res["kernels_per_step"] == 3 * 14 + 58 * 16 + 2 == 972
    # piecewise: one split per layer's attention, plus one
    assert res["total_layers"] == 61
    assert res["piecewise_segments"] == 61 + 1 == 62
    # weights per rank, fp8 (1 byte): every layer's GEMMs, all 256 routed + 1 shared expert
    # (EP off: experts are sharded over tp 8), lm_head and the embedding table, all over tp 8
    weights = (3 * (ATTN_GEMMS + DENSE_MLP) + 58 * (ATTN_GEMMS + EXPERT * (256 + 1)) + 2 * VOCAB * HIDDEN) / 8
    assert mem["weights_bytes"] == pytest.approx(weights, rel=1e-12)
    assert round(mem["weights_bytes"] / GiB, 1) == 78.1
    # KV: latent, one tensor, max(1, 1 // 8) heads, d_h 576, fp8 (1 byte), 61 layers
    assert mem["kv_bytes_per_token"] == 1 * 1 * 576 * 1 * 61 == 35136
    assert res["served_dtype"] == "fp8" and res["cache_layout"] == "fp8"
    assert (res["tp"], res["dp"], res["ep"], res["moe_group"], res["nodes_spanned"]) == (8, 1, 1, 1, 1)
    assert [c[:2] for c in res["rate_classes"]] == [("fp8", "fp8"), ("bf16", "bf16")]
    assert res["rate_classes"][0][2] == 1979.0e12
    assert dep.plan.scalars["experts_per_rank"] == 256
    assert dep.coefficients["hbm_derate"] == 0.8


def test_resolution_is_deterministic_and_the_plan_hashable():
    a, b = load_deployment(DSV3), load_deployment(DSV3)
    assert a.plan == b.plan and hash(a.plan) == hash(b.plan)
    assert a.coefficients.names == b.coefficients.names
    assert resolved(DSV3, parallel={"tp": 4}).plan != a.plan


# ----------------------------------------------------------------------------- widths


@pytest.mark.parametrize("name", [p.stem for p in SCENARIOS if p.stem.endswith("tp2-ep4-dp2")])
def test_tp2_ep4_dp2_widths(name):
    dep = load_deployment(name, registry=REG)
    res = dep.resolution
    assert (res["tp"], res["dp"], res["ep"], res["moe_group"]) == (2, 2, 4, 4)
    assert res["nodes_spanned"] == 1
    assert (collective(dep, "AllReduce")["width"], collective(dep, "AllReduce")["snapped"]) == (2, 2)
    assert (collective(dep, "All2All")["width"], collective(dep, "All2All")["snapped"]) == (4, 4)
    experts = max(n["experts"] for nodes in dep.graph.layer_kinds.values() for n in nodes
                  if n["op"] == "GroupedGEMM")
    assert dep.plan.scalars["experts_per_rank"] == experts / 4
    # the All2All fires (MoE group 4 > 1) on every MoE layer, 2 kernels each: EP off at dp 1
    # (MoE group 1) drops exactly those
    expanded = dep.graph.expanded_stack()
    moe_layers = sum(any(n["op"] == "GroupedGEMM" for n in dep.graph.layer_kinds[k]) for k in expanded)
    off = resolved(name, parallel={"enable_expert_parallel": False, "dp": 1})
    assert off.resolution["moe_group"] == 1
    assert res["kernels_per_step"] - off.resolution["kernels_per_step"] == 2 * moe_layers > 0


def test_tp2_ep4_dp2_scenarios_exist():
    assert len([p for p in SCENARIOS if p.stem.endswith("tp2-ep4-dp2")]) == 3


def test_moe_group_without_expert_parallelism():
    # EP off with dp > 1: the MoE group is tp * dp, the expert width stays 1 (section 1.4)
    dep = resolved(DSV3, parallel={"tp": 4, "dp": 2})
    assert (dep.resolution["ep"], dep.resolution["moe_group"]) == (1, 8)
    assert collective(dep, "All2All")["width"] == 8


# ----------------------------------------------------------------------------- coefficient scoping


def _set(root, name, entries):
    path = root / "coefficients" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"format": "jaxprice-coefficients/1", "name": name, "entries": [
        {"name": n, "value": v, "units": "dimensionless", "scope": scope} for n, v, scope in entries]}))
    return path


def _with_sets(tmp_path, name, *sets, before=()):
    reg = Registry([tmp_path, BUNDLED])
    s = scenario(name)
    return resolve(dataclasses.replace(s, coefficient_sets=tuple(before) + s.coefficient_sets + tuple(sets)), reg)


def test_later_sets_override_earlier_ones(tmp_path):
    _set(tmp_path, "a", [("hbm_derate", 0.5, {"hardware": ["h200"]})])
    _set(tmp_path, "b", [("hbm_derate", 0.6, {"hardware": ["h200"]})])
    assert _with_sets(tmp_path, DSV3, "a", "b").coefficients["hbm_derate"] == 0.6
    assert _with_sets(tmp_path, DSV3, "b", "a").coefficients["hbm_derate"] == 0.5
    # listed before cost-model-primitives, the bundled value (0.8) wins
    assert _with_sets(tmp_path, DSV3, before=["a"]).coefficients["hbm_derate"] == 0.8


def test_extra_coefficient_files_apply_last(tmp_path):
    a = _set(tmp_path, "a", [("hbm_derate", 0.5, {"hardware": ["h200"]})])
    b = _set(tmp_path, "b", [("hbm_derate", 0.6, {"hardware": ["h200"]})])
    assert load_deployment(DSV3, extra_coefficient_files=[a, b]).coefficients["hbm_derate"] == 0.6
    assert load_deployment(DSV3, extra_coefficient_files=[b, a]).coefficients["hbm_derate"] == 0.5


@pytest.mark.parametrize("scope,admitted", [
    ({"hardware": ["h200"], "model": ["deepseek-v3"]}, True),
    ({"hardware": ["H200"], "model": ["DeepSeek-V3"]}, True),            # case-insensitive
    ({"model": ["llama-3.1-70b-instruct"]}, False),
    ({"hardware": ["h200"], "tp": [8]}, True),
    ({"hardware": ["h200"], "tp": [4]}, False),
    ({"hardware": ["h200"], "tp": [2, 4, 8], "ep": [1], "nodes_spanned": [1]}, True),
    ({"hardware": ["h200"], "ep": [8]}, False),
    ({"hardware": ["h200"], "nodes_spanned": [2]}, False),
    ({"hardware": ["h100"]}, False),
])
def test_scoped_entry_admitted_or_not(tmp_path, scope, admitted):
    _set(tmp_path, "scoped", [("hbm_derate", 0.55, scope)])
    derate = _with_sets(tmp_path, DSV3, "scoped").coefficients["hbm_derate"]
    assert derate == (0.55 if admitted else 0.8)


def test_ep_scope_follows_the_expert_width(tmp_path):
    _set(tmp_path, "scoped", [("hbm_derate", 0.55, {"hardware": ["h200"], "ep": [8]})])
    reg = Registry([tmp_path, BUNDLED])
    s = scenario(DSV3, parallel={"enable_expert_parallel": True})
    s = dataclasses.replace(s, coefficient_sets=s.coefficient_sets + ("scoped",))
    assert resolve(s, reg).coefficients["hbm_derate"] == 0.55


def test_coefficients_are_in_si_units():
    c = load_deployment(DSV3).coefficients
    name = "collective_floor_all_reduce_fp16_8rank_h200"
    assert c[name] == pytest.approx(4.71e-6)                                # us -> s
    assert c["collective_peak_rate_all_reduce_fp16_8rank_h200"] == pytest.approx(134260.0e6)  # B/us -> B/s


# ----------------------------------------------------------------------------- snapping


def test_width_below_the_smallest_measured_snaps_to_the_smallest():
    dep = load_deployment("llama-3.1-70b-instruct-h200-fp8-vllm-tp1", registry=REG)
    for op in ("AllReduce", "AllGather", "ReduceScatter", "All2All"):
        assert (collective(dep, op)["width"], collective(dep, op)["snapped"]) == (1, 2)


def test_width_above_16_snaps_to_the_largest():
    s = scenario(DSV3, parallel={"dp": 4, "enable_expert_parallel": True}, nodes=4, gpus_per_node=8,
                 fabric="ib-400g")
    dep = resolve(s, REG)
    a2a = collective(dep, "All2All")
    assert (a2a["width"], a2a["snapped"], a2a["nic"]) == (32, 16, True)
    assert a2a["names"] == ("collective_floor_alltoall_fp16_16rank_h200",
                            "collective_transition_rate_alltoall_fp16_16rank_h200",
                            "collective_peak_rate_alltoall_fp16_16rank_h200")
    assert (collective(dep, "AllReduce")["snapped"], collective(dep, "AllReduce")["nic"]) == (8, False)


def test_width_in_a_gap_is_refused(tmp_path):
    entries = []
    for op in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
        for n in (2, 16):
            for p, v in (("floor", 5.0), ("peak_rate", 1e5), ("transition_rate", 1e5)):
                entries.append((f"collective_{p}_{op}_fp16_{n}rank_h200", v, {"hardware": ["h200"]}))
    _set(tmp_path, "cost-model-collectives", entries)
    with pytest.raises(JaxpriceError, match=r"collective width gap: all_reduce over 8 ranks"):
        resolve(scenario(DSV3), Registry([tmp_path, BUNDLED]))
    # the same set serves tp 2 exactly and tp 1 by snapping up
    dep = resolve(scenario(DSV3, parallel={"tp": 2}), Registry([tmp_path, BUNDLED]))
    assert collective(dep, "AllReduce")["snapped"] == 2


# ----------------------------------------------------------------------------- emit conditions


def test_emit_conditions_drop_nodes():
    base = load_deployment(DSV3).resolution["kernels_per_step"]
    # tp 1: both AllReduces of every layer (emit tensor_parallel*) are dropped
    assert resolved(DSV3, parallel={"tp": 1}).resolution["kernels_per_step"] == base - 2 * 61 == 850
    # EP on at tp 8: the MoE group is 8, so each of the 58 MoE layers' All2All fires (2 kernels)
    ep = resolved(DSV3, parallel={"enable_expert_parallel": True})
    assert ep.resolution["kernels_per_step"] == base + 2 * 58 == 1088
    # sequence-parallel MoE (EP, tp 2, dp 4, a DeepEP backend): mlp_out is dropped, All2All fires
    sp = resolved(DSV3, parallel={"tp": 2, "dp": 4, "enable_expert_parallel": True},
                  engine={"all2all_backend": "deepep_low_latency"})
    assert sp.resolution["sp_moe"] and sp.resolution["routed_all2all"]
    assert sp.resolution["kernels_per_step"] == 3 * (14 - 1) + 58 * (16 - 1 + 2) + 2 == 1027
    # the same widths with the naive backend: no SP-MoE, mlp_out stays
    naive = resolved(DSV3, parallel={"tp": 2, "dp": 4, "enable_expert_parallel": True},
                     engine={"all2all_backend": "naive"})
    assert not naive.resolution["sp_moe"] and not naive.resolution["routed_all2all"]
    assert naive.resolution["kernels_per_step"] == 3 * 14 + 58 * (16 + 2) + 2 == 1088


def test_routed_all2all_carries_top_k_times_the_bytes():
    def a2a_bytes(backend):
        d = resolved(DSV3, parallel={"tp": 2, "dp": 4, "enable_expert_parallel": True},
                     engine={"all2all_backend": backend})
        i = [c["op"] for c in d.resolution["collectives"]].index("All2All")
        return d.plan.arrays["coll_bytes_per_token"][i]
    assert a2a_bytes("naive") == 2 * HIDDEN
    assert a2a_bytes("deepep_low_latency") == 2 * HIDDEN * 8     # top_k 8


# ----------------------------------------------------------------------------- synthetic graphs

HID = 1024


def _graph(root, name, kinds, stack, head=(), weight_dtype="bf16"):
    path = root / "models" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "format": "jaxprice-model/1", "name": name, "hidden_size": HID, "vocab_size": 1000,
        "weight_dtype": weight_dtype, "layer_kinds": kinds, "stack": stack, "head": list(head)}))
    return path


def _synthetic(tmp_path, name, kinds, stack, head=(), tp=1, **kw):
    _graph(tmp_path, name, kinds, stack, head)
    s = scenario("llama-3.1-70b-instruct-h200-fp8-vllm-tp1", parallel={"tp": tp}, model=name, **kw)
    return resolve(s, Registry([tmp_path, BUNDLED]))


def gemm(n, k, **kw):
    return {"op": "GEMM", "n": n, "k": k, **kw}


FUSION_KIND = [
    gemm(2048, HID, role="q"),                                   # column-parallel (K == hidden)
    {"op": "AllReduce", "emit": "tensor_parallel"},              # dropped at tp 1, kept at tp 2
    gemm(512, HID, role="k"),
    gemm(512, HID, role="v"),
    {"op": "Attention", "kind": "gqa", "n_q": 16, "n_kv": 4, "d_h": 128},
    gemm(HID, 2048, role="o"),                                   # row-parallel: not fused
    gemm(4096, HID, role="gate"),                                # a fresh group after a row-parallel
    gemm(4096, HID, role="up"),
    gemm(HID, 4096, role="down"),
    gemm(HID, HID, role="square"),                               # N == hidden: not column-parallel
    gemm(HID, HID, role="square2"),
]


def test_gemm_fusion_merges_consecutive_column_parallel_gemms(tmp_path):
    dep = _synthetic(tmp_path, "fuse", {"L": FUSION_KIND}, {"pattern": ["L"], "repeat": 2})
    a = dep.plan.arrays
    # tp 1: the AllReduce is dropped and does not break fusion: q+k+v, o, gate+up, down, square x2
    np.testing.assert_array_equal(a["gemm_n"], [3072, HID, 8192, HID, HID, HID])
    np.testing.assert_array_equal(a["gemm_k"], [HID, 2048, HID, 4096, HID, HID])
    np.testing.assert_allclose(a["gemm_flops"], [2 * 3072 * HID, 2 * HID * 2048, 2 * 8192 * HID,
                                                 2 * HID * 4096, 2 * HID * HID, 2 * HID * HID])
    # fusion does not reduce the launch count: 9 GEMMs + 2 (Attention) per layer
    assert dep.resolution["kernels_per_step"] == 2 * (9 + 2)


def test_a_surviving_node_closes_fusion(tmp_path):
    dep = _synthetic(tmp_path, "fuse", {"L": FUSION_KIND}, {"pattern": ["L"], "repeat": 2}, tp=2)
    a = dep.plan.arrays
    # tp 2: the AllReduce survives between q and k, so q stands alone; sharded N is per rank
    # (q, k+v, o, gate+up, down, square, square2); row-parallel GEMMs shard K instead
    np.testing.assert_array_equal(a["gemm_n"], [2048 / 2, 1024 / 2, HID, 8192 / 2, HID, HID, HID])
    np.testing.assert_array_equal(a["gemm_k"], [HID, HID, 2048 / 2, HID, 4096 / 2, HID / 2, HID / 2])
    assert dep.resolution["kernels_per_step"] == 2 * (9 + 2 + 1)


NODES = {
    "Elementwise": {"op": "Elementwise"},
    "GEMM": gemm(2048, HID),
    "GroupedGEMM": {"op": "GroupedGEMM", "n": 512, "k": HID, "experts": 8, "top_k": 2},
    "Attention": {"op": "Attention", "kind": "gqa", "n_q": 16, "n_kv": 4, "d_h": 128},
    "RecurrentUpdate": {"op": "RecurrentUpdate", "recurrent_kind": "gdn", "n_heads": 8, "state_size": 128},
    "AllReduce": {"op": "AllReduce", "emit": ""},
    "AllGather": {"op": "AllGather", "emit": ""},
    "ReduceScatter": {"op": "ReduceScatter", "emit": ""},
    "All2All": {"op": "All2All", "emit": ""},
    "HyperConnection": {"op": "HyperConnection", "half": "pre", "bytes_per_token": 4096},
}
SPEC_KERNELS = {"GEMM": 1, "GroupedGEMM": 4, "Attention": 2, "Elementwise": 1, "RecurrentUpdate": 2,
                "AllReduce": 1, "AllGather": 1, "ReduceScatter": 1, "All2All": 2, "HyperConnection": 1}


@pytest.mark.parametrize("op", sorted(NODES))
def test_kernel_count_per_primitive(tmp_path, op):
    dep = _synthetic(tmp_path, "one", {"L": [NODES[op]]}, {"pattern": ["L"], "repeat": 5})
    assert dep.resolution["kernels_per_step"] == 5 * SPEC_KERNELS[op]
    assert KERNELS_PER_OP[op] == SPEC_KERNELS[op]
    splits = 1 if op in ("Attention", "RecurrentUpdate") else 0
    assert dep.resolution["piecewise_segments"] == 1 + 5 * splits


def test_kernel_counts_add_over_kinds_counts_and_head(tmp_path):
    kinds = {"A": [NODES["Elementwise"], NODES["GEMM"], NODES["Attention"]],        # 4 kernels
             "B": [NODES["GroupedGEMM"], NODES["All2All"], NODES["AllReduce"]],      # 7 kernels
             "unused": [NODES["GEMM"]]}
    stack = {"prologue": ["A"], "pattern": ["A", "B"], "repeat": 3, "epilogue": ["B"]}
    head = [NODES["Elementwise"], gemm(1000, HID)]
    dep = _synthetic(tmp_path, "mix", kinds, stack, head)
    assert dep.resolution["total_layers"] == 1 + 6 + 1
    assert dep.resolution["kernels_per_step"] == 4 * 4 + 4 * 7 + 2 == 46
    assert dep.plan.layer_kind_names == ("A", "B")
    np.testing.assert_array_equal(dep.plan.arrays["count"], [4, 4])
    assert dep.resolution["piecewise_segments"] == 4 + 1


def test_prefill_only_nodes_count_separately(tmp_path):
    kind = [gemm(2048, HID), {"op": "Elementwise", "phase": "prefill"}, gemm(HID, 2048, phase="prefill")]
    dep = _synthetic(tmp_path, "phase", {"L": kind}, {"pattern": ["L"], "repeat": 3})
    assert dep.resolution["kernels_per_step"] == 3 * 1
    assert dep.plan.scalars["kernels_prefill"] == 3 * 2


def test_sparse_mla_with_an_indexer_splits_twice_per_layer():
    dep = load_deployment("glm-5-h200-fp8-sglang-tp8", registry=REG)
    # section 2: segments = layers + sparse-MLA layers with a secondary attention + 1
    assert dep.resolution["total_layers"] == 78
    assert dep.resolution["piecewise_segments"] == 78 + 78 + 1 == 157


# ----------------------------------------------------------------------------- KV geometry


LLAMA70 = "llama-3.1-70b-instruct-h200-fp8-vllm-tp{}"


@pytest.mark.parametrize("tp,cache,expected", [
    (4, "bfloat16", 2 * (8 // 4) * 128 * 2 * 80),     # 81,920
    (4, "fp8", 2 * (8 // 4) * 128 * 1 * 80),          # 40,960
    (8, "bfloat16", 2 * (8 // 8) * 128 * 2 * 80),     # 40,960
    (8, "fp8", 2 * (8 // 8) * 128 * 1 * 80),          # 20,480
    (8, "auto", 2 * 1 * 128 * 2 * 80),                # auto on fp8 weights: 2 bytes
    (8, "float32", 2 * 1 * 128 * 4 * 80),
    (8, "nvfp4", 2 * 1 * 128 * 0.5625 * 80),
])
def test_gqa_kv_bytes_per_token(tp, cache, expected):
    dep = resolved(LLAMA70.format(tp), engine={"cache_dtype": cache})
    assert dep.plan.memory["kv_bytes_per_token"] == expected
    assert dep.resolution["cache_dtype"] == cache


def test_gqa_kv_heads_do_not_shard_below_one():
    # tp 16 > n_kv 8: max(1, 8 // 16) = 1 head per rank, the same as tp 8
    dep = resolved(LLAMA70.format(8), parallel={"tp": 16}, nodes=2, gpus_per_node=8, fabric="ib-400g")
    assert dep.plan.memory["kv_bytes_per_token"] == 2 * 1 * 128 * 1 * 80


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_latent_kv_does_not_shrink_with_tp(tp):
    for cache, width in (("fp8", 1), ("bfloat16", 2)):
        dep = resolved(DSV3, parallel={"tp": tp}, engine={"cache_dtype": cache})
        assert dep.plan.memory["kv_bytes_per_token"] == 576 * width * 61


def test_dsa_cache_layout_cell():
    # glm-5 (sparse MLA, d_h 576) with an fp8 cache: the backend lays out 656-byte fp8_ds_mla cells
    dep = load_deployment("glm-5-h200-fp8-sglang-tp8", registry=REG)
    assert dep.resolution["cache_layout"] == "fp8_ds_mla"
    assert dep.plan.memory["kv_bytes_per_token"] == 656 * 78


# ----------------------------------------------------------------------------- served format


GPT_OSS_HOPPER = [p.stem for p in SCENARIOS if p.stem.startswith(("gpt-oss-120b-h100-fp4", "gpt-oss-120b-h200-fp4"))]


@pytest.mark.parametrize("name", GPT_OSS_HOPPER)
def test_four_bit_weights_on_hopper_run_at_the_bf16_rate(name):
    dep = load_deployment(name, registry=REG)
    classes = dep.resolution["rate_classes"]
    assert classes == [("bf16", "bf16", dep.chip.bf16_tflops * 1e12)]
    assert set(dep.plan.arrays["gemm_class"]) == {0} and set(dep.plan.arrays["expert_class"]) == {0}
    assert "gemm_eps_max_bf16" in dep.coefficients and "gemm_eps_max_nvfp4" not in dep.coefficients


def test_four_bit_weights_on_blackwell_run_at_the_four_bit_rate():
    dep = load_deployment("gpt-oss-120b-b200-fp4-vllm-tp2", registry=REG)
    nv = [c for c in dep.resolution["rate_classes"] if c[0] == "nvfp4"]
    assert len(nv) == 1 and nv[0][2] == dep.chip.nvfp4_tflops * 1e12
    expert_class = dep.resolution["rate_classes"][int(dep.plan.arrays["expert_class"][0])]
    assert expert_class[0] == "nvfp4"


@pytest.mark.parametrize("quant,served", [("fp8", "fp8"), ("", "bf16"), ("modelopt_fp4", "nvfp4"),
                                          ("mxfp4", "mxfp4"), ("awq", "bf16")])
def test_served_format_from_quantization(quant, served):
    dep = resolved(LLAMA70.format(8), engine={"quantization": quant})
    assert dep.resolution["served_dtype"] == served
    peaks = {c[0] for c in dep.resolution["rate_classes"]}
    assert peaks == ({"fp8", "bf16"} if served == "fp8" else {"bf16"})      # H200: no 4-bit peak


def test_mxfp8_on_hopper_runs_at_the_bf16_rate():
    dep = resolved(LLAMA70.format(8), engine={"quantization": "mxfp8"})
    assert {c[:2] for c in dep.resolution["rate_classes"]} == {("bf16", "bf16")}


# ----------------------------------------------------------------------------- resolution stages


# resolve()'s pipeline, in order (resolve.py's docstring names what each decides)
STAGES = ("_check_coverage", "_documents", "_widths", "_coefficients_in_scope", "_served_formats",
          "_speculation", "_host_modes", "_layer_stack", "_experts", "_kv_layout", "_graph_walk",
          "_head", "_collectives", "_host_graph", "_weights", "_memory", "_prefill_attention",
          "_kind_arrays", "_row_arrays", "_coefficient_roles", "_plan_scalars", "_resolution")
# what the graph walk and the collectives stage call per kind, node or class
NODE_STAGES = ("_walk_kind", "_gemm", "_grouped_gemm", "_attention", "_recurrent", "_hyper_connection",
               "_collective_row")


def _recording(monkeypatch, names):
    import jaxprice._src.resolve as R
    calls = []

    def wrap(name, fn):
        def recorded(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)
        return recorded

    for name in names:
        monkeypatch.setattr(R, name, wrap(name, getattr(R, name)))
    return calls


def test_resolve_runs_each_stage_once_in_order_and_deterministically(monkeypatch):
    # a MoE model with recurrent mixers and a drafter: every stage has work to do
    s = scenario("qwen3.5-397b-a17b-b200-fp8-sglang-tp4", engine={"speculative": {"num_spec_tokens": 2}})
    plain = resolve(s, REG)
    calls = _recording(monkeypatch, STAGES + NODE_STAGES)
    dep = resolve(s, REG)
    assert [c for c in calls if c in STAGES] == list(STAGES)
    assert calls.count("_walk_kind") == len(dep.plan.layer_kind_names)
    assert any(n.startswith("drafter:") for n in dep.plan.layer_kind_names)
    assert {"_gemm", "_grouped_gemm", "_attention", "_recurrent", "_collective_row"} <= set(calls)
    # resolving again changes nothing: the plan, memory, provenance, coefficients, resolution
    assert dep.plan.digest == plain.plan.digest
    assert (dep.plan.memory, dep.plan.provenance, dep.resolution) == \
        (plain.plan.memory, plain.plan.provenance, plain.resolution)
    assert dep.coefficients.names == plain.coefficients.names
    np.testing.assert_array_equal(dep.coefficients.values, plain.coefficients.values)


def test_a_hyper_connection_resolves_through_its_stage(tmp_path, monkeypatch):
    calls = _recording(monkeypatch, ("_hyper_connection",))
    dep = _synthetic(tmp_path, "mhc", {"L": [NODES["HyperConnection"], NODES["GEMM"]]},
                     {"pattern": ["L"], "repeat": 3})
    assert calls == ["_hyper_connection"]        # once per distinct kind, not per layer
    np.testing.assert_array_equal(dep.plan.arrays["mhc_bytes_per_token"], [4096])
    assert dep.plan.coef["mhc_form"] == (None,)   # no measured mHC form in the llama sets


def test_refusals_name_the_pool_they_resolve(tmp_path):
    """A refusal from the resolver names the pool actually priced, not always pools[0]."""
    path = scenario_path("deepseek-v3-h200-fp8-sglang-tp8")
    docs = list(yaml.safe_load_all(path.read_text()))
    second = yaml.safe_load(yaml.safe_dump(docs[1]["pools"][0]))
    second["engine"]["quantization"] = "bogus"
    docs[1]["pools"].append(second)
    out = tmp_path / "two-pools.yaml"
    out.write_text(yaml.safe_dump_all(docs))
    load_deployment(out, registry=REG, pool_index=0)   # pool 0 is untouched and resolves
    with pytest.raises(JaxpriceError) as err:
        load_deployment(out, registry=REG, pool_index=1)
    assert "field 'Deployment.pools[1].engine.quantization', value 'bogus'" in str(err.value)


def test_admitted_entries_are_kept_per_set_objects_and_scope_values():
    """resolve._admitted caches the entries a scope admits: a hit needs the very same set objects
    and the same scope values; anything else is matched afresh."""
    from jaxprice._src.formats import CoefficientSet, Entry
    from jaxprice._src.resolve import _admitted

    def entry(name, value, **scope):
        return Entry(name=name, value=value, units="us", scope={k: tuple(v) for k, v in scope.items()}, cite="test")

    def cset(*entries):
        return CoefficientSet(name="t", entries=tuple(entries), source="test", path="t.yaml")
    a = cset(entry("x", 1.0, hardware=["h100"], tp=[1, 2]), entry("x", 2.0, hardware=["h100"], tp=[8]))
    b = cset(entry("x", 3.0, hardware=["H100"]))                 # a later set overrides; names match any case
    tp2 = {"hardware": "h100", "tp": 2}
    assert _admitted([a], tp2)["x"].value == 1.0
    assert _admitted([a], {"hardware": "h100", "tp": 8})["x"].value == 2.0
    assert _admitted([a], {"hardware": "b200", "tp": 2}) == {}
    assert _admitted([a, b], tp2)["x"].value == 3.0
    assert _admitted([a], tp2)["x"].value == 1.0                 # the cache keeps the sets apart
    a2 = cset(entry("x", 5.0, hardware=["h100"], tp=[2]))         # new objects: matched afresh
    assert _admitted([a2], tp2)["x"].value == 5.0
