"""Serving under load: the benchmark client and vLLM v1's scheduler over the step kernel.

``simulate(deployment, workload, client)`` runs the engine's scheduler step by step
(schedule.py), prices every step with the kernel, and returns per-request latencies (TTFT,
TPOT, E2E, ITL) and the run's summary (``ServingResult``). ``simulate_sweep`` does a whole
closed-loop concurrency sweep in shared vmapped scheduler calls (``build_schedules_batched``:
lanes grouped by shape) and one compiled pricing kernel (fixed-size vmapped chunks, a level at a time).

The engine (vLLM v1, serving-reference.md §1-3), per data-parallel rank:

* ``max_num_seqs`` running requests at most, a token budget ``max_num_batched_tokens`` per
  step, chunked prefill (running requests first in admission order, so decodes before
  prefill chunks, then the waiting queue in arrival order, a long prompt split across steps);
* a KV cache of ``floor(kv_capacity_tokens / block_size) - 1`` usable blocks (vLLM's null block
  excluded; ``kv_capacity_tokens`` per rank from ``plan.memory``, counted at the full KV bytes
  per token; a model with sliding-window layers holds more: ``windowed_kv_capacity``); a request holds
  ``cdiv(computed + scheduled + lookahead, block_size)`` blocks; admission only when its blocks
  are free; with ``reserve_full_isl`` (default True: vLLM's engine-args default since PR #37307,
  2026-03, before almost all measured runs) only when the whole prompt's blocks fit; a running
  request that cannot grow preempts the latest-admitted running requests (recompute: its
  blocks freed, re-prefilled with its outputs when readmitted at the head of the queue);
* speculative decoding: a decode row schedules 1 + k tokens (k = num_spec_tokens, k lookahead
  slots) and emits ``acceptance`` tokens per step on average (input; default
  ``default_acceptance(k)``, (1 - 0.7^(k+1)) / 0.3, an assumption); without speculation 1;
* data parallelism: each rank has its own scheduler, queue, budget and KV cache. Closed loop:
  the C clients are spread evenly over the ranks (rank r keeps C // dp (+1 for r < C % dp)
  requests in flight; vLLM's balancer sends a new request to the least-loaded rank, which is
  the one whose request just finished), so each rank gets requests in proportion to its clients
  (request i is client i mod C's, client j on rank j mod dp). Open loop: requests round-robin.
  The ranks step together (lockstep): each rank's batch is priced by the kernel and the step
  takes the slowest rank's time;
* other engines (engine setting ``scheduler``, default ``vllm``; serving-reference §6): ``trtllm``
  (TensorRT-LLM's GUARANTEED_NO_EVICT) and ``sglang`` (under the benchmark's ignore_eos) admit a
  waiting request only if its blocks at full length (prompt + output) fit beside the growth every
  running request still has to come, so they never preempt; ``sglang`` also runs prefill first
  with mixed chunks off (its defaults): a step holds the running prefill chunks and the
  admissions under the budget (its ``chunked_prefill_size``, by default 2048 / 8192 / 16384 for
  GPUs under 35 / 160 GB / larger), or, when there are none, every decode row with no budget;
* async scheduling (default on, vLLM's default since 2025-12 for this kind of deployment):
  step k+1 is scheduled before step k's outputs are processed, so a request finishing in step k
  frees its slot and blocks (and its client's next request arrives) for step k+2, not k+1.

Time: a step costs the kernel's estimate (NoOverlap by default, Overlap with
``estimate="overlap"``) plus ``host_output_token`` once per step that emits tokens (so at C = 1
TPOT = one decode step + host_output_token, as the accuracy harness adds it once per TPOT),
where the deployment's coefficients carry it. A step that schedules nothing costs nothing. A
token appears at the end of the step that computes it.

A request's own latencies, outside the engine loop (``request_latencies``; inference-sim's
kernel interface, inference-sim/inference-sim, the ``Kernel`` methods ``AdmissionOverhead``,
``CompletionOverhead``, and its simulator, which delays a request's entry into the wait queue by
its admission time and never charges it to a step):

* admission ``L = host_admission_per_request + host_admission_per_token x prompt tokens``: the API
  server's work before the engine can schedule the request (HTTP, tokenisation, the hand-off to
  the engine-core process). vLLM v1 runs it in the API-server process, concurrently with the
  engine's steps, so it delays that request only, never a step;
* the wait for the next ``schedule()`` call: a request reaches the scheduler while a step runs
  (vLLM schedules at step boundaries; under async scheduling the step after the running one is
  already scheduled), so it waits for the rest of that step. The simulation lets a client's next
  request enter at the boundary where its predecessor's last token came out, so it adds the rest
  of the following step (the step in flight when the request reaches the engine): a fraction
  ``arrival_phase`` of it (engine setting; default 1/2 when L > 0, the request lands at a random
  point of a step, and 1 when L = 0, it lands just after the boundary the simulation used). Only
  closed-loop requests after the first wave wait so: the first wave meets an idle engine, and
  an engine with nothing else running (C = 1 per rank) starts a request when it arrives. An
  open loop's scheduler has the arrival times, so it waits in the schedule itself: a step's
  scheduler sees the requests that arrived by the boundary where it was scheduled, the step's
  own start, or under async scheduling the previous step's start (vLLM scheduled step k + 1
  when step k started, so a request landing in busy step k first runs in step k + 2); an idle
  rank (its previous step scheduled nothing) schedules at the first boundary after the arrival
  (an idle engine: at the arrival);
* completion ``host_completion``: on E2E only (finish-reason, serialisation, teardown), not on
  TTFT or TPOT.

So per request (IX ``calculate_metrics``), with ``w = L + the schedule() wait``: TTFT = first
token + w - arrival, TPOT = (finish - first token) / (output - 1) (requests with output > 1),
E2E = finish + w + host_completion - arrival, ITL = the gaps between its token-emitting steps,
pooled. The coefficients are the deployment's unless ``schedule_metrics(..., coefficients=)``
gives others (set them to 0 to leave a latency out).

Closed loop: the schedule depends on token counts only, so it is computed once
(``build_schedule``, no step times) and its steps priced in vmapped calls; every metric is then
differentiable in the coefficients exactly through the step times (``schedule_metrics``). Open
loop: arrivals depend on times, so the scheduler loop prices each step with the kernel inside
the ``jax.lax.while_loop``; its gradient is that of the FIXED schedule the loop produced
(the schedule's discrete choices are not differentiated).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import os
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from . import schedule as S
from .client import ClosedLoop, OpenLoop, Trace, Workload, _is_real, check_clients_send, check_sweep_size
from .errors import JaxpriceError, check_callback, refuse, shown
from .plan import Coefficients
from .step import exact_at_zero, _step_time, temperature_arg

ESTIMATES = ("no_overlap", "overlap")
ENGINE_KEYS = ("scheduler", "max_num_seqs", "max_num_batched_tokens", "block_size", "kv_capacity_tokens",
               "max_model_len", "reserve_full_isl", "async_scheduling", "decode_threshold", "num_spec_tokens",
               "lookahead", "watermark", "fast_forward", "gpu_count", "arrival_phase")
# the engines whose scheduler the simulation follows (serving-reference §1-3 vLLM v1, §6 the others):
# the step kernel prices every step alike (the scenario prices everything as vLLM); they differ in
# admission and batch composition.
# COVERAGE LIMIT [other-engine-schedulers]: of SGLang and TensorRT-LLM only what §6 states is followed
# (reservation to completion, SGLang's prefill-first steps and chunk size, TensorRT-LLM's token
# budget); SGLang's retraction, new_token_ratio decay and max_prefill_tokens, and TensorRT-LLM's
# micro-batch order, context chunking and max_batch_size (C++, not read) are vLLM's here
SCHEDULERS = ("vllm", "sglang", "trtllm")
RESERVE_TO_COMPLETION = ("sglang", "trtllm")   # admit only what can grow to its full length
PREFILL_FIRST = ("sglang",)                    # a step runs prefills only, or else decodes only
TRTLLM_MAX_NUM_TOKENS = (8192, "TensorRT-LLM's max_num_tokens default 8192 (its LLM API arguments, docs.nvidia.com "
                               "nemo_deploy TensorRTLLMAPIDeployable)")
DEFAULT_ACCEPTANCE_PER_DRAFT = 0.7     # the chance each draft token is accepted, when no acceptance is given
ACCEPTANCE_LAW = ("(1 - a^(k+1)) / (1 - a), a = {a} the chance each draft is accepted: a draft counts only if every "
                  "draft before it was accepted (Leviathan, Kalman, Matias 2023, speculative decoding's expected "
                  "tokens per step)")


def default_acceptance(k: int, per_draft: float = DEFAULT_ACCEPTANCE_PER_DRAFT) -> float:
    """The mean tokens a decode row emits per step with k draft tokens when none is given (an
    ASSUMPTION, not a measurement): the accepted prefix of the drafts plus the target's own token,
    (1 - a^(k+1)) / (1 - a) = 1 + a + ... + a^k with a = ``per_draft`` the chance each draft is
    accepted, independently (k = 1: 1.7; 2: 2.19; 3: 2.533) [tokens / step]. A draft after a
    rejected one is discarded, so the mean is not 1 + a k (which would count it)."""
    return float(sum(per_draft ** i for i in range(int(k) + 1)))


def _next_pow2(x):
    return 1 << max(int(x) - 1, 0).bit_length()


# ----------------------------------------------------------------------------- engine settings


def windowed_kv_capacity(capacity_tokens: float, kv_bytes_per_token: float, windows, length: float,
                         block_size: int, state_bytes: float = 0.0) -> float:
    """KV-cache tokens a rank holds when some layers keep only a sliding window (tokens).

    ``capacity_tokens`` counts tokens at the full ``kv_bytes_per_token`` (B/token, every layer);
    ``windows``: ((w, b_w), ...), the bytes per token of the layers with window w. vLLM's hybrid
    KV-cache manager frees a windowed layer's blocks that fall out of its window, so a request
    of L tokens holds ``b_full L + sum_w b_w min(L, w + block_size)`` bytes, b_full the rest:

        capacity x kv_bytes_per_token / (b_full + sum_w b_w min(1, (w + block_size) / L))

    with L = ``length`` (a run's typical resident length: mean prompt + half the mean output).
    KNOWN DIVERGENCE [windowed-kv]: the reference's memory law (reference-kernel.md §3.13,
    ``plan.memory``, kept as it is) holds every layer at full length; here one length stands for
    every request (short ones hold their whole context in every layer) and the page padding of
    vLLM's layer groups is ignored. Not settled for gpt-oss: vLLM 0.15-0.18 logged its maximum
    concurrency with the windows bounded, 0.21-0.22 with every layer at full length
    (testdata/measured/inferencex_engine_logs.csv).

    ``state_bytes``: a hybrid model's recurrent state per request and rank (Mamba2, GDN, KDA
    layers: ``plan.memory['recurrent_state_bytes_per_request']``), held from admission to finish
    beside the KV blocks; at L tokens a request then holds S / L more bytes per token, and the
    cache holds that many fewer tokens (``size``'s fit check and steady state; the serving
    simulation keeps the state of a fixed number of requests instead, ``_kv_blocks``;
    KNOWN DIVERGENCE [recurrent-state-kv])."""
    if (not windows and state_bytes <= 0) or not math.isfinite(capacity_tokens) or kv_bytes_per_token <= 0 \
            or length <= 0:
        return capacity_tokens
    windowed = sum(b for _w, b in windows)
    held = (kv_bytes_per_token - windowed) + sum(b * min(1.0, (w + block_size) / length) for w, b in windows)
    return capacity_tokens * kv_bytes_per_token / (held + state_bytes / length)


class _Settings:
    """The engine settings of a run as they are taken: each from the ``engine=`` override, else the
    scenario's engine block, else its default, with where it came from (``src``)."""

    def __init__(self, dep, engine: dict):
        self.engine, self.scenario = engine, dict(dep.scenario.engine or {})
        self.path = str(dep.scenario.path) if getattr(dep.scenario, "path", None) else dep.name
        self.out, self.src = {}, {}

    def take(self, key, default, default_src, *, scen_key=None):
        scen_key = scen_key or key
        if key in self.engine and self.engine[key] is not None:
            self.out[key], self.src[key] = self.engine[key], "engine= override"
        elif scen_key in self.scenario and self.scenario[scen_key] is not None:
            self.out[key], self.src[key] = self.scenario[scen_key], f"{self.path}: engine.{scen_key}"
        else:
            self.out[key], self.src[key] = default, default_src

    def refuse(self, message, key):
        refuse(message, file=self.src[key], field=key, value=self.out[key], has_value=True)

    def integer(self, key, minimum):
        """An integer setting, checked where it is taken (later ones are computed from it)."""
        v = self.out[key]
        if not (_is_real(v) and math.isfinite(v) and v == int(v) and v >= minimum):
            self.refuse(f"must be an integer >= {minimum}", key)
        if v > 2 ** 40:
            self.refuse("must be at most 2**40 = 1099511627776 (past it the scheduler's int64 lanes overflow)", key)
        self.out[key] = int(v)

    def flag(self, key):
        if not isinstance(self.out[key], (bool, np.bool_)):
            self.refuse("must be True or False", key)


