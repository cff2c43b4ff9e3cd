"""Final-answer extraction from a model response.

Order: drop the reasoning (`<think>` blocks), then take the last brace-matched `\\boxed{...}` /
`\\fbox{...}`, else the last `<answer>...</answer>`, else the text after the last "final answer
is" / "final answer:", else after the last GSM8K-style "####", else after the last "answer is" /
"Answer:", else the fallback ("last_number": the last number in the text; "none": no answer).
Everything here is linear-time string scanning (no backtracking regular expressions on the raw
response).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal

Fallback = Literal["last_number", "none"]
FALLBACKS: tuple[str, ...] = ("last_number", "none")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

_PHRASES = (
    re.compile(r"final answer\s*(?:is|:)", re.IGNORECASE),
    re.compile(r"####"),
    re.compile(r"answer\s*(?:is|:)", re.IGNORECASE),
)
_THINK_TAG = re.compile(rf"{re.escape(THINK_OPEN)}|{re.escape(THINK_CLOSE)}")
_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])(?P<space> *)")
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:\s*/\s*\d+)?")


def _braces(text: str, start: int = 0) -> Iterator[tuple[int, str]]:
    """(index, "{" or "}") of each brace from `start` on; escaped `\\{`/`\\}` are skipped."""
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "{}":
            yield i, ch
        i += 1


def match_brace(text: str, open_idx: int) -> int | None:
    """Index of the `}` closing the `{` at `open_idx` (escaped `\\{`/`\\}` skipped), or None."""
    if open_idx >= len(text) or text[open_idx] != "{":
        raise ValueError(f"no '{{' at index {open_idx}")
    depth = 0
    for i, ch in _braces(text, open_idx):
        depth += 1 if ch == "{" else -1
        if depth == 0:
            return i
    return None


def strip_think(response: str) -> str | None:
    """Removes reasoning: complete `<think>...</think>` blocks, and everything before a closing
    tag whose opening was in the prompt. Returns None when a `<think>` is never closed (the
    model did not finish thinking, so it gave no answer)."""
    out: list[str] = []
    pos, open_at = 0, None
    for tag in _THINK_TAG.finditer(response):
        if tag.group() == THINK_OPEN:
            if open_at is None:  # a nested opening inside a block changes nothing
                out.append(response[pos : tag.start()])
                open_at = tag.start()
        else:
            if open_at is None:
                out.clear()  # an unmatched close: the block started in the prompt
            open_at, pos = None, tag.end()
    if open_at is not None:
        return None
    out.append(response[pos:])
    return "".join(out)


def _closing_braces(text: str) -> dict[int, int]:
    """Index of each `{` → index of its matching `}` (escaped braces skipped), in one pass."""
    stack: list[int] = []
    closes: dict[int, int] = {}
    for i, ch in _braces(text):
        if ch == "{":
            stack.append(i)
        elif stack:
            closes[stack.pop()] = i
    return closes


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` / `\\fbox{...}` (or `\\boxed 5`), or None."""
    closes: dict[int, int] | None = None
    for m in reversed(list(_BOX.finditer(text))):
        j = m.end()
        if j < len(text) and text[j] == "{":
            closes = _closing_braces(text) if closes is None else closes
            if j in closes:
                return text[j + 1 : closes[j]]
        elif m.group("space"):  # `\boxed 5`: up to the next space or `$`
            k = j
            while k < len(text) and not text[k].isspace() and text[k] != "$":
                k += 1
            if k > j:
                return text[j:k]
    return None


def last_tagged(text: str) -> str | None:
    """Content of the last complete `<answer>...</answer>`, or None."""
    close = text.rfind(ANSWER_CLOSE)
    if close < 0:
        return None
    start = text.rfind(ANSWER_OPEN, 0, close)
    return None if start < 0 else text[start + len(ANSWER_OPEN) : close]


def _after_phrase(text: str) -> str | None:
    for pattern in _PHRASES:
        last = None
        for last in pattern.finditer(text):  # noqa: B007 (only the last match matters)
            pass
        if last is None:
            continue
        rest = text[last.end() :].lstrip(" \t:*")
        line = rest.split("\n", 1)[0].strip()
        if line.startswith("$"):  # "... is $\frac{1}{2}$. I hope it is correct."
            body = line.lstrip("$")
            close = body.find("$")
            if close > 0:
                return body[:close].strip()
        line = line.rstrip(" .*")
        if line:
            return line
    return None


def last_number(text: str) -> str | None:
    """The last number in `text` (integer, decimal, thousands-separated or a/b), or None."""
    found = None
    for found in _NUMBER.finditer(text):  # noqa: B007 (only the last match matters)
        pass
    return None if found is None else found.group(0)


def extract_answer(response: str, *, fallback: Fallback = "last_number") -> str | None:
    """The final answer in a response, by the order in the module docstring; None if absent."""
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    text = strip_think(response)
    if text is None:
        return None
    for find in (last_boxed, last_tagged, _after_phrase):
        found = find(text)
        if found is not None and found.strip():
            inner = last_boxed(found)  # e.g. <answer>... \boxed{5}</answer>
            return (inner if inner is not None else found).strip()
    return last_number(text) if fallback == "last_number" else None
