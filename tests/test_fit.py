"""jaxprice.fit: free-coefficient parsing, splits by deployment, synthetic recovery, bounds,
early stopping, the written set round-tripping through the loader, the `jaxprice fit` command
and the GPU microbenchmark's CPU dry run.

Synthetic recovery. Step times are generated with the kernel from the registry's values for
two bundled Llama-3.1-70B deployments on H200 (tp1 and tp2: one chip, so the chip-scoped keys
are shared) over a grid of decode batches (1 to 512 requests, contexts 512 to 16384 tokens).
The fit starts from the same deployments with three coefficients perturbed (hbm_derate x0.8,
attention_decode_rate x1.3, gemm_eps_max_fp8 x1.2) and must recover the registry's values to
1%. The three are identifiable from decode steps: KV reads grow with requests x context, GEMM
time and elementwise traffic with tokens, weight reads not at all. (gemm_m_half is not among
them: in a decode-only NoOverlap the ramp's intercept, 2nk * m_half / (peak * eps_max), is a
per-step constant like the weight reads, so m_half, eps_max and hbm_derate together have a
one-parameter family of exact fits; the test would pass or fail on the optimizer's path, not
on the fitter's correctness.)

Compilations are shared: the fitter compiles one loss per plan structure (the deployment axis:
both deployments in one), padded shape and settings, whatever the free coefficients, so every
fit here on these two deployments and this grid reuses one compilation.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import math
import os

import numpy as np
import pytest
import yaml

import jaxprice as jp
from jaxprice import fit as F
from jaxprice._src import fit as FS
from jaxprice.cli import main as cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOYMENTS = ("llama-3.1-70b-instruct-h200-fp8-vllm-tp1", "llama-3.1-70b-instruct-h200-fp8-vllm-tp2")
PERTURB = {"hbm_derate": 0.8, "attention_decode_rate": 1.3, "gemm_eps_max_fp8": 1.2}
GRID = [(c, ctx) for c in (1, 8, 64, 256, 512) for ctx in (512, 4096, 16384)]
ROWS = 512


def _plain(coefs):
    """The same values without cites (equal pytrees share one compiled price_many)."""
    return jp.Coefficients(coefs.values, coefs.names)


def _batches(grid=GRID, rows=ROWS):
    return jp.Batch.stack([jp.Batch.decode(c, ctx, pad_to=rows, decode_threshold=8) for c, ctx in grid])


@pytest.fixture(scope="module")
def truth():
    """{name: (Deployment with the registry's values, stacked batches, step times (s))}."""
    out = {}
    for name in DEPLOYMENTS:
        dep = jp.load_deployment(name)
        batches = _batches()
        out[name] = (dep, batches, np.asarray(jp.price_many(dep.plan, _plain(dep.coefficients), batches).no_overlap))
    return out


def _perturbed(dep, factors):
    c = dep.coefficients
    return dataclasses.replace(dep, coefficients=c.replace(**{k: c[k] * f for k, f in factors.items()}))


def _observations(truth, factors, *, scale=None):
    """Observations starting from perturbed values; ``scale`` multiplies the measured times."""
    out = []
    for name, (dep, batches, times) in truth.items():
        meas = times * (scale or {}).get(name, 1.0)
        out.append(F.Observations(name, _perturbed(dep, factors), batches, meas, target="step"))
    return out


@pytest.fixture(scope="module")
def recovered(truth):
    obs = _observations(truth, PERTURB)
    return obs, F.fit_coefficients(obs, list(PERTURB), steps=300, eval_every=10, patience=10)


# ----------------------------------------------------------------------------- Free


@pytest.mark.parametrize("text, pattern, scope, bound", [
    ("hbm_derate", "hbm_derate", ("hardware",), 2.0),
    ("gemm_m_half_*@hardware:1.5", "gemm_m_half_*", ("hardware",), 1.5),
    ("gemm_*@hardware,model:3", "gemm_*", ("hardware", "model"), 3.0),
    ("host_output_token@global", "host_output_token", (), 2.0),
    ("host_output_token@", "host_output_token", (), 2.0),
    (" collective_floor_*@tp , ep:4 ", "collective_floor_*", ("tp", "ep"), 4.0),
])
def test_free_parse(text, pattern, scope, bound):
    f = F.Free.parse(text)
    assert (f.pattern, f.scope, f.bound) == (pattern, scope, bound)
    assert F.Free.parse(f.label()) == f


@pytest.mark.parametrize("text, words", [
    ("", "empty"),
    ("@hardware", "empty"),
    ("hbm_derate:abc", "number"),
    ("hbm_derate:0.5", "factor > 1"),
    ("hbm_derate:1", "factor > 1"),
    ("hbm_derate:inf", "factor > 1"),
    ("hbm_derate@chip", "unknown scope dimension"),
    ("hbm_derate@hardware@model", "at most one"),
    ("hbm_derate@hardware,hardware", "repeated"),
])
def test_free_parse_errors(text, words):
    with pytest.raises(jp.JaxpriceError) as err:
        F.Free.parse(text)
    assert words in str(err.value)
    assert err.value.field == "free"
    assert repr(text) in str(err.value)


# ----------------------------------------------------------------------------- split


def test_split_never_splits_a_deployment_and_covers_every_stratum():
    names = [f"{m}-d{i}" for m in ("a", "b", "c") for i in range(5 if m != "c" else 2)]
    model = {n: n.split("-")[0] for n in names}
    for seed in range(6):
        train, test = F.split_by_deployment(names + names[:3], 0.25, seed=seed, stratify=model)
        assert sorted(train + test) == sorted(names)          # each name once, duplicates merged
        assert not set(train) & set(test)
        for m in "abc":
            assert any(model[n] == m for n in train) and any(model[n] == m for n in test)
        assert sum(model[n] == "a" for n in test) == 1        # round(0.25 * 5)
    assert F.split_by_deployment(names, 0.25, seed=3, stratify=model) == \
        F.split_by_deployment(names, 0.25, seed=3, stratify=model.get)
    assert F.split_by_deployment(names, 0.0) == (sorted(names), [])
    assert F.split_by_deployment(["only"], 0.5) == (["only"], [])
    with pytest.raises(jp.JaxpriceError, match="held-out fraction"):
        F.split_by_deployment(names, 1.0)


def test_holdout_splits_observations_by_deployment(truth):
    obs = _observations(truth, {})
    res = F.fit_coefficients(obs, ["hbm_derate"], holdout=0.5, steps=0)
    assert len(res.train) == 1 and len(res.held_out) == 1
    assert set(res.train + res.held_out) == set(DEPLOYMENTS)
    assert res.settings["held_out_points"] == len(GRID)
    with pytest.raises(jp.JaxpriceError, match="both the training and the held-out"):
        F.fit_coefficients(obs, ["hbm_derate"], held_out=obs[:1], steps=0)


# ----------------------------------------------------------------------------- recovery


def test_synthetic_recovery_to_one_percent(truth, recovered):
    obs, res = recovered
    assert res.initial["train"] > 1e-3                       # the perturbation is visible
    assert res.final["train"] < 1e-10
    fitted = {e["name"]: e for e in res.entries()}
    assert set(fitted) == set(PERTURB)
    dep = truth[DEPLOYMENTS[0]][0]
    for name, factor in PERTURB.items():
        true = float(dep.coefficients[name])
        assert fitted[name]["value"] == pytest.approx(true, rel=0.01), name
        assert fitted[name]["multiplier"] == pytest.approx(1 / factor, rel=0.01), name
        assert fitted[name]["scope"] == {"hardware": "h200"}
        assert sorted(fitted[name]["deployments"]) == sorted(DEPLOYMENTS)
    # every deployment's own coefficients: the recovered ones, the rest untouched
    for o in obs:
        got = res.coefficients_for(o.deployment)
        true = truth[o.name][0].coefficients
        for name in got.names:
            assert float(got[name]) == pytest.approx(float(true[name]), rel=0.01), name
        assert np.allclose(res.predict(o), o.measured, rtol=1e-4)
    # all at once on the deployment axis (one compile per structure): the same predictions
    many = res.predict_all(obs)
    for o in obs:
        np.testing.assert_allclose(many[o.name], res.predict(o), rtol=1e-12)


def test_fit_in_smooth_mode_also_recovers(truth):
    # step times priced in smooth mode at the fit's own temperature: recovered exactly
    dep, _, _ = truth[DEPLOYMENTS[1]]
    batches = _batches(GRID[::2], rows=512)
    times = np.asarray(jp.price_many(dep.plan, dep.coefficients, batches, temperature=0.05).no_overlap)
    obs = [F.Observations(dep.name, _perturbed(dep, {"attention_decode_rate": 1.3}), batches, times, target="step")]
    res = F.fit_coefficients(obs, ["attention_decode_rate"], steps=150, temperature=0.05)
    assert res.settings["temperature"] == 0.05
    assert res.multipliers()["attention_decode_rate@hardware=h200"] == pytest.approx(1 / 1.3, rel=0.01)


def test_points_that_combine_batches(truth):
    # each point the mean of one request count's three contexts (as a mean TPOT averages steps)
    dep, batches, times = truth[DEPLOYMENTS[0]]
    combine = np.kron(np.eye(5), np.full((1, 3), 1 / 3))                  # GRID is (C, ctx) row-major
    obs = F.Observations(dep.name, _perturbed(dep, {"attention_decode_rate": 1.3}), batches, combine @ times,
                         target="step", combine=combine)
    assert obs.points == 5
    res = F.fit_coefficients([obs], ["attention_decode_rate"], steps=150)
    assert res.multipliers()["attention_decode_rate@hardware=h200"] == pytest.approx(1 / 1.3, rel=0.01)
    np.testing.assert_allclose(res.predict(obs), combine @ times, rtol=1e-4)
    with pytest.raises(jp.JaxpriceError, match=r"combine must be a finite \[points, 15\] matrix"):
        F.Observations(dep.name, dep, batches, times[:5], combine=combine[:, :14])


def test_bounds_are_respected(truth):
    # data priced at 1.3x the registry's hbm_derate (a fraction: the fit must stop at 1) and at
    # 1.5x its attention_decode_rate (bound 1.1: the fit must stop at 1.1x)
    obs = []
    for name, (dep, batches, _) in truth.items():
        c = _plain(dep.coefficients)
        hot = c.replace(hbm_derate=c["hbm_derate"] * 1.3, attention_decode_rate=c["attention_decode_rate"] * 1.5)
        times = np.asarray(jp.price_many(dep.plan, hot, batches).no_overlap)
        obs.append(F.Observations(name, dep, batches, times, target="step"))
    base = float(truth[DEPLOYMENTS[0]][0].coefficients["hbm_derate"])
    res = F.fit_coefficients(obs, ["hbm_derate", "attention_decode_rate:1.1"], steps=120)
    values = {e["name"]: e["value"] for e in res.entries()}
    assert values["hbm_derate"] == pytest.approx(1.0, abs=1e-12)
    assert res.multipliers()["hbm_derate@hardware=h200"] == pytest.approx(1 / base)
    assert res.multipliers()["attention_decode_rate@hardware=h200"] == pytest.approx(1.1, rel=1e-9)
    assert res.at_bound() == {"hbm_derate@hardware=h200": "upper", "attention_decode_rate@hardware=h200": "upper"}


def test_early_stopping_keeps_the_best_held_out_values(truth):
    # the training deployment wants a 1.2x slower KV read, the held-out one the registry's
    dep_a, dep_b = DEPLOYMENTS
    obs = _observations(truth, {}, scale={dep_a: 1.2})
    train = [o for o in obs if o.name == dep_a]
    held = [o for o in obs if o.name == dep_b]
    res = F.fit_coefficients(train, ["attention_decode_rate"], held_out=held, steps=200, eval_every=5, patience=4)
    assert res.best_step == 0
    assert "stopped early" in res.stopped and res.history[-1]["step"] < 200
    assert res.theta.tolist() == [0.0]
    assert res.history[-1]["train"] < res.history[0]["train"]              # training kept improving
    assert res.history[-1]["held_out"] > res.history[0]["held_out"]


def test_callback_reports_compile_and_descent(truth):
    seen = []
    F.fit_coefficients(_observations(truth, {}), ["hbm_derate"], steps=10, eval_every=5,
                       callback=lambda done, total, **info: seen.append((done, total, info)))
    descent = [(d, t) for d, t, i in seen if i["stage"] == "descent"]
    assert descent == [(0, 10), (5, 10), (10, 10)]
    assert all("train" in i for _, _, i in seen if i["stage"] == "descent")
    assert [i["stage"] for _, _, i in seen][0] == "compile"


def test_the_deployment_axis_equals_the_per_deployment_path_with_one_compile(truth, recovered):
    """Deployments of one plan structure share one compiled loss (``_StackTerm``: stacked plans,
    padded points and batches); the former path compiles one per deployment. Same loss and
    gradient (the 'grad' kind ``recovered`` compiled: no new axis compile)."""
    obs = recovered[0]
    settings = {"tau": 0.0, "delta": 0.1, "loss": "l2", "smooth": False}
    theta = np.array([0.05, -0.1, 0.15])
    out = {}
    for per in (False, True):
        layout = FS.Layout([F.Free(k) for k in PERTURB])
        terms = FS._terms(obs, layout, settings, "point", record=True, kind="grad", per_deployment=per)
        assert len(terms) == (2 if per else 1)
        out[per] = (FS._compile_terms(terms, 2), *FS._total(terms, theta))
    assert out[False][0] == 0 and out[True][0] <= 2       # the axis kernel is the fit's, already compiled
    assert out[False][1] == pytest.approx(out[True][1], rel=1e-12)
    np.testing.assert_allclose(out[False][2], out[True][2], rtol=1e-10, atol=0)
    assert recovered[1].compiled in (0, 2)        # the loss and the identifiability Jacobian, for both deployments


def test_refusals(truth):
    obs = _observations(truth, {})
    with pytest.raises(jp.JaxpriceError, match="matches this free pattern") as err:
        F.fit_coefficients(obs, ["hbm_derate", "no_such_coefficient_*"], steps=0)
    assert "no_such_coefficient_*" in str(err.value)
    with pytest.raises(jp.JaxpriceError, match="no free coefficients"):
        F.fit_coefficients(obs, [], steps=0)
    with pytest.raises(jp.JaxpriceError, match="share a deployment name"):
        F.fit_coefficients(obs + obs[:1], ["hbm_derate"], steps=0)
    with pytest.raises(jp.JaxpriceError, match="unknown loss"):
        F.fit_coefficients(obs, ["hbm_derate"], loss="l1")
    dep, batches, times = truth[DEPLOYMENTS[0]]
    with pytest.raises(jp.JaxpriceError, match="measurements for 15"):
        F.Observations("x", dep, batches, times[:3])
    with pytest.raises(jp.JaxpriceError, match="positive and finite"):
        F.Observations("x", dep, batches, -times)
    with pytest.raises(jp.JaxpriceError, match="unknown target"):
        F.Observations("x", dep, batches, times, target="ttft")


# ----------------------------------------------------------------------------- the written set


def test_written_set_loads_like_any_other_and_prices_identically(recovered, tmp_path):
    obs, res = recovered
    path = F.write_coefficient_set(res, tmp_path / "fitted.yaml", data="synthetic step times")
    doc = yaml.safe_load(path.read_text())
    assert doc["format"] == "jaxprice-coefficients/1" and doc["name"] == "fitted"
    assert "synthetic step times" in doc["source"] and "l2 loss on log step" in doc["source"]
    assert doc["fit"]["train_deployments"] == sorted(DEPLOYMENTS)
    assert {e["name"] for e in doc["entries"]} == set(PERTURB)
    for e in doc["entries"]:
        assert e["method"] == "fitted" and e["cite"] == doc["source"]
        assert e["scope"] == {"hardware": ["h200"], "model": ["llama-3.1-70b-instruct"], "engine": ["vllm"]}
    assert jp.load_coefficient_set(path).name == "fitted"
    for o in obs:
        loaded = jp.load_deployment(o.name, extra_coefficient_files=[path])
        want = res.coefficients_for(o.deployment)
        assert loaded.coefficients.names == want.names
        np.testing.assert_allclose(np.asarray(loaded.coefficients.values), np.asarray(want.values), rtol=1e-13)
        priced = np.asarray(jp.price_many(loaded.plan, _plain(loaded.coefficients), o.batches).no_overlap)
        np.testing.assert_allclose(priced, res.predict(o), rtol=1e-12)
    # a deployment on another chip is outside every entry's scope: unchanged
    other = "llama-3.1-70b-instruct-h100-fp8-vllm-tp2"
    with_set = jp.load_deployment(other, extra_coefficient_files=[path]).coefficients
    np.testing.assert_array_equal(np.asarray(with_set.values),
                                  np.asarray(jp.load_deployment(other).coefficients.values))


def test_entries_narrow_the_scope_where_starting_values_differ(truth):
    # start the two deployments from different attention rates: one entry per tp
    obs = []
    for name, factor in zip(DEPLOYMENTS, (1.0, 1.5)):
        dep, batches, times = truth[name]
        obs.append(F.Observations(name, _perturbed(dep, {"attention_decode_rate": factor}), batches, times,
                                  target="step"))
    res = F.fit_coefficients(obs, ["attention_decode_rate"], steps=0)
    scopes = sorted((e["scope"]["tp"], e["start"]) for e in res.entries())
    base = float(truth[DEPLOYMENTS[0]][0].coefficients["attention_decode_rate"])
    assert scopes == [(1, pytest.approx(base)), (2, pytest.approx(1.5 * base))]


# ----------------------------------------------------------------------------- the command


def _tpot_csv(path, truth):
    """A tiny measurement CSV (mean-TPOT layout): TPOT at 1.1x the kernel's, from the step times
    the truth fixture priced at context 4096 (isl 2048 + osl 4096 // 2)."""
    cols = ["corpus", "scenario", "deployment", "model", "hardware", "dtype", "engine", "tp", "ep", "dp",
            "spec_decode", "workload", "isl", "osl", "concurrency", "quantity", "value", "unit"]
    rows = []
    for name, (dep, _, times) in truth.items():
        for (c, ctx), step in zip(GRID, times):
            if ctx != 4096:
                continue
            tpot = (step + float(dep.coefficients["host_output_token"])) * 1.1
            for q, v in (("mean_tpot", tpot * 1e6), ("mean_ttft", 5e4)):
                rows.append(["test", f"{name}.yaml", name, "llama-3.1-70b-instruct", "h200", "fp8", "vllm",
                             dep.resolution["tp"], 1, 1, "none", "2k4k", 2048, 4096, c, q, f"{v:.6f}", "us"])
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        w.writerows(rows)
    return path


def test_cli_fits_a_tiny_tpot_csv(truth, tmp_path, capsys):
    src = _tpot_csv(tmp_path / "tiny.csv", truth)
    out = tmp_path / "fitted.yaml"
    rc = cli_main(["fit", str(src), "--free", "hbm_derate", "--free", "host_output_token@global:3",
                   "--holdout", "0.5", "--steps", "60", "--out", str(out), "--name", "tiny-fit"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "fit  [" in cap.err                                   # the progress bar, on stderr
    text = cap.out
    assert "10 points in 2 deployment(s); train 1, held out 1" in text
    assert "loss before" in text and "MAPE after" in text
    assert "hbm_derate@hardware=h200" in text and "host_output_token@hardware=h200" in text
    # the key freed @global is one multiplier, listed per chip as the written set scopes it: said so
    assert "(host_output_token@global: one multiplier, listed per chip as the written set scopes it" in text
    lines = {ln.split()[0]: ln.split() for ln in text.splitlines() if ln.startswith(("train", "held out"))}
    assert float(lines["train"][4]) < float(lines["train"][3])   # loss after < loss before
    doc = yaml.safe_load(out.read_text())
    assert doc["name"] == "tiny-fit" and str(src) in doc["source"]


@pytest.mark.parametrize("argv, words", [
    (["--free", "hbm_derate:abc"], "the bound after ':' must be a number"),
    ([], "at least one --free"),
    (["--free", "nothing_matches_*"], "matches this free pattern"),
    (["--free", "hbm_derate", "--holdout", "1.5"], "--holdout"),
    (["--free", "hbm_derate", "--target", "step"], "--target step needs the step layout"),
    (["--free", "hbm_derate", "--prior", "cv"], "--prior cv needs a cross-validating --holdout"),
    (["--free", "hbm_derate", "--holdout", "engine"], "or one of model, chip, deployment"),
    (["--free", "hbm_derate", "--batch-rule", "simulate", "--target", "flops"], "unknown target under the simulate"),
    (["--free", "hbm_derate", "--target", "ttft"], "ttft and tpot,ttft with --batch-rule simulate"),
    (["--free", "hbm_derate", "--holdout", "model"], "leaving one model out needs at least two"),
    (["--free", "hbm_derate", "--prior", "-1"], "--prior"),
    (["--free", "hbm_derate", "--holdout", "deployment", "--priors", "0,nan"], "--priors"),
])
def test_cli_refuses_bad_input_with_one_line(truth, tmp_path, capsys, argv, words):
    src = _tpot_csv(tmp_path / "tiny.csv", truth)
    rc = cli_main(["fit", str(src), "--quiet", "--steps", "2", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("jaxprice fit: error:") and err.count("\n") == 1 and words in err


EXCERPT = os.path.join(ROOT, "testdata", "measured", "inferencex_vllm_excerpt.csv")


@pytest.mark.parametrize("rule", ["anchor", "capped", "interleaved"])
def test_tpot_observations_are_the_accuracy_batches_of_each_rule(rule):
    from jaxprice import accuracy as acc
    obs, refused, points = F.observations_from_measurements(EXCERPT, batch_rule=rule)
    groups, refused_acc = acc.group_points(acc.read_measurements(EXCERPT)[0], batch_rule=rule)
    assert refused == refused_acc == [] and len(points) == 21
    assert [o.name for o in obs] == [g.name for g in groups]
    for o, g in zip(obs, groups):
        assert (o.target, o.estimate) == ("tpot", "no_overlap")
        np.testing.assert_array_equal(o.measured, g.measured)
        for name in ("scheduled", "computed", "prompt_len", "mask"):
            np.testing.assert_array_equal(np.asarray(getattr(o.batches, name)), np.asarray(getattr(g.batches, name)))
        if rule == "interleaved":
            np.testing.assert_array_equal(o.combine, g.combine)
            assert o.combine.shape[0] == o.points < o.combine.shape[1]
        else:
            assert o.combine is None and g.combine is None
    with pytest.raises(jp.JaxpriceError, match="unknown batch rule"):
        F.observations_from_measurements(EXCERPT, batch_rule="Interleaved")


def test_the_fit_prices_a_point_as_accuracy_does_under_the_interleaved_rule():
    from jaxprice import accuracy as acc
    from jaxprice._src import fit as fit_src
    name = "minimax-m2.5-b300-fp8-vllm-tp1"
    (obs,), _, _ = F.observations_from_measurements(EXCERPT, batch_rule="interleaved", deployments=[name])
    coefs = obs.deployment.coefficients
    pred = fit_src._predict_u(np.zeros(len(coefs.names)), np.asarray(coefs.values), obs.batches,
                              np.asarray(obs.combine), plan=obs.deployment.plan, names=tuple(coefs.names),
                              target="tpot", estimate="no_overlap", smooth=False, tau=0.0)
    report = acc.evaluate_accuracy(EXCERPT, batch_rule="interleaved", deployments=[name])
    np.testing.assert_allclose(np.asarray(pred) * 1e6, [r["no_overlap_tpot_us"] for r in report.records], rtol=1e-9)


def test_cli_batch_rule_reaches_the_observations_and_the_written_set(truth, tmp_path, capsys):
    src = _tpot_csv(tmp_path / "tiny.csv", truth)
    out = tmp_path / "fitted.yaml"
    rc = cli_main(["fit", str(src), "--free", "hbm_derate", "--batch-rule", "capped", "--holdout", "0.5",
                   "--steps", "3", "--out", str(out), "--quiet"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "; batch rule capped" in cap.out
    assert "batch rule 'capped'" in yaml.safe_load(out.read_text())["source"]
    rc = cli_main(["fit", str(src), "--free", "hbm_derate", "--batch-rule", "fifo", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    from jaxprice._src.accuracy import BATCH_RULES
    assert err == ("jaxprice fit: error: field '--batch-rule', value 'fifo': unknown batch rule "
                   f"(known: {', '.join(BATCH_RULES)})\n")


def test_cli_refuses_a_missing_file(tmp_path, capsys):
    rc = cli_main(["fit", str(tmp_path / "nope.csv"), "--free", "hbm_derate"])
    err = capsys.readouterr().err
    assert rc == 2 and "nope.csv" in err and "file not found" in err


def test_cli_fits_step_times(truth, tmp_path, capsys):
    path = tmp_path / "steps.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["scenario", "requests", "context", "value", "unit"])
        for name, (dep, _, times) in truth.items():
            for (c, ctx), t in zip(GRID, times):
                w.writerow([name, c, ctx, f"{t * 1.25 * 1e3:.9f}", "ms"])
    out = tmp_path / "fitted.yaml"
    rc = cli_main(["fit", str(path), "--free", "attention_decode_*:3", "--free", "hbm_derate", "--holdout", "0",
                   "--steps", "40", "--quiet", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "log step time" in text and "30 points in 2 deployment(s); train 2, held out 0" in text
    names = {e["name"] for e in yaml.safe_load(out.read_text())["entries"]}
    assert names == {"attention_decode_floor", "attention_decode_rate", "hbm_derate"}


def test_read_step_measurements_refuses_bad_rows(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("scenario,requests,context,value,unit\nllama-3.1-70b-instruct-h200-fp8-vllm-tp1,4,0,1.0,ms\n")
    with pytest.raises(jp.JaxpriceError) as err:
        F.read_step_measurements(path)
    assert f"{path}:2" in str(err.value) and "context" in str(err.value)
    path.write_text("scenario,requests,value,unit\n")
    with pytest.raises(jp.JaxpriceError, match="missing column"):
        F.read_step_measurements(path)


# ----------------------------------------------------------------------------- fit_law and the microbenchmark


def test_fit_law_recovers_a_ramp():
    from jaxprice._src import laws
    m = np.array([1, 4, 16, 64, 256, 1024, 4096], dtype=float)
    flops = 2 * m * 4096 * 4096
    t = np.asarray(laws.gemm_time(flops, 1e15, laws.ramp(m, 0.8, 120.0)))

    def law(p, x):
        return laws.gemm_time(x[0], 1e15, laws.ramp(x[1], p["eps_max"], p["m_half"]))
    res = jp.fit_law(law, {"eps_max": 0.6, "m_half": 60.0}, (flops, m), t, steps=1500)
    assert res.params["eps_max"] == pytest.approx(0.8, rel=1e-3)
    assert res.params["m_half"] == pytest.approx(120.0, rel=1e-3)
    # a fraction stays <= 1 even where the data ask for more
    res = jp.fit_law(law, {"eps_max": 0.6, "m_half": 120.0}, (flops, m), t * 0.5, steps=300)
    assert res.params["eps_max"] == pytest.approx(1.0) and res.at_bound["eps_max"] == "upper"


def _microbench():
    spec = importlib.util.spec_from_file_location("gpu_microbench", os.path.join(ROOT, "experiments",
                                                                                 "gpu_microbench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_microbench_cpu_dry_run(tmp_path, capsys):
    mb = _microbench()
    out, md = tmp_path / "mb.json", tmp_path / "mb.md"
    assert mb.main(["--cpu-dry-run", "--quick", "--quiet", "--json", str(out), "--markdown", str(md)]) == 0
    text = capsys.readouterr().out
    assert "registry h200" in text and "synthetic truth" in text
    res = json.loads(out.read_text())
    assert res["dry_run"] and res["chip"] == "h200" and res["backend"] == "synthetic"
    # the kernel's GEMM law max(arithmetic ramp, weight reads) recovers all three per dtype
    for name in ("gemm_eps_max_bf16", "gemm_eps_max_fp8", "hbm_derate", "gemm_weight_derate_bf16",
                 "gemm_weight_derate_fp8"):
        assert res["fitted"][name] == pytest.approx(res["truth"][name], rel=0.03), name
    for name in ("gemm_m_half_bf16", "gemm_m_half_fp8"):
        assert res["fitted"][name] == pytest.approx(res["truth"][name], rel=0.1), name
    assert res["registry"]["gemm_eps_max_bf16"] == 0.992 and res["registry"]["hbm_derate"] == 0.8
    fits = res["analysis"]["fits"]
    for d in ("bf16", "fp8"):           # both regimes present, and the fitted law fits to the noise
        assert fits[d]["compute_bound_points"] >= 3 and fits[d]["hbm_bound_points"] >= 2
        assert fits[d]["rms_log_error"] < 0.03 < fits[d]["registry_rms_log_error"]
    # the report is generated from the run and says it is synthetic
    report = md.read_text()
    assert "no GPU was used" in report and "## What this means for the registry" in report
    assert "| `gemm_weight_derate_fp8` (registry: hbm_derate) | 0.7" in report
    assert report.count("| bf16 | 4096x4096 |") == len(mb.M_QUICK)


def test_gpu_microbench_refuses_without_a_gpu(capsys):
    import jax
    mb = _microbench()
    try:
        has_gpu = bool(jax.devices("gpu"))
    except RuntimeError:
        has_gpu = False
    if has_gpu or mb._torch_backend() is not None:
        pytest.skip("a GPU is present")
    assert mb.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_microbench: error: no NVIDIA GPU") and "--cpu-dry-run" in err


# ----------------------------------------------------------------------------- transfer (issue 12)


def test_a_strong_prior_returns_the_registry(truth, recovered):
    obs, free_fit = recovered
    res = F.fit_coefficients(obs, list(PERTURB), steps=300, eval_every=10, patience=10, prior=1e4)
    assert res.prior == 1e4 and res.settings["prior"] == 1e4
    for label, m in res.multipliers().items():
        assert m == pytest.approx(1.0, abs=2e-3), label                 # the starting (perturbed) values stand
    assert max(abs(m - 1) for m in free_fit.multipliers().values()) > 0.15  # while prior 0 moved them
    # Gauss-Newton: the same, to 1e-5, in a few iterations; and in between, the prior trades
    # data fit for a shorter log-multiplier vector
    gn = {p: F.fit_coefficients(obs, list(PERTURB), steps=50, prior=p, method="gauss-newton") for p in (0, 1e-3, 1e4)}
    assert all(m == pytest.approx(1.0, abs=1e-5) for m in gn[1e4].multipliers().values())
    for k, m in free_fit.multipliers().items():
        assert gn[0].multipliers()[k] == pytest.approx(m, rel=1e-4), k
    norms = [float(np.linalg.norm(gn[p].theta)) for p in (0, 1e-3, 1e4)]
    losses = [gn[p].final["train"] for p in (0, 1e-3, 1e4)]
    assert norms[0] > norms[1] > norms[2] and losses[0] < losses[1] < losses[2]
    assert "converged" in gn[0].stopped and gn[0].settings["method"] == "gauss-newton"


def test_an_infinite_prior_is_the_registry_itself_without_a_compile(truth, recovered):
    obs, free_fit = recovered
    res = F.fit_coefficients(obs, list(PERTURB), prior=math.inf, method="gauss-newton")
    assert res.stopped == F.REGISTRY_KEPT and res.compiled == 0 and res.history == []
    assert res.keys == free_fit.keys                        # the same free values a finite prior fits
    assert set(res.multipliers().values()) == {1.0}
    assert math.isnan(res.initial["train"]) and math.isnan(res.final["held_out"])
    fitted, start = res.predict_all(obs), res.predict_all(obs, fitted=False)
    for o in obs:
        assert np.array_equal(fitted[o.name], start[o.name]), o.name
    for bad in (-1.0, math.nan):
        with pytest.raises(jp.JaxpriceError, match="prior strength"):
            F.fit_coefficients(obs, list(PERTURB), prior=bad)


def test_cross_validation_keeps_the_registry_when_no_fit_transfers(truth):
    # the two deployments want opposite corrections: a fit on either makes the other worse, so
    # the 'no fit' candidate (an infinite prior) wins, at a criterion of exactly 1
    names = sorted(truth)
    obs = _observations(truth, {}, scale={names[0]: 1.3, names[1]: 1 / 1.3})
    cv = F.cross_validate(obs, ["attention_decode_rate:3", "hbm_derate"], by="deployment", priors=(0.0, math.inf),
                          test_fraction=0.5, seeds=(0,), steps=150)
    assert cv.criterion[math.inf] == 1.0 and cv.criterion[0.0] > 1.0
    assert cv.worst[math.inf] == 1.0 and cv.worst[0.0] > 1.0
    assert cv.best_prior == math.inf


def test_the_chosen_prior_makes_no_held_out_group_worse():
    from jaxprice._src.fit import _choose
    mean = {0.0: 0.90, 1.0: 0.95, math.inf: 1.0}
    assert _choose(mean) == 0.0                                                # the lowest mean alone
    assert _choose(mean, {0.0: 1.20, 1.0: 0.99, math.inf: 1.0}) == 1.0        # 0 helps on average, hurts a group
    assert _choose(mean, {0.0: 1.20, 1.0: 1.10, math.inf: 1.0}) == math.inf   # every fit hurts one: the registry
    assert _choose({0.0: 0.9, 1.0: 0.95}, {0.0: 1.2, 1.0: 1.1}) == 0.0         # none qualifies: among all
    # the largest ratio over the metrics: TPOT MAPE 10% -> 9%, shape 5% -> 6% (x1.2), TTFT absent
    assert F.worst_ratio({"tpot_mape": 0.09, "shape_mean": 0.06}, {"tpot_mape": 0.10, "shape_mean": 0.05}) == \
        pytest.approx(1.2)
    assert F.relative_error({"tpot_mape": 0.09, "shape_mean": 0.06}, {"tpot_mape": 0.10, "shape_mean": 0.05}) == \
        pytest.approx(1.05)
    assert math.inf in F.DEFAULT_PRIORS


def test_physical_bound_stops_a_rate_at_the_chips_hbm_peak(truth):
    obs = []
    for name, (dep, batches, _) in truth.items():
        c = _plain(dep.coefficients)
        fast = c.replace(attention_decode_rate=c["attention_decode_rate"] * 3.0)
        obs.append(F.Observations(name, dep, batches, np.asarray(jp.price_many(dep.plan, fast, batches).no_overlap),
                                  target="step"))
    dep = truth[DEPLOYMENTS[0]][0]
    peak = dep.chip.hbm_tbs * 1e12
    rate = float(dep.coefficients["attention_decode_rate"])
    assert 3.0 * rate > peak > rate
    res = F.fit_coefficients(obs, ["attention_decode_rate:4"], steps=100)
    (e,) = res.entries()
    assert e["value"] == pytest.approx(peak, rel=1e-9)
    (hit,) = res.bound_hits()
    assert hit["key"] == "attention_decode_rate@hardware=h200" and hit["side"] == "upper"
    assert hit["why"].startswith("physical") and "HBM peak" in hit["why"] and "physics rules out" in hit["meaning"]
    assert F.physical_range("hbm_derate", dep.chip)[1] == 1.0
    assert F.physical_range("host_output_token", dep.chip) == (None, None, None)


def test_identifiability_flags_a_constructed_degenerate_pair():
    rng = np.random.default_rng(0)
    a, c = rng.normal(size=40), rng.normal(size=40)
    J = np.stack([a, -2.0 * a + 1e-4 * rng.normal(size=40), c, np.zeros(40)], axis=1)   # b ~ -2a; d inert
    ident = F.identifiability(J, ["a", "b", "c", "d"], tol=0.1)
    assert set(ident.frozen) == {"a", "d"}           # b is the more sensitive of the pair: kept
    assert ident.partners["a"] == ["b"] and "not separable from b" in ident.frozen["a"]
    assert "do not depend" in ident.frozen["d"]
    assert ident.independence[0] < 1e-3 and ident.independence[2] > 0.9
    assert ident.fisher_eigenvalues[0] < 1e-6 * ident.fisher_eigenvalues[-1]
    ok = F.identifiability(J[:, [0, 2]], ["a", "c"], tol=0.1)
    assert ok.frozen == {}


def test_identifiability_on_the_kernel_freezes_what_decode_steps_cannot_separate(truth):
    # decode-only step times: the GEMM ramp's intercept and the weight reads are both per-step constants
    obs = _observations(truth, {})
    res = F.fit_coefficients(obs, ["hbm_derate", "gemm_eps_max_fp8", "gemm_m_half_fp8"], steps=0)
    frozen = res.frozen
    assert frozen, res.identifiability.independence
    assert set(frozen) <= {"hbm_derate@hardware=h200", "gemm_eps_max_fp8@hardware=h200",
                           "gemm_m_half_fp8@hardware=h200"}
    assert all("not separable" in w or "do not depend" in w for w in frozen.values())
    # a frozen key is held at its start and not written
    assert all(res.theta[res.layout.index(k)] == 0.0 for k in res.layout.keys if F.key_label(k) in frozen)
    assert not any(e["frozen"] is False and F.key_label((e["name"], (("hardware", "h200"),))) in frozen
                   for e in res.entries())
    # the recovery set is identifiable: nothing frozen there
    assert F.fit_coefficients(obs, list(PERTURB), steps=0).frozen == {}


def test_a_set_scoped_to_one_chip_leaves_another_chips_prices_bit_for_bit(recovered, tmp_path):
    _, res = recovered
    path = F.write_coefficient_set(res, tmp_path / "fitted.yaml", engines=["vllm"])
    doc = yaml.safe_load(path.read_text())
    assert doc["fit"]["train_chips"] == ["h200"] and doc["fit"]["engines"] == ["vllm"]
    other = "llama-3.1-70b-instruct-h100-fp8-vllm-tp2"
    with_set, plain = jp.load_deployment(other, extra_coefficient_files=[path]), jp.load_deployment(other)
    batches = _batches(GRID[:4], rows=64)
    a = jp.price_many(with_set.plan, _plain(with_set.coefficients), batches)
    b = jp.price_many(plain.plan, _plain(plain.coefficients), batches)
    np.testing.assert_array_equal(np.asarray(a.no_overlap), np.asarray(b.no_overlap))
    np.testing.assert_array_equal(np.asarray(a.overlap), np.asarray(b.overlap))
    applies = F.set_applies(path, plain)
    assert applies["applied"] == [] and all("hardware=h100" in why for _, why in applies["outside"])
    # another model on the same chip is outside the model scope too; --scope-to hardware widens it
    dep8 = jp.load_deployment("deepseek-v3-h200-fp8-sglang-tp8")
    assert F.set_applies(path, dep8)["applied"] == []
    wide = F.write_coefficient_set(res, tmp_path / "wide.yaml", scope_to=("hardware",))
    assert set(F.set_applies(wide, dep8)["applied"]) <= set(PERTURB)


def test_a_set_is_scoped_to_the_engines_it_was_fitted_on(recovered, tmp_path):
    # fitted on vLLM deployments (their scenarios state no scheduler: vLLM): every entry scoped to
    # engine vllm; the same deployment served by SGLang keeps the registry's values bit for bit
    from jaxprice._src.formats import Registry, load_coefficient_set
    from jaxprice._src.resolve import resolve, serving_engine
    _, res = recovered
    assert res.settings["train_engines"] == ["vllm"]
    path = F.write_coefficient_set(res, tmp_path / "fitted.yaml", engines=["trt"])   # the result's engines win
    doc = yaml.safe_load(path.read_text())
    assert doc["entries"] and all(e["scope"]["engine"] == ["vllm"] for e in doc["entries"])
    base = jp.load_deployment(DEPLOYMENTS[0])
    cset = load_coefficient_set(path)
    on = {eng: resolve(dataclasses.replace(base.scenario, engine={**base.scenario.engine, "scheduler": eng}),
                       Registry(), extra_sets=[cset]) for eng in ("vllm", "sglang")}
    assert serving_engine(on["sglang"].scenario) == "sglang" and serving_engine(base.scenario) == "vllm"
    np.testing.assert_array_equal(np.asarray(on["sglang"].coefficients.values), np.asarray(base.coefficients.values))
    assert not np.array_equal(np.asarray(on["vllm"].coefficients.values), np.asarray(base.coefficients.values))
    applies = F.set_applies(path, on["sglang"])
    assert applies["applied"] == [] and all("engine=sglang not in ['vllm']" in why for _, why in applies["outside"])
    assert sorted(F.set_applies(path, on["vllm"])["applied"]) == sorted({e["name"] for e in doc["entries"]})
    # a measurement file's engine names map to the scheduler names; an unknown one is refused
    assert F.scheduler_names(["trt", "vllm", "TensorRT-LLM"]) == ["trtllm", "vllm"]
    with pytest.raises(jp.JaxpriceError, match=r"field 'engines', value 'vlm': unknown engine"):
        F.scheduler_names(["vlm"])
    # an entry's engine scope names an engine the serving layer knows
    bad = path.read_text().replace("engine: [vllm]", "engine: [vlm]", 1)
    (tmp_path / "bad.yaml").write_text(bad)
    with pytest.raises(jp.JaxpriceError, match=r"scope\.engine.*'vlm'"):
        load_coefficient_set(tmp_path / "bad.yaml")


def _fake(name, model, chip):
    from types import SimpleNamespace
    return SimpleNamespace(name=name, dims={"model": model, "hardware": chip})


def test_cv_folds_never_share_a_deployment_nor_under_model_a_model():
    obs = [_fake(f"{m}-{c}-{i}", m, c) for m in ("a", "b", "c") for c in ("h100", "b200") for i in range(3)]
    names = sorted(o.name for o in obs)
    dims = {o.name: o.dims for o in obs}
    folds = F.cv_folds(obs, "model")
    assert [f.label for f in folds] == ["a", "b", "c"]
    for f in folds:
        assert not set(f.train) & set(f.test) and sorted(f.train + f.test) == names
        assert {dims[n]["model"] for n in f.test} == {f.label}
        assert f.label not in {dims[n]["model"] for n in f.train}
    chips = F.cv_folds(obs, "chip")
    assert [f.label for f in chips] == ["b200", "h100"]
    for f in chips:
        assert {dims[n]["hardware"] for n in f.test} == {f.label}
        assert f.label not in {dims[n]["hardware"] for n in f.train}
    seeds = F.cv_folds(obs, "deployment", seeds=(0, 1, 2))
    assert len({f.test for f in seeds}) > 1
    for f in seeds:
        assert not set(f.train) & set(f.test) and sorted(f.train + f.test) == names
        assert {dims[n]["model"] for n in f.test} == {"a", "b", "c"}           # stratified by model
    with pytest.raises(jp.JaxpriceError, match="at least two"):
        F.cv_folds([o for o in obs if o.dims["model"] == "a"], "model")
    with pytest.raises(jp.JaxpriceError, match="unknown hold-out"):
        F.cv_folds(obs, "engine")


def test_cross_validate_scores_registry_and_fit_on_held_out_deployments(truth):
    # the two deployments want the same 1.25x slower KV read: the fit on one transfers to the other
    obs = _observations(truth, {}, scale={n: 1.25 for n in DEPLOYMENTS})
    cv = F.cross_validate(obs, ["attention_decode_rate:3", "hbm_derate"], by="deployment", priors=(0.0, 1e4),
                          test_fraction=0.5, seeds=(0,), steps=150)
    (fold,) = cv.folds
    assert len(fold.train) == len(fold.test) == 1
    weak, strong = cv.scores[(fold.label, 0.0)]["test"], cv.scores[(fold.label, 1e4)]["test"]
    assert weak["fitted"]["tpot_mape"] < 0.5 * weak["registry"]["tpot_mape"]
    assert strong["fitted"]["tpot_mape"] == pytest.approx(strong["registry"]["tpot_mape"], rel=1e-2)
    assert cv.criterion[0.0] < cv.criterion[1e4] and cv.best_prior == 0.0
    assert cv.chosen[fold.label] == 1e4         # one training deployment: too few for an inner split
    assert cv.scores[(fold.label, 0.0)]["applied"] == 2
    assert math.isnan(weak["registry"]["shape_mean"])     # step observations carry no sweeps


def test_cli_cross_validates_by_deployment_and_scopes_the_written_set(truth, tmp_path, capsys):
    src = _tpot_csv(tmp_path / "tiny.csv", truth)
    out = tmp_path / "fitted.yaml"
    rc = cli_main(["fit", str(src), "--free", "hbm_derate", "--free", "attention_decode_rate", "--holdout",
                   "deployment", "--cv-seeds", "0", "--priors", "0,100", "--method", "gauss-newton", "--steps", "20",
                   "--quiet", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    text = cap.out
    assert "cross-validation by deployment: 1 fold(s)" in text and "seed 0" in text
    assert "TPOT MAPE reg -> fit" in text and "make no held-out group worse) for the final fit: " in text
    import re
    strong = float(re.search(r"\b100: ([0-9.]+)", text).group(1))
    assert strong == pytest.approx(1.0, abs=0.01)       # the strong prior is the registry on held-out data
    doc = yaml.safe_load(out.read_text())
    assert doc["fit"]["engines"] == ["vllm"] and doc["fit"]["train_models"] == ["llama-3.1-70b-instruct"]
    assert all(e["scope"]["model"] == ["llama-3.1-70b-instruct"] for e in doc["entries"])
    assert "any other deployment loading it keeps the registry's values" in text


def test_cli_cross_validation_at_a_fixed_prior_says_it_was_fixed(capsys):
    """--prior 0 with --holdout model: every fold and the final fit at the prior the user fixed,
    said so (the table claimed an inner cross-validation chose it, and that it was chosen among
    priors that make no held-out group worse, when it made one 3.5 times worse)."""
    from types import SimpleNamespace
    from jaxprice._src.cli_fit import print_cv
    cv = SimpleNamespace(by="model", folds=[1, 2, 3], rows=lambda: [], criterion={0.0: 1.221}, worst={0.0: 3.501},
                         best_prior=0.0)
    print_cv(cv, fixed_prior=0.0)
    text = capsys.readouterr().out
    assert "3 fold(s); prior 0 in every fold (--prior)" in text and "inner" not in text
    assert "the final fit at 0, as --prior fixed it (it makes a held-out group worse" in text
    assert "chosen" not in text
    print_cv(cv)
    assert "chosen by an inner cross-validation" in capsys.readouterr().out


def test_cli_prior_inf_keeps_the_registry_and_says_so(truth, tmp_path, capsys):
    src = _tpot_csv(tmp_path / "tiny.csv", truth)
    out = tmp_path / "kept.yaml"
    rc = cli_main(["fit", str(src), "--free", "hbm_derate", "--prior", "inf", "--quiet", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "the registry is kept" in cap.out and F.REGISTRY_KEPT in cap.out
    doc = yaml.safe_load(out.read_text())
    assert doc["fit"]["prior"] == math.inf and doc["fit"]["train_loss"] == {"start": None, "fitted": None}
    assert doc["entries"] and all(e["fit"]["multiplier"] == 1.0 for e in doc["entries"])


# ----------------------------------------------------------------------------- through the serving simulation
#
# A tiny CSV (one deployment of the excerpt, gpt-oss-120b on H200, isl 32 / osl 8, C = 2 and 4,
# mean TPOT and mean TTFT rows): each point's closed-loop schedule is built once (the scheduler
# compiles once for the module); the fit compiles one loss per kind for the deployment's plan.

SIM_DEP = "gpt-oss-120b-h200-fp4-vllm-tp1"
SIM_FREE = ["hbm_derate", "host_output_token@global"]


def _sim_csv(path, values=None):
    with open(EXCERPT, newline="") as fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames
        rows = [r for r in reader if r["deployment"] == SIM_DEP]
    tpot_row = next(r for r in rows if r["quantity"] == "mean_tpot")
    ttft_row = next(r for r in rows if r["quantity"] == "mean_ttft")
    values = values or {2: (3000.0, 9000.0), 4: (3300.0, 11000.0)}
    out = []
    for c, (tp, tt) in values.items():
        for r, v in ((tpot_row, tp), (ttft_row, tt)):
            out.append(dict(r, isl="32", osl="8", workload="tiny", concurrency=str(c), value=repr(float(v)),
                            unit="us", anchor_concurrency="2"))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, cols)
        w.writeheader()
        w.writerows(out)
    return path


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    path = _sim_csv(tmp_path_factory.mktemp("sim") / "tiny_sim.csv")
    obs, refused, points = F.observations_from_simulation(path, targets="tpot,ttft")
    assert refused == [] and len(obs) == 1
    return path, obs[0], points


def test_sim_observations_are_the_accuracy_harness_runs(sim):
    """At the registry's values the fit's schedules price to what ``jaxprice accuracy
    --batch-rule simulate`` reports (the same engine settings per point, the same runs)."""
    from jaxprice._src import accuracy as acc
    path, obs, points = sim
    assert obs.targets == ("tpot", "ttft") and obs.n_points == 2 and obs.points == 4
    np.testing.assert_allclose(obs.measured, [3000e-6, 3300e-6, 9000e-6, 11000e-6])
    _, refused, pred = acc.simulate_points(points, estimates=("no_overlap",))
    both = F.predict_simulated(obs)
    assert refused == []
    np.testing.assert_allclose(both[0], pred[SIM_DEP]["tpot_no_overlap"], rtol=1e-12)
    np.testing.assert_allclose(both[1], pred[SIM_DEP]["ttft_no_overlap"], rtol=1e-12)
    assert np.all(both[1] > both[0])                      # a first token waits for its prefill


def test_sim_metric_weights_are_schedule_metrics(sim):
    """Mean TPOT and mean TTFT are affine in the step times: the weights plus the admission
    latencies (serve.metric_offsets; the fit's own a + b x mean prompt length) reproduce
    serve.schedule_metrics at arbitrary step times."""
    from jaxprice._src import serve
    sched = sim[1].runs[0].schedules[1]
    w = F.metric_weights(sched)
    t = np.random.default_rng(0).uniform(1e-3, 5e-3, sched.steps)
    s = serve.schedule_metrics(sched, t)["summary"]
    off = serve.metric_offsets(sched)
    assert off[0] == 0 and off[1] > 0.04                    # the registry's 40 ms per request and more
    np.testing.assert_allclose(w @ t + off, [s["tpot_mean"], s["ttft_mean"]], rtol=1e-12)
    c = sim[1].runs[0].deployment.coefficients
    mean_in = float(np.mean(sched.requests["input_len"]))
    assert off[1] == pytest.approx(float(c["host_admission_per_request"] + c["host_admission_per_token"] * mean_in),
                                   rel=1e-12)


def test_sim_blocks_price_like_every_step_and_share_one_pack():
    """The fit's compressed schedules (simfit: decode-only stretches merged into blocks priced
    at their mean reads) give the same mean TPOT and TTFT as pricing every step, at the
    registry's values and at other multipliers, with far fewer rows; two deployments of one
    plan structure (tp1 and tp2) share one pack, i.e. one compiled function; the closed-form
    metric weights equal the gradient of schedule_metrics on a data-parallel (dp 2) schedule."""
    import jax
    import jax.numpy as jnp
    from jaxprice._src import serve, simfit
    obs = []
    for name in ("gpt-oss-120b-h200-fp4-vllm-tp1", "gpt-oss-120b-h200-fp4-vllm-tp2"):
        dep = jp.load_deployment(name)
        scheds = [jp.build_schedule(dep, jp.Workload(48, 96, 0.8, 0), jp.ClosedLoop(c, 3 * c)) for c in (2, 5)]
        run = F.SimRun(dep, scheds, [0, 1])
        obs.append(F.SimObservations(name, dep, [run], [1e-3, 1e-3], [1e-2, 1e-2], ("tpot", "ttft")))
    items = [(o.runs[0], np.full(len(o.deployment.coefficients.names), -1), [(o.name, 0), (o.name, 1)])
             for o in obs]
    packed = simfit.packs(items, stride=16)
    assert len(packed) == 1
    steps = sum(sc.steps for o in obs for sc in o.runs[0].schedules)
    assert packed[0].steps < steps / 3
    layout = FS.Layout(["hbm_derate", "host_output_token@global"])
    for o in obs:
        layout.kmap(o.deployment, create=True)
    for theta in (None, np.array([0.3, -0.4])):
        exact = simfit.predict(obs, layout if theta is not None else None, theta, stride=1)
        blocks = simfit.predict(obs, layout if theta is not None else None, theta, stride=16)
        for o in obs:
            np.testing.assert_allclose(blocks[o.name], exact[o.name], rtol=1e-10)
            for j, sc in enumerate(o.runs[0].schedules):      # stride 1 is the serving layer's own pricing
                coefs = o.deployment.coefficients if theta is None else \
                    FS.apply_theta(o.deployment.coefficients, theta, layout.kmap(o.deployment, create=False))
                s = serve.schedule_metrics(sc, np.asarray(serve.price_steps(sc, coefs)), coefs)["summary"]
                np.testing.assert_allclose(exact[o.name][:, j], [s["tpot_mean"], s["ttft_mean"]], rtol=1e-12)
    dep = jp.load_deployment("minimax-m2.5-b200-fp4-vllm-tp2-ep4-dp2")
    sc = jp.build_schedule(dep, jp.Workload(64, 24, 0.8, 1), jp.ClosedLoop(6, 14))
    assert sc.dp == 2

    def f(t):
        s = serve.schedule_metrics(sc, t)["summary"]
        return jnp.stack([s["tpot_mean"], s["ttft_mean"]])
    np.testing.assert_allclose(F.metric_weights(sc), np.asarray(jax.jacrev(f)(jnp.ones(sc.steps))), rtol=1e-12,
                               atol=1e-15)


def test_sim_objective_gradient_equals_central_differences(sim):
    obs = sim[1]
    settings = {"tau": 0.0, "delta": 0.1, "loss": "l2", "smooth": False}
    layout = FS.Layout(SIM_FREE)
    terms = FS._terms([obs], layout, settings, "point", record=True, kind="grad")
    FS._compile_terms(terms, 1)
    theta = np.array([-0.1, 0.2])
    val, grad = FS._total(terms, theta)
    assert val > 0 and np.all(np.abs(grad) > 1e-6)
    h = 1e-5
    fd = [(FS._total(terms, theta + h * e)[0] - FS._total(terms, theta - h * e)[0]) / (2 * h) for e in np.eye(2)]
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-10)


def test_sim_synthetic_recovery(sim):
    """Measurements generated by the simulation itself at the registry's values; the fit starts
    from hbm_derate x0.85 and host_output_token x0.7 and must recover the registry (x 1/0.85,
    x 1/0.7) from mean TPOT and mean TTFT."""
    obs = sim[1]
    both = F.predict_simulated(obs)
    runs = []
    for run in obs.runs:
        c = run.deployment.coefficients
        start = c.replace(hbm_derate=c["hbm_derate"] * 0.85, host_output_token=c["host_output_token"] * 0.7)
        runs.append(F.SimRun(dataclasses.replace(run.deployment, coefficients=start), run.schedules, run.positions))
    truth = dataclasses.replace(obs, runs=runs, tpot=both[0], ttft=both[1])
    assert abs(F.predict_simulated(truth)[0][0] / both[0][0] - 1) > 0.02   # the start is off
    res = F.fit_coefficients([truth], SIM_FREE, method="gauss-newton", steps=30)
    m = res.multipliers()
    assert res.frozen == {}
    assert m["hbm_derate@hardware=h200"] == pytest.approx(1 / 0.85, rel=1e-4)
    assert m["host_output_token@global"] == pytest.approx(1 / 0.7, rel=1e-4)
    np.testing.assert_allclose(res.predict(truth), truth.measured, rtol=1e-6)
    # TPOT alone (two points) recovers the same pair
    r = F.fit_coefficients([truth.with_targets("tpot")], SIM_FREE, method="gauss-newton", steps=30)
    assert r.settings["train_points"] == 2
    assert r.multipliers()["host_output_token@global"] == pytest.approx(1 / 0.7, rel=1e-3)
    assert r.multipliers()["hbm_derate@hardware=h200"] == pytest.approx(1 / 0.85, rel=1e-3)
    # TTFT alone hardly depends on the per-token host cost: the identifiability check freezes it
    r = F.fit_coefficients([truth.with_targets("ttft")], SIM_FREE, method="gauss-newton", steps=30)
    assert list(r.frozen) == ["host_output_token@global"]
    assert "not separable from hbm_derate@hardware=h200" in r.frozen["host_output_token@global"]


def test_sim_cross_validation_scores_ttft(sim):
    obs = sim[1]
    twin = dataclasses.replace(obs, name=obs.name + "-twin", tpot=obs.tpot * 1.1, ttft=obs.ttft * 0.9)
    cv = F.cross_validate([obs, twin], ["host_output_token@global"], by="deployment", priors=(0.0, 1.0),
                          seeds=(0,), method="gauss-newton", steps=10)
    row = cv.rows()[0]
    for side in ("registry", "fitted"):
        s = row["test"][side]
        assert s["ttft_points"] == 2 and np.isfinite(s["ttft_mape"]) and np.isfinite(s["ttft_shape_mean"])
    assert row["test"]["registry"]["tpot_mape"] != row["test"]["fitted"]["tpot_mape"] or row["prior"] == 1.0


def test_cli_fits_through_the_simulation(sim, tmp_path, capsys):
    src = sim[0]
    out = tmp_path / "fitted_sim.yaml"
    rc = cli_main(["fit", str(src), "--batch-rule", "simulate", "--target", "tpot,ttft", "--free", "hbm_derate",
                   "--free", "host_output_token@global", "--holdout", "0", "--method", "gauss-newton",
                   "--steps", "20", "--out", str(out), "--quiet"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "simulated mean TPOT + TTFT" in cap.out and "batch rule simulate" in cap.out
    assert "TTFT MAPE" in cap.out and "(2 points with a measured TTFT)" in cap.out
    doc = yaml.safe_load(out.read_text())
    assert "batch rule 'simulate'" in doc["source"] and doc["fit"]["target"] == ["simulate:tpot,ttft"]
    fitted = {e["name"]: e for e in doc["entries"]}
    dep = jp.load_deployment(SIM_DEP, extra_coefficient_files=[out])
    base = jp.load_deployment(SIM_DEP)
    assert dep.coefficients["hbm_derate"] == pytest.approx(base.coefficients["hbm_derate"] *
                                                           fitted["hbm_derate"]["fit"]["multiplier"], rel=1e-9)
    assert dep.coefficients["hbm_derate"] != base.coefficients["hbm_derate"]


def test_residual_loss_slope_is_the_derivative_of_the_residual_loss():
    import jax
    import jax.numpy as jnp
    from jaxprice._src.fit import _residual_loss, _residual_loss_slope
    r = np.array([-3.0, -0.2, -0.05, 0.0, 0.04, 0.3, 2.5])
    for loss, delta in (("l2", 0.1), ("huber", 0.1), ("huber", 1.0)):
        auto = jax.vmap(jax.grad(lambda x: _residual_loss(x, loss, delta)))(jnp.asarray(r))
        np.testing.assert_allclose(_residual_loss_slope(r, loss, delta), np.asarray(auto), rtol=1e-15, atol=0)


def test_sim_observations_take_a_settings_file(sim, tmp_path, capsys):
    """fit --settings: each run simulated with the flags a user's table states for it (here a
    16-token budget and 2 sequences for the tiny sweep), as 'accuracy --settings' does; without
    --batch-rule simulate the option is refused in one line."""
    path, _obs, points = sim
    flags = tmp_path / "flags.csv"
    with open(flags, "w", newline="") as fh:
        w = csv.DictWriter(fh, ["scenario", "label", "concurrency", "max_num_batched_tokens", "max_num_seqs"])
        w.writeheader()
        for c in (2, 4):
            w.writerow(dict(scenario=points[0].scenario, label="tiny", concurrency=c, max_num_batched_tokens=16,
                            max_num_seqs=2))
    obs, refused, _ = F.observations_from_simulation(path, targets="tpot", settings=flags)
    assert refused == []
    settings = [sc.settings for r in obs[0].runs for sc in r.schedules]
    assert len(settings) == 2 and all((s["max_num_batched_tokens"], s["max_num_seqs"]) == (16, 2) for s in settings)
    default = [sc.settings for r in sim[1].runs for sc in r.schedules]
    assert all(s["max_num_batched_tokens"] != 16 for s in default)
    rc = cli_main(["fit", str(path), "--quiet", "--free", "hbm_derate", "--settings", str(flags)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "field '--settings'" in err and "--batch-rule simulate" in err
