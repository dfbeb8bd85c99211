"""Layouts and their deployments, for the size search (issue 14): a parallel layout and engine
settings (``Layout``), the candidate space of a model on a GPU count (``candidate_space``), the
weight formats a chip and checkpoint allow (``weight_formats``), a deployment built from a model,
a chip and a layout with NO scenario file (``base_scenario``, ``build_scenario``: a
``formats.Scenario`` record with the settings the bundled vLLM scenarios use, resolved by
``resolve.resolve``), and the fit check vLLM makes at start-up (``fits``: the weights,
activations, CUDA graphs and communication buffers must leave KV cache for one maximum-length
request). ``build_candidates`` resolves every layout and says what became of it.

Engines (``ENGINES``): ``vllm`` (the default) and ``sglang``. An SGLang layout is the same
parallel layout (tp, dp, expert parallelism, weight format) with SGLang's two engine limits on
the same axes, ``max_running_requests`` (``Layout.max_num_seqs``) and ``chunked_prefill_size``
(``Layout.max_num_batched_tokens``), its CUDA-graph mode fixed at ``SGLANG_GRAPH_MODE`` and its
scenario's engine block naming ``scheduler: sglang``, which the serving simulation follows
(serve.py: reservation to completion, prefill-first steps). The registry scopes no coefficient
by engine (its scope keys: hardware, model, tp, ep, nodes_spanned), so an SGLang candidate
resolves to the coefficients of the vLLM one and of a bundled ``*-sglang-*`` scenario of that
model, chip and widths."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

from .errors import JaxpriceError, refuse
from .formats import DTYPE_BYTES, ModelGraph, Registry, Scenario, load_model_graph
from .resolve import Deployment, resolve

COEFFICIENT_SETS = ("cost-model-primitives", "cost-model-collectives", "cost-model-host-overheads",
                    "cost-model-attention", "cost-model-recurrent", "cost-model-memory")
WIDTHS = (1, 2, 4, 8, 16)
DEFAULT_MAX_NUM_SEQS = (256, 512, 1024)
DEFAULT_BATCHED_TOKENS = (4096, 8192, 16384)
DEFAULT_GRAPH_MODES = ("PIECEWISE", "FULL_AND_PIECEWISE")
ENGINES = ("vllm", "sglang")
# SGLang captures CUDA graphs of decode batches (up to --cuda-graph-max-bs) and runs extend
# (prefill) batches eagerly: vLLM's FULL_DECODE_ONLY, whose prefill steps the kernel prices at
# the eager launch cost.
# COVERAGE LIMIT [sglang-size]: an SGLang engine is priced and fitted as the vLLM engine of the
# same layout but for its scheduler (serve.py) and graph mode: SGLang's piecewise CUDA graphs of
# extend batches (--enable-piecewise-cuda-graph; on by default in some later versions) and
# --disable-cuda-graph are not searched; its memory is budgeted as vLLM's (--mem-fraction-static
# read as gpu_memory_utilization, activations inside it; block 16 where SGLang pages by 1 token);
# under DP attention the dense (non-expert) layers are priced at the rank's tp, as vLLM runs them
SGLANG_GRAPH_MODE = "FULL_DECODE_ONLY"
QUANT_FLAG = {"fp8": "fp8", "nvfp4": "modelopt_fp4", "mxfp4": "mxfp4"}
# Formats vLLM serves only from a checkpoint quantized ahead of time (FP8 it also quantizes online).
PREQUANTIZED = ("nvfp4", "mxfp4")
# The most layouts one search considers: the default space of DeepSeek-V3 on 8 GPUs is 342; each
# layout is resolved and fit-checked, 2-4 ms each on this project's machine (10 000: ~30 s) before
# any is priced, so a space of millions (lists of engine settings multiplied) would run for hours.
MAX_CANDIDATES = 10_000


# ----------------------------------------------------------------------------- candidates


@dataclasses.dataclass(frozen=True, order=True)
class Layout:
    """One engine configuration: parallel widths, served weight format, engine settings."""
    tp: int
    dp: int
    ep: bool
    weights: str                 # served weight format (formats.DTYPE_BYTES key)
    max_num_seqs: int
    max_num_batched_tokens: int  # SGLang: chunked_prefill_size
    cudagraph_mode: str          # SGLang: SGLANG_GRAPH_MODE
    engine: str = "vllm"         # ENGINES; SGLang's max_num_seqs is its max_running_requests
    spec_tokens: int = 0         # speculative decoding: tokens drafted per decode step (k; 0: off) by the
    #                              model graph's own drafter (its MTP layers); a decode row schedules 1 + k
    acceptance: float | None = None  # mean tokens emitted per decode row and step, in [1, 1 + k] (an
    #                              ASSUMPTION; None: serve.default_acceptance(k); 1 when k = 0)

    @property
    def width(self) -> int:
        return self.tp * self.dp

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens a decode row emits per step: 1 without speculation, else the acceptance."""
        if not self.spec_tokens:
            return 1.0
        if self.acceptance is None:
            from .serve import default_acceptance
            return default_acceptance(self.spec_tokens)
        return float(self.acceptance)

    @property
    def parallel_label(self) -> str:
        head = "" if self.engine == "vllm" else f"{self.engine} "
        return f"{head}tp{self.tp} dp{self.dp}{' ep' if self.ep else ''} {self.weights}"

    @property
    def label(self) -> str:
        spec = f" mtp{self.spec_tokens}" if self.spec_tokens else ""    # only when speculating
        if self.engine == "sglang":
            return f"{self.parallel_label} mrr{self.max_num_seqs} chunk{self.max_num_batched_tokens}{spec}"
        mode = {"PIECEWISE": "pw", "FULL_AND_PIECEWISE": "full+pw", "FULL": "full",
                "FULL_DECODE_ONLY": "full-dec", "NONE": "eager"}.get(self.cudagraph_mode, self.cudagraph_mode)
        return f"{self.parallel_label} seqs{self.max_num_seqs} mbt{self.max_num_batched_tokens} {mode}{spec}"

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if self.spec_tokens:              # the draft count and the ASSUMED acceptance it was priced at
            out["acceptance"] = self.tokens_per_step
        else:                             # a layout without speculation: its dict as before
            del out["spec_tokens"], out["acceptance"]
        if self.engine == "vllm":         # a vLLM layout's dict as before engines were added
            del out["engine"]
        else:                             # SGLang's names for its two limits beside the shared ones
            out["max_running_requests"], out["chunked_prefill_size"] = self.max_num_seqs, self.max_num_batched_tokens
        return out


