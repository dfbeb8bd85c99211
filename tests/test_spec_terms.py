"""Every term of pricing-a-step.md on small synthetic graphs and round coefficients.

The reference data (the bundled registry and the 88 scenarios) cannot exercise most of the
spec: no graph there marks a node replicated or prefill-only, states mHC, a parallel-block
drafter or capture breaks, and no set carries a measured prefill form, a recurrent prefill
rate or a grouped four-bit ramp. Each test here builds a tiny registry (tests/synthetic.py),
prices one batch, and asserts the price of one term, written out by hand from the formula in
pricing-a-step.md (and reference-kernel.md where the spec leaves a detail open): GEMM
arithmetic and formats, replicated nodes, HBM, attention in both phases, mHC, recurrent
mixers, classification by the decode threshold, speculative decoding, experts, collectives,
the head and host time (graph modes, ceiling, capture breaks, phase markers). Most also
inflate one coefficient and assert exactly which outputs move. Every price taken here also
checks that the per-layer-kind breakdown adds up to the five totals and composes into
Overlap and NoOverlap (``check_breakdown``).

Figures used throughout (see tests/synthetic.py): BF16 100, FP8 200, TF32 50, NVFP4 400
TFLOP/s; HBM 2 TB/s x derate 0.5 = 1e12 B/s; every ramp has m_half = 100 tokens, so at
T = 100 tokens each efficiency is half its eps_max (bf16 0.5, fp8 0.8, fp8_block 0.6,
nvfp4 0.4); collectives t0 10 us, r_t 1e5 B/us, r_peak 2e5 B/us; host replay 10 us, eager
3 us per layer, dispatch 1 us per kernel; hidden 1024.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import synthetic as syn
from synthetic import BF16, FP8, HBM, NVFP4, TF32, layer, totals
from jaxprice import JaxpriceError

REL = 1e-12
H = syn.HIDDEN


def approx(x):
    return pytest.approx(x, rel=REL, abs=1e-18)


def price(dep, rows_or_batch, threshold=1, coefs=None, **overrides):
    """synthetic.price, and on every result the per-layer-kind breakdown adds up to the
    totals and composes into Overlap (pricing-a-step.md, 'Composing the step')."""
    res = syn.price(dep, rows_or_batch, threshold, coefs, **overrides)
    check_breakdown(res)
    return res


def check_breakdown(res):
    L = {k: np.asarray(v) for k, v in res.layers.items()}
    t = np.asarray(res.resources)
    parts = [L["sm"].sum() + L["expert_sm"].sum() + L["head_sm"], L["hbm"].sum() + L["expert_hbm"].sum() + L["head_hbm"],
             L["nvlink"].sum(), L["nic"].sum()]
    for i, part in enumerate(parts):
        assert part == pytest.approx(t[i], rel=1e-12, abs=1e-18), i
    # stage = max(SM, HBM, NVLink, NIC) + experts, per kind (times its count)
    stage = np.max(np.stack([L["sm"], L["hbm"], L["nvlink"], L["nic"]]), axis=0) + L["expert_sm"] + L["expert_hbm"]
    np.testing.assert_allclose(L["stage"], stage, rtol=1e-12, atol=1e-18)
    composed = L["stage"].sum() + max(L["head_sm"], L["head_hbm"]) + t[4]
    assert float(res.overlap) == pytest.approx(min(composed, float(res.no_overlap)), rel=1e-12, abs=1e-18)
    assert float(res.no_overlap) == pytest.approx(t.sum(), rel=1e-12, abs=1e-18)


def moved(a, b):
    """Which of the five resources differ between two results."""
    ta, tb = totals(a), totals(b)
    return {k for k in ta if not math.isclose(ta[k], tb[k], rel_tol=1e-12, abs_tol=0.0)}


def gemm(n, k, **kw):
    return {"op": "GEMM", "n": n, "k": k, **kw}


def prefill(tokens, computed=0):
    """One prefill row (threshold 1)."""
    return [(tokens, computed)]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    counter = iter(range(10 ** 6))

    def make(**kw):
        return syn.deployment(tmp_path_factory.mktemp(f"reg{next(counter)}"), **kw)
    return make


# ============================================================================ GEMM arithmetic


@pytest.fixture(scope="module")
def ramp_dep(root):
    # a column-parallel GEMM (K = hidden, N != hidden: N is split) and a row-parallel one, tp 2
    return root(kinds={"g": [gemm(4096, H), gemm(H, 4096)]}, tp=2)


def test_gemm_arithmetic_at_the_efficiency_ramp(ramp_dep):
    for T in (100, 300, 7):
        r = price(ramp_dep, prefill(T))
        eps = 0.5 * T / (T + 100)          # eps(m) = eps_max * m / (m + m_half)
        expected = 2 * (T * 2 * 4096 * H / 2) / (BF16 * eps)
        assert layer(r, ramp_dep, "g", "sm") == approx(expected)
    # at m = m_half the efficiency is exactly half of eps_max
    r = price(ramp_dep, prefill(100))
    assert layer(r, ramp_dep, "g", "sm") == approx(2 * 100 * 4096 * H / (BF16 * 0.25))


def test_the_ramp_moves_only_sm(ramp_dep):
    base = price(ramp_dep, prefill(100))
    slower = price(ramp_dep, prefill(100), gemm_m_half_bf16=300.0)
    assert moved(base, slower) == {"sm"}
    assert totals(slower)["sm"] == approx(totals(base)["sm"] * (0.25 / (0.5 * 100 / 400)))
    assert moved(base, price(ramp_dep, prefill(100), gemm_eps_max_bf16=0.25)) == {"sm"}


def test_width_and_depth_factors_where_the_registry_has_them(root):
    dep = root(kinds={"g": [gemm(4096, H), gemm(H, 4096)]}, tp=2,
               coefficients=[("gemm_n_half_bf16", 1024, "elements"), ("gemm_k_half_bf16", 3072, "elements")])
    r = price(dep, prefill(100))
    # column-parallel: n' = 4096/2, k' = 1024; row-parallel: n' = 1024, k' = 4096/2
    f_col = (2048 / (2048 + 1024)) * (1024 / (1024 + 3072))
    f_row = (1024 / (1024 + 1024)) * (2048 / (2048 + 3072))
    per_gemm = 100 * 2 * 4096 * H / 2
    expected = per_gemm / (BF16 * 0.25 * f_col) + per_gemm / (BF16 * 0.25 * f_row)
    assert layer(r, dep, "g", "sm") == approx(expected)
    # the widths enter only through their own factor: doubling n_half moves only SM
    assert moved(r, price(dep, prefill(100), gemm_n_half_bf16=2048.0)) == {"sm"}


def test_a_lone_width_or_depth_half_is_refused(root):
    with pytest.raises(JaxpriceError, match="gemm_n_half and gemm_k_half"):
        root(kinds={"g": [gemm(4096, H)]}, coefficients=[("gemm_n_half_bf16", 1024, "elements")])


# ============================================================================ formats and rates


FORMATS = ("bf16", "fp16", "fp32", "fp8", "mxfp8", "nvfp4", "mxfp4", "int4")
WIDTH = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "mxfp8": 1, "nvfp4": 0.5, "mxfp4": 0.5, "int4": 0.5}


@pytest.fixture(scope="module")
def format_deps(root):
    kinds = {f: [gemm(2048, H, weight_dtype=f)] for f in FORMATS}
    return {chip: root(kinds=kinds, chip=chip) for chip in ("hopper", "blackwell")}


# (peak, eps_max) each format computes at: pricing-a-step.md 'Arithmetic rates'
RATES = {
    "hopper": {"bf16": (BF16, 0.5), "fp16": (BF16, 0.5), "fp32": (TF32, 0.5), "fp8": (FP8, 0.8),
               "mxfp8": (BF16, 0.5), "nvfp4": (BF16, 0.5), "mxfp4": (BF16, 0.5), "int4": (BF16, 0.5)},
    "blackwell": {"bf16": (BF16, 0.5), "fp16": (BF16, 0.5), "fp32": (TF32, 0.5), "fp8": (FP8, 0.8),
                  "mxfp8": (FP8, 0.6), "nvfp4": (NVFP4, 0.4), "mxfp4": (NVFP4, 0.4), "int4": (BF16, 0.5)},
}


@pytest.mark.parametrize("chip", ["hopper", "blackwell"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_computes_at_its_own_rate(format_deps, chip, fmt):
    dep = format_deps[chip]
    r = price(dep, prefill(100))
    peak, eps_max = RATES[chip][fmt]
    assert layer(r, dep, fmt, "sm") == approx(100 * 2 * 2048 * H / (peak * eps_max / 2))
    # the weights are read at their own width whatever the rate
    assert layer(r, dep, fmt, "hbm") == approx(2048 * H * WIDTH[fmt] / HBM)


def test_mxfp8_on_blackwell_uses_the_block_scaled_ramp_not_the_fp8_one(format_deps):
    dep = format_deps["blackwell"]
    base = price(dep, prefill(100))
    r = price(dep, prefill(100), gemm_eps_max_fp8_block=0.3)
    sm = lambda res, f: layer(res, dep, f, "sm")  # noqa: E731
    assert sm(r, "mxfp8") == approx(2 * sm(base, "mxfp8"))
    assert sm(r, "fp8") == sm(base, "fp8") and sm(r, "bf16") == sm(base, "bf16")


def test_fp32_runs_at_the_tf32_peak_with_the_bf16_ramp(format_deps):
    dep = format_deps["hopper"]
    base = price(dep, prefill(100))
    r = price(dep, prefill(100), gemm_eps_max_bf16=0.25)
    for f in ("fp32", "bf16", "int4", "nvfp4", "mxfp8"):       # all on the bf16 ramp on Hopper
        assert layer(r, dep, f, "sm") == approx(2 * layer(base, dep, f, "sm"))
    assert layer(r, dep, "fp8", "sm") == layer(base, dep, "fp8", "sm")


def test_served_quantization_sets_the_default_weight_format(root):
    dep = root(kinds={"g": [gemm(2048, H)]}, chip="blackwell", engine={"quantization": "modelopt_mxfp8"})
    r = price(dep, prefill(100))
    assert dep.resolution["served_dtype"] == "mxfp8"
    assert layer(r, dep, "g", "sm") == approx(100 * 2 * 2048 * H / (FP8 * 0.3))
    assert layer(r, dep, "g", "hbm") == approx(2048 * H * 1 / HBM)


def _moe_nodes(fmt):
    return [{"op": "GroupedGEMM", "n": 512, "k": H, "experts": 8, "top_k": 2, "weight_dtype": fmt},
            gemm(2048, H, weight_dtype=fmt)]


GROUPED = [("gemm_eps_max_grouped_nvfp4", 0.2, "dimensionless"), ("gemm_m_half_grouped_nvfp4", 50, "tokens")]


def test_grouped_four_bit_experts_at_their_own_measured_efficiency(root):
    dep = root(kinds={"moe": _moe_nodes("nvfp4")}, chip="blackwell", coefficients=GROUPED)
    r = price(dep, prefill(100))
    routed = 100 * 2 * (6 * 512 * H)                       # T * top_k * 6 N K (local share 1)
    assert layer(r, dep, "moe", "expert_sm") == approx(routed / (NVFP4 * 0.2 * 100 / 150))
    # the dense four-bit GEMM beside them keeps the plain nvfp4 ramp
    assert layer(r, dep, "moe", "sm") == approx(100 * 2 * 2048 * H / (NVFP4 * 0.2))
    # without the grouped ramp the experts fall back to the nvfp4 one
    plain = root(kinds={"moe": _moe_nodes("nvfp4")}, chip="blackwell")
    assert layer(price(plain, prefill(100)), plain, "moe", "expert_sm") == approx(routed / (NVFP4 * 0.2))
    # on a part with no four-bit peak, four-bit experts run weight-only at the BF16 rate
    hop = root(kinds={"moe": _moe_nodes("nvfp4")}, chip="hopper", coefficients=GROUPED)
    assert layer(price(hop, prefill(100)), hop, "moe", "expert_sm") == approx(routed / (BF16 * 0.25))


def test_the_grouped_ramp_moves_only_the_experts(root):
    dep = root(kinds={"moe": _moe_nodes("nvfp4")}, chip="blackwell", coefficients=GROUPED)
    base = price(dep, prefill(100))
    r = price(dep, prefill(100), gemm_eps_max_grouped_nvfp4=0.1)
    assert layer(r, dep, "moe", "expert_sm") == approx(2 * layer(base, dep, "moe", "expert_sm"))
    assert layer(r, dep, "moe", "sm") == layer(base, dep, "moe", "sm")
    assert moved(base, r) == {"sm"}


# ============================================================================ replicated nodes


def test_replicated_nodes_are_not_divided_by_tp(root):
    nodes = [gemm(4096, H), gemm(4096, H, replicated=True)]
    dep = root(kinds={"split": [nodes[0]], "repl": [nodes[1]],
                      "norm": [{"op": "Elementwise", "bytes_per_token": 4000},
                               {"op": "Elementwise", "bytes_per_token": 4000, "replicated": True}]},
               tp=4, head=[gemm(syn.VOCAB, H, replicated=True)])
    r = price(dep, prefill(100))
    flops = 100 * 2 * 4096 * H
    assert layer(r, dep, "split", "sm") == approx(flops / 4 / (BF16 * 0.25))
    assert layer(r, dep, "repl", "sm") == approx(flops / (BF16 * 0.25))
    assert layer(r, dep, "split", "hbm") == approx(4096 * H * 2 / 4 / HBM)
    assert layer(r, dep, "repl", "hbm") == approx(4096 * H * 2 / HBM)
    assert layer(r, dep, "norm", "hbm") == approx((100 * 4000 / 4 + 100 * 4000) / HBM)
    assert float(r.layers["head_sm"]) == approx(100 * 2 * syn.VOCAB * H / (BF16 * 0.25))
    assert float(r.layers["head_hbm"]) == approx(syn.VOCAB * H * 2 / HBM)


def test_a_replicated_attention_keeps_every_head(root):
    attn = {"op": "Attention", "kind": "gqa", "n_q": 8, "n_kv": 8, "d_h": 128}
    dep = root(kinds={"split": [attn], "repl": [{**attn, "replicated": True}]}, tp=4,
               coefficients=[("attention_decode_floor", 5.0, "us_per_call"),
                             ("attention_decode_rate", 1e6, "bytes_per_us")])
    r = price(dep, syn.decode(2, 100))
    assert layer(r, dep, "split", "hbm") == approx(5e-6 + 200 * (2 * (8 // 4) * 128 * 2) / 1e12)
    assert layer(r, dep, "repl", "hbm") == approx(5e-6 + 200 * (2 * 8 * 128 * 2) / 1e12)
    p = price(dep, prefill(100))
    pairs = 4 * 100 * 100 / 2
    assert layer(p, dep, "split", "sm") == approx(pairs * 8 * 128 / 4 / (BF16 * 0.25))
    assert layer(p, dep, "repl", "sm") == approx(pairs * 8 * 128 / (BF16 * 0.25))


# ============================================================================ HBM


@pytest.fixture(scope="module")
def hbm_dep(root):
    return root(kinds={"g": [{"op": "Elementwise"}, gemm(4096, H), {"op": "Elementwise", "bytes_per_token": 1000}]},
                tp=2)


def test_hbm_bytes_at_the_derated_bandwidth_and_weights_once_per_step(hbm_dep):
    weights = 4096 * H * 2 / 2                      # read once per step, whatever the batch
    for n in (1, 8, 40):
        r = price(hbm_dep, syn.decode(n, 50))
        elementwise = n * (4 * H + 1000) / 2        # default 4 * hidden bytes per token
        assert layer(r, hbm_dep, "g", "hbm") == approx((weights + elementwise) / (2e12 * 0.5))
    # the derate divides every HBM byte and nothing else
    base = price(hbm_dep, syn.decode(8, 50))
    r = price(hbm_dep, syn.decode(8, 50), hbm_derate=0.25)
    assert moved(base, r) == {"hbm"}
    assert totals(r)["hbm"] == approx(2 * totals(base)["hbm"])


# ============================================================================ attention: decode


def attn(kind, n_q=8, n_kv=8, d_h=128, **kw):
    return {"op": "Attention", "kind": kind, "n_q": n_q, "n_kv": n_kv, "d_h": d_h, **kw}


def latent(kind, **kw):
    return attn(kind, n_q=16, n_kv=1, d_h=512, **kw)     # 512 B x 2 (bf16 cache) = 1024 B/token


INDEXER = attn("gqa", n_q=4, n_kv=1, d_h=128, role="indexer", compress_ratio=4)   # 256 B/token
DECODE_KINDS = {
    "full": [attn("gqa")],                                          # 2 x 8 x 128 x 2 = 4096 B/token
    "win": [attn("gqa", window=64)],
    "swa": [attn("swa", window=64)],
    "mla": [latent("mla")],
    "mlawin": [latent("mla", window=64)],
    "sparse": [latent("sparse_mla", window=16, index_topk=32, compress_ratio=4)],
    "sparse0": [latent("sparse_mla", window=16, compress_ratio=4)],          # selects nothing
    "sparsenw": [latent("sparse_mla", index_topk=32, compress_ratio=4)],
    "idx": [attn("gqa"), INDEXER],
}
DECODE_COEFS = [("attention_decode_floor", 5.0, "us_per_transfer"), ("attention_decode_rate", 2e6, "bytes_per_us"),
                ("attention_decode_floor_swa", 6.0, "us_per_transfer"), ("attention_decode_rate_swa", 3e6, "bytes_per_us"),
                ("attention_decode_floor_mla", 7.0, "us_per_transfer"), ("attention_decode_rate_mla", 4e6, "bytes_per_us"),
                ("attention_decode_rate_sparse_mla", 5e6, "bytes_per_us")]       # floor: inherits 5 us
CTX = [(1, 99), (1, 999)]          # two decode rows, contexts 100 and 1000


@pytest.fixture(scope="module")
def decode_dep(root):
    return root(kinds=DECODE_KINDS, coefficients=DECODE_COEFS)


def test_decode_reads_the_cached_context_at_each_kinds_floor_and_rate(decode_dep):
    r = price(decode_dep, CTX)
    hbm = lambda k: layer(r, decode_dep, k, "hbm")  # noqa: E731
    assert hbm("full") == approx(5e-6 + (100 + 1000) * 4096 / 2e12)
    assert hbm("swa") == approx(6e-6 + (64 + 64) * 4096 / 3e12)
    assert hbm("mla") == approx(7e-6 + (100 + 1000) * 1024 / 4e12)
    # sparse: window + min(top-k, compressed stream); a per-kind rate with no per-kind floor
    # inherits the part-wide floor
    assert hbm("sparse") == approx(5e-6 + ((16 + 25) + (16 + 32)) * 1024 / 5e12)
    for k in DECODE_KINDS:
        assert layer(r, decode_dep, k, "sm") == 0.0


def test_a_stated_window_bounds_the_read_whatever_the_kind(decode_dep):
    r = price(decode_dep, CTX)
    assert layer(r, decode_dep, "win", "hbm") == approx(5e-6 + (64 + 64) * 4096 / 2e12)
    assert layer(r, decode_dep, "mlawin", "hbm") == approx(7e-6 + (64 + 64) * 1024 / 4e12)


def test_sparse_reads_window_plus_selections_or_the_whole_compressed_stream(decode_dep):
    r = price(decode_dep, CTX)
    assert layer(r, decode_dep, "sparse0", "hbm") == approx(5e-6 + ((16 + 25) + (16 + 250)) * 1024 / 5e12)
    assert layer(r, decode_dep, "sparsenw", "hbm") == approx(5e-6 + (25 + 32) * 1024 / 5e12)


def test_the_indexer_scan_is_priced_in_decode(decode_dep):
    r = price(decode_dep, CTX)
    primary = 5e-6 + 1100 * 4096 / 2e12
    scan = 5e-6 + (25 + 250) * 256 / 2e12            # its compressed keys, at its own kind's pair
    assert layer(r, decode_dep, "idx", "hbm") == approx(primary + scan)


def test_each_kinds_rate_moves_only_that_kind(decode_dep):
    base = price(decode_dep, CTX)
    r = price(decode_dep, CTX, attention_decode_rate_mla=8e12)
    changed = {k for k in DECODE_KINDS if layer(r, decode_dep, k, "hbm") != layer(base, decode_dep, k, "hbm")}
    assert changed == {"mla", "mlawin"}
    assert layer(r, decode_dep, "mla", "hbm") == approx(7e-6 + 1100 * 1024 / 8e12)
    r = price(decode_dep, CTX, attention_decode_floor=50e-6)
    changed = {k for k in DECODE_KINDS if layer(r, decode_dep, k, "hbm") != layer(base, decode_dep, k, "hbm")}
    assert changed == {"full", "win", "sparse", "sparse0", "sparsenw", "idx"}
    assert moved(base, r) == {"hbm"}


def test_a_prefill_row_reads_no_kv(decode_dep):
    base = price(decode_dep, CTX)
    r = price(decode_dep, CTX + [(300, 0)])
    for k in DECODE_KINDS:
        assert layer(r, decode_dep, k, "hbm") == layer(base, decode_dep, k, "hbm")
    # and a step with no decode row pays no decode floor
    assert all(layer(price(decode_dep, prefill(300)), decode_dep, k, "hbm") == 0.0 for k in DECODE_KINDS)


def test_without_a_decode_rate_the_kv_is_read_at_hbm_bandwidth_with_no_floor(root):
    dep = root(kinds={"full": [attn("gqa")]})
    assert layer(price(dep, CTX), dep, "full", "hbm") == approx(1100 * 4096 / HBM)


# ============================================================================ attention: prefill

PREFILL_KINDS = {
    "full": [attn("gqa")],
    "win": [attn("gqa", window=64)],
    "sparse": [latent("sparse_mla", window=16, index_topk=32, compress_ratio=4)],
    "sparse0": [latent("sparse_mla", window=16, compress_ratio=4)],
    "idx": [attn("gqa"), INDEXER],
}


@pytest.fixture(scope="module")
def prefill_dep(root):
    return root(kinds=PREFILL_KINDS)


def test_prefill_is_arithmetic_over_query_key_pairs(prefill_dep):
    r = price(prefill_dep, prefill(200))            # T = 200: eps = 0.5 * 200 / 300
    rate = BF16 * 0.5 * 200 / 300
    sm = lambda k: layer(r, prefill_dep, k, "sm")  # noqa: E731
    # 4 FLOP per pair and head dimension (2 per MAC, 2 matmuls); pairs = s^2/2 for c = 0
    assert sm("full") == approx(4 * (200 ** 2 / 2) * 8 * 128 / rate)
    # each query sees at most 64 keys: G_64(200) = 200^2/2 - 136^2/2
    assert sm("win") == approx(4 * (200 ** 2 / 2 - 136 ** 2 / 2) * 8 * 128 / rate)
    # sparse: the window, plus at most top-k of the compressed stream (a window of 32 x 4
    # positions, scaled by 1/4); with top-k 0, the whole compressed stream
    window16 = 200 ** 2 / 2 - 184 ** 2 / 2
    assert sm("sparse") == approx(4 * (window16 + (200 ** 2 / 2 - 72 ** 2 / 2) / 4) * 16 * 512 / rate)
    assert sm("sparse0") == approx(4 * (window16 + 200 ** 2 / 2 / 4) * 16 * 512 / rate)
    for k in PREFILL_KINDS:
        assert layer(r, prefill_dep, k, "hbm") == 0.0


def test_prefill_pairs_after_a_cached_prefix(prefill_dep):
    r = price(prefill_dep, prefill(100, computed=100))
    rate = BF16 * 0.25
    assert layer(r, prefill_dep, "full", "sm") == approx(4 * (100 * 100 + 100 ** 2 / 2) * 8 * 128 / rate)
    assert layer(r, prefill_dep, "win", "sm") == approx(4 * (100 * 64) * 8 * 128 / rate)


def test_the_indexer_scan_is_priced_in_prefill(prefill_dep):
    r = price(prefill_dep, prefill(200))
    rate = BF16 * 0.5 * 200 / 300
    primary = 4 * 200 ** 2 / 2 * 8 * 128 / rate
    scan = 4 * (200 ** 2 / 2 / 4) * 4 * 128 / 2 / rate      # scores only: half the FLOPs per pair
    assert layer(r, prefill_dep, "idx", "sm") == approx(primary + scan)


def test_prefill_floor_and_work_scale(root):
    dep = root(kinds={"full": [attn("gqa")], "idx": [attn("gqa"), INDEXER]},
               coefficients=[("attention_prefill_floor", 4.0, "us_per_transfer"),
                             ("attention_prefill_work_scale", 0.5, "dimensionless")])
    r = price(dep, prefill(100))
    flops = 4 * 100 ** 2 / 2 * 8 * 128
    assert layer(r, dep, "full", "sm") == approx(4e-6 + flops / (BF16 * 0.25 * 0.5))
    scan = 4 * 100 ** 2 / 2 / 4 * 4 * 128 / 2 / (BF16 * 0.25)   # the scorer has no floor or scale
    assert layer(r, dep, "idx", "sm") == approx(4e-6 + flops / (BF16 * 0.25 * 0.5) + scan)
    assert layer(price(dep, CTX), dep, "full", "sm") == 0.0       # no prefill row: no floor


SPARSE_LAYER = [latent("sparse_mla", window=16, index_topk=32, compress_ratio=4), INDEXER]


def _form(prefix, floor, per_request, per_token, rate, suffix=""):
    """A measured prefill form, model-scoped as a user would add it (registry/EXTENSIONS.md)."""
    scope = {"hardware": ["hopper"], "model": ["synth"]}
    return [(f"{prefix}_floor{suffix}", floor, "us_per_transfer", scope),
            (f"{prefix}_per_request{suffix}", per_request, "us_per_request", scope),
            (f"{prefix}_per_token{suffix}", per_token, "us_per_token", scope),
            (f"{prefix}_rate{suffix}", rate, "bytes_per_us", scope)]


ATTN_FORM = _form("attention_prefill", 20.0, 2.0, 0.01, 1e5, suffix="_sparse_mla")
INDEX_FORM = _form("indexer_prefill", 8.0, 1.0, 0.02, 2e5)
FORM_ROWS = [(200, 0), (100, 100)]        # 2 prefill requests, 300 prefill tokens


def _sparse_pairs():
    row1 = (200 ** 2 / 2 - 184 ** 2 / 2) + (200 ** 2 / 2 - 72 ** 2 / 2) / 4
    row2 = 100 * 16 + ((200 ** 2 / 2 - 72 ** 2 / 2) - 100 ** 2 / 2) / 4
    return row1 + row2


def test_measured_prefill_forms_replace_the_arithmetic(root):
    dep = root(kinds={"sp": SPARSE_LAYER}, coefficients=ATTN_FORM + INDEX_FORM)
    r = price(dep, FORM_ROWS)
    attention = 20e-6 + 2 * 2e-6 + 300 * 0.01e-6 + _sparse_pairs() * 1024 / 1e11
    scorer = 8e-6 + 2 * 1e-6 + 300 * 0.02e-6 + ((200 ** 2 / 2) / 4 + (100 * 100 + 100 ** 2 / 2) / 4) * 256 / 2e11
    assert layer(r, dep, "sp", "sm") == approx(attention + scorer)
    # each term moves the price by exactly its share
    r2 = price(dep, FORM_ROWS, attention_prefill_per_request_sparse_mla=3e-6, indexer_prefill_per_token=0.0)
    assert layer(r2, dep, "sp", "sm") == approx(attention + 2 * 1e-6 + scorer - 300 * 0.02e-6)


def test_a_measured_form_is_used_only_when_every_term_is_present(root):
    arith_rate = BF16 * 0.5 * 300 / 400
    arithmetic = 4 * _sparse_pairs() * 16 * 512 / arith_rate
    scan = 4 * ((200 ** 2 / 2) / 4 + (100 * 100 + 100 ** 2 / 2) / 4) * 4 * 128 / 2 / arith_rate
    scorer = 8e-6 + 2 * 1e-6 + 300 * 0.02e-6 + ((200 ** 2 / 2) / 4 + (100 * 100 + 100 ** 2 / 2) / 4) * 256 / 2e11
    # the attention form lacks its per-token term: attention falls back to arithmetic
    partial = [e for e in ATTN_FORM if "per_token" not in e[0]] + INDEX_FORM
    dep = root(kinds={"sp": SPARSE_LAYER}, coefficients=partial)
    assert layer(price(dep, FORM_ROWS), dep, "sp", "sm") == approx(arithmetic + scorer)
    # a form scoped to another model is not admitted: both fall back
    other = [(n, v, u, {**s, "model": ["another-model"]}) for n, v, u, s in ATTN_FORM + INDEX_FORM]
    dep = root(kinds={"sp": SPARSE_LAYER}, coefficients=other)
    assert layer(price(dep, FORM_ROWS), dep, "sp", "sm") == approx(arithmetic + scan)


# ============================================================================ mHC hyper-connections


MHC = [{"op": "HyperConnection", "half": "pre", "bytes_per_token": 8192, "streams": 4, "mix_n": 24, "mix_k": 4096},
       {"op": "HyperConnection", "half": "post", "bytes_per_token": 4096, "streams": 4, "mix_n": 16, "mix_k": 1024}]
MHC_PRE = [("mhc_floor_pre", 3.0, "us_per_transfer"), ("mhc_rate_pre", 5e5, "bytes_per_us")]
MHC_POST = [("mhc_floor_post", 2.0, "us_per_transfer"), ("mhc_rate_post", 4e5, "bytes_per_us")]


def test_mhc_measured_form_where_present_else_memory_traffic(root):
    dep = root(kinds={"m": MHC}, coefficients=MHC_PRE)          # post has no measured form
    r = price(dep, prefill(100))
    pre = 3e-6 + 100 * 8192 / 5e11                               # replaces the bytes and the mixing GEMM
    post_bytes = 100 * 4096 / HBM
    post_mix = 100 * 2 * 16 * 1024 / (BF16 * 0.25)
    assert layer(r, dep, "m", "hbm") == approx(pre + post_bytes)
    assert layer(r, dep, "m", "sm") == approx(post_mix)
    base = price(dep, prefill(100))
    assert moved(base, price(dep, prefill(100), mhc_rate_pre=1e12)) == {"hbm"}
    both = root(kinds={"m": MHC}, coefficients=MHC_PRE + MHC_POST)
    r = price(both, prefill(100))
    assert layer(r, both, "m", "hbm") == approx(pre + 2e-6 + 100 * 4096 / 4e11)
    assert layer(r, both, "m", "sm") == 0.0
    none = root(kinds={"m": MHC})
    r = price(none, prefill(100))
    assert layer(r, none, "m", "hbm") == approx(100 * (8192 + 4096) / HBM)
    assert layer(r, none, "m", "sm") == approx(100 * 2 * (24 * 4096 + 16 * 1024) / (BF16 * 0.25))


# ============================================================================ recurrent mixers


GDN = [{"op": "RecurrentUpdate", "recurrent_kind": "gdn", "n_heads": 8, "d_h": 128, "state_size": 128}]
REC_DECODE = [("recurrent_decode_floor_gdn", 4.0, "us_per_transfer"), ("recurrent_decode_rate_gdn", 100.0, "tokens")]
REC_PREFILL = [("recurrent_prefill_floor_gdn", 6.0, "us_per_transfer"), ("recurrent_prefill_rate_gdn", 1000.0, "tokens")]
MIXED = [(1, 99)] * 10 + [(200, 0)]       # 10 decode rows and one 200-token prefill: T = 210
# KNOWN DIVERGENCE [recurrent-rate-geometry]: a GDN rate is read at the 64 value heads it was fitted
# at; this one-GPU layer runs 8, so a decode token costs 8/64 of the rate's time
DEC = 10 * (8 / 64)


def test_recurrent_decode_and_measured_prefill_rates(root):
    dep = root(kinds={"r": GDN}, coefficients=REC_DECODE + REC_PREFILL)
    assert layer(price(dep, MIXED), dep, "r", "sm") == approx(4e-6 + DEC / 1e8 + 6e-6 + 200 / 1e9)
    assert layer(price(dep, [(1, 99)] * 10), dep, "r", "sm") == approx(4e-6 + DEC / 1e8)
    assert layer(price(dep, prefill(200)), dep, "r", "sm") == approx(6e-6 + 200 / 1e9)
    base = price(dep, MIXED)
    r = price(dep, MIXED, recurrent_prefill_rate_gdn=2e9)
    assert moved(base, r) == {"sm"}
    assert layer(r, dep, "r", "sm") == approx(4e-6 + DEC / 1e8 + 6e-6 + 200 / 2e9)


def test_recurrent_prefill_without_a_rate_is_the_chunked_scan(root):
    dep = root(kinds={"r": GDN}, coefficients=REC_DECODE)
    # per token and head: intra-chunk attention over 64-token chunks (4 x 64 x d) plus the
    # state read and update (4 x d x state), at the BF16 ramp
    scan = 200 * 8 * (4 * 64 * 128 + 4 * 128 * 128) / (BF16 * 0.5 * 210 / 310)
    assert layer(price(dep, MIXED), dep, "r", "sm") == approx(4e-6 + DEC / 1e8 + scan)


def test_a_bundled_gdn_rate_charges_a_decode_token_by_the_heads_a_rank_runs():
    """KNOWN DIVERGENCE [recurrent-rate-geometry]: the bundled GDN rate was fitted at Qwen3.5-397B's
    64 value heads on one GPU and scales inversely with the heads, so a tp 8 rank running 8 of them
    charges a decode token 8/64 of the fitted time. Isolated by doubling the rate: the 45 GDN layers'
    SM falls by 45 x 256 x (8/64) x (1/r - 1/2r)."""
    import jaxprice as jp
    dep = jp.load_deployment("qwen3.5-397b-a17b-b200-fp8-sglang-tp8")
    assert list(dep.plan.arrays["rec_dec_scale"]) == [8 / 64]
    c = dep.coefficients
    r = float(c["recurrent_decode_rate_gdn"])
    batch = jp.Batch.decode(256, 2048, pad_to=256, decode_threshold=8)
    a = jp.price(dep.plan, c, batch, breakdown=True)
    b = jp.price(dep.plan, c.replace(recurrent_decode_rate_gdn=2 * r), batch, breakdown=True)
    assert layer(a, dep, "gdn_moe", "sm") - layer(b, dep, "gdn_moe", "sm") == \
        approx(45 * 256 * (8 / 64) * (1 / r - 1 / (2 * r)))


# ============================================================================ classification


def test_the_decode_threshold_classifies_rows(decode_dep):
    # a row scheduling at most the threshold is a decode (reads its context); one more token
    # makes it a prefill (arithmetic over its query-key pairs, no KV read)
    rows = [(4, 96), (5, 95)]
    r = price(decode_dep, rows, threshold=4)
    assert layer(r, decode_dep, "full", "hbm") == approx(5e-6 + 100 * 4096 / 2e12)
    pairs = 4 * (5 * 95 + 5 ** 2 / 2)
    T = 4 + 5                                        # the ramp sees every scheduled token
    assert layer(r, decode_dep, "full", "sm") == approx(pairs * 8 * 128 / (BF16 * 0.5 * T / (T + 100)))
    # at threshold 5 both rows decode
    r = price(decode_dep, rows, threshold=5)
    assert layer(r, decode_dep, "full", "hbm") == approx(5e-6 + 200 * 4096 / 2e12)
    assert layer(r, decode_dep, "full", "sm") == 0.0


def test_the_ramp_is_evaluated_at_the_rank_local_token_count_of_both_phases(ramp_dep):
    # ten decode rows and one 200-token prefill: T = 210 for every GEMM
    r = price(ramp_dep, [(1, 99)] * 10 + [(200, 0)])
    T = 210
    assert layer(r, ramp_dep, "g", "sm") == approx(2 * (T * 2 * 4096 * H / 2) / (BF16 * 0.5 * T / (T + 100)))


# ============================================================================ speculative decoding


TARGET = [gemm(4096, H), attn("gqa")]            # 1 + 2 kernels, one piece per layer
DRAFT = [gemm(2048, H), attn("gqa")]


def _speculating(root, method, num_spec, drafter_layers=1, speculate=True, **engine):
    eng = {"speculative": {"method": method, "num_spec_tokens": num_spec}} if speculate else {}
    eng.update(engine)
    return root(kinds={"L": TARGET, "D": DRAFT}, stack={"pattern": ["L"], "repeat": 4},
                speculator={"method": method, "num_spec_tokens": num_spec,
                            "stack": {"pattern": ["D"], "repeat": drafter_layers}},
                engine=eng)


def _uniform(n, width):
    """n uniform decode rows of `width` tokens (threshold = width), context 100."""
    return syn.batch([(width, 100 - width)] * n, threshold=width)


@pytest.fixture(scope="module")
def mtp_dep(root):
    # two draft tokens: two drafter passes; a 12-token capture (4 requests of 1 + 2 tokens)
    return _speculating(root, "deepseek_mtp", 2, max_cudagraph_capture_size=12)


def test_the_drafter_pays_its_passes_and_its_weights_are_resident(mtp_dep, root):
    dep = mtp_dep
    assert dep.plan.layer_kind_names == ("L", "drafter:D")
    r = price(dep, _uniform(4, 3))
    T = 12
    eps = 0.5 * T / (T + 100)
    # each of the 2 passes runs the drafter's GEMM over the step's tokens and reads its weights
    # and the rows' cached context (no decode rate: at HBM bandwidth)
    assert layer(r, dep, "drafter:D", "sm") == approx(2 * T * 2 * 2048 * H / (BF16 * eps))
    assert layer(r, dep, "drafter:D", "hbm") == approx(2 * (2048 * H * 2 + 4 * 100 * 4096) / HBM)
    assert layer(r, dep, "L", "sm") == approx(4 * T * 2 * 4096 * H / (BF16 * eps))
    # host (PIECEWISE): target 10 us x (1 + 4 pieces) + 12 kernels; the drafter 2 passes x
    # 10 us x (1 + 1 pieces) + 2 x 3 kernels
    assert totals(r)["host"] == approx(50e-6 + 12e-6 + 40e-6 + 6e-6)
    mem = dep.plan.memory
    assert mem["drafter_weights_bytes"] == 2048 * H * 2
    assert mem["target_weights_bytes"] == 4 * 4096 * H * 2 + H * syn.VOCAB * 2
    assert mem["weights_bytes"] == mem["target_weights_bytes"] + mem["drafter_weights_bytes"]
    # the same graph without speculation in the deployment: no drafter at all
    plain = _speculating(root, "deepseek_mtp", 2, speculate=False, max_cudagraph_capture_size=12)
    assert plain.plan.layer_kind_names == ("L",)
    assert plain.plan.memory["drafter_weights_bytes"] == 0.0


def test_past_the_ceiling_the_drafter_is_never_cheaper_than_captured(mtp_dep):
    # 5 requests x 3 tokens = 15 > 12: eager, but eager (3 us per layer) is cheaper than the
    # captured replays here, so both the target and the drafter keep their captured price:
    # adding a request never lowers the price (pricing-a-step.md, 'Host time')
    at = totals(price(mtp_dep, _uniform(4, 3)))["host"]
    past = totals(price(mtp_dep, _uniform(5, 3)))["host"]
    assert past == approx(at) == approx(108e-6)


def test_an_eager_drafter_launches_each_pass(root):
    dep = _speculating(root, "deepseek_mtp", 2, cudagraph_mode="NONE")
    # target 3 us x 4 layers, drafter 2 passes x 3 us x 1 layer, dispatch 12 + 2 x 3 kernels
    assert totals(price(dep, _uniform(4, 3)))["host"] == approx(12e-6 + 6e-6 + 12e-6 + 6e-6)


def test_the_drafter_stack_expands_like_the_target_stack(root):
    # prologue + pattern x repeat + epilogue: 1 + 2 x 2 + 1 = 6 drafter layers of one kind
    dep = root(kinds={"L": TARGET, "D": DRAFT}, stack={"pattern": ["L"], "repeat": 4},
               speculator={"method": "deepseek_mtp", "num_spec_tokens": 1,
                           "stack": {"prologue": ["D"], "pattern": ["D", "D"], "repeat": 2, "epilogue": ["D"]}},
               engine={"speculative": {"method": "deepseek_mtp", "num_spec_tokens": 1}})
    i = dep.plan.layer_kind_names.index("drafter:D")
    assert dep.plan.arrays["count"][i] == 6
    assert dep.plan.scalars["drafter_layers"] == 6
    assert dep.plan.memory["drafter_weights_bytes"] == 6 * 2048 * H * 2


@pytest.fixture(scope="module")
def dspark_dep(root):
    # a parallel-block drafter of 5 layers, 5 draft tokens, a 64-token capture, FULL graphs
    return _speculating(root, "dspark", 5, drafter_layers=5, cudagraph_mode="FULL",
                        max_cudagraph_capture_size=64)


def test_the_parallel_block_drafter_has_its_own_graphs_and_ceiling(dspark_dep):
    dep = dspark_dep
    host = {n: totals(price(dep, _uniform(n, 6)))["host"] for n in (10, 11, 12, 13)}
    # target rows are 1 + 5 = 6 wide: up to 10 requests (60 tokens) replay one graph, 11 run
    # eager (3 us x 4 layers, dearer than the 10 us replay); drafter rows are 5 wide: it
    # replays up to 12 requests (60 tokens) and launches eagerly (3 us x 5 layers) from 13
    dispatch = 12e-6 + 15e-6                        # 4 x 3 target kernels, 5 x 3 drafter kernels
    assert host[10] == approx(10e-6 + 10e-6 + dispatch)
    assert host[11] == approx(12e-6 + 10e-6 + dispatch)
    assert host[12] == approx(12e-6 + 10e-6 + dispatch)
    assert host[13] == approx(12e-6 + 15e-6 + dispatch)
    # one pass over the step's tokens
    r = price(dep, _uniform(10, 6))
    T = 60
    assert layer(r, dep, "drafter:D", "sm") == approx(5 * T * 2 * 2048 * H / (BF16 * 0.5 * T / (T + 100)))


def test_a_prefill_row_stores_the_drafters_context_eagerly_before_the_replay(dspark_dep):
    r = price(dspark_dep, syn.batch([(6, 94), (20, 0)], threshold=6))
    # target replay 10 us; drafter replay 10 us plus its eager launches (3 us x 5 layers)
    assert totals(r)["host"] == approx(10e-6 + (10e-6 + 15e-6) + 12e-6 + 15e-6)


def test_the_parallel_block_drafter_is_captured_only_under_a_full_decode_mode(root):
    dep = _speculating(root, "dspark", 5, drafter_layers=5, cudagraph_mode="PIECEWISE",
                       max_cudagraph_capture_size=64)
    # target: 10 us x (1 + 4 pieces); drafter eager: 3 us x 5 layers
    assert totals(price(dep, _uniform(2, 6)))["host"] == approx(50e-6 + 15e-6 + 12e-6 + 15e-6)


def test_past_its_ceiling_the_parallel_block_drafter_is_never_cheaper_than_captured(root):
    # a one-layer drafter launches eagerly for 3 us, less than its 10 us replay
    dep = _speculating(root, "dspark", 5, cudagraph_mode="FULL", max_cudagraph_capture_size=64)
    at, past = (totals(price(dep, _uniform(n, 6)))["host"] for n in (12, 13))
    assert past == approx(at) == approx(12e-6 + 10e-6 + 12e-6 + 3e-6)


# ============================================================================ experts


EXPERTS = {"op": "GroupedGEMM", "n": 512, "k": H, "experts": 8, "top_k": 2, "shared_experts": 1,
           "shared_intermediate_size": 256}
MOE_KIND = [gemm(2048, H), EXPERTS, {"op": "All2All", "emit": "expert_parallel"}]
EXPERT_FLOPS = 6 * 512 * H                      # per token and expert: gate, up and down
EXPERT_BYTES = 3 * 512 * H * 2                  # one expert's weights, bf16
SHARED_FLOPS, SHARED_BYTES = 6 * 256 * H, 3 * 256 * H * 2
IMBALANCE = [("moe_routing_imbalance_median", 1.5, "dimensionless")]


def touched(n, experts, k, local):
    """Distinct experts n routed tokens touch on a rank holding `local` of them."""
    return local * (1 - ((experts - k) / experts) ** n)


def test_experts_are_added_to_the_layer_not_overlapped(root):
    dep = root(kinds={"moe": MOE_KIND}, coefficients=IMBALANCE)
    r = price(dep, syn.decode(3, 100))              # T = 3
    rate = BF16 * 0.5 * 3 / 103
    expert_sm = 1.5 * 3 * 2 * EXPERT_FLOPS / rate    # T x top_k x flops, times the imbalance
    expert_hbm = EXPERT_BYTES * touched(3, 8, 2, 8) / HBM
    assert layer(r, dep, "moe", "expert_sm") == approx(expert_sm)
    assert layer(r, dep, "moe", "expert_hbm") == approx(expert_hbm)
    # shared experts are dense: ramp-priced arithmetic and weights read once
    sm = 3 * (2 * 2048 * H + SHARED_FLOPS) / rate
    hbm = (2048 * H * 2 + SHARED_BYTES) / HBM
    assert layer(r, dep, "moe", "sm") == approx(sm)
    assert layer(r, dep, "moe", "hbm") == approx(hbm)
    t = totals(r)
    assert t["nvlink"] == 0.0                       # MoE group 1: the All2All is not emitted
    host = 10e-6 + (1 + 4) * 1e-6                   # one piece; GEMM 1 + GroupedGEMM 4 kernels
    assert t["host"] == approx(host)
    assert float(r.overlap) == approx(max(sm, hbm) + expert_sm + expert_hbm + host)
    assert float(r.overlap) > max(sm + expert_sm, hbm + expert_hbm) + host
    assert float(r.no_overlap) == approx(sm + expert_sm + hbm + expert_hbm + host)
    # the imbalance multiplies the routed arithmetic only
    r2 = price(dep, syn.decode(3, 100), moe_routing_imbalance_median=3.0)
    assert moved(r, r2) == {"sm"}
    assert layer(r2, dep, "moe", "expert_sm") == approx(2 * expert_sm)
    assert layer(r2, dep, "moe", "sm") == layer(r, dep, "moe", "sm")


@pytest.mark.parametrize("case", ["ep", "eplb", "dp_funnel"])
def test_expert_parallel_eplb_and_the_dp_funnel(root, case):
    # tp 2, dp 2 (reference-kernel.md section 6); T = 3 rank-local tokens
    engine = {"eplb": {"enable_eplb": True, "num_redundant_experts": 2}} if case == "eplb" else {}
    dep = root(kinds={"moe": MOE_KIND}, tp=2, dp=2, ep=case != "dp_funnel", engine=engine)
    r = price(dep, syn.decode(3, 100))
    rate = BF16 * 0.5 * 3 / 103
    routed = 3 * 2                                   # funnel = dp: the MoE group gathers both DP ranks
    if case == "ep":         # EP width 4: 2 of the 8 experts per rank, whole (not tp-sharded)
        share, shards, slice_, local, total = 2 / 8, 1, 1, 2, 8
    elif case == "eplb":     # 8 + 2 redundant = 10 over 4 ranks: the heaviest rank holds 3
        share, shards, slice_, local, total = 3 / 10, 1, 1, 3, 10
    else:                    # EP off: every rank holds all 8, sharded over tp x dp = 4; dpSlice 2
        share, shards, slice_, local, total = 1.0, 4, 2, 8, 8
    assert layer(r, dep, "moe", "expert_sm") == approx(routed * 2 * share * EXPERT_FLOPS / slice_ / rate)
    assert layer(r, dep, "moe", "expert_hbm") == approx(EXPERT_BYTES / shards * touched(routed, total, 2, local) / HBM)
    # shared experts stay dense, over tp
    assert layer(r, dep, "moe", "sm") == approx(3 * (2 * 2048 * H + SHARED_FLOPS) / 2 / rate)
    # the All2All fires over the MoE group of 4 (within the node: NVLink), on the step's bytes
    assert totals(r)["nvlink"] == approx(syn.collective(3 * 2 * H))
    assert totals(r)["nic"] == 0.0


# ============================================================================ collectives


TP_KIND = [gemm(4096, H), {"op": "AllReduce", "emit": "tensor_parallel"},
           gemm(H, 4096), {"op": "AllReduce", "emit": "tensor_parallel"}]
EP_KIND = [{"op": "GroupedGEMM", "n": 512, "k": H, "experts": 16, "top_k": 2},
           {"op": "All2All", "emit": "expert_parallel"}]
STEP_BYTES = 3 * 2 * H                      # T = 3 tokens of 16-bit activations


def _collectives(root, chip="hopper", tp=16, backend="deepep_low_latency", per_node=8):
    return root(kinds={"tp": TP_KIND, "moe": EP_KIND}, chip=chip, tp=tp, ep=True,
                engine={"all2all_backend": backend},
                cluster={"nodes": max(1, tp // per_node), "gpus_per_node": per_node})


def test_every_collective_launch_pays_its_own_floor_on_nvlink_within_a_node(root):
    dep = root(kinds={"tp": TP_KIND}, tp=2)
    r = price(dep, syn.decode(3, 100))
    assert layer(r, dep, "tp", "nvlink") == approx(2 * syn.collective(STEP_BYTES))
    assert totals(r)["nic"] == 0.0
    # the law: max(t0 + b/r_t, b/r_peak) per launch; inflating the floor moves NVLink only
    r2 = price(dep, syn.decode(3, 100), collective_floor_all_reduce_fp16_2rank_hopper=20e-6)
    assert moved(r, r2) == {"nvlink"}
    assert layer(r2, dep, "tp", "nvlink") == approx(2 * syn.collective(STEP_BYTES, floor=20e-6))


def test_a_collective_stating_its_bytes_per_token_carries_them_in_a_class_of_its_own(root):
    # jaxprice extension: a node's bytes_per_token replaces 2 x hidden (vLLM's MiniMax-M2 QK-norm
    # all-reduce carries two fp32 variances per token); the stock all-reduce keeps 2 x hidden
    small = {"op": "AllReduce", "role": "qk_norm", "emit": "tensor_parallel", "bytes_per_token": 8}
    dep = root(kinds={"tp": [TP_KIND[0], small] + TP_KIND[1:]}, tp=2)
    floor, rate = 20e-6, 1e9                 # a slow transition rate, so the bytes show
    coefs = {"collective_floor_all_reduce_fp16_2rank_hopper": floor,
             "collective_transition_rate_all_reduce_fp16_2rank_hopper": rate}
    for tokens in (3, 60):
        r = price(dep, syn.decode(tokens, 100), **coefs)
        stock = 2 * syn.collective(tokens * 2 * H, floor=floor, trans=rate)
        assert layer(r, dep, "tp", "nvlink") == approx(stock + syn.collective(tokens * 8, floor=floor, trans=rate))
    classes = [(c["op"], c["bytes_per_token"]) for c in dep.resolution["collectives"]]
    assert ("AllReduce", 8.0) in classes and ("AllReduce", 2.0 * H) in classes


def test_groups_across_nodes_go_to_the_nic_with_their_span_factors(root):
    dep = _collectives(root)                 # tp 16 over two nodes of 8; NVLink 400 / NIC 50 GB/s
    r = price(dep, syn.decode(3, 100))
    ring = 1 + (8 - 1) * 1 / 15              # RingSpan(16, 8, 8): one of 15 hops leaves the node
    a2a = 1 + (8 - 1) * 8 / 15               # All2AllSpan(16, 8, 8): 8 of 15 peers are off-node
    assert layer(r, dep, "tp", "nic") == approx(2 * syn.collective(STEP_BYTES * ring))
    # a routed all-to-all carries top_k copies of the activations
    assert layer(r, dep, "moe", "nic") == approx(syn.collective(STEP_BYTES * 2 * a2a))
    assert totals(r)["nvlink"] == 0.0
    assert dep.resolution["nodes_spanned"] == 2
    # an all-to-all that is not routed (the naive backend) is priced as a ring, one copy
    naive = _collectives(root, backend="")
    assert layer(price(naive, syn.decode(3, 100)), naive, "moe", "nic") == approx(syn.collective(STEP_BYTES * ring))


def test_a_group_within_an_nvl72_rack_stays_on_nvlink(root):
    dep = _collectives(root, chip="rack", per_node=4)      # 16 ranks over 4 nodes of one 72-GPU rack
    r = price(dep, syn.decode(3, 100))
    assert layer(r, dep, "tp", "nvlink") == approx(2 * syn.collective(STEP_BYTES))
    assert layer(r, dep, "moe", "nvlink") == approx(syn.collective(STEP_BYTES * 2))
    assert totals(r)["nic"] == 0.0
    assert dep.resolution["nodes_spanned"] == 1
    assert not any(c["nic"] for c in dep.resolution["collectives"])


# ============================================================================ the output head


def test_the_head_runs_once_per_step_as_the_larger_of_its_arithmetic_and_its_reads(root):
    dep = root(kinds={"n": [{"op": "Elementwise"}]},
               head=[{"op": "Elementwise", "role": "final_norm"}, gemm(syn.VOCAB, H, role="lm_head")])
    head_flops, head_bytes = 2 * syn.VOCAB * H, syn.VOCAB * H * 2
    for rows, eps_max in ((prefill(100), 0.5), ([(1, 99)], 0.5), ([(1, 99)], 50.0)):
        r = price(dep, rows, gemm_eps_max_bf16=eps_max)
        T = sum(s for s, _ in rows)
        head_sm = T * head_flops / (BF16 * eps_max * T / (T + 100))      # over all T tokens
        head_hbm = head_bytes / HBM
        assert float(r.layers["head_sm"]) == approx(head_sm)
        assert float(r.layers["head_hbm"]) == approx(head_hbm)
        # the head's norm bytes are not charged (its launch is): the layer's norm only
        norm = T * 4 * H / HBM
        host = 10e-6 + (1 + 2) * 1e-6
        t = totals(r)
        assert t["sm"] == approx(head_sm) and t["hbm"] == approx(norm + head_hbm) and t["host"] == approx(host)
        assert float(r.overlap) == approx(norm + max(head_sm, head_hbm) + host)
    assert head_sm < head_hbm                      # the last case is read-bound, the others compute-bound


# ============================================================================ attention: one launch


ONE_LAUNCH = [("attention_decode_floor", 5.0, "us_per_transfer"), ("attention_decode_rate", 2e6, "bytes_per_us"),
              ("attention_prefill_floor", 4.0, "us_per_transfer"),
              ("attention_prefill_work_scale", 0.5, "dimensionless")]
MIXED_ROWS = [(1, 99), (100, 0)]             # a decode at context 100 and a 100-token prefill: T = 101


def test_flashattention_serves_a_mixed_non_latent_batch_in_one_launch(root):
    dep = root(kinds={"full": [attn("gqa")], "mla": [latent("mla")]}, coefficients=ONE_LAUNCH)
    rate = BF16 * 0.5 * 101 / 201 * 0.5                          # ramp at T, times the work scale
    gqa_flops, mla_flops = 4 * 100 ** 2 / 2 * 8 * 128, 4 * 100 ** 2 / 2 * 16 * 512
    r = price(dep, MIXED_ROWS)
    # the smaller floor is dropped: here the prefill floor (4 us < 5 us)
    assert layer(r, dep, "full", "hbm") == approx(5e-6 + 100 * 4096 / 2e12)
    assert layer(r, dep, "full", "sm") == approx(gqa_flops / rate)
    # a latent layer is not served that way: both floors
    assert layer(r, dep, "mla", "hbm") == approx(5e-6 + 100 * 1024 / 2e12)
    assert layer(r, dep, "mla", "sm") == approx(4e-6 + mla_flops / rate)
    # with the decode floor the smaller one, it is the one dropped
    r = price(dep, MIXED_ROWS, attention_decode_floor=3e-6)
    assert layer(r, dep, "full", "hbm") == approx(100 * 4096 / 2e12)
    assert layer(r, dep, "full", "sm") == approx(4e-6 + gqa_flops / rate)
    # a batch of one phase pays its own floor
    assert layer(price(dep, [(1, 99)]), dep, "full", "hbm") == approx(5e-6 + 100 * 4096 / 2e12)
    assert layer(price(dep, [(100, 0)]), dep, "full", "sm") == approx(4e-6 + gqa_flops / (BF16 * 0.25 * 0.5))


def test_an_mla_layer_stating_its_prefill_head_dimensions_prefills_uncompressed(root):
    # jaxprice extension (vLLM's MLACommonImpl): MLA prefill is multi-head attention with QK head
    # dimension qk_nope + qk_rope and V head dimension v, 2 (qk + v) FLOPs per pair and head; its
    # decode still reads the latent cache (d_h = 512 here)
    dims = {"qk_nope_head_dim": 96, "qk_rope_head_dim": 32, "v_head_dim": 64}
    dep = root(kinds={"mla": [latent("mla")], "mla_dims": [latent("mla", **dims)]}, coefficients=ONE_LAUNCH)
    rate = BF16 * 0.5 * 101 / 201 * 0.5
    pairs4 = 4 * 100 ** 2 / 2                                     # the test above's pair count, x 4
    r = price(dep, MIXED_ROWS)
    assert layer(r, dep, "mla", "sm") == approx(4e-6 + pairs4 * 16 * 512 / rate)
    assert layer(r, dep, "mla_dims", "sm") == approx(4e-6 + pairs4 * 16 * (96 + 32 + 64) / 2 / rate)
    assert 2 * (96 + 32) + 2 * 64 == 4 * (96 + 32 + 64) / 2        # QK^T and PV, 2 FLOPs each
    assert layer(r, dep, "mla_dims", "hbm") == layer(r, dep, "mla", "hbm")
    assert dep.plan.memory["kv_bytes_per_token"] == 2 * 512 * 2   # both layers' latent caches, bf16


def test_no_one_launch_correction_on_a_part_with_a_four_bit_peak(root):
    dep = root(kinds={"full": [attn("gqa")]}, coefficients=ONE_LAUNCH, chip="blackwell")
    r = price(dep, MIXED_ROWS)
    assert layer(r, dep, "full", "hbm") == approx(5e-6 + 100 * 4096 / 2e12)
    assert layer(r, dep, "full", "sm") == approx(4e-6 + 4 * 100 ** 2 / 2 * 8 * 128 / (BF16 * 0.5 * 101 / 201 * 0.5))


# ============================================================================ host


HOST_KINDS = {
    "S": [latent("sparse_mla", window=16, index_topk=32, compress_ratio=4), INDEXER],   # 4 kernels, 2 pieces
    "L": [{"op": "Elementwise"}, gemm(2048, H), attn("gqa")],                            # 4 kernels, 1 piece
    "R": GDN,                                                                            # 2 kernels, 1 piece
}
HOST_STACK = {"prologue": ["S"], "pattern": ["L", "R"], "repeat": 2}     # 5 layers
PIECES, KERNELS, LAYERS = 1 + 2 + 2 * 1 + 2 * 1, 4 + 2 * 4 + 2 * 2, 5
HOST_BATCHES = {                 # max_num_seqs 4: the capture ceiling is min(2 x 4 x 1, 512) = 8 tokens
    "uniform4": [(1, 99)] * 4,
    "uniform8": [(1, 99)] * 8,   # at the ceiling
    "uniform9": [(1, 99)] * 9,   # one past it
    "mixed": [(1, 99), (1, 99), (5, 0)],
    "empty": [],
}
REPLAYS, EAGER = 10e-6 * PIECES, 3e-6 * LAYERS          # 70 us piecewise; 15 us eager; full: 10 us
# the graph part of the host time, per mode and batch (dispatch, 16 us, is added when non-empty)
HOST_GRAPH = {
    "PIECEWISE": {"uniform4": REPLAYS, "uniform8": REPLAYS, "uniform9": REPLAYS,        # eager is cheaper:
                  "mixed": REPLAYS, "empty": REPLAYS},                                  # never below captured
    "FULL": {"uniform4": 10e-6, "uniform8": 10e-6, "uniform9": EAGER, "mixed": 10e-6, "empty": 10e-6},
    "FULL_AND_PIECEWISE": {"uniform4": 10e-6, "uniform8": 10e-6, "uniform9": EAGER, "mixed": REPLAYS,
                           "empty": 10e-6},
    "FULL_DECODE_ONLY": {"uniform4": 10e-6, "uniform8": 10e-6, "uniform9": EAGER, "mixed": EAGER,
                         "empty": 10e-6},
    "NONE": {"uniform4": EAGER, "uniform8": EAGER, "uniform9": EAGER, "mixed": EAGER, "empty": EAGER},
}


@pytest.mark.parametrize("mode", list(HOST_GRAPH))
def test_cuda_graph_modes_capture_ceiling_and_dispatch(root, mode):
    dep = root(kinds=HOST_KINDS, stack=HOST_STACK, engine={"cudagraph_mode": mode, "max_num_seqs": 4})
    assert dep.resolution["piecewise_segments"] == PIECES == 7
    assert dep.resolution["kernels_per_step"] == KERNELS == 16
    assert dep.resolution["capture_tokens"] == (0 if mode == "NONE" else 8)
    for name, rows in HOST_BATCHES.items():
        r = price(dep, rows)
        dispatch = KERNELS * 1e-6 if rows else 0.0          # every kernel of a non-empty step
        assert totals(r)["host"] == approx(HOST_GRAPH[mode][name] + dispatch), name
    if mode == "PIECEWISE":
        # eager dearer than the replays: past the ceiling the step is priced eager
        r = price(dep, HOST_BATCHES["uniform9"], host_launch_eager_per_layer=20e-6)
        assert totals(r)["host"] == approx(20e-6 * LAYERS + KERNELS * 1e-6)
        r = price(dep, HOST_BATCHES["uniform8"], host_launch_eager_per_layer=20e-6)
        assert totals(r)["host"] == approx(REPLAYS + KERNELS * 1e-6)


@pytest.mark.parametrize("mode,graph", [("PIECEWISE", 10e-6 * (1 + 4 * 3)), ("FULL", 10e-6)])
def test_code_that_breaks_capture_replays_one_piece_per_region(root, mode, graph):
    # the kind's own code leaves 4 captured regions per layer (e.g. DeepSeek-V4.1 around its
    # attention): 4 pieces per layer under piecewise capture; full capture is one replay
    dep = root(kinds={"V": [attn("gqa"), gemm(2048, H)]}, stack={"pattern": ["V"], "repeat": 3},
               capture_breaks={"V": 4}, engine={"cudagraph_mode": mode})
    assert totals(price(dep, syn.decode(2, 100)))["host"] == approx(graph + 3 * 3 * 1e-6)


def test_prefill_only_nodes_run_only_in_a_step_with_a_prefill_row(root):
    nodes = [gemm(2048, H), gemm(H, 2048, phase="prefill"), {"op": "Elementwise", "bytes_per_token": 1000, "phase": "prefill"}]
    dep = root(kinds={"P": nodes}, stack={"pattern": ["P"], "repeat": 3})
    r = price(dep, syn.decode(2, 100))
    rate = BF16 * 0.5 * 2 / 102
    assert layer(r, dep, "P", "sm") == approx(3 * 2 * 2 * 2048 * H / rate)
    assert layer(r, dep, "P", "hbm") == approx(3 * 2048 * H * 2 / HBM)
    assert totals(r)["host"] == approx(10e-6 + 3 * 1e-6)              # neither launched nor dispatched
    r = price(dep, [(1, 99), (99, 0)])                                 # T = 100
    assert layer(r, dep, "P", "sm") == approx(3 * 100 * 2 * (2048 * H + H * 2048) / (BF16 * 0.25))
    assert layer(r, dep, "P", "hbm") == approx(3 * (2 * 2048 * H * 2 + 100 * 1000) / HBM)
    assert totals(r)["host"] == approx(10e-6 + 3 * 3 * 1e-6)
