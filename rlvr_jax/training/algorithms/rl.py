"""`algorithm: rl`: GRPO-family RL on the actors' rollouts (PPO with a critic is `ppo.py`).

`RolloutSource`: batches of `train.prompts_per_batch` kept groups (zero-variance filtering,
active sampling, the async staleness bound). Async mode keeps `rollout.queue_size` batches of
requests in flight, topped up before each batch is returned; groups completing once a batch is
full wait for the next (none is dropped unsettled).

`RLUpdate`, one jitted program: θ_old's and the reference's log-probs where the loss needs
them, then `train.updates_per_batch` optimizer steps on mini-batches.
"""

from __future__ import annotations

import functools
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
from rlvr_jax.training.batch import RLBatch, packed_row_counts
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
"""Async: the share of generated groups dropped as stale past which the run warns, once."""
STALE_WARN_BATCHES = 5


def stale_warning(stale: int, drawn: int, *, max_staleness: int, queue_size: int) -> str | None:
    """The warning for `stale` of `stale + drawn` generated groups dropped as stale, or None
    below `STALE_WARN_SHARE` (dropped groups were decoded in full, and are the long ones)."""
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
        metrics = {**merged, **asm.metrics(), **r.stream.kv_metrics()}
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
    """`train.updates_per_batch` optimizer steps on mini-batches of each RL batch, one program.
    Subclasses make another step (`_make_step`), advantages (`_advantages`) or inputs
    (`_parts`)."""

    def __init__(self, ctx: Context) -> None:
        cfg, settings = ctx.cfg, ctx.settings
        self.updates = cfg.train.updates_per_batch
        n_micro = step_micro_batches(cfg, ctx.rows // self.updates, "mini-batch")
        forward = dict(
            compute_dtype=cfg.model.compute_dtype,
            temperature=cfg.rollout.temperature,
            memory=ctx.memory,
        )
        options = dict(max_len=cfg.rollout.max_new_tokens, **forward)
        optimizer = make_optimizer(cfg.train)
        self.train_step, optimizer = self._make_step(ctx, optimizer, n_micro, options)
        super().__init__(ctx, optimizer)
        self.logprob = learner.make_logprob_fn(ctx.model.config, **forward)
        self.exact = cfg.rollout.exact
        self.needs_old = (
            (self.updates > 1 and settings.ratio_denominator == "old")
            or settings.tis_mode == "mask"
            or settings.reward_kl_coef > 0
            or self.exact
        )
        self.needs_ref = settings.needs_ref_logp
        self.kl_rewards = settings.reward_kl_coef > 0 and not settings.uses_critic
        """`loss.kl_mode: reward`, group advantages: the estimator runs over the kept groups (a
        count that varies), so the log-probs it needs come before the program."""
        self._scorer: Any = None  # rollout.exact: the engine the old log-probs replay through
        self._prepare = jax.jit(self.prepare)  # kl_rewards, train.save_batch: before the program

        self._kl_advantages = jax.jit(
            functools.partial(kl_advantages, settings=settings),
            static_argnames="group_size",
            out_shardings=ctx.batch_sharding((ctx.rows,)),
        )

    def _make_step(
        self, ctx: Context, optimizer: Any, n_micro: int | None, options: dict[str, Any]
    ) -> tuple[Callable, Any]:
        warn_if_unused(ctx.cfg, ctx.settings)
        step = learner.make_train_step(
            ctx.model.config, optimizer, ctx.settings, n_micro=n_micro, **options
        )
        return step, optimizer

    def inputs(self, batch: Batch) -> tuple | None:
        """(the RL batch, `_parts`' rest); with `rollout.exact`, zeros for θ_old's log-probs
        (`_given` replays them)."""
        if batch.arrays is None:
            return None
        rl, *rest = self._parts(batch.arrays)
        if self.exact:
            rl = rl.replace(old_logp_BxT=np.zeros(rl.mask_BxT.shape, np.float32))
        return (rl, *rest)

    def _parts(self, arrays: Any) -> tuple:
        """(the RL batch of a source's arrays, what else the step takes, split as it is)."""
        return (arrays,)

    def _given(self, state: Any, inputs: tuple, batch: Batch) -> tuple:
        """`inputs` on the mesh, with θ_old's replayed log-probs and the KL-penalised advantages."""
        rl, *rest = inputs
        if self.exact:
            rl = rl.replace(old_logp_BxT=self._replayed(state, rl, batch))
        rl, *rest = self.ctx.put((rl, *rest))
        if self.kl_rewards or self.ctx.cfg.train.save_batch:
            scored, _ = self._prepare(state, rl, self.reference)
            if self.ctx.cfg.train.save_batch:
                self._save(state, scored, batch)
            if self.kl_rewards:
                slots, rewards, g = np.asarray(batch.slots), batch.rewards_B, batch.group_size
                rl = scored.replace(
                    advantages_B=self._kl_advantages(scored, slots, rewards, group_size=g)
                )
        return (rl, *rest)

    def _compile(self, state: Any, inputs: tuple) -> None:
        if self.kl_rewards:  # the program then takes `_prepare`'s batch
            compiled = self._prepare.lower(state, inputs[0], self.reference).compile()
            inputs = (compiled.out_info[0], *inputs[1:])
        super()._compile(state, inputs)

    def step(self, state: Any, inputs: tuple, reference: Any) -> tuple[Any, list[dict]]:
        """The program: `prepare`, then `updates` optimizer steps on mini-batches."""
        rl, *rest = inputs
        rl, before = self.prepare(state, rl, reference)
        args = (rl, *rest)
        if self.updates > 1:
            args = tuple(self.ctx.mini_batches(a, self.updates) for a in args)
        lagged = not self.needs_old and self.updates > 1 and rl.lag_BxT is not None

        def one(state: Any, u: Any) -> tuple[Any, dict]:
            part = args if self.updates == 1 else jax.tree.map(lambda x: x[u], args)
            if lagged:  # mini-batch u is scored by the params after u updates
                part = (part[0].replace(lag_BxT=part[0].lag_BxT + u), *part[1:])
            state, metrics = self.train_step(state, *part)
            return state, {**metrics, **before}

        return self.steps(state, self.updates, one)

    def prepare(self, state: Any, rl: Any, reference: Any) -> tuple[Any, dict[str, Any]]:
        """(the RL batch with the log-probs the loss needs and its advantages, their metrics)."""
        if self.needs_old and rl.old_logp_BxT is None:
            rl = rl.replace(old_logp_BxT=self.logprob(state.params, rl))
        if self.needs_ref and rl.ref_logp_BxT is None:
            ref_logp = self.logprob(self.reference_params(state, reference), rl)
            rl = rl.replace(ref_logp_BxT=ref_logp)
        return self._advantages(state, self.ctx.laid_out(rl))

    def _advantages(self, state: Any, rl: Any) -> tuple[Any, dict[str, Any]]:
        """(the batch with the advantages the loss uses, metrics of making them): its own."""
        del state
        return rl, {}

    def _replayed(self, state: Any, rl: Any, batch: Batch) -> np.ndarray:
        """`rollout.exact`: θ_old's log-probs [B, T] replayed through an engine (`rescore`)."""
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
        old_BxT = np.zeros(rl.mask_BxT.shape, np.float32)
        for slot, (prompt, _), logp in zip(batch.slots, batch.sequences, scored):
            first = 0 if rl.targets_BxT is not None else len(prompt) - 1  # shared: own tokens
            old_BxT[slot, first : first + len(logp)] = logp
        return old_BxT

    def _save(self, state: Any, scored: Any, batch: Batch) -> None:
        """`train.save_batch`: the prepared batch for `rlvr-bench losses --batch`."""
        from rlvr_jax.losses.batch_file import save_batch

        old = scored.old_logp_BxT
        if old is None:
            old = self.logprob(state.params, scored)
        full, old = jax.device_get((scored, old))
        slots = batch.slots  # the completions in sample order (groups of G), as the lab reads
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


def kl_advantages(
    rl: RLBatch, slots_N: Any, rewards_N: Any, *, settings: losses.LossSettings, group_size: int
) -> jax.Array:
    """`loss.kl_mode: reward`: advantages [B] of the KL-penalised rewards of the completions at
    `slots_N` (groups of `group_size`), 0 on padding rows."""
    penalised_N = losses.kl_reward_penalty(
        rewards_N,
        logp=rl.old_logp_BxT[slots_N],
        ref_logp=rl.ref_logp_BxT[slots_N],
        mask=rl.mask_BxT[slots_N],
        kl_coef=settings.reward_kl_coef,
        kl_estimator=settings.kl_estimator,
    )
    adv_N = losses.advantages(settings.advantage, penalised_N.reshape(-1, group_size))
    return jnp.zeros(rl.mask_BxT.shape[:1], jnp.float32).at[slots_N].set(adv_N.reshape(-1))
