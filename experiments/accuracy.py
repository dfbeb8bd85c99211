"""Accuracy of the bundled registry against the development set of measured vLLM latencies.

    python experiments/accuracy.py [--csv ../shared/measured/inferencex_vllm_dev.csv] [--rules anchor,interleaved,capped]
        [--cache-dir DIR]

Runs ``jaxprice accuracy`` on the CSV (default ``../shared/measured/inferencex_vllm_dev.csv``,
relative to the repository root: 1,155 mean-TPOT points, 222 sweeps, 45 deployments) once per
batch rule (``--rules``, default ``anchor,interleaved,capped``; see ``jaxprice/_src/accuracy.py``) and
writes

* experiments/results/accuracy.md — the table under the anchor kernel's rule (committed; the
  README's accuracy section is generated from it),
* experiments/results/accuracy_sweeps.png — measured against predicted TPOT, one panel per
  deployment,
* experiments/results/accuracy-<rule>.md and accuracy_sweeps-<rule>.png for every other rule;
  the first non-anchor rule's file ends with a table of all points under every rule run
  (NoOverlap and Overlap),
* experiments/out/accuracy_points.csv (anchor) and experiments/out/accuracy-<rule>/accuracy_points.csv
  — one row per point (git-ignored),

then prints the wall time (about 2 minutes on 2 CPU cores for the three rules). The run is compile-bound (one kernel per deployment plan and rule);
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

from jaxprice._src.accuracy import BATCH_RULES, ESTIMATE_LABELS, ESTIMATES, summarize  # noqa: E402
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


def comparison(runs) -> str:
    """Markdown: all points under each rule run, NoOverlap and Overlap (from the points CSVs)."""
    def num(x):
        return float(x) if x != "" else float("nan")
    lines = ["", "## All points under each batch rule", "",
             "The registry as bundled, every point of the CSV, each rule's own run of `jaxprice accuracy` "
             "(`anchor` is the anchor kernel's rule, experiments/results/accuracy.md; `interleaved` and `capped` "
             "are jaxprice's, designed after looking at these errors).", "",
             "| batch rule | estimate | points | priced | resident below C | shape mean | shape median | "
             "shape mean (non-anchor) | TPOT MAPE | TPOT signed |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for rule, recs in runs.items():
        below = sum(1 for r in recs if r["status"] == "priced" and int(r["resident"]) < int(r["concurrency"]))
        for e in ESTIMATES:
            s = summarize([num(r[f"{e}_shape_error"]) for r in recs], [r["anchor"] == "True" for r in recs],
                          [num(r[f"{e}_tpot_us"]) for r in recs], [num(r["measured_us"]) for r in recs])
            lines.append(f"| `{rule}` | {ESTIMATE_LABELS[e]} | {s['points']} | {s['priced']} | {below} | "
                         f"{s['shape_mean']:.1%} | {s['shape_median']:.1%} | {s['shape_mean_non_anchor']:.1%} | "
                         f"{s['tpot_mape']:.1%} | {s['tpot_mean_signed']:+.1%} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=DEFAULT_CSV,
                    help="measurement CSV (default ../shared/measured/inferencex_vllm_dev.csv, from the repo root)")
    ap.add_argument("--results", default=os.path.join("experiments", "results"),
                    help="where accuracy.md, accuracy-<rule>.md and the sweep plots go (default experiments/results)")
    ap.add_argument("--out", default=os.path.join("experiments", "out"), help="where accuracy_points.csv goes")
    ap.add_argument("--rules", default="anchor,interleaved,capped",
                    help=f"comma-separated batch rules to run ({', '.join(BATCH_RULES)}; default "
                         "anchor,interleaved,capped)")
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
    runs = {}
    for rule in rules:
        md, plot, out = paths(rule, args.results, args.out)
        cmd = ["accuracy", args.csv, "--out", out, "--plot", plot, "--markdown", md]
        if rule != "anchor":
            cmd += ["--batch-rule", rule]
        if args.cache_dir:
            cmd += ["--cache-dir", args.cache_dir]
        t = time.perf_counter()
        rc = jaxprice_main(cmd)
        print(f"experiments/accuracy.py: rule {rule}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
        if rc:
            return rc
        runs[rule] = read_points(out)
    others = [r for r in rules if r != "anchor"]
    if others and len(runs) > 1:
        md = paths(others[0], args.results, args.out)[0]
        with open(md, "a") as fh:
            fh.write(comparison(runs))
    print(f"experiments/accuracy.py: wall time {time.perf_counter() - t0:.1f} s, CPU time "
          f"{time.process_time():.1f} s ({os.cpu_count()} CPUs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
