"""`jaxprice size` / jaxprice.size: candidates, fit, frontier, the best layout, the written
scenario, unmet targets, bad input, sharding over 4 virtual CPU devices.

Kept small: llama-3.1-70b-instruct (dense, bf16) on 4 x H200 with tp in {1, 2, 4} (tp1 does not
fit in bf16), one engine setting, three concurrencies: two plans, compiled once for the module.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jaxprice as jp
from jaxprice import cli
from jaxprice._src import launch
from jaxprice._src import size as S
from jaxprice._src.layouts import heads_reason, weight_formats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "llama-3.1-70b-instruct"
SMALL = dict(chip="h200", gpus=4, isl=1024, osl=256, weights=["bf16"], max_num_seqs=(256,),
             max_num_batched_tokens=(8192,), cudagraph_modes=("PIECEWISE",), concurrency=(1, 16, 128),
             evaluator="steady")


@pytest.fixture(scope="module")
def result():
    return jp.size(MODEL, tpot_ms=40, **SMALL)


def test_candidates_and_fit(result):
    labels = {c.layout.tp: c for c in result.candidates}
    assert sorted(labels) == [1, 2, 4]
    tp1 = labels[1]
    assert tp1.status == "rejected" and "does not fit" in tp1.reason and "1536-token request" in tp1.reason
    assert labels[2].status == "ok" and labels[4].status == "ok"
    assert [c.replicas for c in result.candidates] == [4, 2, 1]
    assert result.info["layouts_evaluated"] == 2
    assert result.info["compiles"] <= 1          # tp2 and tp4: one model structure, one kernel (stack.py; 0 if cached)
    # the rejected layout is never evaluated, so never chosen
    assert all(r.layout.tp != 1 for r in result.results)
    assert result.best_result.layout.tp in (2, 4)
    assert result.best_candidate.memory["kv_capacity_tokens"] >= S.max_model_len(1024, 256)


def test_candidate_space_axes():
    reg = jp.Registry()
    dense, moe, h200 = reg.model(MODEL), reg.model("deepseek-v3"), reg.chip("h200")
    lay = S.candidate_space(dense, h200, 8, max_num_seqs=(256,), max_num_batched_tokens=(8192,),
                            cudagraph_modes=("PIECEWISE",))
    assert {x.dp for x in lay} == {1} and not any(x.ep for x in lay)        # dense: replicas, no DP/EP
    assert {x.tp for x in lay} == {1, 2, 4, 8} and {x.weights for x in lay} == {"bf16", "fp8"}
    lay = S.candidate_space(moe, h200, 8)
    assert all(8 % x.width == 0 for x in lay) and not any(x.ep and x.width == 1 for x in lay)
    assert {x.weights for x in lay} == {"fp8"}                     # fp8 checkpoint, no 4-bit peak on H200
    assert len(lay) == 19 * 3 * 3 * 2                               # 19 parallel layouts x engine settings
    assert "nvfp4" in weight_formats(moe, reg.chip("b200"))
    # gpt-oss-120b's checkpoint is bf16 with MXFP4 experts: vLLM refuses --quantization fp8 on it
    # (it differs from the checkpoint's own), so online FP8 is not offered; llama's bf16 gets it
    assert weight_formats(reg.model("gpt-oss-120b"), h200) == ["bf16"]
    assert weight_formats(dense, h200) == ["bf16", "fp8"]
    with pytest.raises(jp.JaxpriceError, match="from its bf16 checkpoint: bf16"):
        S.size("gpt-oss-120b", chip="h200", gpus=2, isl=1024, osl=256, weights=["fp8"])


def test_frontier_non_dominated_and_contains_best(result):
    pts = np.array([(result.results[i].tps_per_user[j], result.results[i].tps_per_gpu[j])
                    for i, r in enumerate(result.results) for j in range(len(r.concurrency))])
    front = np.array([(result.results[i].tps_per_user[j], result.results[i].tps_per_gpu[j])
                      for i, j in result.frontier])
    assert len(front) >= 2
    for x, y in front:   # no point of any layout dominates a frontier point
        assert not np.any((pts[:, 0] >= x) & (pts[:, 1] >= y) & ((pts[:, 0] > x) | (pts[:, 1] > y)))
    for x, y in pts:     # every point off the frontier is dominated by (or equal to) a frontier point
        assert np.any((front[:, 0] >= x) & (front[:, 1] >= y))
    assert result.best in result.frontier
    b = result.point(result.best)
    assert b["tpot_ms"] <= 40
    # the best is the highest tokens/s per GPU among all points meeting the target
    ok = [(r.tps_per_gpu[j]) for r in result.results for j in range(len(r.concurrency)) if r.tpot[j] <= 0.040]
    assert b["tokens_per_s_per_gpu"] == pytest.approx(max(ok), rel=0, abs=0)
    assert result.runner_up is not None and result.runner_up[0] != result.best[0]
    assert result.margin == pytest.approx(b["tokens_per_s_per_gpu"]
                                          / result.point(result.runner_up)["tokens_per_s_per_gpu"] - 1)


def test_pareto_synthetic():
    pts = [(1, 5), (2, 4), (2, 3), (3, 1), (0.5, 5), (3, 1)]
    assert S.pareto(pts) == [0, 1, 3]


def test_steady_state_numbers(result):
    r = result.results[0]
    # TPOT grows and per-user rate falls with concurrency; per-GPU throughput grows
    assert np.all(np.diff(r.tpot) > 0) and np.all(np.diff(r.tps_per_gpu) > 0)
    np.testing.assert_allclose(r.tps_per_user, 1 / r.tpot)
    # at one client per engine: throughput per GPU is osl / E2E / width, E2E on the engine's clock
    # (TTFT also holds the request's admission latency, which delays no step, as in the simulation)
    # (the steady state's TTFT: the benchmark mean's differs by its first wave, below)
    w = result.workload
    dep = result.candidates[r.index].deployment
    steady = S.evaluate_steady(dep, r.layout, w, r.concurrency, num_prompts=math.inf)
    e2e = steady[0][0] - S.admission_latency(dep.coefficients, w.mean_isl) + (w.mean_osl - 1) * r.tpot[0]
    assert r.tps_per_gpu[0] == pytest.approx(w.mean_osl / e2e / r.layout.width, rel=1e-12)


def test_steady_ttft_is_the_benchmark_mean_with_its_first_wave(result):
    """The benchmark's mean TTFT over its 10 x C prompts: the first wave's R a rank (C at once on
    an idle engine, prefilled back to back, budget tokens a step) at first_wave's time, the rest at
    the steady state's; other prompt counts move the share, inf leaves the steady state alone."""
    r = result.results[0]
    w, dep = result.workload, result.candidates[r.index].deployment
    conc = list(r.concurrency)
    alone = S.evaluate_steady(dep, r.layout, w, conc, num_prompts=math.inf)
    assert np.all(alone[1] == r.tpot) and np.all(alone[2] == r.tps_per_gpu)
    isl = int(round(w.mean_isl))
    hot = float(dep.coefficients["host_output_token"])
    adm = S.admission_latency(dep.coefficients, w.mean_isl)
    for j, c in enumerate(conc):
        R = int(r.resident[j])
        batch, steps = S.first_wave(r.layout, w, R)
        budget = r.layout.max_num_batched_tokens
        assert sum(batch[0]) == min(budget, R * isl) and set(batch[1]) == {0}
        assert steps == pytest.approx(np.mean([math.ceil(i * isl / budget) for i in range(1, R + 1)]))
        s_first = float(S.price_batches(dep, S.stack_rows([batch], S._rows(len(batch[0])) + 1))[0])
        share = min(R * r.layout.dp, c) / (10 * c)
        want = share * (adm + hot + steps * s_first) + (1 - share) * alone[0][j]
        assert r.ttft[j] == pytest.approx(want, rel=1e-12)
        twice = S.evaluate_steady(dep, r.layout, w, [c], num_prompts=20 * c)[0][0]
        assert twice == pytest.approx(share / 2 * (adm + hot + steps * s_first) + (1 - share / 2) * alone[0][j],
                                      rel=1e-12)


