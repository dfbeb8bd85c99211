"""What a user building a serving simulator on jaxprice's API and CLI ran into (a walkthrough of
`serve`, `simulate`, `fit` and `accuracy` on small hand-made inputs), each fixed and pinned here.

Lean: tiny workloads on the default scenario, most checks on resolved plans or hand-built
results (no compile); one closed-loop sweep on a dp = 2 scenario and one small CLI run each for
serve and fit.
"""

from __future__ import annotations

import csv
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import jaxprice as jp
from jaxprice import cli
from jaxprice._src import fit as F
from jaxprice._src import serve
from jaxprice._src.resolve import scenario_path

S = "deepseek-v3-h200-fp8-sglang-tp8"
DP2 = "minimax-m2.5-b200-fp4-vllm-tp2-ep4-dp2"


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _with_spec(name, k):
    """The bundled scenario ``name`` with k draft tokens stated (engine.speculative), resolved."""
    d = jp.load_deployment(name)
    return jp.resolve(dataclasses.replace(d.scenario, engine={**d.scenario.engine,
                                                              "speculative": {"num_spec_tokens": k}}))


# ----------------------------------------------------------------------------- data parallel ranks


def test_dp_ranks_get_requests_in_proportion_to_their_clients():
    """C = 3 on two ranks: rank 0 keeps two clients, rank 1 one. The requests went round-robin (3
    each), so rank 1's one client sent half the run one request after another while rank 0 ran
    dry: 974 steps against 649 at C = 2 and 4, and tok/s at C = 3 below C = 2's (287 < 292 at
    isl 256 / osl 64). Now request i is client (i mod C)'s: 4 and 2 requests."""
    split = serve._split({"dp": 2}, None, np.zeros(6), np.zeros(6), 3)
    assert [idx.tolist() for idx, _c in split] == [[0, 2, 3, 5], [1, 4]]
    assert [c for _idx, c in split] == [2, 1]
    # C divisible by dp, C < dp and the open loop are as before: round-robin
    assert [i.tolist() for i, _ in serve._split({"dp": 2}, None, np.zeros(4), np.zeros(4), 2)] == [[0, 2], [1, 3]]
    assert [i.tolist() for i, _ in serve._split({"dp": 2}, None, np.zeros(3), np.zeros(3), 1)] == [[0, 1, 2], []]
    assert [i.tolist() for i, _ in serve._split({"dp": 2}, np.zeros(3), np.zeros(3), np.zeros(3), None)] == \
        [[0, 2], [1]]
    dep = jp.load_deployment(DP2)
    w = jp.Workload(64, 8, 1.0)
    two, three = (serve.build_schedules(dep, [(w, jp.ClosedLoop(c))])[0] for c in (2, 3))     # 10 x C prompts
    assert np.bincount(three.requests["rank"]).tolist() == [20, 10]
    assert three.steps == two.steps                 # 10 rounds on each rank (round-robin: 15 on rank 1)
    assert serve.schedule_counts(three)["resident_mean"] == pytest.approx(3.0)


# ----------------------------------------------------------------------------- open loop gradients


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """Three requests: two at once (a busy chain of steps), one after the engine idles; one of
    them a one-token request. The CSV test and the gradient test run it alike (one compile)."""
    p = tmp_path_factory.mktemp("trace") / "t.csv"
    p.write_text("arrival_s,input_len,output_len\n0,64,8\n0.01,32,4\n0.5,100,1\n")
    return p


def test_open_loop_gradient_is_the_fixed_schedules(trace):
    """The open loop recorded every step's start as its floor (not-before time), so a busy step's
    floor equalled the previous step's end and max(floor - start, 0) in step_end_times sat on its
    kink: the gradient took half of each earlier step (d mean TTFT / d hbm_derate -0.049 against
    the -0.156 that re-simulating gives; Llama-70B tp4, rate 20). A floor now binds only where the
    engine idled until an arrival. host_output_token adds 1 s per emitting step, so the chain rule
    through the step times is exact."""
    import jax
    import jax.numpy as jnp
    dep = jp.load_deployment(S)
    c = dep.coefficients
    tr = jp.load_trace(trace)
    res = jp.simulate(dep, None, tr)
    sched = res.schedule
    g = jax.grad(lambda x: jp.schedule_metrics(sched, x)["summary"]["ttft_mean"])(jnp.asarray(res.steps["time"]))
    emits = (np.asarray(sched.sums["emit"]).max(axis=0) > 0).astype(float)     # d step time / d host_output_token
    v = float(c["host_output_token"])
    h = 1e-3 * v
    rerun = (jp.simulate(dep, None, tr, coefficients=c.replace(host_output_token=v + h)).summary["ttft_mean"]
             - jp.simulate(dep, None, tr, coefficients=c.replace(host_output_token=v - h)).summary["ttft_mean"]) / (2 * h)
    assert rerun > 0.5
    assert float(g @ emits) == pytest.approx(rerun, rel=1e-6)
    # the step after the idle wait binds (its floor is the arrival, 0.5 s), the busy ones do not
    floor = np.asarray(sched.floor)
    assert 0.5 in floor.tolist() and np.isneginf(floor).sum() >= 1


