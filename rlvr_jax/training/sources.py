"""Batch sources: where each training step's batch comes from.

A source hands the loop one `Batch` per step (`next(policy_version)`), reports and restores its
position (`state()` / `restore(state)`, stored in every checkpoint beside the train state, so a
resumed run sees exactly the data it would have seen), receives the learner's weights when it
generates (`push_weights`), and is closed at the end. Each algorithm's source lives in its own
file of `rlvr_jax.training.algorithms`:

| algorithm | source | batch |
|---|---|---|
| `rl` | `rl.RolloutSource` | `RLBatch` |
| `sft` | `sft.SFTSource` | `TokenBatch` |
| `expert_iteration` | `expert_iteration.ExpertIterationSource` | `TokenBatch` |
| `rl_sft_parallel` | `rl_sft_parallel.PairingSource(RolloutSource, SFTSource)` | `ParallelBatch` |
| `dpo` | `dpo.PreferenceSource` | `PreferenceBatch` |
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class Batch:
    """One step's input as a source hands it to the loop (host side)."""

    arrays: Any
    """The typed learner batch (numpy): `RLBatch`, `TokenBatch` or `ParallelBatch`; None when
    this step makes no update (e.g. an expert-iteration round that kept nothing)."""
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    """Host metrics of producing it (rewards, filtering, timing)."""
    texts: list[str] = dataclasses.field(default_factory=list)
    """Completions to log as text samples."""
    tokens: int = 0
    """Tokens generated (rollouts) or trained on (SFT), for throughput."""
    rewards_B: Any = None
    """The rewards of an RL batch's real rows (its completions, in row order): what the
    learner completes the advantages from with `loss.kl_mode: reward` (the KL penalty needs
    its log-probs), and what `train.save_batch` stores."""
    group_size: int = 0
    """G of an RL batch (its completions are grouped by prompt, G at a time)."""
    slots: Any = None
    """Each completion's slot in an RL batch's per-completion arrays (packing reorders)."""
    sequences: Any = None
    """An RL batch's completions as (prompt tokens, completion tokens), in row order (`slots`
    says where each sits): what `rollout.exact` replays through the engine."""


class BatchSource(Protocol):
    """What the loop needs of a source."""

    def next(self, policy_version: int) -> Batch | None:
        """The next step's batch (None: stopped before one was complete)."""

    def state(self) -> dict:
        """JSON-able position, stored in the checkpoint."""

    def restore(self, state: dict) -> None:
        """Continues from a `state()`."""

    def close(self) -> None:
        """Releases threads, processes and devices."""


class StaticWeights:
    """Mixin for sources that generate nothing: the learner's weights are not needed."""

    on_policy = False

    def push_weights(self, params: Any, version: int) -> None:
        del params, version

    def start(self) -> None:
        pass
