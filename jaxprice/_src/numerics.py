"""Gradient-safe primitives and the smooth surrogates for max and min.

Every max and min in the cost model goes through this module, behind one switch: the
temperature ``tau``.

* ``tau is None`` (exact mode, static): the discrete ``jnp.max`` / ``jnp.min``.
* ``tau`` a traced or concrete float: a smooth surrogate; ``tau == 0`` selects the
  discrete value bit for bit (the smooth branch is computed but masked out with the
  double-``where`` idiom, so its gradient is exactly zero and never NaN).

The surrogate is a power mean, not a log-sum-exp over raw values. All the quantities
maxed here are non-negative times, byte counts and token counts in different units, and a
power mean is scale-free, so one dimensionless temperature serves all of them:

    smax(x) = (sum_i x_i^p)^(1/p),  p = 1/tau        (x_i >= 0)
    smin(x) = (sum_i x_i^-p)^(-1/p)

Bounds (documented and tested): for n terms,
    max(x) <= smax(x) <= n^tau * max(x),   n^-tau * min(x) <= smin(x) <= min(x),
i.e. the error in log space is at most tau * log(n), the log-sum-exp bound. For tau <= 1,
smax(x) <= sum(x), so the smooth Overlap never exceeds NoOverlap.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def safe_div(num, den):
    """num / den, with 0 where den == 0, and a zero (not NaN) gradient there."""
    ok = den != 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def _power_mean(x, p, axis):
    """(sum x^p)^(1/p) along axis for x >= 0, computed relative to max(x) for stability.

    Zero entries contribute zero (and zero gradient); an all-zero slice gives 0.
    """
    top = jnp.max(x, axis=axis, keepdims=True)
    top_ok = top > 0
    safe_top = jnp.where(top_ok, top, 1.0)
    ratio = x / safe_top
    pos = ratio > 0
    safe_ratio = jnp.where(pos, ratio, 1.0)
    terms = jnp.where(pos, jnp.exp(p * jnp.log(safe_ratio)), 0.0)
    total = jnp.sum(terms, axis=axis, keepdims=True)
    safe_total = jnp.where(total > 0, total, 1.0)
    mean = safe_top * jnp.exp(jnp.log(safe_total) / p)
    return jnp.squeeze(jnp.where(top_ok, mean, 0.0), axis=axis)


def smax(x, tau=None, axis=-1):
    """Smooth maximum of non-negative values along ``axis`` (see module docstring)."""
    x = jnp.asarray(x)
    exact = jnp.max(x, axis=axis)
    if tau is None:
        return exact
    tau = jnp.asarray(tau, dtype=x.dtype)
    on = tau > 0
    safe_tau = jnp.where(on, tau, 1.0)
    smooth = _power_mean(x, 1.0 / safe_tau, axis)
    return jnp.where(on, smooth, exact)


def smin(x, tau=None, axis=-1):
    """Smooth minimum of non-negative values along ``axis``: a power mean with p = -1/tau.

    A zero entry makes the minimum zero in both modes.
    """
    x = jnp.asarray(x)
    exact = jnp.min(x, axis=axis)
    if tau is None:
        return exact
    tau = jnp.asarray(tau, dtype=x.dtype)
    on = tau > 0
    safe_tau = jnp.where(on, tau, 1.0)
    any_zero = jnp.any(x <= 0, axis=axis)
    safe_x = jnp.where(x > 0, x, 1.0)
    # min(x) = 1 / max(1/x): reuse the power mean on reciprocals.
    inv = _power_mean(1.0 / safe_x, 1.0 / safe_tau, axis)
    smooth = jnp.where(any_zero, 0.0, 1.0 / jnp.where(inv > 0, inv, 1.0))
    return jnp.where(on, smooth, exact)


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
    exact = (x > threshold).astype(jnp.result_type(x, float))
    if tau is None:
        return exact
    tau = jnp.asarray(tau, dtype=exact.dtype)
    on = tau > 0
    safe_tau = jnp.where(on, tau, 1.0)
    scale = safe_tau * jnp.maximum(threshold, 1.0)
    smooth = jax.nn.sigmoid((x - threshold - 0.5) / scale)
    return jnp.where(on, smooth, exact)


def softmax_weights(x, tau=None, axis=-1):
    """Bottleneck weights over non-negative totals: one-hot of the first argmax in exact
    mode, x^p / sum x^p (p = 1/tau) in smooth mode."""
    x = jnp.asarray(x)
    onehot = jax.nn.one_hot(jnp.argmax(x, axis=axis), x.shape[axis], dtype=x.dtype)
    if tau is None:
        return onehot
    tau = jnp.asarray(tau, dtype=x.dtype)
    on = tau > 0
    safe_tau = jnp.where(on, tau, 1.0)
    top = jnp.max(x, axis=axis, keepdims=True)
    safe_top = jnp.where(top > 0, top, 1.0)
    pos = x > 0
    logs = jnp.where(pos, jnp.log(jnp.where(pos, x / safe_top, 1.0)) / safe_tau, -jnp.inf)
    soft = jax.nn.softmax(logs, axis=axis)
    soft = jnp.where(jnp.all(~pos, axis=axis, keepdims=True), onehot, soft)
    return jnp.where(on, soft, onehot)
