"""Points measured with speculative decoding (the spec_decode column, e.g. InferenceX's DeepSeek-R1
runs with MTP): priced by the serving simulation with the recipe's draft count (else the model
graph's own MTP layers) and a stated, assumed acceptance, never refused for want of a scenario
file; a method the graph has no drafter for is refused with its reason.

Lean: one deepseek-v3 SGLang deployment at C = 2 and 4 (20 and 40 prompts) simulated once and
re-priced with other acceptances (the compiled kernels are shared), one gpt-oss sweep of two
points for the unchanged spec_decode=none prices; everything else is refused before pricing.
"""

from __future__ import annotations

import csv
import dataclasses
import math

import pytest
from clirefusal import assert_refused, refused

from jaxprice import accuracy as acc
from jaxprice import JaxpriceError

FIELDS = ("corpus,scenario,deployment,model,hardware,dtype,engine,tp,ep,dp,spec_decode,workload,isl,osl,"
          "concurrency,quantity,value,unit,relative_to_sweep_anchor,anchor_concurrency").split(",")
DSR1 = "deepseek-v3-b200-fp8-sglang-tp8"          # a bundled scenario; InferenceX's recipe drafts 2
DEV = "/work/shared/measured/inferencex_vllm_dev.csv"


def _rows(deployment, model, hardware, dtype, engine, tp, ep, dp, spec, concs, scenario=None):
    out = []
    for c in concs:
        for q, v in (("mean_tpot", 5000.0 + 100 * c), ("mean_ttft", 90000.0 + 1000 * c)):
            out.append(dict(corpus="test", scenario=scenario or f"{deployment}-cfg1.yaml", deployment=deployment,
                            model=model, hardware=hardware, dtype=dtype, engine=engine, tp=tp, ep=ep, dp=dp,
                            spec_decode=spec, workload="1k1k", isl=1024, osl=1024, concurrency=c, quantity=q,
                            value=v, unit="us", relative_to_sweep_anchor=1.0, anchor_concurrency=concs[0]))
    return out


def _write(path, rows, fields=FIELDS):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(fields))
        w.writeheader()
        w.writerows(rows)
    return path


def _point(model="deepseek-v3", hardware="b200", dtype="fp8", engine="sglang", dp=1, spec="mtp", stated=None):
    return acc.Point(row=2, scenario="s-cfg1.yaml", deployment="s", model=model, hardware=hardware, dtype=dtype,
                     engine=engine, tp=8, ep=8 if dp > 1 else 1, dp=dp, workload="1k1k", isl=1024, osl=1024,
                     concurrency=4, measured=5e-3, anchor_concurrency=4, spec_decode=spec, stated=stated)


@pytest.fixture(scope="module")
def mtp_csv(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("spec") / "mtp.csv",
                  _rows(DSR1, "deepseek-v3", "b200", "fp8", "sglang", 8, 1, 1, "mtp", (2, 4)))


@pytest.fixture(scope="module")
def priced(mtp_csv):
    """The mtp sweep under the default (assumed) acceptance and two given ones: TPOT by acceptance."""
    out = {}
    for a in (None, 1.0, 3.0):
        rep = acc.evaluate_accuracy(mtp_csv, batch_rule="simulate", acceptance=a)
        out[a] = rep
    return out


# ----------------------------------------------------------------------------- the recipes' draft counts


