"""A deployment axis: one compiled kernel for every deployment of one model graph.

A ``Plan`` mixes two kinds of content. Its STRUCTURE decides the shape of the computation:
the number of layer kinds, GEMMs, attention entries, recurrent and mHC entries and collective
classes (array shapes), which layer kind each entry belongs to and in which phase it runs
(segment and phase ids), the distinct attention read laws (window, top-k, compress ratio,
sparse: the row walk applies each as constants), the graph-mode flags that choose code
(MoE, drafter, parallel-block drafter) and which coefficient ROLES exist where their
absence removes a term (``plan.coef``: the MoE imbalance, a measured attention prefill
form, the recurrent and mHC forms). Its VALUES are everything else: FLOPs, bytes, widths,
counts, peaks, bandwidths, capacities, rate-class indices, host-graph counts and modes,
which collective classes have coefficients, and which coefficient NAME fills each role.

``split_plan(plan)`` separates the two: a hashable ``Structure`` and one float64 vector of
values (ints and bools ride in it exactly). Plans of one model graph that differ in chip,
tp/ep/dp, quantization, cache format, engine settings or coefficient set share a structure:
rate-class tables are padded to a fixed ``CLASS_SLOTS`` (padded classes are never indexed,
so they contribute exactly zero, with zero gradient), and a collective class without
coefficients is a masked value, not a missing term. ``stack_plans(plans)`` stacks the values
of plans of one structure into [deployments, values] and refuses plans of different
structures with a JaxpriceError naming what differs.

``price_deployments(stack, coefs, batches)`` prices B batches on D deployments in one call,
compiled once per structure, padding and mode (never per deployment): values, and gradients
through ``jax.grad`` over the coefficients. Exact mode equals ``price_many`` of each
deployment alone bit for bit, values and per-deployment coefficient gradients
(tests/test_deployment_axis.py checks all 88 bundled scenarios on one device). A deployment axis
split over several devices is priced by XLA's partitioned program, which may round a few sums
differently: equal to an ulp (four virtual CPU devices: eight Llama-3.1-70B deployments bit for
bit, four DeepSeek-V3 and eight gpt-oss ones 1 ulp apart in a few HBM times, as price_sharded's
batch axis). The deployments are priced one after another in a ``lax.map`` by
price_many's own kernel over [B] batches. A vmap over deployments would not be: XLA's CPU
backend contracts other product-sums into fused multiply-adds in a [D, B] loop than in a [B]
one (a few prices one unit in the last place apart). Measured (experiments/bench.py, 64
deployments x 1,024 batches): the map costs 0.25 us per (deployment, batch) for DeepSeek-V3
with int32 counts where the vmap cost 0.15-0.18, and less than the vmap with float64 counts.

Coefficients, two ways (``price_deployments``' ``coefs``):

* ONE ``Coefficients`` shared by every deployment (values [names]): each deployment reads
  its roles from it by name, so its names must cover every deployment's roles. The gradient
  is summed over deployments: the shape of a calibration loss over many deployments.
* one set per deployment (``stack_coefficients(sets)``, values [deployments, names]): the
  names are the UNION of the sets' names in order of first appearance; a name a set lacks is
  NaN in that row, and pricing refuses a deployment whose roles read a NaN name.

The kernel is ``step._kernel``: ``price``/``price_many`` of one plan read the same structure
and values (``traced_view``; with ``fold=True`` its values as constants, ``folded_view``), so
every path runs one composition.
"""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from .errors import refuse
from .plan import Batch, Coefficients, Plan, _unchecked_batch

# arrays that shape the computation (segment and phase ids, the attention read-law table)
STATIC_ARRAYS = ("gemm_kind", "gemm_phase", "attn_kind", "attn_phase", "attn_window", "attn_topk",
                 "attn_compress", "attn_sparse", "rec_kind", "rec_phase", "mhc_kind", "mhc_phase")
# graph-mode flags that choose code
STATIC_SCALARS = ("has_moe", "drafter", "drafter_parallel_block")
# rate-class indices (values: clamped to the class table, as a gather clamps them)
CLASS_INDEX_ARRAYS = ("gemm_class", "expert_class", "rec_scan_class", "mhc_mix_class")
CLASS_INDEX_SCALARS = ("bf16_class", "head_class")
# rate-class tables are padded to this many classes (the next power of two beyond it)
CLASS_SLOTS = 4
# coefficient roles whose absence (None) removes a term: their None-ness is structure
_OPTIONAL_TERMS = ("moe_imbalance",)
_OPTIONAL_FORMS = ("attn_pre_form", "rec_dec", "rec_pre", "mhc_form")

_COMPILES = {"count": 0}


def kernel_compiles() -> int:
    """How many times this process has compiled a kernel whose plan values are traced
    (``price_deployments``, ``price_plans``, and one deployment's ``price``, ``price_many``,
    ``sweep.price_coefficient_sets`` and ``sweep.price_sharded``): one per structure, padding,
    batch layout and mode (and ``price_deployments``' deployment bucket), never per deployment.
    It counts traces of those kernels (a caller's jax.jit around them traces them too)."""
    return _COMPILES["count"]


def _note_compile():
    _COMPILES["count"] += 1


