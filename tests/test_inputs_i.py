"""Bug-bash of the public Python API (jaxprice.__all__) as a notebook user calls it: odd
arguments are refused in one line naming the argument, before anything is compiled, and an
argument is never silently read as its letters or ignored. One test per defect fixed."""

import math

import numpy as np
import pytest

import jaxprice as jp

NAME = "deepseek-v3-h200-fp8-sglang-tp8"
CSV = "testdata/measured/inferencex_vllm_excerpt.csv"


@pytest.fixture(scope="module")
def dep():
    return jp.load_deployment(NAME)


def refused(match, fn, *args, **kw):
    with pytest.raises(jp.JaxpriceError, match=match):
        fn(*args, **kw)


# ----------------------------------------------------------------------------- step_time


def test_step_time_refuses_a_stacked_batch(dep):
    stacked = jp.Batch.stack([jp.Batch.decode(1, 10)])
    refused("one batch", jp.step_time, dep.plan, dep.coefficients, stacked)
    refused("needs a Plan", jp.step_time, dep, dep.coefficients, jp.Batch.decode(1, 10))


# ----------------------------------------------------------------------------- load_deployment


def test_extra_coefficient_files_one_path_is_one_file_not_its_letters(dep, tmp_path):
    refused("x.yaml: file not found", jp.load_deployment, NAME, extra_coefficient_files="x.yaml")
    refused(r"extra_coefficient_files\[0\]", jp.load_deployment, NAME, extra_coefficient_files=[None])
    refused("extra_coefficient_files", jp.load_deployment, NAME, extra_coefficient_files=5)
    assert jp.load_deployment(NAME, extra_coefficient_files=None).coefficients.names == dep.coefficients.names


def test_load_deployment_registry_arguments():
    refused("field 'registry'", jp.load_deployment, NAME, registry="registry")
    refused("not both", jp.load_deployment, NAME, registry=jp.Registry(), registry_roots=["registry"])
    refused("registry_roots", jp.load_deployment, NAME, registry_roots=5)
    refused("registry_roots", jp.Registry, [None])


def test_resolve_and_loaders_refuse_what_is_not_a_scenario_or_a_path(dep):
    refused("needs a Scenario", jp.resolve, NAME)
    refused("extra_sets", jp.resolve, dep.scenario, extra_sets="x")
    refused("field 'registry'", jp.resolve, dep.scenario, registry="x")
    for loader in (jp.load_scenario, jp.load_model_graph, jp.load_coefficient_set):
        refused("needs a file path", loader, None)
    refused("needs a file path", jp.read_step_measurements, 5)      # open(5) read file descriptor 5


# ----------------------------------------------------------------------------- serving


def test_build_schedule_checks_its_run_arguments(dep):
    w, c = jp.Workload(16, 2, range_ratio=1.0), jp.ClosedLoop(1, num_prompts=1)
    refused("must be a Deployment", jp.build_schedule, NAME, w, c)
    refused("must be a Deployment", jp.build_schedule, dep.plan, w, c)
    refused("unknown estimate", jp.build_schedule, dep, w, c, estimate="foo")
    refused("coefficients", jp.build_schedule, dep, w, c, coefficients={"a": 1})
    refused("temperature", jp.build_schedule, dep, w, c, temperature=float("nan"))


def test_simulate_sweep_callback_and_engine_function(dep):
    w = jp.Workload(16, 2, range_ratio=1.0)
    refused("callback", jp.simulate_sweep, dep, w, [1], callback=3)
    refused("unknown scheduler", jp.simulate_sweep, dep, w, [1], engine=lambda c: {"scheduler": ["vllm"]})


@pytest.fixture(scope="module")
def sched(dep):
    return jp.build_schedule(dep, jp.Workload(16, 2, range_ratio=1.0), jp.ClosedLoop(1, num_prompts=1))


def test_schedule_metrics_checks_step_times(sched, dep):
    n = sched.steps
    ok = jp.schedule_metrics(sched, np.full(n, 1e-3))
    assert np.all(np.asarray(ok["tpot"]) > 0)
    refused(rf"shape \({n},\)", jp.schedule_metrics, sched, np.ones(n + 3))
    refused(rf"shape \({n},\)", jp.schedule_metrics, sched, np.ones((2, n)))
    refused(r"step_times\[0\]", jp.schedule_metrics, sched, np.full(n, np.nan))
    refused(r"step_times\[0\]", jp.schedule_metrics, sched, -np.ones(n))
    refused("needs a Schedule", jp.schedule_metrics, "x", np.ones(n))
    refused("coefficients", jp.schedule_metrics, sched, np.ones(n), coefficients={})
    refused("needs a Coefficients", sched.step_times, {})


