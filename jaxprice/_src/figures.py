"""Figures: the step against batch size (the spec's figure) and sweep heat maps.

Library code: each function draws with matplotlib's Agg backend, saves to ``path`` when one
is given and returns the Figure (closed after saving unless ``keep_open``). Times come in
seconds, as everywhere in jaxprice, and are drawn in ``units`` (ms or us).
"""

from __future__ import annotations


import numpy as np

from .errors import JaxpriceError, refuse
from .outputs import IMAGE_SUFFIXES, check_output_file
from .plan import RESOURCES

#: One colour per resource, shared by every figure (and the heat maps' categories).
RESOURCE_COLORS = {"sm": "#1f77b4", "hbm": "#d62728", "nvlink": "#2ca02c", "nic": "#9467bd", "host": "#ff7f0e"}
RESOURCE_LABELS = {"sm": "SM", "hbm": "HBM", "nvlink": "NVLink", "nic": "NIC", "host": "host"}
UNIT_SCALE = {"ms": 1e3, "us": 1e6, "s": 1.0}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _unit_scale(units):
    if units not in UNIT_SCALE:
        from .errors import refuse
        refuse("unknown time unit; expected ms, us or s", field="units", value=units)
    return UNIT_SCALE[units]


def _fmt_x(v):
    if isinstance(v, str):
        return v
    return f"{v:g}" if float(v) != int(v) else str(int(v))


def bottleneck_runs(x, bottleneck) -> list[tuple[str, object, object]]:
    """Consecutive runs of one bottleneck: [(resource, first x, last x)], in order."""
    runs = []
    for xi, b in zip(x, bottleneck):
        name = RESOURCES[int(b)]
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1], xi)
        else:
            runs.append((name, xi, xi))
    return runs


def describe_bottleneck(x, bottleneck, unit_word="") -> str:
    """'host at 1-2, HBM at 4-256' (x values joined by runs)."""
    parts = []
    for name, a, b in bottleneck_runs(x, bottleneck):
        span = _fmt_x(a) if a == b else f"{_fmt_x(a)}\u2013{_fmt_x(b)}"
        parts.append(f"{RESOURCE_LABELS[name]} at {span}{unit_word}")
    return ", ".join(parts)


def _save(fig, path, keep_open, dpi):
    plt = _pyplot()
    if isinstance(dpi, (bool, np.bool_)) or not (isinstance(dpi, (int, float, np.integer, np.floating))
                                                 and np.isfinite(dpi) and dpi > 0):
        plt.close(fig)                  # refused as the path's fault ("cannot write the figure")
        refuse("must be a number of dots per inch > 0", field="dpi", value=dpi, has_value=True)
    if path is not None:
        try:
            # an existing folder, an unknown suffix (savefig would raise), a parent that is a file:
            # one line naming the path (savefig would write "adir.png" for a folder "adir")
            path = check_output_file(path, flag="path", suffixes=IMAGE_SUFFIXES, what="image")
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=dpi)
        except (OSError, ValueError) as err:
            plt.close(fig)
            if isinstance(err, JaxpriceError):
                raise
            refuse(f"cannot write the figure: {getattr(err, 'strerror', None) or err}", field="path",
                   value=str(path))
        if not keep_open:
            plt.close(fig)
    return fig


def plot_step_curve(x, result, *, path=None, units: str = "ms", title: str | None = None,
                    xlabel: str = "requests in the batch", xticklabels=None, log2: bool | None = None,
                    caption: str | None = None, per: str | None = None, join: bool = True,
                    keep_open: bool = False,
                    dpi: int = 130):
    """The spec's figure: left, the time of each resource over one step against the batch;
    right, Overlap and NoOverlap on the same scale.

    x: [n] batch positions (requests, say); result: a StepResult with a leading [n] axis
    (``price_many``). Resources that are zero at every point are not drawn; the bottleneck
    of each point is ringed in its colour and named, by runs, in the left panel's title.
    log2: a base-2 x axis (default: when every x > 0 and they span a factor of 4 or more).
    xticklabels: labels at the x values (e.g. batch file names). per: what x counts
    ("request"): the right panel's title then also gives how the time per x changes from the
    first point to the last. join: join the points by straight lines (False for batches that
    are not a progression, such as batch files). Returns the Figure.
    """
    plt = _pyplot()
    x, res, overlap, no_overlap, bott = _step_series(x, result, _unit_scale(units))
    if log2 is None:
        log2 = bool(np.all(x > 0) and x.size > 1 and x.max() / x.min() >= 4)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 5.3 if caption else 4.6), sharey=True)
    xs = _draw_resource_times(left, x, res, bott, xticklabels, units, join)
    _draw_step_times(right, x, overlap, no_overlap, join,
                     _step_times_title(x, xs, no_overlap, units, per, change=xticklabels is None))
    _style_step_axes((left, right), x, xs, xlabel, log2, no_overlap, fixed_xlim=xticklabels is not None)
    left.set_ylabel(f"time over the step ({units})")
    if title:
        fig.suptitle(title, fontsize=11)
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=7.5, color="0.3", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.1 if caption else 0, 1, 1))
    return _save(fig, path, keep_open, dpi)


