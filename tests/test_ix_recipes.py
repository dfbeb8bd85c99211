"""InferenceX's SGLang, TensorRT-LLM and extra vLLM recipes (jaxprice/_src/ix_recipes.py), as
accuracy.engine_assumptions reads them through recipe_for: every entry names its script, a
point of each engine gets the recipe's flags (its rules resolved for the point's tp, dp, isl and
C), and the dev set's vLLM points keep accuracy.IX_RECIPES. Lean: no simulation; the only
resolve is the TensorRT-LLM points' deployments, for their fixed memory.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from jaxprice._src import accuracy as A
from jaxprice._src import ix_recipes as R
from jaxprice._src.errors import JaxpriceError

FIELDS = ("corpus,scenario,deployment,model,hardware,dtype,engine,tp,ep,dp,spec_decode,workload,isl,osl,"
          "concurrency,quantity,value,unit,relative_to_sweep_anchor,anchor_concurrency").split(",")
DEV = Path("/work/shared/measured/inferencex_vllm_dev.csv")
EXCERPT = Path(__file__).resolve().parents[1] / "testdata" / "measured" / "inferencex_vllm_excerpt.csv"
CHIPS = {"h100", "h200", "b200", "b300", "gb200"}


def _row(deployment, model, hw, dtype, engine, tp, conc, isl=1024, osl=1024, ep=1, dp=1):
    return dict(corpus="t", scenario=f"{deployment}-cfg1.yaml", deployment=deployment, model=model, hardware=hw,
                dtype=dtype, engine=engine, tp=tp, ep=ep, dp=dp, spec_decode="none", workload=f"{isl}-{osl}",
                isl=isl, osl=osl, concurrency=conc, quantity="mean_tpot", value=5000.0, unit="us",
                relative_to_sweep_anchor=1.0, anchor_concurrency=conc)


@pytest.fixture(scope="module")
def points(tmp_path_factory):
    """Points read from a tiny CSV in the dev set's layout, by deployment and C."""
    rows = [_row("deepseek-v3-h200-fp8-sglang-tp8", "deepseek-v3", "h200", "fp8", "sglang", 8, 64),
            _row("deepseek-v3-h200-fp8-sglang-tp8", "deepseek-v3", "h200", "fp8", "sglang", 8, 32, isl=8192),
            _row("deepseek-v3-b200-fp8-sglang-tp4", "deepseek-v3", "b200", "fp8", "sglang", 4, 16, isl=8192),
            _row("deepseek-v3-b200-fp4-trt-tp4", "deepseek-v3", "b200", "fp4", "trt", 4, 64, isl=8192),
            _row("llama-3.1-70b-instruct-h100-fp8-vllm-tp2", "llama-3.1-70b-instruct", "h100", "fp8", "vllm", 2, 16),
            _row("qwen3.5-397b-a17b-b200-fp4-trt-tp2", "qwen3.5-397b-a17b", "b200", "fp4", "trt", 2, 64, ep=2),
            _row("glm-5-h200-fp8-sglang-tp8", "glm-5", "h200", "fp8", "sglang", 8, 8)]
    path = tmp_path_factory.mktemp("ix") / "x.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    pts, _ = A.read_measurements(path)
    return {(p.deployment, p.isl, p.concurrency): p for p in pts}


def _values(p):
    return {k: v[0] for k, v in A.engine_assumptions(p).items()}


def test_every_entry_names_an_inferencex_script_and_a_known_engine_and_chip():
    assert len(R.IX_ENGINE_RECIPES) >= 30
    for (sched, model, chips, dtype), rec in R.IX_ENGINE_RECIPES.items():
        assert sched in ("vllm", "sglang", "trtllm", "sglang-mtp", "trtllm-mtp") and set(chips) <= CHIPS
        assert dtype in A.DTYPE_QUANTIZATION
        assert re.match(r"SemiAnalysisAI/InferenceX benchmarks/\S+\.sh@[0-9a-f]{7}\b", rec["source"]), rec["source"]
        assert rec["num_prompts"] in ("10*C", "C")
        assert ("kv_free_fraction" in rec) == sched.startswith("trtllm")   # TensorRT-LLM's fraction, mapped per point
        if sched == "vllm":          # IX_RECIPES is read first: an entry here for its keys would never be used
            assert not any(m == model and set(c) & set(chips) and d == dtype for m, c, d in A.IX_RECIPES)


