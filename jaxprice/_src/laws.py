"""The cost laws: small pure functions, each with its formula and units.

Times are seconds, sizes bytes, rates FLOP/s, B/s or tokens/s. Every function takes
arrays (NumPy or JAX) and an optional smoothing temperature ``tau`` (see numerics); with
``tau=None`` each is the discrete law. Composition of a step lives in step.py; resolving
a deployment (which uses the span and placement laws once, in NumPy) lives in resolve.py.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from .numerics import max2, min2, relu, safe_div

# ----------------------------------------------------------------------------- arithmetic


def ramp(m, eps_max, m_half):
    """GEMM efficiency at m tokens: eps(m) = eps_max * m / (m + m_half)  [dimensionless].

    0 for m <= 0; eps_max when m_half <= 0 (no ramp measured).
    """
    m = jnp.asarray(m, dtype=float)
    ramped = eps_max * safe_div(m, m + m_half)
    return jnp.where(m > 0, jnp.where(m_half > 0, ramped, eps_max), 0.0)


def shape_factor(width, half):
    """Width or depth factor of the shape-aware efficiency: x / (x + x_half)  [dimensionless].

    1 where x_half <= 0 (not measured) or the GEMM's extent is 0 (not shape-priced).
    """
    width = jnp.asarray(width, dtype=float)
    return jnp.where((half > 0) & (width > 0), safe_div(width, width + half), 1.0)


def gemm_time(flops, peak_flops, efficiency):
    """Time of `flops` of arithmetic at `peak_flops * efficiency`: flops / (P * eps)  [s]."""
    return safe_div(flops, peak_flops * efficiency)


# ----------------------------------------------------------------------------- memory


def read_time(nbytes, bandwidth):
    """Bytes read at an achieved bandwidth: bytes / (B/s)  [s]."""
    return safe_div(nbytes, bandwidth)


def achieved_bandwidth(peak_tbs, derate):
    """HBM bandwidth a kernel reaches: BwPeakTBs * 1e12 * hbm_derate  [B/s]."""
    return peak_tbs * 1e12 * derate


def floor_plus_rate(active, floor, amount, rate):
    """A kernel with a fixed cost and a rate: floor + amount / rate, if active, else 0  [s]."""
    return jnp.where(active, floor + safe_div(amount, rate), 0.0)


def recurrent_state_bytes(kind, n_heads, d_h, state, n_groups, conv_kernel, intermediate, width):
    """One recurrent mixer's state per request (reference-kernel.md section 3.13)  [bytes].

    mamba2: ((intermediate + 2 n_groups state) max(conv_kernel - 1, 1) + n_heads d_h state) w,
    with n_heads state^2 in place of n_heads d_h state where d_h is 0 (the conv and SSM states);
    kda, gdn: n_heads state^2 w (one matrix state per head). w: the state's bytes per value.
    """
    if kind == "mamba2":
        ssm = n_heads * (d_h if d_h else state) * state
        return ((intermediate + 2 * n_groups * state) * max(conv_kernel - 1, 1) + ssm) * width
    return n_heads * state * state * width


# ----------------------------------------------------------------------------- attention


def causal_prefix_integral(x, window, tau=None):
    """G_w(x) = x^2/2 - relu(x - w)^2/2: the continuum count of query-key pairs of the first
    x positions when each attends to at most w keys (w <= 0: no window, x^2/2)  [pairs].
    In smooth mode the relu's corner is rounded over a width tau * w (numerics.relu)."""
    x = jnp.asarray(x, dtype=float)
    over = relu(x - window, jnp.maximum(window, 0.0), tau)
    return 0.5 * x * x - jnp.where(window > 0, 0.5 * over * over, 0.0)


def windowed_pairs(scheduled, computed, window, tau=None):
    """Query-key pairs of a chunk of s new tokens after p computed ones, each query seeing at
    most w keys: G_w(p + s) - G_w(p)  [pairs]; without a window, s*p + s^2/2 (the continuum
    causal convention). Times 4 (2 FLOP per MAC, 2 matmuls) gives the attention FLOPs per
    head-dimension. Equals the reference's discrete chunk law exactly."""
    return causal_prefix_integral(computed + scheduled, window, tau) - causal_prefix_integral(computed, window, tau)


