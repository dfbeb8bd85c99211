"""The accuracy harness (jaxprice.accuracy, `jaxprice accuracy`) on the committed excerpt of the
development set (testdata/measured/inferencex_vllm_excerpt.csv: 21 points in 5 sweeps over 4
deployments, one from a bundled scenario, three from the columns).

Metrics are checked against numbers worked out by hand; predictions against an independent
``jp.price`` of the anchor's batch; refused points and malformed files against the exact
reason, file, line and column.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

import jaxprice as jp
from jaxprice import accuracy as acc
from jaxprice.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
EXCERPT = ROOT / "testdata" / "measured" / "inferencex_vllm_excerpt.csv"
GPT = "gpt-oss-120b-h200-fp4-vllm-tp1"
KIMI_INT4 = "kimi-k2.5-h200-int4-vllm-tp8"
MINIMAX = "minimax-m2.5-b300-fp8-vllm-tp1"
EPDP = "minimax-m2.5-b200-fp4-vllm-tp2-ep2-dp2"


@pytest.fixture(scope="module")
def report():
    return acc.evaluate_accuracy(EXCERPT)


def rows_of(path=EXCERPT):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def write_rows(path, rows, fields=None):
    fields = fields or list(rows[0].keys())
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


def record(report, deployment, concurrency, scenario_suffix="cfg1.yaml"):
    (r,) = [r for r in report.records if r["deployment"] == deployment and r["concurrency"] == concurrency
            and r["scenario"].endswith(scenario_suffix)]
    return r


# ----------------------------------------------------------------------------- reading


def test_reads_the_tpot_rows_in_seconds_with_their_line_numbers():
    points, info = acc.read_measurements(EXCERPT)
    assert (info["rows"], info["points"], info["other_quantity_rows"]) == (42, 21, 21)
    assert info["anchor_mismatch"] == []
    raw = rows_of()
    first = points[0]
    assert first.row == 2 and raw[0]["quantity"] == "mean_tpot"
    assert first.measured == pytest.approx(float(raw[0]["value"]) * 1e-6, rel=1e-15)
    assert (first.deployment, first.concurrency, first.isl, first.osl, first.context) == (GPT, 4, 8192, 1024, 8704)
    assert {p.deployment for p in points} == {GPT, KIMI_INT4, MINIMAX, EPDP}
    assert len({p.sweep for p in points}) == 5
    # every second line is the TTFT row of the same point
    assert [p.row for p in points] == list(range(2, 44, 2))


def test_padding_is_the_next_power_of_two_of_the_largest_concurrency():
    assert [acc.padding(c) for c in (1, 2, 3, 4, 5, 64, 65, 1024, 2048)] == [1, 2, 4, 4, 8, 64, 128, 1024, 2048]
    points, _ = acc.read_measurements(EXCERPT)
    groups, refused = acc.group_points(points)
    assert refused == []
    rows = {g.name: np.shape(g.batches.scheduled) for g in groups}
    assert rows == {GPT: (10, 64), KIMI_INT4: (5, 64), MINIMAX: (3, 16), EPDP: (3, 1024)}
    g = groups[0]
    np.testing.assert_array_equal(np.asarray(g.batches.mask).sum(axis=1), [4, 8, 16, 32, 64] * 2)


# ----------------------------------------------------------------------------- metrics by hand


def test_shape_error_by_hand_anchor_is_the_lowest_concurrency_and_counts_zero():
    # sweep a: anchor C=4 (listed second): pred ratio 3/1, measured 4/2 -> |3/2 - 1| = 0.5
    # sweep b: anchor C=1: pred ratio 2/2, measured 4/1 -> |1/4 - 1| = 0.75
    err, anchor = acc.shape_errors(["a", "a", "b", "b"], [8, 4, 1, 2], [3.0, 1.0, 2.0, 2.0], [4.0, 2.0, 1.0, 4.0])
    np.testing.assert_allclose(err, [0.5, 0.0, 0.0, 0.75], rtol=0, atol=1e-15)
    assert anchor.tolist() == [False, True, True, False]
    s = acc.summarize(err, anchor, [3.0, 1.0, 2.0, 2.0], [4.0, 2.0, 1.0, 4.0])
    assert s["shape_mean"] == pytest.approx(1.25 / 4)            # anchors count as 0
    assert s["shape_median"] == 0.5                              # upper median: sorted(err)[n // 2]
    assert s["shape_max"] == 0.75
    assert s["shape_mean_non_anchor"] == pytest.approx(0.625)
    # relative errors -0.25, -0.5, +1.0, -0.5
    assert s["tpot_mape"] == pytest.approx(2.25 / 4)
    assert s["tpot_mean_signed"] == pytest.approx(-0.25 / 4)
    assert (s["points"], s["priced"], s["shape_points"]) == (4, 4, 4)


def test_repeat_spread_by_hand():
    """Three runs of one point (TPOT 10, 20, 30 us; TTFT 100, 100, nan), one point measured once:
    each run against the mean of the others: |10/25 - 1| = 0.6, |20/20 - 1| = 0, |30/15 - 1| = 1
    (mean 8/15, upper median 0.6); TTFT: the two finite runs, 0 each."""
    from jaxprice._src.accuracy import repeat_spread
    rec = lambda c, t, f: {"deployment": "d", "workload": "1k1k", "concurrency": c,   # noqa: E731
                           "measured_us": t, "measured_ttft_us": f}
    out = repeat_spread([rec(4, 10.0, 100.0), rec(4, 20.0, 100.0), rec(4, 30.0, math.nan), rec(8, 50.0, 7.0)])
    assert out["tpot"]["points"] == 4 and out["tpot"]["repeated"] == 3
    assert out["tpot"]["mape"] == pytest.approx((0.6 + 0.0 + 1.0) / 3, rel=1e-12)
    assert out["tpot"]["median"] == pytest.approx(0.6, rel=1e-12)
    assert out["ttft"]["repeated"] == 2 and out["ttft"]["mape"] == 0.0
    assert math.isnan(repeat_spread([rec(4, 10.0, 1.0)])["tpot"]["mape"])


def test_repeat_spread_shape_by_hand():
    """Two runs of one sweep: run a TPOT 10 -> 20 us (C 4 -> 8), run b 10 -> 30 us, and b also
    at C 16 (no partner there). Each run's shape by the other's ratio: a's C=8 point |3/2 - 1| =
    0.5, b's |2/3 - 1| = 1/3, the anchors 0: mean (0.5 + 1/3) / 4 over 4 points; the model's own
    shape errors on those points (0.1 each, anchors 0) are averaged over the same 4."""
    from jaxprice._src.accuracy import repeat_spread

    def rec(run, c, t, shape):
        return {"deployment": "d", "workload": "1k1k", "scenario": run, "concurrency": c, "measured_us": t,
                "measured_ttft_us": math.nan, "no_overlap_error": 0.2, "no_overlap_shape_error": shape}
    recs = [rec("a", 4, 10.0, 0.0), rec("a", 8, 20.0, 0.1), rec("b", 4, 10.0, 0.0), rec("b", 8, 30.0, 0.1),
            rec("b", 16, 50.0, 0.7)]
    out = repeat_spread(recs)["tpot"]
    assert out["shape_repeated"] == 4
    assert out["shape_mean"] == pytest.approx((0.5 + 1 / 3) / 4, rel=1e-12)
    assert out["shape_median"] == pytest.approx(1 / 3, rel=1e-12)
    assert out["model_shape_mean"] == pytest.approx(0.2 / 4, rel=1e-12)
    # the MAPE part: the two points measured twice in each run, |10/10 - 1| = 0, |20/30 - 1|, |30/20 - 1|
    assert out["repeated"] == 4 and out["mape"] == pytest.approx((1 / 3 + 0.5) / 4, rel=1e-12)
    assert out["model_mape"] == pytest.approx(0.2, rel=1e-12)


def test_unpriced_points_are_excluded_from_the_means_and_counted():
    # the anchor of sweep a is not priced: no shape error for the whole sweep
    err, anchor = acc.shape_errors(["a", "a", "b"], [1, 2, 1], [np.nan, 2.0, 1.0], [1.0, 2.0, 1.0])
    assert np.isnan(err[:2]).all() and err[2] == 0.0
    s = acc.summarize(err, anchor, [np.nan, 2.0, 1.0], [1.0, 2.0, 2.0])
    assert (s["points"], s["priced"], s["shape_points"]) == (3, 2, 1)
    assert s["tpot_mape"] == pytest.approx(0.25)                 # (0 + 0.5) / 2
    assert s["tpot_mean_signed"] == pytest.approx(-0.25)


# ----------------------------------------------------------------------------- the excerpt


def test_prediction_is_the_anchor_rule_priced_independently(report):
    """TPOT(C) = NoOverlap of C decode rows at context isl + osl // 2 (threshold 8) + host_output_token."""
    for dep, c, ctx, suffix in ((GPT, 16, 8704, "cfg1.yaml"), (KIMI_INT4, 64, 1536, "cfg1.yaml")):
        r = record(report, dep, c, suffix)
        d, _ = acc.build_deployment(acc.read_measurements(EXCERPT)[0][r["row"] // 2 - 1])
        res = jp.price(d.plan, d.coefficients, jp.Batch.decode(c, ctx, pad_to=acc.padding(c), decode_threshold=8))
        assert r["context"] == ctx
        assert r["host_output_token_us"] == pytest.approx(45.9, rel=1e-12)
        assert r["no_overlap_step_us"] == pytest.approx(float(res.no_overlap) * 1e6, rel=1e-12)
        assert r["overlap_step_us"] == pytest.approx(float(res.overlap) * 1e6, rel=1e-12)
        assert r["no_overlap_tpot_us"] == pytest.approx(float(res.no_overlap) * 1e6 + 45.9, rel=1e-12)
        assert r["overlap_tpot_us"] == pytest.approx(float(res.overlap) * 1e6 + 45.9, rel=1e-12)
        assert r["bottleneck"] == jp.RESOURCES[int(res.bottleneck)]


def test_records_scores_and_summary_agree_by_hand(report):
    a = record(report, GPT, 4)
    b = record(report, GPT, 32)
    assert a["anchor"] and not b["anchor"] and b["anchor_concurrency"] == 4
    assert a["no_overlap_shape_error"] == 0.0
    pred_ratio = b["no_overlap_tpot_us"] / a["no_overlap_tpot_us"]
    meas_ratio = b["measured_us"] / a["measured_us"]
    assert b["measured_rel"] == pytest.approx(meas_ratio, rel=1e-12)
    assert b["no_overlap_shape_error"] == pytest.approx(abs(pred_ratio / meas_ratio - 1), rel=1e-12)
    assert b["no_overlap_error"] == pytest.approx(b["no_overlap_tpot_us"] / b["measured_us"] - 1, rel=1e-12)
    # the file's relative_to_sweep_anchor column says the same (6 decimals)
    raw = rows_of()[b["row"] - 2]
    assert float(raw["relative_to_sweep_anchor"]) == pytest.approx(meas_ratio, abs=1e-6)
    # the second run (cfg2) of the deployment is its own sweep: same prediction, own anchor
    b2 = record(report, GPT, 32, "cfg2.yaml")
    assert b2["no_overlap_tpot_us"] == b["no_overlap_tpot_us"] and b2["anchor_concurrency"] == 4
    # the ep/dp sweep is anchored at its lowest concurrency, 256
    assert record(report, EPDP, 256)["anchor"] and record(report, EPDP, 1024)["anchor_concurrency"] == 256
    for e in acc.ESTIMATES:
        for model, n in (("gpt-oss-120b", 10), ("kimi-k2.5", 5), ("minimax-m2.5", 6), ("all", 21)):
            s = report.summary[e][model]
            recs = [r for r in report.records if model in ("all", r["model"])]
            assert (s["points"], s["priced"], s["refused"], s["shape_points"]) == (n, n, 0, n)
            rel = np.array([r[f"{e}_error"] for r in recs])
            shape = np.array([r[f"{e}_shape_error"] for r in recs])
            assert s["tpot_mape"] == pytest.approx(np.mean(np.abs(rel)), rel=1e-12)
            assert s["tpot_mean_signed"] == pytest.approx(np.mean(rel), rel=1e-12)
            assert s["shape_mean"] == pytest.approx(np.mean(shape), rel=1e-12)
            assert s["shape_median"] == np.sort(shape)[len(shape) // 2]
    assert report.refused == []


def test_deployment_sources_and_notes(report):
    info = report.info
    assert info["from_scenario_files"] == [GPT]
    assert info["from_columns"] == sorted([KIMI_INT4, MINIMAX, EPDP])
    assert record(report, GPT, 4)["source"] == f"testdata/aisimulate/{GPT}.yaml"
    assert record(report, KIMI_INT4, 4)["source"] == "columns"
    # tp2-ep2-dp2 is InferenceX's name: 2 GPUs, 2 data-parallel ranks of tp 1, expert parallelism over both
    (note,) = info["notes"]
    assert note.startswith(EPDP) and "tp 2 read as the GPU count: 2 data-parallel ranks of tp 1" in note
    d = record(report, EPDP, 256)
    assert d["source"] == "columns"


@pytest.mark.parametrize("tp,ep,dp,rank,gpus", [(2, 2, 2, 1, 2), (4, 4, 2, 2, 4), (2, 4, 2, 2, 4), (8, 1, 1, 8, 8),
                                               (8, 8, 1, 8, 8), (8, 1, 8, 1, 8), (4, 1, 2, 2, 4), (1, 1, 2, 1, 2)])
def test_the_layout_of_a_measured_deployment(tp, ep, dp, rank, gpus):
    """vLLM's expert-parallel width is rank tp x dp, so the ep column fixes each rank's tp: ep / dp.
    InferenceX's names count GPUs in tp (tp2-ep2-dp2: 2 ranks of 1 GPU), the reference scenarios'
    count per rank (tp2-ep4-dp2: 2 ranks of 2); without expert parallelism InferenceX's reading
    (tp8-dp8: 8 ranks of 1 GPU), unless dp does not divide tp (tp1-dp2 can only be 2 ranks of 1)."""
    p = _point("d", "minimax-m2.5", "b200", "fp4", tp=tp, ep=ep, dp=dp)
    assert (acc.rank_tp(p), acc.gpus_of(p)) == (rank, gpus)
    if ep > 1:
        dep, _ = acc.build_deployment(p, scenario_dirs=[])
        assert (dep.resolution["tp"], dep.resolution["dp"], dep.resolution["ep"]) == (rank, dp, ep)
    with pytest.raises(jp.JaxpriceError, match="do not make one layout"):
        acc.rank_tp(_point("d", "minimax-m2.5", "b200", "fp4", tp=2, ep=4, dp=8))
    with pytest.raises(jp.JaxpriceError, match="do not make one layout"):
        acc.rank_tp(_point("d", "minimax-m2.5", "b200", "fp4", tp=3, ep=4, dp=2))


def test_a_measured_model_with_only_a_bundled_config_builds_from_the_columns():
    """A point naming a model with no graph but a bundled config.json (deepseek-r1) resolves from
    the columns through that config, served in its checkpoint's format, with the engine's
    scheduler (it was refused as an unknown model)."""
    p = _point("deepseek-r1-b200-fp8-sglang-tp8", "deepseek-r1", "b200", "fp8", tp=8, engine="sglang")
    dep, where = acc.build_deployment(p)
    assert where == "columns" and dep.graph.name == "deepseek-r1"
    assert dep.graph.path.endswith("deepseek-ai--DeepSeek-R1/config.json")
    assert (dep.resolution["tp"], dep.resolution["served_dtype"]) == (8, "fp8")
    assert acc.engine_assumptions(p)["scheduler"][0] == "sglang"


def test_int4_kimi_is_served_in_its_checkpoint_format():
    points, _ = acc.read_measurements(EXCERPT)
    p = next(p for p in points if p.deployment == KIMI_INT4)
    d, where = acc.build_deployment(p)
    assert where == "columns" and p.dtype == "int4"
    assert d.resolution["served_dtype"] == "int4" and d.resolution["ep"] == 1 and d.resolution["tp"] == 8


@pytest.mark.parametrize("name,dtype,tp,ep,dp", [
    (GPT, "fp4", 1, 1, 1),
    ("kimi-k2.5-b200-fp4-vllm-tp8", "fp4", 8, 1, 1),
    ("minimax-m2.5-h200-fp8-vllm-tp8", "fp8", 8, 1, 1),
    ("minimax-m2.5-b200-fp4-vllm-tp2-ep4-dp2", "fp4", 2, 4, 2),
])
def test_deployment_from_columns_equals_the_bundled_scenario(name, dtype, tp, ep, dp):
    model, hardware = {"gpt": ("gpt-oss-120b", "h200"), "kim": ("kimi-k2.5", "b200"),
                       "min": ("minimax-m2.5", "b200" if "b200" in name else "h200")}[name[:3]]
    p = acc.Point(row=2, scenario=f"{name}-cfg1.yaml", deployment=name, model=model, hardware=hardware,
                  dtype=dtype, engine="vllm", tp=tp, ep=ep, dp=dp, workload="1k1k", isl=1024, osl=1024,
                  concurrency=4, measured=1e-2, anchor_concurrency=4)
    bundled, where = acc.build_deployment(p)
    assert where == f"testdata/aisimulate/{name}.yaml"
    columns, where = acc.build_deployment(p, scenario_dirs=[])
    assert where == "columns"
    assert columns.plan == bundled.plan                            # content digest of every table
    assert columns.coefficients.names == bundled.coefficients.names
    np.testing.assert_array_equal(np.asarray(columns.coefficients.values), np.asarray(bundled.coefficients.values))


def test_smooth_mode_at_temperature_zero_matches_exact(report):
    points, _ = acc.read_measurements(EXCERPT)
    groups, _ = acc.group_points([p for p in points if p.deployment == MINIMAX])
    exact = acc.predict_groups(groups)[MINIMAX]
    smooth = acc.predict_groups(groups, temperature=0.0)[MINIMAX]
    for e in acc.ESTIMATES:
        np.testing.assert_allclose(smooth[e], exact[e], rtol=1e-12)
    got = [record(report, MINIMAX, c)["no_overlap_step_us"] for c in (4, 8, 16)]
    np.testing.assert_allclose(np.asarray(got) * 1e-6, exact["no_overlap"], rtol=1e-12)


def test_the_deployment_axis_prices_as_the_per_deployment_path_with_fewer_compiles(report):
    """The harness prices on the deployment axis (one compile per plan structure); the former
    path (one compile per deployment) gives the same predictions."""
    structures = {jp.structure_of(acc.build_deployment(p)[0].plan).digest
                  for p in {p.deployment: p for p in acc.read_measurements(EXCERPT)[0]}.values()}
    assert 0 <= report.info["kernel_compiles"] <= len(structures) < 4
    per = acc.evaluate_accuracy(EXCERPT, deployments=[MINIMAX, EPDP], per_deployment=True)
    assert per.info["kernel_compiles"] <= 2
    axis = {r["row"]: r for r in report.records}
    for r in per.records:
        a = axis[r["row"]]
        assert (r["status"], r["bottleneck"]) == (a["status"], a["bottleneck"])
        for e in acc.ESTIMATES:
            assert r[f"{e}_tpot_us"] == pytest.approx(a[f"{e}_tpot_us"], rel=1e-12)


def test_fitted_coefficients_override_and_other_coefficients_per_group(report, tmp_path):
    path = tmp_path / "extra.yaml"
    path.write_text("format: jaxprice-coefficients/1\nname: extra\nentries:\n"
                    "  - {name: host_output_token, value: 100.0, units: us_per_token, scope: {hardware: [b300]}}\n")
    other = acc.evaluate_accuracy(EXCERPT, extra_coefficient_files=[path], deployments=[MINIMAX, GPT])
    assert other.info["points"] == 13 and other.info["extra_coefficient_files"] == [str(path)]
    for c in (4, 8, 16):
        r, base = record(other, MINIMAX, c), record(report, MINIMAX, c)
        assert r["host_output_token_us"] == pytest.approx(100.0)
        assert r["no_overlap_tpot_us"] - base["no_overlap_tpot_us"] == pytest.approx(100.0 - 45.9, rel=1e-9)
    assert record(other, GPT, 4)["no_overlap_tpot_us"] == record(report, GPT, 4)["no_overlap_tpot_us"]   # h200


# ----------------------------------------------------------------------------- refused points


def test_refused_points_are_counted_listed_and_kept(tmp_path):
    rows = rows_of()
    for r in rows:
        if r["deployment"] == MINIMAX:
            r["hardware"] = "tpu-v9"                     # no such chip: the deployment does not resolve
            r["deployment"] = r["deployment"].replace("b300", "tpu-v9")
        if r["deployment"] == KIMI_INT4 and r["concurrency"] == "4":
            r["isl"], r["osl"] = "0", "1"                # a request of no context (the sweep's anchor)
    path = write_rows(tmp_path / "refused.csv", rows)
    rep = acc.evaluate_accuracy(path)
    assert len(rep.records) == 21
    bad = {(r["deployment"], r["concurrency"]): r["reason"] for r in rep.refused}
    assert len(bad) == 4
    for c in (4, 8, 16):
        reason = bad[("minimax-m2.5-tpu-v9-fp8-vllm-tp1", c)]
        assert reason.startswith("deployment does not resolve") and "tpu-v9" in reason
    assert bad[(KIMI_INT4, 4)] == "context isl + osl // 2 must be >= 1 (isl 0, osl 1)"
    recs = {(r["deployment"], r["concurrency"]): r for r in rep.records}
    assert recs[(KIMI_INT4, 4)]["status"] == "refused" and math.isnan(recs[(KIMI_INT4, 4)]["no_overlap_tpot_us"])
    for e in acc.ESTIMATES:
        s = rep.summary[e]
        assert (s["all"]["points"], s["all"]["priced"], s["all"]["refused"]) == (21, 17, 4)
        assert (s["minimax-m2.5"]["points"], s["minimax-m2.5"]["priced"], s["minimax-m2.5"]["refused"]) == (6, 3, 3)
        # the refused kimi point is the lowest concurrency of its sweep: no shape error for that sweep
        assert s["kimi-k2.5"]["shape_points"] == 0 and s["kimi-k2.5"]["priced"] == 4
    text = acc.format_report(rep)
    assert "4 refused" in text and "refused points (4):" in text
    assert "minimax-m2.5-tpu-v9-fp8-vllm-tp1: 3 point(s) (line 38 (8k1k, C=4), line 40 (8k1k, C=8)" in text
    assert f"{KIMI_INT4}: 1 point(s) (line 22 (1k1k, C=4)): context isl + osl // 2 must be >= 1" in text
    out = acc.write_points_csv(rep, tmp_path / "points.csv")
    written = {(r["deployment"], r["concurrency"]): r for r in rows_of(out)}
    assert written[(KIMI_INT4, "4")]["status"] == "refused"
    assert written[(KIMI_INT4, "4")]["reason"] == "context isl + osl // 2 must be >= 1 (isl 0, osl 1)"
    assert written[(KIMI_INT4, "4")]["no_overlap_tpot_us"] == ""


def test_an_unknown_dtype_is_refused_with_its_reason(tmp_path):
    rows = [r for r in rows_of() if r["deployment"] == MINIMAX]
    for r in rows:
        r["dtype"] = "fp2"
    rep = acc.evaluate_accuracy(write_rows(tmp_path / "fp2.csv", rows))
    assert len(rep.refused) == 3 and rep.summary["no_overlap"]["all"]["priced"] == 0
    assert "field 'dtype', value 'fp2': unknown dtype" in rep.refused[0]["reason"]
    assert "refused points (3)" in acc.format_report(rep)


@pytest.mark.parametrize("edit, field, value, states", [
    ({"hardware": "b200"}, "hardware", "'b200'", "states h200"),
    ({"model": "kimi-k2.5"}, "model", "'kimi-k2.5'", "states gpt-oss-120b"),
    ({"tp": "2"}, "tp", "'2 (rank tp 2)'", "states tp 1 per rank"),
    ({"ep": "2", "tp": "2"}, "tp", "'2 (rank tp 2)'", "states tp 1 per rank"),
    ({"dtype": "fp8"}, "dtype", "'fp8'", "states quantization nvfp4"),
    ({"dtype": "fp3"}, "dtype", "'fp3'", "unknown dtype"),
])
def test_a_row_that_contradicts_its_scenario_file_is_refused(tmp_path, edit, field, value, states):
    """A row whose deployment has a bundled scenario file is priced by that file only when its
    columns describe it (model, chip, ranks, tp, expert parallelism, dtype), never as the file
    whatever the row says."""
    rows = [r for r in rows_of() if r["deployment"] == GPT]
    for r in rows:
        r.update(edit)
    rep = acc.evaluate_accuracy(write_rows(tmp_path / "bad.csv", rows), batch_rule="anchor")
    assert rep.summary["no_overlap"]["all"]["priced"] == 0 and len(rep.refused) == len(rows) // 2
    reason = rep.refused[0]["reason"]
    assert f"gpt-oss-120b-h200-fp4-vllm-tp1.yaml, field '{field}', value {value}" in reason and states in reason


# ----------------------------------------------------------------------------- malformed files


def _malformed(tmp_path, edit, fields=None):
    rows = rows_of()
    edit(rows)
    return write_rows(tmp_path / "bad.csv", rows, fields)


@pytest.mark.parametrize("edit,where,field,value,message", [
    (lambda rows: rows[3].update(value="abc"), ":5", "value", "'abc'", "expected a number"),
    (lambda rows: rows[2].update(value="-3"), ":4", "value", "'-3'", "positive"),
    (lambda rows: rows[6].update(unit="ns"), ":8", "unit", "'ns'", "unknown unit (known: us, ms, s)"),
    (lambda rows: rows[8].update(tp="two"), ":10", "tp", "'two'", "expected an integer"),
    (lambda rows: rows[8].update(concurrency="4.5"), ":10", "concurrency", "'4.5'", "expected an integer"),
    (lambda rows: rows[2].update(concurrency="4"), ":4", "concurrency", "'4'", "first on line 2"),
])
def test_malformed_rows_are_refused_naming_file_line_and_column(tmp_path, edit, where, field, value, message):
    path = _malformed(tmp_path, edit)
    with pytest.raises(jp.JaxpriceError) as exc:
        acc.read_measurements(path)
    text = str(exc.value)
    assert text.startswith(f"{path}{where}, field '{field}', value {value}: ")
    assert message in text


def test_a_missing_column_is_refused_naming_it(tmp_path):
    fields = [c for c in rows_of()[0] if c != "unit"]
    path = _malformed(tmp_path, lambda rows: None, fields)
    with pytest.raises(jp.JaxpriceError) as exc:
        acc.read_measurements(path)
    assert str(exc.value).startswith(f"{path}:1, field 'unit': missing column(s) unit")


def test_a_short_row_and_a_missing_file_are_refused(tmp_path):
    text = EXCERPT.read_text().splitlines()
    short = tmp_path / "short.csv"
    short.write_text("\n".join(text[:3] + [",".join(text[3].split(",")[:10])]) + "\n")
    with pytest.raises(jp.JaxpriceError, match=rf"{short}:4, field 'workload'.*fewer fields than the header"):
        acc.read_measurements(short)
    with pytest.raises(jp.JaxpriceError, match="cannot read the measurement file"):
        acc.read_measurements(tmp_path / "nope.csv")
    with pytest.raises(jp.JaxpriceError, match="no point of the CSV belongs to the selected deployments"):
        acc.evaluate_accuracy(EXCERPT, deployments=["nope"])


# ----------------------------------------------------------------------------- outputs and CLI


def test_report_text_and_markdown(report):
    text = acc.format_report(report)
    assert "21 mean-TPOT points, 5 sweeps, 4 deployments (1 from scenario files, 3 from columns); 0 refused" in text
    s = report.summary["no_overlap"]["all"]
    line = next(ln for ln in text.splitlines() if ln.startswith("NoOverlap") and " all " in ln)
    assert f"{s['tpot_mape']:.1%}" in line and f"{s['shape_mean']:.1%}" in line and " 21 " in line
    md = acc.format_report(report, markdown=True)
    assert "| NoOverlap | kimi-k2.5 | 5 | 5 | 0 |" in md and "| Overlap | all | **21** |" in md


def test_cli_writes_points_table_and_plot_exit_0(tmp_path, capsys):
    rc = cli_main(["accuracy", str(EXCERPT), "--batch-rule", "anchor", "--out", str(tmp_path), "--plot",
                   str(tmp_path / "s.png"), "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "NoOverlap" in out and "Overlap" in out and "0 refused" in out
    points = rows_of(tmp_path / "accuracy_points.csv")
    assert len(points) == 21 and {p["status"] for p in points} == {"priced"}
    md = (tmp_path / "accuracy.md").read_text()
    assert md.startswith("# Accuracy") and "NoOverlap by chip" in md and "host_output_token (45.9 us)" in md
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_json_and_deployment_filter(capsys):
    rc = cli_main(["accuracy", str(EXCERPT), "--batch-rule", "anchor", "--deployment", MINIMAX, "--json", "--quiet"])
    assert rc == 0

    def no_nan(token):
        raise AssertionError(f"not strict JSON: {token}")
    doc = json.loads(capsys.readouterr().out, parse_constant=no_nan)     # jq and JavaScript refuse NaN
    assert doc["summary"]["no_overlap"]["all"]["points"] == 3 and doc["refused"] == []
    assert doc["summary"]["no_overlap"]["all"]["ttft_mape"] is None       # the anchor rule predicts no TTFT
    spread = doc["measurement_spread"]["no_overlap"]["tpot"]        # the measurements' own reproducibility
    assert spread["points"] == 3 and {"mape", "shape_mean", "shape_repeated"} <= set(spread)


def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys):
    path = _malformed(tmp_path, lambda rows: rows[6].update(unit="ns"))
    assert cli_main(["accuracy", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"jaxprice accuracy: error: {path}:8, field 'unit', value 'ns': unknown unit (known: us, ms, s)"]
    assert cli_main(["accuracy", str(tmp_path / "missing.csv"), "--quiet"]) == 2
    assert "cannot read the measurement file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:                       # argparse: bad option value
        cli_main(["accuracy", str(EXCERPT), "--estimate", "both"])
    assert exc.value.code == 2


def test_plot_marks_refused_points(tmp_path):
    rows = [r for r in rows_of() if r["deployment"] == MINIMAX]
    rows[0]["isl"], rows[0]["osl"] = "0", "1"
    rep = acc.evaluate_accuracy(write_rows(tmp_path / "r.csv", rows))
    assert len(rep.refused) == 1
    path = acc.plot_sweeps(rep, tmp_path / "r.png", estimate="overlap")
    assert path.stat().st_size > 10_000


# ----------------------------------------------------------------------------- batch rules


@pytest.fixture(scope="module")
def by_rule(report):
    """{rule: AccuracyReport} on the excerpt ('anchor' priced again, independently of ``report``)."""
    return {rule: acc.evaluate_accuracy(EXCERPT, batch_rule=rule) for rule in acc.STATIC_BATCH_RULES}


def test_the_anchor_rule_is_the_default_and_unchanged(report, by_rule):
    assert acc.STATIC_BATCH_RULES == ("anchor", "capped", "interleaved")
    assert acc.BATCH_RULES == acc.STATIC_BATCH_RULES + ("simulate",)
    points, _ = acc.read_measurements(EXCERPT)
    default, _ = acc.group_points(points)
    anchor, _ = acc.group_points(points, batch_rule="anchor")
    for g, h in zip(default, anchor):
        assert g.batch_rule == h.batch_rule == "anchor" and g.combine is None and h.combine is None
        np.testing.assert_array_equal(g.resident, [points[i].concurrency for i in g.index])
        for leaf_g, leaf_h in zip(jax_leaves(g.batches), jax_leaves(h.batches)):
            np.testing.assert_array_equal(leaf_g, leaf_h)
    # every number of every record, bit for bit (NaN where nothing is predicted: TTFT, static rules)
    assert same_records(by_rule["anchor"].records, report.records)
    assert report.info["batch_rule"] == "anchor" and report.info["resident_below_concurrency"] == 0


def same_records(a, b):
    """Record lists equal field by field, NaN equal to NaN."""
    def same(x, y):
        return (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)) or x == y
    return len(a) == len(b) and all(r.keys() == q.keys() and all(same(r[k], q[k]) for k in r) for r, q in zip(a, b))


def jax_leaves(tree):
    import jax
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def test_kv_capacity_comes_from_the_plan_by_the_reference_memory_model():
    GiB, workspace, nccl_2rank = 2 ** 30, 3758096384, 358612992     # registry: cost-model-memory
    points, _ = acc.read_measurements(EXCERPT)
    for name, comm in ((GPT, workspace), (EPDP, workspace + nccl_2rank)):
        dep, _ = acc.build_deployment(next(p for p in points if p.deployment == name))
        mem = dep.plan.memory
        assert mem["comm_buffer_bytes"] == comm                 # tp 1 dp 1: no communicator; tp 2: 2-rank
        fixed = mem["weights_bytes"] + mem["activation_bytes"] + mem["cudagraph_bytes"] + comm
        want = (dep.chip.memory_gib * GiB * 0.9 - fixed) / mem["kv_bytes_per_token"]
        assert acc.kv_capacity_tokens(dep) == pytest.approx(want, rel=1e-12) and want > 1e5


def test_capped_never_exceeds_c_and_equals_c_where_c_fits(by_rule):
    points, _ = acc.read_measurements(EXCERPT)
    dep, _ = acc.build_deployment(next(p for p in points if p.deployment == EPDP))
    # tp 2 dp 2: at most max_num_seqs 256 x dp 2 = 512 resident; the KV cache holds far more
    assert dep.resolution["max_num_seqs"] == 256 and 2 * acc.kv_capacity_tokens(dep) / 1536 > 512
    assert [acc.resident_batch(dep, c, 1536) for c in (1, 256, 512, 513, 1024)] == [1, 256, 512, 512, 512]
    # the KV limit: a context that leaves room for only 3 requests over the two ranks
    ctx = int(2 * acc.kv_capacity_tokens(dep) // 3)
    assert acc.resident_batch(dep, 1024, ctx) == 3
    with pytest.raises(jp.JaxpriceError, match="not one request of context"):
        acc.resident_batch(dep, 4, 10 ** 12)
    capped, anchor = by_rule["capped"], by_rule["anchor"]
    assert capped.info["resident_below_concurrency"] == 1
    for r, a in zip(capped.records, anchor.records):
        assert r["batch_rule"] == "capped" and r["resident"] <= r["concurrency"]
        if r["resident"] == r["concurrency"]:
            assert r["no_overlap_tpot_us"] == pytest.approx(a["no_overlap_tpot_us"], rel=1e-12)
            assert r["overlap_tpot_us"] == pytest.approx(a["overlap_tpot_us"], rel=1e-12)
    # C = 1024 runs the 512 resident rows: priced as C = 512, below the anchor's C = 1024 decodes
    r1024, r512 = record(capped, EPDP, 1024), record(capped, EPDP, 512)
    assert (r1024["resident"], r512["resident"]) == (512, 512)
    assert r1024["no_overlap_tpot_us"] == pytest.approx(r512["no_overlap_tpot_us"], rel=1e-12)
    assert r1024["no_overlap_tpot_us"] < record(anchor, EPDP, 1024)["no_overlap_tpot_us"]


def test_interleaved_is_the_decode_step_plus_the_prefill_chunks_by_hand(by_rule):
    points, _ = acc.read_measurements(EXCERPT)
    p = next(p for p in points if p.deployment == MINIMAX and p.concurrency == 4)
    dep, _ = acc.build_deployment(p)
    # 8k1k: ctx 8704; budget 8192 (built from the columns) less 4 decode rows = 8188 tokens a step,
    # so the 8192-token prompt takes two chunks: 8188 tokens, then 4 after the first 8188
    R, requests, weights = acc.point_requests(dep, p, "interleaved")
    assert R == 4 and dep.scenario.engine["max_num_batched_tokens"] == 8192
    assert requests == [([1] * 4, [8703] * 4), ([1] * 4 + [8188], [8703] * 4 + [0]),
                        ([1] * 4 + [4], [8703] * 4 + [8188])]
    a = 4 / 1024                                                 # R / osl requests arrive per step
    assert weights == [1 - 2 * a, a, a]
    assert acc.prefill_chunks(8192, 4, 8192) == [(8188, 0), (4, 8188)]
    assert acc.prefill_chunks(1024, 256, 8192) == [(1024, 0)] and acc.prefill_chunks(0, 4, 8192) == []
    S = [jp.price(dep.plan, dep.coefficients, jp.Batch.from_requests(s, c, decode_threshold=8)) for s, c in requests]
    r, cap = record(by_rule["interleaved"], MINIMAX, 4), record(by_rule["capped"], MINIMAX, 4)
    for e in acc.ESTIMATES:
        s_d, s_1, s_2 = (float(getattr(x, e)) for x in S)
        assert s_1 > s_d and s_2 > s_d
        want = s_d + a * (s_1 - s_d) + a * (s_2 - s_d)
        assert r[f"{e}_step_us"] == pytest.approx(want * 1e6, rel=1e-9)
        assert r[f"{e}_tpot_us"] == pytest.approx(want * 1e6 + 45.9, rel=1e-9)
        assert cap[f"{e}_step_us"] == pytest.approx(s_d * 1e6, rel=1e-9)
    assert r["bottleneck"] == jp.RESOURCES[int(S[0].bottleneck)]      # the decode batch's
    # a prefill chunk never makes a step cheaper: interleaved >= capped on every point
    for r, c in zip(by_rule["interleaved"].records, by_rule["capped"].records):
        assert r["resident"] == c["resident"]
        for e in acc.ESTIMATES:
            assert r[f"{e}_tpot_us"] >= c[f"{e}_tpot_us"] * (1 - 1e-12)
    # the stacked groups: point i is batch i; the chunks follow, combined by the matrix
    groups, _ = acc.group_points([q for q in points if q.deployment == MINIMAX], batch_rule="interleaved")
    (g,) = groups
    assert g.combine.shape == (3, 3 + 6) and np.shape(g.batches.scheduled) == (9, acc.padding(16) + 1)
    np.testing.assert_allclose(g.combine.sum(axis=1), 1.0, rtol=1e-15)


def test_a_point_a_rule_cannot_price_is_refused_with_its_reason():
    points, _ = acc.read_measurements(EXCERPT)
    p = next(p for p in points if p.deployment == MINIMAX)
    dep, _ = acc.build_deployment(p)
    short = dataclasses.replace(p, isl=100, osl=0)
    assert acc.point_requests(dep, short, "capped")[0] == 4
    with pytest.raises(jp.JaxpriceError, match="the interleaved rule needs osl >= 1"):
        acc.point_requests(dep, short, "interleaved")
    groups, refused = acc.group_points([short, p], batch_rule="interleaved")
    assert refused == [(0, "the interleaved rule needs osl >= 1 (requests finish every osl steps)")]
    assert groups[0].index.tolist() == [1]
    with pytest.raises(jp.JaxpriceError, match=r"unknown batch rule \(known: anchor, capped, interleaved, simulate\)"):
        acc.evaluate_accuracy(EXCERPT, batch_rule="fifo")
    with pytest.raises(jp.JaxpriceError, match=r"known: anchor, capped, interleaved\) \('simulate' prices whole runs"):
        acc.group_points(points, batch_rule="simulate")


def test_cli_batch_rule(tmp_path, capsys):
    rc = cli_main(["accuracy", str(EXCERPT), "--batch-rule", "interleaved", "--deployment", MINIMAX, EPDP,
                   "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "batch rule interleaved (1 point(s) with a resident batch below C)" in out
    md = (tmp_path / "accuracy.md").read_text()
    assert md.startswith("# Accuracy: predicted against measured mean TPOT (batch rule `interleaved`)")
    assert "--batch-rule interleaved" in md and "designed after looking at" in md
    pts = rows_of(tmp_path / "accuracy_points.csv")
    assert {p["batch_rule"] for p in pts} == {"interleaved"}
    assert [int(p["resident"]) for p in pts if p["deployment"] == EPDP] == [256, 512, 512]
    assert cli_main(["accuracy", str(EXCERPT), "--batch-rule", "fifo", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["jaxprice accuracy: error: field '--batch-rule', value 'fifo': unknown batch rule "
                   "(known: anchor, capped, interleaved, simulate)"]


# ----------------------------------------------------------------------------- TTFT beside TPOT


def test_each_point_carries_its_mean_ttft_row(tmp_path):
    points, info = acc.read_measurements(EXCERPT)
    assert info["ttft_points"] == 21 and info["ttft_rows_without_tpot"] == []
    raw = rows_of()
    for p in points:
        (t,) = [r for r in raw if r["quantity"] == "mean_ttft" and r["scenario"] == p.scenario
                and r["workload"] == p.workload and int(r["concurrency"]) == p.concurrency]
        assert p.measured_ttft == pytest.approx(float(t["value"]) * 1e-6, rel=1e-15)
    assert points[0].run_date == raw[0]["source_run_date"]
    # a TTFT row whose TPOT row is gone is counted, not a point; the point without TTFT is NaN
    rows = [r for k, r in enumerate(raw) if k != 2]             # line 4: the second point's TPOT row
    pts, info = acc.read_measurements(write_rows(tmp_path / "t.csv", rows))
    assert (len(pts), info["ttft_points"], info["ttft_rows_without_tpot"]) == (20, 20, [4])
    rows = [r for k, r in enumerate(raw) if k != 3]             # now its TTFT row
    pts, info = acc.read_measurements(write_rows(tmp_path / "u.csv", rows))
    assert math.isnan(pts[1].measured_ttft) and info["ttft_points"] == 20
    dup = raw[:4] + [raw[3]]
    with pytest.raises(jp.JaxpriceError, match=r":6, field 'concurrency'.*second mean_ttft point.*first on line 5"):
        acc.read_measurements(write_rows(tmp_path / "d.csv", dup))


def test_static_rules_say_ttft_is_not_predicted(report):
    r = record(report, GPT, 4)
    assert r["measured_ttft_us"] == pytest.approx(400117.766, rel=1e-12)
    for e in acc.ESTIMATES:
        assert math.isnan(r[f"{e}_ttft_us"]) and math.isnan(r[f"{e}_ttft_error"])
        s = report.summary[e]["all"]
        assert s["ttft_priced"] == 0
        assert all(math.isnan(s[k]) for k in ("ttft_mape", "ttft_mean_signed", "ttft_shape_mean", "ttft_shape_median"))
    assert report.info["ttft_predicted"] is False
    text = acc.format_report(report)
    assert "TTFT: not predicted under batch rule anchor" in text


def test_summaries_by_concurrency_bucket_and_held_out_deployments(report):
    assert [acc.concurrency_bucket(c) for c in (1, 16, 17, 64, 65, 256, 257, 2048)] == [
        "C <= 16", "C <= 16", "16 < C <= 64", "16 < C <= 64", "64 < C <= 256", "64 < C <= 256", "C > 256", "C > 256"]
    by = report.summarize_by(lambda r: acc.concurrency_bucket(r["concurrency"]))
    assert [by[b]["points"] for b in ("C <= 16", "16 < C <= 64", "64 < C <= 256", "C > 256", "all")] == [12, 6, 1, 2, 21]
    sel = [r for r in report.records if 16 < r["concurrency"] <= 64]
    assert by["16 < C <= 64"]["tpot_mape"] == pytest.approx(np.mean([abs(r["no_overlap_error"]) for r in sel]))
    # the held-out deployments are jaxprice fit's: split_by_deployment(0.25, seed 0, by model)
    from jaxprice import fit
    models = {GPT: "gpt-oss-120b", KIMI_INT4: "kimi-k2.5", MINIMAX: "minimax-m2.5", EPDP: "minimax-m2.5"}
    train, test = fit.split_by_deployment(list(models), 0.25, seed=0, stratify=models)
    assert (report.info["split"]["train"], report.info["split"]["test"]) == (train, test) and len(test) == 1
    sp = report.split_summary()
    n_test = sum(r["deployment"] in test for r in report.records)
    assert (sp["test"]["points"], sp["train"]["points"], sp["all"]["points"]) == (n_test, 21 - n_test, 21)
    text = acc.format_report(report)
    assert "NoOverlap by concurrency bucket:" in text and "on the held-out deployments (1 of 4" in text


# ----------------------------------------------------------------------------- engine assumptions


def _point(name, model, hardware, dtype, tp=1, ep=1, dp=1, isl=1024, osl=1024, c=16, engine="vllm"):
    return acc.Point(row=2, scenario=f"{name}-cfg1.yaml", deployment=name, model=model, hardware=hardware, dtype=dtype,
                     engine=engine, tp=tp, ep=ep, dp=dp, workload="x", isl=isl, osl=osl, concurrency=c,
                     measured=1e-2, anchor_concurrency=4)


def test_speculative_points_need_a_deployment_that_states_it(tmp_path):
    """A row measured with speculative decoding whose model graph has no drafter (minimax-m2.5 has
    no MTP layers) is refused with its reason, never priced as if it had none; 'none' (or no
    column) is priced. Speculating points that can be priced: tests/test_accuracy_spec.py."""
    rows = [r for r in rows_of() if r["deployment"] == MINIMAX]
    for r in rows:
        r["spec_decode"] = "mtp"
    rep = acc.evaluate_accuracy(write_rows(tmp_path / "spec.csv", rows), batch_rule="anchor")
    assert rep.summary["no_overlap"]["all"]["priced"] == 0 and len(rep.refused) == len(rows) // 2
    assert all("speculative decoding" in r["reason"] and "'mtp'" in r["reason"] for r in rep.refused)
    for r in rows:
        r["spec_decode"] = "none"
    ok = acc.evaluate_accuracy(write_rows(tmp_path / "none.csv", rows), batch_rule="anchor")
    assert ok.refused == [] and ok.summary["no_overlap"]["all"]["priced"] == len(rows) // 2


def test_other_engines_get_their_scheduler_and_no_vllm_recipe():
    """The engine column picks the scheduler (serve.SCHEDULERS); a vLLM recipe is never another
    engine's, so an SGLang or TensorRT-LLM point with no recipe of its own read
    (ix_recipes.IX_ENGINE_RECIPES) gets its engine's defaults: SGLang's chunk by GPU memory
    (8192 on an H200, 16384 on a B200), TensorRT-LLM its max_num_tokens default 8192."""
    def values(p):
        return {k: v for k, (v, _) in acc.engine_assumptions(p).items()}
    sg = values(_point("g", "gpt-oss-120b", "h200", "fp4", c=4, engine="sglang"))
    assert (sg["scheduler"], sg["max_num_batched_tokens"], sg["max_num_seqs"]) == ("sglang", 8192, 1024)
    assert sg["recipe"] == "sglang defaults"                  # not gpt-oss's vLLM recipe (max_num_seqs C)
    assert values(_point("g", "gpt-oss-120b", "b200", "fp4", engine="sglang"))["max_num_batched_tokens"] == 16384
    trt = acc.engine_assumptions(_point("g", "kimi-k2.5", "b200", "fp4", engine="trt"))   # no trt recipe read
    assert (trt["scheduler"][0], trt["max_num_batched_tokens"][0]) == ("trtllm", 8192)
    assert "TensorRT-LLM's max_num_tokens default" in trt["max_num_batched_tokens"][1]
    assert "COVERAGE LIMIT" in trt["async_scheduling"][1]
    assert values(_point(GPT, "gpt-oss-120b", "h200", "fp4"))["scheduler"] == "vllm"
    # vLLM's default graph mode is vLLM's: another engine keeps its deployment's own
    assert "cudagraph_mode" not in sg and "cudagraph_mode" not in trt
    assert values(_point(GPT, "gpt-oss-120b", "h200", "fp4"))["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    # built from the columns like a vLLM deployment (the step is priced alike); an unknown engine refused
    sc = acc.scenario_from_columns(_point("g", "gpt-oss-120b", "h200", "fp4", engine="sglang"))
    assert sc.parallel["tp"] == 1 and sc.engine["quantization"] == "nvfp4"
    with pytest.raises(jp.JaxpriceError, match="unknown engine"):
        acc.scenario_from_columns(_point("g", "gpt-oss-120b", "h200", "fp4", engine="tgi"))
    with pytest.raises(jp.JaxpriceError, match="field 'engine', value 'tgi': unknown engine"):   # a bundled one too
        acc.build_deployment(_point(GPT, "gpt-oss-120b", "h200", "fp4", engine="tgi"))


def test_recipes_of_models_outside_the_dev_set_give_their_graph_mode_and_kv_dtype():
    """DeepSeek-V4-Pro's H200 recipe runs full graphs for decode only, at 512 sequences and 512
    batched tokens; its B200 recipe vLLM's default graphs, an fp8 cache and 256-token blocks; a
    model and chip with no recipe read gets vLLM's defaults, said so."""
    def values(p):
        return {k: v for k, (v, _) in acc.engine_assumptions(p).items()}
    h200 = acc.engine_assumptions(_point("dsv4-x", "deepseek-v4-pro", "h200", "fp8", tp=8, c=64))
    assert {k: h200[k][0] for k in ("cudagraph_mode", "cache_dtype", "block_size", "max_num_seqs",
                                   "max_num_batched_tokens", "gpu_memory_utilization")} == {
        "cudagraph_mode": "FULL_DECODE_ONLY", "cache_dtype": "fp8", "block_size": 256, "max_num_seqs": 512,
        "max_num_batched_tokens": 512, "gpu_memory_utilization": 0.95}
    assert "dsv4_fp8_h200.sh@8eec0d4" in h200["cudagraph_mode"][1]
    b200 = values(_point("dsv4-y", "deepseek-v4-pro", "b200", "fp4", tp=8))
    assert (b200["cudagraph_mode"], b200["cache_dtype"], b200["block_size"]) == ("FULL_AND_PIECEWISE", "fp8", 256)
    none = acc.engine_assumptions(_point("m3-z", "minimax-m3", "h100", "fp8", tp=8))
    assert none["recipe"][0] == "vLLM defaults" and none["cudagraph_mode"][0] == "FULL_AND_PIECEWISE"


def test_engine_assumptions_follow_the_published_recipes():
    def values(p):
        return {k: v for k, (v, _) in acc.engine_assumptions(p).items()}
    gpt = values(_point(GPT, "gpt-oss-120b", "h200", "fp4", isl=8192, c=16))
    assert {k: gpt[k] for k in ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "cache_dtype",
                                "block_size", "max_model_len", "range_ratio", "num_prompts", "warmups", "dp_spread")} == {
        "max_num_seqs": 16, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9, "cache_dtype": "auto",
        "block_size": 16, "max_model_len": 8192 + 1024 + 256, "range_ratio": 0.8, "num_prompts": 160, "warmups": 32,
        "dp_spread": 1}
    assert values(_point(GPT, "gpt-oss-120b", "h200", "fp4", c=4))["max_model_len"] == 1024 + 1024 + 20
    b200 = values(_point("g", "gpt-oss-120b", "b200", "fp4", c=4))
    assert (b200["max_num_seqs"], b200["cache_dtype"]) == (512, "fp8")
    kimi = values(_point(KIMI_INT4, "kimi-k2.5", "h200", "int4", tp=8, c=64))
    assert (kimi["max_num_seqs"], kimi["max_num_batched_tokens"], kimi["gpu_memory_utilization"]) == (64, 8192, 0.95)
    kfp4 = values(_point("k", "kimi-k2.5", "b300", "fp4", tp=4, isl=8192, osl=1024, c=8))
    assert (kfp4["max_num_batched_tokens"], kfp4["cache_dtype"], kfp4["max_num_seqs"]) == (16384, "fp8", 8)
    mm = values(_point(MINIMAX, "minimax-m2.5", "b300", "fp8", isl=8192, c=8))
    assert (mm["max_num_seqs"], mm["max_num_batched_tokens"], mm["block_size"], mm["num_prompts"]) == (1024, 16384, 32, 80)
    h100 = values(_point("m", "minimax-m2.5", "h100", "fp8", tp=4, ep=4, c=64))
    assert (h100["max_num_seqs"], h100["max_num_batched_tokens"], h100["gpu_memory_utilization"]) == (256, 8192, 0.9)
    epdp = values(_point(EPDP, "minimax-m2.5", "b200", "fp4", tp=2, ep=2, dp=2, c=512))
    assert (epdp["max_num_seqs"], epdp["max_num_batched_tokens"], epdp["dp_spread"]) == (1024, 2048, 2)
    # every setting says where it came from; C where the recipe passes $CONC, vLLM's default where unset
    a = acc.engine_assumptions(_point(KIMI_INT4, "kimi-k2.5", "h200", "int4", tp=8, c=64))
    assert "client concurrency C" in a["max_num_seqs"][1] and "kimik2.5_int4" in a["max_num_seqs"][1]
    assert a["max_num_batched_tokens"][1].startswith("vLLM's default")
    assert all(isinstance(src, str) and src for _, src in a.values())
    # no recipe: vLLM's defaults, said so
    none = acc.engine_assumptions(_point("q", "qwen3", "h200", "bf16"))
    assert none["recipe"][0] == "vLLM defaults" and "no InferenceX recipe" in none["recipe"][1]
    assert none["max_num_seqs"][0] == 1024 and none["max_num_batched_tokens"][0] == 8192
    # sparse MLA (DSA) needs 64-token blocks: with no recipe, glm-5 gets them (16 would not resolve)
    glm = acc.engine_assumptions(_point("glm", "glm-5", "b200", "fp8", tp=8))
    assert glm["block_size"][0] == 64 and "DSA" in glm["block_size"][1]
    assert acc.scenario_from_columns(_point("glm", "glm-5", "b200", "fp8", tp=8)).engine["block_size"] == 64


def _run_point(scenario, model, hardware, dtype, workload, c, config_id, run_date, tp=1, ep=1, dp=1):
    isl, osl = {"1k1k": (1024, 1024), "8k1k": (8192, 1024), "1k8k": (1024, 8192)}[workload]
    return acc.Point(row=2, scenario=scenario, deployment=scenario.split("-cfg")[0], model=model, hardware=hardware,
                     dtype=dtype, engine="vllm", tp=tp, ep=ep, dp=dp, workload=workload, isl=isl, osl=osl,
                     concurrency=c, measured=1e-2, anchor_concurrency=4, config_id=config_id, run_date=run_date)


def test_a_run_gets_the_flags_it_states():
    """The bundled table (testdata/measured/inferencex_settings.csv) gives the flags each measured
    run passed, by scenario, workload and C; a null there is unrecorded (the recipe's value
    stands); a row of another run (config id, date, chip, engine) or an unknown C gives none."""
    p = _run_point("gpt-oss-120b-b200-fp4-vllm-tp4-cfg1.yaml", "gpt-oss-120b", "b200", "fp4", "1k1k", 4, "114",
                   "2026-02-25", tp=4)
    assert acc.stated_settings(p) == {"max_num_seqs": 512, "max_num_batched_tokens": 8192, "max_model_len": 2068,
                                      "enable_prefix_caching": False}
    for other in (dict(config_id="999"), dict(run_date="2026-02-26"), dict(hardware="h200"), dict(engine="sglang"),
                  dict(concurrency=3), dict(workload="8k1k")):
        assert acc.stated_settings(dataclasses.replace(p, **other)) == {}
    assert acc.stated_settings(dataclasses.replace(p, config_id="", run_date="")) != {}   # columns absent: by name
    a = acc.engine_assumptions(p)
    assert a["max_model_len"] == (2068, acc.STATED_SOURCE)              # the recipe's rule gives 1024 + 1024 + 20
    assert a["gpu_memory_utilization"][0] == 0.9 and a["gpu_memory_utilization"][1] != acc.STATED_SOURCE
    # deepseek-v4-pro on b200 (no recipe here): block 256, gmu 0.95, a budget of 8192 up to C = 128 and 2048 from 256
    d = [_run_point("deepseek-v4-pro-b200-fp4-vllm-tp8-cfg7.yaml", "deepseek-v4-pro", "b200", "fp4", "8k1k", c, "909",
                    "2026-09-03", tp=8) for c in (4, 128, 256)]
    got = [{k: acc.engine_assumptions(q)[k][0] for k in ("block_size", "gpu_memory_utilization",
                                                           "max_num_batched_tokens", "max_num_seqs")} for q in d]
    assert got == [dict(block_size=256, gpu_memory_utilization=0.95, max_num_batched_tokens=b, max_num_seqs=1024)
                   for b in (8192, 8192, 2048)]
    # one simulated engine per distinct setting: C = 4 and 128 share one, C = 256 runs its own
    keys = [acc_src().run_settings_key(q) for q in d]
    assert keys[0] == keys[1] != keys[2]


def test_the_flags_a_run_states_pick_the_recipe_version_it_ran():
    """minimax-m2.5 on h200: the runs that state max_num_seqs 512 and a 32768-token budget ran the
    later recipe, which also passes kv-cache-dtype fp8; the March runs state neither and keep the
    first recipe's bf16 cache and vLLM's 8192 budget. On b200 (fp8), a run stating gmu 0.95 ran
    the @07e171a version: no kv-cache-dtype or budget flag (the later recipe: fp8 and 2 x isl)."""
    late = acc.engine_assumptions(_run_point("minimax-m2.5-h200-fp8-vllm-tp4-cfg6.yaml", "minimax-m2.5", "h200",
                                             "fp8", "8k1k", 256, "606", "2026-05-26", tp=4))
    early = acc.engine_assumptions(_run_point("minimax-m2.5-h200-fp8-vllm-tp4-cfg5.yaml", "minimax-m2.5", "h200",
                                              "fp8", "8k1k", 4, "606", "2026-03-01", tp=4))
    assert (late["cache_dtype"][0], late["max_num_batched_tokens"][0], late["max_num_seqs"][0]) == ("fp8", 32768, 512)
    assert "HEAD" in late["cache_dtype"][1] and "in sample" in late["cache_dtype"][1]
    assert (early["cache_dtype"][0], early["max_num_batched_tokens"][0], early["max_num_seqs"][0]) == (
        "auto", 8192, 1024)
    b200 = acc.engine_assumptions(_run_point("minimax-m2.5-b200-fp8-vllm-tp2-cfg1.yaml", "minimax-m2.5", "b200",
                                             "fp8", "1k1k", 8, "633", "2026-03-28", tp=2))
    assert (b200["cache_dtype"][0], b200["max_num_batched_tokens"][0], b200["block_size"][0]) == ("auto", 8192, 32)
    assert "@07e171a" in b200["cache_dtype"][1]
    recipe = {"cache_dtype": "fp8", "source": "r", "variants": (dict(when={"a": 1}, set={"cache_dtype": "x"},
                                                                      source="v"),)}
    assert acc_src().recipe_variant(recipe, {"a": 1, "b": 2})["cache_dtype"] == "x"
    assert acc_src().recipe_variant(recipe, {"a": 2}) is recipe and acc_src().recipe_variant(None, {}) is None


# ----------------------------------------------------------------------------- batch rule simulate


def acc_src():
    from jaxprice._src import accuracy
    return accuracy


def serve_mod():
    from jaxprice._src import serve
    return serve


class Spy:
    """Wraps serve.build_schedules_batched, recording each job (deployment, items, engine);
    ``fail`` makes every run refused instead of run (the engine settings a run gets can be read
    without running it)."""

    def __init__(self, fail=False):
        self.calls, self.fail, self.real = [], fail, serve_mod().build_schedules_batched

    def __call__(self, jobs, **kw):
        from jaxprice._src.errors import JaxpriceError
        for dep, items, engine, *_ in jobs:
            self.calls.append(dict(deployment=dep, items=list(items), engine=dict(engine or {})))
        if self.fail:
            return [[JaxpriceError("spy: not run", field="engine") for _ in job[1]] for job in jobs]
        return self.real(jobs, **kw)


@pytest.fixture(scope="module")
def simulated():
    """The real serving simulation of the smallest deployment of the excerpt (minimax-m2.5 on b300,
    tp1, 8k1k at C = 4, 8, 16; its recipe sends 10 x C prompts)."""
    spy = Spy()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(serve_mod(), "build_schedules_batched", spy)
        rep = acc.evaluate_accuracy(EXCERPT, batch_rule="simulate", deployments=[MINIMAX])
    return rep, spy.calls


def test_simulate_scores_tpot_and_ttft_from_the_serving_runs(simulated):
    rep, calls = simulated
    assert rep.refused == [] and rep.info["batch_rule"] == "simulate" and rep.info["ttft_predicted"] is True
    (call,) = calls                                   # one job: the sweep's 3 levels in shared scheduler calls
    serve = serve_mod()
    assert [it[1] for it in call["items"]] == [serve.ClosedLoop(c, None) for c in (4, 8, 16)]     # 10 x C
    assert call["items"][0][0] == jp.Workload(8192, 1024, 0.8, 0)
    # as serve.simulate prices a schedule: its steps one by one (Schedule.step_times), then its metrics
    sched = serve.build_schedules(call["deployment"], call["items"], engine=call["engine"])[0]
    ref = serve.schedule_metrics(sched, np.asarray(sched.step_times(call["deployment"].coefficients)))["summary"]
    r4 = record(rep, MINIMAX, 4)
    assert r4["no_overlap_tpot_us"] == pytest.approx(float(ref["tpot_mean"]) * 1e6, rel=1e-9)
    assert r4["no_overlap_ttft_us"] == pytest.approx(float(ref["ttft_mean"]) * 1e6, rel=1e-9)
    assert r4["resident"] == round(float(ref["resident_mean"]))
    for r in rep.records:
        assert r["batch_rule"] == "simulate" and r["status"] == "priced" and r["bottleneck"] == ""
        assert 0 < r["overlap_tpot_us"] <= r["no_overlap_tpot_us"] < r["no_overlap_ttft_us"]
        assert 0 < r["overlap_ttft_us"] <= r["no_overlap_ttft_us"]
        for e in acc.ESTIMATES:
            assert math.isnan(r[f"{e}_step_us"])
            assert r[f"{e}_ttft_error"] == pytest.approx(r[f"{e}_ttft_us"] / r["measured_ttft_us"] - 1, rel=1e-12)
        assert 1 <= r["resident"] <= r["concurrency"]
    # TTFT shape error by hand: C = 16 against the sweep's anchor C = 4
    a, b = r4, record(rep, MINIMAX, 16)
    want = abs((b["no_overlap_ttft_us"] / a["no_overlap_ttft_us"]) / (b["measured_ttft_us"] / a["measured_ttft_us"]) - 1)
    assert b["no_overlap_ttft_shape_error"] == pytest.approx(want, rel=1e-12) and a["no_overlap_ttft_shape_error"] == 0
    for e in acc.ESTIMATES:
        s = rep.summary[e]["all"]
        rel = np.array([r[f"{e}_ttft_error"] for r in rep.records])
        shape = np.array([r[f"{e}_ttft_shape_error"] for r in rep.records])
        assert s["ttft_priced"] == 3
        assert s["ttft_mape"] == pytest.approx(np.mean(np.abs(rel)), rel=1e-12)
        assert s["ttft_mean_signed"] == pytest.approx(np.mean(rel), rel=1e-12)
        assert s["ttft_shape_mean"] == pytest.approx(np.mean(shape), rel=1e-12)
        assert s["ttft_shape_median"] == np.sort(shape)[len(shape) // 2]
    text = acc.format_report(rep)
    assert "batch rule simulate" in text and "not predicted" not in text
    assert set(rep.info["sweep_seconds"]) == {f"{MINIMAX}|8k1k"}


def test_simulate_runs_with_the_recipe_settings_and_records_them(simulated):
    rep, (call, *_) = simulated
    points, _ = acc.read_measurements(EXCERPT)
    p = next(q for q in points if q.deployment == MINIMAX)
    base, _ = acc.build_deployment(p)
    full = acc.recipe_deployment(base, acc.engine_assumptions(p), full=True)
    assert call["engine"] == {"max_num_seqs": 1024, "max_num_batched_tokens": 16384, "block_size": 32,
                              "max_model_len": 9472, "async_scheduling": True, "scheduler": "vllm",
                              "kv_capacity_tokens": float(full.plan.memory["kv_capacity_tokens"])}
    assert call["deployment"].scenario.engine["block_size"] == 32 and call["deployment"].plan.memory["block_size"] == 32
    # the engine ran vLLM's default graph mode (no recipe sets one), not the columns' PIECEWISE
    assert base.scenario.engine["cudagraph_mode"] == "PIECEWISE"
    assert call["deployment"].scenario.engine["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    mode, why = acc.engine_assumptions(p)["cudagraph_mode"]
    assert mode == "FULL_AND_PIECEWISE" and "cuda_graphs.md@0045689" in why
    r = record(rep, MINIMAX, 8)
    assert r["assumptions"].startswith("max_num_seqs=1024 budget=16384 gmu=0.9 kv=fp8 block=32 "
                                       "graphs=FULL_AND_PIECEWISE kv_tokens/rank=")
    assert "prompts=80" in r["assumptions"] and "max_model_len=9472" in r["assumptions"]
    (row,) = rep.info["assumptions"]
    assert (row["deployment"], row["workload"][0]) == (MINIMAX, "8k1k")
    assert "dp_placement" in row                                 # what the simulation adds is kept
    assert "minimaxm2.5_fp8_b300.sh" in row["num_prompts"][1]
    lines = acc.format_assumptions(rep, markdown=True)
    assert any(ln.startswith(f"| {MINIMAX} | 8k1k | vllm [") and "| 1024 [" in ln for ln in lines)


def test_simulate_gives_each_deployment_its_recipe_engine():
    """Read without running (the spy refuses): gpt-oss on h200 prices a bf16 ('auto') KV cache,
    max_num_seqs = C runs as the sweep's largest C; the dp2 deployment gets 2 x isl tokens."""
    spy = Spy(fail=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(serve_mod(), "build_schedules_batched", spy)
        rep = acc.evaluate_accuracy(EXCERPT, batch_rule="simulate", deployments=[GPT, EPDP], estimates=("no_overlap",))
    assert len(rep.refused) == 13 and all(r["reason"] == "the simulation refuses the run: field 'engine': spy: not run"
                                          for r in rep.refused)
    first = {}
    for c in spy.calls:
        first.setdefault(c["deployment"].name, c)
    g = first[GPT]
    assert [it[1].concurrency for it in g["items"]] == [4, 8, 16, 32, 64]
    assert [it[1].num_prompts for it in g["items"]] == [None] * 5            # 10 x C
    # max_model_len: the 9416 both runs state (testdata/measured/inferencex_settings.csv), not the recipe's 9472
    assert (g["engine"]["max_num_seqs"], g["engine"]["max_num_batched_tokens"], g["engine"]["max_model_len"]) == (
        64, 8192, 9416)
    dep = g["deployment"]
    assert dep.scenario.engine["cache_dtype"] == "auto"
    points, _ = acc.read_measurements(EXCERPT)
    base, _ = acc.build_deployment(points[0])
    assert base.scenario.engine["cache_dtype"] == "fp8"
    assert dep.plan.memory["kv_bytes_per_token"] == pytest.approx(2 * base.plan.memory["kv_bytes_per_token"], rel=1e-12)
    e = first[EPDP]
    assert (e["engine"]["max_num_seqs"], e["engine"]["max_num_batched_tokens"]) == (1024, 2048)
    # one job per deployment and workload, every level in it, each refused on its own
    assert sum(c["deployment"].name == GPT for c in spy.calls) == len({p.workload for p in points
                                                                       if p.deployment == GPT})


def test_a_run_the_simulation_refuses_is_a_refused_point_with_its_reason(tmp_path):
    rows = [r for r in rows_of() if r["deployment"] == MINIMAX and r["concurrency"] == "16"]
    for r in rows:
        r["isl"] = "150000"               # past the max_model_len the measured run states (9472)
    rep = acc.evaluate_accuracy(write_rows(tmp_path / "stated.csv", rows), batch_rule="simulate")
    (bad,) = rep.refused
    assert bad["reason"].startswith("the simulation refuses the run: ") and "exceeds max_model_len 9472" in bad["reason"]
    for r in rows:                        # a run the settings table does not know: the recipe's isl + osl + 256
        r["scenario"] = r["scenario"].replace("-cfg1", "-cfg99")
    rep = acc.evaluate_accuracy(write_rows(tmp_path / "big.csv", rows), batch_rule="simulate")
    (bad,) = rep.refused                  # a prompt the KV cache cannot hold (refused before any step runs)
    assert bad["concurrency"] == 16 and bad["reason"].startswith("the simulation refuses the run: ")
    assert "KV cache" in bad["reason"]
    for r in rows:
        r["isl"] = "1000000"              # past the model's own length: the recipe's engine would not start
    rep = acc.evaluate_accuracy(write_rows(tmp_path / "longer.csv", rows), batch_rule="simulate")
    (bad,) = rep.refused                  # refused for that, not simulated under the scenario's own engine
    assert bad["reason"].startswith("the recipe's deployment does not resolve: ")
    assert "vLLM would not start: more than the 196608 tokens minimax-m2.5 serves at" in bad["reason"]
    s = rep.summary["no_overlap"]["all"]
    assert (s["points"], s["priced"], s["refused"]) == (1, 0, 1)
    assert record(rep, MINIMAX, 16, "cfg99.yaml")["status"] == "refused"


def test_cli_simulate_json_has_ttft_buckets_and_split(simulated, capsys, tmp_path):
    rc = cli_main(["accuracy", str(EXCERPT), "--batch-rule", "simulate", "--deployment", MINIMAX,
                   "--json", "--quiet", "--out", str(tmp_path), "--plot", str(tmp_path / "s.png")])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    s = doc["summary"]["no_overlap"]["all"]
    assert s["points"] == 3 and s["ttft_priced"] == 3
    assert s["ttft_mape"] == pytest.approx(simulated[0].summary["no_overlap"]["all"]["ttft_mape"], rel=1e-12)
    assert {"ttft_mape", "ttft_mean_signed", "ttft_shape_mean", "ttft_shape_median"} <= set(s)
    assert doc["by_concurrency"]["no_overlap"]["C <= 16"]["points"] == 3
    assert set(doc["split"]["overlap"]) >= {"all"}
    pts = rows_of(tmp_path / "accuracy_points.csv")
    assert {"measured_ttft_us", "no_overlap_ttft_us", "no_overlap_ttft_error", "no_overlap_ttft_shape_error",
            "overlap_ttft_us", "assumptions"} <= set(pts[0])
    md = (tmp_path / "accuracy.md").read_text()
    assert md.startswith("# Accuracy: predicted against measured mean TPOT and mean TTFT (batch rule `simulate`)")
    assert "Engine settings of the simulated runs" in md and "--batch-rule simulate" in md
    assert (tmp_path / "s.png").stat().st_size > 10_000 and (tmp_path / "s-ttft.png").stat().st_size > 10_000


def _settings_rows(**flags):
    """Settings rows (the bundled table's layout) for the excerpt's MINIMAX sweep, with ``flags``."""
    rows = [r for r in rows_of() if r["deployment"] == MINIMAX and r["quantity"] == "mean_tpot"]
    base = dict(block_size="", enable_prefix_caching="", gpu_memory_utilization="", max_num_seqs="",
                max_num_batched_tokens="", max_model_len="")
    return [dict(scenario=r["scenario"], label=r["workload"], concurrency=r["concurrency"], framework="vllm",
                 gpu=r["hardware"], **{**base, **flags}) for r in rows]


def test_a_settings_file_gives_each_run_its_flags(tmp_path):
    """--settings FILE: a user's own table of the flags each run passed (read without running:
    the spy refuses every run). The excerpt's minimax-m2.5 sweep on b300 (recipe: 2 x isl =
    16384 tokens, block 32, 10 x C prompts) run with a 4096-token budget and 64 sequences; a flag
    left empty keeps the recipe's; a point the file has no row for keeps the recipe's too."""
    path = write_rows(tmp_path / "flags.csv", _settings_rows(max_num_batched_tokens="4096", max_num_seqs="64"))
    spy = Spy(fail=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(serve_mod(), "build_schedules_batched", spy)
        rep = acc.evaluate_accuracy(EXCERPT, batch_rule="simulate", deployments=[MINIMAX], settings=path)
    (call,) = spy.calls
    assert (call["engine"]["max_num_batched_tokens"], call["engine"]["max_num_seqs"], call["engine"]["block_size"]) == (
        4096, 64, 32)
    points, _ = acc.read_measurements(EXCERPT)
    mine = [p for p in acc_src().read_settings(points, path) if p.deployment == MINIMAX]
    a = acc.engine_assumptions(mine[0])
    assert a["max_num_batched_tokens"] == (4096, "stated by the run (the --settings file)")
    assert a["block_size"][0] == 32 and "minimaxm2.5_fp8_b300" in a["block_size"][1]
    other = [p for p in acc_src().read_settings(points, path) if p.deployment != MINIMAX][0]
    assert other.stated == () and acc.engine_assumptions(other)["max_num_batched_tokens"][1] != acc.STATED_SOURCE
    assert rep.info["settings_file"] == str(path)


@pytest.mark.parametrize("edit, match", [
    (lambda rows: [{k: v for k, v in r.items() if k != "label"} for r in rows], r"flags.csv:1.*missing column\(s\) label"),
    (lambda rows: [dict(r, gpu_memory_utilization="1.5") for r in rows],
     r"flags.csv:2, field 'gpu_memory_utilization', value '1.5': expected a fraction in \(0, 1\]"),
    (lambda rows: [dict(r, max_num_seqs="0") for r in rows], r"flags.csv:2, field 'max_num_seqs', value '0'"),
    (lambda rows: [dict(r, enable_prefix_caching="yes") for r in rows], r"field 'enable_prefix_caching', value 'yes'"),
    (lambda rows: rows + rows[:1], r"flags.csv:5, field 'concurrency'.*a second row"),
    (lambda rows: [{k: v for k, v in r.items() if k in ("scenario", "label", "concurrency")} for r in rows],
     r"no settings column"),
])
def test_cli_refuses_a_malformed_settings_file_in_one_line(tmp_path, capsys, edit, match):
    import re
    rows = edit(_settings_rows(max_num_batched_tokens="4096"))
    path = write_rows(tmp_path / "flags.csv", rows, fields=list(rows[0].keys()))
    rc = cli_main(["accuracy", str(EXCERPT), "--batch-rule", "simulate", "--settings", str(path), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and re.search(match, err), err


def test_cli_settings_need_the_simulation(tmp_path, capsys):
    path = write_rows(tmp_path / "flags.csv", _settings_rows(max_num_batched_tokens="4096"))
    assert cli_main(["accuracy", str(EXCERPT), "--batch-rule", "anchor", "--settings", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "field '--settings'" in err and "--batch-rule simulate" in err
    missing = tmp_path / "none.csv"
    assert cli_main(["accuracy", str(EXCERPT), "--settings", str(missing), "--quiet"]) == 2
    assert "cannot read the settings file" in capsys.readouterr().err


def test_the_assumed_kv_cache_is_the_one_vllm_logged():
    """vLLM's logged KV-cache size (testdata/measured/inferencex_engine_logs.csv) against the
    harness's deployment under the run's flags: gpt-oss-120b on 8 H200 at 1k1k (bf16 cache)
    13,313,412 tokens against vLLM's 13,253,415 (0.5%); minimax-m2.5 on 4 H200, the June run
    stating 512 sequences and a 32,768-token budget: the later recipe's fp8 cache, 2,444,973
    against 2,473,760 (1.2%; with the first recipe's bf16 cache it would be half); on 2 B200 the
    March run stating gmu 0.95: the @07e171a version's bf16 cache (4.2%; fp8 would be twice)."""
    def run(scenario, model, hw, dtype, label, tp, flags):
        isl, osl = {"1k1k": (1024, 1024), "1k8k": (1024, 8192)}[label]
        p = acc.Point(row=0, scenario=scenario, deployment=scenario[:-5], model=model, hardware=hw, dtype=dtype,
                      engine="vllm", tp=tp, ep=1, dp=1, workload=label, isl=isl, osl=osl, concurrency=4,
                      measured=1.0, anchor_concurrency=None, stated=tuple(sorted(flags.items())))
        dep, _ = acc.build_deployment(p)
        a = acc.engine_assumptions(p)
        return a["cache_dtype"][0], acc.recipe_deployment(dep, a, full=True).plan.memory["kv_capacity_tokens"]
    logged = {}
    with open(ROOT / "testdata" / "measured" / "inferencex_engine_logs.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            logged.setdefault((r["scenario"], r["label"], r["source_run_date"]), int(r["resolved_gpu_kv_tokens"]))
    kv, ours = run("gpt-oss-120b-h200-fp4-vllm-tp8.yaml", "gpt-oss-120b", "h200", "fp4", "1k1k", 8,
                   dict(gpu_memory_utilization=0.9, max_num_batched_tokens=8192, max_model_len=2068))
    assert kv == "auto" and ours / logged[("gpt-oss-120b-h200-fp4-vllm-tp8.yaml", "1k1k", "2026-05-30")] == \
        pytest.approx(1.0, abs=0.01)
    kv, ours = run("minimax-m2.5-h200-fp8-vllm-tp4.yaml", "minimax-m2.5", "h200", "fp8", "1k1k", 4,
                   dict(gpu_memory_utilization=0.95, max_num_seqs=512, max_num_batched_tokens=32768,
                        max_model_len=2304))
    assert kv == "fp8" and ours / logged[("minimax-m2.5-h200-fp8-vllm-tp4.yaml", "1k1k", "2026-06-05")] == \
        pytest.approx(1.0, abs=0.02)
    kv, ours = run("minimax-m2.5-b200-fp8-vllm-tp2.yaml", "minimax-m2.5", "b200", "fp8", "1k8k", 2,
                   dict(gpu_memory_utilization=0.95, max_model_len=9416, block_size=32))
    assert kv == "auto" and ours / logged[("minimax-m2.5-b200-fp8-vllm-tp2.yaml", "1k8k", "2026-03-28")] == \
        pytest.approx(1.0, abs=0.05)


def test_simulate_runs_a_hybrid_model_at_vllms_raised_block(tmp_path):
    # the recipe's block (vLLM's default 16) is below the attention block vLLM runs a model with
    # recurrent layers at: the run takes the plan's raised block (it was refused as an override)
    rows = [dict(r) for r in rows_of() if r["deployment"] == MINIMAX and r["concurrency"] == "16"]
    name = "qwen3.5-397b-a17b-b200-fp4-vllm-tp4"
    for r in rows:
        r.update(scenario=name + ".yaml", deployment=name, model="qwen3.5-397b-a17b", hardware="b200", dtype="fp4",
                 tp="4", ep="1", dp="1", concurrency="1", anchor_concurrency="1", isl="256", osl="8", workload="1k1k")
    rep = acc.evaluate_accuracy(write_rows(tmp_path / "hybrid.csv", rows), batch_rule="simulate",
                                estimates=("no_overlap",))
    assert rep.refused == []
    dep, _ = acc.build_deployment(acc.read_measurements(tmp_path / "hybrid.csv")[0][0])
    block = dep.plan.memory["block_size"]
    assert block == 2048 and dep.plan.memory["hybrid_block_minimum"] == 2048
    (rec,) = rep.records
    assert rec["status"] == "priced" and " block=2048 " in rec["assumptions"]
    (row,) = rep.info["assumptions"]
    assert row["block_size"][0] == 2048 and row["block_size"][1].startswith("raised from 16 (vLLM's CUDA default")


def test_a_bundled_sglang_file_serves_its_points_as_sglang():
    """The bundled *-sglang-* scenarios name their engine only in the file name: a point whose
    engine column says sglang is resolved as SGLang (a fitted set's engine scope, the hybrid
    block), as a deployment built from the columns is; a vLLM point on a file stays as it was."""
    from jaxprice._src.resolve import serving_engine
    kw = dict(row=2, model="qwen3.5-397b-a17b", hardware="b200", dtype="fp8", tp=8, ep=1, dp=1, workload="1k1k",
              isl=1024, osl=1024, concurrency=4, measured=5e-3, anchor_concurrency=4)
    name = "qwen3.5-397b-a17b-b200-fp8-sglang-tp8"
    sg, where = acc.build_deployment(acc.Point(scenario=f"{name}.yaml", deployment=name, engine="sglang", **kw))
    assert where.endswith(f"{name}.yaml") and serving_engine(sg.scenario) == "sglang"
    assert (sg.plan.memory["block_size"], sg.plan.memory["hybrid_block_minimum"]) == (16, 0)
    vl, _ = acc.build_deployment(acc.Point(scenario=f"{name}.yaml", deployment=name, engine="vllm", **kw))
    assert serving_engine(vl.scenario) == "vllm" and vl.plan.memory["block_size"] == 1024
