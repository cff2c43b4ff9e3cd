"""One process-wide lock for dispatching device computations from several threads, and the
device turns of actors and learner that share their devices.

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


class DeviceTurns:
    """Whose turn it is on devices the actors and the learner share (`mesh.actor_devices: 0`).

    `LOCK` orders the enqueueing, but a decode chunk and a train step would still run at once
    and fight for the same cores (async on two CPU cores was 0.64x sync). A side holds its turn
    from dispatch until its work is done, so the driver decodes in the learner's host gaps; the
    learner has priority (the driver finishes its chunk and waits).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._learner_waiting = 0
        self._holder: str | None = None

    def acquire(self, side: str) -> None:
        """Blocks until `side` ("learner" or "actor") may use the devices."""
        with self._cond:
            if side == "learner":
                self._learner_waiting += 1
            try:
                while self._holder is not None or (side == "actor" and self._learner_waiting):
                    self._cond.wait()
            finally:
                if side == "learner":
                    self._learner_waiting -= 1
            self._holder = side

    def release(self) -> None:
        """Ends the holder's turn (may be called from another thread than `acquire`'s)."""
        with self._cond:
            self._holder = None
            self._cond.notify_all()

    def actor(self) -> _Turn:
        """`with turns.actor():` one decode chunk (dispatch and its results)."""
        return _Turn(self, "actor")


class _Turn:
    def __init__(self, turns: DeviceTurns, side: str) -> None:
        self.turns, self.side = turns, side

    def __enter__(self) -> None:
        self.turns.acquire(self.side)

    def __exit__(self, *exc: object) -> None:
        self.turns.release()
