"""Price: compose one step from the laws, over a padded batch, for a resolved Plan.

``step_time(plan, coefs, batch, tau)`` is a pure JAX function (no Python branch on a traced
value): jit it, vmap it over batches or coefficient sets, differentiate it. ``tau=None`` is
exact mode (every max is the discrete max); a float is smooth mode (see numerics), and
temperature 0 is exact mode bit for bit (``exact_at_zero``).

Composition (pricing-a-step.md, 'Composing the step'): per layer kind l,
    stage_l = max(SM_l, HBM_l, NVLink_l, NIC_l) + E_l        (E_l: experts, added)
    Overlap   = sum_l c_l * stage_l + max(SM_head, HBM_head) + host
    NoOverlap = T_sm + T_hbm + T_nvlink + T_nic + T_host
Padded rows contribute exactly zero, with zero gradient. Everything the step needs from
the rows is summed in one pass over them (``_walk_rows``); the rest is per layer kind.

COVERAGE LIMIT [sm-budget]: a Batch carries no SM budget, so the reference's SM derate
(SMCount / SMBudget) is always 1. KNOWN DIVERGENCE [no-ns-truncation]: times stay float
seconds; the reference truncates each resource total to integer nanoseconds before summing.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import laws
from .errors import refuse
from .numerics import Positive, below, blend, max2, min2, safe_div, smax, softmax_weights, step, sum_rows
from .plan import RESOURCES, Batch, Coefficients, Plan, _check_batch_values


class StepResult(NamedTuple):
    """Per-step prices, in seconds. ``resources`` is [sm, hbm, nvlink, nic, host]."""
    resources: jax.Array
    overlap: jax.Array
    no_overlap: jax.Array
    bottleneck: jax.Array            # index into RESOURCES (first largest)
    bottleneck_weights: jax.Array    # one-hot in exact mode, softmax of totals in smooth mode
    layers: dict | None = None       # per layer kind (x count): sm, hbm, nvlink, nic, experts, stage

    def as_dict(self) -> dict:
        """Seconds by resource, overlap, no_overlap and the bottleneck's name: floats and a str for
        one batch (``price``); NumPy arrays of the leading shape for many (``price_many`` [B],
        ``price_deployments`` [D, B]; bottleneck an array of names), where float() of an array
        raised a TypeError."""
        res = np.asarray(self.resources)
        if res.ndim > 1:
            out = {r: res[..., i] for i, r in enumerate(RESOURCES)}
            out.update(overlap=np.asarray(self.overlap), no_overlap=np.asarray(self.no_overlap),
                       bottleneck=np.asarray(RESOURCES)[np.asarray(self.bottleneck)])
            return out
        out = {r: float(res[..., i]) for i, r in enumerate(RESOURCES)}
        out.update(overlap=float(self.overlap), no_overlap=float(self.no_overlap),
                   bottleneck=RESOURCES[int(self.bottleneck)])
        return out


def _segment(values, segment_ids, n):
    """Sum per-entry values into n layer kinds (ids are static), each kind's entries added left
    to right: a matmul with a one-hot matrix sums in an order XLA picks per shape, so a
    deployment axis (a vmap) could round differently from one deployment alone."""
    ids = np.asarray(segment_ids).reshape(-1)
    out = []
    for k in range(n):
        acc = None
        for i in np.flatnonzero(ids == k):
            acc = values[..., i] if acc is None else acc + values[..., i]
        out.append(jnp.zeros(values.shape[:-1]) if acc is None else acc)
    return jnp.stack(out, axis=-1) if out else jnp.zeros(values.shape[:-1] + (0,))


def _dot(weights, x):
    """sum_i weights[i] * x[..., i] (weights [n], or [m, n] giving [..., m]), left to right
    (see _segment: a dot's order, and its use of fused multiply-adds, depend on the shape)."""
    w = jnp.asarray(weights)
    n = w.shape[-1]
    if n == 0:
        return jnp.zeros(x.shape[:-1] + w.shape[:-1])
    if w.ndim == 1:
        acc = w[0] * x[..., 0]
        for i in range(1, n):
            acc = acc + w[i] * x[..., i]
        return acc
    acc = w[:, 0] * x[..., 0, None]
    for i in range(1, n):
        acc = acc + w[:, i] * x[..., i, None]
    return acc


def _attention_laws(A):
    """The distinct read laws (window, top-k, compress ratio, sparse) among the attention
    entries, and each entry's index into them. The plan is static, so this is NumPy: the
    per-row work is done once per distinct law, with the law's parameters as constants."""
    laws_ = np.stack([A["attn_window"], A["attn_topk"], A["attn_compress"],
                      np.asarray(A["attn_sparse"], dtype=float)], axis=1).reshape(-1, 4)
    distinct, inverse = np.unique(laws_, axis=0, return_inverse=True)
    return distinct, np.asarray(inverse).reshape(-1)


def _walk_rows(A, S, batch: Batch, tau):
    """Everything the step needs from the rows, in one pass (numerics.sum_rows).

    Returns sums over the rows: tokens, prefill tokens (and decode tokens, where a recurrent
    mixer needs them), the decode, prefill and request row counts and the requests off the
    uniform decode width (for the graph choice), and per attention entry the KV positions
    decode rows read and 4x the query-key pairs of the prefill rows. Masked rows contribute
    exactly zero, with a zero gradient. The cost of a wide batch is the number of per-row
    quantities, so the four row counts travel as one exactly representable float (a field
    of ceil(log2(rows + 1)) bits each) wherever the padding allows.

    Token counts narrower than float64 are widened first (exactly). Integer token counts in
    exact mode take ``_walk_rows_integer``: the same sums, in integer arithmetic.
    """
    if tau is None and _integer_walk_ok(batch):
        return _walk_rows_integer(A, S, batch)
    mask = batch.mask
    sched = jnp.where(mask, _as_float64(batch.scheduled), 0.0)
    comp = jnp.where(mask, _as_float64(batch.computed), 0.0)
    # KNOWN DIVERGENCE [zero-token-rows]: a row scheduling 0 tokens does no attention work; the
    # reference counts one with cached context as a decode that reads it
    active = mask & (sched > 0)
    prefill = active & (sched > batch.decode_threshold)
    decode = active & ~prefill
    ctx = comp + sched
    names = ["tokens", "prefill_tokens"]
    rows = [sched, jnp.where(prefill, sched, 0.0)]
    if len(A["rec_kind"]):
        names.append("decode_tokens")
        rows.append(jnp.where(decode, sched, 0.0))
    count_names = ("n_decode", "n_prefill", "n_requests", "n_off_width")
    counts = (decode, prefill, mask, mask & (sched != S["uniform_width"]))
    base = 2.0 ** int(np.ceil(np.log2(mask.shape[-1] + 1)))
    packed = base ** len(counts) <= 2.0 ** 53
    if packed:
        names.append("packed_counts")
        rows.append(sum(jnp.where(c, base ** i, 0.0) for i, c in enumerate(counts)))
    else:
        names.extend(count_names)
        rows.extend(c.astype(float) for c in counts)
    distinct, inverse = _attention_laws(A) if len(A["attn_kind"]) else (np.zeros((0, 4)), None)
    for w, tk, cr, sp in distinct:
        rows.append(jnp.where(decode, laws.decode_read_tokens(ctx, w, tk, cr, sp > 0, tau), 0.0))
        rows.append(jnp.where(prefill, 4.0 * laws.prefill_pairs(sched, comp, w, tk, cr, sp > 0, tau), 0.0))
    sums = sum_rows(tuple(rows))
    out = dict(zip(names, sums))
    if packed:
        code = out.pop("packed_counts")
        for i, name in enumerate(count_names):
            out[name] = jnp.floor(code / base ** i) % base
    if inverse is not None:
        per_law = jnp.stack(sums[len(names):]).reshape(-1, 2)
        out["reads"], out["pairs"] = per_law[inverse, 0], per_law[inverse, 1]
    return out


def _as_float64(x):
    x = jnp.asarray(x)
    return x if x.dtype == jnp.float64 else x.astype(jnp.float64)


# Integer batches walk their rows in int64 up to this many rows: with token counts below
# plan.INT_TOKEN_LIMIT (2^24) a row's 4x prefill pairs are below 2 * (2^25)^2 = 2^51, so
# the sum of 4096 of them fits in int64.
_INTEGER_WALK_MAX_ROWS = 4096


def _integer_walk_ok(batch: Batch) -> bool:
    return (jnp.issubdtype(jnp.result_type(batch.scheduled), jnp.integer)
            and jnp.issubdtype(jnp.result_type(batch.computed), jnp.integer)
            and np.shape(batch.mask)[-1] <= _INTEGER_WALK_MAX_ROWS)


def _whole(x) -> bool:
    """An integer-valued number that int32 holds."""
    x = float(x)
    return np.isfinite(x) and x == round(x) and abs(x) < 2.0 ** 31


def _integer_law(w, tk, cr) -> bool:
    """Whether an attention read law keeps integer token counts integer (no compression,
    integer window and top-k): then its per-row reads and 4x prefill pairs are integers."""
    return cr <= 1 and _whole(w) and _whole(tk)


def _width_int(width):
    return int(float(width)) if _whole(width) else -1


def _pairs4_int(sched, comp, window):
    """4x the query-key pairs of each row's chunk (c, c + s], each query seeing at most
    ``window`` keys (<= 0: all), in int64: 4 (G(c + s) - G(c)) with G(x) = x^2/2 -
    relu(x - w)^2/2, written as products of differences (c + s)^2 - c^2 = s (2c + s)."""
    ctx = comp + sched
    total = sched.astype(jnp.int64) * (ctx + comp).astype(jnp.int64)     # int32 x int32 -> int64: one instruction
    if window > 0:
        over_new, over_old = jnp.maximum(ctx - int(window), 0), jnp.maximum(comp - int(window), 0)
        total = total - (over_new - over_old).astype(jnp.int64) * (over_new + over_old).astype(jnp.int64)
    return 2 * total


def _integer_attention_rows(distinct, sched, comp, prefill, decode):
    """Per distinct attention law j whose reads and pairs are integers (no compression:
    laws.decode_read_tokens and laws.prefill_pairs at ratio 1), its rows: decode reads and 4x
    prefill pairs in int64 (names reads{j}, pairs{j}); the other laws' indices are returned
    for the float walk (``_float_law_sums``)."""
    ctx = comp + sched
    names, rows, float_laws = [], [], []
    for j, (w, tk, cr, sp) in enumerate(distinct):
        if not _integer_law(w, tk, cr):
            float_laws.append(j)
            continue
        windowed = jnp.minimum(ctx, int(w)) if w > 0 else ctx
        selected = jnp.minimum(ctx, int(tk)) if tk > 0 else ctx
        reads = ((windowed if w > 0 else 0) + selected) if sp > 0 else windowed
        pairs = _pairs4_int(sched, comp, w)
        if sp > 0:
            pairs = (pairs if w > 0 else 0) + _pairs4_int(sched, comp, tk if tk > 0 else 0.0)   # top-k * (ratio 1)
        names += [f"reads{j}", f"pairs{j}"]
        rows += [jnp.where(decode, reads, 0).astype(jnp.int64), jnp.where(prefill, pairs, 0)]
    return names, rows, float_laws


def _float_law_sums(distinct, float_laws, sched, comp, prefill, decode) -> dict:
    """{j: (decode reads, 4x prefill pairs)} of the compressing attention laws, summed in
    float64 by ``sum_rows`` from the widened counts, as the float64 walk does."""
    fsched, fcomp = sched.astype(jnp.float64), comp.astype(jnp.float64)
    frows = []
    for j in float_laws:
        w, tk, cr, sp = distinct[j]
        frows.append(jnp.where(decode, laws.decode_read_tokens(fcomp + fsched, w, tk, cr, sp > 0, None), 0.0))
        frows.append(jnp.where(prefill, 4.0 * laws.prefill_pairs(fsched, fcomp, w, tk, cr, sp > 0, None), 0.0))
    fsums = sum_rows(tuple(frows))
    return {j: (fsums[2 * k], fsums[2 * k + 1]) for k, j in enumerate(float_laws)}


def _walk_rows_integer(A, S, batch: Batch):
    """``_walk_rows`` in exact mode for integer token counts: the same sums, in integers.

    Every per-row quantity of an integer batch is an integer (4x the prefill pairs too),
    except the reads and pairs of a compressing attention law, so they are summed in int64,
    exactly and in any order: XLA vectorises the pass, where a float64 sum must run row
    after row. Per row the counts stay int32 (below plan.INT_TOKEN_LIMIT, 2^24, and contexts
    below 2^25), eight to a vector register, and only the sums and the pair products are
    int64. The float64 walk sums the same integers exactly while its partial sums stay below
    2^53 (every realistic batch: counts below 2^21 at 256 rows), so the two agree bit for bit
    there. A compressing law's rows are summed by ``sum_rows`` from the widened counts, as
    the float64 walk does.
    """
    i32, i64 = jnp.int32, jnp.int64
    mask = batch.mask
    sched = jnp.where(mask, batch.scheduled.astype(i32), 0)
    comp = jnp.where(mask, batch.computed.astype(i32), 0)
    # s > thr for an integer s is s > floor(thr); NaN compares false (never a prefill)
    thr = jnp.asarray(batch.decode_threshold, dtype=jnp.float64)
    top = float(np.iinfo(np.int32).max)
    thr_i = jnp.where(jnp.isnan(thr), top, jnp.clip(jnp.floor(thr), -1.0, top)).astype(i32)
    active = mask & (sched > 0)
    prefill = active & (sched > thr_i[..., None])
    decode = active & ~prefill

    def wide(x):
        return x.astype(i64)

    names = ["tokens", "prefill_tokens"]
    rows = [wide(sched), wide(jnp.where(prefill, sched, 0))]
    if len(A["rec_kind"]):
        names.append("decode_tokens")
        rows.append(wide(jnp.where(decode, sched, 0)))
    # the uniform width as an int (-1, which no row schedules, where it is not a whole number)
    width = S["uniform_width_int"] if "uniform_width_int" in S else _width_int(S["uniform_width"])
    off_width = mask & (sched != width)
    bits = int(np.ceil(np.log2(mask.shape[-1] + 1)))
    count_names = ("n_decode", "n_prefill", "n_requests", "n_off_width")
    counts = (decode, prefill, mask, off_width)
    names.append("packed_counts")
    rows.append(sum(c.astype(i64) << (bits * i) for i, c in enumerate(counts)))

    distinct, inverse = _attention_laws(A) if len(A["attn_kind"]) else (np.zeros((0, 4)), None)
    law_names, law_rows, float_laws = _integer_attention_rows(distinct, sched, comp, prefill, decode)
    names += law_names
    rows += law_rows
    sums = jax.lax.reduce(tuple(rows), tuple(jnp.zeros((), i64) for _ in rows),
                          lambda a, b: tuple(x + y for x, y in zip(a, b)), (rows[0].ndim - 1,))
    ints = dict(zip(names, sums))
    code = ints.pop("packed_counts")
    out = {n: v.astype(jnp.float64) for n, v in ints.items() if not n.startswith(("reads", "pairs"))}
    for i, name in enumerate(count_names):
        out[name] = ((code >> (bits * i)) & ((1 << bits) - 1)).astype(jnp.float64)
    if inverse is None:
        return out
    per_law = {j: (ints[f"reads{j}"].astype(jnp.float64), ints[f"pairs{j}"].astype(jnp.float64))
               for j in range(len(distinct)) if j not in float_laws}
    if float_laws:
        per_law.update(_float_law_sums(distinct, float_laws, sched, comp, prefill, decode))
    stacked = jnp.stack([x for j in range(len(distinct)) for x in per_law[j]]).reshape(-1, 2)
    out["reads"], out["pairs"] = stacked[inverse, 0], stacked[inverse, 1]
    return out


def step_time(plan: Plan, coefs: Coefficients, batch: Batch, tau=None, breakdown: bool = False) -> StepResult:
    """Price one padded batch: exact mode for ``tau=None``, smooth mode for a float tau >= 0.

    Temperature 0 is exact mode, bit for bit: see ``exact_at_zero``. Use ``jax.vmap`` for
    many batches (or ``price_many``, which branches outside its vmap and traces faster).
    """
    check_pricing_args(plan, coefs, batch, rank=1)      # shapes only: tracers pass
    check_flags(breakdown=breakdown)
    return exact_at_zero(lambda t: _step_time(plan, coefs, batch, t, breakdown), tau)


def exact_at_zero(kernel, tau):
    """``kernel(None)`` (exact mode) for tau None, else ``kernel(tau)`` if tau > 0 and
    ``kernel(None)`` at tau == 0, as a ``lax.cond``.

    Branching to the exact kernel's own computation is what makes temperature 0 reproduce
    exact mode bit for bit: selecting the exact values inside one fused smooth graph does
    not, since XLA's algebraic rewrites and FMA contraction depend on the surrounding graph.
    A cond under vmap over an unbatched tau stays a branch but retraces both branches, so
    wrap the vmapped computation where possible. Over a batched tau it becomes a select.
    A concrete tau (a Python or NumPy number) takes its branch while tracing.
    """
    if tau is None:
        return kernel(None)
    if not isinstance(tau, jax.core.Tracer) and np.ndim(tau) == 0:
        value = float(tau)           # known now: take the branch while tracing
        if not value >= 0:
            refuse("must be None (exact mode) or a number >= 0", field="temperature", value=value)
        return kernel(None) if value == 0 else kernel(Positive(jnp.asarray(value)))
    tau = jnp.asarray(tau, dtype=float)
    return jax.lax.cond(tau > 0, lambda: kernel(Positive(tau)), lambda: kernel(None))


def row_sums(plan: Plan, batch: Batch, tau=None) -> dict:
    """Everything the step needs from a batch's rows, as sums (``_walk_rows``): tokens,
    prefill_tokens (decode_tokens with recurrent mixers), n_decode, n_prefill, n_requests,
    n_off_width, and per attention entry reads and pairs. ``step_time_from_sums`` prices them;
    the serving simulation (schedule.py) builds these sums per step without materialising rows."""
    from .stack import folded_view
    view = folded_view(plan)
    return _walk_rows(view.A, view.S, batch, tau)


def step_time_from_sums(plan: Plan, coefs: Coefficients, sums: dict, tau=None) -> StepResult:
    """``step_time`` of a batch given its ``row_sums`` (no rows): the same composition."""
    return exact_at_zero(lambda t: _step_time(plan, coefs, None, t, False, sums=sums), tau)


def _step_time(plan: Plan, coefs: Coefficients, batch: Batch, tau, breakdown: bool, sums=None) -> StepResult:
    """The kernel on one plan, its values constants (static under an enclosing jit)."""
    from .stack import folded_roles, folded_view
    return _kernel(folded_view(plan), folded_roles(plan, coefs), batch, tau, breakdown, sums=sums)


class _Step(NamedTuple):
    """What every stage of one step's pricing reads: the plan's view (A arrays, S scalars, CF
    coefficient slots, K kinds), the coefficient reader C(slot) and vec(slots), the temperature,
    the batch's token count, the phase gates [always, prefill present], and the rates (HBM
    bandwidth, each arithmetic class's peak, its ramped efficiency at this token count)."""
    A: dict
    S: dict
    CF: dict
    K: int
    C: Callable
    vec: Callable
    tau: object
    walk: dict
    tokens: object
    phase_on: object
    bandwidth: object
    peaks: object
    eps: object

    def arithmetic(self, flops, cls):
        return laws.gemm_time(flops, self.peaks[cls], self.eps[cls])


def _kernel(view, roles_vector, batch: Batch, tau, breakdown: bool, sums=None) -> StepResult:
    """Price one padded batch from a plan's view (stack.View: its values constants, or traced
    for the deployment axis) and its role vector (the coefficient each role slot reads): every
    layer's terms per resource (SM, HBM, NVLink, NIC) by stage, then their composition."""
    A, S, CF, K = view.A, view.S, view.CF, view.K

    def C(slot):
        return roles_vector[..., slot] if slot is not None else jnp.zeros(())

    def vec(names):
        return jnp.stack([C(n) for n in names]) if len(names) else jnp.zeros((0,))

    # ---- batch walk: one pass over the rows; masked rows are exactly zero
    walk = _walk_rows(A, S, batch, tau) if sums is None else sums
    tokens = walk["tokens"]
    phase_on = jnp.stack([jnp.ones(()), (walk["n_prefill"] > 0).astype(float)])   # [always, prefill-only]
    bandwidth = laws.achieved_bandwidth(S["hbm_peak_tbs"], C(CF["hbm_derate"]))
    roles = [dict(r) for r in CF["classes"]]
    eps = laws.ramp(tokens, vec([r["eps_max"] for r in roles]), vec([r["m_half"] for r in roles]))
    st = _Step(A, S, CF, K, C, vec, tau, walk, tokens, phase_on, bandwidth, jnp.asarray(A["class_peak"]), eps)

    sm = _dense_gemm_sm(st, vec([r["n_half"] for r in roles]), vec([r["k_half"] for r in roles]))
    hbm = _weight_hbm(st)
    if len(A["attn_kind"]):
        attn_sm, attn_hbm = _attention_terms(st)
        hbm = hbm + attn_hbm
        sm = sm + attn_sm
    if len(A["rec_kind"]):
        sm = sm + _recurrent_sm(st)
    if len(A["mhc_kind"]):
        mhc_sm, mhc_hbm = _mhc_terms(st)
        hbm = hbm + mhc_hbm
        sm = sm + mhc_sm
    expert_sm, expert_hbm = _expert_terms(st) if S["has_moe"] else (jnp.zeros(K), jnp.zeros(K))
    nvlink, nic = _collective_terms(st)
    return _compose(st, sm, hbm, nvlink, nic, expert_sm, expert_hbm, breakdown)


def _dense_gemm_sm(st: _Step, n_half, k_half):
    """Dense GEMMs -> SM per layer kind: flops / (peak x ramped efficiency x shape factors)."""
    A = st.A
    g_cls = A["gemm_class"]
    g_eff = st.eps[g_cls] * laws.shape_factor(A["gemm_n"], n_half[g_cls]) * laws.shape_factor(A["gemm_k"], k_half[g_cls])
    g_time = laws.gemm_time(st.tokens * A["gemm_flops"], st.peaks[g_cls], g_eff) * st.phase_on[A["gemm_phase"]]
    return _segment(g_time, A["gemm_kind"], st.K)


def _weight_hbm(st: _Step):
    """HBM per layer kind: the weights read once per step, elementwise traffic per token."""
    weight_bytes = st.phase_on @ st.A["weight_bytes"]
    elementwise = st.tokens * (st.phase_on @ st.A["elementwise_bytes"])
    return laws.read_time(weight_bytes + elementwise, st.bandwidth)


def _attention_terms(st: _Step):
    """Attention per layer kind, (SM, HBM): decode reads the KV cache (floor + bytes / rate),
    prefill is the measured model form where every term is present, else arithmetic at the
    BF16 ramp; a mixed batch of a one-launch (FlashAttention) layer pays one floor."""
    A, S, CF, C, vec, tau, walk = st.A, st.S, st.CF, st.C, st.vec, st.tau, st.walk
    has_decode, has_prefill = walk["n_decode"] > 0, walk["n_prefill"] > 0
    reads, pairs = walk["reads"], walk["pairs"]
    bf16 = S["bf16_class"]
    dec_floor = vec([f for f, _ in CF["attn_dec"]])
    dec_rate = jnp.where(A["attn_dec_rate_given"], vec([r for _, r in CF["attn_dec"]]), st.bandwidth)
    kv_bytes = reads * A["attn_bytes_per_token"]
    attn_hbm = jnp.where(has_decode, dec_floor + safe_div(kv_bytes, dec_rate), 0.0)
    flops = pairs * A["attn_flops_per_pair"]
    pre_floor, pre_scale = C(CF["attn_pre_floor"]), C(CF["attn_pre_scale"])
    scale = jnp.where(A["attn_secondary"] | ~jnp.asarray(S["attn_pre_scale_given"]), 1.0, pre_scale)
    floor = jnp.where(A["attn_secondary"], 0.0, pre_floor)
    arith = floor + laws.gemm_time(flops, st.peaks[bf16], st.eps[bf16] * scale)
    forms = CF["attn_pre_form"]
    has_form = np.array([f is not None for f in forms])
    if has_form.any():
        f_floor, f_req, f_tok, f_rate = (vec([f[i] if f else None for f in forms]) for i in range(4))
        measured = f_floor + f_req * walk["n_prefill"] + f_tok * walk["prefill_tokens"] + \
            safe_div(pairs / 4.0 * A["attn_bytes_per_token"], f_rate)
        arith = jnp.where(has_form, measured, arith)
    attn_sm = jnp.where(has_prefill, arith, 0.0)
    mixed = A["attn_one_launch"] & has_decode & has_prefill
    drop_decode = below(dec_floor, pre_floor, tau)      # the smaller one (1 or 0 in exact mode)
    attn_hbm = attn_hbm - jnp.where(mixed, drop_decode * dec_floor, 0.0)
    attn_sm = attn_sm - jnp.where(mixed, (1.0 - drop_decode) * pre_floor, 0.0)
    on = st.phase_on[A["attn_phase"]]
    return _segment(attn_sm * on, A["attn_kind"], st.K), _segment(attn_hbm * on, A["attn_kind"], st.K)


def _recurrent_sm(st: _Step):
    """Recurrent mixers -> SM per layer kind: measured floor + rate forms for decode (each decode
    token a rec_dec_scale share of the fitted one's time: resolve._decode_token_scale) and
    prefill, else (prefill) vLLM's chunked scan as arithmetic at the BF16 ramp."""
    A, CF, C, walk = st.A, st.CF, st.C, st.walk
    has_decode, has_prefill = walk["n_decode"] > 0, walk["n_prefill"] > 0
    rec = []
    for i, (dec, pre) in enumerate(zip(CF["rec_dec"], CF["rec_pre"])):
        t = laws.floor_plus_rate(has_decode, C(dec[0]), walk.get("decode_tokens") * A["rec_dec_scale"][i],
                                 C(dec[1])) if dec else jnp.zeros(())
        if pre:
            t = t + laws.floor_plus_rate(has_prefill, C(pre[0]), walk["prefill_tokens"], C(pre[1]))
        else:
            t = t + st.arithmetic(walk["prefill_tokens"] * A["rec_scan_flops"][i], A["rec_scan_class"][i])
        rec.append(t)
    return _segment(jnp.stack(rec) * st.phase_on[A["rec_phase"]], A["rec_kind"], st.K)


def _mhc_terms(st: _Step):
    """mHC hyper-connections per layer kind, (SM, HBM): the measured form, else memory traffic
    plus the mixing GEMM."""
    A, C = st.A, st.C
    m_hbm, m_sm = [], []
    for i, form in enumerate(st.CF["mhc_form"]):
        nbytes = st.tokens * A["mhc_bytes_per_token"][i]
        if form:
            m_hbm.append(C(form[0]) + safe_div(nbytes, C(form[1])))
            m_sm.append(jnp.zeros(()))
        else:
            m_hbm.append(laws.read_time(nbytes, st.bandwidth))
            m_sm.append(st.arithmetic(st.tokens * A["mhc_mix_flops"][i], A["mhc_mix_class"][i]))
    on = st.phase_on[A["mhc_phase"]]
    return _segment(jnp.stack(m_sm) * on, A["mhc_kind"], st.K), _segment(jnp.stack(m_hbm) * on, A["mhc_kind"], st.K)


def _expert_terms(st: _Step):
    """Routed experts per layer kind, (SM, HBM), added to the stage rather than overlapped:
    the routed arithmetic (times the imbalance) and the reads of the distinct experts touched.
    Routed tokens (tokens x funnel) and the plan-only factors are multiplied in NumPy
    (stack._derived): XLA reassociates a product of two constants, a traced plan not."""
    A, CF = st.A, st.CF
    imb = st.C(CF["moe_imbalance"]) if CF["moe_imbalance"] is not None else 1.0
    e_cls = A["expert_class"]
    expert_sm = laws.gemm_time(st.tokens * A["expert_routed_flops"] * imb, st.peaks[e_cls], st.eps[e_cls])
    share = _experts_touched_share(st.tokens, A["expert_miss_on"], A["expert_routed_log_miss"],
                                   st.S["experts_per_rank"])
    return expert_sm, laws.read_time(A["expert_local_bytes"] * share, st.bandwidth)


def _collective_terms(st: _Step):
    """Collectives per layer kind, (NVLink, NIC): every launch pays its own floor."""
    A = st.A
    rows = st.CF["coll"]
    given = A["coll_given"]
    floors, trans, peak_rates = (st.vec([r[i] for r in rows]) for i in range(3))
    per_launch = laws.collective_time(st.tokens * A["coll_bytes_per_token"], floors, trans,
                                      jnp.where(given, peak_rates, 1.0), st.tau)
    per_launch = jnp.where(given, per_launch, 0.0)
    launches = jnp.einsum("p,pkc->kc", st.phase_on, jnp.asarray(A["launches"]))
    nic_mask = A["coll_nic"]
    return _dot(launches, jnp.where(nic_mask, 0.0, per_launch)), _dot(launches, jnp.where(nic_mask, per_launch, 0.0))


def _compose(st: _Step, sm, hbm, nvlink, nic, expert_sm, expert_hbm, breakdown: bool) -> StepResult:
    """The step from its per-layer-kind terms: each kind's count times its terms plus the head
    and the host, per resource (NoOverlap: their sum; Overlap: per layer the largest resource
    plus the experts, no more than NoOverlap). An empty step runs no device work."""
    A, S, tau, tokens = st.A, st.S, st.tau, st.tokens
    nonempty = tokens > 0
    gate = nonempty.astype(float)
    sm, hbm, nvlink, nic = sm * gate, hbm * gate, nvlink * gate, nic * gate
    expert_sm, expert_hbm = expert_sm * gate, expert_hbm * gate
    count = jnp.asarray(A["count_scaled"])
    stage = smax(jnp.stack([sm, hbm, nvlink, nic], axis=-1), tau) + expert_sm + expert_hbm
    head_sm = gate * st.arithmetic(tokens * S["head_flops"], S["head_class"])
    head_hbm = gate * laws.read_time(S["head_weight_bytes"], st.bandwidth)
    head = max2(head_sm, head_hbm, tau)
    host = _host_time(S, st.CF, st.C, st.walk, tokens, nonempty, st.walk["n_prefill"] > 0, tau)
    totals = jnp.stack([_dot(count, sm + expert_sm) + head_sm, _dot(count, hbm + expert_hbm) + head_hbm,
                        _dot(count, nvlink), _dot(count, nic), host])
    # left to right, not a reduce: XLA may split a reduce differently from program to program,
    # and exact mode must equal smooth mode at temperature 0 bit for bit
    no_overlap = totals[0] + totals[1] + totals[2] + totals[3] + totals[4]
    overlap = min2(_dot(count, stage) + head + host, no_overlap, tau)
    layers = None
    if breakdown:
        layers = {"sm": count * sm, "hbm": count * hbm, "nvlink": count * nvlink, "nic": count * nic,
                  "expert_sm": count * expert_sm, "expert_hbm": count * expert_hbm, "stage": count * stage,
                  "head_sm": head_sm, "head_hbm": head_hbm}
    return StepResult(totals, overlap, no_overlap, jnp.argmax(totals), softmax_weights(totals, tau), layers)


def _experts_touched_share(tokens, miss_on, routed_log_miss, experts_local):
    """laws.experts_touched over the local experts L: 1 - miss^(f n) for f n routed tokens,
    with the plan-only part f log(miss) (stack._derived) computed once in NumPy; 0 for no
    tokens or no local experts. The expert bytes carry the factor L."""
    n = jnp.asarray(tokens, dtype=float)
    frac = 1.0 - jnp.where(miss_on, jnp.exp(n * routed_log_miss), 0.0)
    return jnp.where((n > 0) & (experts_local > 0), frac, 0.0)


def _host_time(S, CF, C, walk, tokens, nonempty, has_prefill, tau):
    """CPU time of the step: graph replays or eager launches, plus per-kernel dispatch."""
    replay, eager_layer, per_kernel = C(CF["replay"]), C(CF["eager_layer"]), C(CF["per_kernel"])
    n_requests = walk["n_requests"]
    uniform = (n_requests > 0) & (walk["n_off_width"] == 0)
    use_decode_mode = (n_requests == 0) | uniform
    mode = jnp.where(use_decode_mode, S["decode_mode"], S["other_mode"])        # 0 full, 1 piecewise, 2 eager
    # KNOWN DIVERGENCE [eager-per-layer]: eager launching costs host_launch_eager_per_layer per
    # layer, as the reference and its registry (no per-kernel eager coefficient); the spec's
    # words are "at the eager launch cost per kernel". Dispatch per kernel is added below.
    eager = eager_layer * S["total_layers"]
    captured = jnp.where(mode == 0, replay, replay * S["segments"])
    past_ceiling = step(tokens, S["capture_tokens"], tau)
    # past the largest captured size the step runs eager, but never cheaper than captured
    # (KNOWN DIVERGENCE [never-cheaper-than-captured]: the reference has no such clamp)
    graph_host = jnp.where(mode == 2, eager, blend(captured, max2(eager, captured, tau), past_ceiling))
    dispatch = per_kernel * (S["kernels"] + has_prefill * S["kernels_prefill"]) * nonempty
    host = graph_host + dispatch
    if S["drafter"]:
        layers = S["drafter_layers"]
        d_eager = eager_layer * layers
        if S["drafter_parallel_block"]:
            # own graphs, captured only under a FULL decode mode, rows num_spec_tokens wide
            fits = n_requests * S["drafter_width"] <= S["capture_tokens"]
            captured_d = (S["decode_mode"] == 0) & fits
            # past its ceiling it launches eagerly, but never cheaper than its replay
            full = S["decode_mode"] == 0
            past_d = (max2(d_eager, replay, tau) if full else d_eager) if isinstance(full, bool) else \
                jnp.where(full, max2(d_eager, replay, tau), d_eager)
            d_host = jnp.where(captured_d, replay, past_d) + has_prefill * d_eager
        else:
            d_captured = jnp.where(mode == 0, replay, replay * S["drafter_segments"])
            d_past = max2(d_eager, d_captured, tau)        # never cheaper than captured, as the target
            d_host = S["drafter_passes"] * jnp.where(mode == 2, d_eager, blend(d_captured, d_past, past_ceiling))
        d_dispatch = per_kernel * S["drafter_passes"] * (S["drafter_kernels"] + has_prefill * S["drafter_kernels_prefill"])
        host = host + (d_host + d_dispatch) * nonempty
    return host


def _kernel_one(view_of, values, roles_vector, batch: Batch, tau, breakdown: bool) -> StepResult:
    """``_kernel`` for ONE batch (price()'s path; ``view_of(values)`` the plan's view), its
    scalar tail after the row walk inside a ``lax.cond`` whose two branches are the same
    function, on a predicate XLA cannot fold (true).

    Why: XLA:CPU's thunk executor hands thunks to its thread pool whenever more than 8 are ready
    at once, and the tail is dozens of tiny independent fusions; waking pool threads for them
    cost about 40 us a call (median 105 us against 66 us, DeepSeek-V3, 256 rows, constant-folded
    plan). A branch of small buffers runs sequentially in the calling thread. Same values bit for
    bit; KNOWN DIVERGENCE [single-call-grad-ulps]: coefficient gradients to 2 ulps (XLA sums the
    role gather's cotangents in another order; tests/test_deployment_axis.py). The predicate is
    unbatched, so a vmap of price() still runs one branch."""
    view = view_of(values)
    sums = _walk_rows(view.A, view.S, batch, tau)
    tail = lambda s, v, r: _kernel(view_of(v), r, None, tau, breakdown, sums=s)     # noqa: E731
    return jax.lax.cond(jax.lax.optimization_barrier(jnp.bool_(True)), tail, tail, sums, values, roles_vector)


@functools.partial(jax.jit, static_argnames=("plan", "smooth", "breakdown"))
def _price_jit(plan, coefs, batch, tau, smooth, breakdown):
    from .stack import folded_roles, folded_view
    return exact_at_zero(lambda t: _kernel_one(lambda _: folded_view(plan), None, folded_roles(plan, coefs), batch, t,
                                               breakdown), tau if smooth else None)


# The largest smooth-mode temperature (the commands' --temperature cap too): up to 1 the power-mean
# surrogates stay within their documented bounds (numerics: smax <= sum for tau <= 1); past it the smooth surrogates leave their bounds and the price is meaningless (at 10 a 9.7 ms
# step priced 0.9 s; at 1e300, inf); 0.01 to 0.1 is typical.
MAX_TEMPERATURE = 1.0


def temperature_arg(temperature):
    """(smooth, tau) for the jitted entry points: exact mode (None) is (False, None); otherwise
    tau is a Python float or a traced array, traced either way, so a new temperature never
    recompiles. Refuses a concrete temperature that is not a number in [0, MAX_TEMPERATURE]
    (a string, a bool, an array of several); a traced one passes unchecked."""
    if temperature is None:
        return False, None         # no argument at all: even a Python float is a device transfer a call
    if not isinstance(temperature, jax.core.Tracer):
        kind = getattr(temperature, "dtype", None)
        kind = np.dtype(kind).kind if kind is not None else \
            "f" if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) else "?"
        if kind not in "iuf" or np.ndim(temperature) != 0:
            refuse("must be None (exact mode) or one number >= 0", field="temperature",
                   value=temperature if np.ndim(temperature) == 0 else f"shape {np.shape(temperature)}",
                   has_value=True)
        t = float(temperature)
        if not (np.isfinite(t) and t >= 0):
            refuse("must be None (exact mode) or a finite number >= 0", field="temperature",
                   value=temperature, has_value=True)
        if t > MAX_TEMPERATURE:
            refuse(f"must be at most {MAX_TEMPERATURE:g} (past it the smooth surrogates leave their bounds and "
                   "the price is meaningless; 0.01 to 0.1 is typical)", field="temperature", value=temperature,
                   has_value=True)
        return True, t
    return True, jnp.asarray(temperature, dtype=float)