def engine_settings(dep, engine=None, *, max_len=None, acceptance=None, ref_len=None):
    """The engine settings a run uses, and where each came from: ({key: value}, {key: (value, source)}).
    ``ref_len``: the run's typical resident request length (tokens), which sizes the KV cache of a
    model with sliding-window layers (``windowed_kv_capacity``)."""
    if engine is not None and not isinstance(engine, Mapping):
        refuse("must be a dict of engine settings, e.g. {'max_num_seqs': 64}", field="engine",
               value=type(engine).__name__)
    engine = dict(engine or {})
    unknown = [k for k in engine if k not in ENGINE_KEYS]
    if unknown:
        refuse(f"unknown engine setting (known: {', '.join(ENGINE_KEYS)})", field="engine", value=unknown[0])
    s = _Settings(dep, engine)
    _take_limits(s, dep, max_len)
    _take_behaviour(s, dep)
    out, src = s.out, s.src
    k = out["num_spec_tokens"]
    if acceptance is None:
        acceptance = default_acceptance(k)
        a_src = (f"assumed {ACCEPTANCE_LAW.format(a=DEFAULT_ACCEPTANCE_PER_DRAFT)}" if k else "no speculation: 1")
    else:
        a_src = "acceptance= argument"
    if not (_is_real(acceptance) and math.isfinite(acceptance) and 1 <= acceptance <= k + 1):
        refuse(f"must be a number in [1, 1 + num_spec_tokens = {k + 1}] (mean tokens emitted per decode step)",
               field="acceptance", value=acceptance, has_value=True)
    out["acceptance"], src["acceptance"] = float(acceptance), a_src
    _kv_blocks(s, dep, ref_len)
    out["dp"] = int(dep.plan.scalars.get("dp", 1))
    src["dp"] = "plan dp"
    return out, {key: (out[key], src[key]) for key in src}


def _take_limits(s: _Settings, dep, max_len):
    """The scheduler and its limits: the token budget (the engine's default for the part), the
    sequences, the block size, the KV capacity and max_model_len (isl + osl + 256, at most the
    model's own)."""
    s.take("scheduler", "vllm", "vLLM (a scenario prices everything as vLLM 0.29.0, its engine named only in its "
                                "file name: data-formats.md; scheduler= sglang or trtllm follows those engines)")
    if s.out["scheduler"] not in SCHEDULERS:
        s.refuse(f"unknown scheduler (known: {', '.join(SCHEDULERS)})", "scheduler")
    big = dep.chip.memory_gib >= 70 and "a100" not in dep.chip.name
    if s.out["scheduler"] == "sglang":
        s.take("max_num_batched_tokens", *_sglang_chunk(dep.chip.memory_gib))
    elif s.out["scheduler"] == "trtllm":
        s.take("max_num_batched_tokens", *TRTLLM_MAX_NUM_TOKENS)
    else:
        s.take("max_num_batched_tokens", 8192 if big else 2048,
               "vLLM default for this part (8192 on >= 70 GiB, else 2048)")
    s.take("max_num_seqs", dep.resolution.get("max_num_seqs", 1024 if big else 256),
           "resolve (vLLM default for this part)")
    for key in ("max_num_batched_tokens", "max_num_seqs"):
        s.integer(key, 1)
    _take_block_size(s, dep)
    s.take("kv_capacity_tokens", float(dep.plan.memory["kv_capacity_tokens"]),
           "plan.memory kv_capacity_tokens (per dp rank)")
    limit = dep.graph.max_model_len          # the model's own, where its graph states it
    default = (max_len + 256) if max_len else 32768
    s.take("max_model_len", default if limit is None else min(default, limit),
           ("isl + osl + 256 (InferenceX's max-model-len)" if max_len else "32768")
           + ("" if limit is None or default <= limit else f", capped at the model's {limit}"))
    s.integer("max_model_len", 1)
    if limit is not None and s.out["max_model_len"] > limit:
        s.refuse(f"more than the {limit} tokens {dep.graph.name} serves at (its config's max_position_embeddings, "
                 "as vLLM derives max_model_len; vLLM would not start)", "max_model_len")


def _take_block_size(s: _Settings, dep):
    """block_size: an engine= override, else the plan's (the scenario's or vLLM's default, and
    for a model with recurrent layers at least vLLM's hybrid attention block,
    resolve.hybrid_block_size, which an override may not go below: vLLM would raise it). Under
    vLLM a latent (MLA) attention runs its backend's block (resolve.vllm_mla_block); an override
    its kernels cannot page runs as given (a what-if), its source saying so."""
    from .resolve import block_note
    plan_block = int(dep.plan.memory.get("block_size", 16))
    minimum = int(dep.plan.memory.get("hybrid_block_minimum", 0) or 0)
    stated = s.scenario.get("block_size")
    if minimum and plan_block == minimum and (stated is None or stated < minimum):
        src = ("vLLM's attention block for this model's recurrent state (resolve.hybrid_block_size"
               + (f"; raised from the {stated} stated)" if stated is not None else ")"))
    elif dep.plan.memory.get("vllm_block_rule") and block_note(dep) and s.out["scheduler"] != "vllm":
        # the plan ran vLLM's MLA backend's block; an SGLang / TensorRT-LLM run pages as its scenario says
        plan_block = int(stated) if stated is not None else 16
        src = f"{s.path}: engine.block_size" if stated is not None else "plan.memory block_size"
    elif dep.plan.memory.get("vllm_block_rule") and block_note(dep):   # vLLM's MLA backend's own block
        src = block_note(dep)
    elif stated is not None:
        src = f"{s.path}: engine.block_size"
    else:
        src = "plan.memory block_size"
    # the plan's value holds the scenario's (raised where needed): no scenario key is read here
    s.take("block_size", plan_block, src, scen_key="<plan.memory block_size>")
    s.integer("block_size", 1)
    rule = dep.plan.memory.get("vllm_block_rule") or ()
    if rule and s.out["scheduler"] == "vllm" and s.src["block_size"] == "engine= override":
        # an engine= block the MLA backend cannot page runs as given (vLLM >= 0.17 keeps a stated
        # --block-size), but on a fallback backend the plan does not price: said
        backend, sizes, own = rule
        if not any(s.out["block_size"] % b == 0 for b in sizes):
            s.src["block_size"] = (f"engine= override; vLLM's {backend} backend, the one priced, pages "
                                   f"{' or '.join(map(str, sizes))} tokens (its own block {own}): vLLM would run this "
                                   "block on a fallback backend")
    if minimum and s.out["block_size"] < minimum:
        s.refuse(f"below the {minimum} tokens vLLM runs {dep.graph.name}'s attention blocks at (it raises a smaller "
                 "block_size so that one block holds one recurrent layer's state)", "block_size")


def _take_behaviour(s: _Settings, dep):
    """How the scheduler behaves: full-prompt reservation, async scheduling, the decode
    threshold, speculation (draft tokens, lookahead slots), the watermark, fast-forwarded decode
    runs, the arrival phase and the GPUs a run counts."""
    s.take("reserve_full_isl", True, "vLLM default (scheduler_reserve_full_isl, V-new, PR #37307 2026-03)")
    s.take("async_scheduling", True, "vLLM default (on unless PP > 1 or non-EAGLE/MTP speculation)")
    s.flag("reserve_full_isl")
    s.flag("async_scheduling")
    s.take("decode_threshold", int(dep.resolution.get("decode_threshold", 1)),
           "resolve: 1 + num_spec_tokens (a row scheduling more is a prefill)")
    s.integer("decode_threshold", 1)
    spec = (s.scenario.get("speculative") or {})
    s.take("num_spec_tokens", int(spec.get("num_spec_tokens", 0)) if spec else 0,
           "scenario speculative.num_spec_tokens")
    s.integer("num_spec_tokens", 0)
    width = int(dep.plan.scalars.get("uniform_width", 1))
    if s.src["num_spec_tokens"] == "engine= override" and s.out["num_spec_tokens"] + 1 != width:
        # the plan was resolved for the scenario's speculation: its decode rows of `width` tokens, its
        # drafter's passes and decode threshold; another k here scheduled 1 + k token rows the kernel
        # priced as prefill rows with no drafter (DeepSeek-V3, k = 2: TPOT 5.32 ms against the 5.34 ms
        # of the scenario stating it)
        s.refuse(f"speculative decoding changes the plan (1 + k tokens per decode row, the drafter's passes, the "
                 f"decode threshold), which was resolved for the scenario's {width - 1} draft token(s): state it "
                 f"in the scenario, engine.speculative.num_spec_tokens: {s.out['num_spec_tokens']}, and load that",
                 "num_spec_tokens")
    s.take("lookahead", s.out["num_spec_tokens"], "num_spec_tokens (EAGLE/MTP lookahead slots)")
    s.integer("lookahead", 0)
    s.take("watermark", 0.0, "vLLM default 0")
    if not (_is_real(s.out["watermark"]) and 0 <= s.out["watermark"] < 1):
        s.refuse("must be a number in [0, 1) (the share of KV blocks kept free)", "watermark")
    s.take("fast_forward", True, "decode runs recorded as one linear record (exact)")
    s.flag("fast_forward")
    s.take("arrival_phase", None, "share of the step in flight a closed-loop request waits for the next schedule() "
                                  "call: 1/2 when its admission latency L > 0 (a random point of a step), 1 when "
                                  "L = 0 (request_latencies)")
    ph = s.out["arrival_phase"]
    if ph is not None and not (_is_real(ph) and 0 <= ph <= 1):
        s.refuse("must be a number in [0, 1] or None (1/2 when the admission latency > 0, else 1)", "arrival_phase")
    par = dep.scenario.parallel or {}
    s.take("gpu_count", int(dep.plan.scalars.get("tp", 1)) * int(dep.plan.scalars.get("dp", 1))
           * int(par.get("pp", 1)), "tp x dp x pp")
    s.integer("gpu_count", 1)


