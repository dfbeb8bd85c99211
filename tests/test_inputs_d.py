"""Malformed and edge-case input a bug-bash of price, sweep, optimize and import-model found
mishandled (a traceback, a silent default, an inf or absurd price, a message naming the wrong
field): each is now refused in ONE line naming file, field and value, exit status 2.

Nothing here prices a step or compiles a kernel: every refusal happens while loading or
checking the options (the few CLI runs that load the default scenario refuse before jit).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import yaml
from clirefusal import assert_refused, refused

from jaxprice import load_deployment
from jaxprice._src import schema
from jaxprice._src.batchfile import read_batch_file
from jaxprice._src.formats import load_model_graph
from jaxprice._src.hf import graph_yaml, import_result
from jaxprice._src.resolve import scenario_path

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "testdata" / "hf"
LLAMA = "meta-llama--Llama-3.1-8B-Instruct"
S = "deepseek-v3-h200-fp8-sglang-tp8"
BIG_INT = "1" + "0" * 5000          # past Python's 4300-digit int() limit: a ValueError, not a parse error


# ----------------------------------------------------------------------------- command-line options

@pytest.mark.parametrize("argv,words", [
    # smooth mode past temperature 1 priced a 9.7 ms step at inf (1e300) or 0.9 s (10): now refused
    (("price", S, "--decode", "1", "--temperature", "1e300"), ("'--temperature'", "1e+300", "at most 1")),
    (("price", S, "--decode", "1", "--temperature", "2"), ("'--temperature'", "value 2.0", "at most 1")),
    (("sweep", S, "--decode", "1", "--context", "64", "--temperature", "5"), ("'--temperature'", "at most 1")),
    (("optimize", S, "--itl-ms", "50", "--temperature", "100"), ("'--temperature'", "value 100.0", "at most 1")),
    # --tokens-per-decode 1e300 answered 1e300 output tokens/s
    (("optimize", S, "--itl-ms", "50", "--tokens-per-decode", "1e300"), ("'--tokens-per-decode'", "at most 1025")),
    # --units with --json was silently ignored (JSON is in seconds)
    (("price", S, "--decode", "1", "--json", "--units", "us"), ("'--units', value 'us'", "always in seconds")),
    (("optimize", S, "--itl-ms", "50", "--json", "--units", "us"), ("'--units', value 'us'", "always in seconds")),
    # --heatmap-prefill without --heatmap was silently ignored
    (("sweep", S, "--decode", "1", "--context", "64", "--heatmap-prefill", "0"),
     ("'--heatmap-prefill'", "value '0'", "needs --heatmap")),
    # an empty SCENARIO or CONFIG was read as the current folder (".: is a directory")
    (("price", ""), ("'SCENARIO'", "value ''", "an empty name")),
    (("sweep", " "), ("'SCENARIO'", "an empty name")),
    (("import-model", ""), ("'CONFIG.json'", "value ''", "an empty name")),
])
def test_options_refused_before_pricing(capsys, argv, words):
    assert_refused(capsys, argv, *words)


@pytest.mark.parametrize("argv,words", [
    # under --ignore-limits a 10**20-token prefill or context priced to 1e33 ms; now the kernel's
    # token limit (2**24) applies to the command line as it does to a batch file
    (("price", S, "--ignore-limits", "--prefill", "99999999999999999999"),
     ("'--prefill'", "99999999999999999999", "must be below 16777216", "kernel's token limit")),
    (("price", S, "--ignore-limits", "--decode", "1", "--context", "16777216"), ("'--context'", "16777216")),
    (("sweep", S, "--ignore-limits", "--decode", "1", "--context", "1", "--prefill-chunk", "0,99999999999"),
     ("'--prefill-chunk'", "99999999999", "kernel's token limit")),
    (("sweep", S, "--ignore-limits", "--decode", "1", "--context", "99999999999"), ("'--context'", "token limit")),
    (("price", S, "--decode", "1", "--decode-threshold", "99999999999"), ("'--decode-threshold'", "token limit")),
])
def test_token_counts_past_the_kernels_limit_are_refused_even_ignoring_limits(capsys, argv, words):
    assert_refused(capsys, argv, *words)


@pytest.mark.parametrize("argv,words", [
    # the refusal named the flag with the step's token total, a value the user never gave ('--prefill-chunk',
    # value 100000 for --prefill-chunk 99999)
    (("sweep", S, "--decode", "1", "--context", "100", "--prefill-chunk", "99999"),
     ("'--prefill-chunk', value 99999:", "100000 tokens (1 decode + a 99999-token chunk)",
      "max_num_batched_tokens 8192")),
    (("price", S, "--decode", "8", "--prefill", "100,8190"),
     ("'--prefill', value '100,8190':", "8298 tokens (8 decode + 100 + 8190 prefill)")),
])
def test_a_step_past_max_num_batched_tokens_names_the_value_given(capsys, argv, words):
    assert_refused(capsys, argv, *words)


@pytest.mark.parametrize("argv", [
    ("price", "llama-3.1-8b-instruct", "--decode", "1"),
    ("price", str(HF / LLAMA / "config.json"), "--decode", "1"),
    ("optimize", str(HF / LLAMA), "--itl-ms", "50"),
    ("sweep", str(ROOT / "registry" / "models" / "llama-3.1-8b-instruct.yaml")),
])
def test_a_model_given_as_the_scenario_says_to_add_chip(capsys, argv):
    """A model without --chip was refused as 'no such scenario' (near matches), 'is a directory' or
    'expected two documents'."""
    assert_refused(capsys, argv, "'SCENARIO'", f"value '{argv[1]}'", "names a model, not a scenario", "--chip")


def test_optimize_limits_refuse_token_counts_past_the_kernels_limit():
    """A deployment that states no max_model_len (nor its graph) took --prefix 99999999999 and answered."""
    from types import SimpleNamespace

    from jaxprice._src.search import make_limits
    dep = SimpleNamespace(resolution={"decode_threshold": 1, "max_num_seqs": 256}, scenario=SimpleNamespace(engine={}),
                          graph=SimpleNamespace(max_model_len=None))
    refused(lambda: make_limits(dep, itl=0.05, prefill_budget=2048, prefix=2 ** 24), "'prefix'", "below 16777216")
    refused(lambda: make_limits(dep, itl=0.05, prefill_budget=99999999999), "'prefill_budget'", "token limit")
    refused(lambda: make_limits(dep, itl=0.05, prefill_budget=2048, context=2 ** 24), "'context'", "token limit")
    refused(lambda: make_limits(dep, itl=0.05, prefill_budget=2 ** 23, prefix=2 ** 23), "prefix + prefill_budget")
    assert make_limits(dep, itl=0.05, prefill_budget=2048, prefix=2 ** 23).prefix == 2 ** 23
    # where the graph states the model's length (vLLM's default max_model_len), that is the limit
    dep.graph.max_model_len = 131072
    refused(lambda: make_limits(dep, itl=0.05, prefill_budget=2048, context=200000), "'context'",
            "max_model_len 131072")


@pytest.mark.parametrize("argv,words", [
    # a deployment from a model and a chip states no max_model_len: a context past the model's own
    # length (vLLM's default max_model_len, 131072 for Llama 3.1) was priced silently
    (("price", "llama-3.1-8b-instruct", "--chip", "h200", "--decode", "1", "--context", "200000"),
     ("'--context', value 200000", "max_model_len 131072")),
    # --tp / --gpus-per-node past a scenario file's cap (2**16) priced 99999-way TP (sm 0.000 ms)
    (("price", "llama-3.1-8b-instruct", "--chip", "h200", "--gpus-per-node", "99999999999", "--tp", "99999",
      "--decode", "1"), ("'--tp', value 99999", "at most 65536")),
    (("price", "llama-3.1-8b-instruct", "--chip", "h200", "--gpus-per-node", "99999999999", "--decode", "1"),
     ("'--gpus-per-node', value 99999999999", "at most 65536")),
    # a workload longer than max_model_len: the optimum was 0 output tokens/s
    (("optimize", S, "--itl-ms", "50", "--prompt-len", "99999999999", "--output-len", "1"),
     ("'--prompt-len', value 99999999999", "exceeds the deployment's max_model_len 32768")),
    (("optimize", S, "--itl-ms", "50", "--prompt-len", "30000", "--output-len", "2769"),
     ("'--prompt-len', value 30000", "30000 prompt + 2769 output tokens")),
])
def test_limits_a_deployment_implies(capsys, argv, words):
    assert_refused(capsys, argv, *words)


# ----------------------------------------------------------------------------- files that are not files

def test_a_device_is_refused_not_read_forever(capsys):
    """/dev/zero as a scenario or config.json was read until memory ran out (a MemoryError traceback)."""
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    assert_refused(capsys, ["price", "/dev/zero"], "/dev/zero", "is a device")
    assert_refused(capsys, ["import-model", "/dev/zero"], "/dev/zero", "is a device")
    assert_refused(capsys, ["price", S, "--batch", "/dev/zero"], "/dev/zero", "not a regular file")
    refused(lambda: schema.read_text("/dev/zero"), "is a device")


def test_an_input_file_past_the_size_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(schema, "MAX_FILE_BYTES", 16)
    p = tmp_path / "big.yaml"
    p.write_text("requests:\n  - {scheduled: 1, computed: 0}\n")
    refused(lambda: read_batch_file(p), "big.yaml", "larger than")


# ----------------------------------------------------------------------------- YAML and JSON

def test_an_integer_too_long_for_python_is_malformed_yaml_or_json(tmp_path):
    """A 5001-digit integer raised ValueError out of the YAML and JSON readers."""
    scen = tmp_path / "s.yaml"
    scen.write_text(scenario_path(S).read_text().replace("max_num_seqs: 256", f"max_num_seqs: {BIG_INT}"))
    refused(lambda: load_deployment(scen), "s.yaml", "malformed YAML at line", "integer too long")
    batch = tmp_path / "b.yaml"
    batch.write_text(f"requests:\n  - {{scheduled: {BIG_INT}, computed: 0}}\n")
    refused(lambda: read_batch_file(batch), "b.yaml", "integer too long")
    js = tmp_path / "x.json"
    js.write_text('{"a": %s}' % BIG_INT)
    refused(lambda: schema.read_json(js), "x.json", "malformed JSON")
    cfg = json.loads((HF / LLAMA / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg).replace('"vocab_size": 128256', f'"vocab_size": {BIG_INT}'))
    refused(lambda: import_result(tmp_path / "config.json"), "config.json", "not valid JSON")
    assert schema.load_yaml_documents("a: 0x10\nb: -5\nc: 1_000\n") == [{"a": 16, "b": -5, "c": 1000}]


def _laughs(levels=9):
    """A flow list of nested aliases of aliases: 9 x 9 references written, 9**9 values expanded."""
    items = ['&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    items += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def test_an_alias_bomb_is_refused_not_expanded(tmp_path):
    """A billion-laughs value in a refused field hung the loader: the refusal printed its repr."""
    batch = tmp_path / "b.yaml"
    batch.write_text(f"decode_threshold: {_laughs()}\nrequests: []\n")
    refused(lambda: read_batch_file(batch), "b.yaml", "aliases expand document 1 to 490329059 values")
    scen = tmp_path / "s.yaml"
    scen.write_text(scenario_path(S).read_text().replace("max_num_seqs: 256", f"max_num_seqs: {_laughs()}"))
    refused(lambda: load_deployment(scen), "s.yaml", "malformed YAML", "nested aliases of aliases")
    loop = tmp_path / "l.yaml"
    loop.write_text("requests: &r [*r]\n")
    refused(lambda: read_batch_file(loop), "a recursive alias")


def test_ordinary_aliases_still_load():
    docs = schema.load_yaml_documents("x: &x {p: 1, q: 2}\ny: *x\nz: {<<: *x, r: 3}\nl: [" + ",".join(["*x"] * 5000)
                                      + "]\nm: '*'\n")
    assert docs[0]["z"] == {"p": 1, "q": 2, "r": 3} and len(docs[0]["l"]) == 5000


def test_a_lower_bound_is_not_explained_by_the_token_limit(tmp_path):
    """'max_num_seqs 0: must be >= 1 (the kernel's token limit ...)' blamed the wrong bound."""
    scen = tmp_path / "s.yaml"
    scen.write_text(scenario_path(S).read_text().replace("max_num_seqs: 256", "max_num_seqs: 0"))
    msg = refused(lambda: load_deployment(scen), "'Deployment.pools[0].engine.max_num_seqs', value 0: must be >= 1")
    assert "token limit" not in msg
    refused(lambda: schema.token_count(2 ** 24, field="x"), "must be below 16777216 (the kernel's token limit")