# ----------------------------------------------------------------------------- speculative decoding


def test_speculation_the_plan_was_not_resolved_for_is_refused_and_a_free_drafter_is_said():
    """engine={"num_spec_tokens": 2} on a scenario with no speculation scheduled 3-token decode
    rows that the kernel priced as prefill rows with no drafter (DeepSeek-V3: TPOT 5.32 ms, the
    scenario stating k = 2 gives 5.34): refused, naming the scenario setting. A scenario that
    speculates on a model with no drafter in its graph prices no drafting: said under the table."""
    from jaxprice._src.cli_serve import drafter_note
    dep = jp.load_deployment(S)
    with pytest.raises(jp.JaxpriceError) as e:
        jp.build_schedule(dep, jp.Workload(64, 8), jp.ClosedLoop(2), engine={"num_spec_tokens": 2})
    assert "field 'num_spec_tokens', value 2" in str(e.value) and "engine.speculative.num_spec_tokens: 2" in \
        str(e.value) and "engine= override" in str(e.value)
    # the scenario's own k, restated, is fine (the settings only)
    spec = _with_spec(S, 2)
    assert serve.engine_settings(spec, {"num_spec_tokens": 2})[0]["num_spec_tokens"] == 2
    assert drafter_note(spec) == "" and drafter_note(dep) == ""        # MTP drafter priced; no speculation
    llama = _with_spec("llama-3.1-70b-instruct-h200-fp8-vllm-tp4", 2)
    assert drafter_note(llama).startswith("the drafter is NOT priced: llama-3.1-70b-instruct's graph has no "
                                          "speculator")


def test_acceptance_on_a_deployment_that_does_not_speculate(capsys):
    """It read "field 'acceptance', value 2.0: must be a number in [1, 1 + num_spec_tokens = 1]":
    neither the flag nor how to speculate. Refused before anything is simulated."""
    rc, out, err = run(capsys, "serve", S, "--isl", "64", "--osl", "8", "--concurrency", "1", "--acceptance", "2")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "field '--acceptance', value 2.0" in err and f"{S} does not speculate" in err
    assert f"{scenario_path(S)}: no engine.speculative.num_spec_tokens" in err


def test_block_size_flag_takes_only_what_vllm_starts_with(capsys):
    """--block-size 7 ran (a scenario stating it is refused: vLLM would not start)."""
    rc, out, err = run(capsys, "serve", S, "--isl", "64", "--osl", "8", "--concurrency", "1", "--block-size", "7")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "field '--block-size', value 7: vLLM would not start: the block size must be one of 1, 8, 16" in err


# ----------------------------------------------------------------------------- outputs


def test_csv_leaves_tpot_empty_for_a_one_token_request(capsys, tmp_path, trace):
    """A one-token request has no TPOT (the client leaves it out of the mean): its tpot_s was 0, so
    the column's mean (8.3 ms on this trace) sat below the summary's TPOT (12.4 ms)."""
    out_csv = tmp_path / "r.csv"
    rc, out, _ = run(capsys, "serve", S, "--trace", str(trace), "--csv", str(out_csv), "--json")
    assert rc == 0
    import json
    tpot_mean = json.loads(out)["runs"][0]["summary"]["tpot_mean"]
    with open(out_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["output_len"] for r in rows] == ["8", "4", "1"]
    assert rows[2]["tpot_s"] == "" and all(float(r["tpot_s"]) > 0 for r in rows[:2])
    assert np.mean([float(r["tpot_s"]) for r in rows[:2]]) == pytest.approx(tpot_mean, rel=1e-8)


def test_a_short_trace_row_is_named(tmp_path):
    """It read "field 'output_len', value None: row too short"."""
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_len,output_len\n0,64,8\n0,64\n")
    with pytest.raises(jp.JaxpriceError, match=r"t\.csv:3, field 'row', value '0,64': row too short: 2 value\(s\), "
                                               r"no output_len"):
        jp.load_trace(p)


def _steps(time, end, resident):
    n = len(time)
    return SimpleNamespace(steps={"time": np.asarray(time, float), "end": np.asarray(end, float),
                                  "resident": np.asarray(resident, float), "tokens": np.arange(1.0, n + 1),
                                  "prefill_tokens": np.zeros(n)})


