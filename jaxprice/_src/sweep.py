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
from .plan import INT_TOKEN_LIMIT, Batch, Coefficients, Plan, _TOKEN_WHY, _max_rows, _unchecked_batch, _whole
from . import step as _step
from .step import StepResult, _batched_kernel, _traced_args, check_pricing_args, exact_at_zero, temperature_arg

BATCH_AXIS = "batch"
# random_batches makes at most this many token counts in one call (each field 512 MiB as float64)
MAX_CELLS = 1 << 26


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
    if isinstance(sets, Coefficients) or not hasattr(sets, "__iter__"):
        refuse("needs a list of Coefficients", field="sets", value=type(sets).__name__)
    sets = list(sets)
    if not sets:
        refuse("needs at least one coefficient set", field="sets")
    for i, c in enumerate(sets):
        if not isinstance(c, Coefficients):
            refuse("is not a Coefficients", field=f"sets[{i}]", value=type(c).__name__)
    first = sets[0]
    for i, c in enumerate(sets):
        if c.names != first.names:
            refuse("coefficient sets must share one list of names (sets of deployments on other chips or "
                   "engines carry other names: stack_deployment_coefficients stacks the union of their names "
                   "for price_deployments)", field=f"sets[{i}]")
    return Coefficients(jnp.stack([jnp.asarray(c.values) for c in sets]), first.names, first.units, first.cites)


def price_coefficient_sets(plan: Plan, coef_sets: Coefficients, batch: Batch, *, temperature=None) -> StepResult:
    """Price one batch under many coefficient sets in one vmapped call.

    coef_sets: Coefficients with values [sets, names] (see ``stack_coefficients``).
    Returns a StepResult whose fields have a leading [sets] axis.
    """
    check_pricing_args(plan, coef_sets, batch, rank=1, sets=True)
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
    if devices is not None and (isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__")):
        refuse("must be None (every device) or a list of devices (jax.devices())", field="devices",
               value=type(devices).__name__)
    devices = jax.devices() if devices is None else list(devices)
    if not devices or not all(isinstance(d, jax.Device) for d in devices):
        refuse("must be None (every device) or a non-empty list of devices (jax.devices())", field="devices",
               value=[type(d).__name__ for d in devices][:3], has_value=True)
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
    Equal to ``price_many`` on one device (over several, to an ulp: the partitioned program may
    round differently); differentiable in the coefficients and the temperature, as price_many.
    See the module docstring for multi-host use.
    """
    check_pricing_args(plan, coefs, batches, rank=2, field="batches")
    mesh = batch_mesh() if mesh is None else mesh
    if not isinstance(mesh, Mesh):
        refuse("needs a jax.sharding.Mesh (batch_mesh()) or None", field="mesh", value=type(mesh).__name__)
    if len(mesh.axis_names) != 1:
        refuse(f"needs a 1-D mesh over the batch axis, got axes {tuple(mesh.axis_names)}", field="mesh")
    smooth, tau = temperature_arg(temperature)
    sharded, n = shard_batches(batches, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    structure, plan_values, index = _traced_args(plan, coefs)
    plan_values, index = (_global(np.asarray(x), replicated) for x in (plan_values, index))
    # traced coefficients or temperature (jax.grad, a caller's jit) pass as they are: jit lays them
    # out; np.asarray of one died in a TracerArrayConversionError, though price_many differentiates
    coef_values = coefs.values if isinstance(coefs.values, jax.core.Tracer) else \
        _global(np.asarray(coefs.values), replicated)
    tau = tau if tau is None or isinstance(tau, jax.core.Tracer) else _global(np.asarray(tau), replicated)
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
    src = "random_batches"
    if not isinstance(empty, (bool, np.bool_)):          # "no" or 0.0 would read as their truth value
        refuse("must be True or False", file=src, field="empty", value=empty, has_value=True)
    if not (hasattr(rng, "integers") and hasattr(rng, "random")):
        refuse("needs a numpy Generator (np.random.default_rng(seed))", file=src, field="rng", value=type(rng).__name__)
    count = _whole(count, source=src, field="count", what="a non-negative integer")
    rows = _whole(rows, source=src, field="rows", what="an integer >= 1", minimum=1, maximum=_max_rows(),
                  why=" (2**20, the most requests in one batch)")
    if count * rows > MAX_CELLS:
        refuse(f"count x rows = {count} x {rows} token counts; at most {MAX_CELLS} (2**26) in one call",
               file=src, field="count", value=count)
    thr = _whole(decode_threshold, source=src, field="decode_threshold", what="a non-negative integer",
                 below=INT_TOKEN_LIMIT, why=_TOKEN_WHY)
    # a row's prompt_len (computed + scheduled) stays below the token limit too, so int32 holds it
    max_context = _whole(max_context, source=src, field="max_context", what="a non-negative integer",
                         below=INT_TOKEN_LIMIT - max(thr, 1),
                         why=" (a decode row's computed tokens plus its scheduled ones stay below the kernel's "
                             "token limit, 2**24)")
    max_prefill = _whole(max_prefill, source=src, field="max_prefill",
                         what=f"an integer above decode_threshold ({thr})", minimum=thr + 1, below=INT_TOKEN_LIMIT,
                         why=_TOKEN_WHY)
    max_prefix = _whole(max_prefix, source=src, field="max_prefix", what="a non-negative integer",
                        below=INT_TOKEN_LIMIT - max_prefill,
                        why=" (a prefill row's computed tokens, its prefix, plus its chunk stay below the "
                            "kernel's token limit, 2**24)")
    share = np.asarray(decode_share) if not isinstance(decode_share, (str, bytes)) else np.asarray(None)
    if share.ndim != 0 or share.dtype.kind not in "iuf" or not 0.0 <= float(share) <= 1.0:
        refuse("must be a fraction in [0, 1]", file=src, field="decode_share", value=decode_share, has_value=True)
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
    batch = _unchecked_batch(jnp.asarray(sched), jnp.asarray(comp), jnp.asarray(comp + sched), jnp.asarray(mask),
                             jnp.full((count,), float(thr)), checked=True)     # drawn in range: no value check
    return batch if dtype is None else batch.astype(dtype, source="random_batches")
