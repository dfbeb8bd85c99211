"""Load: read model graphs, chips, fabrics, coefficient sets and scenarios from YAML.

Two families of files are read, both into the same plain dataclasses:

* the project's own compact registry formats (``format: jaxprice-*/1``, see registry/README.md);
* the public BLIS document formats as they are (``kind: ModelGraph``, PascalCase chip files,
  ``kind: CoefficientSet``, the two-document ``Scenario`` + ``Deployment`` stream), so a user can
  point jaxprice at their own catalog or registry checkout.

Reading is strict: an unknown key, a wrong type or a malformed document is a JaxpriceError that
names the file, the field and the value. Nothing here touches JAX.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import math
import numbers
import os
from pathlib import Path
from typing import Any

import yaml

from . import schema
from .errors import refuse, shown
from .schema import (DTYPE_BYTES, ENGINE_KEYS, KNOWN_UNITS, NODE_KEYS, NODE_REQUIRED, PARALLEL_KEYS,
                     SCOPE_KEYS)
from .schema import INT_NODE_FIELDS as _INT_FIELDS
from .schema import known_units as _known_units

_SAFE_LOADER = schema.StrictLoader

# ----------------------------------------------------------------------------- YAML


_CACHE: dict = {}


def _cached(loader):
    """Memoise a loader on (path, mtime, size): registries are read once per process, and a
    changed file is read again."""
    def wrapper(path, *args):
        _check_path(path)
        p = Path(path)
        try:
            st = p.stat()
            key = (loader.__name__, str(p.resolve()), st.st_mtime_ns, st.st_size, args)
        except OSError:
            return loader(path, *args)
        if key not in _CACHE:
            _CACHE[key] = loader(path, *args)
        return _CACHE[key]
    wrapper.__name__ = loader.__name__
    wrapper.__doc__ = loader.__doc__
    return wrapper


def read_yaml_documents(path) -> list:
    """The non-empty documents of a YAML file, each a mapping. A missing path, a directory,
    binary content, a syntax error, a key stated twice and an empty file are refused in one line."""
    path = Path(path)
    text = schema.read_text(path, what="YAML file", missing="file not found")
    try:
        # libyaml's safe loader when present: the public collectives set is ~0.7 MB and the
        # pure-Python loader takes over a second on it.
        docs = [d for d in schema.load_yaml_documents(text) if d is not None]
    except yaml.YAMLError as err:
        where, problem = schema.yaml_problem(err)
        refuse(f"malformed YAML{where}: {problem}", file=str(path))
    if not docs:
        refuse("the file holds no YAML document", file=str(path))
    for i, d in enumerate(docs):
        if not isinstance(d, dict):
            refuse(f"document {i + 1} is a {type(d).__name__}, expected a mapping", file=str(path))
    return docs


def _check_path(path, field="path"):
    """A file path argument: a str or a path (open() reads an int as a file descriptor)."""
    if not isinstance(path, (str, os.PathLike)):
        refuse("needs a file path (a str or a path)", field=field, value=shown(path), has_value=True)
    if not str(path).strip():           # '' was Path('.'): 'is a directory', naming nothing
        refuse("an empty file name", field=field, value=str(path), has_value=True)


def path_list(value, field, *, none=None, what="a path"):
    """A list of paths from a library argument: None -> ``none``, one str or path -> [it] (not
    its letters), a list or tuple of them -> a list; anything else refused naming ``field``."""
    if value is None:
        return none
    if isinstance(value, (str, os.PathLike)):
        return [value]
    if not isinstance(value, (list, tuple)):
        refuse(f"expected a list of paths ({what} each)", field=field, value=shown(value), has_value=True)
    for i, v in enumerate(value):
        if not isinstance(v, (str, os.PathLike)):
            refuse(f"expected {what} (a str or a path)", field=f"{field}[{i}]", value=shown(v), has_value=True)
    return list(value)


def check_registry(registry, hint: str = "") -> None:
    """None (the bundled registry) or a Registry."""
    if registry is not None and not isinstance(registry, Registry):
        refuse("must be None or a Registry (jaxprice.Registry([folders]))" + hint, field="registry",
               value=shown(registry), has_value=True)


def read_yaml(path) -> dict:
    docs = read_yaml_documents(path)
    if len(docs) != 1:
        refuse(f"expected one YAML document, found {len(docs)}", file=str(path))
    return docs[0]


def check_keys(mapping: dict, allowed, *, file, where: str, required=(), ignore_comments=False):
    """Refuse unknown keys (strict reading) and missing required ones."""
    for key in mapping:
        if ignore_comments and isinstance(key, str) and key.startswith("_comment"):
            continue
        if key not in allowed:
            refuse(f"unknown key (allowed: {', '.join(sorted(allowed))})", file=file,
                   field=f"{where}{key}", value=mapping[key], has_value=True)
    for key in required:
        if key not in mapping:
            refuse("required key is missing", file=file, field=f"{where}{key}")


def _number(value, *, file, field, integer=False, minimum=None, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        refuse("expected a number", file=file, field=field, value=value, has_value=True)
    if isinstance(value, float) and not math.isfinite(value):
        refuse("expected a finite number", file=file, field=field, value=value)
    if integer and (value != int(value)):
        refuse("expected an integer", file=file, field=field, value=value)
    if minimum is not None and value < minimum:
        refuse(f"must be >= {minimum}", file=file, field=field, value=value, has_value=True)
    return int(value) if integer else value


# ----------------------------------------------------------------------------- model graph

COLLECTIVE_OPS = ("AllReduce", "AllGather", "ReduceScatter", "All2All")
ATTENTION_KINDS = ("gqa", "mla", "sparse_mla", "swa")
RECURRENT_KINDS = ("mamba2", "kda", "gdn")
EMIT_CONDITIONS = ("", "tensor_parallel", "expert_parallel", "tensor_parallel_unless_sp_moe")


@dataclasses.dataclass(frozen=True)
class ModelGraph:
    """A model as distinct layer kinds (lists of node dicts), a stack and a head."""
    name: str
    hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    weight_dtype: str
    modality: str
    layer_kinds: dict          # id -> tuple of node dicts, in declaration order
    stack: dict                # {prologue, pattern, repeat, epilogue}
    head: tuple
    speculator: dict | None
    capture_breaks: dict       # kind id -> captured regions its own code leaves (extension)
    source: str
    path: str
    max_model_len: int | None = None   # the longest sequence vLLM serves it at (imported graphs; extension)
    kv_cache_dtype: str | None = None  # the KV cache the checkpoint calibrated, 'fp8' (imported graphs; extension)

    def expanded_stack(self) -> list:
        s = self.stack
        return list(s["prologue"]) + list(s["pattern"]) * int(s["repeat"]) + list(s["epilogue"])


def _parse_node(node, *, file, where):
    if not isinstance(node, dict):
        refuse("a node must be a mapping", file=file, field=where, value=node)
    op = node.get("op")
    if op not in NODE_KEYS:
        refuse(f"unknown op (known: {', '.join(NODE_KEYS)})", file=file, field=f"{where}.op",
               value=op, has_value=True)
    check_keys(node, NODE_KEYS[op], file=file, where=f"{where}.",
               required=NODE_REQUIRED.get(op, ()))
    out = dict(node)
    for key, val in node.items():
        if key in _INT_FIELDS:
            out[key] = _number(val, file=file, field=f"{where}.{key}", integer=True, minimum=0)
        elif key == "bytes_per_token":
            out[key] = _number(val, file=file, field=f"{where}.{key}", minimum=0)
            if op in COLLECTIVE_OPS and out[key] == 0:
                refuse("a collective's bytes_per_token must be > 0 (leave it out for 2 x hidden)",
                       file=file, field=f"{where}.{key}", value=val)
    emit = node.get("emit", "") or ""
    if op in COLLECTIVE_OPS and "emit" not in node:
        refuse("a collective must carry an emit condition", file=file, field=f"{where}.emit")
    if emit not in EMIT_CONDITIONS:
        refuse(f"unrecognised emit condition (known: {', '.join(repr(e) for e in EMIT_CONDITIONS)})",
               file=file, field=f"{where}.emit", value=emit)
    out["emit"] = emit
    if "weight_dtype" in node and node["weight_dtype"] not in DTYPE_BYTES:
        refuse("unknown dtype", file=file, field=f"{where}.weight_dtype", value=node["weight_dtype"])
    if op == "Attention":
        if node["kind"] not in ATTENTION_KINDS:
            refuse(f"unknown attention kind (known: {', '.join(ATTENTION_KINDS)})", file=file,
                   field=f"{where}.kind", value=node["kind"])
        if node["kind"] == "swa" and not node.get("window"):
            refuse("a swa attention must state its window", file=file, field=f"{where}.window")
        prefill_dims = [k for k in ("qk_nope_head_dim", "v_head_dim") if k in node]
        if prefill_dims and node["kind"] != "mla":
            refuse("qk_nope_head_dim and v_head_dim are an mla attention's prefill head dimensions",
                   file=file, field=f"{where}.{prefill_dims[0]}", value=node[prefill_dims[0]])
        if prefill_dims and (len(prefill_dims) == 1 or "qk_rope_head_dim" not in node):
            missing = next(k for k in ("qk_nope_head_dim", "v_head_dim", "qk_rope_head_dim") if k not in node)
            refuse("an mla attention stating its prefill head dimensions needs qk_nope_head_dim, "
                   "v_head_dim and qk_rope_head_dim", file=file, field=f"{where}.{missing}")
    if op == "RecurrentUpdate" and node["recurrent_kind"] not in RECURRENT_KINDS:
        refuse(f"unknown recurrent kind (known: {', '.join(RECURRENT_KINDS)})", file=file,
               field=f"{where}.recurrent_kind", value=node["recurrent_kind"])
    if op == "GroupedGEMM" and out["top_k"] > out["experts"]:
        refuse("top_k exceeds experts", file=file, field=f"{where}.top_k", value=out["top_k"])
    if op == "HyperConnection" and node["half"] not in ("pre", "post"):
        refuse("half must be 'pre' or 'post'", file=file, field=f"{where}.half", value=node["half"])
    if "phase" in node and node["phase"] not in ("prefill",):
        refuse("phase must be 'prefill' (the only phase marker)", file=file, field=f"{where}.phase",
               value=node["phase"])
    if "replicated" in node and not isinstance(node["replicated"], bool):
        refuse("replicated must be true or false", file=file, field=f"{where}.replicated",
               value=node["replicated"])
    if "gated" in node and not isinstance(node["gated"], bool):
        refuse("gated must be true or false", file=file, field=f"{where}.gated", value=node["gated"])
    return out


def _parse_nodes(nodes, *, file, where):
    if not isinstance(nodes, list):
        refuse("expected a list of nodes", file=file, field=where, value=type(nodes).__name__)
    return tuple(_parse_node(n, file=file, where=f"{where}[{i}]") for i, n in enumerate(nodes))


def _parse_stack(stack, kinds, *, file, where="stack"):
    if not isinstance(stack, dict):
        refuse("expected a mapping", file=file, field=where)
    check_keys(stack, {"prologue", "pattern", "repeat", "epilogue"}, file=file, where=f"{where}.")
    out = {"prologue": list(stack.get("prologue") or []), "pattern": list(stack.get("pattern") or []),
           "repeat": _number(stack.get("repeat", 0) or 0, file=file, field=f"{where}.repeat",
                             integer=True, minimum=0),
           "epilogue": list(stack.get("epilogue") or [])}
    for part in ("prologue", "pattern", "epilogue"):
        for kid in out[part]:
            if kid not in kinds:
                refuse("the stack names an undeclared layer kind", file=file,
                       field=f"{where}.{part}", value=kid)
    if not (out["prologue"] or out["epilogue"] or (out["pattern"] and out["repeat"])):
        refuse("the stack has no layers (prologue, pattern x repeat and epilogue are all empty)", file=file,
               field=where, value=stack, has_value=True)
    return out


_OWN_MODEL_KEYS = {"format", "name", "source", "hf_repo", "hf_revision", "config_sha256",
                   "hidden_size", "vocab_size", "tie_word_embeddings", "weight_dtype", "modality",
                   "layer_kinds", "stack", "head", "speculator", "capture_breaks", "max_model_len",
                   "kv_cache_dtype"}
_PUBLIC_MODEL_KEYS = {"kind", "name", "derived_from", "global", "layer_kinds", "stack", "head",
                      "speculator", "modality"}


@_cached
def load_model_graph(path) -> ModelGraph:
    """Read a model graph: the project format (``format: jaxprice-model/1``) or a public
    ``kind: ModelGraph`` file; a Hugging Face ``config.json`` (or a folder holding one) is
    imported (jaxprice/_src/hf.py)."""
    _check_path(path)
    file = str(path)
    from .hf import import_hf_config, is_hf_config
    if is_hf_config(path):
        return import_hf_config(path)
    doc = read_yaml(path)
    glob, raw_kinds, source = _model_layout(doc, file)
    kinds = _parse_layer_kinds(raw_kinds, file)
    stack = _parse_stack(doc["stack"], kinds, file=file)
    head = _parse_nodes(doc.get("head") or [], file=file, where="head")
    spec = _parse_speculator(doc.get("speculator"), kinds, file)
    breaks = _parse_capture_breaks(doc.get("capture_breaks") or {}, kinds, file)
    return ModelGraph(**_model_globals(doc, glob, file), layer_kinds=kinds, stack=stack, head=head,
                      speculator=spec, capture_breaks=breaks, source=source, path=file)


def _model_layout(doc, file) -> tuple:
    """(the mapping holding the global fields, [(layer kind id, raw nodes)], source) of either
    format; a document of neither format is refused."""
    if doc.get("format") == "jaxprice-model/1":
        return _own_model_layout(doc, file)
    if doc.get("kind") == "ModelGraph":
        return _public_model_layout(doc, file)
    refuse("not a model graph: expected 'format: jaxprice-model/1' or 'kind: ModelGraph'",
           file=file, field="format" if "format" in doc else "kind",
           value=doc.get("format", doc.get("kind")))


def _own_model_layout(doc, file) -> tuple:
    """The project format: global fields at the top, layer kinds a mapping of id to nodes."""
    schema.check(doc, schema.MODEL_OWN, file=file)
    check_keys(doc, _OWN_MODEL_KEYS, file=file, where="",
               required=("name", "hidden_size", "vocab_size", "weight_dtype", "layer_kinds", "stack"))
    if not isinstance(doc["layer_kinds"], dict):
        refuse("expected a mapping of kind id to nodes", file=file, field="layer_kinds")
    return doc, list(doc["layer_kinds"].items()), doc.get("source", file)


def _public_model_layout(doc, file) -> tuple:
    """The public format: global fields under ``global``, layer kinds a list of {id, nodes, edges}."""
    schema.check(doc, schema.MODEL_PUBLIC, file=file)
    check_keys(doc, _PUBLIC_MODEL_KEYS, file=file, where="",
               required=("name", "global", "layer_kinds", "stack"))
    glob = doc["global"]
    if not isinstance(glob, dict):
        refuse("expected a mapping", file=file, field="global")
    check_keys(glob, {"hidden_size", "vocab_size", "tie_word_embeddings", "weight_dtype"},
               file=file, where="global.", required=("hidden_size", "vocab_size", "weight_dtype"))
    raw_kinds = []
    for i, kind in enumerate(doc["layer_kinds"] or []):
        if not isinstance(kind, dict):
            refuse("a layer kind must be a mapping", file=file, field=f"layer_kinds[{i}]")
        check_keys(kind, {"id", "nodes", "edges"}, file=file, where=f"layer_kinds[{i}].",
                   required=("id", "nodes"))
        raw_kinds.append((kind["id"], kind["nodes"]))
    return glob, raw_kinds, file


def _parse_layer_kinds(raw_kinds, file) -> dict:
    """Layer kind id -> parsed nodes, in declaration order; an id declared twice is refused."""
    kinds = {}
    for kid, nodes in raw_kinds:
        if kid in kinds:
            refuse("duplicate layer kind id", file=file, field="layer_kinds", value=kid)
        kinds[kid] = _parse_nodes(nodes, file=file, where=f"layer_kinds.{kid}.nodes")
    return kinds


def _parse_speculator(spec, kinds, file):
    """The speculator block with num_spec_tokens (default 1) and its stack checked; None when absent."""
    if spec is None:
        return None
    check_keys(spec, {"method", "num_spec_tokens", "stack"}, file=file,
               where="speculator.", required=("method",))
    spec = dict(spec)
    spec["num_spec_tokens"] = _number(spec.get("num_spec_tokens", 1), file=file,
                                      field="speculator.num_spec_tokens", integer=True, minimum=1)
    spec["stack"] = _parse_stack(spec.get("stack") or {}, kinds, file=file, where="speculator.stack")
    return spec


def _parse_capture_breaks(breaks, kinds, file) -> dict:
    """Layer kind id -> captured regions its own code leaves (an integer >= 1, for declared kinds)."""
    if not isinstance(breaks, dict):
        refuse("expected a mapping of layer kind id to regions", file=file, field="capture_breaks")
    for kid, n in breaks.items():
        if kid not in kinds:
            refuse("names an undeclared layer kind", file=file, field="capture_breaks", value=kid)
        _number(n, file=file, field=f"capture_breaks.{kid}", integer=True, minimum=1)
    return {k: int(v) for k, v in breaks.items()}


def _model_globals(doc, glob, file) -> dict:
    """The graph's scalar fields (name, sizes, weight dtype, modality, max_model_len), checked in
    that order after the weight dtype; ``glob`` holds the global fields of either format."""
    wd = glob["weight_dtype"]
    if wd not in DTYPE_BYTES:
        refuse("unknown dtype", file=file, field="weight_dtype", value=wd)
    return dict(
        name=str(doc["name"]),
        hidden_size=_number(glob["hidden_size"], file=file, field="hidden_size", integer=True, minimum=1),
        vocab_size=_number(glob["vocab_size"], file=file, field="vocab_size", integer=True, minimum=1),
        tie_word_embeddings=bool(glob.get("tie_word_embeddings", False)),
        weight_dtype=wd, modality=str(doc.get("modality", "text_only")),
        max_model_len=None if doc.get("max_model_len") is None else
        _number(doc["max_model_len"], file=file, field="max_model_len", integer=True, minimum=1),
        kv_cache_dtype=_calibrated_cache(doc.get("kv_cache_dtype"), file))


# The KV cache dtypes a checkpoint can calibrate that vLLM's --kv-cache-dtype auto then takes
CALIBRATED_CACHES = ("fp8",)


def _calibrated_cache(value, file):
    if value is None or value in CALIBRATED_CACHES:
        return value
    refuse(f"must be one of {', '.join(CALIBRATED_CACHES)} (the KV cache the checkpoint calibrated) or absent",
           file=file, field="kv_cache_dtype", value=value, has_value=True)


# ----------------------------------------------------------------------------- chips, fabrics


@dataclasses.dataclass(frozen=True)
class Chip:
    """A GPU part. Rates in catalog units (TFLOP/s, TB/s, GB/s); None = not stated."""
    name: str
    bf16_tflops: float
    fp8_tflops: float | None
    nvfp4_tflops: float | None
    tf32_tflops: float | None
    hbm_tbs: float
    memory_gib: float
    nvlink_gbps: float
    sm_count: int | None
    gpus_per_node: int | None
    gpus_per_rack: int | None
    rack_gbps: float | None
    source: str


@dataclasses.dataclass(frozen=True)
class Network:
    name: str
    internode_gbps: float
    source: str


_OWN_CHIP_KEYS = {"bf16_tflops", "fp8_tflops", "nvfp4_tflops", "tf32_tflops", "hbm_tbs",
                  "memory_gib", "nvlink_gbps", "sm_count", "gpus_per_node", "gpus_per_rack",
                  "rack_gbps", "provenance", "source"}
_PUBLIC_CHIP_KEYS = {"Provenance", "TFlopsPeak", "TFlopsFP8", "TFlopsNVFP4", "BwPeakTBs",
                     "MemoryGiB", "IntraNodeBwGBps", "SMCount", "GPUsPerNode", "GPUsPerRack",
                     "IntraRackBwGBps", "TFlopsTF32"}


def _chip_from_fields(name, f, *, file, where):
    def num(key, required=False, integer=False):
        val = f.get(key)
        if val is None:
            if required:
                refuse("required chip figure is missing", file=file, field=f"{where}{key}")
            return None
        return _number(val, file=file, field=f"{where}{key}", integer=integer, minimum=0)
    bf16 = num("bf16_tflops", True)
    return Chip(name=name, bf16_tflops=bf16, fp8_tflops=num("fp8_tflops"),
                nvfp4_tflops=num("nvfp4_tflops"), tf32_tflops=num("tf32_tflops"),
                hbm_tbs=num("hbm_tbs", True), memory_gib=num("memory_gib", True),
                nvlink_gbps=num("nvlink_gbps", True), sm_count=num("sm_count", integer=True),
                gpus_per_node=num("gpus_per_node", integer=True),
                gpus_per_rack=num("gpus_per_rack", integer=True), rack_gbps=num("rack_gbps"),
                source=str(f.get("source", file)))


@_cached
def load_chips(path) -> tuple[dict, dict]:
    """Read the project's chips.yaml: (chips by name, networks by name)."""
    file = str(path)
    doc = read_yaml(path)
    if doc.get("format") != "jaxprice-chips/1":
        refuse("not a jaxprice chips file", file=file, field="format", value=doc.get("format"))
    schema.check_chips(doc, file=file)
    check_keys(doc, {"format", "chips", "networks", "derived"}, file=file, where="", required=("chips",))
    chips = {}
    for name, fields in (doc.get("chips") or {}).items():
        if not isinstance(fields, dict):
            refuse("expected a mapping", file=file, field=f"chips.{name}")
        check_keys(fields, _OWN_CHIP_KEYS, file=file, where=f"chips.{name}.")
        chips[name] = _chip_from_fields(name, fields, file=file, where=f"chips.{name}.")
    nets = {}
    for name, fields in (doc.get("networks") or {}).items():
        check_keys(fields, {"internode_gbps", "rdma", "source"}, file=file, where=f"networks.{name}.",
                   required=("internode_gbps",))
        nets[name] = Network(name, _number(fields["internode_gbps"], file=file,
                                           field=f"networks.{name}.internode_gbps", minimum=0),
                             str(fields.get("source", file)))
    return chips, nets


