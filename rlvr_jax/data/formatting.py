"""Prompt templates: how a `PromptRow` becomes the token ids the policy is prompted with.

- `chat`: the tokenizer's own chat template, with the assistant generation prompt appended.
- `r1`: plain text in the DeepSeek-R1-Zero style: an instruction to reason inside
  `<think> </think>` and answer inside `<answer> </answer>`, then `User: ...` and
  `Assistant:` (the completion starts right after it).
- `plain`: the raw prompt text (chat messages' contents joined by blank lines).

`plain` and `r1` text is encoded with the tokenizer's own special-token policy (BOS or none).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlvr_jax.data.rows import PromptRow
from rlvr_jax.data.tokenizer import apply_chat_template

R1_INSTRUCTION = (
    "A conversation between User and Assistant. The User asks a question and the Assistant "
    "solves it. The Assistant first thinks through the reasoning process and then gives the "
    "final answer. The reasoning is enclosed in <think> </think> tags and the answer in "
    "<answer> </answer> tags, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>."
)
"""The system instruction of the `r1` template."""

_R1_SPEAKERS = {"user": "User", "assistant": "Assistant", "tool": "Tool"}


def plain_text(row: PromptRow) -> str:
    """The `plain` template: the prompt text, or the messages' contents joined by blank lines."""
    if isinstance(row.prompt, str):
        return row.prompt
    return "\n\n".join(m["content"] for m in row.prompt)


def r1_text(row: PromptRow) -> str:
    """The `r1` template: instruction, the conversation as `User:`/`Assistant:` lines (system
    messages become extra instruction lines), ending in `Assistant:`."""
    lines = [R1_INSTRUCTION]
    for m in row.messages():
        if m["role"] == "system":
            lines.append(m["content"])
        else:
            lines.append(f"{_R1_SPEAKERS[m['role']]}: {m['content']}")
    lines.append("Assistant:")
    return "\n".join(lines)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=True)]


TEMPLATES: dict[str, Callable[[PromptRow, Any], list[int]]] = {
    "chat": lambda row, tok: apply_chat_template(tok, row.messages(), add_generation_prompt=True),
    "r1": lambda row, tok: _encode(tok, r1_text(row)),
    "plain": lambda row, tok: _encode(tok, plain_text(row)),
}
"""Prompt templates by name (`DataConfig.prompt_template`)."""


def _check_template(template: str) -> None:
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; expected one of {list(TEMPLATES)}")


def format_prompt(row: PromptRow, tokenizer: Any, template: str) -> list[int]:
    """Token ids of `row`'s prompt under `template` (`chat`, `r1` or `plain`)."""
    _check_template(template)
    return TEMPLATES[template](row, tokenizer)


def prompt_length_fn(tokenizer: Any, template: str) -> Callable[[PromptRow], int]:
    """`row -> len(format_prompt(row, tokenizer, template))`, for the sources' length filter."""
    _check_template(template)
    return lambda row: len(format_prompt(row, tokenizer, template))


def prompt_encoder(tokenizer: Any, template: str) -> Callable[[PromptRow], list[int]]:
    """`row -> format_prompt(row, tokenizer, template)`: the sources' `encode` (a row's prompt
    is tokenized once, when its source loads, and kept as `row.prompt_ids`)."""
    _check_template(template)
    return lambda row: format_prompt(row, tokenizer, template)


def prompt_ids(row: PromptRow, tokenizer: Any, template: str) -> list[int]:
    """The row's prompt token ids: those computed when its source loaded, else encoded now."""
    if row.prompt_ids is not None:
        return [int(t) for t in row.prompt_ids]
    return format_prompt(row, tokenizer, template)


RESPONSE_SEPARATORS = {"plain": "\n", "r1": " ", "chat": ""}
"""Text between a prompt (under each template) and its response: an SFT response (and the
demo corpus) starts with it, as the policy's completions do."""


def encode_response(response: str, tokenizer: Any, template: str) -> list[int]:
    """The ids of a response as it follows a `template` prompt: separator, text, EOS id."""
    _check_template(template)
    if tokenizer.eos_token_id is None:
        raise ValueError("a response ends with EOS: the tokenizer has no EOS token")
    text = RESPONSE_SEPARATORS[template] + response
    ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    return [*ids, int(tokenizer.eos_token_id)]


def stop_token_ids(arch: Any, tokenizer: Any, stop_strings: Sequence[str] = ()) -> tuple[int, ...]:
    """The model's and the tokenizer's EOS ids plus each stop string's id (sorted; ValueError
    for a stop string that is not one token): the stop-id rule of training, eval and serving."""
    ids = {int(t) for t in (arch.eos_token_id or ())}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for s in stop_strings:
        toks = tokenizer.encode(s, add_special_tokens=False)
        if len(toks) != 1:
            raise ValueError(f"rollout.stop_strings: {s!r} is not a single token ({toks})")
        ids.add(int(toks[0]))
    return tuple(sorted(ids))
