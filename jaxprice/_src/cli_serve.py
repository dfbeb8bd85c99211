"""`jaxprice serve SCENARIO`: simulate the benchmark client against vLLM v1's scheduler.

    jaxprice serve deepseek-v3-h200-fp8-sglang-tp8 --isl 1024 --osl 1024 --concurrency 1,2,4,...,256
    jaxprice serve SCENARIO --isl 1024 --osl 1024 --rate 2,4,8 --num-prompts 500
    jaxprice serve SCENARIO --trace requests.csv            # arrival_s,input_len,output_len
    jaxprice serve SCENARIO --concurrency 64 --max-num-seqs 64 --csv requests.csv --timeline run.png
    jaxprice serve SCENARIO --concurrency 1,2,4,...,256 --goodput ttft:2000 tpot:50   # SLO goodput (ms)

A closed-loop sweep (``--concurrency``) runs every level's schedule in vmapped scheduler calls
(levels of like size share one) and prices all steps in vmapped calls (``jaxprice.simulate_sweep``).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np

from .cli_price import (add_scenario_argument, describe_deployment, load_scenario_deployment, parse_float, parse_int,
                        parse_int_list, refuse_repeats)
from .client import MAX_RUN_REQUESTS, MAX_SEED, check_sweep_size
from .errors import refuse
from .outputs import check_image, check_output_file
from .plan import INT_TOKEN_LIMIT
from .progress import Progress

ENGINE_FLAGS = (("max_num_seqs", "--max-num-seqs"), ("max_num_batched_tokens", "--max-num-batched-tokens"),
                ("block_size", "--block-size"), ("kv_capacity_tokens", "--kv-capacity-tokens"),
                ("max_model_len", "--max-model-len"))
DEFAULT_CONCURRENCY = "1,2,4,...,64"
# The most closed-loop clients: the default 10 x concurrency prompts must stay within MAX_RUN_REQUESTS
# (client.py); engines run at most a few thousand requests at once, more clients only queue.
MAX_CONCURRENCY = MAX_RUN_REQUESTS // 10
# With --goodput and several loads, the line under the table names the highest load at which at least
# this share of requests meets every SLO target (a sizing answer: the load a replica can take)
SLO_ATTAINMENT_TARGET = 0.9


def add_parser(subparsers):
    p = subparsers.add_parser(
        "serve", help="simulate serving under load: TTFT, TPOT, ITL, E2E and throughput per load",
        description="Simulate InferenceX's benchmark client (closed loop at a concurrency, or Poisson arrivals "
                    "at a rate, or a trace) against vLLM v1's scheduler (chunked prefill, KV blocks, "
                    "preemption, DP ranks, async scheduling), every step priced by the kernel.")
    add_scenario_argument(p, help="a bundled scenario name or a scenario file")
    p.add_argument("--isl", default=None, metavar="N", help="input length (default 1024; not with --trace)")
    p.add_argument("--osl", default=None, metavar="N", help="output length (default 1024; not with --trace)")
    p.add_argument("--concurrency", metavar="LIST", default=None,
                   help=f"closed-loop client concurrencies, e.g. 1,2,4,...,256 (default {DEFAULT_CONCURRENCY}; "
                        f"at most {MAX_CONCURRENCY})")
    p.add_argument("--rate", metavar="LIST", default=None, help="open loop: Poisson arrival rates (requests/s)")
    p.add_argument("--trace", metavar="CSV", default=None,
                   help="open loop from a trace: arrival_s,input_len,output_len, arrivals in non-decreasing order")
    p.add_argument("--num-prompts", metavar="N", default=None,
                   help=f"requests per run (default 10 x concurrency; 200 for --rate; at most {MAX_RUN_REQUESTS})")
    p.add_argument("--range-ratio", metavar="R", default=None,
                   help="lengths uniform on [floor(R*L), L] (InferenceX's --random-range-ratio; default 0.8, "
                        "as the measurements were taken; 1 = fixed)")
    p.add_argument("--seed", metavar="N", default=None,
                   help=f"seed of the lengths and arrivals, 0 .. {MAX_SEED} (default 0)")
    p.add_argument("--acceptance", metavar="A", default=None,
                   help="speculative decoding: mean tokens emitted per decode step (1 .. 1 + num_spec_tokens)")
    p.add_argument("--estimate", default="no_overlap", choices=("no_overlap", "overlap"),
                   help="the kernel estimate pricing each step (default no_overlap)")
    for key, flag in ENGINE_FLAGS:
        p.add_argument(flag, dest=key, metavar="N", default=None, help=f"engine override: {key}")
    p.add_argument("--scheduler", default=None, choices=("vllm", "sglang", "trtllm"),
                   help="whose scheduler to follow (default vllm): sglang runs prefill steps first and "
                        "decode steps apart, sglang and trtllm admit a request only if every running one can "
                        "grow to its full length (no preemption); the step price is the same")
    p.add_argument("--reserve-full-isl", dest="reserve_full_isl", default=None, choices=("on", "off"),
                   help="admit a request only if its whole prompt's KV blocks fit (vLLM default on)")
    p.add_argument("--async-scheduling", dest="async_scheduling", default=None, choices=("on", "off"),
                   help="vLLM async scheduling (default on)")
    p.add_argument("--goodput", nargs="+", metavar="NAME:MS", default=None,
                   help="service-level objectives, vLLM bench serve's --goodput: NAME:MS pairs (milliseconds; "
                        "names ttft, tpot, e2el; separated by spaces or commas; after SCENARIO), e.g. --goodput "
                        "ttft:2000 tpot:50. "
                        "A request is good when each named metric is <= its target (TPOT counts 0 for a "
                        "one-token request); the table, --json and --csv then add goodput (good requests/s) "
                        "and the share of requests good, and with several loads a line names the highest "
                        f"load with >= {SLO_ATTAINMENT_TARGET * 100:.0f}%% of requests good")
    p.add_argument("--json", action="store_true", help="print JSON (times in seconds) instead of the table")
    p.add_argument("--csv", metavar="FILE", default=None,
                   help="write one row per request (every load; tpot_s empty for a one-token request, which has "
                   "no TPOT)")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="TTFT and TPOT against the load; throughput per GPU against tokens/s per user")
    p.add_argument("--timeline", metavar="FILE.png", default=None,
                   help="resident batch, tokens per step and step time over the run (the last load)")
    p.set_defaults(command="serve")
    return p


def _engine(args):
    eng = {}
    for key, flag in ENGINE_FLAGS:
        v = getattr(args, key)
        if v is not None:
            eng[key] = parse_int(v, flag=flag, minimum=1) if key != "kv_capacity_tokens" else \
                parse_float(v, flag=flag, minimum=0)
    for key in ("reserve_full_isl", "async_scheduling"):
        v = getattr(args, key)
        if v is not None:
            eng[key] = v == "on"
    if args.scheduler is not None:
        eng["scheduler"] = args.scheduler
    from .serve import RESERVE_TO_COMPLETION
    if args.reserve_full_isl is not None and args.scheduler in RESERVE_TO_COMPLETION:   # else ignored silently
        refuse(f"is vLLM's admission gate; --scheduler {args.scheduler} admits a request only when it can grow to "
               "its full length beside every running one, so it changes nothing", field="--reserve-full-isl",
               value=args.reserve_full_isl)
    return eng


COLUMNS = (("TTFT mean", "ttft_mean", 1e3), ("TTFT p99", "ttft_p99", 1e3), ("TPOT mean", "tpot_mean", 1e3),
           ("TPOT p99", "tpot_p99", 1e3), ("ITL mean", "itl_mean", 1e3), ("ITL p99", "itl_p99", 1e3),
           ("E2E mean", "e2e_mean", 1e3), ("E2E p99", "e2e_p99", 1e3), ("tok/s", "output_tps", 1),
           ("tok/s/GPU", "output_tps_per_gpu", 1), ("tok/s/user", "output_tps_per_user", 1),
           ("resident", "resident_mean", 1), ("peak", "resident_peak", 1), ("preempt", "preemptions", 1),
           ("steps", "steps", 1))
PER_TOKEN = ("tpot_mean", "tpot_p99", "itl_mean", "itl_p99", "output_tps_per_user")   # none with one token each
SLO_COLUMNS = (("goodput", "goodput", 1), ("SLO %", "slo_attainment", 100))     # with --goodput


def format_table(label, loads, results) -> str:
    slo = any("goodput" in r.summary for r in results)       # runs given an SLO (--goodput)
    columns = COLUMNS + (SLO_COLUMNS if slo else ())
    head = [label] + [c[0] for c in columns]
    rows, dashes = [], False
    for x, r in zip(loads, results):
        cells = [f"{x:g}" if isinstance(x, float) else str(x)]
        # a run whose every request emits one token has no time between tokens: '-', not 0
        one_token = int(max(r.requests["output_len"], default=0)) <= 1
        dashes |= one_token
        for _name, key, k in columns:
            v = r.summary[key] * k
            cells.append("-" if one_token and key in PER_TOKEN else
                         f"{v:.0f}" if key in ("preemptions", "steps", "resident_peak") else
                         f"{v:.3g}" if key == "goodput" else
                         f"{v:.1f}" if key.startswith(("output", "resident", "slo")) else f"{v:.2f}")
        rows.append(cells)
    widths = [max(len(h), *(len(r[j]) for r in rows)) for j, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines) + "\n(times in ms; tok/s/user = 1 / mean TPOT" + (
        "; goodput: requests/s meeting every SLO target; SLO %: their share of requests" if slo else "") + (
        "; '-': every request emits one token)" if dashes else ")")


def check_outputs(args):
    """Every output path, checked before the simulation runs."""
    if args.csv is not None:
        check_output_file(args.csv, flag="--csv", what="CSV", writes="CSV")
    check_image(args.plot, "--plot")
    if args.plot is not None and args.trace is not None:    # drew "TTFT vs trace" on an axis of one index
        refuse("draws TTFT, TPOT and throughput against the load (--concurrency or --rate); a trace is one run "
               "with no load to draw against: --timeline draws it step by step", field="--plot", value=args.plot)
    check_image(args.timeline, "--timeline")
    seen = {} if args.trace is None else {Path(args.trace).expanduser().resolve(): "--trace (the input)"}
    for flag in ("--csv", "--plot", "--timeline"):      # one file each: a later one would overwrite an earlier
        path = getattr(args, flag[2:])
        if path is not None:
            key = Path(path).expanduser().resolve()
            if key in seen:
                refuse(f"names the same file as {seen[key]}: one output would overwrite the other; give two files",
                       field=flag, value=path)
            seen[key] = flag


def write_csv(path, label, loads, results):
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    keys = ("arrival", "first_token", "finish", "input_len", "output_len", "ttft", "tpot", "e2e", "preemptions", "rank")
    if any("good" in r.requests for r in results):      # --goodput: 1 where the request meets every target
        keys += ("good",)
    with open(p, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([label, "request"] + [k + ("_s" if k in ("arrival", "first_token", "finish", "ttft", "tpot", "e2e")
                                              else "") for k in keys])
        for x, r in zip(loads, results):
            n = r.requests["ttft"].size
            # a one-token request has no TPOT (the client leaves it out of the mean): an empty cell, not
            # the 0 that pulled the mean of the column below the summary's TPOT
            no_tpot = np.asarray(r.requests["output_len"]) <= 1
            for i in range(n):
                w.writerow([x, i] + ["" if k == "tpot" and no_tpot[i] else
                                     f"{float(r.requests[k][i]):.9g}" if k != "good" else int(r.requests[k][i])
                                     for k in keys])


def run(args) -> int:
    check_outputs(args)
    opts = _options(args)
    label, loads = _loads(args, opts)
    dep = load_scenario_deployment(args.scenario, args.pool, args)
    _check_budget(dep, opts["engine"])
    _check_acceptance(dep, opts["acceptance"])
    _check_block_size(dep, opts["engine"])
    results = _simulate_loads(dep, args, opts, label, loads)
    if label == "trace":
        loads = [Path(args.trace).name]
    if args.csv:
        write_csv(args.csv, label, loads, results)
    _write_figures(dep, args, opts, label, loads, results)
    for path in (args.csv, args.plot, args.timeline):      # as price and sweep say what they wrote
        if path:
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        json.dump(_json_report(dep, args, opts, label, loads, results), sys.stdout, indent=1)
        print()
        return 0
    print(_text_report(dep, args, opts, label, loads, results))
    return 0


def _check_acceptance(dep, acceptance) -> None:
    """--acceptance on a deployment that does not speculate: said so, and how to speculate (it read
    "field 'acceptance', value 2.0: must be a number in [1, 1 + num_spec_tokens = 1]", naming neither
    the flag nor the scenario setting that would allow it)."""
    if acceptance is None or int(dep.plan.scalars.get("uniform_width", 1)) > 1:
        return
    where = f"{dep.scenario.path}: " if getattr(dep.scenario, "path", None) else ""
    refuse(f"is the mean tokens a speculating decode row emits per step, but {dep.name} does not speculate "
           f"({where}no engine.speculative.num_spec_tokens): state the draft tokens in the scenario to simulate "
           "speculative decoding", field="--acceptance", value=acceptance)


def _check_block_size(dep, engine) -> None:
    """--block-size as vLLM's flag takes it: one of its block sizes, as a scenario's engine.block_size
    is refused otherwise (--block-size 7 ran an engine vLLM does not start). A model with recurrent
    layers runs vLLM's own larger attention block (serve._take_block_size checks an override's floor)."""
    from .formats import VLLM_BLOCK_SIZES
    v = engine.get("block_size")
    if v is None or v in VLLM_BLOCK_SIZES or dep.plan.memory.get("hybrid_block_minimum", 0):
        return
    refuse(f"vLLM would not start: the block size must be one of {', '.join(map(str, VLLM_BLOCK_SIZES))} "
           "(vLLM's CacheConfig.BlockSize)", field="--block-size", value=v)


def drafter_note(dep) -> str:
    """Where the scenario speculates on a model whose graph has no drafter (no MTP layers): the drafts'
    own cost is not priced, only the target's 1 + k token rows ("" otherwise)."""
    sc = dep.plan.scalars
    if int(sc.get("uniform_width", 1)) <= 1 or sc.get("drafter"):
        return ""
    return (f"the drafter is NOT priced: {dep.graph.name}'s graph has no speculator (MTP layers), so only the "
            "target's 1 + k token decode rows are; a draft model or EAGLE head would add its own passes to every step")


