"""`jaxprice price SCENARIO`: price steps and print the per-resource table.

    jaxprice price deepseek-v3-h200-fp8-sglang-tp8 --decode 1,2,4,...,256 --context 4096
    jaxprice price SCENARIO --decode 8,32 --prefill 512,2048     # one mixed batch per decode count
    jaxprice price SCENARIO --batch step.yaml --batch other.csv  # batch files (see jaxprice.load_batch)

Every batch is priced in ONE vmapped call (``price_many``, a common padding). Lists take
commas and an ellipsis that continues the progression before it: ``1,2,4,...,256`` (powers
of two), ``16,32,...,256`` (steps of 16). This module also holds what the other commands
share: the list parser, the scenario lookup with near matches, the deployment line and the
engine limits check.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from .batchfile import DEFAULT_DECODE_THRESHOLD, read_batch_file
from .errors import refuse
from .outputs import check_image
from .plan import INT_TOKEN_LIMIT, RESOURCES, Batch
from .schema import MAX_REQUESTS, TOKEN_WHY, WIDTH_LIMIT
from .step import MAX_TEMPERATURE      # the smooth surrogates' bound, the library's own

DEFAULT_CONTEXT = 4096
MAX_LIST = 100_000
# The most requests in one step, --ignore-limits or not: the cap batch files have (schema.MAX_REQUESTS,
# 2**20); real engines run a few thousand at most, and a step of 2**20 rows prices in seconds.
MAX_STEP_REQUESTS = MAX_REQUESTS
# The most padded rows priced in one command (batches x padding): 2**22 rows take ~1.5 GB and some
# seconds; a list like --decode 1,2,...,100000 would pad 100000 batches to 131072 rows each (OOM).
MAX_PRICED_ROWS = 1 << 22
UNITS = {"ms": 1e3, "us": 1e6}

# ----------------------------------------------------------------------------- shared helpers


def parse_int(text, *, flag, minimum=None):
    """One integer from a command-line string, refused naming the flag."""
    t = str(text).strip()
    try:
        v = int(t)
    except ValueError:
        try:
            f = float(t)
        except ValueError:
            f = math.nan
        if not (math.isfinite(f) and f == round(f)):
            refuse("expected an integer", field=flag, value=str(text))
        v = int(f)
    if minimum is not None and v < minimum:
        refuse(f"must be at least {minimum}", field=flag, value=v)
    return v


def parse_float(text, *, flag, minimum=None, positive=False):
    """One finite number from a command-line string, refused naming the flag; ``positive``:
    it must be > 0 (the message says so, rather than ">= 0" and then refusing 0)."""
    try:
        v = float(str(text).strip())
    except ValueError:
        refuse("expected a number", field=flag, value=str(text))
    if positive:
        if not (math.isfinite(v) and v > 0):
            refuse("must be a finite number > 0", field=flag, value=v)
    elif not math.isfinite(v) or (minimum is not None and v < minimum):
        refuse(f"must be a finite number >= {minimum}" if minimum is not None else "must be finite",
               field=flag, value=v)
    return v


def parse_temperature(text, *, flag="--temperature", positive=False):
    """A smooth-mode temperature: finite, >= 0 (> 0 when ``positive``) and at most MAX_TEMPERATURE."""
    v = parse_float(text, flag=flag, minimum=0, positive=positive)
    if v > MAX_TEMPERATURE:
        refuse(f"must be at most {MAX_TEMPERATURE:g} (past it the smooth surrogates leave their bounds and the "
               "price is meaningless; 0.01 to 0.1 is typical)", field=flag, value=v)
    return v


def check_tokens(values, *, flag):
    """Token counts from the command line (contexts, prefill lengths), --ignore-limits or not, are below
    the kernel's token limit, as a batch file's are."""
    for v in values:
        if v >= INT_TOKEN_LIMIT:
            refuse(f"must be below {INT_TOKEN_LIMIT}{TOKEN_WHY}", field=flag, value=v)
    return values


def _continue(terms, end, *, flag, text):
    """The terms after ``terms`` up to ``end``: geometric when the last three are (1,2,4),
    else arithmetic from the last two (1,2 -> steps of 1)."""
    if len(terms) < 2:
        refuse("'...' needs two terms before it to set the step (e.g. 1,2,4,...,256)", field=flag, value=text)
    a, b = terms[-2], terms[-1]
    geometric = len(terms) >= 3 and terms[-3] > 0 and b * terms[-3] == a * a and b - a != a - terms[-3]
    if geometric:
        if b % a:
            refuse("a geometric '...' needs an integer ratio", field=flag, value=text)
        nxt, grow = (lambda v: v * (b // a)), b // a > 1
    else:
        if len(terms) >= 3 and b - a != a - terms[-3]:
            refuse("the terms before '...' are neither arithmetic nor geometric", field=flag, value=text)
        nxt, grow = (lambda v: v + (b - a)), b > a
    if not grow or end <= b:
        refuse("'...' must continue an increasing progression to a larger end", field=flag, value=text)
    out, v = [], b
    while v < end:
        v = nxt(v)
        out.append(v)
        if len(out) > MAX_LIST:
            refuse(f"expands to more than {MAX_LIST} values", field=flag, value=text)
    if out[-1] != end:
        refuse(f"the end {end} is not on the progression {', '.join(map(str, terms[-3:]))}, ...",
               field=flag, value=text)
    return out


def parse_int_list(text, *, flag, minimum=None, why=""):
    """'1,2,4,...,256' -> [1, 2, 4, ..., 256]; refused naming the flag and the value."""
    items = [t.strip() for t in str(text).split(",")]
    if not any(items):
        refuse("expected a comma-separated list of integers", field=flag, value=str(text))
    out = []
    i = 0
    while i < len(items):
        t = items[i]
        if t in ("...", "\u2026"):
            if i + 1 >= len(items):
                refuse("'...' needs an end after it (e.g. 1,2,4,...,256)", field=flag, value=str(text))
            end = parse_int(items[i + 1], flag=flag)
            out.extend(_continue(out, end, flag=flag, text=str(text)))
            i += 2
            continue
        if t == "":
            refuse("has an empty entry", field=flag, value=str(text))
        out.append(parse_int(t, flag=flag))
        i += 1
    if minimum is not None:
        for v in out:
            if v < minimum:
                refuse(f"every value must be at least {minimum}{why}", field=flag, value=v)
    return out


def refuse_repeats(values, message, *, flag):
    """Refuse the first value ``values`` lists twice (linear: lists may hold a million entries)."""
    seen = set()
    for v in values:
        if v in seen:
            refuse(message, field=flag, value=v)
        seen.add(v)


def find_scenario(name) -> Path:
    """A scenario file: a path, or a bundled name; an unknown name is refused with near matches."""
    from .resolve import scenario_path
    return scenario_path(name)


def add_scenario_argument(p, help="a bundled scenario name (testdata/aisimulate/<name>.yaml) or a scenario file"):
    """The SCENARIO positional and --pool, which every command that prices one deployment takes,
    and the flags that build a deployment from a model and a chip instead (no scenario file)."""
    p.add_argument("scenario", metavar="SCENARIO",
                   help=help + "; with --chip, a model instead (registry name, graph file or config.json)")
    p.add_argument("--pool", metavar="I", default=None,
                   help="which pool of a deployment with several (e.g. disaggregated prefill and decode) to "
                        "price, by its index in Deployment.pools, 0-based; needed only then")
    g = p.add_argument_group("a deployment with no scenario file (SCENARIO names a model)")
    g.add_argument("--chip", default=None,
                   help="the chip: build the deployment from the model, as `jaxprice size` builds its candidates "
                        "(vLLM, FP8 KV cache unless the weights are 16-bit and the checkpoint calibrated no FP8 "
                        "cache, vLLM's defaults for the rest)")
    g.add_argument("--tp", default=None, help="tensor-parallel width (default 1)")
    g.add_argument("--dp", default=None, help="data-parallel attention ranks, MoE models (default 1)")
    g.add_argument("--ep", action="store_true", default=None, help="expert parallelism (MoE models)")
    g.add_argument("--weights", default=None, help="served weight format (default: the checkpoint's)")
    g.add_argument("--gpus-per-node", default=None, help="GPUs per node (default 8)")
    g.add_argument("--fabric", default=None, help="the network joining nodes, for an engine wider than a node")
    e = p.add_argument_group("engine settings that change the plan (override the scenario's; with --chip, vLLM's "
                             "defaults)")
    e.add_argument("--gpu-memory-utilization", default=None, metavar="F",
                   help="the share of each GPU's memory the engine may take, 0 < F <= 1 (sizes the KV cache)")
    e.add_argument("--kv-cache-dtype", default=None, metavar="DTYPE",
                   help="the KV-cache dtype, as vLLM's --kv-cache-dtype (auto, fp8, fp8_e4m3, fp8_e5m2, bfloat16, ...)")
    e.add_argument("--cudagraph-mode", default=None, metavar="MODE",
                   help="vLLM's CUDA-graph mode (NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE)")
    p.add_argument("--coefficients", metavar="SET.yaml", nargs="+", action="extend", default=None,
                   help="coefficient set files applied after the deployment's own sets, e.g. one jaxprice fit wrote "
                        "(its entries apply where their scope reaches: the chips, models and engine fitted on)")


LAYOUT_FLAGS = ("tp", "dp", "ep", "weights", "gpus_per_node", "fabric")
# scenario engine key -> the flag that overrides it (add_scenario_argument)
PLAN_ENGINE_FLAGS = (("gpu_memory_utilization", "--gpu-memory-utilization"), ("cache_dtype", "--kv-cache-dtype"),
                ("cudagraph_mode", "--cudagraph-mode"))


def engine_overrides(args) -> dict:
    """{scenario engine key: value} of the engine flags given (``PLAN_ENGINE_FLAGS``), checked here
    where the resolver would name a scenario field instead of the flag."""
    out = {}
    if args is None:
        return out
    for key, flag in PLAN_ENGINE_FLAGS:
        v = getattr(args, flag[2:].replace("-", "_"), None)      # argparse's dest of the flag
        if v is None:
            continue
        if key == "gpu_memory_utilization":
            v = parse_float(v, flag=flag)
            if not 0.0 < v <= 1.0:          # one wording for -1, 0 and 1.5 (-1 said '>= 0.0', then 0 was refused)
                refuse("must be a fraction of the GPU's memory, 0 < F <= 1", field=flag, value=v)
        elif not str(v).strip():
            refuse("an empty value", field=flag, value=v, has_value=True)
        out[key] = v if key == "gpu_memory_utilization" else str(v).strip()
    return out


def resolve_with_engine(scenario, registry, overrides: dict, extra_sets=()):
    """``scenario`` resolved with its engine settings ``overrides`` (``engine_overrides``) and the
    coefficient sets ``extra_sets`` after its own; a value the resolver refuses is refused under
    its flag."""
    import dataclasses
    from .errors import JaxpriceError
    from .resolve import resolve
    if overrides:
        scenario = dataclasses.replace(scenario, engine={**dict(scenario.engine or {}), **overrides})
    try:
        return resolve(scenario, registry, extra_sets=extra_sets)
    except JaxpriceError as err:
        key = next((k for k, _f in PLAN_ENGINE_FLAGS if k in overrides and str(err.field or "").endswith(f"engine.{k}")),
                   None)
        if key is None:
            raise
        refuse(err.reason, field=dict(PLAN_ENGINE_FLAGS)[key], value=overrides[key])


def load_scenario_deployment(name, pool=None, args=None):
    """The deployment a command prices: the scenario's only pool, or pool number `pool` (--pool);
    with --chip (``args``), one built from the model SCENARIO names (``model_deployment``). With
    --coefficients, one line per set on stderr says what of it reaches the deployment
    (``fit.set_notes``): that a fitted set applied, or that the deployment is outside its scope
    and priced with the registry's values, was nowhere in the output."""
    dep = _load_scenario_deployment(name, pool, args)
    files = coefficient_files(args)
    if files:
        from .fit import set_notes
        for line in set_notes(files, dep):
            print(f"note: {line}", file=sys.stderr)
    return dep


