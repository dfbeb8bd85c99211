"""Malformed inputs a fuzzing pass found accepted silently: the Hugging Face config import and
the scenario loader now refuse each in one line naming file, field and value. Load- and
import-level only (nothing is priced or jitted here)."""

from __future__ import annotations

import copy
import dataclasses
import glob
import json
import re
from pathlib import Path

import pytest
import yaml

from jaxprice import JaxpriceError, load_deployment, load_scenario
from jaxprice._src.formats import VLLM_BLOCK_SIZES
from jaxprice._src.hf import import_result
from jaxprice._src.resolve import scenario_path

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "testdata" / "hf"
_UNSET = object()


def refused(fn, file, field, value=_UNSET, reason=""):
    with pytest.raises(JaxpriceError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{file}, field '{field}'"), msg
    if value is not _UNSET:
        assert f"field '{field}', value {value!r}: " in msg, msg
    assert re.search(reason, msg), msg
    return msg


# ----------------------------------------------------------------------------- Hugging Face config

def _config(folder):
    return json.loads((HF / folder / "config.json").read_text())


def _write(tmp_path, cfg, name="m"):
    p = tmp_path / name
    p.mkdir(exist_ok=True)
    (p / "config.json").write_text(json.dumps(cfg))
    return p / "config.json"


DSV3 = "deepseek-ai--DeepSeek-V3"                 # 61 layers, first_k_dense_replace 3, 256 experts
QWEN_MOE = "Qwen--Qwen3-30B-A3B"                  # 48 layers, decoder_sparse_step 1, mlp_only_layers []
QWEN_HYBRID = "Qwen--Qwen3.5-35B-A3B"             # text_config, 40 layers, num_experts 256
M3 = "MiniMaxAI--MiniMax-M3"                      # moe_layer_freq: a 0/1 list per layer


def _text(cfg):
    return cfg.get("text_config") or cfg


@pytest.mark.parametrize("folder,edit,field,value,reason", [
    (DSV3, {"first_k_dense_replace": 1000}, "first_k_dense_replace", 1000, r"more than the model's 61 layers"),
    (DSV3, {"first_k_dense_replace": 62}, "first_k_dense_replace", 62, r"more than the model's 61 layers"),
    (DSV3, {"first_k_dense_replace": 61}, "first_k_dense_replace", 61,
     r"no layer of 61 would be MoE although n_routed_experts 256 names routed experts"),
    (DSV3, {"first_k_dense_replace": -1}, "first_k_dense_replace", -1, r"cannot be negative"),
    (DSV3, {"moe_layer_freq": 100}, "moe_layer_freq", 100, r"more than the model's 61 layers"),
    (DSV3, {"max_position_embeddings": 0}, "max_position_embeddings", 0, r"must be at least 1"),
    (DSV3, {"max_position_embeddings": -4096}, "max_position_embeddings", -4096, r"cannot be negative"),
    (DSV3, {"max_position_embeddings": "long"}, "max_position_embeddings", "long", r"expected an integer"),
    (DSV3, {"rope_scaling": "yes"}, "rope_scaling", "yes", r"expected a mapping"),
    (DSV3, {"rope_scaling": {"type": "yarn", "factor": 0}}, "rope_scaling.factor", 0, r"must be a positive number"),
    (DSV3, {"rope_scaling": {"factor": "40"}}, "rope_scaling.factor", "40", r"must be a positive number"),
    (QWEN_MOE, {"mlp_only_layers": [48]}, "mlp_only_layers", 48, r"expected layer indices from 0 to 47"),
    (QWEN_MOE, {"mlp_only_layers": ["0"]}, "mlp_only_layers", "0", r"expected layer indices"),
    (QWEN_MOE, {"mlp_only_layers": list(range(48))}, "mlp_only_layers", None,
     r"no layer of 48 would be MoE although num_experts 128"),
    (QWEN_MOE, {"decoder_sparse_step": 49}, "decoder_sparse_step", 49, r"more than the model's 48 layers"),
    (QWEN_HYBRID, {"mlp_only_layers": "all"}, "text_config.mlp_only_layers", "all", r"expected a list"),
    (QWEN_HYBRID, {"mlp_only_layers": list(range(40))}, "text_config.mlp_only_layers", None,
     r"no layer of 40 would be MoE"),
    (QWEN_HYBRID, {"rope_parameters": [1]}, "text_config.rope_parameters", [1], r"expected a mapping"),
    (M3, {"moe_layer_freq": ["yes"] * 60}, "moe_layer_freq", "yes", r"expected 0 \(dense\) or 1 \(MoE\)"),
])
def test_a_config_field_the_import_used_to_accept_is_refused(tmp_path, folder, edit, field, value, reason):
    cfg = _config(folder)
    _text(cfg).update(copy.deepcopy(edit))
    path = _write(tmp_path, cfg)
    refused(lambda: import_result(path), path, field, _UNSET if value is None else value, reason)


def test_an_all_dense_deepseek_config_imports_only_where_it_names_no_routed_experts(tmp_path):
    # first_k_dense_replace == num_hidden_layers is a dense model only if the config says so
    # (n_routed_experts null, as transformers' DeepseekV2 dense variants): then it imports dense
    cfg = dict(_config(DSV3), first_k_dense_replace=61, n_routed_experts=None)
    doc = import_result(_write(tmp_path, cfg)).doc
    assert list(doc["layer_kinds"]) == ["attn_dense"] and doc["stack"]["repeat"] * len(doc["stack"]["pattern"]) \
        + len(doc["stack"]["prologue"]) + len(doc["stack"]["epilogue"]) == 61
    assert not any(n["op"] == "GroupedGEMM" for n in doc["layer_kinds"]["attn_dense"])


def test_the_checked_fields_accept_what_transformers_accepts(tmp_path):
    cfg = _config(DSV3)
    for key in ("max_position_embeddings", "rope_scaling"):
        cfg.pop(key)
    stock = import_result(HF / DSV3).doc
    assert import_result(_write(tmp_path, cfg, "absent")).doc["layer_kinds"] == stock["layer_kinds"]
    cfg.update(rope_scaling=None, max_position_embeddings=None)
    assert import_result(_write(tmp_path, cfg, "null")).doc["layer_kinds"] == stock["layer_kinds"]
    q = _config(QWEN_MOE)
    q["mlp_only_layers"] = [0, 47]      # in range: those two layers dense
    d = import_result(_write(tmp_path, q, "q")).doc
    assert sorted(d["layer_kinds"]) == ["attn_dense", "attn_moe"]


def test_every_bundled_config_still_imports():
    folders = sorted(p.parent for p in HF.glob("*/config.json"))
    assert len(folders) >= 30
    for f in folders:
        import_result(f)


# ----------------------------------------------------------------------------- scenario YAML

BASE = "deepseek-v3-h200-fp8-sglang-tp8"          # cluster 1 node x 8; one pool tp8 of 1 node
POOL = "Deployment.pools[0]."


def _scenario(tmp_path, edit, name="s.yaml"):
    scen, dep = yaml.safe_load_all(scenario_path(BASE).read_text())
    edit(scen, dep)
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all([scen, dep], sort_keys=False))
    return path


