"""Resolve: a deployment (scenario + graph + chip + coefficient sets) into a Plan, once.

Everything that does not depend on the batch is decided here, in NumPy and plain Python:
widths, the served format and the arithmetic rate of every GEMM, coefficient scoping,
collective width snapping and placement, the graph's expansion into distinct layer kinds with
counts, node conditions (``emit``), GEMM fusion, kernel counts, KV and state geometry, host
graph modes and the capture ceiling, and every refusal. The step kernel (step.py) then only
walks a handful of arrays.

``resolve()`` is a pipeline of named stages, each a small function that takes and returns
plain records (NamedTuples) and refuses what it cannot resolve before a later stage runs:

1. the deployment: ``_check_coverage`` (pp, pcp, dcp), ``_documents`` (graph, chip, fabric),
   ``_widths`` (tp, dp, the expert and MoE-group widths, the nodes spanned),
   ``_coefficients_in_scope`` (the admitted entries; the HBM derate), ``_served_formats``
   (weights, KV and mamba caches), ``_speculation`` (the drafter), ``_host_modes`` (graph
   modes, max_num_seqs, the capture ceiling);
2. layer kinds: ``_layer_stack`` (distinct kinds with counts), ``_experts`` (MoE constants),
   ``_kv_layout`` (cache layout and block size);
3. the graph walk: ``_graph_walk``, one ``_walk_kind`` per kind (emit conditions, GEMM
   fusion, kernel counts, one row per attention, recurrent mixer and hyper-connection,
   collective launches), then ``_head``;
4. collectives, host and memory: ``_collectives`` (classes, snapping, placement, names),
   ``_host_graph`` (kernels, segments, host coefficients), ``_weights`` and ``_memory``
   (reported, not priced);
5. the plan: ``_prefill_attention``, ``_kind_arrays``, ``_row_arrays``, ``_coefficient_roles``,
   ``_plan_scalars``, ``_resolution``.

Two ledgers run through the stages instead of being returned: the ``_Scope`` marks each
coefficient a stage reads (what is marked becomes the Coefficients vector), and
``_RateClasses`` registers each (peak, ramp) class a GEMM computes at, in order of first use
(a row's rate class is its index there, so the order of the walk is part of the plan).

Coverage limits (refused with a clear message rather than priced wrongly): pipeline
parallelism (pp > 1) and context parallelism (pcp > 1, dcp > 1). Every place the code knowingly
differs from the reference kernel carries a grep-able KNOWN DIVERGENCE or COVERAGE LIMIT
comment with a bracketed tag; registry/EXTENSIONS.md lists them all.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import laws
from .errors import refuse, shown
from .formats import (DTYPE_BYTES, Chip, ModelGraph, Network, Registry, Scenario, check_registry,
                      load_scenario, path_list)
from .plan import Coefficients, Plan
from .schema import SCALE_BYTES

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9      # vLLM's --gpu-memory-utilization default
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
# a collective class is (op, group, bytes per token the graph states; None: the reference's
# 2 x hidden, bf16 activations)
ALWAYS_RESOLVED = (("AllReduce", "tp", None), ("AllGather", "tp", None), ("ReduceScatter", "tp", None),
                   ("All2All", "expert", None))
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


_ADMITTED: dict = {}      # (the sets' identities, scope values) -> (the sets, their admitted entries)


def _admitted(sets, values) -> dict:
    """{name: entry} of the entries of ``sets`` whose scope admits ``values``, later sets
    overriding earlier ones. Kept per set objects and values: the deployments of a size search
    or an accuracy file share a few scopes, and matching the ~1,100 entries of the bundled sets
    took 80% of resolving each (3 ms; sets are immutable once read and cached by
    formats.load_coefficient_set, and a hit checks it holds those very objects)."""
    key = (tuple(id(s) for s in sets), tuple(values.items()))
    hit = _ADMITTED.get(key)
    if hit is not None and len(hit[0]) == len(sets) and all(a is b for a, b in zip(hit[0], sets)):
        return hit[1]
    entries = {}
    for cset in sets:
        for e in cset.entries:
            if all(_Scope._admits(dim, allowed, values[dim]) for dim, allowed in e.scope.items()):
                entries[e.name] = e
    if len(_ADMITTED) >= 256:
        _ADMITTED.clear()
    _ADMITTED[key] = (tuple(sets), entries)
    return entries


class _Scope:
    """Admitted coefficient entries for one deployment, later sets overriding earlier ones."""

    def __init__(self, sets, values, file):
        self.file = file
        self.entries = dict(_admitted(sets, values))
        if not self.entries:
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


# ----------------------------------------------------------------------------- emit conditions, width snapping


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


# ----------------------------------------------------------------------------- stage records


class Documents(NamedTuple):
    """The documents a scenario names: its model graph, its chip and its fabric (or None)."""
    graph: ModelGraph
    chip: Chip
    network: Network | None


class Widths(NamedTuple):
    """Group widths and where the groups sit (reference-kernel.md section 2)."""
    tp: int
    dp: int
    expert_width: int      # ranks the experts are spread over: tp*dp with expert parallelism, else 1
    moe_group: int         # ranks an MoE layer's tokens meet over: the expert collectives' width
    sp_moe: bool           # sequence-parallel MoE: tensor_parallel_unless_sp_moe nodes drop out
    routed: bool           # the All2All moves routed tokens (top_k copies of each)
    gpus_per_node: int
    rack: int
    rack_domain: bool      # a rack-scale NVLink domain: a group within the rack crosses no node
    nodes_spanned: int


class Formats(NamedTuple):
    """The served weight format and what the caches hold."""
    served: str            # the quantization's format, else the checkpoint's
    served_bytes: float
    checkpoint_bytes: float
    cache: str             # the engine's cache_dtype ("auto" when unset)
    cache_bytes: float     # bytes per cached element ("auto": the served width, at least 2)
    mamba_cache: str


class Drafter(NamedTuple):
    """A speculator's drafter, priced as extra layer kinds."""
    method: str
    kinds: tuple           # its layer kinds, in stack order
    parallel_block: bool   # drafts every token in one pass
    passes: int            # its forward passes per step


class Speculation(NamedTuple):
    """Speculative decoding: tokens per uniform decode row, and the drafter (None: none priced)."""
    num_spec: int
    uniform_width: int     # 1 + num_spec
    drafter: Drafter | None


class HostModes(NamedTuple):
    """Graph modes and the capture ceiling (reference-kernel.md section 7.2)."""
    mode: str              # the cudagraph mode in force
    decode_mode: str       # host mode of a uniform-decode batch: full, piecewise or eager
    other_mode: str        # host mode of any other batch
    max_seqs: int
    capture_tokens: int    # the largest captured batch, in tokens (0: none captured)
    notes: tuple           # (what, how) provenance: what was assumed


class LayerStack(NamedTuple):
    """The distinct layer kinds to walk, with how many layers of each the stack holds."""
    kind_ids: tuple        # the target's kinds present in its stack, in declaration order
    kinds: tuple           # (kind id, layer count, is_drafter): the target's, then the drafter's


class Experts(NamedTuple):
    """MoE constants (reference-kernel.md section 6); zeros for a dense model."""
    experts_max: int       # routed experts of the largest GroupedGEMM (0: a dense model)
    redundant: int         # EPLB's redundant experts
    experts_total: int
    experts_per_rank: float
    local_share: float     # experts_per_rank / experts_total
    expert_shards: int     # ranks one expert's weights are split over: tp*dp without EP, else 1
    dp_slice: float        # expert_shards / tp without EP, else 1
    funnel: int            # dp ranks whose tokens meet in one MoE group (1: none)
    imbalance: str | None  # the routing-imbalance coefficient read (None: a dense model)


class KvLayout(NamedTuple):
    """How the KV cache is laid out."""
    latent_model: bool     # a primary attention of the target holds a latent (MLA) cache
    dsa: bool              # sparse MLA over a 576-wide latent (DeepSeek sparse attention)
    block: int             # tokens per cache block
    layout: str            # the cache dtype, or the DS-MLA cell layout sparse MLA stores it in
    # vLLM's MLA block rule (vllm_mla_block): (backend, kernel block sizes, its own block) and why
    # the block is not the scenario's; () and "" where no rule applies (another engine, no MLA, DSA)
    block_rule: tuple = ()
    block_note: str = ""


class GemmRow(NamedTuple):
    """One dense GEMM of a layer kind (or a fused run of them), per layer."""
    kind: int              # index of its layer kind
    n: int
    k: int
    flops: float           # per token, before the tp split
    shard_n: bool          # reads the hidden state (k = hidden) and shards n over tp
    phase: int             # 0: every step, 1: prefill only
    cls: int               # rate class
    replicated: bool       # not split over tp
    shape: bool            # n and k are its own (False: shared experts, no shape factor)


class AttentionRow(NamedTuple):
    """One attention node: a primary attention, or a secondary one (an indexer's scan)."""
    kind: int
    phase: int
    secondary: bool
    akind: str             # gqa, mla, sparse_mla, ...
    window: float          # sliding window in tokens (0: none)
    topk: float            # tokens a sparse attention selects (0: dense)
    compress: float        # its compress_ratio (0: none)
    sparse: bool
    latent: bool
    bytes_per_token: float  # KV bytes one rank reads per context token
    flops_per_pair: float  # per (query, key) pair, per rank
    dec_floor: str | None
    dec_rate: str | None   # None: the KV bytes are read at HBM bandwidth
    pre_form: tuple | None  # the measured prefill form's four names


class RecurrentRow(NamedTuple):
    """One recurrent mixer (a linear-attention or state-space update)."""
    kind: int
    phase: int
    dec: tuple | None      # (floor, rate) names of its measured decode form
    pre: tuple | None      # (floor, rate) names of its measured prefill form
    scan_flops_per_token: float
    scan_class: int
    dec_token_scale: float = 1.0   # a decode token's share of the fitted rate's: rank heads / fitted heads


class HyperRow(NamedTuple):
    """One hyper-connection half."""
    kind: int
    phase: int
    bytes_per_token: float
    mix_flops: float
    form: tuple | None     # (floor, rate) names of its measured form
    mix_class: int


