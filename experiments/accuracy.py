"""Accuracy of the bundled registry against the development set of measured vLLM latencies.

    python experiments/accuracy.py [--csv ../shared/measured/inferencex_vllm_dev.csv]
        [--rules anchor,interleaved,capped,simulate] [--cache-dir DIR]

Runs ``jaxprice accuracy`` on the CSV (default ``../shared/measured/inferencex_vllm_dev.csv``,
relative to the repository root: 1,155 mean-TPOT points, 222 sweeps, 45 deployments) once per
batch rule (``--rules``, default ``anchor,interleaved,capped,simulate``; see ``jaxprice/_src/accuracy.py``) and
writes

* experiments/results/accuracy.md — the table under the anchor kernel's rule (committed; the
  README's accuracy section is generated from it),
* experiments/results/accuracy_sweeps.png — measured against predicted TPOT, one panel per
  deployment,
* experiments/results/accuracy-<rule>.md and accuracy_sweeps-<rule>.png for every other rule
  (``simulate`` also accuracy_sweeps-simulate-ttft.png: measured against simulated TTFT);
  accuracy-simulate.md (else the first non-anchor rule's file) ends with a table of all points
  under every rule run (NoOverlap and Overlap, TPOT and TTFT, with each run's wall time), the
  errors by concurrency bucket and on the held-out deployments, and the issue's goals,
* experiments/out/accuracy_points.csv (anchor) and experiments/out/accuracy-<rule>/accuracy_points.csv
  — one row per point (git-ignored),

then prints the wall time. The static rules are compile-bound (one kernel per deployment plan and rule);
with ``--cache-dir experiments/out/xla-cache`` a second run reuses the compiled kernels.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from jaxprice._src.accuracy import BATCH_RULES, ESTIMATE_LABELS, ESTIMATES, repeat_spread, summarize  # noqa: E402
from jaxprice.cli import main as jaxprice_main  # noqa: E402

DEFAULT_CSV = os.path.join("..", "shared", "measured", "inferencex_vllm_dev.csv")


def paths(rule, results, out):
    """(markdown, plot, points-CSV folder) of one rule's run."""
    if rule == "anchor":
        return (os.path.join(results, "accuracy.md"), os.path.join(results, "accuracy_sweeps.png"), out)
    return (os.path.join(results, f"accuracy-{rule}.md"), os.path.join(results, f"accuracy_sweeps-{rule}.png"),
            os.path.join(out, f"accuracy-{rule}"))


def read_points(folder):
    with open(os.path.join(folder, "accuracy_points.csv"), newline="") as fh:
        return list(csv.DictReader(fh))


GOALS = (("TPOT shape mean", "shape_mean", 0.06), ("TPOT MAPE", "tpot_mape", 0.12), ("TTFT MAPE", "ttft_mape", 0.25),
         ("TTFT shape mean", "ttft_shape_mean", 0.15))
# each goal's metric in accuracy.repeat_spread: (quantity, the runs' own value, the model's on the same points)
SPREAD_OF = {"shape_mean": ("tpot", "shape_mean", "model_shape_mean"), "tpot_mape": ("tpot", "mape", "model_mape"),
             "ttft_mape": ("ttft", "mape", "model_mape"), "ttft_shape_mean": ("ttft", "shape_mean", "model_shape_mean")}
BUCKETS = (("C <= 16", 16), ("16 < C <= 64", 64), ("64 < C <= 256", 256), ("C > 256", float("inf")))


def _num(x):
    return float(x) if x not in ("", None) else float("nan")


def _summary(recs, e):
    return summarize([_num(r[f"{e}_shape_error"]) for r in recs], [r["anchor"] == "True" for r in recs],
                     [_num(r[f"{e}_tpot_us"]) for r in recs], [_num(r["measured_us"]) for r in recs],
                     [_num(r.get(f"{e}_ttft_shape_error")) for r in recs], [_num(r.get(f"{e}_ttft_us")) for r in recs],
                     [_num(r.get("measured_ttft_us")) for r in recs])


