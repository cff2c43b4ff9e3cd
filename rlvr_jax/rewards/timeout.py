"""Hard, killable time limits for verifier calls: a pool of long-lived worker processes.

A signal alarm cannot interrupt SymPy inside a C loop and does not work off the main thread, so
every bounded call runs in a worker process; on timeout the parent SIGKILLs the worker's process
group and starts a fresh one, so a hung verifier costs one call, never the caller.

Workers are fresh interpreters (`subprocess` fork+exec: safe with JAX threads in the parent,
and unlike `multiprocessing`'s spawn they do not re-import the caller's `__main__`), each in its
own session, exiting when the parent dies. `target` is a "module:function" string resolved in
the worker, so it need not be picklable. Code already inside a worker (`in_worker()`) calls
targets directly: the outer call is already bounded.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import queue
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Literal

Status = Literal["ok", "timeout", "error"]

_STARTUP_TIMEOUT_S = 120.0
"""How long a fresh worker may take to import its preload modules before it counts as broken."""

_PARENT_POLL_S = 1.0
"""How often a worker checks that its parent is still alive."""

WORKER_MEMORY_MB = 4096
"""Address-space limit of the verifier workers made by this package (shared pool, service)."""

_IN_WORKER = False
"""True inside a pool worker process (set by `worker_main`)."""


@dataclass(frozen=True)
class CallResult:
    """Outcome of one bounded call."""

    status: Status
    """"ok" (`value` holds the return value), "timeout" (the worker was killed) or "error"."""
    value: Any = None
    error: str = ""
    """A one-line description of the failure ("" when ok)."""
    elapsed_s: float = 0.0
    """Wall time of the call inside its worker (sending to receiving)."""

    @property
    def ok(self) -> bool:
        """True when the target returned normally."""
        return self.status == "ok"


def in_worker() -> bool:
    """True when running inside a `WorkerPool` worker process."""
    return _IN_WORKER


def default_workers() -> int:
    """Worker count sized to the machine: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def resolve_target(target: str) -> Callable[..., Any]:
    """Imports "package.module:function" (the function part may be dotted) and returns it."""
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"target {target!r} is not of the form 'module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"target {target!r}: cannot import module {module_name!r}: {e}") from e
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"target {target!r}: {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"target {target!r} is not callable")
    return obj


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" at {last[0].filename}:{last[0].lineno}" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"[:2000]


def _exit_when_orphaned(parent_pid: int) -> None:
    """Daemon thread of a worker: hard-exits once the parent process is gone."""
    while os.getppid() == parent_pid:
        time.sleep(_PARENT_POLL_S)
    os._exit(1)


def worker_main() -> None:
    """Worker process entry (`python -c ...` with argv [fd, parent pid, options JSON]).

    Loop: receive (target, args, kwargs), reply ("ok", value) or ("error", message)."""
    global _IN_WORKER
    _IN_WORKER = True
    fd, parent_pid, options = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    if options["memory_mb"]:  # soft limit only: a verifier's own children may raise it again
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (options["memory_mb"] << 20, hard))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    conn = Connection(fd)
    for name in options["preload"]:
        importlib.import_module(name)
    conn.send(("ready", os.getpid()))
    cache: dict[str, Callable[..., Any]] = {}
    while True:
        try:
            target, args, kwargs = conn.recv()
        except (EOFError, OSError):
            return  # the parent closed the socket or died
        try:
            fn = cache.get(target) or cache.setdefault(target, resolve_target(target))
            reply: tuple[str, Any] = ("ok", fn(*args, **kwargs))
        except Exception as e:
            reply = ("error", _describe(e))
        try:
            conn.send(reply)
        except Exception as e:  # e.g. an unpicklable return value
            conn.send(("error", f"cannot send the result back: {_describe(e)}"))


_WORKER_CODE = "from rlvr_jax.rewards.timeout import worker_main; worker_main()"


