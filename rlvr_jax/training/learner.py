"""The RL learner: per-token log-probs of a batch under the policy, and the pure RL train step.

`make_train_step` is one optimizer step over an `RLBatch`: `update.accumulate_grads` over
micro-batches, each divided by the whole batch's denominator (so the accumulated gradient is
the full-batch one: ALGORITHMS.md, Aggregation), then `update.apply_update`.

θ_old's log-probs are the batch's `old_logp_BxT` when computed before the first update
(`make_logprob_fn`), else stop_gradient(logp): exact with one update per batch, no extra
forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlvr_jax import losses, models
from rlvr_jax.models.layers import target_logprobs
from rlvr_jax.training.batch import RLBatch, TokenBatch, sequence_view
from rlvr_jax.training.update import (
    TrainState,
    gradient_step,
    init_state,
    jit_train_step,
    per_micro_batch,
)

__all__ = [
    "MemoryOptions",
    "TrainState",
    "batch_objective",
    "hidden_states",
    "init_state",
    "jit_train_step",
    "logprobs_of_hidden",
    "make_logprob_fn",
    "make_train_step",
    "slot_logprobs_of_hidden",
    "token_logprobs",
]


@dataclasses.dataclass(frozen=True)
class MemoryOptions:
    """How the learner trades compute for memory (`train.remat/attn_chunk/logits_chunk`,
    `model.attention_impl`), and the row layout the attention kernel may rely on."""

    remat: bool = False
    attn_chunk: int = 0
    logits_chunk: int = 0
    attention_impl: str = "auto"
    max_segments: int = 0
    """Sequences per row at most: 1 for one-per-row batches, `packing.MAX_SEQS_PER_ROW` for
    packed ones, 0 = unknown (`auto` then never picks cuDNN, whose packed layout needs it)."""


NO_MEMORY_SAVING = MemoryOptions()
"""The default memory options (no remat, no chunking)."""


def token_logprobs(
    params: Any,
    arch: models.ArchConfig,
    batch: TokenBatch,
    *,
    compute_dtype: Any,
    temperature: float,
    return_logits: bool = False,
    memory: MemoryOptions = NO_MEMORY_SAVING,
):
    """log π(target_t | inputs_≤t) [B, T] in fp32, log-softmax(logits / τ) over the full
    vocabulary (with `return_logits`, also the logits / τ [B, T, V]); `memory.logits_chunk`
    positions at a time when set and no logits are asked for."""
    if not return_logits and _chunked(memory.logits_chunk, batch.target_ids_BxT.shape[1]):
        h_BxTxD = hidden_states(params, arch, batch, compute_dtype=compute_dtype, memory=memory)
        return logprobs_of_hidden(
            params, arch, h_BxTxD, batch.target_ids_BxT, temperature=temperature, memory=memory
        )
    inputs = (batch.input_ids_BxT, batch.positions_BxT, batch.segment_ids_BxT)
    logits_BxTxV = models.apply(
        params, arch, *inputs, compute_dtype=compute_dtype, **_apply_options(memory, batch)
    ).astype(jnp.float32)
    logp_BxT = _pick_logp(logits_BxTxV, batch.target_ids_BxT, temperature)
    if return_logits:
        return logp_BxT, logits_BxTxV / temperature if temperature != 1.0 else logits_BxTxV
    return logp_BxT


def _apply_options(memory: MemoryOptions, batch: TokenBatch) -> dict[str, Any]:
    return dict(
        remat=memory.remat,
        attn_chunk=memory.attn_chunk,
        attention_impl=memory.attention_impl,
        max_segments=memory.max_segments,
        segment_branches=batch.branches,
    )


def _chunked(chunk: int, length: int) -> bool:
    return bool(chunk) and chunk < length and length % chunk == 0


def hidden_states(
    params: Any,
    arch: models.ArchConfig,
    batch: TokenBatch,
    *,
    compute_dtype: Any,
    memory: MemoryOptions = NO_MEMORY_SAVING,
) -> jax.Array:
    """The trunk's final-norm hidden states [B, T, D] of a token batch (no LM head)."""
    return models.apply(
        params,
        arch,
        batch.input_ids_BxT,
        batch.positions_BxT,
        batch.segment_ids_BxT,
        compute_dtype=compute_dtype,
        return_hidden=True,
        **_apply_options(memory, batch),
    )


