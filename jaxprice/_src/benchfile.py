"""vLLM benchmark results as measurement CSV rows (``jaxprice import-bench``).

Reads the JSON that ``vllm bench serve --save-result`` writes, one per run, with the keys of
vllm-project/vllm ``vllm/benchmarks/serve.py``@009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1
(``main_async``'s ``result_json``: ``num_prompts``, ``request_rate`` -- the string "inf" for a
closed loop --, ``max_concurrency`` -- null when unset --, ``ramp_up_strategy`` where set; merged
with ``benchmark``'s result: ``duration`` (s), ``completed``, ``failed``, ``total_input_tokens`` and
``total_output_tokens`` (over completed requests, ``calculate_metrics``), ``mean_ttft_ms``,
``mean_tpot_ms`` (ms; 0 where no request streamed, or none had more than one output token), and with
``--save-detailed`` ``input_lens`` (every request) and ``output_lens`` (0 for a failed one)). The
older ``benchmarks/benchmark_serving.py`` writes the same keys. SGLang's ``python -m
sglang.bench_serving --output-file F`` appends the same metric keys a run a line (JSON Lines; no
num_prompts, the completed count stands for it; ``read_bench_results``).

Each run becomes two rows of the measurement CSV layout ``accuracy.read_measurements`` reads
(``shared/measured/inferencex_vllm_dev.csv``): ``mean_tpot`` and ``mean_ttft`` in ms, at concurrency
= ``max_concurrency``, with isl / osl the mean input / output tokens per completed request, rounded
(from ``input_lens`` / ``output_lens`` over the requests with output where the file has them, else
``total_*_tokens / completed``), ``num_prompts`` the run's, and ``range_ratio`` the given one
(default 1: every request at the mean lengths). With R < 1, isl / osl are written as the upper
length L the harness reads them as (InferenceX's isl is the top of its range), chosen so that
lengths uniform on [floor(R L), L] keep the measured mean (``upper_length``). vLLM's own random dataset draws lengths on
[L (1 - r), L (1 + r)] in newer versions (on [r L, L] in older ones), while the harness's ``range_ratio``
R means [floor(R L), L] (``client.Workload``, InferenceX's): the MEAN carries over, the spread does
not (KNOWN DIVERGENCE [bench-range-ratio], registry/EXTENSIONS.md), so fixed lengths at the mean
are the default.

The SCENARIO (a bundled name or a scenario file) gives the deployment columns as the harness
resolves them back (``accuracy.build_deployment``: ``<deployment>.yaml`` in the bundled folder,
or in the folders ``--scenarios`` names): deployment = the file's stem, model and hardware as the
file states, dtype from its quantization (nvfp4/mxfp4 -> fp4, fp8 -> fp8, none -> bf16, int4 for
an int4 checkpoint), engine from its engine.scheduler (else a -sglang-/-trt- token in its name,
else vllm), and tp / ep / dp in InferenceX's convention (``accuracy.rank_tp``: tp = GPUs = rank tp
x dp, ep = GPUs with expert parallelism, else 1). Runs of one workload label at different
concurrencies form one sweep, anchored at its lowest C. Every bad input is refused in one line
naming the file, field and value.

The SCENARIO is taken as what the runs ran: its engine settings become a settings CSV
(``BenchImport.settings_rows``, the layout ``accuracy.read_settings`` reads for ``--settings``; one
row per run, keyed by the measurement rows' scenario, workload label and concurrency, with their
engine, chip and date as the run columns), stating its max_num_seqs, max_num_batched_tokens,
gpu_memory_utilization, block_size, max_model_len, cache_dtype and cudagraph_mode (NONE where it
sets enforce_eager), and enable_prefix_caching (false unless it says true). A setting the scenario
leaves unset takes the value the scenario's own deployment resolves to (vLLM's default, as `jaxprice
serve SCENARIO` runs it), not an InferenceX recipe's for its model and chip; only max_model_len, which
no default fixes for a run, is left empty (the harness's isl + osl + 256).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from datetime import datetime
from pathlib import Path

from .errors import refuse

VLLM_SOURCE = "vllm-project/vllm vllm/benchmarks/serve.py@009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1"
NUMBERS = ("num_prompts", "duration", "completed", "total_input_tokens", "total_output_tokens", "mean_ttft_ms",
           "mean_tpot_ms")
COLUMNS = ("scenario", "deployment", "model", "hardware", "dtype", "engine", "tp", "ep", "dp", "spec_decode",
           "workload", "isl", "osl", "concurrency", "quantity", "value", "unit", "anchor_concurrency",
           "num_prompts", "range_ratio", "source_run_date", "source")
QUANT_DTYPE = {"nvfp4": "fp4", "mxfp4": "fp4", "fp8": "fp8", "": "bf16", "bf16": "bf16"}
# the engine settings a scenario states, written as the settings CSV's stated columns (accuracy.STATED_FIELDS)
SETTINGS_ENGINE = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "block_size", "max_model_len",
                   "cache_dtype", "cudagraph_mode")
SETTINGS_COLUMNS = ("scenario", "label", "framework", "gpu", "source_run_date", "concurrency") + SETTINGS_ENGINE + (
    "enable_prefix_caching", "source")


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """One ``vllm bench serve`` result: its file, concurrency C (clients), prompts sent, completed
    requests, mean input / output tokens per completed request (rounded), mean TPOT and TTFT (ms),
    its date (YYYY-MM-DD, or '') and the requests that failed."""
    path: str
    concurrency: int
    num_prompts: int
    completed: int
    isl: int
    osl: int
    tpot_ms: float
    ttft_ms: float
    date: str = ""
    failed: int = 0          # prompts sent that did not complete (num_prompts - completed)

    def failure_note(self) -> str:
        """'' for a run whose every request completed, else what its failures mean for the scoring."""
        if not self.failed:
            return ""
        return (f"{self.path}: {self.failed} of {self.num_prompts} requests failed: its means are over the "
                f"{self.completed} that completed, while the simulation completes all {self.num_prompts}")


@dataclasses.dataclass
class BenchImport:
    """The CSV rows of a set of runs (``rows``, ``COLUMNS`` keys), the scenario file they resolve
    to (``scenario``), its deployment name, and the folder ``jaxprice accuracy --scenarios`` needs
    (``scenario_dir``; None for a bundled scenario, found without it), and the settings CSV rows
    stating the scenario's engine for each run (``settings_rows``, ``SETTINGS_COLUMNS`` keys)."""
    rows: list
    runs: list
    scenario: str
    deployment: str
    scenario_dir: str | None
    settings_rows: list = dataclasses.field(default_factory=list)

    def write(self, path) -> None:
        """Write the rows as a measurement CSV (parent folders created)."""
        _write_csv(path, COLUMNS, self.rows)

    def write_settings(self, path) -> None:
        """Write the settings rows (the scenario's engine per run) as a settings CSV for ``--settings``."""
        _write_csv(path, SETTINGS_COLUMNS, self.settings_rows)

    def accuracy_command(self, csv_path, settings_path=None) -> str:
        """The ``jaxprice accuracy`` command that scores the written CSV against this scenario (with
        ``--settings`` where the settings CSV was written to ``settings_path``)."""
        extra = f" --scenarios {self.scenario_dir}" if self.scenario_dir is not None else ""
        stated = f" --settings {settings_path}" if settings_path is not None else ""
        return f"jaxprice accuracy {csv_path}{extra} --batch-rule simulate{stated}"

    def fit_command(self, csv_path, settings_path=None) -> str:
        """The ``jaxprice fit`` command (through the simulation) on the written CSV; add --free patterns."""
        extra = f" --scenario-dir {self.scenario_dir}" if self.scenario_dir is not None else ""
        stated = f" --settings {settings_path}" if settings_path is not None else ""
        return f"jaxprice fit {csv_path}{extra} --batch-rule simulate --target tpot,ttft{stated}"


