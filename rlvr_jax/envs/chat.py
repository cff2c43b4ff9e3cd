"""Conversations as tokens: the chat template with `tools=`, the tool-call format it
declares, and the tokens an observation appends to a sequence the model is writing.

The format is Hermes' (Qwen 2.5/3 and others): the assistant writes one or more
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` and ends its turn; results come back
as `tool` messages (`<tool_response>` in a user turn). A tokenizer whose template renders
`tools` is used as it is; one without gets `TOOL_TEMPLATE`, a compact ChatML template (one line
per tool, so a tiny model's prompt stays short). `ChatFormat.observation_ids` never
re-tokenizes what the model wrote: it renders the conversation with a sentinel for the last
assistant turn and tokenizes only what follows (that turn's end unless it is the sampled stop
token, the observation, the next turn's opener).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

from rlvr_jax.envs.base import Message

TOOL_TEMPLATE = (
    "{% if messages and messages[0].role == 'system' %}{% set system = messages[0].content %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = none %}{% endif %}"
    "{% if system is not none or tools %}{{ '<|im_start|>system\\n' }}"
    "{% if system is not none %}{{ system }}{% if tools %}{{ '\\n' }}{% endif %}{% endif %}"
    "{% if tools %}{{ '<tools>\\n' }}{% for tool in tools %}{% set f = tool.function %}"
    "{{ f.name + '(' + f.parameters.properties | join(', ') + '): ' + f.description + '\\n' }}"
    "{% endfor %}{{ '</tools>' }}{% endif %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}"
    "{% endif %}{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}"
    "{% endif %}{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML with Hermes tool calls, for tokenizers whose own template has no tool support."""

_SENTINEL = "\x00rlvr-assistant-turn\x00"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed call."""

    name: str
    arguments: dict[str, Any]


def parse_tool_calls(text: str) -> list[ToolCall | str]:
    """The Hermes tool calls of an assistant turn, in order: a `ToolCall` for each
    well-formed `<tool_call>{json}</tool_call>`, an error text for each malformed one
    (bad JSON, no name, arguments that are not an object, a `<tool_call>` never closed).
    An empty list: the turn calls no tool (its final answer)."""
    out: list[ToolCall | str] = []
    end = 0
    for match in _CALL.finditer(text):
        out.append(_parse_one(match[1]))
        end = match.end()
    if _OPEN in text[end:]:
        out.append("the <tool_call> is never closed with </tool_call>")
    return out


def _parse_one(body: str) -> ToolCall | str:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return f"the tool call is not valid JSON ({e.msg} at character {e.pos})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'a tool call must be a JSON object with a "name" string'
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return f'the "arguments" of {call["name"]} must be a JSON object'
    return ToolCall(call["name"], arguments)


class ChatFormat:
    """A tokenizer's chat template with the environment's `tools` (see the module docstring).

    Raises ValueError naming the tokenizer when its own tool-aware template does not use
    Hermes' `<tool_call>` format."""

    def __init__(self, tokenizer: Any, tools: Sequence[dict[str, Any]] = ()):
        self.tokenizer, self.tools = tokenizer, list(tools) or None
        own = tokenizer.chat_template or ""
        self.template = own if "tools" in own else TOOL_TEMPLATE
        if self.template is own and _OPEN not in own:
            raise ValueError(
                f"the chat template of tokenizer {tokenizer.name_or_path!r} renders tools but "
                "not in the Hermes <tool_call> format, the one rlvr_jax.envs parses"
            )

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        """The conversation as text."""
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=self.tools,
            chat_template=self.template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """Tokens of the episode's first messages, ready for the first assistant turn."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def observation_ids(
        self, history: Sequence[Message], observation: Sequence[Message], stop_text: str
    ) -> list[int]:
        """Tokens to append after the model's last turn (the last of `history`, which ended
        with the sampled stop token of text `stop_text`, or "" without one) so that the
        sequence continues as the template renders `observation` and the next turn."""
        marked = [*history[:-1], {**history[-1], "content": _SENTINEL}, *observation]
        text = self.render(marked, add_generation_prompt=True)
        tail = text[text.index(_SENTINEL) + len(_SENTINEL) :]
        if stop_text and tail.startswith(stop_text):
            tail = tail[len(stop_text) :]
        return self.encode(tail)
