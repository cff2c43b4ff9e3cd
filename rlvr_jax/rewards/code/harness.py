"""The part of the sandbox that runs inside it: one forked child per test, results streamed out.

The harness itself never runs program code. For each test it forks a child that executes the
program (fresh state per test), evaluates the test's request, and reports on a private pipe;
the harness enforces the wall-clock deadline and the output cap, kills every process the test
left behind, and writes one frame per test to the result channel (a pipe only the harness
holds, prefixed with the run's random token). Requests carry no expected values: the sandbox
returns raw outputs and the parent decides pass/fail (see `cases.py`).

Request kinds (`request["kind"]`):
  "stdio": run the program as `__main__` with `request["stdin"]` on stdin; stdout is captured.
  "call":  call `request["name"]` with `args`/`kwargs`; the result comes back as canonical JSON.
  "eval":  evaluate each expression in `request["exprs"]` in the program's namespace.
  "exec":  run `request["source"]` (a rewritten assert) in the program's namespace.

Standard library only: imported by `launcher.py` as a bare module before privileges are dropped.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import math
import os
import resource
import select
import signal
import sys
import time
from typing import Any

import plain

_RESULT_FD = 3
_CHILD_FAILED = 70
_CLEANUP_S = 2.0
_POLL_IN = select.POLLIN | select.POLLHUP | select.POLLERR

# Captured before any program runs, so a program that rebinds the module attributes in its own
# process does not change what its child's epilogue calls.
_exit = os._exit
_dumps = json.dumps


def serve(spec: dict[str, Any], channel_fd: int, *, kill_all: bool) -> None:
    """Runs every test of `spec` and writes one frame per test to `channel_fd`.

    `kill_all`: after each test, end leftovers with kill(-1) (the sandbox runs under a uid or
    PID namespace of its own); otherwise kill the harness's descendants one by one (it is their
    subreaper).
    """
    token = spec["token"]
    limits = spec["limits"]
    builtins.exit = builtins.quit = sys.exit  # `-S` leaves these out; solutions call them
    send(channel_fd, token, {"ready": True})
    for index, request in enumerate(spec["tests"]):
        outcome = run_test(spec["program"], request, limits)
        end_leftovers(kill_all)
        send(channel_fd, token, {"index": index, **outcome})
    send(channel_fd, token, {"done": True})


def send(fd: int, token: str, message: dict[str, Any]) -> None:
    """Writes one `<token> <json>` line to the result channel."""
    _write_all(fd, f"{token} {_dumps(message)}\n".encode())


def run_test(program: str, request: dict[str, Any], limits: dict[str, Any]) -> dict[str, Any]:
    """Forks a child for one test and returns its outcome dict (status, exit_code, ...)."""
    stdin_fd = _stdin_fd(request.get("stdin", ""))
    nonce = os.urandom(16).hex()  # the child's report must start with it (see _parse_message)
    out_r, out_w = os.pipe()
    res_r, res_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        try:
            _child(program, request, limits, nonce, (stdin_fd, out_w, res_w))
        finally:
            _exit(_CHILD_FAILED)
    for fd in (stdin_fd, out_w, res_w):
        os.close(fd)
    deadline = time.monotonic() + limits["timeout_s"]
    stdout, result, reason = _collect(pid, out_r, res_r, deadline, limits["max_output_bytes"])
    if reason is not None:
        _kill(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # its process group; the zombie keeps the id reserved
    _, wait_status = os.waitpid(pid, 0)
    os.close(out_r)
    os.close(res_r)
    message = _parse_message(result, nonce) if reason is None else None
    exit_code = os.waitstatus_to_exitcode(wait_status)
    return _outcome(request["kind"], stdout, message, reason, exit_code)


def _stdin_fd(text: str) -> int:
    """An fd positioned at the start of `text` (a memfd: no file on disk, no pipe to feed)."""
    fd = os.memfd_create("stdin")
    _write_all(fd, text.encode("utf-8", "surrogatepass"))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _collect(
    pid: int, out_r: int, res_r: int, deadline: float, cap: int
) -> tuple[bytes, bytes, str | None]:
    """Reads the child's stdout and result pipes until it exits, the deadline passes or a pipe
    exceeds `cap` bytes. Returns (stdout, result, reason) with reason None, "timeout" or
    "output_limit"."""
    pidfd = os.pidfd_open(pid)
    buffers = {out_r: bytearray(), res_r: bytearray()}
    poller = select.poll()
    for fd in (out_r, res_r, pidfd):
        poller.register(fd, _POLL_IN)
    open_fds = {out_r, res_r}
    reason = None
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "timeout"
                break
            exited = False
            for fd, _ in poller.poll(remaining * 1000):
                if fd == pidfd:
                    exited = True
                elif not _read_into(fd, buffers[fd], cap):
                    poller.unregister(fd)
                    open_fds.discard(fd)
            if any(len(buf) > cap for buf in buffers.values()):
                reason = "output_limit"
                break
            if exited:  # what the child wrote is in the pipes; descendants may hold them open
                for fd in open_fds:
                    os.set_blocking(fd, False)
                    while len(buffers[fd]) <= cap and _read_into(fd, buffers[fd], cap):
                        pass
                if any(len(buf) > cap for buf in buffers.values()):
                    reason = "output_limit"
                break
    finally:
        os.close(pidfd)
    return bytes(buffers[out_r]), bytes(buffers[res_r]), reason


def _read_into(fd: int, buffer: bytearray, cap: int) -> bool:
    """Appends up to 64 KiB from `fd`; False at end of file or when nothing is available."""
    try:
        chunk = os.read(fd, min(65536, cap + 1 - len(buffer)) or 1)
    except BlockingIOError:
        return False
    buffer += chunk
    return bool(chunk)


def _outcome(
    kind: str, stdout: bytes, message: dict[str, Any] | None, reason: str | None, exit_code: int
) -> dict[str, Any]:
    """Turns what one child left behind into the outcome frame sent to the parent."""
    outcome: dict[str, Any] = {"status": reason, "exit_code": exit_code, "values": [], "detail": ""}
    if reason is None:
        if message is not None:
            outcome.update(message)
        elif kind == "stdio" and exit_code == 0:
            outcome["status"] = "ok"  # the program ended itself (e.g. os._exit(0)) after printing
        else:
            outcome["status"] = "crashed"
            outcome["detail"] = f"exited with status {exit_code} before reporting a result"
    if kind == "stdio":
        outcome["stdout"] = stdout.decode("utf-8", "replace")
    return outcome


def _parse_message(raw: bytes, nonce: str) -> dict[str, Any] | None:
    """Validates the child's report: `<nonce> <json>`, written by a process the program ran in.

    The nonce keeps a program that blindly writes a fake report to its inherited descriptors
    from passing a test it never ran.
    """
    prefix = f"{nonce} ".encode()
    if not raw.startswith(prefix):
        return None
    try:
        message = json.loads(raw[len(prefix) :].decode("utf-8"))
    except ValueError:
        return None
    if type(message) is not dict or message.get("status") not in ("ok", "error"):
        return None
    values = message.get("values", [])
    detail = message.get("detail", "")
    if (
        type(values) is not list
        or any(type(v) is not str for v in values)
        or type(detail) is not str
    ):
        return None
    return {"status": message["status"], "values": values, "detail": detail[:500]}


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def end_leftovers(kill_all: bool) -> None:
    """Kills and reaps every process the last test left behind (daemons included)."""
    deadline = time.monotonic() + _CLEANUP_S
    while True:
        if kill_all:
            _kill(-1)  # every process this uid may signal in this namespace, except ourselves
        else:
            for pid in _children():
                _kill(pid)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            return
        if time.monotonic() > deadline:
            return
        time.sleep(0.002)


def _children() -> list[int]:
    """Pids of this process's children (orphaned descendants included: we are a subreaper)."""
    pids: list[int] = []
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as handle:
                pids += [int(pid) for pid in handle.read().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: only the test's group was killed
        return []
    return pids


def _child(
    program: str,
    request: dict[str, Any],
    limits: dict[str, Any],
    nonce: str,
    fds: tuple[int, int, int],
) -> None:  # pragma: no cover - runs in the forked child
    """Sets up the child's fds and limits, runs the test and reports on fd 3, then exits.

    `fds`: the stdin memfd, and the write ends of the stdout and report pipes.
    """
    # Move the sources above the targets first, so that no dup2 below overwrites one of them.
    stdin_fd, out_w, res_w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in fds)
    os.setpgid(0, 0)
    null_fd = fcntl.fcntl(os.open(os.devnull, os.O_RDWR), fcntl.F_DUPFD, 10)
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(null_fd, 2)
    os.dup2(res_w, _RESULT_FD)
    os.closerange(_RESULT_FD + 1, 1 << 20)  # the result channel and the harness's pipe ends
    cpu_s = math.ceil(limits["timeout_s"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    file_bytes = limits["max_file_mb"] << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.argv = ["solution.py"]
    message = _evaluate(program, request)
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
    _write_all(_RESULT_FD, f"{nonce} {_dumps(message)}".encode())
    _exit(0)


def _evaluate(program: str, request: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover
    """Runs the program and the request in one namespace; never raises."""
    kind = request["kind"]
    namespace: dict[str, Any] = {
        "__name__": "__main__" if kind == "stdio" else "solution",
        "__builtins__": builtins,
    }
    try:
        exec(compile(program, "solution.py", "exec"), namespace)
        if kind == "call":
            function = _resolve(namespace, request["name"])
            value = function(*request["args"], **request["kwargs"])
            return {"status": "ok", "values": [plain.canonical_json(value)]}
        if kind == "eval":
            values = [eval(compile(e, "test.py", "eval"), namespace) for e in request["exprs"]]
            return {"status": "ok", "values": [plain.canonical_json(v) for v in values]}
        if kind == "exec":
            namespace[plain.TRUSTED_NAME] = plain.trusted
            exec(compile(request["source"], "test.py", "exec"), namespace)
        return {"status": "ok"}
    except SystemExit as exc:
        code = SystemExit.code.__get__(exc)  # not `exc.code`: a subclass may override it
        if kind == "stdio" and (code is None or (type(code) is int and code == 0)):
            return {"status": "ok"}
        return {"status": "error", "detail": "SystemExit"}
    except BaseException as exc:
        return {"status": "error", "detail": _describe(exc)}


def _resolve(namespace: dict[str, Any], name: str) -> Any:  # pragma: no cover
    """`f` -> namespace["f"]; `Solution.solve` -> Solution().solve (a class is instantiated)."""
    first, *rest = name.split(".")
    if first not in namespace:
        raise NameError(f"the program defines no {first!r}")
    target = namespace[first]
    for attribute in rest:
        if isinstance(target, type):
            target = target()
        target = getattr(target, attribute)
    return target


def _describe(exc: BaseException) -> str:  # pragma: no cover
    """`TypeName: arg, arg` (str/int args only) without calling a method the program defined."""
    name = plain.type_name(type(exc))
    args = BaseException.args.__get__(exc)  # not `exc.args`: a subclass may override it
    try:
        text = ", ".join(str(arg) for arg in args if type(arg) is str or type(arg) is int)
    except ValueError:  # an int too long to print
        text = ""
    return f"{name}: {text[:300]}" if text else name


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
