"""`algorithm: rl`: GRPO-family RL on the actors' rollouts (PPO with a critic is `ppo.py`).

Source, `RolloutSource`: batches of `train.prompts_per_batch` kept groups from `Rollouts` —
zero-variance filtering, active sampling, the staleness bound (async), advantages → `RLBatch`.
Async mode keeps `rollout.queue_size` batches of requests in flight, topped up before returning
each batch so the actors generate the next one while the learner trains on this one; groups
that complete once the batch is full wait for the next one (none is dropped unsettled). Each
batch lists what became of every group it settled (`Batch.settled`, the prompt ledger).

Update, `RLUpdate`: the log-probs the loss needs from the learner first — θ_old's (several
updates per batch, TIS mask mode, reward-KL), the reference policy's (KL on) — then
`train.updates_per_batch` optimizer steps on mini-batches of the batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import losses
from rlvr_jax.config.algorithm_checks import micro_batches
from rlvr_jax.training import learner, ledger
from rlvr_jax.training.algorithms.common import Context, Update, step_micro_batches
from rlvr_jax.training.batch import packed_row_counts
from rlvr_jax.training.critic import warn_if_unused
from rlvr_jax.training.groups import BatchAssembler, build_batch, rewards_N
from rlvr_jax.training.optimizer import make_optimizer
from rlvr_jax.training.rollouts import (
    GeneratingSource,
    Rollouts,
    build_rollouts,
    merge_service_metrics,
)
from rlvr_jax.training.sources import Batch
from rlvr_jax.training.step_log import empty_reason, sample_records

log = logging.getLogger("rlvr_jax.train")

STALE_WARN_SHARE = 0.2
"""Async: the share of the generated groups dropped as stale (over `STALE_WARN_BATCHES`
batches once drops can happen) past which the run warns, once."""
STALE_WARN_BATCHES = 5


def stale_warning(stale: int, drawn: int, *, max_staleness: int, queue_size: int) -> str | None:
    """The warning for `stale` of `stale + drawn` generated groups dropped as stale, or None
    below `STALE_WARN_SHARE`. Dropped groups were decoded in full (the late, long ones: their
    loss also biases a batch to short completions); the actors run `queue_size` batches ahead,
    so a bound below it drops groups routinely."""
    total = stale + drawn
    if not total or stale / total <= STALE_WARN_SHARE:
        return None
    return (
        f"async: {stale} of the {total} groups the actors generated were dropped as stale "
        f"({stale / total:.0%}: older than rollout.max_staleness={max_staleness} policy versions "
        f"when their batch trained); the actors run rollout.queue_size={queue_size} batches "
        "ahead: raise rollout.max_staleness or lower rollout.queue_size"
    )


class RolloutSource(GeneratingSource):
    """`algorithm: rl`: batches of `train.prompts_per_batch` kept groups (see module docstring)."""

    def __init__(self, ctx: Context, rollouts: Rollouts) -> None:
        cfg = ctx.cfg
        f = cfg.filter
        self.rollouts, self.settings, self.P = rollouts, ctx.settings, cfg.train.prompts_per_batch
        self.mode, self.queue_size = cfg.rollout.mode, cfg.rollout.queue_size
        self.max_staleness = cfg.rollout.max_staleness
        self.zero_variance, self.overlong_filter = f.zero_variance, f.overlong_filter
        self.cap = self.P * max(f.max_draws, 1) if f.active_sampling else self.P
        self.rows, self.seq_len, self.pad_id = ctx.rows, ctx.batch_length, ctx.pad_id
        self.shared = (ctx.group_length, ctx.completion_length) if ctx.shares_prompts else None
        t = cfg.train
        self.packing = dict(
            max_tokens=t.max_tokens_per_micro_batch,
            updates=t.updates_per_batch,
            row_multiple=ctx.row_multiple,
        )
        mini = self.rows // t.updates_per_batch
        one_micro = micro_batches(mini, t.micro_batch_size, "mini-batch") == 1
        self.row_counts: tuple[int, ...] = ()
        if self.shared and not t.max_tokens_per_micro_batch and one_micro:
            self.packing["pack_groups"] = True  # several groups to a row, the fewest rows
            if t.compile_ahead:  # every row count compiled with the first batch
                self.row_counts = packed_row_counts(
                    self.rows,
                    group_size=cfg.rollout.num_samples,
                    updates=t.updates_per_batch,
                    row_multiple=ctx.row_multiple,
                )
        self.on_policy = self.mode == "sync"
        self.sample_completions = cfg.log.sample_completions
        self._carry: list[Any] = []  # scored groups a full batch left: the next batch's first
        self._stale_seen = [0, 0, 0]  # async: batches, stale and drawn groups (see stale_warning)

    def next(self, policy_version: int) -> Batch | None:
        r = self.rollouts
        asm = BatchAssembler(
            self.P,
            zero_variance_filter=self.zero_variance,
            max_staleness=self.max_staleness if self.mode == "async" else None,
        )
        service: list[dict[str, float]] = []
        t0 = time.perf_counter()
        carried, self._carry = self._carry, []
        self._offer(asm, carried, policy_version)
        while not asm.full and asm.drawn < self.cap:
            if self.mode == "async":
                r.fill(self._async_target())
            else:
                r.fill(min(self.P - len(asm.kept), self.cap - asm.drawn))
            done = r.completed()
            if not done:
                break
            scored, metrics = r.score(done)
            service.append(metrics)
            self._offer(asm, scored, policy_version)
        if r.stop():  # stopped (maybe while these groups were scored): nothing is consumed,
            self._carry = [g for g, _ in asm.settled] + self._carry  # they stay pending, and
            return None  # are re-issued on resume
        r.consume([g.request_id for g, _ in asm.settled])
        if self.mode == "async":  # the actors generate the next batch while this one trains
            r.fill(self._async_target())
            self._watch_staleness(asm)
        kept = asm.kept
        arrays, slots = None, None
        if kept:
            arrays, slots = build_batch(
                kept,
                self.settings,
                rows=self.rows,
                seq_len=self.seq_len(kept) + 1,
                pad_id=self.pad_id,
                overlong_filter=self.overlong_filter,
                version=policy_version,
                shared_row_len=self.shared[0](kept) if self.shared else 0,
                completion_len=self.shared[1](kept) if self.shared else 0,
                **self.packing,
            )
        merged = merge_service_metrics(service)
        metrics = {**merged, **asm.metrics(), **r.kv_metrics()}
        metrics.update(r.ledger_metrics())
        metrics["staleness/mean"] = (
            float(np.mean([policy_version - g.version for g in kept])) if kept else 0.0
        )
        metrics["time/rollout_s"] = time.perf_counter() - t0
        return Batch(
            arrays,
            metrics=metrics,
            samples=sample_records(asm.settled, r.tokenizer, self.sample_completions),
            empty_reason=""
            if kept
            else empty_reason(asm.settled, merged, r.tokenizer, max_new_tokens=r.max_new_tokens),
            tokens=sum(len(c.tokens) for g in kept for c in g.completions),
            rewards_B=rewards_N(kept),
            group_size=r.num_samples,
            slots=slots,
            sequences=[(g.prompt_tokens, list(c.tokens)) for g in kept for c in g.completions],
            settled=[ledger.entry(g.request_id, g.row, o, g.version) for g, o in asm.settled],
            row_counts=self.row_counts,
        )

    def _offer(self, asm: BatchAssembler, groups: list[Any], policy_version: int) -> None:
        """Offers `groups` to the batch; those that complete after it is full are carried."""
        for g in groups:
            if asm.full:
                self._carry.append(g)
            else:
                asm.offer(g, policy_version)

    def _watch_staleness(self, asm: BatchAssembler) -> None:
        """Warns once if `STALE_WARN_BATCHES` batches, after the first `max_staleness` + 1 (which
        cannot drop any), dropped too many stale groups."""
        seen = self._stale_seen
        seen[0] += 1
        first = self.max_staleness + 2
        if not first <= seen[0] < first + STALE_WARN_BATCHES:
            return
        seen[1], seen[2] = seen[1] + asm.stale, seen[2] + asm.drawn
        if seen[0] == first + STALE_WARN_BATCHES - 1:
            msg = stale_warning(
                seen[1], seen[2], max_staleness=self.max_staleness, queue_size=self.queue_size
            )
            if msg:
                log.warning(msg)

    def _async_target(self) -> int:
        """Requests kept in flight in async mode: `rollout.queue_size` batches."""
        return self.P * max(self.queue_size, 1)


def source(ctx: Context, params: Any, version: int) -> RolloutSource:
    """The rollout source, its engine starting from `params` at policy `version`."""
    cfg = ctx.cfg
    in_flight = cfg.train.prompts_per_batch * max(cfg.rollout.queue_size, cfg.filter.max_draws, 1)
    return RolloutSource(ctx, build_rollouts(ctx, params, version, in_flight=in_flight))


class RLUpdate(Update):
    """`train.updates_per_batch` optimizer steps on mini-batches of each RL batch (see the module
    docstring). Subclasses make another step (`_make_step`), prepare the advantages another way
    (`_advantages`), or give the step more batches (`_step_args`)."""

    def __init__(self, ctx: Context) -> None:
        cfg, settings = ctx.cfg, ctx.settings
        self.updates = cfg.train.updates_per_batch
        n_micro = step_micro_batches(cfg, ctx.rows // self.updates, "mini-batch")
        options = dict(
            max_len=cfg.rollout.max_new_tokens,
            compute_dtype=cfg.model.compute_dtype,
            temperature=cfg.rollout.temperature,
            memory=ctx.memory,
        )
        step, optimizer = self._make_step(ctx, make_optimizer(cfg.train), n_micro, options)
        super().__init__(ctx, step, optimizer)
        self.logprob = learner.make_logprob_fn(
            ctx.model.config,
            compute_dtype=cfg.model.compute_dtype,
            temperature=cfg.rollout.temperature,
            memory=ctx.memory,
        )
        self.exact = cfg.rollout.exact
        self.needs_old = (
            (self.updates > 1 and settings.ratio_denominator == "old")
            or settings.tis_mode == "mask"
            or settings.reward_kl_coef > 0
            or self.exact
        )
        self._scorer: Any = None  # rollout.exact: the engine the old log-probs replay through
        self.needs_ref = settings.needs_ref_logp

    def _make_step(
        self, ctx: Context, optimizer: Any, n_micro: int | None, options: dict[str, Any]
    ) -> tuple[Callable, Any]:
        """(the pure step, its optimizer)."""
        warn_if_unused(ctx.cfg, ctx.settings)
        step = learner.make_train_step(
            ctx.model.config, optimizer, ctx.settings, n_micro=n_micro, **options
        )
        return step, optimizer

    def update(self, state: Any, batch: Batch) -> tuple[Any, list, int]:
        if batch.arrays is None:
            return state, [], 0
        arrays = self._rl_part(batch.arrays)
        full = self.put(self._lag_per_update(arrays))
        if self.exact:
            full = full.replace(old_logp_BxT=self.put(self._replayed(state, arrays, batch)))
        elif self.needs_old:
            full = full.replace(old_logp_BxT=self.call(self.logprob, state.params, full))
        if self.needs_ref:
            ref = self.reference_params(state)
            full = full.replace(ref_logp_BxT=self.call(self.logprob, ref, full))
        full, before = self._advantages(state, full, batch)
        if self.ctx.cfg.train.save_batch and not self.abstract:
            self._save(state, full, batch)
        out = []
        for u in range(self.updates):
            mini = full if self.updates == 1 else self.mini_batch(full, u, self.updates)
            state, metrics = self.call(self.step, state, mini, *self._step_args(batch, u))
            out.append({**metrics, **before})
        return state, out, self.updates

    def _rl_part(self, arrays: Any) -> Any:
        return arrays

    def _replayed(self, state: Any, arrays: Any, batch: Batch) -> np.ndarray:
        """`rollout.exact`: the old log-probs [B, T] of the batch's completions replayed with
        the learner's params through an engine like the actors' (`rollout.rescore`)."""
        old_BxT = np.zeros(arrays.mask_BxT.shape, np.float32)
        if self.abstract:  # (only its shape is compiled against)
            return old_BxT
        from rlvr_jax.rollout import build_engine, rescore, sampling_params

        ctx, cfg = self.ctx, self.ctx.cfg
        if self._scorer is None:
            self._scorer = build_engine(
                cfg.rollout, ctx.model, ctx.actor_mesh, ctx.tokenizer, max_len=ctx.seq_len
            )
        params = self._scorer.prepare(state.params)
        scored = rescore(
            self._scorer, batch.sequences, params=params, sampling=sampling_params(cfg.rollout)
        )
        for slot, (prompt, _), logp in zip(batch.slots, batch.sequences, scored):
            first = 0 if arrays.targets_BxT is not None else len(prompt) - 1  # shared: own tokens
            old_BxT[slot, first : first + len(logp)] = logp
        return old_BxT

    def _lag_per_update(self, arrays: Any) -> Any:
        """Without precomputed old log-probs, mini-batch u is scored by the params after u
        updates: its tokens lag u more versions."""
        if self.needs_old or self.updates == 1 or arrays.lag_BxT is None:
            return arrays
        lag_BxT = np.array(arrays.lag_BxT)
        n = lag_BxT.shape[0] // self.updates
        for u in range(1, self.updates):
            lag_BxT[u * n : (u + 1) * n] += u
        return arrays.replace(lag_BxT=lag_BxT)

    def _step_args(self, batch: Batch, u: int) -> tuple:
        """What the step takes after the state and the RL mini-batch."""
        del batch, u
        return ()

    def _advantages(self, state: Any, full: Any, batch: Batch) -> tuple[Any, dict[str, Any]]:
        """(the batch with the advantages the loss uses, metrics of making them): with
        `loss.kl_mode: reward`, those of the KL-penalised rewards, which need the learner's
        log-probs."""
        del state
        if self.ctx.settings.reward_kl_coef > 0 and not self.abstract:  # (nothing to compile)
            adv_B = kl_advantages(self.ctx.settings, full, batch)
            full = full.replace(advantages_B=self.put(adv_B))
        return full, {}

    def _save(self, state: Any, full: Any, batch: Batch) -> None:
        """`train.save_batch`: the batch as a loss-lab file (`rlvr-bench losses --batch`)."""
        from rlvr_jax.losses.batch_file import save_batch

        old = full.old_logp_BxT
        if old is None:
            old = self.logprob(state.params, full)
        # the completions in sample order (groups of G), as the loss lab reads them
        slots = batch.slots
        advantages = full.advantages_B if full.advantages_BxT is None else full.advantages_BxT
        extra = {} if full.ref_logp_BxT is None else {"ref_logp": full.ref_logp_BxT[slots]}
        save_batch(
            self.ctx.cfg.train.save_batch,
            logp=old[slots],
            old_logp=old[slots],
            sampler_logp=full.sampler_logp_BxT[slots],
            advantages=advantages[slots],
            mask=full.mask_BxT[slots],
            rewards=batch.rewards_B,
            group_size=np.asarray(batch.group_size),
            max_len=np.asarray(self.ctx.cfg.rollout.max_new_tokens),
            **extra,
        )


def kl_advantages(settings: losses.LossSettings, full: Any, batch: Batch) -> jax.Array:
    """`loss.kl_mode: reward`: advantages [B] of the KL-penalised rewards (the penalty needs
    the learner's old and reference log-probs), 0 on padding rows."""
    slots = jnp.asarray(batch.slots)
    penalised_N = losses.kl_reward_penalty(
        jnp.asarray(batch.rewards_B),
        logp=full.old_logp_BxT[slots],
        ref_logp=full.ref_logp_BxT[slots],
        mask=full.mask_BxT[slots],
        kl_coef=settings.reward_kl_coef,
        kl_estimator=settings.kl_estimator,
    )
    adv_N = losses.advantages(
        settings.advantage, penalised_N.reshape(-1, batch.group_size)
    ).reshape(-1)
    return jnp.zeros(full.advantages_B.shape, jnp.float32).at[slots].set(adv_N)


def update(ctx: Context) -> RLUpdate:
    return RLUpdate(ctx)