@_cached
def load_public_chip(path) -> Chip:
    """Read a public catalog ``hardware/<chip>.yaml`` (PascalCase keys, ``_comment*`` ignored)."""
    file = str(path)
    doc = read_yaml(path)
    schema.check_public_chip(doc, file=file)
    check_keys(doc, _PUBLIC_CHIP_KEYS, file=file, where="", ignore_comments=True,
               required=("TFlopsPeak", "BwPeakTBs", "MemoryGiB", "IntraNodeBwGBps"))
    m = {"TFlopsPeak": "bf16_tflops", "TFlopsFP8": "fp8_tflops", "TFlopsNVFP4": "nvfp4_tflops",
         "TFlopsTF32": "tf32_tflops", "BwPeakTBs": "hbm_tbs", "MemoryGiB": "memory_gib",
         "IntraNodeBwGBps": "nvlink_gbps", "SMCount": "sm_count", "GPUsPerNode": "gpus_per_node",
         "GPUsPerRack": "gpus_per_rack", "IntraRackBwGBps": "rack_gbps"}
    fields = {m[k]: v for k, v in doc.items() if k in m}
    if fields.get("tf32_tflops") is None and isinstance(fields.get("bf16_tflops"), (int, float)):
        # as registry/chips.yaml: the dense TF32 tensor rate is half the dense BF16 rate
        fields["tf32_tflops"] = fields["bf16_tflops"] / 2
    fields["source"] = file
    return _chip_from_fields(Path(path).stem, fields, file=file, where="")


