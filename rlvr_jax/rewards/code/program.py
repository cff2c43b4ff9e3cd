"""Extracting the program from a model response.

The program is the last ```python (or ```py / ```python3) fenced block; failing that, the last
fenced block without a language tag; failing both, the whole text. Fences are Markdown fences:
a line that starts with three backticks (indentation allowed) opens a block, the next such line
closes it. Only the text after the last `</think>` is searched when the response has one, so code
drafted while thinking does not shadow the answer. A python block still open at the end of the
text (a truncated response) is used when no block is complete.
"""

from __future__ import annotations

from dataclasses import dataclass

PYTHON_TAGS = frozenset({"python", "py", "python3"})
_FENCE = "```"
_THINK_END = "</think>"


@dataclass(frozen=True)
class FencedBlock:
    """One fenced block of a Markdown text."""

    tag: str
    """The info string after the opening fence, lower-cased ("" when untagged)."""
    body: str
    closed: bool


def fenced_blocks(text: str) -> list[FencedBlock]:
    """The fenced blocks of `text`, in order (the last one may be unclosed)."""
    blocks: list[FencedBlock] = []
    tag: str | None = None
    body: list[str] = []
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if tag is None:
            if stripped.startswith(_FENCE):
                tag, body = stripped[len(_FENCE) :].strip().lower(), []
        elif stripped.startswith(_FENCE):
            blocks.append(FencedBlock(tag, "".join(body), closed=True))
            tag = None
        else:
            body.append(line)
    if tag is not None:
        blocks.append(FencedBlock(tag, "".join(body), closed=False))
    return blocks


def extract_program(response: str) -> str:
    """The program in `response` (see the module docstring); never raises on a str."""
    text = response.rsplit(_THINK_END, 1)[-1]
    blocks = fenced_blocks(text)
    closed = [block for block in blocks if block.closed]
    for wanted in (lambda tag: tag in PYTHON_TAGS, lambda tag: tag == ""):
        matching = [block for block in closed if wanted(block.tag)]
        if matching:
            return matching[-1].body
    if blocks and not blocks[-1].closed and blocks[-1].tag in PYTHON_TAGS:
        return blocks[-1].body
    return text
