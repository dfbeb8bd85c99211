"""Command-line input a bug-bash found accepted where it changed nothing or misled: flags silently
ignored in their mode (--fabric on one node, --seed with nothing drawn, --scope-to without --out,
--estimate without --plot, --assumptions without a simulation, --prefix without a prefill chunk,
--reserve-full-isl beside sglang/trtllm, Adam's settings beside Gauss-Newton, --context for
prefill-only batches), a batch priced twice, engines vLLM refuses or runs that are not what they
read as (a token budget below max_num_seqs, fewer prompts than clients, a decode emitting more
tokens than it schedules), '-' written as a file name, a scenario read as a model, and misleading
text ("0 or 2..0 tokens", two rows labelled alike, "smooth mode" at temperature 0, a scenario
file not written without a word, a file listed as an enabled compile cache, --version refused).
Each is refused in one line naming the flag and the value (exit 2), or said, before anything is
priced or compiled.
"""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from clirefusal import assert_refused

import jaxprice as jp
from jaxprice._src import cli_accuracy, cli_optimize, cli_price, cli_size
from jaxprice._src.search import make_limits

ROOT = Path(__file__).resolve().parents[1]
S = "llama-3.1-70b-instruct-b200-fp8-vllm-tp1"
EXCERPT = ROOT / "testdata" / "measured" / "inferencex_vllm_excerpt.csv"


@pytest.fixture(scope="module")
def dep():
    return jp.load_deployment(S)


CASES = [
    # a one-node engine has no network between nodes: the fabric was dropped without a word
    (("price", "llama-3.1-8b-instruct", "--chip", "h200", "--fabric", "ib-400g", "--decode", "1"),
     ("'--fabric', value 'ib-400g'", "joins nothing", "fit in one node of 8")),
    (("serve", "llama-3.1-8b-instruct", "--chip", "h200", "--tp", "2", "--fabric", "ib-400g"),
     ("'--fabric'", "tp x dp = 2 GPU(s)",)),
    # the same batch twice was priced twice (sweep and serve refuse a repeated value)
    (("price", S, "--decode", "1,4,1"), ("'--decode', value 1", "twice")),
    # nothing is drawn in a closed loop of fixed lengths: the seed changed nothing
    (("serve", S, "--concurrency", "2", "--range-ratio", "1", "--seed", "5"),
     ("'--seed', value '5'", "changes nothing")),
    # vLLM's SchedulerConfig refuses a token budget below max_num_seqs; it was simulated
    (("serve", S, "--max-num-seqs", "256", "--max-num-batched-tokens", "16"),
     ("'--max-num-batched-tokens', value 16", "max_num_batched_tokens 16 < max_num_seqs 256")),
    # 1 prompt at C=64 ran one client and was reported as C=64
    (("serve", S, "--concurrency", "1,64", "--num-prompts", "4"), ("'--num-prompts', value 4", "the 64 clients")),
    (("size", "llama-3.1-8b-instruct", "--chip", "h200", "--gpus", "1", "--isl", "64", "--osl", "8",
      "--evaluator", "serve", "--concurrency", "4,64", "--num-prompts", "16"),
     ("'--num-prompts', value 16", "64 clients")),
    # sglang and trtllm reserve every request's full length: vLLM's gate was ignored
    (("serve", S, "--scheduler", "trtllm", "--reserve-full-isl", "off"),
     ("'--reserve-full-isl', value 'off'", "--scheduler trtllm")),
    # prefill rows start at 0 computed: a context for decodes there are none of was ignored
    (("price", S, "--prefill", "512", "--context", "100"), ("'--context', value '100'", "changes nothing")),
    (("sweep", S, "--decode", "0", "--prefill-chunk", "64", "--context", "64,128"),
     ("'--context', value '64,128'", "the same step")),
    # '-' is standard output for sweep --out, size --json and import-model --out; elsewhere it wrote a file '-'
    (("serve", S, "--csv", "-"), ("'--csv', value '-'", "standard output")),
    (("size", "llama-3.1-8b-instruct", "--chip", "h200", "--gpus", "1", "--isl", "64", "--osl", "8",
      "--write-scenario", "-"), ("'--write-scenario', value '-'", "standard output")),
    # a decode scheduling 1 token (no speculation) emitting 3 made the optimum 3x the tokens/s
    (("optimize", S, "--itl-ms", "50", "--tokens-per-decode", "3"), ("'--tokens-per-decode', value 3.0", "[1, 1]")),
    (("optimize", S, "--itl-ms", "50", "--tokens-per-decode", "0.5"), ("'--tokens-per-decode', value 0.5",)),
    # a scenario given with --chip was read as a model: "expected one YAML document, found 2", "unknown model"
    (("serve", S, "--chip", "h200"), ("'SCENARIO', value '" + S + "'", "names a scenario, not a model", "--chip")),
    (("price", "{d}/s.yaml", "--chip", "h200", "--decode", "1"), ("s.yaml'", "names a scenario, not a model")),
    # written into the graph and into size's `vllm serve REPO` line
    (("import-model", "meta-llama/Llama-3.1-8B-Instruct", "--hf-repo", "a b/c"),
     ("'--hf-repo', value 'a b/c'", "not a Hugging Face repository id")),
    # a layout refusal named the flag without its value
    (("price", S, "--tp", "2", "--decode", "1"), ("'--tp', value '2'", "needs --chip")),
    (("price", "llama-3.1-8b-instruct", "--chip", "h200", "--tp", "16", "--decode", "1"),
     ("'--tp', value 16", "spans 2 nodes")),
    # a trace is one run: the load plot drew "TTFT vs trace" over an axis holding the index 0
    (("serve", S, "--trace", "{d}/t.csv", "--plot", "{d}/p.png"), ("'--plot'", "a trace is one run", "--timeline")),
]


