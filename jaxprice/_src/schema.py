"""Declared schemas: every input document is checked against one before anything resolves it.

A malformed input is refused in one line naming the file, the path of the field
(``Deployment.pools[0].engine.gpu_memory_utilization``) and the offending value, through
``errors.refuse``. Types, required keys, ranges and allowed values are declared here, one
schema per format; the loaders in formats.py, batchfile.py and accuracy.py call them first, so
the rest of the code reads documents whose shape is known. NaN and infinity are refused
everywhere, and so is any number of magnitude 2**53 or more (``NUMBER_LIMIT``: integers stop
being exact in float64 there, and no figure in any registry comes near it).

Primitives, for any reader (a trace CSV, a Hugging Face config.json, ...). Each returns the
checked value (ints as ``int``) or raises ``JaxpriceError``; ``file`` and ``field`` name the place:

* ``number(value, file=, field=, integer=False, minimum=None, above=None, maximum=None,
  below=None, text=False)``: a finite real (never a bool), optionally an integer and in range
  (``minimum``/``maximum`` inclusive, ``above``/``below`` exclusive); ``text=True`` also parses a
  string (a CSV cell). Shorthands: ``positive_int`` (a count or width >= 1), ``count`` (an
  integer >= 0), ``token_count`` (an integer in [0, plan.INT_TOKEN_LIMIT)), ``fraction`` (in
  (0, 1]), ``positive`` (a rate or bandwidth > 0, finite), ``non_negative``.
* ``string(value, file=, field=, choices=None)`` and ``boolean(value, file=, field=)``.
* ``read_text(path, what=..., missing=...)``: a file's text, refusing a missing path, a
  directory, an unreadable file and binary content (NUL bytes, not UTF-8).
* ``load_yaml_documents(text)``: YAML documents with duplicate keys refused (raises
  ``yaml.YAMLError``; ``yaml_problem(err)`` words it); ``read_json(path)``: a JSON file, with
  syntax errors and duplicate keys refused in one line.
* ``read_csv(path, what=...)``: ``[(line number, [cells])]`` of a text CSV, blank lines and
  ``#`` comment lines skipped; ``read_table(path, columns, required=, what=)``: a CSV with a
  header, each row checked against ``{column: Spec}`` -> ``[(line, {column: value})]``.

Specs (``Num``, ``Int``, ``Str``, ``Bool``, ``Map``, ``Dict``, ``List``, ``Either``, ``Any``,
``Custom``) compose into schemas; ``check(doc, spec, file=, path=)`` walks a document. The
format schemas: ``check_scenario`` (the Scenario + Deployment pair, every pool),
``check_model_graph`` (project and public graphs), ``check_chips`` / ``check_public_chip`` /
``check_public_network``, ``check_coefficient_set`` (both formats; each value's range follows
its units), ``BATCH_FIELDS`` (batch files, read by batchfile.py) and
``check_measurement_file`` (the measured-latency CSV accuracy.py reads).
"""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
import os
from pathlib import Path

import yaml

from .errors import JaxpriceError, refuse
from .plan import INT_TOKEN_LIMIT

NUMBER_LIMIT = 2 ** 53
WIDTH_LIMIT = 1 << 16           # ranks in one parallel dimension, nodes, GPUs per node
DIM_LIMIT = 1 << 31             # a graph dimension (hidden size, experts, heads, ...)
REPEAT_LIMIT = 10_000           # repeats of a stack pattern (layers are expanded into a list)
SPEC_TOKEN_LIMIT = 1024         # speculative tokens per step
MAX_REQUESTS = 1 << 20          # requests in one batch file, counts expanded

# ----------------------------------------------------------------------------- primitives


def shown(value):
    """The value as an error message shows it: itself when short, else a short description
    (a whole section pasted into one line helps nobody)."""
    try:
        text = repr(value)
    except Exception:                                   # pragma: no cover - exotic objects
        return f"<{type(value).__name__}>"
    if len(text) <= 80:
        return value
    if isinstance(value, (dict, list, tuple)):
        return f"<a {type(value).__name__} of {len(value)} items>"
    return text[:60] + "..."


def _range_text(value, minimum, above, maximum, below):
    """The broken bound, worded: the lower one when the value is below it, else the upper."""
    if above == 0 and maximum == 1:
        return "must be a fraction in (0, 1]"
    if minimum is not None and value < minimum:
        return f"must be >= {minimum}"
    if above is not None and value <= above:
        return f"must be > {above}"
    if maximum is not None and value > maximum:
        return f"must be <= {maximum}"
    return f"must be below {below}"


