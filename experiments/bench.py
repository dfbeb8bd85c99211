"""Benchmark: how fast jaxprice prices, and differentiates, padded batches on this machine.

    python experiments/bench.py [--quick] [--json experiments/out/bench.json]

For DeepSeek-V3 on 8 H200 (fp8, SGLang, tp8) and Llama-3.1-70B on 4 H200 (fp8, vLLM, tp4),
with batches padded to 256 rows, it prints side by side:

* exact-mode throughput of vmapped pricing (price_many) at 1, 64, 1024 and 16384 batches per
  call: batches priced per second and microseconds per batch, for batches with int32 token
  counts (the compact form for pricing many batches: 9 bytes a row with the mask, summed in
  integer arithmetic) and, for comparison, the same batches with float64 counts (17 bytes a
  row, the differentiable form); both price bit for bit the same;
* value_and_grad over the coefficients (of the summed NoOverlap, the shape of a fitting
  loss) at the same sizes, and its time as a ratio to the forward pass;
* a warm single-batch call's latency (price; int32 and float64 counts) beside JAX's own
  dispatch floor on this machine (a trivial jitted function of the same arguments), the plan-build time
  (load_deployment, cold) and the first call's compile time;
* the process's peak resident memory after the largest size;
* for scale, the memory roofline: the time to just read what the kernel reads per row
  (scheduled and computed counts as int32 and the mask, 9 bytes a row) in one vectorised
  pass summing them.

Each timing is the median of several rounds, each round long enough (about 0.2 s) to
average out timer and dispatch noise; inputs are on the device before timing starts and
every call is waited for (block_until_ready). Other processes share a CI machine, so the
load average is printed before and after, the spread of the rounds (slowest over fastest)
at the largest size, and the process's CPU time per batch there, which other processes do
not inflate (alone on the machine, wall time is about CPU time over XLA's two threads).
The goals in the last column are the project's benchmark goals for a 2-core CI machine,
not timed tests.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import jax                # noqa: E402
import jax.numpy as jnp   # noqa: E402
import numpy as np        # noqa: E402

import jaxprice as jp                                   # noqa: E402
from jaxprice._src.sweep import random_batches         # noqa: E402

DEPLOYMENTS = [("DeepSeek-V3 H200 tp8", "deepseek-v3-h200-fp8-sglang-tp8"),
               ("Llama-3.1-70B H200 tp4", "llama-3.1-70b-instruct-h200-fp8-vllm-tp4")]
SIZES = (1, 64, 1024, 16384)
ROWS = 256
GOALS = {"us_per_batch_16384": 0.5, "grad_ratio": 4.0, "warm_us": 50.0, "build_compile_s": 5.0, "rss_gib": 2.0}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def timed(fn, *, round_s=0.2, rounds=5, min_calls=3, best=False, spread=False):
    """Median seconds per call of fn() (which must block), over rounds of >= round_s each;
    with best, (median, fastest); with spread, (median, slowest / fastest, median CPU
    seconds per call of this process, all its threads: unlike the wall time, not inflated
    by other processes taking the CPUs)."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    calls = max(min_calls, int(round_s / once))
    per, cpu = [], []
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls)
        cpu.append((time.process_time() - c0) / calls)
    if spread:
        return statistics.median(per), max(per) / min(per), statistics.median(cpu)
    return (statistics.median(per), min(per)) if best else statistics.median(per)


def row_read_floor(batches, rounds):
    """Seconds per 256-row batch just to read what the kernel reads per row (scheduled and
    computed as int32, and the mask: 9 bytes) in one fused, vectorised pass summing them
    under the mask: the memory roofline of the int32 batches."""
    s, c, m = batches.scheduled, batches.computed, batches.mask
    zero = jnp.zeros((), jnp.int64)
    f = jax.jit(lambda s, c, m: jax.lax.reduce(
        (jnp.where(m, s.astype(jnp.int64), 0), jnp.where(m, c.astype(jnp.int64), 0)), (zero, zero),
        lambda a, b: (a[0] + b[0], a[1] + b[1]), (1,)))
    return timed(lambda: jax.block_until_ready(f(s, c, m)), rounds=rounds) / s.shape[0]


def peak_rss_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20   # KiB on Linux