def check_flags(**flags):
    """Boolean switches (breakdown, fold): "no" or 0.0 would silently read as their truth value."""
    for name, v in flags.items():
        if not isinstance(v, (bool, np.bool_)):
            refuse("must be True or False", field=name, value=v, has_value=True)


def check_pricing_args(plan, coefs, batch, *, rank, field="batch", sets=False):
    """Refuse, in one line and before jit, what the pricing entry points cannot price: a plan
    that is not a Plan (a Deployment: its ``.plan``), coefficients that are not Coefficients,
    a batch that is not a Batch of ``rank`` (1: one batch [rows]; 2: stacked [batches, rows])
    with fields of matching shapes and dtypes. Shapes and dtypes are static, so tracers are
    checked too; batch values where Batch() or a builder did not check them (one rebuilt by
    jax.tree_util.tree_map: ``check_batch_shape``, once, on concrete values), coefficient values
    once per vector and plan (a few isinstance, shape and dtype reads: a microsecond or so).
    ``sets``: the coefficients may be stacked sets [sets, names] (price_coefficient_sets)."""
    if not isinstance(plan, Plan):
        hint = "; give deployment.plan" if isinstance(getattr(plan, "plan", None), Plan) else ""
        refuse(f"needs a Plan (load_deployment(...).plan){hint}", field="plan", value=type(plan).__name__)
    if not isinstance(coefs, Coefficients):
        hint = "; give deployment.coefficients" if isinstance(getattr(coefs, "coefficients", None), Coefficients) \
            else ""
        refuse(f"needs a Coefficients (load_deployment(...).coefficients){hint}", field="coefs",
               value=type(coefs).__name__)
    shape = getattr(coefs.values, "shape", None)
    if not sets and shape is not None and len(shape) > 1:
        # stacked sets [sets, names] (stack_coefficients) died in a broadcasting error inside the kernel
        refuse(f"stacks {shape[0]} coefficient sets: this prices ONE set (values [names]); for several, "
               "price_coefficient_sets, or jax.vmap over the stacked Coefficients", field="coefs.values",
               value=tuple(shape), has_value=True)
    check_coefficient_values(coefs, plan)
    check_batch_shape(batch, rank=rank, field=field)


