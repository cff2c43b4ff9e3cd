"""DPO: preference pairs on the learner's token grid, their per-sequence log-probs, and the pure
DPO train step.

A pair (prompt x, chosen y_w, rejected y_l) is two sequences, x + y_w and x + y_l, laid out by
`batch.collate_sft`. The step sums log π_θ over each response's tokens (a segment sum by pair,
whatever the layout), feeds the [P] sums to `losses.preference_loss`, and divides by the pair
count of the **whole optimizer batch**, so micro-batch gradients sum to the full-batch one. A
pair's two sequences share a micro-batch (`collate_pairs(..., groups=n_micro)`).

Letters: B rows, T positions, P pairs of the batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlvr_jax import losses, models
from rlvr_jax.training.batch import TokenBatch, collate_sft, vars_of
from rlvr_jax.training.learner import NO_MEMORY_SAVING, MemoryOptions, token_logprobs
from rlvr_jax.training.update import TrainState, gradient_step, summed

__all__ = ["PreferenceBatch", "collate_pairs", "make_dpo_step", "sequence_sums"]


@flax.struct.dataclass
class PreferenceBatch(TokenBatch):
    """`TokenBatch` of both responses of P pairs, with each target token's pair and side."""

    pair_BxT: Any = None
    """int32: the pair (0..P−1 over the whole batch) of each response token; 0 off the mask."""
    chosen_BxT: Any = None
    """float32: 1 on chosen-response tokens (the rejected ones are `mask_BxT − chosen_BxT`)."""
    ref_logp_BxT: Any = None
    """float32: reference log-probs whose sum over a response's tokens is log π_ref(y | x):
    per token when computed on the fly, the whole sum on the response's first token when it
    comes from the cache; 0 elsewhere. None for a reference-free loss."""