def _write_csv(path, columns, rows) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


# ----------------------------------------------------------------------------- one result file


def _records(path) -> list:
    """[(result object, where)] of a result file: vLLM's one JSON object (where = the file), or
    SGLang's JSON Lines, one object a run appended per line (where = file:line); refused:
    unreadable, neither, or a line that is not an object."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        refuse(f"cannot read the benchmark result ({type(err).__name__})", file=str(path))
    try:
        return [(_object(json.loads(text), str(path)), str(path))]
    except json.JSONDecodeError as err:
        whole = err
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    out = []
    for i, line in lines:
        where = f"{path}:{i}"
        try:
            out.append((_object(json.loads(line), where), where))
        except json.JSONDecodeError as err:
            if not out:         # its first line is not JSON either: a broken document, not JSON Lines
                refuse(f"not JSON ({_json_problem(whole)}); expected a `vllm bench serve "
                       "--save-result` file or SGLang's bench_serving --output-file (JSON Lines)", file=str(path))
            refuse(f"not JSON ({err.msg}); a JSON Lines result file holds one JSON object a line", file=where)
    if not lines:                           # an empty file
        refuse(f"not JSON ({_json_problem(whole)}); expected a `vllm bench serve --save-result` file or "
               "SGLang's bench_serving --output-file (JSON Lines)", file=str(path))
    return out


def _json_problem(err: json.JSONDecodeError) -> str:
    """'Unterminated string starting at line 1 column 201' (json's own message ends 'starting at',
    which read 'starting at at line 1')."""
    msg = err.msg[:-len(" at")] if err.msg.endswith(" at") else err.msg
    return f"{msg} at line {err.lineno} column {err.colno}"


def _object(doc, where: str) -> dict:
    if not isinstance(doc, dict):
        refuse("not a benchmark result: the JSON is not an object", file=where, field="(top level)",
               value=type(doc).__name__)
    return doc


def _number(doc, key, path, *, integer=False) -> float:
    """A finite number field (an integer where ``integer``); refused: missing, null, text, NaN, inf."""
    if key not in doc:
        refuse(f"missing field (`vllm bench serve --save-result` writes it; {VLLM_SOURCE})", file=str(path),
               field=key)
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        refuse("expected a finite number", file=str(path), field=key, value=v, has_value=True)
    if integer and v != int(v):
        refuse("expected an integer", file=str(path), field=key, value=v)
    return int(v) if integer else float(v)


def _check_closed_loop(doc, path) -> int:
    """The run's concurrency C: a closed loop of C clients (request_rate 'inf', max_concurrency C,
    no ramp-up); an open loop is refused, the harness simulates closed loops only."""
    if "request_rate" not in doc:
        refuse(f"missing field (`vllm bench serve --save-result` writes it; {VLLM_SOURCE})", file=str(path),
               field="request_rate")
    rate = doc["request_rate"]
    if not (rate == "inf" or (isinstance(rate, float) and math.isinf(rate) and rate > 0)):
        refuse("an open-loop run (requests arrive at this rate, Poisson or gamma): jaxprice's accuracy harness "
               "simulates closed loops of C clients; rerun with --request-rate inf --max-concurrency C",
               file=str(path), field="request_rate", value=rate, has_value=True)
    if doc.get("ramp_up_strategy") is not None:
        refuse("a ramp-up run (the request rate rises during the run): not a closed loop of C clients",
               file=str(path), field="ramp_up_strategy", value=doc["ramp_up_strategy"])
    if doc.get("max_concurrency") is None:
        refuse("no max_concurrency: every prompt was sent at once, so the run has no client concurrency C; "
               "rerun with --max-concurrency C", file=str(path), field="max_concurrency", value=None,
               has_value=True)
    c = _number(doc, "max_concurrency", path, integer=True)
    if c < 1:
        refuse("must be at least 1", file=str(path), field="max_concurrency", value=c)
    return c


def _mean_lengths(doc, path, completed) -> tuple[int, int]:
    """(isl, osl): mean input / output tokens per completed request, rounded: from input_lens /
    output_lens (--save-detailed) over the requests with output, else from the totals."""
    ins, outs = doc.get("input_lens"), doc.get("output_lens")
    if isinstance(ins, list) and isinstance(outs, list) and (ins or outs):
        # vLLM writes one entry per request in each (a -1000 among them was averaged into the isl)
        for key, xs in (("input_lens", ins), ("output_lens", outs)):
            for j, x in enumerate(xs):
                if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 \
                        or x != int(x):
                    refuse("expected a token count (a whole number >= 0) per request", file=str(path),
                           field=f"{key}[{j}]", value=x, has_value=True)
        if len(ins) != len(outs):
            refuse(f"has {len(ins)} entries and output_lens {len(outs)}: vLLM writes one of each per request",
                   file=str(path), field="input_lens", value=len(ins))
        done = [(i, o) for i, o in zip(ins, outs) if o > 0]
        if done:
            return (round(sum(i for i, _ in done) / len(done)), round(sum(o for _, o in done) / len(done)))
    return (round(_number(doc, "total_input_tokens", path) / completed),
            round(_number(doc, "total_output_tokens", path) / completed))


def _run_date(doc) -> str:
    """The run's date (vLLM's ``date``, %Y%m%d-%H%M%S) as YYYY-MM-DD, or ''."""
    try:
        return datetime.strptime(str(doc.get("date", "")), "%Y%m%d-%H%M%S").strftime("%Y-%m-%d")
    except ValueError:
        return ""


def read_bench_results(path) -> list:
    """The BenchRuns of one result file: a ``vllm bench serve --save-result`` JSON (one run) or
    SGLang's ``python -m sglang.bench_serving --output-file`` JSON Lines (a run a line), each
    refused in one line where it is not a closed-loop run the harness can score."""
    return [_bench_run(doc, where) for doc, where in _records(path)]


def read_bench_result(path) -> BenchRun:
    """One ``vllm bench serve --save-result`` JSON as a BenchRun (module docstring); a file of
    several runs (JSON Lines) is refused: ``read_bench_results`` reads it."""
    runs = read_bench_results(path)
    if len(runs) != 1:
        refuse(f"holds {len(runs)} runs (JSON Lines): read_bench_results reads them all", file=str(path))
    return runs[0]


def _bench_run(doc: dict, path: str) -> BenchRun:
    """One result object (``where`` its file or file:line) as a BenchRun. SGLang's bench_serving
    records no num_prompts (sgl-project/sglang python/sglang/bench_serving.py, ``benchmark``'s
    ``result``: request_rate, max_concurrency, duration, completed, total_input_tokens,
    total_output_tokens, mean_ttft_ms, mean_tpot_ms, ...; its request rate inf is written as
    JSON's Infinity): there the completed count stands for it."""
    if "num_prompts" not in doc and "completed" in doc:
        doc = {**doc, "num_prompts": doc["completed"]}
    for key in NUMBERS:
        _number(doc, key, path, integer=key in ("num_prompts", "completed"))
    c = _check_closed_loop(doc, path)
    completed, n = int(doc["completed"]), int(doc["num_prompts"])
    if completed < 1:
        refuse("no request completed: nothing was measured", file=str(path), field="completed", value=completed)
    if completed > n:       # else read as a run with no failures, its means over requests never sent
        refuse(f"more requests completed than num_prompts {n} were sent", file=str(path), field="completed",
               value=completed)
    if n < c:
        refuse(f"fewer prompts than max_concurrency {c}: only {n} requests were ever in flight", file=str(path),
               field="num_prompts", value=n)
    for key, why in (("mean_tpot_ms", "0: no request had more than one output token"),
                     ("mean_ttft_ms", "0: the endpoint did not stream"), ("duration", "")):
        if doc[key] <= 0:
            refuse(f"must be positive ({why or 'a run takes time'})", file=str(path), field=key, value=doc[key])
    isl, osl = _mean_lengths(doc, path, completed)
    if isl < 1 or osl < 2:
        refuse(f"mean lengths isl {isl}, osl {osl}: a TPOT needs a prompt and at least 2 output tokens",
               file=str(path), field="total_output_tokens" if isl >= 1 else "total_input_tokens",
               value=doc.get("total_output_tokens" if isl >= 1 else "total_input_tokens"))
    return BenchRun(path=str(path), concurrency=c, num_prompts=n, completed=completed, isl=isl, osl=osl,
                    tpot_ms=float(doc["mean_tpot_ms"]), ttft_ms=float(doc["mean_ttft_ms"]), date=_run_date(doc),
                    failed=max(n - completed, 0))


# ----------------------------------------------------------------------------- the scenario's columns


def _engine_of(sc, path: Path) -> str:
    """The engine column: the file's engine.scheduler, else a -sglang-/-trt- token in its name, else vllm."""
    sched = str((sc.engine or {}).get("scheduler") or "")
    if sched:
        return sched
    tokens = set(path.stem.lower().split("-"))
    return next((e for e in ("sglang", "trt", "trtllm") if e in tokens), "vllm")


def _dtype_of(dep) -> str:
    """The dtype column of a resolved deployment: its quantization's name in the harness
    (``accuracy.DTYPE_SCENARIO_QUANTIZATIONS``), int4 for an int4 checkpoint left as it is."""
    quant = str((dep.scenario.engine or {}).get("quantization") or "")
    if not quant and str(dep.graph.weight_dtype) == "int4":
        return "int4"
    if quant not in QUANT_DTYPE:
        refuse(f"quantization {quant} has no dtype column the accuracy harness reads (known: "
               f"{', '.join(q or 'none' for q in QUANT_DTYPE)})", file=dep.scenario.path, field="engine.quantization",
               value=quant)
    return QUANT_DTYPE[quant]


def scenario_columns(scenario) -> tuple[dict, Path, str | None]:
    """(columns, scenario file, folder for ``--scenarios`` or None where bundled) of a bundled
    scenario name or a scenario file: the deployment columns a measurement row needs to resolve
    back to that file (``accuracy.build_deployment`` and its column checks)."""
    cols, path, folder, _ = _scenario_of(scenario)
    return cols, path, folder


def _scenario_of(scenario):
    """``scenario_columns``, and the resolved deployment."""
    from .resolve import load_deployment, scenario_path, testdata_root
    path = scenario_path(scenario)
    if path.suffix != ".yaml":
        refuse("the accuracy harness finds a scenario as <deployment>.yaml: name the file with the .yaml suffix",
               file=str(path), field="SCENARIO", value=str(scenario))
    dep = load_deployment(path)
    sc, par = dep.scenario, dep.scenario.parallel or {}
    tp, dp, ep_on = int(par.get("tp", 1) or 1), int(par.get("dp", 1) or 1), bool(par.get("enable_expert_parallel"))
    if ep_on and tp * dp == 1:
        refuse("expert parallelism over one GPU: the CSV's ep column cannot state it (ep 1 reads as off); set "
               "enable_expert_parallel false", file=str(path), field="enable_expert_parallel", value=True)
    spec = (sc.engine or {}).get("speculative") or {}
    cols = {"deployment": path.stem, "scenario": f"{path.stem}.yaml", "model": sc.model, "hardware": sc.hardware,
            "dtype": _dtype_of(dep), "engine": _engine_of(sc, path), "tp": tp * dp, "ep": tp * dp if ep_on else 1,
            "dp": dp, "spec_decode": str(spec.get("method") or "none") if isinstance(spec, dict) else "none"}
    bundled = path.resolve().parent == (testdata_root() / "aisimulate").resolve()
    return cols, path, None if bundled else str(path.parent), dep


def scenario_engine(scenario, dep=None) -> dict:
    """{column: text} of the settings CSV's stated columns (``SETTINGS_ENGINE`` and
    enable_prefix_caching) from a scenario's engine section, as the run ran it, cudagraph_mode
    NONE where it sets enforce_eager, enable_prefix_caching false unless it says true. A setting the
    scenario leaves unset takes the value its own deployment ``dep`` resolves to (vLLM's default, as
    ``jaxprice serve SCENARIO`` runs it: ``resolved_engine``), not an InferenceX recipe's for the
    model and chip; max_model_len, which no default fixes for a run, stays '' (the harness's
    isl + osl + 256). Without ``dep`` unset settings stay ''."""
    eng = {**(resolved_engine(dep) if dep is not None else {}), **{k: v for k, v in dict(scenario.engine or {}).items()
                                                                     if v is not None and str(v).strip() != ""}}
    out = {}
    for k in SETTINGS_ENGINE:
        v = eng.get(k)
        out[k] = ("" if v is None or str(v).strip() == "" else repr(float(v)) if k == "gpu_memory_utilization" else
                  str(int(v)) if k not in ("cache_dtype", "cudagraph_mode") else
                  str(v).strip().upper() if k == "cudagraph_mode" else str(v).strip())
    if eng.get("enforce_eager"):
        out["cudagraph_mode"] = "NONE"           # resolve._host_modes: enforce_eager runs without graphs
    out["enable_prefix_caching"] = "true" if eng.get("enable_prefix_caching") else "false"
    return out


def resolved_engine(dep) -> dict:
    """The engine settings a deployment resolves to where its scenario is silent (vLLM's defaults
    as jaxprice applies them): max_num_seqs, cache_dtype and cudagraph_mode from the resolution,
    max_num_batched_tokens and block_size from the serving layer's engine settings,
    gpu_memory_utilization the memory model's default."""
    from .resolve import DEFAULT_GPU_MEMORY_UTILIZATION
    from .serve import engine_settings
    res = dep.resolution
    eng, _ = engine_settings(dep, max_len=1)
    return {"max_num_seqs": res["max_num_seqs"], "cache_dtype": res["cache_dtype"],
            "cudagraph_mode": res["cudagraph_mode"], "max_num_batched_tokens": eng["max_num_batched_tokens"],
            "block_size": eng["block_size"], "gpu_memory_utilization": DEFAULT_GPU_MEMORY_UTILIZATION}


# ----------------------------------------------------------------------------- the rows


def _check_ratio(range_ratio) -> float:
    if isinstance(range_ratio, bool) or not isinstance(range_ratio, (int, float)) or not 0 <= range_ratio <= 1:
        refuse("expected a number in [0, 1] (lengths uniform on [floor(R L), L]; 1: fixed lengths)",
               field="range_ratio", value=range_ratio, has_value=True)
    return float(range_ratio)


# runs whose mean input and output lengths are within this of a workload's first run are one
# workload: a run without --ignore-eos ends some requests early, so the same workload's runs at
# different C differ by a token or so in mean output, and each apart would anchor its own sweep
SAME_WORKLOAD = 0.10


def _check_label(label) -> str:
    if not isinstance(label, str) or not label.strip() or "," in label:
        refuse("expected a non-empty workload label without commas", field="label", value=label, has_value=True)
    return label.strip()


def _workloads(runs: list, label) -> list:
    """Per run, (workload label, isl, osl) of the sweep it joins: with ``label`` every run in one;
    else runs whose mean lengths are within ``SAME_WORKLOAD`` (and a token, the means being rounded)
    of a workload's first run (in length order) join it. A workload's lengths are its runs' means weighted by completed requests (the
    harness simulates one workload a sweep), its default label ``isl<I>-osl<O>``."""
    if label is not None:
        groups = [list(range(len(runs)))]
    else:
        groups = []
        for i in sorted(range(len(runs)), key=lambda i: (runs[i].isl, runs[i].osl)):
            first = runs[groups[-1][0]] if groups else None
            near = first is not None and all(abs(getattr(runs[i], k) - getattr(first, k)) <= SAME_WORKLOAD
                                             * getattr(first, k) + 1 for k in ("isl", "osl"))   # + 1: rounding
            if near:
                groups[-1].append(i)
            else:
                groups.append([i])
    out = [None] * len(runs)
    for g in groups:
        n = sum(runs[i].completed for i in g)
        isl = round(sum(runs[i].isl * runs[i].completed for i in g) / n)
        osl = round(sum(runs[i].osl * runs[i].completed for i in g) / n)
        name = _check_label(label) if label is not None else f"isl{isl}-osl{osl}"
        for i in g:
            out[i] = (name, isl, osl)
    return out


def upper_length(mean: int, ratio: float) -> int:
    """The length L (tokens) whose lengths uniform on [floor(R L), L] (``client.Workload``) have
    the mean nearest ``mean``: ``mean`` itself at R = 1, about 2 mean / (1 + R) below."""
    if ratio >= 1:
        return int(mean)
    guess = round(2 * mean / (1 + ratio))
    cands = [n for n in range(max(guess - 2, 1), guess + 3)]
    return min(cands, key=lambda n: (abs((max(int(n * ratio), 1) + n) / 2 - mean), n))


def _run_rows(run: BenchRun, cols: dict, workload: tuple, anchor: int, ratio: float) -> list:
    """The run's mean_tpot and mean_ttft rows, at its workload's (label, mean isl, mean osl)."""
    workload, isl, osl = workload[0], upper_length(workload[1], ratio), upper_length(workload[2], ratio)
    base = {**cols, "workload": workload, "isl": isl, "osl": osl, "concurrency": run.concurrency,
            "unit": "ms", "anchor_concurrency": anchor, "num_prompts": run.num_prompts, "range_ratio": repr(ratio),
            "source_run_date": run.date, "source": f"vllm bench serve --save-result {Path(run.path).name}"}
    return [{**base, "quantity": "mean_tpot", "value": repr(run.tpot_ms)},
            {**base, "quantity": "mean_ttft", "value": repr(run.ttft_ms)}]


def import_bench(results, scenario, *, range_ratio: float = 1.0, label: str | None = None) -> BenchImport:
    """Measurement CSV rows (``BenchImport``) of ``vllm bench serve --save-result`` JSON files
    (``results``: a path or a list of paths), against ``scenario`` (a bundled name or a scenario
    file). ``range_ratio``: the lengths the simulation draws, uniform on [floor(R L), L] with L
    chosen to keep each run's mean (``upper_length``; default 1: fixed at the mean; vLLM's newer
    random dataset draws on [L(1-r), L(1+r)], so only the mean carries over). ``label``: the workload label of every run
    (one sweep); by default runs whose mean lengths are within 10% of each other are one workload
    (``_workloads``), labelled ``isl<I>-osl<O>`` by their mean lengths, which its rows state. Runs of
    one label form a sweep anchored at its lowest C; two at one C are refused."""
    paths = [results] if isinstance(results, (str, Path)) else list(results)
    if not paths:
        refuse("no benchmark result files given", field="results", value=[], has_value=True)
    ratio = _check_ratio(range_ratio)
    cols, path, folder, dep = _scenario_of(scenario)
    engine = scenario_engine(dep.scenario, dep)
    runs = [run for p in paths for run in read_bench_results(p)]
    works = _workloads(runs, label)
    labels = [w[0] for w in works]
    seen: dict = {}
    for r, w in zip(runs, labels):
        if (w, r.concurrency) in seen:
            refuse(f"a second run of workload {w} at concurrency {r.concurrency} (first: {seen[w, r.concurrency]}); "
                   "give one run per concurrency, or separate them with --label", file=r.path,
                   field="max_concurrency", value=r.concurrency)
        seen[w, r.concurrency] = r.path
    anchors = {w: min(r.concurrency for r, x in zip(runs, labels) if x == w) for w in labels}
    order = sorted(range(len(runs)), key=lambda i: (labels[i], runs[i].concurrency))
    rows = [row for i in order for row in _run_rows(runs[i], cols, works[i], anchors[labels[i]], ratio)]
    stated = [{"scenario": cols["scenario"], "label": labels[i], "framework": cols["engine"], "gpu": cols["hardware"],
               "source_run_date": runs[i].date, "concurrency": runs[i].concurrency, **engine,
               "source": f"the engine of {path.name}, taken as what the run ran"} for i in order]
    return BenchImport(rows=rows, runs=[runs[i] for i in order], scenario=str(path), deployment=cols["deployment"],
                       scenario_dir=folder, settings_rows=stated)
