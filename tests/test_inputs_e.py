"""Malformed input found by a bug-bash of serve, accuracy and fit (and jaxprice.simulate, the trace
and client types, the measured-CSV, step-CSV and settings-CSV readers): each is refused in ONE line
naming the file, field (row or column) and value, before anything is scheduled, priced or fitted;
before, each gave a traceback, a silent default or a nonsense number.

Nothing here compiles: the scheduler is stubbed out, so a refusal that regressed fails fast.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from clirefusal import assert_refused, share_deployment

import jaxprice as jp
from jaxprice._src import accuracy, cli_serve, fit, serve
from jaxprice._src.client import MAX_ARRIVAL_S, OpenLoop, Trace, load_trace

S = "deepseek-v3-h200-fp8-sglang-tp8"
TRACE_HEAD = "arrival_s,input_len,output_len\n"
HEADER = ("corpus,scenario,deployment,model,hardware,dtype,engine,tp,ep,dp,spec_decode,workload,isl,osl,"
          "concurrency,quantity,value,unit,relative_to_sweep_anchor,anchor_concurrency")
ROW = ("c,gpt-oss-120b-b200-fp4-vllm-tp1-cfg1.yaml,gpt-oss-120b-b200-fp4-vllm-tp1,gpt-oss-120b,b200,fp4,vllm,1,1,1,"
       "none,{wl},{isl},1024,{c},mean_tpot,{v},{u},1.0,4")
STEP_HEAD = "scenario,requests,context,value,unit\n"


@pytest.fixture(scope="module")
def dep():
    return jp.load_deployment(S)


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch, dep):
    """Every case is refused before the scheduler runs: running it is a failure, not a slow pass."""
    def ran(*a, **k):
        raise AssertionError("the scheduler ran: the input was not refused up front")
    monkeypatch.setattr(serve, "_run_groups", ran)
    monkeypatch.setattr(serve, "_run_open", ran)
    share_deployment(monkeypatch, S, dep, (cli_serve,))


def measured(tmp_path, *rows, header=HEADER, name="m.csv", prefix=""):
    body = [ROW.format(wl="1k1k", isl=1024, c=c, v=v, u="us") for c, v in ((4, 3477.6), (8, 4274.0))]
    p = tmp_path / name
    p.write_text(prefix + header + "\n" + "\n".join(list(rows) or body) + "\n", encoding="utf-8")
    return p


# ----------------------------------------------------------------------------- traces and clients

BAD_TRACES = [
    (((0.0, math.nan), (64, 64), (16, 16)), "arrival_s[1]", "nan"),
    (((-5.0, 0.0), (64, 64), (16, 16)), "arrival_s[0]", "-5.0"),
    (((0.0, math.inf), (64, 64), (16, 16)), "arrival_s[1]", "inf"),
    (((0.0, 1e17), (64, 64), (16, 16)), "arrival_s[1]", "2**33"),
    (((0.0, 1.0), (0, 64), (16, 16)), "input_len[0]", "value 0.0"),
    (((0.0, 1.0), (64.7, 64), (16, 16)), "input_len[0]", "64.7"),
    (((0.0, 1.0), (64, 64), (16, -3)), "output_len[1]", "-3.0"),
    (((0.0,), (10 ** 30,), (16,)), "input_len[0]", "16777216"),
    (((0.0, 1.0), ("a", 64), (16, 16)), "'input_len', value 'a'", "list of numbers"),
    (((0.0,), (True,), (16,)), "'input_len', value True", "list of numbers"),
]


@pytest.mark.parametrize("cols,field,word", BAD_TRACES, ids=[f for _, f, _ in BAD_TRACES])
def test_a_trace_built_in_python_is_checked_like_a_trace_file(cols, field, word):
    """Trace(...) took NaN, negative and 1e17 s arrivals, 0 and 64.7 tokens (int() truncated),
    and raised ValueError or OverflowError on text or 1e30."""
    with pytest.raises(jp.JaxpriceError) as exc:
        Trace(*cols)
    assert field in str(exc.value) and word in str(exc.value), str(exc.value)


def test_arrivals_past_the_float64_clock_are_refused(tmp_path):
    """A trace in epoch milliseconds (or a 1e-12/s rate) was simulated with TTFTs below one
    step's price: float64 seconds there resolve 0.24 ms or worse."""
    p = tmp_path / "ms.csv"
    p.write_text(TRACE_HEAD + "1700000000000,64,16\n1700000000500,64,16\n")
    with pytest.raises(jp.JaxpriceError, match=r"ms.csv:2, field 'arrival_s', value '1700000000000'.*2\*\*33"):
        load_trace(p)
    p.write_text(TRACE_HEAD + "1700000000,64,16\n1700000000.5,64,16\n")      # epoch seconds: fine
    assert load_trace(p).arrival_s == (1.7e9, 1700000000.5)
    assert MAX_ARRIVAL_S == 2.0 ** 33
    with pytest.raises(jp.JaxpriceError, match=r"field 'rate', value 1e-12: too low: its 3 arrivals reach"):
        OpenLoop(1e-12, 3).arrivals()
    assert OpenLoop(np.float32(2.0), 3).arrivals().shape == (3,)      # was refused as not a number
    with pytest.raises(jp.JaxpriceError, match="workload, field 'isl'.*token limit"):
        jp.Workload(10 ** 30, 16).lengths(2)
    for bad in (True, np.bool_(True)):
        with pytest.raises(jp.JaxpriceError, match="num_prompts"):
            OpenLoop(2.0, bad).validate()
    for bad in (None, 5):
        with pytest.raises(jp.JaxpriceError, match="expected a trace file path"):
            load_trace(bad)
    with pytest.raises(jp.JaxpriceError, match="/dev/null: is not a regular file"):      # was "no such trace file"
        load_trace("/dev/null")


