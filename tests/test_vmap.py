"""vmap: many batches of one deployment in one call, many coefficient sets for one batch.

* price_many equals a loop of price; price_coefficient_sets equals a loop over the sets.
* Nothing retraces when only values change (token counts, coefficients, temperature); a
  new padding or a change of mode (exact / smooth) traces once, on purpose.

The shapes here (12 batches of 64 rows) are those of test_smooth's public-API test, so in
one session the programs are compiled once for both.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxprice as jp
from jaxprice._src import step as step_mod
from jaxprice._src.sweep import price_coefficient_sets, price_sharded, random_batches, stack_coefficients

FIELDS = ("overlap", "no_overlap", "resources", "bottleneck_weights")


def _row(batches, i):
    return jax.tree_util.tree_map(lambda x: x[i], batches)


def _assert_same(a, b, field, rtol=1e-12):
    x, y = np.asarray(getattr(a, field)), np.asarray(getattr(b, field))
    assert x.shape == y.shape
    assert np.allclose(x, y, rtol=rtol, atol=1e-300), (field, np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-300)))


@pytest.mark.parametrize("name,temperature", [("deepseek-v3-h200-fp8-sglang-tp8", None),
                                              ("deepseek-v3-h200-fp8-sglang-tp8", 0.05),
                                              ("llama-3.1-70b-instruct-h200-fp8-vllm-tp4", None)])
def test_price_many_equals_a_loop_of_price(name, temperature):
    dep = jp.load_deployment(name)
    batches = random_batches(np.random.default_rng(7), 12, 64, decode_threshold=8)
    many = jp.price_many(dep.plan, dep.coefficients, batches, temperature=temperature)
    for i in range(12):
        one = jp.price(dep.plan, dep.coefficients, _row(batches, i), temperature=temperature)
        got = jax.tree_util.tree_map(lambda x: x[i], many)
        for field in FIELDS:
            _assert_same(got, one, field)
        assert int(got.bottleneck) == int(one.bottleneck)


def test_price_coefficient_sets_equals_a_loop():
    dep = jp.load_deployment("llama-3.1-70b-instruct-h200-fp8-vllm-tp4")
    batch = _row(random_batches(np.random.default_rng(7), 12, 64, decode_threshold=8), 5)
    c = dep.coefficients
    sets = [c, c.replace(hbm_derate=0.6), c.replace(gemm_eps_max_fp8=0.5, host_launch_per_kernel=5e-6),
            c.replace(attention_decode_rate=1e12)]
    many = price_coefficient_sets(dep.plan, stack_coefficients(sets), batch)
    assert many.no_overlap.shape == (4,)
    for i, s in enumerate(sets):
        one = jp.price(dep.plan, s, batch)
        got = jax.tree_util.tree_map(lambda x: x[i], many)
        for field in FIELDS:
            _assert_same(got, one, field)
    # the sets differ, and so do their prices
    assert len(set(np.asarray(many.no_overlap).tolist())) == 4


def test_stack_coefficients_refuses_mismatched_names():
    a = jp.load_deployment("llama-3.1-70b-instruct-h200-fp8-vllm-tp4").coefficients
    b = jp.load_deployment("deepseek-v3-h200-fp8-sglang-tp8").coefficients
    with pytest.raises(jp.JaxpriceError, match="share one list of names"):
        stack_coefficients([a, b])


def test_a_negative_temperature_is_refused_before_jit():
    dep = jp.load_deployment("llama-3.1-70b-instruct-h200-fp8-vllm-tp4")
    batch = jp.Batch.decode(4, 1000, pad_to=8)
    with pytest.raises(jp.JaxpriceError, match="temperature"):
        jp.price(dep.plan, dep.coefficients, batch, temperature=-0.1)
    with pytest.raises(jp.JaxpriceError, match="temperature"):
        jp.price_many(dep.plan, dep.coefficients, jp.Batch.stack([batch]), temperature=float("nan"))


@pytest.fixture
def traces(monkeypatch):
    """Counts traces of the kernel, by mode (exact / smooth)."""
    count = {"exact": 0, "smooth": 0}
    real = step_mod._kernel

    def counting(view, roles, batch, tau, breakdown, sums=None):
        count["exact" if tau is None else "smooth"] += 1
        return real(view, roles, batch, tau, breakdown, sums=sums)
    monkeypatch.setattr(step_mod, "_kernel", counting)   # every entry point prices through it
    return count


def test_no_retrace_when_only_values_change(traces):
    dep = jp.load_deployment("llama-3.1-70b-instruct-h200-fp8-vllm-tp4")
    jax.clear_caches()             # whatever ran before, the first call below traces
    rows = 29
    rng = np.random.default_rng(11)
    plan, c = dep.plan, dep.coefficients

    def batches(n=5):
        return random_batches(rng, n, rows, decode_threshold=int(rng.choice([1, 8])))

    jp.price_many(plan, c, batches())
    assert traces == {"exact": 1, "smooth": 0}
    for k in range(3):   # new token counts, new coefficient values, a new decode threshold
        jp.price_many(plan, c.replace(hbm_derate=0.5 + 0.1 * k), batches())
    assert traces == {"exact": 1, "smooth": 0}

    # the same names from another file (other cites and units, as a fitted set has): no retrace
    refitted = jp.Coefficients(c.values * 1.01, c.names, ("fitted",) * len(c.names), ("fit.yaml",) * len(c.names))
    out = jp.price_many(plan, refitted, batches())
    assert traces == {"exact": 1, "smooth": 0}
    assert jax.tree_util.tree_structure(refitted) == jax.tree_util.tree_structure(c)
    assert out.no_overlap.shape == (5,)

    jp.price_many(plan, c, batches(), temperature=0.1)   # smooth mode: its own program, traced once
    after_smooth = dict(traces)
    assert after_smooth["smooth"] == 1 and after_smooth["exact"] == 2   # (the temperature-0 branch)
    for t in (0.0, 0.3, 1e-4):
        jp.price_many(plan, c.replace(hbm_derate=0.7), batches(), temperature=t)
    assert traces == after_smooth

    one = _row(batches(), 0)
    jp.price(plan, c, one)
    for k in range(3):
        jp.price(plan, c.replace(host_launch_per_kernel=1e-6 * (k + 1)), _row(batches(), 1))
    assert traces["exact"] == after_smooth["exact"] + 1

    sets = stack_coefficients([c, c.replace(hbm_derate=0.5)])
    price_coefficient_sets(plan, sets, one)
    price_coefficient_sets(plan, stack_coefficients([c.replace(hbm_derate=0.4), c]), _row(batches(), 2))
    assert traces["exact"] == after_smooth["exact"] + 2

    price_sharded(plan, c, batches())
    price_sharded(plan, c.replace(hbm_derate=0.9), batches())
    assert traces["exact"] == after_smooth["exact"] + 3

    # a new padding traces, once: the counter does count
    jp.price_many(plan, c, random_batches(rng, 5, rows + 1))
    jp.price_many(plan, c, random_batches(rng, 5, rows + 1))
    assert traces["exact"] == after_smooth["exact"] + 4


def test_batch_stack_of_many_batches_is_fast_and_exact():
    batches = [jp.Batch.decode(i % 7 + 1, 100 + i, pad_to=8, decode_threshold=2) for i in range(1000)]
    stacked = jp.Batch.stack(batches)
    assert stacked.scheduled.shape == (1000, 8) and stacked.mask.dtype == bool
    assert np.array_equal(np.asarray(stacked.computed[734]), np.asarray(batches[734].computed))