@dataclasses.dataclass
class Candidate:
    """A layout and what became of it: ``status`` 'ok', 'rejected' (``reason``) or 'duplicate'
    (``reason`` names the layout it prices the same as)."""
    layout: Layout
    replicas: int
    status: str
    reason: str = ""
    deployment: Deployment | None = None
    memory: dict = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {"layout": self.layout.as_dict(), "label": self.layout.label, "replicas": self.replicas,
               "status": self.status, "reason": self.reason}
        out["memory_gib"] = {k: v / 2 ** 30 for k, v in self.memory.items() if k.endswith("bytes")}
        if "kv_capacity_tokens" in self.memory:
            out["kv_capacity_tokens"] = self.memory["kv_capacity_tokens"]
        return out


def is_moe(graph: ModelGraph) -> bool:
    return any(n["op"] == "GroupedGEMM" and n["top_k"] > 0 for nodes in graph.layer_kinds.values() for n in nodes)


def _is_dsa(graph: ModelGraph) -> bool:
    return any(n["op"] == "Attention" and n["kind"] == "sparse_mla" and n["d_h"] == 576
               for nodes in graph.layer_kinds.values() for n in nodes)


def weight_formats(graph: ModelGraph, chip) -> list:
    """Served weight formats for a checkpoint on a chip: the checkpoint's own; FP8 from a 16- or
    32-bit checkpoint where the chip has an FP8 peak (vLLM's online ``--quantization fp8``);
    NVFP4 where the chip has a native four-bit peak and the checkpoint is 8-bit or wider (a
    published NVFP4 checkpoint, ``--quantization modelopt_fp4``). A checkpoint whose nodes are
    already quantized below its base width (gpt-oss-120b: bf16 with MXFP4 experts) is not
    quantized online: vLLM refuses a --quantization that differs from the checkpoint's own. A
    checkpoint already holding NVFP4 nodes (ModelOpt's NVFP4 or MIXED_PRECISION checkpoints, their
    global format the width of the modules they leave out: nvidia/Gemma-4-26B-A4B-NVFP4, bf16 with
    NVFP4 experts) IS the published NVFP4 checkpoint: it is offered as it is, not as an all-NVFP4
    one that nothing publishes."""
    ck = graph.weight_dtype
    out = [ck]
    held = {n["weight_dtype"] for nodes in graph.layer_kinds.values() for n in nodes
            if n.get("weight_dtype") in DTYPE_BYTES}
    prequantized = any(DTYPE_BYTES[f] < DTYPE_BYTES[ck] for f in held)
    if DTYPE_BYTES[ck] >= 2 and (chip.fp8_tflops or 0) > 0 and not prequantized:
        out.append("fp8")
    if DTYPE_BYTES[ck] >= 1 and (chip.nvfp4_tflops or 0) > 0 and "nvfp4" not in out and "nvfp4" not in held:
        out.append("nvfp4")
    return out