def _pct(x, signed=False):
    return "-" if x != x else (f"{x:+.1%}" if signed else f"{x:.1%}")


def comparison(runs, seconds, test_deployments) -> str:
    """Markdown: all points under each rule run, NoOverlap and Overlap (from the points CSVs); then
    NoOverlap by concurrency bucket and on the held-out deployments under each rule; the goals."""
    lines = ["", "## All points under each batch rule", "",
             "The registry as bundled, every point of the CSV, each rule's own run of `jaxprice accuracy` "
             "(`anchor` is the anchor kernel's rule, experiments/results/accuracy.md; `interleaved` and `capped` "
             "are jaxprice's static rules, designed after looking at these errors; `simulate` is the serving "
             "simulation with the published recipes' engine settings). TTFT is predicted by `simulate` only.", "",
             "| batch rule | estimate | points | priced | resident below C | shape mean | shape median | "
             "TPOT MAPE | TPOT signed | TTFT MAPE | TTFT signed | TTFT shape mean | TTFT shape median | run time |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for rule, recs in runs.items():
        below = sum(1 for r in recs if r["status"] == "priced" and int(r["resident"]) < int(r["concurrency"]))
        for e in ESTIMATES:
            s = _summary(recs, e)
            lines.append(f"| `{rule}` | {ESTIMATE_LABELS[e]} | {s['points']} | {s['priced']} | {below} | "
                         f"{_pct(s['shape_mean'])} | {_pct(s['shape_median'])} | {_pct(s['tpot_mape'])} | "
                         f"{_pct(s['tpot_mean_signed'], True)} | {_pct(s['ttft_mape'])} | "
                         f"{_pct(s['ttft_mean_signed'], True)} | {_pct(s['ttft_shape_mean'])} | "
                         f"{_pct(s['ttft_shape_median'])} | "
                         f"{'earlier run' if seconds[rule] != seconds[rule] else f'{seconds[rule]:.0f} s'} |")
    lines += ["", "### NoOverlap by concurrency bucket", "",
              "| batch rule | concurrency | points | TPOT shape mean | TPOT MAPE | TPOT signed | TTFT MAPE | "
              "TTFT shape mean |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for rule, recs in runs.items():
        lo = 0
        for label, top in BUCKETS:
            sel = [r for r in recs if lo < int(r["concurrency"]) <= top]
            lo = top
            if not sel:
                continue
            s = _summary(sel, "no_overlap")
            lines.append(f"| `{rule}` | {label} | {s['points']} | {_pct(s['shape_mean'])} | {_pct(s['tpot_mape'])} | "
                         f"{_pct(s['tpot_mean_signed'], True)} | {_pct(s['ttft_mape'])} | "
                         f"{_pct(s['ttft_shape_mean'])} |")
    lines += ["", f"### NoOverlap on the held-out deployments ({len(test_deployments)} of {len(set(r['deployment'] for r in next(iter(runs.values()))))}: "
                  "the split `jaxprice fit` holds out, `split_by_deployment(0.25, seed=0, stratify=model)`)", "",
              "Nothing is fitted here: the split shows whether the errors on deployments no fit has seen differ "
              "from the rest. The rules' design (and any engine setting marked in sample) was chosen on all of "
              "the development set, the test deployments included.", "",
              "| batch rule | deployments | points | TPOT shape mean | TPOT MAPE | TPOT signed | TTFT MAPE | "
              "TTFT shape mean |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for rule, recs in runs.items():
        for label, sel in (("train", [r for r in recs if r["deployment"] not in test_deployments]),
                           ("test", [r for r in recs if r["deployment"] in test_deployments])):
            s = _summary(sel, "no_overlap")
            lines.append(f"| `{rule}` | {label} | {s['points']} | {_pct(s['shape_mean'])} | {_pct(s['tpot_mape'])} | "
                         f"{_pct(s['tpot_mean_signed'], True)} | {_pct(s['ttft_mape'])} | "
                         f"{_pct(s['ttft_shape_mean'])} |")
    if "simulate" in runs:
        s = _summary(runs["simulate"], "no_overlap")
        spread = repeat_spread(runs["simulate"])
        lines += ["", "### Goals (issue 15; NoOverlap, bundled registry, all points)", "",
                  "Beside each: on the points measured in more than one run, the same metric of each run predicted "
                  "by the other runs (`accuracy.repeat_spread`: the measurements' own reproducibility) and of "
                  "`simulate` on those same points.", "",
                  "| metric | goal | `simulate` | met | another run, repeated points | `simulate`, same points |",
                  "|---|---:|---:|---|---:|---:|"]
        for label, key, goal in GOALS:
            v = s[key]
            q, floor, own = SPREAD_OF[key]
            lines.append(f"| {label} | <= {goal:.0%} | {_pct(v)} | {'yes' if v == v and v <= goal else 'no'} | "
                         f"{_pct(spread[q][floor])} | {_pct(spread[q].get(own, float('nan')))} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=DEFAULT_CSV,
                    help="measurement CSV (default ../shared/measured/inferencex_vllm_dev.csv, from the repo root)")
    ap.add_argument("--results", default=os.path.join("experiments", "results"),
                    help="where accuracy.md, accuracy-<rule>.md and the sweep plots go (default experiments/results)")
    ap.add_argument("--out", default=os.path.join("experiments", "out"), help="where accuracy_points.csv goes")
    ap.add_argument("--rules", default="anchor,interleaved,capped,simulate",
                    help=f"comma-separated batch rules to run ({', '.join(BATCH_RULES)}; default "
                         "anchor,interleaved,capped,simulate)")
    ap.add_argument("--cache-dir", default=None, help="JAX persistent compilation cache folder")
    args = ap.parse_args(argv)
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    for r in rules:
        if r not in BATCH_RULES:
            ap.error(f"unknown batch rule {r!r} (known: {', '.join(BATCH_RULES)})")
    os.chdir(ROOT)                 # paths in the recorded command stay relative to the repository
    if not os.path.exists(args.csv):
        print(f"experiments/accuracy.py: {args.csv}: no such file (the development set lives in "
              "../shared/measured/ next to the repository; give --csv)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    runs, seconds = {}, {}
    for rule in rules:
        md, plot, out = paths(rule, args.results, args.out)
        cmd = ["accuracy", args.csv, "--out", out, "--plot", plot, "--markdown", md, "--batch-rule", rule]
        if args.cache_dir:
            cmd += ["--cache-dir", args.cache_dir]
        t = time.perf_counter()
        rc = jaxprice_main(cmd)
        seconds[rule] = time.perf_counter() - t
        print(f"experiments/accuracy.py: rule {rule}: {seconds[rule]:.1f} s", file=sys.stderr)
        if rc:
            return rc
        runs[rule] = read_points(out)
    # rules not run this time: their points from the last run under --out, where there is one
    for rule in BATCH_RULES:
        folder = paths(rule, args.results, args.out)[2]
        if rule not in runs and os.path.exists(os.path.join(folder, "accuracy_points.csv")):
            runs[rule] = read_points(folder)
            seconds[rule] = float("nan")
            print(f"experiments/accuracy.py: rule {rule}: points from {folder} (an earlier run)", file=sys.stderr)
    runs = {r: runs[r] for r in BATCH_RULES if r in runs}
    others = [r for r in rules if r != "anchor"]
    if others and len(runs) > 1:
        md = paths("simulate" if "simulate" in runs else others[0], args.results, args.out)[0]
        from jaxprice._src.accuracy import read_measurements
        from jaxprice._src.fit import split_by_deployment
        points, _ = read_measurements(args.csv)
        models = {p.deployment: p.model for p in points}
        _, test = split_by_deployment(sorted(models), 0.25, seed=0, stratify=models)
        with open(md, "a") as fh:
            fh.write(comparison(runs, seconds, set(test)))
    print(f"experiments/accuracy.py: wall time {time.perf_counter() - t0:.1f} s, CPU time "
          f"{time.process_time():.1f} s ({os.cpu_count()} CPUs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