@pytest.mark.parametrize("argv,words", CASES, ids=[" ".join(x for x in a if x != S) for a, _ in CASES])
def test_flags_that_change_nothing_or_repeat_a_batch_are_refused(capsys, tmp_path, argv, words):
    (tmp_path / "t.csv").write_text("arrival_s,input_len,output_len\n0,64,8\n")
    (tmp_path / "s.yaml").write_text(jp.scenario_path(S).read_text())
    assert_refused(capsys, [a.format(d=tmp_path) for a in argv], *words)


def test_the_same_batch_file_twice_is_refused_and_like_stems_are_told_apart(capsys, tmp_path):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "step.csv").write_text("scheduled,computed\n1,100\n")
    a = str(tmp_path / "a" / "step.csv")
    assert_refused(capsys, ["price", S, "--batch", a, "--batch", str(tmp_path / "a" / "." / "step.csv")],
                   "'--batch'", "same file as --batch", "twice")
    b = str(tmp_path / "b" / "step.csv")
    assert cli_price._batch_labels([a, b]) == [f"step ({a})", f"step ({b})"]     # were two rows labelled 'step'
    assert cli_price._batch_labels([a, "s/step.yaml", "x.yaml"]) == ["step (step.csv)", "step (step.yaml)", "x"]


@pytest.mark.parametrize("extra,words", [
    # Gauss-Newton has no step size, patience or evaluation interval: they were ignored
    (("--method", "gauss-newton", "--learning-rate", "0.1"), ("'--learning-rate', value '0.1'", "gauss-newton")),
    (("--method", "gauss-newton", "--patience", "3"), ("'--patience'", "takes none")),
    (("--method", "gauss-newton", "--eval-every", "2"), ("'--eval-every'",)),
    # the seed only splits a held-out fraction
    (("--holdout", "0", "--seed", "3"), ("'--seed', value '3'", "--holdout 0 holds nothing out")),
    (("--holdout", "model", "--seed", "3"), ("'--seed'", "--holdout model has none", "--cv-seeds")),
    # --scope-to scopes the written set: without --out there is none
    (("--scope-to", "hardware",), ("'--scope-to', value 'hardware'", "give --out")),
    # an empty entry was dropped without a word (the integer lists of the other flags refuse it)
    (("--holdout", "chip", "--prior", "cv", "--priors", "0,,1"), ("'--priors', value '0,,1'", "empty entry")),
    (("--holdout", "deployment", "--cv-seeds", "1,,2"), ("'--cv-seeds', value '1,,2'", "empty entry")),
])
def test_fit_refuses_settings_that_would_be_ignored(capsys, tmp_path, extra, words):
    assert_refused(capsys, ["fit", str(tmp_path / "m.csv"), "--free", "hbm_derate", *extra], *words)