def _engine(**kw):
    return lambda s, d: d["pools"][0]["engine"].update(kw)


@pytest.mark.parametrize("edit,field,value,reason", [
    (lambda s, d: d["pools"][0].update(nodes=5), POOL + "nodes", 5,
     r"the pool needs more nodes than the cluster has \(Scenario.cluster.nodes 1\)"),
    (lambda s, d: d["pools"].append(dict(copy.deepcopy(d["pools"][0]), nodes=3)), "Deployment.pools[1].nodes", 3,
     r"more nodes than the cluster has"),
    (lambda s, d: d["pools"][0]["parallel"].update(tp=16), POOL + "parallel", 16,
     r"tp x dp = 16 ranks do not fit the pool's 1 node x 8 GPUs"),
    (lambda s, d: s["cluster"].update(gpus_per_node=4), POOL + "parallel", 8, r"do not fit the pool's 1 node x 4"),
    (lambda s, d: s["cluster"].update(gpus_per_node=0), "Scenario.cluster.gpus_per_node", 0,
     r"must be >= 1 \(leave the key out to take the chip's value\)"),
    (lambda s, d: s["cluster"].update(gpus_per_rack=0), "Scenario.cluster.gpus_per_rack", 0, r"must be >= 1"),
    (_engine(block_size=7), POOL + "engine.block_size", 7,
     r"vLLM would not start: the block size must be one of 1, 8, 16, 32, 64, 128, 256"),
    (_engine(block_size=48), POOL + "engine.block_size", 48, r"must be one of"),
    (_engine(block_size=512), POOL + "engine.block_size", 512, r"must be one of"),
])
def test_a_scenario_the_loader_used_to_accept_is_refused(tmp_path, edit, field, value, reason):
    path = _scenario(tmp_path, edit)
    refused(lambda: load_scenario(path), path, field, value, reason)


def test_a_second_pool_is_never_ignored(tmp_path):
    def two(s, d):
        second = copy.deepcopy(d["pools"][0])
        second["role"], second["parallel"]["tp"] = "decode", 4
        d["pools"][0]["role"] = "prefill"
        d["pools"].append(second)
    path = _scenario(tmp_path, two)
    reason = r"COVERAGE LIMIT \[one-pool\]: the deployment has 2 pools \(prefill, decode\).*one scenario per pool"
    refused(lambda: load_scenario(path), path, "Deployment.pools", 2, reason)
    refused(lambda: load_deployment(path), path, "Deployment.pools", 2, reason)
    assert load_scenario(path, 0).parallel["tp"] == 8
    assert load_scenario(path, 1).parallel["tp"] == 4 and load_scenario(path, 1).pool_field == "Deployment.pools[1]"


def test_what_the_checks_leave_alone(tmp_path):
    for size in VLLM_BLOCK_SIZES:
        assert load_scenario(_scenario(tmp_path, _engine(block_size=size))).engine["block_size"] == size
    # an absent gpus_per_node is unset (the chip's value at resolve time), not a refusal
    s = load_scenario(_scenario(tmp_path, lambda s, d: s["cluster"].pop("gpus_per_node")))
    assert s.gpus_per_node == 0
    # a pool on fewer nodes than the cluster, and tp16 over a 2-node pool, fit
    def two_nodes(s, d):
        s["cluster"].update(nodes=2, fabric="ib-400g")
        d["pools"][0]["nodes"] = 2
        d["pools"][0]["parallel"]["tp"] = 16
    assert load_scenario(_scenario(tmp_path, two_nodes)).pool_nodes == 2
    s = load_scenario(_scenario(tmp_path, lambda s, d: s["cluster"].update(nodes=4)))
    assert (s.nodes, s.pool_nodes) == (4, 1)
    # the loader does not know the model's length: resolve checks it where the graph states one (below)
    assert load_scenario(_scenario(tmp_path, _engine(max_model_len=10_000_000))).engine["max_model_len"] == 10_000_000


def test_every_bundled_scenario_still_loads():
    files = sorted(glob.glob(str(ROOT / "testdata" / "aisimulate" / "*.yaml")))
    assert len(files) == 88
    for f in files:
        load_scenario(f)


# ----------------------------------------------------------------------------- the model's own max_model_len

@pytest.mark.parametrize("folder,expected", [
    (DSV3, 4096 * 40),                                    # yarn: original 4096 x factor 40
    ("meta-llama--Llama-3.1-8B-Instruct", 131072),        # llama3 rope: not scaled
    ("Qwen--Qwen3-8B", 40960),                            # no rope_scaling
])
def test_derived_max_model_len(folder, expected):
    """As vLLM derives it (vllm/config/model.py _get_and_verify_max_len)."""
    assert import_result(HF / folder).doc["max_model_len"] == expected


def test_derived_max_model_len_linear_factor_and_none(tmp_path):
    cfg = _config("Qwen--Qwen3-8B")
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    assert import_result(_write(tmp_path, cfg)).doc["max_model_len"] == 2 * 40960
    del cfg["max_position_embeddings"]
    cfg["rope_scaling"] = None
    assert "max_model_len" not in import_result(_write(tmp_path, cfg, "n")).doc


def test_a_max_model_len_past_the_models_is_refused_and_defaults_capped():
    from jaxprice import Registry, resolve
    from jaxprice._src import size as S
    graph, reg, _ = S.load_model("qwen3-30b-a3b")
    assert graph.max_model_len == 40960                   # the bundled import carries it
    lay = S.Layout(tp=1, dp=1, ep=False, weights="bf16", max_num_seqs=8, max_num_batched_tokens=8192,
                   cudagraph_mode="FULL_AND_PIECEWISE")
    scen = S.build_scenario("qwen3-30b-a3b", "h200", lay, isl=40000, osl=900, graph=graph)
    assert scen.engine["max_model_len"] == 40960          # 40000 + 900 + 256 capped at the model's
    assert S.max_model_len(1024, 1024, 40960) == 2304 and S.max_model_len(1024, 1024) == 2304
    too_long = dataclasses.replace(scen, engine={**scen.engine, "max_model_len": 40961})
    with pytest.raises(JaxpriceError, match=r"Deployment.pools\[0\].engine.max_model_len.*40961.*vLLM would not start.*40960"):
        resolve(too_long, Registry())
    with pytest.raises(JaxpriceError, match=r"isl \+ osl = 41000 tokens exceeds the 40960"):
        S.size("qwen3-30b-a3b", chip="h200", gpus=1, isl=40000, osl=1000)


def test_bundled_graphs_carry_the_length_their_config_derives():
    """registry/build.py writes every bundled graph's max_model_len from its repo's bundled
    config.json (by hand: llama-3.1 131072 (llama3 rope: not scaled), deepseek-v3 yarn 40 x 4096,
    mixtral 32768 with no rope scaling), and a context past it is refused at size and resolve alike."""
    from jaxprice._src import size as S
    expected = {"llama-3.1-8b-instruct": 131072, "deepseek-v3": 40 * 4096, "mixtral-8x7b-v0.1": 32768,
                "kimi-k2.5": 64 * 4096, "gpt-oss-120b": 32 * 4096, "minimax-m2.5": 196608}
    for name, length in expected.items():
        assert S.load_model(name)[0].max_model_len == length, name
    for f in sorted((ROOT / "registry" / "models").glob("*.yaml")):
        graph = S.load_model(f.stem)[0]
        assert graph.max_model_len is not None, f.stem
        repo = yaml.safe_load(f.read_text())["hf_repo"]
        assert import_result(HF / repo.replace("/", "--")).doc["max_model_len"] == graph.max_model_len, f.stem
    with pytest.raises(JaxpriceError, match=r"isl \+ osl = 32769 tokens exceeds the 32768 tokens mixtral"):
        S.size("mixtral-8x7b-v0.1", chip="h200", gpus=2, isl=32000, osl=769)


def test_serve_caps_its_default_and_refuses_an_override_past_the_models():
    from jaxprice import Registry, resolve
    from jaxprice._src import serve
    from jaxprice._src import size as S
    graph, _, _ = S.load_model("qwen3-30b-a3b")
    lay = S.Layout(tp=1, dp=1, ep=False, weights="bf16", max_num_seqs=8, max_num_batched_tokens=8192,
                   cudagraph_mode="FULL_AND_PIECEWISE")
    dep = resolve(S.build_scenario("qwen3-30b-a3b", "h200", lay, isl=1024, osl=1024, graph=graph), Registry())
    unset = {k: v for k, v in dep.scenario.engine.items() if k != "max_model_len"}   # serve's default applies
    dep = dataclasses.replace(dep, scenario=dataclasses.replace(dep.scenario, engine=unset))
    settings, _ = serve.engine_settings(dep, max_len=40900)
    assert settings["max_model_len"] == 40960                 # 40900 + 256 capped at the model's
    with pytest.raises(JaxpriceError, match=r"field 'max_model_len', value 50000: more than the 40960"):
        serve.engine_settings(dep, {"max_model_len": 50000})


def test_the_library_client_refuses_runs_past_the_request_cap():
    """The CLI's cap on one simulated run binds simulate() too: the clients refuse at validate(),
    before the scheduler allocates (a 1e9-prompt closed loop was killed for memory)."""
    from jaxprice import ClosedLoop, OpenLoop, Trace
    from jaxprice._src.client import MAX_RUN_REQUESTS
    ClosedLoop(MAX_RUN_REQUESTS // 10).validate()
    ClosedLoop(4, num_prompts=MAX_RUN_REQUESTS).validate()
    cases = [(lambda: ClosedLoop(4, num_prompts=MAX_RUN_REQUESTS + 1).validate(), "num_prompts", MAX_RUN_REQUESTS + 1),
             (lambda: ClosedLoop(MAX_RUN_REQUESTS // 10 + 1).validate(), "concurrency", MAX_RUN_REQUESTS // 10 + 1),
             (lambda: OpenLoop(5.0, MAX_RUN_REQUESTS + 1).validate(), "num_prompts", MAX_RUN_REQUESTS + 1),
             (lambda: Trace([0.0] * (MAX_RUN_REQUESTS + 1), [8] * (MAX_RUN_REQUESTS + 1),
                            [8] * (MAX_RUN_REQUESTS + 1)), "Trace", MAX_RUN_REQUESTS + 1)]
    for make, field, value in cases:
        with pytest.raises(JaxpriceError,
                           match=rf"field '{field}', value {value}: .*cap of {MAX_RUN_REQUESTS} requests"):
            make()


def test_a_bundled_config_resolves_by_its_repository_name():
    """A model with no graph but a bundled config.json (testdata/hf/<org>--<name>) resolves by its
    name or repository id, case-insensitively, imported from that config: DeepSeek-R1 (V3's
    architecture, fine-tuned) prices as a deployment; a bundled graph still wins its own name."""
    from jaxprice import Registry, resolve
    from jaxprice._src import size as S
    reg = Registry()
    r1 = reg.model("deepseek-r1")
    assert r1.name == "deepseek-r1" and r1.path.endswith("deepseek-ai--DeepSeek-R1/config.json")
    for alias in ("deepseek-ai/DeepSeek-R1", "DeepSeek-R1"):
        assert reg.model(alias).path == r1.path
    v3 = import_result(HF / "deepseek-ai--DeepSeek-V3").doc
    assert import_result(HF / "deepseek-ai--DeepSeek-R1").doc["layer_kinds"] == v3["layer_kinds"]
    assert reg.model("deepseek-v3").path.endswith("registry/models/deepseek-v3.yaml")
    assert reg.model("gpt-oss-20b").hidden_size == 2880
    lay = S.Layout(tp=8, dp=1, ep=False, weights="fp8", max_num_seqs=64, max_num_batched_tokens=8192,
                   cudagraph_mode="PIECEWISE")
    dep = resolve(S.build_scenario("deepseek-r1", "h200", lay, isl=1024, osl=1024, graph=r1), reg)
    assert dep.plan.memory["kv_capacity_tokens"] > 0
    assert S.load_model("deepseek-r1")[2] == f"registry model deepseek-r1, imported from {r1.path}"
    with pytest.raises(JaxpriceError, match=r"unknown model .*no bundled config.json of that name.*"
                                             r"near matches: llama-3.1-70b-instruct"):
        reg.model("llama-3.3-70b-instruct")
