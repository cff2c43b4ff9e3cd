"""`rlvr-bench decode --workload long`: the paged engine against the contiguous one given
the same KV memory, on long, long-tailed rollouts (one run, ratios in that run).

Workload: `requests` prompts of `prompt` tokens; completion budgets LogNormal(μ, σ) capped
at `capacity` tokens, μ found by bisection so that mean/max = 0.45 (OLMo 3's ≈ 14.7K of
32K), the longest at the cap; no stop token, so every request generates its budget. Each
slot holds prompt + capacity positions. The contiguous engine has `contiguous_slots` such
rows; the paged engine has a pool of exactly as many bytes (`contiguous_slots × (prompt +
capacity)` tokens) shared by up to `paged_slots` sequences. Both drive the same
continuous-batching scheduler to the end of the workload, their boundaries interleaved (a
load change on the shared machine hits both); tokens/s counts generated tokens over each
engine's own wall (prefill included, compilation excluded).

Step time against live tokens: `paged_slots` slots are set live at equal lengths filling
a fraction f of the pool (pages allocated, no prefill: attention costs the same whatever
the cached values), and one decode chunk is timed per f; the contiguous engine is timed
the same way. A least-squares line ms = a + b · live tokens summarises the paged engine.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

import jax
import numpy as np

from rlvr_jax.rollout import EngineCore, GroupRequest, Scheduler, SlotRequest
from rlvr_jax.rollout.paged_core import PagedWork
from rlvr_jax.rollout.pages import pages_for, work_lists
from rlvr_jax.rollout.sampling import SamplerMode


@dataclasses.dataclass(frozen=True)
class LongConfig:
    """Sizes of the long workload."""

    capacity: int = 4096
    """Completion tokens a slot holds (the cap of the length distribution)."""
    prompt: int = 256
    requests: int = 64
    contiguous_slots: int = 32
    paged_slots: int = 64
    page_size: int = 16
    prefill_chunk: int = 512
    sigma: float = 0.8
    """σ of the LogNormal completion lengths."""
    mean_over_max: float = 0.45
    chunk: int = 8
    fills: tuple[float, ...] = (0.125, 0.25, 0.5, 0.75, 1.0)
    fill_repeats: int = 3
    seed: int = 0


QUICK_LONG = LongConfig(
    capacity=96,
    prompt=16,
    requests=12,
    contiguous_slots=4,
    paged_slots=8,
    page_size=4,
    prefill_chunk=16,
    chunk=4,
    fill_repeats=1,
)


def progress(message: str) -> None:
    """One progress line on stderr (the JSON goes to stdout / a file)."""
    print(f"[decode long] {message}", file=sys.stderr, flush=True)


def lognormal_lengths(n: int, cap: int, mean_over_max: float, sigma: float, seed: int) -> list:
    """`n` lengths from LogNormal(μ, σ) clipped to [1, cap], the longest set to the cap, μ
    found by bisection so that mean / cap ≈ `mean_over_max`."""
    if not 0 < mean_over_max < 1 or n < 2 or cap < 2 or sigma <= 0:
        raise ValueError(f"need n >= 2, cap >= 2, sigma > 0, 0 < mean/max < 1; got {n}, {cap}")
    z = np.random.default_rng(seed).standard_normal(n)
    z[np.argmax(z)] = np.inf  # the longest request hits the cap

    def lengths(mu: float) -> np.ndarray:
        return np.clip(np.ceil(np.exp(mu + sigma * z)), 1, cap).astype(int)

    lo, hi = 0.0, np.log(cap) + 5 * sigma
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if lengths(mid).mean() / cap > mean_over_max else (mid, hi)
    return lengths((lo + hi) / 2).tolist()


def run_workloads(engines: dict[str, EngineCore], prompts: list, lengths: list) -> dict:
    """The whole workload through a continuous-batching scheduler per engine, the engines'
    boundaries (admission + one decode chunk) interleaved so that a load change on a shared
    machine hits both alike; each engine's wall is the sum of its own boundaries."""
    scheds = {}
    for name, core in engines.items():
        scheds[name] = Scheduler(core)
        for i, (p, n) in enumerate(zip(prompts, lengths)):
            scheds[name].add(GroupRequest(i, i, tuple(p), 1, seed=i, max_new_tokens=n))
    total = sum(lengths)
    done = dict.fromkeys(scheds, 0)
    wall = dict.fromkeys(scheds, 0.0)
    start = last = time.perf_counter()
    load_before = os.getloadavg()[0]
    while not all(s.idle for s in scheds.values()):
        for name, sched in scheds.items():
            if sched.idle:
                continue
            t = time.perf_counter()
            done[name] += sum(len(c.tokens) for _, g in sched.step() for c in g)
            wall[name] += time.perf_counter() - t
        if time.perf_counter() - last > 15:
            last = time.perf_counter()
            progress(
                ", ".join(
                    f"{n}: {s.stats.tokens:,} / {total:,} tokens, {s.live} live, "
                    f"{s.stats.preemptions} preempted, {wall[n]:.0f} s"
                    for n, s in scheds.items()
                )
            )
    out = {}
    for name, sched in scheds.items():
        if done[name] != total:
            raise RuntimeError(f"{name}: generated {done[name]} tokens, expected {total}")
        s = sched.stats
        out[name] = {
            "wall_s": wall[name],
            "tokens_per_s": total / wall[name],
            "mean_concurrent": s.mean_concurrent,
            "kv_utilisation": s.kv_utilisation,
            "preemptions": s.preemptions,
            "recomputed_tokens": s.recomputed_tokens,
            "decode_steps": s.decode_steps,
            "mean_pages_in_use": s.mean_pages_in_use,
            "mean_rows": s.row_steps / s.decode_steps if s.decode_steps else 0.0,
        }
    progress(f"done in {time.perf_counter() - start:.0f} s (load {load_before:.1f} before)")
    return out


