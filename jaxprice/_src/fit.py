"""Fit: gradient-based calibration of registry coefficients against measurements.

The model is the step kernel itself. The free parameters are log-multipliers on chosen
coefficients, shared over a chosen scope:

* ``Free("gemm_m_half_*", scope=("hardware",), bound=2.0)``: every coefficient whose name matches
  the pattern (``fnmatch``; the first matching ``Free`` wins) gets one multiplier per chip;
  ``scope=()`` ("global") shares one multiplier over every deployment. The parameter vector
  theta holds ``log(multiplier)``, projected after each step onto ``[-log(bound), log(bound)]``
  (the value stays within a factor ``bound`` of where it started) and, for fractions of a peak
  (``*eps_max*``, ``*derate*``), onto values of at most 1.
* The loss is a weighted mean over points of a per-point loss of the residual
  ``log(pred) - log(measured)``: on mean TPOT (``target="tpot"``: the step estimate plus
  ``host_output_token``) or on step times (``target="step"``). ``loss="l2"`` squares it,
  ``loss="huber"`` is quadratic within ``huber_delta`` and linear beyond. ``weighting="point"``
  weighs every point alike, ``"deployment"`` every deployment alike.
* Deployments differ in plan and in coefficient names, so each has its own jitted
  ``value_and_grad`` (compiled once per plan; its batches are stacked and priced with vmap)
  and maps the shared theta onto its own names. The kernel is priced in exact mode by
  default: NoOverlap is a sum of piecewise-smooth laws of the coefficients, so exact-mode
  gradients exist almost everywhere. ``temperature`` switches to smooth mode.
* optax Adam with a cosine-decayed learning rate; early stopping on the held-out loss (the
  split is by deployment, never by point), keeping the best theta.
* ``write_coefficient_set`` writes the result as a ``jaxprice-coefficients/1`` set whose
  ``source`` records the data and the loss; ``load_deployment(..., extra_coefficient_files=
  [path])`` then loads it like any other set.

``fit_law`` is the same descent for any small jittable law (e.g. a GEMM efficiency ramp
against microbenchmark timings), in log space with bounds.

Nothing here prints: progress goes to ``callback(done, total, **info)``.
"""

from __future__ import annotations

import csv
import dataclasses
import fnmatch
import functools
import itertools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .errors import JaxpriceError, refuse
from .formats import Registry
from .plan import Batch, Coefficients
from .resolve import Deployment, load_deployment, si_factor
from .step import _step_time, exact_at_zero

SCOPE_DIMS = ("hardware", "model", "tp", "ep", "nodes_spanned")
FRACTION_PATTERNS = ("*eps_max*", "*derate*")
TARGETS = ("tpot", "step")
ESTIMATES = ("no_overlap", "overlap")
LOSSES = ("l2", "huber")
WEIGHTINGS = ("point", "deployment")


# ----------------------------------------------------------------------------- free parameters


@dataclasses.dataclass(frozen=True)
class Free:
    """Coefficients to fit: names matching ``pattern`` (fnmatch), one value per distinct
    ``scope`` (a tuple of hardware, model, tp, ep, nodes_spanned; () = one value everywhere),
    kept within a factor ``bound`` of where they start."""
    pattern: str
    scope: tuple = ("hardware",)
    bound: float = 2.0

    def __post_init__(self):
        object.__setattr__(self, "scope", tuple(self.scope))
        if not isinstance(self.pattern, str) or not self.pattern.strip():
            refuse("empty coefficient name pattern", field="free.pattern", value=self.pattern)
        for dim in self.scope:
            if dim not in SCOPE_DIMS:
                refuse(f"unknown scope dimension (known: {', '.join(SCOPE_DIMS)}, or 'global')",
                       field="free.scope", value=dim)
        if len(set(self.scope)) != len(self.scope):
            refuse("a scope dimension is repeated", field="free.scope", value=self.scope)
        if isinstance(self.bound, bool) or not (isinstance(self.bound, (int, float)) and math.isfinite(self.bound)
                                                and self.bound > 1):
            refuse("a bound is a factor > 1", field="free.bound", value=self.bound, has_value=True)

    @staticmethod
    def parse(text: str) -> "Free":
        """``PATTERN[@SCOPE][:BOUND]``: e.g. ``hbm_derate``, ``gemm_*@hardware,model:1.5``,
        ``host_output_token@global``. The default scope is hardware, the default bound 2."""
        if not isinstance(text, str):
            refuse("expected PATTERN[@SCOPE][:BOUND]", field="free", value=text)
        body, bound = text.strip(), 2.0
        if ":" in body:
            body, b = body.rsplit(":", 1)
            try:
                bound = float(b)
            except ValueError:
                refuse("the bound after ':' must be a number > 1 (PATTERN[@SCOPE][:BOUND])", field="free",
                       value=text)
        if body.count("@") > 1:
            refuse("at most one '@' (PATTERN[@SCOPE][:BOUND])", field="free", value=text)
        pattern, _, scope = body.partition("@")
        if not pattern.strip():
            refuse("empty coefficient name pattern (PATTERN[@SCOPE][:BOUND])", field="free", value=text)
        if "@" not in body:
            dims = ("hardware",)
        elif scope.strip() in ("global", ""):
            dims = ()
        else:
            dims = tuple(s.strip() for s in scope.split(",") if s.strip())
        try:
            return Free(pattern.strip(), dims, bound)
        except JaxpriceError as err:
            raise JaxpriceError(f"{err.reason} (PATTERN[@SCOPE][:BOUND])", field="free", value=text) from None

    def label(self) -> str:
        return f"{self.pattern}@{','.join(self.scope) or 'global'}:{self.bound:g}"


