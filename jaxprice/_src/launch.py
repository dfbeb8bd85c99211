"""A sized layout as the engine would be launched: the ``vllm serve`` or ``python -m
sglang.launch_server`` command line of one engine (flags only where the layout sets them, notes
after every flag as comments) and the scenario document ``jaxprice serve`` and ``price`` accept.
``size`` (size.py) chooses the layout; this module only writes it out.

Versions the lines target (flags checked against the engines' own sources, tests/test_launch_flags.py):
vLLM with the v1 engine of 2026 (async scheduling on by default, CompilationConfig's
``max_cudagraph_capture_size``, the multiprocessing executor's ``--nnodes``/``--node-rank``/
``--master-addr``: vllm-project/vllm vllm/config/vllm.py@09f030e, vllm/config/parallel.py@840e797,
vllm/engine/arg_utils.py@99d7eb5); SGLang's server_args.py of 2026 (``--cuda-graph-max-bs``,
``SGLANG_ENABLE_SPEC_V2``). Given the ``deployment`` a line was priced from, a line pins what its
plan priced where the engine's default differs: the largest captured batch (vLLM's default
min(2 x max_num_seqs x (1 + k), 512) tokens, where the plan captures up to 1024 on parts with a
four-bit peak; SGLang's --cuda-graph-max-bs default 256 or 512 by GPU and --tp) and SGLang's static
memory share (``capture_tokens_of``, ``static_fraction_of``). Left to the engines' defaults, as the
targeted versions run what was priced: vLLM's async scheduling (on unless the executor is Ray; an
explicit --async-scheduling refuses to start a 2025 vLLM with speculative decoding, arg_utils.py
@99d7eb5), chunked prefill and scheduler_reserve_full_isl (a 2026-03 flag older vLLM lacks); SGLang's
overlap scheduler (on, but for EAGLE only with SGLANG_ENABLE_SPEC_V2, which a speculating line sets)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .formats import ModelGraph, Scenario
from .layouts import PREQUANTIZED, QUANT_FLAG, Layout, is_moe

def scenario_document(scen: Scenario, note: str = "") -> str:
    import yaml
    first = {"kind": "Scenario", "name": scen.name, "engine_version": scen.engine_version or "", "model": scen.model,
             "coefficients": list(scen.coefficient_sets),
             "cluster": {"hardware": scen.hardware, "nodes": scen.nodes, "gpus_per_node": scen.gpus_per_node}}
    if scen.fabric:
        first["cluster"]["fabric"] = scen.fabric
    if not first["engine_version"]:
        del first["engine_version"]
    second = {"kind": "Deployment", "name": scen.name,
              "pools": [{"role": "colocated", "nodes": scen.pool_nodes, "parallel": dict(scen.parallel),
                         "engine": dict(scen.engine)}]}
    head = "".join(f"# {line}\n" for line in note.splitlines()) if note else ""
    return head + yaml.safe_dump_all([first, second], sort_keys=False, default_flow_style=False)


# architectures vLLM has no model for (the graph is another engine's): their vLLM launch line says so
VLLM_LACKS = {"KimiK3ForConditionalGeneration":
              "vLLM has no Kimi-K3 model (vllm-project/vllm@01d9958: its KimiLinear asserts q_lora_rank None and "
              "SiLU): this command needs a vLLM build that has one; the graph is SGLang's (kimi_k3.py): size it "
              "with --engine sglang"}


def _config_doc(graph: ModelGraph | None) -> dict:
    """The model's Hugging Face config.json as a dict: an imported graph's own file, else the bundled
    copy (testdata/hf) of the repo its graph names; {} where there is none."""
    if graph is None:
        return {}
    try:
        import json
        path = Path(str(graph.path))
        if not path.name.endswith(".json"):
            from .hf import bundled_config
            folder = bundled_config(_model_repo(graph) or "")
            if folder is None:
                return {}
            path = folder / "config.json"
        doc = json.loads(path.read_text())
        return doc if isinstance(doc, dict) else {}
    except Exception:  # noqa: BLE001 - an unreadable file states nothing
        return {}


def _architectures(graph: ModelGraph | None) -> list:
    """The ``architectures`` of the model's config.json ([] where none is known)."""
    archs = _config_doc(graph).get("architectures")
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def _remote_code_flag(graph: ModelGraph | None) -> list:
    """['--trust-remote-code'] for a model whose config.json maps its classes to code in its own
    repository (``auto_map``: Kimi-K2.5, MiniMax-M2.5, DeepSeek-V3, ...): the engines load such a
    config or tokenizer only with the flag, and their recipes for these models launch with it (it
    changes nothing where the engine has the model's classes itself); else []."""
    return ["--trust-remote-code"] if isinstance(_config_doc(graph).get("auto_map"), dict) else []


