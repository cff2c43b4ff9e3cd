"""Parent side of the code sandbox: start the launcher, feed it a spec, read its frames, clean up.

`run_sandboxed(program, requests)` runs an untrusted Python program against test requests (no
expected values; see `harness.py` for their kinds) in a separate launcher process and returns
one `TestOutcome` per request. The launcher (`launcher.py`) isolates itself in new namespaces
(strict) or only under resource limits (weak, explicit opt-in); strict isolation that cannot be
set up raises `SandboxUnavailableError` rather than silently running the program unconfined.

The result channel is the launcher's stdout, which only the harness writes to; every frame
starts with a random per-run token and is read with a size cap and a deadline. When the call
ends, for whatever reason, the launcher's whole process group is SIGKILLed; in strict mode that
takes PID 1 of the sandbox's PID namespace, and with it every process inside.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

Isolation = Literal["strict", "weak"]
ISOLATION_MODES: tuple[str, ...] = ("strict", "weak")

SANDBOX_UID_BASE = 1_000_000
"""A root launcher drops to uid = gid = SANDBOX_UID_BASE + its pid (unique while it runs)."""

LAUNCHER = Path(__file__).with_name("launcher.py")

_LOG = logging.getLogger(__name__)
_STARTUP_S = 10.0
_CLEANUP_S = 2.5
_STDERR_CAP = 64 << 10
_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
}


class SandboxUnavailableError(RuntimeError):
    """The requested isolation cannot be set up on this machine."""


class SandboxError(RuntimeError):
    """The sandbox machinery failed (not the program under test)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    timeout_s: float = 2.0
    """Wall-clock limit per test (the CPU-time limit is this, rounded up, plus one second)."""
    memory_mb: int = 1024
    """Address-space limit of every process of the program (RLIMIT_AS)."""
    max_processes: int = 32
    """Processes and threads the sandbox uid may hold at once, harness included (RLIMIT_NPROC)."""
    max_output_bytes: int = 1 << 20
    """Captured stdout (and result size) per test; a test that writes more is killed and fails."""
    max_file_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    max_open_files: int = 64
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    tmpfs_mb: int = 64
    """Size of the private writable /tmp (strict isolation), shared with /dev/shm."""

    def __post_init__(self) -> None:
        minimums = {
            "timeout_s": 0.01,
            "memory_mb": 64,
            "max_processes": 4,
            "max_output_bytes": 1,
            "max_file_mb": 1,
            "max_open_files": 16,
            "tmpfs_mb": 1,
        }
        for name, value in asdict(self).items():
            minimum = minimums[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
                raise ValueError(
                    f"SandboxLimits.{name} must be a number >= {minimum}, got {value!r}"
                )
            if name != "timeout_s" and not isinstance(value, int):
                raise ValueError(f"SandboxLimits.{name} must be an integer, got {value!r}")


@dataclass(frozen=True)
class TestOutcome:
    """What one test request produced inside the sandbox."""

    __test__ = False  # not a pytest class

    status: str
    """"ok", "error" (exception or non-zero exit), "timeout", "output_limit", "crashed" (died
    before reporting) or "missing" (the sandbox ended before the test ran)."""
    stdout: str = ""
    """Captured standard output (stdio requests only)."""
    values: tuple[str, ...] = ()
    """Canonical JSON of the returned or evaluated values (call and eval requests)."""
    exit_code: int | None = None
    """Exit status of the test process; negative: killed by that signal."""
    detail: str = ""
    """Exception type and message, or why the test process ended."""


def run_sandboxed(
    program: str,
    requests: Sequence[Mapping[str, Any]],
    *,
    limits: SandboxLimits | None = None,
    isolation: Isolation = "strict",
) -> list[TestOutcome]:
    """Runs `program` once per request inside the sandbox; returns one outcome per request."""
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailableError(f"the code sandbox needs Linux, not {sys.platform}")
    if not isinstance(program, str):
        raise TypeError(f"program must be a str, got {type(program).__name__}")
    limits = limits or SandboxLimits()
    token = secrets.token_hex(16)
    workdir = tempfile.mkdtemp(prefix="rlvr_sandbox_") if isolation == "weak" else None
    spec = {
        "token": token,
        "parent_pid": os.getpid(),
        "isolation": isolation,
        "uid_base": SANDBOX_UID_BASE,
        "workdir": workdir,
        "limits": asdict(limits),
        "program": program,
        "tests": [dict(request) for request in requests],
    }
    n_tests = len(spec["tests"])
    deadline_s = _STARTUP_S + n_tests * (limits.timeout_s + _CLEANUP_S)
    output_cap = n_tests * (6 * limits.max_output_bytes + (64 << 10)) + (1 << 20)
    try:
        stdout, stderr, exit_code = _launch(json.dumps(spec).encode(), deadline_s, output_cap)
    finally:
        if workdir is not None:
            _remove_tree(workdir)
    return collect_outcomes(parse_frames(stdout, token), n_tests, isolation, exit_code, stderr)


def _launch(payload: bytes, deadline_s: float, output_cap: int) -> tuple[bytes, bytes, int]:
    """Starts the launcher, sends the spec and reads its output under caps; kills the group."""
    command = [sys.executable, "-S", "-s", "-P", str(LAUNCHER)]
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_ENV,
        cwd="/",
        start_new_session=True,
    )
    try:
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the launcher died early; its stderr says why
        deadline = time.monotonic() + deadline_s
        stdout, stderr = _read_until(proc, deadline, {"stdout": output_cap, "stderr": _STDERR_CAP})
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # before wait(): the group id cannot be reused yet
        proc.wait()
    return stdout, stderr, proc.returncode


