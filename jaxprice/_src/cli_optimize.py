"""`jaxprice optimize SCENARIO`: the batch composition that maximises output tokens per second.

    jaxprice optimize llama-3.1-70b-instruct-h200-fp8-vllm-tp4 --itl-ms 50 --prefill-budget 2048
    jaxprice optimize SCENARIO --itl-ms 50 --prompt-len 1024 --output-len 256 --grid
    jaxprice optimize SCENARIO --itl-ms 30 --min-prefill 256 --json

Searches the number of decodes D and the prefill chunk P of one step (and so the smallest
max_num_batched_tokens, D*w + P) by gradient through the smooth kernel, then rounds and checks
in exact mode (jaxprice._src.search has the problem's definition). ``--grid`` also prices every
composition in exact mode and prints the grid's best and how much faster the search was.
"""

from __future__ import annotations

import json
import re
import sys
import time

from .cli_price import (UNITS, add_scenario_argument, default_context, describe_deployment, load_scenario_deployment,
                        parse_float, parse_int, parse_temperature)
from .errors import JaxpriceError
from .plan import INT_TOKEN_LIMIT, RESOURCES
from .progress import Progress
from .search import MAX_ITERATIONS, MAX_RESTARTS     # the search's effort caps, the library's own


FLAGS = {"itl": "--itl-ms", "prefill_budget": "--prefill-budget", "min_prefill": "--min-prefill",
         "context": "--context", "prefix": "--prefix", "max_decode": "--max-decode",
         "max_batched_tokens": "--max-batched-tokens", "prefill_per_output": "--prompt-len/--output-len",
         "tokens_per_decode": "--tokens-per-decode", "estimate": "--estimate", "temperature": "--temperature",
         "restarts": "--restarts", "iterations": "--iterations"}


def add_parser(subparsers):
    p = subparsers.add_parser(
        "optimize", help="the batch composition that maximises output tokens/s under a step-time (ITL) limit",
        description="Find the number of decodes and the prefill chunk per step (and so the smallest "
                    "max_num_batched_tokens) that maximise output tokens per second with the step time at most "
                    "--itl-ms, by gradient through the smooth kernel, rounded and checked in exact mode. Output "
                    "tokens per step are the decodes' (times --tokens-per-decode); with --prompt-len and "
                    "--output-len, at most what the prefill chunk can feed in a steady state "
                    "(P * output_len / prompt_len).")
    add_scenario_argument(p)
    p.add_argument("--itl-ms", metavar="MS", required=True, help="the step-time (inter-token latency) limit, in ms")
    p.add_argument("--prefill-budget", metavar="N", default="2048",
                   help="the most prefill tokens one step may carry (one chunk; default 2048)")
    p.add_argument("--min-prefill", metavar="N", default="0",
                   help="the fewest prefill tokens every step must carry (default 0: a step may carry none)")
    p.add_argument("--context", metavar="N", default=None,
                   help="each decode's context after the step, in tokens (default: with --prompt-len and "
                        "--output-len, prompt + output / 2, the mean; else 4096, or the deployment's max_model_len "
                        "where smaller)")
    p.add_argument("--prefix", metavar="N", default="0",
                   help="tokens of the prefilling request computed before its chunk (default 0)")
    p.add_argument("--max-decode", metavar="N", default=None,
                   help="the most decodes per step (default max_num_seqs - 1: one slot is the prefilling request)")
    p.add_argument("--max-batched-tokens", metavar="N", default=None,
                   help="a cap on max_num_batched_tokens (decode tokens + prefill tokens; default none)")
    p.add_argument("--prompt-len", metavar="N", default=None,
                   help="the workload's prompt length (with --output-len): output is capped at what prefill feeds")
    p.add_argument("--output-len", metavar="N", default=None, help="the workload's output length (with --prompt-len)")
    p.add_argument("--tokens-per-decode", metavar="A", default="1",
                   help="output tokens a decode emits per step (the mean accepted length with speculation; default 1)")
    p.add_argument("--estimate", default="no_overlap", choices=("no_overlap", "overlap"),
                   help="the step time to limit and optimise (default no_overlap, the kernel's one-number estimate)")
    p.add_argument("--temperature", metavar="T", default="0.02",
                   help="the smooth kernel's temperature for the search (default 0.02; the answer is exact mode)")
    p.add_argument("--restarts", metavar="N", default="16",
                   help="restarts of the gradient search, shared by the prefill branches (default 16)")
    p.add_argument("--iterations", metavar="N", default="200", help="gradient steps per restart (default 200)")
    p.add_argument("--grid", action="store_true",
                   help="also price every composition in exact mode; print the grid's best and the speed ratio")
    p.add_argument("--units", default="ms", metavar="ms|us", help="units of printed times (default ms)")
    p.add_argument("--json", action="store_true", help="print JSON (times in seconds) instead of text")
    p.set_defaults(command="optimize")
    return p


