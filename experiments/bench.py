"""Benchmark: how fast jaxprice prices, and differentiates, padded batches on this machine.

    python experiments/bench.py [--quick] [--json experiments/out/bench.json] [--axis | --size | --serve]

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

Then (``--axis``: only it, with the harness under the ``interleaved`` rule too and float64
counts too) the deployment axis of issue 10: ``jaxprice accuracy`` on the whole dev set (45
deployments), end to end in a fresh process, on the axis (one compile per plan structure)
beside the per-deployment path (one compile per deployment): compiles, wall time, the ratio
(goal >= 5x); and 64 deployments x 1,024 batches x 256 rows priced in ONE call
(``price_deployments``), warm, in microseconds per (deployment, batch) (goal <= 1 us), beside
one ``price_many`` call per deployment.

Last section (``--size``: only it): the size search of issue 14 (``bench_size``), DeepSeek-V3 on
8 H200 over its whole default candidate space x 8 concurrencies, cold and warm in a fresh
process: layouts searched and simulated, compiles, steps priced and simulated, wall time (the
whole search and its steady stage); then the command itself, twice, with a fresh compile cache.
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
    # the constant-folded kernel (price(fold=True): compiled per plan, not per structure)
    t0 = time.perf_counter()
    jax.block_until_ready(jp.price(plan, coefs, one, fold=True))
    out["fold_compile_s"] = time.perf_counter() - t0
    warmf, warmf_best = timed(lambda: jax.block_until_ready(jp.price(plan, coefs, one, fold=True).no_overlap),
                              round_s=0.3, rounds=rounds, best=True)
    out["warm_fold_us"], out["warm_fold_best_us"] = warmf * 1e6, warmf_best * 1e6
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
    row("  price(fold=True): constant-folded plan", [f"{r['warm_fold_us']:.1f} us (best {r['warm_fold_best_us']:.0f})"
                                                   for r in results], "(compiled per plan)")
    row("  JAX's floor: a trivial jit, same args", [f"{r['dispatch_floor_us']:.1f} us (best {r['dispatch_floor_best_us']:.0f})"
                                                 for r in results], "(no kernel work)")
    row("plan build (load_deployment)", [f"{r['plan_build_s'] * 1e3:.0f} ms" for r in results])
    row("first price() compile", [f"{r['first_compile_s']:.2f} s" for r in results])
    row("  price(fold=True) compile", [f"{r['fold_compile_s']:.2f} s" for r in results])
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


# ----------------------------------------------------------------------------- jaxprice size (issue 14)

SIZE_CASE = dict(model="deepseek-v3", chip="h200", gpus=8, isl=1024, osl=1024, ttft_ms=2000, tpot_ms=50,
                 max_num_seqs=(128, 256, 512, 1024))
SIZE_GOALS = {"cold_s": 30.0, "warm_s": 10.0, "layouts": 100, "concurrencies": 8}
SIZE_WORKER = """
import json, os, sys, time
t0 = time.perf_counter()
import jaxprice as jp
t1, c1 = time.perf_counter(), time.process_time()
kw = json.loads(sys.argv[1])
r = jp.size(kw.pop("model"), **kw)
t2, c2 = time.perf_counter(), time.process_time()
w = jp.size(r.model, **kw)
t3, c3 = time.perf_counter(), time.process_time()
front = [r.results[i] for i, _ in r.frontier]
print(json.dumps({"import_s": t1 - t0, "cold_s": t2 - t1, "warm_s": t3 - t2, "cold_cpu_s": c2 - c1,
                  "warm_cpu_s": c3 - c2, "load": os.getloadavg()[0], "info": r.info, "warm_info": w.info,
                  "best": r.point(r.best)["label"] if r.best else None,
                  "frontier_simulated": f"{sum(x.source != 'steady' for x in front)} of {len(front)} points"}))