def _load_scenario_deployment(name, pool=None, args=None):
    from .resolve import load_deployment
    if not str(name).strip():           # "" would be read as the current folder
        refuse("an empty name; give a bundled scenario name or a scenario file (with --chip, a model)",
               field="SCENARIO", value=name, has_value=True)
    if args is not None and getattr(args, "chip", None) is not None:
        if pool is not None:
            refuse("a deployment built from a model has one pool", field="--pool", value=pool)
        from .errors import JaxpriceError
        try:
            return model_deployment(name, args)
        except JaxpriceError as err:        # a scenario read as a model: "expected one YAML document, found 2"
            about_name = err.field == "model" or (err.file is not None and str(err.file) == str(name))
            if not (about_name and _names_a_scenario(name)):
                raise
        refuse("names a scenario, not a model: a scenario states its own chip and layout; drop --chip (and the "
               "layout flags) to price it, or name a model", field="SCENARIO", value=name)
    if args is not None:
        given = [k for k in LAYOUT_FLAGS if getattr(args, k, None) is not None]
        if given:
            flag, value = f"--{given[0].replace('_', '-')}", getattr(args, given[0])
            refuse(f"{flag} builds a deployment from a model: it needs --chip (a scenario states its own)",
                   field=flag, value=None if value is True else value)
    index = None if pool is None else parse_int(pool, flag="--pool", minimum=0)
    overrides = engine_overrides(args)
    files = coefficient_files(args)
    from .errors import JaxpriceError
    try:
        dep = load_deployment(find_scenario(name), pool_index=index, extra_coefficient_files=files)
    except JaxpriceError:
        if not _names_a_model(name):
            raise
    else:
        if not overrides:
            return dep
        from .formats import Registry, load_coefficient_set
        return resolve_with_engine(dep.scenario, Registry(), overrides,    # as load_deployment resolves
                                   [load_coefficient_set(f) for f in files])
    refuse("names a model, not a scenario: add --chip CHIP to build a deployment of it on a chip",
           field="SCENARIO", value=name)


