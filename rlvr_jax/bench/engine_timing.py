"""Engine timings shared by the benchmarks: best-of-rounds wall times measured in interleaved
rounds, a workload of forced lengths through the scheduler, an engine's prefill and decode-step
seconds, and the host's share of a scheduled run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax

from rlvr_jax.bench import progress
from rlvr_jax.rollout import EngineCore, GroupRequest, Scheduler, SlotRequest
from rlvr_jax.rollout.device.sampling import SamplerMode


def interleaved_best(fns: dict[str, Callable[[], Any]], repeats: int) -> tuple[dict, dict]:
    """Best wall time (and its output) of each fn, timed in interleaved rounds so that a
    load change on a shared machine hits every contender alike."""
    best = {name: float("inf") for name in fns}
    outputs: dict[str, Any] = {}
    for r in range(repeats):
        if len(fns) > 1:  # a comparison (single probes are quick)
            progress.line(f"timing {', '.join(fns)}: round {r + 1}/{repeats}")
        for name, fn in fns.items():
            start = time.perf_counter()
            out = fn()
            seconds = time.perf_counter() - start
            if seconds < best[name]:
                best[name], outputs[name] = seconds, out
    return best, outputs


def run_lengths(core: EngineCore, prompts: list, lengths: list[int], batching: str) -> Any:
    """Every prompt decoded to its length (its own `max_new_tokens`, no stop token) through a
    `Scheduler` of `batching`; the scheduler's counters (`SchedulerStats`)."""
    sched = Scheduler(core, batching=batching)
    for i, (prompt, n) in enumerate(zip(prompts, lengths)):
        sched.add(GroupRequest(i, i, tuple(prompt), 1, seed=i, max_new_tokens=int(n)))
    got = {req.key: len(group[0].tokens) for req, group in sched.run()}
    bad = [i for i, n in enumerate(lengths) if got.get(i) != int(n)]
    if bad:
        raise RuntimeError(f"{batching}: requests {bad[:5]} did not generate their forced lengths")
    return sched.stats


def profile_engine(core: EngineCore, prompts: list[list[int]], repeats: int) -> dict:
    """Seconds per prefill of one prompt (into one slot) and per decode step with every slot
    live."""
    dp = core.params
    prefix, one = core.prefill(dp, prompts[0]), [SlotRequest(0, 0, 10**6)]
    holder = {"state": core.init_decode_state()}

    def prefill() -> Any:
        holder["state"] = core.insert(prefix, holder["state"], [0], one)
        return jax.block_until_ready(holder["state"].tokens_B)

    prefill_s = interleaved_best({"prefill": prefill}, repeats + 2)[0]["prefill"]
    slots = list(range(core.spec.max_slots))
    requests = [SlotRequest(0, i, 10**6) for i in slots]
    state = core.insert(prefix, holder.pop("state"), slots, requests)
    state, out = core.generate(dp, state, mode=SamplerMode())
    jax.block_until_ready(out)
    holder["state"] = state

    def chunk() -> Any:
        holder["state"], out = core.generate(dp, holder["state"], mode=SamplerMode())
        return jax.block_until_ready(out)

    chunk_s = interleaved_best({"chunk": chunk}, repeats + 2)[0]["chunk"]
    return {"prefill_s_per_prompt": prefill_s, "decode_ms_per_step": 1e3 * chunk_s / core.chunk}


DEVICE_CALLS = (
    "init_decode_state", "prefill", "insert", "extend", "activate", "deactivate", "generate",
    "copy_pages", "move_slots",
)  # fmt: skip
"""The `EngineCore` methods that run device work (the scheduler's every call into the device)."""


def host_share(core: EngineCore, run: Callable[[], Any]) -> dict[str, float]:
    """`run()` (a workload driving `core` through a `Scheduler`) with every device call of the
    engine timed to its result: the host's seconds are the wall's rest — the scheduler's Python
    between device calls (admission, page bookkeeping, bucket choice, collection). Each call
    waits for its result here (on a CPU they mostly run on the caller's thread anyway), so this
    measures the host's time, not how much of it a pipelined run would hide."""
    device = [0.0]

    def timed(fn: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return jax.block_until_ready(fn(*args, **kwargs))
            finally:
                device[0] += time.perf_counter() - start

        return call

    for name in DEVICE_CALLS:  # instance attributes shadow the methods while the run lasts
        setattr(core, name, timed(getattr(core, name)))
    try:
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
    finally:
        for name in DEVICE_CALLS:
            delattr(core, name)
    return {"wall_s": wall, "device_s": device[0], "host_s": wall - device[0],
            "share": (wall - device[0]) / wall}  # fmt: skip