"""


def bench_size():
    """The size search of issue 14: DeepSeek-V3 on 8 H200, ISL/OSL 1024, TTFT 2 s / TPOT 50 ms, the
    default candidate space (with four max_num_seqs values) x 8 concurrencies, the default
    evaluator ('auto': the closed-form steady state for every layout, then the serving simulation
    at 10 x C prompts for the frontier, the best and the layouts near the targets, batched), in a
    fresh process (cold: every kernel and scheduler shape compiled; warm: the same search again
    in that process). Prints the layouts searched and simulated, compiles, steps priced and
    simulated, and wall time of the whole search and of its two stages; the issue's goals
    (<= 30 s cold, <= 10 s warm) are checked against the whole search and, separately, the
    steady search stage."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", SIZE_WORKER, json.dumps(SIZE_CASE)], capture_output=True, text=True,
                         cwd=os.path.dirname(HERE))
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    r = json.loads(out.stdout.strip().splitlines()[-1])
    i, w = r["info"], r["warm_info"]
    print(f"jaxprice size {SIZE_CASE['model']} --chip {SIZE_CASE['chip']} --gpus {SIZE_CASE['gpus']} "
          f"(evaluator {i['evaluator']}): {i['layouts_considered']} layouts considered, {i['layouts_priced']} searched "
          f"({i['layouts_rejected']} rejected by memory), {i['layouts_evaluated']} distinct, "
          f"x {i['concurrency_levels']} concurrencies; {i.get('layouts_simulated', 0)} simulated at "
          f"{i.get('simulated_prompts', '10 x C')} prompts per point in {i.get('simulation_rounds', 0)} round(s)")
    for name, run, wall, cpu in (("cold", i, r["cold_s"], r["cold_cpu_s"]), ("warm", w, r["warm_s"], r["warm_cpu_s"])):
        print(f"  {name} {wall:.1f} s wall, {cpu:.1f} s CPU"
              + (f" (import {r['import_s']:.1f} s not counted)" if name == "cold" else "")
              + f": steady search {run.get('seconds_search', run['seconds']):.1f} s ({run.get('search_compiles', run['compiles'])} "
              f"kernel compiles, {run['steps_priced']} steps priced), simulation {run.get('seconds_simulate', 0.0):.1f} s "
              f"(schedule {run.get('seconds_schedule', 0.0):.1f} s, price {run.get('seconds_simulate_price', 0.0):.1f} s; "
              f"{run.get('scheduler_compiles', 0)} scheduler + {run.get('simulation_kernel_compiles', 0)} kernel compiles, "
              f"{run.get('steps_simulated', 0)} steps simulated over all dp ranks, {run.get('scheduler_iterations', 0)} "
              f"scheduler iterations); {run['compiles']} compiles in all")
    print(f"  best {r['best']}; frontier from the simulation: {r.get('frontier_simulated', '?')}")
    print(f"  load average at the end {r['load']:.2f} on {len(os.sched_getaffinity(0))} CPUs (other processes inflate "
          f"wall time; CPU time is this process's own)")
    checks = [("size search layouts searched (>= 100)", i["layouts_priced"], i["layouts_priced"] >= SIZE_GOALS["layouts"]),
              ("size search concurrency levels (>= 8)", i["concurrency_levels"],
               i["concurrency_levels"] >= SIZE_GOALS["concurrencies"]),
              ("size search cold, s (<= 30)", r["cold_s"], r["cold_s"] <= SIZE_GOALS["cold_s"]),
              ("size search warm, s (<= 10)", r["warm_s"], r["warm_s"] <= SIZE_GOALS["warm_s"]),
              ("  its steady stage cold, s (<= 30)", i.get("seconds_search", r["cold_s"]),
               i.get("seconds_search", r["cold_s"]) <= SIZE_GOALS["cold_s"]),
              ("  its steady stage warm, s (<= 10)", w.get("seconds_search", r["warm_s"]),
               w.get("seconds_search", r["warm_s"]) <= SIZE_GOALS["warm_s"])]
    for what, value, ok in checks:
        print(f"  {'met ' if ok else 'MISS'}  {what}: {value:.3g}")
    r["command"] = bench_size_command()
    return r