def decode_read_tokens(context, window, topk, compress_ratio, sparse, tau=None):
    """KV positions one decode query reads  [tokens].

    Dense layers read the context, at most the window where one is stated. A sparse layer
    reads its window (if stated) plus what its indexer selects from the compressed stream
    (context / compress_ratio): at most top-k, or the whole compressed stream when it
    selects nothing (top-k 0). Non-sparse layers with a compress ratio (an indexer's
    compressed keys) read context / compress_ratio.

    KNOWN DIVERGENCE [swa-window]: a stated window bounds the read whatever the kind, as the
    spec says; the reference reads a primary swa layer's whole context at the swa rate.
    """
    context = jnp.asarray(context, dtype=float)
    cr = jnp.where(compress_ratio > 1, compress_ratio, 1.0)
    windowed = jnp.where(window > 0, min2(context, jnp.maximum(window, 0.0), tau), context)
    compressed = context / cr
    selected = jnp.where(topk > 0, min2(compressed, jnp.maximum(topk, 0.0), tau), compressed)
    sparse_read = jnp.where(window > 0, windowed, 0.0) + selected
    return jnp.where(sparse, sparse_read, windowed / cr)


def prefill_pairs(scheduled, computed, window, topk, compress_ratio, sparse, tau=None):
    """Query-key pairs of one prefill chunk under the same read law as decode_read_tokens,
    summed over its queries  [pairs]. The top-k bound on the compressed stream is a window
    of topk * compress_ratio positions, scaled down by the compress ratio."""
    cr = jnp.where(compress_ratio > 1, compress_ratio, 1.0)
    dense = windowed_pairs(scheduled, computed, window, tau)
    selected = windowed_pairs(scheduled, computed, jnp.where(topk > 0, topk * cr, 0.0), tau) / cr
    sparse_pairs = jnp.where(window > 0, dense, 0.0) + selected
    return jnp.where(sparse, sparse_pairs, dense / cr)


# ----------------------------------------------------------------------------- experts


def experts_touched(tokens, experts_total, top_k, experts_local):
    """Distinct experts a rank's tokens touch: L * (1 - ((E - k)/E)^n)  [experts].

    0 for no tokens or no local experts; L when every token touches every expert (k >= E).
    Continuous in n, so it is differentiable in the token count.
    """
    n = jnp.asarray(tokens, dtype=float)
    miss = jnp.where(experts_total > top_k, (experts_total - top_k) / jnp.maximum(experts_total, 1.0), 0.0)
    safe_miss = jnp.where(miss > 0, miss, 1.0)
    frac = 1.0 - jnp.where(miss > 0, jnp.exp(n * jnp.log(safe_miss)), 0.0)
    return jnp.where((n > 0) & (experts_local > 0), experts_local * frac, 0.0)


# ----------------------------------------------------------------------------- collectives


def collective_time(nbytes, floor, transition_rate, peak_rate, tau=None):
    """One collective launch of b bytes: max(t0 + b/r_t, b/r_peak)  [s].

    With no transition rate (r_t <= 0): max(t0, b/r_peak). b <= 0 costs the floor.
    """
    nbytes = jnp.asarray(nbytes, dtype=float)
    latency_bound = floor + safe_div(nbytes, transition_rate)
    latency_bound = jnp.where(transition_rate > 0, latency_bound, floor)
    return jnp.where(nbytes > 0, max2(latency_bound, safe_div(nbytes, peak_rate), tau), floor)


def span(x, y, ratio):
    """Slow-link share multiplier: 1 + (rho - 1) * x / y; 1 when x, y <= 0 or rho <= 1."""
    if x <= 0 or y <= 0 or not (ratio > 1) or not math.isfinite(ratio):
        return 1.0
    return 1.0 + (ratio - 1.0) * x / y


def flat_span(group, per_node, ratio):
    """A group that does not tile nodes evenly: 1 within a node, else rho."""
    return 1.0 if group <= per_node else ratio


def ring_span(group, per_node, ratio):
    """Hierarchical ring of g ranks, pn per node: the bytes multiplier on the node link."""
    if per_node <= 0 or group % per_node != 0:
        return flat_span(group, per_node, ratio)
    return span(group / per_node - 1, group - 1, ratio)


def all2all_span(group, per_node, ratio):
    """All-to-all of g ranks, pn per node: the share of peers off-node, (g - pn)/(g - 1)."""
    return span(group - per_node, group - 1, ratio)


# ----------------------------------------------------------------------------- host


def admission_overhead(tokens, per_request, per_token):
    """Host work before a request's first token: per_request + per_token * n, 0 for n <= 0  [s]."""
    tokens = jnp.asarray(tokens, dtype=float)
    return jnp.where(tokens > 0, per_request + per_token * tokens, 0.0)


def capture_ceiling(max_num_seqs, uniform_width, four_bit_native):
    """Largest captured batch in tokens: min(2 * max_num_seqs * w, 1024 on parts with a native
    four-bit peak, else 512)  [tokens]."""
    return min(2 * max_num_seqs * uniform_width, 1024 if four_bit_native else 512)
