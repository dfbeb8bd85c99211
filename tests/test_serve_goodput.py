"""Service-level objectives and goodput (vLLM's ``vllm bench serve --goodput``; serve.check_slo).

A request is good when each metric the SLO names (ttft, tpot, e2el) is <= its target, a one-token
request's TPOT counting 0; goodput = good requests / the run's duration, slo_attainment = their
share. The runs reuse test_serve.py's and test_cli_serve.py's shapes (the mixed 1-3 token workload
at C = 2; prompts of 64 and 16 outputs at C = 1, 2), so they share its compiled scheduler; every
refusal comes before anything is scheduled.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

import jaxprice as jp
from jaxprice import cli
from jaxprice._src import cli_serve, serve

DEP = "deepseek-v3-h200-fp8-sglang-tp8"
SYNC = {"async_scheduling": False}
MIXED = (jp.Workload(256, 3, 0.0, 1), jp.ClosedLoop(2, 8))       # outputs of 1 to 3 tokens (test_serve.py)
SMALL = ("--isl", "64", "--osl", "16", "--range-ratio", "1")       # test_cli_serve.py's runs


@pytest.fixture(scope="module")
def dep():
    return jp.load_deployment(DEP)


@pytest.fixture(scope="module")
def plain(dep):
    """The mixed run without an SLO."""
    return jp.simulate(dep, *MIXED, engine=SYNC)


def _good_by_hand(req, ttft=math.inf, tpot=math.inf, e2el=math.inf):
    """vLLM's calculate_metrics from the per-request arrays: TPOT = (finish - first token) / (out - 1),
    0 for one output token; good when every metric <= its target."""
    out = req["output_len"]
    tp = np.where(out > 1, (req["finish"] - req["first_token"]) / np.maximum(out - 1, 1), 0.0)
    return (req["ttft"] <= ttft) & (tp <= tpot) & (req["e2e"] <= e2el)


def test_goodput_by_hand_targets_met_exactly_count(dep, plain):
    r = plain.requests
    out = r["output_len"]
    multi = np.flatnonzero(out > 1)
    # targets equal to some request's own value: it is good (<=, not <)
    t_ttft = float(np.sort(r["ttft"])[5])
    t_tpot = float(np.sort(r["tpot"][multi])[len(multi) // 2])
    t_e2e = float(np.sort(r["e2e"])[6])
    slo = {"ttft": t_ttft, "tpot": t_tpot, "e2el": t_e2e}
    res = jp.simulate(dep, *MIXED, engine=SYNC, slo=slo)
    want = _good_by_hand(res.requests, t_ttft, t_tpot, t_e2e)
    assert 0 < want.sum() < want.size                          # a mix, so the count says something
    assert (res.requests["good"] == want).all()
    assert (res.requests["ttft"] == t_ttft).any() and want[res.requests["ttft"] == t_ttft].any()
    s = res.summary
    assert s["goodput"] == pytest.approx(want.sum() / s["duration"], rel=1e-12)
    assert s["slo_attainment"] == pytest.approx(want.sum() / want.size, rel=1e-12)
    # each target alone, the same count from the same arrays
    for name, kw in (("ttft", {"ttft": t_ttft}), ("tpot", {"tpot": t_tpot}), ("e2el", {"e2el": t_e2e})):
        one = jp.simulate(dep, *MIXED, engine=SYNC, slo={name: slo[name]})
        assert one.summary["slo_attainment"] == pytest.approx(_good_by_hand(one.requests, **kw).mean(), rel=1e-12)
    assert res.assumptions["slo"][0] == f"ttft <= {t_ttft * 1e3:g} ms, tpot <= {t_tpot * 1e3:g} ms, " \
                                        f"e2el <= {t_e2e * 1e3:g} ms"


def test_one_token_requests_meet_any_tpot_target(dep, plain):
    # a TPOT target no multi-token request meets: exactly the one-token requests are good (their
    # TPOT counts 0, vLLM's all_tpots), and with a TTFT target none of them meets, none is
    res = jp.simulate(dep, *MIXED, engine=SYNC, slo={"tpot": 1e-9})
    one = res.requests["output_len"] == 1
    assert 0 < one.sum() < one.size and (res.requests["tpot"][~one] > 1e-9).all()
    assert (res.requests["good"] == one).all()
    assert res.summary["slo_attainment"] == pytest.approx(one.mean(), rel=1e-12)
    worst = float(res.requests["ttft"][one].min()) / 2
    both = jp.simulate(dep, *MIXED, engine=SYNC, slo={"tpot": 1e-9, "ttft": worst})
    assert both.summary["goodput"] == 0.0 and not both.requests["good"].any()


def test_slo_good_reads_a_one_token_tpot_as_zero_whatever_the_array_holds():
    # the rule itself, on arrays by hand: the simulation's one-token TPOT is 0 already, a client's
    # may be anything (vLLM leaves it out of TPOT): it never makes the request bad
    m = {"ttft": np.array([0.1, 0.1, 0.3]), "tpot": np.array([7.0, 0.01, 0.01]), "e2e": np.array([1.0, 2.0, 2.0])}
    out = np.array([1, 2, 2])
    assert serve.slo_good(m, out, {"tpot": 0.01}).tolist() == [True, True, True]
    assert serve.slo_good(m, out, {"tpot": 0.009}).tolist() == [True, False, False]
    assert serve.slo_good(m, out, {"ttft": 0.1, "e2el": 1.5}).tolist() == [True, False, False]
    assert serve.slo_good(m, out, {"ttft": 0.3, "tpot": 0.01, "e2el": 2.0}).tolist() == [True, True, True]


def test_no_slo_no_new_keys_and_numbers_unchanged(dep, plain):
    res = jp.simulate(dep, *MIXED, engine=SYNC, slo={"e2el": 1e9})
    assert "goodput" not in plain.summary and "slo_attainment" not in plain.summary
    assert "good" not in plain.requests and "slo" not in plain.assumptions
    assert set(res.summary) - set(plain.summary) == {"goodput", "slo_attainment"}
    assert all(res.summary[k] == plain.summary[k] for k in plain.summary)           # bit for bit
    assert all(np.array_equal(res.requests[k], plain.requests[k]) for k in plain.requests)


def test_attainment_one_with_huge_targets_and_zero_with_tiny(dep, plain):
    huge = jp.simulate(dep, *MIXED, engine=SYNC, slo={"ttft": 1e9, "tpot": 1e9, "e2el": 1e9})
    assert huge.summary["slo_attainment"] == 1.0
    assert huge.summary["goodput"] == pytest.approx(plain.summary["requests_per_s"], rel=1e-12)
    tiny = jp.simulate(dep, *MIXED, engine=SYNC, slo=[("ttft", 1e-9), ("e2el", 1e9)])     # pairs work too
    assert tiny.summary["slo_attainment"] == 0.0 and tiny.summary["goodput"] == 0.0


def test_schedule_metrics_goodput_in_jnp_as_in_numpy(dep, plain):
    import jax.numpy as jnp
    sc = plain.schedule
    slo = {"ttft": float(np.median(plain.requests["ttft"]))}
    a = serve.schedule_metrics(sc, plain.steps["time"], slo=slo)
    b = serve.schedule_metrics(sc, jnp.asarray(plain.steps["time"]), slo=slo)
    assert float(b["summary"]["goodput"]) == pytest.approx(float(a["summary"]["goodput"]), rel=1e-12)
    assert np.array_equal(np.asarray(b["good"]), a["good"]) and 0 < a["good"].sum() < a["good"].size


BAD_SLO = [
    ({"e2e": 1.0}, "field 'slo', value 'e2e': unknown SLO metric", "E2E is 'e2el'"),
    ({"TTFT": 1.0}, "value 'TTFT': unknown SLO metric", "known: ttft, tpot, e2el"),
    ({"itl": 1.0}, "value 'itl': unknown SLO metric", ""),
    ({"ttft": 0}, "field 'slo['ttft']', value 0: must be a finite number > 0 (seconds)", ""),
    ({"tpot": -0.05}, "field 'slo['tpot']', value -0.05", ""),
    ({"e2el": math.inf}, "field 'slo['e2el']', value inf", ""),
    ({"ttft": math.nan}, "field 'slo['ttft']', value nan", ""),
    ({"ttft": True}, "field 'slo['ttft']', value True", ""),
    ({"ttft": "0.5"}, "field 'slo['ttft']', value '0.5'", ""),
    ([("ttft", 1.0), ("ttft", 2.0)], "field 'slo', value 'ttft': names this metric twice", ""),
    ({}, "field 'slo', value {}: names no target", ""),
    ("ttft:500", "field 'slo', value 'ttft:500': must be None or a dict", ""),
]


@pytest.mark.parametrize("slo,want,also", BAD_SLO, ids=[repr(b[0]) for b in BAD_SLO])
def test_bad_slo_refused_before_anything_runs(dep, slo, want, also):
    with pytest.raises(jp.JaxpriceError) as e:
        jp.simulate(dep, *MIXED, engine=SYNC, slo=slo)
    assert want in str(e.value) and also in str(e.value), str(e.value)
    assert e.value.field.startswith("slo")


def test_sweep_refuses_a_bad_slo_too(dep):
    with pytest.raises(jp.JaxpriceError, match="unknown SLO metric"):
        jp.simulate_sweep(dep, jp.Workload(64, 16, 1.0), [1, 2], slo={"ttfb": 1.0})


# ----------------------------------------------------------------------------- the command


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_goodput_json_table_csv_and_the_highest_load(capsys, tmp_path, dep):
    # the CLI's sweep, through the API: a TTFT target between C = 1's and C = 2's
    runs = jp.simulate_sweep(dep, jp.Workload(64, 16, 1.0), [1, 2])
    lo = float(runs[0].requests["ttft"].max())
    assert lo < float(runs[1].requests["ttft"].min())
    t_ms = (lo + float(runs[1].requests["ttft"].min())) / 2 * 1e3
    api = jp.simulate_sweep(dep, jp.Workload(64, 16, 1.0), [1, 2], slo={"ttft": t_ms / 1e3, "e2el": 1e3})
    assert [r.summary["slo_attainment"] for r in api] == [1.0, 0.0]
    rc, out, _ = run(capsys, "serve", DEP, *SMALL, "--concurrency", "1,2", "--json",
                     "--goodput", f"ttft:{t_ms!r},e2el:1e6")
    doc = json.loads(out)
    assert rc == 0 and doc["slo"] == {"ttft": pytest.approx(t_ms / 1e3, rel=1e-15), "e2el": 1e3}
    assert doc["slo_attainment_target"] == cli_serve.SLO_ATTAINMENT_TARGET == 0.9
    assert doc["slo_highest_load"] == 1 and "slo_closest_load" not in doc
    for got, want in zip(doc["runs"], api):
        assert got["summary"]["goodput"] == pytest.approx(want.summary["goodput"], rel=1e-12)
        assert got["summary"]["slo_attainment"] == want.summary["slo_attainment"]
    # the table: two columns more, and the line naming the load
    rc, out, _ = run(capsys, "serve", DEP, *SMALL, "--concurrency", "1,2", "--goodput", f"ttft:{t_ms!r}",
                     "e2el:1e6", "--csv", str(tmp_path / "r.csv"))
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["C", "TTFT"])
    assert lines[head].split()[-3:] == ["goodput", "SLO", "%"]
    assert [ln.split()[-1] for ln in lines[head + 1:head + 3]] == ["100.0", "0.0"]
    assert f"SLO (vLLM's --goodput): ttft <= {t_ms:g} ms, e2el <= 1e+06 ms" in out
    (line,) = [ln for ln in lines if ln.startswith("highest load with >= 90% of requests")]
    assert f"concurrency 1 (100.0% good, goodput {api[0].summary['goodput']:.3g} req/s)" in line
    with open(tmp_path / "r.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["good"] for r in rows] == ["1"] * 10 + ["0"] * 20
    # no request good at any load: none, and no load named the closest (all are 0% good)
    rc, out, _ = run(capsys, "serve", DEP, *SMALL, "--concurrency", "1,2", "--goodput", "e2el:0.001")
    (line,) = [ln for ln in out.splitlines() if ln.startswith("highest load with")]
    assert rc == 0 and line.endswith(": none; no request meets every target at any load")
    doc = json.loads(run(capsys, "serve", DEP, *SMALL, "--concurrency", "1,2", "--goodput", "e2el:0.001",
                         "--json")[1])
    assert doc["slo_highest_load"] is None and doc["slo_closest_load"] is None


def test_cli_without_goodput_has_no_slo_output(capsys, tmp_path):
    rc, out, _ = run(capsys, "serve", DEP, *SMALL, "--concurrency", "1,2", "--json")
    doc = json.loads(out)
    assert rc == 0 and "slo" not in doc and "goodput" not in doc["runs"][0]["summary"]
    assert "slo" not in doc["runs"][0]["assumptions"]


BAD_CLI = [
    (("ttft",), "field '--goodput', value 'ttft': expected NAME:MS pairs"),
    (("ttft:500", "e2e:9000"), "value 'e2e': unknown SLO metric"),
    (("ttft:500,tpot:0",), "field '--goodput tpot', value 0.0: must be a finite number > 0 (milliseconds)"),
    (("ttft:-5",), "field '--goodput ttft', value -5.0"),
    (("tpot:inf",), "field '--goodput tpot', value inf"),
    (("ttft:5", "ttft:6"), "field '--goodput', value 'ttft': names this metric twice"),
    (("ttft:x",), "field '--goodput ttft', value 'x': expected a number of milliseconds"),
    (("ttft:5,,tpot:3",), "value 'ttft:5,,tpot:3': has an empty entry"),
    (("ttft:1:2",), "value 'ttft:1:2': expected NAME:MS pairs"),
]


@pytest.mark.parametrize("tokens,want", BAD_CLI, ids=[" ".join(t) for t, _ in BAD_CLI])
def test_cli_bad_goodput_exits_2_with_one_line(capsys, tokens, want):
    rc, out, err = run(capsys, "serve", DEP, *SMALL, "--concurrency", "2", "--goodput", *tokens)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("jaxprice serve: error: ") and want in lines[0], lines[0]


def test_plot_draws_the_targets_and_each_loads_share_good(dep, plain):
    """serve --plot with --goodput: the TTFT and TPOT targets as lines across their panels, each
    load's share of requests good beside its throughput point; without an SLO neither."""
    from jaxprice._src.figures_serve import plot_serving_sweep
    slo = {"ttft": 0.5, "tpot": 0.02}
    res = jp.simulate(dep, *MIXED, engine=SYNC, slo=slo)
    fig = plot_serving_sweep([res], [2.0], slo=slo, keep_open=True)
    ttft_ax, tpot_ax, thr_ax = fig.axes
    assert any(list(ln.get_ydata()) == [500.0, 500.0] for ln in ttft_ax.get_lines())
    assert any(list(ln.get_ydata()) == [20.0, 20.0] for ln in tpot_ax.get_lines())
    share = f"2 ({res.summary['slo_attainment'] * 100:.0f}% good)"
    assert [t.get_text() for t in thr_ax.texts] == [share]
    bare = plot_serving_sweep([plain], [2.0], keep_open=True)
    assert all(len(a.get_lines()) == 2 for a in bare.axes[:2]) and [t.get_text() for t in bare.axes[2].texts] == ["2"]
    import matplotlib.pyplot as plt
    plt.close(fig)
    plt.close(bare)


def test_the_closest_load_is_the_most_attaining_and_none_when_nothing_is_good():
    from types import SimpleNamespace
    res = lambda *att: [SimpleNamespace(summary={"slo_attainment": a}) for a in att]     # noqa: E731
    assert cli_serve.slo_best_load([1, 2, 4], res(0.95, 0.9, 0.4)) == (2, 1)
    assert cli_serve.slo_best_load([1, 2, 4], res(0.5, 0.8, 0.8)) == (None, 4)      # a tie: the higher load
    assert cli_serve.slo_best_load([1, 2], res(0.0, 0.0)) == (None, None)
