"""`jaxprice import-bench`: vLLM benchmark results (``vllm bench serve --save-result`` JSON, the keys of
vllm-project/vllm vllm/benchmarks/serve.py) as measurement CSV rows, and the CSV's optional client
columns (num_prompts, range_ratio) honoured by the accuracy harness's simulation. One tiny simulated
sweep (gpt-oss-120b on one H200, C = 1 and 2, 64 input and 8 output tokens); the rest reads files."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

import jaxprice as jp
from jaxprice import accuracy as acc
from jaxprice._src import accuracy as A, benchfile
from jaxprice._src.resolve import testdata_root as data_root
from jaxprice.cli import main as cli_main

from clirefusal import assert_refused, refused

GPT = "gpt-oss-120b-h200-fp4-vllm-tp1"
EPDP = "minimax-m2.5-b200-fp4-vllm-tp2-ep4-dp2"     # 2 ranks of tp 2, expert parallel over 4
DEV = Path("/work/shared/measured/inferencex_vllm_dev.csv")
EXCERPT = data_root() / "measured" / "inferencex_vllm_excerpt.csv"


def bench_json(c, *, tpot=5.25, ttft=80.5, prompts=None, isl=64, osl=8, **over) -> dict:
    """A `vllm bench serve --save-result` result (serve.py's result_json keys) of a closed loop at C."""
    n = prompts or 10 * c
    doc = {"date": "20261207-101500", "endpoint_type": "vllm", "backend": "vllm", "label": None,
           "model_id": "openai/gpt-oss-120b", "tokenizer_id": "openai/gpt-oss-120b", "num_prompts": n,
           "request_rate": "inf", "burstiness": 1.0, "max_concurrency": c, "duration": 12.5, "completed": n,
           "failed": 0, "total_input_tokens": n * isl, "total_output_tokens": n * osl, "request_throughput": 3.2,
           "output_throughput": 100.0, "mean_ttft_ms": ttft, "median_ttft_ms": ttft, "std_ttft_ms": 1.0,
           "p99_ttft_ms": ttft, "mean_tpot_ms": tpot, "median_tpot_ms": tpot, "std_tpot_ms": 0.1,
           "p99_tpot_ms": tpot, "mean_itl_ms": tpot, "max_concurrent_requests": c}
    doc.update(over)
    return doc


def write_json(path, doc, raw=None) -> str:
    Path(path).write_text(raw if raw is not None else json.dumps(doc))
    return str(path)


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# ----------------------------------------------------------------------------- rows


def test_runs_become_tpot_and_ttft_rows_of_one_sweep(tmp_path):
    files = [write_json(tmp_path / "c4.json", bench_json(4, tpot=6.5, ttft=91.25, prompts=37)),
             write_json(tmp_path / "c2.json", bench_json(2))]
    res = jp.import_bench(files, GPT)
    assert res.scenario_dir is None and res.deployment == GPT          # bundled: found without --scenarios
    assert res.accuracy_command("m.csv") == "jaxprice accuracy m.csv --batch-rule simulate"
    res.write(tmp_path / "sub" / "m.csv")
    rows = read_csv(tmp_path / "sub" / "m.csv")
    assert list(rows[0]) == list(benchfile.COLUMNS)
    assert [(r["concurrency"], r["quantity"], r["value"]) for r in rows] == [
        ("2", "mean_tpot", "5.25"), ("2", "mean_ttft", "80.5"), ("4", "mean_tpot", "6.5"), ("4", "mean_ttft", "91.25")]
    same = {"scenario": f"{GPT}.yaml", "deployment": GPT, "model": "gpt-oss-120b", "hardware": "h200", "dtype": "fp4",
            "engine": "vllm", "tp": "1", "ep": "1", "dp": "1", "spec_decode": "none", "workload": "isl64-osl8",
            "isl": "64", "osl": "8", "unit": "ms", "anchor_concurrency": "2", "range_ratio": "1.0",
            "source_run_date": "2026-12-07"}
    for r in rows:
        assert {k: r[k] for k in same} == same
    assert [r["num_prompts"] for r in rows] == ["20", "20", "37", "37"]
    assert rows[2]["source"] == "vllm bench serve --save-result c4.json"
    points, info = acc.read_measurements(tmp_path / "sub" / "m.csv")     # the harness reads them back
    assert info["ttft_points"] == 2 and info["label_mismatch"] == [] and info["anchor_mismatch"] == []
    p2, p4 = points
    assert (p4.concurrency, p4.num_prompts, p4.range_ratio, p4.isl, p4.osl) == (4, 37, 1.0, 64, 8)
    assert p4.measured == pytest.approx(6.5e-3, rel=1e-15) and p4.measured_ttft == pytest.approx(91.25e-3, rel=1e-15)
    dep, where = acc.build_deployment(p2)
    assert where == f"testdata/aisimulate/{GPT}.yaml"


def test_detailed_lengths_and_a_range_ratio_keep_the_mean(tmp_path):
    """input_lens/output_lens (--save-detailed) give the means over requests with output (a failed
    one has output 0); with R < 1 the CSV's isl/osl are the upper length whose range keeps the mean."""
    doc = bench_json(2, prompts=4, completed=3, failed=1, input_lens=[100, 101, 103, 500], output_lens=[20, 21, 22, 0],
                     total_input_tokens=304, total_output_tokens=63)
    res = jp.import_bench([write_json(tmp_path / "d.json", doc)], GPT, range_ratio=0.5, label="mine")
    (run,) = res.runs
    assert (run.isl, run.osl, run.completed, run.num_prompts) == (101, 21, 3, 4)
    r = res.rows[0]
    assert (r["workload"], r["isl"], r["osl"], r["range_ratio"]) == ("mine", 135, 28, "0.5")
    assert (int(135 * 0.5) + 135) / 2 == 101 and (int(28 * 0.5) + 28) / 2 == 21
    assert [benchfile.upper_length(m, 0.8) for m in (921, 1)] == [1023, 1]


def test_a_users_scenario_resolves_through_scenarios_and_its_layout_columns(tmp_path):
    """A scenario outside the bundled folder: deployment = its stem, found with --scenarios; a
    tp2 x dp2 expert-parallel file's tp, ep and dp columns in InferenceX's convention pass the harness's checks."""
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(data_root() / "aisimulate" / f"{EPDP}.yaml", folder / "my-epdp.yaml")
    res = jp.import_bench([write_json(tmp_path / "a.json", bench_json(8))], folder / "my-epdp.yaml")
    r = res.rows[0]
    assert (r["deployment"], r["scenario"], r["model"], r["hardware"], r["dtype"], r["tp"], r["ep"], r["dp"]) == (
        "my-epdp", "my-epdp.yaml", "minimax-m2.5", "b200", "fp4", 4, 4, 2)
    assert res.scenario_dir == str(folder)
    assert res.accuracy_command("m.csv") == f"jaxprice accuracy m.csv --scenarios {folder} --batch-rule simulate"
    res.write(tmp_path / "m.csv")
    (p,) = acc.read_measurements(tmp_path / "m.csv")[0]
    dep, where = acc.build_deployment(p, scenario_dirs=[folder])
    par = dep.scenario.parallel
    assert where == str(folder / "my-epdp.yaml") and (par["tp"], par["dp"]) == (2, 2)
    assert acc.rank_tp(p) == 2 and acc.gpus_of(p) == 4


def test_cli_writes_the_csv_and_prints_the_accuracy_command(tmp_path, capsys):
    folder = tmp_path / "s"
    folder.mkdir()
    shutil.copy(data_root() / "aisimulate" / f"{GPT}.yaml", folder / "mine.yaml")
    files = [write_json(tmp_path / f"c{c}.json", bench_json(c)) for c in (1, 2)]
    out = tmp_path / "m.csv"
    assert cli_main(["import-bench", *files, "--scenario", str(folder / "mine.yaml"), "--out", str(out),
                     "--range-ratio", "0.5", "--label", "short"]) == 0
    text = capsys.readouterr().out
    assert "wrote 4 rows (2 runs at C = 1, 2; workload short) of deployment mine" in text
    settings = tmp_path / "m-settings.csv"                 # default: <out stem>-settings.csv beside --out
    assert f"wrote 2 settings rows to {settings}: the engine of mine.yaml, taken as what the runs ran" in text
    assert f"score it: jaxprice accuracy {out} --scenarios {folder} --batch-rule simulate --settings {settings}" in text
    assert (f"fit to it: jaxprice fit {out} --scenario-dir {folder} --batch-rule simulate --target tpot,ttft "
            f"--settings {settings}") in text
    assert {r["range_ratio"] for r in read_csv(out)} == {"0.5"}
    assert [(r["label"], r["concurrency"], r["cache_dtype"]) for r in read_csv(settings)] == [
        ("short", "1", "fp8"), ("short", "2", "fp8")]
    assert "note:" not in text                               # every request completed
    other = tmp_path / "flags" / "f.csv"
    assert cli_main(["import-bench", *files, "--scenario", GPT, "--out", str(out), "--settings-out", str(other)]) == 0
    assert f"--settings {other}" in capsys.readouterr().out and len(read_csv(other)) == 2
    # a run some of whose requests failed: said so (its means are over the completed ones)
    lossy = write_json(tmp_path / "lossy.json", bench_json(4, completed=37, failed=3))
    assert cli_main(["import-bench", lossy, "--scenario", GPT, "--out", str(tmp_path / "l.csv")]) == 0
    assert (f"note: {lossy}: 3 of 40 requests failed: its means are over the 37 that completed, while the "
            "simulation completes all 40") in capsys.readouterr().out


# ----------------------------------------------------------------------------- refusals


REFUSALS = [
    ("notjson", None, "{not json", ("not JSON",)),
    ("list", [1, 2], None, ("'(top level)'", "not an object")),
    ("missing", dict(drop="mean_tpot_ms"), None, ("field 'mean_tpot_ms'", "missing field", "serve.py@009e6d4")),
    ("openloop", dict(request_rate=10.0), None, ("field 'request_rate'", "value 10.0", "open-loop", "closed loops")),
    ("rampup", dict(ramp_up_strategy="linear"), None, ("field 'ramp_up_strategy'", "ramp-up")),
    ("noconc", dict(max_concurrency=None), None, ("field 'max_concurrency'", "value None", "--max-concurrency C")),
    ("none", dict(completed=0), None, ("field 'completed'", "value 0", "no request completed")),
    ("nan", None, json.dumps(bench_json(2)).replace('"mean_ttft_ms": 80.5', '"mean_ttft_ms": NaN'),
     ("field 'mean_ttft_ms'", "value nan", "finite")),
    ("text", dict(duration="12"), None, ("field 'duration'", "value '12'", "finite number")),
    ("zero", dict(mean_tpot_ms=0.0), None, ("field 'mean_tpot_ms'", "value 0.0", "more than one output token")),
    ("few", dict(num_prompts=1, completed=1), None, ("field 'num_prompts'", "value 1", "fewer prompts than")),
]


@pytest.mark.parametrize("name, change, raw, words", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_bad_result_file_is_refused_in_one_line(tmp_path, name, change, raw, words):
    doc = change if isinstance(change, list) else bench_json(2)
    if isinstance(change, dict):
        doc = {k: v for k, v in doc.items() if k != change.get("drop")}
        doc.update({k: v for k, v in change.items() if k != "drop"})
    path = write_json(tmp_path / f"{name}.json", doc, raw)
    msg = refused(lambda: jp.import_bench([path], GPT), *words)
    assert msg.startswith(path)


def test_two_runs_at_one_concurrency_and_bad_options_are_refused(tmp_path, capsys):
    a, b = (write_json(tmp_path / f"{n}.json", bench_json(4)) for n in "ab")
    refused(lambda: jp.import_bench([a, b], GPT), b, "field 'max_concurrency'", "value 4",
            "a second run of workload isl64-osl8 at concurrency 4", a)
    jp.import_bench([a], GPT, label="x")                 # one of them is fine
    refused(lambda: jp.import_bench([a], GPT, range_ratio=1.5), "field 'range_ratio'", "value 1.5", "[0, 1]")
    refused(lambda: jp.import_bench([a], GPT, label=" "), "field 'label'", "non-empty")
    yml = tmp_path / "s.yml"
    shutil.copy(data_root() / "aisimulate" / f"{GPT}.yaml", yml)
    refused(lambda: jp.import_bench([a], yml), "field 'SCENARIO'", ".yaml suffix")
    assert_refused(capsys, ["import-bench", a, "--scenario", GPT, "--out", str(tmp_path / "m.csv"), "--range-ratio",
                            "nan"], "field '--range-ratio'", "value 'nan'")
    assert_refused(capsys, ["import-bench", a, "--scenario", GPT, "--out", a], "field '--out'")
    m = str(tmp_path / "m.csv")
    assert_refused(capsys, ["import-bench", a, "--scenario", GPT, "--out", m, "--settings-out", m],
                   "field '--settings-out'", "same file as --out")
    assert_refused(capsys, ["import-bench", str(tmp_path / "x.json"), "--scenario", GPT, "--out",
                            str(tmp_path / "m.csv")], "x.json", "cannot read the benchmark result")


def test_bad_client_columns_in_a_measurement_csv_are_refused(tmp_path):
    res = jp.import_bench([write_json(tmp_path / "a.json", bench_json(4))], GPT)
    for col, val, words in (("num_prompts", "3", ("fewer prompts than the concurrency 4",)),
                            ("num_prompts", "2.5", ("expected an integer",)),
                            ("range_ratio", "1.2", ("[0, 1]",)), ("range_ratio", "x", ("[0, 1]",))):
        rows = [{**r, col: val} for r in res.rows]
        res.rows, saved = rows, res.rows
        res.write(tmp_path / "bad.csv")
        res.rows = saved
        refused(lambda: acc.read_measurements(tmp_path / "bad.csv"), "bad.csv:2", f"field '{col}'", f"value '{val}'",
                *words)


def sglang_record(c, *, tpot=5.5, ttft=70.0, n=None, isl=64, osl=8) -> dict:
    """One line of SGLang's `python -m sglang.bench_serving --output-file` (its result keys; no
    num_prompts, no date; a closed loop's request rate inf, which json writes as Infinity)."""
    n = n or 10 * c
    return {"backend": "sglang", "dataset_name": "random", "request_rate": float("inf"), "max_concurrency": c,
            "random_input_len": isl, "random_output_len": osl, "random_range_ratio": 0.0, "duration": 9.5,
            "completed": n, "total_input_tokens": n * isl, "total_output_tokens": n * osl, "mean_ttft_ms": ttft,
            "mean_tpot_ms": tpot, "concurrency": c - 0.1, "accept_length": None}


def test_sglang_json_lines_become_one_run_a_line(tmp_path):
    """SGLang's bench_serving appends one JSON object a run to its output file: each line is a
    run, its prompt count the completed count (it records none), its source file:line."""
    path = tmp_path / "sglang.jsonl"
    path.write_text("\n".join(json.dumps(sglang_record(c, n=n)) for c, n in ((4, 40), (2, 24))) + "\n\n")
    assert "Infinity" in path.read_text()
    runs = benchfile.read_bench_results(path)
    assert [(r.concurrency, r.num_prompts, r.completed, r.isl, r.osl, r.date) for r in runs] == [
        (4, 40, 40, 64, 8, ""), (2, 24, 24, 64, 8, "")]
    assert [r.path for r in runs] == [f"{path}:1", f"{path}:2"]
    res = jp.import_bench([path], GPT)
    assert sorted({(row["concurrency"], row["num_prompts"]) for row in res.rows}) == [(2, 24), (4, 40)]
    with pytest.raises(jp.JaxpriceError, match="holds 2 runs"):
        benchfile.read_bench_result(path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(sglang_record(2)) + "\n{oops\n")
    with pytest.raises(jp.JaxpriceError, match=r"bad.jsonl:2.*not JSON") as err:
        benchfile.read_bench_results(bad)
    assert "\n" not in str(err.value)
    rate = tmp_path / "rate.jsonl"
    rate.write_text(json.dumps(sglang_record(2)) + "\n" + json.dumps({**sglang_record(4), "request_rate": 8.0}) + "\n")
    with pytest.raises(jp.JaxpriceError, match=r"rate.jsonl:2.*open-loop"):
        jp.import_bench([rate], GPT)


# ----------------------------------------------------------------------------- the scenario's engine as --settings


def _my_scenario(folder: Path, **engine) -> Path:
    """The bundled GPT scenario as a user's file, its engine lines replaced (None: the line removed;
    a key it lacks: added at the end, the engine section)."""
    folder.mkdir(exist_ok=True)
    lines, seen = [], set()
    for line in (data_root() / "aisimulate" / f"{GPT}.yaml").read_text().splitlines():
        key = line.strip().split(":")[0]
        if line.startswith("    ") and key in engine:
            seen.add(key)
            if engine[key] is None:
                continue
            line = f"    {key}: {engine[key]}"
        lines.append(line)
    lines += [f"    {k}: {v}" for k, v in engine.items() if k not in seen and v is not None]
    path = folder / "mine.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_scenarios_engine_is_stated_for_each_run(tmp_path):
    """The scenario is what the runs ran: one settings row per run, keyed as its measurement rows
    (read_settings finds them), stating the scenario's engine; engine_assumptions then shows it with
    the --settings source; max_model_len, unset in the scenario, is left empty: the recipe's applies."""
    path = _my_scenario(tmp_path / "s", max_num_seqs=3, max_num_batched_tokens=2048, gpu_memory_utilization=0.85,
                        block_size=32, cache_dtype="auto", cudagraph_mode="full_decode_only", max_model_len=None)
    res = jp.import_bench([write_json(tmp_path / f"c{c}.json", bench_json(c)) for c in (2, 4)], path, label="mine")
    res.write(tmp_path / "m.csv")
    res.write_settings(tmp_path / "st.csv")
    rows = read_csv(tmp_path / "st.csv")
    assert list(rows[0]) == list(benchfile.SETTINGS_COLUMNS)
    engine = {"max_num_seqs": "3", "max_num_batched_tokens": "2048", "gpu_memory_utilization": "0.85",
              "block_size": "32", "max_model_len": "", "cache_dtype": "auto", "cudagraph_mode": "FULL_DECODE_ONLY",
              "enable_prefix_caching": "false"}
    assert [{k: r[k] for k in ("scenario", "label", "framework", "gpu", "source_run_date", "concurrency", *engine)}
            for r in rows] == [{"scenario": "mine.yaml", "label": "mine", "framework": "vllm", "gpu": "h200",
                                "source_run_date": "2026-12-07", "concurrency": str(c), **engine} for c in (2, 4)]
    points = A.read_settings(acc.read_measurements(tmp_path / "m.csv")[0], tmp_path / "st.csv")
    assert [p.concurrency for p in points] == [2, 4]
    for p in points:
        a = acc.engine_assumptions(p)
        got = {k: a[k][0] for k in ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
                                    "block_size", "cache_dtype", "cudagraph_mode")}
        assert got == {"max_num_seqs": 3, "max_num_batched_tokens": 2048, "gpu_memory_utilization": 0.85,
                       "block_size": 32, "cache_dtype": "auto", "cudagraph_mode": "FULL_DECODE_ONLY"}
        assert {a[k][1] for k in got} == {"stated by the run (the --settings file)"}
        assert a["max_model_len"] == (64 + 8 + 256, a["max_model_len"][1]) and "isl + osl + 256" in a["max_model_len"][1]
    eager = jp.import_bench([write_json(tmp_path / "e.json", bench_json(2))],
                            _my_scenario(tmp_path / "e", enforce_eager="true", cudagraph_mode=None))
    assert eager.settings_rows[0]["cudagraph_mode"] == "NONE"      # enforce_eager runs without graphs


def test_settings_the_scenario_leaves_unset_are_its_own_resolved_defaults(tmp_path):
    """A user's scenario silent on max_num_seqs, the budget, gmu, the cache dtype and the graph
    mode ran vLLM's defaults, as `jaxprice serve` resolves that very scenario (not the InferenceX
    recipe for its model and chip, which states C sequences, fp8 and its own budget)."""
    from jaxprice._src import serve
    path = _my_scenario(tmp_path / "u", max_num_seqs=None, max_num_batched_tokens=None, gpu_memory_utilization=None,
                        cache_dtype=None, cudagraph_mode=None, max_model_len=None)
    dep = jp.load_deployment(path)
    eng, _ = serve.engine_settings(dep, max_len=1)
    row = jp.import_bench([write_json(tmp_path / "u2.json", bench_json(2))], path).settings_rows[0]
    assert {k: row[k] for k in ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "cache_dtype",
                                "cudagraph_mode", "max_model_len")} == {
        "max_num_seqs": str(dep.resolution["max_num_seqs"]), "max_num_batched_tokens": str(eng["max_num_batched_tokens"]),
        "gpu_memory_utilization": "0.9", "cache_dtype": dep.resolution["cache_dtype"],
        "cudagraph_mode": dep.resolution["cudagraph_mode"], "max_model_len": ""}


