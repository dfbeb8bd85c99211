"""InferenceX's published engine recipes beyond accuracy.IX_RECIPES: SGLang and TensorRT-LLM
runs, and vLLM runs of the catalog models the dev set has none of (Llama-3.1-70B).

Read, not fitted: each entry names the script it was read from as
``SemiAnalysisAI/InferenceX <path>@<commit>`` (the stored version the tools returned; HEAD of the
``benchmarks/single_node/fixed_seq_len`` folder is 8eec0d4, older flat ``benchmarks/*_slurm.sh`` /
``*_docker.sh`` scripts where no newer one exists). Keys: (scheduler, model, chips, dtype), the
scheduler as accuracy.ENGINE_SCHEDULER names it ('vllm', 'sglang', 'trtllm'), with '-mtp' for
the script a point measured with speculative decoding ran (``*_mtp.sh``; such a point with no MTP
script read takes the plain one, said so: COVERAGE LIMIT [mtp-recipe]); deepseek-v3 is the graph
DeepSeek-R1 (InferenceX's "dsr1") runs on, llama-3.1-70b-instruct InferenceX's "70b".
Disaggregated and multi-node recipes (dynamo-*, *-disagg), agentic and offline scripts and AMD
ones are not read; nor is any vLLM recipe for DeepSeek-R1, GLM-5 or Qwen3.5 (none in
fixed_seq_len), nor TensorRT-LLM's MiniMax-M2.5 scripts (not in the store).

Values are those of accuracy.IX_RECIPES (max_num_seqs, max_num_batched_tokens,
gpu_memory_utilization, cache_dtype, block_size, num_prompts, source, cudagraph_mode), with rules
that depend on the point resolved here (``engine_recipe`` returns concrete numbers): "C" (the
client concurrency), "2*isl", "trt_tokens" (the DeepSeek-R1 TensorRT-LLM scripts' max_num_tokens,
max(8192, ceil((C + ISL + 64) / 64) x 64)), "max_model_len" (isl + osl + 256: InferenceX's
MAX_MODEL_LEN, which the Llama TensorRT-LLM scripts pass as max_num_tokens), the MTP scripts'
"trt_mtp_tokens" / "dsv4_trt_mtp_tokens" (from the resolved max_batch_size and the script's
``mtp_layers``), "C/8"-style per-rank batches under DP attention, and ``cases``: flags a script
sets only where its tp, ep, dp (DP attention: dp > 1), isl/osl or C match (``when``; applied in
order, each named in the point's source).

How the engines' flags map onto the simulation's (vLLM-named) settings:

* SGLang: --max-running-requests -> max_num_seqs (unset: None, the harness's stated fallback);
  --chunked-prefill-size -> max_num_batched_tokens (the prefill chunk budget the serving layer's
  ``sglang`` scheduler admits prefills under; unset: None, SGLang's default by GPU memory,
  serve._sglang_chunk); --mem-fraction-static -> gpu_memory_utilization (see below);
  --kv-cache-dtype fp8_e4m3 -> 'fp8', unset -> 'auto' (the model's activation dtype, bf16);
  --num-prompts $((CONC * 10)) -> '10*C' in every script read.
  KNOWN DIVERGENCE [sglang-mem-fraction]: SGLang's mem_fraction_static is, like vLLM's gmu, a share
  of the GPU's whole memory holding the weights and the KV pool (its pool: the memory free after
  loading the weights less (1 - mem_fraction_static) of the total), but SGLang keeps activations
  and CUDA graphs in the (1 - f) rest, where vLLM and this memory model subtract them inside the
  share (resolve._memory: kv = gmu x HBM - weights - activations - graphs - comm): at gmu = f the
  simulated pool is smaller than SGLang's by those buffers (a few GiB per GPU).
  --max-prefill-tokens (equal to the chunk in every script read), --schedule-conservativeness,
  --scheduler-recv-interval, --stream-interval and --cuda-graph-max-bs are not modelled
  (COVERAGE LIMIT [other-engine-schedulers], serve.py).
  COVERAGE LIMIT [sglang-page-size]: no script sets --page-size; SGLang's page is 1 token with
  flashinfer and the attention backend's own with trtllm_mla / NSA; the simulation keeps its block
  size (vLLM's 16, 64 for glm-5's sparse MLA), which changes a request's KV by under one block.
  With DP attention (the dp column > 1) SGLang splits --max-running-requests over the dp ranks;
  the harness gives each rank the recipe's limit (it binds only above C / dp, never in the
  recipes read).
* TensorRT-LLM: --max_num_tokens -> max_num_batched_tokens; --max_batch_size ->
  max_num_seqs (unset: None; trtllm-serve's default differs by version, 2048 in the LLM API,
  and the harness's stated fallback 1024 is above every C swept); kv_cache_config.dtype ->
  cache_dtype (fp8, or 'auto'); --num-prompts $(( $CONC * 10 )) -> '10*C' everywhere;
  kv_cache_config.free_gpu_memory_fraction f (default 0.9) -> gpu_memory_utilization g with the
  same KV pool: TensorRT-LLM gives the KV cache f of the memory free after the weights and
  buffers, f x (HBM - fixed); this memory model gives g x HBM - fixed; so
  g = f + (1 - f) x fixed / HBM, fixed = the deployment's weights, activation, CUDA-graph and
  communication bytes per GPU (plan.memory, the point's deployment as accuracy.build_deployment
  resolves it with the bundled registry), said so in the source with both numbers; where that
  deployment cannot be resolved, g = f (KNOWN DIVERGENCE [trt-free-fraction]: a pool smaller by
  (1 - f) x fixed). cuda_graph_config.max_batch_size, batch_wait_*, enable_attention_dp's
  balancing, the MoE backend and piecewise graphs are not modelled.
  KNOWN DIVERGENCE [trt-capacity-policy]: the qwen3.5 fp4 B200 script runs
  capacity_scheduler_policy MAX_UTILIZATION with chunked prefill off; the serving layer's
  ``trtllm`` scheduler follows GUARANTEED_NO_EVICT (reservation to completion).
* vLLM: as accuracy.IX_RECIPES. The Llama-3.1-70B scripts set max-model-len (ISL + OSL + 20 at
  1k1k, + 200 at 8k); the harness keeps isl + osl + 256 (it only bounds a request).
* KNOWN DIVERGENCE [recipe-context-length]: the qwen3.5 SGLang scripts pass --context-length
  ISL + OSL + 20; the harness's max_model_len is isl + osl + 256 (accuracy._engine_settings).
"""
from __future__ import annotations