def coefficient_files(args) -> list:
    """--coefficients as absolute paths (formats.coefficient_set_files: each read, refused now)."""
    from .formats import coefficient_set_files
    return list(coefficient_set_files(getattr(args, "coefficients", None) if args is not None else None,
                                      field="--coefficients"))


def _names_a_scenario(name) -> bool:
    """Whether SCENARIO, which is no model, is a scenario (a file or a bundled name) that loads."""
    from .errors import JaxpriceError
    from .resolve import load_deployment
    try:
        load_deployment(find_scenario(name))
    except (JaxpriceError, OSError):
        return False
    return True


def _names_a_model(name) -> bool:
    """Whether SCENARIO, which is no scenario, names a model (registry name, graph file, config.json)."""
    from .errors import JaxpriceError
    from .size import load_model
    try:
        load_model(name)
    except (JaxpriceError, OSError):
        return False
    return True


def model_deployment(model, args):
    """A deployment of ``model`` on ``args.chip`` at the layout the flags give, built as `jaxprice
    size` builds a candidate (size.base_scenario) but without the engine settings size searches:
    max_num_seqs, max_num_batched_tokens, max_model_len and the graph mode are left to vLLM's
    defaults (and to serve's isl + osl + 256), which the commands state where they use them."""
    from .layouts import (base_scenario, block_reason, heads_reason, is_moe, load_model, refuse_weight_format,
                          spans_nodes_reason)
    graph, registry, source = load_model(model)
    chip = registry.chip(args.chip, field="--chip")
    tp = parse_int(1 if args.tp is None else args.tp, flag="--tp", minimum=1)
    dp = parse_int(1 if args.dp is None else args.dp, flag="--dp", minimum=1)
    weights = graph.weight_dtype if args.weights is None else args.weights
    refuse_weight_format(graph, chip, weights, field="--weights")
    if args.ep and not is_moe(graph):
        refuse(f"expert parallelism needs experts: {graph.name} has no MoE layer", field="--ep")
    width = tp * dp
    if args.ep and width == 1:
        refuse("expert parallelism over one GPU is none: give --tp or --dp above 1", field="--ep")
    per_node = parse_int(8 if args.gpus_per_node is None else args.gpus_per_node, flag="--gpus-per-node",
                         minimum=1)
    for flag, v in (("--tp", tp), ("--dp", dp), ("--gpus-per-node", per_node)):
        if v > WIDTH_LIMIT:          # as a scenario file's widths are capped (schema.WIDTH_LIMIT)
            refuse(f"must be at most {WIDTH_LIMIT}", field=flag, value=v)
    if heads_reason(graph, tp):
        refuse(heads_reason(graph, tp), field="--tp", value=tp)
    blocks = block_reason(graph, tp, dp, bool(args.ep), weights)
    if blocks:      # the experts split over tp x dp GPUs (the flags as given), a dense input over tp
        both = "expert intermediate" in blocks and dp > 1
        refuse(blocks, field="--tp/--dp" if both else "--tp", value=f"{tp} x {dp}" if both else tp)
    if args.fabric is not None:
        registry.network(args.fabric, field="--fabric")
        if width <= per_node:       # else dropped without a word (layouts.base_scenario: one node, no fabric)
            refuse(f"joins nothing: tp x dp = {width} GPU(s) fit in one node of {per_node}; --fabric prices the "
                   "network between nodes, for an engine wider than a node", field="--fabric", value=args.fabric)
    elif width > per_node:
        refuse(f"tp x dp = {width}: " + spans_nodes_reason(width, per_node, registry.network_names()), field="--tp",
               value=tp)
    name = f"{graph.name}-{args.chip}-{weights}-tp{tp}" + (f"-dp{dp}" if dp > 1 else "") + ("-ep" if args.ep else "")
    from .layouts import COEFFICIENT_SETS
    scen = base_scenario(graph.name, args.chip, tp=tp, dp=dp, ep=bool(args.ep), weights=weights, graph=graph,
                         name=name, gpus_per_node=per_node, path=f"<{source} on {args.chip}>", fabric=args.fabric,
                         coefficient_sets=COEFFICIENT_SETS + tuple(coefficient_files(args)))
    return resolve_with_engine(scen, registry, engine_overrides(args))