@pytest.mark.parametrize("argv,words", [
    (("--trace", "{d}/ms.csv"), ("ms.csv:2", "'arrival_s'", "2**33", "not milliseconds")),
    (("--rate", "1e-12", "--num-prompts", "3"), ("'rate', value 1e-12", "too low")),
    (("--plot", "{d}/a.png", "--timeline", "{d}/./a.png"), ("'--timeline'", "same file as --plot")),
    (("--isl", "1e30"), ("'--isl'", "token limit 16777216")),                   # was ValueError from randint
    (("--osl", "99999999999999999999", "--range-ratio", "1"), ("'--osl'", "token limit")),   # was OverflowError
    # a CSV under an image's name (which --plot could also name) is refused for its suffix first
    (("--csv", "{d}/a.png", "--plot", "{d}/a.png"), ("'--csv'", "writes CSV, not an image (suffix .png)")),
    (("--concurrency", "1,2,...,26214"), ("'--concurrency'", "hold 3436000050 requests", "cap of 524288")),  # OOM
    (("--rate", "1,2,3", "--num-prompts", "200000"), ("'--rate'", "hold 600000 requests")),
    (("--concurrency", "4,8,4"), ("'--concurrency', value 4", "lists this load twice")),
    (("--trace", "{d}/ms.csv", "--csv", "{d}/ms.csv"), ("'--csv'", "same file as --trace (the input)")),
    (("--rate", "2,2.0"), ("'--rate', value 2.0", "lists this load twice")),
], ids=["epoch-ms-trace", "tiny-rate", "plot-is-timeline", "isl-1e30", "osl-1e20", "csv-is-plot", "sweep-size",
        "rates-size", "concurrency-twice", "trace-is-csv", "rate-twice"])
def test_serve_cli_refusals(capsys, tmp_path, argv, words):
    (tmp_path / "ms.csv").write_text(TRACE_HEAD + "1700000000000,64,16\n")
    assert_refused(capsys, ["serve", S] + [a.format(d=tmp_path) for a in argv], *words)
    assert not (tmp_path / "a.png").exists()


def test_a_trace_past_the_models_length_is_refused_without_a_stated_max_model_len(tmp_path):
    """A scenario that states no max_model_len ran a trace at its longest request + 256 tokens,
    past the model's own max_position_embeddings (163840 for deepseek-v3)."""
    import yaml
    docs = list(yaml.safe_load_all(jp.scenario_path(S).read_text()))
    for d in docs:
        for pool in (d or {}).get("pools", []) or []:
            pool.get("engine", {}).pop("max_model_len", None)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    dep = jp.load_deployment(str(tmp_path / "s.yaml"))
    assert "max_model_len" not in dep.scenario.engine and dep.graph.max_model_len == 163840
    with pytest.raises(jp.JaxpriceError, match=r"'request 0', value \(170000, 16\).*exceeds max_model_len 163840"):
        jp.simulate(dep, None, Trace((0.0,), (170000,), (16,)))


# ----------------------------------------------------------------------------- simulate's arguments