# ----------------------------------------------------------------------------- size


class _Stop(Exception):
    pass


def _candidates(**kw):
    got = {}

    def stop(cands, ctx):
        got["cands"] = cands
        raise _Stop

    with pytest.raises(_Stop):
        jp.size("qwen3-30b-a3b", chip="h200", gpus=8, isl=1024, osl=128, evaluator="steady", on_candidates=stop,
                **kw)
    return got["cands"]


def test_size_whole_floats_are_ints_not_rejected_layouts():
    as_float = _candidates(tp=[2.0], max_num_seqs=[256.0], cudagraph_modes=["FULL"])
    as_int = _candidates(tp=[2], max_num_seqs=[256], cudagraph_modes=["FULL"])
    assert [c.status for c in as_float] == [c.status for c in as_int]
    assert all(c.status == "ok" for c in as_float)


@pytest.mark.parametrize("kw, match", [
    ({"tp": []}, "field 'tp'.*at least one"),
    ({"weights": []}, "field 'weights'.*at least one"),
    ({"cudagraph_modes": []}, "field 'cudagraph_modes'.*at least one"),
    ({"weights": [["fp8"]]}, "field 'weights'"),
    ({"chip": ["h200"]}, "field 'chip'"),
    ({"ttft_ms": "100"}, "field 'ttft_ms'.*string"),
    ({"gpus_per_node": "8"}, "field 'gpus_per_node'.*string"),
    ({"registry": "registry"}, "field 'registry'"),
    ({"callback": 5}, "field 'callback'"),
    ({"on_candidates": 5}, "field 'on_candidates'"),
    ({"workers": 0}, "field 'workers'"),
    ({"stacked": "no"}, "field 'stacked'"),
    ({"mesh": "x"}, "field 'mesh'"),
])
def test_size_refuses_odd_arguments_before_the_search(kw, match):
    base = dict(chip="h200", gpus=8, isl=1024, osl=128, evaluator="steady")
    base.update(kw)
    refused(match, jp.size, "qwen3-30b-a3b", **base)


# ----------------------------------------------------------------------------- fit


@pytest.fixture(scope="module")
def obs(dep):
    b = jp.Batch.stack([jp.Batch.decode(4, 1000, pad_to=8), jp.Batch.decode(8, 1000, pad_to=8)])
    return jp.Observations("a", dep, b, [0.01, 0.02], target="step")


def test_fit_free_string_is_one_pattern_not_its_letters(obs):
    res = jp.fit_coefficients([obs], "hbm_derate", prior=math.inf)        # nothing compiled at prior inf
    assert len(res.theta) == 1
    assert jp.Free("x", scope="model").scope == ("model",)
    refused("free.scope", jp.Free, "x", scope=None)


@pytest.mark.parametrize("kw, match", [
    ({"train": "obs"}, "wrap one"),
    ({"train": None}, "field 'train'"),
    ({"train": ["dep"]}, r"train\[0\]"),
    ({"free": None}, "field 'free'"),
    ({"free": [5]}, "field 'free'"),
    ({"holdout": -1}, "field 'holdout'"),
    ({"holdout": float("nan")}, "field 'holdout'"),
    ({"holdout": 0.5, "held_out": []}, "not both"),
    ({"seed": "x"}, "field 'seed'"),
    ({"min_delta": float("nan")}, "field 'min_delta'"),
    ({"identify": "no"}, "field 'identify'"),
    ({"per_deployment": "no"}, "field 'per_deployment'"),
    ({"compile_workers": 0}, "field 'compile_workers'"),
    ({"callback": 3}, "field 'callback'"),
    ({"learning_rate": "x"}, "field 'learning_rate'"),
    ({"steps": True}, "field 'steps'"),
    ({"huber_delta": math.inf}, "field 'huber_delta'"),
    ({"identify_tol": False}, "field 'identify_tol'"),
])
def test_fit_coefficients_refuses_odd_arguments(obs, dep, kw, match):
    args = {"train": [obs], "free": ["hbm_derate"], "prior": math.inf}
    args.update(kw)
    if args["train"] == "obs":
        args["train"] = obs
    if args["train"] == ["dep"]:
        args["train"] = [dep]
    train, free = args.pop("train"), args.pop("free")
    refused(match, jp.fit_coefficients, train, free, **args)


