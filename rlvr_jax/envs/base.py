"""The environment protocol and its registry.

One instance runs one episode: `reset(row)` returns the first messages (`{"role", "content"}`
dicts; the row's fields plus its `index`), and `step(assistant_text)` returns a `Step`
(observation messages to append, or None; this turn's reward; done; info). `tools` lists the
JSON schemas the chat template offers. The runner (`envs.episode`) enforces `env.max_turns` and
`rollout.max_new_tokens` and calls an optional `close()` however the episode ended.
`env.name` is a registered name or a `module:function` factory taking the `env.kwargs`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

Message = dict[str, Any]


class Step(NamedTuple):
    """What one assistant turn leads to."""

    observation: list[Message] | None
    """Messages appended before the next assistant turn (e.g. tool results); None ends."""
    reward: float = 0.0
    """This turn's contribution to the episode's reward (added to the verifier's score)."""
    done: bool = False
    """The episode is over (the last assistant turn is the final answer)."""
    info: dict[str, Any] = {}
    """Counters the runner sums into `env/*` metrics: `tool_calls`, `tool_errors`,
    `tool_latency_s`."""


class Environment(Protocol):
    """One episode of a multi-turn environment (see the module docstring)."""

    tools: Sequence[dict[str, Any]]

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        """The episode's first messages for data row `row`."""

    def step(self, assistant_text: str) -> Step:
        """The outcome of one assistant turn (a `Step`, or the same 4-tuple)."""


BUILTIN_ENVS: dict[str, str] = {
    "tools": "rlvr_jax.envs.tool_env:ToolEnv",
    "gym": "rlvr_jax.envs.gym:GymTextEnv",
    "verifiers": "rlvr_jax.envs.verifiers_env:VerifiersEnv",
    "openenv": "rlvr_jax.envs.openenv_env:OpenEnvEnv",
}
_USER_ENVS: dict[str, Callable[..., Environment]] = {}


def register_env(name: str) -> Callable[[Callable[..., Environment]], Callable[..., Environment]]:
    """Decorator registering an environment factory (a class or function) as `env.name`."""

    def decorate(factory: Callable[..., Environment]) -> Callable[..., Environment]:
        if name in BUILTIN_ENVS or _USER_ENVS.get(name, factory) is not factory:
            raise ValueError(f"environment name {name!r} is already taken")
        _USER_ENVS[name] = factory
        return factory

    return decorate


def env_factory(name: str) -> Callable[..., Environment]:
    """The factory of `env.name`: a registered name or `module:function`. Raises ValueError
    naming the key when it is neither."""
    target = BUILTIN_ENVS.get(name, name)
    if name in _USER_ENVS:
        return _USER_ENVS[name]
    module, sep, attr = target.partition(":")
    if not sep:
        known = sorted({*BUILTIN_ENVS, *_USER_ENVS})
        raise ValueError(f"env.name {name!r} is not one of {known} nor 'module:function'")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"env.name {name!r}: cannot import {target}: {e}") from e
    if not callable(obj):
        raise ValueError(f"env.name {name!r}: {target} is not callable")
    return obj


def as_step(result: Any) -> Step:
    """A `Step` from what `step` returned (a `Step` or a 4-tuple). Raises TypeError."""
    if isinstance(result, Step):
        return result
    if isinstance(result, tuple) and len(result) == 4:
        observation, reward, done, info = result
        return Step(observation, float(reward), bool(done), dict(info or {}))
    raise TypeError(
        "an environment's step must return a Step or (observation, reward, done, info), "
        f"got {type(result).__name__}"
    )
