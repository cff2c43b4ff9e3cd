"""Truncated importance sampling (TIS) against the rollout engine's log-probs.

The learner's log-prob of a sampled token (`old_logp`, recomputed) differs from the sampler's
(`sampler_logp`): different kernels, precision, or stale weights in asynchronous training. TIS
re-weights the per-token policy loss by ρ = π_old/π_sampler, truncated (ALGORITHMS.md):

| `tis_mode` | weight w (no gradient) |
|---|---|
| `token` | min(exp(old_logp − sampler_logp), C) per token (Yao et al.; OLMo 3 with C = 2) |
| `sequence` | min(exp(Σ_t m·(old_logp − sampler_logp)), C) per row (product of the token ratios) |
| `geometric` | min(exp(mean_t m·(old_logp − sampler_logp)), C) per row (geometric mean) |
| `mask` | drop tokens with ρ outside [tis_low, tis_high] (IcePop); kept: min(ρ, C), or 1 |

Dropped tokens leave the loss and its denominator, so a global denominator counts kept tokens:
`loss_denominator(agg, tis_kept_mask(...), max_len)` (`LossSettings.loss_denominator`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from rlvr_jax.losses.masked import masked_mean, masked_sum
from rlvr_jax.losses.registry import unknown_name


def _token_log_ratio(log_ratio_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    del mask_BxT
    return log_ratio_BxT


def _sequence_log_ratio(log_ratio_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    row_B = masked_sum(log_ratio_BxT, mask_BxT, axis=1)
    return jnp.broadcast_to(row_B[:, None], log_ratio_BxT.shape)


def _geometric_log_ratio(log_ratio_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    row_B = masked_mean(log_ratio_BxT, mask_BxT, axis=1)
    return jnp.broadcast_to(row_B[:, None], log_ratio_BxT.shape)


# `tis_mode` → (log ρ per token [B,T], mask) → the log-weight before truncation [B,T]
TIS_MODES: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "token": _token_log_ratio,
    "sequence": _sequence_log_ratio,
    "geometric": _geometric_log_ratio,
    "mask": _token_log_ratio,
}


@dataclass(frozen=True)
class TisConfig:
    """Validated TIS settings: `cap` C (None = no weighting), `mask` mode's bounds `low` /
    `high` on ρ (None = unbounded); `enabled` when weighting or masking is on."""

    mode: str = "token"
    cap: float | None = None
    low: float | None = None
    high: float | None = None

    def __post_init__(self):
        if self.mode not in TIS_MODES:
            raise unknown_name("tis_mode", self.mode, TIS_MODES)
        if self.cap is not None and not self.cap > 0:
            raise ValueError(f"tis_cap must be > 0 (or None for TIS off), got {self.cap}")
        if self.mode != "mask" and (self.low is not None or self.high is not None):
            raise ValueError(
                f"tis_low/tis_high only apply to tis_mode='mask' (got tis_mode={self.mode!r})"
            )
        if self.mode == "mask":
            if self.low is None and self.high is None:
                raise ValueError("tis_mode='mask' needs tis_low and/or tis_high (e.g. 0.5, 5.0)")
            if self.low is not None and self.low < 0:
                raise ValueError(f"tis_low must be >= 0, got {self.low}")
            if self.low is not None and self.high is not None and not self.low < self.high:
                raise ValueError(f"tis_low must be < tis_high, got [{self.low}, {self.high}]")

    @property
    def enabled(self) -> bool:
        return self.cap is not None or self.mode == "mask"


def tis_kept_mask(
    mask: jax.Array,
    *,
    old_logp: jax.Array,
    sampler_logp: jax.Array,
    tis_low: float | None,
    tis_high: float | None,
) -> jax.Array:
    """`mask` mode's kept tokens: m where tis_low ≤ exp(old − sampler) ≤ tis_high."""
    mask_BxT = jnp.asarray(mask, jnp.float32)
    log_ratio_BxT = jnp.where(mask_BxT > 0, jnp.asarray(old_logp) - jnp.asarray(sampler_logp), 0.0)
    return mask_BxT * _keep_BxT(log_ratio_BxT, tis_low, tis_high)


def _keep_BxT(log_ratio_BxT: jax.Array, low: float | None, high: float | None) -> jax.Array:
    keep_BxT = jnp.ones(log_ratio_BxT.shape, bool)
    if low is not None:
        keep_BxT &= log_ratio_BxT >= (math.log(low) if low > 0 else -jnp.inf)
    if high is not None:
        keep_BxT &= log_ratio_BxT <= math.log(high)
    return keep_BxT.astype(jnp.float32)


def tis_weights(
    config: TisConfig, *, old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(w, keep, log ρ) [B,T], no gradient: w weights the per-token loss, keep (0/1) is 1
    outside `mask` mode, log ρ is the weight's log before truncation."""
    mask_BxT = jnp.asarray(mask, jnp.float32)
    log_ratio_BxT = jnp.where(mask_BxT > 0, old_logp - sampler_logp, 0.0)
    log_ratio_BxT = jax.lax.stop_gradient(log_ratio_BxT)
    log_rho_BxT = TIS_MODES[config.mode](log_ratio_BxT, mask_BxT)
    if config.mode == "mask":
        keep_BxT = _keep_BxT(log_ratio_BxT, config.low, config.high)
    else:
        keep_BxT = jnp.ones_like(mask_BxT)
    if config.cap is None:
        w_BxT = jnp.ones_like(mask_BxT)
    else:
        # min(ρ, C) in log space: exp never overflows, even for a long sequence product.
        w_BxT = jnp.exp(jnp.minimum(log_rho_BxT, math.log(config.cap)))
    return w_BxT, keep_BxT, log_rho_BxT