def _fill_state(core: EngineCore, length: int) -> tuple[Any, PagedWork | None]:
    """Every slot live at position `length` (pages allocated, nothing prefilled)."""
    spec = core.spec
    b = spec.max_slots
    state = core.init_decode_state()
    requests = [SlotRequest(0, i, 10**6) for i in range(b)]
    if not core.paged:
        prefix = core.prefill(core.params, [1, 2])
        state = core.insert(prefix, state, list(range(b)), requests)
        positions = np.full((b,), length, np.int32)
        state = state.replace(positions_B=jax.numpy.asarray(positions))
        return state, None
    state = core.activate(state, list(range(b)), requests, [1] * b, [length] * b)
    per_slot = pages_for(length + core.chunk, spec.page_size)
    table = np.zeros((b, spec.max_pages), np.int32)
    for slot in range(b):
        table[slot, :per_slot] = 1 + slot * per_slot + np.arange(per_slot)
    if 1 + b * per_slot > spec.pages_per_shard:
        raise ValueError(f"fill of {length} tokens per slot exceeds the pool")
    ends = dict.fromkeys(range(b), length + core.chunk - 1)
    kw = dict(slots_per_shard=b, shards=1, length=spec.work_len, geometry=spec.geometry)
    full = work_lists(ends, dict.fromkeys(range(b), 0), **kw)
    return state, PagedWork(table, *full, *(None, None, None))


def step_ms_at_fill(core: EngineCore, capacity: int, fills: tuple, repeats: int) -> dict:
    """Decode ms/step with all slots live, filling `fills` of `capacity` tokens."""
    out = {}
    for f in fills:
        length = max(1, int(f * capacity / core.spec.max_slots) - core.chunk - 1)
        state, work = _fill_state(core, length)
        state, o = core.generate(core.params, state, mode=SamplerMode(), work=work)  # compile
        jax.block_until_ready(o)
        best = float("inf")
        for _ in range(repeats):
            state, _ = _fill_state(core, length)
            start = time.perf_counter()
            state, o = core.generate(core.params, state, mode=SamplerMode(), work=work)
            jax.block_until_ready(o)
            best = min(best, time.perf_counter() - start)
        out[str(float(f))] = {
            "ms_per_step": 1e3 * best / core.chunk,
            "live_tokens": length * core.spec.max_slots,
        }
    return out


def fit_line(points: dict) -> dict:
    """Least squares ms = a + b · live tokens over the fill points, with r²."""
    x = np.array([p["live_tokens"] for p in points.values()], float)
    y = np.array([p["ms_per_step"] for p in points.values()], float)
    b, a = np.polyfit(x, y, 1)
    r2 = 1 - ((y - (a + b * x)) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-30)
    return {"intercept_ms": float(a), "ms_per_1k_live_tokens": float(1e3 * b), "r2": float(r2)}


def print_summary(long: dict) -> None:
    """The long workload's figures, one per line."""
    tps, ratios = long["tokens_per_s"], long["ratios"]
    print(f"long: tokens/s paged {tps['paged']:.1f}  contiguous {tps['contiguous']:.1f}")
    print(f"long: paged / contiguous tokens/s  {ratios['paged_over_contiguous_tokens_per_s']:.2f}x")
    print(f"long: mean concurrent {long['mean_concurrent']}")
    print(f"long: KV utilisation {long['kv_utilisation']:.3f}, preemptions {long['preemptions']}")
    print(f"long: decode ms/step at fill {long['step_ms_at_fill']}")
    if ratios["step_ms_quarter_over_full"] is not None:
        print(f"long: step ms 25% / 100% fill  {ratios['step_ms_quarter_over_full']:.2f}")