import math

IX = "SemiAnalysisAI/InferenceX"
FSL = f"{IX} benchmarks/single_node/fixed_seq_len"
SN = f"{IX} benchmarks/single_node"
FLAT = f"{IX} benchmarks"
TEN_C = "--num-prompts $((CONC * 10))"
TRT_TOKENS = ("max_num_tokens max(8192, ceil((C + ISL + 64) / 64) x 64) "
              "(MAX_NUM_TOKENS=$(( (CONC + ISL + 64 + 63) / 64 * 64 )), at least 8192)")
TRT_FREE_DEFAULT = 0.9       # KvCacheConfig.free_gpu_memory_fraction default (TensorRT-LLM LLM API docs)


def _r(max_num_seqs=None, max_num_batched_tokens=None, gpu_memory_utilization=0.9, cache_dtype="auto",
       block_size=None, num_prompts="10*C", cases=(), **extra):
    """One recipe entry (the accuracy.IX_RECIPES fields, ``cases``, and for TensorRT-LLM
    ``kv_free_fraction`` in place of gpu_memory_utilization)."""
    return dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                gpu_memory_utilization=gpu_memory_utilization, cache_dtype=cache_dtype, block_size=block_size,
                num_prompts=num_prompts, cases=tuple(cases), **extra)


# (scheduler, model, chips, dtype) -> recipe. vLLM entries here never shadow accuracy.IX_RECIPES,
# which recipe_for reads first.
IX_ENGINE_RECIPES = {
    # ------------------------------------------------------------------ SGLang
    ("sglang", "deepseek-v3", ("h200",), "fp8"): _r(
        max_num_seqs=256, max_num_batched_tokens=32768, gpu_memory_utilization=0.82, cache_dtype="auto",
        cases=(dict(when=dict(isl=1024, osl=1024), set=dict(max_num_seqs=512),
                    note="1k1k: --max-running-requests 512"),),
        source=f"{FSL}/dsr1_fp8_h200.sh@8eec0d4: --max-running-requests 512 at 1k1k else 256, "
               "--chunked-prefill-size 32768 (--max-prefill-tokens 32768), --mem-fraction-static 0.82, no "
               f"kv-cache-dtype flag, flashinfer attention, radix cache off, {TEN_C}"),
    ("sglang", "deepseek-v3", ("b200",), "fp8"): _r(
        max_num_seqs=128, max_num_batched_tokens=32768, gpu_memory_utilization=0.82, cache_dtype="fp8",
        cases=(dict(when=dict(tp=4), set=dict(max_num_seqs=32, max_num_batched_tokens=8192,
                                              gpu_memory_utilization=0.95),
                    note="TP 4 (8k1k only): 32 running requests, chunk 8192, mem-fraction 0.95"),),
        source=f"{FSL}/dsr1_fp8_b200.sh@432945d: TP 8: --max-running-requests 128, --chunked-prefill-size "
               "32768, --mem-fraction-static 0.82; TP 4 (8k1k only): 32, 8192, 0.95; --kv-cache-dtype fp8_e4m3, "
               f"trtllm_mla attention, radix cache off, {TEN_C}"),
    ("sglang", "deepseek-v3", ("b300",), "fp8"): _r(
        max_num_seqs=128, max_num_batched_tokens=32768, gpu_memory_utilization=0.82, cache_dtype="fp8",
        cases=(dict(when=dict(tp=4), set=dict(max_num_seqs=32, max_num_batched_tokens=8192,
                                              gpu_memory_utilization=0.95),
                    note="TP 4 (8k1k only): 32 running requests, chunk 8192, mem-fraction 0.95"),),
        source=f"{FSL}/dsr1_fp8_b300.sh@8eec0d4 (the B200 recipe as is): TP 8: --max-running-requests 128, "
               "--chunked-prefill-size 32768, --mem-fraction-static 0.82; TP 4: 32, 8192, 0.95; --kv-cache-dtype "
               f"fp8_e4m3, {TEN_C}"),
    ("sglang", "deepseek-v3", ("b200",), "fp4"): _r(
        max_num_seqs=256, max_num_batched_tokens=16384, gpu_memory_utilization=0.85, cache_dtype="fp8",
        cases=(dict(when=dict(dp_attention=True), set=dict(max_num_batched_tokens=32768),
                    note="DP attention (dp > 1): chunk 32768"),),
        source=f"{FSL}/dsr1_fp4_b200.sh@25cbe71: --max-running-requests 256, --mem-fraction-static 0.85, "
               "--kv-cache-dtype fp8_e4m3, --chunked-prefill-size 16384 (32768 with DP attention, which also "
               f"sets --schedule-conservativeness 3.33 and the prefill delayer, not modelled), {TEN_C}"),
    ("sglang", "deepseek-v3", ("b300",), "fp4"): _r(
        max_num_seqs=256, max_num_batched_tokens=16384, gpu_memory_utilization=0.85, cache_dtype="fp8",
        source=f"{FSL}/dsr1_fp4_b300.sh@8eec0d4 (the B200 recipe as is): --max-running-requests 256, "
               f"--mem-fraction-static 0.85, --kv-cache-dtype fp8_e4m3, --chunked-prefill-size 16384, {TEN_C}"),
    ("sglang", "glm-5", ("h200",), "fp8"): _r(
        gpu_memory_utilization=0.85, cache_dtype="auto",
        source=f"{FSL}/glm5_fp8_h200.sh@8eec0d4: --mem-fraction-static 0.85 only: no max-running-requests, "
               f"chunked-prefill-size or kv-cache-dtype flag (SGLang's defaults), {TEN_C}"),
    ("sglang", "glm-5", ("b200",), "fp8"): _r(
        max_num_seqs="C", max_num_batched_tokens=32768, gpu_memory_utilization=0.85, cache_dtype="fp8",
        source=f"{FSL}/glm5_fp8_b200.sh@8eec0d4: --max-running-requests $CONC, --chunked-prefill-size 32768, "
               f"--mem-fraction-static 0.85, --kv-cache-dtype fp8_e4m3, NSA attention, radix cache off, {TEN_C}"),
    ("sglang", "glm-5", ("b300",), "fp8"): _r(
        max_num_seqs="C", max_num_batched_tokens=32768, gpu_memory_utilization=0.85, cache_dtype="fp8",
        source=f"{FSL}/glm5_fp8_b300.sh@1d76594 (the B200 recipe): --max-running-requests $CONC, "
               f"--chunked-prefill-size 32768, --mem-fraction-static 0.85, --kv-cache-dtype fp8_e4m3, {TEN_C}"),
    ("sglang", "glm-5", ("b200",), "fp4"): _r(
        max_num_batched_tokens=32768, gpu_memory_utilization=0.9, cache_dtype="fp8",
        source=f"{FSL}/glm5_fp4_b200.sh@8eec0d4: --chunked-prefill-size 32768, --mem-fraction-static 0.9, "
               f"--kv-cache-dtype fp8_e4m3, no max-running-requests flag, {TEN_C}"),
    ("sglang", "glm-5", ("b300",), "fp4"): _r(
        max_num_batched_tokens=32768, gpu_memory_utilization=0.9, cache_dtype="fp8",
        source=f"{FSL}/glm5_fp4_b300.sh@8eec0d4 (the B200 recipe as is): --chunked-prefill-size 32768, "
               f"--mem-fraction-static 0.9, --kv-cache-dtype fp8_e4m3, no max-running-requests flag, {TEN_C}"),
    ("sglang", "qwen3.5-397b-a17b", ("b200",), "fp8"): _r(
        max_num_batched_tokens=8192, gpu_memory_utilization=0.8, cache_dtype="fp8",
        source=f"{FSL}/qwen3.5_fp8_b200.sh@36e26b6: --chunked-prefill-size 8192, --mem-fraction-static 0.8, "
               "--kv-cache-dtype fp8_e4m3 (mamba state bf16), no max-running-requests flag, --context-length "
               f"ISL + OSL + 20, {TEN_C}"),
    ("sglang", "qwen3.5-397b-a17b", ("b300",), "fp8"): _r(
        max_num_seqs="C", max_num_batched_tokens=16384, gpu_memory_utilization=0.8, cache_dtype="fp8",
        source=f"{FSL}/qwen3.5_fp8_b300.sh@1534ee2: --max-running-requests $CONC, --chunked-prefill-size 16384, "
               f"--mem-fraction-static 0.8, --kv-cache-dtype fp8_e4m3, --context-length ISL + OSL + 20, {TEN_C}"),
    ("sglang", "qwen3.5-397b-a17b", ("b200",), "fp4"): _r(
        max_num_batched_tokens=16384, gpu_memory_utilization=0.8, cache_dtype="fp8",
        source=f"{FSL}/qwen3.5_fp4_b200.sh@8eec0d4: --chunked-prefill-size 16384, --mem-fraction-static 0.8, "
               "--kv-cache-dtype fp8_e4m3, no max-running-requests flag, --context-length ISL + OSL + 20, "
               f"{TEN_C}"),
    ("sglang", "qwen3.5-397b-a17b", ("b300",), "fp4"): _r(
        max_num_seqs=128, max_num_batched_tokens=32768, gpu_memory_utilization=0.8, cache_dtype="fp8",
        source=f"{FSL}/qwen3.5_fp4_b300.sh@8eec0d4: --max-running-requests 128, --chunked-prefill-size 32768, "
               "--mem-fraction-static 0.8, --kv-cache-dtype fp8_e4m3, mamba scheduler no_buffer, --context-length "
               f"ISL + OSL + 20, {TEN_C}"),
    ("sglang", "qwen3.5-397b-a17b", ("b200",), "bf16"): _r(
        max_num_seqs=128, max_num_batched_tokens=32768, gpu_memory_utilization=0.82, cache_dtype="auto",
        source=f"{FSL}/qwen3.5_bf16_b200.sh@8eec0d4: --max-running-requests 128, --chunked-prefill-size 32768, "
               f"--mem-fraction-static 0.82, no kv-cache-dtype flag, --context-length ISL + OSL + 20, {TEN_C}"),
    ("sglang", "qwen3.5-397b-a17b", ("b300",), "bf16"): _r(
        max_num_seqs=128, max_num_batched_tokens=32768, gpu_memory_utilization=0.82, cache_dtype="auto",
        source=f"{FSL}/qwen3.5_bf16_b300.sh@f89cdfe (the B200 recipe): --max-running-requests 128, "
               f"--chunked-prefill-size 32768, --mem-fraction-static 0.82, no kv-cache-dtype flag, {TEN_C}"),
    ("sglang", "qwen3.5-397b-a17b", ("h200",), "fp8"): _r(
        max_num_seqs=128, max_num_batched_tokens=16384, gpu_memory_utilization=0.8, cache_dtype="fp8",
        source=f"{FSL}/qwen3.5_fp8_h200.sh@8eec0d4: --max-running-requests 128, --chunked-prefill-size 16384, "
               "--mem-fraction-static 0.8, --kv-cache-dtype fp8_e4m3, flashinfer attention, --context-length "
               f"ISL + OSL + 20, {TEN_C}"),
    ("sglang", "qwen3.5-397b-a17b", ("h100",), "fp8"): _r(
        max_num_seqs=256, max_num_batched_tokens=16384, gpu_memory_utilization=0.8, cache_dtype="fp8",
        source=f"{FSL}/qwen3.5_fp8_h100.sh@5ce3409: --max-running-requests 256, --chunked-prefill-size 16384, "
               "--mem-fraction-static 0.8, --kv-cache-dtype fp8_e4m3, --scheduler-recv-interval by C (not "
               f"modelled), --context-length ISL + OSL + 20, {TEN_C}"),
    # DeepSeek-V4-Pro: no --kv-cache-dtype flag; COVERAGE LIMIT [sglang-dsv4-cache]: SGLang's own
    # DeepSeek-V4 cache format (and its --swa-full-tokens-ratio) is not read: 'auto' (bf16) assumed
    ("sglang", "deepseek-v4-pro", ("h200",), "fp8"): _r(
        max_num_seqs="max(8,3C/2)", max_num_batched_tokens=4096, gpu_memory_utilization=0.88, cache_dtype="auto",
        source=f"{FSL}/dsv4_fp8_h200_sglang.sh@8eec0d4: --chunked-prefill-size 4096, --mem-fraction-static 0.88, "
               "--max-running-requests max(8, 3C / 2), no kv-cache-dtype flag, radix cache off, marlin MoE, "
               f"{TEN_C}"),
    ("sglang", "deepseek-v4-pro", ("b300",), "fp4"): _r(
        max_num_seqs="max(8,3C/2)", max_num_batched_tokens=8192, gpu_memory_utilization=0.90, cache_dtype="auto",
        cases=(dict(when=dict(concurrency=512), set=dict(gpu_memory_utilization=0.94, max_num_batched_tokens=16384),
                    note="C = 512 (DP attention): mem-fraction 0.94, chunk 16384"),
               dict(when=dict(concurrency=2048), set=dict(gpu_memory_utilization=0.87, max_num_batched_tokens=16384,
                                                          max_num_seqs=2560),
                    note="C = 2048 (DP attention, megamoe): mem-fraction 0.87, chunk 16384, 2560 running"),
               dict(when=dict(concurrency=8192), set=dict(gpu_memory_utilization=0.80, max_num_batched_tokens=16384,
                                                          max_num_seqs=8192),
                    note="C = 8192 (DP attention, megamoe): mem-fraction 0.80, chunk 16384, 8192 running")),
        source=f"{FSL}/dsv4_fp4_b300_sglang.sh@1bdee89: per-C profiles (C in 1, 32, 512, 2048, 8192; others "
               "refused by the script): C = 1 or 32 TP only, --mem-fraction-static 0.90, --chunked-prefill-size "
               "8192; C = 512 DP attention 0.94, 16384; C = 2048 0.87, 16384, 2560 running; C = 8192 0.80, 16384, "
               "8192 running; else --max-running-requests max(8, 3C / 2); --enable-mixed-chunk (KNOWN DIVERGENCE: "
               "the sglang scheduler here runs prefill-first steps), --swa-full-tokens-ratio by C and ISL (not "
               f"modelled), no kv-cache-dtype flag, {TEN_C}"),
    # ------------------------------------------------------------------ TensorRT-LLM
    ("trtllm", "deepseek-v3", ("h200",), "fp8"): _r(
        max_num_batched_tokens="trt_tokens", kv_free_fraction=0.75, cache_dtype="fp8",
        source=f"{FSL}/dsr1_fp8_h200_trt.sh@8eec0d4: {TRT_TOKENS}, kv_cache_config dtype fp8, "
               "free_gpu_memory_fraction 0.75, no max_batch_size (CUDA graphs up to 128), block reuse off, "
               "(--num-prompts $(( $CONC * 10 )))"),
    ("trtllm", "deepseek-v3", ("b200",), "fp8"): _r(
        max_num_batched_tokens="trt_tokens", kv_free_fraction=0.8, cache_dtype="fp8",
        cases=(dict(when=dict(isl=8192, osl=1024, tp=4), set=dict(kv_free_fraction=0.75),
                    note="8k1k at TP 4: free_gpu_memory_fraction 0.75"),),
        source=f"{FSL}/dsr1_fp8_b200_trt.sh@8eec0d4: {TRT_TOKENS}, kv_cache_config dtype fp8, "
               "free_gpu_memory_fraction 0.8 (0.75 at 8k1k with TP 4), no max_batch_size, batch waiting at 1k1k "
               "C >= 64 (not modelled), (--num-prompts $(( $CONC * 10 )))"),
    ("trtllm", "deepseek-v3", ("b200",), "fp4"): _r(
        max_num_batched_tokens="trt_tokens", kv_free_fraction=0.8, cache_dtype="fp8",
        source=f"{FSL}/dsr1_fp4_b200_trt.sh@8eec0d4: {TRT_TOKENS}, kv_cache_config dtype fp8, "
               "free_gpu_memory_fraction 0.8, no max_batch_size, (--num-prompts $(( $CONC * 10 )))"),
    ("trtllm", "gpt-oss-120b", ("h200",), "fp4"): _r(
        max_num_seqs="C", max_num_batched_tokens=20000, kv_free_fraction=0.85, cache_dtype="auto",
        source=f"{FSL}/gptoss_fp4_h200_trt.sh@8eec0d4: --max_batch_size $CONC, --max_num_tokens 20000, "
               "kv_cache_config dtype auto, free_gpu_memory_fraction 0.85, (--num-prompts $(( $CONC * 10 )))"),
    ("trtllm", "gpt-oss-120b", ("b200",), "fp4"): _r(
        max_num_seqs=512, max_num_batched_tokens=20000, kv_free_fraction=0.85, cache_dtype="fp8",
        source=f"{SN}/gptoss_fp4_b200_trt.sh@34bc7c4: --max_batch_size 512, --max_num_tokens 20000, "
               "kv_cache_config dtype fp8, free_gpu_memory_fraction 0.85, block reuse off, "
               "(--num-prompts $(( $CONC * 10 )))"),
    ("trtllm", "llama-3.1-70b-instruct", ("h200",), "fp8"): _r(
        max_num_batched_tokens="max_model_len", kv_free_fraction=TRT_FREE_DEFAULT, cache_dtype="fp8",
        source=f"{FLAT}/70b_fp8_h200_trt_slurm.sh@73ef922: --max_num_tokens $MAX_MODEL_LEN (isl + osl + 256), "
               "kv_cache_config dtype fp8 (free_gpu_memory_fraction not set: TensorRT-LLM's default 0.9), no "
               "max_batch_size (CUDA graphs up to 1024), batch waiting at 1k1k below TP 8 (not modelled), "
               "(--num-prompts $(( $CONC * 10 )))"),
    ("trtllm", "llama-3.1-70b-instruct", ("b200",), "fp8"): _r(
        max_num_batched_tokens=16384, kv_free_fraction=TRT_FREE_DEFAULT, cache_dtype="fp8",
        source=f"{FLAT}/70b_fp8_b200_trt_slurm.sh@a267b4b: --max_num_tokens 16384, kv_cache_config dtype fp8 "
               "(free_gpu_memory_fraction not set: default 0.9), no max_batch_size, "
               "(--num-prompts $(( $CONC * 10 )))"),
    ("trtllm", "llama-3.1-70b-instruct", ("b200",), "fp4"): _r(
        max_num_batched_tokens="max_model_len", kv_free_fraction=TRT_FREE_DEFAULT, cache_dtype="fp8",
        source=f"{FLAT}/70b_fp4_b200_trt_slurm.sh@73ef922: --max_num_tokens $MAX_MODEL_LEN (isl + osl + 256), "
               "kv_cache_config dtype fp8 (free_gpu_memory_fraction not set: default 0.9), no max_batch_size, "
               "(--num-prompts $(( $CONC * 10 )))"),
    ("trtllm", "qwen3.5-397b-a17b", ("b200",), "fp4"): _r(
        max_num_seqs=512, max_num_batched_tokens="qwen_trt_tokens", kv_free_fraction=0.9, cache_dtype="fp8",
        cases=(dict(when=dict(tp=2), set=dict(max_num_seqs=256), note="TP 2: --max_batch_size 256"),
               dict(when=dict(tp=2, ep=2, min_c=32), set=dict(max_num_seqs=32),
                    note="TP 2 / EP 2 at C >= 32: --max_batch_size 32"),
               dict(when=dict(tp=1), set=dict(max_num_seqs="max(C,16)"), note="TP 1: --max_batch_size max(C, 16)"),
               dict(when=dict(dp_attention=True), set=dict(max_num_seqs="dp_attention_batch"),
                    note="DP attention: --max_batch_size 256 at TP 4, 128 at TP 8")),
        source=f"{FSL}/qwen3.5_fp4_b200_trt.sh@23a08a2: --max_num_tokens 32768 at 8k1k, 16384 at 1k1k, else "
               "max(8192, ISL + OSL + 256); --max_batch_size 512 at TP >= 4 (TP 2: 256, or 32 with EP 2 at C >= "
               "32; DP attention: 256 at TP 4, 128 at TP 8); kv_cache_config dtype fp8, free_gpu_memory_fraction "
               "0.9; capacity_scheduler_policy MAX_UTILIZATION and enable_chunked_prefill false (KNOWN DIVERGENCE "
               "[trt-capacity-policy]), (--num-prompts \"$(( CONC * 10 ))\")"),
    ("trtllm", "deepseek-v4-pro", ("b200",), "fp4"): _r(
        max_num_seqs="max(C,16)", max_num_batched_tokens="max(8192,isl+osl+256)", kv_free_fraction=0.9,
        cache_dtype="fp8", block_size=128,
        cases=(dict(when=dict(dp_attention=True), set=dict(kv_free_fraction=0.7),
                    note="DP attention: free_gpu_memory_fraction 0.7"),),
        source=f"{FSL}/dsv4_fp4_b200_trt.sh@0f9b6c5: --max_batch_size max(C, 16), --max_num_tokens max(8192, "
               "ISL + OSL + 256), kv_cache_config dtype fp8, tokens_per_block 128, free_gpu_memory_fraction 0.9 "
               "(0.7 with DP attention), MoE backend by C (not modelled), (--num-prompts \"$(( CONC * 10 ))\")"),
    ("trtllm", "deepseek-v4-pro", ("b300",), "fp4"): _r(
        max_num_seqs="max(C,16)", max_num_batched_tokens="max(8192,isl+osl+256)", kv_free_fraction=0.5,
        cache_dtype="fp8", block_size=128,
        source=f"{FSL}/dsv4_fp4_b300_trt.sh@6cf1ad3: --max_batch_size max(C, 16), --max_num_tokens max(8192, "
               "ISL + OSL + 256), kv_cache_config dtype fp8, tokens_per_block 128, free_gpu_memory_fraction 0.50, "
               "(--num-prompts \"$(( CONC * 10 ))\")"),
    # ------------------------------------------------------------------ MTP scripts (speculative points)
    # key scheduler "<engine>-mtp": the script a point measured with speculative decoding ran; the
    # draft count itself is accuracy.IX_SPEC_RECIPES' (mtp_layers here only sizes max_num_tokens)
    ("sglang-mtp", "deepseek-v3", ("b200", "b300"), "fp8"): _r(
        max_num_seqs=512, max_num_batched_tokens=16384, gpu_memory_utilization=0.82, cache_dtype="fp8",
        source=f"{FSL}/dsr1_fp8_b200_mtp.sh@8eec0d4 (b300: dsr1_fp8_b300_mtp.sh@8eec0d4, the B200 recipe as is; TP 8 "
               "only): --max-running-requests 512, --chunked-prefill-size 16384, --mem-fraction-static 0.82, "
               f"--kv-cache-dtype fp8_e4m3, EAGLE 2 steps / 3 draft tokens, {TEN_C}"),
    ("sglang-mtp", "deepseek-v3", ("h200",), "fp8"): _r(
        max_num_seqs=256, max_num_batched_tokens=32768, gpu_memory_utilization=0.82, cache_dtype="auto",
        cases=(dict(when=dict(isl=1024, osl=1024), set=dict(max_num_seqs=512),
                    note="1k1k: --max-running-requests 512"),),
        source=f"{FSL}/dsr1_fp8_h200_mtp.sh@bdf931e: --max-running-requests 512 at 1k1k else 256, "
               "--chunked-prefill-size 32768, --mem-fraction-static 0.82, no kv-cache-dtype flag, flashinfer "
               f"attention, EAGLE 2 / 3, {TEN_C}"),
    ("sglang-mtp", "deepseek-v3", ("b200",), "fp4"): _r(
        max_num_seqs=256, max_num_batched_tokens=16384, gpu_memory_utilization=0.85, cache_dtype="fp8",
        cases=(dict(when=dict(dp_attention=True), set=dict(max_num_batched_tokens=32768),
                    note="DP attention (dp > 1): chunk 32768"),),
        source=f"{FSL}/dsr1_fp4_b200_mtp.sh@25cbe71: --max-running-requests 256, --mem-fraction-static 0.85, "
               "--kv-cache-dtype fp8_e4m3, --chunked-prefill-size 16384 (32768 with DP attention), EAGLE 2 / 3, "
               f"{TEN_C}"),
    ("sglang-mtp", "glm-5", ("b200", "b300"), "fp8"): _r(
        max_num_seqs="C", max_num_batched_tokens=32768, gpu_memory_utilization=0.85, cache_dtype="fp8",
        source=f"{FSL}/glm5_fp8_b200_mtp.sh@8eec0d4 (b300: glm5_fp8_b300_mtp.sh@62b7be8, the B200 recipe): "
               "--max-running-requests $CONC, --chunked-prefill-size 32768, --mem-fraction-static 0.85, "
               f"--kv-cache-dtype fp8_e4m3, EAGLE 3 / 4, {TEN_C}"),
    ("sglang-mtp", "glm-5", ("b200",), "fp4"): _r(
        max_num_seqs="C", max_num_batched_tokens=32768, gpu_memory_utilization=0.85, cache_dtype="fp8",
        cases=(dict(when=dict(isl=8192, osl=1024, min_c=129), set=dict(gpu_memory_utilization=0.8),
                    note="8k1k at C > 128: --mem-fraction-static 0.8"),),
        source=f"{FSL}/glm5_fp4_b200_mtp.sh@b14879a: --max-running-requests $CONC, --chunked-prefill-size 32768, "
               "--mem-fraction-static 0.85 (0.8 at 8k1k with C > 128), --kv-cache-dtype fp8_e4m3, EAGLE 3 / 4, "
               f"{TEN_C}"),
    ("sglang-mtp", "glm-5", ("h200",), "fp8"): _r(
        gpu_memory_utilization=0.85, cache_dtype="auto",
        source=f"{FSL}/glm5_fp8_h200_mtp.sh@f89cdfe: --mem-fraction-static 0.85 only (SGLang's defaults otherwise), "
               f"EAGLE 3 / 4, {TEN_C}"),
    ("trtllm-mtp", "deepseek-v3", ("h200",), "fp8"): _r(
        max_num_seqs="C", max_num_batched_tokens="trt_mtp_tokens", kv_free_fraction=0.75, cache_dtype="fp8",
        mtp_layers=3,
        cases=(dict(when=dict(dp_attention=True), set=dict(max_num_seqs="C/tp", mtp_layers=1),
                    note="DP attention: --max_batch_size max(1, C / TP) per rank, MTP 1"),),
        source=f"{FSL}/dsr1_fp8_h200_trt_mtp.sh@8eec0d4: --max_batch_size C (DP attention: max(1, C / TP)), "
               "--max_num_tokens ceil((MTP + 1) x max_batch_size + ISL + 64) to 64 (MTP 3, 1 with DP attention), "
               "kv_cache_config dtype fp8, free_gpu_memory_fraction 0.75, (--num-prompts $(( $CONC * 10 )))"),
    ("trtllm-mtp", "deepseek-v3", ("b200",), "fp8"): _r(
        max_num_seqs="C", max_num_batched_tokens="trt_mtp_tokens", kv_free_fraction=0.8, cache_dtype="fp8",
        mtp_layers=3,
        cases=(dict(when=dict(dp_attention=True), set=dict(max_num_seqs="C/8", mtp_layers=1, kv_free_fraction=0.7),
                    note="DP attention: --max_batch_size C / 8 (C below 8: C), MTP 1, free fraction 0.7"),),
        source=f"{FSL}/dsr1_fp8_b200_trt_mtp.sh@8eec0d4: --max_batch_size C (DP attention: C / 8), --max_num_tokens "
               "ceil((MTP + 1) x max_batch_size + ISL + 64) to 64 (MTP 3, 1 with DP attention), kv_cache_config dtype "
               "fp8, free_gpu_memory_fraction 0.8 (0.7 with DP attention), (--num-prompts $(( $CONC * 10 )))"),
    ("trtllm-mtp", "deepseek-v3", ("b200",), "fp4"): _r(
        max_num_seqs="C", max_num_batched_tokens="trt_mtp_tokens", kv_free_fraction=0.8, cache_dtype="fp8",
        mtp_layers=3,
        cases=(dict(when=dict(dp_attention=True), set=dict(max_num_seqs="C/4", mtp_layers=1),
                    note="DP attention: --max_batch_size C / 4 (C below 4: C), MTP 1"),),
        source=f"{FSL}/dsr1_fp4_b200_trt_mtp.sh@8eec0d4: --max_batch_size C (DP attention: C / 4), --max_num_tokens "
               "ceil((MTP + 1) x max_batch_size + ISL + 64) to 64 (MTP 3, 1 with DP attention), kv_cache_config dtype "
               "fp8, free_gpu_memory_fraction 0.8, (--num-prompts $(( $CONC * 10 )))"),
    ("trtllm-mtp", "deepseek-v4-pro", ("b200",), "fp4"): _r(
        max_num_seqs="max(C,16)", max_num_batched_tokens="dsv4_trt_mtp_tokens", kv_free_fraction=0.9,
        cache_dtype="fp8", block_size=128, mtp_layers=3,
        cases=(dict(when=dict(dp_attention=True), set=dict(kv_free_fraction=0.6),
                    note="DP attention: free_gpu_memory_fraction 0.6"),
               dict(when=dict(min_isl=4096, min_c=128), set=dict(mtp_layers=2), note="ISL >= 4096, C >= 128: MTP 2")),
        source=f"{FSL}/dsv4_fp4_b200_trt_mtp.sh@0f9b6c5: --max_batch_size max(C, 16), --max_num_tokens max(8192, "
               "ISL + OSL + (MTP + 1) x max_batch_size + 256) (MTP 3, 2 at ISL >= 4096 and C >= 128), kv_cache_config "
               "dtype fp8, tokens_per_block 128, free_gpu_memory_fraction 0.9 (0.6 with DP attention), "
               "(--num-prompts \"$(( CONC * 10 ))\")"),
    # ------------------------------------------------------------------ vLLM (models not in IX_RECIPES)
    ("vllm", "llama-3.1-70b-instruct", ("h200",), "fp8"): _r(
        max_num_seqs="C", max_num_batched_tokens=8192, gpu_memory_utilization=0.9, cache_dtype="fp8",
        source=f"{FLAT}/70b_fp8_h200_slurm.sh@409e9a4: config kv-cache-dtype fp8, async-scheduling, no prefix "
               "caching, max-num-batched-tokens 8192; --gpu-memory-utilization 0.9 --max-num-seqs $CONC, "
               "--num-prompts $(( $CONC * 10 ))"),
    ("vllm", "llama-3.1-70b-instruct", ("h100",), "fp8"): _r(
        max_num_seqs="C", max_num_batched_tokens=8192, gpu_memory_utilization=0.9, cache_dtype="fp8",
        source=f"{FLAT}/70b_fp8_h100_slurm.sh@2a205bb: config kv-cache-dtype fp8, async-scheduling, no prefix "
               "caching, max-num-batched-tokens 8192 (max-model-len 10240); --gpu-memory-utilization 0.9 "
               "--max-num-seqs $CONC, --num-prompts $(( $CONC * 10 ))"),
    ("vllm", "llama-3.1-70b-instruct", ("b200",), "fp8"): _r(
        max_num_seqs=512, max_num_batched_tokens=8192, gpu_memory_utilization=0.9, cache_dtype="fp8",
        cudagraph_mode="FULL_DECODE_ONLY",
        source=f"{FLAT}/70b_fp8_b200_docker.sh@bb4c7f9: config kv-cache-dtype fp8, compilation-config "
               "cudagraph_mode FULL_DECODE_ONLY (fusion passes), max-num-batched-tokens 8192, no prefix caching; "
               "--gpu-memory-utilization 0.9 --max-num-seqs 512 (the client is the runner's: 10 x C prompts as in "
               "the slurm scripts)"),
    ("vllm", "llama-3.1-70b-instruct", ("b200",), "fp4"): _r(
        max_num_seqs=512, max_num_batched_tokens=8192, gpu_memory_utilization=0.9, cache_dtype="fp8",
        cudagraph_mode="FULL_DECODE_ONLY",
        source=f"{FLAT}/70b_fp4_b200_docker.sh@bb4c7f9: config kv-cache-dtype fp8, compilation-config "
               "cudagraph_mode FULL_DECODE_ONLY, max-num-batched-tokens 8192, no prefix caching; "
               "--gpu-memory-utilization 0.9 --max-num-seqs 512 (10 x C prompts as in the slurm scripts)"),
}


