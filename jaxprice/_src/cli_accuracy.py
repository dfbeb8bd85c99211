"""`jaxprice accuracy CSV`: predicted mean TPOT against measured serving latencies.

    jaxprice accuracy ../shared/measured/inferencex_vllm_dev.csv --out experiments/out --plot sweeps.png
    jaxprice accuracy data.csv --coefficients fitted.yaml          # with a fitted coefficient set
    jaxprice accuracy data.csv --deployment kimi-k2.5-h200-int4-vllm-tp8 --json
    jaxprice accuracy data.csv --batch-rule interleaved            # resident batch + interleaved prefills
    jaxprice accuracy data.csv --batch-rule anchor                 # C decode rows: a quick static check
    jaxprice accuracy data.csv --settings flags.csv                # the engine flags each of your runs passed
    jaxprice accuracy mtp.csv --acceptance 2.2                     # speculative decoding: assume 2.2 tokens/step

Prints the summary table (TPOT shape error and TPOT error, and TTFT error and shape error where
the rule predicts TTFT, per model and overall, NoOverlap and Overlap, with point counts), the
errors by concurrency bucket (C <= 16, <= 64, <= 256, > 256) and over the deployments
``jaxprice fit`` would hold out, the refused points with their reasons, and notes (``--json``:
the same as one JSON document, with the measurements' own run-to-run spread beside each metric,
``measurement_spread``: ``accuracy.repeat_spread``). ``--out
DIR`` writes ``DIR/accuracy_points.csv`` (one row per point: measured and predicted TPOT and
TTFT, errors, and the engine settings assumed) and ``DIR/accuracy.md`` (the tables in Markdown,
with the engine settings of every simulated deployment and their sources); ``--plot FILE`` the
sweeps (one panel per deployment). ``--batch-rule`` picks how a point is priced: ``simulate``
(default: the serving simulation of the benchmark's closed loop with the engine flags each run
states, from ``--settings FILE.csv`` or the bundled table of InferenceX's runs, the published
recipe's or vLLM's defaults for the rest: TPOT and TTFT; the most accurate rule on the development set, and the
slowest: about a minute on the dev set, not seconds), or one of three static rules (one step price per point,
TPOT only, seconds): ``anchor`` (the anchor kernel's rule: C decode rows), ``capped`` (the
engine's resident batch), ``interleaved`` (the resident batch and the prefill chunks that
keep it full); the
formulas are in ``jaxprice/_src/accuracy.py``. A point measured with speculative decoding (its
``spec_decode`` column, e.g. ``mtp``) is simulated with 1 + k tokens per decode row and the
drafter's passes, k its InferenceX recipe's draft count (else the model graph's own MTP layers;
a ``num_speculative_tokens`` column in ``--settings`` overrides it), and an ASSUMED acceptance
(mean tokens per decode row and step: ``--acceptance A``, else an ``acceptance`` column in
``--settings``, else the serving layer's serve.default_acceptance(k)), never a measured one; a method the model
graph has no drafter for is refused with its reason. Exit status 0 when the CSV was read and scored
(refused points are listed, not an error), 2 on bad input (a malformed CSV: file, line, column
and value named).
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import sys
import time
from pathlib import Path

from . import compile_cache
from .errors import refuse
from .outputs import check_image, check_output_file, check_output_folder

DEFAULT_RULE = "simulate"      # the most accurate rule on the development set (README, Accuracy)

POINTS_CSV = "accuracy_points.csv"
REPORT_MD = "accuracy.md"


def add_parser(subparsers):
    p = subparsers.add_parser(
        "accuracy", help="predicted mean TPOT and TTFT against a CSV of measured serving latencies",
        description="Score the predictions against measured mean TPOT and mean TTFT (the column layout of "
                    "shared/measured/inferencex_vllm_dev.csv): by default each point's closed-loop benchmark "
                    "run is simulated (vLLM's scheduler step by step, every step priced by the kernel, the "
                    "engine flags the run states or its recipe's); --batch-rule anchor|capped|interleaved "
                    "prices one static step per point instead (TPOT only). Shape error and MAPE per model, "
                    "chip, workload and concurrency bucket, for NoOverlap and Overlap.")
    p.add_argument("csv", metavar="CSV", help="measurement file (layout of inferencex_vllm_dev.csv)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help=f"write {POINTS_CSV} (one row per point) and {REPORT_MD} (the table) here")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw measured and predicted TPOT against concurrency, one panel per deployment (and, "
                        "where TTFT is predicted, TTFT in FILE-ttft.png)")
    p.add_argument("--markdown", metavar="FILE.md", default=None,
                   help=f"write the table in Markdown here (as {REPORT_MD} under --out)")
    p.add_argument("--coefficients", metavar="SET.yaml", nargs="+", action="extend", default=[],
                   help="coefficient sets applied after each deployment's own, overriding by name "
                        "(e.g. one written by 'jaxprice fit')")
    p.add_argument("--scenarios", metavar="DIR", nargs="+", action="extend", default=None,
                   help="folders searched for <deployment>.yaml before building a deployment from the "
                        "columns (default: the bundled testdata/aisimulate)")
    p.add_argument("--deployment", metavar="NAME", nargs="+", action="extend", default=None,
                   help="score only these deployments")
    p.add_argument("--batch-rule", metavar="RULE", default=DEFAULT_RULE,
                   help="how each point is priced: simulate (default: the serving simulation of the closed loop "
                        "with the recipe's engine settings; predicts TTFT too; the most accurate, about a minute on the "
                        "dev set), anchor (C decode rows, the anchor kernel's rule; seconds), capped (min(C, "
                        "max_num_seqs x dp, KV-cache capacity / ctx) decode rows) or interleaved (the capped batch "
                        "plus the steady-state prefill chunks)")
    p.add_argument("--settings", metavar="FILE.csv", default=None,
                   help="the engine flags each measured run passed, per scenario, workload and concurrency (the "
                        "layout of testdata/measured/inferencex_settings.csv; default: that bundled table of "
                        "InferenceX's runs; optional cache_dtype and cudagraph_mode columns too, as jaxprice import-bench "
                        "writes); a flag left empty falls back to the recipe's or vLLM's default")
    p.add_argument("--acceptance", metavar="A", default=None,
                   help="speculative decoding: the mean tokens emitted per decode row and step assumed for every "
                        "point measured with it, at least 1, capped at 1 + k for a point drafting k (at most 1 + the "
                        "largest k) (default: its --settings "
                        "row's acceptance, else 1.7, 2.19, 2.53 for k = 1, 2, 3; an assumption, not a measurement)")
    p.add_argument("--assumptions", action="store_true",
                   help="also print the engine settings each simulated deployment ran with, and their sources")
    p.add_argument("--estimate", choices=("no_overlap", "overlap"), default=None,
                   help="the estimate drawn solid in the plot (default no_overlap; both are scored)")
    p.add_argument("--cache-dir", metavar="DIR", default=None,
                   help="keep compiled kernels in this folder across runs (JAX's persistent compilation "
                        "cache; every command keeps them in $JAXPRICE_CACHE_DIR, by default "
                        "~/.cache/jaxprice/xla/HOST): a second run skips most of the compile time")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(command="accuracy")
    return p


def _strict(x):
    """``x`` with every NaN or infinite float as None (JSON null): a metric with no points has no
    value, and strict JSON readers (jq, JavaScript) refuse Python's NaN."""
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    if isinstance(x, float) or type(x).__module__ == "numpy" and hasattr(x, "dtype") and x.dtype.kind == "f":
        return float(x) if math.isfinite(float(x)) else None
    return x


