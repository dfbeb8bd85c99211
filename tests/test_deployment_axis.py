"""The deployment axis (stack.py): one compiled kernel for every deployment of a model graph.

Every bundled scenario is priced by ``price_deployments`` in one stack per structure and
compared with ``price_many`` of the deployment alone, bit for bit (on one device and with the
deployment axis split over four); gradients on a subset, bit for bit too.
One compile per structure: a retrace guard prices a new deployment of a known structure, and
the sweep's coefficient-set pricing compiles once per structure too.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprice as jp
from jaxprice._src import stack as st
from jaxprice._src.sweep import random_batches

SCENARIOS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "testdata" / "aisimulate").glob("*.yaml"))
FIELDS = ("resources", "overlap", "no_overlap", "bottleneck", "bottleneck_weights")
# KNOWN DIVERGENCE [single-call-grad-ulps] (step._kernel_one): price()'s conditional tail
# differentiates to 2 ulps of the plain kernel (values bit for bit)
ULPS = 2


def _same(actual, desired, msg=""):
    np.testing.assert_array_equal(np.asarray(actual), np.asarray(desired), err_msg=msg)


@pytest.fixture(scope="module")
def deployments():
    return {n: jp.load_deployment(n) for n in SCENARIOS}


@pytest.fixture(scope="module")
def groups(deployments):
    return [[SCENARIOS[i] for i in idx] for _, idx in jp.group_by_structure([deployments[n] for n in SCENARIOS])]


@pytest.fixture(scope="module")
def batches():
    b = random_batches(np.random.default_rng(0), 12, 32, decode_threshold=8)
    return {"float64": b, "int32": b.astype(jnp.int32)}


def test_one_structure_per_model_graph(deployments, groups):
    graphs = {deployments[n].graph.name for n in SCENARIOS}
    # chip, tp/ep/dp, quantization and engine share one; two graphs of one architecture
    # (DeepSeek-V3 and Kimi-K2.5) may share one too
    assert len(groups) <= len(graphs)
    for graph in graphs:
        assert sum(any(deployments[n].graph.name == graph for n in g) for g in groups) == 1, graph
    big = max(groups, key=len)
    assert len({deployments[n].chip.name for n in big}) > 1 or len({deployments[n].resolution["tp"] for n in big}) > 1


def _own(coefs, k):
    """Row k of stacked sets: deployment k's own values (NaN where it has no such name)."""
    return jp.Coefficients(coefs.values[k], coefs.names)


# every bundled scenario, grouped by structure: int32 counts in the default run (13 s), float64
# counts (the float row walk, ~65 s) in the slow run
@pytest.mark.parametrize("dtype", [pytest.param("float64", marks=pytest.mark.slow), "int32"])
def test_exact_mode_equals_each_deployment_alone_bit_for_bit(deployments, groups, batches, dtype):
    b = batches[dtype]
    for g in groups:
        stack = jp.stack_plans([deployments[n] for n in g])
        coefs = jp.stack_deployment_coefficients([deployments[n].coefficients for n in g])
        res = jp.price_deployments(stack, coefs, b)
        for k, n in enumerate(g):
            # alone, with its own values (the union's names: one compile per structure)
            alone = jp.price_many(deployments[n].plan, _own(coefs, k), b)
            for f in FIELDS:
                _same(np.asarray(getattr(res, f))[k], np.asarray(getattr(alone, f)), f"{n} {f}")
        if dtype == "float64":      # and with its own Coefficients, as loaded
            own = jp.price_many(deployments[g[-1]].plan, deployments[g[-1]].coefficients, b)
            _same(np.asarray(res.no_overlap)[-1], np.asarray(own.no_overlap))


SHARDED_WORKER = """
import json, sys
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import jaxprice as jp
from jaxprice._src import stack as st
from jaxprice._src.sweep import random_batches
deps = [jp.load_deployment(n) for n in json.loads(sys.argv[1])]
b = random_batches(np.random.default_rng(0), 12, 32, decode_threshold=8).astype(jnp.int32)
stack = jp.stack_plans(deps)
coefs = jp.stack_deployment_coefficients([d.coefficients for d in deps])
on = NamedSharding(Mesh(np.asarray(jax.devices()), ("d",)), PartitionSpec("d"))
sharded = st.PlanStack(stack.structure, jax.device_put(stack.values, on), stack.slot_names, stack.names)
res = jp.price_deployments(sharded, jp.Coefficients(jax.device_put(coefs.values, on), coefs.names), b)
out = {"devices": jax.device_count(), "shards": st._shards(sharded.values, len(deps)),
       "result_devices": len(res.no_overlap.sharding.device_set)}
for k, d in enumerate(deps):
    alone = jp.price_many(d.plan, jp.Coefficients(coefs.values[k], coefs.names), b)
    out[d.name] = [int(np.sum(np.asarray(getattr(res, f))[k] != np.asarray(getattr(alone, f))))
                   for f in ("resources", "overlap", "no_overlap", "bottleneck_weights", "bottleneck")]
print(json.dumps(out))
"""


