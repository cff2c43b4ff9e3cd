"""The parts every train step is made of: a train state, gradient accumulation over
micro-batches against the whole batch's loss denominator, and an optimizer update that skips
non-finite steps. With LoRA only the adapters (`lora.split(params)[0]`) get gradients and
optimizer state; the frozen base is a constant of the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax

from rlvr_jax.models import lora

LossFn = Callable[[Any, Any], tuple[jax.Array, dict[str, jax.Array]]]
"""`loss_fn(params, micro_batch) -> (loss, metrics)`; the loss already divided by the whole
optimizer batch's denominator, so micro-batch losses (and gradients) sum to the full batch's."""


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    """Optimizer steps applied (skipped non-finite steps not counted)."""
    params: Any
    opt_state: Any
    skipped: jax.Array
    """Steps skipped because the loss or the gradient was not finite."""
    critic: Any = None
    """PPO's `training.critic.CriticState`; None without a critic."""


def init_state(params: Any, optimizer: optax.GradientTransformation, mesh=None) -> TrainState:
    """A fresh state, wholly on `mesh` when given; a frozen LoRA base is not copied."""
    trainable, frozen = lora.split(params)
    if mesh is None:
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=optimizer.init(trainable),
            skipped=jnp.zeros((), jnp.int32),
        )
    state = jax.jit(lambda p: init_state(p, optimizer))(trainable)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = jax.tree_util.tree_map(
        lambda x: (
            x
            if set(x.sharding.device_set) == set(mesh.devices.flat)
            else jax.device_put(x, replicated)
        ),
        state,
    )
    return state.replace(params=lora.combine(state.params, frozen))


def split_micro(batch: Any, n_micro: int) -> Any:
    """Every array of a batch pytree as [n_micro, rows / n_micro, ...]."""

    def split(x):
        if x.shape[0] % n_micro:
            raise ValueError(
                f"batch of {x.shape[0]} rows does not split into {n_micro} micro-batches"
            )
        return x.reshape(n_micro, x.shape[0] // n_micro, *x.shape[1:])

    return jax.tree.map(split, batch)


def micro_count(batch: Any, n_micro: int | None) -> int:
    """Micro-batches of `batch`: its packed count, else `n_micro` (1); a conflict is an error."""
    packed = getattr(batch, "n_micro", 0)
    if packed and n_micro is not None and n_micro != packed:
        raise ValueError(f"the batch is packed for {packed} micro-batches, not {n_micro}")
    return packed or n_micro or 1


def per_micro_batch(fn: Callable[[Any], jax.Array], batch: Any) -> jax.Array:
    """`fn(batch)` [B, ...], one micro-batch at a time when the rows are packed for several."""
    n = micro_count(batch, None)
    if n == 1:
        return fn(batch)
    out_MxbxT = jax.lax.map(fn, split_micro(batch, n))
    return out_MxbxT.reshape(-1, *out_MxbxT.shape[2:])


def accumulate_grads(
    loss_fn: LossFn, params: Any, batch: Any, n_micro: int, rng: jax.Array | None = None
) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    """(Σ gradients of the trainable params, Σ losses, per-micro-batch metrics [n_micro]) of
    `loss_fn` over `n_micro` micro-batches (a `lax.scan`: one micro-batch's activations live
    at a time). `rng` (a raw [2] key) seeds LoRA dropout per micro-batch; None: no dropout."""
    if n_micro < 1:
        raise ValueError(f"n_micro must be >= 1, got {n_micro}")
    trainable, frozen = lora.split(params)

    def loss_of(t, micro_batch, key):
        if key is not None:
            t = lora.with_dropout(t, key)
        return loss_fn(lora.combine(t, frozen), micro_batch)

    grad_fn = jax.value_and_grad(loss_of, has_aux=True)
    zeros = jax.tree.map(jnp.zeros_like, trainable)

    def body(acc, xs):
        (grads_acc, loss_acc), (i, micro_batch) = acc, xs
        key = None if rng is None else jax.random.fold_in(rng, i)
        (loss, metrics), grads = grad_fn(trainable, micro_batch, key)
        return (jax.tree.map(jnp.add, grads_acc, grads), loss_acc + loss), metrics

    init = (zeros, jnp.zeros((), jnp.float32))
    xs = (jnp.arange(n_micro), split_micro(batch, n_micro))
    (grads, loss), metrics_M = jax.lax.scan(body, init, xs)
    return grads, loss, metrics_M


def apply_update(
    state: TrainState, grads: Any, optimizer: optax.GradientTransformation, *, finite: Any = True
) -> tuple[TrainState, jax.Array]:
    """(state after one update by the trainable params' `grads`, ok); when the gradient or
    `finite` is not finite, params and optimizer state are kept and `skipped` counts it."""
    ok = jnp.isfinite(optax.global_norm(grads)) & finite
    trainable, frozen = lora.split(state.params)
    trainable, opt_state = optimizer_step(trainable, state.opt_state, grads, optimizer, ok)
    return (
        state.replace(
            step=state.step + ok.astype(jnp.int32),
            params=lora.combine(trainable, frozen),
            opt_state=opt_state,
            skipped=state.skipped + (~ok).astype(jnp.int32),
        ),
        ok,
    )


def gradient_step(
    state: TrainState, loss_fn: LossFn, batch: Any, optimizer: Any, n_micro: int | None
) -> tuple[TrainState, dict[str, jax.Array], Any]:
    """One optimizer step of `loss_fn` over `batch` (`accumulate_grads`, `apply_update`):
    (new state, {`loss`, `grad_norm`, `step_ok`}, the per-micro-batch aux). LoRA dropout is
    keyed by the step."""
    n = micro_count(batch, n_micro)
    rng = None
    if lora.dropout_rate(state.params) > 0:
        rng = jax.random.fold_in(jax.random.PRNGKey(0), state.step)
    grads, loss, aux_M = accumulate_grads(loss_fn, state.params, batch, n, rng)
    new_state, ok = apply_update(state, grads, optimizer, finite=jnp.isfinite(loss))
    norm, step_ok = optax.global_norm(grads), ok.astype(jnp.float32)
    return new_state, {"loss": loss, "grad_norm": norm, "step_ok": step_ok}, aux_M


def optimizer_step(
    params: Any, opt_state: Any, grads: Any, optimizer: optax.GradientTransformation, ok: Any
) -> tuple[Any, Any]:
    """(params, optimizer state) after one update by `grads` where `ok`, else unchanged."""
    updates, new_opt = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)

    def keep(new: Any, old: Any) -> Any:
        return jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)

    return keep(new_params, params), keep(new_opt, opt_state)


