"""Bug-bash of the public Python API at the library level (helper k): malformed arguments a
notebook user plausibly passes are refused in one line naming the field and the value, before
anything is jitted; never a bare TypeError or a silent NaN. Plus two reporting defects of
`jaxprice serve` for hybrid (recurrent-state) models. Each test failed before its fix. One
scheduler compile (the hybrid serve run); everything else is refused before jit."""

import dataclasses
import types

import jax
import numpy as np
import pytest
from clirefusal import assert_refused, refused

import jaxprice as jp
from jaxprice._src import cli_serve, serve
from jaxprice._src.step import check_pricing_args

NAME = "deepseek-v3-h200-fp8-sglang-tp8"
NANO = "nvidia-nemotron-3-nano-30b-a3b-bf16"
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def dep():
    return jp.load_deployment(NAME)


def _hand(sched, comp=None, prompt=None, mask=None, thr=1.0):
    n = len(sched)
    return jp.Batch(np.asarray(sched, float), np.asarray(comp if comp is not None else [0] * n, float),
                    np.asarray(prompt if prompt is not None else [10] * n, float),
                    np.asarray(mask if mask is not None else [True] * n), np.asarray(thr))


# ----------------------------------------------------------------------------- Batch by hand


@pytest.mark.parametrize("make, field, value", [
    (lambda: _hand([NAN, 1]), "scheduled[0]", "nan"),                     # priced NaN
    (lambda: _hand([1, -5]), "scheduled[1]", "-5.0"),                      # priced 0.43 ms
    (lambda: _hand([1, 1], comp=[0, INF]), "computed[1]", "inf"),          # priced NaN
    (lambda: _hand([1, 1], prompt=[-1, 1]), "prompt_len[0]", "-1.0"),
    (lambda: jp.Batch(np.array([[1, -2]]), np.zeros((1, 2)), np.ones((1, 2)), np.ones((1, 2), bool),
                      np.ones(1)), "scheduled[0, 1]", "-2"),                # stacked, int counts
])
def test_a_hand_built_batch_with_a_bad_token_count_is_refused(make, field, value):
    refused(make, f"field '{field}'", f"value {value}", "token count")


def test_a_hand_built_batch_of_strings_or_a_float_mask_is_refused():
    """Both died inside jit with a TypeError (string counts; and_ on a float mask)."""
    refused(lambda: _hand([1, 1], mask=[0.5, 1.0]), "field 'mask'", "booleans")
    refused(lambda: jp.Batch(np.array(["1"]), np.zeros(1), np.ones(1), np.ones(1, bool), np.asarray(1.0)),
            "field 'scheduled'", "numbers")
    ok = _hand([1, 2])                                   # a good one still builds, and replace checks too
    refused(lambda: dataclasses.replace(ok, computed=np.array([0.0, NAN])), "computed[1]")
    # the threshold's value stays the kernel's to read (inf: no row is a prefill)
    assert float(_hand([1], thr=INF).decode_threshold) == INF


def test_a_batch_changed_by_tree_map_is_refused_by_its_dtypes_at_price(dep):
    """jax.tree_util.tree_map rebuilds a Batch without the constructor's checks (tracers pass
    through it); price() still refuses a float mask or text counts by their static dtypes."""
    b = jp.Batch.decode(2, 10, pad_to=4)
    floats = jax.tree_util.tree_map(lambda x: np.asarray(x, float), b)
    refused(lambda: jp.price(dep.plan, dep.coefficients, floats), "field 'batch.mask'", "booleans", "float64")
    text = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(b), [
        np.array(["1", "2"]), b.computed[:2], b.prompt_len[:2], b.mask[:2], b.decode_threshold])
    refused(lambda: jp.price(dep.plan, dep.coefficients, text), "field 'batch.scheduled'", "numbers")
    stacked = jax.tree_util.tree_map(lambda x: np.asarray(x, float), jp.Batch.stack([b, b]))
    refused(lambda: jp.price_many(dep.plan, dep.coefficients, stacked), "field 'batches.mask'")


# ----------------------------------------------------------------------------- Coefficients by hand


