"""SGLang's closed-form steady state (size.sglang_steady_state_requests) against the serving
simulation (serve.py, scheduler sglang) on the same built candidates.

    python experiments/sglang_steady_vs_serve.py [--quick] [--out experiments/out/sglang_steady_vs_serve.txt]

Cases: Llama-3.1-8B on one H100 (tp1, fp8, max_running_requests 256, chunk 8192) and DeepSeek-V3
on 8 H200 (tp8, fp8, the same limits; and tp1 x dp8 with expert parallelism, SGLang's DP attention,
its ranks in lockstep), ISL/OSL 1k/1k and 1k/128, C = 16, 64, 256 clients. Two
simulations per point: the benchmark's 10 x C prompts (its means, the first wave's burst of C
prompts at once included: the closed form leaves it out), and a longer run of 40 x C prompts
whose second half, once the first wave's lockstep has mixed out, is the steady state the closed
form describes (--quick: 3 x C and 12 x C). Prints TTFT and TPOT of each, tokens/s per GPU of
the steady state and the 10 x C run, and the ratios.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import jaxprice as jp  # noqa: E402
from jaxprice._src import layouts as L  # noqa: E402
from jaxprice._src import size as S  # noqa: E402
from jaxprice._src.formats import Registry  # noqa: E402

CASES = [("llama-3.1-8b-instruct", "h100", L.Layout(1, 1, False, "fp8", 256, 8192, L.SGLANG_GRAPH_MODE, "sglang")),
         ("deepseek-v3", "h200", L.Layout(8, 1, False, "fp8", 256, 8192, L.SGLANG_GRAPH_MODE, "sglang")),
         ("deepseek-v3", "h200", L.Layout(1, 8, True, "fp8", 256, 8192, L.SGLANG_GRAPH_MODE, "sglang"))]
SHAPES = [(1024, 1024), (1024, 128)]
CONC = [16, 64, 256]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 x C prompts per simulated point (default 10 x C)")
    ap.add_argument("--cases", default="all", help="'llama', 'deepseek' or 'all'")
    ap.add_argument("--out", default=None, help="also write the table here")
    args = ap.parse_args(argv)
    reg = Registry()
    lines = [f"{'case':<36}{'C':>5}{'R':>5} {'TTFT ms std/10xC/2nd':>22} {'TPOT ms std/10xC/2nd':>22} "
             f"{'tok/s/GPU std/10xC':>19} {'std/2nd: TTFT':>13}{'TPOT':>7}  {'std/10xC: TPOT':>14}{'tok/s':>7}"]
    print(lines[0], flush=True)
    for model, chip, lay in CASES:
        if args.cases != "all" and args.cases not in model:
            continue
        graph = reg.model(model)
        for isl, osl in SHAPES:
            cand = L.build_candidates(model, graph, chip, lay.width, [lay], isl=isl, osl=osl, registry=reg)[0]
            assert cand.status == "ok", cand.reason
            wl = S.SizeWorkload(isl, osl)
            t0 = time.perf_counter()
            st = S.evaluate_steady(cand.deployment, lay, wl, CONC)
            for j, c in enumerate(CONC):
                sim = S.evaluate_serve(cand.deployment, lay, wl, [c], num_prompts=3 * c if args.quick else None)
                n = (12 if args.quick else 40) * c
                run = jp.simulate(cand.deployment, jp.Workload(isl, osl), jp.ClosedLoop(c, n))
                half = slice(n // 2, None)
                ttft2 = float(np.mean(np.asarray(run.requests["ttft"])[half]))
                tpot2 = float(np.nanmean(np.asarray(run.requests["tpot"])[half]))
                a = (st[0][j] * 1e3, sim[0][0] * 1e3, ttft2 * 1e3)
                b = (st[1][j] * 1e3, sim[1][0] * 1e3, tpot2 * 1e3)
                g = (st[2][j], sim[2][0])
                name = f"{model} {chip}{' dp8 ep' if lay.dp > 1 else ''} {isl}/{osl}"
                line = (f"{name:<36}{c:>5}{int(st[4][j]):>5} "
                        f"{a[0]:>6.1f}/{a[1]:>6.1f}/{a[2]:<7.1f} {b[0]:>6.2f}/{b[1]:>6.2f}/{b[2]:<7.2f} "
                        f"{g[0]:>8.1f}/{g[1]:<9.1f} {a[0] / a[2]:>13.3f}{b[0] / b[2]:>7.3f}  {b[0] / b[1]:>14.3f}"
                        f"{g[0] / g[1]:>7.3f}")
                lines.append(line)
                print(line, flush=True)
            print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
