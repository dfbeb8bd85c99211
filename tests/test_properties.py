"""Properties of the step over random batches, on all 88 bundled scenarios.

One jitted, vmapped call per scenario prices every batch a property needs (compilation is the
cost; the batches are cheap), then each property is checked on the results.
"""

from pathlib import Path

import numpy as np
import pytest

import jaxprice as jp

SCENARIOS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "testdata" / "aisimulate").glob("*.yaml"))
ROWS = 32


def _random_rows(rng, threshold, n):
    sched, comp = [], []
    for _ in range(n):
        if rng.random() < 0.6:   # decode
            sched.append(int(rng.integers(1, threshold + 1)))
            comp.append(int(rng.integers(0, 32768)))
        else:                    # prefill chunk
            sched.append(int(rng.integers(threshold + 1, 4097)))
            comp.append(int(rng.integers(0, 8192)))
    return sched, comp


def _batches(threshold, seed):
    """Named batches of one padding; pairs (a, b) below must satisfy price(a) <= price(b)."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(4):
        s, c = _random_rows(rng, threshold, int(rng.integers(1, 14)))
        out[f"random{i}"] = (s, c)
        # one more decode request
        out[f"random{i}+decode"] = (s + [1], c + [int(rng.integers(0, 32768))])
        # every request with more context
        out[f"random{i}+context"] = (s, [x + 1000 for x in c])
    out["decode8"] = ([1] * 8, [4095] * 8)
    out["decode9"] = ([1] * 9, [4095] * 9)
    out["decode8-long"] = ([1] * 8, [16383] * 8)
    out["decode16"] = ([1] * 16, [4095] * 16)
    out["decode32"] = ([1] * 32, [4095] * 32)
    batches = {k: jp.Batch.from_requests(s, c, pad_to=ROWS, decode_threshold=threshold) for k, (s, c) in out.items()}
    # the same requests with padding rows interleaved (the mask, not the position, decides)
    s, c = out["random0"]
    n = len(s)
    order = np.random.default_rng(seed + 1).permutation(ROWS)
    sched = np.zeros(ROWS); comp = np.zeros(ROWS); mask = np.zeros(ROWS, bool)
    sched[order[:n]] = s; comp[order[:n]] = c; mask[order[:n]] = True
    # padding rows hold junk values that must not count
    sched[order[n:]] = 777.0; comp[order[n:]] = 999.0
    base = batches["random0"]
    batches["random0-shuffled"] = jp.Batch(np.asarray(sched), np.asarray(comp), np.asarray(sched + comp),
                                           np.asarray(mask), base.decode_threshold)
    batches["empty"] = jp.Batch.from_requests([], [], pad_to=ROWS, decode_threshold=threshold)
    return batches


@pytest.fixture(scope="module", params=SCENARIOS)
def priced(request):
    dep = jp.load_deployment(request.param)
    threshold = int(dep.resolution["decode_threshold"])
    batches = _batches(threshold, seed=SCENARIOS.index(request.param))
    names = list(batches)
    res = jp.price_many(dep.plan, dep.coefficients, jp.Batch.stack([batches[k] for k in names]))
    table = {k: (np.asarray(res.resources[i]), float(res.overlap[i]), float(res.no_overlap[i]),
                 int(res.bottleneck[i])) for i, k in enumerate(names)}
    return dep, batches, table


def test_estimates_are_consistent(priced):
    _dep, _b, table = priced
    for name, (resources, overlap, no_overlap, bottleneck) in table.items():
        assert np.all(np.isfinite(resources)) and np.all(resources >= 0), name
        assert overlap <= no_overlap, name
        assert resources.sum() == pytest.approx(no_overlap, rel=1e-13), name
        assert resources[bottleneck] == resources.max(), name
        assert overlap > 0, name


def test_monotone_in_requests_and_context(priced):
    _dep, _b, table = priced
    for i in range(4):
        base = table[f"random{i}"][2]
        assert table[f"random{i}+decode"][2] >= base
        assert table[f"random{i}+context"][2] >= base
        assert table[f"random{i}+decode"][1] >= table[f"random{i}"][1] * (1 - 1e-12)
    assert table["decode9"][2] >= table["decode8"][2]
    # HBM strictly increasing in context for a decode batch
    assert table["decode8-long"][0][1] > table["decode8"][0][1]


def test_doubling_a_decode_batch_less_than_doubles_the_step(priced):
    _dep, _b, table = priced
    assert table["decode16"][2] < table["decode32"][2] < 2 * table["decode16"][2]


def test_empty_step_costs_host_only(priced):
    _dep, _b, table = priced
    resources, overlap, no_overlap, bottleneck = table["empty"]
    assert np.all(resources[:4] == 0.0)
    assert resources[4] > 0
    assert overlap == no_overlap == resources[4]
    assert jp.RESOURCES[bottleneck] == "host"


def test_padding_rows_change_nothing(priced):
    _dep, _b, table = priced
    a, b = table["random0"], table["random0-shuffled"]
    np.testing.assert_allclose(a[0], b[0], rtol=1e-13, atol=0)
    assert a[2] == pytest.approx(b[2], rel=1e-13)


@pytest.mark.parametrize("name", SCENARIOS[::20])
def test_vmap_equals_a_python_loop(name):
    dep = jp.load_deployment(name)
    thr = int(dep.resolution["decode_threshold"])
    batches = _batches(thr, seed=7)
    keys = ["random0", "random1", "random2", "decode8", "empty"]
    many = jp.price_many(dep.plan, dep.coefficients, jp.Batch.stack([batches[k] for k in keys]))
    for i, k in enumerate(keys):
        one = jp.step_time(dep.plan, dep.coefficients, batches[k])
        np.testing.assert_allclose(np.asarray(one.resources), np.asarray(many.resources[i]), rtol=1e-12)
        assert float(one.no_overlap) == pytest.approx(float(many.no_overlap[i]), rel=1e-12)


def test_deterministic():
    dep = jp.load_deployment(SCENARIOS[0])
    b = jp.Batch.decode(8, 2048, pad_to=ROWS)
    r1 = jp.price(dep.plan, dep.coefficients, b)
    r2 = jp.price(dep.plan, dep.coefficients, b)
    assert np.array_equal(np.asarray(r1.resources), np.asarray(r2.resources))
