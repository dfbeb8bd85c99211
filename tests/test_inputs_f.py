"""Malformed arguments to the public Python API found by a bug-bash of the library entry points
(Batch constructors, load_deployment, price / price_many, the deployment axis, the sweep helpers,
Coefficients.replace, optimize_batch): each is refused in ONE line (a JaxpriceError naming the field
and the value) before anything is jitted; before, each gave a raw TypeError / ValueError /
AttributeError traceback, a silent coercion, a hang or a nonsense price.

Nothing here compiles a kernel: every refusal happens before jit, so a refusal that regressed into
a compile shows up as a slow test, and one that regressed into a traceback fails.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from clirefusal import refused

import jaxprice as jp
from jaxprice import Batch
from jaxprice._src import cli_optimize, cli_price, search, stack, step, sweep
from jaxprice._src.plan import INT_TOKEN_LIMIT

S = "deepseek-v3-h200-fp8-sglang-tp8"


@pytest.fixture(scope="module")
def dep():
    return jp.load_deployment(S)


# ----------------------------------------------------------------------------- Batch constructors

@pytest.mark.parametrize("call,words", [
    # a string, a float, None or a bool as the request count: TypeError ('<' between str and int; can't
    # multiply sequence by float), or True taken as 1 request
    (lambda: Batch.decode("4", 100), ("'requests'", "value '4'", "non-negative integer")),
    (lambda: Batch.decode(4.5, 100), ("'requests'", "4.5")),
    (lambda: Batch.decode(None, 100), ("'requests'", "value None")),
    (lambda: Batch.decode(True, 100), ("'requests'", "value True")),
    (lambda: Batch.decode(10 ** 30, 100), ("'requests'", "at most 1048576")),
    # 10**9 requests built a 10**9-element list (minutes, then out of memory)
    (lambda: Batch.decode(10 ** 9, 100), ("'requests'", "must be at most 1048576")),
    # a context at or past the kernel's token limit: priced silently in float64 (2**60 tokens)
    (lambda: Batch.decode(2, 2 ** 60), ("'context'", "token limit")),
    (lambda: Batch.decode(2, INT_TOKEN_LIMIT), ("'context'", f"value {INT_TOKEN_LIMIT}", "below 16777216")),
    (lambda: Batch.decode(2, float("nan")), ("'context'", "value nan")),
    (lambda: Batch.decode(2, 4, tokens=8), ("'context'", "value 4", ">= tokens (8)")),
    (lambda: Batch.decode(2, 100, tokens=-1), ("'tokens'", "value -1")),
])
def test_batch_decode_refusals(call, words):
    refused(call, "Batch.decode", *words)


@pytest.mark.parametrize("kwargs,words", [
    # ValueError: could not convert string to float
    (dict(scheduled=["a"], computed=[1]), ("batch, field 'scheduled'", "value ['a']", "must be numbers")),
    (dict(scheduled=[1], computed=None), ("field 'computed'", "got None")),
    (dict(scheduled=[1], computed=[1], prompt_len={"a": 1}), ("field 'prompt_len'", "must be numbers")),
    (dict(scheduled=[True], computed=[0]), ("field 'scheduled'", "got bool")),
    (dict(scheduled=[1 + 1j], computed=[0]), ("field 'scheduled'", "complex")),
    # 2-D input was flattened into four requests
    (dict(scheduled=[[1, 2], [3, 4]], computed=[[1, 2], [3, 4]]), ("field 'scheduled'", "flat list", "(2, 2)")),
    # pad_to 1.5 padded to 1 row, "4" to 4, NaN raised ValueError
    (dict(scheduled=[1], computed=[1], pad_to=1.5), ("field 'pad_to'", "value 1.5", "whole number of rows")),
    (dict(scheduled=[1], computed=[1], pad_to="4"), ("field 'pad_to'", "value '4'")),
    (dict(scheduled=[1], computed=[1], pad_to=float("nan")), ("field 'pad_to'", "value nan")),
    (dict(scheduled=[1], computed=[1], pad_to=2 ** 40), ("field 'pad_to'", "value 1099511627776", "at most 1048576")),
    # float64 counts at or past the kernel's token limit were accepted (int32 ones were refused)
    (dict(scheduled=[1e20], computed=[1]), ("field 'scheduled[0]'", "value 1e+20", "token limit")),
    (dict(scheduled=[1], computed=[0, INT_TOKEN_LIMIT]),
     ("field 'computed'", "has 2 values for 1 requests")),
    (dict(scheduled=[1, 1], computed=[0, INT_TOKEN_LIMIT]), ("field 'computed[1]'", "below 16777216")),
    (dict(scheduled=[1], computed=[0], prompt_len=[INT_TOKEN_LIMIT]), ("field 'prompt_len[0]'", "token limit")),
    # a threshold given as a string, None or past the token limit: ValueError / TypeError, or accepted
    (dict(scheduled=[1], computed=[1], decode_threshold="x"), ("field 'decode_threshold'", "value 'x'")),
    (dict(scheduled=[1], computed=[1], decode_threshold=None), ("field 'decode_threshold'", "value None")),
    (dict(scheduled=[1], computed=[1], decode_threshold=float("nan")), ("field 'decode_threshold'", "value nan")),
    (dict(scheduled=[1], computed=[1], decode_threshold=1e300), ("field 'decode_threshold'", "token limit")),
    # an unknown dtype: TypeError data type 'foo' not understood
    (dict(scheduled=[1], computed=[1], dtype="foo"), ("field 'dtype'", "value 'foo'", "int32")),
])
def test_batch_from_requests_refusals(kwargs, words):
    sched, comp = kwargs.pop("scheduled"), kwargs.pop("computed")
    refused(lambda: Batch.from_requests(sched, comp, **kwargs), *words)


def test_from_requests_names_its_source():
    refused(lambda: Batch.from_requests(["a"], [1], source="trace.csv"), "trace.csv, field 'scheduled'")


def test_what_the_batch_checks_leave_alone():
    """Integer-valued floats and NumPy integers are whole numbers; a scalar count broadcasts; an empty
    batch and zero-token rows (the kernel's KNOWN DIVERGENCE) build; a prompt shorter than the context
    (a decode past its prompt) is recorded as given, since pricing never reads it."""
    b = Batch.decode(np.int64(3), 100.0, pad_to=np.int32(4), decode_threshold=8.0)
    assert b.rows == 4 and np.asarray(b.mask).tolist() == [True, True, True, False]
    assert float(b.decode_threshold) == 8.0
    assert np.asarray(Batch.from_requests(5, 3).prompt_len).tolist() == [8.0]
    assert Batch.from_requests([], [], pad_to=0).rows == 0
    assert np.asarray(Batch.decode(2, 10, tokens=0).scheduled).tolist() == [0.0, 0.0]
    assert np.asarray(Batch.from_requests([4], [10], prompt_len=[3]).prompt_len).tolist() == [3.0]
    top = INT_TOKEN_LIMIT - 1
    assert float(Batch.from_requests([1], [top - 1]).prompt_len[0]) == top


@pytest.mark.parametrize("make,words", [
    # TypeError: tree_map() missing 1 required positional argument
    (lambda: [], ("'batches'", "at least one Batch")),
    (lambda: None, ("'batches'", "NoneType", "a list of Batches")),
    (lambda: Batch.decode(1, 10), ("'batches'", "'Batch'", "a list of Batches")),
    # ints were stacked into an int array and returned as if a Batch
    (lambda: [1, 2], ("'batches[0]'", "'int'", "is not a Batch")),
    # ValueError: all input arrays must have the same shape
    (lambda: [Batch.decode(1, 10, pad_to=2), Batch.decode(1, 10, pad_to=4)],
     ("'batches[1]'", "shape (4,)", "batches[0] (2,)", "one padding")),
    (lambda: [Batch.stack([Batch.decode(1, 10, pad_to=2)]), Batch.decode(1, 10, pad_to=2)], ("'batches[1]'",)),
])
def test_batch_stack_refusals(make, words):
    refused(lambda: Batch.stack(make()), *words)


def test_batch_stack_takes_any_iterable_and_per_batch_thresholds():
    b = Batch.stack(Batch.decode(1, 10, pad_to=2, decode_threshold=t) for t in (1, 8))
    assert np.shape(b.scheduled) == (2, 2) and np.asarray(b.decode_threshold).tolist() == [1.0, 8.0]


# ----------------------------------------------------------------------------- load_deployment

@pytest.mark.parametrize("arg,words", [
    ("", ("'path'", "value ''", "an empty name")),          # was ".: is a directory, expected a YAML file"
    ("  ", ("'path'", "an empty name")),
    (None, ("'path'", "value None", "a str or a path")),    # was "None: no such scenario file"
    (3, ("'path'", "value 3", "a str or a path")),
    (["a"], ("'path'", "'list'", "a str or a path")),
    (b"x", ("'path'", "value b'x'")),
])
def test_load_deployment_refuses_what_names_no_scenario(arg, words):
    refused(lambda: jp.load_deployment(arg), *words)


# ----------------------------------------------------------------------------- pricing entry points

def test_price_and_price_many_refuse_wrong_arguments_before_jit(dep):
    P, C = dep.plan, dep.coefficients
    one, many = Batch.decode(2, 100, pad_to=4), Batch.stack([Batch.decode(2, 100, pad_to=4)] * 2)
    # AttributeError: 'Deployment' object has no attribute 'arrays' (fold: not hashable)
    for fold in (False, True):
        refused(lambda: jp.price(dep, C, one, fold=fold), "'plan'", "'Deployment'", "give deployment.plan")
    refused(lambda: jp.price(C, P, one), "'plan'", "'Coefficients'")
    refused(lambda: jp.price(P, C.to_dict(), one), "'coefs'", "'dict'")
    refused(lambda: jp.price(P, dep, one), "'coefs'", "give deployment.coefficients")
    refused(lambda: jp.price(P, C, None), "'batch'", "'NoneType'", "needs a Batch")
    # ValueError: Incompatible shapes for broadcasting / vmap ... rank should be at least 1
    refused(lambda: jp.price(P, C, many), "'batch'", "value (2, 4)", "price_many")
    refused(lambda: jp.price_many(P, C, one), "'batches'", "value (4,)", "Batch.stack")
    refused(lambda: jp.price_many(dep, C, many), "'plan'", "'Deployment'")
    # a Batch built by hand: lists (TypeError: Cannot determine dtype) or fields of other shapes
    refused(lambda: jp.price(P, C, Batch([1, 2], [3, 4], [4, 6], [True, True], 1)), "'batch.scheduled'",
            "Python list")
    two = np.ones(2)
    refused(lambda: jp.price(P, C, Batch(two, two, two, np.ones(3, bool), 1.0)), "'batch.mask'",
            "shape (3,), scheduled (2,)")
    refused(lambda: jp.price(P, C, Batch(two, two, two, np.ones(2, bool), np.ones(2))),
            "'batch.decode_threshold'", "shape (2,)")
    refused(lambda: jp.price_many(P, C, Batch(many.scheduled, many.computed, many.prompt_len, many.mask, 1.0)),
            "'batches.decode_threshold'", "one per batch is (2,)")


@pytest.mark.parametrize("temperature,words", [
    ("0.1", ("value '0.1'", "one number")),        # was coerced by float() and priced
    (True, ("value True", "one number")),          # was priced at temperature 1
    (np.array([0.1, 0.2]), ("shape (2,)",)),       # TypeError: Pred must be a scalar
    ([0.1], ("shape (1,)",)),
    (-1, ("value -1", ">= 0")),
    (float("nan"), ("value nan",)),
    (5.0, ("value 5.0", "at most 1")),             # priced (0.25x the exact step); the CLI refuses past 1
])
def test_price_temperature_refusals(dep, temperature, words):
    b = Batch.decode(2, 100, pad_to=4)
    refused(lambda: jp.price(dep.plan, dep.coefficients, b, temperature=temperature), "'temperature'", *words)


def test_the_library_caps_are_the_clis():
    assert cli_price.MAX_TEMPERATURE is step.MAX_TEMPERATURE == 1.0
    assert (cli_optimize.MAX_RESTARTS, cli_optimize.MAX_ITERATIONS) == (search.MAX_RESTARTS, search.MAX_ITERATIONS)
    assert step.temperature_arg(1.0) == (True, 1.0) and step.temperature_arg(np.float32(0.0)) == (True, 0.0)
    assert step.temperature_arg(None) == (False, None)


def test_coefficients_replace_refusals(dep):
    C = dep.coefficients
    # the unknown name was refused as "the plan needs a coefficient these Coefficients do not carry"
    refused(lambda: C.replace(hbm_derat=0.7), "'hbm_derat'", "is not a name", "near matches: hbm_derate")
    # NaN and negative values were stored and priced
    refused(lambda: C.replace(hbm_derate=float("nan")), "'hbm_derate'", "value nan", ">= 0")
    refused(lambda: C.replace(hbm_derate=-1.0), "'hbm_derate'", "value -1.0", ">= 0")
    refused(lambda: C.replace(hbm_derate="0.7"), "'hbm_derate'", "must be a number")      # TypeError
    refused(lambda: C.replace(hbm_derate=np.ones(2)), "'hbm_derate'", "shape (2,)")       # ValueError
    assert float(C.replace(hbm_derate=0.75)["hbm_derate"]) == 0.75
    stacked = sweep.stack_coefficients([C, C])
    np.testing.assert_array_equal(np.asarray(stacked.replace(hbm_derate=np.array([0.5, 0.6]))["hbm_derate"]),
                                  [0.5, 0.6])


def test_a_traced_coefficient_or_temperature_passes_unchecked():
    import jax
    c = jp.Coefficients(np.array([1.0, 2.0]), ("a", "b"))
    out = jax.jit(lambda v: c.replace(a=v).values)(-3.0)        # a tracer: not refused, not read
    assert np.asarray(out).tolist() == [-3.0, 2.0]
    assert jax.jit(lambda t: step.temperature_arg(t)[1] * 2)(5.0) == 10.0


# ----------------------------------------------------------------------------- deployment axis, sweeps

def test_deployment_axis_refusals(dep):
    C = dep.coefficients
    many = Batch.stack([Batch.decode(2, 100, pad_to=4)] * 2)
    st = stack.stack_plans([dep])
    # TypeError / AttributeError from inside the stacking
    refused(lambda: stack.stack_plans(None), "'plans'", "'NoneType'")
    refused(lambda: stack.stack_plans(dep.plan), "'plans'", "'Plan'", "a list")
    refused(lambda: stack.stack_plans("abc"), "'plans'", "'str'")
    refused(lambda: stack.stack_plans([dep, 1]), "'plans[1]'", "'int'")
    refused(lambda: stack.stack_coefficients(None), "'sets'", "'NoneType'")
    refused(lambda: stack.stack_coefficients([C, 2]), "'sets[1]'", "'int'")
    refused(lambda: stack.price_deployments(st, {}, many), "'coefs'", "'dict'")
    refused(lambda: stack.price_deployments(st, C, None), "'batches'", "'NoneType'")
    refused(lambda: stack.price_deployments(st, C, Batch(many.scheduled, many.computed, many.prompt_len,
                                                               many.mask[:1], many.decode_threshold)),
            "'batches.mask'", "shape (1, 4)")
    refused(lambda: stack.price_deployments(st, C, many, temperature=5.0), "'temperature'", "at most 1")
    # IndexError: list index out of range
    refused(lambda: stack.price_plans([dep, dep], [C], many), "'coefs'", "1 items", "one per plan (2)")
    refused(lambda: stack.price_plans([dep, dep], C, [many]), "'batches'", "1 items")
    refused(lambda: stack.pad_batches([]), "'groups'", "at least one")                  # ValueError
    refused(lambda: stack.pad_batches([Batch.decode(1, 10)]), "'groups[0]'", "value (1,)")  # IndexError


def test_sweep_helper_refusals(dep):
    P, C = dep.plan, dep.coefficients
    one, many = Batch.decode(2, 100, pad_to=4), Batch.stack([Batch.decode(2, 100, pad_to=4)] * 2)
    sets = sweep.stack_coefficients([C, C])
    refused(lambda: sweep.price_coefficient_sets(dep, sets, one), "'plan'", "'Deployment'")
    refused(lambda: sweep.price_coefficient_sets(P, sets, many), "'batch'", "value (2, 4)")
    refused(lambda: sweep.stack_coefficients([1, 2]), "'sets[0]'", "'int'")
    refused(lambda: sweep.stack_coefficients(None), "'sets'")
    refused(lambda: sweep.price_sharded(dep, C, many), "'plan'", "'Deployment'")
    refused(lambda: sweep.price_sharded(P, C, one), "'batches'", "value (4,)")
    refused(lambda: sweep.price_sharded(P, C, many, mesh="x"), "'mesh'", "'str'")
    refused(lambda: sweep.price_sharded(P, C, many, temperature="x"), "'temperature'", "value 'x'")


@pytest.mark.parametrize("kwargs,words", [
    (dict(count="2"), ("'count'", "value '2'")),                 # TypeError '<' between str and int
    (dict(count=2.5), ("'count'", "value 2.5")),
    (dict(rows=4.5), ("'rows'", "value 4.5")),
    (dict(count=10 ** 12), ("'count'", "2**26")),                # MemoryError: 7.28 TiB
    (dict(decode_share=2.0), ("'decode_share'", "value 2.0", "[0, 1]")),    # silently all-decode
    (dict(decode_share=math.nan), ("'decode_share'", "value nan")),         # silently all-prefill
    (dict(max_context=-5), ("'max_context'", "value -5")),       # ValueError: high <= 0
    (dict(max_context=2 ** 40), ("'max_context'", "token limit")),          # 10**12-token contexts
    (dict(max_prefix=-1), ("'max_prefix'", "value -1")),
    (dict(decode_threshold=1.5), ("'decode_threshold'", "value 1.5")),      # truncated to 1
    (dict(decode_threshold=math.nan), ("'decode_threshold'", "value nan")),  # ValueError
    (dict(decode_threshold=8, max_prefill=8), ("'max_prefill'", "above decode_threshold (8)")),
])
def test_random_batches_refusals(kwargs, words):
    args = dict(count=2, rows=4) | kwargs
    count, rows = args.pop("count"), args.pop("rows")
    refused(lambda: sweep.random_batches(np.random.default_rng(0), count, rows, **args), "random_batches", *words)
    refused(lambda: sweep.random_batches(0, 2, 4), "'rng'", "default_rng")      # AttributeError: 'int' ...


# ----------------------------------------------------------------------------- optimize_batch

@pytest.mark.parametrize("kwargs,words", [
    # 10**8 restarts ran out of device memory after 15 s; 10**9 iterations ran for hours
    (dict(restarts=10 ** 8), ("'restarts'", "at most 1024", "effort")),
    (dict(iterations=10 ** 9), ("'iterations'", "at most 20000")),
    (dict(temperature=5), ("'temperature'", "at most 1")),
    (dict(restarts="2"), ("'restarts'", "value '2'", "must be a number")),     # was float("2")
    (dict(restarts=True), ("'restarts'", "value True")),
    (dict(itl="0.05"), ("'itl'", "value '0.05'")),
    (dict(seed=-1), ("'seed'", "value -1")),                                   # ValueError from NumPy, late
    (dict(seed="a"), ("'seed'", "value 'a'")),
    (dict(max_polish_rounds=-1), ("'max_polish_rounds'", "value -1")),
    (dict(callback=5), ("'callback'", "'int'")),                                # TypeError mid-search
])
def test_optimize_batch_refusals(dep, kwargs, words, monkeypatch):
    def ran(*a, **k):
        raise AssertionError("the search ran: the input was not refused up front")
    monkeypatch.setattr(search, "_descend", ran)
    args = dict(itl=0.05, prefill_budget=0) | kwargs
    refused(lambda: search.optimize_batch(dep, **args), *words)


@pytest.mark.parametrize("temperature,words", [(5.0, ("at most 1",)), ("0.1", ("one number",)), (True, ("one number",)),
                                               (-1.0, (">= 0",))])
def test_fit_takes_the_temperatures_pricing_takes(temperature, words):
    """jaxprice.fit.fit_coefficients's smooth temperature: the same [0, 1] as every pricing entry
    point (it accepted 5, where the surrogates leave their bounds)."""
    from jaxprice._src.fit import _check_fit_options
    refused(lambda: _check_fit_options("l2", "point", 0.1, temperature, 0.0, 0.1), "'temperature'", *words)
    _check_fit_options("l2", "point", 0.1, 0.05, 0.0, 0.1)
