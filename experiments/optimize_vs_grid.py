"""Experiment: the gradient batch-composition search against an exhaustive exact-mode grid.

    python experiments/optimize_vs_grid.py [--quick] [--out experiments/results/optimize_vs_grid.md]

For each deployment (MoE and dense; full, sliding-window, latent and linear attention) and
each problem (an ITL limit; a workload that charges prefill to output, prompt/output = 4, or
one that does not; a prefill budget of 2048 or 8192 tokens), it runs

* ``optimize_batch``: projected Adam through the smooth kernel (temperature 0.02, 16
  restarts x 200 steps), then rounding and a local search in exact mode;
* ``grid_search``: every composition (D in 0..255, every allowed P up to the budget) priced
  in exact mode, vmapped in chunks of 32768;

and prints side by side: the optimum found, the grid's best, the relative gap in output
tokens/s (goal <= 1%), the gap of the plain rounding of the continuous optimum (before the
exact local search), and the wall time of each. Times are warm (the median of three calls
after the first, which compiles); each deployment's first call, compile included, is
reported too. The table goes to stdout and, as markdown, to --out.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import jax  # noqa: E402

import jaxprice as jp  # noqa: E402
from jaxprice._src.progress import Progress  # noqa: E402

DEPLOYMENTS = [
    ("DeepSeek-V3, 8xH200 fp8 tp8 (MoE, MLA)", "deepseek-v3-h200-fp8-sglang-tp8"),
    ("Llama-3.1-70B, 4xH200 fp8 tp4 (dense)", "llama-3.1-70b-instruct-h200-fp8-vllm-tp4"),
    ("gpt-oss-120b, 2xH200 fp4 tp2 (MoE, sliding window)", "gpt-oss-120b-h200-fp4-vllm-tp2"),
    ("Qwen3.5-397B-A17B, 4xB200 fp8 tp4 (MoE, linear-attention hybrid)", "qwen3.5-397b-a17b-b200-fp8-sglang-tp4"),
]
# (ITL ms, prompt/output, prefill budget)
PROBLEMS = [(20, 0.0, 2048), (50, 0.0, 2048), (20, 4.0, 2048), (30, 4.0, 2048), (50, 4.0, 2048),
            (80, 4.0, 2048), (50, 4.0, 8192)]
QUICK = [(30, 0.0, 2048), (50, 4.0, 2048)]
REPEATS = 3


def timed(fn, repeats):
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two problems per deployment, one timing each")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "optimize_vs_grid.md"))
    args = ap.parse_args(argv)
    problems = QUICK if args.quick else PROBLEMS
    repeats = 1 if args.quick else REPEATS
    load0 = os.getloadavg()
    rows, cold = [], []
    with Progress(len(DEPLOYMENTS) * len(problems), "optimize vs grid") as bar:
        for label, name in DEPLOYMENTS:
            dep = jp.load_deployment(name)
            first = True
            for itl_ms, r, budget in problems:
                kw = dict(itl=itl_ms / 1e3, prefill_budget=budget, prefill_per_output=r, context=4096)
                try:
                    t0 = time.perf_counter()
                    res = jp.optimize_batch(dep, **kw)
                    search_cold = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    grid = jp.grid_search(dep, **kw)
                    grid_cold = time.perf_counter() - t0
                except jp.JaxpriceError as err:
                    rows.append(dict(label=label, itl=itl_ms, r=r, budget=budget, refused=str(err)))
                    bar.update()
                    continue
                if first:
                    cold.append((label, search_cold, grid_cold))
                    first = False
                res, search_s = timed(lambda: jp.optimize_batch(dep, **kw), repeats)
                grid, grid_s = timed(lambda: jp.grid_search(dep, **kw), repeats)
                gap = 1.0 - res.best.tokens_per_s / grid.best.tokens_per_s
                rgap = 1.0 - res.rounded.tokens_per_s / grid.best.tokens_per_s if res.rounded.feasible else float("nan")
                rows.append(dict(label=label, itl=itl_ms, r=r, budget=budget, best=res.best, grid=grid.best,
                                 gap=gap, rgap=rgap, search_s=search_s, grid_s=grid_s, points=grid.points,
                                 cont=res.continuous, exact=res.exact_evaluations, finite=res.gradients_finite))
                bar.update(gap=gap * 100, ratio=grid_s / search_s)
    load1 = os.getloadavg()
    text = report(rows, cold, load0, load1, args.quick)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(f"\nwritten to {args.out}", file=sys.stderr)
    ok = [r for r in rows if "gap" in r]
    return 0 if ok and all(r["gap"] <= 0.01 for r in ok) else 1


def comp(c):
    return f"{c.decode} + {c.prefill}" if c.prefill else f"{c.decode} + 0"


def report(rows, cold, load0, load1, quick) -> str:
    ok = [r for r in rows if "gap" in r]
    out = ["# Batch-composition search: gradient vs exhaustive exact-mode grid", ""]
    out.append("Generated by `python experiments/optimize_vs_grid.py" + (" --quick" if quick else "") + "` on "
               f"{platform.machine()} with {os.cpu_count()} CPU cores, JAX {jax.__version__} on "
               f"{jax.default_backend()}; load average {load0[0]:.1f} at the start and {load1[0]:.1f} at the end "
               "(other jobs shared the machine, so wall times are noisy; the ratios are of medians of "
               f"{1 if quick else REPEATS} warm calls).")
    out.append("")
    out.append("Problem (jaxprice/_src/search.py): D decodes (0..255, one token each at context 4096) and one "
               "prefill chunk of P tokens (0, or 2..budget, prefix 0) per step; maximise output tokens/s = "
               "Y / NoOverlap with NoOverlap <= ITL, where Y = D when prefill is not charged (r = 0) and "
               "Y = min(D, P / r) for a workload with prompt/output r (here 4: 1024-token prompts, "
               "256-token outputs). max_num_batched_tokens = D + P is reported, not searched: it enters "
               "no price. Search: 16 restarts x 200 projected Adam steps through the smooth kernel "
               "(temperature 0.02; D relaxed as a mixture of floor(D) and floor(D) + 1 decodes), then "
               "rounding and a local search in exact mode. Grid: every (D, P), exact mode, 32768 per "
               "vmapped call.")
    out.append("")
    out.append("| deployment | ITL ms | r | budget | search D + P | tokens/s | grid D + P | tokens/s | gap | "
               "rounded gap | grid points | search s | grid s | grid / search |")
    out.append("|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "refused" in r:
            out.append(f"| {r['label']} | {r['itl']} | {r['r']:g} | {r['budget']} | refused: {r['refused']} "
                       "| | | | | | | | | |")
            continue
        out.append(f"| {r['label']} | {r['itl']} | {r['r']:g} | {r['budget']} | {comp(r['best'])} | "
                   f"{r['best'].tokens_per_s:.1f} | {comp(r['grid'])} | {r['grid'].tokens_per_s:.1f} | "
                   f"{r['gap'] * 100:.3f}% | {r['rgap'] * 100:.3f}% | {r['points']:,} | {r['search_s']:.3f} | "
                   f"{r['grid_s']:.3f} | {r['grid_s'] / r['search_s']:.1f}x |")
    out.append("")
    if ok:
        ratios = [r["grid_s"] / r["search_s"] for r in ok]
        big = [r["grid_s"] / r["search_s"] for r in ok if r["budget"] > 2048]
        small = [r["grid_s"] / r["search_s"] for r in ok if r["budget"] <= 2048]
        out.append(f"Largest gap to the grid's best: {max(r['gap'] for r in ok) * 100:.3f}% over {len(ok)} problems "
                   f"(goal <= 1%); {sum(r['gap'] == 0 for r in ok)} found the grid's exact optimum. Largest gap "
                   f"of the plain rounding of the continuous optimum, before the exact local search: "
                   f"{max(r['rgap'] for r in ok) * 100:.3f}%. Every search's last gradients were finite: "
                   f"{all(r['finite'] for r in ok)}.")
        out.append("")
        line = f"Warm, the search is {statistics.median(ratios):.1f}x faster than the grid (median; " \
               f"{min(ratios):.1f}x to {max(ratios):.1f}x)"
        if small:
            line += f"; {statistics.median(small):.1f}x at a 2048-token budget (524,288 compositions)"
        if big:
            line += f", {statistics.median(big):.1f}x at 8192 (2,097,152): the grid grows with D_max x budget, " \
                    "the search does not"
        out.append(line + ".")
        out.append("")
    if cold:
        out.append("First call of each deployment (compiling included): " + "; ".join(
            f"{lab.split(',')[0]}: search {s:.1f} s, grid {g:.1f} s" for lab, s, g in cold) +
            ". The search compiles the smooth kernel's forward-mode derivative inside a scan; the grid "
            "compiles the exact kernel only. For a single question in a fresh process the grid is faster at "
            "these sizes; the search wins once compiled (a service, a sweep of limits, or JAX's persistent "
            "compilation cache).")
        out.append("")
    out.append("The grid's one pass prices every composition regardless of the limits, so one grid can answer "
               "many ITL limits at once; the comparison here is one question at a time.")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