def number(value, *, file=None, field=None, integer=False, minimum=None, above=None, maximum=None,
           below=None, text=False, why=""):
    """A finite number (int or float, never a bool) in range; see the module docstring."""
    raw = value
    if text and isinstance(value, str):
        t = value.strip()
        if t == "":
            refuse("is empty; expected a number", file=file, field=field, value=raw, has_value=True)
        try:
            value = int(t)
        except ValueError:
            try:
                value = float(t)
            except ValueError:
                refuse("expected a number", file=file, field=field, value=raw, has_value=True)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        refuse("expected a number", file=file, field=field, value=shown(raw), has_value=True)
    if isinstance(value, numbers.Integral):
        value = int(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            refuse("expected a finite number", file=file, field=field, value=raw, has_value=True)
    if abs(value) >= NUMBER_LIMIT:
        refuse(f"is out of range (numbers must be below 2**53 in magnitude){why}", file=file, field=field,
               value=shown(raw), has_value=True)
    if integer:
        if value != int(value):
            refuse("expected an integer", file=file, field=field, value=raw, has_value=True)
        value = int(value)
    low = (minimum is not None and value < minimum) or (above is not None and value <= above)
    if low or (maximum is not None and value > maximum) or (below is not None and value >= below):
        if low and why == TOKEN_WHY:       # the token limit explains the upper bound, not "must be >= 1"
            why = ""
        refuse(_range_text(value, minimum, above, maximum, below) + why, file=file, field=field, value=raw,
               has_value=True)
    return value


def positive_int(value, **kw):
    """A count or width: an integer >= 1."""
    return number(value, integer=True, minimum=1, **kw)


def count(value, **kw):
    """An integer >= 0."""
    return number(value, integer=True, minimum=0, **kw)


TOKEN_WHY = f" (the kernel's token limit, plan.INT_TOKEN_LIMIT = 2**{INT_TOKEN_LIMIT.bit_length() - 1})"


def token_count(value, *, minimum=0, **kw):
    """A length or token count: an integer in [minimum, INT_TOKEN_LIMIT)."""
    return number(value, integer=True, minimum=minimum, below=INT_TOKEN_LIMIT, why=TOKEN_WHY, **kw)


def fraction(value, **kw):
    """A fraction in (0, 1]."""
    return number(value, above=0, maximum=1, **kw)


def positive(value, **kw):
    """A rate or bandwidth: finite and > 0."""
    return number(value, above=0, **kw)


def non_negative(value, **kw):
    return number(value, minimum=0, **kw)


def string(value, *, file=None, field=None, choices=None, message=None):
    if not isinstance(value, str):
        refuse(message or "expected a string", file=file, field=field, value=shown(value), has_value=True)
    if choices is not None and value not in choices:
        refuse(f"unknown value (known: {', '.join(map(str, choices))})", file=file, field=field,
               value=shown(value), has_value=True)
    return value


def boolean(value, *, file=None, field=None, message=None):
    if not isinstance(value, bool):
        refuse(message or "expected true or false", file=file, field=field, value=shown(value),
               has_value=True)
    return value


# ----------------------------------------------------------------------------- files


# The most bytes an input file may hold: far past any scenario, graph, batch, trace or measurement file
# (a batch file of MAX_REQUESTS lines is ~20 MB); a device such as /dev/zero would otherwise be read forever.
MAX_FILE_BYTES = 1 << 30


def refuse_empty_name(path, what="file", field=None) -> None:
    """An empty (or blank) file name is refused as one: '' was Path('.'), the working folder,
    and read as 'is a directory' or 'file not found' with no name to show."""
    if not str(path).strip():
        refuse(f"an empty file name; expected a {what}", field=field, value=str(path), has_value=True)


def read_bytes(path, *, what="file", missing="file not found") -> bytes:
    """A file's bytes, refused in one line when it is missing, a directory, a device, unreadable or
    larger than MAX_FILE_BYTES (a pipe is read, up to that size)."""
    import stat
    p = Path(str(path))
    file = str(path)
    refuse_empty_name(path, what)
    if p.is_dir():
        refuse(f"is a directory, expected a {what}", file=file)
    try:
        mode = p.stat().st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
            refuse(f"is a device, not a file; expected a {what}", file=file)
        with open(p, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        refuse(missing, file=file)
    except OSError as err:
        refuse(f"cannot read the {what} ({err.strerror or type(err).__name__})", file=file)
    if len(data) > MAX_FILE_BYTES:
        refuse(f"is larger than {MAX_FILE_BYTES >> 20} MiB; expected a {what}", file=file)
    return data


def read_text(path, *, what="file", missing="file not found", allow_empty=True) -> str:
    """A file's text (UTF-8), refused in one line when it is missing, a directory, a device,
    unreadable or binary."""
    file = str(path)
    data = read_bytes(path, what=what, missing=missing)
    if b"\x00" in data:
        at = data.index(b"\x00")
        refuse(f"is not a text file (a NUL byte at offset {at}); expected a {what}", file=file)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        refuse(f"is not UTF-8 text (byte {err.start}); expected a {what}", file=file)
    if not allow_empty and not text.strip():
        refuse(f"is empty; expected a {what}", file=file)
    return text


_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictLoader(_BASE_LOADER):
    """The safe loader (libyaml's when present), refusing a key stated twice in one mapping
    (plain YAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found an unhashable key ({type(key).__name__})", key_node.start_mark)
                if dup:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        """An integer, refused as bad YAML (not a ValueError traceback) past Python's 4300-digit limit."""
        try:
            return super().construct_yaml_int(node)
        except ValueError as err:
            raise yaml.constructor.ConstructorError(None, None, f"an integer too long to read "
                                                    f"({str(err).split(';')[0]})", node.start_mark)


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)


# Aliases may repeat a written value (a merge key, a request used twice) but not multiply the document:
# nested aliases of aliases ("billion laughs") expand 9 lines into 10**9 values, which a refusal
# quoting the value would then try to print.
ALIAS_EXPANSION_LIMIT = 100_000


def _expanded_size(doc) -> tuple[int, int]:
    """(values the document holds with every alias expanded, distinct containers), in time linear in
    what was written (shared containers are counted once, their expansion memoised); raises
    yaml.YAMLError for an alias that contains itself."""
    memo, active, stack = {}, set(), [(doc, False)]
    while stack:
        node, done = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        key = id(node)
        children = list(node.keys()) + list(node.values()) if isinstance(node, dict) else node
        if done:
            active.discard(key)
            memo[key] = 1 + sum(memo.get(id(c), 1) for c in children)
            continue
        if key in memo:
            continue
        if key in active:
            raise yaml.YAMLError("an alias refers to a value that contains it (a recursive alias)")
        active.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if isinstance(c, (dict, list)) and id(c) not in memo)
    return memo.get(id(doc), 1), len(memo)


