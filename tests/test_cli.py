"""The `price` and `sweep` commands, run in-process: tables, JSON, batch files, CSV, figures,
and a one-line refusal (exit status 2) for every bad argument.

One deployment is loaded once and shared (the CLI's loader is wrapped in a cache); most
batches are padded to 256 rows so that the commands share one compiled kernel.
"""

from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pytest
from clirefusal import share_deployment

import jaxprice as jp
from jaxprice import cli
from jaxprice._src import cli_price, cli_sweep

S = "deepseek-v3-h200-fp8-sglang-tp8"
PAD = 256


@pytest.fixture(scope="module")
def dep():
    return jp.load_deployment(S)


@pytest.fixture(autouse=True)
def shared_deployment(monkeypatch, dep):
    share_deployment(monkeypatch, S, dep, (cli_price, cli_sweep))


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def price(dep, sched, comp, temperature=None):
    b = jp.Batch.from_requests(sched, comp, pad_to=PAD, decode_threshold=8)
    return jp.price(dep.plan, dep.coefficients, b, temperature=temperature).as_dict()


def assert_step(got, want, rel=1e-12):
    for k in jp.RESOURCES + ("overlap", "no_overlap"):
        assert got[k] == pytest.approx(want[k], rel=rel, abs=1e-15), k
    assert got["bottleneck"] == want["bottleneck"]


def table_rows(out):
    """The table's rows, by their first cell, as lists of cells."""
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if "NoOverlap" in ln and "bottleneck" in ln)
    cols = lines[head].replace("per token", "per_token").split()
    rows = {}
    for ln in lines[head + 1:]:
        if not ln.strip():
            break
        cells = ln.split()
        rows[cells[0]] = dict(zip(cols, cells))
    return rows


# ----------------------------------------------------------------------------- price
# Most commands below price four batches padded to 256 rows ([4, 256]): one compilation.