def _read_until(
    proc: subprocess.Popen, deadline: float, caps: Mapping[str, int]
) -> tuple[bytes, bytes]:
    """Reads the launcher's stdout and stderr until both close, the deadline passes or one
    exceeds its cap (then reading stops: the caller kills the launcher)."""
    streams = {"stdout": proc.stdout, "stderr": proc.stderr}
    data = {name: bytearray() for name in streams}
    with selectors.DefaultSelector() as selector:
        for name, stream in streams.items():
            selector.register(stream, selectors.EVENT_READ, name)
        over_cap = False
        while selector.get_map() and not over_cap:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fileobj.fileno(), 1 << 16)
                data[key.data] += chunk
                over_cap = over_cap or len(data[key.data]) > caps[key.data]
                if not chunk:
                    selector.unregister(key.fileobj)
    return bytes(data["stdout"]), bytes(data["stderr"])


def parse_frames(data: bytes, token: str) -> list[dict[str, Any]]:
    """The JSON objects of the lines that start with `token` (anything else is ignored)."""
    prefix = token + " "
    frames = []
    for line in data.decode("utf-8", "replace").splitlines():
        if not line.startswith(prefix):
            continue
        try:
            frame = json.loads(line[len(prefix) :])
        except ValueError:
            continue
        if isinstance(frame, dict):
            frames.append(frame)
    return frames


def collect_outcomes(
    frames: Sequence[Mapping[str, Any]],
    n_tests: int,
    isolation: str,
    exit_code: int,
    stderr: bytes,
) -> list[TestOutcome]:
    """One outcome per test from the harness's frames; raises when the sandbox never started."""
    for frame in frames:
        if "setup_error" in frame:
            hint = (
                " Pass isolation='weak' to run with resource limits only."
                if isolation == "strict"
                else ""
            )
            raise SandboxUnavailableError(
                f"{isolation} sandbox isolation is unavailable: {frame['setup_error']}.{hint}"
            )
    if not any(frame.get("ready") is True for frame in frames):
        tail = stderr.decode("utf-8", "replace")[-2000:]
        raise SandboxError(f"the sandbox launcher failed (exit status {exit_code}): {tail}")
    if not any(frame.get("done") is True for frame in frames):
        _LOG.warning(
            "the %s sandbox ended early (exit status %s); unfinished tests fail. stderr: %s",
            isolation,
            exit_code,
            stderr.decode("utf-8", "replace")[-2000:],
        )
    outcomes = [
        TestOutcome("missing", detail="the sandbox ended before this test reported")
    ] * n_tests
    for frame in frames:
        index = frame.get("index")
        if isinstance(index, int) and 0 <= index < n_tests:
            outcomes[index] = TestOutcome(
                status=str(frame.get("status")),
                stdout=str(frame.get("stdout", "")),
                values=tuple(str(value) for value in frame.get("values", ())),
                exit_code=frame.get("exit_code"),
                detail=str(frame.get("detail", "")),
            )
    return outcomes


def _remove_tree(path: str) -> None:
    """Removes a weak-mode work dir, whatever permissions the program left on its contents."""

    def make_writable(function: Any, failed_path: str, _exc_info: Any) -> None:
        os.chmod(os.path.dirname(failed_path), 0o700)
        if os.path.isdir(failed_path) and not os.path.islink(failed_path):
            os.chmod(failed_path, 0o700)
        function(failed_path)

    shutil.rmtree(path, onerror=make_writable)