def _step_series(x, result, scale) -> tuple:
    """(x [n], resources [n, 5], overlap [n], no_overlap [n], bottleneck [n]) as numpy arrays, the
    times multiplied by ``scale``."""
    if not all(hasattr(result, k) for k in ("resources", "overlap", "no_overlap", "bottleneck")):
        refuse("needs the StepResult of price_many over the batches", field="result", value=type(result).__name__)
    try:
        arr = np.asarray(x)
    except Exception:                                   # noqa: BLE001 - ragged lists and the like
        arr = np.asarray(None)
    if isinstance(x, (str, bytes)) or arr.dtype.kind not in "iuf":
        refuse("must be numbers, one per priced batch (xticklabels= takes labels)", field="x",
               value=str(x)[:60], has_value=True)
    x = arr.astype(float).reshape(-1)
    if not np.all(np.isfinite(x)):
        k = int(np.flatnonzero(~np.isfinite(x))[0])
        refuse("must be finite numbers (positions on the x axis)", field=f"x[{k}]", value=float(x[k]), has_value=True)
    res = np.asarray(result.resources, dtype=float).reshape(-1, len(RESOURCES)) * scale
    overlap = np.asarray(result.overlap, dtype=float).reshape(-1) * scale
    no_overlap = np.asarray(result.no_overlap, dtype=float).reshape(-1) * scale
    bott = np.asarray(result.bottleneck).reshape(-1).astype(int)
    if x.size != overlap.size:
        refuse(f"has {x.size} positions for {overlap.size} priced batches (result: price_many over the same batches)",
               field="x", value=x.size)
    return x, res, overlap, no_overlap, bott


def _draw_resource_times(ax, x, res, bott, xticklabels, units, join) -> list:
    """The left panel: each resource that is not zero everywhere, the bottleneck of each point
    ringed in its colour, named by runs in the title. Returns the x labels."""
    line = "-" if join else ""
    drawn = [i for i, r in enumerate(RESOURCES) if np.any(res[:, i] != 0)]
    for i in drawn:
        r = RESOURCES[i]
        ax.plot(x, res[:, i], line + "o", ms=3.5, lw=1.6, color=RESOURCE_COLORS[r], label=RESOURCE_LABELS[r])
    for i in drawn:
        on = bott == i
        if on.any():
            ax.plot(x[on], res[on, i], "o", ms=11, mfc="none", mew=1.6, color=RESOURCE_COLORS[RESOURCES[i]])
    ax.plot([], [], "o", ms=9, mfc="none", mew=1.4, color="0.3", label="bottleneck")
    absent = [RESOURCE_LABELS[r] for i, r in enumerate(RESOURCES) if i not in drawn]
    xs = [_fmt_x(v) for v in x] if xticklabels is None else list(xticklabels)
    ax.set_title(f"Time per resource over one step ({units})\nbottleneck: {describe_bottleneck(xs, bott)}",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left", title=f"not drawn (zero): {', '.join(absent)}" if absent else None,
              title_fontsize=7)
    return xs


def _ratio_text(r) -> str:
    """A ratio to 2 significant digits (5.7), more where those read as no change: a 1.4% rise read
    'NoOverlap x1' (now x1.01)."""
    digits = 2
    while digits < 6 and r != 1.0 and float(f"{r:.{digits}g}") == 1.0:
        digits += 1
    return f"{r:.{digits}g}"


def _step_times_title(x, xs, no_overlap, units, per, change) -> str:
    """The right panel's title; with ``change`` (and two points or more) it adds how NoOverlap, and
    the time per ``per``, change from the first point to the last."""
    if not (x.size > 1 and change):
        return f"Step time ({units}): NoOverlap and Overlap"
    text = f"{xs[0]} \u2192 {xs[-1]}: NoOverlap \u00d7{_ratio_text(no_overlap[-1] / no_overlap[0])}"
    if per and x[0] > 0 and x[-1] > 0:
        text += f", per {per} \u00f7{(no_overlap[0] / x[0]) / (no_overlap[-1] / x[-1]):.3g}"
    return f"Step time ({units}): NoOverlap and Overlap\n{text}"


def _draw_step_times(ax, x, overlap, no_overlap, join, title):
    """The right panel: NoOverlap and Overlap against x, their first and last values written."""
    ax.plot(x, no_overlap, ("-" if join else "") + "o", ms=3.5, lw=1.8, color="black",
            label="NoOverlap (sum of the resources)")
    ax.plot(x, overlap, ("--" if join else "") + "s", ms=3.5, lw=1.8, color="0.45",
            label="Overlap (a layer's resources at once)")
    for xi, y, va in ((x[0], no_overlap[0], "bottom"), (x[-1], no_overlap[-1], "bottom"),
                      (x[0], overlap[0], "top"), (x[-1], overlap[-1], "top")):
        ax.annotate(f"{y:.2f}", (xi, y), textcoords="offset points", xytext=(0, 5 if va == "bottom" else -6),
                    ha="center", va=va, fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="best")


