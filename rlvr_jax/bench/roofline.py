"""`rlvr-bench roofline`: this machine's measured matmul throughput and memory bandwidth.

The numbers are the denominators of every "fraction of roofline" this package reports
(DESIGN.md: on a CPU the fp32 matmul peak is the denominator). They are measured, not read
from a spec sheet: a square matmul of `size`×`size` in fp32 and bf16, jitted, best of
several timed runs; and a streaming in-place `x = x + 1` over a large fp32 array (bytes read
+ written per second).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rlvr_jax.bench import progress


def _best_seconds(fn: Callable[[], jax.Array], *, repeats: int, trials: int) -> float:
    """Best (over `trials`) mean wall time of `repeats` back-to-back calls of `fn`."""
    fn().block_until_ready()  # compile + warm caches
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(repeats):
            out = fn()
        out.block_until_ready()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def matmul_gflops(size: int, dtype: jnp.dtype, *, repeats: int = 5, trials: int = 3) -> float:
    """GFLOP/s of a jitted `size`×`size` @ `size`×`size` matmul in `dtype` (2·n³ FLOPs)."""
    if size <= 0:
        raise ValueError(f"matmul size must be positive, got {size}")
    key_a, key_b = jax.random.split(jax.random.key(0))
    a_NxN = jax.random.normal(key_a, (size, size), jnp.float32).astype(dtype)
    b_NxN = jax.random.normal(key_b, (size, size), jnp.float32).astype(dtype)
    matmul = jax.jit(lambda a, b: jnp.einsum("ij,jk->ik", a, b))
    seconds = _best_seconds(lambda: matmul(a_NxN, b_NxN), repeats=repeats, trials=trials)
    return 2.0 * size**3 / seconds / 1e9


def memory_gbps(mib: int, *, repeats: int = 5, trials: int = 3) -> float:
    """GB/s of a jitted streaming `x + 1` over `mib` MiB of fp32 (counts read + write)."""
    if mib <= 0:
        raise ValueError(f"bandwidth probe size must be positive, got {mib} MiB")
    n = mib * 2**20 // 4
    # Donated in place: a fresh 256 MiB output per call would time page faults, not DRAM.
    add_one = jax.jit(lambda x: x + 1.0, donate_argnums=0)
    state = {"x": jnp.zeros((n,), jnp.float32)}

    def step() -> jax.Array:
        state["x"] = add_one(state["x"])
        return state["x"]

    seconds = _best_seconds(step, repeats=repeats, trials=trials)
    return 2.0 * n * 4 / seconds / 1e9


def machine_info() -> dict:
    """Where the numbers were measured: platform, device kind and count, host CPU count."""
    import os

    device = jax.devices()[0]
    return {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "n_devices": jax.device_count(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "jax": jax.__version__,
    }


def measure_roofline(*, size: int = 2048, bandwidth_mib: int = 256) -> dict:
    """Measures the roofline of the default JAX device.

    Returns `{"matmul_gflops": {"float32": .., "bfloat16": ..}, "memory_gbps": ..,
    "peak_gflops": .. (the fp32 matmul figure, DESIGN.md's CPU denominator; on
    accelerators the larger of the two dtypes), "config": {...}, "machine": {...}}`.
    """
    progress.line(f"roofline: {size}^3 matmuls, {bandwidth_mib} MiB bandwidth probe")
    gflops = {
        "float32": matmul_gflops(size, jnp.float32),
        "bfloat16": matmul_gflops(size, jnp.bfloat16),
    }
    machine = machine_info()
    peak = gflops["float32"] if machine["platform"] == "cpu" else max(gflops.values())
    return {
        "matmul_gflops": gflops,
        "memory_gbps": memory_gbps(bandwidth_mib),
        "peak_gflops": peak,
        "config": {"matmul_size": size, "bandwidth_mib": bandwidth_mib},
        "machine": machine,
    }


def main(argv: list[str] | None = None) -> int:
    """`rlvr-bench roofline [--json FILE] [--size N] [--mib M] [--quick]`."""
    p = argparse.ArgumentParser(prog="rlvr-bench roofline", description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write the results here as JSON")
    p.add_argument("--size", type=int, default=2048, help="square matmul size (default 2048)")
    p.add_argument("--mib", type=int, default=256, help="bandwidth probe array size in MiB")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    args = p.parse_args(argv)
    size, mib = (256, 16) if args.quick else (args.size, args.mib)
    result = measure_roofline(size=size, bandwidth_mib=mib)
    for dtype, value in result["matmul_gflops"].items():
        print(f"matmul {size}^3 {dtype:9s} {value:10.1f} GFLOP/s")
    print(f"memory bandwidth        {result['memory_gbps']:10.1f} GB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
