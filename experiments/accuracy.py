"""Accuracy of the bundled registry against the development set of measured vLLM latencies.

    python experiments/accuracy.py [--csv ../shared/measured/inferencex_vllm_dev.csv] [--cache-dir DIR]

Runs ``jaxprice accuracy`` on the CSV (default ``../shared/measured/inferencex_vllm_dev.csv``,
relative to the repository root: 1,155 mean-TPOT points, 222 sweeps, 45 deployments) and writes

* experiments/results/accuracy.md — the table (committed; the README's accuracy section is
  generated from it),
* experiments/results/accuracy_sweeps.png — measured against predicted TPOT, one panel per
  deployment,
* experiments/out/accuracy_points.csv — one row per point (git-ignored),

then prints the wall time. The run is compile-bound (one kernel per deployment plan); with
``--cache-dir experiments/out/xla-cache`` a second run reuses the compiled kernels.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from jaxprice.cli import main as jaxprice_main  # noqa: E402

DEFAULT_CSV = os.path.join("..", "shared", "measured", "inferencex_vllm_dev.csv")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=DEFAULT_CSV,
                    help="measurement CSV (default ../shared/measured/inferencex_vllm_dev.csv, from the repo root)")
    ap.add_argument("--results", default=os.path.join("experiments", "results"),
                    help="where accuracy.md and accuracy_sweeps.png go (default experiments/results)")
    ap.add_argument("--out", default=os.path.join("experiments", "out"), help="where accuracy_points.csv goes")
    ap.add_argument("--cache-dir", default=None, help="JAX persistent compilation cache folder")
    args = ap.parse_args(argv)
    os.chdir(ROOT)                 # paths in the recorded command stay relative to the repository
    if not os.path.exists(args.csv):
        print(f"experiments/accuracy.py: {args.csv}: no such file (the development set lives in "
              "../shared/measured/ next to the repository; give --csv)", file=sys.stderr)
        return 2
    cmd = ["accuracy", args.csv, "--out", args.out,
           "--plot", os.path.join(args.results, "accuracy_sweeps.png"),
           "--markdown", os.path.join(args.results, "accuracy.md")]
    if args.cache_dir:
        cmd += ["--cache-dir", args.cache_dir]
    t0 = time.perf_counter()
    rc = jaxprice_main(cmd)
    print(f"experiments/accuracy.py: wall time {time.perf_counter() - t0:.1f} s, CPU time "
          f"{time.process_time():.1f} s ({os.cpu_count()} CPUs)", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
