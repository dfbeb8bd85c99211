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
import math
import numbers
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


def _read_only(value):
    """A writeable NumPy array as a read-only copy, anything else as it is: the pricing entry
    points check concrete values once and remember them by identity, so an array changed in
    place afterwards (``c.values[3] = nan``) would be priced unchecked; ``replace`` makes a new one."""
    if isinstance(value, np.ndarray) and value.flags.writeable:
        value = value.copy()
        value.setflags(write=False)
    return value


@jax.tree_util.register_pytree_node_class
class Coefficients:
    """Named coefficients in SI units (s, B/s, tokens/s, dimensionless) as one vector.

    ``coefs["hbm_derate"]`` reads one; ``coefs.replace(name=value)`` changes some;
    ``coefs.to_dict()`` gives plain floats. ``units`` and ``cites`` record, per name, the
    registry units the value came in and where it came from.
    """

    def __init__(self, values, names, units=None, cites=None):
        self.values = _read_only(values)
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

    def __reduce__(self):
        # pickle and copy.deepcopy rebuild through __init__: restoring __dict__ gave back a WRITEABLE
        # values array beside its "checked" mark, so c.values[i] = nan afterwards was priced unchecked
        return (Coefficients, (self.values, self.names, self.units, self.cites))

    def index(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:     # coefs["typo"] said "the plan needs a coefficient": no plan is involved
            self._refuse_unknown(name)

    def _refuse_unknown(self, name):
        import difflib
        near = difflib.get_close_matches(str(name), self.names, n=3)
        refuse("is not a name these Coefficients carry" + (f"; near matches: {', '.join(near)}" if near else
               f" ({len(self.names)} names, e.g. {', '.join(self.names[:3])})"), field=name)

    def __getitem__(self, name: str):
        return self.values[..., self.index(name)]

    def __contains__(self, name):
        return name in self._index

    def get(self, name, default=0.0):
        return self[name] if name in self._index else default

    def replace(self, **updates):
        """These coefficients with some changed (``coefs.replace(hbm_derate=0.75)``): each a name
        they carry and a finite number >= 0 (or an array of them, one per set of stacked values).
        A traced value (under jit, grad or vmap) passes unchecked."""
        values = jnp.asarray(self.values)
        for name, val in updates.items():
            if name not in self._index:
                self._refuse_unknown(name)
            if not isinstance(val, jax.core.Tracer):
                _check_coefficient_value(name, val, values.shape[:-1])
            values = values.at[..., self._index[name]].set(val)
        return Coefficients(values, self.names, self.units, self.cites)

    def to_dict(self) -> dict:
        vals = np.asarray(self.values)
        return {n: float(vals[..., i]) if vals.ndim == 1 else vals[..., i] for i, n in enumerate(self.names)}

    def __repr__(self):
        return f"Coefficients({len(self.names)} names)"


def _check_coefficient_value(name, val, shape):
    """A concrete coefficient value for ``Coefficients.replace``: numbers, finite, >= 0 (every
    coefficient is a time, a rate, a size or a fraction), of a shape that fits ``shape``."""
    try:
        arr = np.asarray(val)
    except Exception:                                   # noqa: BLE001 - anything NumPy cannot read
        arr = np.asarray(None)
    if isinstance(val, (str, bytes)) or arr.dtype.kind not in "iuf":
        refuse("must be a number (SI units)", field=name, value=_short(val), has_value=True)
    try:
        fits = np.broadcast_shapes(arr.shape, shape) == tuple(shape)
    except ValueError:
        fits = False
    if not fits:
        refuse(f"has shape {arr.shape}; these Coefficients take a value of shape {tuple(shape)} here", field=name)
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        v = arr.reshape(-1)[int(np.flatnonzero(bad.reshape(-1))[0])].item()
        refuse("must be a finite number >= 0 (SI units)", field=name, value=v, has_value=True)


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

    def __post_init__(self):
        _check_batch_values(self)
        # a NumPy field is held as a read-only copy: the caller's array changed after the check
        # (b.scheduled[0] = nan) would otherwise reach the pricing entry points unchecked
        for name in ("scheduled", "computed", "prompt_len", "mask", "decode_threshold"):
            object.__setattr__(self, name, _read_only(getattr(self, name)))
        self.__dict__["_values_checked"] = True      # the pricing entry points need not check again

    def tree_flatten(self):
        return (self.scheduled, self.computed, self.prompt_len, self.mask, self.decode_threshold), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return _unchecked_batch(*children)

    def __reduce__(self):
        # as Coefficients': rebuilt by the constructor (checked again, NumPy fields read-only)
        return (Batch, (self.scheduled, self.computed, self.prompt_len, self.mask, self.decode_threshold))

    @property
    def rows(self) -> int:
        return int(np.shape(self.scheduled)[-1])

    @staticmethod
    def from_requests(scheduled, computed, prompt_len=None, *, pad_to=None, decode_threshold=1,
                      source="batch", dtype=None):
        """Build a padded batch from per-request token counts, refusing bad values clearly.

        pad_to: the rows (None: one per request, no padding). The pricing entry points compile
        once per row count, so a loop pricing batches of varying size (a simulator's steps)
        passes one ``pad_to`` for all: without it every new size compiled again (DeepSeek-V3,
        two cores: ~0.8 s a step against ~0.5 ms at pad_to=64).
        dtype: of the token counts, float64 (None) or int32 (counts below INT_TOKEN_LIMIT).
        Counts traced by jax (inside ``jax.grad``, ``jit`` or ``vmap``) pass unchecked (``_traced_batch``).
        """
        if any(isinstance(v, jax.core.Tracer) for v in (scheduled, computed, prompt_len)):
            return _traced_batch(scheduled, computed, prompt_len, pad_to=pad_to, decode_threshold=decode_threshold,
                                 source=source, dtype=dtype)
        sched = _counts(scheduled, "scheduled", source).reshape(-1)
        comp = _counts(computed, "computed", source)
        comp = comp.reshape(-1) if comp.ndim else np.full(sched.shape, float(comp))
        if comp.shape != sched.shape:
            refuse(f"has {comp.size} values for {sched.size} requests", file=source, field="computed")
        if prompt_len is None:
            prompt = comp + sched
        else:
            prompt = _counts(prompt_len, "prompt_len", source)
            prompt = prompt.reshape(-1) if prompt.ndim else np.full(sched.shape, float(prompt))
        for name, arr in (("scheduled", sched), ("computed", comp), ("prompt_len", prompt)):
            if arr.shape != sched.shape:
                refuse(f"has {arr.size} values for {sched.size} requests", file=source, field=name)
            _check_count_values(arr, name, source)
        n = sched.size
        thr, rows = _threshold_and_rows(n, pad_to, decode_threshold, source)
        pad = rows - n

        dtype = _token_dtype(dtype, source)
        for name, arr in (("scheduled", sched), ("computed", comp), ("prompt_len", prompt)):
            _check_fits(arr, dtype, source, name)

        # jax.device_put, not jnp.asarray: under JAX 0.10 jnp.asarray of a NumPy array compiles a
        # small XLA program per new shape (~15 ms each); device_put only copies
        def padded(a):
            return jax.device_put(np.concatenate([a, np.zeros(pad)]).astype(dtype))
        return _unchecked_batch(padded(sched), padded(comp), padded(prompt),
                                jax.device_put(np.concatenate([np.ones(n, bool), np.zeros(pad, bool)])),
                                jnp.asarray(thr), checked=True)

    @staticmethod
    def decode(requests: int, context: int, *, pad_to=None, decode_threshold=1, tokens=1, dtype=None):
        """`requests` decode rows, each scheduling `tokens` with `context` tokens in cache
        after this step (computed = context - tokens). dtype: as for from_requests."""
        src = "Batch.decode"
        requests = _whole(requests, source=src, field="requests", what="a non-negative integer",
                          maximum=_max_rows(), why=" (2**20, the most requests in one batch)")
        tokens = _whole(tokens, source=src, field="tokens", what="a non-negative integer", below=INT_TOKEN_LIMIT,
                        why=_TOKEN_WHY)
        context = _whole(context, source=src, field="context", what=f"an integer >= tokens ({tokens})",
                         minimum=tokens, below=INT_TOKEN_LIMIT, why=_TOKEN_WHY)
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
        return _unchecked_batch(*out, self.mask, self.decode_threshold,
                                checked=bool(self.__dict__.get("_values_checked")))

    @staticmethod
    def stack(batches):
        """Stack batches of one padding into a leading batch axis (for vmap).

        Concrete batches are stacked in NumPy (jnp.stack of thousands of arrays compiles a
        concatenate with one operand each and takes minutes); traced ones with jnp.stack.
        """
        batches = _stackable(batches)
        if any(isinstance(x, jax.core.Tracer) for b in batches for x in jax.tree_util.tree_leaves(b)):
            return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *batches)
        out = jax.tree_util.tree_map(lambda *xs: jax.device_put(np.stack([np.asarray(x) for x in xs])), *batches)
        if all(b.__dict__.get("_values_checked") for b in batches):
            out.__dict__["_values_checked"] = True     # stacked checked batches: no check at price_many
        return out


