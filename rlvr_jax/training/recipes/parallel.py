"""RL + SFT parallel averaging (the RL-during-pretraining paper, Figure 8; ALGORITHMS.md):

    θ̄ ← θ
    g_RL  ← ∇L_RL(θ̄; B_RL);   g_SFT ← ∇L_SFT(θ̄; B_SFT)
    (Δ_RL, s_RL)   ← OptUpdate(g_RL,  s_RL,  η_RL)      # independent optimizer moments
    (Δ_SFT, s_SFT) ← OptUpdate(g_SFT, s_SFT, η_SFT)
    θ ← θ̄ + ½(Δ_RL + Δ_SFT)

`make_parallel_step` is that update as one pure function `(state, rl_batch, sft_batch) ->
(state, metrics)` over a `ParallelState` (params and both optimizer states). Both gradients
come from the steps the RL and SFT recipes train with (`learner.make_train_step` and
`sft.make_sft_step`: every loss variant, TIS, global loss denominators, micro-batching), built
around `gradient_probe()`: an optax transformation that leaves the parameters unchanged and
keeps the gradient it was given as its state. A step built with it therefore hands back
exactly the gradient it would have fed its optimizer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from rlvr_jax import losses, models
from rlvr_jax.training import learner
from rlvr_jax.training.sft import make_sft_step

Batch = dict[str, jax.Array]
ParallelStep = Callable[[Any, Batch, Batch], tuple[Any, dict[str, jax.Array]]]

NO_MEMORY_SAVING = learner.MemoryOptions()
"""The learner's default memory options (no remat, no chunking)."""


@flax.struct.dataclass
class ParallelState:
    """The learner state of parallel averaging."""

    step: jax.Array
    """Updates applied (= the policy version)."""
    params: Any
    """θ."""
    rl_opt_state: Any
    """s_RL: the RL optimizer's state (its own moments)."""
    sft_opt_state: Any
    """s_SFT: the SFT optimizer's state."""
    skipped: jax.Array
    """Updates skipped because a loss or a gradient was not finite."""


def init_parallel_state(
    params: Any,
    rl_optimizer: optax.GradientTransformation,
    sft_optimizer: optax.GradientTransformation,
    *,
    mesh: Any = None,
) -> ParallelState:
    """A fresh state; with a `mesh`, laid out as `learner.init_state` lays out its state (the
    moments follow the params' shardings, the scalars are replicated)."""
    rl = learner.init_state(params, rl_optimizer, mesh=mesh)
    sft = learner.init_state(rl.params, sft_optimizer, mesh=mesh)
    return ParallelState(
        step=rl.step,
        params=rl.params,
        rl_opt_state=rl.opt_state,
        sft_opt_state=sft.opt_state,
        skipped=rl.skipped,
    )


def gradient_probe() -> optax.GradientTransformation:
    """An optax transformation whose updates are zero and whose state is the last gradient."""

    def init(params: Any) -> Any:
        return jax.tree_util.tree_map(jnp.zeros_like, params)

    def update(grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del state, params
        return jax.tree_util.tree_map(jnp.zeros_like, grads), grads

    return optax.GradientTransformation(init, update)


def probe_gradients(
    step: Callable[[learner.TrainState, Batch], tuple[learner.TrainState, dict[str, jax.Array]]],
    params: Any,
    batch: Batch,
) -> tuple[Any, dict[str, jax.Array]]:
    """(gradient at `params`, metrics) of a train step built with `gradient_probe()`. The
    gradient is zero where the step found its loss or gradient not finite (`step_ok` = 0)."""
    probe = learner.TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=gradient_probe().init(params),
        skipped=jnp.zeros((), jnp.int32),
    )
    out, metrics = step(probe, batch)
    return out.opt_state, metrics


