"""The embedded demo: its task cut and pretraining corpus (`corpus`), its tiny base model
(`base_model`), and the tool-use task with its tool-calling warm start (`tool_use`). Names
below are imported from their module on first use, so importing this package is light (and
`python -m rlvr_jax.demo.corpus` runs the module once).

    model.create_if_missing: rlvr_jax.demo:build_demo_base     (configs/demo.yaml)
    model.create_if_missing: rlvr_jax.demo:build_tool_base     (configs/tool_use.yaml)
    python scripts/pretrain_tiny.py --out rlvr_jax/demo/assets/base
    python -m rlvr_jax.demo.corpus --out data/demo --train 2000 --test 256
    python -m rlvr_jax.demo.tool_use --out data/tool_use
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DEMO_RECIPE": "rlvr_jax.demo.base_model",
    "SHIPPED_DIR": "rlvr_jax.demo.base_model",
    "PretrainRecipe": "rlvr_jax.demo.base_model",
    "build_demo_base": "rlvr_jax.demo.base_model",
    "build_tool_base": "rlvr_jax.demo.tool_use",
    "pretrain": "rlvr_jax.demo.base_model",
    "shipped_mismatch": "rlvr_jax.demo.base_model",
    "DEMO_DOMAINS": "rlvr_jax.demo.corpus",
    "StyleMix": "rlvr_jax.demo.corpus",
    "demo_rows": "rlvr_jax.demo.corpus",
    "write_splits": "rlvr_jax.demo.corpus",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlvr_jax.demo' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