def _check_budget(dep, engine) -> None:
    """A token budget below max_num_seqs that a flag sets (with the scenario's or vLLM's default for
    the other), which vLLM refuses to start with (SchedulerConfig._verify_args,
    vllm/config/scheduler.py: max_num_batched_tokens must be >= max_num_seqs)."""
    from .serve import engine_settings
    flags = [k for k in ("max_num_batched_tokens", "max_num_seqs") if k in engine]
    if not flags:
        return
    out, _src = engine_settings(dep, engine)
    seqs, budget = out["max_num_seqs"], out["max_num_batched_tokens"]
    if out["scheduler"] == "vllm" and budget < seqs:
        flag = "--" + flags[0].replace("_", "-")
        refuse(f"makes max_num_batched_tokens {budget} < max_num_seqs {seqs}, which vLLM refuses to start with "
               "(every running request needs a token per step)", field=flag, value=engine[flags[0]])


def _options(args) -> dict:
    """The client's options, checked: lengths, range ratio, seed, acceptance, prompts, engine
    overrides (none of the length options with --trace, which gives every request's)."""
    from .client import Workload
    modes = sum(x is not None for x in (args.concurrency, args.rate, args.trace))
    if modes > 1:
        refuse("give one of --concurrency, --rate, --trace", field="--rate" if args.rate is not None else "--trace",
               value=args.rate if args.rate is not None else args.trace)
    if args.trace is not None:      # the trace holds the lengths and arrivals: these would be ignored
        for flag, v in (("--isl", args.isl), ("--osl", args.osl), ("--range-ratio", args.range_ratio),
                        ("--seed", args.seed), ("--num-prompts", args.num_prompts)):
            if v is not None:
                refuse("cannot be combined with --trace: the trace gives every request's lengths and arrival",
                       field=flag, value=v)
    isl = parse_int(args.isl if args.isl is not None else 1024, flag="--isl", minimum=1)
    osl = parse_int(args.osl if args.osl is not None else 1024, flag="--osl", minimum=1)
    for flag, v in (("--isl", isl), ("--osl", osl)):
        if v >= INT_TOKEN_LIMIT:
            refuse(f"must be below the kernel's token limit {INT_TOKEN_LIMIT} (2**24)", field=flag, value=v)
    rr = parse_float(args.range_ratio if args.range_ratio is not None else 0.8, flag="--range-ratio", minimum=0)
    if rr > 1:
        refuse("must be in [0, 1]", field="--range-ratio", value=rr)
    seed = parse_int(args.seed if args.seed is not None else 0, flag="--seed")
    if not 0 <= seed <= MAX_SEED:
        refuse(f"must be an integer in [0, {MAX_SEED}] (a numpy RandomState seed)", field="--seed", value=seed)
    if args.seed is not None and rr == 1 and args.rate is None:     # else ignored silently: nothing is drawn
        refuse("seeds the request lengths (and --rate's arrivals); with --range-ratio 1 every length is fixed and "
               "the closed loop draws no arrival, so it changes nothing", field="--seed", value=args.seed)
    acc = None if args.acceptance is None else parse_float(args.acceptance, flag="--acceptance", minimum=1)
    n = None if args.num_prompts is None else parse_int(args.num_prompts, flag="--num-prompts", minimum=1)
    if n is not None and n > MAX_RUN_REQUESTS:
        refuse(f"must be at most {MAX_RUN_REQUESTS} (jaxprice's cap on the requests of one run)",
               field="--num-prompts", value=n)
    return {"isl": isl, "osl": osl, "rr": rr, "seed": seed, "acceptance": acc, "num_prompts": n,
            "engine": _engine(args), "workload": Workload(isl, osl, rr, seed), "slo": parse_goodput(args.goodput)}