def make_parallel_step(
    arch: models.ArchConfig,
    rl_optimizer: optax.GradientTransformation,
    sft_optimizer: optax.GradientTransformation,
    settings: losses.LossSettings,
    *,
    max_len: int,
    n_micro_rl: int = 1,
    n_micro_sft: int = 1,
    compute_dtype: Any = jnp.float32,
    temperature: float = 1.0,
    old_from: learner.OldFrom = "self",
    memory: learner.MemoryOptions = NO_MEMORY_SAVING,
) -> ParallelStep:
    """The pure parallel-averaging step `(ParallelState, rl_batch, sft_batch) -> (state,
    metrics)` (un-jitted; jit it with the state donated).

    `rl_batch` is a learner mini-batch (`batch.collate` + advantages, as `learner.make_train_step`
    takes it, over `n_micro_rl` micro-batches); `sft_batch` an SFT batch (`collate_sft`, over
    `n_micro_sft`). Each optimizer sees only its own gradient and keeps its own state (with
    `train.max_grad_norm`, each clips its own gradient). When either loss or gradient is not
    finite the whole update is skipped (params and both states kept, `skipped` counts it).

    Metrics: the RL step's (`loss`, `grad_norm`, `clip_fraction`, ...), the SFT step's under
    `sft/` (`sft/loss`, `sft/grad_norm`, `sft/token_accuracy`, `sft/tokens`), `step_ok`, and
    `parallel/rl_update_norm`, `parallel/sft_update_norm`, `parallel/update_cosine` (cosine of
    Δ_RL and Δ_SFT: negative when the two objectives pull apart).
    """
    rl_grad_step = learner.make_train_step(
        arch,
        gradient_probe(),
        settings,
        max_len=max_len,
        n_micro=n_micro_rl,
        compute_dtype=compute_dtype,
        temperature=temperature,
        old_from=old_from,
        memory=memory,
    )
    sft_grad_step = make_sft_step(
        arch, gradient_probe(), compute_dtype=compute_dtype, n_micro=n_micro_sft
    )

    def step(state: ParallelState, rl_batch: Batch, sft_batch: Batch):
        g_rl, rl_metrics = probe_gradients(rl_grad_step, state.params, rl_batch)
        params, sft_batch = after((state.params, sft_batch), g_rl, rl_metrics)
        g_sft, sft_metrics = probe_gradients(sft_grad_step, params, sft_batch)
        g_rl = after(g_rl, g_sft, sft_metrics)
        d_rl, rl_opt_state = rl_optimizer.update(g_rl, state.rl_opt_state, state.params)
        g_sft = after(g_sft, d_rl, rl_opt_state)
        d_sft, sft_opt_state = sft_optimizer.update(g_sft, state.sft_opt_state, state.params)
        d_avg = jax.tree_util.tree_map(lambda a, b: 0.5 * (a + b), d_rl, d_sft)
        ok = (rl_metrics["step_ok"] > 0) & (sft_metrics["step_ok"] > 0)

        def keep(new: Any, old: Any) -> Any:
            return jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, old)

        new_state = ParallelState(
            step=state.step + ok.astype(jnp.int32),
            params=keep(optax.apply_updates(state.params, d_avg), state.params),
            rl_opt_state=keep(rl_opt_state, state.rl_opt_state),
            sft_opt_state=keep(sft_opt_state, state.sft_opt_state),
            skipped=state.skipped + (~ok).astype(jnp.int32),
        )
        metrics = dict(rl_metrics)
        for key, value in sft_metrics.items():
            if key != "step_ok":
                metrics[key if key.startswith("sft/") else f"sft/{key}"] = value
        metrics["step_ok"] = ok.astype(jnp.float32)
        metrics.update(update_geometry(d_rl, d_sft))
        return new_state, metrics

    return step


def after(x: Any, *deps: Any) -> Any:
    """`x` (a pytree), available only once every array of `deps` is computed.

    The step chains its stages this way (RL gradient → SFT gradient → RL update → SFT update):
    the two halves are otherwise independent, and the compiler may run them concurrently and
    in any order. Chained, their collectives run in one order on every device (XLA:CPU's
    in-process collectives over simulated devices rely on that) and the two backward passes'
    activations are never live at the same time."""
    x, _ = jax.lax.optimization_barrier((x, deps))
    return x


def update_geometry(d_rl: Any, d_sft: Any) -> dict[str, jax.Array]:
    """‖Δ_RL‖, ‖Δ_SFT‖ and cos(Δ_RL, Δ_SFT) over all parameters (cosine 0 when one is zero)."""
    dot = sum(
        jnp.vdot(a.astype(jnp.float32), b.astype(jnp.float32))
        for a, b in zip(jax.tree_util.tree_leaves(d_rl), jax.tree_util.tree_leaves(d_sft))
    )
    n_rl, n_sft = optax.global_norm(d_rl), optax.global_norm(d_sft)
    denom = n_rl * n_sft
    cosine = jnp.where(denom > 0, dot / jnp.where(denom > 0, denom, 1.0), 0.0)
    return {
        "parallel/rl_update_norm": n_rl,
        "parallel/sft_update_norm": n_sft,
        "parallel/update_cosine": cosine,
    }
