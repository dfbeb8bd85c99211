"""`jaxprice sweep SCENARIO`: price a grid of steps, write it to CSV, draw heat maps.

    jaxprice sweep deepseek-v3-h200-fp8-sglang-tp8 --decode 4,8,...,252 --context 512,1024,2048,...,32768 \\
        --prefill-chunk 0,512,2048 --out grid.csv --heatmap grid.png

Each grid point is one step: D decode requests (1 token each, context c after the step) plus
one prefill chunk of P tokens (computed 0; P = 0: none; a chunk of at most the decode
threshold is a decode: with the default threshold, 8, the reference kernel's; vLLM's own is 1
without speculation, ``--decode-threshold 1``). The grid is priced by the vmapped
kernel (``price_many``) in chunks of one padding (one compilation), with a progress bar on
stderr. The CSV has one row per point, prefill chunk outermost and context innermost, with
times in the unit named in each column's header (``sm_ms``...). Without ``--out`` the CSV
goes to stdout.
"""

from __future__ import annotations

import csv
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from .cli_price import (MAX_STEP_REQUESTS, UNITS, add_common_arguments, check_finite, check_limits, check_tokens,
                        common_options, describe_deployment, engine_limits, load_scenario_deployment, mode_text,
                        parse_int, parse_int_list, refuse_repeats)
from . import compile_cache
from .batchfile import DEFAULT_DECODE_THRESHOLD
from .errors import refuse
from .outputs import check_image, check_output_file
from .plan import RESOURCES, Batch
from .progress import Progress

DEFAULT_CHUNK = 2048
# The most grid points one sweep prices: 2**22 (~4.2 million) points hold ~0.3 GB of results and a CSV of
# ~0.7 GB, and take tens of minutes; the product of the three list lengths can otherwise reach 10**13.
MAX_GRID_POINTS = 1 << 22
# The most padded rows in one vmapped call (points per call x rows per step): past it --chunk is
# lowered (said on stderr); 2**22 rows take ~1.5 GB.
MAX_CALL_ROWS = 1 << 22
ESTIMATES = ("no_overlap", "overlap")


def add_parser(subparsers):
    p = subparsers.add_parser(
        "sweep", help="price a grid of decode count x context x prefill chunk; CSV and heat maps",
        description="Price every step of a grid: D decode requests at context c plus one prefill chunk of P "
                    "tokens (P = 0: none). Lists take commas and '...' continuing a progression: "
                    "1,2,4,...,256 or 16,32,...,1024.")
    add_common_arguments(p)
    p.add_argument("--decode", metavar="LIST", default=None,
                   help="decode request counts (default 1,2,4,... and the deployment's max_num_seqs, less one beside a "
                        "prefill chunk)")
    p.add_argument("--context", metavar="LIST", default=None,
                   help="contexts after the step, in tokens (default 512,1024,... up to max_model_len)")
    p.add_argument("--prefill-chunk", metavar="LIST", default="0",
                   help="prefill chunk sizes in tokens, 0 for none (default 0)")
    p.add_argument("--out", metavar="FILE.csv", default=None, help="write the grid here (default: stdout)")
    p.add_argument("--heatmap", metavar="FILE.png", default=None,
                   help="draw the bottleneck and the time per decoded token over decode x context, "
                        "one row per prefill chunk")
    p.add_argument("--heatmap-prefill", metavar="LIST", default=None,
                   help="the prefill chunks to draw (default: all)")
    p.add_argument("--estimate", default="no_overlap", metavar="no_overlap|overlap",
                   help="the estimate behind the time per decoded token (default no_overlap)")
    p.add_argument("--chunk", metavar="N", default=str(DEFAULT_CHUNK),
                   help=f"grid points per vmapped call (default {DEFAULT_CHUNK})")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(command="sweep")
    return p


