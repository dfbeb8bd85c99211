"""Tiny synthetic registries for tests whose expected prices are derived by hand.

``deployment(root, kinds=...)`` writes a project-format registry under ``root`` (one chip file
with two parts, one model graph, a base coefficient set plus an optional extra set that
overrides it by name, and a scenario) and returns ``load_deployment(scenario,
registry_roots=[root])``. Every figure is round, so a test can write the expected price as
plain arithmetic:

* chips: ``hopper`` (BF16 100, FP8 200, TF32 50 TFLOP/s; no four-bit peak) and ``blackwell``
  (the same plus NVFP4 400 TFLOP/s); both 2 TB/s of HBM, 8 GPUs per node. ``rack`` is
  ``blackwell`` in a 72-GPU NVLink rack of 4-GPU nodes.
* base coefficients (``BASE``): hbm_derate 0.5 (so HBM reads run at exactly 1e12 B/s); GEMM
  ramps with m_half 100 tokens everywhere (so at T = 100 tokens every efficiency is exactly
  half its eps_max): bf16 0.5, fp8 0.8, fp8_block 0.6, nvfp4 0.4; collectives for 2, 4, 8 and
  16 ranks with t0 10 us, r_t 1e5 B/us, r_peak 2e5 B/us; host replay 10 us, eager 3 us per
  layer, dispatch 1 us per kernel. No attention, recurrent, mHC or prefill-form coefficient
  is in the base set: a test adds the ones it prices.

Constants in SI units (``BF16``, ``HBM`` ...) are exported for the hand derivations.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

import jaxprice as jp

HIDDEN = 1024
VOCAB = 8192

# rates in SI units, for hand derivations
BF16, FP8, TF32, NVFP4 = 100e12, 200e12, 50e12, 400e12     # FLOP/s
HBM = 2e12 * 0.5                                             # B/s: hbm_tbs 2.0 x derate 0.5
EPS = {"bf16": 0.5, "fp8": 0.8, "fp8_block": 0.6, "nvfp4": 0.4}
M_HALF = 100.0
COLL_FLOOR, COLL_TRANS, COLL_PEAK = 10e-6, 1e11, 2e11       # s, B/s, B/s
REPLAY, EAGER_LAYER, PER_KERNEL = 10e-6, 3e-6, 1e-6          # s

CHIPS = {
    "hopper": {"bf16_tflops": 100.0, "fp8_tflops": 200.0, "nvfp4_tflops": None, "tf32_tflops": 50.0,
               "hbm_tbs": 2.0, "memory_gib": 80.0, "nvlink_gbps": 400.0, "sm_count": 100,
               "gpus_per_node": 8, "gpus_per_rack": None, "rack_gbps": None},
    "blackwell": {"bf16_tflops": 100.0, "fp8_tflops": 200.0, "nvfp4_tflops": 400.0, "tf32_tflops": 50.0,
                  "hbm_tbs": 2.0, "memory_gib": 180.0, "nvlink_gbps": 400.0, "sm_count": 100,
                  "gpus_per_node": 8, "gpus_per_rack": None, "rack_gbps": None},
    "rack": {"bf16_tflops": 100.0, "fp8_tflops": 200.0, "nvfp4_tflops": 400.0, "tf32_tflops": 50.0,
             "hbm_tbs": 2.0, "memory_gib": 180.0, "nvlink_gbps": 400.0, "sm_count": 100,
             "gpus_per_node": 4, "gpus_per_rack": 72, "rack_gbps": 400.0},
}
NETWORKS = {"fabric": {"internode_gbps": 50.0}}              # nvlink 400 / 50: span ratio 8


def ramp(tokens, fmt="bf16", eps_max=None, m_half=M_HALF):
    """The efficiency law, written out for hand derivations: eps_max * m / (m + m_half)."""
    e = EPS[fmt] if eps_max is None else eps_max
    return e * tokens / (tokens + m_half)


def collective(nbytes, floor=COLL_FLOOR, trans=COLL_TRANS, peak=COLL_PEAK):
    """One launch of the base set's collective: max(t0 + b/r_t, b/r_peak)."""
    return max(floor + nbytes / trans, nbytes / peak)


def base_coefficients(chips=tuple(CHIPS)):
    """(name, value, units) of the base set, in the registry's own units."""
    out = [("hbm_derate", 0.5, "dimensionless")]
    for sfx, e in EPS.items():
        out += [(f"gemm_eps_max_{sfx}", e, "dimensionless"), (f"gemm_m_half_{sfx}", M_HALF, "tokens")]
    for chip in chips:
        for op in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
            for n in (2, 4, 8, 16):
                out += [(f"collective_floor_{op}_fp16_{n}rank_{chip}", 10.0, "us_per_transfer"),
                        (f"collective_transition_rate_{op}_fp16_{n}rank_{chip}", 1e5, "bytes_per_us"),
                        (f"collective_peak_rate_{op}_fp16_{n}rank_{chip}", 2e5, "bytes_per_us")]
    out += [("host_replay_graph_per_step", 10.0, "us_per_step"),
            ("host_launch_eager_per_layer", 3.0, "us_per_layer"),
            ("host_launch_per_kernel", 1.0, "us_per_transfer")]
    return out


