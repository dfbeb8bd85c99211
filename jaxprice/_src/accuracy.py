"""Accuracy: predicted mean TPOT against measured serving latencies.

Reads a CSV of client-side measurements in the layout of ``shared/measured/inferencex_vllm_dev.csv``
(one row per point and quantity; only ``mean_tpot`` rows are scored: TTFT includes queueing) and
prices every point by a batch rule. The default, ``anchor``, is the anchor kernel's rule
(``shared/measured/README.md``, 'From a step-time model to a TPOT prediction'), so the figures
are comparable with the anchor's:

* Deployment: the bundled scenario ``testdata/aisimulate/<deployment>.yaml`` when there is one,
  else a ``Scenario`` built from the columns (model, hardware, dtype, engine, tp, ep, dp; see
  ``scenario_from_columns``), resolved by jaxprice's own ``resolve``. For the 21 deployments of
  the development set that have both, the two give the same plan and coefficients.
* Batch: C decoding requests (C = the row's concurrency, not divided among DP ranks), each
  scheduling 1 token with ``ctx - 1`` computed (prompt length ``ctx = isl + osl // 2``), decode
  threshold 8. No prefill, queueing or preemption is modelled.
* TPOT(C) = step estimate + ``host_output_token`` (the per-output-token host overhead the
  registry states, 45.9 us on every chip; 0 when the deployment's sets carry none). NoOverlap is
  the anchor's (headline) estimate; Overlap is reported beside it.

Batch rules (``batch_rule``; ``BATCH_RULES``). Each prices one or more batches per point and
combines their step estimates S (NoOverlap, or Overlap, alike) linearly; every decode row is as
above (1 token at context ``ctx``, threshold 8); ``host_output_token`` is added once.

* ``anchor`` (default): ``TPOT = S(C decodes) + host_output_token``. The client's C requests
  are all taken to decode in every step. Kept bit-identical to the anchor kernel's rule.
* ``capped``: ``R = min(C, max_num_seqs * dp, floor(dp * kv_capacity_tokens / ctx))`` and
  ``TPOT = S(R decodes) + host_output_token``. Models the engine's resident limit: vLLM keeps at
  most ``max_num_seqs`` requests running per data-parallel rank, and at most as many as its KV
  cache holds; the rest wait in the queue (their wait shows in TTFT, not TPOT), so a resident
  request's inter-token latency is the step time of the resident batch. ``kv_capacity_tokens``
  is ``plan.memory["kv_capacity_tokens"]`` (per rank, from ``resolve``: HBM x
  gpu_memory_utilization less weights, activations, CUDA-graph memory and communication
  buffers, over the KV bytes per token, the reference kernel's memory model). Limits: every
  resident request is counted at the same mid-decode context (in vLLM a request holds its
  growing context, block-rounded; short ones leave room for more); preemption, prefix caching,
  DP load imbalance and the recurrent state of hybrid models are not modelled. Where C fits,
  ``capped`` equals ``anchor``.
* ``interleaved``: the capped batch and the prefills that keep it full. In steady state a
  resident request finishes every ``osl`` of its decode steps, so ``R / osl`` new requests
  arrive per step, and vLLM's chunked prefill runs each prompt in chunks of at most
  ``max_num_batched_tokens - R`` tokens beside the R decode rows (the chunk row schedules its
  tokens after the prompt's earlier chunks). A request's mean TPOT averages over every step it
  decodes in, so, with ``S_d = S(R decodes)`` and ``S_j = S(R decodes + chunk j)``::

      TPOT = S_d + (R / osl) * sum_j (S_j - S_d) + host_output_token

  i.e. weights ``1 - (R / osl) * chunks`` on S_d and ``R / osl`` on each S_j. It explains why
  TPOT grows faster with C for long prompts (8k1k) than for short ones (1k1k). Limits: it is a
  first-order average; it assumes one request's chunks never share a step with another's
  (when ``(R / osl) * chunks`` nears 1 several prefills share a step and the rule
  over-charges), takes the budget as ``max_num_batched_tokens`` (8192 when unset), ignores
  decode-priority scheduling, preemption and the ramp-up of a sweep; at C below the resident
  limit it still assumes a full closed loop. It has no fitted parameter, but it was designed
  after looking at the registry's errors on ``inferencex_vllm_dev.csv``, so its figures on
  that set are not an out-of-sample test.

``group_points`` builds each point's batches under the rule (``point_requests`` is the one
definition, also used by ``jaxprice.fit.observations_from_measurements``); a deployment's
batches are stacked, padded to the next power of two of its widest decode batch (plus one row
for a prefill chunk), and priced in ONE
vmapped call (45 compiles for the development set, not 1,155); ``DeploymentPoints.combine``
(``[points, batches]``, interleaved only) maps the batch estimates to each point's TPOT.

Metrics (per model and overall, with point counts):

* shape error, per point ``|(pred(C)/pred(C0)) / (meas(C)/meas(C0)) - 1|`` with C0 the lowest
  concurrency of the point's sweep (one scenario file and workload); each sweep's first point
  counts as 0. Summaries: mean, median (the upper median ``sorted(err)[n // 2]`` as the anchor
  kernel reports it), max, and the mean over non-anchor points.
* absolute TPOT: MAPE ``mean |pred/meas - 1|`` and mean signed error ``mean (pred/meas - 1)``.

A point the kernel refuses (its deployment does not resolve, its batch is invalid, or its price
is not finite) is kept in ``AccuracyReport.refused`` with the reason and counted in every summary
(``points`` = ``priced`` + ``refused``); it is never dropped silently. A malformed CSV (missing
column, bad number, unknown unit, duplicate point) is refused as a whole with a JaxpriceError
naming file:line, column and value. Everything here returns values; printing is left to the
CLI and experiments/.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import re
from pathlib import Path

import jax
import numpy as np

from .errors import JaxpriceError, refuse
from .formats import Registry, Scenario, load_coefficient_set
from .plan import RESOURCES, Batch, Coefficients
from .resolve import Deployment, load_deployment, resolve, testdata_root

REQUIRED_COLUMNS = ("scenario", "deployment", "model", "hardware", "dtype", "engine", "tp", "ep", "dp",
                    "workload", "isl", "osl", "concurrency", "quantity", "value", "unit")
UNIT_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
DEFAULT_SETS = ("cost-model-primitives", "cost-model-collectives", "cost-model-host-overheads",
                "cost-model-attention", "cost-model-recurrent", "cost-model-memory")
# dtype column -> engine.quantization ("" = the checkpoint's own format, e.g. kimi-k2.5's int4)
DTYPE_QUANTIZATION = {"fp4": "nvfp4", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "fp8": "fp8", "bf16": "",
                      "int4": ""}
DECODE_THRESHOLD = 8
BATCH_RULES = ("anchor", "capped", "interleaved")
# one line per rule, for reports (the formulas are in the module docstring)
BATCH_RULE_TEXT = {
    "anchor": "the anchor kernel's rule: a batch of C decoding requests",
    "capped": ("batch rule `capped`: R = min(C, max_num_seqs x dp, floor(dp x KV-cache tokens per rank / ctx)) "
               "decoding requests (the engine's resident batch; the rest queue)"),
    "interleaved": ("batch rule `interleaved`: the capped batch of R decoding requests and the prefills that keep "
                    "it full, TPOT = S(R decodes) + (R / osl) x sum over the prompt's chunks of "
                    "[S(R decodes + chunk) - S(R decodes)] + host_output_token, chunks of at most "
                    "max_num_batched_tokens - R tokens"),
}
ESTIMATES = ("no_overlap", "overlap")
ESTIMATE_LABELS = {"no_overlap": "NoOverlap", "overlap": "Overlap"}
# XLA options for the accuracy kernel: about 1.5x faster compiles (the run is compile-bound:
# one plan per deployment), same prices to the last ulp or two
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


# ----------------------------------------------------------------------------- reading


@dataclasses.dataclass(frozen=True)
class Point:
    """One measured mean-TPOT point (seconds)."""
    row: int                 # line number in the CSV (header = line 1)
    scenario: str
    deployment: str
    model: str
    hardware: str
    dtype: str
    engine: str
    tp: int
    ep: int
    dp: int
    workload: str
    isl: int
    osl: int
    concurrency: int
    measured: float          # seconds
    anchor_concurrency: int | None

    @property
    def sweep(self) -> str:
        return f"{self.scenario}|{self.workload}"

    @property
    def context(self) -> int:
        return self.isl + self.osl // 2


def _int(text, *, where, field, minimum=None):
    try:
        v = float(text)
    except (TypeError, ValueError):
        refuse("expected an integer", file=where, field=field, value=text)
    if not math.isfinite(v) or v != int(v):
        refuse("expected an integer", file=where, field=field, value=text)
    if minimum is not None and v < minimum:
        refuse(f"must be at least {minimum}", file=where, field=field, value=text)
    return int(v)


def read_measurements(path, *, quantity: str = "mean_tpot") -> tuple[list[Point], dict]:
    """Read the ``quantity`` rows (default mean TPOT) of a measurement CSV.

    Returns (points in file order, info); info counts the rows read, the points, the rows of
    other quantities (ignored) and lists sweeps whose lowest concurrency is not the file's
    ``anchor_concurrency`` (``anchor_mismatch``: their shape errors are relative to a different
    point than the anchor kernel's). Every row is checked, whatever its quantity: a malformed
    row (missing field, bad number, unknown unit, non-positive value, a second point of one
    sweep at one concurrency) is refused with a JaxpriceError naming ``file:line``, the column
    and the value; a bad row in a measurement file is a data error, not a point the kernel
    refuses.
    """
    file = str(path)
    try:
        fh = open(path, newline="")
    except (FileNotFoundError, IsADirectoryError, PermissionError) as err:
        refuse(f"cannot read the measurement file ({type(err).__name__})", file=file)
    with fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames or []
        missing = [c for c in REQUIRED_COLUMNS if c not in cols]
        if missing:
            refuse(f"missing column(s) {', '.join(missing)} (the layout of inferencex_vllm_dev.csv: "
                   f"{', '.join(REQUIRED_COLUMNS)})", file=f"{file}:1", field=missing[0])
        points, other, seen = [], 0, {}
        for i, r in enumerate(reader, start=2):
            where = f"{file}:{i}"
            if None in r:
                refuse(f"row has {len(cols) + len(r[None])} fields, the header {len(cols)}", file=where)
            for c in REQUIRED_COLUMNS:
                if r[c] is None:
                    refuse(f"row has fewer fields than the header ({len(cols)})", file=where, field=c)
                r[c] = r[c].strip()
            unit = r["unit"]
            if unit not in UNIT_SECONDS:
                refuse(f"unknown unit (known: {', '.join(UNIT_SECONDS)})", file=where, field="unit", value=unit)
            try:
                value = float(r["value"])
            except ValueError:
                refuse("expected a number", file=where, field="value", value=r["value"])
            if not math.isfinite(value) or value <= 0:
                refuse("a measured latency must be a positive, finite number", file=where, field="value",
                       value=r["value"])
            if r["quantity"] != quantity:
                other += 1
                continue
            for c in ("scenario", "model", "hardware", "workload"):
                if not r[c]:
                    refuse("must not be empty", file=where, field=c, value=r[c])
            anchor = (r.get("anchor_concurrency") or "").strip()
            deployment = r["deployment"] or re.sub(r"(-cfg\d+)?(\.ya?ml)?$", "", r["scenario"])
            p = Point(
                row=i, scenario=r["scenario"], deployment=deployment, model=r["model"],
                hardware=r["hardware"], dtype=r["dtype"], engine=r["engine"],
                tp=_int(r["tp"], where=where, field="tp", minimum=1),
                ep=_int(r["ep"], where=where, field="ep", minimum=1),
                dp=_int(r["dp"], where=where, field="dp", minimum=1), workload=r["workload"],
                isl=_int(r["isl"], where=where, field="isl", minimum=0),
                osl=_int(r["osl"], where=where, field="osl", minimum=0),
                concurrency=_int(r["concurrency"], where=where, field="concurrency"),
                measured=value * UNIT_SECONDS[unit],
                anchor_concurrency=_int(anchor, where=where, field="anchor_concurrency") if anchor else None)
            key = (p.sweep, p.concurrency)
            if key in seen:
                refuse(f"a second {quantity} point of sweep {p.scenario} ({p.workload}) at this concurrency "
                       f"(first on line {seen[key]})", file=where, field="concurrency", value=r["concurrency"])
            seen[key] = i
            points.append(p)
    if not points:
        refuse(f"no {quantity} rows", file=file, field="quantity", value=quantity)
    lowest: dict = {}
    for p in points:
        lowest[p.sweep] = min(lowest.get(p.sweep, p.concurrency), p.concurrency)
    mismatch = sorted({p.sweep for p in points
                       if p.anchor_concurrency is not None and p.anchor_concurrency != lowest[p.sweep]})
    return points, {"rows": len(points) + other, "points": len(points), "other_quantity_rows": other,
                    "anchor_mismatch": mismatch}


# ----------------------------------------------------------------------------- deployments


def scenario_from_columns(p: Point, *, source: str = "columns") -> Scenario:
    """A Scenario for a point whose deployment has no bundled scenario, with the settings the
    bundled vLLM scenarios use: the six cost-model sets, the row's chip, 1 node x 8 GPUs, tp and
    dp from the columns, expert parallelism on when ep > 1 (vLLM's expert-parallel width is then
    tp x dp, whatever the ep column says), quantization from the dtype (fp4 -> nvfp4, fp8 -> fp8,
    bf16/int4 -> the checkpoint's own), an fp8 KV cache unless bf16, PIECEWISE graphs,
    max_num_seqs 256, block 16 (64 for glm-5), 8192 batched tokens, max_model_len 32768."""
    file = f"{source} (deployment {p.deployment}, built from the columns)"
    if p.dtype not in DTYPE_QUANTIZATION:
        refuse(f"unknown dtype (known: {', '.join(DTYPE_QUANTIZATION)})", file=file, field="dtype", value=p.dtype)
    if p.engine != "vllm":
        refuse("only vllm deployments can be built from the columns (add a scenario file)", file=file,
               field="engine", value=p.engine)
    engine = {"cache_dtype": "auto" if p.dtype == "bf16" else "fp8",
              "block_size": 64 if p.model.startswith("glm-5") else 16,
              "max_num_batched_tokens": 8192, "max_num_seqs": 256, "max_model_len": 32768,
              "cudagraph_mode": "PIECEWISE", "gpu_memory_utilization": 0.9}
    quant = DTYPE_QUANTIZATION[p.dtype]
    if quant:
        engine["quantization"] = quant
    return Scenario(name=p.deployment, model=p.model, hardware=p.hardware, fabric=None, nodes=1,
                    gpus_per_node=8, gpus_per_rack=0, coefficient_sets=DEFAULT_SETS, engine_version="",
                    pool_nodes=1, parallel={"tp": p.tp, "pp": 1, "dp": p.dp,
                                            "enable_expert_parallel": p.ep > 1},
                    engine=engine, path=file)


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(testdata_root().parent))
    except ValueError:
        return str(path)


def build_deployment(p: Point, *, registry: Registry | None = None, scenario_dirs=None,
                     extra_coefficient_files=(), source="columns") -> tuple[Deployment, str]:
    """Resolve the deployment of a point: (Deployment, where it came from: the scenario file's
    path, or ``"columns"``). ``scenario_dirs``: folders searched for ``<deployment>.yaml``
    (default: the bundled testdata/aisimulate; ``[]``: always build from the columns)."""
    dirs = [testdata_root() / "aisimulate"] if scenario_dirs is None else [Path(d) for d in scenario_dirs]
    registry = registry or Registry()
    for d in dirs:
        f = d / f"{p.deployment}.yaml"
        if f.exists():
            return (load_deployment(f, registry, extra_coefficient_files=extra_coefficient_files),
                    _display_path(f))
    extra = [load_coefficient_set(f) for f in extra_coefficient_files]
    return resolve(scenario_from_columns(p, source=source), registry, extra_sets=extra), "columns"


def padding(max_requests: int) -> int:
    """Rows a deployment's batches are padded to: the next power of two of its largest C."""
    return 1 << max(int(max_requests) - 1, 0).bit_length()


# ----------------------------------------------------------------------------- batch rules


def check_batch_rule(rule, *, field="batch_rule"):
    """The rule itself, or a JaxpriceError naming the known rules."""
    if not isinstance(rule, str) or rule not in BATCH_RULES:
        refuse(f"unknown batch rule (known: {', '.join(BATCH_RULES)})", field=field, value=rule)
    return rule


def kv_capacity_tokens(dep: Deployment) -> float:
    """KV-cache tokens one data-parallel rank holds: ``plan.memory["kv_capacity_tokens"]``, as
    ``resolve`` computes it (the reference kernel's memory model; inf without a KV cache)."""
    return float(dep.plan.memory["kv_capacity_tokens"])


def resident_batch(dep: Deployment, concurrency: int, context: int) -> int:
    """The decode rows the engine keeps running with ``concurrency`` requests in flight, each
    holding ``context`` tokens: ``min(C, max_num_seqs * dp, floor(dp * kv_capacity_tokens /
    context))``. Refused (JaxpriceError) when the KV cache cannot hold one such request."""
    r = dep.resolution
    dp = int(r["dp"])
    limit = min(int(concurrency), int(r["max_num_seqs"]) * dp)
    cap = kv_capacity_tokens(dep)
    if math.isfinite(cap):
        fit = int(math.floor(dp * cap / context))
        if fit < 1:
            refuse(f"the KV cache holds {cap:.0f} tokens per rank, not one request of context {context}",
                   file=dep.scenario.path, field="kv_capacity_tokens", value=cap, has_value=True)
        limit = min(limit, fit)
    return limit


def prefill_chunks(isl: int, resident_rows: int, budget: int) -> list:
    """(tokens, computed) of the chunks one prompt of ``isl`` tokens is prefilled in, beside
    ``resident_rows`` decode rows, under a per-step budget of ``budget`` tokens (at least 1
    token a step)."""
    room = max(int(budget) - int(resident_rows), 1)
    out, done = [], 0
    while done < isl:
        n = min(room, isl - done)
        out.append((n, done))
        done += n
    return out


def point_requests(dep: Deployment, p: Point, batch_rule: str = "anchor"):
    """The batches one point's TPOT is priced from under ``batch_rule`` (see the module
    docstring): (R, requests, weights), R the decode rows, ``requests`` a list of
    (scheduled, computed) per-row token lists (the first the R decode rows), and
    ``TPOT - host_output_token = sum_k weights[k] * S(requests[k])``. Refused (JaxpriceError)
    where the rule cannot price the point."""
    check_batch_rule(batch_rule)
    ctx = p.context
    if p.concurrency < 1:
        refuse(f"concurrency must be >= 1 (got {p.concurrency})", field="concurrency", value=p.concurrency)
    if ctx < 1:
        refuse(f"context isl + osl // 2 must be >= 1 (isl {p.isl}, osl {p.osl})", field="context", value=ctx)
    R = p.concurrency if batch_rule == "anchor" else resident_batch(dep, p.concurrency, ctx)
    decode = ([1] * R, [ctx - 1] * R)
    if batch_rule != "interleaved":
        return R, [decode], [1.0]
    if p.osl < 1:
        refuse("the interleaved rule needs osl >= 1 (requests finish every osl steps)", field="osl", value=p.osl)
    a = R / p.osl
    chunks = prefill_chunks(p.isl, R, int(dep.scenario.engine.get("max_num_batched_tokens", 8192)))
    requests = [decode] + [([1] * R + [tokens], [ctx - 1] * R + [done]) for tokens, done in chunks]
    return R, requests, [1.0 - a * len(chunks)] + [a] * len(chunks)


@dataclasses.dataclass
class DeploymentPoints:
    """The points of one deployment, ready to price: its Deployment, the stacked batches
    (``batches``: [batches, rows], rows = ``padding`` of its widest decode batch, plus one row
    for the prefill chunk under the ``interleaved`` rule), where each point sits
    in the point list (``index``), and the measured mean TPOT (seconds, [n]). Batch i < n is
    point i's decode batch (R rows, ``resident[i]``); ``combine`` ([n, batches], rule
    ``interleaved``; None: point i is batch i) gives each point's TPOT - host_output_token as a
    linear combination of the batches' estimates."""
    name: str
    deployment: Deployment
    source: str
    index: np.ndarray           # int [n] into the point list
    batches: Batch              # stacked [batches, rows]
    measured: np.ndarray        # seconds [n]
    resident: np.ndarray | None = None   # int [n]: decode rows per point (None: the concurrency)
    combine: np.ndarray | None = None    # [n, batches]
    batch_rule: str = "anchor"


def group_points(points, *, registry=None, scenario_dirs=None, extra_coefficient_files=(), source="columns",
                 batch_rule="anchor"):
    """Resolve each deployment once and stack its points' batches under ``batch_rule`` (one
    padding per deployment; see ``point_requests``).

    Returns (groups, refused): groups a list of DeploymentPoints in order of first appearance,
    refused a list of (point index, reason) for points that cannot be priced."""
    check_batch_rule(batch_rule)
    registry = registry or Registry()
    by_dep: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        by_dep.setdefault(p.deployment, []).append(i)
    groups, refused = [], []
    for name, idx in by_dep.items():
        try:
            dep, where = build_deployment(points[idx[0]], registry=registry, scenario_dirs=scenario_dirs,
                                          extra_coefficient_files=extra_coefficient_files, source=source)
        except JaxpriceError as err:
            refused.extend((i, f"deployment does not resolve: {err}") for i in idx)
            continue
        ok, specs = [], []
        for i in idx:
            try:
                specs.append(point_requests(dep, points[i], batch_rule))
            except JaxpriceError as err:
                refused.append((i, err.reason))
                continue
            ok.append(i)
        if not ok:
            continue
        # the next power of two of the widest decode batch, one more row for a prefill chunk
        rows = padding(max(R for R, _, _ in specs)) + int(any(len(reqs) > 1 for _, reqs, _ in specs))
        batches = [Batch.decode(R, points[i].context, pad_to=rows, decode_threshold=DECODE_THRESHOLD)
                   for i, (R, _, _) in zip(ok, specs)]
        combine = None
        if any(len(reqs) > 1 for _, reqs, _ in specs):
            extra = [(j, w, sched, comp) for j, (_, reqs, ws) in enumerate(specs)
                     for (sched, comp), w in zip(reqs[1:], ws[1:])]
            combine = np.zeros((len(ok), len(ok) + len(extra)))
            combine[np.arange(len(ok)), np.arange(len(ok))] = [ws[0] for _, _, ws in specs]
            for k, (j, w, sched, comp) in enumerate(extra):
                combine[j, len(ok) + k] = w
                batches.append(Batch.from_requests(sched, comp, pad_to=rows, decode_threshold=DECODE_THRESHOLD))
        groups.append(DeploymentPoints(name=name, deployment=dep, source=where, index=np.array(ok),
                                       batches=Batch.stack(batches),
                                       measured=np.array([points[i].measured for i in ok]),
                                       resident=np.array([R for R, _, _ in specs]), combine=combine,
                                       batch_rule=batch_rule))
    return groups, refused


def host_output_token(coefs: Coefficients):
    """The per-output-token host overhead (seconds) the deployment's sets state, else 0."""
    return coefs["host_output_token"] if "host_output_token" in coefs else 0.0


@functools.partial(jax.jit, static_argnames=("plan",), compiler_options=FAST_COMPILE)
def _price_points(plan, coefs, batches):
    """price_many in exact mode, returning only what the harness reads (compiled faster)."""
    from .step import step_time
    r = jax.vmap(lambda b: step_time(plan, coefs, b))(batches)
    return r.no_overlap, r.overlap, r.bottleneck


def predict_groups(groups, coefficients=None, *, temperature=None, callback=None):
    """Price every group in one vmapped call each.

    Returns {group name: dict(no_overlap, overlap, bottleneck [n] arrays (seconds; bottleneck an
    index into RESOURCES), host_output_token (seconds))}: per point, its TPOT less
    host_output_token (a group's ``combine`` applied to its batches' estimates; the bottleneck
    is that of the point's decode batch). ``coefficients`` optionally maps group name ->
    Coefficients to use instead of the deployment's own (e.g. fitted values).
    ``temperature``: None for exact mode (the default; compiled with FAST_COMPILE), a float for
    smooth mode (``price_many``). ``callback(done, total, deployment=name)`` after each group."""
    from .step import price_many
    out = {}
    for k, g in enumerate(groups):
        coefs = (coefficients or {}).get(g.name, g.deployment.coefficients)
        if temperature is None:
            no, ov, bn = _price_points(g.deployment.plan, coefs, g.batches)
        else:
            res = price_many(g.deployment.plan, coefs, g.batches, temperature=temperature)
            no, ov, bn = res.no_overlap, res.overlap, res.bottleneck
        if g.combine is not None:
            no, ov, bn = g.combine @ np.asarray(no), g.combine @ np.asarray(ov), np.asarray(bn)[:len(g.index)]
        out[g.name] = {"no_overlap": np.asarray(no), "overlap": np.asarray(ov), "bottleneck": np.asarray(bn),
                       "host_output_token": float(host_output_token(coefs))}
        if callback is not None:
            callback(k + 1, len(groups), deployment=g.name)
    return out


# ----------------------------------------------------------------------------- metrics


def shape_errors(sweeps, concurrency, predicted, measured):
    """Per-point shape error ``|(pred/pred0) / (meas/meas0) - 1|`` where 0 is each sweep's anchor
    (its lowest concurrency), and 0 at the anchor itself.

    Returns (errors [n], anchor [n] bool). Every point of a sweep whose anchor is not priced
    (NaN) is NaN; a point that is not priced itself is NaN."""
    sweeps = np.asarray(sweeps)
    c = np.asarray(concurrency, dtype=float)
    pred = np.asarray(predicted, dtype=float)
    meas = np.asarray(measured, dtype=float)
    err = np.full(len(c), np.nan)
    anchor = np.zeros(len(c), dtype=bool)
    for s in dict.fromkeys(sweeps.tolist()):
        m = np.flatnonzero(sweeps == s)
        a = m[np.argmin(c[m])]
        anchor[a] = True
        if not (np.isfinite(pred[a]) and np.isfinite(meas[a])):
            continue
        err[m] = np.abs((pred[m] / pred[a]) / (meas[m] / meas[a]) - 1.0)
        err[a] = 0.0
    return err, anchor


def upper_median(x):
    """``sorted(x)[n // 2]``, the anchor kernel's median (NaN when empty)."""
    x = np.sort(np.asarray(x, dtype=float))
    return float(x[len(x) // 2]) if len(x) else float("nan")


def summarize(shape_err, anchor, predicted, measured):
    """Summary of one estimate over some points (NaN entries = not priced: excluded, counted).

    Keys: points, priced, shape_points (points with a shape error), shape_mean, shape_median
    (upper median), shape_max, shape_mean_non_anchor, tpot_mape, tpot_mean_signed (fractions)."""
    shape_err = np.asarray(shape_err, dtype=float)
    rel = np.asarray(predicted, dtype=float) / np.asarray(measured, dtype=float) - 1.0
    ok = np.isfinite(rel)
    sok = np.isfinite(shape_err)
    non_anchor = sok & ~np.asarray(anchor, dtype=bool)

    def mean(x):
        return float(np.mean(x)) if len(x) else float("nan")
    return {"points": int(len(rel)), "priced": int(ok.sum()),
            "shape_mean": mean(shape_err[sok]), "shape_median": upper_median(shape_err[sok]),
            "shape_max": float(np.max(shape_err[sok])) if sok.any() else float("nan"),
            "shape_mean_non_anchor": mean(shape_err[non_anchor]), "shape_points": int(sok.sum()),
            "tpot_mape": mean(np.abs(rel[ok])), "tpot_mean_signed": mean(rel[ok])}


# ----------------------------------------------------------------------------- the harness


@dataclasses.dataclass
class AccuracyReport:
    """Per-point records (one dict per mean-TPOT point, refused ones included, in file order),
    the refused points with reasons, and summaries ``summary[estimate][model or 'all']`` (see
    ``summarize``; each also has ``refused``)."""
    csv: str
    records: list
    refused: list               # dicts: row, deployment, workload, concurrency, reason
    summary: dict
    info: dict

    def models(self):
        return sorted({r["model"] for r in self.records})

    def summarize_by(self, field, estimate: str = "no_overlap") -> dict:
        """Summaries of one estimate grouped by a record field (e.g. 'hardware', 'workload',
        'deployment') or by ``field(record) -> label``, plus 'all'."""
        recs = self.records
        key = field if callable(field) else (lambda r: str(r[field]))
        pred = np.array([r[f"{estimate}_tpot_us"] for r in recs], dtype=float)
        meas = np.array([r["measured_us"] for r in recs], dtype=float)
        shape = np.array([r[f"{estimate}_shape_error"] for r in recs], dtype=float)
        anchor = np.array([r["anchor"] for r in recs], dtype=bool)
        refused = np.array([r["status"] == "refused" for r in recs], dtype=bool)
        labels = [key(r) for r in recs]
        out = {}
        for k in sorted(set(labels)) + ["all"]:
            sel = np.array([k == "all" or lab == k for lab in labels], dtype=bool)
            s = summarize(shape[sel], anchor[sel], pred[sel], meas[sel])
            s["refused"] = int(refused[sel].sum())
            out[k] = s
        return out


def score(points, groups, refused, predictions, *, csv_path="", info=None) -> AccuracyReport:
    """Assemble per-point records and summaries from priced groups. A priced point whose TPOT is
    not finite (or not positive) is moved to the refused list with that reason."""
    n = len(points)
    pred = {e: np.full(n, np.nan) for e in ESTIMATES}
    step = {e: np.full(n, np.nan) for e in ESTIMATES}
    bottleneck = [""] * n
    source = [""] * n
    hot = np.full(n, np.nan)
    resident = np.array([p.concurrency for p in points])
    reasons = dict(refused)
    rules = {g.batch_rule for g in groups}
    for g in groups:
        if g.resident is not None:
            resident[g.index] = g.resident
        pr = predictions[g.name]
        for e in ESTIMATES:
            step[e][g.index] = pr[e]
            pred[e][g.index] = pr[e] + pr["host_output_token"]
        hot[g.index] = pr["host_output_token"]
        for j, i in enumerate(g.index):
            bottleneck[i] = RESOURCES[int(pr["bottleneck"][j])]
            source[i] = g.source
            bad = [e for e in ESTIMATES if not (np.isfinite(pred[e][i]) and pred[e][i] > 0)]
            if bad:
                reasons[i] = "the kernel priced the step at " + ", ".join(
                    f"{ESTIMATE_LABELS[e]} {step[e][i]!r} s" for e in bad)
                for e in ESTIMATES:
                    pred[e][i] = np.nan
    meas = np.array([p.measured for p in points])
    sweeps = np.array([p.sweep for p in points])
    conc = np.array([p.concurrency for p in points])
    shape = {}
    for e in ESTIMATES:
        shape[e], anchor = shape_errors(sweeps, conc, pred[e], meas)
    anchor_of = {sweeps[a]: a for a in np.flatnonzero(anchor)}
    records = []
    for i, p in enumerate(points):
        a = anchor_of[p.sweep]
        rec = {"row": p.row, "scenario": p.scenario, "deployment": p.deployment, "model": p.model,
               "hardware": p.hardware, "dtype": p.dtype, "tp": p.tp, "ep": p.ep, "dp": p.dp,
               "workload": p.workload, "isl": p.isl, "osl": p.osl, "concurrency": p.concurrency,
               "context": p.context, "batch_rule": next(iter(rules)) if len(rules) == 1 else "",
               "resident": int(resident[i]), "anchor": bool(anchor[i]), "anchor_concurrency": int(conc[a]),
               "measured_us": p.measured * 1e6, "measured_rel": p.measured / meas[a],
               "status": "refused" if i in reasons else "priced", "reason": reasons.get(i, ""),
               "source": source[i], "bottleneck": bottleneck[i] if i not in reasons else "",
               "host_output_token_us": hot[i] * 1e6}
        for e in ESTIMATES:
            rec[f"{e}_step_us"] = step[e][i] * 1e6
            rec[f"{e}_tpot_us"] = pred[e][i] * 1e6
            rec[f"{e}_error"] = pred[e][i] / p.measured - 1.0
            rec[f"{e}_shape_error"] = shape[e][i]
        records.append(rec)
    summary = {}
    models = sorted({p.model for p in points})
    for e in ESTIMATES:
        summary[e] = {}
        for m in models + ["all"]:
            sel = np.array([m == "all" or p.model == m for p in points])
            s = summarize(shape[e][sel], anchor[sel], pred[e][sel], meas[sel])
            s["refused"] = int(sum(1 for i in np.flatnonzero(sel) if i in reasons))
            summary[e][m] = s
    refused_list = [{"row": points[i].row, "deployment": points[i].deployment, "workload": points[i].workload,
                     "concurrency": points[i].concurrency, "reason": r} for i, r in sorted(reasons.items())]
    return AccuracyReport(csv=str(csv_path), records=records, refused=refused_list, summary=summary,
                          info=dict(info or {}))


def select_deployments(points, deployments, csv_path):
    """The points of the named deployments (all for None); refuses a selection matching none."""
    if deployments is None:
        return points
    keep = set(deployments)
    points = [p for p in points if p.deployment in keep]
    if not points:
        refuse("no point of the CSV belongs to the selected deployments", file=str(csv_path),
               field="deployment", value=sorted(keep)[:3])
    return points


def evaluate_accuracy(csv_path, *, registry=None, scenario_dirs=None, extra_coefficient_files=(),
                      deployments=None, temperature=None, callback=None, batch_rule="anchor") -> AccuracyReport:
    """Price every mean-TPOT point of a measurement CSV and score it (see the module docstring).

    extra_coefficient_files: coefficient sets applied after each deployment's own, overriding by
    name (e.g. a set written by ``jaxprice fit``). deployments: keep only these deployment names
    (None: all). batch_rule: 'anchor' (the anchor kernel's rule, the default), 'capped' or
    'interleaved' (``BATCH_RULES``; see the module docstring). callback(done, total, **info):
    progress, once per deployment priced."""
    check_batch_rule(batch_rule)
    points, info = read_measurements(csv_path)
    points = select_deployments(points, deployments, csv_path)
    info["points"] = len(points)
    groups, refused = group_points(points, registry=registry, scenario_dirs=scenario_dirs,
                                   extra_coefficient_files=extra_coefficient_files, source=str(csv_path),
                                   batch_rule=batch_rule)
    predictions = predict_groups(groups, temperature=temperature, callback=callback)
    notes = []
    for g in groups:
        if g.source != "columns":
            continue
        p = points[g.index[0]]
        ep = g.deployment.resolution.get("ep", p.ep)
        if p.ep > 1 and ep != p.ep:
            notes.append(f"{g.name}: column ep {p.ep}, but vLLM's expert-parallel width is tp x dp = {ep} "
                         "(priced at that)")
    info.update(deployments=len({p.deployment for p in points}), sweeps=len({p.sweep for p in points}),
                from_scenario_files=sorted({g.name for g in groups if g.source != "columns"}),
                from_columns=sorted({g.name for g in groups if g.source == "columns"}),
                extra_coefficient_files=[str(f) for f in extra_coefficient_files], notes=notes,
                temperature=temperature, batch_rule=batch_rule,
                resident_below_concurrency=sum(int(R < points[i].concurrency)
                                               for g in groups for i, R in zip(g.index, g.resident)))
    return score(points, groups, refused, predictions, csv_path=csv_path, info=info)


# ----------------------------------------------------------------------------- output


def _pct(x, signed=False):
    if not np.isfinite(x):
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def format_report(report: AccuracyReport, *, title="", markdown=False) -> str:
    """The summary table as text (the CLI and experiments print it), or as Markdown.

    One line per estimate (NoOverlap, Overlap) and model, then 'all': points (priced + refused),
    shape error mean / upper median / max / mean over non-anchor points, TPOT MAPE and mean
    signed error; then the refused points with their reasons and the notes."""
    info = report.info
    head = (f"{report.csv}: {info.get('points', len(report.records))} mean-TPOT points, "
            f"{info.get('sweeps', '?')} sweeps, {info.get('deployments', '?')} deployments "
            f"({len(info.get('from_scenario_files', []))} from scenario files, "
            f"{len(info.get('from_columns', []))} from columns); {len(report.refused)} refused")
    if info.get("extra_coefficient_files"):
        head += "; extra coefficients: " + ", ".join(info["extra_coefficient_files"])
    if info.get("batch_rule", "anchor") != "anchor":
        head += (f"; batch rule {info['batch_rule']} ({info.get('resident_below_concurrency', '?')} point(s) with a "
                 f"resident batch below C)")
    cols = ("estimate", "model", "points", "priced", "refused", "shape mean", "shape median", "shape max",
            "shape mean (non-anchor)", "TPOT MAPE", "TPOT signed")
    rows = []
    for e in ESTIMATES:
        for m, s in report.summary[e].items():
            rows.append((ESTIMATE_LABELS[e], m, str(s["points"]), str(s["priced"]), str(s["refused"]),
                         _pct(s["shape_mean"]), _pct(s["shape_median"]), _pct(s["shape_max"]),
                         _pct(s["shape_mean_non_anchor"]), _pct(s["tpot_mape"]),
                         _pct(s["tpot_mean_signed"], signed=True)))
    lines = []
    if markdown:
        if title:
            lines += [f"# {title}", ""]
        lines += [head, "", "| " + " | ".join(cols) + " |",
                  "|" + "|".join("---" if k < 2 else "---:" for k in range(len(cols))) + "|"]
        lines += ["| " + " | ".join(f"**{c}**" if r[1] == "all" and k > 1 else c for k, c in enumerate(r)) + " |"
                  for r in rows]
    else:
        if title:
            lines.append(title)
        lines.append(head)
        short = ("estimate", "model", "points", "priced", "refused", "shape", "median", "max", "non-anch",
                 "MAPE", "signed")
        widths = [10, max(len(r[1]) for r in rows) + 1] + [7, 7, 8, 7, 7, 8, 9, 7, 8]

        def fmt(r):
            return "".join(f"{c:<{w}}" if k < 2 else f"{c:>{w}}" for k, (c, w) in enumerate(zip(r, widths)))
        lines.append(fmt(short) + "   (shape error: mean, median, max, non-anchor mean; TPOT: MAPE, signed)")
        lines += [fmt(r) for r in rows]
    bullet = "- " if markdown else "  "
    if report.refused:
        lines += (["", f"Refused points ({len(report.refused)}):"] if markdown
                  else [f"refused points ({len(report.refused)}):"])
        groups: dict = {}
        for r in report.refused:
            groups.setdefault((r["deployment"], r["reason"]), []).append(r)
        for (dep, reason), rs in groups.items():
            where = ", ".join(f"line {r['row']} ({r['workload']}, C={r['concurrency']})" for r in rs[:6])
            more = f" and {len(rs) - 6} more" if len(rs) > 6 else ""
            lines.append(f"{bullet}{dep}: {len(rs)} point(s) ({where}{more}): {reason}")
    notes = list(info.get("notes", []))
    if info.get("anchor_mismatch"):
        notes.append(f"{len(info['anchor_mismatch'])} sweep(s) whose lowest concurrency in the file is not "
                     f"their anchor_concurrency (shape errors relative to the lowest): "
                     + ", ".join(info["anchor_mismatch"][:5]))
    if notes:
        lines += ["", "Notes:"] if markdown else ["notes:"]
        lines += [bullet + n for n in notes]
    return "\n".join(lines)


def write_points_csv(report: AccuracyReport, path) -> Path:
    """One row per mean-TPOT point (refused ones included, with their reason); floats with 6
    significant digits, times in microseconds, errors as fractions."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(report.records[0].keys())
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in report.records:
            w.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else
                            f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return path


CHIP_ORDER = ("h100", "h200", "b200", "b300")
WORKLOAD_COLOURS = {"1k1k": "C0", "1k8k": "C2", "8k1k": "C3"}


def _panel_order(dep_recs):
    def key(item):
        r = item[1][0]
        chip = CHIP_ORDER.index(r["hardware"]) if r["hardware"] in CHIP_ORDER else len(CHIP_ORDER)
        return (r["model"], chip, r["hardware"], r["dtype"], r["tp"], r["ep"], r["dp"], item[0])
    return sorted(dep_recs.items(), key=key)


def plot_sweeps(report: AccuracyReport, path, *, estimate="no_overlap", title=None, ncols=None) -> Path:
    """One small panel per deployment: measured mean TPOT (markers, one per run of the sweep)
    and predicted TPOT (solid: ``estimate``; dotted: the other estimate) against concurrency
    (log-2 axis), one colour per workload; refused points are black crosses at their
    measurement. Panels run by model, chip and parallelism; each title gives the deployment
    and its TPOT MAPE / mean shape error."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    other = [e for e in ESTIMATES if e != estimate][0]
    by_dep: dict = {}
    for r in report.records:
        by_dep.setdefault(r["deployment"], []).append(r)
    deps = _panel_order(by_dep)
    ncol = ncols or min(8 if len(deps) > 24 else 6, len(deps))
    nrow = math.ceil(len(deps) / ncol)
    height = 2.1 * nrow + 0.8
    fig, axes = plt.subplots(nrow, ncol, figsize=(2.45 * ncol, height), squeeze=False)
    fig.subplots_adjust(left=0.35 / (2.45 * ncol) + 0.02, right=0.995, bottom=0.45 / height,
                        top=1 - 0.8 / height, wspace=0.28, hspace=0.55)
    markers = "o^sDv<>p*h"
    workloads = sorted({r["workload"] for r in report.records})
    colours = {w: WORKLOAD_COLOURS.get(w, f"C{4 + k}") for k, w in enumerate(workloads)}
    by_dep_stats = report.summarize_by("deployment", estimate)
    for ax, (dep, recs) in zip(axes.flat, deps):
        for w in sorted({r["workload"] for r in recs}):
            rw = [r for r in recs if r["workload"] == w]
            col = colours[w]
            for k, scen in enumerate(dict.fromkeys(r["scenario"] for r in rw)):
                rs = sorted((r for r in rw if r["scenario"] == scen), key=lambda r: r["concurrency"])
                good = [r for r in rs if r["status"] == "priced"]
                if good:
                    ax.plot([r["concurrency"] for r in good], [r["measured_us"] / 1e3 for r in good],
                            markers[k % len(markers)], ms=3.4, color=col, alpha=0.8, mew=0)
                bad = [r for r in rs if r["status"] != "priced"]
                if bad:
                    ax.plot([r["concurrency"] for r in bad], [r["measured_us"] / 1e3 for r in bad], "x",
                            ms=4, color="k")
            pred = {}
            for r in rw:
                if r["status"] == "priced":
                    pred[r["concurrency"]] = (r[f"{estimate}_tpot_us"] / 1e3, r[f"{other}_tpot_us"] / 1e3)
            if pred:
                cs = sorted(pred)
                ax.plot(cs, [pred[c][0] for c in cs], "-", lw=1.1, color=col)
                ax.plot(cs, [pred[c][1] for c in cs], ":", lw=0.9, color=col)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        s = by_dep_stats.get(dep)
        stat = (f"\nMAPE {_pct(s['tpot_mape'])}, shape {_pct(s['shape_mean'])}"
                if s and s["priced"] else "\nrefused")
        ax.set_title(dep + stat, fontsize=6.2)
        ax.tick_params(labelsize=5.5, which="both")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    for ax in list(axes.flat)[len(deps):]:
        ax.axis("off")
    handles = [Line2D([], [], color=colours[w], marker="o", ls="-", ms=3, label=w) for w in workloads]
    handles += [Line2D([], [], color="0.3", ls="-", label=f"predicted, {ESTIMATE_LABELS[estimate]}"),
                Line2D([], [], color="0.3", ls=":", label=f"predicted, {ESTIMATE_LABELS[other]}"),
                Line2D([], [], color="0.3", marker="o", ls="", ms=3,
                       label="measured (marker shape: run of the sweep)")]
    if any(r["status"] != "priced" for r in report.records):
        handles.append(Line2D([], [], color="k", marker="x", ls="", label="refused"))
    s = report.summary[estimate]["all"]
    rule = report.info.get("batch_rule", "anchor")
    fig.suptitle(title or (f"{Path(report.csv).name}: mean TPOT (ms) against concurrency C; predicted = "
                           f"{ESTIMATE_LABELS[estimate]} + host_output_token at context isl + osl/2"
                           f"{'' if rule == 'anchor' else f' (batch rule {rule})'}. "
                           f"All {s['points']} points: TPOT MAPE {_pct(s['tpot_mape'])}, "
                           f"shape error {_pct(s['shape_mean'])} (mean)"), fontsize=9, y=1 - 0.06 / height)
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.25 / height))
    fig.supxlabel("concurrency C (requests in flight)", fontsize=8, y=0.1 / height)
    fig.supylabel("mean TPOT (ms)", fontsize=8, x=0.004)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
