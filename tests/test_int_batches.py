"""Integer (and float32) token counts price bit for bit like float64 ones.

A Batch's token counts may be int32 (``dtype=`` of Batch.from_requests, Batch.decode and
random_batches, or ``Batch.astype``): a third of the bytes with the mask, and in exact mode
summed over the rows in integer arithmetic, which XLA vectorises (step._walk_rows_integer).
Nothing else may notice: every result field equals the float64 batch's bit for bit, over
bundled scenarios that between them have every read law the registry uses (dense, windowed,
sparse top-k) and recurrent mixers, a synthetic one with a compressing indexer (whose rows
fall back to the float64 walk), decode thresholds that are fractional, negative or not
finite, more rows than the integer walk takes, and the gradient over the coefficients.
Smooth mode widens the counts to float64 and equals the float64 batch too; float32 counts are
widened on entry. Narrowing refuses counts the dtype would not hold exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprice as jp
import synthetic as syn
from jaxprice._src.plan import INT_TOKEN_LIMIT, Batch
from jaxprice._src.resolve import bundled_scenarios
from jaxprice._src.step import _attention_laws, _integer_law
from jaxprice._src.sweep import random_batches

ROWS = 64


def _features(plan):
    A, f = plan.arrays, set()
    if len(A["attn_kind"]):
        for w, tk, cr, sp in _attention_laws(A)[0]:
            f |= {"window"} if w > 0 else set()
            f |= {"sparse_topk"} if sp > 0 and tk > 0 else set()
            f |= {"compressing"} if not _integer_law(w, tk, cr) else set()
    f |= {"recurrent"} if len(A["rec_kind"]) else set()
    f |= {"moe"} if plan.scalars["has_moe"] else {"dense"}
    return f


def _covering():
    """The bench's two deployments, then a greedy cover of the bundled scenarios' features."""
    names = bundled_scenarios()
    has = {n: _features(jp.load_deployment(n).plan) for n in names}
    chosen = ["deepseek-v3-h200-fp8-sglang-tp8", "llama-3.1-70b-instruct-h200-fp8-vllm-tp4"]
    missing = set().union(*has.values()) - set().union(*(has[n] for n in chosen))
    while missing:
        best = max(names, key=lambda n: len(has[n] & missing))
        chosen.append(best)
        missing -= has[best]
    return chosen


SCENARIOS = _covering()


def _same(a: jp.StepResult, b: jp.StepResult):
    for field in ("resources", "overlap", "no_overlap", "bottleneck", "bottleneck_weights"):
        x, y = np.asarray(getattr(a, field)), np.asarray(getattr(b, field))
        assert x.dtype == y.dtype and np.array_equal(x, y), (field, x, y)


def _batches(seed, count=12, rows=ROWS, thresholds=(1, 8), empty=True):
    """Random padded batches (with ``empty``, an all-padding one and a zero-token one among
    them) with several decode thresholds."""
    rng = np.random.default_rng(seed)
    b = random_batches(rng, count, rows, decode_threshold=8, empty=empty)
    thr = np.resize(np.asarray(thresholds, dtype=float), count)
    return Batch(b.scheduled, b.computed, b.prompt_len, b.mask, jnp.asarray(thr))


@pytest.mark.parametrize("name", SCENARIOS)
def test_int32_batches_price_bit_for_bit_like_float64(name):
    dep = jp.load_deployment(name)
    b64 = _batches(sum(map(ord, name)))
    b32 = b64.astype(jnp.int32)
    assert b32.scheduled.dtype == jnp.int32 and b32.mask.dtype == jnp.bool_
    _same(jp.price_many(dep.plan, dep.coefficients, b32), jp.price_many(dep.plan, dep.coefficients, b64))


def test_every_read_law_of_the_bundled_scenarios_is_summed_in_integers():
    """So the cover above runs the integer walk for all of them (no bundled law compresses)."""
    feats = set().union(*(_features(jp.load_deployment(n).plan) for n in SCENARIOS))
    assert {"window", "sparse_topk", "recurrent", "moe", "dense"} <= feats
    assert "compressing" not in feats


def test_single_calls_smooth_mode_and_coefficient_gradients_agree():
    dep = jp.load_deployment(SCENARIOS[1])
    plan, c = dep.plan, dep.coefficients
    b64 = _batches(3, count=6)
    b32 = b64.astype("int32")
    one64, one32 = (jax.tree_util.tree_map(lambda x: x[4], b) for b in (b64, b32))
    _same(jp.price(plan, c, one32), jp.price(plan, c, one64))
    for t in (0.0, 0.05):
        _same(jp.price_many(plan, c, b32, temperature=t), jp.price_many(plan, c, b64, temperature=t))
    loss = jax.jit(jax.value_and_grad(lambda c, b: jnp.sum(jp.price_many(plan, c, b).no_overlap)))
    (v32, g32), (v64, g64) = loss(c, b32), loss(c, b64)
    assert np.array_equal(np.asarray(v32), np.asarray(v64))
    assert np.array_equal(np.asarray(g32.values), np.asarray(g64.values))


def test_thresholds_that_are_not_integers_or_not_finite():
    """s > thr for an integer s is s > floor(thr); NaN is never exceeded."""
    dep = jp.load_deployment("llama-3.1-70b-instruct-h200-fp8-vllm-tp4")
    thresholds = (7.5, -3.0, float("nan"), float("inf"), float("-inf"), 0.0, 2.0 ** 40, 4095.999)
    b64 = _batches(5, count=len(thresholds), thresholds=thresholds, empty=False)
    r64 = jp.price_many(dep.plan, dep.coefficients, b64)
    _same(jp.price_many(dep.plan, dep.coefficients, b64.astype("int32")), r64)
    # each threshold acts as the integer one below it (NaN and +inf: nothing is a prefill)
    same_as = (7.0, 0.0, 2.0 ** 40, 2.0 ** 40, 0.0, 0.0, 2.0 ** 40, 4095.0)
    ints = Batch(b64.scheduled, b64.computed, b64.prompt_len, b64.mask, jnp.asarray(same_as))
    _same(jp.price_many(dep.plan, dep.coefficients, ints), r64)
    eight = Batch(b64.scheduled, b64.computed, b64.prompt_len, b64.mask, jnp.full(len(thresholds), 8.0))
    assert np.all(np.asarray(jp.price_many(dep.plan, dep.coefficients, eight).no_overlap)[:2] !=
                  np.asarray(r64.no_overlap)[:2])      # and the threshold decides something


def test_a_compressing_read_law_falls_back_to_the_float64_walk(tmp_path):
    """An indexer with compress ratio 4 reads context / 4: not an integer, so its rows are
    summed in float64, row after row, as for a float64 batch; the other laws in integers.
    (float32 counts are widened to float64 on entry.)"""
    indexer = {"op": "Attention", "kind": "gqa", "n_q": 4, "n_kv": 1, "d_h": 128, "role": "indexer",
               "compress_ratio": 4}
    sparse = {"op": "Attention", "kind": "sparse_mla", "n_q": 16, "n_kv": 1, "d_h": 512, "window": 16,
              "index_topk": 32, "compress_ratio": 4}
    dense = {"op": "Attention", "kind": "gqa", "n_q": 8, "n_kv": 8, "d_h": 128, "window": 64}
    coefs = [("attention_decode_floor", 5.0, "us_per_transfer"), ("attention_decode_rate", 2e6, "bytes_per_us"),
             ("attention_decode_floor_mla", 7.0, "us_per_transfer"),
             ("attention_decode_rate_sparse_mla", 5e6, "bytes_per_us")]
    dep = syn.deployment(tmp_path, kinds={"sp": [sparse, indexer], "win": [dense]}, coefficients=coefs)
    laws = _attention_laws(dep.plan.arrays)[0]
    assert any(not _integer_law(w, tk, cr) for w, tk, cr, _ in laws)
    assert any(_integer_law(w, tk, cr) for w, tk, cr, _ in laws)
    b64 = _batches(9, count=8, rows=syn.PAD)
    r64 = jp.price_many(dep.plan, dep.coefficients, b64)
    _same(jp.price_many(dep.plan, dep.coefficients, b64.astype("int32")), r64)
    _same(jp.price_many(dep.plan, dep.coefficients, b64.astype(np.float32)), r64)


def test_more_rows_than_the_integer_walk_takes():
    dep = jp.load_deployment("llama-3.1-70b-instruct-h200-fp8-vllm-tp4")
    b64 = _batches(2, count=2, rows=4097)
    _same(jp.price_many(dep.plan, dep.coefficients, b64.astype("int32")),
          jp.price_many(dep.plan, dep.coefficients, b64))


def test_constructors_take_a_dtype():
    b = Batch.decode(3, 100, pad_to=8, dtype="int32")
    assert b.scheduled.dtype == jnp.int32 and b.computed.dtype == jnp.int32 and b.prompt_len.dtype == jnp.int32
    assert np.asarray(b.computed).tolist() == [99, 99, 99, 0, 0, 0, 0, 0]
    assert Batch.decode(3, 100, pad_to=8).scheduled.dtype == jnp.float64          # the default
    r = random_batches(np.random.default_rng(0), 3, 8, dtype=np.int32)
    assert r.scheduled.dtype == jnp.int32 and r.decode_threshold.dtype == jnp.float64
    f = Batch.from_requests([5, 6], [1, 2], pad_to=4, dtype=np.float32)
    assert f.scheduled.dtype == jnp.float32 and np.asarray(f.prompt_len).tolist() == [6, 8, 0, 0]


@pytest.mark.parametrize("make, field", [
    (lambda: Batch.from_requests([INT_TOKEN_LIMIT], [0], dtype="int32"), "scheduled[0]"),
    (lambda: Batch.from_requests([1, 2], [0, INT_TOKEN_LIMIT + 1], dtype=np.float32), "computed[1]"),
    (lambda: Batch.decode(2, 10, pad_to=4).astype("int8"), "dtype"),
    (lambda: Batch(jnp.asarray([1.5, 2.0]), jnp.zeros(2), jnp.zeros(2), jnp.ones(2, bool),
                   jnp.asarray(1.0)).astype("int32"), "scheduled[0]"),
    (lambda: Batch(jnp.asarray([1.0, -2.0]), jnp.zeros(2), jnp.zeros(2), jnp.ones(2, bool),
                   jnp.asarray(1.0)).astype(np.float32), "scheduled[1]"),
    (lambda: random_batches(np.random.default_rng(0), 2, 64, max_context=4 * INT_TOKEN_LIMIT, dtype="int32"),
     "computed"),
])
def test_narrowing_refuses_counts_the_dtype_cannot_hold(make, field):
    with pytest.raises(jp.JaxpriceError) as e:
        make()
    assert field in str(e.value)
