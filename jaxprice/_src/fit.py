"""Fit: gradient-based calibration of registry coefficients against measurements, built to
transfer (issue 12: a fitted set must not make unseen models or chips worse).

The model is the step kernel itself. The free parameters are log-multipliers on chosen
coefficients, shared over a chosen scope:

* ``Free("gemm_m_half_*", scope=("hardware",), bound=2.0)``: every coefficient whose name matches
  the pattern (``fnmatch``; the first matching ``Free`` wins) gets one multiplier per chip;
  ``scope=()`` ("global") shares one multiplier over every deployment. theta holds
  ``log(multiplier)``, projected after each step onto its range: within a factor ``bound`` of
  the start, tightened to what is physical on every deployment the key lands on
  (``physical_range``: a fraction of a peak at most 1, a KV read rate at most the chip's HBM
  peak, a collective's rate at most its NVLink peak).
* The objective is a weighted mean over points of a per-point loss of the residual
  ``log(pred) - log(measured)`` (on mean TPOT, ``target="tpot"``: the step estimate plus
  ``host_output_token``; or on step times, ``target="step"``; ``loss`` l2 or huber), plus a
  prior ``prior * sum(theta ** 2)`` pulling every free coefficient toward its starting
  (registry) value in log space. ``cross_validate`` / ``choose_prior`` pick its strength by
  holding out whole models, chips or deployments (``cv_folds``: folds never share a deployment,
  nor under 'model' a model).
* Identifiability (``identifiability``): the per-point Jacobian of log(prediction) over theta
  (its J'J is the Gauss-Newton Fisher matrix) is checked before the descent; keys in its
  near-null directions, which the data cannot tell from a combination of the others, or on
  which the data do not depend, are frozen at their starting value, and the result says which
  and why (``FitResult.frozen``). Keys stopped by a bound are listed with the bound and what
  that means (``FitResult.bound_hits``).
* The deployments of one plan structure (one model graph, whatever the chip, parallelism or
  quantization) share ONE jitted ``value_and_grad`` (and Jacobian) on the deployment axis
  (``_StackTerm``: their plans stacked, their coefficient vectors laid over the union of their
  names, their batches and points padded; compiled once per structure and padded shape,
  whatever the free coefficients), each deployment mapping theta onto its own names;
  ``per_deployment=True`` keeps the former path, one compile per deployment (``_Term``).
  Exact mode by default (gradients exist almost everywhere); ``temperature`` switches to
  smooth mode. optax Adam with a cosine-decayed learning rate; early stopping on a held-out
  split by deployment (or on the training objective), keeping the best theta.
* ``write_coefficient_set`` writes the result as a ``jaxprice-coefficients/1`` set whose entries
  are scoped to the chips and models they were fitted on: loading it with another deployment
  leaves that deployment on the registry's values (``set_applies`` says what reaches it).

Under the ``simulate`` batch rule (``observations_from_simulation``, ``SimObservations``) each
point is a closed-loop run of the serving simulation: its schedule is built once (the accuracy
harness's engine settings), and the loss sums the log-errors of the chosen targets, mean TPOT
and/or mean TTFT, each a fixed linear map of the run's step times (``metric_weights``), so the
gradient flows exactly through the re-priced steps (``simfit``: one compiled function per
plan structure, decode-only stretches priced in blocks); the prior, bounds, identifiability, solvers,
cross-validation (with TTFT scores: ``score_simulated``) and the written set work unchanged.

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
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .errors import JaxpriceError, check_callback, refuse, shown
from .formats import Registry
from .plan import Batch, Coefficients
from .resolve import Deployment, load_deployment, serving_engine, si_factor
from .step import _step_time, exact_at_zero

SCOPE_DIMS = ("hardware", "model", "tp", "ep", "nodes_spanned", "engine")
FRACTION_PATTERNS = ("*eps_max*", "*derate*")
TARGETS = ("tpot", "step")
ESTIMATES = ("no_overlap", "overlap")
LOSSES = ("l2", "huber")
WEIGHTINGS = ("point", "deployment")
METHODS = ("adam", "gauss-newton")


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
        if isinstance(self.scope, str):         # one dimension, not its letters ('global': one value everywhere)
            object.__setattr__(self, "scope", () if self.scope.strip() == "global" else (self.scope,))
        if self.scope is None or not hasattr(self.scope, "__iter__"):
            refuse("expected a tuple of scope dimensions (() = one value everywhere)", field="free.scope",
                   value=self.scope, has_value=True)
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
            dims = tuple(s.strip() for s in scope.split(","))
            if not all(dims):          # 'hardware,,model' dropped the empty entry silently
                refuse("an empty entry in the scope list (PATTERN[@SCOPE][:BOUND])", field="free", value=text)
        try:
            return Free(pattern.strip(), dims, bound)
        except JaxpriceError as err:
            raise JaxpriceError(f"{err.reason} (PATTERN[@SCOPE][:BOUND])", field="free", value=text) from None

    def label(self) -> str:
        return f"{self.pattern}@{','.join(self.scope) or 'global'}:{self.bound:g}"


def _as_free(f) -> Free:
    if not isinstance(f, (str, Free)):
        refuse("expected a Free or a 'PATTERN[@SCOPE][:BOUND]' string", field="free", value=shown(f), has_value=True)
    return Free.parse(f) if isinstance(f, str) else f


def is_fraction(name: str) -> bool:
    """A fraction of a peak (GEMM eps_max, HBM derate): physical values are at most 1."""
    return any(fnmatch.fnmatchcase(name, p) for p in FRACTION_PATTERNS)


def deployment_dims(dep: Deployment) -> dict:
    """The values of the scope dimensions for one deployment (as the resolver scopes entries)."""
    r = dep.resolution
    return {"hardware": dep.chip.name, "model": dep.graph.name, "tp": int(r["tp"]),
            "ep": int(r["ep"]), "nodes_spanned": int(r["nodes_spanned"]), "engine": serving_engine(dep.scenario)}


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
    steps that carry a prefill chunk); without it, point i is batch i. ``sweeps`` and
    ``concurrency`` (optional, [n]): each point's sweep and client concurrency, for the shape
    error of cross-validation (``score_points``)."""
    name: str
    deployment: Deployment
    batches: Batch
    measured: np.ndarray
    target: str = "tpot"
    estimate: str = "no_overlap"
    weights: np.ndarray | None = None
    combine: np.ndarray | None = None
    sweeps: np.ndarray | None = None
    concurrency: np.ndarray | None = None

    def __post_init__(self):
        if not isinstance(self.batches, Batch):
            refuse("needs stacked batches (Batch.stack([...]): [points, rows])", field=f"{self.name}.batches",
                   value=type(self.batches).__name__)
        if not isinstance(self.deployment, Deployment):
            refuse("needs a Deployment (jaxprice.load_deployment(...))", field=f"{self.name}.deployment",
                   value=type(self.deployment).__name__)
        try:
            self.measured = np.asarray(self.measured, dtype=float).reshape(-1)
        except (TypeError, ValueError):
            refuse("measured times must be numbers (seconds)", field=f"{self.name}.measured",
                   value=str(self.measured)[:80], has_value=True)
        if self.target not in TARGETS:
            refuse(f"unknown target (known: {', '.join(TARGETS)})", field="target", value=self.target)
        if self.estimate not in ESTIMATES:
            refuse(f"unknown estimate (known: {', '.join(ESTIMATES)})", field="estimate", value=self.estimate)
        if np.ndim(self.batches.scheduled) != 2:       # one batch read as "-1 stacked batches"
            refuse(f"needs stacked batches (Batch.stack([...]): [points, rows]); got token counts of shape "
                   f"{np.shape(self.batches.scheduled)}", field=f"{self.name}.batches")
        n = int(np.shape(self.batches.scheduled)[0])
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
        if (self.sweeps is None) != (self.concurrency is None):
            refuse("sweeps and concurrency come together", field=f"{self.name}.sweeps")
        if self.sweeps is not None:
            self.sweeps = np.asarray(self.sweeps).reshape(-1)
            self.concurrency = np.asarray(self.concurrency, dtype=float).reshape(-1)
            if self.sweeps.shape != (n,) or self.concurrency.shape != (n,):
                refuse(f"sweeps and concurrency need one value per point ({n})", field=f"{self.name}.sweeps")

    @property
    def points(self) -> int:
        return int(self.measured.size)

    @property
    def dims(self) -> dict:
        return deployment_dims(self.deployment)


def observations_from_groups(groups, *, target="tpot", estimate="no_overlap", points=None):
    """Observations from ``jaxprice.accuracy.group_points`` groups (one per deployment): the
    same stacked batches and, under the ``interleaved`` batch rule, the same ``combine``.
    ``points`` (the point list the groups index) adds each point's sweep and concurrency."""
    out = []
    for g in groups:
        extra = {}
        if points is not None:
            extra = {"sweeps": np.array([points[i].sweep for i in g.index]),
                     "concurrency": np.array([points[i].concurrency for i in g.index])}
        out.append(Observations(g.name, g.deployment, g.batches, g.measured, target, estimate,
                                combine=getattr(g, "combine", None), **extra))
    return out


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
    accuracy.check_registry(registry)
    if estimate not in ESTIMATES:
        refuse(f"unknown estimate (known: {', '.join(ESTIMATES)})", field="estimate", value=estimate)
    scenario_dirs = accuracy.path_list(scenario_dirs, "scenario_dirs")
    extra_coefficient_files = accuracy.path_list(extra_coefficient_files, "extra_coefficient_files", none=())
    accuracy.check_scenario_dirs(scenario_dirs)
    points, _ = accuracy.read_measurements(csv_path)
    points = accuracy.select_deployments(points, deployments, csv_path)
    groups, refused = accuracy.group_points(points, registry=registry, scenario_dirs=scenario_dirs,
                                            extra_coefficient_files=extra_coefficient_files, source=str(csv_path),
                                            batch_rule=batch_rule)
    return observations_from_groups(groups, target="tpot", estimate=estimate, points=points), refused, points


STEP_COLUMNS = ("scenario", "requests", "context", "value", "unit")
STEP_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
# A step CSV's caps: requests in one step (a batch file's, schema.MAX_REQUESTS), padded rows of one
# scenario (rows x its largest step: 2**22 take ~1.5 GB), and step times a GPU can take (a value
# outside is a unit error: no step prices under 1 us or runs an hour).
MAX_STEP_CSV_ROWS = 1 << 22
PLAUSIBLE_STEP_SECONDS = (1e-6, 3600.0)


def read_step_measurements(csv_path, *, registry=None, estimate="no_overlap", extra_coefficient_files=()):
    """Step-time observations from a CSV with columns scenario (a bundled scenario name or a
    path), requests, context (tokens in cache after the step), value, unit (us, ms or s), and
    optional tokens (scheduled per request, default 1) and decode_threshold (default 8). Each
    row is one uniform batch of ``requests`` rows; one Observations per scenario."""
    from .formats import _check_path
    _check_path(csv_path, "csv_path")       # open(5) would read file descriptor 5
    file = str(csv_path)
    try:
        fh = open(csv_path, newline="", encoding="utf-8-sig")      # a spreadsheet's byte-order mark: read
    except (FileNotFoundError, IsADirectoryError):
        refuse("file not found", file=file)
    try:
        with fh:
            return _step_observations(fh, file, registry, estimate, extra_coefficient_files)
    except UnicodeDecodeError:
        refuse("not a text CSV file (not UTF-8)", file=file)


def _step_observations(fh, file, registry, estimate, extra_coefficient_files):
    """The step layout's Observations, one per scenario: each row (requests decoding ``tokens``
    at ``context``, a measured step time) checked where it is read, every scenario's padded
    rows capped, then each scenario loaded and its rows stacked as decode batches."""
    reader = csv.DictReader(fh)
    cols = _step_header(reader, file)
    rows: dict = {}
    first_line: dict = {}      # scenario -> the CSV line naming it first (named when it cannot load)
    for i, r in enumerate(reader, start=2):
        scenario, vals, seconds = _step_row(r, cols, f"{file}:{i}")
        rows.setdefault(scenario, []).append((vals, seconds))
        first_line.setdefault(scenario, i)
    if not rows:
        refuse("no rows", file=file)
    _check_step_padding(rows, first_line, file)
    reg = registry or Registry()
    return [_step_scenario(scen, rs, f"{file}:{first_line[scen]}", reg, estimate, extra_coefficient_files)
            for scen, rs in rows.items()]


def _step_header(reader, file) -> list:
    """The header's columns: every STEP_COLUMNS present, none twice."""
    cols = reader.fieldnames or []
    missing = [c for c in STEP_COLUMNS if c not in cols]
    if missing:
        refuse(f"missing column(s) {', '.join(missing)} (step layout: {', '.join(STEP_COLUMNS)}"
               ", optional tokens, decode_threshold)", file=file, field="header", value=missing[0])
    twice = [c for c in cols if cols.count(c) > 1]
    if twice:
        refuse("column appears twice in the header (which one holds the data?)", file=f"{file}:1",
               field="header", value=twice[0])
    return cols


def _step_row(r, cols, where) -> tuple:
    """(scenario, its counts, the measured step in seconds) of one CSV row, checked."""
    if None in r:
        refuse(f"row has {len(cols) + len(r[None])} fields, the header {len(cols)}", file=where,
               field="row", value=r[None][0])
    short = [c for c in cols if r.get(c) is None]
    if short:
        refuse(f"row has fewer fields than the header ({len(cols) - len(short)} of {len(cols)})", file=where,
               field=short[0])
    r = {k: v.strip() for k, v in r.items()}
    if not r["scenario"]:
        refuse("must not be empty (a bundled scenario name or a scenario file)", file=where,
               field="scenario", value="")
    vals = _step_counts(r, where)
    seconds = _step_seconds(r, where)
    if vals["context"] < vals["tokens"]:
        refuse("context (tokens in cache after the step) must be >= tokens", file=where, field="context",
               value=vals["context"])
    return r["scenario"], vals, seconds


def _step_counts(r, where) -> dict:
    """requests, context, tokens (default 1) and decode_threshold (default 8) of a row: integers,
    positive (the threshold non-negative), below the kernel's limits."""
    from .plan import INT_TOKEN_LIMIT
    from .schema import MAX_REQUESTS
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
        if col == "requests" and v > MAX_REQUESTS:
            refuse(f"must be at most {MAX_REQUESTS} (2**20, the most requests in one step)", file=where,
                   field=col, value=text)
        if v >= INT_TOKEN_LIMIT:
            refuse(f"must be below {INT_TOKEN_LIMIT} (the kernel's token limit, 2**24)", file=where, field=col,
                   value=text)
        vals[col] = int(v)
    return vals


