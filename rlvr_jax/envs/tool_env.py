"""`ToolEnv` (`env.name: tools`): the model answers a data row's prompt and may call tools
on the way. Each assistant turn is parsed for Hermes tool calls (`chat.parse_tool_calls`):
none ends the episode (the turn is the final answer the row's verifier scores); otherwise
every call runs (`tools.call_tool`, bounded by `env.tool_timeout_s`) and its result — or
the error of a malformed call, an unknown tool, bad arguments, an exception or a timeout —
comes back as a `tool` message, and the model takes another turn. Tool errors never end
the episode; the model sees them and may try again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlvr_jax.envs.base import Message, Step
from rlvr_jax.envs.chat import ToolCall, parse_tool_calls
from rlvr_jax.envs.tools import call_tool, resolve_tool


class ToolEnv:
    """An episode with `tools` (built-in names, `module:function` or functions), an optional
    `system` message, each call bounded by `timeout_s` and its result cut to
    `max_output_chars`."""

    def __init__(
        self,
        tools: Sequence[Any] = ("python", "calculator"),
        *,
        system: str | None = None,
        timeout_s: float = 10.0,
        max_output_chars: int = 2000,
    ):
        resolved = [resolve_tool(t) for t in tools]
        self._tools = {t.name: t for t in resolved}
        self.tools = [t.schema for t in resolved]
        self.system, self.timeout_s, self.max_output_chars = system, timeout_s, max_output_chars

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        prompt = row["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        return [*system, *(dict(m) for m in messages)]

    def step(self, assistant_text: str) -> Step:
        calls = parse_tool_calls(assistant_text)
        if not calls:
            return Step(None, 0.0, True, {})
        observation, errors, seconds = [], 0, 0.0
        for call in calls:
            text, ok, took = self._run(call)
            seconds += took
            errors += not ok
            name = call.name if isinstance(call, ToolCall) else "error"
            observation.append({"role": "tool", "name": name, "content": text})
        info = {"tool_calls": len(calls), "tool_errors": errors, "tool_latency_s": seconds}
        return Step(observation, 0.0, False, info)

    def _run(self, call: ToolCall | str) -> tuple[str, bool, float]:
        if isinstance(call, str):
            return f"error: {call}", False, 0.0
        tool = self._tools.get(call.name)
        if tool is None:
            return f"error: no tool named {call.name!r} (tools: {sorted(self._tools)})", False, 0.0
        text, ok, seconds = call_tool(tool, call.arguments, self.timeout_s)
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + " [cut]"
        return text, ok, seconds