@_cached
def load_public_network(path) -> Network:
    file = str(path)
    doc = read_yaml(path)
    schema.check_public_network(doc, file=file)
    check_keys(doc, {"Provenance", "InterNodeBwGBps", "RDMA", "PDTransferBaseLatencyMs"}, file=file,
               where="", ignore_comments=True, required=("InterNodeBwGBps",))
    return Network(Path(path).stem, _number(doc["InterNodeBwGBps"], file=file,
                                            field="InterNodeBwGBps", minimum=0), file)


# ----------------------------------------------------------------------------- coefficients



@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    value: float
    units: str
    scope: dict                 # dimension -> tuple of admitted values
    cite: str
    method: str = ""


@dataclasses.dataclass(frozen=True)
class CoefficientSet:
    name: str
    entries: tuple
    source: str
    path: str


def _parse_entry(name, body, *, file, where, cite_default):
    if not isinstance(body, dict):
        refuse("expected a mapping", file=file, field=where)
    value = _number(body.get("value"), file=file, field=f"{where}.value")
    scope = body.get("scope") or {}
    if not isinstance(scope, dict) or not scope:
        refuse("an entry needs a scope over at least one of " + ", ".join(SCOPE_KEYS), file=file,
               field=f"{where}.scope", value=scope)
    for key, vals in scope.items():
        if key not in SCOPE_KEYS:
            refuse(f"unknown scope dimension (known: {', '.join(SCOPE_KEYS)})", file=file,
                   field=f"{where}.scope.{key}", value=vals, has_value=True)
        if not isinstance(vals, list):
            refuse("a scope dimension must be a list", file=file, field=f"{where}.scope.{key}",
                   value=vals)
    scope = {k: tuple(v) for k, v in scope.items()}
    units = body.get("units")
    if not isinstance(units, str):
        refuse("every coefficient states its units", file=file, field=f"{where}.units", value=units)
    if not _known_units(units):
        # a unit the kernel cannot convert would be read as SI and be off by up to 1e6
        refuse("unknown units (known: " + ", ".join(KNOWN_UNITS) + ", or us_per_<thing>)", file=file,
               field=f"{where}.units", value=units)
    return Entry(name=str(name), value=float(value), units=units, scope=scope,
                 cite=str(body.get("cite", cite_default)), method=str(body.get("method", "")))


