"""What a practitioner calibrating with `jaxprice fit` ran into (a walkthrough of issue 12's
calibration: fit on a subset of the dev CSV, cross-validate by model / chip / deployment, write the
set, load it in price / serve / size / accuracy inside and outside its scope, hand-edit it), each
fixed and pinned here.

Lean: most checks on resolved deployments (no compile) or on hand-built CV results; two tiny CLI
fits (one static, one through the serving simulation, prior inf: nothing descended).
"""

from __future__ import annotations

import argparse
import math
from types import SimpleNamespace

import numpy as np
import pytest

import jaxprice as jp
from jaxprice import cli
from jaxprice._src import accuracy, cli_fit, cli_price, cli_size
from jaxprice._src import fit as F

LLAMA = "llama-3.1-70b-instruct-h200-fp8-vllm-tp4"       # in the set's scope below
OTHER_CHIP = "gpt-oss-120b-h100-fp4-vllm-tp2"             # another chip and model: outside it
GPT_H200 = "gpt-oss-120b-h200-fp4-vllm-tp1"               # the set's chip, another model: outside it
HEAD = "scenario,deployment,model,hardware,dtype,engine,tp,ep,dp,workload,isl,osl,concurrency,quantity,value,unit\n"

SET = """# Written by jaxprice.fit (trimmed)
format: jaxprice-coefficients/1
name: fitted
entries:
  - {name: hbm_derate, value: 0.4, units: dimensionless, scope: {hardware: [h200], model: [llama-3.1-70b-instruct], engine: [vllm]}}
  - {name: gemm_m_half_fp8, value: 60.0, units: tokens, scope: {hardware: [h200], model: [llama-3.1-70b-instruct], engine: [vllm]}}
"""