def test_a_stated_cache_dtype_and_graph_mode_reach_the_simulated_engine(tmp_path):
    """The harness's simulated run (its stage 1, resolve only: no compile) sizes the KV cache by the
    stated cache dtype (fp8 holds twice the tokens of the bf16 'auto' cache of gpt-oss) and runs the
    stated graph mode (NONE: decode steps eager)."""
    from jaxprice._src.formats import Registry
    res = jp.import_bench([write_json(tmp_path / "c2.json", bench_json(2))], GPT)
    res.write(tmp_path / "m.csv")
    points, _ = acc.read_measurements(tmp_path / "m.csv")
    kv, plans = {}, {}
    for cache, mode in (("auto", "PIECEWISE"), ("fp8", "PIECEWISE"), ("fp8", "NONE")):
        res.settings_rows = [{**r, "cache_dtype": cache, "cudagraph_mode": mode} for r in res.settings_rows]
        res.write_settings(tmp_path / f"{cache}-{mode}.csv")
        mine = A.read_settings(points, tmp_path / f"{cache}-{mode}.csv")
        (run,) = A._simulated_runs_of(mine, [], registry=Registry(), scenario_dirs=None, extra_coefficient_files=(),
                                      source="columns")
        kv[cache, mode], plans[cache, mode] = run.kv, run.dep.plan
        assert run.dep.resolution["cudagraph_mode"] == mode
    assert kv["fp8", "PIECEWISE"] / kv["auto", "PIECEWISE"] == pytest.approx(2.0, rel=1e-12)
    assert [plans[k].scalars["decode_mode"] for k in (("fp8", "PIECEWISE"), ("fp8", "NONE"))] == [1, 2]


