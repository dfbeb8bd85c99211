"""The size search's closed-form steady state (size.steady_state_requests for vLLM,
size.sglang_steady_state_requests for SGLang) against the serving simulation (serve.py) on the
same built candidates.

    python experiments/steady_vs_serve.py [--engines vllm,sglang,vllm-mtp2] [--quick]
        [--out experiments/results/steady_vs_serve.txt]

Cases: Llama-3.1-8B on one H100 (tp1, fp8, max_num_seqs / max_running_requests 256, budget /
chunk 8192) and DeepSeek-V3 on 8 H200 (tp8, fp8, the same limits; and tp1 x dp8 with expert
parallelism, its ranks in lockstep), ISL/OSL 1k/1k and 1k/128, C = 16, 64, 256 clients, each
engine. Two simulations per point: the benchmark's 10 x C prompts (its means, the first wave of C
prompts at once included), and a longer run of 40 x C prompts whose second half, once the first
wave has mixed out, is the steady state alone. The closed form gives both: its TTFT at the
benchmark's 10 x C prompts (the first wave's share at ``size.first_wave``'s time) and with
num_prompts = inf (the steady state alone). Prints TTFT and TPOT of each, tokens/s per GPU of the
closed form and the 10 x C run, and the ratios (--quick: 3 x C and 12 x C).

``vllm-mtp2``: the vLLM layouts with speculative decoding, 2 draft tokens a step by the model's
own MTP layer (DeepSeek-V3's cases only: Llama-3.1-8B has no drafter), at the assumed acceptance
``serve.default_acceptance(2)`` in the closed form and the simulation alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import jaxprice as jp  # noqa: E402
from jaxprice._src import layouts as L  # noqa: E402
from jaxprice._src import size as S  # noqa: E402
from jaxprice._src.formats import Registry  # noqa: E402

CASES = [("llama-3.1-8b-instruct", "h100", 1, 1, False), ("deepseek-v3", "h200", 8, 1, False),
         ("deepseek-v3", "h200", 1, 8, True)]
SHAPES = [(1024, 1024), (1024, 128)]
CONC = [16, 64, 256]


SPEC = {"vllm-mtp2": 2}        # engine label -> draft tokens a step (vLLM engines)


def layout(engine: str, tp: int, dp: int, ep: bool) -> L.Layout:
    mode = L.SGLANG_GRAPH_MODE if engine == "sglang" else "FULL_AND_PIECEWISE"
    base = L.Layout(tp, dp, ep, "fp8", 256, 8192, mode, "vllm" if engine in SPEC else engine)
    return dataclasses.replace(base, spec_tokens=SPEC[engine]) if engine in SPEC else base


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="vllm,sglang,vllm-mtp2",
                    help="engines, comma-separated (vllm, sglang, vllm-mtp2: vLLM speculating 2 tokens a step)")
    ap.add_argument("--quick", action="store_true", help="3 x C prompts per simulated point (default 10 x C)")
    ap.add_argument("--cases", default="all", help="'llama', 'deepseek' or 'all'")
    ap.add_argument("--out", default=None, help="also write the table here")
    args = ap.parse_args(argv)
    reg = Registry()
    head = (f"{'case':<43}{'C':>5}{'R':>5} {'TTFT ms 10xC: form/sim':>23} {'steady: form/sim':>18} "
            f"{'TPOT ms form/10xC/2nd':>22} {'tok/s/GPU form/10xC':>20} {'TTFT 10xC':>10}{'steady':>8}"
            f"{'TPOT 2nd':>9}{'10xC':>7}{'tok/s':>7}")
    lines = [head]
    print(head, flush=True)
    ratios = {}
    t_all = time.perf_counter()
    for engine in args.engines.split(","):
        for model, chip, tp, dp, ep in CASES:
            if args.cases != "all" and args.cases not in model:
                continue
            if engine in SPEC and reg.model(model).speculator is None:
                continue                      # no drafter: nothing to speculate with
            lay = layout(engine, tp, dp, ep)
            graph = reg.model(model)
            for isl, osl in SHAPES:
                cand = L.build_candidates(model, graph, chip, lay.width, [lay], isl=isl, osl=osl, registry=reg)[0]
                assert cand.status == "ok", cand.reason
                wl = S.SizeWorkload(isl, osl)
                alone = S.evaluate_steady(cand.deployment, lay, wl, CONC, num_prompts=math.inf)
                for j, c in enumerate(CONC):
                    prompts = 3 * c if args.quick else 10 * c
                    b = [np.asarray(x)[0] for x in S.evaluate_steady(cand.deployment, lay, wl, [c],
                                                                      num_prompts=prompts)[:5]]
                    sim = S.evaluate_serve(cand.deployment, lay, wl, [c], num_prompts=prompts)
                    n = (12 if args.quick else 40) * c
                    run = jp.simulate(cand.deployment, jp.Workload(isl, osl), jp.ClosedLoop(c, n),
                                      acceptance=lay.tokens_per_step if lay.spec_tokens else None)
                    half = slice(n // 2, None)
                    ttft2 = float(np.mean(np.asarray(run.requests["ttft"])[half]))
                    tpot2 = float(np.nanmean(np.asarray(run.requests["tpot"])[half]))
                    r = {"ttft_10xC": b[0] / sim[0][0], "ttft_steady": alone[0][j] / ttft2,
                         "tpot_2nd": b[1] / tpot2, "tpot_10xC": b[1] / sim[1][0],
                         "tps_10xC": b[2] / sim[2][0]}
                    for k, v in r.items():
                        ratios.setdefault((engine, k), []).append(v)
                    name = f"{engine} {model} {chip}{f' dp{dp} ep' if dp > 1 else f' tp{tp}'} {isl}/{osl}"
                    line = (f"{name:<43}{c:>5}{int(b[4]):>5} "
                            f"{b[0] * 1e3:>10.1f}/{sim[0][0] * 1e3:<10.1f}"
                            f" {alone[0][j] * 1e3:>8.1f}/{ttft2 * 1e3:<8.1f}"
                            f" {b[1] * 1e3:>6.2f}/{sim[1][0] * 1e3:>6.2f}/{tpot2 * 1e3:<7.2f}"
                            f" {b[2]:>9.1f}/{sim[2][0]:<9.1f} {r['ttft_10xC']:>10.3f}{r['ttft_steady']:>8.3f}"
                            f"{r['tpot_2nd']:>9.3f}{r['tpot_10xC']:>7.3f}{r['tps_10xC']:>7.3f}")
                    lines.append(line)
                    print(line, flush=True)
    lines.append("")
    lines.append("closed form / simulation, range over the points (TTFT 10xC: the benchmark mean against the "
                 "10 x C run's; steady: num_prompts = inf against the 40 x C run's second half):")
    for (engine, k), v in ratios.items():
        lines.append(f"  {engine:<10}{k:<12} {min(v):.3f} - {max(v):.3f}  (median {float(np.median(v)):.3f})")
    lines.append(f"({time.perf_counter() - t_all:.0f} s)")
    print("\n".join(lines[-len(ratios) - 3:]), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
