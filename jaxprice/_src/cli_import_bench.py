"""`jaxprice import-bench RESULT.json ... --scenario SCENARIO --out measured.csv`: vLLM benchmark
results as a measurement CSV that `jaxprice accuracy` and `jaxprice fit` read.

    vllm bench serve ... --request-rate inf --max-concurrency 8 --save-result --result-filename c8.json
    jaxprice import-bench c8.json c16.json c32.json --scenario my-deployment.yaml --out measured.csv
    jaxprice accuracy measured.csv --scenarios . --batch-rule simulate --settings measured-settings.csv

SGLang's `python -m sglang.bench_serving ... --output-file runs.jsonl` (a run appended a line) is read
too. Each RESULT.json (one closed-loop run: --request-rate inf and --max-concurrency C) gives a mean_tpot
and a mean_ttft row at concurrency C, with the run's mean input / output tokens per completed request
and its num_prompts; the runs of one workload (mean lengths within 10% of each other, or all under
--label) form a sweep anchored at the lowest C, at their mean lengths. SCENARIO (a
bundled name or a scenario .yaml) gives the deployment columns. --range-ratio R: the simulated
lengths are uniform on [floor(R L), L], L chosen so that their mean is the run's (default 1: fixed at
the mean; vLLM's newer random dataset samples [L(1-r), L(1+r)], so only the mean carries over).

The scenario is taken as what the runs ran: its engine settings (max_num_seqs, max_num_batched_tokens,
gpu_memory_utilization, block_size, max_model_len, cache_dtype, cudagraph_mode, enable_prefix_caching)
are written beside the CSV as a settings CSV (--settings-out, default <out stem>-settings.csv), one row
per run, which the printed accuracy and fit commands pass as --settings; a setting the scenario leaves
unset is written at the value the scenario resolves to (vLLM's default, as `jaxprice serve SCENARIO`
runs it), not an InferenceX recipe's; only max_model_len, where the scenario does not state it, is
left empty (the harness's isl + osl + 256).
"""

from __future__ import annotations

import math
from pathlib import Path


def add_parser(sub):
    p = sub.add_parser("import-bench", help="write vLLM benchmark results (vllm bench serve --save-result) as a "
                                            "measurement CSV for accuracy and fit, and the scenario's engine, "
                                            "taken as what the runs ran, as their --settings CSV",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("results", metavar="RESULT.json", nargs="+",
                   help="vllm bench serve --save-result files, one closed-loop run each (--request-rate inf, "
                        "--max-concurrency C), or SGLang's python -m sglang.bench_serving --output-file JSON Lines "
                        "(a run a line)")
    p.add_argument("--scenario", metavar="SCENARIO", required=True,
                   help="the deployment measured: a bundled scenario name or a scenario .yaml file, taken as what "
                        "the runs ran (its engine settings are written to --settings-out)")
    p.add_argument("--out", metavar="measured.csv", required=True, help="the measurement CSV to write")
    p.add_argument("--settings-out", metavar="FILE.csv", default=None,
                   help="the settings CSV to write: the scenario's engine settings, taken as what each run ran, "
                        "for accuracy/fit --settings (default: <out stem>-settings.csv beside --out); a setting "
                        "the scenario leaves unset is written at the value it resolves to (vLLM's default), "
                        "max_model_len left empty (the harness's isl + osl + 256)")
    p.add_argument("--range-ratio", metavar="R", default="1.0",
                   help="simulated lengths uniform on [floor(R L), L], L keeping each run's mean (default 1: "
                        "fixed at the mean; vLLM's newer random dataset samples [L(1-r), L(1+r)]: only the mean "
                        "carries "
                        "over)")
    p.add_argument("--label", metavar="NAME", default=None,
                   help="the workload label of every run, one sweep (default: runs whose mean lengths are within "
                        "10%% of each other are one workload, isl<I>-osl<O> by their mean lengths)")
    return p


def _ratio(text) -> float:
    from .errors import refuse
    try:
        r = float(text)
    except ValueError:
        refuse("expected a number in [0, 1]", field="--range-ratio", value=text)
    if not (math.isfinite(r) and 0 <= r <= 1):
        refuse("expected a number in [0, 1] (lengths uniform on [floor(R L), L]; 1: fixed lengths)",
               field="--range-ratio", value=text)
    return r


def run(args) -> int:
    from .benchfile import SETTINGS_ENGINE, import_bench
    from .outputs import check_output_file
    from .errors import refuse
    check_output_file(args.out, flag="--out", what="measurement CSV", writes="CSV")
    out = Path(args.out).expanduser().resolve()
    if any(Path(r).expanduser().resolve() == out for r in args.results):
        refuse("is one of the result files being imported; name another file for the CSV", field="--out",
               value=args.out)
    settings = settings_path(args.out, args.settings_out)
    check_output_file(settings, flag="--settings-out", what="settings CSV", writes="CSV")
    for other, flag in ((out, "--out"), *((Path(r).expanduser().resolve(), "RESULT.json") for r in args.results)):
        if Path(settings).expanduser().resolve() == other:
            refuse(f"is the same file as {flag}; name another file for the settings CSV", field="--settings-out",
                   value=str(settings))
    res = import_bench(args.results, args.scenario, range_ratio=_ratio(args.range_ratio), label=args.label)
    res.write(args.out)
    res.write_settings(settings)
    sweeps = sorted({r["workload"] for r in res.rows})
    concs = ", ".join(str(r.concurrency) for r in res.runs)
    print(f"wrote {len(res.rows)} rows ({len(res.runs)} runs at C = {concs}; workload {', '.join(sweeps)}) of "
          f"deployment {res.deployment} ({res.scenario}) to {args.out}")
    for run in res.runs:
        if run.failure_note():
            print(f"note: {run.failure_note()}")
    stated = [k for k in SETTINGS_ENGINE if res.settings_rows[0][k] != ""]
    unset = [k for k in SETTINGS_ENGINE if k not in stated]
    print(f"wrote {len(res.settings_rows)} settings rows to {settings}: the engine of {Path(res.scenario).name}, "
          f"taken as what the runs ran ({', '.join(stated) or 'nothing stated'}"
          + (f"; left to the harness: {', '.join(unset)})" if unset else ")"))
    print(f"score it: {res.accuracy_command(args.out, settings)}")
    print(f"fit to it: {res.fit_command(args.out, settings)} --free PATTERN ...")
    return 0


def settings_path(out, given) -> str:
    """The settings CSV's path: ``given``, else <out stem>-settings.csv beside ``out``."""
    if given is not None:
        return str(given)
    p = Path(out)
    return str(p.with_name(f"{p.stem}-settings.csv"))