def _put(x):
    """A NumPy array (or a JAX array, unchanged) on the default device. Under JAX 0.10
    ``jnp.asarray`` of a NumPy array compiles a small XLA program per new shape (~15 ms on
    two cores); ``jax.device_put`` of a NumPy array only copies it."""
    return jax.device_put(x) if isinstance(x, np.ndarray) else jnp.asarray(x)


# ----------------------------------------------------------------------------- structure


@dataclasses.dataclass(frozen=True, eq=False)
class Structure:
    """What decides the shape of one deployment's computation (static under jit; hashable
    by content). ``layout``: (group 'A' or 'S', key, shape, dtype name, offset) of every value
    in the values vector; ``static_arrays``/``static_scalars``: the structural content;
    ``roles``: ``plan.coef`` with every coefficient name replaced by a slot number (an index
    into the role vector), None only where the absence removes a term; ``kinds``: the number
    of layer kinds; ``slots``: the role vector's length; ``size``: the values' length."""
    layout: tuple
    static_arrays: dict
    static_scalars: dict
    roles: dict
    kinds: int
    slots: int
    size: int

    def __post_init__(self):
        h = hashlib.sha256()
        h.update(repr(self.layout).encode())
        for key in sorted(self.static_arrays):
            a = np.ascontiguousarray(self.static_arrays[key])
            h.update(key.encode() + str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
        h.update(repr(sorted(self.static_scalars.items())).encode())
        h.update(repr(sorted((k, repr(v)) for k, v in self.roles.items())).encode())
        h.update(repr((self.kinds, self.slots, self.size)).encode())
        object.__setattr__(self, "_digest", h.hexdigest())

    def __hash__(self):
        return hash(self._digest)

    def __eq__(self, other):
        return isinstance(other, Structure) and other._digest == self._digest

    @property
    def digest(self) -> str:
        return self._digest

    def __repr__(self):
        return f"Structure({self.kinds} layer kinds, {self.size} values, {self.slots} roles, {self._digest[:10]})"

    def difference(self, other: "Structure") -> str:
        """What differs from ``other``, in words (empty when equal)."""
        if self == other:
            return ""
        mine, theirs = self.static_scalars.get("drafter"), other.static_scalars.get("drafter")
        if mine != theirs:
            return (f"speculative drafter: {'yes' if mine else 'no'} vs {'yes' if theirs else 'no'} (a drafter's "
                    "layer kinds and passes are structure: stack deployments with and without speculative "
                    "decoding separately)")
        if self.kinds != other.kinds:
            return f"layer kinds: {self.kinds} vs {other.kinds}"
        mine, theirs = {e[1]: e for e in self.layout}, {e[1]: e for e in other.layout}
        for key in sorted(set(mine) | set(theirs)):
            a, b = mine.get(key), theirs.get(key)
            if a is None or b is None:
                return f"plan value {key!r}: present in {'one' if a else 'the other'} plan only"
            if a[2] != b[2] or a[3] != b[3]:
                return f"shape of {key!r}: {a[2]} vs {b[2]}"
        for key in sorted(set(self.static_arrays) | set(other.static_arrays)):
            a, b = self.static_arrays.get(key), other.static_arrays.get(key)
            if a is None or b is None or a.shape != b.shape or not np.array_equal(a, b):
                return f"{key}: {_short(a)} vs {_short(b)}"
        for key in sorted(set(self.static_scalars) | set(other.static_scalars)):
            if self.static_scalars.get(key) != other.static_scalars.get(key):
                return f"{key}: {self.static_scalars.get(key)} vs {other.static_scalars.get(key)}"
        for key in sorted(set(self.roles) | set(other.roles)):
            if repr(self.roles.get(key)) != repr(other.roles.get(key)):
                return f"coefficient roles of {key!r}: {_pattern(self.roles.get(key))} vs {_pattern(other.roles.get(key))}"
        return "the layout of values"


def _short(a):
    if a is None:
        return "absent"
    a = np.asarray(a)
    return f"{a.tolist()}" if a.size <= 12 else f"{a.shape} array"


def _pattern(x):
    """A role tree with slots as 'c' (a coefficient) and None as '-' (the term is absent)."""
    if x is None:
        return "-"
    if isinstance(x, (int, np.integer)):
        return "c"
    if isinstance(x, tuple):
        return "(" + ",".join(_pattern(y) for y in x) + ")"
    return repr(x)


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """One plan split: its ``structure``, its ``values`` (float64 [structure.size]) and the
    coefficient name each role slot reads (None: the role is absent, it reads 0)."""
    structure: Structure
    values: np.ndarray
    slot_names: tuple


class _Roles:
    """Numbers the coefficient roles of a plan.coef tree: a name becomes a slot (reading that
    name), an absent role a slot reading 0, except where absence is structure (None)."""

    def __init__(self):
        self.names = []

    def slot(self, name):
        self.names.append(name)
        return len(self.names) - 1

    def leaf(self, x):
        if x is None or isinstance(x, str):
            return self.slot(x)
        return self.tree(x)

    def tree(self, x):
        if isinstance(x, tuple):
            return tuple(self.leaf(y) if (y is None or isinstance(y, str)) else self.tree(y) for y in x)
        return x


def _class_tables(plan):
    """(peaks [P], roles (P role tuples), index map): the rate-class tables padded to P slots.

    The kernel gathers a class's peak from class_peak and its ramp from the class roles by
    one index. A gather clamps an index past the end of a table, so the padded table repeats
    each table's last entry up to the longer table's length (the same value the clamped
    gather reads), indices are clamped to that length, and the padding beyond (peak 1, no
    coefficients) is never read."""
    peaks = np.asarray(plan.arrays["class_peak"], dtype=float).reshape(-1)
    roles = tuple(plan.coef["classes"])
    n = max(len(peaks), len(roles), 1)
    slots = CLASS_SLOTS if n <= CLASS_SLOTS else 1 << (n - 1).bit_length()
    keys = tuple(k for k, _ in roles[0]) if roles else ("eps_max", "k_half", "m_half", "n_half")
    empty = tuple((k, None) for k in keys)
    tab_peaks = np.ones(slots)
    tab_roles = [empty] * slots
    for j in range(n):
        tab_peaks[j] = peaks[min(j, len(peaks) - 1)] if len(peaks) else 1.0
        tab_roles[j] = roles[min(j, len(roles) - 1)] if roles else empty
    return tab_peaks, tuple(tab_roles), n


def _derived(plan):
    """Values the kernel would otherwise compute from plan values alone, computed here in
    NumPy once, so that a constant-folded plan and a traced one price the same bit for bit
    (XLA folds and rewrites constant subexpressions, e.g. a division by a broadcast scalar
    becomes a multiplication by its reciprocal)."""
    A, S, CF = plan.arrays, plan.scalars, plan.coef
    arrays, scalars = {}, {}
    arrays["count_scaled"] = np.asarray(A["count"], dtype=float) * np.asarray(A["drafter_count_scale"], dtype=float)
    arrays["attn_dec_rate_given"] = np.array([r is not None for _, r in CF["attn_dec"]], dtype=bool).reshape(-1)
    arrays["coll_given"] = np.array([r is not None for r in CF["coll"]], dtype=bool).reshape(-1)
    # laws.experts_touched's miss probability per token, (E - k) / E, and its log
    E, k = float(S["experts_total"]), np.asarray(A["expert_topk"], dtype=float)
    miss = np.where(E > k, (E - k) / max(E, 1.0), 0.0)
    arrays["expert_miss_on"] = miss > 0
    funnel = float(S["funnel"])
    arrays["expert_routed_log_miss"] = funnel * np.log(np.where(miss > 0, miss, 1.0))
    arrays["expert_routed_flops"] = funnel * np.asarray(A["expert_flops"], dtype=float)
    arrays["expert_local_bytes"] = float(S["experts_per_rank"]) * np.asarray(A["expert_bytes"], dtype=float)
    scalars["attn_pre_scale_given"] = CF["attn_pre_scale"] is not None
    scalars["hbm_peak_tbs"] = float(S["hbm_peak_bytes"]) / 1e12
    w = float(S["uniform_width"])
    whole = np.isfinite(w) and w == round(w) and abs(w) < 2.0 ** 31
    scalars["uniform_width_int"] = int(w) if whole else -1     # no row schedules -1 tokens
    return arrays, scalars


def _skeleton(plan, class_roles):
    """plan.coef with its names numbered into slots (see _Roles); the slot names."""
    r = _Roles()
    out = {}
    for key in sorted(plan.coef):
        v = plan.coef[key]
        if key == "classes":
            out[key] = tuple(tuple((role, r.slot(name)) for role, name in cls) for cls in class_roles)
        elif key == "coll":
            out[key] = tuple(r.tree(row) if row is not None else (r.slot(None), r.slot(None), r.slot(None))
                             for row in v)
        elif key in _OPTIONAL_TERMS:
            out[key] = None if v is None else r.leaf(v)
        elif key in _OPTIONAL_FORMS:
            out[key] = tuple(None if f is None else r.tree(f) for f in v)
        elif v is None or isinstance(v, str):
            out[key] = r.slot(v)
        else:
            out[key] = r.tree(v)
    return out, tuple(r.names)


def split_plan(plan: Plan) -> Split:
    """The plan's Structure, values and role names (cached on the plan)."""
    cached = plan.__dict__.get("_split")
    if cached is not None:
        return cached
    peaks, class_roles, n_classes = _class_tables(plan)
    derived_a, derived_s = _derived(plan)
    arrays = {k: v for k, v in plan.arrays.items() if k not in STATIC_ARRAYS}
    arrays["class_peak"] = peaks
    for key in CLASS_INDEX_ARRAYS:
        if key in arrays:
            arrays[key] = np.minimum(np.asarray(arrays[key]), n_classes - 1).astype(np.int32)
    arrays.update(derived_a)
    scalars = {k: v for k, v in plan.scalars.items() if k not in STATIC_SCALARS}
    for key in CLASS_INDEX_SCALARS:
        if key in scalars:
            scalars[key] = int(min(int(scalars[key]), n_classes - 1))
    scalars.update(derived_s)
    layout, chunks, offset = [], [], 0
    for group, table in (("A", arrays), ("S", scalars)):
        for key in sorted(table):
            a = np.asarray(table[key])
            if a.dtype.kind not in "biuf":
                refuse("a plan value must be a number, a bool or an array of them", field=key,
                       value=repr(table[key])[:60])
            dtype = "bool" if a.dtype.kind == "b" else "int32" if a.dtype.kind in "iu" else "float64"
            if group == "S" and a.ndim == 0 and isinstance(table[key], (bool, np.bool_)):
                dtype = "bool"
            layout.append((group, key, tuple(a.shape), dtype, offset))
            chunks.append(a.astype(float).reshape(-1))
            offset += a.size
    roles, slot_names = _skeleton(plan, class_roles)
    structure = Structure(layout=tuple(layout),
                          static_arrays={k: np.asarray(plan.arrays[k]) for k in STATIC_ARRAYS if k in plan.arrays},
                          static_scalars={k: plan.scalars[k] for k in STATIC_SCALARS if k in plan.scalars},
                          roles=roles, kinds=len(plan.layer_kind_names), slots=len(slot_names), size=offset)
    values = np.concatenate(chunks) if chunks else np.zeros(0)
    split = Split(structure, values, slot_names)
    object.__setattr__(plan, "_split", split)
    return split


def structure_of(plan: Plan) -> Structure:
    """The plan's Structure: plans with equal structures share one compiled kernel."""
    if not isinstance(plan, Plan):
        refuse("needs a Plan" + ("; give deployment.plan" if isinstance(getattr(plan, "plan", None), Plan) else ""),
               field="plan", value=type(plan).__name__)
    return split_plan(plan).structure


# ----------------------------------------------------------------------------- views


@dataclasses.dataclass(frozen=True)
class View:
    """What the kernel reads: A (arrays), S (scalars), CF (role slots), K (layer kinds).
    Entries are NumPy / Python values (a constant-folded plan) or traced arrays."""
    A: dict
    S: dict
    CF: dict
    K: int


def _unpack(structure: Structure, values):
    """The view of a values vector (NumPy: constants; traced: sliced from it)."""
    A = dict(structure.static_arrays)
    S = dict(structure.static_scalars)
    concrete = isinstance(values, np.ndarray)
    for group, key, shape, dtype, off in structure.layout:
        size = int(np.prod(shape, dtype=int))
        x = _take(values, off, size).reshape(shape)
        if concrete:
            x = x.astype(dtype)
            if group == "S" and x.ndim == 0:
                x = bool(x) if dtype == "bool" else int(x) if dtype == "int32" else float(x)
        else:
            x = (x != 0) if dtype == "bool" else x.astype(jnp.int32) if dtype == "int32" else x
        (A if group == "A" else S)[key] = x
    return View(A, S, structure.roles, structure.kinds)


VALUE_CHUNK = 64     # float64 values per chunk: 512 bytes, XLA:CPU's small-buffer bound (step._kernel_one)


def value_chunks(values):
    """A values vector as a tuple of VALUE_CHUNK-long pieces (the last shorter); ``_unpack``
    reads a view from either form."""
    return tuple(values[i:i + VALUE_CHUNK] for i in range(0, max(len(values), 1), VALUE_CHUNK))


def _take(values, off, size):
    """values[off:off + size] of a vector or of its ``value_chunks``."""
    if not isinstance(values, tuple):
        return values[off:off + size]
    pieces = []
    while size > 0:
        c, i = divmod(off, VALUE_CHUNK)
        n = min(size, VALUE_CHUNK - i)
        pieces.append(values[c][i:i + n])
        off, size = off + n, size - n
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces) if pieces else values[0][:0]


