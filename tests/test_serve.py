"""The serving simulation: vLLM v1's scheduler (schedule.py) and its metrics (serve.py).

Hand-worked cases fix the exact composition of every step; random workloads compare the array
scheduler (lax loop, decode runs) with the plain-Python reference scheduler, and check the
invariants; pricing and gradients are checked against price() and central differences. All
small cases share one compiled scheduler (the shape buckets of serve.MIN_*).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprice as jp
from jaxprice._src import schedule as S
from jaxprice._src import serve

DEP = "deepseek-v3-h200-fp8-sglang-tp8"
SYNC = {"async_scheduling": False}


@pytest.fixture(scope="module")
def dep():
    return jp.load_deployment(DEP)


def _sched(dep, isl, osl, c, n=None, rr=1.0, seed=0, **engine):
    return jp.build_schedule(dep, jp.Workload(isl, osl, rr, seed), jp.ClosedLoop(c, n), engine=engine)


def _reference(sched, ins, outs, c):
    st = sched.settings
    return S.reference_schedule(list(ins), list(outs), concurrency=c, max_num_seqs=st["max_num_seqs"],
                                budget=st["max_num_batched_tokens"], block_size=st["block_size"],
                                kv_blocks=st["kv_blocks"], max_model_len=st["max_model_len"],
                                k=st["num_spec_tokens"], lookahead=st["lookahead"], acceptance=st["acceptance"],
                                reserve_full_isl=st["reserve_full_isl"], async_scheduling=st["async_scheduling"],
                                reserve_to_completion=st["scheduler"] in serve.RESERVE_TO_COMPLETION,
                                prefill_first=st["scheduler"] in serve.PREFILL_FIRST)


# ----------------------------------------------------------------------------- hand-worked


def test_two_requests_tiny_budget_every_step(dep):
    """Budget 8, two prompts of 10, 3 outputs each (sync scheduling):
    step 0: A prefills 8 | 1: A its last 2, B its first 6 (A's first token) | 2: A decodes, B its
    last 4 (B's first token) | 3: A and B decode (A finishes) | 4: B decodes (B finishes)."""
    sc = _sched(dep, 10, 3, 2, 2, max_num_batched_tokens=8, max_num_seqs=2, **SYNC)
    s = sc.sums
    assert sc.steps == 5
    np.testing.assert_array_equal(s["tokens"][0], [8, 8, 5, 2, 1])
    np.testing.assert_array_equal(s["prefill_tokens"][0], [8, 8, 4, 0, 0])
    np.testing.assert_array_equal(s["n_prefill"][0], [1, 2, 1, 0, 0])
    np.testing.assert_array_equal(s["n_decode"][0], [0, 0, 1, 2, 1])
    # dense MLA law: a decode row reads its context (computed + scheduled)
    np.testing.assert_array_equal(s["reads"][0][:, 0], [0, 0, 11, 12 + 11, 12])
    # prefill pairs (x4) of chunks (c, c + s]: 4 (s c + s^2 / 2)
    pairs = lambda sch, c: 4 * (sch * c + sch * sch / 2)  # noqa: E731
    np.testing.assert_allclose(s["pairs"][0][:, 0], [pairs(8, 0), pairs(2, 8) + pairs(6, 0), pairs(4, 6), 0, 0])
    np.testing.assert_array_equal(sc.requests["first_step"], [1, 2])
    np.testing.assert_array_equal(sc.requests["finish_step"], [3, 4])
    # times by hand: step times 1..5 s -> ends 1, 3, 6, 10, 15; each request also waits its
    # admission latency (the registry's 40000 us + 0.35 us x 10 prompt tokens) before the engine
    # sees it, and E2E adds host_completion (777.3 us); both arrive at t = 0 into an idle engine
    # (no schedule() wait). TPOT is untouched.
    adm, done = 0.04 + 10 * 0.35e-6, 777.3e-6
    m = jp.schedule_metrics(sc, np.arange(1.0, 6.0))
    np.testing.assert_allclose(m["ttft"], [3.0 + adm, 6.0 + adm], rtol=1e-12)
    np.testing.assert_allclose(m["tpot"], [(10 - 3) / 2, (15 - 6) / 2])
    np.testing.assert_allclose(m["e2e"], [10.0 + adm + done, 15.0 + adm + done], rtol=1e-12)
    np.testing.assert_array_equal(m["wait"], [0.0, 0.0])
    assert m["summary"]["ttft_mean"] == pytest.approx(4.5 + adm, rel=1e-12)
    assert m["summary"]["ttft_admission_mean"] == pytest.approx(adm, rel=1e-12)
    # throughput over the client's wall time: B's last token reaches it at 15 + adm, E2E adds done
    assert m["summary"]["output_tps"] == pytest.approx(6 / (15 + adm + done), rel=1e-12)
    # without the host latencies (coefficients set to 0) the times are the steps' alone
    zero = dep.coefficients.replace(host_admission_per_request=0.0, host_admission_per_token=0.0,
                                    host_completion=0.0)
    m0 = jp.schedule_metrics(sc, np.arange(1.0, 6.0), coefficients=zero)
    np.testing.assert_allclose(m0["ttft"], [3.0, 6.0])
    np.testing.assert_allclose(m0["e2e"], [10.0, 15.0])
    assert m0["summary"]["output_tps"] == pytest.approx(6 / 15, rel=1e-12)


def test_a_later_request_waits_admission_and_the_step_in_flight(dep):
    """C = 2, three prompts of 10, budget 8, sync: A and B as above; C is sent when A's last
    token comes out (end of step 3 = 1+2+3+4 = 10 s at step times 1..8 s), prefills 7 tokens
    in step 4 beside B's decode and its last 3 in step 5 (its first token: end 21 s). It reaches
    the scheduler its admission latency L later, in the middle of a running step, so it also
    waits half of one (step 4's 5 s, the step after A's last): TTFT = 11 + L + 2.5 s."""
    sc = _sched(dep, 10, 3, 2, 3, max_num_batched_tokens=8, max_num_seqs=2, **SYNC)
    np.testing.assert_array_equal(sc.sums["tokens"][0], [8, 8, 5, 2, 8, 3, 1, 1])
    np.testing.assert_array_equal(sc.requests["arrival_step"], [-1, -1, 3])
    np.testing.assert_array_equal(sc.requests["first_step"], [1, 2, 5])
    dt = np.arange(1.0, 9.0)
    adm = 0.04 + 10 * 0.35e-6
    m = jp.schedule_metrics(sc, dt)
    np.testing.assert_allclose(m["wait"], [0.0, 0.0, 2.5])
    np.testing.assert_allclose(m["ttft"], [3 + adm, 6 + adm, 11 + adm + 2.5], rtol=1e-12)
    np.testing.assert_allclose(m["tpot"], [(10 - 3) / 2, (15 - 6) / 2, (36 - 21) / 2])   # finishes step 7
    # engine setting arrival_phase: the share of the step waited (0: none)
    none = _sched(dep, 10, 3, 2, 3, max_num_batched_tokens=8, max_num_seqs=2, arrival_phase=0.0, **SYNC)
    assert jp.schedule_metrics(none, dt)["ttft"][2] == pytest.approx(11 + adm, rel=1e-12)
    # with no admission latency the request lands just after the boundary: the whole step (5 s)
    zero = dep.coefficients.replace(host_admission_per_request=0.0, host_admission_per_token=0.0)
    assert jp.schedule_metrics(sc, dt, coefficients=zero)["ttft"][2] == pytest.approx(16.0)
    # the wait is linear in the step times: its gradient is the phase on that one step
    g = jax.grad(lambda t: jp.schedule_metrics(sc, t)["wait"][2])(jnp.asarray(dt))
    np.testing.assert_array_equal(np.asarray(g), [0, 0, 0, 0, 0.5, 0, 0, 0])
    # so the means are affine in the step times: jacobian @ times + the offsets (the admission)
    np.testing.assert_allclose(serve.metric_offsets(sc), [0.0, adm], rtol=1e-12)
    means = lambda t: jnp.stack([jp.schedule_metrics(sc, t)["summary"][k] for k in ("tpot_mean", "ttft_mean")])  # noqa: E731
    jac = np.asarray(jax.jacrev(means)(jnp.ones(8)))
    np.testing.assert_allclose(jac @ dt + serve.metric_offsets(sc), np.asarray(means(jnp.asarray(dt))), rtol=1e-12)
    with pytest.raises(jp.JaxpriceError, match="arrival_phase"):
        _sched(dep, 10, 3, 2, 3, arrival_phase=2.0)


def test_preemption_and_recompute_by_hand(dep):
    """3 usable blocks of 4 tokens, prompts of 4, 6 outputs, first-chunk admission (V-old):
    both admitted at step 0 (1 block each); at step 1 A grows into a 2nd block and B cannot,
    so B (the latest admitted) is preempted; A runs alone to its finish at step 5 (its 3rd block
    at step 5); B is readmitted at step 6, recomputing its prompt AND its first output (5 tokens),
    emits its 2nd token there and finishes at step 10."""
    sc = _sched(dep, 4, 6, 2, 2, block_size=4, kv_capacity_tokens=16, reserve_full_isl=False, **SYNC)
    s = sc.sums
    assert sc.settings["kv_blocks"] == 3
    np.testing.assert_array_equal(s["tokens"][0], [8, 1, 1, 1, 1, 1, 5, 1, 1, 1, 1])
    np.testing.assert_array_equal(s["preempted"][0], [0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    # blocks held after each step; steps 7-10 are one decode run, recorded at its last (peak) value
    np.testing.assert_array_equal(s["kv_blocks"][0], [2, 2, 2, 2, 2, 3, 2, 3, 3, 3, 3])
    np.testing.assert_array_equal(sc.requests["preemptions"], [0, 1])
    np.testing.assert_array_equal(sc.requests["first_step"], [0, 0])
    np.testing.assert_array_equal(sc.requests["finish_step"], [5, 10])
    np.testing.assert_array_equal(sc.requests["emits"], [6, 6])     # every request: exactly its outputs
    # with the full-prompt gate nothing is over-admitted here either (both prompts fit), same step 1
    full = _sched(dep, 4, 6, 2, 2, block_size=4, kv_capacity_tokens=16, reserve_full_isl=True, **SYNC)
    assert full.requests["preemptions"].sum() == 1


def test_async_frees_one_step_later(dep):
    """Under async scheduling a finished request's slot (and its client's next request) is used
    one step later: C = 1, two requests of 4 + 3 tokens."""
    sync = _sched(dep, 4, 3, 1, 2, **SYNC)
    asy = _sched(dep, 4, 3, 1, 2, async_scheduling=True)
    np.testing.assert_array_equal(sync.sums["tokens"][0], [4, 1, 1, 4, 1, 1])
    np.testing.assert_array_equal(asy.sums["tokens"][0], [4, 1, 1, 0, 4, 1, 1])
    # the idle step costs nothing, so TTFT is the same
    t_sync = sync.step_times(jp.load_deployment(DEP).coefficients)
    t_asy = asy.step_times(jp.load_deployment(DEP).coefficients)
    assert float(t_asy[3]) == 0.0
    np.testing.assert_allclose(jp.schedule_metrics(asy, np.asarray(t_asy))["ttft"],
                               jp.schedule_metrics(sync, np.asarray(t_sync))["ttft"])


def test_reserve_to_completion_admits_only_what_can_finish(dep):
    """TensorRT-LLM's GUARANTEED_NO_EVICT: 5 usable blocks of 4 tokens, prompts of 4, 6 outputs
    (10 tokens, 3 blocks each at the end), C = 2, sync. A is admitted (3 blocks reserved); B
    would need 3 beside A's 2 blocks still to come: 5 - 1 held - 2 reserved = 2 < 3, and that
    margin stays 2 while A grows, so B waits for A's finish (step 5) and runs alone from step 6.
    vLLM's scheduler admits both and preempts B instead."""
    trt = _sched(dep, 4, 6, 2, 2, block_size=4, kv_capacity_tokens=24, scheduler="trtllm", **SYNC)
    assert trt.settings["kv_blocks"] == 5
    np.testing.assert_array_equal(trt.sums["tokens"][0], [4, 1, 1, 1, 1, 1, 4, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(trt.requests["first_step"], [0, 6])
    np.testing.assert_array_equal(trt.requests["finish_step"], [5, 11])
    assert trt.requests["preemptions"].sum() == 0 and trt.sums["preempted"][0].sum() == 0
    vllm = _sched(dep, 4, 6, 2, 2, block_size=4, kv_capacity_tokens=24, **SYNC)
    assert vllm.sums["tokens"][0][0] == 8 and vllm.requests["preemptions"].sum() == 1
    # with room for both (7 blocks: 3 + 3 <= 7 - 0) TRT admits both at step 0
    roomy = _sched(dep, 4, 6, 2, 2, block_size=4, kv_capacity_tokens=32, scheduler="trtllm", **SYNC)
    np.testing.assert_array_equal(roomy.requests["first_step"], [0, 0])


def test_sglang_runs_prefill_first_without_mixing(dep):
    """SGLang (mixed chunks off): a step runs prefill work only, or else every decode row.
    Budget 8, two prompts of 10, 3 outputs each, sync: step 0 A's first 8 | 1: A's last 2 (its
    first token) and B's first 6 | 2: B's last 4 (B's first token) while A waits | 3, 4: both
    decode (both finish at step 4). vLLM runs A's decode beside B's chunk in step 2 instead."""
    sc = _sched(dep, 10, 3, 2, 2, max_num_batched_tokens=8, max_num_seqs=2, scheduler="sglang", **SYNC)
    s = sc.sums
    np.testing.assert_array_equal(s["tokens"][0], [8, 8, 4, 2, 2])
    np.testing.assert_array_equal(s["n_decode"][0], [0, 0, 0, 2, 2])
    np.testing.assert_array_equal(sc.requests["first_step"], [1, 2])
    np.testing.assert_array_equal(sc.requests["finish_step"], [4, 4])
    # decode steps take no token budget: 6 decodes beside a budget of 4
    many = _sched(dep, 4, 5, 6, 6, max_num_batched_tokens=4, max_num_seqs=6, scheduler="sglang", **SYNC)
    assert many.sums["tokens"][0].max() == 6 and many.sums["n_decode"][0].max() == 6
    # SGLang's chunk default by GPU memory (a scenario's own max_num_batched_tokens wins over it)
    assert [serve._sglang_chunk(g)[0] for g in (30.0, 80.0, 141.0, 180.0)] == [2048, 8192, 8192, 16384]
    with pytest.raises(jp.JaxpriceError, match="unknown scheduler"):
        _sched(dep, 10, 3, 2, 2, scheduler="tgi")


# ----------------------------------------------------------------------------- random workloads

CASES = [
    dict(c=4, isl=200, osl=40, engine=dict(SYNC)),
    dict(c=6, isl=120, osl=70, engine=dict(max_num_batched_tokens=64, max_num_seqs=4, async_scheduling=True)),
    dict(c=5, isl=100, osl=60, engine=dict(max_num_batched_tokens=48, kv_capacity_tokens=16 * 25,
                                           reserve_full_isl=False, **SYNC)),
    dict(c=7, isl=90, osl=50, engine=dict(max_num_batched_tokens=40, kv_capacity_tokens=16 * 30,
                                          reserve_full_isl=True, async_scheduling=True)),
    dict(c=6, isl=100, osl=60, engine=dict(max_num_batched_tokens=48, kv_capacity_tokens=16 * 30,
                                           scheduler="trtllm", **SYNC)),
    dict(c=6, isl=100, osl=60, engine=dict(max_num_batched_tokens=48, kv_capacity_tokens=16 * 30,
                                           scheduler="sglang", async_scheduling=True)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_random_workloads_match_reference_and_invariants(dep, case):
    cfg = CASES[case]
    c, n = cfg["c"], 6 * cfg["c"]
    w = jp.Workload(cfg["isl"], cfg["osl"], 0.5, seed=case)
    sc = jp.build_schedule(dep, w, jp.ClosedLoop(c, n), engine=cfg["engine"])
    ins, outs = w.lengths(n)
    ref = _reference(sc, ins, outs, c)
    ref_tokens = [sum(r[1] for r in rows) for rows in ref["steps"]]
    # the reference runs one extra (empty) step to release the last async request
    assert sc.steps in (len(ref_tokens), len(ref_tokens) - 1)
    np.testing.assert_array_equal(sc.sums["tokens"][0], ref_tokens[:sc.steps])
    np.testing.assert_array_equal(sc.requests["first_step"], ref["first"])
    np.testing.assert_array_equal(sc.requests["finish_step"], ref["finish"])
    np.testing.assert_array_equal(sc.requests["preemptions"], ref["preemptions"])
    st, s = sc.settings, sc.sums
    # invariants
    np.testing.assert_array_equal(sc.requests["emits"], outs)             # exactly its output tokens
    assert (s["tokens"] <= st["max_num_batched_tokens"]).all()
    assert (s["resident"] <= st["max_num_seqs"]).all()
    assert (s["kv_blocks"] <= st["kv_blocks"]).all()
    assert (s["resident"] + s["waiting"] <= c).all()                       # closed loop: <= C in flight
    assert (sc.requests["first_step"] <= sc.requests["finish_step"]).all()
    if st["scheduler"] != "vllm":                                           # reserved: never preempts
        assert sc.requests["preemptions"].sum() == 0
        assert (s["resident"][0] < c).any()                                 # the KV limit binds
    elif case >= 2:
        assert sc.requests["preemptions"].sum() > 0                         # the KV cases do preempt


def test_a_request_preempted_after_its_last_token_matches_reference(dep):
    """Async scheduling under KV pressure: a request that finished in step s still sits in the
    batch while step s + 1 is scheduled, and may be the one preempted; it leaves the waiting queue
    when its output is processed (vLLM's update_from_output drops a stopped preempted request), not
    recomputed. The reference scheduler crashed on it (it looked for the request in the batch)."""
    eng = dict(max_num_batched_tokens=48, kv_capacity_tokens=256, async_scheduling=True, reserve_full_isl=False,
               max_num_seqs=5, block_size=16)      # 16-token blocks (FLASHMLA's own 64 are too coarse for the case)
    w = jp.Workload(73, 33, 0.5, seed=31)
    sc = jp.build_schedule(dep, w, jp.ClosedLoop(4, 24), engine=eng)
    ins, outs = w.lengths(24)
    ref = _reference(sc, ins, outs, 4)
    assert ref["preempted_finished"] > 0                                  # the case is exercised
    np.testing.assert_array_equal(sc.requests["finish_step"], ref["finish"])
    np.testing.assert_array_equal(sc.requests["preemptions"], ref["preemptions"])
    np.testing.assert_array_equal(sc.sums["tokens"][0], [sum(r[1] for r in rows) for rows in ref["steps"]][:sc.steps])
    np.testing.assert_array_equal(sc.requests["emits"], outs)


def test_speculative_decoding_matches_reference(dep):
    """1 + k tokens per decode row, acceptance 1.6 tokens per step (the G(s) pattern). The
    speculation is the scenario's (the plan prices 1 + k token rows and the drafter's passes):
    an engine= override of num_spec_tokens the plan was not resolved for is refused."""
    import dataclasses
    spec = jp.resolve(dataclasses.replace(dep.scenario, engine={**dep.scenario.engine,
                                                                 "speculative": {"num_spec_tokens": 2}}))
    eng = dict(lookahead=2, decode_threshold=3, **SYNC)
    w = jp.Workload(50, 40, 0.5, seed=3)
    with pytest.raises(jp.JaxpriceError, match=r"field 'num_spec_tokens', value 2: speculative decoding changes"):
        jp.build_schedule(dep, w, jp.ClosedLoop(3, 9), engine=dict(eng, num_spec_tokens=2), acceptance=1.6)
    sc = jp.build_schedule(spec, w, jp.ClosedLoop(3, 9), engine=eng, acceptance=1.6)
    assert sc.settings["num_spec_tokens"] == 2
    ins, outs = w.lengths(9)
    ref = _reference(sc, ins, outs, 3)
    np.testing.assert_array_equal(sc.sums["tokens"][0], [sum(r[1] for r in rows) for rows in ref["steps"]])
    np.testing.assert_array_equal(sc.requests["finish_step"], ref["finish"])
    assert set(np.unique(sc.sums["n_decode"][0] * 3 - sc.sums["decode_tokens"][0])) == {0.0}
    # fewer steps than one token per step would take
    assert sc.steps < sum(outs) / 3 + 9 * 2


# ----------------------------------------------------------------------------- time


def test_c1_tpot_is_one_decode_step_plus_host(dep):
    sc = _sched(dep, 512, 64, 1, 3)
    coefs = dep.coefficients
    dt = np.asarray(sc.step_times(coefs))
    m = jp.schedule_metrics(sc, dt)
    host = float(coefs["host_output_token"])
    ctx = 512 + np.arange(1, 64)                  # context of the decode steps (computed + 1)
    steps = [float(jp.price(dep.plan, coefs, jp.Batch.decode(1, int(x), pad_to=8)).no_overlap) + host for x in ctx]
    np.testing.assert_allclose(m["tpot"], np.mean(steps), rtol=1e-12)
    # TTFT of the first request: its admission latency (40000 us + 0.35 us x 512 prompt tokens,
    # the registry's) and one prefill step of 512 tokens (+ host, it emits); C = 1: no request
    # ever meets a busy engine, so none waits for a schedule() call
    pre = float(jp.price(dep.plan, coefs, jp.Batch.from_requests([512], [0], pad_to=8)).no_overlap) + host
    assert float(coefs["host_admission_per_request"]) == 0.04
    assert m["ttft"][0] == pytest.approx(0.04 + 512 * 0.35e-6 + pre, rel=1e-12)
    np.testing.assert_array_equal(m["wait"], 0.0)


def test_vmapped_pricing_equals_price_step_by_step():
    """Every step of a schedule with prefill chunks, mixed batches and a sliding-window law,
    priced from its row sums, equals price() of the step's batch (from the reference scheduler)."""
    d = jp.load_deployment("gpt-oss-120b-h200-fp4-vllm-tp1")
    w = jp.Workload(150, 40, 0.5, seed=1)
    sc = jp.build_schedule(d, w, jp.ClosedLoop(4, 12), engine=dict(max_num_batched_tokens=64, **SYNC))
    assert sc.sums["reads"].shape[-1] >= 2            # dense and windowed laws
    ins, outs = w.lengths(12)
    ref = _reference(sc, ins, outs, 4)
    dt = np.asarray(sc.step_times(d.coefficients))
    host = float(d.coefficients.get("host_output_token", 0.0))
    thr = sc.settings["decode_threshold"]
    step = jax.jit(lambda b: jp.step_time(d.plan, d.coefficients, b).no_overlap)
    emit = sc.sums["emit"][0]
    for i in np.linspace(0, sc.steps - 1, 40).astype(int):
        rows = ref["steps"][i]
        b = jp.Batch.from_requests([r[1] for r in rows], [r[2] for r in rows], pad_to=8, decode_threshold=thr)
        want = float(step(b)) + (host if emit[i] > 0 else 0.0)
        assert dt[i] == pytest.approx(want, rel=1e-12, abs=1e-15), i


def test_gradients_equal_central_differences(dep):
    sc = _sched(dep, 300, 30, 3, 9, rr=0.5, max_num_batched_tokens=256, **SYNC)
    coefs = dep.coefficients
    names = ("hbm_derate", "host_output_token")

    def f(vals, key):
        c = coefs.replace(**{n: v for n, v in zip(names, vals)})
        return jp.schedule_metrics(sc, sc.step_times(c))["summary"][key]

    x0 = jnp.asarray([float(coefs[n]) for n in names])
    for key in ("tpot_mean", "ttft_mean", "e2e_p99"):
        g = np.asarray(jax.grad(lambda v: f(v, key))(x0))
        for i in range(len(names)):
            h = 1e-6 * float(x0[i])
            e = jnp.zeros(len(names)).at[i].set(h)
            fd = (float(f(x0 + e, key)) - float(f(x0 - e, key))) / (2 * h)
            assert g[i] == pytest.approx(fd, rel=1e-5), (key, names[i])


def test_simulate_result_and_sweep(dep):
    w = jp.Workload(256, 32)
    res = jp.simulate_sweep(dep, w, [1, 4], engine=SYNC)
    one = jp.simulate(dep, w, jp.ClosedLoop(4), engine=SYNC)
    assert res[1].summary["tpot_mean"] == pytest.approx(one.summary["tpot_mean"], rel=1e-12)
    assert res[0].summary["tpot_mean"] < res[1].summary["tpot_mean"]
    s = one.summary
    assert s["steps"] == one.steps["time"].size and s["resident_peak"] == 4
    assert s["output_tps"] == pytest.approx(one.requests["output_len"].sum() / s["duration"])
    assert s["output_tps_per_gpu"] == pytest.approx(s["output_tps"] / 8)
    assert one.requests["ttft"].shape == (40,) and (one.requests["ttft"] > 0).all()
    assert one.assumptions["max_num_batched_tokens"][0] == 8192
    assert one.assumptions["async_scheduling"] == (False, "engine= override")
    ov = jp.simulate(dep, w, jp.ClosedLoop(4), engine=SYNC, estimate="overlap")
    assert ov.summary["tpot_mean"] <= s["tpot_mean"]


def test_one_token_outputs_have_no_tpot_and_report_zero_as_the_client(dep):
    # a prefill-only workload: every request emits one token, so no request has a TPOT; the
    # client reports 0 (its `tpots or 0`) and interactivity 0, never NaN, infinity or a crash
    res = jp.simulate(dep, jp.Workload(256, 1), jp.ClosedLoop(2, 4), engine=SYNC)
    s = res.summary
    assert all(s[f"tpot_{k}"] == 0.0 for k in ("mean", "median", "p90", "p99"))
    assert s["output_tps_per_user"] == 0.0
    assert s["ttft_mean"] > 0 and np.isfinite(s["e2e_p99"]) and s["output_tps"] > 0
    # one multi-token request among one-token ones: TPOT is that request's alone
    mixed = jp.simulate(dep, jp.Workload(256, 3, 0.0, 1), jp.ClosedLoop(2, 8), engine=SYNC)
    r = mixed.requests
    kept = r["output_len"] > 1
    assert 0 < kept.sum() < kept.size
    assert mixed.summary["tpot_mean"] == pytest.approx(r["tpot"][kept].mean(), rel=1e-12)


def test_batched_schedules_across_deployments_equal_one_by_one(dep):
    """Lanes of several deployments (other read laws, dp = 2) share scheduler calls and give the
    schedules each deployment builds alone; a run that cannot fit is refused on its own."""
    other = jp.load_deployment("minimax-m2.5-b200-fp4-vllm-tp2-ep4-dp2")
    w = jp.Workload(120, 24, 0.5, seed=3)
    eng = dict(max_num_batched_tokens=96, **SYNC)
    items = [(w, jp.ClosedLoop(c, 3 * c)) for c in (3, 18)]
    tiny = dict(eng, kv_capacity_tokens=64)                 # 4 blocks: fewer than one request needs
    got = serve.build_schedules_batched([(dep, items, eng), (other, items, eng), (dep, items[:1], tiny)])
    for d, scheds in ((dep, got[0]), (other, got[1])):
        alone = serve.build_schedules(d, items, engine=eng)
        for a, b in zip(alone, scheds):
            assert a.steps == b.steps and a.dp == b.dp
            for k in ("tokens", "prefill_tokens", "n_decode", "reads", "pairs", "finishes"):
                np.testing.assert_array_equal(a.sums[k], b.sums[k])
            for k in ("first_step", "finish_step", "arrival_step", "rank"):
                np.testing.assert_array_equal(a.requests[k], b.requests[k])
    assert got[1][0].dp == 2
    assert isinstance(got[2][0], jp.JaxpriceError) and "fewer than one request needs" in str(got[2][0])


def test_dp_ranks_in_other_shape_buckets_and_fewer_clients_than_ranks():
    """dp = 2: with 33 clients the ranks keep 17 and 16 in flight (two slot buckets, run in
    different scheduler groups, assembled into one run); with 1 client only rank 0 gets
    requests and the other idles (it used to stall, waiting for a client it does not have)."""
    other = jp.load_deployment("minimax-m2.5-b200-fp4-vllm-tp2-ep4-dp2")
    w = jp.Workload(64, 8, 0.5, seed=1)
    eng = dict(max_num_batched_tokens=256, **SYNC)
    one, many = serve.build_schedules_batched([(other, [(w, jp.ClosedLoop(1, 3)), (w, jp.ClosedLoop(33, 66))],
                                                eng)])[0]
    for sc, n in ((one, 3), (many, 66)):
        ins, outs = w.lengths(n)
        np.testing.assert_array_equal(sc.requests["emits"], outs)           # every request served
        assert sc.dp == 2
    assert (one.requests["rank"] == 0).all() and one.sums["tokens"][1].sum() == 0
    np.testing.assert_array_equal(many.requests["rank"], (np.arange(66) % 33) % 2)     # client i mod C's rank
    assert many.sums["resident"][0].max() == 17 and many.sums["resident"][1].max() == 16


def test_open_loop_and_trace(dep, tmp_path):
    res = jp.simulate(dep, jp.Workload(128, 16), jp.OpenLoop(rate=20.0, num_prompts=12, seed=1))
    r = res.requests
    assert (r["first_token"] > r["arrival"]).all() and (r["finish"] >= r["first_token"]).all()
    np.testing.assert_array_equal(r["emits"], r["output_len"])
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_len,output_len\n0.0,100,5\n0.5,50,3\n")
    tr = jp.load_trace(p)
    res = jp.simulate(dep, None, tr)
    assert res.requests["arrival"].tolist() == [0.0, 0.5]
    assert res.requests["first_token"][1] > 0.5


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("make, match", [
    (lambda d: jp.simulate(d, jp.Workload(100, 10), jp.ClosedLoop(0)), "concurrency"),
    (lambda d: jp.simulate(d, jp.Workload(100, 0), jp.ClosedLoop(2)), "osl"),
    (lambda d: jp.simulate(d, jp.Workload(100, 10), jp.ClosedLoop(2), engine={"max_model_len": 64}), "max_model_len"),
    (lambda d: jp.simulate(d, jp.Workload(100, 10), jp.OpenLoop(rate=0.0, num_prompts=3)), "rate"),
    (lambda d: jp.simulate(d, jp.Workload(100, 10), jp.ClosedLoop(2), engine={"kv_capacity_tokens": 64}),
     "KV cache"),
    (lambda d: jp.simulate(d, jp.Workload(100, 10), jp.ClosedLoop(2), engine={"max_num_sequences": 4}), "engine"),
])
def test_bad_input_refused(dep, make, match):
    with pytest.raises(jp.JaxpriceError, match=match):
        make(dep)


@pytest.mark.parametrize("text, where", [
    ("arrival_s,input_len,output_len\n0,10,5\n1,x,5\n", ":3.*input_len.*'x'"),
    ("arrival_s,input_len,output_len\n0,10,5\n-1,10,5\n", ":3.*arrival_s"),
    ("arrival_s,input_len,output_len\n0,10,0\n", ":2.*output_len"),
    ("arrival_s,input_len\n0,10\n", "output_len"),
])
def test_bad_trace_row_refused(tmp_path, text, where):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(jp.JaxpriceError, match=where):
        jp.load_trace(p)


def test_lane_groups_largest_bucket_first_one_size_per_bucket_wide_lanes_alone():
    """The largest slot bucket runs first (the other buckets compile meanwhile); one group size
    per bucket, its last group padded to it (one compiled shape per bucket); lanes of
    ALONE_SLOTS slots or more one per call; the longest expected lanes first."""
    def entry(slots, length, i):
        return ((slots, True), length, {"n": 1}, {}, (0, i, 0))
    entries = [entry(16, 10 * i, i) for i in range(70)] + [entry(512, 5, 70), entry(512, 9, 71), entry(64, 1, 72)]
    groups = serve._lane_groups(entries)
    assert [(g[0][0], g[2], len(g[1])) for g in groups] == [(512, 1, 1), (512, 1, 1), (64, 1, 1), (16, 64, 64),
                                                             (16, 64, 6)]
    assert groups[0][1][0][1] == 9 and [e[1] for e in groups[3][1][:2]] == [690, 680]
    lane = {"n": 4, "concurrency": 4, "plen": np.full(4, 100), "olen": np.full(4, 60)}
    tight = {"max_num_seqs": 8, "block_size": 16, "kv_blocks": 20}        # 4 requests x 10 blocks: 2 x the cache
    assert serve._kv_pressure(lane, tight) == 2.0
    assert serve._expected_length(lane, tight, 100) == 800
    assert serve._expected_length(lane, dict(tight, kv_blocks=80), 100) == 100


def test_a_lane_out_of_records_is_run_again_alone(dep, monkeypatch):
    """A lane whose record estimate is far too small runs out of records in its group; it is run
    again alone with more and gives the schedule a large enough estimate gives."""
    w, client = jp.Workload(32, 16, 0.5, seed=2), jp.ClosedLoop(4, 200)      # 366 records
    want = serve.build_schedules_batched([(dep, [(w, client)], SYNC)])[0][0]
    monkeypatch.setattr(serve, "RECORDS_PER_REQUEST", 1)
    monkeypatch.setattr(serve, "_record_estimate", lambda *a: 1)
    calls = []
    real = S.run_closed
    monkeypatch.setattr(S, "run_closed", lambda st, lanes: calls.append(st.records) or real(st, lanes))
    got = serve.build_schedules_batched([(dep, [(w, client)], SYNC)])[0][0]
    assert len(calls) == 2 and calls[1] > calls[0]
    assert got.steps == want.steps and got.iterations == want.iterations
    for k in ("tokens", "n_decode", "reads", "finishes"):
        np.testing.assert_array_equal(got.sums[k], want.sums[k])
    np.testing.assert_array_equal(got.requests["finish_step"], want.requests["finish_step"])


def test_record_estimate_is_bounded_when_decodes_fill_the_budget(dep):
    """A 512-token budget with max_num_seqs 512 (deepseek-v4-pro on h200, as InferenceX ran it):
    at C = 64 the resident decodes leave 448 tokens a step, so 64 x 10 prompts of 8192 tokens
    take 10 x 64 x ceil(8192 / 448) = 11,840 chunks: the estimate is 4 n + 2 chunks + 2 n + 64
    (one read law), not one record per prompt token (sized by max_num_seqs alone: 10.5 million
    records, gigabytes). Where the decodes take the whole budget, a chunk counts as 1/8 of it."""
    settings = {"max_num_batched_tokens": 512, "max_num_seqs": 512, "num_spec_tokens": 0}
    lane = {"n": 640, "concurrency": 64, "plen": np.full(640, 8192)}
    assert serve._record_estimate(lane, settings, 1) == 4 * 640 + 2 * 640 * 19 + 2 * 640 + 64
    lane = dict(lane, concurrency=512)
    assert serve._record_estimate(lane, settings, 1) == 4 * 640 + 2 * 640 * 128 + 2 * 640 + 64


def test_lane_states_keep_only_the_records_written(dep):
    """The per-lane states of a scheduler call are cut to the records the lane wrote (copies,
    not views of the call's buffers, which are sized for the worst case)."""
    w = jp.Workload(32, 16, 0.5, seed=2)
    lanes = []
    real = serve._run_closed

    def spy(ls, st):
        per, over = real(ls, st)
        lanes.append((st, per))
        return per, over
    import unittest.mock as mock
    with mock.patch.object(serve, "_run_closed", spy):
        sc = serve.build_schedules_batched([(dep, [(w, jp.ClosedLoop(4, 40))], SYNC)])[0][0]
    (st, per), = lanes
    for state in per[:1]:
        used = int(state["it"])
        assert 0 < used < st.records
        for k in serve.REC_KEYS:
            assert state[k].shape[0] == used and state[k].base is None
    assert sc.steps > 0


def test_windowed_kv_capacity_by_hand():
    """gpt-oss-120b: 36 layers of 1,024 KV bytes per token (fp8), 18 of them with a 128-token
    window (18,432 B/token). At a resident length of 1,536 with 16-token blocks a request holds
    18432 x 1536 + 18432 x 144 bytes, so the cache holds 36864 / (18432 + 18432 x 144 / 1536)
    = 1.8286 times the tokens it holds at the full bytes per token; no window, or a window
    longer than the request: unchanged."""
    got = serve.windowed_kv_capacity(1000.0, 36864.0, ((128.0, 18432.0),), 1536.0, 16)
    assert got == pytest.approx(1000.0 * 36864 / (18432 + 18432 * 144 / 1536), rel=1e-12)
    assert got == pytest.approx(1828.57, rel=1e-5)
    assert serve.windowed_kv_capacity(1000.0, 36864.0, (), 1536.0, 16) == 1000.0
    assert serve.windowed_kv_capacity(1000.0, 36864.0, ((4096.0, 18432.0),), 1536.0, 16) == 1000.0
    assert serve.windowed_kv_capacity(float("inf"), 36864.0, ((128.0, 18432.0),), 1536.0, 16) == float("inf")


def test_recurrent_state_shrinks_the_kv_cache_by_hand():
    """A hybrid model's requests each hold their recurrent state beside their KV blocks.
    Nemotron 3 Nano's Mamba2 layers (64 heads of 64, state 128, 8 groups, conv kernel 4, fp32):
    ((4096 + 2 x 8 x 128) x 3 + 64 x 64 x 128) x 4 = 2,170,880 B per layer and request, 23 layers
    49,930,240 B on one GPU; at a resident length of 1,536 tokens that is 32,507 B per token
    beside the 6,144 B of its attention layers, so the cache holds 6144 / (6144 + 32507) of the
    tokens; a GDN layer (Qwen3.5) holds n_heads x state^2 x 4 B. No compile."""
    from jaxprice._src import laws
    assert laws.recurrent_state_bytes("mamba2", 64, 64, 128, 8, 4, 4096, 4.0) == 2_170_880
    assert laws.recurrent_state_bytes("gdn", 64, 128, 128, 1, 4, 0, 4.0) == 64 * 128 * 128 * 4
    import argparse

    from jaxprice._src import cli_price
    nano = cli_price.load_scenario_deployment("nvidia-nemotron-3-nano-30b-a3b-bf16", None, argparse.Namespace(
        chip="h200", tp="1", dp=None, ep=None, weights=None, gpus_per_node=None, fabric=None))
    m = nano.plan.memory
    assert m["recurrent_state_bytes_per_request"] == 23 * 2_170_880 and m["kv_bytes_per_token"] == 6144
    got = serve.windowed_kv_capacity(1000.0, 6144.0, (), 1536.0, 16, 23 * 2_170_880)
    assert got == pytest.approx(1000.0 * 6144 / (6144 + 49_930_240 / 1536), rel=1e-12)
    assert got == pytest.approx(158.97, rel=1e-4)
    # the run's settings take it (and say so); a model without recurrent layers keeps the plan's capacity
    # (the pool keeps the state of the max_num_seqs requests at most that fit at that length:
    # 1,024 here, fewer than the 1,077 that would; tests/test_inputs_j.py holds the bound)
    out, src = serve.engine_settings(nano, ref_len=1536.0)
    pool = m["kv_capacity_tokens"] * 6144.0
    assert int(pool // (49_930_240 + 6144 * 1536)) > 1024 == out["max_num_seqs"]
    assert out["kv_capacity_tokens"] == pytest.approx((pool - 1024 * 49_930_240) / 6144.0, rel=1e-12)
    assert "recurrent state of max_num_seqs 1024 requests (47.6 MiB per rank each)" in src["kv_capacity_tokens"][1]
    dense = jp.load_deployment(DEP)
    assert dense.plan.memory["recurrent_state_bytes_per_request"] == 0.0
    assert serve.engine_settings(dense, ref_len=1536.0)[0]["kv_capacity_tokens"] == \
        dense.plan.memory["kv_capacity_tokens"]


def test_a_model_with_window_layers_gets_the_larger_kv_cache():
    """The plan reports the windowed share of the KV bytes per token (the reference's law, kept
    whole in kv_bytes_per_token); the serving layer sizes the cache by it at the run's resident
    length (mean prompt + half the mean output), and says so."""
    dep = jp.load_deployment("gpt-oss-120b-h200-fp4-vllm-tp1")
    m = dep.plan.memory
    assert m["kv_window_bytes_per_token"] == ((128.0, m["kv_bytes_per_token"] / 2),)
    sc = jp.build_schedule(dep, jp.Workload(1024, 1024, 1.0, 0), jp.ClosedLoop(2, 2))
    want = serve.windowed_kv_capacity(m["kv_capacity_tokens"], m["kv_bytes_per_token"],
                                      m["kv_window_bytes_per_token"], 1024 + 512, sc.settings["block_size"])
    assert sc.settings["kv_capacity_tokens"] == pytest.approx(want, rel=1e-12) and want > 1.8 * m["kv_capacity_tokens"]
    assert sc.settings["kv_blocks"] == int(want // sc.settings["block_size"]) - 1
    assert "windowed_kv_capacity" in sc.assumptions["kv_capacity_tokens"][1]
    dense = jp.load_deployment(DEP)                      # deepseek-v3: no window, the plan's capacity
    assert dense.plan.memory["kv_window_bytes_per_token"] == ()
    sd = jp.build_schedule(dense, jp.Workload(1024, 1024, 1.0, 0), jp.ClosedLoop(2, 2))
    assert sd.settings["kv_capacity_tokens"] == dense.plan.memory["kv_capacity_tokens"]
