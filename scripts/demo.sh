#!/usr/bin/env bash
# The embedded demo: sets up .venv (skipped when already done), then evaluates the tiny base
# model (pass@1 / pass@8 from 8 samples per prompt at T=1 on the held-out split), trains it with
# RL (olmo3 preset, async rollouts, progress bar), evaluates again, and writes
# runs/demo/report.json and runs/demo/report.png. Extra arguments are config overrides.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/setup_env.sh
python -m rlvr_jax.demo.pipeline --config configs/demo.yaml "$@"