class LayerKind(NamedTuple):
    """One distinct layer kind after the walk: its terms per layer; pairs are per phase
    (every step, prefill only)."""
    id: str
    count: float           # layers of this kind in its stack
    drafter: bool
    weight_bytes: tuple    # weight bytes a rank reads
    elementwise: tuple     # elementwise bytes per token
    kernels: tuple         # kernel launches
    launches: dict         # ((op, group, stated bytes per token or None), phase) -> launches
    splits: int            # piecewise capture breaks
    dense_weight_mem: float
    shared_weight_mem: float
    moe: bool
    expert_flops: float    # routed FLOPs per token and expert
    expert_bytes: float    # one expert's weight bytes (payload: what a step reads)
    expert_class: int
    top_k: int
    expert_weight_mem: float   # one expert's bytes held: payload and block scales


def held_fraction(fmt: str) -> float:
    """Bytes a rank holds per payload byte of a weight in format ``fmt``: 1 + the block scales
    per element / the payload bytes per element (nvfp4 1 + (1/16) / 0.5 = 1.125; 1 for formats
    without counted scales)."""
    return 1.0 + SCALE_BYTES.get(fmt, 0.0) / DTYPE_BYTES[fmt]


class Walk(NamedTuple):
    """The graph walk: every layer kind, and the rows the kernel sums per kind."""
    kinds: tuple           # LayerKind, the target's then the drafter's
    gemms: tuple
    attentions: tuple
    recurrents: tuple
    hypers: tuple
    kv_bytes_per_token: float  # the target's KV bytes per token, over all its layers
    notes: tuple           # provenance: terms the walk found no coefficient for
    kv_windows: tuple = ()  # ((window, bytes per token), ...): the part of kv_bytes_per_token in windowed layers


class Head(NamedTuple):
    """The model head, priced once per step over all tokens."""
    kernels: int
    flops: float           # per token, per rank
    weight_bytes: float    # per rank
    cls: int               # rate class


class _WalkContext(NamedTuple):
    """What every node of the walk reads; scope and classes are the two ledgers."""
    graph: ModelGraph
    tp: int
    emit: dict             # the emit conditions' context: tp, moe_group, sp_moe
    served: str
    cache_bytes: float
    layout: str
    scope: _Scope
    classes: _RateClasses


class _KindWalk(NamedTuple):
    kind: LayerKind
    gemms: tuple
    attentions: tuple
    recurrents: tuple
    hypers: tuple
    kv_terms: tuple        # (per-token KV bytes of each primary target attention times the count, its window)
    notes: tuple


class _ExpertNode(NamedTuple):
    flops: float           # routed, per token and expert
    bytes: float           # one expert's weights
    top_k: int
    cls: int
    shared_bytes: float    # the shared experts' weight bytes per rank
    shared: GemmRow | None  # the shared experts, a dense GEMM term


class CollectiveRow(NamedTuple):
    """One collective class: an op over a group, snapped to a measured width and placed."""
    op: str
    group: str             # tp or expert
    width: int             # ranks in the group
    snapped: int           # the measured width its coefficients are read at
    nic: bool              # crosses nodes: priced on the NIC
    span: float            # the span factor crossing nodes costs (1: within a node)
    bytes_per_token: float
    names: tuple | None    # (floor, transition_rate, peak_rate); None: no layer launches it


class Collectives(NamedTuple):
    """The collective classes, in class-index order."""
    rows: tuple            # CollectiveRow
    index: dict            # (op, group) -> class index


class HostGraph(NamedTuple):
    """Host terms: the host coefficients, and the kernels and graph pieces per step."""
    replay: str | None
    eager_layer: str | None
    per_kernel: str | None
    total_layers: float
    kernels: tuple         # (every step, prefill only), the head's included
    segments: float        # piecewise graph segments: 1 + the capture breaks
    drafter_layers: float
    drafter_kernels: tuple
    drafter_segments: float


class Weights(NamedTuple):
    """Weight bytes one rank holds."""
    target: float
    drafter: float


class PrefillAttention(NamedTuple):
    """The part-wide prefill attention coefficients' names (None: not admitted)."""
    floor: str | None
    scale: str | None      # attention_prefill_work_scale


# ----------------------------------------------------------------------------- stages: the deployment


def _check_context(scenario: Scenario, graph) -> None:
    """vLLM refuses to start with a max_model_len past the model's derived length (its config's
    max_position_embeddings with RoPE scaling; ModelGraph.max_model_len, where the graph states it)."""
    mml = (scenario.engine or {}).get("max_model_len")
    if graph.max_model_len is not None and isinstance(mml, (int, float)) and mml > graph.max_model_len:
        refuse(f"vLLM would not start: more than the {graph.max_model_len} tokens {graph.name} serves at (its "
               "config's max_position_embeddings, as vLLM derives max_model_len)", file=scenario.path,
               field=scenario.pool_field + ".engine.max_model_len", value=mml)


def _check_coverage(scenario: Scenario) -> None:
    """Refuse what jaxprice does not price: pipeline and context parallelism."""
    file, par, eng = scenario.path, scenario.parallel, scenario.engine
    pp, pcp, dcp = par.get("pp", 1), par.get("pcp", 1), par.get("dcp", 1)
    if pp > 1:   # COVERAGE LIMIT [pipeline-parallel]: no pipeline-stage split is priced
        refuse("pipeline parallelism is not priced (no pipeline-stage split)", file=file,
               field=scenario.pool_field + ".parallel.pp", value=pp)
    # COVERAGE LIMIT [context-parallel]: none of reference-kernel.md's PCP/DCP machinery
    # (token sharding, combine collectives, context gathers, the zigzag split) is implemented,
    # so the rank-local token count T is always the batch's scheduled tokens
    if pcp > 1 or dcp > 1:
        refuse("context parallelism (pcp/dcp > 1) is not priced by jaxprice", file=file,
               field=scenario.pool_field + ".parallel." + ("pcp" if pcp > 1 else "dcp"),
               value=max(pcp, dcp))
    dcp_backend = eng.get("dcp_comm_backend")
    if dcp_backend not in (None, "", "ag_rs", "a2a"):
        refuse("unknown dcp_comm_backend (known: ag_rs, a2a)", file=file,
               field=scenario.pool_field + ".engine.dcp_comm_backend", value=dcp_backend)


def _documents(scenario: Scenario, reg: Registry) -> Documents:
    """The model graph, chip and fabric the scenario names, read through the registry."""
    file = scenario.path
    graph = reg.model(scenario.model, file=file, field="Scenario.model")
    chip = reg.chip(scenario.hardware, file=file, field="Scenario.cluster.hardware")
    network = None
    if scenario.fabric:
        network = reg.network(scenario.fabric, file=file, field="Scenario.cluster.fabric")
    return Documents(graph, chip, network)


def _widths(scenario: Scenario, chip: Chip) -> Widths:
    """tp and dp, the expert and MoE-group widths, the all2all backend's consequences, and how
    many nodes the widest group spans (one, inside a rack-scale domain)."""
    par, eng = scenario.parallel, scenario.engine
    tp, dp = par.get("tp", 1), par.get("dp", 1)
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
    return Widths(tp, dp, expert_width, moe_group, sp_moe, routed, gpus_per_node, rack,
                  rack_domain, nodes_spanned)


def serving_engine(scenario: Scenario) -> str:
    """The engine a deployment is served by, as a coefficient entry's ``engine`` scope reads it:
    its engine.scheduler (vllm, sglang, trtllm), vLLM where unstated (the serving simulation's
    default; a scenario names its engine only in its file name, data-formats.md)."""
    return (scenario.engine or {}).get("scheduler") or "vllm"


def _coefficients_in_scope(scenario: Scenario, reg: Registry, extra_sets, docs: Documents,
                           widths: Widths) -> _Scope:
    """The coefficient entries that apply to this deployment (later sets override earlier
    ones), and the one every deployment reads: the HBM derate. The scope is the ledger the
    later stages mark each coefficient they read on; what is marked becomes the vector."""
    file, chip = scenario.path, docs.chip
    sets = [reg.coefficient_set(n, file=file, field="Scenario.coefficients") for n in scenario.coefficient_sets]
    sets += list(extra_sets)
    scope = _Scope(sets, {"hardware": chip.name, "model": docs.graph.name, "tp": widths.tp,
                          "ep": widths.expert_width, "nodes_spanned": widths.nodes_spanned,
                          "engine": serving_engine(scenario)}, file)
    scope.require("hbm_derate", "achieved HBM bandwidth")
    if chip.hbm_tbs <= 0 or scope.value("hbm_derate") <= 0:
        refuse("HBM bandwidth resolved to a non-positive value", file=chip.source, field="hbm_tbs",
               value=chip.hbm_tbs * scope.value("hbm_derate"), has_value=True)
    return scope


def _served_formats(scenario: Scenario, graph: ModelGraph) -> Formats:
    """The served weight format (the quantization's, else the checkpoint's) and the KV and
    mamba cache dtypes, each refused unless vLLM would serve it. A cache dtype of ``auto`` is the
    checkpoint's calibrated FP8 one where it states one (``layouts.checkpoint_kv_cache``)."""
    file, eng = scenario.path, scenario.engine
    quant = eng.get("quantization", "") or ""
    if quant in QUANTIZATION:
        served = QUANTIZATION[quant]
    elif quant == "" or quant in CHECKPOINT_QUANTIZATION:
        served = graph.weight_dtype
    else:
        refuse(f"unknown quantization (known: {', '.join(sorted(QUANTIZATION) + list(CHECKPOINT_QUANTIZATION))})",
               file=file, field=scenario.pool_field + ".engine.quantization", value=quant)
    served_bytes = DTYPE_BYTES[served]
    cache = str(eng.get("cache_dtype", "auto") or "auto")
    if "turboquant" in cache or "per_token_head" in cache:
        refuse("this cache dtype's page is not sized by the kernel", file=file,
               field=scenario.pool_field + ".engine.cache_dtype", value=cache)
    if cache not in CACHE_DTYPES:
        refuse(f"not a vLLM cache dtype (known: {', '.join(k for k in CACHE_DTYPES if k)})", file=file,
               field=scenario.pool_field + ".engine.cache_dtype", value=cache)
    if cache == "fp8_inc":
        refuse("vLLM would not start: fp8_inc caches are for Intel Gaudi only", file=file,
               field=scenario.pool_field + ".engine.cache_dtype", value=cache)
    mamba_cache = str(eng.get("mamba_cache_dtype", "auto") or "auto")
    if mamba_cache not in MAMBA_CACHE_DTYPES:
        refuse(f"not a mamba cache dtype (known: {', '.join(MAMBA_CACHE_DTYPES)})", file=file,
               field=scenario.pool_field + ".engine.mamba_cache_dtype", value=mamba_cache)
    if cache == "auto":     # vLLM's auto takes a checkpoint's calibrated FP8 cache (ModelOpt, compressed-tensors)
        from .layouts import checkpoint_kv_cache
        cache = checkpoint_kv_cache(graph) or cache
    cache_bytes = CACHE_DTYPES[cache]
    if cache_bytes is None:
        cache_bytes = 2.0 if served_bytes < 2 else served_bytes
    return Formats(served, served_bytes, DTYPE_BYTES[graph.weight_dtype], cache, cache_bytes,
                   mamba_cache)


