"""GPU microbenchmark: measure GEMM times and the HBM copy bandwidth on the GPU in hand, fit
them with the step kernel's own GEMM and HBM laws (``jaxprice.fit_law``), and set the fitted
values beside the registry's values for the chip, in a log, a JSON file and a markdown report.

    python3 experiments/gpu_microbench.py --quick --chip h200 \\
        --json $OUT/gpu_microbench.json --markdown $OUT/gpu_microbench.md 2>&1 | tee $OUT/gpu_microbench.log
    python3 experiments/gpu_microbench.py --cpu-dry-run --quick   # no GPU: the whole path on synthetic timings

How long (estimates from counting launches, not yet readings): with PyTorch on an H200,
``--quick`` (2 weight shapes x 15 token counts x 2 dtypes = 60 GEMM sizes, 4 copy sizes) takes
about 1 minute in all: start-up 15-30 s, measuring 10-40 s (each size: a warm-up, one graph
capture, 7 timed repetitions of >= 2 ms), the three fits 5-10 s on the CPU. The full set
(3 shapes x 21 token counts) adds about half a minute. ``--budget-s`` (default 150 s) stops
measuring when it is spent; the script then fits and reports what it has, marking the report
PARTIAL, so a slow run still writes its files. The JAX backend compiles one chain per size
and took 178 s for an earlier, smaller ``--quick`` set (one reading, H200): with it, expect the
budget to cut the run short.

Backends (``--backend``; ``auto`` takes PyTorch when it sees a CUDA GPU, else JAX):

* ``torch`` (the trustworthy one). GEMM: ``F.linear(x, w)`` in bf16 and ``torch._scaled_mm``
  in fp8 (e4m3 operands, per-tensor float32 scales of 1, bf16 out; the weight (n, k) is
  row-major and passed as ``w.t()``, i.e. column-major, as cuBLASLt's fp8 kernels require).
  Inputs are random normal (never constant: zeros run faster). Each timed launch sequence runs
  at least 32 GEMMs rotating through a pool of distinct weights of >= 256 MiB (over 4x the
  60 MB L2), so weights stream from HBM as in a forward pass. The sequence is captured in a
  CUDA graph and replayed (no launch gaps; eager launches with a note if capture fails); it
  is warmed up, then timed with CUDA events over >= 2 ms per repetition; the time per GEMM is
  the median of ``--reps`` repetitions, with their spread. One output per shape is checked
  against a float32 product of the same (dequantized) inputs. Copy: ``y.copy_(x)`` of bf16
  buffers of 64 MiB .. 4 GiB, rotating among pairs totalling >= 1 GiB, bytes counted as read
  plus write, timed the same way (eager: each copy is far longer than a launch).
* ``jax``: the earlier method: host ``perf_counter`` around a jitted chain of 64 GEMMs, and
  a copy as ``x * -1`` under optimisation barriers. Its copy read 3.06 TB/s on an H200 where
  ``copy_`` reads ~4.3 TB/s, so its hbm_derate is a floor, not a measurement.

Fits, each the kernel's own law (jaxprice/_src/step.py prices a dense GEMM's arithmetic on the
SM and its weights on HBM, and a layer's stage costs the max of the two):

* per dtype, ``t(m, n, k) = max(2 m n k / (peak * eps_max * m / (m + m_half)),
  n k bytes / (hbm_tbs * 1e12 * derate))`` over every measured (m, n, k): ``gemm_eps_max_<dtype>``,
  ``gemm_m_half_<dtype>`` and the derate that weight streaming reaches (``gemm_weight_derate_<dtype>``,
  the same coefficient as the registry's ``hbm_derate``, which the kernel uses for weight reads);
* ``t(B) = c + 2 B / (hbm_tbs * 1e12 * hbm_derate)`` on the copies: ``hbm_derate`` and the
  constant ``c`` (``hbm_constant_latency``, which the step kernel does not use).

Without a GPU the script refuses (exit 2) unless ``--cpu-dry-run`` is given, which synthesises
timings from known parameters (with 2% noise) and runs the same fitting and report path.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

# JAX must not grab most of the GPU's memory when it shares the card with PyTorch
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jaxprice as jp  # noqa: E402
from jaxprice._src import laws  # noqa: E402
from jaxprice._src.progress import Progress  # noqa: E402

M_VALUES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
M_QUICK = (1, 4, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096)
SHAPES = ((4096, 4096), (8192, 8192), (14336, 4096))      # (n, k) of the weight
COPY_MIB = (64, 256, 1024, 4096)
DTYPES = ("bf16", "fp8")
ELEMENT_BYTES = {"bf16": 2, "fp8": 1}
POOL_BYTES = 256 * 2 ** 20        # weights rotated per shape: > 4x the H200's 60 MB L2
COPY_POOL_BYTES = 2 ** 30         # copy sources rotated per size
MIN_GEMMS = 32                    # GEMMs per timed launch sequence
MIN_REP_SECONDS = 2e-3            # each timed repetition runs at least this long
CHAIN = 64                        # JAX backend: GEMMs per jitted chain
CHIP_NAMES = ("gb300", "gb200", "b300", "b200", "h200", "h100", "a100", "l40s")
# synthetic truth for --cpu-dry-run (deliberately not the registry's values; chosen so that
# both regimes of the GEMM law appear in the --quick sizes)
DRY_TRUTH = {"bf16": {"eps_max": 0.90, "m_half": 150.0, "derate": 0.82},
             "fp8": {"eps_max": 0.75, "m_half": 60.0, "derate": 0.78},
             "hbm_derate": 0.86, "hbm_constant_latency": 4e-6}
# earlier readings on this card type, to judge a run by (device/KINDS.md of this workplace)
EARLIER = {"h200": {"copy_tbs": 4.3, "note": "PyTorch device-to-device copy, read + write, "
                                            "one-GPU H200 machines of this workplace, 2026-10-28 and 2026-11-04"}}
TOL_CONFIRMED, TOL_ROUGH, M_HALF_FACTOR = 0.05, 0.15, 1.5


class NoGPU(RuntimeError):
    pass


# ----------------------------------------------------------------------------- backends


def _jax_backend():
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        return None
    return {"name": "jax", "device": gpus[0], "kind": gpus[0].device_kind}


def _torch_backend():
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return {"name": "torch", "device": 0, "kind": torch.cuda.get_device_name(0)}


def find_backend(which="auto"):
    """The backend to measure with: ``auto`` prefers PyTorch (CUDA events, graph replay)."""
    if which == "torch":
        b = _torch_backend()
        if b is None:
            raise NoGPU("PyTorch is not installed or sees no CUDA GPU (torch.cuda.is_available() is False); "
                        "pass --backend auto or jax, or --cpu-dry-run")
        return b
    if which == "jax":
        b = _jax_backend()
        if b is None:
            raise NoGPU("no NVIDIA GPU visible to JAX (jax.devices('gpu') is empty); pass --backend auto or "
                        "torch, or --cpu-dry-run")
        return b
    b = _torch_backend() or _jax_backend()
    if b is None:
        raise NoGPU("no NVIDIA GPU visible to PyTorch (torch.cuda.is_available() is False) or JAX "
                    "(jax.devices('gpu') is empty); run on a GPU machine, or pass --cpu-dry-run "
                    "to exercise the fitting path on synthetic timings")
    return b


def _nvidia_smi():
    """One line of the card's state (name, driver, clocks, temperature, power), or None."""
    query = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,power.limit"
    for q in (query, "name,driver_version"):        # the short query if a field is unknown here
        try:
            r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        if r.returncode == 0 and r.stdout.strip():
            vals = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]
            return dict(zip(q.split(","), vals))
    return None