def attention_heads(graph: ModelGraph) -> list:
    """The query-head counts of the model's primary attention nodes (those with no role), one per
    distinct count."""
    return sorted({int(n["n_q"]) for nodes in graph.layer_kinds.values() for n in nodes
                   if n["op"] == "Attention" and not n.get("role")})


def heads_reason(graph: ModelGraph, tp: int, engine: str = "vllm") -> str:
    """Why vLLM refuses a tensor-parallel width for the model ("" when it does not): its attention
    heads must divide by tp (ModelConfig.verify_with_parallel_config, vllm-project/vllm
    vllm/config.py@c0c2335: "Total number of attention heads (H) must be divisible by tensor
    parallel size (tp)"), and its KV heads must divide by tp or divide it (below). The reference
    kernel prices any width; this is the engine's rule.
    SGLang shards the heads alike (its attention tensor-parallel width, tp here, also under DP
    attention: --tp tp x dp --dp dp)."""
    bad = [h for h in attention_heads(graph) if h % int(tp)]
    name = "SGLang" if engine == "sglang" else "vLLM"
    if bad:
        return (f"{bad[0]} attention heads do not divide by tensor-parallel size {tp} ({name} refuses it: the heads "
                "must divide by tp)")
    # the KV heads too: QKVParallelLinear splits them (tp below their count) or replicates each over
    # tp / count ranks (tp at or above it), vllm-project/vllm vllm/model_executor/layers/linear.py
    # (divide(total_num_kv_heads, tp_size) / divide(tp_size, total_num_kv_heads), each asserting
    # divisibility): phi-4's 10 KV heads at tp 4 or 8
    tp = int(tp)
    kv = sorted({int(n["n_kv"]) for nodes in graph.layer_kinds.values() for n in nodes
                 if n["op"] == "Attention" and not n.get("role") and int(n.get("n_kv") or 0) > 0})
    bad = [k for k in kv if (k % tp if tp < k else tp % k)]
    if bad:
        return (f"{bad[0]} KV heads neither divide by tensor-parallel size {tp} nor divide it ({name} refuses it: "
                "it splits the KV heads over tp, or replicates each over tp / their count)")
    return ""


def checkpoint_fp8_block(graph: ModelGraph | None) -> tuple | None:
    """(block_n, block_k) of a block-wise FP8 checkpoint (its config.json's
    ``quantization_config.weight_block_size``, e.g. [128, 128]: Qwen3-235B-A22B-FP8,
    MiniMax-M2.5, DeepSeek-V3), None for any other (per-tensor FP8, 16-bit, four-bit)."""
    if graph is None or graph.weight_dtype != "fp8":
        return None
    from .launch import _config_doc     # the imported config.json, else the bundled copy of the graph's repo
    doc = _config_doc(graph)
    for qc in (doc.get("quantization_config"), (doc.get("text_config") or {}).get("quantization_config")):
        block = qc.get("weight_block_size") if isinstance(qc, dict) else None
        if (isinstance(block, list) and len(block) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in block)):
            return int(block[0]), int(block[1])
    return None