def _model_repo(graph: ModelGraph | None):
    """The Hugging Face repo id a launch line names for the model; for a config.json that names
    none, the checkpoint the engine loads (``_local_checkpoint``); None: unknown."""
    repo = None
    if graph is not None:
        try:    # the graph file's hf_repo; for an imported config.json, the repo its path or config names
            import yaml
            doc = yaml.safe_load(Path(graph.path).read_text())
            repo = doc.get("hf_repo") if isinstance(doc, dict) else None
            if repo is None and str(graph.path).endswith(".json"):
                from .hf import _hf_repo
                repo = _hf_repo(Path(graph.path), doc) or _local_checkpoint(Path(graph.path))
        except Exception:  # noqa: BLE001 - a graph without a readable file just has no repo id
            repo = None
    return repo


def _local_checkpoint(cfg: Path) -> str:
    """What the engine loads for a config.json that names no repo id: a Hugging Face hub cache's
    repo (.../models--ORG--NAME/snapshots/SHA/config.json: ORG/NAME, which the engine finds in that
    cache), else the folder holding it (a local checkpoint, as both engines take one). The graph's
    name is no model the engine can load (`vllm serve my-finetune` asks the hub for a repo of that
    name; a config matching a bundled model's was even named llama-3.1-8b-instruct)."""
    # absolute, links kept: a hub snapshot's config.json links to ../../blobs/<hash>
    folder = Path(os.path.abspath(cfg)).parent
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        org, _, name = folder.parent.parent.name[len("models--"):].partition("--")
        if org and name:
            return f"{org}/{name}"
    return str(folder)


def vllm_command(scen: Scenario, layout: Layout, graph: ModelGraph | None, *, replicas: int = 1,
                 hybrid_block: int = 0, deployment=None) -> str:
    """The ``vllm serve`` command line of one engine (run ``replicas`` of them, one per group of
    tp x dp GPUs, behind a load balancer). ``hybrid_block``: a model with recurrent layers, the
    attention block its plan was priced at (resolve.hybrid_block_size): ``--block-size`` is then
    left to vLLM, which raises the block to hold one layer's state itself (a stated 16 would be
    overridden, and a stated raised value would outlive a vLLM whose rule differs). ``deployment``:
    the one the line was priced from; its plan's capture ceiling goes into --compilation-config
    (``capture_tokens_of``)."""
    repo = _model_repo(graph)
    e = scen.engine
    parts = ["vllm serve", repo or scen.model, f"--tensor-parallel-size {layout.tp}"]
    if layout.dp > 1:
        parts.append(f"--data-parallel-size {layout.dp}")
    if layout.ep:
        parts.append("--enable-expert-parallel")
    parts += _format_flags(e, graph)
    parts += [f"--max-num-seqs {e['max_num_seqs']}", f"--max-num-batched-tokens {e['max_num_batched_tokens']}",
              f"--max-model-len {e['max_model_len']}"]
    # a block vLLM's MLA backend picks itself (resolve.vllm_mla_block): a stated one its kernels
    # cannot page would move vLLM to a fallback backend, not the one priced
    mla_block = mla_block_of(deployment)
    parts += [] if hybrid_block or mla_block else [f"--block-size {e['block_size']}"]
    # CompilationConfig (vllm/config/compilation.py@ee525ce): cudagraph_mode parsed from its name;
    # max_cudagraph_capture_size, the largest captured batch in tokens, pinned to the plan's ceiling
    # (vLLM's default min(2 x max_num_seqs x (1 + k), 512), vllm/config/vllm.py@09f030e
    # _set_cudagraph_sizes, is not the 1024 a four-bit part was priced at)
    compilation = {"cudagraph_mode": e["cudagraph_mode"]}
    capture = capture_tokens_of(deployment)
    if capture:
        compilation["max_cudagraph_capture_size"] = capture
    parts += [f"--gpu-memory-utilization {e['gpu_memory_utilization']}",
              f"--compilation-config '{json.dumps(compilation)}'",
              "--no-enable-prefix-caching"] + _remote_code_flag(graph)
    if e.get("speculative"):      # the model's own MTP layers as the drafter (vLLM's speculative config)
        parts.append("--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": %d}'"
                     % int(e["speculative"]["num_spec_tokens"]))
    notes = []          # comments, after every flag (a flag after a '#' would be commented out)
    notes += [VLLM_LACKS[a] for a in _architectures(graph) if a in VLLM_LACKS][:1]
    if e.get("quantization") in PREQUANTIZED and graph is not None and e["quantization"] != graph.weight_dtype:
        notes.append(f"{e['quantization']}: vLLM does not quantize to it online: serve a published "
                     f"{e['quantization']} checkpoint of this model in its place (ModelOpt's, e.g. nvidia/...-FP4)")
    if hybrid_block:
        notes.append(f"no --block-size: vLLM raises a hybrid model's attention block to hold one recurrent state "
                     f"({hybrid_block} tokens here, as priced)")
    elif mla_block:
        notes.append(f"no --block-size: vLLM's {deployment.plan.memory['vllm_block_rule'][0]} backend picks its "
                     f"own block ({mla_block} tokens, as priced)")
    if scen.nodes > 1:
        flags, _, where = _multi_node_launch(scen, layout).partition(COMMENT)
        parts.append(flags.strip())
        notes.append(where)
    if replicas > 1:
        notes.append(f"x {replicas} replicas, one per {layout.width} GPU(s) (CUDA_VISIBLE_DEVICES), behind a load "
                     "balancer")
    return " ".join(parts) + "".join(COMMENT + n for n in notes)