def folded_view(plan: Plan) -> View:
    """The view of one plan with its values as constants (the single-deployment path)."""
    cached = plan.__dict__.get("_view")
    if cached is None:
        s = split_plan(plan)
        cached = _unpack(s.structure, s.values)
        object.__setattr__(plan, "_view", cached)
    return cached


def traced_view(structure: Structure, values) -> View:
    """The view of a traced values vector [structure.size] (or of its ``value_chunks``)."""
    return _unpack(structure, values)


def role_index(slot_names, names, *, where="") -> np.ndarray:
    """int32 [slots]: each role slot's index into a coefficient vector with these names
    (len(names) for an absent role: the gather fills 0). Refuses a name the set lacks."""
    pos = {n: i for i, n in enumerate(names)}
    out = np.empty(len(slot_names), np.int32)
    for j, n in enumerate(slot_names):
        if n is None:
            out[j] = len(names)
        elif n in pos:
            out[j] = pos[n]
        else:
            refuse("the plan needs a coefficient these Coefficients do not carry", file=where or None, field=n)
    return out


def role_values(values, index):
    """The role vector [..., slots] of a coefficient vector [..., names] (0 for an absent role)."""
    return jnp.asarray(values).at[..., index].get(mode="fill", fill_value=0.0)


def folded_roles(plan: Plan, coefs: Coefficients):
    """The role vector of one plan's roles from ``coefs`` (index static)."""
    cache = plan.__dict__.setdefault("_role_index", {})
    idx = cache.get(coefs.names)
    if idx is None:
        idx = role_index(split_plan(plan).slot_names, coefs.names)
        cache[coefs.names] = idx
    return role_values(coefs.values, idx)