def _as_free(f) -> Free:
    return Free.parse(f) if isinstance(f, str) else f


def is_fraction(name: str) -> bool:
    """A fraction of a peak (GEMM eps_max, HBM derate): physical values are at most 1."""
    return any(fnmatch.fnmatchcase(name, p) for p in FRACTION_PATTERNS)


def deployment_dims(dep: Deployment) -> dict:
    """The values of the scope dimensions for one deployment (as the resolver scopes entries)."""
    r = dep.resolution
    return {"hardware": dep.chip.name, "model": dep.graph.name, "tp": int(r["tp"]),
            "ep": int(r["ep"]), "nodes_spanned": int(r["nodes_spanned"])}


def key_label(key) -> str:
    name, scope = key
    return name + ("@" + ",".join(f"{d}={v}" for d, v in scope) if scope else "@global")


# ----------------------------------------------------------------------------- observations


@dataclasses.dataclass
class Observations:
    """Measurements of one deployment: its stacked batches [n, rows] and measured times [n]
    (seconds). ``target`` 'tpot' compares ``estimate + host_output_token``, 'step' the estimate
    alone. ``name`` is the unit of every train/held-out split. ``weights`` (optional, [n])
    scale each point's loss. ``combine`` (optional, [n, batches]): each point is this linear
    combination of the batches' estimates (e.g. a mean TPOT averaged over decode-only steps and
    steps that carry a prefill chunk); without it, point i is batch i."""
    name: str
    deployment: Deployment
    batches: Batch
    measured: np.ndarray
    target: str = "tpot"
    estimate: str = "no_overlap"
    weights: np.ndarray | None = None
    combine: np.ndarray | None = None

    def __post_init__(self):
        self.measured = np.asarray(self.measured, dtype=float).reshape(-1)
        if self.target not in TARGETS:
            refuse(f"unknown target (known: {', '.join(TARGETS)})", field="target", value=self.target)
        if self.estimate not in ESTIMATES:
            refuse(f"unknown estimate (known: {', '.join(ESTIMATES)})", field="estimate", value=self.estimate)
        n = int(np.shape(self.batches.scheduled)[0]) if np.ndim(self.batches.scheduled) == 2 else -1
        if self.combine is not None:
            self.combine = np.asarray(self.combine, dtype=float)
            if self.combine.ndim != 2 or self.combine.shape[1] != n or not np.all(np.isfinite(self.combine)):
                refuse(f"combine must be a finite [points, {n}] matrix", field=f"{self.name}.combine",
                       value=np.shape(self.combine))
            n = self.combine.shape[0]
        if self.measured.shape != (n,):
            refuse(f"{self.measured.size} measurements for {n} stacked batches", field=f"{self.name}.measured")
        if n == 0:
            refuse("no measurements", field=f"{self.name}.measured")
        if not np.all(np.isfinite(self.measured) & (self.measured > 0)):
            refuse("measured times must be positive and finite", field=f"{self.name}.measured")
        if self.weights is not None:
            self.weights = np.asarray(self.weights, dtype=float).reshape(-1)
            if self.weights.shape != (n,) or not np.all(np.isfinite(self.weights) & (self.weights >= 0)):
                refuse("weights must be n non-negative numbers", field=f"{self.name}.weights")

    @property
    def points(self) -> int:
        return int(self.measured.size)

    @property
    def dims(self) -> dict:
        return deployment_dims(self.deployment)


def observations_from_groups(groups, *, target="tpot", estimate="no_overlap"):
    """Observations from ``jaxprice.accuracy.group_points`` groups (one per deployment): the
    same stacked batches and, under the ``interleaved`` batch rule, the same ``combine``."""
    return [Observations(g.name, g.deployment, g.batches, g.measured, target, estimate,
                         combine=getattr(g, "combine", None)) for g in groups]


def observations_from_measurements(csv_path, *, registry=None, scenario_dirs=None, estimate="no_overlap",
                                   deployments=None, extra_coefficient_files=(), batch_rule="anchor"):
    """Mean-TPOT observations from a measurement CSV in the layout of inferencex_vllm_dev.csv,
    each point's batches built by ``jaxprice.accuracy.group_points`` under ``batch_rule``
    ('anchor': C decode rows at context isl + osl // 2, threshold 8; 'capped'; 'interleaved';
    see jaxprice.accuracy), so a fit and an accuracy run price the same batches.

    Returns (observations, refused, points): refused lists (point index, reason) for points
    the kernel could not price (kept out of the fit, never silently: the caller reports them)."""
    from . import accuracy
    accuracy.check_batch_rule(batch_rule)
    points, _ = accuracy.read_measurements(csv_path)
    points = accuracy.select_deployments(points, deployments, csv_path)
    groups, refused = accuracy.group_points(points, registry=registry, scenario_dirs=scenario_dirs,
                                            extra_coefficient_files=extra_coefficient_files, source=str(csv_path),
                                            batch_rule=batch_rule)
    return observations_from_groups(groups, target="tpot", estimate=estimate), refused, points