def test_hand_built_coefficients_are_refused_when_malformed(dep):
    C, b = dep.coefficients, jp.Batch.decode(2, 10, pad_to=4)
    vals = np.asarray(C.values)
    # one value short: the kernel read past the end (JAX clamps) and priced 7.1 ms, not 10.4
    refused(lambda: jp.price(dep.plan, jp.Coefficients(vals[:-1], C.names), b), "field 'coefs.values'",
            "(19,)", "20 names")
    bad = vals.copy()
    bad[3] = NAN                                         # priced NaN
    refused(lambda: jp.price(dep.plan, jp.Coefficients(bad, C.names), b), f"coefs[{C.names[3]}]", "value nan")
    refused(lambda: jp.price_many(dep.plan, jp.Coefficients(-vals, C.names), jp.Batch.stack([b])),
            f"coefs[{C.names[0]}]", "finite number >= 0")   # a negative time, -6.2 ms
    good = jp.Coefficients(vals * 2, C.names)
    check_pricing_args(dep.plan, good, b, rank=1)        # passes, and is remembered
    assert good.__dict__["_checked_for"][dep.plan.digest] is good.values
    extra = jp.Coefficients(np.append(vals, NAN), C.names + ("not_read",))   # a name the plan does not read
    check_pricing_args(dep.plan, extra, b, rank=1)       # may hold NaN (a union-stacked row does)


# ----------------------------------------------------------------------------- serving clients


def test_fewer_prompts_than_clients_is_refused(dep):
    """ClosedLoop(4, num_prompts=2): the benchmark sends 2 requests under a Semaphore(4), so 2
    clients ran, labelled C=4 (the CLI refuses --num-prompts below --concurrency alike)."""
    w = jp.Workload(16, 2, 1.0)
    words = ("field 'num_prompts'", "value 2", "fewer than the 4 clients", "ClosedLoop(2)")
    refused(lambda: jp.simulate(dep, w, jp.ClosedLoop(4, num_prompts=2)), *words)
    refused(lambda: jp.build_schedule(dep, w, jp.ClosedLoop(4, num_prompts=2)), *words)
    refused(lambda: jp.simulate_sweep(dep, w, [1, 4], num_prompts=2), *words)
    from jaxprice._src.client import check_clients_send
    check_clients_send(jp.ClosedLoop(4, num_prompts=4))     # as many prompts as clients: fine
    check_clients_send(jp.ClosedLoop(4))


def test_a_numpy_integer_kv_capacity_is_a_number(dep):
    """engine={'kv_capacity_tokens': np.int64(...)} was refused as 'must be a number >= 0'."""
    out, _ = serve.engine_settings(dep, {"kv_capacity_tokens": np.int64(100000)})
    assert out["kv_blocks"] == 100000 // out["block_size"] - 1
    refused(lambda: serve.engine_settings(dep, {"kv_capacity_tokens": np.float64(NAN)}), "nan", ">= 0")


def test_schedule_metrics_refuses_none_and_booleans():
    """None was refused as 'value ()' (read as NaN); booleans were read as 1 s per step."""
    sched = object.__new__(serve.Schedule)
    refused(lambda: jp.schedule_metrics(sched, None), "field 'step_times'", "value None", "numbers")
    refused(lambda: jp.schedule_metrics(sched, np.ones(3, bool)), "field 'step_times'", "numbers")
    refused(lambda: jp.schedule_metrics(sched, [True, False]), "field 'step_times'")
    refused(lambda: jp.schedule_metrics(sched, [1.0, [2.0, 3.0]]), "field 'step_times'")    # ragged: one line


# ----------------------------------------------------------------------------- fit


def test_split_by_deployment_refuses_a_string_and_bad_options():
    refused(lambda: jp.split_by_deployment("ab"), "field 'names'", "value 'ab'", "letters")   # was (['b'], ['a'])
    refused(lambda: jp.split_by_deployment(["a", 1]), "field 'names[1]'")                       # TypeError in sorted
    refused(lambda: jp.split_by_deployment(["a", "b"], seed=-1), "field 'seed'", "value -1")   # numpy ValueError
    refused(lambda: jp.split_by_deployment(["a", "b"], stratify=[1]), "field 'stratify'")     # 'list' not callable
    refused(lambda: jp.split_by_deployment(["a", "b"], True), "field 'test_fraction'", "value True")
    refused(lambda: jp.split_by_deployment(["a", "b"], stratify={"a": "m"}), "field 'stratify'", "value 'b'")
    assert jp.split_by_deployment(["a", "b", "c", "d"], 0.25, seed=0) == jp.split_by_deployment(
        ("a", "b", "c", "d"), 0.25, seed=0)