@pytest.mark.parametrize("col, val, words", [
    ("cache_dtype", "bf16", ("not a vLLM KV cache dtype", "bfloat16", "fp8")),
    ("cudagraph_mode", "FULLY", ("not a cudagraph mode", "FULL_AND_PIECEWISE")),
])
def test_a_bad_stated_cache_dtype_or_graph_mode_is_refused_in_one_line(tmp_path, col, val, words):
    res = jp.import_bench([write_json(tmp_path / "c2.json", bench_json(2))], GPT)
    res.write(tmp_path / "m.csv")
    res.settings_rows = [{**r, col: val} for r in res.settings_rows]
    res.write_settings(tmp_path / "bad.csv")
    points, _ = acc.read_measurements(tmp_path / "m.csv")
    refused(lambda: A.read_settings(points, tmp_path / "bad.csv"), "bad.csv:2", f"field '{col}'", f"value '{val}'",
            *words)


# ----------------------------------------------------------------------------- the harness without the columns


def test_a_file_without_the_client_columns_keeps_inferencex_client():
    (p, *_), _ = acc.read_measurements(EXCERPT)
    assert p.num_prompts is None and p.range_ratio is None
    a = acc.engine_assumptions(p)
    assert a["range_ratio"][0] == 0.8 and a["range_ratio"][1].startswith("RANDOM_RANGE_RATIO 0.8 (InferenceX")
    assert a["num_prompts"][0] == 10 * p.concurrency and a["num_prompts"][1].startswith("10 x C (--num-prompts")
    assert A.run_settings_key(p)[-2:] == (None, None)
    # the bundled table states no cache dtype or graph mode: the recipe's (none set: 'auto', vLLM's default)
    assert not {"cache_dtype", "cudagraph_mode"} & set(acc.stated_settings(p))
    assert a["cache_dtype"][0] == "auto" and "no kv-cache-dtype flag" in a["cache_dtype"][1]
    assert a["cudagraph_mode"] == (A.VLLM_DEFAULT_CUDAGRAPH_MODE, A.VLLM_CUDAGRAPH_SOURCE)