def parse_goodput(tokens):
    """--goodput's NAME:MS pairs (vLLM's spelling, space or comma separated) -> {name: seconds}
    (serve.check_slo: names ttft, tpot, e2el, each once, targets finite and > 0); None without it."""
    from .serve import check_slo
    if tokens is None:
        return None
    pairs = []
    for token in tokens:
        parts = str(token).split(",")
        if len(parts) > 1 and any(not t.strip() for t in parts):
            refuse("has an empty entry", field="--goodput", value=str(token))
        for part in parts:
            name, sep, value = part.strip().partition(":")
            if not sep or ":" in value or not name.strip() or not value.strip():
                refuse("expected NAME:MS pairs, e.g. --goodput ttft:2000 tpot:50 (milliseconds; names ttft, tpot, "
                       "e2el)", field="--goodput", value=part.strip())
            name = name.strip()
            try:
                ms = float(value.strip())
            except ValueError:
                refuse("expected a number of milliseconds", field=f"--goodput {name}", value=value.strip())
            pairs.append((name, ms))
    return check_slo(pairs, field="--goodput", unit="ms")


def _loads(args, opts) -> tuple:
    """(label, loads): ('trace', [the Trace]), ('rate', request rates) or ('C', concurrencies),
    each list refused when it repeats a load or passes the sweep's size cap."""
    from .client import load_trace
    n = opts["num_prompts"]
    if args.trace is not None:
        return "trace", [load_trace(args.trace)]
    if args.rate is not None:
        parts = str(args.rate).split(",")
        if len(parts) > 1 and any(not t.strip() for t in parts):      # was "value '': expected a number"
            refuse("has an empty entry", field="--rate", value=str(args.rate))
        rates = [parse_float(t, flag="--rate", positive=True) for t in parts]
        refuse_repeats(rates, "lists this load twice; give each once", flag="--rate")
        check_sweep_size([n or 200] * len(rates), "--rate", args.rate)
        return "rate", rates
    text = args.concurrency if args.concurrency is not None else DEFAULT_CONCURRENCY
    concs = parse_int_list(text, flag="--concurrency", minimum=1)
    for c in concs:
        if c > MAX_CONCURRENCY:
            refuse(f"must be at most {MAX_CONCURRENCY} (jaxprice's cap on closed-loop clients; 10 x that "
                   f"is the cap of {MAX_RUN_REQUESTS} requests per run)", field="--concurrency", value=c)
    refuse_repeats(concs, "lists this load twice; give each once", flag="--concurrency")
    if n is not None and n < max(concs):    # 1 prompt at C=64 ran one client, labelled C=64
        c = min(x for x in concs if x > n)
        refuse(f"is fewer than the {c} clients of --concurrency {c}: only {n} would ever send, yet the run would "
               f"read as C={c}; give at least {max(concs)} (default 10 x C)", field="--num-prompts", value=n)
    check_sweep_size([n or 10 * c for c in concs], "--concurrency", text)
    return "C", concs


