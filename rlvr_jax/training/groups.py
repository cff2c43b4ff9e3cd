"""From completed rollout groups (the G completions of one prompt) to the learner's batch:
rewards and verifier scores, staleness, zero-variance filtering, fill accounting, advantages,
overlong masking (ALGORITHMS.md, Sampling-side techniques). Host-side and model-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlvr_jax import losses
from rlvr_jax.training.batch import RLBatch, Sample, collate, collate_packed, collate_shared


@dataclass(frozen=True)
class ScoredGroup:
    """The G completions of one prompt with their rewards and verifier scores."""

    row: Any
    """The prompt's data row (`rlvr_jax.data.PromptRow`)."""
    prompt_tokens: list[int]
    completions: list[Any]
    """`rlvr_jax.rollout.Completion`s, ordered by sample index."""
    rewards_G: np.ndarray
    """The RL reward of each completion (verifier score × domain weight + format + length)."""
    scores_G: np.ndarray
    """The verifier's score of each completion in [0, 1] (correctness, before the weights and
    extra terms): what expert iteration selects by."""
    domain: str
    texts: list[str] = field(default_factory=list)
    """Each completion as the samples log shows it (an episode: its whole conversation)."""
    request_id: Any = None
    """The rollout request it came from (`Rollouts`: the prompt's draw number)."""

    @property
    def version(self) -> int:
        """The oldest policy version that produced any token of the group."""
        versions = [min(c.policy_versions) for c in self.completions if len(c.policy_versions)]
        return min(versions) if versions else 0

    @property
    def zero_variance(self) -> bool:
        return bool(np.ptp(self.rewards_G) < 1e-6)


def score_groups(
    groups: Sequence[Any], service: Any, tokenizer: Any, *, max_len: int
) -> tuple[list[ScoredGroup], dict[str, float]]:
    """(scored groups, the service's metrics) of `groups` (`rollout.CompletedGroup`s whose
    `meta` is the `PromptRow`), in one reward-service call. A multi-turn episode is scored on
    its final answer plus its environment's rewards; its text is the whole conversation."""
    from rlvr_jax.envs.episode import answer_text

    rows, texts, lengths, spans, shown, extra = [], [], [], [], [], []
    for g in groups:
        start = len(texts)
        for c in g.completions:
            rows.append(g.meta)
            texts.append(answer_text(c, tokenizer))
            lengths.append(len(c.tokens))
            extra.append(0.0 if c.episode is None else c.episode.reward)
            shown.append(
                texts[-1]
                if c.episode is None
                else tokenizer.decode(c.tokens, skip_special_tokens=False)
            )
        spans.append((start, len(texts)))
    if not texts:
        return [], {}
    result = service.score(rows, texts, lengths=lengths, max_len=max_len)
    if len(result.verifier_scores) != len(texts):
        raise RuntimeError(
            f"the reward service scored {len(result.verifier_scores)} of {len(texts)} completions"
        )
    scored = [
        ScoredGroup(
            row=g.meta,
            prompt_tokens=list(g.prompt_tokens),
            completions=list(g.completions),
            rewards_G=np.asarray(result.rewards[a:b], np.float32)
            + np.asarray(extra[a:b], np.float32),
            scores_G=np.asarray(result.verifier_scores[a:b], np.float32),
            domain=result.domains[a] if b > a else "unknown",
            texts=shown[a:b],
            request_id=g.request_id,
        )
        for g, (a, b) in zip(groups, spans)
    ]
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
    interrupted: list[bool] = field(default_factory=list)
    """Per drawn completion made with budget forcing on: whether it was interrupted."""
    settled: list[tuple[ScoredGroup, str]] = field(default_factory=list)
    """Each group offered and its outcome: `trained`, `filtered`, `stale` or `full`."""
    episodes: list[Any] = field(default_factory=list)
    """The episode records of the drawn multi-turn completions (`env/*` metrics)."""

    @property
    def full(self) -> bool:
        return len(self.kept) >= self.prompts_per_batch

    def offer(self, group: ScoredGroup, current_version: int) -> bool:
        """Adds `group` unless it is too stale or has zero reward variance; True if kept."""
        if self.max_staleness is not None and current_version - group.version > self.max_staleness:
            self.stale += 1
            self.settled.append((group, "stale"))
            return False
        self.drawn += 1
        self.all_rewards.extend(group.rewards_G.tolist())
        self.domain_rewards.setdefault(group.domain, []).extend(group.rewards_G.tolist())
        self.lengths.extend(len(c.tokens) for c in group.completions)
        self.interrupted.extend(
            c.interrupted for c in group.completions if c.sampled is not None and c.episode is None
        )
        self.episodes.extend(c.episode for c in group.completions if c.episode is not None)
        if self.full:
            self.settled.append((group, "full"))
            return False
        if self.zero_variance_filter and group.zero_variance:
            self.filtered += 1
            self.settled.append((group, "filtered"))
            return False
        self.kept.append(group)
        self.settled.append((group, "trained"))
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
        if self.interrupted:  # budget forcing on (`rollout.interrupt`)
            out["rollout/interrupted_fraction"] = float(np.mean(self.interrupted))
        if self.episodes:  # a multi-turn environment (`env.name`)
            from rlvr_jax.envs.episode import episode_metrics

            out.update(episode_metrics(self.episodes))
        return out