def loadavg():
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def bench_deployment(label, name, sizes, rounds):
    out = {"label": label, "scenario": name}
    t0 = time.perf_counter()
    dep = jp.load_deployment(name)
    out["plan_build_s"] = time.perf_counter() - t0
    plan, coefs = dep.plan, dep.coefficients
    rng = np.random.default_rng(0)
    largest = random_batches(rng, max(sizes), ROWS, decode_threshold=8, empty=False, dtype=np.int32)
    largest64 = largest.astype(np.float64)       # the same counts, float64: the differentiable form
    one = jax.tree_util.tree_map(lambda x: x[3], largest)
    one64 = jax.tree_util.tree_map(lambda x: x[3], largest64)

    # first call: trace + compile + run of price() on one batch
    t0 = time.perf_counter()
    jax.block_until_ready(jp.price(plan, coefs, one))
    out["first_compile_s"] = time.perf_counter() - t0
    warm, warm_best = timed(lambda: jax.block_until_ready(jp.price(plan, coefs, one).no_overlap),
                            round_s=0.3, rounds=rounds, best=True)
    out["warm_us"], out["warm_best_us"] = warm * 1e6, warm_best * 1e6
    jax.block_until_ready(jp.price(plan, coefs, one64))
    warm64, warm64_best = timed(lambda: jax.block_until_ready(jp.price(plan, coefs, one64).no_overlap),
                                round_s=0.3, rounds=rounds, best=True)
    out["warm_f64_us"], out["warm_f64_best_us"] = warm64 * 1e6, warm64_best * 1e6
    # JAX's own floor for such a call: a trivial jitted function of the same arguments with
    # the same output structure (a StepResult of five arrays)
    trivial = jax.jit(lambda c, b: jp.StepResult(*(jnp.sum(b.scheduled) + jnp.sum(c.values),) * 5))
    jax.block_until_ready(trivial(coefs, one))
    floor, floor_best = timed(lambda: jax.block_until_ready(trivial(coefs, one).no_overlap),
                              round_s=0.3, rounds=rounds, best=True)
    out["dispatch_floor_us"], out["dispatch_floor_best_us"] = floor * 1e6, floor_best * 1e6
    # the two forms price bit for bit the same
    a, b = (jp.price_many(plan, coefs, jax.tree_util.tree_map(lambda v: v[:64], bs)) for bs in (largest, largest64))
    out["int32_equals_float64"] = bool(all(np.array_equal(np.asarray(x), np.asarray(y))
                                           for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))))

    loss = jax.jit(jax.value_and_grad(lambda c, b: jnp.sum(jp.price_many(plan, c, b).no_overlap)))
    out["sizes"] = {}
    for n in sizes:
        batches = jax.tree_util.tree_map(lambda x: jax.device_put(x[:n]), largest)
        batches64 = jax.tree_util.tree_map(lambda x: jax.device_put(x[:n]), largest64)
        jax.block_until_ready((batches, batches64))
        fwd, fwd_spread, fwd_cpu = timed(lambda: jax.block_until_ready(jp.price_many(plan, coefs, batches).no_overlap),
                                         rounds=rounds, spread=True)
        vg, vg_spread, _ = timed(lambda: jax.block_until_ready(loss(coefs, batches)), rounds=rounds, spread=True)
        fwd64 = timed(lambda: jax.block_until_ready(jp.price_many(plan, coefs, batches64).no_overlap), rounds=rounds)
        out["sizes"][n] = {"fwd_s": fwd, "vg_s": vg, "per_s": n / fwd, "us_per_batch": fwd / n * 1e6,
                           "vg_us_per_batch": vg / n * 1e6, "grad_ratio": vg / fwd,
                           "fwd_spread": fwd_spread, "vg_spread": vg_spread, "cpu_us_per_batch": fwd_cpu / n * 1e6,
                           "f64_us_per_batch": fwd64 / n * 1e6, "f64_per_s": n / fwd64}
        log(f"  {label}: {n:>6} batches/call  {fwd / n * 1e6:9.3f} us/batch (float64 {fwd64 / n * 1e6:.3f})"
            f"  grad x{vg / fwd:.2f}")
        del batches64
    out["rss_gib"] = peak_rss_gib()
    out["floor_us"] = row_read_floor(largest, rounds) * 1e6
    # the kernel's size, for profiling: jaxpr equations and XLA's cost estimate per batch
    jaxpr = jax.make_jaxpr(lambda c, b: jp.step_time(plan, c, b))(coefs, one)
    out["jaxpr_eqns"] = len(jaxpr.eqns)
    cost = jax.jit(lambda c, b: jp.step_time(plan, c, b).no_overlap).lower(coefs, one).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    out["xla_flops_per_batch"] = float(cost.get("flops", float("nan"))) if cost else float("nan")
    out["xla_bytes_per_batch"] = float(cost.get("bytes accessed", float("nan"))) if cost else float("nan")
    return out