def main_result(cfg: Any, quick: bool, **sizes: int) -> dict:
    """`rlvr-bench decode --workload long`: the long section (`sizes` override `LongConfig`
    fields), the roofline and the machine (load average before and after), printed and
    returned for the JSON."""
    from rlvr_jax.bench.roofline import machine_info, measure_roofline

    load_before = os.getloadavg()
    long = run(cfg, dataclasses.replace(QUICK_LONG if quick else LongConfig(), **sizes))
    sizes = dict(size=256, bandwidth_mib=16) if quick else {}
    roof = max(measure_roofline(**sizes), measure_roofline(**sizes), key=lambda r: r["peak_gflops"])
    print_summary(long)
    return {
        "long": long,
        "roofline": {
            "peak_gflops_fp32": roof["peak_gflops"],
            "matmul_gflops": roof["matmul_gflops"],
            "memory_gbps": roof["memory_gbps"],
        },
        "machine": {
            **machine_info(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "config": dataclasses.asdict(cfg),
    }


def run(cfg: Any, lc: LongConfig) -> dict:
    """Builds the bench model of `cfg` (`rlvr_jax.bench.decode.BenchConfig`) and runs the
    long workload on it; the `long` JSON section."""
    import tempfile

    from rlvr_jax.bench.decode import build_models

    with tempfile.TemporaryDirectory() as tmp:
        _, model = build_models(cfg, tmp)
    return run_long(model, lc)


def run_long(model: Any, lc: LongConfig) -> dict:
    """The long workload on both layouts at equal KV memory; the `long` JSON section."""
    rng = np.random.default_rng(lc.seed)
    lengths = lognormal_lengths(lc.requests, lc.capacity, lc.mean_over_max, lc.sigma, lc.seed)
    prompts = rng.integers(0, model.config.vocab_size, size=(lc.requests, lc.prompt)).tolist()
    max_len = lc.prompt + lc.capacity
    pool_tokens = lc.contiguous_slots * max_len
    engines = {
        "contiguous": EngineCore(
            model,
            max_slots=lc.contiguous_slots,
            max_len=max_len,
            chunk=lc.chunk,
            kv_layout="contiguous",
        ),
        "paged": EngineCore(
            model,
            max_slots=lc.paged_slots,
            max_len=max_len,
            chunk=lc.chunk,
            page_size=lc.page_size,
            kv_pages=pool_tokens // lc.page_size,
            prefill_chunk=lc.prefill_chunk,
        ),
    }
    start = time.perf_counter()
    engines["paged"].compile_ahead()
    run_workloads(engines, prompts[:2], [3, 3])  # warm-up: compiles what is left
    progress(f"compiled in {time.perf_counter() - start:.0f} s; running both, interleaved")
    load_before = os.getloadavg()
    runs = run_workloads(engines, prompts, lengths)
    load_after = os.getloadavg()
    fills = {}
    for name, core in engines.items():
        progress(f"{name}: timing decode steps at fills {list(lc.fills)} of {pool_tokens:,}")
        fills[name] = step_ms_at_fill(core, pool_tokens, lc.fills, lc.fill_repeats)
    paged = fills["paged"]
    return {
        "tokens_per_s": {k: r["tokens_per_s"] for k, r in runs.items()},
        "kv_bytes": {k: core.kv_bytes for k, core in engines.items()},
        "mean_concurrent": {k: r["mean_concurrent"] for k, r in runs.items()},
        "kv_utilisation": runs["paged"]["kv_utilisation"],
        "kv_utilisation_by_layout": {k: r["kv_utilisation"] for k, r in runs.items()},
        "preemptions": runs["paged"]["preemptions"],
        "recomputed_tokens": runs["paged"]["recomputed_tokens"],
        "step_ms_at_fill": {f: p["ms_per_step"] for f, p in paged.items()},
        "step_ms_at_fill_by_layout": fills,
        "step_time_fit": fit_line(paged),
        "ratios": {
            "paged_over_contiguous_tokens_per_s": runs["paged"]["tokens_per_s"]
            / runs["contiguous"]["tokens_per_s"],
            "step_ms_quarter_over_full": paged["0.25"]["ms_per_step"] / paged["1.0"]["ms_per_step"]
            if "0.25" in paged and "1.0" in paged
            else None,
        },
        "runs": runs,
        "loadavg_during_runs": [load_before, load_after],
        "workload": {
            **dataclasses.asdict(lc),
            "max_len": max_len,
            "pool_tokens": pool_tokens,
            "generated_tokens": sum(lengths),
            "mean_over_max": float(np.mean(lengths) / lc.capacity),
            "lengths": lengths,
        },
    }