def _options(args) -> tuple[dict, dict]:
    """(the problem's limits, the search's options) from the arguments, refused naming the flag."""
    if args.units not in UNITS:
        raise JaxpriceError("unknown time unit; expected ms or us", field="--units", value=args.units)
    if args.json and args.units != "ms":       # else ignored silently
        raise JaxpriceError("JSON times are always in seconds; --units sets the text's", field="--units",
                            value=args.units)
    itl_ms = parse_float(args.itl_ms, flag="--itl-ms", positive=True)
    limits = {"itl": itl_ms / 1e3,
              "prefill_budget": parse_int(args.prefill_budget, flag="--prefill-budget", minimum=0),
              "min_prefill": parse_int(args.min_prefill, flag="--min-prefill", minimum=0),
              "context": None if args.context is None else parse_int(args.context, flag="--context", minimum=1),
              "prefix": parse_int(args.prefix, flag="--prefix", minimum=0),
              "max_decode": None if args.max_decode is None else
              parse_int(args.max_decode, flag="--max-decode", minimum=1),
              "max_batched_tokens": None if args.max_batched_tokens is None else
              parse_int(args.max_batched_tokens, flag="--max-batched-tokens", minimum=1),
              "tokens_per_decode": parse_float(args.tokens_per_decode, flag="--tokens-per-decode", positive=True),
              "estimate": args.estimate}
    from .schema import SPEC_TOKEN_LIMIT
    if limits["tokens_per_decode"] > SPEC_TOKEN_LIMIT + 1:     # a 1e300 made the optimum 1e300 tokens/s
        raise JaxpriceError(f"must be at most {SPEC_TOKEN_LIMIT + 1}: a decode emits at most its speculative tokens "
                            f"+ 1 per step, and speculation is capped at {SPEC_TOKEN_LIMIT} tokens",
                            field="--tokens-per-decode", value=limits["tokens_per_decode"])
    if (args.prompt_len is None) != (args.output_len is None):
        flag = "--output-len" if args.output_len is None else "--prompt-len"
        raise JaxpriceError("--prompt-len and --output-len go together", field=flag, value=None)
    if args.prompt_len is not None:
        prompt = parse_int(args.prompt_len, flag="--prompt-len", minimum=1)
        output = parse_int(args.output_len, flag="--output-len", minimum=1)
        limits["prefill_per_output"] = prompt / output
    search = {"temperature": parse_temperature(args.temperature, positive=True),
              "restarts": parse_int(args.restarts, flag="--restarts", minimum=1),
              "iterations": parse_int(args.iterations, flag="--iterations", minimum=1)}
    for key, cap in (("restarts", MAX_RESTARTS), ("iterations", MAX_ITERATIONS)):
        if search[key] > cap:
            raise JaxpriceError(f"must be at most {cap} (jaxprice's cap on the search's effort)",
                                field=FLAGS[key], value=search[key])
    return limits, search


def _check_request_length(dep, prompt, output):
    """The workload's request (prompt + output tokens) must fit the deployment's max_model_len, else
    the engine could not serve it (and a 10**11-token prompt made the optimum 0 tokens/s)."""
    from .cli_price import engine_limits
    model_len = engine_limits(dep).get("max_model_len")
    if model_len is not None and prompt + output > model_len:
        flag = "--prompt-len" if prompt >= output else "--output-len"
        raise JaxpriceError(f"a request of {prompt} prompt + {output} output tokens exceeds the deployment's "
                            f"max_model_len {model_len}", field=flag, value=prompt if prompt >= output else output)
    if prompt + output >= INT_TOKEN_LIMIT:
        raise JaxpriceError(f"a request of {prompt} + {output} tokens is past the kernel's token limit "
                            f"{INT_TOKEN_LIMIT}", field="--prompt-len", value=prompt)


# the keywords a library refusal's text names (e.g. "exceeds prefill_budget 2048"): only those spelt with an
# underscore, which no English word is ("context", "prefix" are words of the reasons too)
_KEYWORD_IN_TEXT = re.compile(r"(?<![\w.-])(prefix \+ )?(" + "|".join(k for k in FLAGS if "_" in k) + r")(?!\w)")


def _as_flags(err: JaxpriceError) -> JaxpriceError:
    """The library's refusal, naming the command-line flags instead of the keywords, in its field and
    in its text ("prefix + prefill_budget (...)": "--prefix + --prefill-budget (...)")."""
    reason = _KEYWORD_IN_TEXT.sub(lambda m: ("--prefix + " if m[1] else "") + FLAGS[m[2]], err.reason)
    if err.field in FLAGS or reason != err.reason:
        field = FLAGS.get(err.field, err.field)
        return JaxpriceError(reason, file=err.file, field=field, value=err.value,
                             has_value=err.value is not None)
    return err


