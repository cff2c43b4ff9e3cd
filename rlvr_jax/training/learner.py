"""The learner: a pure jitted train step (nanodo style) with global-batch loss normalisation.

`make_train_step(...)` returns `step(state, batch) -> (state, metrics)`, jitted once with
explicit shardings and the state donated. One call is one optimizer step over a mini-batch,
accumulating gradients over `n_micro` micro-batches with a `lax.scan`; the loss denominator
(token count, row count or rows × max_len, by aggregation mode) is computed once over the whole
mini-batch — and, because the arrays are globally sharded, over every data-parallel shard — so
the accumulated gradient equals the full-batch gradient (ALGORITHMS.md, Aggregation).

Old log-probs (the ratio's denominator): with one optimizer step per rollout batch, θ_old is
the current θ, so `old_logp = stop_gradient(logp)` (exact, no extra forward); with several, the
caller computes them once with `make_logprob_fn` before the first mini-batch; with
`ratio_denominator: sampler` the engine's log-probs are used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import flax.struct
import jax
import jax.numpy as jnp
import optax

from rlvr_jax import losses, models

OldFrom = Literal["self", "batch", "sampler"]


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    """Optimizer steps completed (= the policy version)."""
    params: Any
    opt_state: Any
    skipped: jax.Array
    """Steps skipped because the loss or the gradient was not finite."""


def init_state(params: Any, optimizer: optax.GradientTransformation, mesh=None) -> TrainState:
    """A fresh state. With a `mesh`, the optimizer moments follow the params' shardings and
    the scalars are replicated over the mesh, so that the whole state lives on it."""
    if mesh is None:
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=optimizer.init(params),
            skipped=jnp.zeros((), jnp.int32),
        )
    state = jax.jit(lambda p: init_state(p, optimizer))(params)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.tree_util.tree_map(
        lambda x: (
            x
            if set(x.sharding.device_set) == set(mesh.devices.flat)
            else jax.device_put(x, replicated)
        ),
        state,
    )


@dataclasses.dataclass(frozen=True)
class MemoryOptions:
    """How the learner trades compute for memory (`train.remat/attn_chunk/logits_chunk`,
    `model.attention_impl`)."""

    remat: bool = False
    attn_chunk: int = 0
    logits_chunk: int = 0
    attention_impl: str = "auto"


def token_logprobs(
    params: Any,
    arch: models.ArchConfig,
    batch: dict[str, jax.Array],
    *,
    compute_dtype: Any,
    temperature: float,
    return_logits: bool = False,
    memory: MemoryOptions = MemoryOptions(),
):
    """log π(target_t | inputs_≤t) in fp32, as log-softmax(logits / τ) over the full vocabulary.

    With `memory.logits_chunk` (and no logits asked for) the LM head and log-softmax run a
    chunk of positions at a time, each chunk rematerialised in the backward pass."""
    common = dict(
        compute_dtype=compute_dtype,
        remat=memory.remat,
        attn_chunk=memory.attn_chunk,
        attention_impl=memory.attention_impl,
    )
    inputs = (batch["input_ids"], batch["positions"], batch["segment_ids"])
    targets_BxT = batch["target_ids"]
    T = targets_BxT.shape[1]
    chunk = memory.logits_chunk
    if chunk and not return_logits and chunk < T and T % chunk == 0:
        hidden_BxTxD = models.apply(params, arch, *inputs, return_hidden=True, **common)
        B, _, D = hidden_BxTxD.shape
        h_CxBxcxD = hidden_BxTxD.reshape(B, T // chunk, chunk, D).swapaxes(0, 1)
        t_CxBxc = targets_BxT.reshape(B, T // chunk, chunk).swapaxes(0, 1)

        @jax.checkpoint
        def one(args):
            h_BxcxD, t_Bxc = args
            return _pick_logp(models.lm_head(params, arch, h_BxcxD), t_Bxc, temperature)

        logp_CxBxc = jax.lax.map(one, (h_CxBxcxD, t_CxBxc))
        return logp_CxBxc.swapaxes(0, 1).reshape(B, T)
    logits_BxTxV = models.apply(params, arch, *inputs, **common).astype(jnp.float32)
    logp_BxT = _pick_logp(logits_BxTxV, targets_BxT, temperature)
    if return_logits:
        return logp_BxT, logits_BxTxV / temperature if temperature != 1.0 else logits_BxTxV
    return logp_BxT


def _pick_logp(logits_BxTxV: jax.Array, targets_BxT: jax.Array, temperature: float) -> jax.Array:
    logits_BxTxV = logits_BxTxV.astype(jnp.float32)
    if temperature != 1.0:
        logits_BxTxV = logits_BxTxV / temperature
    logz_BxT = jax.nn.logsumexp(logits_BxTxV, axis=-1)
    picked_BxT = jnp.take_along_axis(logits_BxTxV, targets_BxT[..., None], axis=-1)[..., 0]
    return picked_BxT - logz_BxT


def make_logprob_fn(
    arch, *, compute_dtype, temperature: float, memory: MemoryOptions = MemoryOptions()
) -> Callable:
    """`fn(params, batch) -> logp_BxT` (jitted): old or reference log-probs for a whole batch."""

    def fn(params, batch):
        return token_logprobs(
            params, arch, batch, compute_dtype=compute_dtype, temperature=temperature, memory=memory
        )

    return jax.jit(fn)


def _split_micro(batch: dict[str, jax.Array], n_micro: int) -> dict[str, jax.Array]:
    def split(x):
        if x.shape[0] % n_micro:
            raise ValueError(
                f"batch of {x.shape[0]} rows does not split into {n_micro} micro-batches"
            )
        return x.reshape(n_micro, x.shape[0] // n_micro, *x.shape[1:])

    return {k: split(v) for k, v in batch.items()}


def make_train_step(
    arch: models.ArchConfig,
    optimizer: optax.GradientTransformation,
    settings: losses.LossSettings,
    *,
    max_len: int,
    n_micro: int = 1,
    compute_dtype: Any = jnp.float32,
    temperature: float = 1.0,
    old_from: OldFrom = "self",
    with_entropy: bool = False,
    memory: MemoryOptions = MemoryOptions(),
) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """Builds the (un-jitted) pure step; `jit_train_step` adds shardings and donation."""
    if settings.tis_mode == "mask" and old_from == "self":
        raise ValueError(
            "TIS mask mode counts kept tokens over the whole batch: pass precomputed old "
            "log-probs (old_from='batch')"
        )
    loss_kwargs = settings.policy_loss_kwargs()

    def loss_fn(params, mb, denominator):
        out = token_logprobs(
            params,
            arch,
            mb,
            compute_dtype=compute_dtype,
            temperature=temperature,
            return_logits=with_entropy,
            memory=memory,
        )
        logp, logits = out if with_entropy else (out, None)
        if old_from == "self":
            old_logp = jax.lax.stop_gradient(logp)
        elif old_from == "batch":
            old_logp = mb["old_logp"]
        else:
            old_logp = mb["sampler_logp"]
        return losses.policy_loss(
            logp=logp,
            old_logp=old_logp,
            advantages=mb["advantages"],
            mask=mb["mask"],
            sampler_logp=mb["sampler_logp"],
            ref_logp=mb.get("ref_logp"),
            loss_denominator=denominator,
            max_len=max_len,
            logits=logits,
            **loss_kwargs,
        )

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step(state: TrainState, batch: dict[str, jax.Array]):
        denominator = settings.loss_denominator(
            batch["mask"],
            max_len=max_len,
            old_logp=batch.get("old_logp"),
            sampler_logp=batch["sampler_logp"],
        )
        micro = _split_micro(batch, n_micro)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)

        def body(acc, mb):
            grads_acc, loss_acc = acc
            (loss, metrics), grads = grad_fn(state.params, mb, denominator)
            grads_acc = jax.tree_util.tree_map(jnp.add, grads_acc, grads)
            return (grads_acc, loss_acc + loss), metrics

        (grads, loss), metrics_M = jax.lax.scan(body, (zeros, jnp.zeros((), jnp.float32)), micro)
        grad_norm = optax.global_norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, new_opt = optimizer.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, old)
        new_state = TrainState(
            step=state.step + ok.astype(jnp.int32),
            params=keep(new_params, state.params),
            opt_state=keep(new_opt, state.opt_state),
            skipped=state.skipped + (~ok).astype(jnp.int32),
        )
        metrics = {k: _combine(k, v) for k, v in metrics_M.items()}
        metrics.update(loss=loss, grad_norm=grad_norm, step_ok=ok.astype(jnp.float32))
        return new_state, metrics

    return step


def _combine(name: str, values_M: jax.Array) -> jax.Array:
    """Micro-batch metrics → one value (min/max stay extremes; others are averaged)."""
    if name.endswith("min"):
        return values_M.min()
    if name.endswith("max"):
        return values_M.max()
    return values_M.mean()


def jit_train_step(step: Callable, state_shardings: Any, batch_shardings: Any) -> Callable:
    """The step jitted with explicit shardings; the old state is donated."""
    return jax.jit(
        step,
        in_shardings=(state_shardings, batch_shardings),
        out_shardings=(state_shardings, None),
        donate_argnums=(0,),
    )
