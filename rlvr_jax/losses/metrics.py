"""Diagnostics reported next to the policy loss (no gradient flows through any of them).

Keys (DESIGN.md's metric names where they exist): `clip_fraction`, `ratio/mean|min|max`,
`kl/old_new` (approximate KL(old‖new): mean k3 with δ = old_logp − logp), `kl/sampler_learner`
(k3 of the learner's old_logp against the sampler's log-probs: the rollout engine's health signal),
`kl/ref` (the configured estimator against the reference), `tis/mean|min|max`,
`tis/truncated_fraction`, `tis/masked_fraction`, `entropy` (from logits), `advantages/mean|std|
min|max`, `tokens` (unmasked tokens that entered the loss), `variant/<key>` (a variant's aux);
`mismatch/*` and `lag/*` (`mismatch_metrics`: `kl/sampler_learner` split by policy version).
All means are over this call's unmasked tokens (rows for [B] advantages).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.losses.kl import k3
from rlvr_jax.losses.masked import (
    masked_max,
    masked_mean,
    masked_min,
    masked_std,
    nonempty_rows,
)


def _stats(prefix: str, x: jax.Array, mask: jax.Array, *, std: bool = False) -> dict[str, Any]:
    out = {
        f"{prefix}/mean": masked_mean(x, mask),
        f"{prefix}/min": masked_min(x, mask),
        f"{prefix}/max": masked_max(x, mask),
    }
    if std:
        out[f"{prefix}/std"] = masked_std(x, mask)
    return out


def token_entropy(logits_BxTxV: jax.Array) -> jax.Array:
    """Entropy of softmax(logits) per token, in fp32, [B,T]."""
    logp_BxTxV = jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32), axis=-1)
    return -jnp.einsum("BTV,BTV->BT", jnp.exp(logp_BxTxV), logp_BxTxV)


def ratio_metrics(
    logp_BxT: jax.Array, denom_logp_BxT: jax.Array, mask_BxT: jax.Array
) -> dict[str, jax.Array]:
    """Ratio r = exp(logp − denominator) stats and the approximate KL(old‖new)."""
    out = _stats("ratio", jnp.exp(logp_BxT - denom_logp_BxT), mask_BxT)
    out["kl/old_new"] = masked_mean(k3(logp_BxT, denom_logp_BxT), mask_BxT)
    return out


def tis_metrics(
    w_BxT: jax.Array,
    keep_BxT: jax.Array,
    log_rho_BxT: jax.Array,
    mask_BxT: jax.Array,
    cap: float | None,
) -> dict[str, jax.Array]:
    """TIS weight stats over the kept tokens, and the truncated / masked fractions."""
    kept_BxT = mask_BxT * keep_BxT
    out = _stats("tis", w_BxT, kept_BxT)
    truncated_BxT = log_rho_BxT > math.log(cap) if cap is not None else jnp.zeros(w_BxT.shape, bool)
    out["tis/truncated_fraction"] = masked_mean(truncated_BxT.astype(jnp.float32), kept_BxT)
    out["tis/masked_fraction"] = 1.0 - jnp.sum(kept_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0)
    return out


def mismatch_metrics(
    old_logp_BxT: jax.Array, sampler_logp_BxT: jax.Array, mask_BxT: jax.Array, lag_BxT: jax.Array
) -> dict[str, jax.Array]:
    """`kl/sampler_learner` apart from policy lag. `mismatch/kl`, `mismatch/max_abs_logp` (max
    |old_logp − sampler_logp|) and `mismatch/bitwise_equal_fraction` over the tokens whose whole
    context the sampler computed with the params the learner scores them with (`lag_BxT` = 0):
    the numerical gap between sampler and learner; `lag/kl` over the rest (sampled by older
    params, or after an in-flight update on a KV cache they computed); `mismatch/tokens` and
    `lag/tokens` count them. Each is 0 over no tokens."""
    kl_BxT = k3(sampler_logp_BxT, old_logp_BxT)
    same_BxT = jnp.where(lag_BxT == 0, mask_BxT, 0.0)
    rest_BxT = mask_BxT - same_BxT
    equal_BxT = (old_logp_BxT == sampler_logp_BxT).astype(jnp.float32)
    return {
        "mismatch/kl": masked_mean(kl_BxT, same_BxT),
        "mismatch/max_abs_logp": masked_max(jnp.abs(old_logp_BxT - sampler_logp_BxT), same_BxT),
        "mismatch/bitwise_equal_fraction": masked_mean(equal_BxT, same_BxT),
        "mismatch/tokens": jnp.sum(same_BxT),
        "lag/kl": masked_mean(kl_BxT, rest_BxT),
        "lag/tokens": jnp.sum(rest_BxT),
    }


def advantage_metrics(advantages: jax.Array, mask_BxT: jax.Array) -> dict[str, jax.Array]:
    """Advantage stats over non-empty rows ([B] advantages) or unmasked tokens ([B,T])."""
    weight = nonempty_rows(mask_BxT) if advantages.ndim == 1 else mask_BxT
    return _stats("advantages", advantages, weight, std=True)


def aux_metrics(aux: dict[str, Any], mask_BxT: jax.Array) -> dict[str, jax.Array]:
    """A variant's aux: `clipped` → clip_fraction, others → `variant/<key>` ([B,T] averaged
    over unmasked tokens, scalars as they are)."""
    out = {"clip_fraction": jnp.zeros((), jnp.float32)}
    for key, value in aux.items():
        value = jnp.asarray(value)
        if value.shape == mask_BxT.shape:
            value = masked_mean(value.astype(jnp.float32), mask_BxT)
        elif value.shape != ():
            raise ValueError(
                f"variant aux metric {key!r} has shape {value.shape}; expected [B,T] "
                f"{mask_BxT.shape} or a scalar"
            )
        out["clip_fraction" if key == "clipped" else f"variant/{key}"] = value
    return out
