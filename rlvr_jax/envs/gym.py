"""Environments written for gymnasium's interface, run here unchanged (`env.name: gym`).

A gymnasium-style text environment observes and acts in strings:
`reset(seed=..., options=...) -> (observation, info)` and
`step(action) -> (observation, reward, terminated, truncated, info)` (any `gymnasium.Env`
whose spaces are `gymnasium.spaces.Text`, or a plain object with those two methods). Here
each observation becomes a user message, each assistant turn's text is the action, every
step's reward is added to the episode's reward, and the episode ends when the environment
terminates or truncates. The row's prompt, when not empty, opens the conversation as a
system message; the environment is reset with the row's index as its seed, so all samples
of a prompt start alike.

Environments of the `verifiers` and `openenv-core` packages have their own adapters
(`envs.verifiers_env`, `envs.openenv_env`).

`env.kwargs`: `id` (a registered gymnasium id, made with `gymnasium.make(id, **make_kwargs)`)
or `entry_point` (`module:function` returning the environment), and `make_kwargs`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from rlvr_jax.envs.base import Message, Step


class GymTextEnv:
    """One episode of a gymnasium-style text environment (see the module docstring)."""

    tools: list[dict[str, Any]] = []

    def __init__(
        self,
        id: str | None = None,
        *,
        entry_point: str | None = None,
        make_kwargs: Mapping[str, Any] | None = None,
    ):
        if (id is None) == (entry_point is None):
            raise ValueError("env.kwargs: give exactly one of `id` and `entry_point`")
        kwargs = dict(make_kwargs or {})
        if id is not None:
            import gymnasium

            self.env = gymnasium.make(id, **kwargs)
        else:
            module, _, attr = entry_point.partition(":")
            self.env = getattr(importlib.import_module(module), attr)(**kwargs)

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        observation, _ = self.env.reset(seed=int(row.get("index", 0)))
        prompt = row.get("prompt")
        system = [{"role": "system", "content": prompt}] if isinstance(prompt, str) else []
        system = system if prompt else []
        return [*system, {"role": "user", "content": str(observation)}]

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()

    def step(self, assistant_text: str) -> Step:
        observation, reward, terminated, truncated, info = self.env.step(assistant_text)
        done = bool(terminated or truncated)
        message = None if done else [{"role": "user", "content": str(observation)}]
        return Step(message, float(reward), done, dict(info or {}))