def block_reason(graph: ModelGraph, tp: int, dp: int, ep: bool, weights: str, engine: str = "vllm",
                 block: tuple | None = None) -> str:
    """Why the engine refuses to load a block-wise FP8 checkpoint at this layout ("" when it does
    not): every tensor-parallel shard of a quantized GEMM must hold whole quantization blocks.
    vLLM's Fp8MoEMethod.create_weights ("The output_size of gate's and up's weight = 192 is not
    divisible by weight quantization block_n = 128", vllm-project/vllm#17569: Qwen3-235B-A22B-FP8
    at tp 8) and validate_fp8_block_shape for the dense layers; SGLang's FP8 method alike
    (QwenLM/Qwen3#1485). The experts are split over tp x dp GPUs without expert parallelism (none
    with it); the row-parallel dense GEMMs (MLP and shared-expert down, o_proj) over tp (the
    column-parallel gate_up and q of qkv split the same widths: their rule adds nothing here).
    Only nodes held in the checkpoint's FP8 (one stating another format, DeepSeek-V4-Pro's MXFP4
    experts, has no 128-wide blocks) and split over tp (not a ``replicated`` GEMM). ``block``:
    checkpoint_fp8_block(graph), read once by a caller checking many layouts (None: read here).
    Served in another format than the checkpoint's FP8 (another checkpoint), there is no such rule."""
    if weights != "fp8" or graph.weight_dtype != "fp8":
        return ""
    block = checkpoint_fp8_block(graph) if block is None else block
    if not block:
        return ""
    bn, bk = block
    name = "SGLang" if engine == "sglang" else "vLLM"
    moe_tp = 1 if ep else int(tp) * int(dp)
    for nodes in graph.layer_kinds.values():
        for n in nodes:
            role, what = n.get("role"), None
            if n.get("weight_dtype", "fp8") != "fp8" or (n["op"] == "GEMM" and n.get("replicated")):
                continue        # held in another format (no FP8 blocks), or a GEMM whole on every GPU
            if n["op"] == "GroupedGEMM" and n.get("top_k") and moe_tp > 1 and n["n"] % moe_tp == 0:
                size, split, what = n["n"] // moe_tp, moe_tp, "expert intermediate"
                bad = size % bn or size % bk
            elif (n["op"] == "GEMM" and role in ("mlp_down", "shared_expert_down", "o_proj") and tp > 1
                  and n["k"] % tp == 0):
                size, split, what = n["k"] // tp, tp, f"{role} input"
                bad = size % bk
            if what and bad:
                return (f"block-wise FP8 checkpoint ({bn} x {bk} blocks): its {what} of {size} per GPU "
                        f"({n['n'] if n['op'] == 'GroupedGEMM' else n['k']} / {split}) is not a whole number of "
                        f"{bn if n['op'] == 'GroupedGEMM' else bk}-wide blocks ({name} refuses to load it"
                        + ("; expert parallelism keeps the experts whole" if n["op"] == "GroupedGEMM" else "")
                        + ")")
    return ""


def max_model_len(isl: int, osl: int, limit: int | None = None) -> int:
    """The engine's max_model_len for a workload: ISL + OSL + 256 (InferenceX's rule), at most
    ``limit``, the model's own (``ModelGraph.max_model_len``, where its graph states one)."""
    want = int(isl) + int(osl) + 256
    return want if limit is None else min(want, int(limit))


def refuse_weight_format(graph: ModelGraph, chip, fmt: str, *, field: str, engine: str = "vllm") -> None:
    """Refuse ``fmt`` unless the engine serves the checkpoint in it on the chip (weight_formats),
    naming the formats it does serve and those the checkpoint already holds beside its main one."""
    allowed = weight_formats(graph, chip)
    if fmt in allowed:
        return
    held = held_formats(graph, graph.weight_dtype)
    name = "SGLang" if engine == "sglang" else "vLLM"
    refuse(f"not a format {name} serves {graph.name} in on {chip.name} (from its {graph.weight_dtype} checkpoint: "
           f"{', '.join(allowed)}" + (f"; the checkpoint holds {held}" if held else "") + ")", field=field, value=fmt)


def held_formats(graph: ModelGraph | None, served: str) -> str:
    """'nvfp4 for moe_experts': the GEMMs the checkpoint holds at another format than ``served``
    (a ModelOpt NVFP4 checkpoint's experts beside its bf16 rest, gpt-oss's MXFP4 experts), by role;
    '' where every GEMM is served at it."""
    other = {}
    for nodes in [*(getattr(graph, "layer_kinds", None) or {}).values(), getattr(graph, "head", None) or ()]:
        for n in nodes:
            fmt = n.get("weight_dtype")
            if n.get("op") in ("GEMM", "GroupedGEMM") and fmt and fmt != served:
                other.setdefault(fmt, {})[n.get("role") or n["op"]] = None

    def roles(names):
        names = list(names)
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return "; ".join(f"{fmt} for {roles(r)}" for fmt, r in other.items())


