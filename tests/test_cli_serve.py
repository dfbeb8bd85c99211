"""`jaxprice serve`: the command around serve.simulate / simulate_sweep (issue 15's command).

Small runs (prompts of 64, 16 outputs) on one bundled scenario: the table, --json, --csv, the two
figures, the engine flags and the scheduler, and every bad input refused in one line, exit 2.
The scheduler itself is tested in test_serve.py.
"""

from __future__ import annotations

import csv
import json

import pytest

from jaxprice import cli, load_deployment

S = "deepseek-v3-h200-fp8-sglang-tp8"
SMALL = ("--isl", "64", "--osl", "16", "--range-ratio", "1")


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_table_json_csv_and_figures(capsys, tmp_path):
    rc, out, _ = run(capsys, "serve", S, *SMALL, "--concurrency", "1,2", "--csv", str(tmp_path / "r.csv"),
                     "--plot", str(tmp_path / "p.png"), "--timeline", str(tmp_path / "t.png"))
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith(S) and "scheduler vllm" in lines[1]
    head = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["C", "TTFT"])
    assert [ln.split()[0] for ln in lines[head + 1:head + 3]] == ["1", "2"]
    # the fixed part of every TTFT, the deployment's own host latencies, is stated
    coefs = load_deployment(S).coefficients
    host = next(ln for ln in lines if ln.startswith("host, per request:"))
    assert f"admission {coefs['host_admission_per_request'] * 1e6:g} us + " in host
    assert f"{coefs['host_admission_per_token'] * 1e6:g} us x prompt tokens" in host
    with open(tmp_path / "r.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 10 * 1 + 10 * 2                               # 10 x C requests per level
    assert {r["output_len"] for r in rows} == {"16"} and {r["input_len"] for r in rows} == {"64"}
    assert (tmp_path / "p.png").stat().st_size > 10_000 and (tmp_path / "t.png").stat().st_size > 10_000
    # --json: the same runs, times in seconds, each setting with its source
    rc, out, _ = run(capsys, "serve", S, *SMALL, "--concurrency", "1,2", "--json")
    doc = json.loads(out)
    assert rc == 0 and [r["C"] for r in doc["runs"]] == [1, 2]
    one = doc["runs"][0]
    assert one["summary"]["tpot_mean"] > 0 and one["summary"]["preemptions"] == 0
    assert one["assumptions"]["scheduler"]["value"] == "vllm" and one["assumptions"]["max_num_seqs"]["source"]


def test_engine_flags_and_scheduler_reach_the_run(capsys):
    rc, out, _ = run(capsys, "serve", S, *SMALL, "--concurrency", "4", "--json", "--scheduler", "sglang",
                     "--max-num-seqs", "2", "--max-num-batched-tokens", "96", "--async-scheduling", "off")
    a = json.loads(out)["runs"][0]["assumptions"]
    assert rc == 0 and a["scheduler"]["value"] == "sglang"
    assert (a["max_num_seqs"]["value"], a["max_num_batched_tokens"]["value"], a["async_scheduling"]["value"]) == \
        (2, 96, False)
    assert a["max_num_seqs"]["source"] == "engine= override"


BAD = [
    (("--concurrency", "0"), "field '--concurrency', value 0"),
    (("--concurrency", "2,x"), "field '--concurrency', value 'x'"),
    (("--osl", "0", "--concurrency", "2"), "field '--osl', value 0"),
    (("--rate", "-1"), "field '--rate', value -1"),
    (("--concurrency", "2", "--rate", "1"), "give one of --concurrency, --rate, --trace"),
    (("--concurrency", "2", "--max-model-len", "70"), "exceeds max_model_len 70"),
    (("--concurrency", "2", "--kv-capacity-tokens", "40"), "fewer than one request needs"),
    (("--range-ratio", "2"), "field '--range-ratio'"),
    (("--trace", "{d}/trace.csv"), "trace.csv:3"),
]


@pytest.mark.parametrize("argv,want", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_with_one_line(capsys, tmp_path, argv, want):
    (tmp_path / "trace.csv").write_text("arrival_s,input_len,output_len\n0.0,64,16\n0.5,-3,16\n")
    argv = [a.format(d=tmp_path) for a in argv]
    lengths = [] if "--trace" in argv else ["--isl", "64"] + ([] if "--osl" in argv else ["--osl", "16"])
    rc, out, err = run(capsys, "serve", S, *lengths, *argv)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("jaxprice serve: error: ") and want in lines[0], lines[0]


def test_open_loop_says_where_the_wait_queue_grows(capsys, tmp_path):
    # two clients' worth of slots: at 1000 req/s the 20 requests queue, at 1 req/s each finishes
    # long before the next arrives
    argv = ("serve", S, *SMALL, "--rate", "1,1000", "--num-prompts", "20", "--max-num-seqs", "2")
    rc, out, _ = run(capsys, *argv, "--csv", str(tmp_path / "r.csv"))
    assert rc == 0
    notes = [ln for ln in out.splitlines() if "TTFT grew through the run" in ln]
    assert len(notes) == 1 and notes[0].startswith("rate 1000:")
    with open(tmp_path / "r.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if float(r["rate"]) == 1000]
    rows.sort(key=lambda r: float(r["arrival_s"]))
    ttft = [float(r["ttft_s"]) for r in rows]
    first, last = sum(ttft[:4]) / 4, sum(ttft[-4:]) / 4          # fifths of 20 requests
    assert last > 2 * first
    assert f"{first * 1e3:.1f} ms over the first fifth" in notes[0] and f"to {last * 1e3:.1f} ms" in notes[0]
    rc, out, _ = run(capsys, *argv, "--json")
    runs = json.loads(out)["runs"]
    assert [r["queue_growing"] for r in runs] == [False, True]
    assert runs[1]["ttft_last_fifth"] == pytest.approx(last, rel=1e-6)


def test_a_speculating_run_says_its_drafts_and_assumed_acceptance(capsys, tmp_path):
    """The acceptance moves every TPOT and is an assumption: the report says it, and where it came from."""
    from jaxprice._src.resolve import scenario_path
    text = scenario_path(S).read_text().replace("  engine:\n", "  engine:\n    speculative: {num_spec_tokens: 1, "
                                                 "method: deepseek_mtp}\n", 1)
    path = tmp_path / "mtp.yaml"
    path.write_text(text)
    argv = ("serve", str(path), *SMALL, "--concurrency", "1", "--num-prompts", "2")
    rc, out, _ = run(capsys, *argv)
    assert rc == 0
    (line,) = [ln for ln in out.splitlines() if ln.startswith("speculative decoding:")]
    assert "1 draft token(s) a step, 1.7 tokens emitted per decode row and step (assumed (1 - a^(k+1))" in line
    rc, out, _ = run(capsys, *argv, "--acceptance", "1.5")
    assert rc == 0 and "1.5 tokens emitted per decode row and step (given: --acceptance)" in out
    rc, out, _ = run(capsys, "serve", S, *SMALL, "--concurrency", "1", "--num-prompts", "2")
    assert rc == 0 and "speculative decoding" not in out


def test_default_max_model_len_is_the_servers_at_every_load(capsys):
    """A deployment built from a model (--chip) states no max_model_len: serve takes isl + osl + 256,
    InferenceX's server setting, at every load, not each run's longest draw (with range ratio 0.8 the
    draws fall short of 64 + 16: it took 334 here, and differed by load elsewhere, '1495/1524/1535')."""
    rc, out, _ = run(capsys, "serve", "llama-3.1-8b-instruct", "--chip", "h100", "--isl", "64", "--osl", "16",
                     "--concurrency", "1,3", "--json")
    runs = json.loads(out)["runs"]
    assert rc == 0 and [r["assumptions"]["max_model_len"]["value"] for r in runs] == [64 + 16 + 256] * 2