# ----------------------------------------------------------------------------- stacks


@jax.tree_util.register_pytree_node_class
class PlanStack:
    """Plans of one Structure, stacked: ``values`` float64 [deployments, structure.size];
    ``slot_names`` per deployment (static, not part of the structure); ``names`` the plans'
    names. A pytree (values is its one leaf) so it can cross jit and vmap."""

    def __init__(self, structure, values, slot_names, names):
        self.structure, self.values = structure, values
        self.slot_names, self.names = tuple(slot_names), tuple(names)

    def tree_flatten(self):
        return (self.values,), (self.structure, _Static(self.slot_names, self.names))

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(aux[0], children[0], aux[1].slot_names, aux[1].names)

    def __len__(self):
        return len(self.names)

    def __repr__(self):
        return f"PlanStack({len(self.names)} deployments, {self.structure!r})"

    def role_index(self, names) -> np.ndarray:
        """int32 [deployments, slots] into a coefficient vector with ``names`` (cached)."""
        cache = self.__dict__.setdefault("_index", {})
        if names not in cache:
            cache[names] = np.stack([role_index(s, names, where=n) for s, n in zip(self.slot_names, self.names)]) \
                if self.names else np.zeros((0, self.structure.slots), np.int32)
        return cache[names]


class _Static:
    """Per-deployment names riding in a PlanStack's tree structure: the deployments' names are
    labels, not part of its identity (as Coefficients' units), so a stack of other deployments
    of one structure, size and coefficient names does not recompile. The coefficient name each
    role reads (``slot_names``) is identity: a caller's ``jax.jit`` over a PlanStack bakes the
    role index in, and two stacks equal by length alone shared one trace, the second priced
    with the first's coefficient names (a B200 stack read the H200's rows: 8.16 ms for 8.48)."""
    __slots__ = ("slot_names", "names", "_hash")

    def __init__(self, slot_names, names):
        self.slot_names, self.names = slot_names, names
        self._hash = hash((len(names), slot_names))

    def __eq__(self, other):
        return isinstance(other, _Static) and len(other.names) == len(self.names) and \
            (other.slot_names is self.slot_names or other.slot_names == self.slot_names)

    def __hash__(self):
        return self._hash


