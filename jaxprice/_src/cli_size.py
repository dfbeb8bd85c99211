"""`jaxprice size MODEL`: the best parallel layout and engine settings for a GPU count and targets.

    jaxprice size deepseek-v3 --chip h200 --gpus 8 --isl 1024 --osl 1024 --ttft-ms 2000 --tpot-ms 50 \\
        --plot frontier.png --write-scenario best.yaml --json size.json

Prints the candidate space (layouts tried, rejected with why, duplicates), a progress bar while
the layouts are evaluated, then a table of each layout's best point within the targets, the
Pareto frontier, the best layout and its margin over the next best, and the equivalent
``vllm serve`` command. ``--engine sglang`` sizes SGLang engines instead (its
``--max-running-requests`` and ``--chunked-prefill-size`` axes, its scheduler in the serving
simulation and the steady state, a ``python -m sglang.launch_server`` line); vLLM's own options
(``--max-num-seqs``, ``--max-num-batched-tokens``, ``--graph-modes``) are refused beside it, and
SGLang's beside vLLM. No layout meeting the targets: a message naming the closest one and
what it misses by, exit status 1. Bad input: one line, exit status 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from . import compile_cache
from .cli_price import parse_float, parse_int, parse_int_list, refuse_repeats
from .errors import JaxpriceError, refuse
from .outputs import check_image, check_output_file
from .progress import Progress


def add_parser(subparsers):
    from . import size as S
    p = subparsers.add_parser(
        "size", help="search parallel layouts and engine settings for a model, a GPU count and latency targets",
        description="Search every layout that fits (tp, dp, expert parallelism, weight format, max_num_seqs, "
                    "max_num_batched_tokens, graph mode) under a closed-loop concurrency sweep; print the "
                    "Pareto frontier of tokens/s per GPU against tokens/s per user and the best layout meeting "
                    "the targets. Lists take commas and '...' (1,2,4,...,512).")
    p.add_argument("model", help="a registry model name (e.g. deepseek-v3), a model graph file, or a Hugging Face config.json (or a folder holding one)")
    p.add_argument("--chip", required=True, help="a registry chip (e.g. h200)")
    p.add_argument("--gpus", required=True, help="GPUs to serve on (replicas = GPUs / (tp x dp))")
    p.add_argument("--gpus-per-node", default="8", help="GPUs per node (default 8)")
    p.add_argument("--fabric", default=None,
                   help="the network joining nodes (a registry fabric: ib-400g, roce-200g, ethernet-100gbe); "
                        "layouts wider than a node are priced only with it")
    p.add_argument("--isl", required=True, help="input tokens per request")
    p.add_argument("--osl", required=True, help="output tokens per request")
    p.add_argument("--ttft-ms", default=None, help="target on mean TTFT, ms")
    p.add_argument("--tpot-ms", default=None, help="target on mean TPOT, ms")
    p.add_argument("--concurrency", metavar="LIST", default=",".join(map(str, S.DEFAULT_CONCURRENCY)),
                   help="clients per engine, the closed-loop sweep (default %(default)s)")
    p.add_argument("--tp", metavar="LIST", default=None, help="tensor-parallel widths (default 1,2,4,8,16 <= GPUs)")
    p.add_argument("--dp", metavar="LIST", default=None,
                   help="data-parallel widths (default: 1,2,4,8,16 for MoE models, 1 otherwise)")
    p.add_argument("--ep", choices=("on", "off", "both"), default="both",
                   help="expert parallelism (MoE models; default both)")
    p.add_argument("--weights", metavar="LIST", default=None,
                   help="served weight formats (default: what the chip and checkpoint allow)")
    p.add_argument("--engine", default="vllm", metavar="{" + ",".join(S.ENGINES) + "}",
                   help="the serving engine sized: vllm (default) or sglang (SGLang's scheduler: admission reserved "
                        "to completion, prefill-only steps; its launch line)")
    seqs, tokens = ",".join(map(str, S.DEFAULT_MAX_NUM_SEQS)), ",".join(map(str, S.DEFAULT_BATCHED_TOKENS))
    p.add_argument("--max-num-seqs", metavar="LIST", default=None,
                   help=f"vLLM: engine max_num_seqs values (default {seqs})")
    p.add_argument("--max-num-batched-tokens", metavar="LIST", default=None,
                   help=f"vLLM: engine max_num_batched_tokens values (default {tokens})")
    p.add_argument("--graph-modes", metavar="LIST", default=None,
                   help=f"vLLM: CUDA-graph modes (default {','.join(S.DEFAULT_GRAPH_MODES)})")
    p.add_argument("--max-running-requests", metavar="LIST", default=None,
                   help=f"SGLang: max_running_requests values (default {seqs})")
    p.add_argument("--chunked-prefill-size", metavar="LIST", default=None,
                   help=f"SGLang: chunked_prefill_size values (default {tokens})")
    p.add_argument("--spec-tokens", metavar="LIST", default=None,
                   help="speculative decoding: draft counts k to search (tokens drafted per decode step by the "
                        "model's own MTP layers; a decode row schedules 1 + k), e.g. 0,1,2,3 (default 0: none; "
                        "k > 0 needs a model graph with a drafter; vLLM engines only)")
    p.add_argument("--acceptance", metavar="A", default=None,
                   help="speculative decoding: ASSUMED mean tokens emitted per decode row and step, in "
                        "[1, 1 + the largest k] (at most 1 + k for each k; default (1 - 0.7^(k+1)) / 0.3: 1.7, 2.19, 2.53 for k = 1, 2, 3)")
    p.add_argument("--range-ratio", default="0.8",
                   help="request lengths uniform on [ratio x L, L] (InferenceX: 0.8; 1 = fixed)")
    p.add_argument("--evaluator", choices=S.EVALUATORS, default="auto",
                   help="steady: the closed loop's steady state in closed form, all layouts on the deployment "
                        "axis (fast); serve: the serving simulation for every layout (all layouts' runs in "
                        "shared scheduler calls, --search-prompts per client, then the frontier at 10 x C); "
                        "auto (default): steady for every layout, then the serving simulation at 10 x C for the "
                        "frontier, the best and the layouts near the targets (--simulate), its numbers replacing "
                        "the steady ones")
    p.add_argument("--simulate", default=None,
                   help="auto: layouts near the targets re-run under the serving simulation at 10 x C prompts "
                        "beside the frontier, best and runner-up (always re-run), at most "
                        f"(default {S.DEFAULT_SIMULATE}; 0: no simulation)")
    p.add_argument("--search-prompts", default=None,
                   help="serve: prompts per client for the search over every layout "
                        f"(default {S.DEFAULT_SEARCH_PROMPTS}, i.e. 2 x C per point; 'none': 10 x C)")
    p.add_argument("--verify", default=None,
                   help="steady: re-run the best (1) and the runner-up (2) layout under the serving simulation "
                        "(default 0)")
    p.add_argument("--num-prompts", default=None,
                   help="prompts per simulated point, every simulated run (default 10 x C, the benchmark's)")
    p.add_argument("--show-rejected", action="store_true", help="list every rejected layout with its reason")
    p.add_argument("--top", default="12", help="table rows (layouts, best first; default 12)")
    p.add_argument("--json", metavar="FILE", default=None, help="write everything as JSON ('-': stdout, the report then on stderr)")
    p.add_argument("--plot", metavar="FILE.png", default=None, help="draw the frontier and every layout's curve")
    p.add_argument("--write-scenario", metavar="FILE.yaml", default=None,
                   help="write the chosen deployment as a scenario (jaxprice price / serve read it)")
    p.add_argument("--coefficients", metavar="SET.yaml", nargs="+", action="extend", default=[],
                   help="coefficient set files every candidate lists after the bundled sets, e.g. one jaxprice fit "
                        "wrote (its entries apply where their scope reaches: the chips, models and engine fitted on)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(command="size")


def _targets(text, flag):
    if text is None:
        return None
    v = parse_float(text, flag=flag)
    if not v > 0:
        refuse("a target must be > 0", field=flag, value=text)
    return v


def _names(text, flag, known, what, upper=False):
    """A comma-separated list of names from ``known``, refused naming the flag (an empty list, or
    an empty entry, too: 'fp8,,bf16' dropped it silently, as parse_int_list refuses)."""
    parts = [t.strip().upper() if upper else t.strip() for t in str(text).split(",")]
    names = [t for t in parts if t]
    if not names:
        refuse(f"expected a comma-separated list of {', '.join(known)}", field=flag, value=str(text),
               has_value=True)
    if len(names) != len(parts):
        refuse("has an empty entry", field=flag, value=str(text))
    for n in names:
        if n not in known:
            refuse(f"unknown {what} (known: {', '.join(known)})", field=flag, value=n)
    refuse_repeats(names, REPEATED, flag=flag)
    return names


REPEATED = "lists this value twice; give each once"   # as serve refuses a load listed twice


def _ints(text, flag, **kw):
    """parse_int_list, a value listed twice refused (it would be searched once: likely a typo)."""
    values = parse_int_list(text, flag=flag, **kw)
    refuse_repeats(values, REPEATED, flag=flag)
    return values


# each engine's own flags for the shared axes (max_num_seqs, max_num_batched_tokens) and vLLM's graph modes
ENGINE_FLAGS = {"vllm": ("--max-num-seqs", "--max-num-batched-tokens", "--graph-modes"),
                "sglang": ("--max-running-requests", "--chunked-prefill-size")}


def _engine_axes(args) -> tuple:
    """(max_num_seqs text, max_num_batched_tokens text, graph modes text, their flags) under the
    engine's own flag names; another engine's flag is refused naming it (it would be ignored)."""
    from . import size as S
    engine = getattr(args, "engine", "vllm")
    if engine not in S.ENGINES:
        refuse(f"unknown engine (known: {', '.join(S.ENGINES)})", field="--engine", value=engine)
    for other, flags in ENGINE_FLAGS.items():
        if other == engine:
            continue
        for flag in flags:
            if getattr(args, flag[2:].replace("-", "_"), None) is not None:
                twin = dict(zip(ENGINE_FLAGS[other], ENGINE_FLAGS[engine])).get(flag)
                refuse(f"is {'vLLM' if other == 'vllm' else 'SGLang'}'s option, not --engine {engine}'s"
                       + (f" (its own: {twin})" if twin else
                          " (SGLang captures decode batches and runs prefill eagerly: no graph mode to search)"),
                       field=flag, value=getattr(args, flag[2:].replace("-", "_")))
    seqs, tokens = ",".join(map(str, S.DEFAULT_MAX_NUM_SEQS)), ",".join(map(str, S.DEFAULT_BATCHED_TOKENS))
    if engine == "sglang":
        return (seqs if args.max_running_requests is None else args.max_running_requests,
                tokens if args.chunked_prefill_size is None else args.chunked_prefill_size, None,
                ("--max-running-requests", "--chunked-prefill-size"))
    return (seqs if args.max_num_seqs is None else args.max_num_seqs,
            tokens if args.max_num_batched_tokens is None else args.max_num_batched_tokens,
            ",".join(S.DEFAULT_GRAPH_MODES) if args.graph_modes is None else args.graph_modes,
            ("--max-num-seqs", "--max-num-batched-tokens"))


def options(args) -> dict:
    from .formats import DTYPE_BYTES
    from .layouts import DEFAULT_GRAPH_MODES
    from .resolve import GRAPH_MODES
    seqs_text, tokens_text, modes_text, (seqs_flag, tokens_flag) = _engine_axes(args)
    modes = (_names(modes_text, "--graph-modes", GRAPH_MODES, "cudagraph mode", upper=True) if modes_text is not None
             else list(DEFAULT_GRAPH_MODES))
    weights = (_names(args.weights, "--weights", tuple(DTYPE_BYTES), "weight format") if args.weights is not None
               else None)
    rr = parse_float(args.range_ratio, flag="--range-ratio")
    if not 0 < rr <= 1:
        refuse("must be in (0, 1] (1: fixed lengths)", field="--range-ratio", value=args.range_ratio)
    simulation = _simulation_options(args)
    speculation = _speculation_options(args)
    concurrency = _ints(args.concurrency, "--concurrency", minimum=1)
    num = simulation["num_prompts"]
    if num is not None and num < max(concurrency):     # 4 prompts at C=64 ran four clients, read as C=64
        c = min(x for x in concurrency if x > num)
        refuse(f"is fewer than the {c} clients of --concurrency {c}: only {num} would ever send in a simulated "
               f"run, yet it would read as C={c}; give at least {max(concurrency)} (default 10 x C)",
               field="--num-prompts", value=num)
    return dict(chip=args.chip, gpus=parse_int(args.gpus, flag="--gpus", minimum=1),
                gpus_per_node=parse_int(args.gpus_per_node, flag="--gpus-per-node", minimum=1), fabric=args.fabric,
                isl=parse_int(args.isl, flag="--isl", minimum=1), osl=parse_int(args.osl, flag="--osl", minimum=2),
                ttft_ms=_targets(args.ttft_ms, "--ttft-ms"), tpot_ms=_targets(args.tpot_ms, "--tpot-ms"),
                concurrency=concurrency,
                # '' is refused, not read as the default widths
                tp=_ints(args.tp, "--tp", minimum=1) if args.tp is not None else None,
                dp=_ints(args.dp, "--dp", minimum=1) if args.dp is not None else None,
                ep={"on": [True], "off": [False], "both": None}[args.ep], weights=weights,
                max_num_seqs=_ints(seqs_text, seqs_flag, minimum=1),
                max_num_batched_tokens=_ints(tokens_text, tokens_flag, minimum=1),
                cudagraph_modes=modes, range_ratio=rr, evaluator=args.evaluator,
                coefficient_files=list(getattr(args, "coefficients", None) or ()),
                **simulation, **speculation,
                **({"engine": args.engine} if getattr(args, "engine", "vllm") != "vllm" else {}))


def _speculation_options(args) -> dict:
    """--spec-tokens (non-negative integers) and --acceptance (in [1, 1 + the largest k], refused
    without a k > 0); none given: {} (the search as without them)."""
    spec, acc = getattr(args, "spec_tokens", None), getattr(args, "acceptance", None)
    out = {}
    if spec is not None:
        out["spec_tokens"] = _ints(spec, "--spec-tokens", minimum=0,
                                            why=" (draft tokens per decode step; 0: no speculation)")
    if acc is not None:
        top = max(out.get("spec_tokens", [0]))
        if top == 0:
            refuse("is the acceptance of speculative decoding: give --spec-tokens above 0 (e.g. 0,1,2)",
                   field="--acceptance", value=acc)
        a = parse_float(acc, flag="--acceptance")
        if not 1.0 <= a <= 1.0 + top:
            refuse(f"must be in [1, 1 + {top}] (mean tokens emitted per decode row and step, at most 1 + the largest "
                   "--spec-tokens)", field="--acceptance", value=acc)
        out["acceptance"] = a
    return out


def _simulation_options(args) -> dict:
    """--simulate, --search-prompts, --verify and --num-prompts, each refused where the evaluator
    would ignore it (a silent no-op would read as an answer to a question that was not asked)."""
    from . import size as S
    ev = args.evaluator
    verify = 0 if args.verify is None else parse_int(args.verify, flag="--verify", minimum=0)
    if verify > 2:
        refuse("must be 0, 1 (re-run the best layout) or 2 (the best and the runner-up)", field="--verify",
               value=verify)
    simulate = S.DEFAULT_SIMULATE if args.simulate is None else parse_int(args.simulate, flag="--simulate", minimum=0)
    search = (S.DEFAULT_SEARCH_PROMPTS if args.search_prompts is None else
              None if str(args.search_prompts).strip().lower() == "none"
              else parse_float(args.search_prompts, flag="--search-prompts", positive=True))
    if search is not None and search < 1:
        refuse("is prompts per client: below 1 a run has fewer prompts than clients, and C of them never send",
               field="--search-prompts", value=search)
    num = None if args.num_prompts is None else parse_int(args.num_prompts, flag="--num-prompts", minimum=1)
    if verify and ev != "steady":
        refuse(f"re-runs the steady evaluator's choice; --evaluator {ev} simulates the frontier and the best "
               "already", field="--verify", value=verify)
    if args.simulate is not None and simulate and ev == "steady":
        refuse("is for --evaluator auto or serve: --evaluator steady simulates nothing (--verify re-runs its best "
               "layout)", field="--simulate", value=simulate)
    if args.search_prompts is not None and ev != "serve":
        refuse(f"is for --evaluator serve (its search over every layout); --evaluator {ev} searches with the steady "
               "state", field="--search-prompts", value=args.search_prompts)
    if num is not None and not (ev == "serve" or (ev == "auto" and simulate) or verify):
        refuse("sets the prompts of simulated runs, and none would run: use --evaluator auto or serve, or --verify",
               field="--num-prompts", value=num)
    return dict(num_prompts=num, verify=verify, simulate=simulate if ev != "steady" else None, search_prompts=search)


def describe_space(cands, ctx, show_rejected=False) -> str:
    """The candidate space: the axes, how many layouts, how many fit, the rejected ones."""
    from .layouts import COEFFICIENT_SETS
    lay = [c.layout for c in cands]
    sglang = ctx.get("engine", "vllm") == "sglang"
    axes = {"tp": sorted({x.tp for x in lay}), "dp": sorted({x.dp for x in lay}),
            "ep": sorted({x.ep for x in lay}), "weights": list(dict.fromkeys(x.weights for x in lay)),
            ("max_running_requests" if sglang else "max_num_seqs"): sorted({x.max_num_seqs for x in lay}),
            ("chunked_prefill_size" if sglang else "max_num_batched_tokens"):
                sorted({x.max_num_batched_tokens for x in lay})}
    if not sglang:
        axes["graph mode"] = list(dict.fromkeys(x.cudagraph_mode for x in lay))
    if any(x.spec_tokens for x in lay):
        axes["draft tokens (MTP)"] = sorted({x.spec_tokens for x in lay})
    if ctx.get("graph") is not None:     # 'bf16' alone read as a 16-bit gpt-oss: name the formats it holds beside
        from .layouts import held_formats
        g = ctx["graph"]
        axes["weights"] = [f + (f" (the checkpoint's, with {h})" if f == g.weight_dtype and (h := held_formats(g, f))
                                else "") for f in axes["weights"]]
    w = ctx["workload"]
    ok = [c for c in cands if c.status != "rejected"]
    rej = [c for c in cands if c.status == "rejected"]
    lines = [f"{ctx['model']} ({ctx['model_source']}) on {ctx['gpus']} x {ctx['chip']}, ISL {w.isl} / OSL {w.osl} "
             f"(lengths uniform on [{w.range_ratio:g} L, L]); coefficient sets as every bundled scenario: "
             f"{', '.join(COEFFICIENT_SETS)}"
             + "".join(f", then {f} (--coefficients)" for f in ctx.get("coefficient_sets", ())[len(COEFFICIENT_SETS):])
             + ("; engine SGLang (its scheduler: admission reserved to completion, prefill-only steps; decode "
                "batches in CUDA graphs, prefill eager)" if sglang else ""),
             "candidate space: " + "; ".join(f"{k} {', '.join(map(str, v))}" for k, v in axes.items())
             + f" -> {len(cands)} layouts"]
    parallels = list(dict.fromkeys(c.layout.parallel_label for c in ok))
    lines.append(f"  fit: {len(ok)} layouts in {len(parallels)} parallel layouts ({', '.join(parallels)}); "
                 f"{len(rej)} rejected" + ("" if show_rejected or not rej else " (--show-rejected lists them)"))
    if ctx.get("fabric") and not any(c.layout.width > ctx["gpus_per_node"] for c in cands):
        lines.append(f"  --fabric {ctx['fabric']} unused: no layout spans more than one node of "
                     f"{ctx['gpus_per_node']} GPUs")
    if show_rejected:
        seen = {}
        for c in rej:
            seen.setdefault(c.layout.parallel_label, []).append(c)
        for p, cs in seen.items():
            n = len(cs)
            lines.append(f"    rejected {p}" + (f" ({n} engine settings; the first)" if n > 1 else "")
                         + f": {cs[0].reason}")
    return "\n".join(lines)


def format_table(result, top=12) -> str:
    from .size import SKIP_TTFT_FACTOR, _meets
    rows = []
    for i, r in enumerate(result.results):
        ok = _meets(r, result.ttft_target, result.tpot_target)
        if ok.any():
            j = int(np.flatnonzero(ok)[np.argmax(r.tps_per_gpu[ok])])
            rows.append((float(r.tps_per_gpu[j]), i, j, True))
        else:
            rows.append((-1.0, i, int(np.argmin(r.tpot)), False))
    rows.sort(key=lambda t: (-t[0], t[1]))
    head = (f"{'layout':<42}{'rep':>4}{'C/eng':>7}{'TTFT ms':>10}{'TPOT ms':>9}{'tok/s/GPU':>11}{'tok/s/user':>11}"
            f"{'src':>5}{'':>3}")
    lines = [f"layouts by their best point within the targets ({len(rows)} distinct; top {min(top, len(rows))}):",
             head]
    front = set(result.frontier)
    for _, i, j, ok in rows[:top]:
        r = result.results[i]
        mark = ("*" if (i, j) == result.best else "") + ("F" if (i, j) in front else "")
        lines.append(f"{r.layout.label:<42}{r.replicas:>4}{int(r.concurrency[j]):>7}{r.ttft[j] * 1e3:>10.1f}"
                     f"{r.tpot[j] * 1e3:>9.2f}{r.tps_per_gpu[j]:>11.1f}{r.tps_per_user[j]:>11.1f}"
                     f"{_src(r, j):>5}" + (f"  {mark}" if mark else "") + ("" if ok else "  (misses targets at every C)"))
    lines.append("  * best   F on the Pareto frontier   src: sim = the serving simulation, 10 x C prompts; "
                 "sim~ = the simulation with fewer prompts (the search); std = the closed-form steady state "
                 f"(also a simulated layout's points whose steady TTFT is over {SKIP_TTFT_FACTOR:g} x the target: not re-run)")
    lines.append(f"Pareto frontier ({len(result.frontier)} points, tokens/s per user ascending):")
    for i, j in result.frontier:
        r = result.results[i]
        lines.append(f"  {r.tps_per_user[j]:8.1f} tok/s/user  {r.tps_per_gpu[j]:8.1f} tok/s/GPU  {r.layout.label} "
                     f"@ C={int(r.concurrency[j])}  ({_src(r, j)})")
    return "\n".join(lines)


def _src(r, j) -> str:
    source = r.point_source(j)
    if source == "steady":
        return "std"
    return "sim" if source == "serve" else "sim~"


def describe_sources(result) -> str:
    """Which layouts' numbers come from the serving simulation, which from the steady state."""
    from .size import SKIP_TTFT_FACTOR
    info = result.info
    sim = [r for r in result.results if r.source.startswith("serve")]
    if not sim:
        return f"numbers: all {len(result.results)} layouts from the {info['evaluator']} evaluator"
    final = [r for r in sim if r.source == "serve"]
    parts = [f"numbers: {len(sim)} of {len(result.results)} layouts from the serving simulation"]
    if final:
        parts.append(f"{len(final)} at {info.get('simulated_prompts', '10 x C')} prompts per point (the frontier, "
                     "best, runner-up and layouts near the targets)")
    if len(sim) > len(final):
        parts.append(f"{len(sim) - len(final)} at the search's {info.get('search_prompts')} prompts per point")
    twins = [r for r in sim if r.simulated_as is not None]
    if twins:
        parts.append(f"{len(twins)} of them at some points from a twin's run (the same plan at the same load, engine "
                     "settings that do not move TPOT or throughput there; 'simulated_as' in --json), their other "
                     "points from the steady state")
    kept = sum(int(r.kept.sum()) for r in sim if r.kept is not None and r.simulated_as is None)
    if kept:
        parts.append(f"{kept} point(s) of simulated layouts left on the steady state (TTFT there over "
                     f"{SKIP_TTFT_FACTOR:g} x the target: neither on the frontier nor chosen)")
    rest = len(result.results) - len(sim)
    if rest:
        parts.append(f"the other {rest} from the closed-form steady state")
    steady_front = sum(result.results[i].point_source(j) == "steady" for i, j in result.frontier)
    tail = ("; every frontier point simulated" if not steady_front
            else f"; {steady_front} frontier point(s) still from the steady state")
    return "; ".join(parts) + tail + (f" ({info.get('simulation_rounds', 0)} simulation round(s), "
                                      f"{info.get('seconds_simulate', 0.0):.1f} s)")


