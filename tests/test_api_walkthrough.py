"""What a user building serving simulators and fleet tools on jaxprice's Python API hit (a
walkthrough of the deployment axis, the serving simulation as a library, sharding and pytrees),
each fixed and pinned here; every test failed before its fix.

Lean: two Llama-3.1-70B deployments (one layer kind: the cheapest kernel to compile) of one
structure on two chips (four in the deployment-bucket test), tiny batches, one tiny closed-loop schedule shared by the serving tests;
most checks are refusals raised before anything is jitted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprice as jp
from jaxprice._src.sweep import batch_mesh

H200 = "llama-3.1-70b-instruct-h200-fp8-vllm-tp2"
B200 = "llama-3.1-70b-instruct-b200-fp8-vllm-tp2"


@pytest.fixture(scope="module")
def deps():
    return jp.load_deployment(H200), jp.load_deployment(B200)


@pytest.fixture(scope="module")
def batches():
    return jp.Batch.stack([jp.Batch.decode(n, 1024, pad_to=8, decode_threshold=8) for n in (1, 8)])


@pytest.fixture(scope="module")
def sched(deps):
    """One tiny closed-loop schedule (its steps are never priced here: no kernel compile)."""
    return jp.build_schedule(deps[0], jp.Workload(16, 4, 1.0), jp.ClosedLoop(1, num_prompts=2))


def _nan_at(coefs, name):
    v = np.array(coefs.values, dtype=float)
    v[coefs.index(name)] = np.nan
    return jp.Coefficients(v, coefs.names)


# ----------------------------------------------------------------------------- deployment axis


def test_a_callers_jit_over_plan_stacks_prices_each_stack_with_its_own_coefficient_names(deps, batches):
    """A fleet tool jitted its pricing function over a PlanStack argument. Two stacks of one
    structure and size compared equal as tree structures (the per-deployment coefficient names
    counted by length only), so the second call reused the first's trace, role index baked in:
    the B200 stack read the H200's collective coefficients, NaN in its own union row (DeepSeek-V3
    with shared coefficients: 8.16 ms where its price is 8.48). Now the names are identity."""
    h, b = deps
    one, two = jp.stack_plans([h]), jp.stack_plans([b])
    assert one.structure == two.structure and one.slot_names != two.slot_names
    sets = jp.stack_deployment_coefficients([h.coefficients, b.coefficients])
    rows = [jp.Coefficients(sets.values[k:k + 1], sets.names) for k in range(2)]
    f = jax.jit(lambda s, c, bb: jp.price_deployments(s, c, bb).no_overlap)
    for stack, c, d in ((one, rows[0], h), (two, rows[1], b)):
        got = np.asarray(f(stack, c, batches))[0]
        alone = np.asarray(jp.price_many(d.plan, d.coefficients, batches).no_overlap)
        assert np.all(np.isfinite(got)), d.plan.name
        np.testing.assert_allclose(got, alone, rtol=1e-12, err_msg=d.plan.name)


def test_a_stack_that_grows_by_one_deployment_does_not_compile_again_within_its_bucket(batches):
    """A fleet tool adding deployments one at a time compiled price_deployments once per count
    (the deployment axis is a shape: 2-4 s each on two cores, though the docstring said
    'whatever the deployments'). Now the axis is padded to a power of two with copies of the
    last deployment and cut off the result: 3 and 4 deployments share a compile, and each
    deployment's prices are still price_many's bit for bit."""
    names = [f"llama-3.1-70b-instruct-{c}-fp8-vllm-tp{t}" for c, t in (("h200", 2), ("h200", 4), ("b200", 2),
                                                                       ("b200", 4))]
    four = [jp.load_deployment(n) for n in names]
    sets = [d.coefficients for d in four]
    three = jp.price_deployments(jp.stack_plans(four[:3]), jp.stack_deployment_coefficients(sets[:3]), batches)
    assert np.shape(three.no_overlap) == (3, 2)
    before = jp.kernel_compiles()
    res = jp.price_deployments(jp.stack_plans(four), jp.stack_deployment_coefficients(sets), batches)
    assert jp.kernel_compiles() == before
    union = jp.stack_deployment_coefficients(sets).names
    for k, d in enumerate(four):
        own = np.full(len(union), np.nan)
        own[[union.index(n) for n in d.coefficients.names]] = np.asarray(d.coefficients.values)
        alone = jp.price_many(d.plan, jp.Coefficients(own, union), batches)
        for f in ("resources", "overlap", "no_overlap", "bottleneck"):
            np.testing.assert_array_equal(np.asarray(getattr(res, f))[k], np.asarray(getattr(alone, f)),
                                          f"{d.plan.name} {f}")
            if k < 3:
                np.testing.assert_array_equal(np.asarray(getattr(three, f))[k], np.asarray(getattr(alone, f)))


def test_stacking_sets_of_other_chips_points_at_the_union_stacker(deps):
    """``help(price_deployments)`` said one set per deployment comes from ``stack_coefficients``;
    ``jaxprice.stack_coefficients`` (the sweep's) refused an H200 and a B200 set with 'must share
    one list of names' and no word of ``stack_deployment_coefficients``, which stacks the union."""
    with pytest.raises(jp.JaxpriceError, match="stack_deployment_coefficients"):
        jp.stack_coefficients([d.coefficients for d in deps])
    assert "stack_deployment_coefficients" in jp.price_deployments.__doc__


# ----------------------------------------------------------------------------- one set vs several


@pytest.mark.parametrize("fn", ["price", "price_many", "step_time", "price_sharded"])
def test_pricing_one_set_refuses_stacked_sets_naming_what_prices_several(deps, batches, fn):
    """Stacked sets (``stack_coefficients``: values [sets, names]) given to price, price_many,
    step_time or price_sharded died inside the kernel ('Incompatible shapes for broadcasting')."""
    d = deps[0]
    sets = jp.stack_coefficients([d.coefficients, d.coefficients.replace(hbm_derate=0.5)])
    one = jax.tree_util.tree_map(lambda x: x[0], batches)
    args = {"price": (one,), "price_many": (batches,), "step_time": (one,), "price_sharded": (batches,)}[fn]
    with pytest.raises(jp.JaxpriceError, match="stacks 2 coefficient sets.*price_coefficient_sets"):
        getattr(jp, fn)(d.plan, sets, *args)


def test_price_sharded_differentiates_as_price_many(deps, batches):
    """price_sharded read the coefficients with np.asarray, so jax.grad (or a caller's jit) of a
    loss over a sharded sweep died in a TracerArrayConversionError; price_many differentiates."""
    d = deps[0]
    mesh = batch_mesh()
    got = jax.grad(lambda c: jnp.sum(jp.price_sharded(d.plan, c, batches, mesh=mesh).no_overlap))(d.coefficients)
    ref = jax.grad(lambda c: jnp.sum(jp.price_many(d.plan, c, batches).no_overlap))(d.coefficients)
    assert np.any(np.asarray(ref.values) != 0)
    np.testing.assert_allclose(np.asarray(got.values), np.asarray(ref.values), rtol=1e-12, atol=0)


# ----------------------------------------------------------------------------- the serving simulation


def test_simulate_under_grad_or_jit_is_refused_pointing_at_the_differentiable_path(deps):
    """jax.grad of a function calling simulate (or simulate_sweep) died in a
    TracerArrayConversionError from inside the scheduler: it returns NumPy results. Now refused
    before anything runs, naming build_schedule and schedule_metrics; an open loop's
    build_schedule (its steps priced while it is scheduled) too."""
    d = deps[0]
    w = jp.Workload(16, 4, 1.0)
    with pytest.raises(jp.JaxpriceError, match="build_schedule.*schedule_metrics"):
        jax.grad(lambda c: jp.simulate(d, w, jp.ClosedLoop(1, num_prompts=2), coefficients=c).summary["tpot_mean"])(
            d.coefficients)
    with pytest.raises(jp.JaxpriceError, match="simulate_sweep .*cannot run under jax.grad"):
        jax.jit(lambda c: jp.simulate_sweep(d, w, [1], coefficients=c)[0].summary["tpot_mean"])(d.coefficients)
    with pytest.raises(jp.JaxpriceError, match="open-loop"):
        jax.grad(lambda c: jp.build_schedule(d, w, jp.OpenLoop(10.0, 2), coefficients=c).steps * c.values[0])(
            d.coefficients)


def test_a_run_refuses_stacked_sets_and_names_the_vmap(deps, sched):
    """simulate, simulate_sweep, build_schedule, Schedule.step_times and schedule_metrics given
    stacked sets died in 'Incompatible shapes for broadcasting' (build_schedule took them)."""
    d = deps[0]
    sets = jp.stack_coefficients([d.coefficients, d.coefficients])
    w, cl = jp.Workload(16, 4, 1.0), jp.ClosedLoop(1, num_prompts=2)
    calls = [lambda: jp.simulate(d, w, cl, coefficients=sets),
             lambda: jp.simulate_sweep(d, w, [1], coefficients=sets),
             lambda: jp.build_schedule(d, w, cl, coefficients=sets),
             lambda: sched.step_times(sets),
             lambda: jp.schedule_metrics(sched, np.full(sched.steps, 0.01), sets)]
    for call in calls:
        with pytest.raises(jp.JaxpriceError, match="ONE coefficient set.*jax.vmap"):
            call()


def test_a_nan_coefficient_is_refused_by_step_times_and_simulate(deps, sched):
    """price() refuses a NaN where the plan reads; Schedule.step_times priced every step NaN and
    simulate returned a NaN TTFT and TPOT without a word."""
    d = deps[0]
    bad = _nan_at(d.coefficients, "hbm_derate")
    with pytest.raises(jp.JaxpriceError, match=r"coefs\[hbm_derate\].*finite"):
        sched.step_times(bad)
    with pytest.raises(jp.JaxpriceError, match=r"coefs\[hbm_derate\].*finite"):
        jp.simulate(d, jp.Workload(16, 4, 1.0), jp.ClosedLoop(1, num_prompts=2), coefficients=bad)
    with pytest.raises(jp.JaxpriceError, match=r"coefs\[host_admission_per_request\].*finite"):
        jp.schedule_metrics(sched, np.full(sched.steps, 0.01), _nan_at(d.coefficients, "host_admission_per_request"))


def test_schedule_metrics_takes_step_times_as_a_list(sched):
    """Its check took a list of step times (and checked its values), then indexing it died:
    'only integer scalar arrays can be converted to a scalar index'."""
    times = [0.01 * (1 + k % 3) for k in range(sched.steps)]
    got = jp.schedule_metrics(sched, times)["summary"]
    ref = jp.schedule_metrics(sched, np.asarray(times))["summary"]
    assert got["ttft_mean"] == ref["ttft_mean"] > 0 and got["tpot_mean"] == ref["tpot_mean"] > 0


def test_as_dict_of_many_batches_gives_arrays(deps, batches):
    """``price_many(...).as_dict()`` (and a deployment axis's) raised 'only 0-dimensional arrays
    can be converted to Python scalars': as_dict called float() on every field."""
    d = deps[0]
    r = jp.price_many(d.plan, d.coefficients, batches)
    got = r.as_dict()
    np.testing.assert_array_equal(got["no_overlap"], np.asarray(r.no_overlap))
    np.testing.assert_array_equal(got["hbm"], np.asarray(r.resources)[:, jp.RESOURCES.index("hbm")])
    assert got["bottleneck"].tolist() == [jp.RESOURCES[int(i)] for i in np.asarray(r.bottleneck)]
    assert got["no_overlap"].shape == (2,)


# ----------------------------------------------------------------------------- pytrees, pickling


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_pickled_or_copied_set_or_batch_stays_read_only(deps, how):
    """Coefficients and Batch hold NumPy values read-only, so a value changed in place after the
    pricing entry points checked it (they remember the check by identity) is refused, not priced.
    Pickle and deepcopy restored the instance dict: writeable arrays beside the 'checked' mark,
    and ``c.values[i] = nan`` then priced NaN without a word. Now they rebuild through the
    constructor (checked again, read-only)."""
    import copy
    import pickle
    dup = (lambda x: pickle.loads(pickle.dumps(x))) if how == "pickle" else copy.deepcopy
    c = deps[0].coefficients
    c2 = dup(c)
    assert c2.names == c.names and c2.units == c.units and np.array_equal(np.asarray(c2.values), np.asarray(c.values))
    with pytest.raises(ValueError, match="read-only"):
        c2.values[c2.index("hbm_derate")] = np.nan
    b = dup(jp.Batch(np.array([1.0, 0.0]), np.array([7.0, 0.0]), np.array([8.0, 0.0]), np.array([True, False]),
                     np.array(8.0)))
    with pytest.raises(ValueError, match="read-only"):
        b.scheduled[0] = np.nan


def test_a_plan_stack_sliced_by_tree_map_is_refused(deps, batches):
    """``jax.tree.map(lambda x: x[:1], stack)`` slices the values (the stack's one leaf) but not
    the deployments' names and coefficient names riding in its tree structure: price_deployments
    died inside its ``lax.map`` ('scan got values with different leading axis sizes: 1, 2'); with
    the axis padded to a bucket it would price the first deployment under both names."""
    stack = jp.stack_plans(list(deps))
    union = jp.stack_deployment_coefficients([d.coefficients for d in deps])
    shared = jp.Coefficients(np.nanmax(np.asarray(union.values), axis=0), union.names)
    with pytest.raises(jp.JaxpriceError, match="sliced by jax.tree_util.tree_map.*stack_plans"):
        jp.price_deployments(jax.tree.map(lambda x: x[:1], stack), shared, batches)


def test_reading_an_unknown_coefficient_says_so_and_suggests_the_name(deps):
    """``coefs["hbm_deratee"]`` said "the plan needs a coefficient these Coefficients do not
    carry", though no plan was involved (replace() already said 'is not a name ... near
    matches')."""
    c = deps[0].coefficients
    with pytest.raises(jp.JaxpriceError, match="'hbm_deratee': is not a name these Coefficients carry; near matches: "
                                               "hbm_derate"):
        c["hbm_deratee"]