W = jp.Workload(64, 16)
BAD_RUNS = [
    (lambda d: jp.simulate(d, W, None), "'client', value 'NoneType'"),
    (lambda d: jp.simulate(d, (64, 16), jp.ClosedLoop(2)), "'workload', value 'tuple'"),
    (lambda d: jp.simulate(S, W, jp.ClosedLoop(2)), "'deployment', value 'str'"),
    (lambda d: jp.simulate(d, W, jp.ClosedLoop(2), temperature=-1), "'temperature', value -1"),
    (lambda d: jp.simulate(d, W, Trace((0.0,), (64,), (16,))), "pass workload=None"),      # was ignored
    (lambda d: jp.simulate(d, W, jp.ClosedLoop(2), coefficients={"hbm_derate": 1}), "'coefficients'"),
    (lambda d: jp.simulate(d, W, jp.ClosedLoop(2), acceptance=True), "'acceptance', value True"),
    (lambda d: jp.simulate(d, W, jp.ClosedLoop(2, num_prompts=True)), "'num_prompts', value True"),
    (lambda d: jp.simulate(d, W, jp.ClosedLoop(2), engine=[("max_num_seqs", 4)]), "'engine', value 'list'"),
    (lambda d: jp.simulate_sweep(d, W, []), "give at least one concurrency"),
    (lambda d: jp.simulate_sweep(d, W, 4), "'concurrencies', value 4"),
    (lambda d: jp.simulate_sweep(d, W, [2], num_prompts=2.5), "'num_prompts', value 2.5"),
    (lambda d: jp.simulate_sweep(d, W, [2], engine=lambda c: 5), "engine(C) must return a dict"),
    (lambda d: jp.simulate_sweep(d, W, [20000] * 3), "hold 600000 requests together"),
]


@pytest.mark.parametrize("make,words", BAD_RUNS, ids=[w for _, w in BAD_RUNS])
def test_bad_simulate_arguments_are_refused(dep, make, words):
    """Were AttributeError, IndexError or TypeError tracebacks, or silent (num_prompts 2.5 ran 2,
    acceptance True ran 1, a negative temperature reached the pricing after the scheduler)."""
    with pytest.raises(jp.JaxpriceError) as exc:
        make(dep)
    assert words in str(exc.value), str(exc.value)


BAD_ENGINE = [
    ({"max_num_seqs": math.nan}, "'max_num_seqs', value nan: must be an integer >= 1"),
    ({"max_num_seqs": math.inf}, "'max_num_seqs', value inf"),
    ({"max_model_len": "100"}, "'max_model_len', value '100'"),
    ({"watermark": -5}, "'watermark', value -5: must be a number in [0, 1)"),
    ({"watermark": "x"}, "'watermark', value 'x'"),
    ({"lookahead": -1}, "'lookahead', value -1: must be an integer >= 0"),
    ({"num_spec_tokens": -1}, "'num_spec_tokens', value -1"),
    ({"num_spec_tokens": 1.5}, "'num_spec_tokens', value 1.5"),
    ({"decode_threshold": 0}, "'decode_threshold', value 0"),
    ({"reserve_full_isl": "no"}, "'reserve_full_isl', value 'no': must be True or False"),
    ({"async_scheduling": "off"}, "'async_scheduling', value 'off'"),
    ({"fast_forward": "no"}, "'fast_forward', value 'no'"),
    ({"gpu_count": 0}, "'gpu_count', value 0"),
    ({"max_num_seqs": 10 ** 20}, "must be at most 2**40"),           # was an OverflowError past the compile
]


@pytest.mark.parametrize("engine,words", BAD_ENGINE, ids=[next(iter(e)) + "=" + repr(v) for e, _ in BAD_ENGINE
                                                          for v in e.values()])
def test_bad_engine_settings_are_refused_naming_the_setting(dep, engine, words):
    """nan/inf raised ValueError/OverflowError; 'no' was True; -5 watermark, -1 lookahead, 0
    decode_threshold and 0 GPUs (tok/s per GPU: inf) ran."""
    with pytest.raises(jp.JaxpriceError) as exc:
        jp.simulate(dep, W, jp.ClosedLoop(2), engine=engine)
    assert "engine= override" in str(exc.value) and words in str(exc.value), str(exc.value)


def test_a_huge_finite_kv_cache_is_unlimited_as_inf_is(dep):
    """--kv-capacity-tokens 1e30 compiled the scheduler, then raised OverflowError stacking 6e28
    blocks into int64 lanes: 2**40 blocks or more is an unlimited cache, as inf already was."""
    for cap in (1e30, math.inf):
        settings, _ = serve.engine_settings(dep, {"kv_capacity_tokens": cap})
        assert settings["kv_blocks"] == 2 ** 40


# ----------------------------------------------------------------------------- measured CSVs