def grid_axes(args, dep):
    lim = engine_limits(dep)
    prefill = parse_int_list(args.prefill_chunk, flag="--prefill-chunk", minimum=0)
    if args.decode is None:
        # powers of two and the limit itself, one request fewer beside a prefill chunk (the default
        # ran one past max_num_seqs with --prefill-chunk 0,512 and was refused)
        top = lim.get("max_num_seqs", 256) - (1 if any(prefill) else 0)
        decode = [1 << k for k in range(top.bit_length()) if 1 << k < top] + [top] if top >= 1 else [0]
    else:
        decode = parse_int_list(args.decode, flag="--decode", minimum=0)
    if args.context is None:
        top = lim.get("max_model_len", 32768)
        context = [1 << k for k in range(9, top.bit_length()) if 1 << k <= top] or [top]
    else:
        context = parse_int_list(args.context, flag="--context", minimum=1)
    if args.context is not None and not any(decode):    # else every context a copy of the same step
        refuse("is the context of the decode requests, and --decode holds none (prefill chunks only, computed 0): "
               "every context would price the same step", field="--context", value=args.context)
    if not any(decode):         # the default contexts too: 7 rows per chunk, each the same step
        context = context[:1]
    check_tokens(context, flag="--context")
    check_tokens(prefill, flag="--prefill-chunk")
    for flag, values in (("--decode", decode), ("--context", context), ("--prefill-chunk", prefill)):
        refuse_repeats(values, "a grid axis lists a value twice", flag=flag)
    total = len(decode) * len(context) * len(prefill)
    if total > MAX_GRID_POINTS:
        refuse(f"the grid has {len(decode)} x {len(context)} x {len(prefill)} = {total} points, above jaxprice's cap "
               f"of {MAX_GRID_POINTS} points per sweep; use coarser lists", field="--decode x --context x "
               "--prefill-chunk", value=total)
    steps = max(decode) + (1 if max(prefill) > 0 else 0)
    if steps > MAX_STEP_REQUESTS:
        refuse(f"{steps} requests in one step exceed jaxprice's cap of {MAX_STEP_REQUESTS} requests per step "
               "(--ignore-limits or not)", field="--decode", value=max(decode))
    if 0 in decode and 0 in prefill:
        refuse("the grid point with 0 decode requests and no prefill chunk is an empty step; drop 0 from "
               "--decode or from --prefill-chunk", field="--decode", value=0)
    if not args.ignore_limits:
        has_p = max(prefill) > 0
        check_limits(dep, requests=max(decode) + has_p, tokens=max(decode) + max(prefill),
                     context=max(context) if max(decode) else 1,
                     flag_requests="--decode" + (" plus a prefill chunk" if has_p else ""),
                     flag_tokens="--prefill-chunk" if has_p else "--decode", flag_context="--context",
                     tokens_value=max(prefill) if has_p else max(decode),
                     tokens_how=f" ({max(decode)} decode + a {max(prefill)}-token chunk)" if has_p else "")
        if "max_model_len" in lim and max(prefill) > lim["max_model_len"]:
            check_limits(dep, requests=0, tokens=0, context=max(prefill), flag_requests="", flag_tokens="",
                         flag_context="--prefill-chunk")
    return decode, context, prefill


def grid_batches(template: Batch, decode, context, prefill, points, threshold):
    """A stacked Batch for grid points (flat indices into prefill x decode x context)."""
    nd, nc = len(decode), len(context)
    p_idx, rem = np.divmod(points, nd * nc)
    d_idx, c_idx = np.divmod(rem, nc)
    D = np.asarray(decode, dtype=float)[d_idx][:, None]
    C = np.asarray(context, dtype=float)[c_idx][:, None]
    P = np.asarray(prefill, dtype=float)[p_idx][:, None]
    rows = template.rows
    slot = rows - 1 if max(prefill) > 0 else rows        # the prefill chunk's row (the last one)
    r = np.arange(rows)[None, :]
    is_decode = r < D
    is_prefill = (r == slot) & (P > 0)
    sched = np.where(is_decode, 1.0, np.where(is_prefill, P, 0.0))
    comp = np.where(is_decode, C - 1.0, 0.0)
    like = np.asarray(template.scheduled).dtype
    return dataclasses.replace(
        template, scheduled=sched.astype(like), computed=comp.astype(like), prompt_len=(sched + comp).astype(like),
        mask=is_decode | is_prefill, decode_threshold=np.full(len(points), float(threshold),
                                                              dtype=np.asarray(template.decode_threshold).dtype))