_TOKEN_WHY = f" (the kernel's token limit, plan.INT_TOKEN_LIMIT = 2**{INT_TOKEN_LIMIT.bit_length() - 1})"


def _check_count_values(arr, name, source):
    """Refuse a token count (flat NumPy ``arr``) that is not a non-negative integer below the
    kernel's limit, naming ``name[i]`` and the value."""
    bad = ~np.isfinite(arr) | (arr < 0) | (arr != np.round(arr))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        refuse("token counts must be non-negative integers", file=source,
               field=f"{name}[{i}]", value=arr[i].item(), has_value=True)
    big = arr >= INT_TOKEN_LIMIT
    if big.any():
        i = int(np.flatnonzero(big)[0])
        refuse(f"token counts must be below {INT_TOKEN_LIMIT}{_TOKEN_WHY}", file=source,
               field=f"{name}[{i}]", value=arr[i].item(), has_value=True)


def _threshold_and_rows(n, pad_to, decode_threshold, source):
    """(decode threshold as a float, padded row count) of a batch of ``n`` requests, each refused
    unless a whole number in range (n at most 2**20 and at most the rows)."""
    thr = float(_whole(decode_threshold, source=source, field="decode_threshold", what="a non-negative integer",
                       below=INT_TOKEN_LIMIT, why=_TOKEN_WHY))
    max_rows = _max_rows()
    if n > max_rows:
        refuse(f"holds {n} requests; a batch holds at most {max_rows} (2**20)", file=source, field="scheduled")
    rows = n if pad_to is None else _whole(pad_to, source=source, field="pad_to", what="None or a whole number of rows",
                                           maximum=max_rows, why=" (2**20, the most requests in one batch)")
    if rows < n:
        refuse(f"{n} requests do not fit in {rows} rows", file=source, field="pad_to", value=pad_to)
    return thr, rows