def test_a_deployment_axis_split_over_four_devices_prices_each_deployment_bit_for_bit():
    """Four virtual CPU devices, eight deployments: each device maps its own two (stack._price_body
    with shards = 4), and every price equals pricing the deployment alone bit for bit. These
    Llama-3.1-70B deployments are the ones a vmap over the deployment axis priced 1 ulp apart."""
    import json
    import os
    import subprocess
    import sys
    names = [n for n in SCENARIOS if n.startswith("llama-3.1-70b-instruct")][:8]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", SHARDED_WORKER, json.dumps(names)], capture_output=True, text=True,
                         env=env, cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert (got.pop("devices"), got.pop("shards"), got.pop("result_devices")) == (4, 4, 4)
    assert got == {n: [0, 0, 0, 0, 0] for n in names}


def test_the_sweep_prices_coefficient_sets_once_per_structure(deployments, groups, batches):
    """sweep.price_coefficient_sets compiles per plan structure: another deployment of a known
    structure does not compile again, and each set prices as price() alone."""
    from jaxprice._src.sweep import price_coefficient_sets, stack_coefficients
    g = max(groups, key=len)
    one = jax.tree_util.tree_map(lambda x: x[3], batches["float64"])
    first = deployments[g[0]]
    sets = stack_coefficients([first.coefficients, first.coefficients.replace(hbm_derate=0.5)])
    price_coefficient_sets(first.plan, sets, one)
    before = jp.kernel_compiles()
    other = next(deployments[n] for n in g[1:] if deployments[n].coefficients.names == first.coefficients.names)
    c = other.coefficients
    res = price_coefficient_sets(other.plan, stack_coefficients([c, c.replace(hbm_derate=0.5)]), one)
    assert jp.kernel_compiles() == before
    for k, s in enumerate((c, c.replace(hbm_derate=0.5))):
        _same(np.asarray(res.no_overlap)[k], np.asarray(jp.price(other.plan, s, one).no_overlap))
    assert float(res.no_overlap[1]) > float(res.no_overlap[0])


# the constant-folded single-deployment kernel (price(fold=True): a compile per plan, faster
# for one deployment; experiments/bench.py prints both) against the traced one (a compile per
# structure): XLA rewrites constant subexpressions of the folded one, so a few prices differ by
# a few ulps (times: 6 at most over the 88 scenarios x 12 batches x exact and smooth, checked once;
# the smooth bottleneck weights, a softmax of them, up to 28 ulps, 4e-15 relative)
FOLD_ULPS = 8


def test_folded_and_traced_single_deployment_kernels_agree(deployments, groups, batches):
    # exact mode on every fourth structure, smooth mode on the first (each a compile per plan)
    for g, temperature in [(groups[0], 0.3)] + [(g, None) for g in groups[::4]]:
        dep = deployments[g[0]]
        for k in (0, 5):
            one = jax.tree_util.tree_map(lambda x, k=k: x[k], batches["int32"])
            traced = jp.price(dep.plan, dep.coefficients, one, temperature=temperature)
            folded = jp.price(dep.plan, dep.coefficients, one, temperature=temperature, fold=True)
            for f in FIELDS:
                a, d = np.asarray(getattr(folded, f)), np.asarray(getattr(traced, f))
                if a.dtype.kind in "iub":
                    np.testing.assert_array_equal(a, d, err_msg=f"{g[0]} {f}")
                elif f == "bottleneck_weights":     # a softmax of the times: small weights amplify an ulp
                    np.testing.assert_allclose(a, d, rtol=1e-13, atol=1e-16, err_msg=f"{g[0]} {f}")
                else:
                    np.testing.assert_array_max_ulp(a, d, maxulp=FOLD_ULPS)
            assert float(traced.no_overlap) > 0