# ----------------------------------------------------------------------------- model graphs

def _graph(tmp_path, edit):
    doc = yaml.safe_load((ROOT / "registry" / "models" / "llama-3.1-8b-instruct.yaml").read_text())
    edit(doc)
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def _node(kind, i, **kw):
    return lambda d: d["layer_kinds"][kind][i].update(kw)


@pytest.mark.parametrize("edit,words", [
    # a GEMM of width 0 or attention with no heads priced as free work; a stack of no layers as a model
    (_node("dense", 1, n=0), ("field 'layer_kinds.dense.nodes[1].n', value 0", "must be >= 1")),
    (_node("dense", 1, k=0), ("'layer_kinds.dense.nodes[1].k', value 0",)),
    (_node("dense", 2, n_q=0), ("'layer_kinds.dense.nodes[2].n_q', value 0",)),
    (_node("dense", 2, n_kv=0), ("'layer_kinds.dense.nodes[2].n_kv', value 0",)),
    (_node("dense", 2, d_h=0), ("'layer_kinds.dense.nodes[2].d_h', value 0",)),
    (lambda d: d["stack"].update(repeat=0), ("field 'stack'", "the stack has no layers")),
    (lambda d: d["stack"].update(pattern=[]), ("the stack has no layers",)),
])
def test_a_graph_with_nothing_to_price_is_refused(tmp_path, edit, words):
    p = _graph(tmp_path, edit)
    msg = refused(lambda: load_model_graph(p), *words)
    assert msg.startswith(str(p))