def check_coefficient_values(coefs, plan):
    """Coefficients built by hand (``Coefficients(values, names)``): one value per name (a
    shorter vector read past its end silently, a longer one ignored its tail), and each value
    the plan reads a finite number >= 0 (a NaN priced NaN, a negative rate a negative time; a
    name it does not read may hold anything, e.g. the NaN of a union-stacked row). The shape is
    static, so a traced vector is checked too; concrete values once per vector and plan (a few
    names: microseconds), remembered on the Coefficients so a repeated price() pays nothing."""
    v = coefs.values
    shape = getattr(v, "shape", None)
    shape = tuple(shape) if shape is not None else np.shape(v)
    if not shape or shape[-1] != len(coefs.names):
        refuse(f"holds {shape[-1] if shape else 'a single'} value(s) per set for its {len(coefs.names)} names: one "
               "value per name", field="coefs.values", value=shape, has_value=True)
    checked = coefs.__dict__.setdefault("_checked_for", {})
    if isinstance(v, jax.core.Tracer) or checked.get(plan.digest) is v:
        return
    reads = plan.__dict__.setdefault("_reads", {})
    idx = reads.get(coefs.names)
    if idx is None:
        from .stack import role_index, split_plan
        r = role_index(split_plan(plan).slot_names, coefs.names)     # refuses a name the set lacks
        idx = reads[coefs.names] = np.unique(r[r < len(coefs.names)])
    arr = np.asarray(v)
    if arr.dtype.kind not in "iuf":
        refuse(f"must be numbers (SI units), got {arr.dtype.name}", field="coefs.values")
    sub = arr[..., idx]
    bad = ~np.isfinite(sub) | (sub < 0)
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        refuse("must be a finite number >= 0 (SI units)", field=f"coefs[{coefs.names[idx[i % len(idx)]]}]",
               value=sub.reshape(-1)[i].item(), has_value=True)
    checked[plan.digest] = v