def load_yaml_documents(text) -> list:
    """Every document of a YAML stream (None for empty ones), duplicate keys refused, and aliases
    that multiply the document (more than ALIAS_EXPANSION_LIMIT values and ten times what is
    written) or refer to themselves refused.
    Raises yaml.YAMLError (a RecursionError from absurd nesting is turned into one)."""
    try:
        docs = list(yaml.load_all(text, Loader=StrictLoader))
    except RecursionError:
        raise yaml.YAMLError("the YAML is nested too deeply")
    if "*" in text:          # no alias, nothing shared: skip the walk
        for i, doc in enumerate(docs):
            size, written = _expanded_size(doc)
            if size > max(ALIAS_EXPANSION_LIMIT, 10 * written):
                raise yaml.YAMLError(f"aliases expand document {i + 1} to {size} values from {written} lists and "
                                     "mappings written (nested aliases of aliases)")
    return docs


def yaml_problem(err, *, column=True) -> tuple[str, str]:
    """(' at line L, column C', problem) of a yaml.YAMLError, for a one-line message."""
    mark = getattr(err, "problem_mark", None)
    where = ""
    if mark is not None:
        where = f" at line {mark.line + 1}" + (f", column {mark.column + 1}" if column else "")
    problem = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
    return where, problem


def read_json(path, *, what="JSON file"):
    """A JSON document; syntax errors, duplicate keys, NaN/Infinity literals refused."""
    text = read_text(path, what=what, allow_empty=False)

    def pairs(items):
        out = {}
        for k, v in items:
            if k in out:
                refuse("duplicate key in a JSON object", file=str(path), field=k)
            out[k] = v
        return out

    def constant(name):
        refuse(f"{name} is not a JSON number", file=str(path))
    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as err:
        refuse(f"malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}", file=str(path))
    except RecursionError:
        refuse("the JSON is nested too deeply", file=str(path))
    except JaxpriceError:
        raise
    except ValueError as err:          # e.g. an integer of more than 4300 digits
        refuse(f"malformed JSON: {str(err).split(';')[0]}", file=str(path))


def read_csv(path, *, what="CSV file", missing="file not found") -> list:
    """[(line number, cells)] of a CSV file; blank lines and lines starting with '#' skipped."""
    text = read_text(path, what=what, missing=missing)
    out = []
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        for row in reader:
            if any(cell.strip() for cell in row) and not row[0].lstrip().startswith("#"):
                out.append((reader.line_num, row))
    except csv.Error as err:
        refuse(f"malformed CSV at line {reader.line_num}: {err}", file=str(path))
    return out


def read_table(path, columns: dict, *, required=(), what="CSV file"):
    """A CSV with a header row: [(line, {column: checked value})]; ``columns`` maps each
    allowed column to its Spec (CSV cells are text: Num and Int specs parse them). An unknown,
    missing or repeated column, a ragged row or a bad cell is refused naming ``file:line``."""
    rows = read_csv(path, what=what)
    file = str(path)
    if not rows:
        refuse(f"is empty; expected a header ({','.join(columns)}) and one line per row", file=file)
    header_line, header = rows[0]
    header = [h.strip() for h in header]
    for h in header:
        if h not in columns:
            refuse(f"unknown column in the header (line {header_line}); expected {', '.join(columns)}",
                   file=file, field=h)
    for name in required:
        if name not in header:
            refuse(f"missing column in the header (line {header_line})", file=file, field=name)
    if len(set(header)) != len(header):
        refuse(f"a column is named twice in the header (line {header_line})", file=file,
               field=next(h for h in header if header.count(h) > 1))
    out = []
    for line, row in rows[1:]:
        where = f"{file}:{line}"
        if len(row) != len(header):
            refuse(f"has {len(row)} values for {len(header)} columns ({', '.join(header)})", file=where,
                   value=",".join(row), has_value=True)
        out.append((line, {h: columns[h].parse(cell, where, h) for h, cell in zip(header, row)}))
    return out


# ----------------------------------------------------------------------------- specs


def _join(path, key):
    return f"{path}.{key}" if path else str(key)


class Spec:
    """A field's declared type. ``check(value, file, path)`` refuses a bad value;
    ``parse(text, file, path)`` reads a CSV cell (numbers parsed) and checks it."""
    nullable = False

    def check(self, value, file, path):          # pragma: no cover - abstract
        raise NotImplementedError

    def parse(self, text, file, path):
        return self.check(text, file, path)

    def __call__(self, value, file, path):
        if value is None and self.nullable:
            return None
        return self.check(value, file, path)


class Any(Spec):
    nullable = True

    def check(self, value, file, path):
        return value


class Num(Spec):
    def __init__(self, *, integer=False, minimum=None, above=None, maximum=None, below=None,
                 nullable=False, why=""):
        self.kw = dict(integer=integer, minimum=minimum, above=above, maximum=maximum, below=below, why=why)
        self.nullable = nullable

    def check(self, value, file, path):
        return number(value, file=file, field=path or None, **self.kw)

    def parse(self, text, file, path):
        if self.nullable and isinstance(text, str) and not text.strip():
            return None
        return number(text, file=file, field=path or None, text=True, **self.kw)