def stack_plans(plans) -> PlanStack:
    """Stack plans (or Deployments) of one Structure for ``price_deployments``.

    Refuses an empty list, and plans of different structures (a JaxpriceError naming the
    plan and what differs: e.g. the layer kinds, an array's shape, a segment id, a graph
    flag, a coefficient role). ``group_by_structure`` sorts a mixed list first."""
    plans = _plans(plans)
    if not plans:
        refuse("needs at least one plan", field="plans")
    splits = [split_plan(p) for p in plans]
    first = splits[0].structure
    for i, s in enumerate(splits):
        if s.structure != first:
            refuse(f"differs in structure from plans[0] ({plans[0].name}): {s.structure.difference(first)}; "
                   "one stack holds plans of one structure (group_by_structure)",
                   file=plans[i].name, field=f"plans[{i}]")
    return PlanStack(first, np.stack([s.values for s in splits]), [s.slot_names for s in splits],
                     [p.name for p in plans])


def _plans(plans) -> list:
    """A list of Plans from a list of Plans or Deployments, refusing anything else in one line."""
    if isinstance(plans, (str, bytes, Plan)) or not hasattr(plans, "__iter__"):
        refuse("needs a list of Plans or Deployments", field="plans", value=type(plans).__name__)
    out = [getattr(p, "plan", p) for p in plans]
    for i, p in enumerate(out):
        if not isinstance(p, Plan):
            refuse("is not a Plan or a Deployment", field=f"plans[{i}]", value=type(p).__name__)
    return out


def group_by_structure(plans) -> list:
    """[(Structure, [indices into plans])] in order of first appearance: the stacks a mixed
    list of plans (or Deployments) needs, one compile each."""
    groups: dict = {}
    for i, p in enumerate(_plans(plans)):
        groups.setdefault(structure_of(p), []).append(i)
    return list(groups.items())


def stack_coefficients(sets, *, union=True) -> Coefficients:
    """Stack coefficient sets into one Coefficients with values [sets, names].

    With ``union`` (the default) the names are the union of the sets' names in order of
    first appearance, and a name a set lacks is NaN in its row (pricing refuses a deployment
    whose roles read one); otherwise every set must carry the same names in the same order."""
    if isinstance(sets, Coefficients) or not hasattr(sets, "__iter__"):
        refuse("needs a list of Coefficients", field="sets", value=type(sets).__name__)
    if not isinstance(union, (bool, np.bool_)):          # "no" or 0.0 would read as their truth value
        refuse("must be True or False", field="union", value=union, has_value=True)
    sets = list(sets)
    if not sets:
        refuse("needs at least one coefficient set", field="sets")
    for i, c in enumerate(sets):
        if not isinstance(c, Coefficients):
            refuse("is not a Coefficients", field=f"sets[{i}]", value=type(c).__name__)
    first = sets[0]
    if not union or all(c.names == first.names for c in sets):
        for i, c in enumerate(sets):
            if c.names != first.names:
                refuse("coefficient sets must share one list of names", field=f"sets[{i}]")
        if any(isinstance(c.values, jax.core.Tracer) for c in sets):
            return Coefficients(jnp.stack([jnp.asarray(c.values) for c in sets]), first.names, first.units, first.cites)
        return Coefficients(_put(np.stack([np.asarray(c.values) for c in sets])), first.names, first.units, first.cites)
    names, units, cites, seen = [], [], [], {}
    for c in sets:
        for n, u, ct in zip(c.names, c.units, c.cites):
            if n not in seen:
                seen[n] = len(names)
                names.append(n), units.append(u), cites.append(ct)
    if any(isinstance(c.values, jax.core.Tracer) for c in sets):
        rows = []
        for c in sets:
            idx = np.array([c.names.index(n) if n in c else len(c.names) for n in names])
            rows.append(jnp.asarray(c.values).at[idx].get(mode="fill", fill_value=np.nan))
        return Coefficients(jnp.stack(rows), names, units, cites)
    out = np.full((len(sets), len(names)), np.nan)
    for i, c in enumerate(sets):
        out[i, [seen[n] for n in c.names]] = np.asarray(c.values)
    return Coefficients(_put(out), names, units, cites)


