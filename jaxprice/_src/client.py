"""The benchmark client: workloads (request lengths), closed and open loops, trace files.

As InferenceX measured vLLM (serving-reference.md §4-5): ``benchmark_serving.py --dataset-name
random --random-range-ratio 0.8 --num-prompts 10*C --max-concurrency C --request-rate inf
--ignore-eos``: every request generates exactly its output length.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
from pathlib import Path

import numpy as np

from .errors import refuse, shown
from .plan import INT_TOKEN_LIMIT
from .schema import read_text

# Seeds are numpy RandomState seeds: integers in [0, 2**32 - 1].
MAX_SEED = 2**32 - 1
# The most requests one simulated run serves (a trace's rows, --num-prompts, 10 x concurrency): the
# scheduler keeps ~7-8 KB per request, so 2**18 (262144) requests take ~2 GB and a minute or so;
# benchmarks send 10 x concurrency, a few thousand.
MAX_RUN_REQUESTS = 1 << 18
# The most requests of all the runs of one sweep together (its levels' states are held at once):
# two runs at the cap, ~4 GB. A sweep 1,2,...,26214 would otherwise prepare 3.4e9 requests (OOM).
MAX_SWEEP_REQUESTS = 2 * MAX_RUN_REQUESTS
# The latest arrival a run may have (s): 2**33 s, about 272 years. Past it float64 seconds resolve
# steps coarser than 2 us, so step times vanish into the clock (a trace in milliseconds or epoch
# milliseconds, or a near-zero Poisson rate, would give TTFTs below one step's price).
MAX_ARRIVAL_S = float(2 ** 33)
ARRIVAL_WHY = (f"at most 2**33 = {MAX_ARRIVAL_S:.0f} s, about 272 years: past it float64 seconds resolve "
               "steps coarser than 2 us")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _check_seed(seed, source):
    if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
        refuse(f"must be an integer in [0, {MAX_SEED}]", file=source, field="seed", value=seed, has_value=True)


def check_sweep_size(counts, field, value):
    """A sweep whose runs' requests (``counts``, one per run) add up past MAX_SWEEP_REQUESTS is
    refused before any is prepared."""
    total = int(sum(int(c) for c in counts))
    if total > MAX_SWEEP_REQUESTS:
        refuse(f"its {len(counts)} runs hold {total} requests together, past jaxprice's cap of {MAX_SWEEP_REQUESTS} "
               "per sweep (about 4 GB of scheduler state): sweep fewer or smaller loads", field=field, value=value,
               has_value=True)


def _check_run_size(n, source, field, value, what=""):
    """A run of n requests past MAX_RUN_REQUESTS is refused before the scheduler allocates for it."""
    if n > MAX_RUN_REQUESTS:
        refuse(f"{what}exceeds jaxprice's cap of {MAX_RUN_REQUESTS} requests per simulated run (about 2 GB "
               "of scheduler state)", file=source, field=field, value=value, has_value=True)


@dataclasses.dataclass(frozen=True)
class Workload:
    """Request lengths: input ``isl`` and output ``osl`` tokens.

    ``range_ratio`` r follows InferenceX's ``--random-range-ratio`` (its benchmark_serving.py
    fork, unchanged since 2026-01; vLLM's older benchmark_serving.py alike): each request's
    input length is a uniform integer on [floor(r * isl), isl] and its output length,
    independently, a uniform integer on [floor(r * osl), osl] (``np.random.randint(lower, upper + 1)``
    with a ``RandomState(seed)``, inputs drawn before outputs). r = 1 gives fixed lengths. The
    default 0.8 is what InferenceX's workflow passes for every measured run
    (``RANDOM_RANGE_RATIO: 0.8``), so the simulated means (e.g. isl 1024 -> mean 921.5) match
    what was measured. (Recent ``vllm bench serve`` means [L(1-r), L(1+r)] instead; not this.)
    """
    isl: int
    osl: int
    range_ratio: float = 0.8
    seed: int = 0

    def validate(self, source="workload"):
        for name in ("isl", "osl"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                refuse("must be an integer >= 1", file=source, field=name, value=v, has_value=True)
            if v >= INT_TOKEN_LIMIT:
                refuse(f"must be below the kernel's token limit {INT_TOKEN_LIMIT} (2**24)", file=source, field=name,
                       value=v, has_value=True)
        r = self.range_ratio
        if not (_is_real(r) and math.isfinite(r) and 0 <= r <= 1):
            refuse("must be a number in [0, 1]", file=source, field="range_ratio", value=r, has_value=True)
        _check_seed(self.seed, source)

    def lengths(self, n: int):
        """(input_len, output_len) int arrays of n requests, as described above."""
        self.validate()
        if not _is_int(n) or n < 0:
            refuse("must be an integer >= 0 (requests)", file="workload", field="n", value=n, has_value=True)
        _check_run_size(n, "workload", "n", n)
        rng = np.random.RandomState(int(self.seed))
        lo_i, lo_o = max(int(self.isl * self.range_ratio), 1), max(int(self.osl * self.range_ratio), 1)
        if self.range_ratio >= 1:
            return np.full(n, self.isl, np.int64), np.full(n, self.osl, np.int64)
        ins = rng.randint(lo_i, self.isl + 1, size=n).astype(np.int64)
        outs = rng.randint(lo_o, self.osl + 1, size=n).astype(np.int64)
        return ins, outs


@dataclasses.dataclass(frozen=True)
class ClosedLoop:
    """``concurrency`` clients: all send at t = 0, each sends its next request the moment its
    last one completes, until ``num_prompts`` (default 10 x concurrency) were sent. Fewer prompts
    than clients are refused by simulate, build_schedule and simulate_sweep
    (``check_clients_send``): only num_prompts clients would ever send."""
    concurrency: int
    num_prompts: int | None = None

    @property
    def prompts(self) -> int:
        return int(self.num_prompts) if self.num_prompts is not None else 10 * int(self.concurrency)

    def validate(self, source="client"):
        c = self.concurrency
        if not _is_int(c) or c < 1:
            refuse("must be an integer >= 1", file=source, field="concurrency", value=c, has_value=True)
        if self.num_prompts is not None and (not _is_int(self.num_prompts) or self.num_prompts < 1):
            refuse("must be an integer >= 1", file=source, field="num_prompts", value=self.num_prompts, has_value=True)
        if self.num_prompts is not None:
            _check_run_size(self.num_prompts, source, "num_prompts", self.num_prompts)
        else:
            _check_run_size(10 * c, source, "concurrency", c, f"its default num_prompts, 10 x {c} = {10 * c}, ")


def check_clients_send(client, source="client") -> None:
    """Refuse a closed loop of fewer prompts than clients, ``ClosedLoop(4, num_prompts=2)``: the
    benchmark client (serving-reference §4.2) sends num_prompts requests under a
    ``Semaphore(max_concurrency)``, so only those 2 would ever be in flight, a run of 2 clients
    read as 4 (the commands refuse ``--num-prompts`` below ``--concurrency`` alike). Anything
    else about the client is ``validate``'s to refuse."""
    if not isinstance(client, ClosedLoop):
        return
    c, n = client.concurrency, client.num_prompts
    if n is not None and _is_int(c) and _is_int(n) and 1 <= n < c:
        refuse(f"is fewer than the {c} clients of concurrency {c}: only {n} would ever send (the benchmark sends "
               f"num_prompts requests under a semaphore of max_concurrency), yet the run would read as C={c}; give "
               f"num_prompts >= {c} (default 10 x concurrency) or ClosedLoop({n})", file=source, field="num_prompts",
               value=n, has_value=True)