def check_outputs(args) -> None:
    """Refuse, before the search, an output path that cannot be written, two outputs onto one
    file (the later would overwrite the earlier), and an output onto the model file read."""
    if args.json is not None and args.json != "-":
        check_output_file(args.json, flag="--json", what="JSON", writes="JSON")
    if args.plot is not None:
        check_image(args.plot, "--plot")
    if args.write_scenario is not None:
        check_output_file(args.write_scenario, flag="--write-scenario", what="scenario", writes="YAML")
    seen = {}
    model = Path(str(args.model))
    if model.is_file():
        seen[model.resolve()] = "the MODEL file"
    elif model.is_dir():
        seen[(model / "config.json").resolve()] = "the MODEL's config.json"
    for flag, path in (("--json", args.json), ("--plot", args.plot), ("--write-scenario", args.write_scenario)):
        if path is None or path == "-":
            continue
        key = Path(path).resolve()
        if key in seen:
            refuse(f"is the same file as {seen[key]}: one would overwrite the other", field=flag, value=path)
        seen[key] = flag


# size()'s keywords, as the flags of `jaxprice size` that set them: a refusal from the search library
# named 'tp', 'weights' or 'chip' where the user typed --tp, --weights or --chip
API_FLAGS = {"chip": "--chip", "gpus": "--gpus", "gpus_per_node": "--gpus-per-node", "fabric": "--fabric",
             "isl": "--isl", "osl": "--osl", "ttft_ms": "--ttft-ms", "tpot_ms": "--tpot-ms",
             "concurrency": "--concurrency", "tp": "--tp", "dp": "--dp", "ep": "--ep", "weights": "--weights",
             "engine": "--engine", "cudagraph_modes": "--graph-modes", "spec_tokens": "--spec-tokens",
             "acceptance": "--acceptance", "range_ratio": "--range-ratio", "evaluator": "--evaluator",
             "simulate": "--simulate", "search_prompts": "--search-prompts", "verify": "--verify",
             "num_prompts": "--num-prompts", "coefficient_files": "--coefficients"}


