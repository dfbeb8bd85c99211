"""Figures of simulated serving runs (serve.py): latency and throughput against load, and the
timeline of one run. Agg backend; times in seconds in, drawn in ms."""

from __future__ import annotations

import numpy as np

from .figures import _pyplot, _save


def plot_serving_sweep(results, loads, *, load_label="concurrency", path=None, title=None, keep_open=False, dpi=120,
                       slo=None):
    """Three panels: TTFT (mean, p99) and TPOT (mean, p99) against the load, and output tokens/s
    per GPU against output tokens/s per user (each point labelled with its load). ``slo``
    ({"ttft"/"tpot": seconds}, serve.check_slo's): its TTFT and TPOT targets drawn across their
    panels, each load's share of requests meeting every target beside its throughput point."""
    plt = _pyplot()
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.4))
    x = np.asarray(loads, float)
    s = [r.summary for r in results]
    for a, q, name in ((ax[0], "ttft", "TTFT"), (ax[1], "tpot", "TPOT")):
        a.plot(x, [v[f"{q}_mean"] * 1e3 for v in s], "o-", label="mean")
        a.plot(x, [v[f"{q}_p99"] * 1e3 for v in s], "s--", label="p99", alpha=0.8)
        if x.size and (x > 0).all():     # a trace run's load is its index (0): a linear axis
            a.set_xscale("log", base=2)
        if slo and q in slo:
            a.axhline(slo[q] * 1e3, color="#d62728", ls=":", lw=1.5, label=f"SLO {slo[q] * 1e3:g} ms")
        a.set_xlabel(load_label)
        a.set_ylabel(f"{name} (ms)")
        a.set_title(f"{name} vs {load_label}")
        a.grid(True, which="both", alpha=0.3)
        a.legend()
    ax[1].set_yscale("log")
    ax[0].set_yscale("log")
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


def plot_serving_timeline(result, *, path=None, title=None, keep_open=False, dpi=120, max_points=20000):
    """Over the run (x = time, s): the resident batch, the tokens each step schedules (prefill
    tokens shaded) and each step's time."""
    plt = _pyplot()
    st = result.steps
    end = np.asarray(st["end"])
    n = end.size
    stride = max(1, n // max_points)
    sl = slice(None, None, stride)
    fig, ax = plt.subplots(3, 1, figsize=(12, 8), sharex=True)
    ax[0].step(end[sl], np.asarray(st["resident"])[sl], where="post", color="#1f77b4")
    ax[0].set_ylabel("resident batch")
    ax[0].grid(True, alpha=0.3)
    ax[1].plot(end[sl], np.asarray(st["tokens"])[sl], lw=0.6, color="#7f7f7f", label="tokens")
    ax[1].fill_between(end[sl], 0, np.asarray(st["prefill_tokens"])[sl], color="#ff7f0e", alpha=0.5,
                       step="post", label="prefill tokens")
    ax[1].set_ylabel("tokens per step")
    ax[1].legend(loc="upper right")
    ax[1].grid(True, alpha=0.3)
    ax[2].plot(end[sl], np.asarray(st["time"])[sl] * 1e3, lw=0.6, color="#d62728")
    ax[2].set_ylabel("step time (ms)")
    ax[2].set_xlabel("time (s)")
    ax[2].set_yscale("log")
    ax[2].grid(True, alpha=0.3)
    s = result.summary
    ax[0].set_title(title or (f"{s['steps']} steps, mean TTFT {s['ttft_mean'] * 1e3:.1f} ms, "
                              f"mean TPOT {s['tpot_mean'] * 1e3:.2f} ms, {s['preemptions']} preemptions"))
    fig.tight_layout()
    return _save(fig, path, keep_open, dpi)