def _simulate_loads(dep, args, opts, label, loads) -> list:
    """One ServingResult per load: the trace's run, a Poisson run per rate (200 prompts unless
    --num-prompts), or the closed-loop sweep in one simulate_sweep call; a progress bar unless --json."""
    from .client import OpenLoop
    from .serve import simulate, simulate_sweep
    common = dict(engine=opts["engine"], estimate=args.estimate, acceptance=opts["acceptance"], slo=opts.get("slo"))
    if label == "trace":      # progress in requests finished, after each scheduler call of a long run
        with Progress(len(loads[0].arrival_s), "serve", enabled=not args.json) as bar:
            return [simulate(dep, None, loads[0], callback=lambda d, t, **i: bar.update(d, t, **i), **common)]
    if label == "rate":
        results, n = [], opts["num_prompts"] or 200
        with Progress(n * len(loads), "serve", enabled=not args.json) as bar:
            for i, r in enumerate(loads):
                results.append(simulate(dep, opts["workload"], OpenLoop(r, n, opts["seed"]), **common,
                                        callback=lambda d, t, i=i, r=r, **info: bar.update(i * n + d, rate=r, **info)))
        return results
    with Progress(2, "serve", enabled=not args.json) as bar:
        return simulate_sweep(dep, opts["workload"], loads, num_prompts=opts["num_prompts"],
                              callback=lambda d, t, **i: bar.update(d, **i), **common)