def _step_seconds(r, where) -> float:
    """A row's measured step in seconds: a positive number in a known unit, 1 us to 1 hour."""
    try:
        val = float(r["value"])
    except (TypeError, ValueError):
        refuse("expected a number", file=where, field="value", value=r["value"])
    if not math.isfinite(val) or val <= 0:
        refuse("a measured step time must be a positive number", file=where, field="value", value=r["value"])
    if r["unit"] not in STEP_UNITS:
        refuse(f"unknown unit (known: {', '.join(STEP_UNITS)})", file=where, field="unit", value=r["unit"])
    lo, hi = PLAUSIBLE_STEP_SECONDS
    if not lo <= val * STEP_UNITS[r["unit"]] <= hi:
        refuse(f"{val * STEP_UNITS[r['unit']]:.3g} s is not a step time (1 us to 1 hour): check the value "
               f"and its unit '{r['unit']}'", file=where, field="value", value=r["value"])
    return val * STEP_UNITS[r["unit"]]


def _check_step_padding(rows, first_line, file) -> None:
    """Refuse a scenario whose steps, padded to its largest, pass MAX_STEP_CSV_ROWS rows."""
    for scen, rs in rows.items():
        pad = max(v["requests"] for v, _ in rs)
        if len(rs) * pad > MAX_STEP_CSV_ROWS:
            refuse(f"{len(rs)} steps padded to its largest, {pad} requests, make {len(rs) * pad} rows, past the cap "
                   f"of {MAX_STEP_CSV_ROWS} (2**22) per scenario", file=f"{file}:{first_line[scen]}",
                   field="scenario", value=scen)


def _step_scenario(scen, rs, where, reg, estimate, extra_coefficient_files):
    """One scenario's Observations: its deployment (a load failure refused at ``where``, the
    line naming it first) and its rows stacked as decode batches padded to the largest."""
    try:
        dep = load_deployment(scen, reg, extra_coefficient_files=extra_coefficient_files)
    except JaxpriceError as err:
        refuse(str(err), file=where, field="scenario")
    pad = max(v["requests"] for v, _ in rs)
    batches = Batch.stack([Batch.decode(v["requests"], v["context"], tokens=v["tokens"], pad_to=pad,
                                        decode_threshold=v["decode_threshold"]) for v, _ in rs])
    return Observations(dep.name, dep, batches, np.array([t for _, t in rs]), "step", estimate)


def split_by_deployment(names, test_fraction=0.25, *, seed=0, stratify=None):
    """Split deployment names into sorted (train, test) lists, never splitting one name.

    Within each stratum (``stratify``: a callable or a mapping name -> stratum; default one
    stratum) a seeded shuffle sends ``round(test_fraction * n)`` names to test, at least 1
    and at most n - 1 when the stratum has n >= 2 names and the fraction is > 0."""
    if names is None or isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        refuse("must be a list of deployment names (one name would be split into its letters)", field="names",
               value=shown(names), has_value=True)
    names = list(names)
    for i, n in enumerate(names):
        if not isinstance(n, str):
            refuse("must be a deployment name (text)", field=f"names[{i}]", value=shown(n), has_value=True)
    names = sorted(set(names))
    if isinstance(test_fraction, bool) or not (isinstance(test_fraction, (int, float)) and 0 <= test_fraction < 1):
        refuse("the held-out fraction must be in [0, 1)", field="test_fraction", value=test_fraction, has_value=True)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        refuse("must be an integer >= 0", field="seed", value=shown(seed), has_value=True)
    if stratify is not None and not (isinstance(stratify, dict) or callable(stratify)):
        refuse("must be None, a dict {name: stratum} or a function name -> stratum", field="stratify",
               value=shown(stratify), has_value=True)
    if isinstance(stratify, dict):
        missing = [n for n in names if n not in stratify]
        if missing:
            refuse("names no stratum for this deployment (every name needs one)", field="stratify",
                   value=missing[0], has_value=True)
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


# ----------------------------------------------------------------------------- physical bounds


def physical_range(name: str, chip) -> tuple:
    """(lo, hi, why): the SI range physics allows a coefficient on a chip, whatever the data
    (None: that side is open). A fraction of a peak (``*eps_max*``, ``*derate*``) is at most 1;
    a KV read rate (``attention_decode_rate*``) at most the chip's HBM peak; a collective's
    rate at most the chip's NVLink peak (both directions)."""
    if is_fraction(name):
        return None, 1.0, "a fraction of the chip's peak is at most 1"
    if fnmatch.fnmatchcase(name, "attention_decode_rate*") and chip is not None and chip.hbm_tbs > 0:
        return None, chip.hbm_tbs * 1e12, f"a KV read rate is at most {chip.name}'s HBM peak ({chip.hbm_tbs:g} TB/s)"
    if fnmatch.fnmatchcase(name, "collective_*_rate_*") and chip is not None and (chip.nvlink_gbps or 0) > 0:
        return (None, 2e9 * chip.nvlink_gbps,
                f"a collective's rate is at most {chip.name}'s NVLink peak (2 x {chip.nvlink_gbps:g} GB/s)")
    return None, None, None


# ----------------------------------------------------------------------------- layout


class Layout:
    """The free keys (coefficient name + scope values), where each lands in each deployment's
    coefficient vector, and each key's range for theta = log(multiplier): the ``Free`` factor
    bound, tightened by ``physical_range`` on every deployment the key lands on. ``lo_why`` /
    ``hi_why`` say which bound is which; ``frozen`` maps a key index to why it is held at its
    starting value (identifiability)."""

    def __init__(self, free):
        self.free = tuple(_as_free(f) for f in free)
        if not self.free:
            refuse("no free coefficients given", field="free")
        self.keys: list = []
        self._index: dict = {}
        self.records: list = []      # per (key, training deployment): key, name, dims, base SI, units
        self.lo: list = []
        self.hi: list = []
        self.lo_why: list = []
        self.hi_why: list = []
        self.frozen: dict = {}
        self.matched = {f: 0 for f in self.free}

    def spec_for(self, name):
        return next((f for f in self.free if fnmatch.fnmatchcase(name, f.pattern)), None)

    def _add_key(self, key, spec):
        self._index[key] = len(self.keys)
        self.keys.append(key)
        why = f"the fit's range, a factor {spec.bound:g} from the starting value ({spec.label()})"
        self.lo.append(-math.log(spec.bound))
        self.hi.append(math.log(spec.bound))
        self.lo_why.append(why)
        self.hi_why.append(why)
        return self._index[key]

    def _tighten(self, k, name, base, chip):
        """Narrow key k's range so that the value stays physical on this deployment too."""
        p_lo, p_hi, why = physical_range(name, chip)
        if p_hi is not None:
            h = max(math.log(p_hi / base), self.lo[k])
            if h < self.hi[k]:
                self.hi[k], self.hi_why[k] = h, f"physical: {why}"
        if p_lo is not None:
            lo = min(math.log(p_lo / base), self.hi[k])
            if lo > self.lo[k]:
                self.lo[k], self.lo_why[k] = lo, f"physical: {why}"

    def kmap(self, dep: Deployment, *, create: bool, record: bool = False, tighten: bool = False) -> np.ndarray:
        """Per name of the deployment's coefficient vector, the index of its key (-1: not free).
        ``create`` adds keys the deployment brings; ``record`` notes its starting values (for
        writing the set); ``tighten`` narrows each key's range to what is physical on this
        deployment too (``physical_range``)."""
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
                self._add_key(key, spec)
            k = self._index[key]
            base = float(vals[i])
            if not (math.isfinite(base) and base > 0):
                refuse("a free coefficient must start positive (it is fitted in log space)",
                       file=dep.scenario.path, field=name, value=base, has_value=True)
            if tighten:
                self._tighten(k, name, base, getattr(dep, "chip", None))
            if record:
                self.matched[spec] += 1
                self.records.append({"key": k, "name": name, "dims": dims, "base": base,
                                     "units": coefs.units[i], "deployment": dep.name})
            out[i] = k
        return out

    def freeze(self, k, reason):
        """Hold key k at its starting value (theta 0), saying why."""
        self.frozen[k] = reason
        self.lo[k] = self.hi[k] = 0.0

    def index(self, key):
        return self._index.get(key)

    def labels(self) -> list:
        return [key_label(k) for k in self.keys]


# ----------------------------------------------------------------------------- the loss, jitted per plan


def _residual_loss(r, loss, delta):
    if loss == "l2":
        return r * r
    a = jnp.abs(r)
    return jnp.where(a <= delta, r * r, 2.0 * delta * a - delta * delta)


def _residual_loss_slope(r, loss, delta):
    """d _residual_loss / d r (NumPy): 2 r, or for Huber 2 r inside delta and 2 delta sign(r) beyond."""
    r = np.asarray(r)
    return 2.0 * r if loss == "l2" else np.where(np.abs(r) <= delta, 2.0 * r, 2.0 * delta * np.sign(r))


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


def _log_jacobian(u, values, batches, combine, log_meas, weights, delta, *, plan, names, target, estimate, loss,
                  smooth, tau):
    """(log(prediction) [points], d log(prediction) / d u [points, names]): the Gauss-Newton
    solver's, the identifiability check's and cross-validation's one compiled function."""
    def logpred(uu):
        lp = jnp.log(_predict(plan, Coefficients(values * jnp.exp(uu), names), batches, combine, tau, target,
                              estimate, smooth))
        return lp, lp
    jac, lp = jax.jacfwd(logpred, has_aux=True)(u)
    return lp, jac


_STATIC = ("plan", "names", "target", "estimate", "loss", "smooth", "tau")   # tau static: no cond
_KINDS = {"grad": jax.jit(jax.value_and_grad(_objective), static_argnames=_STATIC),
          "value": jax.jit(_objective, static_argnames=_STATIC),
          "jac": jax.jit(_log_jacobian, static_argnames=_STATIC)}


@functools.partial(jax.jit, static_argnames=("plan", "names", "target", "estimate", "smooth", "tau"))
def _predict_u(u, values, batches, combine, *, plan, names, target, estimate, smooth, tau):
    return _predict(plan, Coefficients(values * jnp.exp(u), names), batches, combine, tau, target, estimate, smooth)


_COMPILED: dict = {}         # (kind, plan, names, batch shape, settings) -> compiled executable
_COMPILED_MAX = 512


class _Term:
    """One deployment's share of a loss: its arguments on device and its compiled function.
    kind 'grad': (loss, gradient over theta); 'value': loss only; 'jac': the per-point
    Jacobian of log(prediction) over u (its raw output)."""

    def __init__(self, obs: Observations, kmap, weight_total, weighting, n_deployments, settings, kind):
        self.obs = obs
        self.kmap = np.asarray(kmap)
        w = np.asarray(obs.weights, dtype=float) if obs.weights is not None else np.ones(obs.points)
        w = w / (w.sum() * n_deployments) if weighting == "deployment" else w / weight_total
        self.weights = w
        self.kind = kind
        coefs = obs.deployment.coefficients
        combine = None if obs.combine is None else jnp.asarray(obs.combine, dtype=float)
        self.args = (jnp.asarray(coefs.values, dtype=float), obs.batches, combine, jnp.asarray(np.log(obs.measured)),
                     jnp.asarray(w), float(settings["delta"]))
        self.kw = {"plan": obs.deployment.plan, "names": tuple(coefs.names), "target": obs.target,
                   "estimate": obs.estimate, "loss": settings["loss"], "smooth": bool(settings["smooth"]),
                   "tau": float(settings["tau"]) if settings["smooth"] else 0.0}
        self.cache_key = (kind, self.kw["plan"], self.kw["names"], tuple(np.shape(obs.batches.scheduled)),
                          None if obs.combine is None else np.shape(obs.combine),
                          *(self.kw[k] for k in ("target", "estimate", "smooth", "tau")),
                          None if kind == "jac" else self.kw["loss"])       # the Jacobian ignores the loss
        self.log_meas = np.log(obs.measured)
        self.fn = _COMPILED.get(self.cache_key)

    def compile(self):
        """Lower and compile (thread-safe: called from a pool; the cache is filled by the caller)."""
        u = jnp.zeros(len(self.kw["names"]))
        return _KINDS[self.kind].lower(u, *self.args, **self.kw).compile()

    def __call__(self, theta):
        u = jnp.asarray(log_multipliers(theta, self.kmap))
        if self.kind == "grad":
            v, gu = self.fn(u, *self.args)
            gu = np.asarray(gu)
            mapped = self.kmap >= 0
            return float(v), np.bincount(self.kmap[mapped], weights=gu[mapped], minlength=len(theta))
        if self.kind == "jac":
            lp, ju = self.fn(u, *self.args)
            return np.asarray(lp), np.asarray(ju)
        return float(self.fn(u, *self.args)), None

    def pred_jac(self, theta, n_keys):
        """(log(prediction) [points], d log(prediction) / d theta [points, keys])."""
        lp, ju = self(theta)
        out = np.zeros((ju.shape[0], n_keys))
        for i, k in enumerate(self.kmap):
            if k >= 0:
                out[:, k] += ju[:, i]
        return lp, out

    def jacobian_theta(self, theta, n_keys) -> np.ndarray:
        """Rows sqrt(weight) * d log(prediction) / d theta: [points, keys]."""
        return self.pred_jac(theta, n_keys)[1] * np.sqrt(self.weights)[:, None]


def _compile_terms(terms, workers, callback=None):
    """Compile every term not compiled yet, in a thread pool (XLA compiles outside the GIL).
    Returns how many executables were compiled (terms sharing a plan, names, shapes and
    settings share one)."""
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


# ----------------------------------------------------------------------------- the loss on the deployment axis
#
# The deployments of one plan structure (stack.Structure: one model graph, whatever the chip,
# parallelism or quantization) share ONE compiled function: their plans' values are stacked
# (stack.stack_plans), their coefficient vectors laid over the union of their names (a name a
# deployment lacks is 0 there, with log-multiplier 0: it reads nothing and gets no gradient),
# their batches padded to one shape (stack.pad_batches: empty batches and padding rows), and
# each deployment's points are ``combine`` @ (its batches' estimates) (the identity without a
# combine), padded with points of weight 0 that are masked out of the loss. The counts of
# deployments, points and batches are rounded up to multiples of 4, 8 and 8, rows to a multiple
# of 64 and names to a power of two (a padded deployment repeats the first with weight 0), so
# the subsets of cross-validation's folds mostly reuse one compilation at little extra work. The value and gradient are vmapped over the deployments; the
# Jacobian is mapped (lax.map) over them, one deployment's forward-mode Jacobian at a time.