def test_draft_count_is_the_recipes_with_its_source_else_the_graphs():
    """SGLang's DeepSeek-R1 MTP recipes draft 2 (num-steps 2, 3 draft tokens), TensorRT-LLM's 3, or 1
    with DP attention (the dp column > 1), GLM-5's 3; with no recipe read (vLLM here), the graph's own
    speculator (deepseek-v3: 1 MTP layer), said so. The acceptance is assumed and says so."""
    def spec(**kw):
        return acc.speculation_assumptions(_point(**kw))
    sg = spec()
    assert sg["num_spec_tokens"][0] == 2 and "dsr1_fp8_b200_mtp.sh" in sg["num_spec_tokens"][1]
    assert sg["spec_method"][0] == "deepseek_mtp"
    assert sg["acceptance"][0] == pytest.approx(1 + 0.7 + 0.7 ** 2) and "ASSUMED, not measured" in sg["acceptance"][1]
    assert spec(engine="trt", dtype="fp4")["num_spec_tokens"][0] == 3
    dpa = spec(engine="trt", dtype="fp4", dp=8)["num_spec_tokens"]
    assert dpa[0] == 1 and "dsr1_fp4_b200_trt_mtp.sh" in dpa[1] and "DP attention" in dpa[1]
    assert spec(engine="trt", hardware="h200")["num_spec_tokens"][0] == 3
    assert spec(hardware="h200")["num_spec_tokens"][0] == 2
    assert spec(model="glm-5", dtype="fp8")["num_spec_tokens"][0] == 3
    fallback = spec(engine="vllm", dtype="fp4")["num_spec_tokens"]
    assert fallback[0] == 1 and "no InferenceX MTP recipe" in fallback[1] and "graph's own speculator" in fallback[1]
    # a --settings row's draft count and acceptance win; --acceptance over both
    stated = spec(stated=(("acceptance", 2.5), ("num_speculative_tokens", 4)))
    assert (stated["num_spec_tokens"][0], stated["acceptance"][0]) == (4, 2.5)
    assert "--settings" in stated["num_spec_tokens"][1]
    p = _point(stated=(("acceptance", 2.5),))
    assert acc.speculation_assumptions(dataclasses.replace(p, acceptance=1.2))["acceptance"][0] == 1.2
    assert acc.speculation_assumptions(_point(spec="none")) == {}


def test_the_recipe_deployment_prices_the_drafter():
    """The run's deployment states engine.speculative: the plan carries the drafter (its MTP layer,
    one pass per drafted token) and decode rows of 1 + k tokens."""
    p = _point()
    base, _ = acc.build_deployment(p)
    assert not base.plan.scalars["drafter"]
    dep = acc.recipe_deployment(base, acc.engine_assumptions(p))
    assert dep.scenario.engine["speculative"] == {"num_spec_tokens": 2, "method": "deepseek_mtp"}
    s = dep.plan.scalars
    assert s["drafter"] and s["drafter_passes"] == 2 and s["uniform_width"] == 3
    assert dep.resolution["decode_threshold"] == 3
    assert any(n.startswith("drafter:") for n in dep.plan.layer_kind_names)


# ----------------------------------------------------------------------------- priced, and by acceptance


def test_an_mtp_point_is_priced_with_the_recipe_and_the_assumed_acceptance(priced):
    rep = priced[None]
    assert rep.refused == [] and [r["status"] for r in rep.records] == ["priced", "priced"]
    for r in rep.records:
        assert "spec=deepseek_mtp spec_tokens=2 acceptance(assumed)=2.19" in r["assumptions"]
        assert math.isfinite(r["no_overlap_tpot_us"]) and r["no_overlap_tpot_us"] > 0
    assert any("ASSUMED, not measured" in n for n in rep.info["notes"])
    text = "\n".join(acc.format_assumptions(rep, markdown=True))
    assert "acceptance (ASSUMED)" in text and "dsr1_fp8_b200_mtp.sh" in text