def _shape_of(x, field, name):
    """x.shape (an array's or a tracer's: a tuple, cheap), else NumPy's; a Python list is refused
    (jit cannot take one)."""
    s = getattr(x, "shape", None)
    if s is None:
        if isinstance(x, (list, tuple)):
            refuse("is a Python list; build batches with Batch.from_requests (padded arrays)", field=f"{field}.{name}")
        s = np.shape(x)
    return s if type(s) is tuple else tuple(s)


def check_batch_shape(batch, *, rank, field="batch"):
    """A Batch whose token counts have ``rank`` dimensions (the last the rows), its fields agreeing."""
    if not isinstance(batch, Batch):
        refuse("needs a Batch (Batch.from_requests, Batch.decode; Batch.stack for many)", field=field,
               value=type(batch).__name__)
    try:                        # the usual case, arrays of agreeing shapes: a few attribute reads
        shape = batch.scheduled.shape
        if (len(shape) == rank and batch.computed.shape == shape and batch.prompt_len.shape == shape
                and batch.mask.shape == shape and batch.decode_threshold.shape == shape[:-1]):
            _check_batch_dtypes(batch, field)
            _check_rebuilt_batch_values(batch)
            return
    except AttributeError:      # a Python number or list among the fields: the checks below say which
        pass
    shape = _shape_of(batch.scheduled, field, "scheduled")
    if len(shape) != rank:
        what = "one batch [rows] (Batch.stack makes [batches, rows] for price_many)" if rank == 1 else \
            "stacked batches [batches, rows], a leading batch axis (Batch.stack; price() takes one batch)"
        refuse(f"needs {what}; got token counts of shape {shape}", field=field, value=shape, has_value=True)
    for name in ("computed", "prompt_len", "mask"):
        s = _shape_of(getattr(batch, name), field, name)
        if s != shape:
            refuse(f"has shape {s}, scheduled {shape}", field=f"{field}.{name}")
    s = _shape_of(batch.decode_threshold, field, "decode_threshold")
    if s != shape[:-1]:
        refuse(f"has shape {s}; one per batch is {shape[:-1]}",
               field=f"{field}.decode_threshold")
    _check_batch_dtypes(batch, field)
    _check_rebuilt_batch_values(batch)


