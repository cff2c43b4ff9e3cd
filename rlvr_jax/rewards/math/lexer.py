"""Tokenizer of normalised LaTeX answers for `parse` (bounded: length and token count)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlvr_jax.rewards.math.values import ParseError

MAX_CHARS = 2000
"""Longest normalised answer that is parsed at all."""
MAX_TOKENS = 600
"""Most tokens in one answer."""
_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?|\.\d+)"
    r"|\\begin\{(?P<begin>[a-zA-Z*]+)\}|\\end\{(?P<end>[a-zA-Z*]+)\}"
    r"|(?P<cmd>\\[a-zA-Z]+|\\[{}|\\])"
    r"|(?P<word>[a-zA-Z]+)"
    r"|(?P<sym>[-+*/^_()\[\]{},=<>!|&']))"
)


@dataclass(frozen=True)
class Tok:
    """One token: its kind and its text."""

    kind: str  # num | begin | end | cmd | word | sym
    text: str


def tokenize(text: str) -> list[Tok]:
    """Splits a normalised answer into tokens; unknown characters are a ParseError."""
    if len(text) > MAX_CHARS:
        raise ParseError(f"answer longer than {MAX_CHARS} characters")
    tokens: list[Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise ParseError(f"unexpected character {text[pos]!r} at {pos}")
        kind = m.lastgroup or ""
        tokens.append(Tok(kind, m.group(kind)))
        pos = m.end()
        if len(tokens) > MAX_TOKENS:
            raise ParseError(f"more than {MAX_TOKENS} tokens")
    return tokens