def api_flag(err, args) -> str | None:
    """The flag that set the size() keyword a refusal names (None: not a flag's, e.g. a field of a
    file, which names its file): max_num_seqs and max_num_batched_tokens as the engine spells them."""
    if err.file:
        return None
    if err.field in ("max_num_seqs", "max_num_batched_tokens"):
        return _engine_axes(args)[3][err.field == "max_num_batched_tokens"]
    return API_FLAGS.get(err.field)


def set_notes_for(cands, files) -> list:
    """--coefficients: what of each set reaches the candidates (``fit.set_notes`` on the first
    that resolved; every candidate has the same chip, model and engine), so that a fitted set
    scoped elsewhere is said to leave the search on the registry's values."""
    dep = next((c.deployment for c in cands if c.deployment is not None), None)
    if not files or dep is None:
        return []
    from .fit import set_notes
    return [line.replace("this deployment", "these candidates") for line in set_notes(files, dep)]


def run(args) -> int:
    from .size import size
    opts = options(args)
    top = parse_int(args.top, flag="--top", minimum=1)
    check_outputs(args)
    # with --json - stdout carries the JSON alone; the report goes to stderr
    report = sys.stderr if args.json == "-" else sys.stdout
    bar = {}

    def progress(done, total, **info):
        if args.quiet:
            return
        if "bar" not in bar:
            bar["bar"] = Progress(total, "size")
        bar["bar"].update(done, total, **info)

    def announce(cands, ctx):
        print(describe_space(cands, ctx, args.show_rejected), file=report, flush=True)
        for line in set_notes_for(cands, args.coefficients):
            print(f"note: {line}", file=report, flush=True)

    loaded = compile_cache.loaded()
    try:
        result = size(args.model, callback=progress, on_candidates=announce, **opts)
    except JaxpriceError as err:       # the API's field names, as the flags that set them
        flag = api_flag(err, args)
        if flag is None:
            raise
        value = err.value
        if flag == "--ep" and value in (True, False, [True], [False]):      # --ep on|off reaches size() as [True]|[False]
            value = "on" if value in (True, [True]) else "off"
        raise JaxpriceError(err.reason, file=err.file, field=flag, value=value, has_value=True) from None
    finally:
        if "bar" in bar:
            bar["bar"].close()
    print(describe_result(result, top, loaded=compile_cache.loaded() - loaded), file=report)
    if result.best is None:
        print(f"jaxprice size: {result.miss}", file=sys.stderr)
    write_outputs(result, args, report)
    return 1 if result.best is None else 0