def _check_rebuilt_batch_values(batch):
    """A concrete Batch that skipped the constructor's value checks (jax.tree_util.tree_map
    rebuilds one without them: a NaN count priced NaN) has its token counts checked here, once
    (an O(rows) NumPy pass, ~50 us at 256 rows on two cores), then remembered; one built by
    Batch(), from_requests, decode, stack or random_batches pays a dict read. Tracers are
    never read (plan._check_batch_values skips them)."""
    seen = batch.__dict__
    if seen.get("_values_checked"):
        return
    _check_batch_values(batch)
    seen["_values_checked"] = True


def _check_batch_dtypes(batch, field):
    """Token counts and the threshold of a numeric dtype, the mask boolean (a float mask or string
    counts died inside jit with a TypeError). Dtypes are static: tracers are checked too."""
    seen = batch.__dict__
    if seen.get("_dtypes_checked"):     # a Batch is frozen: checked once (a jax dtype read is ~0.4 us)
        return
    try:                        # the usual case: five attribute reads
        if (batch.mask.dtype.kind == "b" and batch.scheduled.dtype.kind in "iuf" and batch.computed.dtype.kind
                in "iuf" and batch.prompt_len.dtype.kind in "iuf" and batch.decode_threshold.dtype.kind in "iuf"):
            seen["_dtypes_checked"] = True
            return
    except AttributeError:      # a Python number among the fields
        pass
    for name in ("scheduled", "computed", "prompt_len", "decode_threshold", "mask"):
        x = getattr(batch, name)
        dt = getattr(x, "dtype", None)
        dt = np.dtype(dt) if dt is not None else np.asarray(x).dtype
        if name == "mask" and dt.kind != "b":
            refuse(f"must be booleans (True on a request's row), got dtype {dt.name}", field=f"{field}.mask")
        if name != "mask" and dt.kind not in "iuf":
            refuse(f"must be numbers, got dtype {dt.name}", field=f"{field}.{name}")


