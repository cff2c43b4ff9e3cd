"""docs/config.md's config-key table is the one the schema generates (scripts/config_docs.py), the
README links to it, and every relative link of the README and docs/ leads somewhere."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def test_readme_config_table_is_current():
    """The table the README links to (docs/config.md) matches the schema's docstrings."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "config_docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr


def test_readme_links_the_config_table_and_holds_no_copy():
    readme = (ROOT / "README.md").read_text()
    assert "](docs/config.md)" in readme
    assert "<!-- config-keys:start -->" not in readme  # one home: docs/config.md


def _anchors(md: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    out: set[str] = set()
    for line in FENCE.sub("", md).splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n, base = 1, slug
            while slug in out:
                slug, n = f"{base}-{n}", n + 1
            out.add(slug)
    return out


def _broken_links(path: Path) -> list[str]:
    bad = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
            bad.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    return bad


def test_readme_and_docs_links_resolve():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    bad = [b for page in pages for b in _broken_links(page)]
    assert not bad, "\n".join(bad)


def test_anchor_slugs_follow_github():
    # Hand-derived: backticks and punctuation go, spaces become hyphens, repeats get -1.
    md = "# Serving (`rlvr-serve`)\n## Limitations\n## Limitations\n```\n# not a heading\n```\n"
    assert _anchors(md) == {"serving-rlvr-serve", "limitations", "limitations-1"}
