"""The pure laws against the reference's own numbers (reference-kernel.md section 9B)."""

import numpy as np
import pytest

import jaxprice  # noqa: F401  (enables float64)
from jaxprice._src import laws


@pytest.mark.parametrize("eps_max,m_half,e512,e32", [
    (0.890, 102, 0.742, 0.213), (0.788, 94, 0.666, 0.200), (0.640, 110, 0.527, 0.144)])
def test_efficiency_ramp(eps_max, m_half, e512, e32):
    assert float(laws.ramp(512, eps_max, m_half)) == pytest.approx(e512, abs=5e-4)
    assert float(laws.ramp(32, eps_max, m_half)) == pytest.approx(e32, abs=5e-4)
    assert float(laws.ramp(m_half, eps_max, m_half)) == pytest.approx(eps_max / 2)


def test_ramp_edges():
    assert float(laws.ramp(0, 0.9, 100)) == 0.0
    assert float(laws.ramp(-3, 0.9, 100)) == 0.0
    assert float(laws.ramp(7, 0.9, 0)) == 0.9          # no ramp measured: eps_max
    assert float(laws.shape_factor(0, 512)) == 1.0     # not shape-priced
    assert float(laws.shape_factor(512, 0)) == 1.0     # not measured
    assert float(laws.shape_factor(512, 512)) == 0.5


def test_spans():
    assert laws.ring_span(16, 8, 9) == pytest.approx(1.533, abs=5e-4)
    assert laws.flat_span(16, 8, 9) == 9
    assert laws.all2all_span(16, 8, 9) == pytest.approx(5.267, abs=5e-4)
    assert laws.all2all_span(72, 8, 9) == pytest.approx(8.211, abs=5e-4)
    assert laws.all2all_span(16, 8, 9) / laws.ring_span(16, 8, 9) == pytest.approx(3.435, abs=5e-3)
    assert laws.ring_span(12, 8, 9) == laws.flat_span(12, 8, 9) == 9


@pytest.mark.parametrize("g,n,rho", [(16, 8, 9.0), (32, 8, 9.0), (24, 4, 18.0), (64, 8, 12.0)])
def test_hierarchical_ring_identity(g, n, rho):
    G = g
    expected = (2 * (n - 1) / n + 2 * (g / n - 1) / (g / n) / n * rho) / (2 * (G - 1) / G)
    assert laws.ring_span(g, n, rho) == pytest.approx(expected, rel=1e-12)


H200_AR8 = dict(floor=15.98e-6, transition_rate=92500e6, peak_rate=131566e6)


def test_collective_law_small_message_is_the_floor():
    t = float(laws.collective_time(256, **H200_AR8))
    assert H200_AR8["floor"] <= t <= 1.01 * H200_AR8["floor"]
    assert float(laws.collective_time(0, **H200_AR8)) == H200_AR8["floor"]


def test_collective_law_without_transition_rate():
    for b in (1e3, 1e6, 1e9):
        t = float(laws.collective_time(b, 15.98e-6, 0.0, 131566e6))
        assert t == max(15.98e-6, b / 131566e6)


def test_collective_law_large_messages_reach_the_peak():
    b = 1e12
    t = float(laws.collective_time(b, **H200_AR8))
    assert t == pytest.approx(H200_AR8["floor"] + b / H200_AR8["transition_rate"])
    # and the peak bound takes over where the latency form is the smaller
    assert float(laws.collective_time(b, 0.0, 1e15, 1e9)) == pytest.approx(b / 1e9)


# Measured H200 8-rank fp16 all-reduce latencies (bytes, us) from AISimulate's NCCL 2.29.2 sweep,
# as transcribed in the reference kernel's internal/price/collective_test.go.
H200_AR8_MEASURED = [
    (256, 16.01), (1024, 15.98), (2048, 16.04), (4096, 16.67), (8192, 18.30), (16384, 18.38),
    (32768, 19.89), (65536, 21.45), (131072, 20.80), (262144, 20.46), (524288, 26.14),
    (1048576, 37.46), (2097152, 51.37), (4194304, 78.30), (8388608, 121.74), (16777216, 197.34),
    (33554432, 319.63), (67108864, 564.52), (134217728, 1052.63), (268435456, 2040.31)]


def _geometric_error(predict):
    logs = [abs(np.log(predict(b) / (us * 1e-6))) for b, us in H200_AR8_MEASURED]
    return float(np.exp(np.mean(logs)))


def test_collective_law_fits_the_measured_sweep_within_1_25x():
    assert len(H200_AR8_MEASURED) == 20
    three = _geometric_error(lambda b: float(laws.collective_time(b, **H200_AR8)))
    two = _geometric_error(lambda b: float(laws.collective_time(b, H200_AR8["floor"], 0.0, H200_AR8["peak_rate"])))
    assert three <= 1.25
    assert three < two          # the transition rate earns its place


