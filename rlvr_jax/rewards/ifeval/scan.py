"""Linear-time scans equal to three of the reference's regular expressions.

The reference counts placeholders with `re.findall(r"\\[.*?\\]")`, bullets with
`re.findall(r"^\\s*\\*[^\\*].*$", flags=re.MULTILINE)` (and `^\\s*-.*$`) and finds titles with
`re.findall(r"<<[^\\n]+>>")`. On degenerate model output (thousands of "[", blank lines or "<<",
common when a policy collapses) backtracking makes these quadratic: seconds per response at
30k characters. These scans give the same matches in one pass.
"""

from __future__ import annotations

import re

_NON_SPACE = re.compile(r"\S")


def count_placeholders(text: str) -> int:
    """Number of matches of `\\[.*?\\]`: a "[" closed by a "]" later on the same line."""
    count, position = 0, 0
    while (start := text.find("[", position)) != -1:
        line_end = text.find("\n", start)
        line_end = len(text) if line_end == -1 else line_end
        close = text.find("]", start + 1, line_end)
        if close == -1:  # no "[" later on this line can close either
            position = line_end
        else:
            count += 1
            position = close + 1
    return count


def _line_end(text: str, start: int) -> int:
    """Index of the first newline at or after `start`, or len(text)."""
    end = text.find("\n", start)
    return len(text) if end == -1 else end


def count_bullets(text: str) -> int:
    """Matches of `^\\s*\\*[^\\*].*$` plus matches of `^\\s*-.*$`, both multi-line.

    From a line start, `\\s*` skips whitespace (newlines included) to the first visible
    character; a star bullet is a "*" followed by any character but "*" (a newline too, in
    which case the match runs to the end of the next line); a dash bullet is a "-". A match
    ends at the end of its line and the next one can only start on a later line.
    """
    total = 0
    for marker in "*-":
        line_start, visible = 0, -1
        while line_start <= len(text):
            if visible < line_start:  # lines inside one whitespace run share their target
                found = _NON_SPACE.search(text, line_start)
                visible = found.start() if found else len(text)
            rest = visible + 1  # where `.*` starts for a dash bullet
            is_bullet = text[visible : visible + 1] == marker
            if is_bullet and marker == "*":
                is_bullet = text[rest : rest + 1] not in ("", "*")
                rest += 1
            line_start = _line_end(text, rest if is_bullet else line_start) + 1
            total += is_bullet
    return total


def titles(text: str) -> list[str]:
    """Matches of `<<[^\\n]+>>`: per line, from the first "<<" to the last ">>" after it."""
    found = []
    for line in text.split("\n"):
        first, last = line.find("<<"), line.rfind(">>")
        if first != -1 and last >= first + 3:  # at least one character inside
            found.append(line[first : last + 2])
    return found
