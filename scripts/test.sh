#!/usr/bin/env bash
# The test command: installs the dev dependencies into .venv (once), runs ruff (lint and format
# check) and the whole pytest suite, slow tests included. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/setup_env.sh
echo "[test] ruff check"
ruff check .
echo "[test] ruff format --check"
ruff format --check .
echo "[test] pytest"
python -m pytest -q --durations=25 "$@"
