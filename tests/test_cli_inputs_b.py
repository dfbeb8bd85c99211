"""Bad command-line input found by fuzzing size, accuracy, fit and import-model: each is refused in
ONE line naming the flag (or file) and the value, exit status 2, before any search, pricing or fit
runs (output paths, coefficient files, scenario folders, options that would be ignored).

Every case here is refused before the kernel runs, so the file stays fast.
"""

from __future__ import annotations

import argparse

import pytest
from clirefusal import assert_refused

from jaxprice import JaxpriceError
from jaxprice._src import accuracy, cli_fit

HEADER = ("corpus,scenario,deployment,model,hardware,dtype,engine,tp,ep,dp,spec_decode,workload,isl,osl,"
          "concurrency,quantity,value,unit,relative_to_sweep_anchor,anchor_concurrency\n")
SIZE = ["size", "llama-3.1-8b-instruct", "--chip", "h200", "--gpus", "8", "--isl", "1024", "--osl", "1024"]
UNWRITABLE = "/proc/jaxprice-no/x"      # nothing can be created under /proc, not even by root


def files(tmp_path):
    (tmp_path / "adir").mkdir(exist_ok=True)
    (tmp_path / "afile.csv").write_text("")
    (tmp_path / "m.csv").write_text(HEADER)
    (tmp_path / "steps.csv").write_text("scenario,requests,context,value,unit\n"
                                        "deepseek-v3-h200-fp8-sglang-tp8,4,1024,20,ms\nnosuch,4,1024,20,ms\n")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "invalid.yaml").write_text("a: [1,\nb: 2\n")
    return tmp_path


def refused(capsys, tmp_path, argv, *words):
    """Run the CLI in tmp_path's fixture files ({d}, {x} an unwritable place); assert the one-line
    refusal (clirefusal)."""
    d = files(tmp_path)
    fill = dict(d=d, x=UNWRITABLE)
    return assert_refused(capsys, [a.format(**fill) for a in argv], *(w.format(**fill) for w in words))


# 1. output paths, checked before the search / scoring / fit

@pytest.mark.parametrize("flag,value,words", [
    ("--json", "{d}/adir", ("--json", "is a folder")),
    ("--json", "{x}.json", ("--json", "cannot write")),
    ("--write-scenario", "{d}/adir", ("--write-scenario", "is a folder")),
    ("--write-scenario", "{x}.yaml", ("--write-scenario", "cannot write")),
    ("--write-scenario", "{d}/afile.csv/x.yaml", ("--write-scenario", "afile.csv is a file")),
    ("--plot", "{d}/adir", ("--plot", "is a folder")),
    ("--plot", "{d}/frontier.txt", ("--plot", "unsupported image format .txt")),
    ("--plot", "{x}.png", ("--plot", "cannot write")),
])
def test_size_output_paths_refused_up_front(capsys, tmp_path, flag, value, words):
    refused(capsys, tmp_path, SIZE + [flag, value], *words)


@pytest.mark.parametrize("argv,words", [
    (["--markdown", "{d}/adir"], ("--markdown", "is a folder")),
    (["--markdown", "{x}.md"], ("--markdown", "cannot write")),
    (["--out", "{d}/afile.csv"], ("--out", "is a file, not a folder")),
    (["--out", "{x}dir"], ("--out", "cannot write")),
    (["--plot", "{d}/adir"], ("--plot", "is a folder")),
    (["--plot", "{d}/sweeps.csv"], ("--plot", "unsupported image format .csv")),
    (["--plot", "{d}/afile.csv/x.png"], ("--plot", "afile.csv is a file")),
    (["--cache-dir", "{d}/afile.csv"], ("--cache-dir", "is a file")),
])
def test_accuracy_output_paths_refused_up_front(capsys, tmp_path, argv, words):
    refused(capsys, tmp_path, ["accuracy", "{d}/m.csv", "--batch-rule", "anchor"] + argv, *words)


@pytest.mark.parametrize("out,words", [
    ("{x}.yaml", ("--out", "cannot write")),
    ("{d}/afile.csv/x.yaml", ("--out", "afile.csv is a file")),
    ("{d}/adir", ("--out", "is a folder")),
])
def test_fit_out_refused_up_front(capsys, tmp_path, out, words):
    refused(capsys, tmp_path, ["fit", "{d}/m.csv", "--free", "hbm_derate", "--out", out], *words)


@pytest.mark.parametrize("argv,words", [
    (["--out", "{d}/adir"], ("--out", "is a folder")),
    (["--out", "{x}.yaml"], ("--out", "cannot write")),
    (["--name", ""], ("--name", "empty name")),
    (["--hf-repo", " "], ("--hf-repo", "empty hf repo")),
])
def test_import_model_refusals(capsys, tmp_path, argv, words):
    # the config is never read: the flags are refused first
    refused(capsys, tmp_path, ["import-model", "{d}/nosuch.json"] + argv, *words)


# 2. an empty --cv-seeds list

def test_fit_empty_cv_seeds(capsys, tmp_path):
    refused(capsys, tmp_path, ["fit", "{d}/m.csv", "--free", "hbm_derate", "--holdout", "deployment",
                               "--cv-seeds", ""], "--cv-seeds", "at least one seed")


# 3. coefficient files and scenario folders, read / checked before any point is priced