def test_an_sglang_point_gets_its_recipe_with_the_isl_and_tp_cases(points):
    a = A.engine_assumptions(points[("deepseek-v3-h200-fp8-sglang-tp8", 1024, 64)])
    v = {k: x[0] for k, x in a.items()}
    assert (v["scheduler"], v["max_num_seqs"], v["max_num_batched_tokens"], v["gpu_memory_utilization"],
            v["cache_dtype"], v["num_prompts"]) == ("sglang", 512, 32768, 0.82, "auto", 640)
    assert "dsr1_fp8_h200.sh@8eec0d4" in a["recipe"][1] and "sglang-mem-fraction" in a["gpu_memory_utilization"][1]
    assert _values(points[("deepseek-v3-h200-fp8-sglang-tp8", 8192, 32)])["max_num_seqs"] == 256   # not 1k1k
    tp4 = _values(points[("deepseek-v3-b200-fp8-sglang-tp4", 8192, 16)])
    assert (tp4["max_num_seqs"], tp4["max_num_batched_tokens"], tp4["gpu_memory_utilization"]) == (32, 8192, 0.95)
    glm = A.engine_assumptions(points[("glm-5-h200-fp8-sglang-tp8", 1024, 8)])     # only the fraction is set
    assert glm["gpu_memory_utilization"][0] == 0.85
    assert glm["max_num_batched_tokens"] == A._sglang_budget("h200")             # SGLang's default chunk


@pytest.mark.parametrize("c, want", [(32, (48, 8192, 0.90)), (2048, (2560, 16384, 0.87))])
def test_a_per_concurrency_sglang_profile_is_followed(c, want):
    p = A.Point(row=2, scenario="s.yaml", deployment="deepseek-v4-pro-b300-fp4-sglang-tp8", model="deepseek-v4-pro",
                hardware="b300", dtype="fp4", engine="sglang", tp=8, ep=8, dp=1, workload="1k1k", isl=1024, osl=1024,
                concurrency=c, measured=5e-3, anchor_concurrency=32)
    v = _values(p)
    assert (v["max_num_seqs"], v["max_num_batched_tokens"], v["gpu_memory_utilization"]) == want


def test_a_trt_point_gets_its_token_rule_and_the_free_fraction_as_an_equivalent_gmu(points):
    p = points[("deepseek-v3-b200-fp4-trt-tp4", 8192, 64)]
    a = A.engine_assumptions(p)
    assert a["scheduler"][0] == "trtllm" and a["cache_dtype"][0] == "fp8"
    assert a["max_num_batched_tokens"][0] == (64 + 8192 + 64 + 63) // 64 * 64 == 8320
    fixed, hbm = R._fixed_bytes(p)
    assert 0 < fixed < hbm
    assert a["gpu_memory_utilization"][0] == pytest.approx(0.8 + 0.2 * fixed / hbm, abs=1e-4)
    assert "free_gpu_memory_fraction f = 0.8" in a["gpu_memory_utilization"][1]
    q = _values(points[("qwen3.5-397b-a17b-b200-fp4-trt-tp2", 1024, 64)])        # TP 2 / EP 2 at C >= 32
    assert (q["max_num_seqs"], q["max_num_batched_tokens"]) == (32, 16384)


def test_a_free_fraction_whose_deployment_cannot_be_resolved_is_kept_and_said_so(monkeypatch, points):
    def fail(p):
        raise JaxpriceError("no such model")
    monkeypatch.setattr(R, "_fixed_bytes", fail)
    g, how = R.trt_gmu(points[("deepseek-v3-b200-fp4-trt-tp4", 8192, 64)], 0.75)
    assert g == 0.75 and "trt-free-fraction" in how


def test_a_new_model_vllm_point_gets_its_recipe(points):
    a = A.engine_assumptions(points[("llama-3.1-70b-instruct-h100-fp8-vllm-tp2", 1024, 16)])
    v = {k: x[0] for k, x in a.items()}
    assert (v["max_num_seqs"], v["max_num_batched_tokens"], v["gpu_memory_utilization"], v["cache_dtype"]) == \
        (16, 8192, 0.9, "fp8")
    assert "70b_fp8_h100_slurm.sh@2a205bb" in a["recipe"][1]


@pytest.mark.parametrize("path", [EXCERPT, DEV], ids=["excerpt", "dev"])
def test_dev_set_vllm_points_keep_the_ix_recipes_table(path):
    if not path.exists():
        pytest.skip(f"{path} not here")
    pts, _ = A.read_measurements(path)
    assert pts
    for p in pts:
        rec, key = A.recipe_for(p)
        first = next(((r, k) for k in A.IX_RECIPES for r in (A.IX_RECIPES[k],)
                      if p.engine == "vllm" and p.model == k[0] and p.hardware in k[1] and p.dtype == k[2]),
                     (None, None))
        assert first[0] is not None and rec is first[0] and key == first[1], p.deployment


