"""Importing google-jetstream 0.2.2 (the only release, May 2024) on current JAX, once per process:
TensorFlow first, accelerators hidden from it (JetStream's tokenizer utilities pull it in);
`jax.tree_map` restored for the orchestrator's `delete_pytree`; the root logger's level and
handlers, which importing the orchestrator changes, restored; and `JetThread`, which SIGKILLs
the process when a thread raises, replaced by `SurfacingThread`: the error is logged, kept
(`thread_errors()`) and handed to the `on_thread_error` callbacks (the server exits non-zero)."""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax

logger = logging.getLogger(__name__)

_errors: list[tuple[str, BaseException]] = []
_callbacks: list[Callable[[threading.Thread, BaseException], None]] = []
_lock = threading.Lock()


class SurfacingThread(threading.Thread):
    """A thread whose uncaught exception is recorded and reported instead of killing the process.
    `owner` is the object whose method it runs (the orchestrator's `Driver`)."""

    def __init__(self, *args: Any, target: Callable | None = None, **kwargs: Any):
        super().__init__(*args, target=target, **kwargs)
        func = target.func if isinstance(target, functools.partial) else target
        self.owner = func.__self__ if inspect.ismethod(func) else None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as e:
            logger.error(
                "JetStream thread %s failed:\n%s", self.name, "".join(traceback.format_exception(e))
            )
            with _lock:
                _errors.append((self.name, e))
                callbacks = list(_callbacks)
            for callback in callbacks:
                callback(self, e)


def owner_of(thread: threading.Thread) -> Any:
    """The object a `SurfacingThread` serves (its Driver), or None."""
    return thread.owner if isinstance(thread, SurfacingThread) else None


def thread_errors() -> list[tuple[str, BaseException]]:
    """(thread name, exception) of every JetStream thread that has failed so far."""
    with _lock:
        return list(_errors)


def on_thread_error(
    callback: Callable[[threading.Thread, BaseException], None],
) -> Callable[[], None]:
    """Calls `callback(thread, exception)` when a JetStream thread fails (`thread.owner` is
    its Driver); returns a function that unregisters it."""
    with _lock:
        _callbacks.append(callback)

    def remove() -> None:
        with _lock:
            if callback in _callbacks:
                _callbacks.remove(callback)

    return remove


@functools.cache
def engine_api() -> ModuleType:
    """`jetstream.engine.engine_api`, imported behind the shim (ImportError naming the
    alternative without JetStream or TensorFlow)."""
    from rlvr_jax.data.tf_utils import import_tensorflow

    try:
        import_tensorflow()
        if not hasattr(jax, "tree_map"):
            jax.tree_map = jax.tree.map
        from jetstream.engine import engine_api as api
    except ImportError as e:
        raise ImportError(
            f"the JetStream adapter needs google-jetstream==0.2.2 and TensorFlow ({e}); "
            "without them use rlvr_jax.rollout.EngineCore (plain JAX)"
        ) from e
    return api


@functools.cache
def orchestrator() -> ModuleType:
    """`jetstream.core.orchestrator`, imported behind the shim (JetThread replaced)."""
    engine_api()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    from jetstream.core import orchestrator as orch

    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    orch.JetThread = SurfacingThread
    return orch


@functools.cache
def server_lib() -> ModuleType:
    """`jetstream.core.server_lib` (gRPC server), imported behind the shim."""
    orchestrator()
    from jetstream.core import server_lib as lib

    return lib