def _bucket(n, least=1):
    """n rounded up to a power of two (at least ``least``)."""
    return max(least, 1 << max(int(n) - 1, 0).bit_length())


def _round_up(n, k):
    return -(-int(n) // k) * k


def _stack_pred(u, values, svalues, index, batches, combine, hot, *, structure, estimate, smooth, tau):
    """One deployment's points: combine @ (its batches' estimates), plus its host_output_token
    (``hot``: one-hot over its names; zero for target 'step' or a deployment without one)."""
    from .step import _batched_kernel
    coefs = values * jnp.exp(u)
    res = exact_at_zero(lambda t: _batched_kernel(structure, svalues, index, coefs, batches, t, False),
                        tau if smooth else None)
    return combine @ getattr(res, estimate) + jnp.sum(coefs * hot)


def _stack_objective(u, values, svalues, index, batches, combine, hot, log_meas, weights, mask, delta, *, structure,
                     estimate, loss, smooth, tau):
    pred = jax.vmap(functools.partial(_stack_pred, structure=structure, estimate=estimate, smooth=smooth, tau=tau))(
        u, values, svalues, index, batches, combine, hot)
    r = jnp.where(mask, jnp.log(jnp.where(mask, pred, 1.0)) - log_meas, 0.0)
    return jnp.sum(weights * _residual_loss(r, loss, delta))


def _stack_log_jacobian(u, values, svalues, index, batches, combine, hot, log_meas, weights, mask, delta, *,
                        structure, estimate, loss, smooth, tau):
    """(log(prediction) [deployments, points], d log(prediction) / d u [deployments, points, names])."""
    def one(args):
        uu, v, sv, idx, b, c, h, m = args

        def logpred(x):
            lp = jnp.log(jnp.where(m, _stack_pred(x, v, sv, idx, b, c, h, structure=structure, estimate=estimate,
                                                  smooth=smooth, tau=tau), 1.0))
            return lp, lp
        jac, lp = jax.jacfwd(logpred, has_aux=True)(uu)
        return lp, jac
    return jax.lax.map(one, (u, values, svalues, index, batches, combine, hot, mask))


_STACK_STATIC = ("structure", "estimate", "loss", "smooth", "tau")
_STACK_KINDS = {"grad": jax.jit(jax.value_and_grad(_stack_objective), static_argnames=_STACK_STATIC),
                "value": jax.jit(_stack_objective, static_argnames=_STACK_STATIC),
                "jac": jax.jit(_stack_log_jacobian, static_argnames=_STACK_STATIC)}


def _stack_inputs(group, kmaps, weights):
    """The padded arrays of a group of Observations of one structure (see above): a dict of
    NumPy arrays and the stack, plus each deployment's point count."""
    from .stack import pad_batches, stack_plans
    D = _round_up(len(group), 4)
    names = list(dict.fromkeys(n for o in group for n in o.deployment.coefficients.names))
    N = _bucket(len(names), 64)
    pos = {n: i for i, n in enumerate(names)}
    npts = [o.points for o in group]
    nb = [int(np.shape(o.batches.scheduled)[0]) for o in group]
    P, B = _round_up(max(npts), 8), _round_up(max(nb), 8)
    R = _round_up(max(int(np.shape(o.batches.scheduled)[1]) for o in group), 64)
    a = {"values": np.zeros((D, N)), "kidx": np.full((D, N), -1), "combine": np.zeros((D, P, B)),
         "hot": np.zeros((D, N)), "log_meas": np.zeros((D, P)), "weights": np.zeros((D, P)),
         "mask": np.zeros((D, P), bool)}
    for d, (o, km, w) in enumerate(zip(group, kmaps, weights)):
        coefs = o.deployment.coefficients
        cols = [pos[n] for n in coefs.names]
        a["values"][d, cols] = np.asarray(coefs.values, dtype=float)
        a["kidx"][d, cols] = km
        a["combine"][d, :npts[d], :nb[d]] = np.eye(nb[d]) if o.combine is None else o.combine
        if o.target == "tpot" and "host_output_token" in pos:
            a["hot"][d, pos["host_output_token"]] = 1.0 if "host_output_token" in coefs else 0.0
        a["log_meas"][d, :npts[d]] = np.log(o.measured)
        a["weights"][d, :npts[d]] = w
        a["mask"][d, :npts[d]] = True
    for k in ("values", "combine", "hot"):        # a padded deployment repeats the first, weight 0
        a[k][len(group):] = a[k][0]
    plans = [o.deployment.plan for o in group] + [group[0].deployment.plan] * (D - len(group))
    stack = stack_plans(plans)
    batches, _ = pad_batches([o.batches for o in group] + [group[0].batches] * (D - len(group)),
                             min_batches=B, min_rows=R)
    a["index"] = stack.role_index(tuple(names) + tuple(f"\0pad{i}" for i in range(N - len(names))))
    return a, stack, batches, npts


class _StackTerm:
    """The deployments of one plan structure as one share of a loss, one compiled function
    (``_STACK_KINDS``); the same interface as ``_Term`` (kind 'grad', 'value' or 'jac')."""

    def __init__(self, group, kmaps, weight_total, weighting, n_deployments, settings, kind):
        self.obs, self.kind = list(group), kind
        ws = []
        for o in self.obs:
            w = np.asarray(o.weights, dtype=float) if o.weights is not None else np.ones(o.points)
            ws.append(w / (w.sum() * n_deployments) if weighting == "deployment" else w / weight_total)
        a, stack, batches, self.npts = _stack_inputs(self.obs, [np.asarray(k) for k in kmaps], ws)
        self.kidx = a["kidx"]
        self.weights = np.concatenate(ws)
        self.log_meas = np.concatenate([np.log(o.measured) for o in self.obs])
        put = jax.device_put
        self.args = (put(a["values"]), put(np.asarray(stack.values)), put(a["index"]), batches, put(a["combine"]),
                     put(a["hot"]), put(a["log_meas"]), put(a["weights"]), put(a["mask"]), float(settings["delta"]))
        est = {o.estimate for o in self.obs}
        self.kw = {"structure": stack.structure, "estimate": est.pop(), "loss": settings["loss"],
                   "smooth": bool(settings["smooth"]), "tau": float(settings["tau"]) if settings["smooth"] else 0.0}
        shapes = tuple(tuple(np.shape(x)) for x in jax.tree_util.tree_leaves(self.args[:-1]))
        self.cache_key = ("stack", kind, self.kw["structure"], shapes, self.kw["estimate"], self.kw["smooth"],
                          self.kw["tau"], None if kind == "jac" else self.kw["loss"])
        self.fn = _COMPILED.get(self.cache_key)

    def compile(self):
        u = jnp.zeros(self.kidx.shape)
        return _STACK_KINDS[self.kind].lower(u, *self.args, **self.kw).compile()

    def _u(self, theta):
        return jax.device_put(log_multipliers(theta, self.kidx))

    def __call__(self, theta):
        if self.kind == "grad":
            v, gu = self.fn(self._u(theta), *self.args)
            gu = np.asarray(gu)
            mapped = self.kidx >= 0
            return float(v), np.bincount(self.kidx[mapped], weights=gu[mapped], minlength=len(theta))
        if self.kind == "jac":
            lp, ju = self.fn(self._u(theta), *self.args)
            return np.asarray(lp), np.asarray(ju)
        return float(self.fn(self._u(theta), *self.args)), None

    def pred_jac(self, theta, n_keys):
        """(log(prediction) [points], d log(prediction) / d theta [points, keys]), the points of
        every deployment in order."""
        lp, ju = self(theta)
        lps, outs = [], []
        for d, n in enumerate(self.npts):
            out = np.zeros((n, n_keys))
            mapped = np.flatnonzero(self.kidx[d] >= 0)
            np.add.at(out.T, self.kidx[d][mapped], ju[d, :n][:, mapped].T)
            lps.append(lp[d, :n])
            outs.append(out)
        return np.concatenate(lps), np.concatenate(outs, axis=0)

    def jacobian_theta(self, theta, n_keys) -> np.ndarray:
        """Rows sqrt(weight) * d log(prediction) / d theta: [points, keys]."""
        return self.pred_jac(theta, n_keys)[1] * np.sqrt(self.weights)[:, None]


_stack_predict_jit = jax.jit(
    lambda u, values, svalues, index, batches, combine, hot, *, structure, estimate, smooth, tau: jax.vmap(
        functools.partial(_stack_pred, structure=structure, estimate=estimate, smooth=smooth, tau=tau))(
        u, values, svalues, index, batches, combine, hot),
    static_argnames=("structure", "estimate", "smooth", "tau"))


def predict_stacked(observations, layout=None, theta=None, *, temperature=None) -> dict:
    """{name: predicted times (seconds) of its points} for Observations (not simulated ones),
    one call and one compile per plan structure and estimate (the deployment axis), at
    ``theta`` on ``layout``'s keys (None: every deployment's own values)."""
    from .stack import structure_of
    groups: dict = {}
    for o in observations:
        groups.setdefault((structure_of(o.deployment.plan), o.estimate), []).append(o)
    out = {}
    for (_, estimate), group in groups.items():
        kmaps = [np.full(len(o.deployment.coefficients.names), -1) if layout is None else
                 np.asarray(layout.kmap(o.deployment, create=False)) for o in group]
        a, stack, batches, npts = _stack_inputs(group, kmaps, [np.ones(o.points) for o in group])
        u = log_multipliers(np.zeros(0) if theta is None else theta, a["kidx"])
        pred = np.asarray(_stack_predict_jit(
            jax.device_put(u), *(jax.device_put(np.asarray(x)) for x in (a["values"], stack.values, a["index"])),
            batches, *(jax.device_put(a[k]) for k in ("combine", "hot")), structure=stack.structure,
            estimate=estimate, smooth=temperature is not None, tau=float(temperature or 0.0)))
        out.update({o.name: pred[d, :npts[d]] for d, o in enumerate(group)})
    return out


def _terms(observations, layout, settings, weighting, *, record, kind, per_deployment=False):
    """One term per simulated observation, and (``per_deployment``: one per deployment) one per
    plan structure and estimate of the others (``_StackTerm``)."""
    from .stack import structure_of
    total_w = sum(float(np.sum(o.weights)) if o.weights is not None else o.points for o in observations)
    if total_w <= 0 and observations:
        refuse("every weight is zero", field="weights")
    n = len(observations)
    terms, groups, sims = [], {}, []
    for o in observations:     # keys are created in the observations' order, whatever the grouping
        if isinstance(o, SimObservations):
            sims.append(o)
            continue
        kmap = layout.kmap(o.deployment, create=record, record=record, tighten=True)
        if per_deployment:
            terms.append(_Term(o, kmap, total_w, weighting, n, settings, kind))
        else:
            groups.setdefault((structure_of(o.deployment.plan), o.estimate), []).append((o, kmap))
    terms += [_StackTerm([o for o, _ in g], [k for _, k in g], total_w, weighting, n, settings, kind)
              for g in groups.values()]
    if sims:
        from . import simfit
        terms += simfit.terms(sims, layout, total_w, weighting, n, settings, kind, record=record)
    return terms


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


def _workers(n=None):
    import os
    return n or min(4, os.cpu_count() or 1)


# ----------------------------------------------------------------------------- identifiability


@dataclasses.dataclass
class Identifiability:
    """Which free keys the training data can tell apart, from the Jacobian J of log(prediction)
    over theta (rows weighted as the loss weighs points; J'J is the Gauss-Newton Fisher matrix).

    ``sensitivity[k]``: the weighted RMS change of log(prediction) per unit of theta_k.
    ``independence[k]``: the share (0..1, as a norm) of key k's normalised Jacobian column that
    no combination of the other kept keys' columns reproduces, i.e. 1/sqrt(variance inflation);
    a key below ``tol`` lies in a near-null direction of the Fisher matrix. Keys are kept by a
    greedy pivoted Gram-Schmidt (the most sensitive unexplained direction first); every key
    whose remaining share falls below ``tol``, or whose sensitivity is below ``inert``, is
    frozen at its starting value. ``frozen``: label -> why; ``partners``: label -> the kept
    keys whose combination reproduces it; ``fisher_eigenvalues``: of the normalised Fisher
    matrix over every sensitive key, ascending (near-zero ones are the null directions)."""
    labels: list
    sensitivity: np.ndarray
    independence: np.ndarray
    frozen: dict
    partners: dict
    fisher_eigenvalues: np.ndarray
    tol: float
    inert: float

    def lines(self) -> list:
        out = []
        for lab, why in self.frozen.items():
            out.append(f"frozen {lab}: {why}")
        return out


def identifiability(jacobian, labels, *, tol=0.1, inert=1e-4) -> Identifiability:
    """Detect the keys a Jacobian ([points, keys], rows weighted) cannot separate (see
    ``Identifiability``). Pure NumPy; ``tol`` and ``inert`` as there."""
    J = np.asarray(jacobian, dtype=float)
    labels = list(labels)
    K = J.shape[1]
    s = np.linalg.norm(J, axis=0)
    frozen, partners = {}, {}
    indep = np.zeros(K)
    active = [k for k in range(K) if s[k] > inert]
    for k in range(K):
        if k not in active:
            frozen[labels[k]] = (f"the training data do not depend on it (RMS sensitivity {s[k]:.1e} per unit "
                                 f"log-multiplier, below {inert:g})")
    Jn = J[:, active] / s[active] if active else np.zeros((J.shape[0], 0))
    resid = Jn.copy()
    kept, rest = [], list(range(len(active)))
    while rest:
        norms = np.linalg.norm(resid[:, rest], axis=0)
        if norms.max() < tol:
            break
        raw = np.where(norms >= tol, norms * s[[active[r] for r in rest]], -1.0)
        j = rest[int(np.argmax(raw))]
        nj = float(np.linalg.norm(resid[:, j]))
        q = resid[:, j] / nj
        kept.append(j)
        rest.remove(j)
        if rest:
            resid[:, rest] -= np.outer(q, q @ resid[:, rest])
    for j in rest:                          # none of these is separable from the kept ones
        k = active[j]
        indep[k] = float(np.linalg.norm(resid[:, j]))
        coef, *_ = np.linalg.lstsq(Jn[:, kept], Jn[:, j], rcond=None) if kept else (np.zeros(0),)
        big = [active[kept[i]] for i in np.argsort(-np.abs(coef)) if abs(coef[i]) >= 0.1 * np.max(np.abs(coef))]
        partners[labels[k]] = [labels[b] for b in big]
        frozen[labels[k]] = (f"not separable from {', '.join(partners[labels[k]]) or 'the others'}: only "
                             f"{indep[k]:.1%} of its effect on the data is independent of theirs (below {tol:.0%}, "
                             f"a near-null direction of the Fisher matrix); held at its starting value")
    if kept:
        G = Jn[:, kept].T @ Jn[:, kept]
        vif = np.diag(np.linalg.pinv(G))
        for i, j in enumerate(kept):
            indep[active[j]] = float(1.0 / math.sqrt(max(vif[i], 1.0)))
    eig = np.linalg.eigvalsh(Jn.T @ Jn) if active else np.zeros(0)
    order = [labels[k] for k in range(K)]
    frozen = {lab: frozen[lab] for lab in order if lab in frozen}
    return Identifiability(labels=labels, sensitivity=s, independence=indep, frozen=frozen, partners=partners,
                           fisher_eigenvalues=eig, tol=tol, inert=inert)


def _identify(obs, layout, settings, weighting, tol, workers, callback, terms=None, per_deployment=False):
    """Compile the training deployments' Jacobians (unless ``terms`` has them), detect what they
    cannot separate, freeze it."""
    n = 0
    if terms is None:
        terms = _terms(obs, layout, settings, weighting, record=False, kind="jac", per_deployment=per_deployment)
        n = _compile_terms(terms, workers, callback)
    theta0 = np.zeros(len(layout.keys))
    J = np.concatenate([t.jacobian_theta(theta0, len(layout.keys)) for t in terms], axis=0)
    ident = identifiability(J, layout.labels(), tol=tol)
    index = {lab: k for k, lab in enumerate(layout.labels())}
    for lab, why in ident.frozen.items():
        layout.freeze(index[lab], why)
    return ident, n


# ----------------------------------------------------------------------------- Gauss-Newton


def _gn_evaluate(terms, theta, K, loss, delta):
    """Residuals, Jacobian over theta and weights, stacked over the terms, and the data loss."""
    rs, Js, ws = [], [], []
    for t in terms:
        lp, J = t.pred_jac(theta, K)
        rs.append(lp - t.log_meas)
        Js.append(J)
        ws.append(t.weights)
    r, J, w = np.concatenate(rs), np.concatenate(Js, axis=0), np.concatenate(ws)
    a = np.abs(r)
    per = r * r if loss == "l2" else np.where(a <= delta, r * r, 2.0 * delta * a - delta * delta)
    val = float(np.sum(w * per))
    if not math.isfinite(val):
        raise JaxpriceError("the loss is not finite (a prediction is zero or negative, or a coefficient "
                            "left its physical range)", field="loss", value=val)
    return r, J, w, val


def _gn_step(r, J, w, theta, lo, hi, prior, loss, delta, mu):
    """One damped (Levenberg-Marquardt) Gauss-Newton step on the keys not held by a bound, with
    iteratively reweighted Huber weights; the step is projected onto [lo, hi]."""
    a = np.abs(r)
    wi = w if loss == "l2" else w * np.where(a <= delta, 1.0, delta / np.maximum(a, 1e-300))
    g = J.T @ (wi * r) + prior * theta
    H = J.T @ (wi[:, None] * J) + prior * np.eye(len(theta))
    free = (lo < hi) & ~((theta <= lo + 1e-12) & (g > 0)) & ~((theta >= hi - 1e-12) & (g < 0))
    new = theta.copy()
    if free.any():
        Hf = H[np.ix_(free, free)]
        A = Hf + mu * (np.diag(np.diag(Hf)) + 1e-12 * np.eye(int(free.sum())))
        new[free] = theta[free] + np.linalg.lstsq(A, -g[free], rcond=None)[0]
    return np.clip(new, lo, hi)


def _gauss_newton(train_terms, held_terms, theta0, lo, hi, *, prior, loss, delta, steps, callback, tol=1e-10):
    """Minimise the same objective as ``_descend`` (data loss + prior * |theta|^2 on [lo, hi])
    by damped Gauss-Newton: at most ``steps`` accepted iterations, stopping when the objective's
    relative decrease falls below ``tol``. With held-out terms the iterate with the lowest
    held-out loss is kept (early stopping). Returns (theta, history, best step, why it stopped)."""
    K = len(theta0)
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    theta = np.clip(np.asarray(theta0, dtype=float), lo, hi)
    r, J, w, val = _gn_evaluate(train_terms, theta, K, loss, delta)
    history, mu, stopped = [], 1e-3, f"ran all {steps} iterations"

    def record(step, theta, val):
        held = _gn_evaluate(held_terms, theta, K, loss, delta)[3] if held_terms else None
        obj = val + prior * float(theta @ theta)
        monitored = held if held is not None else obj
        best = min([h["monitored"] for h in history] + [monitored])
        history.append({"step": step, "train": val, "held_out": held, "best": best, "objective": obj,
                        "monitored": monitored, "theta": theta.copy()})
        if callback:
            callback(step, steps, stage="descent", **({"train": val} if held is None else {"train": val,
                                                                                           "held_out": held}))
    record(0, theta, val)
    for step in range(1, steps + 1):
        obj = val + prior * float(theta @ theta)
        while True:
            cand = _gn_step(r, J, w, theta, lo, hi, prior, loss, delta, mu)
            r2, J2, w2, val2 = _gn_evaluate(train_terms, cand, K, loss, delta)
            obj2 = val2 + prior * float(cand @ cand)
            if obj2 <= obj:
                break
            mu *= 4.0
            if mu > 1e10:
                break
        if obj2 > obj:
            stopped = f"converged after {step - 1} iterations (no step lowers the objective)"
            break
        decrease = (obj - obj2) / max(obj, 1e-300)
        theta, r, J, w, val, mu = cand, r2, J2, w2, val2, max(mu / 3.0, 1e-9)
        record(step, theta, val)
        if decrease < tol:
            stopped = f"converged after {step} iterations (relative decrease {decrease:.1e})"
            break
    best = min(history, key=lambda h: (h["monitored"], -h["step"] if not held_terms else h["step"]))
    for h in history:
        h.pop("monitored")
    return best.pop("theta"), [{k: v for k, v in h.items() if k != "theta"} for h in history], best["step"], stopped


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


# past this many descent steps a fit is a runaway, not a fit (Gauss-Newton converges in tens;
# Adam's default is 400): 1e30 was accepted and ran until stopped
MAX_STEPS = 100_000


def _check_descent(steps, learning_rate, eval_every, patience):
    if isinstance(steps, bool) or not (isinstance(steps, (int, np.integer)) and 0 <= steps <= MAX_STEPS):
        refuse(f"steps must be an integer from 0 to {MAX_STEPS:,}", field="steps", value=steps)
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float, np.integer, np.floating)):
        refuse("the learning rate must be a positive number", field="learning_rate", value=learning_rate,
               has_value=True)
    if not (learning_rate > 0 and math.isfinite(learning_rate)):
        refuse("the learning rate must be a positive number", field="learning_rate", value=learning_rate)
    if not (isinstance(eval_every, int) and eval_every >= 1):
        refuse("eval_every must be a positive integer", field="eval_every", value=eval_every)
    if not (isinstance(patience, int) and patience >= 1):
        refuse("patience must be a positive integer", field="patience", value=patience)


