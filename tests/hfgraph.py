"""Helpers the imported-graph tests share (test_hf_families*.py): the bundled configs' folder, a
graph's layer sequence, one node by op and role, the parameters a graph implies, and a config
written to a temporary folder."""
from __future__ import annotations

import json
from pathlib import Path

from jaxprice._src.hf import graph_from_doc

HF = Path(__file__).resolve().parents[1] / "testdata" / "hf"


def seq(doc):
    """The graph's layer kinds, one per layer, in order."""
    return graph_from_doc(doc, "x").expanded_stack()


def node(nodes, op, role=None):
    """The one node of ``op`` (and ``role``) among ``nodes``."""
    found = [n for n in nodes if n["op"] == op and n.get("role") == role]
    assert len(found) == 1, (op, role, nodes)
    return found[0]


def params(doc):
    """(total, active) parameters the graph implies: its GEMMs, its experts (3 n k each, the
    active ones top_k of them plus the shared), the lm_head, and the embedding where untied."""
    total = active = 0
    for kid in seq(doc):
        for n in doc["layer_kinds"][kid]:
            if n["op"] == "GEMM":
                total += n["n"] * n["k"]
                active += n["n"] * n["k"]
            elif n["op"] == "GroupedGEMM":
                per = 3 * n["n"] * n["k"]
                shared = 3 * (n.get("shared_intermediate_size") or n["n"]) * n["k"] * n.get("shared_experts", 0)
                total += per * n["experts"] + shared
                active += per * n["top_k"] + shared
    head = doc["vocab_size"] * doc["hidden_size"]
    emb = 0 if doc["tie_word_embeddings"] else head
    return total + head + emb, active + head + emb


def cfg(folder):
    """A bundled config.json, parsed."""
    return json.loads((HF / folder / "config.json").read_text())


def write(tmp_path, name, config):
    """``config`` written as tmp_path/name/config.json; its path."""
    p = tmp_path / name
    p.mkdir(parents=True, exist_ok=True)
    (p / "config.json").write_text(json.dumps(config))
    return p / "config.json"


def check_prices_decode(folder, chip, tp, capsys):
    """`jaxprice price CONFIG --chip CHIP --tp TP --decode 1,8` exits 0 with finite, non-negative
    times on both rows and a positive NoOverlap."""
    import re

    from jaxprice.cli import main
    assert main(["price", str(HF / folder), "--chip", chip, "--tp", str(tp), "--decode", "1,8"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+(1|8)\s", line)]
    assert [r[0] for r in rows] == ["1", "8"], out
    for r in rows:
        times = [float(x) for x in r[3:-1]]
        assert all(x >= 0 and x == x and x != float("inf") for x in times) and float(r[-3]) > 0, out