def price_grid(dep, decode, context, prefill, *, threshold, temperature=None, chunk=DEFAULT_CHUNK, callback=None):
    """Price every grid point. Returns a dict of arrays [P, D, C]: resources [.., 5] (s),
    overlap, no_overlap (s), bottleneck (index into RESOURCES)."""
    from .step import price_many
    rows = max(decode) + (1 if max(prefill) > 0 else 0)
    template = Batch.from_requests([1.0], [0.0], pad_to=max(rows, 1), decode_threshold=threshold, source="grid")
    total = len(prefill) * len(decode) * len(context)
    chunk = max(1, min(chunk, total))
    out_res = np.zeros((total, len(RESOURCES)))
    out_ov, out_no = np.zeros(total), np.zeros(total)
    out_b = np.zeros(total, dtype=int)
    for start in range(0, total, chunk):
        pts = np.arange(start, start + chunk)
        n = min(chunk, total - start)
        pts = np.minimum(pts, total - 1)          # the last chunk repeats its last point: one shape
        r = price_many(dep.plan, dep.coefficients, grid_batches(template, decode, context, prefill, pts, threshold),
                       temperature=temperature)
        out_res[start:start + n] = np.asarray(r.resources)[:n]
        out_ov[start:start + n] = np.asarray(r.overlap)[:n]
        out_no[start:start + n] = np.asarray(r.no_overlap)[:n]
        out_b[start:start + n] = np.asarray(r.bottleneck)[:n]
        if callback is not None:
            callback(start + n, total)
    shape = (len(prefill), len(decode), len(context))
    return {"resources": out_res.reshape(shape + (len(RESOURCES),)), "overlap": out_ov.reshape(shape),
            "no_overlap": out_no.reshape(shape), "bottleneck": out_b.reshape(shape)}


def per_decoded_token(grid, decode, estimate):
    d = np.asarray(decode, dtype=float)[None, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d > 0, grid[estimate] / np.where(d > 0, d, 1.0), np.nan)


def write_csv(stream, grid, decode, context, prefill, *, units, estimate, callback=None):
    """The grid as CSV rows on ``stream``; ``callback(rows written, total)`` after each decode count's
    rows (a grid of millions of points takes as long to write as to price)."""
    k = UNITS[units]
    total, done = len(decode) * len(context) * len(prefill), 0
    tpt = per_decoded_token(grid, decode, estimate)
    w = csv.writer(stream, lineterminator="\n")
    w.writerow(["decode", "context", "prefill_chunk", "requests", "tokens"]
               + [f"{r}_{units}" for r in RESOURCES]
               + [f"overlap_{units}", f"no_overlap_{units}", "bottleneck", f"{estimate}_per_decoded_token_{units}"])
    res, ov, no, b = grid["resources"], grid["overlap"], grid["no_overlap"], grid["bottleneck"]
    for i, p in enumerate(prefill):
        for j, d in enumerate(decode):
            for m, c in enumerate(context):
                t = tpt[i, j, m]
                w.writerow([d, c, p, d + (p > 0), d + p] + [f"{v * k:.12g}" for v in res[i, j, m]]
                           + [f"{ov[i, j, m] * k:.12g}", f"{no[i, j, m] * k:.12g}", RESOURCES[int(b[i, j, m])],
                              "" if not np.isfinite(t) else f"{t * k:.12g}"])
            done += len(context)
            if callback is not None:
                callback(done, total)


def run(args) -> int:
    threshold, temperature, chunk = _options(args)
    dep = load_scenario_deployment(args.scenario, args.pool, args)
    _check_out_is_not_the_scenario(args, dep)
    axes = grid_axes(args, dep)
    chunk = _call_chunk(chunk, axes)
    draw = _heatmap_rows(args, axes[2])
    _announce(dep, axes, threshold, temperature)
    grid, cost = _price(args, dep, axes, threshold, temperature, chunk)
    _check_grid_finite(grid, axes)
    _write_grid(args, grid, axes)
    _summary(args, grid, axes, cost)
    if args.heatmap:
        _draw_heatmaps(args, dep, grid, axes, draw, threshold, temperature)
    return 0