def _descend(value_and_grad, held_out, theta0, lo, hi, *, steps, learning_rate, eval_every, patience, min_delta,
             callback, label="loss", prior=0.0):
    """Projected Adam on theta in [lo, hi] with a cosine-decayed learning rate.

    value_and_grad(theta) -> (loss, grad); held_out(theta) -> loss or None. ``prior`` adds
    prior * sum(theta ** 2) to the objective (a Gaussian prior on the log-multipliers, centred
    on the starting values). Every ``eval_every`` steps the monitored loss (held-out, else the
    training objective) is compared with the best so far; after ``patience`` evaluations
    without a relative improvement of ``min_delta`` the descent stops. Returns (best theta,
    history, best step, why it stopped); history's 'train' is the data term alone."""
    _check_descent(steps, learning_rate, eval_every, patience)
    opt = _adam(learning_rate, steps)
    lo_j, hi_j = jnp.asarray(lo, dtype=float), jnp.asarray(hi, dtype=float)
    theta = np.clip(np.asarray(theta0, dtype=float), lo, hi)
    state = opt.init(jnp.asarray(theta))
    best_theta, best, best_step, bad = theta.copy(), math.inf, 0, 0
    history, stopped = [], f"ran all {steps} steps"
    for step in range(steps + 1):
        train_loss, grad = value_and_grad(theta)
        penalty = prior * float(theta @ theta)
        if step % eval_every == 0 or step == steps:
            held = held_out(theta)
            monitored = held if held is not None else train_loss + penalty
            if monitored < best * (1 - min_delta) or not math.isfinite(best):
                best, best_theta, best_step, bad = monitored, theta.copy(), step, 0
            else:
                bad += 1
            history.append({"step": step, "train": train_loss, "held_out": held, "best": best,
                            "objective": train_loss + penalty})
            if callback:
                info = {"train": train_loss} if held is None else {"train": train_loss, "held_out": held}
                callback(step, steps, stage="descent", **info)
            if bad >= patience:
                stopped = (f"stopped early at step {step}: the {'held-out' if held is not None else 'training'} "
                           f"{label} did not improve for {patience} evaluations")
                break
        if step == steps:
            break
        grad = np.asarray(grad, dtype=float) + 2.0 * prior * theta
        theta, state = _update(jnp.asarray(grad), state, jnp.asarray(theta, dtype=float), lo_j, hi_j,
                               learning_rate=float(learning_rate), steps=steps)
        theta = np.asarray(theta)
    return best_theta, history, best_step, stopped
# ----------------------------------------------------------------------------- result


@dataclasses.dataclass
class FitResult:
    """A finished fit. ``theta`` is the best log-multiplier per key (``keys``: coefficient
    name and scope values); ``history`` one dict per evaluation (step, train, held_out, best,
    objective), the first at the starting values. ``train``/``held_out`` name the deployments.
    ``identifiability``: what the data could not separate (None: not checked); ``compiled``:
    executables compiled for this fit (0 when every one was cached)."""
    layout: Layout
    theta: np.ndarray
    history: list
    best_step: int
    stopped: str
    train: list
    held_out: list
    settings: dict
    identifiability: Identifiability | None = None
    compiled: int = 0

    @property
    def keys(self):
        return list(self.layout.keys)

    @property
    def prior(self) -> float:
        return float(self.settings.get("prior", 0.0))

    @property
    def frozen(self) -> dict:
        """{key label: why it was held at its starting value}."""
        return {key_label(self.layout.keys[k]): why for k, why in self.layout.frozen.items()}

    @property
    def initial(self) -> dict:
        """Losses at the starting values: {'train', 'held_out'} (NaN when nothing was descended:
        an infinite prior)."""
        if not self.history:
            return {"train": math.nan, "held_out": math.nan}
        h = self.history[0]
        return {"train": h["train"], "held_out": h["held_out"]}

    @property
    def final(self) -> dict:
        """Losses at the kept (best) values: {'train', 'held_out'} (NaN as ``initial``)."""
        if not self.history:
            return {"train": math.nan, "held_out": math.nan}
        h = next(h for h in self.history if h["step"] == self.best_step)
        return {"train": h["train"], "held_out": h["held_out"]}

    def multipliers(self) -> dict:
        """{key label: fitted value / starting value}."""
        return {key_label(k): float(math.exp(t)) for k, t in zip(self.layout.keys, self.theta)}

    def at_bound(self) -> dict:
        """{key label: 'lower' | 'upper'} for keys the bounds stopped (frozen keys excluded)."""
        return {h["key"]: h["side"] for h in self.bound_hits()}

    def bound_hits(self) -> list:
        """One dict per key a bound stopped: key (label), side ('lower'/'upper'), why (the
        bound: physical, or the fit's factor range) and meaning (what it says about the fit)."""
        out = []
        lay = self.layout
        for k, (key, t) in enumerate(zip(lay.keys, self.theta)):
            if k in lay.frozen:
                continue
            side = "lower" if t <= lay.lo[k] + 1e-9 else "upper" if t >= lay.hi[k] - 1e-9 else None
            if side is None:
                continue
            why = lay.lo_why[k] if side == "lower" else lay.hi_why[k]
            meaning = ("the data ask for a value physics rules out: the misfit lies in a term this coefficient "
                       "does not price" if why.startswith("physical") else
                       "the data would move it further than the fit's range allows: an effective correction, "
                       "not a measurement")
            out.append({"key": key_label(key), "side": side, "why": why, "meaning": meaning})
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
        theta = self.theta if fitted else np.zeros(len(self.theta))
        if isinstance(obs, SimObservations):
            return predict_simulated(obs, self.layout, theta, temperature=self.settings["temperature"]).reshape(-1)[
                obs.residual_index]
        kmap = self.layout.kmap(obs.deployment, create=False)
        return predict_observations(obs, log_multipliers(theta, kmap), temperature=self.settings["temperature"])

    def predict_all(self, observations, *, fitted: bool = True) -> dict:
        """{name: ``predict(obs)``} for many Observations at once: one call and one compile per
        plan structure (``predict_stacked``, ``predict_simulated_many``)."""
        theta = self.theta if fitted else np.zeros(len(self.theta))
        temperature = self.settings["temperature"]
        out = predict_stacked([o for o in observations if not isinstance(o, SimObservations)], self.layout, theta,
                              temperature=temperature)
        sims = [o for o in observations if isinstance(o, SimObservations)]
        both = predict_simulated_many(sims, self.layout, theta, temperature=temperature)
        out.update({o.name: both[o.name].reshape(-1)[o.residual_index] for o in sims})
        return out

    def entries(self) -> list:
        """Fitted values per registry entry: dicts name, scope ({dim: value}), key (the fitted key's
        label, e.g. host_output_token@global), start, value (SI), units, multiplier, deployments,
        models. The scope is the key's own plus the chip,
        narrowed by model, tp, ep or nodes_spanned only where the training deployments started
        the same key from different values (a registry entry scoped more finely than the fit)."""
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
                            "key": key_label(self.layout.keys[k]), "value": base * mult, "units": rs[0]["units"],
                            "multiplier": mult,
                            "deployments": sorted({r["deployment"] for r in rs}),
                            "models": sorted({r["dims"]["model"] for r in rs}),
                            "frozen": k in self.layout.frozen})
        return out


