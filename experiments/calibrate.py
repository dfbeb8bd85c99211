"""Calibrate the registry against measured serving latencies, and check that the fit transfers.

    python experiments/calibrate.py [--csv ../shared/measured/inferencex_vllm_dev.csv]
        [--rule interleaved] [--priors 0,0.001,...] [--seeds 0,1,2] [--steps 60]
        [--out experiments/results] [--quiet] [--from-checkpoint]
    python experiments/calibrate.py --rule simulate --targets tpot,ttft [--deployment NAME ...]
        (through the serving simulation: each point's schedule built once, the fits re-price its
        steps; TTFT columns in the tables; checkpoint experiments/out/calibration-study-simulate.pkl)

Everything in ``<out>/calibration.md`` is computed by this run (no hand-written claims; another
``--rule`` writes ``calibration-<rule>.md``, ``calibration-cv-<rule>.png`` and
``fitted-inferencex-<rule>.yaml`` instead, so the shipped set stays the default rule's):

1. Group the CSV's mean-TPOT points by deployment and build each point's batches under the
   batch rule (``jaxprice.accuracy.group_points``; default ``interleaved``).
2. Leave one model out, each in turn (``jaxprice.fit.cross_validate(by="model")``): fit the
   free set (``FREE``) on the other models' deployments at every prior strength of the grid,
   with the strength for each fold chosen by an inner leave-one-model-out on that fold's own
   training deployments (nested: a held-out model plays no part in choosing its prior). Score
   the held-out model with the bundled registry and with the fit (TPOT MAPE, shape error),
   and in sample.
3. By deployment: seeded splits (stratified by model, a quarter of each model's deployments
   held out; seeds 0, 1, 2), prior chosen by an inner split of the training deployments.
4. Leave one chip out, at the prior the leave-one-model-out chose for the final fit (the
   strongest finite one of the grid where that prior is inf, the registry kept).
5. The final fit on every deployment at that prior: identifiability (which coefficients the
   data cannot separate, frozen), bound hits (with the bound and what it means), multipliers;
   written to ``<out>/fitted-inferencex.yaml``, scoped to the chips, models and engines it was
   fitted on; loaded back with every training deployment (it must reproduce the fit's
   predictions) and with deployments of other models, chips and engines (their coefficients
   must be unchanged bit for bit).
6. The goals of issue 12, each judged from the numbers above.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import jaxprice as jp  # noqa: E402
from jaxprice._src import accuracy  # noqa: E402
from jaxprice._src import fit as jfit  # noqa: E402
from jaxprice._src.formats import Registry, load_coefficient_set  # noqa: E402
from jaxprice._src.resolve import resolve  # noqa: E402
from jaxprice._src.progress import Progress  # noqa: E402

DEFAULT_CSV = os.path.join(ROOT, "..", "shared", "measured", "inferencex_vllm_dev.csv")
# One free set for every fold: the prior and the identifiability check do the regularising
# that choosing among free sets by an inner held-out loss did before. Per chip unless said.
FREE = ["hbm_derate:2", "host_output_token@global:3", "attention_decode_rate*:3", "attention_decode_floor*:3",
        "gemm_eps_max_*:2", "gemm_m_half_*:3", "moe_routing_imbalance_median:2", "host_launch_per_kernel:3",
        "host_replay_graph_per_step:3"]
FIT = dict(loss="huber", huber_delta=0.15, steps=400, learning_rate=0.05, eval_every=5, patience=12,
           weighting="point", identify=True, identify_tol=0.1, method="gauss-newton")
# through the serving simulation the mean TTFT is a target too: the admission latency (the API
# server's time before the engine sees a request: per request and per prompt token) is an engine
# overhead, the same whatever the model or chip, so it is fitted as one global value
FREE_SIMULATE = FREE + ["host_admission_per_request@global:3", "host_admission_per_token@global:3"]
# deployments outside the dev set's models (and on other engines) for the scope check
OUTSIDE = ["deepseek-v3-h200-fp8-sglang-tp8", "llama-3.1-70b-instruct-h100-fp8-vllm-tp2"]


def pct(x):
    return "n/a" if not (isinstance(x, float) and math.isfinite(x)) else f"{x:.1%}"


def arrow(s, key):
    return f"{pct(s['registry'][key])} -> **{pct(s['fitted'][key])}**"


def gain(s, key):
    r, f = s["registry"][key], s["fitted"][key]
    return (r - f) / r if r > 0 else float("nan")


class Bar:
    def __init__(self, quiet, label):
        self.quiet, self.label, self.bar, self.n = quiet, label, None, 0

    def __call__(self, done, total, stage="cv", **info):
        if self.quiet or stage != "cv":
            return
        # cross_validate counts its fits up front (total; the shared cache's earlier fits included):
        # the guess below (6 x priors) stuck the bar at 6/6 through the study by deployment
        expected = self.expected if total is None else total
        if self.bar is None:
            self.bar = Progress(expected, self.label)
        self.n = done
        self.bar.update(min(done, expected), expected, **{k: v for k, v in info.items()})

    def close(self):
        if self.bar is not None:
            self.bar.close()
        self.bar = None


def cv_table(cv, what):
    rows = cv.rows()
    if rows and "ttft_mape" in rows[0]["test"]["registry"]:
        L = [f"| held out ({what}) | deployments | points | prior (nested) | TPOT MAPE | shape error | TTFT MAPE | "
             "TTFT shape | in-sample TPOT MAPE | in-sample TTFT MAPE |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            te, tr = r["test"], r["train"]
            L.append(f"| {r['fold']} | {len(r['test_deployments'])} | {te['registry']['points']} | {r['prior']:g} | "
                     f"{arrow(te, 'tpot_mape')} | {arrow(te, 'shape_mean')} | {arrow(te, 'ttft_mape')} | "
                     f"{arrow(te, 'ttft_shape_mean')} | {arrow(tr, 'tpot_mape')} | {arrow(tr, 'ttft_mape')} |")
        return L
    L = [f"| held out ({what}) | deployments | points | prior (nested) | fitted keys reaching it | TPOT MAPE | "
         "shape error | in-sample TPOT MAPE | in-sample shape |", "|---|---|---|---|---|---|---|---|---|"]
    for r in cv.rows():
        te, tr = r["test"], r["train"]
        L.append(f"| {r['fold']} | {len(r['test_deployments'])} | {te['registry']['points']} | {r['prior']:g} | "
                 f"{r['applied']} | {arrow(te, 'tpot_mape')} | {arrow(te, 'shape_mean')} | "
                 f"{arrow(tr, 'tpot_mape')} | {arrow(tr, 'shape_mean')} |")
    return L


def prior_path(cv):
    worst = getattr(cv, "worst", {}) or {}
    L = ["| prior | " + " | ".join(f.label for f in cv.folds)
         + " | mean fit/registry | worst group, fit/registry |",
         "|---|" + "---|" * (len(cv.folds) + 2)]
    for p in cv.priors:
        cells = []
        for f in cv.folds:
            s = cv.scores[(f.label, p)]["test"]
            cells.append(f"{pct(s['fitted']['tpot_mape'])} / {pct(s['fitted']['shape_mean'])}")
        L.append(f"| {p:g}{' (the registry kept)' if math.isinf(p) else ''} | " + " | ".join(cells)
                 + f" | {cv.criterion[p]:.3f} | {worst.get(p, math.nan):.3f} |")
    reg = [cv.scores[(f.label, cv.priors[0])]["test"]["registry"] for f in cv.folds]
    L.append("| registry | " + " | ".join(f"{pct(s['tpot_mape'])} / {pct(s['shape_mean'])}" for s in reg)
             + " | 1 | 1 |")
    return L


def goals(lomo, dep_cv, final):
    rows = lomo.rows()
    worse = [(r["fold"], k) for r in rows for k in ("tpot_mape", "shape_mean")
             if r["test"]["fitted"][k] > r["test"]["registry"][k] + 1e-12]
    mean_gain = {k: float(np.mean([gain(r["test"], k) for r in rows])) for k in ("tpot_mape", "shape_mean")}
    seeds = dep_cv.rows()
    seed_bad = [(r["fold"], k) for r in seeds for k in ("tpot_mape", "shape_mean")
                if not r["test"]["fitted"][k] < r["test"]["registry"][k]]
    hits = final.bound_hits()
    L = ["| goal | result | met |", "|---|---|---|",
         "| leave-one-model-out: no held-out model worse than the registry on TPOT MAPE or shape error | "
         + ("none worse" if not worse else "worse: " + ", ".join(f"{m} ({k})" for m, k in worse))
         + f" | {'yes' if not worse else 'no'} |",
         f"| leave-one-model-out: better on average by >= 15% | TPOT MAPE {mean_gain['tpot_mape']:+.1%}, shape "
         f"{mean_gain['shape_mean']:+.1%} (mean relative reduction over held-out models) | "
         f"{'yes' if min(mean_gain.values()) >= 0.15 else 'no'} |",
         "| by deployment (seeds " + ", ".join(r["fold"].split()[-1] for r in seeds) + "): better than the registry "
         "on both metrics on every seed | " + ("all better" if not seed_bad else "not better: " + ", ".join(
             f"{s} ({k})" for s, k in seed_bad)) + f" | {'yes' if not seed_bad else 'no'} |",
         f"| no fitted coefficient at a bound unless flagged with why | {len(hits)} at a bound, each listed below "
         "with its bound and meaning | yes |"]
    return L, worse, mean_gain, seed_bad


def ident_table(res):
    ident = res.identifiability
    L = ["| coefficient @ scope | sensitivity | independent share | |", "|---|---|---|---|"]
    order = np.argsort(ident.independence)
    for k in order:
        lab = ident.labels[k]
        L.append(f"| `{lab}` | {ident.sensitivity[k]:.2e} | {ident.independence[k]:.1%} | "
                 f"{'**frozen**' if lab in ident.frozen else ''} |")
    return L


def scope_check(path, final, obs, points, csv_path):
    """Every training deployment reloaded with the set prices as the fit; deployments of other
    models or chips keep the registry's coefficients bit for bit."""
    worst = 0.0
    first = {}
    for p in points:
        first.setdefault(p.deployment, p)
    for o in obs:
        dep, _ = accuracy.build_deployment(first[o.name], extra_coefficient_files=[path], source=csv_path)
        want = final.coefficients_for(o.deployment)
        worst = max(worst, float(np.max(np.abs(np.asarray(dep.coefficients.values) / np.asarray(want.values) - 1))))
    outside = []
    for name in OUTSIDE:
        a = jp.load_deployment(name, extra_coefficient_files=[path]).coefficients
        b = jp.load_deployment(name).coefficients
        applies = jfit.set_applies(path, jp.load_deployment(name))
        outside.append((name, bool(np.array_equal(np.asarray(a.values), np.asarray(b.values))), applies))
    # a training deployment (its chip and model in scope) served by another engine: out of the engine scope
    dep, _ = accuracy.build_deployment(first[obs[0].name], source=csv_path)
    sg = dataclasses.replace(dep.scenario, engine={**dep.scenario.engine, "scheduler": "sglang"})
    a = resolve(sg, Registry(), extra_sets=[load_coefficient_set(path)])
    b = resolve(sg, Registry())
    outside.append((f"{obs[0].name} served by SGLang (engine.scheduler: sglang)",
                    bool(np.array_equal(np.asarray(a.coefficients.values), np.asarray(b.coefficients.values))),
                    jfit.set_applies(path, a)))
    return worst, outside