def test_a_graph_with_only_a_prologue_loads(tmp_path):
    p = _graph(tmp_path, lambda d: d.update(stack={"prologue": ["dense"], "pattern": [], "repeat": 0}))
    assert len(load_model_graph(p).expanded_stack()) == 1


# ----------------------------------------------------------------------------- batch files

@pytest.mark.parametrize("name,content,words", [
    # keys of mixed types (1 and 'a'): sorting them raised TypeError
    ("mixed.yaml", "1: 2\na: 3\nrequests: []\n", ("field '1'", "unknown key")),
    ("nullkey.yaml", "~: 2\nrequests: []\n", ("field 'None'", "unknown key")),
    # a trailing comma in the header: "unknown column" naming no column
    ("trail.csv", "scheduled,computed,\n1,0,\n", ("value 'scheduled,computed,'", "has no name, column 3 of 3")),
])
def test_batch_files(tmp_path, name, content, words):
    p = tmp_path / name
    p.write_text(content)
    refused(lambda: read_batch_file(p), name, *words)


# ----------------------------------------------------------------------------- Hugging Face configs

def _config(tmp_path, edit, folder=LLAMA):
    cfg = json.loads((HF / folder / "config.json").read_text())
    edit(cfg)
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d / "config.json"


def _quant(qc):
    return lambda c: c.update(quantization_config=copy.deepcopy(qc))


