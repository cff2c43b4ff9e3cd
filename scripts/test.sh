#!/usr/bin/env bash
# The test command: installs the dev dependencies into .venv (once), runs ruff (lint and format
# check) and pytest on two pytest-xdist workers (a test file stays on one worker: its module
# fixtures are built once).
#
#   bash scripts/test.sh          the whole suite, slow tests included: what CI runs (15 min here, warm XLA cache)
#   bash scripts/test.sh --fast   the fast tier, for between edits (under 5 min on two cores):
#                                 every test not marked `slow` (the unit tests) and one smoke
#                                 test per subsystem (`smoke` marker); a test there that takes
#                                 over 5 s fails, naming itself (tests/conftest.py explains the
#                                 tiers and how a test's time is counted)
#
# `--fast` is taken by this script; every other argument goes to pytest (`-n 0` runs
# everything in this process, `-k NAME` picks tests).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TIER=()
ARGS=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then TIER=(--fast); else ARGS+=("$arg"); fi
done
source scripts/setup_env.sh
echo "[test] ruff check"
ruff check .
echo "[test] ruff format --check"
ruff format --check .
echo "[test] pytest ${TIER[*]:-(the whole suite)}"
python -m pytest -q -n "${RLVR_TEST_WORKERS:-2}" --dist loadfile --durations=25 \
  ${TIER[@]+"${TIER[@]}"} ${ARGS[@]+"${ARGS[@]}"}