STEP_COLUMNS = ("scenario", "requests", "context", "value", "unit")
STEP_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def read_step_measurements(csv_path, *, registry=None, estimate="no_overlap", extra_coefficient_files=()):
    """Step-time observations from a CSV with columns scenario (a bundled scenario name or a
    path), requests, context (tokens in cache after the step), value, unit (us, ms or s), and
    optional tokens (scheduled per request, default 1) and decode_threshold (default 8). Each
    row is one uniform batch of ``requests`` rows; one Observations per scenario."""
    file = str(csv_path)
    try:
        fh = open(csv_path, newline="")
    except (FileNotFoundError, IsADirectoryError):
        refuse("file not found", file=file)
    rows: dict = {}
    with fh:
        reader = csv.DictReader(fh)
        missing = [c for c in STEP_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            refuse(f"missing column(s) {', '.join(missing)} (step layout: {', '.join(STEP_COLUMNS)}"
                   ", optional tokens, decode_threshold)", file=file, field="header", value=missing[0])
        for i, r in enumerate(reader, start=2):
            where = f"{file}:{i}"
            vals = {}
            for col, default in (("requests", None), ("context", None), ("tokens", 1), ("decode_threshold", 8)):
                text = r.get(col)
                if (text is None or text == "") and default is not None:
                    vals[col] = default
                    continue
                try:
                    v = float(text)
                except (TypeError, ValueError):
                    v = float("nan")
                if not math.isfinite(v) or v != int(v) or v < (1 if col != "decode_threshold" else 0):
                    refuse("expected a positive integer" if col != "decode_threshold" else
                           "expected a non-negative integer", file=where, field=col, value=text)
                vals[col] = int(v)
            try:
                val = float(r["value"])
            except (TypeError, ValueError):
                refuse("expected a number", file=where, field="value", value=r["value"])
            if not math.isfinite(val) or val <= 0:
                refuse("a measured step time must be a positive number", file=where, field="value", value=r["value"])
            if r["unit"] not in STEP_UNITS:
                refuse(f"unknown unit (known: {', '.join(STEP_UNITS)})", file=where, field="unit", value=r["unit"])
            if vals["context"] < vals["tokens"]:
                refuse("context (tokens in cache after the step) must be >= tokens", file=where, field="context",
                       value=vals["context"])
            rows.setdefault(r["scenario"], []).append((vals, val * STEP_UNITS[r["unit"]]))
    if not rows:
        refuse("no rows", file=file)
    obs = []
    reg = registry or Registry()
    for scen, rs in rows.items():
        dep = load_deployment(scen, reg, extra_coefficient_files=extra_coefficient_files)
        pad = max(v["requests"] for v, _ in rs)
        batches = Batch.stack([Batch.decode(v["requests"], v["context"], tokens=v["tokens"], pad_to=pad,
                                            decode_threshold=v["decode_threshold"]) for v, _ in rs])
        obs.append(Observations(dep.name, dep, batches, np.array([t for _, t in rs]), "step", estimate))
    return obs


def split_by_deployment(names, test_fraction=0.25, *, seed=0, stratify=None):
    """Split deployment names into sorted (train, test) lists, never splitting one name.

    Within each stratum (``stratify``: a callable or a mapping name -> stratum; default one
    stratum) a seeded shuffle sends ``round(test_fraction * n)`` names to test, at least 1
    and at most n - 1 when the stratum has n >= 2 names and the fraction is > 0."""
    names = sorted(set(names))
    if not (isinstance(test_fraction, (int, float)) and 0 <= test_fraction < 1):
        refuse("the held-out fraction must be in [0, 1)", field="holdout", value=test_fraction)
    key = (stratify.get if isinstance(stratify, dict) else stratify) if stratify is not None else None
    strata: dict = {}
    for n in names:
        strata.setdefault(key(n) if key else "", []).append(n)
    rng = np.random.default_rng(seed)
    train, test = [], []
    for s in sorted(strata, key=str):
        members = strata[s]
        k = int(round(test_fraction * len(members)))
        k = min(max(k, 1), len(members) - 1) if (len(members) >= 2 and test_fraction > 0) else 0
        order = rng.permutation(len(members))
        test += [members[i] for i in order[:k]]
        train += [members[i] for i in order[k:]]
    return sorted(train), sorted(test)


# ----------------------------------------------------------------------------- layout


class Layout:
    """The free keys (coefficient name + scope values) and where each lands in each
    deployment's coefficient vector."""

    def __init__(self, free):
        self.free = tuple(_as_free(f) for f in free)
        if not self.free:
            refuse("no free coefficients given", field="free")
        self.keys: list = []
        self._index: dict = {}
        self.records: list = []      # per (key, training deployment): key, name, dims, base SI, units
        self.lo: list = []
        self.hi: list = []
        self.matched = {f: 0 for f in self.free}

    def spec_for(self, name):
        return next((f for f in self.free if fnmatch.fnmatchcase(name, f.pattern)), None)

    def kmap(self, dep: Deployment, *, create: bool, record: bool = False, tighten: bool = False) -> np.ndarray:
        """Per name of the deployment's coefficient vector, the index of its key (-1: not free).
        ``create`` adds keys the deployment brings; ``record`` notes its starting values (for
        writing the set); ``tighten`` lowers a fraction's upper bound so that it stays <= 1 on
        this deployment too."""
        dims = deployment_dims(dep)
        coefs = dep.coefficients
        vals = np.asarray(coefs.values, dtype=float)
        out = np.full(len(coefs.names), -1, dtype=np.int32)
        for i, name in enumerate(coefs.names):
            spec = self.spec_for(name)
            if spec is None:
                continue
            key = (name, tuple((d, dims[d]) for d in spec.scope))
            if key not in self._index:
                if not create:
                    continue
                self._index[key] = len(self.keys)
                self.keys.append(key)
                self.lo.append(-math.log(spec.bound))
                self.hi.append(math.log(spec.bound))
            k = self._index[key]
            base = float(vals[i])
            if not (math.isfinite(base) and base > 0):
                refuse("a free coefficient must start positive (it is fitted in log space)",
                       file=dep.scenario.path, field=name, value=base, has_value=True)
            if tighten and is_fraction(name):     # a fraction of a peak stays <= 1 on every deployment it lands on
                self.hi[k] = min(self.hi[k], max(-math.log(base), self.lo[k]))
            if record:
                self.matched[spec] += 1
                self.records.append({"key": k, "name": name, "dims": dims, "base": base,
                                     "units": coefs.units[i], "deployment": dep.name})
            out[i] = k
        return out

    def index(self, key):
        return self._index.get(key)


# ----------------------------------------------------------------------------- the loss, jitted per plan


def _residual_loss(r, loss, delta):
    if loss == "l2":
        return r * r
    a = jnp.abs(r)
    return jnp.where(a <= delta, r * r, 2.0 * delta * a - delta * delta)


def log_multipliers(theta, kmap) -> np.ndarray:
    """Per name of a deployment's coefficient vector, its log-multiplier: theta[k] for a name
    mapped to key k, 0 for a name that is not free (kmap -1)."""
    ext = np.concatenate([np.asarray(theta, dtype=float), [0.0]])
    return ext[np.asarray(kmap)]


def apply_theta(coefs: Coefficients, theta, kmap) -> Coefficients:
    """The coefficients with ``exp(theta[k])`` applied to every name mapped to key k."""
    vals = jnp.asarray(coefs.values) * jnp.exp(jnp.asarray(log_multipliers(theta, kmap)))
    return Coefficients(vals, coefs.names, coefs.units, coefs.cites)


def _predict(plan, coefs, batches, combine, tau, target, estimate, smooth):
    """Per point: combine @ (the estimate of every batch), plus host_output_token for TPOT."""
    res = exact_at_zero(lambda t: jax.vmap(lambda b: _step_time(plan, coefs, b, t, False))(batches),
                        tau if smooth else None)
    pred = getattr(res, estimate)
    if combine is not None:
        pred = combine @ pred
    if target == "tpot" and "host_output_token" in coefs:
        pred = pred + coefs["host_output_token"]
    return pred


# The compiled functions take the log-multipliers u of the deployment's OWN coefficient names
# (not theta): they depend only on the plan, the names, the batch shapes and the settings, so
# one compilation serves every choice of free coefficients (the chain rule back to theta is a
# bincount in NumPy). Names are static; units and cites are not passed (the kernel reads
# neither), so a set loaded from another file reuses the compilation.


def _objective(u, values, batches, combine, log_meas, weights, delta, *, plan, names, target, estimate, loss, smooth,
               tau):
    coefs = Coefficients(values * jnp.exp(u), names)
    r = jnp.log(_predict(plan, coefs, batches, combine, tau, target, estimate, smooth)) - log_meas
    return jnp.sum(weights * _residual_loss(r, loss, delta))


_STATIC = ("plan", "names", "target", "estimate", "loss", "smooth", "tau")   # tau static: no cond
_value_and_grad = jax.jit(jax.value_and_grad(_objective), static_argnames=_STATIC)
_value = jax.jit(_objective, static_argnames=_STATIC)


@functools.partial(jax.jit, static_argnames=("plan", "names", "target", "estimate", "smooth", "tau"))
def _predict_u(u, values, batches, combine, *, plan, names, target, estimate, smooth, tau):
    return _predict(plan, Coefficients(values * jnp.exp(u), names), batches, combine, tau, target, estimate, smooth)


_COMPILED: dict = {}         # (grad, plan, names, batch shape, settings) -> compiled executable
_COMPILED_MAX = 256


class _Term:
    """One deployment's share of a loss: its arguments on device and its compiled function."""

    def __init__(self, obs: Observations, kmap, weight_total, weighting, n_deployments, settings, grad):
        self.obs = obs
        self.kmap = np.asarray(kmap)
        w = np.asarray(obs.weights, dtype=float) if obs.weights is not None else np.ones(obs.points)
        w = w / (w.sum() * n_deployments) if weighting == "deployment" else w / weight_total
        self.grad = grad
        coefs = obs.deployment.coefficients
        combine = None if obs.combine is None else jnp.asarray(obs.combine, dtype=float)
        self.args = (jnp.asarray(coefs.values, dtype=float), obs.batches, combine, jnp.asarray(np.log(obs.measured)),
                     jnp.asarray(w), float(settings["delta"]))
        self.kw = {"plan": obs.deployment.plan, "names": tuple(coefs.names), "target": obs.target,
                   "estimate": obs.estimate, "loss": settings["loss"], "smooth": bool(settings["smooth"]),
                   "tau": float(settings["tau"]) if settings["smooth"] else 0.0}
        self.cache_key = (grad, self.kw["plan"], self.kw["names"], tuple(np.shape(obs.batches.scheduled)),
                          None if obs.combine is None else np.shape(obs.combine),
                          *(self.kw[k] for k in ("target", "estimate", "loss", "smooth", "tau")))
        self.fn = _COMPILED.get(self.cache_key)

    def compile(self):
        """Lower and compile (thread-safe: called from a pool; the cache is filled by the caller)."""
        fn = _value_and_grad if self.grad else _value
        u = jnp.zeros(len(self.kw["names"]))
        return fn.lower(u, *self.args, **self.kw).compile()

    def __call__(self, theta):
        u = jnp.asarray(log_multipliers(theta, self.kmap))
        if self.grad:
            v, gu = self.fn(u, *self.args)
            gu = np.asarray(gu)
            mapped = self.kmap >= 0
            return float(v), np.bincount(self.kmap[mapped], weights=gu[mapped], minlength=len(theta))
        return float(self.fn(u, *self.args)), None


def _compile_terms(terms, workers, callback=None):
    """Compile every term not compiled yet, in a thread pool (XLA compiles outside the GIL)."""
    todo = {}
    for t in terms:
        if t.fn is None:
            todo.setdefault(t.cache_key, t)
    if callback:
        callback(0, len(todo), stage="compile")
    results = {}
    if todo:
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(max(1, min(workers, len(todo)))) as pool:
            futures = {pool.submit(t.compile): key for key, t in todo.items()}
            for fut in concurrent.futures.as_completed(futures):
                results[futures[fut]] = fut.result()
                if callback:
                    callback(len(results), len(todo), stage="compile")
        if len(_COMPILED) + len(results) > _COMPILED_MAX:
            _COMPILED.clear()
        _COMPILED.update(results)
    for t in terms:
        t.fn = t.fn or results[t.cache_key]
    return len(todo)


def _terms(observations, layout, settings, weighting, *, record, grad):
    total_w = sum(float(np.sum(o.weights)) if o.weights is not None else o.points for o in observations)
    if total_w <= 0 and observations:
        refuse("every weight is zero", field="weights")
    return [_Term(o, layout.kmap(o.deployment, create=record, record=record, tighten=True), total_w, weighting,
                  len(observations), settings, grad) for o in observations]


def _total(terms, theta):
    val, g = 0.0, np.zeros(len(theta))
    for t in terms:
        v, gt = t(theta)
        val += v
        if gt is not None:
            g += gt
    if not math.isfinite(val):
        raise JaxpriceError("the loss is not finite (a prediction is zero or negative, or a coefficient "
                            "left its physical range)", field="loss", value=val)
    return val, g


# ----------------------------------------------------------------------------- the descent


def _adam(learning_rate, steps):
    import optax
    return optax.adam(optax.cosine_decay_schedule(learning_rate, max(steps, 1), alpha=0.02))


@functools.partial(jax.jit, static_argnames=("learning_rate", "steps"))
def _update(grad, state, theta, lo, hi, *, learning_rate, steps):
    """One projected Adam step (compiled once per learning rate, step count and size)."""
    import optax
    updates, state = _adam(learning_rate, steps).update(grad, state, theta)
    return jnp.clip(optax.apply_updates(theta, updates), lo, hi), state


def _descend(value_and_grad, held_out, theta0, lo, hi, *, steps, learning_rate, eval_every, patience, min_delta,
             callback, label="loss"):
    """Projected Adam on theta in [lo, hi] with a cosine-decayed learning rate.

    value_and_grad(theta) -> (loss, grad); held_out(theta) -> loss or None. Every
    ``eval_every`` steps the monitored loss (held-out, else training) is compared with the
    best so far; after ``patience`` evaluations without a relative improvement of ``min_delta``
    the descent stops. Returns (best theta, history, best step, why it stopped)."""
    if not (isinstance(steps, int) and steps >= 0):
        refuse("steps must be a non-negative integer", field="steps", value=steps)
    if not (learning_rate > 0 and math.isfinite(learning_rate)):
        refuse("the learning rate must be a positive number", field="learning_rate", value=learning_rate)
    if not (isinstance(eval_every, int) and eval_every >= 1):
        refuse("eval_every must be a positive integer", field="eval_every", value=eval_every)
    if not (isinstance(patience, int) and patience >= 1):
        refuse("patience must be a positive integer", field="patience", value=patience)
    opt = _adam(learning_rate, steps)
    lo_j, hi_j = jnp.asarray(lo, dtype=float), jnp.asarray(hi, dtype=float)
    theta = np.clip(np.asarray(theta0, dtype=float), lo, hi)
    state = opt.init(jnp.asarray(theta))
    best_theta, best, best_step, bad = theta.copy(), math.inf, 0, 0
    history, stopped = [], f"ran all {steps} steps"
    held = None
    for step in range(steps + 1):
        train_loss, grad = value_and_grad(theta)
        if step % eval_every == 0 or step == steps:
            held = held_out(theta)
            monitored = held if held is not None else train_loss
            if monitored < best * (1 - min_delta) or not math.isfinite(best):
                best, best_theta, best_step, bad = monitored, theta.copy(), step, 0
            else:
                bad += 1
            history.append({"step": step, "train": train_loss, "held_out": held, "best": best})
            if callback:
                info = {"train": train_loss}
                if held is not None:
                    info["held_out"] = held
                callback(step, steps, stage="descent", **info)
            if bad >= patience:
                stopped = (f"stopped early at step {step}: the {'held-out' if held is not None else 'training'} "
                           f"{label} did not improve for {patience} evaluations")
                break
        if step == steps:
            break
        theta, state = _update(jnp.asarray(grad, dtype=float), state, jnp.asarray(theta, dtype=float), lo_j, hi_j,
                               learning_rate=float(learning_rate), steps=steps)
        theta = np.asarray(theta)
    return best_theta, history, best_step, stopped


# ----------------------------------------------------------------------------- result


@dataclasses.dataclass
class FitResult:
    """A finished fit. ``theta`` is the best log-multiplier per key (``keys``: coefficient
    name and scope values); ``history`` one dict per evaluation (step, train, held_out, best),
    the first at the starting values. ``train``/``held_out`` name the deployments."""
    layout: Layout
    theta: np.ndarray
    history: list
    best_step: int
    stopped: str
    train: list
    held_out: list
    settings: dict

    @property
    def keys(self):
        return list(self.layout.keys)

    @property
    def initial(self) -> dict:
        """Losses at the starting values: {'train', 'held_out'}."""
        h = self.history[0]
        return {"train": h["train"], "held_out": h["held_out"]}

    @property
    def final(self) -> dict:
        """Losses at the kept (best) values: {'train', 'held_out'}."""
        h = next(h for h in self.history if h["step"] == self.best_step)
        return {"train": h["train"], "held_out": h["held_out"]}

    def multipliers(self) -> dict:
        """{key label: fitted value / starting value}."""
        return {key_label(k): float(math.exp(t)) for k, t in zip(self.layout.keys, self.theta)}

    def at_bound(self) -> dict:
        """{key label: 'lower' | 'upper'} for keys the bounds stopped."""
        out = {}
        for k, t, lo, hi in zip(self.layout.keys, self.theta, self.layout.lo, self.layout.hi):
            if t <= lo + 1e-9:
                out[key_label(k)] = "lower"
            elif t >= hi - 1e-9:
                out[key_label(k)] = "upper"
        return out

    def coefficients_for(self, dep: Deployment) -> Coefficients:
        """The deployment's coefficients with the fitted multipliers applied to the keys it
        shares with the fit (others keep their values). For a training deployment these are
        the values the written set gives it."""
        kmap = self.layout.kmap(dep, create=False)
        return apply_theta(dep.coefficients, self.theta, kmap)

    def predict(self, obs: Observations, *, fitted: bool = True) -> np.ndarray:
        """Predicted times (seconds) of an Observations' batches, at the fitted values (or the
        starting values with ``fitted=False``)."""
        kmap = self.layout.kmap(obs.deployment, create=False)
        theta = self.theta if fitted else np.zeros(len(self.theta))
        smooth = self.settings["temperature"] is not None
        coefs = obs.deployment.coefficients
        combine = None if obs.combine is None else jnp.asarray(obs.combine, dtype=float)
        return np.asarray(_predict_u(jnp.asarray(log_multipliers(theta, kmap)), jnp.asarray(coefs.values, dtype=float),
                                     obs.batches, combine,
                                     plan=obs.deployment.plan, names=tuple(coefs.names),
                                     target=obs.target, estimate=obs.estimate, smooth=smooth,
                                     tau=float(self.settings["temperature"] or 0.0)))

    def entries(self) -> list:
        """Fitted values per registry entry: dicts name, scope ({dim: value}), start, value (SI),
        units, multiplier, deployments. The scope is the key's own plus the chip, narrowed by
        model, tp, ep or nodes_spanned only where the training deployments started the same
        key from different values (a registry entry scoped more finely than the fit)."""
        groups: dict = {}
        for rec in self.layout.records:
            name, scope = self.layout.keys[rec["key"]]
            sc = dict(scope)
            sc.setdefault("hardware", rec["dims"]["hardware"])
            groups.setdefault((rec["key"], tuple(sorted(sc.items()))), []).append(rec)
        out = []
        for (k, sc), recs in groups.items():
            scope = dict(sc)
            rest = [d for d in SCOPE_DIMS if d not in scope]
            for split in itertools.chain.from_iterable(itertools.combinations(rest, n) for n in range(len(rest) + 1)):
                parts: dict = {}
                for r in recs:
                    parts.setdefault(tuple(r["dims"][d] for d in split), []).append(r)
                if all(len({r["base"] for r in rs}) == 1 for rs in parts.values()):
                    break
            mult = math.exp(float(self.theta[k]))
            for vals, rs in parts.items():
                base = rs[0]["base"]
                out.append({"name": rs[0]["name"], "scope": {**scope, **dict(zip(split, vals))}, "start": base,
                            "value": base * mult, "units": rs[0]["units"], "multiplier": mult,
                            "deployments": sorted({r["deployment"] for r in rs})})
        return out


def fit_coefficients(train, free, *, held_out=None, holdout=0.0, seed=0, steps=400, learning_rate=0.05,
                     eval_every=5, patience=10, min_delta=1e-5, temperature=None, loss="l2", huber_delta=0.1,
                     weighting="point", callback=None, compile_workers=None) -> FitResult:
    """Fit the ``free`` coefficients (Free objects or 'PATTERN[@SCOPE][:BOUND]' strings) to the
    ``train`` observations (a list of Observations, one per deployment).

    held_out: observations for early stopping (no deployment in both); or holdout: the
    fraction of the train deployments to hold out (split by deployment, seeded, stratified by
    model where every model has two or more deployments). Every ``eval_every`` steps the
    held-out loss (the training loss when nothing is held out) is evaluated; the fit stops
    after ``patience`` evaluations without a relative improvement of ``min_delta`` and keeps
    the best values. temperature: None fits in exact mode; a float >= 0 prices in smooth mode.
    callback(done, total, stage=..., **info) reports compilation (stage 'compile', once per
    deployment plan; compile_workers threads, default min(4, CPUs)) and then every evaluation
    of the descent (stage 'descent', with train= and held_out= losses).
    """
    if loss not in LOSSES:
        refuse(f"unknown loss (known: {', '.join(LOSSES)})", field="loss", value=loss)
    if weighting not in WEIGHTINGS:
        refuse(f"unknown weighting (known: {', '.join(WEIGHTINGS)})", field="weighting", value=weighting)
    if not (isinstance(huber_delta, (int, float)) and huber_delta > 0):
        refuse("huber_delta must be a positive number", field="huber_delta", value=huber_delta)
    if temperature is not None and not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
                                        and temperature >= 0):
        refuse("must be None (exact mode) or a number >= 0", field="temperature", value=temperature)
    train = list(train)
    if not train:
        refuse("no training observations", field="train")
    names = [o.name for o in train]
    if len(set(names)) != len(names):
        dup = sorted(n for n in set(names) if names.count(n) > 1)[0]
        refuse("two observations share a deployment name (merge them: the split is by deployment)",
               field="train", value=dup)
    if held_out is None and holdout > 0:
        models = {o.name: o.deployment.graph.name for o in train}
        keep, held = split_by_deployment(names, holdout, seed=seed, stratify=models)
        if not held:
            keep, held = split_by_deployment(names, holdout, seed=seed)
        held_out = [o for o in train if o.name in held]
        train = [o for o in train if o.name in keep]
    held_out = list(held_out or [])
    overlap = {o.name for o in train} & {o.name for o in held_out}
    if overlap:
        refuse("a deployment is in both the training and the held-out observations", field="held_out",
               value=sorted(overlap)[0])
    layout = Layout(free)
    settings = {"tau": float(temperature or 0.0), "delta": float(huber_delta), "loss": loss,
                "smooth": temperature is not None}
    train_terms = _terms(train, layout, settings, weighting, record=True, grad=True)
    unmatched = [f.label() for f, n in layout.matched.items() if n == 0]
    if unmatched:
        refuse("no coefficient of the training deployments matches this free pattern (patterns match the "
               "names the deployments' kernels read, e.g. hbm_derate, gemm_eps_max_fp8)", field="free",
               value=unmatched[0])
    held_terms = _terms(held_out, layout, settings, weighting, record=False, grad=False)
    lo, hi = np.array(layout.lo), np.array(layout.hi)
    import os
    workers = compile_workers or min(4, os.cpu_count() or 1)
    _compile_terms(train_terms + held_terms, workers, callback)

    theta, history, best_step, stopped = _descend(
        lambda th: _total(train_terms, th),
        lambda th: _total(held_terms, th)[0] if held_terms else None,
        np.zeros(len(layout.keys)), lo, hi, steps=steps, learning_rate=learning_rate, eval_every=eval_every,
        patience=patience, min_delta=min_delta, callback=callback)
    settings = {"loss": loss, "huber_delta": huber_delta if loss == "huber" else None,
                "target": sorted({o.target for o in train}), "estimate": sorted({o.estimate for o in train}),
                "temperature": temperature, "weighting": weighting, "learning_rate": learning_rate,
                "steps": steps, "eval_every": eval_every, "patience": patience,
                "free": [f.label() for f in layout.free], "train_points": sum(o.points for o in train),
                "held_out_points": sum(o.points for o in held_out), "seed": seed, "holdout": holdout}
    return FitResult(layout=layout, theta=theta, history=history, best_step=best_step, stopped=stopped,
                     train=sorted(o.name for o in train), held_out=sorted(o.name for o in held_out),
                     settings=settings)


