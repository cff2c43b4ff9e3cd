"""Code verifier: runs untrusted programs against tests in an isolated, bounded sandbox.

`reward(response, ground_truth, **verifier_kwargs)` is the registry entry ("code"). Modules:
`verifier` (scoring), `cases` (test kinds), `program` (extraction), `sandbox` (parent side),
and, run inside the sandbox as bare scripts, `launcher`, `harness`, `plain`, `linux`.
Importing this package loads the standard library only.
"""

from rlvr_jax.rewards.code.program import extract_program
from rlvr_jax.rewards.code.sandbox import (
    SandboxError,
    SandboxLimits,
    SandboxUnavailableError,
    TestOutcome,
)
from rlvr_jax.rewards.code.verifier import TestResult, check_program, reward, run_tests

__all__ = [
    "SandboxError",
    "SandboxLimits",
    "SandboxUnavailableError",
    "TestOutcome",
    "TestResult",
    "check_program",
    "extract_program",
    "reward",
    "run_tests",
]
