"""Gradient-safe primitives and the smooth surrogates for max and min.

Every max and min in the cost model goes through this module, behind one switch: the
temperature ``tau``.

* ``tau is None`` (exact mode, static): the discrete max / min.
* ``tau`` a traced or concrete float: a smooth surrogate; ``tau == 0`` selects the
  discrete value bit for bit (the smooth branch is computed but masked out with the
  double-``where`` idiom, so its gradient is exactly zero and never NaN).
* ``Positive(tau)``: a temperature known to be > 0, as the step kernel's smooth branch
  gets it (step.exact_at_zero branches to exact mode at tau == 0, which is what makes a
  whole step at temperature 0 equal exact mode bit for bit): the gate is skipped.

The surrogate is a power mean, not a log-sum-exp over raw values. All the quantities
maxed here are non-negative times, byte counts and token counts in different units, and a
power mean is scale-free, so one dimensionless temperature serves all of them:

    smax(x) = (sum_i x_i^p)^(1/p),  p = 1/tau        (x_i >= 0)
    smin(x) = (sum_i x_i^-p)^(-1/p)

Bounds (documented and tested): for n terms,
    max(x) <= smax(x) <= n^tau * max(x),   n^-tau * min(x) <= smin(x) <= min(x),
i.e. the error in log space is at most tau * log(n), the log-sum-exp bound. For tau <= 1,
smax(x) <= sum(x).

The other surrogates, each exact at tau == 0 and converging as tau -> 0:

* ``relu(y, scale, tau)``: max(y, 0) becomes scale*tau*softplus(y / (scale*tau)), with
  0 <= relu_tau(y) - max(y, 0) <= tau * scale * log(2) (largest at y = 0).
* ``step(x, threshold, tau)``: the indicator x > threshold becomes a logistic, off from the
  indicator, on integer x, by at most exp(-|x - threshold - 1/2| / (tau * max(threshold, 1))).
* ``softmax_weights``: the one-hot of the argmax becomes x^p / sum x^p; the weight off the
  largest entry is at most (n - 1) * (second / largest)^(1/tau).
* ``below(a, b, tau)``: the indicator a < b (which of two floors a mixed batch drops)
  becomes sigmoid(log(b / a) / tau), off by at most exp(-|log(b / a)| / tau).
* ``blend(a, b, w)``: a choice between a (w = 0) and b (w = 1) that is exact at the end points
  and a linear blend for a smooth weight in between.

Composition bound (pricing a step, tested on every bundled scenario): the price is built
from these by sums and products of non-negative terms, and each surrogate is within a
factor n^tau of the exact value of its inputs, so the factors multiply along the longest
chain of nested surrogates: collective max or decode-read clamp (2 terms) -> per-layer
stage max (4) -> the Overlap <= NoOverlap clamp (2). Away from the switch that ``step``
smooths (the capture ceiling), |log(smooth / exact)| <= tau * log(16) for Overlap and
<= tau * log(2) for NoOverlap. The prefill window clamp (``relu`` inside a difference of
pair counts) is not covered by the argument, only by the tests.

``sum_rows`` is not a surrogate: it sums many per-row quantities in one pass over the rows
(one variadic XLA reduction instead of one reduction, and one read of the batch, per
quantity), with an ordinary sum as its derivative.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def safe_div(num, den):
    """num / den, with 0 where den == 0, and a zero (not NaN) gradient there."""
    ok = den != 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


# A max over a few terms (the per-layer stage has 4, a clamp 2, the bottleneck 5) is written
# elementwise over the terms' slices rather than as a reduction: XLA then fuses it with its
# neighbours, which is faster to run and to compile. A max is exact in any order.
_UNROLL = 8


def _terms(x, axis):
    return [jax.lax.index_in_dim(x, i, axis, keepdims=False) for i in range(x.shape[axis])]


def _fold(x, axis, pairwise, reduce):
    """reduce(x, axis), unrolled into pairwise ops over the terms when there are few."""
    if x.shape[axis] > _UNROLL or x.shape[axis] == 0:
        return reduce(x, axis=axis)
    terms = _terms(x, axis)
    acc = terms[0]
    for t in terms[1:]:
        acc = pairwise(acc, t)
    return acc


def _hard_max(x, axis):
    return _fold(x, axis, jnp.maximum, jnp.max)


def _hard_min(x, axis):
    return _fold(x, axis, jnp.minimum, jnp.min)


def _power_mean(x, p, axis):
    """(sum x^p)^(1/p) along axis for x >= 0, computed relative to max(x) for stability.

    Zero entries contribute zero (and zero gradient); an all-zero slice gives 0.
    """
    top = _hard_max(x, axis)
    top_ok = top > 0
    safe_top = jnp.where(top_ok, top, 1.0)
    if x.shape[axis] <= _UNROLL:
        total = 0.0
        for t in _terms(x, axis):
            ratio = t / safe_top
            pos = ratio > 0
            total = total + jnp.where(pos, jnp.exp(p * jnp.log(jnp.where(pos, ratio, 1.0))), 0.0)
    else:
        ratio = x / jnp.expand_dims(safe_top, axis)
        pos = ratio > 0
        total = jnp.sum(jnp.where(pos, jnp.exp(p * jnp.log(jnp.where(pos, ratio, 1.0))), 0.0), axis=axis)
    safe_total = jnp.where(total > 0, total, 1.0)
    return jnp.where(top_ok, safe_top * jnp.exp(jnp.log(safe_total) / p), 0.0)


class Positive:
    """A temperature known to be > 0, as ``exact_at_zero`` (step.py) passes it to the smooth
    branch: the surrogates then skip their tau == 0 gate and the exact value behind it."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _gate(tau, dtype):
    """(safe temperature, the tau > 0 predicate or None when known positive)."""
    if isinstance(tau, Positive):
        return jnp.asarray(tau.value, dtype=dtype), None
    tau = jnp.asarray(tau, dtype=dtype)
    on = tau > 0
    return jnp.where(on, tau, 1.0), on


