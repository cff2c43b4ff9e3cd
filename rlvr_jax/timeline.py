"""Busy intervals of named activities, recorded from any thread, and their overlap.

The trainer records its updates ("train") and the rollout driver its decode chunks ("rollout")
when asked (`rlvr-bench e2e`); `overlap_fraction` is the share of the shorter activity that ran
while the longer was busy. Times are `time.perf_counter()` seconds.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence

Interval = tuple[float, float]


class Timeline:
    """Thread-safe recorder of intervals (`span`) and instants (`mark`) by name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[str, list[Interval]] = {}
        self._marks: dict[str, list[float]] = {}

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Records the time the `with` body takes as one interval of `name`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            with self._lock:
                self._spans.setdefault(name, []).append((start, end))

    def add(self, name: str, start: float, end: float) -> None:
        """Records [start, end] as one interval of `name` (e.g. measured by another thread)."""
        with self._lock:
            self._spans.setdefault(name, []).append((start, end))

    def mark(self, name: str) -> float:
        """Records the current instant under `name`; returns it."""
        now = time.perf_counter()
        with self._lock:
            self._marks.setdefault(name, []).append(now)
        return now

    def spans(self, name: str, window: Interval | None = None) -> list[Interval]:
        """The intervals of `name` in recording order, clipped to `window` when given."""
        with self._lock:
            spans = list(self._spans.get(name, ()))
        if window is None:
            return spans
        lo, hi = window
        return [(max(a, lo), min(b, hi)) for a, b in spans if min(b, hi) > max(a, lo)]

    def marks(self, name: str) -> list[float]:
        """The instants recorded under `name`, in order."""
        with self._lock:
            return list(self._marks.get(name, ()))


def merge(intervals: Sequence[Interval]) -> list[Interval]:
    """The union of `intervals` as sorted, disjoint intervals."""
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def busy(intervals: Sequence[Interval]) -> float:
    """Seconds covered by at least one interval (overlaps counted once)."""
    return sum(b - a for a, b in merge(intervals))


def overlap(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Seconds during which both `a` and `b` were busy."""
    x, y = merge(a), merge(b)
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0.0, hi - lo)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_fraction(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """The share of the shorter activity's busy time that the other was busy too (0 when
    either never ran)."""
    shorter = min(busy(a), busy(b))
    return overlap(a, b) / shorter if shorter > 0 else 0.0