def figure(lomo, dep_cv, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = lomo.rows() + dep_cv.rows()
    labels = [r["fold"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, key, title in ((axes[0], "tpot_mape", "TPOT MAPE"), (axes[1], "shape_mean", "shape error (mean)")):
        x = np.arange(len(rows))
        ax.bar(x - 0.2, [r["test"]["registry"][key] * 100 for r in rows], 0.4, label="bundled registry", color="C7")
        ax.bar(x + 0.2, [r["test"]["fitted"][key] * 100 for r in rows], 0.4, label="fitted (held out)", color="C0")
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(f"{title} (%)")
        ax.axvline(len(lomo.rows()) - 0.5, color="k", lw=0.5)
        ax.set_title(f"{title} on held-out deployments", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Left of the line: leave one model out; right: splits by deployment (seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def simulate_free(obs, targets) -> list:
    """The free set of a fit through the simulation: FREE_SIMULATE (with TTFT among the targets,
    else FREE), keeping the patterns every run's deployment has a coefficient for."""
    names = [set(r.deployment.coefficients.names) for o in obs for r in o.runs]
    pool = FREE_SIMULATE if "ttft" in targets else FREE
    return [f for f in pool if all(any(jfit.fnmatch.fnmatchcase(n, jfit.Free.parse(f).pattern) for n in ns)
                                   for ns in names)]


def run_study(args):
    t0 = time.perf_counter()
    timings = {}
    csv_path = os.path.normpath(args.csv)
    points, _ = accuracy.read_measurements(csv_path)
    t = time.perf_counter()
    free = FREE
    if args.rule == "simulate":     # each point's closed-loop schedule, built once; fits re-price its steps
        obs, refused, points = jfit.observations_from_simulation(csv_path, targets=args.targets,
                                                                 deployments=args.deployment)
        groups = None
        free = simulate_free(obs, args.targets)
        timings["resolve deployments, build schedules"] = time.perf_counter() - t
    else:
        points = accuracy.select_deployments(points, args.deployment, csv_path)
        groups, refused = accuracy.group_points(points, source=csv_path, batch_rule=args.rule)
        obs = jfit.observations_from_groups(groups, points=points)
        timings["resolve deployments, build batches"] = time.perf_counter() - t
    fit_kw = {**FIT, "steps": args.steps}
    cache = jfit._FitCache(obs, free, fit_kw, None)
    out = {"obs": obs, "refused": refused, "points": points, "timings": timings, "csv": csv_path, "free": list(free)}
    studies = (("lomo", "model", args.priors, (0,)), ("deployment", "deployment", args.priors, tuple(args.seeds)))
    for key, by, priors, seeds in studies:
        bar = Bar(args.quiet, f"cv by {by}")
        bar.expected = 6 * len(priors) if by == "model" else 2 * len(priors) * len(seeds)
        cache.callback = bar
        t = time.perf_counter()
        out[key] = jfit.cross_validate(obs, free, by=by, priors=priors, seeds=seeds, cache=cache, **fit_kw)
        bar.close()
        timings[f"cross-validation by {by} ({len(cache.fits)} fits so far)"] = time.perf_counter() - t
        print(f"cv by {by}: done ({time.perf_counter() - t:.0f} s)", flush=True)
    prior = out["lomo"].best_prior
    t = time.perf_counter()
    cache.callback = bar = Bar(args.quiet, "cv by chip")     # was the closed deployment bar, reopened
    bar.expected = None
    out["chip"] = jfit.cross_validate(obs, free, by="chip", priors=(chip_prior(prior, args.priors),), cache=cache,
                                      **fit_kw)
    bar.close()
    cache.callback = None
    timings["leave one chip out"] = time.perf_counter() - t
    t = time.perf_counter()
    final = cache.fit([o.name for o in obs], prior)
    timings["final fit on every deployment"] = time.perf_counter() - t
    if math.isinf(prior) and math.isfinite(chip_prior(prior, args.priors)):
        # the registry kept: what a fit would do, at the strongest finite prior, for the report
        out["reference"] = cache.fit([o.name for o in obs], chip_prior(prior, args.priors))
    out["final"], out["prior"], out["fits"] = final, prior, len(cache.fits)
    out["compiled"] = sum(r.compiled for r in cache.fits.values())
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, _named("fitted-inferencex.yaml", args.rule))
    data = (f"{os.path.basename(csv_path)} (mean {args.targets.upper() if args.rule == 'simulate' else 'TPOT'}, all {len(obs)} deployments, batch rule '{args.rule}'; "
            f"prior {prior:g} chosen by leave-one-model-out cross-validation)")
    jfit.write_coefficient_set(final, path, name="fitted-inferencex", data=data,
                               engines=sorted({p.engine for p in points}))
    out["path"] = path
    out["scope"] = scope_check(path, final, obs, points, csv_path)
    out["figure"] = figure(out["lomo"], out["deployment"], os.path.join(args.out, _named("calibration-cv.png", args.rule)))
    timings["total"] = time.perf_counter() - t0
    return out


def chip_prior(prior, priors):
    """The prior of the leave-one-chip-out study and of the reference fit: the final one, or,
    where that keeps the registry (inf, which would make the study a table of identities), the
    strongest finite one of the grid."""
    finite = [p for p in priors if math.isfinite(p)]
    return prior if math.isfinite(prior) or not finite else max(finite)


def refresh_chip_study(R, args):
    """A checkpoint whose leave-one-chip-out ran at an infinite prior: rerun it at ``chip_prior``."""
    want = chip_prior(R["prior"], args.priors)
    if R["chip"].priors == (want,):
        return
    fit_kw = {**FIT, "steps": args.steps}
    R["chip"] = jfit.cross_validate(R["obs"], R.get("free", FREE), by="chip", priors=(want,), **fit_kw)


def _named(filename, rule):
    """The study's output file for a batch rule: the default rule's (interleaved) plain, any
    other's with the rule in its name (so a simulate study never overwrites the shipped set)."""
    if rule == "interleaved":
        return filename
    stem, ext = os.path.splitext(filename)
    return f"{stem}-{rule}{ext}"


def write_markdown(args, R):
    obs, final, lomo, dep_cv, chip = R["obs"], R["final"], R["lomo"], R["deployment"], R["chip"]
    models = sorted({o.dims["model"] for o in obs})
    goal_lines, worse, mean_gain, seed_bad = goals(lomo, dep_cv, final)
    targets = args.targets.split(",") if args.rule == "simulate" else ["tpot"]
    target_words = " and ".join(f"mean {t.upper()}" for t in targets)
    log_words = " and ".join(f"log {t.upper()}" for t in targets)
    L = ["# Calibration that transfers: cross-validated by model, chip and deployment", "",
         f"Written by `experiments/calibrate.py` on `{os.path.basename(R['csv'])}`: "
         f"{sum(o.points for o in obs) // len(targets)} points ({target_words} each) of {', '.join(models)} in {len(obs)} deployments "
         f"({len(R['refused'])} points refused by the kernel), batch rule `{args.rule}` (see "
         "`jaxprice/_src/accuracy.py`). Every number below is computed by that run.", "",
         "**Fit.** `jaxprice.fit.fit_coefficients(method=\"gauss-newton\")`: damped Gauss-Newton on "
         "log-multipliers of the free set "
         + ", ".join(f"`{f}`" for f in R.get("free", FREE)) + f"; Huber loss (delta {FIT['huber_delta']}) on {log_words} "
         f"(NoOverlap), exact mode, at most {args.steps} iterations; a prior `prior * sum(log(multiplier)^2)` pulling "
         "every free coefficient toward its registry value; physical bounds on top of the factor ranges (a "
         "derate or GEMM efficiency at most 1, a KV read rate at most the chip's HBM peak); coefficients the "
         f"training data cannot separate (independent share of their Jacobian column below {FIT['identify_tol']:.0%}, "
         "i.e. a near-null direction of the Gauss-Newton Fisher matrix, or no effect at all) are frozen at the "
         "registry's value.", "",
         f"**Prior strength.** Grid {', '.join(f'{p:g}' for p in lomo.priors)}. Each cross-validation fold "
         "chooses its own by an inner cross-validation of the same kind on its training deployments (nested); "
         "the criterion is the mean over inner folds of fit/registry error (TPOT MAPE and shape error"
         + (", TTFT MAPE and TTFT shape error" if "ttft" in targets else "") + ", averaged), taken among the priors whose fits make no inner held-out group worse on any of those metrics (the largest fit/registry ratio at most 1.001), ties (within 0.001) going to the stronger prior. An infinite strength is the registry itself (no coefficient moves), so a fold whose inner cross-validation finds no fit that beats the registry keeps it. The final fit uses the strength chosen the same way from the "
         f"leave-one-model-out folds: **{R['prior']:g}**.", "",
         "TPOT MAPE is mean |pred/meas - 1|; shape error is the accuracy harness's mean over points of "
         "|(pred(C)/pred(C0)) / (meas(C)/meas(C0)) - 1| within each sweep (C0 its lowest concurrency). "
         "Cells read registry -> **fit**.", "",
         "## Goals (issue 12)", ""] + goal_lines + [""]
    L += ["## Leave one model out", "",
          "Each model's deployments held out in turn; the fit sees only the other models' deployments.", ""]
    L += cv_table(lomo, "model") + [""]
    L += ["Every prior strength on every held-out model (fitted TPOT MAPE / shape error; the last two "
          "columns: the criterion, and the largest fit/registry ratio over held-out models and metrics):", ""]
    L += prior_path(lomo) + [""]
    L += ["## By deployment (seeded splits)", "",
          "A quarter of each model's deployments held out (stratified by model; never splitting a deployment).", ""]
    L += cv_table(dep_cv, "split") + [""] + prior_path(dep_cv) + [""]
    L += ["## Leave one chip out", "",
          (f"At the final prior ({R['prior']:g}; not nested)." if R["chip"].priors == (R["prior"],) else
           f"At the strongest finite prior of the grid ({R['chip'].priors[0]:g}; not nested): the final prior "
           f"({R['prior']:g}) keeps the registry, which would leave nothing to compare.")
          + " Chip-scoped coefficients have no value for an unseen chip, so only global ones "
          "(`host_output_token@global`) reach it: this measures what a fit on other chips does to a new one.", ""]
    L += cv_table(chip, "chip") + [""]
    L += [f"![held-out errors]({os.path.basename(R['figure'])})", ""]
    L += final_section(R)
    L += ["## Run time", "", f"{R['fits']} fits ({R['compiled']} compilations: one per deployment plan, batch shape "
          "and kind, shared by every fit).", "", "| stage | seconds |", "|---|---|"]
    L += [f"| {k} | {v:.0f} |" for k, v in R["timings"].items()]
    with open(os.path.join(args.out, _named("calibration.md", args.rule)), "w") as fh:
        fh.write("\n".join(L) + "\n")


def final_section(R):
    final = R["final"]
    worst, outside = R["scope"]
    L = ["## The shipped fit (every deployment)", ""]
    if final.stopped == jfit.REGISTRY_KEPT:
        L += [f"`{os.path.relpath(R['path'], ROOT)}`: {len(final.keys)} free values, prior {final.prior:g}: "
              f"{final.stopped}. No prior strength's fit beat the registry on held-out models, so the shipped set "
              "holds the registry's values (loaded back with every training deployment it reproduces them to "
              f"{worst:.1e}, relative).", ""]
        if R.get("reference") is None:
            return L
        final = R["reference"]
        L += [f"For reference (not shipped): the fit on every deployment at the strongest finite prior "
              f"({final.prior:g}), {final.stopped}; training loss {final.initial['train']:.4f} -> "
              f"{final.final['train']:.4f}. Its identifiability, bounds and multipliers follow.", ""]
    else:
        L += [f"`{os.path.relpath(R['path'], ROOT)}`: {len(final.keys)} free values, prior {final.prior:g}, "
              f"{final.stopped}; training loss {final.initial['train']:.4f} -> {final.final['train']:.4f}. Loaded "
              f"back with every training deployment it reproduces the fit's coefficients to {worst:.1e} (relative).",
              ""]
    L += ["### Identifiability", "",
          f"{len(final.frozen)} of {len(final.keys)} free values frozen at the registry's value:", ""]
    L += [f"* `{k}`: {v}" for k, v in final.frozen.items()] + [""]
    L += ["Sensitivity: RMS change of log TPOT per unit log-multiplier over the training points; independent "
          "share: 1/sqrt(variance inflation) for kept keys, the unexplained share for frozen ones.", ""]
    L += ident_table(final) + [""]
    hits = final.bound_hits()
    L += ["### Bounds", "", f"{len(hits)} fitted value(s) at a bound." if hits else "No fitted value at a bound.", ""]
    L += [f"* `{h['key']}` ({h['side']}; {h['why']}): {h['meaning']}." for h in hits] + [""]
    L += ["### Scope", "",
          f"Entries are scoped to the chips ({', '.join(final.settings['train_chips'])}), models "
          f"({', '.join(final.settings['train_models'])}), engines "
          f"({', '.join(final.settings.get('train_engines', []))}) they were fitted on (a deployment's engine: its "
          "scenario's engine.scheduler, vLLM where unstated). Loaded with deployments outside that scope:", ""]
    for name, same, applies in outside:
        L.append(f"* `{name}`: {len(applies['applied'])} entries apply; coefficients "
                 f"{'identical to the registry bit for bit' if same else '**changed**'}.")
    L += ["", "### Multipliers", "", "| coefficient @ scope | multiplier | |", "|---|---|---|"]
    fr = final.frozen
    hit = {h["key"]: h["side"] for h in hits}
    for k, m in sorted(final.multipliers().items()):
        L.append(f"| `{k}` | {m:.3f} | {'frozen' if k in fr else hit.get(k, '')} |")
    return L + [""]


def relocate(R, args):
    """A checkpointed study written to another ``--out``: its figure drawn there again and its
    fitted set copied there (the same fit), so the report's links hold."""
    import shutil
    os.makedirs(args.out, exist_ok=True)
    R["figure"] = figure(R["lomo"], R["deployment"], os.path.join(args.out, _named("calibration-cv.png", args.rule)))
    path = os.path.join(args.out, _named("fitted-inferencex.yaml", args.rule))
    if os.path.abspath(path) != os.path.abspath(R["path"]):
        shutil.copyfile(R["path"], path)
        R["path"] = path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", default=DEFAULT_CSV)
    ap.add_argument("--rule", default="interleaved", choices=accuracy.BATCH_RULES,
                    help="simulate: fit through the serving simulation (each point's schedule built once)")
    ap.add_argument("--targets", default="tpot,ttft", help="--rule simulate: tpot, ttft or tpot,ttft")
    ap.add_argument("--deployment", action="append", default=None, help="only these deployments (repeatable)")
    ap.add_argument("--priors", default=",".join(f"{p:g}" for p in jfit.DEFAULT_PRIORS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=60, help="Gauss-Newton iterations at most")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--from-checkpoint", action="store_true",
                    help="rewrite the report from the last run's experiments/out/calibration-study.pkl")
    args = ap.parse_args(argv)
    args.priors = [float(x) for x in args.priors.split(",") if x.strip()]
    args.seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    import pickle
    ckpt = os.path.join(ROOT, "experiments", "out", "calibration-study.pkl" if args.rule == "interleaved" else
                        f"calibration-study-{args.rule}.pkl")
    if args.from_checkpoint:
        with open(ckpt, "rb") as fh:
            R = pickle.load(fh)
        relocate(R, args)
        if "free" not in R and args.rule == "simulate":     # a checkpoint from before the free set was kept
            R["free"] = simulate_free(R["obs"], args.targets)
        refresh_chip_study(R, args)
    else:
        R = run_study(args)
        try:
            os.makedirs(os.path.dirname(ckpt), exist_ok=True)
            with open(ckpt, "wb") as fh:
                pickle.dump(R, fh)
        except Exception as err:   # a checkpoint is a convenience: never lose the run to it
            print(f"(no checkpoint: {err})", file=sys.stderr)
    write_markdown(args, R)
    print(f"wrote {os.path.relpath(os.path.join(args.out, _named('calibration.md', args.rule)), ROOT)} "
          f"({R['timings']['total'] / 60:.1f} min, {R['fits']} fits)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