def _choose(on, smooth, exact):
    """The smooth value, or the exact one (a thunk) where the temperature is 0."""
    return smooth if on is None else jnp.where(on, smooth, exact())


def smax(x, tau=None, axis=-1):
    """Smooth maximum of non-negative values along ``axis`` (see module docstring)."""
    x = jnp.asarray(x)
    if tau is None:
        return _hard_max(x, axis)
    safe_tau, on = _gate(tau, x.dtype)
    return _choose(on, _power_mean(x, 1.0 / safe_tau, axis), lambda: _hard_max(x, axis))


def smin(x, tau=None, axis=-1):
    """Smooth minimum of non-negative values along ``axis``: a power mean with p = -1/tau.

    A zero entry makes the minimum zero in both modes.
    """
    x = jnp.asarray(x)
    if tau is None:
        return _hard_min(x, axis)
    safe_tau, on = _gate(tau, x.dtype)
    low = _hard_min(x, axis)
    safe_x = jnp.where(x > 0, x, 1.0)
    # min(x) = 1 / max(1/x): reuse the power mean on reciprocals.
    inv = _power_mean(1.0 / safe_x, 1.0 / safe_tau, axis)
    smooth = jnp.where(low <= 0, 0.0, 1.0 / jnp.where(inv > 0, inv, 1.0))
    return _choose(on, smooth, lambda: low)


def max2(a, b, tau=None):
    """Smooth max of two non-negative arrays, elementwise."""
    a, b = jnp.broadcast_arrays(jnp.asarray(a), jnp.asarray(b))
    return smax(jnp.stack([a, b], axis=-1), tau)


def min2(a, b, tau=None):
    """Smooth min of two non-negative arrays, elementwise."""
    a, b = jnp.broadcast_arrays(jnp.asarray(a), jnp.asarray(b))
    return smin(jnp.stack([a, b], axis=-1), tau)


def step(x, threshold, tau=None):
    """Indicator x > threshold; in smooth mode a logistic in the relative excess.

    The smooth form is sigmoid((x - threshold - 1/2) / (tau * max(threshold, 1))):
    integer counts sit half a unit from the switch, so it converges to the discrete
    indicator on integers as tau -> 0.
    """
    dtype = jnp.result_type(x, float)
    if tau is None:
        return (x > threshold).astype(dtype)
    safe_tau, on = _gate(tau, dtype)
    scale = safe_tau * jnp.maximum(threshold, 1.0)
    smooth = jax.nn.sigmoid((x - threshold - 0.5) / scale)
    return _choose(on, smooth, lambda: (x > threshold).astype(dtype))