def _composition_text(c, lim, k, units) -> str:
    dec = 3 if units == "ms" else 1
    chunk = f" + a {c.prefill}-token prefill chunk" if c.prefill else ", no prefill"
    return f"{c.decode} decodes{chunk}: {c.tokens_per_s:.1f} output tokens/s " \
           f"({c.output_tokens_per_step:g} per step of {c.step_time * k:.{dec}f} {units})"


def _table(rows, k, units) -> str:
    dec = 3 if units == "ms" else 1
    cols = ["step", "decode", "prefill", "tokens", *RESOURCES, "Overlap", "NoOverlap", "tokens/s", "bottleneck"]
    body = []
    for label, c in rows:
        body.append([label, str(c.decode), str(c.prefill), str(c.max_num_batched_tokens)] +
                    [f"{c.resources[r] * k:.{dec}f}" for r in RESOURCES] +
                    [f"{c.overlap * k:.{dec}f}", f"{c.no_overlap * k:.{dec}f}", f"{c.tokens_per_s:.1f}", c.bottleneck])
    widths = [max(len(col), *(len(r[j]) for r in body)) for j, col in enumerate(cols)]

    def line(cells):
        return "  ".join([cells[0].ljust(widths[0])] + [x.rjust(w) for x, w in zip(cells[1:-1], widths[1:-1])] +
                         [cells[-1]])
    return "\n".join([line(cols)] + [line(r) for r in body])


def run(args) -> int:
    limits, search = _options(args)
    dep = load_scenario_deployment(args.scenario, args.pool, args)
    if args.prompt_len is not None:
        prompt = parse_int(args.prompt_len, flag="--prompt-len")
        output = parse_int(args.output_len, flag="--output-len")
        _check_request_length(dep, prompt, output)
        # the workload's decodes hold prompt + 0..output tokens: priced at 4096 for 1024 + 256-token requests
        # they were steps this workload never runs; the mean, as the accuracy harness's anchor rule takes it
        if limits["context"] is None:
            limits["context"] = prompt + output // 2
        elif limits["context"] > prompt + output:
            raise JaxpriceError(f"is past this workload's requests of {prompt} prompt + {output} output tokens: no "
                                f"decode of it holds more than {prompt + output} (default: {prompt + output // 2}, "
                                "the mean)", field="--context", value=limits["context"])
    if limits["context"] is None:
        limits["context"] = default_context(dep)
    res, grid, warm = _search(args, dep, limits, search)
    if args.json:
        print(json.dumps(_json_report(dep, res, grid, warm), indent=1))
        return 0
    print(_text_report(args, dep, res, grid, warm))
    return 0


def _search(args, dep, limits, search) -> tuple:
    """(the search's result, the grid's or None, (the search's warm seconds, the grid's) or None): the
    gradient search with a progress bar (not under --json, unless on a terminal), and under --grid the
    grid too; a refusal from the library names the command-line flag."""
    from .search import make_limits, optimize_batch
    try:
        lim = make_limits(dep, **limits)     # tokens_per_decode past the decode width refused there
        if limits["prefix"] and not lim.prefill_on_allowed:     # else ignored silently: no chunk, no prefix
            raise JaxpriceError(f"is the context of the prefilling request, but --prefill-budget "
                                f"{lim.prefill_budget} admits no prefill chunk (the smallest is {lim.prefill_lo} "
                                "tokens): it changes nothing", field="--prefix", value=limits["prefix"])
        bar = Progress(2, "optimize", enabled=not args.json or sys.stderr.isatty())
        with bar:
            res = optimize_batch(dep, **limits, **search, callback=lambda d, t, **i: bar.update(d, t))
        if not args.grid:
            return res, None, None
        return (res, *_grid_and_warm_times(dep, limits, search))
    except JaxpriceError as err:
        raise _as_flags(err) from None


def _grid_and_warm_times(dep, limits, search) -> tuple:
    """--grid: (the grid's result, (the search's warm seconds, the grid's)): the search run again warm,
    then the grid with a progress bar, then the grid again warm."""
    from .search import grid_search, optimize_batch
    t0 = time.perf_counter()
    optimize_batch(dep, **limits, **search)
    warm_search = time.perf_counter() - t0
    with Progress(1, "grid") as gbar:
        grid = grid_search(dep, **limits, callback=lambda d, t, **i: gbar.update(d, t))
    t0 = time.perf_counter()
    grid_search(dep, **limits)
    return grid, (warm_search, time.perf_counter() - t0)