def describe_deployment(dep) -> str:
    s, r = dep.scenario, dep.resolution
    used = r["tp"] * r["dp"] * int((s.parallel or {}).get("pp", 1) or 1)
    per_node = s.gpus_per_node or dep.chip.gpus_per_node       # unstated in the scenario: the chip's
    of = f" (of {s.nodes} node{'s' if s.nodes != 1 else ''} x {per_node})" if per_node else ""
    pool = f" (pool {s.pool_index} of {s.pools}, {s.pool_role})" if s.pools > 1 else ""
    return (f"{s.model} on {used} x {s.hardware}{of}{pool}, tp{r['tp']} dp{r['dp']} ep{r['ep']}, "
            f"{r['served_dtype']} weights{_held_formats(dep, r['served_dtype'])}, {r['cache_dtype']} cache, "
            f"{r['cudagraph_mode']} graphs")


def _held_formats(dep, served) -> str:
    """' (nvfp4 for moe_experts)': the GEMMs held at another format than the served one
    (layouts.held_formats); '' where every GEMM is served at it."""
    from .layouts import held_formats
    held = held_formats(getattr(dep, "graph", None), served)
    return f" ({held})" if held else ""


def engine_limits(dep) -> dict:
    """The deployment's engine limits a step cannot exceed (those the scenario states; an unstated
    max_model_len is vLLM's default, the model's own length, where its graph states one)."""
    e = dep.scenario.engine or {}
    out = {}
    for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        v = e.get(key)
        if isinstance(v, (int, float)) and v > 0:
            out[key] = int(v)
    model_len = getattr(getattr(dep, "graph", None), "max_model_len", None)
    if "max_model_len" not in out and isinstance(model_len, int) and model_len > 0:
        out["max_model_len"] = model_len
    return out


def default_context(dep) -> int:
    """A decode's context when --context is not given: DEFAULT_CONTEXT, or the deployment's
    max_model_len where that is smaller (a scenario `size` writes holds isl + osl + 256)."""
    return min(DEFAULT_CONTEXT, engine_limits(dep).get("max_model_len", DEFAULT_CONTEXT))


