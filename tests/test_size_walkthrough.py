"""A practitioner's walk through `jaxprice size`, `price --chip` and the launch lines they print:
each test pins one thing such a user saw that would have broken (a launch line the engine refuses)
or misled. Lean: most tests only resolve candidates and write launch lines; three run one-layout
searches of Llama-3.1-8B on one H100 (ISL 512 / OSL 64, one concurrency), sharing one plan structure.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from clirefusal import assert_refused

from jaxprice import cli
from jaxprice._src import launch
from jaxprice._src import layouts as L

QWEN_FP8 = "qwen3-235b-a22b-fp8"        # block-wise FP8 (128 x 128), experts 1536 wide


@pytest.fixture(scope="module")
def qwen():
    graph, registry, _ = L.load_model(QWEN_FP8)
    return graph, registry


# ----------------------------------------------------------------------------- block-wise FP8 checkpoints

def test_block_fp8_experts_split_into_partial_blocks_are_rejected(qwen):
    """Qwen3-235B-A22B-FP8 at tp 8 without expert parallelism: each GPU holds 1536 / 8 = 192 of every
    expert's intermediate, not a whole number of 128-wide blocks, and vLLM refuses to load it
    (vllm-project/vllm#17569); size offered that layout and printed its `vllm serve` line. With
    expert parallelism, or tp 4 (384 = 3 x 128), it loads."""
    graph, registry = qwen
    assert L.checkpoint_fp8_block(graph) == (128, 128)
    lays = [L.Layout(8, 1, False, "fp8", 256, 8192, "FULL_AND_PIECEWISE"),
            L.Layout(4, 2, False, "fp8", 256, 8192, "FULL_AND_PIECEWISE"),   # experts over tp x dp = 8
            L.Layout(8, 1, True, "fp8", 256, 8192, "FULL_AND_PIECEWISE"),
            L.Layout(4, 1, False, "fp8", 256, 8192, "FULL_AND_PIECEWISE")]
    cands = L.build_candidates(QWEN_FP8, graph, "h200", 8, lays, isl=1024, osl=1024, registry=registry)
    assert [c.status for c in cands] == ["rejected", "rejected", "ok", "ok"]
    assert "expert intermediate of 192 per GPU (1536 / 8)" in cands[0].reason
    assert "vLLM refuses" in cands[0].reason and "expert parallelism" in cands[0].reason


def test_block_rule_spares_other_checkpoints():
    """No false refusals: DeepSeek-V3 (block FP8, experts 2048 / 8 = 256) at tp 8; a model served from
    another checkpoint than its block-FP8 one (MiniMax-M2.5 as NVFP4); a per-tensor FP8 or 16-bit
    checkpoint (no blocks)."""
    ds, _, _ = L.load_model("deepseek-v3")
    mm, _, _ = L.load_model("minimax-m2.5")
    llama, _, _ = L.load_model("llama-3.1-70b-instruct")
    assert L.block_reason(ds, 8, 1, False, "fp8") == "" and L.checkpoint_fp8_block(ds) == (128, 128)
    assert L.block_reason(mm, 8, 1, False, "nvfp4") == ""
    assert "192 per GPU" in L.block_reason(mm, 8, 1, False, "fp8")
    assert L.checkpoint_fp8_block(llama) is None and L.block_reason(llama, 8, 1, False, "fp8") == ""


def test_price_chip_refuses_a_layout_the_engine_cannot_load(capsys):
    """`jaxprice price qwen3-235b-a22b-fp8 --chip h200 --tp 8` priced a deployment vLLM would not
    start; now one line naming --tp, exit 2, before anything is compiled."""
    assert_refused(capsys, ["price", QWEN_FP8, "--chip", "h200", "--tp", "8", "--decode", "8", "--context", "1024"],
                   "field '--tp', value 8", "expert intermediate of 192 per GPU")
    # experts split over tp x dp: both flags named (it named --tp alone, though --tp 4 alone loads)
    assert_refused(capsys, ["price", QWEN_FP8, "--chip", "h200", "--tp", "4", "--dp", "2", "--decode", "8",
                            "--context", "1024"], "field '--tp/--dp', value '4 x 2'", "(1536 / 8)")


# ----------------------------------------------------------------------------- SGLang launch lines

def test_sglang_dense_data_parallel_is_plain_replicas():
    """A dense model's dp ranks are replicas, priced with every layer at the rank's tp: SGLang's plain
    `--tp 2 --dp 2` (two engines of two GPUs), each taking the limits as given. The line was `--tp 4
    --dp 2 --enable-dp-attention` with the limits doubled: DP attention, which SGLang divides the limits
    over, and which runs a dense model's MLP over all four GPUs, not the layout priced."""
    graph, _, _ = L.load_model("llama-3.1-70b-instruct")
    lay = L.Layout(2, 2, False, "fp8", 256, 8192, L.SGLANG_GRAPH_MODE, "sglang")
    scen = L.build_scenario("llama-3.1-70b-instruct", "h100", lay, isl=1024, osl=1024, graph=graph)
    text = launch.sglang_command(scen, lay, graph, replicas=2)
    assert " --tp 2 --dp 2 --quantization fp8 " in text and "--enable-dp-attention" not in text
    assert "--max-running-requests 256 --chunked-prefill-size 8192 " in text
    assert "divides" not in text and "2 data-parallel replicas of --tp 2" in text
    # an MoE model keeps DP attention (test_size_sglang pins its limits x dp)
    ds, _, _ = L.load_model("deepseek-v3")
    moe = L.Layout(2, 4, True, "fp8", 256, 8192, L.SGLANG_GRAPH_MODE, "sglang")
    text = launch.sglang_command(L.build_scenario("deepseek-v3", "h200", moe, isl=1024, osl=1024, graph=ds), moe, ds)
    assert " --tp 8 --dp 4 --enable-dp-attention --ep-size 8 " in text and "--max-running-requests 1024 " in text


# ----------------------------------------------------------------------------- what the report says

def test_candidate_space_names_the_formats_a_checkpoint_holds():
    """gpt-oss-120b's candidate space read 'weights bf16', as if a 16-bit 120B model were sized on one
    H100 (its experts are MXFP4, as priced); the line now names them. A model whose GEMMs are all at
    its format reads as before."""
    from jaxprice._src.cli_size import describe_space
    from jaxprice._src.size import SizeWorkload
    oss, _, _ = L.load_model("gpt-oss-120b")
    llama, _, _ = L.load_model("llama-3.1-70b-instruct")
    ctx = {"model": "m", "model_source": "registry model m", "chip": "h100", "gpus": 1,
           "workload": SizeWorkload(1024, 1024), "gpus_per_node": 8}
    cand = [L.Candidate(L.Layout(1, 1, False, "bf16", 256, 8192, "PIECEWISE"), 1, "ok")]
    assert "weights bf16 (the checkpoint's, with mxfp4 for experts);" in describe_space(cand, dict(ctx, graph=oss))
    assert "weights bf16; " in describe_space(cand, dict(ctx, graph=llama))


def test_launch_line_names_a_local_checkpoint_the_engine_can_load(tmp_path):
    """`jaxprice size /models/my-finetune` printed `vllm serve llama-3.1-8b-instruct` (the bundled graph
    its config matched: no repo vLLM can fetch); a hub-cache snapshot printed the same. Now the folder
    itself, and a hub cache's ORG/NAME; a bundled config keeps its repo id."""
    import shutil
    src = Path(__file__).resolve().parents[1] / "testdata" / "hf" / "meta-llama--Llama-3.1-8B-Instruct" / "config.json"
    mine = tmp_path / "my-finetune"
    snap = tmp_path / "hub" / "models--acme--Tuned-8B" / "snapshots" / "0123abc"
    lay = L.Layout(1, 1, False, "bf16", 256, 8192, "PIECEWISE")
    for folder, want in ((mine, f"vllm serve {mine} "), (snap, "vllm serve acme/Tuned-8B "),
                         (src.parent, "vllm serve meta-llama/Llama-3.1-8B-Instruct ")):
        folder.mkdir(parents=True, exist_ok=True)
        if folder != src.parent:
            shutil.copy(src, folder / "config.json")
        graph, _, _ = L.load_model(str(folder))
        scen = L.build_scenario(graph.name, "h100", lay, isl=1024, osl=1024, graph=graph)
        assert launch.vllm_command(scen, lay, graph).startswith(want), folder
        sg = L.Layout(1, 1, False, "bf16", 256, 8192, L.SGLANG_GRAPH_MODE, "sglang")
        assert f"--model-path {want.split()[-1]} " in launch.sglang_command(scen, sg, graph)


def test_written_scenario_of_a_graph_file_loads_that_graph(tmp_path):
    """`jaxprice size my-graph.yaml --write-scenario best.yaml` wrote `model: <the graph's name>`: a
    name no registry knows (`serve best.yaml` refused it), or a bundled model's (`serve` priced the
    bundled graph, not the one sized). The scenario now names the graph file, and loads it."""
    import jaxprice as jp
    from jaxprice._src.formats import load_model_graph
    graph = tmp_path / "my-llama.yaml"
    text = (Path(__file__).resolve().parents[1] / "registry" / "models" / "llama-3.1-8b-instruct.yaml").read_text()
    graph.write_text(text.replace("name: llama-3.1-8b-instruct", "name: my-llama", 1))
    assert load_model_graph(graph).name == "my-llama"
    res = jp.size(str(graph), chip="h100", gpus=1, isl=512, osl=64, weights=["fp8"], max_num_seqs=(64,),
                  max_num_batched_tokens=(2048,), cudagraph_modes=("PIECEWISE",), concurrency=(4,),
                  evaluator="steady")
    out = tmp_path / "best.yaml"
    out.write_text(res.scenario_yaml())
    dep = jp.load_deployment(str(out))
    assert dep.scenario.model == str(graph.resolve()) and dep.graph.name == "my-llama"
    assert dep.plan.digest == res.best_candidate.deployment.plan.digest
    # the best layout's memory as the engine logs it at start-up (a first launch checks the sizing)
    from jaxprice._src.cli_size import _memory_note
    m = dep.plan.memory
    note = _memory_note(res)[0]
    assert f"weights {m['weights_bytes'] / 2 ** 30:.1f} GiB, KV cache {m['kv_capacity_tokens']:,.0f} tokens" in note
    assert f"{m['kv_capacity_tokens'] / 832:.1f} requests of max_model_len 832" in note


def test_written_scenario_says_how_to_simulate_its_point_again(tmp_path, capsys):
    """A search at --range-ratio 1 wrote a scenario whose `jaxprice serve FILE --isl --osl
    --concurrency` drew lengths on [0.8 L, L], serve's default, and gave other numbers than the
    search's: nothing said so. The file and the CLI now give the serve line with the ratio; run, it
    gives the search's numbers (the point was simulated)."""
    out = tmp_path / "best.yaml"
    rc = cli.main(["size", "llama-3.1-8b-instruct", "--chip", "h100", "--gpus", "1", "--isl", "512", "--osl", "64",
                   "--range-ratio", "1", "--concurrency", "16", "--max-num-seqs", "64", "--max-num-batched-tokens",
                   "2048", "--graph-modes", "PIECEWISE", "--weights", "fp8", "--quiet", "--write-scenario", str(out)])
    text = capsys.readouterr().out
    line = f"jaxprice serve {out} --isl 512 --osl 64 --concurrency 16 --range-ratio 1"
    assert rc == 0 and f"wrote {out} ({line} simulates" in text
    assert "# numbers from the serving simulation, again by jaxprice serve THIS_FILE --isl 512 --osl 64 " \
           "--concurrency 16 --range-ratio 1\n" in out.read_text()
    best = next(s for s in text.splitlines() if s.startswith("best: "))
    assert cli.main(line.split()[1:]) == 0
    row = capsys.readouterr().out.splitlines()[-2].split()
    assert row[0] == "16" and f"TTFT {float(row[1]):.1f} ms, TPOT {float(row[3]):.2f} ms" in best, (row, best)


def test_kv_heads_that_neither_divide_nor_are_divided_by_tp_are_refused(capsys):
    """phi-4 (40 query heads, 10 KV heads) at tp 4: the query heads divide, so size offered it and
    `price --chip --tp 4` priced it, but vLLM's QKVParallelLinear asserts divide(10, 4) and never
    starts. tp 2 (5 KV heads a rank) and a KV head replicated over whole groups (8 heads at tp 16)
    still pass."""
    phi = str(Path(__file__).resolve().parents[1] / "testdata" / "hf" / "microsoft--phi-4")
    graph, _, _ = L.load_model(phi)
    assert "10 KV heads" in L.heads_reason(graph, 4) and "10 KV heads" in L.heads_reason(graph, 8)
    assert L.heads_reason(graph, 2) == "" and L.heads_reason(graph, 1) == ""
    llama, _, _ = L.load_model("llama-3.1-70b-instruct")          # 64 query, 8 KV heads
    assert [L.heads_reason(llama, t) for t in (8, 16)] == ["", ""]
    assert_refused(capsys, ["price", phi, "--chip", "h100", "--tp", "4", "--decode", "1"],
                   "field '--tp', value 4", "10 KV heads")


def test_a_ttft_target_under_the_admission_latency_is_said_to_be_unreachable():
    """--ttft-ms 5: the miss named the closest layout (TTFT 62 ms) as if a faster one might do; every
    TTFT holds the registry's 40 ms host admission, so none can. The miss now says so."""
    import jaxprice as jp
    res = jp.size("llama-3.1-8b-instruct", chip="h100", gpus=1, isl=512, osl=64, ttft_ms=5, weights=["fp8"],
                  max_num_seqs=(64,), max_num_batched_tokens=(2048,), cudagraph_modes=("PIECEWISE",),
                  concurrency=(4,), evaluator="steady")
    assert res.best is None and "closest: tp1 dp1 fp8" in res.miss
    assert "host admission latency, 40.2 ms" in res.miss and "no layout can meet it" in res.miss


def test_block_rule_skips_nodes_held_in_another_format():
    """DeepSeek-V4-Pro's checkpoint is block-wise FP8 (128 x 128) but its experts are MXFP4 (their
    own weight_dtype): split over 16 GPUs without expert parallelism (3072 / 16 = 192) they have no
    128-wide FP8 blocks to break, and vLLM's MXFP4 MoE pads its shards; the rule refused tp 8 x dp 2
    and tp 16 as if the experts were FP8."""
    v4, _, _ = L.load_model("deepseek-v4-pro")
    assert L.checkpoint_fp8_block(v4) == (128, 128)
    assert L.block_reason(v4, 8, 2, False, "fp8") == "" and L.block_reason(v4, 16, 1, False, "fp8") == ""


def test_launch_line_names_a_hub_cache_repo_whose_config_is_a_link(tmp_path):
    """In a real Hugging Face hub cache a snapshot's config.json is a link to ../../blobs/<hash>: the
    launch line resolved the link and named the blobs folder (`vllm serve .../blobs`), no model."""
    src = Path(__file__).resolve().parents[1] / "testdata" / "hf" / "meta-llama--Llama-3.1-8B-Instruct" / "config.json"
    repo = tmp_path / "hub" / "models--acme--Tuned-8B"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "0a1b2c").write_bytes(src.read_bytes())
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to(Path("..") / ".." / "blobs" / "0a1b2c")
    graph, _, _ = L.load_model(str(snap))
    lay = L.Layout(1, 1, False, "bf16", 256, 8192, "PIECEWISE")
    scen = L.build_scenario(graph.name, "h100", lay, isl=1024, osl=1024, graph=graph)
    assert launch.vllm_command(scen, lay, graph).startswith("vllm serve acme/Tuned-8B ")


# ----------------------------------------------------------------------------- refusals name the flags typed

@pytest.mark.parametrize("extra, words", [
    (["--chip", "h201"], ("field '--chip', value 'h201'", "unknown chip")),
    (["--chip", "h100", "--weights", "mxfp4"], ("field '--weights', value 'mxfp4'", "not a format vLLM serves")),
    (["--chip", "h100", "--tp", "8"], ("field '--tp', value [8]", "not a multiple of any width")),
    (["--chip", "h100", "--ep", "on"], ("field '--ep', value 'on'", "has no MoE layer")),
    (["--chip", "h100", "--engine", "sglang", "--max-running-requests", "99999999999"],
     ("field '--max-running-requests', value 99999999999",)),
])
def test_size_refusals_name_the_flag_not_the_library_keyword(capsys, extra, words):
    """The search library's refusals named its keywords ("field 'tp'", "'weights'", "'chip'", ep's
    value True) where the user typed --tp, --weights, --chip, --ep on: now the flag, as typed."""
    assert_refused(capsys, ["size", "meta-llama-3.1-8b", "--gpus", "4", "--isl", "512", "--osl", "64",
                            "--evaluator", "steady", "--quiet", *extra], *words)