def Int(minimum=0, *, below=NUMBER_LIMIT, maximum=None, nullable=False, why=""):
    return Num(integer=True, minimum=minimum, below=below, maximum=maximum, nullable=nullable, why=why)


def Token(minimum=0, nullable=False):
    return Num(integer=True, minimum=minimum, below=INT_TOKEN_LIMIT, nullable=nullable, why=TOKEN_WHY)


def Width(nullable=False):
    return Num(integer=True, minimum=1, maximum=WIDTH_LIMIT, nullable=nullable)


def Fraction(nullable=False):
    return Num(above=0, maximum=1, nullable=nullable)


def NonNeg(nullable=False):
    return Num(minimum=0, nullable=nullable)


def Positive(nullable=False):
    return Num(above=0, nullable=nullable)


class Str(Spec):
    def __init__(self, choices=None, *, nullable=False, numbers_ok=False, message=None):
        self.choices, self.nullable, self.numbers_ok, self.message = choices, nullable, numbers_ok, message

    def check(self, value, file, path):
        if self.numbers_ok and isinstance(value, numbers.Real) and not isinstance(value, bool):
            return value
        return string(value, file=file, field=path or None, choices=self.choices, message=self.message)

    def parse(self, text, file, path):
        return self.check(text.strip(), file, path)


class Bool(Spec):
    def __init__(self, *, nullable=False, message=None):
        self.nullable, self.message = nullable, message

    def check(self, value, file, path):
        return boolean(value, file=file, field=path or None, message=self.message)


class List(Spec):
    def __init__(self, item: Spec = None, *, nonempty=False, nullable=False, message=None, max_items=None):
        self.item, self.nonempty, self.nullable, self.message = item or Any(), nonempty, nullable, message
        self.max_items = max_items

    def check(self, value, file, path):
        if not isinstance(value, list) or (self.nonempty and not value):
            refuse(self.message or ("expected a non-empty list" if self.nonempty else "expected a list"),
                   file=file, field=path or None, value=shown(value), has_value=True)
        if self.max_items is not None and len(value) > self.max_items:
            refuse(f"has {len(value)} items; at most {self.max_items}", file=file, field=path or None)
        for i, v in enumerate(value):
            self.item(v, file, f"{path}[{i}]")
        return value


class Map(Spec):
    """A mapping with declared keys: unknown keys refused (unless ``open``), ``required`` ones
    present, every declared one checked. ``ignore_prefix``: keys starting with it are skipped
    (the public catalog's ``_comment*``). ``after(doc, file, path)``: a cross-field check."""

    def __init__(self, fields: dict, *, required=(), open=False, ignore_prefix=None, nullable=False,
                 message="expected a mapping", missing="required key is missing", after=None):
        self.fields, self.required, self.open = fields, tuple(required), open
        self.ignore_prefix, self.nullable, self.message, self.missing = ignore_prefix, nullable, message, missing
        self.after = after

    def check(self, value, file, path):
        if not isinstance(value, dict):
            refuse(self.message, file=file, field=path or None, value=shown(value), has_value=True)
        where = f"{path}." if path else ""
        for key in value:
            if self.ignore_prefix and isinstance(key, str) and key.startswith(self.ignore_prefix):
                continue
            if key not in self.fields and not self.open:
                refuse(f"unknown key (allowed: {', '.join(sorted(self.fields))})", file=file,
                       field=f"{where}{key}", value=shown(value[key]), has_value=True)
        for key in self.required:
            if key not in value:
                refuse(self.missing, file=file, field=f"{where}{key}")
        for key, v in value.items():
            spec = self.fields.get(key)
            if spec is not None:
                spec(v, file, f"{where}{key}")
        if self.after is not None:
            self.after(value, file, path)
        return value


class Dict(Spec):
    """A mapping of free names (chip names, layer kind ids) to values of one spec."""

    def __init__(self, item: Spec, *, nullable=False, message="expected a mapping"):
        self.item, self.nullable, self.message = item, nullable, message

    def check(self, value, file, path):
        if not isinstance(value, dict):
            refuse(self.message, file=file, field=path or None, value=shown(value), has_value=True)
        for k, v in value.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                refuse("expected a name as the key", file=file, field=path or None, value=shown(k),
                       has_value=True)
            self.item(v, file, _join(path, k))
        return value


class Either(Spec):
    """The first of several specs that accepts the value; else the message."""

    def __init__(self, *specs, message, nullable=False):
        self.specs, self.message, self.nullable = specs, message, nullable

    def check(self, value, file, path):
        for s in self.specs:
            try:
                return s(value, file, path)
            except JaxpriceError:
                continue
        refuse(self.message, file=file, field=path or None, value=shown(value), has_value=True)


class Custom(Spec):
    def __init__(self, fn, *, nullable=False):
        self.fn, self.nullable = fn, nullable

    def check(self, value, file, path):
        return self.fn(value, file, path)


def check(doc, spec: Spec, *, file, path=""):
    """Check a document (or a part of one at ``path``) against a spec."""
    return spec(doc, file, path)


# ----------------------------------------------------------------------------- scenario + deployment

CLUSTER = Map({"hardware": Str(), "fabric": Str(nullable=True),
               "nodes": Width(), "gpus_per_node": Int(0, maximum=WIDTH_LIMIT),
               "gpus_per_rack": Int(0, maximum=WIDTH_LIMIT), "storage": Any()},
              required=("hardware",))