def describe_result(result, top: int, loaded: int = 0) -> str:
    """The search's account, the table, and the best layout with its margin, ties, simulation
    checks and launch command (``vllm serve`` or SGLang's) (nothing after the table when no layout meets the targets).
    ``loaded``: how many of the search's compiles the compile cache answered."""
    info = result.info
    lines = [f"searched {info['layouts_priced']} layouts x {info['concurrency_levels']} concurrencies "
             f"({info['layouts_evaluated']} distinct results, {info['layouts_duplicate']} duplicates) with the "
             f"{info['evaluator']} evaluator: {compile_cache.compiles_text(info['compiles'], loaded)}, "
             f"{info['steps_priced']} steps priced, "
             f"{info.get('steps_simulated', 0)} steps simulated, {info['seconds']:.1f} s",
             describe_sources(result), format_table(result, top)]
    lines += _admission_note(result)
    if result.best is None:
        return "\n".join(lines)
    b = result.point(result.best)
    lines.append(f"best: {b['label']} x {b['replicas']} replica(s) at {b['concurrency_per_engine']} clients per "
                 f"engine ({b['concurrency_total']} in all): {b['tokens_per_s_per_gpu']:.1f} tok/s per GPU "
                 f"({b['tokens_per_s_total']:.0f} tok/s in all), {b['tokens_per_s_per_user']:.1f} tok/s per user, "
                 f"TTFT {b['ttft_ms']:.1f} ms, TPOT {b['tpot_ms']:.2f} ms")
    lines += _load_notes(result, b)
    lines += _memory_note(result)
    if result.tied:
        names = [result.results[i].layout.label for i in result.tied]
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        lines.append(f"  tied with {shown} (the same numbers: their other settings do not bind at this load)")
    spec = info.get("speculation")
    if spec is not None:
        k = result.best_result.layout.spec_tokens
        acc = ", ".join(f"k={kk}: {a:g}" for kk, a in spec["acceptance"].items())
        lines.append(f"  speculative decoding searched (draft counts {', '.join(map(str, spec['spec_tokens']))}); "
                     + (f"the best drafts {k} token(s) a step at an acceptance of "
                        f"{result.best_result.layout.tokens_per_step:g} tokens per decode row and step"
                        if k else "the best does not speculate")
                     + f"; acceptance {acc}: {spec['acceptance_source']}")
    if result.runner_up is not None:
        n = result.point(result.runner_up)
        lines.append(f"  beats the next best, {n['label']} ({n['tokens_per_s_per_gpu']:.1f} tok/s per GPU at "
                     f"C={n['concurrency_per_engine']}), by {result.margin:+.1%}" + _close_margin_note(result.margin))
    lines += [_describe_verification(v) for v in result.verification]
    lines.append("  " + result.launch_command())
    return "\n".join(lines)