# ----------------------------------------------------------------------------- pricing


def _batch_layout(batches):
    from .step import check_batch_shape
    if not isinstance(batches, Batch):
        refuse("needs a Batch (Batch.stack)", field="batches", value=type(batches).__name__)
    nd = np.ndim(batches.scheduled)
    if nd in (2, 3):
        check_batch_shape(batches, rank=nd, field="batches")
    if nd not in (2, 3):
        refuse("needs stacked batches [batches, rows] (shared by every deployment) or "
               "[deployments, batches, rows] (Batch.stack, twice)", field="batches",
               value=tuple(np.shape(batches.scheduled)), has_value=True)
    return nd == 3


def _price_body(structure, values, index, coef_values, batches, tau, breakdown, per_dep_coefs, per_dep_batches,
                shards):
    """Each deployment priced by price_many's own kernel, one after another in a ``lax.map``
    (bit for bit equal to pricing it alone: a vmap over deployments would hand XLA [D, B]
    loops, which contract other product-sums into fused multiply-adds than the [B] loops of
    one deployment do; see the module docstring for its cost). Shared coefficients and batches are
    closed over, not copied per deployment. ``shards`` > 1 (the axis laid out over that many
    devices): a vmap over the shards of the map, so each device maps its own deployments."""
    from .step import _batched_kernel

    def one_deployment(part):
        v, idx, c, b = part
        return _batched_kernel(structure, v, idx, c if per_dep_coefs else coef_values,
                               b if per_dep_batches else batches, tau, breakdown)

    per_dep = (values, index, coef_values if per_dep_coefs else None, batches if per_dep_batches else None)
    if shards == 1:
        return jax.lax.map(one_deployment, per_dep)
    split = jax.tree_util.tree_map(lambda x: x.reshape((shards, x.shape[0] // shards) + x.shape[1:]), per_dep)
    out = jax.vmap(lambda part: jax.lax.map(one_deployment, part))(split)
    return jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), out)


def _price_stack(structure, values, index, coef_values, batches, tau, smooth, breakdown, per_dep_coefs,
                 per_dep_batches, shards):
    from .step import exact_at_zero
    _note_compile()
    return exact_at_zero(lambda t: _price_body(structure, values, index, coef_values, batches, t, breakdown,
                                               per_dep_coefs, per_dep_batches, shards), tau if smooth else None)


_STATIC = ("structure", "smooth", "breakdown", "per_dep_coefs", "per_dep_batches", "shards")
_price_stack_jit = jax.jit(_price_stack, static_argnames=_STATIC)
# XLA's cheapest compile (as accuracy.FAST_COMPILE): for few batches, where compiling dominates
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
_price_stack_fast = jax.jit(_price_stack, static_argnames=_STATIC, compiler_options=FAST_COMPILE)


def price_deployments(stack: PlanStack, coefs: Coefficients, batches, *, temperature=None, breakdown=False,
                      fast_compile=False):
    """Price B batches on D deployments in one call: a StepResult with fields [D, B, ...].

    stack: ``stack_plans(plans)`` (one Structure; compiled once per structure, padding, batch
    layout and mode, whatever the deployments, and per ``deployment_bucket(D)``: the deployment
    axis is padded to the next power of two, past 64 the next multiple of 64, with copies of the
    last, cut off the result).
    coefs: one Coefficients shared by every deployment (values [names]; gradients sum over
    deployments) or one per deployment (values [D, names]: ``stack_coefficients`` here, public
    as ``jaxprice.stack_deployment_coefficients``; ``jaxprice.stack_coefficients`` needs one
    list of names). batches: [B, rows] (``Batch.stack``), priced on every deployment, or
    [D, B, rows], each deployment its own. temperature: None for exact mode (equal to
    ``price_many`` of each deployment alone, bit for bit on one device: see the module
    docstring), a float >= 0 for smooth mode. Differentiable in the coefficients (``jax.grad`` of a function of the
    result) and in float64 token counts; the stack's values are a traced leaf too.
    fast_compile: compile with XLA's cheapest settings (FAST_COMPILE), for a few batches where
    compiling costs more than running (the accuracy harness); the same prices up to rounding.
    ``kernel_compiles()`` counts the compiles.

    Calibrating one coefficient set over many deployments, one compile per structure::

        stack = stack_plans([d.plan for d in deps])               # one Structure
        loss = lambda c: jnp.sum((price_deployments(stack, c, batches).no_overlap - t) ** 2)
        grad = jax.grad(loss)(shared_coefs)                       # summed over deployments
    """
    from .step import check_flags, temperature_arg
    if not isinstance(stack, PlanStack):
        refuse("needs a PlanStack (stack_plans)", field="stack", value=type(stack).__name__)
    check_flags(breakdown=breakdown, fast_compile=fast_compile)
    if not isinstance(coefs, Coefficients):
        refuse("needs a Coefficients (shared, or stack_coefficients: one per deployment)", field="coefs",
               value=type(coefs).__name__)
    values = _put(coefs.values)
    D = len(stack)
    if tuple(np.shape(stack.values)) != (D, stack.structure.size):
        # a stack sliced by jax.tree_util.tree_map keeps its names: its rows and names disagree
        refuse(f"holds values of shape {tuple(np.shape(stack.values))} for {D} deployments of "
               f"{stack.structure.size} values each (a PlanStack sliced by jax.tree_util.tree_map keeps its "
               "names: stack_plans of the plans wanted instead)", field="stack.values")
    if values.ndim == 2:
        if values.shape[0] != D:
            refuse(f"has {values.shape[0]} coefficient sets for {D} deployments", field="coefs.values",
                   value=tuple(values.shape), has_value=True)
        per_dep_coefs = True
    elif values.ndim == 1:
        per_dep_coefs = False
    else:
        refuse("needs values [names] (shared) or [deployments, names]", field="coefs.values",
               value=tuple(values.shape), has_value=True)
    per_dep_batches = _batch_layout(batches)
    if per_dep_batches and np.shape(batches.scheduled)[0] != D:
        refuse(f"has batches for {np.shape(batches.scheduled)[0]} deployments, the stack holds {D}",
               field="batches", value=tuple(np.shape(batches.scheduled)), has_value=True)
    index = stack.role_index(coefs.names)
    if not isinstance(coefs.values, jax.core.Tracer):
        _check_stack_values(stack, coefs, index, per_dep_coefs)
    smooth, tau = temperature_arg(temperature)
    # a NumPy stack (stack_plans') is priced with its deployment axis padded to deployment_bucket(D)
    # by copies of its last deployment, cut off the result: a fleet tool adding deployments one at
    # a time compiled once per count (2-4 s each on two cores); now once per bucket. A stack whose
    # values are already on devices (sharded, or traced by a caller's jit) keeps its D.
    n = deployment_bucket(D) if isinstance(stack.values, np.ndarray) else D
    dev = stack.__dict__.get("_device")
    if dev is None or not isinstance(stack.values, np.ndarray):
        with jax.ensure_compile_time_eval():     # cached: concrete even under a caller's jax.jit
            dev = _put(_pad_rows(stack.values, n))
        if isinstance(stack.values, np.ndarray):
            stack.__dict__["_device"] = dev
    didx = stack.__dict__.setdefault("_device_index", {})
    if coefs.names not in didx:
        with jax.ensure_compile_time_eval():
            didx[coefs.names] = _put(_pad_rows(index, n))
    if n != D:
        if per_dep_coefs:
            values = _pad_rows(coefs.values if isinstance(coefs.values, jax.core.Tracer) else
                               np.asarray(coefs.values), n)
        if per_dep_batches:
            batches = _unchecked_batch(*(_pad_rows(x if isinstance(x, jax.core.Tracer) else np.asarray(x), n)
                                         for x in jax.tree_util.tree_leaves(batches)), checked=True)
    values = _pad_names(values)
    fn = _price_stack_fast if fast_compile else _price_stack_jit
    out = fn(stack.structure, dev, didx[coefs.names], _put(values), batches, tau, smooth, breakdown,
             per_dep_coefs, per_dep_batches, _shards(dev, n))
    return out if n == D else jax.tree_util.tree_map(lambda x: x[:D], out)


def deployment_bucket(d: int) -> int:
    """The deployment count a NumPy stack of ``d`` is priced at: the next power of two up to 64,
    then the next multiple of 64 (one compile per bucket; the padding costs at most 2x the map)."""
    if d <= 1:
        return d
    return 1 << (d - 1).bit_length() if d <= 64 else -(-d // 64) * 64


def _pad_rows(x, n):
    """``x`` [D, ...] with copies of its last row up to n rows (NumPy stays NumPy, traced jnp)."""
    d = x.shape[0]
    if n == d:
        return x
    if isinstance(x, jax.core.Tracer):
        return jnp.concatenate([x, jnp.repeat(x[-1:], n - d, axis=0)])
    x = np.asarray(x)
    return np.concatenate([x, np.repeat(x[-1:], n - d, axis=0)])


def _check_stack_values(stack, coefs, index, per_dep_coefs):
    """Each value a deployment's plan reads a finite number >= 0, as ``price`` checks one set
    (step.check_coefficient_values): a NaN priced NaN, a negative rate a negative time. A
    per-deployment NaN is a set that lacks the coefficient (union-stacked sets fill NaN). Once
    per vector and stack: remembered on the stack, so a repeated call pays nothing."""
    checked = stack.__dict__.setdefault("_checked_values", {})
    if checked.get(coefs.names) is coefs.values:
        return
    D = len(stack)
    arr = np.asarray(coefs.values)      # concrete (the caller checks); not its device copy, traced under jit
    if arr.dtype.kind not in "iuf":
        refuse(f"must be numbers (SI units), got {arr.dtype.name}", field="coefs.values")
    arr = np.broadcast_to(arr, (D, arr.shape[-1])) if not per_dep_coefs else arr
    picked = np.take_along_axis(np.concatenate([arr.astype(float), np.zeros((D, 1))], axis=1),
                                index.astype(np.int64), axis=1)
    bad = np.argwhere(~np.isfinite(picked) | (picked < 0))
    if len(bad):
        d, j = bad[0]
        x = picked[d, j].item()
        if per_dep_coefs and np.isnan(x):
            refuse("this deployment's coefficient set lacks a coefficient its plan needs (NaN in the "
                   "stacked sets)", file=stack.names[d], field=stack.slot_names[d][j])
        refuse("must be a finite number >= 0 (SI units)", file=stack.names[d],
               field=f"coefs[{stack.slot_names[d][j]}]", value=x, has_value=True)
    checked[coefs.names] = coefs.values


def _shards(values, n):
    """How many devices the deployment axis of ``values`` is laid out over (1 on one device)."""
    sharding = getattr(values, "sharding", None)
    if sharding is None or sharding.is_fully_replicated:
        return 1
    k = len(sharding.device_set)
    return k if n % k == 0 else 1


def _pad_names(values):
    """The coefficient axis padded to a power of two (at least 64) with zeros no role reads:
    sets of other chips (other name counts) then share a compile."""
    n = values.shape[-1]
    m = max(64, 1 << max(n - 1, 0).bit_length())
    if m == n:
        return values
    pad = [(0, 0)] * (values.ndim - 1) + [(0, m - n)]
    if isinstance(values, jax.core.Tracer):
        return jnp.pad(values, pad)
    return _put(np.pad(np.asarray(values), pad))


def price_plans(plans, coefs, batches, *, temperature=None):
    """``price_deployments`` over a mixed list of plans (or Deployments): one call, and one
    compile, per structure. coefs: one shared Coefficients, or a list of one per plan.
    batches: one stacked Batch [B, rows] for all, or a list of one per plan (each [B_i, rows_i]:
    within a structure they are padded to the largest B and rows with empty batches and
    padding rows, which price exactly as without them). Returns a list of StepResults, one per
    plan, with fields [B_i, ...]."""
    plans = _plans(plans)
    shared_coefs = isinstance(coefs, Coefficients)
    shared_batches = not isinstance(batches, (list, tuple))
    for name, arg, shared in (("coefs", coefs, shared_coefs), ("batches", batches, shared_batches)):
        if not shared and (not isinstance(arg, (list, tuple)) or len(arg) != len(plans)):
            refuse(f"needs one shared value or a list of one per plan ({len(plans)})", field=name,
                   value=f"{len(arg)} items" if isinstance(arg, (list, tuple)) else type(arg).__name__)
    out = [None] * len(plans)
    for _, idx in group_by_structure(plans):
        stack = stack_plans([plans[i] for i in idx])
        c = coefs if shared_coefs else stack_coefficients([coefs[i] for i in idx])
        if shared_batches:
            res = price_deployments(stack, c, batches, temperature=temperature)
            counts = [np.shape(batches.scheduled)[0]] * len(idx)
        else:
            group = [batches[i] for i in idx]
            b, counts = pad_batches(group)
            res = price_deployments(stack, c, b, temperature=temperature)
        for k, i in enumerate(idx):
            out[i] = jax.tree_util.tree_map(lambda x, k=k, n=counts[k]: x[k, :n], res)
    return out


def pad_batches(groups, *, min_batches=0, min_rows=0):
    """Stack per-deployment stacked batches ([B_i, rows_i] each) into [D, max B, max rows]
    (at least ``min_batches`` and ``min_rows``): extra rows are padding (mask False, zero
    counts) and extra batches are empty. Returns (Batch, [B_i])."""
    from .step import check_batch_shape
    groups = list(groups)
    if not groups:
        refuse("needs at least one stacked Batch", field="groups")
    for i, b in enumerate(groups):
        check_batch_shape(b, rank=2, field=f"groups[{i}]")
    leaves = [[np.asarray(x) for x in (b.scheduled, b.computed, b.prompt_len, b.mask, b.decode_threshold)]
              for b in groups]
    B = max([l[0].shape[0] for l in leaves] + [min_batches])
    R = max([l[0].shape[1] for l in leaves] + [min_rows])
    D = len(groups)
    dtype = np.result_type(*[l[0].dtype for l in leaves])
    sched = np.zeros((D, B, R), dtype)
    comp = np.zeros((D, B, R), dtype)
    prompt = np.zeros((D, B, R), dtype)
    mask = np.zeros((D, B, R), bool)
    thr = np.zeros((D, B), np.result_type(*[l[4].dtype for l in leaves]))
    for d, (s, c, p, m, t) in enumerate(leaves):
        b, r = s.shape
        sched[d, :b, :r], comp[d, :b, :r], prompt[d, :b, :r], mask[d, :b, :r] = s, c, p, m
        thr[d, :b] = t
        thr[d, b:] = t[0] if len(t) else 0
    # the groups' batches were checked when built: no value check of the padded copy
    return _unchecked_batch(_put(sched), _put(comp), _put(prompt), _put(mask), _put(thr), checked=True), \
        [l[0].shape[0] for l in leaves]
