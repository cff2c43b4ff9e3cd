"""KL estimators against a frozen reference policy, per token (ALGORITHMS.md, "KL estimators").

With δ = ref_logp − logp on tokens sampled from π_θ:

- `k1` = −δ                 (unbiased for KL(π‖ref); can be negative per token)
- `k2` = ½ δ²               (biased, low variance, never negative)
- `k3` = exp(δ) − 1 − δ     (unbiased for KL(π‖ref), low variance, never negative)

The KL enters training in one of two ways (`loss.kl_mode`):

- **as a loss term** (`policy_loss(..., kl_coef=β)`, GRPO with k3): β·k is added per token after
  the policy term and aggregated with it. As loss terms the estimators have different gradients
  (on samples from π, ∇ taken through logp only):
  ∇k1 = ∇logp, whose expectation is 0: k1 as a loss only adds noise;
  ∇k2 = (logp − ref_logp)·∇logp, in expectation the gradient of the reverse KL(π‖ref);
  ∇k3 = (1 − ref/π)·∇logp, in expectation the gradient of the forward KL(ref‖π).
- **as a reward penalty** (PPO-style): `kl_reward_penalty` subtracts β·Σ_t k per completion from
  its reward before the advantages are computed; no gradient flows through it.

A user estimator is `fn(logp_BxT, ref_logp_BxT) -> kl_BxT` (`@KL_ESTIMATORS.register`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.losses.masked import masked_sum
from rlvr_jax.losses.registry import Registry

KL_ESTIMATORS = Registry("KL estimator")


def get_kl_estimator(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """The KL estimator for `k1` / `k2` / `k3`, a `module:function` string or a callable."""
    return KL_ESTIMATORS.get(ref)


@KL_ESTIMATORS.register("k1")
def k1(logp_BxT: jax.Array, ref_logp_BxT: jax.Array) -> jax.Array:
    """k1 = −δ = logp − ref_logp."""
    return logp_BxT - ref_logp_BxT


@KL_ESTIMATORS.register("k2")
def k2(logp_BxT: jax.Array, ref_logp_BxT: jax.Array) -> jax.Array:
    """k2 = ½ δ²."""
    return 0.5 * jnp.square(ref_logp_BxT - logp_BxT)


@KL_ESTIMATORS.register("k3")
def k3(logp_BxT: jax.Array, ref_logp_BxT: jax.Array) -> jax.Array:
    """k3 = exp(δ) − 1 − δ, computed as expm1(δ) − δ for accuracy near δ = 0."""
    delta_BxT = ref_logp_BxT - logp_BxT
    return jnp.expm1(delta_BxT) - delta_BxT


def kl_per_token(
    estimator: str | Callable[..., Any], logp_BxT: jax.Array, ref_logp_BxT: jax.Array
) -> jax.Array:
    """The estimator's per-token KL [B,T]; raises if it returns another shape."""
    kl_BxT = get_kl_estimator(estimator)(logp_BxT, ref_logp_BxT)
    if kl_BxT.shape != logp_BxT.shape:
        raise ValueError(
            f"KL estimator {estimator!r} returned shape {kl_BxT.shape}, expected {logp_BxT.shape}"
        )
    return kl_BxT


def kl_reward_penalty(
    rewards_B: jax.Array,
    *,
    logp: jax.Array,
    ref_logp: jax.Array,
    mask: jax.Array,
    kl_coef: float,
    kl_estimator: str | Callable[..., Any] = "k3",
) -> jax.Array:
    """R_i − β·Σ_t m·k(logp, ref_logp) [B] (`loss.kl_mode: reward`), before the advantages;
    `logp` [B, T] are the log-probs the completions were scored under (sampler's or old),
    `ref_logp` and `mask` [B, T]. The penalty carries no gradient."""
    rewards_B = jnp.asarray(rewards_B, jnp.float32)
    logp_BxT = jnp.asarray(logp, jnp.float32)
    ref_logp_BxT = jnp.asarray(ref_logp, jnp.float32)
    mask_BxT = jnp.asarray(mask, jnp.float32)
    if rewards_B.ndim != 1:
        raise ValueError(f"rewards must be [B], got shape {rewards_B.shape}")
    for name, arr in (("ref_logp", ref_logp_BxT), ("mask", mask_BxT)):
        if arr.shape != logp_BxT.shape:
            raise ValueError(f"{name} has shape {arr.shape}, expected logp's {logp_BxT.shape}")
    if logp_BxT.ndim != 2 or logp_BxT.shape[0] != rewards_B.shape[0]:
        raise ValueError(
            f"logp must be [B, T] with B = len(rewards) = {rewards_B.shape[0]}, "
            f"got shape {logp_BxT.shape}"
        )
    if isinstance(kl_coef, int | float) and kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    kl_BxT = kl_per_token(
        kl_estimator,
        jnp.where(mask_BxT > 0, logp_BxT, 0.0),
        jnp.where(mask_BxT > 0, ref_logp_BxT, 0.0),
    )
    penalty_B = kl_coef * masked_sum(kl_BxT, mask_BxT, axis=1)
    return rewards_B - jax.lax.stop_gradient(penalty_B)
