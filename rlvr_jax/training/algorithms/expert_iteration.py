"""`algorithm: expert_iteration`: SFT on the policy's own verified-correct samples
(ALGORITHMS.md: "Expert iteration is SFT on the correct samples").

    rlvr-train --config F algorithm=expert_iteration    # data.sources, verified samples

Each step is one on-policy round: `train.prompts_per_batch` prompts × `rollout.num_samples`
samples, the completions whose *verifier* score (`ScoredGroup.scores_G`, before the reward
shaping terms) is at least `sft.expert_min_score` trained on exactly as sampled by
`sft.expert_sft_steps` SFT steps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlvr_jax.training import ledger
from rlvr_jax.training.algorithms.common import Context
from rlvr_jax.training.algorithms.sft import SFTUpdate
from rlvr_jax.training.batch import TokenBatch, collate_sft
from rlvr_jax.training.groups import BatchAssembler, ScoredGroup
from rlvr_jax.training.rollouts import GeneratingSource, Rollouts, build_rollouts
from rlvr_jax.training.sources import Batch
from rlvr_jax.training.step_log import empty_reason, sample_records


def kept_mask(group: ScoredGroup, *, min_score: float) -> np.ndarray:
    """bool[G]: the completions kept as SFT examples (verifier score ≥ `min_score`, non-empty)."""
    if len(group.scores_G) != len(group.completions):
        raise ValueError(
            f"group of {len(group.completions)} completions has {len(group.scores_G)} scores"
        )
    lengths_G = np.array([len(c.tokens) for c in group.completions])
    return (np.asarray(group.scores_G) >= min_score) & (lengths_G > 0)


def expert_examples(
    groups: Sequence[ScoredGroup], *, min_score: float
) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, completion ids) of every kept completion, in (group, sample) order."""
    prompts, responses = [], []
    for g in groups:
        for completion, keep in zip(g.completions, kept_mask(g, min_score=min_score)):
            if keep:
                prompts.append(list(g.prompt_tokens))
                responses.append(list(completion.tokens))
    return prompts, responses


def expert_metrics(groups: Sequence[ScoredGroup], *, min_score: float) -> dict[str, float]:
    """`expert/kept` (completions kept), `expert/kept_fraction`, `expert/verifier_mean` and
    `expert/prompts_solved` (the fraction of prompts with a kept completion)."""
    masks = [kept_mask(g, min_score=min_score) for g in groups]
    total = sum(len(m) for m in masks)
    kept = sum(int(m.sum()) for m in masks)
    scores = [np.asarray(g.scores_G, np.float32) for g in groups]
    return {
        "expert/kept": float(kept),
        "expert/kept_fraction": kept / max(total, 1),
        "expert/verifier_mean": float(np.concatenate(scores).mean()) if total else 0.0,
        "expert/prompts_solved": float(np.mean([m.any() for m in masks])) if masks else 0.0,
    }


class ExpertIterationSource(GeneratingSource):
    """`algorithm: expert_iteration`: one on-policy round per step (module docstring), the kept
    completions as an SFT batch of prompts × samples rows (a round that keeps nothing makes no
    update; the ledger records its prompts as `filtered`). Extra metrics: `expert/*`."""

    def __init__(self, ctx: Context, rollouts: Rollouts) -> None:
        cfg = ctx.cfg
        self.rollouts, self.P = rollouts, cfg.train.prompts_per_batch
        self.min_score, self.rows, self.pad_id = cfg.sft.expert_min_score, ctx.rows, ctx.pad_id
        self.full_len, self.row_multiple = ctx.seq_len, ctx.row_multiple
        self.max_tokens = cfg.train.max_tokens_per_micro_batch
        self.sample_completions = cfg.log.sample_completions

    def next(self, policy_version: int) -> Batch | None:
        r = self.rollouts
        t0 = time.perf_counter()
        r.fill(self.P)
        done: list[Any] = []
        while len(done) < self.P:
            more = r.completed()
            if not more:
                return None
            done.extend(more)
        r.consume([g.request_id for g in done])
        groups, metrics = r.score(done)
        asm = BatchAssembler(self.P, zero_variance_filter=False)
        for g in groups:
            asm.offer(g, policy_version)
        metrics = {
            **metrics,
            **asm.metrics(),
            **expert_metrics(groups, min_score=self.min_score),
            **r.stream.kv_metrics(),
        }
        metrics["staleness/mean"] = 0.0
        metrics["time/rollout_s"] = time.perf_counter() - t0
        metrics.update(r.ledger_metrics())
        outcomes = [
            (g, "trained" if kept_mask(g, min_score=self.min_score).any() else "filtered")
            for g in groups
        ]
        settled = [ledger.entry(g.request_id, g.row, o, g.version) for g, o in outcomes]
        prompts, responses = expert_examples(groups, min_score=self.min_score)
        arrays: TokenBatch | None = None
        if prompts:
            arrays = collate_sft(
                prompts, responses, rows=self.rows, seq_len=self.full_len + 1, pad_id=self.pad_id,
                max_tokens=self.max_tokens, row_multiple=self.row_multiple,
            )  # fmt: skip
        return Batch(
            arrays,
            metrics=metrics,
            samples=sample_records(outcomes, r.tokenizer, self.sample_completions),
            empty_reason=""
            if prompts
            else (
                f"no completion scored at least sft.expert_min_score={self.min_score}; "
                + empty_reason(outcomes, metrics, r.tokenizer, max_new_tokens=r.max_new_tokens)
            ),
            tokens=sum(len(c.tokens) for g in groups for c in g.completions),
            settled=settled,
        )


def source(ctx: Context, params: Any, version: int) -> ExpertIterationSource:
    rollouts = build_rollouts(ctx, params, version, in_flight=ctx.cfg.train.prompts_per_batch)
    return ExpertIterationSource(ctx, rollouts)


def update(ctx: Context) -> SFTUpdate:
    return SFTUpdate(ctx, rows=ctx.rows, repeat=ctx.cfg.sft.expert_sft_steps)