def _set(tmp_path, text=SET, name="fitted.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _args(**kw):
    base = dict(chip=None, tp=None, dp=None, ep=None, weights=None, gpus_per_node=None, fabric=None,
                gpu_memory_utilization=None, kv_cache_dtype=None, cudagraph_mode=None, coefficients=None)
    return argparse.Namespace(**{**base, **kw})


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ----------------------------------------------------------------------------- loading a fitted set


def test_price_serve_sweep_optimize_say_what_a_fitted_set_sets(tmp_path, capsys):
    """`price SCENARIO --coefficients fitted.yaml` printed the same lines whether the set reached
    the deployment or not: a deployment outside its scope was priced with the registry's values
    (bit for bit) and nothing said so, nor which coefficients the set changed inside it."""
    path = _set(tmp_path)
    inside = cli_price.load_scenario_deployment(LLAMA, None, _args(coefficients=[str(path)]))
    err = capsys.readouterr().err
    assert float(inside.coefficients["hbm_derate"]) == 0.4
    assert ("note: fitted.yaml (--coefficients): sets gemm_m_half_fp8, hbm_derate for this deployment (h200, "
            "llama-3.1-70b-instruct, engine vllm); every other coefficient keeps the registry's value") in err
    for name in (OTHER_CHIP, GPT_H200):
        plain = jp.load_deployment(name)
        outside = cli_price.load_scenario_deployment(name, None, _args(coefficients=[str(path)]))
        err = capsys.readouterr().err
        assert "none of its 2 entries reaches this deployment" in err and "priced with the registry's values" in err
        assert "(the set is scoped to hardware h200; model llama-3.1-70b-instruct; engine vllm)" in err
        assert outside.coefficients.names == plain.coefficients.names
        assert np.array_equal(np.asarray(outside.coefficients.values), np.asarray(plain.coefficients.values))
        assert outside.plan == plain.plan
    cli_price.load_scenario_deployment(LLAMA, None, _args())      # no --coefficients: no note
    assert capsys.readouterr().err == ""


def test_a_hand_edited_set_names_a_misspelt_coefficient_and_chip(tmp_path):
    """A set whose hbm_derate was misspelt 'hbm_derat', or whose scope named chip 'h201', loaded
    without a word and changed nothing: the deployment ran on the registry's values while the
    user believed the edit applied. Now the note names the entry (and the nearest name) or chip."""
    typo = _set(tmp_path, SET.replace("name: hbm_derate", "name: hbm_derat"), "typo.yaml")
    dep = jp.load_deployment(LLAMA, extra_coefficient_files=[str(typo)])
    assert float(dep.coefficients["hbm_derate"]) == 0.8           # the registry's: the entry is read by nothing
    (line,) = F.set_notes([typo], dep)
    assert line.startswith("typo.yaml (--coefficients): sets gemm_m_half_fp8 for this deployment")
    assert "entry 'hbm_derat' is no coefficient the registry knows, so nothing reads it (did you mean 'hbm_derate'?)" \
        in line
    chip = _set(tmp_path, SET.replace("hardware: [h200]", "hardware: [h201]"), "chip.yaml")
    (line,) = F.set_notes([chip], jp.load_deployment(LLAMA, extra_coefficient_files=[str(chip)]))
    assert "none of its 2 entries reaches this deployment" in line
    assert "its scope names hardware 'h201', no chip the registry knows (a misspelt chip?)" in line
    upper = _set(tmp_path, SET.replace("hardware: [h200]", "hardware: [H200]"), "upper.yaml")   # applies: no alarm
    (line,) = F.set_notes([upper], jp.load_deployment(LLAMA, extra_coefficient_files=[str(upper)]))
    assert line.startswith("upper.yaml (--coefficients): sets gemm_m_half_fp8, hbm_derate") and "misspelt" not in line
    # a KV read rate hand-edited past the chip's HBM peak (the fit's physical bound) priced silently
    fast = _set(tmp_path, SET + "  - {name: attention_decode_rate, value: 9000000.0, units: bytes_per_us, "
                "scope: {hardware: [h200]}}\n", "fast.yaml")
    (line,) = F.set_notes([fast], jp.load_deployment(LLAMA, extra_coefficient_files=[str(fast)]))
    assert ("its attention_decode_rate, 9e+06 bytes_per_us, is outside what physics allows (a KV read rate is at "
            "most h200's HBM peak (4.8 TB/s)): this deployment is priced past its chip") in line
    assert "outside what physics" not in F.set_notes([typo], dep)[0]
    empty = _set(tmp_path, SET[:SET.index("entries:")] + "entries: []\n", "empty.yaml")      # was "none of its 0 entries"
    (line,) = F.set_notes([empty], jp.load_deployment(LLAMA, extra_coefficient_files=[str(empty)]))
    assert "empty.yaml (--coefficients): it has no entries for this deployment" in line
    # the public function refuses what it cannot read, in one line, naming the argument
    for args, field in (((5, dep), "'files', value 5"), (([typo], "x"), "'deployment', value 'x'"),
                        (([None], dep), "'files', value None")):
        with pytest.raises(jp.JaxpriceError, match=field):
            jp.fit.set_notes(*args)
    # two sets: the later one's entries win, and the earlier one is said to be overridden
    later = _set(tmp_path, SET.replace("value: 0.4", "value: 0.5"), "later.yaml")
    first = _set(tmp_path)
    dep = jp.load_deployment(LLAMA, extra_coefficient_files=[str(first), str(later)])
    a, b = F.set_notes([first, later], dep)
    assert float(dep.coefficients["hbm_derate"]) == 0.5
    assert ("its entries for this deployment (h200, llama-3.1-70b-instruct, engine vllm) are overridden by a "
            "later set") in a
    assert b.startswith("later.yaml (--coefficients): sets gemm_m_half_fp8, hbm_derate")


def test_size_and_accuracy_say_how_far_a_set_reaches(tmp_path):
    """size --coefficients and accuracy --coefficients listed the file ('extra coefficients:
    fitted.yaml') whether or not any candidate or deployment was in its scope."""
    path = _set(tmp_path)
    dep = jp.load_deployment(OTHER_CHIP, extra_coefficient_files=[str(path)])
    cands = [SimpleNamespace(deployment=None), SimpleNamespace(deployment=dep)]
    (line,) = cli_size.set_notes_for(cands, [str(path)])
    assert "none of its 2 entries reaches these candidates (h100, gpt-oss-120b, engine vllm)" in line
    assert cli_size.set_notes_for(cands, []) == []
    inside = jp.load_deployment(LLAMA, extra_coefficient_files=[str(path)])
    groups = [SimpleNamespace(name=LLAMA, deployment=inside), SimpleNamespace(name=OTHER_CHIP, deployment=dep)]
    reach = accuracy._set_reach([str(path)], groups)
    assert reach == {str(path): {"reached": [LLAMA], "of": 2}}
    info = {"extra_coefficient_files": [str(path)], "extra_coefficient_reach": reach, "points": 3}
    head = accuracy._report_head(info, SimpleNamespace(csv="m.csv", records=[], refused=[]))
    head = head[0] if isinstance(head, tuple) else head
    assert f"extra coefficients: {path} (reaches 1 of 2 priced deployments; the rest keep the registry's values)" \
        in head


# ----------------------------------------------------------------------------- jaxprice fit's own output


def _score(mape, ttft=True):
    s = {"points": 4, "tpot_mape": mape, "shape_mean": 0.05}
    if ttft:
        s.update(ttft_mape=0.2, ttft_shape_mean=0.1)
    return s


def test_cv_table_says_when_no_fitted_key_reaches_a_held_out_group(capsys):
    """--holdout chip with keys scoped per chip (the default @hardware): no fold's fit reaches
    its held-out chip, every prior scores 1.000 and 'inf' was "chosen (lowest mean among the
    priors that make no held-out group worse)" as if the fits had lost. Under --batch-rule simulate
    the criterion also weighs TTFT, but its line said "(TPOT MAPE and shape)"."""
    rows = [{"fold": c, "test_deployments": ["x"], "prior": math.inf, "applied": 0,
             "test": {"registry": _score(0.1), "fitted": _score(0.1)},
             "train": {"registry": _score(0.2), "fitted": _score(0.15)}} for c in ("b200", "h200")]
    cv = SimpleNamespace(by="chip", folds=[1, 2], rows=lambda: rows, criterion={0.0: 1.0, math.inf: 1.0},
                         worst={0.0: 1.0, math.inf: 1.0}, best_prior=math.inf)
    cli_fit.print_cv(cv)
    out = capsys.readouterr().out
    assert ("note: no fitted coefficient reaches a held-out chip in any fold (every --free key is scoped to something "
            "the held-out deployments do not share: by chip, free a key @global or @model)") in out
    assert "mean over folds of fit/registry error (TPOT MAPE and shape, TTFT MAPE and shape)" in out
    rows[0]["applied"] = 2
    for r in rows:
        for split in ("test", "train"):
            for k in ("registry", "fitted"):
                r[split][k] = _score(0.1, ttft=False)
    cli_fit.print_cv(cv)
    out = capsys.readouterr().out
    assert "note: no fitted" not in out and "error (TPOT MAPE and shape):" in out
    cli_fit.print_cv(cv, "step")            # a step-time CSV: its criterion is no TPOT's
    assert "error (step MAPE and shape):" in capsys.readouterr().out


def _tiny_csv(tmp_path, rows, name="m.csv"):
    path = tmp_path / name
    path.write_text(HEAD + "".join(f"{d}.yaml,{d},{m},{hw},{'fp4' if 'fp4' in d else 'fp8'},vllm,{tp},1,1,t,{isl},"
                                   f"{osl},{c},{q},{v},us\n"
                                   for d, m, hw, tp, isl, osl, c, q, v in rows))
    return path


def test_leave_one_model_out_shows_progress_and_says_what_the_final_fit_saw(tmp_path, capsys):
    """After `--holdout model` the final fit's line read 'train 2, held out 0 (by deployment, seed
    0)': a seeded split by deployment that never happened (the final fit sees every deployment).
    And the cross-validation, the long part, printed no progress."""
    path = _tiny_csv(tmp_path, [(LLAMA, "llama-3.1-70b-instruct", "h200", 4, 1024, 1024, 4, "mean_tpot", 14000),
                                (GPT_H200, "gpt-oss-120b", "h200", 1, 1024, 1024, 4, "mean_tpot", 6000)])
    report = tmp_path / "fit.json"
    rc, out, err = run(capsys, "fit", str(path), "--free", "hbm_derate@hardware,model", "--holdout", "model",
                       "--prior", "inf", "--json", str(report))
    assert rc == 0, err
    import json
    cv = json.loads(report.read_text())["cross_validation"]
    assert cv["by"] == "model" and cv["chosen_prior"] == "inf" and cv["no_key_reaches_held_out"] is True
    assert sorted(f["held_out"] for f in cv["folds"]) == ["gpt-oss-120b", "llama-3.1-70b-instruct"]
    assert all(f["keys_reaching_held_out"] == 0 and f["prior"] == "inf" for f in cv["folds"])
    assert f"wrote {report}" in out
    # the cross-validation's fits had no progress at all (its callback carried no total, and was dropped):
    # the README's simulate study ran 90 fits in 110 minutes without a line on stderr
    assert "cv fits  [" in err and "2/2" in err
    assert ("2 points in 2 deployment(s); train 2, held out 0 (the final fit, on every deployment: the "
            "cross-validation above held out its groups)") in out
    assert "(by deployment, seed" not in out
    assert "note: no fitted coefficient reaches a held-out model in any fold" in out


def test_simulate_fit_counts_points_as_accuracy_does_and_json_table_and_set_agree(tmp_path, capsys):
    """--batch-rule simulate --target tpot,ttft: two measured runs (one with a TTFT) were '3 points'
    (the residuals), where the CV table and `jaxprice accuracy` count 2, and the train row's MAPE
    mixed TPOT and TTFT residuals under a plain 'MAPE' heading. And fit had no --json: the
    numbers were in the table only. Now `--json -` carries them; they agree with the table and
    with the written set."""
    import json
    import yaml
    path = _tiny_csv(tmp_path, [(LLAMA, "llama-3.1-70b-instruct", "h200", 4, 256, 32, 2, "mean_tpot", 14000),
                                (LLAMA, "llama-3.1-70b-instruct", "h200", 4, 256, 32, 2, "mean_ttft", 90000),
                                (LLAMA, "llama-3.1-70b-instruct", "h200", 4, 256, 32, 4, "mean_tpot", 15000)])
    out_set = tmp_path / "fitted.yaml"
    rc, out, err = run(capsys, "fit", str(path), "--batch-rule", "simulate", "--target", "tpot,ttft", "--free",
                       "hbm_derate", "--prior", "0", "--holdout", "0", "--method", "gauss-newton", "--steps", "3",
                       "--quiet", "--json", "-", "--out", str(out_set))
    assert rc == 0, err
    doc = json.loads(out)                          # standard output is the JSON alone; the tables went to stderr
    assert "2 points (3 residuals: mean TPOT and mean TTFT) in 1 deployment(s)" in err
    head = next(ln for ln in err.splitlines() if ln.startswith("split "))
    assert "residuals" in head and "MAPE over every residual, TPOT and TTFT together" in head
    row = next(ln for ln in err.splitlines() if ln.startswith("train "))
    assert row.split()[1:3] == ["1", "3"]
    (entry,) = doc["fit"]["entries"]
    (written,) = yaml.safe_load(out_set.read_text())["entries"]
    table = next(ln for ln in err.splitlines() if ln.startswith("hbm_derate@hardware=h200"))
    assert entry["name"] == written["name"] == "hbm_derate" and entry["value"] == written["value"] != 0.8
    assert float(table.split()[2]) == pytest.approx(entry["value"], rel=1e-5)
    assert row.split()[-1] == f"{doc['fit']['scores']['train']['mape_after']:.1%}"
    assert doc["fit"]["scores"]["train"]["fitted"]["points"] == 2 and doc["cross_validation"] is None
    assert doc["written"] == {"path": str(out_set), "chips": ["h200"], "models": ["llama-3.1-70b-instruct"],
                              "engines": ["vllm"], "entries": [
                                  {"name": "hbm_derate", "value": written["value"], "units": "dimensionless",
                                   "scope": {"hardware": ["h200"], "model": ["llama-3.1-70b-instruct"],
                                             "engine": ["vllm"]}}]}


def test_fit_refusals_name_the_flag_and_the_nearest_coefficient(tmp_path, capsys):
    """`--free hbm_derat` was refused as matching nothing, with no hint of the name meant (and at
    --prior inf not refused at all); a
    leave-one-chip-out on one chip was refused under "field 'holdout'", a name no flag has; a
    --json path that is a CSV, or the --out file, is refused before anything is fitted."""
    path = _tiny_csv(tmp_path, [(LLAMA, "llama-3.1-70b-instruct", "h200", 4, 1024, 1024, 4, "mean_tpot", 14000)])
    rc, out, err = run(capsys, "fit", str(path), "--free", "hbm_derat", "--quiet", "--holdout", "0")
    assert rc == 2 and err.count("\n") == 1
    assert "field '--free', value 'hbm_derat@hardware:2'" in err and "did you mean 'hbm_derate'?" in err
    # at --prior inf (the registry kept: nothing descended) the same typo wrote an empty set without a word
    rc, out, err = run(capsys, "fit", str(path), "--free", "hbm_derat", "--quiet", "--holdout", "0", "--prior", "inf",
                       "--out", str(tmp_path / "empty.yaml"))
    assert rc == 2 and "did you mean 'hbm_derate'?" in err and not (tmp_path / "empty.yaml").exists()
    rc, out, err = run(capsys, "fit", str(path), "--free", "hbm_derate", "--holdout", "chip", "--quiet")
    assert rc == 2 and "field '--holdout', value 'chip': leaving one chip out needs at least two" in err
    for argv, words in ((["--json", str(tmp_path / "r.csv")], "field '--json'"),
                        (["--json", str(tmp_path / "s.out"), "--out", str(tmp_path / "s.out")],
                         "names the file --out writes the set to")):
        rc, out, err = run(capsys, "fit", str(path), "--free", "hbm_derate", "--quiet", *argv)
        assert rc == 2 and err.count("\n") == 1 and words in err, err


def test_a_fit_judged_on_unseen_models_says_its_set_does_not_reach_them():
    """--holdout model chose a finite prior (the fit helped models it never saw), then wrote a set
    scoped to the models it was fitted on, without a word: the transfer the table measured is
    never applied. The line after 'wrote' now says so and names --scope-to hardware."""
    res = SimpleNamespace(stopped="converged", settings={"train_models": ["gpt-oss-120b", "minimax-m2.5"]})
    cv = SimpleNamespace(by="model")
    hint = cli_fit.scope_hint(cv, res, ("hardware", "model"))
    assert "reaches only gpt-oss-120b, minimax-m2.5: --scope-to hardware writes it for every model" in hint
    assert cli_fit.scope_hint(cv, res, ("hardware",)) == ""
    assert cli_fit.scope_hint(SimpleNamespace(by="chip"), res, ("hardware", "model")) == ""
    assert cli_fit.scope_hint(None, res, ("hardware", "model")) == ""
    kept = SimpleNamespace(stopped=F.REGISTRY_KEPT, settings=res.settings)
    assert cli_fit.scope_hint(cv, kept, ("hardware", "model")) == ""
