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

import threading

LOCK = threading.RLock()
"""Held while enqueuing device work from any thread of the trainer or the rollout driver."""
