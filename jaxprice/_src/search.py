"""Batch-composition search: the step composition that maximises output tokens per second under
a step-time (ITL) limit, found by gradient through the smooth kernel, then rounded and checked
in exact mode; and the exhaustive exact-mode grid it is verified against.

The problem
-----------
One engine step of a deployment carries

* ``D`` decode requests (integer, ``0 <= D <= max_decode``, default ``max_num_seqs - 1``: one
  sequence slot is the prefilling request), each scheduling ``w = 1 + num_spec_tokens`` tokens
  (the deployment's uniform decode width) with ``context`` tokens in its cache after the step;
* one chunked-prefill chunk of ``P`` tokens (integer) of a request that has ``prefix`` tokens
  computed already. ``P = 0`` means the step carries no prefill (allowed only when
  ``min_prefill == 0``); otherwise ``max(min_prefill, w + 1) <= P <= prefill_budget``: a chunk
  of ``w`` tokens or fewer would be priced as a decode row (the kernel's decode threshold is
  ``w``), so chunks start at ``w + 1`` tokens.

``max_num_batched_tokens`` M caps the tokens per step in vLLM: ``D*w + P <= M``. In this model M
enters no price (``resolve`` uses it only for the activation-memory estimate), so it is not a
knob that changes the plan: the search reports ``M = D*w + P``, the smallest setting that
admits the composition, and honours an optional cap ``max_batched_tokens`` as a constraint.
The engine's ``max_num_seqs`` bounds the requests, ``D + [P > 0] <= max_num_seqs``.

Step time ``T(D, P)``: the kernel's NoOverlap estimate (``estimate="overlap"`` for the other),
in exact mode. Output tokens per step:

    Y(D, P) = a * D                      if r == 0
            = min(a * D, P / r)          if r > 0

``a`` (``tokens_per_decode``, default 1) is the output tokens a decode row emits per step (with
speculative decoding, the mean accepted length). ``r`` (``prefill_per_output``) is the prefill
tokens the workload needs per output token, prompt length / output length: in a steady state
every output token must be matched by ``r`` prefill tokens, so the decodes can be kept busy
only as fast as prefill admits requests, and output beyond ``P / r`` per step is not
sustainable. With ``r = 0`` prefill is not charged for (it emits no output token), so under
NoOverlap, which grows with P, the step carries the fewest prefill tokens allowed. (Overlap
need not grow with P: a mixed batch runs a non-latent attention layer in one FlashAttention
launch and drops the smaller floor, so a 2-token chunk can make a decode step faster.)

    maximise    Y(D, P) / T(D, P)                       [output tokens per second]
    subject to  T(D, P) <= itl
                D*w + P <= max_batched_tokens           (if given)
                D + [P > 0] <= max_num_seqs,  P on the lattice above.

The relaxation and the search
-----------------------------
``P`` is a token count, already a float in the Batch, and the smooth kernel (temperature
``tau``, numerics) is differentiable in it. ``D`` is a number of rows: a padded Batch has no
fractional row, and no row construction makes every per-row sum linear in D (a row scaled to
a fraction f of a decode scales its tokens but not its KV reads under a window or top-k, and
it still counts as a whole request in the CUDA-graph choice). So D is relaxed as a mixture of
steps: a fractional ``D = n + f`` is the step that carries n decodes a fraction ``1 - f`` of the
time and n + 1 decodes a fraction f,

    T~(D, P) = (1 - f) T_tau(n, P) + f T_tau(n + 1, P),

both priced by the smooth kernel (one vmapped call over the two batches). T~ is continuous,
equal to the kernel at every integer D, its derivative in D is the priced cost of one more
decode, and its derivative in P is the smooth kernel's own (forward mode, one tangent). Y~
uses the power-mean min at the same temperature. The search is projected Adam (optax) on the
box [1, max_decode] x [P_lo, budget], log-scaled to [0, 1]^2 (steps are relative, so an
optimum at 4 decodes is found as well as one at 255; D >= 1 since a step without a decode
emits nothing), descending

    log T~ - log(Y~ + eps) + rho * (relu(log(T~ / itl))^2 + relu(log((D*w + P) / M))^2)

with rho raised geometrically over the iterations, from several restarts (vmapped) shared
between the prefill row on and, when ``min_prefill == 0`` and ``r == 0``, off (with r > 0 a
step without a chunk feeds no output). Each restart's end point is rounded to the lattice
(floor and ceil of each coordinate), and a local search in exact mode (the neighbours at
steps of 1 to 16 decodes and 1 to 64 prefill tokens, and the chunk that exactly feeds each
candidate's decodes, P = ceil(r*a*D)) moves to the best feasible composition until
no neighbour improves. Every number reported is exact mode.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .errors import check_callback, refuse
from .numerics import min2
from .plan import INT_TOKEN_LIMIT, RESOURCES, Batch
from .step import MAX_TEMPERATURE, step_time

ESTIMATES = ("no_overlap", "overlap")
# Caps on optimize_batch's effort (jaxprice optimize applies the same): the defaults are 16 restarts x 200 steps (~seconds); 1024 restarts (one vmapped batch of
# ~64x the default's memory) and 20000 steps (100x, minutes) are far past what converges, and 10**8
# of either hangs or exhausts the device's memory.
MAX_RESTARTS = 1024
MAX_ITERATIONS = 20_000
EFFORT_WHY = " (jaxprice's cap on the search's effort)"
RHO = (10.0, 1e4)            # the penalty weight's start and end
EXACT_CHUNK = 256            # candidates per exact call in the local search (one compile)
GRID_CHUNK = 32768           # compositions per exact call in the grid


# ----------------------------------------------------------------------------- the problem


@dataclasses.dataclass(frozen=True)
class Limits:
    """A validated composition problem (see the module docstring). Times in seconds."""
    itl: float
    prefill_budget: int
    min_prefill: int
    context: int
    prefix: int
    max_decode: int
    max_batched_tokens: int | None
    prefill_per_output: float
    tokens_per_decode: float
    estimate: str
    decode_width: int
    max_num_seqs: int

    @property
    def decode_threshold(self) -> int:
        return self.decode_width

    @property
    def prefill_lo(self) -> int:
        """The smallest prefill chunk: min_prefill, but at least w + 1 tokens."""
        return max(self.min_prefill, self.decode_width + 1)

    @property
    def prefill_off_allowed(self) -> bool:
        return self.min_prefill == 0

    @property
    def prefill_on_allowed(self) -> bool:
        return self.prefill_budget >= self.prefill_lo

    def prefill_lattice(self) -> np.ndarray:
        """Every allowed P, ascending."""
        on = np.arange(self.prefill_lo, self.prefill_budget + 1) if self.prefill_on_allowed else np.zeros(0, int)
        return np.concatenate([[0], on]).astype(int) if self.prefill_off_allowed else on.astype(int)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _number(value, field, *, integer=False, minimum=None, positive=False, maximum=None, why=""):
    if isinstance(value, (str, bytes, bool, np.bool_)):         # "16", True: a number was meant, not coerced
        refuse("must be a number", field=field, value=value, has_value=True)
    try:
        x = float(value)
    except (TypeError, ValueError):
        refuse("must be a number", field=field, value=value, has_value=True)
    if not math.isfinite(x):
        refuse("must be finite", field=field, value=value, has_value=True)
    if integer and x != round(x):
        refuse("must be an integer", field=field, value=value, has_value=True)
    if positive and not x > 0:
        refuse("must be > 0", field=field, value=value, has_value=True)
    if minimum is not None and x < minimum:
        refuse(f"must be >= {minimum}", field=field, value=value, has_value=True)
    if maximum is not None and x > maximum:
        refuse(f"must be at most {maximum:g}{why}", field=field, value=value, has_value=True)
    return int(round(x)) if integer else x


def _deployment(deployment):
    if isinstance(deployment, (str, bytes)) or hasattr(deployment, "__fspath__"):
        from .resolve import load_deployment
        return load_deployment(deployment)
    if not hasattr(deployment, "plan") or not hasattr(deployment, "coefficients"):
        refuse("needs a Deployment (load_deployment) or a scenario name or path", field="deployment",
               value=type(deployment).__name__)
    return deployment


def _engine(dep) -> dict:
    scenario = getattr(dep, "scenario", None)
    eng = getattr(scenario, "engine", None) or {}
    return eng if isinstance(eng, dict) else {}


def make_limits(dep, *, itl, prefill_budget, min_prefill=0, context=4096, prefix=0, max_decode=None,
                max_batched_tokens=None, prefill_per_output=0.0, tokens_per_decode=1.0,
                estimate="no_overlap") -> Limits:
    """Validate the problem's arguments against the deployment (no pricing)."""
    itl = _number(itl, "itl", positive=True)
    budget = _number(prefill_budget, "prefill_budget", integer=True, minimum=0)
    min_prefill = _number(min_prefill, "min_prefill", integer=True, minimum=0)
    context = _number(context, "context", integer=True, minimum=1)
    prefix = _number(prefix, "prefix", integer=True, minimum=0)
    r = _number(prefill_per_output, "prefill_per_output", minimum=0)
    a = _number(tokens_per_decode, "tokens_per_decode", positive=True)
    if estimate not in ESTIMATES:
        refuse(f"must be one of {', '.join(ESTIMATES)}", field="estimate", value=estimate)
    w = int(dep.resolution.get("decode_threshold", 1))
    if not 1 <= a <= w:     # 3 output tokens from a decode scheduling 1 gave 3x the tokens/s
        refuse(f"must be in [1, {w}]: a decode emits at least 1 token per step and at most the {w} it schedules "
               f"(1 + the deployment's {w - 1} speculative tokens)", field="tokens_per_decode", value=a)
    seqs = int(dep.resolution.get("max_num_seqs") or _engine(dep).get("max_num_seqs") or 256)
    if max_decode is None:
        max_decode = seqs - 1
    max_decode = _number(max_decode, "max_decode", integer=True, minimum=1)
    if max_decode > seqs:
        refuse(f"exceeds the deployment's max_num_seqs {seqs}", field="max_decode", value=max_decode)
    if max_batched_tokens is not None:
        max_batched_tokens = _number(max_batched_tokens, "max_batched_tokens", integer=True, minimum=1)
    if context < w:
        refuse(f"must hold at least the {w} tokens a decode schedules", field="context", value=context)
    model_len = _engine(dep).get("max_model_len")
    if model_len is None:       # unstated: vLLM's default, the model's own length (where its graph states one)
        model_len = getattr(getattr(dep, "graph", None), "max_model_len", None)
    if isinstance(model_len, (int, float)) and model_len > 0:
        if context > model_len:
            refuse(f"exceeds the deployment's max_model_len {int(model_len)}", field="context", value=context)
        if prefix + budget > model_len:
            # blame the prefix only when it alone is past the limit; else the budget is the one too big
            who, val = ("prefix", prefix) if prefix > model_len or (prefix and budget <= prefix) else \
                ("prefill_budget", budget)
            refuse(f"prefix + prefill_budget ({prefix} + {budget}) exceeds the deployment's max_model_len "
                   f"{int(model_len)}", field=who, value=val)
    # past the deployment's max_model_len (above) or, where none is known, the kernel's token limit
    for field, v in (("context", context), ("prefix", prefix), ("prefill_budget", budget),
                     ("min_prefill", min_prefill)):
        if v >= INT_TOKEN_LIMIT:
            refuse(f"must be below {INT_TOKEN_LIMIT} (the kernel's token limit, plan.INT_TOKEN_LIMIT = 2**24)",
                   field=field, value=v)
    if prefix + budget >= INT_TOKEN_LIMIT:
        refuse(f"prefix + prefill_budget ({prefix} + {budget}) must be below {INT_TOKEN_LIMIT} (the kernel's token "
               "limit, plan.INT_TOKEN_LIMIT = 2**24)", field="prefill_budget" if budget > prefix else "prefix",
               value=budget if budget > prefix else prefix)
    if min_prefill > budget:
        refuse(f"exceeds prefill_budget {budget}: no chunk satisfies both", field="min_prefill", value=min_prefill)
    lim = Limits(itl, budget, min_prefill, context, prefix, max_decode, max_batched_tokens, r, a, estimate, w, seqs)
    if min_prefill > 0 and not lim.prefill_on_allowed:
        refuse(f"is below the smallest prefill chunk, {lim.prefill_lo} tokens (a chunk of {w} or fewer is "
               "priced as a decode)", field="prefill_budget", value=budget)
    if r > 0 and not lim.prefill_on_allowed:
        refuse(f"admits no prefill chunk (the smallest is {lim.prefill_lo} tokens), so no output can be "
               f"sustained at {r:g} prefill tokens per output token", field="prefill_budget", value=budget)
    smallest = w + (lim.prefill_lo if (r > 0 or min_prefill > 0) else 0)
    if max_batched_tokens is not None and max_batched_tokens < smallest:
        refuse(f"is below the {smallest} tokens of the smallest step with output (1 decode"
               f"{' + a ' + str(lim.prefill_lo) + '-token chunk' if smallest > w else ''})",
               field="max_batched_tokens", value=max_batched_tokens)
    return lim