_OWN_ENTRY_KEYS = {"name", "value", "units", "scope", "cite", "method", "fitted", "ci95",
                   "measured_on", "fit"}
_PUBLIC_ENTRY_KEYS = {"value", "units", "method", "fitted", "scope", "ci95", "sources",
                      "rationale", "copied_from", "supersedes", "validated", "unsupported"}


_SET_CACHE: dict = {}


def coefficient_set_files(files, *, field: str) -> tuple:
    """Coefficient set files given to a command or a search, as absolute paths (so a scenario
    listing them resolves them from any folder), each read now: an empty name, a missing or
    malformed file is refused, naming ``field``, before anything is resolved. None: none; one path
    alone: that one."""
    if files is None or isinstance(files, (str, bytes, os.PathLike)):
        files = () if files is None else (files,)
    out = []
    for f in files:
        if not isinstance(f, (str, os.PathLike)) or not str(f).strip():
            refuse("expected the path of a coefficient set file", field=field, value=f, has_value=True)
        load_coefficient_set(f)
        out.append(str(Path(f).expanduser().resolve()))
    return tuple(out)


def load_coefficient_set(path) -> CoefficientSet:
    """Read a coefficient set: project format or a public ``kind: CoefficientSet`` file.

    Parsed sets are cached by path and content digest (sets are immutable once read), so
    resolving many deployments parses the large collectives set once."""
    _check_path(path)
    try:
        # by the resolved path: registry roots that link one file parse it once
        key = (str(Path(path).resolve()), hashlib.sha1(Path(path).read_bytes()).hexdigest())
    except OSError:
        key = None
    if key is not None and key in _SET_CACHE:
        return _SET_CACHE[key]
    cset = _read_coefficient_set(path)
    if key is not None:
        if len(_SET_CACHE) >= 64:
            _SET_CACHE.clear()
        _SET_CACHE[key] = cset
    return cset