def test_one_row_padding_per_structure_prices_every_layout_as_alone():
    """Layouts of one structure with different resident batches (dp 1 and dp 2: 64 and 32 clients
    per rank) are priced in one call padded to the largest (one compile, not one per padding),
    each layout's numbers those of its own kernel at its own padding."""
    r = jp.size("qwen3-30b-a3b", chip="h100", gpus=2, isl=512, osl=64, weights=["fp8"], max_num_seqs=(64,),
                max_num_batched_tokens=(4096,), cudagraph_modes=("PIECEWISE",), concurrency=(2, 64),
                evaluator="steady", ep=[False])
    assert sorted((x.layout.tp, x.layout.dp) for x in r.results) == [(1, 1), (1, 2), (2, 1)]
    assert r.info["search_compiles"] == 1
    for res in r.results:
        dep = next(c.deployment for c in r.candidates if c.layout == res.layout)
        alone = S.evaluate_steady(dep, res.layout, r.workload, res.concurrency)
        for got, want in zip((res.ttft, res.tpot, res.tps_per_gpu), alone[:3]):
            np.testing.assert_allclose(got, want, rtol=1e-14)


def test_written_scenario_prices_the_same(result, tmp_path):
    path = tmp_path / "best.yaml"
    path.write_text(result.scenario_yaml())
    dep = jp.load_deployment(path)
    cand = result.best_candidate
    assert dep.plan == cand.deployment.plan
    np.testing.assert_array_equal(np.asarray(dep.coefficients.values), np.asarray(cand.deployment.coefficients.values))
    i, j = result.best
    lay = result.results[i].layout
    ttft, tpot, per_gpu, _, _, _ = S.evaluate_steady(dep, lay, result.workload, result.results[i].concurrency)
    # one plan's own kernel (FAST_COMPILE) against the deployment-axis kernel of the search: to the ulp
    assert tpot[j] == pytest.approx(result.results[i].tpot[j], rel=1e-14)
    assert per_gpu[j] == pytest.approx(result.results[i].tps_per_gpu[j], rel=1e-14)
    assert ttft[j] == pytest.approx(result.results[i].ttft[j], rel=1e-14)
    # and the step the search priced is what `price` gives for the written file
    R, batches, *_ = S.steady_state_requests(dep, lay, result.workload, int(result.results[i].concurrency[j]))
    s, c = batches[0]
    one = jp.price(dep.plan, dep.coefficients, jp.Batch.from_requests(s, c, decode_threshold=8))
    assert float(one.no_overlap) == pytest.approx(float(S.price_batches(dep, jp.Batch.stack(
        [jp.Batch.from_requests(s, c, pad_to=S._rows(R) + 1, decode_threshold=8)]))[0]), rel=1e-12)
    ref = jp.Batch.stack([jp.Batch.from_requests(s, c, pad_to=S._rows(R) + 1, decode_threshold=8)])
    got = S.stack_rows([(s, c)], S._rows(R) + 1)
    for f in ("scheduled", "computed", "prompt_len", "mask", "decode_threshold"):
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(ref, f)))
    text = result.vllm_command()
    assert text.startswith("vllm serve meta-llama/Llama-3.1-70B-Instruct") and f"--tensor-parallel-size {lay.tp}" in text


def test_unmet_targets_name_the_closest(result):
    frontier, best, runner, margin, miss = S.choose(result.results, None, 0.001)
    assert best is None and runner is None
    fastest = min(result.results, key=lambda r: r.tpot.min())
    assert fastest.layout.label in miss and "closest" in miss and "over the 1 ms target" in miss


