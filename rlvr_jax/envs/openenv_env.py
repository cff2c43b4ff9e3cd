"""Environments written for `openenv-core` (0.3), run here unchanged (`env.name: openenv`).

An `openenv.core.Environment` runs in-process, one per episode (seeded with the row's index):
its first observation opens as a user message (the row's prompt, if any, as a system message
before it); a turn's Hermes tool calls become `CallToolAction`s (an `MCPEnvironment`'s tools)
answered as tool messages, and a turn without calls becomes the environment's own action (the
text in `action_field`), whose observation is the next user message, until one is `done`. The
reward is the sum of the observations' (scored by the environment's `rubric` where missing).

`env.kwargs`: `env` (`module:Class` or `module:function` making the environment, with
`env_kwargs`), `action` (`module:Class`, default the environment's declared action type),
`action_field` (default: the action's one required `str` field), `observation_field` (the
observation's text; default: its one `str` field besides the base ones, else all its own
fields as JSON).
"""

from __future__ import annotations

import json
import time
import typing
from collections.abc import Mapping
from typing import Any

from rlvr_jax.envs.base import Message, Step
from rlvr_jax.envs.chat import ToolCall, parse_tool_calls

_BASE_FIELDS = {"done", "reward", "metadata"}


def _import(ref: str, key: str) -> Any:
    from rlvr_jax.models.bootstrap import resolve_function

    return resolve_function(ref, f"env.kwargs.{key}")


def _declared_action(env: Any) -> type | None:
    """The `Action` type of `Environment[Action, Observation, State]` in the env's bases."""
    from openenv.core.env_server.types import Action

    for cls in type(env).__mro__:
        for base in getattr(cls, "__orig_bases__", ()):
            for arg in typing.get_args(base):
                if isinstance(arg, type) and issubclass(arg, Action) and arg is not Action:
                    return arg
    return None


def _text_field(model: type, given: str | None, what: str) -> str:
    if given is not None:
        if given not in model.model_fields:
            raise ValueError(f"env.kwargs.{what}: {model.__name__} has no field {given!r}")
        return given
    names = [
        n
        for n, f in model.model_fields.items()
        if f.annotation is str and n not in _BASE_FIELDS and f.is_required()
    ]
    if len(names) != 1:
        raise ValueError(
            f"env.kwargs.{what}: name the field of {model.__name__} that holds the text "
            f"(its required str fields: {names})"
        )
    return names[0]


def _result_text(result: Any) -> str:
    """An MCP tool result (`CallToolResult` or a plain value) as text."""
    content = getattr(result, "content", None)
    if isinstance(content, list):
        return "\n".join(getattr(c, "text", str(c)) for c in content)
    return result if isinstance(result, str) else json.dumps(result, default=str)


class OpenEnvEnv:
    """One episode of an openenv environment (see the module docstring)."""

    def __init__(
        self,
        env: str,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        action: str | None = None,
        action_field: str | None = None,
        observation_field: str | None = None,
    ):
        from openenv.core.env_server.mcp_environment import MCPEnvironment
        from openenv.core.env_server.mcp_types import ListToolsAction

        self.env = _import(env, "env")(**dict(env_kwargs or {}))
        self.action = _import(action, "action") if action else _declared_action(self.env)
        self.action_field = (
            _text_field(self.action, action_field, "action_field") if self.action else None
        )
        self.observation_field = observation_field
        self.tools: list[dict[str, Any]] = []
        if isinstance(self.env, MCPEnvironment):
            listed = self.env.step(ListToolsAction())
            self.tools = [
                {"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.input_schema}}
                for t in listed.tools
            ]  # fmt: skip
        if self.action is None and not self.tools:
            raise ValueError(
                f"env.kwargs.action: {type(self.env).__name__} declares no Action type; name "
                "the action class its step() takes"
            )

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        observation = self.env.reset(seed=int(row.get("index", 0)))
        prompt = row.get("prompt")
        system = (
            [{"role": "system", "content": prompt}] if isinstance(prompt, str) and prompt else []
        )
        return [*system, {"role": "user", "content": self._text(observation)}]

    def step(self, assistant_text: str) -> Step:
        from openenv.core.env_server.mcp_types import CallToolAction

        calls = parse_tool_calls(assistant_text) if self.tools else []
        if calls:
            messages, reward, errors, seconds, done = [], 0.0, 0, 0.0, False
            for call in calls:
                start = time.perf_counter()
                if isinstance(call, ToolCall):
                    action = CallToolAction(tool_name=call.name, arguments=call.arguments)
                    obs = self.env.step(action)
                    reward += float(obs.reward or 0.0)  # the rubric scores the env's actions
                    done = done or bool(obs.done)
                    error = obs.error.message if obs.error is not None else None
                    text = f"error: {error}" if error else _result_text(obs.result)
                    name = call.name
                else:
                    text, error, name = f"error: {call}", call, "error"
                seconds += time.perf_counter() - start
                errors += error is not None
                messages.append({"role": "tool", "name": name, "content": text})
            info = {"tool_calls": len(calls), "tool_errors": errors, "tool_latency_s": seconds}
            return Step(None if done else messages, reward, done, info)
        if self.action is None:  # a tool environment without an action: the reply ends it
            return Step(None, 0.0, True, {})
        action = self.action(**{self.action_field: assistant_text})
        obs = self.env.step(action)
        reward = self._reward(action, obs)
        if obs.done:
            return Step(None, reward, True, {})
        return Step([{"role": "user", "content": self._text(obs)}], reward, False, {})

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()

    def _reward(self, action: Any, observation: Any) -> float:
        if observation.reward is not None:
            return float(observation.reward)
        rubric = getattr(self.env, "rubric", None)
        if rubric is None:
            return 0.0
        value = rubric(action, observation)
        if hasattr(value, "__await__"):
            from openenv.core.utils import run_async_safely

            value = run_async_safely(value)
        return float(value)

    def _text(self, observation: Any) -> str:
        own = {k: v for k, v in observation.model_dump().items() if k not in _BASE_FIELDS}
        if self.observation_field is not None:
            if self.observation_field not in own:
                raise ValueError(
                    f"env.kwargs.observation_field: {type(observation).__name__} has no field "
                    f"{self.observation_field!r} (fields: {sorted(own)})"
                )
            return str(own[self.observation_field])
        texts = [v for v in own.values() if isinstance(v, str)]
        return texts[0] if len(texts) == 1 else json.dumps(own, default=str)
