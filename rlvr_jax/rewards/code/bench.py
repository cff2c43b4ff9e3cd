"""Throughput of the code sandbox: programs verified per second, sequentially and in parallel.

    python -m rlvr_jax.rewards.code.bench --programs 40 --workers 2

Each program is a small correct solution checked against three tests (one stdio, one call,
one assert), so a run costs one sandbox start and three test processes. Prints nested JSON:
`{"programs_per_s": {"sequential": ..., "parallel_2": ...}, ...}`.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

from rlvr_jax.rewards.code.sandbox import Isolation
from rlvr_jax.rewards.code.verifier import run_tests

PROGRAM = """
def add(a, b):
    return a + b

if __name__ == "__main__":
    a, b = map(int, input().split())
    print(add(a, b))
"""
TESTS = [
    {"stdin": "2 3\n", "stdout": "5\n"},
    {"call": "add", "args": [4, 5], "expected": 9},
    "assert add(-1, 1) == 0",
]


def programs_per_second(
    n_programs: int, workers: int, isolation: Isolation = "strict"
) -> tuple[float, bool]:
    """Verifies `n_programs` copies of PROGRAM with `workers` threads: (programs/s, whether
    every copy scored 1.0)."""
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        scores = list(
            pool.map(lambda _: run_tests(PROGRAM, TESTS, isolation=isolation), range(n_programs))
        )
    return n_programs / (time.perf_counter() - start), all(score == 1.0 for score in scores)


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark and prints (and returns) its JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--programs", type=int, default=40, help="programs per measurement")
    parser.add_argument("--workers", type=int, default=2, help="threads in the parallel run")
    parser.add_argument("--isolation", choices=["strict", "weak"], default="strict")
    args = parser.parse_args(argv)
    _, warm = programs_per_second(2, 1, args.isolation)  # warm-up: page cache, bytecode
    sequential, ok_sequential = programs_per_second(args.programs, 1, args.isolation)
    threaded, ok_threaded = programs_per_second(args.programs, args.workers, args.isolation)
    if not (warm and ok_sequential and ok_threaded):
        raise RuntimeError("the benchmark program did not score 1.0")
    rates = {"sequential": sequential, f"parallel_{args.workers}": threaded}
    report = {
        "programs_per_s": rates,
        "tests_per_program": len(TESTS),
        "programs": args.programs,
        "isolation": args.isolation,
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
