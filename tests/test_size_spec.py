"""`jaxprice size --spec-tokens`: speculative decoding (the model's own MTP drafter) as a layout axis.

Kept small: MiMo-7B-Base (dense, bf16, one MTP layer; its Hugging Face config from testdata/hf)
on 1 x H100, one engine setting, the steady evaluator at two concurrencies; one small serving
simulation. k = 0 stays the search it was; k > 0 prices decode rows of 1 + k tokens and the
drafter's passes, and divides the step by the assumed acceptance.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jaxprice as jp
from jaxprice import cli
from jaxprice._src import launch
from jaxprice._src import size as S
from jaxprice._src.layouts import Layout, build_scenario, load_model

MODEL = "testdata/hf/XiaomiMiMo--MiMo-7B-Base"
SMALL = dict(chip="h100", gpus=1, isl=1024, osl=256, weights=["bf16"], max_num_seqs=(256,),
             max_num_batched_tokens=(8192,), cudagraph_modes=("PIECEWISE",), concurrency=(1, 16),
             evaluator="steady")


@pytest.fixture(scope="module")
def base():
    return jp.size(MODEL, tpot_ms=40, **SMALL)


@pytest.fixture(scope="module")
def spec():
    return jp.size(MODEL, tpot_ms=40, spec_tokens=(0, 1, 2), **SMALL)


def _by_k(result):
    return {r.layout.spec_tokens: r for r in result.results}


def test_no_speculation_is_the_search_it_was(base, spec):
    """spec_tokens (0,) is the default search bit for bit, and the k = 0 layout of a search over
    draft counts has the very numbers, label and dict of the search without them."""
    again = jp.size(MODEL, tpot_ms=40, spec_tokens=(0,), **SMALL)
    a, b, c = base.results[0], again.results[0], _by_k(spec)[0]
    for r in (b, c):
        assert r.layout == a.layout and r.layout.label == a.layout.label == "tp1 dp1 bf16 seqs256 mbt8192 pw"
        assert r.layout.as_dict() == a.layout.as_dict() and "spec_tokens" not in a.layout.as_dict()
        for f in ("ttft", "tpot", "tps_per_gpu", "resident"):
            np.testing.assert_array_equal(getattr(r, f), getattr(a, f))
    assert "speculation" not in base.as_dict() and "speculation" not in base.info
    assert "speculative" not in base.best_candidate.deployment.scenario.engine
    assert "--speculative-config" not in base.vllm_command()


def test_draft_counts_are_layouts_labelled_and_stated(spec):
    got = _by_k(spec)
    assert sorted(got) == [0, 1, 2]
    assert got[2].layout.label.endswith(" pw mtp2") and got[1].layout.label.endswith(" mtp1")
    assert got[2].layout.as_dict()["spec_tokens"] == 2
    assert got[2].layout.as_dict()["acceptance"] == pytest.approx(2.19)
    out = spec.as_dict()
    assert out["speculation"]["acceptance"] == {"1": pytest.approx(1.7), "2": pytest.approx(2.19)}   # 1 + 0.7 (+ 0.7^2)
    assert "ASSUMED" in out["speculation"]["acceptance_source"]
    # the best speculates (TPOT 40 ms: every layout meets it; speculation lifts tokens/s per GPU)
    best = spec.best_result.layout
    assert best.spec_tokens == 2 and out["best"]["layout"]["acceptance"] == pytest.approx(2.19)
    scen = spec.best_candidate.deployment.scenario
    assert scen.engine["speculative"] == {"num_spec_tokens": 2, "method": "mimo_mtp"}
    assert spec.best_candidate.deployment.resolution["decode_threshold"] == 3
    assert spec.vllm_command().endswith("--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 2}'")


def test_speculating_tpot_is_the_step_over_the_acceptance(spec):
    """At one client: the decode rows schedule 1 + k tokens (priced as decodes, threshold 8 >= 3),
    TPOT = host_output_token + (the step batch mix priced) / acceptance, so about the k = 0 TPOT
    / acceptance, a little above it (3 tokens a row and the drafter's two passes cost more)."""
    got = _by_k(spec)
    r0, r2 = got[0], got[2]
    dep = spec.candidates[r2.index].deployment
    lay, w = r2.layout, spec.workload
    R, batches, tpot_w, _ttft_w, _n = S.steady_state_requests(dep, lay, w, 1)
    assert R == 1 and batches[0][0] == [3] and S.decode_threshold(lay) == 8
    assert all(b[0][:R] == [3] * R for b in batches)
    est = S.price_batches(dep, S.stack_rows(batches, S._rows(len(batches[-1][0])) + 1, S.decode_threshold(lay)))
    hot = float(dep.coefficients["host_output_token"])
    want = hot + float(np.dot(tpot_w, est)) / 2.19
    assert r2.tpot[0] == pytest.approx(want, rel=1e-12)
    ratio = r0.tpot[0] / r2.tpot[0]
    assert 0.8 * 2.19 < ratio < 2.19
    assert np.all(r2.tps_per_gpu > r0.tps_per_gpu) and np.all(r2.tpot < r0.tpot)
    # the budget counts 1 + k tokens a decode row: a tight budget holds fewer speculating residents
    tight = dataclasses.replace(lay, max_num_batched_tokens=1024, max_num_seqs=1024)
    plain = dataclasses.replace(tight, spec_tokens=0, acceptance=None)
    isl, osl, _ctx = S._lengths(w)
    assert S.steady_state_requests(dep, tight, w, 1000)[0] == int(1024 // (3 + 2.19 * isl / osl)) == 86
    assert S.steady_state_requests(dep, plain, w, 1000)[0] == int(1024 * osl // (isl + osl)) == 204


def test_nothing_accepted_is_strictly_worse():
    r = jp.size(MODEL, tpot_ms=40, spec_tokens=(0, 2), acceptance=1.0, **SMALL)
    got = _by_k(r)
    assert got[2].layout.tokens_per_step == 1.0
    assert np.all(got[2].tpot > got[0].tpot) and np.all(got[2].tps_per_gpu < got[0].tps_per_gpu)
    assert r.best_result.layout.spec_tokens == 0
    assert r.as_dict()["speculation"]["acceptance"] == {"2": 1.0}


def test_written_scenario_loads_speculating_and_prices_the_same(spec, tmp_path):
    path = tmp_path / "best.yaml"
    path.write_text(spec.scenario_yaml())
    assert "ASSUMED acceptance of 2.19" in path.read_text()
    dep = jp.load_deployment(path)
    cand = spec.best_candidate
    assert dep.scenario.engine["speculative"]["num_spec_tokens"] == 2
    assert dep.plan == cand.deployment.plan
    np.testing.assert_array_equal(np.asarray(dep.coefficients.values), np.asarray(cand.deployment.coefficients.values))
    i, j = spec.best
    res = spec.results[i]
    ttft, tpot, per_gpu, _, _, _ = S.evaluate_steady(dep, res.layout, spec.workload, res.concurrency)
    assert tpot[j] == pytest.approx(res.tpot[j], rel=1e-14)
    assert per_gpu[j] == pytest.approx(res.tps_per_gpu[j], rel=1e-14)
    assert ttft[j] == pytest.approx(res.ttft[j], rel=1e-14)
    R, batches, *_ = S.steady_state_requests(dep, res.layout, spec.workload, int(res.concurrency[j]))
    s, c = batches[0]
    one = jp.price(dep.plan, dep.coefficients, jp.Batch.from_requests(s, c, decode_threshold=8))
    assert float(one.no_overlap) == pytest.approx(float(S.price_batches(dep, S.stack_rows(
        [(s, c)], S._rows(R) + 1, 8))[0]), rel=1e-12)


def test_the_simulation_takes_the_assumed_acceptance(spec):
    """The serve evaluator (auto's re-runs) simulates a speculating layout at its acceptance, as
    `jaxprice serve --acceptance` does; an acceptance of 1 simulates slower."""
    r2 = _by_k(spec)[2]
    dep = spec.candidates[r2.index].deployment
    w = S.SizeWorkload(256, 64)
    lay = r2.layout
    got = S.evaluate_serve_many([dep, dep], [lay, dataclasses.replace(lay, acceptance=1.0)], w, [4], num_prompts=8)
    ref = jp.simulate_sweep(dep, jp.Workload(isl=256, osl=64, range_ratio=0.8), [4], num_prompts=8, acceptance=2.19)
    np.testing.assert_allclose(got[0][1], [ref[0].summary["tpot_mean"]], rtol=1e-12)
    assert got[1][1][0] > 1.5 * got[0][1][0]


def test_sglang_line_names_its_eagle_flags():
    graph, _reg, _src = load_model(MODEL)
    lay = Layout(1, 1, False, "bf16", 64, 4096, "FULL_DECODE_ONLY", "sglang", 2)
    scen = build_scenario(graph.name, "h100", lay, isl=256, osl=64, graph=graph)
    line = launch.sglang_command(scen, lay, graph)
    assert ("--speculative-algorithm EAGLE --speculative-num-steps 2 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 3") in line


@pytest.mark.parametrize("kw, field, needle", [
    (dict(spec_tokens=[1]), "spec_tokens", "llama-3.1-70b-instruct has no drafter"),
    (dict(spec_tokens=[-1]), "spec_tokens", "[0, 15]"),
    (dict(spec_tokens=[1.5]), "spec_tokens", "whole numbers"),
    (dict(spec_tokens=[0, 16.0]), "spec_tokens", "[0, 15]"),
    (dict(spec_tokens=[True]), "spec_tokens", "whole numbers"),
    (dict(spec_tokens=[]), "spec_tokens", "at least one"),
    (dict(acceptance=2.0), "acceptance", "give draft counts above 0"),
    (dict(spec_tokens=[0, 2], acceptance=3.5), "acceptance", "[1, 1 + 2]"),
    (dict(spec_tokens=[0, 2], acceptance=0.9), "acceptance", "[1, 1 + 2]"),
    (dict(spec_tokens=[2], engine="sglang", max_num_seqs=(256,), max_num_batched_tokens=(8192,)), "spec_tokens",
     "vLLM engines only"),
])
def test_api_refusals(kw, field, needle):
    args = dict(chip="h200", gpus=4, isl=1024, osl=256, evaluator="steady", weights=["bf16"])
    args.update(kw)
    with pytest.raises(jp.JaxpriceError) as err:
        jp.size("llama-3.1-70b-instruct", **args)
    assert err.value.field == field and needle in str(err.value)


@pytest.mark.parametrize("argv, needle", [
    (["--spec-tokens", "1"], "field '--spec-tokens'"),
    (["--spec-tokens", "0,-1"], "field '--spec-tokens'"),
    (["--spec-tokens", "1.5"], "field '--spec-tokens'"),
    (["--acceptance", "2"], "give --spec-tokens above 0"),
    (["--spec-tokens", "0,1,2", "--acceptance", "4"], "[1, 1 + 2]"),
    (["--spec-tokens", "0,1,2", "--acceptance", "0.5"], "[1, 1 + 2]"),
])
def test_cli_refusals_exit_2(capsys, argv, needle):
    rc = cli.main(["size", "llama-3.1-70b-instruct", "--chip", "h200", "--gpus", "4", "--isl", "1024", "--osl",
                   "256", "--evaluator", "steady", "--weights", "bf16", "--quiet"] + argv)
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1
    if argv == ["--spec-tokens", "1"]:
        assert "llama-3.1-70b-instruct has no drafter" in err


def test_cli_states_the_assumed_acceptance(capsys, tmp_path):
    out_json = tmp_path / "s.json"
    rc = cli.main(["size", MODEL, "--chip", "h100", "--gpus", "1", "--isl", "1024", "--osl", "256", "--weights", "bf16",
                   "--max-num-seqs", "256", "--max-num-batched-tokens", "8192", "--graph-modes", "PIECEWISE",
                   "--concurrency", "1,16", "--evaluator", "steady", "--tpot-ms", "40", "--quiet",
                   "--spec-tokens", "0,2", "--acceptance", "2.2", "--json", str(out_json)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "draft tokens (MTP) 0, 2" in text
    assert "best: tp1 dp1 bf16 seqs256 mbt8192 pw mtp2" in text
    assert "acceptance of 2.2 tokens per decode row and step" in text and "ASSUMED" in text
    import json
    doc = json.loads(out_json.read_text())
    assert doc["best"]["layout"]["acceptance"] == 2.2 and doc["speculation"]["acceptance"] == {"2": 2.2}