def _memory_note(result) -> list:
    """The best layout's memory per GPU as the engine reports it at start-up (vLLM: 'GPU KV cache
    size: N tokens', 'Maximum concurrency for L tokens per request: Xx'; SGLang: max_total_num_tokens),
    to check the sizing against a first launch."""
    from .layouts import _kv_tokens
    dep = result.best_candidate.deployment
    m, mml = dep.plan.memory, int(dep.scenario.engine["max_model_len"])
    held = _kv_tokens(dep, mml)
    logs = ("SGLang's max_total_num_tokens, its --mem-fraction-static the weights' and this KV cache's share of "
            "HBM" if result.engine == "sglang" else "vLLM's 'GPU KV cache size' and 'Maximum concurrency'")
    plain = not m.get("kv_window_bytes_per_token") and not m.get("recurrent_state_bytes_per_request")
    tokens = (f"KV cache {m['kv_capacity_tokens']:,.0f} tokens a rank, " if plain else   # hybrid / windowed: the
              "KV cache (sliding windows and recurrent states as held) for ")          # raw token law compares to nothing
    return [f"  per GPU: weights {m['weights_bytes'] / 2 ** 30:.1f} GiB, {tokens}{held / mml:.1f} requests of "
            f"max_model_len {mml} (what the engine logs at start-up: {logs})"]


