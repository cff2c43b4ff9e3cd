"""Batching waste arithmetic (ALGORITHMS.md, "Rollout system"): the decode slot-steps a
workload of known lengths costs under static and under continuous batching.

A slot-step is one slot for one decode step. A completion of ℓ tokens uses ℓ of them;
everything else a schedule pays for is waste = 1 - Σℓ / slot-steps. Static batching runs
consecutive batches of `slots` requests, each for max ℓ of its batch: waste 1 - mean/max
per batch. Continuous batching starts the next request in a slot the step after the slot
frees: waste is only the final drain. The engine's `SchedulerStats` measure the same
quantities, so the prediction and the measurement can be compared.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def _check(lengths: Sequence[int], slots: int) -> None:
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    if not lengths or min(lengths) < 1:
        raise ValueError("lengths must be a non-empty list of positive token counts")


def static_steps(lengths: Sequence[int], slots: int) -> int:
    """Decode steps of static batching: Σ over consecutive batches of max ℓ in the batch."""
    _check(lengths, slots)
    return sum(max(lengths[i : i + slots]) for i in range(0, len(lengths), slots))


def continuous_steps(lengths: Sequence[int], slots: int) -> int:
    """Decode steps of continuous batching, requests admitted in order into the first free
    slot (a slot freed after step t serves the next request from step t + 1)."""
    _check(lengths, slots)
    free_at = [0] * slots
    end = 0
    for n in lengths:
        start = heapq.heappop(free_at)
        heapq.heappush(free_at, start + n)
        end = max(end, start + n)
    return end


def waste(lengths: Sequence[int], steps: int, slots: int) -> float:
    """Fraction of the `steps` x `slots` slot-steps that produced no token."""
    _check(lengths, slots)
    total = steps * slots
    if total < sum(lengths):
        raise ValueError(f"{steps} steps x {slots} slots cannot hold {sum(lengths)} tokens")
    return 1.0 - sum(lengths) / total