def _read_coefficient_set(path) -> CoefficientSet:
    file = str(path)
    doc = read_yaml(path)
    entries = []
    if doc.get("format") == "jaxprice-coefficients/1":
        schema.check(doc, schema.COEFFICIENTS_OWN, file=file)
        check_keys(doc, {"format", "name", "source", "entries", "fit"}, file=file, where="",
                   required=("name", "entries"))
        for i, e in enumerate(doc["entries"] or []):
            if not isinstance(e, dict):
                refuse("expected a mapping", file=file, field=f"entries[{i}]")
            check_keys(e, _OWN_ENTRY_KEYS, file=file, where=f"entries[{i}].",
                       required=("name", "value", "units", "scope"))
            entries.append(_parse_entry(e["name"], e, file=file, where=f"entries[{i}]",
                                        cite_default=doc.get("source", file)))
        source = str(doc.get("source", file))
    elif doc.get("kind") == "CoefficientSet":
        schema.check(doc, schema.COEFFICIENTS_PUBLIC, file=file)
        check_keys(doc, {"kind", "name", "coefficients"}, file=file, where="",
                   required=("name", "coefficients"))
        for i, item in enumerate(doc["coefficients"] or []):
            if not isinstance(item, dict) or len(item) != 1:
                refuse("each coefficient is a single-key mapping", file=file,
                       field=f"coefficients[{i}]")
            (name, body), = item.items()
            check_keys(body, _PUBLIC_ENTRY_KEYS, file=file, where=f"coefficients[{i}].{name}.")
            entries.append(_parse_entry(name, body, file=file, where=f"coefficients[{i}].{name}",
                                        cite_default=file))
        source = file
    else:
        refuse("not a coefficient set: expected 'format: jaxprice-coefficients/1' or "
               "'kind: CoefficientSet'", file=file, field="format")
    return CoefficientSet(name=str(doc["name"]), entries=tuple(entries), source=source, path=file)


