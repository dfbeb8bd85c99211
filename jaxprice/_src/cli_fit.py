"""`jaxprice fit CSV`: fit registry coefficients to measurements and write them as a set.

    jaxprice fit measured.csv --free hbm_derate --free 'gemm_m_half_*@hardware:2' \\
        --free host_output_token@global --holdout 0.25 --seed 0 --steps 400 --out fitted.yaml
    jaxprice fit steps.csv --target step --free 'attention_decode_rate*:3' --out fitted.yaml

CSV: mean-TPOT measurements in the layout of shared/measured/inferencex_vllm_dev.csv (target
``tpot``: NoOverlap of C decode rows at context isl + osl // 2, plus host_output_token; with
``--batch-rule capped`` or ``interleaved`` the batches ``jaxprice accuracy --batch-rule`` prices), or
step times with columns scenario, requests, context, value, unit (target ``step``). ``--free``
takes ``PATTERN[@SCOPE][:BOUND]``: an fnmatch pattern over coefficient names, a scope of
comma-separated hardware, model, tp, ep, nodes_spanned (or ``global``; default hardware) and
a factor bound (default 2). Deployments are held out whole for early stopping. Prints the
loss and TPOT/step MAPE before and after, per split, and every fitted multiplier; writes the
set with ``--out`` (load it with ``load_deployment(..., extra_coefficient_files=[path])``).
A progress bar goes to stderr.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

from .errors import refuse


def add_parser(subparsers):
    import argparse
    p = subparsers.add_parser("fit", help="fit registry coefficients to measured TPOT or step times",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", help="measurement CSV (mean-TPOT layout, or step layout with --target step)")
    p.add_argument("--free", action="append", default=[], metavar="PATTERN[@SCOPE][:BOUND]",
                   help="coefficients to fit (repeatable), e.g. hbm_derate, 'gemm_m_half_*@hardware:2', "
                        "host_output_token@global")
    p.add_argument("--target", choices=("auto", "tpot", "step"), default="auto",
                   help="what the CSV measures (default: from its columns)")
    p.add_argument("--estimate", choices=("no_overlap", "overlap"), default="no_overlap")
    p.add_argument("--batch-rule", metavar="RULE", default="anchor",
                   help="TPOT layout: how each point's batches are built, as in 'jaxprice accuracy': anchor "
                        "(default: C decode rows), capped (the engine's resident batch) or interleaved (the "
                        "resident batch plus the steady-state prefill chunks)")
    p.add_argument("--holdout", default="0.25", help="fraction of deployments held out for early stopping")
    p.add_argument("--seed", default="0")
    p.add_argument("--steps", default="400")
    p.add_argument("--learning-rate", default="0.05")
    p.add_argument("--patience", default="10", help="evaluations without improvement before stopping")
    p.add_argument("--eval-every", default="5")
    p.add_argument("--loss", choices=("l2", "huber"), default="l2")
    p.add_argument("--huber-delta", default="0.1")
    p.add_argument("--weighting", choices=("point", "deployment"), default="point")
    p.add_argument("--temperature", default=None, help="fit in smooth mode at this temperature (default: exact)")
    p.add_argument("--deployment", action="append", default=None, metavar="NAME",
                   help="fit only these deployments (repeatable; TPOT layout)")
    p.add_argument("--scenario-dir", action="append", default=None, metavar="DIR",
                   help="where to look for <deployment>.yaml scenarios (default: the bundled ones)")
    p.add_argument("--out", default=None, help="write the fitted coefficient set here (YAML)")
    p.add_argument("--name", default=None, help="the set's name (default: the file's stem)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _header(path):
    try:
        with open(path, newline="") as fh:
            return next(csv.reader(fh), [])
    except (FileNotFoundError, IsADirectoryError):
        refuse("file not found", file=str(path))
    except UnicodeDecodeError:
        refuse("not a text CSV file", file=str(path))


def _mape(pred, meas):
    return float(np.mean(np.abs(pred / meas - 1.0)))


def run(args) -> int:
    from . import fit as F
    from .accuracy import check_batch_rule
    from .cli_price import parse_float, parse_int
    from .progress import Progress
    check_batch_rule(args.batch_rule, field="--batch-rule")

    if not args.free:
        refuse("give at least one --free PATTERN[@SCOPE][:BOUND] (e.g. --free hbm_derate)", field="--free")
    free = [F.Free.parse(f) for f in args.free]
    holdout = parse_float(args.holdout, flag="--holdout", minimum=0.0)
    if holdout >= 1:
        refuse("must be below 1", field="--holdout", value=holdout)
    seed = parse_int(args.seed, flag="--seed", minimum=0)
    steps = parse_int(args.steps, flag="--steps", minimum=0)
    lr = parse_float(args.learning_rate, flag="--learning-rate", minimum=0.0)
    if lr <= 0:
        refuse("must be positive", field="--learning-rate", value=lr)
    patience = parse_int(args.patience, flag="--patience", minimum=1)
    eval_every = parse_int(args.eval_every, flag="--eval-every", minimum=1)
    delta = parse_float(args.huber_delta, flag="--huber-delta", minimum=0.0)
    if delta <= 0:
        refuse("must be positive", field="--huber-delta", value=delta)
    temperature = None if args.temperature is None else parse_float(args.temperature, flag="--temperature",
                                                                     minimum=0.0)
    if args.out is not None and Path(args.out).is_dir():
        refuse("is a folder; give a file name for the fitted set", field="--out", value=args.out)

    header = _header(args.csv)
    layout = "step" if "requests" in header else "tpot" if "quantity" in header else None
    target = layout if args.target == "auto" else args.target
    if layout is None:
        refuse("neither the mean-TPOT layout (a 'quantity' column) nor the step layout (scenario, requests, "
               "context, value, unit)", file=args.csv, field="header", value=",".join(header[:6]))
    if target != layout:
        refuse(f"--target {target} needs the {target} layout, but this CSV has the {layout} layout",
               file=args.csv, field="--target", value=target)

    refused = []
    if layout == "tpot":
        obs, refused, points = F.observations_from_measurements(
            args.csv, scenario_dirs=args.scenario_dir, estimate=args.estimate, deployments=args.deployment,
            batch_rule=args.batch_rule)
        if refused:
            print(f"{len(refused)} point(s) the kernel refused are left out of the fit:", file=sys.stderr)
            for i, reason in refused[:5]:
                print(f"  line {points[i].row} ({points[i].deployment}, C={points[i].concurrency}): {reason}",
                      file=sys.stderr)
        if not obs:
            refuse("no point of the CSV could be priced", file=args.csv)
    else:
        if args.deployment:
            refuse("--deployment selects deployments of the mean-TPOT layout only", field="--deployment")
        if args.batch_rule != "anchor":
            refuse("--batch-rule applies to the mean-TPOT layout only (a step CSV gives its batches)",
                   field="--batch-rule", value=args.batch_rule)
        obs = F.read_step_measurements(args.csv, estimate=args.estimate)

    bars = {}

    def progress(done, total, stage="descent", **info):
        if args.quiet:
            return
        if stage not in bars:
            for b in bars.values():
                b.close()
            bars[stage] = Progress(total, "compile" if stage == "compile" else "fit")
        bars[stage].update(done, total, **info)

    try:
        res = F.fit_coefficients(obs, free, holdout=holdout, seed=seed, steps=steps, learning_rate=lr,
                                 eval_every=eval_every, patience=patience, temperature=temperature,
                                 loss=args.loss, huber_delta=delta, weighting=args.weighting,
                                 callback=progress)
    finally:
        for b in bars.values():
            b.close()

    what = "TPOT" if target == "tpot" else "step time"
    by_name = {o.name: o for o in obs}
    print(f"{args.csv}: {sum(o.points for o in obs)} points in {len(obs)} deployment(s); "
          f"train {len(res.train)}, held out {len(res.held_out)} (by deployment, seed {seed})")
    print(f"fit: {res.settings['loss']} loss on log {what} ({args.estimate}, "
          f"{'exact mode' if temperature is None else f'temperature {temperature:g}'}), "
          f"{len(res.keys)} free value(s); {res.stopped}; kept step {res.best_step}"
          + (f"; batch rule {args.batch_rule}" if target == "tpot" else ""))
    print(f"{'split':<10}{'deployments':>12}{'points':>8}{'loss before':>13}{'loss after':>12}"
          f"{'MAPE before':>13}{'MAPE after':>12}")
    for split, names, key in (("train", res.train, "train"), ("held out", res.held_out, "held_out")):
        if not names:
            continue
        sel = [by_name[n] for n in names]
        meas = np.concatenate([o.measured for o in sel])
        before = np.concatenate([res.predict(o, fitted=False) for o in sel])
        after = np.concatenate([res.predict(o) for o in sel])
        print(f"{split:<10}{len(names):>12}{len(meas):>8}{res.initial[key]:>13.5f}{res.final[key]:>12.5f}"
              f"{_mape(before, meas):>13.1%}{_mape(after, meas):>12.1%}")
    hits = res.at_bound()
    from .resolve import si_factor
    print(f"{'coefficient @ scope':<56}{'start':>12}{'fitted':>12}{'x':>8}  units")
    for e in sorted(res.entries(), key=lambda e: (e["name"], sorted((k, str(v)) for k, v in e["scope"].items()))):
        label = e["name"] + "@" + ",".join(f"{k}={v}" for k, v in e["scope"].items())
        f = si_factor(e["name"], e["units"])
        print(f"{label:<56}{e['start'] / f:>12.6g}{e['value'] / f:>12.6g}{e['multiplier']:>8.3f}  {e['units']}")
    if hits:
        print("at a bound: " + ", ".join(f"{k} ({v})" for k, v in sorted(hits.items())))
    if args.out:
        data = f"{args.csv} (mean TPOT, batch rule '{args.batch_rule}')" if target == "tpot" else str(args.csv)
        path = F.write_coefficient_set(res, args.out, name=args.name, data=data)
        print(f"wrote {path} (values in registry units; load with extra_coefficient_files=[...])")
    return 0