@dataclasses.dataclass(frozen=True)
class OpenLoop:
    """Poisson arrivals at ``rate`` requests/s (exponential gaps, ``RandomState(seed)``), the
    first at its first gap; ``num_prompts`` requests."""
    rate: float
    num_prompts: int
    seed: int = 0

    def validate(self, source="client"):
        r = self.rate
        if not (_is_real(r) and math.isfinite(r) and r > 0):
            refuse("must be a number > 0 (requests/s)", file=source, field="rate", value=r, has_value=True)
        if not _is_int(self.num_prompts) or self.num_prompts < 1:
            refuse("must be an integer >= 1", file=source, field="num_prompts", value=self.num_prompts, has_value=True)
        _check_run_size(self.num_prompts, source, "num_prompts", self.num_prompts)
        _check_seed(self.seed, source)

    def arrivals(self):
        self.validate()
        # the arrivals' stream, apart from the lengths' (seed + 7919, wrapped into RandomState's range)
        rng = np.random.RandomState((int(self.seed) + 7919) % (MAX_SEED + 1))
        arrivals = np.cumsum(rng.exponential(1.0 / float(self.rate), size=int(self.num_prompts)))
        if not arrivals[-1] <= MAX_ARRIVAL_S:
            refuse(f"too low: its {int(self.num_prompts)} arrivals reach {arrivals[-1]:.3g} s, and arrival times "
                   f"must be {ARRIVAL_WHY}", file="client", field="rate", value=self.rate, has_value=True)
        return arrivals