def test_more_accepted_tokens_lower_tpot(priced):
    """TPOT falls as the acceptance rises (1 < 2.19 assumed < 3), about as 1 / acceptance: the
    closed loop keeps C rows, so the steps cost about the same."""
    tpot = {a: [r["no_overlap_tpot_us"] for r in rep.records] for a, rep in priced.items()}
    for j in range(2):
        assert tpot[1.0][j] > tpot[None][j] > tpot[3.0][j]
        assert tpot[1.0][j] / tpot[None][j] == pytest.approx(2.19, rel=0.1)
    assert "acceptance(assumed)=3.0" in priced[3.0].records[0]["assumptions"]


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("value,words", [
    ("0.5", ("--acceptance", "0.5", ">= 1")),
    ("nan", ("--acceptance", "nan")),
    ("3.5", ("--acceptance", "3.5", "1 + num_speculative_tokens = 3", "line 2", "k = 2")),
])
def test_a_bad_acceptance_is_refused_in_one_line(capsys, mtp_csv, value, words):
    assert_refused(capsys, ["accuracy", str(mtp_csv), "--acceptance", value, "--quiet"], *words)


def test_a_bad_acceptance_argument_is_refused_by_the_library(mtp_csv):
    refused(lambda: acc.evaluate_accuracy(mtp_csv, batch_rule="simulate", acceptance=0.5), "acceptance", "0.5")
    refused(lambda: acc.evaluate_accuracy(mtp_csv, batch_rule="simulate", acceptance=float("nan")), "acceptance")
    refused(lambda: acc.evaluate_accuracy(mtp_csv, batch_rule="simulate", acceptance=4.0), "acceptance", "4.0",
            "[1, 1 + num_speculative_tokens = 3]")
    refused(lambda: acc.evaluate_accuracy(mtp_csv, batch_rule="anchor", acceptance=2.0), "acceptance",
            "serving simulation")


@pytest.mark.parametrize("k,a,field,words", [
    ("2", "0.5", "acceptance", ("'0.5'", ">= 1")),
    ("2", "nan", "acceptance", ("'nan'",)),
    ("2", "3.5", "acceptance", ("'3.5'", "1 + num_speculative_tokens = 3")),
    ("0", "", "num_speculative_tokens", ("'0'", "at least 1")),
    ("1.5", "", "num_speculative_tokens", ("'1.5'", "integer")),
    ("", "3.5", "acceptance", ("3.5", "k = 2", "line 2")),        # above the recipe's k = 2 + 1
])
def test_bad_settings_columns_are_refused_naming_file_row_column_value(capsys, tmp_path, mtp_csv, k, a, field,
                                                                        words):
    s = tmp_path / "flags.csv"
    s.write_text("scenario,label,concurrency,num_speculative_tokens,acceptance\n"
                 f"{DSR1}-cfg1.yaml,1k1k,2,{k},{a}\n")
    assert_refused(capsys, ["accuracy", str(mtp_csv), "--settings", str(s), "--quiet"],
                   f"{s}:2", f"field '{field}'", *words)


def test_a_method_the_graph_has_no_drafter_for_is_refused_with_its_reason(tmp_path):
    """EAGLE on deepseek-v3 (its speculator is its MTP layer) and MTP on gpt-oss (no speculator):
    refused per point with the reason; a spec_decode=none point of the same deployment is kept."""
    rows = (_rows(DSR1, "deepseek-v3", "b200", "fp8", "sglang", 8, 1, 1, "eagle", (2,))
            + _rows("gpt-oss-120b-b200-fp4-vllm-tp1", "gpt-oss-120b", "b200", "fp4", "vllm", 1, 1, 1, "mtp", (4,)))
    rep = acc.evaluate_accuracy(_write(tmp_path / "nodrafter.csv", rows), batch_rule="simulate")
    reasons = sorted(r["reason"] for r in rep.refused)
    assert len(reasons) == 2 and rep.summary["no_overlap"]["all"]["priced"] == 0
    assert "value 'eagle'" in reasons[0] and "no drafter for this method in the deepseek-v3 graph" in reasons[0]
    assert "deepseek_mtp" in reasons[0]
    assert "value 'mtp'" in reasons[1] and "gpt-oss-120b graph has no drafter" in reasons[1]
    assert all("\n" not in r for r in reasons)
    # the static rules price 1-token decode rows: a speculating point is refused there, saying so
    only = _write(tmp_path / "mtp_anchor.csv", _rows(DSR1, "deepseek-v3", "b200", "fp8", "sglang", 8, 1, 1, "mtp",
                                                      (2,)))
    static = acc.evaluate_accuracy(only, batch_rule="anchor")
    assert len(static.refused) == 1 and "batch rule 'simulate' prices the drafts" in static.refused[0]["reason"]