def markdown(report, *, command="") -> str:
    """The accuracy tables in Markdown, with NoOverlap broken down by chip and by workload, and
    (rule ``simulate``) the engine settings of every simulated deployment with their sources."""
    from .accuracy import format_assumptions, format_report
    rule = report.info.get("batch_rule", "anchor")
    lines = ["# Accuracy: predicted against measured mean TPOT" + (" and mean TTFT" if rule == "simulate" else "")
             + ("" if rule == "anchor" else f" (batch rule `{rule}`)"), ""]
    if command:
        lines += [f"Generated by `{command}`. {_prediction_text(report, rule)} Shape error per "
                  "point: |(pred(C)/pred(C0)) / (meas(C)/meas(C0)) - 1|, C0 the sweep's lowest concurrency "
                  "(its own point counts as 0), for TPOT and TTFT alike; median = upper median "
                  "`sorted(err)[n // 2]`. MAPE = mean |pred/meas - 1|, signed = mean (pred/meas - 1).", ""]
        if report.info.get("seconds") is not None:
            lines += [f"Run time: {report.info['seconds']:.1f} s for {len(report.records)} points.", ""]
    lines.append(format_report(report, markdown=True))
    lines += _spread_lines(report, rule)
    lines += _breakdown_lines(report)
    lines += format_assumptions(report, markdown=True)
    return "\n".join(lines) + "\n"