def _params(lim: Limits) -> dict:
    """The problem's numbers as traced leaves: a new limit never recompiles."""
    f = float
    return {"w": f(lim.decode_width), "c": f(lim.context), "prefix": f(lim.prefix), "thr": f(lim.decode_threshold),
            "a": f(lim.tokens_per_decode), "r": f(lim.prefill_per_output), "itl": f(lim.itl),
            "p_lo": f(lim.prefill_lo), "budget": f(max(lim.prefill_budget, lim.prefill_lo)),
            "d_max": f(lim.max_decode),
            "m_cap": f(lim.max_batched_tokens) if lim.max_batched_tokens else 1e30,
            "overlap": f(lim.estimate == "overlap")}


# ----------------------------------------------------------------------------- batches and prices


def composition_batch(rows: int, decode, prefill, on, q) -> Batch:
    """The padded batch of a composition (traceable): rows [0, decode) decode, the last row the
    prefill chunk when ``on``. decode < rows - 1."""
    i = jnp.arange(rows)
    dec = i < decode
    pre = (i == rows - 1) & on
    sched = jnp.where(dec, q["w"], jnp.where(pre, prefill, 0.0))
    comp = jnp.where(dec, q["c"] - q["w"], jnp.where(pre, q["prefix"], 0.0))
    return Batch(sched, comp, comp + sched, dec | pre, jnp.asarray(q["thr"], dtype=float))


