"""Per-token policy losses ℓ[B,T] (to be minimised), one small function per variant.

The contract (see the Losses section of README.md): a variant is called with keyword arrays

    logp        [B,T]  log π_θ of the sampled tokens (the only input with a gradient)
    old_logp    [B,T]  the ratio's denominator (recomputed θ_old log-probs, or the sampler's)
    advantages  [B,T]  the completion's advantage broadcast over its tokens
    mask        [B,T]  float 0/1, the tokens that count (TIS-masked tokens already removed)

plus its own parameters (`eps_low`, `eps_high`, anything in `variant_kwargs`), and returns
ℓ[B,T], or (ℓ[B,T], aux) where aux maps names to [B,T] arrays (averaged over unmasked tokens)
or scalars. aux["clipped"] (bool [B,T]) feeds the `clip_fraction` metric. Values under the
mask's zeros are ignored. `policy_loss` applies TIS, the KL term and the aggregation around it.

Default clip ranges are each variant's keyword defaults (ALGORITHMS.md): ppo_clip 0.2/0.2,
cispo ∞ below / 0.28 above (our choice for ε_high: DAPO's clip-higher value; MiniMax-M1 only
says it tuned ε_high), gspo and gspo_token 3e-4/4e-4.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.losses.masked import masked_mean
from rlvr_jax.losses.registry import Registry, keyword_parameters

LOSSES = Registry("loss variant")
register_loss = LOSSES.register

CONTRACT_ARRAYS = ("logp", "old_logp", "advantages", "mask")


def get_loss(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """The loss variant for a registered name, a `module:function` string or a callable."""
    return LOSSES.get(ref)


def variant_parameters(fn: Callable[..., Any]) -> dict[str, Any]:
    """A variant's own keyword parameters and defaults (`inspect.Parameter.empty` for none)."""
    return keyword_parameters(fn, CONTRACT_ARRAYS)


def _clipped_surrogate(
    ratio_BxT: jax.Array, advantages_BxT: jax.Array, eps_low: float, eps_high: float
) -> tuple[jax.Array, jax.Array]:
    """ℓ = −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A) and where the clipped branch is active."""
    unclipped_BxT = ratio_BxT * advantages_BxT
    clipped_BxT = jnp.clip(ratio_BxT, 1.0 - eps_low, 1.0 + eps_high) * advantages_BxT
    return -jnp.minimum(unclipped_BxT, clipped_BxT), clipped_BxT < unclipped_BxT


@register_loss("ppo_clip")
def ppo_clip(
    *,
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO/GRPO/DAPO clipped surrogate with asymmetric ranges and an optional dual clip.

    ℓ = −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A), r = exp(logp − old_logp); with `dual_clip` c
    (> 1, typically 3), tokens with A < 0 get ℓ = min(ℓ, −c·A), bounding the loss of a
    very large ratio on a bad completion.
    """
    del mask
    ratio_BxT = jnp.exp(logp - old_logp)
    loss_BxT, clipped_BxT = _clipped_surrogate(ratio_BxT, advantages, eps_low, eps_high)
    if dual_clip is None:
        return loss_BxT, {"clipped": clipped_BxT}
    if isinstance(dual_clip, int | float) and not dual_clip > 1.0:
        raise ValueError(f"ppo_clip: dual_clip must be > 1 (typically 3), got {dual_clip}")
    dual_bound_BxT = -dual_clip * advantages
    dual_active_BxT = (advantages < 0) & (loss_BxT > dual_bound_BxT)
    loss_BxT = jnp.where(dual_active_BxT, dual_bound_BxT, loss_BxT)
    return loss_BxT, {"clipped": clipped_BxT | dual_active_BxT, "dual_clipped": dual_active_BxT}


@register_loss("cispo")
def cispo(
    *,
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    eps_low: float = math.inf,
    eps_high: float = 0.28,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """CISPO (MiniMax-M1): ℓ = −sg(clip(r, 1−ε_low, 1+ε_high))·A·logp.

    The importance weight is clipped, not the update: every token keeps a gradient. "clipped"
    marks tokens whose weight was truncated.
    """
    del mask
    ratio_BxT = jax.lax.stop_gradient(jnp.exp(logp - old_logp))
    weight_BxT = jnp.clip(ratio_BxT, 1.0 - eps_low, 1.0 + eps_high)
    clipped_BxT = (ratio_BxT > 1.0 + eps_high) | (ratio_BxT < 1.0 - eps_low)
    return -weight_BxT * advantages * logp, {"clipped": clipped_BxT}


def _sequence_log_ratio_B(logp: jax.Array, old_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """log s_i = (1/|o_i|) Σ_t m·(logp − old_logp), [B]; 0 for an empty row."""
    return masked_mean(logp - old_logp, mask, axis=1)


@register_loss("gspo")
def gspo(
    *,
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GSPO: the PPO surrogate on the sequence ratio s_i = exp(mean_t (logp − old_logp)).

    ℓ_{i,t} = −min(s_i·A_i, clip(s_i, 1−ε_low, 1+ε_high)·A_i) on every token of row i.
    """
    log_s_B = _sequence_log_ratio_B(logp, old_logp, mask)
    s_BxT = jnp.broadcast_to(jnp.exp(log_s_B)[:, None], logp.shape)
    loss_BxT, clipped_BxT = _clipped_surrogate(s_BxT, advantages, eps_low, eps_high)
    return loss_BxT, {"clipped": clipped_BxT}


@register_loss("gspo_token")
def gspo_token(
    *,
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GSPO-token: s_{i,t} = sg(s_i)·exp(logp − sg(logp)) in the same clipped surrogate.

    Numerically s_{i,t} = s_i, but each token's gradient is its own (∂s_{i,t}/∂logp_t = s_i,
    where `gspo` spreads s_i/|o_i| over the row), so per-token advantages are possible.
    """
    s_B = jax.lax.stop_gradient(jnp.exp(_sequence_log_ratio_B(logp, old_logp, mask)))
    s_BxT = s_B[:, None] * jnp.exp(logp - jax.lax.stop_gradient(logp))
    loss_BxT, clipped_BxT = _clipped_surrogate(s_BxT, advantages, eps_low, eps_high)
    return loss_BxT, {"clipped": clipped_BxT}


@register_loss("reinforce", "pg")
def reinforce(
    *, logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array
) -> jax.Array:
    """Vanilla policy gradient: ℓ = −A·logp (no ratio, no clipping)."""
    del old_logp, mask
    return -advantages * logp
