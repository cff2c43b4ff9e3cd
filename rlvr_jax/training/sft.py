"""SFT: the next-token loss on response tokens only, and its pure train step.

The batch layout is `rlvr_jax.training.batch.collate`'s: an example is prompt + response laid
on a row of S tokens, and the arrays live on the shifted grid of T = S − 1 (`input_ids[t] =
row[t]`, `target_ids[t] = row[t+1]`); `mask[t] = 1` where `target_ids[t]` is a response token.
The loss is the token mean of −log π(target) over the mask, with the denominator (the response
token count) taken over the **whole optimizer batch**, exactly as the RL loss's `token-mean`
aggregation: micro-batch losses and gradients then sum to the full-batch ones.

`collate_sft(..., pack=True)` places several examples on one row (each its own segment, its
positions restarting at 0; tokens attend within their segment only), which is how
`scripts/pretrain_tiny.py` pretrains: a document is a one-token "prompt" and a response that
is the rest of it, so the mask covers every token but the first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlvr_jax import losses, models
from rlvr_jax.training.learner import TrainState, _split_micro, token_logprobs

SFT_AGGREGATION = "token-mean"
"""How per-token SFT losses become one scalar (the RL loss's OLMo 3 aggregation)."""

SFT_KEYS = ("input_ids", "target_ids", "positions", "segment_ids", "mask")
"""The arrays of an SFT batch (each [rows, seq_len − 1])."""


def pack_examples(lengths: Sequence[int], *, rows: int, seq_len: int) -> list[tuple[int, int]]:
    """(row, offset) of each example of the longest prefix of `lengths` that fits `rows` rows
    of `seq_len` tokens, filling rows in order: an example goes after the previous one when it
    fits there, else at the start of the next row. Raises ValueError for an example longer than
    `seq_len` or shorter than 2 tokens (nothing to predict)."""
    placements: list[tuple[int, int]] = []
    row, offset = 0, 0
    for i, n in enumerate(lengths):
        if n < 2 or n > seq_len:
            raise ValueError(f"pack_examples: example {i} has {n} tokens; need 2..{seq_len}")
        if offset + n > seq_len:
            row, offset = row + 1, 0
        if row >= rows:
            break
        placements.append((row, offset))
        offset += n
    return placements


def collate_sft(
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    *,
    rows: int,
    seq_len: int,
    pad_id: int,
    pack: bool = False,
) -> dict[str, np.ndarray]:
    """The SFT batch: `input_ids`, `target_ids`, `positions`, `segment_ids`, `mask`, each
    [rows, seq_len − 1], in `batch.collate`'s layout (one example per row, unused rows all
    padding and masked). With `pack`, examples share rows (see `pack_examples`): example k of a
    row has segment id k + 1 and positions 0, 1, ... from its first token.

    Raises ValueError naming the example when a prompt is empty, a response is empty, the lists
    differ in length, or the examples do not fit.
    """
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError(
            f"collate_sft: {len(prompt_ids_list)} prompts but {len(response_ids_list)} responses"
        )
    for i, (p, r) in enumerate(zip(prompt_ids_list, response_ids_list)):
        if len(p) == 0 or len(r) == 0:
            raise ValueError(
                f"collate_sft: example {i} has {len(p)} prompt and {len(r)} response tokens; "
                "both must be non-empty"
            )
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids_list, response_ids_list)]
    if pack:
        placements = pack_examples(lengths, rows=rows, seq_len=seq_len)
    else:
        too_long = [i for i, n in enumerate(lengths) if n > seq_len]
        if too_long:
            i = too_long[0]
            raise ValueError(f"collate_sft: example {i} has {lengths[i]} tokens > {seq_len}")
        placements = [(i, 0) for i in range(min(len(lengths), rows))]
    if len(placements) < len(lengths):
        how = "packed into" if pack else "one per row in"
        raise ValueError(f"collate_sft: {len(lengths)} examples do not fit {how} {rows} rows")

    ids_BxS = np.full((rows, seq_len), pad_id, np.int32)
    seg_BxS = np.zeros((rows, seq_len), np.int32)
    pos_BxS = np.broadcast_to(np.arange(seq_len, dtype=np.int32), (rows, seq_len)).copy()
    mask_BxT = np.zeros((rows, seq_len - 1), np.float32)
    for (row, start), p, r in zip(placements, prompt_ids_list, response_ids_list):
        n_p, end = len(p), start + len(p) + len(r)
        ids_BxS[row, start : start + n_p] = p
        ids_BxS[row, start + n_p : end] = r
        seg_BxS[row, start:end] = seg_BxS[row, :start].max(initial=0) + 1
        pos_BxS[row, start:end] -= start
        # response token j sits at row index start + n_p + j, i.e. shifted index one less
        mask_BxT[row, start + n_p - 1 : end - 1] = 1.0
    return {
        "input_ids": ids_BxS[:, :-1],
        "target_ids": ids_BxS[:, 1:],
        "positions": pos_BxS[:, :-1],
        "segment_ids": seg_BxS[:, :-1],
        "mask": mask_BxT,
    }


