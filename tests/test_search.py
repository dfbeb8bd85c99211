"""Batch-composition search (jaxprice._src.search, `jaxprice optimize`): the gradient search's
answer is within 1% of an exhaustive exact-mode grid, satisfies its limits in exact mode (priced
again through the public Batch.from_requests + price path), its gradients are finite and agree
with reverse mode, and bad or impossible limits are refused in one line.

Small problems (at most 24 decodes, chunks up to 192 tokens) keep each deployment's grid to a
few thousand compositions; the search and the grid share one compiled exact evaluator."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

import jaxprice as jp
from jaxprice import JaxpriceError
from jaxprice._src import search as S
from jaxprice.cli import main

DEPLOYMENTS = ["deepseek-v3-h200-fp8-sglang-tp8",              # MoE, MLA
               "llama-3.1-70b-instruct-h200-fp8-vllm-tp4",     # dense
               "gpt-oss-120b-h200-fp4-vllm-tp2"]               # MoE, sliding-window layers
SMALL = dict(max_decode=24, prefill_budget=192, context=4096)


@pytest.fixture(scope="module")
def deps():
    return {n: jp.load_deployment(n) for n in DEPLOYMENTS}


def exact_time(dep, decode, prefill, *, context=4096, prefix=0, rows=25, estimate="no_overlap"):
    """The step time of a composition priced the ordinary way (Batch.from_requests + price)."""
    sched = [1] * decode + ([prefill] if prefill else [])
    comp = [context - 1] * decode + ([prefix] if prefill else [])
    r = jp.price(dep.plan, dep.coefficients, jp.Batch.from_requests(sched, comp, pad_to=rows, decode_threshold=1))
    return float(r.no_overlap if estimate == "no_overlap" else r.overlap)


def search_time(dep, decode, prefill, estimate="no_overlap"):
    """The same price from the search's own exact evaluator (shares its compilation)."""
    ex = S._Exact(dep, S.make_limits(dep, **SMALL, itl=1.0), S.EXACT_CHUNK)
    _, overlap, no_overlap, _ = ex.price([decode], [prefill])
    return float((no_overlap if estimate == "no_overlap" else overlap)[0])


def binding_itl(dep, decode, prefill):
    """An ITL limit that binds near (decode, prefill): the step time there."""
    return search_time(dep, decode, prefill) * 1.0001


# ----------------------------------------------------------------------------- against the grid


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_search_within_one_percent_of_the_grid(deps, name):
    dep = deps[name]
    kw = dict(SMALL, itl=binding_itl(dep, 12, 48), prefill_per_output=4.0)
    res = S.optimize_batch(dep, **kw)
    grid = S.grid_search(dep, **kw)
    assert grid.points == 25 * (192 - 2 + 2)            # D in 0..24; P in {0} and 2..192
    assert 0 < grid.feasible_points < grid.points
    assert res.best.feasible and grid.best.feasible
    assert res.best.tokens_per_s >= 0.99 * grid.best.tokens_per_s
    assert res.best.tokens_per_s <= grid.best.tokens_per_s * (1 + 1e-12)     # the grid is exhaustive
    assert res.best.step_time <= kw["itl"]
    assert res.gradients_finite
    b = res.best
    assert b.output_tokens_per_step == pytest.approx(min(b.decode, b.prefill / 4.0))
    assert b.tokens_per_s == pytest.approx(b.output_tokens_per_step / b.step_time)


def test_reported_prices_are_the_ordinary_exact_prices(deps):
    dep = deps["gpt-oss-120b-h200-fp4-vllm-tp2"]
    res = S.optimize_batch(dep, **SMALL, itl=binding_itl(dep, 12, 48), prefill_per_output=4.0)
    b = res.best
    # the same price to the last digits (vmapped and single calls may fuse differently in XLA)
    assert b.no_overlap == pytest.approx(exact_time(dep, b.decode, b.prefill), rel=1e-13)
    assert b.overlap == pytest.approx(exact_time(dep, b.decode, b.prefill, estimate="overlap"), rel=1e-13)
    assert sum(b.resources.values()) == pytest.approx(b.no_overlap, rel=1e-12)
    assert b.max_num_batched_tokens == b.decode + b.prefill
    assert b.itl_slack == pytest.approx(res.limits.itl - b.step_time)
    assert b.prefill_slack == 192 - b.prefill


