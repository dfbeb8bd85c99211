"""The bundled registry/ and testdata/aisimulate/ are what registry/build.py makes of the
reference copies, and hold the figures and counts the reference states."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO.parent / "shared" / "reference"
REGISTRY = REPO / "registry"
CITE = re.compile(r"^[\w.-]+/[\w.-]+ \S+@[0-9a-f]{40}$")

EXPECTED_ENTRIES = {"cost-model-primitives": 140, "cost-model-collectives": 864,
                    "cost-model-attention": 60, "cost-model-recurrent": 36,
                    "cost-model-host-overheads": 7, "cost-model-memory": 14}


def load(path):
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


@pytest.mark.skipif(not REFERENCE.is_dir(),
                    reason=f"reference copies not present at {REFERENCE}; cannot regenerate")
def test_build_check_is_clean():
    proc = subprocess.run([sys.executable, str(REGISTRY / "build.py"), "--check", "-q"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_chips():
    doc = load(REGISTRY / "chips.yaml")
    assert doc["format"] == "jaxprice-chips/1"
    chips = doc["chips"]
    assert sorted(chips) == ["a100-80", "a100-sxm", "b200", "b300", "gb200-nvl72", "gb300",
                             "h100", "h200", "l40s"]
    h200 = chips["h200"]
    assert h200["bf16_tflops"] == 989.5
    assert h200["fp8_tflops"] == 1979.0
    assert h200["hbm_tbs"] == 4.8
    assert h200["sm_count"] == 132 and isinstance(h200["sm_count"], int)
    assert h200["tf32_tflops"] == 494.75
    assert chips["h100"]["sm_count"] is None          # not stated by the copied h100 file
    assert chips["a100-sxm"]["provenance"] is None
    assert chips["a100-80"]["fp8_tflops"] == 0        # stated 0 = no native FP8, not unknown
    assert "tf32_tflops" in doc["derived"]
    for name, c in chips.items():
        assert c["tf32_tflops"] == c["bf16_tflops"] / 2, name
        assert CITE.match(c["source"]), (name, c["source"])
    assert doc["networks"]["ib-400g"]["internode_gbps"] == 50
    assert set(doc["networks"]["ethernet-100gbe"]) == {"internode_gbps", "rdma", "source"}


IMPORTED_GRAPHS = {"qwen3-30b-a3b": "Qwen--Qwen3-30B-A3B"}    # catalog models with no graph upstream


def test_imported_graphs_equal_a_fresh_import_of_their_bundled_config():
    """qwen3-30b-a3b is in the public catalog (model.yaml, repo Qwen/Qwen3-30B-A3B) with no graph:
    its bundled graph is `jaxprice import-model` of the bundled config.json (testdata/hf, verbatim,
    SOURCES.md), byte for byte, and its identity matches the catalog's."""
    from jaxprice._src.hf import graph_yaml, import_result
    for name, folder in IMPORTED_GRAPHS.items():
        f = REGISTRY / "models" / f"{name}.yaml"
        cwd = os.getcwd()
        os.chdir(REPO)                            # the import records the config's path as given
        try:
            fresh = graph_yaml(import_result(f"testdata/hf/{folder}", name=name))
        finally:
            os.chdir(cwd)
        assert f.read_text() == fresh, name
        assert load(f)["hf_repo"] == folder.replace("--", "/")


def test_models():
    files = sorted((REGISTRY / "models").glob("*.yaml"))
    assert len(files) == 11 + len(IMPORTED_GRAPHS)
    built = [f for f in files if f.stem not in IMPORTED_GRAPHS]
    for f in built:
        doc = load(f)
        assert doc["format"] == "jaxprice-model/1" and doc["name"] == f.stem
        assert CITE.match(doc["source"]), f.name
        assert set(doc["stack"]) == {"prologue", "pattern", "repeat", "epilogue"}
        for part in ("prologue", "pattern", "epilogue"):
            assert all(k in doc["layer_kinds"] for k in doc["stack"][part]), f.name
    ds = load(REGISTRY / "models" / "deepseek-v3.yaml")
    assert ds["stack"]["repeat"] == 58
    assert ds["stack"]["prologue"] == ["attn_dense"] * 3
    assert list(ds["layer_kinds"]) == ["attn_dense", "attn_moe"]
    assert ds["hf_repo"] == "deepseek-ai/DeepSeek-V3"
    assert ds["speculator"]["method"] == "deepseek_mtp"
    assert ds["head"][-1] == {"op": "GEMM", "role": "lm_head", "n": 129280, "k": 7168}
    assert load(REGISTRY / "models" / "kimi-k2.5.yaml")["modality"] == "text_decoder_of_multimodal"
    assert load(REGISTRY / "models" / "llama-3.1-8b-instruct.yaml")["modality"] == "text_only"


@pytest.mark.parametrize("name,count", sorted(EXPECTED_ENTRIES.items()))
def test_coefficient_sets(name, count):
    doc = load(REGISTRY / "coefficients" / f"{name}.yaml")
    assert doc["format"] == "jaxprice-coefficients/1" and doc["name"] == name
    assert CITE.match(doc["source"])
    entries = doc["entries"]
    assert len(entries) == count
    for e in entries:
        for key in ("name", "value", "units", "scope", "cite"):
            assert key in e, (name, e.get("name"), key)
        assert not isinstance(e["value"], bool) and isinstance(e["value"], (int, float))
        assert CITE.match(e["cite"]), e["cite"]
        assert len(e.get("measured_on", "")) <= 200
        assert not {"rationale", "sources"} & set(e)


def test_coefficient_figures():
    att = load(REGISTRY / "coefficients" / "cost-model-attention.yaml")["entries"]
    first = att[0]
    assert (first["name"], first["value"], first["units"], first["scope"]) == (
        "attention_decode_floor", 13.5, "us_per_transfer", {"hardware": ["h200"]})
    mem = {e["name"]: e["value"] for e in
           load(REGISTRY / "coefficients" / "cost-model-memory.yaml")["entries"]}
    assert mem["cudagraph_capture_bytes_none"] == 0


def test_scenarios():
    files = sorted((REPO / "testdata" / "aisimulate").glob("*.yaml"))
    assert len(files) == 88
    for f in files:
        docs = list(yaml.safe_load_all(f.read_text(encoding="utf-8")))
        assert [d["kind"] for d in docs] == ["Scenario", "Deployment"], f.name
        assert docs[0]["name"] == docs[1]["name"] == f.stem
    sources = (REPO / "testdata" / "aisimulate" / "SOURCES.md").read_text(encoding="utf-8")
    rows = [l for l in sources.splitlines() if l.startswith("| `")]
    assert len(rows) == 88
    assert all(re.search(r"@[0-9a-f]{40} \|$", r) for r in rows)
