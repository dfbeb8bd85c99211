"""Sweep: price many batches, or many coefficient sets, in one call; shard a sweep over devices.

The kernel (step.step_time) prices one padded batch for one coefficient vector. A sweep is
that kernel under ``jax.vmap``, compiled once per plan STRUCTURE (stack.Structure: every
deployment of one model graph shares it, the plan's values traced), padding and mode: a
change of values (token counts, coefficients, temperature, the deployment) never retraces, a
change of padding or of mode (exact / smooth) does, once. ``stack.kernel_compiles()`` counts
the compiles; ``stack.price_deployments`` prices many deployments in one call.

* ``price_many`` (step.py): many batches of one padding, one coefficient set.
* ``price_coefficient_sets``: many coefficient sets (a Coefficients whose values are
  [sets, names]), one batch.
* ``price_sharded``: ``price_many`` with the batch axis split over a 1-D device mesh
  (jax.sharding). On one host with several devices (or CPU with
  ``XLA_FLAGS=--xla_force_host_platform_device_count=N``) and on a multi-host runtime alike:
  every process calls it with the same arguments (after ``jax.distributed.initialize()``),
  each device prices its slice, and the result is one global array sharded the same way.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .errors import refuse
from .plan import Batch, Coefficients, Plan
from . import step as _step
from .step import StepResult, _batched_kernel, _traced_args, exact_at_zero, temperature_arg

BATCH_AXIS = "batch"


# ----------------------------------------------------------------------------- coefficient sets


@functools.partial(jax.jit, static_argnames=("structure", "smooth"))
def _price_sets_jit(structure, values, index, coef_values, batch, tau, smooth):
    from .stack import _note_compile, role_values, traced_view
    _note_compile()
    view = traced_view(structure, values)
    return exact_at_zero(lambda t: jax.vmap(lambda c: _step._kernel(view, role_values(c, index), batch, t, False))(
        coef_values), tau if smooth else None)


def stack_coefficients(sets) -> Coefficients:
    """Stack Coefficients of one name list into one with values [sets, names] (for vmap)."""
    sets = list(sets)
    if not sets:
        refuse("needs at least one coefficient set", field="sets")
    first = sets[0]
    for i, c in enumerate(sets):
        if c.names != first.names:
            refuse("coefficient sets must share one list of names", field=f"sets[{i}]")
    return Coefficients(jnp.stack([jnp.asarray(c.values) for c in sets]), first.names, first.units, first.cites)


def price_coefficient_sets(plan: Plan, coef_sets: Coefficients, batch: Batch, *, temperature=None) -> StepResult:
    """Price one batch under many coefficient sets in one vmapped call.

    coef_sets: Coefficients with values [sets, names] (see ``stack_coefficients``).
    Returns a StepResult whose fields have a leading [sets] axis.
    """
    values = jnp.asarray(coef_sets.values)
    if values.ndim != 2 or values.shape[1] != len(coef_sets.names):
        refuse(f"needs values of shape [sets, {len(coef_sets.names)}], got {tuple(values.shape)}",
               field="coef_sets.values")
    smooth, tau = temperature_arg(temperature)
    structure, plan_values, index = _traced_args(plan, coef_sets)
    return _price_sets_jit(structure, plan_values, index, values, batch, tau, smooth)


# ----------------------------------------------------------------------------- sharding


def batch_mesh(devices=None) -> Mesh:
    """A 1-D mesh named ``"batch"`` over ``devices`` (default: every device of every process)."""
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (BATCH_AXIS,))


@functools.lru_cache(maxsize=None)
def _sharded_pricer(mesh: Mesh):
    spec = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))

    def run(structure, values, index, coef_values, batches, tau, smooth):
        from .stack import _note_compile
        _note_compile()
        return exact_at_zero(lambda t: _batched_kernel(structure, values, index, coef_values, batches, t, False),
                             tau if smooth else None)

    return jax.jit(run, static_argnames=("structure", "smooth"), out_shardings=spec)


def _global(host: np.ndarray, sharding) -> jax.Array:
    """A global array from the same host value on every process (works multi-host too)."""
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_batches(batches: Batch, mesh: Mesh):
    """Pad the leading batch axis to a multiple of the mesh size with empty batches (every row
    masked) and lay it out over the mesh. Returns (sharded batches, number of real batches)."""
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(batches)]
    if not leaves or leaves[0].ndim < 1:
        refuse("needs stacked batches with a leading batch axis (Batch.stack)", field="batches")
    n = leaves[0].shape[0]
    for x in leaves:
        if x.ndim < 1 or x.shape[0] != n:
            refuse("every field needs the same leading batch axis", field="batches",
                   value=tuple(x.shape), has_value=True)
    pad = (-n) % mesh.size
    spec = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))

    def padded(x):
        if pad:
            x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
        return _global(x, spec)
    treedef = jax.tree_util.tree_structure(batches)
    return jax.tree_util.tree_unflatten(treedef, [padded(x) for x in leaves]), n


def price_sharded(plan: Plan, coefs: Coefficients, batches: Batch, mesh: Mesh | None = None,
                  temperature=None) -> StepResult:
    """Price stacked batches (leading axis) with that axis sharded over a 1-D device mesh.

    mesh: a 1-D ``jax.sharding.Mesh`` (default ``batch_mesh()``: all devices). The batch
    count is padded with empty batches to a multiple of the device count, each device
    prices its slice, and the padding is trimmed off. Coefficients are replicated.
    Equal to ``price_many`` on one device; see the module docstring for multi-host use.
    """
    mesh = batch_mesh() if mesh is None else mesh
    if len(mesh.axis_names) != 1:
        refuse(f"needs a 1-D mesh over the batch axis, got axes {tuple(mesh.axis_names)}", field="mesh")
    smooth, tau = temperature_arg(temperature)
    sharded, n = shard_batches(batches, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    structure, plan_values, index = _traced_args(plan, coefs)
    plan_values, index = (_global(np.asarray(x), replicated) for x in (plan_values, index))
    coef_values = _global(np.asarray(coefs.values), replicated)
    tau = None if tau is None else _global(np.asarray(tau), replicated)
    out = _sharded_pricer(mesh)(structure, plan_values, index, coef_values, sharded, tau, smooth)
    if out.overlap.shape[0] == n:
        return out
    return jax.tree_util.tree_map(lambda x: x[:n], out)


# ----------------------------------------------------------------------------- synthetic batches


def random_batches(rng, count: int, rows: int, *, decode_threshold: int = 1, decode_share: float = 0.6,
                   max_context: int = 32768, max_prefill: int = 4096, max_prefix: int = 8192,
                   empty: bool = True, dtype=None) -> Batch:
    """``count`` random padded batches of ``rows`` rows, stacked, for sweeps and tests.

    Each batch holds 1..rows requests (the rest padding): decode rows schedule
    1..decode_threshold tokens after up to ``max_context`` computed ones; prefill rows
    schedule decode_threshold+1..max_prefill tokens after up to ``max_prefix`` computed ones
    (a chunk of a longer prompt). With ``empty``, batch 0 is all padding and batch 1 has
    requests that schedule no token (when count allows). rng: a numpy Generator. dtype: of
    the token counts, float64 (None) or int32 (see Batch; a third of the bytes, and priced
    2-3x faster in exact mode).
    """
    thr = int(decode_threshold)
    if count < 0 or rows < 1 or thr < 0 or max_prefill <= thr:
        refuse("needs count >= 0, rows >= 1 and decode_threshold < max_prefill", field="random_batches",
               value=(count, rows, thr, max_prefill), has_value=True)
    shape = (count, rows)
    n = rng.integers(1, rows + 1, size=count)
    if empty and count > 0:
        n[0] = 0
    mask = np.arange(rows)[None, :] < n[:, None]
    dec = rng.random(shape) < decode_share
    sched = np.where(dec, rng.integers(1, max(thr, 1) + 1, size=shape), rng.integers(thr + 1, max_prefill + 1, size=shape))
    comp = np.where(dec, rng.integers(0, max_context + 1, size=shape), rng.integers(0, max_prefix + 1, size=shape))
    if empty and count > 1:
        sched[1] = 0
    sched = np.where(mask, sched, 0).astype(float)
    comp = np.where(mask, comp, 0).astype(float)
    batch = Batch(jnp.asarray(sched), jnp.asarray(comp), jnp.asarray(comp + sched), jnp.asarray(mask),
                  jnp.full((count,), float(thr)))
    return batch if dtype is None else batch.astype(dtype, source="random_batches")