# ----------------------------------------------------------------------------- simulated


def test_simulate_runs_the_csv_prompt_count_and_range(tmp_path):
    """The simulated runs send the CSV's num_prompts with lengths on [floor(R L), L], and each
    point's assumptions say so (a spy records what reached the scheduler)."""
    from jaxprice._src import serve
    files = [write_json(tmp_path / "c1.json", bench_json(1, prompts=3)),
             write_json(tmp_path / "c2.json", bench_json(2, prompts=5))]
    res = jp.import_bench(files, GPT, range_ratio=0.5)
    res.write(tmp_path / "m.csv")
    seen, real = [], serve.build_schedules_batched

    def spy(jobs, **kw):
        seen.extend(items for _dep, items, *_ in jobs)
        return real(jobs, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(serve, "build_schedules_batched", spy)
        rep = acc.evaluate_accuracy(tmp_path / "m.csv", batch_rule="simulate")
    assert rep.refused == []
    items = [it for job in seen for it in job]
    assert [it[1] for it in items] == [jp.ClosedLoop(1, 3), jp.ClosedLoop(2, 5)]
    assert {it[0] for it in items} == {jp.Workload(85, 11, 0.5, 0)}       # means 64 and 8 kept: [42, 85], [5, 11]
    r1, r2 = sorted(rep.records, key=lambda r: r["concurrency"])
    assert "range_ratio=0.5 prompts=3" in r1["assumptions"] and "range_ratio=0.5 prompts=5" in r2["assumptions"]
    rows = rep.info["assumptions"]          # one row per prompt count the CSV states (3 and 5)
    assert sorted(row["num_prompts"][0] for row in rows) == [3, 5]
    for row in rows:
        assert row["num_prompts"][1].startswith("the CSV's num_prompts column")
        assert row["range_ratio"][1].startswith("the CSV's range_ratio column: lengths uniform on [floor(0.5 L), L]")
    for r in rep.records:
        assert r["status"] == "priced" and math.isfinite(r["no_overlap_tpot_us"]) and r["no_overlap_ttft_us"] > 0


def test_the_report_shows_a_stated_prompt_count_as_it_is():
    """The settings table showed 'C' for any prompt count not 10 x C, a CSV's 20 prompts at C = 2
    too; the recipe's rules still read as rules."""
    from jaxprice._src.accuracy import _settings_value
    assert _settings_value({"num_prompts": (20, "the CSV's num_prompts column (the prompts the run sent)")},
                           "num_prompts") == 20
    assert _settings_value({"num_prompts": (40, "10 x C (--num-prompts $((CONC * 10))): x")}, "num_prompts") == "10 x C"
    assert _settings_value({"num_prompts": (4, "C (--num-prompts $CONC): x")}, "num_prompts") == "C"


def test_a_broken_multi_line_json_is_refused_as_a_broken_document(tmp_path):
    """A `--save-result` file cut short (or pretty-printed, then cut): the document's own JSON error,
    where in it, and both formats read; it was refused as a bad JSON Lines line 1, as if a run were there."""
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(bench_json(2), indent=2)[:-40])
    msg = refused(lambda: benchfile.read_bench_results(path), "not JSON", "vllm bench serve --save-result", "at line")
    assert msg.startswith(f"{path}:") and not msg.startswith(f"{path}:1") and "JSON Lines result file holds" not in msg


def test_runs_of_one_workload_a_token_apart_stay_one_sweep(tmp_path):
    """Without --ignore-eos a run's mean output length moves by a token or so with C: runs within
    10% of each other are one workload (one sweep, one anchor), at their completed-weighted mean
    lengths; a workload far apart is its own sweep."""
    files = [write_json(tmp_path / f"c{c}-{isl}.json", bench_json(c, osl=osl, isl=isl))
             for c, osl, isl in ((2, 8, 64), (4, 8, 64), (8, 9, 64), (2, 128, 1024))]
    res = jp.import_bench(files, GPT)
    sweeps = sorted({(r["workload"], r["isl"], r["osl"], r["anchor_concurrency"]) for r in res.rows})
    # (8 x 20 + 8 x 40 + 9 x 80) / 140 = 8.57 -> 9
    assert sweeps == [("isl1024-osl128", 1024, 128, 2), ("isl64-osl9", 64, 9, 2)]
    one = jp.import_bench(files[:3], GPT, label="mine")
    assert {(r["workload"], r["osl"]) for r in one.rows} == {("mine", 9)}
