"""The declared schemas (jaxprice/_src/schema.py): every malformed input refused in one line.

Issue 13's instances first (a section of the wrong type, a number given as text, an impossible
value accepted), then each format's ranges, the file-level refusals (YAML syntax, empty files,
a directory, binary garbage, duplicate keys), the schema primitives other readers call, and
a check that every bundled and shared file passes its schema. Nothing here compiles a kernel
except the few CLI runs that share one (the default scenario, padding 8).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import yaml

from jaxprice import JaxpriceError, cli, load_deployment
from jaxprice._src import schema
from jaxprice._src.batchfile import read_batch_file
from jaxprice._src.formats import (default_registry_root, load_chips, load_coefficient_set, load_model_graph,
                                   load_public_chip, load_scenario, read_yaml_documents)
from jaxprice._src.plan import INT_TOKEN_LIMIT
from jaxprice._src.resolve import bundled_scenarios, scenario_path

BUNDLED = default_registry_root()
SHARED = Path("/work/shared/reference")
DSV3 = "deepseek-v3-h200-fp8-sglang-tp8"
ENGINE = "Deployment.pools[0].engine."


def docs(name=DSV3):
    return list(yaml.safe_load_all(scenario_path(name).read_text()))


def write(tmp_path, edit=None, name=DSV3, filename="s.yaml"):
    scen, dep = docs(name)
    if edit is not None:
        edit(scen, dep)
    path = tmp_path / filename
    path.write_text(yaml.safe_dump_all([scen, dep], sort_keys=False))
    return path


def refusal(call) -> JaxpriceError:
    with pytest.raises(JaxpriceError) as info:
        call()
    err = info.value
    assert "\n" not in str(err), str(err)
    return err


def expect(call, *, file, field, reason, value=None):
    err = refusal(call)
    assert err.file == str(file)
    assert err.field == field, str(err)
    assert reason in err.reason, str(err)
    if value is not None:
        assert f"value {value!r}" in str(err) or (isinstance(value, float) and "value nan" in str(err)), str(err)
    return err


def cli_line(capsys, *argv):
    rc = cli.main(list(argv))
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc == 2 and captured.out == "" and len(lines) == 1, (rc, captured.err)
    assert lines[0].startswith("jaxprice price: error: ")
    return lines[0]


# ----------------------------------------------------------------------------- issue 13's instances


@pytest.mark.parametrize("where,bad,field,reason", [
    ("pools", [], "Deployment.pools", "expected a non-empty list of pools"),
    ("pools", "colocated", "Deployment.pools", "expected a non-empty list of pools"),
    ("pools", True, "Deployment.pools", "expected a non-empty list of pools"),
    ("pools", {"role": "colocated"}, "Deployment.pools", "expected a non-empty list of pools"),
    ("pool", [1, 2], "Deployment.pools[0]", "expected a mapping"),
    ("pool", "colocated", "Deployment.pools[0]", "expected a mapping"),
    ("pool", True, "Deployment.pools[0]", "expected a mapping"),
    ("engine", "fp8", "Deployment.pools[0].engine", "expected a mapping"),
    ("engine", ["fp8"], "Deployment.pools[0].engine", "expected a mapping"),
    ("parallel", "tp8", "Deployment.pools[0].parallel", "expected a mapping"),
    ("parallel", [8], "Deployment.pools[0].parallel", "expected a mapping"),
    ("cluster", "h200", "Scenario.cluster", "expected a mapping"),
    ("speculative", 1, ENGINE + "speculative", "expected a mapping"),
])
def test_a_section_of_the_wrong_type(tmp_path, where, bad, field, reason):
    def edit(s, d):
        if where == "pools":
            d["pools"] = bad
        elif where == "pool":
            d["pools"][0] = bad
        elif where == "cluster":
            s["cluster"] = bad
        elif where == "speculative":
            d["pools"][0]["engine"]["speculative"] = bad
        else:
            d["pools"][0][where] = bad
    path = write(tmp_path, edit)
    err = expect(lambda: load_deployment(path), file=path, field=field, reason=reason)
    assert f"value {bad!r}" in str(err)


@pytest.mark.parametrize("value,reason", [
    ("eight", "expected a number"), (float("nan"), "expected a finite number"),
    (float("inf"), "expected a finite number"), (-1, "must be a fraction in (0, 1]"),
    (-0.5, "must be a fraction in (0, 1]"), (0, "must be a fraction in (0, 1]"),
    (1.5, "must be a fraction in (0, 1]"), (True, "expected a number"), ([0.9], "expected a number"),
])
def test_gpu_memory_utilization(tmp_path, value, reason):
    path = write(tmp_path, lambda s, d: d["pools"][0]["engine"].update(gpu_memory_utilization=value))
    err = expect(lambda: load_deployment(path), file=path, field=ENGINE + "gpu_memory_utilization", reason=reason)
    assert str(err).startswith(f"{path}, field '{ENGINE}gpu_memory_utilization', value ")


def test_gpu_memory_utilization_in_range_resolves(tmp_path):
    dep = load_deployment(write(tmp_path, lambda s, d: d["pools"][0]["engine"].update(gpu_memory_utilization=1)))
    assert dep.plan.memory["kv_capacity_tokens"] > load_deployment(DSV3).plan.memory["kv_capacity_tokens"]


def test_the_cli_refuses_the_issue_instances_in_one_line(tmp_path, capsys):
    for i, edit in enumerate([lambda s, d: d.update(pools=True),
                              lambda s, d: d["pools"][0].update(engine="fp8"),
                              lambda s, d: d["pools"][0]["engine"].update(gpu_memory_utilization="eight"),
                              lambda s, d: d["pools"][0]["engine"].update(gpu_memory_utilization=float("nan")),
                              lambda s, d: d["pools"][0]["engine"].update(gpu_memory_utilization=-0.5)]):
        path = write(tmp_path, edit, filename=f"c{i}.yaml")
        line = cli_line(capsys, "price", str(path), "--decode", "1,8", "--context", "512")
        assert str(path) in line and "field 'Deployment.pools" in line and "value " in line


# ----------------------------------------------------------------------------- scenario ranges


@pytest.mark.parametrize("section,key,value,reason", [
    ("engine", "max_num_seqs", 0, "must be >= 1"),
    ("engine", "max_num_seqs", 2.5, "expected an integer"),
    ("engine", "max_model_len", INT_TOKEN_LIMIT, f"must be below {INT_TOKEN_LIMIT}"),
    ("engine", "max_num_batched_tokens", 10 ** 30, "out of range"),
    ("engine", "block_size", -16, "must be >= 1"),
    ("engine", "enforce_eager", "yes", "expected true or false"),
    ("engine", "cudagraph_mode", 3, "expected a string"),
    ("engine", "cache_dtype", ["fp8"], "expected a string"),
    ("engine", "scheduling_policy", "lifo", "unknown value (known: fcfs, priority)"),
    ("engine", "eplb", "on", "expected a mapping"),
    ("parallel", "tp", 8.5, "expected an integer"),
    ("parallel", "dp", float("inf"), "expected a finite number"),
    ("parallel", "tp", 1 << 20, "must be <= 65536"),
    ("parallel", "enable_expert_parallel", "false", "expected true or false"),
])
def test_engine_and_parallel_ranges(tmp_path, section, key, value, reason):
    path = write(tmp_path, lambda s, d: d["pools"][0][section].update({key: value}))
    expect(lambda: load_deployment(path), file=path, field=f"Deployment.pools[0].{section}.{key}", reason=reason)


@pytest.mark.parametrize("edit,field,reason", [
    (lambda s, d: s["cluster"].update(nodes=0), "Scenario.cluster.nodes", "must be >= 1"),
    (lambda s, d: s["cluster"].update(gpus_per_node=-8), "Scenario.cluster.gpus_per_node", "must be >= 0"),
    (lambda s, d: s["cluster"].update(hardware=["h200"]), "Scenario.cluster.hardware", "expected a string"),
    (lambda s, d: s.update(model=None), "Scenario.model", "expected a string"),
    (lambda s, d: s.update(coefficients="cost-model-primitives"), "Scenario.coefficients",
     "expected a non-empty list of coefficient set names"),
    (lambda s, d: d["pools"][0].update(role="both"), "Deployment.pools[0].role", "unknown value"),
    (lambda s, d: d["pools"][0].update(nodes=1.5), "Deployment.pools[0].nodes", "expected an integer"),
    (lambda s, d: d["pools"][0]["engine"].update(speculative={"num_spec_tokens": 0}),
     ENGINE + "speculative.num_spec_tokens", "must be >= 1"),
    (lambda s, d: d["pools"][0]["engine"].update(eplb={"enable_eplb": True, "num_redundant_experts": -1}),
     ENGINE + "eplb.num_redundant_experts", "must be >= 0"),
])
def test_scenario_fields(tmp_path, edit, field, reason):
    path = write(tmp_path, edit)
    expect(lambda: load_deployment(path), file=path, field=field, reason=reason)


def test_every_pool_is_checked_and_named_by_its_index(tmp_path):
    def edit(s, d):
        second = copy.deepcopy(d["pools"][0])
        second["engine"]["gpu_memory_utilization"] = 2
        d["pools"].append(second)
    path = write(tmp_path, edit)
    for index in (0, 1):     # pool 1 is malformed: refused whichever pool is priced
        expect(lambda: load_scenario(path, index), file=path, field="Deployment.pools[1].engine.gpu_memory_utilization",
               reason="fraction")


def test_a_second_pool_resolves_and_knows_its_index(tmp_path):
    def edit(s, d):
        second = copy.deepcopy(d["pools"][0])
        second["parallel"]["tp"] = 4
        d["pools"].append(second)
    path = write(tmp_path, edit)
    s = load_scenario(path, 1)
    assert s.parallel["tp"] == 4 and s.pool_index == 1 and s.pool_field == "Deployment.pools[1]"
    assert load_deployment(path, pool_index=1).resolution["tp"] == 4


# ----------------------------------------------------------------------------- files


@pytest.mark.parametrize("content,reason", [
    (b"", "the file holds no YAML document"),
    (b"# only a comment\n", "the file holds no YAML document"),
    (b"\x00\x01\x02garbage\xff", "is not a text file"),
    (b"kind: Scenario\n\xff\xfe\n", "is not UTF-8 text"),
    (b"kind: Scenario\nname: a\nname: b\n---\nkind: Deployment\npools: []\n", "found duplicate key 'name'"),
    (b"kind: Scenario\ncluster: {hardware: h200, hardware: h100}\n", "found duplicate key 'hardware'"),
    (b"kind: [Scenario\n", "malformed YAML at line"),
    (b"\tkind: Scenario\n", "malformed YAML at line 1"),
    (b"- 1\n- 2\n", "document 1 is a list, expected a mapping"),
    (b"[" * 5000, "malformed YAML"),
])
def test_bad_yaml_files(tmp_path, content, reason):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    expect(lambda: load_deployment(path), file=path, field=None, reason=reason)


def test_a_directory_and_a_merge_key(tmp_path):
    d = tmp_path / "dir.yaml"
    d.mkdir()
    expect(lambda: read_yaml_documents(d), file=d, field=None, reason="is a directory")
    ok = tmp_path / "merge.yaml"      # a merge key's overridden keys are not duplicates
    ok.write_text("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n")
    assert read_yaml_documents(ok)[0]["c"] == {"x": 3, "y": 2}


def test_the_cli_refuses_garbage_files_in_one_line(tmp_path, capsys):
    for i, content in enumerate([b"\x89PNG\r\n\x1a\n\x00\x00", b"", b"a: 1\na: 2\n"]):
        path = tmp_path / f"g{i}.yaml"
        path.write_bytes(content)
        assert str(path) in cli_line(capsys, "price", str(path))
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    assert "is a directory" in cli_line(capsys, "price", str(folder))


# ----------------------------------------------------------------------------- graphs, chips, sets


def model_doc(name="llama-3.1-70b-instruct"):
    return yaml.safe_load((BUNDLED / "models" / f"{name}.yaml").read_text())


def write_yaml(path, doc):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("edit,field,reason", [
    (lambda d: d.update(hidden_size=0), "hidden_size", "must be >= 1"),
    (lambda d: d.update(vocab_size="128k"), "vocab_size", "expected a number"),
    (lambda d: d.update(tie_word_embeddings="no"), "tie_word_embeddings", "expected true or false"),
    (lambda d: d["stack"].update(repeat=10 ** 9), "stack.repeat", "must be <= 10000"),
    (lambda d: d["stack"].update(pattern="dense"), "stack.pattern", "expected a list"),
    (lambda d: d["layer_kinds"]["dense"][1].update(op=["GEMM"]), "layer_kinds.dense.nodes[1].op", "unknown op"),
    (lambda d: d["layer_kinds"]["dense"][1].update(n=float("nan")), "layer_kinds.dense.nodes[1].n", "finite"),
    (lambda d: d["layer_kinds"]["dense"][1].update(n=10 ** 12), "layer_kinds.dense.nodes[1].n", "must be below"),
    (lambda d: d["layer_kinds"]["dense"][1].update(emit=["tensor_parallel"]), "layer_kinds.dense.nodes[1].emit",
     "expected a string"),
    (lambda d: d["layer_kinds"].update(dense="GEMM"), "layer_kinds.dense.nodes", "expected a list of nodes"),
    (lambda d: d.update(layer_kinds=["dense"]), "layer_kinds", "expected a mapping of kind id to nodes"),
])
def test_model_graph_fields(tmp_path, edit, field, reason):
    doc = model_doc()
    assert doc["layer_kinds"]["dense"][1]["op"] == "GEMM"
    edit(doc)
    path = write_yaml(tmp_path / "models" / "llama-3.1-70b-instruct.yaml", doc)
    expect(lambda: load_model_graph(path), file=path, field=field, reason=reason)


@pytest.mark.parametrize("key,value,reason", [
    ("memory_gib", 0, "must be > 0"), ("hbm_tbs", -4.8, "must be >= 0"), ("bf16_tflops", float("inf"), "finite"),
    ("sm_count", 132.5, "expected an integer"), ("gpus_per_node", 0, "must be >= 1"),
    ("nvlink_gbps", "450", "expected a number"),
])
def test_project_chip_fields(tmp_path, key, value, reason):
    doc = yaml.safe_load((BUNDLED / "chips.yaml").read_text())
    doc["chips"]["h200"][key] = value
    path = write_yaml(tmp_path / "chips.yaml", doc)
    expect(lambda: load_chips(path), file=path, field=f"chips.h200.{key}", reason=reason)


def test_public_chip_fields(tmp_path):
    base = {"_comment": "x", "TFlopsPeak": 989.5, "BwPeakTBs": 4.8, "MemoryGiB": 141.0, "IntraNodeBwGBps": 450}
    for key, value, reason in [("MemoryGiB", -1, "must be > 0"), ("SMCount", "many", "expected a number"),
                               ("TFlopsFP8", float("nan"), "finite"), ("Provenance", 3, "expected a string")]:
        path = write_yaml(tmp_path / "hardware" / f"{key}.yaml", {**base, key: value})
        expect(lambda: load_public_chip(path), file=path, field=key, reason=reason)


def own_set(**changes):
    e = {"name": "hbm_derate", "value": 0.8, "units": "dimensionless", "scope": {"hardware": ["h200"]}}
    e.update(changes)
    return {"format": "jaxprice-coefficients/1", "name": "x", "entries": [e]}


@pytest.mark.parametrize("changes,field,reason", [
    ({"value": 1.2}, "entries[0].value", "must be a fraction in (0, 1]"),
    ({"value": 0}, "entries[0].value", "must be a fraction in (0, 1]"),
    ({"value": float("nan")}, "entries[0].value", "expected a finite number"),
    ({"value": "0.8"}, "entries[0].value", "expected a number"),
    ({"name": "host_launch_per_kernel", "value": -3.2, "units": "us_per_transfer"}, "entries[0].value",
     "must be >= 0 (a us_per_transfer coefficient)"),
    ({"name": "attention_decode_rate", "value": 0, "units": "bytes_per_us"}, "entries[0].value", "must be > 0"),
    ({"name": "recurrent_decode_rate_gdn", "value": -0.5, "units": "tokens"}, "entries[0].value", "must be > 0"),
    ({"scope": {"tp": ["eight"]}}, "entries[0].scope.tp[0]", "expected a number"),
    ({"scope": {"hardware": [200]}}, "entries[0].scope.hardware[0]", "expected a string"),
    ({"scope": []}, "entries[0].scope", "an entry needs a scope"),
    ({"ci95": "wide"}, "entries[0].ci95", "expected a list"),
    ({"fitted": "yes"}, "entries[0].fitted", "expected true or false"),
])
def test_coefficient_values_follow_their_units(tmp_path, changes, field, reason):
    path = write_yaml(tmp_path / "x.yaml", own_set(**changes))
    expect(lambda: load_coefficient_set(path), file=path, field=field, reason=reason)


def test_public_coefficient_values(tmp_path):
    doc = {"kind": "CoefficientSet", "name": "x", "coefficients": [
        {"gemm_eps_max_fp8": {"value": 1.5, "units": "dimensionless", "scope": {"hardware": ["h200"]}}}]}
    path = write_yaml(tmp_path / "p.yaml", doc)
    expect(lambda: load_coefficient_set(path), file=path, field="coefficients[0].gemm_eps_max_fp8.value",
           reason="fraction")
    doc["coefficients"] = "gemm_eps_max_fp8"
    path = write_yaml(tmp_path / "q.yaml", doc)
    expect(lambda: load_coefficient_set(path), file=path, field="coefficients", reason="expected a list")


# ----------------------------------------------------------------------------- batch files and measurements


@pytest.mark.parametrize("name,content,field,reason", [
    ("huge.yaml", f"- {{scheduled: 1, computed: {INT_TOKEN_LIMIT}}}\n", "requests[0].computed", "must be below"),
    ("many.yaml", "- {scheduled: 1, computed: 1, count: 2000000}\n", "requests[0].count", "must be <= 1048576"),
    ("total.yaml", "- {scheduled: 1, computed: 1, count: 1000000}\n- {scheduled: 1, computed: 1, count: 100000}\n",
     "count", "holds 1100000 requests"),
    ("dup.yaml", "- {scheduled: 1, scheduled: 2, computed: 1}\n", None, "found duplicate key 'scheduled'"),
    ("two.yaml", "- {scheduled: 1, computed: 1}\n---\n- {scheduled: 1, computed: 1}\n", None, "holds 2 YAML documents"),
    ("thr.yaml", "decode_threshold: .nan\nrequests: [{scheduled: 1, computed: 1}]\n", "decode_threshold",
     "must be an integer"),
    ("bin.csv", b"scheduled,computed\n\x00\x01\n", None, "is not a text file"),
    ("latin.csv", b"scheduled,computed\n1,\xe9\n", None, "is not UTF-8"),
    ("quote.csv", 'scheduled,computed\n1,"2\n', None, "malformed CSV"),
    ("big.csv", f"scheduled,computed\n{INT_TOKEN_LIMIT},0\n", "scheduled", "must be below"),
])
def test_bad_batch_files(tmp_path, name, content, field, reason):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    err = refusal(lambda: read_batch_file(path))
    assert err.field == field and reason in err.reason and str(err.file).startswith(str(path)), str(err)


def test_a_batch_file_that_is_a_directory(tmp_path):
    d = tmp_path / "batch.yaml"
    d.mkdir()
    expect(lambda: read_batch_file(d), file=d, field=None, reason="is a directory")


MEASURED_HEADER = ("scenario,deployment,model,hardware,dtype,engine,tp,ep,dp,workload,isl,osl,concurrency,"
                   "quantity,value,unit\n")
ROW = "s.yaml,,llama-3.1-70b-instruct,h200,fp8,vllm,8,1,1,1k1k,{isl},1024,{c},mean_tpot,20.0,ms\n"


@pytest.mark.parametrize("content,where,field,reason", [
    (MEASURED_HEADER + ROW.format(isl=1024, c=0), ":2", "concurrency", "must be >= 1"),
    (MEASURED_HEADER + ROW.format(isl=INT_TOKEN_LIMIT, c=4), ":2", "isl", "must be below"),
    (MEASURED_HEADER + ROW.format(isl=-1, c=4), ":2", "isl", "must be >= 0"),
    ("", "", None, "is empty"),
    (b"\x00\x00\x00", "", None, "is not a text file"),
])
def test_bad_measurement_files(tmp_path, content, where, field, reason):
    from jaxprice._src.accuracy import read_measurements
    path = tmp_path / "m.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    err = refusal(lambda: read_measurements(path))
    assert err.file == f"{path}{where}" and err.field == field and reason in err.reason, str(err)


# ----------------------------------------------------------------------------- primitives


def test_number_primitives():
    assert schema.number(3.0, integer=True) == 3 and isinstance(schema.number(3.0, integer=True), int)
    assert schema.number(" 12 ", text=True, integer=True) == 12
    assert schema.number(np.int64(5), integer=True) == 5
    assert schema.token_count(INT_TOKEN_LIMIT - 1) == INT_TOKEN_LIMIT - 1
    assert schema.fraction(1) == 1 and schema.positive(1e-9) == 1e-9 and schema.count(0) == 0
    cases = [(lambda: schema.number(True), "expected a number"),
             (lambda: schema.number("1.5", text=True, integer=True), "expected an integer"),
             (lambda: schema.number("nan", text=True), "expected a finite number"),
             (lambda: schema.number("", text=True), "is empty"),
             (lambda: schema.number(2 ** 53), "out of range"),
             (lambda: schema.token_count(INT_TOKEN_LIMIT), "must be below 16777216"),
             (lambda: schema.positive_int(0), "must be >= 1"),
             (lambda: schema.fraction(0.0), "fraction"),
             (lambda: schema.positive(0), "must be > 0"),
             (lambda: schema.string(3), "expected a string"),
             (lambda: schema.string("c", choices=("a", "b")), "unknown value (known: a, b)"),
             (lambda: schema.boolean(1), "expected true or false")]
    for call, reason in cases:
        err = refusal(call)
        assert reason in err.reason, (reason, str(err))
    err = refusal(lambda: schema.number(-1, file="f.csv:3", field="x", minimum=0))
    assert str(err) == "f.csv:3, field 'x', value -1: must be >= 0"


def test_a_long_value_is_shown_short():
    err = refusal(lambda: schema.check({"a": list(range(100))}, schema.Map({"a": schema.Str()}), file="f"))
    assert str(err) == "f, field 'a', value '<a list of 100 items>': expected a string"


def test_read_table(tmp_path):
    cols = {"arrival_s": schema.NonNeg(), "input_len": schema.Token(1), "output_len": schema.Token(1)}
    good = tmp_path / "t.csv"
    good.write_text("arrival_s,input_len,output_len\n# a comment\n0.0,128,16\n0.5,64,8\n")
    rows = schema.read_table(good, cols, required=tuple(cols))
    assert rows == [(3, {"arrival_s": 0.0, "input_len": 128, "output_len": 16}),
                    (4, {"arrival_s": 0.5, "input_len": 64, "output_len": 8})]
    for text, file, field, reason in [
        ("arrival_s,input_len\n0,1\n", "t2.csv", "output_len", "missing column"),
        ("arrival_s,input_len,output_len,x\n", "t2.csv", "x", "unknown column"),
        ("arrival_s,input_len,output_len\n-1,1,1\n", "t2.csv:2", "arrival_s", "must be >= 0"),
        ("arrival_s,input_len,output_len\n0,1.5,1\n", "t2.csv:2", "input_len", "expected an integer"),
        ("arrival_s,input_len,output_len\n0,1,inf\n", "t2.csv:2", "output_len", "finite"),
        ("arrival_s,input_len,output_len\n0,1\n", "t2.csv:2", None, "has 2 values for 3 columns"),
        ("", "t2.csv", None, "is empty")]:
        bad = tmp_path / "t2.csv"
        bad.write_text(text)
        err = refusal(lambda: schema.read_table(bad, cols, required=tuple(cols)))
        assert err.file == str(tmp_path / file) and err.field == field and reason in err.reason, str(err)


def test_read_json(tmp_path):
    good = tmp_path / "config.json"
    good.write_text('{"hidden_size": 4096, "num_hidden_layers": 32}')
    assert schema.read_json(good)["hidden_size"] == 4096
    for text, reason in [('{"a": 1, "a": 2}', "duplicate key"), ('{"a": NaN}', "NaN is not a JSON number"),
                         ('{"a": 1', "malformed JSON at line 1"), ("", "is empty"), ("[" * 100000, "nested too deeply")]:
        good.write_text(text)
        assert reason in refusal(lambda: schema.read_json(good)).reason


# ----------------------------------------------------------------------------- every shipped file passes


def test_every_bundled_file_passes_its_schema():
    for name in bundled_scenarios():
        scen, dep = read_yaml_documents(scenario_path(name))
        schema.check_scenario(scen, dep, file=name)
    for f in (BUNDLED / "models").glob("*.yaml"):
        schema.check_model_graph(read_yaml_documents(f)[0], file=str(f))
    for f in (BUNDLED / "coefficients").glob("*.yaml"):
        schema.check_coefficient_set(read_yaml_documents(f)[0], file=str(f))
    schema.check_chips(read_yaml_documents(BUNDLED / "chips.yaml")[0], file="chips.yaml")


@pytest.mark.skipif(not SHARED.exists(), reason="no shared reference copies")
def test_every_shared_public_file_passes_its_schema():
    for f in sorted((SHARED / "catalog" / "models").glob("*/graph.yaml")):
        schema.check_model_graph(read_yaml_documents(f)[0], file=str(f))
    for f in sorted((SHARED / "catalog" / "hardware").glob("*.yaml")):
        schema.check_public_chip(read_yaml_documents(f)[0], file=str(f))
    for f in sorted((SHARED / "catalog" / "networks").glob("*.yaml")):
        schema.check_public_network(read_yaml_documents(f)[0], file=str(f))
    for f in sorted((SHARED / "registry" / "coefficients").glob("*.yaml")):
        schema.check_coefficient_set(read_yaml_documents(f)[0], file=str(f))
    for f in sorted((SHARED / "scenarios" / "aisimulate").glob("*.yaml")):
        schema.check_scenario(*read_yaml_documents(f), file=str(f))
    measured = Path("/work/shared/measured/inferencex_vllm_dev.csv")
    if measured.exists():
        schema.check_measurement_file(measured)
