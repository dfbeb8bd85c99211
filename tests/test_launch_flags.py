"""The launch lines `jaxprice size` prints (launch.py) run what was priced, with flags the engines have.

Each test builds a line from a layout resolved by ``size.build_candidates`` (no search, no
pricing) and checks (a) the fix it is named for, and (b) every flag before the first '#' against
the vocabulary read in the engines' own sources (``VLLM_FLAGS``, ``SGLANG_FLAGS``; value forms:
the --kv-cache-dtype choices, the JSON configs, the quantization and speculative choices).

Sources (public repositories, the commit where the store reported one):
- vLLM: vllm-project/vllm vllm/engine/arg_utils.py@99d7eb5d (the CLI flags, --async-scheduling,
  --max-cudagraph-capture-size), vllm/config/cache.py@c1d86421 (CacheDType), vllm/config/compilation.py
  @ee525ce4 (cudagraph_mode parsed from its name; max_cudagraph_capture_size), vllm/config/vllm.py
  @09f030ea (_set_cudagraph_sizes: default min(max_num_seqs x (1 + k) x 2, 512); async scheduling only
  under the mp, uni and external_launcher executors), vllm/config/parallel.py@840e7972 (nnodes,
  node_rank, master_addr of the multiprocessing executor), vllm/config/speculative.py (MTPModelTypes
  holds "mtp"), vllm/model_executor/layers/quantization/__init__.py (QuantizationMethods: fp8,
  modelopt_fp4, mxfp4), docs/serving/data_parallel_deployment.md@01e4fce0 (--data-parallel-size-local,
  --data-parallel-address, --data-parallel-rpc-port, --headless, --data-parallel-start-rank),
  docs/serving/parallelism_scaling.md@096bd6a4 (--nnodes --node-rank --master-addr, --headless).
- SGLang: sgl-project/sglang python/sglang/srt/server_args.py (2026 text; the store reported no
  commit): add_cli_args, _handle_gpu_memory_settings (mem_fraction_static = (weights + KV pool) /
  GPU memory; cuda_graph_max_bs 256 at --tp < 4 on H100/H200), _handle_data_parallelism,
  _handle_speculative_decoding (overlap scheduler off for EAGLE unless SGLANG_ENABLE_SPEC_V2).
"""

from __future__ import annotations

import json
import shlex

import pytest

import jaxprice as jp
from jaxprice._src import launch
from jaxprice._src import layouts as L
from jaxprice._src import size as S

