"""Does the memory model hold the KV cache vLLM reports at start-up?

    python experiments/kv_capacity_vs_vllm.py

vLLM logs the KV-cache size it allocated ("GPU KV cache size: N tokens") once the weights,
activations and graphs are placed; InferenceX kept that line for 53 of its vLLM runs
(testdata/measured/inferencex_engine_logs.csv, its README gives the provenance). For each run
(scenario, workload, date and the flags it passed), this builds the deployment as the accuracy
harness does (``accuracy.build_deployment``: the bundled scenario or the CSV's columns), gives
the point the flags the run passed (``Point.stated``: gmu, budget, max_model_len, block size), takes the rest from ``accuracy.engine_assumptions`` (the recipe's KV-cache dtype,
or the version of the recipe the flags identify: ``recipe_variant``), re-resolves it
(``accuracy.recipe_deployment(full=True)``) and compares ``plan.memory['kv_capacity_tokens']``
(tokens at the full KV bytes per token, per rank) with vLLM's logged tokens (the median over the
run's concurrencies; vLLM logs a hybrid model's cache in the same full-rate tokens: its blocks
over its layer groups). Nothing here is fitted: it checks the reference's memory law and the
harness's engine assumptions against a quantity the latency data never show. Writes
experiments/results/kv_capacity_vs_vllm.md.
"""

from __future__ import annotations

import csv
import os
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jaxprice._src import accuracy as A          # noqa: E402

LOGS = os.path.join(ROOT, "testdata", "measured", "inferencex_engine_logs.csv")
OUT = os.path.join(ROOT, "experiments", "results", "kv_capacity_vs_vllm.md")
LENGTHS = {"1k1k": (1024, 1024), "8k1k": (8192, 1024), "1k8k": (1024, 8192)}
NAME = re.compile(r"(.+)-(h100|h200|b200|b300)-(fp4|fp8|int4)-vllm-tp(\d+)(?:-ep(\d+))?(?:-dp(\d+))?\.yaml$")
# the flags that size the cache (max_num_seqs, = C in some recipes, moves none of the memory terms)
FLAGS = ("gpu_memory_utilization", "max_num_batched_tokens", "max_model_len", "block_size")


def runs():
    """The logged runs: {(scenario, label, date, engine version, flags): [rows]} in file order."""
    out: dict = {}
    with open(LOGS, newline="") as fh:
        for r in csv.DictReader(fh):
            flags = tuple((k, r[k]) for k in FLAGS + ("max_num_seqs",) if r[k])
            key = tuple(kv for kv in flags if kv[0] != "max_num_seqs")
            out.setdefault((r["scenario"], r["label"], r["source_run_date"], r["engine_version"], key), []).append(r)
    return out


def point(scenario, label, flags, concurrency):
    """The run as a measured point whose run states ``flags``."""
    model, hw, dtype, tp, ep, dp = NAME.match(scenario).groups()
    isl, osl = LENGTHS[label]
    stated = tuple(sorted((k, float(v) if k == "gpu_memory_utilization" else int(v)) for k, v in flags))
    return A.Point(row=0, scenario=scenario, deployment=scenario[:-5], model=model, hardware=hw, dtype=dtype,
                   engine="vllm", tp=int(tp), ep=int(ep or 1), dp=int(dp or 1), workload=label, isl=isl, osl=osl,
                   concurrency=int(concurrency), measured=1.0, anchor_concurrency=None, stated=stated)


def capacity(p, cache_dtype=None):
    """KV tokens per rank the harness's deployment of ``p`` holds (the other cache dtype: ``cache_dtype``)."""
    dep, _ = A.build_deployment(p)
    a = A.engine_assumptions(p)
    if cache_dtype is not None:
        a["cache_dtype"] = (cache_dtype, "forced")
    return float(A.recipe_deployment(dep, a, full=True).plan.memory["kv_capacity_tokens"]), a


def main():
    t0 = time.perf_counter()
    rows, ratios = [], []
    for (scenario, label, date, version, flags), rs in runs().items():
        seqs = (("max_num_seqs", rs[0]["max_num_seqs"]),) if rs[0]["max_num_seqs"] else ()
        p = point(scenario, label, flags + seqs, rs[0]["concurrency"])   # its flags identify a recipe version
        ours, a = capacity(p)
        dtype = a["cache_dtype"][0]
        other, _ = capacity(p, "fp8" if dtype == "auto" else "auto")
        logged = statistics.median(int(r["resolved_gpu_kv_tokens"]) for r in rs)
        ratio = ours / logged
        ratios.append(ratio)
        rec, _ = A.recipe_for(p)
        variant = "variant" if A.recipe_variant(rec, A.stated_settings(p)) is not rec else ""
        rows.append((scenario[:-5], label, date, version or "?", ", ".join(f"{k}={v}" for k, v in flags), dtype,
                     variant, ours, logged, ratio, other / logged))
    dev = [abs(r - 1) for r in ratios]
    within = lambda x: sum(d <= x for d in dev)            # noqa: E731
    lines = ["# The memory model against the KV cache vLLM logged", "",
             f"Written by `experiments/kv_capacity_vs_vllm.py` from `testdata/measured/inferencex_engine_logs.csv` "
             f"({len(rows)} runs: scenario, workload, date and flags; {time.perf_counter() - t0:.0f} s). Method: the "
             "script's docstring. `ours`: `plan.memory['kv_capacity_tokens']` of the harness's deployment under the "
             "run's flags and the KV-cache dtype the harness assumes (`kv`: 'auto' = bf16; `variant`: the recipe "
             "version the run's flags identify); `vLLM`: the median over the run's concurrencies of the logged GPU "
             "KV-cache tokens; `other kv`: ours / vLLM with the other cache dtype. Nothing is fitted.", "",
             f"**Summary.** |ours / vLLM - 1|: median {100 * statistics.median(dev):.1f}%, within 5% for "
             f"{within(0.05)} of {len(dev)} runs, within 10% for {within(0.10)}, within 25% for {within(0.25)}.", "",
             "| deployment | workload | date | vLLM | flags | kv | | ours | vLLM logged | ours / vLLM | other kv / vLLM |",
             "|---|---|---|---|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]} | {r[7]:,.0f} | {r[8]:,.0f} | "
                     f"**{r[9]:.3f}** | {r[10]:.3f} |")
    with open(OUT, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"wrote {OUT}: median |ours / vLLM - 1| {100 * statistics.median(dev):.1f}% over {len(dev)} runs")


if __name__ == "__main__":
    main()