def test_measured_csv_refusals(tmp_path):
    row = ROW.format(wl="1k1k", isl=1024, c=4, v="{v}", u="{u}")
    cases = [
        (measured(tmp_path, name="dup.csv", header=HEADER + ",value"), ":1, field 'header', value 'value'",
         "appears twice"),
        (measured(tmp_path, row.format(v="1e300", u="us"), name="big.csv"), "big.csv:2, field 'value', value '1e300'",
         "not a serving latency"),
        (measured(tmp_path, row.format(v="0.0001", u="us"), name="small.csv"), "small.csv:2, field 'value'",
         "check the value and its unit 'us'"),
        (measured(tmp_path, ",".join(row.format(v=3000, u="us").split(",")[:-2]), name="short.csv"),
         "short.csv:2, field 'relative_to_sweep_anchor'", "fewer fields than the header (18 of 20)"),
    ]
    for path, where, why in cases:
        with pytest.raises(jp.JaxpriceError) as exc:
            accuracy.read_measurements(path)
        assert where in str(exc.value) and why in str(exc.value), str(exc.value)


def test_measured_csv_bom_and_label_notes(tmp_path):
    """A byte-order mark before a first column 'scenario' was 'missing column scenario'; lengths
    contradicting the workload label are noted in the report (not refused: the label keys the
    stated settings and tests vary the lengths on purpose)."""
    head = HEADER.replace("corpus,", "") + ",corpus"
    rows = [",".join(ROW.format(wl="1k1k", isl=isl, c=c, v=3000, u="us").split(",")[1:]) + ",c"
            for isl, c in ((1024, 4), (2048, 8))]
    points, info = accuracy.read_measurements(measured(tmp_path, *rows, header=head, prefix="\ufeff"))
    assert len(points) == 2 and info["label_mismatch"] == ["line 3 (1k1k: isl 2048, osl 1024)"]
    assert "contradicts its workload label" in "\n".join(accuracy._note_lines(info, False))


def test_settings_csv_refusals(tmp_path):
    head = "scenario,label,concurrency,max_num_seqs"
    for name, data, words in (("bin.csv", (head + "\ns,1k1k,4,8\n").encode() + b"\xff\xfe\x00\n", "not UTF-8"),
                              ("dup.csv", (head + ",max_num_seqs\ns,1k1k,4,8,9\n").encode(), "appears twice"),
                              ("bom.csv", ("\ufeff" + head + "\ns,1k1k,4,8\n").encode("utf-8"), None)):
        p = tmp_path / name
        p.write_bytes(data)
        if words is None:
            assert list(accuracy._stated_table(str(p))) == [("s", "1k1k", 4)]
            continue
        with pytest.raises(jp.JaxpriceError, match=words):
            accuracy._stated_table(str(p))


def test_accuracy_outputs_in_one_file_are_refused(capsys, tmp_path):
    m = measured(tmp_path)
    assert_refused(capsys, ["accuracy", str(m), "--batch-rule", "anchor", "--plot", f"{tmp_path}/r.png",
                            "--markdown", f"{tmp_path}/r.png"], "'--markdown'", "writes Markdown, not an image")
    assert_refused(capsys, ["accuracy", str(m), "--batch-rule", "anchor", "--out", str(tmp_path),
                            "--markdown", f"{tmp_path}/accuracy_points.csv"], "'--markdown'", "writes Markdown, not CSV")
    assert_refused(capsys, ["accuracy", str(m), "--batch-rule", "anchor", "--markdown", str(m)], "'--markdown'",
                   "writes Markdown, not CSV")
    plain = tmp_path / "measured"          # no suffix: the input check itself
    plain.write_text(m.read_text())
    assert_refused(capsys, ["accuracy", str(plain), "--batch-rule", "anchor", "--markdown", str(plain)], "'--markdown'",
                   "same file as CSV (the input)")
    assert m.read_text().startswith("corpus,") and plain.read_text().startswith("corpus,")


# ----------------------------------------------------------------------------- fit

STEP_CASES = [
    (STEP_HEAD + f"{S},1000000000,4096,25,ms\n", ("s.csv:2", "'requests'", "at most 1048576")),   # was MemoryError
    (STEP_HEAD + f"{S},32,100000000000,25,ms\n", ("s.csv:2", "'context'", "16777216")),
    (STEP_HEAD + f"{S},32,4096,25,ms,extra\n", ("s.csv:2", "'row', value 'extra'", "6 fields, the header 5")),
    (STEP_HEAD + f"{S},32\n", ("s.csv:2", "'context'", "fewer fields than the header (2 of 5)")),
    (STEP_HEAD.strip() + ",value\n" + f"{S},32,4096,25,ms,1\n", ("s.csv:1", "'header', value 'value'", "twice")),
    (STEP_HEAD + ",32,4096,25,ms\n", ("s.csv:2", "'scenario', value ''", "must not be empty")),
    (STEP_HEAD + f"{S},32,4096,1e300,ms\n", ("s.csv:2", "'value', value '1e300'", "not a step time")),
    (STEP_HEAD + "".join(f"{S},{2 ** 20},4096,25,ms\n" for _ in range(5)), ("s.csv:2", "past the cap of 4194304")),
]


