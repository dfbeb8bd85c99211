"""A model with recurrent layers runs at vLLM's hybrid attention block size (resolve.hybrid_block_size,
vllm/model_executor/models/config.py HybridAttentionMambaModelConfig): one attention block holds one
recurrent layer's state, so a request's attention KV comes in blocks of thousands of tokens. The plan
carries it (plan.memory block_size, hybrid_block_minimum), the serving simulation allocates in it and
refuses an override below it, and size's steady state holds whole blocks. No compile here."""
from __future__ import annotations

import argparse
import math

import pytest

import jaxprice as jp
from jaxprice._src import cli_price, serve
from jaxprice._src import launch
from jaxprice._src import size as S
from jaxprice._src.resolve import hybrid_block_size

NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
QWEN35 = "qwen3.5-397b-a17b-h100-fp8-sglang-tp8"


def _built(model, chip, tp, **flags):
    base = dict(chip=chip, tp=str(tp), dp=None, ep=None, weights=None, gpus_per_node=None, fabric=None,
                gpu_memory_utilization=None, kv_cache_dtype=None, cudagraph_mode=None)
    return cli_price.load_scenario_deployment(model, None, argparse.Namespace(**{**base, **flags}))


def test_the_rule_hand_worked():
    # Nemotron 3 Nano, one rank: a Mamba2 layer's state ((4096 + 2 x 8 x 128) x 3 + 64 x 64 x 128) x 4 B
    state = ((4096 + 2 * 8 * 128) * 3 + 64 * 64 * 128) * 4
    assert state == 2_170_880
    # an attention layer's KV per token: 2 KV heads x 128 x (K, V) x 2 B = 1,024 B -> 16 ceil(132.5) = 2,128
    assert hybrid_block_size(16, state, 1024.0) == 2128
    assert hybrid_block_size(4096, state, 1024.0) == 4096          # a larger stated block stays
    assert hybrid_block_size(16, state, 512.0) == 16 * math.ceil(state / (16 * 512))   # fp8 cache: 4,240
    assert hybrid_block_size(16, 0.0, 1024.0) == 16                # no recurrent layer: as stated


def test_plans_carry_the_block():
    nano = _built(NANO, "h200", 1)
    m = nano.plan.memory
    assert m["recurrent_state_bytes_per_request"] == pytest.approx(23 * 2_170_880)   # 23 Mamba2 layers
    assert m["kv_bytes_per_token"] == 6 * 1024 and (m["block_size"], m["hybrid_block_minimum"]) == (2128, 2128)
    assert any(k == "block_size" and "raised from 16 to 2128" in v for k, v in nano.plan.provenance)
    fp8 = _built(NANO, "h200", 1, kv_cache_dtype="fp8")
    assert fp8.plan.memory["block_size"] == 4240
    # Qwen3.5-397B on 8 H100 (fp8 cache, block 16 stated): a GDN layer's 8 heads x 128^2 x 4 B per rank
    # over 1 KV head x 256 x 2 x 1 B = 512 B a token -> 16 ceil(524,288 / 8,192) = 1,024
    q = jp.load_deployment(QWEN35)
    assert q.scenario.engine["block_size"] == 16 and q.plan.memory["block_size"] == 1024
    # a model without recurrent layers keeps its block and has no minimum (a dense attention: an MLA
    # one runs its backend's block, tests/test_engine_overrides.py)
    d = jp.load_deployment("llama-3.1-70b-instruct-h200-fp8-vllm-tp8")
    assert (d.plan.memory["block_size"], d.plan.memory["hybrid_block_minimum"]) == (16, 0)


def test_the_simulation_allocates_in_it_and_refuses_less():
    q = jp.load_deployment(QWEN35)
    out, src = serve.engine_settings(q, max_len=2048)
    assert out["block_size"] == 1024 and "raised from the 16 stated" in src["block_size"][1]
    # the pool in blocks of 1,024 tokens (vLLM's null block aside): 2,773, where blocks of 16 gave 177,486
    assert out["kv_blocks"] == math.floor(q.plan.memory["kv_capacity_tokens"] / 1024) - 1 == 2773
    assert serve.engine_settings(q, {"block_size": 2048}, max_len=2048)[0]["block_size"] == 2048
    with pytest.raises(jp.JaxpriceError, match="below the 1024 tokens vLLM runs"):
        serve.engine_settings(q, {"block_size": 16}, max_len=2048)
    d = jp.load_deployment("llama-3.1-70b-instruct-h200-fp8-vllm-tp8")
    out, src = serve.engine_settings(d, max_len=2048)
    assert out["block_size"] == 16 and src["block_size"][1].endswith("engine.block_size")


