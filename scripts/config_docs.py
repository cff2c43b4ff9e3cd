"""Regenerates the config-key table of docs/config.md from the schema's field docstrings.

Usage: python scripts/config_docs.py [--check]   (--check exits 1 when the table is stale)
"""

import sys
from pathlib import Path

from rlvr_jax.config import describe

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"
START, END = "<!-- config-keys:start -->", "<!-- config-keys:end -->"


def table() -> str:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, tp, default, doc in describe():
        cells = [c.replace("|", "\\|") for c in (tp, default)]  # pipes in a cell are escaped
        rows.append(
            f"| `{key}` | `{cells[0]}` | `{cells[1]}` | {doc.replace('|', chr(92) + '|')} |"
        )
    return "\n".join(rows)


def render(text: str) -> str:
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main() -> int:
    text = DOC.read_text()
    if START not in text or END not in text:
        print(f"{DOC}: markers {START} / {END} missing", file=sys.stderr)
        return 1
    new = render(text)
    if "--check" in sys.argv:
        if new != text:
            print(
                f"{DOC}: config table is stale: run python scripts/config_docs.py", file=sys.stderr
            )
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