def _uncond_kernel(dep, fold, temperature):
    """price()'s kernel without the conditional tail of step._kernel_one (the reference), as a
    jitted function of (coefficients, batch)."""
    from jaxprice._src import step
    smooth, tau = step.temperature_arg(temperature)
    structure, values, index = step._traced_args(dep.plan, dep.coefficients)     # outside the trace

    def kernel(coefs, batch):
        if fold:
            view, rv = st.folded_view(dep.plan), st.folded_roles(dep.plan, coefs)
        else:
            view, rv = st.traced_view(structure, values), st.role_values(coefs.values, index)
        return step.exact_at_zero(lambda t: step._kernel(view, rv, batch, t, False), tau if smooth else None)
    return jax.jit(kernel)


@pytest.mark.parametrize("fold,temperature", [(False, None), (True, None),
                                               pytest.param(False, 0.3, marks=pytest.mark.slow)])   # ~20 s
def test_single_call_tail_under_a_cond_prices_and_differentiates_bit_for_bit(deployments, groups, batches, fold,
                                                                             temperature):
    """price() runs its scalar tail inside a lax.cond (step._kernel_one: XLA:CPU then runs it in
    the calling thread): values equal the plain kernel's bit for bit and coefficient gradients
    to ULPS, in exact mode (smooth mode too under -m slow), and a vmap of price() keeps the cond
    (an unbatched predicate) rather than computing both branches."""
    dep = deployments["llama-3.1-70b-instruct-h200-fp8-vllm-tp4"]     # a dense graph: quick compiles
    one = jax.tree_util.tree_map(lambda x: x[5], batches["float64"])
    got = jp.price(dep.plan, dep.coefficients, one, temperature=temperature, fold=fold)
    ref_fn = _uncond_kernel(dep, fold, temperature)
    ref = ref_fn(dep.coefficients, one)
    for f in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(ref, f)), err_msg=f)
    g = jax.grad(lambda c: jp.price(dep.plan, c, one, temperature=temperature, fold=fold).no_overlap)
    g_ref = jax.jit(jax.grad(lambda c: ref_fn(c, one).no_overlap))
    # gradients: XLA may sum the gather's cotangents in another order (KNOWN DIVERGENCE single-call-grad-ulps)
    np.testing.assert_array_max_ulp(np.asarray(g(dep.coefficients).values),
                                    np.asarray(g_ref(dep.coefficients).values), maxulp=ULPS)
    vmapped = jax.make_jaxpr(jax.vmap(lambda b: jp.price(dep.plan, dep.coefficients, b, fold=fold).no_overlap))
    assert " cond[" in str(vmapped(batches["float64"]))


def _loss_alone(dep, coefs, b):
    return jax.grad(lambda c: jnp.sum(jp.price_many(dep.plan, c, b).no_overlap))(coefs).values


@pytest.mark.slow     # ~50 s; shared-coefficient gradients are checked in the default run
def test_coefficient_gradients_equal_each_deployment_alone(deployments, groups, batches):
    b = batches["float64"]
    for g in groups[::3]:
        names = g[:3]
        stack = jp.stack_plans([deployments[n] for n in names])
        coefs = jp.stack_deployment_coefficients([deployments[n].coefficients for n in names])
        grads = jax.grad(lambda c: jnp.sum(jp.price_deployments(stack, c, b).no_overlap))(coefs).values
        for k, n in enumerate(names):
            dep = deployments[n]
            alone = np.asarray(_loss_alone(dep, _own(coefs, k), b))
            used = [coefs.names.index(x) for x in dep.coefficients.names]
            _same(np.asarray(grads)[k, used], alone[used], n)
            # a name this deployment does not carry (NaN in its row) gets exactly zero
            others = [i for i, x in enumerate(coefs.names) if x not in dep.coefficients]
            assert np.all(np.asarray(grads)[k, others] == 0.0)
            assert np.all(np.isnan(np.asarray(coefs.values)[k, others]))


def test_shared_coefficients_sum_gradients_over_deployments(deployments, groups, batches):
    g = max(groups, key=len)[:3]
    union = jp.stack_deployment_coefficients([deployments[n].coefficients for n in g])
    # one shared set: every deployment's own values where they agree, the first's otherwise
    shared_values = np.nanmean(np.asarray(union.values), axis=0)
    shared = jp.Coefficients(jnp.asarray(shared_values), union.names)
    b = batches["float64"]
    stack = jp.stack_plans([deployments[n] for n in g])
    total = jax.grad(lambda c: jnp.sum(jp.price_deployments(stack, c, b).no_overlap))(shared).values
    per = jax.grad(lambda c: jnp.sum(jp.price_deployments(
        stack, st.stack_coefficients([c] * len(g)), b).no_overlap))(shared).values
    np.testing.assert_allclose(np.asarray(total), np.asarray(per), rtol=1e-12, atol=0)
    res = jp.price_deployments(stack, shared, b)
    for k, n in enumerate(g):
        alone = jp.price_many(deployments[n].plan, shared, b)
        _same(np.asarray(res.no_overlap)[k], np.asarray(alone.no_overlap))