def test_timeline_draws_each_step_over_its_own_span_and_idle_as_zero():
    """Values were drawn from each step's end (step="post"): the figure ran a step late (a closed
    loop's first prefill drawn after it ended) and an open loop's idle engine showed its last
    batch as resident. Steps: [0, 1], [1, 3], idle, [5, 6]."""
    from jaxprice._src.figures_serve import timeline_series
    ts = timeline_series(_steps([1.0, 2.0, 1.0], [1.0, 3.0, 6.0], [2, 1, 1]))
    np.testing.assert_array_equal(ts["x"], [0.0, 1.0, 3.0, 5.0, 6.0])
    np.testing.assert_array_equal(ts["resident"], [2, 1, 0, 1, 0])
    np.testing.assert_array_equal(ts["tokens"], [1, 2, 0, 3, 0])
    np.testing.assert_array_equal(ts["time"][[0, 1, 3]], [1.0, 2.0, 1.0])
    assert np.isnan(ts["time"][[2, 4]]).all()
    # more steps than points: blocks of steps, their means, from the first one's start
    ts = timeline_series(_steps([1.0] * 4, [1.0, 2.0, 3.0, 4.0], [1, 3, 5, 7]), max_points=2)
    np.testing.assert_array_equal(ts["x"], [0.0, 2.0, 4.0])
    np.testing.assert_array_equal(ts["resident"], [2.0, 6.0, 0.0])


def test_sweep_figure_reads_its_loads_and_times_as_numbers():
    """--plot --rate 2,20 drew the rate axis in powers of two (2^1 .. 2^4: 20 fell between two
    ticks) and the times as 6 x 10^1, 1.45 x 10^1: ticks at the loads run, labels as plain numbers."""
    from jaxprice._src.figures_serve import plot_serving_sweep
    summ = {"ttft_mean": 0.060, "ttft_p99": 0.070, "tpot_mean": 0.0124, "tpot_p99": 0.0132,
            "output_tps_per_user": 80.0, "output_tps_per_gpu": 8.0}
    runs = [SimpleNamespace(summary=summ), SimpleNamespace(summary={k: v * 1.2 for k, v in summ.items()})]
    fig = plot_serving_sweep(runs, [2.0, 20.0], load_label="rate (requests/s)", keep_open=True)
    fig.canvas.draw()
    ax = fig.axes
    assert [t.get_text() for t in ax[0].get_xticklabels()] == ["2", "20"]
    labels = [t.get_text() for a in ax[:2] for t in a.get_yticklabels() + a.get_yticklabels(minor=True)]
    assert labels and not any("times" in t or "^" in t for t in labels) and "70" in labels
    import matplotlib.pyplot as plt
    plt.close(fig)


# ----------------------------------------------------------------------------- fit


def _fake(name, model):
    return SimpleNamespace(name=name, dims={"model": model, "hardware": "h200"})


def test_cv_by_deployment_counts_a_split_once():
    """Two deployments: seeds 0, 1 and 2 held out the same one, printed as three folds with the
    same numbers and counted three times in the mean the prior is chosen by."""
    obs = [_fake("a-tp4", "a"), _fake("a-tp8", "a")]
    folds = F.cv_folds(obs, "deployment", seeds=(0, 1, 2))
    assert len(folds) == len({f.test for f in folds})
    assert len(folds) == 1 and folds[0].label == "seed 0 (= 1, 2)"
    assert sorted(folds[0].train + folds[0].test) == ["a-tp4", "a-tp8"]
    # the inner split of such a fold reads its first seed from the label (it parsed the last word)
    many = [_fake(f"{m}-{i}", m) for m in "ab" for i in range(4)]
    fold = F.Fold("deployment", "seed 0 (= 1, 2)", tuple(o.name for o in many), ("c-0",))
    (inner,) = F._inner_folds(fold, {o.name: o for o in many}, "deployment")
    assert inner.label == "seed 0" and inner.test == F.cv_folds(many, "deployment", seeds=(0,))[0].test
    assert [f.label for f in F.cv_folds(many, "deployment", seeds=(0, 1))] == ["seed 0", "seed 1"]


