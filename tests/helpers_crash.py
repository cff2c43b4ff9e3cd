"""A pytest plugin (loaded by conftest.py): what a worker that dies mid-test leaves behind.

An xdist worker killed by a native crash (SIGABRT or SIGSEGV inside XLA or another extension)
reports only "worker 'gw1' crashed while running T": the Python stacks that faulthandler
prints go to the worker's stderr, far above the summary. Here:

- each worker writes faulthandler's dump (every thread's stack) to its own file in a
  directory the controller makes (`RLVR_TEST_CRASH_DIR`), and the crashed test's failure
  shows that dump;
- the crashed test runs once more, alone, in a fresh `python -m pytest` process. If it passes
  there, it counts as passed, and the run's summary still lists it with the crash's dump
  (a crash that happens once in many runs must not hide; nor may it fail a 25-minute run
  that passed otherwise). If it fails again, it fails with both outputs.

A test that fails (rather than killing its process) is never rerun.
"""

from __future__ import annotations

import faulthandler
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CRASH_DIR_ENV = "RLVR_TEST_CRASH_DIR"
RERUN_TIMEOUT_S = 1200
DUMP_LINES = 60
"""The most lines of a dump shown, once the harness's own frames are left out."""
HARNESS_FRAMES = ("/_pytest/", "/pluggy/", "/execnet/", "/xdist/", "<frozen runpy>", '"<string>"')

_crashed: list[tuple[str, str]] = []  # on the controller: (test, what happened), for the summary
_DUMP = pytest.StashKey["object"]()  # on a worker: faulthandler's file


@pytest.hookimpl(trylast=True)  # after pytest's own faulthandler plugin, which writes to stderr
def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller: before the workers start
        os.environ.setdefault(CRASH_DIR_ENV, tempfile.mkdtemp(prefix="rlvr-test-crashes-"))
        return
    folder = os.environ.get(CRASH_DIR_ENV)
    if folder:
        path = Path(folder) / f"{config.workerinput['workerid']}.log"
        config.stash[_DUMP] = path.open("w")  # open for the worker's life
        faulthandler.enable(file=config.stash[_DUMP], all_threads=True)


def dump_of(worker_id: str) -> str:
    """What faulthandler wrote for worker `worker_id` ("" if nothing), without the frames of
    pytest, xdist and execnet, at most `DUMP_LINES` lines."""
    path = Path(os.environ.get(CRASH_DIR_ENV, "/nonexistent")) / f"{worker_id}.log"
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join([x for x in lines if not any(h in x for h in HARNESS_FRAMES)][:DUMP_LINES])


def rerun_alone(config: pytest.Config, nodeid: str) -> tuple[int, str]:
    """Runs test `nodeid` alone in a fresh pytest process (same tier); its exit code and the
    tail of its output."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", nodeid]
    if config.getoption("fast", False):
        cmd.append("--fast")
    try:
        done = subprocess.run(
            cmd,
            cwd=config.rootpath,
            capture_output=True,
            text=True,
            timeout=RERUN_TIMEOUT_S,
            env={k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"},
        )
    except subprocess.TimeoutExpired:
        return 124, f"the rerun took over {RERUN_TIMEOUT_S} s"
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
    return done.returncode, tail


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """xdist, on the controller: `crashitem` killed its worker; `report` is its failure."""
    worker = getattr(getattr(report, "node", None), "gateway", None)
    dump = dump_of(worker.id) if worker is not None else ""
    config = sched.config
    code, tail = rerun_alone(config, crashitem)
    shown = dump or "(faulthandler wrote nothing: the process was killed, e.g. out of memory)"
    if code == 0:
        report.outcome, report.when, report.longrepr = "passed", "call", None
        _crashed.append((crashitem, f"crashed its worker, then passed alone:\n{shown}"))
        return
    report.longrepr = (
        f"{report.longrepr}\n--- faulthandler's dump of the worker ---\n{shown}\n"
        f"--- the test rerun alone (exit code {code}) ---\n{tail}"
    )
    _crashed.append((crashitem, "crashed its worker, and failed again alone (see FAILURES)"))


def pytest_terminal_summary(terminalreporter, config):
    if _crashed:
        terminalreporter.section("tests that crashed their worker (a native crash)")
        for nodeid, what in _crashed:
            terminalreporter.write_line(f"{nodeid}: {what}")