def _load_notes(result, b) -> list:
    """What the best point's load means: clients beyond the requests an engine holds at once
    (max_num_seqs, SGLang's max_running_requests, per data-parallel rank) only queue, keeping every
    step full while their wait adds to TTFT, so a larger --concurrency finds no more there; below
    it, the sweep's largest level may be short of the layout's best."""
    layout, c = result.best_result.layout, b["concurrency_per_engine"]
    held = layout.max_num_seqs * layout.dp
    limit = "max_running_requests" if getattr(layout, "engine", "vllm") == "sglang" else "max_num_seqs"
    if c > held:
        note = (f"  ({c} clients per engine is more than the {held} requests it holds at once ({limit} "
                f"{layout.max_num_seqs}{f' x dp {layout.dp}' if layout.dp > 1 else ''}): the other {c - held} "
                "queue, keeping every step full while their wait adds to TTFT")
        if result.ttft_target is None:
            note += "; with no --ttft-ms target nothing bounds that wait: give one to size for a TTFT"
        return [note + ")"]
    if c == int(result.best_result.concurrency.max()):
        return ["  (at the sweep's largest concurrency: a larger --concurrency may find more)"]
    return []


# A margin below this is within what the measurements themselves repeat to: the same deployment's
# runs differ by a median 3.3% in mean TPOT on the development set (accuracy.repeat_spread,
# experiments/results/accuracy-simulate.md), so such a ranking is not one to act on alone.
CLOSE_MARGIN = 0.02