def check_limits(dep, *, requests, tokens, context, flag_requests, flag_tokens, flag_context, where=None,
                 tokens_value=None, tokens_how=""):
    """Refuse a step the engine could not run: more requests than max_num_seqs, more tokens
    than max_num_batched_tokens, a context past max_model_len. ``tokens_value``: the value of
    ``flag_tokens`` to name (default the token total), ``tokens_how`` how the total adds up."""
    lim = engine_limits(dep)
    tail = " (--ignore-limits prices it anyway)"
    file = where
    if "max_num_seqs" in lim and requests > lim["max_num_seqs"]:
        refuse(f"{requests} requests in one step exceed the deployment's max_num_seqs "
               f"{lim['max_num_seqs']}{tail}", file=file, field=flag_requests, value=requests)
    if "max_num_batched_tokens" in lim and tokens > lim["max_num_batched_tokens"]:
        refuse(f"{tokens} tokens{tokens_how} in one step exceed the deployment's max_num_batched_tokens "
               f"{lim['max_num_batched_tokens']}{tail}", file=file, field=flag_tokens,
               value=tokens if tokens_value is None else tokens_value)
    if "max_model_len" in lim and context > lim["max_model_len"]:
        refuse(f"a context of {context} tokens exceeds the deployment's max_model_len "
               f"{lim['max_model_len']}{tail}", file=file, field=flag_context, value=context)


def common_pad(rows) -> int:
    """A padding for every batch: the next power of two at or above the largest."""
    n = max(1, int(max(rows)))
    return 1 << (n - 1).bit_length()


def add_common_arguments(p, *, batch_files=False):
    add_scenario_argument(p)
    p.add_argument("--decode-threshold", metavar="N", default=None,
                   help=f"a request scheduling more tokens than N is a prefill (default {DEFAULT_DECODE_THRESHOLD}, "
                        "the reference kernel's" + ("; a batch file's own value wins over the default)" if batch_files
                                                    else ")"))
    p.add_argument("--temperature", metavar="T", default=None,
                   help="smooth mode at this temperature (default: exact mode)")
    p.add_argument("--units", default="ms", metavar="ms|us", help="units of printed times (default ms)")
    p.add_argument("--ignore-limits", action="store_true",
                   help="price steps past the deployment's max_num_seqs, max_num_batched_tokens, max_model_len")


def common_options(args):
    thr = None if args.decode_threshold is None else parse_int(args.decode_threshold, flag="--decode-threshold",
                                                               minimum=0)
    if thr is not None:
        check_tokens([thr], flag="--decode-threshold")        # as a batch file's decode_threshold
    temp = None if args.temperature is None else parse_temperature(args.temperature)
    if args.units not in UNITS:
        refuse("unknown time unit; expected ms or us", field="--units", value=args.units)
    return thr, temp


def check_finite(resources, overlap, no_overlap, *, labels, what):
    """Never print an inf or NaN price: refuse naming the first step whose price is not finite."""
    ok = np.isfinite(resources).all(axis=-1) & np.isfinite(overlap) & np.isfinite(no_overlap)
    if not ok.all():
        i = int(np.flatnonzero(~ok.reshape(-1))[0])
        refuse("the price of this step is not finite (inputs past what the cost model covers)", field=what,
               value=labels[i] if i < len(labels) else i)


def mode_text(temperature) -> str:
    if temperature == 0:        # the smooth kernel at 0 is the exact one (step.exact_at_zero)
        return "smooth mode at temperature 0, i.e. exact (the surrogates are exact at 0)"
    return "exact mode" if temperature is None else f"smooth mode (temperature {temperature:g})"


# ----------------------------------------------------------------------------- price


def add_parser(subparsers):
    p = subparsers.add_parser(
        "price", help="price steps: the per-resource table, both estimates and the bottleneck",
        description="Price one step per batch and print the time on each resource (SM, HBM, NVLink, NIC, "
                    "host), Overlap, NoOverlap and the bottleneck. Lists take commas and '...' continuing "
                    "a progression: 1,2,4,...,256 or 16,32,...,256.")
    add_common_arguments(p, batch_files=True)
    p.add_argument("--decode", metavar="LIST", default=None,
                   help="decode request counts, one batch each (default: 1,2,4,... up to the deployment's "
                        "max_num_seqs, unless --prefill or --batch is given)")
    p.add_argument("--context", metavar="N", default=None,
                   help=f"each decode request's context after the step, in tokens (default {DEFAULT_CONTEXT}, or "
                        "the deployment's max_model_len where smaller)")
    p.add_argument("--prefill", metavar="LIST", default=None,
                   help="prefill requests of these lengths (computed 0), added to every batch; alone: one batch")
    p.add_argument("--batch", metavar="FILE", action="append", default=None,
                   help="a YAML or CSV batch file (requests: scheduled, computed[, prompt_len][, count]); "
                        "repeat for several batches")
    p.add_argument("--breakdown", action="store_true", help="also print each batch per layer kind")
    p.add_argument("--json", action="store_true", help="print JSON (times in seconds) instead of the table")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw the step figure: resources (left) and both estimates (right) against the batch")
    p.set_defaults(command="price")
    return p


