"""The three things the step kernel takes: a Plan, Coefficients and a Batch.

* ``Plan``: everything batch-independent about a deployment, resolved once in NumPy. It is
  static under jit (hashable by content), so the kernel compiles once per plan and batch
  padding, and XLA sees its arrays as constants.
* ``Coefficients``: the measured coefficients in SI units, as ONE flat vector with static
  names: ``jax.grad`` over all of them is one call, and the jit boundary has one leaf.
* ``Batch``: padded per-request token counts (float64, so gradients flow to batch shape;
  or int32, a third of the bytes, for pricing many batches fast), a row mask and the
  decode threshold.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .errors import refuse

RESOURCES = ("sm", "hbm", "nvlink", "nic", "host")

# Integer (and float32) token counts must stay below this: exact in float32 and int32, and
# the integer row walk (step._walk_rows_integer) cannot overflow int64.
INT_TOKEN_LIMIT = 2 ** 24


# ----------------------------------------------------------------------------- coefficients


class _Provenance:
    """Units and citations riding along in a Coefficients' tree structure without being part of
    its identity: a set loaded from another file (a fitted set, with other cites) has the same
    structure, so jitted kernels do not recompile for it. Only the names are structure."""

    __slots__ = ("units", "cites")

    def __init__(self, units, cites):
        self.units, self.cites = units, cites

    def __eq__(self, other):
        return isinstance(other, _Provenance)

    def __hash__(self):
        return 0


@jax.tree_util.register_pytree_node_class
class Coefficients:
    """Named coefficients in SI units (s, B/s, tokens/s, dimensionless) as one vector.

    ``coefs["hbm_derate"]`` reads one; ``coefs.replace(name=value)`` changes some;
    ``coefs.to_dict()`` gives plain floats. ``units`` and ``cites`` record, per name, the
    registry units the value came in and where it came from.
    """

    def __init__(self, values, names, units=None, cites=None):
        self.values = values
        self.names = tuple(names)
        self.units = tuple(units) if units is not None else ("",) * len(self.names)
        self.cites = tuple(cites) if cites is not None else ("",) * len(self.names)
        self._index = {n: i for i, n in enumerate(self.names)}

    def tree_flatten(self):
        return (self.values,), (self.names, _Provenance(self.units, self.cites))

    @classmethod
    def tree_unflatten(cls, aux, children):
        names, prov = aux
        return cls(children[0], names, prov.units, prov.cites)

    def index(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            refuse("the plan needs a coefficient these Coefficients do not carry", field=name)

    def __getitem__(self, name: str):
        return self.values[..., self.index(name)]

    def __contains__(self, name):
        return name in self._index

    def get(self, name, default=0.0):
        return self[name] if name in self._index else default

    def replace(self, **updates):
        values = jnp.asarray(self.values)
        for name, val in updates.items():
            values = values.at[..., self.index(name)].set(val)
        return Coefficients(values, self.names, self.units, self.cites)

    def to_dict(self) -> dict:
        vals = np.asarray(self.values)
        return {n: float(vals[..., i]) if vals.ndim == 1 else vals[..., i] for i, n in enumerate(self.names)}

    def __repr__(self):
        return f"Coefficients({len(self.names)} names)"


# ----------------------------------------------------------------------------- batch


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Batch:
    """One step's requests, padded to a fixed number of rows.

    scheduled, computed, prompt_len: [rows] token counts, float64 (so that gradients can flow
    to batch shape) or, built with ``dtype=jnp.int32`` (or ``astype``), int32: priced the
    same bit for bit, in exact mode 2-3x faster over many batches (integer sums vectorise),
    and not differentiable in the counts. mask: bool [rows], False on padding rows;
    decode_threshold: a request scheduling more tokens than this is a prefill.
    """
    scheduled: Any
    computed: Any
    prompt_len: Any
    mask: Any
    decode_threshold: Any

    def tree_flatten(self):
        return (self.scheduled, self.computed, self.prompt_len, self.mask, self.decode_threshold), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def rows(self) -> int:
        return int(np.shape(self.scheduled)[-1])

    @staticmethod
    def from_requests(scheduled, computed, prompt_len=None, *, pad_to=None, decode_threshold=1,
                      source="batch", dtype=None):
        """Build a padded batch from per-request token counts, refusing bad values clearly.

        dtype: of the token counts, float64 (None) or int32 (counts below INT_TOKEN_LIMIT).
        """
        sched = np.asarray(scheduled, dtype=float).reshape(-1)
        comp = np.asarray(computed, dtype=float).reshape(-1) if np.ndim(computed) else np.full(sched.shape, float(computed))
        if comp.shape != sched.shape:
            refuse(f"has {comp.size} values for {sched.size} requests", file=source, field="computed")
        if prompt_len is None:
            prompt = comp + sched
        else:
            prompt = np.asarray(prompt_len, dtype=float).reshape(-1) if np.ndim(prompt_len) else np.full(sched.shape, float(prompt_len))
        for name, arr in (("scheduled", sched), ("computed", comp), ("prompt_len", prompt)):
            if arr.shape != sched.shape:
                refuse(f"has {arr.size} values for {sched.size} requests", file=source, field=name)
            bad = ~np.isfinite(arr) | (arr < 0) | (arr != np.round(arr))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                refuse("token counts must be non-negative integers", file=source,
                       field=f"{name}[{i}]", value=arr[i].item(), has_value=True)
        thr = float(decode_threshold)
        if not np.isfinite(thr) or thr < 0 or thr != round(thr):
            refuse("must be a non-negative integer", file=source, field="decode_threshold",
                   value=decode_threshold, has_value=True)
        n = sched.size
        rows = n if pad_to is None else int(pad_to)
        if rows < n:
            refuse(f"{n} requests do not fit in {rows} rows", file=source, field="pad_to", value=pad_to)
        pad = rows - n

        dtype = _token_dtype(dtype, source)
        for name, arr in (("scheduled", sched), ("computed", comp), ("prompt_len", prompt)):
            _check_fits(arr, dtype, source, name)

        # jax.device_put, not jnp.asarray: under JAX 0.10 jnp.asarray of a NumPy array compiles a
        # small XLA program per new shape (~15 ms each); device_put only copies
        def padded(a):
            return jax.device_put(np.concatenate([a, np.zeros(pad)]).astype(dtype))
        return Batch(padded(sched), padded(comp), padded(prompt),
                     jax.device_put(np.concatenate([np.ones(n, bool), np.zeros(pad, bool)])),
                     jnp.asarray(thr))

    @staticmethod
    def decode(requests: int, context: int, *, pad_to=None, decode_threshold=1, tokens=1, dtype=None):
        """`requests` decode rows, each scheduling `tokens` with `context` tokens in cache
        after this step (computed = context - tokens). dtype: as for from_requests."""
        if requests < 0 or context < tokens:
            refuse("need requests >= 0 and context >= tokens", field="decode",
                   value=(requests, context), has_value=True)
        return Batch.from_requests([tokens] * requests, [context - tokens] * requests,
                                   pad_to=pad_to, decode_threshold=decode_threshold, dtype=dtype)

    def astype(self, dtype, source="batch"):
        """The same batch with its token counts in ``dtype`` (float64, float32 or int32),
        refused unless exact: int32 and float32 need integers below INT_TOKEN_LIMIT."""
        dtype = _token_dtype(dtype, source)
        out = []
        for name in ("scheduled", "computed", "prompt_len"):
            x = getattr(self, name)
            if isinstance(x, jax.core.Tracer):
                if dtype != np.float64:
                    refuse("needs concrete token counts to narrow them", file=source, field=name)
                out.append(jnp.asarray(x, dtype=dtype))
                continue
            arr = np.asarray(x)
            _check_fits(arr, dtype, source, name)
            out.append(jnp.asarray(arr.astype(dtype)))
        return Batch(*out, self.mask, self.decode_threshold)

    @staticmethod
    def stack(batches):
        """Stack batches of one padding into a leading batch axis (for vmap).

        Concrete batches are stacked in NumPy (jnp.stack of thousands of arrays compiles a
        concatenate with one operand each and takes minutes); traced ones with jnp.stack.
        """
        batches = list(batches)
        if any(isinstance(x, jax.core.Tracer) for b in batches for x in jax.tree_util.tree_leaves(b)):
            return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *batches)
        return jax.tree_util.tree_map(lambda *xs: jax.device_put(np.stack([np.asarray(x) for x in xs])), *batches)


def _token_dtype(dtype, source):
    dtype = np.dtype(np.float64 if dtype is None else dtype)
    if dtype not in (np.float64, np.float32, np.int32, np.int64):
        refuse("token counts are float64, float32, int32 or int64", file=source, field="dtype", value=str(dtype))
    return dtype


def _check_fits(arr, dtype, source, name):
    """Refuse counts that ``dtype`` would not hold exactly."""
    arr = np.asarray(arr)
    if dtype == np.float64 or arr.size == 0:
        return
    bad = ~np.isfinite(arr) | (arr < 0) | (arr != np.round(arr)) | (arr >= INT_TOKEN_LIMIT)
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        refuse(f"{dtype} token counts must be integers in [0, {INT_TOKEN_LIMIT})", file=source,
               field=f"{name}[{i}]", value=arr.reshape(-1)[i].item(), has_value=True)


# ----------------------------------------------------------------------------- plan


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """A resolved deployment: static under jit.

    ``arrays`` holds NumPy arrays (per layer kind, per GEMM, per attention, per collective
    class ...); ``scalars`` plain numbers and flags; ``coef`` maps each coefficient role the
    kernel reads to a coefficient name (or None: the term is absent); ``memory`` and
    ``provenance`` are reported, not priced. The hash is a digest of the content, so two
    resolutions of one deployment share a compiled kernel.
    """
    name: str
    arrays: dict
    scalars: dict
    coef: dict
    memory: dict
    provenance: tuple
    layer_kind_names: tuple

    def __post_init__(self):
        h = hashlib.sha256()
        for key in sorted(self.arrays):
            a = np.ascontiguousarray(self.arrays[key])
            h.update(key.encode())
            h.update(str(a.dtype).encode() + str(a.shape).encode())
            h.update(a.tobytes())
        h.update(repr(sorted(self.scalars.items())).encode())
        h.update(repr(sorted((k, repr(v)) for k, v in self.coef.items())).encode())
        object.__setattr__(self, "_digest", h.hexdigest())

    def __hash__(self):
        return hash(self._digest)

    def __eq__(self, other):
        return isinstance(other, Plan) and other._digest == self._digest

    @property
    def digest(self) -> str:
        return self._digest

    def __repr__(self):
        return f"Plan({self.name!r}, {len(self.layer_kind_names)} layer kinds, digest {self._digest[:10]})"

    @staticmethod
    def stack(plans):
        """Plans of one structure stacked for the deployment axis: ``stack.stack_plans``."""
        from .stack import stack_plans
        return stack_plans(plans)