def _estimate(res, q):
    """The limited estimate, chosen by a traced flag (one compiled search serves both)."""
    return jnp.where(q["overlap"] > 0, res.overlap, res.no_overlap)


def _output(decode, prefill, q, tau=None):
    """Output tokens per step: a*D, or min(a*D, P/r) when r > 0 (power-mean min when smooth)."""
    r = q["r"]
    fed = prefill / jnp.where(r > 0, r, 1.0)
    a_d = q["a"] * decode
    capped = jnp.minimum(a_d, fed) if tau is None else min2(a_d, fed, tau)
    return jnp.where(r > 0, capped, a_d)


@functools.partial(jax.jit, static_argnames=("plan", "rows"))
def _exact_prices(plan, coefs, rows, decode, prefill, q):
    """Exact-mode StepResults of compositions (decode[N], prefill[N]); prefill 0 = no chunk."""
    return jax.vmap(lambda d, p: step_time(plan, coefs, composition_batch(rows, d, p, p > 0, q)))(decode, prefill)


def _pair(plan, coefs, rows, tau, n, prefill, on, q):
    """Smooth step times [2] of n and n + 1 decodes with the same prefill chunk (one vmapped call)."""
    both = Batch.stack([composition_batch(rows, n, prefill, on, q), composition_batch(rows, n + 1.0, prefill, on, q)])
    return _estimate(jax.vmap(lambda b: step_time(plan, coefs, b, tau))(both), q)


