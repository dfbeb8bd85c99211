"""Bug-bash of malformed input (helper l): each case was accepted (or priced NaN, or read as
something it is not, or refused in two lines) before its fix, and is now refused in one line
naming the field and the value. Everything is refused before anything compiles, except the one
test of price() under a caller's jax.jit (a traceback from valid input: two sub-second compiles
of a small dense model). Each test failed before its fix."""

import jax
import numpy as np
import pytest
from clirefusal import assert_refused, refused

import jaxprice as jp

NAME = "deepseek-v3-h200-fp8-sglang-tp8"
CSV = "testdata/measured/inferencex_vllm_excerpt.csv"
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def dep():
    return jp.load_deployment(NAME)


# ----------------------------------------------------------------------------- Trace


@pytest.mark.parametrize("source, shown", [(5, "value 5"), (b"t.csv", "value b't.csv'"), (["a"], "value 'list'"),
                                           (True, "value True")])
def test_a_trace_source_that_is_not_text_is_refused(source, shown):
    """Trace(..., source=5) was accepted and named the trace '5' in every later refusal."""
    refused(lambda: jp.Trace((0.0,), (64,), (16,), source=source), "field 'Trace.source'", shown, "a str")


def test_a_trace_source_may_be_a_path_or_left_unnamed(tmp_path):
    assert jp.Trace((0.0,), (64,), (16,), source=tmp_path / "t.csv").source == str(tmp_path / "t.csv")
    for unnamed in (None, "", "  "):
        assert jp.Trace((0.0,), (64,), (16,), source=unnamed).source == "trace"
    # the name the refusal of a bad column starts with
    refused(lambda: jp.Trace((NAN,), (64,), (16,), source=tmp_path / "t.csv"), "t.csv, field 'arrival_s[0]'")


# ----------------------------------------------------------------------------- evaluate_accuracy settings


@pytest.mark.parametrize("settings, shown", [(5, "value 5"), ({"max_num_seqs": 4}, "value 'dict'"),
                                             (True, "value True"), ("", "value ''")])
def test_evaluate_accuracy_settings_must_be_a_csv_path(settings, shown):
    """settings=5 was read as a file named '5' ('cannot read the settings file')."""
    refused(lambda: jp.evaluate_accuracy(CSV, batch_rule="simulate", settings=settings), "field 'settings'", shown)


def test_evaluate_accuracy_settings_under_a_static_rule_is_refused(tmp_path):
    """settings was silently ignored under a static batch rule (the CLI refused --settings)."""
    refused(lambda: jp.evaluate_accuracy(CSV, settings=tmp_path / "flags.csv"), "field 'settings'",
            "batch_rule 'simulate'")


# ----------------------------------------------------------------------------- simulate_sweep


@pytest.mark.parametrize("levels", [[4, 4, 8], [4, 8, np.int64(4)]])
def test_simulate_sweep_refuses_a_concurrency_given_twice(dep, levels):
    """simulate_sweep(dep, w, [4, 4, 8]) simulated level 4 twice and returned it twice (the CLI's
    --concurrency 4,8,4 was refused already: tests/test_inputs_e.py)."""
    refused(lambda: jp.simulate_sweep(dep, jp.Workload(64, 16), levels), "field 'concurrencies'", "value 4",
            "twice")


# ----------------------------------------------------------------------------- price_deployments


@pytest.mark.parametrize("bad", [NAN, -1.0, INF])
def test_price_deployments_checks_a_shared_coefficient_vector(dep, bad):
    """A shared 1-D vector with NaN where the plan reads was priced NaN (a negative, a shorter
    time; inf, a finite one), as price() refuses it (step.check_coefficient_values)."""
    c = dep.coefficients
    v = np.asarray(c.values).copy()
    v[c.names.index("hbm_derate")] = bad
    hand = jp.Coefficients(v, c.names)
    batches = jp.Batch.stack([jp.Batch.decode(2, 10, pad_to=4)] * 2)
    stack = jp.stack_plans([dep.plan, dep.plan])
    words = (NAME, "field 'coefs[hbm_derate]'", f"value {bad!r}", "finite number >= 0")
    refused(lambda: jp.price_deployments(stack, hand, batches), *words)
    refused(lambda: jp.price_plans([dep.plan], hand, batches), *words)
    if bad == bad:          # per deployment: a NaN is a set that lacks the coefficient (test_deployment_axis)
        refused(lambda: jp.price_deployments(stack, jp.stack_coefficients([c, hand]), batches), *words)


def test_price_deployments_leaves_names_the_plan_does_not_read(dep):
    c = dep.coefficients
    extra = jp.Coefficients(np.append(np.asarray(c.values), NAN), c.names + ("not_read",))
    stack = jp.stack_plans([dep.plan])
    from jaxprice._src.stack import _check_stack_values
    _check_stack_values(stack, extra, stack.role_index(extra.names), False)      # passes: no compile needed
    assert stack.__dict__["_checked_values"][extra.names] is extra.values       # remembered


