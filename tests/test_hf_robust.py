"""`jaxprice import-model` never shows a traceback: every config is imported or refused in one line
naming the file and the field (jaxprice/_src/hf.py), and ModelOpt MIXED_PRECISION checkpoints are
priced at each module's stored format.

The fuzz takes one shipped config per (family, quantization kind) of testdata/hf/, deletes each
key in turn and sets each value to a wrong type, a negative, zero, null, a fraction (one level into
nested mappings, the first element of lists too): config.json's keys (and its text_config's) on the
first unquantized config of each family, the quantization blocks (config.json's quantization_config,
hf_quant_config.json and its quantization mapping) on every one. It runs the importer in process
(import_result, then the graph check the CLI runs). Import only: no pricing, nothing jitted. (The
same fuzz over every shipped config and the 89 configs of the aiconfigurator-core 0.12.0 wheel, all
nesting levels, found one traceback, fixed: a list in Nemotron-H's layers_block_type.)
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from clirefusal import assert_refused, import_refused

from jaxprice import JaxpriceError
from jaxprice._src import hf
from jaxprice._src.cli_import_model import weights_summary

HF = Path(__file__).resolve().parents[1] / "testdata" / "hf"
QWEN36 = "nvidia--Qwen3.6-35B-A3B-NVFP4"
V4 = "nvidia--DeepSeek-V4-Flash-NVFP4"
M3 = "MiniMaxAI--MiniMax-M3"


def _load(folder, name="config.json"):
    path = HF / folder / name
    return json.loads(path.read_text()) if path.exists() else None


def _representatives():
    """One folder per (family, quantization kind): hf_quant_config.json (by quant_algo), a config.json
    quantization_config (by method), none; each with whether its config.json keys are fuzzed (the
    first unquantized one of its family: the others' config keys are their family's, their quantization is fuzzed).
    Architectures the importer does not know are left out (their refusal is tested in test_hf.py)."""
    picked = {}
    for cfg_path in sorted(HF.glob("*/config.json")):
        cfg = json.loads(cfg_path.read_text())
        arch = (cfg.get("architectures") or [None])[0]
        if arch not in hf.ARCHITECTURES:
            continue
        qc = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config")
        hq = _load(cfg_path.parent.name, "hf_quant_config.json")
        qkind = (f"hf-{(hq.get('quantization') or {}).get('quant_algo')}" if hq is not None
                 else f"qc-{qc.get('quant_method')}" if isinstance(qc, dict) else "none")
        picked.setdefault((hf.ARCHITECTURES[arch][0], qkind), cfg_path.parent.name)
    families = {}
    for (family, _), folder in sorted(picked.items(), key=lambda x: (x[0][1] != "none", x[1])):
        families.setdefault(family, folder)         # an unquantized one where the family has one
    return {folder: folder in families.values() for folder in sorted(picked.values())}


REPS = _representatives()


def _mutations(doc, deep=True, keys=None):
    """(label, mutated copy) for each key of a mapping: deleted; a number as a string, -1, 0, null, a
    fraction; a list, mapping, string or bool as null, a number, a string, empty; one level into a
    mapping (deep); a list's first element wrong, the list one shorter."""
    for k in doc if keys is None else keys:
        v = doc[k]
        yield f"del {k}", {x: y for x, y in doc.items() if x != k}
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            wrong = (("str", str(v)), ("-1", -1), ("0", 0), ("null", None),
                     ("fraction", v + 0.5 if isinstance(v, int) else v / 3))
        else:
            wrong = (("null", None), ("int", 3), ("str", "x")) + ((("empty", type(v)()),)
                                                                  if isinstance(v, (list, dict)) else ())
        for label, new in wrong:
            yield f"{k}={label}", dict(doc, **{k: new})
        if deep and isinstance(v, dict):
            # a long mapping (quantized_layers, a per-module list) by its first entries: alike
            for label, sub in _mutations(v, deep=False, keys=list(v)[:3] if len(v) > 12 else None):
                yield f"{k}.{label}", dict(doc, **{k: sub})
        if deep and isinstance(v, list) and v:
            for label, new in (("str", "x"), ("-1", -1), ("null", None), ("fraction", 0.5), ("list", [1])):
                yield f"{k}[0]={label}", dict(doc, **{k: [new] + v[1:]})
            yield f"{k}[:-1]", dict(doc, **{k: v[:-1]})