def lookup(scheduler: str, model: str, chip: str, dtype: str):
    """(recipe, key) of IX_ENGINE_RECIPES for a (scheduler, model, chip, dtype), or (None, None);
    the recipe as published (its rules unresolved)."""
    for key, rec in IX_ENGINE_RECIPES.items():
        sched, m, chips, d = key
        if (sched, m, d) == (scheduler, model, dtype) and chip in chips:
            return rec, key
    return None, None


def _script_tp(p) -> int:
    """The TP a recipe script's cases and rules name: its config's GPU count (InferenceX launches
    DP attention as --tensor-parallel-size TP / DP), from either convention of the tp column
    (the GPU count, or each data-parallel rank's: ``accuracy.gpus_of``)."""
    from .accuracy import gpus_of
    return int(gpus_of(p))


def _matches(when: dict, p) -> bool:
    for k, v in when.items():
        if k == "tp":
            if _script_tp(p) != v:
                return False
        elif k == "dp_attention":
            if (int(p.dp) > 1) != v:
                return False
        elif k == "min_c":
            if int(p.concurrency) < v:
                return False
        elif k == "min_isl":
            if int(p.isl) < v:
                return False
        elif int(getattr(p, k)) != v:
            return False
    return True


def _value(v, p, seqs=None, mtp=0):
    """A rule resolved for point ``p`` (the integer), or the value itself ("C", "2*isl", None, a
    number: accuracy.engine_assumptions reads those). ``seqs``: the point's resolved
    max_num_seqs and ``mtp`` the script's draft count, for the TensorRT-LLM MTP token rules."""
    C, isl, osl = int(p.concurrency), int(p.isl), int(p.osl)
    if v == "trt_tokens":
        return max(8192, (C + isl + 64 + 63) // 64 * 64)
    if v == "max_model_len":
        return isl + osl + 256
    if v == "qwen_trt_tokens":
        return {(8192, 1024): 32768, (1024, 1024): 16384}.get((isl, osl), max(8192, isl + osl + 256))
    if v == "max(C,16)":
        return max(C, 16)
    if v == "max(8,3C/2)":
        return max(8, C * 3 // 2)
    if v == "max(8192,isl+osl+256)":
        return max(8192, isl + osl + 256)
    if v == "dp_attention_batch":
        return {4: 256, 8: 128}.get(_script_tp(p), max(C, 16))
    if isinstance(v, str) and v.startswith("C/"):
        # per-rank batch under DP attention: "C/tp" is C // TP (at least 1); "C/8", "C/4" are
        # C // n, or C itself below n (as the scripts write them)
        n = _script_tp(p) if v == "C/tp" else int(v[2:])
        return C if (v != "C/tp" and C < n) else max(C // n, 1)
    seqs = C if seqs == "C" else seqs
    if v == "trt_mtp_tokens":                  # ceil((MTP + 1) x max_batch_size + ISL + 64) to 64
        return ((mtp + 1) * int(seqs) + isl + 64 + 63) // 64 * 64
    if v == "dsv4_trt_mtp_tokens":             # max(8192, ISL + OSL + (MTP + 1) x max_batch_size + 256)
        return max(8192, isl + osl + (mtp + 1) * int(seqs) + 256)
    return v


_FIXED: dict = {}


def _fixed_bytes(p) -> tuple:
    """(fixed bytes per GPU, HBM bytes) of the point's deployment as the harness resolves it
    (the point's registry, ``Point.registry``, else the bundled one, and the bundled scenarios):
    weights, activations, CUDA graphs and communication buffers (plan.memory); kept per
    deployment and registry."""
    key = (p.registry, p.deployment, p.model, p.hardware, p.dtype, p.engine, p.tp, p.ep, p.dp, p.spec_decode)
    if key not in _FIXED:
        from .accuracy import build_deployment
        dep, _ = build_deployment(p, registry=p.registry)
        m = dep.plan.memory
        fixed = sum(float(m.get(k, 0.0)) for k in ("weights_bytes", "activation_bytes", "cudagraph_bytes",
                                                    "comm_buffer_bytes"))
        _FIXED[key] = (fixed, float(dep.chip.memory_gib) * 2 ** 30)
    return _FIXED[key]


def trt_gmu(p, f: float) -> tuple:
    """(gpu_memory_utilization, how) holding the KV pool TensorRT-LLM's free_gpu_memory_fraction
    ``f`` gives: g = f + (1 - f) x fixed / HBM (module docstring), else f where the point's
    deployment cannot be resolved (said so)."""
    from .errors import JaxpriceError
    try:
        fixed, hbm = _fixed_bytes(p)
    except (JaxpriceError, KeyError, ValueError, OSError):
        return f, (f"gpu_memory_utilization = free_gpu_memory_fraction {f:g} (the deployment could not be resolved "
                   "to size its fixed memory; KNOWN DIVERGENCE [trt-free-fraction]: TensorRT-LLM's fraction is of the "
                   "memory left after weights and buffers, so this pool is smaller)")
    g = min(f + (1.0 - f) * fixed / hbm, 1.0) if hbm > 0 and math.isfinite(fixed) else f
    g = round(g, 4)
    return g, (f"gpu_memory_utilization {g:g} = f + (1 - f) x fixed / HBM: TensorRT-LLM's free_gpu_memory_fraction "
               f"f = {f:g} of the memory left after {fixed / 2 ** 30:.1f} GiB of weights and buffers per GPU "
               f"(plan.memory) of {hbm / 2 ** 30:.0f} GiB, the same KV pool")


def engine_recipe(p):
    """(recipe, key) for point ``p`` from IX_ENGINE_RECIPES, its rules resolved for the point's
    tp, ep, dp, isl, osl and C (the cases that apply named in its source; TensorRT-LLM's free
    fraction turned into the equivalent gpu_memory_utilization), or (None, None). ``key`` is
    (model + engine, chips, dtype), as accuracy names a recipe."""
    from .accuracy import ENGINE_SCHEDULER, is_speculative
    scheduler = ENGINE_SCHEDULER.get(p.engine)
    if not scheduler:
        return None, None
    spec = is_speculative(p)
    rec, key = lookup(scheduler + "-mtp", p.model, p.hardware, p.dtype) if spec else (None, None)
    fallback = spec and rec is None
    if rec is None:
        rec, key = lookup(scheduler, p.model, p.hardware, p.dtype)
    if rec is None:
        return None, None
    out = {k: v for k, v in rec.items() if k != "cases"}
    notes = []
    for case in rec["cases"]:
        if _matches(case["when"], p):
            out.update(case["set"])
            notes.append(case["note"])
    mtp = int(out.pop("mtp_layers", 0))
    out["max_num_seqs"] = _value(out["max_num_seqs"], p)
    out["max_num_batched_tokens"] = _value(out["max_num_batched_tokens"], p, seqs=out["max_num_seqs"], mtp=mtp)
    source = rec["source"] + (f" [this point: {'; '.join(notes)}]" if notes else "")
    if fallback:
        source += (" [COVERAGE LIMIT [mtp-recipe]: measured with speculative decoding, but no MTP script of this "
                   "recipe read: the non-MTP script's flags]")
    if "kv_free_fraction" in out:
        g, how = trt_gmu(p, float(out.pop("kv_free_fraction")))
        out["gpu_memory_utilization"] = g
        source += f" [{how}]"
    elif scheduler.startswith("sglang"):
        source += (f" [--mem-fraction-static read as gpu_memory_utilization {out['gpu_memory_utilization']:g}; "
                   "KNOWN DIVERGENCE [sglang-mem-fraction]: SGLang keeps activations and CUDA graphs outside it]")
    if isinstance(rec["max_num_batched_tokens"], str) and rec["max_num_batched_tokens"] not in ("2*isl",):
        source += (f" [max_num_batched_tokens {out['max_num_batched_tokens']} at isl {p.isl}, osl {p.osl}, "
                   f"C={p.concurrency}]")
    out["source"] = source
    return out, (f"{key[1]} {key[0]}", key[2], key[3])
