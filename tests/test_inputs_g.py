"""Malformed `jaxprice size` / jaxprice.size input a bug-bash found accepted (a nonsense or
mislabelled result, a silently dropped value, a run of minutes or many GB) now refused in one
line naming the field and value, exit 2, before anything is priced; and the Hugging Face
importer's FP8 ``ignored_layers``. Nothing here is jitted: every refusal comes before pricing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import jaxprice as jp
from clirefusal import assert_refused
from jaxprice._src import size as S
from jaxprice._src.client import Workload
from jaxprice._src.hf import import_result
from jaxprice._src.layouts import base_scenario, candidate_space, load_model
from jaxprice._src.resolve import resolve

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "testdata" / "hf"
MODEL = "llama-3.1-8b-instruct"
BASE = ["size", MODEL, "--chip", "h200", "--isl", "1024", "--osl", "256", "--evaluator", "steady", "--concurrency",
        "4,16", "--quiet", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192", "--graph-modes", "PIECEWISE"]
API = dict(chip="h200", isl=1024, osl=256, evaluator="steady", concurrency=(4, 16), max_num_seqs=(256,),
           max_num_batched_tokens=(8192,), cudagraph_modes=("PIECEWISE",))


def argv(extra, tmp_path):
    args = [a.format(d=tmp_path) for a in extra]
    return BASE + ([] if "--gpus" in args else ["--gpus", "1"]) + args


@pytest.mark.parametrize("extra,words", [
    # a billion GPUs used to be "1000000000 replica(s)"; 10**23 was rounded through float
    (["--gpus", "1e9"], ("'--gpus', value 1000000000", "at most 1048576")),
    (["--gpus", "99999999999999999999999"], ("value 99999999999999999999999", "at most 1048576")),
    # tp 3 on 4 GPUs used to be dropped without a word
    (["--gpus", "4", "--tp", "3,4"], ("'--tp', value 3", "no layout uses it", "do not divide the 4 GPUs")),
    # used to say "2 GPUs is not a multiple of any width"
    (["--gpus", "2", "--ep", "on"], ("'--ep', value 'on'", "has no MoE layer")),
    # int4 used to be priced as the bf16 checkpoint under an int4 label; nvfp4 on a chip without FP4
    (["--gpus", "2", "--weights", "int4"], ("'--weights', value 'int4'", "not a format vLLM serves", "bf16, fp8")),
    (["--gpus", "2", "--weights", "bf16,nvfp4"], ("'--weights', value 'nvfp4'", "on h200")),
    # a billion clients used to give TTFT 22129128844 ms; 100 000 levels ran for 5 minutes
    (["--concurrency", "1000000000"], ("'--concurrency', value 1000000000", "at most 26214")),
    (["--concurrency", "1,2,...,100"], ("100 concurrency levels", "at most 64")),
    (["--max-num-seqs", "99999999999"], ("'--max-num-seqs', value 99999999999", "token limit")),
    (["--max-num-batched-tokens", "99999999999"], ("'--max-num-batched-tokens'", "token limit")),
    (["--max-num-seqs", "1,2,...,1000", "--max-num-batched-tokens", "1000,2000,...,100000"],
     ("'candidates', value 200000", "more than the 10000")),
    (["--gpus-per-node", "99999999"], ("'--gpus-per-node'", "at most 65536")),
    # options the steady evaluator would ignore, and --verify past the runner-up
    (["--num-prompts", "100"], ("'--num-prompts', value 100", "none would run")),
    (["--simulate", "5"], ("'--simulate', value 5", "steady simulates nothing")),
    (["--search-prompts", "5"], ("'--search-prompts'", "--evaluator serve")),
    (["--verify", "3"], ("'--verify', value 3", "must be 0, 1")),
    (["--verify", "1", "--evaluator", "auto"], ("'--verify', value 1", "--evaluator auto")),
    # two outputs onto one file: the later used to overwrite the earlier
    (["--json", "{d}/x.out", "--write-scenario", "{d}/./x.out"], ("'--write-scenario'", "same file as --json")),
    # a scenario under a JSON's or an image's name is refused for its suffix first
    (["--json", "{d}/x.json", "--write-scenario", "{d}/x.json"], ("'--write-scenario'", "writes YAML, not JSON")),
    (["--plot", "{d}/p.png", "--write-scenario", "{d}/./p.png"], ("'--write-scenario'", "writes YAML, not an image")),
])
def test_size_refuses_in_one_line(capsys, tmp_path, extra, words):
    assert_refused(capsys, argv(extra, tmp_path), *words)


def test_size_refuses_a_model_folder_without_config_and_an_empty_name(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    rest = BASE[2:] + ["--gpus", "1"]
    assert_refused(capsys, ["size", str(tmp_path / "empty")] + rest, "'model'", "a folder without a config.json")
    assert_refused(capsys, ["size", ""] + rest, "'model', value ''", "an empty model name")


def test_size_refuses_an_output_onto_the_model_file(capsys, tmp_path):
    model = tmp_path / "m.yaml"
    model.write_text(Path(jp.Registry().model(MODEL).path).read_text())
    assert_refused(capsys, ["size", str(model)] + BASE[2:] + ["--gpus", "1", "--write-scenario", str(model)],
                   "'--write-scenario'", "same file as the MODEL file")
    assert model.read_text() == Path(jp.Registry().model(MODEL).path).read_text()


@pytest.mark.parametrize("extra,words", [
    # the serve search simulates every fitting layout: 144 layouts x 92 000 prompts used to run for hours
    (["--evaluator", "serve", "--concurrency", "20000,26000"], ("'--concurrency', value 26000", "cap of 4194304")),
    (["--evaluator", "auto", "--concurrency", "20000,26000"], ("'--concurrency'", "cap of 4194304")),
    (["--evaluator", "serve", "--search-prompts", "100", "--concurrency", "4,16,4000"],
     ("'--search-prompts'", "400000 prompts in one simulated run")),
    # dp 1 with expert parallelism only, and ep on 1 GPU: used to be dropped / misnamed as a GPU count
    (["--evaluator", "steady", "--ep", "on", "--tp", "1", "--dp", "1,8"], ("'--dp', value 1", "ep on")),
    (["--evaluator", "steady", "--ep", "on", "--tp", "1", "--dp", "1"], ("'--ep', value 'on'", "over one GPU is none")),
])
def test_size_refuses_a_simulation_past_its_caps_before_pricing(capsys, extra, words):
    assert_refused(capsys, ["size", "deepseek-v3", "--chip", "h200", "--gpus", "8", "--isl", "1024", "--osl", "256",
                            "--quiet"] + extra, *words)


@pytest.mark.parametrize("kw,field,reason", [
    (dict(gpus=10 ** 23), "gpus", "at most 1048576"),
    (dict(gpus=2, ep=["yes"]), "ep", "expected booleans"),
    (dict(gpus=1, concurrency="16"), "concurrency", "expected a list"),
    (dict(gpus=1, max_num_seqs=()), "max_num_seqs", "at least one value"),
    (dict(gpus=1, range_ratio="0.5"), "range_ratio", r"\(0, 1\]"),
    (dict(gpus=1, verify=True), "verify", "integer >= 0"),
    (dict(gpus=1, evaluator="auto", simulate="many"), "simulate", "integer >= 0"),
    (dict(gpus=1, evaluator="auto", num_prompts=10 ** 6), "num_prompts", "at most 262144"),
    (dict(gpus=1, isl=2 ** 24), "isl", "token limit"),
    # the CLI refused --verify beside auto or serve, the API ignored it
    (dict(gpus=1, evaluator="auto", verify=1), "verify", "simulates the frontier and the best already"),
    (dict(gpus=1, evaluator="serve", verify=2), "verify", "simulates the frontier and the best already"),
    # as the CLI's --simulate beside --evaluator steady (the API ignored it: no layout was re-run)
    (dict(gpus=1, evaluator="steady", simulate=4), "simulate", "'steady' simulates nothing"),
])
def test_the_api_refuses_in_one_line(kw, field, reason):
    with pytest.raises(jp.JaxpriceError, match=f"field '{field}'.*{reason}") as info:
        jp.size(MODEL, **(API | kw))
    assert "\n" not in str(info.value)


def test_a_value_listed_twice_is_one_layout():
    reg = jp.Registry()
    once = candidate_space(reg.model(MODEL), reg.chip("h200"), 1, max_num_seqs=(256,), max_num_batched_tokens=(8192,),
                           cudagraph_modes=("PIECEWISE",))
    twice = candidate_space(reg.model(MODEL), reg.chip("h200"), 1, max_num_seqs=(256, 256),
                            max_num_batched_tokens=(8192, 8192), cudagraph_modes=("PIECEWISE", "PIECEWISE"))
    assert twice == once and len(once) == 2          # bf16 and fp8


def test_the_miss_message_stays_short_for_a_tiny_target():
    lay = S.Layout(1, 1, False, "bf16", 256, 8192, "PIECEWISE")
    r = S.LayoutResult(0, lay, 1, np.array([4]), np.array([0.02]), np.array([0.005]), np.array([100.0]),
                       np.array([200.0]), np.array([4]))
    msg = S.miss_message([r], None, 1e-303)          # --tpot-ms 1e-300
    assert len(msg) < 300 and "TPOT 5.00 ms, 5e+300 x the 1e-300 ms target" in msg
    assert "TPOT 5.00 ms, 5e+03 x the 0.001 ms target" in S.miss_message([r], None, 1e-6)   # the value said once
    assert "TPOT 5.00 ms, 3 ms (150%) over the 2 ms target" in S.miss_message([r], None, 0.002)


@pytest.mark.parametrize("ratio", [1e-9, 0.5, 0.8, 1.0])
def test_the_steady_lengths_start_at_one_token_as_the_simulation_draws_them(ratio):
    """range_ratio 1e-9 gave the steady state prompts from 0 tokens while the client draws from 1."""
    w, c = S.SizeWorkload(1024, 256, ratio), Workload(isl=1024, osl=256, range_ratio=ratio)
    lo_i, lo_o = max(int(1024 * ratio), 1), max(int(256 * ratio), 1)
    assert w.mean_isl == (lo_i + 1024) / 2 and w.mean_osl == (lo_o + 256) / 2
    assert c.range_ratio == ratio and math.isfinite(w.mean_isl)


# ----------------------------------------------------------------------------- FP8 ignored_layers

def _fp8_llama(tmp_path, name, **keys):
    cfg = json.loads((HF / "meta-llama--Llama-3.1-8B-Instruct" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", **keys}
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _dtypes(doc, role):
    return [n.get("weight_dtype") for nodes in doc["layer_kinds"].values() for n in nodes if n.get("role") == role] + \
        [n.get("weight_dtype") for n in doc["head"] if n.get("role") == role]


IGNORED = ["lm_head"] + [f"model.layers.{i}.self_attn.o_proj" for i in range(32)]


def test_fp8_ignored_layers_keep_their_16_bit_weights(tmp_path):
    """vLLM's Fp8Config serves the layers in ``ignored_layers`` unquantized (as the importer
    already read ``modules_to_not_convert`` and compressed-tensors' ``ignore``): their nodes
    carry bf16, the weight bytes grow by their share, and the rest stays fp8."""
    plain = import_result(_fp8_llama(tmp_path, "plain"))
    ignored = import_result(_fp8_llama(tmp_path, "ignored", ignored_layers=IGNORED))
    legacy = import_result(_fp8_llama(tmp_path, "legacy", modules_to_not_convert=IGNORED))
    assert plain.doc["weight_dtype"] == ignored.doc["weight_dtype"] == "fp8"
    assert _dtypes(plain.doc, "o_proj") == [None] and _dtypes(plain.doc, "lm_head") == [None]
    assert _dtypes(ignored.doc, "o_proj") == ["bf16"] and _dtypes(ignored.doc, "lm_head") == ["bf16"]
    assert _dtypes(ignored.doc, "qkv_proj") == [None] and _dtypes(ignored.doc, "mlp_down") == [None]
    assert ignored.doc["layer_kinds"] == legacy.doc["layer_kinds"] and ignored.doc["head"] == legacy.doc["head"]
    # vLLM reads modules_to_not_convert only where ignored_layers is empty
    both = import_result(_fp8_llama(tmp_path, "both", ignored_layers=["lm_head"], modules_to_not_convert=IGNORED))
    assert _dtypes(both.doc, "lm_head") == ["bf16"] and _dtypes(both.doc, "o_proj") == [None]
    empty = import_result(_fp8_llama(tmp_path, "empty", ignored_layers=[], modules_to_not_convert=IGNORED))
    assert _dtypes(empty.doc, "o_proj") == ["bf16"]

    def weights(folder):
        graph, reg, _ = load_model(folder)
        scen = base_scenario(graph.name, "h200", tp=1, dp=1, ep=False, weights="fp8", graph=graph, name="t")
        return resolve(scen, reg).plan.memory["weights_bytes"]
    # o_proj (4096 x 4096 x 32 layers) and lm_head (128256 x 4096) at 2 bytes instead of 1
    grown = weights(tmp_path / "ignored") - weights(tmp_path / "plain")
    assert grown == pytest.approx(4096 * 4096 * 32 + 128256 * 4096, rel=1e-6)


def test_fp8_ignored_layers_must_be_a_list_of_names(tmp_path):
    folder = _fp8_llama(tmp_path, "bad", ignored_layers="lm_head")
    with pytest.raises(jp.JaxpriceError, match=r"field 'quantization_config.ignored_layers', value 'lm_head': "
                                               r"expected a list of module names"):
        import_result(folder)
