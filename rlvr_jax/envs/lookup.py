"""The `lookup` tool: a table the prompt never shows, so only the tool knows the answer.

`TABLE` maps 400 keys to three-digit codes drawn from a seeded generator (`TABLE_SEED`), so a
model can only look them up or memorise them. Each key is two of the 20 `SYLLABLES`, which the
demo tokenizer holds as exactly two tokens both inside a prompt's `"..."` and a tool call's
JSON. `rlvr_jax.demo.tool_use` builds the task rows and traces on this table.
"""

from __future__ import annotations

import numpy as np

SYLLABLES = (
    "ac", "age", "ain", "ar", "ate", "be", "bo", "ch", "in", "ing",
    "joy", "ke", "li", "ly", "or", "ou", "ple", "res", "th", "ut",
)  # fmt: skip
"""Every concatenation of two of these is two tokens of the demo tokenizer (tested)."""

TABLE_SEED = 36
KEYS: tuple[str, ...] = tuple(a + b for a in SYLLABLES for b in SYLLABLES)


def _codes() -> dict[str, int]:
    rng = np.random.default_rng(TABLE_SEED)
    return dict(zip(KEYS, (int(c) for c in rng.integers(100, 1000, len(KEYS)))))


TABLE: dict[str, int] = _codes()
"""key → its code (100-999)."""


def lookup(key: str) -> str:
    """Look up the code of a key in the table.

    Args:
      key: the key, e.g. "joyate".
    """
    if key not in TABLE:
        raise ValueError(f"no key {key!r} in the table")
    code = TABLE[key]
    return str(code)