# ----------------------------------------------------------------------------- spec_decode=none unchanged


def test_points_without_speculation_are_priced_as_before(tmp_path):
    """Two dev points (gpt-oss-120b on one B200, 1k1k, C = 4 and 8), priced before speculation was
    read: the same TPOT and TTFT (to the last bits; 1e-12 leaves room for another platform's ulp) and
    no speculation in their assumptions."""
    with open(DEV, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["scenario"] == "gpt-oss-120b-b200-fp4-vllm-tp1-cfg1.yaml"
                and r["workload"] == "1k1k" and r["concurrency"] in ("4", "8")]
    assert len(rows) == 4
    rep = acc.evaluate_accuracy(_write(tmp_path / "none.csv", rows, fields=rows[0].keys()), batch_rule="simulate")
    got = [(r["no_overlap_tpot_us"], r["overlap_tpot_us"], r["no_overlap_ttft_us"]) for r in rep.records]
    before = [(3116.7387421688154, 3027.122386168616, 58710.66914988308),
              (4149.234010336891, 4055.54332947421, 61042.32144106758)]
    for g, b in zip(got, before):
        assert g == pytest.approx(b, rel=1e-12, abs=0)
    assert all("spec" not in r["assumptions"] and "acceptance" not in r["assumptions"] for r in rep.records)


def test_minimax_m3_drafts_three_with_its_eagle3_head_not_its_seven_mtp_layers():
    """InferenceX's MiniMax-M3 'mtp' runs draft 3 tokens with a separate EAGLE3 head on every chip
    (minimaxm3_*_mtp.sh); the graph's own speculator would have said 7."""
    for hardware, dtype in (("b200", "fp8"), ("h200", "fp8"), ("b300", "fp4")):
        a = acc.speculation_assumptions(_point("minimax-m3", hardware, dtype, "vllm", stated={}))
        assert a["num_spec_tokens"][0] == 3 and "eagle3" in a["num_spec_tokens"][1]
        assert "[eagle3-head]" in a["num_spec_tokens"][1]
        assert a["acceptance"][0] == pytest.approx(1 + 0.7 + 0.7 ** 2 + 0.7 ** 3)
    # a chip no script covers still takes the graph's own count, said so
    other = acc.speculation_assumptions(_point("minimax-m3", "gb200-nvl72", "fp4", "vllm", stated={}))
    assert "no InferenceX MTP recipe read" in other["num_spec_tokens"][1]


def test_one_acceptance_for_points_of_several_draft_counts_is_capped_at_each_ones_bound():
    """--acceptance is one value for every point: where a point's k is too small for it, it is
    capped at 1 + k (said so), as size's --acceptance is; it is refused only where no point's k
    admits it."""
    k1 = dataclasses.replace(_point(engine="trt", dp=8, stated={}), acceptance=2.19)     # TRT with DP attention: 1
    k2 = dataclasses.replace(_point(stated={}), acceptance=2.19)                        # SGLang DeepSeek-R1: 2
    a1, a2 = acc.speculation_assumptions(k1), acc.speculation_assumptions(k2)
    assert a1["num_spec_tokens"][0] == 1 and a1["acceptance"][0] == 2.0 and "capped at 1 + k = 2" in a1["acceptance"][1]
    assert a2["acceptance"] == (2.19, "--acceptance (ASSUMED, not measured: the value given)")
    acc.check_speculation_inputs([k1, k2])                          # admitted by k2's bound: no refusal
    refused(lambda: acc.check_speculation_inputs([k1]), "field 'acceptance'", "value 2.19",
            "1 + num_speculative_tokens = 2", "k = 1")