CT = "compressed-tensors"


@pytest.mark.parametrize("edit,words", [
    # AttributeError: 'int' object has no attribute 'get'
    (_quant({"quant_method": CT, "config_groups": {"g": 5}}),
     ("field 'quantization_config.config_groups.g', value 5", "expected a mapping")),
    (_quant({"quant_method": CT, "config_groups": {"g": {"weights": [8]}}}),
     ("field 'quantization_config.config_groups.g.weights', value [8]", "expected a mapping")),
    # re.error from compiling the unquantized-module list
    (_quant({"quant_method": "fp8", "ignore": ["re:[("]}),
     ("field 'quantization_config.ignore', value 're:[('", "not a regular expression")),
    # a per-layer-type rope factor: blamed on 'max_model_len', a key the config does not have
    (lambda c: c.update(rope_parameters={"full_attention": {"rope_type": "default", "factor": -1}}),
     ("field 'rope_parameters.full_attention.factor', value -1", "must be a positive number")),
    # a string factor per layer type: '2' * 131072 tokens, a ValueError (or TypeError) traceback
    (lambda c: c.update(rope_parameters={"full_attention": {"rope_type": "yarn", "factor": "2"}}),
     ("field 'rope_parameters.full_attention.factor', value '2'", "must be a positive number")),
    (lambda c: c.update(rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 2,
                                                            "original_max_position_embeddings": "8192"}}),
     ("'rope_parameters.full_attention.original_max_position_embeddings', value '8192'",)),
    (lambda c: c.update(rope_scaling={"rope_type": "dynamic", "factor": 1e-9}),
     ("field 'rope_scaling.factor', value 1e-09", "scales the context of 131072 tokens to")),
    (lambda c: c.update(rope_scaling={"rope_type": "dynamic", "factor": 1e300}),
     ("field 'rope_scaling.factor', value 1e+300", "scales the context")),
])
def test_hf_config_refusals(tmp_path, edit, words):
    path = _config(tmp_path, edit)
    msg = refused(lambda: import_result(path), *words)
    assert msg.startswith(str(path))


