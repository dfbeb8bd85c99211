"""The fit through the serving simulation, on the deployment axis.

A closed-loop schedule depends only on token counts, so each point's mean TPOT and mean TTFT
are fixed linear maps of its steps' times (``fit.metric_weights``) plus its admission latency
(host_admission_per_request + host_admission_per_token x mean prompt length). Every run of one
plan structure (one model graph, whatever the chip, parallelism, quantization or engine
settings) is priced by ONE compiled function: the runs' plan values, coefficient vectors and
read-law maps are stacked, and their steps laid out in fixed-size chunks that each belong to
one run (``_Pack``). The Jacobian is forward mode, chunk by chunk, over the chunk's run's FREE
coefficient names only (a dozen tangents, not the whole vector).

Compression (``stride`` > 1, the fit's default): consecutive steps that are decode only on every
rank, with the same discrete sums (tokens, requests, rows, emits) and the same metric weights,
merge into blocks of at most ``stride`` steps, each priced once at its mean reads and weighted
by its step count. With the discrete sums fixed, a step's time is piecewise linear in its reads
(each resource's time is linear; the estimate is their max or sum), so a block is priced exactly
unless a kink of that max falls inside it. ``stride=1`` prices every step: that is how
predictions are scored (``predict``), and a test bounds the compressed error.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .errors import refuse

# the per-step sums that decide a step's price other than its reads (equal within a block)
DISCRETE = ("tokens", "prefill_tokens", "decode_tokens", "n_decode", "n_prefill", "n_requests", "n_off_width",
            "emit")
CHUNK = 4096
FIT_STRIDE = 256


def _nice(n, least=1):
    """n rounded up to 2^k x {4, 5, 6, 7} / 4 (at most 25% padding): shapes that repeat."""
    n = max(int(n), least)
    if n <= 4:
        return n
    k = 1 << (n.bit_length() - 3)
    return -(-n // k) * k


# ----------------------------------------------------------------------------- compression


def block_starts(sched, w, stride) -> np.ndarray:
    """First step of each block (see the module docstring): a new block wherever a step carries
    prefill on some rank, its discrete sums or its metric weights (relative 1e-9) differ from
    the step before, or the block reached ``stride`` steps."""
    S, dp = int(sched.steps), int(sched.dp)
    if stride <= 1 or S <= 1:
        return np.arange(S)
    disc = np.concatenate([np.asarray(sched.sums[k], float).reshape(dp, S) for k in DISCRETE if k in sched.sums])
    decode_only = (np.asarray(sched.sums["prefill_tokens"], float).reshape(dp, S) == 0).all(axis=0)
    tol = 1e-9 * np.maximum(np.abs(w[:, 1:]), np.abs(w[:, :-1]))
    same = ((disc[:, 1:] == disc[:, :-1]).all(axis=0) & (np.abs(w[:, 1:] - w[:, :-1]) <= tol).all(axis=0)
            & decode_only[1:] & decode_only[:-1])
    start = np.concatenate([[True], ~same])
    first = np.flatnonzero(start)
    pos = np.arange(S) - first[np.cumsum(start) - 1]
    return np.flatnonzero(start | (pos % stride == 0))


def compress(sched, w, stride):
    """(rows: dict of [dp, blocks] / [dp, blocks, L] sums, w [2, blocks]): each block's sums
    (its reads and pairs the mean over its steps) and its summed metric weights."""
    S, dp = int(sched.steps), int(sched.dp)
    st = block_starts(sched, w, stride)
    count = np.diff(np.append(st, S)).astype(float)
    rows = {}
    for k in DISCRETE:
        if k in sched.sums:
            rows[k] = np.asarray(sched.sums[k], float).reshape(dp, S)[:, st]
    for k in ("reads", "pairs"):
        v = np.asarray(sched.sums[k], float).reshape(dp, S, -1)
        rows[k] = np.add.reduceat(v, st, axis=1) / count[None, :, None] if st.size < S else v
    return rows, (np.add.reduceat(w, st, axis=1) if st.size < S else w)


# ----------------------------------------------------------------------------- the pack


def pack_key(run):
    """What runs sharing one compiled function must share: the plan structure, the recurrent
    rows' presence and the read-law map's length."""
    from .stack import structure_of
    plan = run.deployment.plan
    inv = run.schedules[0].laws.inverse
    return (structure_of(plan), bool(len(plan.arrays["rec_kind"])), None if inv is None else int(np.size(inv)))


class _Pack:
    """The runs of one ``pack_key`` with the points they price, as device arrays.

    items: (run, kmap, point_ids) per run, point_ids[j] an opaque label of run.schedules[j]'s
    point. Arrays: V/K [R, N] coefficient values and theta keys over the union of the runs'
    names, FSLOT/FKEY [R, F] each run's free names and their keys, SV/IDX/INV the stacked plan
    values, role index and read-law maps, HOT/AREQ/ATOK [R, N] one-hots of host_output_token and
    the admission latencies, x [chunks, CHUNK, ...] the (compressed) rows, chunk_run [chunks],
    idx [G, dp] each step's rank rows, w [2, G], seg [G] its point, point_run / mean_in [P]."""

    def __init__(self, items, stride=FIT_STRIDE):
        from . import fit as F
        from .stack import stack_plans
        runs = [it[0] for it in items]
        names = list(dict.fromkeys(n for r in runs for n in r.deployment.coefficients.names))
        N = F._bucket(len(names) + 1, 64)                 # >= one padding name: FSLOT's filler
        pos = {n: i for i, n in enumerate(names)}
        R = len(runs)
        self.V, self.K = np.zeros((R, N)), np.full((R, N), -1)
        self.HOT, self.AREQ, self.ATOK = np.zeros((R, N)), np.zeros((R, N)), np.zeros((R, N))
        for r, (run, kmap, _) in enumerate(items):
            c = run.deployment.coefficients
            cols = [pos[n] for n in c.names]
            self.V[r, cols] = np.asarray(c.values, dtype=float)
            self.K[r, cols] = np.asarray(kmap)
            for hot, name in ((self.HOT, "host_output_token"), (self.AREQ, "host_admission_per_request"),
                              (self.ATOK, "host_admission_per_token")):
                if name in pos and name in c:
                    hot[r, pos[name]] = 1.0
        F_ = max(1, int((self.K >= 0).sum(axis=1).max()))
        self.FSLOT, self.FKEY = np.full((R, F_), N - 1), np.full((R, F_), -1)
        for r in range(R):
            free = np.flatnonzero(self.K[r] >= 0)
            self.FSLOT[r, :free.size], self.FKEY[r, :free.size] = free, self.K[r, free]
        stack = stack_plans([r.deployment.plan for r in runs])
        self.structure = stack.structure
        self.SV = np.asarray(stack.values)
        self.IDX = stack.role_index(tuple(names) + tuple(f"\0pad{i}" for i in range(N - len(names))))
        inv = [r.schedules[0].laws.inverse for r in runs]
        self.INV = None if inv[0] is None else np.stack([np.asarray(i, dtype=np.int32) for i in inv])
        self.has_rec = bool(len(runs[0].deployment.plan.arrays["rec_kind"]))
        self.host_cols = ("emit",) if self.HOT.any() else ()
        self._steps(items, stride)

    def _steps(self, items, stride):
        from . import fit as F
        rows, chunk_run, idx, w, seg, self.point_run, self.point_ids, mean_in = [], [], [], [], [], [], [], []
        L = max(int(np.shape(sc.sums["reads"])[-1]) for run, _, _ in items for sc in run.schedules)
        dpmax = max(int(sc.dp) for run, _, _ in items for sc in run.schedules)
        offset = 0
        for r, (run, _, pids) in enumerate(items):
            start = offset
            for sc, pid in zip(run.schedules, pids):
                p = len(self.point_ids)
                self.point_ids.append(pid)
                self.point_run.append(r)
                mean_in.append(float(np.mean(sc.requests["input_len"])))
                if sc.steps == 0:
                    continue
                x, ws = compress(sc, F.metric_weights(sc), stride)
                dp, G = x["tokens"].shape
                for k in ("reads", "pairs"):
                    x[k] = np.concatenate([x[k], np.zeros((dp, G, L - x[k].shape[-1]))], axis=-1)
                rows.append({k: v.reshape((dp * G,) + v.shape[2:]) for k, v in x.items()})
                i = offset + np.arange(dp)[None, :] * G + np.arange(G)[:, None]
                idx.append(np.concatenate([i, np.repeat(i[:, :1], dpmax - dp, axis=1)], axis=1))
                w.append(ws)
                seg.append(np.full(G, p, dtype=np.int32))
                offset += dp * G
            n = offset - start
            pad = -(-n // CHUNK) * CHUNK - n
            if pad:
                rows.append({k: np.zeros((pad,) + v.shape[1:]) for k, v in rows[-1].items()})
                offset += pad
            chunk_run += [r] * ((offset - start) // CHUNK)
        keys = rows[0].keys()
        n_chunks = _nice(len(chunk_run))
        flat = {k: np.concatenate([q[k] for q in rows] + [np.zeros(((n_chunks - len(chunk_run)) * CHUNK,)
                                                                    + rows[0][k].shape[1:])]) for k in keys}
        self.x = {k: v.reshape((n_chunks, CHUNK) + v.shape[1:]) for k, v in flat.items()}
        self.chunk_run = np.array(chunk_run + [0] * (n_chunks - len(chunk_run)), dtype=np.int32)
        G = sum(len(s) for s in seg)
        Gp = _nice(G)
        self.idx = np.concatenate(idx + [np.zeros((Gp - G, dpmax), dtype=np.int64)]).astype(np.int32)
        self.w = np.concatenate(w + [np.zeros((2, Gp - G))], axis=1)
        self.seg = np.concatenate(seg + [np.zeros(Gp - G, dtype=np.int32)])
        self.P = _nice(len(self.point_ids))
        pr = np.zeros(self.P, dtype=np.int32)
        pr[:len(self.point_run)] = self.point_run
        self.point_run = pr
        self.mean_in = np.concatenate([mean_in, np.zeros(self.P - len(mean_in))])
        self.steps = G

    def args(self):
        """The device arguments after U (the log-multipliers [R, N])."""
        put = jax.device_put
        return (put(self.V), put(self.SV), put(self.IDX), None if self.INV is None else put(self.INV), put(self.HOT),
                put(self.AREQ), put(self.ATOK), put(self.FSLOT), {k: put(v) for k, v in self.x.items()},
                put(self.chunk_run), put(self.idx), put(self.w), put(self.seg), put(self.point_run),
                put(self.mean_in))

    def statics(self, estimate, smooth, tau):
        return {"structure": self.structure, "has_rec": self.has_rec, "host_cols": self.host_cols,
                "estimate": estimate, "smooth": bool(smooth), "tau": float(tau), "P": int(self.P)}

    def u(self, theta):
        """[R, N] log-multipliers at theta (0 where a name is not free)."""
        from .fit import log_multipliers
        return log_multipliers(np.zeros(0) if theta is None else theta, self.K)


# ----------------------------------------------------------------------------- the compiled functions


def _chunk_times(structure, has_rec, host_cols, estimate, smooth, tau, coefs, SV, IDX, INV, HOT, xc, r):
    from . import serve
    host = jnp.sum(coefs * HOT[r])[None] if host_cols else jnp.zeros(0)
    return serve._price_chunk(structure, SV[r], IDX[r], coefs, host, xc, None if INV is None else INV[r], tau,
                              smooth, has_rec, host_cols)[serve.ESTIMATES.index(estimate)]


def _admission(coefs, AREQ, ATOK, point_run, mean_in):
    """[P]: each point's admission latency (s), from its run's coefficients."""
    c = coefs[point_run]
    return jnp.sum(c * AREQ[point_run], axis=1) + jnp.sum(c * ATOK[point_run], axis=1) * mean_in


@functools.partial(jax.jit, static_argnames=("structure", "has_rec", "host_cols", "estimate", "smooth", "tau", "P"))
def pack_predict(U, V, SV, IDX, INV, HOT, AREQ, ATOK, FSLOT, x, chunk_run, idx, w, seg, point_run, mean_in, *,
                 structure, has_rec, host_cols, estimate, smooth, tau, P):
    """[2, P]: every point's mean TPOT and mean TTFT (s)."""
    coefs = V * jnp.exp(U)

    def chunk(args):
        xc, r = args
        return _chunk_times(structure, has_rec, host_cols, estimate, smooth, tau, coefs[r], SV, IDX, INV, HOT, xc, r)
    rows = jax.lax.map(chunk, (x, chunk_run)).reshape(-1)
    step = jnp.max(rows[idx], axis=1)
    pred = jnp.stack([jax.ops.segment_sum(w[q] * step, seg, num_segments=P) for q in range(2)])
    return pred.at[1].add(_admission(coefs, AREQ, ATOK, point_run, mean_in))


@functools.partial(jax.jit, static_argnames=("structure", "has_rec", "host_cols", "estimate", "smooth", "tau", "P"))
def pack_jacobian(U, V, SV, IDX, INV, HOT, AREQ, ATOK, FSLOT, x, chunk_run, idx, w, seg, point_run, mean_in, *,
                  structure, has_rec, host_cols, estimate, smooth, tau, P):
    """([2, P] predictions, [2, P, F] their derivatives over each point's run's free
    log-multipliers, FSLOT's order): forward mode per chunk, F tangents."""
    F_ = FSLOT.shape[1]

    def chunk(args):
        xc, r = args

        def times(z):
            coefs = V[r] * jnp.exp(U[r].at[FSLOT[r]].add(z))
            t = _chunk_times(structure, has_rec, host_cols, estimate, smooth, tau, coefs, SV, IDX, INV, HOT, xc, r)
            return t, t
        dt, t = jax.jacfwd(times, has_aux=True)(jnp.zeros(F_))
        return t, dt
    rows, drows = jax.lax.map(chunk, (x, chunk_run))
    rows, drows = rows.reshape(-1), drows.reshape(-1, F_)
    cand = rows[idx]
    pick = jnp.take_along_axis(idx, jnp.argmax(cand, axis=1)[:, None], axis=1)[:, 0]
    step, dstep = rows[pick], drows[pick]
    pred = jnp.stack([jax.ops.segment_sum(w[q] * step, seg, num_segments=P) for q in range(2)])
    jac = jnp.stack([jax.ops.segment_sum(w[q][:, None] * dstep, seg, num_segments=P) for q in range(2)])
    coefs = V * jnp.exp(U)
    pred = pred.at[1].add(_admission(coefs, AREQ, ATOK, point_run, mean_in))
    take = lambda a: jnp.take_along_axis(a, FSLOT, axis=1)[point_run]         # noqa: E731  [P, F]
    jac = jac.at[1].add(take(coefs) * (take(AREQ) + take(ATOK) * mean_in[:, None]))
    return pred, jac


# ----------------------------------------------------------------------------- public helpers


def packs(items, stride=FIT_STRIDE) -> list:
    """Group (run, kmap, point_ids) items by ``pack_key`` into _Packs (item order kept within)."""
    groups: dict = {}
    for it in items:
        groups.setdefault(pack_key(it[0]), []).append(it)
    return [_Pack(g, stride) for g in groups.values()]


def predict(observations, layout=None, theta=None, *, temperature=None, stride=1) -> dict:
    """{name: [2, n] predicted mean TPOT and mean TTFT (s)} for SimObservations, every step
    priced (``stride`` 1), one compiled call per plan structure: at the registry's values (no
    ``layout``) or with ``theta`` on ``layout``'s keys."""
    items = []
    for o in observations:
        for run in o.runs:
            kmap = (np.full(len(run.deployment.coefficients.names), -1) if layout is None else
                    layout.kmap(run.deployment, create=False))
            items.append((run, kmap, [(o.name, p) for p in run.positions]))
    out = {o.name: np.zeros((2, o.n_points)) for o in observations}
    smooth, tau = temperature is not None, float(temperature or 0.0)
    estimates = sorted({o.estimate for o in observations})
    if len(estimates) > 1:
        refuse("one estimate per call", field="estimate", value=estimates)
    for pk in packs(items, stride):
        pred = np.asarray(pack_predict(jax.device_put(pk.u(theta)), *pk.args(),
                                       **pk.statics(estimates[0] if estimates else "no_overlap", smooth, tau)))
        for j, (name, p) in enumerate(pk.point_ids):
            out[name][:, p] = pred[:, j]
    return out


class PackTerm:
    """The simulated points of one _Pack as one share of a loss (fit's term interface: kind
    'grad' (loss, gradient over theta), 'value' (loss, None) or 'jac' (log predictions and
    their Jacobian over the runs' free names); ``pred_jac``, ``jacobian_theta``, ``log_meas``,
    ``weights`` over this term's residuals, in the order of ``members`` (obs, residual rows))."""

    def __init__(self, pack: _Pack, residuals, settings, kind):
        self.pack, self.kind = pack, kind
        where = {pid: j for j, pid in enumerate(pack.point_ids)}
        q, j, lm, w, self.members = [], [], [], [], []
        for obs, rows, wts in residuals:            # rows: positions in obs.measured of this pack's points
            n, ridx = obs.n_points, obs.residual_index
            sel = []
            for k in rows:
                qq, p = divmod(int(ridx[k]), n)
                q.append(qq)
                j.append(where[(obs.name, p)])
                sel.append(k)
            lm.append(np.log(obs.measured[sel]))
            w.append(np.asarray(wts)[sel])
            self.members.append((obs, np.array(sel, dtype=np.int64)))
        self.q, self.j = np.array(q, dtype=np.int64), np.array(j, dtype=np.int64)
        self.log_meas, self.weights = np.concatenate(lm), np.concatenate(w)
        self.loss, self.delta = settings["loss"], float(settings["delta"])
        est = {obs.estimate for obs, _, _ in residuals}
        self.kw = pack.statics(est.pop(), settings["smooth"], float(settings["tau"]) if settings["smooth"] else 0.0)
        self.args = pack.args()
        self.jitted = pack_predict if kind == "value" else pack_jacobian
        shapes = tuple(tuple(np.shape(a)) for a in jax.tree_util.tree_leaves(self.args))
        self.cache_key = ("simpack", kind == "value", *sorted(self.kw.items(), key=lambda kv: kv[0]), shapes,
                          self.args[3] is None)
        from .fit import _COMPILED
        self.fn = _COMPILED.get(self.cache_key)

    def compile(self):
        return self.jitted.lower(jnp.zeros(self.pack.K.shape), *self.args, **self.kw).compile()

    def _run(self, theta):
        return self.fn(jax.device_put(self.pack.u(theta)), *self.args)

    def _loss(self, lp):
        from .fit import _residual_loss
        r = lp - self.log_meas
        return float(np.sum(self.weights * np.asarray(_residual_loss(r, self.loss, self.delta)))), r

    def pred_jac(self, theta, n_keys):
        """(log(prediction) [residuals], d log(prediction) / d theta [residuals, keys])."""
        pred, jac = (np.asarray(a) for a in self._run(theta))
        p = pred[self.q, self.j]
        dlog = jac[self.q, self.j] / p[:, None]                      # [residuals, F]
        keys = self.pack.FKEY[self.pack.point_run[self.j]]           # [residuals, F]
        out = np.zeros((p.size, n_keys))
        m = keys >= 0
        np.add.at(out, (np.nonzero(m)[0], keys[m]), dlog[m])
        return np.log(p), out

    def jacobian_theta(self, theta, n_keys):
        return self.pred_jac(theta, n_keys)[1] * np.sqrt(self.weights)[:, None]

    def __call__(self, theta):
        if self.kind == "value":
            pred = np.asarray(self._run(theta))
            return self._loss(np.log(pred[self.q, self.j]))[0], None
        lp, J = self.pred_jac(theta, len(theta))
        if self.kind == "jac":
            return lp, J
        from .fit import _residual_loss_slope
        val, r = self._loss(lp)
        return val, J.T @ (self.weights * _residual_loss_slope(r, self.loss, self.delta))


def terms(observations, layout, weight_total, weighting, n_deployments, settings, kind, *, record,
          stride=FIT_STRIDE) -> list:
    """PackTerms for SimObservations: their runs grouped by ``pack_key`` (keys created in the
    observations' and runs' order). Weights as fit's terms: per point, over ``weight_total``
    or (weighting 'deployment') each deployment's summing to 1 / n_deployments."""
    items, resid = [], {}
    for o in observations:
        w = np.asarray(o.weights, dtype=float) if o.weights is not None else np.ones(o.points)
        w = w / (w.sum() * n_deployments) if weighting == "deployment" else w / weight_total
        n, ridx = o.n_points, o.residual_index
        for run in o.runs:
            kmap = layout.kmap(run.deployment, create=record, record=record, tighten=True)
            items.append((run, kmap, [(o.name, p) for p in run.positions]))
            mine = set(run.positions)
            rows = [k for k, r in enumerate(ridx) if int(r) % n in mine]
            if rows:
                resid.setdefault(pack_key(run), []).append((o, rows, w))
    out = []
    groups: dict = {}
    for it in items:
        groups.setdefault(pack_key(it[0]), []).append(it)
    for key, g in groups.items():
        if key in resid:
            out.append(PackTerm(_Pack(g, stride), _merge(resid[key]), settings, kind))
    return out


def _merge(residuals):
    """One (obs, rows, weights) per observation (its runs' rows joined, in order)."""
    by: dict = {}
    for o, rows, w in residuals:
        if o.name in by:
            by[o.name] = (o, sorted(by[o.name][1] + rows), w)
        else:
            by[o.name] = (o, list(rows), w)
    return list(by.values())