COMMENT = "    # "      # a launch line's notes, each after all of its flags


def _format_flags(e: dict, graph: ModelGraph | None, cache_names: dict | None = None) -> list:
    """A launch line's --quantization (an online format other than the checkpoint's) and
    --kv-cache-dtype (a cache dtype other than auto, as the engine spells it: ``cache_names``)."""
    out = []
    if "quantization" in e and graph is not None and e["quantization"] != graph.weight_dtype:
        out.append(f"--quantization {QUANT_FLAG.get(e['quantization'], e['quantization'])}")
    if e.get("cache_dtype", "auto") != "auto":
        out.append(f"--kv-cache-dtype {(cache_names or {}).get(e['cache_dtype'], e['cache_dtype'])}")
    return out


SGLANG_KV_CACHE_DTYPE = {"fp8": "fp8_e4m3"}   # SGLang's --kv-cache-dtype choices: auto, fp8_e5m2, fp8_e4m3, ...
SGLANG_MAX_PREFILL_TOKENS = 16384               # SGLang's --max-prefill-tokens default (ServerArgs.max_prefill_tokens)


def sglang_command(scen: Scenario, layout: Layout, graph: ModelGraph | None, *, replicas: int = 1,
                   deployment=None) -> str:
    """The ``python -m sglang.launch_server`` command line of one SGLang engine (flags as
    sgl-project/sglang python/sglang/srt/server_args.py spells them; only those the layout
    sets). SGLang's --tp is every GPU of the engine: a layout of dp > 1 (an MoE model's
    data-parallel attention) is ``--tp tp x dp --dp dp --enable-dp-attention`` (attention
    data-parallel over dp ranks of tp GPUs each, the experts over all tp x dp), expert
    parallelism ``--ep-size tp x dp``; max_num_seqs is --max-running-requests, the token budget
    --chunked-prefill-size, each times dp (SGLang splits both over the DP-attention ranks; the
    layout's are a rank's); a dense model's dp ranks are SGLang's plain data-parallel replicas,
    ``--tp tp --dp dp``, each taking the limits as given; the radix (prefix) cache off, as the
    benchmark's prompts never share a prefix. Run ``replicas`` of them behind a load balancer.
    ``deployment`` (the one priced): --mem-fraction-static is its static share
    (``static_fraction_of``: SGLang's fraction holds the weights and KV cache only, vLLM's
    gpu_memory_utilization the activations and graphs too), --cuda-graph-max-bs its capture
    ceiling in requests a rank; without one, gpu_memory_utilization as given and SGLang's graphs."""
    repo = _model_repo(graph)
    e = scen.engine
    width = layout.tp * layout.dp
    # a dense model's dp ranks are replicas (its layers priced at the rank's tp): SGLang's plain --dp,
    # dp copies of a --tp engine; DP attention (--enable-dp-attention, --tp over every GPU) is for MoE
    attn_dp = layout.dp > 1 and (graph is None or is_moe(graph))
    parts = ["python -m sglang.launch_server", f"--model-path {repo or scen.model}",
             f"--tp {width if attn_dp else layout.tp}"]
    if layout.dp > 1:
        parts += [f"--dp {layout.dp}"] + (["--enable-dp-attention"] if attn_dp else [])
    if layout.ep:
        parts.append(f"--ep-size {width}")
    parts += _format_flags(e, graph, SGLANG_KV_CACHE_DTYPE)
    # SGLang divides both limits over the DP-attention ranks (server_args.py _handle_data_parallelism,
    # the scheduler's max_running_requests // dp_size, each only under --enable-dp-attention); the
    # layout's are each rank's, as priced; plain --dp replicas each take the limits as given
    per = layout.dp if attn_dp else 1
    seqs, chunk = e["max_num_seqs"] * per, e["max_num_batched_tokens"] * per
    static = static_fraction_of(deployment)
    parts += [f"--max-running-requests {seqs}", f"--chunked-prefill-size {chunk}",
              f"--context-length {e['max_model_len']}",
              f"--mem-fraction-static {e['gpu_memory_utilization'] if static is None else static}",
              "--disable-radix-cache"] + _remote_code_flag(graph)
    if int(e["max_num_batched_tokens"]) > SGLANG_MAX_PREFILL_TOKENS:
        # a prefill batch is also held to --max-prefill-tokens (default 16384, not divided over the
        # DP-attention ranks): a larger budget priced needs it raised to the rank's
        parts.append(f"--max-prefill-tokens {int(e['max_num_batched_tokens'])}")
    k = int(e["speculative"]["num_spec_tokens"]) if e.get("speculative") else 0
    capture = capture_tokens_of(deployment)
    if capture:     # SGLang's graphs count requests a rank (its capture list stops at the rank's pool)
        parts.append(f"--cuda-graph-max-bs {max(1, capture // (1 + k))}")
    if k:           # EAGLE over the model's own MTP layers: k draft steps, 1 + k verified a row
        parts += ["--speculative-algorithm EAGLE", f"--speculative-num-steps {k}", "--speculative-eagle-topk 1",
                  f"--speculative-num-draft-tokens {k + 1}"]
        # SGLang runs EAGLE without its overlap scheduler unless SGLANG_ENABLE_SPEC_V2 (server_args.py
        # _handle_speculative_decoding; environ.py EnvBool, False until 2026 releases turned it on);
        # the line was priced with the overlap (serve: async_scheduling on)
        parts.insert(0, "SGLANG_ENABLE_SPEC_V2=True")
    notes = []          # comments, after every flag (a flag after a '#' would be commented out)
    if static is not None:
        notes.append(f"--mem-fraction-static {static}: the weights and KV cache SGLang's fraction holds, as priced "
                     f"(gpu_memory_utilization {e['gpu_memory_utilization']} less the activation, CUDA-graph and "
                     "communication buffers it counts beside them)")
    if attn_dp:
        notes.append(f"--max-running-requests and --chunked-prefill-size: SGLang divides both over the {layout.dp} "
                     f"DP-attention ranks: {e['max_num_seqs']} requests and {e['max_num_batched_tokens']} tokens a rank")
    elif layout.dp > 1:
        notes.append(f"--dp {layout.dp}: {layout.dp} data-parallel replicas of --tp {layout.tp} behind SGLang's "
                     f"router ({width} GPUs), each with these limits (a dense model: no DP attention)")
    if e.get("quantization") in PREQUANTIZED and graph is not None and e["quantization"] != graph.weight_dtype:
        notes.append(f"{e['quantization']}: serve a published {e['quantization']} checkpoint of this model in its "
                     "place (ModelOpt's, e.g. nvidia/...-FP4); SGLang reads its quantization from the checkpoint")
    if scen.nodes > 1:
        others = "; ".join(f"node {k}: the same with --node-rank {k}" for k in range(1, scen.nodes))
        parts.append(f"--nnodes {scen.nodes} --node-rank 0 --dist-init-addr HEAD_IP:5000")
        notes.append(f"on the head node ({scen.fabric} between the {scen.nodes} nodes); {others}")
    if replicas > 1:
        notes.append(f"x {replicas} replicas, one per {width} GPU(s) (CUDA_VISIBLE_DEVICES), behind a load balancer")
    return " ".join(parts) + "".join(COMMENT + n for n in notes)