def checkpoint_kv_cache(graph: ModelGraph | None) -> str | None:
    """'fp8' where an imported checkpoint calibrated an FP8 KV cache (``hf.calibrated_kv_cache``:
    ModelOpt's ``kv_cache_quant_algo: FP8``, compressed-tensors' 8-bit float ``kv_cache_scheme``),
    which vLLM's ``--kv-cache-dtype auto`` serves; the graph's ``kv_cache_dtype``, so a config.json
    and the YAML graph import-model writes from it are priced alike. None otherwise."""
    return getattr(graph, "kv_cache_dtype", None)


def base_scenario(model: str, chip: str, *, tp: int, dp: int, ep: bool, weights: str, graph: ModelGraph,
                  name: str, gpus_per_node: int = 8, gpu_memory_utilization: float = 0.9,
                  path: str = "<jaxprice size>", fabric: str | None = None, searched: dict | None = None,
                  coefficient_sets=COEFFICIENT_SETS) -> Scenario:
    """A Scenario record for a parallel layout, with no scenario file: the six cost-model sets,
    nodes of ``gpus_per_node`` GPUs (as many as the engine needs), an FP8 KV cache unless the
    weights are served in 16 bits and the checkpoint calibrated none (``checkpoint_kv_cache``:
    vLLM's auto cache takes a ModelOpt checkpoint's FP8 one, so a bf16-with-NVFP4-experts
    checkpoint such as nvidia/Gemma-4-26B-A4B-NVFP4 runs an FP8 cache), block 16 (64 for
    sparse-MLA models), gpu_memory_utilization
    0.9: the settings of the bundled vLLM scenarios (testdata/aisimulate). ``searched``: the
    engine settings size searches (max_num_batched_tokens, max_num_seqs, max_model_len,
    cudagraph_mode); None leaves them to vLLM's defaults. An engine wider than a node spans
    several, joined by ``fabric`` (a registry network; none: the scenario names none and resolve
    refuses it). ``coefficient_sets``: the sets it lists (the six, and a fitted set's file after
    them where size was given one)."""
    engine = {"quantization": weights} if weights in QUANT_FLAG else {}
    engine.update({"cache_dtype": "auto" if DTYPE_BYTES[weights] >= 2 and checkpoint_kv_cache(graph) is None
                   else "fp8",
                   "block_size": 64 if _is_dsa(graph) else 16})
    engine.update(searched or {})
    engine["gpu_memory_utilization"] = float(gpu_memory_utilization)
    nodes = max(1, math.ceil(tp * dp / gpus_per_node))
    return Scenario(name=name, model=model, hardware=chip, fabric=fabric if nodes > 1 else None,
                    nodes=nodes, gpus_per_node=gpus_per_node, gpus_per_rack=0, coefficient_sets=tuple(coefficient_sets),
                    engine_version="", pool_nodes=nodes,
                    parallel={"tp": tp, "pp": 1, "dp": dp, "enable_expert_parallel": ep},
                    engine=engine, path=path)


def build_scenario(model: str, chip: str, layout: Layout, *, isl: int, osl: int, graph: ModelGraph,
                   gpus_per_node: int = 8, name: str | None = None, gpu_memory_utilization: float = 0.9,
                   path: str = "<jaxprice size>", fabric: str | None = None,
                   coefficient_sets=COEFFICIENT_SETS) -> Scenario:
    """One candidate's Scenario (base_scenario) with the layout's engine settings and
    max_model_len = ISL + OSL + 256 (capped at the model's own). An SGLang layout's engine block
    also names ``scheduler: sglang`` (the serving simulation follows it); its
    max_num_batched_tokens is SGLang's chunked_prefill_size, its max_num_seqs SGLang's
    max_running_requests."""
    searched = {"max_num_batched_tokens": int(layout.max_num_batched_tokens),
                "max_num_seqs": int(layout.max_num_seqs),
                "max_model_len": max_model_len(isl, osl, graph.max_model_len),
                "cudagraph_mode": layout.cudagraph_mode}
    if layout.engine != "vllm":
        searched["scheduler"] = layout.engine
    if layout.spec_tokens:       # the model's own drafter (its MTP layers), as resolve._speculation reads it
        if not graph.speculator:
            refuse(f"{graph.name} has no drafter (no MTP layers in its graph): speculative decoding cannot be priced",
                   field="spec_tokens", value=layout.spec_tokens)
        searched["speculative"] = {"num_spec_tokens": int(layout.spec_tokens),
                                   "method": str(graph.speculator["method"])}
    return base_scenario(model, chip, tp=layout.tp, dp=layout.dp, ep=layout.ep, weights=layout.weights, graph=graph,
                         name=name or scenario_name(model, chip, layout), gpus_per_node=gpus_per_node,
                         gpu_memory_utilization=gpu_memory_utilization, path=path, fabric=fabric, searched=searched,
                         coefficient_sets=coefficient_sets)