def _json_report(dep, res, grid, warm) -> dict:
    """--json: the limits, the optimum and the search (times in seconds); under --grid, the grid's
    best, the gap to it and the speed ratios."""
    doc = {"scenario": dep.scenario.name, "deployment": describe_deployment(dep), "units": "s",
           "limits": res.limits.as_dict(), "optimum": res.best.as_dict(),
           "search": {k: v for k, v in res.as_dict().items() if k not in ("best", "limits")}}
    if grid is not None:
        warm_search, warm_grid = warm
        doc["grid"] = {k: v for k, v in grid.as_dict().items() if k != "limits"}
        doc["grid"]["warm_s"] = warm_grid
        doc["search"]["warm_s"] = warm_search
        doc["gap"] = 1.0 - res.best.tokens_per_s / grid.best.tokens_per_s
        doc["speedup_warm"] = warm_grid / warm_search
        doc["speedup_cold"] = grid.wall_s / res.wall_s
    return doc


def _text_report(args, dep, res, grid, warm) -> str:
    """The deployment, the problem, the optimum and what to set, the table (with the grid's best under
    --grid), and how the search (and the grid) went."""
    k, lim, best = UNITS[args.units], res.limits, res.best
    dec = 3 if args.units == "ms" else 1
    rows = [("optimum", best)] + ([("grid best", grid.best)] if grid is not None else [])
    lines = [f"{dep.scenario.name}: {describe_deployment(dep)}", _problem_text(lim, k, args.units), "",
             f"optimum: {_composition_text(best, lim, k, args.units)}",
             f"  set max_num_batched_tokens >= {best.max_num_batched_tokens}; ITL slack "
             f"{best.itl_slack * k:.{dec}f} {args.units}; prefill budget left {best.prefill_slack:g} tokens", "",
             _table(rows, k, args.units), "",
             f"search: {res.restarts} restarts x {res.iterations} gradient steps (smooth kernel, temperature "
             f"{res.temperature:g}), continuous end point D {res.continuous[0]:.2f}, P {res.continuous[1]:.1f}; "
             f"{res.exact_evaluations} exact checks; {res.wall_s:.2f} s"]
    if grid is not None:
        lines += _grid_text(res, grid, warm, k, args.units)
    return "\n".join(lines)


def _problem_text(lim, k, units) -> str:
    """The problem solved: the limit, the decodes, the prefill chunk and how output per step is counted."""
    est = "NoOverlap" if lim.estimate == "no_overlap" else "Overlap"
    chunks = f"0 or {lim.prefill_lo}..{lim.prefill_budget}" if lim.prefill_off_allowed else \
        f"{lim.prefill_lo}..{lim.prefill_budget}"
    if not lim.prefill_on_allowed:      # read "0 or 2..0 tokens": the budget admits no chunk
        return (f"problem: maximise output tokens/s with {est} <= {lim.itl * k:g} {units}; 0..{lim.max_decode} "
                f"decodes ({lim.decode_width} token{'s' if lim.decode_width > 1 else ''} each, context "
                f"{lim.context}); no prefill chunk (--prefill-budget {lim.prefill_budget} is below the smallest, "
                f"{lim.prefill_lo} tokens); output per step {lim.tokens_per_decode:g} per decode"
                + (f"; max_num_batched_tokens <= {lim.max_batched_tokens}" if lim.max_batched_tokens else ""))
    feed = f"at most P * {1 / lim.prefill_per_output:.4g} (prompt/output {lim.prefill_per_output:.4g})" \
        if lim.prefill_per_output > 0 else "not charged for prefill"
    return (f"problem: maximise output tokens/s with {est} <= {lim.itl * k:g} {units}; 0..{lim.max_decode} decodes "
            f"({lim.decode_width} token{'s' if lim.decode_width > 1 else ''} each, context {lim.context}); one prefill "
            f"chunk of {chunks} tokens after {lim.prefix} computed; output per step {lim.tokens_per_decode:g} "
            f"per decode, {feed}" + (f"; max_num_batched_tokens <= {lim.max_batched_tokens}"
                                     if lim.max_batched_tokens else ""))


def _grid_text(res, grid, warm, k, units) -> list:
    """--grid: the grid's best, the search's gap to it, and both runs' times cold and warm."""
    warm_search, warm_grid = warm
    gap = 1.0 - res.best.tokens_per_s / grid.best.tokens_per_s
    return [f"grid: {grid.points} compositions in exact mode ({grid.feasible_points} within the limits): "
            f"{_composition_text(grid.best, res.limits, k, units)}; {grid.wall_s:.2f} s",
            f"gap to the grid's best {gap * 100:.3f}%; the search took {res.wall_s:.2f} s cold, {warm_search:.3f} s "
            f"warm, the grid {grid.wall_s:.2f} s cold, {warm_grid:.3f} s warm: {warm_grid / warm_search:.1f}x faster "
            f"warm, {grid.wall_s / res.wall_s:.2f}x cold (cold includes compiling)"]
