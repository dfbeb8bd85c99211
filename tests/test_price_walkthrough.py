"""A practitioner's walk through the step-pricing side (price, sweep, optimize, cache, import-bench,
the Python API): what misled or broke such a user, each fixed and kept fixed here. Lean: one tiny
compile at most; the rest reads files, parses arguments or traces without pricing."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprice as jp
from jaxprice._src import benchfile, cli_sweep

from clirefusal import refused

DSV3 = "deepseek-v3-h200-fp8-sglang-tp8"


# ----------------------------------------------------------------------------- the command line


def test_a_closed_pipe_on_stdout_ends_quietly_not_in_a_traceback():
    """`jaxprice sweep ... | head` (the CSV goes to stdout by default) ended in a BrokenPipeError
    traceback; a short output (here `cache --json`) in 'Exception ignored ... BrokenPipeError' at exit,
    status 120. Now: nothing on stderr, the shell's status for SIGPIPE."""
    env = {**os.environ, "JAXPRICE_CACHE_DIR": "off", "JAX_PLATFORMS": "cpu"}
    p = subprocess.Popen([sys.executable, "-m", "jaxprice.cli", "cache", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    p.stdout.close()                  # the reader is gone before the command writes
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def _sweep_args(**over):
    base = dict(decode=None, context=None, prefill_chunk="0", ignore_limits=False)
    base.update(over)
    return argparse.Namespace(**base)


def test_a_prefill_only_sweep_prices_each_chunk_once_not_once_per_default_context():
    """`sweep --decode 0 --prefill-chunk 512,1024` (no --context) wrote 7 identical rows per chunk,
    one per default context the step does not hold (--context given is refused for the same reason)."""
    dep = jp.load_deployment(DSV3)
    decode, context, prefill = cli_sweep.grid_axes(_sweep_args(decode="0", prefill_chunk="512,1024"), dep)
    assert (decode, len(context), prefill) == ([0], 1, [512, 1024])
    # with decodes the default contexts stay: 512 ... max_model_len 32768
    assert cli_sweep.grid_axes(_sweep_args(decode="0,8", prefill_chunk="512"), dep)[1] == \
        [512, 1024, 2048, 4096, 8192, 16384, 32768]


# ----------------------------------------------------------------------------- import-bench


def _bench(c=4, **over) -> dict:
    """A `vllm bench serve --save-result` closed-loop result (vllm/benchmarks/serve.py's result_json
    keys), with --save-detailed's per-request lengths."""
    n = 10 * c
    doc = {"date": "20261207-101500", "backend": "vllm", "num_prompts": n, "request_rate": "inf",
           "burstiness": 1.0, "max_concurrency": c, "duration": 12.5, "completed": n, "failed": 0,
           "total_input_tokens": n * 1024, "total_output_tokens": n * 256, "mean_ttft_ms": 120.0,
           "mean_tpot_ms": 12.0, "input_lens": [1024] * n, "output_lens": [256] * n}
    doc.update(over)
    return doc


@pytest.mark.parametrize("over, words", [
    # a negative length was averaged in: [-1000] * 20 + [3000] * 20 read as isl 1000, accepted
    (dict(input_lens=[-1000] * 20 + [3000] * 20), ("field 'input_lens[0]'", "value -1000", "token count")),
    (dict(output_lens=[256] * 39 + [-5]), ("field 'output_lens[39]'", "value -5", "token count")),
    (dict(output_lens=[256.5] * 40), ("field 'output_lens[0]'", "value 256.5", "whole number")),
    # lists of different lengths were ignored silently for the totals
    (dict(input_lens=[1024] * 39), ("field 'input_lens'", "value 39", "output_lens 40")),
    # more completed than sent read as a run with no failures
    (dict(completed=50), ("field 'completed'", "value 50", "num_prompts 40")),
])
def test_a_malformed_bench_result_is_refused_naming_file_field_and_value(tmp_path, over, words):
    path = tmp_path / "c4.json"
    path.write_text(json.dumps(_bench(**over)))
    refused(lambda: benchfile.read_bench_results(path), str(path), *words)


def test_a_truncated_bench_result_says_where_without_a_doubled_word(tmp_path):
    path = tmp_path / "c4.json"
    path.write_text(json.dumps(_bench())[:150])
    msg = refused(lambda: benchfile.read_bench_results(path), "not JSON", "at line 1 column")
    assert "at at" not in msg, msg


def test_a_well_formed_bench_result_still_reads(tmp_path):
    path = tmp_path / "c4.json"
    path.write_text(json.dumps(_bench(output_lens=[256] * 38 + [0, 0], completed=38)))
    (run,) = benchfile.read_bench_results(path)
    assert (run.concurrency, run.num_prompts, run.completed, run.isl, run.osl, run.failed) == (4, 40, 38, 1024, 256, 2)


# ----------------------------------------------------------------------------- the Python API


def test_from_requests_takes_traced_token_counts_so_grad_flows_to_them():
    """The README: jax.grad flows to the batch's token counts. Batch.from_requests, the builder the
    README shows, refused traced counts ('must be numbers, one per request', the value a GradTracer)."""
    w = jnp.arange(1.0, 5.0)

    def f(c):
        b = jp.Batch.from_requests(jnp.array([1.0, 512.0]), jnp.stack([c, 0.0]), pad_to=4, decode_threshold=8)
        assert b.rows == 4
        return jnp.sum(b.computed * w) + jnp.sum(b.prompt_len * w) + jnp.sum(b.mask * w)

    # computed[0] = c counts twice (computed, and prompt_len = computed + scheduled): d/dc = 2 * w[0]
    assert float(jax.grad(f)(4095.0)) == 2.0
    b = jax.jit(lambda c: jp.Batch.from_requests([1.0, 512.0], c, pad_to=4, decode_threshold=8))(jnp.array([7.0, 0.0]))
    assert np.asarray(b.computed).tolist() == [7.0, 0.0, 0.0, 0.0]
    assert np.asarray(b.mask).tolist() == [True, True, False, False]
    assert float(b.decode_threshold) == 8.0


@pytest.mark.parametrize("build, words", [
    (lambda c: jp.Batch.from_requests([-1.0, 512.0], c), ("field 'scheduled[0]'", "value -1.0")),
    (lambda c: jp.Batch.from_requests([1.0, 512.0, 3.0], c), ("field 'computed'", "2 values for 3 requests")),
    (lambda c: jp.Batch.from_requests([1.0, 512.0], c, pad_to=1), ("field 'pad_to'", "do not fit in 1 rows")),
    (lambda c: jp.Batch.from_requests([1.0, 512.0], c, dtype=jnp.int32), ("field 'dtype'", "concrete")),
])
def test_from_requests_with_traced_counts_still_checks_what_is_concrete(build, words):
    refused(lambda: jax.grad(lambda c: jnp.sum(build(jnp.stack([c, 0.0])).computed))(1.0), *words)


def test_the_smooth_breakdown_does_not_call_its_overlap_a_min():
    """`price --temperature 0.05 --breakdown` printed 'sum of stages + head + host = 31.503 ms; Overlap =
    min(that, NoOverlap) = 31.130' with NoOverlap 33.640: in smooth mode the Overlap is a smooth min,
    below both. Exact mode (and temperature 0, exact) keeps the plain wording."""
    from jaxprice._src.cli_price import format_breakdown
    dep = jp.load_deployment(DSV3)
    kinds = len(dep.plan.layer_kind_names)
    layers = {n: np.full(kinds, 1e-3) for n in ("sm", "hbm", "nvlink", "nic", "expert_sm", "expert_hbm", "stage")}
    layers.update(head_sm=np.asarray(1e-4), head_hbm=np.asarray(2e-4))
    rec = {"host": 3.5e-3, "overlap": 5.0e-3}
    smooth = format_breakdown(dep, "64", rec, layers, "ms", 0.05)
    assert "min(that, NoOverlap)" not in smooth and "smooth min of that and NoOverlap" in smooth
    assert "smooth max of the resources at temperature 0.05" in smooth
    for t in (None, 0.0):
        exact = format_breakdown(dep, "64", rec, layers, "ms", t)
        assert "Overlap = min(that, NoOverlap) = 5.000" in exact and "busiest resource" in exact


def test_price_says_a_prefill_at_most_the_decode_threshold_is_priced_as_a_decode(capsys):
    """`price --prefill 4` printed 'prefill requests of 4 tokens' and priced a decode without a word
    (sweep says so for such a chunk)."""
    from jaxprice.cli import main
    assert main(["price", DSV3, "--prefill", "4"]) == 0
    out, err = capsys.readouterr()
    assert "prefill requests of 4 tokens" in out
    assert "note: a prefill request of at most the decode threshold 8 tokens (4) is priced as a decode" in err
    assert main(["price", DSV3, "--prefill", "4", "--decode-threshold", "1"]) == 0     # one kernel, reused
    assert "note:" not in capsys.readouterr().err


def _tiny_grid(decode, context, prefill):
    shape = (len(prefill), len(decode), len(context))
    return {"resources": np.full(shape + (5,), 1e-3), "overlap": np.full(shape, 4e-3),
            "no_overlap": np.full(shape, 5e-3), "bottleneck": np.zeros(shape, dtype=int)}


def test_the_sweep_csv_is_written_with_progress_and_not_held_whole_in_memory(tmp_path, monkeypatch):
    """A 2-million-point sweep's bar reached its end, then the CSV took 25 s more without a word (and
    was built whole in memory first: 1.0 GB peak, now 0.48 GB). The writer reports its rows and streams
    --out in place (a symbolic link stays one, written through)."""
    axes = ([1, 2, 3], [1024, 2048], [0, 512])
    grid = _tiny_grid(*axes)
    seen = []
    import io
    cli_sweep.write_csv(io.StringIO(), grid, *axes, units="ms", estimate="no_overlap",
                        callback=lambda done, total: seen.append((done, total)))
    assert seen == [(2 * k, 12) for k in range(1, 7)]
    monkeypatch.setattr(cli_sweep, "CSV_PROGRESS_POINTS", 1)
    out = tmp_path / "grid.csv"
    link = tmp_path / "link.csv"
    link.symlink_to(out)
    args = argparse.Namespace(out=str(link), units="ms", estimate="no_overlap", quiet=False)
    cli_sweep._write_grid(args, grid, axes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.csv", "link.csv"] and link.is_symlink()
    lines = out.read_text().splitlines()
    assert len(lines) == 13 and lines[1] == "1,1024,0,1,1,1,1,1,1,1,4,5,sm,5"


def test_the_step_figure_does_not_call_a_one_percent_rise_times_one():
    """`price --decode 8,32 --prefill 512,2048 --plot` titled its right panel '8 -> 32: NoOverlap x1' for
    157.94 -> 160.26 ms; the README's figure keeps its 'x5.7'."""
    from jaxprice._src.figures import _step_times_title
    title = _step_times_title(np.array([8, 32]), ["8", "32"], np.array([157.94, 160.26]), "ms", None, True)
    assert title.endswith("8 \u2192 32: NoOverlap \u00d71.01"), title
    readme = _step_times_title(np.array([1, 256]), ["1", "256"], np.array([9.708, 55.019]), "ms", "request", True)
    assert readme.endswith("NoOverlap \u00d75.7, per request \u00f745.2"), readme


def test_optimize_prices_a_workloads_decodes_at_its_own_length(monkeypatch, capsys):
    """`optimize --prompt-len 1024 --output-len 256` priced its decodes at context 4096, past any request
    of that workload (1280 tokens at most): now at the mean, 1024 + 256 / 2, and a --context past the
    requests is refused; without the workload the default stays 4096."""
    from jaxprice._src import cli_optimize
    from jaxprice.cli import main
    from clirefusal import assert_refused
    seen = []

    def stop(args, dep, limits, search):
        seen.append(limits["context"])
        raise jp.JaxpriceError("stopped before the search")
    monkeypatch.setattr(cli_optimize, "_search", stop)
    for extra in (["--prompt-len", "1024", "--output-len", "256"], [],
                  ["--prompt-len", "1024", "--output-len", "256", "--context", "1280"]):
        assert main(["optimize", DSV3, "--itl-ms", "50", *extra]) == 2
    assert seen == [1152, 4096, 1280]
    capsys.readouterr()
    assert_refused(capsys, ["optimize", DSV3, "--itl-ms", "50", "--prompt-len", "1024", "--output-len", "256",
                            "--context", "4096"], "'--context', value 4096", "1024 prompt + 256 output tokens")


# ----------------------------------------------------------------------------- fit / accuracy on TTFT only

def _ttft_only_csv(tmp_path):
    """Two mean_ttft rows of the dev set, no mean_tpot row."""
    from pathlib import Path
    dev = Path(__file__).resolve().parents[1].parent / "shared" / "measured" / "inferencex_vllm_dev.csv"
    if not dev.exists():
        pytest.skip("the dev set is not here")
    lines = dev.read_text().splitlines()
    path = tmp_path / "ttft_only.csv"
    path.write_text("\n".join([lines[0]] + [ln for ln in lines if ",mean_ttft," in ln][:2]) + "\n")
    return path


def test_a_ttft_only_csv_is_read_for_a_ttft_fit_and_accuracy_says_what_to_add(tmp_path, capsys):
    """`fit --batch-rule simulate --target ttft` on a CSV of mean_ttft rows only was refused ("no
    mean_tpot rows"), though it fits TTFT alone. Now such a fit reads each mean_ttft row as a point
    without a measured TPOT (NaN), and its observations take NaN TPOTs when TPOT is not a target;
    `accuracy`, which scores TPOT, still needs the mean_tpot rows and says so."""
    from clirefusal import assert_refused
    from jaxprice._src import accuracy as A
    from jaxprice._src import fit as F
    csv = _ttft_only_csv(tmp_path)
    points, info = A.read_measurements(csv, ttft_points=True)
    assert len(points) == 2 and info["ttft_points"] == 2 and info["ttft_rows_without_tpot"] == []
    assert all(np.isnan(p.measured) and p.measured_ttft > 0 for p in points)
    assert [p.row for p in points] == [2, 3]
    runs = [F.SimRun(None, [None, None], [0, 1])]
    obs = F.SimObservations("d", None, runs, [np.nan, np.nan], [p.measured_ttft for p in points], targets="ttft")
    assert obs.points == 2 and np.allclose(obs.measured, [p.measured_ttft for p in points])
    refused(lambda: F.SimObservations("d", None, runs, [np.nan, np.nan], [1.0, 1.0], targets="tpot,ttft"),
            "measured mean TPOT must be positive and finite")
    assert_refused(capsys, ["accuracy", str(csv), "--out", str(tmp_path / "o")],
                   "no mean_tpot rows, only 2 mean_ttft row(s)", "add each point's mean_tpot row",
                   "--target ttft")


@pytest.mark.parametrize("argv, words", [
    (["--prefill-budget", "2048", "--min-prefill", "4096"],
     ("field '--min-prefill', value 4096", "exceeds --prefill-budget 2048")),
    (["--prefill-budget", "40000", "--prefix", "100"],
     ("field '--prefill-budget', value 40000", "--prefix + --prefill-budget (100 + 40000)")),
])
def test_optimize_refusals_name_the_flags_in_their_text_too(capsys, argv, words):
    """`optimize --min-prefill 4096` said "exceeds prefill_budget 2048", the library's keyword, where
    the user typed --prefill-budget; now the reason names the flags as the field already did."""
    from clirefusal import assert_refused
    line = assert_refused(capsys, ["optimize", DSV3, "--itl-ms", "50", *argv], *words)
    assert "prefill_budget" not in line


def test_a_csv_batch_with_a_decode_threshold_column_is_told_where_the_threshold_goes(tmp_path):
    """The README said a CSV batch has "those columns" (the YAML's, decode_threshold among them), yet a
    decode_threshold column was refused as an unknown column, with no word on where it goes. The README
    now says a CSV states none; the refusal says how to give it."""
    from pathlib import Path
    csv = tmp_path / "b.csv"
    csv.write_text("scheduled,computed,decode_threshold\n1,4095,1\n")
    refused(lambda: jp.load_batch(csv), "field 'decode_threshold'", "unknown column",
            "--decode-threshold N", "load_batch(decode_threshold=N)", "YAML")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "or CSV with those columns" not in readme and "a CSV states no decode threshold" in readme
    ok = tmp_path / "ok.csv"
    ok.write_text("scheduled,computed\n9,4095\n")
    assert float(jp.load_batch(ok, decode_threshold=16).decode_threshold) == 16.0


@pytest.mark.slow           # ~6 s on 2 cores (the serving simulation's compile): the cheap test above runs by default
def test_fit_target_ttft_runs_on_a_ttft_only_csv(tmp_path, capsys):
    """The command end to end: two mean_ttft rows of a tiny run (isl 32, osl 8) fitted alone."""
    import csv as _csv
    from pathlib import Path

    from jaxprice import cli
    src = Path(__file__).resolve().parents[1] / "testdata" / "measured" / "inferencex_vllm_excerpt.csv"
    with open(src, newline="") as fh:
        reader = _csv.DictReader(fh)
        cols, rows = reader.fieldnames, [r for r in reader if r["deployment"] == "gpt-oss-120b-h200-fp4-vllm-tp1"]
    row = next(r for r in rows if r["quantity"] == "mean_ttft")
    path = tmp_path / "ttft.csv"
    with open(path, "w", newline="") as fh:
        w = _csv.DictWriter(fh, cols)
        w.writeheader()
        w.writerows(dict(row, isl="32", osl="8", workload="tiny", concurrency=str(c), value=v, unit="us",
                         anchor_concurrency="2") for c, v in ((2, "9000.0"), (4, "11000.0")))
    out = tmp_path / "fitted.yaml"
    rc = cli.main(["fit", str(path), "--batch-rule", "simulate", "--target", "ttft", "--free", "hbm_derate",
                   "--holdout", "0", "--method", "gauss-newton", "--steps", "3", "--out", str(out), "--quiet"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "simulated mean TTFT" in cap.out and "(2 points with a measured TTFT)" in cap.out and out.exists()
