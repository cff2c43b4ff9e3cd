"""The environment protocol and its registry.

An environment runs one episode: `reset(row)` returns the conversation's first messages
(`{"role", "content"}` dicts; the data row's fields, plus its `index`), and
`step(assistant_text)` takes each assistant turn's text and returns a `Step`:
(observation messages to append before the next assistant turn, or None; this turn's
reward contribution; whether the episode is over; info). `tools` lists the JSON schemas
the chat template offers the model (empty for environments without tools). The episode's
limits — `env.max_turns` assistant turns and `rollout.max_new_tokens` tokens in all,
generated and appended — are enforced by the runner (`rlvr_jax.envs.episode`), not by the
environment; an environment with a `close()` method has it called once its episode is over,
however it ended (done, truncated by a limit, or failed).

Environments are named in `env.name` like loss variants: a registered name (`tools`:
`ToolEnv`; `gym`: a gymnasium-style text environment; `verifiers`: a `verifiers` package
environment; `openenv`: an `openenv-core` environment) or `module:function` (any factory
taking the `env.kwargs` as keyword arguments). One instance runs one episode.
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