def _traced_args(plan: Plan, coefs: Coefficients, chunked=False):
    """(Structure, values on the device, role index on the device) of a plan, for a
    coefficient vector with ``coefs.names`` (cached on the plan). ``chunked``: the values as
    ``stack.value_chunks`` (price()'s single-batch path, see ``_kernel_one``)."""
    from .stack import role_index, split_plan, value_chunks
    cache = plan.__dict__.get("_traced")
    if cache is None:
        cache = {}
        object.__setattr__(plan, "_traced", cache)
    hit = cache.get((coefs.names, chunked))
    if hit is None:
        split = split_plan(plan)
        # concrete arrays even when price() is called under a caller's jax.jit: a traced one
        # cached here leaked into every later call (UnexpectedTracerError)
        with jax.ensure_compile_time_eval():
            if chunked not in cache:
                cache[chunked] = tuple(map(jnp.asarray, value_chunks(split.values))) if chunked else \
                    jnp.asarray(split.values)
            hit = cache[(coefs.names, chunked)] = (split.structure, cache[chunked],
                                                   jnp.asarray(role_index(split.slot_names, coefs.names)))
    return hit


def _batched_kernel(structure, values, index, coef_values, batches, tau, breakdown):
    """The kernel over stacked batches for one plan's traced values (stack.Structure static):
    the body of price_many and of each deployment of stack.price_deployments."""
    from .stack import role_values, traced_view
    view = traced_view(structure, values)
    rv = role_values(coef_values, index)
    return jax.vmap(lambda b: _kernel(view, rv, b, tau, breakdown))(batches)


