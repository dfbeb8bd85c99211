"""Settings vLLM picks at start-up whatever the scenario says: the KV block of a latent (MLA)
attention is its attention backend's (resolve.vllm_mla_block; vLLM >= 0.17 chooses the backend
first, then the block its kernels page: FLASHINFER_MLA 32 or 64 on Blackwell, FLASHMLA 64 on
Hopper with an FP8 cache, FLASH_ATTN_MLA 16 on Hopper with a BF16 one). resolve, serve, size's
launch line and the accuracy harness read the one block."""
import dataclasses

import numpy as np
import pytest

import jaxprice as jp
from jaxprice._src import launch, size as S
from jaxprice._src.serve import engine_settings
from jaxprice._src.cli_serve import _block_why
from jaxprice._src.resolve import resolve, vllm_mla_block

KIMI_B200 = "kimi-k2.5-b200-fp4-vllm-tp4"      # MLA, qk_nope_head_dim 128, fp8 cache, block_size 16 stated


@pytest.fixture(scope="module")
def kimi():
    return jp.load_deployment(KIMI_B200)


@pytest.mark.parametrize("stated, major, cache, nope, block, backend", [
    (16, 10, "fp8", 128, 32, "FLASHINFER_MLA"),     # Kimi-K2.5 / DeepSeek-V3 on B200, B300: 16 is not paged
    (None, 10, "auto", 128, 32, "FLASHINFER_MLA"),  # none stated: the smallest it pages (vLLM 0.22 logs: 32)
    (64, 10, "fp8", 128, 64, "FLASHINFER_MLA"),     # a multiple of a paged size is kept
    (16, 10, "fp8", 96, 128, "CUTLASS_MLA"),        # FlashInfer MLA takes qk_nope_head_dim 64/128/192 only
    (16, 9, "fp8", 128, 64, "FLASHMLA"),            # Hopper, FP8 cache: FLASH_ATTN_MLA has no FP8 cache
    (16, 9, "auto", 128, 16, "FLASH_ATTN_MLA"),     # Hopper, BF16 cache: 16 runs as stated
    (None, 0, "auto", 128, 16, "TRITON_MLA"),       # before Hopper
])
def test_the_mla_block_is_the_backends_per_chip_and_cache(stated, major, cache, nope, block, backend):
    got, rule, note = vllm_mla_block(stated, major, cache, nope)
    assert (got, rule[0]) == (block, backend)
    assert bool(note) == (got != (stated or 16))


def test_resolve_prices_the_backend_block_under_vllm_only(kimi):
    """The bundled Kimi-K2.5 on B200 states 16: its plan's block is FLASHINFER_MLA's 32, said in the
    provenance; DeepSeek-V3 on H200 (FP8 cache, priced as vLLM: no scheduler stated) FLASHMLA's 64;
    the same file under SGLang keeps its 16; a dense model keeps its 16."""
    assert (kimi.scenario.engine["block_size"], kimi.plan.memory["block_size"]) == (16, 32)
    (note,) = [n for k, n in kimi.plan.provenance if k == "block_size"]
    assert note.startswith("vLLM's FLASHINFER_MLA backend pages 32 or 64 tokens; scenario said 16")
    ds = jp.load_deployment("deepseek-v3-h200-fp8-sglang-tp8")
    assert (ds.plan.memory["block_size"], ds.plan.memory["vllm_block_rule"][0]) == (64, "FLASHMLA")
    sg = resolve(dataclasses.replace(ds.scenario, engine={**ds.scenario.engine, "scheduler": "sglang"}))
    assert (sg.plan.memory["block_size"], sg.plan.memory["vllm_block_rule"]) == (16, ())
    assert jp.load_deployment("gpt-oss-120b-h200-fp4-vllm-tp1").plan.memory["block_size"] == 16


@pytest.fixture(scope="module")
def tight(kimi):
    """Kimi-K2.5 on B200 with a KV cache of 256 tokens per rank: floor(256 / 32) - 1 = 7 blocks of
    32 (vLLM's null block aside); five 33-token prompts growing to 40 tokens take 2 blocks each."""
    return jp.build_schedule(kimi, jp.Workload(33, 7, 1.0, 0), jp.ClosedLoop(5, 5),
                             engine={"kv_capacity_tokens": 256.0, "max_num_seqs": 8})