class _Worker:
    """One worker process and the parent's end of its socket."""

    def __init__(self, preload: Sequence[str], memory_mb: int | None):
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            argv = [sys.executable, "-c", _WORKER_CODE, str(theirs.fileno()), str(os.getpid())]
            self.process = subprocess.Popen(
                [*argv, json.dumps({"preload": list(preload), "memory_mb": memory_mb or 0})],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # own process group: a timeout kills it and its children
            )
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.ready = False

    def wait_ready(self, timeout_s: float) -> str | None:
        """Blocks until the worker has imported its preload modules; returns an error or None."""
        if self.ready:
            return None
        try:
            if self.conn.poll(timeout_s):
                tag, payload = self.conn.recv()
                self.ready = tag == "ready"
                return None if self.ready else f"worker sent {tag!r} before ready: {payload}"
            return f"worker did not start within {timeout_s:.0f}s"
        except (EOFError, OSError):
            return f"worker died while starting (exit code {self.process.wait(5.0)})"

    def kill(self) -> None:
        """SIGKILLs the worker's process group (the worker and its children) and reaps it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        try:
            self.process.kill()
            self.process.wait(5.0)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        self.conn.close()


class WorkerPool:
    """A fixed number of long-lived worker processes running "module:function" targets.

    `call` is thread-safe: up to `num_workers` calls run at once, more wait for a free worker.
    A call that exceeds its timeout, or whose worker dies, gets its worker killed and replaced.
    """

    def __init__(
        self,
        num_workers: int | None = None,
        *,
        preload: Sequence[str] = (),
        memory_mb: int | None = None,
    ):
        """Starts `num_workers` workers (None = `default_workers()`) without waiting for them.
        Each imports the `preload` modules before its first call (so SymPy's import time never
        counts against a timeout) and runs under an address-space limit of `memory_mb` (a
        call exceeding it fails with MemoryError; None = unlimited)."""
        n = default_workers() if num_workers is None else int(num_workers)
        if n < 1:
            raise ValueError(f"WorkerPool needs num_workers >= 1, got {num_workers}")
        if memory_mb is not None and memory_mb < 64:
            raise ValueError(f"memory_mb must be >= 64 (or None), got {memory_mb}")
        self._preload = tuple(preload)
        self._memory_mb = memory_mb
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        self._all: list[_Worker] = []
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self.num_workers = n
        self.timeouts = 0
        """Calls that ran out of time (their worker was killed)."""
        for _ in range(n):
            self._idle.put(self._spawn())
        _LIVE_POOLS.add(self)

    def _spawn(self) -> _Worker:
        worker = _Worker(self._preload, self._memory_mb)
        with self._lock:
            self._all.append(worker)
        return worker

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        with self._lock:
            if worker in self._all:
                self._all.remove(worker)
            closed = self._closed
        return worker if closed else self._spawn()

    def call(
        self,
        target: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        timeout_s: float,
    ) -> CallResult:
        """Runs `target(*args, **kwargs)` in a worker, killed after `timeout_s` seconds.

        Never raises for a failing target: the failure comes back as a `CallResult`. The
        timeout counts from the moment the worker receives the call (not the wait for a free
        worker, nor a fresh worker's start-up).
        """
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if self._closed:
            raise RuntimeError("WorkerPool is closed")
        worker = self._idle.get()
        try:
            startup_error = worker.wait_ready(_STARTUP_TIMEOUT_S)
            if startup_error is not None:
                worker = self._replace(worker)
                return CallResult("error", error=startup_error)
            start = time.perf_counter()
            try:
                worker.conn.send((target, tuple(args), dict(kwargs or {})))
                if not worker.conn.poll(timeout_s):
                    self.timeouts += 1
                    worker = self._replace(worker)
                    elapsed = time.perf_counter() - start
                    return CallResult(
                        "timeout", error=f"timed out after {timeout_s:g}s", elapsed_s=elapsed
                    )
                tag, payload = worker.conn.recv()
            except (EOFError, OSError) as e:
                try:
                    code = worker.process.wait(1.0)
                except subprocess.TimeoutExpired:
                    code = None
                worker = self._replace(worker)
                return CallResult("error", error=f"worker died (exit code {code}): {e!r}")
            except Exception as e:  # arguments that cannot be pickled
                return CallResult("error", error=f"cannot send the call: {_describe(e)}")
            elapsed = time.perf_counter() - start
            if tag == "ok":
                return CallResult("ok", value=payload, elapsed_s=elapsed)
            return CallResult("error", error=str(payload), elapsed_s=elapsed)
        finally:
            self._idle.put(worker)

    @property
    def closed(self) -> bool:
        """Whether `close` was called (in this process)."""
        return self._closed

    def close(self) -> None:
        """Kills every worker (verifiers are stateless, so nothing is lost). Idempotent.

        In a process forked from the pool's owner it only marks the copy closed: the workers
        belong to the owner."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = list(self._all)
            self._all.clear()
        if os.getpid() == self._owner_pid:
            for worker in workers:
                worker.kill()
        _LIVE_POOLS.discard(self)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_LIVE_POOLS: set[WorkerPool] = set()
_SHARED: dict[int, WorkerPool] = {}
_SHARED_LOCK = threading.Lock()


def _close_all() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()


atexit.register(_close_all)


def shared_pool() -> WorkerPool:
    """The process-wide pool used by standalone `verify` calls (created on first use).

    Sized to the machine. A process forked after creation gets a pool of its own.
    """
    pid = os.getpid()
    with _SHARED_LOCK:
        pool = _SHARED.get(pid)
        if pool is None or pool.closed:
            pool = WorkerPool(
                preload=("rlvr_jax.rewards.math.compare",), memory_mb=WORKER_MEMORY_MB
            )
            _SHARED.clear()
            _SHARED[pid] = pool
        return pool


def run_bounded(
    target: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    timeout_s: float,
) -> CallResult:
    """Runs `target` under a hard timeout: in the shared pool, or inline inside a worker.

    Inside a worker the enclosing call is already bounded by its own timeout, so the target
    runs directly (exceptions become an "error" result, as in the pool).
    """
    if in_worker():
        start = time.perf_counter()
        try:
            value = resolve_target(target)(*args, **dict(kwargs or {}))
        except Exception as e:
            return CallResult("error", error=_describe(e))
        return CallResult("ok", value=value, elapsed_s=time.perf_counter() - start)
    return shared_pool().call(target, args, kwargs, timeout_s=timeout_s)