def test_observations_refuse_odd_fields(dep, obs):
    refused("measured", jp.Observations, "a", dep, obs.batches, ["x", "y"])
    refused("batches", jp.Observations, "a", dep, [jp.Batch.decode(4, 1000)], [0.01])
    refused("deployment", jp.Observations, "a", dep.plan, obs.batches, [0.01, 0.02])


@pytest.mark.parametrize("fn", [jp.observations_from_measurements, jp.evaluate_accuracy])
def test_measurement_entry_points_check_their_sources(fn):
    refused("scenario_dirs", fn, CSV, scenario_dirs=5)
    refused("value .nope.: no such folder", fn, CSV, scenario_dirs="nope")     # one folder, not letters
    refused("field 'registry'", fn, CSV, registry="x")
    refused("extra_coefficient_files", fn, CSV, extra_coefficient_files=5)
    refused("field 'deployments'", fn, CSV, deployments=5)


def test_evaluate_accuracy_checks_its_options():
    gpt = ["gpt-oss-120b-h200-fp4-vllm-tp1"]
    refused("field 'callback'", jp.evaluate_accuracy, CSV, callback=3, deployments=gpt)
    refused("field 'estimates'", jp.evaluate_accuracy, CSV, estimates=[], deployments=gpt)
    refused("field 'estimates'", jp.evaluate_accuracy, CSV, estimates=["foo"], deployments=gpt)
    refused("batch_rule 'simulate'", jp.evaluate_accuracy, CSV, estimates=["overlap"], deployments=gpt)
    refused("field 'per_deployment'", jp.evaluate_accuracy, CSV, per_deployment="x", deployments=gpt)
    refused("unknown estimate", jp.observations_from_measurements, CSV, estimate="foo", deployments=gpt)


# ----------------------------------------------------------------------------- the rest


def test_grid_search_callback_refused_before_compiling(dep):
    refused("field 'callback'", jp.grid_search, dep, itl=0.05, prefill_budget=1000, callback=3)


def test_import_hf_config_name_and_repo():
    path = "testdata/hf/Qwen--Qwen3-8B"
    refused("field 'name'", jp.import_hf_config, path, name=5)
    refused("field 'name'", jp.import_hf_config, path, name="")
    refused("field 'hf_repo'", jp.import_hf_config, path, hf_repo=5)


def test_structure_of_plot_and_mesh_arguments(dep):
    refused("give deployment.plan", jp.structure_of, dep)
    refused("field 'devices'", jp.batch_mesh, [])
    refused("field 'devices'", jp.batch_mesh, 5)

    class Result:       # a StepResult's fields, one batch priced
        resources, overlap, no_overlap, bottleneck = np.ones((1, 5)), np.ones(1), np.ones(1), np.zeros(1)
    refused("field 'x'", jp.plot_step_curve, [1, 2, 3], Result())


def test_pricing_switches_must_be_booleans(dep):
    b = jp.Batch.decode(1, 10)
    refused("field 'breakdown'", jp.price, dep.plan, dep.coefficients, b, breakdown="no")    # "no" read as True
    refused("field 'fold'", jp.price, dep.plan, dep.coefficients, b, fold="yes")
    refused("field 'fold'", jp.price_many, dep.plan, dep.coefficients, jp.Batch.stack([b]), fold=1)
    refused("field 'breakdown'", jp.step_time, dep.plan, dep.coefficients, b, breakdown="no")
    refused("field 'breakdown'", jp.price_deployments, jp.stack_plans([dep.plan]), dep.coefficients,
            jp.Batch.stack([b]), breakdown="no")


def test_workload_lengths_count():
    w = jp.Workload(10, 10)
    refused("field 'n'", w.lengths, -1)
    refused("field 'n'", w.lengths, 2.5)
    ins, outs = w.lengths(3)
    assert ins.shape == outs.shape == (3,)


def test_engine_kv_capacity_is_not_a_boolean(dep):
    refused("must be a number >= 0", jp.build_schedule, dep, jp.Workload(16, 2, range_ratio=1.0),
            jp.ClosedLoop(1, num_prompts=1), engine={"kv_capacity_tokens": True})