def _set_names(value, file, path):
    if not isinstance(value, list) or not value:
        refuse("expected a non-empty list of coefficient set names", file=file, field=path, value=shown(value))
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name:
            refuse("expected a non-empty list of coefficient set names", file=file, field=f"{path}[{i}]",
                   value=shown(name), has_value=True)
    return value


SCENARIO = Map({"kind": Str(), "name": Str(numbers_ok=True), "engine_version": Str(numbers_ok=True, nullable=True),
                "model": Str(), "coefficients": Custom(_set_names), "cluster": CLUSTER,
                "workload": Any()},
               required=("name", "model", "coefficients", "cluster"))

PARALLEL = Map({"tp": Width(), "pp": Width(), "dp": Width(), "dp_local": Width(), "pcp": Width(),
                "dcp": Width(), "enable_expert_parallel": Bool()}, nullable=True)
PARALLEL_KEYS = set(PARALLEL.fields)

SPECULATIVE = Map({"method": Str(nullable=True), "num_spec_tokens": Int(1, maximum=SPEC_TOKEN_LIMIT)},
                  required=("num_spec_tokens",), nullable=True)
EPLB = Map({"enable_eplb": Bool(), "num_redundant_experts": Int(0, maximum=DIM_LIMIT),
            "window_size": Int(1), "step_interval": Int(1), "log_balancedness": Bool(),
            "use_async": Bool()}, nullable=True)

ENGINE = Map({
    "quantization": Str(nullable=True), "cache_dtype": Str(nullable=True),
    "mamba_cache_dtype": Str(nullable=True), "mamba_ssm_cache_dtype": Str(nullable=True),
    "mamba_cache_mode": Str(nullable=True), "enable_prefix_caching": Bool(),
    "block_size": Token(1), "max_num_seqs": Token(1), "max_num_batched_tokens": Token(1),
    "max_model_len": Token(1), "cudagraph_mode": Str(nullable=True), "gpu_memory_utilization": Fraction(),
    "speculative": SPECULATIVE, "all2all_backend": Str(nullable=True), "allreduce_backend": Str(nullable=True),
    "disable_custom_all_reduce": Bool(), "eplb": EPLB, "dcp_comm_backend": Str(nullable=True),
    "dcp_q_replicate": Bool(), "cp_kv_cache_interleave_size": Int(1, below=INT_TOKEN_LIMIT),
    "dbo": Either(Bool(), Map({}, open=True), message="expected true, false or a mapping"),
    "scheduling_policy": Str(("fcfs", "priority"), nullable=True), "async_scheduling": Bool(),
    "disable_cascade_attn": Bool(), "enforce_eager": Bool(),
    "max_cudagraph_capture_size": Token(1),
    # the engine whose scheduler the serving simulation follows (serve.SCHEDULERS; pricing is the same)
    "scheduler": Str(("vllm", "sglang", "trtllm"), nullable=True)}, nullable=True)
ENGINE_KEYS = set(ENGINE.fields)

POOL = Map({"role": Str(("colocated", "prefill", "decode")), "nodes": Width(), "parallel": PARALLEL,
            "engine": ENGINE}, required=("parallel",))
DEPLOYMENT = Map({"kind": Str(), "name": Str(numbers_ok=True, nullable=True),
                  "pools": List(POOL, nonempty=True, message="expected a non-empty list of pools"),
                  "offload": Map({}, open=True, nullable=True), "pd_transfer": Map({}, open=True, nullable=True)},
                 required=("pools",))


def check_scenario(scenario: dict, deployment: dict, *, file):
    """The Scenario and Deployment documents of a scenario file (every pool, not only the one
    priced)."""
    check(scenario, SCENARIO, file=file, path="Scenario")
    check(deployment, DEPLOYMENT, file=file, path="Deployment")


# ----------------------------------------------------------------------------- model graphs

DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "mxfp8": 1.0,
               "nvfp4": 0.5, "mxfp4": 0.5, "int4": 0.5}
# Block-scale bytes per weight element a checkpoint stores beside the payload (data-formats.md,
# dtypes: one fp8 byte per 16 elements for nvfp4, one E8M0 byte per 32 for mxfp4; the OCP MX
# spec's E8M0 per 32 for mxfp8). Memory only: the kernel prices the payload, as the reference.
# COVERAGE LIMIT [int4-group-scales]: int4's group size is per checkpoint and not in the graph,
# so its scales are not counted; fp8's per-tensor or 128 x 128 block scales are negligible.
SCALE_BYTES = {"nvfp4": 1.0 / 16, "mxfp4": 1.0 / 32, "mxfp8": 1.0 / 32}