def _style_step_axes(axes, x, xs, xlabel, log2, no_overlap, fixed_xlim):
    """Both panels: ticks at the x values (labelled ``xs``), grid, y from 0 to 15% above the highest
    NoOverlap; ``fixed_xlim``: half a step of room at either end of a linear axis."""
    for ax in axes:
        if log2:
            ax.set_xscale("log", base=2)
        ax.set_xticks(x)
        ax.set_xticklabels(xs, fontsize=8, rotation=0 if len(xs) <= 12 else 90)
        ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(0, 1.15 * max(float(no_overlap.max()), 1e-30))
        if fixed_xlim and not log2:
            ax.set_xlim(x.min() - 0.5, x.max() + 0.5)


def _ticks(values, limit=10):
    n = len(values)
    stride = max(1, int(np.ceil(n / limit)))
    idx = list(range(0, n, stride))
    return idx, [_fmt_x(values[i]) for i in idx]


def plot_sweep_heatmaps(decode, context, prefill_chunk, bottleneck, per_token, *, path=None, units: str = "ms",
                        title: str | None = None, per_token_label: str = "NoOverlap per decoded token",
                        keep_open: bool = False, dpi: int = 110):
    """Heat maps of a sweep over decode count x context, one row per prefill chunk: left, the
    bottleneck resource (categorical, the step figure's colours); right, time per token
    (log colour scale when it spans more than a factor of 10; blank where undefined).

    decode [D], context [C], prefill_chunk [P]; bottleneck [P, D, C] (index into RESOURCES);
    per_token [P, D, C] in seconds (NaN where there is no decoded token). Returns the Figure.
    """
    plt = _pyplot()
    from matplotlib.colors import ListedColormap, LogNorm, Normalize
    from matplotlib.patches import Patch
    scale = _unit_scale(units)
    decode, context, prefill_chunk = (np.asarray(v).reshape(-1) for v in (decode, context, prefill_chunk))
    bott = np.asarray(bottleneck).reshape(len(prefill_chunk), len(decode), len(context))
    tpt = np.asarray(per_token, dtype=float).reshape(bott.shape) * scale
    rows = len(prefill_chunk)
    fig, axes = plt.subplots(rows, 2, figsize=(11.5, 0.6 + 3.9 * rows), squeeze=False)
    cmap = ListedColormap([RESOURCE_COLORS[r] for r in RESOURCES])
    finite = tpt[np.isfinite(tpt) & (tpt > 0)]
    lo, hi = (finite.min(), finite.max()) if finite.size else (1.0, 1.0)
    norm = LogNorm(lo, hi) if hi > 10 * lo else Normalize(lo, hi if hi > lo else lo * 1.01)
    tmap = plt.get_cmap("viridis").with_extremes(bad="0.85")
    dx, dl = _ticks(decode)
    cx, cl = _ticks(context)
    present = sorted(set(np.unique(bott).tolist()))
    small = len(decode) * len(context) <= 100
    for k, p in enumerate(prefill_chunk):
        chunk = f"prefill chunk {int(p)} tokens" if p > 0 else "no prefill"
        ax, bx = axes[k]
        ax.imshow(bott[k].T, origin="lower", aspect="auto", cmap=cmap, vmin=-0.5, vmax=len(RESOURCES) - 0.5,
                  interpolation="nearest")
        ax.set_title(f"Bottleneck resource ({chunk})", fontsize=10)
        im = bx.imshow(np.ma.masked_invalid(tpt[k].T), origin="lower", aspect="auto", cmap=tmap, norm=norm,
                       interpolation="nearest")
        bx.set_title(f"{per_token_label} ({units}, {chunk})", fontsize=10)
        cb = fig.colorbar(im, ax=bx)
        cb.set_label(units)
        if small:         # few cells: write each value (and the bottleneck's name) in its cell
            for i in range(len(decode)):
                for j in range(len(context)):
                    v = tpt[k, i, j]
                    ax.text(i, j, RESOURCE_LABELS[RESOURCES[int(bott[k, i, j])]], ha="center", va="center",
                            fontsize=6.5, color="white")
                    if np.isfinite(v):
                        bx.text(i, j, f"{v:.3g}", ha="center", va="center", fontsize=6.5,
                                color="black" if norm(v) > 0.6 else "white")
                    else:
                        bx.text(i, j, "\u2013", ha="center", va="center", fontsize=8, color="0.3")
        for a in (ax, bx):
            a.set_xticks(dx)
            a.set_xticklabels(dl, fontsize=8, rotation=0 if len(dl) <= 8 else 45)
            a.set_yticks(cx)
            a.set_yticklabels(cl, fontsize=8)
            a.set_xlabel("decode requests")
            a.set_ylabel("context (tokens)")
    fig.legend(handles=[Patch(color=RESOURCE_COLORS[RESOURCES[i]], label=RESOURCE_LABELS[RESOURCES[i]])
                        for i in present], fontsize=8, loc="upper left", ncol=len(present), frameon=False,
               title="bottleneck", title_fontsize=8)
    if title:
        fig.suptitle(title + "\n(grey: no decoded token)" if np.isnan(tpt).any() else title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.2 / (0.6 + 3.9 * rows)))
    return _save(fig, path, keep_open, dpi)