def build_batches(args, dep, threshold):
    """[(label, info dict, scheduled, computed, prompt_len, decode_threshold)] from the arguments."""
    if args.batch and (args.decode is not None or args.prefill is not None or args.context is not None):
        refuse("--batch cannot be combined with --decode, --prefill or --context: a batch file holds "
               "the whole batch", field="--batch", value=args.batch[0])
    specs = []
    if args.batch:
        labels = _batch_labels(args.batch)
        for path, label in zip(args.batch, labels):
            bf = read_batch_file(path, field="--batch")
            thr = threshold if threshold is not None else \
                bf.decode_threshold if bf.decode_threshold is not None else DEFAULT_DECODE_THRESHOLD
            info = {"file": str(path)}
            specs.append((label, info, bf.scheduled, bf.computed, bf.prompt_len, thr))
            if not args.ignore_limits:
                check_limits(dep, requests=bf.requests, tokens=int(bf.scheduled.sum()),
                             context=int((bf.computed + bf.scheduled).max()), flag_requests="requests",
                             flag_tokens="scheduled", flag_context="computed + scheduled", where=str(path))
        return specs
    thr = threshold if threshold is not None else DEFAULT_DECODE_THRESHOLD
    context = default_context(dep) if args.context is None else parse_int(args.context, flag="--context", minimum=1)
    prefill = [] if args.prefill is None else parse_int_list(args.prefill, flag="--prefill", minimum=1)
    check_tokens([context], flag="--context")
    check_tokens(prefill, flag="--prefill")
    if args.decode is None:
        if prefill:
            decode = [0]
        else:
            top = engine_limits(dep).get("max_num_seqs", 256)
            decode = [1 << k for k in range(int(math.log2(top)) + 1)]
    else:
        decode = parse_int_list(args.decode, flag="--decode", minimum=0 if prefill else 1,
                                why=" (a step needs a request; 0 is allowed with --prefill)")
        # the same batch priced twice, two like rows (sweep and serve refuse it too)
        refuse_repeats(decode, "lists a decode count twice; give each once", flag="--decode")
    if args.context is not None and not any(decode):     # else ignored silently: prefill rows start at 0
        refuse("is the context of the decode requests, and these batches hold none (prefill requests only, "
               "computed 0): it changes nothing", field="--context", value=args.context)
    for d in decode:
        if d + len(prefill) > MAX_STEP_REQUESTS:
            refuse(f"{d + len(prefill)} requests in one step exceed jaxprice's cap of {MAX_STEP_REQUESTS} "
                   "requests per step (--ignore-limits or not)", field="--decode", value=d)
    rows = common_pad([d + len(prefill) for d in decode]) * len(decode)
    if rows > MAX_PRICED_ROWS:
        refuse(f"{len(decode)} batches padded to {rows // len(decode)} rows are {rows} rows, above jaxprice's cap "
               f"of {MAX_PRICED_ROWS} rows per command; price fewer or smaller batches", field="--decode",
               value=args.decode)
    for d in decode:
        sched = np.array([1.0] * d + [float(p) for p in prefill])
        comp = np.array([float(context - 1)] * d + [0.0] * len(prefill))
        if not args.ignore_limits:
            check_limits(dep, requests=len(sched), tokens=int(sched.sum()),
                         context=max([context] * bool(d) + prefill), flag_requests="--decode",
                         flag_tokens="--decode" if not prefill else "--prefill",
                         tokens_value=None if not prefill else args.prefill,
                         tokens_how="" if not prefill else f" ({d} decode + {' + '.join(map(str, prefill))} prefill)",
                         flag_context="--context" if d and context >= max(prefill, default=0) else "--prefill")
        info = {"decode": d, "context": context, "prefill": prefill}
        specs.append((str(d), info, sched, comp, sched + comp, thr))
    return specs


def _batch_labels(paths) -> list:
    """Each --batch file's row label: its stem, followed where two files share a stem by its file
    name, or by the path as given where they share that too (a/step.csv and b/step.csv were two
    rows labelled 'step'); the same file twice is refused."""
    seen = {}
    for path in paths:
        key = Path(path).expanduser().resolve()
        if key in seen:
            refuse(f"names the same file as --batch {seen[key]}: it would be priced twice; give each file once",
                   field="--batch", value=path)
        seen[key] = path
    stems, names = [Path(p).stem for p in paths], [Path(p).name for p in paths]
    return [stem if stems.count(stem) == 1 else f"{stem} ({name if names.count(name) == 1 else path})"
            for stem, name, path in zip(stems, names, paths)]


def price_specs(dep, specs, temperature):
    """Price every spec in one vmapped call. Returns (stacked StepResult, pad)."""
    from .step import price_many
    pad = common_pad([s[2].size for s in specs])
    batches = [Batch.from_requests(s[2], s[3], s[4], pad_to=pad, decode_threshold=s[5], source=s[0])
               for s in specs]
    return price_many(dep.plan, dep.coefficients, Batch.stack(batches), temperature=temperature), batches


def step_records(specs, result, smooth=False):
    res = np.asarray(result.resources)
    weights = np.asarray(result.bottleneck_weights)
    out = []
    for i, (label, info, sched, _comp, _prompt, thr) in enumerate(specs):
        rec = dict(info)
        rec.update(requests=int(sched.size), tokens=int(sched.sum()), decode_threshold=int(thr))
        rec.update({r: float(res[i, k]) for k, r in enumerate(RESOURCES)})
        rec.update(overlap=float(np.asarray(result.overlap)[i]), no_overlap=float(np.asarray(result.no_overlap)[i]),
                   bottleneck=RESOURCES[int(np.asarray(result.bottleneck)[i])])
        if smooth:
            rec["bottleneck_weights"] = {r: float(weights[i, k]) for k, r in enumerate(RESOURCES)}
        out.append(rec)
    return out


