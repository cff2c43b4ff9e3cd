"""Aggregation: how per-token losses ℓ[B,T] become one scalar (ALGORITHMS.md, "Aggregation").

Every mode is  Σ_i c_i Σ_t m_{i,t} ℓ_{i,t} / D  with a per-row scale c_i and a denominator D:

| mode | c_i | D |
|---|---|---|
| `token-mean` | 1 | Σ_{i,t} m (tokens) |
| `seq-mean-token-mean` | 1 / Σ_t m_i | B (rows) |
| `seq-mean-token-sum` | 1 | B |
| `seq-mean-token-sum-norm` | 1 | B · T_max (Dr.GRPO; T_max = `max_len`, the generation budget) |

B counts rows with an unmasked token. c_i depends on one row, so a micro-batch computes its own
numerator; D belongs to the whole optimizer batch: pass `loss_denominator(agg, whole_mask,
max_len)` to every micro-batch and their losses (and gradients) sum to the full-batch ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from rlvr_jax.losses.masked import masked_sum, nonempty_rows, row_lengths
from rlvr_jax.losses.registry import unknown_name


@dataclass(frozen=True)
class Aggregation:
    """One mode: `row_scale` mask [B,T] → c [B]; `denominator` (mask, max_len) → D."""

    row_scale: Callable[[jax.Array], jax.Array]
    denominator: Callable[[jax.Array, int | None], jax.Array]
    needs_max_len: bool = False


def _ones_B(mask_BxT: jax.Array) -> jax.Array:
    return jnp.ones(mask_BxT.shape[:1], jnp.float32)


def _inverse_length_B(mask_BxT: jax.Array) -> jax.Array:
    return 1.0 / jnp.maximum(row_lengths(mask_BxT), 1.0)


def _token_count(mask_BxT: jax.Array, max_len: int | None) -> jax.Array:
    del max_len
    return jnp.sum(mask_BxT)


def _row_count(mask_BxT: jax.Array, max_len: int | None) -> jax.Array:
    del max_len
    return jnp.sum(nonempty_rows(mask_BxT))


def _row_count_times_max_len(mask_BxT: jax.Array, max_len: int | None) -> jax.Array:
    assert max_len is not None  # checked by `_check_max_len`
    return jnp.sum(nonempty_rows(mask_BxT)) * float(max_len)


AGGREGATIONS: dict[str, Aggregation] = {
    "token-mean": Aggregation(_ones_B, _token_count),
    "seq-mean-token-mean": Aggregation(_inverse_length_B, _row_count),
    "seq-mean-token-sum": Aggregation(_ones_B, _row_count),
    "seq-mean-token-sum-norm": Aggregation(_ones_B, _row_count_times_max_len, needs_max_len=True),
}


def get_aggregation(agg: str) -> Aggregation:
    """The aggregation mode named `agg`; an unknown name raises, listing the modes."""
    if agg not in AGGREGATIONS:
        raise unknown_name("aggregation", agg, AGGREGATIONS)
    return AGGREGATIONS[agg]


def _check_max_len(agg: str, mode: Aggregation, max_len: int | None) -> None:
    """`max_len` is the generation budget, not the padded length T (rows may hold the prompt)."""
    if not mode.needs_max_len:
        return
    if max_len is None:
        raise ValueError(f"aggregation {agg!r} needs max_len (the generation budget T_max)")
    if not max_len >= 1:
        raise ValueError(f"aggregation {agg!r}: max_len must be >= 1, got {max_len}")


def loss_denominator(agg: str, mask: jax.Array, max_len: int | None = None) -> jax.Array:
    """D of `agg` (float32) for the whole optimizer batch's [B, T] mask (TIS `mask` mode: the
    kept mask, `tis_kept_mask`); `max_len` is T_max (`seq-mean-token-sum-norm`)."""
    mask_BxT = jnp.asarray(mask, jnp.float32)
    if mask_BxT.ndim != 2:
        raise ValueError(f"mask must be [B, T], got shape {mask_BxT.shape}")
    mode = get_aggregation(agg)
    _check_max_len(agg, mode, max_len)
    return mode.denominator(mask_BxT, max_len).astype(jnp.float32)


def aggregate(
    loss_BxT: jax.Array,
    mask_BxT: jax.Array,
    agg: str,
    *,
    denominator: jax.Array | float | None = None,
    max_len: int | None = None,
) -> jax.Array:
    """Σ_i c_i Σ_t m ℓ / D for the mode `agg`; `denominator` None = this batch's own D."""
    mode = get_aggregation(agg)
    _check_max_len(agg, mode, max_len)
    row_sum_B = masked_sum(loss_BxT, mask_BxT, axis=1)
    numerator = jnp.einsum("B,B->", mode.row_scale(mask_BxT), row_sum_B)
    if denominator is None:
        denominator = mode.denominator(mask_BxT, max_len)
    elif isinstance(denominator, int | float) and not denominator > 0:
        raise ValueError(f"loss_denominator must be > 0, got {denominator}")
    # An empty batch has D = 0 and numerator 0: divide by 1 instead (no NaN, no NaN gradient).
    denominator = jnp.asarray(denominator, jnp.float32)
    return numerator / jnp.where(denominator > 0, denominator, 1.0)
