"""Nemotron-H / Nemotron 3 (``NemotronHForCausalLM``) imported from their config.json, and the
ungated-expert extension (GroupedGEMM ``gated: false``, registry/EXTENSIONS.md) they use.

Every expected number is worked by hand from the config (vLLM nemotron_h.py's modules), not read
back from the importer: layer counts from the pattern, the Mamba2 mixer's widths, the experts,
and the parameter totals against NVIDIA's published counts. One small price call at the end.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from clirefusal import import_refused

import jaxprice as jp
from jaxprice import JaxpriceError, Registry, load_scenario, resolve
from jaxprice._src.hf import import_result
from jaxprice._src.resolve import scenario_path

HF = Path(__file__).resolve().parents[1] / "testdata" / "hf"
NANO = "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
NANO4 = "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"
SUPER = "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8"
SUPER4 = "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4"
ULTRA = "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4"
H56 = "nvidia--Nemotron-H-56B-Base-8K"
SHIPPED = (NANO, NANO4, SUPER, SUPER4, ULTRA, H56)


def _doc(folder):
    return import_result(HF / folder).doc


def _layers(doc):
    s = doc["stack"]
    return list(s["prologue"]) + list(s["pattern"]) * s["repeat"] + list(s["epilogue"])


def _node(nodes, op, role=None):
    hits = [n for n in nodes if n["op"] == op and (role is None or n.get("role") == role)]
    assert len(hits) == 1, (op, role, nodes)
    return hits[0]


def _params(doc, active=False):
    """Weight elements of the graph's GEMM nodes (n k each), its experts (2 n k each, ungated:
    every routed expert, or top_k of them when ``active``; the shared ones) and the input
    embedding (vocab x hidden, not a graph node)."""
    per_kind = {}
    for kid, nodes in doc["layer_kinds"].items():
        total = 0
        for n in nodes:
            if n["op"] == "GEMM":
                total += n["n"] * n["k"]
            elif n["op"] == "GroupedGEMM":
                assert n["gated"] is False
                routed = n["top_k"] if active else n["experts"]
                total += 2 * n["n"] * n["k"] * routed
                total += 2 * (n.get("shared_intermediate_size") or n["n"]) * n["k"] * n.get("shared_experts", 0)
        per_kind[kid] = total
    head = sum(n["n"] * n["k"] for n in doc["head"] if n["op"] == "GEMM")
    return sum(per_kind[k] for k in _layers(doc)) + head + doc["vocab_size"] * doc["hidden_size"]


# ----------------------------------------------------------------------------- layers from the pattern

@pytest.mark.parametrize("folder,layers,counts", [
    # hybrid_override_pattern, counted by hand: M Mamba2, E MoE, * attention, - MLP
    (NANO, 52, {"mamba": 23, "moe": 23, "attention": 6}),
    # NVFP4: layers 4, 11, 18, 25, 32, 41 keep their Mamba in/out_proj at bf16 (hf_quant_config)
    (NANO4, 52, {"mamba": 17, "mamba_unquantized": 6, "moe": 23, "attention": 6}),
    (SUPER, 88, {"mamba": 40, "moe": 40, "attention": 8}),
    (SUPER4, 88, {"mamba": 40, "moe": 40, "attention": 8}),
    (ULTRA, 108, {"mamba": 48, "moe": 48, "attention": 12}),     # layers_block_type, no num_hidden_layers
    (H56, 118, {"mamba": 54, "mlp": 54, "attention": 10}),
])
def test_the_layers_follow_the_pattern(folder, layers, counts):
    doc = _doc(folder)
    seq = _layers(doc)
    assert len(seq) == layers
    assert {k: seq.count(k) for k in set(seq)} == counts
    cfg = json.loads((HF / folder / "config.json").read_text())
    if "hybrid_override_pattern" in cfg:
        letter = {"mamba": "M", "mamba_unquantized": "M", "moe": "E", "attention": "*", "mlp": "-"}
        assert "".join(letter[k] for k in seq) == cfg["hybrid_override_pattern"]
    assert doc["max_model_len"] == (8192 if folder == H56 else 262144)


def test_nano_nodes():
    kinds = _doc(NANO)["layer_kinds"]
    # Mamba2: I = 64 heads x 64 = 4096; in_proj -> z (I), xBC (I + 2 x 8 groups x 128), dt (64 heads)
    assert [n["op"] for n in kinds["mamba"]] == ["Elementwise", "GEMM", "RecurrentUpdate", "GEMM", "AllReduce"]
    assert _node(kinds["mamba"], "GEMM", "mixer_in_proj") == {"op": "GEMM", "role": "mixer_in_proj",
                                                              "n": 4096 + 4096 + 2048 + 64, "k": 2688}
    assert _node(kinds["mamba"], "GEMM", "mixer_out") == {"op": "GEMM", "role": "mixer_out", "n": 2688, "k": 4096}
    assert _node(kinds["mamba"], "RecurrentUpdate") == {
        "op": "RecurrentUpdate", "recurrent_kind": "mamba2", "n_heads": 64, "d_h": 64, "state_size": 128,
        "n_groups": 8, "conv_kernel": 4, "intermediate_size": 4096, "state_dtype": "fp32"}
    # attention: 32 q heads, 2 kv heads of 128, no window; one norm per layer
    assert _node(kinds["attention"], "Attention") == {"op": "Attention", "kind": "gqa", "n_q": 32, "n_kv": 2, "d_h": 128}
    assert _node(kinds["attention"], "GEMM", "qkv_proj")["n"] == (32 + 2 * 2) * 128
    # MoE: 128 relu2 experts of 1856, top 6, one shared expert of 3712, ungated, no latent
    assert _node(kinds["moe"], "GroupedGEMM") == {
        "op": "GroupedGEMM", "role": "experts", "n": 1856, "k": 2688, "experts": 128, "top_k": 6,
        "gated": False, "shared_experts": 1, "shared_intermediate_size": 3712}
    assert sum(n["op"] == "Elementwise" for n in kinds["moe"]) == 1


def test_super_latent_experts():
    kinds = _doc(SUPER)["layer_kinds"]
    moe = kinds["moe"]
    # vLLM NemotronHMoE: shared MLP on the hidden state (1 x 5376), fc1_latent_proj 4096 -> 1024
    # and fc2_latent_proj 1024 -> 4096 (ReplicatedLinear), 512 experts of 2688 on the latent, top 22
    assert [n.get("role") for n in moe if n["op"] in ("GEMM", "GroupedGEMM")] == \
        ["shared_expert_up", "shared_expert_down", "moe_latent_in", "experts", "moe_latent_out"]
    assert _node(moe, "GEMM", "shared_expert_up") == {"op": "GEMM", "role": "shared_expert_up", "n": 5376, "k": 4096}
    assert _node(moe, "GEMM", "moe_latent_in") == {"op": "GEMM", "role": "moe_latent_in", "n": 1024, "k": 4096,
                                                   "replicated": True}
    assert _node(moe, "GEMM", "moe_latent_out") == {"op": "GEMM", "role": "moe_latent_out", "n": 4096, "k": 1024,
                                                    "replicated": True}
    assert _node(moe, "GroupedGEMM") == {"op": "GroupedGEMM", "role": "experts", "n": 2688, "k": 1024,
                                         "experts": 512, "top_k": 22, "latent_size": 1024, "gated": False}
    assert _node(moe, "All2All")["bytes_per_token"] == 2 * 1024
    # Mamba2: 128 heads x 64 = 8192; in_proj 2 x 8192 + 2 x 8 x 128 + 128
    assert _node(kinds["mamba"], "GEMM", "mixer_in_proj")["n"] == 18560


def test_nvfp4_exclusions_reach_their_layers():
    """Nano NVFP4's hf_quant_config keeps every attention layer's q/k/v/o (layers 5, 12, ..., 42),
    the in/out_proj of the Mamba layers 4, 11, 18, 25, 32, 41 and lm_head at bf16; the experts and
    the other 17 Mamba layers are nvfp4."""
    res = import_result(HF / NANO4)
    doc = res.doc
    assert doc["weight_dtype"] == "nvfp4"
    kinds = doc["layer_kinds"]
    assert _node(kinds["attention"], "GEMM", "qkv_proj")["weight_dtype"] == "bf16"
    assert _node(kinds["attention"], "GEMM", "o_proj")["weight_dtype"] == "bf16"
    assert "weight_dtype" not in _node(kinds["moe"], "GroupedGEMM")
    for role in ("mixer_in_proj", "mixer_out"):
        assert "weight_dtype" not in _node(kinds["mamba"], "GEMM", role)
        assert _node(kinds["mamba_unquantized"], "GEMM", role)["weight_dtype"] == "bf16"
    assert [i for i, k in enumerate(_layers(doc)) if k == "mamba_unquantized"] == [4, 11, 18, 25, 32, 41]
    assert _node(doc["head"], "GEMM", "lm_head")["weight_dtype"] == "bf16"
    # the same nodes as the bf16 checkpoint's, formats apart
    bf16 = _doc(NANO)["layer_kinds"]
    strip = lambda nodes: [{k: v for k, v in n.items() if k != "weight_dtype"} for n in nodes]   # noqa: E731
    assert strip(kinds["mamba_unquantized"]) == strip(kinds["mamba"]) == bf16["mamba"]


# ----------------------------------------------------------------------------- parameters

# Hand-worked (weight elements; norms, conv1d, A/D/dt, routers not counted: < 0.1%):
# Nano (h 2688): Mamba 10304 x 2688 + 4096 x 2688 = 38,707,200; attention 4608 x 2688 + 2688 x 4096
# = 23,396,352; MoE 128 x 2 x 1856 x 2688 = 1,277,165,568 + shared 2 x 3712 x 2688 = 19,955,712;
# embedding and lm_head 131072 x 2688 = 352,321,536 each.
NANO_TOTAL = 23 * 38_707_200 + 6 * 23_396_352 + 23 * (1_277_165_568 + 19_955_712) + 2 * 352_321_536
NANO_ACTIVE = 23 * 38_707_200 + 6 * 23_396_352 + 23 * (6 * 9_977_856 + 19_955_712) + 2 * 352_321_536
# Super (h 4096): Mamba 18560 x 4096 + 8192 x 4096 = 109,576,192; attention 4608 x 4096 + 4096 x 4096
# = 35,651,584; MoE 512 x 2 x 2688 x 1024 = 2,818,572,288 (5,505,024 an expert) + shared 2 x 5376 x
# 4096 = 44,040,192 + latent projections 2 x 1024 x 4096 = 8,388,608; 131072 x 4096 = 536,870,912.
SUPER_TOTAL = 40 * 109_576_192 + 8 * 35_651_584 + 40 * (2_818_572_288 + 44_040_192 + 8_388_608) + 2 * 536_870_912
SUPER_ACTIVE = 40 * 109_576_192 + 8 * 35_651_584 + 40 * (22 * 5_505_024 + 44_040_192 + 8_388_608) + 2 * 536_870_912

# Ultra (h 8192, layers_block_type): Mamba (2 x 16384 + 2048 + 256) x 8192 + 16384 x 8192 = 421,527,552;
# attention (8192 + 512) x 8192 + 8192 x 8192 = 138,412,032; MoE 512 x 2 x 5120 x 2048 (20,971,520 an
# expert) + shared 2 x 10240 x 8192 + latent 2 x 2048 x 8192 = 10,938,744,832. 56B (dense MLP):
# Mamba (2 x 16384 + 4096 + 256) x 8192 + 16384 x 8192 = 438,304,768 (256 heads, state 256);
# attention (8192 + 2048) x 8192 + 8192 x 8192 = 150,994,944; MLP 2 x 32768 x 8192 = 536,870,912.
ULTRA_TOTAL = 48 * 421_527_552 + 12 * 138_412_032 + 48 * 10_938_744_832 + 2 * 131072 * 8192
ULTRA_ACTIVE = ULTRA_TOTAL - 48 * (512 - 22) * 20_971_520
H56_TOTAL = 54 * 438_304_768 + 10 * 150_994_944 + 54 * 536_870_912 + 2 * 131072 * 8192


def test_parameters_match_the_published_counts():
    assert NANO_TOTAL == 31_569_076_224 and NANO_ACTIVE == 3_571_212_288
    assert SUPER_TOTAL == 120_582_045_696 and SUPER_ACTIVE == 12_683_575_296
    # NVIDIA: Nano 31.6B total, 3.2B active (3.6B with embeddings); Super 120B total, 12B active
    assert round(NANO_TOTAL / 1e9, 1) == 31.6 and round((NANO_ACTIVE - 352_321_536) / 1e9, 1) == 3.2
    assert round(NANO_ACTIVE / 1e9, 1) == 3.6
    assert round(SUPER_TOTAL / 1e9) == 121 and round((SUPER_ACTIVE - 536_870_912) / 1e9) == 12
    for folder, total, active in ((NANO, NANO_TOTAL, NANO_ACTIVE), (NANO4, NANO_TOTAL, NANO_ACTIVE),
                                  (SUPER, SUPER_TOTAL, SUPER_ACTIVE), (SUPER4, SUPER_TOTAL, SUPER_ACTIVE)):
        doc = _doc(folder)
        assert _params(doc) == total, folder
        assert _params(doc, active=True) == active, folder
    # Ultra 550B-A55B: 549.1B total, 55.85B active; Nemotron-H-56B: 56.3B, dense
    assert (round(ULTRA_TOTAL / 1e9, 1), round(ULTRA_ACTIVE / 1e9, 2)) == (549.1, 55.85)
    assert round(H56_TOTAL / 1e9, 1) == 56.3
    assert (_params(_doc(ULTRA)), _params(_doc(ULTRA), active=True)) == (ULTRA_TOTAL, ULTRA_ACTIVE)
    assert _params(_doc(H56)) == H56_TOTAL


# ----------------------------------------------------------------------------- refusals

def _write(tmp_path, cfg):
    p = tmp_path / "nvidia--Nemotron-test"
    p.mkdir(exist_ok=True)
    (p / "config.json").write_text(json.dumps(cfg))
    return p / "config.json"


def _cfg(folder=NANO):
    return json.loads((HF / folder / "config.json").read_text())


def test_refusals_name_file_key_and_value(tmp_path):
    c = _cfg()
    c["hybrid_override_pattern"] = c["hybrid_override_pattern"][:-1]
    import_refused(_write(tmp_path, c), "hybrid_override_pattern", 51, r"has 51 entries for 52 layers \(num_hidden_layers\)")
    c = _cfg()
    c["hybrid_override_pattern"] = "X" + c["hybrid_override_pattern"][1:]
    import_refused(_write(tmp_path, c), "hybrid_override_pattern", "X", "unknown layer type at layer 0")
    c = _cfg()
    del c["hybrid_override_pattern"]
    import_refused(_write(tmp_path, c), "hybrid_override_pattern", None, "required key is missing")
    u = _cfg(ULTRA)
    u["layers_block_type"][3] = "ssm"
    import_refused(_write(tmp_path, u), "layers_block_type", "ssm", "unknown layer type at layer 3")
    u = _cfg(ULTRA)
    u["num_hidden_layers"] = 100
    import_refused(_write(tmp_path, u), "layers_block_type", 108, r"has 108 entries for 100 layers")
    # a non-finite literal where the importer reads: refused; where it does not: imported
    text = (HF / NANO / "config.json").read_text()
    p = _write(tmp_path, {})
    p.write_text(text.replace('"hidden_size": 2688', '"hidden_size": Infinity'))
    import_refused(p, "hidden_size", "Infinity", "not a finite number")
    p.write_text(text.replace('"ssm_state_size": 128', '"ssm_state_size": NaN'))
    import_refused(p, "ssm_state_size", "NaN", "not a finite number")
    p.write_text(text.replace('"time_step_max": 0.1', '"time_step_max": -Infinity'))
    assert import_result(p).doc["layer_kinds"] == _doc(NANO)["layer_kinds"]


def test_null_shared_experts_are_none(tmp_path):
    """vLLM NemotronHMoE: n_shared_experts null (or 0) builds no shared experts."""
    for val in (None, 0):
        c = _cfg()
        c["n_shared_experts"] = val
        moe = import_result(_write(tmp_path, c)).doc["layer_kinds"]["moe"]
        assert _node(moe, "GroupedGEMM") == {"op": "GroupedGEMM", "role": "experts", "n": 1856, "k": 2688,
                                             "experts": 128, "top_k": 6, "gated": False}


def test_super_states_infinity_where_nothing_reads_it():
    assert "Infinity" in (HF / SUPER / "config.json").read_text()      # "time_step_limit": [0.0, Infinity]
    assert _doc(SUPER)["hidden_size"] == 4096


# ----------------------------------------------------------------------------- gated: false

DSV3 = "deepseek-v3-h200-fp8-sglang-tp8"
# tests/test_resolve.py::test_deepseek_v3_h200_tp8_hand_derived: 3 dense + 58 MoE layers, fp8, tp8
ATTN_GEMMS = 2112 * 7168 + 24576 * 1536 + 32768 * 512 + 7168 * 16384
DENSE_MLP = 36864 * 7168 + 7168 * 18432
VOCAB, HIDDEN = 129280, 7168
# Recorded from the tree before `gated` existed (git HEAD, same machine): float.hex of the decode
# price of 32 requests at context 4096 (pad_to 64, threshold 8) and of weights_bytes; Qwen3.5's
# prices recorded again when its GDN decode came to be charged by the heads a rank runs
# (KNOWN DIVERGENCE [recurrent-rate-geometry]: 10.92 -> 9.18 ms NoOverlap; its weights unchanged)
BEFORE = {DSV3: ("0x1.a3d33b8a74cefp-6", "0x1.8b0e71279de9fp-6", "0x1.386bc60000000p+36"),
          "qwen3.5-397b-a17b-b200-fp8-sglang-tp8": ("0x1.2cc78d192947fp-7", "0x1.1060db3cfd7d9p-7",
                                                    "0x1.6df2800000000p+35")}


class _Swapped(Registry):
    """The bundled registry with one model graph replaced."""

    def __init__(self, graph):
        super().__init__()
        self._graph = graph

    def model(self, name, **kw):
        return self._graph


def _with_gated(dep, gated):
    g = dep.graph
    kinds = {k: tuple(dict(n, gated=gated) if n["op"] == "GroupedGEMM" else n for n in nodes)
             for k, nodes in g.layer_kinds.items()}
    return resolve(load_scenario(scenario_path(DSV3)), _Swapped(dataclasses.replace(g, layer_kinds=kinds)))


def test_ungated_experts_read_two_thirds_of_the_gated_weights():
    dep = jp.load_deployment(DSV3)
    gated, ungated = _with_gated(dep, True), _with_gated(dep, False)
    a, b = gated.plan.arrays, ungated.plan.arrays
    moe = np.asarray(a["expert_bytes"]) > 0
    assert moe.any()
    # one expert: 3 x 2048 x 7168 fp8 bytes gated, 2 x 2048 x 7168 ungated (exactly 2/3), FLOPs 6 n k -> 4 n k
    np.testing.assert_array_equal(np.asarray(b["expert_bytes"]) * 3, np.asarray(a["expert_bytes"]) * 2)
    np.testing.assert_array_equal(np.asarray(b["expert_flops"]) * 3, np.asarray(a["expert_flops"]) * 2)
    assert float(np.asarray(a["expert_bytes"])[moe][0]) == 3 * 2048 * 7168 / 8      # sharded over tp 8
    assert float(np.asarray(b["expert_bytes"])[moe][0]) == 2 * 2048 * 7168 / 8
    # weights per rank by hand: routed (256) and shared (1) experts at 2 matrices each, over tp 8
    weights = (3 * (ATTN_GEMMS + DENSE_MLP) + 58 * (ATTN_GEMMS + 2 * 2048 * 7168 * (256 + 1))
               + 2 * VOCAB * HIDDEN) / 8
    assert ungated.plan.memory["weights_bytes"] == pytest.approx(weights, rel=1e-12)
    # a graph stating gated: true is the bundled graph, bit for bit
    assert gated.plan.memory["weights_bytes"] == dep.plan.memory["weights_bytes"]
    np.testing.assert_array_equal(np.asarray(a["expert_bytes"]), np.asarray(dep.plan.arrays["expert_bytes"]))


def test_a_gated_field_that_is_not_a_boolean_isimport_refused():
    from jaxprice._src.formats import _parse_node
    from jaxprice._src.hf import graph_from_doc
    doc = copy.deepcopy(_doc(NANO))
    graph_from_doc(doc, "g.yaml")
    _node(doc["layer_kinds"]["moe"], "GroupedGEMM")["gated"] = "no"
    with pytest.raises(JaxpriceError, match=r"gated.*true or false") as info:
        graph_from_doc(doc, "g.yaml")
    assert "layer_kinds.moe" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(JaxpriceError, match="gated must be true or false"):
        _parse_node({"op": "GroupedGEMM", "n": 8, "k": 8, "experts": 2, "top_k": 1, "gated": 1},
                    file="g.yaml", where="layer_kinds.moe[1]")


def test_bundled_graphs_price_as_before():
    batch = jp.Batch.decode(32, 4096, pad_to=64, decode_threshold=8)
    for name, (no_overlap, overlap, weights) in BEFORE.items():
        dep = jp.load_deployment(name)
        assert dep.plan.memory["weights_bytes"] == float.fromhex(weights), name
        r = jp.price(dep.plan, dep.coefficients, batch)
        assert float(r.no_overlap) == pytest.approx(float.fromhex(no_overlap), rel=1e-14, abs=0), name
        assert float(r.overlap) == pytest.approx(float.fromhex(overlap), rel=1e-14, abs=0), name


# ----------------------------------------------------------------------------- it prices

def test_nano_prices_by_its_bundled_name(capsys):
    """The bundled name resolves to the shipped config and decode steps price on one H200, bound
    by HBM (the one CLI price call of this file)."""
    from jaxprice._src.hf import bundled_config
    from jaxprice.cli import main
    name = "nvidia-nemotron-3-nano-30b-a3b-bf16"
    assert bundled_config(name) == HF / NANO
    assert main(["price", name, "--chip", "h200", "--tp", "1", "--decode", "1,8"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+(1|8)\s", line)]
    assert [r[0] for r in rows] == ["1", "8"]
    assert all(float(r[-3]) > 0 and r[-1] == "hbm" for r in rows), out


def test_the_mtp_block_of_super_and_ultra_is_their_drafter(tmp_path):
    """Super and Ultra ship one MTP block (num_nextn_predict_layers 1) whose layers the config
    spells like the target's: Super's mtp_hybrid_override_pattern '*E', Ultra's
    mtp_layers_block_type [attention, moe] (vLLM nemotron_h_mtp.py): the drafter is an attention
    layer and a MoE layer of the target's kinds, drafting one token; Nano states none. A layer
    type the target has no kind of is refused, naming the key."""
    for folder in (SUPER, ULTRA):
        spec = import_result(HF / folder).doc["speculator"]
        assert spec == {"method": "nemotron_h_mtp", "num_spec_tokens": 1,
                        "stack": {"pattern": ["attention", "moe"], "repeat": 1}}, folder
    assert "speculator" not in import_result(HF / NANO).doc
    bad = json.loads((HF / SUPER / "config.json").read_text())
    bad["mtp_hybrid_override_pattern"] = "*X"
    import_refused(_write(tmp_path, bad), "mtp_hybrid_override_pattern", "X", "MTP layer type the model has no")
    bad["mtp_hybrid_override_pattern"] = "-"          # Super has no plain MLP layer
    import_refused(_write(tmp_path, bad), "mtp_hybrid_override_pattern", "mlp", "MTP layer type the model has no")