def format_table(records, *, label_name, labels, units) -> str:
    k = UNITS[units]
    dec = 3 if units == "ms" else 1
    cols = [label_name, "requests", "tokens", "sm", "hbm", "nvlink", "nic", "host", "Overlap", "NoOverlap",
            "per token", "bottleneck"]
    rows = []
    for lab, r in zip(labels, records):
        vals = [r[x] * k for x in RESOURCES] + [r["overlap"] * k, r["no_overlap"] * k,
                                                r["no_overlap"] * k / max(r["tokens"], 1)]
        rows.append([lab, str(r["requests"]), str(r["tokens"])] + [f"{v:.{dec}f}" for v in vals] + [r["bottleneck"]])
    widths = [max(len(c), *(len(row[j]) for row in rows)) for j, c in enumerate(cols)]

    def line(cells):
        first = cells[0].ljust(widths[0]) if label_name == "batch" else cells[0].rjust(widths[0])
        return "  ".join([first] + [c.rjust(w) for c, w in zip(cells[1:-1], widths[1:-1])] + [cells[-1]])
    return "\n".join([line(cols)] + [line(r) for r in rows])


def format_breakdown(dep, label, rec, layers, units, temperature=None) -> str:
    k = UNITS[units]
    dec = 3 if units == "ms" else 1
    L = {n: np.asarray(v) for n, v in layers.items()}
    counts = np.asarray(dep.plan.arrays["count"]) * np.asarray(dep.plan.arrays["drafter_count_scale"])
    cols = ["layer kind", "count", "sm", "hbm", "nvlink", "nic", "experts", "stage"]
    rows = []
    for i, name in enumerate(dep.plan.layer_kind_names):
        vals = [L["sm"][i], L["hbm"][i], L["nvlink"][i], L["nic"][i], L["expert_sm"][i] + L["expert_hbm"][i],
                L["stage"][i]]
        rows.append([name, f"{counts[i]:g}"] + [f"{v * k:.{dec}f}" for v in vals])
    head = max(float(L["head_sm"]), float(L["head_hbm"]))
    rows.append(["head", "1", f"{float(L['head_sm']) * k:.{dec}f}", f"{float(L['head_hbm']) * k:.{dec}f}",
                 "", "", "", f"{head * k:.{dec}f}"])
    rows.append(["host", "", "", "", "", "", "", f"{rec['host'] * k:.{dec}f}"])
    widths = [max(len(c), *(len(r[j]) for r in rows)) for j, c in enumerate(cols)]

    def line(cells):
        return "  ".join([cells[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:])])
    total = float(np.sum(L["stage"])) + head + rec["host"]
    smooth = bool(temperature)      # smooth mode: the kernel's max and min are power means (at 0: exact)
    busiest = f"the smooth max of the resources at temperature {temperature:g}" if smooth else "busiest resource"
    out = [f"breakdown of batch {label} ({units}; per layer kind, times its count; sm and hbm without "
           f"the experts, stage = {busiest} + experts):", line(cols)] + [line(r) for r in rows]
    # in smooth mode the Overlap is a smooth min, below both: 'min(31.503, 33.640) = 31.130' contradicted itself
    least = "the smooth min of that and NoOverlap (at most their min)" if smooth else "min(that, NoOverlap)"
    out.append(f"sum of stages + head + host = {total * k:.{dec}f} {units}; Overlap = {least} "
               f"= {rec['overlap'] * k:.{dec}f}")
    return "\n".join(out)


def run(args) -> int:
    check_image(args.plot, "--plot")
    threshold, temperature = common_options(args)
    if args.json and args.units != "ms":       # else ignored silently
        refuse("JSON times are always in seconds; --units sets the table's", field="--units", value=args.units)
    dep = load_scenario_deployment(args.scenario, args.pool, args)
    specs = build_batches(args, dep, threshold)
    _check_batch_file_rows(args, specs)
    _note_small_prefills(args, specs)
    result, batches = price_specs(dep, specs, temperature)
    check_finite(np.asarray(result.resources), np.asarray(result.overlap), np.asarray(result.no_overlap),
                 labels=[s[0] for s in specs], what="batch")
    records = step_records(specs, result, smooth=temperature is not None)
    layers = _breakdowns(dep, batches, temperature) if args.breakdown else None
    unfit = fit_note(dep, specs)
    if args.json:
        print(json.dumps({**_json_report(dep, records, layers, temperature), "fits": not unfit,
                          "fit_note": unfit or None}, indent=1))
    else:
        print(_text_report(args, dep, specs, records, layers, threshold, temperature)
              + (f"\nnote: this deployment {unfit}: vLLM would not start it; the steps are priced as if it did"
                 if unfit else ""))
    if args.plot:
        _write_plot(args, dep, specs, result, temperature)
    return 0