_COMMON = {"op", "role", "emit", "phase", "replicated"}
NODE_KEYS = {
    "GEMM": _COMMON | {"n", "k", "weight_dtype"},
    # gated: jaxprice extension, false for ungated (up and down only) experts, as relu2 experts run
    "GroupedGEMM": _COMMON | {"n", "k", "experts", "top_k", "shared_experts",
                              "shared_intermediate_size", "latent_size", "weight_dtype", "gated"},
    # qk_nope_head_dim, v_head_dim: jaxprice extension, an MLA layer's prefill head dimensions
    "Attention": _COMMON | {"kind", "n_q", "n_kv", "d_h", "kv_lora_rank", "qk_rope_head_dim",
                            "window", "index_topk", "compress_ratio", "qk_nope_head_dim", "v_head_dim"},
    "RecurrentUpdate": _COMMON | {"recurrent_kind", "n_heads", "d_h", "state_size", "n_groups",
                                  "conv_kernel", "intermediate_size", "state_dtype"},
    "Elementwise": _COMMON | {"bytes_per_token"},
    # jaxprice extension: a DeepSeek-V4.1 mHC hyper-connection kernel (one half, pre or post).
    "HyperConnection": _COMMON | {"half", "streams", "bytes_per_token", "mix_n", "mix_k"},
    # jaxprice extension: a collective's bytes per token (absent: 2 x hidden, bf16 activations)
    "AllReduce": _COMMON | {"bytes_per_token"},
    "AllGather": _COMMON | {"bytes_per_token"},
    "ReduceScatter": _COMMON | {"bytes_per_token"},
    "All2All": _COMMON | {"bytes_per_token"},
}
NODE_REQUIRED = {
    "GEMM": ("n", "k"),
    "GroupedGEMM": ("n", "k", "experts", "top_k"),
    "Attention": ("kind", "n_q", "n_kv", "d_h"),
    "RecurrentUpdate": ("recurrent_kind", "n_heads", "state_size"),
    "HyperConnection": ("half", "bytes_per_token"),
}
INT_NODE_FIELDS = {"n", "k", "experts", "top_k", "shared_experts", "shared_intermediate_size",
                   "latent_size", "n_q", "n_kv", "d_h", "kv_lora_rank", "qk_rope_head_dim", "window",
                   "qk_nope_head_dim", "v_head_dim",
                   "index_topk", "n_heads", "state_size", "n_groups", "conv_kernel",
                   "intermediate_size", "streams", "mix_n", "mix_k"}
# A GEMM's or an attention's shape: zero is no model (a GEMM with n 0 or attention with no heads priced as free)
POSITIVE_NODE_FIELDS = {"n", "k", "n_q", "n_kv", "d_h"}
NODE_FIELDS = {**{k: Int(1 if k in POSITIVE_NODE_FIELDS else 0, below=DIM_LIMIT) for k in INT_NODE_FIELDS},
               "op": Str(), "role": Str(nullable=True), "emit": Str(nullable=True), "phase": Str(),
               "replicated": Bool(message="replicated must be true or false"),
               "gated": Bool(message="gated must be true or false"),
               "weight_dtype": Str(), "state_dtype": Str(nullable=True), "kind": Str(), "recurrent_kind": Str(),
               "half": Str(), "bytes_per_token": Num(minimum=0), "compress_ratio": Num(minimum=0)}


def _node(node, file, path):
    if not isinstance(node, dict):
        refuse("a node must be a mapping", file=file, field=path, value=shown(node))
    op = node.get("op")
    if not isinstance(op, str) or op not in NODE_KEYS:
        refuse(f"unknown op (known: {', '.join(NODE_KEYS)})", file=file, field=f"{path}.op",
               value=shown(op), has_value=True)
    Map({k: NODE_FIELDS[k] for k in NODE_KEYS[op]}, required=NODE_REQUIRED.get(op, ())).check(node, file, path)
    return node


NODES = List(Custom(_node), message="expected a list of nodes", nullable=True)
_NAMES = List(Str(), nullable=True)
STACK = Map({"prologue": _NAMES, "pattern": _NAMES, "repeat": Int(0, maximum=REPEAT_LIMIT, nullable=True),
             "epilogue": _NAMES})
SPECULATOR = Map({"method": Str(), "num_spec_tokens": Int(1, maximum=SPEC_TOKEN_LIMIT),
                  "stack": Map(STACK.fields, nullable=True)}, required=("method",), nullable=True)
_GLOBAL_FIELDS = {"hidden_size": Int(1, below=DIM_LIMIT), "vocab_size": Int(1, below=DIM_LIMIT),
                  "tie_word_embeddings": Bool(nullable=True), "weight_dtype": Str()}


def _own_kinds(kinds, file, path):
    if not isinstance(kinds, dict):
        refuse("expected a mapping of kind id to nodes", file=file, field=path, value=shown(kinds))
    for kid, nodes in kinds.items():
        NODES(nodes, file, f"{path}.{kid}.nodes")
    return kinds


def _public_kinds(kinds, file, path):
    if not isinstance(kinds, list):
        refuse("expected a list of layer kinds", file=file, field=path, value=shown(kinds))
    for i, kind in enumerate(kinds):
        Map({"id": Str(), "nodes": Any(), "edges": Any()}, required=("id", "nodes"),
            message="a layer kind must be a mapping").check(kind, file, f"{path}[{i}]")
        NODES(kind["nodes"], file, f"{path}.{kind['id']}.nodes")
    return kinds


MODEL_OWN = Map({"format": Str(), "name": Str(numbers_ok=True), "source": Str(), "hf_repo": Str(nullable=True),
                 "hf_revision": Str(nullable=True), "config_sha256": Str(nullable=True),
                 **_GLOBAL_FIELDS, "modality": Str(nullable=True), "layer_kinds": Custom(_own_kinds),
                 "stack": STACK, "head": NODES, "speculator": SPECULATOR,
                 "capture_breaks": Dict(Int(1, maximum=REPEAT_LIMIT), nullable=True),
                 "max_model_len": Int(1, nullable=True), "kv_cache_dtype": Str(nullable=True)},
                required=("name", "hidden_size", "vocab_size", "weight_dtype", "layer_kinds", "stack"))
