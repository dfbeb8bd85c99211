"""The spec's figure: one step of DeepSeek-V3 on 8 H200 (fp8, tp8) against batch size.

    python experiments/figure_step.py [--out experiments/results/step_anatomy.png]

Every request decodes one token against a 4,096-token context (after the step), decode
threshold 8, batch sizes 1, 2, 4, ..., 256, priced in one vmapped call (exact mode). Left:
the time each resource needs over the step (a resource that is zero everywhere, here NIC,
is not drawn; the bottleneck of each point is ringed). Right: NoOverlap and Overlap on the
same scale. It prints the table and checks each statement of the spec's caption
(pricing-a-step.md) against the numbers, so a change to the kernel that breaks the caption
shows here. The same figure comes from
``jaxprice price deepseek-v3-h200-fp8-sglang-tp8 --decode 1,2,4,...,256 --plot FILE.png``.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import jaxprice as jp  # noqa: E402
from jaxprice._src.figures import describe_bottleneck, plot_step_curve  # noqa: E402

SCENARIO = "deepseek-v3-h200-fp8-sglang-tp8"
CONTEXT = 4096
THRESHOLD = 8
SIZES = [1 << k for k in range(9)]
CAPTION = ("DeepSeek-V3 served in fp8 on 8 H200 GPUs at tensor-parallel width 8 "
           f"(testdata/aisimulate/{SCENARIO}.yaml); every request decodes one token against a "
           f"{CONTEXT:,}-token context; decode threshold {THRESHOLD}. No collective leaves the node, so NIC carries "
           "nothing and is not drawn. NoOverlap is the sum of the lines on the left; Overlap lets each layer's "
           "resources work at once. Computed by jaxprice (exact mode) at batch sizes that are powers of two, "
           "joined by straight lines.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results", "step_anatomy.png"))
    args = ap.parse_args(argv)

    dep = jp.load_deployment(SCENARIO)
    batches = jp.Batch.stack([jp.Batch.decode(b, CONTEXT, pad_to=max(SIZES), decode_threshold=THRESHOLD)
                              for b in SIZES])
    r = jp.price_many(dep.plan, dep.coefficients, batches)
    res = np.asarray(r.resources) * 1e3
    ov, no = np.asarray(r.overlap) * 1e3, np.asarray(r.no_overlap) * 1e3
    bott = np.asarray(r.bottleneck)

    print(f"{SCENARIO}: B requests x (1 token, context {CONTEXT}), decode threshold {THRESHOLD}; ms")
    print(f"{'B':>4}" + "".join(f"{n:>9}" for n in jp.RESOURCES) + f"{'Overlap':>9}{'NoOverlap':>10}  bottleneck")
    for i, b in enumerate(SIZES):
        print(f"{b:>4}" + "".join(f"{v:9.3f}" for v in res[i]) + f"{ov[i]:9.3f}{no[i]:10.3f}  "
              f"{jp.RESOURCES[int(bott[i])]}")

    sm, host = res[0, 0], res[0, 4]
    checks = [
        ("bottleneck host at 1-2, HBM at 4-256", describe_bottleneck(SIZES, bott) == "host at 1\u20132, HBM at 4\u2013256",
         describe_bottleneck(SIZES, bott)),
        ("host and SM within 1% at one request (3.54, 3.51 ms)", abs(host - sm) / host < 0.01 and
         round(host, 2) == 3.54 and round(sm, 2) == 3.51, f"host {host:.3f}, SM {sm:.3f}"),
        ("NIC carries nothing", bool(np.all(res[:, 3] == 0)), f"max NIC {res[:, 3].max():.3g}"),
        ("step x about 6 from 1 to 256 requests", round(no[-1] / no[0]) == 6 and round(ov[-1] / ov[0]) == 6,
         f"NoOverlap x{no[-1] / no[0]:.2f}, Overlap x{ov[-1] / ov[0]:.2f}"),
        ("time per request / about 45", round((no[0] / 1) / (no[-1] / 256)) == 45,
         f"NoOverlap /{(no[0] / 1) / (no[-1] / 256):.1f}, Overlap /{(ov[0] / 1) / (ov[-1] / 256):.1f}"),
        ("NoOverlap is the sum of the resources", bool(np.allclose(res.sum(1), no, rtol=1e-12)), ""),
    ]
    print("\nthe spec's caption, checked:")
    for what, ok, got in checks:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}" + (f"  ({got})" if got else ""))

    plot_step_curve(SIZES, r, path=args.out, units="ms", xlabel="requests in the batch (each decoding 1 token)",
                    title=f"One step of DeepSeek-V3 on 8 x H200 (fp8, tp8) at context {CONTEXT:,}", caption=CAPTION,
                    per="request")
    print(f"\nwrote {args.out}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
