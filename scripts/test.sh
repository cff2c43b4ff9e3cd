#!/usr/bin/env bash
# The test command: installs the dev dependencies into .venv (once), runs ruff (lint and format
# check) and pytest on two pytest-xdist workers (a test file stays on one worker: its module
# fixtures are built once).
#
#   bash scripts/test.sh          the whole suite, slow tests included, then the vLLM tier: what CI
#                                 runs (15 min here, warm XLA cache, + the vLLM tier below)
#   bash scripts/test.sh --fast   the fast tier, for between edits (under 5 min on two cores):
#                                 every test not marked `slow` (the unit tests) and one smoke
#                                 test per subsystem (`smoke` marker); a test there that takes
#                                 over 5 s fails, naming itself (tests/conftest.py explains the
#                                 tiers and how a test's time is counted)
#
# The vLLM tier (tests marked `vllm`: rollout.backend: vllm on vLLM's CPU build) runs after the
# whole suite in its own venv, $RLVR_VLLM_VENV (default .venv-vllm; `scripts/setup_env.sh --vllm`:
# 12 min the first time here, loaded); the suite itself runs without vLLM. `--no-vllm` skips the tier,
# `--vllm-only` runs it alone; `--fast` skips it.
#
# `--fast`, `--no-vllm` and `--vllm-only` are taken by this script; every other argument goes to
# pytest (`-n 0` runs everything in this process, `-k NAME` picks tests).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TIER=()
ARGS=()
VLLM_TIER=1
MAIN=1
for arg in "$@"; do
  case "$arg" in
    --fast) TIER=(--fast); VLLM_TIER=0 ;;
    --no-vllm) VLLM_TIER=0 ;;
    --vllm-only) MAIN=0 ;;
    *) ARGS+=("$arg") ;;
  esac
done
if [ "$MAIN" = 1 ]; then
  (
    source scripts/setup_env.sh
    echo "[test] ruff check"
    ruff check .
    echo "[test] ruff format --check"
    ruff format --check .
    echo "[test] pytest ${TIER[*]:-(the whole suite)}"
    python -m pytest -q -n "${RLVR_TEST_WORKERS:-2}" --dist loadfile --durations=25 -m "not vllm" \
      ${TIER[@]+"${TIER[@]}"} ${ARGS[@]+"${ARGS[@]}"}
  )
fi
if [ "$VLLM_TIER" = 1 ]; then
  (
    source scripts/setup_env.sh --vllm
    echo "[test] pytest -m vllm (the vLLM tier, in $(dirname "$(dirname "$(command -v python)")"))"
    python -m pytest -q -n 0 -m vllm --durations=10 ${ARGS[@]+"${ARGS[@]}"}
  )
fi