MODEL_PUBLIC = Map({"kind": Str(), "name": Str(numbers_ok=True), "derived_from": Any(),
                    "global": Map(_GLOBAL_FIELDS, required=("hidden_size", "vocab_size", "weight_dtype")),
                    "layer_kinds": Custom(_public_kinds), "stack": STACK, "head": NODES,
                    "speculator": SPECULATOR, "modality": Str(nullable=True)},
                   required=("name", "global", "layer_kinds", "stack"))


def check_model_graph(doc: dict, *, file):
    """A model graph in either format (the caller has told them apart)."""
    check(doc, MODEL_OWN if doc.get("format") == "jaxprice-model/1" else MODEL_PUBLIC, file=file)


# ----------------------------------------------------------------------------- chips and fabrics

_PEAK = NonNeg(nullable=True)      # TFLOP/s, TB/s, GB/s; 0 or null = the part has none (resolve refuses
#                                    a zero peak or bandwidth a deployment needs)
_CHIP_FIELDS = {"bf16_tflops": _PEAK, "fp8_tflops": _PEAK, "nvfp4_tflops": _PEAK, "tf32_tflops": _PEAK,
                "hbm_tbs": _PEAK, "memory_gib": Positive(nullable=True), "nvlink_gbps": _PEAK,
                "sm_count": Int(1, maximum=DIM_LIMIT, nullable=True),
                "gpus_per_node": Int(1, maximum=WIDTH_LIMIT, nullable=True),
                "gpus_per_rack": Int(1, maximum=WIDTH_LIMIT, nullable=True), "rack_gbps": _PEAK,
                "provenance": Str(nullable=True), "source": Str(nullable=True)}
CHIPS_OWN = Map({"format": Str(), "chips": Dict(Map(_CHIP_FIELDS), nullable=True),
                 "networks": Dict(Map({"internode_gbps": NonNeg(), "rdma": Any(), "source": Str(nullable=True)},
                                      required=("internode_gbps",)), nullable=True),
                 "derived": Any()}, required=("chips",))
PUBLIC_CHIP_NAMES = {"TFlopsPeak": "bf16_tflops", "TFlopsFP8": "fp8_tflops", "TFlopsNVFP4": "nvfp4_tflops",
                     "TFlopsTF32": "tf32_tflops", "BwPeakTBs": "hbm_tbs", "MemoryGiB": "memory_gib",
                     "IntraNodeBwGBps": "nvlink_gbps", "SMCount": "sm_count", "GPUsPerNode": "gpus_per_node",
                     "GPUsPerRack": "gpus_per_rack", "IntraRackBwGBps": "rack_gbps"}
CHIP_PUBLIC = Map({"Provenance": Str(nullable=True), **{k: _CHIP_FIELDS[v] for k, v in PUBLIC_CHIP_NAMES.items()}},
                  required=("TFlopsPeak", "BwPeakTBs", "MemoryGiB", "IntraNodeBwGBps"), ignore_prefix="_comment")
NETWORK_PUBLIC = Map({"Provenance": Str(nullable=True), "InterNodeBwGBps": NonNeg(), "RDMA": Any(),
                      "PDTransferBaseLatencyMs": NonNeg(nullable=True)},
                     required=("InterNodeBwGBps",), ignore_prefix="_comment")


def check_chips(doc, *, file):
    check(doc, CHIPS_OWN, file=file)


def check_public_chip(doc, *, file):
    check(doc, CHIP_PUBLIC, file=file)


def check_public_network(doc, *, file):
    check(doc, NETWORK_PUBLIC, file=file)


# ----------------------------------------------------------------------------- coefficient sets

SCOPE_KEYS = ("hardware", "model", "tp", "ep", "nodes_spanned", "engine")
# engine: the engine whose scheduler a deployment runs (its scenario's engine.scheduler, vllm where
# unstated, as the serving simulation reads it); a fitted set is scoped to the engines it was fitted on
SCOPE_ENGINES = ("vllm", "sglang", "trtllm")
# Registry units the resolver converts to SI (resolve.si_factor): times in microseconds
# (``us`` or ``us_per_<thing>``), rates in bytes per microsecond, or tokens per microsecond for a
# name with ``_rate``; the rest are counts, sizes and fractions taken as they are.
KNOWN_UNITS = ("dimensionless", "tokens", "elements", "count", "bytes", "bytes_per_rank", "bytes_per_token",
               "bytes_per_us", "us")
FRACTION_NAMES = ("eps_max", "derate")    # fractions of a peak: in (0, 1]


def known_units(units: str) -> bool:
    return units in KNOWN_UNITS or (units.startswith("us_per_") and len(units) > len("us_per_"))


def coefficient_range(name: str, units: str) -> dict:
    """The range a coefficient's value must lie in, from its name and units: a fraction of a
    peak (``*eps_max*``, ``*derate*``) in (0, 1]; a rate (``bytes_per_us``, or a ``*_rate*``
    in tokens) > 0; everything else (times, sizes, counts, other factors) >= 0."""
    if any(f in name for f in FRACTION_NAMES):
        return {"above": 0, "maximum": 1}
    if units == "bytes_per_us" or "_rate" in name:
        return {"above": 0}
    return {"minimum": 0}


def _entry_value(body, file, path):
    units = body.get("units")
    name = body.get("name", path.rsplit(".", 1)[-1])
    if isinstance(units, str) and known_units(units) and "value" in body:
        number(body["value"], file=file, field=f"{path}.value", **coefficient_range(str(name), units),
               why=f" (a {units} coefficient)")