@pytest.mark.parametrize("text,words", STEP_CASES, ids=["requests", "context", "extra", "short", "dup", "scenario",
                                                         "value", "rows"])
def test_fit_step_csv_refusals(capsys, tmp_path, text, words):
    p = tmp_path / "s.csv"
    p.write_text(text)
    assert_refused(capsys, ["fit", str(p), "--free", "hbm_derate", "--quiet"], *words)


def test_fit_step_csv_encodings_and_temperature(capsys, tmp_path):
    p = tmp_path / "s.csv"
    p.write_bytes(b"\xef\xbb\xbf" + (STEP_HEAD + f"{S},32,4096,25,ms\n").encode())     # a BOM: read, not refused
    (obs,) = fit.read_step_measurements(p)
    assert obs.points == 1 and np.allclose(obs.measured, [0.025])
    p.write_bytes((STEP_HEAD + f"{S},32,4096,25,ms\n" * 400).encode() + b"\xff\xfe\n")   # past the header's read
    with pytest.raises(jp.JaxpriceError, match="not a text CSV file"):
        fit.read_step_measurements(p)
    assert_refused(capsys, ["fit", str(measured(tmp_path)), "--free", "hbm_derate", "--temperature", "1e5"],
                   "'--temperature', value 100000.0", "at most 1")


def test_fit_target_ttft_without_ttft_rows_is_refused_before_simulating(capsys, tmp_path):
    """Was refused only after every point's run was simulated (a minute on the dev set)."""
    assert_refused(capsys, ["fit", str(measured(tmp_path)), "--free", "hbm_derate", "--batch-rule", "simulate",
                            "--target", "ttft", "--quiet"], "m.csv", "'target', value 'ttft'", "no point has a measured")


def test_fit_a_free_pattern_shadowed_by_an_earlier_one_is_refused(capsys, tmp_path):
    """--free 'hbm_*' --free hbm_derate: the first match wins, so the second's bound was ignored,
    refused as matching no coefficient at all (it matches hbm_derate)."""
    assert_refused(capsys, ["fit", str(measured(tmp_path)), "--free", "hbm_*", "--free", "hbm_derate", "--quiet"],
                   "'--free', value 'hbm_derate@hardware:2'", "taken by the earlier --free hbm_*@hardware:2")


def test_fit_a_cv_seed_given_twice_is_refused(capsys, tmp_path):
    assert_refused(capsys, ["fit", str(measured(tmp_path)), "--free", "hbm_derate", "--holdout", "deployment",
                            "--cv-seeds", "1,2,1", "--quiet"], "'--cv-seeds', value 1", "given twice")


def test_a_misspelt_deployment_among_good_ones_is_refused(capsys, tmp_path):
    """--deployment GOOD TYPO scored GOOD alone, silently; a str was taken letter by letter."""
    m = measured(tmp_path)
    good = "gpt-oss-120b-b200-fp4-vllm-tp1"
    assert_refused(capsys, ["accuracy", str(m), "--batch-rule", "anchor", "--deployment", good, good + "x"],
                   "'deployment', value 'gpt-oss-120b-b200-fp4-vllm-tp1x'", "the CSV has 1, e.g. " + good)
    points, _ = accuracy.read_measurements(m)
    assert len(accuracy.select_deployments(points, good, m)) == 2


def test_fit_out_onto_its_input_is_refused(capsys, tmp_path):
    """fit m.csv --out m.csv wrote the YAML set over the measurements."""
    m = measured(tmp_path)
    assert_refused(capsys, ["fit", str(m), "--free", "hbm_derate", "--out", str(m)], "'--out'",
                   "writes YAML, not CSV (suffix .csv)")
    plain = tmp_path / "measured"          # no suffix: the input check itself
    plain.write_text(m.read_text())
    assert_refused(capsys, ["fit", str(plain), "--free", "hbm_derate", "--out", str(plain)], "'--out'",
                   "names the measurement CSV, an input")
    assert m.read_text().startswith("corpus,") and plain.read_text().startswith("corpus,")