# ----------------------------------------------------------------------------- constraints


def test_without_a_workload_prefill_sits_at_its_floor(deps):
    """r = 0: prefill emits no output and only costs time, so the step carries the minimum."""
    dep = deps["llama-3.1-70b-instruct-h200-fp8-vllm-tp4"]
    itl = binding_itl(dep, 12, 64)
    free = S.optimize_batch(dep, **SMALL, itl=itl)
    assert free.best.prefill == 0 and free.best.decode > 12
    floor = S.optimize_batch(dep, **SMALL, itl=itl, min_prefill=64)
    assert floor.best.prefill == 64 and floor.best.decode == 12   # the chunk costs decodes under the limit
    grid = S.grid_search(dep, **SMALL, itl=itl, min_prefill=64)
    assert (grid.best.decode, grid.best.prefill) == (12, 64)
    assert grid.points == 25 * (192 - 64 + 1)


def test_token_cap_and_seq_limit_hold(deps):
    dep = deps["gpt-oss-120b-h200-fp4-vllm-tp2"]
    kw = dict(SMALL, itl=1.0, prefill_per_output=1.0, max_batched_tokens=40)
    res = S.optimize_batch(dep, **kw)
    assert res.best.max_num_batched_tokens <= 40
    assert res.best.decode + (res.best.prefill > 0) <= res.limits.max_num_seqs
    grid = S.grid_search(dep, **kw)
    assert grid.best.max_num_batched_tokens <= 40
    assert res.best.tokens_per_s >= 0.99 * grid.best.tokens_per_s
    # with no binding limit and r = 1 the best feeds its decodes exactly: P = D
    assert res.best.prefill == res.best.decode == 20


def test_overlap_estimate_is_limited_and_reported(deps):
    dep = deps["deepseek-v3-h200-fp8-sglang-tp8"]
    itl = search_time(dep, 12, 48, estimate="overlap") * 1.0001
    res = S.optimize_batch(dep, **SMALL, itl=itl, prefill_per_output=4.0, estimate="overlap")
    assert res.best.step_time == res.best.overlap <= itl
    assert res.best.no_overlap > itl                             # NoOverlap is not what is limited
    grid = S.grid_search(dep, **SMALL, itl=itl, prefill_per_output=4.0, estimate="overlap")
    assert res.best.tokens_per_s >= 0.99 * grid.best.tokens_per_s


# ----------------------------------------------------------------------------- the relaxation


def test_relaxation_is_the_smooth_kernel_at_integers_and_linear_between(deps):
    dep = deps["llama-3.1-70b-instruct-h200-fp8-vllm-tp4"]
    lim = S.make_limits(dep, **SMALL, itl=1.0)
    tput, t7 = S.relaxed_throughput(dep, 7.0, 100.0, temperature=0.02, limits=lim)
    batch = jp.Batch.from_requests([1] * 7 + [100], [4095] * 7 + [0], pad_to=25, decode_threshold=1)
    smooth = float(jp.price(dep.plan, dep.coefficients, batch, temperature=0.02).no_overlap)
    assert float(t7) == pytest.approx(smooth, rel=1e-12)
    assert float(tput) == pytest.approx(7.0 / smooth, rel=2e-2)      # a power-mean min(7, 100/r), r = 0
    assert float(t7) == pytest.approx(search_time(dep, 7, 100), rel=0.02)
    _, t8 = S.relaxed_throughput(dep, 8.0, 100.0, temperature=0.02, limits=lim)
    _, tmid = S.relaxed_throughput(dep, 7.25, 100.0, temperature=0.02, limits=lim)
    assert float(tmid) == pytest.approx(0.75 * float(t7) + 0.25 * float(t8), rel=1e-12)
    assert float(t8) > float(t7)