_SCOPE_NAMES = List(Str(), message="a scope dimension must be a list")           # hardware, model
_SCOPE_WIDTHS = List(Int(1, maximum=WIDTH_LIMIT), message="a scope dimension must be a list")   # tp, ep, nodes
_SCOPE_ENGINES = List(Str(SCOPE_ENGINES), message="a scope dimension must be a list")            # engine


def _scope(scope, file, path):
    # which dimensions a scope names, and that it names one: formats.py words those refusals
    if not isinstance(scope, dict) or not scope:
        refuse("an entry needs a scope over at least one of " + ", ".join(SCOPE_KEYS), file=file, field=path,
               value=shown(scope))
    for dim, values in scope.items():
        if dim in ("hardware", "model"):
            _SCOPE_NAMES(values, file, f"{path}.{dim}")
        elif dim == "engine":
            _SCOPE_ENGINES(values, file, f"{path}.{dim}")
        elif dim in SCOPE_KEYS:
            _SCOPE_WIDTHS(values, file, f"{path}.{dim}")
    return scope


_SCOPE = Custom(_scope)
_ENTRY_COMMON = {"value": Num(), "units": Str(message="every coefficient states its units"),
                 "method": Str(nullable=True), "fitted": Bool(nullable=True), "scope": _SCOPE,
                 "ci95": List(Num(), nullable=True)}
ENTRY_OWN = Map({**_ENTRY_COMMON, "name": Str(), "cite": Str(nullable=True), "measured_on": Str(nullable=True),
                 "fit": Any()}, required=("name", "value", "units", "scope"), after=_entry_value)
ENTRY_PUBLIC = Map({**_ENTRY_COMMON, "sources": List(nullable=True), "rationale": Str(nullable=True),
                    "copied_from": Any(), "supersedes": Any(), "validated": Any(), "unsupported": Any()},
                   after=_entry_value)


def _public_entries(items, file, path):
    if not isinstance(items, list):
        refuse("expected a list of coefficients", file=file, field=path, value=shown(items))
    for i, item in enumerate(items):
        if not isinstance(item, dict) or len(item) != 1 or not isinstance(next(iter(item)), str):
            refuse("each coefficient is a single-key mapping", file=file, field=f"{path}[{i}]")
        (name, body), = item.items()
        ENTRY_PUBLIC(body, file, f"{path}[{i}].{name}")
    return items


COEFFICIENTS_OWN = Map({"format": Str(), "name": Str(numbers_ok=True), "source": Str(nullable=True),
                        "entries": List(ENTRY_OWN, nullable=True), "fit": Any()}, required=("name", "entries"))
COEFFICIENTS_PUBLIC = Map({"kind": Str(), "name": Str(numbers_ok=True),
                           "coefficients": Custom(_public_entries, nullable=True)},
                          required=("name", "coefficients"))


def check_coefficient_set(doc, *, file):
    check(doc, COEFFICIENTS_OWN if doc.get("format") == "jaxprice-coefficients/1" else COEFFICIENTS_PUBLIC,
          file=file)


# ----------------------------------------------------------------------------- batch files

#: Each request field of a batch file (YAML key or CSV column); batchfile.py reads them.
BATCH_FIELDS = {"scheduled": Token(1), "computed": Token(0), "prompt_len": Token(0, nullable=True),
                "count": Int(1, maximum=MAX_REQUESTS, nullable=True)}
BATCH_DECODE_THRESHOLD = Token(0, nullable=True)


# ----------------------------------------------------------------------------- measurement CSVs

#: Ranges of the measured-latency CSV's numeric columns (accuracy.read_measurements words the
#: other refusals: missing columns, units, values); only cells that parse as numbers are checked.
MEASUREMENT_RANGES = {"tp": Width(), "ep": Width(), "dp": Width(), "isl": Token(0), "osl": Token(0),
                      "concurrency": Int(1, below=INT_TOKEN_LIMIT), "anchor_concurrency": Int(1, below=INT_TOKEN_LIMIT)}


def _parses(text):
    try:
        v = float(text)
    except (TypeError, ValueError):
        return False
    return math.isfinite(v)


def check_measurement_file(path):
    """The file-level checks of a measurement CSV (readable text, well-formed CSV, a header)
    and the ranges of its counts and lengths; the row-by-row wording stays with the reader."""
    file = str(path)
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bool):     # 5 was opened as a file named '5'
        refuse("expected a measurement CSV path (a str or a path)", field="csv_path", value=shown(path),
               has_value=True)
    refuse_empty_name(path, "measurement CSV")
    if Path(file).is_dir():
        refuse("cannot read the measurement file (IsADirectoryError)", file=file)
    text = read_text(path, what="measurement CSV", missing="cannot read the measurement file (FileNotFoundError)")
    if not text.strip():
        refuse("is empty; expected a header and one row per measured point", file=file)
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        rows = [(reader.line_num, row) for row in reader]
    except csv.Error as err:
        refuse(f"malformed CSV at line {reader.line_num}: {err}", file=file)
    header = [h.strip() for h in rows[0][1]] if rows else []
    cols = {h: i for i, h in enumerate(header) if h in MEASUREMENT_RANGES}
    for line, row in rows[1:]:
        for name, i in cols.items():
            if i < len(row) and _parses(row[i].strip()):
                MEASUREMENT_RANGES[name].parse(row[i], f"{file}:{line}", name)

