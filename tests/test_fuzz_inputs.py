"""A seeded mutation fuzz: a malformed input ends in a finite price or a one-line refusal.

Every bundled scenario (testdata/aisimulate/*.yaml) gets random mutations, one at a time: a key
dropped, a section or value of another type, a bad number (negative, zero, NaN, inf, huge,
fractional where an integer is expected, a string), an unknown key, garbage text. Batch files
(YAML and CSV) and coefficient sets (both formats) get the same, and so do model graphs and
chips placed in a registry root. Each case is priced through the CLI's entry point in-process
(``jaxprice.cli.main(["price", FILE, "--decode", "1,8", "--context", "512", "--json"])``) and
must end in exactly one of:

* exit 0 with finite, positive prices (the mutation was harmless) -- and then the mutation
  must not be one that puts a value out of range (``must_refuse``);
* exit 2 with one line on stderr, ``jaxprice price: error: ...`` and nothing on stdout.

Never a traceback. Speed: pricing compiles once per (plan, padding). A case whose plan has no
compiled kernel (only the ``PRICED`` scenario's plan at padding 8 is compiled, plus
``EXTRA_COMPILES`` more) stops just before pricing, after everything the CLI does before it
(read, validate, resolve, build the batches): it is counted as "resolved" and still held to
``must_refuse``. Hugging Face configs (testdata/hf) and trace CSVs (``load_trace``) are fuzzed too.
About 520 cases; the file takes about 15 s of CPU (one compile).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import random
from pathlib import Path

import pytest
import yaml

from jaxprice import cli
from jaxprice._src import cli_price
from jaxprice._src.formats import default_registry_root
from jaxprice._src.resolve import bundled_scenarios, scenario_path

SEED = 20261203
PER_SCENARIO = 2                     # mutations of each of the 88 bundled scenarios
PRICED = ("llama-3.1-70b-instruct-h200-fp8-vllm-tp8",)   # its plan is compiled (about 1-3 s)
PER_PRICED = 30                      # extra mutations of the PRICED scenarios
EXTRA_COMPILES = 0                   # (plan, padding) pairs compiled beyond the PRICED scenarios' own
PAD = 8                              # the padding of "--decode 1,8" and of the batch files below
ARGS = ("--decode", "1,8", "--context", "512", "--json")
BUNDLED = default_registry_root()


class NotPriced(Exception):
    """The case resolved, but pricing it would compile a plan past the budget."""


@pytest.fixture(scope="module")
def budget():
    from jaxprice import load_deployment
    return {"allowed": {(load_deployment(s).plan.digest, PAD) for s in PRICED}, "extra": set()}


@pytest.fixture(autouse=True)
def guarded_pricing(monkeypatch, budget):
    original = cli_price.price_specs

    def guarded(dep, specs, temperature):
        key = (dep.plan.digest, cli_price.common_pad([s[2].size for s in specs]))
        if key not in budget["allowed"] and key not in budget["extra"]:
            if len(budget["extra"]) >= EXTRA_COMPILES:
                raise NotPriced(key)
            budget["extra"].add(key)
        return original(dep, specs, temperature)
    monkeypatch.setattr(cli_price, "price_specs", guarded)


# ----------------------------------------------------------------------------- running one case


def run_case(argv):
    """('priced', steps) | ('refused', line) | ('resolved', None); anything else fails the test."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(list(argv))
    except NotPriced:
        return "resolved", None
    if rc == 2:
        lines = err.getvalue().strip().splitlines()
        assert out.getvalue() == "", out.getvalue()
        assert len(lines) == 1 and lines[0].startswith("jaxprice price: error: "), err.getvalue()
        return "refused", lines[0]
    assert rc == 0, (rc, err.getvalue())
    steps = json.loads(out.getvalue())["steps"]
    for s in steps:
        for key in ("overlap", "no_overlap", "sm", "hbm", "nvlink", "nic", "host"):
            assert math.isfinite(s[key]) and s[key] >= 0, (key, s[key])
        assert s["no_overlap"] > 0
    return "priced", steps


class Tally:
    def __init__(self):
        self.counts = {"priced": 0, "refused": 0, "resolved": 0}
        self.failures = []

    def record(self, label, must_refuse, argv):
        try:
            outcome, detail = run_case(argv)
        except Exception as err:                       # a traceback, or a broken outcome
            self.failures.append(f"{label}: {type(err).__name__}: {str(err)[:300]}")
            return None
        self.counts[outcome] += 1
        if must_refuse and outcome != "refused":
            self.failures.append(f"{label}: {outcome}, but the mutation must be refused")
        return outcome, detail

    def check(self, minimum_cases):
        assert not self.failures, "\n".join(self.failures[:40])
        assert sum(self.counts.values()) >= minimum_cases, self.counts


