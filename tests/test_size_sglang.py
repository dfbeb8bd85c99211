"""`jaxprice size --engine sglang` / jaxprice.size(engine='sglang'): SGLang engines sized beside
vLLM's. The engine reaches the built scenario (scheduler sglang) and resolves to the bundled SGLang
scenarios' coefficients; the steady state's closed form (size.sglang_steady_state_requests) on
hand-worked cases; the written scenario prices as the search did; the launch line; refusals; vLLM
results unchanged.

Kept small: Llama-3.1-8B on one H100, fp8, one engine setting, ISL 512 / OSL 64, two
concurrencies, the steady evaluator (one compile); one small simulated search (auto).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from clirefusal import assert_refused, refused

import jaxprice as jp
from jaxprice import cli
from jaxprice._src import layouts as L
from jaxprice._src import serve
from jaxprice._src import launch
from jaxprice._src import size as S

MODEL = "llama-3.1-8b-instruct"
SMALL = dict(chip="h100", gpus=1, isl=512, osl=64, weights=["fp8"], max_num_seqs=(64,),
             max_num_batched_tokens=(2048,), concurrency=(4, 32), evaluator="steady")
LINE = ("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --tp 1 --quantization fp8 "
        "--kv-cache-dtype fp8_e4m3 --max-running-requests 64 --chunked-prefill-size 2048 --context-length 832 "
        "--mem-fraction-static 0.84 --disable-radix-cache --cuda-graph-max-bs 128"
        # SGLang's --mem-fraction-static holds the weights and KV cache only (test_launch_flags.py): the
        # static share priced; the decode graphs captured up to the plan's ceiling, 2 x 64 requests
        "    # --mem-fraction-static 0.84: the weights and KV cache SGLang's fraction holds, as priced "
        "(gpu_memory_utilization 0.9 less the activation, CUDA-graph and communication buffers it counts beside them)")


@pytest.fixture(scope="module")
def result():
    return jp.size(MODEL, tpot_ms=40, engine="sglang", **SMALL)


@pytest.fixture(scope="module")
def registry():
    return jp.Registry()


def _layout(tp=1, dp=1, ep=False, weights="fp8", seqs=64, chunk=2048):
    return L.Layout(tp, dp, ep, weights, seqs, chunk, L.SGLANG_GRAPH_MODE, "sglang")


def _candidate(registry, model, chip, lay, isl=1024, osl=1024):
    graph = registry.model(model)
    return L.build_candidates(model, graph, chip, lay.width, [lay], isl=isl, osl=osl, registry=registry)[0]


def test_the_engine_reaches_the_scenario_and_the_simulation(result):
    cand = result.best_candidate
    lay, scen = cand.layout, cand.deployment.scenario
    assert result.engine == "sglang" and lay.engine == "sglang" and lay.cudagraph_mode == "FULL_DECODE_ONLY"
    assert lay.label == "sglang tp1 dp1 fp8 mrr64 chunk2048"
    assert scen.name == "llama-3.1-8b-instruct-h100-fp8-sglang-tp1-mrr64-chunk2048"
    assert scen.engine["scheduler"] == "sglang"
    settings, _src = serve.engine_settings(cand.deployment)
    assert settings["scheduler"] == "sglang"
    assert (settings["max_num_seqs"], settings["max_num_batched_tokens"]) == (64, 2048)   # not SGLang's defaults
    d = lay.as_dict()
    assert d["engine"] == "sglang" and d["max_running_requests"] == 64 and d["chunked_prefill_size"] == 2048


@pytest.mark.parametrize("bundled, model, chip, tp", [("deepseek-v3-h200-fp8-sglang-tp8", "deepseek-v3", "h200", 8),
                                                      ("qwen3.5-397b-a17b-h100-fp8-sglang-tp8", "qwen3.5-397b-a17b",
                                                       "h100", 8)])
def test_coefficients_equal_the_bundled_sglang_scenarios(registry, bundled, model, chip, tp):
    """The registry scopes no coefficient by engine: a built SGLang candidate resolves to the very
    coefficients of the bundled SGLang scenario of that model, chip and widths (and of vLLM's)."""
    ref = jp.load_deployment(bundled)
    for engine in ("sglang", "vllm"):
        lay = L.Layout(tp, 1, False, "fp8", 256, 8192,
                       L.SGLANG_GRAPH_MODE if engine == "sglang" else "PIECEWISE", engine)
        dep = resolve_only(registry, model, chip, lay)
        assert dep.coefficients.names == ref.coefficients.names
        np.testing.assert_array_equal(np.asarray(dep.coefficients.values), np.asarray(ref.coefficients.values))


def resolve_only(registry, model, chip, lay):
    from jaxprice._src.resolve import resolve
    scen = L.build_scenario(model, chip, lay, isl=1024, osl=1024, graph=registry.model(model))
    return resolve(scen, registry)


def test_steady_closed_form_hand_worked(registry):
    """Fixed lengths (range_ratio 1), isl 1000, osl 100, C = 64 of max_running_requests 64:
    q = R / osl = 0.64 prompts a decode step; m = q / (1 - e^-q) = 1.3539 prompts a prefill step
    (k = 1, f = 0.3539), p = q / m = 1 - e^-q = 0.47271 prefill steps a decode step."""
    dep = _candidate(registry, MODEL, "h100", _layout(), isl=1000, osl=100).deployment
    wl = S.SizeWorkload(1000, 100, range_ratio=1.0)
    R, batches, tpot_w, ttft_w, n, emitting = S.sglang_steady_state_requests(dep, _layout(), wl, 64)
    q = 0.64
    m = q / (1.0 - math.exp(-q))
    p, f = 1.0 - math.exp(-q), m - 1
    assert R == 64 and n == 1
    assert batches[0] == ([1] * 64, [1049] * 64)                 # R decodes at ctx = isl + osl / 2
    assert batches[1] == ([1000], [0]) and batches[2] == ([1000, 1000], [0, 0])   # prefill-only steps
    np.testing.assert_allclose(tpot_w, [1.0, p * (1 - f), p * f], rtol=1e-12)
    np.testing.assert_allclose([p * (1 - f), p * f], [0.30541, 0.16730], atol=5e-5)
    per_step = np.array(tpot_w) / sum(tpot_w)                    # the step already scheduled, by count
    np.testing.assert_allclose(ttft_w, per_step + [0.0, (1 - f) / m, 2 * f / m], rtol=1e-12)
    assert emitting == pytest.approx(1 + p)
    # a prompt longer than the chunk: its chunks each a step of its own, q of them a decode step
    R2, b2, w2, f2, n2, e2 = S.sglang_steady_state_requests(dep, _layout(chunk=2048), S.SizeWorkload(5000, 100, 1.0),
                                                             64)
    assert n2 == 3 and b2[1:] == [([2048], [0]), ([2048], [2048]), ([904], [4096])]
    np.testing.assert_allclose(w2, [1.0, 0.64, 0.64, 0.64], rtol=1e-12)
    assert e2 == pytest.approx(1.64)


def test_steady_reserves_full_length_and_ranks_step_in_lockstep(registry):
    """Reservation to completion bounds R by the KV cache at isl + osl, not vLLM's mean context;
    an MoE model's dp ranks in lockstep put 1 - (1 - phi)^(dp - 1) of the decode weight on prefill."""
    dep = _candidate(registry, MODEL, "h100", _layout(weights="bf16", seqs=1024)).deployment
    wl = S.SizeWorkload(16000, 16000, range_ratio=1.0)
    R = S.sglang_steady_state_requests(dep, _layout(weights="bf16", seqs=1024), wl, 256)[0]
    cap = L._kv_tokens(dep, 24000)
    assert R == (math.floor(cap / 16) - 1) // math.ceil(32000 / 16)
    assert 1 < R < cap // 24000 - 2                               # below the bound at the mean context
    moe = L.Layout(1, 8, True, "fp8", 64, 8192, L.SGLANG_GRAPH_MODE, "sglang")
    dep8 = resolve_only(registry, "deepseek-v3", "h200", moe)
    R8, _b, w8, _t, _n, _e = S.sglang_steady_state_requests(dep8, moe, S.SizeWorkload(1000, 100, 1.0), 8 * 64)
    p = 1.0 - math.exp(-0.64)
    pi = 1.0 - (1.0 - p / (1.0 + p)) ** 7
    assert R8 == 64
    np.testing.assert_allclose(w8[0], 1.0 - pi, rtol=1e-12)
    np.testing.assert_allclose(sum(w8[1:]), p + pi, rtol=1e-12)


def test_written_scenario_prices_the_same(result, tmp_path):
    path = tmp_path / "best.yaml"
    path.write_text(result.scenario_yaml())
    text = path.read_text()
    assert "scheduler: sglang" in text and "-sglang-" in text
    dep = jp.load_deployment(str(path))
    cand = result.best_candidate
    assert dep.plan.digest == cand.deployment.plan.digest
    np.testing.assert_array_equal(np.asarray(dep.coefficients.values), np.asarray(cand.deployment.coefficients.values))
    assert serve.engine_settings(dep)[0]["scheduler"] == "sglang"
    best = result.best_result
    again = S.evaluate_steady(dep, best.layout, result.workload, list(best.concurrency))
    np.testing.assert_array_equal(again[0], best.ttft)
    np.testing.assert_array_equal(again[1], best.tpot)
    np.testing.assert_array_equal(again[2], best.tps_per_gpu)


def test_launch_line_and_json(result, registry):
    assert result.launch_command() == LINE
    data = result.as_dict()
    assert data["engine"] == "sglang" and data["sglang_command"] == LINE and "vllm_command" not in data
    refused(result.vllm_command, "sglang", "launch_command")
    moe = L.Layout(1, 8, True, "fp8", 256, 8192, L.SGLANG_GRAPH_MODE, "sglang")
    scen = L.build_scenario("deepseek-v3", "h200", moe, isl=1024, osl=1024, graph=registry.model("deepseek-v3"))
    text = launch.sglang_command(scen, moe, registry.model("deepseek-v3"), replicas=2)
    assert " --tp 8 --dp 8 --enable-dp-attention --ep-size 8 " in text and "--quantization" not in text
    # SGLang divides both limits over the DP-attention ranks (server_args.py _handle_data_parallelism,
    # model_runner's max_running_requests // dp_size): the line gives 8 x each rank's 256 and 8192
    assert "--max-running-requests 2048 --chunked-prefill-size 65536" in text and "x 2 replicas" in text
    assert "SGLang divides both over the 8 DP-attention ranks: 256 requests and 8192 tokens a rank" in text


def test_cli_sglang_end_to_end(result, capsys, tmp_path):
    out_json = tmp_path / "s.json"
    rc = cli.main(["size", MODEL, "--engine", "sglang", "--chip", "h100", "--gpus", "1", "--isl", "512", "--osl", "64",
                   "--tpot-ms", "40", "--weights", "fp8", "--max-running-requests", "64", "--chunked-prefill-size",
                   "2048", "--concurrency", "4,32", "--evaluator", "steady", "--quiet", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "max_running_requests 64; chunked_prefill_size 2048" in out and "graph mode" not in out
    assert LINE in out and "vllm serve" not in out
    import json
    assert json.loads(out_json.read_text())["engine"] == "sglang"


@pytest.mark.parametrize("args, words", [
    (["--engine", "tgi"], ("--engine", "unknown engine", "tgi", "vllm, sglang")),
    (["--engine", "sglang", "--graph-modes", "FULL"], ("--graph-modes", "vLLM's option", "no graph mode")),
    (["--engine", "sglang", "--max-num-seqs", "64"], ("--max-num-seqs", "vLLM's option", "--max-running-requests")),
    (["--engine", "sglang", "--max-num-batched-tokens", "64"], ("--max-num-batched-tokens", "--chunked-prefill-size")),
    (["--chunked-prefill-size", "2048"], ("--chunked-prefill-size", "SGLang's option", "--max-num-batched-tokens")),
    (["--engine", "vllm", "--max-running-requests", "8"], ("--max-running-requests", "--max-num-seqs")),
    (["--engine", "sglang", "--max-running-requests", "0"], ("--max-running-requests",)),
])
def test_cli_refusals_name_the_flag(capsys, args, words):
    assert_refused(capsys, ["size", MODEL, "--chip", "h100", "--gpus", "1", "--isl", "8", "--osl", "8"] + args, *words)


def test_api_refusals():
    base = dict(SMALL, concurrency=(4,))
    refused(lambda: jp.size(MODEL, engine="tgi", **base), "engine", "tgi", "vllm, sglang")
    refused(lambda: jp.size(MODEL, engine=None, **base), "engine", "vllm, sglang")
    refused(lambda: jp.size(MODEL, engine="sglang", **dict(base, cudagraph_modes=("FULL",))),
            "cudagraph_modes", "FULL", "SGLang")


def test_vllm_results_unchanged():
    """engine='vllm' is the default: the same layouts, labels and numbers bit for bit, no
    scheduler in the scenario, the same layout dict as before engines were added."""
    kw = dict(SMALL, cudagraph_modes=("PIECEWISE",))
    a, b = jp.size(MODEL, tpot_ms=40, **kw), jp.size(MODEL, tpot_ms=40, engine="vllm", **kw)
    assert [r.layout for r in a.results] == [r.layout for r in b.results]
    for x, y in zip(a.results, b.results):
        for k in ("ttft", "tpot", "tps_per_gpu", "resident"):
            np.testing.assert_array_equal(getattr(x, k), getattr(y, k))
    lay = a.best_result.layout
    assert lay.engine == "vllm" and "engine" not in lay.as_dict() and not lay.label.startswith("sglang")
    assert "scheduler" not in a.best_candidate.deployment.scenario.engine
    assert a.as_dict()["engine"] == "vllm" and a.as_dict()["vllm_command"].startswith("vllm serve")
    assert a.launch_command() == a.vllm_command()


def test_auto_simulates_under_sglangs_scheduler():
    """One small simulated search: the refined layout's numbers are the serving simulation's
    under SGLang's scheduler (differing from vLLM's on the same deployment), and the steady
    state's TPOT comes near them."""
    res = jp.size(MODEL, tpot_ms=40, engine="sglang", **dict(SMALL, evaluator="auto"))
    best = res.best_result
    assert best.source == "serve"
    dep = res.best_candidate.deployment
    wl = jp.Workload(512, 64)
    sg = serve.simulate_sweep(dep, wl, [4, 32])
    np.testing.assert_allclose(best.tpot, [float(r.summary["tpot_mean"]) for r in sg], rtol=1e-9)
    vl = serve.simulate_sweep(dep, wl, [32], engine={"scheduler": "vllm"})
    assert float(vl[0].summary["tpot_mean"]) != pytest.approx(best.tpot[1], rel=1e-3)
    steady = best.replaced["tpot"]
    np.testing.assert_allclose(steady, best.tpot, rtol=0.15)
