"""Batch files: one step's requests, in YAML or CSV, read into a padded ``Batch``.

YAML, a mapping (or just the list of requests)::

    decode_threshold: 8            # optional: a request scheduling more tokens is a prefill
    requests:
      - {scheduled: 1, computed: 4095, count: 31}   # count: this request, repeated (default 1)
      - {scheduled: 1, computed: 2047}
      - {scheduled: 512, computed: 0, prompt_len: 2048}

CSV: a header naming ``scheduled`` and ``computed`` and, optionally, ``prompt_len`` and
``count``; one request per line (``count`` repeats it). A CSV states no decode threshold (the
caller's ``decode_threshold``, or the default)::

    scheduled,computed,count
    1,4095,31
    512,0,1

``scheduled`` is the tokens the request runs in this step (at least 1), ``computed`` the
tokens already in its cache before the step, ``prompt_len`` its prompt length (recorded,
not priced; default computed + scheduled). Every refusal names the file, the request (YAML
index, or the CSV file as ``file:line``), the field and the value. The fields' ranges are declared
in ``schema.BATCH_FIELDS``: token counts below ``plan.INT_TOKEN_LIMIT``, at most
``schema.MAX_REQUESTS`` requests in a file (counts expanded); a directory, binary content, a key
stated twice and a malformed CSV line are refused like any other bad content.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import schema
from .errors import refuse, shown
from .plan import Batch

#: The decode threshold used when neither the caller nor the file gives one: the value the
#: reference kernel's tests and docs pass, and the one accuracy and fit use.
DEFAULT_DECODE_THRESHOLD = 8

FIELDS = ("scheduled", "computed", "prompt_len", "count")
REQUIRED = ("scheduled", "computed")


class BatchFile(NamedTuple):
    """The requests of a batch file, one entry per request (``count`` expanded)."""
    scheduled: np.ndarray
    computed: np.ndarray
    prompt_len: np.ndarray
    decode_threshold: int | None     # None: the file does not say
    path: str

    @property
    def requests(self) -> int:
        return int(self.scheduled.size)


def _integer(value, *, file, field, minimum, limit=None):
    """An integer >= minimum from a YAML value (int, or an integral float) or a CSV string,
    and within the range ``limit`` (a ``schema.BATCH_FIELDS`` spec) declares."""
    num = None
    if isinstance(value, bool):
        num = None
    elif isinstance(value, (int, np.integer)):
        num = int(value)
    elif isinstance(value, float) and np.isfinite(value) and value == round(value):
        num = int(value)
    elif isinstance(value, str):
        text = value.strip()
        if text == "":
            refuse("is empty; expected an integer", file=file, field=field)
        try:
            num = int(text)
        except ValueError:
            try:
                f = float(text)
                num = int(f) if np.isfinite(f) and f == round(f) else None
            except ValueError:
                num = None
    if num is None:
        refuse("must be an integer token count", file=file, field=field, value=schema.shown(value), has_value=True)
    if num < minimum:
        what = "at least 1 (a request in a step schedules at least one token)" if field.endswith("scheduled") \
            else "at least 1" if minimum == 1 else "non-negative"
        refuse(f"must be {what}", file=file, field=field, value=value, has_value=True)
    if limit is not None:
        schema.number(num, file=file, field=field, **limit.kw)
    return num


def _request(entry: dict, *, file, where):
    F = schema.BATCH_FIELDS
    sched = _integer(entry["scheduled"], file=file, field=f"{where}scheduled", minimum=1, limit=F["scheduled"])
    comp = _integer(entry["computed"], file=file, field=f"{where}computed", minimum=0, limit=F["computed"])
    prompt = entry.get("prompt_len")
    prompt = comp + sched if prompt is None or (isinstance(prompt, str) and not prompt.strip()) else \
        _integer(prompt, file=file, field=f"{where}prompt_len", minimum=0, limit=F["prompt_len"])
    count = entry.get("count")
    count = 1 if count is None or (isinstance(count, str) and not count.strip()) else \
        _integer(count, file=file, field=f"{where}count", minimum=1, limit=F["count"])
    return sched, comp, prompt, count


def _read_yaml(path: Path):
    import yaml
    file = str(path)
    text = schema.read_text(path, what="batch file", missing="no such batch file")
    try:
        docs = schema.load_yaml_documents(text)
    except yaml.YAMLError as err:
        where, problem = schema.yaml_problem(err, column=False)
        refuse(f"is not valid YAML{where}: {problem}", file=file)
    docs = [d for d in docs if d is not None]
    if len(docs) > 1:
        refuse(f"holds {len(docs)} YAML documents; expected one (a list of requests, or a mapping with "
               "'requests')", file=file)
    doc = docs[0] if docs else None
    threshold = None
    if doc is None:
        refuse("is empty; expected a list of requests (scheduled, computed)", file=file)
    if isinstance(doc, dict):
        unknown = sorted(set(doc) - {"requests", "decode_threshold"}, key=str)     # keys of any type: 1, null
        if unknown:
            refuse("unknown key; expected 'requests' and optionally 'decode_threshold'", file=file,
                   field=str(unknown[0]))
        if "requests" not in doc:
            refuse("is missing; expected a list of requests (scheduled, computed)", file=file, field="requests")
        if doc.get("decode_threshold") is not None:
            threshold = _integer(doc["decode_threshold"], file=file, field="decode_threshold", minimum=0,
                                 limit=schema.BATCH_DECODE_THRESHOLD)
        doc = doc["requests"]
    if not isinstance(doc, list):
        refuse("must be a list of requests (mappings with scheduled, computed)", file=file, field="requests",
               value=type(doc).__name__, has_value=True)
    rows = []
    for i, entry in enumerate(doc):
        where = f"requests[{i}]."
        if not isinstance(entry, dict):
            refuse("must be a mapping with scheduled and computed", file=file, field=f"requests[{i}]",
                   value=schema.shown(entry), has_value=True)
        unknown = sorted(set(map(str, entry)) - set(FIELDS))
        if unknown:
            refuse(f"unknown field; expected {', '.join(FIELDS)}", file=file, field=where + unknown[0])
        for name in REQUIRED:
            if name not in entry or entry[name] is None:
                refuse("is missing", file=file, field=where + name)
        rows.append(_request(entry, file=file, where=where))
    return rows, threshold


def _read_csv(path: Path):
    file = str(path)
    numbered = schema.read_csv(path, what="batch file", missing="no such batch file")
    if not numbered:
        refuse("is empty; expected a header (scheduled,computed[,prompt_len][,count]) and one line per request",
               file=file)
    header_line, header = numbered[0]
    header = [h.strip() for h in header]
    if "" in header:
        refuse(f"a column of the header (line {header_line}) has no name, column {header.index('') + 1} of "
               f"{len(header)}; expected {', '.join(FIELDS)}", file=file, value=",".join(header), has_value=True)
    unknown = [h for h in header if h not in FIELDS]
    if unknown:
        hint = ("; a CSV batch states no decode threshold (a column would give one per request): give it "
                "as `jaxprice price --decode-threshold N` or load_batch(decode_threshold=N), or write the batch "
                "as YAML with a top-level decode_threshold") if unknown[0] == "decode_threshold" else ""
        refuse(f"unknown column in the header (line {header_line}); expected {', '.join(FIELDS)}{hint}",
               file=file, field=unknown[0])
    for name in REQUIRED:
        if name not in header:
            refuse(f"missing column in the header (line {header_line}): {', '.join(header) or 'nothing'}",
                   file=file, field=name)
    if len(set(header)) != len(header):
        refuse(f"a column is named twice in the header (line {header_line})", file=file,
               field=next(h for h in header if header.count(h) > 1))
    rows = []
    for line, row in numbered[1:]:
        if len(row) != len(header):
            refuse(f"has {len(row)} values for {len(header)} columns ({', '.join(header)})",
                   file=f"{file}:{line}", value=",".join(row), has_value=True)
        entry = dict(zip(header, row))
        rows.append(_request(entry, file=f"{file}:{line}", where=""))
    return rows, None


def read_batch_file(path, *, field="batch") -> BatchFile:
    """Read a YAML (.yaml, .yml) or CSV (.csv) batch file, refusing bad content clearly (a path
    that is no path, or an empty one, naming ``field``: the CLI's --batch)."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bool):     # 5 was read as a file named '5'
        refuse("expected a batch file path (a str or a path)", field=field, value=shown(path), has_value=True)
    if not str(path).strip():                   # '' was the working folder: 'is a directory'
        refuse("an empty batch file name", field=field, value=str(path), has_value=True)
    p = Path(str(path))
    if p.is_dir():
        refuse("is a directory, expected a batch file", file=str(path))
    if not p.is_file():
        refuse("is not a regular file (a pipe or a device), expected a batch file" if p.exists()
               else "no such batch file", file=str(path))
    suffix = p.suffix.lower()
    if suffix in (".yaml", ".yml"):
        rows, threshold = _read_yaml(p)
    elif suffix == ".csv":
        rows, threshold = _read_csv(p)
    else:
        refuse("unknown batch file type; expected .yaml, .yml or .csv", file=str(path), value=p.suffix or "(none)")
    if not rows:
        refuse("has no requests", file=str(path))
    counts = [r[3] for r in rows]
    if sum(counts) > schema.MAX_REQUESTS:
        refuse(f"holds {sum(counts)} requests (counts expanded); at most {schema.MAX_REQUESTS}", file=str(path),
               field="count")

    def column(i):
        return np.repeat(np.array([r[i] for r in rows], dtype=float), counts)
    return BatchFile(column(0), column(1), column(2), threshold, str(path))


def load_batch(path, *, pad_to=None, decode_threshold=None) -> Batch:
    """A padded ``Batch`` from a YAML or CSV batch file (see the module docstring).

    decode_threshold: None takes the file's ``decode_threshold``, else
    ``DEFAULT_DECODE_THRESHOLD`` (8). pad_to: rows of the batch (default: one per request).
    """
    bf = read_batch_file(path)
    thr = decode_threshold if decode_threshold is not None else \
        bf.decode_threshold if bf.decode_threshold is not None else DEFAULT_DECODE_THRESHOLD
    return Batch.from_requests(bf.scheduled, bf.computed, bf.prompt_len, pad_to=pad_to,
                               decode_threshold=thr, source=bf.path)