def _cases(folder):
    cfg, q = _load(folder), _load(folder, "hf_quant_config.json")
    if REPS.get(folder, True):
        cases = [(label, c, q) for label, c in _mutations(cfg)]
        text = cfg.get("text_config")
        if isinstance(text, dict):     # the text decoder's keys (one level deeper than _mutations goes)
            cases += [(f"text_config.{label}", dict(cfg, text_config=c), q) for label, c in _mutations(text)]
    else:                               # its quantization_config (the top level's, else the text model's)
        where = "text_config" if "quantization_config" not in cfg and "text_config" in cfg else None
        text = cfg[where] if where else cfg
        qc = text.get("quantization_config")
        cases = [(f"quantization_config {label}", dict(cfg, **{where: dict(text, quantization_config=c)})
                  if where else dict(cfg, quantization_config=c), q)
                 for label, c in _mutations(qc)] if isinstance(qc, dict) else []
    if q is not None:
        cases += [(f"hf_quant_config {label}", cfg, c) for label, c in _mutations(q)]
        quant = q.get("quantization")
        if isinstance(quant, dict):
            cases += [(f"hf_quant_config quantization.{label}", cfg, dict(q, quantization=c))
                      for label, c in _mutations(quant)]
    return cases


def _fuzz(monkeypatch, folder):
    """Each case of ``folder`` run as import_result reads it (its files' documents replaced in
    process, nothing written), then the graph check the CLI runs: the (case, error) pairs that
    raised something other than a JaxpriceError, and those refused in other than one line that
    starts with the file and names a field."""
    docs = {}
    monkeypatch.setattr(hf, "_read_json", lambda path, what: (copy.deepcopy(
        docs["q" if Path(path).name == "hf_quant_config.json" else "cfg"]), "0" * 64))
    tracebacks, unnamed = [], []
    for label, cfg, q in _cases(folder):
        docs.update(cfg=cfg, q=q)
        try:
            res = hf.import_result(HF / folder, name="fuzzed")
            hf.graph_from_doc(res.doc, res.config_path)
        except JaxpriceError as err:
            msg = str(err)
            if "\n" in msg or not err.file or not err.field or not msg.startswith(str(HF / folder)):
                unnamed.append((label, msg))
        except Exception as err:        # noqa: BLE001 - the defect this test looks for
            tracebacks.append((label, f"{type(err).__name__}: {err}"))
    return tracebacks, unnamed


def test_the_fuzz_covers_every_family_and_each_quantization_kind():
    families = {hf.ARCHITECTURES[_load(f)["architectures"][0]][0] for f in REPS}
    assert {"dense", "qwen_dense", "moe", "qwen_moe", "deepseek", "dsa", "deepseek_v4", "gpt_oss", "minimax_m2",
            "minimax_m3", "qwen_hybrid", "qwen3_vl", "qwen3_vl_moe", "llama4", "mimo", "nemotron_h"} <= families
    assert {QWEN36, V4} <= set(REPS)        # the MIXED_PRECISION files are fuzzed too
    assert sum(len(_cases(f)) for f in REPS) > 3000


@pytest.mark.parametrize("folder", REPS)
def test_every_malformed_config_is_imported_or_refused_in_one_line(monkeypatch, folder):
    tracebacks, unnamed = _fuzz(monkeypatch, folder)
    assert not tracebacks, tracebacks[:5]
    assert not unnamed, unnamed[:5]


def test_the_fuzz_finds_a_traceback(monkeypatch):
    """The harness reports an importer crash on a malformed key (a KeyError where intermediate_size
    is missing, as MiniMax-M3 NVFP4's layout raised) and a refusal that names no field."""
    family = hf.FAMILIES["qwen_dense"]

    def fragile(r, arch, act):
        if r.cfg.get("intermediate_size") is None:
            raise KeyError("intermediate_size")
        if r.cfg.get("rms_norm_eps") == 0:          # a key the importer does not read
            hf.refuse("no field named")
        return family(r, arch, act)
    monkeypatch.setitem(hf.FAMILIES, "qwen_dense", fragile)
    tracebacks, unnamed = _fuzz(monkeypatch, "Qwen--Qwen3-8B")
    assert [x for x, _ in tracebacks] == ["del intermediate_size", "intermediate_size=null"]
    assert unnamed == [("rms_norm_eps=0", "no field named")]


# ----------------------------------------------------------------------------- MiniMax-M3 NVFP4 layout

