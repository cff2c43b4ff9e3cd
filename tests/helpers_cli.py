"""Starting the installed console scripts the way a user does: a fresh interpreter running
the entry point from the virtualenv's `bin/`, nothing pre-imported, output to files."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

FAST_COMPILE = "--xla_backend_optimization_level=0"
"""In XLA_FLAGS of every test process (tests/conftest.py's, and the processes the tests start
through `xla_flags`): the tests' programs are tiny, so LLVM's optimizations cost more compile
time than they save at run time (test_ppo_sync_run_resumes_exactly: 122 s -> 65 s, load ~4;
test_attention_memory_workload, the heaviest compute: 65 s -> 60 s); runs that decode a lot
lose some (the DPO experiment's --quick run: 106 s -> 125 s, load ~2.5), and a run of many
steps of the demo model loses most: 200 SFT steps of the tool warm start take 3x the CPU time
at -O0 (1.31 s a step against 0.42), so that test's process optimizes (`xla_flags(optimize=
True)`). The float semantics are XLA's either way (no fast-math)."""
FAULTS = Path(__file__).with_name("serve_faults")
"""PYTHONPATH entry whose sitecustomize injects engine faults (see its docstring)."""
CHECKOUT = str(Path(__file__).resolve().parents[1])
"""The checkout these tests belong to: first on the PYTHONPATH of every console script they
start, so that the script runs this checkout's package whichever checkout the virtualenv's
editable install points at (the same directory when it is this one)."""


def load_factor() -> float:
    """How much slower than idle the cores are: the 1-minute load average per core, >= 1."""
    return max(1.0, os.getloadavg()[0] / len(os.sched_getaffinity(0)))


def stop_s(seconds: float = 10.0) -> float:
    """The time a command is given to stop on a signal: `seconds` on idle cores, scaled by
    `load_factor()` (CI's two xdist workers and their subprocesses load two cores to 3-6, and
    a process that gets a third of a core takes three times as long to unwind)."""
    return seconds * load_factor()


def script(name: str) -> str:
    """The installed console script `name` (next to this interpreter)."""
    path = Path(sys.executable).with_name(name)
    assert path.exists(), f"{name} is not installed in {path.parent} (pip install -e .)"
    return str(path)


def xla_flags(devices: int = 1, *, optimize: bool = False) -> str:
    """XLA_FLAGS of a test process with `devices` simulated CPU devices (1: XLA's default),
    compiled at -O0 (`FAST_COMPILE`) unless `optimize`."""
    count = f"--xla_force_host_platform_device_count={devices} " if devices > 1 else ""
    return (count + ("" if optimize else FAST_COMPILE)).strip()


def user_env(**extra: str) -> dict[str, str]:
    """The environment a user's shell has after `source scripts/setup_env.sh` (no test-only
    XLA device count: `xla_flags()`), plus `extra`; PYTHONPATH is `CHECKOUT`, then `extra`'s
    PYTHONPATH, then (with `RLVR_TEST_*` variables) `FAULTS`."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
    env.update({"JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(), **extra})
    path = [CHECKOUT, *([extra["PYTHONPATH"]] if extra.get("PYTHONPATH") else [])]
    if any(k.startswith("RLVR_TEST_") for k in extra):
        path.append(str(FAULTS))
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


class Proc:
    """One console-script process; stdout/stderr go to files in `workdir` (also its working
    directory unless `cwd` is given)."""

    def __init__(
        self, name: str, args: list[str], workdir: Path, *, cwd: Path | None = None, **env: str
    ):
        self.name = name
        self.workdir = workdir
        self.out_path = workdir / f"{name}.stdout"
        self.err_path = workdir / f"{name}.stderr"
        self.started = time.monotonic()
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.popen = subprocess.Popen(
                [script(name), *args],
                stdout=out,
                stderr=err,
                env=user_env(**env),
                cwd=workdir if cwd is None else cwd,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stdout(self) -> str:
        return self.out_path.read_text()

    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait(self, timeout: float) -> int:
        """The exit code; fails the test (with stderr) if it runs longer than `timeout`."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.name} still running after {timeout} s:\n{self.stderr()[-3000:]}"
            ) from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> tuple[int, float]:
        """Sends `sig`; returns (exit code, seconds it took to exit)."""
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):  # it may have exited already
            self.popen.send_signal(sig)
        rc = self.wait(timeout)
        return rc, time.monotonic() - t0

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
            self.popen.wait(30)

    def wait_for_file(self, path: Path, timeout: float) -> dict:
        """The JSON in `path` once the process has written it."""
        deadline = self.started + timeout
        while not path.exists():
            assert self.alive(), f"{self.name} exited:\n{self.stderr()[-3000:]}"
            assert time.monotonic() < deadline, f"no {path.name} after {timeout} s"
            time.sleep(0.05)
        return json.loads(path.read_text())