def _floor(decode, q):
    """n = floor(D), kept below max_decode so that n + 1 decodes fit; a constant to autodiff."""
    return jax.lax.stop_gradient(jnp.clip(jnp.floor(decode), 0.0, q["d_max"] - 1.0))


def _mix(decode, n, t0, t1):
    """T~ = (1 - f) t0 + f t1 with f = D - n: linear in D between the integers."""
    f = decode - n
    return (1.0 - f) * t0 + f * t1


def _relaxed(plan, coefs, rows, tau, decode, prefill, on, q):
    """(T~, Y~, tokens) of a fractional composition: the mixture of floor(D) and floor(D) + 1."""
    n = _floor(decode, q)
    t = _pair(plan, coefs, rows, tau, n, prefill, on, q)
    fed = jnp.where(on, prefill, 0.0)
    return _mix(decode, n, t[0], t[1]), _output(decode, fed, q, tau), q["w"] * decode + fed


def _merit(decode, prefill, n, t0, t1, on, q, tau, rho):
    """The penalised loss the search descends, from the two priced step times."""
    t = _mix(decode, n, t0, t1)
    fed = jnp.where(on, prefill, 0.0)
    y = _output(decode, fed, q, tau)
    tokens = q["w"] * decode + fed
    over = jax.nn.relu(jnp.log(t / q["itl"])) ** 2 + jax.nn.relu(jnp.log(tokens / q["m_cap"])) ** 2
    return jnp.log(t) - jnp.log(y + 1e-6) + rho * over, y / t


def from_unit(x, q):
    """The search's coordinates: x in [0, 1]^2 -> (D, P) = (D_max^x0, P_lo * (B / P_lo)^x1),
    log-spaced (Adam's steps are relative, so an optimum at 4 decodes is found as well as one
    at 255), and D >= 1: a step without a decode emits nothing."""
    x = jnp.asarray(x)
    decode = jnp.exp(x[..., 0] * jnp.log(q["d_max"]))
    prefill = q["p_lo"] * jnp.exp(x[..., 1] * jnp.log(q["budget"] / q["p_lo"]))
    return decode, prefill


def _loss_grad(plan, coefs, rows, tau, x, on, q, rho):
    """(gradient in the unit box, smooth tokens/s) at x. The kernel is differentiated in P alone,
    forward mode with one tangent (two variables: cheaper to compile and run than reverse
    mode); D enters the loss only through the mixture weight, so dT~/dD = t1 - t0."""
    decode, prefill = from_unit(x, q)
    n = _floor(decode, q)
    t, dt = jax.jvp(lambda p: _pair(plan, coefs, rows, tau, n, p, on, q), (prefill,), (jnp.ones(()),))
    (g_d, g_p, g_t0, g_t1), tput = jax.grad(
        lambda d, p, t0, t1: _merit(d, p, n, t0, t1, on, q, tau, rho), argnums=(0, 1, 2, 3), has_aux=True)(
        decode, prefill, t[0], t[1])
    g_p = g_p + g_t0 * dt[0] + g_t1 * dt[1]
    return jnp.stack([g_d * decode * jnp.log(q["d_max"]), g_p * prefill * jnp.log(q["budget"] / q["p_lo"])]), tput


def relaxed_throughput(deployment, decode, prefill, *, temperature=0.02, limits: Limits | None = None, **kw):
    """The relaxation the search climbs, as differentiable JAX: (output tokens per second, T~
    in seconds) of a fractional composition (decode, prefill > 0), smooth mode at
    ``temperature``. ``kw`` are ``optimize_batch``'s limits (or pass ``limits``)."""
    dep = _deployment(deployment)
    lim = limits if limits is not None else make_limits(dep, **kw)
    q = _params(lim)
    tau = _number(temperature, "temperature", positive=True)
    t, y, _ = _relaxed_jit(dep.plan, dep.coefficients, lim.max_decode + 1, tau,
                           jnp.asarray(decode, dtype=float), jnp.asarray(prefill, dtype=float), jnp.asarray(True), q)
    return y / t, t


_relaxed_jit = jax.jit(_relaxed, static_argnames=("plan", "rows", "tau"))


