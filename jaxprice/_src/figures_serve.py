"""Figures of simulated serving runs (serve.py): latency and throughput against load, and the
timeline of one run. Agg backend; times in seconds in, drawn in ms."""

from __future__ import annotations

import math

import numpy as np

from .figures import _pyplot, _save


def plot_serving_sweep(results, loads, *, load_label="concurrency", path=None, title=None, keep_open=False, dpi=120,
                       slo=None):
    """Three panels: TTFT (mean, p99) and TPOT (mean, p99) against the load, and output tokens/s
    per GPU against output tokens/s per user (each point labelled with its load). ``slo``
    ({"ttft"/"tpot": seconds}, serve.check_slo's): its TTFT and TPOT targets drawn across their
    panels, each load's share of requests meeting every target beside its throughput point."""
    plt = _pyplot()
    from matplotlib.ticker import NullLocator
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.4))
    x = np.asarray(loads, float)
    s = [r.summary for r in results]
    for a, q, name in ((ax[0], "ttft", "TTFT"), (ax[1], "tpot", "TPOT")):
        a.plot(x, [v[f"{q}_mean"] * 1e3 for v in s], "o-", label="mean")
        a.plot(x, [v[f"{q}_p99"] * 1e3 for v in s], "s--", label="p99", alpha=0.8)
        if x.size and (x > 0).all():     # a trace run's load is its index (0): a linear axis
            a.set_xscale("log", base=2)
            if x.size <= 12:            # ticks at the loads run (a rate of 20 fell between 16 and 32)
                a.set_xticks(x)
                a.xaxis.set_minor_locator(NullLocator())
        if slo and q in slo:
            a.axhline(slo[q] * 1e3, color="#d62728", ls=":", lw=1.5, label=f"SLO {slo[q] * 1e3:g} ms")
        a.set_xlabel(load_label)
        a.set_ylabel(f"{name} (ms)")
        a.set_title(f"{name} vs {load_label}")
        a.grid(True, which="both", alpha=0.3)
        a.legend()
    ax[1].set_yscale("log")
    ax[0].set_yscale("log")
    for a in ax[:2]:        # the loads and times as numbers (20 req/s, 14 ms), not 2^4 and 1.4 x 10^1
        _plain_ticks(a)
    u = [v["output_tps_per_user"] for v in s]
    g = [v["output_tps_per_gpu"] for v in s]
    ax[2].plot(u, g, "o-", color="#2ca02c")
    for xi, ui, gi, v in zip(loads, u, g, s):
        good = f" ({v['slo_attainment'] * 100:.0f}% good)" if slo and "slo_attainment" in v else ""
        ax[2].annotate(f"{xi:g}{good}", (ui, gi), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax[2].set_xlabel("output tokens/s per user (1 / mean TPOT)")
    ax[2].set_ylabel("output tokens/s per GPU")
    ax[2].set_title("throughput vs interactivity")
    ax[2].grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path, keep_open, dpi)


MINOR_LABELS_ALL_BELOW = 3.0      # a log axis spanning less than this ratio labels every minor tick


def _minor_label(v, lo, hi) -> str:
    """A log axis's minor tick label over the view [lo, hi]: every one on a narrow axis (under
    ``MINOR_LABELS_ALL_BELOW`` x: its only labels), else only 2 and 5 x a power of ten (on a step-
    time axis from 9 to 200 ms the labels 9 and 10, 70, 80, 90 and 100 were drawn over each other)."""
    if not (v > 0 and math.isfinite(v)):
        return ""
    lo, hi = min(lo, hi), max(lo, hi)
    if lo > 0 and hi / lo >= MINOR_LABELS_ALL_BELOW:
        mantissa = round(v / 10 ** math.floor(math.log10(v)), 6)
        if mantissa not in (2.0, 5.0):
            return ""
    return f"{v:g}"


