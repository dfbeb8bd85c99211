"""Gradients of NoOverlap and Overlap w.r.t. every coefficient and the batch's token counts.

* Finite everywhere, in exact and smooth mode: on padded rows (whose gradient is exactly
  zero), on requests that schedule no token and on all-padding batches.
* Equal to central finite differences in float64, to 1e-5 relative (plus the finite
  difference's own rounding, 50 ulps of the price over the step, which only matters for
  inputs the price barely depends on), on random batches of a few scenarios that between
  them run every code path of the bundled deployments: mixture-of-experts and dense,
  sliding windows, sparse attention, recurrent mixers, FlashAttention's one-launch mixed
  batches.
* jax.grad through the public price() w.r.t. the Coefficients pytree, the token counts and
  the temperature.

Where finite differences are taken. Smooth mode (temperature 0.05) rounds every max and
min, so the price is smooth in every coefficient and token count except for the discrete
choices the kernel makes by design: which rows are prefill (scheduled > decode threshold),
whether the batch is uniform decode (every row at the uniform width), whether any token is
scheduled. Those have zero derivative almost everywhere, so the perturbed inputs stay away
from them: coefficients are perturbed by one part in 10^5 (zero-valued ones, where a
coefficient's own "not measured" switch sits, are not perturbed), a prefill row's
scheduled count only in the middle of its range (1500 tokens against a threshold of 8, by
0.01 token) in a batch far past the capture ceiling, and the computed counts (context) of a
prefill and a decode row, which switch nothing. Exact mode is checked at the same points,
which are not within the perturbation of any tie between the maxes' arguments (random
points almost surely are not).
"""

from __future__ import annotations

import concurrent.futures
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprice as jp
from jaxprice._src.numerics import Positive
from jaxprice._src.plan import Batch, Coefficients
from jaxprice._src.step import _step_time
from jaxprice._src.sweep import random_batches

TAU = 0.05
REL = 1e-5


def _covering_scenarios():
    """A few scenarios that between them run every code path the bundled deployments have."""
    import glob
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(root, "testdata", "aisimulate", "*.yaml")))
    features = {
        "moe": lambda p: p.scalars["has_moe"],
        "window": lambda p: np.any(np.asarray(p.arrays["attn_window"]) > 0),
        "sparse": lambda p: np.any(np.asarray(p.arrays["attn_sparse"])),
        "recurrent": lambda p: len(p.arrays["rec_kind"]) > 0,
        "one_launch": lambda p: np.any(np.asarray(p.arrays["attn_one_launch"])),
        "dense": lambda p: not p.scalars["has_moe"],
    }
    has = {n: {f for f, test in features.items() if test(jp.load_deployment(n).plan)} for n in names}
    chosen, missing = [], set().union(*has.values())
    while missing:   # greedy set cover
        best = max(names, key=lambda n: (len(has[n] & missing), n.startswith("deepseek-v3")))
        chosen.append(best)
        missing -= has[best]
    return chosen


SCENARIOS = _covering_scenarios()


FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False,
                "xla_cpu_parallel_codegen_split_count": 1}


def _program(plan, names):
    """Prices [NoOverlap, Overlap] of each batch and their Jacobians w.r.t. the coefficient
    vector and the scheduled and computed counts, in exact mode and at temperature tau."""
    def prices(values, sched, comp, mask, thr, tau):
        batch = Batch(sched, comp, comp + sched, mask, thr)
        r = _step_time(plan, Coefficients(values, names), batch, tau, False)
        return jnp.stack([r.no_overlap, r.overlap])

    def run(values, sched, comp, mask, thr, tau):
        out = []
        for t in (None, Positive(tau)):
            def f(v, s, c, m, th, t=t):
                p = prices(v, s, c, m, th, t)
                return p, p
            jac, val = jax.vmap(jax.jacrev(f, argnums=(0, 1, 2), has_aux=True))(values, sched, comp, mask, thr)
            out.append((val, jac))
        return out
    return jax.jit(run)


ROWS = 24
FD_BATCH = 6      # the batch finite differences are taken on


def _fd_batch(thr):
    """Past the capture ceiling, a prefill row in mid range (1500 tokens, threshold 8) and
    decode rows at several contexts."""
    s, c, m = np.zeros(ROWS), np.zeros(ROWS), np.zeros(ROWS, bool)
    s[:4], c[:4], m[:4] = [1500, 1, 1, 3], [700, 4000, 9000, 20000], True
    return s, c, m


def _fd_points(values):
    """(what, index, step): every non-zero coefficient, the prefill row's scheduled count,
    the computed counts of the prefill row and of a decode row."""
    pts = [("coef", i, 1e-5 * abs(v)) for i, v in enumerate(values) if v != 0]
    return pts + [("sched", 0, 1e-2), ("comp", 0, 1e-2), ("comp", 2, 1e-2)]


def _prepare(name):
    dep = jp.load_deployment(name)
    thr = 8
    rb = random_batches(np.random.default_rng(sum(map(ord, name))), 6, ROWS, decode_threshold=thr)
    v0 = np.asarray(dep.coefficients.values)
    s0, c0, m0 = _fd_batch(thr)
    pts = _fd_points(v0)
    V = [v0] * 7
    S = list(np.asarray(rb.scheduled)) + [s0]
    C = list(np.asarray(rb.computed)) + [c0]
    M = list(np.asarray(rb.mask)) + [m0]
    for what, i, h in pts:
        for sign in (1, -1):
            v, s, c = v0.copy(), s0.copy(), c0.copy()
            {"coef": v, "sched": s, "comp": c}[what][i] += sign * h
            V.append(v); S.append(s); C.append(c); M.append(m0)
    args = tuple(jnp.asarray(np.stack(x)) for x in (V, S, C, M)) + (jnp.full((len(V),), float(thr)), TAU)
    lowered = _program(dep.plan, dep.coefficients.names).lower(*args)
    return name, dep, dict(values=v0, sched=np.stack(S), comp=np.stack(C), mask=np.stack(M), points=pts), args, lowered