def test_a_serve_run_holds_whole_blocks_of_the_backend(tight):
    """By hand: 7 blocks hold 3 requests of 2 blocks (6 blocks); the other two wait for them. In
    blocks of 16 the cache would be 15 blocks and hold all five (3 blocks each)."""
    assert (tight.settings["block_size"], tight.settings["kv_blocks"]) == (32, 7)
    assert np.asarray(tight.sums["n_prefill"])[0][0] == 3 and np.asarray(tight.sums["kv_blocks"])[0][1] == 6
    assert list(tight.requests["first_step"]) == [0, 0, 0, 8, 8]


def test_the_block_is_said_where_the_engine_settings_are_printed(kimi, tight):
    """serve's engine line says why the block is 32; an engine= block the backend cannot page runs
    as given, said; size's vLLM line leaves the block to vLLM and says the one priced."""
    assert _block_why([tight]).startswith(" (vLLM's FLASHINFER_MLA backend pages 32 or 64 tokens; scenario said 16")
    out, src = engine_settings(kimi, {"block_size": 16})
    assert out["block_size"] == 16 and "vLLM would run this block on a fallback backend" in src["block_size"][1]
    lay = S.Layout(4, 1, False, "nvfp4", 256, 8192, "FULL_AND_PIECEWISE")
    line = launch.launch_command(kimi.scenario, lay, kimi.graph, deployment=kimi)
    flags = line.partition(launch.COMMENT)[0]
    assert "--block-size" not in flags
    assert "no --block-size: vLLM's FLASHINFER_MLA backend picks its own block (32 tokens, as priced)" in line


def test_a_hybrid_mla_models_block_is_a_block_its_backend_pages():
    """Kimi-K3 (MLA beside recurrent KDA layers) on B200: vLLM aligns the raised attention block to
    the backend's own (vllm/platforms/interface.py _align_hybrid_block_size: the grain is the larger
    of the backend's smallest kernel block and the block, FLASHINFER_MLA's 32), so the 0.75 MiB
    state over its MLA page a token (672 < state/page <= 688) takes 32 x 22 = 704 tokens; the
    16-token grain gave 688, a block FLASHINFER_MLA cannot page. On H200 (FLASH_ATTN_MLA, 16) 688."""
    import argparse
    from jaxprice._src import cli_price
    base = dict(tp="8", dp=None, ep=None, weights=None, gpus_per_node=None, fabric=None,
                gpu_memory_utilization=None, kv_cache_dtype=None, cudagraph_mode=None)
    got = {}
    for chip in ("b200", "h200"):
        d = cli_price.load_scenario_deployment("testdata/hf/moonshotai--Kimi-K3", None,
                                               argparse.Namespace(chip=chip, **base))
        m = d.plan.memory
        got[chip] = (m["block_size"], m["hybrid_block_minimum"], m["vllm_block_rule"][0])
    assert got == {"b200": (704, 704, "FLASHINFER_MLA"), "h200": (688, 688, "FLASH_ATTN_MLA")}


def test_an_sglang_run_of_a_vllm_plan_pages_as_its_scenario_says(kimi):
    """engine={'scheduler': 'sglang'} on the Kimi-K2.5 B200 plan (resolved as vLLM: FLASHINFER_MLA's
    32): SGLang's run keeps the scenario's 16, from the scenario, not vLLM's backend block and its
    wording (the re-read's finding); the vLLM run of the same plan keeps 32."""
    out, src = engine_settings(kimi, {"scheduler": "sglang"})
    assert out["block_size"] == 16 and "vLLM" not in src["block_size"][1]
    assert src["block_size"][1].endswith(": engine.block_size")
    out, src = engine_settings(kimi, {})
    assert out["block_size"] == 32 and src["block_size"][1].startswith("vLLM's FLASHINFER_MLA")


def test_the_engine_line_gives_a_reason_only_for_a_reason():
    """_block_why prints serve's block reasons, not a scenario path that happens to hold 'vLLM'."""
    class R:
        def __init__(self, src):
            self.assumptions = {"block_size": (16, src)}
    assert _block_why([R("/home/me/vLLM-runs/kimi.yaml: engine.block_size")]) == ""
    assert _block_why([R("vLLM's FLASHMLA backend pages 64 tokens; none stated")]) == \
        " (vLLM's FLASHMLA backend pages 64 tokens; none stated)"
