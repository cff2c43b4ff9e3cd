"""Environments written for gymnasium's interface, run here unchanged (`env.name: gym`).

A text environment (`gymnasium.spaces.Text` spaces, or any object with gymnasium's `reset` and
`step`): each observation becomes a user message, each assistant turn is the action, the
rewards add up, and the episode ends on terminated or truncated. The row's prompt (if any)
opens as a system message; the seed is the row's index, so a prompt's samples start alike.

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
