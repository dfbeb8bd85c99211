"""Calibrate the registry against measured serving latencies, and test it on held-out deployments.

    python experiments/calibrate.py [--csv ../shared/measured/inferencex_vllm_dev.csv]
        [--seed 0] [--test-fraction 0.25] [--steps 400] [--rules interleaved,capped,anchor]
        [--free-sets NAME,...] [--out experiments/results] [--quiet]

1. Split the CSV's deployments into train and test, by deployment (never by point), stratified
   by model so that every model is in both (seeded shuffle; ``--test-fraction`` of each model's
   deployments go to test).
2. Price every mean-TPOT point with the registry as bundled ("before"), under each batch rule
   (below).
3. Fit the free coefficients of each candidate free set (``FREE_SETS``) on the training
   deployments with ``jaxprice.fit`` (Huber loss on log TPOT, NoOverlap, exact mode), holding
   out a quarter of the TRAINING deployments (by deployment, stratified by model) for early
   stopping. The candidate with the lowest inner held-out loss is kept (the test split plays
   no part in any choice) and refit on all training deployments for the number of steps early
   stopping kept.
4. Write the kept fit as a coefficient set, load it with the scenarios like any other set
   (``extra_coefficient_files``), price every point again ("after") and report, per model and
   overall, on the test split (and, for reference, on the training split): shape error
   (mean, upper median, mean over non-anchor points) and TPOT MAPE and mean signed error, for
   NoOverlap (fitted) and Overlap (priced with the same fitted set).

Batch rules: ``anchor`` (the anchor kernel's rule, batch = C decode rows), ``capped`` (the
engine's resident batch, min(C, max_num_seqs * dp, KV-cache capacity / ctx)) and ``interleaved``
(the resident batch and the steady-state prefill chunks that keep it full). They are
``jaxprice.accuracy``'s (``group_points(..., batch_rule=)``; formulas, rationale and limits in
the docstring of ``jaxprice/_src/accuracy.py``): the points are priced with
``accuracy.predict_groups`` and the fit's observations are ``fit.observations_from_groups`` of the
same groups, as ``jaxprice accuracy --batch-rule`` and ``jaxprice fit --batch-rule`` do.

Every rule is applied identically before and after the fit. Writes ``<out>/calibration.md``
(the tables), ``<out>/fitted-inferencex.yaml`` (the kept fit under the first rule, by default
``interleaved``) and ``<out>/fitted-inferencex-<rule>-rule.yaml`` for the others. Takes about
25-35 minutes on 2 busy CPU cores (most of it compiling one kernel per deployment plan and
rule; the fits themselves take seconds).
"""

from __future__ import annotations

import argparse
import json
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
from jaxprice._src.plan import Coefficients  # noqa: E402
from jaxprice._src.progress import Progress  # noqa: E402

DEFAULT_CSV = os.path.join(ROOT, "..", "shared", "measured", "inferencex_vllm_dev.csv")

# Candidate free sets, from few to many coefficients. Every key is scoped per chip unless said
# otherwise (so a test deployment on a chip gets the chip's fitted values whatever its model).
BASE = ["hbm_derate:2", "host_output_token@global:3"]
MEMORY = BASE + ["attention_decode_rate*:3", "attention_decode_floor*:3"]
ARITH = MEMORY + ["gemm_eps_max_*:2", "gemm_m_half_*:3", "moe_routing_imbalance_median:2"]
HOST = ARITH + ["host_launch_per_kernel:3", "host_replay_graph_per_step:3"]
COLL = HOST + ["collective_floor_*@global:3"]
FREE_SETS = {
    "derate": BASE,
    "memory": MEMORY,
    "memory+arith": ARITH,
    "memory+arith+host": HOST,
    "all+collectives": COLL,
}
FIT = dict(loss="huber", huber_delta=0.15, steps=400, learning_rate=0.05, eval_every=5, patience=12,
           weighting="point")