def _write_figures(dep, args, opts, label, loads, results) -> None:
    """--plot (TTFT and TPOT against the load, with --goodput's targets; throughput per GPU against
    tokens/s per user) and --timeline (the last load's run, step by step)."""
    if args.plot:
        from .figures_serve import plot_serving_sweep
        plot_serving_sweep(results, [float(x) if not isinstance(x, str) else i for i, x in enumerate(loads)],
                           load_label={"C": "concurrency", "rate": "rate (requests/s)"}.get(label, label),
                           path=args.plot, title=f"{dep.name}  " + (f"trace {loads[0]}" if label == "trace"
                                                                   else f"isl {opts['isl']} osl {opts['osl']}"),
                           slo=opts.get("slo"))
    if args.timeline:
        from .figures_serve import plot_serving_timeline
        plot_serving_timeline(results[-1], path=args.timeline,
                              title=f"{dep.name}  {label} {loads[-1]}: " + (
                                  f"mean TTFT {results[-1].summary['ttft_mean'] * 1e3:.1f} ms, mean TPOT "
                                  f"{results[-1].summary['tpot_mean'] * 1e3:.2f} ms"))


def _json_report(dep, args, opts, label, loads, results) -> dict:
    """--json: each load's summary and assumptions (times in seconds); a trace states no isl, osl
    or range ratio (it gave the lengths). With --goodput: ``slo`` (seconds), ``slo_attainment_target``
    and, with several loads, ``slo_highest_load`` (null where none meets it, ``slo_closest_load`` then)."""
    given = label != "trace"
    slo = opts.get("slo")
    best = slo_best_load(loads, results) if slo and len(loads) > 1 else None
    return {"scenario": dep.name, "estimate": args.estimate, "isl": opts["isl"] if given else None,
            "osl": opts["osl"] if given else None, "range_ratio": opts["rr"] if given else None,
            **({} if not slo else {"slo": slo, "slo_attainment_target": SLO_ATTAINMENT_TARGET}),
            **({} if best is None else {"slo_highest_load": best[0],
                                        **({} if best[0] is not None else {"slo_closest_load": best[1]})}),
            "runs": [{label: x, "summary": r.summary,
                      "assumptions": {k: {"value": v[0] if isinstance(v[0], (int, float, str, bool)) else str(v[0]),
                                          "source": v[1]} for k, v in r.assumptions.items()},
                      **({} if label == "C" else _growth_json(r))}
                     for x, r in zip(loads, results)]}