def test_settings_speculation_columns_on_a_point_without_speculation_are_said_unused():
    """A --settings row's acceptance or draft count for a point measured without speculation was
    ignored without a word."""
    from jaxprice._src.accuracy import _speculation_note
    plain = _point(spec="none", stated=(("acceptance", 2.0),))
    info: dict = {}
    _speculation_note([plain, _point(spec="none", stated=())], info, "simulate")
    (note,) = info["notes"]
    assert note.startswith("1 point(s) measured without speculative decoding") and "not used" in note
    info = {}
    _speculation_note([_point(spec="none", stated=())], info, "simulate")
    assert info == {}


# ----------------------------------------------------------------------------- the drafter comes from the registry priced with


def _registry_with(tmp_path, name, speculator_line):
    """A registry root whose models/<name>.yaml is the bundled deepseek-v3 graph renamed, its
    speculator line replaced (``None``: removed); the bundled registry behind it."""
    from jaxprice._src.formats import Registry, default_registry_root
    src = (default_registry_root() / "models" / "deepseek-v3.yaml").read_text().splitlines()
    lines = [f"name: {name}" if ln.startswith("name:") else ln for ln in src if not ln.startswith("speculator:")]
    if speculator_line is not None:
        lines.append(speculator_line)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / f"{name}.yaml").write_text("\n".join(lines) + "\n")
    return Registry([tmp_path, default_registry_root()])


def test_drafter_read_from_the_registry_the_point_is_priced_with(tmp_path):
    """A model only a caller's registry holds: its point's drafter (method, MTP layer count) is
    read from that registry, not refused as unknown by the bundled one."""
    reg = _registry_with(tmp_path, "my-dsv3", "speculator: {method: deepseek_mtp, num_spec_tokens: 3, "
                                              "stack: {pattern: [attn_moe], repeat: 1}}")
    p = _point(model="my-dsv3")
    with pytest.raises(JaxpriceError, match="my-dsv3"):
        acc.speculation_assumptions(p)                    # the bundled registry has no such model
    a = acc.speculation_assumptions(acc.with_registry([p], reg)[0])
    assert a["spec_method"][0] == "deepseek_mtp"
    assert a["num_spec_tokens"][0] == 3                   # no InferenceX recipe for it: the graph's own count


def test_registry_without_a_drafter_refuses_what_the_bundled_one_prices(tmp_path):
    """The same model name shadowed by a caller's graph with no speculator: refused (no drafter),
    where the bundled graph prices it; with_registry leaves a point that names one alone."""
    reg = _registry_with(tmp_path, "deepseek-v3", None)
    p = _point()
    assert acc.speculation_assumptions(p)["num_spec_tokens"][0] == 2          # bundled graph, SGLang's recipe
    with pytest.raises(JaxpriceError, match="no drafter"):
        acc.speculation_assumptions(acc.with_registry([p], reg)[0])
    named = acc.with_registry([p], reg)[0]
    assert acc.with_registry([named], object())[0].registry is reg
    assert acc.with_registry([p], None) == [p] and acc.with_registry([p], None)[0].registry is None


def test_evaluate_accuracy_reads_the_drafter_from_its_registry(tmp_path, mtp_csv):
    """evaluate_accuracy(registry=...) prices each point with that registry's graph: one whose
    deepseek-v3 has no drafter refuses the MTP points (before any pricing) with that reason."""
    reg = _registry_with(tmp_path, "deepseek-v3", None)
    rep = acc.evaluate_accuracy(mtp_csv, batch_rule="simulate", registry=reg)
    assert [r["status"] for r in rep.records] == ["refused", "refused"]
    assert all("no drafter" in r["reason"] for r in rep.records)