def test_search_gradient_matches_finite_differences_of_the_relaxation(deps):
    """The search's own gradient (a forward-mode derivative of the smooth kernel in P, the
    mixture's slope in D; read back from the compiled search with a zero step size, so that
    every step is at the starting point) equals central differences of the relaxation."""
    dep = deps["llama-3.1-70b-instruct-h200-fp8-vllm-tp4"]
    itl = 0.019
    lim = S.make_limits(dep, **SMALL, itl=itl, prefill_per_output=4.0)
    q = {k: jnp.asarray(v) for k, v in S._params(lim).items()}
    rho = 100.0
    xs = np.asarray(S._starts(16, 0))
    x_end, tput, g = S._descend(dep.plan, dep.coefficients, 25, 0.02, 200, jnp.asarray(xs), jnp.ones(16, bool), q,
                                0.0, rho, rho)
    np.testing.assert_array_equal(np.asarray(x_end), xs)
    g = np.asarray(g)
    assert np.all(np.isfinite(g)) and np.all(np.isfinite(np.asarray(tput)))

    def loss(x):      # the search's loss, from the relaxation as users see it
        decode, prefill = (float(v) for v in S.from_unit(x, q))
        tp, t = S.relaxed_throughput(dep, decode, prefill, temperature=0.02, limits=lim)
        over = max(np.log(float(t) / itl), 0.0) ** 2
        return np.log(float(t)) - np.log(float(tp) * float(t) + 1e-6) + rho * over

    h = 1e-7
    for i in (0, 5, 11):
        fd = [(loss(xs[i] + e) - loss(xs[i] - e)) / (2 * h) for e in (np.array([h, 0.0]), np.array([0.0, h]))]
        np.testing.assert_allclose(g[i], fd, rtol=1e-5)
    # under the limit, with the chunk feeding more than the decodes emit, a decode more pays
    dp = [tuple(float(v) for v in S.from_unit(x, q)) for x in xs]
    times = [float(S.relaxed_throughput(dep, d, p, limits=lim)[1]) for d, p in dp]
    fed = [p / 4.0 > 1.1 * d for d, p in dp]
    assert sum(f and t < itl for f, t in zip(fed, times)) >= 2 and any(t > itl for t in times)
    assert all(gi[0] < 0 for gi, f, t in zip(g, fed, times) if f and t < itl)


def test_new_limits_do_not_recompile(deps):
    """Every limit is a traced number: another ITL, budget, workload, estimate or cap reuses the
    compiled search and exact evaluator."""
    dep = deps["deepseek-v3-h200-fp8-sglang-tp8"]
    S.optimize_batch(dep, **SMALL, itl=binding_itl(dep, 12, 48), prefill_per_output=4.0)
    sizes = S._descend._cache_size(), S._exact_prices._cache_size()
    S.optimize_batch(dep, max_decode=24, prefill_budget=100, context=8192, prefix=512, itl=0.08,
                     prefill_per_output=2.0, estimate="overlap", max_batched_tokens=90, tokens_per_decode=1.0)
    S.grid_search(dep, max_decode=24, prefill_budget=64, itl=0.05, min_prefill=16)
    assert (S._descend._cache_size(), S._exact_prices._cache_size()) == sizes


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("kw, field, words", [
    (dict(itl=1e-5), "itl", "no composition meets it"),
    (dict(itl=0.0), "itl", "> 0"),
    (dict(itl=float("nan")), "itl", "finite"),
    (dict(prefill_budget=-1), "prefill_budget", ">= 0"),
    (dict(prefill_budget=1.5), "prefill_budget", "integer"),
    (dict(min_prefill=300), "min_prefill", "exceeds prefill_budget"),
    (dict(max_decode=1000), "max_decode", "max_num_seqs 256"),
    (dict(context=99999), "context", "max_model_len"),
    (dict(estimate="median"), "estimate", "no_overlap"),
    (dict(prefill_budget=1, prefill_per_output=2.0), "prefill_budget", "no output can be sustained"),
    (dict(max_batched_tokens=10, min_prefill=64), "max_batched_tokens", "smallest step"),
    (dict(tokens_per_decode=0), "tokens_per_decode", "> 0"),
    (dict(tokens_per_decode=1.5), "tokens_per_decode", "must be in [1, 1]"),     # a decode scheduling 1 emits 1.5
])
def test_bad_and_impossible_limits_are_refused(deps, kw, field, words):
    args = dict(SMALL, itl=0.05)
    args.update(kw)
    for fn in (S.optimize_batch, S.grid_search):
        with pytest.raises(JaxpriceError) as err:
            fn(deps["llama-3.1-70b-instruct-h200-fp8-vllm-tp4"], **args)
        assert err.value.field == field and words in str(err.value)


