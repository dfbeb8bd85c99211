"""Resolve: a deployment (scenario + graph + chip + coefficient sets) into a Plan, once.

Everything that does not depend on the batch is decided here, in NumPy and plain Python:
widths, the served format and the arithmetic rate of every GEMM, coefficient scoping,
collective width snapping and placement, the graph's expansion into distinct layer kinds with
counts, node conditions (``emit``), GEMM fusion, kernel counts, KV and state geometry, host
graph modes and the capture ceiling, and every refusal. The step kernel (step.py) then only
walks a handful of arrays.

Coverage limits (refused with a clear message rather than priced wrongly): pipeline
parallelism (pp > 1) and context parallelism (pcp > 1, dcp > 1). Every place the code knowingly
differs from the reference kernel carries a grep-able KNOWN DIVERGENCE or COVERAGE LIMIT
comment with a bracketed tag; registry/EXTENSIONS.md lists them all.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from pathlib import Path

import numpy as np

from . import laws
from .errors import JaxpriceError, refuse
from .formats import (DTYPE_BYTES, Chip, CoefficientSet, ModelGraph, Network, Registry, Scenario,
                      load_scenario)
from .plan import Coefficients, Plan

GRAPH_MODES = ("FULL", "PIECEWISE", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "NONE")
# (mode for a uniform-decode batch, mode for any other batch)
MODE_TABLE = {"PIECEWISE": ("piecewise", "piecewise"), "FULL": ("full", "full"),
              "FULL_AND_PIECEWISE": ("full", "piecewise"), "FULL_DECODE_ONLY": ("full", "eager"),
              "NONE": ("eager", "eager")}
HOST_MODES = ("full", "piecewise", "eager")

QUANTIZATION = {"fp8": "fp8", "ptpc_fp8": "fp8", "fbgemm_fp8": "fp8", "modelopt": "fp8",
                "modelopt_fp4": "nvfp4", "nvfp4": "nvfp4", "mxfp4": "mxfp4",
                "modelopt_mxfp8": "mxfp8", "mxfp8": "mxfp8"}
CHECKPOINT_QUANTIZATION = ("bitsandbytes", "awq", "awq_marlin", "gptq", "gptq_marlin",
                           "compressed-tensors")
CACHE_DTYPES = {"auto": None, "": None, "bfloat16": 2.0, "float16": 2.0, "float32": 4.0,
                "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0, "fp8_ds_mla": 1.0,
                "nvfp4": 0.5625, "nvfp4_4over6": 0.5625, "nvfp4_ds_mla": 0.5}
DS_MLA_CELL = {"fp8_ds_mla": 656.0, "nvfp4_ds_mla": 352.0}
MAMBA_CACHE_DTYPES = {"auto": 4.0, "float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0}
PRE_HOPPER = ("a100", "l40s")
ROUTED_EXEMPT_BACKENDS = ("", "naive", "allgather_reducescatter")
SP_MOE_BACKENDS = ("allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency",
                   "flashinfer_nvlink_one_sided", "mori_high_throughput", "mori_low_latency", "nixl_ep")
PARALLEL_BLOCK_DRAFTERS = ("dspark",)
KERNELS_PER_OP = {"GEMM": 1, "GroupedGEMM": 4, "Attention": 2, "Elementwise": 1,
                  "RecurrentUpdate": 2, "AllReduce": 1, "AllGather": 1, "ReduceScatter": 1,
                  "All2All": 2, "HyperConnection": 1}
COLLECTIVE_NAMES = {"AllReduce": "all_reduce", "AllGather": "all_gather",
                    "ReduceScatter": "reduce_scatter", "All2All": "alltoall"}
ALWAYS_RESOLVED = (("AllReduce", "tp"), ("AllGather", "tp"), ("ReduceScatter", "tp"),
                   ("All2All", "expert"))
SCAN_CHUNK = 64  # tokens per chunk of vLLM's chunked recurrent scan (FLA / mamba_chunk_scan)
SNAP_WIDTHS = (1, 2, 4, 8, 16)


def si_factor(name: str, units: str) -> float:
    """Registry units to SI: us -> s, bytes/us -> B/s, tokens/us (rates) -> tokens/s."""
    if units == "us" or units.startswith("us_"):
        return 1e-6
    if units == "bytes_per_us":
        return 1e6
    if units == "tokens" and "_rate" in name:
        return 1e6
    return 1.0


@dataclasses.dataclass(frozen=True)
class Deployment:
    """A resolved deployment: the plan, its coefficients, and what was decided on the way."""
    scenario: Scenario
    graph: ModelGraph
    chip: Chip
    plan: Plan
    coefficients: Coefficients
    resolution: dict

    @property
    def name(self):
        return self.scenario.name


# ----------------------------------------------------------------------------- coefficient scoping


class _Scope:
    """Admitted coefficient entries for one deployment, later sets overriding earlier ones."""

    def __init__(self, sets, values, file):
        self.file = file
        self.entries = {}
        admitted_any = False
        for cset in sets:
            for e in cset.entries:
                if all(self._admits(dim, allowed, values[dim]) for dim, allowed in e.scope.items()):
                    self.entries[e.name] = e
                    admitted_any = True
        if not admitted_any:
            refuse("no entry in any coefficient set applies to this deployment's scope "
                   f"({', '.join(f'{k}={v}' for k, v in values.items())})", file=file,
                   field="Scenario.coefficients", value=[s.name for s in sets])
        self.used = {}

    @staticmethod
    def _admits(dim, allowed, value):
        if dim in ("hardware", "model"):
            return str(value).lower() in {str(a).lower() for a in allowed}
        return value in allowed

    def has(self, name):
        return name in self.entries and self.entries[name].value != 0

    def value(self, name, default=None):
        e = self.entries.get(name)
        return default if e is None else e.value

    def require(self, name, why):
        if name not in self.entries:
            refuse(f"required coefficient is missing ({why}); no admitted entry in the listed sets",
                   file=self.file, field="Scenario.coefficients", value=name)
        return self.use(name)

    def use(self, name):
        """Mark a coefficient as read by the kernel; returns its name, or None if absent."""
        if name is None or name not in self.entries:
            return None
        e = self.entries[name]
        self.used[name] = e
        return name

    def vector(self) -> Coefficients:
        names = sorted(self.used)
        vals = np.array([self.used[n].value * si_factor(n, self.used[n].units) for n in names], dtype=float)
        return Coefficients(vals, names, [self.used[n].units for n in names],
                            [self.used[n].cite for n in names])


# ----------------------------------------------------------------------------- formats


class _RateClasses:
    """Distinct (peak, ramp) pairs GEMMs compute at; each class reads its own ramp names."""

    def __init__(self, chip: Chip, scope: _Scope, file):
        self.chip, self.scope, self.file = chip, scope, file
        self.keys, self.peaks, self.roles = [], [], []
        self.notes = []

    def _peak(self, key):
        c = self.chip
        tf = {"bf16": c.bf16_tflops, "fp8": c.fp8_tflops, "nvfp4": c.nvfp4_tflops,
              "tf32": c.tf32_tflops}[key]
        if tf is None:
            refuse(f"the chip file does not state the {key.upper()} peak this deployment needs",
                   file=c.source, field={"bf16": "bf16_tflops", "fp8": "fp8_tflops",
                                         "nvfp4": "nvfp4_tflops", "tf32": "tf32_tflops"}[key],
                   value=None, has_value=True)
        if tf <= 0:
            refuse(f"compute peak resolved to {tf} TFLOP/s", file=c.source, field=f"{key}_tflops",
                   value=tf, has_value=True)
        return tf * 1e12

    def for_format(self, fmt: str, grouped: bool = False) -> int:
        """The class index a GEMM whose weights are in `fmt` computes at (pricing-a-step.md,
        'Arithmetic rates')."""
        c = self.chip
        fp8_native = (c.fp8_tflops or 0) > 0
        four_native = (c.nvfp4_tflops or 0) > 0
        if fmt in ("bf16", "fp16"):
            peak, sfx = "bf16", "bf16"
        elif fmt == "fp32":
            peak, sfx = "tf32", "bf16"        # TF32 tensor rate; no TF32 ramp is measured
        elif fmt == "fp8":
            peak, sfx = ("fp8", "fp8") if fp8_native else ("bf16", "bf16")
        elif fmt == "int8":
            if not fp8_native:
                refuse("int8 GEMMs need an 8-bit peak; the chip states none", file=c.source,
                       field="fp8_tflops", value=c.fp8_tflops, has_value=True)
            peak, sfx = "fp8", "fp8"
        elif fmt == "mxfp8":
            # Native block-scaled FP8 only on data-center Blackwell; Hopper runs MXFP8 weights
            # through BF16 weight-only kernels.
            peak, sfx = ("fp8", "fp8_block") if four_native else ("bf16", "bf16")
        elif fmt in ("nvfp4", "mxfp4"):
            peak, sfx = ("nvfp4", "nvfp4") if four_native else ("bf16", "bf16")
        elif fmt == "int4":
            peak, sfx = "bf16", "bf16"        # W4A16: weight-only, BF16 math
        else:
            peak, sfx = "bf16", "bf16"
        own = grouped and sfx == "nvfp4" and self.scope.has(f"gemm_eps_max_grouped_{sfx}") \
            and self.scope.has(f"gemm_m_half_grouped_{sfx}")
        ramp_sfx = f"grouped_{sfx}" if own else sfx
        key = (peak, ramp_sfx)
        if key in self.keys:
            return self.keys.index(key)
        eps = self.scope.require(f"gemm_eps_max_{ramp_sfx}", f"GEMM efficiency of {fmt} on {c.name}")
        mh = self.scope.require(f"gemm_m_half_{ramp_sfx}", f"GEMM efficiency of {fmt} on {c.name}")
        nh, kh = f"gemm_n_half_{ramp_sfx}", f"gemm_k_half_{ramp_sfx}"
        if (nh in self.scope.entries) != (kh in self.scope.entries):
            present = nh if nh in self.scope.entries else kh
            refuse("the shape-aware efficiency needs both gemm_n_half and gemm_k_half; only one is "
                   "present", file=self.file, field="Scenario.coefficients", value=present)
        shape = nh in self.scope.entries
        self.keys.append(key)
        self.peaks.append(self._peak(peak))
        self.roles.append({"eps_max": eps, "m_half": mh,
                           "n_half": self.scope.use(nh) if shape else None,
                           "k_half": self.scope.use(kh) if shape else None})
        return len(self.keys) - 1


# ----------------------------------------------------------------------------- the walk


def _emits(node, ctx) -> bool:
    emit = node.get("emit", "")
    if emit == "":
        return True
    if emit == "tensor_parallel":
        return ctx["tp"] > 1
    if emit == "expert_parallel":
        return ctx["moe_group"] > 1
    if emit == "tensor_parallel_unless_sp_moe":
        return ctx["tp"] > 1 and not ctx["sp_moe"]
    raise AssertionError(emit)  # formats.py refuses unknown conditions


def _snap(width, measured, *, op, chip, file):
    if not measured:
        refuse(f"no measured {op} collective (floor, peak and transition rate) for {chip}",
               file=file, field="Scenario.coefficients", value=f"collective_*_{op}_fp16_*rank_{chip}")
    measured = sorted(measured)
    if width <= measured[0]:
        return measured[0]
    if width in measured:
        return width
    if width > 16:
        return measured[-1]
    refuse(f"collective width gap: {op} over {width} ranks has no measured coefficients "
           f"(measured widths: {measured})", file=file, field="Scenario.coefficients",
           value=f"collective_floor_{op}_fp16_{width}rank_{chip}")


def resolve(scenario: Scenario, registry: Registry | None = None, *, extra_sets=()) -> Deployment:
    """Resolve one deployment into a Plan and its Coefficients (see module docstring)."""
    reg = registry or Registry()
    file = scenario.path
    par, eng = scenario.parallel, scenario.engine
    tp, dp, pp = par.get("tp", 1), par.get("dp", 1), par.get("pp", 1)
    pcp, dcp = par.get("pcp", 1), par.get("dcp", 1)
    if pp > 1:   # COVERAGE LIMIT [pipeline-parallel]: no pipeline-stage split is priced
        refuse("pipeline parallelism is not priced (no pipeline-stage split)", file=file,
               field="Deployment.pools[0].parallel.pp", value=pp)
    # COVERAGE LIMIT [context-parallel]: none of reference-kernel.md's PCP/DCP machinery
    # (token sharding, combine collectives, context gathers, the zigzag split) is implemented,
    # so the rank-local token count T is always the batch's scheduled tokens
    if pcp > 1 or dcp > 1:
        refuse("context parallelism (pcp/dcp > 1) is not priced by jaxprice", file=file,
               field="Deployment.pools[0].parallel." + ("pcp" if pcp > 1 else "dcp"),
               value=max(pcp, dcp))
    dcp_backend = eng.get("dcp_comm_backend")
    if dcp_backend not in (None, "", "ag_rs", "a2a"):
        refuse("unknown dcp_comm_backend (known: ag_rs, a2a)", file=file,
               field="Deployment.pools[0].engine.dcp_comm_backend", value=dcp_backend)
    graph = reg.model(scenario.model, file=file, field="Scenario.model")
    chip = reg.chip(scenario.hardware, file=file, field="Scenario.cluster.hardware")
    network = None
    if scenario.fabric:
        network = reg.network(scenario.fabric, file=file, field="Scenario.cluster.fabric")
    provenance = []

    # ---- widths
    ep_on = bool(par.get("enable_expert_parallel", False))
    expert_width = tp * dp if ep_on else 1
    moe_group_width = expert_width if ep_on else (tp * dp if dp > 1 else expert_width)
    moe_group = max(moe_group_width, expert_width)
    backend = str(eng.get("all2all_backend", "") or "")
    sp_moe = ep_on and tp > 1 and dp > 1 and backend in SP_MOE_BACKENDS
    routed = ep_on and backend not in ROUTED_EXEMPT_BACKENDS
    gpus_per_node = scenario.gpus_per_node or chip.gpus_per_node or 0
    rack = scenario.gpus_per_rack or chip.gpus_per_rack or 0
    rack_domain = rack > 0 and (chip.rack_gbps or 0) > 0
    widest = max(tp, moe_group_width)
    if gpus_per_node <= 0 or (rack_domain and widest <= rack):
        nodes_spanned = 1
    else:
        nodes_spanned = math.ceil(widest / gpus_per_node)

    # ---- coefficients in scope
    sets = [reg.coefficient_set(n, file=file, field="Scenario.coefficients") for n in scenario.coefficient_sets]
    sets += list(extra_sets)
    scope = _Scope(sets, {"hardware": chip.name, "model": graph.name, "tp": tp, "ep": expert_width,
                          "nodes_spanned": nodes_spanned}, file)
    derate = scope.require("hbm_derate", "achieved HBM bandwidth")
    if chip.hbm_tbs <= 0 or scope.value("hbm_derate") <= 0:
        refuse("HBM bandwidth resolved to a non-positive value", file=chip.source, field="hbm_tbs",
               value=chip.hbm_tbs * scope.value("hbm_derate"), has_value=True)

    # ---- served format
    quant = eng.get("quantization", "") or ""
    if quant in QUANTIZATION:
        served = QUANTIZATION[quant]
    elif quant == "" or quant in CHECKPOINT_QUANTIZATION:
        served = graph.weight_dtype
    else:
        refuse(f"unknown quantization (known: {', '.join(sorted(QUANTIZATION) + list(CHECKPOINT_QUANTIZATION))})",
               file=file, field="Deployment.pools[0].engine.quantization", value=quant)
    served_bytes = DTYPE_BYTES[served]
    ckpt_bytes = DTYPE_BYTES[graph.weight_dtype]

    # ---- cache
    cache = str(eng.get("cache_dtype", "auto") or "auto")
    if "turboquant" in cache or "per_token_head" in cache:
        refuse("this cache dtype's page is not sized by the kernel", file=file,
               field="Deployment.pools[0].engine.cache_dtype", value=cache)
    if cache not in CACHE_DTYPES:
        refuse(f"not a vLLM cache dtype (known: {', '.join(k for k in CACHE_DTYPES if k)})", file=file,
               field="Deployment.pools[0].engine.cache_dtype", value=cache)
    if cache == "fp8_inc":
        refuse("vLLM would not start: fp8_inc caches are for Intel Gaudi only", file=file,
               field="Deployment.pools[0].engine.cache_dtype", value=cache)
    mamba_cache = str(eng.get("mamba_cache_dtype", "auto") or "auto")
    if mamba_cache not in MAMBA_CACHE_DTYPES:
        refuse(f"not a mamba cache dtype (known: {', '.join(MAMBA_CACHE_DTYPES)})", file=file,
               field="Deployment.pools[0].engine.mamba_cache_dtype", value=mamba_cache)

    # ---- speculation
    spec = eng.get("speculative")
    num_spec = int(spec["num_spec_tokens"]) if spec else 0
    uniform_width = 1 + num_spec
    drafter = None
    if spec and graph.speculator:
        method = str(spec.get("method") or graph.speculator["method"])
        dstack = graph.speculator["stack"]
        drafter = {"method": method, "kinds": list(dstack["prologue"]) + list(dstack["pattern"]) *
                   max(int(dstack["repeat"]), 1) + list(dstack["epilogue"]),
                   "parallel_block": method in PARALLEL_BLOCK_DRAFTERS}
        drafter["passes"] = 1 if drafter["parallel_block"] else num_spec

    # ---- graph modes and capture ceiling
    mode = str(eng.get("cudagraph_mode", "") or "").upper()
    if eng.get("enforce_eager"):
        mode = "NONE"
    if mode == "":
        mode = "FULL_AND_PIECEWISE"
        provenance.append(("cudagraph_mode", "assumed FULL_AND_PIECEWISE (vLLM default)"))
    if mode not in GRAPH_MODES:
        refuse(f"unknown cudagraph mode (known: {', '.join(GRAPH_MODES)})", file=file,
               field="Deployment.pools[0].engine.cudagraph_mode", value=eng.get("cudagraph_mode"))
    decode_mode, other_mode = MODE_TABLE[mode]
    four_native = (chip.nvfp4_tflops or 0) > 0
    max_seqs = eng.get("max_num_seqs")
    if max_seqs is None:
        max_seqs = 1024 if chip.memory_gib >= 70 and "a100" not in chip.name else 256
        provenance.append(("max_num_seqs", f"assumed {max_seqs} (vLLM default for this part)"))
    if mode == "NONE":
        capture_tokens = 0
    elif "max_cudagraph_capture_size" in eng:
        capture_tokens = int(eng["max_cudagraph_capture_size"])
    else:
        capture_tokens = laws.capture_ceiling(max_seqs, uniform_width, four_native)
        provenance.append(("capture ceiling", f"{capture_tokens} tokens (vLLM's default capture sizes)"))

    # ---- graph walk
    expanded = graph.expanded_stack()
    counts = {}
    for kid in expanded:
        counts[kid] = counts.get(kid, 0) + 1
    kind_ids = [k for k in graph.layer_kinds if counts.get(k, 0) > 0]
    ctx = {"tp": tp, "moe_group": moe_group, "sp_moe": sp_moe}
    hidden = graph.hidden_size
    classes = _RateClasses(chip, scope, file)

    # MoE constants (reference-kernel.md section 6)
    experts_max = max([n["experts"] for nodes in graph.layer_kinds.values() for n in nodes
                       if n["op"] == "GroupedGEMM" and n["top_k"] > 0] or [0])
    eplb = eng.get("eplb") or {}
    redundant = int(eplb.get("num_redundant_experts", 0) or 0) if eplb.get("enable_eplb") else 0
    experts_total = experts_max + redundant
    ep = expert_width
    experts_per_rank = local_share = 0.0
    if experts_max > 0:
        base = experts_total // ep
        if base == 0:
            refuse(f"the expert-parallel width {ep} exceeds the expert count {experts_total}",
                   file=file, field="Deployment.pools[0].parallel", value=f"tp*dp = {ep}")
        experts_per_rank = base + (1 if experts_total % ep else 0)
        local_share = experts_per_rank / experts_total
    expert_shards = tp * max(dp, 1) if ep <= 1 else 1
    dp_slice = expert_shards / tp if ep <= 1 else 1.0
    funnel = dp if (moe_group > 1 and dp > 1) else 1
    imbalance = scope.use("moe_routing_imbalance_median") if experts_max > 0 else None

    # collective classes
    chip_sfx = chip.name.replace("-", "_")
    widths = {"tp": tp, "expert": moe_group}
    coll_keys = []           # (op, group)
    coll_info = []

    def collective_class(op, group):
        key = (op, group)
        if key in coll_keys:
            return coll_keys.index(key)
        coll_keys.append(key)
        return len(coll_keys) - 1

    for op, group in ALWAYS_RESOLVED:
        collective_class(op, group)

    # attention read configs and per-kind tables
    cache_b = CACHE_DTYPES[cache]
    if cache_b is None:
        cache_b = 2.0 if served_bytes < 2 else served_bytes
    attn_rows = []           # dicts, one per surviving Attention node (primary and secondary)
    gemm_rows = []           # dicts, one per fused GEMM group
    rec_rows, mhc_rows = [], []
    kinds = []               # per-kind dicts
    all_kinds = [(k, counts[k], False) for k in kind_ids]
    if drafter:
        dcounts = {}
        for k in drafter["kinds"]:
            dcounts[k] = dcounts.get(k, 0) + 1
        all_kinds += [(k, c, True) for k, c in dcounts.items()]

    kv_bytes_per_token = 0.0
    # KNOWN DIVERGENCE [kv-geometry-per-kind]: latent/DSA/cache checks and KV bytes follow the
    # layer kinds in the stack, node by node; the reference takes one geometry and kind from the
    # last declared KV-holding kind, even one only a speculator uses (its section 3.13 quirk)
    latent_model = any(n["op"] == "Attention" and n.get("role", "") == "" and n["kind"] in ("mla", "sparse_mla")
                       for k in kind_ids for n in graph.layer_kinds[k])
    dsa = any(n["op"] == "Attention" and n["kind"] == "sparse_mla" and n["d_h"] == 576
              for k in kind_ids for n in graph.layer_kinds[k])
    if cache.endswith("_ds_mla") and not any(n["op"] == "Attention" and n["kind"] == "sparse_mla"
                                             for k in kind_ids for n in graph.layer_kinds[k]):
        refuse("vLLM would not start: a *_ds_mla cache needs a sparse_mla model", file=file,
               field="Deployment.pools[0].engine.cache_dtype", value=cache)
    if cache.startswith("nvfp4") and not cache.endswith("_ds_mla") and latent_model:
        refuse("vLLM would not start: a plain nvfp4 cache does not serve latent (MLA) attention",
               file=file, field="Deployment.pools[0].engine.cache_dtype", value=cache)
    block = int(eng.get("block_size", 64 if dsa else 16))
    layout = cache
    if dsa:
        if block % 64:
            refuse("vLLM would not start: sparse MLA (DSA) needs a block size that is a multiple of 64",
                   file=file, field="Deployment.pools[0].engine.block_size", value=block)
        if any(p in chip.name for p in PRE_HOPPER):
            refuse("vLLM would not start: sparse MLA (DSA) has no backend before Hopper", file=file,
                   field="Scenario.cluster.hardware", value=chip.name)
        if cache.startswith("fp8"):
            layout = "fp8_ds_mla"
        elif cache.startswith("nvfp4"):
            layout = "nvfp4_ds_mla"

    def attention_coefs(kind):
        """(decode floor, decode rate) names: the per-kind pair where a per-kind rate exists,
        its floor inheriting the part-wide floor; else the part-wide pair. None rate: the KV
        bytes are charged at HBM bandwidth instead, with no floor.

        KNOWN DIVERGENCE [indexer-without-rate]: that fallback also prices a secondary
        attention (an indexer's scan) with no rate, as the spec prices the scan in both phases;
        the reference skips a secondary attention whose kind has no decode rate."""
        if kind != "gqa" and scope.has(f"attention_decode_rate_{kind}"):
            rate = scope.use(f"attention_decode_rate_{kind}")
            floor = scope.use(f"attention_decode_floor_{kind}") if scope.has(f"attention_decode_floor_{kind}") \
                else scope.use("attention_decode_floor")
            return floor, rate
        rate = scope.use("attention_decode_rate") if scope.has("attention_decode_rate") else None
        floor = scope.use("attention_decode_floor") if rate else None
        if rate is None:
            provenance.append((f"attention decode ({kind})", "no measured rate: KV read at HBM bandwidth"))
        return floor, rate

    def measured_form(prefix, suffix=""):
        """A model's measured prefill form (registry/EXTENSIONS.md): <prefix>_<term><suffix>
        for the four terms, or None unless every one is admitted."""
        names = [f"{prefix}_{t}{suffix}" for t in ("floor", "per_request", "per_token", "rate")]
        if all(n in scope.entries for n in names):
            return tuple(scope.use(n) for n in names)
        return None

    head_gemms = []
    for kind_index, (kid, count, is_drafter) in enumerate(all_kinds):
        nodes = [n for n in graph.layer_kinds[kid] if _emits(n, ctx)]
        k = {"id": kid, "count": float(count), "drafter": is_drafter,
             "weight_bytes": [0.0, 0.0], "elementwise": [0.0, 0.0], "kernels": [0.0, 0.0],
             "launches": {}, "splits": 0, "dense_weight_mem": 0.0,
             "expert_flops": 0.0, "expert_bytes": 0.0, "expert_class": 0, "top_k": 0,
             "expert_weight_mem": 0.0, "shared_weight_mem": 0.0, "moe": False}
        open_gemm = None
        primary_seen = False
        for node in nodes:
            op = node["op"]
            phase = 1 if node.get("phase") == "prefill" else 0
            replicated = bool(node.get("replicated", False))
            div = 1 if replicated else tp
            k["kernels"][phase] += KERNELS_PER_OP[op]
            fmt = node.get("weight_dtype", served)
            w = DTYPE_BYTES[fmt]
            if op != "GEMM":
                open_gemm = None
            if op == "GEMM":
                n_, k_ = node["n"], node["k"]
                flops = 2.0 * n_ * k_
                wbytes = n_ * k_ * w
                shard_n = hidden > 0 and k_ == hidden and n_ != hidden
                cls = classes.for_format(fmt)
                k["weight_bytes"][phase] += wbytes / div
                k["dense_weight_mem"] += wbytes / div
                if (open_gemm is not None and shard_n and open_gemm["shard_n"] and open_gemm["k"] == k_
                        and open_gemm["phase"] == phase and open_gemm["class"] == cls
                        and open_gemm["replicated"] == replicated):
                    open_gemm["n"] += n_
                    open_gemm["flops"] += flops
                else:
                    open_gemm = {"kind": kind_index, "n": n_, "k": k_, "flops": flops, "shard_n": shard_n,
                                 "phase": phase, "class": cls, "replicated": replicated, "shape": True}
                    gemm_rows.append(open_gemm)
            elif op == "GroupedGEMM":
                # COVERAGE LIMIT [prefill-only-experts]: phase: prefill on a GroupedGEMM gates its
                # launches and shared experts; its routed experts are priced in every step
                n_, k_ = node["n"], node["k"]
                k["moe"] = True
                k["expert_flops"] += 6.0 * n_ * k_
                k["expert_bytes"] += 3.0 * n_ * k_ * w
                k["top_k"] = node["top_k"]
                k["expert_class"] = classes.for_format(fmt, grouped=True)
                shared = node.get("shared_experts", 0) or 0
                if shared > 0:
                    inner = node.get("shared_intermediate_size") or n_
                    sflops = 6.0 * inner * k_ * shared
                    sbytes = 3.0 * inner * k_ * shared * w
                    k["weight_bytes"][phase] += sbytes / div
                    k["shared_weight_mem"] += sbytes / div
                    gemm_rows.append({"kind": kind_index, "n": 0, "k": 0, "flops": sflops, "shard_n": False,
                                      "phase": phase, "class": classes.for_format(fmt),
                                      "replicated": replicated, "shape": False})
            elif op == "Attention":
                role = node.get("role", "") or ""
                secondary = role != ""
                akind = node["kind"]
                # KNOWN DIVERGENCE [pieces-per-mixer]: one piece per attention node (an indexer
                # too, whatever the layer's kind) and per recurrent mixer, as the spec says; the
                # reference counts every layer plus one per sparse-MLA layer with an indexer
                k["splits"] += 1
                sparse = akind == "sparse_mla"
                latent = akind in ("mla", "sparse_mla")
                if secondary:
                    # KNOWN DIVERGENCE [indexer-keys-only]: an indexer caches keys only, n_kv x d_h
                    # at the cache width, not divided by tp; the reference scales the primary's
                    # per-token bytes (tensors, tp, the DS-MLA cell) by n_kv d_h / primary n_kv d_h
                    per_token = node["n_kv"] * node["d_h"] * cache_b
                else:
                    # KNOWN DIVERGENCE [kv-per-layer]: each layer reads its own KV bytes per token;
                    # the reference reads the whole-model average kvBytesPerToken / kvLayers
                    tensors = 1 if latent else 2
                    # a replicated attention keeps every KV head on every rank
                    per_token = tensors * max(1, node["n_kv"] // div) * node["d_h"] * cache_b
                    if latent and layout in DS_MLA_CELL:
                        per_token = DS_MLA_CELL[layout]
                    if not is_drafter:
                        kv_bytes_per_token += per_token * count
                floor, rate = attention_coefs(akind)
                row = {"kind": kind_index, "phase": phase, "secondary": secondary, "akind": akind,
                       "window": float(node.get("window", 0) or 0),
                       "topk": float(node.get("index_topk", 0) or 0),
                       "compress": float(node.get("compress_ratio", 0) or 0),
                       "sparse": sparse, "latent": latent,
                       "bytes_per_token": per_token,
                       "flops_per_pair": node["n_q"] * node["d_h"] / div * (0.5 if secondary else 1.0),
                       "dec_floor": floor, "dec_rate": rate,
                       "pre_form": measured_form("indexer_prefill") if secondary
                       else measured_form("attention_prefill", f"_{akind}")}
                if not secondary:
                    primary_seen = True
                attn_rows.append(row)
            elif op == "RecurrentUpdate":
                rk = node["recurrent_kind"]
                k["splits"] += 1
                heads = node["n_heads"] / div
                d = node.get("d_h") or node["state_size"]
                state = node["state_size"]
                dec_f, dec_r = f"recurrent_decode_floor_{rk}", f"recurrent_decode_rate_{rk}"
                pre_f, pre_r = f"recurrent_prefill_floor_{rk}", f"recurrent_prefill_rate_{rk}"
                has_dec = scope.has(dec_f) and scope.has(dec_r)
                has_pre = scope.has(pre_f) and scope.has(pre_r)
                if not has_dec:
                    provenance.append((f"recurrent {rk}", "no decode floor/rate: decode term is 0"))
                rec_rows.append({"kind": kind_index, "phase": phase,
                                 "dec": (scope.use(dec_f), scope.use(dec_r)) if has_dec else None,
                                 "pre": (scope.use(pre_f), scope.use(pre_r)) if has_pre else None,
                                 # chunked scan: intra-chunk attention (4*C*d) + state read/update (4*d*state)
                                 "scan_flops_per_token": heads * (4.0 * SCAN_CHUNK * d + 4.0 * d * state),
                                 "scan_class": classes.for_format("bf16")})
            elif op == "Elementwise":
                bpt = node.get("bytes_per_token") or 4.0 * hidden
                k["elementwise"][phase] += bpt / div
            elif op == "HyperConnection":
                half = node["half"]
                form = (f"mhc_floor_{half}", f"mhc_rate_{half}")
                has = all(n in scope.entries for n in form)
                mix = 2.0 * (node.get("mix_n", 0) or 0) * (node.get("mix_k", 0) or 0)
                mhc_rows.append({"kind": kind_index, "phase": phase, "bytes_per_token": node["bytes_per_token"],
                                 "mix_flops": mix, "form": tuple(scope.use(n) for n in form) if has else None,
                                 "mix_class": classes.for_format(fmt)})
            else:  # collectives
                group = "expert" if op == "All2All" else "tp"
                c = collective_class(op, group)
                key = (c, phase)
                k["launches"][key] = k["launches"].get(key, 0) + 1
        if graph.capture_breaks.get(kid):
            k["splits"] = graph.capture_breaks[kid]
        kinds.append(k)

    # head: GEMMs priced once per step over all T tokens; its norm's bytes are not charged
    head_kernels = 0
    head_flops = head_weight = 0.0
    head_class = None
    for node in graph.head:
        if not _emits(node, ctx):
            continue
        head_kernels += KERNELS_PER_OP[node["op"]]
        if node["op"] == "GEMM":
            fmt = node.get("weight_dtype", served)
            div = 1 if node.get("replicated") else tp
            head_flops += 2.0 * node["n"] * node["k"] / div
            head_weight += node["n"] * node["k"] * DTYPE_BYTES[fmt] / div
            head_class = classes.for_format(fmt)
    if head_class is None:
        head_class = classes.for_format(served)

    # ---- collectives: snapping, placement, coefficient names
    intra = chip.nvlink_gbps or 0
    inter = network.internode_gbps if network else 0
    ratio = intra / inter if intra > 0 and inter > 0 else 1.0
    coll_rows = []
    for op, group in coll_keys:
        opname = COLLECTIVE_NAMES[op]
        measured = [n for n in SNAP_WIDTHS
                    if all(f"collective_{p}_{opname}_fp16_{n}rank_{chip_sfx}" in scope.entries
                           for p in ("floor", "peak_rate", "transition_rate"))]
        width = widths[group]
        snapped = _snap(width, measured, op=opname, chip=chip_sfx, file=file)
        stride = 1
        per_node = max(gpus_per_node // stride, 1) if gpus_per_node > 0 else 0
        crosses = gpus_per_node > 0 and width > per_node
        if crosses and rack_domain and width * stride <= rack:
            crosses = False
        if crosses and network is None:
            refuse(f"a {op} group of {width} ranks crosses nodes but the cluster names no fabric",
                   file=file, field="Scenario.cluster.fabric")
        route_bytes = op == "All2All" and routed
        if crosses:
            sp = laws.all2all_span(width, per_node, ratio) if (op == "All2All" and (group != "expert" or routed)) \
                else laws.ring_span(width, per_node, ratio)
        else:
            sp = 1.0
        coll_rows.append({"op": op, "group": group, "width": width, "snapped": snapped,
                          "nic": bool(crosses), "span": sp,
                          "bytes_per_token": 2.0 * hidden * (max(k_["top_k"] for k_ in kinds) if route_bytes and kinds else 1),
                          "names": None})
    used_classes = {c for k in kinds for (c, _ph) in k["launches"]}
    for c in sorted(used_classes):
        row = coll_rows[c]
        opname = COLLECTIVE_NAMES[row["op"]]
        row["names"] = tuple(scope.require(f"collective_{p}_{opname}_fp16_{row['snapped']}rank_{chip_sfx}",
                                           f"{row['op']} over {row['width']} ranks")
                             for p in ("floor", "transition_rate", "peak_rate"))

    # ---- host
    replay = scope.use("host_replay_graph_per_step")
    eager_layer = scope.use("host_launch_eager_per_layer")
    per_kernel = scope.use("host_launch_per_kernel")
    scope.use("host_output_token")
    target_kinds = [k for k in kinds if not k["drafter"]]
    total_layers = float(sum(k["count"] for k in target_kinds))
    kernels = [sum(k["kernels"][ph] * k["count"] for k in target_kinds) + (head_kernels if ph == 0 else 0)
               for ph in (0, 1)]
    segments = 1 + sum(k["splits"] * k["count"] for k in target_kinds)
    drafter_kinds = [k for k in kinds if k["drafter"]]
    drafter_layers = float(sum(k["count"] for k in drafter_kinds))
    drafter_kernels = [sum(k["kernels"][ph] * k["count"] for k in drafter_kinds) for ph in (0, 1)]
    drafter_segments = 1 + sum(k["splits"] * k["count"] for k in drafter_kinds)

    # ---- memory (reported, not priced)
    weights = 0.0
    for k in target_kinds:
        weights += k["count"] * (k["dense_weight_mem"] + k["shared_weight_mem"] +
                                 (k["expert_bytes"] * experts_per_rank / expert_shards if k["moe"] else 0.0))
    weights += head_weight + hidden * graph.vocab_size * ckpt_bytes / tp
    eplb_bytes = sum(k["count"] * k["expert_bytes"] * redundant / max(ep, 1) / expert_shards
                     for k in target_kinds if k["moe"])
    weights -= eplb_bytes
    drafter_weights = sum(k["count"] * (k["dense_weight_mem"] + k["shared_weight_mem"] +
                                        (k["expert_bytes"] * experts_per_rank / expert_shards if k["moe"] else 0.0))
                          for k in drafter_kinds)
    memory = {"weights_bytes": weights + drafter_weights, "target_weights_bytes": weights,
              "drafter_weights_bytes": drafter_weights, "kv_bytes_per_token": kv_bytes_per_token,
              "cache_layout": layout, "block_size": block}
    snap_tp = max([w for w in SNAP_WIDTHS if w <= min(tp, 8)] or [1])
    act_name = f"activation_buffer_count_{'moe' if experts_max else 'dense'}_{snap_tp}rank"
    if act_name in scope.entries and "activation_scratch_floor_bytes" in scope.entries:
        h_act = max([n["n_q"] * n["d_h"] if n["kind"] not in ("mla", "sparse_mla") else hidden
                     for kk in kind_ids for n in graph.layer_kinds[kk] if n["op"] == "Attention"] or [hidden])
        memory["activation_bytes"] = max(scope.value(act_name) * int(eng.get("max_num_batched_tokens", 8192)) * h_act * 2,
                                         scope.value("activation_scratch_floor_bytes"))
    graph_mem = f"cudagraph_capture_bytes_{mode.lower()}"
    if graph_mem in scope.entries:
        memory["cudagraph_bytes"] = scope.value(graph_mem)
    # CommBuffers (reference-kernel.md A.1): engine_workspace_bytes, plus the NCCL communicators of
    # the widest declared width <= tp (else the narrowest declared) when any group is wider than 1
    comm = float(scope.value("engine_workspace_bytes", 0.0))
    nccl = [w for w in SNAP_WIDTHS if f"nccl_communicator_bytes_{w}rank" in scope.entries]
    if max(tp, dp, expert_width) > 1 and nccl:
        comm += scope.value(f"nccl_communicator_bytes_{max([w for w in nccl if w <= tp] or [min(nccl)])}rank")
    memory["comm_buffer_bytes"] = comm
    # KV-cache tokens one rank holds: its share of HBM (gpu_memory_utilization) less every fixed term
    fixed = sum(memory.get(k, 0.0) for k in ("weights_bytes", "activation_bytes", "cudagraph_bytes",
                                             "comm_buffer_bytes"))
    budget = chip.memory_gib * 2 ** 30 * float(eng.get("gpu_memory_utilization", 0.9))
    memory["kv_capacity_tokens"] = (max(budget - fixed, 0.0) / kv_bytes_per_token if kv_bytes_per_token > 0
                                    else math.inf)

    # ---- arrays
    K = len(kinds)
    C = len(coll_rows)
    launches = np.zeros((2, K, C))
    for i, k in enumerate(kinds):
        for (c, ph), n in k["launches"].items():
            launches[ph, i, c] = n
    arrays = {
        "count": np.array([k["count"] for k in kinds]),
        "drafter_count_scale": np.array([float(drafter["passes"]) if (k["drafter"] and drafter) else 1.0 for k in kinds]),
        "weight_bytes": np.array([k["weight_bytes"] for k in kinds]).T.reshape(2, K),
        "elementwise_bytes": np.array([k["elementwise"] for k in kinds]).T.reshape(2, K),
        # KNOWN DIVERGENCE [routed-flops-not-over-tp]: routed FLOPs are not divided by tp (each
        # rank is charged whole experts' arithmetic), the reference's deliberate over-charge, kept
        "expert_flops": np.array([k["top_k"] * local_share * k["expert_flops"] / dp_slice for k in kinds]),
        "expert_bytes": np.array([k["expert_bytes"] / expert_shards for k in kinds]),
        "expert_class": np.array([k["expert_class"] for k in kinds], dtype=np.int32),
        "expert_topk": np.array([float(k["top_k"]) for k in kinds]),
        "launches": launches,
        "coll_bytes_per_token": np.array([r["bytes_per_token"] * r["span"] for r in coll_rows]),
        "coll_nic": np.array([r["nic"] for r in coll_rows], dtype=bool),
    }

    def table(rows, fields, dtype=float):
        return {f: np.array([r[f] for r in rows], dtype=dtype) for f in fields}

    g = table(gemm_rows, ("kind", "flops", "phase", "class"), dtype=float)
    arrays.update({
        "gemm_kind": g["kind"].astype(np.int32), "gemm_class": g["class"].astype(np.int32),
        "gemm_phase": g["phase"].astype(np.int32),
        "gemm_flops": np.array([r["flops"] / (1 if r["replicated"] else tp) for r in gemm_rows]),
        "gemm_n": np.array([(r["n"] / tp if r["shard_n"] and not r["replicated"] else r["n"]) if r["shape"] else 0.0
                            for r in gemm_rows]),
        "gemm_k": np.array([(r["k"] if (r["shard_n"] or r["replicated"]) else r["k"] / tp) if r["shape"] else 0.0
                            for r in gemm_rows]),
    })
    arrays.update({f"attn_{f}": v for f, v in table(attn_rows, ("kind", "phase", "window", "topk", "compress",
                                                                "bytes_per_token", "flops_per_pair")).items()})
    arrays["attn_kind"] = arrays["attn_kind"].astype(np.int32)
    arrays["attn_phase"] = arrays["attn_phase"].astype(np.int32)
    arrays["attn_sparse"] = np.array([r["sparse"] for r in attn_rows], dtype=bool)
    arrays["attn_secondary"] = np.array([r["secondary"] for r in attn_rows], dtype=bool)
    arrays["attn_latent"] = np.array([r["latent"] for r in attn_rows], dtype=bool)
    arrays.update({"rec_kind": np.array([r["kind"] for r in rec_rows], dtype=np.int32),
                   "rec_phase": np.array([r["phase"] for r in rec_rows], dtype=np.int32),
                   "rec_scan_flops": np.array([r["scan_flops_per_token"] for r in rec_rows]),
                   "rec_scan_class": np.array([r["scan_class"] for r in rec_rows], dtype=np.int32)})
    arrays.update({"mhc_kind": np.array([r["kind"] for r in mhc_rows], dtype=np.int32),
                   "mhc_phase": np.array([r["phase"] for r in mhc_rows], dtype=np.int32),
                   "mhc_bytes_per_token": np.array([r["bytes_per_token"] for r in mhc_rows]),
                   "mhc_mix_flops": np.array([r["mix_flops"] for r in mhc_rows]),
                   "mhc_mix_class": np.array([r["mix_class"] for r in mhc_rows], dtype=np.int32)})
    arrays["class_peak"] = np.array(classes.peaks)

    # KNOWN DIVERGENCE [prefill-floor-without-scale]: the measured prefill floor is charged even
    # without attention_prefill_work_scale; the reference charges neither then
    pre_floor = scope.use("attention_prefill_floor") if scope.has("attention_prefill_floor") else None
    pre_scale = scope.use("attention_prefill_work_scale") if scope.has("attention_prefill_work_scale") else None
    coef = {
        "hbm_derate": derate, "moe_imbalance": imbalance,
        "classes": tuple(tuple(sorted(r.items())) for r in classes.roles),
        "attn_dec": tuple((r["dec_floor"], r["dec_rate"]) for r in attn_rows),
        "attn_pre_form": tuple(r["pre_form"] for r in attn_rows),
        "attn_pre_floor": pre_floor, "attn_pre_scale": pre_scale,
        "rec_dec": tuple(r["dec"] for r in rec_rows), "rec_pre": tuple(r["pre"] for r in rec_rows),
        "mhc_form": tuple(r["form"] for r in mhc_rows),
        "coll": tuple(r["names"] for r in coll_rows),
        "replay": replay, "eager_layer": eager_layer, "per_kernel": per_kernel,
    }
    # the one-launch correction (FlashAttention serves a mixed non-latent batch in one launch)
    one_launch = [bool((not r["latent"]) and not r["secondary"] and not four_native and r["dec_rate"]
                       and pre_scale) for r in attn_rows]
    arrays["attn_one_launch"] = np.array(one_launch, dtype=bool)
    scalars = {
        "tp": tp, "dp": dp, "expert_width": expert_width, "moe_group": moe_group, "funnel": float(funnel),
        "hidden": hidden, "hbm_peak_bytes": chip.hbm_tbs * 1e12,
        "experts_total": float(experts_total), "experts_per_rank": float(experts_per_rank),
        # KNOWN DIVERGENCE [prefill-attention-bf16]: prefill attention, the indexer scan and the
        # chunked recurrent scan compute at the BF16 peak and ramp (activations are 16-bit); the
        # reference prices prefill attention at the served format's peak and ramp
        "bf16_class": classes.for_format("bf16"), "head_class": head_class,
        "head_flops": head_flops, "head_weight_bytes": head_weight,
        "total_layers": total_layers, "kernels": float(kernels[0]), "kernels_prefill": float(kernels[1]),
        "segments": float(segments), "decode_mode": HOST_MODES.index(decode_mode),
        "other_mode": HOST_MODES.index(other_mode), "capture_tokens": float(capture_tokens),
        "uniform_width": float(uniform_width),
        "drafter": bool(drafter), "drafter_parallel_block": bool(drafter and drafter["parallel_block"]),
        "drafter_passes": float(drafter["passes"]) if drafter else 0.0,
        "drafter_layers": drafter_layers, "drafter_kernels": float(drafter_kernels[0]),
        "drafter_kernels_prefill": float(drafter_kernels[1]), "drafter_segments": float(drafter_segments),
        "drafter_width": float(max(num_spec, 1)),
        "has_moe": any(k["moe"] for k in kinds), "n_classes": len(classes.peaks),
    }
    coefficients = scope.vector()
    plan = Plan(name=scenario.name, arrays=arrays, scalars=scalars, coef=coef, memory=memory,
                provenance=tuple(provenance), layer_kind_names=tuple(
                    (("drafter:" if k["drafter"] else "") + k["id"]) for k in kinds))
    resolution = {"tp": tp, "dp": dp, "ep": expert_width, "moe_group": moe_group, "served_dtype": served,
                  "cache_dtype": cache, "cache_layout": layout, "nodes_spanned": nodes_spanned,
                  "cudagraph_mode": mode, "capture_tokens": capture_tokens, "max_num_seqs": max_seqs,
                  "rate_classes": [(k_[0], k_[1], p) for k_, p in zip(classes.keys, classes.peaks)],
                  "collectives": [{k_: v for k_, v in r.items()} for r in coll_rows],
                  "decode_threshold": uniform_width, "sp_moe": sp_moe, "routed_all2all": routed,
                  "kernels_per_step": kernels[0], "piecewise_segments": segments,
                  "total_layers": total_layers}
    return Deployment(scenario=scenario, graph=graph, chip=chip, plan=plan, coefficients=coefficients,
                      resolution=resolution)


def testdata_root() -> Path:
    return Path(__file__).resolve().parents[2] / "testdata"


def bundled_scenarios() -> list:
    """Names of the bundled scenarios (testdata/aisimulate/*.yaml), sorted."""
    return sorted(p.stem for p in (testdata_root() / "aisimulate").glob("*.yaml"))


def scenario_path(name_or_path) -> Path:
    """A scenario file: a path as given, or a bundled scenario's name (testdata/aisimulate/<name>.yaml).
    An unknown name is refused with the nearest bundled names."""
    p = Path(str(name_or_path))
    if p.exists():
        return p
    for cand in (testdata_root() / "aisimulate" / f"{p.name}", testdata_root() / "aisimulate" / f"{p.name}.yaml"):
        if cand.exists():
            return cand
    names = bundled_scenarios()
    stem = p.name[:-5] if p.name.endswith(".yaml") else p.name
    near = [n for n in names if stem and stem.lower() in n.lower()][:5]
    near += [n for n in difflib.get_close_matches(stem, names, n=5, cutoff=0.6) if n not in near]
    hint = f"; near matches: {', '.join(near[:5])}" if near else \
        f"; {len(names)} bundled scenarios in testdata/aisimulate/, e.g. {', '.join(names[:3])}"
    refuse(f"no such scenario file, and no bundled scenario of that name{hint}", file=str(name_or_path))


def load_deployment(path, registry=None, *, pool_index: int = 0, registry_roots=None,
                    extra_coefficient_files=()) -> Deployment:
    """Read a scenario file and resolve it (the usual entry point).

    registry: a Registry; or registry_roots: folders to search (the project's registry, or a
    public catalog/registry checkout). extra_coefficient_files: coefficient sets applied after
    the scenario's own (e.g. a fitted set), overriding by name.
    """
    from .formats import load_coefficient_set
    if registry is None:
        registry = Registry(registry_roots) if registry_roots else Registry()
    scenario = load_scenario(scenario_path(path), pool_index)
    extra = [load_coefficient_set(f) for f in extra_coefficient_files]
    return resolve(scenario, registry, extra_sets=extra)