@dataclasses.dataclass(frozen=True)
class Trace:
    """Requests with given arrival times (s) and lengths (an open loop); sorted by arrival."""
    arrival_s: tuple
    input_len: tuple
    output_len: tuple
    source: str = "trace"

    def __post_init__(self):
        src = self.source
        if src is None or (isinstance(src, str) and not src.strip()):
            src = "trace"                       # unnamed: the default name
        elif isinstance(src, os.PathLike):
            src = os.fspath(src)
        if not isinstance(src, str):            # a number or a list named the trace in every refusal
            refuse("must be a name or a path (a str) saying where the trace came from", field="Trace.source",
                   value=shown(src), has_value=True)
        object.__setattr__(self, "source", src)
        a, i, o = (_trace_column(getattr(self, k), src, k) for k in ("arrival_s", "input_len", "output_len"))
        if not (a.shape == i.shape == o.shape) or a.ndim != 1 or a.size == 0:
            refuse("arrival_s, input_len and output_len must be equal-length non-empty lists", file=src,
                   field="Trace")
        _check_run_size(a.size, src, "Trace", a.size, "the trace's request count ")
        bad = np.flatnonzero(~(np.isfinite(a) & (a >= 0) & (a <= MAX_ARRIVAL_S)))
        if bad.size:
            k = int(bad[0])
            refuse(f"an arrival time must be a finite number of seconds >= 0 and {ARRIVAL_WHY}", file=src,
                   field=f"arrival_s[{k}]", value=float(a[k]), has_value=True)
        for name, x in (("input_len", i), ("output_len", o)):
            bad = np.flatnonzero(~(np.isfinite(x) & (x == np.round(x)) & (x >= 1) & (x < INT_TOKEN_LIMIT)))
            if bad.size:
                k = int(bad[0])
                refuse(f"a token count must be an integer >= 1 and below the kernel's limit {INT_TOKEN_LIMIT}",
                       file=src, field=f"{name}[{k}]", value=x[k].item(), has_value=True)
        order = np.argsort(a, kind="stable")
        object.__setattr__(self, "arrival_s", tuple(a[order].tolist()))
        object.__setattr__(self, "input_len", tuple(int(x) for x in i[order]))
        object.__setattr__(self, "output_len", tuple(int(x) for x in o[order]))

    @property
    def num_prompts(self):
        return len(self.arrival_s)

    def validate(self, source=None):
        return None


def _trace_column(values, source, field):
    """A Trace column as a float64 array, or refused: it must hold numbers (not text, not booleans)."""
    try:
        arr = np.asarray(values)
        if arr.dtype.kind == "O":        # e.g. an int past int64: still a number, refused by its range
            arr = arr.astype(float)
    except (TypeError, ValueError, OverflowError):
        refuse("must be a list of numbers", file=source, field=field, value=str(values)[:80], has_value=True)
    if arr.dtype.kind not in "iuf":
        refuse("must be a list of numbers", file=source, field=field,
               value=arr.ravel()[0].item() if arr.size else values, has_value=True)
    return arr.astype(float)


_TRACE_COLUMNS = ("arrival_s", "input_len", "output_len")


def load_trace(path) -> Trace:
    """A trace CSV with a header ``arrival_s,input_len,output_len`` (seconds, tokens, tokens).
    A bad row is refused naming the file, its row (line), the column and the value."""
    p = _trace_file(path)
    with io.StringIO(read_text(p, what="trace file"), newline="") as fh:   # binary, non-UTF-8: refused
        reader = csv.reader(fh)
        header = _trace_header(reader, p)
        arr, ins, outs = _trace_requests(reader, header, p)
    if not arr:
        refuse("trace file has no requests", file=str(p))
    return Trace(tuple(arr), tuple(ins), tuple(outs), source=str(p))