def _speculation(scenario: Scenario, graph: ModelGraph) -> Speculation:
    """Speculative tokens per step, and the drafter when the model graph has a speculator: its
    layer kinds, and one pass (a parallel-block drafter) or one pass per drafted token."""
    spec = scenario.engine.get("speculative")
    num_spec = int(spec["num_spec_tokens"]) if spec else 0
    drafter = None
    if spec and graph.speculator:
        method = str(spec.get("method") or graph.speculator["method"])
        dstack = graph.speculator["stack"]
        kinds = list(dstack["prologue"]) + list(dstack["pattern"]) * max(int(dstack["repeat"]), 1) + \
            list(dstack["epilogue"])
        parallel_block = method in PARALLEL_BLOCK_DRAFTERS
        drafter = Drafter(method, tuple(kinds), parallel_block, 1 if parallel_block else num_spec)
    return Speculation(num_spec, 1 + num_spec, drafter)


def _host_modes(scenario: Scenario, chip: Chip, uniform_width: int) -> HostModes:
    """The cudagraph mode (enforce_eager: NONE; unset: vLLM's FULL_AND_PIECEWISE), the host
    mode each kind of batch runs in, max_num_seqs and the capture ceiling in tokens."""
    file, eng = scenario.path, scenario.engine
    notes = []
    mode = str(eng.get("cudagraph_mode", "") or "").upper()
    if eng.get("enforce_eager"):
        mode = "NONE"
    if mode == "":
        mode = "FULL_AND_PIECEWISE"
        notes.append(("cudagraph_mode", "assumed FULL_AND_PIECEWISE (vLLM default)"))
    if mode not in GRAPH_MODES:
        refuse(f"unknown cudagraph mode (known: {', '.join(GRAPH_MODES)})", file=file,
               field=scenario.pool_field + ".engine.cudagraph_mode", value=eng.get("cudagraph_mode"))
    decode_mode, other_mode = MODE_TABLE[mode]
    four_native = (chip.nvfp4_tflops or 0) > 0
    max_seqs = eng.get("max_num_seqs")
    if max_seqs is None:
        max_seqs = 1024 if chip.memory_gib >= 70 and "a100" not in chip.name else 256
        notes.append(("max_num_seqs", f"assumed {max_seqs} (vLLM default for this part)"))
    if mode == "NONE":
        capture_tokens = 0
    elif "max_cudagraph_capture_size" in eng:
        capture_tokens = int(eng["max_cudagraph_capture_size"])
    else:
        capture_tokens = laws.capture_ceiling(max_seqs, uniform_width, four_native)
        notes.append(("capture ceiling", f"{capture_tokens} tokens (vLLM's default capture sizes)"))
    return HostModes(mode, decode_mode, other_mode, max_seqs, capture_tokens, tuple(notes))


def _layer_stack(graph: ModelGraph, drafter: Drafter | None) -> LayerStack:
    """The target's stack expanded and counted by layer kind (in the order the kinds are
    declared), then the drafter's kinds counted alike (in the order they first appear)."""
    counts = {}
    for kid in graph.expanded_stack():
        counts[kid] = counts.get(kid, 0) + 1
    kind_ids = [k for k in graph.layer_kinds if counts.get(k, 0) > 0]
    kinds = [(k, counts[k], False) for k in kind_ids]
    if drafter is not None:
        dcounts = {}
        for k in drafter.kinds:
            dcounts[k] = dcounts.get(k, 0) + 1
        kinds += [(k, c, True) for k, c in dcounts.items()]
    return LayerStack(tuple(kind_ids), tuple(kinds))


def _experts(scenario: Scenario, graph: ModelGraph, widths: Widths, scope: _Scope) -> Experts:
    """Experts per rank (EPLB's redundant ones included), how one expert's weights are sharded,
    and the routing-imbalance coefficient; an EP width beyond the expert count is refused."""
    file, eng = scenario.path, scenario.engine
    tp, dp, ep = widths.tp, widths.dp, widths.expert_width
    experts_max = max([n["experts"] for nodes in graph.layer_kinds.values() for n in nodes
                       if n["op"] == "GroupedGEMM" and n["top_k"] > 0] or [0])
    eplb = eng.get("eplb") or {}
    redundant = int(eplb.get("num_redundant_experts", 0) or 0) if eplb.get("enable_eplb") else 0
    experts_total = experts_max + redundant
    experts_per_rank = local_share = 0.0
    if experts_max > 0:
        base = experts_total // ep
        if base == 0:
            refuse(f"the expert-parallel width {ep} exceeds the expert count {experts_total}",
                   file=file, field=scenario.pool_field + ".parallel", value=f"tp*dp = {ep}")
        experts_per_rank = base + (1 if experts_total % ep else 0)
        local_share = experts_per_rank / experts_total
    expert_shards = tp * max(dp, 1) if ep <= 1 else 1
    dp_slice = expert_shards / tp if ep <= 1 else 1.0
    funnel = dp if (widths.moe_group > 1 and dp > 1) else 1
    imbalance = scope.use("moe_routing_imbalance_median") if experts_max > 0 else None
    return Experts(experts_max, redundant, experts_total, experts_per_rank, local_share,
                   expert_shards, dp_slice, funnel, imbalance)


def _kv_layout(scenario: Scenario, docs: Documents, stack: LayerStack, cache: str) -> KvLayout:
    """The cache layout the target's attentions take, refused where vLLM would not start: a
    DS-MLA cache without sparse MLA, a plain nvfp4 cache under MLA, sparse MLA (DSA) on a block
    that is not a multiple of 64 or on a part before Hopper."""
    file, eng, chip = scenario.path, scenario.engine, docs.chip
    nodes = [n for k in stack.kind_ids for n in docs.graph.layer_kinds[k] if n["op"] == "Attention"]
    # KNOWN DIVERGENCE [kv-geometry-per-kind]: latent/DSA/cache checks and KV bytes follow the
    # layer kinds in the stack, node by node; the reference takes one geometry and kind from the
    # last declared KV-holding kind, even one only a speculator uses (its section 3.13 quirk)
    latent_model = any(n.get("role", "") == "" and n["kind"] in ("mla", "sparse_mla") for n in nodes)
    dsa = any(n["kind"] == "sparse_mla" and n["d_h"] == 576 for n in nodes)
    if cache.endswith("_ds_mla") and not any(n["kind"] == "sparse_mla" for n in nodes):
        refuse("vLLM would not start: a *_ds_mla cache needs a sparse_mla model", file=file,
               field=scenario.pool_field + ".engine.cache_dtype", value=cache)
    if cache.startswith("nvfp4") and not cache.endswith("_ds_mla") and latent_model:
        refuse("vLLM would not start: a plain nvfp4 cache does not serve latent (MLA) attention",
               file=file, field=scenario.pool_field + ".engine.cache_dtype", value=cache)
    stated = eng.get("block_size")
    block = int(stated if stated is not None else (64 if dsa else 16))
    rule, note = (), ""
    dense_mla = [n for n in nodes if n.get("role", "") == "" and n["kind"] == "mla"]
    if dense_mla and not dsa and serving_engine(scenario) == "vllm":
        block, rule, note = vllm_mla_block(None if stated is None else int(stated), vllm_compute_major(chip), cache,
                                           dense_mla[0].get("qk_nope_head_dim"))
    layout = cache
    if dsa:
        if block % 64:
            refuse("vLLM would not start: sparse MLA (DSA) needs a block size that is a multiple of 64",
                   file=file, field=scenario.pool_field + ".engine.block_size", value=block)
        if any(p in chip.name for p in PRE_HOPPER):
            refuse("vLLM would not start: sparse MLA (DSA) has no backend before Hopper", file=file,
                   field="Scenario.cluster.hardware", value=chip.name)
        if cache.startswith("fp8"):
            layout = "fp8_ds_mla"
        elif cache.startswith("nvfp4"):
            layout = "nvfp4_ds_mla"
    return KvLayout(latent_model, dsa, block, layout, rule, note)