def _prediction_text(report, rule) -> str:
    """How the report's predictions were made (its batch rule's), for the report's preamble."""
    from .accuracy import BATCH_RULE_TEXT, IN_SAMPLE_CHOICES
    hot = sorted({round(r["host_output_token_us"], 3) for r in report.records if r["status"] == "priced"})
    hot_text = ", ".join(f"{v:g}" for v in hot) + " us" if hot else "none priced"
    if rule == "anchor":
        return ("Prediction (the anchor kernel's rule): a batch of C decoding requests, each scheduling 1 "
                "token at context isl + osl // 2, decode threshold 8, priced with the bundled registry; "
                f"TPOT = step estimate + host_output_token ({hot_text}).")
    if rule == "simulate":
        in_sample = ("; ".join(f"{k}: {v}" for k, v in IN_SAMPLE_CHOICES.items()) if IN_SAMPLE_CHOICES else
                     "none of the engine settings was chosen by looking at these errors")
        return (f"Prediction ({BATCH_RULE_TEXT[rule]}; see `simulate_points` and `engine_assumptions` in "
                "`jaxprice/_src/accuracy.py`): every step of each run priced by the kernel with the bundled "
                "registry, plus the registry's host costs; mean TPOT and mean TTFT over the run's "
                "requests, as the benchmark client computes them. The engine settings are the published "
                "InferenceX recipes' (table and sources below), not fitted; in sample: "
                f"{in_sample}. The serving layer itself was written against the vLLM sources "
                "(shared/spec/serving-reference.md), not tuned to this set; the errors over the held-out "
                "deployments are shown separately.")
    return (f"Prediction ({BATCH_RULE_TEXT[rule]}; formulas and limits in the docstring of "
            "`jaxprice/_src/accuracy.py`): decode rows schedule 1 token at context isl + osl // 2, "
            "decode threshold 8, priced with the bundled registry; host_output_token "
            f"({hot_text}) is added once. {report.info.get('resident_below_concurrency', '?')} of "
            f"{len(report.records)} points have a resident batch below C. This rule is not the "
            "anchor kernel's: it was designed after looking at the registry's errors on "
            "inferencex_vllm_dev.csv (it has no fitted parameter), so on that set its figures are "
            "not an out-of-sample test.")


