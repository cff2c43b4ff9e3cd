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


BENCH_DIRS = [ROOT / "bench_results" / "cpu_2core", ROOT / "bench_results" / "h200"]
BENCH_NAME = re.compile(
    r"\b((?:roofline|decode|learner|e2e|waste|mismatch)[\w\-]*(?:\{[\w,]+\}[\w\-]*)?\.(?:json|png))"
)


def _bench_names(text: str) -> set[str]:
    """Benchmark result files a page names; `decode_{int8,fp8}.json` names both."""
    names = set()
    for name in BENCH_NAME.findall(text):
        if m := re.match(r"(.*)\{([\w,]+)\}(.*)", name):
            names.update(m[1] + alt + m[3] for alt in m[2].split(","))
        else:
            names.add(name)
    return names


def test_bench_results_named_in_docs_exist_and_every_kept_run_is_cited():
    """Every result file the README or docs/ name is in bench_results/, and every file in
    bench_results/cpu_2core/ is named by one of them (older runs stay only where cited)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = set().union(*(_bench_names(p.read_text()) for p in pages))
    kept = {p.name for d in BENCH_DIRS for p in d.rglob("*") if p.is_file()}
    assert not named - kept, f"named but not in bench_results/: {sorted(named - kept)}"
    uncited = {p.name for p in BENCH_DIRS[0].iterdir()} - named
    assert not uncited, f"in bench_results/cpu_2core/ but named nowhere: {sorted(uncited)}"


def test_bench_names_expand_braces():
    assert _bench_names("see `decode_{int8,fp8}.json` and e2e_demo.json, not report.json") == {
        "decode_int8.json",
        "decode_fp8.json",
        "e2e_demo.json",
    }