def test_collective_law_does_not_understate_the_transition_region():
    # 64 KiB .. 8 MiB, where a step's messages fall: the two-parameter form understates by
    # over 2x somewhere; the three-parameter form by at most 1.5x
    region = [(b, us * 1e-6) for b, us in H200_AR8_MEASURED if 64 << 10 <= b <= 8 << 20]
    two = max(t / float(laws.collective_time(b, H200_AR8["floor"], 0.0, H200_AR8["peak_rate"])) for b, t in region)
    three = max(t / float(laws.collective_time(b, **H200_AR8)) for b, t in region)
    assert two >= 2.0
    assert three <= 1.5


def test_the_peak_rate_is_a_ceiling_on_bandwidth():
    floor, peak = 10e-6, 200e9
    b = float(1 << 30)
    assert float(laws.collective_time(b, floor, 10 * peak, peak)) == pytest.approx(b / peak)


def test_window_law():
    assert 4 * float(laws.windowed_pairs(1024, 131072, 2176)) == 4 * 1024 * 2176 == 8_912_896
    assert 4 * float(laws.windowed_pairs(1024, 0, 128)) == 491_520
    for s, p in ((1024, 0), (100, 900), (1, 4095)):
        full = 4 * (s * p + s * s / 2)
        assert 4 * float(laws.windowed_pairs(s, p, s + p)) == pytest.approx(full)
        assert 4 * float(laws.windowed_pairs(s, p, 0)) == pytest.approx(full)   # no window


def test_window_law_matches_the_reference_discrete_chunk_form():
    rng = np.random.default_rng(0)
    for _ in range(200):
        s, p, w = (int(x) for x in rng.integers(1, 5000, size=3))
        n_s = max(0, min(s, w - p))
        discrete = n_s * (p + 1) + n_s * (n_s - 1) / 2 - n_s / 2 + (s - n_s) * w
        assert float(laws.windowed_pairs(s, p, w)) == pytest.approx(discrete, rel=1e-12, abs=1e-9)


def test_decode_reads():
    # dense: the context; a stated window bounds it whatever the kind
    assert float(laws.decode_read_tokens(4096, 0, 0, 0, False)) == 4096
    assert float(laws.decode_read_tokens(4096, 128, 0, 0, False)) == 128
    assert float(laws.decode_read_tokens(100, 128, 0, 0, False)) == 100
    # sparse: top-k of the stream (glm-5: 2048)
    assert float(laws.decode_read_tokens(4096, 0, 2048, 0, True)) == 2048
    assert float(laws.decode_read_tokens(1000, 0, 2048, 0, True)) == 1000
    # sparse: window + top-k of the compressed stream, or the whole compressed stream
    assert float(laws.decode_read_tokens(8192, 128, 512, 4, True)) == 128 + 512
    assert float(laws.decode_read_tokens(8192, 128, 0, 128, True)) == 128 + 64
    # an indexer's compressed keys
    assert float(laws.decode_read_tokens(8192, 0, 0, 4, False)) == 2048


def test_sparse_prefill_pairs_follow_the_decode_read_law():
    # the sum over a chunk's queries of each query's read, in the continuum convention
    s, p = 4096, 0
    topk = 2048
    pairs = float(laws.prefill_pairs(s, p, 0, topk, 0, True))
    expected = float(laws.windowed_pairs(s, p, topk))
    assert pairs == pytest.approx(expected)
    assert pairs < float(laws.windowed_pairs(s, p, 0))


def test_experts_touched():
    assert float(laws.experts_touched(1, 256, 8, 256)) == pytest.approx(8.0)
    assert float(laws.experts_touched(32, 256, 8, 256)) == pytest.approx(163.31, abs=0.01)
    assert float(laws.experts_touched(0, 256, 8, 256)) == 0.0
    assert float(laws.experts_touched(5, 8, 8, 8)) == 8.0        # k >= E: all local experts
    assert float(laws.experts_touched(5, 256, 8, 0)) == 0.0


def test_admission_overhead():
    assert float(laws.admission_overhead(0, 40e-3, 0.35e-6)) == 0.0
    assert float(laws.admission_overhead(1000, 40e-3, 0.35e-6)) == pytest.approx(40e-3 + 0.35e-3)


def test_capture_ceiling():
    assert laws.capture_ceiling(1024, 1, True) == 1024      # Blackwell, 1024 seqs
    assert laws.capture_ceiling(64, 1, False) == 128        # h200, 64 seqs
    assert laws.capture_ceiling(1024, 1, False) == 512      # h200, 1024 seqs