def _note_small_prefills(args, specs) -> None:
    """On stderr, as sweep says it: a --prefill length of at most the decode threshold is priced as a
    decode (the table's header still calls it a prefill request)."""
    if args.batch or not specs:
        return
    thr = int(specs[0][5])
    small = [p for p in specs[0][1]["prefill"] if p <= thr]
    if small:
        print(f"note: a prefill request of at most the decode threshold {thr} tokens ({', '.join(map(str, small))}) "
              "is priced as a decode (vLLM's threshold is 1 without speculation: --decode-threshold 1 prices it as "
              "a prefill)", file=sys.stderr)


def fit_note(dep, specs) -> str:
    """Why the deployment cannot hold its weights and one request of the longest context the
    batches hold (layouts.fits); "" where it can. The step price does not need the memory, but
    a price of a deployment that would not start should say so."""
    from .layouts import fits
    need = max(int(np.max(s[3] + s[2])) if np.size(s[2]) else 1 for s in specs)
    ok, why = fits(dep, max(need, 1))
    return "" if ok else why


def _check_batch_file_rows(args, specs) -> None:
    """Batch files, padded to one common size, must stay within the rows one command prices."""
    if not args.batch:
        return
    rows = common_pad([s[2].size for s in specs]) * len(specs)
    if rows > MAX_PRICED_ROWS:
        refuse(f"{len(specs)} batch files padded to a common {rows // len(specs)} rows are {rows} rows, above "
               f"jaxprice's cap of {MAX_PRICED_ROWS} rows per command; price them in separate runs",
               field="--batch", value=args.batch[-1])


def _breakdowns(dep, batches, temperature) -> list:
    """--breakdown: each batch's per-layer-kind times, priced one batch at a time."""
    from .step import price
    return [price(dep.plan, dep.coefficients, b, temperature=temperature, breakdown=True).layers for b in batches]


def _json_report(dep, records, layers, temperature) -> dict:
    """--json: the deployment, the mode and every step (times in seconds), with its layers under --breakdown.
    The mode is 'exact' at temperature 0 too (the smooth kernel is exact there, bit for bit; the
    temperature says which was asked)."""
    doc = {"scenario": dep.scenario.name, "scenario_file": str(dep.scenario.path),
           "deployment": describe_deployment(dep), "mode": "exact" if not temperature else "smooth",
           "temperature": temperature, "units": "s", "steps": records}
    if layers is not None:
        for rec, lay in zip(records, layers):
            rec["layers"] = {"names": list(dep.plan.layer_kind_names),
                             **{n: np.asarray(v).tolist() for n, v in lay.items()}}
    return doc


def _text_report(args, dep, specs, records, layers, threshold, temperature) -> str:
    """The deployment, what the batches hold, the mode and decode threshold, the table and any breakdowns."""
    by_file = bool(args.batch)
    labels = [s[0] for s in specs]
    thr_used = sorted({int(s[5]) for s in specs})
    thr_note = "the default, the reference kernel's" if threshold is None and not by_file else \
        "given" if threshold is not None else "from the files, else the default"
    lines = [f"{dep.scenario.name}: {describe_deployment(dep)}", f"batches: {_batches_text(specs, by_file)}",
             f"{mode_text(temperature)}; decode threshold {', '.join(map(str, thr_used))} ({thr_note}); "
             f"times in {args.units}; per token = NoOverlap / tokens", "",
             format_table(records, label_name="batch" if by_file else "decode", labels=labels, units=args.units)]
    if layers is not None:
        for lab, rec, lay in zip(labels, records, layers):
            lines += ["", format_breakdown(dep, lab, rec, lay, args.units, temperature)]
    return "\n".join(lines)


def _batches_text(specs, by_file) -> str:
    """What the batches are: the number of batch files, or the decode requests plus the prefill ones."""
    if by_file:
        return f"{len(specs)} batch file{'s' if len(specs) > 1 else ''}"
    info = specs[0][1]
    parts = []
    if any(s[1]["decode"] for s in specs):
        parts.append(f"decode requests scheduling 1 token each at context {info['context']} (after the step)")
    if info["prefill"]:
        parts.append(f"prefill requests of {', '.join(map(str, info['prefill']))} tokens (computed 0)")
    return " plus ".join(parts)


def _write_plot(args, dep, specs, result, temperature) -> None:
    """--plot: the step figure against the batch file, or against the decode count (a line, per request)."""
    from .figures import plot_step_curve
    by_file = bool(args.batch)
    if by_file:
        x, xlabel, ticks = np.arange(1, len(specs) + 1), "batch file", [s[0] for s in specs]
    else:
        x, xlabel, ticks = [s[1]["decode"] for s in specs], "decode requests in the batch", None
        if specs[0][1]["prefill"]:
            xlabel += f" (plus prefill {', '.join(map(str, specs[0][1]['prefill']))})"
    title = f"{dep.scenario.name}: " + (f"context {specs[0][1]['context']}, " if not by_file else "") + \
        f"{mode_text(temperature)}"
    plot_step_curve(x, result, path=args.plot, units=args.units, title=title, xlabel=xlabel,
                    xticklabels=ticks, log2=None if not by_file else False, join=not by_file,
                    per="request" if not by_file and not specs[0][1]["prefill"] else None)
    print(f"wrote {args.plot}", file=sys.stderr)