def _plain_ticks(ax, axes=("x", "y")) -> None:
    """Log axes' tick labels written as plain numbers (%g), minor ones too (``_minor_label``)."""
    from matplotlib.ticker import FuncFormatter
    fmt = FuncFormatter(lambda v, _pos: f"{v:g}")
    for name in axes:
        axis = ax.xaxis if name == "x" else ax.yaxis
        axis.set_major_formatter(fmt)
        axis.set_minor_formatter(FuncFormatter(lambda v, _pos, a=axis: _minor_label(v, *a.get_view_interval())))


def timeline_series(result, max_points=20000) -> dict:
    """The run step by step as series to draw with ``drawstyle="steps-post"``: ``x`` (s) the start of
    each step (or of each block of ``stride`` steps where the run has more than ``max_points``), each
    value held until the step ends, and where the engine idles before the next step (an open loop
    waiting for arrivals) one more point at the step's end: 0 for resident, tokens and
    prefill_tokens, NaN (no line) for time (s). Values were drawn at each step's end before, so the
    figure ran one step late and an idle engine showed its last batch as resident."""
    st = result.steps
    end = np.asarray(st["end"], float)
    dt = np.asarray(st["time"], float)
    n = end.size
    if n == 0:
        return {k: np.zeros(0) for k in ("x", "resident", "tokens", "prefill_tokens", "time")}
    stride = max(1, -(-n // max_points))
    blocks = np.arange(0, n, stride)
    b_start = (end - dt)[blocks]
    b_end = end[np.minimum(blocks + stride, n) - 1]
    vals = {k: np.add.reduceat(np.asarray(st[k], float), blocks) / np.diff(np.append(blocks, n))
            for k in ("resident", "tokens", "prefill_tokens", "time")}
    idle = np.append(b_start[1:] > b_end[:-1] * (1 + 1e-12), True)      # a gap after the block (and the end)
    order = np.argsort(np.concatenate([2 * np.arange(blocks.size), 2 * np.flatnonzero(idle) + 1]), kind="stable")
    out = {"x": np.concatenate([b_start, b_end[idle]])[order]}
    for k, v in vals.items():
        fill = np.nan if k == "time" else 0.0
        out[k] = np.concatenate([v, np.full(int(idle.sum()), fill)])[order]
    return out


def plot_serving_timeline(result, *, path=None, title=None, keep_open=False, dpi=120, max_points=20000):
    """Over the run (x = time, s): the resident batch, the tokens each step schedules (prefill
    tokens shaded) and each step's time, each step drawn over its own span (``timeline_series``:
    0 where the engine idles)."""
    plt = _pyplot()
    ts = timeline_series(result, max_points)
    x = ts["x"]
    fig, ax = plt.subplots(3, 1, figsize=(12, 8), sharex=True)
    ax[0].plot(x, ts["resident"], drawstyle="steps-post", color="#1f77b4")
    ax[0].set_ylabel("resident batch")
    ax[0].grid(True, alpha=0.3)
    ax[1].plot(x, ts["tokens"], drawstyle="steps-post", lw=0.6, color="#7f7f7f", label="tokens")
    ax[1].fill_between(x, 0, ts["prefill_tokens"], color="#ff7f0e", alpha=0.5, step="post", label="prefill tokens")
    ax[1].set_ylabel("tokens per step")
    ax[1].legend(loc="upper right")
    ax[1].grid(True, alpha=0.3)
    ax[2].plot(x, ts["time"] * 1e3, drawstyle="steps-post", lw=0.6, color="#d62728")
    ax[2].set_ylabel("step time (ms)")
    ax[2].set_xlabel("time (s)")
    ax[2].set_yscale("log")
    _plain_ticks(ax[2], ("y",))             # 20, not 2 x 10^1
    ax[2].grid(True, alpha=0.3)
    s = result.summary
    ax[0].set_title(title or (f"{s['steps']} steps, mean TTFT {s['ttft_mean'] * 1e3:.1f} ms, "
                              f"mean TPOT {s['tpot_mean'] * 1e3:.2f} ms, {s['preemptions']} preemptions"))
    fig.tight_layout()
    return _save(fig, path, keep_open, dpi)
