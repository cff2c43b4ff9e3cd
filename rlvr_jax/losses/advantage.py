"""Advantage estimators: one scalar per completion from the rewards of its group.

Every estimator maps `rewards_PxG` (P prompts × G completions each) to `advantages_PxG`, and is
registered by name (ALGORITHMS.md, "Advantages"):

| name | A_i |
|---|---|
| `grpo` | (R_i − mean_g R) / (std_g R + ε), unbiased std, ε = 1e-6; G = 1 gives 0 |
| `drgrpo`, `olmo` | R_i − mean_g R |
| `rloo` | R_i − mean_{j≠i} R_j = G/(G−1)·(R_i − mean_g R); G = 1 gives 0 |
| `reinforce_pp_baseline` | A′ = R_i − mean_g R, whitened: (A′ − mean_batch A′)/(std A′ + ε) |
| `reinforce` | R_i, or R_i − mean_batch R with `subtract_batch_mean=True` |

A user estimator is `fn(rewards_PxG, **kwargs) -> advantages_PxG` (`@register_advantage`). The
built-ins compute in the rewards' own array library, so host (NumPy) rewards never reach XLA
(eager jnp would compile per op for every new group count, mid-run). `loss.advantage: gae` is
per token, from a critic (`losses.gae`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.losses.gae import GAE
from rlvr_jax.losses.registry import Registry, RegistryError, display_name

ADVANTAGES = Registry("advantage estimator")
register_advantage = ADVANTAGES.register

GRPO_EPS = 1e-6
"""ε added to the std in the `grpo` and `reinforce_pp_baseline` denominators."""


def get_advantage(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """The advantage estimator for a registered name, a `module:function` string or a callable."""
    if ref == GAE:
        raise RegistryError(
            "advantage 'gae' is token-level: the learner computes it from the critic's values "
            "(rlvr_jax.losses.gae); it is not an estimator over group rewards"
        )
    try:
        return ADVANTAGES.get(ref)
    except RegistryError as e:
        if isinstance(ref, str) and ":" not in ref:  # an unknown name: gae is one too
            raise RegistryError(f"{e}; or 'gae' (per token, with a learned critic)") from None
        raise


def _xp(x: Any) -> Any:
    """jax.numpy for jax arrays (tracers included), else NumPy."""
    return jnp if isinstance(x, jax.Array) else np


def _unbiased_std(x: jax.Array, axis: int) -> jax.Array:
    """Sample std (N−1 denominator) along `axis`, keeping the axis; needs N ≥ 2."""
    return _xp(x).std(x, axis=axis, ddof=1, keepdims=True)


def _centred(rewards_PxG: jax.Array) -> jax.Array:
    return rewards_PxG - _xp(rewards_PxG).mean(rewards_PxG, axis=1, keepdims=True)


@register_advantage("grpo")
def grpo(rewards_PxG: jax.Array, *, eps: float = GRPO_EPS) -> jax.Array:
    """Group z-score (DeepSeekMath): (R − mean_g R) / (std_g R + ε), std unbiased."""
    if rewards_PxG.shape[1] == 1:
        return _xp(rewards_PxG).zeros_like(rewards_PxG)
    return _centred(rewards_PxG) / (_unbiased_std(rewards_PxG, axis=1) + eps)


@register_advantage("drgrpo", "olmo")
def drgrpo(rewards_PxG: jax.Array) -> jax.Array:
    """Group mean-centred rewards (Dr.GRPO; OLMo 3): R − mean_g R, no std normalisation."""
    return _centred(rewards_PxG)


@register_advantage("rloo")
def rloo(rewards_PxG: jax.Array) -> jax.Array:
    """Leave-one-out baseline: R_i − mean_{j≠i} R_j = G/(G−1)·(R_i − mean_g R)."""
    group_size = rewards_PxG.shape[1]
    if group_size == 1:
        return _xp(rewards_PxG).zeros_like(rewards_PxG)
    return group_size / (group_size - 1) * _centred(rewards_PxG)


@register_advantage("reinforce_pp_baseline")
def reinforce_pp_baseline(rewards_PxG: jax.Array, *, eps: float = GRPO_EPS) -> jax.Array:
    """REINFORCE++ with a group baseline, whitened over all completions of the batch."""
    xp = _xp(rewards_PxG)
    centred_PxG = _centred(rewards_PxG)
    if centred_PxG.size == 1:
        return xp.zeros_like(rewards_PxG)
    flat_N = centred_PxG.reshape(-1)
    return (centred_PxG - xp.mean(flat_N)) / (xp.std(flat_N, ddof=1) + eps)


@register_advantage("reinforce")
def reinforce(rewards_PxG: jax.Array, *, subtract_batch_mean: bool = False) -> jax.Array:
    """Plain REINFORCE: the reward itself, optionally minus the batch mean reward."""
    if subtract_batch_mean:
        return rewards_PxG - _xp(rewards_PxG).mean(rewards_PxG)
    return rewards_PxG


def advantages(name: str | Callable[..., Any], rewards_PxG: jax.Array, **kwargs: Any) -> jax.Array:
    """Advantages [P, G] from rewards [P, G] (P prompts × G completions) with the named
    estimator and its `kwargs`, float32 in the rewards' array library (NumPy for lists)."""
    xp = _xp(rewards_PxG)
    rewards_PxG = xp.asarray(rewards_PxG, dtype=xp.float32)
    if rewards_PxG.ndim != 2 or 0 in rewards_PxG.shape:
        raise ValueError(
            f"rewards must be a non-empty [P, G] array (prompts × group size), "
            f"got shape {rewards_PxG.shape}"
        )
    fn = get_advantage(name)
    adv_PxG = xp.asarray(fn(rewards_PxG, **kwargs), dtype=xp.float32)
    if adv_PxG.shape != rewards_PxG.shape:
        raise ValueError(
            f"advantage estimator {display_name(name)!r} returned shape {adv_PxG.shape}, "
            f"expected the rewards' shape {rewards_PxG.shape}"
        )
    return adv_PxG