# ----------------------------------------------------------------------------- small laws


@dataclasses.dataclass
class LawFit:
    """A fitted law: ``params`` (name -> value), the starting values, losses, and history."""
    params: dict
    start: dict
    loss: float
    initial_loss: float
    history: list
    stopped: str
    at_bound: dict

    def rms_log_error(self) -> float:
        return math.sqrt(self.loss)


def fit_law(law, init: dict, inputs, measured, *, bounds=None, steps=2000, learning_rate=0.05, eval_every=20,
            patience=20, min_delta=1e-7, loss="l2", huber_delta=0.1, callback=None) -> LawFit:
    """Fit the positive parameters of a small law to measurements, by the same projected Adam
    descent as ``fit_coefficients``: theta = log(param / init); the loss is the mean per-point
    loss of ``log(law(params, inputs)) - log(measured)``.

    law(params: dict of scalars, inputs) -> predicted array (jittable). bounds: name -> (lo, hi)
    in the parameter's units (default init / 100 .. init * 100; a fraction of a peak, named
    like ``*eps_max*`` or ``*derate*``, at most 1)."""
    if not init:
        refuse("no parameters to fit", field="init")
    names = list(init)
    x0 = np.array([float(init[n]) for n in names])
    if not np.all(np.isfinite(x0) & (x0 > 0)):
        bad = names[int(np.flatnonzero(~(np.isfinite(x0) & (x0 > 0)))[0])]
        refuse("a starting value must be positive (the fit is in log space)", field=bad, value=init[bad])
    measured = np.asarray(measured, dtype=float)
    if measured.ndim != 1 or not np.all(np.isfinite(measured) & (measured > 0)):
        refuse("measurements must be a 1-d array of positive numbers", field="measured")
    lo, hi = np.log(1e-2) * np.ones(len(names)), np.log(1e2) * np.ones(len(names))
    for i, n in enumerate(names):
        if bounds and n in bounds:
            b_lo, b_hi = bounds[n]
            if not (0 < b_lo <= x0[i] <= b_hi):
                refuse("bounds must be 0 < lo <= start <= hi", field=f"bounds.{n}", value=(b_lo, b_hi))
            lo[i], hi[i] = math.log(b_lo / x0[i]), math.log(b_hi / x0[i])
        if is_fraction(n):
            hi[i] = min(hi[i], max(-math.log(x0[i]), lo[i]))
    if loss not in LOSSES:
        refuse(f"unknown loss (known: {', '.join(LOSSES)})", field="loss", value=loss)
    log_meas = jnp.asarray(np.log(measured))
    xs = jnp.asarray(x0)

    @jax.jit
    def vg(theta):
        def f(th):
            p = dict(zip(names, xs * jnp.exp(th)))
            r = jnp.log(law(p, inputs)) - log_meas
            return jnp.mean(_residual_loss(r, loss, huber_delta))
        return jax.value_and_grad(f)(theta)

    def total(theta):
        v, g = vg(jnp.asarray(theta))
        v = float(v)
        if not math.isfinite(v):
            raise JaxpriceError("the loss is not finite (the law gave a zero or negative prediction)",
                                field="loss", value=v)
        return v, np.asarray(g)

    theta, history, best_step, stopped = _descend(total, lambda th: None, np.zeros(len(names)), lo, hi,
                                                  steps=steps, learning_rate=learning_rate,
                                                  eval_every=eval_every, patience=patience,
                                                  min_delta=min_delta, callback=callback)
    final = total(theta)[0]
    at = {n: ("lower" if t <= l + 1e-9 else "upper") for n, t, l, h in zip(names, theta, lo, hi)
          if t <= l + 1e-9 or t >= h - 1e-9}
    return LawFit(params={n: float(x * math.exp(t)) for n, x, t in zip(names, x0, theta)},
                  start=dict(zip(names, x0.tolist())), loss=final, initial_loss=history[0]["train"],
                  history=history, stopped=stopped, at_bound=at)