@pytest.mark.parametrize("extra,words", [
    (("--batch-rule", "anchor", "--estimate", "overlap"), ("'--estimate', value 'overlap'", "without --plot")),
    (("--batch-rule", "anchor", "--assumptions"), ("'--assumptions'", "--batch-rule anchor simulates none")),
    (("--assumptions", "--json"), ("'--assumptions'", "--json holds them already")),
])
def test_accuracy_refuses_display_flags_that_would_change_nothing(capsys, tmp_path, extra, words):
    assert_refused(capsys, ["accuracy", str(tmp_path / "m.csv"), *extra], *words)


def test_a_settings_file_matching_no_point_is_said(tmp_path):
    head = "scenario,label,concurrency,max_num_seqs\n"
    (tmp_path / "none.csv").write_text(head + "nosuch.yaml,1k1k,4,64\n")
    note = cli_accuracy.settings_note(EXCERPT, tmp_path / "none.csv")
    assert "states no engine flag for any of the 21 measured point(s)" in note and "bundled table" in note
    (tmp_path / "one.csv").write_text(head + "gpt-oss-120b-h200-fp4-vllm-tp1-cfg1.yaml,8k1k,4,64\n")
    assert cli_accuracy.settings_note(EXCERPT, tmp_path / "one.csv") is None
    assert cli_accuracy.settings_note(EXCERPT, tmp_path / "one.csv", ["kimi-k2.5-h200-int4-vllm-tp8"]) is not None


def test_optimize_without_a_prefill_chunk_refuses_a_prefix_and_says_so(capsys, monkeypatch, dep):
    monkeypatch.setattr(cli_optimize, "load_scenario_deployment", lambda *a, **k: dep)
    assert_refused(capsys, ["optimize", S, "--itl-ms", "50", "--prefill-budget", "0", "--prefix", "100"],
                   "'--prefix', value 100", "admits no prefill chunk")
    text = cli_optimize._problem_text(make_limits(dep, itl=0.05, prefill_budget=1), 1e3, "ms")
    assert "2..1" not in text and "no prefill chunk (--prefill-budget 1 is below the smallest, 2 tokens)" in text


def test_a_cache_folder_that_is_a_file_is_refused(capsys, monkeypatch, tmp_path):
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("JAXPRICE_CACHE_DIR", str(tmp_path / "afile"))
    assert_refused(capsys, ["cache", "--json"], "'JAXPRICE_CACHE_DIR'", "is a file, not a folder")


def test_size_says_when_the_scenario_is_not_written(capsys, tmp_path):
    out = tmp_path / "best.yaml"
    args = SimpleNamespace(write_scenario=str(out), plot=None, json=None)
    cli_size.write_outputs(SimpleNamespace(best=None), args, io.StringIO())
    err = capsys.readouterr().err
    assert not out.exists() and f"--write-scenario {out} not written: no layout meets the targets" in err


def test_temperature_zero_is_said_to_be_exact():
    assert "exact" in cli_price.mode_text(0.0) and cli_price.mode_text(None) == "exact mode"
    assert cli_price.mode_text(0.05) == "smooth mode (temperature 0.05)"


def test_version_is_printed_not_refused(capsys):
    """`jaxprice --version` said 'the following arguments are required: COMMAND'."""
    from jaxprice import cli
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("jaxprice ")


