"""The unbiased pass@k estimator (Chen et al. 2021; ALGORITHMS.md, Evaluation)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 − C(n−c, k)/C(n, k) from n samples with c correct, as 1 − Π_{j=n−c+1}^{n} (1 − k/j).

    Raises:
      ValueError: k < 1, k > n, or c outside [0, n].
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c={c} correct out of n={n} samples")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k={k} needs 1 <= k <= n={n}")
    if n - c < k:
        return 1.0
    j = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / j))


def mean_pass_at_k(correct_counts: Iterable[int], n: int, k: int) -> float:
    """pass@k averaged over problems, each with `n` samples and its count of correct ones."""
    counts = list(correct_counts)
    if not counts:
        raise ValueError("mean_pass_at_k: no problems")
    return float(np.mean([pass_at_k(n, c, k) for c in counts]))
