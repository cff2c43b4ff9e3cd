"""Builds each algorithm's batch source from the run's config (`algorithms.ALGORITHMS`).

The rollout backend follows `rollout.backend`: `jetstream` is our engine on the actor mesh
behind a `RolloutStream`; `vllm` is a running vLLM engine behind `VllmStream` (the same
interface). Either starts from the params it is given (the restored ones on resume).
"""

from __future__ import annotations

from typing import Any

import jax

from rlvr_jax.training.algorithms import PARALLEL_SFT_SEED_OFFSET, Context
from rlvr_jax.training.recipes.sft_data import SFTBatcher, build_sft_iterator
from rlvr_jax.training.rollouts import ExpertIterationSource, Rollouts, RolloutSource
from rlvr_jax.training.sources import PairingSource, SFTSource


def rollout_stream(ctx: Context, params: Any, version: int, *, in_flight: int) -> Any:
    """The run's actor rollout (`rollout.build_rollout` on the actor mesh), from `params`."""
    from rlvr_jax.rollout import build_rollout

    return build_rollout(
        ctx.cfg.rollout,
        ctx.model,
        ctx.actor_mesh,
        ctx.tokenizer,
        max_len=ctx.seq_len,
        params=params,
        version=version,
        max_pending_groups=in_flight + 1,
        max_ready_groups=in_flight + 1,
        timeline=ctx.timeline,
    )


def rollouts(ctx: Context, params: Any, version: int, *, in_flight: int) -> Rollouts:
    from rlvr_jax.data import build_prompt_iterator
    from rlvr_jax.rewards import RewardService, known_verifiers

    cfg = ctx.cfg
    prompts = build_prompt_iterator(
        cfg.data, tokenizer=ctx.tokenizer, known_verifiers=known_verifiers()
    )
    rewards = RewardService(cfg.rewards, overlong_buffer=cfg.filter.soft_overlong_buffer)
    try:
        stream = rollout_stream(ctx, params, version, in_flight=in_flight)
    except BaseException:
        rewards.close()
        raise
    return Rollouts(
        stream=stream,
        prompts=prompts,
        rewards=rewards,
        tokenizer=ctx.tokenizer,
        num_samples=cfg.rollout.num_samples,
        seed=cfg.seed,
        max_new_tokens=cfg.rollout.max_new_tokens,
        threaded=jax.process_count() == 1,
        stop=ctx.stop,
    )


def rl_source(ctx: Context, params: Any, version: int) -> RolloutSource:
    cfg = ctx.cfg
    P = cfg.train.prompts_per_batch
    in_flight = P * max(cfg.rollout.queue_size, cfg.filter.max_draws, 1)
    return RolloutSource(
        rollouts(ctx, params, version, in_flight=in_flight),
        ctx.settings,
        prompts_per_batch=P,
        mode=cfg.rollout.mode,
        queue_size=cfg.rollout.queue_size,
        max_staleness=cfg.rollout.max_staleness,
        zero_variance=cfg.filter.zero_variance,
        active_sampling=cfg.filter.active_sampling,
        max_draws=cfg.filter.max_draws,
        overlong_filter=cfg.filter.overlong_filter,
        rows=ctx.rows,
        seq_len=ctx.batch_length,
        pad_id=ctx.pad_id,
        max_tokens=cfg.train.max_tokens_per_micro_batch,
        updates=cfg.train.updates_per_batch,
        row_multiple=ctx.row_multiple,
    )


def expert_source(ctx: Context, params: Any, version: int) -> ExpertIterationSource:
    cfg = ctx.cfg
    P = cfg.train.prompts_per_batch
    return ExpertIterationSource(
        rollouts(ctx, params, version, in_flight=P),
        prompts_per_batch=P,
        min_score=cfg.sft.expert_min_score,
        rows=ctx.rows,
        seq_len=ctx.seq_len,
        pad_id=ctx.pad_id,
        max_tokens=cfg.train.max_tokens_per_micro_batch,
        row_multiple=ctx.row_multiple,
    )


def sft_batches(ctx: Context, *, seed: int, packed: bool = False) -> SFTSource:
    cfg = ctx.cfg
    examples = build_sft_iterator(cfg, ctx.tokenizer, seed=seed)
    batcher = SFTBatcher(
        examples,
        ctx.tokenizer,
        cfg.data.prompt_template,
        rows=cfg.sft.batch_size,
        seq_len=ctx.seq_len + 1,
        pad_id=ctx.pad_id,
        max_tokens=cfg.train.max_tokens_per_micro_batch if packed else 0,
        row_multiple=ctx.row_multiple,
    )
    return SFTSource(batcher)


def sft_source(ctx: Context, params: Any, version: int) -> SFTSource:
    del params, version
    return sft_batches(ctx, seed=ctx.cfg.data.seed, packed=True)


def parallel_source(ctx: Context, params: Any, version: int) -> PairingSource:
    sft = sft_batches(ctx, seed=ctx.cfg.data.seed + PARALLEL_SFT_SEED_OFFSET)
    return PairingSource(
        rl_source(ctx, params, version), sft, updates_per_batch=ctx.cfg.train.updates_per_batch
    )