ESTIMATES = ("no_overlap", "overlap")
RULES = accuracy.BATCH_RULES
WORKLOAD_COLOURS = {"1k1k": "C0", "1k8k": "C1", "8k1k": "C3"}
RULE_TEXT = {
    "anchor": "Batch = C decode rows (the anchor kernel's rule).",
    "capped": ("Batch = min(C, max_num_seqs x dp, floor(dp x KV-cache tokens / ctx)) decode rows: requests "
               "beyond the engine's resident limit wait in the queue (see the docstring of "
               "`jaxprice/_src/accuracy.py`). {capped} of the {points} points have a resident batch below C."),
    "interleaved": ("The capped batch (R rows; {capped} points below C), and the prefills that keep it full: "
                    "R / osl requests arrive per step, each prefilled in chunks of at most "
                    "max_num_batched_tokens - R tokens beside the decode rows, so TPOT = S(R decodes) + "
                    "(R / osl) x sum over chunks of [S(R decodes + chunk) - S(R decodes)] + host_output_token "
                    "(see the docstring of `jaxprice/_src/accuracy.py`)."),
}


# ----------------------------------------------------------------------------- scoring


def plain(coefs):
    """Coefficients without cites (the kernel reads none; equal pytrees share compilations)."""
    return Coefficients(np.asarray(coefs.values), coefs.names, coefs.units)


def summaries(report, names):
    """{estimate: {model|'all': summary}} over the points of the named deployments."""
    recs = [r for r in report.records if r["deployment"] in names]
    out = {}
    for e in ESTIMATES:
        out[e] = {}
        for m in sorted({r["model"] for r in recs}) + ["all"]:
            sel = [r for r in recs if m == "all" or r["model"] == m]
            out[e][m] = accuracy.summarize([r[f"{e}_shape_error"] for r in sel], [r["anchor"] for r in sel],
                                           [r[f"{e}_tpot_us"] for r in sel], [r["measured_us"] for r in sel])
    return out


def price_report(points, groups, refused, coefficients, csv_path):
    """Price every group's batches under its batch rule (jaxprice.accuracy: one vmapped call
    per deployment, combined per point) with the given coefficients, and score them."""
    preds = accuracy.predict_groups(groups, coefficients)
    return accuracy.score(points, groups, refused, preds, csv_path=csv_path)


def table(before, after, estimate, models):
    lines = ["| model | points | shape mean | shape median | shape mean (non-anchor) | TPOT MAPE | TPOT signed |",
             "|---|---|---|---|---|---|---|"]
    for m in models + ["all"]:
        b, a = before[estimate].get(m), after[estimate].get(m)
        if b is None:
            continue

        def pair(key, signed=False):
            f = "{:+.1%}" if signed else "{:.1%}"
            return f"{f.format(b[key])} -> **{f.format(a[key])}**"
        lines.append(f"| {m} | {b['points']} | {pair('shape_mean')} | {pair('shape_median')} | "
                     f"{pair('shape_mean_non_anchor')} | {pair('tpot_mape')} | {pair('tpot_mean_signed', True)} |")
    return lines


# ----------------------------------------------------------------------------- main


