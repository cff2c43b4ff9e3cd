"""What each `algorithm` needs of the config alone (`check_algorithm`, run by `config.check`;
errors name the key), so that a bad combination fails before anything is built, and loading a
config never imports the trainer. Checks that need the model or the data run when the
algorithm's update or source is built (`rlvr_jax.training.algorithms`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from rlvr_jax import losses
from rlvr_jax.config.schema import Config


def micro_batches(rows: int, micro_batch_size: int, what: str) -> int:
    """Micro-batches per step of `rows` rows under `train.micro_batch_size` (0 = one)."""
    if rows < 1:
        raise ValueError(f"{what} must be >= 1 rows, got {rows}")
    mb = micro_batch_size or rows
    if rows % mb:
        raise ValueError(f"train.micro_batch_size={mb} must divide the {what} of {rows} rows")
    return rows // mb


def dpo_micro_batches(cfg: Config) -> int:
    """DPO's micro-batches per step: `train.micro_batch_size` sequences, two per pair."""
    return micro_batches(2 * cfg.dpo.batch_size, cfg.train.micro_batch_size, "DPO batch")


def uses_critic(cfg: Config) -> bool:
    """Whether the run trains PPO's critic (`loss.advantage: gae`, from a preset or the key)."""
    return losses.loss_settings_from_config(cfg.loss).uses_critic


def check_rl(cfg: Config) -> None:
    """`train.updates_per_batch` mini-batches must split the rollout batch, and
    `train.micro_batch_size` each mini-batch; with a critic, its `critic.*` values."""
    t = cfg.train
    rows, u = t.prompts_per_batch * cfg.rollout.num_samples, t.updates_per_batch
    if u < 1:
        raise ValueError(f"train.updates_per_batch must be >= 1, got {u}")
    if rows % u:
        raise ValueError(f"train.updates_per_batch={u} must divide the batch of {rows} completions")
    micro_batches(rows // u, t.micro_batch_size, "mini-batch")
    if uses_critic(cfg):
        _check_critic(cfg)


def _check_critic(cfg: Config) -> None:
    """The `critic.*` values (PPO, `loss.advantage: gae`)."""
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


def check_sft(cfg: Config) -> None:
    """`sft.batch_size` >= 1 examples per step, split by `train.micro_batch_size`."""
    if cfg.sft.batch_size < 1:
        raise ValueError(f"sft.batch_size must be >= 1, got {cfg.sft.batch_size}")
    micro_batches(cfg.sft.batch_size, cfg.train.micro_batch_size, "SFT batch")


def check_expert_iteration(cfg: Config) -> None:
    """`sft.expert_min_score` in (0, 1], `sft.expert_sft_steps` >= 1, and
    `train.micro_batch_size` dividing a round's prompts × samples rows."""
    sft = cfg.sft
    if not 0.0 < sft.expert_min_score <= 1.0:
        raise ValueError(
            f"sft.expert_min_score must be in (0, 1] (verifier scores are in [0, 1]; <= 0 "
            f"would keep unverified samples), got {sft.expert_min_score}"
        )
    if sft.expert_sft_steps < 1:
        raise ValueError(f"sft.expert_sft_steps must be >= 1, got {sft.expert_sft_steps}")
    rows = cfg.train.prompts_per_batch * cfg.rollout.num_samples
    micro_batches(rows, cfg.train.micro_batch_size, "SFT batch")


def check_rl_sft_parallel(cfg: Config) -> None:
    """Both halves' checks (`check_rl`, `check_sft`); no critic."""
    if uses_critic(cfg):
        raise ValueError(
            "loss.advantage: gae (PPO with a critic) works with algorithm: rl, not rl_sft_parallel"
        )
    check_rl(cfg)
    check_sft(cfg)


def check_dpo(cfg: Config) -> None:
    """The `dpo.*` values and what they need of `train.micro_batch_size`; the preference loss
    is traced once on abstract pairs (no device work), so a bad variant, parameter or β fails
    here."""
    d = cfg.dpo
    if d.batch_size < 1:
        raise ValueError(f"dpo.batch_size must be >= 1, got {d.batch_size}")
    if d.max_response_len is not None and d.max_response_len < 2:
        raise ValueError(f"dpo.max_response_len must be >= 2, got {d.max_response_len}")
    mb = cfg.train.micro_batch_size
    if mb % 2:
        raise ValueError(
            f"train.micro_batch_size={mb} must be even with algorithm: dpo (a pair is two rows)"
        )
    dpo_micro_batches(cfg)
    one = jax.ShapeDtypeStruct((1,), np.float32)

    def trial(x: jax.Array) -> Any:
        return losses.preference_loss(
            d.variant,
            chosen_logp=x,
            rejected_logp=x,
            ref_chosen_logp=x,
            ref_rejected_logp=x,
            beta=d.beta,
            chosen_len=x + 1,
            rejected_len=x + 1,
            **d.variant_kwargs,
        )

    try:
        jax.eval_shape(trial, one)
    except (ValueError, TypeError) as e:
        raise ValueError(f"dpo.variant / dpo.variant_kwargs / dpo.beta: {e}") from None


CHECKS: dict[str, Callable[[Config], None]] = {
    "rl": check_rl,
    "sft": check_sft,
    "expert_iteration": check_expert_iteration,
    "rl_sft_parallel": check_rl_sft_parallel,
    "dpo": check_dpo,
}
"""The config checks of each `algorithm` (`rlvr_jax.training.algorithms.ALGORITHMS` builds it)."""


def check_algorithm(cfg: Config) -> None:
    """Raises ValueError naming the key of a setting `cfg.algorithm` cannot run with."""
    if cfg.algorithm not in CHECKS:
        raise ValueError(f"algorithm: unknown {cfg.algorithm!r}; expected one of {list(CHECKS)}")
    CHECKS[cfg.algorithm](cfg)
