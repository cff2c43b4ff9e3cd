"""`algorithm: rl_sft_parallel`: RL + SFT parallel averaging (the RL-during-pretraining paper,
Figure 8; ALGORITHMS.md):

    rlvr-train --config F algorithm=rl_sft_parallel     # data.sources and sft.sources

    θ̄ ← θ
    g_RL  ← ∇L_RL(θ̄; B_RL);   g_SFT ← ∇L_SFT(θ̄; B_SFT)
    (Δ_RL, s_RL)   ← OptUpdate(g_RL,  s_RL,  η_RL)      # independent optimizer moments
    (Δ_SFT, s_SFT) ← OptUpdate(g_SFT, s_SFT, η_SFT)
    θ ← θ̄ + ½(Δ_RL + Δ_SFT)

`make_parallel_step` is that update as one pure function: both gradients by
`update.accumulate_grads`, then `update.apply_update` with `update.pair_optimizer(rl, sft)`.
The source pairs each RL batch with one SFT batch per RL mini-batch; the update is
`rl.RLUpdate` with that step (`loss.advantage: gae` is not supported).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlvr_jax import losses, models
from rlvr_jax.config.algorithm_checks import micro_batches
from rlvr_jax.training import learner
from rlvr_jax.training.algorithms import rl as rl_algorithm
from rlvr_jax.training.algorithms import sft as sft_algorithm
from rlvr_jax.training.algorithms.common import Context
from rlvr_jax.training.batch import RLBatch, TokenBatch
from rlvr_jax.training.optimizer import make_optimizer
from rlvr_jax.training.rollouts import GeneratingSource
from rlvr_jax.training.sft import sft_objective
from rlvr_jax.training.sources import Batch
from rlvr_jax.training.update import (
    TrainState,
    accumulate_grads,
    apply_update,
    init_state,
    micro_count,
    pair_optimizer,
    summed,
)

SFT_SEED_OFFSET = 1
"""The SFT examples are drawn with seed `data.seed + 1`, so that when both halves use the same
sources they do not see the same prompts in lockstep."""


ParallelStep = Callable[[TrainState, RLBatch, TokenBatch], tuple[TrainState, dict[str, jax.Array]]]


def init_parallel_state(
    params: Any,
    rl_optimizer: optax.GradientTransformation,
    sft_optimizer: optax.GradientTransformation,
    *,
    mesh: Any = None,
) -> TrainState:
    """`update.init_state` with `pair_optimizer`'s state (`.rl`, `.sft`: each half's moments)."""
    return init_state(params, pair_optimizer(rl_optimizer, sft_optimizer), mesh=mesh)


def make_parallel_step(
    arch: models.ArchConfig,
    rl_optimizer: optax.GradientTransformation,
    sft_optimizer: optax.GradientTransformation,
    settings: losses.LossSettings,
    *,
    max_len: int,
    n_micro_rl: int | None = None,
    n_micro_sft: int | None = None,
    compute_dtype: Any = jnp.float32,
    temperature: float = 1.0,
    memory: learner.MemoryOptions = learner.NO_MEMORY_SAVING,
) -> ParallelStep:
    """The pure parallel-averaging step `(state, rl_batch, sft_batch) -> (state, metrics)`
    (un-jitted) over a state from `init_parallel_state`, each batch over its own micro-batch
    count. Each optimizer sees (and clips) only its own gradient; a non-finite loss or gradient
    skips the whole update. Metrics: the RL step's, the SFT step's under `sft/`, `step_ok`,
    `parallel/rl_update_norm`, `parallel/sft_update_norm`, `parallel/update_cosine`."""
    optimizer = pair_optimizer(rl_optimizer, sft_optimizer)
    rl_for = learner.rl_objective(
        arch,
        settings,
        max_len=max_len,
        compute_dtype=compute_dtype,
        temperature=temperature,
        memory=memory,
    )
    sft_for = sft_objective(arch, compute_dtype=compute_dtype)

    def step(state: TrainState, rl_batch: RLBatch, sft_batch: TokenBatch):
        n_rl, n_sft = micro_count(rl_batch, n_micro_rl), micro_count(sft_batch, n_micro_sft)
        rl_loss_fn, rl_metrics_fn = rl_for(rl_batch)
        g_rl, loss_rl, rl_aux_M = accumulate_grads(rl_loss_fn, state.params, rl_batch, n_rl)
        params = after(state.params, g_rl)
        g_sft, loss_sft, sft_M = accumulate_grads(sft_for(sft_batch), params, sft_batch, n_sft)
        finite = jnp.isfinite(loss_rl) & jnp.isfinite(loss_sft)
        new_state, ok = apply_update(state, (g_rl, g_sft), optimizer, finite=finite)
        metrics = rl_metrics_fn(rl_aux_M)
        metrics.update(loss=loss_rl, grad_norm=optax.global_norm(g_rl))
        for key, value in summed(sft_M).items():
            metrics[key if key.startswith("sft/") else f"sft/{key}"] = value
        metrics["sft/grad_norm"] = optax.global_norm(g_sft)
        metrics["sft/tokens"] = losses.loss_denominator("token-mean", sft_batch.mask_BxT)
        metrics["step_ok"] = ok.astype(jnp.float32)
        pair = new_state.opt_state
        metrics["parallel/rl_update_norm"] = pair.rl_update_norm
        metrics["parallel/sft_update_norm"] = pair.sft_update_norm
        metrics["parallel/update_cosine"] = pair.update_cosine
        return new_state, metrics

    return step


def after(x: Any, *deps: Any) -> Any:
    """`x` (a pytree), available only once every array of `deps` is computed: chains the two
    otherwise independent backward passes, so their collectives run in one order on every
    device (XLA:CPU's simulated devices rely on it) and their activations are never live at
    once."""
    x, _ = jax.lax.optimization_barrier((x, deps))
    return x


@flax.struct.dataclass
class ParallelBatch:
    """`rl_sft_parallel`'s batch: the RL batch and one SFT batch per RL mini-batch (stacked
    rows: mini-batch u trains with SFT rows [u·n, (u+1)·n))."""

    rl: RLBatch
    sft: TokenBatch


class PairingSource(GeneratingSource):
    """Each RL batch paired with the next `train.updates_per_batch` SFT batches."""

    def __init__(self, rl: Any, sft: sft_algorithm.SFTSource, *, updates_per_batch: int) -> None:
        self.rl, self.sft, self.updates = rl, sft, updates_per_batch
        self.rollouts, self.on_policy = rl.rollouts, rl.on_policy

    def next(self, policy_version: int) -> Batch | None:
        rl = self.rl.next(policy_version)
        if rl is None:
            return None
        sft = [self.sft.next(policy_version).arrays for _ in range(self.updates)]
        stacked = sft[0] if len(sft) == 1 else _concat_rows(sft)
        return dataclasses.replace(rl, arrays=ParallelBatch(rl=rl.arrays, sft=stacked))

    def state(self) -> dict:
        return {"rl": self.rl.state(), **self.sft.state()}

    def restore(self, state: dict) -> None:
        self.rl.restore(state["rl"])
        self.sft.restore(state)


def _concat_rows(batches: list[Any]) -> Any:
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *batches)


def source(ctx: Context, params: Any, version: int) -> PairingSource:
    rollouts = rl_algorithm.source(ctx, params, version)
    examples = sft_algorithm.sft_batches(ctx, seed=ctx.cfg.data.seed + SFT_SEED_OFFSET)
    return PairingSource(rollouts, examples, updates_per_batch=ctx.cfg.train.updates_per_batch)


class ParallelUpdate(rl_algorithm.RLUpdate):
    """`rl.RLUpdate` whose steps are parallel-averaging steps with their mini-batch's SFT rows."""

    def _make_step(
        self, ctx: Context, optimizer: Any, n_micro: int | None, options: dict[str, Any]
    ) -> tuple[Callable, Any]:
        cfg = ctx.cfg
        sft_opt = make_optimizer(cfg.train, learning_rate=cfg.sft.learning_rate)
        # the SFT rows stay one per row (`train.max_tokens_per_micro_batch` packs the RL half)
        n_micro_sft = micro_batches(cfg.sft.batch_size, cfg.train.micro_batch_size, "SFT batch")
        step = make_parallel_step(
            ctx.model.config,
            optimizer,
            sft_opt,
            ctx.settings,
            n_micro_rl=n_micro,
            n_micro_sft=n_micro_sft,
            **options,
        )
        return step, pair_optimizer(optimizer, sft_opt)

    def _parts(self, arrays: ParallelBatch) -> tuple[RLBatch, TokenBatch]:
        return arrays.rl, arrays.sft
