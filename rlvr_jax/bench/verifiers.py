"""`rlvr-bench verifiers`: verifier throughput on this machine. Math: verifications/s on a seeded
mix of answers (about half correct, ~30% needing SymPy, none repeated so that SymPy's cache
cannot answer), one at a time, SymPy cases alone and through `RewardService`. Code: sandbox
programs/s, sequential and threaded (skipped with a message where the sandbox cannot run).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from typing import Any

from rlvr_jax.bench import progress
from rlvr_jax.bench.table import Bench

Case = tuple[str, str]  # (response, gold)


def _numeric(rng: random.Random) -> Case:
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    gold = str(a * b)
    shown = f"{a * b:,}" if rng.random() < 0.3 else gold
    answer = shown if rng.random() < 0.5 else str(a * b + rng.randint(1, 9))
    return f"We multiply {a} by {b}.\nThe final answer is {answer}.", gold


def _fraction(rng: random.Random) -> Case:
    p, q = rng.randint(1, 50), rng.randint(51, 99)
    k = rng.randint(2, 9)
    answer = rf"\dfrac{{{p * k}}}{{{q * k}}}" if rng.random() < 0.5 else f"{p + 1}/{q}"
    return rf"<think>reduce it</think>So the ratio is $\boxed{{{answer}}}$", rf"\frac{{{p}}}{{{q}}}"


def _radical(rng: random.Random) -> Case:
    n = rng.choice([2, 3, 5, 6, 7, 10, 11, 13, 14, 15])
    k = rng.randint(2, 99)
    answer = rf"\sqrt{{{k * k * n}}}" if rng.random() < 0.5 else rf"{k + 1}\sqrt{{{n}}}"
    return rf"Simplifying, $\boxed{{{answer}}}$.", rf"{k}\sqrt{{{n}}}"


def _polynomial(rng: random.Random) -> Case:
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    gold = f"x^2+{a + b}x+{a * b}"
    answer = f"(x+{a})(x+{b})" if rng.random() < 0.5 else f"(x+{a})(x+{b + 1})"
    return rf"\boxed{{{answer}}}", gold


def _interval(rng: random.Random) -> Case:
    a = rng.randint(-999, 999)
    answer = rf"x \geq {a}" if rng.random() < 0.5 else rf"x > {a}"
    return rf"The solution set is \boxed{{{answer}}}", rf"[{a}, \infty)"


def _structured(rng: random.Random) -> Case:
    kind = rng.randrange(3)
    if kind == 0:
        letter = rng.choice("ABCDE")
        answer = letter if rng.random() < 0.5 else "ABCDE"[("ABCDE".index(letter) + 1) % 5]
        return rf"\boxed{{\text{{({answer})}}}}", letter
    if kind == 1:
        p, q = rng.randint(-9, 9), rng.randint(-9, 9)
        answer = f"({p}, {q})" if rng.random() < 0.5 else f"({q}, {p + 1})"
        return rf"The point is $\boxed{{{answer}}}$.", f"({p},{q})"
    n = rng.randint(1, 40)
    answer = rf"{n}^\circ" if rng.random() < 0.5 else rf"{n + 5}^\circ"
    return rf"\boxed{{{answer}}}", str(n)


_MIX: tuple[tuple[Callable[[random.Random], Case], float], ...] = (
    (_numeric, 0.45), (_fraction, 0.15), (_radical, 0.12), (_polynomial, 0.10),
    (_interval, 0.08), (_structured, 0.10),
)  # fmt: skip


def math_mix(n: int, seed: int = 0) -> list[Case]:
    """n (response, gold) cases from the mix described in the module docstring."""
    rng = random.Random(seed)
    makers, weights = zip(*_MIX)
    return [rng.choices(makers, weights)[0](rng) for _ in range(n)]


def bench_math(n: int, workers: int) -> dict[str, Any]:
    """Math verifications/s: sequential `verify` and `RewardService` with `workers`."""
    from rlvr_jax.config.schema import RewardsConfig
    from rlvr_jax.rewards.math import verify
    from rlvr_jax.rewards.math.extract import extract_answer
    from rlvr_jax.rewards.math.quick import quick_match
    from rlvr_jax.rewards.service import RewardService

    progress.line(f"math: {n} verifications, sequential then {workers} service workers")
    cases = math_mix(n, seed=1)
    symbolic = [(r, g) for r, g in cases if quick_match(extract_answer(r) or "", g) is None]
    verify(*math_mix(1, seed=99)[0])  # start the shared pool outside the timing
    verify(r"\boxed{\sqrt{8}}", r"2\sqrt{2}")
    start = time.perf_counter()
    correct = sum(verify(response, gold) for response, gold in cases)
    sequential_s = time.perf_counter() - start
    start = time.perf_counter()
    for response, gold in symbolic:
        verify(response, gold)
    symbolic_s = time.perf_counter() - start

    rows = [{"verifier": "math", "ground_truth": gold} for _, gold in math_mix(n, seed=2)]
    responses = [response for response, _ in math_mix(n, seed=2)]
    with RewardService(RewardsConfig(), workers=workers) as service:
        service.score(rows[:workers], responses[:workers])  # wait for the workers to start
        start = time.perf_counter()
        result = service.score(rows, responses)
        service_s = time.perf_counter() - start
    return {
        "verifications_per_s": {
            "sequential_verify": n / sequential_s,
            "sequential_verify_sympy_cases_only": len(symbolic) / max(symbolic_s, 1e-9),
            f"service_{workers}_workers": n / service_s,
        },
        "n": n,
        "inline_fraction": 1 - len(symbolic) / n,
        "correct_fraction": correct / n,
        "service_timeouts": result.metrics["rewards/timeouts"],
        "service_errors": result.metrics["rewards/errors"],
    }


def bench_code(n: int, parallel: int) -> dict[str, Any]:
    """Sandbox programs/s (a correct program, 3 tests), sequential and `parallel` threads."""
    from rlvr_jax.rewards.code.bench import programs_per_second

    try:
        _, first = programs_per_second(1, 1)
    except Exception as e:  # e.g. the sandbox cannot isolate on this machine
        return {"skipped": f"the sandbox does not run here: {type(e).__name__}: {e}"}
    progress.line(f"code: {n} sandboxed programs, sequential then {parallel} threads")
    sequential, ok_sequential = programs_per_second(n, 1)
    threaded, ok_threaded = programs_per_second(n, parallel)
    return {
        "programs_per_s": {"sequential": sequential, f"parallel_{parallel}": threaded},
        "n": n,
        "all_passed": first and ok_sequential and ok_threaded,
    }


@dataclasses.dataclass(frozen=True)
class VerifiersConfig:
    """How many verifications each measurement makes."""

    n: int = 400
    """Math verifications per measurement."""
    workers: int = 0
    """Reward service workers (0: `rewards.timeout.default_workers()`)."""
    code_n: int = 20
    """Sandbox programs per measurement."""

    def __post_init__(self) -> None:
        if self.n < 1 or self.code_n < 1 or self.workers < 0:
            raise ValueError("n and code_n must be >= 1, workers >= 0")


def run(cfg: VerifiersConfig) -> dict[str, Any]:
    """Math, then code."""
    from rlvr_jax.rewards.timeout import default_workers

    workers = cfg.workers or default_workers()
    return {"math": bench_math(cfg.n, workers), "code": bench_code(cfg.code_n, workers)}


BENCH = Bench(
    VerifiersConfig,
    run,
    presets={"default": VerifiersConfig(), "quick": VerifiersConfig(n=40, code_n=4)},
    headlines=("math/verifications_per_s", "math/inline_fraction", "code"),
)
