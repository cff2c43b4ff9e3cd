"""Masked reductions shared by the aggregation, TIS and metrics code.

Masks are float arrays of 0/1 with the data's shape. Reductions over an empty mask return 0
(not NaN), so an all-masked micro-batch contributes nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_sum(x: jax.Array, mask: jax.Array, axis: int | None = None) -> jax.Array:
    """Σ x over the unmasked entries (masked entries may hold any value, NaN included)."""
    return jnp.sum(jnp.where(mask > 0, x, 0.0), axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis: int | None = None) -> jax.Array:
    """Mean of x over the unmasked entries; 0 where nothing is unmasked."""
    count = jnp.sum(mask, axis=axis)
    return masked_sum(x, mask, axis) / jnp.maximum(count, 1.0)


def masked_std(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Population std of x over all unmasked entries; 0 where nothing is unmasked."""
    mean = masked_mean(x, mask)
    return jnp.sqrt(masked_mean(jnp.square(x - mean), mask))


def masked_min(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Min of x over all unmasked entries; 0 where nothing is unmasked."""
    lo = jnp.min(jnp.where(mask > 0, x, jnp.inf))
    return jnp.where(jnp.any(mask > 0), lo, 0.0)


def masked_max(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Max of x over all unmasked entries; 0 where nothing is unmasked."""
    hi = jnp.max(jnp.where(mask > 0, x, -jnp.inf))
    return jnp.where(jnp.any(mask > 0), hi, 0.0)


def row_lengths(mask_BxT: jax.Array) -> jax.Array:
    """Unmasked tokens per row, [B]."""
    return jnp.sum(mask_BxT, axis=1)


def nonempty_rows(mask_BxT: jax.Array) -> jax.Array:
    """1.0 for rows with at least one unmasked token, else 0.0; [B]."""
    return (row_lengths(mask_BxT) > 0).astype(jnp.float32)