def bench_size_command():
    """The same search as the command a user types, twice, each a fresh process, with a fresh
    compile cache folder (jaxprice/_src/compile_cache.py): the first compiles and writes the
    kernels, the second loads them. Outside the goals above, which are the API's cold and warm."""
    import subprocess
    import tempfile
    argv = [sys.executable, "-m", "jaxprice", "size", SIZE_CASE["model"], "--chip", SIZE_CASE["chip"],
            "--gpus", str(SIZE_CASE["gpus"]), "--isl", str(SIZE_CASE["isl"]), "--osl", str(SIZE_CASE["osl"]),
            "--ttft-ms", str(SIZE_CASE["ttft_ms"]), "--tpot-ms", str(SIZE_CASE["tpot_ms"]),
            "--max-num-seqs", ",".join(map(str, SIZE_CASE["max_num_seqs"])), "--quiet"]
    walls = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, JAXPRICE_CACHE_DIR=cache)
        for _ in range(2):
            t0 = time.perf_counter()
            out = subprocess.run(argv, capture_output=True, text=True, cwd=os.path.dirname(HERE), env=env)
            walls.append(time.perf_counter() - t0)
            if out.returncode != 0:
                raise SystemExit(out.stderr[-3000:])
    print(f"  the command (`jaxprice size ...`, a fresh process each, import included): {walls[0]:.1f} s with "
          f"an empty compile cache, {walls[1]:.1f} s run again (the kernels loaded from the cache)")
    return {"first_s": walls[0], "again_s": walls[1]}

# ----------------------------------------------------------------------------- the deployment axis (issue 10)

AXIS_CSV = os.path.join(os.path.dirname(HERE), "..", "shared", "measured", "inferencex_vllm_dev.csv")
AXIS_GOALS = {"harness_ratio": 5.0, "us_per_pair": 1.0}
AXIS_DEPLOYMENTS, AXIS_BATCHES = 64, 1024
AXIS_WORKER = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import jaxprice as jp
from jaxprice._src.accuracy import evaluate_accuracy
t1, c1 = time.perf_counter(), time.process_time()
csv, rule, per = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
r = evaluate_accuracy(csv, batch_rule=rule, per_deployment=per)
t2, c2 = time.perf_counter(), time.process_time()
w = evaluate_accuracy(csv, batch_rule=rule, per_deployment=per)
t3 = time.perf_counter()
pred = [x["no_overlap_tpot_us"] for x in r.records]
print(json.dumps({"import_s": t1 - t0, "cold_s": t2 - t1, "cold_cpu_s": c2 - c1, "warm_s": t3 - t2,
                  "compiles": r.info["kernel_compiles"], "warm_compiles": w.info["kernel_compiles"],
                  "deployments": r.info["deployments"], "points": r.info["points"], "predicted_us": pred}))
"""


def _harness_run(rule, per_deployment, csv):
    """``evaluate_accuracy`` on the dev set in a fresh process (cold: every kernel compiled; then
    warm, the same call again in that process)."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", AXIS_WORKER, csv, rule, "1" if per_deployment else "0"],
                         capture_output=True, text=True, cwd=os.path.dirname(HERE))
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_axis_harness(rules=("anchor",), csv=AXIS_CSV):
    """The accuracy harness end to end on the dev set (read the CSV, resolve 45 deployments,
    build the batches, compile, price, score; import not counted), on the deployment axis (one
    compile per plan structure) beside the per-deployment path (``per_deployment=True``: one
    compile per deployment), each in a fresh process, in the same run."""
    out = {}
    if not os.path.exists(csv):
        print(f"  (skipped: no {csv})")
        return out
    for rule in rules:
        axis, per = _harness_run(rule, False, csv), _harness_run(rule, True, csv)
        a, b = np.asarray(axis.pop("predicted_us"), float), np.asarray(per.pop("predicted_us"), float)
        ok = np.isfinite(a) & np.isfinite(b)
        rel = float(np.max(np.abs(a[ok] / b[ok] - 1.0))) if ok.any() else float("nan")
        out[rule] = {"axis": axis, "per_deployment": per, "ratio": per["cold_s"] / axis["cold_s"],
                     "max_rel_diff": rel, "same_priced": bool(np.array_equal(np.isfinite(a), np.isfinite(b)))}
        print(f"jaxprice accuracy, dev set ({axis['deployments']} deployments, {axis['points']} points), "
              f"batch rule {rule}, end to end in a fresh process:")
        print(f"  {'':<22}{'compiles':>10}{'cold wall':>12}{'cold CPU':>11}{'warm rerun':>12}")
        for label, r in (("deployment axis", axis), ("per deployment", per)):
            print(f"  {label:<22}{r['compiles']:>10}{r['cold_s']:>10.2f} s{r['cold_cpu_s']:>9.2f} s"
                  f"{r['warm_s']:>10.2f} s")
        print(f"  ratio (per deployment / axis, cold wall): x{out[rule]['ratio']:.2f}; predictions agree to "
              f"{rel:.1e} (relative)")
    return out