# vLLM's KV block for latent (MLA) attention. vLLM >= 0.17 (PR #35122, "[Attention] Refactor
# check_and_update_config": the block is chosen by the attention backend) picks the MLA backend
# first, by priority and validity (kernel's compute capability, KV cache dtype, qk_nope_head_dim),
# without a --block-size; then its block: 16 where the backend's kernels run it, else the
# smallest size they page in (AttentionBackend.get_preferred_block_size). A stated --block-size
# selects instead the first backend whose kernels page a divisor of it (a warning suggests dropping
# the flag): Kimi-K2.5 on B200 at --block-size 16 moves off FLASHINFER_MLA to TRITON_MLA. Sources
# (vllm-project/vllm): vllm/platforms/cuda.py _get_backend_priorities and get_attn_backend_cls as
# of v0.27.1 (L82-L163, L396-L492, quoted in the stored text id 66265259439); vllm/v1/attention/
# backend.py get_preferred_block_size / supports_block_size (L194-L203, stored text id 66135940664);
# the kernels' block sizes: mla/flashinfer_mla.py@002d68ef00d4b4ac34ec2394d430f3727c516a7d [32, 64],
# qk_nope_head_dim in (64, 128, 192), major 10; mla/flashmla.py@e75aca0ca6dbf9a62a53954c0beb09bf2b670468
# [64], majors 9 and 10; mla/cutlass_mla.py@008c4fe44e295f28335b5f3efd4147cc973392ff [128];
# mla/flashattn_mla.py@00b9b7ad3a37ff624e5816d1b7ae713ecb0a705f MultipleOf(16), major 9, no FP8 cache;
# mla/triton_mla.py (stored text id 54663462215) MultipleOf(16). Measured: InferenceX's Kimi-K2.5
# runs on B200/B300 under vLLM 0.22 (no --block-size) logged KV capacities that are all multiples of
# 32 and not of 64 (testdata/measured/inferencex_engine_logs.csv): FLASHINFER_MLA's 32.
# KNOWN DIVERGENCE [mla-block-version]: vLLM 0.16 and earlier forced the block in
# CudaPlatformBase.check_and_update_config whatever --block-size said (vllm/platforms/cuda.py@
# 002db4951e0c4b326a559eb44b05698afd3e534a: FlashMLA 64 off Blackwell, FlashInfer MLA 64 (32 kept)
# and CUTLASS MLA 128 on Blackwell, sparse MLA exactly 64; logged at info level, no warning; before
# FlashInfer MLA was Blackwell's default, @1c0d9ecf5bad600df3e001bf642dd48c5ed25cc6, CUTLASS MLA
# 128); jaxprice prices the engine of the scenarios' version (0.29.0). A stated block the default
# backend cannot page is priced at the default backend's own block (the kernel rates priced are
# the default backend's, not the fallback's), said in the plan's provenance, and the launch line
# leaves --block-size to vLLM. Sparse MLA (DSA) keeps its own rule (_kv_layout: 64, multiples of it).
VLLM_MLA_BACKENDS = {   # name: (kernel block sizes (a block is a multiple of one), compute majors or (), KV dtypes,
    #                        qk_nope_head_dims or ())
    "FLASHINFER_MLA": ((32, 64), (10,), ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3"), (64, 128, 192)),
    "CUTLASS_MLA": ((128,), (10,), ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3"), ()),
    "FLASH_ATTN_MLA": ((16,), (9,), ("auto", "float16", "bfloat16"), ()),
    "FLASHMLA": ((64,), (9, 10), ("auto", "bfloat16", "fp8", "fp8_e4m3"), ()),
    "TRITON_MLA": ((16,), (), ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3"), ())}
# cuda.py's dense-MLA priorities by compute major (TOKENSPEED_MLA, after FLASHINFER_MLA on Blackwell,
# takes only R1's dims with an FP8 cache, where FLASHINFER_MLA is valid first; left out)
VLLM_MLA_PRIORITY = {10: ("FLASHINFER_MLA", "CUTLASS_MLA", "FLASHMLA", "TRITON_MLA"),
                     9: ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA"),
                     0: ("TRITON_MLA",)}


def vllm_compute_major(chip) -> int:
    """The CUDA compute capability major a part reads as in vLLM's backend tables: 10 for the
    data-center Blackwells (native FP4: B200, B300, GB200, GB300), 0 before Hopper, else 9."""
    if (chip.nvfp4_tflops or 0) > 0:
        return 10
    return 0 if any(p in chip.name for p in PRE_HOPPER) else 9


def _vllm_mla_backends(major: int, cache: str, qk_nope) -> list:
    order = VLLM_MLA_PRIORITY.get(major, VLLM_MLA_PRIORITY[0])
    out = []
    for name in order:
        sizes, majors, dtypes, nopes = VLLM_MLA_BACKENDS[name]
        if (not majors or major in majors) and cache in dtypes and (not nopes or qk_nope in nopes):
            out.append(name)
    return out


def vllm_mla_block(stated: int | None, major: int, cache: str, qk_nope=None) -> tuple[int, tuple, str]:
    """(block size, rule, note) vLLM runs a latent (MLA) attention at: the default backend's
    own block (16 where its kernels page 16, else the smallest they page) where none is stated
    or where the stated one is not a multiple of a size they page; the stated one otherwise.
    ``rule``: (backend, its kernel block sizes, its own block), () where no backend in the table
    takes the cache dtype (the stated block, or 16, kept); ``note``: why the block is not the
    stated one ("" where it is, or where none was stated and it is 16)."""
    valid = _vllm_mla_backends(major, cache, qk_nope)
    if not valid:
        return (16 if stated is None else stated), (), ""
    name = valid[0]
    sizes = VLLM_MLA_BACKENDS[name][0]
    own = 16 if any(16 % s == 0 for s in sizes) else min(sizes)
    rule = (name, sizes, own)
    pages = " or ".join(map(str, sizes)) + " tokens" if len(sizes) > 1 or sizes[0] != 16 else "multiples of 16 tokens"
    if stated is None:
        return own, rule, ("" if own == 16 else f"vLLM's {name} backend pages {pages}; none stated")
    if any(stated % s == 0 for s in sizes):
        return stated, rule, ""
    fallback = next((b for b in valid[1:] if any(stated % s == 0 for s in VLLM_MLA_BACKENDS[b][0])), "none")
    return own, rule, (f"vLLM's {name} backend pages {pages}; scenario said {stated} (vLLM would move to "
                       f"{fallback} for it, which is not priced; 0.16 and earlier forced its own block)")


def block_note(dep) -> str:
    """Why a deployment's plan runs another block size than its scenario's (vLLM's MLA backend,
    vllm_mla_block; a hybrid model's attention block, hybrid_block_size), "" where it does not."""
    return next((n for k, n in dep.plan.provenance if k == "block_size"), "")


# ----------------------------------------------------------------------------- stages: the graph walk


def _attention_decode_coefs(kind: str, scope: _Scope) -> tuple:
    """(decode floor, decode rate, notes): the per-kind pair where a per-kind rate exists, its
    floor inheriting the part-wide floor; else the part-wide pair. None rate: the KV bytes are
    charged at HBM bandwidth instead, with no floor.

    KNOWN DIVERGENCE [indexer-without-rate]: that fallback also prices a secondary
    attention (an indexer's scan) with no rate, as the spec prices the scan in both phases;
    the reference skips a secondary attention whose kind has no decode rate."""
    if kind != "gqa" and scope.has(f"attention_decode_rate_{kind}"):
        rate = scope.use(f"attention_decode_rate_{kind}")
        floor = scope.use(f"attention_decode_floor_{kind}") if scope.has(f"attention_decode_floor_{kind}") \
            else scope.use("attention_decode_floor")
        return floor, rate, ()
    rate = scope.use("attention_decode_rate") if scope.has("attention_decode_rate") else None
    floor = scope.use("attention_decode_floor") if rate else None
    if rate is None:
        return floor, rate, ((f"attention decode ({kind})", "no measured rate: KV read at HBM bandwidth"),)
    return floor, rate, ()


def _measured_form(scope: _Scope, prefix: str, suffix: str = ""):
    """A model's measured prefill form (registry/EXTENSIONS.md): <prefix>_<term><suffix>
    for the four terms, or None unless every one is admitted."""
    names = [f"{prefix}_{t}{suffix}" for t in ("floor", "per_request", "per_token", "rate")]
    if all(n in scope.entries for n in names):
        return tuple(scope.use(n) for n in names)
    return None


def _gemm(node, kind_index: int, phase: int, replicated: bool, fmt: str, hidden: int,
          classes: _RateClasses) -> GemmRow:
    """A dense GEMM node's row: 2 n k FLOPs per token, at its weight format's rate class."""
    n_, k_ = node["n"], node["k"]
    return GemmRow(kind_index, n_, k_, 2.0 * n_ * k_, hidden > 0 and k_ == hidden and n_ != hidden,
                   phase, classes.for_format(fmt), replicated, True)


def _fuses(open_row: GemmRow, row: GemmRow) -> bool:
    """Whether a GEMM fuses into the GEMM run just before it: both read the hidden state and
    shard n, with one k, phase, rate class and replication."""
    return bool(row.shard_n and open_row.shard_n and open_row.k == row.k and open_row.phase == row.phase
                and open_row.cls == row.cls and open_row.replicated == row.replicated)


def _grouped_gemm(node, kind_index: int, phase: int, replicated: bool, div: int, fmt: str,
                  classes: _RateClasses) -> _ExpertNode:
    """A GroupedGEMM node: its routed experts (6 n k FLOPs and 3 n k weights each, at the
    grouped rate class of its format) and its shared experts, a dense term without a shape.
    ``gated: false`` (registry/EXTENSIONS.md): ungated experts (an up and a down matrix, as
    Nemotron-H's relu2 experts run), 4 n k FLOPs and 2 n k weights each, routed and shared."""
    # COVERAGE LIMIT [prefill-only-experts]: phase: prefill on a GroupedGEMM gates its
    # launches and shared experts; its routed experts are priced in every step
    n_, k_ = node["n"], node["k"]
    mats = 3.0 if node.get("gated", True) else 2.0     # gate, up and down matrices; or up and down
    w = DTYPE_BYTES[fmt]
    cls = classes.for_format(fmt, grouped=True)
    shared = node.get("shared_experts", 0) or 0
    if shared <= 0:
        return _ExpertNode(2.0 * mats * n_ * k_, mats * n_ * k_ * w, node["top_k"], cls, 0.0, None)
    inner = node.get("shared_intermediate_size") or n_
    sbytes = mats * inner * k_ * shared * w
    row = GemmRow(kind_index, 0, 0, 2.0 * mats * inner * k_ * shared, False, phase, classes.for_format(fmt),
                  replicated, False)
    return _ExpertNode(2.0 * mats * n_ * k_, mats * n_ * k_ * w, node["top_k"], cls, sbytes / div, row)


def _prefill_pair_dim(node) -> float:
    """The head dimension d of prefill attention's FLOPs per (query, key) pair and head, 4 d (the
    pair law's 4 = QK^T and PV, 2 FLOPs each): d_h; for an mla layer that states its prefill head
    dimensions, (qk_nope + qk_rope + v) / 2, because the engines run MLA prefill uncompressed
    (vLLM's MLACommonImpl._forward_prefill: multi-head attention with QK head dimension
    qk_nope + qk_rope and V head dimension v, 192 and 128 for DeepSeek-V3) and decode in the
    latent (d_h = kv_lora_rank + qk_rope)."""
    if node["kind"] == "mla" and "qk_nope_head_dim" in node:
        # KNOWN DIVERGENCE [mla-prefill-uncompressed]: the reference prices MLA prefill pairs at the
        # latent d_h (576 for DeepSeek-V3), 3.6 times the FLOPs of the uncompressed form the engines run
        return (node["qk_nope_head_dim"] + node["qk_rope_head_dim"] + node["v_head_dim"]) / 2.0
    return float(node["d_h"])


def _attention(node, kind_index: int, phase: int, div: int, ctx: _WalkContext) -> tuple:
    """(row, notes) of an attention node: the KV bytes one rank reads per context token, the
    FLOPs per (query, key) pair, and the decode and prefill coefficients it is priced by."""
    secondary = (node.get("role", "") or "") != ""
    akind = node["kind"]
    latent = akind in ("mla", "sparse_mla")
    if secondary:
        # KNOWN DIVERGENCE [indexer-keys-only]: an indexer caches keys only, n_kv x d_h
        # at the cache width, not divided by tp; the reference scales the primary's
        # per-token bytes (tensors, tp, the DS-MLA cell) by n_kv d_h / primary n_kv d_h
        per_token = node["n_kv"] * node["d_h"] * ctx.cache_bytes
    else:
        # KNOWN DIVERGENCE [kv-per-layer]: each layer reads its own KV bytes per token;
        # the reference reads the whole-model average kvBytesPerToken / kvLayers
        tensors = 1 if latent else 2
        # a replicated attention keeps every KV head on every rank
        per_token = tensors * max(1, node["n_kv"] // div) * node["d_h"] * ctx.cache_bytes
        if latent and ctx.layout in DS_MLA_CELL:
            per_token = DS_MLA_CELL[ctx.layout]
    floor, rate, notes = _attention_decode_coefs(akind, ctx.scope)
    pair_dim = _prefill_pair_dim(node)
    row = AttentionRow(kind_index, phase, secondary, akind, float(node.get("window", 0) or 0),
                       float(node.get("index_topk", 0) or 0), float(node.get("compress_ratio", 0) or 0),
                       akind == "sparse_mla", latent, per_token,
                       node["n_q"] * pair_dim / div * (0.5 if secondary else 1.0), floor, rate,
                       _measured_form(ctx.scope, "indexer_prefill") if secondary
                       else _measured_form(ctx.scope, "attention_prefill", f"_{akind}"))
    return row, notes


def _recurrent(node, kind_index: int, phase: int, div: int, scope: _Scope,
               classes: _RateClasses) -> tuple:
    """(row, notes) of a recurrent mixer: its measured decode and prefill forms where admitted,
    and the chunked scan's FLOPs per token, intra-chunk attention (4 C d) plus the state's
    read and update (4 d state), at the BF16 rate class.

    KNOWN DIVERGENCE [recurrent-rate-geometry]: a GDN or KDA decode rate is read as measured at
    the heads the registry's entries were fitted at, the whole model's on one GPU
    (FITTED_DECODE_HEADS), and a kernel's time scales with the heads it runs (the entries'
    rationale), so a rank running h of them charges each decode token h / fitted of the rate's
    time (``dec_token_scale``); the reference charges the rate's time at every width (Qwen3.5-397B
    fp8 on 8 B200, 256 decodes: 16.2 of a 31.9 ms step, 2.0 of 17.9 now). A set of one's own states
    its rates at that geometry too (a fit through the plan keeps it). mamba2's rate (a convolution
    alone, its geometry unstated) is charged as stated."""
    rk = node["recurrent_kind"]
    heads = node["n_heads"] / div
    d = node.get("d_h") or node["state_size"]
    state = node["state_size"]
    dec_f, dec_r = f"recurrent_decode_floor_{rk}", f"recurrent_decode_rate_{rk}"
    pre_f, pre_r = f"recurrent_prefill_floor_{rk}", f"recurrent_prefill_rate_{rk}"
    has_dec = scope.has(dec_f) and scope.has(dec_r)
    has_pre = scope.has(pre_f) and scope.has(pre_r)
    notes = () if has_dec else ((f"recurrent {rk}", "no decode floor/rate: decode term is 0"),)
    row = RecurrentRow(kind_index, phase, (scope.use(dec_f), scope.use(dec_r)) if has_dec else None,
                       (scope.use(pre_f), scope.use(pre_r)) if has_pre else None,
                       heads * (4.0 * SCAN_CHUNK * d + 4.0 * d * state), classes.for_format("bf16"),
                       _decode_token_scale(rk, heads) if has_dec else 1.0)
    return row, notes


# The heads the registry's recurrent decode rates were fitted at: the whole model's, one GPU
# running them all (the entries' primary sources in the reference registry's
# cost-model-recurrent.yaml: AISimulate gdn_perf "num_k_heads=16, num_v_heads=64, model
# Qwen/Qwen3.5-397B-A17B", kda_perf "num_k_heads=96, model moonshotai/Kimi-K3"), where the rate
# scales inversely with the heads (the entries' rationale: "the rate is inversely proportional to
# num_v_heads across the sweep"). A graph's GDN node counts value heads (n_heads), a KDA node its heads.
FITTED_DECODE_HEADS = {"gdn": 64.0, "kda": 96.0}


def _decode_token_scale(kind: str, rank_heads: float) -> float:
    """A decode token's time as a share of the rate's: rank heads / fitted heads for GDN and KDA
    (FITTED_DECODE_HEADS), 1 for any other kind."""
    fitted = FITTED_DECODE_HEADS.get(kind)
    return 1.0 if fitted is None else float(rank_heads) / fitted


def _hyper_connection(node, kind_index: int, phase: int, fmt: str, scope: _Scope,
                      classes: _RateClasses) -> HyperRow:
    """A hyper-connection half's row: its bytes per token, its mixing GEMM's FLOPs (at its
    format's rate class) and its measured form where admitted."""
    half = node["half"]
    form = (f"mhc_floor_{half}", f"mhc_rate_{half}")
    has = all(n in scope.entries for n in form)
    mix = 2.0 * (node.get("mix_n", 0) or 0) * (node.get("mix_k", 0) or 0)
    return HyperRow(kind_index, phase, node["bytes_per_token"], mix,
                    tuple(scope.use(n) for n in form) if has else None, classes.for_format(fmt))


def _walk_kind(kind_index: int, kid: str, count: int, is_drafter: bool, ctx: _WalkContext) -> _KindWalk:
    """One layer kind, node by node over the nodes its emit conditions keep: per phase the
    weight bytes a rank reads, the elementwise bytes per token and the kernel launches; the
    GEMM rows (a run of GEMMs that fuse, fused); one row per attention, recurrent mixer and
    hyper-connection; the collectives it launches; its piecewise capture breaks."""
    tp, hidden = ctx.tp, ctx.graph.hidden_size
    weight, elementwise, kernels = [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]
    dense_mem = shared_mem = expert_flops = expert_bytes = expert_mem = 0.0
    moe, top_k, expert_class, splits = False, 0, 0, 0
    launches, gemms, attentions, recurrents, hypers, kv, notes = {}, [], [], [], [], [], []
    fusing = False              # the last GEMM row is open: a GEMM node next may fuse into it
    for node in [n for n in ctx.graph.layer_kinds[kid] if _emits(n, ctx.emit)]:
        op = node["op"]
        phase = 1 if node.get("phase") == "prefill" else 0
        replicated = bool(node.get("replicated", False))
        div = 1 if replicated else tp
        kernels[phase] += KERNELS_PER_OP[op]
        fmt = node.get("weight_dtype", ctx.served)
        if op == "GEMM":
            row = _gemm(node, kind_index, phase, replicated, fmt, hidden, ctx.classes)
            wbytes = node["n"] * node["k"] * DTYPE_BYTES[fmt]
            weight[phase] += wbytes / div
            dense_mem += wbytes * held_fraction(fmt) / div
            if fusing and _fuses(gemms[-1], row):
                gemms[-1] = gemms[-1]._replace(n=gemms[-1].n + row.n, flops=gemms[-1].flops + row.flops)
            else:
                gemms.append(row)
        elif op == "GroupedGEMM":
            e = _grouped_gemm(node, kind_index, phase, replicated, div, fmt, ctx.classes)
            moe, top_k, expert_class = True, e.top_k, e.cls
            expert_flops += e.flops
            expert_bytes += e.bytes
            expert_mem += e.bytes * held_fraction(fmt)
            if e.shared is not None:
                weight[phase] += e.shared_bytes
                shared_mem += e.shared_bytes * held_fraction(fmt)
                gemms.append(e.shared)
        elif op in ("Attention", "RecurrentUpdate"):
            # KNOWN DIVERGENCE [pieces-per-mixer]: one piece per attention node (an indexer
            # too, whatever the layer's kind) and per recurrent mixer, as the spec says; the
            # reference counts every layer plus one per sparse-MLA layer with an indexer
            splits += 1
            if op == "Attention":
                row, row_notes = _attention(node, kind_index, phase, div, ctx)
                attentions.append(row)
                if not row.secondary and not is_drafter:
                    kv.append((row.bytes_per_token * count, row.window))
            else:
                row, row_notes = _recurrent(node, kind_index, phase, div, ctx.scope, ctx.classes)
                recurrents.append(row)
            notes += row_notes
        elif op == "Elementwise":
            elementwise[phase] += (node.get("bytes_per_token") or 4.0 * hidden) / div
        elif op == "HyperConnection":
            hypers.append(_hyper_connection(node, kind_index, phase, fmt, ctx.scope, ctx.classes))
        else:  # collectives
            key = (_collective_key(node), phase)
            launches[key] = launches.get(key, 0) + 1
        fusing = op == "GEMM"
    if ctx.graph.capture_breaks.get(kid):
        splits = ctx.graph.capture_breaks[kid]
    kind = LayerKind(kid, float(count), is_drafter, tuple(weight), tuple(elementwise), tuple(kernels),
                     launches, splits, dense_mem, shared_mem, moe, expert_flops, expert_bytes,
                     expert_class, top_k, expert_mem)
    return _KindWalk(kind, tuple(gemms), tuple(attentions), tuple(recurrents), tuple(hypers),
                     tuple(kv), tuple(notes))


def _graph_walk(stack: LayerStack, ctx: _WalkContext) -> Walk:
    """Every layer kind of the stack walked in order (the target's, then the drafter's); each
    row keeps its kind's index; the KV bytes per token add the target's primary attentions
    up over its layers."""
    walks = [_walk_kind(i, kid, count, drafter, ctx) for i, (kid, count, drafter) in enumerate(stack.kinds)]
    kv_bytes_per_token, windows = 0.0, {}
    for term, window in (t for w in walks for t in w.kv_terms):
        kv_bytes_per_token += term
        if window > 0:
            windows[window] = windows.get(window, 0.0) + term
    return Walk(tuple(w.kind for w in walks), tuple(r for w in walks for r in w.gemms),
                tuple(r for w in walks for r in w.attentions), tuple(r for w in walks for r in w.recurrents),
                tuple(r for w in walks for r in w.hypers), kv_bytes_per_token,
                tuple(n for w in walks for n in w.notes), tuple(sorted(windows.items())))


def _head(graph: ModelGraph, ctx: _WalkContext) -> Head:
    """The head's GEMMs, priced once per step over all T tokens (its norm's bytes are not
    charged); its rate class is its last GEMM's, else the served format's."""
    kernels, flops, weight, cls = 0, 0.0, 0.0, None
    for node in graph.head:
        if not _emits(node, ctx.emit):
            continue
        kernels += KERNELS_PER_OP[node["op"]]
        if node["op"] == "GEMM":
            fmt = node.get("weight_dtype", ctx.served)
            div = 1 if node.get("replicated") else ctx.tp
            flops += 2.0 * node["n"] * node["k"] / div
            weight += node["n"] * node["k"] * DTYPE_BYTES[fmt] / div
            cls = ctx.classes.for_format(fmt)
    if cls is None:
        cls = ctx.classes.for_format(ctx.served)
    return Head(kernels, flops, weight, cls)


# ----------------------------------------------------------------------------- stages: collectives, host, memory


def _collective_key(node) -> tuple:
    """A collective node's class: (op, group: expert for an All2All, else tp, its stated bytes
    per token or None)."""
    return node["op"], "expert" if node["op"] == "All2All" else "tp", node.get("bytes_per_token")


def _collective_row(op: str, group: str, stated: float | None, widths: Widths, docs: Documents, ratio: float,
                    top_k: int, hidden: int, scope: _Scope, file) -> CollectiveRow:
    """One (op, group, stated bytes) class: its width snapped to a measured one; whether it
    crosses nodes (not within a rack-scale domain; refused without a fabric) and the span that
    costs; its bytes per token: the graph's ``bytes_per_token`` where the node states one (a
    jaxprice extension), else 2 x hidden (bf16 activations, the reference's), times top_k for an
    All2All over a routed backend (it moves top_k copies of each token)."""
    chip_sfx = docs.chip.name.replace("-", "_")
    opname = COLLECTIVE_NAMES[op]
    measured = [n for n in SNAP_WIDTHS
                if all(f"collective_{p}_{opname}_fp16_{n}rank_{chip_sfx}" in scope.entries
                       for p in ("floor", "peak_rate", "transition_rate"))]
    width = {"tp": widths.tp, "expert": widths.moe_group}[group]
    snapped = _snap(width, measured, op=opname, chip=chip_sfx, file=file)
    gpus_per_node, stride = widths.gpus_per_node, 1
    per_node = max(gpus_per_node // stride, 1) if gpus_per_node > 0 else 0
    crosses = gpus_per_node > 0 and width > per_node
    if crosses and widths.rack_domain and width * stride <= widths.rack:
        crosses = False
    if crosses and docs.network is None:
        refuse(f"a {op} group of {width} ranks crosses nodes but the cluster names no fabric",
               file=file, field="Scenario.cluster.fabric")
    route_bytes = op == "All2All" and widths.routed
    if crosses:
        sp = laws.all2all_span(width, per_node, ratio) if (op == "All2All" and (group != "expert" or widths.routed)) \
            else laws.ring_span(width, per_node, ratio)
    else:
        sp = 1.0
    per_copy = 2.0 * hidden if stated is None else float(stated)
    return CollectiveRow(op, group, width, snapped, bool(crosses), sp,
                         per_copy * (top_k if route_bytes else 1), None)


def _collectives(walk: Walk, widths: Widths, docs: Documents, scope: _Scope, file) -> Collectives:
    """The collective classes (reference-kernel.md section 5): the four always resolved, then
    each (op, group, stated bytes) the walk launches, in order of first launch; every class a layer launches
    reads its floor and rates at its snapped width."""
    keys = list(ALWAYS_RESOLVED)
    # a class the graph states its own bytes for is resolved whether or not this width emits it
    # (as the four above), so deployments of one model at different widths share a structure
    for nodes in docs.graph.layer_kinds.values():
        for n in nodes:
            if n["op"] in COLLECTIVE_NAMES and n.get("bytes_per_token") is not None \
                    and _collective_key(n) not in keys:
                keys.append(_collective_key(n))
    for k in walk.kinds:
        for key, _phase in k.launches:
            if key not in keys:
                keys.append(key)
    intra = docs.chip.nvlink_gbps or 0
    inter = docs.network.internode_gbps if docs.network else 0
    ratio = intra / inter if intra > 0 and inter > 0 else 1.0
    top_k = max((k.top_k for k in walk.kinds), default=1)
    rows = [_collective_row(op, group, stated, widths, docs, ratio, top_k, docs.graph.hidden_size, scope, file)
            for op, group, stated in keys]
    index = {key: i for i, key in enumerate(keys)}
    chip_sfx = docs.chip.name.replace("-", "_")
    for c in sorted({index[key] for k in walk.kinds for key, _phase in k.launches}):
        row = rows[c]
        opname = COLLECTIVE_NAMES[row.op]
        rows[c] = row._replace(names=tuple(
            scope.require(f"collective_{p}_{opname}_fp16_{row.snapped}rank_{chip_sfx}",
                          f"{row.op} over {row.width} ranks")
            for p in ("floor", "transition_rate", "peak_rate")))
    return Collectives(tuple(rows), index)


def _host_graph(walk: Walk, head: Head, scope: _Scope) -> HostGraph:
    """The host coefficients (graph replay per step, eager launch per layer, launch per kernel,
    output token), and the layers, kernels and piecewise segments per step of the target (its
    head's kernels included) and of the drafter."""
    replay = scope.use("host_replay_graph_per_step")
    eager_layer = scope.use("host_launch_eager_per_layer")
    per_kernel = scope.use("host_launch_per_kernel")
    scope.use("host_output_token")
    # per-request host latencies the serving simulation reads (serve.request_latencies); the
    # step kernel does not (inference-sim's kernel interface: admission is "CPU time before a
    # request can be scheduled", completion "lands on end-to-end latency", neither on StepTime)
    for name in ("host_admission_per_request", "host_admission_per_token", "host_completion"):
        scope.use(name)
    target = [k for k in walk.kinds if not k.drafter]
    drafter = [k for k in walk.kinds if k.drafter]
    kernels = tuple(sum(k.kernels[ph] * k.count for k in target) + (head.kernels if ph == 0 else 0)
                    for ph in (0, 1))
    return HostGraph(replay, eager_layer, per_kernel, float(sum(k.count for k in target)), kernels,
                     1 + sum(k.splits * k.count for k in target), float(sum(k.count for k in drafter)),
                     tuple(sum(k.kernels[ph] * k.count for k in drafter) for ph in (0, 1)),
                     1 + sum(k.splits * k.count for k in drafter))


def _weights(walk: Walk, head: Head, graph: ModelGraph, formats: Formats, widths: Widths,
             experts: Experts) -> Weights:
    """Weight bytes one rank holds: each layer's dense and shared weights and its experts (with
    their block scales: ``held_fraction``), the head and the embedding (at the checkpoint's width,
    split over tp), less the redundant experts EPLB adds; the drafter's layers alike.

    KNOWN DIVERGENCE [weight-scales-held]: 4-bit and MX weights are held with their block scales
    (nvfp4 x 1.125, mxfp4 x 1.0625: data-formats.md, dtypes); the reference's memory counts the
    payload only, which overstates the KV cache a 4-bit deployment has room for.

    KNOWN DIVERGENCE [tied-embedding]: a graph whose tie_word_embeddings is true holds the embedding
    once, as the lm_head's weights (vLLM ties the two modules to one tensor); the reference adds the
    embedding beside the head whatever the flag (Gemma-4-26B: 0.185 GB a rank at tp 8)."""
    per_rank, shards = experts.experts_per_rank, experts.expert_shards

    def layers(k):
        return k.count * (k.dense_weight_mem + k.shared_weight_mem +
                          (k.expert_weight_mem * per_rank / shards if k.moe else 0.0))

    target = [k for k in walk.kinds if not k.drafter]
    weights = 0.0
    for k in target:
        weights += layers(k)
    weights += head.weight_bytes
    if not graph.tie_word_embeddings:
        weights += graph.hidden_size * graph.vocab_size * formats.checkpoint_bytes / widths.tp
    eplb_bytes = sum(k.count * k.expert_weight_mem * experts.redundant / max(widths.expert_width, 1) / shards
                     for k in target if k.moe)
    weights -= eplb_bytes
    return Weights(weights, sum(layers(k) for k in walk.kinds if k.drafter))


def _memory(scenario: Scenario, docs: Documents, widths: Widths, stack: LayerStack, experts: Experts,
            kv: KvLayout, mode: str, weights: Weights, kv_bytes_per_token: float, scope: _Scope) -> dict:
    """What one rank holds (reported, not priced): weights, KV bytes per token and the cache
    layout; the activation, cudagraph and communication buffers where measured; and the
    KV-cache tokens its gpu_memory_utilization share of HBM holds beyond every fixed term."""
    eng, graph, chip = scenario.engine, docs.graph, docs.chip
    tp, hidden = widths.tp, graph.hidden_size
    memory = {"weights_bytes": weights.target + weights.drafter, "target_weights_bytes": weights.target,
              "drafter_weights_bytes": weights.drafter, "kv_bytes_per_token": kv_bytes_per_token,
              "cache_layout": kv.layout, "block_size": kv.block}
    snap_tp = max([w for w in SNAP_WIDTHS if w <= min(tp, 8)] or [1])
    act_name = f"activation_buffer_count_{'moe' if experts.experts_max else 'dense'}_{snap_tp}rank"
    if act_name in scope.entries and "activation_scratch_floor_bytes" in scope.entries:
        h_act = max([n["n_q"] * n["d_h"] if n["kind"] not in ("mla", "sparse_mla") else hidden
                     for kk in stack.kind_ids for n in graph.layer_kinds[kk] if n["op"] == "Attention"] or [hidden])
        tokens = int(eng.get("max_num_batched_tokens", 8192))
        memory["activation_bytes"] = max(scope.value(act_name) * tokens * h_act * 2,
                                         scope.value("activation_scratch_floor_bytes"))
    graph_mem = f"cudagraph_capture_bytes_{mode.lower()}"
    if graph_mem in scope.entries:
        memory["cudagraph_bytes"] = scope.value(graph_mem)
    # CommBuffers (reference-kernel.md A.1): engine_workspace_bytes, plus the NCCL communicators of
    # the widest declared width <= tp (else the narrowest declared) when any group is wider than 1
    comm = float(scope.value("engine_workspace_bytes", 0.0))
    nccl = [w for w in SNAP_WIDTHS if f"nccl_communicator_bytes_{w}rank" in scope.entries]
    if max(tp, widths.dp, widths.expert_width) > 1 and nccl:
        comm += scope.value(f"nccl_communicator_bytes_{max([w for w in nccl if w <= tp] or [min(nccl)])}rank")
    memory["comm_buffer_bytes"] = comm
    # KV-cache tokens one rank holds: its share of HBM (gpu_memory_utilization) less every fixed term
    fixed = sum(memory.get(k, 0.0) for k in ("weights_bytes", "activation_bytes", "cudagraph_bytes",
                                             "comm_buffer_bytes"))
    budget = chip.memory_gib * 2 ** 30 * float(eng.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
    memory["kv_capacity_tokens"] = (max(budget - fixed, 0.0) / kv_bytes_per_token if kv_bytes_per_token > 0
                                    else math.inf)
    return memory


def _recurrent_layer_bytes(graph: ModelGraph, stack: LayerStack, mamba_cache: str, tp: int) -> list:
    """(layer count, one layer's recurrent state per request on one rank, bytes) of each
    RecurrentUpdate node of the target's stack (laws.recurrent_state_bytes; at its state_dtype,
    else the engine's mamba_cache_dtype, auto = fp32; over tp: vLLM shards a mixer's heads and
    channels over the tensor-parallel group)."""
    out = []
    for kid, count, drafter in stack.kinds:
        if drafter:
            continue
        for n in graph.layer_kinds[kid]:
            if n["op"] != "RecurrentUpdate":
                continue
            width = DTYPE_BYTES.get(n.get("state_dtype") or "", MAMBA_CACHE_DTYPES[mamba_cache])
            out.append((count, laws.recurrent_state_bytes(
                n["recurrent_kind"], n["n_heads"], n.get("d_h") or 0, n["state_size"], n.get("n_groups") or 1,
                n.get("conv_kernel") or 1, n.get("intermediate_size") or 0, width) / max(int(tp), 1)))
    return out


HYBRID_BLOCK_ALIGN = 16     # vLLM's attention block alignment for hybrid models (see hybrid_block_size)


def hybrid_block_size(block: int, state_page: float, attention_token_page: float, *,
                      align: int = HYBRID_BLOCK_ALIGN) -> int:
    """The attention block size vLLM runs a model with recurrent layers at  [tokens].

    vLLM pages a recurrent layer's state and an attention layer's KV blocks out of one pool, so
    the attention page (block x one layer's KV bytes per token) must hold one layer's state:
    need = 16 ceil(state_page / (16 attention_token_page)), and a block_size below it (or none
    stated) is raised to it (vllm/model_executor/models/config.py,
    HybridAttentionMambaModelConfig.verify_and_update_config); a request's attention KV then
    takes whole blocks of that many tokens. ``block`` where there is no recurrent state.
    ``align``: the grain in place of 16 (_hybrid_block: an MLA backend's own block)."""
    if state_page <= 0.0 or attention_token_page <= 0.0:
        return int(block)
    need = align * math.ceil(state_page / (align * attention_token_page))
    return max(int(block), int(need))


def _hybrid_block(kv: KvLayout, walk: Walk, layers: list) -> tuple[int, int, tuple]:
    """(block size, the hybrid minimum (0: no recurrent layer), provenance notes):
    ``hybrid_block_size`` from the largest recurrent layer's state and the target's first
    primary attention's KV bytes per token (vLLM takes one attention geometry, the model's).
    vLLM's alone: SGLang and TensorRT-LLM hold recurrent states in a pool of their own beside
    the KV cache's pages (SGLang's MambaPool, TensorRT-LLM's Mamba cache manager), so a
    deployment of another engine (``serving_engine``) passes no layers and keeps its block."""
    pages = [r.bytes_per_token for r in walk.attentions if not r.secondary and not walk.kinds[r.kind].drafter]
    state = max((b for _c, b in layers), default=0.0)
    # under vLLM's MLA block rule (kv.block_rule) the grain is the backend's block: vLLM >= 0.17 aligns
    # to max(the backend's smallest kernel block, the block) (vllm/platforms/interface.py
    # _align_hybrid_block_size; before, 64 or 128 for MLA), so a raised block stays one its kernels
    # page (Kimi-K3 on B200: 704, not 688, which FLASHINFER_MLA's 32 and 64 do not divide)
    grain = max(HYBRID_BLOCK_ALIGN, kv.block) if kv.block_rule else HYBRID_BLOCK_ALIGN
    minimum = hybrid_block_size(1, state, pages[0] if pages else 0.0, align=grain) if state > 0 else 0
    block = max(kv.block, minimum)
    if block == kv.block:
        return block, minimum, ()
    # KNOWN DIVERGENCE [hybrid-block-padding]: vLLM also pads each recurrent layer's state page
    # up to the attention page (under 16 tokens of one layer's KV); the state is held unpadded
    return block, minimum, (("block_size", f"raised from {kv.block} to {block} tokens: vLLM's attention block for a model "
                                  f"with recurrent layers holds one layer's state ({state / 2 ** 20:.2f} MiB per "
                                  "rank), models/config.py HybridAttentionMambaModelConfig"),)


# ----------------------------------------------------------------------------- stages: the plan


def _column(rows, field: str, dtype=None) -> np.ndarray:
    return np.array([getattr(r, field) for r in rows], dtype=dtype)


def _kind_arrays(walk: Walk, colls: Collectives, experts: Experts, drafter: Drafter | None) -> dict:
    """The plan's per-kind arrays: layer counts (a drafter's scaled by its passes), weight and
    elementwise bytes per phase, the experts' FLOPs and bytes per rank, collective launches
    [phase, kind, class], and each collective class's bytes per token and placement."""
    kinds, rows = walk.kinds, colls.rows
    K, C = len(kinds), len(rows)
    launches = np.zeros((2, K, C))
    for i, k in enumerate(kinds):
        for (key, ph), n in k.launches.items():
            launches[ph, i, colls.index[key]] = n
    return {
        "count": _column(kinds, "count"),
        "drafter_count_scale": np.array([float(drafter.passes) if (k.drafter and drafter is not None) else 1.0
                                         for k in kinds]),
        "weight_bytes": np.array([k.weight_bytes for k in kinds]).T.reshape(2, K),
        "elementwise_bytes": np.array([k.elementwise for k in kinds]).T.reshape(2, K),
        # KNOWN DIVERGENCE [routed-flops-not-over-tp]: routed FLOPs are not divided by tp (each
        # rank is charged whole experts' arithmetic), the reference's deliberate over-charge, kept
        "expert_flops": np.array([k.top_k * experts.local_share * k.expert_flops / experts.dp_slice for k in kinds]),
        "expert_bytes": np.array([k.expert_bytes / experts.expert_shards for k in kinds]),
        "expert_class": _column(kinds, "expert_class", np.int32),
        "expert_topk": np.array([float(k.top_k) for k in kinds]),
        "launches": launches,
        "coll_bytes_per_token": np.array([r.bytes_per_token * r.span for r in rows]),
        "coll_nic": _column(rows, "nic", bool),
    }


def _row_arrays(walk: Walk, tp: int, prefill: PrefillAttention, chip: Chip) -> dict:
    """The plan's per-row arrays: GEMMs (FLOPs, n and k per rank), attentions, recurrent mixers
    and hyper-connections, each row naming its kind; and the one-launch correction."""
    g, a, r, h = walk.gemms, walk.attentions, walk.recurrents, walk.hypers
    four_native = (chip.nvfp4_tflops or 0) > 0
    arrays = {
        "gemm_kind": _column(g, "kind", np.int32), "gemm_class": _column(g, "cls", np.int32),
        "gemm_phase": _column(g, "phase", np.int32),
        "gemm_flops": np.array([x.flops / (1 if x.replicated else tp) for x in g]),
        "gemm_n": np.array([(x.n / tp if x.shard_n and not x.replicated else x.n) if x.shape else 0.0 for x in g]),
        "gemm_k": np.array([(x.k if (x.shard_n or x.replicated) else x.k / tp) if x.shape else 0.0 for x in g]),
    }
    arrays.update({f"attn_{f}": _column(a, f, float) for f in ("window", "topk", "compress", "bytes_per_token",
                                                                "flops_per_pair")})
    arrays.update({f"attn_{f}": _column(a, f, np.int32) for f in ("kind", "phase")})
    arrays.update({f"attn_{f}": _column(a, f, bool) for f in ("sparse", "secondary", "latent")})
    arrays.update({"rec_kind": _column(r, "kind", np.int32), "rec_phase": _column(r, "phase", np.int32),
                   "rec_scan_flops": _column(r, "scan_flops_per_token"),
                   "rec_dec_scale": _column(r, "dec_token_scale"),
                   "rec_scan_class": _column(r, "scan_class", np.int32)})
    arrays.update({"mhc_kind": _column(h, "kind", np.int32), "mhc_phase": _column(h, "phase", np.int32),
                   "mhc_bytes_per_token": _column(h, "bytes_per_token"), "mhc_mix_flops": _column(h, "mix_flops"),
                   "mhc_mix_class": _column(h, "mix_class", np.int32)})
    # the one-launch correction (FlashAttention serves a mixed non-latent batch in one launch)
    arrays["attn_one_launch"] = np.array([bool((not x.latent) and not x.secondary and not four_native
                                               and x.dec_rate and prefill.scale) for x in a], dtype=bool)
    return arrays


def _prefill_attention(scope: _Scope) -> PrefillAttention:
    """The part-wide prefill attention coefficients, where admitted."""
    # KNOWN DIVERGENCE [prefill-floor-without-scale]: the measured prefill floor is charged even
    # without attention_prefill_work_scale; the reference charges neither then
    floor = scope.use("attention_prefill_floor") if scope.has("attention_prefill_floor") else None
    scale = scope.use("attention_prefill_work_scale") if scope.has("attention_prefill_work_scale") else None
    return PrefillAttention(floor, scale)


def _coefficient_roles(walk: Walk, colls: Collectives, experts: Experts, hostg: HostGraph,
                       prefill: PrefillAttention, classes: _RateClasses) -> dict:
    """Each coefficient role the kernel reads, by name (None: the term is absent)."""
    a = walk.attentions
    return {
        "hbm_derate": "hbm_derate", "moe_imbalance": experts.imbalance,
        "classes": tuple(tuple(sorted(r.items())) for r in classes.roles),
        "attn_dec": tuple((r.dec_floor, r.dec_rate) for r in a),
        "attn_pre_form": tuple(r.pre_form for r in a),
        "attn_pre_floor": prefill.floor, "attn_pre_scale": prefill.scale,
        "rec_dec": tuple(r.dec for r in walk.recurrents), "rec_pre": tuple(r.pre for r in walk.recurrents),
        "mhc_form": tuple(r.form for r in walk.hypers),
        "coll": tuple(r.names for r in colls.rows),
        "replay": hostg.replay, "eager_layer": hostg.eager_layer, "per_kernel": hostg.per_kernel,
    }


def _plan_scalars(docs: Documents, widths: Widths, experts: Experts, speculation: Speculation,
                  host: HostModes, head: Head, hostg: HostGraph, walk: Walk, bf16_class: int,
                  n_classes: int) -> dict:
    """The plan's scalars: widths, peaks, expert counts, the head, host counts and modes, the
    drafter's terms, and the rate classes' count."""
    drafter = speculation.drafter
    return {
        "tp": widths.tp, "dp": widths.dp, "expert_width": widths.expert_width, "moe_group": widths.moe_group,
        "funnel": float(experts.funnel), "hidden": docs.graph.hidden_size,
        "hbm_peak_bytes": docs.chip.hbm_tbs * 1e12,
        "experts_total": float(experts.experts_total), "experts_per_rank": float(experts.experts_per_rank),
        # KNOWN DIVERGENCE [prefill-attention-bf16]: prefill attention, the indexer scan and the
        # chunked recurrent scan compute at the BF16 peak and ramp (activations are 16-bit); the
        # reference prices prefill attention at the served format's peak and ramp
        "bf16_class": bf16_class, "head_class": head.cls,
        "head_flops": head.flops, "head_weight_bytes": head.weight_bytes,
        "total_layers": hostg.total_layers, "kernels": float(hostg.kernels[0]),
        "kernels_prefill": float(hostg.kernels[1]), "segments": float(hostg.segments),
        "decode_mode": HOST_MODES.index(host.decode_mode), "other_mode": HOST_MODES.index(host.other_mode),
        "capture_tokens": float(host.capture_tokens), "uniform_width": float(speculation.uniform_width),
        "drafter": drafter is not None, "drafter_parallel_block": bool(drafter and drafter.parallel_block),
        "drafter_passes": float(drafter.passes) if drafter else 0.0,
        "drafter_layers": hostg.drafter_layers, "drafter_kernels": float(hostg.drafter_kernels[0]),
        "drafter_kernels_prefill": float(hostg.drafter_kernels[1]),
        "drafter_segments": float(hostg.drafter_segments), "drafter_width": float(max(speculation.num_spec, 1)),
        "has_moe": any(k.moe for k in walk.kinds), "n_classes": n_classes,
    }


def _resolution(widths: Widths, formats: Formats, kv: KvLayout, host: HostModes, speculation: Speculation,
                classes: _RateClasses, colls: Collectives, hostg: HostGraph) -> dict:
    """What was decided, for people (Deployment.resolution)."""
    return {"tp": widths.tp, "dp": widths.dp, "ep": widths.expert_width, "moe_group": widths.moe_group,
            "served_dtype": formats.served, "cache_dtype": formats.cache, "cache_layout": kv.layout,
            "nodes_spanned": widths.nodes_spanned, "cudagraph_mode": host.mode,
            "capture_tokens": host.capture_tokens, "max_num_seqs": host.max_seqs,
            "rate_classes": [(k_[0], k_[1], p) for k_, p in zip(classes.keys, classes.peaks)],
            "collectives": [r._asdict() for r in colls.rows],
            "decode_threshold": speculation.uniform_width, "sp_moe": widths.sp_moe,
            "routed_all2all": widths.routed, "kernels_per_step": hostg.kernels[0],
            "piecewise_segments": hostg.segments, "total_layers": hostg.total_layers}


def resolve(scenario: Scenario, registry: Registry | None = None, *, extra_sets=()) -> Deployment:
    """Resolve one deployment into a Plan and its Coefficients, stage by stage (see the module
    docstring); each stage refuses what it cannot resolve before a later one runs."""
    if not isinstance(scenario, Scenario):
        refuse("needs a Scenario (load_scenario(path)); load_deployment(name or path) reads and resolves one",
               field="scenario", value=scenario if scenario is None or isinstance(scenario, (str, int)) else
               type(scenario).__name__, has_value=True)
    check_registry(registry)
    if not isinstance(extra_sets, (list, tuple)):
        refuse("must be a list of coefficient sets (load_coefficient_set(path))", field="extra_sets",
               value=type(extra_sets).__name__)
    reg = registry or Registry()
    _check_coverage(scenario)
    docs = _documents(scenario, reg)
    _check_context(scenario, docs.graph)
    widths = _widths(scenario, docs.chip)
    scope = _coefficients_in_scope(scenario, reg, extra_sets, docs, widths)
    formats = _served_formats(scenario, docs.graph)
    speculation = _speculation(scenario, docs.graph)
    host = _host_modes(scenario, docs.chip, speculation.uniform_width)
    stack = _layer_stack(docs.graph, speculation.drafter)
    experts = _experts(scenario, docs.graph, widths, scope)
    kv = _kv_layout(scenario, docs, stack, formats.cache)
    classes = _RateClasses(docs.chip, scope, scenario.path)
    ctx = _WalkContext(docs.graph, widths.tp, {"tp": widths.tp, "moe_group": widths.moe_group,
                                               "sp_moe": widths.sp_moe},
                       formats.served, formats.cache_bytes, kv.layout, scope, classes)
    walk = _graph_walk(stack, ctx)
    head = _head(docs.graph, ctx)
    colls = _collectives(walk, widths, docs, scope, scenario.path)
    hostg = _host_graph(walk, head, scope)
    weights = _weights(walk, head, docs.graph, formats, widths, experts)
    memory = _memory(scenario, docs, widths, stack, experts, kv, host.mode, weights,
                     walk.kv_bytes_per_token, scope)
    # the share of those bytes in sliding-window layers, by window (reported; the serving layer
    # sizes its KV cache by it: serve.windowed_kv_capacity)
    memory["kv_window_bytes_per_token"] = walk.kv_windows
    # one request's recurrent state on this rank (reported; the serving layer holds it beside the
    # request's KV blocks: serve.windowed_kv_capacity)
    layers = _recurrent_layer_bytes(docs.graph, stack, formats.mamba_cache, widths.tp)
    memory["recurrent_state_bytes_per_request"] = sum(count * b for count, b in layers)   # 0: none
    memory["block_size"], memory["hybrid_block_minimum"], block_notes = _hybrid_block(
        kv, walk, layers if serving_engine(scenario) == "vllm" else [])
    # vLLM's MLA block rule (vllm_mla_block): the serving layer applies it to an engine= block too
    memory["vllm_block_rule"] = kv.block_rule
    block_notes = block_notes or ((("block_size", kv.block_note),) if kv.block_note else ())
    prefill = _prefill_attention(scope)
    # the BF16 class (prefill attention, scans) must exist before the class tables are taken
    bf16_class = classes.for_format("bf16")
    arrays = {**_kind_arrays(walk, colls, experts, speculation.drafter),
              **_row_arrays(walk, widths.tp, prefill, docs.chip), "class_peak": np.array(classes.peaks)}
    coef = _coefficient_roles(walk, colls, experts, hostg, prefill, classes)
    scalars = _plan_scalars(docs, widths, experts, speculation, host, head, hostg, walk, bf16_class,
                            len(classes.peaks))
    plan = Plan(name=scenario.name, arrays=arrays, scalars=scalars, coef=coef, memory=memory,
                provenance=host.notes + walk.notes + block_notes,
                layer_kind_names=tuple(("drafter:" if k.drafter else "") + k.id for k in walk.kinds))
    return Deployment(scenario=scenario, graph=docs.graph, chip=docs.chip, plan=plan,
                      coefficients=scope.vector(),
                      resolution=_resolution(widths, formats, kv, host, speculation, classes, colls, hostg))


def testdata_root() -> Path:
    return Path(__file__).resolve().parents[2] / "testdata"


def bundled_scenarios() -> list:
    """Names of the bundled scenarios (testdata/aisimulate/*.yaml), sorted."""
    return sorted(p.stem for p in (testdata_root() / "aisimulate").glob("*.yaml"))


def scenario_path(name_or_path) -> Path:
    """A scenario file: a path as given, or a bundled scenario's name (testdata/aisimulate/<name>.yaml).
    An unknown name is refused with the nearest bundled names."""
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path).strip():
        # 5 or None was looked up as a file named '5'; '' was the working folder, returned as the file
        refuse("needs a bundled scenario name or a scenario file path (a non-empty str or a path)", field="scenario",
               value=name_or_path if isinstance(name_or_path, str) else shown(name_or_path), has_value=True)
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


def load_deployment(path, registry=None, *, pool_index: int | None = None, registry_roots=None,
                    extra_coefficient_files=()) -> Deployment:
    """Read a scenario file and resolve it (the usual entry point).

    registry: a Registry; or registry_roots: folders to search (the project's registry, or a
    public catalog/registry checkout). extra_coefficient_files: coefficient sets applied after
    the scenario's own (e.g. a fitted set), overriding by name. pool_index: the Deployment
    pool to price; required when the Deployment has more than one.
    """
    import os
    from .formats import load_coefficient_set
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str):
        refuse("needs a bundled scenario name or a scenario file's path (a str or a path)", field="path",
               value=path if isinstance(path, (bytes, int, float)) or path is None else type(path).__name__,
               has_value=True)
    if not text.strip():            # "" would be read as the current folder (".: is a directory")
        refuse("an empty name; give a bundled scenario name or a scenario file", field="path", value=path,
               has_value=True)
    check_registry(registry, "; registry_roots= takes folders")
    if registry is not None and registry_roots:
        refuse("give registry= or registry_roots=, not both (registry_roots would be ignored)",
               field="registry_roots", value=registry_roots, has_value=True)
    files = path_list(extra_coefficient_files, "extra_coefficient_files", none=(),   # one str: one file
                      what="a coefficient-set file path")
    if registry is None:
        registry = Registry(registry_roots) if registry_roots else Registry()
    scenario = load_scenario(scenario_path(path), pool_index)
    extra = [load_coefficient_set(f) for f in files]
    return resolve(scenario, registry, extra_sets=extra)