def scenario_name(model: str, chip: str, layout: Layout) -> str:
    spec = f"-mtp{layout.spec_tokens}" if layout.spec_tokens else ""
    return _scenario_name(model, chip, layout) + spec


def _scenario_name(model: str, chip: str, layout: Layout) -> str:
    if layout.engine == "sglang":
        return (f"{model}-{chip}-{layout.weights}-sglang-tp{layout.tp}" + (f"-dp{layout.dp}" if layout.dp > 1 else "")
                + ("-ep" if layout.ep else "") + f"-mrr{layout.max_num_seqs}-chunk{layout.max_num_batched_tokens}")
    return (f"{model}-{chip}-{layout.weights}-vllm-tp{layout.tp}" + (f"-dp{layout.dp}" if layout.dp > 1 else "")
            + ("-ep" if layout.ep else "") + f"-seqs{layout.max_num_seqs}-mbt{layout.max_num_batched_tokens}"
            + f"-{layout.cudagraph_mode.lower()}")


class _GraphRegistry(Registry):
    """A registry that also knows one model graph read from a file."""

    def __init__(self, graph: ModelGraph, base: Registry):
        super().__init__(base.roots)
        self._graph = graph

    def model(self, name, *, file=None, field=None):
        if name == self._graph.name:
            return self._graph
        return super().model(name, file=file, field=field)


def load_model(model, registry: Registry | None = None) -> tuple[ModelGraph, Registry, str]:
    """(graph, registry that resolves it, where it came from) for a registry model name, a model
    graph file, or a Hugging Face config.json (or a folder holding one; formats.load_model_graph
    imports it)."""
    registry = registry or Registry()
    text = str(model)
    if not text.strip():          # Path("") is the working folder: never read it as a model folder
        refuse("an empty model name (a registry model, a model graph file or a config.json)", field="model",
               value=text)
    p = Path(text)
    if p.is_dir() and not (p / "config.json").is_file():
        refuse("a folder without a config.json (expected a Hugging Face model folder, a model graph file or a "
               "registry model name)", field="model", value=text)
    if p.exists():
        graph = load_model_graph(p / "config.json" if p.is_dir() else p)
        return graph, _GraphRegistry(graph, registry), text
    if p.suffix in (".yaml", ".yml", ".json"):
        refuse("no such model file", file=text)
    graph = registry.model(text, field="model")
    if str(graph.path).endswith(".json"):      # no graph of that name: its bundled config.json, imported
        return graph, registry, f"registry model {text}, imported from {graph.path}"
    return graph, registry, f"registry model {text}"


