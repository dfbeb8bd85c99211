"""GPU microbenchmark: measure the GEMM efficiency ramp and the HBM derate, fit them with
jaxprice's own fitter, and print them beside the registry's values for the chip.

    python experiments/gpu_microbench.py [--chip h200] [--json experiments/out/gpu_microbench.json]
    python experiments/gpu_microbench.py --cpu-dry-run     # no GPU: the fitting path on synthetic timings

On an NVIDIA GPU (JAX with CUDA; else PyTorch with CUDA if installed) it times:

* GEMMs in bf16 and fp8 (e4m3, bf16 output) for m = 1 .. 4096 tokens and a few (n, k)
  weight shapes. Each timed call runs a chain of 64 GEMMs through distinct weight matrices
  (at least 256 MiB of them, so weights stream from HBM as in a forward pass rather than
  from L2); the time per GEMM is the median call time divided by the chain length. Weights
  are stored (n, k) and contracted on k ("TN", the layout cuBLASLt's fp8 kernels take).
* a large device-to-device copy of 64 MiB .. 4 GiB (under JAX y = -x, which reads and writes
  every byte and which XLA cannot elide, chained with optimisation barriers so that XLA cannot
  fuse the copies; under PyTorch y.copy_(x)).

It then fits, with ``jaxprice.fit_law`` (the same projected Adam on log-parameters as
``jaxprice.fit_coefficients``) and jaxprice's own laws:

* per dtype, the ramp ``t(m) = 2 m n k / (peak * eps_max * m / (m + m_half))`` over every
  (m, n, k): ``gemm_eps_max_<dtype>`` and ``gemm_m_half_<dtype>``;
* ``t(B) = hbm_constant_latency + 2 B / (hbm_tbs * 1e12 * hbm_derate)``: ``hbm_derate``;

and prints them beside the registry's values for the chip (``--chip``, default from the
device name). ``--json`` writes the raw timings and the fits. Without a GPU the script
refuses (exit 2) unless ``--cpu-dry-run`` is given, which synthesises timings from known
parameters (with 2% noise) and runs the same fitting path, printing what it recovers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import jaxprice as jp  # noqa: E402
from jaxprice._src import laws  # noqa: E402

M_VALUES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
SHAPES = ((4096, 4096), (8192, 8192), (14336, 4096))      # (n, k) of the weight
COPY_MIB = (64, 256, 1024, 4096)
CHAIN = 64
MIN_WEIGHT_BYTES = 256 * 2 ** 20
DTYPES = ("bf16", "fp8")
CHIP_NAMES = ("gb300", "gb200", "b300", "b200", "h200", "h100", "a100", "l40s")
# synthetic truth for --cpu-dry-run (deliberately not the registry's values)
DRY_TRUTH = {"bf16": {"eps_max": 0.90, "m_half": 150.0}, "fp8": {"eps_max": 0.70, "m_half": 240.0},
             "hbm_derate": 0.86, "hbm_constant_latency": 4e-6}


class NoGPU(RuntimeError):
    pass


# ----------------------------------------------------------------------------- measuring


def _median_time(fn, reps=7):
    fn()                                   # warm up (compile)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _jax_backend():
    import jax
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


def find_backend():
    b = _jax_backend() or _torch_backend()
    if b is None:
        raise NoGPU("no NVIDIA GPU visible to JAX (jax.devices('gpu') is empty) or PyTorch "
                    "(torch.cuda.is_available() is False); run on a GPU machine, or pass --cpu-dry-run "
                    "to exercise the fitting path on synthetic timings")
    return b


def _weights_count(n, k, nbytes):
    """An even number (the chain alternates (n, k) and (k, n)) of weights of >= 256 MiB in all."""
    count = max(2, math.ceil(MIN_WEIGHT_BYTES / (n * k * nbytes)))
    return count + count % 2


def measure_gemm_jax(backend, dtype, n, k, m_values):
    import jax
    import jax.numpy as jnp
    dev = backend["device"]
    wdtype = jnp.bfloat16 if dtype == "bf16" else jnp.float8_e4m3fn
    count = _weights_count(n, k, 2 if dtype == "bf16" else 1)
    key = jax.random.PRNGKey(0)
    # alternate (n, k) and (k, n) weights so that each GEMM's output feeds the next
    ws = []
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

    out = {}
    for m in m_values:
        x = jax.device_put(jnp.ones((m, k), jnp.bfloat16) * 0.01, dev)
        out[m] = _median_time(lambda: chain(x, ws).block_until_ready()) / CHAIN
    return out


def measure_copy_jax(backend, mib_values):
    import jax
    import jax.numpy as jnp
    dev = backend["device"]
    reps = 8

    @jax.jit
    def copies(x):
        for _ in range(reps):
            # a copy XLA cannot elide (x * 1 in bf16 would be): negate, read + write every byte
            x = jax.lax.optimization_barrier(x * jnp.asarray(-1.0, x.dtype))
        return x

    out = {}
    for mib in mib_values:
        x = jax.device_put(jnp.ones((mib * 2 ** 20 // 2,), jnp.bfloat16), dev)
        out[mib] = _median_time(lambda: copies(x).block_until_ready()) / reps
    return out


def measure_gemm_torch(backend, dtype, n, k, m_values):
    import torch
    dev = "cuda"
    count = _weights_count(n, k, 2 if dtype == "bf16" else 1)
    ws = []
    for i in range(count):
        shape = (n, k) if i % 2 == 0 else (k, n)
        w = torch.randn(shape, device=dev, dtype=torch.float32) / math.sqrt(shape[1])
        ws.append(w.to(torch.bfloat16) if dtype == "bf16" else w.to(torch.float8_e4m3fn))
    one = torch.ones((), device=dev, dtype=torch.float32)

    def gemm(x, w):
        if dtype == "bf16":
            return x @ w.t()
        r = torch._scaled_mm(x.to(torch.float8_e4m3fn), w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return r[0] if isinstance(r, tuple) else r

    out = {}
    for m in m_values:
        x = torch.full((m, k), 0.01, device=dev, dtype=torch.bfloat16)

        def run():
            y = x
            for j in range(CHAIN):
                y = gemm(y, ws[j % len(ws)])
            return y
        try:
            run()
        except RuntimeError as err:       # e.g. fp8 kernels needing m a multiple of 16
            print(f"  skipped {dtype} m={m} n={n} k={k}: {str(err).splitlines()[0]}", file=sys.stderr)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(7):
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        out[m] = statistics.median(times) / CHAIN
    return out


def measure_copy_torch(backend, mib_values):
    import torch
    out = {}
    for mib in mib_values:
        x = torch.ones((mib * 2 ** 20 // 2,), device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        y.copy_(x)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(7):
            start.record()
            for _ in range(8):
                y.copy_(x)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / 8)
        out[mib] = statistics.median(times)
    return out


def measure(backend, shapes, m_values, mib_values, progress=True):
    gemm, copy = {}, {}
    fn_gemm = measure_gemm_jax if backend["name"] == "jax" else measure_gemm_torch
    fn_copy = measure_copy_jax if backend["name"] == "jax" else measure_copy_torch
    for dtype in DTYPES:
        gemm[dtype] = {}
        for n, k in shapes:
            t0 = time.perf_counter()
            gemm[dtype][(n, k)] = fn_gemm(backend, dtype, n, k, m_values)
            if progress:
                print(f"  {dtype} n={n} k={k}: {len(m_values)} sizes in {time.perf_counter() - t0:.1f} s",
                      file=sys.stderr)
    copy = fn_copy(backend, mib_values)
    return gemm, copy


# ----------------------------------------------------------------------------- synthetic timings


def synthesize(chip, shapes, m_values, mib_values, *, truth=DRY_TRUTH, noise=0.02, seed=0):
    """Timings the ramp and the copy law would give at ``truth``, times lognormal noise."""
    rng = np.random.default_rng(seed)
    gemm = {}
    for dtype in DTYPES:
        peak = peak_flops(chip, dtype)
        p = truth[dtype]
        gemm[dtype] = {}
        for n, k in shapes:
            m = np.asarray(m_values, dtype=float)
            t = np.asarray(laws.gemm_time(2 * m * n * k, peak, laws.ramp(m, p["eps_max"], p["m_half"])))
            t = t * np.exp(noise * rng.standard_normal(len(m)))
            gemm[dtype][(n, k)] = dict(zip(m_values, t.tolist()))
    b = np.asarray(mib_values, dtype=float) * 2 ** 20
    t = truth["hbm_constant_latency"] + np.asarray(
        laws.read_time(2 * b, laws.achieved_bandwidth(chip.hbm_tbs, truth["hbm_derate"])))
    t = t * np.exp(noise * rng.standard_normal(len(b)))
    return gemm, dict(zip(mib_values, t.tolist()))


# ----------------------------------------------------------------------------- fitting


def peak_flops(chip, dtype):
    tf = chip.bf16_tflops if dtype == "bf16" else chip.fp8_tflops
    if not tf:
        raise SystemExit(f"gpu_microbench: error: the registry's chip {chip.name} states no {dtype} peak")
    return tf * 1e12


def fit_ramp(chip, dtype, timings, start):
    """Fit eps_max and m_half of one dtype to {(n, k): {m: seconds}} with jaxprice.fit_law."""
    import jax.numpy as jnp
    rows = [(m, n, k, t) for (n, k), per_m in timings.items() for m, t in per_m.items()]
    m, n, k, t = (np.array(c, dtype=float) for c in zip(*rows))
    peak = peak_flops(chip, dtype)
    inputs = {"flops": jnp.asarray(2 * m * n * k), "m": jnp.asarray(m)}

    def law(p, x):
        return laws.gemm_time(x["flops"], peak, laws.ramp(x["m"], p["eps_max"], p["m_half"]))
    return jp.fit_law(law, {"eps_max": min(start["eps_max"], 0.99), "m_half": start["m_half"]}, inputs, t,
                      bounds={"eps_max": (0.05, 1.0), "m_half": (1.0, 1e4)}, steps=3000, learning_rate=0.05)


def fit_copy(chip, timings, start_derate=0.8, start_latency=3e-6):
    import jax.numpy as jnp
    b = np.array(list(timings), dtype=float) * 2 ** 20
    t = np.array(list(timings.values()), dtype=float)

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


def run(args):
    dry = args.cpu_dry_run
    shapes = SHAPES[:2] if args.quick else SHAPES
    m_values = M_VALUES[::2] + (M_VALUES[-1],) if args.quick else M_VALUES
    mib_values = COPY_MIB[:3] if args.quick else COPY_MIB
    if dry:
        backend = {"name": "synthetic (--cpu-dry-run)", "kind": "none"}
        chip_name = args.chip or "h200"
    else:
        backend = find_backend()
        chip_name = args.chip or chip_from_kind(backend["kind"])
        if chip_name is None:
            raise SystemExit(f"gpu_microbench: error: cannot tell the registry chip from the device name "
                             f"{backend['kind']!r}; pass --chip")
    chip = jp.Registry().chip(chip_name)
    reg = registry_values(chip_name)
    print(f"device: {backend['kind']} via {backend['name']}; registry chip {chip_name} "
          f"(bf16 {chip.bf16_tflops} TFLOP/s, fp8 {chip.fp8_tflops} TFLOP/s, HBM {chip.hbm_tbs} TB/s)")
    t0 = time.perf_counter()
    if dry:
        gemm, copy = synthesize(chip, shapes, m_values, mib_values, seed=args.seed)
    else:
        gemm, copy = measure(backend, shapes, m_values, mib_values, progress=not args.quiet)
    t_measure = time.perf_counter() - t0

    t0 = time.perf_counter()
    fits = {}
    for dtype in DTYPES:
        start = {"eps_max": reg.get(f"gemm_eps_max_{dtype}", 0.8), "m_half": reg.get(f"gemm_m_half_{dtype}", 100.0)}
        fits[dtype] = fit_ramp(chip, dtype, gemm[dtype], start)
    fits["copy"] = fit_copy(chip, copy, reg.get("hbm_derate", 0.8), reg.get("hbm_constant_latency", 3.0) * 1e-6)
    t_fit = time.perf_counter() - t0

    print("\nGEMM time per call (us), median of 7:")
    for dtype in DTYPES:
        for (n, k), per_m in gemm[dtype].items():
            cells = " ".join(f"{m}:{t * 1e6:.1f}" for m, t in per_m.items())
            print(f"  {dtype:<5} n={n:<6} k={k:<6} {cells}")
    print("copy (read + write) time (us): " + " ".join(f"{mib} MiB:{t * 1e6:.0f}" for mib, t in copy.items()))

    rows = []
    for dtype in DTYPES:
        f = fits[dtype]
        rows.append((f"gemm_eps_max_{dtype}", f.params["eps_max"], reg.get(f"gemm_eps_max_{dtype}"), ""))
        rows.append((f"gemm_m_half_{dtype}", f.params["m_half"], reg.get(f"gemm_m_half_{dtype}"), "tokens"))
    fc = fits["copy"]
    rows.append(("hbm_derate", fc.params["hbm_derate"], reg.get("hbm_derate"), ""))
    rows.append(("hbm_constant_latency", fc.params["hbm_constant_latency"] * 1e6, reg.get("hbm_constant_latency"),
                 "us"))
    print(f"\n{'coefficient':<24}{'measured (fit)':>16}{'registry ' + chip_name:>16}{'ratio':>8}"
          + (f"{'synthetic truth':>17}" if dry else ""))
    truth = {f"gemm_eps_max_{d}": DRY_TRUTH[d]["eps_max"] for d in DTYPES}
    truth.update({f"gemm_m_half_{d}": DRY_TRUTH[d]["m_half"] for d in DTYPES})
    truth.update(hbm_derate=DRY_TRUTH["hbm_derate"], hbm_constant_latency=DRY_TRUTH["hbm_constant_latency"] * 1e6)
    for name, val, r, unit in rows:
        ratio = f"{val / r:>8.3f}" if r else f"{'-':>8}"
        rtxt = f"{r:>16.4g}" if r is not None else f"{'-':>16}"
        print(f"{name:<24}{val:>16.4g}{rtxt}{ratio}" + (f"{truth[name]:>17.4g}" if dry else "") +
              (f"  {unit}" if unit else ""))
    for key, f in fits.items():
        print(f"fit {key}: rms log error {f.rms_log_error():.3f}; {f.stopped}"
              + (f"; at bound: {f.at_bound}" if f.at_bound else ""))
    print(f"\nmeasure {t_measure:.1f} s, fit {t_fit:.1f} s")
    result = {"device": backend["kind"], "backend": backend["name"], "chip": chip_name, "dry_run": dry,
              "gemm": {d: {f"{n}x{k}": {str(m): t for m, t in per_m.items()} for (n, k), per_m in g.items()}
                       for d, g in gemm.items()},
              "copy_seconds": {str(k): v for k, v in copy.items()},
              "fitted": {name: val for name, val, _, _ in rows},
              "registry": {name: r for name, _, r, _ in rows},
              "rms_log_error": {k: f.rms_log_error() for k, f in fits.items()},
              "truth": truth if dry else None}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
        print(f"wrote {args.json}")
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chip", default=None, help="registry chip to compare with (default: from the device name)")
    ap.add_argument("--json", default=None, help="write the timings and fits here")
    ap.add_argument("--cpu-dry-run", action="store_true", help="no GPU: fit synthetic timings")
    ap.add_argument("--quick", action="store_true", help="fewer sizes and shapes")
    ap.add_argument("--seed", type=int, default=0, help="noise seed of --cpu-dry-run")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        run(args)
    except NoGPU as err:
        print(f"gpu_microbench: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
