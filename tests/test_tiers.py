"""The fast tier's rules (tests/conftest.py), run on a scratch test file by pytest itself:
slow tests are left out, a test over its time limit fails naming itself, a smoke test may not be
slow."""

from pathlib import Path

import conftest
import pytest

pytest_plugins = ["pytester"]

SCRATCH = """
import time

import pytest


def test_quick():
    pass


def test_sleepy():
    time.sleep(0.5)


@pytest.mark.smoke("models")
def test_sleepy_smoke():
    time.sleep(0.5)


@pytest.mark.slow
def test_slow():
    raise AssertionError("the fast tier runs no slow test")
"""


@pytest.fixture
def scratch(pytester, monkeypatch):
    monkeypatch.setenv("RLVR_TEST_JAX_CACHE", str(conftest.JAX_CACHE))  # keep this run's cache
    pytester.makeconftest(Path(conftest.__file__).read_text())
    pytester.makepyfile(test_scratch=SCRATCH)
    return pytester


def test_the_fast_tier_leaves_out_slow_tests_and_fails_one_over_its_limit(scratch):
    # 0.5 s of sleep against a 0.05 s limit: over it unless the load is 10x the cores
    result = scratch.runpytest_inprocess("--fast", "--fast-limit", "0.05", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1, deselected=1)
    result.stdout.fnmatch_lines(
        [
            "*test_sleepy is over the fast tier's time limit: the test took 0.* s*",
            "*Mark the test @pytest.mark.slow*",
        ]
    )


def test_without_fast_every_test_runs_unchecked(scratch):
    result = scratch.runpytest_inprocess("--fast-limit", "0.05", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1)  # test_slow runs (and fails by design)


def test_a_smoke_test_may_not_be_slow(scratch):
    scratch.makepyfile(
        test_bad="import pytest\n\n\n@pytest.mark.slow\n@pytest.mark.smoke('data')\n"
        "def test_x():\n    pass\n"
    )
    result = scratch.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_x: a smoke test may not be marked slow*"])
