"""`algorithm: rl` with `loss.advantage: gae`: PPO with a learned critic (`training/critic.py`).

The source is `rl.py`'s. The update is `rl.RLUpdate` whose step trains the policy and the critic
together (`critic.make_ppo_step`), whose state carries the critic's (`TrainState.critic`), and
whose advantages are the critic's GAE over the rollout tokens (`critic.make_prepare_fn`), made
once per batch before the first optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlvr_jax.config.schema import Config
from rlvr_jax.training.algorithms.rl import RLUpdate
from rlvr_jax.training.context import Context
from rlvr_jax.training.critic import CriticBuilder, make_ppo_step, make_prepare_fn


def validate(cfg: Config) -> None:
    """The `critic.*` values (errors name the key)."""
    c = cfg.critic
    for key, value in (("gamma", c.gamma), ("lam", c.lam)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"critic.{key} must be in [0, 1], got {value}")
    if not c.value_coef > 0:
        raise ValueError(f"critic.value_coef must be > 0, got {c.value_coef}")
    if c.value_clip is not None and c.value_clip < 0:
        raise ValueError(f"critic.value_clip must be >= 0 (or null: off), got {c.value_clip}")
    if c.learning_rate is not None and not c.learning_rate > 0:
        raise ValueError(f"critic.learning_rate must be > 0, got {c.learning_rate}")


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


def update(ctx: Context) -> PPOUpdate:
    return PPOUpdate(ctx)