def environment(backend):
    env = {"python": platform.python_version()}
    env["jax"] = jax.__version__
    if backend["name"] == "torch":
        import torch
        props = torch.cuda.get_device_properties(0)
        env.update(torch=torch.__version__, cuda=torch.version.cuda, sm_count=props.multi_processor_count,
                   capability=f"{props.major}.{props.minor}", memory_gib=round(props.total_memory / 2 ** 30, 1))
        l2 = getattr(props, "L2_cache_size", None)
        if l2:
            env["l2_mb"] = round(l2 / 1e6, 1)
    return env


# ----------------------------------------------------------------------------- measuring: PyTorch


def _spread(times):
    med = statistics.median(times)
    return (max(times) - min(times)) / med if med > 0 else 0.0


def _event_times(torch, fn, reps, min_seconds=MIN_REP_SECONDS):
    """Seconds per call of fn, one per repetition, from CUDA events; fn is warmed up first and
    called often enough per repetition to run >= min_seconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = start.elapsed_time(end) / 1e3
    inner = max(1, min(200, math.ceil(min_seconds / max(once, 1e-7))))
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / inner)
    return times


def _graph_or_eager(torch, seq):
    """(callable, how, keep): a CUDA graph replaying seq, or seq itself if capture fails."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):          # warm up off the capture stream, as PyTorch advises
        for _ in range(2):
            seq()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            seq()
        graph.replay()
        torch.cuda.synchronize()
        return graph.replay, "cuda-graph", graph
    except Exception as err:               # noqa: BLE001 - any capture failure: fall back, say so
        try:
            torch.cuda.synchronize()
        except Exception:                  # noqa: BLE001
            pass
        return seq, f"eager ({type(err).__name__}: {str(err).splitlines()[0][:80]})", None


def _rel_error(torch, y, x, w):
    ref = x.float() @ w.float().t()
    err = float((y.float() - ref).norm() / ref.norm())
    return err, bool(torch.isfinite(y).all())


def measure_gemm_torch(backend, dtype, n, k, m_values, opts, deadline, progress):
    import torch
    import torch.nn.functional as F
    dev = "cuda"
    count = max(2, math.ceil(POOL_BYTES / (n * k * ELEMENT_BYTES[dtype])))
    calls = count * math.ceil(MIN_GEMMS / count)
    if time.perf_counter() > deadline:
        return [], [(m, "time budget spent") for m in m_values], None, {"weights": 0, "gemms_per_launch_sequence": 0}
    gen = torch.Generator(device=dev)
    gen.manual_seed(1000 + 7 * n + k + (1 if dtype == "fp8" else 0))
    ws = []
    for _ in range(count):                 # random normal weights, stored (n, k) row-major
        w = torch.randn((n, k), device=dev, dtype=torch.bfloat16, generator=gen)
        ws.append(w if dtype == "bf16" else w.to(torch.float8_e4m3fn))
    one = torch.ones((), device=dev, dtype=torch.float32)     # per-tensor scales (float32 scalars)

    def gemm(x, w):
        if dtype == "bf16":
            return F.linear(x, w)                               # x @ w.t(), as nn.Linear
        r = torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                             use_fast_accum=opts.fp8_fast_accum)
        return r[0] if isinstance(r, tuple) else r

    check_m = min(m_values, key=lambda v: abs(math.log(v / 256.0)))
    points, skipped, check = [], [], None
    for m in m_values:
        if time.perf_counter() > deadline:
            skipped.append((m, "time budget spent"))
            continue
        x = torch.randn((m, k), device=dev, dtype=torch.bfloat16, generator=gen)
        if dtype == "fp8":
            x = x.to(torch.float8_e4m3fn)
        try:
            y = gemm(x, ws[0])
            torch.cuda.synchronize()
        except RuntimeError as err:
            skipped.append((m, str(err).splitlines()[0][:120]))
            print(f"  skipped {dtype} m={m} n={n} k={k}: {skipped[-1][1]}", file=sys.stderr)
            continue
        if m == check_m:
            err, finite = _rel_error(torch, y, x, ws[0])
            check = {"m": m, "rel_error": err, "finite": finite, "ok": finite and err < 1e-2}
        del y

        def seq(x=x):
            y = None
            for i in range(calls):
                y = gemm(x, ws[i % count])
            return y
        fn, how, keep = _graph_or_eager(torch, seq)
        times = [t / calls for t in _event_times(torch, fn, opts.reps)]
        points.append({"dtype": dtype, "n": n, "k": k, "m": m, "t": statistics.median(times),
                       "spread": _spread(times), "timing": how})
        del keep, fn
        progress.update(dtype=dtype, n=n, m=m)
    del ws
    torch.cuda.empty_cache()
    return points, skipped, check, {"weights": count, "gemms_per_launch_sequence": calls}