# ----------------------------------------------------------------------------- scenario

@dataclasses.dataclass(frozen=True)
class Scenario:
    """A Scenario document and the Deployment pool it prices."""
    name: str
    model: str
    hardware: str
    fabric: str | None
    nodes: int
    gpus_per_node: int
    gpus_per_rack: int
    coefficient_sets: tuple
    engine_version: str
    pool_nodes: int
    parallel: dict
    engine: dict
    path: str
    pool_index: int = 0        # which of the Deployment's pools this is (for field paths in messages)
    pool_role: str = "colocated"   # its role (prefill, decode, colocated), as the file states it
    pools: int = 1             # how many pools the Deployment has

    @property
    def pool_field(self) -> str:
        """The path of this pool in its file, for refusals: ``Deployment.pools[i]``."""
        return f"Deployment.pools[{self.pool_index}]"


# vLLM's CacheConfig.BlockSize (vllm/config/cache.py, the --block-size choices): any other size
# and the engine does not start.
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)


def load_scenario(path, pool_index: int | None = None) -> Scenario:
    """Read a two-document Scenario + Deployment YAML (the public blis-schemas form).

    ``pool_index`` picks the Deployment pool to price; it may be left out only when the
    Deployment has one pool (a second pool is never ignored silently)."""
    _check_path(path)
    file = str(path)
    scen, dep = _scenario_documents(path, file)
    cluster, sets, pools, nodes = _cluster_and_pools(scen, dep, file)
    pool_index = _pool_index(pools, pool_index, file)
    pool = pools[pool_index]
    where = f"Deployment.pools[{pool_index}]."
    check_keys(pool, {"role", "nodes", "parallel", "engine"}, file=file, where=where,
               required=("parallel",))
    parallel = _pool_parallel(pool, file, where)
    engine = _pool_engine(pool, file, where)

    def count(key, default):
        val = cluster.get(key, default)
        val = _number(val, file=file, field=f"Scenario.cluster.{key}", integer=True, minimum=0)
        if val == 0 and cluster.get(key) is not None:
            # 0 is what an absent key reads as (the chip's value, if it has one); stated, it
            # would be taken as unset and the header would say "x 0"
            refuse("impossible value: must be >= 1 (leave the key out to take the chip's value)",
                   file=file, field=f"Scenario.cluster.{key}", value=0)
        return val
    per_node, per_rack = count("gpus_per_node", 0), count("gpus_per_rack", 0)
    pool_nodes = _number(pool.get("nodes", 1), file=file, field=where + "nodes", integer=True, minimum=1)
    # tp x dp: pp and pcp > 1 are refused at resolve time (COVERAGE LIMIT), with their own message
    ranks = int(parallel.get("tp", 1) or 1) * int(parallel.get("dp", 1) or 1)
    if per_node and ranks > pool_nodes * per_node:
        refuse(f"tp x dp = {ranks} ranks do not fit the pool's {pool_nodes} node"
               f"{'s' if pool_nodes != 1 else ''} x {per_node} GPUs (Scenario.cluster.gpus_per_node)",
               file=file, field=where + "parallel", value=ranks)
    return Scenario(
        name=str(scen["name"]), model=str(scen["model"]), hardware=str(cluster["hardware"]),
        fabric=cluster.get("fabric"), nodes=nodes, gpus_per_node=per_node,
        gpus_per_rack=per_rack, coefficient_sets=tuple(sets),
        engine_version=str(scen.get("engine_version", "")),
        pool_nodes=pool_nodes, parallel=parallel, engine=engine, path=file, pool_index=pool_index,
        pool_role=str(pool.get("role", "colocated")), pools=len(pools))


def _scenario_documents(path, file) -> tuple:
    """The (Scenario, Deployment) documents, their kinds checked, then the declared schema
    (types, ranges, allowed values, every pool)."""
    docs = read_yaml_documents(path)
    if len(docs) != 2:
        refuse(f"expected two documents (Scenario, then Deployment), found {len(docs)}", file=file)
    scen, dep = docs
    if scen.get("kind") != "Scenario":
        refuse("the first document must be kind: Scenario", file=file, field="kind",
               value=scen.get("kind"))
    if dep.get("kind") != "Deployment":
        refuse("the second document must be kind: Deployment", file=file, field="kind",
               value=dep.get("kind"))
    schema.check_scenario(scen, dep, file=file)
    return scen, dep


