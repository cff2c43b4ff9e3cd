#!/usr/bin/env bash
# The test command: installs the dev dependencies into .venv (once), runs ruff (lint and format
# check) and the whole pytest suite, slow tests included, on two pytest-xdist workers (a test
# file stays on one worker: its module fixtures are built once). Extra arguments go to pytest
# (`-n 0` runs everything in this process).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/setup_env.sh
echo "[test] ruff check"
ruff check .
echo "[test] ruff format --check"
ruff format --check .
echo "[test] pytest"
python -m pytest -q -n "${RLVR_TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
