"""`algorithm` → (config checks, batch source, learner update): the table the loop runs from.
Each algorithm reads in its own file; what their updates share is `common.py` (the `Update`
base: one jitted program per batch shape).

| algorithm | file | source → update |
|---|---|---|
| `rl` | `rl.py` | `RolloutSource` → `RLUpdate`: old/ref log-probs, `updates_per_batch` steps |
| `rl`, `loss.advantage: gae` | `ppo.py` | `RolloutSource` → `PPOUpdate`: critic values, GAE |
| `sft` | `sft.py` | `SFTSource` → `SFTUpdate`: one SFT step |
| `expert_iteration` | `expert_iteration.py` | `ExpertIterationSource` → `SFTUpdate` |
| `rl_sft_parallel` | `rl_sft_parallel.py` | `PairingSource` → `ParallelUpdate` |
| `dpo` | `dpo.py` | `PreferenceSource` → `DPOUpdate`: one DPO step |

The checks of the config alone run at load (`rlvr_jax.config.algorithm_checks`); those that
need the model or the data run when the update or the source is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rlvr_jax.training.algorithms import dpo, expert_iteration, ppo, rl, rl_sft_parallel, sft
from rlvr_jax.training.algorithms.common import Update
from rlvr_jax.training.context import Context


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """How an `algorithm` builds its source and its learner update."""

    source: Callable[[Context, Any, int], Any]
    """(context, params, policy version) → the batch source (its engine starts from params)."""
    update: Callable[[Context], Update]


def _rl_update(ctx: Context) -> Update:
    return ppo.PPOUpdate(ctx) if ctx.settings.uses_critic else rl.RLUpdate(ctx)


ALGORITHMS: dict[str, Algorithm] = {
    "rl": Algorithm(rl.source, _rl_update),
    "sft": Algorithm(sft.source, sft.update),
    "expert_iteration": Algorithm(expert_iteration.source, expert_iteration.update),
    "rl_sft_parallel": Algorithm(rl_sft_parallel.source, rl_sft_parallel.ParallelUpdate),
    "dpo": Algorithm(dpo.source, dpo.DPOUpdate),
}
"""The source and the learner update of each `algorithm`."""


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm: unknown {name!r}; expected one of {list(ALGORITHMS)}")
    return ALGORITHMS[name]


__all__ = ["ALGORITHMS", "Algorithm", "Context", "Update", "get_algorithm"]