def _growth_json(r) -> dict:
    """Open loop: the TTFT of the first and last fifth of arrivals (s) and whether the queue grows."""
    g = ttft_growth(r)
    return {} if g is None else {"ttft_first_fifth": g[0], "ttft_last_fifth": g[1],
                                 "queue_growing": g[1] > QUEUE_GROWTH * g[0]}


def _setting_text(key, results) -> str:
    """One engine setting of the runs: its value, or each load's where the runs differ (a model with
    sliding-window layers sizes its KV cache at each run's own lengths, so kv_blocks can differ by load;
    the line showed the first load's for every load)."""
    vals = [r.assumptions[key][0] for r in results if key in r.assumptions]
    if len(set(map(str, vals))) == 1:
        return f"{key} {vals[0]}"
    return f"{key} {'/'.join(map(str, vals))} (by load)"


def _block_why(results) -> str:
    """' (why)' where vLLM runs another block than the one stated (its MLA backend's own,
    resolve.vllm_mla_block, or a hybrid model's attention block) or would run an engine= block
    on another backend than the one priced; '' otherwise."""
    src = str(results[0].assumptions["block_size"][1])
    # serve._take_block_size's reasons start so; a scenario path holding "vLLM" is no reason
    return f" ({src})" if src.startswith(("vLLM's", "engine= override; ")) else ""


