"""Accuracy: predicted mean TPOT and mean TTFT against measured serving latencies.

Reads a CSV of client-side measurements in the layout of ``shared/measured/inferencex_vllm_dev.csv``
(one row per point and quantity: each ``mean_tpot`` row is a point, and its ``mean_ttft`` row
rides along as ``Point.measured_ttft``) and prices every point by a batch rule. The static
rules (anchor, capped, interleaved) price one or a few steps per point and predict TPOT only:
TTFT contains the queueing and prefill before a first token, which no static batch has, so
their TTFT columns are NaN and the reports say so. The ``simulate`` rule predicts both (below). The default, ``anchor``, is the anchor kernel's rule
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

``simulate`` (``simulate_points``): the serving simulation (``jaxprice/_src/serve.py``: vLLM
v1's scheduler step by step, every step priced by the kernel plus the registry's host costs;
each request's TTFT also carries its admission latency and its wait for the next schedule()
call, ``serve.request_latencies``)
of the benchmark client's closed loop at the point's C, with the point's isl/osl, lengths drawn
uniformly on [floor(0.8 L), L] (InferenceX's --random-range-ratio 0.8), 10 x C prompts (C where
the recipe sends C) -- or, where the CSV has them, the row's ``num_prompts`` (prompts the run sent)
and ``range_ratio`` (lengths uniform on [floor(R L), L], ``client.Workload``; 1: fixed lengths)
columns, as ``jaxprice import-bench`` writes them from vLLM benchmark results -- and the engine flags the point's own run states (``stated_settings``:
the bundled table of InferenceX's runs, or ``--settings``), the published InferenceX recipe for
the point's (model, chip, dtype) for the rest (``engine_assumptions``: max_num_seqs, max_num_batched_tokens,
gpu_memory_utilization and so the KV capacity, KV-cache dtype, block size, max_model_len, each
with its source; recorded per point in the ``assumptions`` column and per deployment in the
report). Mean TPOT and mean TTFT are the run's means over requests, as the client computes
them. One vmapped sweep per deployment, workload and estimate.

Speculative decoding (the ``spec_decode`` column, e.g. ``mtp``; ``speculation_assumptions``): under
``simulate`` such a point's run states ``engine.speculative`` (``recipe_deployment``), so every
decode row schedules 1 + k tokens and the plan prices the model graph's drafter (its MTP layers,
k passes); k is the --settings column ``num_speculative_tokens``, else the draft count of the
point's InferenceX MTP recipe (``IX_SPEC_RECIPES``, per model, chip, dtype and engine, with the
recipe's own rules: TensorRT-LLM's DeepSeek-R1 drafts 1 with DP attention, else 3), else the
graph's own speculator (its MTP layer count), each said so in the point's assumptions. The
acceptance (mean tokens emitted per decode row and step, in [1, 1 + k]) is an ASSUMPTION, not a
measurement: ``--acceptance``, else the --settings column ``acceptance``, else the serving
layer's default ``serve.default_acceptance(k)`` (1.7, 2.19, 2.53 for k = 1, 2, 3); the report notes it. A method
the graph has no drafter for (``eagle`` on a model whose speculator is its MTP layers, any method
on a model with none) is refused with that reason, as are speculating points under the static
rules (they price 1-token decode rows).

Metrics (per model and overall, with point counts), for TPOT and (where predicted) TTFT alike:

* shape error, per point ``|(pred(C)/pred(C0)) / (meas(C)/meas(C0)) - 1|`` with C0 the lowest
  concurrency of the point's sweep (one scenario file and workload); each sweep's first point
  counts as 0. Summaries: mean, median (the upper median ``sorted(err)[n // 2]`` as the anchor
  kernel reports it), max, and the mean over non-anchor points.
* absolute TPOT: MAPE ``mean |pred/meas - 1|`` and mean signed error ``mean (pred/meas - 1)``.
* the same by concurrency bucket (C <= 16, <= 64, <= 256, > 256; ``concurrency_bucket``) and over
  the deployments ``jaxprice fit`` holds out (``AccuracyReport.split_summary``).

A point the kernel refuses (its deployment does not resolve, its batch is invalid, its price
is not finite, or the simulation refuses its run) is kept in ``AccuracyReport.refused`` with the reason and counted in every summary
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
import os
import re
import time
from fractions import Fraction
from pathlib import Path

import jax
import numpy as np

from .client import Workload
from .errors import JaxpriceError, check_callback, refuse, shown
from .formats import Registry, Scenario, check_registry, load_coefficient_set, path_list
from .plan import RESOURCES, Batch, Coefficients
from .resolve import Deployment, load_deployment, resolve, testdata_root

REQUIRED_COLUMNS = ("scenario", "deployment", "model", "hardware", "dtype", "engine", "tp", "ep", "dp",
                    "workload", "isl", "osl", "concurrency", "quantity", "value", "unit")
UNIT_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
# A measured serving latency outside this range (seconds) is a unit error, not a measurement: no
# engine emits a token in under 1 us, and no benchmark run waits a day for one.
PLAUSIBLE_SECONDS = (1e-6, 86400.0)
DEFAULT_SETS = ("cost-model-primitives", "cost-model-collectives", "cost-model-host-overheads",
                "cost-model-attention", "cost-model-recurrent", "cost-model-memory")
# dtype column -> engine.quantization ("" = the checkpoint's own format, e.g. kimi-k2.5's int4)
DTYPE_QUANTIZATION = {"fp4": "nvfp4", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "fp8": "fp8", "bf16": "",
                      "int4": ""}
DECODE_THRESHOLD = 8
STATIC_BATCH_RULES = ("anchor", "capped", "interleaved")     # one or a few priced batches per point
BATCH_RULES = STATIC_BATCH_RULES + ("simulate",)             # simulate: the serving simulation (serve.py)
# concurrency buckets of the reports (upper bounds, inclusive)
CONCURRENCY_BUCKETS = (("C <= 16", 16), ("16 < C <= 64", 64), ("64 < C <= 256", 256), ("C > 256", math.inf))
# one line per rule, for reports (the formulas are in the module docstring)
BATCH_RULE_TEXT = {
    "anchor": "the anchor kernel's rule: a batch of C decoding requests",
    "capped": ("batch rule `capped`: R = min(C, max_num_seqs x dp, floor(dp x KV-cache tokens per rank / ctx)) "
               "decoding requests (the engine's resident batch; the rest queue)"),
    "interleaved": ("batch rule `interleaved`: the capped batch of R decoding requests and the prefills that keep "
                    "it full, TPOT = S(R decodes) + (R / osl) x sum over the prompt's chunks of "
                    "[S(R decodes + chunk) - S(R decodes)] + host_output_token, chunks of at most "
                    "max_num_batched_tokens - R tokens"),
    "simulate": ("batch rule `simulate`: the serving simulation (vLLM v1's scheduler, step by step, every step "
                 "priced by the kernel) of the benchmark client's closed loop at the point's C, 10 x C prompts, "
                 "lengths drawn on [0.8 L, L] (or the CSV's num_prompts and range_ratio columns), with the engine flags the run states, else the published InferenceX recipe's "
                 "(`engine_assumptions`); mean TPOT and mean TTFT over the requests, each request's TTFT with "
                 "its admission latency (registry host_admission_per_request + _per_token x prompt tokens) and "
                 "its wait for the next schedule() call (`serve.request_latencies`)"),
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
    measured_ttft: float = math.nan      # seconds: the point's mean-TTFT row (NaN when the file has none)
    run_date: str = ""                   # source_run_date (where the file has it)
    config_id: str = ""                  # source_config_id (where the file has it)
    stated: tuple | None = None          # ((flag, value), ...) its run states (a --settings file); None: the
    #                                      bundled table's (stated_settings)
    spec_decode: str = "none"            # the spec_decode column (where the file has it)
    acceptance: float | None = None      # --acceptance: mean tokens per decode row and step (speculating points)
    # the client of the point's run where the file states it (columns num_prompts, range_ratio); None:
    # InferenceX's (10 x C prompts, or C where its recipe sends C; lengths on [floor(0.8 L), L])
    num_prompts: int | None = None       # prompts the run sent (requests)
    range_ratio: float | None = None     # lengths uniform on [floor(R L), L] (client.Workload); 1: fixed lengths
    # the registry the point is priced with, where the caller gives one (its model's drafter is read
    # from it); None: the bundled one. Not part of the point's identity.
    registry: Registry | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def sweep(self) -> str:
        return f"{self.scenario}|{self.workload}"

    @property
    def context(self) -> int:
        return self.isl + self.osl // 2


def with_registry(points, registry):
    """The points, each to be priced with ``registry`` (``Point.registry``; a speculating point's
    drafter is read from it); unchanged where ``registry`` is None or a point already names one."""
    if registry is None:
        return list(points)
    return [p if p.registry is not None else dataclasses.replace(p, registry=registry) for p in points]


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


def read_measurements(path, *, quantity: str = "mean_tpot", ttft_points: bool = False) -> tuple[list[Point], dict]:
    """Read the ``quantity`` rows (default mean TPOT) of a measurement CSV.

    With the default quantity each point also carries its ``mean_ttft`` row (same scenario,
    workload and concurrency) as ``measured_ttft`` (seconds; NaN where the file has none).
    Returns (points in file order, info); info counts the rows read, the points, the rows of
    other quantities (not points themselves), ``ttft_points`` (points with a TTFT),
    ``ttft_rows_without_tpot`` (line numbers of TTFT rows no TPOT point matches) and lists
    sweeps whose lowest concurrency is not the file's
    ``anchor_concurrency`` (``anchor_mismatch``: their shape errors are relative to a different
    point than the anchor kernel's). ``ttft_points`` (what a TTFT-only fit reads): a mean_ttft row
    no mean_tpot row matches is a point of its own, with no measured TPOT (``measured`` NaN), so a
    file of mean_ttft rows only is read. Every row is checked, whatever its quantity: a malformed
    row (missing field, bad number, unknown unit, non-positive value, a second point of one
    sweep at one concurrency) is refused with a JaxpriceError naming ``file:line``, the column
    and the value; a bad row in a measurement file is a data error, not a point the kernel
    refuses. Optional columns: ``source_run_date``; ``spec_decode`` (a point measured with
    speculative decoding, e.g. ``mtp``, is simulated with its recipe's draft count and an assumed
    acceptance, ``speculation_assumptions``; one whose model graph has no drafter for the method
    is refused with that reason, ``_check_speculation``);
    ``engine`` picks the serving simulation's scheduler (``ENGINE_SCHEDULER``); ``num_prompts``
    (requests the run sent, >= its concurrency) and ``range_ratio`` (in [0, 1]) describe the
    point's client for the ``simulate`` rule (``_client_columns``; empty or absent: InferenceX's).
    """
    from .schema import check_measurement_file
    check_measurement_file(path)          # the declared schema: readable text CSV, ranges (schema.py)
    file = str(path)
    try:
        fh = open(path, newline="", encoding="utf-8-sig")       # a byte-order mark is not part of a column name
    except (FileNotFoundError, IsADirectoryError, PermissionError) as err:
        refuse(f"cannot read the measurement file ({type(err).__name__})", file=file)
    with fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames or []
        missing = [c for c in REQUIRED_COLUMNS if c not in cols]
        if missing:
            refuse(f"missing column(s) {', '.join(missing)} (the layout of inferencex_vllm_dev.csv: "
                   f"{', '.join(REQUIRED_COLUMNS)})", file=f"{file}:1", field=missing[0])
        twice = [c for c in cols if cols.count(c) > 1]
        if twice:
            refuse("column appears twice in the header (which one holds the data?)", file=f"{file}:1",
                   field="header", value=twice[0])
        points, other, seen, ttft, ttft_rows = [], 0, {}, {}, {}
        for i, r in enumerate(reader, start=2):
            where = f"{file}:{i}"
            seconds = _row_seconds(r, cols, where)
            if r["quantity"] != quantity:
                other += 1
                if quantity == "mean_tpot" and r["quantity"] == "mean_ttft":
                    _add_ttft(ttft, r, seconds, i, where)
                    if ttft_points:
                        ttft_rows[i] = dict(r)
                continue
            p = _row_point(r, i, where, seconds)
            key = (p.sweep, p.concurrency)
            if key in seen:
                refuse(f"a second {quantity} point of sweep {p.scenario} ({p.workload}) at this concurrency "
                       f"(first on line {seen[key]})", file=where, field="concurrency", value=r["concurrency"])
            seen[key] = i
            points.append(p)
    matched = _attach_ttft(points, ttft)
    if ttft_points and ttft:        # TTFT rows no mean_tpot row matches: points without a measured TPOT
        for sec, line in ttft.values():
            p = _row_point(ttft_rows[line], line, f"{file}:{line}", math.nan)
            points.append(dataclasses.replace(p, measured_ttft=sec))
        points.sort(key=lambda p: p.row)
        matched += len(ttft)
        other -= len(ttft)
        ttft.clear()
    if not points and quantity == "mean_tpot" and ttft:
        refuse(f"no mean_tpot rows, only {len(ttft)} mean_ttft row(s): each point of this harness is a mean_tpot "
               "row, its mean_ttft row (same scenario, workload and concurrency) riding along on it: add each "
               "point's mean_tpot row (`jaxprice import-bench` writes both), or fit TTFT alone "
               "(`jaxprice fit --batch-rule simulate --target ttft`)", file=file, field="quantity", value=quantity)
    if not points:
        refuse(f"no {quantity} rows", file=file, field="quantity", value=quantity)
    return points, {"rows": len(points) + other, "points": len(points), "other_quantity_rows": other,
                    "anchor_mismatch": _anchor_mismatch(points), "ttft_points": matched,
                    "label_mismatch": [m for m in map(_label_mismatch, points) if m],
                    "ttft_rows_without_tpot": sorted(line for _, line in ttft.values())}


def _row_seconds(r, cols, where) -> float:
    """A measurement row's field count, unit and value checked (stripped in place): its value
    in seconds."""
    if None in r:
        refuse(f"row has {len(cols) + len(r[None])} fields, the header {len(cols)}", file=where)
    short = [c for c in cols if r.get(c) is None]
    if short:           # a ragged row: its values may sit under the wrong columns
        req = [c for c in REQUIRED_COLUMNS if c in short]
        refuse(f"row has fewer fields than the header ({len(cols) - len(short)} of {len(cols)})", file=where,
               field=(req or short)[0])
    for c in REQUIRED_COLUMNS:
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
    seconds = value * UNIT_SECONDS[unit]
    lo, hi = PLAUSIBLE_SECONDS
    if not lo <= seconds <= hi:
        refuse(f"{seconds:.3g} s is not a serving latency (1 us to 1 day): check the value and its unit "
               f"'{unit}'", file=where, field="value", value=r["value"])
    return seconds


def _add_ttft(ttft, r, seconds, line, where):
    """Record a mean_ttft row by (sweep, concurrency), refusing a second one."""
    key = (f"{r['scenario']}|{r['workload']}", _int(r["concurrency"], where=where, field="concurrency"))
    if key in ttft:
        refuse(f"a second mean_ttft point of sweep {r['scenario']} ({r['workload']}) at this "
               f"concurrency (first on line {ttft[key][1]})", file=where, field="concurrency",
               value=r["concurrency"])
    ttft[key] = (seconds, line)


def _row_point(r, line, where, seconds) -> Point:
    """The Point of a checked row of the quantity read."""
    for c in ("scenario", "model", "hardware", "workload"):
        if not r[c]:
            refuse("must not be empty", file=where, field=c, value=r[c])
    anchor = (r.get("anchor_concurrency") or "").strip()
    deployment = r["deployment"] or re.sub(r"(-cfg\d+)?(\.ya?ml)?$", "", r["scenario"])
    isl = _int(r["isl"], where=where, field="isl", minimum=0)
    osl = _int(r["osl"], where=where, field="osl", minimum=0)
    return Point(
        row=line, scenario=r["scenario"], deployment=deployment, model=r["model"],
        hardware=r["hardware"], dtype=r["dtype"], engine=r["engine"],
        tp=_int(r["tp"], where=where, field="tp", minimum=1),
        ep=_int(r["ep"], where=where, field="ep", minimum=1),
        dp=_int(r["dp"], where=where, field="dp", minimum=1), workload=r["workload"],
        isl=isl, osl=osl,
        concurrency=_int(r["concurrency"], where=where, field="concurrency"),
        measured=seconds,
        anchor_concurrency=_int(anchor, where=where, field="anchor_concurrency") if anchor else None,
        run_date=(r.get("source_run_date") or "").strip(),
        config_id=(r.get("source_config_id") or "").strip(),
        spec_decode=(r.get("spec_decode") or "").strip().lower() or "none",
        **_client_columns(r, where, _int(r["concurrency"], where=where, field="concurrency")))


def _client_columns(r, where, concurrency) -> dict:
    """The optional client columns of a row: ``num_prompts`` (an integer >= the concurrency: the
    benchmark sends num_prompts requests under a semaphore of C, so fewer never fill C) and
    ``range_ratio`` (a number in [0, 1]); an empty or absent cell is the InferenceX default (None)."""
    out = {}
    n = (r.get("num_prompts") or "").strip()
    if n:
        out["num_prompts"] = _int(n, where=where, field="num_prompts", minimum=1)
        if out["num_prompts"] < concurrency:
            refuse(f"fewer prompts than the concurrency {concurrency}: only {n} clients would ever send",
                   file=where, field="num_prompts", value=n)
    rr = (r.get("range_ratio") or "").strip()
    if rr:
        try:
            out["range_ratio"] = float(rr)
        except ValueError:
            refuse("expected a number in [0, 1]", file=where, field="range_ratio", value=rr)
        if not 0 <= out["range_ratio"] <= 1:      # NaN fails too
            refuse("expected a number in [0, 1] (lengths uniform on [floor(R L), L]; 1: fixed lengths)",
                   file=where, field="range_ratio", value=rr)
    return out


def _label_mismatch(p) -> str | None:
    """A workload label of the form ``<a>k<b>k`` (InferenceX's 1k1k, 8k1k, 1k8k) states the lengths,
    a x 1024 (or 1000) input and b x 1024 (or 1000) output tokens: where the point's isl or osl
    contradicts it, a note naming the line (the label keys the stated engine settings, the
    lengths price the point; a report notes it rather than refusing, as a test may vary one)."""
    m = re.fullmatch(r"(\d+)k(\d+)k", p.workload.strip().lower())
    if m and not (p.isl in (int(m[1]) * 1024, int(m[1]) * 1000) and p.osl in (int(m[2]) * 1024, int(m[2]) * 1000)):
        return f"line {p.row} ({p.workload}: isl {p.isl}, osl {p.osl})"
    return None


def _attach_ttft(points, ttft) -> int:
    """Give each point its mean_ttft (popped from ``ttft``); how many matched."""
    matched = 0
    for k, p in enumerate(points):
        t = ttft.pop((p.sweep, p.concurrency), None)
        if t is not None:
            points[k] = dataclasses.replace(p, measured_ttft=t[0])
            matched += 1
    return matched


def _anchor_mismatch(points) -> list:
    """Sweeps whose lowest concurrency is not the file's anchor_concurrency."""
    lowest: dict = {}
    for p in points:
        lowest[p.sweep] = min(lowest.get(p.sweep, p.concurrency), p.concurrency)
    return sorted({p.sweep for p in points
                   if p.anchor_concurrency is not None and p.anchor_concurrency != lowest[p.sweep]})


def rank_tp(p: Point, where: str = "") -> int:
    """The tensor-parallel width of each data-parallel rank of a measured deployment. With expert
    parallelism, vLLM's expert-parallel width is rank tp x dp, so the ep column fixes it: ep / dp.
    That reads both naming conventions alike: InferenceX's, whose tp column is the GPU count and
    whose DP-attention recipes launch ``--tensor-parallel-size`` TP / DP (minimax-m2.5 fp4 B200:
    ``--tensor-parallel-size=1 --data-parallel-size=$TP --enable-expert-parallel``,
    serving-reference §5), so tp2-ep2-dp2 is 2 ranks of 1 GPU and tp4-ep4-dp2 2 ranks of 2; and
    the reference scenarios', whose tp is per rank (tp2-ep4-dp2: 2 ranks of 2). Without expert
    parallelism only InferenceX's reading is left (the reference scenarios pair dp > 1 with expert
    parallelism): the tp column counts GPUs, tp / dp per rank, where dp divides it."""
    if p.dp <= 1:
        return int(p.tp)
    if p.ep <= 1:
        return p.tp // p.dp if p.tp % p.dp == 0 else int(p.tp)
    if p.ep % p.dp or p.tp not in (p.ep // p.dp, p.ep):
        refuse(f"tp {p.tp}, ep {p.ep}, dp {p.dp} do not make one layout: vLLM's expert-parallel width is tp x dp "
               "per rank, so ep / dp is each rank's tp, and the tp column is either that or the GPU count (ep)",
               file=where or None, field="ep", value=p.ep)
    return p.ep // p.dp


def gpus_of(p: Point) -> int:
    """The GPUs a measured deployment runs on: dp ranks of ``rank_tp`` GPUs."""
    return rank_tp(p) * int(p.dp)


def scenario_from_columns(p: Point, *, source: str = "columns") -> Scenario:
    """A Scenario for a point whose deployment has no bundled scenario, with the settings the
    bundled vLLM scenarios use: the six cost-model sets, the row's chip, 1 node x 8 GPUs, dp
    ranks of ``rank_tp`` GPUs each, expert parallelism on when ep > 1 (vLLM's expert-parallel
    width is then rank tp x dp = the ep column), quantization from the dtype (fp4 -> nvfp4, fp8
    -> fp8, bf16/int4 -> the checkpoint's own), an fp8 KV cache unless bf16, PIECEWISE graphs,
    max_num_seqs 256, block 16 (64 for glm-5), 8192 batched tokens, max_model_len 32768; an
    engine other than vLLM named as the scheduler (``ENGINE_SCHEDULER``), which scopes fitted sets."""
    file = f"{source} (deployment {p.deployment}, built from the columns)"
    _check_dtype(p, file)
    _check_engine(p, file)
    tp = rank_tp(p, file)
    engine = {"cache_dtype": "auto" if p.dtype == "bf16" else "fp8",
              "block_size": default_block_size(p.model),
              "max_num_batched_tokens": 8192, "max_num_seqs": 256, "max_model_len": 32768,
              "cudagraph_mode": "PIECEWISE", "gpu_memory_utilization": 0.9}
    quant = DTYPE_QUANTIZATION[p.dtype]
    if quant:
        engine["quantization"] = quant
    if ENGINE_SCHEDULER[p.engine] != "vllm":    # the engine a fitted set's entries are scoped by (vLLM unstated)
        engine["scheduler"] = ENGINE_SCHEDULER[p.engine]
    return Scenario(name=p.deployment, model=p.model, hardware=p.hardware, fabric=None, nodes=1,
                    gpus_per_node=8, gpus_per_rack=0, coefficient_sets=DEFAULT_SETS, engine_version="",
                    pool_nodes=1, parallel={"tp": tp, "pp": 1, "dp": p.dp,
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
    (default: the bundled testdata/aisimulate; ``[]``: always build from the columns). A point
    of another engine than vLLM whose file states no engine.scheduler gets its engine column's
    (``ENGINE_SCHEDULER``), as a deployment built from the columns does."""
    dirs = [testdata_root() / "aisimulate"] if scenario_dirs is None else [Path(d) for d in scenario_dirs]
    registry = registry or Registry()
    for d in dirs:
        f = d / f"{p.deployment}.yaml"
        if f.exists():
            dep = load_deployment(f, registry, extra_coefficient_files=extra_coefficient_files)
            _check_engine(p, _display_path(f))
            _check_columns_match(p, dep.scenario, _display_path(f))
            _check_speculation(p, _display_path(f))
            sched = ENGINE_SCHEDULER[p.engine]
            if sched != "vllm" and not (dep.scenario.engine or {}).get("scheduler"):
                # the bundled *-sglang-* files name their engine only in the file name: the point's
                # engine column names it here, as scenario_from_columns does (fitted sets' engine scope)
                eng = {**dep.scenario.engine, "scheduler": sched}
                dep = resolve(dataclasses.replace(dep.scenario, engine=eng), registry,
                              extra_sets=[load_coefficient_set(x) for x in extra_coefficient_files])
            return dep, _display_path(f)
    _check_speculation(p, f"{source} (deployment {p.deployment}, built from the columns)")
    extra = [load_coefficient_set(f) for f in extra_coefficient_files]
    return resolve(scenario_from_columns(p, source=source), registry, extra_sets=extra), "columns"


NO_SPECULATION = ("none", "off", "no", "false", "0")
# the quantizations a row's dtype admits in its scenario file (None: any; "": the checkpoint's own)
DTYPE_SCENARIO_QUANTIZATIONS = {"fp4": ("nvfp4", "mxfp4"), "nvfp4": ("nvfp4",), "mxfp4": ("mxfp4",),
                                "fp8": ("fp8",), "bf16": ("", "bf16"), "int4": None}


def _check_columns_match(p: Point, sc, where: str):
    """A row priced by its deployment's scenario file must describe that deployment: its model,
    chip, data-parallel ranks, each rank's tp (``rank_tp``), expert parallelism and dtype as the
    file states them; a row that contradicts its file is refused, never priced as the file."""
    _check_dtype(p, where)
    par = sc.parallel or {}
    quant = str((sc.engine or {}).get("quantization") or "")
    admitted = DTYPE_SCENARIO_QUANTIZATIONS[p.dtype]
    checks = (("model", p.model, sc.model), ("hardware", p.hardware, sc.hardware),
              ("dp", p.dp, int(par.get("dp", 1) or 1)), ("tp", rank_tp(p, where), int(par.get("tp", 1) or 1)),
              ("ep", p.ep > 1, bool(par.get("enable_expert_parallel"))))
    for field, row, stated in checks:
        if row != stated:
            shown = {"tp": f"{p.tp} (rank tp {row})", "ep": p.ep}.get(field, row)
            said = {"ep": "expert parallelism on" if stated else "expert parallelism off",
                    "tp": f"tp {stated} per rank"}.get(field, stated)
            refuse(f"the row contradicts its scenario file, which states {said}", file=where, field=field,
                   value=shown)
    if admitted is not None and quant not in admitted:
        refuse(f"the row contradicts its scenario file, which states quantization {quant or 'none'}", file=where,
               field="dtype", value=p.dtype)


def _check_dtype(p: Point, where: str):
    """The dtype column must name a weight format the harness maps to a quantization."""
    if p.dtype not in DTYPE_QUANTIZATION:
        refuse(f"unknown dtype (known: {', '.join(DTYPE_QUANTIZATION)})", file=where, field="dtype", value=p.dtype)


def _check_engine(p: Point, where: str):
    """The engine column must name an engine whose scheduler the simulation follows."""
    if p.engine not in ENGINE_SCHEDULER:
        refuse(f"unknown engine (known: {', '.join(ENGINE_SCHEDULER)})", file=where, field="engine", value=p.engine)


def _check_speculation(p: Point, where: str):
    """A point measured with speculative decoding is priced only where the model graph has a
    drafter for its method (``speculation_assumptions``: the recipe's draft count, else the
    graph's own MTP layers; the acceptance an assumption); one it has none for is refused,
    naming the method and what the graph has."""
    if is_speculative(p):
        try:
            speculation_assumptions(p)
        except JaxpriceError as err:
            refuse(err.reason, file=where, field="spec_decode", value=p.spec_decode)


def is_speculative(p: Point) -> bool:
    """Whether the point was measured with speculative decoding (its spec_decode column)."""
    return p.spec_decode not in NO_SPECULATION


# ----------------------------------------------------------------------------- speculative decoding

# spec_decode values naming the model's own multi-token-prediction (MTP) layers as the drafter;
# any other value must be the graph's speculator method itself (e.g. deepseek_mtp)
MTP_METHODS = ("mtp", "nextn", "eagle-mtp")
IX_FSL = "SemiAnalysisAI/InferenceX benchmarks/single_node/fixed_seq_len"      # IX's recipe folder
SGLANG_EAGLE = ("SGLang --speculative-algorithm EAGLE (the model's MTP layer as the draft model), "
                "--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k1}: "
                "{k} drafted tokens per step, {k1} verified per decode row")
TRT_MTP = ("TensorRT-LLM speculative_config decoding_type MTP, num_nextn_predict_layers $MTP: 3, or 1 with "
           "DP attention (enable_attention_dp: the dp column > 1)")
MINIMAX_M3_EAGLE3 = (IX_FSL + "/{script} (SemiAnalysisAI/InferenceX, read 2026-12-07): vLLM --speculative-config "
                     "{{method: eagle3, model: Inferact/MiniMax-M3-EAGLE3, num_speculative_tokens: 3}} (\"use 3 "
                     "speculative tokens for all configs\"; H100 and B300 runs assumed alike); the EAGLE3 head priced "
                     "as the model's own MTP module, COVERAGE LIMIT [eagle3-head]")
VLLM_MTP = "vLLM --speculative-config {method: mtp, num_speculative_tokens: 2} (\"2 for all configs for now\")"
# The draft count k (num_speculative_tokens: tokens drafted per decode step; 1 + k verified per
# decode row) of InferenceX's MTP recipes, per (model, chips, dtype, scheduler), as the scripts set
# it (read, not fitted). "dp_attention": the count where the recipe runs DP attention (the dp
# column > 1); "long_prompt_high_c": the count where isl >= 4096 and C >= 128. deepseek-v3 is the
# graph DeepSeek-R1 (dsr1) runs on. COVERAGE LIMIT [spec-recipes]: only these scripts were read
# (NVIDIA, fixed_seq_len); the others, e.g. SGLang's and TensorRT-LLM's DeepSeek-V4-Pro MTP
# recipes on B300/H200, take the graph's MTP layer count, said so in each point's assumptions.
IX_SPEC_RECIPES = {
    ("deepseek-v3", ("b200",), "fp4", "trtllm"): dict(
        num_spec_tokens=3, dp_attention=1,
        source=f"{IX_FSL}/dsr1_fp4_b200_trt_mtp.sh@8eec0d4 (also benchmarks/dsr1_fp4_b200_trt_mtp.sh@13dd0c2): "
               + TRT_MTP),
    ("deepseek-v3", ("b200",), "fp8", "trtllm"): dict(
        num_spec_tokens=3, dp_attention=1,
        source=f"{IX_FSL}/dsr1_fp8_b200_trt_mtp.sh@8eec0d4: " + TRT_MTP),
    ("deepseek-v3", ("h200",), "fp8", "trtllm"): dict(
        num_spec_tokens=3, dp_attention=1,
        source=f"{IX_FSL}/dsr1_fp8_h200_trt_mtp.sh@8eec0d4: " + TRT_MTP),
    ("deepseek-v3", ("b200",), "fp4", "sglang"): dict(
        num_spec_tokens=2,
        source=f"{IX_FSL}/dsr1_fp4_b200_mtp.sh@25cbe71 (with or without DP attention): "
               + SGLANG_EAGLE.format(k=2, k1=3)),
    ("deepseek-v3", ("b200",), "fp8", "sglang"): dict(
        num_spec_tokens=2, source=f"{IX_FSL}/dsr1_fp8_b200_mtp.sh@8eec0d4: " + SGLANG_EAGLE.format(k=2, k1=3)),
    ("deepseek-v3", ("b300",), "fp8", "sglang"): dict(
        num_spec_tokens=2, source=f"{IX_FSL}/dsr1_fp8_b300_mtp.sh@8eec0d4 (the B200 recipe as is): "
                                  + SGLANG_EAGLE.format(k=2, k1=3)),
    ("deepseek-v3", ("h200",), "fp8", "sglang"): dict(
        num_spec_tokens=2, source=f"{IX_FSL}/dsr1_fp8_h200_mtp.sh@bdf931e: " + SGLANG_EAGLE.format(k=2, k1=3)),
    ("glm-5", ("b200",), "fp4", "sglang"): dict(
        num_spec_tokens=3, source=f"{IX_FSL}/glm5_fp4_b200_mtp.sh@b14879a: " + SGLANG_EAGLE.format(k=3, k1=4)),
    ("glm-5", ("b200",), "fp8", "sglang"): dict(
        num_spec_tokens=3, source=f"{IX_FSL}/glm5_fp8_b200_mtp.sh@8eec0d4: " + SGLANG_EAGLE.format(k=3, k1=4)),
    ("glm-5", ("b300",), "fp8", "sglang"): dict(
        num_spec_tokens=3, source=f"{IX_FSL}/glm5_fp8_b300_mtp.sh@62b7be8 (the B200 recipe as is): "
                                  + SGLANG_EAGLE.format(k=3, k1=4)),
    ("glm-5", ("h200",), "fp8", "sglang"): dict(
        num_spec_tokens=3, source=f"{IX_FSL}/glm5_fp8_h200_mtp.sh@f89cdfe: " + SGLANG_EAGLE.format(k=3, k1=4)),
    ("deepseek-v4-pro", ("b200",), "fp4", "vllm"): dict(
        num_spec_tokens=2, source=f"{IX_FSL}/dsv4_fp4_b200_vllm_mtp.sh@8eec0d4: " + VLLM_MTP),
    ("deepseek-v4-pro", ("b300",), "fp4", "vllm"): dict(
        num_spec_tokens=2, source=f"{IX_FSL}/dsv4_fp4_b300_vllm_mtp.sh@886c43a: " + VLLM_MTP),
    ("deepseek-v4-pro", ("h200",), "fp8", "vllm"): dict(
        num_spec_tokens=2, source=f"{IX_FSL}/dsv4_fp8_h200_mtp.sh@8eec0d4: " + VLLM_MTP),
    ("deepseek-v4-pro", ("b200",), "fp4", "trtllm"): dict(
        num_spec_tokens=3, long_prompt_high_c=2,
        source=f"{IX_FSL}/dsv4_fp4_b200_trt_mtp.sh@0f9b6c5: TensorRT-LLM speculative_config decoding_type MTP, "
               "num_nextn_predict_layers 3, or 2 where ISL >= 4096 and CONC >= 128"),
    # MiniMax-M3's "mtp" runs draft with a separate EAGLE3 head, 3 tokens, on every chip.
    # COVERAGE LIMIT [eagle3-head]: the head (Inferact/MiniMax-M3-EAGLE3, one small decoder layer) is
    # not in the model graph; its k passes are priced as the graph's own MTP module (a heavier
    # drafter: the drafts' cost is overstated, the count and the acceptance are what move TPOT most)
    ("minimax-m3", ("b200", "b300", "h100", "h200"), "fp8", "vllm"): dict(
        num_spec_tokens=3, source=MINIMAX_M3_EAGLE3.format(script="minimaxm3_fp8_b200_mtp.sh and "
                                                                   "minimaxm3_fp8_h200_mtp.sh")),
    ("minimax-m3", ("b200", "b300"), "fp4", "vllm"): dict(
        num_spec_tokens=3, source=MINIMAX_M3_EAGLE3.format(script="minimaxm3_fp4_b200_mtp.sh (\"same shape as "
                                                                   "minimaxm3_fp8_b200_mtp.sh\")")),
}
SPEC_FIELDS = ("num_speculative_tokens", "acceptance")     # the --settings columns of a speculating run
ACCEPTANCE_SOURCE = ("ASSUMED, not measured: {law} (serve.default_acceptance, DEFAULT_ACCEPTANCE_PER_DRAFT "
                     "= {p}, the serving layer's stated default; mean tokens emitted per decode row and step; "
                     "override with --acceptance or an acceptance column in --settings)")


def _graph_speculator(p: Point):
    """(method, num_spec_tokens) of the point's model graph's speculator, or None (no drafter),
    read from the registry it is priced with (``Point.registry``, else the bundled one); a
    JaxpriceError where the model is not in that registry."""
    return _speculator_of(p.registry, p.model)


@functools.lru_cache(maxsize=64)
def _speculator_of(registry, model: str):
    spec = (registry or Registry()).model(model, field="model").speculator
    return (str(spec["method"]), int(spec.get("num_spec_tokens", 1))) if spec else None


def spec_recipe_for(p: Point):
    """(draft count, source) of the point's InferenceX MTP recipe (``IX_SPEC_RECIPES``), or None."""
    scheduler = ENGINE_SCHEDULER.get(p.engine)
    for (model, chips, dtype, sched), rec in IX_SPEC_RECIPES.items():
        if p.model == model and p.hardware in chips and p.dtype == dtype and scheduler == sched:
            k, why = rec["num_spec_tokens"], ""
            if "dp_attention" in rec:
                k, why = (rec["dp_attention"], f" [dp {p.dp} > 1: DP attention, {rec['dp_attention']}]") \
                    if p.dp > 1 else (k, f" [dp {p.dp}: no DP attention, {k}]")
            if "long_prompt_high_c" in rec:
                long = p.isl >= 4096 and p.concurrency >= 128
                k = rec["long_prompt_high_c"] if long else k
                why = f" [isl {p.isl}, C={p.concurrency}: {k}]"
            return int(k), rec["source"] + why
    return None


def speculation_assumptions(p: Point) -> dict:
    """The speculative decoding a simulated run of point ``p`` uses, each (value, source):
    ``spec_method`` (the model graph's drafter), ``num_spec_tokens`` (k, tokens drafted per decode
    step: the point's --settings column num_speculative_tokens, else its InferenceX recipe's,
    ``IX_SPEC_RECIPES``, else the graph's own speculator, its MTP layer count) and ``acceptance``
    (mean tokens emitted per decode row and step, in [1, 1 + k]: --acceptance, else the --settings
    column, else the serving layer's stated default ``serve.default_acceptance(k)``, an
    assumption, not a measurement). Empty for a point measured without speculation. Refuses (JaxpriceError) a
    method the model graph has no drafter for."""
    if not is_speculative(p):
        return {}
    spec = _graph_speculator(p)
    method = p.spec_decode
    if spec is None:
        refuse(f"measured with speculative decoding ({method}), but the {p.model} graph has no drafter (no MTP "
               "layers or draft model in it): nothing to price the drafts with", field="spec_decode", value=method)
    gmethod, glayers = spec
    if not (method == gmethod.lower() or (method in MTP_METHODS and gmethod.lower().endswith("mtp"))):
        refuse(f"no drafter for this method in the {p.model} graph (its speculator: {gmethod}, the model's own MTP "
               f"layers; spec_decode 'mtp' names it): a separate draft model is not part of the graph",
               field="spec_decode", value=method)
    out = {"spec_method": (gmethod, f"the {p.model} graph's speculator (spec_decode '{method}')")}
    stated = stated_settings(p)
    rec = spec_recipe_for(p)
    if "num_speculative_tokens" in stated:
        out["num_spec_tokens"] = (int(stated["num_speculative_tokens"]), _stated_where(p))
    elif rec is not None:
        out["num_spec_tokens"] = rec
    else:
        out["num_spec_tokens"] = (glayers, f"no InferenceX MTP recipe read for {p.model} on {p.hardware} ({p.dtype}, "
                                           f"{p.engine}): the graph's own speculator ({glayers} MTP layer(s), "
                                           "one drafted token each)")
    k = out["num_spec_tokens"][0]
    from .serve import ACCEPTANCE_LAW, DEFAULT_ACCEPTANCE_PER_DRAFT as per, default_acceptance
    if p.acceptance is not None:       # one value for every point: at most 1 + k for each (as size's --acceptance)
        a = min(float(p.acceptance), 1.0 + k)
        out["acceptance"] = (a, "--acceptance (ASSUMED, not measured: the value given"
                                + (")" if a == float(p.acceptance) else f", capped at 1 + k = {1 + k:g} for this point)"))
    elif "acceptance" in stated:
        out["acceptance"] = (float(stated["acceptance"]), _stated_where(p))
    else:
        out["acceptance"] = (default_acceptance(k), ACCEPTANCE_SOURCE.format(p=per, law=ACCEPTANCE_LAW.format(a=per)))
    return out


def _stated_where(p: Point) -> str:
    return STATED_SOURCE if p.stated is None else "stated by the run (the --settings file)"


def check_speculation_inputs(points, *, field="acceptance", settings=None) -> None:
    """Refuse, before anything is priced, an acceptance outside [1, 1 + k] for a speculating
    point (k its draft count): its --settings row's (refused naming the ``settings`` file and
    row); the --acceptance value (``Point.acceptance``, refused as ``field``) where it is below 1
    or above 1 + k for every speculating point (where some point's k admits it, it is capped at
    1 + k for the others, as size's --acceptance is): naming the flag or file and column, the
    value, the point's line and k. A point whose model has no drafter is left to be refused
    with its reason."""
    found = []
    for p in points:
        if not is_speculative(p):
            continue
        try:
            found.append((p, speculation_assumptions(p)))
        except JaxpriceError:
            continue
    flag = [(p, a["num_spec_tokens"]) for p, a in found if p.acceptance is not None]
    if flag:
        given = float(flag[0][0].acceptance)
        p, k = max(flag, key=lambda pk: pk[1][0])                 # the largest k bounds the flag
        if not 1.0 <= given <= k[0] + 1:
            _refuse_acceptance(p, k, given, {"field": field})
    for p, a in found:
        k, acc = a["num_spec_tokens"], a["acceptance"][0]
        if p.acceptance is None and not 1.0 <= acc <= k[0] + 1:
            line = stated_settings(p).get("acceptance_line")
            _refuse_acceptance(p, k, acc, {"file": f"{settings}:{line}" if settings and line else settings,
                                           "field": "acceptance"})


def _refuse_acceptance(p: Point, k: tuple, acc: float, where: dict) -> None:
    src = k[1].split(":")[0]
    refuse(f"must be in [1, 1 + num_speculative_tokens = {k[0] + 1}] for the point on line {p.row} "
           f"({p.deployment}, C={p.concurrency}): its draft count k = {k[0]}, from {src}",
           value=acc, has_value=True, **where)


def _speculation_note(points, info, batch_rule) -> None:
    """A note (``info['notes']``) naming how many points were measured with speculative decoding
    and, under 'simulate', that their acceptance is an assumption, not a measurement; and how
    many points measured without it have --settings rows stating a draft count or acceptance
    (not used: nothing is drafted for them)."""
    plain = [p for p in points if not is_speculative(p) and any(k in stated_settings(p) for k in SPEC_FIELDS)]
    if plain:
        info.setdefault("notes", []).append(
            f"{len(plain)} point(s) measured without speculative decoding (spec_decode {plain[0].spec_decode!r}) have "
            f"--settings rows stating {' or '.join(SPEC_FIELDS)}: not used (e.g. line {plain[0].row}, "
            f"{plain[0].deployment}, C={plain[0].concurrency})")
    spec = [p for p in points if is_speculative(p)]
    if not spec:
        return
    if batch_rule != "simulate":
        text = (f"{len(spec)} point(s) measured with speculative decoding, refused by the static rule "
                f"'{batch_rule}' (it prices 1-token decode rows): batch rule 'simulate' prices them")
    else:
        how = ("--acceptance " + f"{spec[0].acceptance:g}" if spec[0].acceptance is not None else
               "the --settings rows' acceptance where given, else serve.default_acceptance(k): 1.7, 2.19, 2.53 for "
               "k = 1, 2, 3")
        methods = ", ".join(sorted({p.spec_decode for p in spec}))
        text = (f"{len(spec)} point(s) measured with speculative decoding ({methods}): each priced (where its "
                "model graph has a drafter for the method) with 1 + k tokens per decode row and the drafter's passes, "
                "k the --settings column num_speculative_tokens, else the InferenceX recipe's draft count, else the "
                "graph's MTP layers; their "
                f"acceptance (mean tokens per decode row and step) is ASSUMED, not measured: {how}. TPOT scales "
                "about as 1 / acceptance, so their errors say as much about that assumption as about the kernel")
    info.setdefault("notes", []).append(text)


def check_acceptance(value, field="acceptance"):
    """An acceptance argument: None, or a finite number >= 1 (mean tokens emitted per decode row
    and step; its upper bound 1 + k is checked per point, ``check_speculation_inputs``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(value)) or float(value) < 1:
        refuse("must be a number >= 1 (mean tokens emitted per decode row and step, at most 1 + the draft "
               "count)", field=field, value=shown(value), has_value=True)
    return float(value)


# ----------------------------------------------------------------------------- engine assumptions

IX = "SemiAnalysisAI/InferenceX"
REF5 = "shared/spec/serving-reference.md §5"
# COVERAGE LIMIT [prefill-schedule-interval]: a recipe's --prefill-schedule-interval (later kimi-k2.5
# fp4 and DeepSeek-V4-Pro recipes with DP attention) is not followed: prefills are considered every step.
# The engine flags of InferenceX's vLLM recipe per (model, chip, dtype), as published (read in the
# recipes, not fitted; see engine_assumptions; SGLang's and TensorRT-LLM's in ix_recipes.py). Values: "C" = the client concurrency; "2*isl";
# None = not set by the recipe (vLLM's default applies). Each entry names its source.
IX_RECIPES = {
    ("gpt-oss-120b", ("h100", "h200"), "fp4"): dict(
        max_num_seqs="C", max_num_batched_tokens=8192, gpu_memory_utilization=0.9, cache_dtype="auto",
        block_size=None, num_prompts="10*C",
        source=f"{REF5}: gptoss fp4 H200 / H100 (IX-may, HEAD): config max-num-batched-tokens 8192, "
               "--gpu-memory-utilization 0.9 --max-num-seqs $CONC, no kv-cache-dtype flag"),
    ("gpt-oss-120b", ("b200", "b300"), "fp4"): dict(
        max_num_seqs=512, max_num_batched_tokens=8192, gpu_memory_utilization=0.9, cache_dtype="fp8",
        block_size=None, num_prompts="10*C",
        source=f"{REF5}: gptoss fp4 B200 (HEAD); {IX} benchmarks/single_node/fixed_seq_len/gptoss_fp4_b200.sh"
               "@8eec0d4: kv-cache-dtype fp8, max-num-batched-tokens 8192, --max-num-seqs 512, gmu 0.9"),
    ("kimi-k2.5", ("h200", "b200", "b300"), "int4"): dict(
        max_num_seqs="C", max_num_batched_tokens=None, gpu_memory_utilization=0.95, cache_dtype="auto",
        block_size=None, num_prompts="10*C",
        source=f"{REF5}: kimi-k2.5 int4 H200 (IX-may); {IX} benchmarks/single_node/fixed_seq_len/"
               "kimik2.5_int4_{h200,b200,b300}.sh@8eec0d4: gmu 0.95, --max-num-seqs $CONC, default batched "
               "tokens, no kv-cache-dtype flag"),
    ("kimi-k2.5", ("b200", "b300"), "fp4"): dict(
        max_num_seqs="C", max_num_batched_tokens="2*isl", gpu_memory_utilization=0.9, cache_dtype="fp8",
        block_size=None, num_prompts="10*C",
        source=f"{REF5}: kimi-k2.5 fp4 B200 (IX-may: gmu 0.90, --max-num-seqs $CONC, --max-num-batched-tokens "
               f"2*ISL); {IX} benchmarks/single_node/fixed_seq_len/kimik2.5_fp4_b300.sh@3274c53 (the B200 recipe "
               "as is): kv-cache-dtype fp8"),
    ("minimax-m2.5", ("h200",), "fp8"): dict(
        max_num_seqs=None, max_num_batched_tokens=None, gpu_memory_utilization=0.95, cache_dtype="auto",
        block_size=None, num_prompts="10*C",
        source=f"{REF5}: minimax-m2.5 fp8 H200 (IX-may): gmu 0.95, no prefix caching, no max-num-seqs, "
               "batched-token or kv-cache-dtype flag (HEAD later adds kv fp8, 512 seqs, 16384-32768 tokens)",
        variants=(dict(when=dict(max_num_seqs=512, max_num_batched_tokens=32768), set=dict(cache_dtype="fp8"),
                       source=f"{REF5}: minimax-m2.5 fp8 H200, HEAD: kv-cache-dtype fp8 with MAX_NUM_SEQS 512 and "
                              "MAX_NUM_BATCHED_TOKENS 32768, the flags this run states (in sample: read after its "
                              "TTFT error was seen)"),)),
    ("minimax-m2.5", ("h100",), "fp8"): dict(
        max_num_seqs=256, max_num_batched_tokens=None, gpu_memory_utilization=0.9, cache_dtype="auto",
        block_size=None, num_prompts="10*C",
        source=f"{IX} benchmarks/single_node/minimaxm2.5_fp8_h100.sh@34bc7c4: gmu 0.90, --max-num-seqs 256, "
               "PIECEWISE graphs, no batched-token or kv-cache-dtype flag"),
    ("minimax-m2.5", ("b200",), "fp8"): dict(
        max_num_seqs=None, max_num_batched_tokens="2*isl", gpu_memory_utilization=0.9, cache_dtype="fp8",
        block_size=32, num_prompts="10*C",
        source=f"{IX} benchmarks/single_node/fixed_seq_len/minimaxm2.5_fp8_b200.sh@8eec0d4: gmu 0.90, block 32, "
               "kv fp8, --max-num-batched-tokens 2*ISL, no max-num-seqs (an earlier version, @07e171a, had gmu "
               "0.95 and the default budget)",
        variants=(dict(when=dict(gpu_memory_utilization=0.95), set=dict(max_num_batched_tokens=None,
                                                                       cache_dtype="auto"),
                       source=f"{IX} benchmarks/single_node/minimaxm2.5_fp8_b200.sh@07e171a, the version whose gmu "
                              "0.95 this run states: block 32, no kv-cache-dtype or batched-token flag"),)),
    ("minimax-m2.5", ("b300",), "fp8"): dict(
        max_num_seqs=None, max_num_batched_tokens="2*isl", gpu_memory_utilization=0.9, cache_dtype="fp8",
        block_size=32, num_prompts="10*C",
        source=f"{IX} benchmarks/single_node/minimaxm2.5_fp8_b300.sh@5632483 (the B200 recipe as is): gmu 0.90, "
               "block 32, kv fp8, 2*ISL batched tokens; prompts 10 x C: the script as first added (PR #1054, "
               "2026-04-17, before the measured b300 runs; its text before PR #1106 as stored in the fork "
               "lishuoshuo-amd/InferenceX@9ea1e1c) and at HEAD (fixed_seq_len/minimaxm2.5_fp8_b300.sh@8eec0d4) "
               "passes --num-prompts $((CONC * 10)); only the stored @5632483 passes $CONC (re-read after the "
               "b300 TTFT errors were seen)"),
    ("minimax-m2.5", ("b200",), "fp4"): dict(
        max_num_seqs=None, max_num_batched_tokens="2*isl", gpu_memory_utilization=0.9, cache_dtype="fp8",
        block_size=None, num_prompts="10*C",
        source=f"{REF5}: minimax-m2.5 fp4 B200 (IX-may): gmu 0.90, --max-num-batched-tokens 2*ISL, no prefix "
               f"caching; kv fp8 from {IX} benchmarks/single_node/minimaxm2.5_fp4_b300.sh@5632483 (the B200 "
               "recipe as is)"),
    ("minimax-m2.5", ("b300",), "fp4"): dict(
        max_num_seqs=None, max_num_batched_tokens="2*isl", gpu_memory_utilization=0.9, cache_dtype="fp8",
        block_size=None, num_prompts="10*C",
        source=f"{IX} benchmarks/single_node/minimaxm2.5_fp4_b300.sh@5632483 (the B200 recipe as is): gmu 0.90, "
               "kv fp8, 2*ISL batched tokens; prompts 10 x C: the script @5d2e1d4, at HEAD "
               "(fixed_seq_len/minimaxm2.5_fp4_b300.sh@8eec0d4) and as forked before (mpashkovskii/InferenceX"
               "@01d209c) passes --num-prompts $((CONC * 10)); only the stored @5632483 passes $CONC (re-read "
               "after the b300 TTFT errors were seen)"),
    # DeepSeek-V4-Pro and MiniMax-M3 (no dev-set runs; their budgets and block sizes are stated by
    # every run in the settings table; what these add is mainly the KV dtype and the graph mode)
    ("deepseek-v4-pro", ("b200",), "fp4"): dict(
        max_num_seqs=None, max_num_batched_tokens=None, gpu_memory_utilization=0.9, cache_dtype="fp8",
        block_size=256, num_prompts="10*C", cudagraph_mode="FULL_AND_PIECEWISE",
        source=f"{IX} benchmarks/single_node/fixed_seq_len/dsv4_fp4_b200_vllm.sh@045984b: kv fp8, block 256, "
               "FULL_AND_PIECEWISE graphs, no gmu or max-num-seqs flag, batched tokens 8192 at 8k prompts and "
               "C <= 128 else 2048; with DP attention EPLB and --prefill-schedule-interval 4"),
    ("deepseek-v4-pro", ("b300",), "fp4"): dict(
        max_num_seqs=None, max_num_batched_tokens=None, gpu_memory_utilization=0.9, cache_dtype="fp8",
        block_size=256, num_prompts="10*C", cudagraph_mode="FULL_AND_PIECEWISE",
        source=f"{IX} benchmarks/single_node/fixed_seq_len/dsv4_fp4_b300_vllm.sh@2a3fa86: kv fp8, block 256, "
               "FULL_AND_PIECEWISE graphs, no gmu or max-num-seqs flag, batched tokens 2048 with DP attention "
               "else 2 x ISL"),
    ("deepseek-v4-pro", ("h200",), "fp8"): dict(
        max_num_seqs=512, max_num_batched_tokens=512, gpu_memory_utilization=0.95, cache_dtype="fp8",
        block_size=256, num_prompts="10*C", cudagraph_mode="FULL_DECODE_ONLY",
        source=f"{IX} benchmarks/single_node/fixed_seq_len/dsv4_fp8_h200.sh@8eec0d4: kv fp8, block 256, gmu "
               "0.95, --max-num-seqs 512, --max-num-batched-tokens 512, FULL_DECODE_ONLY graphs (compilation "
               "mode 0)"),
    ("minimax-m3", ("b300",), "fp4"): dict(
        max_num_seqs=None, max_num_batched_tokens="2*isl", gpu_memory_utilization=0.95, cache_dtype="fp8",
        block_size=128, num_prompts="10*C",
        source=f"{IX} benchmarks/single_node/fixed_seq_len/minimaxm3_fp4_b300.sh@023b06c: kv fp8, block 128, "
               "gmu 0.95, 2 x ISL batched tokens, no cudagraph or max-num-seqs flag"),
}
# the engine column -> the scheduler the simulation follows (serve.SCHEDULERS); the step is priced
# alike for every engine, as the reference scenarios price their sglang and trt deployments
ENGINE_SCHEDULER = {"vllm": "vllm", "sglang": "sglang", "trt": "trtllm", "trtllm": "trtllm",
                    "tensorrt-llm": "trtllm", "tensorrt_llm": "trtllm"}
VLLM_DEFAULT_MAX_NUM_SEQS = 1024          # serving-reference §1.1: OpenAI server, GPU >= 70 GiB, not A100
VLLM_DEFAULT_BATCHED_TOKENS = 8192
VLLM_DEFAULT_BLOCK_SIZE = 16
# vLLM v1's default CUDA-graph mode: full graphs for uniform decode steps, piecewise for the rest.
# None of the recipes behind the measured vLLM runs sets one, so their engines ran it; the bundled
# scenario files of the same names (AISimulate's deployments) state PIECEWISE, so the simulate rule
# replaces it, as it replaces their KV cache dtype, gmu and block size
VLLM_DEFAULT_CUDAGRAPH_MODE = "FULL_AND_PIECEWISE"
VLLM_CUDAGRAPH_SOURCE = ("vLLM's default cudagraph_mode on v1 with piecewise compilation (vllm-project/vllm "
                         "docs/design/cuda_graphs.md@0045689; reference-kernel.md §5 reads an unstated mode "
                         "alike); not set by the recipe")
DSA_BLOCK_SIZE = 64          # sparse MLA (DSA) runs on 64-token blocks (the bundled glm-5 scenarios say so)
BLOCK_SIZE_SOURCE = {
    VLLM_DEFAULT_BLOCK_SIZE: "vLLM's CUDA default (not set by the recipe; serving-reference §1.6, §7.3 open; a "
                             "latent (MLA) attention runs its backend's own block: resolve.vllm_mla_block)",
    DSA_BLOCK_SIZE: "64: sparse MLA (DSA) needs 64-token blocks (not set by the recipe; the bundled glm-5 "
                    "scenarios' own comment)"}
RANGE_RATIO = 0.8
# The engine flags each measured run passed, as the InferenceX database states them per scenario
# and concurrency (testdata/measured/inferencex_settings.csv; its README gives the provenance).
STATED_SETTINGS_FILE = "inferencex_settings.csv"
STATED_SOURCE = ("stated by the run (InferenceX database, as transcribed in inference-sim/blis-latency-kernel "
                 "testdata/measurements/inferencex_direct_settings.json@a8e879e; "
                 "testdata/measured/inferencex_settings.csv)")
STATED_FIELDS = ("block_size", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                 "cache_dtype", "cudagraph_mode")
# the stated flags that are names, not numbers: the KV cache dtype as a scenario's engine.cache_dtype
# spells it (resolve.CACHE_DTYPES: auto, fp8, bfloat16, ...) and vLLM's cudagraph_mode
# (resolve.GRAPH_MODES); the bundled table has neither column, a --settings file may
STATED_NAME_FIELDS = ("cache_dtype", "cudagraph_mode")
# settings chosen after looking at the development set's errors (reported as in sample), by
# assumption name; none so far (a recipe variant read after an error says so in its own source)
IN_SAMPLE_CHOICES: dict = {}


SETTINGS_KEY_COLUMNS = ("scenario", "label", "concurrency")
SETTINGS_RUN_COLUMNS = ("framework", "gpu", "source_run_date", "source_config_id")


@functools.lru_cache(maxsize=4)
def _stated_table(path: str) -> dict:
    """{(scenario, workload label, concurrency): row} of a stated-settings CSV (the layout of
    testdata/measured/inferencex_settings.csv: the key columns, any of the run columns and of
    ``STATED_FIELDS`` (cache_dtype and cudagraph_mode optional, absent from the bundled table)
    and enable_prefix_caching; an empty field is unrecorded). A malformed file
    is refused naming file:line, the column and the value."""
    try:
        fh = open(path, newline="", encoding="utf-8-sig")       # a byte-order mark is not part of a column name
    except (FileNotFoundError, IsADirectoryError, PermissionError) as err:
        refuse(f"cannot read the settings file ({type(err).__name__})", file=path)
    try:
        with fh:
            return _stated_rows(fh, path)
    except UnicodeDecodeError:
        refuse("is not a text CSV file (not UTF-8)", file=path)


def _stated_rows(fh, path) -> dict:
    table = {}
    reader = csv.DictReader(fh)
    cols = reader.fieldnames or []
    missing = [c for c in SETTINGS_KEY_COLUMNS if c not in cols]
    if missing:
        refuse(f"missing column(s) {', '.join(missing)} (the layout of testdata/measured/inferencex_settings.csv)",
               file=f"{path}:1", field=missing[0])
    twice = [c for c in cols if cols.count(c) > 1]
    if twice:
        refuse("column appears twice in the header (which one holds the data?)", file=f"{path}:1",
               field="header", value=twice[0])
    if not any(c in cols for c in STATED_FIELDS + SPEC_FIELDS):
        refuse(f"no settings column (any of {', '.join(STATED_FIELDS + SPEC_FIELDS)})", file=f"{path}:1")
    for i, r in enumerate(reader, start=2):
        where = f"{path}:{i}"
        if None in r or any(r.get(c) is None for c in cols):
            refuse(f"row has a different number of fields than the header ({len(cols)})", file=where)
        row = {k: (v or "").strip() for k, v in r.items()}
        for k in STATED_FIELDS + SPEC_FIELDS:
            if row.get(k):
                _stated_value(k, row[k], where)
        if row.get("acceptance") and row.get("num_speculative_tokens") and \
                float(row["acceptance"]) > int(float(row["num_speculative_tokens"])) + 1:
            refuse(f"more than 1 + num_speculative_tokens = {int(float(row['num_speculative_tokens'])) + 1} (a decode "
                   "row emits at most its drafted tokens and one more)", file=where, field="acceptance",
                   value=row["acceptance"])
        if row.get("enable_prefix_caching") not in (None, "", "true", "false"):
            refuse("expected true, false or empty", file=where, field="enable_prefix_caching",
                   value=row["enable_prefix_caching"])
        key = (row["scenario"], row["label"], _int(row["concurrency"], where=where, field="concurrency",
                                                     minimum=1))
        if key in table:
            refuse(f"a second row of scenario {key[0]} ({key[1]}) at this concurrency", file=where,
                   field="concurrency", value=row["concurrency"])
        table[key] = {**row, "_line": i}
    return table


def _stated_value(k, text, where):
    """A stated flag's value: gpu_memory_utilization a fraction in (0, 1], acceptance a finite
    number >= 1 (mean tokens emitted per decode row and step), cache_dtype one of
    resolve.CACHE_DTYPES, cudagraph_mode one of resolve.GRAPH_MODES (any case; upper-cased), the
    others integers >= 1."""
    if k in STATED_NAME_FIELDS:
        from .resolve import CACHE_DTYPES, GRAPH_MODES
        known = [c for c in CACHE_DTYPES if c] if k == "cache_dtype" else list(GRAPH_MODES)
        v = text.strip() if k == "cache_dtype" else text.strip().upper()
        if v not in known:
            refuse(f"not a {'vLLM KV cache dtype' if k == 'cache_dtype' else 'cudagraph mode'} "
                   f"(known: {', '.join(known)})", file=where, field=k, value=text)
        return v
    if k == "acceptance":
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v >= 1):
            refuse("expected a finite number >= 1 (mean tokens emitted per decode row and step, at most 1 + "
                   "num_speculative_tokens)", file=where, field=k, value=text)
        return v
    if k == "gpu_memory_utilization":
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not 0 < v <= 1:
            refuse("expected a fraction in (0, 1]", file=where, field=k, value=text)
        return v
    return _int(text, where=where, field=k, minimum=1)


def read_settings(points, path) -> list:
    """The points, each carrying the flags its run states in the settings CSV ``path``
    (``Point.stated``; a point the file has no row for states none): for ``--settings``."""
    check_settings_path(path)
    table = _stated_table(str(path))
    return [dataclasses.replace(p, stated=tuple(sorted(_stated_of(p, table).items()))) for p in points]


def check_settings_path(path, field="settings") -> None:
    """A settings argument of the library is a CSV path (a str or a path): a number or a dict
    was read as a file name and refused as a missing file named '5'."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bool):
        refuse("expected the path of a settings CSV (a str or a path; the layout of "
               "testdata/measured/inferencex_settings.csv)", field=field, value=shown(path), has_value=True)
    if not str(path).strip():
        refuse("an empty settings file name", field=field, value=str(path), has_value=True)


def stated_settings(p: Point) -> dict:
    """The engine flags the point's own run passed (``Point.stated`` where a ``--settings`` file
    gave them, ``read_settings``), else where the bundled table states them:
    {field: value} for the ``STATED_FIELDS`` it gives (a null there is a flag the database
    does not record, not one the run left unset: the recipe's value stands for it) and
    ``enable_prefix_caching`` when recorded. Empty when the table has no row for the point's
    scenario, workload and concurrency, or when the row's run (config id, run date, chip)
    differs from the point's: a different run with the same scenario name."""
    if p.stated is not None:
        return dict(p.stated)
    return _stated_of(p, _stated_table(str(testdata_root() / "measured" / STATED_SETTINGS_FILE)))


def _stated_of(p: Point, table: dict) -> dict:
    row = table.get((p.scenario, p.workload, int(p.concurrency)))
    if row is None:
        return {}
    for col, mine in zip(SETTINGS_RUN_COLUMNS, (p.engine, p.hardware, p.run_date, p.config_id)):
        if row.get(col) and mine and row[col] != mine:
            return {}
    out = {k: _stated_value(k, row[k], "") for k in STATED_FIELDS + SPEC_FIELDS if row.get(k)}
    if "acceptance" in out:              # its line, for a refusal of the value against the point's draft count
        out["acceptance_line"] = row.get("_line")
    if row.get("enable_prefix_caching"):
        out["enable_prefix_caching"] = row["enable_prefix_caching"] == "true"
    return out


def default_block_size(model: str) -> int:
    """vLLM's CUDA default block size, 64 for the sparse-MLA (DSA) models, which need it."""
    return DSA_BLOCK_SIZE if model.startswith("glm-5") else VLLM_DEFAULT_BLOCK_SIZE


def recipe_for(p: Point):
    """(recipe dict, key) of the point's (model, chip, dtype), or (None, None): a vLLM point's
    from ``IX_RECIPES`` first, else any engine's from ``ix_recipes.IX_ENGINE_RECIPES`` (SGLang,
    TensorRT-LLM, and vLLM for the models IX_RECIPES lacks), its rules resolved for the point."""
    for (model, chips, dtype), rec in IX_RECIPES.items():
        if p.engine == "vllm" and p.model == model and p.hardware in chips and p.dtype == dtype:
            return rec, (model, chips, dtype)
    from .ix_recipes import engine_recipe
    return engine_recipe(p)


def recipe_variant(rec, stated: dict):
    """The recipe as the run used it: where the flags the run states (``stated_settings``) are
    those of a known version of the recipe (its ``variants``: ``when`` = the stated flags that
    identify it), that version's other flags (``set``) replace the recipe's, with its source."""
    for v in (rec or {}).get("variants", ()):
        if all(stated.get(k) == val for k, val in v["when"].items()):
            return {**rec, **v["set"], "source": v["source"]}
    return rec


def _sglang_budget(chip):
    """(SGLang's default chunked_prefill_size for the chip's memory, source)."""
    from .serve import _sglang_chunk
    return _sglang_chunk(Registry().chip(chip, field="hardware").memory_gib)


def _trtllm_budget():
    """(TensorRT-LLM's default max_num_tokens, source)."""
    from .serve import TRTLLM_MAX_NUM_TOKENS
    return TRTLLM_MAX_NUM_TOKENS


def _recipe_or_defaults(p: Point, rec, key, scheduler: str):
    """(recipe, its name): the point's recipe (as ``recipe_variant`` gave it), or where it has
    none the engine's defaults, with a gmu of 0.9 and an fp8 KV cache as the bundled scenarios."""
    if rec is None:
        rec = dict(max_num_seqs=None, max_num_batched_tokens=None, gpu_memory_utilization=0.9, cache_dtype="fp8",
                   block_size=None, num_prompts="10*C",
                   source=f"no InferenceX recipe read for {p.model} on {p.hardware} ({p.dtype}, {p.engine}): "
                          f"{'vLLM' if scheduler == 'vllm' else p.engine} defaults, gmu 0.9 and an fp8 KV cache as "
                          "the bundled scenarios")
        name = f"{'vLLM' if scheduler == 'vllm' else p.engine} defaults"
    else:
        name = f"{key[0]} {p.dtype} on {'/'.join(key[1])}"
    return rec, name


def _max_num_seqs(p: Point, rec, scheduler: str, C: int):
    """(max_num_seqs, source): C where the recipe passes $CONC, its number, else vLLM's default."""
    src, mns = rec["source"], rec["max_num_seqs"]
    return ((C, f"the client concurrency C (--max-num-seqs $CONC): {src}") if mns == "C" else
            (int(mns), src) if mns is not None else
            (VLLM_DEFAULT_MAX_NUM_SEQS, f"vLLM's default (not set by the recipe; serving-reference "
                                        f"§1.1): {src}") if scheduler == "vllm" else
            (VLLM_DEFAULT_MAX_NUM_SEQS, f"vLLM's default 1024, above every C here (COVERAGE LIMIT: "
                                        f"{p.engine}'s own running-request limit not read): {src}"))


def _batched_tokens(p: Point, rec, scheduler: str, isl: int):
    """(max_num_batched_tokens, source): 2 x isl or the recipe's number, else the scheduler's default."""
    src, mbt = rec["source"], rec["max_num_batched_tokens"]
    return ((2 * isl, f"2 x isl (--max-num-batched-tokens $((ISL * 2))): {src}")
            if mbt == "2*isl" else (int(mbt), src) if mbt is not None else
            _sglang_budget(p.hardware) if scheduler == "sglang" else
            _trtllm_budget() if scheduler == "trtllm" else
            (VLLM_DEFAULT_BATCHED_TOKENS, f"vLLM's default (not set by the recipe; "
                                          f"serving-reference §1.1): {src}"))


def _engine_settings(p: Point, rec, scheduler: str, isl: int, osl: int) -> dict:
    """gpu_memory_utilization, cache_dtype, block_size, max_model_len and (vLLM engines only)
    cudagraph_mode, each (value, source), in that order."""
    src = rec["source"]
    out = {"gpu_memory_utilization": (float(rec["gpu_memory_utilization"]), src)}
    out["cache_dtype"] = (rec["cache_dtype"], src if rec["cache_dtype"] != "auto" else
                          f"'auto' (the model's activation dtype, bf16): no kv-cache-dtype flag: {src}")
    bs = default_block_size(p.model)
    out["block_size"] = (int(rec["block_size"]), src) if rec["block_size"] else (bs, BLOCK_SIZE_SOURCE[bs])
    extra = 20 if (p.model.startswith("gpt-oss") and isl == 1024 and osl == 1024) else 256
    out["max_model_len"] = (isl + osl + extra, f"isl + osl + {extra} (InferenceX generate_sweep_configs.py; "
                                               f"gpt-oss recipes + 20 at 1k1k; {REF5})")
    if scheduler == "vllm":
        out["cudagraph_mode"] = ((rec["cudagraph_mode"], src) if rec.get("cudagraph_mode") else
                                 (VLLM_DEFAULT_CUDAGRAPH_MODE, VLLM_CUDAGRAPH_SOURCE))
    return out


def _run_settings(p: Point, rec, scheduler: str, C: int) -> dict:
    """range_ratio, num_prompts, warmups, prefix_caching, async_scheduling and dp_spread, each
    (value, source), in that order: the client's lengths and counts, and the engine's scheduling."""
    out = {"range_ratio": (RANGE_RATIO, f"RANDOM_RANGE_RATIO 0.8 (InferenceX benchmark-tmpl.yml; {REF5}): "
                                        "lengths uniform on [floor(0.8 L), L], serving-reference §4.3")}
    npr = 10 * C if rec["num_prompts"] == "10*C" else C
    out["num_prompts"] = (npr, ("10 x C (--num-prompts $((CONC * 10)))" if rec["num_prompts"] == "10*C"
                                else "C (--num-prompts $CONC)") + f": {rec['source']}")
    _client_stated(out, p)
    out["warmups"] = (2 * C, "--num-warmups 2 x C, finished before the timed run (serving-reference §4.2): "
                             "not simulated; the timed run starts from an empty engine")
    out["prefix_caching"] = (False, f"--no-enable-prefix-caching in the recipes ({REF5})")
    out["async_scheduling"] = ((True, "vLLM's default since v0.14 (serving-reference §3); the measured images "
                                      "are v0.15.1 and later (§0)") if scheduler == "vllm" else
                               (True, "SGLang's overlap scheduler, on by default (serving-reference §6)")
                               if scheduler == "sglang" else
                               (True, "COVERAGE LIMIT: TensorRT-LLM's overlap scheduler assumed on, as vLLM's "
                                      "async scheduling (its internals not read: serving-reference §7.7)"))
    out["dp_spread"] = (int(p.dp), "each data-parallel rank its own scheduler, queue, max_num_seqs and budget "
                                   "(serving-reference §2.1); how requests are spread: the simulation's own")
    return out


def _client_stated(out: dict, p: Point) -> None:
    """Over ``out`` (in place), the client the point's row states (its num_prompts and range_ratio
    columns, e.g. written by ``jaxprice import-bench``), said so; absent columns keep InferenceX's."""
    if p.range_ratio is not None:
        out["range_ratio"] = (p.range_ratio, f"the CSV's range_ratio column: lengths uniform on "
                                             f"[floor({p.range_ratio:g} L), L] (client.Workload; 1: fixed lengths)")
    if p.num_prompts is not None:
        out["num_prompts"] = (p.num_prompts, "the CSV's num_prompts column (the prompts the run sent)")


def _apply_stated(out: dict, p: Point, stated: dict) -> None:
    """Over ``out`` (in place), the flags the point's run states (``stated_settings``), said so;
    a stated prefix cache is noted as a coverage limit (the simulation keeps none)."""
    where = STATED_SOURCE if p.stated is None else "stated by the run (the --settings file)"
    for k in STATED_FIELDS:
        if k in stated:
            out[k] = (stated[k], where)
    if stated.get("enable_prefix_caching"):
        out["prefix_caching"] = (True, f"{where}: COVERAGE LIMIT [prefix-cache]: the simulation keeps no "
                                       "prefix cache; the random dataset's prompts share no prefix, so it gets "
                                       "no hits")


def _mark_in_sample(out: dict) -> None:
    """Append "[in sample: why]" (in place) to the source of each ``IN_SAMPLE_CHOICES`` setting."""
    for k, why in IN_SAMPLE_CHOICES.items():
        if k in out:
            out[k] = (out[k][0], out[k][1] + f" [in sample: {why}]")


def engine_assumptions(p: Point) -> dict:
    """The engine and client settings a simulated run of point ``p`` uses, each with where it came
    from: {name: (value, source)}.

    From InferenceX's published recipe for the point's (model, chip, dtype) and engine (vLLM's in
    ``IX_RECIPES``, serving-reference §5 and the recipe scripts it names; SGLang's, TensorRT-LLM's
    and more vLLM ones in ``ix_recipes.IX_ENGINE_RECIPES``, their flags mapped onto these names
    there), with the point's C and isl filled in:
    ``max_num_seqs`` (C in most recipes; where the recipe sets none, vLLM's default 1024),
    ``max_num_batched_tokens`` (8192, 2 x isl, or vLLM's default 8192), ``gpu_memory_utilization``,
    ``cache_dtype`` ('auto' = the model's activation dtype where the recipe sets no kv-cache-dtype),
    ``block_size`` (the recipe's, else vLLM's CUDA default 16), ``cudagraph_mode`` (vLLM engines:
    the recipe's, else vLLM's default FULL_AND_PIECEWISE; other engines keep the deployment's),
    ``max_model_len`` (isl + osl + 256; gpt-oss at 1k1k + 20), ``range_ratio`` 0.8 (uniform
    lengths on [floor(0.8 L), L]), ``num_prompts`` (10 x C, C where the recipe passes
    --num-prompts $CONC; both the CSV's own columns where it has them, ``_client_stated``), ``warmups`` (2 x C, finished before the timed run: the simulation starts
    from an empty engine), prefix caching off, async scheduling on, ``dp_spread`` (each
    data-parallel rank schedules its own requests; how the simulation spreads them is its own,
    reported in its assumptions). A point whose (model, chip, dtype) has no recipe gets its
    engine's defaults, said so in the source.

    Over all of these, the flags the point's own run states (``stated_settings``: the bundled
    table of InferenceX's runs, or a ``--settings`` file): block_size, gpu_memory_utilization,
    max_num_seqs, max_num_batched_tokens and max_model_len where the run records them, and
    cache_dtype and cudagraph_mode where a ``--settings`` file states them (e.g. written by
    ``jaxprice import-bench`` from the scenario the run ran; ``recipe_deployment`` then sizes the
    KV cache and prices the host by them, for any engine); where
    they identify a version of the recipe (``recipe_variant``), that version's other flags too.
    None of these is tuned to the data; any that was chosen after looking at its errors says "in
    sample" in its source (``IN_SAMPLE_CHOICES``, or the variant's own source)."""
    rec, key = recipe_for(p)
    stated = stated_settings(p)
    rec = recipe_variant(rec, stated)
    C, isl, osl = int(p.concurrency), int(p.isl), int(p.osl)
    scheduler = ENGINE_SCHEDULER.get(p.engine, "vllm")       # an unknown engine is refused by build_deployment
    rec, name = _recipe_or_defaults(p, rec, key, scheduler)
    out = {"recipe": (name, rec["source"]),
           "max_num_seqs": _max_num_seqs(p, rec, scheduler, C),
           "scheduler": (scheduler, f"the CSV's engine column ({p.engine}): serve.SCHEDULERS"),
           "max_num_batched_tokens": _batched_tokens(p, rec, scheduler, isl)}
    out.update(_engine_settings(p, rec, scheduler, isl, osl))
    out.update(_run_settings(p, rec, scheduler, C))
    _apply_stated(out, p, stated)
    out.update(speculation_assumptions(p))
    _mark_in_sample(out)
    return out


def assumptions_text(a: dict) -> str:
    """One line of the settings (values only; the sources are in the report's table)."""
    keys = (("max_num_seqs", "max_num_seqs"), ("max_num_batched_tokens", "budget"), ("gpu_memory_utilization", "gmu"),
            ("cache_dtype", "kv"), ("block_size", "block"), ("cudagraph_mode", "graphs"),
            ("kv_capacity_tokens", "kv_tokens/rank"),
            ("max_model_len", "max_model_len"), ("range_ratio", "range_ratio"), ("num_prompts", "prompts"),
            ("dp_spread", "dp"), ("spec_method", "spec"), ("num_spec_tokens", "spec_tokens"),
            ("acceptance", "acceptance(assumed)"))
    parts = []
    for k, label in keys:
        if k in a and (k not in SPEC_KEYS or "spec_method" in a):      # the serving layer's k = 0 not shown
            v = a[k][0]
            parts.append(f"{label}={v:.0f}" if isinstance(v, float) and k == "kv_capacity_tokens" else f"{label}={v}")
    return " ".join(parts)


def padding(max_requests: int) -> int:
    """Rows a deployment's batches are padded to: the next power of two of its largest C."""
    return 1 << max(int(max_requests) - 1, 0).bit_length()


# ----------------------------------------------------------------------------- batch rules


def check_batch_rule(rule, *, field="batch_rule", static=False):
    """The rule itself, or a JaxpriceError naming the known rules (``static``: the rules that
    price batches, ``STATIC_BATCH_RULES``; 'simulate' prices whole runs, ``simulate_points``)."""
    known = STATIC_BATCH_RULES if static else BATCH_RULES
    if not isinstance(rule, str) or rule not in known:
        extra = " ('simulate' prices whole runs: simulate_points)" if rule == "simulate" else ""
        refuse(f"unknown batch rule (known: {', '.join(known)}){extra}", field=field, value=rule)
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
    check_batch_rule(batch_rule, static=True)
    if is_speculative(p):
        refuse(f"measured with speculative decoding ({p.spec_decode}): the static rules price decode rows of 1 "
               "token; batch rule 'simulate' prices the drafts (1 + k tokens per decode row, the drafter's passes, "
               "an assumed acceptance)", field="batch_rule", value=batch_rule)
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


def _deployments_of(points, refused, **build):
    """(deployment name, point indices, Deployment, where it came from) per deployment, in order
    of first appearance; the points of a deployment that does not resolve go to ``refused``."""
    by_dep: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        if is_speculative(p):       # one whose model has no drafter for its method: refused alone, with why
            try:
                speculation_assumptions(p)
            except JaxpriceError as err:
                refused.append((i, f"field 'spec_decode', value {p.spec_decode!r}: {err.reason}"))
                continue
        by_dep.setdefault(p.deployment, []).append(i)
    for name, idx in by_dep.items():
        try:
            dep, where = build_deployment(points[idx[0]], **build)
        except JaxpriceError as err:
            refused.extend((i, f"deployment does not resolve: {err}") for i in idx)
            continue
        yield name, idx, dep, where


def group_points(points, *, registry=None, scenario_dirs=None, extra_coefficient_files=(), source="columns",
                 batch_rule="anchor"):
    """Resolve each deployment once and stack its points' batches under ``batch_rule`` (one
    padding per deployment; see ``point_requests``).

    Returns (groups, refused): groups a list of DeploymentPoints in order of first appearance,
    refused a list of (point index, reason) for points that cannot be priced."""
    check_batch_rule(batch_rule, static=True)
    points = with_registry(points, registry)
    registry = registry or Registry()
    groups, refused = [], []
    for name, idx, dep, where in _deployments_of(points, refused, registry=registry, scenario_dirs=scenario_dirs,
                                                 extra_coefficient_files=extra_coefficient_files, source=source):
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


def predict_groups(groups, coefficients=None, *, temperature=None, callback=None, per_deployment=False):
    """Price every group: one call, and one compile, per plan structure (``stack.Structure``:
    the deployments of one model graph share one whatever their chip, parallelism or
    quantization), on the deployment axis (``stack.price_deployments``; each group's batches
    padded to the structure's widest, which prices the same).

    Returns {group name: dict(no_overlap, overlap, bottleneck [n] arrays (seconds; bottleneck an
    index into RESOURCES), host_output_token (seconds))}: per point, its TPOT less
    host_output_token (a group's ``combine`` applied to its batches' estimates; the bottleneck
    is that of the point's decode batch). ``coefficients`` optionally maps group name ->
    Coefficients to use instead of the deployment's own (e.g. fitted values).
    ``temperature``: None for exact mode (the default; compiled with FAST_COMPILE), a float for
    smooth mode. ``callback(done, total, deployment=name)`` after each group.
    ``per_deployment``: the former path, one vmapped call and one compile per deployment
    (``price_many``; kept for comparison, experiments/bench.py). ``stack.kernel_compiles()``
    counts the deployment-axis compiles."""
    from .stack import group_by_structure, pad_batches, price_deployments, stack_coefficients, stack_plans
    from .step import price_many
    coefs_of = [(coefficients or {}).get(g.name, g.deployment.coefficients) for g in groups]
    raw, done = {}, 0

    def report(name):
        nonlocal done
        done += 1
        if callback is not None:
            callback(done, len(groups), deployment=name)

    if per_deployment:
        for g, coefs in zip(groups, coefs_of):
            if temperature is None:
                raw[g.name] = _price_points(g.deployment.plan, coefs, g.batches)
            else:
                res = price_many(g.deployment.plan, coefs, g.batches, temperature=temperature)
                raw[g.name] = res.no_overlap, res.overlap, res.bottleneck
            report(g.name)
    else:
        for _, idx in group_by_structure([g.deployment.plan for g in groups]):
            stack = stack_plans([groups[i].deployment.plan for i in idx])
            coefs = stack_coefficients([coefs_of[i] for i in idx])
            batches, counts = pad_batches([groups[i].batches for i in idx])
            res = price_deployments(stack, coefs, batches, temperature=temperature,
                                    fast_compile=temperature is None)
            no, ov, bn = (np.asarray(x) for x in (res.no_overlap, res.overlap, res.bottleneck))
            for k, i in enumerate(idx):
                raw[groups[i].name] = no[k, :counts[k]], ov[k, :counts[k]], bn[k, :counts[k]]
                report(groups[i].name)
    out = {}
    for g, coefs in zip(groups, coefs_of):
        no, ov, bn = raw[g.name]
        if g.combine is not None:
            no, ov, bn = g.combine @ np.asarray(no), g.combine @ np.asarray(ov), np.asarray(bn)[:len(g.index)]
        out[g.name] = {"no_overlap": np.asarray(no), "overlap": np.asarray(ov), "bottleneck": np.asarray(bn),
                       "host_output_token": float(host_output_token(coefs))}
    return out


# ----------------------------------------------------------------------------- the serving simulation


def _serving_api():
    """jaxprice's serving layer (``jaxprice/_src/serve.py``: ``Workload``, ``simulate_sweep``); a
    JaxpriceError where it is not there."""
    try:
        from . import serve
    except ImportError as err:
        refuse(f"the serving simulation is not available ({err})", field="batch_rule", value="simulate")
    return serve


@dataclasses.dataclass
class SimulatedPoints:
    """The points of one deployment under the ``simulate`` rule: its Deployment as the harness
    resolves it for the other rules (``deployment``; its scenario or columns), where each point
    sits (``index``), the measured mean TPOT (seconds, [n]), the mean resident batch of each
    point's run (``resident``, rounded) and the engine settings each point's run used
    (``assumptions``: one ``engine_assumptions`` dict per point, plus what the simulation adds)."""
    name: str
    deployment: Deployment
    source: str
    index: np.ndarray
    measured: np.ndarray
    resident: np.ndarray | None = None
    assumptions: list = dataclasses.field(default_factory=list)
    batch_rule: str = "simulate"


def recipe_deployment(dep: Deployment, a: dict, *, registry=None, extra_coefficient_files=(), full=False):
    """The deployment re-resolved with the recipe's engine settings ``a`` (``engine_assumptions``):
    its cache dtype, gpu_memory_utilization, block size and CUDA-graph mode (what the plan prices
    and sizes the KV cache by); with ``full`` also its max_num_batched_tokens, max_num_seqs and
    max_model_len (which move only memory terms: the KV capacity is read from this one)."""
    eng = dict(dep.scenario.engine)
    eng.update(cache_dtype=a["cache_dtype"][0], gpu_memory_utilization=a["gpu_memory_utilization"][0],
               block_size=a["block_size"][0])
    if a["block_size"][1] in BLOCK_SIZE_SOURCE.values():   # none stated: the engine's own (resolve.vllm_mla_block)
        del eng["block_size"]
    if "cudagraph_mode" in a:
        eng["cudagraph_mode"] = a["cudagraph_mode"][0]
    if a["scheduler"][0] != "vllm":                # as scenario_from_columns: the engine scope of fitted sets
        eng["scheduler"] = a["scheduler"][0]
    if full:
        eng.update(max_num_batched_tokens=a["max_num_batched_tokens"][0], max_num_seqs=a["max_num_seqs"][0],
                   max_model_len=a["max_model_len"][0])
    if "num_spec_tokens" in a:      # the drafter priced: 1 + k tokens per decode row, k drafter passes
        eng["speculative"] = {"num_spec_tokens": int(a["num_spec_tokens"][0]), "method": a["spec_method"][0]}
    extra = [load_coefficient_set(f) for f in extra_coefficient_files]
    return resolve(dataclasses.replace(dep.scenario, engine=eng), registry or Registry(), extra_sets=extra)


@dataclasses.dataclass
class SimulatedRun:
    """One deployment-workload of the ``simulate`` rule: the deployment as the harness resolves
    it (``base``, from ``where``) and re-resolved with the recipe's engine settings (``dep``),
    the points it covers (``index``), the engine settings of its runs (``engine``; ``kv`` the KV
    capacity per rank), the recipe's prompt count rule, and per concurrency its closed-loop
    Schedule (``schedules``) or the reason the simulation refuses it (``reasons``, by point)."""
    name: str
    base: Deployment
    where: str
    index: list
    dep: Deployment | None = None
    engine: dict | None = None
    kv: float = math.inf
    rule: str = "10*C"
    acceptance: float | None = None       # speculative decoding: mean tokens per decode row and step
    schedules: dict = dataclasses.field(default_factory=dict)
    reasons: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0


def _run_engine(points, widx, a0, kv, block):
    """The engine settings of one deployment-workload's closed-loop runs: the recipe's, with
    max_num_seqs the largest of its points' (the closed loop never has more than C requests in
    the engine, so max_num_seqs = C and = the sweep's largest C are the same run), and ``block``
    the plan's block size (the recipe's, raised for a model with recurrent layers to vLLM's
    hybrid attention block: resolve.hybrid_block_size)."""
    seqs = [engine_assumptions(points[i])["max_num_seqs"][0] for i in widx]
    engine = {"max_num_seqs": int(max(seqs)), "max_num_batched_tokens": int(a0["max_num_batched_tokens"][0]),
              "block_size": int(block), "max_model_len": int(a0["max_model_len"][0]),
              "async_scheduling": bool(a0["async_scheduling"][0]), "scheduler": a0["scheduler"][0]}
    if math.isfinite(kv):
        engine["kv_capacity_tokens"] = kv
    return engine


def run_settings_key(p: Point) -> tuple:
    """What separates one simulated engine from another among a deployment's points of one
    workload: the settings that size or schedule it (``engine_assumptions``). max_num_seqs
    counts only where it binds (below C): a closed loop at C runs the same with any limit >= C."""
    a = engine_assumptions(p)
    seqs = a["max_num_seqs"][0]
    return (a["max_num_batched_tokens"][0], a["gpu_memory_utilization"][0], a["cache_dtype"][0], a["block_size"][0],
            a.get("cudagraph_mode", (None,))[0], a["max_model_len"][0],
            a["num_prompts"][0] // max(int(p.concurrency), 1), seqs if seqs < p.concurrency else None,
            a.get("num_spec_tokens", (0,))[0], a.get("acceptance", (None,))[0],
            # a CSV's client columns: points of one run at one C share a schedule, so they must agree
            None if p.num_prompts is None else Fraction(int(p.num_prompts), max(int(p.concurrency), 1)),
            p.range_ratio)


def _simulated_runs_of(points, refused, *, registry, scenario_dirs, extra_coefficient_files, source):
    """Stage 1 of the ``simulate`` rule: one SimulatedRun per deployment-workload, resolved under
    the recipe's settings (no schedule yet). A deployment or recipe that does not resolve
    refuses its points."""
    runs = []
    for name, idx, base, where in _deployments_of(points, refused, registry=registry, scenario_dirs=scenario_dirs,
                                                 extra_coefficient_files=extra_coefficient_files, source=source):
        by_workload: dict = {}
        for i in idx:
            by_workload.setdefault((points[i].isl, points[i].osl, run_settings_key(points[i])), []).append(i)
        for widx in by_workload.values():
            run = SimulatedRun(name, base, where, widx)
            a0 = engine_assumptions(points[widx[0]])
            try:     # both resolve or the run is refused (not simulated under the scenario's own engine)
                dep = recipe_deployment(base, a0, registry=registry, extra_coefficient_files=extra_coefficient_files)
                cap = recipe_deployment(base, a0, registry=registry, extra_coefficient_files=extra_coefficient_files,
                                        full=True)
                run.dep = dep
            except JaxpriceError as err:
                run.reasons = {i: f"the recipe's deployment does not resolve: {err}" for i in widx}
                runs.append(run)
                continue
            run.kv = float(cap.plan.memory["kv_capacity_tokens"])
            run.engine = _run_engine(points, widx, a0, run.kv, cap.plan.memory.get("block_size", a0["block_size"][0]))
            run.rule = recipe_prompts(points[widx[0]])
            run.acceptance = a0["acceptance"][0] if "acceptance" in a0 else None
            runs.append(run)
    return runs


def simulated_runs(points, *, registry=None, scenario_dirs=None, extra_coefficient_files=(), source="columns",
                   callback=None):
    """Every deployment-workload's closed-loop schedules under the ``simulate`` rule (the
    published recipe's engine settings, ``engine_assumptions``; lengths on [floor(0.8 L), L],
    seed 0; 10 x C prompts, or C where the recipe sends C), ALL built in shared scheduler calls
    (``serve.build_schedules_batched``: lanes of every deployment and level grouped by shape,
    so the compiles do not grow with the number of deployments). Returns (runs, refused): a
    list of SimulatedRun, and (point index, reason) for deployments that do not resolve.
    Used by ``simulate_points`` and by the fit through the simulation."""
    serve = _serving_api()
    points = with_registry(points, registry)
    registry = registry or Registry()
    refused: list = []
    runs = _simulated_runs_of(points, refused, registry=registry, scenario_dirs=scenario_dirs,
                              extra_coefficient_files=extra_coefficient_files, source=source)
    jobs, owners = [], []
    for run in runs:
        if run.dep is None:
            continue
        p0 = points[run.index[0]]
        ratio = RANGE_RATIO if p0.range_ratio is None else float(p0.range_ratio)    # one per run (run_settings_key)
        workload = Workload(isl=int(p0.isl), osl=int(p0.osl), range_ratio=ratio, seed=0)
        concs = sorted({points[i].concurrency for i in run.index})
        items = [(workload, serve.ClosedLoop(int(c), _run_prompts(points, run, c))) for c in concs]
        jobs.append((run.dep, items, run.engine, run.acceptance))
        owners.append((run, concs))
    t0 = time.perf_counter()
    built = serve.build_schedules_batched(jobs, callback=callback)
    per_run = (time.perf_counter() - t0) / max(len(jobs), 1)
    for (run, concs), scheds in zip(owners, built):
        run.seconds = per_run
        for c, sc in zip(concs, scheds):
            if isinstance(sc, JaxpriceError):
                run.reasons.update({i: f"the simulation refuses the run: {sc}" for i in run.index
                                    if points[i].concurrency == c})
            else:
                run.schedules[c] = sc
    return runs, refused


def _run_prompts(points, run: SimulatedRun, c: int):
    """The prompts a run at concurrency ``c`` sends: the CSV's num_prompts column of its points at
    that C (they agree: ``run_settings_key``), else None (10 x C) or C, as the recipe sends."""
    given = [points[i].num_prompts for i in run.index if points[i].concurrency == c]
    if given and given[0] is not None:
        return int(given[0])
    return None if run.rule == "10*C" else int(c)


def price_run(run: SimulatedRun, estimates=ESTIMATES, coefficients=None) -> dict:
    """{C: {estimate: summary dict}} of one SimulatedRun: all its levels' steps priced in one
    vmapped call per estimate (``serve.price_flat``; one schedule serves every estimate) and
    summarised by ``serve.schedule_metrics``, as ``serve.simulate_sweep`` does."""
    from . import serve
    concs = sorted(run.schedules)
    out = {c: {} for c in concs}
    if not concs:
        return out
    scheds = [run.schedules[c] for c in concs]
    coefs = run.dep.coefficients if coefficients is None else coefficients
    flats = [serve._flat_columns(sc) for sc in scheds]
    flat = {k: np.concatenate([f[k] for f in flats]) for k in flats[0]}
    both = np.asarray(serve.price_flat(run.dep.plan, coefs, scheds[0].laws, flat, estimate="both"))
    for e in estimates:
        times = both[serve.ESTIMATES.index(e)]
        o = 0
        for c, sc in zip(concs, scheds):
            n = sc.dp * sc.steps
            dt = times[o:o + n].reshape(sc.dp, sc.steps).max(axis=0) if sc.steps else np.zeros(0)
            o += n
            out[c][e] = dict(serve.schedule_metrics(sc, dt, coefficients=coefficients)["summary"])
    return out


def _point_assumptions(p: Point, run: SimulatedRun) -> dict:
    """``engine_assumptions`` of one point, with what its simulated run added (the KV capacity,
    the sweep's max_num_seqs, the serving layer's own assumptions)."""
    a = engine_assumptions(p)
    a["kv_capacity_tokens"] = (run.kv, "resolve (the reference memory model) under the recipe's gmu, "
                                       "cache dtype and budget: HBM x gmu less weights, activations, "
                                       "CUDA graphs and communication buffers, over KV bytes per token")
    ran = run.schedules[p.concurrency].assumptions.get("kv_capacity_tokens")
    if ran is not None and ran[0] != run.kv:        # sliding-window layers: serve.windowed_kv_capacity
        a["kv_capacity_tokens"] = (ran[0], a["kv_capacity_tokens"][1] + f"; {ran[1]}")
    if run.engine["block_size"] != a["block_size"][0]:
        from .resolve import block_note
        why = ("vLLM's attention block for a model with recurrent layers holds one layer's state "
               "(resolve.hybrid_block_size)" if run.dep.plan.memory.get("hybrid_block_minimum", 0) else
               f"{block_note(run.dep)} (resolve.vllm_mla_block)")
        a["block_size"] = (run.engine["block_size"], f"raised from {a['block_size'][0]} ({a['block_size'][1]}): {why}")
    if run.engine["max_num_seqs"] != a["max_num_seqs"][0]:
        a["max_num_seqs"] = (a["max_num_seqs"][0], a["max_num_seqs"][1] + f" (run with "
                             f"{run.engine['max_num_seqs']}, the sweep's largest C: the same run, as the "
                             "closed loop keeps at most C requests in the engine)")
    for key, val in run.schedules[p.concurrency].assumptions.items():
        if key not in a:
            a[key] = tuple(val) if isinstance(val, (tuple, list)) and len(val) == 2 else (val, "serve")
    a["workload"] = (p.workload, "the CSV row")
    a["concurrency"] = (int(p.concurrency), "the CSV row")
    return a


def simulate_points(points, *, registry=None, scenario_dirs=None, extra_coefficient_files=(), source="columns",
                    coefficients=None, estimates=ESTIMATES, callback=None, timings=None):
    """Each point's mean TPOT and mean TTFT from the serving simulation (``batch_rule='simulate'``):
    the closed-loop runs of ``simulated_runs`` (one per deployment-workload and concurrency, the
    recipe's engine settings), each run's steps priced per estimate (``price_run``; one schedule
    serves every estimate: 'no_overlap', 'overlap'). ``coefficients``: optional map deployment
    name -> Coefficients (e.g. fitted values). ``callback(done, total, **info)``: progress, once
    per scheduler group, then once per deployment priced. ``timings``: a dict that receives the
    wall time (s) of each (deployment, workload): its share of the shared scheduling plus its
    pricing.

    Returns (groups, refused, predictions) for ``score``: groups a list of SimulatedPoints,
    refused (point index, reason) pairs (a deployment that does not resolve, a run the
    simulation refuses: its JaxpriceError's text), predictions {name: tpot_<e>, ttft_<e> [n]
    (seconds), host_output_token, assumptions [n] (text)}."""
    runs, refused = simulated_runs(points, registry=registry, scenario_dirs=scenario_dirs,
                                   extra_coefficient_files=extra_coefficient_files, source=source,
                                   callback=callback)
    by_name: dict = {}
    for run in runs:
        by_name.setdefault(run.name, []).append(run)
    groups, predictions = [], {}
    for k, (name, dep_runs) in enumerate(by_name.items()):
        coefs = (coefficients or {}).get(name)
        results, assumed, reasons = {}, {}, {}
        for run in dep_runs:
            t0 = time.perf_counter()
            priced = price_run(run, estimates, coefs) if run.dep is not None else {}
            if timings is not None:
                timings[(name, points[run.index[0]].workload)] = run.seconds + time.perf_counter() - t0
            reasons.update(run.reasons)
            for i in run.index:
                c = points[i].concurrency
                if c in priced and i not in run.reasons:
                    results[i], assumed[i] = priced[c], _point_assumptions(points[i], run)
        idx = [i for run in dep_runs for i in run.index]
        ok = sorted(i for i in idx if i in results)
        refused.extend((i, reasons[i]) for i in idx if i in reasons)
        if ok:
            base = dep_runs[0].base
            pr = {"host_output_token": float(host_output_token(coefs or base.coefficients)),
                  "assumptions": [assumptions_text(assumed[i]) for i in ok]}
            for e in estimates:
                pr[f"tpot_{e}"] = np.array([float(results[i][e]["tpot_mean"]) for i in ok])
                pr[f"ttft_{e}"] = np.array([float(results[i][e]["ttft_mean"]) for i in ok])
            resident = np.array([int(round(float(results[i][estimates[0]].get("resident_mean",
                                                                                points[i].concurrency))))
                                 for i in ok])
            groups.append(SimulatedPoints(name=name, deployment=base, source=dep_runs[0].where, index=np.array(ok),
                                          measured=np.array([points[i].measured for i in ok]), resident=resident,
                                          assumptions=[assumed[i] for i in ok]))
            predictions[name] = pr
        if callback is not None:
            callback(k + 1, len(by_name), deployment=name)
    return groups, refused, predictions


def recipe_prompts(p: Point) -> str:
    """'10*C' or 'C': how many prompts the point's recipe sends."""
    rec, _ = recipe_for(p)
    return rec["num_prompts"] if rec else "10*C"


def deployment_assumptions(groups) -> list:
    """One row per simulated deployment and workload: the settings its runs used, each with its
    source (for the report's table). max_num_seqs shows 'C' where it is the concurrency."""
    rows = []
    for g in groups:
        if not isinstance(g, SimulatedPoints):
            continue
        seen = {}
        for a in g.assumptions:
            seen.setdefault((a["workload"][0], _settings_signature(a)), a)
        for a in seen.values():
            rows.append({"deployment": g.name, **a})
    return rows


ASSUMPTION_KEYS = ("scheduler", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "cache_dtype",
                   "block_size", "cudagraph_mode", "kv_capacity_tokens", "max_model_len", "num_prompts", "range_ratio",
                   "dp_spread")
SPEC_KEYS = ("spec_method", "num_spec_tokens", "acceptance")     # a speculating run's, after those


def _settings_value(a: dict, k: str):
    """A setting as the report's table shows it: max_num_seqs 'C' where it is the concurrency,
    num_prompts as the recipe's rule (10 x C or C) or the count the CSV's column states."""
    v, src = a[k]
    if k == "max_num_seqs" and ("client concurrency" in src or v == a.get("concurrency", (None,))[0]):
        return "C"
    if k == "num_prompts":       # the recipe's rule; a count the CSV states is shown as it is
        return "10 x C" if src.startswith("10 x C") else "C" if src.startswith("C (") else v
    return v


def _settings_signature(a: dict) -> tuple:
    """What tells one run's settings from another's in the report (values and sources; the KV
    capacity only by its source: with sliding-window layers its value moves with each level's
    drawn lengths, serve.windowed_kv_capacity)."""
    return tuple((k, _settings_value(a, k) if k != "kv_capacity_tokens" else None, a[k][1])
                 for k in ASSUMPTION_KEYS + (SPEC_KEYS if "spec_method" in a else ()) if k in a)


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


def summarize(shape_err, anchor, predicted, measured, ttft_shape=None, ttft_predicted=None, ttft_measured=None):
    """Summary of one estimate over some points (NaN entries = not priced: excluded, counted).

    Keys: points, priced, shape_points (points with a shape error), shape_mean, shape_median
    (upper median), shape_max, shape_mean_non_anchor, tpot_mape, tpot_mean_signed (fractions);
    and the same for mean TTFT: ttft_priced (points with a predicted and a measured TTFT),
    ttft_mape, ttft_mean_signed, ttft_shape_mean, ttft_shape_median (NaN, with ttft_priced 0,
    where TTFT is not predicted: the static batch rules)."""
    shape_err = np.asarray(shape_err, dtype=float)
    rel = np.asarray(predicted, dtype=float) / np.asarray(measured, dtype=float) - 1.0
    ok = np.isfinite(rel)
    sok = np.isfinite(shape_err)
    non_anchor = sok & ~np.asarray(anchor, dtype=bool)

    def mean(x):
        return float(np.mean(x)) if len(x) else float("nan")
    n = len(rel)
    nan = np.full(n, np.nan)
    t_shape = nan if ttft_shape is None else np.asarray(ttft_shape, dtype=float)
    t_rel = (nan if ttft_predicted is None or ttft_measured is None else
             np.asarray(ttft_predicted, dtype=float) / np.asarray(ttft_measured, dtype=float) - 1.0)
    tok, tsok = np.isfinite(t_rel), np.isfinite(t_shape)
    return {"points": int(n), "priced": int(ok.sum()),
            "shape_mean": mean(shape_err[sok]), "shape_median": upper_median(shape_err[sok]),
            "shape_max": float(np.max(shape_err[sok])) if sok.any() else float("nan"),
            "shape_mean_non_anchor": mean(shape_err[non_anchor]), "shape_points": int(sok.sum()),
            "tpot_mape": mean(np.abs(rel[ok])), "tpot_mean_signed": mean(rel[ok]),
            "ttft_priced": int(tok.sum()), "ttft_mape": mean(np.abs(t_rel[tok])),
            "ttft_mean_signed": mean(t_rel[tok]), "ttft_shape_mean": mean(t_shape[tsok]),
            "ttft_shape_median": upper_median(t_shape[tsok])}


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

    def split_summary(self, estimate: str = "no_overlap") -> dict:
        """Summaries over the held-out ('test') and the other ('train') deployments of
        ``info['split']`` (see ``evaluate_accuracy``), plus 'all'."""
        test = set(self.info.get("split", {}).get("test", []))
        return self.summarize_by(lambda r: "test" if r["deployment"] in test else "train", estimate)

    def summarize_by(self, field, estimate: str = "no_overlap") -> dict:
        """Summaries of one estimate grouped by a record field (e.g. 'hardware', 'workload',
        'deployment') or by ``field(record) -> label``, plus 'all'."""
        recs = self.records
        key = field if callable(field) else (lambda r: str(r[field]))
        pred = np.array([r[f"{estimate}_tpot_us"] for r in recs], dtype=float)
        meas = np.array([r["measured_us"] for r in recs], dtype=float)
        shape = np.array([r[f"{estimate}_shape_error"] for r in recs], dtype=float)
        t_pred = np.array([r.get(f"{estimate}_ttft_us", math.nan) for r in recs], dtype=float)
        t_meas = np.array([r.get("measured_ttft_us", math.nan) for r in recs], dtype=float)
        t_shape = np.array([r.get(f"{estimate}_ttft_shape_error", math.nan) for r in recs], dtype=float)
        anchor = np.array([r["anchor"] for r in recs], dtype=bool)
        refused = np.array([r["status"] == "refused" for r in recs], dtype=bool)
        labels = [key(r) for r in recs]
        out = {}
        for k in sorted(set(labels)) + ["all"]:
            sel = np.array([k == "all" or lab == k for lab in labels], dtype=bool)
            s = summarize(shape[sel], anchor[sel], pred[sel], meas[sel], t_shape[sel], t_pred[sel], t_meas[sel])
            s["refused"] = int(refused[sel].sum())
            out[k] = s
        return out


def score(points, groups, refused, predictions, *, csv_path="", info=None) -> AccuracyReport:
    """Assemble per-point records and summaries from priced groups. A priced point whose TPOT is
    not finite (or not positive) is moved to the refused list with that reason.

    ``predictions[g.name]`` holds, per point of the group, either the step estimates
    (``no_overlap``, ``overlap``: TPOT less host_output_token; the static rules) or, from the
    serving simulation, ``tpot_<estimate>`` and ``ttft_<estimate>`` (seconds, host costs
    included; the step columns are then NaN; an estimate left out stays NaN without refusing
    the point); ``bottleneck`` and ``assumptions`` (one text
    per point) where known. TTFT is NaN where it is not predicted (the static rules)."""
    c = _collect_predictions(points, groups, refused, predictions)
    meas = np.array([p.measured for p in points])
    meas_ttft = np.array([p.measured_ttft for p in points], dtype=float)
    sweeps = np.array([p.sweep for p in points])
    conc = np.array([p.concurrency for p in points])
    shape, tshape = {}, {}
    for e in ESTIMATES:
        shape[e], anchor = shape_errors(sweeps, conc, c["pred"][e], meas)
        tshape[e], _ = shape_errors(sweeps, conc, c["ttft"][e], meas_ttft)
    rules = {g.batch_rule for g in groups}
    rule = next(iter(rules)) if len(rules) == 1 else ""
    anchor_of = {sweeps[a]: a for a in np.flatnonzero(anchor)}
    records = [_point_record(i, p, c, rule, anchor, anchor_of[p.sweep], meas, meas_ttft, conc, shape, tshape)
               for i, p in enumerate(points)]
    reasons = c["reasons"]
    summary = {}
    models = sorted({p.model for p in points})
    for e in ESTIMATES:
        summary[e] = {}
        for m in models + ["all"]:
            sel = np.array([m == "all" or p.model == m for p in points])
            s = summarize(shape[e][sel], anchor[sel], c["pred"][e][sel], meas[sel], tshape[e][sel],
                          c["ttft"][e][sel], meas_ttft[sel])
            s["refused"] = int(sum(1 for i in np.flatnonzero(sel) if i in reasons))
            summary[e][m] = s
    refused_list = [{"row": points[i].row, "deployment": points[i].deployment, "workload": points[i].workload,
                     "concurrency": points[i].concurrency, "reason": r} for i, r in sorted(reasons.items())]
    info = dict(info or {})
    info.setdefault("ttft_predicted", bool(np.isfinite(c["ttft"]["no_overlap"]).any()))
    return AccuracyReport(csv=str(csv_path), records=records, refused=refused_list, summary=summary, info=info)


def _collect_predictions(points, groups, refused, predictions) -> dict:
    """Per point (arrays over the point list): pred, ttft, step ({estimate: seconds}; NaN where
    not priced), bottleneck, source, assumed, hot (host_output_token), resident, and reasons
    ({point index: why it is refused}, a point whose TPOT is not finite and positive added)."""
    n = len(points)
    pred = {e: np.full(n, np.nan) for e in ESTIMATES}
    ttft = {e: np.full(n, np.nan) for e in ESTIMATES}
    step = {e: np.full(n, np.nan) for e in ESTIMATES}
    bottleneck, source, assumed = [""] * n, [""] * n, [""] * n
    hot = np.full(n, np.nan)
    resident = np.array([p.concurrency for p in points])
    reasons = dict(refused)
    for g in groups:
        if g.resident is not None:
            resident[g.index] = g.resident
        pr = predictions[g.name]
        given = [e for e in ESTIMATES if e in pr or f"tpot_{e}" in pr]     # estimates this group predicts
        for e in given:
            if f"tpot_{e}" in pr:
                pred[e][g.index] = pr[f"tpot_{e}"]
            else:
                step[e][g.index] = pr[e]
                pred[e][g.index] = pr[e] + pr["host_output_token"]
            if f"ttft_{e}" in pr:
                ttft[e][g.index] = pr[f"ttft_{e}"]
        hot[g.index] = pr["host_output_token"]
        for j, i in enumerate(g.index):
            if "bottleneck" in pr:
                bottleneck[i] = RESOURCES[int(pr["bottleneck"][j])]
            if "assumptions" in pr:
                assumed[i] = pr["assumptions"][j]
            source[i] = g.source
            bad = [e for e in given if not (np.isfinite(pred[e][i]) and pred[e][i] > 0)]
            if bad:
                what = "the kernel priced the step at " if f"tpot_{bad[0]}" not in pr else "the simulation gave TPOT "
                reasons[i] = what + ", ".join(
                    f"{ESTIMATE_LABELS[e]} {(step[e][i] if f'tpot_{e}' not in pr else pred[e][i])!r} s" for e in bad)
                for e in ESTIMATES:
                    pred[e][i] = np.nan
                    ttft[e][i] = np.nan
    return {"pred": pred, "ttft": ttft, "step": step, "bottleneck": bottleneck, "source": source,
            "assumed": assumed, "hot": hot, "resident": resident, "reasons": reasons}


def _point_record(i, p, c, rule, anchor, a, meas, meas_ttft, conc, shape, tshape) -> dict:
    """One row of the points table (``AccuracyReport.records``): point i, its sweep's anchor a."""
    reasons = c["reasons"]
    rec = {"row": p.row, "scenario": p.scenario, "deployment": p.deployment, "model": p.model,
           "hardware": p.hardware, "dtype": p.dtype, "tp": p.tp, "ep": p.ep, "dp": p.dp,
           "workload": p.workload, "isl": p.isl, "osl": p.osl, "concurrency": p.concurrency,
           "context": p.context, "batch_rule": rule,
           "resident": int(c["resident"][i]), "anchor": bool(anchor[i]), "anchor_concurrency": int(conc[a]),
           "measured_us": p.measured * 1e6, "measured_rel": p.measured / meas[a],
           "measured_ttft_us": meas_ttft[i] * 1e6,
           "status": "refused" if i in reasons else "priced", "reason": reasons.get(i, ""),
           "source": c["source"][i], "bottleneck": c["bottleneck"][i] if i not in reasons else "",
           "host_output_token_us": c["hot"][i] * 1e6}
    for e in ESTIMATES:
        rec[f"{e}_step_us"] = c["step"][e][i] * 1e6
        rec[f"{e}_tpot_us"] = c["pred"][e][i] * 1e6
        rec[f"{e}_error"] = c["pred"][e][i] / p.measured - 1.0
        rec[f"{e}_shape_error"] = shape[e][i]
    for e in ESTIMATES:
        rec[f"{e}_ttft_us"] = c["ttft"][e][i] * 1e6
        rec[f"{e}_ttft_error"] = c["ttft"][e][i] / meas_ttft[i] - 1.0
        rec[f"{e}_ttft_shape_error"] = tshape[e][i]
    rec["assumptions"] = c["assumed"][i]
    return rec


def select_deployments(points, deployments, csv_path):
    """The points of the named deployments (all for None); refuses a selection matching none."""
    if deployments is None:
        return points
    if not isinstance(deployments, (str, list, tuple, set, frozenset)) or not all(
            isinstance(d, str) for d in ([deployments] if isinstance(deployments, str) else deployments)):
        refuse("expected deployment names (a str or a list of them)", field="deployments",
               value=deployments if isinstance(deployments, (int, float)) else str(deployments)[:80], has_value=True)
    keep = {deployments} if isinstance(deployments, str) else set(deployments)   # one name, not its letters
    have = {p.deployment for p in points}
    points = [p for p in points if p.deployment in keep]
    if not points:
        refuse("no point of the CSV belongs to the selected deployments", file=str(csv_path),
               field="deployment", value=sorted(keep)[:3])
    missing = sorted(keep - have)
    if missing:         # a misspelt name among good ones would be dropped silently
        refuse(f"no point of the CSV belongs to this deployment (the CSV has {len(have)}, e.g. "
               f"{', '.join(sorted(have)[:3])})", file=str(csv_path), field="deployment", value=missing[0])
    return points


def check_scenario_dirs(dirs, field="scenario_dirs") -> None:
    """Refuse a scenario folder that is empty-named, missing or a file (rather than silently
    building every deployment from the CSV's columns)."""
    for d in dirs or ():
        if not str(d).strip():
            refuse("an empty folder name", field=field, value=d, has_value=True)
        p = Path(d)
        if not p.exists():
            refuse("no such folder", field=field, value=str(d))
        if not p.is_dir():
            refuse("is a file, not a folder of <deployment>.yaml scenarios", field=field, value=str(d))


def check_coefficient_files(files, field=None) -> None:
    """Read every coefficient set up front (the loader caches them): a missing, empty or malformed
    file is refused in one line naming it (and ``field``), not left to refuse every point."""
    for f in files or ():
        try:
            load_coefficient_set(f)
        except JaxpriceError as err:
            if field is None:
                raise
            raise JaxpriceError(f"{field}: {err}") from None


def evaluate_accuracy(csv_path, *, registry=None, scenario_dirs=None, extra_coefficient_files=(),
                      deployments=None, temperature=None, callback=None, batch_rule="anchor",
                      estimates=ESTIMATES, per_deployment=False, settings=None, acceptance=None) -> AccuracyReport:
    """Price every mean-TPOT point of a measurement CSV and score it (see the module docstring).

    extra_coefficient_files: coefficient sets applied after each deployment's own, overriding by
    name (e.g. a set written by ``jaxprice fit``). deployments: keep only these deployment names
    (None: all). batch_rule: 'anchor' (the anchor kernel's rule, the default), 'capped',
    'interleaved' or 'simulate' (``BATCH_RULES``; see the module docstring); only 'simulate'
    predicts mean TTFT. estimates: under 'simulate', the estimates simulated (each is one
    sweep per deployment and workload; one left out is NaN). callback(done, total, **info):
    progress, once per deployment priced. ``info['split']`` holds the held-out deployments of
    ``fit.split_by_deployment`` (fraction 0.25, seed 0, stratified by model, as ``jaxprice fit``
    holds them out), for ``AccuracyReport.split_summary``. per_deployment: a static rule's
    former path, one compile per deployment (``predict_groups``; for comparison,
    experiments/bench.py --axis); ``info['kernel_compiles']`` counts the compiles either way.
    settings: a CSV of the engine flags each run passed (``read_settings``; default: the bundled
    table of InferenceX's runs, ``stated_settings``), for 'simulate'; its optional columns
    num_speculative_tokens and acceptance give a speculating run's draft count and acceptance.
    acceptance: the mean tokens emitted per decode row and step of every point measured with
    speculative decoding (a number in [1, 1 + k], k its draft count; default: each point's
    --settings row, else the serving layer's assumed ``serve.default_acceptance(k)``; ``speculation_assumptions``),
    for 'simulate'."""
    check_batch_rule(batch_rule)
    check_registry(registry)
    if isinstance(estimates, str):          # one estimate, not its letters
        estimates = (estimates,)
    if not isinstance(estimates, (list, tuple)) or not estimates or any(e not in ESTIMATES for e in estimates):
        refuse(f"expected a non-empty list of estimates (known: {', '.join(ESTIMATES)})", field="estimates",
               value=estimates if isinstance(estimates, (list, tuple, int, float)) else type(estimates).__name__,
               has_value=True)
    if batch_rule != "simulate" and tuple(estimates) != tuple(ESTIMATES):
        refuse("is for batch_rule 'simulate' (a static rule prices every estimate at once)", field="estimates",
               value=list(estimates), has_value=True)
    check_callback(callback)
    if not isinstance(per_deployment, (bool, np.bool_)):
        refuse("must be True or False", field="per_deployment", value=per_deployment, has_value=True)
    scenario_dirs = path_list(scenario_dirs, "scenario_dirs")
    extra_coefficient_files = path_list(extra_coefficient_files, "extra_coefficient_files", none=())
    check_scenario_dirs(scenario_dirs)
    check_coefficient_files(extra_coefficient_files)
    if settings is not None:                # checked before the measurements are read
        check_settings_path(settings)
        if batch_rule != "simulate":
            refuse("the engine flags of each run are read by the serving simulation only (batch_rule 'simulate')",
                   field="settings", value=str(settings), has_value=True)
    acceptance = check_acceptance(acceptance)
    if acceptance is not None and batch_rule != "simulate":
        refuse("is the acceptance of speculative decoding, priced by the serving simulation only (batch_rule "
               "'simulate')", field="acceptance", value=acceptance, has_value=True)
    points, info = read_measurements(csv_path)
    if settings is not None:
        points = read_settings(points, settings)
        info["settings_file"] = str(settings)
    points = select_deployments(points, deployments, csv_path)
    points = with_registry(points, registry)
    if acceptance is not None:
        points = [dataclasses.replace(p, acceptance=acceptance) if is_speculative(p) else p for p in points]
    check_speculation_inputs(points, field="acceptance", settings=settings)
    _speculation_note(points, info, batch_rule)
    info["points"] = len(points)
    if batch_rule == "simulate":
        timings: dict = {}
        groups, refused, predictions = simulate_points(
            points, registry=registry, scenario_dirs=scenario_dirs, extra_coefficient_files=extra_coefficient_files,
            source=str(csv_path), estimates=tuple(estimates), callback=callback, timings=timings)
        info["sweep_seconds"] = {f"{d}|{w}": round(t, 2) for (d, w), t in timings.items()}
        info["assumptions"] = deployment_assumptions(groups)
        info["estimates_simulated"] = list(estimates)
    else:
        groups, refused = group_points(points, registry=registry, scenario_dirs=scenario_dirs,
                                       extra_coefficient_files=extra_coefficient_files, source=str(csv_path),
                                       batch_rule=batch_rule)
        predictions = _predict_counting(groups, info, temperature=temperature, callback=callback,
                                        per_deployment=per_deployment)
    from .fit import split_by_deployment
    # the deployments jaxprice fit splits: those it has observations of (the priced ones, its
    # _split_for_early_stopping), by model graph, unstratified where that holds none out; over every
    # deployment of the CSV a refused one could be "held out" (test: 0 priced) while fit held out another
    model_of = {g.name: g.deployment.graph.name for g in groups}
    names = sorted(model_of)
    train, test = split_by_deployment(names, 0.25, seed=0, stratify=model_of)
    if not test:
        train, test = split_by_deployment(names, 0.25, seed=0)
    info["split"] = {"train": train, "test": test,
                     "how": "jaxprice.fit.split_by_deployment(the priced deployments, 0.25, seed=0, stratify=model)"}
    notes = info.get("notes", []) + _ep_notes(groups, points) + _unloadable_notes(groups, points)
    info["extra_coefficient_reach"] = _set_reach(extra_coefficient_files, groups)
    info.update(deployments=len({p.deployment for p in points}), sweeps=len({p.sweep for p in points}),
                from_scenario_files=sorted({g.name for g in groups if g.source != "columns"}),
                from_columns=sorted({g.name for g in groups if g.source == "columns"}),
                extra_coefficient_files=[str(f) for f in extra_coefficient_files], notes=notes,
                temperature=temperature, batch_rule=batch_rule,
                resident_below_concurrency=sum(int(R < points[i].concurrency)
                                               for g in groups for i, R in zip(g.index, g.resident)))
    return score(points, groups, refused, predictions, csv_path=csv_path, info=info)


def _set_reach(files, groups) -> dict:
    """{extra coefficient file: the deployments one of its entries reaches and the kernel reads};
    the report's head says how many, so a set scoped elsewhere (every deployment on the
    registry's values) is not mistaken for one that was applied."""
    from .fit import set_applies
    out = {}
    for f in files:
        out[str(f)] = {"reached": sorted({g.name for g in groups if set(set_applies(f, g.deployment)["applied"])
                                          & set(g.deployment.coefficients.names)}),
                       "of": len({g.name for g in groups})}
    return out


def _predict_counting(groups, info, *, temperature, callback, per_deployment):
    """``predict_groups``, recording in ``info`` the kernel compiles it cost (one per plan
    structure; ``per_deployment``: one per deployment) and which path ran."""
    from .stack import kernel_compiles
    compiled, folded = kernel_compiles(), _price_points._cache_size()
    predictions = predict_groups(groups, temperature=temperature, callback=callback, per_deployment=per_deployment)
    info["kernel_compiles"] = kernel_compiles() - compiled + _price_points._cache_size() - folded
    info["per_deployment"] = bool(per_deployment)
    return predictions


def _ep_notes(groups, points) -> list:
    """A note per deployment built from columns whose tp column is its GPU count, not each
    data-parallel rank's width (``rank_tp``)."""
    notes = []
    for g in groups:
        p = points[g.index[0]]
        if g.source == "columns" and rank_tp(p) != p.tp:
            notes.append(f"{g.name}: tp {p.tp} read as the GPU count: {p.dp} data-parallel ranks of tp "
                         f"{rank_tp(p)} (ep {p.ep} = rank tp x dp; InferenceX launches DP attention as "
                         "--tensor-parallel-size TP / DP)")
    return notes


def _unloadable_notes(groups, points=None) -> list:
    """A note per deployment whose layout, as stated, the engine would refuse to load
    (``layouts.heads_reason``, ``layouts.block_reason``: e.g. MiniMax-M2.5's block-wise FP8
    experts split 1536 / 8 = 192 wide at tp 8 without expert parallelism, which vLLM refuses):
    the measured run cannot have run it so, and the point is priced as stated. ``points``: the
    point list, whose engine column names the engine in the note (vLLM where not given)."""
    from .layouts import block_reason, heads_reason
    notes = []
    for g in groups:
        sc, graph = g.deployment.scenario, g.deployment.graph
        par = sc.parallel if sc is not None else {}
        tp, dp, ep = int(par.get("tp", 1)), int(par.get("dp", 1) or 1), bool(par.get("enable_expert_parallel"))
        weights = sc.engine.get("quantization") or graph.weight_dtype
        engine = "sglang" if points is not None and "sglang" in str(points[g.index[0]].engine).lower() else "vllm"
        why = heads_reason(graph, tp, engine) or block_reason(graph, tp, dp, ep, weights, engine)
        if why:
            notes.append(f"{g.name}: tp {tp}, dp {dp}, expert parallelism {'on' if ep else 'off'} as stated: {why}; "
                         "the run cannot have used this layout as stated (e.g. it ran with expert parallelism), "
                         "priced as stated")
    return notes


# ----------------------------------------------------------------------------- output


def _pct(x, signed=False):
    if not np.isfinite(x):
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def repeat_spread(records, estimate="no_overlap") -> dict:
    """How far the measurements disagree with themselves, on the points measured in more than one
    run (same deployment, workload and C: other runs of the recipe), for mean TPOT (measured_us)
    and mean TTFT (measured_ttft_us):

    * ``mape``, ``median``: each run's value against the mean of the other runs',
      |x / mean(others) - 1|: the MAPE a model predicting every run by the mean of the other runs
      would score on them;
    * ``shape_mean``, ``shape_median`` over ``shape_repeated`` points: the harness's shape error
      of each run's sweep (a run: one ``scenario`` of a deployment and workload; C0 its lowest
      concurrency, its own point 0) when predicted by the other runs: the mean over the other runs
      measured at both C and C0 of their x(C) / x(C0), against the run's own ratio;
    * ``model_mape``, ``model_shape_mean``: the ``estimate``'s own errors on those same points
      (present where the records carry them), for a like-for-like comparison.

    Returns {quantity: {...}} (upper medians; nan when nothing is repeated)."""
    out = {}
    for q, key, err_key, shape_key in (("tpot", "measured_us", f"{estimate}_error", f"{estimate}_shape_error"),
                                       ("ttft", "measured_ttft_us", f"{estimate}_ttft_error",
                                        f"{estimate}_ttft_shape_error")):
        recs = [r for r in records if math.isfinite(float(r.get(key, math.nan))) and float(r.get(key, math.nan)) > 0]
        groups: dict = {}
        for r in recs:
            groups.setdefault((r["deployment"], r["workload"], int(r["concurrency"])), []).append(float(r[key]))
        errs, model = [], []
        for r in recs:
            vals = groups[(r["deployment"], r["workload"], int(r["concurrency"]))]
            if len(vals) > 1:
                x = float(r[key])
                errs.append(abs(x / ((sum(vals) - x) / (len(vals) - 1)) - 1))
                model.append(abs(float(r.get(err_key, math.nan))))
        shape = _repeat_shape(recs, key)
        model_shape = [float(r.get(shape_key, math.nan)) for r, _ in shape]
        sh = sorted(e for _, e in shape)
        out[q] = {"points": len(recs), "repeated": len(errs),
                  "mape": float(np.mean(errs)) if errs else math.nan,
                  "median": sorted(errs)[len(errs) // 2] if errs else math.nan,
                  "shape_repeated": len(sh), "shape_mean": float(np.mean(sh)) if sh else math.nan,
                  "shape_median": sh[len(sh) // 2] if sh else math.nan}
        if model and all(math.isfinite(m) for m in model):
            out[q]["model_mape"] = float(np.mean(model))
        if model_shape and all(math.isfinite(m) for m in model_shape):
            out[q]["model_shape_mean"] = float(np.mean(model_shape))
    return out


def _repeat_shape(recs, key) -> list:
    """[(record, shape error)] of every point whose sweep (deployment, workload, scenario) has
    another run of the same deployment and workload measured at both its C and its C0."""
    runs: dict = {}
    for r in recs:
        runs.setdefault((r["deployment"], r["workload"]), {}).setdefault(r.get("scenario", ""), {})[
            int(r["concurrency"])] = r
    out = []
    for by_run in runs.values():
        for name, sweep in by_run.items():
            c0 = min(sweep)
            others = [o for other, o in by_run.items() if other != name and c0 in o]
            for c, r in sweep.items():
                ratios = [float(o[c][key]) / float(o[c0][key]) for o in others if c in o]
                if ratios:
                    own = float(r[key]) / float(sweep[c0][key])
                    out.append((r, 0.0 if c == c0 else abs(float(np.mean(ratios)) / own - 1)))
    return out


def concurrency_bucket(c) -> str:
    """The report's concurrency bucket of C (``CONCURRENCY_BUCKETS``)."""
    return next(label for label, top in CONCURRENCY_BUCKETS if c <= top)


def _table(header, rows, *, markdown, widths=None, bold_last=False):
    """Rows of strings as a Markdown table or as aligned text (first two columns left)."""
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if k < 2 else "---:" for k in range(len(header))) + "|"]
        out += ["| " + " | ".join(f"**{c}**" if bold_last and "all" in (r[0], r[1]) and k > 1 else c
                                  for k, c in enumerate(r)) + " |" for r in rows]
        return out
    widths = widths or [max(len(str(x)) for x in col) + 2 for col in zip(header, *rows)]

    def fmt(r):
        return "".join(f"{c:<{w}}" if k < 2 else f"{c:>{w}}" for k, (c, w) in enumerate(zip(r, widths)))
    return [fmt(header)] + [fmt(r) for r in rows]


def _error_cells(s):
    return [str(s["points"]), str(s["priced"]), _pct(s["shape_mean"]), _pct(s["tpot_mape"]),
            _pct(s["tpot_mean_signed"], signed=True), _pct(s["ttft_mape"]), _pct(s["ttft_mean_signed"], signed=True),
            _pct(s["ttft_shape_mean"])]


ERROR_HEADER = ("points", "priced", "TPOT shape", "TPOT MAPE", "TPOT signed", "TTFT MAPE", "TTFT signed", "TTFT shape")


def format_breakdowns(report: AccuracyReport, *, estimate="no_overlap", markdown=False) -> list:
    """Lines: the errors of one estimate by concurrency bucket (C <= 16, <= 64, <= 256, > 256) and
    over the held-out deployments of ``info['split']`` (TPOT shape mean, MAPE, signed; TTFT
    MAPE, signed, shape mean)."""
    lab = ESTIMATE_LABELS[estimate]
    by = report.summarize_by(lambda r: concurrency_bucket(r["concurrency"]), estimate)
    order = [b for b, _ in CONCURRENCY_BUCKETS if b in by] + ["all"]
    lines = ["", f"{lab} by concurrency bucket:"]
    if markdown:
        lines.append("")
    lines += _table(("concurrency", "estimate") + ERROR_HEADER, [(b, lab, *_error_cells(by[b])) for b in order],
                    markdown=markdown, bold_last=True)
    split = report.info.get("split")
    if split and split.get("test"):
        sp = report.split_summary(estimate)
        lines += ["", f"{lab} on the held-out deployments ({len(split['test'])} of "
                      f"{len(split['test']) + len(split['train'])}, {split['how']}): " + ", ".join(split["test"])]
        if markdown:
            lines.append("")
        lines += _table(("deployments", "estimate") + ERROR_HEADER,
                        [(k, lab, *_error_cells(sp[k])) for k in ("train", "test", "all") if k in sp],
                        markdown=markdown, bold_last=True)
    return lines


def format_assumptions(report: AccuracyReport, *, markdown=False) -> list:
    """Lines: the engine settings of each simulated deployment and workload (``batch_rule
    simulate``), and where each came from (the sources once, numbered)."""
    rows = report.info.get("assumptions") or []
    if not rows:
        return []
    keys = ASSUMPTION_KEYS
    labels = ("scheduler", "max_num_seqs", "budget", "gmu", "kv dtype", "block", "graphs", "KV tokens/rank",
              "max_model_len", "prompts", "range", "dp")
    if any("spec_method" in r for r in rows):      # speculating runs: their drafter, k and acceptance
        keys, labels = keys + SPEC_KEYS, labels + ("drafter", "draft tokens k", "acceptance (ASSUMED)")
    sources: dict = {}
    out_rows = []
    for r in rows:
        cells = [r["deployment"], r["workload"][0]]
        for k in keys:
            if k not in r or (k in SPEC_KEYS and "spec_method" not in r):
                cells.append("-")
                continue
            v, src = _settings_value(r, k), r[k][1]
            if k == "kv_capacity_tokens":
                v = f"{v:,.0f}" if isinstance(v, (int, float)) and math.isfinite(v) else str(v)
            ref = sources.setdefault(src, len(sources) + 1)
            cells.append(f"{v} [{ref}]")
        out_rows.append(tuple(str(c) for c in cells))
    lines = ["", "Engine settings of the simulated runs (per deployment, workload and distinct settings; [n]: source "
                 "below):"]
    if markdown:
        lines.append("")
    lines += _table(("deployment", "workload") + labels, out_rows, markdown=markdown)
    lines += ["", "Sources:" if markdown else "sources:"]
    if markdown:
        lines.append("")
    lines += [f"{'' if markdown else '  '}[{n}] {src}" + ("  " if markdown else "") for src, n in sources.items()]
    return lines


def format_report(report: AccuracyReport, *, title="", markdown=False) -> str:
    """The summary table as text (the CLI and experiments print it), or as Markdown.

    One line per estimate (NoOverlap, Overlap) and model, then 'all': points (priced + refused),
    shape error mean / upper median / max / mean over non-anchor points, TPOT MAPE and mean
    signed error, TTFT MAPE, mean signed error and shape error mean / median (TTFT only under
    the ``simulate`` rule; a static rule does not predict it, said so); then the errors by
    concurrency bucket and over the held-out deployments, the refused points with their
    reasons and the notes."""
    head, ttft_note = _report_head(report.info, report)
    cols = ("estimate", "model", "points", "priced", "refused", "shape mean", "shape median", "shape max",
            "shape mean (non-anchor)", "TPOT MAPE", "TPOT signed", "TTFT MAPE", "TTFT signed", "TTFT shape mean",
            "TTFT shape median")
    rows = _summary_rows(report)
    lines = []
    if markdown:
        if title:
            lines += [f"# {title}", ""]
        lines += [head, ""]
        if ttft_note:
            lines += [ttft_note + ".", ""]
        lines += _table(cols, rows, markdown=True, bold_last=True)
    else:
        if title:
            lines.append(title)
        lines.append(head)
        if ttft_note:
            lines.append(ttft_note)
        short = ("estimate", "model", "points", "priced", "refused", "shape", "median", "max", "non-anch",
                 "MAPE", "signed", "TTFT", "signed", "shape", "median")
        widths = [10, max(len(r[1]) for r in rows) + 1] + [7, 7, 8, 7, 7, 8, 9, 7, 8, 8, 8, 7, 7]
        table = _table(short, rows, markdown=False, widths=widths)
        lines.append(table[0] + "   (TPOT shape error: mean, median, max, non-anchor mean; TPOT: MAPE, signed; "
                                "TTFT: MAPE, signed, shape mean, median)")
        lines += table[1:]
    lines += format_breakdowns(report, estimate="no_overlap", markdown=markdown)
    lines += _refused_lines(report, markdown) + _note_lines(report.info, markdown)
    return "\n".join(lines)


def _report_head(info, report):
    """format_report's first line (points, sources, refused, compiles, batch rule) and its TTFT
    note (empty where TTFT is predicted)."""
    head = (f"{report.csv}: {info.get('points', len(report.records))} mean-TPOT points, "
            f"{info.get('sweeps', '?')} sweeps, {info.get('deployments', '?')} deployments "
            f"({len(info.get('from_scenario_files', []))} from scenario files, "
            f"{len(info.get('from_columns', []))} from columns); {len(report.refused)} refused")
    if info.get("extra_coefficient_files"):
        reach = info.get("extra_coefficient_reach") or {}
        head += "; extra coefficients: " + ", ".join(
            f + (f" (reaches {len(reach[f]['reached'])} of {reach[f]['of']} priced deployments"
                 + ("; the rest keep the registry's values)" if len(reach[f]["reached"]) < reach[f]["of"] else ")")
                 if f in reach else "") for f in info["extra_coefficient_files"])
    if info.get("kernel_compiles") is not None:
        head += (f"; {info['kernel_compiles']} kernel compile(s) ("
                 + ("one per deployment)" if info.get("per_deployment") else "one per plan structure)"))
    rule = info.get("batch_rule", "anchor")
    if rule == "simulate":
        head += (f"; batch rule simulate (the serving simulation; {info.get('resident_below_concurrency', '?')} "
                 "point(s) with a mean resident batch below C)")
    elif rule != "anchor":
        head += (f"; batch rule {rule} ({info.get('resident_below_concurrency', '?')} point(s) with a "
                 f"resident batch below C)")
    ttft_note = ("" if info.get("ttft_predicted") else
                 f"TTFT: not predicted under batch rule {rule} (a static rule prices steps, not the queueing and "
                 "prefill before a first token; its TTFT columns are '-' / NaN); --batch-rule simulate predicts it")
    return head, ttft_note


def _summary_rows(report) -> list:
    """One row of cells per estimate and model (then 'all') of the summary table."""
    rows = []
    for e in ESTIMATES:
        for m, s in report.summary[e].items():
            rows.append((ESTIMATE_LABELS[e], m, str(s["points"]), str(s["priced"]), str(s["refused"]),
                         _pct(s["shape_mean"]), _pct(s["shape_median"]), _pct(s["shape_max"]),
                         _pct(s["shape_mean_non_anchor"]), _pct(s["tpot_mape"]),
                         _pct(s["tpot_mean_signed"], signed=True), _pct(s.get("ttft_mape", math.nan)),
                         _pct(s.get("ttft_mean_signed", math.nan), signed=True),
                         _pct(s.get("ttft_shape_mean", math.nan)), _pct(s.get("ttft_shape_median", math.nan))))
    return rows


def _refused_lines(report, markdown) -> list:
    """The refused points grouped by deployment and reason (six line numbers each at most)."""
    if not report.refused:
        return []
    bullet = "- " if markdown else "  "
    n = len(report.refused)
    lines = ["", f"Refused points ({n}):"] if markdown else [f"refused points ({n}):"]
    groups: dict = {}
    for r in report.refused:
        groups.setdefault((r["deployment"], r["reason"]), []).append(r)
    for (dep, reason), rs in groups.items():
        where = ", ".join(f"line {r['row']} ({r['workload']}, C={r['concurrency']})" for r in rs[:6])
        more = f" and {len(rs) - 6} more" if len(rs) > 6 else ""
        lines.append(f"{bullet}{dep}: {len(rs)} point(s) ({where}{more}): {reason}")
    return lines


def _note_lines(info, markdown) -> list:
    """The run's notes, and the sweeps whose anchor_concurrency is not their lowest concurrency."""
    notes = list(info.get("notes", []))
    if info.get("anchor_mismatch"):
        notes.append(f"{len(info['anchor_mismatch'])} sweep(s) whose lowest concurrency in the file is not "
                     f"their anchor_concurrency (shape errors relative to the lowest): "
                     + ", ".join(info["anchor_mismatch"][:5]))
    if info.get("label_mismatch"):
        bad = info["label_mismatch"]
        notes.append(f"{len(bad)} point(s) whose isl or osl contradicts its workload label (the label picks the "
                     f"run's stated engine settings, isl and osl price it; check the file): " + ", ".join(bad[:5])
                     + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))
    if not notes:
        return []
    bullet = "- " if markdown else "  "
    return (["", "Notes:"] if markdown else ["notes:"]) + [bullet + n for n in notes]


def write_points_csv(report: AccuracyReport, path) -> Path:
    """One row per mean-TPOT point (refused ones included, with their reason); floats with 6
    significant digits, times in microseconds, errors as fractions."""
    from .outputs import check_output_file
    path = check_output_file(path, flag="path", what="CSV", writes="CSV")
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


def plot_sweeps(report: AccuracyReport, path, *, estimate="no_overlap", title=None, ncols=None,
                quantity="tpot") -> Path:
    """One small panel per deployment: measured mean TPOT (``quantity='tpot'``) or mean TTFT
    (``'ttft'``; predicted under the ``simulate`` rule only) (markers, one per run of the sweep)
    and the prediction (solid: ``estimate``; dotted: the other estimate) against concurrency
    (log-2 axis), one colour per workload; refused points are black crosses at their
    measurement. Panels run by model, chip and parallelism; each title gives the deployment
    and its TPOT MAPE / mean shape error."""
    if quantity not in ("tpot", "ttft"):
        refuse("unknown quantity (known: tpot, ttft)", field="quantity", value=quantity)
    Q = quantity.upper()
    keys = (("measured_us", "{}_tpot_us", "tpot_mape", "shape_mean") if quantity == "tpot" else
            ("measured_ttft_us", "{}_ttft_us", "ttft_mape", "ttft_shape_mean"))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .outputs import IMAGE_SUFFIXES, check_output_file
    path = check_output_file(path, flag="path", suffixes=IMAGE_SUFFIXES, what="image")
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
    workloads = sorted({r["workload"] for r in report.records})
    colours = {w: WORKLOAD_COLOURS.get(w, f"C{4 + k}") for k, w in enumerate(workloads)}
    by_dep_stats = report.summarize_by("deployment", estimate)
    for ax, (dep, recs) in zip(axes.flat, deps):
        _sweep_panel(ax, dep, recs, by_dep_stats.get(dep), colours, keys, (estimate, other))
    for ax in list(axes.flat)[len(deps):]:
        ax.axis("off")
    handles = _sweep_legend(report, workloads, colours, estimate, other)
    s = report.summary[estimate]["all"]
    rule = report.info.get("batch_rule", "anchor")
    how = (f"the serving simulation (closed loop at C, recipe engine settings), every step priced by "
           f"{ESTIMATE_LABELS[estimate]}" if rule == "simulate" else
           f"{ESTIMATE_LABELS[estimate]} + host_output_token at context isl + osl/2"
           f"{'' if rule == 'anchor' else f' (batch rule {rule})'}")
    fig.suptitle(title or (f"{Path(report.csv).name}: mean {Q} (ms) against concurrency C; predicted = {how}. "
                           f"All {s['points']} points: {Q} MAPE {_pct(s[keys[2]])}, "
                           f"shape error {_pct(s[keys[3]])} (mean)"), fontsize=9, y=1 - 0.06 / height)
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.25 / height))
    fig.supxlabel("concurrency C (requests in flight)", fontsize=8, y=0.1 / height)
    fig.supylabel(f"mean {Q} (ms)", fontsize=8, x=0.004)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _sweep_panel(ax, dep, recs, stats, colours, keys, estimates):
    """One deployment's panel of ``plot_sweeps``: per workload, the measured points of each run
    (a marker shape per run; refused ones as black crosses) and the two predictions (solid,
    dotted) against concurrency; the title its MAPE and mean shape error."""
    import matplotlib
    meas_key, pred_key, mape_key, shape_key = keys
    markers = "o^sDv<>p*h"
    for w in sorted({r["workload"] for r in recs}):
        rw = [r for r in recs if r["workload"] == w]
        col = colours[w]
        for k, scen in enumerate(dict.fromkeys(r["scenario"] for r in rw)):
            rs = sorted((r for r in rw if r["scenario"] == scen), key=lambda r: r["concurrency"])
            good = [r for r in rs if r["status"] == "priced"]
            if good:
                ax.plot([r["concurrency"] for r in good], [r[meas_key] / 1e3 for r in good],
                        markers[k % len(markers)], ms=3.4, color=col, alpha=0.8, mew=0)
            bad = [r for r in rs if r["status"] != "priced"]
            if bad:
                ax.plot([r["concurrency"] for r in bad], [r[meas_key] / 1e3 for r in bad], "x", ms=4, color="k")
        pred = {r["concurrency"]: tuple(r[pred_key.format(e)] / 1e3 for e in estimates)
                for r in rw if r["status"] == "priced"}
        if pred:
            cs = sorted(pred)
            ax.plot(cs, [pred[c][0] for c in cs], "-", lw=1.1, color=col)
            ax.plot(cs, [pred[c][1] for c in cs], ":", lw=0.9, color=col)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    stat = f"\nMAPE {_pct(stats[mape_key])}, shape {_pct(stats[shape_key])}" if stats and stats["priced"] else "\nrefused"
    ax.set_title(dep + stat, fontsize=6.2)
    ax.tick_params(labelsize=5.5, which="both")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))
    ax.grid(True, which="major", lw=0.3, alpha=0.5)


def _sweep_legend(report, workloads, colours, estimate, other) -> list:
    """``plot_sweeps``' legend: a colour per workload, the two predictions, the measurements
    and, where there are any, the refused points."""
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=colours[w], marker="o", ls="-", ms=3, label=w) for w in workloads]
    handles += [Line2D([], [], color="0.3", ls="-", label=f"predicted, {ESTIMATE_LABELS[estimate]}"),
                Line2D([], [], color="0.3", ls=":", label=f"predicted, {ESTIMATE_LABELS[other]}"),
                Line2D([], [], color="0.3", marker="o", ls="", ms=3,
                       label="measured (marker shape: run of the sweep)")]
    if any(r["status"] != "priced" for r in report.records):
        handles.append(Line2D([], [], color="k", marker="x", ls="", label="refused"))
    return handles
