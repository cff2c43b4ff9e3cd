"""Expert iteration's selection: verify each sampled completion and keep the verified-correct
ones as SFT examples (ALGORITHMS.md: "Expert iteration is SFT on the correct samples").

A completion is kept when its *verifier* score — before domain weights, the format term and
length penalties, which shape RL rewards but say nothing about correctness — is at least
`sft.expert_min_score`. It is trained on exactly as sampled (prompt ids, then the completion
ids with the stop token that ended it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlvr_jax.training import groups as grp


@dataclass
class VerifiedGroup(grp.ScoredGroup):
    """A scored group with the verifier score of each completion."""

    scores_G: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    """Verifier scores in [0, 1], by sample index."""


class _ScoreRecorder:
    """Forwards to a reward service and keeps the verifier scores of its last `score` call."""

    def __init__(self, service: Any) -> None:
        self._service = service
        self.verifier_scores_N = np.zeros(0, np.float32)

    def score(self, *args: Any, **kwargs: Any) -> Any:
        result = self._service.score(*args, **kwargs)
        self.verifier_scores_N = np.asarray(result.verifier_scores, np.float32)
        return result


def score_verified(
    groups: Sequence[tuple[Any, list[int], list[Any]]],
    service: Any,
    tokenizer: Any,
    *,
    max_len: int,
) -> tuple[list[VerifiedGroup], dict[str, float]]:
    """`groups.score_groups` (one reward-service call for all completions of the
    (row, prompt ids, completions) triples), keeping each completion's verifier score too."""
    recorder = _ScoreRecorder(service)
    scored, metrics = grp.score_groups(groups, recorder, tokenizer, max_len=max_len)
    ends = np.cumsum([len(g.completions) for g in scored])
    if scored and int(ends[-1]) != len(recorder.verifier_scores_N):
        raise RuntimeError(
            f"the reward service scored {len(recorder.verifier_scores_N)} completions "
            f"of {int(ends[-1])}"
        )
    verified = []
    for g, scores_G in zip(scored, np.split(recorder.verifier_scores_N, ends[:-1])):
        fields = {f.name: getattr(g, f.name) for f in dataclasses.fields(g)}
        verified.append(VerifiedGroup(**fields, scores_G=scores_G))
    return verified, metrics


def kept_mask(group: VerifiedGroup, *, min_score: float) -> np.ndarray:
    """bool[G]: the completions of `group` kept as SFT examples (verifier score ≥ `min_score`
    and at least one token)."""
    if len(group.scores_G) != len(group.completions):
        raise ValueError(
            f"group of {len(group.completions)} completions has {len(group.scores_G)} scores"
        )
    lengths_G = np.array([len(c.tokens) for c in group.completions])
    return (np.asarray(group.scores_G) >= min_score) & (lengths_G > 0)


def expert_examples(
    groups: Sequence[VerifiedGroup], *, min_score: float
) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, completion ids) of every kept completion (`kept_mask`), in (group,
    sample) order."""
    prompts, responses = [], []
    for g in groups:
        for completion, keep in zip(g.completions, kept_mask(g, min_score=min_score)):
            if keep:
                prompts.append(list(g.prompt_tokens))
                responses.append(list(completion.tokens))
    return prompts, responses


def expert_metrics(groups: Sequence[VerifiedGroup], *, min_score: float) -> dict[str, float]:
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