def _trace_file(path) -> Path:
    """``path`` as a Path to an existing regular file, or refused (not a path, an empty name, a
    folder, a device or a pipe, missing)."""
    if not isinstance(path, (str, os.PathLike)):
        refuse("expected a trace file path", field="trace", value=path, has_value=True)
    p = Path(path)
    if str(path).strip() == "":
        refuse("an empty trace file name", field="--trace", value=str(path), has_value=True)
    if p.is_dir():
        refuse("is a folder, not a trace file", file=str(path))
    if p.exists() and not p.is_file():
        refuse("is not a regular file (a device or a pipe); expected a trace CSV", file=str(path))
    if not p.is_file():
        refuse("no such trace file", file=str(path))
    return p


def _trace_header(reader, p) -> list:
    """The header row's column names (stripped): exactly arrival_s, input_len and output_len, once
    each, in any order; refused at line 1 otherwise (missing, then unknown, then repeated)."""
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        refuse("empty trace file (expected a header arrival_s,input_len,output_len)", file=str(p))
    missing = [c for c in _TRACE_COLUMNS if c not in header]
    if missing:
        refuse(f"missing column(s) {', '.join(missing)} (expected arrival_s,input_len,output_len)",
               file=f"{p}:1", field="header", value=",".join(header))
    unknown = [c for c in header if c not in _TRACE_COLUMNS]
    if unknown:
        refuse(f"unknown column {unknown[0]!r} (a trace has exactly arrival_s,input_len,output_len)",
               file=f"{p}:1", field="header", value=",".join(header))
    dup = [c for c in _TRACE_COLUMNS if header.count(c) > 1]
    if dup:
        refuse(f"column {dup[0]!r} appears twice", file=f"{p}:1", field="header", value=",".join(header))
    return header


def _trace_requests(reader, header, p) -> tuple:
    """The rows after the header as (arrival times, input lengths, output lengths); blank rows are
    skipped, and arrival times must not decrease (an unsorted trace is refused, not sorted)."""
    col = {c: header.index(c) for c in _TRACE_COLUMNS}
    arr, ins, outs = [], [], []
    for line, row in enumerate(reader, start=2):
        if not row or all(not x.strip() for x in row):
            continue
        where = f"{p}:{line}"
        _check_trace_row(row, header, len(arr), line, where)
        vals = {c: _trace_value(row, col[c], c, where) for c in _TRACE_COLUMNS}
        if arr and vals["arrival_s"] < arr[-1]:
            refuse(f"arrival times must not decrease (the row before arrives at {arr[-1]:g} s); unsorted "
                   "traces are refused, not sorted: sort the file by arrival_s", file=where, field="arrival_s",
                   value=row[col["arrival_s"]].strip())
        arr.append(vals["arrival_s"])
        ins.append(int(vals["input_len"]))
        outs.append(int(vals["output_len"]))
    return arr, ins, outs


def _check_trace_row(row, header, count, line, where):
    """Refuse a row with more values than the header names, or one past MAX_RUN_REQUESTS (``count``
    requests read before it)."""
    if len(row) > len(header):
        refuse(f"row has {len(row)} values but the header names {len(header)} columns "
               f"({','.join(header)}): extra value {row[len(header)].strip()!r}", file=where,
               field="row", value=",".join(row))
    if count >= MAX_RUN_REQUESTS:
        refuse(f"trace has more than {MAX_RUN_REQUESTS} requests, jaxprice's cap on one run", file=where,
               field="row", value=line)


def _trace_value(row, index, column, where) -> float:
    """The number in ``row[index]`` (the column ``column``), checked: an arrival time in seconds within
    the float64 clock, or a token count below the kernel's limit."""
    if index >= len(row):
        # named the row, not 'value None'
        refuse(f"row too short: {len(row)} value(s), no {column}", file=where, field="row", value=",".join(row))
    text = row[index].strip()
    try:
        v = float(text)
    except ValueError:
        refuse("expected a number", file=where, field=column, value=text)
    if column == "arrival_s":
        if not (math.isfinite(v) and v >= 0):
            refuse("arrival time must be a finite number >= 0 (seconds)", file=where, field=column, value=text)
        if v > MAX_ARRIVAL_S:
            refuse(f"arrival time must be {ARRIVAL_WHY} (seconds, not milliseconds; subtract the "
                   "first arrival from absolute timestamps)", file=where, field=column, value=text)
    else:
        if not (math.isfinite(v) and v == round(v) and v >= 1):
            refuse("token count must be an integer >= 1", file=where, field=column, value=text)
        if v >= INT_TOKEN_LIMIT:
            refuse(f"token count must be below the kernel's limit {INT_TOKEN_LIMIT}",
                   file=where, field=column, value=text)
    return v
