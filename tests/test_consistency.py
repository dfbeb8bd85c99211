"""Cross-surface consistency: one quantity, reported through two surfaces (a command's table,
its --json, the files it writes, the library, another command reading those files), agrees.

Five disagreements this file found and pins fixed:

* `serve`'s summary throughput (tok/s, requests/s) divided by the end of the engine's last step,
  while the run lasts until the last response is back at its client (arrival + E2E of the
  per-request --csv rows): 7% over the rows' figure on the short run below;
* `serve`'s table line stated the first load's kv_blocks for every load, while a model with
  sliding-window layers sizes its KV cache at each run's own lengths (--json had each run's);
* `serve`'s ITL percentiles were those of the emitting steps' times, not of the gaps between a
  request's tokens, which under SGLang's prefill-only steps span several steps (ITL p99 below the
  ITL mean);
* `size`'s steady evaluator left the request's admission latency out of TTFT, which the serving
  simulation (serve, and size's own simulated points) charges: 40 ms below it at one client;
* `size`'s resident_per_rank of a simulated point was the peak over all data-parallel ranks
  together (twice the steady state's per-rank figure at dp 2).

Kept small: one sliding-window deployment served at 192/16 tokens and C = 1, 4 (one cold
simulation, the rest warm), and qwen3-30b-a3b sized over one layout (tp1 dp2, expert parallel).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shlex

import numpy as np
import pytest
import yaml

import jaxprice as jp
from jaxprice import cli

SCEN = "gpt-oss-120b-h200-fp4-vllm-tp2"      # sliding-window layers; 2 GPUs
LOADS = (1, 4)
SERVE = ("--isl", "192", "--osl", "16", "--concurrency", ",".join(map(str, LOADS)))


def _cli(*argv) -> str:
    """Run one command in process; its stdout (stderr, the progress bars, dropped)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([str(a) for a in argv])
    assert rc == 0, err.getvalue()
    return out.getvalue()


def _rows(path) -> list:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`serve` at two loads: the table (with --csv) and --json; each load's CSV rows."""
    path = tmp_path_factory.mktemp("serve") / "requests.csv"
    text = _cli("serve", SCEN, *SERVE, "--csv", path)
    doc = json.loads(_cli("serve", SCEN, *SERVE, "--json"))
    rows = _rows(path)
    by_load = {c: [r for r in rows if int(r["C"]) == c] for c in LOADS}
    return text, doc, by_load


def _col(rows, key):
    return np.array([float(r[key]) for r in rows])


def test_serve_throughput_is_the_per_request_rows(served):
    """tok/s and requests/s divide by the client's wall time: until the last response is back."""
    _text, doc, by_load = served
    for run in doc["runs"]:
        rows, s = by_load[run["C"]], run["summary"]
        wall = np.max(_col(rows, "arrival_s") + _col(rows, "e2e_s"))
        assert s["duration"] == pytest.approx(wall, rel=1e-8)
        assert s["output_tps"] == pytest.approx(_col(rows, "output_len").sum() / wall, rel=1e-8)
        assert s["requests_per_s"] == pytest.approx(len(rows) / wall, rel=1e-8)
        assert s["output_tps_per_gpu"] == pytest.approx(s["output_tps"] / 2, rel=1e-12)


def test_serve_table_states_each_loads_kv_cache(served):
    """The table's engine line gives every load's kv_blocks where the runs differ, as --json does."""
    text, doc, _ = served
    kv = [run["assumptions"]["kv_blocks"]["value"] for run in doc["runs"]]
    assert len(set(kv)) == len(LOADS)        # the windowed capacity depends on each run's drawn lengths
    engine = next(line for line in text.splitlines() if line.startswith("engine:"))
    assert f"kv_blocks {'/'.join(map(str, kv))} (by load)" in engine
    assert "max_num_seqs 256," in engine     # a setting the loads share is stated once