# ----------------------------------------------------------------------------- batches rebuilt by tree_map


def test_a_batch_rebuilt_by_tree_map_holding_nan_is_refused_at_price(dep):
    """jax.tree_util.tree_map skips Batch's value checks: a NaN count was priced NaN by price()
    and price_many(). The pricing entry points now check such a batch's values once; a batch a
    constructor built carries its check and is not read again."""
    b = jp.Batch.decode(2, 10, pad_to=4)
    assert b.__dict__.get("_values_checked")
    counts = lambda f: lambda x: f(x) if x.ndim and x.dtype.kind == "f" else x      # noqa: E731 (not the mask)
    nan = jax.tree_util.tree_map(counts(lambda x: x * NAN), b)
    refused(lambda: jp.price(dep.plan, dep.coefficients, nan), "Batch, field 'scheduled[0]'", "value nan")
    neg = jax.tree_util.tree_map(counts(lambda x: -x), jp.Batch.stack([b, b]))
    refused(lambda: jp.price_many(dep.plan, dep.coefficients, neg), "field 'scheduled[0, 0]'", "value -1.0")
    refused(lambda: jp.price_deployments(jp.stack_plans([dep.plan]), dep.coefficients, neg), "value -1.0")
    # Batch.stack of a rebuilt batch is not marked checked either: refused at price_many
    refused(lambda: jp.price_many(dep.plan, dep.coefficients, jp.Batch.stack([b, nan])), "value nan")
    assert jp.Batch.stack([b, b]).__dict__.get("_values_checked")
    assert b.astype("int32").__dict__.get("_values_checked")
    assert jp.random_batches(np.random.default_rng(0), 2, 4).__dict__.get("_values_checked")


def test_numpy_values_changed_after_their_check_do_not_reach_pricing(dep):
    """A Batch or Coefficients built from the caller's NumPy arrays is checked once and remembered
    by identity; the caller's array set to NaN afterwards was priced NaN. Each now holds a
    read-only copy: the caller's array stays its own (and writeable), and writing into the held
    one is refused by NumPy; replace() still makes changed coefficients."""
    sched, ctx, mask = np.ones(4), np.full(4, 100.0), np.ones(4, bool)
    b = jp.Batch(sched, ctx, ctx, mask, np.asarray(8.0))
    sched[0], ctx[1] = NAN, -1.0
    assert np.array_equal(b.scheduled, np.ones(4)) and np.array_equal(b.computed, np.full(4, 100.0))
    assert sched.flags.writeable and not b.scheduled.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        b.scheduled[0] = NAN
    mine = np.array(dep.coefficients.values)
    c = jp.Coefficients(mine, dep.coefficients.names)
    mine[0] = NAN
    assert np.isfinite(c.values).all() and mine.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        c.values[0] = NAN
    name = c.names[0]
    assert c.replace(**{name: 2.0 * float(c[name])})[name] == 2.0 * float(c[name])
    refused(lambda: c.replace(**{name: NAN}), f"field '{name}'")


# ----------------------------------------------------------------------------- command lines (before any compile)

S = NAME
SIZE = ["size", "deepseek-v3", "--chip", "h200", "--gpus", "8", "--isl", "1024", "--osl", "128", "--quiet"]
QWEN = "testdata/hf/Qwen--Qwen3-8B"
FLAGS = ["accuracy", CSV, "--deployment", "gpt-oss-120b-h200-fp4-vllm-tp1", "--quiet"]


@pytest.mark.parametrize("argv, words", [
    # '' was the working folder: "is a directory, expected a batch file", naming no file
    (["price", S, "--batch", ""], ("field '--batch', value ''", "empty batch file name")),
    # the empty entry was read as the rate '' ("expected a number"); lists elsewhere say this
    (["serve", S, "--rate", "1,,2"], ("field '--rate', value '1,,2'", "has an empty entry")),
    # '' was falsy: the default widths were searched; an empty entry of a name list was dropped
    (SIZE + ["--tp", ""], ("field '--tp', value ''", "comma-separated list")),
    (SIZE + ["--dp", ""], ("field '--dp', value ''", "comma-separated list")),
    (SIZE + ["--weights", "fp8,,fp8"], ("field '--weights', value 'fp8,,fp8'", "has an empty entry")),
    (SIZE + ["--graph-modes", "FULL,"], ("field '--graph-modes', value 'FULL,'", "has an empty entry")),
    # '' was read as '.' or opened as a missing file: each refusal named nothing
    (["accuracy", "", "--quiet"], ("value ''", "an empty file name", "measurement CSV")),
    (["fit", "", "--quiet", "--free", "hbm_derate"], ("field 'csv', value ''", "an empty file name")),
    (FLAGS + ["--batch-rule", "simulate", "--settings", ""], ("field '--settings', value ''", "empty settings")),
    (["fit", CSV, "--quiet", "--free", "hbm_derate", "--batch-rule", "simulate", "--settings", ""],
     ("field '--settings', value ''", "empty settings")),
    (FLAGS + ["--coefficients", ""], ("--coefficients", "value ''", "an empty file name")),
    (["import-model", QWEN, "--out", "-", "--quant-config", ""], ("'quant_config', value ''", "an empty file name")),
], ids=["price-batch-empty", "serve-rate-empty-entry", "size-tp-empty", "size-dp-empty", "size-weights-entry",
        "size-graph-modes-entry", "accuracy-csv-empty", "fit-csv-empty", "accuracy-settings-empty",
        "fit-settings-empty", "accuracy-coefficients-empty", "import-quant-config-empty"])