def plot_test(results, rule, test_names, path):
    """One panel per test deployment: measured mean TPOT (dots) against C, the registry's
    prediction (dashed) and the fitted one (solid), one colour per sweep."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401
    R = results[rule]
    before = {(r["row"]): r for r in R["before"].records}
    ncol = 4
    nrow = math.ceil(len(test_names) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.4 * ncol, 2.7 * nrow), squeeze=False)
    for ax, dep in zip(axes.flat, test_names):
        recs = [r for r in R["after"].records if r["deployment"] == dep]
        sweeps = list(dict.fromkeys((r["scenario"], r["workload"]) for r in recs))
        for sw in sweeps:
            rs = sorted((r for r in recs if (r["scenario"], r["workload"]) == sw), key=lambda r: r["concurrency"])
            c = [r["concurrency"] for r in rs]
            col = WORKLOAD_COLOURS.get(sw[1], "C7")
            ax.plot(c, [r["measured_us"] / 1e3 for r in rs], "o", ms=3, color=col, label=sw[1])
            ax.plot(c, [before[r["row"]]["no_overlap_tpot_us"] / 1e3 for r in rs], "--", lw=0.8, color=col)
            ax.plot(c, [r["no_overlap_tpot_us"] / 1e3 for r in rs], "-", lw=1.2, color=col)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.xaxis.set_major_formatter(fmt)
        ax.yaxis.set_major_formatter(fmt)
        lo, hi = ax.get_ylim()
        ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(
            base=10, subs=tuple(range(1, 10)) if hi / lo < 4 else (2, 5)))
        ax.yaxis.set_minor_formatter(fmt)
        ax.set_title(dep, fontsize=7)
        ax.tick_params(labelsize=6)
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles))
        ax.legend(uniq.values(), uniq.keys(), fontsize=5, loc="upper left")
    for ax in list(axes.flat)[len(test_names):]:
        ax.axis("off")
    a = summaries(R["after"], set(test_names))["no_overlap"]["all"]
    b = summaries(R["before"], set(test_names))["no_overlap"]["all"]
    fig.suptitle(f"Test deployments, rule '{rule}': measured mean TPOT (dots), registry (dashed) and fitted "
                 f"(solid) NoOverlap + host_output_token.  TPOT MAPE {b['tpot_mape']:.1%} -> {a['tpot_mape']:.1%}, "
                 f"shape error {b['shape_mean']:.1%} -> {a['shape_mean']:.1%}", fontsize=9)
    fig.supxlabel("client concurrency C", fontsize=8)
    fig.supylabel("mean TPOT (ms)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def dump_json(results, rules, train_names, test_names, timings, path):
    out = {"train": train_names, "test": test_names, "timings_s": timings, "rules": {}}
    for rule in rules:
        R = results[rule]
        out["rules"][rule] = {
            "kept": R["kept"], "free": FREE_SETS[R["kept"]], "capped_points": len(R["capped"]),
            "candidates": {n: {"train": [f.initial["train"], f.final["train"]],
                               "inner_held_out": [f.initial["held_out"], f.final["held_out"]],
                               "stopped": f.stopped} for n, f in R["fits"].items()},
            "multipliers": R["final"].multipliers(),
            "seeds": {str(k): v for k, v in R.get("seeds", {}).items()},
            "summaries": {split: {"before": summaries(R["before"], set(names)),
                                  "after": summaries(R["after"], set(names))}
                          for split, names in (("test", test_names), ("train", train_names))}}
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)


def calibrate_split(args, rule, seed, train_names, test_names, obs, dep_model, sets, points, rgroups, refused,
                    registry, csv_path, timings, *, write_to, primary, quiet=False):
    """Fit every candidate free set on one split's training deployments (inner hold-out),
    refit the kept one on all of them, write it to ``write_to``, price every point with the
    written set loaded like any other, and return the results."""
    label = rule if primary_seed(args, seed) else f"{rule} seed {seed}"
    train_obs = [obs[n] for n in train_names if n in obs]
    inner_train, inner_held = jfit.split_by_deployment([o.name for o in train_obs], args.inner_holdout,
                                                       seed=seed, stratify=dep_model)
    if not inner_held:      # too few deployments per model to stratify
        inner_train, inner_held = jfit.split_by_deployment([o.name for o in train_obs], args.inner_holdout,
                                                           seed=seed)
    if not inner_held:
        raise SystemExit("calibrate: error: too few training deployments to hold any out")
    fits = {}
    for name in sets:
        bar = None

        def progress(done, total, stage="descent", **info):
            nonlocal bar
            if args.quiet or quiet:
                return
            if bar is None or bar.label != f"{rule} {name} {stage}":
                if bar is not None:
                    bar.close()
                bar = Progress(total, f"{rule} {name} {stage}")
            bar.update(done, total, **info)
        t = time.perf_counter()
        res = jfit.fit_coefficients([obs[n] for n in inner_train], FREE_SETS[name],
                                    held_out=[obs[n] for n in inner_held],
                                    **{**FIT, "steps": args.steps}, callback=progress)
        if bar is not None:
            bar.close()
        timings[f"{label}: fit {name}"] = time.perf_counter() - t
        fits[name] = res
        print(f"  {name:<20} keys {len(res.keys):>3}  train {res.initial['train']:.4f} -> "
              f"{res.final['train']:.4f}  inner held-out {res.initial['held_out']:.4f} -> "
              f"{res.final['held_out']:.4f}  ({res.stopped}; {timings[f'{label}: fit {name}']:.0f} s)")
    kept = min(fits, key=lambda n: fits[n].final["held_out"])
    # refit the kept set on every training deployment, for as many steps as early stopping kept
    steps = max(fits[kept].best_step, 1)
    t = time.perf_counter()
    res = jfit.fit_coefficients(train_obs, FREE_SETS[kept], **{**FIT, "steps": steps, "patience": 10 ** 6},
                                callback=None)
    timings[f"{label}: refit {kept} on all training deployments"] = time.perf_counter() - t
    print(f"  refit '{kept}' on all {len(train_obs)} training deployments for {steps} steps: train loss "
          f"{res.initial['train']:.4f} -> {res.final['train']:.4f}")
    fname = "fitted-inferencex.yaml" if primary else f"fitted-inferencex-{rule}-rule.yaml"
    os.makedirs(write_to, exist_ok=True)
    path = os.path.join(write_to, fname)
    data = (f"{os.path.basename(csv_path)} (mean TPOT, {len(train_names)} training deployments of "
            f"{len(dep_model)}, split by deployment stratified by model, seed {seed}; batch rule "
            f"'{rule}'; free set '{kept}')")
    jfit.write_coefficient_set(res, path, name=f"fitted-inferencex-{rule}", data=data)
    print(f"kept free set '{kept}' (lowest inner held-out loss); wrote {os.path.relpath(path, ROOT)}")
    # price again with the written set, loaded like any other set
    t = time.perf_counter()
    fitted = {}
    for g in rgroups:
        dep, _ = accuracy.build_deployment(points[g.index[0]], registry=registry,
                                           extra_coefficient_files=[path], source=csv_path)
        fitted[g.name] = plain(dep.coefficients)
    after = price_report(points, rgroups, refused, fitted, csv_path)
    timings[f"{label}: price after"] = time.perf_counter() - t
    # the loaded set prices every training deployment as the fit did
    check = max(float(np.max(np.abs(
        np.array([r["no_overlap_tpot_us"] for r in after.records if r["deployment"] == o.name]) /
        (res.predict(o) * 1e6) - 1))) for o in train_obs)
    return {"after": after, "fits": fits, "kept": kept, "path": path, "final": res, "check": check,
            "inner": (inner_train, inner_held)}


def primary_seed(args, seed):
    return seed == args.seed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", default=DEFAULT_CSV)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--test-fraction", type=float, default=0.25)
    ap.add_argument("--inner-holdout", type=float, default=0.25)
    ap.add_argument("--steps", type=int, default=FIT["steps"])
    ap.add_argument("--rules", default="interleaved,capped,anchor",
                    help="comma-separated batch rules: anchor, capped, interleaved; the first one's fit is "
                         "written as fitted-inferencex.yaml")
    ap.add_argument("--free-sets", default=",".join(FREE_SETS), help="comma-separated names of FREE_SETS")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument("--extra-seeds", default="", help="comma-separated seeds of further train/test splits to "
                    "fit and score (summarised in a table; their sets go to experiments/out/)")
    args = ap.parse_args(argv)
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    try:
        extra_seeds = [int(x) for x in args.extra_seeds.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--extra-seeds takes integers, not {args.extra_seeds!r}")
    sets = [s.strip() for s in args.free_sets.split(",") if s.strip()]
    for r in rules:
        if r not in RULES:
            ap.error(f"unknown rule {r!r}")
    for s in sets:
        if s not in FREE_SETS:
            ap.error(f"unknown free set {s!r} (known: {', '.join(FREE_SETS)})")
    t_start = time.perf_counter()
    timings = {}
    csv_path = os.path.normpath(args.csv)
    registry = jp.Registry()

    points, info = accuracy.read_measurements(csv_path)
    models = sorted({p.model for p in points})
    dep_model = {p.deployment: p.model for p in points}
    train_names, test_names = jfit.split_by_deployment(dep_model, args.test_fraction, seed=args.seed,
                                                       stratify=dep_model)
    print(f"{csv_path}: {len(points)} mean-TPOT points, {len(dep_model)} deployments; "
          f"train {len(train_names)}, test {len(test_names)} (seed {args.seed}, stratified by model)")

    results = {}
    for rule in rules:
        print(f"\n=== batch rule: {rule}")
        t = time.perf_counter()
        rgroups, refused = accuracy.group_points(points, registry=registry, source=csv_path, batch_rule=rule)
        timings[f"{rule}: resolve {len(dep_model)} deployments, build batches"] = time.perf_counter() - t
        if refused:
            print(f"{len(refused)} points refused by the kernel (kept out of the fit, counted in the tables)")
        capped = {int(i): int(n) for g in rgroups for i, n in zip(g.index, g.resident) if n < points[i].concurrency}
        if rule != "anchor":
            print(f"{len(capped)} points have a resident batch below C")
        base = {g.name: plain(g.deployment.coefficients) for g in rgroups}
        t = time.perf_counter()
        before = price_report(points, rgroups, refused, base, csv_path)
        timings[f"{rule}: price before"] = time.perf_counter() - t
        obs = {o.name: o for o in jfit.observations_from_groups(rgroups, target="tpot", estimate="no_overlap")}
        results[rule] = calibrate_split(args, rule, args.seed, train_names, test_names, obs, dep_model, sets,
                                        points, rgroups, refused, registry, csv_path, timings,
                                        write_to=args.out, primary=rule == rules[0])
        results[rule].update(before=before, capped=capped)
        for split, names in (("test", test_names), ("train", train_names)):
            s_b = summaries(before, set(names))["no_overlap"]["all"]
            s_a = summaries(results[rule]["after"], set(names))["no_overlap"]["all"]
            print(f"  {split:<5} NoOverlap: shape mean {s_b['shape_mean']:.1%} -> {s_a['shape_mean']:.1%}, "
                  f"median {s_b['shape_median']:.1%} -> {s_a['shape_median']:.1%}; TPOT MAPE "
                  f"{s_b['tpot_mape']:.1%} -> {s_a['tpot_mape']:.1%} (signed {s_b['tpot_mean_signed']:+.1%} -> "
                  f"{s_a['tpot_mean_signed']:+.1%})")
        for seed in extra_seeds:
            tr, te = jfit.split_by_deployment(dep_model, args.test_fraction, seed=seed, stratify=dep_model)
            print(f"  -- seed {seed}: train {len(tr)}, test {len(te)}")
            r = calibrate_split(args, rule, seed, tr, te, obs, dep_model, sets, points, rgroups, refused,
                                registry, csv_path, timings, write_to=os.path.join(ROOT, "experiments", "out",
                                                                                   f"calibrate-seed{seed}"),
                                primary=rule == rules[0], quiet=True)
            results[rule].setdefault("seeds", {})[seed] = {
                "kept": r["kept"], "test": te,
                "before": summaries(before, set(te))["no_overlap"]["all"],
                "after": summaries(r["after"], set(te))["no_overlap"]["all"]}
    timings["total"] = time.perf_counter() - t_start
    os.makedirs(args.out, exist_ok=True)
    figure = plot_test(results, rules[0], test_names, os.path.join(args.out, "calibration-test.png"))
    dump_json(results, rules, train_names, test_names, timings,
              os.path.join(ROOT, "experiments", "out", "calibration.json"))
    write_markdown(args, results, rules, sets, models, train_names, test_names, dep_model, timings, csv_path,
                   figure)
    print(f"\nwrote {os.path.relpath(os.path.join(args.out, 'calibration.md'), ROOT)} "
          f"({timings['total'] / 60:.1f} min)")
    return 0


def findings(per_rule) -> list:
    """Markdown lines reading the results across splits. per_rule: {rule: [(seed, before, after)]}
    with test-split NoOverlap summaries over all models; the first rule is the headline one."""
    def mean(rows, which, key):
        return sum(r[which][key] for r in rows) / len(rows)
    L = ["## Reading the results", ""]
    rules = list(per_rule)
    n = len(per_rule[rules[0]])
    for rule in rules:
        rows = [{"b": b, "a": a} for _, b, a in per_rule[rule]]
        L.append(f"* `{rule}`, mean over {n} split(s): shape error {mean(rows, 'b', 'shape_mean'):.1%} (registry) -> "
                 f"{mean(rows, 'a', 'shape_mean'):.1%} (fitted), TPOT MAPE {mean(rows, 'b', 'tpot_mape'):.1%} -> "
                 f"{mean(rows, 'a', 'tpot_mape'):.1%}; the fit lowers the test shape error on "
                 f"{sum(r['a']['shape_mean'] < r['b']['shape_mean'] for r in rows)} of {n} splits and the TPOT "
                 f"MAPE on {sum(r['a']['tpot_mape'] < r['b']['tpot_mape'] for r in rows)} of {n}; both goals are "
                 f"met on {sum(r['a']['shape_mean'] <= 0.08 and r['a']['tpot_mape'] <= 0.15 for r in rows)} of {n}.")
    L += ["",
          "The batch rule does most of the work, before any fitting: pricing the prefills that keep the "
          "resident batch full (`interleaved`) explains why TPOT grows faster with C at 8k1k than at 1k1k, "
          "which the anchor's batch = C rule can only absorb by slowing down KV reads (the fits under "
          "`anchor` and `capped` push most `attention_decode_rate*` multipliers to or near their lower "
          "bound, 1/3). The coefficient fit "
          "then corrects the level (TPOT signed error near 0 on the training split), but what it learns "
          "from 34 deployments carries over to held-out deployments unevenly: the fitted values are "
          "effective multipliers (several at their bounds), not measurements of the chips, and a split "
          "whose test deployments differ from its training ones gains little or loses. "
          "The `interleaved` rule was designed after looking at the registry's errors on all 45 "
          "deployments (test ones included); it has no fitted parameter, and the free-set choice and the "
          "fit never see a test split.", ""]
    return L


def write_markdown(args, results, rules, sets, models, train_names, test_names, dep_model, timings, csv_path,
                   figure=None):
    n_points = len(next(iter(results.values()))["before"].records)
    L = ["# Calibration against measured vLLM serving latencies",
         "",
         f"Written by `experiments/calibrate.py` (seed {args.seed}, test fraction {args.test_fraction}, "
         f"{args.steps} steps at most) on `{os.path.basename(csv_path)}`: {n_points} mean-TPOT points of "
         f"{', '.join(models)} in {len(dep_model)} deployments.",
         "",
         "**Split.** By deployment, never by point, stratified by model (every model is in both "
         f"splits): {len(train_names)} training and {len(test_names)} test deployments. A quarter "
         "of the training deployments (again by deployment, stratified by model) is held out inside "
         "the fit for early stopping and for choosing among the candidate free sets, so the test "
         "split plays no part in any choice.",
         "",
         "Test deployments: " + ", ".join(f"`{n}`" for n in test_names) + ".",
         "",
         "**Prediction.** TPOT(C) = NoOverlap of the decode batch at context isl + osl // 2 "
         "(threshold 8) + host_output_token, as the anchor kernel does (shared/measured/README.md); "
         "Overlap is shown beside it, priced with the same fitted set. Shape error per point is "
         "|(pred(C)/pred(C0)) / (meas(C)/meas(C0)) - 1| within each sweep (C0 its lowest "
         "concurrency), averaged over all points (anchor points count as 0), and also over the "
         "non-anchor points; the median is the upper median. TPOT MAPE is mean |pred/meas - 1|.",
         "",
         "**Fit.** `jaxprice.fit`: Adam on log-multipliers, Huber loss (delta 0.15) on log TPOT "
         "(NoOverlap), exact mode, bounds by projection (fractions of a peak stay <= 1), early "
         "stopping on the inner held-out loss. The written set is loaded with each scenario "
         "(`extra_coefficient_files`) and every point is priced again with it.",
         "",
         "Goals on the test split: TPOT MAPE <= 15% and shape error <= 8% (NVIDIA's own simulator "
         "reports 24% TPOT MAPE and 10% shape error on the same kind of data).",
         ""]
    L += ["## Summary: test split, NoOverlap, all models", "",
          "| batch rule | kept free set | shape mean | shape median | TPOT MAPE | TPOT signed | goals met |",
          "|---|---|---|---|---|---|---|"]
    for rule in rules:
        R = results[rule]
        b = summaries(R["before"], set(test_names))["no_overlap"]["all"]
        a = summaries(R["after"], set(test_names))["no_overlap"]["all"]
        met = ("MAPE " + ("yes" if a["tpot_mape"] <= 0.15 else "no") + ", shape " +
               ("yes" if a["shape_mean"] <= 0.08 else "no"))
        L.append(f"| `{rule}` | `{R['kept']}` | {b['shape_mean']:.1%} -> **{a['shape_mean']:.1%}** | "
                 f"{b['shape_median']:.1%} -> **{a['shape_median']:.1%}** | {b['tpot_mape']:.1%} -> "
                 f"**{a['tpot_mape']:.1%}** | {b['tpot_mean_signed']:+.1%} -> **{a['tpot_mean_signed']:+.1%}** | "
                 f"{met} |")
    L += ["", "(registry -> fitted; the shape error goal is judged on the mean, the stricter summary)", ""]
    if any("seeds" in results[r] for r in rules):
        L += ["Other train/test splits (seeds; the same procedure, each split's own fit; test split, NoOverlap, "
              "all models):", "",
              "| batch rule | seed | test deployments | kept free set | shape mean | shape median | TPOT MAPE | "
              "TPOT signed |", "|---|---|---|---|---|---|---|---|"]
        for rule in rules:
            R = results[rule]
            rows = [(args.seed, test_names, R["kept"], summaries(R["before"], set(test_names))["no_overlap"]["all"],
                     summaries(R["after"], set(test_names))["no_overlap"]["all"])]
            rows += [(sd, v["test"], v["kept"], v["before"], v["after"]) for sd, v in R.get("seeds", {}).items()]
            for sd, te, kept, b, a in rows:
                L.append(f"| `{rule}` | {sd} | {len(te)} | `{kept}` | {b['shape_mean']:.1%} -> "
                         f"**{a['shape_mean']:.1%}** | {b['shape_median']:.1%} -> **{a['shape_median']:.1%}** | "
                         f"{b['tpot_mape']:.1%} -> **{a['tpot_mape']:.1%}** | {b['tpot_mean_signed']:+.1%} -> "
                         f"**{a['tpot_mean_signed']:+.1%}** |")
        L.append("")
    if figure:
        L += [f"![test deployments]({os.path.basename(figure)})", ""]
    per_rule = {}
    for rule in rules:
        R = results[rule]
        per_rule[rule] = [(args.seed, summaries(R["before"], set(test_names))["no_overlap"]["all"],
                           summaries(R["after"], set(test_names))["no_overlap"]["all"])]
        per_rule[rule] += [(sd, v["before"], v["after"]) for sd, v in R.get("seeds", {}).items()]
    L += findings(per_rule)
    for rule in rules:
        R = results[rule]
        res = R["final"]
        L += [f"## Batch rule `{rule}`", ""]
        L += [RULE_TEXT[rule].format(capped=len(R["capped"]), points=n_points), ""]
        L += ["Candidate free sets (inner held-out loss decides; Huber on log TPOT):", "",
              "| free set | keys | train loss | inner held-out loss | stopped |", "|---|---|---|---|---|"]
        for name in sets:
            f = R["fits"][name]
            mark = " (kept)" if name == R["kept"] else ""
            L.append(f"| `{name}`{mark} | {len(f.keys)} | {f.initial['train']:.4f} -> {f.final['train']:.4f} | "
                     f"{f.initial['held_out']:.4f} -> {f.final['held_out']:.4f} | {f.stopped} |")
        L += ["", f"Kept free set `{R['kept']}`: " + ", ".join(f"`{x}`" for x in FREE_SETS[R["kept"]]) + "; "
              f"refit on all {len(train_names)} training deployments for {res.settings['steps']} steps (the "
              f"step early stopping kept), training loss {res.initial['train']:.4f} -> {res.final['train']:.4f}.",
              f"Written to `{os.path.relpath(R['path'], ROOT)}`; the loaded set reproduces the "
              f"fit's own predictions on the training deployments to {R['check']:.1e} (relative).", ""]
        for split, names in (("test", test_names), ("train", train_names)):
            b, a = summaries(R["before"], set(names)), summaries(R["after"], set(names))
            for e in ESTIMATES:
                L += [f"### {split.capitalize()} split, {'NoOverlap' if e == 'no_overlap' else 'Overlap'} "
                      f"(registry -> fitted)", ""]
                L += table(b, a, e, models)
                L.append("")
        L += ["Fitted multipliers (fitted / registry value; bound hits marked):", "",
              "| coefficient @ scope | multiplier | |", "|---|---|---|"]
        hits = res.at_bound()
        for k, m in sorted(res.multipliers().items()):
            L.append(f"| `{k}` | {m:.3f} | {hits.get(k, '')} |")
        L.append("")
    L += ["## Run time", "", "| stage | seconds |", "|---|---|"]
    L += [f"| {k} | {v:.0f} |" for k, v in timings.items()]
    L.append("")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "calibration.md"), "w") as fh:
        fh.write("\n".join(L))


if __name__ == "__main__":
    sys.exit(main())