def _cluster_and_pools(scen, dep, file) -> tuple:
    """(cluster, coefficient sets, pools, cluster nodes): the keys each block may hold, and every
    pool's node count within the cluster's (whichever pool is priced)."""
    check_keys(scen, {"kind", "name", "engine_version", "model", "coefficients", "cluster",
                      "workload"}, file=file, where="Scenario.",
               required=("name", "model", "coefficients", "cluster"))
    cluster = scen["cluster"]
    if not isinstance(cluster, dict):
        refuse("expected a mapping", file=file, field="Scenario.cluster")
    check_keys(cluster, {"hardware", "fabric", "nodes", "gpus_per_node", "gpus_per_rack", "storage"},
               file=file, where="Scenario.cluster.", required=("hardware",))
    sets = scen["coefficients"]
    if not isinstance(sets, list) or not sets or not all(isinstance(s, str) for s in sets):
        refuse("expected a non-empty list of coefficient set names", file=file,
               field="Scenario.coefficients", value=sets)
    check_keys(dep, {"kind", "name", "pools", "offload", "pd_transfer"}, file=file,
               where="Deployment.", required=("pools",))
    pools = dep["pools"]
    if not isinstance(pools, list) or not pools:
        refuse("expected a non-empty list of pools", file=file, field="Deployment.pools")
    nodes = _number(cluster.get("nodes", 1), file=file, field="Scenario.cluster.nodes", integer=True, minimum=1)
    for i, other in enumerate(pools):
        want = _number(other.get("nodes", 1), file=file, field=f"Deployment.pools[{i}].nodes", integer=True,
                       minimum=1)
        if want > nodes:
            refuse(f"the pool needs more nodes than the cluster has (Scenario.cluster.nodes {nodes})",
                   file=file, field=f"Deployment.pools[{i}].nodes", value=want)
    return cluster, sets, pools, nodes


def _pool_index(pools, pool_index, file) -> int:
    """The pool to price: the only one, or ``pool_index`` (an integer in range); a deployment of
    several pools with none named is refused (COVERAGE LIMIT [one-pool])."""
    if pool_index is None:
        if len(pools) > 1:
            roles = ", ".join(str(p.get("role", "colocated")) if isinstance(p, dict) else "?" for p in pools)
            refuse(f"COVERAGE LIMIT [one-pool]: the deployment has {len(pools)} pools ({roles}) and jaxprice "
                   f"prices one pool's step at a time, not the deployment as a whole: write one scenario per "
                   f"pool, or pick one (the commands' --pool 0..{len(pools) - 1}; "
                   "load_deployment(path, pool_index=i))", file=file,
                   field="Deployment.pools", value=len(pools))
        pool_index = 0
    if isinstance(pool_index, bool) or not isinstance(pool_index, numbers.Integral):   # "0", 0.0, True
        refuse("expected an integer pool index (0-based)", file=file, field="Deployment.pools", value=pool_index)
    pool_index = int(pool_index)
    if not 0 <= pool_index < len(pools):
        refuse(f"pool index out of range (the deployment has {len(pools)})", file=file,
               field="Deployment.pools", value=pool_index)
    return pool_index


def _pool_parallel(pool, file, where) -> dict:
    """The pool's parallel block, its widths integers >= 1."""
    parallel = dict(pool["parallel"] or {})
    check_keys(parallel, PARALLEL_KEYS, file=file, where=where + "parallel.")
    for key in ("tp", "pp", "dp", "dp_local", "pcp", "dcp"):
        if key in parallel:
            parallel[key] = _number(parallel[key], file=file, field=f"{where}parallel.{key}",
                                    integer=True, minimum=1)
    return parallel


def _pool_engine(pool, file, where) -> dict:
    """The pool's engine block: its limits integers >= 1, a block size vLLM starts with, the
    speculative block's keys."""
    engine = dict(pool.get("engine") or {})
    check_keys(engine, ENGINE_KEYS, file=file, where=where + "engine.")
    for key in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                "max_cudagraph_capture_size"):
        if key in engine:
            engine[key] = _number(engine[key], file=file, field=f"{where}engine.{key}",
                                  integer=True, minimum=1)
    if "block_size" in engine and engine["block_size"] not in VLLM_BLOCK_SIZES:
        refuse(f"vLLM would not start: the block size must be one of {', '.join(map(str, VLLM_BLOCK_SIZES))} "
               "(vLLM's CacheConfig.BlockSize)", file=file, field=f"{where}engine.block_size",
               value=engine["block_size"])
    # COVERAGE LIMIT [max-model-len-vs-context]: max_model_len is checked against the model's own
    # (resolve._check_context) only where its graph states one: imported graphs do, from config.json,
    # and the bundled graphs whose repo's config.json is bundled (all of them today); a graph file
    # written by hand without it is not checked
    spec = engine.get("speculative")
    if spec is not None:
        if not isinstance(spec, dict):
            refuse("expected a mapping", file=file, field=f"{where}engine.speculative")
        check_keys(spec, {"method", "num_spec_tokens"}, file=file,
                   where=f"{where}engine.speculative.", required=("num_spec_tokens",))
        _number(spec["num_spec_tokens"], file=file, field=f"{where}engine.speculative.num_spec_tokens",
                integer=True, minimum=1)
    return engine


# ----------------------------------------------------------------------------- registry lookup


def default_registry_root() -> Path:
    env = os.environ.get("JAXPRICE_REGISTRY")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "registry"