def predict_observations(obs: Observations, u=None, *, temperature=None) -> np.ndarray:
    """Predicted times (seconds) of an Observations' points with log-multipliers ``u`` on the
    deployment's own coefficient names (None: its values as they are)."""
    if isinstance(obs, SimObservations):
        if u is not None:
            refuse("a simulated observation's runs have their own coefficient names: use predict_simulated",
                   field="u")
        return predict_simulated(obs, temperature=temperature).reshape(-1)[obs.residual_index]
    coefs = obs.deployment.coefficients
    u = np.zeros(len(coefs.names)) if u is None else np.asarray(u, dtype=float)
    settings = {"tau": float(temperature or 0.0), "delta": 0.1, "loss": "l2", "smooth": temperature is not None}
    term = _Term(obs, np.full(len(coefs.names), -1), max(obs.points, 1), "point", 1, settings, "jac")
    if term.fn is not None:          # a fit on this deployment compiled its Jacobian: reuse it
        return np.exp(np.asarray(term.fn(jnp.asarray(u), *term.args)[0]))
    combine = None if obs.combine is None else jnp.asarray(obs.combine, dtype=float)
    return np.asarray(_predict_u(jnp.asarray(u), jnp.asarray(coefs.values, dtype=float), obs.batches, combine,
                                 plan=obs.deployment.plan, names=tuple(coefs.names), target=obs.target,
                                 estimate=obs.estimate, smooth=temperature is not None,
                                 tau=float(temperature or 0.0)))


# ----------------------------------------------------------------------------- the fit, in stages


def _check_fit_options(loss, weighting, huber_delta, temperature, prior, identify_tol):
    if loss not in LOSSES:
        refuse(f"unknown loss (known: {', '.join(LOSSES)})", field="loss", value=loss)
    if weighting not in WEIGHTINGS:
        refuse(f"unknown weighting (known: {', '.join(WEIGHTINGS)})", field="weighting", value=weighting)
    if isinstance(huber_delta, bool) or not (isinstance(huber_delta, (int, float)) and math.isfinite(huber_delta)
                                              and huber_delta > 0):
        refuse("huber_delta must be a finite positive number", field="huber_delta", value=huber_delta)
    if temperature is not None:
        from .step import temperature_arg
        temperature_arg(temperature)       # a number in [0, 1], as every pricing entry point takes
    if isinstance(prior, bool) or not (isinstance(prior, (int, float)) and not math.isnan(prior) and prior >= 0):
        refuse("the prior strength must be a number >= 0 (inf: keep the registry)", field="prior", value=prior,
               has_value=True)
    if isinstance(identify_tol, bool) or not (isinstance(identify_tol, (int, float)) and 0 <= identify_tol < 1):
        refuse("the identifiability tolerance must be in [0, 1)", field="identify_tol", value=identify_tol)


def _check_fit_args(train, free, held_out, holdout, seed, min_delta, identify, per_deployment, compile_workers,
                    callback):
    """The plain arguments of fit_coefficients, refused in one line before anything is compiled."""
    if isinstance(train, Observations) or isinstance(held_out, Observations):
        refuse("expected a list of Observations (wrap one in [...])",
               field="train" if isinstance(train, Observations) else "held_out", value="Observations")
    for name, obs in (("train", train), ("held_out", held_out)):
        if obs is None and name == "held_out":
            continue
        if obs is None or isinstance(obs, (str, bytes, dict)) or not hasattr(obs, "__iter__"):
            refuse("expected a list of Observations", field=name, value=type(obs).__name__)
    if free is None or not (isinstance(free, (str, Free)) or hasattr(free, "__iter__")):
        refuse("expected Free objects or 'PATTERN[@SCOPE][:BOUND]' strings", field="free", value=shown(free),
               has_value=True)
    if isinstance(holdout, bool) or not (isinstance(holdout, (int, float)) and 0 <= holdout < 1):
        refuse("the held-out fraction must be in [0, 1)", field="holdout", value=holdout, has_value=True)
    if holdout > 0 and held_out is not None:
        refuse("give held_out= or holdout=, not both (holdout would be ignored)", field="holdout", value=holdout)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        refuse("must be an integer >= 0", field="seed", value=seed, has_value=True)
    if isinstance(min_delta, bool) or not (isinstance(min_delta, (int, float)) and 0 <= min_delta < math.inf):
        refuse("must be a finite number >= 0 (relative improvement)", field="min_delta", value=min_delta,
               has_value=True)
    for name, v in (("identify", identify), ("per_deployment", per_deployment)):
        if not isinstance(v, (bool, np.bool_)):
            refuse("must be True or False", field=name, value=v, has_value=True)
    if compile_workers is not None and (isinstance(compile_workers, bool) or not isinstance(
            compile_workers, (int, np.integer)) or compile_workers < 1):
        refuse("must be None or an integer >= 1", field="compile_workers", value=compile_workers, has_value=True)
    check_callback(callback)


def _split_for_early_stopping(train, held_out, holdout, seed):
    """(train, held_out) lists of Observations, split by deployment, never sharing one."""
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
    return train, held_out


def _check_matched(layout, train) -> None:
    """Every --free pattern matches a coefficient the training deployments read (and is not
    shadowed by an earlier one); a misspelt name is refused with the nearest name."""
    unmatched = [f.label() for f, n in layout.matched.items() if n == 0]
    for f, n in layout.matched.items():      # matched, but every match taken by an earlier pattern (first wins)
        names = sorted({c for o in train for c in o.deployment.coefficients.names if fnmatch.fnmatchcase(c, f.pattern)})
        winner = layout.spec_for(names[0]) if n == 0 and names else None
        if winner is not None and winner != f and layout.matched.get(winner, 0) > 0:
            refuse(f"every coefficient it matches (e.g. {names[0]}) is taken by the earlier --free {winner.label()}: "
                   "the first matching pattern wins; give the narrower pattern first", field="free", value=f.label())
    if unmatched:
        import difflib
        read = sorted({c for o in train for c in o.deployment.coefficients.names})
        near = difflib.get_close_matches(unmatched[0].split("@")[0], read, n=1)    # a misspelt name: said which
        refuse("no coefficient of the training deployments matches this free pattern (patterns match the "
               "names the deployments' kernels read, e.g. hbm_derate, gemm_eps_max_fp8)"
               + (f"; did you mean '{near[0]}'?" if near else ""), field="free", value=unmatched[0])


def _build_layout(train, held_out, free, settings, weighting, workers, callback, kinds=("grad", "value"),
                  per_deployment=False):
    """The layout (keys, physical ranges), the compiled training and held-out terms."""
    layout = Layout(free)
    train_terms = _terms(train, layout, settings, weighting, record=True, kind=kinds[0],
                         per_deployment=per_deployment)
    _check_matched(layout, train)
    held_terms = _terms(held_out, layout, settings, weighting, record=False, kind=kinds[1],
                        per_deployment=per_deployment)
    compiled = _compile_terms(train_terms + held_terms, workers, callback)
    return layout, train_terms, held_terms, compiled


REGISTRY_KEPT = "prior strength inf: every free coefficient kept at its registry value (no descent)"


def fit_coefficients(train, free, *, held_out=None, holdout=0.0, seed=0, steps=400, learning_rate=0.05,
                     eval_every=5, patience=10, min_delta=1e-5, temperature=None, loss="l2", huber_delta=0.1,
                     weighting="point", prior=0.0, identify=True, identify_tol=0.1, method="adam", callback=None,
                     compile_workers=None, per_deployment=False) -> FitResult:
    """Fit the ``free`` coefficients (Free objects or 'PATTERN[@SCOPE][:BOUND]' strings) to the
    ``train`` observations (a list of Observations, one per deployment).

    held_out: observations for early stopping (no deployment in both); or holdout: the
    fraction of the train deployments to hold out (split by deployment, seeded, stratified by
    model where every model has two or more deployments). Every ``eval_every`` steps the
    held-out loss (the training objective when nothing is held out) is evaluated; the fit stops
    after ``patience`` evaluations without a relative improvement of ``min_delta`` and keeps
    the best values. temperature: None fits in exact mode; a float >= 0 prices in smooth mode.

    prior: strength of a Gaussian prior on every log-multiplier, centred on the starting
    (registry) value: the objective is the weighted mean loss over points plus
    ``prior * sum(log(multiplier) ** 2)`` (0: none; inf: every coefficient stays at its
    registry value, nothing is compiled or descended: the 'no fit' candidate a cross-validation
    weighs the fits against; ``choose_prior`` picks it by cross-validation). Every key's range
    is the ``Free`` factor bound, tightened to what is physical (``physical_range``). identify: check which keys the training data can separate
    (``identifiability``, tolerance ``identify_tol``) and hold the others at their starting
    values (``FitResult.frozen`` says which and why).

    method: 'adam' (projected Adam, ``steps`` steps, ``learning_rate``, early stopping every
    ``eval_every`` steps after ``patience`` evaluations) or 'gauss-newton' (damped Gauss-Newton
    with Huber reweighting and the same bounds and prior: at most ``steps`` iterations, usually
    converging in tens; one compiled Jacobian per deployment serves the solver, the
    identifiability check and predictions, so it compiles once per deployment where Adam
    compiles twice).

    callback(done, total, stage=..., **info) reports compilation (stage 'compile'; compile_workers
    threads, default min(4, CPUs)) and then every evaluation of the descent (stage 'descent',
    with train= and held_out= losses).

    The deployments of one plan structure share one compiled function (the deployment axis:
    ``_StackTerm``; ``FitResult.compiled`` counts the compilations); ``per_deployment``: the
    former path, one per deployment (``_Term``), for comparison (the same loss and gradient up
    to rounding).
    """
    _check_fit_options(loss, weighting, huber_delta, temperature, prior, identify_tol)
    _check_descent(steps, learning_rate, eval_every, patience)
    if method not in METHODS:
        refuse(f"unknown method (known: {', '.join(METHODS)})", field="method", value=method)
    _check_fit_args(train, free, held_out, holdout, seed, min_delta, identify, per_deployment, compile_workers,
                    callback)
    if isinstance(free, (str, Free)):       # one pattern, not its letters
        free = [free]
    train, held_out = list(train), None if held_out is None else list(held_out)
    for name, obs in (("train", train), ("held_out", held_out or ())):
        for i, o in enumerate(obs):
            if not isinstance(o, (Observations, SimObservations)):
                refuse("is not an Observations (observations_from_measurements, Observations(...))",
                       field=f"{name}[{i}]", value=type(o).__name__)
    gn = method == "gauss-newton"
    train, held_out = _split_for_early_stopping(train, held_out, holdout, seed)
    settings = {"tau": float(temperature or 0.0), "delta": float(huber_delta), "loss": loss,
                "smooth": temperature is not None}
    workers = _workers(compile_workers)
    meta_kw = dict(loss=loss, huber_delta=huber_delta, temperature=temperature, weighting=weighting,
                   learning_rate=learning_rate, steps=steps, eval_every=eval_every, patience=patience, prior=prior,
                   method=method, identify_tol=identify_tol if identify else None, seed=seed, holdout=holdout)
    if math.isinf(prior):
        return _registry_result(train, held_out, free, settings, weighting, meta_kw)
    kinds = ("jac", "jac") if gn else ("grad", "value")
    layout, train_terms, held_terms, compiled = _build_layout(train, held_out, free, settings, weighting, workers,
                                                              callback, kinds=kinds, per_deployment=per_deployment)
    ident = None
    if identify:
        ident, n = _identify(train, layout, settings, weighting, identify_tol, workers, callback,
                             terms=train_terms if gn else None, per_deployment=per_deployment)
        compiled += n
    theta0, lo, hi = np.zeros(len(layout.keys)), np.array(layout.lo), np.array(layout.hi)
    if gn:
        theta, history, best_step, stopped = _gauss_newton(train_terms, held_terms, theta0, lo, hi,
                                                           prior=float(prior), loss=loss, delta=float(huber_delta),
                                                           steps=steps, callback=callback)
    else:
        theta, history, best_step, stopped = _descend(
            lambda th: _total(train_terms, th), lambda th: _total(held_terms, th)[0] if held_terms else None,
            theta0, lo, hi, steps=steps, learning_rate=learning_rate, eval_every=eval_every, patience=patience,
            min_delta=min_delta, callback=callback, prior=float(prior))
    meta = _fit_meta(train, held_out, layout, **meta_kw)
    return FitResult(layout=layout, theta=theta, history=history, best_step=best_step, stopped=stopped,
                     train=sorted(o.name for o in train), held_out=sorted(o.name for o in held_out),
                     settings=meta, identifiability=ident, compiled=compiled)


def _registry_result(train, held_out, free, settings, weighting, meta_kw) -> FitResult:
    """The fit at an infinite prior: the layout of the free keys the training deployments read
    (their registry values, log-multipliers 0), nothing compiled, no descent, no identifiability check."""
    layout = Layout(free)
    _terms(train, layout, settings, weighting, record=True, kind="value")   # records the keys; compiles nothing
    _check_matched(layout, train)      # --prior inf with a misspelt --free wrote an empty set without a word
    return FitResult(layout=layout, theta=np.zeros(len(layout.keys)), history=[], best_step=0, stopped=REGISTRY_KEPT,
                     train=sorted(o.name for o in train), held_out=sorted(o.name for o in held_out),
                     settings=_fit_meta(train, held_out, layout, **meta_kw), identifiability=None, compiled=0)


def _fit_meta(train, held_out, layout, *, loss, huber_delta, temperature, prior, **settings) -> dict:
    """``FitResult.settings``: the fit's options, its free patterns, and what it was fitted on."""
    return {"loss": loss, "huber_delta": huber_delta if loss == "huber" else None,
            "target": sorted({o.target for o in train}), "estimate": sorted({o.estimate for o in train}),
            "temperature": temperature, "weighting": settings["weighting"], "learning_rate": settings["learning_rate"],
            "steps": settings["steps"], "eval_every": settings["eval_every"], "patience": settings["patience"],
            "prior": float(prior), "method": settings["method"], "identify_tol": settings["identify_tol"],
            "free": [f.label() for f in layout.free], "train_points": sum(o.points for o in train),
            "held_out_points": sum(o.points for o in held_out), "seed": settings["seed"],
            "holdout": settings["holdout"], "train_models": sorted({o.dims["model"] for o in train}),
            "train_chips": sorted({o.dims["hardware"] for o in train}),
            "train_engines": sorted({o.dims["engine"] for o in train})}


# ----------------------------------------------------------------------------- cross-validation