def sft_loss(
    params: Any,
    arch: models.ArchConfig,
    batch: dict[str, jax.Array],
    *,
    compute_dtype: Any = jnp.float32,
    loss_denominator: jax.Array | float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Σ_{b,t} mask·(−log π(target_ids | input_ids≤t)) / D, and metrics.

    D is `loss_denominator` (the whole optimizer batch's response-token count when this batch
    is one micro-batch of it) or, when None, this batch's own token count. The metric
    `sft/token_accuracy` (the target is the argmax) is also divided by D, so that micro-batch
    values sum to the full batch's.
    """
    mask_BxT = batch["mask"].astype(jnp.float32)
    if loss_denominator is None:
        loss_denominator = losses.loss_denominator(SFT_AGGREGATION, mask_BxT)
    logp_BxT, logits_BxTxV = token_logprobs(
        params, arch, batch, compute_dtype=compute_dtype, temperature=1.0, return_logits=True
    )
    loss = losses.aggregate(-logp_BxT, mask_BxT, SFT_AGGREGATION, denominator=loss_denominator)
    hit_BxT = (jnp.argmax(logits_BxTxV, axis=-1) == batch["target_ids"]).astype(jnp.float32)
    accuracy = losses.aggregate(hit_BxT, mask_BxT, SFT_AGGREGATION, denominator=loss_denominator)
    return loss, {"sft/token_accuracy": accuracy}


def make_sft_step(
    arch: models.ArchConfig,
    optimizer: optax.GradientTransformation,
    *,
    compute_dtype: Any = jnp.float32,
    n_micro: int = 1,
) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """The pure SFT step `(state, batch) -> (state, metrics)` (un-jitted; jit it, or use
    `learner.jit_train_step` for shardings and donation).

    One call is one optimizer step over `batch`, accumulating gradients over `n_micro`
    micro-batches (a `lax.scan`) against the denominator of the whole batch. A step whose loss
    or gradient is not finite leaves params and optimizer state unchanged and counts in
    `state.skipped`. Metrics: `loss`, `grad_norm`, `step_ok`, `sft/tokens` and the summed
    `sft_loss` metrics.
    """
    if n_micro < 1:
        raise ValueError(f"make_sft_step: n_micro must be >= 1, got {n_micro}")

    def loss_fn(params, micro_batch, denominator):
        return sft_loss(
            params, arch, micro_batch, compute_dtype=compute_dtype, loss_denominator=denominator
        )

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step(state: TrainState, batch: dict[str, jax.Array]):
        sft_batch = {k: batch[k] for k in SFT_KEYS}
        denominator = losses.loss_denominator(SFT_AGGREGATION, sft_batch["mask"])
        zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)

        def body(grads_acc, micro_batch):
            (loss, metrics), grads = grad_fn(state.params, micro_batch, denominator)
            grads_acc = jax.tree_util.tree_map(jnp.add, grads_acc, grads)
            return grads_acc, {"loss": loss, **metrics}

        grads, sums_M = jax.lax.scan(body, zeros, _split_micro(sft_batch, n_micro))
        metrics = {k: v.sum() for k, v in sums_M.items()}
        grad_norm = optax.global_norm(grads)
        ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
        updates, new_opt = optimizer.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, old)
        new_state = TrainState(
            step=state.step + ok.astype(jnp.int32),
            params=keep(new_params, state.params),
            opt_state=keep(new_opt, state.opt_state),
            skipped=state.skipped + (~ok).astype(jnp.int32),
        )
        metrics.update(grad_norm=grad_norm, step_ok=ok.astype(jnp.float32))
        metrics["sft/tokens"] = denominator
        return new_state, metrics

    return step