class Registry:
    """Finds models, chips, fabrics and coefficient sets under one or more roots.

    A root may be the project's registry (``chips.yaml``, ``models/<name>.yaml``,
    ``coefficients/<set>.yaml``) or a checkout of the public catalog and registry
    (``hardware/<chip>.yaml``, ``networks/<fabric>.yaml``, ``models/<name>/graph.yaml``,
    ``coefficients/<set>.yaml``, optionally under ``catalog/`` and ``registry/``). Earlier
    roots win.
    """

    def __init__(self, roots=None):
        env = os.environ.get("JAXPRICE_REGISTRY")
        if roots is None and env and not Path(env).is_dir():      # else "unknown chip (no entry under ...)"
            refuse("the registry named by the environment is not a folder", field="JAXPRICE_REGISTRY", value=env)
        roots = [default_registry_root()] if roots is None else roots
        roots = roots if isinstance(roots, (list, tuple)) else [roots]
        for r in roots:
            if not isinstance(r, (str, os.PathLike)):
                refuse("must be registry folders (str or path, or a list of them)", field="registry_roots",
                       value=shown(r), has_value=True)
            if not str(r).strip():      # '' was the working folder: every lookup then missed
                refuse("an empty registry folder name", field="registry_roots", value=str(r), has_value=True)
        self.roots = [Path(r) for r in roots]
        self._chips = None

    def _candidates(self, *rel):
        for root in self.roots:
            for prefix in ("", "catalog", "registry"):
                yield root / prefix / Path(*rel)

    def _own_chips(self):
        if self._chips is None:
            chips, nets = {}, {}
            for root in reversed(self.roots):
                f = root / "chips.yaml"
                if f.exists():
                    c, n = load_chips(f)
                    chips.update(c)
                    nets.update(n)
            self._chips = (chips, nets)
        return self._chips

    def _where(self):
        return ", ".join(str(r) for r in self.roots)

    def model(self, name, *, file=None, field=None) -> ModelGraph:
        from .hf import bundled_config, bundled_config_names, hf_config_ref, import_hf_config
        _lookup_name(name, "model", file, field, paths=True)
        ref = hf_config_ref(name, file, paths_only=True)   # a config.json path, or a folder holding one
        if ref is not None:
            return import_hf_config(ref)
        graph = _graph_file_ref(name, file, field)           # a model graph file (jaxprice import-model's)
        if graph is not None:
            return load_model_graph(graph)
        for root in self.roots:          # root-major, so an earlier root wins in either layout
            for prefix in ("", "catalog", "registry"):
                for cand in (root / prefix / "models" / f"{name}.yaml",
                             root / prefix / "models" / name / "graph.yaml"):
                    if cand.exists():
                        return load_model_graph(cand)
        ref = hf_config_ref(name, file)
        if ref is not None:
            return import_hf_config(ref)
        ref = bundled_config(name)        # a model whose config.json is bundled (testdata/hf): imported
        if ref is not None:
            return import_hf_config(ref)
        names = [f.stem for root in self.roots for prefix in ("", "catalog", "registry")
                 for f in sorted((root / prefix / "models").glob("*.yaml"))] + bundled_config_names()
        near = difflib.get_close_matches(str(name).lower(), list(dict.fromkeys(names)), n=3, cutoff=0.6)
        refuse(f"unknown model (no graph under {self._where()}, no bundled config.json of that name in "
               f"testdata/hf, and not a config.json or a folder holding one)"
               + (f"; near matches: {', '.join(near)}" if near else ""), file=file, field=field, value=name)

    def chip(self, name, *, file=None, field=None) -> Chip:
        _lookup_name(name, "chip", file, field)
        for root in self.roots:
            own = root / "chips.yaml"
            if own.exists():
                chips, _ = load_chips(own)
                if name in chips:
                    return chips[name]
            for prefix in ("", "catalog"):
                f = root / prefix / "hardware" / f"{name}.yaml"
                if f.exists():
                    return load_public_chip(f)
        refuse(f"unknown chip (no entry under {self._where()})", file=file, field=field, value=name)

    def network(self, name, *, file=None, field=None) -> Network:
        _lookup_name(name, "fabric", file, field)
        for root in self.roots:
            own = root / "chips.yaml"
            if own.exists():
                _, nets = load_chips(own)
                if name in nets:
                    return nets[name]
            for prefix in ("", "catalog"):
                f = root / prefix / "networks" / f"{name}.yaml"
                if f.exists():
                    return load_public_network(f)
        refuse(f"unknown fabric (known: {', '.join(self.network_names()) or 'none'}; under {self._where()})",
               file=file, field=field, value=name)

    def network_names(self) -> list:
        """Every fabric name the registry knows (its chips.yaml networks and networks/*.yaml)."""
        names = []
        for root in self.roots:
            own = root / "chips.yaml"
            if own.exists():
                names += list(load_chips(own)[1])
            for prefix in ("", "catalog"):
                names += [f.stem for f in sorted((root / prefix / "networks").glob("*.yaml"))]
        return list(dict.fromkeys(names))

    def coefficient_set(self, name, *, file=None, field=None) -> CoefficientSet:
        _lookup_name(name, "coefficient set", file, field, paths=True)
        for cand in self._candidates("coefficients", f"{name}.yaml"):
            if cand.exists():
                return load_coefficient_set(cand)
        p = Path(name)
        if p.suffix in (".yaml", ".yml"):      # a file: as given, then next to the scenario naming it (as a model's)
            for cand in [p] + ([Path(str(file)).parent / p] if file and not p.is_absolute() else []):
                if cand.is_file():
                    return load_coefficient_set(cand)
        refuse(f"unknown coefficient set (no file under {self._where()}"
               + (f", nor {name} as given or next to {file}" if p.suffix in (".yaml", ".yml") and file else "") + ")",
               file=file, field=field, value=name)


def _graph_file_ref(name, relative_to, field):
    """The model graph file a model reference spelled as a YAML path names (as given, then next to
    ``relative_to``, the scenario file naming it), or None for a reference not so spelled; one so
    spelled that names no file is refused (it is no registry name either)."""
    text = str(name)
    if not text.lower().endswith((".yaml", ".yml")):
        return None
    cands = [Path(text)]
    if relative_to and not Path(text).is_absolute():
        cands.append(Path(str(relative_to)).parent / text)
    for c in cands:
        if c.is_file():
            return c
    refuse("no such model graph file" + (f" (looked for it as given and next to {relative_to})" if relative_to
                                         and not Path(text).is_absolute() else ""),
           file=relative_to, field=field or "model", value=text)


def _lookup_name(name, what, file, field, paths=False) -> None:
    """A Registry lookup's name: non-empty text (or, where a file may stand for it, a path); None or
    a number raised TypeError joining it to a folder, or was refused without its value."""
    if (isinstance(name, str) and name.strip()) or (paths and isinstance(name, os.PathLike)):
        return
    refuse(f"needs a {what} name (text{' or a path' if paths else ''})", file=file, field=field or what,
           value=shown(name), has_value=True)


def as_path(value: Any) -> Path:
    return value if isinstance(value, Path) else Path(str(value))
