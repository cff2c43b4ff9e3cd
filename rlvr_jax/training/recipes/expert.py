"""Expert iteration's selection: keep the verified-correct sampled completions as SFT examples
(ALGORITHMS.md: "Expert iteration is SFT on the correct samples").

A completion is kept when its *verifier* score (`ScoredGroup.scores_G`) — before domain
weights, the format term and length penalties, which shape RL rewards but say nothing about
correctness — is at least `sft.expert_min_score`. It is trained on exactly as sampled (prompt
ids, then the completion ids with the stop token that ended it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlvr_jax.training.groups import ScoredGroup


def kept_mask(group: ScoredGroup, *, min_score: float) -> np.ndarray:
    """bool[G]: the completions of `group` kept as SFT examples (verifier score ≥ `min_score`
    and at least one token)."""
    if len(group.scores_G) != len(group.completions):
        raise ValueError(
            f"group of {len(group.completions)} completions has {len(group.scores_G)} scores"
        )
    lengths_G = np.array([len(c.tokens) for c in group.completions])
    return (np.asarray(group.scores_G) >= min_score) & (lengths_G > 0)


def expert_examples(
    groups: Sequence[ScoredGroup], *, min_score: float
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
