"""Production-scale runs (jaxprice serve with 10^5 requests, day-long traces): the mechanisms that
keep their time and memory in proportion to the work, tested on small runs (the scale itself is
measured by hand, never in a test)."""

from __future__ import annotations

import numpy as np
import pytest

import jaxprice as jp
from jaxprice._src import serve

DEP = "deepseek-v3-h200-fp8-sglang-tp8"


@pytest.fixture(scope="module")
def dep():
    return jp.load_deployment(DEP)


@pytest.fixture(scope="module")
def whole(dep):
    """A small open-loop run in one scheduler call (the records it is sized for suffice)."""
    return jp.simulate(dep, jp.Workload(128, 16), jp.OpenLoop(rate=20.0, num_prompts=12, seed=1))


def test_open_loop_goes_on_in_chunks_bit_for_bit(dep, whole, monkeypatch):
    # a long open loop (a day trace: 4.2 M steps) ran out of the records one call was sized for and
    # ran again from the start with 8 x as many (twice the work, 3.5 GB); now it goes on where it
    # stopped, in calls of OPEN_CHUNK_RECORDS records, with progress after each
    monkeypatch.setattr(serve, "OPEN_CHUNK_RECORDS", 16)          # 8 steps a call
    seen = []
    res = jp.simulate(dep, jp.Workload(128, 16), jp.OpenLoop(rate=20.0, num_prompts=12, seed=1),
                      callback=lambda d, t, **i: seen.append((d, t, i["steps"])))
    assert res.summary == whole.summary                            # every number bit for bit
    for k in ("first_token", "finish", "ttft", "e2e", "emits"):
        np.testing.assert_array_equal(res.requests[k], whole.requests[k])
    assert len(seen) >= whole.summary["steps"] // 8 - 1            # one report per call of 8 steps
    done = [d for d, _t, _s in seen]
    assert done == sorted(done) and done[-1] == 12 and {t for _d, t, _s in seen} == {12}
    steps = [s for _d, _t, s in seen]
    assert steps == sorted(steps) and steps[0] == 8


def test_simulate_refuses_a_callback_that_cannot_be_called(dep):
    with pytest.raises(jp.JaxpriceError, match="callback"):
        jp.simulate(dep, jp.Workload(128, 16), jp.OpenLoop(rate=20.0, num_prompts=12, seed=1), callback=3)


def test_open_loop_keeps_one_record_per_step(dep, whole, monkeypatch):
    # the open loop's records were [lanes, the call's whole buffer] (sized for a guess: 32 a request
    # at least), half of them the empty slots of decode runs it never runs; now the steps it took
    kept = []
    run = serve._run_open

    def spy(*a, **k):
        states = run(*a, **k)
        kept.append({key: states[key].shape for key in serve.REC_KEYS})
        return states
    monkeypatch.setattr(serve, "_run_open", spy)
    res = jp.simulate(dep, jp.Workload(128, 16), jp.OpenLoop(rate=20.0, num_prompts=12, seed=1))
    assert res.summary == whole.summary
    (shapes,) = kept
    steps = whole.summary["steps"]
    assert shapes["rec"][:2] == (1, steps) and shapes["rec_floor"] == (1, steps)
    assert shapes["rec_reads"][:2] == shapes["rec_pairs"][:2] == (1, steps)


def test_log_axis_minor_labels_do_not_collide():
    # the timeline's step-time axis of a day trace (9 to 200 ms) drew 9 over 10 and 70, 80, 90 over
    # 100: over a wide log axis only 2 and 5 x a power of ten are labelled; a narrow one labels all
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from jaxprice._src.figures_serve import _plain_ticks
    fig, (wide, narrow) = plt.subplots(2, 1)
    for ax, (lo, hi) in ((wide, (9.0, 200.0)), (narrow, (31.0, 44.0))):
        ax.plot([1, 2], [lo, hi])
        ax.set_yscale("log")
        ax.set_ylim(lo, hi)
        _plain_ticks(ax, ("y",))
    fig.canvas.draw()

    def shown(ax):                   # the labels of the ticks in view
        lo, hi = ax.get_ylim()
        return {t.get_text() for m in (False, True)
                for v, t in zip(ax.get_yticks(minor=m), ax.get_yticklabels(minor=m)) if lo <= v <= hi} - {""}
    assert shown(wide) == {"10", "20", "50", "100", "200"}
    assert {"32", "36", "40", "44"} <= shown(narrow)
    plt.close(fig)


def test_sweep_prices_a_level_at_a_time(dep, monkeypatch):
    # every level's steps were joined into one array before pricing: one more copy of them all
    # (12 levels of 20,480 requests, 38 M steps: 15 GB peak); now each level's alone
    sizes = []
    price = serve.price_flat

    def spy(plan, coefs, laws, flat, **k):
        sizes.append(int(flat["tokens"].shape[0]))
        return price(plan, coefs, laws, flat, **k)
    monkeypatch.setattr(serve, "price_flat", spy)
    out = jp.simulate_sweep(dep, jp.Workload(128, 16), [1, 4], num_prompts=8)
    assert sizes == [r.summary["steps"] for r in out]           # dp 1: a step a row


def test_price_flat_pads_only_its_last_chunk(dep):
    # the whole run was padded to a multiple of the chunk first, one more copy of every column;
    # now each chunk is cut as it is priced: the peak of NumPy memory stays well under the columns'
    import tracemalloc
    rng = np.random.default_rng(0)
    n = 3 * serve.LARGE_CHUNK + 5
    flat = {k: rng.integers(0, 4, n).astype(float) for k in ("tokens", "prefill_tokens", "decode_tokens", "n_decode",
                                                             "n_prefill", "n_requests", "n_off_width", "emit",
                                                             "finishes", "admitted", "admitted_tokens")}
    flat["tokens"] = flat["tokens"] + 1
    L = len(serve.S.read_laws(dep.plan).a)
    flat["reads"] = rng.random((n, L)) * 1e6
    flat["pairs"] = rng.random((n, L)) * 1e6
    laws = serve.S.read_laws(dep.plan)
    first = np.asarray(serve.price_flat(dep.plan, dep.coefficients, laws, {k: v[:10] for k, v in flat.items()}))
    tracemalloc.start()
    try:
        times = np.asarray(serve.price_flat(dep.plan, dep.coefficients, laws, flat))
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    columns = sum(v.nbytes for v in flat.values())
    assert peak < 0.5 * columns, (peak, columns)
    assert times.shape == (n,) and np.array_equal(times[:10], first)      # a step's price whatever its chunk


def test_one_rank_result_steps_are_the_schedule_rows(whole):
    # a one-rank run's per-step columns were summed over its one rank into copies (1.5 GB at 38 M
    # steps); now they are the schedule's own rows
    s = whole.schedule.sums
    for k in ("tokens", "resident", "prefill_tokens", "kv_blocks", "preempted"):
        assert np.shares_memory(whole.steps[k], s[k]) and np.array_equal(whole.steps[k], s[k].sum(axis=0))
        # read-only, so an edit of the result cannot reach the schedule a later price_steps prices
        with pytest.raises(ValueError):
            whole.steps[k][0] = -1