def test_a_new_deployment_of_a_known_structure_does_not_compile_again(deployments, groups, batches):
    g = max(groups, key=len)
    b = batches["int32"]
    first = jp.stack_plans([deployments[n] for n in g[:2]])
    jp.price_deployments(first, st.stack_coefficients([deployments[n].coefficients for n in g[:2]]), b)
    before = jp.kernel_compiles()
    other = jp.stack_plans([deployments[n] for n in g[-2:]])      # other deployments, same structure
    r = jp.price_deployments(other, st.stack_coefficients([deployments[n].coefficients for n in g[-2:]]), b)
    assert jp.kernel_compiles() == before
    _same(np.asarray(r.no_overlap)[1],
          np.asarray(jp.price_many(deployments[g[-1]].plan, deployments[g[-1]].coefficients, b).no_overlap))


def test_padded_rate_classes_contribute_exactly_zero_with_zero_gradient(deployments, batches):
    dep = deployments[SCENARIOS[0]]
    split = st.split_plan(dep.plan)
    n_real = len(dep.plan.arrays["class_peak"])
    key = [e for e in split.structure.layout if e[1] == "class_peak"][0]
    _, _, shape, _, off = key
    assert shape[0] == st.CLASS_SLOTS > n_real
    padded = np.arange(off + max(n_real, len(dep.plan.coef["classes"])), off + shape[0])
    assert len(padded)
    b = batches["float64"]
    stack = jp.stack_plans([dep])
    coefs = st.stack_coefficients([dep.coefficients])
    base = jp.price_deployments(stack, coefs, b)
    # junk in the padding changes nothing
    junk = np.array(stack.values)
    junk[0, padded] = 123.0
    moved = jp.price_deployments(st.PlanStack(stack.structure, junk, stack.slot_names, stack.names), coefs, b)
    np.testing.assert_array_equal(np.asarray(moved.no_overlap), np.asarray(base.no_overlap))
    # and the gradient with respect to the padding is exactly zero (the values are a traced leaf)
    def loss(values):
        s = st.PlanStack(stack.structure, values, stack.slot_names, stack.names)
        return jnp.sum(jp.price_deployments(s, coefs, b).no_overlap)
    g = np.asarray(jax.grad(loss)(jnp.asarray(stack.values)))
    assert np.all(g[0, padded] == 0.0)
    assert np.any(g[0, off:off + n_real] != 0.0)          # the real peak does matter


def test_padding_batches_and_rows_across_deployments_changes_nothing(deployments, groups):
    g = max(groups, key=len)[:3]
    rng = np.random.default_rng(3)
    own = [random_batches(rng, n, rows, decode_threshold=8) for n, rows in ((5, 16), (9, 32), (2, 8))]
    res = jp.price_plans([deployments[n] for n in g], [deployments[n].coefficients for n in g], own)
    for n, b, r in zip(g, own, res):
        alone = jp.price_many(deployments[n].plan, deployments[n].coefficients, b)
        assert r.no_overlap.shape == alone.no_overlap.shape
        np.testing.assert_allclose(np.asarray(r.no_overlap), np.asarray(alone.no_overlap), rtol=1e-15, atol=0)


def test_padding_across_deployments_has_exactly_zero_gradient(deployments, groups):
    """Rows and batches padded across deployments (pad_batches) get exactly zero gradient with
    respect to their token counts; real rows do not."""
    import dataclasses
    g = max(groups, key=len)[:2]
    rng = np.random.default_rng(5)
    b, _ = st.pad_batches([random_batches(rng, n, rows, decode_threshold=8, empty=False)
                           for n, rows in ((3, 8), (5, 16))])
    stack = jp.stack_plans([deployments[n] for n in g])
    coefs = st.stack_coefficients([deployments[n].coefficients for n in g])

    def loss(sched, comp):
        return jnp.sum(jp.price_deployments(stack, coefs, dataclasses.replace(b, scheduled=sched,
                                                                              computed=comp)).no_overlap)
    gs, gc = (np.asarray(x) for x in jax.grad(loss, argnums=(0, 1))(b.scheduled, b.computed))
    pad = ~np.asarray(b.mask)
    assert pad[0, :, 8:].all() and pad[0, 3:].all()          # padded rows and whole padded batches
    assert np.all(gs[pad] == 0.0) and np.all(gc[pad] == 0.0)
    assert np.all(np.isfinite(gs)) and np.any(gs[~pad] != 0.0) and np.any(gc[~pad] != 0.0)


