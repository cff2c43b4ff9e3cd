"""`rlvr-bench roofline`: this machine's measured matmul throughput and memory bandwidth, the
denominators of every "fraction of roofline" (DESIGN.md: on a CPU the fp32 matmul peak):
jitted square matmuls in fp32 and bf16 and a streaming in-place `x = x + 1` over fp32 (bytes
read + written per second), best of several timed runs."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rlvr_jax.bench import progress
from rlvr_jax.bench.common import datasheet, machine_info
from rlvr_jax.bench.table import Bench


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


def default_sizes(quick: bool = False) -> dict[str, int]:
    """Probe sizes: tiny (`quick`), 2048^3 and 256 MiB on a CPU, 8192^3 and 1 GiB elsewhere."""
    if quick:
        return {"size": 256, "bandwidth_mib": 16}
    if jax.default_backend() == "cpu":
        return {"size": 2048, "bandwidth_mib": 256}
    return {"size": 8192, "bandwidth_mib": 1024}


def measure_roofline(*, size: int = 2048, bandwidth_mib: int = 256) -> dict:
    """`matmul_gflops` per dtype, `memory_gbps`, `peak_gflops` (fp32 on a CPU, the larger dtype
    on accelerators) and the `datasheet` entry with the fractions of it achieved."""
    progress.line(f"roofline: {size}^3 matmuls, {bandwidth_mib} MiB bandwidth probe")
    gflops = {
        "float32": matmul_gflops(size, jnp.float32),
        "bfloat16": matmul_gflops(size, jnp.bfloat16),
    }
    gbps = memory_gbps(bandwidth_mib)
    machine = machine_info()
    peak = gflops["float32"] if machine["platform"] == "cpu" else max(gflops.values())
    sheet = datasheet(machine["device_kind"])
    if sheet is not None:
        sheet["bf16_fraction"] = gflops["bfloat16"] / (sheet["bf16_tflops"] * 1e3)
        sheet["memory_fraction"] = gbps / sheet["hbm_gbps"]
    return {
        "matmul_gflops": gflops,
        "memory_gbps": gbps,
        "peak_gflops": peak,
        "datasheet": sheet,
        "config": {"matmul_size": size, "bandwidth_mib": bandwidth_mib},
        "machine": machine,
    }


def best_roofline(quick: bool = False) -> dict:
    """The higher-peak of two `measure_roofline` probes at `default_sizes`."""
    sizes = default_sizes(quick)
    roof = max(measure_roofline(**sizes), measure_roofline(**sizes), key=lambda r: r["peak_gflops"])
    return {
        "peak_gflops_fp32": roof["peak_gflops"],
        "matmul_gflops": roof["matmul_gflops"],
        "memory_gbps": roof["memory_gbps"],
        "datasheet": roof["datasheet"],
    }


@dataclasses.dataclass(frozen=True)
class RooflineConfig:
    """The probes' sizes."""

    size: int = 0
    """Square matmul size (0: 2048 on a CPU, 8192 on a GPU/TPU)."""
    mib: int = 0
    """Bandwidth probe MiB (0: 256 on a CPU, 1024 on a GPU/TPU)."""

    def __post_init__(self) -> None:
        if self.size < 0 or self.mib < 0:
            raise ValueError(f"size and mib must be >= 0, got {self.size}, {self.mib}")


def run(cfg: RooflineConfig) -> dict:
    """`measure_roofline` at the config's sizes (0: `default_sizes`)."""
    sizes = default_sizes()
    return measure_roofline(
        size=cfg.size or sizes["size"], bandwidth_mib=cfg.mib or sizes["bandwidth_mib"]
    )


BENCH = Bench(
    RooflineConfig,
    run,
    presets={"default": RooflineConfig(), "quick": RooflineConfig(size=256, mib=16)},
    headlines=("matmul_gflops", "memory_gbps", "datasheet"),
)