def _lowered_note(dep, opts, results) -> str:
    """Where a hybrid model's runs lowered max_num_seqs below its setting (serve._kv_blocks: the
    KV pool keeps the recurrent state of only the requests that fit at the run's lengths), the
    setting and why; the line showed the lowered value as if it were the setting."""
    from .serve import engine_settings
    setting = engine_settings(dep, opts["engine"], acceptance=opts["acceptance"])[0]["max_num_seqs"]
    ran = [r.assumptions["max_num_seqs"][0] for r in results if "max_num_seqs" in r.assumptions]
    if not ran or max(ran) >= setting:
        return ""
    state = float(dep.plan.memory.get("recurrent_state_bytes_per_request", 0.0))
    return (f" (lowered from the setting {setting}: the KV pool keeps the recurrent state, {state / 2 ** 20:.1f} MiB "
            "per request and rank, of only the requests that fit beside their KV at the run's lengths)")


def _text_report(dep, args, opts, label, loads, results) -> str:
    """The deployment, the engine settings the runs used, the workload and the table."""
    a = results[0].assumptions
    engine = ", ".join(_setting_text(k, results) + (_lowered_note(dep, opts, results) if k == "max_num_seqs" else
                                                     _block_why(results) if k == "block_size" else "")
                       for k in ("scheduler", "max_num_seqs", "max_num_batched_tokens", "block_size", "kv_blocks",
                                 "max_model_len", "reserve_full_isl", "async_scheduling") if k in a)
    if label == "trace":
        workload = (f"workload: the trace {args.trace}, {results[0].requests['ttft'].size} requests (its lengths "
                    "and arrivals)")
    else:
        workload = (f"workload: isl {opts['isl']}, osl {opts['osl']}, range ratio {opts['rr']:g} (lengths uniform "
                    f"on [floor(r*L), L]), seed {opts['seed']}")
    lines = [f"{dep.name}: {describe_deployment(dep)}", f"engine: {engine}; dp {a['dp'][0]}; estimate {args.estimate}",
             workload]
    if a.get("num_spec_tokens", (0,))[0]:      # speculation moves every TPOT by an assumed acceptance: said
        acc, src = a["acceptance"]
        lines.append(f"speculative decoding: {a['num_spec_tokens'][0]} draft token(s) a step, {acc:g} tokens emitted per "
                     f"decode row and step ({'given: --acceptance' if args.acceptance is not None else src})")
        if drafter_note(dep):
            lines.append(drafter_note(dep))
    if "request_latency" in a:      # a fixed part of every TTFT the table shows, so it is said
        lines.append(f"host, per request: {a['request_latency'][0]} (the registry's host_admission_per_request "
                     "/ _per_token / host_completion; the admission is part of every TTFT and E2E)")
    slo = opts.get("slo")
    if slo:
        lines.append("SLO (vLLM's --goodput): " + ", ".join(f"{k} <= {v * 1e3:g} ms" for k, v in slo.items())
                     + "; a request is good when it meets every target (TPOT counts 0 for a one-token request)")
    return "\n".join(lines + [format_table(label, loads, results)] + slo_notes(label, loads, results, slo)
                     + queue_notes(label, loads, results))


