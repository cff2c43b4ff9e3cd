"""Batch sources: where each training step's batch comes from.

A source hands the loop one `Batch` per step (`next(policy_version)`), reports and restores its
position (`state()` / `restore(state)`, stored in every checkpoint beside the train state, so a
resumed run sees exactly the data it would have seen), receives the learner's weights when it
generates (`push_weights`), and is closed at the end. `algorithm` picks the source and the step
(`rlvr_jax.training.algorithms`):

| algorithm | source | batch |
|---|---|---|
| `rl` | `RolloutSource` (`rollouts.py`) | `RLBatch` |
| `sft` | `SFTSource` | `TokenBatch` |
| `expert_iteration` | `ExpertIterationSource` (`rollouts.py`) | `TokenBatch` |
| `rl_sft_parallel` | `PairingSource(RolloutSource, SFTSource)` | `ParallelBatch` |
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol

import flax.struct
import jax
import numpy as np

from rlvr_jax.training.batch import RLBatch, TokenBatch
from rlvr_jax.training.recipes.sft_data import SFTBatcher


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


class SFTSource(StaticWeights):
    """`algorithm: sft`: `sft.batch_size` examples per step from the seeded, resumable mixture
    of `sft.sources` (`SFTBatcher`)."""

    def __init__(self, batcher: SFTBatcher) -> None:
        self.batcher = batcher

    def next(self, policy_version: int) -> Batch:
        del policy_version
        t0 = time.perf_counter()
        arrays = self.batcher.next_arrays()
        metrics = {"time/data_s": time.perf_counter() - t0}
        return Batch(arrays, metrics=metrics, tokens=int(arrays.mask_BxT.sum()))

    def state(self) -> dict:
        return {"sft": self.batcher.examples.state()}

    def restore(self, state: dict) -> None:
        self.batcher.examples.restore(state["sft"])

    def close(self) -> None:
        pass


@flax.struct.dataclass
class ParallelBatch:
    """`rl_sft_parallel`'s batch: the RL batch and one SFT batch per RL mini-batch (stacked
    rows: mini-batch u trains with SFT rows [u·n, (u+1)·n))."""

    rl: RLBatch
    sft: TokenBatch


class PairingSource:
    """`algorithm: rl_sft_parallel`: each RL batch (`RolloutSource`) paired with the next
    `train.updates_per_batch` SFT batches (`SFTSource`); both positions are checkpointed."""

    def __init__(self, rl: Any, sft: SFTSource, *, updates_per_batch: int) -> None:
        self.rl, self.sft, self.updates = rl, sft, updates_per_batch
        self.on_policy = rl.on_policy

    def next(self, policy_version: int) -> Batch | None:
        rl = self.rl.next(policy_version)
        if rl is None:
            return None
        sft = [self.sft.next(policy_version).arrays for _ in range(self.updates)]
        stacked = sft[0] if len(sft) == 1 else _concat_rows(sft)
        return dataclasses.replace(rl, arrays=ParallelBatch(rl=rl.arrays, sft=stacked))

    def push_weights(self, params: Any, version: int) -> None:
        self.rl.push_weights(params, version)

    def start(self) -> None:
        self.rl.start()

    def state(self) -> dict:
        return {"rl": self.rl.state(), **self.sft.state()}

    def restore(self, state: dict) -> None:
        self.rl.restore(state["rl"])
        self.sft.restore(state)

    def close(self) -> None:
        self.rl.close()


def _concat_rows(batches: list[Any]) -> Any:
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *batches)