HOLDOUTS = ("model", "chip", "deployment")
DEFAULT_PRIORS = (0.0, 1e-3, 1e-2, 3e-2, 0.1, 1.0, math.inf)   # inf: the registry itself


@dataclasses.dataclass(frozen=True)
class Fold:
    """One cross-validation fold: ``train`` and ``test`` deployment names (never sharing one,
    nor, under ``by`` model or chip, a model or chip). ``label``: the held-out group (a model
    or chip name) or 'seed N'."""
    by: str
    label: str
    train: tuple
    test: tuple


def _group_of(o: Observations, by: str) -> str:
    return o.dims["model"] if by == "model" else o.dims["hardware"]


def cv_folds(observations, by="model", *, seeds=(0,), test_fraction=0.25) -> list:
    """Folds over Observations (one per deployment): by 'model' (leave one model out, each in
    turn), 'chip' (leave one chip out) or 'deployment' (one seeded split per seed, by
    deployment, stratified by model, ``test_fraction`` of each model's deployments held out; a
    seed whose split an earlier seed already gave is not a second fold: it is named in that fold's
    label, ``seed 0 (= 1, 2)``)."""
    obs = list(observations)
    if by not in HOLDOUTS:
        refuse(f"unknown hold-out (known: {', '.join(HOLDOUTS)}, or a fraction)", field="holdout", value=by)
    names = sorted({o.name for o in obs})
    if by == "deployment":
        model = {o.name: o.dims["model"] for o in obs}
        splits = {}         # test deployments -> (train, the seeds giving that split)
        for seed in seeds:
            train, test = split_by_deployment(names, test_fraction, seed=seed, stratify=model)
            if not test:
                train, test = split_by_deployment(names, test_fraction, seed=seed)
            if not test or not train:
                refuse("too few deployments to hold any out", field="holdout", value=by)
            # with few deployments seeds repeat a split (two deployments: seeds 0, 1, 2 held out the
            # same one three times, printed as three folds and counted three times in the prior's mean)
            splits.setdefault(tuple(sorted(test)), (tuple(train), []))[1].append(seed)
        return [Fold(by, f"seed {ss[0]}" + (f" (= {', '.join(map(str, ss[1:]))})" if len(ss) > 1 else ""), train,
                     tuple(test)) for test, (train, ss) in splits.items()]
    group = {o.name: _group_of(o, by) for o in obs}
    values = sorted(set(group.values()))
    if len(values) < 2:
        refuse(f"leaving one {by} out needs at least two (the observations have {values})", field="holdout",
               value=by)
    return [Fold(by, v, tuple(n for n in names if group[n] != v), tuple(n for n in names if group[n] == v))
            for v in values]


def score_points(observations, predictions) -> dict:
    """TPOT (or step) MAPE, mean signed error and mean shape error over the points of some
    Observations, given {name: predicted seconds}. The shape error is the accuracy harness's
    (``accuracy.shape_errors``, per sweep relative to its lowest concurrency) where the
    Observations know their sweeps, else NaN."""
    from . import accuracy
    obs = list(observations)
    if obs and all(isinstance(o, SimObservations) for o in obs):
        return score_simulated(obs, predictions)
    pred = np.concatenate([np.asarray(predictions[o.name], dtype=float) for o in obs])
    meas = np.concatenate([o.measured for o in obs])
    if all(o.sweeps is not None for o in obs):
        sweeps = np.concatenate([[f"{o.name}|{s}" for s in o.sweeps] for o in obs])
        conc = np.concatenate([o.concurrency for o in obs])
        shape, anchor = accuracy.shape_errors(sweeps, conc, pred, meas)
    else:
        shape, anchor = np.full(len(meas), np.nan), np.zeros(len(meas), dtype=bool)
    s = accuracy.summarize(shape, anchor, pred, meas)
    return {"points": s["points"], "tpot_mape": s["tpot_mape"], "tpot_signed": s["tpot_mean_signed"],
            "shape_mean": s["shape_mean"]}


def _metric_ratios(fitted: dict, registry: dict) -> list:
    """fitted / registry for TPOT MAPE and shape error, and TTFT MAPE and TTFT shape error under
    the simulate rule, where known and where the registry's is at least 0.1% (a ratio to ~0
    says nothing)."""
    return [fitted[k] / registry[k] for k in ("tpot_mape", "shape_mean", "ttft_mape", "ttft_shape_mean")
            if k in fitted and k in registry and math.isfinite(fitted[k]) and math.isfinite(registry[k])
            and registry[k] >= 1e-3]


def relative_error(fitted: dict, registry: dict) -> float:
    """The mean of ``_metric_ratios``: below 1 the fit is better on average, 1 the same."""
    r = _metric_ratios(fitted, registry)
    return float(np.mean(r)) if r else float("nan")


def worst_ratio(fitted: dict, registry: dict) -> float:
    """The largest of ``_metric_ratios``: above 1 the fit makes at least one metric worse."""
    r = _metric_ratios(fitted, registry)
    return float(max(r)) if r else float("nan")


@dataclasses.dataclass
class CVResult:
    """Cross-validation of one free set over priors. ``scores[(fold label, prior)]``: dicts
    test/train -> registry/fitted -> score_points, plus applied (keys of the fit that land on
    the test deployments). ``chosen[fold label]``: the prior an inner cross-validation on the
    fold's own training deployments picked (nested: the fold's test deployments play no part);
    ``inner[fold label]``: {prior: inner criterion}. ``criterion[prior]``: the mean over
    folds of ``relative_error`` on the test deployments; ``worst[prior]``: the largest
    ``worst_ratio`` over them; ``best_prior`` the prior ``_choose`` picks from the two (the
    prior for a final fit on everything)."""
    by: str
    folds: list
    priors: tuple
    scores: dict
    chosen: dict
    inner: dict
    criterion: dict
    best_prior: float
    fits: dict
    worst: dict = dataclasses.field(default_factory=dict)

    def rows(self, prior=None) -> list:
        """Per fold at its chosen prior (or the given one): label, prior, test/train scores."""
        out = []
        for f in self.folds:
            p = self.chosen[f.label] if prior is None else prior
            out.append({"fold": f.label, "prior": p, "test_deployments": list(f.test), **self.scores[(f.label, p)]})
        return out


def _choose(criteria: dict, worst: dict | None = None) -> float:
    """The prior with the lowest criterion; the strongest among those within 1e-3 of it. With
    ``worst`` ({prior: largest fitted/registry ratio over folds and metrics}), only among the
    priors whose fits make no held-out fold worse on any metric (ratio <= 1 + 1e-3): a fit
    that helps on average while hurting one group is not chosen (the registry, an infinite
    prior, always qualifies). Where none qualifies, among all."""
    finite = {p: c for p, c in criteria.items() if math.isfinite(c)}
    if worst is not None:
        safe = {p: c for p, c in finite.items() if math.isfinite(worst.get(p, math.nan)) and worst[p] <= 1 + 1e-3}
        finite = safe or finite
    if not finite:
        return max(criteria)
    best = min(finite.values())
    return max(p for p, c in finite.items() if c <= best + 1e-3)


class _FitCache:
    """Fits by (training deployments, prior), shared by the outer and inner folds."""

    def __init__(self, obs, free, fit_kw, callback):
        self.obs = {o.name: o for o in obs}
        self.free, self.fit_kw, self.callback = free, fit_kw, callback
        self.fits: dict = {}
        self.registry: dict = {}
        self.total = None          # the fits a cross-validation will make (cross_validate sets it)

    def fit(self, train, prior):
        key = (tuple(sorted(train)), float(prior))
        if key not in self.fits:
            self.fits[key] = fit_coefficients([self.obs[n] for n in key[0]], self.free, prior=prior, **self.fit_kw)
            if self.callback:
                self.callback(len(self.fits), self.total, stage="cv", prior=prior)
        return self.fits[key]

    def registry_preds(self, names):
        temperature = self.fit_kw.get("temperature")
        todo = [self.obs[n] for n in names if n not in self.registry]
        self.registry.update(predict_stacked([o for o in todo if not isinstance(o, SimObservations)],
                                             temperature=temperature))
        self.registry.update(predict_simulated_many([o for o in todo if isinstance(o, SimObservations)],
                                                    temperature=temperature))
        return {n: self.registry[n] for n in names}

    def score(self, res, names):
        obs = [self.obs[n] for n in names]
        temperature = res.settings["temperature"]
        fitted = predict_stacked([o for o in obs if not isinstance(o, SimObservations)], res.layout, res.theta,
                                 temperature=temperature)
        fitted.update(predict_simulated_many([o for o in obs if isinstance(o, SimObservations)], res.layout,
                                             res.theta, temperature=temperature))
        return {"registry": score_points(obs, self.registry_preds(names)), "fitted": score_points(obs, fitted)}


def _inner_folds(fold, obs_by_name, by):
    train = [obs_by_name[n] for n in fold.train]
    inner_by = by
    if by in ("model", "chip") and len({_group_of(o, by) for o in train}) < 2:
        inner_by = "deployment"
    seed = int(fold.label.split()[1]) if by == "deployment" else 0      # "seed 0" or "seed 0 (= 1, 2)"
    return cv_folds(train, inner_by, seeds=(seed,))


def cross_validate(observations, free, *, by="model", priors=(0.0,), seeds=(0,), test_fraction=0.25, nested=True,
                   callback=None, cache=None, **fit_kw) -> CVResult:
    """Cross-validate ``fit_coefficients(train, free, prior=p, **fit_kw)`` over ``priors``,
    holding out by model, chip or deployment (``cv_folds``). Every fold is scored on its test
    deployments with the registry and with the fit (``score_points``); with ``nested`` each
    fold's prior is chosen by an inner cross-validation of the same kind on its training
    deployments alone (the strongest prior where they are too few to split). ``cache``: a
    ``_FitCache`` shared between calls (fits by training set and prior).
    callback(done, total, stage='cv', prior=...) after each new fit (total: the fits the run makes)."""
    obs = list(observations)
    priors = tuple(float(p) for p in priors)
    if not priors:
        refuse("no prior strengths to try", field="priors")
    folds = cv_folds(obs, by, seeds=seeds, test_fraction=test_fraction)
    fc = cache if isinstance(cache, _FitCache) else _FitCache(obs, free, fit_kw, callback)
    # every fit this run makes, counted up front: the callback had no total, so `jaxprice fit --holdout
    # model` (minutes to hours, one fit per fold, prior and inner fold) showed no progress at all
    planned = {(tuple(sorted(f.train)), p) for f in folds for p in priors}
    if nested and len(priors) > 1:
        for f in folds:
            try:
                planned |= {(tuple(sorted(i.train)), p) for i in _inner_folds(f, fc.obs, by) for p in priors}
            except JaxpriceError:
                pass
    fc.total = len(planned | set(fc.fits))
    scores, fits = {}, {}
    for f in folds:
        for p in priors:
            res = fc.fit(f.train, p)
            fits[(f.label, p)] = res
            applied = {int(k) for n in f.test for k in res.layout.kmap(fc.obs[n].deployment, create=False) if k >= 0}
            scores[(f.label, p)] = {"test": fc.score(res, f.test), "train": fc.score(res, f.train),
                                    "applied": len(applied), "frozen": sorted(res.frozen)}
    criterion = {p: float(np.mean([relative_error(scores[(f.label, p)]["test"]["fitted"],
                                                  scores[(f.label, p)]["test"]["registry"]) for f in folds]))
                 for p in priors}
    worst = {p: float(np.max([worst_ratio(scores[(f.label, p)]["test"]["fitted"],
                                          scores[(f.label, p)]["test"]["registry"]) for f in folds]))
             for p in priors}
    chosen, inner = {}, {}
    for f in folds:
        if not nested or len(priors) == 1:
            chosen[f.label] = _choose(criterion, worst) if not nested else priors[0]
            continue
        try:
            ifolds = _inner_folds(f, fc.obs, by)
        except JaxpriceError:            # too few training deployments to hold any out: the strongest prior
            chosen[f.label] = max(priors)
            continue
        inner[f.label], inner_worst = {}, {}
        for p in priors:
            sc = [fc.score(fc.fit(i.train, p), i.test) for i in ifolds]
            inner[f.label][p] = float(np.mean([relative_error(s["fitted"], s["registry"]) for s in sc]))
            inner_worst[p] = float(np.max([worst_ratio(s["fitted"], s["registry"]) for s in sc]))
        chosen[f.label] = _choose(inner[f.label], inner_worst)
    return CVResult(by=by, folds=folds, priors=priors, scores=scores, chosen=chosen, inner=inner,
                    criterion=criterion, best_prior=_choose(criterion, worst), fits=fits, worst=worst)


def choose_prior(observations, free, *, by="model", priors=DEFAULT_PRIORS, **kw):
    """The prior strength with the lowest mean ``relative_error`` on held-out groups
    (``cross_validate`` without nesting). Returns (prior, CVResult)."""
    cv = cross_validate(observations, free, by=by, priors=priors, nested=False, **kw)
    return cv.best_prior, cv
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