def collate_pairs(
    prompts: Sequence[Sequence[int]],
    chosen: Sequence[Sequence[int]],
    rejected: Sequence[Sequence[int]],
    *,
    rows: int,
    seq_len: int,
    pad_id: int,
    pack: bool = False,
    groups: int = 1,
    ref_chosen: Sequence[float] | None = None,
    ref_rejected: Sequence[float] | None = None,
) -> PreferenceBatch:
    """The batch of P pairs (numpy arrays [rows, seq_len − 1]): `groups` consecutive groups of
    pairs (the micro-batches), each laid out by `collate_sft` in its own rows / groups rows,
    chosen then rejected. `ref_chosen` / `ref_rejected` ([P] summed reference log-probs, e.g.
    from the cache) go on each response's first token of `ref_logp_BxT`.

    Raises ValueError naming the problem: lists of different lengths, P or rows not divisible by
    `groups`, and `collate_sft`'s errors.
    """
    P = len(prompts)
    if not P or len(chosen) != P or len(rejected) != P:
        raise ValueError(
            f"collate_pairs: {P} prompts, {len(chosen)} chosen and {len(rejected)} rejected "
            "responses; need the same number, at least 1"
        )
    if groups < 1 or P % groups or rows % groups:
        raise ValueError(
            f"collate_pairs: {P} pairs in {rows} rows do not split into {groups} micro-batches"
        )
    per, rows_per = P // groups, rows // groups
    parts, ids = [], []
    for g in range(groups):
        pairs = range(g * per, (g + 1) * per)
        seq_prompts = [prompts[i] for i in pairs for _ in (0, 1)]
        responses = [r for i in pairs for r in (chosen[i], rejected[i])]
        common = dict(rows=rows_per, seq_len=seq_len, pack=pack)
        parts.append(collate_sft(seq_prompts, responses, pad_id=pad_id, **common))
        # the same layout (it depends on the lengths only) with sequence k's tokens all k + 1:
        # its targets name the sequence of every response token, whatever the packer did
        first = 2 * g * per
        marks = [[first + k + 1] * len(p) for k, p in enumerate(seq_prompts)]
        marked = [[first + k + 1] * len(r) for k, r in enumerate(responses)]
        ids.append(collate_sft(marks, marked, pad_id=0, **common).target_ids_BxT)
    tokens = {k: np.concatenate([vars_of(p)[k] for p in parts]) for k in vars_of(parts[0])}
    mask_BxT = tokens["mask_BxT"]
    seq_BxT = np.where(mask_BxT > 0, np.concatenate(ids) - 1, 0)
    pair_BxT = (seq_BxT // 2).astype(np.int32)
    chosen_BxT = (mask_BxT * (seq_BxT % 2 == 0)).astype(np.float32)
    ref_BxT = None
    if ref_chosen is not None and ref_rejected is not None:
        ref_S = np.stack([np.asarray(ref_chosen), np.asarray(ref_rejected)], axis=1).reshape(-1)
        flat = np.flatnonzero(mask_BxT.reshape(-1) > 0)
        seqs, first = np.unique(seq_BxT.reshape(-1)[flat], return_index=True)
        ref_BxT = np.zeros(mask_BxT.size, np.float32)
        ref_BxT[flat[first]] = ref_S[seqs]
        ref_BxT = ref_BxT.reshape(mask_BxT.shape)
    return PreferenceBatch(**tokens, pair_BxT=pair_BxT, chosen_BxT=chosen_BxT, ref_logp_BxT=ref_BxT)


def sequence_sums(
    x_BxT: jax.Array, batch: PreferenceBatch, pairs: int
) -> tuple[jax.Array, jax.Array]:
    """(Σ x over each pair's chosen tokens, Σ over its rejected tokens), each [pairs]."""
    chosen_BxT = batch.chosen_BxT
    rejected_BxT = batch.mask_BxT - chosen_BxT
    pair = batch.pair_BxT.reshape(-1)

    def total(side_BxT: jax.Array) -> jax.Array:
        values = jnp.where(side_BxT > 0, x_BxT, 0.0).reshape(-1)
        return jax.ops.segment_sum(values, pair, num_segments=pairs)

    return total(chosen_BxT), total(rejected_BxT)


def pair_lengths(batch: PreferenceBatch, pairs: int) -> tuple[jax.Array, jax.Array]:
    """(chosen, rejected) response lengths in tokens, [pairs]; 0 for a pair not in `batch`."""
    return sequence_sums(jnp.ones_like(batch.mask_BxT, dtype=jnp.float32), batch, pairs)


def present_pairs(batch: PreferenceBatch, pairs: int) -> jax.Array:
    """1.0 for the pairs with both responses in `batch` (a micro-batch holds some), [pairs]."""
    len_w, len_l = pair_lengths(batch, pairs)
    return ((len_w > 0) & (len_l > 0)).astype(jnp.float32)


def make_dpo_step(
    arch: models.ArchConfig,
    optimizer: optax.GradientTransformation,
    *,
    pairs: int,
    variant: str | Callable[..., Any] = "dpo",
    beta: float = 0.1,
    variant_kwargs: dict[str, Any] | None = None,
    n_micro: int = 1,
    compute_dtype: Any = jnp.float32,
    memory: MemoryOptions = NO_MEMORY_SAVING,
) -> Callable[[TrainState, PreferenceBatch], tuple[TrainState, dict[str, jax.Array]]]:
    """The pure DPO step `(state, batch) -> (state, metrics)` (un-jitted): one optimizer step
    over the `pairs` pairs of `batch`, gradients accumulated over `n_micro` micro-batches
    against the whole batch's pair count; a non-finite step is skipped. Metrics: `loss`,
    `grad_norm`, `step_ok`, `dpo/pairs` and `preference_loss`'s `dpo/...`."""
    if n_micro < 1:
        raise ValueError(f"make_dpo_step: n_micro must be >= 1, got {n_micro}")
    if pairs < 1:
        raise ValueError(f"make_dpo_step: pairs must be >= 1, got {pairs}")
    kwargs = dict(variant_kwargs or {})

    def loss_fn(params: Any, mb: PreferenceBatch, denominator: jax.Array):
        """`losses.preference_loss` of a micro-batch's pairs over the whole batch's count."""
        logp_BxT = token_logprobs(
            params, arch, mb, compute_dtype=compute_dtype, temperature=1.0, memory=memory
        )
        logp_w, logp_l = sequence_sums(logp_BxT, mb, pairs)
        len_w, len_l = pair_lengths(mb, pairs)
        if mb.ref_logp_BxT is None:
            ref_w = ref_l = jnp.zeros_like(logp_w)
        else:
            ref_w, ref_l = sequence_sums(mb.ref_logp_BxT, mb, pairs)
        loss, metrics = losses.preference_loss(
            variant,
            chosen_logp=logp_w,
            rejected_logp=logp_l,
            ref_chosen_logp=ref_w,
            ref_rejected_logp=ref_l,
            beta=beta,
            chosen_len=len_w,
            rejected_len=len_l,
            mask=(len_w > 0) & (len_l > 0),
            loss_denominator=denominator,
            **kwargs,
        )
        return loss, {"loss": loss, **metrics}

    def step(state: TrainState, batch: PreferenceBatch):
        present = jnp.sum(present_pairs(batch, pairs))
        objective = functools.partial(loss_fn, denominator=present)
        new_state, metrics, sums_M = gradient_step(state, objective, batch, optimizer, n_micro)
        return new_state, {**summed(sums_M), **metrics, "dpo/pairs": present}

    return step