def candidate_space(graph: ModelGraph, chip, gpus: int, *, tp=None, dp=None, ep=None, weights=None,
                    max_num_seqs=DEFAULT_MAX_NUM_SEQS, max_num_batched_tokens=DEFAULT_BATCHED_TOKENS,
                    cudagraph_modes=DEFAULT_GRAPH_MODES, engine: str = "vllm", spec_tokens=(0,),
                    acceptance: float | None = None) -> list:
    """Every Layout to try (before the fit check), in a stable order. tp, dp, ep, weights: lists
    restricting those axes (None: all). dp > 1 only for MoE models (data-parallel attention; a
    dense model's replicas are separate engines already); ep only for MoE and tp x dp > 1.
    engine 'sglang': max_num_seqs and max_num_batched_tokens are SGLang's max_running_requests
    and chunked_prefill_size, the graph mode SGLANG_GRAPH_MODE (``cudagraph_modes`` unused).
    spec_tokens: draft counts k (0: no speculation; k > 0 only for a graph with a drafter, checked
    by the caller), the innermost axis; acceptance: the mean tokens a decode row emits per step
    assumed for every k > 0, at most 1 + k (None: serve.default_acceptance(k))."""
    if engine == "sglang":
        cudagraph_modes = (SGLANG_GRAPH_MODE,)
    moe = is_moe(graph)
    tps = [w for w in WIDTHS if w <= gpus] if tp is None else sorted(set(tp))
    dps = ([w for w in WIDTHS if w <= gpus] if moe else [1]) if dp is None else sorted(set(dp))
    eps = ([False, True] if moe else [False]) if ep is None else sorted(set(ep))
    fmts = weight_formats(graph, chip) if weights is None else list(dict.fromkeys(weights))
    # a value listed twice is one layout, not two (the duplicates would be resolved and priced again)
    max_num_seqs, max_num_batched_tokens, cudagraph_modes = (
        list(dict.fromkeys(int(v) for v in max_num_seqs)), list(dict.fromkeys(int(v) for v in max_num_batched_tokens)),
        list(dict.fromkeys(str(v) for v in cudagraph_modes)))
    specs = list(dict.fromkeys(int(v) for v in spec_tokens))
    parallel = sum(1 for t, d, e in itertools.product(tps, dps, eps)
                   if not gpus % (t * d) and not (e and (not moe or t * d == 1)))
    count = (parallel * len(fmts) * len(max_num_seqs) * len(max_num_batched_tokens) * len(cudagraph_modes)
             * len(specs))
    if count > MAX_CANDIDATES:     # refused before any is built: each one is resolved and fit-checked
        refuse(f"{count} layouts ({parallel} parallel layouts x {len(fmts)} weight formats x {len(max_num_seqs)} "
               f"max_num_seqs x {len(max_num_batched_tokens)} max_num_batched_tokens x {len(cudagraph_modes)} graph "
               f"modes" + (f" x {len(specs)} draft counts" if len(specs) > 1 else "")
               + f") is more than the {MAX_CANDIDATES} a search takes: list fewer values", field="candidates",
               value=count)
    out = []
    for t, d, e, f in itertools.product(tps, dps, eps, fmts):
        if gpus % (t * d):
            continue
        if e and (not moe or t * d == 1):
            continue
        for s, b, m, k in itertools.product(max_num_seqs, max_num_batched_tokens, cudagraph_modes, specs):
            if not k:
                out.append(Layout(t, d, bool(e), f, int(s), int(b), str(m), engine))
                continue
            acc = None if acceptance is None else min(float(acceptance), 1.0 + k)   # at most every draft accepted
            out.append(Layout(t, d, bool(e), f, int(s), int(b), str(m), engine, int(k), acc))
    return out


def fits(dep: Deployment, need_tokens: int) -> tuple[bool, str]:
    """Whether one request of ``need_tokens`` fits the KV cache beside the weights, and why not
    (sliding-window layers hold at most their window: ``serve.windowed_kv_capacity``)."""
    m = dep.plan.memory
    cap = _kv_tokens(dep, need_tokens)
    if cap >= need_tokens:
        return True, ""
    gib = 2 ** 30
    fixed = sum(m.get(k, 0.0) for k in ("weights_bytes", "activation_bytes", "cudagraph_bytes", "comm_buffer_bytes"))
    budget = dep.chip.memory_gib * float(dep.scenario.engine.get("gpu_memory_utilization", 0.9))
    return False, (f"does not fit: weights {m['weights_bytes'] / gib:.1f} GiB + activations, graphs and buffers "
                   f"{(fixed - m['weights_bytes']) / gib:.1f} GiB per GPU of {budget:.1f} GiB usable leave KV for "
                   f"{cap:.0f} tokens, less than one {need_tokens}-token request")


def _kv_tokens(dep: Deployment, length: float) -> float:
    """KV-cache tokens per rank for requests of ``length`` tokens (serve.windowed_kv_capacity)."""
    from .serve import windowed_kv_capacity
    m = dep.plan.memory
    return windowed_kv_capacity(float(m["kv_capacity_tokens"]), float(m["kv_bytes_per_token"]),
                                m.get("kv_window_bytes_per_token", ()), float(length), int(m.get("block_size", 16)),
                                float(m.get("recurrent_state_bytes_per_request", 0.0)))