def test_steady_state_holds_whole_blocks():
    """A 1k/1k request of Nano holds one 2,128-token block all its life (not its mean context of
    1,536 tokens): the steady state's KV fit counts that."""
    wl = S.SizeWorkload(1024, 1024, 1.0)
    assert S._held_tokens(wl, 2128) == 2128.0
    assert S._held_tokens(wl, 16) == pytest.approx(1536.5 + 8, abs=1.0)
    nano = _built(NANO, "h200", 1)
    lay = S.Layout(1, 1, False, "bf16", 1024, 8192, "FULL_AND_PIECEWISE")
    R, *_ = S.steady_state_requests(nano, lay, wl, 1024)
    cap = S._kv_tokens(nano, 2128.0)
    assert R == min(1024, int(cap // 2128), S._budget_requests(8192, 1024, 1024))


def test_only_vllm_raises_the_block():
    """SGLang and TensorRT-LLM hold recurrent states in a pool of their own (SGLang's MambaPool,
    TensorRT-LLM's Mamba cache manager): a deployment naming either as its engine keeps its block,
    with no minimum, and its simulation allocates in it; the KV pool in tokens is the same."""
    import dataclasses
    from jaxprice._src.formats import Registry
    from jaxprice._src.resolve import resolve
    q = jp.load_deployment(QWEN35)
    for eng in ("sglang", "trtllm"):
        other = resolve(dataclasses.replace(q.scenario, engine={**q.scenario.engine, "scheduler": eng}), Registry())
        assert (other.plan.memory["block_size"], other.plan.memory["hybrid_block_minimum"]) == (16, 0)
        assert other.plan.memory["kv_capacity_tokens"] == q.plan.memory["kv_capacity_tokens"]
        assert not any(k == "block_size" for k, _ in other.plan.provenance)
        out, _ = serve.engine_settings(other, max_len=2048)
        assert out["block_size"] == 16 and out["scheduler"] == eng
    same = resolve(dataclasses.replace(q.scenario, engine={**q.scenario.engine, "scheduler": "vllm"}), Registry())
    assert same.plan.memory["block_size"] == 1024


def test_the_vllm_line_leaves_a_hybrid_block_to_vllm():
    """size's `vllm serve` line for a model with recurrent layers states no --block-size (vLLM
    raises the attention block itself; a stated 16 would be overridden) and says the block priced;
    a model without them keeps its --block-size."""
    q = jp.load_deployment(QWEN35)
    lay = S.Layout(8, 1, False, "fp8", 256, 8192, "FULL_AND_PIECEWISE")
    assert launch.hybrid_block_of(q) == 1024
    line = launch.launch_command(q.scenario, lay, q.graph, hybrid_block=launch.hybrid_block_of(q))
    assert "--block-size" not in line.split("    #")[0]
    assert "# no --block-size: vLLM raises a hybrid model's attention block" in line and "(1024 tokens here" in line
    d = jp.load_deployment("deepseek-v3-h200-fp8-sglang-tp8")
    assert launch.hybrid_block_of(d) == 0
    assert "--block-size 16 " in launch.launch_command(d.scenario, lay, d.graph, hybrid_block=launch.hybrid_block_of(d))


def test_a_multi_node_line_keeps_its_flags_before_its_notes():
    """A hybrid model's line spanning nodes: the multi-node flags (--data-parallel-address, the
    multiprocessing executor's --master-addr) come before the first '#', not after the no
    --block-size note, where a shell reads them as comment; every note still follows."""
    import dataclasses
    q = jp.load_deployment(QWEN35)
    two = dataclasses.replace(q.scenario, nodes=2)
    for lay, flag in ((S.Layout(8, 2, False, "fp8", 256, 8192, "FULL_AND_PIECEWISE"), "--data-parallel-address"),
                      (S.Layout(16, 1, False, "fp8", 256, 8192, "FULL_AND_PIECEWISE"), "--master-addr")):
        line = launch.launch_command(two, lay, q.graph, replicas=2, hybrid_block=launch.hybrid_block_of(q))
        command, _, notes = line.partition("#")
        assert flag in command and "--block-size" not in command
        assert "no --block-size" in notes and "x 2 replicas" in notes and "2 nodes" in notes
    # SGLang's line too, behind a four-bit checkpoint's note: --nnodes and --node-rank before the '#'
    fp4 = dataclasses.replace(two, engine={**two.engine, "quantization": "nvfp4"})
    lay = S.Layout(8, 2, False, "nvfp4", 256, 8192, "FULL_AND_PIECEWISE", engine="sglang")
    command, _, notes = launch.launch_command(fp4, lay, q.graph).partition("#")
    assert "--nnodes 2 --node-rank 0" in command and "serve a published nvfp4 checkpoint" in notes
