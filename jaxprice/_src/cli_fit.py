"""`jaxprice fit CSV`: fit registry coefficients to measurements and write them as a set.

    jaxprice fit measured.csv --free hbm_derate --free 'gemm_m_half_*@hardware:2' \\
        --free host_output_token@global --holdout 0.25 --seed 0 --steps 400 --out fitted.yaml
    jaxprice fit measured.csv --free ... --holdout model --prior cv --out fitted.yaml
    jaxprice fit steps.csv --target step --free 'attention_decode_rate*:3' --out fitted.yaml

CSV: mean-TPOT measurements in the layout of shared/measured/inferencex_vllm_dev.csv (target
``tpot``: NoOverlap of C decode rows at context isl + osl // 2, plus host_output_token; with
``--batch-rule capped`` or ``interleaved`` the batches ``jaxprice accuracy --batch-rule`` prices; with
``--batch-rule simulate --target tpot,ttft`` each point's closed-loop run of the serving simulation,
its schedule built once, the fit re-pricing its steps: log-errors of mean TPOT and mean TTFT;
``--target ttft`` alone also reads a mean_ttft row with no mean_tpot row as a point), or
step times with columns scenario, requests, context, value, unit (target ``step``). ``--free``
takes ``PATTERN[@SCOPE][:BOUND]``: an fnmatch pattern over coefficient names, a scope of
comma-separated hardware, model, tp, ep, nodes_spanned (or ``global``; default hardware) and
a factor bound (default 2); physical bounds apply on top (a derate or GEMM efficiency at most
1, a KV read rate at most the chip's HBM peak).

``--holdout FRACTION`` holds that share of the deployments out for early stopping.
``--holdout model`` (leave one model out, each in turn), ``chip`` or ``deployment`` (seeded
splits, ``--cv-seeds``) cross-validates instead: per held-out group, TPOT MAPE and shape error
with the bundled registry and with the fit, on the held-out deployments and in sample; then
fits on every deployment. ``--prior`` is the strength of the prior that pulls each free
coefficient toward its registry value in log space (``cv``: chosen among ``--priors`` by the
cross-validation; the default with a cross-validating --holdout, else 0). Coefficients the data
cannot separate (near-null directions of the Fisher matrix) are frozen and listed. The written
set (``--out``) is scoped to the chips and models it was fitted on (``--scope-to hardware``
widens it to every model of those chips): another deployment loading it keeps the registry's
values, and ``price``, ``serve``, ``sweep``, ``optimize``, ``size`` and ``accuracy`` given it with
``--coefficients`` say what of it reaches their deployments. ``--json FILE`` (``-``: standard
output) writes what the tables print. A progress bar goes to stderr (cross-validation: its fits).
"""

from __future__ import annotations

import csv
import json
import math
import sys

import numpy as np

from .errors import refuse
from .outputs import check_output_file

SCOPE_TO = ("hardware,model", "hardware")    # --scope-to (a metavar: argparse would list 'hardware' twice)