def slo_best_load(loads, results):
    """(the highest load whose SLO attainment is >= SLO_ATTAINMENT_TARGET, or None; the load with the
    highest attainment, the highest such load on a tie, None where no request is good at any load):
    the sizing answer of a --goodput sweep."""
    att = [r.summary["slo_attainment"] for r in results]
    ok = [x for x, a in zip(loads, att) if a >= SLO_ATTAINMENT_TARGET]
    closest = max(zip(att, loads))[1] if max(att) > 0 else None
    return (max(ok) if ok else None, closest)


def slo_notes(label, loads, results, slo) -> list:
    """With --goodput and several loads: the line naming the highest load at which at least
    SLO_ATTAINMENT_TARGET of the requests meet every target (or none, and the closest)."""
    if not slo or len(loads) < 2:
        return []
    best, closest = slo_best_load(loads, results)
    name = {"C": "concurrency", "rate": "rate"}.get(label, label)
    unit = " req/s" if label == "rate" else ""
    share = f">= {SLO_ATTAINMENT_TARGET:.0%} of requests meeting the SLO"
    if best is not None:
        r = results[list(loads).index(best)]
        return [f"highest load with {share}: {name} {best:g}{unit} ({r.summary['slo_attainment']:.1%} good, "
                f"goodput {r.summary['goodput']:.3g} req/s)"]
    if closest is None:
        return [f"highest load with {share}: none; no request meets every target at any load"]
    r = results[list(loads).index(closest)]
    return [f"highest load with {share}: none; the closest is {name} {closest:g}{unit} "
            f"({r.summary['slo_attainment']:.1%} good, goodput {r.summary['goodput']:.3g} req/s)"]


QUEUE_GROWTH = 2.0       # TTFT of the last fifth of arrivals over the first fifth's, past which it is said


def ttft_growth(r):
    """Open loop: (mean TTFT of the first fifth of arrivals, of the last fifth) in s; None under
    ten requests. Growth past QUEUE_GROWTH means requests arrive faster than the deployment
    serves them: the wait queue grows, and the run's means depend on its length, not on a
    steady state."""
    ttft = np.asarray(r.requests["ttft"])[np.argsort(np.asarray(r.requests["arrival"]), kind="stable")]
    k = ttft.size // 5
    return None if k < 2 else (float(ttft[:k].mean()), float(ttft[-k:].mean()))


def queue_notes(label, loads, results) -> list:
    """A line under the table for each open-loop load whose wait queue grows (ttft_growth)."""
    notes = []
    for x, r in zip(loads, results):
        g = None if label == "C" else ttft_growth(r)
        if g is not None and g[1] > QUEUE_GROWTH * g[0]:
            where = "the trace" if label == "trace" else f"rate {x:g}"
            notes.append(f"{where}: TTFT grew through the run, {g[0] * 1e3:.1f} ms over the first fifth of arrivals "
                         f"to {g[1] * 1e3:.1f} ms over the last: requests arrive faster than the deployment serves "
                         f"them ({r.summary['requests_per_s']:.3g} req/s served), the wait queue grows, and the "
                         "means depend on the run's length (--num-prompts)")
    return notes