def _spread_lines(report, rule) -> list:
    """The measurements' own spread over their repeated points (``accuracy.repeat_spread``) beside
    NoOverlap's errors there; nothing when no point was measured twice."""
    from .accuracy import _pct, repeat_spread
    spread = repeat_spread(report.records)
    if not spread["tpot"]["repeated"]:
        return []
    quantities = ("tpot", "ttft") if rule == "simulate" else ("tpot",)
    return ["", "The measurements' own spread (`accuracy.repeat_spread`): of the points measured in more than "
            "one run (same deployment, workload and C), each against the mean of the other runs: "
            + "; ".join(f"{q.upper()} MAPE {_pct(spread[q]['mape'])} (median {_pct(spread[q]['median'])}) over "
                        f"{spread[q]['repeated']} of {spread[q]['points']} points" for q in quantities)
            + ". Predicting each run by the mean of the others scores that on those points: no model of the "
            "recipe alone can do much better there. Their shape error (each run's sweep predicted by the "
            "other runs' x(C)/x(C0), the harness's definition): "
            + "; ".join(f"{q.upper()} {_pct(spread[q]['shape_mean'])} (median {_pct(spread[q]['shape_median'])})"
                        f" over {spread[q]['shape_repeated']} points" for q in quantities)
            + ". NoOverlap on the same points: "
            + "; ".join(f"{q.upper()} MAPE {_pct(spread[q].get('model_mape', math.nan))}, shape "
                        f"{_pct(spread[q].get('model_shape_mean', math.nan))}" for q in quantities) + "."]