def summed(metrics_M: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Per-micro-batch values already divided by the whole batch's denominator, summed."""
    return {k: v.sum() for k, v in metrics_M.items()}


class PairState(NamedTuple):
    """`pair_optimizer`'s state: each half's own state and the last update's geometry."""

    rl: Any
    sft: Any
    rl_update_norm: jax.Array
    sft_update_norm: jax.Array
    update_cosine: jax.Array


def pair_optimizer(
    rl: optax.GradientTransformation, sft: optax.GradientTransformation
) -> optax.GradientTransformation:
    """RL + SFT parallel averaging as one optax transformation over gradient pairs
    (the RL-during-pretraining paper, Figure 8; ALGORITHMS.md):

        (Δ_RL, s_RL)   ← OptUpdate(g_RL,  s_RL)      # independent moments
        (Δ_SFT, s_SFT) ← OptUpdate(g_SFT, s_SFT)
        update = ½(Δ_RL + Δ_SFT)

    `update((g_RL, g_SFT), state, params)`; the state keeps ‖Δ_RL‖, ‖Δ_SFT‖ and their cosine
    (negative when the two objectives pull apart) for the step's metrics."""

    def init(params: Any) -> PairState:
        zero = jnp.zeros((), jnp.float32)
        return PairState(rl.init(params), sft.init(params), zero, zero, zero)

    def update(grads: tuple[Any, Any], state: PairState, params: Any = None):
        g_rl, g_sft = grads
        d_rl, s_rl = rl.update(g_rl, state.rl, params)
        d_sft, s_sft = sft.update(g_sft, state.sft, params)
        avg = jax.tree.map(lambda a, b: 0.5 * (a + b), d_rl, d_sft)
        return avg, PairState(s_rl, s_sft, *update_geometry(d_rl, d_sft))

    return optax.GradientTransformation(init, update)


def update_geometry(d_a: Any, d_b: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(‖a‖, ‖b‖, cos(a, b)) over all leaves (cosine 0 when either is zero)."""
    dot = sum(
        jnp.vdot(a.astype(jnp.float32), b.astype(jnp.float32))
        for a, b in zip(jax.tree.leaves(d_a), jax.tree.leaves(d_b))
    )
    n_a, n_b = optax.global_norm(d_a), optax.global_norm(d_b)
    denom = n_a * n_b
    return n_a, n_b, jnp.where(denom > 0, dot / jnp.where(denom > 0, denom, 1.0), 0.0)


def jit_train_step(step: Callable, state_shardings: Any, *shardings: Any) -> Callable:
    """The step jitted with the state's shardings in and out (donated), and its other
    arguments' when given (None: as laid out; none given: all inferred)."""
    kwargs = {"in_shardings": (state_shardings, *shardings)} if shardings else {}
    return jax.jit(step, out_shardings=(state_shardings, None), donate_argnums=(0,), **kwargs)