def test_an_indexed_deepseek_config_needs_a_q_lora_rank(tmp_path):
    """q_lora_rank 0 made the indexer's wq_b a GEMM of width 0 (refused, but as the graph's field)."""
    path = _config(tmp_path, lambda c: c.update(q_lora_rank=0), folder="deepseek-ai--DeepSeek-V3.2")
    refused(lambda: import_result(path), "field 'q_lora_rank', value 0", "indexer's wq_b")
    dense = _config(tmp_path, lambda c: c.update(q_lora_rank=0), folder="deepseek-ai--DeepSeek-V3")
    assert "q_proj" in {n.get("role") for n in import_result(dense).doc["layer_kinds"]["attn_moe"]}


def test_hf_config_accepts_what_the_checks_leave_alone(tmp_path):
    ok = _config(tmp_path, _quant({"quant_method": "fp8", "ignore": ["re:.*lm_head"]}))
    assert import_result(ok).doc["weight_dtype"] == "fp8"
    nested = _config(tmp_path, lambda c: c.update(rope_parameters={"full_attention": {"factor": 2.0}}))
    assert import_result(nested).doc["max_model_len"] == 2 * 131072


@pytest.mark.parametrize("name", ["x: y", "123", "null", "#c", "- z", "two\nlines", "[x]", "a #b", 'say "q"',
                                  "plain-name.1", "ünï"])
def test_an_imported_graph_loads_back_whatever_its_name(tmp_path, name):
    """--name 'x: y' wrote `name: x: y`, a graph that did not load back (malformed YAML)."""
    res = import_result(HF / LLAMA, name=name)
    out = tmp_path / "g.yaml"
    out.write_text(graph_yaml(res))
    assert load_model_graph(out).name == name
    if name == "plain-name.1":
        assert "\nname: plain-name.1\n" in out.read_text()      # an ordinary name stays unquoted


def test_the_import_model_cli_writes_a_quoted_name(capsys, tmp_path):
    from jaxprice import cli
    out = tmp_path / "g.yaml"
    assert cli.main(["import-model", str(HF / LLAMA), "--name", "x: y", "--out", str(out)]) == 0
    capsys.readouterr()
    assert yaml.safe_load(out.read_text())["name"] == "x: y"