def add_parser(subparsers):
    import argparse
    p = subparsers.add_parser("fit", help="fit registry coefficients to measured TPOT or step times",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", help="measurement CSV (mean-TPOT layout, or step layout with --target step)")
    p.add_argument("--free", action="append", default=[], metavar="PATTERN[@SCOPE][:BOUND]",
                   help="coefficients to fit (repeatable), e.g. hbm_derate, 'gemm_m_half_*@hardware:2', "
                        "host_output_token@global")
    p.add_argument("--target", default="auto",
                   help="what the CSV measures (default: from its columns): tpot or step; with --batch-rule "
                        "simulate: tpot, ttft or tpot,ttft (log-errors of mean TPOT and mean TTFT summed; ttft alone "
                        "reads a CSV of mean_ttft rows only)")
    p.add_argument("--estimate", choices=("no_overlap", "overlap"), default="no_overlap")
    p.add_argument("--batch-rule", metavar="RULE", default="anchor",
                   help="TPOT layout: how each point's batches are built, as in 'jaxprice accuracy': anchor "
                        "(default: C decode rows), capped (the engine's resident batch) or interleaved (the "
                        "resident batch plus the steady-state prefill chunks) or simulate (each point's closed-loop "
                        "run of the serving simulation, its schedule built once; the fit re-prices its steps)")
    p.add_argument("--settings", metavar="FILE.csv", default=None,
                   help="--batch-rule simulate: the engine flags each measured run passed (as 'jaxprice accuracy "
                        "--settings'; default: the bundled table of InferenceX's runs)")
    p.add_argument("--holdout", default="0.25",
                   help="a fraction of deployments held out for early stopping, or model / chip / deployment: "
                        "cross-validate by leaving one out (deployment: seeded splits, --cv-seeds)")
    p.add_argument("--cv-seeds", default=None, help="--holdout deployment: the seeds of its splits (default 0,1,2)")
    p.add_argument("--prior", default=None,
                   help="prior strength (>= 0) pulling each free coefficient toward its registry value in log "
                        "space ('inf': keep the registry), or 'cv' to choose it by the cross-validation "
                        "(default: cv with a cross-validating --holdout, else 0)")
    p.add_argument("--priors", default=None,
                   help="comma-separated strengths --prior cv tries (default 0,0.001,0.01,0.03,0.1,1,inf: inf is "
                        "the registry itself, chosen when no fit beats it on the held-out groups)")
    p.add_argument("--identify-tol", default="0.1",
                   help="freeze a coefficient when less than this share of its effect is independent of the "
                        "others' (0: never)")
    p.add_argument("--scope-to", default=None, choices=SCOPE_TO, metavar="SCOPE",
                   help="what the written entries are scoped to besides their own scope: 'hardware,model' "
                        "(default) or 'hardware'")
    p.add_argument("--method", choices=("adam", "gauss-newton"), default="adam",
                   help="the solver: projected Adam (default) or damped Gauss-Newton (converges in tens of "
                        "iterations, one compilation per deployment)")
    p.add_argument("--seed", default=None, help="the seed of the --holdout fraction's split (default 0)")
    p.add_argument("--steps", default="400")
    p.add_argument("--learning-rate", default=None, help="--method adam: its learning rate (default 0.05)")
    p.add_argument("--patience", default=None,
                   help="--method adam: evaluations without improvement before stopping (default 10)")
    p.add_argument("--eval-every", default=None, help="--method adam: steps between evaluations (default 5)")
    p.add_argument("--loss", choices=("l2", "huber"), default="l2")
    p.add_argument("--huber-delta", default=None, help="--loss huber: its delta (default 0.1)")
    p.add_argument("--weighting", choices=("point", "deployment"), default="point")
    p.add_argument("--temperature", default=None, help="fit in smooth mode at this temperature (default: exact)")
    p.add_argument("--deployment", action="append", default=None, metavar="NAME",
                   help="fit only these deployments (repeatable; TPOT layout)")
    p.add_argument("--scenario-dir", action="append", default=None, metavar="DIR",
                   help="where to look for <deployment>.yaml scenarios (default: the bundled ones)")
    p.add_argument("--out", default=None, help="write the fitted coefficient set here (YAML)")
    p.add_argument("--name", default=None, help="the set's name (default: the file's stem)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write what the tables print as JSON: the cross-validation per held-out group (registry "
                        "and fit, TPOT and TTFT), the prior chosen and every prior's criterion, the fitted values "
                        "(frozen, at a bound), and the written set's scope ('-': standard output, the tables then "
                        "on stderr); an infinite prior is the string 'inf'")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _header(path):
    from .schema import refuse_empty_name
    refuse_empty_name(path, "measurement CSV", field="csv")       # was 'file not found', naming nothing
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:        # a byte-order mark is not a column
            return [h.strip() for h in next(csv.reader(fh), [])]
    except FileNotFoundError:
        refuse("file not found", file=str(path))
    except IsADirectoryError:
        refuse("is a folder, expected a measurement CSV file", file=str(path))
    except UnicodeDecodeError:
        refuse("not a text CSV file", file=str(path))


def _mape(pred, meas):
    return float(np.mean(np.abs(pred / meas - 1.0)))


def parse_prior(text, flag):
    """A prior strength: a finite number >= 0, or 'inf' (keep the registry: the 'no fit' candidate)."""
    from .cli_price import parse_float
    return math.inf if str(text).strip().lower() in ("inf", "infinity") else parse_float(text, flag=flag, minimum=0.0)


def _floats(text, flag):
    items = [x.strip() for x in str(text).split(",")]
    if any(items) and "" in items:      # '0,,1' lost its empty entry without a word (lists elsewhere refuse it)
        refuse("has an empty entry", field=flag, value=text)
    vals = [parse_prior(x, flag) for x in items if x]
    if not vals:
        refuse("give at least one number", field=flag, value=text)
    return vals


def _options(args) -> dict:
    """Every numeric option, checked (in the order the stages below refuse them), and the
    hold-out kind."""
    from . import fit as F
    o = {"free": _free(args, F)}
    o["cv"], o["holdout"] = _holdout(args, F)
    if args.seed is not None and not o["holdout"]:      # else ignored silently: nothing else is seeded
        refuse("seeds the split of a --holdout fraction above 0; " + (
            f"--holdout {args.holdout} has none (--cv-seeds seeds --holdout deployment's splits)" if o["cv"] else
            "--holdout 0 holds nothing out"), field="--seed", value=args.seed)
    o["cv_seeds"] = _cv_seeds(args, o["cv"])
    o["prior"], o["priors"] = _priors(args, o["cv"], F)
    o.update(_fit_settings(args))
    _check_files(args)
    return o


def _free(args, F) -> list:
    """The batch rule and target, checked, then the --free patterns (at least one), parsed."""
    from .accuracy import check_batch_rule
    check_batch_rule(args.batch_rule, field="--batch-rule")
    if args.batch_rule == "simulate":
        F.parse_targets("tpot" if args.target == "auto" else args.target)
    elif args.target not in ("auto", "tpot", "step"):
        refuse("unknown target (known: auto, tpot, step; ttft and tpot,ttft with --batch-rule simulate)",
               field="--target", value=args.target)
    if not args.free:
        refuse("give at least one --free PATTERN[@SCOPE][:BOUND] (e.g. --free hbm_derate)", field="--free")
    return [F.Free.parse(f) for f in args.free]


def _holdout(args, F) -> tuple:
    """(the cross-validation kind or None, the held-out fraction): --holdout is a kind (model,
    chip, deployment) or a fraction in [0, 1)."""
    from .cli_price import parse_float
    if args.holdout in F.HOLDOUTS:
        return args.holdout, 0.0
    try:
        float(args.holdout)
    except ValueError:
        refuse(f"expected a fraction in [0, 1) or one of {', '.join(F.HOLDOUTS)}", field="--holdout",
               value=args.holdout)
    holdout = parse_float(args.holdout, flag="--holdout", minimum=0.0)
    if holdout >= 1:
        refuse("must be below 1 (or one of model, chip, deployment)", field="--holdout", value=holdout)
    return None, holdout


def _cv_seeds(args, cv) -> list:
    """--cv-seeds (default 0,1,2): the seeds of --holdout deployment's splits, each once."""
    from .cli_price import parse_int, refuse_repeats
    if args.cv_seeds is not None and cv != "deployment":
        refuse("the seeds are those of --holdout deployment's splits; a leave-one-out split (model, chip) or "
               "a fraction has none", field="--cv-seeds", value=args.cv_seeds, has_value=True)
    seeds = "0,1,2" if args.cv_seeds is None else args.cv_seeds
    items = [x.strip() for x in seeds.split(",")]
    if any(items) and "" in items:
        refuse("has an empty entry", field="--cv-seeds", value=seeds)
    out = [parse_int(x, flag="--cv-seeds", minimum=0) for x in items if x]
    # the same split twice would count twice in the mean the prior is chosen by
    refuse_repeats(out, "a seed given twice (each seed is one split, counted once)", flag="--cv-seeds")
    if cv == "deployment" and not out:
        refuse("give at least one seed (e.g. 0,1,2) for --holdout deployment", field="--cv-seeds",
               value=args.cv_seeds, has_value=True)
    return out


def _priors(args, cv, F) -> tuple:
    """(--prior: 'cv' or a strength, the strengths --prior cv chooses from); the default is cv
    under a cross-validating --holdout, else 0."""
    prior = args.prior if args.prior is not None else ("cv" if cv else "0")
    if prior == "cv" and not cv:
        refuse("--prior cv needs a cross-validating --holdout (model, chip or deployment)", field="--prior")
    chosen = prior if prior == "cv" else parse_prior(prior, "--prior")
    if args.priors is not None and prior != "cv":
        refuse("--priors is the list --prior cv chooses from; it needs --prior cv (with a cross-validating "
               "--holdout: model, chip or deployment)", field="--priors", value=args.priors)
    return chosen, (_floats(args.priors, "--priors") if args.priors is not None else list(F.DEFAULT_PRIORS))


def _fit_settings(args) -> dict:
    """identify_tol, seed and the fitter's own settings (``fit``: steps, learning rate, patience,
    evaluation interval, temperature, loss, Huber delta, weighting, identifiability, method)."""
    from . import fit as F
    from .cli_price import parse_float, parse_int, parse_temperature
    identify_tol = parse_float(args.identify_tol, flag="--identify-tol", minimum=0.0)
    if identify_tol >= 1:
        refuse("must be below 1", field="--identify-tol", value=identify_tol)
    seed = parse_int("0" if args.seed is None else args.seed, flag="--seed", minimum=0)
    steps = parse_int(args.steps, flag="--steps", minimum=0)
    if steps > F.MAX_STEPS:
        refuse(f"at most {F.MAX_STEPS:,} descent steps (a fit converges in tens to hundreds)", field="--steps",
               value=steps)
    if args.method == "gauss-newton":       # else ignored silently: damped Gauss-Newton has no step size or schedule
        for flag in ("--learning-rate", "--patience", "--eval-every"):
            value = getattr(args, flag[2:].replace("-", "_"))
            if value is not None:
                refuse("sets projected Adam's descent; --method gauss-newton takes none (--steps caps its "
                       "iterations)", field=flag, value=value)
    lr = parse_float("0.05" if args.learning_rate is None else args.learning_rate, flag="--learning-rate",
                     minimum=0.0)
    if lr <= 0:
        refuse("must be positive", field="--learning-rate", value=lr)
    if args.huber_delta is not None and args.loss != "huber":
        refuse("--huber-delta applies to --loss huber only", field="--huber-delta", value=args.huber_delta)
    delta = parse_float("0.1" if args.huber_delta is None else args.huber_delta, flag="--huber-delta", minimum=0.0)
    if delta <= 0:
        refuse("must be positive", field="--huber-delta", value=delta)
    temperature = None if args.temperature is None else parse_temperature(args.temperature)
    fit = dict(steps=steps, learning_rate=lr,
               patience=parse_int("10" if args.patience is None else args.patience, flag="--patience", minimum=1),
               eval_every=parse_int("5" if args.eval_every is None else args.eval_every, flag="--eval-every",
                                    minimum=1), temperature=temperature,
               loss=args.loss, huber_delta=delta, weighting=args.weighting,
               identify=identify_tol > 0, identify_tol=identify_tol, method=args.method)
    return {"identify_tol": identify_tol, "seed": seed, "fit": fit}


def _check_files(args) -> None:
    """--name with --out, --out writable and not an input, the scenario folders and the
    --settings table (with the simulation only), each refused before anything is fitted."""
    if args.name is not None:
        if not args.name.strip():
            refuse("an empty set name", field="--name", value=args.name, has_value=True)
        if args.out is None:
            refuse("--name names the set --out writes; give --out FILE.yaml", field="--name", value=args.name)
    if args.scope_to is not None and args.out is None:      # else ignored silently: it scopes the written set
        refuse("scopes the entries of the set --out writes; give --out FILE.yaml", field="--scope-to",
               value=args.scope_to)
    if args.json is not None and args.json != "-":
        check_output_file(args.json, flag="--json", what="JSON report", writes="JSON")
        from pathlib import Path
        if args.out is not None and Path(args.json).expanduser().resolve() == Path(args.out).expanduser().resolve():
            refuse("names the file --out writes the set to", field="--json", value=args.json)
        if Path(args.json).expanduser().resolve() == Path(args.csv).expanduser().resolve():
            refuse("names the measurement CSV, an input: the report would overwrite it", field="--json",
                   value=args.json)
    if args.out is not None:
        check_output_file(args.out, flag="--out", what="coefficient set", writes="YAML")
        from pathlib import Path
        out = Path(args.out).expanduser().resolve()
        for flag, v in (("the measurement CSV", args.csv), ("--settings", getattr(args, "settings", None))):
            if v is not None and Path(v).expanduser().resolve() == out:
                refuse(f"names {flag}, an input: the set would overwrite it", field="--out", value=args.out)
    from .accuracy import _stated_table, check_scenario_dirs, check_settings_path
    check_scenario_dirs(args.scenario_dir, "--scenario-dir")
    if getattr(args, "settings", None) is not None:
        check_settings_path(args.settings, field="--settings")      # '' was 'cannot read', naming nothing
        if args.batch_rule != "simulate":
            refuse("the engine flags of each run are read by the serving simulation only (--batch-rule simulate)",
                   field="--settings", value=str(args.settings))
        _stated_table(str(args.settings))          # a malformed file refused before anything is fitted


def _observations(args):
    """(target, observations, engines) from the CSV, refused points reported on stderr."""
    from . import fit as F
    header = _header(args.csv)
    if args.batch_rule == "simulate":
        return _simulated(args, header)
    layout = "step" if "requests" in header else "tpot" if "quantity" in header else None
    target = layout if args.target == "auto" else args.target
    if layout is None:
        refuse("neither the mean-TPOT layout (a 'quantity' column) nor the step layout (scenario, requests, "
               "context, value, unit)", file=args.csv, field="header", value=",".join(header[:6]))
    if target != layout:
        refuse(f"--target {target} needs the {target} layout, but this CSV has the {layout} layout",
               file=args.csv, field="--target", value=target)
    if layout == "step":
        if args.deployment:
            refuse("--deployment selects deployments of the mean-TPOT layout only", field="--deployment")
        if args.batch_rule != "anchor":
            refuse("--batch-rule applies to the mean-TPOT layout only (a step CSV gives its batches)",
                   field="--batch-rule", value=args.batch_rule)
        return target, F.read_step_measurements(args.csv, estimate=args.estimate), []
    _note_unit(args.csv)
    obs, refused, points = F.observations_from_measurements(
        args.csv, scenario_dirs=args.scenario_dir, estimate=args.estimate, deployments=args.deployment,
        batch_rule=args.batch_rule)
    _report_refused(refused, points, "the kernel")
    if not obs:
        refuse("no point of the CSV could be priced", file=args.csv)
    return target, obs, sorted({p.engine for p in points if p.engine})


def _note_unit(csv_path, ttft_points=False) -> None:
    """accuracy's note (stderr) where the file's median mean TPOT is outside what serving engines give:
    a unit column saying ms over microseconds fitted hbm_derate to its bound and wrote the set without
    a word, where `jaxprice accuracy` on the same file says to check the unit."""
    from .cli_accuracy import unit_note
    note = unit_note(csv_path, ttft_points=ttft_points)
    if note:
        print(f"note: {note}", file=sys.stderr)


def _report_refused(refused, points, by):
    """The points ``by`` refused, on stderr: how many, and the first five with their reasons."""
    if refused:
        print(f"{len(refused)} point(s) {by} refused are left out of the fit:", file=sys.stderr)
        for i, reason in refused[:5]:
            print(f"  line {points[i].row} ({points[i].deployment}, C={points[i].concurrency}): {reason}",
                  file=sys.stderr)


def _simulated(args, header):
    """(target label, SimObservations, engines) under --batch-rule simulate."""
    from . import fit as F
    from .progress import Progress
    if "quantity" not in header:
        refuse("--batch-rule simulate needs the mean-TPOT layout (a 'quantity' column)", file=args.csv,
               field="header", value=",".join(header[:6]))
    targets = F.parse_targets("tpot" if args.target == "auto" else args.target)
    alone = targets == ("ttft",)          # TTFT alone: a mean_ttft row without its mean_tpot row is a point
    _note_unit(args.csv, alone)
    if args.settings is not None:
        from .cli_accuracy import settings_note
        note = settings_note(args.csv, args.settings, args.deployment, ttft_points=alone)
        if note:
            print(f"note: {note}", file=sys.stderr)
    bar = None if args.quiet else Progress(1, "simulate")
    try:
        obs, refused, points = F.observations_from_simulation(
            args.csv, targets=targets, scenario_dirs=args.scenario_dir, estimate=args.estimate,
            deployments=args.deployment, settings=args.settings, callback=None if bar is None else
            (lambda done, total, **kw: bar.update(done, total, **kw)))
    finally:
        if bar is not None:
            bar.close()
    _report_refused(refused, points, "the simulation")
    if not obs:
        refuse("no point of the CSV could be simulated" + (" with a measured mean TTFT" if targets == ("ttft",)
                                                           else ""), file=args.csv)
    return "simulate:" + ",".join(targets), obs, sorted({p.engine for p in points if p.engine})


class _Bars:
    """One progress bar per stage (stderr), or none with --quiet."""

    def __init__(self, quiet):
        self.quiet, self.bars = quiet, {}

    def __call__(self, done, total, stage="descent", **info):
        from .progress import Progress
        if self.quiet or total is None:
            return
        if stage not in self.bars:
            self.close()
            self.bars[stage] = Progress(total, {"compile": "compile", "cv": "cv fits"}.get(stage, "fit"))
        self.bars[stage].update(done, total, **info)

    def close(self):
        for b in self.bars.values():
            b.close()
        self.bars = {}


def _pct(x):
    return "n/a" if not np.isfinite(x) else f"{x:.1%}"


def print_cv(cv, what="TPOT", fixed_prior=None):
    """The cross-validation table: per held-out group, registry -> fit on the held-out and the
    training deployments. ``fixed_prior``: the strength --prior fixed (every fold and the final fit
    at it), None where --prior cv chose it."""
    how = ("prior per fold chosen by an inner cross-validation on its training deployments" if fixed_prior is None
           else f"prior {fixed_prior:g} in every fold (--prior)")
    print(f"cross-validation by {cv.by}: {len(cv.folds)} fold(s); {how}")
    print(f"{'held out':<24}{'deps':>5}{'points':>7}{'prior':>8}{'keys':>6}  {what + ' MAPE reg -> fit':<22}"
          f"{'shape reg -> fit':<20}{'in-sample MAPE':<18}{'in-sample shape':<18}")
    for r in cv.rows():
        te, tr = r["test"], r["train"]
        print(f"{r['fold']:<24}{len(r['test_deployments']):>5}{te['registry']['points']:>7}{r['prior']:>8g}"
              f"{r['applied']:>6}  {_pct(te['registry']['tpot_mape']) + ' -> ' + _pct(te['fitted']['tpot_mape']):<22}"
              f"{_pct(te['registry']['shape_mean']) + ' -> ' + _pct(te['fitted']['shape_mean']):<20}"
              f"{_pct(tr['registry']['tpot_mape']) + ' -> ' + _pct(tr['fitted']['tpot_mape']):<18}"
              f"{_pct(tr['registry']['shape_mean']) + ' -> ' + _pct(tr['fitted']['shape_mean']):<18}")
    rows = cv.rows()
    if rows and "ttft_mape" in rows[0]["test"]["registry"]:
        print(f"{'held out':<24}{'TTFT MAPE reg -> fit':<22}{'TTFT shape reg -> fit':<24}{'in-sample TTFT MAPE':<22}"
              f"{'in-sample TTFT shape':<22}")
        for r in rows:
            te, tr = r["test"], r["train"]
            print(f"{r['fold']:<24}"
                  f"{_pct(te['registry']['ttft_mape']) + ' -> ' + _pct(te['fitted']['ttft_mape']):<22}"
                  f"{_pct(te['registry']['ttft_shape_mean']) + ' -> ' + _pct(te['fitted']['ttft_shape_mean']):<24}"
                  f"{_pct(tr['registry']['ttft_mape']) + ' -> ' + _pct(tr['fitted']['ttft_mape']):<22}"
                  f"{_pct(tr['registry']['ttft_shape_mean']) + ' -> ' + _pct(tr['fitted']['ttft_shape_mean']):<22}")
    print("(keys: fitted coefficients that reach the held-out deployments; the rest keep the registry's values)")
    if rows and all(r["applied"] == 0 for r in rows):
        # every fold's fit scored 1.000 against the registry, and 'inf' was "chosen" as if the fits had lost
        print(f"note: no fitted coefficient reaches a held-out {cv.by} in any fold (every --free key is scoped to "
              f"something the held-out deployments do not share: by {cv.by}, free a key @global"
              + (" or @model" if cv.by == "chip" else " or @hardware" if cv.by == "model" else "")
              + "), so the cross-validation compares the registry with itself and cannot choose a prior")
    metrics = f"{what} MAPE and shape" + (", TTFT MAPE and shape" if rows and "ttft_mape" in rows[0]["test"]["registry"]
                                          else "")
    scores = ", ".join(f"{p:g}: {c:.3f} (worst group x{cv.worst[p]:.3f})" for p, c in cv.criterion.items())
    if fixed_prior is not None:
        worse = cv.worst.get(fixed_prior, 0.0) > 1 + 1e-3      # fit._choose's "no group worse" tolerance
        print(f"prior strength -> mean over folds of fit/registry error ({metrics}): {scores}; the final "
              f"fit at {fixed_prior:g}, as --prior fixed it" + (" (it makes a held-out group worse than the registry: "
                                                                 "--prior cv would choose among strengths)" if worse else ""))
        return
    print(f"prior strength -> mean over folds of fit/registry error ({metrics}): {scores}; chosen (lowest "
          f"mean among the priors that make no held-out group worse) for the final fit: {cv.best_prior:g}")


def print_fit(res, obs, target, args, seed):
    from .resolve import si_factor
    sim = target.startswith("simulate")
    what = ("simulated mean " + " + ".join(t.upper() for t in target.split(":")[1].split(",")) if sim else
            "TPOT" if target == "tpot" else "step time")
    by_name = {o.name: o for o in obs}
    temperature = res.settings["temperature"]
    # under simulate a point (one measured run) is up to two residuals, mean TPOT and mean TTFT: the count
    # said 20 points where the cross-validation table above it, the accuracy report and the CSV's runs said 10
    points = (f"{sum(o.n_points for o in obs)} points ({sum(o.points for o in obs)} residuals: "
              f"{' and '.join('mean ' + t.upper() for t in target.split(':')[1].split(','))})" if sim else
              f"{sum(o.points for o in obs)} points")
    if res.held_out:
        split = f"train {len(res.train)}, held out {len(res.held_out)} (by deployment, seed {seed})"
    else:       # was '(by deployment, seed 0)' after a leave-one-model-out run, which split nothing
        split = f"train {len(res.train)}, held out 0" + (
            " (the final fit, on every deployment: the cross-validation above held out its groups)"
            if args.holdout in ("model", "chip", "deployment") else "")
    print(f"{args.csv}: {points} in {len(obs)} deployment(s); {split}")
    print(f"fit: {res.settings['loss']} loss on log {what} ({args.estimate}, "
          f"{'exact mode' if temperature is None else f'temperature {temperature:g}'}), "
          f"{len(res.keys)} free value(s), prior {res.prior:g}; {res.stopped}; kept step {res.best_step}"
          + (f"; batch rule {args.batch_rule}" if target == "tpot" or sim else "") + f"; {res.compiled} compilation(s)")
    from .fit import REGISTRY_KEPT
    if res.stopped == REGISTRY_KEPT:
        print("the registry is kept (prior strength inf" + (": no finite prior's fit beat it on the held-out groups"
              if args.prior in (None, "cv") and args.holdout in ("model", "chip", "deployment") else "")
              + "): no coefficient moves, and a written set holds the registry's values")
    pw = 10 if sim else 8
    print(f"{'split':<10}{'deployments':>12}{'residuals' if sim else 'points':>{pw}}{'loss before':>13}"
          f"{'loss after':>12}{'MAPE before':>13}{'MAPE after':>12}" + ("  (MAPE over every residual, TPOT and TTFT "
                                                                      "together; each apart below)" if sim and
                                                                     "," in target else ""))
    stats = {}
    for split, names, key in (("train", res.train, "train"), ("held out", res.held_out, "held_out")):
        if not names:
            continue
        sel = [by_name[n] for n in names]
        meas = np.concatenate([o.measured for o in sel])
        pred_before, pred_after = res.predict_all(sel, fitted=False), res.predict_all(sel)   # one compile per structure
        before = np.concatenate([pred_before[o.name] for o in sel])
        after = np.concatenate([pred_after[o.name] for o in sel])
        # no descent (prior inf, the registry kept) has no losses: '-', not 'nan'
        loss = [f"{v:.5f}" if np.isfinite(v) else "-" for v in (res.initial[key], res.final[key])]
        print(f"{split:<10}{len(names):>12}{len(meas):>{pw}}{loss[0]:>13}{loss[1]:>12}"
              f"{_mape(before, meas):>13.1%}{_mape(after, meas):>12.1%}")
        stats[key] = {"deployments": len(names), "residuals" if sim else "points": int(len(meas)),
                      "mape_before": _mape(before, meas), "mape_after": _mape(after, meas)}
        if sim:
            from . import fit as F
            reg = F.score_simulated(sel, F.predict_simulated_many(sel, temperature=temperature))
            fit = F.score_simulated(sel, F.predict_simulated_many(sel, res.layout, res.theta, temperature=temperature))
            stats[key].update(registry=reg, fitted=fit)
            print(f"  {split}: TPOT MAPE {_pct(reg['tpot_mape'])} -> {_pct(fit['tpot_mape'])}, shape "
                  f"{_pct(reg['shape_mean'])} -> {_pct(fit['shape_mean'])}; TTFT MAPE {_pct(reg['ttft_mape'])} -> "
                  f"{_pct(fit['ttft_mape'])}, shape {_pct(reg['ttft_shape_mean'])} -> {_pct(fit['ttft_shape_mean'])}"
                  f" ({fit['ttft_points']} points with a measured TTFT)")
    print(f"{'coefficient @ scope':<56}{'start':>12}{'fitted':>12}{'x':>8}  units")
    for e in sorted(res.entries(), key=lambda e: (e["name"], sorted((k, str(v)) for k, v in e["scope"].items()))):
        label = e["name"] + "@" + ",".join(f"{k}={v}" for k, v in e["scope"].items())
        f = si_factor(e["name"], e["units"])
        note = "  frozen" if e["frozen"] else ""
        print(f"{label:<56}{e['start'] / f:>12.6g}{e['value'] / f:>12.6g}{e['multiplier']:>8.3f}  {e['units']}{note}")
    wider = sorted({e["key"] for e in res.entries() if "hardware=" not in e["key"] and "@" in e["key"]})
    if wider:     # one multiplier each, listed (and written) per chip: a fitted set is scoped to its chips
        print(f"({', '.join(wider)}: one multiplier{' each' if len(wider) > 1 else ''}, listed per chip as the "
              "written set scopes it, to the chips it was fitted on)")
    for lab, why in res.frozen.items():
        print(f"frozen {lab}: {why}")
    for h in res.bound_hits():
        print(f"at a bound: {h['key']} ({h['side']}: {h['why']}): {h['meaning']}")
    return stats


def scope_hint(cv, res, scope_to) -> str:
    """The line after 'wrote SET' where the cross-validation judged the fit on models it never saw
    (--holdout model) and chose a finite prior, but the set is scoped to the models fitted on: the
    very transfer the table measured is then never applied (--scope-to hardware would apply it)."""
    from .fit import REGISTRY_KEPT
    if cv is None or cv.by != "model" or "model" not in scope_to or res.stopped == REGISTRY_KEPT:
        return ""
    return ("(--holdout model judged this fit on models it was not fitted on, but the set reaches only "
            f"{', '.join(res.settings['train_models'])}: --scope-to hardware writes it for every model of its chips)")


def _num(x):
    """A float for JSON: inf as the string 'inf' (JSON has none), NaN as null."""
    if x is None:
        return None
    x = float(x)
    return "inf" if x == math.inf else None if not math.isfinite(x) else x


def _scores(s: dict) -> dict:
    return {k: (_num(v) if isinstance(v, (float, np.floating)) else int(v) if isinstance(v, (int, np.integer)) else v)
            for k, v in s.items()}


def json_report(cv, res, obs, target, args, written=None, scope=None, stats=None) -> dict:
    """The --json document: what print_cv and print_fit print, as numbers (fractions, not
    percents; coefficient values in the registry's units, as the written set holds them)."""
    from .fit import REGISTRY_KEPT
    from .resolve import si_factor
    doc = {"csv": str(args.csv), "target": target, "batch_rule": args.batch_rule, "estimate": args.estimate,
           "deployments": sorted(o.name for o in obs), "cross_validation": None}
    if cv is not None:
        rows = cv.rows()
        doc["cross_validation"] = {
            "by": cv.by, "folds": [{"held_out": r["fold"], "test_deployments": r["test_deployments"],
                                    "prior": _num(r["prior"]), "keys_reaching_held_out": int(r["applied"]),
                                    "held_out_scores": {k: _scores(v) for k, v in r["test"].items()},
                                    "in_sample_scores": {k: _scores(v) for k, v in r["train"].items()}}
                                   for r in rows],
            "criterion": {f"{p:g}": _num(c) for p, c in cv.criterion.items()},
            "worst_group": {f"{p:g}": _num(c) for p, c in cv.worst.items()},
            "chosen_prior": _num(cv.best_prior),
            "no_key_reaches_held_out": bool(rows) and all(r["applied"] == 0 for r in rows)}
    entries = []
    for e in sorted(res.entries(), key=lambda e: (e["name"], sorted((k, str(v)) for k, v in e["scope"].items()))):
        f = si_factor(e["name"], e["units"])
        entries.append({"name": e["name"], "scope": {k: (str(v) if k in ("hardware", "model") else v)
                                                     for k, v in e["scope"].items()}, "key": e["key"],
                        "start": e["start"] / f, "value": e["value"] / f, "units": e["units"],
                        "multiplier": e["multiplier"], "frozen": bool(e["frozen"])})
    doc["fit"] = {"prior": _num(res.prior), "stopped": res.stopped, "registry_kept": res.stopped == REGISTRY_KEPT,
                  "train": list(res.train), "held_out": list(res.held_out), "compiled": int(res.compiled),
                  "loss": {k: {kk: _num(vv) for kk, vv in v.items()} for k, v in
                           (("start", res.initial), ("fitted", res.final))},
                  "scores": {k: _scores({kk: (_scores(vv) if isinstance(vv, dict) else vv) for kk, vv in v.items()})
                             for k, v in (stats or {}).items()},
                  "entries": entries, "frozen": dict(res.frozen), "at_bound": res.bound_hits()}
    doc["written"] = None
    if written is not None:     # the entries as the file holds them (scoped to chips, models and engines)
        from .formats import read_yaml
        held = [{k: e[k] for k in ("name", "value", "units", "scope") if k in e}
                for e in (read_yaml(written).get("entries") or [])]
        doc["written"] = {"path": str(written), **(scope or {}), "entries": held}
    return doc


def _plain(x):
    """numpy scalars (a tp in a scope, a float64 value) as Python numbers for json.dumps."""
    return x.item() if hasattr(x, "item") else str(x)


# the library's field names, as the flags that set them: 'field 'holdout'' named no flag of jaxprice fit
_API_FLAGS = {"free": "--free", "holdout": "--holdout", "priors": "--priors", "prior": "--prior", "seeds": "--cv-seeds"}


def run(args) -> int:
    from .errors import JaxpriceError
    try:
        return _run_and_report(args)
    except JaxpriceError as err:
        if err.file is None and err.field in _API_FLAGS:
            raise JaxpriceError(err.reason, field=_API_FLAGS[err.field], value=err.value,
                                has_value=err.value is not None) from None
        raise


def _run_and_report(args) -> int:
    if args.json == "-":        # standard output carries the JSON alone; the tables go to stderr
        import contextlib
        with contextlib.redirect_stdout(sys.stderr):
            doc = _run(args)
        print(json.dumps(doc, indent=1, default=_plain))
        return 0
    doc = _run(args)
    if args.json is not None:
        from pathlib import Path
        Path(args.json).expanduser().parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).expanduser().write_text(json.dumps(doc, indent=1, default=_plain) + "\n")
        print(f"wrote {args.json}")
    return 0


