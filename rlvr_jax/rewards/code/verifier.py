"""The code verifier: score a program against its tests in the sandbox.

`run_tests(program, tests)` returns the share of tests passed (`mode="fraction"`) or 1.0 only if
all pass (`mode="all"`). `reward(response, ground_truth)` is the registry entry point: it takes
the program from the model response (`program.extract_program`) and the tests (and optionally
the mode) from the row's ground truth. A program that fails in any way scores 0 for the tests it
fails; only a malformed ground truth (ValueError) or a sandbox that cannot run
(`SandboxUnavailableError`, `SandboxError`) raises.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr_jax.rewards.code.cases import parse_tests
from rlvr_jax.rewards.code.program import extract_program
from rlvr_jax.rewards.code.sandbox import Isolation, SandboxLimits, TestOutcome, run_sandboxed

SCORE_MODES: dict[str, Callable[[Sequence[bool]], float]] = {
    "fraction": lambda passed: sum(passed) / len(passed),
    "all": lambda passed: float(all(passed)),
}
"""How per-test results become one score in [0, 1]."""


@dataclass(frozen=True)
class TestResult:
    """One test's verdict, with the sandbox outcome behind it."""

    __test__ = False  # not a pytest class

    passed: bool
    outcome: TestOutcome


def check_program(
    program: str,
    tests: Sequence[Any],
    *,
    limits: SandboxLimits | None = None,
    isolation: Isolation = "strict",
) -> list[TestResult]:
    """Runs `program` on every test in the sandbox; one TestResult per test."""
    cases = parse_tests(tests)
    outcomes = run_sandboxed(
        program, [case.request() for case in cases], limits=limits, isolation=isolation
    )
    return [TestResult(case.passed(outcome), outcome) for case, outcome in zip(cases, outcomes)]


def run_tests(
    program: str,
    tests: Sequence[Any],
    *,
    timeout_s: float = 2.0,
    memory_mb: int = 1024,
    mode: str = "fraction",
    isolation: Isolation = "strict",
) -> float:
    """Score of `program` on `tests` (stdio dicts, call dicts or assert strings) in [0, 1].

    `timeout_s` is the wall-clock limit of each test, `memory_mb` the address-space limit of
    each process of the program.
    """
    score = _score_mode(mode)
    limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb)
    results = check_program(program, tests, limits=limits, isolation=isolation)
    return score([result.passed for result in results])


def reward(
    response: str,
    ground_truth: Any,
    *,
    timeout_s: float = 2.0,
    memory_mb: int = 1024,
    mode: str | None = None,
    isolation: Isolation = "strict",
) -> float:
    """Code reward of a model response in [0, 1].

    `ground_truth`: a list of tests, `{"tests": [...], "mode": "fraction" | "all"}`, or either as
    JSON text. The row's own mode wins over the `mode` argument; the default is "fraction".
    """
    tests, row_mode = parse_ground_truth(ground_truth)
    chosen_mode = row_mode or mode or "fraction"
    _score_mode(chosen_mode)
    parse_tests(tests)  # a malformed ground truth raises, whatever the response
    program = extract_program(response) if isinstance(response, str) else ""
    if not program.strip():
        return 0.0
    limits = {"timeout_s": timeout_s, "memory_mb": memory_mb, "isolation": isolation}
    return run_tests(program, tests, mode=chosen_mode, **limits)


def parse_ground_truth(ground_truth: Any) -> tuple[list[Any], str | None]:
    """(tests, mode or None) from a code row's ground truth; ValueError when malformed."""
    if isinstance(ground_truth, str | bytes):
        try:
            ground_truth = json.loads(ground_truth)
        except ValueError as err:
            raise ValueError(f"code ground truth is text but not JSON: {err}") from None
    if isinstance(ground_truth, Mapping):
        unknown = set(ground_truth) - {"tests", "mode"}
        if "tests" not in ground_truth or unknown:
            raise ValueError(
                "code ground truth dict needs a 'tests' key and may have 'mode', got keys "
                f"{sorted(ground_truth)}"
            )
        mode = ground_truth.get("mode")
        if mode is not None:
            _score_mode(mode)
        tests = ground_truth["tests"]
    else:
        tests, mode = ground_truth, None
    if isinstance(tests, str | bytes | Mapping) or not isinstance(tests, Sequence):
        raise ValueError(f"code ground truth tests must be a list, got {type(tests).__name__}")
    return list(tests), mode


def _score_mode(mode: str) -> Callable[[Sequence[bool]], float]:
    if not isinstance(mode, str) or mode not in SCORE_MODES:
        raise ValueError(f"code reward mode must be one of {sorted(SCORE_MODES)}, got {mode!r}")
    return SCORE_MODES[mode]
