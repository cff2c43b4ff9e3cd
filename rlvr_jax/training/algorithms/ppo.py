"""`algorithm: rl` with `loss.advantage: gae`: PPO with a learned critic (`training/critic.py`).

The source is `rl.py`'s. The update is `rl.RLUpdate` whose step trains the policy and the critic
together (`critic.make_ppo_step`), whose state carries the critic's (`TrainState.critic`), and
whose advantages are the critic's GAE over the rollout tokens (`critic.make_prepare_fn`), made
once per batch before the first optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlvr_jax.training.algorithms.rl import RLUpdate
from rlvr_jax.training.context import Context
from rlvr_jax.training.critic import CriticBuilder, make_ppo_step, make_prepare_fn


class PPOUpdate(RLUpdate):
    """`RLUpdate` with the critic: values and GAE per batch, then PPO steps."""

    def _make_step(
        self, ctx: Context, optimizer: Any, n_micro: int | None, options: dict[str, Any]
    ) -> tuple[Callable, Any]:
        self.critic = CriticBuilder(ctx.cfg, ctx.model, ctx.learner_mesh, ctx.memory)
        self.gae = make_prepare_fn(self.critic.critic, ctx.settings)
        step = make_ppo_step(
            ctx.model.config,
            self.critic.critic,
            optimizer,
            self.critic.optimizer,
            ctx.settings,
            n_micro=n_micro,
            **options,
        )
        return step, optimizer

    def _initial_state(self, params: Any) -> Any:
        return super()._initial_state(params).replace(critic=self.critic.init())

    def _advantages(self, state: Any, rl: Any) -> tuple[Any, dict[str, Any]]:
        """GAE from the critic's values of the rollout tokens (`loss.kl_mode: reward` included)."""
        return self.gae(state.params, state.critic.params, rl)