def launch_command(scen: Scenario, layout: Layout, graph: ModelGraph | None, *, replicas: int = 1,
                   hybrid_block: int = 0, deployment=None) -> str:
    """The engine's launch line: ``vllm serve ...`` or ``python -m sglang.launch_server ...``
    (``hybrid_block``: vLLM's, ``vllm_command``; ``deployment``: the one it was priced from)."""
    if layout.engine == "sglang":
        return sglang_command(scen, layout, graph, replicas=replicas, deployment=deployment)
    return vllm_command(scen, layout, graph, replicas=replicas, hybrid_block=hybrid_block, deployment=deployment)


def capture_tokens_of(dep) -> int:
    """The largest batch, in tokens, a deployment's plan priced as captured in a CUDA graph
    (resolve: the scenario's max_cudagraph_capture_size, else laws.capture_ceiling; 0: none
    captured, or no deployment given)."""
    if dep is None:
        return 0
    return int(dep.resolution.get("capture_tokens", 0) or 0)


def static_fraction_of(dep) -> float | None:
    """SGLang's --mem-fraction-static for what a deployment's plan priced: the share of HBM its
    weights and KV cache take, (weights + KV) / HBM (server_args.py: "mem_fraction_static is
    defined as (model weights + KV cache pool) / GPU memory capacity", the activations and CUDA
    graph buffers outside it), i.e. gpu_memory_utilization less the activation, CUDA-graph and
    communication buffers the plan holds beside them (resolve._memory), rounded down to 3 places
    (SGLang's own rounding). None without a deployment."""
    if dep is None:
        return None
    mem, hbm = dep.plan.memory, float(dep.chip.memory_gib) * 2 ** 30
    beside = sum(float(mem.get(k, 0.0) or 0.0) for k in ("activation_bytes", "cudagraph_bytes", "comm_buffer_bytes"))
    from .resolve import DEFAULT_GPU_MEMORY_UTILIZATION
    util = float(dep.scenario.engine.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
    return math.floor((util - beside / hbm) * 1000 + 1e-9) / 1000


def hybrid_block_of(dep) -> int:
    """The attention block a deployment's plan raised for its recurrent layers (vLLM's hybrid
    block, resolve.hybrid_block_size), 0 where none was raised or needed."""
    mem = dep.plan.memory
    return int(mem["block_size"]) if mem.get("hybrid_block_minimum", 0) else 0


def mla_block_of(dep) -> int:
    """The block vLLM's MLA backend picks itself for a deployment's plan where it is not the
    scenario's (none stated, or one its kernels cannot page: resolve.vllm_mla_block), else 0."""
    if dep is None or not dep.plan.memory.get("vllm_block_rule"):
        return 0
    block, stated = int(dep.plan.memory["block_size"]), (dep.scenario.engine or {}).get("block_size")
    return block if stated is None or int(stated) != block else 0


def _multi_node_launch(scen: Scenario, layout: Layout) -> str:
    """The flags and the per-node lines of an engine spanning ``scen.nodes`` nodes, as vLLM
    launches one: data-parallel ranks spread over the nodes (the head serves the API, the others
    run --headless from their first rank), or a tensor-parallel group wider than a node by vLLM's
    multiprocessing executor over the nodes (--nnodes, --node-rank, --master-addr; the others
    --headless), which keeps async scheduling on; a Ray cluster only for what neither covers."""
    nodes = scen.nodes
    if layout.tp <= scen.gpus_per_node and layout.dp % nodes == 0:
        local = layout.dp // nodes
        head = (f" --data-parallel-size-local {local} --data-parallel-address HEAD_IP"
                " --data-parallel-rpc-port 13345")
        others = "; ".join(f"node {k}: the same with --headless --data-parallel-start-rank {k * local}"
                           for k in range(1, nodes))
        return f"{head}    # on the head node ({scen.fabric} between the {nodes} nodes); {others}"
    if layout.dp == 1:
        # vLLM's multiprocessing executor across nodes (ParallelConfig nnodes/node_rank/master_addr,
        # vllm/config/parallel.py@840e797; docs/serving/parallelism_scaling.md "Running vLLM with
        # MultiProcessing"): Ray's executor would turn async scheduling off (vllm/config/vllm.py@09f030e:
        # only mp, uni and external_launcher keep it), which the line was priced with
        others = "; ".join(f"node {k}: the same with --node-rank {k} --headless" for k in range(1, nodes))
        return (f" --nnodes {nodes} --node-rank 0 --master-addr HEAD_IP    # on the head node ({scen.fabric} "
                f"between the {nodes} nodes); {others}")
    return (f" --distributed-executor-backend ray    # on the head of a Ray cluster of {nodes} nodes "
            f"({scen.fabric} between them; ray start --head, then ray start --address HEAD_IP:6379 on the others)")