def test_issue3_example_table_and_plot(capsys, tmp_path):
    png = tmp_path / "step.png"
    rc, out, _ = run(capsys, "price", S, "--decode", "1,2,4,...,256", "--context", "4096", "--plot", str(png))
    assert rc == 0
    rows = table_rows(out)
    assert list(rows) == [str(1 << k) for k in range(9)]
    b32 = rows["32"]
    assert float(b32["Overlap"]) == pytest.approx(24.1, abs=0.05)
    assert float(b32["NoOverlap"]) == pytest.approx(25.6, abs=0.05)
    assert b32["bottleneck"] == "hbm"
    assert float(b32["sm"]) == pytest.approx(4.5, abs=0.05) and float(b32["hbm"]) == pytest.approx(16.5, abs=0.05)
    assert round(float(rows["1"]["host"]), 2) == 3.54 and round(float(rows["1"]["sm"]), 2) == 3.51
    assert [r["bottleneck"] for r in rows.values()] == ["host"] * 2 + ["hbm"] * 7
    assert float(rows["256"]["NoOverlap"]) == pytest.approx(55.01, abs=0.03)
    assert float(rows["256"]["per_token"]) == pytest.approx(55.02 / 256, abs=0.001)
    assert "decode threshold 8" in out and "exact mode" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_a_model_and_a_chip_price_without_a_scenario_file(capsys):
    """price MODEL --chip CHIP --tp N prices the deployment load_scenario_deployment builds,
    the same numbers as price() on it."""
    import argparse

    from jaxprice._src import cli_price
    rc, out, _ = run(capsys, "price", "llama-3.1-8b-instruct", "--chip", "h200", "--tp", "2", "--decode", "1,8",
                     "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["scenario"] == "llama-3.1-8b-instruct-h200-bf16-tp2" and "tp2 dp1" in doc["deployment"]
    built = cli_price.load_scenario_deployment("llama-3.1-8b-instruct", None, argparse.Namespace(
        chip="h200", tp="2", dp=None, ep=None, weights=None, gpus_per_node=None, fabric=None))
    for s in doc["steps"]:
        assert_step(s, price(built, [1] * s["decode"], [4095] * s["decode"]))


def test_json_equals_price_exact_and_smooth(capsys, dep):
    rc, out, _ = run(capsys, "price", S, "--decode", "1,32,128,256", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["units"] == "s" and doc["mode"] == "exact" and doc["temperature"] is None
    assert [s["decode"] for s in doc["steps"]] == [1, 32, 128, 256]
    for s in doc["steps"]:
        assert s["context"] == 4096 and s["decode_threshold"] == 8 and s["tokens"] == s["decode"]
        assert_step(s, price(dep, [1] * s["decode"], [4095] * s["decode"]))
    rc, out, _ = run(capsys, "price", S, "--decode", "1,32,128,256", "--context", "1024", "--json",
                     "--temperature", "0.05")
    doc = json.loads(out)
    assert doc["mode"] == "smooth" and doc["temperature"] == 0.05
    batches = jp.Batch.stack([jp.Batch.decode(b, 1024, pad_to=PAD, decode_threshold=8) for b in (1, 32, 128, 256)])
    want = jp.price_many(dep.plan, dep.coefficients, batches, temperature=0.05)
    exact = price(dep, [1] * 32, [1023] * 32)
    for i, s in enumerate(doc["steps"]):
        assert s["overlap"] == pytest.approx(float(want.overlap[i]), rel=1e-12)
        assert s["no_overlap"] == pytest.approx(float(want.no_overlap[i]), rel=1e-12)
        assert sum(s["bottleneck_weights"].values()) == pytest.approx(1.0)
    assert doc["steps"][1]["overlap"] != pytest.approx(exact["overlap"], rel=1e-6)     # smooth is not exact
    # at temperature 0 the smooth kernel is the exact one, bit for bit, and --json says exact
    rc, out, _ = run(capsys, "price", S, "--decode", "32", "--context", "1024", "--json", "--temperature", "0")
    doc = json.loads(out)
    assert doc["mode"] == "exact" and doc["temperature"] == 0.0
    assert doc["steps"][0]["overlap"] == exact["overlap"] and doc["steps"][0]["no_overlap"] == exact["no_overlap"]


def test_units_us_scale_the_table(capsys):
    _, ms, _ = run(capsys, "price", S, "--decode", "1,32,128,256")
    _, us, _ = run(capsys, "price", S, "--decode", "1,32,128,256", "--units", "us")
    a, b = table_rows(ms)["32"], table_rows(us)["32"]
    assert float(b["NoOverlap"]) == pytest.approx(1000 * float(a["NoOverlap"]), abs=1.0)
    assert "times in us" in us


def test_mixed_decode_and_prefill(capsys, dep):
    """One mixed batch per decode count; 0 decode requests is the prefill requests alone."""
    rc, out, _ = run(capsys, "price", S, "--decode", "0,8,128,254", "--prefill", "512,2048", "--json")
    assert rc == 0
    steps = json.loads(out)["steps"]
    for s, d in zip(steps, (0, 8, 128, 254)):
        assert s["requests"] == d + 2 and s["tokens"] == d + 2560 and s["prefill"] == [512, 2048]
        assert_step(s, price(dep, [1] * d + [512, 2048], [4095] * d + [0, 0]))


def test_batch_files_equal_the_same_batch_in_python(capsys, tmp_path, dep):
    y = tmp_path / "step.yaml"
    y.write_text("decode_threshold: 8\nrequests:\n"
                 "  - {scheduled: 1, computed: 4095, count: 190}\n"
                 "  - {scheduled: 1, computed: 2047}\n"
                 "  - {scheduled: 512, computed: 0, prompt_len: 2048}\n")
    y2 = tmp_path / "list.yaml"                     # a bare list of requests
    y2.write_text("- {scheduled: 1, computed: 4095, count: 190}\n- {scheduled: 1, computed: 2047}\n"
                  "- {scheduled: 512, computed: 0}\n")
    c = tmp_path / "step.csv"
    c.write_text("scheduled,computed,count\n1,4095,190\n1,2047,1\n# a comment line\n512,0,1\n")
    c2 = tmp_path / "plain.csv"                     # one line per request, no count column
    c2.write_text("computed,scheduled\n" + "4095,1\n" * 190 + "2047,1\n0,512\n")
    sched, comp = [1] * 190 + [1, 512], [4095] * 190 + [2047, 0]
    want = price(dep, sched, comp)
    files = (y, y2, c, c2)
    for path in files:
        b = jp.load_batch(path)
        np.testing.assert_array_equal(np.asarray(b.scheduled), sched)
        np.testing.assert_array_equal(np.asarray(b.computed), comp)
        assert float(b.decode_threshold) == 8 and b.rows == 192
    assert float(jp.load_batch(y).prompt_len[-1]) == 2048 and float(jp.load_batch(c).prompt_len[-1]) == 512
    argv = [a for f in files for a in ("--batch", str(f))]
    rc, out, _ = run(capsys, "price", S, *argv, "--json")
    assert rc == 0
    steps = json.loads(out)["steps"]
    assert [s["file"] for s in steps] == [str(f) for f in files]
    for s in steps:
        assert s["requests"] == 192 and s["tokens"] == 703
        assert_step(s, want)
    rc, out, _ = run(capsys, "price", S, *argv)          # the table names each batch by its file
    assert [ln.split()[0] for ln in out.splitlines()[-4:]] == ["step", "list", "step", "plain"]
    assert table_rows(out)["plain"]["bottleneck"] == want["bottleneck"]


def test_decode_threshold_flag_and_file(capsys, tmp_path, dep):
    """A 4-token request is a decode at threshold 8 and a prefill at threshold 1: the flag
    wins over the file, the file over the default (8)."""
    body = "requests:\n  - {scheduled: 4, computed: 1000}\n  - {scheduled: 1, computed: 99, count: 199}\n"
    files = []
    for name, head in (("t1", "decode_threshold: 1\n"), ("t8", "decode_threshold: 8\n"), ("none", ""),
                       ("t0", "decode_threshold: 0\n")):
        f = tmp_path / f"{name}.yaml"
        f.write_text(head + body)
        files += ["--batch", str(f)]
    _, out, _ = run(capsys, "price", S, *files, "--json")
    steps = json.loads(out)["steps"]
    assert [s["decode_threshold"] for s in steps] == [1, 8, 8, 0]
    assert steps[0]["no_overlap"] != steps[1]["no_overlap"] and steps[1]["no_overlap"] == steps[2]["no_overlap"]
    assert_step(steps[2], price(dep, [4] + [1] * 199, [1000] + [99] * 199))
    _, out, _ = run(capsys, "price", S, *files, "--json", "--decode-threshold", "8")
    assert [s["decode_threshold"] for s in json.loads(out)["steps"]] == [8] * 4


def test_breakdown_sums_to_overlap(capsys):
    rc, out, _ = run(capsys, "price", S, "--decode", "1,32,128,256", "--breakdown")
    assert rc == 0
    rows = table_rows(out)
    lines = [ln for ln in out.splitlines() if ln.startswith("sum of stages")]
    assert len(lines) == 4
    for line, row in zip(lines, rows.values()):
        total = float(line.split("=")[1].split()[0])
        assert total == pytest.approx(float(row["Overlap"]), abs=0.002)
    assert "attn_moe" in out and "attn_dense" in out


def test_ignore_limits(capsys):
    assert run(capsys, "price", S, "--decode", "1,32,128,256", "--context", "40000")[0] == 2
    rc, out, _ = run(capsys, "price", S, "--decode", "1,32,128,256", "--context", "40000", "--ignore-limits")
    assert rc == 0 and table_rows(out)["256"]["bottleneck"] == "hbm"


@pytest.mark.parametrize("text,want", [
    ("1,2,4,...,256", [1 << k for k in range(9)]),
    ("16,32,...,64", [16, 32, 48, 64]),
    ("1,2,...,5", [1, 2, 3, 4, 5]),
    ("3,9,27,...,243", [3, 9, 27, 81, 243]),
    ("7", [7]),
    (" 8, 2 ,5", [8, 2, 5]),
])
def test_list_syntax(text, want):
    assert cli_price.parse_int_list(text, flag="--decode") == want


# ----------------------------------------------------------------------------- sweep
# Both sweeps price chunks of 5 grid points of 5 rows: one compilation.


def read_csv(text):
    return list(csv.DictReader(io.StringIO(text)))


def test_sweep_csv_and_heatmap(capsys, tmp_path, dep):
    out_csv, png = tmp_path / "grid.csv", tmp_path / "grid.png"
    rc, _, err = run(capsys, "sweep", S, "--decode", "1,2,4", "--context", "1024,4096", "--prefill-chunk", "0,512",
                     "--out", str(out_csv), "--heatmap", str(png), "--chunk", "5")
    assert rc == 0
    # three chunks of one padding: at most one kernel compile, said on stderr
    assert re.search(r"priced 12 steps in [0-9.]+ s \([01] kernel compile\(s\)", err), err
    rows = read_csv(out_csv.read_text())
    assert len(rows) == 3 * 2 * 2
    assert [(int(r["decode"]), int(r["context"]), int(r["prefill_chunk"])) for r in rows[:3]] == \
        [(1, 1024, 0), (1, 4096, 0), (2, 1024, 0)]
    assert "sm_ms" in rows[0] and "no_overlap_per_decoded_token_ms" in rows[0]
    # (4, 4096, 512) is the last point, in the short last chunk (which repeats it)
    spots = {(4, 4096, 512): ([1] * 4 + [512], [4095] * 4 + [0]), (2, 1024, 0): ([1, 1], [1023, 1023]),
             (1, 4096, 512): ([1, 512], [4095, 0])}
    seen = 0
    for r in rows:
        key = (int(r["decode"]), int(r["context"]), int(r["prefill_chunk"]))
        if key not in spots:
            continue
        seen += 1
        want = price(dep, *spots[key])
        got = {k: float(r[f"{k}_ms"]) / 1e3 for k in jp.RESOURCES + ("overlap", "no_overlap")}
        got["bottleneck"] = r["bottleneck"]
        assert_step(got, want, rel=1e-10)
        assert float(r["no_overlap_per_decoded_token_ms"]) == pytest.approx(want["no_overlap"] * 1e3 / key[0],
                                                                            rel=1e-10)
        assert int(r["requests"]) == key[0] + (key[2] > 0) and int(r["tokens"]) == key[0] + key[2]
    assert seen == 3
    assert "priced 12 steps" in err
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_sweep_to_stdout_units_and_prefill_only_points(capsys, dep):
    rc, out, _ = run(capsys, "sweep", S, "--decode", "0,2,4", "--context", "2048,4096", "--prefill-chunk", "256",
                     "--units", "us", "--quiet", "--chunk", "5")
    assert rc == 0
    rows = read_csv(out)
    assert len(rows) == 6 and "no_overlap_us" in rows[0]
    assert rows[0]["no_overlap_per_decoded_token_us"] == ""       # no decoded token
    want = price(dep, [256], [0])
    assert float(rows[0]["no_overlap_us"]) == pytest.approx(want["no_overlap"] * 1e6, rel=1e-10)


def test_grid_batches_rows():
    """A grid point's rows: D decode rows (1 token, computed c - 1), then padding, then the
    prefill chunk in the last row (computed 0) when the grid has one."""
    template = jp.Batch.from_requests([1.0], [0.0], pad_to=5, decode_threshold=8)
    decode, context, prefill = [0, 2, 4], [100, 700], [0, 64]
    b = cli_sweep.grid_batches(template, decode, context, prefill, np.arange(12), 8)
    k = 1 * 6 + 1 * 2 + 1               # prefill 64, decode 2, context 700
    assert np.asarray(b.scheduled)[k].tolist() == [1, 1, 0, 0, 64]
    assert np.asarray(b.computed)[k].tolist() == [699, 699, 0, 0, 0]
    assert np.asarray(b.mask)[k].tolist() == [True, True, False, False, True]
    assert np.asarray(b.mask)[4].tolist() == [True] * 4 + [False]        # decode 4, no prefill
    assert np.asarray(b.decode_threshold).tolist() == [8.0] * 12


# ----------------------------------------------------------------------------- refusals


def bad_files(tmp_path):
    files = {
        "missing.csv": "scheduled\n1\n",
        "negative.csv": "scheduled,computed\n1,4095\n1,-3\n",
        "nonint.csv": "scheduled,computed\n1.5,4095\n",
        "empty.csv": "",
        "ragged.csv": "scheduled,computed\n1,2,3\n",
        "empty.yaml": "",
        "missing.yaml": "requests:\n  - {scheduled: 1}\n",
        "negative.yaml": "- {scheduled: 1, computed: -1}\n",
        "nonint.yaml": "- {scheduled: 1, computed: 2.5}\n",
        "typo.yaml": "- {scheduled: 1, computed: 2, cont: 3}\n",
        "broken.yaml": "requests: [\n",
        "none.yaml": "requests: []\n",
        "zero.yaml": "- {scheduled: 0, computed: 5}\n",
        "batch.txt": "scheduled,computed\n1,1\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


BAD = [
    (("price", "deepseek-v3-h200"), "near matches: deepseek-v3-h200-fp8-sglang-tp8"),
    (("price", "no-such-model"), "no bundled scenario"),
    (("sweep", "deepseek-v3-h200-fp8-tp8"), "deepseek-v3-h200-fp8-sglang-tp8"),
    (("price", S, "--decode", "0"), "field '--decode', value 0"),
    (("price", S, "--decode", "-4"), "field '--decode', value -4"),
    (("price", S, "--decode", "1,x"), "field '--decode', value 'x'"),
    (("price", S, "--decode", "1,2,4,...,100"), "not on the progression"),
    (("price", S, "--decode", "4,...,16"), "two terms before"),
    (("price", S, "--context", "0"), "field '--context', value 0"),
    (("price", S, "--decode", "300"), "max_num_seqs 256"),
    (("price", S, "--decode", "1", "--context", "40000"), "max_model_len 32768"),
    (("price", S, "--prefill", "9000"), "max_num_batched_tokens 8192"),
    (("price", S, "--prefill", "0"), "field '--prefill', value 0"),
    (("price", S, "--temperature", "-1"), "field '--temperature'"),
    (("price", S, "--temperature", "hot"), "field '--temperature'"),
    (("price", S, "--decode-threshold", "-1"), "field '--decode-threshold'"),
    (("price", S, "--units", "s"), "field '--units'"),
    (("price", S, "--batch", "{d}/missing.csv", "--decode", "4"), "cannot be combined"),
    (("price", S, "--batch", "{d}/nofile.yaml"), "nofile.yaml: no such batch file"),
    (("price", S, "--batch", "{d}/batch.txt"), "batch.txt, value '.txt': unknown batch file type"),
    (("price", S, "--batch", "{d}/missing.csv"), "missing.csv, field 'computed': missing column"),
    (("price", S, "--batch", "{d}/negative.csv"), "negative.csv:3, field 'computed', value '-3'"),
    (("price", S, "--batch", "{d}/nonint.csv"), "nonint.csv:2, field 'scheduled', value '1.5'"),
    (("price", S, "--batch", "{d}/empty.csv"), "empty.csv: is empty"),
    (("price", S, "--batch", "{d}/ragged.csv"), "ragged.csv:2, value '1,2,3'"),
    (("price", S, "--batch", "{d}/empty.yaml"), "empty.yaml: is empty"),
    (("price", S, "--batch", "{d}/missing.yaml"), "field 'requests[0].computed': is missing"),
    (("price", S, "--batch", "{d}/negative.yaml"), "field 'requests[0].computed', value -1"),
    (("price", S, "--batch", "{d}/nonint.yaml"), "field 'requests[0].computed', value 2.5"),
    (("price", S, "--batch", "{d}/typo.yaml"), "field 'requests[0].cont': unknown field"),
    (("price", S, "--batch", "{d}/broken.yaml"), "broken.yaml: is not valid YAML at line 2"),
    (("price", S, "--batch", "{d}/none.yaml"), "none.yaml: has no requests"),
    (("price", S, "--batch", "{d}/zero.yaml"), "field 'requests[0].scheduled', value 0"),
    (("sweep", S, "--decode", "0", "--prefill-chunk", "0,64"), "empty step"),
    (("sweep", S, "--decode", "1,1"), "lists a value twice"),
    (("sweep", S, "--context", "0"), "field '--context', value 0"),
    (("sweep", S, "--prefill-chunk", "-1"), "field '--prefill-chunk', value -1"),
    (("sweep", S, "--decode", "256", "--prefill-chunk", "0,512"), "max_num_seqs"),
    (("sweep", S, "--heatmap-prefill", "64"), "field '--heatmap-prefill', value 64"),
    (("sweep", S, "--estimate", "mean"), "field '--estimate'"),
    (("sweep", S, "--chunk", "0"), "field '--chunk', value 0"),
]


@pytest.mark.parametrize("argv,want", BAD, ids=[" ".join(a[2:] or a[1:]) for a, _ in BAD])
def test_bad_arguments_exit_2_with_one_line(capsys, tmp_path, argv, want):
    d = bad_files(tmp_path)
    argv = [a.format(d=d) for a in argv]
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"jaxprice {argv[0]}: error: ")
    assert want in lines[0], lines[0]


def test_sweep_default_decodes_stay_within_max_num_seqs_beside_a_prefill_chunk(dep):
    """The default decode counts end at max_num_seqs (256 here), one fewer when the grid holds a
    prefill chunk: the default grid with --prefill-chunk 0,512 was refused as 257 requests."""
    import argparse
    args = lambda chunks: argparse.Namespace(decode=None, context="1024", prefill_chunk=chunks,  # noqa: E731
                                             ignore_limits=False)
    decode, _context, prefill = cli_sweep.grid_axes(args("0"), dep)[:3]
    assert decode == [1, 2, 4, 8, 16, 32, 64, 128, 256] and prefill == [0]
    decode, _context, prefill = cli_sweep.grid_axes(args("0,512"), dep)[:3]
    assert decode == [1, 2, 4, 8, 16, 32, 64, 128, 255] and prefill == [0, 512]


def test_the_default_context_fits_the_deployments_max_model_len(tmp_path):
    """price (and optimize, through the same default_context) decode at 4096 tokens of context
    unless told otherwise; a scenario whose max_model_len is smaller (size writes isl + osl + 256)
    was refused with the defaults. They now take its max_model_len there, and keep 4096
    elsewhere. No compile."""
    import argparse

    src = (jp.scenario_path("deepseek-v3-h200-fp8-sglang-tp8")).read_text()
    assert "max_model_len: 32768" in src
    short = tmp_path / "short.yaml"
    short.write_text(src.replace("max_model_len: 32768", "max_model_len: 2048"))
    dep_short, dep_long = jp.load_deployment(str(short)), jp.load_deployment("deepseek-v3-h200-fp8-sglang-tp8")
    assert cli_price.default_context(dep_short) == 2048 and cli_price.default_context(dep_long) == 4096
    args = argparse.Namespace(batch=None, decode="1,2", prefill=None, context=None, ignore_limits=False)
    specs = cli_price.build_batches(args, dep_short, None)
    # the context after the step is 2048: 2047 tokens computed before it, 1 scheduled
    assert [list(s[3]) for s in specs] == [[2047.0], [2047.0, 2047.0]]


def test_price_says_when_the_deployment_would_not_start(capsys):
    """Llama-3.1-70B in bf16 on one H100: 131.4 GiB of weights on an 80 GiB GPU. The step is still
    priced (it needs no memory), and the report says the deployment does not fit, in the text and
    in --json; on 4 GPUs it fits and nothing is said."""
    import argparse
    rc, out, _ = run(capsys, "price", "llama-3.1-70b-instruct", "--chip", "h100", "--tp", "1", "--weights", "bf16",
                     "--decode", "1", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["fits"] is False and doc["fit_note"].startswith("does not fit: weights 131.4 GiB")
    rc, out, _ = run(capsys, "price", "llama-3.1-70b-instruct", "--chip", "h100", "--tp", "1", "--weights", "bf16",
                     "--decode", "1")
    assert rc == 0 and out.rstrip().endswith(f"note: this deployment {doc['fit_note']}: vLLM would not start it; "
                                             "the steps are priced as if it did")
    ns = lambda tp: argparse.Namespace(chip="h100", tp=tp, dp=None, ep=None, weights="bf16",  # noqa: E731
                                       gpus_per_node=None, fabric=None)
    args = argparse.Namespace(batch=None, decode="1", prefill=None, context=None, ignore_limits=False)
    four = cli_price.load_scenario_deployment("llama-3.1-70b-instruct", None, ns("4"))
    assert cli_price.fit_note(four, cli_price.build_batches(args, four, None)) == ""
    one = cli_price.load_scenario_deployment("llama-3.1-70b-instruct", None, ns("1"))
    assert cli_price.fit_note(one, cli_price.build_batches(args, one, None)) == doc["fit_note"]


@pytest.mark.parametrize("argv, flag", [
    (["price", "--coefficients", "x.yaml", "deepseek-v3-h200-fp8-sglang-tp8"], "--coefficients"),
    (["serve", "--goodput", "ttft:100", "deepseek-v3-h200-fp8-sglang-tp8"], "--goodput"),
    (["accuracy", "--coefficients", "a.yaml", "b.csv"], "--coefficients"),
])
def test_an_option_of_several_values_before_the_positional_is_explained(capsys, argv, flag):
    """`--coefficients f.yaml SCENARIO` reads SCENARIO as a second value: the missing-SCENARIO line
    says why and how to write it; a missing positional with no such option given says only that."""
    with pytest.raises(SystemExit) as code:
        cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert code.value.code == 2 and len(err.splitlines()) == 1
    assert f"an option taking several values ({flag}) takes every word" in err
    with pytest.raises(SystemExit):
        cli.main(["price"])
    bare = capsys.readouterr().err.strip()
    assert bare.endswith("the following arguments are required: SCENARIO (see jaxprice price --help)")