@pytest.mark.parametrize("name,words", [
    ("nonexist.yaml", ("--coefficients", "nonexist.yaml", "file not found")),
    ("empty.yaml", ("--coefficients", "empty.yaml", "no YAML document")),
    ("list.yaml", ("--coefficients", "list.yaml", "is a list")),
    ("invalid.yaml", ("--coefficients", "invalid.yaml", "malformed YAML")),
    ("adir", ("--coefficients", "adir", "directory")),
])
def test_accuracy_bad_coefficient_file(capsys, tmp_path, name, words):
    refused(capsys, tmp_path, ["accuracy", "{d}/m.csv", "--batch-rule", "anchor", "--coefficients", "{d}/" + name],
            *words)


@pytest.mark.parametrize("cmd,flag", [(["accuracy", "{d}/m.csv", "--batch-rule", "anchor"], "--scenarios"),
                                      (["fit", "{d}/m.csv", "--free", "hbm_derate"], "--scenario-dir")])
def test_scenario_folder_must_exist(capsys, tmp_path, cmd, flag):
    refused(capsys, tmp_path, cmd + [flag, "{d}/nonexistdir"], flag, "nonexistdir", "no such folder")
    refused(capsys, tmp_path, cmd + [flag, "{d}/afile.csv"], flag, "afile.csv", "is a file, not a folder")


def test_library_checks_accept_good_inputs(tmp_path):
    from jaxprice._src.resolve import testdata_root
    good = sorted((testdata_root().parent / "registry" / "coefficients").glob("*.yaml"))[:1]
    assert good
    accuracy.check_coefficient_files(good, field="--coefficients")
    accuracy.check_scenario_dirs([tmp_path])
    with pytest.raises(JaxpriceError, match="file not found"):
        accuracy.check_coefficient_files([tmp_path / "no.yaml"])
    # the writers refuse a bad path before touching the report
    with pytest.raises(JaxpriceError, match="is a folder"):
        accuracy.write_points_csv(None, tmp_path)
    with pytest.raises(JaxpriceError, match="unsupported image format"):
        accuracy.plot_sweeps(None, tmp_path / "sweeps.txt")


# 4. (isl + osl beyond the context length: the model graph states none; not checked)

# 5. --search-prompts names itself

@pytest.mark.parametrize("value", ["0", "-1"])
def test_size_search_prompts_names_its_flag(capsys, tmp_path, value):
    line = refused(capsys, tmp_path, SIZE + ["--search-prompts", value], "--search-prompts", "> 0")
    assert "target" not in line


@pytest.mark.parametrize("argv,words", [
    (["--range-ratio", "2"], ("--range-ratio", "(0, 1]")),
    (["--graph-modes", "SOMETIMES"], ("--graph-modes", "unknown cudagraph mode")),
    (["--graph-modes", ""], ("--graph-modes", "comma-separated list")),
    (["--weights", "fp3"], ("--weights", "unknown weight format")),
    (["--weights", " , "], ("--weights", "comma-separated list")),
])
def test_size_lists_and_ratio_name_their_flag(capsys, tmp_path, argv, words):
    refused(capsys, tmp_path, SIZE + argv, *words)


# 6. options that would be ignored

@pytest.mark.parametrize("argv,words", [
    (["--huber-delta", "5"], ("--huber-delta", "--loss huber")),
    (["--priors", "0.1"], ("--priors", "--prior cv")),
    (["--holdout", "model", "--cv-seeds", "0,1"], ("--cv-seeds", "0,1", "--holdout deployment")),
    (["--cv-seeds", "3"], ("--cv-seeds", "3", "a fraction has none")),
    (["--holdout", "deployment", "--prior", "0.1", "--priors", "0,1"], ("--priors", "--prior cv")),
    (["--name", "", "--out", "{d}/x.yaml"], ("--name", "empty set name")),
    (["--name", "tiny"], ("--name", "--out")),
])
def test_fit_ignored_options_refused(capsys, tmp_path, argv, words):
    refused(capsys, tmp_path, ["fit", "{d}/m.csv", "--free", "hbm_derate"] + argv, *words)


def fit_args(*argv):
    p = argparse.ArgumentParser()
    cli_fit.add_parser(p.add_subparsers())
    return p.parse_args(["fit", "m.csv", "--free", "hbm_derate", *argv])


def test_fit_options_still_accepted():
    o = cli_fit._options(fit_args("--loss", "huber", "--huber-delta", "0.5"))
    assert o["fit"]["huber_delta"] == 0.5 and o["fit"]["loss"] == "huber"
    assert cli_fit._options(fit_args())["fit"]["huber_delta"] == 0.1
    o = cli_fit._options(fit_args("--holdout", "deployment", "--priors", "0,inf", "--cv-seeds", "3"))
    assert o["prior"] == "cv" and o["priors"][0] == 0 and o["cv_seeds"] == [3]


# 7. a folder for the CSV; a step CSV's unknown scenario names the file and the line

def test_fit_csv_folder(capsys, tmp_path):
    refused(capsys, tmp_path, ["fit", "{d}/adir", "--free", "hbm_derate"], "adir", "is a folder")


def test_fit_step_csv_unknown_scenario_names_file_and_line(capsys, tmp_path):
    refused(capsys, tmp_path, ["fit", "{d}/steps.csv", "--target", "step", "--free", "hbm_derate"],
            "steps.csv:3", "scenario", "nosuch")


# 8. --scope-to's choices, each listed once

def test_fit_scope_to_help_lists_each_choice_once():
    p = argparse.ArgumentParser()
    text = cli_fit.add_parser(p.add_subparsers()).format_help()
    assert "{hardware,model,hardware}" not in text
    assert "'hardware,model' (default) or 'hardware'" in " ".join(text.split())
    assert fit_args("--scope-to", "hardware").scope_to == "hardware"