def test_serve_latency_summaries_are_the_per_request_rows_and_the_table(served):
    text, doc, by_load = served
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["C", "TTFT"])
    completion = float(jp.load_deployment(SCEN).coefficients["host_completion"])
    for k, run in enumerate(doc["runs"]):
        rows, s = by_load[run["C"]], run["summary"]
        ttft, e2e, tpot = _col(rows, "ttft_s"), _col(rows, "e2e_s"), _col(rows, "tpot_s")
        multi = _col(rows, "output_len") > 1
        for key, vals in (("ttft", ttft), ("e2e", e2e), ("tpot", tpot[multi])):
            assert s[f"{key}_mean"] == pytest.approx(vals.mean(), rel=1e-7), key
            assert s[f"{key}_p99"] == pytest.approx(np.percentile(vals, 99), rel=1e-7), key
        # the CSV's own columns agree with each other: TTFT = first token - arrival, E2E = finish + completion
        first, finish, arrival = _col(rows, "first_token_s"), _col(rows, "finish_s"), _col(rows, "arrival_s")
        out = _col(rows, "output_len")
        np.testing.assert_allclose(ttft, first - arrival, rtol=0, atol=1e-8)       # 9 significant digits
        np.testing.assert_allclose((tpot * (out - 1))[multi], (finish - first)[multi], rtol=0, atol=1e-8)
        np.testing.assert_allclose(e2e - (finish - arrival), completion, rtol=0, atol=1e-8)
        # the table: TTFT mean, TPOT mean, tok/s in ms / tok/s as printed
        cells = lines[head + 1 + k].split()
        assert cells[0] == str(run["C"])
        assert cells[1] == f"{s['ttft_mean'] * 1e3:.2f}" and cells[3] == f"{s['tpot_mean'] * 1e3:.2f}"
        assert cells[9] == f"{s['output_tps']:.1f}"


def test_serve_command_is_the_library(served):
    _text, doc, _ = served
    dep = jp.load_deployment(SCEN)
    lib = jp.simulate_sweep(dep, jp.Workload(192, 16), list(LOADS))
    for run, res in zip(doc["runs"], lib):
        for key in ("ttft_mean", "tpot_p99", "e2e_mean", "itl_mean", "output_tps", "duration"):
            assert run["summary"][key] == res.summary[key], key


def test_serve_itl_percentiles_are_those_of_the_pooled_gaps():
    """ITL is the pooled gaps between a request's tokens: under SGLang's prefill-only steps a
    decode's gap spans the steps it sits out. The percentiles were the emitting steps' times:
    p99 below the mean (ITL mean, from every request's finish - first token, is the gaps' mean)."""
    from jaxprice._src.serve import _itl_gaps
    res = jp.simulate(jp.load_deployment(SCEN), jp.Workload(192, 16), jp.ClosedLoop(4), engine={"scheduler": "sglang"})
    s = res.summary
    later, earlier, w = _itl_gaps(res.schedule)
    ends = np.concatenate([[0.0], res.steps["end"]])
    gaps = np.repeat(ends[later + 1] - ends[earlier + 1], w.astype(int))
    assert w.sum() == (res.requests["emits"] - 1).sum()         # one gap per token after a request's first
    assert gaps.mean() == pytest.approx(s["itl_mean"], rel=1e-12)
    for q in (50, 90, 99):
        name = "median" if q == 50 else f"p{q}"
        assert s[f"itl_{name}"] == pytest.approx(np.percentile(gaps, q, method="inverted_cdf"), rel=1e-12)
    assert s["itl_p99"] > s["itl_mean"]


# ----------------------------------------------------------------------------- price, sweep, library

def test_price_json_table_sweep_and_library_agree(tmp_path):
    doc = json.loads(_cli("price", SCEN, "--decode", "1,8", "--prefill", "256", "--context", "1024", "--json"))
    text = _cli("price", SCEN, "--decode", "1,8", "--prefill", "256", "--context", "1024")
    grid = tmp_path / "grid.csv"
    _cli("sweep", SCEN, "--decode", "1,8", "--context", "1024", "--prefill-chunk", "256", "--out", grid, "--quiet")
    rows = {int(r["decode"]): r for r in _rows(grid)}
    dep = jp.load_deployment(SCEN)
    table = {ln.split()[0]: ln.split() for ln in text.splitlines() if ln.split()[:1] in (["1"], ["8"])}
    for step in doc["steps"]:
        d = step["decode"]
        batch = jp.Batch.from_requests([1] * d + [256], [1023] * d + [0], pad_to=16, decode_threshold=8)
        lib = jp.price(dep.plan, dep.coefficients, batch).as_dict()
        for key in ("sm", "hbm", "nvlink", "host", "overlap", "no_overlap", "bottleneck"):
            assert step[key] == lib[key], key
        # the sweep's row at the same point (its CSV in ms, 12 significant digits)
        assert float(rows[d]["no_overlap_ms"]) == pytest.approx(step["no_overlap"] * 1e3, rel=1e-11)
        assert float(rows[d]["overlap_ms"]) == pytest.approx(step["overlap"] * 1e3, rel=1e-11)
        assert rows[d]["bottleneck"] == step["bottleneck"] and int(rows[d]["tokens"]) == step["tokens"]
        # the table in ms
        assert table[str(d)][9] == f"{step['no_overlap'] * 1e3:.3f}" and table[str(d)][-1] == step["bottleneck"]