def _traced_batch(scheduled, computed, prompt_len, *, pad_to, decode_threshold, source, dtype) -> Batch:
    """``Batch.from_requests`` where a token count is traced by jax (the gradient of a price with
    respect to the counts: it refused them as 'must be numbers'): shapes, padding and threshold
    checked as there, concrete counts' values too, traced values unchecked (as ``Batch(...)`` takes
    them); float64 only, integer counts having no gradient."""
    if _token_dtype(dtype, source) != np.float64:
        refuse("needs concrete token counts: traced ones are float64", file=source, field="dtype", value=dtype)

    def counts(v, name):
        if isinstance(v, jax.core.Tracer):
            if v.ndim > 1:
                refuse(f"must be a flat list, one value per request; got shape {v.shape}", file=source, field=name)
            return jnp.asarray(v, dtype=jnp.float64)
        arr = _counts(v, name, source)
        _check_count_values(arr.reshape(-1), name, source)
        return jnp.asarray(arr)
    sched = counts(scheduled, "scheduled").reshape(-1)
    n = int(sched.shape[0])

    def per_request(v, name):
        a = counts(v, name)
        a = a.reshape(-1) if a.ndim else jnp.full((n,), a)
        if a.shape != sched.shape:
            refuse(f"has {a.size} values for {n} requests", file=source, field=name)
        return a
    comp = per_request(computed, "computed")
    prompt = comp + sched if prompt_len is None else per_request(prompt_len, "prompt_len")
    thr, rows = _threshold_and_rows(n, pad_to, decode_threshold, source)
    zeros = jnp.zeros(rows - n)
    mask = jax.device_put(np.concatenate([np.ones(n, bool), np.zeros(rows - n, bool)]))
    return _unchecked_batch(jnp.concatenate([sched, zeros]), jnp.concatenate([comp, zeros]),
                            jnp.concatenate([prompt, zeros]), mask, jnp.asarray(thr))


