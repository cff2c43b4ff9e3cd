#!/usr/bin/env bash
# Creates (or reuses) the project's virtualenv at $RLVR_VENV (default .venv) and installs the
# package with its dev extras. Idempotent: skipped when setup.py has not changed since the last
# successful install. Source it: `source scripts/setup_env.sh`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RLVR_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtualenv at $VENV"
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.rlvr_installed"
WANT="$(cat "$ROOT/setup.py" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "[setup] installing rlvr_jax[dev] (first run takes a few minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # torch is pinned to the CPU wheel this machine carries; any other spec pulls CUDA builds.
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  "$VENV/bin/python" -m pip install -q -e "$ROOT[dev]"
  # The IFEval reference implementation, only for the tests that compare against it; its own
  # dependency tree (datasets, pandas, ...) is not needed for those files.
  "$VENV/bin/python" -m pip install -q --no-deps "lm-eval==0.4.13"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
