"""Multi-device: a sweep sharded over the batch axis with jax.sharding.

The test process has already initialised JAX with one CPU device, so the multi-device case
runs in a fresh interpreter with ``--xla_force_host_platform_device_count=4``: four virtual
host devices, the same runtime a multi-device or multi-host sweep runs on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import jaxprice as jp
from jaxprice._src.sweep import batch_mesh, price_sharded, random_batches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = textwrap.dedent("""
    import json
    import jax, numpy as np
    import jaxprice as jp
    from jax.sharding import Mesh, PartitionSpec
    from jaxprice._src.sweep import batch_mesh, price_sharded, random_batches, shard_batches

    out = {"devices": jax.device_count()}
    dep = jp.load_deployment("deepseek-v3-h200-fp8-sglang-tp8")
    batches = random_batches(np.random.default_rng(3), 10, 32, decode_threshold=8)   # 10: not a multiple of 4
    for t in (None, 0.05):
        ref = jp.price_many(dep.plan, dep.coefficients, batches, temperature=t)
        got = price_sharded(dep.plan, dep.coefficients, batches, temperature=t)
        meshes = (got, price_sharded(dep.plan, dep.coefficients, batches, mesh=batch_mesh(jax.devices()[:2]))) \
            if t is None else (got,)
        key = str(t)
        out[key] = {
            "shape": list(got.no_overlap.shape),
            "rel_err": max(float(np.max(np.abs(np.asarray(getattr(g, f)) - np.asarray(getattr(ref, f)))
                                        / np.maximum(np.abs(np.asarray(getattr(ref, f))), 1e-300)))
                           for g in meshes for f in ("no_overlap", "overlap", "resources")),
            "bitwise": all(np.array_equal(np.asarray(getattr(g, f)), np.asarray(getattr(ref, f)))
                           for g in meshes for f in ("no_overlap", "overlap", "resources")),
            "bottleneck": bool(np.array_equal(np.asarray(got.bottleneck), np.asarray(ref.bottleneck))),
        }
    mesh = batch_mesh()
    sharded, n = shard_batches(batches, mesh)
    out["padded"] = {"n": n, "rows": list(sharded.scheduled.shape), "spec": list(sharded.scheduled.sharding.spec),
                     "shards": sorted(s.data.shape[0] for s in sharded.scheduled.addressable_shards),
                     "devices": len({s.device for s in sharded.scheduled.addressable_shards}),
                     "pad_is_empty": bool(not np.asarray(sharded.mask)[n:].any())}
    res = price_sharded(dep.plan, dep.coefficients, batches)
    out["result_devices"] = len(res.no_overlap.sharding.device_set)
    try:
        price_sharded(dep.plan, dep.coefficients, batches,
                      mesh=Mesh(np.asarray(jax.devices()).reshape(2, 2), ("a", "b")))
        out["two_d"] = "accepted"
    except jp.JaxpriceError as e:
        out["two_d"] = str(e)
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def four_devices():
    # (compiled fast: both sides of each comparison are compiled alike)
    flags = ("--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0 "
             "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1")
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", WORKER], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_four_virtual_devices(four_devices):
    assert four_devices["devices"] == 4


@pytest.mark.parametrize("key", ["None", "0.05"])
def test_sharded_sweep_equals_one_device(four_devices, key):
    r = four_devices[key]
    assert r["shape"] == [10]                       # the padding is trimmed off
    assert r["rel_err"] <= 1e-12, r                 # the partitioned program may round differently
    assert r["bottleneck"]


def test_the_batch_axis_is_padded_and_split_over_every_device(four_devices):
    p = four_devices["padded"]
    assert p["n"] == 10 and p["rows"] == [12, 32]   # 10 batches padded to a multiple of 4
    assert p["spec"] == ["batch"]
    assert p["shards"] == [3, 3, 3, 3] and p["devices"] == 4
    assert p["pad_is_empty"]                        # padding batches are all padding rows
    assert four_devices["result_devices"] == 4


def test_a_mesh_that_is_not_1d_is_refused(four_devices):
    assert "1-D mesh" in four_devices["two_d"]


def test_one_device_sharded_equals_price_many():
    dep = jp.load_deployment("llama-3.1-70b-instruct-h200-fp8-vllm-tp4")
    batches = random_batches(np.random.default_rng(3), 5, 23, decode_threshold=8)
    assert batch_mesh().size == jax.device_count() == 1
    got = price_sharded(dep.plan, dep.coefficients, batches)
    ref = jp.price_many(dep.plan, dep.coefficients, batches)
    assert np.allclose(np.asarray(got.no_overlap), np.asarray(ref.no_overlap), rtol=1e-12, atol=0)
    with pytest.raises(jp.JaxpriceError, match="leading batch axis"):
        price_sharded(dep.plan, dep.coefficients, jax.tree_util.tree_map(lambda x: x[0], batches))