def test_serve_table_says_dash_where_no_request_has_a_second_token(capsys):
    """osl 1: no time between tokens; the table showed TPOT 0.00 and tok/s/user 0.0."""
    from jaxprice.cli import main
    assert main(["serve", "deepseek-v3-h200-fp8-sglang-tp8", "--isl", "64", "--osl", "1", "--concurrency", "1"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip().startswith("1 "))
    assert row.split()[3:7] == ["-", "-", "-", "-"] and "'-': every request emits one token" in out


def test_a_token_budget_below_max_num_seqs_is_refused_where_vllm_would_not_start(capsys):
    """vLLM's SchedulerConfig refuses max_num_batched_tokens < max_num_seqs: serve refused it only
    with both flags given (the scenario's 256 beside --max-num-batched-tokens 16 ran), and size
    chose such a layout and printed a `vllm serve` line that fails."""
    from jaxprice.cli import main
    from jaxprice._src.layouts import build_candidates, candidate_space
    assert main(["serve", "deepseek-v3-h200-fp8-sglang-tp8", "--max-num-batched-tokens", "16",
                 "--concurrency", "4"]) == 2
    err = capsys.readouterr().err
    assert "max_num_batched_tokens 16 < max_num_seqs 256" in err and err.count("\n") == 1
    reg = jp.Registry()
    graph = reg.model("llama-3.1-8b-instruct")
    lays = candidate_space(graph, reg.chip("h200"), 1, weights=["bf16"], max_num_seqs=(256,),
                           max_num_batched_tokens=(16, 8192), cudagraph_modes=("PIECEWISE",))
    cands = build_candidates("llama-3.1-8b-instruct", graph, "h200", 1, lays, isl=1024, osl=256, registry=reg)
    status = {c.layout.max_num_batched_tokens: (c.status, c.reason) for c in cands}
    assert status[16][0] == "rejected" and "max_num_batched_tokens 16 < max_num_seqs 256" in status[16][1]
    assert status[8192][0] == "ok"


def test_accuracy_notes_a_unit_column_that_cannot_be_right(tmp_path):
    """Microsecond values labelled 'ms' read as 7 s TPOTs, scored 99.9% off without a word."""
    from jaxprice._src.cli_accuracy import unit_note
    src = (Path(__file__).resolve().parents[1] / "testdata" / "measured" / "inferencex_vllm_excerpt.csv")
    rows = src.read_text().splitlines()
    assert unit_note(src) is None
    head = rows[0].split(",")
    u = head.index("unit")            # before the quoted source column: a plain split reaches it
    bad = [rows[0]]
    for line in rows[1:]:
        cells = line.split(",")
        if len(cells) > u and cells[u] == "us":
            cells[u] = "ms"
        bad.append(",".join(cells))
    path = tmp_path / "ms.csv"
    path.write_text("\n".join(bad) + "\n")
    note = unit_note(path)
    assert note is not None and "check its unit column" in note and "outside the 0.1 ms to 2 s" in note


def test_the_budget_rule_is_vllms_only(monkeypatch):
    """TensorRT-LLM takes max_num_tokens below max_batch_size: the budget check (vLLM's
    SchedulerConfig) refused it there too while it ran before the engine was known."""
    from jaxprice._src import cli_serve
    from jaxprice.cli import main

    class Reached(Exception):
        pass

    def simulate(*_a, **_k):
        raise Reached
    monkeypatch.setattr(cli_serve, "_simulate_loads", simulate)
    with pytest.raises(Reached):            # past every check, to the simulation
        main(["serve", "deepseek-v3-h200-fp8-sglang-tp8", "--scheduler", "trtllm", "--max-num-seqs", "256",
              "--max-num-batched-tokens", "16", "--concurrency", "4"])


def test_a_cache_folder_that_cannot_be_created_is_refused(capsys, monkeypatch, tmp_path):
    """`jaxprice cache` listed a folder it could not create as an enabled, empty cache (exit 0)
    while every command refused it (named) or skipped it (the default): it says so now."""
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("JAXPRICE_CACHE_DIR", str(tmp_path / "afile" / "sub"))
    assert_refused(capsys, ["cache"], "'JAXPRICE_CACHE_DIR'", "cannot create it")
    monkeypatch.delenv("JAXPRICE_CACHE_DIR")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "afile"))
    assert_refused(capsys, ["cache", "--json"], "field 'folder'", "cannot create it", "they skip it")
