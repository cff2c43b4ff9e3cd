"""SFT: the next-token loss on response tokens only, and its pure train step.

The batch is a `TokenBatch` from `batch.collate_sft` (`mask` on the response tokens). The loss
is the token mean of −log π(target) over the mask, its denominator taken over the **whole
optimizer batch** (the RL loss's `token-mean`), so micro-batch losses and gradients sum to the
full-batch ones. `scripts/pretrain_tiny.py` pretrains with `collate_sft(..., pack=True)`, a
document as a one-token "prompt" and the rest as its response.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlvr_jax import losses, models
from rlvr_jax.training.batch import TokenBatch, collate_sft, pack_examples
from rlvr_jax.training.learner import token_logprobs
from rlvr_jax.training.update import TrainState, gradient_step, summed

__all__ = ["SFT_AGGREGATION", "collate_sft", "make_sft_step", "pack_examples", "sft_loss"]

SFT_AGGREGATION = "token-mean"
"""How per-token SFT losses become one scalar (the RL loss's OLMo 3 aggregation)."""


def sft_loss(
    params: Any,
    arch: models.ArchConfig,
    batch: TokenBatch,
    *,
    compute_dtype: Any = jnp.float32,
    loss_denominator: jax.Array | float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Σ_{b,t} mask·(−log π(target_ids | input_ids≤t)) / D and `sft/token_accuracy` (argmax
    hits / D): D is `loss_denominator` (the whole batch's response tokens when this is a
    micro-batch of it), else this batch's own token count."""
    mask_BxT = batch.mask_BxT.astype(jnp.float32)
    if loss_denominator is None:
        loss_denominator = losses.loss_denominator(SFT_AGGREGATION, mask_BxT)
    logp_BxT, logits_BxTxV = token_logprobs(
        params, arch, batch, compute_dtype=compute_dtype, temperature=1.0, return_logits=True
    )
    loss = losses.aggregate(-logp_BxT, mask_BxT, SFT_AGGREGATION, denominator=loss_denominator)
    hit_BxT = (jnp.argmax(logits_BxTxV, axis=-1) == batch.target_ids_BxT).astype(jnp.float32)
    accuracy = losses.aggregate(hit_BxT, mask_BxT, SFT_AGGREGATION, denominator=loss_denominator)
    return loss, {"sft/token_accuracy": accuracy}


def make_sft_step(
    arch: models.ArchConfig,
    optimizer: optax.GradientTransformation,
    *,
    compute_dtype: Any = jnp.float32,
    n_micro: int | None = None,
) -> Callable[[TrainState, TokenBatch], tuple[TrainState, dict[str, jax.Array]]]:
    """The pure SFT step `(state, batch) -> (state, metrics)` (un-jitted): one optimizer step,
    gradients accumulated over `n_micro` micro-batches against the whole batch's denominator; a
    non-finite step is skipped (`state.skipped`). Metrics: `loss`, `grad_norm`, `step_ok`,
    `sft/tokens` and `sft/token_accuracy`."""
    if n_micro is not None and n_micro < 1:
        raise ValueError(f"make_sft_step: n_micro must be >= 1, got {n_micro}")

    objective = sft_objective(arch, compute_dtype=compute_dtype)

    def step(state: TrainState, batch: TokenBatch):
        loss_fn = objective(batch)
        new_state, metrics, sums_M = gradient_step(state, loss_fn, batch, optimizer, n_micro)
        tokens = losses.loss_denominator(SFT_AGGREGATION, batch.mask_BxT)
        return new_state, {**summed(sums_M), **metrics, "sft/tokens": tokens}

    return step


def sft_objective(arch: models.ArchConfig, *, compute_dtype: Any = jnp.float32) -> Callable:
    """`for_batch(batch) -> loss_fn(params, micro_batch)`: `sft_loss` of micro-batches of
    `batch` over the whole batch's response-token count; its metrics include the `loss`."""

    def for_batch(batch: TokenBatch):
        denominator = losses.loss_denominator(SFT_AGGREGATION, batch.mask_BxT)

        def loss_fn(params, micro_batch):
            loss, metrics = sft_loss(
                params, arch, micro_batch, compute_dtype=compute_dtype, loss_denominator=denominator
            )
            return loss, {"loss": loss, **metrics}

        return loss_fn

    return for_batch