# ----------------------------------------------------------------------------- mutations

BAD_NUMBERS = [("negative", -3), ("zero", 0), ("nan", float("nan")), ("inf", float("inf")),
               ("-inf", float("-inf")), ("huge", 1e300), ("huge int", 10 ** 30), ("fractional", None),
               ("string", "eight")]
OTHER_TYPES = [("a list", [1, 2]), ("a string", "eight"), ("true", True), ("a number", 7),
               ("a mapping", {"x": 1}), ("null", None)]


def nodes(doc, path=()):
    """Every (path, value) in a document, sections and leaves."""
    out = [(path, doc)] if path else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += nodes(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += nodes(v, path + (i,))
    return out


def get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


def put(doc, path, value):
    get(doc, path[:-1])[path[-1]] = value


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def mutate(docs, rng, *, integral=lambda path: True, free=(), dumps=None):
    """(description, mutated docs or None, text or None, must_refuse) for one random mutation
    of a list of YAML documents (the root of each path is the document's index).
    integral(path): whether an int there is an integer field (fractional must be refused);
    free: paths of free-form mappings (an unknown key there is allowed)."""
    docs = copy.deepcopy(docs)
    every = [((i,) + p, v) for i, d in enumerate(docs) for p, v in nodes(d)]
    kind = rng.choice(["drop", "retype", "number", "number", "number", "unknown", "garbage"])
    if kind == "number":
        numeric = [(p, v) for p, v in every if is_number(v)]
        if numeric:
            path, old = rng.choice(numeric)
            name, new = rng.choice(BAD_NUMBERS)
            if name == "fractional":
                new = old + 0.5 if isinstance(old, int) else old * 3.7 + 1.1
            put_path(docs, path, new)
            # every number in these documents is non-negative; a count or width is an integer
            must = name in ("negative", "nan", "inf", "-inf", "huge", "huge int", "string") or \
                (name == "fractional" and isinstance(old, int) and integral(path))
            return f"{fmt(path)}: {old!r} -> {name} {new!r}", docs, None, must
        kind = "retype"
    if kind == "drop":
        keyed = [(p, v) for p, v in every if isinstance(p[-1], str)]
        path, old = rng.choice(keyed)
        del get(docs, path[:-1])[path[-1]]
        return f"drop {fmt(path)}", docs, None, False
    if kind == "retype":
        path, old = rng.choice(every)
        name, new = rng.choice(OTHER_TYPES)
        put_path(docs, path, copy.deepcopy(new))
        if isinstance(old, dict):
            must = name not in ("null", "a mapping")
        elif isinstance(old, list):
            must = name not in ("null", "a list")
        elif isinstance(old, bool):
            must = name not in ("true",)
        elif isinstance(old, str):
            must = name in ("a list", "a mapping", "true")
        elif old is None:
            must = False
        else:
            must = name in ("a list", "a mapping", "true", "a string")
        return f"{fmt(path)}: {short(old)} -> {name}", docs, None, must
    if kind == "unknown":
        maps = [((i,), d) for i, d in enumerate(docs)] + [(p, v) for p, v in every if isinstance(v, dict)]
        path, m = rng.choice(maps)
        m["bogus_key"] = 1
        return f"unknown key under {fmt(path)}", docs, None, not any(path[:len(f)] == f for f in free)
    text = (dumps or dump)(docs)
    how = rng.choice(["binary", "noise", "truncate", "tab", "duplicate"])
    if how == "binary":
        return "binary garbage", None, bytes(rng.randrange(256) for _ in range(200)), True
    if how == "noise":
        i = rng.randrange(len(text))
        return "noise in the text", None, (text[:i] + "}{:[&*!|>%@`" + text[i + 3:]).encode(), False
    if how == "truncate":
        return "truncated", None, text[:rng.randrange(len(text))].encode(), False
    if how == "tab":
        return "a tab indent", None, text.replace("\n  ", "\n\t", 1).encode(), "\n  " in text
    lines = text.splitlines(keepends=True)
    first = next((i for i, ln in enumerate(lines) if ln[:1].isalpha() and ":" in ln), None)
    if first is None:
        return "truncated", None, text[: len(text) // 2].encode(), False
    lines.insert(first + 1, lines[first])
    return "a key stated twice", None, "".join(lines).encode(), True


def put_path(docs, path, value):
    put(docs, path, value)


def fmt(path):
    out = ""
    for p in path[1:] if isinstance(path[0], int) else path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return f"doc{path[0]}{out}" if isinstance(path[0], int) else out


def short(v):
    r = repr(v)
    return r if len(r) < 40 else r[:37] + "..."


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump(docs):
    return yaml.dump_all(docs, Dumper=_DUMPER, sort_keys=False)


def write(path: Path, docs, text):
    path.write_bytes(text if text is not None else dump(docs).encode())
    return path


# ----------------------------------------------------------------------------- scenarios


def test_mutated_scenarios_price_or_refuse_in_one_line(tmp_path):
    rng = random.Random(SEED)
    tally = Tally()
    plans = {}
    n = 0
    for name in bundled_scenarios():
        base = list(yaml.safe_load_all(scenario_path(name).read_text()))
        for _ in range(PER_SCENARIO + (PER_PRICED if name in PRICED else 0)):
            desc, docs, text, must = mutate(base, rng)
            n += 1
            f = write(tmp_path / f"s{n}.yaml", docs, text)
            got = tally.record(f"{name}: {desc}", must, ["price", str(f), *ARGS])
            if got:
                plans.setdefault(got[0], set()).add(name)
    tally.check(minimum_cases=88 * PER_SCENARIO)
    # the fuzz reached every outcome, and resolved (or priced) mutations of many scenarios
    assert tally.counts["priced"] >= 5 and tally.counts["refused"] >= 150, tally.counts
    assert len(plans.get("priced", set()) | plans.get("resolved", set())) >= 10, plans


# ----------------------------------------------------------------------------- batch files


BATCH = {"decode_threshold": 8, "requests": [{"scheduled": 1, "computed": 511, "count": 5},
                                             {"scheduled": 1, "computed": 255},
                                             {"scheduled": 64, "computed": 0, "prompt_len": 64}]}
BATCH_CSV = "scheduled,computed,prompt_len,count\n1,511,512,5\n1,255,256,1\n64,0,64,1\n"


def csv_mutations(rng):
    lines = BATCH_CSV.splitlines()
    header, rows = lines[0], [ln.split(",") for ln in lines[1:]]
    kind = rng.choice(["cell", "cell", "cell", "column", "ragged", "garbage"])
    if kind == "cell":
        r, c = rng.randrange(len(rows)), rng.randrange(4)
        name, new = rng.choice([("negative", "-3"), ("zero", "0"), ("nan", "nan"), ("inf", "inf"),
                                ("huge", "1e300"), ("huge int", str(10 ** 30)), ("fractional", "2.5"),
                                ("string", "eight"), ("empty", "")])
        old = rows[r][c]
        rows[r][c] = new
        col = header.split(",")[c]
        must = name not in ("zero", "empty") or (name == "zero" and col in ("scheduled", "count")) or \
            (name == "empty" and col in ("scheduled", "computed"))
        return f"csv {col}[{r}] {old} -> {name}", header + "\n" + "\n".join(map(",".join, rows)) + "\n", must
    if kind == "column":
        return "csv unknown column", header + ",bogus\n" + "\n".join(",".join(r + ["1"]) for r in rows) + "\n", True
    if kind == "ragged":
        rows[rng.randrange(len(rows))].append("7")
        return "csv ragged row", header + "\n" + "\n".join(map(",".join, rows)) + "\n", True
    return "csv binary", bytes(rng.randrange(256) for _ in range(120)), True


def test_mutated_batch_files_price_or_refuse_in_one_line(tmp_path):
    rng = random.Random(SEED + 1)
    tally = Tally()
    scen = PRICED[0]
    base = [BATCH]
    for n in range(45):
        desc, docs, text, must = mutate(base, rng)
        f = write(tmp_path / f"b{n}.yaml", docs, text)
        tally.record(f"batch yaml: {desc}", must, ["price", scen, "--batch", str(f), "--json"])
    for n in range(30):
        desc, text, must = csv_mutations(rng)
        f = tmp_path / f"c{n}.csv"
        f.write_bytes(text if isinstance(text, bytes) else text.encode())
        tally.record(f"batch csv: {desc}", must, ["price", scen, "--batch", str(f), "--json"])
    tally.check(minimum_cases=75)
    assert tally.counts["priced"] >= 3 and tally.counts["refused"] >= 40, tally.counts


# ----------------------------------------------------------------------------- coefficient sets


def own_set():
    scope = {"hardware": ["h200"]}
    return {"format": "jaxprice-coefficients/1", "name": "fuzz", "entries": [
        {"name": "hbm_derate", "value": 0.75, "units": "dimensionless", "scope": scope},
        {"name": "host_launch_per_kernel", "value": 3.0, "units": "us_per_transfer", "scope": scope},
        {"name": "attention_decode_rate", "value": 3.0e6, "units": "bytes_per_us", "scope": scope},
        {"name": "gemm_eps_max_fp8", "value": 0.7, "units": "dimensionless", "scope": {"hardware": ["h200"],
                                                                                       "tp": [8]}},
        {"name": "collective_peak_rate_all_reduce_fp16_8rank_h200", "value": 2.0e5, "units": "bytes_per_us",
         "scope": scope}]}


def public_set():
    doc = own_set()
    return {"kind": "CoefficientSet", "name": "fuzz", "coefficients": [
        {e["name"]: {k: v for k, v in e.items() if k != "name"}} for e in doc["entries"]]}


def test_mutated_coefficient_sets_price_or_refuse_in_one_line(tmp_path):
    rng = random.Random(SEED + 2)
    tally = Tally()
    scen_docs = list(yaml.safe_load_all(scenario_path(PRICED[0]).read_text()))
    for n in range(80):
        base = [own_set() if n % 2 else public_set()]
        desc, docs, text, must = mutate(base, rng, integral=lambda p: False)
        if docs is not None and desc.endswith("-> zero 0") and ("rate" in desc or "eps_max" in desc
                                                                 or "derate" in desc):
            must = True                                # a zero rate or fraction of a peak
        cset = write(tmp_path / f"set{n}.yaml", docs, text)
        scen = copy.deepcopy(scen_docs)
        scen[0]["coefficients"] = scen[0]["coefficients"] + [str(cset)]
        f = write(tmp_path / f"scen{n}.yaml", scen, None)
        tally.record(f"coefficient set: {desc}", must, ["price", str(f), *ARGS])
    tally.check(minimum_cases=80)
    assert tally.counts["priced"] >= 5 and tally.counts["refused"] >= 30, tally.counts


# ----------------------------------------------------------------------------- graphs and chips


def registry_root(tmp_path, n, replace: dict) -> Path:
    """A registry root of links to the bundled files, with some files replaced."""
    root = tmp_path / f"reg{n}"
    for sub in ("models", "coefficients"):
        (root / sub).mkdir(parents=True)
        for f in (BUNDLED / sub).glob("*.yaml"):
            if f"{sub}/{f.name}" not in replace:
                os.symlink(f, root / sub / f.name)
    if "chips.yaml" not in replace:
        os.symlink(BUNDLED / "chips.yaml", root / "chips.yaml")
    for rel, data in replace.items():
        (root / rel).write_bytes(data)
    return root


def test_mutated_graphs_and_chips_price_or_refuse_in_one_line(tmp_path, monkeypatch):
    rng = random.Random(SEED + 3)
    tally = Tally()
    graph = [yaml.safe_load((BUNDLED / "models" / "llama-3.1-70b-instruct.yaml").read_text())]
    chips = [yaml.safe_load((BUNDLED / "chips.yaml").read_text())]
    for n in range(60):
        which, base = ("models/llama-3.1-70b-instruct.yaml", graph) if n % 3 else ("chips.yaml", chips)
        if which == "chips.yaml":
            desc, docs, text, must = mutate(base, rng, free=((0, "derived"),), integral=lambda p: p[-1] in (
                "sm_count", "gpus_per_node", "gpus_per_rack"))
        else:
            desc, docs, text, must = mutate(base, rng, integral=lambda p: p[-1] not in (
                "bytes_per_token", "compress_ratio"))
        root = registry_root(tmp_path, n, {which: text if text is not None else dump(docs).encode()})
        monkeypatch.setenv("JAXPRICE_REGISTRY", str(root))
        tally.record(f"{which}: {desc}", must, ["price", PRICED[0], *ARGS])
    tally.check(minimum_cases=60)
    assert tally.counts["refused"] >= 20, tally.counts


# ----------------------------------------------------------------------------- Hugging Face configs

HF = Path(__file__).resolve().parents[1] / "testdata" / "hf" / "meta-llama--Llama-3.1-70B-Instruct"


@pytest.mark.skipif(not (HF / "config.json").exists(), reason="no bundled Hugging Face config")
def test_mutated_hf_configs_price_or_refuse_in_one_line(tmp_path):
    """A scenario whose model is a (mutated) config.json folder: the importer reads only the
    keys it maps and ignores the rest, so apart from binary garbage no mutation is held to
    must_refuse; each must still end in a finite price or a one-line refusal."""
    rng = random.Random(SEED + 4)
    tally = Tally()
    base = [json.loads((HF / "config.json").read_text())]
    scen_docs = list(yaml.safe_load_all(scenario_path(PRICED[0]).read_text()))

    def dumps(docs):
        return json.dumps(docs[0], indent=1)
    for n in range(40):
        desc, docs, text, must = mutate(base, rng, dumps=dumps)
        folder = tmp_path / f"hf{n}"
        folder.mkdir()
        (folder / "config.json").write_bytes(text if text is not None else dumps(docs).encode())
        scen = copy.deepcopy(scen_docs)
        scen[0]["model"] = str(folder)
        f = write(tmp_path / f"scen{n}.yaml", scen, None)
        tally.record(f"config.json: {desc}", desc == "binary garbage", ["price", str(f), *ARGS])
    tally.check(minimum_cases=35)
    assert tally.counts["refused"] >= 5, tally.counts


# ----------------------------------------------------------------------------- trace files

TRACE_CSV = "arrival_s,input_len,output_len\n0.0,1024,128\n0.25,512,64\n1.5,2048,16\n"


def test_mutated_trace_files_load_or_refuse_in_one_line(tmp_path):
    """jaxprice.load_trace on mutated trace CSVs: a Trace whose values are in range, or a
    one-line JaxpriceError; never another exception."""
    load_trace = pytest.importorskip("jaxprice._src.client").load_trace
    from jaxprice import JaxpriceError
    from jaxprice._src.plan import INT_TOKEN_LIMIT
    rng = random.Random(SEED + 5)
    lines = TRACE_CSV.splitlines()
    header, rows = lines[0], [ln.split(",") for ln in lines[1:]]
    failures, counts = [], {"loaded": 0, "refused": 0}
    for n in range(60):
        kind = rng.choice(["cell", "cell", "cell", "ragged", "column", "binary", "empty", "harmless"])
        rs = copy.deepcopy(rows)
        if kind == "cell":
            r, c = rng.randrange(len(rs)), rng.randrange(3)
            name, new = rng.choice([("negative", "-3"), ("zero", "0"), ("nan", "nan"), ("inf", "inf"),
                                    ("fractional", "2.5"), ("string", "eight"), ("empty", ""),
                                    ("huge", "1e30")])
            rs[r][c] = new
            must = name in ("negative", "nan", "inf", "string", "empty") or \
                (c > 0 and name in ("zero", "fractional", "huge"))
            data = (header + "\n" + "\n".join(map(",".join, rs)) + "\n").encode()
        elif kind == "ragged":
            rs[0] = rs[0][:2]
            data, must = (header + "\n" + "\n".join(map(",".join, rs)) + "\n").encode(), True
        elif kind == "column":
            data, must = ("arrival_s,input_len\n" + "\n".join(",".join(r[:2]) for r in rs) + "\n").encode(), True
        elif kind == "harmless":     # blank lines and padded cells: the same trace
            data = (header + "\n\n" + "\n".join(", ".join(r) for r in rs) + "\n\n").encode()
            must = False
        elif kind == "binary":
            data, must = b"\x00" + bytes(rng.randrange(256) for _ in range(80)), True
        else:
            data, must = b"", True
        f = tmp_path / f"t{n}.csv"
        f.write_bytes(data)
        try:
            tr = load_trace(f)
        except JaxpriceError as err:
            counts["refused"] += 1
            if "\n" in str(err):
                failures.append(f"{kind}: a refusal over several lines: {err}")
            continue
        except Exception as err:
            failures.append(f"{kind} {data[:60]!r}: {type(err).__name__}: {err}")
            continue
        counts["loaded"] += 1
        if must:
            failures.append(f"{kind} {data[:60]!r}: loaded, but must be refused")
        for v in tr.input_len + tr.output_len:
            if not (1 <= v < INT_TOKEN_LIMIT):
                failures.append(f"{kind}: a token count out of range loaded: {v}")
    assert not failures, "\n".join(failures[:20])
    assert counts["loaded"] >= 5 and counts["refused"] >= 20, counts
