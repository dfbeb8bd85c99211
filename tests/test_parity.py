"""Parity with the reference curve (reference-kernel.md section 9A, the spec's figure).

DeepSeek-V3 on 8 H200 (fp8, tp8, PIECEWISE); B requests each decoding 1 token at context
4096; decode threshold 8. The table is decoded from the reference's generated figure (±0.03 ms).
"""

import numpy as np
import pytest

import jaxprice as jp

SCENARIO = "deepseek-v3-h200-fp8-sglang-tp8"
# B: (HBM, SM, NVLink, host, NoOverlap, Overlap), ms
REFERENCE = {
    1: (2.07, 3.52, 0.60, 3.55, 9.71, 8.81),
    2: (2.75, 3.55, 0.60, 3.55, 10.45, 9.52),
    4: (4.09, 3.60, 0.65, 3.55, 11.86, 10.91),
    8: (6.52, 3.74, 0.71, 3.55, 14.48, 13.45),
    16: (10.61, 3.98, 0.85, 3.55, 18.98, 17.78),
    32: (16.50, 4.47, 1.12, 3.55, 25.64, 24.11),
    64: (22.99, 5.45, 1.64, 3.55, 33.63, 31.50),
    128: (28.58, 7.42, 2.73, 3.55, 42.27, 38.89),
    256: (35.24, 11.37, 4.88, 3.55, 55.01, 49.17),
}
SIZES = sorted(REFERENCE)


@pytest.fixture(scope="module")
def curve():
    dep = jp.load_deployment(SCENARIO)
    batches = jp.Batch.stack([jp.Batch.decode(b, 4096, pad_to=256, decode_threshold=8) for b in SIZES])
    res = jp.price_many(dep.plan, dep.coefficients, batches)
    return {b: {"sm": float(res.resources[i, 0]) * 1e3, "hbm": float(res.resources[i, 1]) * 1e3,
                "nvlink": float(res.resources[i, 2]) * 1e3, "nic": float(res.resources[i, 3]) * 1e3,
                "host": float(res.resources[i, 4]) * 1e3, "no_overlap": float(res.no_overlap[i]) * 1e3,
                "overlap": float(res.overlap[i]) * 1e3,
                "bottleneck": jp.RESOURCES[int(res.bottleneck[i])]} for i, b in enumerate(SIZES)}


def test_host_is_3_54_ms_at_every_batch_size(curve):
    # 7 us x 62 pieces + 3.2 us x 972 kernels = 3544.4 us
    for b in SIZES:
        assert curve[b]["host"] == pytest.approx(3.5444, abs=1e-9)


@pytest.mark.parametrize("b", SIZES)
def test_hbm_and_nvlink_within_3_percent(curve, b):
    hbm, _sm, nvlink, _host, _no, _ov = REFERENCE[b]
    assert curve[b]["hbm"] == pytest.approx(hbm, rel=0.03)
    assert curve[b]["nvlink"] == pytest.approx(nvlink, rel=0.03)


@pytest.mark.parametrize("b", SIZES)
def test_no_overlap_within_5_percent_and_sm_overlap_close(curve, b):
    _hbm, sm, _nv, _host, no_overlap, overlap = REFERENCE[b]
    assert curve[b]["no_overlap"] == pytest.approx(no_overlap, rel=0.05)
    # tighter than the issue asks: the curve is reproduced to the figure's reading error
    assert curve[b]["no_overlap"] == pytest.approx(no_overlap, abs=0.05)
    assert curve[b]["overlap"] == pytest.approx(overlap, abs=0.05)
    assert curve[b]["sm"] == pytest.approx(sm, abs=0.05)


def test_no_collective_leaves_the_node(curve):
    assert all(curve[b]["nic"] == 0.0 for b in SIZES)


def test_bottleneck_host_then_hbm(curve):
    assert [curve[b]["bottleneck"] for b in (1, 2)] == ["host", "host"]
    assert all(curve[b]["bottleneck"] == "hbm" for b in SIZES[2:])


def test_host_and_sm_within_one_percent_at_one_request(curve):
    assert curve[1]["host"] == pytest.approx(3.54, abs=0.005)
    assert curve[1]["sm"] == pytest.approx(3.51, abs=0.01)
    assert abs(curve[1]["host"] - curve[1]["sm"]) / curve[1]["host"] < 0.01


def test_256_requests_multiply_step_by_6_and_divide_per_request_time_by_45(curve):
    growth = curve[256]["no_overlap"] / curve[1]["no_overlap"]
    per_request = (curve[1]["no_overlap"] / 1) / (curve[256]["no_overlap"] / 256)
    assert growth == pytest.approx(5.7, abs=0.35)      # "about 6"
    assert per_request == pytest.approx(45, abs=2.5)   # "about 45"


def test_the_32_request_example():
    dep = jp.load_deployment(SCENARIO)
    r = jp.price(dep.plan, dep.coefficients, jp.Batch.decode(32, 4096, decode_threshold=8)).as_dict()
    assert r["overlap"] * 1e3 == pytest.approx(24.1, abs=0.05)
    assert r["no_overlap"] * 1e3 == pytest.approx(25.6, abs=0.05)
    assert r["bottleneck"] == "hbm"
    for name, ms in (("sm", 4.5), ("hbm", 16.5), ("nvlink", 1.1), ("host", 3.5)):
        assert r[name] * 1e3 == pytest.approx(ms, abs=0.05), name


def test_padding_does_not_change_the_price():
    dep = jp.load_deployment(SCENARIO)
    tight = jp.price(dep.plan, dep.coefficients, jp.Batch.decode(32, 4096, decode_threshold=8))
    padded = jp.price(dep.plan, dep.coefficients, jp.Batch.decode(32, 4096, pad_to=512, decode_threshold=8))
    np.testing.assert_array_equal(np.asarray(tight.resources), np.asarray(padded.resources))
    assert float(tight.overlap) == float(padded.overlap)


@pytest.mark.parametrize("b", SIZES)
def test_every_column_within_the_figures_reading_error(curve, b):
    # the table was decoded from the figure's SVG coordinates to +-0.03 ms
    hbm, sm, nvlink, host, no_overlap, overlap = REFERENCE[b]
    got = curve[b]
    for name, ref in (("hbm", hbm), ("sm", sm), ("nvlink", nvlink), ("host", host),
                      ("no_overlap", no_overlap), ("overlap", overlap)):
        assert got[name] == pytest.approx(ref, abs=0.03), name


def test_sm_is_exactly_linear_in_the_batch(curve):
    # section 9A: every GEMM runs at eps(T) = eps_max T / (T + m_half), so T x flops / (P eps(T))
    # = flops (T + m_half) / (P eps_max): affine in T, slope 0.0308 ms per request
    slopes = np.diff([curve[b]["sm"] for b in SIZES]) / np.diff(SIZES)
    np.testing.assert_allclose(slopes, slopes[0], rtol=1e-9)
    assert slopes[0] == pytest.approx(0.0308, abs=0.0001)