def _law(p, x):
    return p["a"] * x


X = np.array([1.0, 2.0])


@pytest.mark.parametrize("call, words", [
    (lambda: jp.fit_law(None, {"a": 1.0}, X, X), ("field 'law'", "value None", "function")),   # TypeError
    (lambda: jp.fit_law(_law, [1.0], X, X), ("field 'init'", "dict")),                           # TypeError
    (lambda: jp.fit_law(_law, {"a": None}, X, X), ("field 'init.a'", "value None")),             # TypeError
    (lambda: jp.fit_law(_law, {"a": "1"}, X, X), ("field 'init.a'", "value '1'")),               # read as 1.0
    (lambda: jp.fit_law(_law, {"a": 1.0}, X, ["a", "b"]), ("field 'measured'", "str")),          # ValueError
    (lambda: jp.fit_law(_law, {"a": 1.0}, X, X[:1]), ("field 'law'", "shape (2,) for 1")),       # broadcast silently
    (lambda: jp.fit_law(lambda p, x: p["b"] * x, {"a": 1.0}, X, X), ("field 'law'", "KeyError")),
    (lambda: jp.fit_law(_law, {"a": 1.0}, X, X, bounds={"a": (1,)}), ("field 'bounds.a'", "two numbers")),
    (lambda: jp.fit_law(_law, {"a": 1.0}, X, X, bounds={"b": (0.1, 10)}), ("field 'bounds.b'", "bound nothing")),
    (lambda: jp.fit_law(_law, {"a": 1.0}, X, X, loss="huber", huber_delta=-1), ("field 'huber_delta'", "-1")),
    (lambda: jp.fit_law(_law, {"a": 1.0}, X, X, callback=5), ("field 'callback'",)),           # after the fit
])
def test_fit_law_refuses_malformed_arguments_before_tracing(call, words):
    refused(call, *words)


def test_write_coefficient_set_refuses_what_is_not_a_fit(tmp_path):
    refused(lambda: jp.write_coefficient_set(None, tmp_path / "c.yaml"), "field 'result'", "value None")   # was
    # AttributeError: 'NoneType' object has no attribute 'settings'
    assert not (tmp_path / "c.yaml").exists()


def test_simulate_sweep_refuses_an_engine_function_of_another_arity(dep):
    """engine=lambda: {...} raised TypeError from inside the sweep's call engine(C)."""
    refused(lambda: jp.simulate_sweep(dep, jp.Workload(16, 2, 1.0), [1], engine=lambda: {}), "field 'engine'",
            "of one argument")


def test_observations_of_one_unstacked_batch_name_the_shape(dep):
    refused(lambda: jp.Observations("x", dep, jp.Batch.decode(1, 10, pad_to=4), np.array([0.01])),
            "field 'x.batches'", "shape (4,)")          # was "1 measurements for -1 stacked batches"


# ----------------------------------------------------------------------------- registry, sweeps, figures


def test_registry_lookups_refuse_what_is_not_a_name():
    r = jp.Registry()
    refused(lambda: r.model(None), "field 'model'", "value None")             # TypeError joining a path
    refused(lambda: r.model(5), "field 'model'", "value 5")
    refused(lambda: r.coefficient_set(None), "field 'coefficient set'", "value None")
    refused(lambda: r.chip(None), "field 'chip'", "value None")              # refused without its value


def test_boolean_switches_refuse_text():
    refused(lambda: jp.random_batches(np.random.default_rng(0), 2, 4, empty="no"), "field 'empty'", "value 'no'")
    C = jp.load_deployment(NAME).coefficients
    refused(lambda: jp.stack_deployment_coefficients([C], union="no"), "field 'union'", "value 'no'")


def test_plot_step_curve_refuses_bad_positions_and_results(tmp_path):
    r = jp.StepResult(np.ones((2, 5)), np.ones(2), np.ones(2), np.zeros(2, int), np.ones((2, 5)))
    png = tmp_path / "x.png"
    refused(lambda: jp.plot_step_curve([NAN, 2], r, path=png), "field 'x[0]'", "value nan")        # ValueError
    refused(lambda: jp.plot_step_curve(["a", "b"], r, path=png), "field 'x'", "xticklabels")      # ValueError
    refused(lambda: jp.plot_step_curve([1, 2], None, path=png), "field 'result'", "NoneType")     # AttributeError
    refused(lambda: jp.plot_step_curve([1, 2], r, path=png, dpi=0), "field 'dpi'", "value 0")     # named 'path'
    assert not png.exists()


