"""Size a deployment: the best parallel layout and engine settings for a model, a GPU count and
latency targets (issue 14).

``size(model, chip=, gpus=, isl=, osl=, ttft_ms=, tpot_ms=)`` answers "I have N GPUs of this kind
and this workload: which layout and settings give the most throughput within my TTFT and TPOT
targets, and what does the trade-off look like?" from the cost laws, in four stages:

1. **Candidates** (``candidate_space``, layouts.py): every tensor-parallel width tp and data-parallel width dp
   with tp x dp dividing the GPU count, expert parallelism on and off (MoE models, tp x dp > 1),
   the weight formats the chip and checkpoint allow (``weight_formats``) and the engine settings
   that matter (``max_num_seqs``, ``max_num_batched_tokens``, CUDA-graph mode); ``replicas = GPUs /
   (tp x dp)`` engines serve in aggregate. Each candidate is built WITHOUT a scenario file: a
   ``formats.Scenario`` record (``build_scenario``, the settings the bundled vLLM scenarios use)
   resolved by ``resolve.resolve``. The coefficient sets are the six ``cost-model-*`` sets every
   bundled scenario of testdata/aisimulate lists, for every chip and engine alike
   (``COEFFICIENT_SETS``).
2. **Fit**: a layout is rejected, with its reason, when resolve refuses it or when its weights,
   activations, CUDA graphs and communication buffers leave less KV cache than one maximum-length
   request (``max_model_len`` tokens; the check vLLM makes at start-up). Layouts that resolve to
   the same plan and engine limits (e.g. tp1 x dp8 with and without expert parallelism, which the
   model prices identically) are evaluated once and listed as duplicates.
3. **Evaluation**: each layout under the closed-loop benchmark (InferenceX's: C clients, each
   sending its next request when the last one finished) over a concurrency sweep, giving mean
   TTFT, mean TPOT, output tokens/s per GPU and tokens/s per user (1 / TPOT) at each point.
   Two evaluators (``EVALUATORS``):

   * ``serve``: the serving simulation (``jaxprice.simulate_sweep``, serve.py), step by step.
   * ``steady``: the closed loop's steady state in closed form (``steady_state_requests``): per
     data-parallel rank, R = min(ceil(C / dp), max_num_seqs, KV-cache fit, budget fit) resident
     decodes at mean context isl + osl/2 (KV-cache fit: each holding whole KV blocks over its
     life, ``_held_tokens``; budget fit: R + R isl / osl <= max_num_batched_tokens,
     the step budget prefilling prompts as fast as requests finish), each prompt prefilled in
     chunks of max_num_batched_tokens - R beside them, TPOT = S(R decodes) + p x sum_j
     [S(R decodes + chunk j) - S(R decodes)] + host_output_token, q / n = max(min(L n R / osl,
     1), n R / osl) / n prompts a step for n chunks a prompt (L = dp for an MoE model, whose
     ranks step in lockstep at the slowest rank's pace, else 1); a prompt that fits one step,
     at q > 1 a step, is priced in steps carrying floor(q) or floor(q) + 1 whole prompts mixed to
     q; TTFT = the wait for the step in flight (half of one) and, under async scheduling, the
     step already scheduled (``_vllm_wait``: 1.5 mean steps with another client on the rank,
     none alone) + the prompt's chunk steps + the queueing a
     closed loop of C > R clients implies by Little's law + the request's admission latency (as
     the serving simulation adds it, ``serve.request_latencies``); reported as the benchmark's
     mean over its 10 x C prompts (``num_prompts``), whose first wave (R a rank, sent at once to
     an idle engine) instead waits for ``first_wave``'s back-to-back prefill steps. Priced
     exactly by the step kernel. Against the simulation (experiments/steady_vs_serve.py,
     experiments/results/steady_vs_serve.txt): TPOT and tokens/s per GPU within a few percent,
     TTFT under it (the steady state alone misses the bursts of prompts a step).

   ``auto`` (the default) searches every layout with ``steady``, then re-runs under ``serve``, at
   the benchmark's 10 x C prompts per point, the layouts that matter (``refine``,
   ``simulation_set``): the Pareto frontier, the best and the runner-up, and the layouts that
   meet or come near the targets (within 20 % of them, with a throughput within 20 % of the best
   such; at most ``simulate``, 8, of these beside the frontier); their simulated numbers
   REPLACE the steady ones (``LayoutResult.source`` 'serve', the steady ones kept in
   ``replaced``), and while the frontier or the choice of the updated numbers still holds a
   steady layout, that one is simulated too (at most 32 rounds). The simulated layouts run
   together (``evaluate_serve_many``): their lanes (every concurrency level and dp rank) in
   shared scheduler calls grouped by shape
   (``serve.build_schedules_batched``), each layout's steps priced in one call compiled per plan
   structure (``serve.price_flat``). ``serve`` simulates every layout that way, with
   ``search_prompts`` x C prompts per point (2: the closed loop's cost grows with the prompt
   count), then re-runs at 10 x C as ``auto`` does (the frontier, best, runner-up and at most
   ``simulate`` layouts near the targets, then the frontier until it is all at 10 x C; a
   layout re-run at 10 x C often falls below its 2 x C numbers and lets another 2 x C layout onto
   the frontier, so that takes many rounds).
   Measured (experiments/results/bench.txt, 2026-12-07, 2 cores; DeepSeek-V3, 8 x H200, 192
   layouts x 8 concurrencies, 1k/1k, TTFT 2 s / TPOT 50 ms): ``steady`` 2.5 s cold, 0.8 s warm;
   ``auto`` 26.4 s cold, 7.0 s warm (16 layouts simulated at 10 x C in 4 rounds: 1.95 M steps over
   all dp ranks, 0.38 M scheduler iterations). Earlier, on 2 pinned cores of an otherwise idle
   machine, before later speed-ups: ``serve``: the 2 x C search of all 192 layouts (114
   distinct) 120 s cold, 276 s in all with 43 layouts re-run at 10 x C in 8 rounds (then a
   limit of 8 rounds, since raised to 32), not converged; with 32 rounds (on this project's
   2-core machine, lightly shared) 389 s cold, the search 154 s, 62 layouts re-run at 10 x C in
   18 rounds, converged, to the same best layout as ``auto``. The simulation's TTFT is higher than
   the steady state's at high concurrency, where every client's first request arrives at once.

   Layouts are priced on the deployment axis (stack.py): the layouts of one model structure,
   64 at a time, in ONE call (every batch of every layout: all concurrencies, all chunk steps),
   padded to the structure's largest resident batch, the deployment axis sharded over the
   available devices (``jax.sharding``, as ``sweep.price_sharded`` shards batches), compiled
   once per structure, not per layout (``stacked=False``: one kernel per plan, for comparison).
4. **Output** (``SizeResult``): the Pareto frontier of tokens/s per GPU against tokens/s per user
   over every point of every layout (among the points meeting the TTFT target, when one is set;
   each layout's numbers from the evaluator its ``source`` names, and the CLI's table, the JSON
   and the plot say which),
   the best layout meeting the targets and by how much it beats the next best layout, a table,
   ``as_dict`` (JSON), ``plot`` (frontier, one curve per layout, targets), ``scenario_yaml`` (the
   chosen deployment as a two-document scenario that ``jaxprice price`` loads) and the
   equivalent ``vllm serve`` command line. When no point meets the targets, ``best`` is None and
   ``miss`` names the closest layout and what it misses by.

**Engines** (``engine=``, ``--engine``; layouts.ENGINES): ``vllm`` (the default; everything
above) or ``sglang``. An SGLang search has the same parallel layouts (dp > 1 is SGLang's DP
attention of an MoE model: ``--tp tp x dp --dp dp --enable-dp-attention``; of a dense model, plain
replicas: ``--tp tp --dp dp``), SGLang's
``max_running_requests`` and ``chunked_prefill_size`` on the max_num_seqs and
max_num_batched_tokens axes, no CUDA-graph-mode axis (decode captured, prefill eager:
layouts.SGLANG_GRAPH_MODE), and no max_num_batched_tokens >= max_num_seqs rule. Each candidate's
scenario names ``scheduler: sglang``: the ``serve`` evaluator (and ``auto``'s re-runs) simulate
SGLang's scheduler, and the written scenario runs it under ``jaxprice serve``. The ``steady``
evaluator's closed form is ``sglang_steady_state_requests``: reservation to completion bounds R by
the KV cache at full length isl + osl and not by a token budget; a step carries prompts only or
decodes only, so TPOT = D(R) + p x [mixed prefill-only step] + (1 + p) host_output_token for
p prefill steps per decode step (q = R / osl prompts, m = q / (1 - e^-q) of them a step when a
prompt fits the chunk), the dp ranks of an MoE model in lockstep, and the TTFT waits half the
(time-weighted) step in flight and the step already scheduled. Agreement with the simulation:
README ("Sizing SGLang") and experiments/results/steady_vs_serve.txt. Output: the
``python -m sglang.launch_server`` line (launch.py: ``launch_command``, ``sglang_command``) in place of
``vllm serve``'s; ``as_dict`` says the engine.

**Speculative decoding** (``spec_tokens=``, ``--spec-tokens``; ``acceptance=``, ``--acceptance``):
a draft count k per layout (``Layout.spec_tokens``, innermost axis; 0 = off, the default, its
layouts and outputs unchanged), searched only for a model graph with a drafter (its MTP layers,
``graph.speculator``) and vLLM engines. A candidate's scenario states ``engine.speculative``
{num_spec_tokens: k, method: the graph's}, so the plan prices the drafter's passes and a uniform
decode width of 1 + k. The steady state schedules 1 + k tokens per decode row (priced as decodes:
threshold max(8, 1 + k)), counts them in the budget, holds k lookahead KV slots per request and
takes a request to finish in osl / a steps, a = the acceptance (mean tokens emitted per decode
row and step, ``Layout.tokens_per_step``: an ASSUMPTION, default serve.default_acceptance(k),
1.7, 2.19, 2.53 for k = 1, 2, 3; a given one is capped at 1 + k for each k), so TPOT = the
step mix / a + host_output_token; the serving simulation runs at the same acceptance (as ``jaxprice
serve --acceptance``). Outputs: labels ``... mtp2``, ``info['speculation']`` (the assumption),
``--speculative-config`` in the vLLM line (SGLang's EAGLE flags in its line; SGLang's closed form
refuses k > 0).

Library code: no printing; progress goes through ``callback(done, total, **info)``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path

import jax
import numpy as np

from .client import MAX_RUN_REQUESTS, MAX_SWEEP_REQUESTS, Workload
from .errors import JaxpriceError, check_callback, refuse, shown
from .formats import DTYPE_BYTES, ModelGraph, Registry, check_registry, coefficient_set_files
from .layouts import (COEFFICIENT_SETS, DEFAULT_BATCHED_TOKENS, DEFAULT_GRAPH_MODES, DEFAULT_MAX_NUM_SEQS, ENGINES,
                      WIDTHS, Candidate, Layout, build_candidates, build_scenario,
                      candidate_space, fits, is_moe, load_model, max_model_len, _kv_tokens)
from .launch import hybrid_block_of, launch_command, scenario_document, vllm_command
from .plan import INT_TOKEN_LIMIT, Batch, _as_checked, _unchecked_batch, _whole
from .resolve import Deployment, resolve
from .schema import TOKEN_WHY, WIDTH_LIMIT

DEFAULT_CONCURRENCY = (1, 4, 16, 64, 128, 256, 512, 1024)
DEFAULT_SIMULATE = 8           # 'auto': layouts near the targets re-run under the serving simulation beside
#                                the frontier, best and runner-up (always re-run), at most
DEFAULT_SEARCH_PROMPTS = 2     # 'serve': prompts per client of the search over every layout (then 10 x C)
EVALUATORS = ("auto", "serve", "steady")
# Input caps, refused in one line before anything is resolved or priced:
MAX_GPUS = 1 << 20             # GPUs a search sizes for (replicas of one engine layout)
MAX_CONCURRENCY = MAX_RUN_REQUESTS // 10   # clients per engine: the simulation's 10 x C prompts per point within
#                                its cap on one run (as `jaxprice serve --concurrency`); the steady state too
MAX_LEVELS = 64                # concurrency levels per search (every level of every layout is priced)
MAX_SEARCH_REQUESTS = 1 << 22  # requests the serving simulation may run in one search, all layouts together:
#                                the default serve search of DeepSeek-V3 on 8 GPUs runs ~0.8 M (minutes); past
#                                4 M it runs for hours and its shared scheduler calls hold many GB
DECODE_THRESHOLD = 8
MAX_SPEC_TOKENS = 15           # draft tokens per decode step a search takes (vLLM's MTP recipes use 1-3)


# ----------------------------------------------------------------------------- evaluation


@dataclasses.dataclass(frozen=True)
class SizeWorkload:
    """Request lengths: uniform integers on [floor(range_ratio * L), L] (InferenceX's semantics)."""
    isl: int
    osl: int
    range_ratio: float = 0.8
    seed: int = 0

    # the shortest length is at least one token, as the serving simulation's client draws them
    # (client.Workload: max(int(L x range_ratio), 1))
    @property
    def mean_isl(self) -> float:
        return (max(math.floor(self.range_ratio * self.isl), 1) + self.isl) / 2.0

    @property
    def mean_osl(self) -> float:
        return (max(math.floor(self.range_ratio * self.osl), 1) + self.osl) / 2.0


@dataclasses.dataclass
class LayoutResult:
    """One evaluated layout: per concurrency (``concurrency``: clients per engine) mean TTFT and
    TPOT (seconds), output tokens/s per GPU and per user (1 / TPOT), resident decodes per rank."""
    index: int                     # into SizeResult.candidates
    layout: Layout
    replicas: int
    concurrency: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    tps_per_gpu: np.ndarray
    tps_per_user: np.ndarray
    resident: np.ndarray
    source: str = "steady"         # where the numbers come from: 'steady', 'serve' (10 x C prompts) or
    #                                'serve (k x C prompts)' / 'serve (n prompts)'
    replaced: dict | None = None   # the numbers the simulation replaced (source, ttft, tpot, tps_per_gpu)
    kept: np.ndarray | None = None  # [points] bool: points the simulation left on ``replaced['source']``'s
    #                                 numbers (their TTFT missed the target by more than SKIP_TTFT_FACTOR)
    simulated_as: str | None = None  # the twin whose simulation stands in for this layout's (refine)

    def point_source(self, j: int) -> str:
        """Where point j's numbers come from (``source``, or the replaced evaluator's for a kept point)."""
        return self.replaced["source"] if self.kept is not None and self.kept[j] else self.source

    def as_dict(self) -> dict:
        out = {"layout": self.layout.as_dict(), "label": self.layout.label, "replicas": self.replicas,
               "source": self.source}
        if self.simulated_as is not None:
            out["simulated_as"] = self.simulated_as
        if self.replaced is not None:
            out["replaced"] = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in self.replaced.items()}
        return out | {
                "points": [{"concurrency_per_engine": int(c), "concurrency_total": int(c) * self.replicas,
                            "ttft_ms": float(a) * 1e3, "tpot_ms": float(b) * 1e3,
                            "tokens_per_s_per_gpu": float(g), "tokens_per_s_per_user": float(u),
                            "resident_per_rank": int(r), "source": self.point_source(j)}
                           for j, (c, a, b, g, u, r) in enumerate(zip(self.concurrency, self.ttft, self.tpot,
                                                                      self.tps_per_gpu, self.tps_per_user,
                                                                      self.resident))]}

    def replace_numbers(self, out, source: str, points=None) -> None:
        """Take another evaluator's numbers (``evaluate_serve``'s tuple), keeping the old ones in
        ``replaced``. points: [points] bool, the points ``out`` holds (default all); the others
        keep their numbers and are marked in ``kept``."""
        if self.replaced is None:
            self.replaced = {"source": self.source, "ttft": self.ttft, "tpot": self.tpot,
                             "tps_per_gpu": self.tps_per_gpu}
        sel = np.ones(len(self.concurrency), bool) if points is None else np.asarray(points, bool)
        ttft, tpot, per_gpu, per_user, resident, _steps = out

        def merged(old, new, dtype=float):
            x = np.array(old, dtype=dtype)
            x[sel] = np.asarray(new, dtype=dtype)
            return x
        self.ttft, self.tpot = merged(self.ttft, ttft), merged(self.tpot, tpot)
        self.tps_per_gpu, self.tps_per_user = merged(self.tps_per_gpu, per_gpu), merged(self.tps_per_user, per_user)
        self.resident = merged(self.resident, resident, np.asarray(self.resident).dtype)
        # points an earlier call of the same source replaced stay replaced (refine's twin points)
        before = ~self.kept if (self.source == source and self.kept is not None) else np.zeros_like(sel)
        self.kept = None if (sel | before).all() else ~(sel | before)
        self.source = source