def _kv_blocks(s: _Settings, dep, ref_len):
    """KV blocks per dp rank: floor(capacity / block) - 1 (vLLM's null block), the capacity
    counted with sliding-window layers holding only their window at the run's typical length. A
    hybrid model's pool keeps the recurrent state of max_num_seqs requests, lowered to those that
    fit at that length (and beside one max_model_len request); its tokens are the rest."""
    out, src = s.out, s.src
    cap = out["kv_capacity_tokens"]
    if not (_is_real(cap) and cap >= 0):          # NumPy numbers too (np.int64 was refused as not one)
        s.refuse("must be a number >= 0 (tokens per dp rank)", "kv_capacity_tokens")
    windows = dep.plan.memory.get("kv_window_bytes_per_token", ())
    state = float(dep.plan.memory.get("recurrent_state_bytes_per_request", 0.0))
    if (windows or state > 0) and ref_len and math.isfinite(cap):
        b, length = float(dep.plan.memory["kv_bytes_per_token"]), float(ref_len)
        win = windowed_kv_capacity(cap, b, windows, length, out["block_size"])
        if state > 0 and b > 0 and win > 0:
            # the state is held per REQUEST, not per token: spread over the tokens at the typical
            # length, requests shorter than it (a short prompt early in a long output) fit many
            # times over, and a run held up to 6.7 x the pool (Nemotron 3 Nano, 128 in / 2048 out).
            # So the pool keeps the state of at most `slots` requests (those that fit at the typical
            # length, at most max_num_seqs) and the rest holds tokens: the same capacity at that
            # length, and never more than the pool at any other
            pool = cap * b
            per_tok = pool / win                 # bytes a resident token holds (windows bounded)
            # (and fewer where one max_model_len request would not fit beside the others' states:
            # the request `size` found to fit, vLLM's start-up check)
            slots = max(1, min(out["max_num_seqs"], int(pool // (state + per_tok * length)),
                               int((pool - per_tok * out["max_model_len"]) // state)))
            win = max(pool - slots * state, 0.0) / per_tok
            if slots < out["max_num_seqs"]:
                src["max_num_seqs"] = (f"{src['max_num_seqs']} {out['max_num_seqs']}, lowered to the {slots} "
                                       "requests whose recurrent state "
                                       f"({state / 2 ** 20:.1f} MiB per rank) fits beside their KV at the run's mean "
                                       "prompt + half its mean output (KNOWN DIVERGENCE [recurrent-state-kv]: vLLM "
                                       "takes each request's state pages from the KV pool as it admits it)")
                out["max_num_seqs"] = slots
        cap = out["kv_capacity_tokens"] = win
        parts = (["more with the sliding-window layers holding only their window"] if windows else []) + \
            ([f"less by the recurrent state of max_num_seqs {out['max_num_seqs']} requests "
              f"({state / 2 ** 20:.1f} MiB per rank each)"] if state > 0 else [])
        src["kv_capacity_tokens"] = (f"{src['kv_capacity_tokens']}, counted at the full KV bytes per token; "
                                     f"{'; '.join(parts)}, at the run's mean prompt + half its mean output "
                                     "(windowed_kv_capacity)")
    blocks = int(cap // out["block_size"]) - 1 if math.isfinite(cap) else 2 ** 40
    out["kv_blocks"] = min(max(blocks, 0), 2 ** 40)      # 2**40 blocks or more: unlimited, as inf (int64 lanes)
    src["kv_blocks"] = ("floor(kv_capacity_tokens / block_size) - 1 (vLLM's null block)" if blocks < 2 ** 40 else
                        "unlimited: 2**40 blocks (kv_capacity_tokens of 2**40 blocks or more, or inf)")


def _sglang_chunk(memory_gib):
    """SGLang's default chunked_prefill_size by GPU memory (serving-reference §6: < 35 GB 2048,
    < 160 GB 8192, else 16384; sgl-project/sglang server_args.py)."""
    gb = memory_gib * 2 ** 30 / 1e9
    size = 2048 if gb < 35 else 8192 if gb < 160 else 16384
    return size, f"SGLang's chunked_prefill_size default for {gb:.0f} GB (serving-reference §6)"


# ----------------------------------------------------------------------------- lanes


def _requests(workload, client):
    """(arrival times or None, input lengths, output lengths) for a client."""
    if isinstance(client, Trace):
        if workload is not None:
            refuse("a Trace gives every request's lengths: pass workload=None (this one would be ignored)",
                   field="workload", value=repr(workload))
        return (np.asarray(client.arrival_s, float), np.asarray(client.input_len, np.int64),
                np.asarray(client.output_len, np.int64))
    if not isinstance(client, (ClosedLoop, OpenLoop)):
        refuse("must be a ClosedLoop, OpenLoop or Trace", field="client", value=type(client).__name__)
    if workload is None:
        refuse("a workload is needed for this client", field="workload")
    if not isinstance(workload, Workload):
        refuse("must be a Workload(isl, osl[, range_ratio, seed])", field="workload", value=type(workload).__name__)
    workload.validate()
    client.validate()
    if isinstance(client, ClosedLoop):
        ins, outs = workload.lengths(client.prompts)
        return None, ins, outs
    if isinstance(client, OpenLoop):
        ins, outs = workload.lengths(int(client.num_prompts))
        return client.arrivals(), ins, outs
    refuse("must be a ClosedLoop, OpenLoop or Trace", field="client", value=type(client).__name__)


def _check_lengths(settings, ins, outs, source, dep=None, engine=None, **taken):
    """Refuse a request longer than max_model_len, or one the KV cache cannot hold; ``dep``,
    ``engine`` and ``taken`` (engine_settings' max_len, acceptance, ref_len) let the second
    refusal name the capacity as given and the least that would do."""
    mml = settings["max_model_len"]
    total = ins + outs
    bad = np.flatnonzero(total > mml)
    if bad.size:
        i = int(bad[0])
        refuse(f"input + output = {int(total[i])} tokens exceeds max_model_len {mml}", file=source,
               field=f"request {i}", value=(int(ins[i]), int(outs[i])), has_value=True)
    bs, k = settings["block_size"], settings["lookahead"]
    need = -(-(np.minimum(total.max() + k, mml)) // bs)
    if need > settings["kv_blocks"]:
        fewer = (f"fewer than one request needs ({int(need)} block{'s' if need != 1 else ''} for "
                 f"{int(total.max())} tokens)")
        if dep is None:
            refuse(f"the KV cache holds {settings['kv_blocks']} blocks of {bs} tokens per rank "
                   f"({settings['kv_capacity_tokens']:.0f} tokens), {fewer}", file="deployment",
                   field="kv_capacity_tokens", value=settings["kv_capacity_tokens"], has_value=True)
        given, where, least = _kv_least(dep, engine, int(need), **taken)
        state = float(dep.plan.memory.get("recurrent_state_bytes_per_request", 0.0))
        held = f"{settings['kv_blocks']} block{'s' if settings['kv_blocks'] != 1 else ''} of {bs} tokens"
        if state > 0 and taken.get("ref_len"):
            n = settings["max_num_seqs"]
            held += (f" once the recurrent state of {n} request{'s' if n != 1 else ''} ({state / 2 ** 20:.1f} MiB per "
                     "rank each) is taken out")
        elif settings["kv_capacity_tokens"] != given:
            held += (f" ({settings['kv_capacity_tokens']:.0f} tokens with the sliding-window layers holding their "
                     "window)")
        refuse(f"the KV cache of {given:g} tokens per rank ({where}) holds {held}, {fewer}: it needs at least "
               f"{least} tokens per rank", file="deployment", field="kv_capacity_tokens", value=given, has_value=True)


def _kv_least(dep, engine, need, *, max_len=None, acceptance=None, ref_len=None):
    """(kv_capacity_tokens as the run took it, where from, the least whole number of tokens whose
    KV cache holds ``need`` blocks once engine_settings has taken out the recurrent state and
    bounded the windows): for the refusal only, a bisection of engine_settings (pure Python)."""
    s = _Settings(dep, dict(engine or {}))
    _take_limits(s, dep, max_len)
    given, where = s.out["kv_capacity_tokens"], s.src["kv_capacity_tokens"]

    def holds(cap):
        out, _ = engine_settings(dep, {**(engine or {}), "kv_capacity_tokens": float(cap)}, max_len=max_len,
                                 acceptance=acceptance, ref_len=ref_len)
        return out["kv_blocks"] >= need
    # the blocks grow with the capacity but for a saw-tooth where one more request's state is kept
    # (slots, _kv_blocks): the least capacity keeps one state, need + 1 blocks of windowed tokens
    # (k per token counted at full bytes) beside it; below it the blocks are monotone
    b = float(dep.plan.memory.get("kv_bytes_per_token", 0.0))
    state = float(dep.plan.memory.get("recurrent_state_bytes_per_request", 0.0)) if b > 0 and ref_len else 0.0
    k = windowed_kv_capacity(1.0, b, dep.plan.memory.get("kv_window_bytes_per_token", ()), float(ref_len or 0),
                             s.out["block_size"]) if b > 0 else 1.0
    lo, hi = float(given), math.ceil((need + 1) * s.out["block_size"] / k + state / max(b, 1e-300)) + 1.0
    if hi <= lo or not holds(hi):          # not where it was reckoned: the first doubling that holds
        hi = max(2.0 * lo, 16.0)
        while not holds(hi) and hi < 2.0 ** 60:
            lo, hi = hi, 2.0 * hi
    while hi - lo > 1.0:
        mid = math.floor((lo + hi) / 2)
        lo, hi = (lo, mid) if holds(mid) else (mid, hi)
    return given, where, int(math.ceil(hi))


BS_MAX_MIN = 32      # block sizes up to this share one compiled shape


def _lane(settings, *, n, concurrency, plen, olen, arrival, open_loop, law_arrays, uniform_width):
    bs_max = np.zeros(max(_next_pow2(settings["block_size"]), BS_MAX_MIN))
    return {**law_arrays, "uniform_width": float(uniform_width), "bs_max": bs_max, "n": n,
            "concurrency": concurrency, "plen": plen, "olen": olen, "arrival": arrival,
            "open": open_loop, "k": settings["num_spec_tokens"], "lookahead": settings["lookahead"],
            "block_size": settings["block_size"], "max_model_len": settings["max_model_len"],
            "budget": settings["max_num_batched_tokens"], "kv_blocks": settings["kv_blocks"],
            "max_num_seqs": settings["max_num_seqs"], "thr": settings["decode_threshold"],
            "acc": int(round(settings["acceptance"] * S.ACC_DEN)),
            "reserve_full_isl": bool(settings["reserve_full_isl"]), "async": bool(settings["async_scheduling"]),
            "reserve_completion": settings["scheduler"] in RESERVE_TO_COMPLETION,
            "prefill_first": settings["scheduler"] in PREFILL_FIRST,
            "watermark": int(settings["watermark"] * (settings["kv_blocks"] + 1)), "run_cap": S.BIG}


def _split(settings, arrival, ins, outs, concurrency):
    """Per dp rank: (indices of its requests, its concurrency). Closed loop: the C clients spread
    evenly over the ranks (client j on rank j mod dp; with C < dp the other ranks get none and
    idle), each rank's requests in proportion to its clients: request i is client (i mod C)'s
    (the client whose request just finished sends the next one, and vLLM's balancer keeps it on
    that least-loaded rank); open loop: round-robin over every rank."""
    dp = settings["dp"]
    n = ins.size
    used = dp if concurrency is None else max(1, min(dp, concurrency))
    # round-robin over the ranks gave each rank n / dp requests whatever its clients: at C = 3 on
    # two ranks, rank 1's one client sent half the run's requests one after another while rank 0's
    # two clients ran out and idled (tok/s at C = 3 below C = 2's)
    rank_of = np.arange(n) % used if concurrency is None else (np.arange(n) % concurrency) % used
    out = []
    for r in range(dp):
        idx = np.flatnonzero(rank_of == r) if r < used else np.arange(0)
        c = (concurrency // used + (1 if r < concurrency % used else 0) if r < used else 0) \
            if concurrency is not None else None
        out.append((idx, c))
    return out


def _record_estimate(lane, settings, n_laws):
    """Records a lane's run is sized for: 4 per request, 2 per prompt chunk, 2 per request and
    read law, 64 spare. A chunk is the budget less the resident decodes' tokens (resident: at
    most min(C, max_num_seqs) requests), taken as at least 1/8 of the budget: where decodes
    fill the budget, prefill waits for finishes rather than running in 1-token chunks (an
    estimate only: a lane that runs out is run again with more, ``_rerun_alone``; sized by
    max_num_seqs alone, a 512-token budget with 512 sequences asked for a record per prompt
    token, gigabytes)."""
    n = max(int(lane["n"]), 1)
    clients = int(lane.get("concurrency") or 0)
    resident = min(settings["max_num_seqs"], n, clients if clients > 0 else n)
    budget = settings["max_num_batched_tokens"]
    b_eff = max(budget - resident * (1 + settings["num_spec_tokens"]), budget // 8, 1)
    chunks = int(np.sum(-(-np.asarray(lane["plen"][:n]) // b_eff)))
    return 4 * n + 2 * chunks + 2 * n * n_laws + 64


def _stack_lanes(lanes, N):
    """The lanes' arrays stacked on a leading lane axis, requests padded to N, on the device
    (``jax.device_put`` of NumPy arrays: ``jnp.asarray`` compiles a small program per new shape)."""
    out = {}
    for key in lanes[0]:
        vals = [l[key] for l in lanes]
        if key in ("plen", "olen"):
            out[key] = np.stack([np.concatenate([v, np.ones(N - v.size, np.int64)]) for v in vals])
        elif key == "arrival":
            out[key] = np.stack([np.concatenate([v, np.full(N - v.size, np.inf)]) for v in vals])
        elif key in ("open", "reserve_full_isl", "async", "law_on", "reserve_completion", "prefill_first"):
            out[key] = np.array(vals, bool)
        elif key.startswith("law_") or key == "uniform_width":
            out[key] = np.array(vals, float)
        elif key == "bs_max":
            out[key] = np.zeros((len(vals), max(v.size for v in vals)))
        else:
            out[key] = np.array(vals, np.int64)
    return {k: jax.device_put(v) for k, v in out.items()}


# ----------------------------------------------------------------------------- schedule


@dataclasses.dataclass
class Schedule:
    """The steps of one run (all dp ranks), as per-step row sums, with the data mapping step
    times to per-request times. Build with ``build_schedule``; price with ``step_times``;
    summarise with ``schedule_metrics``.

    sums: dict of [dp, steps] arrays (tokens, prefill_tokens, n_decode, ..., reads/pairs
    [dp, steps, L] per distinct read law); host: per-step counts the host costs scale with;
    requests: per-request arrays (input_len, output_len, rank, first_step, finish_step,
    arrival_step (closed loop; -1 = at t=0), arrival (open loop, s), emits, preemptions);
    floor: [steps] each step's not-before time (s): in an open loop the arrival an idle engine
    waited for, -inf where the step starts when the one before it ends (closed loop: 0);
    host: the deployment's per-request host latencies (s; ``HOST_LATENCIES``, absent = 0), which
    ``schedule_metrics`` adds to each request (``request_latencies``)."""
    plan: object
    settings: dict
    assumptions: dict
    laws: object
    sums: dict
    requests: dict
    floor: np.ndarray
    open_loop: bool
    concurrency: int | None
    steps: int
    iterations: int
    host: dict = dataclasses.field(default_factory=dict)

    @property
    def dp(self):
        return self.settings["dp"]

    def step_times(self, coefficients, estimate="no_overlap", temperature=None):
        """Each step's time (s): the kernel's estimate of every rank's batch plus the host
        costs, the slowest rank; a jnp array, differentiable in the coefficients."""
        if not isinstance(coefficients, Coefficients):
            refuse("needs a Coefficients (deployment.coefficients)", field="coefficients",
                   value=type(coefficients).__name__)
        check_coefficient_set(coefficients, self.plan)
        return price_steps(self, coefficients, estimate=estimate, temperature=temperature)


def _sums_for_kernel(plan, laws, cols, reads, pairs):
    """Per-step row sums (any leading shape) in step.row_sums' layout."""
    out = {k: cols[k] for k in ("tokens", "prefill_tokens", "n_decode", "n_prefill", "n_requests", "n_off_width")}
    if len(plan.arrays["rec_kind"]):
        out["decode_tokens"] = cols["decode_tokens"]
    if laws.inverse is not None:
        out["reads"] = reads[..., laws.inverse]
        out["pairs"] = pairs[..., laws.inverse]
    return out


# host costs a step's time carries (coefficient, per-step column it scales with). Admission and
# completion are not step costs (inference-sim's Kernel: AdmissionOverhead is "CPU time before a
# request can be scheduled", CompletionOverhead "lands on end-to-end latency"; vLLM v1 does both in
# the API-server process, beside the engine loop): they are per-request latencies, HOST_LATENCIES.
HOST_TERMS = (("host_output_token", "emit"),)
HOST_LATENCIES = ("host_admission_per_request", "host_admission_per_token", "host_completion")


@functools.partial(jax.jit, static_argnames=("structure", "smooth", "has_rec", "host_cols"))
def _price_chunk(structure, values, index, coef_values, host, x, inverse, tau, smooth, has_rec, host_cols):
    """One fixed-size chunk of per-step sums (dict of [chunk] / [chunk, L]) -> [2, chunk] step
    times, NoOverlap and Overlap, each with the host costs (``host``: their coefficient values,
    scaling the columns ``host_cols``). The plan's values are traced (stack.Structure static):
    one compile per plan structure and chunk size, shared by every deployment of a model graph."""
    from .stack import _note_compile, role_values, traced_view
    from .step import _kernel
    _note_compile()
    view = traced_view(structure, values)

    def one(x, t):
        sums = {k: x[k] for k in ("tokens", "prefill_tokens", "n_decode", "n_prefill", "n_requests", "n_off_width")}
        if has_rec:
            sums["decode_tokens"] = x["decode_tokens"]
        if inverse is not None:
            sums["reads"] = x["reads"][inverse]
            sums["pairs"] = x["pairs"][inverse]
        r = _kernel(view, role_values(coef_values, index), None, t, False, sums=sums)
        extra = 0.0
        for j, col in enumerate(host_cols):
            extra = extra + host[j] * ((x[col] > 0).astype(float) if col == "emit" else x[col])
        return jnp.where(x["tokens"] > 0, jnp.stack([r.no_overlap, r.overlap]) + extra, 0.0)
    return exact_at_zero(lambda t: jax.vmap(lambda row: one(row, t), out_axes=1)(x), tau if smooth else None)


def price_rows(plan, coefs, x, inverse, tau, smooth, has_rec):
    """[2, chunk]: NoOverlap and Overlap of a chunk of per-step sums with the host costs (one
    ``_price_chunk`` call, compiled per plan structure; usable inside a trace, e.g. the fit's)."""
    from .stack import _pad_names, role_index, split_plan
    from .step import _traced_args
    if isinstance(coefs.values, jax.core.Tracer):
        # inside a trace (the fit's loss): the plan's values as NumPy constants, not cached device
        # arrays, which a lowered-and-compiled caller would see as extra inputs
        split = split_plan(plan)
        structure, values, index = split.structure, split.values, role_index(split.slot_names, coefs.names)
    else:
        structure, values, index = _traced_args(plan, coefs)
    terms = [(name, col) for name, col in HOST_TERMS if name in coefs]
    host = jnp.stack([coefs[name] for name, _ in terms]) if terms else jnp.zeros(0)
    return _price_chunk(structure, values, index, _pad_names(coefs.values), host, x, inverse, tau, smooth, has_rec,
                        tuple(col for _, col in terms))


SMALL_CHUNK, LARGE_CHUNK = 8192, 8192      # one fixed shape: one compile per structure and mode


def price_flat(plan, coefs, laws, flat, *, estimate="no_overlap", temperature=None):
    """Price per-step sums given as a dict of NumPy arrays [n] (reads/pairs [n, L]): fixed-size
    chunks, each ONE vmapped kernel call (a Python loop over chunks, not steps). ``estimate``:
    'no_overlap', 'overlap', or 'both' ([2, n]: the two from one call)."""
    if estimate not in ESTIMATES + ("both",):
        refuse(f"unknown estimate (known: {', '.join(ESTIMATES)})", field="estimate", value=estimate)
    n = int(flat["tokens"].shape[0])
    if n == 0:
        return jnp.zeros((2, 0) if estimate == "both" else 0)
    chunk = SMALL_CHUNK if n <= 4 * SMALL_CHUNK else LARGE_CHUNK
    total = -(-n // chunk) * chunk
    smooth, tau = temperature_arg(temperature)
    has_rec = bool(len(plan.arrays["rec_kind"]))
    inverse = jax.device_put(np.asarray(laws.inverse)) if laws.inverse is not None else None
    outs = []
    for o in range(0, total, chunk):
        # each chunk cut from the steps as it is priced, the last one padded with zeros (the whole run
        # padded first was one more copy of every column: gigabytes at 10^7 steps)
        part = {k: jax.device_put(np.concatenate([v[o:o + chunk], np.zeros((max(o + chunk - n, 0),) + v.shape[1:])]))
                for k, v in flat.items()}
        outs.append(price_rows(plan, coefs, part, inverse, tau, smooth, has_rec))
    return _joined(outs, n, None if estimate == "both" else ESTIMATES.index(estimate))


def _joined(outs, n, row=None):
    """The chunks' [2, chunk] step times joined and cut to the first ``n`` steps (``row``: only
    that estimate). Concrete chunks are joined in NumPy and put back on the device (a jnp
    slice or concatenate of a new shape compiles a small program); traced ones in jnp."""
    if any(isinstance(o, jax.core.Tracer) for o in outs):
        both = jnp.concatenate(outs, axis=1)[:, :n] if len(outs) > 1 else outs[0][:, :n]
        return both if row is None else both[row]
    both = np.concatenate([np.asarray(o) for o in outs], axis=1)[:, :n]
    return jax.device_put(both if row is None else both[row])


def _flat_columns(sched):
    """The schedule's per-step sums of all ranks as one flat dict [dp * steps]."""
    keys = ("tokens", "prefill_tokens", "decode_tokens", "n_decode", "n_prefill", "n_requests", "n_off_width",
            "emit", "finishes", "admitted", "admitted_tokens")
    flat = {k: np.asarray(sched.sums[k], float).reshape(-1) for k in keys}
    L = sched.sums["reads"].shape[-1]
    flat["reads"] = np.asarray(sched.sums["reads"]).reshape(-1, L)
    flat["pairs"] = np.asarray(sched.sums["pairs"]).reshape(-1, L)
    return flat


def price_steps(sched: Schedule, coefficients, *, estimate="no_overlap", temperature=None):
    t = price_flat(sched.plan, coefficients, sched.laws, _flat_columns(sched), estimate=estimate,
                   temperature=temperature)
    return jnp.max(t.reshape(sched.dp, sched.steps), axis=0) if sched.steps else t


# ----------------------------------------------------------------------------- building


def _resident_length(ins, outs) -> float:
    """A run's typical resident request length: mean prompt + half the mean output (tokens)."""
    return float(np.mean(ins) + np.mean(outs) / 2.0) if len(ins) else 0.0


def _prepare(dep, items, engine, acceptance, *, coefficients=None):
    """items: list of (workload, client). Returns per item (settings, assumptions, lane list, meta)."""
    prepared = []
    for workload, client in items:
        arrival, ins, outs = _requests(workload, client)
        # max_model_len is a server setting: isl + osl (+ 256), the longest request the workload can
        # draw, whatever this run's sample drew (the longest drawn differed by load: 1495/1524/1535)
        taken = dict(max_len=int(workload.isl + workload.osl) if workload is not None else None, acceptance=acceptance,
                     ref_len=_resident_length(ins, outs))
        settings, assumptions = engine_settings(dep, engine, **taken)
        if isinstance(client, Trace) and (engine or {}).get("max_model_len") is None and "max_model_len" not in (dep.scenario.engine or {}):
            limit = dep.graph.max_model_len      # the trace's longest + 256, but never past the model's own
            settings["max_model_len"] = int((ins + outs).max()) + 256 if limit is None else \
                min(int((ins + outs).max()) + 256, int(limit))
        _check_lengths(settings, ins, outs, getattr(client, "source", "workload"), dep, engine, **taken)
        open_loop = arrival is not None
        conc = None if open_loop else int(client.concurrency)
        lanes, index = [], []
        for idx, c in _split(settings, arrival, ins, outs, conc):
            lanes.append(_lane(settings, n=idx.size, concurrency=c if c is not None else 0, plen=ins[idx],
                               olen=outs[idx], arrival=arrival[idx] if open_loop else np.zeros(idx.size),
                               open_loop=open_loop, law_arrays=S.law_arrays(S.read_laws(dep.plan)),
                               uniform_width=dep.plan.scalars["uniform_width"]))
            index.append(idx)
        assumptions["client"] = (repr(client) if not isinstance(client, Trace) else f"Trace({client.source}, "
                                 f"{client.num_prompts} requests)", "argument")
        if workload is not None:
            assumptions["workload"] = (repr(workload), "argument")
        assumptions["dp_placement"] = ("closed loop: C spread evenly over ranks, each rank's requests in "
                                       "proportion to its clients (request i is client i mod C's); open loop: "
                                       "round-robin" if settings["dp"] > 1 else "single rank", "serve.py")
        assumptions["step_price"] = ("each rank's batch priced, the step takes the slowest rank", "serve.py")
        h = _host_latencies(dep.coefficients)
        assumptions["request_latency"] = (
            f"admission {h.get('host_admission_per_request', 0.0) * 1e6:g} us + "
            f"{h.get('host_admission_per_token', 0.0) * 1e6:g} us x prompt tokens, completion "
            f"{h.get('host_completion', 0.0) * 1e6:g} us (E2E only)",
            "the deployment's host_admission_per_request / _per_token / host_completion (registry "
            "cost-model-host-overheads, from inference-sim), per request, not per step (request_latencies)")
        prepared.append((settings, assumptions, lanes, index, ins, outs, arrival, conc))
    return prepared


SLOT_BUCKETS = (16, 64, 256, 512, 1024)      # then powers of two: few shapes, so few compiles
REQUESTS_PER_SLOT, RECORDS_PER_REQUEST = 16, 32


def _slot_bucket(slots):
    for b in SLOT_BUCKETS:
        if slots <= b:
            return b
    return _next_pow2(slots)


def _static(slots, requests, records, fast_forward=True, laws=1):
    """The scheduler's shapes, bucketed: slots to SLOT_BUCKETS, requests to 16 per slot (or the next
    power of two), records to 32 per request (or the next power of two of the estimate)."""
    S_ = _slot_bucket(slots)
    N_ = max(REQUESTS_PER_SLOT * S_, _next_pow2(requests))
    I_ = max(RECORDS_PER_REQUEST * N_, _next_pow2(records))
    return S.Static(slots=S_, requests=N_, records=I_, fast_forward=bool(fast_forward), laws=max(int(laws), 1))


def _closed_shape(lanes, settings_list):
    """(slots, requests, record estimate, fast-forward) of closed-loop lanes run together."""
    N = max(max(l["n"] for l in lanes), 1)
    slots = max(max(min(max(l["concurrency"], 1), s["max_num_seqs"]) for l, s in zip(lanes, settings_list)), 1)
    est = max(_record_estimate(l, s, int(np.sum(l["law_on"]))) for l, s in zip(lanes, settings_list))
    ff = all(_fast_forward(s) for s in settings_list)
    return slots, N, est, ff


def _fast_forward(settings):
    return bool(settings["fast_forward"]) and 1 + settings["num_spec_tokens"] <= settings["decode_threshold"]


def _checked(states, st, lanes):
    """States as NumPy, or None when a lane ran out of records (run again with more)."""
    states = jax.tree_util.tree_map(np.asarray, states)
    return None if _overflowed(states, st, lanes).any() else states


def _run_closed(lanes, st):
    """Closed-loop lanes in ONE vmapped scheduler call of shape ``st``: (per lane its NumPy
    states, the indices of the lanes that ran out of records: ``_rerun_alone`` runs them
    again). Lanes may come from different deployments: the plan enters only through the
    lanes' read-law arrays."""
    states = jax.tree_util.tree_map(np.asarray, S.run_closed(st, _stack_lanes(lanes, st.requests)))
    per_lane = [_lane_state(states, i) for i in range(len(lanes))]
    return per_lane, np.flatnonzero(_overflowed(states, st, lanes)).tolist()


REC_KEYS = ("rec", "rec_reads", "rec_pairs", "rec_slope", "rec_floor")


def _lane_state(states, i):
    """Lane ``i``'s NumPy states, its record arrays cut to the records it wrote (copies: a view
    would keep the call's whole [lanes, records, ...] buffers alive while every other run of an
    accuracy file is scheduled; sized for the worst case, those ran to gigabytes)."""
    used = int(states["it"][i])
    return {k: (v[i, :used].copy() if k in REC_KEYS else v[i].copy()) for k, v in states.items()}


def _overflowed(states, st, lanes):
    """[lanes] bool: the lanes that ran out of records before their last request finished."""
    return (states["it"] + 2 > st.records) & (states["finished"] < np.array([l["n"] for l in lanes]))


def _alone_static(lane, st, partial):
    """The shape to run again alone a lane that ran out of records in a call of shape ``st``:
    enough records for all its requests at the rate it finished them (``partial``: its states
    when it stopped), 4 to 16 x as many."""
    grow = 1.5 * max(int(lane["n"]), 1) / max(int(partial["finished"]), 1)
    records = st.records * min(max(_next_pow2(math.ceil(grow)), 4), 16)
    return _static(st.slots, max(int(lane["n"]), 1), records, st.fast_forward, st.laws)


def _rerun_alone(lane, st, partial, tries=3):
    """A lane that ran out of records in a call of shape ``st`` run alone with more
    (``_alone_static``), up to ``tries`` times: its NumPy states, or the JaxpriceError
    refusing it."""
    for _ in range(tries):
        st = _alone_static(lane, st, partial)
        (partial,), over = _run_closed([lane], st)
        if not over:
            return partial
    return JaxpriceError("the schedule did not finish (too many steps)", field="schedule", value=int(st.records))


OPEN_CHUNK_RECORDS = 1 << 18    # records per open-loop scheduler call (2 a step): a long run goes on in calls of
#                                 this many, its records copied out between them, so its memory grows with its
#                                 steps and a progress report comes per call (one call sized by a guess ran out on
#                                 a 60,000-request day trace, 4.2 M steps, and ran again from the start 8 x larger:
#                                 7.7 min, 3.5 GB)


def _run_open(dep, laws, lanes, settings_list, coefficients, estimate="no_overlap", temperature=None, callback=None):
    """An open-loop run's lanes (its dp ranks, coupled: they step together, priced inside the
    loop), in scheduler calls of at most ``OPEN_CHUNK_RECORDS`` records, each going on where the
    last stopped (``S.run_open``'s carry); NumPy states. ``callback(done, total, steps=)`` after
    each call: requests finished of the run's. Closed loops go through ``build_schedules_batched``."""
    N = max(max(l["n"] for l in lanes), 1)
    slots = max(s["max_num_seqs"] for s in settings_list)
    est = max(_record_estimate(l, s, len(laws.a)) for l, s in zip(lanes, settings_list))
    st = _static(slots, N, 2 * est, False, len(laws.a))
    limit = _static(slots, N, 2 * est * 64, False, len(laws.a)).records     # the most records a run may take
    st = st._replace(records=min(st.records, max(OPEN_CHUNK_RECORDS, 2)))     # a step writes 2 records
    stacked = _stack_lanes(lanes, st.requests)
    n = np.array([l["n"] for l in lanes])
    inverse = None if laws.inverse is None else jnp.asarray(laws.inverse)
    carry = _init_carry(st, len(lanes))
    pieces = {k: [[] for _ in lanes] for k in REC_KEYS}
    while True:
        out = _run_open_jit(st, dep.plan, coefficients, stacked, estimate, *temperature_arg(temperature), inverse,
                            carry)
        carry = out.pop("carry")
        states = jax.tree_util.tree_map(np.asarray, out)
        used = states["it"] - states.pop("base")
        for k in REC_KEYS:      # every other record: the decode runs' slots, empty without fast-forward
            for i in range(len(lanes)):
                pieces[k][i].append(states[k][i, :used[i]:2].copy())
        del out
        over = (states["finished"] < n) & ~states["stuck"]
        if callback:
            callback(int(np.sum(np.minimum(states["finished"], n))), int(np.sum(n)),
                     steps=int(np.max(states["it"])) // 2)
        if not over.any():
            break
        if int(np.max(states["it"])) + 2 > limit:
            refuse("the schedule did not finish (too many steps)", field="schedule", value=int(limit))
    states["records"] = states["it"] // 2
    longest = int(np.max(states["records"]))
    for k in REC_KEYS:
        joined = [np.concatenate(p) if p else np.zeros((0,)) for p in pieces[k]]
        full = np.zeros((len(lanes), longest) + joined[0].shape[1:])
        for i, x in enumerate(joined):
            full[i, :x.shape[0]] = x
        states[k] = full
        del pieces[k], joined
    if states["stuck"].any():
        refuse("the scheduler stalled: a request cannot be admitted (KV cache or budget too small)",
               field="engine", value=None)
    return states


_init_carry = jax.jit(S.init_carry, static_argnums=(0, 1))


@functools.partial(jax.jit, static_argnames=("st", "plan", "estimate", "smooth"))
def _run_open_jit(st, plan, coefs, lanes, estimate, smooth, tau, inverse, carry):
    has_rec = bool(len(plan.arrays["rec_kind"]))

    def price(row, reads, pairs):
        cols = {c: row[S.COL[c]] for c in S.COLS}
        sums = {k: cols[k] for k in ("tokens", "prefill_tokens", "n_decode", "n_prefill", "n_requests", "n_off_width")}
        if has_rec:
            sums["decode_tokens"] = cols["decode_tokens"]
        if inverse is not None:
            sums["reads"] = reads[inverse]
            sums["pairs"] = pairs[inverse]
        r = exact_at_zero(lambda t: _step_time(plan, coefs, None, t, False, sums=sums), tau if smooth else None)
        t = r.no_overlap if estimate == "no_overlap" else r.overlap
        emit = cols["emit_decode"] + cols["emit_first"]
        for name, col in HOST_TERMS:
            if name in coefs:
                amount = (emit > 0).astype(float) if col == "emit" else cols[col]
                t = t + coefs[name] * amount
        return t
    return S.run_open(st, lanes, price, carry)


def _padded(arrays, steps):
    """[ranks, steps, ...] float: each rank's array, zero-padded to ``steps`` rows."""
    out = np.zeros((len(arrays), steps) + arrays[0].shape[1:])
    for r, x in enumerate(arrays):
        out[r, :x.shape[0]] = x
    return out


def _records(st) -> int:
    """The records a lane's states hold: its iteration count, 2 records an iteration (a step and the
    decode run that repeats it), or ``records`` where the open loop kept only the steps (it runs no
    decode runs: ``_run_open``)."""
    return int(st["records"]) if "records" in st else int(st["it"])


def _assemble(dep, laws, states, lane_ids, prepared_item):
    settings, assumptions, lanes, index, ins, outs, arrival, conc = prepared_item
    dp = len(lanes)
    per = []
    for r, li in enumerate(lane_ids):
        st = {k: v[li] for k, v in states.items()}
        cols, reads, pairs, idx, s0 = S.expand(st["rec"], st["rec_reads"], st["rec_pairs"], st["rec_slope"],
                                              _records(st), lanes[r]["acc"])
        floor = np.asarray(st["rec_floor"])[: _records(st)][idx] if idx.size else np.zeros(0)
        per.append((st, cols, reads, pairs, floor))
    steps = max(p[1]["tokens"].size for p in per)
    L = len(laws.a)
    sums = {c: _padded([p[1][c] for p in per], steps) for c in S.COLS if c != "m"}
    sums["emit"] = sums["emit_decode"] + sums["emit_first"]
    sums["reads"] = _padded([p[2][:, :L] for p in per], steps).reshape(dp, steps, L)
    sums["pairs"] = _padded([p[3][:, :L] for p in per], steps).reshape(dp, steps, L)
    floor = np.max(_padded([p[4] for p in per], steps), axis=0) if steps else np.zeros(0)
    n = ins.size
    req = {"input_len": ins.copy(), "output_len": outs.copy(), "rank": np.zeros(n, np.int64),
           "first_step": np.zeros(n, np.int64), "finish_step": np.zeros(n, np.int64),
           "emits": np.zeros(n, np.int64), "preemptions": np.zeros(n, np.int64),
           "arrival_step": np.full(n, -1, np.int64),
           "arrival": np.asarray(arrival, float) if arrival is not None else np.zeros(n)}
    for r, (st, *_rest) in enumerate(per):
        idx = index[r]
        k = idx.size
        req["rank"][idx] = r
        req["first_step"][idx] = st["first"][:k]
        req["finish_step"][idx] = st["finish"][:k]
        req["emits"][idx] = st["emits"][:k]
        req["preemptions"][idx] = st["npre"][:k]
        if conc is not None:
            c = lanes[r]["concurrency"]
            fin_sorted = np.sort(st["finish"][:k])
            later = np.arange(k) >= c
            arr = np.full(k, -1, np.int64)
            arr[later] = fin_sorted[np.arange(k)[later] - c]
            req["arrival_step"][idx] = arr
    iters = int(sum(int(p[0]["it"]) for p in per))
    return Schedule(plan=dep.plan, settings=settings, assumptions=assumptions, laws=laws, sums=sums,
                    requests=req, floor=floor, open_loop=conc is None, concurrency=conc, steps=steps,
                    iterations=iters, host=_host_latencies(dep.coefficients))


def build_schedules(dep, items, *, engine=None, acceptance=None, coefficients=None, estimate="no_overlap",
                    temperature=None, callback=None):
    """Schedules of several (workload, client) pairs; the closed-loop ones in shared vmapped
    scheduler calls (every concurrency level and dp rank a lane, grouped by shape:
    ``build_schedules_batched``), each open-loop one in its own loop."""
    laws = S.read_laws(dep.plan)
    prepared = _prepare(dep, items, engine, acceptance)       # refusals of bad input raise here
    out = [None] * len(items)
    closed = [i for i, p in enumerate(prepared) if p[7] is not None]
    if closed:      # the shared path, so every caller reuses the same few compiled shapes
        got = build_schedules_batched([(dep, [items[i] for i in closed], engine, acceptance)])[0]
        for i, sc in zip(closed, got):
            if isinstance(sc, JaxpriceError):
                raise sc
            out[i] = sc
    for i, p in enumerate(prepared):
        if p[7] is None:
            coefs = dep.coefficients if coefficients is None else coefficients
            states = _run_open(dep, laws, p[2], [p[0]] * len(p[2]), coefs, estimate=estimate, temperature=temperature,
                               callback=callback)
            out[i] = _assemble(dep, laws, states, list(range(len(p[2]))), p)
    return out


LANE_ELEMENTS = 1024      # lanes x slots per batched scheduler call: small lanes ride along nearly
#                           free (an iteration of a small lane costs mostly dispatch), large ones cost
#                           in proportion, so they go in small groups
ALONE_SLOTS = 256         # lanes of this many slots or more run alone: there n lanes in one call cost n
#                           times one per iteration (measured), and the call runs as long as its longest


def _kv_pressure(lane, settings):
    """Blocks the lane's resident requests would hold at full length (min(C, max_num_seqs)
    requests of its mean prompt + output) over the blocks its KV cache holds: above 1 the
    lane preempts, and runs several times as many iterations."""
    n = int(lane["n"])
    if n == 0:
        return 0.0
    resident = min(max(int(lane["concurrency"]), 1), settings["max_num_seqs"])
    per_request = math.ceil(float(np.mean(lane["plen"][:n] + lane["olen"][:n])) / settings["block_size"])
    return resident * per_request / max(settings["kv_blocks"], 1)


def _expected_length(lane, settings, est):
    """A lane's expected run length, for grouping: its record estimate ``est``, times 4 x its
    KV pressure where that is above 1 (``_kv_pressure``: a preempting lane runs longer)."""
    p = _kv_pressure(lane, settings)
    return est * (4.0 * p if p > 1.0 else 1.0)


def _lane_groups(entries):
    """Entries (bucket key, expected length, ...) -> lists of entries run together: per shape
    bucket, the largest slot bucket first (its lanes run longest: the other buckets' shapes
    compile meanwhile), longest lanes first (lanes of one call run as long as its longest), in
    groups of one size per bucket (``_group_size``; the last group padded to it), so each
    bucket compiles one shape."""
    by_key: dict = {}
    for e in entries:
        by_key.setdefault(e[0], []).append(e)
    groups = []
    for key, es in sorted(by_key.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        es.sort(key=lambda e: -e[1])
        size = _group_size(key[0], len(es))
        groups += [(key, es[o:o + size], size) for o in range(0, len(es), size)]
    return groups


def _group_size(slots, lanes):
    """Lanes per scheduler call in a slot bucket holding ``lanes`` lanes: LANE_ELEMENTS / slots
    (1 from ALONE_SLOTS), at most the next power of two of ``lanes``."""
    cap = max(1, LANE_ELEMENTS // slots) if slots < ALONE_SLOTS else 1
    return min(cap, _next_pow2(lanes))


def _dummy_lane(lane):
    """A lane with no requests (done before its first iteration): pads a group to its size."""
    return dict(lane, n=0, concurrency=0)


def _group_call(group, n_laws):
    """(lanes, Static) of one lane group: its lanes padded to the group's size with dummy lanes,
    and the scheduler's shape for them."""
    key, members, size = group
    lanes = [e[2] for e in members]
    lanes += [_dummy_lane(lanes[0])] * (size - len(lanes))
    settings = [e[3] for e in members] + [members[0][3]] * (size - len(members))
    _slots, N, est, _ff = _closed_shape(lanes, settings)
    return lanes, _static(key[0], N, 2 * est, key[1], n_laws)


def _compile_scheduler(lanes, st):
    """Compile (not run) the scheduler for these lanes' shape; the jitted ``S.run_closed`` then
    finds it compiled."""
    S.run_closed.lower(st, _stack_lanes(lanes, st.requests)).compile()


def _compile_ahead(pool, calls):
    """Start compiling in ``pool`` each distinct shape of ``calls`` ((lanes, Static) per group),
    in the order the groups run: {(Static, lanes): Future}. Later shapes compile while earlier
    groups run; a group waits for its own shape's compile (so calls running side by side
    never compile one shape twice)."""
    ahead = {}
    for lanes, st in calls:
        if (st, len(lanes)) not in ahead:
            ahead[(st, len(lanes))] = pool.submit(_compile_scheduler, lanes, st)
    return ahead


def _prepare_lanes(jobs, results):
    """Every job's items prepared (``_prepare``; a refusal lands in ``results``) and their lanes
    as entries (bucket key, expected length, lane, settings, (job, item, rank)): (prepared per
    job, read laws per job, entries)."""
    prepared, laws_of, entries = [], [], []
    for j, (dep, items, engine, *acceptance) in enumerate(jobs):
        laws_of.append(S.read_laws(dep.plan))
        prep = []
        for i, item in enumerate(items):
            if not isinstance(item[1], ClosedLoop):
                refuse("batched schedules are for closed-loop clients", field="client", value=type(item[1]).__name__)
            try:
                p = _prepare(dep, [item], engine, acceptance[0] if acceptance else None)[0]
            except JaxpriceError as err:
                results[j][i] = err
                prep.append(None)
                continue
            prep.append(p)
            for r, lane in enumerate(p[2]):
                slots, _n, est, ff = _closed_shape([lane], [p[0]])
                entries.append(((_slot_bucket(slots), ff), _expected_length(lane, p[0], est), lane, p[0], (j, i, r)))
        prepared.append(prep)
    return prepared, laws_of, entries


def scheduler_workers() -> int:
    """Scheduler calls run at once (``_run_groups``): one per CPU this process may use, at most
    SCHEDULER_WORKERS. A call's loop is a long chain of tiny thunks that XLA:CPU spreads over
    its thread pool: alone it keeps two cores busy for one core's work (measured: the same call
    pinned to one core is no slower), so independent calls side by side use the cores instead."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, SCHEDULER_WORKERS))


SCHEDULER_WORKERS = 4


def _run_group(lanes, st, compiled):
    """One lane group's call, after its shape's compile (``compiled``: its Future; a failed
    compile: the call compiles)."""
    compiled.exception()
    return _run_closed(lanes, st)


def _run_groups(entries, n_laws, results, callback=None):
    """Run every lane group (``_lane_groups``), ``scheduler_workers()`` calls at once in the
    order the groups come (the largest first), the shapes compiled ahead in a background thread
    (``_compile_ahead``; a lane that runs out of records is run again alone at the end):
    {(job, item, rank): NumPy states}; a lane the scheduler refuses puts its JaxpriceError in
    ``results``. The groups are independent, so running them side by side changes no result."""
    groups = _lane_groups(entries)
    calls = [_group_call(g, n_laws) for g in groups]
    lane_states, again = {}, []
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool, \
            concurrent.futures.ThreadPoolExecutor(max_workers=scheduler_workers()) as runners:
        ahead = _compile_ahead(pool, calls)
        running = {runners.submit(_run_group, lanes, st, ahead[(st, size)]): g
                   for g, ((_key, _members, size), (lanes, st)) in enumerate(zip(groups, calls))}
        for done, fut in enumerate(concurrent.futures.as_completed(running)):
            g = running[fut]
            (key, members, size), (lanes, st) = groups[g], calls[g]
            per_lane, over = fut.result()
            for li, e in enumerate(members):
                lane_states[e[4]] = per_lane[li]
            for li in over:
                again.append((members[li][4], lanes[li], st, per_lane[li]))
            if callback is not None:
                callback(done + 1, len(groups), stage="scheduled", slots=key[0], lanes=size,
                         iterations=max(int(x["it"]) for x in per_lane) // 2)
    for ids, lane, st, partial in sorted(again, key=lambda a: a[0]):
        lane_states.pop(ids)
        states = _rerun_alone(lane, st, partial)
        if isinstance(states, JaxpriceError):
            results[ids[0]][ids[1]] = states
        else:
            lane_states[ids] = states
    return lane_states


def build_schedules_batched(jobs, *, callback=None) -> list:
    """Closed-loop schedules of many deployments at once. ``jobs``: a list of (deployment, items,
    engine[, acceptance]), items (workload, ClosedLoop) pairs as for ``build_schedules``. Returns, per job, a
    list with per item its Schedule, or the JaxpriceError that refuses that run (so one bad
    run does not sink the others).

    The scheduler reads a plan only through its read laws, which are lane data, so lanes of
    different deployments share one compiled call: every lane (concurrency level and dp rank)
    of every job is put in its shape bucket (slots, fast-forward), sorted by expected length
    (``_expected_length``) and run in groups of one size per bucket (``_lane_groups``), the
    shapes compiled in a background thread while earlier groups run. The compiles are one per
    bucket, not one per deployment, and the schedules equal ``build_schedules``' (a test holds
    them equal). ``callback(done, total, stage='scheduled')`` after each group."""
    results = [[None] * len(job[1]) for job in jobs]
    prepared, laws_of, entries = _prepare_lanes(jobs, results)
    n_laws = max([len(l.a) for l in laws_of] + [1])
    lane_states = _run_groups(entries, n_laws, results, callback)
    for j, prep in enumerate(prepared):
        for i, p in enumerate(prep):
            if p is None or results[j][i] is not None or any((j, i, r) not in lane_states
                                                             for r in range(len(p[2]))):
                continue
            ranks = [lane_states[(j, i, r)] for r in range(len(p[2]))]
            # a run's ranks may have run in groups of other shapes (e.g. 17 and 16 clients: two
            # slot buckets): a list per key, indexed by rank, not one stacked array
            states = {k: [st[k] for st in ranks] for k in ranks[0]}
            if any(bool(np.any(x)) for x in states["stuck"]):
                results[j][i] = JaxpriceError("the scheduler stalled: a request cannot be admitted (KV cache or "
                                              "budget too small)", field="engine")
                continue
            results[j][i] = _assemble(jobs[j][0], laws_of[j], states, list(range(len(p[2]))), p)
    return results


def build_schedule(deployment, workload, client, *, engine=None, acceptance=None, coefficients=None,
                   estimate="no_overlap", temperature=None, callback=None) -> Schedule:
    """The schedule of one run, without step times (closed loop). An open-loop client's schedule
    depends on times: it is simulated with ``coefficients`` (default the deployment's) and
    returned as the fixed schedule it produced (``callback(done, total, steps=)``: its progress,
    requests finished, after each scheduler call)."""
    _check_run(deployment, estimate, temperature, coefficients)
    check_clients_send(client)
    if isinstance(client, (OpenLoop, Trace)):     # its steps are priced while it is scheduled
        _refuse_traced("build_schedule of an open-loop client", coefficients, temperature)
    check_callback(callback)
    return build_schedules(deployment, [(workload, client)], engine=engine, acceptance=acceptance,
                           coefficients=coefficients, estimate=estimate, temperature=temperature,
                           callback=callback)[0]


# ----------------------------------------------------------------------------- metrics


def _xp(x):
    return jnp if isinstance(x, (jax.Array, jax.core.Tracer)) else np


def step_end_times(sched: Schedule, step_times):
    """End time (s) of every step: cumulative step times, never before a step's floor (open loop:
    the engine idles until a request arrives)."""
    xp = _xp(step_times)
    dt = step_times
    c = xp.cumsum(dt)
    if not sched.open_loop or sched.steps == 0:
        return c
    cprev = c - dt
    gap = xp.asarray(sched.floor) - cprev
    if xp is jnp:
        x = jax.lax.cummax(jnp.maximum(gap, 0.0))
    else:
        x = np.maximum.accumulate(np.maximum(gap, 0.0))
    return c + x


def _weighted_percentiles(xp, values, weights, qs):
    """The weighted percentiles ``qs`` of ``values`` (one sort for all of them)."""
    order = xp.argsort(values)
    v = values[order]
    w = xp.asarray(weights)[order] if xp is np else jnp.asarray(weights)[order]
    cw = xp.cumsum(w)
    total = cw[-1]
    out = []
    for q in qs:
        i = xp.searchsorted(cw, q / 100.0 * total, side="left")
        out.append(v[xp.clip(i, 0, v.shape[0] - 1)])
    return out


def _host_latencies(coefs) -> dict:
    """The per-request host latencies (s) a coefficient set carries (``HOST_LATENCIES``)."""
    return {n: float(coefs[n]) for n in HOST_LATENCIES if coefs is not None and n in coefs}


def request_latencies(sched: Schedule, step_times, coefficients=None) -> dict:
    """Each request's latencies outside the engine's steps (the module docstring's Time):
    ``admission`` [n] (s): host_admission_per_request + host_admission_per_token x its prompt
    tokens; ``wait`` [n] (s): the rest of the step in flight when it reaches the scheduler, a
    fraction ``arrival_phase`` of the step after the one its predecessor finished in (closed loop,
    after the first wave, with another request on its rank; else 0); ``completion`` (s):
    host_completion. ``coefficients``: the host latencies' source (default: the deployment's, as
    the schedule was built). Linear in step_times; jnp in, jnp out."""
    # KNOWN DIVERGENCE [admission-after-schedule]: the schedule (token counts only) lets a
    # request enter the waiting queue when its client sends it (closed loop: at the boundary its
    # predecessor's last token came out; open loop: at its arrival time), and its admission
    # latency and schedule() wait are added to its times afterwards; inference-sim delays the
    # request's entry into the wait queue by its admission time (its QueuedEvent). The engine so
    # holds each client's request up to L + a step early: the resident batch is overstated by
    # about (L + step) / E2E (a percent or two at 1k-8k outputs), the latencies are the same. The
    # closed loop's clock is the engine's: a request's arrival is the end of the step its client's
    # previous request finished in, before that one's finish as reported (+ its L + wait), so the
    # run's duration (last arrival + E2E) leaves out each request's L + host_completion on its
    # client's chain and tok/s reads high by up to (L + host_completion) / E2E where the engine
    # would idle meanwhile (C = 1 per rank): 0.3% at isl/osl 1k/1k on Llama-3.1-70B tp4 h200, 27% at 64/8.
    # KNOWN DIVERGENCE [schedule-wait-phase]: the wait is a fixed share (arrival_phase) of the step
    # after the predecessor's last one, not the rest of the step actually in flight at arrival + L
    # (that needs the step times, which the closed-loop schedule is built without); inference-sim
    # gets it from its event clock.
    xp = _xp(step_times)
    req = sched.requests
    if coefficients is None:
        host = sched.host
    else:
        host = {n: (coefficients[n] if xp is jnp else float(coefficients[n]))
                for n in HOST_LATENCIES if n in coefficients}
    ins = np.asarray(req["input_len"], float)
    n = ins.size
    admission = (host.get("host_admission_per_request", 0.0) + host.get("host_admission_per_token", 0.0) * ins
                 + xp.zeros(n))
    if sched.open_loop or sched.steps == 0:
        wait = xp.zeros(n)
    else:
        a = np.asarray(req["arrival_step"])
        nxt = a + 1
        c, dp, rank = int(sched.concurrency), int(sched.dp), np.asarray(req["rank"])
        c_rank = c // dp + (rank < c % dp)
        # the engine is busy with others when the request arrives: after the first wave (that one
        # meets an idle engine), a step follows, and its rank holds another client
        busy = (a >= 0) & (nxt < sched.steps) & (c_rank >= 2)
        in_flight = step_times[np.clip(nxt, 0, sched.steps - 1)]
        phase = sched.settings.get("arrival_phase")
        if phase is None:
            phase = xp.where(admission > 0, 0.5, 1.0)
        wait = xp.where(busy, phase * in_flight, 0.0)
    return {"admission": admission, "wait": wait, "completion": host.get("host_completion", 0.0)}


def metric_offsets(sched: Schedule, coefficients=None):
    """[mean TPOT, mean TTFT] (s) at zero step times: the parts of ``schedule_metrics``' means
    that do not scale with the step times (the admission latencies; TPOT has none). Both means
    are affine in the step times, so mean = jacobian @ step_times + this (what fit's linear
    weights over steps need added). jnp when ``coefficients`` is traced, else NumPy."""
    lat = request_latencies(sched, np.zeros(max(sched.steps, 1)) if coefficients is None or
                            not isinstance(coefficients.values, (jax.Array, jax.core.Tracer))
                            else jnp.zeros(max(sched.steps, 1)), coefficients)
    xp = _xp(lat["admission"])
    return xp.stack([xp.asarray(0.0), xp.mean(lat["admission"])])


def _booleans(x) -> bool:
    """Whether step times are booleans (True read as 1 s): an array's dtype, or a list's."""
    dt = getattr(x, "dtype", None)
    if dt is None and isinstance(x, (list, tuple)):
        try:
            dt = np.asarray(x).dtype
        except (TypeError, ValueError):                 # ragged: refused below as not numbers
            return False
    return dt is not None and np.dtype(dt).kind == "b"


def _check_step_times(sched, step_times, coefficients):
    """schedule_metrics' arguments: a Schedule, one time per step (shapes only for JAX arrays,
    which may be traced; NumPy or list values also finite and >= 0), Coefficients or None."""
    if not isinstance(sched, Schedule):
        refuse("needs a Schedule (build_schedule(...))", field="sched", value=type(sched).__name__)
    if coefficients is not None and not isinstance(coefficients, Coefficients):
        refuse("must be None (the deployment's) or a Coefficients", field="coefficients",
               value=type(coefficients).__name__)
    if coefficients is not None:
        check_coefficient_set(coefficients, sched.plan)
    if step_times is None or isinstance(step_times, (str, bytes)) or _booleans(step_times):   # NaN, 1 s
        refuse("must be numbers, one time (s) per step", field="step_times", value=shown(step_times),
               has_value=True)
    if not isinstance(step_times, (jax.Array, jax.core.Tracer)):
        try:
            arr = np.asarray(step_times, dtype=float)
        except (TypeError, ValueError):
            refuse("must be numbers, one time (s) per step", field="step_times",
                   value=type(step_times).__name__)
        if arr.shape == (sched.steps,) and not np.all(np.isfinite(arr) & (arr >= 0)):
            k = int(np.flatnonzero(~(np.isfinite(arr) & (arr >= 0)))[0])
            refuse("must be finite times >= 0 (s)", field=f"step_times[{k}]", value=float(arr[k]), has_value=True)
    if tuple(np.shape(step_times)) != (sched.steps,):
        refuse(f"needs one time per step: shape ({sched.steps},) for this schedule", field="step_times",
               value=tuple(np.shape(step_times)), has_value=True)


def _itl_gaps(sched: Schedule) -> tuple:
    """The pooled gaps between a request's token-emitting steps, as (later, earlier, weight): a
    gap runs from the end of step ``earlier`` (-1: the run's start) to the end of step ``later``,
    ``weight`` requests have it. From the schedule's counts alone (token counts, no times): on
    each rank, the requests emitting a decode token in step k last emitted in the rank's
    previous decode-emitting step p, except those whose first token came in a step j between
    p and k (SGLang's prefill-only steps), whose gap runs from j. Their weighted mean is
    ``itl_mean`` exactly (the sum of every request's gaps is finish - first token) but for
    preempted requests (below)."""
    # COVERAGE LIMIT [itl-preempted-gap]: a preempted request's gap over its recompute is counted as
    # the rank's step gap (the counts do not say when it left the batch): the percentiles miss it,
    # the mean (from finish - first token) does not
    ed = np.asarray(sched.sums["emit_decode"], dtype=float)
    ef = np.asarray(sched.sums["emit_first"], dtype=float)
    later, earlier, weight = [], [], []
    for r in range(ed.shape[0]):
        dec = np.flatnonzero(ed[r] > 0)
        if not dec.size:
            continue
        nxt = np.searchsorted(dec, np.arange(ed.shape[1]), side="right")     # each step's next decode step
        firsts = np.flatnonzero((ef[r] > 0) & (nxt < dec.size))
        k_of = dec[nxt[firsts]]
        w = ef[r, firsts]
        cum = np.cumsum(w)
        start = np.searchsorted(k_of, k_of, side="left")                     # first of its decode step's group
        before = cum - w - np.where(start > 0, cum[np.maximum(start - 1, 0)], 0.0)
        w = np.clip(np.minimum(w, ed[r, k_of] - before), 0.0, None)          # at most the step's decode tokens
        rest = ed[r, dec] - np.bincount(np.searchsorted(dec, k_of), weights=w, minlength=dec.size)
        prev = np.concatenate([[-1], dec[:-1]])
        later += [k_of, dec]
        earlier += [firsts, np.where(prev >= 0, prev, dec - 1)]
        weight += [w, np.clip(rest, 0.0, None)]
    later, earlier, weight = (np.concatenate(x) for x in (later, earlier, weight))
    keep = weight > 0
    return later[keep], earlier[keep], weight[keep]


# ----------------------------------------------------------------------------- SLOs and goodput

# vLLM's benchmark client's names for the per-request metrics an SLO may bound (its --goodput
# KEY:VALUE names, check_goodput_args' VALID_NAMES), and the per-request array each one reads
SLO_METRICS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e"}


def check_slo(slo, *, field: str = "slo", unit: str = "s"):
    """A service-level objective, checked before anything runs: None (no SLO), or a dict
    ``{"ttft": t, "tpot": t, "e2el": t}`` of any non-empty subset (or the same as (name, target)
    pairs), targets in seconds (``unit="ms"``: milliseconds, as the CLI's --goodput gives them,
    refused naming ``--goodput NAME``). Returns {name: target in seconds} in the order given.
    Refused (JaxpriceError naming the field and the value): not a dict or pairs, no target, an
    unknown name (only vLLM's ttft, tpot and e2el: E2E is ``e2el``, ITL has no per-request
    value), a name given twice, a target that is not a finite number > 0.

    What it means (vLLM's benchmark client, ``vllm bench serve --goodput ttft:MS tpot:MS
    e2el:MS``, DistServe's goodput; read in vllm-project/vllm vllm/benchmarks/serve.py
    @def9ce85ba1079af970a58ed3d42dd861ae35d58, ``calculate_metrics`` and ``check_goodput_args``):
    a request is good when EVERY metric the SLO names is <= its target (``all(s >= r for s, r in
    zip(slo_values, req_metric))``; the targets are the KEY:VALUE milliseconds / 1000); a request
    with one output token has TPOT 0 there (``all_tpots``: "if output_len <= 1, we regard tpot as
    0 for goodput"), so it meets any TPOT target; ``request_goodput = good_completed / dur_s``.
    Here: ``goodput`` = good requests / the run's ``duration`` (requests/s) and ``slo_attainment``
    = good requests / all requests (``schedule_metrics``), each request's TTFT, TPOT and E2E the
    ones the result reports (vLLM's TPOT is (E2E - TTFT) / (output - 1); the simulation's is
    (finish - first token) / (output - 1), the same but for host_completion, which the module
    docstring puts on E2E only, not TPOT). Differences from vLLM: it takes a target
    of 0 (refused here: no request with any latency meets it) and a name given twice (it keeps the
    last; refused here); every simulated request completes (vLLM counts only successful ones)."""
    if slo is None:
        return None
    ms = unit == "ms"

    def at(name):
        return f"{field} {name}" if ms else f"{field}[{name!r}]"

    if isinstance(slo, Mapping):
        pairs = list(slo.items())
    elif isinstance(slo, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in slo):
        pairs = [tuple(p) for p in slo]
    else:
        refuse("must be None or a dict of targets in seconds, e.g. {'ttft': 0.5, 'tpot': 0.05, 'e2el': 10} "
               "(vLLM's --goodput names)", field=field, value=shown(slo), has_value=True)
    if not pairs:
        refuse(f"names no target: give at least one of {', '.join(SLO_METRICS)}", field=field,
               value="" if ms else {}, has_value=True)
    out = {}
    for name, target in pairs:
        if not isinstance(name, str) or name not in SLO_METRICS:
            hint = " (E2E is 'e2el', as vLLM names it)" if str(name).lower() in ("e2e", "e2e_latency") else ""
            refuse(f"unknown SLO metric (known: {', '.join(SLO_METRICS)}, vLLM's --goodput names){hint}",
                   field=field, value=shown(name), has_value=True)
        if name in out:
            refuse("names this metric twice; give each once", field=field, value=name)
        try:
            t = float(target) if _is_real(target) else math.nan
        except OverflowError:                   # an int past float's range
            t = math.inf
        if not (math.isfinite(t) and t > 0):
            refuse(f"must be a finite number > 0 ({'milliseconds' if ms else 'seconds'}): a request is good when "
                   f"its {name} is <= it", field=at(name), value=shown(target), has_value=True)
        out[name] = t / (1e3 if ms else 1.0)
    return out


def slo_good(metrics: dict, output_len, slo: dict):
    """Which requests meet ``slo`` ({name: seconds}, ``check_slo``'s): every named metric of
    ``metrics`` (per-request ttft, tpot, e2e arrays, seconds) <= its target, TPOT counted 0 for a
    request of one output token (vLLM's ``all_tpots``; see ``check_slo``). Boolean [n]; jnp in,
    jnp out."""
    xp = _xp(metrics["ttft"])
    multi = np.asarray(output_len) > 1
    good = xp.ones(np.shape(output_len), dtype=bool)
    for name, target in slo.items():
        v = metrics[SLO_METRICS[name]]
        if name == "tpot":
            v = xp.where(multi, v, 0.0)
        good = good & (v <= target)
    return good


def schedule_metrics(sched: Schedule, step_times, coefficients=None, *, slo=None) -> dict:
    """The run's metrics from each step's time: per-request arrays (ttft, tpot, e2e, first_token,
    finish, arrival, admission, wait) and the summary (ttft_mean/median/p90/p99, the same for
    tpot, itl, e2e, ttft_admission_mean and ttft_wait_mean (the parts of TTFT outside the steps,
    ``request_latencies``; TPOT over the requests with more than one output token, 0 where there
    are none, as the benchmark client reports it), output_tps, output_tps_per_gpu,
    output_tps_per_user (= 1 / mean TPOT, InferenceX's interactivity; 0 without TPOT),
    requests_per_s, duration (the client's wall time: the last arrival + E2E), and the schedule's
    counts). ``slo`` (``check_slo``: {"ttft"/"tpot"/"e2el": seconds}, vLLM's --goodput): also the
    per-request ``good`` (bool: every named metric <= its target, TPOT 0 for one-token requests)
    and in the summary ``goodput`` (good requests / duration, requests/s) and ``slo_attainment``
    (good requests / requests); without it neither, and nothing else changes. Every
    request's tokens reach its client its admission + wait later than the engine emits them;
    E2E adds host_completion. ``coefficients``: where the host latencies come from (default the
    deployment's, as built). jnp in, jnp out (differentiable in step_times and the coefficients;
    affine in step_times: the admission and completion latencies do not scale with them);
    NumPy in, NumPy out."""
    _check_step_times(sched, step_times, coefficients)
    slo = check_slo(slo)
    if isinstance(step_times, (list, tuple)):      # checked as numbers above; indexed as an array below
        step_times = np.asarray(step_times, dtype=float)
    xp = _xp(step_times)
    req = sched.requests
    end = step_end_times(sched, step_times)
    lat = request_latencies(sched, step_times, coefficients)
    late = lat["admission"] + lat["wait"]
    first = end[req["first_step"]] + late
    finish = end[req["finish_step"]] + late
    if sched.open_loop:
        arrival = xp.asarray(req["arrival"])
    else:
        a_step = req["arrival_step"]
        arrival = xp.where(xp.asarray(a_step) >= 0, end[np.maximum(a_step, 0)], 0.0)
    out_len = req["output_len"]
    ttft = first - arrival
    multi = out_len > 1
    tpot = (finish - first) / np.maximum(out_len - 1, 1)
    e2e = finish - arrival + lat["completion"]
    # the benchmark's duration is the wall time of the timed run (serving-reference §4.4; throughputs
    # divide by it): until the last response is back at its client, arrival + E2E, which follows the
    # engine's last step by that request's admission latency, wait and completion (end[-1] made the
    # summary's tok/s up to 3% over the per-request rows' on a short open-loop run)
    duration = xp.max(arrival + e2e) if sched.steps else xp.asarray(0.0)
    m = {"ttft": ttft, "tpot": tpot, "e2e": e2e, "first_token": first, "finish": finish, "arrival": arrival,
         "admission": lat["admission"], "wait": lat["wait"]}
    summary = {}
    # the client leaves one-token requests out of TPOT, and with none left reports 0 (its `tpots or 0`)
    tpot_kept = tpot if multi.all() else tpot[multi] if multi.any() else xp.zeros(1)
    for name, vals in (("ttft", ttft), ("tpot", tpot_kept), ("e2e", e2e)):
        summary[f"{name}_mean"] = xp.mean(vals)
        summary[f"{name}_median"] = xp.median(vals)
        summary[f"{name}_p90"] = xp.percentile(vals, 90)
        summary[f"{name}_p99"] = xp.percentile(vals, 99)
    summary["ttft_admission_mean"] = xp.mean(lat["admission"])
    summary["ttft_wait_mean"] = xp.mean(lat["wait"])
    # COVERAGE LIMIT [stream-interval]: gaps between tokens, as a server streaming every token sends them
    gaps = np.maximum(req["emits"] - 1, 0)
    summary["itl_mean"] = xp.sum(finish - first) / max(int(gaps.sum()), 1)
    w = np.asarray(sched.sums["emit_decode"]).sum(axis=0)
    if w.sum() > 0:
        # the pooled gaps themselves, not the times of the steps that emit: a decode waiting out
        # steps it is not in (SGLang's prefill-only steps) has a gap of several steps (the step
        # times gave SGLang an ITL p99 below its ITL mean)
        later, earlier, weight = _itl_gaps(sched)
        ends = xp.concatenate([xp.zeros(1), end])
        itl = _weighted_percentiles(xp, ends[later + 1] - ends[earlier + 1], weight, (50, 90, 99))
        for v, name in zip(itl, ("median", "p90", "p99")):
            summary[f"itl_{name}"] = v
    else:
        for name in ("median", "p90", "p99"):
            summary[f"itl_{name}"] = summary["itl_mean"]
    total_out = float(out_len.sum())
    gpus = sched.settings["gpu_count"]
    summary["output_tps"] = total_out / duration
    summary["output_tps_per_gpu"] = summary["output_tps"] / gpus
    # no TPOT (every request one token long): 0, not infinity
    summary["output_tps_per_user"] = (1.0 / summary["tpot_mean"]) if multi.any() else xp.asarray(0.0)
    summary["requests_per_s"] = out_len.size / duration
    summary["duration"] = duration
    if slo is not None:             # vLLM's request_goodput (check_slo), and the share of requests good
        good = slo_good(m, out_len, slo)
        m["good"] = good
        summary["goodput"] = xp.sum(good) / duration
        summary["slo_attainment"] = xp.sum(good) / max(out_len.size, 1)
    counts = schedule_counts(sched)
    summary.update(counts)
    m["summary"] = summary
    return m


def schedule_counts(sched: Schedule) -> dict:
    """Counts that do not depend on times: resident batch, tokens per step, KV peak, preemptions, steps."""
    s = sched.sums
    steps = max(sched.steps, 1)
    resident = s["resident"].sum(axis=0)
    tokens = s["tokens"].sum(axis=0)
    return {"resident_mean": float(resident.mean()) if sched.steps else 0.0,
            "resident_peak": float(resident.max()) if sched.steps else 0.0,
            "tokens_per_step_mean": float(tokens.sum() / steps),
            "kv_peak_fraction": float(np.max(s["kv_blocks"]) / max(sched.settings["kv_blocks"], 1)) if sched.steps else 0.0,
            "preemptions": int(sched.requests["preemptions"].sum()), "steps": int(sched.steps),
            "gpus": int(sched.settings["gpu_count"]), "iterations": int(sched.iterations)}


# ----------------------------------------------------------------------------- results


@dataclasses.dataclass
class ServingResult:
    """One simulated run. requests: per-request NumPy arrays (arrival, first_token, finish,
    input_len, output_len, ttft, tpot (0 for a one-token request, which the summary's TPOT leaves
    out), e2e, admission, wait, preemptions; seconds / counts;
    ``request_latencies``; with an SLO also good, bool: ``check_slo``). steps: per-step
    arrays (time, end, tokens, resident, prefill_tokens, kv_blocks). summary: see
    ``schedule_metrics``. assumptions: every engine/client setting -> (value, where from)."""
    requests: dict
    steps: dict
    summary: dict
    assumptions: dict
    schedule: Schedule = dataclasses.field(repr=False, default=None)
    estimate: str = "no_overlap"

    def summary_ms(self) -> dict:
        return {k: (v * 1e3 if k.split("_")[0] in ("ttft", "tpot", "itl", "e2e") else v) for k, v in self.summary.items()}


def _read_only(view):
    """A view of a schedule's own rows handed out in a result: read-only, so that editing the
    result cannot change the schedule a later ``price_steps`` prices."""
    view = view.view()
    view.flags.writeable = False
    return view


def _result(sched: Schedule, step_times, estimate, coefficients=None, slo=None):
    dt = np.asarray(step_times)
    met = schedule_metrics(sched, dt, coefficients, slo=slo)
    req = {k: np.asarray(met[k]) for k in ("arrival", "ttft", "tpot", "e2e", "admission", "wait")}
    if slo is not None:
        req["good"] = np.asarray(met["good"])
    req["first_token"] = np.asarray(met["first_token"])
    req["finish"] = np.asarray(met["finish"])
    for k in ("input_len", "output_len", "preemptions", "rank", "first_step", "finish_step", "emits"):
        req[k] = sched.requests[k]
    s = sched.sums
    # over the ranks; one rank's row as it is (a view: a copy of five columns was 1.5 GB at 38 M steps)
    over = {k: _read_only(s[k][0]) if s[k].shape[0] == 1 else s[k].sum(axis=0)
            for k in ("tokens", "resident", "prefill_tokens", "kv_blocks", "preempted")}
    steps = {"time": dt, "end": np.asarray(step_end_times(sched, dt)), **over}
    summary = {k: (float(v) if not isinstance(v, int) else v) for k, v in met["summary"].items()}
    assumptions = dict(sched.assumptions)
    if slo is not None:
        assumptions["slo"] = (", ".join(f"{k} <= {v * 1e3:g} ms" for k, v in slo.items()),
                              "argument (vLLM's --goodput: good = every target met)")
    return ServingResult(requests=req, steps=steps, summary=summary, assumptions=assumptions,
                         schedule=sched, estimate=estimate)


def _check_run(deployment, estimate, temperature, coefficients=None):
    """The arguments every run takes, refused before anything is scheduled or jitted."""
    if not (hasattr(deployment, "plan") and hasattr(deployment, "coefficients") and hasattr(deployment, "scenario")):
        refuse("must be a Deployment (jaxprice.load_deployment(...))", field="deployment",
               value=type(deployment).__name__)
    if coefficients is not None and not (hasattr(coefficients, "values") and hasattr(coefficients, "names")):
        refuse("must be None (the deployment's) or a Coefficients (e.g. deployment.coefficients.replace(...))",
               field="coefficients", value=type(coefficients).__name__)
    if estimate not in ESTIMATES:
        refuse(f"unknown estimate (known: {', '.join(ESTIMATES)})", field="estimate", value=estimate)
    temperature_arg(temperature)          # None, or a finite number >= 0
    if coefficients is not None:
        check_coefficient_set(coefficients, deployment.plan)


# simulate and simulate_sweep run the scheduler in NumPy and return NumPy results: under jax.grad,
# jit or vmap they died in a TracerArrayConversionError from deep inside
UNTRACEABLE = ("returns NumPy results from a scheduler run outside JAX, so it cannot run under jax.grad, jit or "
               "vmap; differentiate a fixed schedule instead: sched = build_schedule(...), then "
               "schedule_metrics(sched, sched.step_times(c), c) (jax.vmap over stacked sets' values for several)")


def _refuse_traced(what, coefficients, temperature):
    for field, x in (("coefficients", getattr(coefficients, "values", None)), ("temperature", temperature)):
        if isinstance(x, jax.core.Tracer):
            refuse(f"is traced: {what} {UNTRACEABLE}", field=field)


def check_coefficient_set(coefficients, plan, *, field="coefficients"):
    """ONE coefficient set (values [names]) for a run, a schedule's steps or its latencies, each
    value the plan reads a finite number >= 0 (``step.check_coefficient_values``, once per set and
    plan): stacked sets [sets, names] died in a broadcasting error from inside the pricing, and a
    NaN priced every step NaN. A traced set's shape is checked, its values pass."""
    from .step import check_coefficient_values
    shape = tuple(getattr(coefficients.values, "shape", np.shape(coefficients.values)))
    if len(shape) != 1:
        refuse(f"stacks {shape[0] if shape else 0} sets: a run prices ONE coefficient set (values [names]); for "
               "several, jax.vmap over the stacked values, e.g. jax.vmap(lambda v: sched.step_times(Coefficients(v, "
               "names)))(sets.values)", field=f"{field}.values", value=shape, has_value=True)
    check_coefficient_values(coefficients, plan)
    if isinstance(coefficients.values, jax.core.Tracer):
        return
    for name in HOST_LATENCIES + tuple(n for n, _ in HOST_TERMS):     # read here, not by the plan
        if name in coefficients:
            v = float(np.asarray(coefficients.values)[coefficients.index(name)])
            if not (math.isfinite(v) and v >= 0):
                refuse("must be a finite number >= 0 (SI units)", field=f"coefs[{name}]", value=v, has_value=True)


def simulate(deployment, workload, client, *, engine=None, estimate="no_overlap", coefficients=None,
             acceptance=None, temperature=None, slo=None, callback=None) -> ServingResult:
    """Simulate one benchmark run: the client's requests through vLLM v1's scheduler, every
    step priced by the kernel (see the module docstring for the model and its assumptions).
    ``slo``: service-level objectives, e.g. {"ttft": 0.5, "tpot": 0.05, "e2el": 10} (seconds, any
    subset; vLLM's ``--goodput`` in seconds): the summary then carries ``goodput`` (requests
    meeting every target per second of the run) and ``slo_attainment`` (their share), and
    ``requests["good"]`` which ones (``check_slo`` has vLLM's definition and its source).
    ``callback(done, total, steps=)``: an open loop's progress (requests finished), after each of its
    scheduler calls (a long run goes in several)."""
    _refuse_traced("simulate", coefficients, temperature)
    _check_run(deployment, estimate, temperature, coefficients)
    slo = check_slo(slo)
    check_callback(callback)
    coefs = deployment.coefficients if coefficients is None else coefficients
    sched = build_schedule(deployment, workload, client, engine=engine, acceptance=acceptance, coefficients=coefs,
                           estimate=estimate, temperature=temperature, callback=callback)
    dt = price_steps(sched, coefs, estimate=estimate, temperature=temperature)
    res = _result(sched, dt, estimate, coefs, slo)
    res.assumptions["estimate"] = (estimate, "argument")
    return res


def simulate_sweep(deployment, workload, concurrencies, *, engine=None, estimate="no_overlap", coefficients=None,
                   num_prompts=None, acceptance=None, temperature=None, callback=None, slo=None) -> list:
    """A closed-loop sweep: one ServingResult per concurrency level, the levels' schedules in
    shared vmapped scheduler calls (``build_schedules``) and their steps priced by one compiled
    kernel (``price_flat``'s chunks, a level at a time). ``engine`` may
    be a dict (all levels) or a callable C -> dict (e.g. max_num_seqs = C, as InferenceX ran).
    Each level once: one given twice is refused, as the CLI's --concurrency refuses it. ``slo``:
    as ``simulate``'s (every level's goodput and SLO attainment against the same targets)."""
    _refuse_traced("simulate_sweep", coefficients, temperature)
    _check_run(deployment, estimate, temperature, coefficients)
    slo = check_slo(slo)
    check_callback(callback)
    coefs = deployment.coefficients if coefficients is None else coefficients
    if isinstance(concurrencies, (str, bytes, Mapping)) or not hasattr(concurrencies, "__iter__"):
        refuse("must be a list of concurrencies, e.g. [1, 2, 4]", field="concurrencies", value=concurrencies,
               has_value=True)
    concs = [int(c) if isinstance(c, (int, np.integer)) and not isinstance(c, bool) else c for c in concurrencies]
    if not concs:
        refuse("give at least one concurrency", field="concurrencies", value=[], has_value=True)
    for c in concs:
        ClosedLoop(c).validate()
    if num_prompts is not None:
        ClosedLoop(1, num_prompts).validate()
        num_prompts = int(num_prompts)
        check_clients_send(ClosedLoop(max(concs), num_prompts))
    items = [(workload, ClosedLoop(c, num_prompts)) for c in concs]
    check_sweep_size([cl.prompts for _, cl in items], "concurrencies", concs if len(concs) <= 8 else
                     f"{len(concs)} levels, {concs[0]} to {concs[-1]}")
    seen = set()
    for c in concs:                 # simulated twice, two identical results (the CLI refuses it too)
        if c in seen:
            refuse("lists this concurrency twice; give each once", field="concurrencies", value=c, has_value=True)
        seen.add(c)
    if callable(engine):
        import inspect
        try:                                  # engine(C) of another arity raised TypeError from inside the call
            inspect.signature(engine).bind(concs[0])
        except TypeError:
            refuse("must be a dict of engine settings or a function engine(C) -> dict of one argument, the "
                   "concurrency", field="engine", value=getattr(engine, "__name__", type(engine).__name__))
        except ValueError:                    # no signature to read (a builtin): called as it is
            pass
        scheds = []
        groups = {}
        for i, c in enumerate(concs):
            got = engine(c)
            if got is not None and not isinstance(got, Mapping):
                refuse("engine(C) must return a dict of engine settings", field="engine",
                       value=type(got).__name__)
            try:        # a setting of an unhashable value (a list) is refused by engine_settings, naming it
                key = tuple(sorted((got or {}).items()))
                hash(key)
            except TypeError:
                engine_settings(deployment, got, acceptance=acceptance)
                raise
            groups.setdefault(key, []).append(i)
        scheds = [None] * len(items)
        for key, ids in groups.items():
            got = build_schedules(deployment, [items[i] for i in ids], engine=dict(key), acceptance=acceptance)
            for i, sc in zip(ids, got):
                scheds[i] = sc
    else:
        scheds = build_schedules(deployment, items, engine=engine, acceptance=acceptance)
    if callback:
        callback(1, 2, stage="scheduled")
    # every level's steps priced in the same compiled chunks, a level at a time (all levels' steps
    # joined first were one more copy of them all: 15 GB for 12 levels of 20,480 requests)
    out = []
    for sc in scheds:
        times = np.asarray(price_flat(deployment.plan, coefs, sc.laws, _flat_columns(sc), estimate=estimate,
                                      temperature=temperature))
        dt = times.reshape(sc.dp, sc.steps).max(axis=0) if sc.steps else np.zeros(0)
        del times
        res = _result(sc, dt, estimate, coefs, slo)
        res.assumptions["estimate"] = (estimate, "argument")
        out.append(res)
    if callback:
        callback(2, 2, stage="priced")
    return out
