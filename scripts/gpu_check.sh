#!/usr/bin/env bash
# The GPU check: one command for the first H100/H200 lent (issue 24; parts, caps and outputs
# in docs/gpu_check.md). On the GPU machine, from the repository root:
#     bash scripts/gpu_check.sh                  # JSON + summary + log under $OUT (or --out DIR)
#     bash scripts/gpu_check.sh --only parity,learner --budget 200
# On a CPU, every part tiny (CI runs it; under 3 minutes):
#     bash scripts/gpu_check.sh --cpu-smoke --out /tmp/gpu_check
# It installs nothing: the project is imported from this working tree (PYTHONPATH) with the
# image's python3 (jax with the CUDA plugin, torch, transformers, flax, optax, orbax). Carry
# list: qwix, decode-profile's int8 engine (WHEELS in scripts/gpu_check.py): carry its wheel in
# .whl/ and install it first as /work/.library/device/README.md says. TensorFlow, JetStream,
# tensorboardX, langdetect, vLLM and TRL are not imported (`--cpu-smoke` runs with them made
# unimportable, see ABSENT in scripts/gpu_check.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# JAX must not take 75% of the GPU up front: transformers' generate shares the device
export XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