@pytest.fixture(scope="module")
def every_scenario():
    """One compiled program per scenario, run once on: 6 random batches (with padding, an
    all-padding batch and a zero-token batch), the finite-difference batch, and the
    finite-difference batch with each point perturbed by +h and -h. Compiled two at a time."""
    def run(item):
        name, dep, inp, args, lowered = item
        return name, (name, dep, inp, jax.device_get(lowered.compile(compiler_options=FAST_COMPILE)(*args)))
    with concurrent.futures.ThreadPoolExecutor(min(2, os.cpu_count() or 1)) as pool:
        futures = [pool.submit(run, _prepare(n)) for n in SCENARIOS]
        return dict(f.result() for f in futures)


@pytest.fixture(params=SCENARIOS)
def scenario(request, every_scenario):
    return every_scenario[request.param]


def test_gradients_are_finite_everywhere(scenario):
    name, dep, inp, out = scenario
    mask = inp["mask"][:7]
    for mode, (val, (d_coef, d_sched, d_comp)) in zip(("exact", "smooth"), out):
        for g in (val, d_coef, d_sched, d_comp):
            assert np.all(np.isfinite(g)), (name, mode)
        pad = np.broadcast_to(~mask[:, None, :], d_sched[:7].shape)
        # padded rows: exactly zero, for both prices
        assert np.all(d_sched[:7][pad] == 0) and np.all(d_comp[:7][pad] == 0)
        # the all-padding batch and the zero-token batch still depend on the host coefficients
        host = dep.coefficients.index(dep.plan.coef["replay"])
        assert np.all(d_coef[0, :, host] > 0) and np.all(d_coef[1, :, host] > 0)
        # and hbm_derate slows every batch with requests down as it falls
        assert np.all(d_coef[2:7, 0, dep.coefficients.index("hbm_derate")] < 0)


@pytest.mark.parametrize("mode", ["exact", "smooth"])
def test_gradients_match_central_differences(scenario, mode):
    name, dep, inp, out = scenario
    val, (d_coef, d_sched, d_comp) = out[0 if mode == "exact" else 1]
    b = FD_BATCH
    tokens = float(np.sum(inp["sched"][b]))
    assert abs(tokens - dep.plan.scalars["capture_tokens"]) > 100      # far from the capture switch
    assert inp["sched"][b, 0] - 8 > 1000                               # a mid-range prefill row
    f0 = val[b]
    grads = {"coef": d_coef[b], "sched": d_sched[b], "comp": d_comp[b]}
    checked = 0
    for j, (what, i, h) in enumerate(inp["points"]):
        fd = (val[7 + 2 * j] - val[8 + 2 * j]) / (2 * h)               # [NoOverlap, Overlap]
        g = grads[what][:, i]
        # the finite difference's own rounding: some 50 ulps of the price, over the step
        noise = 50 * np.finfo(float).eps * np.abs(f0) / h
        assert np.all(np.abs(g - fd) <= REL * np.abs(fd) + noise), (name, mode, what, i, g, fd)
        checked += int(np.any(REL * np.abs(fd) > noise))
    # most points move some price enough to be checked to 1e-5 relative (the rest are
    # coefficients this step does not read, or contexts beyond every window: exact zeros)
    assert checked >= len(inp["points"]) // 2


def test_grad_through_the_public_api_over_the_coefficient_pytree():
    """jax.grad of price() w.r.t. the Coefficients pytree, the token counts and the
    temperature, in one call; the coefficient gradient is the smooth kernel's own."""
    dep = jp.load_deployment("deepseek-v3-h200-fp8-sglang-tp8")
    batch = jp.Batch.from_requests([1, 1, 2000, 1], [4000, 100, 300, 9000], pad_to=16, decode_threshold=8)

    def f(coefs, sched, t):
        b = Batch(sched, batch.computed, batch.prompt_len, batch.mask, batch.decode_threshold)
        r = jp.price(dep.plan, coefs, b, temperature=t)
        return r.no_overlap + r.overlap
    args = (dep.coefficients, batch.scheduled, TAU)
    g, gs, gt = jax.jit(jax.grad(f, argnums=(0, 1, 2))).lower(*args).compile(compiler_options=FAST_COMPILE)(*args)
    assert isinstance(g, Coefficients) and g.names == dep.coefficients.names
    assert np.all(np.isfinite(np.asarray(g.values))) and math.isfinite(float(gt))
    assert np.all(np.isfinite(np.asarray(gs))) and float(gs[2]) > 0 and np.all(np.asarray(gs)[4:] == 0)

    def raw(v):
        r = _step_time(dep.plan, Coefficients(v, dep.coefficients.names), batch, Positive(TAU), False)
        return r.no_overlap + r.overlap
    v = dep.coefficients.values
    want = jax.jit(jax.grad(raw)).lower(v).compile(compiler_options=FAST_COMPILE)(v)
    assert np.allclose(np.asarray(g.values), np.asarray(want), rtol=1e-12, atol=0)