@functools.partial(jax.jit, static_argnames=("structure", "smooth", "breakdown"))
def _price_traced(structure, values, index, coef_values, batch, tau, smooth, breakdown):
    from .stack import _note_compile, role_values, traced_view
    _note_compile()
    return exact_at_zero(lambda t: _kernel_one(functools.partial(traced_view, structure), values,
                                               role_values(coef_values, index), batch, t, breakdown),
                         tau if smooth else None)


@functools.partial(jax.jit, static_argnames=("structure", "smooth", "breakdown"))
def _price_many_traced(structure, values, index, coef_values, batches, tau, smooth, breakdown):
    from .stack import _note_compile
    _note_compile()
    return exact_at_zero(lambda t: _batched_kernel(structure, values, index, coef_values, batches, t, breakdown),
                         tau if smooth else None)


def price(plan: Plan, coefs: Coefficients, batch: Batch, *, temperature=None, breakdown=False,
          fold=False) -> StepResult:
    """Price one padded batch, jit-compiled once per plan STRUCTURE (stack.Structure: every
    deployment of one model graph shares it), padding and mode: the plan's values are traced.

    temperature: None for exact mode; a float >= 0 for smooth mode (0 reproduces exact).
    fold: compile per plan instead, its values constants: for one deployment priced many times
    the faster call (XLA drops what the constants make dead; experiments/bench.py prints both
    paths' warm call and compile side by side), at a compile per deployment. Equal up to XLA's
    rewrites of constant subexpressions, a few ulps (tests/test_deployment_axis.py).
    """
    check_pricing_args(plan, coefs, batch, rank=1)
    check_flags(breakdown=breakdown, fold=fold)
    smooth, tau = temperature_arg(temperature)
    if fold:
        return _price_jit(plan, coefs, batch, tau, smooth, breakdown)
    structure, values, index = _traced_args(plan, coefs, chunked=True)
    return _price_traced(structure, values, index, coefs.values, batch, tau, smooth, breakdown)