def _close_margin_note(margin) -> str:
    """The caveat printed after a best layout's margin over the next best, '' where it is clear."""
    if margin is None or not abs(margin) < CLOSE_MARGIN:
        return ""
    return (f" (under {CLOSE_MARGIN:.0%}: less than measured runs of one deployment differ by, so choose between "
            "the two on other grounds)")


def _admission_note(result) -> list:
    """The fixed part of every TTFT in the table: the request's host admission latency, from the
    registry (its per-chip values, the same for every layout of the search)."""
    if not result.results:
        return []
    from .size import admission_latency
    coefs = result.candidates[result.results[0].index].deployment.coefficients
    adm = admission_latency(coefs, result.workload.mean_isl)
    if adm <= 0:
        return []
    return [f"every TTFT holds the request's host admission latency, {adm * 1e3:.1f} ms (the registry's "
            "host_admission_per_request + _per_token x prompt tokens): it delays the request, not the engine"]


def _describe_verification(v: dict) -> str:
    """One line: the best (or runner-up) layout re-run under the serving simulation."""
    head = f"  serving simulation of {v['label']} @ C={v['concurrency_per_engine']}"
    if v.get("serve") is None:
        return f"{head}: refused ({v['error']})"
    a, b = v["steady"], v["serve"]
    return (f"{head}: TTFT {b['ttft_ms']:.1f} ms (steady {a['ttft_ms']:.1f}), TPOT {b['tpot_ms']:.2f} ms "
            f"(steady {a['tpot_ms']:.2f}), {b['tokens_per_s_per_gpu']:.1f} tok/s per GPU (steady "
            f"{a['tokens_per_s_per_gpu']:.1f}); " + ("meets the targets" if v["serve_meets_targets"]
                                                    else "MISSES the targets"))


def write_outputs(result, args, report) -> None:
    """--write-scenario (when a layout meets the targets), --plot and --json, each announced on
    ``report``; ``--json -`` writes the JSON to stdout."""
    from .size import plot
    if args.write_scenario and result.best is not None:
        path = Path(args.write_scenario)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(result.scenario_yaml())
        print(f"wrote {path} ({result.serve_command(path)} simulates the best point again)", file=report)
    elif args.write_scenario:       # used to be skipped without a word
        print(f"jaxprice size: --write-scenario {args.write_scenario} not written: no layout meets the targets",
              file=sys.stderr)
    if args.plot:
        print(f"wrote {plot(result, args.plot)}", file=report)
    if args.json:
        text = json.dumps(result.as_dict(), indent=1, default=float)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(text)
            print(f"wrote {args.json}", file=report)
