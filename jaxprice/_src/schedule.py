"""vLLM v1's scheduler as fixed-shape array code: the schedule of a serving run, step by step.

One *lane* is one engine (one data-parallel rank) serving one request list. The scheduler state
is a set of S slots (S = the most requests a lane can hold at once: min(C, max_num_seqs) in the
closed loop) kept in the order the scheduler sees them::

    [0, R)        running requests, in admission order (vLLM's ``running`` list)
    [R, R + P)    preempted requests, in waiting-queue order (vLLM prepends them: the head is
                  the earliest admitted; they sit exactly where the tail of ``running`` was)
    [R + P, S)    free slots; fresh requests from the waiting queue land here in arrival order

so every "in admission order" rule of the scheduler is a prefix sum along the slot axis, and
no sort is ever needed: preempting the tail of ``running`` moves the boundary R left, readmitting
the head of the waiting queue moves it right, a finished request is removed by a stable
compaction. One iteration of the ``jax.lax.while_loop`` is either

* a **general step** (one engine step, ``_general_step``): Phase A (running requests in order,
  each asking ``num_tokens_with_spec - num_computed_tokens`` tokens, capped by the remaining
  budget and ``max_model_len``; KV blocks allocated; when they do not fit, the latest-admitted
  running requests are preempted by recompute until they do: the cut is the largest prefix
  whose new blocks fit in the free blocks plus the blocks of the popped suffix), then Phase B
  (only if nothing was preempted: the waiting queue in order, while budget, ``max_num_seqs``
  and free blocks allow, the first prompt chunk taking the remaining budget, stopping at the
  first request that does not fit; with ``reserve_full_isl`` the whole prompt's blocks must
  fit, V-new), then the outputs (a row that computed all its tokens emits 1 token, a decode
  row ``g(s)`` tokens with speculation; a request emitting its last token finishes and frees
  its blocks before the next step, or one step later under async scheduling); or
* a **decode run** (``_decode_run``): after a general step that only decoded (no admission,
  preemption, finish or prefill chunk), the following steps repeat it with every context one
  step longer until the first of: a request finishes, the KV cache cannot grow, a context
  crosses a window/top-k breakpoint of an attention read law. They are recorded as ONE record
  whose per-step row sums are linear in the step (exact: every read law is piecewise linear in
  the context and no row crosses a breakpoint inside a run). That is what makes a 10 x C
  closed loop cost O(requests) iterations, not O(steps).

A record holds, per quantity the step kernel needs (``step.row_sums``: tokens, prefill tokens,
row counts, per read law the KV positions read and 4x the prefill query-key pairs), a value at
the record's first step and a slope per step; ``expand`` turns records into per-step sums with
vectorised NumPy. No Python code runs per step or per iteration.

Speculative decoding: a decode row schedules 1 + k tokens (k = num_spec_tokens) and allocates
k lookahead slots; it emits ``g(s) = G(s+1) - G(s)`` tokens at global step s with
``G(s) = floor(s * acceptance)`` (acceptance = mean tokens emitted per decode step, 1..k+1): the
same deterministic pattern for every row (real acceptance varies by row; the mean is kept).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import laws
from .step import _attention_laws

ACC_DEN = 1000            # acceptance is held as an integer number of 1/1000 tokens per step
BIG = 2 ** 40

# record columns (value at the record's first step); reads/pairs per law follow
COLS = ("m", "tokens", "prefill_tokens", "decode_tokens", "n_decode", "n_prefill", "n_requests",
        "n_off_width", "resident", "kv_blocks", "emit_decode", "emit_first", "finishes",
        "admitted", "admitted_tokens", "preempted", "waiting")
NCOL = len(COLS)
COL = {c: i for i, c in enumerate(COLS)}


class ReadLaws(NamedTuple):
    """The plan's distinct attention read laws, as piecewise-linear functions of the context:
    f(x) = a x - sum_k b_k relu(x - p_k) (at most two breakpoints; b = 0 pads)."""
    params: np.ndarray     # [L, 4]: window, top-k, compress ratio, sparse
    inverse: np.ndarray    # attention entry -> law
    a: np.ndarray          # [L]
    b: np.ndarray          # [L, 2]
    p: np.ndarray          # [L, 2]


def read_laws(plan) -> ReadLaws:
    A = plan.arrays
    if not len(A["attn_kind"]):
        z = np.zeros((0,))
        return ReadLaws(np.zeros((0, 4)), None, z, np.zeros((0, 2)), np.zeros((0, 2)))
    distinct, inverse = _attention_laws(A)
    a, b, p = [], [], []
    for w, tk, cr, sp in distinct:
        cr = cr if cr > 1 else 1.0
        bb, pp = [0.0, 0.0], [float(BIG), float(BIG)]
        if sp > 0:
            a.append((1.0 if w > 0 else 0.0) + 1.0 / cr)
            if w > 0:
                bb[0], pp[0] = 1.0, float(w)
            if tk > 0:
                bb[1], pp[1] = 1.0 / cr, float(tk) * cr
        else:
            a.append(1.0 / cr)
            if w > 0:
                bb[0], pp[0] = 1.0 / cr, float(w)
        b.append(bb)
        p.append(pp)
    return ReadLaws(distinct, inverse, np.array(a), np.array(b), np.array(p))


class Static(NamedTuple):
    """Shapes fixed at trace time (hashable). Everything about the plan (its read laws) and the
    engine is traced, so one compiled scheduler serves every deployment of a shape bucket."""
    slots: int
    requests: int
    records: int
    fast_forward: bool
    laws: int = 1          # read-law slots (>= the plan's distinct laws)


MAX_LAWS = 4              # read laws per plan, padded (a plan has 1-2)


def law_arrays(laws: ReadLaws):
    """The read laws as fixed-size arrays for the lanes: params [MAX_LAWS, 4], a, b, p, on."""
    L = len(laws.a)
    if L > MAX_LAWS:
        raise ValueError(f"{L} distinct attention read laws; the scheduler holds {MAX_LAWS}")
    params = np.zeros((MAX_LAWS, 4))
    params[:L] = laws.params
    a = np.zeros(MAX_LAWS)
    a[:L] = laws.a
    b = np.zeros((MAX_LAWS, 2))
    b[:L] = laws.b
    p = np.full((MAX_LAWS, 2), float(BIG))
    p[:L] = laws.p
    on = np.arange(MAX_LAWS) < L
    return {"law_params": params, "law_a": a, "law_b": b, "law_p": p, "law_on": on}


def _fdiv(a, b):
    """floor(a / b) of integer arrays (b >= 1), in float64: exact while |a| < 2^53 (a and b
    convert exactly, and a quotient that is not an integer lies at least 1/b from the nearest
    one, more than half an ulp of a/b, so rounding never reaches it). The scheduler's
    numerators are counts far below that (tokens, blocks, steps x 1000, BIG x 1000 < 2^50),
    except e_kv under an unbounded KV cache (2^40 blocks: about 2^40 x block_size x 1000),
    which is then only compared with e_max, many times smaller. XLA's int64 floor division is
    a scalar loop with sign fix-ups; this vectorises (scheduler iterations ~17% faster)."""
    q = jnp.asarray(a).astype(jnp.float64) / jnp.asarray(b).astype(jnp.float64)
    return jnp.floor(q).astype(jnp.int64)


def G(s, acc):
    """Tokens emitted per decode row by global step s (exclusive): floor(s * acceptance)."""
    return _fdiv(s * acc, ACC_DEN)


def G_inv(v, acc):
    """The smallest s with G(s) >= v."""
    return -_fdiv(-v * ACC_DEN, acc)


def _excl_cumsum(x):
    return jnp.cumsum(x) - x


def _cdiv(a, b):
    return -_fdiv(-a, b)


def _law_sums(st: Static, lane, sched, comp, mask, thr):
    """Per read law: KV positions read by decode rows and 4x prefill pairs, as the kernel walks
    them (step._walk_rows, exact mode). sched/comp int64 [S]."""
    active = mask & (sched > 0)
    prefill = active & (sched > thr)
    decode = active & ~prefill
    fs, fc = sched.astype(jnp.float64), comp.astype(jnp.float64)
    reads, pairs = [], []
    for j in range(st.laws):
        w, tk, cr, sp = (lane["law_params"][j, i] for i in range(4))
        on = lane["law_on"][j]
        reads.append(jnp.where(on, jnp.sum(jnp.where(decode, laws.decode_read_tokens(fc + fs, w, tk, cr, sp > 0, None), 0.0)), 0.0))
        pairs.append(jnp.where(on, jnp.sum(jnp.where(prefill, 4.0 * laws.prefill_pairs(fs, fc, w, tk, cr, sp > 0, None), 0.0)), 0.0))
    return jnp.stack(reads), jnp.stack(pairs), prefill, decode


def _law_slopes(st: Static, lane, ctx, mask):
    """Per read law, at contexts ctx [S] (decode rows in mask): the sum of f(ctx) and of its slope."""
    fx = ctx.astype(jnp.float64)
    base, slope = [], []
    for j in range(st.laws):
        w, tk, cr, sp = (lane["law_params"][j, i] for i in range(4))
        on = lane["law_on"][j]
        base.append(jnp.where(on, jnp.sum(jnp.where(mask, laws.decode_read_tokens(fx, w, tk, cr, sp > 0, None), 0.0)), 0.0))
        sl = lane["law_a"][j] - sum(lane["law_b"][j, q] * (fx >= lane["law_p"][j, q]) for q in range(2))
        slope.append(jnp.where(on, jnp.sum(jnp.where(mask, sl, 0.0)), 0.0))
    return jnp.stack(base), jnp.stack(slope)


# ----------------------------------------------------------------------------- lane state
#
# The loop carry is split in two: the SMALL state of each lane (its S slots and a few scalars),
# updated by vmapped code and selected per lane, and the BIG arrays (records [lanes, I, ...] and
# per-request results [lanes, 4, N]) updated only by scatters at the touched entries, so an
# iteration costs O(lanes x S), never O(records) or O(requests).

SLOT_KEYS = ("rid", "plen", "olen", "ntok", "comp", "held", "zombie")
SLOT_FILL = {"rid": -1, "zombie": 0}
REQ_ROWS = ("first", "finish", "emits", "npre")     # first/finish stored +1 (0 = never)


def init_small(st: Static):
    S = st.slots
    i64 = jnp.int64
    out = {k: jnp.full(S, SLOT_FILL.get(k, 0), i64) for k in SLOT_KEYS}
    for k in ("R", "P", "nf", "done", "finished", "s", "it"):
        out[k] = jnp.zeros((), i64)
    out["pure"] = jnp.zeros((), bool)
    out["stuck"] = jnp.zeros((), bool)
    return out


def init_big(st: Static, lanes_n: int):
    L, I, N = st.laws, st.records, st.requests
    return {"rec": jnp.zeros((lanes_n, I, NCOL)), "rec_reads": jnp.zeros((lanes_n, I, L)),
            "rec_pairs": jnp.zeros((lanes_n, I, L)), "rec_slope": jnp.zeros((lanes_n, I, L)),
            "rec_floor": jnp.zeros((lanes_n, I)), "req": jnp.zeros((lanes_n, len(REQ_ROWS), N), jnp.int64)}


def lane_done(st, small, lane, base=0):
    """The lane finished, stalled, or filled its records (``base``: the iteration count its record
    buffer starts at, when a run resumes in chunks: ``run_open``)."""
    return (small["finished"] >= lane["n"]) | small["stuck"] | (small["it"] - base + 2 > st.records)


def _arrived(small, lane, T):
    """Requests that have arrived: closed loop C + completions (capped at N); open loop the
    requests whose arrival time is at most T."""
    closed = jnp.minimum(lane["n"], lane["concurrency"] + small["done"])
    if lane["arrival"].shape[-1] == 0:        # closed-loop lanes carry no arrival times (run_closed)
        return closed
    opened = jnp.searchsorted(lane["arrival"], T, side="right").astype(jnp.int64)
    return jnp.where(lane["open"], jnp.minimum(opened, lane["n"]), closed)


def _compact(small, remove):
    """Remove slots (finished requests), keeping the order of the rest: one stacked scatter."""
    S = small["rid"].shape[0]
    j = jnp.arange(S)
    occupied = j < small["R"] + small["P"]
    keep = occupied & ~remove
    pos = jnp.where(keep, jnp.cumsum(keep) - 1, S)
    stacked = jnp.stack([small[k] for k in SLOT_KEYS])
    fill = jnp.asarray([SLOT_FILL.get(k, 0) for k in SLOT_KEYS], jnp.int64)[:, None]
    moved = jnp.broadcast_to(fill, stacked.shape).at[:, pos].set(stacked, mode="drop")
    out = dict(small)
    for i, k in enumerate(SLOT_KEYS):
        out[k] = moved[i]
    out["R"] = small["R"] - jnp.sum((j < small["R"]) & remove)
    return out


def _row(vals):
    return jnp.stack([jnp.asarray(vals.get(c, 0.0), jnp.float64) for c in COLS])


def _general_step(st: Static, small, lane, T_start, T_seen=None):
    """One engine step starting at ``T_start``; its scheduler sees the requests that arrived by
    ``T_seen`` (default ``T_start``; earlier where async scheduling scheduled it while the previous
    step ran). Returns (new small state before compaction, release mask, outputs)."""
    j = jnp.arange(st.slots)
    a = _running_phase(small, lane, j)
    b = _waiting_phase(st, small, lane, T_start if T_seen is None else T_seen, j, a)
    return _after_step(st, small, lane, T_start, j, a, b)


def _running_phase(small, lane, j):
    """Phase A: the running requests, in admission order, each scheduled up to what the token
    budget leaves (prefill-first, SGLang: only the running prefills here; the decode rows run
    in a step with no prefill work). The blocks they need are taken in order; where the free
    blocks (plus those of every later running request) run out, that request and every later
    one are preempted by recompute (popped)."""
    i64 = jnp.int64
    R, P = small["R"], small["P"]
    ntok, comp, held, zombie = small["ntok"], small["comp"], small["held"], small["zombie"] > 0
    k, la, bs, mml = lane["k"], lane["lookahead"], lane["block_size"], lane["max_model_len"]
    running = j < R
    live = running & ~zombie
    is_dec = live & (ntok > small["plen"]) & (comp == ntok - 1)
    d = jnp.where(live, jnp.where(is_dec, 1 + k, ntok - comp), 0)
    d = jnp.maximum(jnp.minimum(d, mml - 1 - comp), 0)
    d_dec = jnp.where(is_dec, d, 0)
    d = jnp.where(lane["prefill_first"], d - d_dec, d)
    n = jnp.clip(lane["budget"] - _excl_cumsum(d), 0, d)
    want = jnp.where(n > 0, _cdiv(jnp.minimum(comp + n + la, mml), bs), held)
    need = jnp.maximum(want - held, 0)
    free = lane["kv_blocks"] - jnp.sum(jnp.where(j < R + P, held, 0))
    m_idx = jnp.arange(j.shape[0] + 1)
    zero = jnp.zeros(1, i64)
    p_need = jnp.concatenate([zero, jnp.cumsum(need)])
    h_run = jnp.where(running, held, 0)
    s_held = jnp.sum(h_run) - jnp.concatenate([zero, jnp.cumsum(h_run)])
    ok = (p_need <= free + s_held) & (m_idx <= R)
    cut = jnp.max(jnp.where(ok, m_idx, 0))
    popped = running & (j >= cut)
    preempted = jnp.sum(popped)
    need = jnp.where(popped, 0, need)
    held_freed = jnp.sum(jnp.where(popped, held, 0))
    return {"is_dec": is_dec, "d_dec": d_dec, "n": jnp.where(popped, 0, n), "need": need,
            "comp": jnp.where(popped, 0, comp), "held": jnp.where(popped, 0, held), "popped": popped,
            "preempted": preempted, "R1": cut, "P1": P + preempted, "free1": free + held_freed - jnp.sum(need)}


def _waiting_phase(st: Static, small, lane, T_start, j, a):
    """Phase B (only if nothing was preempted): the preempted, then the arrived waiting
    requests, in order, admitted while the budget, max_num_seqs and the free blocks allow (the
    first that does not fit stops the queue). Reserve-to-completion engines (TRT-LLM
    GUARANTEED_NO_EVICT; SGLang under ignore_eos) admit a request only if it and every running
    request can grow to their full length."""
    S, N = st.slots, st.requests
    la, bs, mml = lane["lookahead"], lane["block_size"], lane["max_model_len"]
    rc = lane["reserve_completion"]
    R1, P1, n, need = a["R1"], a["P1"], a["n"], a["need"]
    plen, olen, ntok = small["plen"], small["olen"], small["ntok"]
    arrived = _arrived(small, lane, T_start)
    B1 = lane["budget"] - jnp.sum(n)
    is_pre = (j >= R1) & (j < R1 + P1)
    fresh_id = small["nf"] + (j - R1 - P1)
    is_fresh = (j >= R1 + P1) & (fresh_id < arrived)
    fid = jnp.clip(fresh_id, 0, N - 1)
    c_plen = jnp.where(is_fresh, lane["plen"][fid], plen)
    c_olen = jnp.where(is_fresh, lane["olen"][fid], olen)
    c_ntok = jnp.where(is_fresh, c_plen, ntok)
    valid = (is_pre | is_fresh) & (j < lane["max_num_seqs"]) & (a["preempted"] == 0)
    t = jnp.where(valid, c_ntok, 0)
    excl = _excl_cumsum(t)
    nb = jnp.clip(B1 - excl, 0, t)
    blocks = jnp.where(valid, _cdiv(jnp.minimum(nb + la, mml), bs), 0)
    gate = jnp.where(lane["reserve_full_isl"],
                     jnp.maximum(_cdiv(jnp.minimum(t, mml), bs) + jnp.where(R1 > 0, lane["watermark"], 0), blocks),
                     blocks)
    full = _cdiv(jnp.minimum(c_plen + c_olen + la, mml), bs)
    future = jnp.sum(jnp.where(j < R1, jnp.maximum(_cdiv(jnp.minimum(plen + olen + la, mml), bs)
                                                   - (a["held"] + need), 0), 0))
    alloc = jnp.where(rc, jnp.where(valid, full, 0), blocks)
    gate = jnp.where(rc, full, gate)
    fits = (_excl_cumsum(alloc) + gate <= a["free1"] - jnp.where(rc, future, 0)) & (excl < B1) & valid
    first_fail = jnp.min(jnp.where((j >= R1) & ~fits, j, S))
    admit = (j >= R1) & (j < first_fail)
    n_adm = jnp.sum(admit)
    fresh_adm = jnp.sum(admit & is_fresh)
    return {"admit": admit, "admit_fresh": admit & is_fresh, "n_adm": n_adm, "fresh_adm": fresh_adm,
            "adm_tokens": jnp.sum(jnp.where(admit & is_fresh, c_plen, 0)), "arrived": arrived,
            "n": jnp.where(admit, nb, n), "need": jnp.where(admit, blocks, need),
            "rid": jnp.where(admit & is_fresh, fresh_id, small["rid"]),
            "plen": jnp.where(admit, c_plen, plen), "olen": jnp.where(admit, c_olen, olen),
            "ntok": jnp.where(admit, c_ntok, ntok), "comp": jnp.where(admit, 0, a["comp"]),
            "R2": R1 + n_adm, "P2": P1 - jnp.sum(admit & is_pre), "nf": small["nf"] + fresh_adm}


def _after_step(st: Static, small, lane, T_start, j, a, b):
    """The step's row sums (before the update), then the update after it: blocks taken, tokens
    computed, a token emitted by each request that computed all its tokens (speculative
    decoding: the accepted ones), finishes released (async scheduling: one step later), the
    record of the step, and whether it is a pure decode step the next ones may repeat."""
    S, N = st.slots, st.requests
    i64 = jnp.int64
    k, la, bs, mml, s = lane["k"], lane["lookahead"], lane["block_size"], lane["max_model_len"], small["s"]
    R2, P2, nf, rid, plen, olen, ntok, comp = (b[x] for x in ("R2", "P2", "nf", "rid", "plen", "olen", "ntok", "comp"))
    n, need, held = b["n"], b["need"], a["held"]
    # prefill-first: a step with no prefill work runs every decode row (no token budget on it)
    decode_step = lane["prefill_first"] & (jnp.sum(n) == 0)
    d_dec = a["d_dec"]
    n = jnp.where(decode_step, d_dec, n)
    need = jnp.where(decode_step, jnp.maximum(jnp.where(d_dec > 0, _cdiv(jnp.minimum(comp + d_dec + la, mml), bs),
                                                         held) - held, 0), need)
    sched_mask = n > 0
    reads, pairs, prefill, decode = _law_sums(st, lane, n, comp, sched_mask, lane["thr"])
    tokens = jnp.sum(n)
    held = held + need
    comp2 = comp + n
    completes = sched_mask & (comp2 >= ntok)      # all its tokens computed (drafts go past)
    out_before = ntok - plen
    g = G(s + 1, lane["acc"]) - G(s, lane["acc"])
    gen = jnp.minimum(jnp.where(a["is_dec"] & sched_mask, g, 1), olen - out_before)
    ntok2 = jnp.where(completes, ntok + gen, ntok)
    comp2 = jnp.where(completes, ntok2 - 1, comp2)
    first_now = completes & (out_before == 0)
    fin = completes & (ntok2 - plen >= olen)
    # per-request updates (scatter-add): first+1, finish+1, emits, preemptions
    none = jnp.full(S, N, i64)
    req_idx = jnp.stack([jnp.where(first_now, rid, none), jnp.where(fin, rid, none),
                         jnp.where(completes, rid, none), jnp.where(a["popped"], small["rid"], none)])
    req_val = jnp.stack([jnp.full(S, s + 1), jnp.full(S, s + 1), jnp.ones(S, i64), jnp.ones(S, i64)])
    zombie = small["zombie"] > 0
    old_zombie = zombie & (j < small["R"])
    release = jnp.where(lane["async"], old_zombie, fin)
    new_zombie = jnp.where(lane["async"], (zombie & ~old_zombie) | fin, False)
    new = dict(small, rid=rid, plen=plen, olen=olen, ntok=ntok2, comp=comp2, held=held,
               zombie=new_zombie.astype(i64), R=R2, P=P2, nf=nf, finished=small["finished"] + jnp.sum(fin),
               done=small["done"] + jnp.sum(release), s=s + 1)
    row = _row({"m": 1.0, "tokens": tokens, "prefill_tokens": jnp.sum(jnp.where(prefill, n, 0)),
                "decode_tokens": jnp.sum(jnp.where(decode, n, 0)), "n_decode": jnp.sum(decode),
                "n_prefill": jnp.sum(prefill), "n_requests": jnp.sum(sched_mask),
                "n_off_width": jnp.sum(sched_mask & (n != lane["uniform_width"])),
                "resident": R2, "kv_blocks": jnp.sum(jnp.where(j < R2 + P2, held, 0)),
                "emit_decode": jnp.sum(completes & ~first_now), "emit_first": jnp.sum(first_now),
                "finishes": jnp.sum(fin), "admitted": b["fresh_adm"], "admitted_tokens": b["adm_tokens"],
                "preempted": a["preempted"], "waiting": jnp.maximum(b["arrived"] - nf, 0) + P2})
    # a pure decode step: the next steps may repeat it (a decode run)
    n_sched = jnp.sum(sched_mask)
    pure = ((tokens > 0) & (jnp.sum(decode) == n_sched) & (n_sched == R2) & (b["n_adm"] == 0)
            & (a["preempted"] == 0) & (jnp.sum(fin) == 0) & (P2 == 0) & ~jnp.any(new_zombie)
            & (jnp.sum(first_now) == 0) & jnp.all(jnp.where(sched_mask, n == 1 + k, True)) & ~lane["open"])
    new["pure"] = pure & st.fast_forward
    new["stuck"] = ((tokens == 0) & (R2 == 0) & (P2 == 0) & (nf >= b["arrived"]) & ~lane["open"]
                    & (new["finished"] < lane["n"]) & ~jnp.any(new_zombie))
    out = {"row": row, "reads": reads, "pairs": pairs, "slope": jnp.zeros_like(reads), "floor": T_start,
           "req_idx": req_idx, "req_val": req_val}
    return new, release, out


def _decode_run_length(st: Static, small, lane):
    """How many steps, from step s, repeat the last pure decode step exactly (>= 0)."""
    S = st.slots
    j = jnp.arange(S)
    R = small["R"]
    running = j < R
    k, la, bs, KV, acc = lane["k"], lane["lookahead"], lane["block_size"], lane["kv_blocks"], lane["acc"]
    s = small["s"]
    ntok, plen, olen, held = small["ntok"], small["plen"], small["olen"], small["held"]
    g0 = G(s, acc)
    rem = olen - (ntok - plen)
    # the step t (0-based in the run) at which each row emits its last token
    t_fin = jnp.where(running, G_inv(rem + g0, acc) - 1 - s, BIG)
    e_max = jnp.min(t_fin) + 1
    # breakpoints of the read laws: rows below one must not pass it
    ctx0 = ntok + k
    for j_law in range(st.laws):
        for q in range(2):
            p = lane["law_p"][j_law, q]
            brk = lane["law_on"][j_law] & (lane["law_b"][j_law, q] != 0)
            below = running & (ctx0 < p) & brk
            room = jnp.floor(jnp.minimum(p, float(BIG))).astype(jnp.int64) - ctx0   # ctx(t) - ctx0 <= room
            last = G_inv(jnp.maximum(room, 0) + g0 + 1, acc) - 1 - s                 # last t with G(s+t) <= room + g0
            e_max = jnp.minimum(e_max, jnp.min(jnp.where(below, last + 1, BIG)))
    e_max = jnp.minimum(e_max, lane["run_cap"])

    # KV: the blocks all rows want must fit. With x_i = ntok_i + k + lookahead, a context growth
    # of u tokens wants sum_i cdiv(x_i + u, bs) blocks: q whole blocks per row fit by counting, the
    # rest of the next block by one [S, bs] comparison. (max_model_len is ignored here: it only
    # lowers the want, so the run can only end early, which a general step then continues.)
    x = ntok + k + la
    base_i = jnp.maximum(_cdiv(x, bs), held)
    spare = KV - jnp.sum(jnp.where(running, base_i, 0))
    Rm = jnp.maximum(R, 1)
    q = _fdiv(jnp.maximum(spare, 0), Rm)
    u = jnp.arange(lane["bs_max"].shape[0])
    extra = jnp.sum(jnp.where(running[:, None] & (u[None, :] < bs),
                              _cdiv(x[:, None] + q * bs + u[None, :], bs) - _cdiv(x, bs)[:, None] - q, 0), axis=0)
    ok_u = (u < bs) & (Rm * q + extra <= spare)
    u_max = q * bs + jnp.max(jnp.where(ok_u, u, 0))
    e_kv = G_inv(u_max + g0 + 1, acc) - s          # steps t = 0..e-1 with G(s+t) - g0 <= u_max
    e = jnp.minimum(e_max, e_kv)
    eligible = _run_eligible(st, small, lane, spare)
    return jnp.where(eligible & (spare >= 0), jnp.maximum(e, 0), 0)


def _spare_blocks(small, lane):
    """Free KV blocks once every running row holds the blocks its next decode step wants."""
    running = jnp.arange(small["rid"].shape[0]) < small["R"]
    x = small["ntok"] + lane["k"] + lane["lookahead"]
    base_i = jnp.maximum(_cdiv(x, lane["block_size"]), small["held"])
    return lane["kv_blocks"] - jnp.sum(jnp.where(running, base_i, 0))


def _run_eligible(st: Static, small, lane, spare):
    """Whether the steps after this state can be a decode run (O(S), cheap: the loop tests it
    for every lane before it computes any run)."""
    S = st.slots
    running = jnp.arange(S) < small["R"]
    R, k, la, bs, mml = small["R"], lane["k"], lane["lookahead"], lane["block_size"], lane["max_model_len"]
    ntok, plen = small["ntok"], small["plen"]
    # eligible: every running row decodes, nothing is preempted or pending release, and the
    # waiting queue can admit nobody (empty, or max_num_seqs reached): then each next step is
    # the same decode step one token longer, until e_max
    comp, zombie = small["comp"], small["zombie"] > 0
    decoding = (ntok > plen) & (comp == ntok - 1) & ~zombie
    # the head of the waiting queue stays blocked through the run: free blocks only shrink
    nf = small["nf"]
    head = jnp.clip(nf, 0, st.requests - 1)
    t_head = lane["plen"][head]
    pf = lane["prefill_first"]
    left = jnp.where(pf, lane["budget"], lane["budget"] - R * (1 + k))     # prefill-first: decodes take no budget
    chunk = jnp.minimum(t_head, jnp.maximum(left, 0))
    b_head = _cdiv(jnp.minimum(chunk + la, mml), bs)
    g_head = jnp.where(lane["reserve_full_isl"],
                       jnp.maximum(_cdiv(jnp.minimum(t_head, mml), bs) + jnp.where(R > 0, lane["watermark"], 0), b_head),
                       b_head)
    # reserve to completion: the head needs its full length beside every running request's; the
    # free blocks less the running requests' reserved growth stay constant through the run
    full_i = _cdiv(jnp.minimum(plen + small["olen"] + la, mml), bs)
    base_i = jnp.maximum(_cdiv(ntok + k + la, bs), small["held"])
    future = jnp.sum(jnp.where(running, jnp.maximum(full_i - base_i, 0), 0))
    g_head = jnp.where(lane["reserve_completion"], _cdiv(jnp.minimum(t_head + lane["olen"][head] + la, mml), bs),
                       g_head)
    free_first = spare - jnp.where(lane["reserve_completion"], future, 0)   # free blocks after the run's first step
    blocked = ((_arrived(small, lane, 0.0) <= nf) | (R >= lane["max_num_seqs"]) | (left <= 0)
               | (g_head > free_first))
    eligible = ((R > 0) & (small["P"] == 0) & jnp.all(jnp.where(running, decoding, True))
                & (pf | (R * (1 + k) <= lane["budget"])) & blocked & ~lane["open"])
    return eligible & (spare >= 0)


def _decode_run(st: Static, small, lane, e, T):
    S, N = st.slots, st.requests
    j = jnp.arange(S)
    i64 = jnp.int64
    R = small["R"]
    running = j < R
    k, la, bs, mml, acc = lane["k"], lane["lookahead"], lane["block_size"], lane["max_model_len"], lane["acc"]
    s = small["s"]
    ntok, plen, olen, held, rid = small["ntok"], small["plen"], small["olen"], small["held"], small["rid"]
    e1 = jnp.maximum(e, 1)
    g0 = G(s, acc)
    base, slope = _law_slopes(st, lane, ntok + k, running)
    ntok2 = jnp.where(running, jnp.minimum(ntok + G(s + e1, acc) - g0, plen + olen), ntok)
    nt_last = ntok + G(s + e1 - 1, acc) - g0
    w = _cdiv(jnp.minimum(nt_last + k + la, mml), bs)
    held2 = jnp.where(running, jnp.maximum(w, held), held)
    fin = running & (ntok2 - plen >= olen)
    none = jnp.full(S, N, i64)
    req_idx = jnp.stack([none, jnp.where(fin, rid, none), jnp.where(running, rid, none), none])
    req_val = jnp.stack([jnp.zeros(S, i64), jnp.full(S, s + e1), jnp.full(S, e1), jnp.zeros(S, i64)])
    async_ = lane["async"]
    release = jnp.where(async_, False, fin)
    new = dict(small, ntok=ntok2, comp=jnp.where(running, ntok2 - 1, small["comp"]), held=held2,
               zombie=jnp.where(async_, fin, small["zombie"] > 0).astype(i64),
               finished=small["finished"] + jnp.sum(fin), done=small["done"] + jnp.sum(release),
               s=s + e1, pure=jnp.zeros((), bool))
    Rf = R.astype(jnp.float64)
    row = _row({"m": e1, "tokens": Rf * (1 + k), "n_decode": Rf, "n_requests": Rf, "decode_tokens": Rf * (1 + k),
                "n_off_width": jnp.where(1 + k != lane["uniform_width"], Rf, 0.0), "resident": Rf,
                "kv_blocks": jnp.sum(jnp.where(running, held2, 0)), "emit_decode": Rf, "finishes": jnp.sum(fin),
                "waiting": jnp.maximum(_arrived(small, lane, T) - small["nf"], 0)})
    out = {"row": row, "reads": base, "pairs": jnp.zeros_like(base), "slope": slope, "floor": jnp.asarray(T, jnp.float64),
           "req_idx": req_idx, "req_val": req_val}
    return new, release, out


def lane_general(st: Static, small, lane, T, T_seen=None):
    """A general step of one lane, its finished requests removed: (state, record)."""
    new, release, out1 = _general_step(st, small, lane, T, T_seen)
    return _compact(new, release), out1


def lane_run(st: Static, small, lane, T):
    """The decode run that repeats a pure decode step, where there is one: (state, record); the
    record has m = 0 (no steps) when there is none."""
    e = _decode_run_length(st, small, lane)
    run, release, out = _decode_run(st, small, lane, e, T)
    run = _compact(run, release)
    new = jax.tree_util.tree_map(lambda a, b: jnp.where(e > 0, a, b), run, small)
    out = dict(out, row=jnp.where(e > 0, out["row"], jnp.zeros_like(out["row"])),
               req_idx=jnp.where(e > 0, out["req_idx"], st.requests))
    return new, out


def _no_record(st: Static, like):
    """An empty record (m = 0, request updates dropped) shaped like ``like``."""
    out = jax.tree_util.tree_map(jnp.zeros_like, like)
    out["req_idx"] = jnp.full_like(like["req_idx"], st.requests)
    return out


def lanes_iteration(st: Static, small, lanes, T, active, T_seen=None):
    """One loop iteration of every lane: a general step, then (where it only decoded) the decode
    run that repeats it; two records per lane ([lanes, 2, ...]). The runs are computed only when
    some active lane can have one (a branch, not a select: at high load a run is rare and costs
    about twice a general step). ``T_seen`` [lanes]: the arrival cutoff of each lane's general
    step (open loop, async scheduling: when the step was scheduled; default T, its start)."""
    T_seen = jnp.broadcast_to(jnp.asarray(T, jnp.float64), active.shape) if T_seen is None else T_seen
    new, out1 = jax.vmap(lambda x, l, ts: lane_general(st, x, l, T, ts))(small, lanes, T_seen)
    if st.fast_forward:
        want = jax.vmap(lambda x, l: _run_eligible(st, x, l, _spare_blocks(x, l)))(new, lanes) & active
        new, out2 = jax.lax.cond(jnp.any(want),
                                 lambda n: jax.vmap(lambda x, l: lane_run(st, x, l, T))(n, lanes),
                                 lambda n: (n, _no_record(st, out1)), new)
    else:
        out2 = _no_record(st, out1)
    new["it"] = small["it"] + 2
    return new, jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b], axis=1), out1, out2)


def _apply(st, big, out, active, base=0):
    """Write each active lane's two records and request updates into the big arrays (record
    ``it - base``: ``base`` [lanes] the iteration count the buffer starts at)."""
    lanes_n = active.shape[0]
    lane_ix = jnp.arange(lanes_n)[:, None]
    it = jnp.where(active[:, None], (out["it"] - base)[:, None] + jnp.arange(2)[None, :],
                   st.records)                                                          # dropped if inactive
    big = dict(big)
    for key, name in (("rec", "row"), ("rec_reads", "reads"), ("rec_pairs", "pairs"), ("rec_slope", "slope"),
                      ("rec_floor", "floor")):
        big[key] = big[key].at[lane_ix, it].set(out[name], mode="drop")
    idx = jnp.where(active[:, None, None, None], out["req_idx"], st.requests)      # [lanes, 2, 4, S]
    rows = jnp.broadcast_to(jnp.arange(len(REQ_ROWS))[None, None, :, None], idx.shape)
    lanes4 = jnp.broadcast_to(jnp.arange(lanes_n)[:, None, None, None], idx.shape)
    big["req"] = big["req"].at[lanes4, rows, idx].add(out["req_val"], mode="drop")
    return big


def init_carry(st: Static, lanes_n: int):
    """The open loop's state before its first step (``run_open``'s ``carry``): per lane its small
    state and request rows, the clock, the previous step's start, each lane busy."""
    small = jax.vmap(lambda _: init_small(st))(jnp.arange(lanes_n))
    return (small, jnp.zeros((lanes_n, len(REQ_ROWS), st.requests), jnp.int64), jnp.zeros(()), jnp.zeros(()),
            jnp.zeros(lanes_n, bool))