def logprobs_of_hidden(
    params: Any,
    arch: models.ArchConfig,
    hidden_BxTxD: jax.Array,
    targets_BxT: jax.Array,
    *,
    temperature: float,
    memory: MemoryOptions = NO_MEMORY_SAVING,
) -> jax.Array:
    """log π(target_t) [B, T] of hidden states, `memory.logits_chunk` positions at a time."""
    B, T, D = hidden_BxTxD.shape
    chunk = memory.logits_chunk
    if not _chunked(chunk, T):
        return _pick_logp(models.lm_head(params, arch, hidden_BxTxD), targets_BxT, temperature)
    h_CxBxcxD = hidden_BxTxD.reshape(B, T // chunk, chunk, D).swapaxes(0, 1)
    t_CxBxc = targets_BxT.reshape(B, T // chunk, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one(args):
        h_BxcxD, t_Bxc = args
        return _pick_logp(models.lm_head(params, arch, h_BxcxD), t_Bxc, temperature)

    logp_CxBxc = jax.lax.map(one, (h_CxBxcxD, t_CxBxc))
    return logp_CxBxc.swapaxes(0, 1).reshape(B, T)


def _pick_logp(logits_BxTxV: jax.Array, targets_BxT: jax.Array, temperature: float) -> jax.Array:
    """The sampler's log-softmax (`models.layers.target_logprobs`), logits scaled as it does:
    times 1/τ rounded to fp32."""
    logits_BxTxV = logits_BxTxV.astype(jnp.float32)
    if temperature != 1.0:
        logits_BxTxV = logits_BxTxV * (np.float32(1.0) / np.float32(temperature))
    return target_logprobs(logits_BxTxV, targets_BxT)


def sequence_logprobs(
    params: Any,
    arch: models.ArchConfig,
    batch: RLBatch,
    *,
    compute_dtype: Any,
    temperature: float,
    with_entropy: bool = False,
    memory: MemoryOptions = NO_MEMORY_SAVING,
):
    """`token_logprobs` of an RL batch per completion slot [B, T] (and the entropies)."""
    if batch.targets_BxT is not None:
        hidden_RxTxD = hidden_states(
            params, arch, batch.tokens, compute_dtype=compute_dtype, memory=memory
        )
        return slot_logprobs_of_hidden(
            params, arch, hidden_RxTxD, batch, temperature=temperature,
            with_entropy=with_entropy, memory=memory,
        )  # fmt: skip
    out = token_logprobs(
        params, arch, batch.tokens, compute_dtype=compute_dtype, temperature=temperature,
        return_logits=with_entropy, memory=memory,
    )  # fmt: skip
    if with_entropy:
        logp_RxT, logits_RxTxV = out
        out = (logp_RxT, jax.lax.stop_gradient(losses.token_entropy(logits_RxTxV)))
    return jax.tree.map(lambda x_RxT: sequence_view(x_RxT, batch.gather_BxT), out)


def slot_logprobs_of_hidden(
    params: Any,
    arch: models.ArchConfig,
    hidden_RxTxD: jax.Array,
    batch: RLBatch,
    *,
    temperature: float,
    with_entropy: bool = False,
    memory: MemoryOptions = NO_MEMORY_SAVING,
):
    """log π of each completion slot's tokens [B, T] from the rows' hidden states (and,
    `with_entropy`, the entropy per token). Shared-prompt rows, where a prompt's last position
    precedes G different tokens, take each slot's view of the hidden states first and its own
    targets (`targets_BxT`)."""
    if batch.targets_BxT is None:
        if with_entropy:
            raise ValueError("entropies of rows need the logits: use sequence_logprobs")
        logp_RxT = logprobs_of_hidden(
            params, arch, hidden_RxTxD, batch.tokens.target_ids_BxT,
            temperature=temperature, memory=memory,
        )  # fmt: skip
        return sequence_view(logp_RxT, batch.gather_BxT)
    hidden_BxTxD = sequence_view(hidden_RxTxD, batch.gather_BxT)
    if not with_entropy:
        return logprobs_of_hidden(
            params, arch, hidden_BxTxD, batch.targets_BxT, temperature=temperature, memory=memory
        )
    logits_BxTxV = models.lm_head(params, arch, hidden_BxTxD).astype(jnp.float32)
    if temperature != 1.0:
        logits_BxTxV = logits_BxTxV / temperature
    logp_BxT = _pick_logp(logits_BxTxV, batch.targets_BxT, 1.0)
    return logp_BxT, jax.lax.stop_gradient(losses.token_entropy(logits_BxTxV))


def make_logprob_fn(
    arch, *, compute_dtype, temperature: float, memory: MemoryOptions = NO_MEMORY_SAVING
) -> Callable:
    """`fn(params, batch) -> logp_BxT` (jitted): old or reference log-probs of a whole batch,
    per micro-batch when packed for several; per completion slot for an `RLBatch`, per row for
    any other `TokenBatch`."""

    def one(params, mb):
        kwargs = dict(compute_dtype=compute_dtype, temperature=temperature, memory=memory)
        if isinstance(mb, RLBatch):
            return sequence_logprobs(params, arch, mb, **kwargs)
        return token_logprobs(params, arch, mb, **kwargs)

    def fn(params, batch):
        return per_micro_batch(lambda mb: one(params, mb), batch)

    return jax.jit(fn)


def rl_objective(
    arch: models.ArchConfig,
    settings: losses.LossSettings,
    *,
    max_len: int,
    compute_dtype: Any = jnp.float32,
    temperature: float = 1.0,
    with_entropy: bool = False,
    memory: MemoryOptions = NO_MEMORY_SAVING,
) -> Callable[[RLBatch], tuple[Callable, Callable]]:
    """`for_batch(batch) -> (loss_fn, metrics_fn)`: `loss_fn(params, micro_batch)` is the
    policy loss of a micro-batch over the whole `batch`'s denominator, its aux the log-probs
    (and entropies); `metrics_fn(aux_M)` the loss's metrics over the whole batch from those."""

    def for_batch(batch: RLBatch):
        objective = batch_objective(settings, batch, max_len=max_len)

        def loss_fn(params, mb: RLBatch):
            out = sequence_logprobs(
                params,
                arch,
                mb,
                compute_dtype=compute_dtype,
                temperature=temperature,
                with_entropy=with_entropy,
                memory=memory,
            )
            logp, entropy = out if with_entropy else (out, None)
            loss, _ = objective(logp, mb)
            aux = {"logp": jax.lax.stop_gradient(logp)}
            if entropy is not None:
                aux["entropy"] = entropy
            return loss, aux

        def metrics_fn(aux_M: dict[str, jax.Array]) -> dict[str, jax.Array]:
            shape = batch.mask_BxT.shape
            _, metrics = objective(aux_M["logp"].reshape(shape), batch)
            if "entropy" in aux_M:
                entropy_BxT = aux_M["entropy"].reshape(shape)
                metrics["entropy"] = losses.masked_mean(entropy_BxT, batch.mask_BxT)
            return metrics

        return loss_fn, metrics_fn

    return for_batch


def batch_objective(settings: losses.LossSettings, batch: RLBatch, *, max_len: int) -> Callable:
    """`objective(logp_BxT, b) -> (loss, metrics)`: the policy loss of `b` (`batch` or a
    micro-batch of it) over `batch`'s denominator; per-token advantages when given (PPO).
    With `lag_BxT`, also `losses.mismatch_metrics`."""
    if settings.tis_mode == "mask" and batch.old_logp_BxT is None:
        raise ValueError(
            "TIS mask mode counts kept tokens over the whole batch: the batch needs "
            "precomputed old log-probs (old_logp_BxT, from make_logprob_fn)"
        )
    loss_kwargs = settings.policy_loss_kwargs()
    denominator = settings.loss_denominator(
        batch.mask_BxT,
        max_len=max_len,
        old_logp=batch.old_logp_BxT,
        sampler_logp=batch.sampler_logp_BxT,
    )

    def objective(logp: jax.Array, b: RLBatch) -> tuple[jax.Array, dict]:
        old = jax.lax.stop_gradient(logp) if b.old_logp_BxT is None else b.old_logp_BxT
        loss, metrics = losses.policy_loss(
            logp=logp,
            old_logp=old,
            advantages=b.advantages_B if b.advantages_BxT is None else b.advantages_BxT,
            mask=b.mask_BxT,
            sampler_logp=b.sampler_logp_BxT,
            ref_logp=b.ref_logp_BxT,
            loss_denominator=denominator,
            max_len=max_len,
            **loss_kwargs,
        )
        if b.lag_BxT is not None and b.sampler_logp_BxT is not None:
            metrics |= losses.mismatch_metrics(old, b.sampler_logp_BxT, b.mask_BxT, b.lag_BxT)
        return loss, metrics

    return objective


def make_train_step(
    arch: models.ArchConfig,
    optimizer: optax.GradientTransformation,
    settings: losses.LossSettings,
    *,
    max_len: int,
    n_micro: int | None = None,
    compute_dtype: Any = jnp.float32,
    temperature: float = 1.0,
    with_entropy: bool = False,
    memory: MemoryOptions = NO_MEMORY_SAVING,
) -> Callable[[TrainState, RLBatch], tuple[TrainState, dict[str, jax.Array]]]:
    """The pure RL step (un-jitted) over `n_micro` micro-batches (a packed batch's own count);
    metrics: the policy loss's, `loss`, `grad_norm`, `step_ok`."""
    objective = rl_objective(
        arch,
        settings,
        max_len=max_len,
        compute_dtype=compute_dtype,
        temperature=temperature,
        with_entropy=with_entropy,
        memory=memory,
    )

    def step(state: TrainState, batch: RLBatch):
        loss_fn, metrics_fn = objective(batch)
        new_state, metrics, aux_M = gradient_step(state, loss_fn, batch, optimizer, n_micro)
        return new_state, {**metrics_fn(aux_M), **metrics}

    return step