def test_an_inf_price_is_refused_never_printed():
    """The last guard of price and sweep: a step priced inf or NaN is refused naming it."""
    import numpy as np

    from jaxprice._src.cli_price import check_finite
    ok = np.ones((2, 5))
    check_finite(ok, np.ones(2), np.ones(2), labels=["a", "b"], what="batch")
    bad = ok.copy()
    bad[1, 2] = np.inf
    refused(lambda: check_finite(bad, np.ones(2), np.ones(2), labels=["a", "b"], what="batch"),
            "field 'batch', value 'b'", "not finite")
    refused(lambda: check_finite(ok, np.ones(2), np.array([1.0, np.nan]), labels=["p0", "p1"], what="grid point"),
            "'grid point', value 'p1'")


def test_an_output_onto_an_input_is_refused(capsys, tmp_path):
    """import-model --out config.json replaced the Hugging Face config with YAML; sweep --out onto the
    scenario replaced it with the CSV; --out and --heatmap on one path lost the CSV."""
    cfg = tmp_path / "config.json"
    cfg.write_text((HF / LLAMA / "config.json").read_text())
    before = cfg.read_text()
    assert_refused(capsys, ["import-model", str(tmp_path), "--out", str(tmp_path / "." / "config.json")],
                   "'--out'", "is the config being imported")
    assert cfg.read_text() == before
    scen = tmp_path / "s.yaml"
    scen.write_text(scenario_path(S).read_text())
    assert_refused(capsys, ["sweep", str(scen), "--decode", "1", "--context", "64", "--out", str(scen)],
                   "'--out'", "is the scenario file being priced")
    assert scen.read_text() == scenario_path(S).read_text()
    png = str(tmp_path / "g.png")
    assert_refused(capsys, ["sweep", S, "--out", png, "--heatmap", png], "'--out'", "is the --heatmap path too")


@pytest.mark.parametrize("index", ["0", 0.0, True])
def test_a_pool_index_that_is_not_an_integer_is_refused(index):
    """load_deployment(pool_index='0') raised TypeError; True priced pool 1's check as 'out of range'."""
    refused(lambda: load_deployment(S, pool_index=index), "field 'Deployment.pools'", f"value {index!r}",
            "expected an integer pool index")


def test_import_model_out_dash_is_stdout(capsys, tmp_path, monkeypatch):
    """--out - wrote a file named '-' (sweep's --out - is stdout)."""
    from jaxprice import cli
    monkeypatch.chdir(tmp_path)
    assert cli.main(["import-model", str(HF / LLAMA), "--out", "-"]) == 0
    assert capsys.readouterr().out.startswith("# Imported by `jaxprice import-model`")
    assert not (tmp_path / "-").exists()


def test_a_registry_environment_variable_naming_no_folder(capsys, tmp_path, monkeypatch):
    """JAXPRICE_REGISTRY=/nonexistent was reported as 'unknown chip (no entry under /nonexistent)'."""
    monkeypatch.setenv("JAXPRICE_REGISTRY", str(tmp_path / "nope"))
    assert_refused(capsys, ["price", S, "--decode", "1"], "'JAXPRICE_REGISTRY'", "nope", "is not a folder")


def test_a_long_value_is_described_not_pasted(tmp_path):
    """A 100000-item list where a number belongs made a 600 kB 'one-line' refusal."""
    batch = tmp_path / "b.yaml"
    batch.write_text(f"decode_threshold: {list(range(100000))}\nrequests: []\n")
    msg = refused(lambda: read_batch_file(batch), "value '<a list of 100000 items>'", "must be an integer")
    assert len(msg) < 300
    path = _config(tmp_path, lambda c: c.update(hidden_size=list(range(100000))))
    assert len(refused(lambda: import_result(path), "'hidden_size', value '<a list of 100000 items>'")) < 300