def _m3_nested(tmp_path, drop=("moe_intermediate_size",)):
    """MiniMax-M3's config in the layout of nvidia/MiniMax-M3-NVFP4: the text decoder nested in
    text_config under MiniMaxM3SparseForConditionalGeneration, no moe_intermediate_size."""
    cfg = _load(M3)
    text = {k: v for k, v in cfg.items() if k not in drop}
    text["architectures"] = ["MiniMaxM3SparseForCausalLM"]
    out = tmp_path / "nvidia--MiniMax-M3-NVFP4"
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"architectures": ["MiniMaxM3SparseForConditionalGeneration"],
                                                 "text_config": text, "vision_config": {"hidden_size": 1280},
                                                 "torch_dtype": "bfloat16"}))
    return out


def test_minimax_m3_nvfp4_layout_imports_with_the_experts_intermediate_size_wide(tmp_path):
    # vLLM's MiniMaxM3MoE builds the routed experts config.intermediate_size wide (3072 here)
    stock = hf.import_result(HF / M3).doc
    nested = hf.import_result(_m3_nested(tmp_path)).doc
    assert nested["modality"] == "text_decoder_of_multimodal"
    assert nested["layer_kinds"] == stock["layer_kinds"] and nested["stack"] == stock["stack"]
    experts = [n for n in nested["layer_kinds"]["sparse_attn_moe"] if n["op"] == "GroupedGEMM"]
    assert experts[0]["n"] == _load(M3)["intermediate_size"] == 3072
    # neither width stated: refused naming the key, not a KeyError
    import_refused(_m3_nested(tmp_path / "b", drop=("moe_intermediate_size", "intermediate_size")) / "config.json",
                   "text_config.moe_intermediate_size", None, "required key is missing")


def test_a_family_without_a_dense_width_refuses_a_missing_expert_width(tmp_path):
    cfg = _load("deepseek-ai--DeepSeek-V4-Flash")
    del cfg["moe_intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    import_refused(tmp_path / "config.json", "moe_intermediate_size", None, "required key is missing")


# ----------------------------------------------------------------------------- MIXED_PRECISION

def _gemms(doc, kind):
    return {n["role"]: n.get("weight_dtype", doc["weight_dtype"]) for n in doc["layer_kinds"][kind]
            if n["op"] in ("GEMM", "GroupedGEMM")}


def test_mixed_precision_prices_each_op_at_its_listed_format():
    # nvidia/Qwen3.6-35B-A3B-NVFP4: attention and the GDN out_proj FP8, experts, shared expert and
    # lm_head W4A16_NVFP4 (stored NVFP4); the MTP modules excluded
    res = hf.import_result(HF / QWEN36)
    d = res.doc
    assert d["weight_dtype"] == "fp8"           # most non-expert weights
    assert _gemms(d, "attn_moe") == {"qkv_proj": "fp8", "o_proj": "fp8", "experts": "nvfp4"}
    assert _gemms(d, "gdn_moe") == {"mixer_out": "fp8", "experts": "nvfp4"}
    assert d["head"][1]["weight_dtype"] == "nvfp4"
    notes = "\n".join(res.inferred)
    assert "ModelOpt MIXED_PRECISION (291 modules listed: 161 nvfp4, 130 fp8)" in notes
    assert "MIXED_PRECISION weights per op (quantized_layers; unlisted modules unquantized): mixer_out fp8, " \
           "experts nvfp4, qkv_proj fp8, o_proj fp8, lm_head nvfp4" in notes
    summary = weights_summary(hf.graph_from_doc(d, res.config_path))
    assert summary == "weights nvfp4 for experts, lm_head; fp8 for the rest"


def test_mixed_precision_overrides_expert_dtype_and_leaves_unlisted_modules_unquantized():
    # nvidia/DeepSeek-V4-Flash-NVFP4 lists only the routed experts (NVFP4); attention, shared
    # experts and head are excluded (and unlisted): bf16. Its config.json still says expert_dtype fp4.
    res = hf.import_result(HF / V4)
    d = res.doc
    assert d["weight_dtype"] == "bf16"
    for kind in d["layer_kinds"]:
        g = _gemms(d, kind)
        assert g["experts"] == "nvfp4" and g["qkv_proj"] == "bf16" and g["o_proj"] == "bf16", kind
        assert g["shared_expert_gate_up"] == g["shared_expert_down"] == "bf16", kind
    assert "weight_dtype" not in d["head"][1]          # bf16, the graph's
    assert any("routed experts nvfp4 as" in x and "(not the config's mxfp4)" in x for x in res.inferred)
    plain = hf.import_result(HF / "deepseek-ai--DeepSeek-V4-Flash").doc       # the original: expert_dtype fp4
    assert {n.get("weight_dtype") for k in plain["layer_kinds"].values() for n in k if n["op"] == "GroupedGEMM"} \
        == {"mxfp4"}


def _qwen36(tmp_path, edit):
    cfg, q = _load(QWEN36), _load(QWEN36, "hf_quant_config.json")
    edit(q["quantization"])
    out = tmp_path / QWEN36
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "hf_quant_config.json").write_text(json.dumps(q))
    return out