def bench_axis_pricing(rounds=3, forms=("int32", "float64")):
    """64 deployments x 1,024 batches of 256 rows priced in ONE price_deployments call (warm: us
    per (deployment, batch)), beside the same pairs priced one deployment at a time
    (price_many, 64 calls), for the structures of DeepSeek-V3 and Llama-3.1-70B: the bundled
    deployments of each structure, cycled to 64."""
    from pathlib import Path
    from jaxprice._src import stack as ST
    names = sorted(p.stem for p in (Path(os.path.dirname(HERE)) / "testdata" / "aisimulate").glob("*.yaml"))
    deps = {n: jp.load_deployment(n) for n in names}
    groups = jp.group_by_structure([deps[n] for n in names])
    rng = np.random.default_rng(0)
    b32 = random_batches(rng, AXIS_BATCHES, ROWS, decode_threshold=8, empty=False, dtype=np.int32)
    b64 = b32.astype(np.float64)
    pairs = AXIS_DEPLOYMENTS * AXIS_BATCHES
    out = {}
    print(f"{AXIS_DEPLOYMENTS} deployments x {AXIS_BATCHES} batches x {ROWS} rows in one call (price_deployments, "
          f"exact), warm, beside one price_many call per deployment:")
    print(f"  {'':<40}{'distinct':>9}  | axis: {'compiles':>8}{'compile':>10}{'one call':>11}{'us/pair':>9}"
          f"  | per deployment: {'compiles':>8}{'us/pair':>9}  | ratio")
    for label, name in DEPLOYMENTS:
        idx = next(i for _, i in groups if names.index(name) in i)
        sel = [deps[names[idx[k % len(idx)]]] for k in range(AXIS_DEPLOYMENTS)]
        stack = jp.stack_plans(sel)
        coefs = ST.stack_coefficients([d.coefficients for d in sel])
        row = {"distinct_deployments": len(idx)}
        for form, b in ((f, {"int32": b32, "float64": b64}[f]) for f in forms):
            c0, t0 = jp.kernel_compiles(), time.perf_counter()
            res = jax.block_until_ready(jp.price_deployments(stack, coefs, b))
            cold = time.perf_counter() - t0
            compiles = jp.kernel_compiles() - c0
            one = timed(lambda: jax.block_until_ready(jp.price_deployments(stack, coefs, b).no_overlap), rounds=rounds)
            c1 = jp.kernel_compiles()
            alone = [jp.price_many(d.plan, d.coefficients, b) for d in sel]
            per_compiles = jp.kernel_compiles() - c1
            loop = timed(lambda: jax.block_until_ready([jp.price_many(d.plan, d.coefficients, b).no_overlap
                                                        for d in sel]), rounds=rounds, min_calls=1)
            ulps = max(int(np.max(np.abs(np.asarray(res.no_overlap)[k].view(np.int64)
                                         - np.asarray(a.no_overlap).view(np.int64)))) for k, a in enumerate(alone))
            row[form] = {"compiles": compiles, "cold_s": cold, "call_s": one, "us_per_pair": one / pairs * 1e6,
                         "per_deployment_us_per_pair": loop / pairs * 1e6, "per_deployment_compiles": per_compiles,
                         "ratio": loop / one, "max_ulps_vs_alone": ulps}
            print(f"  {label + ', ' + form + ' counts':<40}{len(idx):>9}  |       {compiles:>8}{cold:>8.2f} s"
                  f"{one * 1e3:>8.1f} ms{one / pairs * 1e6:>9.3f}  |                 {per_compiles:>8}"
                  f"{loop / pairs * 1e6:>9.3f}  | x{loop / one:.1f}")
        out[label] = row
    print(f"  (price_many compiles per structure too: its one compile is the per-deployment path's first call; "
          f"largest difference from pricing alone, NoOverlap: "
          f"{max(r[f]['max_ulps_vs_alone'] for r in out.values() for f in forms)} ulp)")
    return out