# ----------------------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True)
class Composition:
    """One integer composition, priced in exact mode."""
    decode: int
    prefill: int
    max_num_batched_tokens: int         # D*w + P: the smallest setting that admits it
    step_time: float                    # s, the estimate the problem uses
    overlap: float
    no_overlap: float
    resources: dict                     # s per resource
    bottleneck: str
    output_tokens_per_step: float
    tokens_per_s: float
    itl_slack: float                    # s, itl - step_time (>= 0 when feasible)
    prefill_slack: float                # tokens, prefill_budget - P
    feasible: bool

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class OptimizeResult:
    """The search's answer, its exact check and its cost."""
    best: Composition
    limits: Limits
    deployment: str
    continuous: tuple                   # (D, P, smooth tokens/s) of the best restart, before rounding
    rounded: Composition                # the plain rounding of that restart (before the local search)
    restarts: int
    iterations: int                     # per restart
    gradients_finite: bool              # every restart's last gradient (of the loss) was finite
    smooth_evaluations: int             # kernel calls with gradient (2 per restart and iteration)
    exact_evaluations: int
    polish_rounds: int
    temperature: float
    wall_s: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)      # recursive: nested compositions become dicts too


@dataclasses.dataclass(frozen=True)
class GridResult:
    """The exhaustive exact-mode grid's answer."""
    best: Composition
    limits: Limits
    deployment: str
    points: int
    feasible_points: int
    wall_s: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)      # recursive: nested compositions become dicts too


class _Exact:
    """Exact-mode scoring of integer compositions (NumPy in, NumPy out)."""

    def __init__(self, dep, lim: Limits, chunk: int):
        self.dep, self.lim, self.chunk = dep, lim, chunk
        self.rows = lim.max_decode + 1
        self.q = {k: jnp.asarray(v) for k, v in _params(lim).items()}
        self.calls = 0
        self.count = 0

    def price(self, decode, prefill):
        decode = np.asarray(decode, dtype=float).reshape(-1)
        prefill = np.asarray(prefill, dtype=float).reshape(-1)
        n = decode.size
        out = []
        for s in range(0, n, self.chunk):
            d = np.zeros(self.chunk)
            p = np.zeros(self.chunk)
            k = min(self.chunk, n - s)
            d[:k], p[:k] = decode[s:s + k], prefill[s:s + k]
            res = _exact_prices(self.dep.plan, self.dep.coefficients, self.rows, jnp.asarray(d), jnp.asarray(p), self.q)
            out.append(jax.tree_util.tree_map(lambda x: np.asarray(x)[:k], res[:4]))
            self.calls += 1
        self.count += n
        if not out:
            return np.zeros((0, 5)), np.zeros(0), np.zeros(0), np.zeros(0, int)
        return tuple(np.concatenate([o[i] for o in out]) for i in range(4))

    def score(self, decode, prefill, prices=None):
        """(tokens/s, feasible, step time, violation) of integer compositions."""
        lim = self.lim
        decode = np.asarray(decode, dtype=float)
        prefill = np.asarray(prefill, dtype=float)
        resources, overlap, no_overlap, _ = prices if prices is not None else self.price(decode, prefill)
        t = no_overlap if lim.estimate == "no_overlap" else overlap
        y = lim.tokens_per_decode * decode
        if lim.prefill_per_output > 0:
            y = np.minimum(y, prefill / lim.prefill_per_output)
        tokens = lim.decode_width * decode + prefill
        viol = np.maximum(t / lim.itl - 1.0, 0.0)
        if lim.max_batched_tokens:
            viol = np.maximum(viol, tokens / lim.max_batched_tokens - 1.0)
        viol = np.maximum(viol, decode + (prefill > 0) - lim.max_num_seqs)
        feasible = viol <= 0
        with np.errstate(divide="ignore", invalid="ignore"):
            tput = np.where(t > 0, y / np.where(t > 0, t, 1.0), 0.0)
        return tput, feasible, t, viol

    def composition(self, decode, prefill) -> Composition:
        prices = self.price([decode], [prefill])
        tput, feasible, t, _ = self.score(np.array([decode]), np.array([prefill]), prices)
        resources, overlap, no_overlap, bottleneck = prices
        lim = self.lim
        y = lim.tokens_per_decode * decode
        if lim.prefill_per_output > 0:
            y = min(y, prefill / lim.prefill_per_output)
        return Composition(
            decode=int(decode), prefill=int(prefill),
            max_num_batched_tokens=int(lim.decode_width * decode + prefill),
            step_time=float(t[0]), overlap=float(overlap[0]), no_overlap=float(no_overlap[0]),
            resources={r: float(resources[0, i]) for i, r in enumerate(RESOURCES)},
            bottleneck=RESOURCES[int(bottleneck[0])], output_tokens_per_step=float(y),
            tokens_per_s=float(tput[0]), itl_slack=float(lim.itl - t[0]),
            prefill_slack=float(lim.prefill_budget - prefill), feasible=bool(feasible[0]))


def _check_possible(ex: _Exact):
    """Refuse limits that no composition with output meets: the smallest such steps are one
    decode with no chunk (where allowed and prefill is not charged for) or with the smallest
    chunk (the Overlap estimate is not monotone in the chunk, so both are tried)."""
    lim = ex.lim
    small = []
    if lim.prefill_off_allowed and lim.prefill_per_output == 0:
        small.append(0)
    if lim.prefill_on_allowed:
        small.append(lim.prefill_lo)
    d = np.array([1.0] * len(small) + [0.0])
    p = np.array([float(x) for x in small] + [0.0])
    tput, feasible, t, _ = ex.score(d, p)
    if not (feasible[:-1] & (tput[:-1] > 0)).any():
        i = int(np.argmin(t[:-1]))
        what = f"1 decode + a {small[i]}-token prefill chunk" if small[i] else "1 decode"
        refuse(f"no composition meets it: the smallest step with output ({what}) takes "
               f"{t[i] * 1e3:.3f} ms (the empty step {t[-1] * 1e3:.3f} ms)", field="itl",
               value=f"{lim.itl * 1e3:g} ms")