def _run(args) -> dict:
    from . import fit as F
    o = _options(args)
    target, obs, engines = _observations(args)
    bars = _Bars(args.quiet)
    cv = None
    try:
        prior = o["prior"]
        if o["cv"]:
            priors = o["priors"] if prior == "cv" else [prior]
            cv = F.cross_validate(obs, o["free"], by=o["cv"], priors=priors, seeds=o["cv_seeds"],
                                  callback=bars, **o["fit"])
            bars.close()
            print_cv(cv, "TPOT" if target == "tpot" or target.startswith("simulate") else "step",
                     fixed_prior=None if o["prior"] == "cv" else o["prior"])
            prior = cv.best_prior
        res = F.fit_coefficients(obs, o["free"], holdout=o["holdout"], seed=o["seed"], prior=prior, callback=bars,
                                 **o["fit"])
    finally:
        bars.close()
    stats = print_fit(res, obs, target, args, o["seed"])
    path = scope = None
    if args.out:
        data = (f"{args.csv} (mean TPOT, batch rule '{args.batch_rule}')" if target == "tpot" else
                f"{args.csv} (simulated mean {target.split(':')[1].upper().replace(',', ' and ')}, batch rule "
                "'simulate')" if target.startswith("simulate") else str(args.csv))
        scope_to = tuple((args.scope_to or SCOPE_TO[0]).split(","))
        path = F.write_coefficient_set(res, args.out, name=args.name, data=data, scope_to=scope_to, engines=engines)
        models = res.settings["train_models"] if "model" in scope_to else ["every model"]
        print(f"wrote {path} (values in registry units; load with extra_coefficient_files=[...]); its entries apply "
              f"to chips {', '.join(res.settings['train_chips'])} and models {', '.join(models)}"
              + f" on engine {', '.join(res.settings.get('train_engines') or F.scheduler_names(engines))} (a "
                "deployment's engine.scheduler, vllm where unstated)"
              + ": any other deployment loading it keeps the registry's values")
        hint = scope_hint(cv, res, scope_to)
        if hint:
            print(hint)
        scope = {"chips": list(res.settings["train_chips"]), "models": list(models),
                 "engines": list(res.settings.get("train_engines") or F.scheduler_names(engines))}
    return json_report(cv, res, obs, target, args, path, scope, stats) if args.json is not None else {}