def bench_axis(rules=("anchor",), forms=("int32",)):
    """The deployment axis (issue 10): the harness's speed-up, and many deployments in one call
    (``forms``: the token counts' dtypes priced; --axis: int32 and float64)."""
    print(f"deployment axis (issue 10); load average {loadavg()[0]:.2f} on {len(os.sched_getaffinity(0))} CPUs")
    harness = bench_axis_harness(rules)
    pricing = bench_axis_pricing(forms=forms)
    checks = [(f"harness ({rule}) per-deployment / axis, x (>= {AXIS_GOALS['harness_ratio']:.0f})", h["ratio"],
               h["ratio"] >= AXIS_GOALS["harness_ratio"]) for rule, h in harness.items()]
    checks += [(f"{label}: {AXIS_DEPLOYMENTS} x {AXIS_BATCHES} in one call, us/pair int32 (<= 1)",
                r["int32"]["us_per_pair"], r["int32"]["us_per_pair"] <= AXIS_GOALS["us_per_pair"])
               for label, r in pricing.items()]
    for what, value, ok in checks:
        print(f"  {'met ' if ok else 'MISS'}  {what}: {value:.3g}")
    return {"harness": harness, "pricing": pricing}


SERVE_CONCURRENCY = (4, 8, 16, 32, 64, 128, 256)
SERVE_GOALS = {"sweep_warm_s": 1.0, "ratio": 50.0, "rss_gib": 2.0}


