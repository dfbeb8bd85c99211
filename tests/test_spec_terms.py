"""Every term of pricing-a-step.md on small synthetic graphs and round coefficients.

The reference data (the bundled registry and the 88 scenarios) cannot exercise most of the
spec: no graph there marks a node replicated or prefill-only, states mHC, a parallel-block
drafter or capture breaks, and no set carries a measured prefill form, a recurrent prefill
rate or a grouped four-bit ramp. Each test here builds a tiny registry (tests/synthetic.py),
prices one batch, and asserts the price of one term, written out by hand from the formula in
pricing-a-step.md (and reference-kernel.md where the spec leaves a detail open). Most also
inflate one coefficient and assert exactly which outputs move.

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
from synthetic import BF16, FP8, HBM, NVFP4, TF32, layer, price, totals
from jaxprice import JaxpriceError

REL = 1e-12
H = syn.HIDDEN


def approx(x):
    return pytest.approx(x, rel=REL, abs=1e-18)


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


def test_recurrent_decode_and_measured_prefill_rates(root):
    dep = root(kinds={"r": GDN}, coefficients=REC_DECODE + REC_PREFILL)
    assert layer(price(dep, MIXED), dep, "r", "sm") == approx(4e-6 + 10 / 1e8 + 6e-6 + 200 / 1e9)
    assert layer(price(dep, [(1, 99)] * 10), dep, "r", "sm") == approx(4e-6 + 10 / 1e8)
    assert layer(price(dep, prefill(200)), dep, "r", "sm") == approx(6e-6 + 200 / 1e9)
    base = price(dep, MIXED)
    r = price(dep, MIXED, recurrent_prefill_rate_gdn=2e9)
    assert moved(base, r) == {"sm"}
    assert layer(r, dep, "r", "sm") == approx(4e-6 + 10 / 1e8 + 6e-6 + 200 / 2e9)


def test_recurrent_prefill_without_a_rate_is_the_chunked_scan(root):
    dep = root(kinds={"r": GDN}, coefficients=REC_DECODE)
    # per token and head: intra-chunk attention over 64-token chunks (4 x 64 x d) plus the
    # state read and update (4 x d x state), at the BF16 ramp
    scan = 200 * 8 * (4 * 64 * 128 + 4 * 128 * 128) / (BF16 * 0.5 * 210 / 310)
    assert layer(price(dep, MIXED), dep, "r", "sm") == approx(4e-6 + 10 / 1e8 + scan)