BASE = base_coefficients()


def _dump(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _entry(item, hardware):
    name, value, units, *rest = item
    scope = rest[0] if rest else {"hardware": list(hardware)}
    return {"name": name, "value": value, "units": units, "scope": scope}


def deployment(root, *, kinds, stack=None, head=(), speculator=None, capture_breaks=None,
               hidden=HIDDEN, vocab=VOCAB, weight_dtype="bf16", model="synth", chip="hopper",
               coefficients=(), drop=(), tp=1, dp=1, ep=False, engine=None, cluster=None,
               name="synth") -> jp.Deployment:
    """Write a registry and a scenario under ``root`` and resolve it.

    kinds: {kind id: [node dicts]} (public node keys plus the project's extensions);
    stack: {prologue, pattern, repeat, epilogue} (default: every kind once, in order);
    coefficients: extra (name, value, units[, scope]) entries, in registry units, in a second
    set that overrides the base set by name (scope defaults to every synthetic chip);
    drop: base names to leave out; engine / cluster: scenario fields over the defaults
    (cache bfloat16, block 16, max_num_seqs 64, PIECEWISE, 8 GPUs per node, fabric ``fabric``).
    """
    root = Path(root)
    stack = stack or {"pattern": list(kinds), "repeat": 1}
    stack = {"prologue": [], "pattern": [], "repeat": 0, "epilogue": [], **stack}
    graph = {"format": "jaxprice-model/1", "name": model, "hidden_size": hidden, "vocab_size": vocab,
             "tie_word_embeddings": False, "weight_dtype": weight_dtype, "modality": "text_only",
             "layer_kinds": {k: list(v) for k, v in kinds.items()}, "stack": stack, "head": list(head)}
    if speculator is not None:
        graph["speculator"] = speculator
    if capture_breaks:
        graph["capture_breaks"] = dict(capture_breaks)
    _dump(root / "models" / f"{model}.yaml", graph)
    _dump(root / "chips.yaml", {"format": "jaxprice-chips/1", "chips": CHIPS, "networks": NETWORKS})
    hardware = list(CHIPS)
    _dump(root / "coefficients" / "synth-base.yaml", {
        "format": "jaxprice-coefficients/1", "name": "synth-base", "source": "tests/synthetic.py",
        "entries": [_entry(e, hardware) for e in BASE if e[0] not in set(drop)]})
    sets = ["synth-base"]
    if coefficients:
        _dump(root / "coefficients" / "synth-extra.yaml", {
            "format": "jaxprice-coefficients/1", "name": "synth-extra", "source": "tests/synthetic.py",
            "entries": [_entry(e, hardware) for e in coefficients]})
        sets.append("synth-extra")
    eng = {"cache_dtype": "bfloat16", "block_size": 16, "max_num_seqs": 64, "cudagraph_mode": "PIECEWISE"}
    eng.update(engine or {})
    clu = {"hardware": chip, "fabric": "fabric", "nodes": 1, "gpus_per_node": 8}
    clu.update(cluster or {})
    scen = {"kind": "Scenario", "name": name, "engine_version": "0.31.0", "model": model,
            "coefficients": sets, "cluster": clu}
    dep = {"kind": "Deployment", "name": name, "pools": [{
        "role": "colocated", "nodes": clu.get("nodes", 1),
        "parallel": {"tp": tp, "pp": 1, "dp": dp, "enable_expert_parallel": ep}, "engine": eng}]}
    path = root / "scenario.yaml"
    path.write_text(yaml.safe_dump_all([scen, dep], sort_keys=False))
    return jp.load_deployment(path, registry_roots=[root])


PAD = 64   # one padding for every batch: each plan compiles once


def batch(rows, threshold=1, pad_to=PAD):
    """A Batch from (scheduled, computed) pairs, padded to PAD rows."""
    rows = list(rows)
    return jp.Batch.from_requests([s for s, _ in rows], [c for _, c in rows],
                                  pad_to=pad_to, decode_threshold=threshold)


def decode(n, context, threshold=1, tokens=1):
    """n decode rows of `tokens` each, `context` tokens in cache after the step."""
    return batch([(tokens, context - tokens)] * n, threshold=threshold)


def price(dep, rows_or_batch, threshold=1, coefs=None, **overrides):
    """The jitted price with its per-layer breakdown (exact mode); overrides: coefficient
    values in SI units by name."""
    b = rows_or_batch if isinstance(rows_or_batch, jp.Batch) else batch(rows_or_batch, threshold)
    c = dep.coefficients if coefs is None else coefs
    if overrides:
        c = c.replace(**overrides)
    return jp.price(dep.plan, c, b, breakdown=True)


def kind_index(dep, kind):
    return dep.plan.layer_kind_names.index(kind)


def layer(res, dep, kind, resource):
    """A layer kind's share (times its count) of one resource in a breakdown."""
    return float(np.asarray(res.layers[resource])[kind_index(dep, kind)])


def totals(res):
    """The five resource totals as a dict of floats."""
    r = np.asarray(res.resources)
    return {name: float(r[i]) for i, name in enumerate(jp.RESOURCES)}