def _options(args) -> tuple:
    """(decode threshold, temperature, points per call), checked, then the output paths, all before
    the deployment loads."""
    threshold, temperature = common_options(args)
    threshold = DEFAULT_DECODE_THRESHOLD if threshold is None else threshold
    if args.estimate not in ESTIMATES:
        refuse("unknown estimate; expected no_overlap or overlap", field="--estimate", value=args.estimate)
    chunk = parse_int(args.chunk, flag="--chunk", minimum=1)
    writes_csv = args.out not in (None, "-")
    # an output onto an input or onto the other output, said as such before its suffix is judged
    if writes_csv and Path(str(args.scenario)).is_file() and \
            Path(args.out).resolve() == Path(str(args.scenario)).resolve():
        refuse("is the scenario file being priced; name another file for the CSV", field="--out", value=args.out)
    if args.heatmap is not None and writes_csv and Path(args.out).resolve() == Path(args.heatmap).resolve():
        refuse("is the --heatmap path too: the image would overwrite the CSV", field="--out", value=args.out)
    check_image(args.heatmap, "--heatmap")
    if writes_csv:
        check_output_file(args.out, flag="--out", what="CSV", writes="CSV")
    return threshold, temperature, chunk


def _check_out_is_not_the_scenario(args, dep) -> None:
    """--out must not name the scenario file being priced (the CSV would replace it)."""
    scen_path = getattr(dep.scenario, "path", None)
    if args.out not in (None, "-") and scen_path and Path(str(scen_path)).is_file() \
            and Path(args.out).resolve() == Path(str(scen_path)).resolve():
        refuse("is the scenario file being priced; name another file for the CSV", field="--out", value=args.out)