def _breakdown_lines(report) -> list:
    """NoOverlap's errors by chip and by workload, one Markdown table each."""
    from .accuracy import CHIP_ORDER, _pct
    lines = []
    for field, label in (("hardware", "chip"), ("workload", "workload")):
        by = report.summarize_by(field, "no_overlap")
        lines += ["", f"NoOverlap by {label}:", "",
                  f"| {label} | points | priced | shape mean | shape median | TPOT MAPE | TPOT signed | TTFT MAPE | "
                  "TTFT signed | TTFT shape mean |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        order = sorted(by, key=lambda k: (k == "all", CHIP_ORDER.index(k) if k in CHIP_ORDER else 9, k))
        for k in order:
            s = by[k]
            lines.append(f"| {k} | {s['points']} | {s['priced']} | {_pct(s['shape_mean'])} | "
                         f"{_pct(s['shape_median'])} | {_pct(s['tpot_mape'])} | "
                         f"{_pct(s['tpot_mean_signed'], signed=True)} | {_pct(s['ttft_mape'])} | "
                         f"{_pct(s['ttft_mean_signed'], signed=True)} | {_pct(s['ttft_shape_mean'])} |")
    return lines


def command_line(args) -> str:
    """The command that reproduces this run (recorded in the Markdown)."""
    parts = ["jaxprice accuracy", shlex.quote(str(args.csv))]
    parts += ["--batch-rule", shlex.quote(str(getattr(args, "batch_rule", DEFAULT_RULE)))]   # always: defaults move
    for flag, value in (("--out", args.out), ("--plot", args.plot), ("--markdown", args.markdown),
                        ("--settings", getattr(args, "settings", None)),
                        ("--acceptance", getattr(args, "acceptance", None))):
        if value:
            parts += [flag, shlex.quote(str(value))]
    for flag, values in (("--coefficients", args.coefficients), ("--scenarios", args.scenarios),
                         ("--deployment", args.deployment)):
        if values:
            parts += [flag] + [shlex.quote(str(v)) for v in values]
    return " ".join(parts)


def check_inputs(args) -> None:
    """Refuse, before anything is priced, a coefficient file that cannot be read, a scenario
    folder that is not one, and an output path that cannot be written."""
    from .accuracy import check_batch_rule, check_coefficient_files, check_scenario_dirs
    check_batch_rule(args.batch_rule, field="--batch-rule")
    _check_display_flags(args)
    check_coefficient_files(args.coefficients, field="--coefficients")
    check_scenario_dirs(args.scenarios, field="--scenarios")
    if args.out is not None:
        out = check_output_folder(args.out, flag="--out")
        for name in (POINTS_CSV, REPORT_MD):
            check_output_file(out / name, flag="--out", what=name)
    if args.markdown is not None:
        check_output_file(args.markdown, flag="--markdown", what="Markdown", writes="Markdown")
    if args.plot is not None:
        plot = check_image(args.plot, "--plot")
        if args.batch_rule == "simulate":      # TTFT is predicted too: FILE-ttft.png beside it
            check_output_file(plot.with_name(f"{plot.stem}-ttft{plot.suffix}"), flag="--plot", what="image")
    if args.cache_dir is not None:
        check_output_folder(args.cache_dir, flag="--cache-dir")
    _check_distinct_outputs(args)
    if getattr(args, "acceptance", None) is not None:
        from .cli_price import parse_float
        args.acceptance = parse_float(args.acceptance, flag="--acceptance", minimum=1)
        if args.batch_rule != "simulate":
            refuse("is the acceptance of speculative decoding, which only the serving simulation prices "
                   "(--batch-rule simulate)", field="--acceptance", value=args.acceptance)
    if getattr(args, "settings", None) is not None:
        from .accuracy import _stated_table, check_settings_path
        check_settings_path(args.settings, field="--settings")      # '' was 'cannot read', naming nothing
        if args.batch_rule != "simulate":
            refuse("the engine flags of each run are read by the serving simulation only (--batch-rule simulate)",
                   field="--settings", value=str(args.settings))
        _stated_table(str(args.settings))          # a malformed file refused before anything is priced


def _check_display_flags(args) -> None:
    """--estimate and --assumptions, refused where they would change nothing (they used to be
    ignored without a word): --estimate picks the plot's solid line (both are scored), and
    --assumptions prints the simulated runs' engine settings under the table."""
    if args.estimate is not None and args.plot is None:
        refuse("picks the estimate drawn solid in --plot (both are scored and printed); without --plot it "
               "changes nothing", field="--estimate", value=args.estimate)
    if args.assumptions:
        if args.batch_rule != "simulate":
            refuse(f"prints the engine settings of simulated runs; --batch-rule {args.batch_rule} simulates none",
                   field="--assumptions")
        if args.json:
            refuse("prints the engine settings under the table; --json holds them already (info.assumptions)",
                   field="--assumptions")


def settings_note(csv_path, settings, deployments=None, *, ttft_points=False) -> str | None:
    """A note when the --settings file states no flag for any measured point to be scored (its rows
    match none by scenario, label = workload, concurrency and run): it then only hides the bundled
    table, every run taking the recipe's or vLLM's defaults, which used to happen without a word."""
    from .accuracy import read_measurements, read_settings
    points, _ = read_measurements(csv_path, ttft_points=ttft_points)
    if deployments:
        points = [p for p in points if p.deployment in set(deployments)]
    if not points or any(p.stated for p in read_settings(points, settings)):
        return None
    return (f"--settings {settings} states no engine flag for any of the {len(points)} measured point(s) (no row "
            "matches one by scenario, label = workload, concurrency and run): every run takes the recipe's or "
            "vLLM's defaults, not the bundled table's")


PLAUSIBLE_TPOT_S = (1e-4, 2.0)    # mean TPOT of a serving engine: ~1 ms to a few hundred ms


def unit_note(csv_path, *, ttft_points=False) -> str | None:
    """A note when the file's median mean TPOT is outside PLAUSIBLE_TPOT_S: its unit column most
    likely names the wrong unit (microseconds written 'ms' read as a 7 s TPOT, scored 99.9% off
    without a word). ttft_points: as read_measurements (a TTFT-only file: no TPOT, no note)."""
    import numpy as np
    from .accuracy import read_measurements
    points, _ = read_measurements(csv_path, ttft_points=ttft_points)
    points = [p for p in points if not np.isnan(p.measured)]
    if not points:
        return None
    med = float(np.median([p.measured for p in points]))
    lo, hi = PLAUSIBLE_TPOT_S
    if lo <= med <= hi:
        return None
    return (f"the median mean TPOT of {csv_path} reads {med * 1e3:.4g} ms, outside the {lo * 1e3:g} ms to "
            f"{hi:g} s serving engines give: check its unit column")


def _check_distinct_outputs(args) -> None:
    """No two outputs of one run in the same file (one would overwrite the other), and none on an
    input. --markdown may name --out's own accuracy.md: the same tables."""
    inputs = [("CSV (the input)", args.csv), ("--settings (an input)", getattr(args, "settings", None))]
    inputs += [("--coefficients (an input)", c) for c in args.coefficients or ()]
    seen = {Path(v).expanduser().resolve(): flag for flag, v in inputs if v}
    files = []
    if args.out is not None:
        files += [("--out", Path(args.out) / POINTS_CSV), ("--out", Path(args.out) / REPORT_MD)]
    if args.plot is not None:
        plot = Path(args.plot)
        files.append(("--plot", plot))
        if args.batch_rule == "simulate":
            files.append(("--plot", plot.with_name(f"{plot.stem}-ttft{plot.suffix}")))
    if args.markdown is not None:
        files.append(("--markdown", Path(args.markdown)))
    for flag, path in files:
        key = path.expanduser().resolve()
        if key in seen and not (flag == "--markdown" and key.name == REPORT_MD and seen[key] == "--out"):
            refuse(f"names the same file as {seen[key]} ({key.name}): one would overwrite the other", field=flag,
                   value=str(path))
        seen.setdefault(key, flag)


@contextlib.contextmanager
def _as_flag(field, flag):
    """A refusal of the library argument ``field`` (no file named) re-raised naming the CLI's ``flag``."""
    from .errors import JaxpriceError
    try:
        yield
    except JaxpriceError as err:
        if err.field != field or err.file:
            raise
        raise JaxpriceError(err.reason, field=flag, value=err.value, has_value=True) from None


def run(args) -> int:
    from .accuracy import evaluate_accuracy, format_report, plot_sweeps, write_points_csv
    from .progress import Progress
    check_inputs(args)
    note = None if args.settings is None else settings_note(args.csv, args.settings, args.deployment)
    for text in (note, unit_note(args.csv)):
        if text:
            print(f"note: {text}", file=sys.stderr)
    if args.cache_dir:
        compile_cache.enable(args.cache_dir, field="--cache-dir")
    t0 = time.perf_counter()
    with Progress(0, "accuracy", enabled=not args.quiet) as bar, _as_flag("acceptance", "--acceptance"):
        report = evaluate_accuracy(args.csv, scenario_dirs=args.scenarios,
                                   extra_coefficient_files=args.coefficients,
                                   deployments=args.deployment, callback=bar.update,
                                   batch_rule=args.batch_rule, settings=args.settings,
                                   acceptance=getattr(args, "acceptance", None))
    report.info["seconds"] = time.perf_counter() - t0
    command = command_line(args)
    if args.json:
        from .accuracy import ESTIMATES, concurrency_bucket, repeat_spread
        by_bucket = {e: report.summarize_by(lambda r: concurrency_bucket(r["concurrency"]), e) for e in ESTIMATES}
        doc = {"csv": report.csv, "summary": report.summary, "by_concurrency": by_bucket,
               "split": {e: report.split_summary(e) for e in ESTIMATES}, "refused": report.refused,
               "measurement_spread": {e: repeat_spread(report.records, e) for e in ESTIMATES},
               "info": {k: v for k, v in report.info.items()}}
        print(json.dumps(_strict(doc), indent=1, default=str, allow_nan=False))
    else:
        print(format_report(report))
        if args.assumptions:
            from .accuracy import format_assumptions
            print("\n".join(format_assumptions(report)))
    written = []
    md = markdown(report, command=command)
    if args.out:
        out = Path(args.out)
        written.append(write_points_csv(report, out / POINTS_CSV))
        (out / REPORT_MD).write_text(md)
        written.append(out / REPORT_MD)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(md)
        written.append(Path(args.markdown))
    if args.plot:
        written.append(plot_sweeps(report, args.plot, estimate=args.estimate or "no_overlap"))
        if report.info.get("ttft_predicted"):
            plot = Path(args.plot)
            written.append(plot_sweeps(report, plot.with_name(f"{plot.stem}-ttft{plot.suffix}"),
                                       estimate=args.estimate or "no_overlap",
                                       quantity="ttft"))
    for w in written:
        print(f"wrote {w}", file=sys.stderr)
    print(f"accuracy: {len(report.records)} points in {report.info['seconds']:.1f} s", file=sys.stderr)
    return 0
