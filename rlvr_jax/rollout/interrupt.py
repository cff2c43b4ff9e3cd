"""Budget forcing (ScaleRL's interruptions; s1's "budget forcing"): a completion that has
generated `budget` tokens without stopping gets `tokens` (e.g. "</think> Okay, time to
answer.") appended, then may generate `answer_budget` more.

The insertion happens on the device inside the decode loop (`core._decode_one`): for the
steps where a slot's generated count is in [budget, budget + len(tokens)), the step feeds
and emits the forced token instead of the sampled one, so the inserted tokens enter the KV
cache exactly as generated ones do — no recompute, in either KV layout, and a preempted
sequence resumed at any point continues identically (forcing is a function of the count).

The inserted tokens are not sampled: `Completion.sampled` marks them False (their log-prob
is reported as 0), the learner masks them out of the loss and of the log-prob / TIS
statistics (`training.batch.Sample.sampled`), and they are part of the completion's text
(reward, samples log). Config: `rollout.interrupt`; metric `rollout/interrupted_fraction`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from rlvr_jax.rollout.requests import RequestError

if TYPE_CHECKING:
    from rlvr_jax.config.schema import InterruptConfig


REPLAY = -2
"""The `budget` of a `Replay` (`DecodeState.budget_B`; -1 = no forcing)."""


@dataclasses.dataclass(frozen=True)
class Replay:
    """Teacher forcing through the decode step: the slot feeds `tokens` (a completion sampled
    before) instead of drawing, and reports each one's log-prob as sampling does — the
    re-score that computes exactly what the sampler computed (`rlvr_jax.rollout.rescore`).
    Rides on budget forcing's device arrays (`budget` = `REPLAY`)."""

    tokens: tuple[int, ...]
    budget: int = REPLAY

    def max_new_tokens(self, max_new_tokens: int) -> int:
        """The slot's budget: the replayed tokens (RequestError past `max_new_tokens`)."""
        if not 0 < len(self.tokens) <= max_new_tokens:
            raise RequestError(
                f"a replay of {len(self.tokens)} tokens needs 1..max_new_tokens={max_new_tokens}"
            )
        return len(self.tokens)

    def sampled(self, n_tokens: int) -> None:
        """Replayed tokens count as sampled (no flags)."""
        del n_tokens


@dataclasses.dataclass(frozen=True)
class Interrupt:
    """One request's budget forcing."""

    budget: int
    """Generated tokens after which `tokens` are forced (the thinking budget)."""
    tokens: tuple[int, ...]
    """The inserted token ids."""
    answer_budget: int
    """Tokens the completion may generate after the inserted ones."""

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise RequestError(f"interrupt budget must be >= 1, got {self.budget}")
        if not self.tokens:
            raise RequestError("interrupt tokens must not be empty")
        if self.answer_budget < 1:
            raise RequestError(f"interrupt answer_budget must be >= 1, got {self.answer_budget}")

    @property
    def total(self) -> int:
        """Most tokens an interrupted completion holds: budget + inserted + answer."""
        return self.budget + len(self.tokens) + self.answer_budget

    def max_new_tokens(self, max_new_tokens: int) -> int:
        """The slot's generation budget for a request of `max_new_tokens`: `total`, which
        must fit in it (RequestError otherwise)."""
        if self.total > max_new_tokens:
            raise RequestError(
                f"budget forcing needs {self.budget} thinking + {len(self.tokens)} inserted + "
                f"{self.answer_budget} answer = {self.total} tokens, more than "
                f"max_new_tokens={max_new_tokens}"
            )
        return self.total

    def sampled(self, n_tokens: int) -> list[bool]:
        """Per-token flags of a completion of `n_tokens`: False on the inserted tokens."""
        end = self.budget + len(self.tokens)
        return [not self.budget <= i < end for i in range(n_tokens)]


def from_config(
    section: InterruptConfig, tokenizer: Any, *, max_new_tokens: int
) -> Interrupt | None:
    """The `rollout.interrupt` config section as an `Interrupt` (None when off), its text
    tokenized without special tokens. Raises ValueError naming the keys when it does not fit
    `rollout.max_new_tokens`."""
    if section.thinking_budget == 0:
        return None
    tokens = tuple(int(t) for t in tokenizer.encode(section.text, add_special_tokens=False))
    if not tokens:
        raise ValueError(f"rollout.interrupt.text {section.text!r} tokenizes to no tokens")
    interrupt = Interrupt(section.thinking_budget, tokens, section.answer_budget)
    if interrupt.total > max_new_tokens:
        raise ValueError(
            f"rollout.interrupt: thinking_budget={section.thinking_budget} + "
            f"{len(tokens)} tokens of text + answer_budget={section.answer_budget} = "
            f"{interrupt.total} exceeds rollout.max_new_tokens={max_new_tokens}"
        )
    return interrupt
