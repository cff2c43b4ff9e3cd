"""Tool calling on `/v1/chat/completions`: the `tools` and `tool_choice` fields, the
conversation's tool messages, and `tool_calls` in answers (plain and streamed).

The prompt is rendered with `rlvr_jax.envs.ChatFormat` (Hermes `<tool_call>{json}</tool_call>`
for an assistant's `tool_calls`); the sampled text is parsed with `envs.parse_tool_calls`:
well-formed calls become `tool_calls` (content = the text before them, or null;
`finish_reason: "tool_calls"`), a malformed one stays text. `tool_choice`: "auto", "none" (no
tools offered), "required" or a named function, for which the turn starts with `<tool_call>`
(and the name) already written (no grammar constrains the arguments). Streaming holds back
what could start `<tool_call>` and sends the calls in one chunk at the end.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from rlvr_jax.envs.chat import ToolCall, parse_tool_calls

OPEN = "<tool_call>"


class ToolError(ValueError):
    """A bad `tools` / `tool_choice` / message field; `param` names it (HTTP 400)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclasses.dataclass(frozen=True)
class ToolRequest:
    """The tools of one chat request."""

    tools: list[dict[str, Any]]
    prefix: str = ""
    """Text the assistant turn starts with (`tool_choice` required or named)."""


def parse_tools(body: dict) -> ToolRequest | None:
    """The request's tools (None: none offered, or `tool_choice: "none"`)."""
    tools, choice = body.get("tools"), body.get("tool_choice", "auto")
    if tools is None:
        if choice not in ("auto", "none", None):
            raise ToolError("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list) or not tools:
        raise ToolError("'tools' must be a non-empty list", "tools")
    names = []
    for tool in tools:
        f = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(f, dict) or not f.get("name"):
            raise ToolError("each tool must be {type: function, function: {name, ...}}", "tools")
        names.append(f["name"])
    tools = [{"type": "function", "function": {"description": "", **t["function"]}} for t in tools]
    for t in tools:
        t["function"].setdefault("parameters", {"type": "object", "properties": {}})
    if choice in ("auto", None):
        return ToolRequest(tools)
    if choice == "none":
        return None
    if choice == "required":
        return ToolRequest(tools, OPEN)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if name not in names:
        raise ToolError(
            f"'tool_choice' must be auto, none, required or a function of 'tools' {names}",
            "tool_choice",
        )
    return ToolRequest(tools, f'{OPEN}{{"name": {json.dumps(name)}, "arguments": ')


def template_messages(messages: Any) -> list[dict[str, Any]]:
    """Chat messages for the template: an assistant's `tool_calls` as Hermes text after its
    content, a `tool` message's content as its response. Raises ToolError."""
    if not isinstance(messages, list) or not messages:
        raise ToolError("'messages' must be a non-empty list", "messages")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ToolError("each message needs a 'role'", "messages")
        content = m.get("content") or ""
        if not isinstance(content, str):
            raise ToolError("message content must be a string or null", "messages")
        for call in m.get("tool_calls") or ():
            f = call.get("function", {}) if isinstance(call, dict) else {}
            try:
                arguments = json.loads(f.get("arguments") or "{}")
            except json.JSONDecodeError:
                raise ToolError("tool_calls arguments must be a JSON string", "messages") from None
            content += f"{OPEN}{json.dumps({'name': f.get('name'), 'arguments': arguments})}"
            content += "</tool_call>"
        out.append({"role": m["role"], "content": content})
    return out


def split_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI `tool_calls`) of an answer's text; no calls: (text, [])."""
    calls = parse_tool_calls(text)
    if not calls or not all(isinstance(c, ToolCall) for c in calls):
        return text, []
    content = text[: text.index(OPEN)].strip() or None
    return content, [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in calls
    ]


class ToolStream:
    """One streamed choice's text under tools: `content(new)` is what may be shown now
    (nothing from the first `<tool_call>` on, and not a tail that could start one);
    `finish()` the rest and the calls."""

    def __init__(self, prefix: str):
        self.text, self.shown = prefix, 0

    def content(self, new: str) -> str:
        self.text += new
        end = self.text.find(OPEN)
        if end < 0:
            end = len(self.text)
            for k in range(min(len(OPEN) - 1, len(self.text)), 0, -1):
                if OPEN.startswith(self.text[-k:]):
                    end -= k
                    break
        out, self.shown = self.text[self.shown : max(end, self.shown)], max(end, self.shown)
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        _, calls = split_calls(self.text)
        if calls:
            return "", calls
        rest, self.shown = self.text[self.shown :], len(self.text)
        return rest, []


def prompt_ids(body: dict, tokenizer: Any, tools: ToolRequest | None) -> list[int]:
    """The prompt of a chat request with tools (or tool messages): the template's rendering
    with `tools`, and the forced start of the assistant turn."""
    from rlvr_jax.envs.chat import ChatFormat

    try:
        chat = ChatFormat(tokenizer, tools.tools if tools else ())
        text = chat.render(template_messages(body.get("messages")), add_generation_prompt=True)
    except ValueError as e:
        raise ToolError(str(e), "messages") from None
    return chat.encode(text + (tools.prefix if tools else ""))