def _real(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _check_law_args(law, init, inputs, measured, bounds, loss, huber_delta, min_delta, callback):
    """fit_law's arguments, refused in one line before anything is traced or compiled: a callable
    law, a dict of positive starting numbers, positive finite measurements, bounds of two numbers
    per known parameter, a prediction of the measurements' shape (jax.eval_shape: the law is
    traced abstractly, nothing runs), and the loss options. Returns (names, starts, measured)."""
    if not callable(law):
        refuse("must be a function law(params, inputs) -> predictions", field="law", value=shown(law), has_value=True)
    from collections.abc import Mapping
    if not isinstance(init, Mapping):
        refuse("must be a dict {name: starting value}", field="init", value=shown(init), has_value=True)
    if not init:
        refuse("no parameters to fit", field="init")
    names = list(init)
    for n in names:
        v = init[n]
        if not (_real(v) and math.isfinite(v) and v > 0):
            refuse("a starting value must be a positive number (the fit is in log space)", field=f"init.{n}",
                   value=shown(v), has_value=True)
    x0 = np.array([float(init[n]) for n in names])
    arr = np.asarray(measured) if measured is not None and not isinstance(measured, (str, bytes)) else np.asarray(None)
    if arr.dtype.kind not in "iuf" or arr.ndim != 1 or arr.size == 0:
        refuse("must be a 1-d array of positive numbers", field="measured",
               value=shown(measured) if arr.ndim == 0 else f"shape {arr.shape}, dtype {arr.dtype.name}", has_value=True)
    measured = arr.astype(float)
    bad = ~(np.isfinite(measured) & (measured > 0))
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        refuse("must be positive finite numbers (the fit is on log values)", field=f"measured[{k}]",
               value=float(measured[k]), has_value=True)
    if bounds is not None:
        if not isinstance(bounds, Mapping):
            refuse("must be a dict {name: (lo, hi)}", field="bounds", value=shown(bounds), has_value=True)
        for n, b in bounds.items():
            if n not in init:
                refuse(f"is not a parameter of init ({', '.join(map(str, names))}): it would bound nothing",
                       field=f"bounds.{n}")
            if isinstance(b, (str, bytes)) or not hasattr(b, "__len__") or len(b) != 2 or not all(
                    _real(x) and not math.isnan(x) for x in b):
                refuse("must be two numbers (lo, hi)", field=f"bounds.{n}", value=shown(b), has_value=True)
    if loss not in LOSSES:
        refuse(f"unknown loss (known: {', '.join(LOSSES)})", field="loss", value=loss)
    if not (_real(huber_delta) and math.isfinite(huber_delta) and huber_delta > 0):
        refuse("huber_delta must be a finite positive number", field="huber_delta", value=huber_delta, has_value=True)
    if not (_real(min_delta) and 0 <= min_delta < math.inf):
        refuse("must be a finite number >= 0 (relative improvement)", field="min_delta", value=min_delta,
               has_value=True)
    check_callback(callback)
    try:
        out = jax.eval_shape(law, {n: jax.ShapeDtypeStruct((), jnp.float64) for n in names}, inputs)
    except JaxpriceError:
        raise
    except Exception as err:                            # noqa: BLE001 - whatever the user's law raises
        refuse(f"raised {type(err).__name__} on its parameters {names} and the inputs: "
               f"{str(err).splitlines()[0][:200] if str(err) else ''}", field="law")
    shape = getattr(out, "shape", None)
    if shape is None or tuple(shape) not in ((measured.size,), ()):
        refuse(f"predicts shape {None if shape is None else tuple(shape)} for {measured.size} measurements: one "
               "prediction per measurement", field="law", value=shown(law), has_value=True)
    return names, x0, measured


def fit_law(law, init: dict, inputs, measured, *, bounds=None, steps=2000, learning_rate=0.05, eval_every=20,
            patience=20, min_delta=1e-7, loss="l2", huber_delta=0.1, callback=None) -> LawFit:
    """Fit the positive parameters of a small law to measurements, by the same projected Adam
    descent as ``fit_coefficients``: theta = log(param / init); the loss is the mean per-point
    loss of ``log(law(params, inputs)) - log(measured)``.

    law(params: dict of scalars, inputs) -> predicted array (jittable). bounds: name -> (lo, hi)
    in the parameter's units (default init / 100 .. init * 100; a fraction of a peak, named
    like ``*eps_max*`` or ``*derate*``, at most 1)."""
    names, x0, measured = _check_law_args(law, init, inputs, measured, bounds, loss, huber_delta, min_delta, callback)
    lo, hi = np.log(1e-2) * np.ones(len(names)), np.log(1e2) * np.ones(len(names))
    for i, n in enumerate(names):
        if bounds and n in bounds:
            b_lo, b_hi = bounds[n]
            if not (0 < b_lo <= x0[i] <= b_hi):
                refuse("bounds must be 0 < lo <= start <= hi", field=f"bounds.{n}", value=(b_lo, b_hi))
            lo[i], hi[i] = math.log(b_lo / x0[i]), math.log(b_hi / x0[i])
        if is_fraction(n):
            hi[i] = min(hi[i], max(-math.log(x0[i]), lo[i]))
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


SCOPE_TO = ("hardware", "model")


def default_source(result: FitResult, data="") -> str:
    s = result.settings
    held = (f"{len(result.held_out)} held out by deployment ({s['held_out_points']} points)"
            if result.held_out else "none held out")
    prior = f", prior {s['prior']:g}" if s.get("prior") else ""
    return (f"jaxprice.fit on {data or 'the given observations'}: {s['loss']} loss on log "
            f"{'/'.join(s['target'])} ({'/'.join(s['estimate'])}, "
            f"{'exact mode' if s['temperature'] is None else 'temperature %g' % s['temperature']}, "
            f"{s['weighting']} weighting{prior}), {len(result.train)} training deployments ({s['train_points']} "
            f"points), {held}; {result.stopped}; kept step {result.best_step}")


def _finite_or_none(x):
    return None if x is None or not math.isfinite(x) else x


def _set_meta(result: FitResult, data, scope_to, engines) -> dict:
    s = result.settings
    fin, ini = result.final, result.initial
    return {"data": str(data), "loss": s["loss"], "target": s["target"], "estimate": s["estimate"],
            "temperature": s["temperature"], "weighting": s["weighting"], "free": s["free"],
            "prior": s.get("prior", 0.0), "steps": s["steps"], "best_step": result.best_step,
            "stopped": result.stopped,
            "train_loss": {"start": _finite_or_none(ini["train"]), "fitted": _finite_or_none(fin["train"])},
            "held_out_loss": {"start": _finite_or_none(ini["held_out"]), "fitted": _finite_or_none(fin["held_out"])},
            "train_deployments": result.train, "held_out_deployments": result.held_out,
            "scope_to": list(scope_to), "train_chips": s.get("train_chips", []),
            "train_models": s.get("train_models", []), "engines": engines,
            "frozen": result.frozen, "at_bound": {h["key"]: f"{h['side']}: {h['why']}" for h in result.bound_hits()}}


def _set_entries(result: FitResult, source, scope_to, engines=()) -> list:
    """The written entries: each fitted key's value within its scope, narrowed to the models
    it was fitted on when ``scope_to`` names 'model', and to ``engines`` where given. Frozen
    keys are not written (the registry's value stands)."""
    out = []
    order = sorted(result.entries(), key=lambda e: (e["name"], sorted((k, str(v)) for k, v in e["scope"].items())))
    for e in order:
        if e["frozen"]:
            continue
        scope = {k: [v] for k, v in e["scope"].items()}
        if "model" in scope_to and "model" not in scope:
            scope["model"] = list(e["models"])
        if engines and "engine" not in scope:
            scope["engine"] = list(engines)
        f = si_factor(e["name"], e["units"])
        out.append({"name": e["name"], "value": float(e["value"] / f), "units": e["units"], "method": "fitted",
                    "fitted": True, "scope": scope, "cite": source,
                    "fit": {"start": float(e["start"] / f), "multiplier": float(e["multiplier"])}})
    return out


def write_coefficient_set(result: FitResult, path, *, name=None, data="", source=None, scope_to=SCOPE_TO,
                          engines=None) -> Path:
    """Write the fitted values as a ``jaxprice-coefficients/1`` set (values in registry units,
    ``method: fitted``, each entry's ``fit`` giving its start and multiplier); ``source`` (the
    set's and every entry's cite) defaults to a line naming the data, the loss and the split.
    Load it with ``load_deployment(..., extra_coefficient_files=[path])``: it overrides the
    registry by name, within each entry's scope.

    Every entry is scoped to the chips it was fitted on and, with 'model' in ``scope_to`` (the
    default), to the models, and to the engines of the training deployments (their scenarios'
    engine.scheduler, vLLM where unstated: ``resolve.serving_engine``; ``engines``, e.g. a
    measurement file's engine column ['vllm', 'trt'], ``scheduler_names``, where the result does
    not say): a deployment of another chip, model or engine loading the set keeps the registry's
    values (``set_applies`` says which entries reach a deployment). Frozen keys are not written."""
    import yaml
    if not isinstance(result, FitResult):         # None raised AttributeError ('settings')
        refuse("needs the FitResult of fit_coefficients", field="result", value=shown(result), has_value=True)
    if any(d not in ("hardware", "model") for d in scope_to) or "hardware" not in scope_to:
        refuse("scope_to takes 'hardware' and optionally 'model'", field="scope_to", value=list(scope_to))
    named = scheduler_names(engines)               # refuses an unknown engine name
    engines = list(result.settings.get("train_engines") or named)
    path = Path(path)
    name = name or path.stem
    source = source or default_source(result, data)

    def dump(obj, flow):
        return yaml.safe_dump(obj, default_flow_style=flow, sort_keys=False, width=1 << 30).strip()

    lines = ["# Written by jaxprice.fit; values are in the registry's own units (see `units`).",
             "format: jaxprice-coefficients/1", dump({"name": str(name)}, False), dump({"source": source}, False),
             "fit:"]
    lines += ["  " + ln for ln in dump(_set_meta(result, data, scope_to, engines), False).splitlines()]
    lines.append("entries:")
    lines += ["  - " + dump(entry, True) for entry in _set_entries(result, source, scope_to, engines)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def scheduler_names(engines) -> list:
    """The engines a set is scoped to, as a deployment names them (``resolve.serving_engine``):
    a measurement file's engine column ('vllm', 'sglang', 'trt', ...) mapped through
    ``accuracy.ENGINE_SCHEDULER``, sorted, without repeats; None or empty: no engine scope."""
    from .accuracy import ENGINE_SCHEDULER
    if engines is None:
        return []
    if isinstance(engines, str) or not hasattr(engines, "__iter__"):
        refuse("expected a list of engine names", field="engines", value=shown(engines), has_value=True)
    out = set()
    for e in engines:
        key = str(e).strip().lower() if isinstance(e, str) else None
        if key not in ENGINE_SCHEDULER:
            refuse(f"unknown engine (known: {', '.join(ENGINE_SCHEDULER)})", field="engines", value=shown(e),
                   has_value=True)
        out.add(ENGINE_SCHEDULER[key])
    return sorted(out)


def set_applies(path, deployment: Deployment) -> dict:
    """Which entries of a coefficient set reach a deployment: {'applied': [names], 'outside':
    [(name, why)]} (an entry applies when every dimension of its scope admits the deployment,
    as the resolver admits entries)."""
    from .formats import load_coefficient_set
    cset = load_coefficient_set(path)
    dims = deployment_dims(deployment)
    applied, outside = [], []
    for e in cset.entries:
        misses = [f"{d}={dims[d]} not in {list(allowed)}" for d, allowed in e.scope.items()
                  if d in dims and not (str(dims[d]).lower() in {str(a).lower() for a in allowed}
                                        if d in ("hardware", "model") else dims[d] in allowed)]
        if misses:
            outside.append((e.name, "; ".join(misses)))
        else:
            applied.append(e.name)
    return {"applied": sorted(set(applied)), "outside": outside}


def set_notes(files, deployment: Deployment) -> list:
    """One line per coefficient set file (``--coefficients``, ``extra_coefficient_files``, in the
    order they were applied) saying what of it reaches ``deployment``: the coefficients it sets
    there, or that none does and the deployment is priced with the registry's values, and why
    (the scope it names). Also named: an entry under a name no set the deployment lists defines
    (a misspelt name, which the resolver never reads; with the nearest known name), a scope
    naming a chip the registry does not know, and a value it sets past what physics allows on
    the chip (``physical_range``, the fit's bounds). ``price``, ``serve``, ``sweep``,
    ``optimize`` and ``size`` print these (``accuracy`` counts the deployments a set reaches):
    a fitted set applied silently, or silently not, was indistinguishable in their output."""
    import difflib
    from .formats import coefficient_set_files, load_coefficient_set
    if not isinstance(deployment, Deployment):
        refuse("expected a Deployment (load_deployment(...))", field="deployment", value=shown(deployment),
               has_value=True)
    if files is not None and not isinstance(files, (str, os.PathLike, list, tuple)):
        refuse("expected a coefficient set path or a list of them", field="files", value=shown(files), has_value=True)
    files = list(coefficient_set_files(files, field="files"))       # each read: a bad one refused, naming it
    if not files:
        return []
    dims = deployment_dims(deployment)
    here = f"{dims['hardware']}, {dims['model']}, engine {dims['engine']}"
    read = set(deployment.coefficients.names)
    known = set()
    reg = Registry()
    given = {str(Path(f).expanduser().resolve()) for f in files}
    for n in deployment.scenario.coefficient_sets:
        if str(Path(str(n)).expanduser().resolve()) in given:     # the sets in question (size lists them)
            continue
        try:
            known |= {e.name for e in reg.coefficient_set(n, file=deployment.scenario.path).entries}
        except JaxpriceError:
            pass
    sets = [load_coefficient_set(f) for f in files]
    last = {}                                   # name -> index of the last set that sets it here
    reach = []
    for i, f in enumerate(files):
        got = set_applies(f, deployment)
        reach.append(got)
        for n in got["applied"]:
            if n in read:
                last[n] = i
    out = []
    for i, (f, cset, got) in enumerate(zip(files, sets, reach)):
        label = f"{Path(f).name} (--coefficients)"
        applied = sorted(n for n in got["applied"] if last.get(n) == i)
        over = sorted(n for n in got["applied"] if n in read and last.get(n) != i)
        if applied:
            line = (f"{label}: sets {', '.join(applied)} for this deployment ({here}); every other coefficient "
                    "keeps the registry's value")
        elif over:
            line = f"{label}: its entries for this deployment ({here}) are overridden by a later set"
        else:
            scopes = {d: sorted({str(a) for e in cset.entries for a in e.scope.get(d, ())})
                      for d in ("hardware", "model", "engine")}
            said = "; ".join(f"{d} {', '.join(v)}" for d, v in scopes.items() if v)
            line = (f"{label}: " + (f"none of its {len(cset.entries)} entries reaches" if cset.entries else
                                     "it has no entries for")
                    + f" this deployment ({here}): it is priced with the registry's values"
                    + (f" (the set is scoped to {said})" if said else ""))
        if applied and over:
            line += f"; {', '.join(over)} overridden by a later set"
        for n in applied:       # a hand-edited value past what physics allows (the fit's bounds) loaded silently
            lo, hi, why = physical_range(n, deployment.chip)
            coefs = deployment.coefficients
            v = float(coefs[n])
            if (hi is not None and v > hi * (1 + 1e-9)) or (lo is not None and v < lo * (1 - 1e-9)):
                units = coefs.units[coefs.names.index(n)]
                line += (f"; its {n}, {v / si_factor(n, units):.6g} {units}, is outside what physics allows "
                         f"({why}): this deployment is priced past its chip")
        for n in sorted({e.name for e in cset.entries} - known if known else ()):
            near = difflib.get_close_matches(n, sorted(known), n=1)
            line += (f"; entry '{n}' is no coefficient the registry knows, so nothing reads it"
                     + (f" (did you mean '{near[0]}'?)" if near else ""))
        for v in sorted({str(a) for e in cset.entries for a in e.scope.get("hardware", ())}):
            try:
                reg.chip(v.lower())         # scopes match chips case-blind (resolve._Scope._admits)
            except JaxpriceError:
                line += f"; its scope names hardware '{v}', no chip the registry knows (a misspelt chip?)"
        out.append(line)
    return out


# ----------------------------------------------------------------------------- through the serving simulation

# ``batch_rule='simulate'`` (issue 15): each point is a closed-loop run of the serving simulation
# (serve.py). Its schedule depends on token counts only, so it is built ONCE per point
# (``serve.build_schedules``, the accuracy harness's engine settings per point); the fit then
# only re-prices the schedule's steps. A run's mean TPOT and mean TTFT are LINEAR in its step
# times (cumulative sums of step times, differenced per request and averaged:
# ``serve.schedule_metrics``), so each is a fixed weight vector over steps, taken once per point
# (``metric_weights``, in closed form); the objective is then
# ``log(w . max_rank(step_times(coefficients)))`` and its gradient flows exactly through the
# step times (``tests/test_fit.py`` checks both the weights and the gradient). The runs of one
# plan structure are priced in one compiled call, runs of decode-only steps merged into blocks
# priced at their mean reads (``simfit``).

SIM_TARGETS = ("tpot", "ttft")


def parse_targets(text) -> tuple:
    """'tpot', 'ttft' or 'tpot,ttft' (any order; a list works too) -> the targets in SIM_TARGETS order."""
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else list(text)) if str(t).strip()]
    for t in items:
        if t not in SIM_TARGETS:
            refuse(f"unknown target under the simulate rule (known: {', '.join(SIM_TARGETS)}, or tpot,ttft)",
                   field="target", value=t)
    if not items:
        refuse("give at least one target (tpot, ttft or tpot,ttft)", field="target", value=text)
    return tuple(t for t in SIM_TARGETS if t in items)