def test_mixed_precision_exclusions_unlisted_modules_and_per_layer_formats(tmp_path):
    L = "model.language_model.layers"
    # an unlisted module (vLLM: UnquantizedLinearMethod) and an excluded one stay at bf16
    d = hf.import_result(_qwen36(tmp_path / "a", lambda q: q["quantized_layers"].pop("lm_head"))).doc
    assert d["head"][1]["weight_dtype"] == "bf16"
    d = hf.import_result(_qwen36(tmp_path / "b", lambda q: q["exclude_modules"].append("lm_head"))).doc
    assert d["head"][1]["weight_dtype"] == "bf16"
    # one layer stored differently becomes its own kind, noted
    def layer3(q):
        for p in ("q_proj", "k_proj", "v_proj"):
            q["quantized_layers"][f"{L}.3.self_attn.{p}"] = {"quant_algo": "NVFP4", "group_size": 16}
    res = hf.import_result(_qwen36(tmp_path / "c", layer3))
    seq = hf.graph_from_doc(res.doc, res.config_path).expanded_stack()
    assert seq[3] == "attn_moe_mixed0" and seq[7] == "attn_moe"
    assert _gemms(res.doc, "attn_moe_mixed0")["qkv_proj"] == "nvfp4"
    assert any("layers [3] store their weights at other formats (qkv_proj nvfp4)" in x for x in res.inferred)


@pytest.mark.parametrize("edit,field,reason", [
    (lambda q: q.pop("quantized_layers"), "quantization.quantized_layers", "MIXED_PRECISION needs a non-empty"),
    (lambda q: q.update(quantized_layers={}), "quantization.quantized_layers", "MIXED_PRECISION needs a non-empty"),
    (lambda q: q["quantized_layers"].update(lm_head={"quant_algo": "INT3"}),
     "quantization.quantized_layers.lm_head.quant_algo", "unsupported quantization"),
    (lambda q: q["quantized_layers"].update(lm_head="NVFP4"), "quantization.quantized_layers.lm_head",
     "expected a mapping with a quant_algo name"),
    (lambda q: q["quantized_layers"].update(lm_head={"group_size": 16}),
     "quantization.quantized_layers.lm_head.quant_algo", "expected a mapping with a quant_algo name"),
])
def test_malformed_mixed_precision_is_refused_naming_the_module(tmp_path, edit, field, reason):
    with pytest.raises(JaxpriceError) as info:
        hf.import_result(_qwen36(tmp_path, edit))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(tmp_path / QWEN36 / "hf_quant_config.json")), msg
    assert f"field '{field}'" in msg and reason in msg, msg


def test_cli_summary_names_the_expert_format_of_an_nvfp4_checkpoint(tmp_path, capsys):
    from jaxprice.cli import main
    out = tmp_path / "g.yaml"
    assert main(["import-model", str(HF / "nvidia--GLM-5-NVFP4"), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "weight_dtype: \"bf16\"" in out.read_text()             # the graph: most non-expert weights
    assert "weights nvfp4 for mlp_gate_up, mlp_down, experts; bf16 for the rest" in err, err
    assert main(["import-model", str(HF / "Qwen--Qwen3-8B"), "--out", str(out)]) == 0
    assert "layers, weights bf16);" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    cfg = _load("Qwen--Qwen3-8B")
    cfg["num_hidden_layers"] = "36"
    (bad / "config.json").write_text(json.dumps(cfg))
    assert_refused(capsys, ["import-model", str(bad), "--out", str(out)], "field 'num_hidden_layers'",
                   "expected an integer")
