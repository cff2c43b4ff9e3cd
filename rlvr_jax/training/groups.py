"""From completed rollout groups to a learner batch: rewards, staleness, zero-variance
filtering, active sampling (fill accounting), advantages, overlong masking.

Host-side and model-free: a group is the G completions of one prompt; the learner batch is
`prompts_per_batch` kept groups (ALGORITHMS.md, Sampling-side techniques).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlvr_jax.training.batch import Sample


@dataclass
class ScoredGroup:
    """The G completions of one prompt with their rewards."""

    row: Any
    """The prompt's data row (`rlvr_jax.data.PromptRow`)."""
    prompt_tokens: list[int]
    completions: list[Any]
    """`rlvr_jax.rollout.Completion`s, ordered by sample index."""
    rewards_G: np.ndarray
    domain: str
    texts: list[str] = field(default_factory=list)

    @property
    def version(self) -> int:
        """The oldest policy version that produced any token of the group."""
        versions = [min(c.policy_versions) for c in self.completions if len(c.policy_versions)]
        return min(versions) if versions else 0

    @property
    def zero_variance(self) -> bool:
        return bool(np.ptp(self.rewards_G) < 1e-6)


def group_rows(row: Any) -> dict[str, Any]:
    """The reward service's row dict for a PromptRow."""
    return row.to_dict() if hasattr(row, "to_dict") else dict(row)


def score_groups(
    groups: Sequence[tuple[Any, list[int], list[Any]]], service, tokenizer, *, max_len: int
) -> tuple[list[ScoredGroup], dict[str, float]]:
    """Scores every completion of `groups` ((row, prompt_tokens, completions) triples) in one
    call to the reward service; returns the scored groups and the service's metrics."""
    rows, texts, lengths, spans = [], [], [], []
    for row, _, comps in groups:
        start = len(texts)
        for c in comps:
            rows.append(group_rows(row))
            texts.append(tokenizer.decode(c.tokens, skip_special_tokens=True))
            lengths.append(len(c.tokens))
        spans.append((start, len(texts)))
    if not texts:
        return [], {}
    result = service.score(rows, texts, lengths=lengths, max_len=max_len)
    scored = []
    for (row, prompt, comps), (a, b) in zip(groups, spans):
        scored.append(
            ScoredGroup(
                row=row,
                prompt_tokens=list(prompt),
                completions=list(comps),
                rewards_G=np.asarray(result.rewards[a:b], np.float32),
                domain=result.domains[a] if b > a else "unknown",
                texts=texts[a:b],
            )
        )
    return scored, dict(result.metrics)


@dataclass
class BatchAssembler:
    """Collects kept groups for one learner batch and counts what was dropped and why."""

    prompts_per_batch: int
    zero_variance_filter: bool = True
    max_staleness: int | None = None
    kept: list[ScoredGroup] = field(default_factory=list)
    drawn: int = 0
    filtered: int = 0
    stale: int = 0
    all_rewards: list[float] = field(default_factory=list)
    domain_rewards: dict[str, list[float]] = field(default_factory=dict)
    lengths: list[int] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return len(self.kept) >= self.prompts_per_batch

    def offer(self, group: ScoredGroup, current_version: int) -> bool:
        """Adds `group` unless it is too stale or has zero reward variance; True if kept."""
        if self.max_staleness is not None and current_version - group.version > self.max_staleness:
            self.stale += 1
            return False
        self.drawn += 1
        self.all_rewards.extend(group.rewards_G.tolist())
        self.domain_rewards.setdefault(group.domain, []).extend(group.rewards_G.tolist())
        self.lengths.extend(len(c.tokens) for c in group.completions)
        if self.full:
            return False
        if self.zero_variance_filter and group.zero_variance:
            self.filtered += 1
            return False
        self.kept.append(group)
        return True

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {
            "groups/drawn": float(self.drawn),
            "groups/kept": float(len(self.kept)),
            "groups/filtered_fraction": self.filtered / max(self.drawn, 1),
            "groups/fill_rate": len(self.kept) / self.prompts_per_batch,
            "groups/stale_dropped": float(self.stale),
        }
        if self.all_rewards:
            out["reward/mean"] = float(np.mean(self.all_rewards))
        for d, rs in sorted(self.domain_rewards.items()):
            out[f"reward/{d}"] = float(np.mean(rs))
        if self.lengths:
            out["response_length/mean"] = float(np.mean(self.lengths))
            out["response_length/max"] = float(np.max(self.lengths))
        return out


def build_samples(
    groups: Sequence[ScoredGroup], *, overlong_filter: bool = False
) -> tuple[list[Sample], np.ndarray]:
    """Learner samples of the kept groups (advantages filled in later, on device) and their
    rewards [P, G]; overlong completions are masked out if asked."""
    if not groups:
        return [], np.zeros((0, 0), np.float32)
    sizes = {len(g.rewards_G) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"groups of different sizes {sorted(sizes)} in one batch")
    samples = [
        Sample(
            prompt_tokens=g.prompt_tokens,
            tokens=list(c.tokens),
            sampler_logp=list(c.logprobs),
            advantage=0.0,
            train=not (overlong_filter and c.finish_reason == "length"),
        )
        for g in groups
        for c in g.completions
    ]
    return samples, np.stack([g.rewards_G for g in groups])