def _loop(st, lanes, T_fn=None, price_fn=None, carry=None):
    lanes_n = lanes["n"].shape[0]
    if carry is None:
        small = jax.vmap(lambda _: init_small(st))(jnp.arange(lanes_n))
        big = init_big(st, lanes_n)
        T0_, T_prev0, busy0 = jnp.zeros(()), jnp.zeros(()), jnp.zeros(lanes_n, bool)
    else:       # resume where an earlier call stopped (its records full), into a fresh record buffer
        small, req, T0_, T_prev0, busy0 = carry
        big = dict(init_big(st, lanes_n), req=req)
    base = small["it"]          # [lanes] the iteration count this call's records start at

    def cond(carry):
        small, big, T, _T_prev, _busy = carry
        return ~jnp.all(jax.vmap(lambda x, l, b: lane_done(st, x, l, b))(small, lanes, base))

    def body(carry):
        # T_prev: the previous step's start; busy [lanes]: the lane's previous step scheduled work
        small, big, T, T_prev, busy = carry
        active = ~jax.vmap(lambda x, l, b: lane_done(st, x, l, b))(small, lanes, base)
        T_seen = None
        if price_fn is not None:
            idle = jax.vmap(lambda x, l: (x["R"] + x["P"] == 0) & (x["nf"] >= _arrived(x, l, T)))(small, lanes)
            nxt = jnp.min(jnp.where(idle & active, jax.vmap(
                lambda x, l: l["arrival"][jnp.clip(x["nf"], 0, st.requests - 1)])(small, lanes), jnp.inf))
            T0 = T
            T = jnp.where(jnp.all(idle | ~active) & jnp.isfinite(nxt), jnp.maximum(T, nxt), T)
            # async scheduling (serving-reference §3): vLLM scheduled this step when the previous
            # one started, so its scheduler sees the arrivals up to then; a request landing in busy
            # step k first runs in step k + 2. A lane whose previous step scheduled nothing was idle
            # and schedules on arrival (here: at this boundary, as without async scheduling).
            T_seen = jnp.where(lanes["async"] & busy, T_prev, T)
        new, out = lanes_iteration(st, small, lanes, T, active, T_seen)
        if price_fn is not None:
            # a step's floor (not-before time) binds only where the engine idled until an arrival; a
            # busy step's start, the previous step's end, recorded as its floor tied max(floor - start, 0)
            # at 0 in serve.step_end_times, whose gradient then took half of every earlier step's time
            out["floor"] = jnp.where(T > T0, out["floor"], -jnp.inf)
        out["it"] = small["it"]
        big = _apply(st, big, out, active, base)
        small = jax.tree_util.tree_map(
            lambda a, b: jnp.where(active.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, small)
        if price_fn is not None:
            dt = jax.vmap(price_fn)(out["row"][:, 0], out["reads"][:, 0], out["pairs"][:, 0])
            worked = out["row"][:, 0, COL["tokens"]] > 0
            dt = jnp.max(jnp.where(active & worked, dt, 0.0))
            busy = jnp.where(active, worked, busy)
            T_prev, T = T, T + dt
        return small, big, T, T_prev, busy

    small, big, T, T_prev, busy = jax.lax.while_loop(cond, body, (small, big, T0_, T_prev0, busy0))
    res = dict(big)
    if carry is not None:
        res["base"] = base
        res["carry"] = (small, big["req"], T, T_prev, busy)
    res.update({k: small[k] for k in ("it", "finished", "stuck", "s")})
    req = big["req"]
    res["first"] = req[:, 0] - 1
    res["finish"] = req[:, 1] - 1
    res["emits"] = req[:, 2]
    res["npre"] = req[:, 3]
    del res["req"]
    return res


@functools.partial(jax.jit, static_argnames=("st",))
def run_closed(st: Static, lanes):
    """Every lane's schedule (closed loop: no times needed); lanes are independent. The lanes'
    arrival times are dropped (a zero-length array), so the open loop's binary search over them,
    a sequential loop in every iteration, compiles away."""
    return _loop(st, dict(lanes, arrival=jnp.zeros((lanes["n"].shape[0], 0))))


def run_open(st: Static, lanes, price_fn, carry=None):
    """Open loop: arrivals depend on times, so the kernel prices each step inside the loop.
    The lanes (data-parallel ranks) step together; a step takes its slowest rank's time. When
    every rank is idle and a request is still to come, time jumps to its arrival. Under async
    scheduling a busy rank's step sees the arrivals up to the previous step's start (``_loop``).
    With ``carry`` (``init_carry``, or an earlier call's ``res["carry"]``) the run goes on from
    there until it ends or its ``st.records`` records fill (records ``res["base"]`` on, per lane),
    so a long run goes in chunks of bounded memory, with progress between them."""
    return _loop(st, lanes, price_fn=price_fn, carry=carry)


# ----------------------------------------------------------------------------- expansion


def expand(rec, rec_reads, rec_pairs, rec_slope, n_records, acc):
    """Records of one lane -> per-step arrays (NumPy): dict of [steps] columns, reads/pairs
    [steps, L], the floor (not-before time) of each step, and each step's record index."""
    rec = np.asarray(rec)[:n_records]
    m = rec[:, COL["m"]].astype(np.int64)
    steps = int(m.sum())
    idx = np.repeat(np.arange(n_records), m)
    s0 = np.concatenate([[0], np.cumsum(m)[:-1]]).astype(np.int64)
    s = np.arange(steps, dtype=np.int64)
    acc = int(acc)
    # a run's first step is its record's s0; G-offset within the record
    du = ((s * acc) // ACC_DEN - (s0[idx] * acc) // ACC_DEN).astype(np.float64)
    rows = rec[idx]
    cols = {c: rows[:, COL[c]] for c in COLS if c != "m"}
    reads = np.asarray(rec_reads)[:n_records][idx] + np.asarray(rec_slope)[:n_records][idx] * du[:, None]
    pairs = np.asarray(rec_pairs)[:n_records][idx]
    # per-record counts that happen once (at the record's last step): finishes, admissions, preemptions
    last = np.zeros(steps, bool)
    if steps:
        last[np.cumsum(m) - 1] = True
    first_of = np.zeros(steps, bool)
    if steps:
        first_of[s0[m > 0]] = True
    for c in ("finishes",):
        cols[c] = np.where(last, cols[c], 0.0)
    for c in ("admitted", "admitted_tokens", "preempted", "emit_first"):
        cols[c] = np.where(first_of, cols[c], 0.0)
    return cols, reads, pairs, idx, s0


# ----------------------------------------------------------------------------- reference


def reference_schedule(plen, olen, *, concurrency=None, arrival_steps=None, max_num_seqs, budget, block_size,
                       kv_blocks, max_model_len, k=0, lookahead=0, acceptance=1.0, reserve_full_isl=True,
                       async_scheduling=False, watermark_blocks=0, max_steps=10 ** 7, partial=False,
                       reserve_to_completion=False, prefill_first=False):
    """The same scheduler as plain Python over lists, one engine step per loop turn, written
    from serving-reference.md §1 independently of the array code: the oracle of the tests and
    the pure-Python baseline of experiments/bench.py. Closed loop (``concurrency``) only.
    ``reserve_to_completion``: a waiting request is admitted only if its full length's blocks fit
    beside the growth every running request still has to come (TRT-LLM GUARANTEED_NO_EVICT,
    SGLang under ignore_eos; §6). ``prefill_first`` (SGLang, mixed chunks off): a step runs the
    running prefill chunks and the admissions only, under the budget; a step with neither runs
    every decode row, with no budget (needs ``reserve_to_completion``: its growth is reserved).

    Returns dict: steps (list per step of [(request, scheduled, computed)] in batch order),
    first, finish (step per request), preemptions (per request), preempted (per step),
    preempted_finished (requests preempted after their last token, under async scheduling)."""
    ref = _ReferenceEngine(plen, olen, max_num_seqs=max_num_seqs, budget=budget, block_size=block_size,
                           kv_blocks=kv_blocks, max_model_len=max_model_len, k=k, lookahead=lookahead,
                           reserve_full_isl=reserve_full_isl, watermark_blocks=watermark_blocks,
                           reserve_to_completion=reserve_to_completion, prefill_first=prefill_first)
    acc = int(round(acceptance * ACC_DEN))
    zombies, nxt, done, s = set(), 0, 0, 0
    steps, pre_steps = [], []
    while done < ref.n or zombies:
        if s >= max_steps:
            if partial:
                break
            raise RuntimeError("reference schedule did not finish")
        while nxt < min(ref.n, concurrency + done):         # the closed loop: C in flight
            ref.waiting.append(nxt)
            nxt += 1
        rows, preempted = ref.step(zombies)
        steps.append(rows)
        pre_steps.append(preempted)
        finished = ref.emit(rows, (((s + 1) * acc) // ACC_DEN) - ((s * acc) // ACC_DEN), s)
        # async scheduling: a request finishing in step s leaves the batch after step s + 1 was scheduled
        leaving, zombies = (list(zombies), set(finished)) if async_scheduling else (finished, zombies)
        done += ref.retire(leaving)
        s += 1
    return {"steps": steps, "first": ref.first, "finish": ref.finish, "preemptions": ref.npre, "preempted": pre_steps,
            "preempted_finished": ref.preempted_finished}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _ReferenceEngine:
    """The state of ``reference_schedule``'s engine (per request: tokens known, computed, blocks
    held, preemptions, first and finish steps; the running and waiting queues) and its stages,
    each a paragraph of serving-reference.md §1: ``step`` (A: running requests, B: waiting ones,
    SGLang's decode-only step), ``emit`` (the step's outputs), ``retire`` (finished requests)."""

    def __init__(self, plen, olen, *, max_num_seqs, budget, block_size, kv_blocks, max_model_len, k, lookahead,
                 reserve_full_isl, watermark_blocks, reserve_to_completion, prefill_first):
        self.plen, self.olen, self.n = plen, olen, len(plen)
        self.max_num_seqs, self.budget, self.block_size, self.kv_blocks = max_num_seqs, budget, block_size, kv_blocks
        self.max_model_len, self.k, self.lookahead = max_model_len, k, lookahead
        self.reserve_full_isl, self.watermark_blocks = reserve_full_isl, watermark_blocks
        self.reserve_to_completion, self.prefill_first = reserve_to_completion, prefill_first
        self.ntok = [int(p) for p in plen]
        self.comp, self.held, self.npre = [0] * self.n, [0] * self.n, [0] * self.n
        self.first, self.finish = [-1] * self.n, [-1] * self.n
        self.running, self.waiting = [], []
        self.is_dec = {}
        self.preempted_finished = 0        # requests preempted after their last token (async scheduling)

    def blocks(self, tokens):
        return _ceil_div(min(tokens, self.max_model_len), self.block_size)

    def step(self, zombies):
        """One schedule() call: (rows [(request, scheduled, computed)] in batch order, preempted)."""
        self.free = self.kv_blocks - sum(self.held[r] for r in self.running)
        self.B, self.is_dec = self.budget, {}
        rows = []
        preempted = self._schedule_running(rows, zombies)
        if not preempted:
            self._admit_waiting(rows)
        if self.prefill_first and not rows:          # no prefill work: every decode row, no budget
            self._decode_only(rows, zombies)
        return rows, preempted

    def _schedule_running(self, rows, zombies) -> bool:
        """Phase A: running requests in order while budget lasts, each growing its blocks;
        preempting the latest-arrived running request (recompute) until it fits."""
        preempted, i = False, 0
        while i < len(self.running) and self.B > 0:
            r = self.running[i]
            i += 1
            if r in zombies:
                continue
            dec = self.ntok[r] > self.plen[r] and self.comp[r] == self.ntok[r] - 1
            self.is_dec[r] = dec
            if dec and self.prefill_first:           # decodes wait for a step with no prefill work
                continue
            n = min((1 + self.k) if dec else self.ntok[r] - self.comp[r], self.B,
                    self.max_model_len - 1 - self.comp[r])
            if n <= 0:
                continue
            need = max(self.blocks(self.comp[r] + n + self.lookahead) - self.held[r], 0)
            while need > self.free:
                v = self._preempt_last()
                preempted = True
                if v == r:
                    return preempted
            self.held[r] += need
            self.free -= need
            rows.append((r, n, self.comp[r]))
            self.B -= n
        return preempted

    def _preempt_last(self) -> int:
        v = self.running.pop()
        self.free += self.held[v]
        self.held[v], self.comp[v] = 0, 0
        self.npre[v] += 1
        self.waiting.insert(0, v)
        return v

    def _admit_waiting(self, rows):
        """Phase B: waiting requests in arrival order while budget, max_num_seqs and blocks allow."""
        while self.waiting and self.B > 0 and len(self.running) < self.max_num_seqs:
            r = self.waiting[0]
            t = self.ntok[r] - self.comp[r]
            n = min(t, self.B)
            b = self.blocks(n + self.lookahead)
            if not self._admits(r, t, b):
                break
            self.waiting.pop(0)
            self.running.append(r)
            self.comp[r], self.held[r] = 0, b
            self.free -= b
            self.is_dec[r] = False
            rows.append((r, n, 0))
            self.B -= n

    def _admits(self, r, t, b) -> bool:
        """Whether waiting request r (t tokens to compute, b blocks for its first chunk) is admitted."""
        if self.reserve_to_completion:               # its full length beside every running request's growth
            full = lambda q: self.blocks(self.plen[q] + self.olen[q] + self.lookahead)  # noqa: E731
            growth = sum(max(full(q) - self.held[q], 0) for q in self.running)
            return full(r) <= self.free - growth
        gate = (self.blocks(t) + (self.watermark_blocks if self.running else 0)) if self.reserve_full_isl else b
        return max(gate, b) <= self.free

    def _decode_only(self, rows, zombies):
        for r in self.running:
            if r in zombies or not self.is_dec.get(r):
                continue
            n = min(1 + self.k, self.max_model_len - 1 - self.comp[r])
            if n <= 0:
                continue
            self.held[r] = max(self.held[r], self.blocks(self.comp[r] + n + self.lookahead))
            rows.append((r, n, self.comp[r]))

    def emit(self, rows, g, s) -> list:
        """The step's outputs: each request whose prompt is computed gains its tokens (``g``
        accepted on a decode row, 1 otherwise); returns those that finished in step ``s``."""
        finished = []
        for r, n, c in rows:
            self.comp[r] = c + n
            if self.comp[r] < self.ntok[r]:
                continue
            out = self.ntok[r] - self.plen[r]
            gen = min(g if self.is_dec.get(r) else 1, self.olen[r] - out)
            if out == 0:
                self.first[r] = s
            self.ntok[r] += gen
            self.comp[r] = self.ntok[r] - 1
            if self.ntok[r] - self.plen[r] >= self.olen[r]:
                self.finish[r] = s
                finished.append(r)
        return finished

    def retire(self, requests) -> int:
        """Finished requests leave; one preempted after it finished (async scheduling: it still sat
        in the batch while the next step was scheduled) leaves the waiting queue, as vLLM's
        update_from_output drops a stopped preempted request (its blocks were freed already)."""
        for r in requests:
            if r in self.running:
                self.running.remove(r)
            else:
                self.waiting.remove(r)
                self.preempted_finished += 1
            self.held[r] = 0
        return len(requests)
