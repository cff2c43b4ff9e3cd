"""Batch sources: where each training step's batch comes from (each algorithm's is in its file
of `training.algorithms`).

A source is started (`start()`), hands the loop one `Batch` per step (`next(policy_version)`;
None: stopped first), saves and restores its position with each checkpoint (`state()` /
`restore(state)`: a resumed run sees exactly the data it would have seen), takes the learner's
weights when it generates (`push_weights`, `probe`; `on_policy`: the next batch needs them at
once), lists the prompts drawn and unsettled at the end (`pending`, for the ledger), and is
closed. Its `rollouts` (None for `StaticWeights`) are what the in-loop evaluation uses.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Batch:
    """One step's input as a source hands it to the loop (host side)."""

    arrays: Any
    """The typed learner batch (numpy): `RLBatch`, `TokenBatch` or `ParallelBatch`; None when
    this step makes no update (e.g. an expert-iteration round that kept nothing)."""
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    """Host metrics of producing it (rewards, filtering, timing)."""
    samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Records for `samples.jsonl` (`training.step_log.sample_records`)."""
    empty_reason: str = ""
    """Why the batch trains nothing (`arrays` None), for the step's warning."""
    tokens: int = 0
    """Tokens generated (rollouts) or trained on (SFT), for throughput."""
    rewards_B: Any = None
    """An RL batch's rewards (row order), for `loss.kl_mode: reward` and `train.save_batch`."""
    group_size: int = 0
    """G of an RL batch (its completions are grouped by prompt, G at a time)."""
    slots: Any = None
    """Each completion's slot in an RL batch's per-completion arrays (packing reorders)."""
    sequences: Any = None
    """An RL batch's (prompt, completion) tokens in row order, for `rollout.exact`."""
    settled: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The ledger records (`training.ledger.entry`) of the prompts this batch settled."""
    row_counts: tuple[int, ...] = ()
    """The packed-row counts this source's batches may take (`Update.compile`)."""


class StaticWeights:
    """Mixin for sources that generate nothing (no weights needed) and hold nothing to release."""

    on_policy = False
    rollouts = None

    def push_weights(self, params: Any, version: int) -> None:
        del params, version

    def probe(self, version: int, prompt: list[int], max_new_tokens: int) -> None:
        del version, prompt, max_new_tokens

    def pending(self) -> list[dict]:
        return []

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass
