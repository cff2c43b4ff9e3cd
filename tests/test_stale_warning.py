"""Async runs warn once when the actors' work is mostly dropped as stale
(`rlvr_jax.training.algorithms.rl.stale_warning`, `RolloutSource._watch_staleness`)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from rlvr_jax.training.algorithms import rl


def test_the_warning_names_the_share_and_both_keys():
    assert rl.stale_warning(0, 0, max_staleness=1, queue_size=2) is None
    assert rl.stale_warning(2, 8, max_staleness=1, queue_size=2) is None  # 20%: not above
    msg = rl.stale_warning(22, 54, max_staleness=1, queue_size=2)
    assert msg is not None
    assert "22 of the 76 groups" in msg and "29%" in msg
    assert "rollout.max_staleness=1" in msg and "rollout.queue_size=2" in msg


def _watch(batches: list[tuple[int, int]], max_staleness: int, caplog) -> list[str]:
    """The warnings a source logs over batches of (stale, drawn) groups."""
    source = SimpleNamespace(max_staleness=max_staleness, queue_size=2, _stale_seen=[0, 0, 0])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlvr_jax.train"):
        for stale, drawn in batches:
            rl.RolloutSource._watch_staleness(source, SimpleNamespace(stale=stale, drawn=drawn))
    return [r.getMessage() for r in caplog.records]


def test_counted_after_the_batches_that_cannot_drop_and_warned_once(caplog):
    # max_staleness 1: batches 1-2 cannot drop anything; batches 3-7 are counted
    steady = [(4, 8)] * 5  # 20 of 60 dropped
    warned = _watch([(0, 12), (0, 12), *steady, *steady], 1, caplog)
    assert len(warned) == 1 and "20 of the 60 groups" in warned[0]
    # the same drops in the uncounted first batches and few after them: no warning
    assert _watch([(9, 3), (9, 3), *[(1, 8)] * 5], 1, caplog) == []
    # a larger bound starts counting later: the window is batches 4-8
    assert _watch([(0, 8), (0, 8), (0, 8), *steady], 2, caplog)[0].startswith("async: 20 of")