# ----------------------------------------------------------------------------- size

@pytest.fixture(scope="module")
def sized():
    """One MoE layout with two data-parallel ranks (expert parallel), searched by the steady state
    and simulated (auto): 2 clients (one per rank) and 8."""
    return jp.size("qwen3-30b-a3b", chip="h200", gpus=2, isl=192, osl=16, tp=[1], dp=[2], ep=[True], weights=["fp8"],
                   max_num_seqs=(64,), max_num_batched_tokens=(2048,), cudagraph_modes=("FULL_AND_PIECEWISE",),
                   concurrency=(2, 8), evaluator="auto", tpot_ms=50)


def test_size_steady_ttft_holds_the_admission_latency_the_simulation_charges(sized):
    """At one client per rank nothing queues: the steady state's TTFT (kept in ``replaced``) and
    the simulation's agree to a few percent (they were 11 and 53 ms: the steady one lacked the
    40 ms admission latency)."""
    r = sized.results[0]
    assert r.source == "serve" and r.replaced["source"] == "steady"
    assert r.replaced["ttft"][0] == pytest.approx(r.ttft[0], rel=0.10)


def test_size_resident_per_rank_is_per_rank_under_both_evaluators(sized):
    """The JSON's resident_per_rank: the steady state's R per rank, and for a simulated point the
    busiest rank's peak (it was the peak summed over the ranks: twice the steady one at dp 2)."""
    from jaxprice._src import size as S
    r = sized.results[0]
    dep = sized.candidates[r.index].deployment
    steady = S.evaluate_steady(dep, r.layout, sized.workload, r.concurrency)
    assert r.source == "serve" and list(r.resident) == list(steady[4]) == [1, 4]
    assert [p["resident_per_rank"] for p in r.as_dict()["points"]] == [1, 4]


def test_size_written_scenario_serves_as_size_printed(sized, tmp_path):
    """--write-scenario then `serve` at the chosen point: size's numbers; its vllm serve line's
    flags are the written engine and parallel settings."""
    path = tmp_path / "best.yaml"
    path.write_text(sized.scenario_yaml())
    b = sized.point(sized.best)
    doc = json.loads(_cli("serve", path, "--isl", "192", "--osl", "16", "--concurrency",
                          str(b["concurrency_per_engine"]), "--json"))
    s = doc["runs"][0]["summary"]
    assert s["ttft_mean"] * 1e3 == pytest.approx(b["ttft_ms"], rel=1e-12)
    assert s["tpot_mean"] * 1e3 == pytest.approx(b["tpot_ms"], rel=1e-12)
    assert s["output_tps_per_gpu"] == pytest.approx(b["tokens_per_s_per_gpu"], rel=1e-12)
    pool = list(yaml.safe_load_all(path.read_text()))[1]["pools"][0]
    engine, parallel = pool["engine"], pool["parallel"]
    words = shlex.split(sized.vllm_command().split("    #")[0])
    flag = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
    for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"):
        assert int(flag["--" + key.replace("_", "-")]) == engine[key], key
    assert float(flag["--gpu-memory-utilization"]) == engine["gpu_memory_utilization"]
    assert flag["--kv-cache-dtype"] == engine["cache_dtype"]
    assert json.loads(flag["--compilation-config"])["cudagraph_mode"] == engine["cudagraph_mode"]
    assert (int(flag["--tensor-parallel-size"]), int(flag["--data-parallel-size"])) == (parallel["tp"], parallel["dp"])
    assert parallel["enable_expert_parallel"] is True and "--enable-expert-parallel" in words
