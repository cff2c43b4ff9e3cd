"""Verifier registry: names → "module:function" targets, resolved lazily.

Built-in names: "math", "code", "ifeval", "judge", "rubric". Users add their own with
`@register_verifier("name")` on a module-level function, or name any importable function
directly as "package.module:function" in a data row's `verifier` field.

Verifiers are stored as target strings, not callables, because the reward service runs them in
worker processes that import the target themselves. Every verifier has the signature
`reward(response: str, ground_truth, **verifier_kwargs) -> float` with a result in [0, 1].
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar

from rlvr_jax.rewards.timeout import resolve_target

BUILTIN_VERIFIERS: dict[str, str] = {
    "math": "rlvr_jax.rewards.math:reward",
    "code": "rlvr_jax.rewards.code:reward",
    "ifeval": "rlvr_jax.rewards.ifeval:reward",
    "judge": "rlvr_jax.rewards.judge:reward",
    "rubric": "rlvr_jax.rewards.rubric:reward",
}
_USER_VERIFIERS: dict[str, str] = {}
_NAME = re.compile(r"^[A-Za-z_][\w\-.]*$")
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")

F = TypeVar("F", bound=Callable[..., Any])


def register_verifier(name: str) -> Callable[[F], F]:
    """Decorator registering a module-level function as verifier `name`.

    The function must be importable by its module path (worker processes import it), so
    lambdas and functions defined inside other functions are refused. Registering the same
    function twice (a module imported again) is fine; taking a name already in use is not.
    """
    if not isinstance(name, str) or not _NAME.match(name) or ":" in name:
        raise ValueError(f"verifier name {name!r} must be a plain identifier (letters, _, -, .)")

    def decorate(fn: F) -> F:
        if not inspect.isfunction(fn) or "<" in fn.__qualname__:
            raise ValueError(
                f"verifier {name!r} must be a module-level function (got {fn!r}); worker "
                "processes import it by name"
            )
        target = f"{fn.__module__}:{fn.__qualname__}"
        existing = BUILTIN_VERIFIERS.get(name) or _USER_VERIFIERS.get(name)
        if existing is not None and existing != target:
            raise ValueError(f"verifier name {name!r} is already taken by {existing}")
        _USER_VERIFIERS[name] = target
        return fn

    return decorate


def known_verifiers() -> tuple[str, ...]:
    """Registered verifier names (built-in first)."""
    return (*BUILTIN_VERIFIERS, *(n for n in _USER_VERIFIERS if n not in BUILTIN_VERIFIERS))


def verifier_target(name: str) -> str:
    """The "module:function" target of a verifier name (or of a "module:function" itself).

    Raises:
      ValueError: an unknown name, naming the known ones.
    """
    if not isinstance(name, str):
        raise ValueError(f"verifier must be a string, got {name!r}")
    if name in BUILTIN_VERIFIERS:
        return BUILTIN_VERIFIERS[name]
    if name in _USER_VERIFIERS:
        return _USER_VERIFIERS[name]
    if _TARGET.match(name):
        return name
    raise ValueError(
        f"unknown verifier {name!r}; known: {', '.join(known_verifiers())}, "
        "or a 'package.module:function'"
    )


def get_verifier(name: str) -> Callable[..., float]:
    """Imports and returns the verifier function for `name` (a name or "module:function")."""
    return resolve_target(verifier_target(name))
