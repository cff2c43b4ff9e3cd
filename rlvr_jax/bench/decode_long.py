"""`rlvr-bench decode --workload long`: the paged engine against the contiguous one given the
same KV memory, on long, long-tailed rollouts (LogNormal budgets, interleaved through the
scheduler), then one decode chunk per pool fill: all slots live at shorter lengths
(`step_ms_at_fill`) or fewer slots at full length (`..._fewer_slots`), with lines
ms = a + b · live tokens."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import numpy as np

from rlvr_jax.bench import progress
from rlvr_jax.bench.common import option
from rlvr_jax.rollout import EngineCore, GroupRequest, Scheduler, SlotRequest
from rlvr_jax.rollout.device.paged import PagedWork, pages_for, work_lists
from rlvr_jax.rollout.device.sampling import SamplerMode


@dataclasses.dataclass(frozen=True)
class LongConfig:
    """Sizes of the long workload."""

    capacity: int = 4096
    """Completion tokens a slot holds (the cap of the length distribution)."""
    prompt: int = 256
    """Prompt tokens per request."""
    requests: int = 64
    """Requests."""
    contiguous_slots: int = 32
    """The contiguous engine's slots (its KV memory is the paged pool's)."""
    paged_slots: int = option(64, "--paged-slots")
    """The paged engine's slots."""
    page_size: int = 16
    """Tokens per KV page."""
    prefill_chunk: int = 512
    """The paged engine's prefill chunk."""
    sigma: float = 0.8
    """σ of the LogNormal completion lengths."""
    mean_over_max: float = 0.45
    """Mean / max of the completion lengths."""
    chunk: int = 8
    """Decode steps per engine call."""
    fills: tuple[float, ...] = (0.125, 0.25, 0.5, 0.75, 1.0)
    """Fractions of the pool live at which a decode step is timed."""
    fill_repeats: int = 3
    """Timed chunks per fill (the best is kept)."""
    seed: int = 0
    """Seed of the lengths and prompts."""

    def __post_init__(self) -> None:
        if min(self.requests, self.paged_slots, self.capacity) < 2:
            raise ValueError("--long-requests, --paged-slots and --long-capacity must be >= 2")


QUICK_LONG = LongConfig(capacity=96, prompt=16, requests=12, contiguous_slots=4, paged_slots=8,
                        page_size=4, prefill_chunk=16, chunk=4, fill_repeats=1)  # fmt: skip


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


_STATS = ("mean_concurrent", "kv_utilisation", "preemptions", "recomputed_tokens",
          "decode_steps", "mean_pages_in_use")  # fmt: skip
"""The scheduler's counters (`SchedulerStats`) each engine's run reports."""


def run_workloads(engines: dict[str, EngineCore], prompts: list, lengths: list) -> dict:
    """The workload through one scheduler per engine, their steps interleaved; their figures."""
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
            progress.line(
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
            **{k: getattr(s, k) for k in _STATS},
            "mean_rows": s.row_steps / s.decode_steps if s.decode_steps else 0.0,
        }
    progress.line(f"done in {time.perf_counter() - start:.0f} s (load {load_before:.1f} before)")
    return out


def _fill_state(core: EngineCore, length: int, live: int) -> tuple[Any, PagedWork | None]:
    """Slots [0, live) live at position `length` (pages allocated, nothing prefilled)."""
    spec = core.spec
    state = core.init_decode_state()
    requests = [SlotRequest(0, i, 10**6) for i in range(live)]
    if not core.paged:
        prefix = core.prefill(core.params, [1, 2])
        state = core.insert(prefix, state, list(range(live)), requests)
        positions = np.full((spec.max_slots,), length, np.int32)
        state = state.replace(positions_B=jax.numpy.asarray(positions))
        return state, None
    state = core.activate(state, list(range(live)), requests, [1] * live, [length] * live)
    per_slot = pages_for(length + core.chunk, spec.page_size)
    table = np.zeros((spec.max_slots, spec.max_pages), np.int32)
    for slot in range(live):
        table[slot, :per_slot] = 1 + slot * per_slot + np.arange(per_slot)
    if 1 + live * per_slot > spec.pages_per_shard:
        raise ValueError(f"fill of {length} tokens per slot exceeds the pool")
    ends = dict.fromkeys(range(live), length + core.chunk - 1)
    kw = dict(slots_per_shard=spec.max_slots, shards=1, length=spec.work_len)
    full = work_lists(ends, dict.fromkeys(range(live), 0), geometry=spec.geometry, **kw)
    return state, PagedWork(table, *full, *(None, None, None))


def _time_chunk(core: EngineCore, length: int, live: int, repeats: int) -> float:
    """Best-of-`repeats` ms per decode step, `live` slots at `length` (paged: on its row bucket)."""
    rows = core.spec.row_bucket(live) if core.paged else None
    state, work = _fill_state(core, length, live)
    state, o = core.generate(core.params, state, mode=SamplerMode(), work=work, rows=rows)
    jax.block_until_ready(o)  # compile
    best = float("inf")
    for _ in range(repeats):
        state, _ = _fill_state(core, length, live)
        start = time.perf_counter()
        state, o = core.generate(core.params, state, mode=SamplerMode(), work=work, rows=rows)
        jax.block_until_ready(o)
        best = min(best, time.perf_counter() - start)
    return 1e3 * best / core.chunk


