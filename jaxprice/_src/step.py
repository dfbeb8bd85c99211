"""Price: compose one step from the laws, over a padded batch, for a resolved Plan.

``step_time(plan, coefs, batch, tau)`` is a pure JAX function (no Python branch on a traced
value): jit it, vmap it over batches or coefficient sets, differentiate it. ``tau=None`` is
exact mode (every max is the discrete max); a float is smooth mode (see numerics).

Composition (pricing-a-step.md, 'Composing the step'): per layer kind l,
    stage_l = max(SM_l, HBM_l, NVLink_l, NIC_l) + E_l        (E_l: experts, added)
    Overlap   = sum_l c_l * stage_l + max(SM_head, HBM_head) + host
    NoOverlap = T_sm + T_hbm + T_nvlink + T_nic + T_host
Padded rows contribute exactly zero, with zero gradient.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import laws
from .numerics import max2, safe_div, smax, softmax_weights, step
from .plan import RESOURCES, Batch, Coefficients, Plan


class StepResult(NamedTuple):
    """Per-step prices, in seconds. ``resources`` is [sm, hbm, nvlink, nic, host]."""
    resources: jax.Array
    overlap: jax.Array
    no_overlap: jax.Array
    bottleneck: jax.Array            # index into RESOURCES (first largest)
    bottleneck_weights: jax.Array    # one-hot in exact mode, softmax of totals in smooth mode
    layers: dict | None = None       # per layer kind (x count): sm, hbm, nvlink, nic, experts, stage

    def as_dict(self) -> dict:
        res = np.asarray(self.resources)
        out = {r: float(res[..., i]) for i, r in enumerate(RESOURCES)}
        out.update(overlap=float(self.overlap), no_overlap=float(self.no_overlap),
                   bottleneck=RESOURCES[int(self.bottleneck)])
        return out


def _segment(values, segment_ids, n):
    """Sum per-entry values into n layer kinds (one-hot matmul; ids are static)."""
    if values.shape[-1] == 0:
        return jnp.zeros(values.shape[:-1] + (n,))
    onehot = np.zeros((len(segment_ids), n))
    onehot[np.arange(len(segment_ids)), segment_ids] = 1.0
    return values @ jnp.asarray(onehot)


def step_time(plan: Plan, coefs: Coefficients, batch: Batch, tau=None, breakdown: bool = False) -> StepResult:
    A, S, CF = plan.arrays, plan.scalars, plan.coef
    K = len(plan.layer_kind_names)

    def C(name):
        return coefs[name] if name is not None else jnp.zeros(())

    def vec(names):
        return jnp.stack([C(n) for n in names]) if len(names) else jnp.zeros((0,))

    # ---- batch walk: masked rows are exactly zero
    mask = batch.mask
    sched = jnp.where(mask, batch.scheduled, 0.0)
    comp = jnp.where(mask, batch.computed, 0.0)
    thr = batch.decode_threshold
    active = mask & (sched > 0)
    prefill = active & (sched > thr)
    decode = active & ~prefill
    ctx = comp + sched
    tokens = jnp.sum(sched)
    nonempty = tokens > 0
    n_decode = jnp.sum(decode.astype(float))
    n_prefill = jnp.sum(prefill.astype(float))
    prefill_tokens = jnp.sum(jnp.where(prefill, sched, 0.0))
    decode_tokens = jnp.sum(jnp.where(decode, sched, 0.0))
    has_decode, has_prefill = n_decode > 0, n_prefill > 0
    phase_on = jnp.stack([jnp.ones(()), has_prefill.astype(float)])   # [always, prefill-only]

    # ---- rates
    bandwidth = laws.achieved_bandwidth(S["hbm_peak_bytes"] / 1e12, C(CF["hbm_derate"]))
    roles = [dict(r) for r in CF["classes"]]
    peaks = jnp.asarray(A["class_peak"])
    eps = laws.ramp(tokens, vec([r["eps_max"] for r in roles]), vec([r["m_half"] for r in roles]))
    n_half = vec([r["n_half"] for r in roles])
    k_half = vec([r["k_half"] for r in roles])
    bf16 = S["bf16_class"]

    def arithmetic(flops, cls):
        return laws.gemm_time(flops, peaks[cls], eps[cls])

    # ---- dense GEMMs -> SM
    g_cls = A["gemm_class"]
    g_eff = eps[g_cls] * laws.shape_factor(A["gemm_n"], n_half[g_cls]) * laws.shape_factor(A["gemm_k"], k_half[g_cls])
    g_time = laws.gemm_time(tokens * A["gemm_flops"], peaks[g_cls], g_eff) * phase_on[A["gemm_phase"]]
    sm = _segment(g_time, A["gemm_kind"], K)

    # ---- HBM: weights once per step, elementwise per token
    weight_bytes = phase_on @ A["weight_bytes"]
    elementwise = tokens * (phase_on @ A["elementwise_bytes"])
    hbm = laws.read_time(weight_bytes + elementwise, bandwidth)

    # ---- attention
    if len(A["attn_kind"]):
        w, tk, cr, sp = A["attn_window"], A["attn_topk"], A["attn_compress"], A["attn_sparse"]
        reads_rows = laws.decode_read_tokens(ctx[:, None], w, tk, cr, sp, tau)
        reads = jnp.sum(jnp.where(decode[:, None], reads_rows, 0.0), axis=0)
        pairs_rows = 4.0 * laws.prefill_pairs(sched[:, None], comp[:, None], w, tk, cr, sp)
        pairs = jnp.sum(jnp.where(prefill[:, None], pairs_rows, 0.0), axis=0)
        dec_floor = vec([f for f, _ in CF["attn_dec"]])
        dec_rate_given = np.array([r is not None for _, r in CF["attn_dec"]])
        dec_rate = jnp.where(dec_rate_given, vec([r for _, r in CF["attn_dec"]]), bandwidth)
        kv_bytes = reads * A["attn_bytes_per_token"]
        attn_hbm = jnp.where(has_decode, dec_floor + safe_div(kv_bytes, dec_rate), 0.0)
        # prefill: measured model form where every term is present, else arithmetic
        flops = pairs * A["attn_flops_per_pair"]
        pre_floor, pre_scale = C(CF["attn_pre_floor"]), C(CF["attn_pre_scale"])
        scale = jnp.where(A["attn_secondary"] | (CF["attn_pre_scale"] is None), 1.0, pre_scale)
        floor = jnp.where(A["attn_secondary"], 0.0, pre_floor)
        arith = floor + laws.gemm_time(flops, peaks[bf16], eps[bf16] * scale)
        forms = CF["attn_pre_form"]
        has_form = np.array([f is not None for f in forms])
        if has_form.any():
            f_floor, f_req, f_tok, f_rate = (vec([f[i] if f else None for f in forms]) for i in range(4))
            measured = f_floor + f_req * n_prefill + f_tok * prefill_tokens + \
                safe_div(pairs / 4.0 * A["attn_bytes_per_token"], f_rate)
            arith = jnp.where(has_form, measured, arith)
        attn_sm = jnp.where(has_prefill, arith, 0.0)
        # FlashAttention serves a mixed batch of a non-latent layer in one launch: drop one floor
        mixed = A["attn_one_launch"] & has_decode & has_prefill
        drop_decode = dec_floor < pre_floor
        attn_hbm = attn_hbm - jnp.where(mixed & drop_decode, dec_floor, 0.0)
        attn_sm = attn_sm - jnp.where(mixed & ~drop_decode, pre_floor, 0.0)
        on = phase_on[A["attn_phase"]]
        hbm = hbm + _segment(attn_hbm * on, A["attn_kind"], K)
        sm = sm + _segment(attn_sm * on, A["attn_kind"], K)

    # ---- recurrent mixers -> SM
    if len(A["rec_kind"]):
        rec = []
        for i, (dec, pre) in enumerate(zip(CF["rec_dec"], CF["rec_pre"])):
            t = laws.floor_plus_rate(has_decode, C(dec[0]), decode_tokens, C(dec[1])) if dec else jnp.zeros(())
            if pre:
                t = t + laws.floor_plus_rate(has_prefill, C(pre[0]), prefill_tokens, C(pre[1]))
            else:   # vLLM's chunked scan, as arithmetic at the BF16 ramp
                t = t + arithmetic(prefill_tokens * A["rec_scan_flops"][i], A["rec_scan_class"][i])
            rec.append(t)
        sm = sm + _segment(jnp.stack(rec) * phase_on[A["rec_phase"]], A["rec_kind"], K)

    # ---- mHC hyper-connections: measured form, else memory traffic plus the mixing GEMM
    if len(A["mhc_kind"]):
        m_hbm, m_sm = [], []
        for i, form in enumerate(CF["mhc_form"]):
            nbytes = tokens * A["mhc_bytes_per_token"][i]
            if form:
                m_hbm.append(C(form[0]) + safe_div(nbytes, C(form[1])))
                m_sm.append(jnp.zeros(()))
            else:
                m_hbm.append(laws.read_time(nbytes, bandwidth))
                m_sm.append(arithmetic(tokens * A["mhc_mix_flops"][i], A["mhc_mix_class"][i]))
        on = phase_on[A["mhc_phase"]]
        hbm = hbm + _segment(jnp.stack(m_hbm) * on, A["mhc_kind"], K)
        sm = sm + _segment(jnp.stack(m_sm) * on, A["mhc_kind"], K)

    # ---- experts: routed arithmetic plus reads of the distinct experts touched (added)
    if S["has_moe"]:
        routed_tokens = tokens * S["funnel"]
        imb = C(CF["moe_imbalance"]) if CF["moe_imbalance"] else 1.0
        e_cls = A["expert_class"]
        expert_sm = laws.gemm_time(routed_tokens * A["expert_flops"] * imb, peaks[e_cls], eps[e_cls])
        touched = laws.experts_touched(routed_tokens, S["experts_total"], A["expert_topk"], S["experts_per_rank"])
        expert_hbm = laws.read_time(A["expert_bytes"] * touched, bandwidth)
    else:
        expert_sm = expert_hbm = jnp.zeros(K)

    # ---- collectives: every launch pays its own floor
    rows = CF["coll"]
    given = np.array([r is not None for r in rows])
    floors, trans, peak_rates = (vec([r[i] if r else None for r in rows]) for i in range(3))
    per_launch = laws.collective_time(tokens * A["coll_bytes_per_token"], floors, trans,
                                      jnp.where(given, peak_rates, 1.0), tau)
    per_launch = jnp.where(given, per_launch, 0.0)
    launches = jnp.einsum("p,pkc->kc", phase_on, jnp.asarray(A["launches"]))
    nic_mask = A["coll_nic"]
    nvlink = launches @ jnp.where(nic_mask, 0.0, per_launch)
    nic = launches @ jnp.where(nic_mask, per_launch, 0.0)

    # ---- compose the layers; an empty step runs no device work
    gate = nonempty.astype(float)
    sm, hbm, nvlink, nic = sm * gate, hbm * gate, nvlink * gate, nic * gate
    expert_sm, expert_hbm = expert_sm * gate, expert_hbm * gate
    count = jnp.asarray(A["count"] * A["drafter_count_scale"])
    stage = smax(jnp.stack([sm, hbm, nvlink, nic], axis=-1), tau) + expert_sm + expert_hbm
    head_sm = gate * arithmetic(tokens * S["head_flops"], S["head_class"])
    head_hbm = gate * laws.read_time(S["head_weight_bytes"], bandwidth)
    head = max2(head_sm, head_hbm, tau)

    host = _host_time(S, CF, C, batch, sched, mask, tokens, nonempty, has_prefill, tau)

    totals = jnp.stack([count @ (sm + expert_sm) + head_sm, count @ (hbm + expert_hbm) + head_hbm,
                        count @ nvlink, count @ nic, host])
    no_overlap = jnp.sum(totals)
    overlap = jnp.minimum(count @ stage + head + host, no_overlap)
    layers = None
    if breakdown:
        layers = {"sm": count * sm, "hbm": count * hbm, "nvlink": count * nvlink, "nic": count * nic,
                  "expert_sm": count * expert_sm, "expert_hbm": count * expert_hbm, "stage": count * stage,
                  "head_sm": head_sm, "head_hbm": head_hbm}
    return StepResult(totals, overlap, no_overlap, jnp.argmax(totals), softmax_weights(totals, tau), layers)


def _host_time(S, CF, C, batch, sched, mask, tokens, nonempty, has_prefill, tau):
    """CPU time of the step: graph replays or eager launches, plus per-kernel dispatch."""
    replay, eager_layer, per_kernel = C(CF["replay"]), C(CF["eager_layer"]), C(CF["per_kernel"])
    n_requests = jnp.sum(mask.astype(float))
    uniform = (n_requests > 0) & jnp.all(jnp.where(mask, sched == S["uniform_width"], True))
    use_decode_mode = (n_requests == 0) | uniform
    mode = jnp.where(use_decode_mode, S["decode_mode"], S["other_mode"])        # 0 full, 1 piecewise, 2 eager
    eager = eager_layer * S["total_layers"]
    captured = jnp.where(mode == 0, replay, replay * S["segments"])
    past_ceiling = step(tokens, S["capture_tokens"], tau)
    # past the largest captured size the step runs eager, but never cheaper than captured
    graph_host = jnp.where(mode == 2, eager, captured + past_ceiling * (max2(eager, captured, tau) - captured))
    dispatch = per_kernel * (S["kernels"] + has_prefill * S["kernels_prefill"]) * nonempty
    host = graph_host + dispatch
    if S["drafter"]:
        layers = S["drafter_layers"]
        d_eager = eager_layer * layers
        if S["drafter_parallel_block"]:
            # own graphs, captured only under a FULL decode mode, rows num_spec_tokens wide
            fits = n_requests * S["drafter_width"] <= S["capture_tokens"]
            captured_d = (S["decode_mode"] == 0) & fits
            d_host = jnp.where(captured_d, replay, d_eager) + has_prefill * d_eager
        else:
            d_captured = jnp.where(mode == 0, replay, replay * S["drafter_segments"])
            d_host = S["drafter_passes"] * jnp.where((mode == 2) | (past_ceiling > 0.5), d_eager, d_captured)
        d_dispatch = per_kernel * S["drafter_passes"] * (S["drafter_kernels"] + has_prefill * S["drafter_kernels_prefill"])
        host = host + (d_host + d_dispatch) * nonempty
    return host


@functools.partial(jax.jit, static_argnames=("plan", "smooth", "breakdown"))
def _price_jit(plan, coefs, batch, tau, smooth, breakdown):
    return step_time(plan, coefs, batch, tau if smooth else None, breakdown)


def price(plan: Plan, coefs: Coefficients, batch: Batch, *, temperature=None, breakdown=False) -> StepResult:
    """Price one padded batch (jit-compiled once per plan, padding and mode).

    temperature: None for exact mode; a float >= 0 for smooth mode (0 reproduces exact).
    """
    smooth = temperature is not None
    return _price_jit(plan, coefs, batch, jnp.asarray(temperature if smooth else 0.0, dtype=float),
                      smooth, breakdown)


@functools.partial(jax.jit, static_argnames=("plan", "smooth"))
def _price_many_jit(plan, coefs, batches, tau, smooth):
    return jax.vmap(lambda b: step_time(plan, coefs, b, tau if smooth else None))(batches)


def price_many(plan: Plan, coefs: Coefficients, batches: Batch, *, temperature=None) -> StepResult:
    """Price a stack of batches of one padding (leading axis) in one vmapped call."""
    smooth = temperature is not None
    return _price_many_jit(plan, coefs, batches, jnp.asarray(temperature if smooth else 0.0, dtype=float), smooth)