def below(a, b, tau=None):
    """Indicator a < b for non-negative a, b; in smooth mode sigmoid(log(b / a) / tau), a
    logistic in the ratio (scale-free like the power means), off from the indicator by at
    most exp(-|log(b / a)| / tau) and 1/2 at a tie. A zero side decides it in both modes."""
    a, b = jnp.broadcast_arrays(jnp.asarray(a, dtype=float), jnp.asarray(b, dtype=float))
    exact = (a < b).astype(a.dtype)
    if tau is None:
        return exact
    safe_tau, on = _gate(tau, a.dtype)
    both = (a > 0) & (b > 0)
    ratio = jnp.log(jnp.where(both, b, 1.0)) - jnp.log(jnp.where(both, a, 1.0))
    smooth = jnp.where(both, jax.nn.sigmoid(ratio / safe_tau), exact)
    return _choose(on, smooth, lambda: exact)


def softmax_weights(x, tau=None, axis=-1):
    """Bottleneck weights over non-negative totals: one-hot of the first argmax in exact
    mode, x^p / sum x^p (p = 1/tau) in smooth mode."""
    x = jnp.asarray(x)
    onehot = jax.nn.one_hot(jnp.argmax(x, axis=axis), x.shape[axis], dtype=x.dtype, axis=axis)
    if tau is None:
        return onehot
    safe_tau, on = _gate(tau, x.dtype)
    top = jnp.expand_dims(_hard_max(x, axis), axis)
    safe_top = jnp.where(top > 0, top, 1.0)
    pos = x > 0
    powers = jnp.where(pos, jnp.exp(jnp.log(jnp.where(pos, x / safe_top, 1.0)) / safe_tau), 0.0)
    total = jnp.expand_dims(sum(_terms(powers, axis)) if x.shape[axis] <= _UNROLL else jnp.sum(powers, axis), axis)
    soft = jnp.where(top > 0, powers / jnp.where(top > 0, total, 1.0), onehot)
    return _choose(on, soft, lambda: onehot)


def relu(y, scale, tau=None):
    """max(y, 0); in smooth mode scale*tau*softplus(y / (scale*tau)) (see module docstring).

    ``scale`` (> 0) sets the width of the smoothed corner in y's own units: the window for a
    window clamp, so one dimensionless temperature serves every law. Exact where scale <= 0.
    """
    y = jnp.asarray(y)
    exact = jnp.maximum(y, 0.0)
    if tau is None:
        return exact
    safe_tau, on = _gate(tau, exact.dtype)
    width = safe_tau * scale
    wide = width > 0
    safe_width = jnp.where(wide, width, 1.0)
    smooth = jnp.where(wide, safe_width * jax.nn.softplus(y / safe_width), exact)
    return _choose(on, smooth, lambda: exact)


def blend(a, b, w):
    """a where w == 0, b where w == 1 (bit for bit), a + w * (b - a) in between.

    Pairs with ``step``: a switch that is exact in exact mode and smooth in smooth mode.
    """
    a, b, w = jnp.asarray(a), jnp.asarray(b), jnp.asarray(w)
    return jnp.where(w >= 1, b, jnp.where(w <= 0, a, a + w * (b - a)))


@jax.custom_jvp
def sum_rows(rows):
    """Sums of several per-row arrays over their last axis, in one variadic reduction.

    rows: a tuple of arrays of one shape [..., R]. Returns a tuple of [...] sums. XLA fuses
    the producers of every array into one loop over the rows, so the batch is read once
    whatever the number of quantities; the derivative is the ordinary sum.
    """
    rows = tuple(jnp.asarray(r) for r in rows)
    init = tuple(jnp.zeros((), r.dtype) for r in rows)
    return tuple(jax.lax.reduce(rows, init, lambda a, b: tuple(x + y for x, y in zip(a, b)),
                                (rows[0].ndim - 1,)))


@sum_rows.defjvp
def _sum_rows_jvp(primals, tangents):
    (rows,), (dots,) = primals, tangents
    return sum_rows(rows), tuple(jnp.sum(jnp.asarray(t), axis=-1) for t in dots)
