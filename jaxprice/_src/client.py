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
from pathlib import Path

import numpy as np

from .errors import refuse
from .plan import INT_TOKEN_LIMIT
from .schema import read_text

# Seeds are numpy RandomState seeds: integers in [0, 2**32 - 1].
MAX_SEED = 2**32 - 1
# The most requests one simulated run serves (a trace's rows, --num-prompts, 10 x concurrency): the
# scheduler keeps ~7-8 KB per request, so 2**18 (262144) requests take ~2 GB and a minute or so;
# benchmarks send 10 x concurrency, a few thousand.
MAX_RUN_REQUESTS = 1 << 18


def _check_seed(seed, source):
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        refuse(f"must be an integer in [0, {MAX_SEED}]", file=source, field="seed", value=seed, has_value=True)


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
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                refuse("must be an integer >= 1", file=source, field=name, value=v, has_value=True)
        r = self.range_ratio
        if not (isinstance(r, (int, float)) and math.isfinite(r) and 0 <= r <= 1):
            refuse("must be a number in [0, 1]", file=source, field="range_ratio", value=r, has_value=True)
        _check_seed(self.seed, source)

    def lengths(self, n: int):
        """(input_len, output_len) int arrays of n requests, as described above."""
        self.validate()
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
    last one completes, until ``num_prompts`` (default 10 x concurrency) were sent."""
    concurrency: int
    num_prompts: int | None = None

    @property
    def prompts(self) -> int:
        return int(self.num_prompts) if self.num_prompts is not None else 10 * int(self.concurrency)

    def validate(self, source="client"):
        c = self.concurrency
        if not isinstance(c, (int, np.integer)) or isinstance(c, bool) or c < 1:
            refuse("must be an integer >= 1", file=source, field="concurrency", value=c, has_value=True)
        if self.num_prompts is not None and (not isinstance(self.num_prompts, (int, np.integer)) or self.num_prompts < 1):
            refuse("must be an integer >= 1", file=source, field="num_prompts", value=self.num_prompts, has_value=True)
        if self.num_prompts is not None:
            _check_run_size(self.num_prompts, source, "num_prompts", self.num_prompts)
        else:
            _check_run_size(10 * c, source, "concurrency", c, f"its default num_prompts, 10 x {c} = {10 * c}, ")


@dataclasses.dataclass(frozen=True)
class OpenLoop:
    """Poisson arrivals at ``rate`` requests/s (exponential gaps, ``RandomState(seed)``), the
    first at its first gap; ``num_prompts`` requests."""
    rate: float
    num_prompts: int
    seed: int = 0

    def validate(self, source="client"):
        r = self.rate
        if not (isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) and r > 0):
            refuse("must be a number > 0 (requests/s)", file=source, field="rate", value=r, has_value=True)
        if not isinstance(self.num_prompts, (int, np.integer)) or self.num_prompts < 1:
            refuse("must be an integer >= 1", file=source, field="num_prompts", value=self.num_prompts, has_value=True)
        _check_run_size(self.num_prompts, source, "num_prompts", self.num_prompts)
        _check_seed(self.seed, source)

    def arrivals(self):
        self.validate()
        # the arrivals' stream, apart from the lengths' (seed + 7919, wrapped into RandomState's range)
        rng = np.random.RandomState((int(self.seed) + 7919) % (MAX_SEED + 1))
        return np.cumsum(rng.exponential(1.0 / self.rate, size=int(self.num_prompts)))


@dataclasses.dataclass(frozen=True)
class Trace:
    """Requests with given arrival times (s) and lengths (an open loop); sorted by arrival."""
    arrival_s: tuple
    input_len: tuple
    output_len: tuple
    source: str = "trace"

    def __post_init__(self):
        a = np.asarray(self.arrival_s, float)
        i = np.asarray(self.input_len)
        o = np.asarray(self.output_len)
        if not (a.shape == i.shape == o.shape) or a.ndim != 1 or a.size == 0:
            refuse("arrival_s, input_len and output_len must be equal-length non-empty lists", file=self.source,
                   field="Trace")
        _check_run_size(a.size, self.source, "Trace", a.size, "the trace's request count ")
        order = np.argsort(a, kind="stable")
        object.__setattr__(self, "arrival_s", tuple(a[order].tolist()))
        object.__setattr__(self, "input_len", tuple(int(x) for x in i[order]))
        object.__setattr__(self, "output_len", tuple(int(x) for x in o[order]))

    @property
    def num_prompts(self):
        return len(self.arrival_s)

    def validate(self, source=None):
        return None


def load_trace(path) -> Trace:
    """A trace CSV with a header ``arrival_s,input_len,output_len`` (seconds, tokens, tokens).
    A bad row is refused naming the file, its row (line), the column and the value."""
    p = Path(path)
    if str(path).strip() == "":
        refuse("an empty trace file name", field="--trace", value=str(path), has_value=True)
    if p.is_dir():
        refuse("is a folder, not a trace file", file=str(path))
    if not p.is_file():
        refuse("no such trace file", file=str(path))
    with io.StringIO(read_text(p, what="trace file"), newline="") as fh:   # binary, non-UTF-8: refused
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            refuse("empty trace file (expected a header arrival_s,input_len,output_len)", file=str(p))
        need = ("arrival_s", "input_len", "output_len")
        missing = [c for c in need if c not in header]
        if missing:
            refuse(f"missing column(s) {', '.join(missing)} (expected arrival_s,input_len,output_len)",
                   file=f"{p}:1", field="header", value=",".join(header))
        unknown = [c for c in header if c not in need]
        if unknown:
            refuse(f"unknown column {unknown[0]!r} (a trace has exactly arrival_s,input_len,output_len)",
                   file=f"{p}:1", field="header", value=",".join(header))
        dup = [c for c in need if header.count(c) > 1]
        if dup:
            refuse(f"column {dup[0]!r} appears twice", file=f"{p}:1", field="header", value=",".join(header))
        col = {c: header.index(c) for c in need}
        arr, ins, outs = [], [], []
        for line, row in enumerate(reader, start=2):
            if not row or all(not x.strip() for x in row):
                continue
            where = f"{p}:{line}"
            if len(row) > len(header):
                refuse(f"row has {len(row)} values but the header names {len(header)} columns "
                       f"({','.join(header)}): extra value {row[len(header)].strip()!r}", file=where,
                       field="row", value=",".join(row))
            if len(arr) >= MAX_RUN_REQUESTS:
                refuse(f"trace has more than {MAX_RUN_REQUESTS} requests, jaxprice's cap on one run", file=where,
                       field="row", value=line)
            vals = {}
            for c in need:
                if col[c] >= len(row):
                    refuse("row too short", file=where, field=c, value=None, has_value=True)
                text = row[col[c]].strip()
                try:
                    v = float(text)
                except ValueError:
                    refuse("expected a number", file=where, field=c, value=text)
                if c == "arrival_s":
                    if not (math.isfinite(v) and v >= 0):
                        refuse("arrival time must be a finite number >= 0 (seconds)", file=where, field=c, value=text)
                else:
                    if not (math.isfinite(v) and v == round(v) and v >= 1):
                        refuse("token count must be an integer >= 1", file=where, field=c, value=text)
                    if v >= INT_TOKEN_LIMIT:
                        refuse(f"token count must be below the kernel's limit {INT_TOKEN_LIMIT}",
                               file=where, field=c, value=text)
                vals[c] = v
            if arr and vals["arrival_s"] < arr[-1]:
                refuse(f"arrival times must not decrease (the row before arrives at {arr[-1]:g} s); unsorted "
                       "traces are refused, not sorted: sort the file by arrival_s", file=where, field="arrival_s",
                       value=row[col["arrival_s"]].strip())
            arr.append(vals["arrival_s"])
            ins.append(int(vals["input_len"]))
            outs.append(int(vals["output_len"]))
    if not arr:
        refuse("trace file has no requests", file=str(p))
    return Trace(tuple(arr), tuple(ins), tuple(outs), source=str(p))