# ----------------------------------------------------------------------------- writing


def default_source(result: FitResult, data="") -> str:
    s = result.settings
    held = (f"{len(result.held_out)} held out by deployment ({s['held_out_points']} points)"
            if result.held_out else "none held out")
    return (f"jaxprice.fit on {data or 'the given observations'}: {s['loss']} loss on log "
            f"{'/'.join(s['target'])} ({'/'.join(s['estimate'])}, "
            f"{'exact mode' if s['temperature'] is None else 'temperature %g' % s['temperature']}, "
            f"{s['weighting']} weighting), {len(result.train)} training deployments ({s['train_points']} points), "
            f"{held}; {result.stopped}; kept step {result.best_step}")


def write_coefficient_set(result: FitResult, path, *, name=None, data="", source=None) -> Path:
    """Write the fitted values as a ``jaxprice-coefficients/1`` set (values in registry units,
    ``method: fitted``, each entry's ``fit`` giving its start and multiplier); ``source`` (the
    set's and every entry's cite) defaults to a line naming the data, the loss and the split.
    Load it with ``load_deployment(..., extra_coefficient_files=[path])``: it overrides the
    registry by name, within each entry's scope."""
    import yaml
    path = Path(path)
    name = name or path.stem
    source = source or default_source(result, data)
    s = result.settings
    fin, ini = result.final, result.initial
    meta = {"data": str(data), "loss": s["loss"], "target": s["target"], "estimate": s["estimate"],
            "temperature": s["temperature"], "weighting": s["weighting"], "free": s["free"],
            "steps": s["steps"], "best_step": result.best_step, "stopped": result.stopped,
            "train_loss": {"start": ini["train"], "fitted": fin["train"]},
            "held_out_loss": {"start": ini["held_out"], "fitted": fin["held_out"]},
            "train_deployments": result.train, "held_out_deployments": result.held_out}

    def dump(obj, flow):
        return yaml.safe_dump(obj, default_flow_style=flow, sort_keys=False, width=1 << 30).strip()

    lines = ["# Written by jaxprice.fit; values are in the registry's own units (see `units`).",
             "format: jaxprice-coefficients/1", dump({"name": str(name)}, False), dump({"source": source}, False),
             "fit:"]
    lines += ["  " + ln for ln in dump(meta, False).splitlines()]
    lines.append("entries:")
    order = sorted(result.entries(), key=lambda e: (e["name"], sorted((k, str(v)) for k, v in e["scope"].items())))
    for e in order:
        f = si_factor(e["name"], e["units"])
        entry = {"name": e["name"], "value": float(e["value"] / f), "units": e["units"], "method": "fitted",
                 "fitted": True, "scope": {k: [v] for k, v in e["scope"].items()}, "cite": source,
                 "fit": {"start": float(e["start"] / f), "multiplier": float(e["multiplier"])}}
        lines.append("  - " + dump(entry, True))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