def _call_chunk(chunk, axes) -> int:
    """The grid points per vmapped call: --chunk, lowered (said on stderr) to keep a call within
    MAX_CALL_ROWS padded rows."""
    decode, context, prefill = axes
    pad = max(1, max(decode) + (1 if max(prefill) > 0 else 0))
    if min(chunk, len(decode) * len(context) * len(prefill)) * pad > MAX_CALL_ROWS:
        chunk = max(1, MAX_CALL_ROWS // pad)
        print(f"note: --chunk lowered to {chunk} grid points per call: steps of {pad} rows, at most "
              f"{MAX_CALL_ROWS} rows per vmapped call", file=sys.stderr)
    return chunk


def _heatmap_rows(args, prefill) -> list:
    """The prefill chunks the heat maps draw: --heatmap-prefill (each on the grid; only with --heatmap),
    else all."""
    if args.heatmap_prefill is None:
        return prefill
    draw = parse_int_list(args.heatmap_prefill, flag="--heatmap-prefill", minimum=0)
    for v in draw:
        if v not in prefill:
            refuse(f"is not on the grid's --prefill-chunk ({', '.join(map(str, prefill))})",
                   field="--heatmap-prefill", value=v)
    if args.heatmap is None:        # else ignored silently
        refuse("picks the heat maps' rows: it needs --heatmap", field="--heatmap-prefill",
               value=args.heatmap_prefill)
    return draw


def _announce(dep, axes, threshold, temperature) -> None:
    """On stderr: prefill chunks priced as decodes, the deployment and the grid."""
    decode, context, prefill = axes
    small = [p for p in prefill if 0 < p <= threshold]
    if small:
        print(f"note: a prefill chunk of at most the decode threshold {threshold} tokens "
              f"({', '.join(map(str, small))}) is priced as a decode (vLLM's threshold is 1 without speculation: "
              "--decode-threshold 1 prices it as a prefill)", file=sys.stderr)
    print(f"{dep.scenario.name}: {describe_deployment(dep)}", file=sys.stderr)
    print(f"grid: {len(decode)} decode counts x {len(context)} contexts x {len(prefill)} prefill chunks = "
          f"{len(decode) * len(context) * len(prefill)} steps; {mode_text(temperature)}; decode threshold {threshold}",
          file=sys.stderr)


def _price(args, dep, axes, threshold, temperature, chunk) -> tuple:
    """(the priced grid, (seconds, kernel compiles, of them loaded from the compile cache)), with a progress
    bar unless --quiet."""
    from .stack import kernel_compiles
    decode, context, prefill = axes
    t0, compiled, loaded = time.perf_counter(), kernel_compiles(), compile_cache.loaded()
    with Progress(len(decode) * len(context) * len(prefill), "sweep", enabled=not args.quiet) as bar:
        grid = price_grid(dep, decode, context, prefill, threshold=threshold, temperature=temperature,
                          chunk=chunk, callback=lambda done, tot: bar.update(done))
    elapsed, compiled, loaded = time.perf_counter() - t0, kernel_compiles() - compiled, compile_cache.loaded() - loaded
    return grid, (elapsed, compiled, loaded)


def _check_grid_finite(grid, axes) -> None:
    """Never write an inf or NaN price: refuse naming the first grid point whose price is not finite."""
    decode, context, prefill = axes
    points = [f"decode {d}, context {c}, prefill chunk {q}" for q in prefill for d in decode for c in context] \
        if not np.isfinite(grid["no_overlap"]).all() or not np.isfinite(grid["resources"]).all() else []
    check_finite(grid["resources"].reshape(-1, len(RESOURCES)), grid["overlap"].reshape(-1),
                 grid["no_overlap"].reshape(-1), labels=points, what="grid point")


# grids of at least this many points show a progress bar while the CSV is written (2 million points took
# 25 s to write after the pricing bar had reached its end, without a word)
CSV_PROGRESS_POINTS = 100_000


def _write_grid(args, grid, axes) -> None:
    """The CSV, to stdout or to --out (its folder made), streamed: not held in memory whole first
    (0.7 GB at the cap). Written in place, never to a side file renamed over --out: that would replace
    a device (--out /dev/null) or a symbolic link with a regular file."""
    decode, context, prefill = axes
    total = len(decode) * len(context) * len(prefill)
    with Progress(total, "csv", enabled=not args.quiet and total >= CSV_PROGRESS_POINTS) as bar:
        def write(stream):
            write_csv(stream, grid, decode, context, prefill, units=args.units, estimate=args.estimate,
                      callback=lambda done, _total: bar.update(done))
        if args.out in (None, "-"):
            write(sys.stdout)
            return
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "w", newline="") as fh:
                write(fh)
        except OSError as err:
            refuse(f"cannot write the CSV: {err.strerror}", file=args.out)


def _summary(args, grid, axes, cost) -> None:
    """On stderr: the steps priced, in what time and compiles, each bottleneck's share and the CSV written."""
    total = len(axes[0]) * len(axes[1]) * len(axes[2])
    counts = np.bincount(grid["bottleneck"].reshape(-1), minlength=len(RESOURCES))
    share = ", ".join(f"{r} {c / total:.0%}" for r, c in zip(RESOURCES, counts) if c)
    elapsed, compiled, loaded = cost
    compiles = compile_cache.compiles_text(compiled, loaded, "kernel compile(s)")
    print(f"priced {total} steps in {elapsed:.1f} s ({compiles}: one per plan structure, padding and mode, shared by "
          f"every deployment of the model graph); bottleneck: {share}"
          + (f"; wrote {args.out}" if args.out not in (None, "-") else ""), file=sys.stderr)


def _draw_heatmaps(args, dep, grid, axes, draw, threshold, temperature) -> None:
    """--heatmap: the bottleneck and the time per decoded token over decode x context, a row per drawn chunk."""
    from .figures import plot_sweep_heatmaps
    decode, context, prefill = axes
    sel = [prefill.index(v) for v in draw]
    tpt = per_decoded_token(grid, decode, args.estimate)
    label = ("NoOverlap" if args.estimate == "no_overlap" else "Overlap") + " per decoded token"
    plot_sweep_heatmaps(decode, context, [prefill[i] for i in sel], grid["bottleneck"][sel], tpt[sel],
                        path=args.heatmap, units=args.units, per_token_label=label,
                        title=f"{dep.scenario.name}: {mode_text(temperature)}, decode threshold {threshold}")
    print(f"wrote {args.heatmap}", file=sys.stderr)