# ----------------------------------------------------------------------------- the search


_ADAM = optax.scale_by_adam()


@functools.partial(jax.jit, static_argnames=("plan", "rows", "tau", "steps"))
def _descend(plan, coefs, rows, tau, steps, x, on, q, lr, rho0, rho1):
    """``steps`` projected Adam steps (optax) from every restart (vmapped): the step size
    cosine-decays from lr to lr/100, the penalty weight rises geometrically from rho0 to rho1.
    Returns the end points, and the smooth tokens/s and the loss gradient of the last step (at
    the point before its update). Every number is traced: one compile per plan, padding,
    temperature, iteration count and restart count."""

    def one(x, on):
        def body(carry, k):
            x, s, _, _ = carry
            frac = k / max(steps - 1, 1)
            rho = rho0 * (rho1 / rho0) ** frac
            g, tput = _loss_grad(plan, coefs, rows, tau, x, on, q, rho)
            upd, s = _ADAM.update(jnp.where(jnp.isfinite(g), g, 0.0), s, x)
            rate = lr * (0.01 + 0.99 * 0.5 * (1.0 + jnp.cos(jnp.pi * frac)))
            return (jnp.clip(x - rate * upd, 0.0, 1.0), s, tput, g), None
        init = (x, _ADAM.init(x), jnp.zeros(()), jnp.zeros(2))
        (x, _, tput, g), _ = jax.lax.scan(body, init, jnp.arange(steps, dtype=float))
        return x, tput, g

    return jax.vmap(one)(x, on)


def _starts(n: int, seed: int) -> np.ndarray:
    """n starting points in [0, 1]^2 spread like a rank-1 lattice, shifted by the seed."""
    k = np.arange(n)
    shift = np.random.default_rng(seed).random(2) if seed else np.array([0.5, 0.5])
    return np.stack([((k + shift[0]) / n) % 1.0, (k * 0.6180339887498949 + shift[1]) % 1.0], axis=1) * 0.96 + 0.02


class _Lattice:
    """Snapping to the allowed (D, P) and the local-search neighbourhood."""

    D_STEPS = (-16, -8, -4, -2, -1, 0, 1, 2, 4, 8, 16)
    P_STEPS = (-64, -16, -4, -1, 0, 1, 4, 16, 64)

    def __init__(self, lim: Limits):
        self.lim = lim

    def snap_p(self, p, on):
        lim = self.lim
        p = np.asarray(p, dtype=float)
        if not lim.prefill_on_allowed:
            return np.zeros_like(p)
        snapped = np.clip(np.round(p), lim.prefill_lo, lim.prefill_budget)
        if lim.prefill_off_allowed:
            snapped = np.where(on, snapped, 0.0)
        return snapped

    def snap_d(self, d):
        return np.clip(np.round(np.asarray(d, dtype=float)), 0, self.lim.max_decode)

    def rounded(self, d, p, on):
        """The four floor/ceil roundings of a continuous point."""
        ds = self.snap_d([math.floor(d), math.ceil(d)])
        ps = self.snap_p([math.floor(p), math.ceil(p)], np.array([on, on]))
        return [(a, b) for a in ds for b in ps]

    def neighbours(self, d, p):
        lim = self.lim
        on = p > 0
        out = set()
        for dd in self.D_STEPS:
            nd = float(self.snap_d(d + dd))
            ps = [p + s for s in self.P_STEPS]
            if lim.prefill_per_output > 0:
                ridge = lim.prefill_per_output * lim.tokens_per_decode * nd
                ps += [math.ceil(ridge) - 1, math.ceil(ridge), math.ceil(ridge) + 1]
            for np_ in self.snap_p(ps, np.full(len(ps), on)):
                out.add((nd, float(np_)))
            if lim.prefill_off_allowed and lim.prefill_on_allowed:
                out.add((nd, 0.0 if on else float(lim.prefill_lo)))
        return sorted(out)


def _problem(deployment, **limits):
    """(the Deployment, its checked Limits) of a search or grid call (``make_limits``)."""
    dep = _deployment(deployment)
    return dep, make_limits(dep, **limits)


def _search_effort(temperature, restarts, iterations, learning_rate, seed, max_polish_rounds, callback):
    """The search's own arguments, checked in order: (tau, restarts, iterations, learning rate,
    seed, max_polish_rounds); a callback that is not callable is refused last."""
    tau = _number(temperature, "temperature", positive=True, maximum=MAX_TEMPERATURE,
                  why=" (past it the smooth surrogates leave their bounds; 0.01 to 0.1 is typical)")
    restarts = _number(restarts, "restarts", integer=True, minimum=1, maximum=MAX_RESTARTS, why=EFFORT_WHY)
    iterations = _number(iterations, "iterations", integer=True, minimum=1, maximum=MAX_ITERATIONS, why=EFFORT_WHY)
    lr = _number(learning_rate, "learning_rate", positive=True)
    seed = _number(seed, "seed", integer=True, minimum=0)
    max_polish_rounds = _number(max_polish_rounds, "max_polish_rounds", integer=True, minimum=0)
    check_callback(callback)
    return tau, restarts, iterations, lr, seed, max_polish_rounds