def bench_serve(python_steps=4000):
    """The serving simulation of issue 15: one InferenceX-style closed-loop sweep (DeepSeek-V3 on
    8 H200, C = 4..256, 10 x C prompts, isl = osl = 1024, range ratio 0.8) simulated and priced
    (jaxprice.simulate_sweep: every level's schedule in one vmapped scheduler call, every step in
    vmapped pricing calls), cold (compiles) and warm; beside it the same scheduler as a pure-Python
    loop calling price() once per step (schedule.reference_schedule; timed over its first
    ``python_steps`` steps per level and scaled to the sweep's steps: its per-step cost is flat)."""
    from jaxprice._src import schedule as S
    dep = jp.load_deployment("deepseek-v3-h200-fp8-sglang-tp8")
    w = jp.Workload(1024, 1024)
    t0 = time.perf_counter()
    res = jp.simulate_sweep(dep, w, SERVE_CONCURRENCY)
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(3):
        t0 = time.perf_counter()
        res = jp.simulate_sweep(dep, w, SERVE_CONCURRENCY)
        warm.append(time.perf_counter() - t0)
    warm_s = statistics.median(warm)
    steps = sum(r.summary["steps"] for r in res)
    iters = sum(r.summary["iterations"] for r in res)
    # the pure-Python loop: the reference scheduler, then price() per step (padded to the level's C)
    price = jax.jit(lambda b: jp.step_time(dep.plan, dep.coefficients, b).no_overlap)
    per_step = []
    for r, c in zip(res, SERVE_CONCURRENCY):
        st = r.schedule.settings
        ins, outs = r.requests["input_len"], r.requests["output_len"]
        pad = 1 << max(c - 1, 0).bit_length()
        price(jp.Batch.from_requests([1] * c, [1000] * c, pad_to=pad, decode_threshold=1)).block_until_ready()
        t0 = time.perf_counter()
        ref = _reference_prefix(S, ins, outs, c, st, python_steps)
        t_sched = time.perf_counter() - t0
        t0 = time.perf_counter()
        for rows in ref:
            b = jp.Batch.from_requests([x[1] for x in rows] or [0], [x[2] for x in rows] or [0], pad_to=pad,
                                       decode_threshold=st["decode_threshold"])
            price(b).block_until_ready()
        per_step.append((t_sched + time.perf_counter() - t0) / max(len(ref), 1))
    python_s = sum(ps * r.summary["steps"] for ps, r in zip(per_step, res))
    rss = peak_rss_gib()
    print(f"serving sweep (issue 15): {dep.name}, C = {','.join(map(str, SERVE_CONCURRENCY))}, 10 x C prompts, "
          f"isl = osl = 1024, range ratio 0.8")
    print(f"  steps simulated {steps} ({iters} scheduler records: decode runs are one record each)")
    print(f"  cold (compile + run) {cold:.2f} s; warm {warm_s:.3f} s (rounds {', '.join(f'{x:.3f}' for x in warm)}); "
          f"{steps / warm_s:,.0f} steps/s")
    print(f"  pure-Python scheduler + price() per step: {np.mean(per_step) * 1e6:.0f} us/step "
          f"(timed on the first {python_steps} steps of each level) -> {python_s:.1f} s for the sweep; "
          f"ratio {python_s / warm_s:.0f}x")
    print(f"  peak resident memory {rss:.2f} GiB; load average {loadavg()[0]:.2f}")
    checks = [("serving sweep warm, s (<= 1)", warm_s, warm_s <= SERVE_GOALS["sweep_warm_s"]),
              ("serving sweep vs pure-Python loop, x (>= 50)", python_s / warm_s, python_s / warm_s >= SERVE_GOALS["ratio"]),
              ("serving peak memory, GiB (<= 2)", rss, rss <= SERVE_GOALS["rss_gib"])]
    for what, value, ok in checks:
        print(f"  {'met ' if ok else 'MISS'}  {what}: {value:.3g}")
    return {"cold_s": cold, "warm_s": warm_s, "steps": steps, "python_s": python_s, "rss_gib": rss}


def _reference_prefix(S, ins, outs, c, st, max_steps):
    """The reference scheduler's first max_steps steps (it stops there)."""
    try:
        return S.reference_schedule(list(ins), list(outs), concurrency=c, max_num_seqs=st["max_num_seqs"],
                                    budget=st["max_num_batched_tokens"], block_size=st["block_size"],
                                    kv_blocks=st["kv_blocks"], max_model_len=st["max_model_len"],
                                    reserve_full_isl=st["reserve_full_isl"],
                                    async_scheduling=st["async_scheduling"], max_steps=max_steps,
                                    partial=True)["steps"]
    except RuntimeError:
        raise


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="sizes 1, 64, 1024 only and fewer rounds")
    ap.add_argument("--json", help="also write the numbers here (e.g. experiments/out/bench.json)")
    ap.add_argument("--size", action="store_true", help="only the size-search section (issue 14)")
    ap.add_argument("--serve", action="store_true", help="only the serving-simulation section (issue 15)")
    ap.add_argument("--axis", action="store_true",
                    help="only the deployment-axis section (issue 10), with the harness under rules anchor and "
                         "interleaved (the default run: anchor)")
    args = ap.parse_args(argv)
    if args.size:
        bench_size()
        return 0
    if args.serve:
        bench_serve()
        return 0
    if args.axis:
        axis = bench_axis(("anchor", "interleaved"), ("int32", "float64"))
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({"axis": axis}, f, indent=1, default=str)
        return 0
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
    print()
    axis = bench_axis()
    print()
    bench_size()
    print()
    bench_serve()
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"nproc": len(os.sched_getaffinity(0)), "loadavg": [load0, load1], "results": results,
                       "axis": axis}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
