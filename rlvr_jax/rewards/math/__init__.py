"""Math verifier: is the final answer of a response equal to the gold answer? 1.0 or 0.0.

    verify(response, gold, *, timeout_s=5.0, fallback="last_number") -> float
    reward(response, ground_truth, **verifier_kwargs) -> float   (the registry entry "math")

Pipeline: `extract` the final answer (after dropping `<think>` blocks), `normalize` both sides,
decide inline when a fast path can (`quick`: equal strings, plain numbers compared exactly,
multiple-choice letters), else compare symbolically (`parse` → SymPy, `compare`) in a killable
worker process under `timeout_s` (a timeout scores 0). Model text is never evaluated: `parse`
is a whitelist grammar with size limits. Importing this module does not import SymPy.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlvr_jax.rewards.math.extract import Fallback, extract_answer, last_boxed
from rlvr_jax.rewards.math.quick import quick_match
from rlvr_jax.rewards.timeout import run_bounded

__all__ = ["extract_answer", "reward", "verify"]

_SYMBOLIC_TARGET = "rlvr_jax.rewards.math.compare:symbolic_match_any"
MAX_ANSWER_CHARS = 10_000
"""An extracted answer longer than this is not an answer (scores 0 without normalising)."""


def _gold_answers(gold: str | Sequence[str]) -> tuple[str, ...]:
    """Gold as a tuple of accepted answers; a boxed gold solution is reduced to its answer."""
    golds = (gold,) if isinstance(gold, str) else gold
    if not isinstance(golds, Sequence) or not golds:
        raise ValueError(f"math ground truth must be a string or a list of strings, got {gold!r}")
    out = []
    for g in golds:
        if not isinstance(g, str) or not g.strip():
            raise ValueError(f"math ground truth must be non-empty strings, got {g!r}")
        boxed = last_boxed(g)
        out.append(boxed if boxed is not None else g)
    return tuple(out)


def verify(
    response: str,
    gold: str | Sequence[str],
    *,
    timeout_s: float = 5.0,
    fallback: Fallback = "last_number",
) -> float:
    """1.0 if the response's final answer equals `gold` (or any of a list of golds), else 0.0.

    Args:
      response: the model's completion text.
      gold: the reference answer (a string; a `\\boxed{}` in it is extracted), or a list of
        accepted answers.
      timeout_s: hard limit on the symbolic comparison; exceeding it scores 0.
      fallback: answer when no boxed / tagged / "final answer" is found: "last_number" (the
        last number in the text) or "none" (no answer, 0).
    Raises:
      ValueError: malformed gold (not a non-empty string or list of them) or bad arguments.
    """
    golds = _gold_answers(gold)
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if not isinstance(response, str):
        return 0.0
    answer = extract_answer(response, fallback=fallback)
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return 0.0
    pending = []
    for g in golds:
        decided = quick_match(answer, g)
        if decided:
            return 1.0
        if decided is None:
            pending.append(g)
    if not pending:
        return 0.0
    result = run_bounded(_SYMBOLIC_TARGET, (answer, tuple(pending)), timeout_s=timeout_s)
    return 1.0 if result.ok and result.value is True else 0.0


def reward(response: str, ground_truth: str | Sequence[str], **verifier_kwargs) -> float:
    """Registry entry "math": `verify(response, ground_truth, **verifier_kwargs)`.

    verifier_kwargs: `timeout_s`, `fallback` (see `verify`).
    """
    return verify(response, ground_truth, **verifier_kwargs)