def _unchecked_batch(scheduled, computed, prompt_len, mask, decode_threshold, *, checked=False) -> Batch:
    """A Batch without the constructor's value checks: for jax's tree_unflatten (tracers, and
    the placeholders of vmap's axis specs) and for the builders that checked their values
    already (from_requests, astype, stack, random_batches: ``checked``). The pricing entry
    points check an unchecked concrete batch's values once (step.check_batch_shape): one
    rebuilt by jax.tree_util.tree_map may hold a NaN."""
    b = object.__new__(Batch)
    for name, v in zip(("scheduled", "computed", "prompt_len", "mask", "decode_threshold"),
                       (scheduled, computed, prompt_len, mask, decode_threshold)):
        object.__setattr__(b, name, v)
    if checked:
        b.__dict__["_values_checked"] = True
    return b


def _as_checked(batch: Batch) -> Batch:
    """``batch``, a copy of a checked one (e.g. ``tree_map(jnp.asarray, b)`` or one sharded over
    devices), marked checked: the pricing entry points do not read its values again (a size
    search's millions of rows took ~1 s more per run)."""
    batch.__dict__["_values_checked"] = True
    return batch


def _check_batch_values(batch) -> None:
    """A Batch built by hand (``Batch(...)``, ``dataclasses.replace``): its concrete arrays
    (NumPy or jax, not traced) are refused in one line if a token count is not a finite number
    >= 0 (NaN, inf, negative: priced as NaN or garbage), if a count or the decode threshold is
    not a number at all, or if the mask is not boolean. The threshold's value is the kernel's
    to read (any float: +inf or NaN makes no row a prefill, tests/test_int_batches.py). One
    O(rows) NumPy pass; Python numbers, lists and shapes are left to the pricing entry points,
    which refuse them."""
    for name in ("scheduled", "computed", "prompt_len", "decode_threshold", "mask"):
        x = getattr(batch, name)
        if not isinstance(x, (np.ndarray, np.generic, jax.Array)) or isinstance(x, jax.core.Tracer):
            continue
        arr = np.asarray(x)
        if name == "mask":
            if arr.dtype.kind != "b":
                refuse(f"must be booleans (True on a request's row, False on padding), got {arr.dtype.name}",
                       file="Batch", field=name)
            continue
        if arr.dtype.kind not in "iuf":
            refuse(f"must be numbers, got {arr.dtype.name}", file="Batch", field=name)
        if name == "decode_threshold":
            continue
        bad = ~np.isfinite(arr) | (arr < 0) if arr.dtype.kind == "f" else arr < 0
        if bad.any():
            i = int(np.flatnonzero(bad.reshape(-1))[0])
            where = f"{name}[{', '.join(map(str, np.unravel_index(i, arr.shape)))}]" if arr.ndim else name
            refuse("a token count must be a finite number >= 0", file="Batch",
                   field=where, value=arr.reshape(-1)[i].item(), has_value=True)


