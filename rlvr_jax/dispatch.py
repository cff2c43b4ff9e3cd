"""One process-wide lock for dispatching device computations from several threads.

A computation over several devices is enqueued on each device in turn. When two threads
enqueue multi-device programs at the same time (the rollout driver and the learner sharing
devices, or an eval running beside them), devices can receive the programs in different
orders; programs with collectives then wait for each other forever (XLA CPU aborts after 40 s
in its rendezvous). Every thread that dispatches device work holds `LOCK` while it enqueues
(JAX returns right after enqueuing), and never while it waits for results; each device then
sees every program in one global order, and host work still overlaps.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

LOCK = threading.RLock()
"""Held while enqueuing device work from any thread of the trainer or the rollout driver."""

F = TypeVar("F", bound=Callable[..., Any])


def serialized(fn: F) -> F:
    """`fn` called under `LOCK` (for functions that only enqueue device work)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with LOCK:
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