def measure_copy_torch(backend, mib_values, opts, deadline):
    import torch
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    rows, skipped, checks = [], [], []
    for mib in mib_values:
        if time.perf_counter() > deadline:
            skipped.append((mib, "time budget spent"))
            continue
        nbytes = mib * 2 ** 20
        pairs = max(1, math.ceil(COPY_POOL_BYTES / nbytes))
        xs = [torch.empty((nbytes // 2,), device="cuda", dtype=torch.bfloat16) for _ in range(pairs)]
        for x in xs:
            for part in x.split(2 ** 28):           # random normal, filled in chunks of 2^28 elements
                part.normal_(generator=gen)
        ys = [torch.empty_like(x) for x in xs]
        inner = pairs * max(1, math.ceil(8 / pairs))

        def fn():
            for j in range(inner):
                ys[j % pairs].copy_(xs[j % pairs])
        times = [t / inner for t in _event_times(torch, fn, opts.reps)]
        ok = bool(torch.equal(ys[0], xs[0]))
        checks.append({"mib": mib, "ok": ok})
        rows.append({"mib": mib, "t": statistics.median(times), "spread": _spread(times),
                     "timing": f"eager, {inner} copies per repetition over {pairs} buffer pair(s)"})
        del xs, ys, fn
        torch.cuda.empty_cache()
    return rows, skipped, checks


# ----------------------------------------------------------------------------- measuring: JAX


def _host_times(fn, reps):
    fn()                                   # warm up (compile)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def _weights_count(n, k, nbytes):
    """An even number (the chain alternates (n, k) and (k, n)) of weights of >= 256 MiB in all."""
    count = max(2, math.ceil(POOL_BYTES / (n * k * nbytes)))
    return count + count % 2


def measure_gemm_jax(backend, dtype, n, k, m_values, opts, deadline, progress):
    import jax.numpy as jnp
    dev = backend["device"]
    wdtype = jnp.bfloat16 if dtype == "bf16" else jnp.float8_e4m3fn
    count = _weights_count(n, k, ELEMENT_BYTES[dtype])
    key = jax.random.PRNGKey(0)
    ws = []     # alternate (n, k) and (k, n) weights so that each GEMM's output feeds the next
    for i in range(count):
        shape = (n, k) if i % 2 == 0 else (k, n)
        w = jax.random.normal(jax.random.fold_in(key, i), shape, jnp.float32) / math.sqrt(shape[1])
        ws.append(jax.device_put(w.astype(wdtype), dev))
    ws = tuple(ws)
    dims = (((1,), (1,)), ((), ()))

    @jax.jit
    def chain(x, ws):
        for j in range(CHAIN):
            w = ws[j % len(ws)]
            xin = x if dtype == "bf16" else x.astype(jnp.float8_e4m3fn)
            x = jax.lax.dot_general(xin, w, dims, preferred_element_type=jnp.bfloat16)
        return x

    points, skipped = [], []
    for m in m_values:
        if time.perf_counter() > deadline:
            skipped.append((m, "time budget spent"))
            continue
        x = jax.device_put(jax.random.normal(jax.random.fold_in(key, 10_000 + m), (m, k), jnp.bfloat16), dev)
        times = [t / CHAIN for t in _host_times(lambda: chain(x, ws).block_until_ready(), opts.reps)]
        points.append({"dtype": dtype, "n": n, "k": k, "m": m, "t": statistics.median(times),
                       "spread": _spread(times), "timing": f"host clock around a jitted chain of {CHAIN}"})
        progress.update(dtype=dtype, n=n, m=m)
    return points, skipped, None, {"weights": count, "gemms_per_launch_sequence": CHAIN}


def measure_copy_jax(backend, mib_values, opts, deadline):
    import jax.numpy as jnp
    dev = backend["device"]
    reps = 8

    @jax.jit
    def copies(x):
        for _ in range(reps):
            # a copy XLA cannot elide (x * 1 in bf16 would be): negate, read + write every byte
            x = jax.lax.optimization_barrier(x * jnp.asarray(-1.0, x.dtype))
        return x

    rows, skipped = [], []
    for mib in mib_values:
        if time.perf_counter() > deadline:
            skipped.append((mib, "time budget spent"))
            continue
        x = jax.device_put(jax.random.normal(jax.random.PRNGKey(mib), (mib * 2 ** 20 // 2,), jnp.bfloat16), dev)
        times = [t / reps for t in _host_times(lambda: copies(x).block_until_ready(), opts.reps)]
        rows.append({"mib": mib, "t": statistics.median(times), "spread": _spread(times),
                     "timing": f"host clock around a jitted chain of {reps} negations"})
    return rows, skipped, []


def measure(backend, shapes, m_values, mib_values, opts):
    """Copy first (the HBM ceiling), then per shape both dtypes over m_values (so that a run cut
    short by --budget-s still has both dtypes on the first shapes)."""
    torch_path = backend["name"] == "torch"
    fn_gemm = measure_gemm_torch if torch_path else measure_gemm_jax
    fn_copy = measure_copy_torch if torch_path else measure_copy_jax
    deadline = time.perf_counter() + opts.budget_s
    copy, copy_skipped, copy_checks = fn_copy(backend, mib_values, opts, deadline)
    points, skipped, checks, pools = [], [], [], {}
    with Progress(len(DTYPES) * len(shapes) * len(m_values), "gemm", enabled=not opts.quiet) as bar:
        for n, k in shapes:
            for dtype in DTYPES:
                t0 = time.perf_counter()
                pts, skp, chk, pool = fn_gemm(backend, dtype, n, k, m_values, opts, deadline, bar)
                points += pts
                skipped += [{"dtype": dtype, "n": n, "k": k, "m": m, "why": why} for m, why in skp]
                if chk:
                    checks.append({"dtype": dtype, "n": n, "k": k, **chk})
                pools[f"{dtype} {n}x{k}"] = pool
                if not opts.quiet:
                    print(f"  {dtype} n={n} k={k}: {len(pts)} sizes in {time.perf_counter() - t0:.1f} s",
                          file=sys.stderr)
    skipped += [{"copy_mib": mib, "why": why} for mib, why in copy_skipped]
    return {"points": points, "copy": copy, "skipped": skipped, "checks": checks, "copy_checks": copy_checks,
            "pools": pools}


# ----------------------------------------------------------------------------- synthetic timings


def synthesize(chip, shapes, m_values, mib_values, *, truth=DRY_TRUTH, noise=0.02, seed=0):
    """Timings the kernel's GEMM law and the copy law give at ``truth``, times lognormal noise."""
    rng = np.random.default_rng(seed)
    points = []
    for dtype in DTYPES:
        p = truth[dtype]
        for n, k in shapes:
            m = np.asarray(m_values, dtype=float)
            t = gemm_law_numpy(chip, dtype, m, n, k, p["eps_max"], p["m_half"], p["derate"], {})
            t = t * np.exp(noise * rng.standard_normal(len(m)))
            points += [{"dtype": dtype, "n": n, "k": k, "m": int(mi), "t": float(ti), "spread": 0.0,
                        "timing": "synthetic"} for mi, ti in zip(m_values, t)]
    b = np.asarray(mib_values, dtype=float) * 2 ** 20
    t = truth["hbm_constant_latency"] + np.asarray(
        laws.read_time(2 * b, laws.achieved_bandwidth(chip.hbm_tbs, truth["hbm_derate"])))
    t = t * np.exp(noise * rng.standard_normal(len(b)))
    copy = [{"mib": mib, "t": float(ti), "spread": 0.0, "timing": "synthetic"} for mib, ti in zip(mib_values, t)]
    return {"points": points, "copy": copy, "skipped": [], "checks": [], "copy_checks": [], "pools": {}}


# ----------------------------------------------------------------------------- the kernel's laws


def peak_flops(chip, dtype):
    tf = chip.bf16_tflops if dtype == "bf16" else chip.fp8_tflops
    if not tf:
        raise SystemExit(f"gpu_microbench: error: the registry's chip {chip.name} states no {dtype} peak")
    return tf * 1e12


def _terms(m, n, k, peak, hbm_tbs, nbytes, eps_max, m_half, derate, n_half, k_half):
    """(arithmetic, weight reads) seconds of one GEMM as step.py prices them: flops over
    peak x ramp(m) x shape factors on the SM; n k weight bytes over hbm_tbs x derate on HBM."""
    eff = laws.ramp(m, eps_max, m_half) * laws.shape_factor(n, n_half) * laws.shape_factor(k, k_half)
    compute = laws.gemm_time(2.0 * m * n * k, peak, eff)
    memory = laws.read_time(n * k * nbytes, laws.achieved_bandwidth(hbm_tbs, derate))
    return compute, memory


_terms_jit = jax.jit(_terms)          # one compile per array length, not one per eager op


def _gemm_terms(chip, dtype, m, n, k, eps_max, m_half, derate, shape_halves, fn=_terms):
    return fn(m, n, k, peak_flops(chip, dtype), chip.hbm_tbs, float(ELEMENT_BYTES[dtype]), eps_max, m_half, derate,
              float(shape_halves.get("n_half", 0.0)), float(shape_halves.get("k_half", 0.0)))


def gemm_law_numpy(chip, dtype, m, n, k, eps_max, m_half, derate, shape_halves):
    m = np.asarray(m, float)
    c, w = _gemm_terms(chip, dtype, m, np.broadcast_to(np.asarray(n, float), m.shape),
                       np.broadcast_to(np.asarray(k, float), m.shape), float(eps_max), float(m_half), float(derate),
                       shape_halves, fn=_terms_jit)
    return np.maximum(np.asarray(c), np.asarray(w))


def _rms_log(pred, meas):
    r = np.log(np.asarray(pred)) - np.log(np.asarray(meas))
    return float(np.sqrt(np.mean(r ** 2))) if len(r) else float("nan")


def fit_gemm(chip, dtype, points, start, shape_halves):
    """Fit eps_max, m_half and the weight-stream derate of one dtype to its points, with the
    kernel's law max(arithmetic, weight reads) and jaxprice.fit_law."""
    import jax.numpy as jnp
    m, n, k, t = (np.array([p[c] for p in points], dtype=float) for c in ("m", "n", "k", "t"))
    inputs = {"m": jnp.asarray(m), "n": jnp.asarray(n), "k": jnp.asarray(k)}

    def law(p, x):
        c, w = _gemm_terms(chip, dtype, x["m"], x["n"], x["k"], p["eps_max"], p["m_half"], p["derate"],
                           shape_halves)
        return jnp.maximum(c, w)
    init = {"eps_max": min(start["eps_max"], 0.99), "m_half": min(max(start["m_half"], 2.0), 5e3),
            "derate": min(start["derate"], 0.99)}
    return jp.fit_law(law, init, inputs, t, steps=3000, learning_rate=0.05,
                      bounds={"eps_max": (0.05, 1.0), "m_half": (1.0, 1e4), "derate": (0.05, 1.0)})


def fit_copy(chip, rows, start_derate=0.8, start_latency=3e-6):
    import jax.numpy as jnp
    b = np.array([r["mib"] for r in rows], dtype=float) * 2 ** 20
    t = np.array([r["t"] for r in rows], dtype=float)

    def law(p, x):
        return p["hbm_constant_latency"] + laws.read_time(2 * x, laws.achieved_bandwidth(chip.hbm_tbs,
                                                                                      p["hbm_derate"]))
    return jp.fit_law(law, {"hbm_derate": min(start_derate, 0.99), "hbm_constant_latency": start_latency},
                      jnp.asarray(b), t, bounds={"hbm_derate": (0.05, 1.0), "hbm_constant_latency": (1e-8, 1e-3)},
                      steps=3000, learning_rate=0.05)


def registry_values(chip_name):
    """The registry's primitives for the chip (registry units), {name: value}."""
    out = {}
    for e in jp.Registry().coefficient_set("cost-model-primitives").entries:
        if chip_name in [str(h).lower() for h in e.scope.get("hardware", ())]:
            out[e.name] = e.value
    return out


def chip_from_kind(kind):
    k = kind.lower().replace(" ", "").replace("-", "")
    for name in CHIP_NAMES:
        if name in k:
            return name
    return None


# ----------------------------------------------------------------------------- judging


def _judge(fit, reg, *, factor=None):
    """('confirmed' | 'roughly confirmed' | 'not confirmed' | 'no registry value', ratio)."""
    if reg is None or not reg:
        return "no registry value", None
    ratio = fit / reg
    if factor is not None:
        return ("consistent" if 1 / factor <= ratio <= factor else "not confirmed"), ratio
    if abs(ratio - 1) <= TOL_CONFIRMED:
        return "confirmed", ratio
    if abs(ratio - 1) <= TOL_ROUGH:
        return "roughly confirmed", ratio
    return "not confirmed", ratio


def analyse(chip, chip_name, reg, data, dry):
    """The fits, per-point predictions and statements, as one JSON-able dict."""
    cpu = jax.devices("cpu")[0]
    out = {"fits": {}, "rows": [], "per_point": [], "statements": []}
    fits = {}
    with jax.default_device(cpu):
        for dtype in DTYPES:
            pts = [p for p in data["points"] if p["dtype"] == dtype]
            if len(pts) < 4:
                continue
            halves = {h: reg[f"gemm_{h}_{dtype}"] for h in ("n_half", "k_half") if f"gemm_{h}_{dtype}" in reg}
            start = {"eps_max": reg.get(f"gemm_eps_max_{dtype}", 0.8), "m_half": reg.get(f"gemm_m_half_{dtype}", 100.0),
                     "derate": reg.get("hbm_derate", 0.8)}
            f = fit_gemm(chip, dtype, pts, start, halves)
            fits[dtype] = (f, halves, pts)
        if len(data["copy"]) >= 2:
            fits["copy"] = fit_copy(chip, data["copy"], reg.get("hbm_derate", 0.8),
                                    reg.get("hbm_constant_latency", 3.0) * 1e-6)

    reg_derate = reg.get("hbm_derate")
    for dtype in DTYPES:
        if dtype not in fits:
            out["statements"].append(f"{dtype}: too few GEMM points measured to fit.")
            continue
        f, halves, pts = fits[dtype]
        p = f.params
        m, n, k, t = (np.array([q[c] for q in pts], dtype=float) for c in ("m", "n", "k", "t"))
        comp, mem = (np.asarray(v) for v in _gemm_terms(chip, dtype, m, n, k, p["eps_max"], p["m_half"],
                                                          p["derate"], halves, fn=_terms_jit))
        pred = np.maximum(comp, mem)
        reg_ok = all(reg.get(x) for x in (f"gemm_eps_max_{dtype}", f"gemm_m_half_{dtype}", "hbm_derate"))
        reg_pred = gemm_law_numpy(chip, dtype, m, n, k, reg.get(f"gemm_eps_max_{dtype}"),
                                  reg.get(f"gemm_m_half_{dtype}"), reg_derate, halves) if reg_ok else None
        n_comp, n_mem = int(np.sum(comp >= mem)), int(np.sum(mem > comp))
        per_shape, shape_stats = {}, {}
        for shape in sorted({(int(a), int(b)) for a, b in zip(n, k)}):
            sel = (n == shape[0]) & (k == shape[1])
            name = f"{shape[0]}x{shape[1]}"
            per_shape[name] = _rms_log(pred[sel], t[sel])
            small = sel & (m == m[sel].min())
            shape_stats[name] = {"best_tflops": float(np.max(2 * m[sel] * n[sel] * k[sel] / t[sel]) / 1e12),
                                 "smallest_m": int(m[sel].min()),
                                 "weight_tbs_at_smallest_m": float(np.max(n[small] * k[small] * ELEMENT_BYTES[dtype]
                                                                          / t[small]) / 1e12)}
        for i, q in enumerate(pts):
            out["per_point"].append({**q, "tflops": 2 * q["m"] * q["n"] * q["k"] / q["t"] / 1e12,
                                     "weight_tbs": q["n"] * q["k"] * ELEMENT_BYTES[dtype] / q["t"] / 1e12,
                                     "fit_t": float(pred[i]), "bound": "SM" if comp[i] >= mem[i] else "HBM",
                                     "registry_t": float(reg_pred[i]) if reg_pred is not None else None})
        out["fits"][dtype] = {"params": p, "rms_log_error": f.rms_log_error(), "stopped": f.stopped,
                              "at_bound": f.at_bound, "compute_bound_points": n_comp, "hbm_bound_points": n_mem,
                              "rms_log_error_per_shape": per_shape, "per_shape": shape_stats,
                              "registry_rms_log_error": _rms_log(reg_pred, t) if reg_pred is not None else None,
                              "shape_halves": halves}
        out["rows"] += [
            {"name": f"gemm_eps_max_{dtype}", "fit": p["eps_max"], "registry": reg.get(f"gemm_eps_max_{dtype}"),
             "unit": "", "judge": _judge(p["eps_max"], reg.get(f"gemm_eps_max_{dtype}"))},
            {"name": f"gemm_m_half_{dtype}", "fit": p["m_half"], "registry": reg.get(f"gemm_m_half_{dtype}"),
             "unit": "tokens", "judge": _judge(p["m_half"], reg.get(f"gemm_m_half_{dtype}"), factor=M_HALF_FACTOR)},
            {"name": f"gemm_weight_derate_{dtype}", "fit": p["derate"], "registry": reg_derate,
             "unit": "(registry: hbm_derate)", "judge": _judge(p["derate"], reg_derate)}]
    if "copy" in fits:
        fc = fits["copy"]
        out["fits"]["copy"] = {"params": fc.params, "rms_log_error": fc.rms_log_error(), "stopped": fc.stopped,
                               "at_bound": fc.at_bound}
        out["rows"] += [
            {"name": "hbm_derate", "fit": fc.params["hbm_derate"], "registry": reg_derate, "unit": "(copy)",
             "judge": _judge(fc.params["hbm_derate"], reg_derate)},
            {"name": "hbm_constant_latency", "fit": fc.params["hbm_constant_latency"] * 1e6,
             "registry": reg.get("hbm_constant_latency"), "unit": "us (not used by the step kernel)",
             "judge": ("not judged", (fc.params["hbm_constant_latency"] * 1e6 / reg["hbm_constant_latency"])
                       if reg.get("hbm_constant_latency") else None)}]
    out["statements"] = _statements(chip, chip_name, reg, data, out, dry) + out["statements"]
    return out


def _statements(chip, chip_name, reg, data, res, dry):
    s = []
    if dry:
        s.append("SYNTHETIC DATA (--cpu-dry-run): no GPU was used. These statements exercise the report "
                 "and say nothing about the registry.")
    rows = {r["name"]: r for r in res["rows"]}
    copy = sorted(data["copy"], key=lambda r: r["mib"])
    if copy:
        big = copy[-1]
        tbs = 2 * big["mib"] * 2 ** 20 / big["t"] / 1e12
        line = (f"Copy ceiling: {tbs:.2f} TB/s read + write at {big['mib']} MiB, "
                f"{tbs / chip.hbm_tbs:.3f} of the datasheet's {chip.hbm_tbs} TB/s.")
        ref = EARLIER.get(chip_name)
        if ref and not dry:
            ratio = tbs / ref["copy_tbs"]
            line += (f" Earlier readings on this card type: ~{ref['copy_tbs']} TB/s ({ref['note']}); this run is "
                     f"{ratio:.2f}x that" + (", so the method is suspect and its hbm_derate is a floor."
                                             if ratio < 0.9 else ", so the copy method agrees with them."
                                             if ratio <= 1.1 else ", above them: check the timing."))
        if tbs > chip.hbm_tbs:
            line += " FASTER THAN THE DATASHEET ALLOWS: the timing is wrong; do not use these numbers."
        s.append(line)
    fast = [p for p in res["per_point"] if p["weight_tbs"] > chip.hbm_tbs
            or p["tflops"] > peak_flops(chip, p["dtype"]) / 1e12]
    if fast:
        s.append(f"{len(fast)} GEMM point(s) ran faster than the datasheet allows (weights served from L2, or "
                 f"a timing error), e.g. {fast[0]['dtype']} {fast[0]['n']}x{fast[0]['k']} m={fast[0]['m']}: "
                 "do not use the GEMM fits.")
    if "hbm_derate" in rows:
        r = rows["hbm_derate"]
        verdict, ratio = r["judge"]
        s.append(f"hbm_derate (copy): the registry's {chip_name} value {r['registry']} is {verdict} "
                 f"(measured {r['fit']:.3f}, ratio {ratio:.3f}; confirmed means within "
                 f"{TOL_CONFIRMED:.0%}, roughly within {TOL_ROUGH:.0%}).")
    for dtype in DTYPES:
        f = res["fits"].get(dtype)
        if not f:
            continue
        p = f["params"]
        lines = []
        if f["compute_bound_points"] >= 3:
            for name in (f"gemm_eps_max_{dtype}", f"gemm_m_half_{dtype}"):
                r = rows[name]
                verdict, ratio = r["judge"]
                lines.append(f"{name} {r['registry']} is {verdict} (fit {r['fit']:.4g}, ratio "
                             f"{ratio:.3f})" if ratio is not None else f"{name}: {verdict}")
        else:
            lines.append(f"eps_max and m_half are not identified (only {f['compute_bound_points']} points "
                         "bound by arithmetic)")
        if f["hbm_bound_points"] >= 2:
            r = rows[f"gemm_weight_derate_{dtype}"]
            verdict, ratio = r["judge"]
            lines.append(f"weight streaming reaches derate {p['derate']:.3f} "
                         f"({p['derate'] * chip.hbm_tbs:.2f} TB/s), so the registry's hbm_derate "
                         f"{r['registry']} is {verdict} for weight reads (ratio {ratio:.3f})")
        else:
            lines.append(f"the weight-streaming derate is not identified (only {f['hbm_bound_points']} points "
                         "bound by weight reads)")
        if f["at_bound"]:
            lines.append(f"the fit stopped at a bound: {f['at_bound']}")
        worst = max(f["rms_log_error_per_shape"].items(), key=lambda kv: kv[1])
        if len(f["rms_log_error_per_shape"]) > 1 and worst[1] > 0.1:
            best = ", ".join(f"{k} {v['best_tflops']:.0f}" for k, v in f["per_shape"].items())
            lines.append(f"one (eps_max, m_half) does not fit every shape (rms log error {worst[1]:.2f} on {worst[0]}; "
                         f"best TFLOP/s per shape: {best})" + ("" if f["shape_halves"] else
                                                              f"; the registry has no gemm_n_half_{dtype}/"
                                                              f"gemm_k_half_{dtype} for {chip_name} (the kernel's "
                                                              "shape factors, which would carry this)"))
        reg_rms = f["registry_rms_log_error"]
        fit_txt = (f"the kernel's law misses these timings by {_pct(f['rms_log_error'])} rms with the fitted "
                   f"values" + (f" and by {_pct(reg_rms)} with the registry's" if reg_rms is not None else ""))
        s.append(f"{dtype} GEMM: " + "; ".join(lines) + "; " + fit_txt + ".")
    derates = [(d, res["fits"][d]["params"]["derate"]) for d in DTYPES
               if d in res["fits"] and res["fits"][d]["hbm_bound_points"] >= 2]
    if derates and "hbm_derate" in rows:
        s.append("The kernel prices weight and elementwise reads (and KV reads where no attention decode rate "
                 "is given) at hbm_tbs x hbm_derate, one value: weight streaming by small-m GEMMs reached "
                 + ", ".join(f"{v:.3f} ({d})" for d, v in derates)
                 + f", large copies {rows['hbm_derate']['fit']:.3f}; for weight-bound steps (small batches) the "
                 "GEMM value is the one that matters.")
    checks = data.get("checks") or []
    bad = [c for c in checks if not c["ok"]]
    if checks:
        s.append("Correctness: " + ("every checked GEMM output matches a float32 product of the same inputs "
                                    f"(largest relative error {max(c['rel_error'] for c in checks):.1e})."
                                    if not bad else f"FAILED for {len(bad)} of {len(checks)} checks: "
                                    + ", ".join(f"{c['dtype']} {c['n']}x{c['k']} m={c['m']} err "
                                                f"{c['rel_error']:.2e} finite {c['finite']}" for c in bad)
                                    + "; timings of these shapes are not trustworthy."))
    if any(not c["ok"] for c in data.get("copy_checks") or []):
        s.append("Copy check FAILED: a copied buffer differs from its source.")
    eager = {p["timing"] for p in data["points"] if p["timing"].startswith("eager")}
    if eager:
        s.append("Some GEMM sequences could not be captured in a CUDA graph and ran eagerly "
                 f"({sorted(eager)[0]}); their small-m times may include launch gaps.")
    if data["skipped"]:
        s.append(f"PARTIAL: {len(data['skipped'])} measurement(s) skipped (see the JSON's 'skipped').")
    return s


def _pct(x):
    return f"{100 * (math.exp(x) - 1):.1f}%" if x is not None and math.isfinite(x) else "-"


# ----------------------------------------------------------------------------- reporting


def _fmt(v, spec=".4g"):
    return "-" if v is None else format(v, spec)


def print_report(result, dry):
    print("\nGEMM time per call (us), median:")
    by = {}
    for p in result["measured"]["points"]:
        by.setdefault((p["dtype"], p["n"], p["k"]), []).append(p)
    for (dtype, n, k), pts in by.items():
        cells = " ".join(f"{p['m']}:{p['t'] * 1e6:.1f}" for p in pts)
        print(f"  {dtype:<5} n={n:<6} k={k:<6} {cells}")
    print("copy (read + write) time (us): " + " ".join(f"{r['mib']} MiB:{r['t'] * 1e6:.0f}"
                                                        for r in result["measured"]["copy"]))
    chip = result["chip"]
    print(f"\n{'coefficient':<26}{'measured (fit)':>16}{'registry ' + chip:>16}{'ratio':>8}  verdict"
          + (f"{'synthetic truth':>19}" if dry else ""))
    for r in result["analysis"]["rows"]:
        verdict, ratio = r["judge"]
        truth = result["truth"].get(r["name"]) if dry else None
        print(f"{r['name']:<26}{r['fit']:>16.4g}{_fmt(r['registry']):>16}{_fmt(ratio, '.3f'):>8}  "
              f"{verdict:<18}" + (f"{_fmt(truth):>19}" if dry else "") + (f"  {r['unit']}" if r["unit"] else ""))
    for key, f in result["analysis"]["fits"].items():
        print(f"fit {key}: rms log error {f['rms_log_error']:.3f}; {f['stopped']}"
              + (f"; at bound: {f['at_bound']}" if f["at_bound"] else ""))
    print()
    for line in result["analysis"]["statements"]:
        print("* " + line)


def write_markdown(path, result):
    """A report generated entirely from ``result`` (what was measured and fitted)."""
    dry, an, meas = result["dry_run"], result["analysis"], result["measured"]
    env = result["environment"]
    smi = result.get("nvidia_smi_before") or {}
    smi_after = result.get("nvidia_smi_after") or {}
    L = [f"# GPU microbenchmark: {result['device']} vs the registry's `{result['chip']}`", ""]
    if dry:
        L += ["> **Synthetic (--cpu-dry-run): no GPU was used; every number below is made up from known "
              "parameters to test the script.**", ""]
    L += [f"Generated by `experiments/gpu_microbench.py` on {result['date']} "
          f"(`{' '.join(result['argv'])}`), measuring {result['measure_seconds']:.0f} s, "
          f"fitting {result['fit_seconds']:.0f} s.", "",
          "## Device and method", "",
          f"- device: {result['device']}; driver {smi.get('driver_version', 'unknown')}"
          + "".join(f"; {k} {v}" for k, v in env.items()),
          f"- card state (nvidia-smi) before: " + (", ".join(f"{k} {v}" for k, v in smi.items()) or "not read"),
          f"- after: " + (", ".join(f"{k} {v}" for k, v in smi_after.items()) or "not read"),
          f"- backend: {result['backend']}. {result['method']}",
          f"- weight pools: " + (", ".join(f"{k}: {v['weights']} weights, {v['gemms_per_launch_sequence']} GEMMs "
                                           "per launch sequence" for k, v in meas["pools"].items()) or "-"),
          f"- registry chip `{result['chip']}`: bf16 {result['peaks']['bf16_tflops']} TFLOP/s, "
          f"fp8 {result['peaks']['fp8_tflops']} TFLOP/s, HBM {result['peaks']['hbm_tbs']} TB/s (datasheet).", "",
          "## What this means for the registry", ""]
    L += [f"- {line}" for line in an["statements"]]
    L += ["", "## Fitted values beside the registry's", "",
          "The GEMM law is the step kernel's: `t = max(2mnk / (peak * eps_max * m/(m+m_half)), "
          "n*k*bytes / (hbm_tbs * derate))` (arithmetic on the SM, weight reads on HBM; a layer's stage "
          "costs the max), fitted per dtype over every measured (m, n, k). `hbm_derate` is fitted on the "
          "copies as `t = c + 2B / (hbm_tbs * hbm_derate)`.", "",
          "| coefficient | fitted | registry | ratio | verdict |" + (" synthetic truth |" if dry else ""),
          "| --- | ---: | ---: | ---: | --- |" + (" ---: |" if dry else "")]
    for r in an["rows"]:
        verdict, ratio = r["judge"]
        truth = result["truth"].get(r["name"]) if dry else None
        L.append(f"| `{r['name']}` {r['unit']} | {r['fit']:.4g} | {_fmt(r['registry'])} | {_fmt(ratio, '.3f')} | "
                 f"{verdict} |" + (f" {_fmt(truth)} |" if dry else ""))
    L += ["", "| fit | rms log error (fitted) | rms log error (registry values) | points bound by SM / HBM | "
          "per shape: rms log error, best TFLOP/s, weights TB/s at the smallest m | stopped |",
          "| --- | ---: | ---: | --- | --- | --- |"]
    for key, f in an["fits"].items():
        per = "; ".join(f"{s}: {v:.3f}, {f['per_shape'][s]['best_tflops']:.0f}, "
                        f"{f['per_shape'][s]['weight_tbs_at_smallest_m']:.2f}"
                        for s, v in f.get("rms_log_error_per_shape", {}).items()) or "-"
        bound = f"{f['compute_bound_points']} / {f['hbm_bound_points']}" if "compute_bound_points" in f else "-"
        L.append(f"| {key} | {f['rms_log_error']:.3f} | {_fmt(f.get('registry_rms_log_error'), '.3f')} | {bound} | "
                 f"{per} | {f['stopped']}" + (f"; at bound {f['at_bound']}" if f["at_bound"] else "") + " |")
    L += ["", "## GEMMs", "",
          "Median time per GEMM; spread is (max - min) / median over the repetitions; `fit` and `registry` are "
          "the kernel's law at the fitted and at the registry's values; `bound` is the term that binds "
          "in the fitted law.", "",
          "| dtype | n x k | m | us | spread | TFLOP/s | weights TB/s | bound | fit us | meas/fit | registry us | "
          "meas/registry |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for p in an["per_point"]:
        rt = p["registry_t"]
        L.append(f"| {p['dtype']} | {p['n']}x{p['k']} | {p['m']} | {p['t'] * 1e6:.2f} | {p['spread']:.1%} | "
                 f"{p['tflops']:.1f} | {p['weight_tbs']:.2f} | {p['bound']} | {p['fit_t'] * 1e6:.2f} | "
                 f"{p['t'] / p['fit_t']:.3f} | {_fmt(rt * 1e6 if rt else None, '.2f')} | "
                 f"{_fmt(p['t'] / rt if rt else None, '.3f')} |")
    L += ["", "## Copies", "", "| MiB | us | TB/s (read + write) | of datasheet | spread |",
          "| ---: | ---: | ---: | ---: | ---: |"]
    for r in meas["copy"]:
        tbs = 2 * r["mib"] * 2 ** 20 / r["t"] / 1e12
        L.append(f"| {r['mib']} | {r['t'] * 1e6:.1f} | {tbs:.3f} | {tbs / result['peaks']['hbm_tbs']:.3f} | "
                 f"{r['spread']:.1%} |")
    if meas["checks"]:
        L += ["", "## Correctness checks", "", "| dtype | n x k | m | relative error vs float32 | finite | ok |",
              "| --- | --- | ---: | ---: | --- | --- |"]
        L += [f"| {c['dtype']} | {c['n']}x{c['k']} | {c['m']} | {c['rel_error']:.2e} | {c['finite']} | {c['ok']} |"
              for c in meas["checks"]]
    if meas["skipped"]:
        groups = {}
        for sk in meas["skipped"]:
            what = (f"copy {sk['copy_mib']} MiB" if "copy_mib" in sk else f"{sk['dtype']} {sk['n']}x{sk['k']}")
            groups.setdefault((what, sk["why"]), []).append(str(sk.get("m", "")))
        L += ["", "## Skipped", ""] + [f"- {what}" + (f" m = {', '.join(ms)}" if any(ms) else "") + f": {why}"
                                        for (what, why), ms in groups.items()]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("\n".join(L) + "\n")


METHODS = {
    "torch": ("CUDA events around CUDA-graph replays of >= 32 GEMMs rotating through a >= 256 MiB weight pool "
              "(random normal inputs; bf16 via F.linear, fp8 e4m3 via torch._scaled_mm with per-tensor float32 "
              "scales and bf16 output{accum}); warm-up, then the median of {reps} repetitions of >= 2 ms. "
              "Copies: y.copy_(x) of bf16 buffers rotating over >= 1 GiB, bytes counted read + write."),
    "jax": ("host perf_counter around a jitted chain of 64 GEMMs through a >= 256 MiB weight pool (random "
            "inputs), median of {reps}; copies as x * -1 under optimisation barriers (this method read "
            "~3.06 TB/s where PyTorch's copy_ reads ~4.3 TB/s on an H200: its hbm_derate is a floor)."),
    "synthetic": "synthetic timings from the kernel's laws at known parameters, times 2% lognormal noise.",
}


def run(args):
    dry = args.cpu_dry_run
    shapes = SHAPES[:2] if args.quick else SHAPES
    m_values = M_QUICK if args.quick else M_VALUES
    mib_values = COPY_MIB
    if dry:
        backend = {"name": "synthetic", "kind": "none (--cpu-dry-run)"}
        chip_name = args.chip or "h200"
    else:
        backend = find_backend(args.backend)
        if backend["name"] == "torch":
            try:                          # keep JAX (the fits) off the GPU that PyTorch measures
                jax.config.update("jax_platforms", "cpu")
            except Exception:             # noqa: BLE001 - already initialised: fits use default_device(cpu)
                pass
        chip_name = args.chip or chip_from_kind(backend["kind"])
        if chip_name is None:
            raise SystemExit(f"gpu_microbench: error: cannot tell the registry chip from the device name "
                             f"{backend['kind']!r}; pass --chip")
    chip = jp.Registry().chip(chip_name)
    reg = registry_values(chip_name)
    print(f"device: {backend['kind']} via {backend['name']}; registry chip {chip_name} "
          f"(bf16 {chip.bf16_tflops} TFLOP/s, fp8 {chip.fp8_tflops} TFLOP/s, HBM {chip.hbm_tbs} TB/s)")
    smi_before = None if dry else _nvidia_smi()
    t0 = time.perf_counter()
    if dry:
        data = synthesize(chip, shapes, m_values, mib_values, seed=args.seed)
    else:
        data = measure(backend, shapes, m_values, mib_values, args)
    t_measure = time.perf_counter() - t0
    smi_after = None if dry else _nvidia_smi()

    t0 = time.perf_counter()
    analysis = analyse(chip, chip_name, reg, data, dry)
    t_fit = time.perf_counter() - t0

    truth = {}
    for d in DTYPES:
        truth.update({f"gemm_eps_max_{d}": DRY_TRUTH[d]["eps_max"], f"gemm_m_half_{d}": DRY_TRUTH[d]["m_half"],
                      f"gemm_weight_derate_{d}": DRY_TRUTH[d]["derate"]})
    truth.update(hbm_derate=DRY_TRUTH["hbm_derate"], hbm_constant_latency=DRY_TRUTH["hbm_constant_latency"] * 1e6)
    method = METHODS[backend["name"]].format(reps=args.reps, accum=", fast accumulation" if args.fp8_fast_accum
                                             else ", exact (not fast) accumulation")
    gemm = {}
    for p in data["points"]:
        gemm.setdefault(p["dtype"], {}).setdefault(f"{p['n']}x{p['k']}", {})[str(p["m"])] = p["t"]
    result = {"device": backend["kind"], "backend": backend["name"], "chip": chip_name, "dry_run": dry,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "argv": ["experiments/gpu_microbench.py"] + list(args.argv),
              "method": method, "environment": {} if dry else environment(backend),
              "nvidia_smi_before": smi_before, "nvidia_smi_after": smi_after,
              "peaks": {"bf16_tflops": chip.bf16_tflops, "fp8_tflops": chip.fp8_tflops, "hbm_tbs": chip.hbm_tbs},
              "measure_seconds": t_measure, "fit_seconds": t_fit,
              "measured": data, "analysis": analysis,
              "gemm": gemm, "copy_seconds": {str(r["mib"]): r["t"] for r in data["copy"]},
              "fitted": {r["name"]: r["fit"] for r in analysis["rows"]},
              "registry": {r["name"]: r["registry"] for r in analysis["rows"]},
              "rms_log_error": {k: f["rms_log_error"] for k, f in analysis["fits"].items()},
              "truth": truth if dry else None}
    print_report(result, dry)
    print(f"\nmeasure {t_measure:.1f} s, fit {t_fit:.1f} s")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
        print(f"wrote {args.json}")
    if args.markdown:
        write_markdown(args.markdown, result)
        print(f"wrote {args.markdown}")
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("auto", "jax", "torch"), default="auto",
                    help="what measures: auto = PyTorch if it sees a CUDA GPU, else JAX")
    ap.add_argument("--chip", default=None, help="registry chip to compare with (default: from the device name)")
    ap.add_argument("--json", default=None, help="write the timings, fits and statements here")
    ap.add_argument("--markdown", default=None, help="write a report here (e.g. experiments/results/gpu_microbench.md)")
    ap.add_argument("--cpu-dry-run", action="store_true", help="no GPU: fit synthetic timings")
    ap.add_argument("--quick", action="store_true", help="2 weight shapes x 15 token counts instead of 3 x 21")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions per size (median taken)")
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="stop measuring after this many seconds and report what was measured")
    ap.add_argument("--fp8-fast-accum", action="store_true", help="torch._scaled_mm(use_fast_accum=True)")
    ap.add_argument("--seed", type=int, default=0, help="noise seed of --cpu-dry-run")
    ap.add_argument("--quiet", action="store_true")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    args.argv = argv
    if args.reps < 1:
        ap.error(f"--reps must be >= 1, got {args.reps}")
    try:
        run(args)
    except NoGPU as err:
        print(f"gpu_microbench: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