def table(results, sizes):
    w = 24
    cols = [r["label"] for r in results]
    lines = []

    def row(name, vals, goal=""):
        lines.append(f"{name:<34}" + "".join(f"{v:>{w}}" for v in vals) + (f"   {goal}" if goal else ""))

    row("", cols, "goal (2-core CI)")
    row("exact price_many, int32 counts", [""] * len(cols))
    for n in sizes:
        row(f"  {n:>6} per call", [f"{r['sizes'][n]['per_s']:,.0f}/s {r['sizes'][n]['us_per_batch']:.3f}us" for r in results],
            f"<= {GOALS['us_per_batch_16384']} us/batch" if n == 16384 else "")
    row(f"  memory roofline at {max(sizes)}", [f"{r['floor_us']:.3f}us" for r in results], "(reading the rows once)")
    row(f"  CPU time at {max(sizes)} (all threads)", [f"{r['sizes'][max(sizes)]['cpu_us_per_batch']:.3f}us" for r in results],
        "(wall x threads when alone)")
    row("  same batches, float64 counts", [""] * len(cols))
    for n in sizes:
        row(f"  {n:>6} per call", [f"{r['sizes'][n]['f64_per_s']:,.0f}/s {r['sizes'][n]['f64_us_per_batch']:.3f}us"
                                   for r in results])
    row("  int32 == float64 bit for bit", ["yes" if r["int32_equals_float64"] else "NO" for r in results])
    row("value_and_grad (coefs) / forward", [""] * len(cols))
    for n in sizes:
        row(f"  {n:>6} per call", [f"x{r['sizes'][n]['grad_ratio']:.2f} {r['sizes'][n]['vg_us_per_batch']:.3f}us" for r in results],
            f"<= x{GOALS['grad_ratio']:.0f}")
    row("warm single price() call", [f"{r['warm_us']:.1f} us (best {r['warm_best_us']:.0f})" for r in results],
        f"<= {GOALS['warm_us']:.0f} us")
    row("  same, float64 counts", [f"{r['warm_f64_us']:.1f} us (best {r['warm_f64_best_us']:.0f})" for r in results])
    row("  JAX's floor: a trivial jit, same args", [f"{r['dispatch_floor_us']:.1f} us (best {r['dispatch_floor_best_us']:.0f})"
                                                 for r in results], "(no kernel work)")
    row("plan build (load_deployment)", [f"{r['plan_build_s'] * 1e3:.0f} ms" for r in results])
    row("first price() compile", [f"{r['first_compile_s']:.2f} s" for r in results])
    row("plan build + first compile", [f"{r['plan_build_s'] + r['first_compile_s']:.2f} s" for r in results],
        f"<= {GOALS['build_compile_s']:.0f} s")
    row(f"peak RSS after {max(sizes)}/call", [f"{r['rss_gib']:.2f} GiB" for r in results], f"< {GOALS['rss_gib']:.0f} GiB")
    row("kernel jaxpr eqns / XLA flops", [f"{r['jaxpr_eqns']} / {r['xla_flops_per_batch']:.0f}" for r in results])
    big = max(sizes)
    row(f"timing spread at {big} (slowest/fastest)",
        [f"fwd x{r['sizes'][big]['fwd_spread']:.2f} grad x{r['sizes'][big]['vg_spread']:.2f}" for r in results])
    return "\n".join(lines)


def verdicts(results, sizes):
    big = max(sizes)
    checks = []
    for r in results:
        s = r["sizes"][big]
        checks += [
            (f"{r['label']}: {big}/call us/batch", s["us_per_batch"], s["us_per_batch"] <= GOALS["us_per_batch_16384"]),
            (f"{r['label']}: value_and_grad ratio at {big}", s["grad_ratio"], s["grad_ratio"] <= GOALS["grad_ratio"]),
            (f"{r['label']}: warm call us", r["warm_us"], r["warm_us"] <= GOALS["warm_us"]),
            (f"{r['label']}: build + first compile s", r["plan_build_s"] + r["first_compile_s"],
             r["plan_build_s"] + r["first_compile_s"] <= GOALS["build_compile_s"]),
            (f"{r['label']}: peak RSS GiB", r["rss_gib"], r["rss_gib"] < GOALS["rss_gib"]),
        ]
    return checks


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="sizes 1, 64, 1024 only and fewer rounds")
    ap.add_argument("--json", help="also write the numbers here (e.g. experiments/out/bench.json)")
    args = ap.parse_args(argv)
    sizes = SIZES[:3] if args.quick else SIZES
    rounds = 3 if args.quick else 5
    print(f"jaxprice benchmark: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), "
          f"jax {jax.__version__}, {jax.devices()[0].platform} x{jax.device_count()}, rows per batch {ROWS}")
    load0 = loadavg()
    results = []
    for label, name in DEPLOYMENTS:
        log(f"benchmarking {label} ({name}) ...")
        results.append(bench_deployment(label, name, sizes, rounds))
    print(table(results, sizes))
    load1 = loadavg()
    print(f"load average (1 min): {load0[0]:.2f} before, {load1[0]:.2f} after, on {len(os.sched_getaffinity(0))} CPUs "
          f"(this run adds about 2 while it runs; more is other processes sharing the CPUs)")
    print()
    for what, value, ok in verdicts(results, sizes):
        print(f"  {'met ' if ok else 'MISS'}  {what}: {value:.3g}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"nproc": len(os.sched_getaffinity(0)), "loadavg": [load0, load1], "results": results},
                      f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