def token_lag(completion: Any, version: int) -> list[int]:
    """Per token of `completion`: the most policy versions between `version` (the learner's)
    and the params that computed its context (prompt prefill, earlier tokens, itself: a KV
    cache kept across an update is older context); 0 = all the learner's own."""
    versions = np.asarray(completion.policy_versions, np.int64)
    oldest, newest = np.minimum.accumulate(versions), np.maximum.accumulate(versions)
    if completion.prompt_version is not None:
        oldest = np.minimum(oldest, completion.prompt_version)
        newest = np.maximum(newest, completion.prompt_version)
    return np.maximum(version - oldest, newest - version).astype(int).tolist()


def build_batch(
    groups: Sequence[ScoredGroup],
    settings: losses.LossSettings,
    *,
    rows: int,
    seq_len: int,
    pad_id: int,
    overlong_filter: bool = False,
    max_tokens: int = 0,
    updates: int = 1,
    row_multiple: int = 1,
    version: int | None = None,
    shared_row_len: int = 0,
    completion_len: int = 0,
    pack_groups: bool = False,
) -> tuple[RLBatch, np.ndarray]:
    """The learner batch of the kept `groups` (numpy) and each completion's slot in it, each
    completion with its group's advantage (`settings.advantage` over the rewards [P, G]),
    overlong ones masked when asked. Laid out one per row, packed to `max_tokens` per
    micro-batch (`batch.collate_packed`), or with `shared_row_len` each prompt once
    (`batch.collate_shared`, slots of `completion_len`, `pack_groups`). The advantages are 0
    here when the learner makes them: `loss.kl_mode: reward` (they need its log-probs) and PPO
    (its critic reads `rewards_BxT`). `version`: what `lag_BxT` counts from (None: no lag)."""
    sizes = {len(g.rewards_G) for g in groups}
    if len(sizes) > 1:
        raise ValueError(f"groups of different sizes {sorted(sizes)} in one batch")
    adv_N = np.zeros(0, np.float32)
    if groups and settings.reward_kl_coef == 0 and not settings.uses_critic:
        rewards_PxG = np.stack([g.rewards_G for g in groups])
        adv_N = np.asarray(losses.advantages(settings.advantage, rewards_PxG)).reshape(-1)
    samples = [
        Sample(
            prompt_tokens=g.prompt_tokens,
            tokens=list(c.tokens),
            sampler_logp=list(c.logprobs),
            advantage=float(adv_N[i * len(g.completions) + j]) if adv_N.size else 0.0,
            train=not (overlong_filter and c.finish_reason == "length"),
            reward=float(g.rewards_G[j]),
            sampled=c.sampled,
            lag=None if version is None else token_lag(c, version),
        )
        for i, g in enumerate(groups)
        for j, c in enumerate(g.completions)
    ]
    if shared_row_len:
        batch, slots = collate_shared(
            samples,
            group_size=len(groups[0].completions),
            rows=rows,
            row_len=shared_row_len,
            pad_id=pad_id,
            max_tokens=max_tokens,
            updates=updates,
            row_multiple=row_multiple,
            slot_len=completion_len,
            pack=pack_groups,
        )
    elif max_tokens:
        batch, slots = collate_packed(
            samples,
            rows=rows,
            seq_len=seq_len,
            pad_id=pad_id,
            max_tokens=max_tokens,
            updates=updates,
            row_multiple=row_multiple,
        )
    else:
        batch = collate(samples, rows=rows, seq_len=seq_len, pad_id=pad_id)
        slots = np.arange(len(samples))
    # only PPO's GAE reads per-token rewards (on the learner, with the critic's values)
    return (batch if settings.uses_critic else batch.replace(rewards_BxT=None)), slots


def rewards_N(groups: Sequence[ScoredGroup]) -> np.ndarray:
    """The rewards of the batch's completions, in row order."""
    return np.asarray([r for g in groups for r in g.rewards_G.tolist()], np.float32)