def test_command_line_refusals(capsys, argv, words):
    assert_refused(capsys, argv, *words)


def test_library_paths_that_are_empty_or_not_paths():
    """load_batch(5) read a file named '5', load_batch('') the working folder; an empty
    coefficient set or quantization config path was '.' ('is a directory')."""
    refused(lambda: jp.load_batch(5), "field 'batch', value 5", "a str or a path")
    refused(lambda: jp.load_batch(""), "field 'batch', value ''", "empty batch file name")
    refused(lambda: jp.load_coefficient_set(" "), "value ' '", "an empty file name")
    refused(lambda: jp.import_hf_config(QWEN, quant_config=""), "'quant_config', value ''", "an empty file name")
    refused(lambda: jp.read_measurements(""), "value ''", "an empty file name")
    # 5 was opened as a file named '5' ('cannot read the measurement file'); '' was the working folder,
    # returned by scenario_path as the scenario file and searched by Registry as the registry
    for fn in (jp.read_measurements, jp.evaluate_accuracy, jp.observations_from_measurements):
        refused(lambda: fn(5), "field 'csv_path', value 5", "a str or a path")
    for bad in ("", " ", 5, None):
        refused(lambda: jp.scenario_path(bad), "field 'scenario'", f"value {bad!r}")
    refused(lambda: jp.Registry(""), "field 'registry_roots', value ''", "empty registry folder")
    assert jp.scenario_path(NAME).name == f"{NAME}.yaml"


# ----------------------------------------------------------------------------- price() under a caller's jit


def test_price_under_jit_then_eager_does_not_leak_a_tracer():
    """price() first called inside jax.jit cached the plan's values as tracers: every later
    call (eager, vmapped) died with UnexpectedTracerError; price_deployments' stack cache too.
    A small dense model: each compile is well under a second."""
    d = jp.load_deployment("llama-3.1-70b-instruct-h200-fp8-vllm-tp1")
    b = jp.Batch.decode(2, 10, pad_to=4)
    inside = jax.jit(lambda x: jp.price(d.plan, d.coefficients, x).no_overlap)(b)
    assert float(jp.price(d.plan, d.coefficients, b).no_overlap) == pytest.approx(float(inside), rel=1e-12)
    stack, many = jp.stack_plans([d.plan]), jp.Batch.stack([b])
    inside = jax.jit(lambda x: jp.price_deployments(stack, d.coefficients, x).no_overlap)(many)
    np.testing.assert_allclose(np.asarray(jp.price_deployments(stack, d.coefficients, many).no_overlap),
                               np.asarray(inside), rtol=1e-12)


def test_a_line_break_in_a_name_stays_on_the_one_line(capsys, tmp_path):
    """A file name holding a line break was printed raw: the refusal took two lines."""
    assert_refused(capsys, ["price", "a\nb.yaml", "--decode", "4", "--context", "12"], "a\\nb.yaml: no such scenario")
    assert_refused(capsys, ["serve", S, "--trace", f"{tmp_path}/x\ny.csv"], "x\\ny.csv: no such trace file")
    refused(lambda: jp.Trace((NAN,), (1,), (1,), source="a\r\nb"), "a\\r\\nb, field 'arrival_s[0]'")


def test_fit_steps_are_capped_and_a_scope_list_has_no_empty_entry(capsys):
    """--steps 1e30 was accepted (and ran until stopped); 'x@hardware,,model' dropped the empty
    entry silently; --gpu-memory-utilization -1 said '>= 0.0' where 0 is refused too."""
    from jaxprice import fit as F
    for steps in (10 ** 30, F.MAX_STEPS + 1, -1, 2.5):
        refused(lambda: F.fit_coefficients([], ["hbm_derate"], steps=steps), "field 'steps'",
                "an integer from 0 to 100,000")
    assert_refused(capsys, ["fit", CSV, "--free", "hbm_derate", "--steps", "100001", "--quiet"],
                   "field '--steps', value 100001: at most 100,000 descent steps")
    refused(lambda: F.Free.parse("hbm_derate@hardware,,model"), "field 'free'", "an empty entry in the scope list")
    assert F.Free.parse("hbm_derate@hardware, model").scope == ("hardware", "model")
    assert_refused(capsys, ["price", S, "--gpu-memory-utilization", "-1", "--decode", "1"],
                   "value -1.0: must be a fraction of the GPU's memory, 0 < F <= 1")