def _restart_starts(lim: Limits, restarts: int, seed: int):
    """(start points [n, 2] in the unit square, prefill on [n]) of the restarts, shared between
    the prefill branches (a fixed count: one compiled search); without a chunk nothing is fed
    when prefill is charged for (r > 0), so that branch is idle."""
    off = lim.prefill_off_allowed and not (lim.prefill_per_output > 0 and lim.prefill_on_allowed)
    branches = ([False] if off else []) + ([True] if lim.prefill_on_allowed else [])
    per = [max(1, restarts // len(branches) + (i < restarts % len(branches))) for i in range(len(branches))]
    x0 = np.concatenate([_starts(n, seed + i) for i, n in enumerate(per)])
    on = np.repeat(np.array(branches), per)
    return x0, on


def _smooth_ends(dep, lim: Limits, tau, iterations, lr, x0, on):
    """The smooth search from every start: (decodes, prefill tokens, smooth tokens/s, last
    gradients) at the restarts' end points, continuous, as numpy arrays (no chunk where off)."""
    rows = lim.max_decode + 1
    q = {k: jnp.asarray(v) for k, v in _params(lim).items()}
    x, y_c, grads = _descend(dep.plan, dep.coefficients, rows, tau, iterations, jnp.asarray(x0), jnp.asarray(on), q,
                             lr, RHO[0], RHO[1])
    x, y_c, grads = np.asarray(x), np.asarray(y_c), np.asarray(grads)
    d_c, p_c = (np.asarray(v) for v in from_unit(x, q))
    p_c = np.where(on, p_c, 0.0)
    return d_c, p_c, y_c, grads


def _exact_keys(ex: _Exact, comps):
    """(decodes, prefills, keys) of (D, P) compositions scored in exact mode: the key is the
    tokens/s where feasible, else -1 - the violation (so any feasible one ranks first)."""
    d, p = np.array([c[0] for c in comps]), np.array([c[1] for c in comps])
    tput, feas, _, viol = ex.score(d, p)
    return d, p, np.where(feas, tput, -1.0 - viol)


def _roundings(ex: _Exact, lat: _Lattice, d_c, p_c, on):
    """Every restart's end point rounded (floor and ceil of each), scored in exact mode:
    (candidates sorted, their decodes, prefills and keys, best-first order, restart of each)."""
    origin = {}
    for i in range(len(on)):
        for c in lat.rounded(d_c[i], p_c[i], on[i]):
            origin.setdefault(c, i)
    cand = sorted(origin)
    cd, cp, key = _exact_keys(ex, cand)
    order = np.argsort(-key, kind="stable")
    return cand, cd, cp, key, order, origin


def _polish_seeds(order, cp) -> list:
    """Where the exact climb starts: the best rounding, then the best of each prefill branch
    (on, then off) where it is another."""
    seeds = [int(order[0])]
    for b in (True, False):
        idx = [i for i in order if (cp[i] > 0) == b]
        if idx and idx[0] not in seeds:
            seeds.append(int(idx[0]))
    return seeds


def _climb(ex: _Exact, lat: _Lattice, seen: dict, cur, cur_key, max_rounds: int):
    """Hill-climb in exact mode from ``cur`` to the best neighbour while it improves, scoring
    each neighbour once (``seen``: composition -> key, shared by the climbs and filled in):
    (final key, final composition, rounds taken)."""
    rounds = 0
    for _ in range(max_rounds):
        nb = [c for c in lat.neighbours(*cur) if c not in seen]
        if nb:
            for c, k in zip(nb, _exact_keys(ex, nb)[2]):
                seen[c] = k
        rounds += 1
        best_nb = max(lat.neighbours(*cur), key=lambda c: seen[c])
        if seen[best_nb] <= cur_key:
            break
        cur, cur_key = best_nb, seen[best_nb]
    return cur_key, cur, rounds


def _polish(ex: _Exact, lat: _Lattice, cand, cp, key, order, max_polish_rounds: int):
    """Climb in exact mode from each seed (``_polish_seeds``): ((D, P) of the best end, rounds)."""
    seen = {c: k for c, k in zip(cand, key)}
    rounds = 0
    finals = []
    for s in _polish_seeds(order, cp):
        end_key, end, n = _climb(ex, lat, seen, cand[s], key[s], max_polish_rounds)
        rounds += n
        finals.append((end_key, end))
    _, best = max(finals)
    return best, rounds


def optimize_batch(deployment, *, itl, prefill_budget, min_prefill=0, context=4096, prefix=0, max_decode=None,
                   max_batched_tokens=None, prefill_per_output=0.0, tokens_per_decode=1.0,
                   estimate="no_overlap", temperature=0.02, restarts=16, iterations=200, learning_rate=0.05,
                   seed=0, max_polish_rounds=100, callback: Callable[..., Any] | None = None) -> OptimizeResult:
    """Search the batch composition that maximises output tokens per second (module docstring).

    deployment: a Deployment or a scenario name or path. itl: the step-time limit in seconds.
    prefill_budget, min_prefill, context, prefix, max_decode, max_batched_tokens: tokens and
    requests. prefill_per_output: prompt / output length of the workload (0: prefill is not
    charged for). temperature: the smooth kernel's, for the search (the answer is exact).
    restarts: in all, shared by the prefill branches (on, and off when min_prefill is 0), or
    at least one each. callback(done, total,
    **info) reports progress. Raises JaxpriceError for bad or impossible limits.
    """
    start = time.perf_counter()
    dep, lim = _problem(deployment, itl=itl, prefill_budget=prefill_budget, min_prefill=min_prefill,
                        context=context, prefix=prefix, max_decode=max_decode, max_batched_tokens=max_batched_tokens,
                        prefill_per_output=prefill_per_output, tokens_per_decode=tokens_per_decode,
                        estimate=estimate)
    tau, restarts, iterations, lr, seed, max_polish_rounds = _search_effort(
        temperature, restarts, iterations, learning_rate, seed, max_polish_rounds, callback)
    ex = _Exact(dep, lim, EXACT_CHUNK)
    _check_possible(ex)
    x0, on = _restart_starts(lim, restarts, seed)
    if callback is not None:
        callback(0, 2, stage="search")
    d_c, p_c, y_c, grads = _smooth_ends(dep, lim, tau, iterations, lr, x0, on)
    if callback is not None:
        callback(1, 2, stage="exact check")
    lat = _Lattice(lim)
    cand, cd, cp, key, order, origin = _roundings(ex, lat, d_c, p_c, on)
    best_restart = origin[cand[order[0]]]
    rounded = ex.composition(cd[order[0]], cp[order[0]])
    (bd, bp), rounds = _polish(ex, lat, cand, cp, key, order, max_polish_rounds)
    best = ex.composition(bd, bp)
    if callback is not None:
        callback(2, 2, stage="done", tokens_per_s=best.tokens_per_s)
    return OptimizeResult(
        best=best, limits=lim, deployment=dep.plan.name,
        continuous=(float(d_c[best_restart]), float(p_c[best_restart]), float(y_c[best_restart])),
        rounded=rounded, restarts=len(on), iterations=iterations, gradients_finite=bool(np.isfinite(grads).all()),
        smooth_evaluations=2 * len(on) * iterations, exact_evaluations=ex.count, polish_rounds=rounds,
        temperature=tau, wall_s=time.perf_counter() - start)


# ----------------------------------------------------------------------------- the grid


def grid_search(deployment, *, itl, prefill_budget, min_prefill=0, context=4096, prefix=0, max_decode=None,
                max_batched_tokens=None, prefill_per_output=0.0, tokens_per_decode=1.0,
                estimate="no_overlap", chunk=None, callback: Callable[..., Any] | None = None) -> GridResult:
    """Price every composition (every D in 0..max_decode, every allowed P) in exact mode,
    vmapped in chunks, and return the best feasible one. Same arguments as ``optimize_batch``;
    chunk: compositions per call (default: the search's own evaluator's for grids of up to
    64 of its chunks, so that a small grid compiles nothing new, else 32768)."""
    start = time.perf_counter()
    dep, lim = _problem(deployment, itl=itl, prefill_budget=prefill_budget, min_prefill=min_prefill,
                        context=context, prefix=prefix, max_decode=max_decode, max_batched_tokens=max_batched_tokens,
                        prefill_per_output=prefill_per_output, tokens_per_decode=tokens_per_decode,
                        estimate=estimate)
    ds = np.arange(lim.max_decode + 1, dtype=float)
    ps = lim.prefill_lattice().astype(float)
    total = ds.size * ps.size
    if chunk is None:
        chunk = EXACT_CHUNK if total <= 64 * EXACT_CHUNK else GRID_CHUNK
    chunk = _number(chunk, "chunk", integer=True, minimum=1)
    check_callback(callback)
    ex = _Exact(dep, lim, chunk)
    _check_possible(ex)
    best_key, best, feasible = -np.inf, None, 0
    # whole rows of D per call, so that a chunk is a block of the grid
    per = max(1, chunk // ps.size)
    for s in range(0, ds.size, per):
        d = np.repeat(ds[s:s + per], ps.size)
        p = np.tile(ps, min(per, ds.size - s))
        tput, feas, _, _ = ex.score(d, p)
        feasible += int(feas.sum())
        k = np.where(feas, tput, -np.inf)
        i = int(np.argmax(k))
        if k[i] > best_key:
            best_key, best = k[i], (d[i], p[i])
        if callback is not None:
            callback(min(total, (s + per) * ps.size), total, stage="grid")
    if best is None:
        refuse("no composition on the grid meets the limits", field="itl", value=f"{lim.itl * 1e3:g} ms")
    return GridResult(best=ex.composition(*best), limits=lim, deployment=dep.plan.name, points=total,
                      feasible_points=feasible, wall_s=time.perf_counter() - start)
