"""Format reward and DAPO's soft overlong punishment: separate, additive reward terms.

`format_reward` checks the R1 layout `<think>reasoning</think><answer>answer</answer>`.
`soft_overlong_penalty` is DAPO's length term (ALGORITHMS.md), with limit L_max and buffer L_c:

    R(|o|) = 0                          if |o| <= L_max - L_c
           = ((L_max - L_c) - |o|) / L_c  if L_max - L_c < |o| <= L_max
           = -1                         if |o| > L_max
"""

from __future__ import annotations

import numpy as np

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)


def format_reward(response: str, *, think_in_prompt: bool = False) -> float:
    """1.0 if `response` is exactly `<think>R</think><answer>A</answer>`, else 0.0.

    R and A must be non-empty, each tag must appear exactly once and in that order, and only
    whitespace may surround the blocks. With `think_in_prompt=True` the prompt already ended
    with `<think>`, so the response must start inside the block: `R</think><answer>A</answer>`.
    Linear time (no backtracking regular expression).
    """
    if not isinstance(response, str):
        return 0.0
    text = THINK_OPEN + response if think_in_prompt else response
    if any(text.count(tag) != 1 for tag in _TAGS):
        return 0.0
    t_open, t_close = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    a_open, a_close = text.find(ANSWER_OPEN), text.find(ANSWER_CLOSE)
    if not t_open < t_close < a_open < a_close:
        return 0.0
    reasoning = text[t_open + len(THINK_OPEN) : t_close]
    answer = text[a_open + len(ANSWER_OPEN) : a_close]
    outside = text[:t_open] + text[t_close + len(THINK_CLOSE) : a_open]
    outside += text[a_close + len(ANSWER_CLOSE) :]
    if outside.strip() or not reasoning.strip() or not answer.strip():
        return 0.0
    return 1.0


def _check_limits(max_len: int, buffer: int) -> None:
    if int(max_len) != max_len or max_len <= 0:
        raise ValueError(f"max_len must be a positive integer, got {max_len}")
    if int(buffer) != buffer or not 0 <= buffer <= max_len:
        raise ValueError(f"buffer must be an integer in [0, max_len={max_len}], got {buffer}")


def soft_overlong_penalty(length: int, max_len: int, buffer: int) -> float:
    """DAPO soft overlong punishment of one response of `length` tokens (module docstring).

    `buffer` = 0 leaves only the hard step: 0 up to `max_len`, -1 beyond.
    """
    _check_limits(max_len, buffer)
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if length > max_len:
        return -1.0
    if length <= max_len - buffer:
        return 0.0
    return ((max_len - buffer) - length) / buffer


def soft_overlong_penalty_N(lengths_N: np.ndarray, max_len: int, buffer: int) -> np.ndarray:
    """`soft_overlong_penalty` of each of N lengths, as float32[N]."""
    _check_limits(max_len, buffer)
    lengths_N = np.asarray(lengths_N)
    if lengths_N.ndim != 1:
        raise ValueError(f"lengths must be a 1-D array, got shape {lengths_N.shape}")
    if lengths_N.size and lengths_N.min() < 0:
        raise ValueError(f"lengths must be >= 0, got min {lengths_N.min()}")
    lengths_N = lengths_N.astype(np.float64)
    ramp_N = ((max_len - buffer) - lengths_N) / max(buffer, 1)
    penalty_N = np.where(lengths_N <= max_len - buffer, 0.0, ramp_N)
    return np.where(lengths_N > max_len, -1.0, penalty_N).astype(np.float32)