def test_cli_end_to_end(result, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(S, "size", lambda *a, **k: result)
    import jaxprice._src.cli_size as C
    png, yml, js = tmp_path / "f.png", tmp_path / "s.yaml", tmp_path / "r.json"
    rc = cli.main(["size", MODEL, "--chip", "h200", "--gpus", "4", "--isl", "1024", "--osl", "256", "--tpot-ms", "40",
                   "--plot", str(png), "--write-scenario", str(yml), "--json", str(js), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0 and "best:" in out and "vllm serve" in out and "Pareto frontier" in out
    # the fixed part of every TTFT is said: host_admission_per_request + _per_token x the mean prompt
    coefs = result.candidates[result.best_result.index].deployment.coefficients
    adm = coefs["host_admission_per_request"] + coefs["host_admission_per_token"] * result.workload.mean_isl
    assert f"every TTFT holds the request's host admission latency, {adm * 1e3:.1f} ms" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(js.read_text())
    assert data["best"]["label"] == result.best_result.layout.label and data["rejected"][0]["layout"]["tp"] == 1
    assert jp.load_scenario(yml).parallel["tp"] == result.best_result.layout.tp
    assert C.describe_space(result.candidates, {"model": MODEL, "model_source": MODEL, "chip": "h200", "gpus": 4,
                                                "workload": result.workload}, True).count("rejected tp1") == 1


def test_the_candidate_space_says_when_the_fabric_joins_nothing(result):
    """--fabric with every layout inside one node is said to be unused, not silently taken."""
    import jaxprice._src.cli_size as C
    ctx = {"model": MODEL, "model_source": MODEL, "chip": "h200", "gpus": 4, "workload": result.workload,
           "fabric": "ib-400g"}
    assert "--fabric ib-400g unused: no layout spans more than one node of 8 GPUs" in \
        C.describe_space(result.candidates, dict(ctx, gpus_per_node=8))
    assert "unused" not in C.describe_space(result.candidates, dict(ctx, gpus_per_node=2))     # tp4 spans two
    assert "unused" not in C.describe_space(result.candidates, dict(ctx, fabric=None, gpus_per_node=8))


def test_cli_json_to_stdout_is_json_alone(result, capsys, monkeypatch):
    """--json -: stdout carries the JSON and nothing else (a script pipes it); the report goes to stderr."""
    monkeypatch.setattr(S, "size", lambda *a, **k: result)
    rc = cli.main(["size", MODEL, "--chip", "h200", "--gpus", "4", "--isl", "1024", "--osl", "256", "--tpot-ms", "40",
                   "--json", "-", "--quiet"])
    cap = capsys.readouterr()
    assert rc == 0 and json.loads(cap.out)["best"]["label"] == result.best_result.layout.label
    assert "best:" in cap.err and "vllm serve" in cap.err


def test_cli_unmet_targets_exit_1(result, capsys, monkeypatch):
    import dataclasses
    frontier, best, runner, margin, miss = S.choose(result.results, None, 0.001)
    unmet = dataclasses.replace(result, best=None, runner_up=None, margin=None, miss=miss, tpot_target=0.001)
    monkeypatch.setattr(S, "size", lambda *a, **k: unmet)
    rc = cli.main(["size", MODEL, "--chip", "h200", "--gpus", "4", "--isl", "1024", "--osl", "256", "--tpot-ms",
                   "1", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and "no layout meets TPOT <= 1 ms; closest:" in err


@pytest.mark.parametrize("argv, needle", [
    (["--gpus", "3", "--weights", "bf16"], "3 GPUs is not a multiple of any width tp x dp the model fits at (2, 4"),
    (["--gpus", "4", "--tp", "8"], "field '--tp', value [8]: 4 GPUs is not a multiple of any width tp x dp in [8]"),
    (["--gpus", "4", "--chip", "h201"], "unknown chip"),
    (["--gpus", "4", "--tpot-ms", "0"], "a target must be > 0"),
    (["--gpus", "4", "--ttft-ms", "-5"], "a target must be > 0"),
    (["--gpus", "0"], "must be at least 1"),
    (["--gpus", "4", "--weights", "fp7"], "unknown weight format"),
    (["--gpus", "4", "--osl", "1"], "field '--osl', value 1: must be at least 2"),
    # a value listed twice would be searched once: refused as serve refuses a load listed twice
    (["--gpus", "4", "--concurrency", "4,8,4"], "field '--concurrency', value 4: lists this value twice"),
    (["--gpus", "4", "--tp", "1,2,1"], "field '--tp', value 1: lists this value twice"),
    (["--gpus", "4", "--weights", "fp8,fp8"], "field '--weights', value 'fp8': lists this value twice"),
    (["--gpus", "4", "--spec-tokens", "0,1,...,3,2"], "field '--spec-tokens', value 2: lists this value twice"),
])
def test_bad_input_one_line_exit_2(capsys, argv, needle):
    base = {"--chip": "h200", "--isl": "1024", "--osl": "256"}
    args = list(argv)
    for k, v in base.items():
        if k not in args:
            args += [k, v]
    rc = cli.main(["size", MODEL] + args + ["--quiet", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
                                            "--graph-modes", "PIECEWISE"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and needle in err, err


def test_unknown_model_exit_2(capsys):
    rc = cli.main(["size", "llama-9", "--chip", "h200", "--gpus", "4", "--isl", "1", "--osl", "2"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "unknown model" in err and "llama-9" in err


def test_one_token_output_refused_by_the_api():
    # sizing ranks by tokens/s per user = 1 / TPOT, which a one-token output does not have
    with pytest.raises(jp.JaxpriceError, match="field 'osl', value 1: must be at least 2.*no TPOT"):
        jp.size(MODEL, chip="h200", gpus=4, isl=1024, osl=1)


def test_graph_file_model(tmp_path):
    reg = jp.Registry()
    g = reg.model("llama-3.1-8b-instruct")
    graph, registry, source = S.load_model(g.path)
    assert graph.name == g.name and registry.model(g.name) is graph and source == g.path


WORKER = textwrap.dedent("""
    import json, jax, numpy as np
    import jaxprice as jp
    kw = dict(chip="h200", gpus=2, isl=512, osl=64, tp=[2], weights=["bf16"], max_num_seqs=(256,),
              max_num_batched_tokens=(8192,), cudagraph_modes=("PIECEWISE",), concurrency=(1, 8, 64),
              evaluator="steady")
    r = jp.size("llama-3.1-8b-instruct", **kw)
    one = jp.size("llama-3.1-8b-instruct", mesh=jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("batch",)), **kw)
    a, b = r.results[0], one.results[0]
    print(json.dumps({"devices": jax.device_count(), "used": r.info["devices"],
                      "tpot": np.max(np.abs(a.tpot / b.tpot - 1)).item(),
                      "gpu": np.max(np.abs(a.tps_per_gpu / b.tps_per_gpu - 1)).item()}))
""")


def test_sharded_over_four_virtual_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", WORKER], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["devices"] == 4 and got["used"] == 4
    assert got["tpot"] < 1e-12 and got["gpu"] < 1e-12


def test_steady_state_lockstep_weights():
    """An MoE model's data-parallel ranks step together: a step carries some rank's prefill chunk
    dp times as often (no compile: the batches and weights only)."""
    reg = jp.Registry()
    graph = reg.model("deepseek-v3")
    wl = S.SizeWorkload(1024, 1024, 1.0)
    weights = {}
    for dp in (1, 2):
        lay = S.Layout(8 // dp, dp, True, "fp8", 256, 8192, "PIECEWISE")
        dep = jp.resolve(S.build_scenario("deepseek-v3", "h200", lay, isl=1024, osl=1024, graph=graph), reg)
        R, batches, tw, fw, chunks = S.steady_state_requests(dep, lay, wl, 64 * dp)
        assert R == 64 and chunks == 1 and len(batches) == 2 and batches[1][0] == [1] * 64 + [1024]
        assert fw == [0.0, 1.0] and sum(tw) == pytest.approx(1.0)
        weights[dp] = tw[1]
    assert weights[1] == pytest.approx(64 / 1024) and weights[2] == pytest.approx(2 * 64 / 1024)


def _prefill_tokens(batches, weights, R):
    """Prompt tokens a step carries on average: the weighted rows past the R decodes."""
    return sum(w * sum(s[R:]) for (s, _c), w in zip(batches, weights))


def test_steady_state_packs_prompts_past_one_a_step():
    """Short outputs at many residents finish more than one request a step: the steps carry
    floor(q) or floor(q) + 1 whole prompts, q = R / osl on average (it was capped at one a
    step: Llama-3.1-8B on one H100 at 1k/128, C = 512, 7,897 tok/s per GPU against the
    simulation's 4,413; 4,507 now). No compile: the batches and weights only."""
    reg = jp.Registry()
    graph = reg.model("llama-3.1-8b-instruct")
    lay = S.Layout(1, 1, False, "bf16", 512, 8192, "PIECEWISE")
    dep = jp.resolve(S.build_scenario("llama-3.1-8b-instruct", "h100", lay, isl=1024, osl=128, graph=graph), reg)
    wl = S.SizeWorkload(1024, 128, 1.0)
    R, batches, tw, fw, n = S.steady_state_requests(dep, lay, wl, 256)    # q = 2: two prompts every step
    assert (R, n, tw, fw) == (256, 1, [0.0, 1.0], [0.0, 1.0])
    assert batches[1] == ([1] * 256 + [1024, 1024], batches[0][1] + [0, 0])
    R, batches, tw, fw, n = S.steady_state_requests(dep, lay, wl, 200)    # q = 1.5625
    assert R == 200 and [len(b[0]) - R for b in batches] == [0, 1, 2]
    assert tw == pytest.approx([0.0, 0.4375, 0.5625]) and fw == pytest.approx([0.0, 0.4375, 0.5625])
    for c in (16, 64, 100, 128, 200, 256, 300, 400):
        R, batches, tw, *_ = S.steady_state_requests(dep, lay, wl, c)
        assert sum(tw) == pytest.approx(1.0) and min(tw) >= 0.0
        assert _prefill_tokens(batches, tw, R) == pytest.approx(R / 128 * 1024)


def test_steady_state_budget_bounds_residents():
    """The step budget must prefill prompts as fast as requests finish: R + R isl / osl <=
    max_num_batched_tokens (here 1024 x 16 / 144 = 113 of 256 clients); the last prompt of a
    step is cut to the room left (911 - 7 x 128 = 15 tokens), its weight raised to keep the
    tokens; a chunked prompt at more than one chunk a step is priced by its chunks' marginal
    cost (the decode-only weight below zero)."""
    reg = jp.Registry()
    graph = reg.model("llama-3.1-8b-instruct")
    lay = S.Layout(1, 1, False, "bf16", 512, 1024, "PIECEWISE")
    dep = jp.resolve(S.build_scenario("llama-3.1-8b-instruct", "h100", lay, isl=128, osl=16, graph=graph), reg)
    R, batches, tw, fw, n = S.steady_state_requests(dep, lay, S.SizeWorkload(128, 16, 1.0), 256)
    assert R == 113 and n == 1 and batches[2][0][R:] == [128] * 7 + [15]
    assert _prefill_tokens(batches, tw, R) == pytest.approx(113 / 16 * 128)
    assert len(batches[2][0]) <= S._spec_rows([(R, batches)])
    R, batches, tw, fw, n = S.steady_state_requests(dep, lay, S.SizeWorkload(1536, 256, 1.0), 256)
    assert R == 1024 * 256 // (1536 + 256) == 146 and n == 2 and tw[0] < 0.0
    assert [b[0][R:] for b in batches[1:]] == [[878], [658]] and fw == [0.0, 1.0, 1.0]
    assert _prefill_tokens(batches, tw, R) == pytest.approx(146 / 256 * 1536)


# ----------------------------------------------------------------------------- the serving simulation in the search

SIM = dict(chip="h200", gpus=4, isl=256, osl=64, weights=["bf16"], max_num_seqs=(256,), max_num_batched_tokens=(8192,),
           cudagraph_modes=("PIECEWISE",), concurrency=(1, 8))


@pytest.fixture(scope="module")
def simulated():
    """auto: steady for both layouts, then both re-run under the simulation at 10 x C prompts
    (both are on the frontier or near the target); shapes small enough for one scheduler bucket."""
    return jp.size(MODEL, tpot_ms=40, evaluator="auto", **SIM)


def test_simulated_numbers_equal_simulate_sweep(simulated):
    sims = [r for r in simulated.results if r.source == "serve"]
    assert len(sims) == len(simulated.results) == 2 and simulated.info["layouts_simulated"] == 2
    assert simulated.info["steps_simulated"] > 0 and simulated.info["scheduler_iterations"] > 0
    wl = jp.Workload(isl=256, osl=64, range_ratio=0.8)
    r = sims[0]
    dep = simulated.candidates[r.index].deployment
    # 10 x C prompts, the benchmark's; two more levels (C + 1: simulate_sweep refuses a level given
    # twice): four lanes, the scheduler shape the search compiled (its two layouts x two levels), so
    # no new compile
    ref = jp.simulate_sweep(dep, wl, list(r.concurrency) + [c + 1 for c in r.concurrency])[:len(r.concurrency)]
    np.testing.assert_array_equal(r.ttft, [x.summary["ttft_mean"] for x in ref])
    np.testing.assert_array_equal(r.tpot, [x.summary["tpot_mean"] for x in ref])
    np.testing.assert_array_equal(r.tps_per_gpu, [x.summary["output_tps"] / r.layout.width for x in ref])
    assert [x.summary["output_tps_per_gpu"] for x in ref] == pytest.approx(list(r.tps_per_gpu), rel=1e-12)
    # the steady numbers it replaced are kept, and differ (another evaluator), though not wildly
    assert r.replaced["source"] == "steady" and not np.array_equal(r.replaced["tpot"], r.tpot)
    np.testing.assert_allclose(r.replaced["tpot"], r.tpot, rtol=0.5)
    assert S.LayoutResult.as_dict(r)["source"] == "serve"


def test_simulated_frontier_non_dominated_and_simulated(simulated):
    res = simulated.results
    pts = np.array([(r.tps_per_user[j], r.tps_per_gpu[j]) for r in res for j in range(len(r.concurrency))])
    assert simulated.frontier
    for i, j in simulated.frontier:
        x, y = res[i].tps_per_user[j], res[i].tps_per_gpu[j]
        assert not np.any((pts[:, 0] >= x) & (pts[:, 1] >= y) & ((pts[:, 0] > x) | (pts[:, 1] > y)))
        assert res[i].source == "serve"
    assert simulated.best in simulated.frontier and simulated.best_result.source == "serve"
    assert simulated.point(simulated.best)["tpot_ms"] <= 40
    from jaxprice._src.cli_size import describe_sources, format_table
    text = describe_sources(simulated)
    assert "2 of 2 layouts from the serving simulation" in text and "every frontier point simulated" in text
    assert " sim " in format_table(simulated) + " " and "std" not in format_table(simulated).split("src:")[0]


def _fake(label, tpot, gpu, k):
    lay = S.Layout(k + 1, 1, False, "bf16", 256, 8192, "PIECEWISE")
    tpot = np.asarray(tpot, float)
    return S.LayoutResult(k, lay, 1, np.array([1, 8]), np.full(2, 0.1), tpot, np.asarray(gpu, float), 1 / tpot,
                          np.array([1, 8]))


def test_refine_simulates_until_the_frontier_is_simulated(monkeypatch):
    """Layouts whose simulated numbers fall let a steady one take the lead: that one is simulated
    in the next round; the limit stops the rounds; a refused layout is dropped and rejected."""
    res = [_fake("a", [0.010, 0.020], [100, 400], 0), _fake("b", [0.011, 0.021], [90, 380], 1),
           _fake("e", [0.0115, 0.0215], [85, 370], 2), _fake("d", [0.012, 0.022], [10, 20], 3)]
    cands = [S.Candidate(r.layout, 1, "ok") for r in res]
    scale = {1: 0.5, 2: 0.5, 3: 0.99}
    calls = []

    def fake_many(deps, layouts, workload, concurrencies, **kw):
        calls.append([lay.tp for lay in layouts])
        out = []
        for lay in layouts:
            r = res[lay.tp - 1]
            out.append(S.JaxpriceError("stalled", field="engine") if lay.tp == 4 else
                       (r.ttft, r.tpot, r.tps_per_gpu * scale[lay.tp], r.tps_per_user, r.resident, 10))
        return out
    monkeypatch.setattr(S, "evaluate_serve_many", fake_many)
    fresh = lambda: [dataclasses.replace(r) for r in res]  # noqa: E731
    got, rounds = S.refine(fresh(), cands, S.SizeWorkload(256, 64), [1, 8], None, 0.05, limit=8, first="frontier")
    assert calls == [[1, 2], [3]] and rounds == 2           # a, b (best, runner-up, frontier), then e
    assert {r.layout.tp: r.source for r in got} == {1: "serve", 2: "serve", 3: "serve", 4: "steady"}
    assert got[0].replaced["source"] == "steady" and got[0].replaced["tps_per_gpu"][1] == 400
    front, best, *_ = S.choose(got, None, 0.05)
    assert all(got[i].source == "serve" for i, _ in front) and got[best[0]].layout.tp == 3
    calls.clear()
    got, rounds = S.refine(fresh(), cands, S.SizeWorkload(256, 64), [1, 8], None, 0.05, limit=0, first="frontier",
                           max_rounds=1)
    assert calls == [[1, 2]] and rounds == 1 and got[2].source == "steady"      # stopped: e stays steady
    # 'near': within 20 % of the 10 ms target and within 20 % of the best such throughput; the
    # frontier, best and runner-up always, ``limit`` more at most
    sel = S.simulation_set(res, None, 0.010, near=0.2, band=0.2, limit=8)
    assert sel == [0, 1, 2]          # a: frontier and best (alone meets 10 ms), b, e: near; d: near, too slow
    assert S.simulation_set(res, None, 0.010, near=0.2, band=0.2, limit=0) == [0]
    assert S.simulation_set(res, None, 0.010, near=0.2, band=0.2, limit=1) == [0, 1]
    assert S.simulation_set(res, None, 0.010, near=0.2, band=0.2, limit=8, done=[0]) == [1, 2]
    calls.clear()
    got, rounds = S.refine([dataclasses.replace(res[3])], cands, S.SizeWorkload(256, 64), [1, 8], None, None,
                           first="frontier")
    assert got == [] and cands[3].status == "rejected" and "stalled" in cands[3].reason


def test_refine_leaves_points_far_over_the_ttft_target_on_the_steady_state():
    """A level whose steady TTFT is over SKIP_TTFT_FACTOR x the target is not re-run (the costliest
    lanes: queueing at the highest C); its numbers stay the steady state's, marked as such, and the
    simulation of that level (run here) misses the target too, so neither the frontier nor the
    choice could have used it. The other levels equal simulate_sweep's."""
    cfg = dict(SIM, max_num_seqs=(16,), concurrency=(1, 8, 64))
    got = jp.size(MODEL, tpot_ms=40, ttft_ms=130, evaluator="auto", **cfg)
    assert len(got.results) == 2
    for r in got.results:
        assert r.source == "serve" and r.kept.tolist() == [False, False, True]
        assert r.replaced["ttft"][2] > S.SKIP_TTFT_FACTOR * 0.130 and r.ttft[2] == r.replaced["ttft"][2]
        assert [r.point_source(j) for j in range(3)] == ["serve", "serve", "steady"]
        assert [p["source"] for p in r.as_dict()["points"]] == ["serve", "serve", "steady"]
        dep = got.candidates[r.index].deployment
        ref = jp.simulate_sweep(dep, jp.Workload(isl=256, osl=64, range_ratio=0.8), [1, 8, 64])
        np.testing.assert_array_equal(r.ttft[:2], [x.summary["ttft_mean"] for x in ref[:2]])
        np.testing.assert_array_equal(r.tpot[:2], [x.summary["tpot_mean"] for x in ref[:2]])
        assert ref[2].summary["ttft_mean"] > 0.130                  # the skipped level misses the target simulated too
        assert all(res_j != 2 for res_i, res_j in got.frontier if got.results[res_i] is r)
    assert got.best is not None and got.best[1] != 2
    np.testing.assert_array_equal(S.simulation_points(got.results[0], None), [True, True, True])
    from jaxprice._src.cli_size import describe_sources, format_table
    assert "2 point(s) of simulated layouts left on the steady state" in describe_sources(got)
    assert "not re-run" in format_table(got)


def _size_vs_measured():
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments",
                        "size_vs_measured.py")
    spec = importlib.util.spec_from_file_location("size_vs_measured", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_run_to_run_scores_one_run_against_another():
    """The sizing check's noise floor (experiments/size_vs_measured.run_to_run): two deployments
    measured twice. Runs that agree order every pair alike and name the same best; runs that swap
    which deployment is faster order none alike and never name the same best."""
    from jaxprice import accuracy as acc
    sv = _size_vs_measured()
    g = ("m", "h200", "1k1k")

    def sweep(tpot_ms):
        return [(c, 0.05, tpot_ms * 1e-3 * (1 + c / 64)) for c in (4, 16, 64)]

    def point(d):
        return acc.Point(row=2, scenario=f"{d}-cfg1.yaml", deployment=d, model="m", hardware="h200", dtype="fp8",
                         engine="vllm", tp=1, ep=1, dp=1, workload="1k1k", isl=1024, osl=1024, concurrency=4,
                         measured=1e-2, anchor_concurrency=4)
    first = {("a", "1k1k"): point("a"), ("b", "1k1k"): point("b")}
    agree = {g: {"a": {"a-cfg1": sweep(10), "a-cfg2": sweep(10.2)}, "b": {"b-cfg1": sweep(11), "b-cfg2": sweep(11.5)}}}
    r = sv.run_to_run(agree, first, 4)
    assert (r["groups"], r["deployments"], r["scored"]) == (1, 2, 1)
    assert r["pairwise"] == 1.0 and r["best_cases"] == 1.0 and r["best_groups"] == 1.0
    swap = {g: {"a": {"a-cfg1": sweep(10), "a-cfg2": sweep(11)}, "b": {"b-cfg1": sweep(11), "b-cfg2": sweep(10)}}}
    r = sv.run_to_run(swap, first, 4)
    assert r["cases"] > 0 and r["pairwise"] == 0.0 and r["best_cases"] == 0.0 and r["best_groups"] == 0.0
    # a deployment measured once is left out, and a group left with one deployment is not scored
    assert sv.repeated_groups({g: {"a": agree[g]["a"], "b": {"b-cfg1": sweep(11)}}}) == {}


def test_runner_up_is_a_different_outcome_and_ties_are_listed():
    """Two layouts with the very same numbers (a setting that does not bind at that load) are tied:
    the runner-up is the next layout whose numbers differ, and the margin is against it. By hand:
    best 100 tok/s/GPU, its twin 100, then 80 -> margin 100 / 80 - 1 = 0.25."""
    from types import SimpleNamespace as NS

    def res(tps, ttft=0.5, tpot=0.02):
        return NS(tps_per_gpu=np.array([tps / 2, tps]), tps_per_user=np.array([60.0, 40.0]),
                  ttft=np.array([0.1, ttft]), tpot=np.array([0.01, tpot]), concurrency=np.array([4, 8]))
    results = [res(100.0), res(100.0), res(80.0), res(100.0 * (1 + 1e-6))]
    frontier, best, runner, margin, miss = S.choose(results, 1.0, 0.05)
    assert best == (3, 1) and runner == (0, 1) and margin == pytest.approx(1e-6)   # 1e-6 apart: not a tie
    results = results[:3]
    frontier, best, runner, margin, miss = S.choose(results, 1.0, 0.05)
    assert best == (0, 1) and runner == (2, 1) and margin == pytest.approx(0.25)
    assert S.tied_with_best(results, 1.0, 0.05) == [1]
    results[1].tpot = np.array([0.01, 0.021])                  # same throughput, another TPOT: not tied
    assert S.tied_with_best(results, 1.0, 0.05) == [] and S.choose(results, 1.0, 0.05)[2] == (1, 1)


def test_layouts_wider_than_a_node_need_a_fabric_and_launch_per_node():
    """A 16-GPU engine on 8-GPU nodes is rejected naming --fabric without one; with ib-400g it
    resolves over 2 nodes, the written scenario names the fabric, and the vllm line says how the
    nodes launch (DP ranks: --data-parallel-size-local and --headless ranks; TP 16: vLLM's
    multiprocessing executor over the nodes, --nnodes/--node-rank/--master-addr, the others --headless)."""
    reg = jp.Registry()
    graph = reg.model(MODEL)
    base = S.Layout(tp=16, dp=1, ep=False, weights="bf16", max_num_seqs=256, max_num_batched_tokens=8192,
                    cudagraph_mode="PIECEWISE")
    wide_dp = dataclasses.replace(base, tp=2, dp=8)
    kw = dict(isl=1024, osl=256, registry=reg)
    (no,) = S.build_candidates(MODEL, graph, "h200", 16, [base], **kw)
    assert no.status == "rejected" and no.reason.startswith("spans 2 nodes of 8 GPUs") and "ib-400g" in no.reason
    tp16, dp8 = S.build_candidates(MODEL, graph, "h200", 16, [base, wide_dp], fabric="ib-400g", **kw)
    assert tp16.status == "ok" and dp8.status == "ok"
    scen = tp16.deployment.scenario
    assert (scen.nodes, scen.fabric) == (2, "ib-400g")
    assert tp16.deployment.plan.digest != S.build_candidates(MODEL, graph, "h200", 16, [base], fabric="roce-200g",
                                                              **kw)[0].deployment.plan.digest   # the network prices
    text = launch.vllm_command(scen, base, graph)
    assert "--tensor-parallel-size 16" in text and "--nnodes 2 --node-rank 0 --master-addr HEAD_IP" in text
    assert "--distributed-executor-backend" not in text and "ib-400g" in text
    text = launch.vllm_command(dp8.deployment.scenario, wide_dp, graph)
    assert ("--data-parallel-size 8 --" in text and "--data-parallel-size-local 4" in text
            and "node 1: the same with --headless --data-parallel-start-rank 4" in text)
    doc = launch.scenario_document(scen)
    assert "fabric: ib-400g" in doc
    single = S.build_scenario(MODEL, "h200", dataclasses.replace(base, tp=8), isl=1024, osl=256, graph=graph,
                              fabric="ib-400g")
    assert single.nodes == 1 and single.fabric is None          # one node: no network named


def test_size_refuses_an_unknown_fabric(capsys):
    known = r"unknown fabric \(known: ethernet-100gbe, ib-400g, roce-200g"
    with pytest.raises(jp.JaxpriceError, match=r"field 'fabric', value 'ib-999': " + known):
        jp.size(MODEL, fabric="ib-999", **SMALL)
    rc = cli.main(["size", MODEL, "--chip", "h200", "--gpus", "4", "--isl", "8", "--osl", "8", "--fabric", "x"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "field '--fabric', value 'x': unknown fabric (known:" in err


def test_vllm_line_says_a_four_bit_format_needs_a_prequantized_checkpoint():
    """FP8 from a bf16 checkpoint is vLLM's online quantization; NVFP4 is not: the line says to
    serve a published NVFP4 checkpoint instead of implying --quantization converts the bf16 one."""
    graph = jp.Registry().model(MODEL)
    lay = S.Layout(tp=2, dp=1, ep=False, weights="nvfp4", max_num_seqs=64, max_num_batched_tokens=8192,
                   cudagraph_mode="PIECEWISE")
    text = launch.vllm_command(S.build_scenario(MODEL, "b200", lay, isl=1024, osl=256, graph=graph), lay, graph)
    assert "--quantization modelopt_fp4" in text and "vLLM does not quantize to it online" in text
    fp8 = dataclasses.replace(lay, weights="fp8")
    text = launch.vllm_command(S.build_scenario(MODEL, "b200", fp8, isl=1024, osl=256, graph=graph), fp8, graph)
    assert "--quantization fp8" in text and "online" not in text


def test_launch_lines_trust_remote_code_where_the_config_maps_its_own_code():
    """A model whose config.json has an auto_map (its classes in its own repository: Kimi-K2.5, as
    vLLM's recipe launches it with --trust-remote-code) gets the flag on both engines' lines; a
    model without one (Llama-3.1) does not. A registry graph is looked up by its hf_repo in the
    bundled configs."""
    reg = jp.Registry()
    lay = S.Layout(tp=8, dp=1, ep=False, weights="fp8", max_num_seqs=64, max_num_batched_tokens=8192,
                   cudagraph_mode="PIECEWISE")
    for model, flagged in (("kimi-k2.5", True), (MODEL, False)):
        graph = reg.model(model)
        lay_m = dataclasses.replace(lay, weights=graph.weight_dtype)
        scen = S.build_scenario(model, "h200", lay_m, isl=1024, osl=256, graph=graph)
        line = launch.vllm_command(scen, lay_m, graph).split("#")[0]
        assert line.startswith("vllm serve ") and ("--trust-remote-code" in line) == flagged, line
        sg = launch.sglang_command(scen, dataclasses.replace(lay_m, engine="sglang"), graph).split("#")[0]
        assert ("--trust-remote-code" in sg) == flagged, sg


def test_a_width_the_attention_heads_do_not_divide_is_rejected_as_vllm_does(capsys):
    """Qwen3.5-27B has 24 attention heads: vLLM refuses tensor-parallel size 16 (the heads must
    divide by tp); size rejects that layout with the reason, price --chip refuses it in one line."""
    from clirefusal import assert_refused
    config = os.path.join(ROOT, "testdata", "hf", "Qwen--Qwen3.5-27B")
    graph, reg, _ = S.load_model(config)
    assert heads_reason(graph, 8) == "" and "24 attention heads" in heads_reason(graph, 16)
    lay = S.Layout(16, 1, False, graph.weight_dtype, 256, 8192, "PIECEWISE")
    cand, = S.build_candidates(graph.name, graph, "h200", 16, [lay], isl=1024, osl=1024, registry=reg,
                               gpus_per_node=16)
    assert cand.status == "rejected" and "divide by tp" in cand.reason
    assert_refused(capsys, ["price", config, "--chip", "h200", "--tp", "16", "--gpus-per-node", "16"],
                   "--tp", "24 attention heads")



def test_twin_points_take_a_simulated_twins_numbers():
    """refine's twins: a layout differing from a simulated one only in a setting that binds at some
    of its loads only (max_num_seqs 256 against 512: at C = 512, not at C <= 8) has the same search
    TPOT and throughput at the others, and takes the simulated twin's numbers there
    (``simulated_as``); they are what its own simulation gives, bit for bit. Its other point and a
    layout of another plan are left alone."""
    got = jp.size(MODEL, tpot_ms=40, evaluator="steady", **dict(SIM, max_num_seqs=(256, 512), concurrency=(1, 8, 512)))
    by = {(r.layout.tp, r.layout.max_num_seqs): r for r in got.results}
    ran, twin, other = by[(2, 256)], by[(2, 512)], by[(4, 256)]
    cands = got.candidates
    assert S._twin_point_key(ran, cands, 1) == S._twin_point_key(twin, cands, 1)
    assert S._twin_point_key(ran, cands, 2) != S._twin_point_key(twin, cands, 2)
    assert S._twin_point_key(ran, cands, 1) != S._twin_point_key(other, cands, 1)
    mask = np.array([True, True, False])
    out = S.evaluate_serve_many([cands[ran.index].deployment], [ran.layout], got.workload, ran.concurrency,
                                points=[mask])[0]
    sims, done = {}, {ran.index}
    S._remember_points(sims, ran, cands, out, mask)
    ran.replace_numbers(out, "serve", points=mask)
    steady_twin, before = twin.tpot.copy(), other.tpot.copy()
    S._share_twin_points(got.results, cands, sims, done, "serve")
    assert twin.source == "serve" and twin.simulated_as == ran.layout.label
    assert [twin.point_source(j) for j in range(3)] == ["serve", "serve", "steady"]
    assert twin.tpot[2] == steady_twin[2]
    own = S.evaluate_serve(cands[twin.index].deployment, twin.layout, got.workload, twin.concurrency[:2])
    for got_x, own_x in zip((twin.ttft, twin.tpot, twin.tps_per_gpu), own[:3]):
        np.testing.assert_array_equal(got_x[:2], own_x)
    assert other.source == "steady" and other.simulated_as is None and np.array_equal(other.tpot, before)


def test_steady_ttft_waits_for_the_step_in_flight_and_the_one_scheduled(result):
    """vLLM's steady TTFT with no queue (C <= R a rank): the prompt's own step(s) + host_output_token
    + its admission, and before them, with another client on the rank, half the step in flight
    and (async scheduling) the step already scheduled: 1.5 mean steps (TPOT less
    host_output_token); none with one client (the engine is idle)."""
    r = result.results[0]
    w, dep = result.workload, result.candidates[r.index].deployment
    alone = S.evaluate_steady(dep, r.layout, w, list(r.concurrency), num_prompts=math.inf)
    hot = float(dep.coefficients["host_output_token"])
    adm = S.admission_latency(dep.coefficients, w.mean_isl)
    checked = 0
    for j, c in enumerate(r.concurrency):
        R, batches, tw, fw, _n = S.steady_state_requests(dep, r.layout, w, int(c))
        per_rank = c / r.layout.dp
        if per_rank > R:
            continue                                   # queueing: Little's law on top
        est = S.price_batches(dep, S.stack_rows(batches, S._rows(max(len(b[0]) for b in batches))))
        own = float(np.dot(fw, est))
        wait = 1.5 * (alone[1][j] - hot) if per_rank >= 2 else 0.0
        assert alone[0][j] == pytest.approx(own + wait + hot + adm, rel=1e-9)
        checked += 1
    assert checked >= 2 and r.concurrency[0] == 1


@pytest.mark.parametrize("kw,want", [
    (dict(evaluator="auto", num_prompts=4), "field 'num_prompts', value 4: is fewer than the 8 clients"),
    (dict(evaluator="serve", search_prompts=0.5), "field 'search_prompts', value 0.5: is prompts per client"),
])
def test_fewer_prompts_than_clients_are_refused(kw, want):
    """size() as the CLI: a simulated run with fewer prompts than clients would read as a load it
    never carries (it ran 4 clients labelled C = 8)."""
    with pytest.raises(jp.JaxpriceError) as err:
        jp.size(MODEL, tpot_ms=40, **SIM, **kw)
    assert want in str(err.value) and "\n" not in str(err.value)


def test_cli_refuses_fewer_search_prompts_than_clients(capsys):
    rc = cli.main(["size", MODEL, "--chip", "h200", "--gpus", "4", "--isl", "256", "--osl", "64", "--evaluator", "serve",
                   "--search-prompts", "0.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "field '--search-prompts', value 0.5: is prompts per client" in err[0]


def test_a_margin_within_the_measurements_own_spread_is_said_so():
    """A best layout beating the next by under 2% (less than repeat runs of one deployment differ
    by in mean TPOT: a median 3.3% on the dev set) carries a caveat; a clear margin none."""
    from jaxprice._src.cli_size import CLOSE_MARGIN, _close_margin_note
    assert CLOSE_MARGIN == 0.02
    assert "choose between the two on other grounds" in _close_margin_note(0.0005)
    assert "under 2%" in _close_margin_note(-0.015)
    assert _close_margin_note(0.02) == _close_margin_note(0.19) == _close_margin_note(None) == ""


def test_a_fitted_coefficient_set_reaches_every_candidate(result, tmp_path, capsys, monkeypatch):
    """size --coefficients SET.yaml: every candidate lists the set after the six bundled ones (a
    slower HBM here slows every TPOT), the written scenario names it, and a missing file is refused
    before anything is resolved."""
    slow = tmp_path / "slow-hbm.yaml"
    slow.write_text("format: jaxprice-coefficients/1\nname: slow-hbm\nentries:\n"
                    "  - {name: hbm_derate, value: 0.4, units: dimensionless, scope: {hardware: [h200]}}\n")
    monkeypatch.chdir(tmp_path)
    fitted = jp.size(MODEL, tpot_ms=40, coefficient_files=["slow-hbm.yaml"], **SMALL)
    assert fitted.coefficient_sets[-1] == str(slow) and fitted.as_dict()["coefficient_sets"][-1] == str(slow)
    assert [r.layout.label for r in fitted.results] == [r.layout.label for r in result.results]
    for a, b in zip(fitted.results, result.results):
        assert (a.tpot > b.tpot).all()
    scen = fitted.candidates[fitted.results[0].index].deployment.scenario
    assert scen.coefficient_sets[-1] == str(slow) and float(fitted.candidates[fitted.results[0].index]
                                                            .deployment.coefficients["hbm_derate"]) == 0.4
    assert f"- {slow}" in fitted.scenario_yaml()
    with pytest.raises(jp.JaxpriceError, match="nothere.yaml"):
        jp.size(MODEL, tpot_ms=40, coefficient_files=["nothere.yaml"], **SMALL)


def test_load_notes_say_when_the_best_load_only_queues():
    """Clients beyond max_num_seqs x dp per engine only wait: the note says so (and, with no TTFT
    target, that nothing bounds the wait) instead of suggesting a larger --concurrency."""
    from types import SimpleNamespace
    from jaxprice._src.cli_size import _load_notes
    lay = SimpleNamespace(max_num_seqs=256, dp=2)
    res = lambda ttft: SimpleNamespace(best_result=SimpleNamespace(layout=lay, concurrency=np.array([64, 512, 1024])),
                                       ttft_target=ttft)
    (note,) = _load_notes(res(None), {"concurrency_per_engine": 1024})
    assert "more than the 512 requests it holds at once (max_num_seqs 256 x dp 2): the other 512 queue" in note
    assert "give one to size for a TTFT" in note and "larger --concurrency" not in note
    (note,) = _load_notes(res(2.0), {"concurrency_per_engine": 1024})
    assert "--ttft-ms" not in note
    # 512 = held: not beyond; not the sweep's largest either (1024 is): nothing to say
    assert _load_notes(res(None), {"concurrency_per_engine": 512}) == []
    lay.dp = 4       # 1024 held: the largest level within what the engine holds
    assert _load_notes(res(None), {"concurrency_per_engine": 1024}) == [
        "  (at the sweep's largest concurrency: a larger --concurrency may find more)"]
    lay.dp, lay.engine = 2, "sglang"        # an SGLang engine's limit by its own flag's name
    (note,) = _load_notes(res(None), {"concurrency_per_engine": 1024})
    assert "(max_running_requests 256 x dp 2)" in note and "max_num_seqs" not in note
