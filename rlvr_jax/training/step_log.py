"""What a step's logs say beyond its metrics: the records of `samples.jsonl` (`sample_records`)
and why a step trained nothing (`empty_reason`, logged by `EmptySteps`, which after
`EMPTY_STEPS_WARN` such steps in a row says what to try).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

log = logging.getLogger("rlvr_jax.train")

EMPTY_STEPS_WARN = 3
"""Steps in a row that train nothing before the run says what to try."""


def sample_records(settled: Sequence[tuple[Any, str]], tokenizer: Any, n: int) -> list[dict]:
    """Up to `n` records of `settled`'s non-stale completions, kept groups first, round-robin."""
    groups = [(g, o) for g, o in settled if o == "trained"]
    groups += [(g, o) for g, o in settled if o not in ("trained", "stale")]
    width = max((len(g.completions) for g, _ in groups), default=0)
    order = [(g, o, j) for j in range(width) for g, o in groups if j < len(g.completions)]
    out: list[dict] = []
    for g, outcome, j in order[: max(n, 0)]:
        c = g.completions[j]
        out.append(
            {
                "prompt": tokenizer.decode(g.prompt_tokens, skip_special_tokens=False),
                "completion": g.texts[j] if j < len(g.texts) else "",
                "reward": float(g.rewards_G[j]),
                "verifier_score": float(g.scores_G[j]),
                "ground_truth": g.row.ground_truth,
                "verifier": g.row.verifier,
                "domain": g.domain,
                "finish_reason": c.finish_reason,
                "group": outcome,
            }
        )
    return out


def empty_reason(
    settled: Sequence[tuple[Any, str]],
    service: Mapping[str, float],
    tokenizer: Any,
    *,
    max_new_tokens: int,
) -> str:
    """Why a batch of the groups `settled` ((ScoredGroup, outcome) pairs) kept none; `service`:
    the reward service's metrics over them (`rewards/errors`, `rewards/timeouts`)."""
    drawn = [g for g, o in settled if o != "stale"]
    stale = len(settled) - len(drawn)
    parts = [f"kept 0 of {len(settled)} groups"]
    equal = [g for g in drawn if g.zero_variance]
    if equal:
        values = collections.Counter(f"{float(g.rewards_G[0]):g}" for g in equal)
        by_value = ", ".join(f"{k} all {v}" for v, k in sorted(values.items()))
        parts.append(f"{len(equal)} had all-equal rewards ({by_value})")
    if stale:
        parts.append(f"{stale} were stale (older than rollout.max_staleness)")
    completions = [c for g in drawn for c in g.completions]
    if completions:
        cut = np.mean([c.finish_reason == "length" for c in completions])
        parts.append(f"{cut:.0%} of completions cut at rollout.max_new_tokens={max_new_tokens}")
        unread = _unreadable_math(drawn, tokenizer)
        if unread is not None:
            parts.append(f"{unread:.0%} of math completions give no answer the verifier can read")
    errors = int(service.get("rewards/errors", 0) + service.get("rewards/timeouts", 0))
    if errors:
        parts.append(f"{errors} verifier errors or timeouts (scored 0)")
    return "; ".join(parts)


def _unreadable_math(groups: Sequence[Any], tokenizer: Any) -> float | None:
    """The share of the math rows' completions with no answer `extract_answer` finds."""
    from rlvr_jax.envs.episode import answer_text
    from rlvr_jax.rewards.math.extract import extract_answer

    found = [
        extract_answer(
            answer_text(c, tokenizer), fallback=g.row.verifier_kwargs.get("fallback", "last_number")
        )
        is not None
        for g in groups
        if g.row.verifier == "math"
        for c in g.completions
    ]
    return None if not found else 1.0 - float(np.mean(found))


class EmptySteps:
    """Warns for each step that trained nothing; after `warn_after` in a row, what to try."""

    def __init__(self, warn_after: int = EMPTY_STEPS_WARN) -> None:
        self.warn_after = warn_after
        self.in_a_row = 0

    def record(self, step: int, trained: bool, why: str) -> None:
        if trained:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        log.warning("step %d trained nothing: %s", step, why or "its batch was empty")
        if self.in_a_row == self.warn_after:
            log.warning(
                "%d steps in a row trained nothing (samples.jsonl shows their completions): "
                "all rewards 0 means the policy solves none of the prompts (check the "
                "ground truths, the verifier and data.prompt_template, or start from a "
                "stronger policy); all rewards equal to the maximum means the prompts are "
                "too easy; completions cut at the budget need a larger rollout.max_new_tokens",
                self.in_a_row,
            )
