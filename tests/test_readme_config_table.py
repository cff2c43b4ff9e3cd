"""The README's config-key table is the one the schema generates (scripts/config_docs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_config_table_is_current():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "config_docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
