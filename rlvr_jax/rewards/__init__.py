"""Verifiers and the reward service. Importing this package is light: each name below is
imported from its module on first use.

Verifiers (`reward(response, ground_truth, **verifier_kwargs) -> float` in [0, 1]), by
registry name: "math" (`rlvr_jax.rewards.math`), "code" (`rlvr_jax.rewards.code`), "ifeval"
(`rlvr_jax.rewards.ifeval`), "judge" (`rlvr_jax.rewards.judge`), "rubric"
(`rlvr_jax.rewards.rubric`), plus user verifiers added with `register_verifier` or named as
"module:function".

    RewardService, ScoreResult          batch scoring in killable worker processes
    register_verifier, get_verifier, known_verifiers, verifier_target
    verify_math                         rlvr_jax.rewards.math.verify
    format_reward, soft_overlong_penalty, soft_overlong_penalty_N
    WorkerPool, run_bounded             hard timeouts for any "module:function"
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RewardService": ("rlvr_jax.rewards.service", "RewardService"),
    "ScoreResult": ("rlvr_jax.rewards.service", "ScoreResult"),
    "register_verifier": ("rlvr_jax.rewards.registry", "register_verifier"),
    "get_verifier": ("rlvr_jax.rewards.registry", "get_verifier"),
    "known_verifiers": ("rlvr_jax.rewards.registry", "known_verifiers"),
    "verifier_target": ("rlvr_jax.rewards.registry", "verifier_target"),
    "verify_math": ("rlvr_jax.rewards.math", "verify"),
    "format_reward": ("rlvr_jax.rewards.format", "format_reward"),
    "soft_overlong_penalty": ("rlvr_jax.rewards.format", "soft_overlong_penalty"),
    "soft_overlong_penalty_N": ("rlvr_jax.rewards.format", "soft_overlong_penalty_N"),
    "WorkerPool": ("rlvr_jax.rewards.timeout", "WorkerPool"),
    "run_bounded": ("rlvr_jax.rewards.timeout", "run_bounded"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlvr_jax.rewards' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