def metric_weights(sched) -> np.ndarray:
    """[2, steps]: mean TPOT and mean TTFT of a closed-loop schedule as weights over its step
    times (both are linear in them): the exact gradient of ``serve.schedule_metrics``, in NumPy.

    With end[k] = t_0 + ... + t_k, a request arriving at the end of step a (a < 0: at time 0),
    emitting its first token at step f and its last at step g with o output tokens:
    TTFT = end[f] - end[a] + wait + admission, wait = phase x t[a + 1] when busy
    (``serve.request_latencies``), so steps a+1..f weigh 1 and step a+1 another phase;
    TPOT = (end[g] - end[f]) / (o - 1): steps f+1..g weigh 1 / (o - 1), over requests with
    o > 1. Each mean divides by its request count."""
    from . import serve
    if sched.open_loop:
        refuse("an open-loop schedule's times are not linear in its step times", field="schedule")
    S = int(sched.steps)
    if S == 0:
        return np.zeros((2, 0))
    req = sched.requests
    a, f, g = (np.asarray(req[k], dtype=np.int64) for k in ("arrival_step", "first_step", "finish_step"))
    out_len = np.asarray(req["output_len"])
    lat = serve.request_latencies(sched, np.ones(S))           # wait = busy x phase x 1
    diff = np.zeros((2, S + 1))
    multi = out_len > 1
    k = multi if multi.any() and not multi.all() else np.ones(out_len.size, bool)
    share = np.where(k, 1.0 / np.maximum(out_len - 1, 1), 0.0) / max(int(k.sum()), 1)
    np.add.at(diff[0], f + 1, share)
    np.add.at(diff[0], g + 1, -share)
    lo = np.maximum(a + 1, 0)
    np.add.at(diff[1], lo, 1.0 / a.size)
    np.add.at(diff[1], f + 1, -1.0 / a.size)
    w = np.cumsum(diff, axis=1)[:, :S]
    np.add.at(w[1], np.clip(a + 1, 0, S - 1), np.asarray(lat["wait"], dtype=float) / a.size)
    return w


@dataclasses.dataclass
class SimRun:
    """The simulated runs of one deployment that share a plan: the recipe-resolved Deployment
    (``deployment``: what the runs price), its closed-loop schedules (one per point) and each
    schedule's point position in its SimObservations."""
    deployment: Deployment
    schedules: list
    positions: list


@dataclasses.dataclass
class SimObservations:
    """Measured mean TPOT and mean TTFT (seconds, [n]; a NaN TTFT is no TTFT residual) of one
    deployment's points under the ``simulate`` batch rule: ``runs`` (SimRun, one per distinct
    plan) hold each point's fixed schedule. ``targets``: which of tpot, ttft the loss compares
    (log-errors summed over both). ``measured`` is the residuals' measured values, the chosen
    targets' points in order (tpot first); ``points`` their count (what the loss weighs)."""
    name: str
    deployment: Deployment
    runs: list
    tpot: np.ndarray
    ttft: np.ndarray
    targets: tuple = ("tpot",)
    estimate: str = "no_overlap"
    weights: np.ndarray | None = None
    sweeps: np.ndarray | None = None
    concurrency: np.ndarray | None = None
    assumptions: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.targets = parse_targets(self.targets)
        self.tpot = np.asarray(self.tpot, dtype=float).reshape(-1)
        self.ttft = np.asarray(self.ttft, dtype=float).reshape(-1)
        if self.estimate not in ESTIMATES:
            refuse(f"unknown estimate (known: {', '.join(ESTIMATES)})", field="estimate", value=self.estimate)
        n = self.tpot.size
        if self.ttft.shape != (n,) or sorted(p for r in self.runs for p in r.positions) != list(range(n)):
            refuse("one schedule and one TTFT per point", field=f"{self.name}.runs")
        tpot = self.tpot if "tpot" in self.targets else self.tpot[~np.isnan(self.tpot)]   # TTFT alone: NaN, none
        if not np.all(np.isfinite(tpot) & (tpot > 0)):
            refuse("measured mean TPOT must be positive and finite" + ("" if "tpot" in self.targets else
                   " (NaN: none)"), field=f"{self.name}.tpot")
        bad = np.isfinite(self.ttft) & ~(self.ttft > 0)
        if bad.any():
            refuse("measured mean TTFT must be positive (NaN: none)", field=f"{self.name}.ttft",
                   value=float(self.ttft[bad][0]))
        if self.points == 0:
            refuse("no measurement of the chosen targets (" + ",".join(self.targets) + ")",
                   field=f"{self.name}.measured")
        if self.weights is not None:
            self.weights = np.asarray(self.weights, dtype=float).reshape(-1)
            if self.weights.shape != (self.points,) or not np.all(np.isfinite(self.weights) & (self.weights >= 0)):
                refuse("weights must be one non-negative number per residual", field=f"{self.name}.weights")
        if self.sweeps is not None:
            self.sweeps = np.asarray(self.sweeps).reshape(-1)
            self.concurrency = np.asarray(self.concurrency, dtype=float).reshape(-1)

    @property
    def target(self) -> str:
        return "simulate:" + ",".join(self.targets)

    @property
    def residual_index(self) -> np.ndarray:
        """Positions of the residuals in the flattened [2, n] (tpot row, ttft row) predictions."""
        n = self.tpot.size
        out = []
        if "tpot" in self.targets:
            out.append(np.arange(n))
        if "ttft" in self.targets:
            out.append(n + np.flatnonzero(np.isfinite(self.ttft)))
        return np.concatenate(out).astype(np.int32)

    @property
    def measured(self) -> np.ndarray:
        return np.concatenate([self.tpot, self.ttft])[self.residual_index]

    @property
    def points(self) -> int:
        return int(self.residual_index.size)

    @property
    def n_points(self) -> int:
        return int(self.tpot.size)

    @property
    def dims(self) -> dict:
        return deployment_dims(self.deployment)

    def with_targets(self, targets) -> "SimObservations":
        return dataclasses.replace(self, targets=parse_targets(targets), weights=None)


def predict_simulated(obs: SimObservations, layout=None, theta=None, *, temperature=None) -> np.ndarray:
    """[2, n]: each point's predicted mean TPOT and mean TTFT (seconds) from its fixed schedule,
    every step priced, at the registry's values (no ``layout``) or with ``theta`` applied
    through ``layout`` (``predict_simulated_many`` for many deployments in shared calls)."""
    return predict_simulated_many([obs], layout, theta, temperature=temperature)[obs.name]


def predict_simulated_many(observations, layout=None, theta=None, *, temperature=None) -> dict:
    """{name: [2, n]} as ``predict_simulated``, one compiled call per plan structure and
    estimate (``simfit.predict``)."""
    from . import simfit
    out, by_est = {}, {}
    for o in observations:
        by_est.setdefault(o.estimate, []).append(o)
    for group in by_est.values():
        out.update(simfit.predict(group, layout, theta, temperature=temperature))
    return out


def observations_from_simulation(csv_path, *, targets=("tpot",), registry=None, scenario_dirs=None,
                                 estimate="no_overlap", deployments=None, extra_coefficient_files=(), callback=None,
                                 settings=None):
    """Observations under the ``simulate`` batch rule from a measurement CSV (the layout of
    inferencex_vllm_dev.csv): per point, its closed-loop schedule at the point's C, isl/osl and
    the engine settings of the published InferenceX recipe, exactly as ``jaxprice accuracy
    --batch-rule simulate`` runs it (``accuracy.engine_assumptions``, ``recipe_deployment``,
    ``recipe_prompts``: ``accuracy.simulated_runs``, every run of every deployment in shared
    scheduler calls), built ONCE; measured mean TPOT and mean TTFT.
    ``targets``: tpot, ttft or both. callback(done, total, deployment=) per deployment.
    ``settings``: a CSV of the engine flags each run passed (``accuracy.read_settings``; default
    the bundled table of InferenceX's runs).

    Returns (observations: SimObservations, one per deployment; refused: (point index, reason);
    points)."""
    from . import accuracy as A
    targets = parse_targets(targets)
    points, _ = A.read_measurements(csv_path, ttft_points=targets == ("ttft",))   # TTFT alone: no TPOT row needed
    points = A.select_deployments(points, deployments, csv_path)
    if targets == ("ttft",) and not any(math.isfinite(p.measured_ttft) for p in points):
        refuse("no point has a measured mean TTFT (a mean_ttft row of its sweep at its concurrency): nothing to fit "
               "target ttft to", file=str(csv_path), field="target", value="ttft")
    if settings is not None:
        points = A.read_settings(points, settings)
    points = A.with_registry(points, registry)     # before the default: the bundled one is no caller's registry
    registry = registry or Registry()
    extra = tuple(extra_coefficient_files)
    runs, refused = A.simulated_runs(points, registry=registry, scenario_dirs=scenario_dirs,
                                     extra_coefficient_files=extra, source=str(csv_path))
    by_dep: dict = {}
    for run in runs:
        by_dep.setdefault(run.name, []).append(run)
    obs = []
    for k, (name, dep_runs) in enumerate(by_dep.items()):
        o = _sim_observations(name, dep_runs, points, refused, targets, estimate)
        if o is not None:
            obs.append(o)
        if callback is not None:
            callback(k + 1, len(by_dep), deployment=name)
    return obs, refused, points


def _sim_observations(name, dep_runs, points, refused, targets, estimate):
    """One deployment's SimObservations from its simulated runs (None when no point is left):
    each run's schedules grouped by recipe plan, the points a run refused (or, for target ttft
    alone, points without a measured TTFT) appended to ``refused``."""
    from . import accuracy as A
    sims: dict = {}              # plan -> (recipe deployment, [(point index, schedule)])
    assumed = {}
    for run in dep_runs:
        refused.extend((i, r) for i, r in run.reasons.items())
        slot = sims.setdefault(run.dep.plan, (run.dep, [])) if run.schedules else None
        for i in run.index:
            c = points[i].concurrency
            if c in run.schedules and i not in run.reasons:
                slot[1].append((i, run.schedules[c]))
                assumed[i] = A.assumptions_text(A.engine_assumptions(points[run.index[0]]))
    ok = sorted(i for _, lst in sims.values() for i, _ in lst)
    if not ok:
        return None
    pos = {i: j for j, i in enumerate(ok)}
    sim_runs = [SimRun(dep, [s for _, s in lst], [pos[i] for i, _ in lst]) for dep, lst in sims.values() if lst]
    tt = np.array([points[i].measured_ttft for i in ok], dtype=float)
    if "ttft" in targets and not np.isfinite(tt).any() and targets == ("ttft",):
        refused.extend((i, "no measured mean TTFT (target ttft)") for i in ok)
        return None
    return SimObservations(name, dep_runs[0].base, sim_runs, np.array([points[i].measured for i in ok]),
                           tt, targets, estimate, sweeps=np.array([points[i].sweep for i in ok]),
                           concurrency=np.array([points[i].concurrency for i in ok]),
                           assumptions=[assumed[i] for i in ok])


def score_simulated(observations, predictions) -> dict:
    """``score_points`` for SimObservations, given {name: [2, n] predicted mean TPOT and TTFT}:
    the TPOT keys and ttft_points, ttft_mape, ttft_signed, ttft_shape_mean (the accuracy
    harness's ``shape_errors`` / ``summarize``), whatever the fit's targets."""
    from . import accuracy
    obs = list(observations)
    pred = np.concatenate([np.asarray(predictions[o.name], dtype=float).reshape(2, -1) for o in obs], axis=1)
    tpot, ttft = np.concatenate([o.tpot for o in obs]), np.concatenate([o.ttft for o in obs])
    sweeps = np.concatenate([[f"{o.name}|{s}" for s in (o.sweeps if o.sweeps is not None else
                                                        ["run"] * o.n_points)] for o in obs])
    conc = np.concatenate([o.concurrency if o.concurrency is not None else np.arange(o.n_points) for o in obs])
    shape, anchor = accuracy.shape_errors(sweeps, conc, pred[0], tpot)
    tshape, _ = accuracy.shape_errors(sweeps, conc, pred[1], ttft)
    s = accuracy.summarize(shape, anchor, pred[0], tpot, ttft_shape=tshape, ttft_predicted=pred[1],
                           ttft_measured=ttft)
    return {"points": s["points"], "tpot_mape": s["tpot_mape"], "tpot_signed": s["tpot_mean_signed"],
            "shape_mean": s["shape_mean"], "ttft_points": s["ttft_priced"], "ttft_mape": s["ttft_mape"],
            "ttft_signed": s["ttft_mean_signed"], "ttft_shape_mean": s["ttft_shape_mean"]}