def _rows(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _spec_rows(specs) -> int:
    """Rows to pad the steady batches of ``specs`` to: the longest batch's, less its one prefill
    row, rounded up to a power of two, plus one (R decodes and a chunk: the padding of R)."""
    return _rows(max(len(b[0]) for spec in specs for b in spec[1]) - 1) + 1


def _held_tokens(workload: SizeWorkload, block: int, lookahead: int = 0) -> float:
    """A resident request's KV-cache tokens in whole blocks, averaged over its life: block x
    ceil(L / block) over contexts L uniform on [isl + 1, isl + osl] (64 points)  [tokens]. About
    the mean context + block / 2 for small blocks; a hybrid model's blocks of thousands of tokens
    (resolve.hybrid_block_size) hold a short request in one. ``lookahead``: the k slots a
    speculating request holds beyond its context (its drafts)."""
    lengths = np.linspace(workload.mean_isl + 1.0, workload.mean_isl + max(workload.mean_osl, 1.0), 64)
    if lookahead:
        lengths = lengths + float(lookahead)
    return float(np.mean(block * np.ceil(lengths / block)))


def _chunk_rate(R: int, osl: float, n_chunks: int, lockstep: int) -> float:
    """Prompt chunks the priced step carries, per step: each rank finishes R / osl requests a
    step (a closed loop refills each at once), each prompt n_chunks chunks; ranks that step in
    lockstep (an MoE model's, serving-reference.md 2.2) take the slowest rank's time, so below
    one chunk a step some rank carries one lockstep times as often:
    max(min(lockstep n R / osl, 1), n R / osl)."""
    q = n_chunks * R / osl
    return max(min(lockstep * q, 1.0), q)


def _lengths(workload: SizeWorkload) -> tuple[int, float, int]:
    """(isl, osl, mean resident context isl + osl / 2) of the workload's mean lengths [tokens]."""
    return (max(int(round(workload.mean_isl)), 1), max(workload.mean_osl, 1.0),
            int(round(workload.mean_isl + workload.mean_osl / 2.0)))


def _prompt_chunks(isl: int, room: int) -> list:
    """(tokens, tokens computed before) of each chunk a prompt of isl tokens is prefilled in,
    at most ``room`` tokens a step."""
    return [(min(room, isl - done), done) for done in range(0, isl, room)]


def _lockstep(dep: Deployment, layout: Layout) -> int:
    """dp for an MoE model's data-parallel ranks, which step together (serving-reference.md
    2.2), else 1."""
    return layout.dp if (layout.dp > 1 and dep.plan.scalars.get("has_moe")) else 1


def _budget_requests(budget: int, isl: int, osl: float, spec_tokens: int = 0, acceptance: float = 1.0) -> int:
    """The resident requests per rank whose prompts the step budget can prefill as fast as they
    finish: R + R isl / osl <= max_num_batched_tokens (R decode tokens and the prefill tokens of
    R / osl prompts a step), so R <= budget osl / (isl + osl). Speculating (k = spec_tokens > 0):
    each decode row schedules 1 + k tokens and a request finishes in osl / acceptance steps, so
    R (1 + k) + R acceptance isl / osl <= budget."""
    if spec_tokens:
        return max(1, int(budget // ((1 + spec_tokens) + acceptance * isl / osl)))
    return max(1, int(budget * osl // (isl + osl)))


def steady_state_requests(dep: Deployment, layout: Layout, workload: SizeWorkload, concurrency: int):
    """The batches one closed-loop point is priced from (see the module docstring): returns
    (R, batches as (scheduled, computed) row lists, TPOT weights, TTFT weights, n_chunks);
    TPOT - host_output_token = sum_k tpot_w[k] S_k and the prompt's service time
    sum_k ttft_w[k] S_k (its prefill steps; the wait before them is ``_steady_metrics``').

    q = _chunk_rate prompt chunks a step. Up to one a step (q <= 1): a fraction q / n
    of steps carries each chunk beside the R decodes. A prompt that fits one step's room and more
    than one a step (short outputs, many residents): steps carry k = floor(q) or k + 1 whole
    prompts, mixed to q (the last one cut to the room, its weight raised to keep the tokens).
    Chunked prompts at more than one chunk a step: each chunk's marginal cost,
    S(decodes + chunk) - S(decodes), q / n times a step (the decode-only weight 1 - q < 0).

    Speculative decoding (``layout.spec_tokens`` = k > 0, ``layout.tokens_per_step`` = a, the
    assumed acceptance): each decode row schedules 1 + k tokens (the drafts verified) and emits a
    tokens a step, so a request finishes in osl / a steps (the chunk rate q and the budget fit
    take osl / a), the budget counts 1 + k tokens a decode row, and each request holds k more
    KV slots (its lookahead); ``_steady_metrics`` divides the step time by a for the TPOT."""
    isl, osl, ctx = _lengths(workload)
    k, accepted = int(layout.spec_tokens), layout.tokens_per_step
    per_rank = math.ceil(concurrency / layout.dp)
    held = _held_tokens(workload, int(dep.plan.memory.get("block_size", 16)), k)
    cap = _kv_tokens(dep, held)
    kv_fit = int(cap // held) if math.isfinite(cap) else per_rank
    budget_fit = _budget_requests(layout.max_num_batched_tokens, isl, osl, k, accepted)
    R = max(1, min(per_rank, layout.max_num_seqs, kv_fit, budget_fit))
    room = max(layout.max_num_batched_tokens - R * (1 + k), 1)
    chunks = _prompt_chunks(isl, room)
    decode = ([1 + k] * R, [ctx - 1] * R)
    q = _chunk_rate(R, osl / accepted if k else osl, len(chunks), _lockstep(dep, layout))
    if q > 1.0 and len(chunks) == 1:
        return (R, *_packed_prompts(decode, q, isl, room), 1)
    batches = [decode] + [([1 + k] * R + [n], [ctx - 1] * R + [d]) for n, d in chunks]
    a = q / len(chunks)
    tpot_w = [1.0 - q] + [a] * len(chunks)
    ttft_w = [0.0] + [1.0] * len(chunks)
    return R, batches, tpot_w, ttft_w, len(chunks)


def _packed_prompts(decode, q: float, isl: int, room: int):
    """(batches, TPOT weights, TTFT weights) of steps carrying q > 1 whole prompts of isl tokens
    on average beside the decodes: k = floor(q) prompts (weight 1 - f) and k + 1 (weight f), the
    (k + 1)-th cut to the room left, f chosen so the prompt tokens average q isl a step; the
    prompt's own step is one of these, in the same mix."""
    k = int(q)
    last = min(isl, room - k * isl)
    f = min((q - k) * isl / last, 1.0) if last > 0 else 0.0
    s, c = decode
    whole = (s + [isl] * k, c + [0] * k)
    if f == 0.0:
        return [decode, whole], [0.0, 1.0], [0.0, 1.0]
    more = (whole[0] + [last], whole[1] + [0])
    if f == 1.0:
        return [decode, more], [0.0, 1.0], [0.0, 1.0]
    return [decode, whole, more], [0.0, 1.0 - f, f], [0.0, 1.0 - f, f]


def sglang_steady_state_requests(dep: Deployment, layout: Layout, workload: SizeWorkload, concurrency: int):
    """The batches one closed-loop point of an SGLang layout is priced from: returns
    (R, batches as (scheduled, computed) row lists, TPOT weights, TTFT weights, n_chunks,
    emitting steps per output token), as ``steady_state_requests`` plus the last; TPOT =
    sum_k tpot_w[k] S_k + h host_output_token and the prompt's service time sum_k ttft_w[k] S_k.

    SGLang (serve.py's ``scheduler: sglang``, serving-reference.md 6) differs from vLLM in two
    ways the closed form follows. Reservation to completion: a request is admitted only if its
    blocks at full length fit beside every running request's, so per rank
    R = min(ceil(C / dp), max_running_requests, (floor(cap / block) - 1) // ceil((isl + osl) / block))
    at the mean lengths (cap: the KV tokens of a rank, ``_kv_tokens`` at the mean context
    ctx = isl + osl / 2, as the simulation sizes it), with no token-budget bound: prefill steps
    stall the decodes instead. Prefill first: a step carries prompts only (up to
    chunked_prefill_size tokens), or else every decode row, so the R decodes at context ctx, D,
    run in steps of their own and each rank's R / osl = q prompts per decode step are prefilled
    in prefill-only steps that add their whole time to the TPOT (not a chunk's marginal cost
    beside the decodes):

    * a prompt that fits the chunk (isl <= chunk): a prefill step carries the prompts that came
      since the last one, m = min(q / (1 - exp(-q)), floor(chunk / isl)) on average (at least one;
      arrivals taken as Poisson over a decode step: m = E[N | N >= 1]), so p = q / m prefill
      steps a decode step, mixed of k = floor(m) prompts (weight 1 - f) and k + 1 (weight f),
      f = m - k. TPOT = D + p [(1 - f) P_k + f P_k+1] + (1 + p) host_output_token (a prefill step
      emits the first tokens);
    * a longer prompt, n = ceil(isl / chunk) chunks, each a step of its own (p = n q steps):
      TPOT = D + q sum_j P_chunk j + (1 + q) host_output_token.

    An MoE model's dp ranks step in lockstep at the slowest rank's pace (serving-reference.md 2.2),
    so a rank's decode step is a prefill step's length whenever some other rank prefills then:
    with phi = p / (1 + p) of each rank's steps prefilling, independently, with probability
    pi = 1 - (1 - phi)^(dp - 1); the decode weight is 1 - pi and pi moves onto the prefill
    steps, in their mix. TTFT: the rest of the step in flight when the prompt comes (half of it,
    as the simulation's arrival_phase; which step that is goes by time, so its mean length is
    sum_k w_k S_k^2 / sum_k w_k S_k over the TPOT weights w: a long prefill step is more often
    in flight than a decode step; ``_steady_metrics`` adds it), then the step already scheduled
    (SGLang's overlap loop, as vLLM's async scheduling: a finished request's slot, and its
    client's next request, serve the step after next; a step by count, weights w / sum w), then
    the prompt's own prefill step(s) (the mix weighted by prompts: (1 - f) k / m,
    f (k + 1) / m), plus the queueing and admission latency of the module docstring.
    Checked against the simulation (experiments/steady_vs_serve.py). Speculative decoding is
    refused (``layout.spec_tokens`` > 0): SGLang's EAGLE schedule is not in this closed form."""
    if layout.spec_tokens:
        refuse("SGLang's steady state does not price speculative decoding (EAGLE); size vLLM engines with "
               "--spec-tokens", field="spec_tokens", value=layout.spec_tokens)
    isl, osl, ctx = _lengths(workload)
    full = max(workload.mean_isl + workload.mean_osl, 1.0)
    per_rank = math.ceil(concurrency / layout.dp)
    cap = _kv_tokens(dep, ctx)
    block = int(dep.plan.memory.get("block_size", 16))
    kv_fit = (int((math.floor(cap / block) - 1) // math.ceil(full / block)) if math.isfinite(cap) else per_rank)
    R = max(1, min(per_rank, layout.max_num_seqs, kv_fit))
    chunk = max(int(layout.max_num_batched_tokens), 1)
    decode = ([1] * R, [ctx - 1] * R)
    q = R / osl
    if isl <= chunk:
        m = min(q / -math.expm1(-q), float(chunk // isl))
        k = int(m)
        f = m - k
        steps = [([isl] * k, [0] * k)] + ([([isl] * (k + 1), [0] * (k + 1))] if f > 0 else [])
        share = [1.0 - f] + ([f] if f > 0 else [])            # of the prefill steps
        own = [(1.0 - f) * k / m] + ([f * (k + 1) / m] if f > 0 else [])   # of the prompts
        p, emitting, n_chunks = q / m, q / m, 1
    else:
        steps = [([n], [d]) for n, d in _prompt_chunks(isl, chunk)]
        n_chunks = len(steps)
        share = [1.0 / n_chunks] * n_chunks
        own = [1.0] * n_chunks
        p, emitting = n_chunks * q, q
    lockstep = _lockstep(dep, layout)
    phi = p / (1.0 + p)
    pi = 1.0 - (1.0 - phi) ** (lockstep - 1)
    tpot_w = [1.0 - pi] + [(p + pi) * w for w in share]
    per_step = [w / sum(tpot_w) for w in tpot_w]          # the step already scheduled
    ttft_w = [per_step[0]] + [o + w for o, w in zip(own, per_step[1:])]
    return R, [decode] + steps, tpot_w, ttft_w, n_chunks, 1.0 + emitting


@functools.lru_cache(maxsize=None)
def _pricer(mesh, estimate="no_overlap"):
    from .accuracy import FAST_COMPILE
    from .step import _step_time

    def run(plan, coefs, batches):
        return getattr(jax.vmap(lambda b: _step_time(plan, coefs, b, None, False))(batches), estimate)
    if mesh is None:
        return jax.jit(run, static_argnames=("plan",), compiler_options=FAST_COMPILE)
    from jax.sharding import NamedSharding, PartitionSpec
    spec = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
    return jax.jit(run, static_argnames=("plan",), out_shardings=spec, compiler_options=FAST_COMPILE)


def price_batches(dep: Deployment, batches: Batch, mesh=None, estimate: str = "no_overlap") -> np.ndarray:
    """Step estimates (``no_overlap`` or ``overlap``) of stacked batches in one vmapped call, the
    batch axis sharded over ``mesh`` (a 1-D jax.sharding.Mesh; None: one device)."""
    if estimate not in ("no_overlap", "overlap"):
        refuse("unknown estimate (known: no_overlap, overlap)", field="estimate", value=estimate)
    if mesh is None or mesh.size == 1:
        return np.asarray(_pricer(None, estimate)(dep.plan, dep.coefficients, batches))
    from jax.sharding import NamedSharding, PartitionSpec
    from .plan import Coefficients
    from .sweep import _global, shard_batches
    sharded, n = shard_batches(batches, mesh)
    rep = NamedSharding(mesh, PartitionSpec())
    coefs = dep.coefficients
    coefs = Coefficients(_global(np.asarray(coefs.values), rep), coefs.names, coefs.units, coefs.cites)
    return np.asarray(_pricer(mesh, estimate)(dep.plan, coefs, sharded))[:n]


def decode_threshold(layout: Layout) -> int:
    """The decode threshold the steady batches of a layout are priced at: 8, or 1 + k where a
    speculating layout's decode rows schedule more (a row of 1 + k tokens is a decode)."""
    return max(DECODE_THRESHOLD, 1 + int(layout.spec_tokens))


def stack_rows(requests, rows: int, threshold: int = DECODE_THRESHOLD) -> Batch:
    """Stacked float64 batches [len(requests), rows] from (scheduled, computed) row lists (non-negative
    integers, built here), prompt_len = computed + scheduled, padded, decode threshold 8 (a
    speculating layout's: ``decode_threshold``): the batches ``Batch.from_requests`` builds one
    by one, in one NumPy pass."""
    import jax.numpy as jnp
    n = len(requests)
    sched, comp = np.zeros((n, rows)), np.zeros((n, rows))
    mask = np.zeros((n, rows), dtype=bool)
    for i, (s, c) in enumerate(requests):
        sched[i, :len(s)] = s
        comp[i, :len(c)] = c
        mask[i, :len(s)] = True
    return Batch(jnp.asarray(sched), jnp.asarray(comp), jnp.asarray(comp + sched), jnp.asarray(mask),
                 jnp.full((n,), float(threshold)))


PROMPTS_PER_CLIENT = 10     # the benchmark's prompts per point: 10 x C (serving-reference §5)


def first_wave(layout: Layout, workload: SizeWorkload, R: int):
    """(batch, mean steps) of the closed loop's first wave on one rank: its first R clients'
    prompts arrive at once on an idle engine and are prefilled back to back, max_num_batched_tokens
    (SGLang: the chunk) a step, so the i-th (1-based) has its first token after ceil(i isl / B)
    steps, each priced as the first: min(B, R isl) prompt tokens in whole prompts (the last cut),
    nothing computed yet. Mean steps over the R prompts."""
    isl = max(int(round(workload.mean_isl)), 1)
    budget = max(int(layout.max_num_batched_tokens), 1)
    k, rest = divmod(min(budget, R * isl), isl)
    batch = ([isl] * k + [rest] * (rest > 0), [0] * (k + (rest > 0)))
    return batch, float(np.mean(np.ceil(np.arange(1, R + 1) * isl / budget)))


def _steady_batches(dep: Deployment, layout: Layout, workload: SizeWorkload, concurrencies):
    """(specs, owners, flat): the steady-state point specs, per batch (point, TPOT weight, TTFT
    weight, first-wave weight), and the flat list of (scheduled, computed) batches (see
    steady_state_requests; each point's first-wave step last, ``first_wave``)."""
    closed_form = sglang_steady_state_requests if layout.engine == "sglang" else steady_state_requests
    specs = [closed_form(dep, layout, workload, c) for c in concurrencies]
    owners = [(j, spec[2][k], spec[3][k], 0.0) for j, spec in enumerate(specs) for k in range(len(spec[1]))]
    flat = [b for spec in specs for b in spec[1]]
    for j, spec in enumerate(specs):
        batch, steps = first_wave(layout, workload, spec[0])
        owners.append((j, 0.0, 0.0, steps))
        flat.append(batch)
    return specs, owners, flat


def admission_latency(coefficients, mean_isl) -> float:
    """Mean per-request admission latency (s) of requests of ``mean_isl`` prompt tokens, as the
    serving simulation charges it to TTFT (serve.request_latencies: host_admission_per_request +
    host_admission_per_token x prompt tokens; 0 where the coefficients carry none)."""
    get = lambda n: float(coefficients[n]) if n in coefficients else 0.0  # noqa: E731
    return get("host_admission_per_request") + get("host_admission_per_token") * float(mean_isl)


def _vllm_wait(dep: Deployment, layout: Layout, mean_step, per_rank) -> np.ndarray:
    """vLLM's wait before a prompt's first step, per point  [s]: with another client on its rank
    the request lands in a step in flight and waits for the rest of it (half a step; the
    simulation's arrival_phase), and under async scheduling (vLLM's default) for the step already
    scheduled without it, (1/2 + 1) x the mean step (by count, ``mean_step``) in all; none with
    one client a rank (the engine is idle: serve.request_latencies). 0 for SGLang (its closed
    form's TTFT weights hold its waits)."""
    if layout.engine != "vllm":
        return np.zeros_like(per_rank)
    async_on = bool(dep.scenario.engine.get("async_scheduling", True))
    return np.where(per_rank >= 2.0, (0.5 + async_on) * mean_step, 0.0)


def _steady_metrics(dep: Deployment, layout: Layout, workload: SizeWorkload, concurrencies, specs, owners, est,
                    num_prompts=None):
    """The closed loop's metrics from the priced batches ``est`` (see the module docstring);
    TTFT the mean over ``num_prompts`` prompts a point (None: the benchmark's 10 x C; inf: the
    steady state alone)."""
    hot = float(dep.coefficients["host_output_token"]) if "host_output_token" in dep.coefficients else 0.0
    n = len(concurrencies)
    tpot, service, first = np.full(n, hot), np.zeros(n), np.zeros(n)
    sglang = layout.engine == "sglang"
    for j, spec in enumerate(specs):      # SGLang's: its prefill steps emit tokens too
        if sglang:
            tpot[j] = hot * spec[5]
    in_flight = np.zeros((n, 2))           # SGLang's: sum w S^2, sum w S over the TPOT weights
    # speculating (k > 0): a decode step emits ``tokens_per_step`` tokens a request, the TPOT its step / that
    accept = layout.tokens_per_step if layout.spec_tokens else None
    step = np.zeros(n)
    for (j, tw, fw, ww), s in zip(owners, est):
        if accept is None:
            tpot[j] += tw * s
        else:
            step[j] += tw * s
        service[j] += fw * s
        first[j] += ww * s
        if sglang:
            in_flight[j] += (tw * s * s, tw * s)
    if accept is not None:
        tpot += step / accept
    busy_steps = in_flight[:, 1] > 0              # half the step in flight, its length weighted by time
    service[busy_steps] += 0.5 * in_flight[busy_steps, 0] / in_flight[busy_steps, 1]
    osl = max(workload.mean_osl, 1.0)
    conc = np.asarray(concurrencies, dtype=float)
    R = np.array([s[0] for s in specs], dtype=float)
    per_rank = conc / layout.dp
    service += _vllm_wait(dep, layout, tpot - hot if accept is None else step, per_rank)
    busy = np.minimum(per_rank, R)                  # resident requests per rank (fractional below dp)
    ttft_s = service + hot
    request = ttft_s + (osl - 1.0) * tpot            # one request's service time, resident
    cycle = np.maximum(per_rank / busy, 1.0) * request  # closed loop: C clients share R slots
    # plus each request's admission latency, which the serving simulation adds to its TTFT
    # (serve.request_latencies) and which delays that request only, not the engine's steps (so
    # not the cycle); it was left out here (the steady TTFT 40 ms under the simulation's)
    admission = admission_latency(dep.coefficients, workload.mean_isl)
    ttft = cycle - (osl - 1.0) * tpot + admission
    # the benchmark's mean over its prompts: the first wave's (busy per rank, on an idle engine)
    # take `first_wave`'s back-to-back prefill steps instead (the 10 x C means were 1.7-2.8 x the
    # steady state's at C = 64-256: Llama-3.1-8B on an H100, 1k/1k and 1k/128)
    prompts = PROMPTS_PER_CLIENT * conc if num_prompts is None else np.full(n, float(num_prompts))
    share = np.minimum(busy * layout.dp / prompts, 1.0)
    ttft = share * (first + hot + admission) + (1.0 - share) * ttft
    tps_engine = layout.dp * per_rank * osl / cycle
    return ttft, tpot, tps_engine / layout.width, 1.0 / tpot, R.astype(int), len(owners)


def evaluate_steady(dep: Deployment, layout: Layout, workload: SizeWorkload, concurrencies, *, mesh=None,
                    estimate: str = "no_overlap", rows: int | None = None, shapes: set | None = None,
                    num_prompts=None):
    """The ``steady`` evaluator for one layout: (ttft, tpot, tps_per_gpu, tps_per_user, resident,
    steps priced), arrays over ``concurrencies`` (clients per engine). One plan, its own kernel
    (``evaluate_steady_many`` prices many layouts in one kernel per model structure)."""
    specs, owners, flat = _steady_batches(dep, layout, workload, concurrencies)
    rows = max(rows or 0, _spec_rows(specs))
    flat += [([], [])] * (_rows(len(flat)) - len(flat))    # empty batches: one shape for many layouts
    if shapes is not None:
        shapes.add((dep.plan.digest, len(flat), rows, estimate))
    est = price_batches(dep, stack_rows(flat, rows, decode_threshold(layout)), mesh, estimate)
    return _steady_metrics(dep, layout, workload, concurrencies, specs, owners, est, num_prompts)


def _shard_leading(x, mesh):
    """A host array laid out over a 1-D mesh along its leading axis (a multiple of the mesh size)."""
    from jax.sharding import NamedSharding, PartitionSpec
    from .sweep import _global
    return _global(np.asarray(x), NamedSharding(mesh, PartitionSpec(mesh.axis_names[0])))


def evaluate_steady_many(deps, layouts, workload: SizeWorkload, concurrencies, *, mesh=None,
                         estimate: str = "no_overlap", rows_cap: int | None = None, group_size: int = 64,
                         callback=None, num_prompts=None) -> list:
    """The ``steady`` evaluator over many layouts at once: the deployment axis (stack.py). Layouts
    of one model structure are stacked, ``group_size`` at a time (padded to a power of two with
    copies of the last; rows padded to the structure's largest), and priced in ONE call each,
    the deployment axis sharded over ``mesh`` (a 1-D jax.sharding.Mesh; None: one device): one
    compile per structure and group shape, not per layout. Returns ``evaluate_steady``'s tuple per layout, equal
    to it bit for bit in exact mode. callback(done, total): layouts priced so far."""
    from . import stack as ST
    from .plan import Coefficients
    n = len(deps)
    prepared = [_steady_batches(d, lay, workload, concurrencies) for d, lay in zip(deps, layouts)]
    rows = []
    for (specs, _o, _f), lay in zip(prepared, layouts):
        r = _spec_rows(specs)
        if rows_cap is not None:
            r = max(r, _rows(min(math.ceil(max(concurrencies) / lay.dp), rows_cap)) + 1)
        rows.append(r)
    nb = _rows(max(len(f) for _s, _o, f in prepared))
    # one row padding per model structure, its layouts' largest: padded rows price to exactly
    # zero, and a padding's compile (1.6-2 s on 2 cores) costs more than pricing every group at
    # the largest (DeepSeek-V3 on 8 H200, max_num_seqs 128-1024: four compiles became one, the
    # warm pricing 0.07 -> 0.16 s)
    groups: dict = {}
    for structure, idx in ST.group_by_structure(deps):
        groups[(structure, max(rows[i] for i in idx))] = list(idx)
    out, done = [None] * n, 0
    for (_structure, r), idx in groups.items():
        for g0 in range(0, len(idx), group_size):
            part = idx[g0:g0 + group_size]
            D = _rows(len(part))
            if mesh is not None and mesh.size > 1:
                D = max(D, mesh.size)
                D += (-D) % mesh.size
            full = part + [part[-1]] * (D - len(part))
            stackp = ST.stack_plans([deps[i] for i in full])
            coefs = ST.stack_coefficients([deps[i].coefficients for i in full])
            b = [stack_rows(prepared[i][2] + [([], [])] * (nb - len(prepared[i][2])), r, decode_threshold(layouts[i]))
                 for i in full]
            # stack_rows' Batch() checked these rows: stacked as they are, not checked again (4 ms a group)
            batches = _unchecked_batch(*(np.stack([np.asarray(getattr(x, f)) for x in b]) for f in
                                         ("scheduled", "computed", "prompt_len", "mask", "decode_threshold")),
                                       checked=True)
            if mesh is not None and mesh.size > 1:
                stackp = ST.PlanStack(stackp.structure, _shard_leading(stackp.values, mesh), stackp.slot_names,
                                      stackp.names)
                coefs = Coefficients(_shard_leading(coefs.values, mesh), coefs.names, coefs.units, coefs.cites)
                batches = jax.tree_util.tree_map(lambda x: _shard_leading(x, mesh), batches)
            else:
                batches = jax.tree_util.tree_map(jax.numpy.asarray, batches)
            res = ST.price_deployments(stackp, coefs, _as_checked(batches))     # stack_rows checked them
            est = np.asarray(getattr(res, estimate))
            for k, i in enumerate(part):
                specs, owners, _flat = prepared[i]
                out[i] = _steady_metrics(deps[i], layouts[i], workload, concurrencies, specs, owners, est[k],
                                         num_prompts)
            done += len(part)
            if callback is not None:
                callback(done, n)
    return out


def verify_point(cand: Candidate, res: LayoutResult, j: int, workload: SizeWorkload, ttft_t, tpot_t, *,
                 num_prompts=None) -> dict:
    """One chosen point of the steady evaluator re-run under the serving simulation (serve.py):
    both estimates side by side, and whether the simulated point still meets the targets."""
    c = int(res.concurrency[j])
    out = {"label": res.layout.label, "concurrency_per_engine": c,
           "steady": {"ttft_ms": float(res.ttft[j]) * 1e3, "tpot_ms": float(res.tpot[j]) * 1e3,
                      "tokens_per_s_per_gpu": float(res.tps_per_gpu[j])}}
    try:
        ttft, tpot, per_gpu, _u, _r, steps = evaluate_serve(cand.deployment, res.layout, workload, [c],
                                                            num_prompts=num_prompts)
    except JaxpriceError as err:
        out["serve"] = None
        out["error"] = err.reason
        return out
    out["serve"] = {"ttft_ms": float(ttft[0]) * 1e3, "tpot_ms": float(tpot[0]) * 1e3,
                    "tokens_per_s_per_gpu": float(per_gpu[0]), "steps": int(steps)}
    out["serve_meets_targets"] = bool((ttft_t is None or ttft[0] <= ttft_t) and (tpot_t is None or tpot[0] <= tpot_t))
    return out


def _stack_compiles():
    """Deployment-axis kernel compiles so far in this process (None without stack.py)."""
    try:
        from .stack import kernel_compiles
    except ImportError:
        return None
    return kernel_compiles()


def _serve_module():
    try:
        from . import serve
    except ImportError:
        return None
    return serve if hasattr(serve, "simulate_sweep") else None


def _rank_peak(sched) -> float:
    """A simulated run's peak resident requests on one data-parallel rank (what ``LayoutResult.resident``
    and the JSON's resident_per_rank hold, as the steady state's R): the summary's resident_peak
    counts every rank's together (dp x it at dp > 1)."""
    if sched is None or not sched.steps:
        return 0.0
    return float(np.max(np.asarray(sched.sums["resident"])))


def evaluate_serve(dep: Deployment, layout: Layout, workload: SizeWorkload, concurrencies, *, num_prompts=None,
                   engine=None, estimate="no_overlap"):
    """The ``serve`` evaluator: the serving simulation's closed-loop sweep (serve.simulate_sweep),
    the same returns as ``evaluate_steady``. engine: per-run overrides of the engine settings."""
    serve = _serve_module()
    wl = Workload(isl=workload.isl, osl=workload.osl, range_ratio=workload.range_ratio, seed=workload.seed)
    kw = {} if num_prompts is None else {"num_prompts": num_prompts}
    if engine:
        kw["engine"] = dict(engine)
    if layout.spec_tokens:          # the assumed acceptance, as `jaxprice serve --acceptance` passes it
        kw["acceptance"] = layout.tokens_per_step
    res = serve.simulate_sweep(dep, wl, list(concurrencies), estimate=estimate, **kw)
    get = lambda k: np.array([float(r.summary[k]) for r in res])  # noqa: E731
    ttft, tpot = get("ttft_mean"), get("tpot_mean")
    per_gpu = np.array([float(r.summary["output_tps"]) for r in res]) / layout.width
    resident = np.array([_rank_peak(r.schedule) for r in res])
    steps = int(sum(float(r.summary.get("steps", 0)) for r in res))
    return ttft, tpot, per_gpu, 1.0 / tpot, resident.astype(int), steps


def _jit_cache_size(fn) -> int:
    try:
        return int(fn._cache_size())
    except Exception:  # noqa: BLE001 - a JAX without the counter: compiles are not reported
        return 0


def simulation_compiles() -> dict:
    """Compiled programs of the serving simulation in this process so far: the closed-loop
    scheduler (one per shape bucket and lane-group size) and the step kernel on per-step sums
    (one per plan structure and chunk size)."""
    serve = _serve_module()
    if serve is None:
        return {"scheduler": 0, "kernel": 0}
    from . import schedule as SCH
    return {"scheduler": _jit_cache_size(SCH.run_closed), "kernel": _jit_cache_size(serve._price_chunk)}


def _schedules_batched(serve, deps, layouts, items, callback=None):
    """Every layout's schedules of its ``items`` (per layout, closed-loop levels) in ONE shared
    ``serve.build_schedules_batched`` call (the lanes of all layouts, levels and dp ranks grouped
    by shape bucket): per layout per item a Schedule or the JaxpriceError refusing that run."""
    # a speculating layout's assumed acceptance, as `jaxprice serve --acceptance` passes it
    jobs = [(dep, its, None, lay.tokens_per_step) if lay.spec_tokens else (dep, its, None)
            for dep, its, lay in zip(deps, items, layouts)]
    progress = None if callback is None else (lambda done, total, **info: callback(done, total, stage="schedule"))
    return serve.build_schedules_batched(jobs, callback=progress)


def evaluate_serve_many(deps, layouts, workload: SizeWorkload, concurrencies, *, num_prompts=None,
                        prompts_per_client=None, estimate: str = "no_overlap", callback=None, stats: dict | None = None,
                        points=None):
    """The ``serve`` evaluator over many layouts at once: every layout's closed-loop sweep
    scheduled in SHARED scheduler calls (``serve.build_schedules_batched``: the lanes of all
    layouts, levels and dp ranks grouped by shape bucket, so the compiles do not grow with the
    number of layouts), then each layout's steps of all levels priced in one ``serve.price_flat``
    call (compiled once per plan structure). Returns per layout ``evaluate_serve``'s tuple (equal
    to ``serve.simulate_sweep``'s numbers: the same schedule, prices and metrics), or the
    JaxpriceError refusing one of its runs. Prompts per point: ``num_prompts`` when given, else
    ``prompts_per_client`` x C when given, else the benchmark's 10 x C. ``stats`` (a dict)
    receives steps, scheduler_iterations, seconds_schedule, seconds_price. ``points``: per layout a
    [levels] bool mask of the levels to simulate (default all; at least one each); the arrays
    returned then hold those levels only."""
    serve = _serve_module()
    if serve is None:
        refuse("the serving simulation (jaxprice serve) is not installed in this version", field="evaluator",
               value="serve")
    if estimate not in ("no_overlap", "overlap"):
        refuse("unknown estimate (known: no_overlap, overlap)", field="estimate", value=estimate)
    wl = Workload(isl=workload.isl, osl=workload.osl, range_ratio=workload.range_ratio, seed=workload.seed)
    concs = [int(c) for c in concurrencies]

    def prompts(c):
        if num_prompts is not None:
            return int(num_prompts)
        if prompts_per_client is not None:
            return max(int(round(prompts_per_client * c)), 1)
        return None                                  # the benchmark's 10 x C
    masks = [np.ones(len(concs), bool)] * len(layouts) if points is None else [np.asarray(m, bool) for m in points]
    items = [[(wl, serve.ClosedLoop(c, prompts(c))) for c, on in zip(concs, m) if on] for m in masks]
    t0 = time.perf_counter()
    built = _schedules_batched(serve, deps, layouts, items, callback)
    t1 = time.perf_counter()
    out, steps, iters = [], 0, 0
    for k, (dep, lay, scheds) in enumerate(zip(deps, layouts, built)):
        bad = [sc for sc in scheds if isinstance(sc, JaxpriceError)]
        if bad:
            out.append(bad[0])
            continue
        coefs = dep.coefficients
        flats = [serve._flat_columns(sc) for sc in scheds]
        flat = {key: np.concatenate([f[key] for f in flats]) for key in flats[0]}
        times = np.asarray(serve.price_flat(dep.plan, coefs, scheds[0].laws, flat, estimate=estimate))
        summ, o = [], 0
        for sc in scheds:
            n = sc.dp * sc.steps
            dt = times[o:o + n].reshape(sc.dp, sc.steps).max(axis=0) if sc.steps else np.zeros(0)
            o += n
            summ.append(serve.schedule_metrics(sc, dt, coefs)["summary"])
            steps += n
            iters += int(sc.iterations)
        get = lambda key: np.array([float(m[key]) for m in summ])  # noqa: E731
        ttft, tpot = get("ttft_mean"), get("tpot_mean")
        per_gpu = get("output_tps") / lay.width
        resident = np.array([_rank_peak(sc) for sc in scheds])
        out.append((ttft, tpot, per_gpu, 1.0 / tpot, resident.astype(int), int(sum(sc.steps for sc in scheds))))
        if callback is not None:
            callback(k + 1, len(deps), stage="simulate")
    if stats is not None:
        stats["steps"] = stats.get("steps", 0) + steps
        stats["scheduler_iterations"] = stats.get("scheduler_iterations", 0) + iters
        stats["seconds_schedule"] = stats.get("seconds_schedule", 0.0) + (t1 - t0)
        stats["seconds_price"] = stats.get("seconds_price", 0.0) + (time.perf_counter() - t1)
    return out


def refine(results, cands, workload: SizeWorkload, concurrencies, ttft_t, tpot_t, *, limit: int = DEFAULT_SIMULATE,
           num_prompts=None, first: str = "near", rule: str = "serve", stats: dict | None = None, callback=None,
           max_rounds: int = 32):
    """Re-run layouts under the serving simulation and put its numbers in place of the search's
    (``LayoutResult.replace_numbers``; ``source`` says which): first ``simulation_set`` (``first``
    'near': the frontier, best, runner-up and the layouts meeting or near the targets; 'frontier':
    the frontier, best and runner-up only), all in one batched call (``evaluate_serve_many``);
    then, while the frontier, the best or the runner-up of the updated numbers holds a layout
    whose numbers are not yet simulated, those layouts, until none is left (or after
    ``max_rounds`` rounds). So every frontier point and the chosen layouts carry simulated
    numbers; ``limit`` bounds only the layouts near the targets added in the first round. After
    each round a layout not yet simulated takes, at each point where a simulated twin ran, that
    run's numbers (``_share_twin_points``: the same plan and load, engine settings that do not move
    the search's TPOT or throughput there), so twins do not displace one another from the frontier
    round after round. A layout the simulation refuses is dropped (its candidate rejected with the
    reason). Returns (results, rounds)."""
    results = list(results)
    done: set = set()          # candidate indices simulated under ``rule``
    sims: dict = {}            # twin point key -> (the simulated numbers at that point, the layout's label)
    rounds = 0
    while True:
        index_done = [i for i, r in enumerate(results) if r.index in done]
        if rounds == 0 and first == "near":
            todo = simulation_set(results, ttft_t, tpot_t, limit=limit, done=index_done)
        else:
            frontier, best, runner, _m, _miss = choose(results, ttft_t, tpot_t)
            refs = frontier + [x for x in (best, runner) if x is not None]
            # a layout is wanted for a point still on the search's numbers (not one a twin's run gave)
            want = list(dict.fromkeys(i for i, j in refs if results[i].point_source(j) != rule))
            todo = [i for i in want if results[i].index not in done]
        if not todo or rounds >= max_rounds:
            break
        rounds += 1
        masks = {i: simulation_points(results[i], ttft_t) for i in todo}
        done.update(results[i].index for i in todo if not masks[i].any())    # every point far over the TTFT target
        todo = [i for i in todo if masks[i].any()]
        outs = evaluate_serve_many([cands[results[i].index].deployment for i in todo],
                                   [results[i].layout for i in todo], workload, concurrencies, num_prompts=num_prompts,
                                   stats=stats, callback=callback, points=[masks[i] for i in todo]) if todo else []
        drop = set()
        for i, out in zip(todo, outs):
            done.add(results[i].index)
            if isinstance(out, JaxpriceError):
                c = cands[results[i].index]
                c.status, c.reason = "rejected", f"serving simulation refused: {out.reason}"
                drop.add(i)
            else:
                _remember_points(sims, results[i], cands, out, masks[i])
                results[i].replace_numbers(out, rule, points=masks[i])
                results[i].simulated_as = None
        results = [r for i, r in enumerate(results) if i not in drop]
        _share_twin_points(results, cands, sims, done, rule)
    return results, rounds


def _twin_point_key(r: LayoutResult, cands, j: int) -> tuple:
    """Point j of a layout: its plan, widths, load and search TPOT and throughput there (the
    steady state's, ``replaced`` once simulated). Layouts sharing it differ only in engine
    settings the closed form finds do not move TPOT or throughput at that load (max_num_seqs
    above its residents, a budget its prompts do not fill); the TTFT may differ a little (a
    budget sets how fast the first wave is prefilled), and is left out of the key."""
    steady = r.replaced if r.replaced is not None else {"tpot": r.tpot, "tps_per_gpu": r.tps_per_gpu}
    dep = cands[r.index].deployment
    plan = dep.plan.digest if dep is not None else ("no deployment", r.index)     # a twin of nothing
    return (plan, r.layout.tp, r.layout.dp, r.layout.ep, int(r.concurrency[j]),
            *(float(np.asarray(steady[k])[j]) for k in ("tpot", "tps_per_gpu")))


def _remember_points(sims: dict, r: LayoutResult, cands, out, mask) -> None:
    """Keep a simulated layout's numbers at each point it ran, by twin point key."""
    for j in np.flatnonzero(mask):
        sims.setdefault(_twin_point_key(r, cands, j), (tuple(np.asarray(x)[j] for x in out[:5]), r.layout.label))


def _share_twin_points(results, cands, sims, done, rule) -> None:
    """A layout not yet simulated takes, at each point where a simulated twin (``_twin_point_key``)
    ran, that run's numbers (``simulated_as`` names the twin): the same plan at the same load with
    settings that do not bind there runs the same. Without this, twins tied on the search's
    numbers at the frontier's low-concurrency end displaced each other one round at a time as
    each was simulated (DeepSeek-V3 on 8 H200: 24 rounds and 36 layouts simulated)."""
    for r in results:
        if r.index in done:
            continue
        hits = [(j, sims.get(_twin_point_key(r, cands, j))) for j in range(len(r.concurrency))
                if r.point_source(j) != rule]
        hits = [(j, h) for j, h in hits if h is not None]
        if not hits:
            continue
        mask = np.zeros(len(r.concurrency), bool)
        mask[[j for j, _h in hits]] = True
        out = [np.array([vals[k] for _j, (vals, _label) in hits]) for k in range(5)]   # the points in order
        r.replace_numbers((*out, 0), rule, points=mask)
        r.simulated_as = ", ".join(dict.fromkeys(label for _j, (_v, label) in hits))


SKIP_TTFT_FACTOR = 3.0    # refine leaves a point on the search's numbers when its TTFT there exceeds this x the target


def simulation_points(result: LayoutResult, ttft_t) -> np.ndarray:
    """[levels] bool: the levels of a layout ``refine`` re-runs under the simulation: all but
    those whose TTFT by the search's evaluator exceeds SKIP_TTFT_FACTOR x the TTFT target (all
    when none is set). Such a point cannot enter the frontier (only points meeting the TTFT
    target do) nor be chosen, and its simulation is the costliest of the sweep (10 x C
    requests at the highest C, queueing). Why 3: where queueing sets TTFT (C above what the
    engine holds), the simulated TTFT came out 0.91 to 0.96 x the steady state's (DeepSeek-V3,
    8 x H200, 1k/1k, every point of the 18 layouts the bench search simulates), and above it
    where the first wave's burst sets TTFT (1.0 to 2.0 x there, up to 2.7 x in the tests' small
    case); 3 leaves a skipped point at least 2.7 x over the target.
    tests/test_size.py simulates skipped points and checks that they miss the target."""
    ttft = np.asarray(result.ttft, float)
    if ttft_t is None:
        return np.ones(ttft.shape, bool)
    return ~(ttft > SKIP_TTFT_FACTOR * ttft_t)


def simulation_set(results, ttft_t, tpot_t, *, near: float = 0.2, band: float = 0.2, limit: int = 24,
                   done=()) -> list:
    """Indices (into ``results``) of the layouts the serving simulation should re-run, leaving out
    ``done`` (already simulated): every layout on the Pareto frontier, the best and the runner-up,
    then at most ``limit`` more: the layouts that meet or come near the targets (some point within
    ``near`` of both, e.g. TPOT <= 1.2 x target) with a throughput per GPU there within ``band``
    of the best such (1 - band = 0.8 of it), by that throughput."""
    frontier, best, runner, _m, _miss = choose(results, ttft_t, tpot_t)
    must = list(dict.fromkeys([i for i, _ in frontier] + [ref[0] for ref in (best, runner) if ref is not None]))
    want = list(must)
    scores = []
    for i, r in enumerate(results):
        ok = np.isfinite(r.tpot) & np.isfinite(r.ttft) & (r.tps_per_gpu > 0)
        if ttft_t is not None:
            ok &= r.ttft <= (1.0 + near) * ttft_t
        if tpot_t is not None:
            ok &= r.tpot <= (1.0 + near) * tpot_t
        if ok.any():
            scores.append((float(r.tps_per_gpu[ok].max()), i))
    if scores:
        top = max(v for v, _ in scores)
        want += [i for v, i in sorted(scores, key=lambda t: (-t[0], t[1])) if v >= (1.0 - band) * top]
    done = set(done)
    core = [i for i in dict.fromkeys(want[:len(must)]) if i not in done]
    extra = [i for i in dict.fromkeys(want[len(must):]) if i not in done and i not in core]
    return core + extra[:max(int(limit), 0)]


# ----------------------------------------------------------------------------- results


@dataclasses.dataclass
class SizeResult:
    """What ``size`` found (see the module docstring). ``frontier``: (layout result index,
    concurrency index) pairs, by tokens/s per user ascending; ``best``: such a pair or None;
    ``runner_up``: the best point of any other layout meeting the targets whose numbers differ from
    the best's (None if none); ``tied``: result indices of layouts with the best's very numbers
    (settings that do not bind at that load); ``margin``: best / runner-up tokens/s per GPU - 1;
    ``miss``: the message when no point meets the targets; ``info``: search statistics (layouts, compiles, steps, seconds, evaluator)."""
    model: str
    chip: str
    gpus: int
    workload: SizeWorkload
    ttft_target: float | None       # seconds
    tpot_target: float | None
    candidates: list
    results: list
    frontier: list
    best: tuple | None
    runner_up: tuple | None
    margin: float | None
    miss: str
    info: dict
    graph: ModelGraph | None = None
    registry: Registry | None = None
    model_source: str = ""
    verification: list = dataclasses.field(default_factory=list)
    tied: list = dataclasses.field(default_factory=list)
    engine: str = "vllm"            # layouts.ENGINES
    coefficient_sets: tuple = COEFFICIENT_SETS     # every candidate's: the six, and coefficient_files after them

    # -- selections
    def point(self, ref) -> dict:
        i, j = ref
        r = self.results[i]
        return {"label": r.layout.label, "layout": r.layout.as_dict(), "replicas": r.replicas,
                "concurrency_per_engine": int(r.concurrency[j]), "concurrency_total": int(r.concurrency[j]) * r.replicas,
                "ttft_ms": float(r.ttft[j]) * 1e3, "tpot_ms": float(r.tpot[j]) * 1e3,
                "tokens_per_s_per_gpu": float(r.tps_per_gpu[j]), "tokens_per_s_per_user": float(r.tps_per_user[j]),
                "tokens_per_s_total": float(r.tps_per_gpu[j]) * self.gpus}

    @property
    def best_result(self) -> LayoutResult | None:
        return None if self.best is None else self.results[self.best[0]]

    @property
    def best_candidate(self) -> Candidate | None:
        return None if self.best is None else self.candidates[self.results[self.best[0]].index]

    def rejected(self) -> list:
        return [c for c in self.candidates if c.status == "rejected"]

    # -- artefacts
    def scenario_yaml(self) -> str:
        """The chosen deployment as a two-document Scenario + Deployment YAML (the bundled
        scenarios' format), which ``jaxprice price``, ``jaxprice serve`` and load_deployment read."""
        if self.best is None:
            refuse("no layout meets the targets, so there is no deployment to write", field="targets")
        scen = self.best_candidate.deployment.scenario
        note = self._note()
        if self.model_source and not self.model_source.startswith("registry model"):
            # the registry reads a path, to a config.json or to a graph file, as a model (its name alone
            # named no model, or the bundled graph of that name: `serve` then priced another graph)
            scen = dataclasses.replace(scen, model=str(Path(self.model_source).resolve()))
        return scenario_document(scen, note=note)

    def _note(self) -> str:
        p = self.point(self.best)
        return (f"written by jaxprice size: best of {self.info.get('layouts_evaluated', '?')} layouts for "
                f"{self.gpus} x {self.chip}, ISL {self.workload.isl} / OSL {self.workload.osl}; "
                f"{p['tokens_per_s_per_gpu']:.1f} output tokens/s per GPU at {p['concurrency_per_engine']} clients "
                f"per engine x {p['replicas']} replica(s), TTFT {p['ttft_ms']:.1f} ms, TPOT {p['tpot_ms']:.2f} ms"
                + self._spec_note() + self._rerun_note())

    def _rerun_note(self) -> str:
        source, prompts = self.best_result.point_source(self.best[1]), self.info.get("simulated_prompts", "10 x C")
        final = "serve" if prompts == "10 x C" else f"serve ({prompts} prompts)"      # _prompt_rules' final rule
        how = ("the serving simulation, again by" if source == final else
               "the search's shorter serving simulation; the full one (it may differ):" if source.startswith("serve")
               else "the closed-form steady state; the serving simulation (it may differ):")
        return f"\nnumbers from {how} " + self.serve_command("THIS_FILE")

    def serve_command(self, scenario) -> str:
        """The `jaxprice serve SCENARIO` line that simulates the best point again (SCENARIO: the file
        --write-scenario wrote): the workload's range ratio and seed, the prompts and the assumed
        acceptance where they are not serve's defaults (`serve` alone drew lengths on [0.8 L, L]
        where a search ran --range-ratio 1, and gave other numbers)."""
        if self.best is None:
            refuse("no layout meets the targets", field="targets")
        p = self.point(self.best)
        w, prompts = self.workload, self.info.get("simulated_prompts", "10 x C")
        flags = [f"--isl {w.isl}", f"--osl {w.osl}", f"--concurrency {p['concurrency_per_engine']}"]
        flags += [] if w.range_ratio == 0.8 else [f"--range-ratio {w.range_ratio:g}"]
        flags += [] if w.seed == 0 else [f"--seed {w.seed}"]
        flags += [] if prompts == "10 x C" else [f"--num-prompts {prompts}"]
        if self.best_result.layout.spec_tokens:
            flags.append(f"--acceptance {self.best_result.layout.tokens_per_step:g}")
        return f"jaxprice serve {scenario} " + " ".join(flags)

    def _spec_note(self) -> str:
        lay = self.best_result.layout
        if not lay.spec_tokens:
            return ""
        return (f"\nspeculative decoding: {lay.spec_tokens} draft token(s) a step at an ASSUMED acceptance of "
                f"{lay.tokens_per_step:g} tokens per decode row and step (jaxprice serve --acceptance "
                f"{lay.tokens_per_step:g} simulates it so)")

    def vllm_command(self) -> str:
        if self.best is None:
            refuse("no layout meets the targets", field="targets")
        cand = self.best_candidate
        if cand.layout.engine != "vllm":
            refuse(f"the search sized {cand.layout.engine} engines: launch_command() gives their line",
                   field="engine", value=cand.layout.engine)
        return vllm_command(cand.deployment.scenario, cand.layout, self.graph, replicas=cand.replicas,
                            hybrid_block=hybrid_block_of(cand.deployment), deployment=cand.deployment)

    def launch_command(self) -> str:
        """The chosen engine's launch line (``vllm serve ...`` or ``python -m sglang.launch_server ...``)."""
        if self.best is None:
            refuse("no layout meets the targets", field="targets")
        cand = self.best_candidate
        return launch_command(cand.deployment.scenario, cand.layout, self.graph, replicas=cand.replicas,
                              hybrid_block=hybrid_block_of(cand.deployment), deployment=cand.deployment)

    def as_dict(self) -> dict:
        out = {"model": self.model, "chip": self.chip, "gpus": self.gpus,
               "workload": dataclasses.asdict(self.workload),
               "targets": {"ttft_ms": None if self.ttft_target is None else self.ttft_target * 1e3,
                           "tpot_ms": None if self.tpot_target is None else self.tpot_target * 1e3},
               "coefficient_sets": list(self.coefficient_sets), "info": self.info,
               "best": None if self.best is None else self.point(self.best),
               "runner_up": None if self.runner_up is None else self.point(self.runner_up),
               "tied_with_best": [self.results[i].layout.label for i in self.tied],
               "margin": self.margin, "miss": self.miss or None,
               "frontier": [self.point(f) for f in self.frontier],
               "verification": self.verification,
               "layouts": [r.as_dict() for r in self.results],
               "rejected": [c.as_dict() for c in self.candidates if c.status == "rejected"],
               "duplicates": [c.as_dict() for c in self.candidates if c.status == "duplicate"]}
        out = {"engine": self.engine} | out
        if "speculation" in self.info:      # the draft counts searched and the ASSUMED acceptance
            out["speculation"] = self.info["speculation"]
        if self.best is not None:           # vllm_command or sglang_command
            out[f"{self.engine}_command"] = self.launch_command()
        return out


def pareto(points) -> list:
    """Indices of the non-dominated points of ``points`` ([n, 2], both maximised): no other
    point is >= in both coordinates and > in one; of equal points only the first. Returned by
    the first coordinate ascending."""
    pts = np.asarray(points, dtype=float)
    keep, seen = [], set()
    for i, (x, y) in enumerate(pts):
        dom = (pts[:, 0] >= x) & (pts[:, 1] >= y) & ((pts[:, 0] > x) | (pts[:, 1] > y))
        if not dom.any() and (x, y) not in seen:     # equal points: the first stands for them all
            keep.append(i)
            seen.add((x, y))
    return sorted(keep, key=lambda i: (pts[i, 0], -pts[i, 1]))


def _meets(r: LayoutResult, ttft_t, tpot_t):
    ok = np.isfinite(r.tpot) & np.isfinite(r.ttft) & (r.tps_per_gpu > 0)
    if ttft_t is not None:
        ok &= r.ttft <= ttft_t
    if tpot_t is not None:
        ok &= r.tpot <= tpot_t
    return ok


def _ranked(results, ttft_t, tpot_t) -> list:
    """Each layout meeting the targets at its best point, (tokens/s per GPU, -index, (i, j)),
    best first (ties: the earlier candidate)."""
    per_layout = []
    for i, r in enumerate(results):
        ok = _meets(r, ttft_t, tpot_t)
        if ok.any():
            j = int(np.flatnonzero(ok)[np.argmax(r.tps_per_gpu[ok])])
            per_layout.append((float(r.tps_per_gpu[j]), -i, (i, j)))
    return sorted(per_layout, reverse=True)


def _same_point(results, a, b) -> bool:
    """Two layouts' points give the same numbers (e.g. a max_num_seqs above the concurrency, or a
    token budget no step reaches: a setting that does not bind at that load)."""
    ra, rb = results[a[0]], results[b[0]]
    pair = [(getattr(ra, k)[a[1]], getattr(rb, k)[b[1]]) for k in ("tps_per_gpu", "ttft", "tpot", "concurrency")]
    return all(abs(float(x) - float(y)) <= 1e-9 * max(abs(float(x)), abs(float(y))) for x, y in pair)


def tied_with_best(results, ttft_t, tpot_t) -> list:
    """The result indices of the other layouts whose best point equals the best's (same numbers):
    equally good choices, listed beside the best instead of standing as its runner-up."""
    ranked = _ranked(results, ttft_t, tpot_t)
    return [ref[0] for _, _, ref in ranked[1:] if ranked and _same_point(results, ranked[0][2], ref)]


def choose(results, ttft_t, tpot_t):
    """(frontier, best, runner_up, margin, miss) over evaluated layouts (see SizeResult). The
    runner-up is the best layout whose numbers differ from the best's (tied_with_best lists the
    others), so the margin compares two different outcomes."""
    refs = [(i, j) for i, r in enumerate(results) for j in range(len(r.concurrency))]
    ttft_ok = [bool(ttft_t is None or results[i].ttft[j] <= ttft_t) for i, j in refs]
    pool = [ref for ref, ok in zip(refs, ttft_ok) if ok] or refs
    pts = [(results[i].tps_per_user[j], results[i].tps_per_gpu[j]) for i, j in pool]
    frontier = [pool[k] for k in pareto(pts)] if pool else []
    ranked = _ranked(results, ttft_t, tpot_t)
    if not ranked:
        return frontier, None, None, None, miss_message(results, ttft_t, tpot_t)
    best = ranked[0][2]
    others = [x for x in ranked[1:] if not _same_point(results, best, x[2])]
    runner = others[0][2] if others else None
    margin = (ranked[0][0] / others[0][0] - 1.0) if others and others[0][0] > 0 else None
    return frontier, best, runner, margin, ""


def miss_message(results, ttft_t, tpot_t) -> str:
    """Names the point closest to the targets (the smallest worst ratio achieved / target) and
    what it misses by."""
    if not results:
        return "no layout could be evaluated"
    best = None
    for i, r in enumerate(results):
        for j in range(len(r.concurrency)):
            ratio = max(r.ttft[j] / ttft_t if ttft_t else 0.0, r.tpot[j] / tpot_t if tpot_t else 0.0)
            if best is None or ratio < best[0]:
                best = (ratio, i, j)
    _, i, j = best
    r = results[i]
    parts = []
    for name, val, tgt in (("TTFT", r.ttft[j], ttft_t), ("TPOT", r.tpot[j], tpot_t)):
        if tgt is None:
            continue
        if val > tgt * 100:         # "4.98 ms (4.98e+03 x the target) over" said the value twice
            parts.append(f"{name} {val * 1e3:.2f} ms, {val / tgt:.3g} x the {tgt * 1e3:g} ms target")
        elif val > tgt:
            parts.append(f"{name} {val * 1e3:.2f} ms, {(val - tgt) * 1e3:.3g} ms ({val / tgt - 1:.0%}) over the "
                         f"{tgt * 1e3:g} ms target")
        else:
            parts.append(f"{name} {val * 1e3:.2f} ms meets {tgt * 1e3:g} ms")
    want = " and ".join(f"{n} <= {t * 1e3:g} ms" for n, t in (("TTFT", ttft_t), ("TPOT", tpot_t)) if t is not None)
    return (f"no layout meets {want}; closest: {r.layout.label} at {int(r.concurrency[j])} client(s) per engine: "
            + "; ".join(parts))


# ----------------------------------------------------------------------------- the search


def _fitting_widths(graph, chip_obj, chip, gpus, isl, osl, registry, template: Layout, gpus_per_node,
                    coefficient_sets=COEFFICIENT_SETS):
    """Widths tp x dp (not dividing ``gpus``) at which some layout of the model fits: for the
    message when nothing that divides the GPU count fits."""
    out = []
    moe = is_moe(graph)
    for w in WIDTHS:
        if gpus % w == 0 or w > 16:
            continue
        for t, d, e in ((w, 1, False), (1, w, True), (w, 1, True)):
            if not moe and (d > 1 or e):
                continue
            lay = dataclasses.replace(template, tp=t, dp=d, ep=e and w > 1)
            try:
                dep = resolve(build_scenario(graph.name, chip, lay, isl=isl, osl=osl, graph=graph,
                                             gpus_per_node=gpus_per_node, coefficient_sets=coefficient_sets),
                              registry)
            except JaxpriceError:
                continue
            if fits(dep, max_model_len(isl, osl, graph.max_model_len))[0]:
                out.append(w)
                break
    return out


def _positive(value, field, integer=False, maximum=None, why=""):
    if value is None:
        return None
    if isinstance(value, bool):
        refuse("expected a number, not a boolean", field=field, value=value)
    if isinstance(value, (str, bytes)):      # float("100") would take it
        refuse("expected a number, not a string", field=field, value=value, has_value=True)
    if integer and isinstance(value, (int, np.integer)):     # exact, however large (float() would round it)
        v = int(value)
    else:
        try:
            v = float(value)
        except (TypeError, ValueError, OverflowError):
            refuse("expected a number", field=field, value=value)
    if not math.isfinite(v) or v <= 0 or (integer and v != int(v)):
        refuse("must be a positive " + ("integer" if integer else "number"), field=field, value=value,
               has_value=True)
    if maximum is not None and v > maximum:
        refuse(f"must be at most {maximum}{why}", field=field, value=value, has_value=True)
    return int(v) if integer else v


def _checked_workload(gpus, isl, osl, ttft_ms, tpot_ms, concurrency, range_ratio):
    """The workload, targets and concurrency sweep of a search, each refused in one line when
    malformed: (gpus, SizeWorkload, ttft target s or None, tpot target s or None, sorted levels)."""
    gpus = _positive(gpus, "gpus", integer=True, maximum=MAX_GPUS, why=" (2**20: past any cluster one engine "
                     "layout is replicated over)")
    isl = _positive(isl, "isl", integer=True, maximum=INT_TOKEN_LIMIT - 1, why=TOKEN_WHY)
    osl = _positive(osl, "osl", integer=True, maximum=INT_TOKEN_LIMIT - 1, why=TOKEN_WHY)
    if osl < 2:
        refuse("must be at least 2: sizing trades tokens/s per GPU against tokens/s per user (1 / TPOT), "
               "and a one-token output has no TPOT (jaxprice serve prices prefill-only runs)", field="osl", value=osl)
    ttft_t = None if ttft_ms is None else _positive(ttft_ms, "ttft_ms") / 1e3
    tpot_t = None if tpot_ms is None else _positive(tpot_ms, "tpot_ms") / 1e3
    if isinstance(concurrency, (str, bytes)) or not hasattr(concurrency, "__iter__"):
        refuse("expected a list of client counts per engine", field="concurrency", value=concurrency)
    conc = sorted({_positive(c, "concurrency", integer=True, maximum=MAX_CONCURRENCY,
                             why=" clients per engine (the serving simulation's 10 x C prompts per point must stay "
                                 f"within its cap of {MAX_RUN_REQUESTS} requests per run)") for c in concurrency})
    if not conc:
        refuse("needs at least one concurrency", field="concurrency")
    if len(conc) > MAX_LEVELS:
        refuse(f"{len(conc)} concurrency levels; a search sweeps at most {MAX_LEVELS} (every level of every layout "
               "is priced)", field="concurrency", value=f"{conc[0]}..{conc[-1]}")
    if isinstance(range_ratio, bool) or not isinstance(range_ratio, (int, float, np.integer, np.floating)) \
            or not 0 < float(range_ratio) <= 1:
        refuse("must be in (0, 1]", field="range_ratio", value=range_ratio)
    return gpus, SizeWorkload(isl, osl, float(range_ratio)), ttft_t, tpot_t, conc


def _checked_speculation(spec_tokens, acceptance, engine) -> tuple[list, float | None]:
    """The draft counts (non-negative integers, 0 = no speculation) and the assumed acceptance
    (None, or a number in [1, 1 + the largest k]; refused beside no k > 0), each refused in one
    line; SGLang engines are refused any k > 0 (its steady state has no speculation)."""
    if isinstance(spec_tokens, (str, bytes)) or not hasattr(spec_tokens, "__iter__"):
        refuse("expected a list of draft counts (0: no speculation)", field="spec_tokens", value=shown(spec_tokens),
               has_value=True)
    ks = list(spec_tokens)
    if not ks:
        refuse("expected at least one draft count (0: no speculation)", field="spec_tokens", value=ks, has_value=True)
    for k in ks:
        whole_float = isinstance(k, (float, np.floating)) and math.isfinite(k) and k == int(k)
        if isinstance(k, (bool, np.bool_)) or not (isinstance(k, (int, np.integer)) or whole_float):
            refuse("expected whole numbers of draft tokens (0: no speculation)", field="spec_tokens",
                   value=shown(k), has_value=True)
        if k < 0 or k > MAX_SPEC_TOKENS:
            refuse(f"must be in [0, {MAX_SPEC_TOKENS}] draft tokens per decode step (0: no speculation)",
                   field="spec_tokens", value=k, has_value=True)
    ks = list(dict.fromkeys(int(k) for k in ks))
    top = max(ks)
    if top > 0 and engine == "sglang":
        refuse("speculative decoding is searched for vLLM engines only (SGLang's EAGLE schedule is not in its steady "
               "state): leave --spec-tokens at 0 with --engine sglang", field="spec_tokens", value=top)
    if acceptance is None:
        return ks, None
    if top == 0:
        refuse("is the acceptance of speculative decoding: give draft counts above 0 (--spec-tokens)",
               field="acceptance", value=shown(acceptance), has_value=True)
    if isinstance(acceptance, (bool, np.bool_)) or not isinstance(acceptance, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(acceptance)) or not 1.0 <= float(acceptance) <= 1.0 + top:
        refuse(f"must be a number in [1, 1 + {top}] (mean tokens emitted per decode row and step, at most 1 + the "
               "largest draft count)", field="acceptance", value=shown(acceptance), has_value=True)
    return ks, float(acceptance)


def _check_drafter(graph: ModelGraph, spec_tokens) -> None:
    """Refuse draft counts above 0 for a model graph without a drafter (its MTP layers)."""
    if max(spec_tokens) > 0 and not graph.speculator:
        refuse(f"{graph.name} has no drafter (no MTP layers in its model graph): speculative decoding cannot be "
               "searched for it (--spec-tokens 0 only)", field="spec_tokens", value=max(spec_tokens))


def speculation_info(spec_tokens, acceptance) -> dict | None:
    """What a search assumed of speculative decoding (None when it searched none): the draft
    counts and, per k > 0, the acceptance priced (an ASSUMPTION, not a measurement)."""
    ks = [k for k in spec_tokens if k > 0]
    if not ks:
        return None
    from .serve import ACCEPTANCE_LAW, DEFAULT_ACCEPTANCE_PER_DRAFT as per, default_acceptance
    acc = {k: (default_acceptance(k) if acceptance is None else min(acceptance, 1.0 + k)) for k in ks}
    source = (f"ASSUMED, not measured: {ACCEPTANCE_LAW.format(a=per)} (serve.default_acceptance)" if acceptance is None
              else f"ASSUMED, not measured: --acceptance {acceptance:g} (at most 1 + k)")
    return {"spec_tokens": list(spec_tokens), "acceptance": {str(k): a for k, a in acc.items()},
            "acceptance_source": source,
            "note": "acceptance = mean tokens emitted per decode row and step; TPOT scales about as 1 / acceptance"}


def _check_engine(engine, cudagraph_modes) -> None:
    """Refuse an unknown engine, and vLLM's CUDA-graph modes beside SGLang (whose decode batches
    are captured and prefill batches run eagerly, layouts.SGLANG_GRAPH_MODE)."""
    if not isinstance(engine, str) or engine not in ENGINES:
        refuse(f"unknown engine (known: {', '.join(ENGINES)})", field="engine", value=shown(engine), has_value=True)
    if engine == "sglang":
        given = list(cudagraph_modes) if hasattr(cudagraph_modes, "__iter__") and not isinstance(
            cudagraph_modes, (str, bytes)) else cudagraph_modes
        if given != list(DEFAULT_GRAPH_MODES):
            refuse("is vLLM's CUDA-graph mode axis: SGLang engines capture their decode batches and run prefill "
                   "eagerly (no mode to search)", field="cudagraph_modes",
                   value=", ".join(map(str, given)) if isinstance(given, list) else shown(given), has_value=True)


def _checked_evaluator(evaluator: str, simulate) -> tuple[str, int]:
    """The search's evaluator and how many layouts near the targets are re-run under the
    simulation: 'auto' searches with 'steady' and refines with the simulation where installed."""
    if evaluator not in EVALUATORS:
        refuse(f"unknown evaluator (known: {', '.join(EVALUATORS)})", field="evaluator", value=evaluator)
    if simulate is not None and evaluator == "steady" and simulate != 0:   # as the CLI's --simulate
        refuse("is for evaluator 'auto' or 'serve': 'steady' simulates nothing (verify re-runs its best layout)",
               field="simulate", value=simulate)
    simulate = _whole(DEFAULT_SIMULATE if simulate is None else simulate, source=None, field="simulate",
                      what="an integer >= 0")
    if evaluator == "auto":
        return "steady", simulate if _serve_module() is not None else 0
    if evaluator == "steady":
        return "steady", 0
    if _serve_module() is None:
        refuse("the serving simulation (jaxprice serve) is not installed in this version", field="evaluator",
               value=evaluator)
    return evaluator, simulate


def _check_axes(*, tp, dp, weights, max_num_seqs, max_num_batched_tokens, cudagraph_modes, ep=None):
    """Refuse a malformed candidate axis in one line, before anything is resolved: widths at most
    WIDTH_LIMIT (a scenario file's), engine limits below the kernel's token limit (a scenario
    file's ``engine`` block's), ep a list of booleans."""
    for name, vals in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens),
                       ("tp", tp or ()), ("dp", dp or ()), ("cudagraph_modes", cudagraph_modes),
                       ("weights", weights or ()), ("ep", ep or ())):
        if isinstance(vals, (str, bytes)) or not hasattr(vals, "__iter__"):
            refuse("expected a list", field=name, value=vals)
    for name, vals in (("tp", tp), ("dp", dp), ("ep", ep), ("weights", weights), ("cudagraph_modes", cudagraph_modes)):
        if vals is not None and not len(vals):     # None is every value; [] would reject every layout
            refuse("expected at least one value (None: every value)", field=name, value=list(vals), has_value=True)
    for name, vals in (("weights", weights or ()), ("cudagraph_modes", cudagraph_modes)):
        for v in vals:
            if not isinstance(v, str):
                refuse("expected names (strings)", field=name, value=v if isinstance(v, (int, float)) else
                       type(v).__name__, has_value=True)
    for name, vals in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
        if not len(vals):
            refuse("expected at least one value", field=name, value=list(vals))
        for v in vals:
            _positive(v, name, integer=True, maximum=INT_TOKEN_LIMIT - 1, why=TOKEN_WHY)
    for name, vals in (("tp", tp or ()), ("dp", dp or ())):
        for v in vals:
            _positive(v, name, integer=True, maximum=WIDTH_LIMIT, why=" (a scenario's widths' limit)")
    for v in ep or ():
        if not isinstance(v, (bool, np.bool_)):
            refuse("expected booleans (True: expert parallelism on, False: off)", field="ep", value=v)
    from .resolve import GRAPH_MODES
    for m in cudagraph_modes:
        if m not in GRAPH_MODES:
            refuse(f"unknown cudagraph mode (known: {', '.join(GRAPH_MODES)})", field="cudagraph_modes", value=m)
    for f in weights or ():
        if f not in DTYPE_BYTES:
            refuse(f"unknown weight format (known: {', '.join(DTYPE_BYTES)})", field="weights", value=f)


def _check_size_args(*, chip, registry, callback, on_candidates, workers, stacked, mesh):
    """The plain arguments of ``size``, refused in one line before anything is resolved."""
    if not isinstance(chip, str):
        refuse("expected a chip name (a string, e.g. 'h200')", field="chip", value=shown(chip), has_value=True)
    check_registry(registry)
    check_callback(callback)
    check_callback(on_candidates, "on_candidates", "a function on_candidates(candidates, context)")
    _whole(workers, source=None, field="workers", what="an integer >= 1", minimum=1)
    if not isinstance(stacked, (bool, np.bool_)):
        refuse("must be True or False", field="stacked", value=stacked, has_value=True)
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
        refuse("must be None or a 1-D jax.sharding.Mesh (sweep.batch_mesh())", field="mesh", value=type(mesh).__name__)


def _check_simulated_prompts(evaluator, requested, simulate, verify, conc, num_prompts, search_prompts) -> int:
    """Refuse, before anything is built, a simulated run past the serving simulation's caps
    (client.MAX_RUN_REQUESTS per run, MAX_SWEEP_REQUESTS per layout's sweep): --num-prompts,
    --search-prompts x C and the default 10 x C, wherever the simulation will run; and a
    ``verify`` other than 0, 1 or 2 (returned as an int)."""
    verify = _whole(verify, source=None, field="verify", what="an integer >= 0")
    if verify > 2:
        refuse("must be 0, 1 (re-run the best layout) or 2 (the best and the runner-up)", field="verify", value=verify)
    if verify and requested != "steady":      # as the CLI's --verify: a silent no-op would read as a check made
        refuse(f"re-runs the steady evaluator's choice under the simulation; evaluator {requested!r} simulates the "
               "frontier and the best already", field="verify", value=verify)
    if num_prompts is not None:
        num_prompts = _positive(num_prompts, "num_prompts", integer=True, maximum=MAX_RUN_REQUESTS,
                                why=" (jaxprice's cap on the requests of one simulated run)")
        if num_prompts < max(conc):       # as the CLI's --num-prompts, and simulate()'s ClosedLoop
            refuse(f"is fewer than the {max(conc)} clients of concurrency {max(conc)}: only {num_prompts} would ever "
                   f"send in a simulated run, yet it would read as C={max(conc)}; give at least {max(conc)} "
                   "(default 10 x C)", field="num_prompts", value=num_prompts)
    if search_prompts is not None:
        search_prompts = _positive(search_prompts, "search_prompts")
        if search_prompts < 1:
            refuse("is prompts per client: below 1 a run has fewer prompts than clients, and C of them never send",
                   field="search_prompts", value=search_prompts)
    sweeps = evaluator == "serve" or (requested == "auto" and simulate > 0)
    if not sweeps:
        return verify
    per_point = [num_prompts or 10 * c for c in conc]
    if evaluator == "serve" and num_prompts is None and search_prompts is not None:
        worst = max(max(int(round(search_prompts * c)), 1) for c in conc)
        if worst > MAX_RUN_REQUESTS:
            refuse(f"{search_prompts:g} x {max(conc)} clients = {worst} prompts in one simulated run, past jaxprice's "
                   f"cap of {MAX_RUN_REQUESTS}", field="search_prompts", value=search_prompts)
        per_point = [max(a, max(int(round(search_prompts * c)), 1)) for a, c in zip(per_point, conc)]
    if sum(per_point) > MAX_SWEEP_REQUESTS:
        refuse(f"the serving simulation's sweep of one layout would hold {sum(per_point)} requests at once "
               f"({'num_prompts' if num_prompts else '10 x C'} prompts at each of {len(conc)} levels), past "
               f"jaxprice's cap of {MAX_SWEEP_REQUESTS} per sweep: sweep fewer or smaller levels",
               field="num_prompts" if num_prompts else "concurrency", value=num_prompts or max(conc))
    return verify


def _check_search_size(evaluator, requested, simulate, conc, num_prompts, search_prompts, layouts: int):
    """Refuse, before anything is priced, a search whose serving simulation would run more than
    MAX_SEARCH_REQUESTS requests: 'serve' simulates every fitting layout (``search_prompts`` x C
    prompts per point), then, as 'auto' does, re-runs at 10 x C (or ``num_prompts``) at most
    ``simulate`` layouts beside the frontier, best and runner-up (counted here as at most one
    layout per concurrency level, plus two)."""
    final_per_layout = sum(int(num_prompts) if num_prompts else 10 * c for c in conc)
    total = 0
    if evaluator == "serve":
        per_layout = (final_per_layout if search_prompts is None or num_prompts
                      else sum(max(int(round(search_prompts * c)), 1) for c in conc))
        total += layouts * per_layout
    if evaluator == "serve" or (requested == "auto" and simulate > 0):
        total += min(layouts, simulate + len(conc) + 2) * final_per_layout
    if total > MAX_SEARCH_REQUESTS:
        refuse(f"the serving simulation of this search would run about {total} requests ({layouts} fitting layouts, "
               f"{len(conc)} concurrency levels up to {max(conc)}), past jaxprice's cap of {MAX_SEARCH_REQUESTS} per "
               "search (hours, and many GB): sweep fewer or smaller levels, narrow the layouts, or use --evaluator "
               "steady", field="concurrency", value=max(conc))


def _check_layout_axes(graph, chip_obj, gpus, *, tp, dp, ep, weights, engine="vllm"):
    """Refuse listed layout values the search would drop or mislabel: a weight format vLLM does
    not serve the checkpoint in on the chip (``weight_formats``; its layouts would be priced at
    the checkpoint's format under another name), expert parallelism for a model without experts
    or on widths of one GPU (``_check_unused_widths`` then refuses a tp or dp value no layout uses)."""
    from .layouts import refuse_weight_format
    for f in weights or ():
        refuse_weight_format(graph, chip_obj, f, field="weights", engine=engine)
    moe = is_moe(graph)
    if ep is not None and True in list(ep):
        if not moe:
            refuse(f"expert parallelism needs experts: {graph.name} has no MoE layer", field="ep", value=True)
        tps = list(tp) if tp else [w for w in WIDTHS if w <= gpus]
        dps = list(dp) if dp else [w for w in WIDTHS if w <= gpus]
        dividing = {t * d for t in tps for d in dps if gpus % (t * d) == 0}
        if dividing == {1}:
            refuse("expert parallelism over one GPU is none: every width tp x dp here is 1 GPU (give more GPUs, "
                   "or --tp / --dp above 1)", field="ep", value=True)


def _check_unused_widths(graph, gpus, layouts, *, tp, dp):
    """Refuse a listed tp or dp value that no layout of the candidate space uses (when some
    layouts exist; none at all is refused naming the GPU count): its widths tp x dp do not
    divide the GPUs, or expert parallelism alone (ep on) leaves out its one-GPU width."""
    moe = is_moe(graph)
    tps = list(tp) if tp else [w for w in WIDTHS if w <= gpus]
    dps = list(dp) if dp else (([w for w in WIDTHS if w <= gpus]) if moe else [1])
    for name, vals, other in (("tp", tp, dps), ("dp", dp, tps)):
        used = {getattr(x, name) for x in layouts}
        for v in vals or ():
            if int(v) in used:
                continue
            widths = sorted({int(v) * int(o) for o in other})
            if all(gpus % w for w in widths):
                refuse(f"no layout uses it: its widths tp x dp ({', '.join(map(str, widths))}) do not divide the "
                       f"{gpus} GPUs (replicas = GPUs / (tp x dp))", field=name, value=int(v))
            refuse("no layout uses it: its only width dividing the GPUs is one GPU, and expert parallelism (ep on) "
                   "needs tp x dp above 1", field=name, value=int(v))


def _refuse_none_fits(graph, chip_obj, chip, gpus, workload, registry, layouts, cands, fabric, gpus_per_node,
                      coefficient_sets=COEFFICIENT_SETS):
    """Refuse a search in which no layout fits, with an example layout's reason and the widths
    (or the fabric) that would let one fit."""
    sample = cands[-1]
    wider = _fitting_widths(graph, chip_obj, chip, gpus, workload.isl, workload.osl, registry, layouts[-1],
                            gpus_per_node, coefficient_sets)
    hint = (f"; {gpus} GPUs is not a multiple of any width tp x dp the model fits at ({', '.join(map(str, wider))})"
            if wider else "")
    across = [c for c in cands if fabric is None and c.layout.width > gpus_per_node]
    if across:
        sample = across[-1]
        hint += f"; the {len(across)} layouts wider than a node need --fabric"
    refuse(f"no layout of {graph.name} fits on {gpus} x {chip} ({len(cands)} tried; e.g. {sample.layout.label}: "
           f"{sample.reason}){hint}", field="gpus", value=gpus)


@dataclasses.dataclass
class _Search:
    """What the search over every fitting layout found, for ``size`` and its info dict."""
    results: list
    steps: int
    plans: set
    compiles: int


def _search(cands, ok, evaluator, workload, conc, *, mesh, stacked, workers, rows_cap, num_prompts,
            search_prompts, search_rule, sim_stats, callback) -> _Search:
    """Evaluate every fitting layout ``cands[k], k in ok``: the steady evaluator's layouts on the
    deployment axis (``stacked``), the simulation's in shared scheduler calls, else one plan at a
    time (the first layout of each distinct plan compiling two at a time: tracing holds the GIL,
    XLA's compile does not, so one thread's compile overlaps the other's tracing). A layout the
    evaluation refuses is rejected with the reason; one priced exactly as an earlier layout is
    listed as its duplicate."""
    shapes: set = set()

    def evaluate(c):
        if evaluator == "serve":
            return evaluate_serve(c.deployment, c.layout, workload, conc, num_prompts=num_prompts)
        rows = _rows(min(math.ceil(max(conc) / c.layout.dp), rows_cap)) + 1
        return evaluate_steady(c.deployment, c.layout, workload, conc, mesh=mesh, rows=rows, shapes=shapes,
                               num_prompts=num_prompts)

    progress = None if callback is None else (lambda d, t, **k: callback(d, t, **k))
    early, compiles0 = {}, _stack_compiles()
    was_stacked = evaluator == "serve" or (stacked and compiles0 is not None)
    if evaluator == "steady" and was_stacked:
        early = dict(zip(ok, evaluate_steady_many(
            [cands[k].deployment for k in ok], [cands[k].layout for k in ok], workload, conc, mesh=mesh,
            rows_cap=rows_cap, num_prompts=num_prompts,
            callback=None if callback is None else (lambda d, t: callback(d, t, stage="price")))))
    elif evaluator == "serve":
        early = dict(zip(ok, evaluate_serve_many(
            [cands[k].deployment for k in ok], [cands[k].layout for k in ok], workload, conc,
            num_prompts=num_prompts, prompts_per_client=search_prompts, stats=sim_stats, callback=progress)))
    else:
        firsts = {}
        for k in ok:
            firsts.setdefault(cands[k].deployment.plan.digest, k)
        if workers > 1 and len(firsts) > 1:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(max_workers=workers) as pool:
                early = dict(zip(firsts.values(), pool.map(lambda k: evaluate(cands[k]), firsts.values())))
    found = _Search([], 0, set(), 0)
    same = {}
    for n, k in enumerate(ok):
        c = cands[k]
        found.plans.add(c.deployment.plan.digest)
        try:
            out = early.pop(k) if k in early else evaluate(c)
            if isinstance(out, JaxpriceError):
                raise out
        except JaxpriceError as err:      # e.g. the serving simulation cannot admit a request
            c.status, c.reason = "rejected", f"{evaluator} evaluation refused: {err.reason}"
            continue
        ttft, tpot, per_gpu, per_user, resident, nsteps = out
        found.steps += nsteps
        res = LayoutResult(k, c.layout, c.replicas, np.asarray(conc), np.asarray(ttft, float),
                           np.asarray(tpot, float), np.asarray(per_gpu, float), np.asarray(per_user, float),
                           np.asarray(resident), source=search_rule if evaluator == "serve" else "steady")
        key = (res.ttft.tobytes(), res.tpot.tobytes(), res.tps_per_gpu.tobytes())
        if key in same:      # e.g. tp1 x dp8 with and without expert parallelism: one plan price
            c.status, c.reason = "duplicate", f"priced the same as {same[key].label}"
        else:
            same[key] = c.layout
            found.results.append(res)
        if callback is not None and not was_stacked:
            callback(n + 1, len(ok), layout=c.layout.parallel_label)
    if evaluator == "steady":
        found.compiles = (_stack_compiles() - compiles0) if was_stacked else len(shapes)
    return found      # the simulation's compiles are counted by simulation_compiles()


def _size_info(*, evaluator, requested, simulate, cands, ok, found: _Search, conc, mesh, source, final_rule,
               search_rule, num_prompts, rounds, sim_stats, sim0, t0, t_resolve, t_search) -> dict:
    """The search's account: layouts considered, priced, rejected, simulated; compiles, steps and
    seconds by stage (``SizeResult.info``; the CLI prints it, ``--json`` carries it)."""
    sim1 = simulation_compiles()
    results = found.results
    sched_compiles, kernel_compiles = sim1["scheduler"] - sim0["scheduler"], sim1["kernel"] - sim0["kernel"]
    seconds_schedule = float(sim_stats.get("seconds_schedule", 0.0))
    seconds_price = float(sim_stats.get("seconds_price", 0.0))
    return {"evaluator": evaluator if not (requested == "auto" and simulate > 0) else "auto (steady + serve)",
            "layouts_considered": len(cands), "layouts_priced": len(ok),
            "layouts_evaluated": len(results),
            "layouts_rejected": sum(c.status == "rejected" for c in cands),
            "layouts_duplicate": sum(c.status == "duplicate" for c in cands),
            "concurrency_levels": len(conc), "points": len(results) * len(conc), "distinct_plans": len(found.plans),
            "compiles": found.compiles + sched_compiles + kernel_compiles,
            "search_compiles": found.compiles, "steps_priced": int(found.steps),
            "devices": 1 if mesh is None else int(mesh.size),
            "seconds_resolve": t_resolve, "seconds": time.perf_counter() - t0, "model_source": source,
            "seconds_search": t_search,
            "layouts_simulated": sum(r.source.startswith("serve") and r.simulated_as is None for r in results),
            "layouts_given_a_twins_run": sum(r.simulated_as is not None for r in results),
            "layouts_simulated_final": sum(r.source == final_rule for r in results),
            "simulated_prompts": ("10 x C" if num_prompts is None else f"{int(num_prompts)}"),
            "search_prompts": (None if evaluator != "serve" else search_rule.replace("serve", "").strip(" ()")
                               or "10 x C"),
            "simulation_rounds": rounds,
            "steps_simulated": int(sim_stats.get("steps", 0)),
            "scheduler_iterations": int(sim_stats.get("scheduler_iterations", 0)),
            "scheduler_compiles": sched_compiles,
            "simulation_kernel_compiles": kernel_compiles,
            "seconds_simulate": seconds_schedule + seconds_price,
            "seconds_schedule": seconds_schedule,
            "seconds_simulate_price": seconds_price}


def _prompt_rules(num_prompts, search_prompts) -> tuple[str, str]:
    """The ``LayoutResult.source`` labels of the simulation's search and of its final re-runs."""
    final = "serve" if num_prompts is None else f"serve ({int(num_prompts)} prompts)"
    if num_prompts is None and search_prompts is None:
        return "serve", final
    return (final if num_prompts is not None else f"serve ({search_prompts:g} x C prompts)"), final


def _candidate_space(model, chip, gpus, workload, registry, *, tp, dp, ep, weights, max_num_seqs,
                     max_num_batched_tokens, cudagraph_modes, gpus_per_node, fabric, engine="vllm", spec_tokens=(0,),
                     acceptance=None, coefficient_sets=COEFFICIENT_SETS):
    """The model, chip and fabric looked up and the layouts resolved into candidates (each ok
    or rejected with its reason): (graph, registry, model source, chip, gpus_per_node, layouts,
    candidates); a workload past the model's length, axes the model or chip cannot take, or GPUs
    no width divides are refused first."""
    graph, registry, source = load_model(model, registry or Registry())
    if graph.max_model_len is not None and workload.isl + workload.osl > graph.max_model_len:
        refuse(f"isl + osl = {workload.isl + workload.osl} tokens exceeds the {graph.max_model_len} tokens "
               f"{graph.name} serves at (its config's max_position_embeddings, as vLLM derives max_model_len)",
               field="isl", value=workload.isl)
    _check_drafter(graph, spec_tokens)
    chip_obj = registry.chip(chip, field="chip")
    gpus_per_node = _positive(gpus_per_node, "gpus_per_node", integer=True, maximum=WIDTH_LIMIT,
                              why=" (a scenario's limit)")
    if fabric is not None:
        registry.network(fabric, field="fabric")
    _check_layout_axes(graph, chip_obj, gpus, tp=tp, dp=dp, ep=ep, weights=weights, engine=engine)
    layouts = candidate_space(graph, chip_obj, gpus, tp=tp, dp=dp, ep=ep, weights=weights,
                              max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                              cudagraph_modes=cudagraph_modes, engine=engine, spec_tokens=spec_tokens,
                              acceptance=acceptance)
    if not layouts:
        widths = sorted({t * d for t in (tp or WIDTHS) for d in (dp or [1])})
        # the widths asked for are the slip when given (size --gpus 1 --tp 2 blamed --gpus)
        field, value = ("tp", tp) if tp else ("dp", dp) if dp else ("gpus", gpus)
        refuse(f"{gpus} GPUs is not a multiple of any width tp x dp in {widths}", field=field, value=value)
    _check_unused_widths(graph, gpus, layouts, tp=tp, dp=dp)
    cands = build_candidates(graph.name, graph, chip, gpus, layouts, isl=workload.isl, osl=workload.osl,
                             registry=registry, gpus_per_node=gpus_per_node, fabric=fabric,
                             coefficient_sets=coefficient_sets)
    return graph, registry, source, chip_obj, gpus_per_node, layouts, cands


def size(model, *, chip: str, gpus: int, isl: int, osl: int, ttft_ms=None, tpot_ms=None,
         concurrency=DEFAULT_CONCURRENCY, tp=None, dp=None, ep=None, weights=None,
         max_num_seqs=DEFAULT_MAX_NUM_SEQS, max_num_batched_tokens=DEFAULT_BATCHED_TOKENS,
         cudagraph_modes=DEFAULT_GRAPH_MODES, range_ratio: float = 0.8, evaluator: str = "auto",
         num_prompts=None, gpus_per_node: int = 8, fabric: str | None = None, mesh=None,
         registry: Registry | None = None, callback=None, on_candidates=None, workers: int = 2, stacked: bool = True,
         verify: int = 0,
         simulate: int | None = None, search_prompts=DEFAULT_SEARCH_PROMPTS, engine: str = "vllm",
         spec_tokens=(0,), acceptance=None, coefficient_files=()) -> SizeResult:
    """Search the layouts of ``model`` on ``gpus`` x ``chip`` for a workload of ``isl`` / ``osl``
    tokens (see the module docstring). engine: 'vllm' (default) or 'sglang' (SGLang engines:
    max_num_seqs and max_num_batched_tokens are its max_running_requests and
    chunked_prefill_size; cudagraph_modes, vLLM's, is refused unless left at its default).
    ``model``: a registry model name or a model graph file.
    ttft_ms, tpot_ms: targets on the means (None: none). concurrency: clients per engine.
    tp, dp, ep, weights, max_num_seqs, max_num_batched_tokens, cudagraph_modes: the candidate
    axes (None for tp/dp/ep/weights: all). evaluator: 'steady', 'serve' or 'auto' (serve when
    the serving simulation is installed, else steady). mesh: a 1-D jax.sharding.Mesh the batch
    axis is sharded over (default: all devices when there are several). callback(done, total,
    **info): progress over the layouts. gpus_per_node: GPUs per node; fabric: the registry
    network joining nodes (ib-400g, roce-200g, ethernet-100gbe), needed for layouts wider than a
    node (without it they are rejected, with that reason). stacked: price the steady
    evaluator's layouts on the deployment axis (one kernel per model structure; False: one
    kernel per plan, ``workers`` threads compiling them). verify: with the steady evaluator, re-run the best (and, for 2,
    the runner-up) layout at its chosen concurrency under the serving simulation where it is
    installed (``SizeResult.verification``). simulate: 'auto' and 'serve': the layouts on the
    frontier, the best and the runner-up are re-run under the serving simulation at the
    benchmark's 10 x C prompts (``num_prompts`` when given), until the frontier of the updated
    numbers is all simulated, and ('auto') at most ``simulate`` more layouts near the targets
    (None: DEFAULT_SIMULATE; refused beside 'steady', which simulates nothing);
    their numbers replace the search's (``LayoutResult.source``; see ``refine``); 0: no re-run. search_prompts: 'serve': prompts per client of the search over every
    layout (2: 2 x C prompts per point; None: 10 x C, no re-run). on_candidates(candidates, context dict): called once the
    candidate space is resolved, before the search (the CLI prints it). spec_tokens: draft counts k
    searched (speculative decoding by the model graph's own drafter, its MTP layers; 0: none, the
    default; k > 0 refused for a graph without one and for SGLang engines); acceptance: the mean
    tokens a decode row emits per step assumed for every k > 0 (an ASSUMPTION, at most 1 + k;
    None: serve.default_acceptance(k)), stated in ``info['speculation']``. coefficient_files:
    coefficient set files (e.g. one ``jaxprice fit`` wrote) every candidate lists after the six
    bundled sets, overriding them by name where their scope reaches it, as a scenario listing them
    would. Bad input raises JaxpriceError before anything is jitted."""
    t0 = time.perf_counter()
    _check_engine(engine, cudagraph_modes)
    spec_tokens, acceptance = _checked_speculation(spec_tokens, acceptance, engine)
    gpus, workload, ttft_t, tpot_t, conc = _checked_workload(gpus, isl, osl, ttft_ms, tpot_ms, concurrency,
                                                             range_ratio)
    requested = evaluator
    evaluator, simulate = _checked_evaluator(evaluator, simulate)
    tp, dp, ep, weights, max_num_seqs, max_num_batched_tokens, cudagraph_modes = (
        list(x) if hasattr(x, "__iter__") and not isinstance(x, (str, bytes)) else x      # a generator, once
        for x in (tp, dp, ep, weights, max_num_seqs, max_num_batched_tokens, cudagraph_modes))
    _check_axes(tp=tp, dp=dp, weights=weights, max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens, cudagraph_modes=cudagraph_modes, ep=ep)
    # whole numbers as ints: tp=[2.0] would resolve layouts "over 4.0 ranks" and reject them
    tp, dp = (None if x is None else [int(v) for v in x] for x in (tp, dp))
    max_num_seqs, max_num_batched_tokens = ([int(v) for v in x] for x in (max_num_seqs, max_num_batched_tokens))
    _check_size_args(chip=chip, registry=registry, callback=callback, on_candidates=on_candidates, workers=workers,
                     stacked=stacked, mesh=mesh)
    verify = _check_simulated_prompts(evaluator, requested, simulate, verify, conc, num_prompts, search_prompts)
    sets = COEFFICIENT_SETS + coefficient_set_files(coefficient_files, field="coefficient_files")
    space = _candidate_space(model, chip, gpus, workload, registry, tp=tp, dp=dp, ep=ep, weights=weights,
                             max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                             cudagraph_modes=cudagraph_modes, gpus_per_node=gpus_per_node, fabric=fabric,
                             engine=engine, spec_tokens=spec_tokens, acceptance=acceptance, coefficient_sets=sets)
    graph, registry, source, chip_obj, gpus_per_node, layouts, cands = space
    t_resolve = time.perf_counter() - t0
    _check_search_size(evaluator, requested, simulate, conc, num_prompts, search_prompts,
                       sum(c.status == "ok" for c in cands))
    if on_candidates is not None:
        on_candidates(cands, {"model": graph.name, "model_source": source, "chip": chip, "gpus": gpus,
                              "workload": workload, "fabric": fabric, "gpus_per_node": gpus_per_node,
                              "engine": engine, "coefficient_sets": sets, "graph": graph})
    ok = [k for k, c in enumerate(cands) if c.status == "ok"]
    if not ok:
        _refuse_none_fits(graph, chip_obj, chip, gpus, workload, registry, layouts, cands, fabric, gpus_per_node, sets)
    if callback is not None:
        callback(0, len(ok), layout="")
    if mesh is None and jax.device_count() > 1:
        from .sweep import batch_mesh
        mesh = batch_mesh()
    sim_stats: dict = {}
    sim0 = simulation_compiles()
    search_rule, final_rule = _prompt_rules(num_prompts, search_prompts)
    found = _search(cands, ok, evaluator, workload, conc, mesh=mesh, stacked=stacked, workers=workers,
                    rows_cap=max(max_num_seqs), num_prompts=num_prompts, search_prompts=search_prompts,
                    search_rule=search_rule, sim_stats=sim_stats, callback=callback)
    t_search = time.perf_counter() - t0
    rounds = 0
    if simulate > 0 and found.results and not (evaluator == "serve" and search_rule == final_rule):
        found.results, rounds = refine(found.results, cands, workload, conc, ttft_t, tpot_t, limit=simulate,
                                       num_prompts=num_prompts, first="near", rule=final_rule, stats=sim_stats,
                                       callback=None if callback is None else (lambda d, t, **k: callback(d, t, **k)))
    results = found.results
    frontier, best, runner, margin, miss = choose(results, ttft_t, tpot_t)
    if best is None and ttft_t is not None and results:     # a TTFT no layout can reach, whatever its speed
        adm = min(admission_latency(cands[r.index].deployment.coefficients, workload.mean_isl) for r in results)
        if adm >= ttft_t:
            miss += (f"; every TTFT holds the request's host admission latency, {adm * 1e3:.1f} ms (the registry's "
                     f"host_admission_per_request + _per_token x prompt tokens), at or over the "
                     f"{ttft_t * 1e3:g} ms target: no layout can meet it")
    verification = []
    if verify and evaluator == "steady" and _serve_module() is not None:
        verification = [verify_point(cands[results[ref[0]].index], results[ref[0]], ref[1], workload, ttft_t,
                                     tpot_t, num_prompts=num_prompts)
                        for ref in [r for r in (best, runner) if r is not None][:int(verify)]]
    info = _size_info(evaluator=evaluator, requested=requested, simulate=simulate, cands=cands, ok=ok, found=found,
                      conc=conc, mesh=mesh, source=source, final_rule=final_rule, search_rule=search_rule,
                      num_prompts=num_prompts, rounds=rounds, sim_stats=sim_stats, sim0=sim0, t0=t0,
                      t_resolve=t_resolve, t_search=t_search)
    spec_info = speculation_info(spec_tokens, acceptance)
    if spec_info is not None:          # only when speculation was searched: the info as before otherwise
        info["speculation"] = spec_info
    return SizeResult(model=graph.name, chip=chip, gpus=gpus, workload=workload, ttft_target=ttft_t,
                      tpot_target=tpot_t, candidates=cands, results=results, frontier=frontier, best=best,
                      runner_up=runner, margin=margin, miss=miss, info=info, graph=graph, registry=registry,
                      model_source=source, verification=verification,
                      tied=tied_with_best(results, ttft_t, tpot_t), engine=engine, coefficient_sets=sets)


# ----------------------------------------------------------------------------- figure


def plot(result: SizeResult, path, *, title=None) -> Path:
    """Tokens/s per GPU against tokens/s per user: one curve per evaluated layout (thin, its
    concurrency sweep), the Pareto frontier (thick), the TPOT target as a vertical line at
    1 / TPOT, points missing the TTFT target hollow, the best layout highlighted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 6))
    cmap = plt.get_cmap("tab10")
    parallels = list(dict.fromkeys(r.layout.parallel_label for r in result.results))
    colour = {p: cmap(k % 10) for k, p in enumerate(parallels)}
    mixed = len({r.source == "steady" for r in result.results}) > 1
    for r in result.results:      # dashed: the steady state's numbers beside simulated ones
        ax.plot(r.tps_per_user, r.tps_per_gpu, "--" if mixed and r.source == "steady" else "-",
                lw=0.6 if r.source == "steady" else 0.9, alpha=0.45, color=colour[r.layout.parallel_label])
        if result.ttft_target is not None:
            bad = r.ttft > result.ttft_target
            ax.plot(r.tps_per_user[bad], r.tps_per_gpu[bad], "o", ms=2.5, mfc="none", mew=0.5,
                    color=colour[r.layout.parallel_label], alpha=0.5)
    for p in parallels:
        ax.plot([], [], "-", color=colour[p], label=p)
    if mixed:
        ax.plot([], [], "-", color="grey", label="serving simulation (10 x C prompts)" if any(
            r.source == "serve" for r in result.results) else "serving simulation")
        ax.plot([], [], "--", color="grey", label="closed-form steady state")
    if result.frontier:
        fx = [result.results[i].tps_per_user[j] for i, j in result.frontier]
        fy = [result.results[i].tps_per_gpu[j] for i, j in result.frontier]
        ax.plot(fx, fy, "-o", color="k", lw=2, ms=3.5, label="Pareto frontier"
                + (" (points meeting TTFT)" if result.ttft_target is not None else ""), zorder=5)
    if result.tpot_target is not None:
        ax.axvline(1.0 / result.tpot_target, color="C3", ls="--", lw=1.2,
                   label=f"TPOT target {result.tpot_target * 1e3:g} ms (1/TPOT)")
        ax.axvspan(ax.get_xlim()[0] if ax.get_xlim()[0] > 0 else 1e-3, 1.0 / result.tpot_target, color="C3",
                   alpha=0.05)
    if result.best is not None:
        b = result.point(result.best)
        ax.plot([b["tokens_per_s_per_user"]], [b["tokens_per_s_per_gpu"]], "*", ms=16, color="gold", mec="k",
                zorder=6, label=f"best: {b['label']} @ C={b['concurrency_per_engine']}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("output tokens/s per user (1 / mean TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    tgt = []
    if result.ttft_target is not None:
        tgt.append(f"TTFT <= {result.ttft_target * 1e3:g} ms (hollow: missed)")
    if result.tpot_target is not None:
        tgt.append(f"TPOT <= {result.tpot_target * 1e3:g} ms")
    ax.set_title(title or (f"{result.model} on {result.gpus} x {result.chip}, ISL {result.workload.isl} / OSL "
                           f"{result.workload.osl}: {result.info['layouts_evaluated']} layouts x "
                           f"{result.info['concurrency_levels']} concurrencies ({result.info['evaluator']})"
                           + ("\n" + ", ".join(tgt) if tgt else "")), fontsize=9)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
