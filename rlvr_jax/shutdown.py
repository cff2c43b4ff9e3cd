"""SIGTERM / SIGINT for long-running commands: stop cleanly, and always within a bound.

`SignalStop(prog).install()` (main thread) makes the first SIGTERM or SIGINT
- set `stop.event` and print one line naming the signal (or what `stop.status` says),
- raise `Interrupted` in the main thread when `raise_in_main` (benchmarks: the work unwinds
  through its `finally` blocks),
- start a watchdog that ends the process with `os._exit(128 + signum)` if it is still alive
  `grace_s` seconds later (a thread stuck in native code or a queue cannot keep it alive; no
  watchdog with `grace_s=None`: the trainer finishes its step and checkpoints, however long),
and a second signal end the process at once. Not installed, it is a plain flag (`event`).

A watcher thread reads the interpreter's wakeup fd, so the event and watchdog do not wait for a
main thread stuck in native code (Python runs handlers between its bytecodes only).
`exit_now(code)` ends a finished console script without the interpreter's teardown of JAX,
TensorFlow and gRPC (seconds, and it can hang on their threads).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by the first SIGTERM/SIGINT (when `raise_in_main`)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalStop:
    """SIGTERM/SIGINT handling of the command `prog` (module docstring)."""

    def __init__(self, prog: str, *, grace_s: float | None = 8.0, raise_in_main: bool = False):
        self.prog = prog
        self.grace_s = grace_s
        self.raise_in_main = raise_in_main
        self.event = threading.Event()
        self.signum: int | None = None
        self.status: Callable[[int], str] | None = None
        """The signal's line after `prog`, of its number (default "<NAME> received, stopping")."""
        self._raised = False
        self._previous: dict[int, object] = {}
        self._wakeup: tuple[int, int] | None = None
        self._old_fd = -1

    def install(self) -> SignalStop:
        """Installs the handlers (none outside the main thread: a plain flag); returns self."""
        if threading.current_thread() is not threading.main_thread():
            return self
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._wakeup = (r, w)
        self._old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)
        watcher = threading.Thread(target=self._watch, name=f"{self.prog}-signals", daemon=True)
        watcher.start()
        return self

    def uninstall(self) -> None:
        """Restores the previous handlers (main thread)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._old_fd)
            os.close(self._wakeup[1])  # the watcher's read then ends
            self._wakeup = None

    @property
    def exit_code(self) -> int:
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM); 0 before any signal."""
        return 0 if self.signum is None else 128 + self.signum

    def _handler(self, signum: int, frame: object) -> None:
        # main thread, once it runs Python again; the watcher does the rest
        if self.signum is None:
            self.signum = signum
        self.event.set()
        if self.raise_in_main and not self._raised:
            self._raised = True
            raise Interrupted(signum)

    def _watch(self) -> None:
        assert self._wakeup is not None
        r, deliveries = self._wakeup[0], 0
        try:
            while True:
                data = os.read(r, 64)
                if not data:
                    return
                for signum in data:
                    if signum not in SIGNALS:
                        continue
                    deliveries += 1
                    name = signal.Signals(signum).name
                    if deliveries > 1:
                        _exit(f"{self.prog}: second {name}: exiting now", 128 + signum)
                    if self.signum is None:
                        self.signum = signum
                    self.event.set()
                    said = self.status(signum) if self.status else f"{name} received, stopping"
                    print(
                        f"{self.prog}: {said} (send it again to exit at once)",
                        file=sys.stderr,
                        flush=True,
                    )
                    if self.grace_s is not None:
                        late = f"interrupted by {name}, still running {self.grace_s:g} s later"
                        exit_within(self.grace_s, 128 + signum, f"{self.prog}: {late}")
        finally:
            os.close(r)


def exit_within(seconds: float, code: int, message: str = "") -> None:
    """Ends the process with `code` in `seconds` unless it has exited by then."""

    def watchdog() -> None:
        time.sleep(seconds)
        _exit(f"{message}; exiting now" if message else "", code)

    threading.Thread(target=watchdog, name="exit-watchdog", daemon=True).start()


def exit_now(code: int) -> NoReturn:
    """Flushes stdout/stderr and ends the process with `code`, skipping the interpreter's
    teardown (atexit handlers included): for console scripts once their work has stopped."""
    _exit("", code)


def _exit(message: str, code: int) -> NoReturn:
    if message:
        print(message, file=sys.stderr, flush=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
