"""optax AdamW with warmup + constant/cosine/linear schedules and global-norm clipping."""

from __future__ import annotations

import dataclasses

import optax

from rlvr_jax.config.schema import TrainConfig


def learning_rate_schedule(cfg: TrainConfig) -> optax.Schedule:
    """Linear warmup from 0 to `learning_rate` over `warmup_steps`, then the configured decay
    (to 0 at `max_steps` for cosine/linear)."""
    peak = cfg.learning_rate
    warm = max(cfg.warmup_steps, 0)
    rest = max(cfg.max_steps - warm, 1)
    if cfg.schedule == "constant":
        after = optax.constant_schedule(peak)
    elif cfg.schedule == "cosine":
        after = optax.cosine_decay_schedule(peak, rest)
    elif cfg.schedule == "linear":
        after = optax.linear_schedule(peak, 0.0, rest)
    else:  # the schema's Literal makes this unreachable from YAML
        raise ValueError(f"train.schedule: unknown schedule {cfg.schedule!r}")
    if warm == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warm), after], [warm])


def make_optimizer(
    cfg: TrainConfig, learning_rate: float | None = None
) -> optax.GradientTransformation:
    """AdamW (+ global-norm clipping when `max_grad_norm` > 0); `learning_rate` overrides the
    peak rate (the SFT half of parallel averaging has its own)."""
    if learning_rate is not None:
        cfg = dataclasses.replace(cfg, learning_rate=learning_rate)
    adamw = optax.adamw(
        learning_rate_schedule(cfg),
        b1=cfg.adam_b1,
        b2=cfg.adam_b2,
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
    )
    if cfg.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)
    return adamw