def _engine_key(dep: Deployment, layout: Layout):
    m = dep.plan.memory
    return (dep.plan.digest, round(float(m["kv_capacity_tokens"])), layout.max_num_seqs,
            layout.max_num_batched_tokens, layout.dp, layout.tp, layout.spec_tokens, layout.tokens_per_step)


def spans_nodes_reason(width: int, gpus_per_node: int, fabrics) -> str:
    """Why an engine of ``width`` GPUs, wider than a node, is not priced when no fabric is named."""
    # COVERAGE LIMIT [size-multi-node]: an engine over several nodes is searched as tp x dp over
    # the named fabric (its launch lines from vllm_command); pipeline parallelism, rack-scale
    # domains (gpus_per_rack) and a fabric per node pair are not searched
    nodes = math.ceil(width / gpus_per_node)
    return (f"spans {nodes} nodes of {gpus_per_node} GPUs: name the network between them "
            f"(--fabric: {', '.join(fabrics)})")


def build_candidates(model: str, graph: ModelGraph, chip_name: str, gpus: int, layouts, *, isl: int, osl: int,
                     registry: Registry, gpus_per_node: int = 8, callback=None, fabric: str | None = None,
                     coefficient_sets=COEFFICIENT_SETS) -> list:
    """Resolve every layout and check its fit; returns Candidates in layout order. A layout wider
    than a node is rejected with its reason when no ``fabric`` joins the nodes."""
    need = max_model_len(isl, osl, graph.max_model_len)
    out, seen, hopeless = [], {}, {}
    block = checkpoint_fp8_block(graph) or ()      # read once: block_reason's rule for each layout
    for k, lay in enumerate(layouts):
        replicas = gpus // lay.width
        par = (lay.tp, lay.dp, lay.ep, lay.weights, lay.spec_tokens > 0)    # a drafter adds its weights
        if par in hopeless:        # weights alone exceed memory: no engine setting changes that
            out.append(Candidate(lay, replicas, "rejected", hopeless[par][0], memory=dict(hopeless[par][1])))
            continue
        if fabric is None and lay.width > gpus_per_node:
            out.append(Candidate(lay, replicas, "rejected",
                                 spans_nodes_reason(lay.width, gpus_per_node, registry.network_names())))
            continue
        if heads_reason(graph, lay.tp, lay.engine):
            out.append(Candidate(lay, replicas, "rejected", heads_reason(graph, lay.tp, lay.engine)))
            continue
        blocks = block_reason(graph, lay.tp, lay.dp, lay.ep, lay.weights, lay.engine, block)
        if blocks:
            out.append(Candidate(lay, replicas, "rejected", blocks))
            continue
        # vLLM's SchedulerConfig._verify_args (vllm/config/scheduler.py); SGLang has no such rule: its
        # decode steps carry every running request, outside the chunk
        if lay.engine == "vllm" and lay.max_num_batched_tokens < lay.max_num_seqs:
            out.append(Candidate(lay, replicas, "rejected", f"vLLM refuses max_num_batched_tokens "
                                 f"{lay.max_num_batched_tokens} < max_num_seqs {lay.max_num_seqs} (every running "
                                 "request needs a token per step)"))
            continue
        scen = build_scenario(model, chip_name, lay, isl=isl, osl=osl, graph=graph, gpus_per_node=gpus_per_node,
                              fabric=fabric, coefficient_sets=coefficient_sets)
        try:
            dep = resolve(scen, registry)
        except JaxpriceError as err:
            out.append(Candidate(lay, replicas, "rejected", f"does not resolve: {err.reason}"))
            continue
        ok, why = fits(dep, need)
        if not ok:
            out.append(Candidate(lay, replicas, "rejected", why, memory=dict(dep.plan.memory)))
            budget = dep.chip.memory_gib * 2 ** 30 * float(dep.scenario.engine.get("gpu_memory_utilization", 0.9))
            if dep.plan.memory["weights_bytes"] >= budget:
                hopeless[par] = (why, dep.plan.memory)
        else:
            key = _engine_key(dep, lay)
            if key in seen:
                out.append(Candidate(lay, replicas, "duplicate", f"priced the same as {seen[key].label}",
                                     deployment=dep, memory=dict(dep.plan.memory)))
            else:
                seen[key] = lay
                out.append(Candidate(lay, replicas, "ok", deployment=dep, memory=dict(dep.plan.memory)))
        if callback is not None:
            callback(k + 1, len(layouts), stage="resolve")
    return out