def test_smooth_mode_on_the_deployment_axis(deployments, groups, batches):
    g = groups[0][:2]
    b = batches["float64"]
    stack = jp.stack_plans([deployments[n] for n in g])
    coefs = st.stack_coefficients([deployments[n].coefficients for n in g])
    exact = jp.price_deployments(stack, coefs, b)
    zero = jp.price_deployments(stack, coefs, b, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(zero.no_overlap), np.asarray(exact.no_overlap))
    smooth = jp.price_deployments(stack, coefs, b, temperature=0.05)
    for k, n in enumerate(g):
        alone = jp.price_many(deployments[n].plan, deployments[n].coefficients, b, temperature=0.05)
        np.testing.assert_allclose(np.asarray(smooth.no_overlap)[k], np.asarray(alone.no_overlap), rtol=1e-12)


def test_different_structures_are_refused_naming_what_differs(deployments):
    a = deployments["deepseek-v3-h200-fp8-sglang-tp8"]
    b = next(deployments[n] for n in SCENARIOS if n.startswith("llama"))
    with pytest.raises(jp.JaxpriceError) as err:
        jp.stack_plans([a, b])
    msg = str(err.value)
    assert "differs in structure" in msg and b.plan.name in msg and "plans[1]" in msg
    assert any(word in msg for word in ("shape of", "layer kinds", "_kind", "has_moe", "coefficient roles"))


def test_speculative_decoding_on_and_off_is_refused_naming_the_drafter(deployments, tmp_path):
    """A drafter's layer kinds are structure: with and without speculative decoding are two
    stacks (the refusal says so); the number of drafted tokens is a value."""
    name = "deepseek-v3-h200-fp8-sglang-tp8"
    src = (Path(__file__).resolve().parents[1] / "testdata" / "aisimulate" / f"{name}.yaml").read_text()
    assert src.count("    gpu_memory_utilization: 0.9\n") == 1
    paths = []
    for k in (1, 3):
        p = tmp_path / f"mtp{k}.yaml"
        p.write_text(src.replace("    gpu_memory_utilization: 0.9\n", "    gpu_memory_utilization: 0.9\n"
                                 f"    speculative:\n      method: mtp\n      num_spec_tokens: {k}\n"))
        paths.append(jp.load_deployment(str(p)))
    assert jp.structure_of(paths[0].plan) == jp.structure_of(paths[1].plan)
    with pytest.raises(jp.JaxpriceError, match="speculative drafter: no vs yes"):
        jp.stack_plans([paths[0], deployments[name]])


def test_refusals(deployments, batches):
    dep = deployments[SCENARIOS[0]]
    stack = jp.stack_plans([dep, dep])
    with pytest.raises(jp.JaxpriceError, match="at least one plan"):
        jp.stack_plans([])
    with pytest.raises(jp.JaxpriceError, match="2 coefficient sets for 3"):
        jp.price_deployments(jp.stack_plans([dep] * 3), st.stack_coefficients([dep.coefficients] * 2),
                             batches["int32"])
    missing = jp.Coefficients(dep.coefficients.values[1:], dep.coefficients.names[1:])
    with pytest.raises(jp.JaxpriceError, match="do not carry"):
        jp.price_deployments(stack, missing, batches["int32"])
    lacking = st.stack_coefficients([dep.coefficients, missing])
    with pytest.raises(jp.JaxpriceError, match="lacks a coefficient"):
        jp.price_deployments(stack, lacking, batches["int32"])


def test_value_chunks_read_back_every_slice():
    """stack._take over stack.value_chunks equals slicing the whole vector, for every slice of a
    vector that spans three chunks (including slices across chunk boundaries and empty ones)."""
    v = np.arange(150.0)
    chunks = st.value_chunks(jnp.asarray(v))
    assert [len(c) for c in chunks] == [64, 64, 22]
    for off in range(0, 150, 7):
        for size in (0, 1, 5, 63, 64, 65, 130):
            if off + size <= 150:
                np.testing.assert_array_equal(np.asarray(st._take(chunks, off, size)), v[off:off + size])