def _mtp_point(**kw):
    base = dict(row=2, scenario="s.yaml", deployment="deepseek-v3-b200-fp8-trt-tp8", model="deepseek-v3",
                hardware="b200", dtype="fp8", engine="trt", tp=8, ep=8, dp=1, workload="8k1k", isl=8192, osl=1024,
                concurrency=64, measured=5e-3, anchor_concurrency=4, spec_decode="mtp")
    return A.Point(**{**base, **kw})


def test_a_speculative_point_gets_its_mtp_script_else_the_plain_one_said_so():
    v = _values(_mtp_point())                       # MTP 3: ceil(4 x 64 + 8192 + 64) to 64
    assert (v["recipe"], v["max_num_seqs"], v["max_num_batched_tokens"]) == \
        ("deepseek-v3 trtllm-mtp fp8 on b200", 64, 8512)
    dpa = _values(_mtp_point(tp=1, dp=8, concurrency=256))     # DP attention: C / 8 per rank, MTP 1
    assert (dpa["max_num_seqs"], dpa["max_num_batched_tokens"]) == (32, (2 * 32 + 8192 + 64 + 63) // 64 * 64)
    assert _values(_mtp_point(engine="sglang"))["max_num_seqs"] == 512          # the MTP script's, not 128
    plain = A.engine_assumptions(_mtp_point(engine="sglang", hardware="b300", dtype="fp4"))
    assert plain["max_num_seqs"][0] == 256 and "COVERAGE LIMIT [mtp-recipe]" in plain["recipe"][1]


def test_a_layout_gets_the_same_recipe_whichever_way_its_tp_column_is_written():
    """The tp column is the GPU count (InferenceX) or each data-parallel rank's (the reference
    scenarios): tp8-ep8-dp8 and tp1-ep8-dp8 are one layout, 8 ranks of 1 GPU, and a script's TP
    cases and per-rank rules read its config's GPU count either way."""
    both = [_values(_mtp_point(hardware="h200", tp=tp, ep=8, dp=8, isl=1024, osl=1024, workload="1k1k",
                               concurrency=256)) for tp in (8, 1)]
    assert both[0] == both[1]
    assert both[0]["max_num_seqs"] == 256 // 8            # C / TP per rank with DP attention, TP = 8 GPUs


def test_the_mtp_scripts_draft_counts_agree_between_the_two_tables():
    """A TensorRT-LLM MTP script's draft count sizes its max_num_tokens here (mtp_layers) and is
    the point's k in accuracy.IX_SPEC_RECIPES: the two must say the same for every case."""
    checked = 0
    for (sched, model, chips, dtype), rec in R.IX_ENGINE_RECIPES.items():
        if not sched.endswith("-mtp") or "mtp_layers" not in rec:
            continue
        for dp, isl, c in ((1, 1024, 64), (8, 1024, 64), (1, 8192, 256), (8, 8192, 256)):
            p = _mtp_point(model=model, hardware=chips[0], dtype=dtype, engine=sched[:-4], tp=8, ep=8, dp=dp,
                           isl=isl, workload="8k1k" if isl == 8192 else "1k1k", concurrency=c)
            mtp = rec["mtp_layers"]
            for case in rec["cases"]:
                if R._matches(case["when"], p):
                    mtp = case["set"].get("mtp_layers", mtp)
            assert A.spec_recipe_for(p)[0] == mtp, (sched, model, chips, dtype, dp, isl, c)
            checked += 1
    assert checked >= 16


def test_a_trt_points_fixed_memory_comes_from_its_registry(points, tmp_path):
    """TensorRT-LLM's free fraction becomes a gmu from the deployment's fixed memory, resolved with
    the registry the point is priced with (Point.registry): a caller's deepseek-v3 graph with a
    vocabulary ten times larger holds more weights, so the same fraction gives a larger gmu."""
    from jaxprice._src.formats import Registry, default_registry_root
    src = (default_registry_root() / "models" / "deepseek-v3.yaml").read_text()
    assert src.count("n: 129280") == 1           # the lm_head (the embedding reads rows, not the vocabulary)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "deepseek-v3.yaml").write_text(src.replace("n: 129280", "n: 1292800"))
    p = points[("deepseek-v3-b200-fp4-trt-tp4", 8192, 64)]
    q = A.with_registry([p], Registry([tmp_path, default_registry_root()]))[0]
    (fixed, hbm), (fixed_q, hbm_q) = R._fixed_bytes(p), R._fixed_bytes(q)
    assert hbm_q == hbm and fixed_q > fixed
    assert R.trt_gmu(q, 0.8)[0] > R.trt_gmu(p, 0.8)[0]