def step_ms_at_fill(
    core: EngineCore, capacity: int, fills: tuple, repeats: int, *, fewer_slots: bool = False
) -> dict:
    """Decode ms/step at each fraction of `fills` of a `capacity`-token pool: all slots live at
    shorter lengths, or (`fewer_slots`) that fraction of the slots at full length."""
    out = {}
    b = core.spec.max_slots
    for f in fills:
        length = max(1, int((1.0 if fewer_slots else f) * capacity / b) - core.chunk - 1)
        live = max(1, round(f * b)) if fewer_slots else b
        ms = _time_chunk(core, length, live, repeats)
        out[str(float(f))] = {"ms_per_step": ms, "live_tokens": length * live, "live_slots": live}
    return out


def _quarter_over_full(points: dict) -> float | None:
    if "0.25" not in points or "1.0" not in points:
        return None
    return points["0.25"]["ms_per_step"] / points["1.0"]["ms_per_step"]


def fit_line(points: dict) -> dict:
    """Least squares ms = a + b · live tokens over the fill points, with r²."""
    x = np.array([p["live_tokens"] for p in points.values()], float)
    y = np.array([p["ms_per_step"] for p in points.values()], float)
    b, a = np.polyfit(x, y, 1)
    r2 = 1 - ((y - (a + b * x)) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-30)
    return {"intercept_ms": float(a), "ms_per_1k_live_tokens": float(1e3 * b), "r2": float(r2)}


def run(cfg: Any) -> dict:
    """The long workload (`cfg.long`) on both layouts at equal KV memory, and the roofline."""
    from rlvr_jax.bench.roofline import best_roofline

    model, lc = cfg.model(cfg.seed, cfg.dtype), cfg.long
    rng = np.random.default_rng(lc.seed)
    lengths = lognormal_lengths(lc.requests, lc.capacity, lc.mean_over_max, lc.sigma, lc.seed)
    prompts = rng.integers(0, model.config.vocab_size, size=(lc.requests, lc.prompt)).tolist()
    max_len = lc.prompt + lc.capacity
    pool_tokens = lc.contiguous_slots * max_len
    kw = dict(model=model, max_len=max_len, chunk=lc.chunk)
    pool = dict(page_size=lc.page_size, kv_pages=pool_tokens // lc.page_size)
    engines = {
        "contiguous": EngineCore(max_slots=lc.contiguous_slots, kv_layout="contiguous", **kw),
        "paged": EngineCore(max_slots=lc.paged_slots, prefill_chunk=lc.prefill_chunk, **pool, **kw),
    }
    start = time.perf_counter()
    engines["paged"].compile_ahead()
    run_workloads(engines, prompts[:2], [3, 3])  # warm-up: compiles what is left
    progress.line(f"compiled in {time.perf_counter() - start:.0f} s; running both, interleaved")
    load_before = os.getloadavg()
    runs = run_workloads(engines, prompts, lengths)
    load_after = os.getloadavg()
    fills, by_slots = {}, {}
    for name, core in engines.items():
        progress.line(f"{name}: timing decode steps at fills {list(lc.fills)} of {pool_tokens:,}")
        args = (core, pool_tokens, lc.fills, lc.fill_repeats)
        fills[name] = step_ms_at_fill(*args)
        by_slots[name] = step_ms_at_fill(*args, fewer_slots=True)
    paged, tail = fills["paged"], by_slots["paged"]
    long = {
        "tokens_per_s": {k: r["tokens_per_s"] for k, r in runs.items()},
        "kv_bytes": {k: core.kv_bytes for k, core in engines.items()},
        "mean_concurrent": {k: r["mean_concurrent"] for k, r in runs.items()},
        "kv_utilisation": runs["paged"]["kv_utilisation"],
        "kv_utilisation_by_layout": {k: r["kv_utilisation"] for k, r in runs.items()},
        "preemptions": runs["paged"]["preemptions"],
        "recomputed_tokens": runs["paged"]["recomputed_tokens"],
        "step_ms_at_fill": {f: p["ms_per_step"] for f, p in paged.items()},
        "step_ms_at_fill_by_layout": fills,
        "step_ms_at_fill_fewer_slots": {f: p["ms_per_step"] for f, p in tail.items()},
        "step_ms_at_fill_fewer_slots_by_layout": by_slots,
        "step_time_fit": fit_line(paged),
        "step_time_fit_fewer_slots": fit_line(tail),
        "ratios": {
            "paged_over_contiguous_tokens_per_s": runs["paged"]["tokens_per_s"]
            / runs["contiguous"]["tokens_per_s"],
            "step_ms_quarter_over_full": _quarter_over_full(paged),
            "step_ms_quarter_over_full_fewer_slots": _quarter_over_full(tail),
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
    return {"long": long, "roofline": best_roofline(cfg.quick)}
