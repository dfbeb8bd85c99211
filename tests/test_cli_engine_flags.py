"""The engine settings every pricing command takes beside SCENARIO (cli_price.add_scenario_argument):
--gpu-memory-utilization, --kv-cache-dtype, --cudagraph-mode override the scenario's (or, with
--chip, vLLM's defaults) and price exactly as a scenario file stating them; bad values get one
line naming the flag."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import yaml

import jaxprice as jp
from jaxprice import cli
from jaxprice._src import cli_price

S = "deepseek-v3-h200-fp8-sglang-tp8"


def _args(**kw):
    base = dict(chip=None, tp=None, dp=None, ep=None, weights=None, gpus_per_node=None, fabric=None,
                gpu_memory_utilization=None, kv_cache_dtype=None, cudagraph_mode=None)
    return argparse.Namespace(**{**base, **kw})


def _edited_scenario(tmp_path, name, **engine):
    """The bundled scenario ``name`` written out with its one pool's ``engine`` settings replaced."""
    docs = list(yaml.safe_load_all(jp.scenario_path(name).read_text()))
    pool = next(d for d in docs if d.get("kind") == "Deployment")["pools"][0]
    pool["engine"].update(engine)
    path = tmp_path / f"{name}-edited.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


@pytest.mark.parametrize("flags,engine", [
    (dict(gpu_memory_utilization="0.95"), dict(gpu_memory_utilization=0.95)),
    (dict(cudagraph_mode="full_decode_only"), dict(cudagraph_mode="FULL_DECODE_ONLY")),
    (dict(kv_cache_dtype="bfloat16"), dict(cache_dtype="bfloat16")),
])
def test_flags_resolve_as_the_scenario_stating_them(tmp_path, flags, engine):
    dep = cli_price.load_scenario_deployment(S, None, _args(**flags))
    ref = jp.load_deployment(_edited_scenario(tmp_path, S, **engine))
    base = jp.load_deployment(S)
    assert dep.plan == ref.plan and dep.plan.memory == ref.plan.memory
    assert dep.plan != base.plan or dep.plan.memory != base.plan.memory
    np.testing.assert_array_equal(np.asarray(dep.coefficients.values), np.asarray(ref.coefficients.values))
    assert dep.resolution == ref.resolution


def test_memory_share_moves_the_kv_capacity_only():
    """gpu_memory_utilization sizes the KV cache (resolve: the share of HBM less every fixed term)
    and nothing the step prices."""
    base = cli_price.load_scenario_deployment(S, None, _args())
    more = cli_price.load_scenario_deployment(S, None, _args(gpu_memory_utilization="0.95"))
    gained = more.plan.memory["kv_capacity_tokens"] - base.plan.memory["kv_capacity_tokens"]
    hbm = base.chip.memory_gib * 2 ** 30 * (0.95 - 0.9)       # the bundled scenario states 0.9
    assert base.scenario.engine.get("gpu_memory_utilization", 0.9) == 0.9
    assert gained == pytest.approx(hbm / base.plan.memory["kv_bytes_per_token"], rel=1e-9)
    batch = jp.Batch.decode(16, 2048, pad_to=16, decode_threshold=8)
    assert float(jp.price(base.plan, base.coefficients, batch).no_overlap) == \
        float(jp.price(more.plan, more.coefficients, batch).no_overlap)


def test_built_deployment_takes_the_flags(capsys):
    rc = cli.main(["price", "llama-3.1-8b-instruct", "--chip", "h100", "--decode", "8", "--kv-cache-dtype", "fp8",
                   "--cudagraph-mode", "NONE", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert "fp8 cache, NONE graphs" in out["deployment"]
    dep = cli_price.load_scenario_deployment("llama-3.1-8b-instruct", None,
                                             _args(chip="h100", kv_cache_dtype="fp8", cudagraph_mode="NONE"))
    assert dep.resolution["cache_dtype"] == "fp8" and dep.resolution["cudagraph_mode"] == "NONE"


@pytest.mark.parametrize("argv,want", [
    (("--gpu-memory-utilization", "1.5"), "field '--gpu-memory-utilization', value 1.5: must be a fraction"),
    (("--gpu-memory-utilization", "0"), "field '--gpu-memory-utilization', value 0.0: must be a fraction"),
    (("--gpu-memory-utilization", "nan"), "field '--gpu-memory-utilization'"),
    (("--gpu-memory-utilization", "x"), "field '--gpu-memory-utilization', value 'x'"),
    (("--kv-cache-dtype", "fp9"), "field '--kv-cache-dtype', value 'fp9': not a vLLM cache dtype"),
    (("--kv-cache-dtype", " "), "field '--kv-cache-dtype', value ' ': an empty value"),
    (("--cudagraph-mode", "bogus"), "field '--cudagraph-mode', value 'bogus': unknown cudagraph mode"),
])
def test_bad_values_are_one_line(capsys, argv, want):
    rc = cli.main(["price", S, "--decode", "8", *argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1 and want in lines[0], err


def test_coefficients_flag_applies_a_set_after_the_deployments_own(tmp_path):
    """--coefficients SET.yaml (a fitted set): applied after the scenario's sets, as
    load_deployment(extra_coefficient_files=) applies it, with --chip builds and engine overrides
    too (the set's scope decides where it reaches); a missing file is refused."""
    slow = tmp_path / "slow.yaml"
    slow.write_text("format: jaxprice-coefficients/1\nname: slow\nentries:\n"
                    "  - {name: hbm_derate, value: 0.4, units: dimensionless, scope: {hardware: [h200]}}\n")
    plain = cli_price.load_scenario_deployment(S, None, _args())
    fitted = cli_price.load_scenario_deployment(S, None, _args(coefficients=[str(slow)]))
    assert float(plain.coefficients["hbm_derate"]) == 0.8 and float(fitted.coefficients["hbm_derate"]) == 0.4
    over = cli_price.load_scenario_deployment(S, None, _args(coefficients=[str(slow)], gpu_memory_utilization="0.95"))
    assert float(over.coefficients["hbm_derate"]) == 0.4
    built = cli_price.load_scenario_deployment("llama-3.1-8b-instruct", None,
                                               _args(chip="h200", coefficients=[str(slow)]))
    assert float(built.coefficients["hbm_derate"]) == 0.4 and built.scenario.coefficient_sets[-1] == str(slow)
    other = cli_price.load_scenario_deployment("llama-3.1-8b-instruct", None,
                                               _args(chip="h100", coefficients=[str(slow)]))
    assert float(other.coefficients["hbm_derate"]) == 0.8          # scoped to h200: h100 keeps the registry's
    with pytest.raises(jp.JaxpriceError, match="nothere.yaml"):
        cli_price.load_scenario_deployment(S, None, _args(coefficients=[str(tmp_path / "nothere.yaml")]))