def test_accuracy_holds_out_what_fit_holds_out(tmp_path):
    """The accuracy report's held-out deployments were split over every deployment of the CSV, a
    refused one among them: it "held out" a deployment with no priced point (test: 0 priced) while
    jaxprice fit, which splits the deployments it has observations of, held out another."""
    head = "scenario,deployment,model,hardware,dtype,engine,tp,ep,dp,workload,isl,osl,concurrency,quantity,value,unit\n"
    rows = [("llama-3.1-70b-instruct-h200-fp8-vllm-tp4", 4, 14000), ("llama-3.1-70b-instruct-h200-fp8-vllm-tp8", 8, 9000),
            ("my-llama-tp3", 3, 9000), ("my-foo-tp1", 1, 9000)]
    text = "".join(f"{d}.yaml,{d},{'foo-model' if 'foo' in d else 'llama-3.1-70b-instruct'},h200,fp8,vllm,{tp},1,1,"
                   f"1k1k,1024,1024,4,mean_tpot,{v},us\n" for d, tp, v in rows)
    path = tmp_path / "m.csv"
    path.write_text(head + text)
    report = jp.evaluate_accuracy(path)
    assert len(report.refused) == 2
    obs, refused, _points = F.observations_from_measurements(path)
    names = sorted(o.name for o in obs)
    assert names == sorted(d for d, _tp, _v in rows[:2])
    keep, held = F.split_by_deployment(names, 0.25, seed=0, stratify={o.name: o.deployment.graph.name for o in obs})
    assert report.info["split"]["test"] == held and report.info["split"]["train"] == keep
    assert report.split_summary()["test"]["priced"] == 1


def test_fit_says_the_unit_looks_wrong_and_prints_no_nan_loss(capsys, tmp_path):
    """accuracy notes a file whose TPOTs read as seconds (a unit column of ms over microseconds);
    fit said nothing, fitted hbm_derate to its bound and wrote the set. Its table printed 'nan'
    losses where nothing was descended (prior inf)."""
    d = "llama-3.1-70b-instruct-h200-fp8-vllm-tp4"
    head = "scenario,deployment,model,hardware,dtype,engine,tp,ep,dp,workload,isl,osl,concurrency,quantity,value,unit\n"
    rows = "".join(f"{d}.yaml,{d},llama-3.1-70b-instruct,h200,fp8,vllm,4,1,1,1k1k,1024,1024,{c},mean_tpot,{v},ms\n"
                   for c, v in ((4, 14000), (16, 17000)))
    path = tmp_path / "m.csv"
    path.write_text(head + rows)
    rc, out, err = run(capsys, "fit", str(path), "--free", "hbm_derate", "--prior", "inf", "--quiet")
    assert rc == 0
    assert "note: the median mean TPOT of" in err and "check its unit column" in err
    train = next(ln for ln in out.splitlines() if ln.startswith("train "))
    assert "nan" not in out and train.split()[3:5] == ["-", "-"]


# ----------------------------------------------------------------------------- open loop, async scheduling


def test_open_loop_request_landing_in_a_busy_step_waits_for_the_step_after_next(trace):
    """Under async scheduling vLLM schedules step k + 1 when step k starts (serving-reference
    §3), so a request landing while step k runs is first scheduled in step k + 2. The open loop
    scheduled it in step k + 1 (the divergence open-loop-async-arrival, now gone). The trace: B
    at 10 ms lands in step 0 (A's 31 ms prefill) and got its first token from step 1 (TTFT
    86.38 ms); now step 1 decodes A alone (scheduled at 0) and B's first token comes from step 2,
    one A-alone decode step (9.71 ms) later: 96.09 ms. C at 0.5 s meets an idle engine (A and B
    done) and schedules on arrival, as before; without async scheduling nothing changes. (The
    gradient test's trace and compile; async is a lane value.)"""
    dep = jp.load_deployment(S)
    tr = jp.load_trace(trace)
    on, off = (jp.simulate(dep, None, tr, engine=e) for e in (None, {"async_scheduling": False}))
    assert on.schedule.requests["first_step"].tolist() == [0, 2, 9]
    assert off.schedule.requests["first_step"].tolist() == [0, 1, 8]       # as before the fix
    assert np.asarray(on.schedule.sums["n_requests"])[0, :3].tolist() == [1, 1, 2]     # step 1: A alone

    def ttft_from_steps(res, step, arrival, i):
        t = np.asarray(res.steps["time"])
        end = serve.step_end_times(res.schedule, t)[step]
        return end - arrival + serve.request_latencies(res.schedule, t)["admission"][i]

    for res, (b, c) in ((on, (2, 9)), (off, (1, 8))):
        assert res.requests["ttft"][1] == pytest.approx(ttft_from_steps(res, b, 0.01, 1), rel=1e-12)
        assert res.requests["ttft"][2] == pytest.approx(ttft_from_steps(res, c, 0.5, 2), rel=1e-12)
    assert on.requests["ttft"][1] - off.requests["ttft"][1] == pytest.approx(float(on.steps["time"][1]), rel=1e-3)
    assert on.requests["ttft"][2] == pytest.approx(off.requests["ttft"][2], rel=1e-12)     # idle: unchanged
