"""Console logging of every command: quiet by default, everything with `--verbose`.

By default the `rlvr_jax` loggers print INFO and up, the libraries (absl/orbax, JAX,
TensorFlow, JetStream, gRPC) warnings and errors only; `--verbose` or `log.log_level` lets
theirs through too. `quiet_native_import()` drops the lines TensorFlow's native code writes to
fd 2 on import (out of `TF_CPP_MIN_LOG_LEVEL`'s reach) unless verbose, replaying them on failure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

LOG_LEVELS = ("debug", "info", "warning", "error")
"""Values of `log.log_level` (the level of the libraries' own logs)."""

LIBRARY_LOGGERS = ("absl", "jax", "orbax", "jetstream", "tensorflow", "grpc", "transformers")
"""Loggers of the libraries whose INFO lines are off by default (JetStream logs on root)."""

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_NATIVE_LINE = re.compile(
    r"^([IWE]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]|"
    r"WARNING: All log messages before absl::InitializeLog\(\)|"
    r"To enable the following instructions:)"
)
_state = {"verbose": False}


def setup_logging(log_level: str = "warning", *, verbose: bool = False) -> None:
    """Configures the root handler once per process: `rlvr_jax` loggers at INFO (DEBUG for
    "debug"), library loggers at `log_level` ("info" when `verbose`; one of `LOG_LEVELS`)."""
    if log_level not in LOG_LEVELS:
        raise ValueError(f"log level {log_level!r}: choose one of {', '.join(LOG_LEVELS)}")
    if verbose and log_level in ("warning", "error"):
        log_level = "info"
    level = getattr(logging, log_level.upper())
    _state["verbose"] = level <= logging.INFO
    if not _state["verbose"]:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
    root.setLevel(level)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    logging.getLogger("rlvr_jax").setLevel(min(level, logging.INFO))
    with contextlib.suppress(ImportError):  # absl keeps its own verbosity as well
        from absl import logging as absl_logging

        absl_logging.set_verbosity(log_level)


def is_verbose() -> bool:
    """Whether library INFO logs are on (`setup_logging(verbose=True)` or level info/debug)."""
    return _state["verbose"]


@contextlib.contextmanager
def quiet_native_import() -> Iterator[None]:
    """Captures file descriptor 2 while a native library is imported; afterwards replays
    what it wrote except the library's own INFO/WARNING/ERROR log lines (all of it if the
    import raised or logging is verbose)."""
    if is_verbose():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines = capture.read().decode(errors="replace").splitlines(keepends=True)
            kept = [line for line in lines if failed or not _NATIVE_LINE.match(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