# ----------------------------------------------------------------------------- serve, hybrid models


def test_serve_refuses_a_small_kv_cache_of_a_hybrid_model_naming_the_given_and_the_needed(capsys):
    """Nemotron 3 Nano (47.6 MiB of Mamba2 state per request) with --kv-capacity-tokens 1000 was
    refused as 'value 0.0' (the capacity after the recurrent state was taken out). Now the value
    given, the blocks left once the state is out, and the least capacity that serves the run:
    one token less is refused naming the same least, the least itself is prepared."""
    import re
    base = ["serve", NANO, "--chip", "h100", "--concurrency", "2", "--isl", "64", "--osl", "8"]
    line = assert_refused(capsys, base + ["--kv-capacity-tokens", "1000"], "field 'kv_capacity_tokens'",
                          "value 1000.0", "the KV cache of 1000 tokens per rank (engine= override)",
                          "once the recurrent state of 1 request (47.6 MiB per rank each) is taken out",
                          "for 71 tokens")
    assert "value 0.0" not in line
    least = int(re.search(r"it needs at least (\d+) tokens per rank", line).group(1))
    assert_refused(capsys, base + ["--kv-capacity-tokens", str(least - 1)], f"at least {least} tokens")
    d = cli_serve.load_scenario_deployment(NANO, None, types.SimpleNamespace(
        chip="h100", tp=None, dp=None, ep=None, weights=None, gpus_per_node=None, fabric=None))
    serve._prepare(d, [(jp.Workload(64, 8), jp.ClosedLoop(2))], {"kv_capacity_tokens": float(least)}, None)
    dense = ["serve", NAME, "--concurrency", "2", "--isl", "64", "--osl", "8", "--kv-capacity-tokens", "40"]
    # DeepSeek-V3's MLA on H200 with an FP8 cache runs FLASHMLA's 64-token blocks (resolve.vllm_mla_block)
    assert_refused(capsys, dense, "value 40.0", "holds 0 blocks of 64", "at least 192 tokens")


def test_serve_says_max_num_seqs_was_lowered_for_the_recurrent_state(monkeypatch):
    """The engine line printed the max_num_seqs a Nemotron 3 Nano run on one H100 lowered for its
    recurrent state (154 at isl 64, osl 8) as if it were the setting (1024); now it says it was
    lowered from the setting and why, and the JSON source names the setting too. The report is
    built from the run's real settings (engine_settings, as the run takes them), its table left
    out: no compile."""
    d = cli_serve.load_scenario_deployment(NANO, None, types.SimpleNamespace(
        chip="h100", tp=None, dp=None, ep=None, weights=None, gpus_per_node=None, fabric=None))
    setting = serve.engine_settings(d, {})[0]["max_num_seqs"]
    _, assumptions = serve.engine_settings(d, {}, max_len=72, ref_len=68.0)
    n = assumptions["max_num_seqs"][0]
    assert setting == 1024 and n < setting
    assert f"(vLLM default for this part) 1024, lowered to the {n} requests" in assumptions["max_num_seqs"][1]
    monkeypatch.setattr(cli_serve, "format_table", lambda *a: "")
    run = types.SimpleNamespace(assumptions=assumptions)
    opts = {"engine": {}, "acceptance": None, "isl": 64, "osl": 8, "rr": 0.8, "seed": 0}
    text = cli_serve._text_report(d, types.SimpleNamespace(estimate="no_overlap", trace=None), opts, "C", [2], [run])
    engine = next(ln for ln in text.splitlines() if ln.startswith("engine:"))
    assert (f"max_num_seqs {n} (lowered from the setting 1024: the KV pool keeps the recurrent state, 47.6 MiB per "
            "request and rank, of only the requests that fit beside their KV at the run's lengths)") in engine
    _, unlowered = serve.engine_settings(d, {"max_num_seqs": 4}, max_len=72, ref_len=68.0)
    text = cli_serve._text_report(d, types.SimpleNamespace(estimate="no_overlap", trace=None),
                                  dict(opts, engine={"max_num_seqs": 4}), "C", [2],
                                  [types.SimpleNamespace(assumptions=unlowered)])
    assert "max_num_seqs 4, " in text and "lowered" not in text