def _max_rows() -> int:
    from .schema import MAX_REQUESTS          # schema imports this module: read at call time
    return MAX_REQUESTS


def _whole(value, *, source, field, what, minimum=0, below=None, maximum=None, why=""):
    """A scalar argument that must be a whole number (an int, an integer-valued float or a 0-d
    array of one; never a bool, a string or None) in [minimum, below) and at most ``maximum``:
    the int, else refused."""
    if isinstance(value, (bool, np.bool_, str, bytes)):
        refuse(f"must be {what}", file=source, field=field, value=value, has_value=True)
    if isinstance(value, numbers.Integral):
        x = int(value)
    else:
        try:
            arr = np.asarray(value)
        except Exception:                               # noqa: BLE001 - anything NumPy cannot read
            arr = np.asarray(None)
        if arr.ndim != 0 or arr.dtype.kind not in "iuf":
            refuse(f"must be {what}", file=source, field=field, value=value, has_value=True)
        x = float(arr)
        if not math.isfinite(x) or x != round(x):
            refuse(f"must be {what}", file=source, field=field, value=value, has_value=True)
    if x < minimum:
        refuse(f"must be {what}", file=source, field=field, value=value, has_value=True)
    if below is not None and x >= below:
        refuse(f"must be below {below}{why}", file=source, field=field, value=value, has_value=True)
    if maximum is not None and x > maximum:
        refuse(f"must be at most {maximum}{why}", file=source, field=field, value=value, has_value=True)
    return int(x)


def _counts(values, name, source):
    """Token counts as a float64 array (a scalar or one value per request), refusing what is not
    numbers (strings, None, ragged or nested lists) in one line."""
    if values is None:
        refuse("needs token counts (a number or one per request), got None", file=source, field=name)
    try:
        arr = np.asarray(values)
    except Exception:                                   # noqa: BLE001 - ragged lists and the like
        refuse("must be numbers, one per request", file=source, field=name, value=_short(values), has_value=True)
    if arr.dtype.kind not in "iuf" and not (arr.size == 0 and arr.dtype.kind in "Ob"):
        refuse(f"must be numbers, one per request (got {arr.dtype.name if arr.dtype.kind != 'U' else 'strings'})",
               file=source, field=name, value=_short(values), has_value=True)
    if arr.ndim > 1:
        refuse(f"must be a flat list, one value per request; got shape {arr.shape}", file=source, field=name)
    return arr.astype(float)


def _short(value):
    text = repr(value)
    return value if len(text) <= 60 else text[:57] + "..."


def _stackable(batches):
    """The list Batch.stack stacks: at least one Batch, all of one padding and rank."""
    if isinstance(batches, Batch) or not hasattr(batches, "__iter__"):
        refuse("needs a list of Batches", field="batches", value=type(batches).__name__)
    batches = list(batches)
    if not batches:
        refuse("needs at least one Batch to stack", field="batches")
    shape = None
    for i, b in enumerate(batches):
        if not isinstance(b, Batch):
            refuse("is not a Batch (Batch.from_requests, Batch.decode)", field=f"batches[{i}]",
                   value=type(b).__name__)
        s = np.shape(b.scheduled)
        if shape is None:
            shape = s
        elif s != shape:
            refuse(f"has token counts of shape {s}, batches[0] {shape}: one stack holds batches of one padding "
                   "(pad_to) and rank", field=f"batches[{i}]", value=s, has_value=True)
    return batches


def _token_dtype(dtype, source):
    try:
        dtype = np.dtype(np.float64 if dtype is None else dtype)
    except TypeError:
        refuse("token counts are float64, float32, int32 or int64", file=source, field="dtype", value=dtype,
               has_value=True)
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