# flags (and whether they take a value) as the engines' parsers define them
VLLM_FLAGS = {
    "--tensor-parallel-size": True, "--data-parallel-size": True, "--enable-expert-parallel": False,
    "--quantization": True, "--kv-cache-dtype": True, "--max-num-seqs": True, "--max-num-batched-tokens": True,
    "--max-model-len": True, "--block-size": True, "--gpu-memory-utilization": True, "--compilation-config": True,
    "--no-enable-prefix-caching": False, "--trust-remote-code": False, "--speculative-config": True,
    "--data-parallel-size-local": True, "--data-parallel-address": True, "--data-parallel-rpc-port": True,
    "--headless": False, "--data-parallel-start-rank": True, "--nnodes": True, "--node-rank": True,
    "--master-addr": True, "--distributed-executor-backend": True,
}
VLLM_CACHE_DTYPES = {"auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"}
VLLM_GRAPH_MODES = {"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}
VLLM_QUANTIZATIONS = {"fp8", "modelopt_fp4", "mxfp4"}   # those launch.QUANT_FLAG writes, all QuantizationMethods
SGLANG_FLAGS = {
    "--model-path": True, "--tp": True, "--dp": True, "--enable-dp-attention": False, "--ep-size": True,
    "--quantization": True, "--kv-cache-dtype": True, "--max-running-requests": True, "--chunked-prefill-size": True,
    "--context-length": True, "--mem-fraction-static": True, "--disable-radix-cache": False,
    "--trust-remote-code": False, "--max-prefill-tokens": True, "--cuda-graph-max-bs": True,
    "--speculative-algorithm": True, "--speculative-num-steps": True, "--speculative-eagle-topk": True,
    "--speculative-num-draft-tokens": True, "--nnodes": True, "--node-rank": True, "--dist-init-addr": True,
}
SGLANG_CACHE_DTYPES = {"auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"}
SGLANG_QUANTIZATIONS = {"fp8", "modelopt_fp4", "mxfp4"}        # those launch.QUANT_FLAG writes, all in its choices
SGLANG_SPECULATIVE = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"}


def _flags(line: str) -> tuple[list, dict]:
    """(leading environment assignments, {flag: value or None}) of a line's command (before '#')."""
    words = shlex.split(line.split("    #")[0])
    env = []
    while "=" in words[0] and not words[0].startswith("-"):
        env.append(words.pop(0))
    words = words[3:]       # past `vllm serve MODEL` / `python -m sglang.launch_server`
    out, i = {}, 0
    while i < len(words):
        flag = words[i]
        assert flag.startswith("--") and flag not in out, (flag, line)
        takes = i + 1 < len(words) and not words[i + 1].startswith("--")
        out[flag] = words[i + 1] if takes else None
        i += 2 if takes else 1
    return env, out


def _check_vocabulary(line: str) -> tuple[list, dict]:
    """Every flag of the line is the engine's, with a value where it takes one, in its form."""
    env, flags = _flags(line)
    vllm = line.lstrip().split()[0] == "vllm"
    vocab = VLLM_FLAGS if vllm else SGLANG_FLAGS
    for flag, value in flags.items():
        assert flag in vocab, f"{flag} is not a checked {'vLLM' if vllm else 'SGLang'} flag: {line}"
        assert (value is not None) == vocab[flag], (flag, value)
    if vllm:
        assert flags.get("--kv-cache-dtype", "auto") in VLLM_CACHE_DTYPES
        assert flags.get("--quantization", "fp8") in VLLM_QUANTIZATIONS
        cc = json.loads(flags["--compilation-config"])
        assert cc["cudagraph_mode"] in VLLM_GRAPH_MODES and set(cc) <= {"cudagraph_mode", "max_cudagraph_capture_size"}
        if "--speculative-config" in flags:
            spec = json.loads(flags["--speculative-config"])
            assert spec["method"] == "mtp" and spec["num_speculative_tokens"] >= 1
        assert 0 < float(flags["--gpu-memory-utilization"]) <= 1
    else:
        assert flags.get("--kv-cache-dtype", "auto") in SGLANG_CACHE_DTYPES
        assert flags.get("--quantization", "fp8") in SGLANG_QUANTIZATIONS
        assert flags.get("--speculative-algorithm", "EAGLE") in SGLANG_SPECULATIVE
        assert 0 < float(flags["--mem-fraction-static"]) < 1
        assert all(e.split("=")[0] == "SGLANG_ENABLE_SPEC_V2" for e in env)
    return env, flags


@pytest.fixture(scope="module")
def reg():
    return jp.Registry()


def _built(reg, model, lay, chip="h200", gpus=8, fabric=None):
    graph = reg.model(model)
    (cand,) = S.build_candidates(model, graph, chip, gpus, [lay], isl=1024, osl=1024, registry=reg, fabric=fabric)
    assert cand.status == "ok", cand.reason
    dep = cand.deployment
    line = launch.launch_command(dep.scenario, lay, graph, hybrid_block=launch.hybrid_block_of(dep), deployment=dep)
    return dep, line


def test_vllm_line_pins_the_capture_ceiling_priced(reg):
    """A B200 (four-bit peak) engine of 512 sequences is priced with decode batches captured up to
    1024 tokens (laws.capture_ceiling); vLLM's default stops at 512 (vllm/config/vllm.py@09f030e
    _set_cudagraph_sizes), so steps of 513..1024 tokens ran without their graphs. The line states
    max_cudagraph_capture_size in --compilation-config (a CompilationConfig field) as the plan's."""
    lay = L.Layout(4, 1, False, "fp8", 512, 8192, "FULL_AND_PIECEWISE")
    dep, line = _built(reg, "llama-3.1-70b-instruct", lay, chip="b200")
    _env, flags = _check_vocabulary(line)
    cc = json.loads(flags["--compilation-config"])
    assert dep.resolution["capture_tokens"] == 1024
    assert cc == {"cudagraph_mode": "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": 1024}


def test_vllm_tp_wider_than_a_node_keeps_async_scheduling(reg):
    """TP 16 over two 8-GPU nodes: the line used Ray's executor, under which vLLM turns async
    scheduling off (vllm/config/vllm.py@09f030e: only mp, uni, external_launcher keep it) where the
    serving simulation priced it on; vLLM's multiprocessing executor spans nodes with --nnodes,
    --node-rank, --master-addr, the others --headless (docs/serving/parallelism_scaling.md)."""
    lay = L.Layout(16, 1, False, "fp8", 256, 8192, "FULL_AND_PIECEWISE")
    dep, line = _built(reg, "llama-3.1-70b-instruct", lay, gpus=16, fabric="ib-400g")
    assert dep.scenario.nodes == 2
    _env, flags = _check_vocabulary(line)
    assert (flags["--nnodes"], flags["--node-rank"], flags["--master-addr"]) == ("2", "0", "HEAD_IP")
    assert "--distributed-executor-backend" not in flags and "--tensor-parallel-size" in flags
    notes = line.split("    #", 1)[1]
    assert "node 1: the same with --node-rank 1 --headless" in notes and "ib-400g" in notes


def test_sglang_mem_fraction_static_holds_the_kv_priced(reg):
    """SGLang's --mem-fraction-static is (weights + KV pool) / GPU memory, the activations and CUDA
    graphs outside it (server_args.py _handle_gpu_memory_settings); the line passed vLLM's
    gpu_memory_utilization 0.9 (which holds them too), so SGLang's pool was larger than priced and
    its activations had the rest. The fraction stated now holds the weights and the KV priced."""
    lay = L.Layout(8, 1, False, "fp8", 256, 8192, L.SGLANG_GRAPH_MODE, "sglang")
    dep, line = _built(reg, "deepseek-v3", lay)
    _env, flags = _check_vocabulary(line)
    frac = float(flags["--mem-fraction-static"])
    mem, hbm = dep.plan.memory, dep.chip.memory_gib * 2 ** 30
    kv_tokens = (frac * hbm - mem["weights_bytes"]) / mem["kv_bytes_per_token"]
    assert frac < dep.scenario.engine["gpu_memory_utilization"] == 0.9
    # within SGLang's 3-decimal rounding (0.001 of HBM) below the plan's KV capacity
    assert 0 <= mem["kv_capacity_tokens"] - kv_tokens < 0.001 * hbm / mem["kv_bytes_per_token"]
    assert f"--mem-fraction-static {frac}: the weights and KV cache" in line


def test_sglang_line_pins_the_graph_batch_priced(reg):
    """SGLang's --cuda-graph-max-bs defaults to 256 at --tp < 4 on an H100 (server_args.py), where a
    512-request engine was priced with decode batches captured to 512 tokens; with MTP (1 + k tokens
    a row) the ceiling in requests is capture_tokens // (1 + k)."""
    lay = L.Layout(2, 1, False, "fp8", 512, 8192, L.SGLANG_GRAPH_MODE, "sglang")
    dep, line = _built(reg, "llama-3.1-70b-instruct", lay, chip="h100", gpus=2)
    _env, flags = _check_vocabulary(line)
    assert dep.resolution["capture_tokens"] == 512 and flags["--cuda-graph-max-bs"] == "512"
    spec = L.Layout(8, 1, False, "fp8", 256, 8192, L.SGLANG_GRAPH_MODE, "sglang", 2)
    dep, line = _built(reg, "deepseek-v3", spec)
    _env, flags = _check_vocabulary(line)
    assert int(flags["--cuda-graph-max-bs"]) == dep.resolution["capture_tokens"] // 3 == 170


def test_sglang_speculative_line_runs_the_overlap_scheduler_priced(reg):
    """SGLang turns its overlap scheduler off for EAGLE unless SGLANG_ENABLE_SPEC_V2 is set
    (server_args.py _handle_speculative_decoding; the variable defaults False before the 2026
    releases); the serving simulation prices the overlap on. The speculating line sets it, the
    others do not."""
    spec = L.Layout(8, 1, False, "fp8", 256, 8192, L.SGLANG_GRAPH_MODE, "sglang", 2)
    _dep, line = _built(reg, "deepseek-v3", spec)
    env, flags = _check_vocabulary(line)
    assert line.startswith("SGLANG_ENABLE_SPEC_V2=True python -m sglang.launch_server ")
    assert env == ["SGLANG_ENABLE_SPEC_V2=True"]
    assert (flags["--speculative-algorithm"], flags["--speculative-num-steps"], flags["--speculative-eagle-topk"],
            flags["--speculative-num-draft-tokens"]) == ("EAGLE", "2", "1", "3")
    plain = L.Layout(1, 8, True, "fp8", 256, 8192, L.SGLANG_GRAPH_MODE, "sglang")
    _dep, line = _built(reg, "deepseek-v3", plain)
    env, flags = _check_vocabulary(line)
    assert env == [] and line.startswith("python -m sglang.launch_server ")
    assert (flags["--tp"], flags["--dp"], flags["--ep-size"]) == ("8", "8", "8") and "--enable-dp-attention" in flags


def test_sglang_budget_above_its_prefill_cap_raises_it(reg):
    """SGLang also holds a prefill batch to --max-prefill-tokens (default 16384, per rank: only
    --chunked-prefill-size is divided over the DP-attention ranks); a 32768-token budget priced
    ran as 16384. The line raises it to the rank's budget; at 8192 it states nothing."""
    big = L.Layout(1, 8, True, "fp8", 256, 32768, L.SGLANG_GRAPH_MODE, "sglang")
    _dep, line = _built(reg, "deepseek-v3", big)
    _env, flags = _check_vocabulary(line)
    assert flags["--max-prefill-tokens"] == "32768" and flags["--chunked-prefill-size"] == str(8 * 32768)
    small = L.Layout(1, 8, True, "fp8", 256, 8192, L.SGLANG_GRAPH_MODE, "sglang")
    _dep, line = _built(reg, "deepseek-v3", small)
    _env, flags = _check_vocabulary(line)
    assert "--max-prefill-tokens" not in flags and flags["--chunked-prefill-size"] == str(8 * 8192)
