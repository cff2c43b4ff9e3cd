"""`import rlvr_jax` (and its light subpackages) must not pull TensorFlow, JetStream, torch or vLLM."""

import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("tensorflow", "jetstream", "torch", "vllm", "tensorflow_datasets")
LIGHT = [
    "rlvr_jax",
    "rlvr_jax.config",
    "rlvr_jax.cli",
    "rlvr_jax.models",
    "rlvr_jax.sharding",
    "rlvr_jax.losses",
    "rlvr_jax.rewards",
    "rlvr_jax.data",
]


@pytest.mark.parametrize("module", LIGHT)
def test_import_is_light(module):
    code = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "", f"{module} imported {out.stdout.strip()}"


def test_tiny_run_reward_workers_stay_light():
    """Every reward worker of a `tiny_run` (a fresh process) imports helpers_train for its
    verifier `word_parity`; jax there would cost each worker's start ~1 s of CPU."""
    code = "import sys, helpers_train; print('jax' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "False", "helpers_train imports jax at the top"