def test_impossible_itl_names_the_smallest_step(deps):
    dep = deps["deepseek-v3-h200-fp8-sglang-tp8"]
    smallest = search_time(dep, 1, 64)
    with pytest.raises(JaxpriceError, match=f"1 decode \\+ a 64-token prefill chunk\\) takes {smallest * 1e3:.3f} ms"):
        S.optimize_batch(dep, **SMALL, itl=smallest * 0.99, min_prefill=64)


# ----------------------------------------------------------------------------- the command line


def test_cli_json_agrees_with_the_library(deps, capsys):
    name = "llama-3.1-70b-instruct-h200-fp8-vllm-tp4"
    itl = binding_itl(deps[name], 12, 48)
    assert main(["optimize", name, "--itl-ms", repr(itl * 1e3), "--prefill-budget", "192", "--max-decode", "24",
                 "--prompt-len", "1024", "--output-len", "256", "--context", "1280", "--grid", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    res = S.optimize_batch(deps[name], **{**SMALL, "context": 1280}, itl=itl, prefill_per_output=4.0)
    assert (doc["optimum"]["decode"], doc["optimum"]["prefill"]) == (res.best.decode, res.best.prefill)
    assert doc["limits"]["prefill_per_output"] == 4.0 and doc["limits"]["itl"] == pytest.approx(itl)
    assert doc["gap"] <= 0.01 and doc["grid"]["points"] == 25 * 192
    assert doc["speedup_warm"] > 0 and doc["search"]["warm_s"] > 0


def test_cli_text(deps, capsys):
    assert main(["optimize", "gpt-oss-120b-h200-fp4-vllm-tp2", "--itl-ms", "1000", "--prefill-budget", "192",
                 "--max-decode", "24", "--prompt-len", "1", "--output-len", "1", "--max-batched-tokens", "40"]) == 0
    out = capsys.readouterr().out
    assert "optimum: 20 decodes + a 20-token prefill chunk" in out
    assert "set max_num_batched_tokens >= 40" in out
    assert "max_num_batched_tokens <= 40" in out
    for col in ("sm", "hbm", "nvlink", "nic", "host", "NoOverlap", "bottleneck"):
        assert col in out


@pytest.mark.parametrize("argv, words", [
    (["no-such-model-h200", "--itl-ms", "50"], "no such scenario"),
    (["llama-3.1-70b-instruct-h200-fp8-vllm-tp4", "--itl-ms", "50", "--prefill-budget", "-5"], "--prefill-budget"),
    (["llama-3.1-70b-instruct-h200-fp8-vllm-tp4", "--itl-ms", "fast"], "--itl-ms"),
    (["llama-3.1-70b-instruct-h200-fp8-vllm-tp4", "--itl-ms", "-3"], "--itl-ms"),
    (["llama-3.1-70b-instruct-h200-fp8-vllm-tp4", "--itl-ms", "0.01", "--max-decode", "24"],
     "--itl-ms', value '0.01 ms': no composition meets it"),
    (["llama-3.1-70b-instruct-h200-fp8-vllm-tp4", "--itl-ms", "50", "--prompt-len", "100"], "--output-len"),
    (["llama-3.1-70b-instruct-h200-fp8-vllm-tp4", "--itl-ms", "50", "--max-decode", "4096"], "max_num_seqs"),
    (["llama-3.1-70b-instruct-h200-fp8-vllm-tp4", "--itl-ms", "50", "--min-prefill", "4000"], "--min-prefill"),
])
def test_cli_refuses_in_one_line_with_exit_2(capsys, argv, words):
    assert main(["optimize", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxprice optimize: error:") and words in err[0]
