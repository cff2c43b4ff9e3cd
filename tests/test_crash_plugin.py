"""tests/helpers_crash.py: a test that kills its xdist worker shows faulthandler's dump and
runs once more alone; passing there, it counts as passed and the summary still names it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

CRASHES_ONCE = """
import os
from pathlib import Path

def test_crashes_the_first_time(tmp_path_factory):
    flag = Path(os.environ["CRASH_FLAG"])
    if not flag.exists():
        flag.write_text("crashed")
        os.abort()
"""

CRASHES_ALWAYS = """
import ctypes

def test_crashes_every_time():
    ctypes.string_at(0)  # SIGSEGV
"""


@pytest.mark.slow
def test_a_crash_shows_its_dump_and_is_rerun_alone(tmp_path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["helpers_crash"]\n')
    (tmp_path / "test_once.py").write_text(CRASHES_ONCE)
    (tmp_path / "test_always.py").write_text(CRASHES_ALWAYS)
    env = {**os.environ, "PYTHONPATH": str(TESTS), "CRASH_FLAG": str(tmp_path / "flag")}
    env.pop("RLVR_TEST_CRASH_DIR", None)  # the inner controller makes its own
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "1 failed, 1 passed" in out, out
    summary = out.split("tests that crashed their worker")[1]
    assert "test_once.py::test_crashes_the_first_time: crashed its worker, then passed alone" in (
        summary
    )
    assert "test_always.py::test_crashes_every_time: crashed its worker, and failed again" in (
        summary
    )
    # the dumps name the line that crashed, in the summary (passed) and in FAILURES (failed)
    assert 'test_once.py", line 9 in test_crashes_the_first_time' in summary
    failure = out.split("FAILURES")[1]
    assert 'test_always.py", line 5 in test_crashes_every_time' in failure
    assert "the test rerun alone (exit code 1)" in failure or "exit code -11" in failure