@functools.partial(jax.jit, static_argnames=("plan", "smooth"))
def _price_many_jit(plan, coefs, batches, tau, smooth):
    return exact_at_zero(lambda t: jax.vmap(lambda b: _step_time(plan, coefs, b, t, False))(batches),
                         tau if smooth else None)


def price_many(plan: Plan, coefs: Coefficients, batches: Batch, *, temperature=None, fold=False) -> StepResult:
    """Price a stack of batches of one padding (leading axis) in one vmapped call, compiled
    once per plan structure (as ``price``; ``fold``: once per plan, its values constants).
    ``stack.price_deployments`` prices many deployments in one call, each as here (bit for bit).
    Each batch's price equals ``jax.vmap(price)``'s bit for bit, and a Python loop of ``price()``
    to an ulp (the vmapped kernel may contract a sum differently: 2 of 200 random DeepSeek-V3
    batches 1 ulp apart)."""
    check_pricing_args(plan, coefs, batches, rank=2, field="batches")
    check_flags(fold=fold)
    smooth, tau = temperature_arg(temperature)
    if fold:
        return _price_many_jit(plan, coefs, batches, tau, smooth)
    structure, values, index = _traced_args(plan, coefs)
    return _price_many_traced(structure, values, index, coefs.values, batches, tau, smooth, False)
