"""A LoRA policy's adapters as a PEFT adapter directory: `adapter_config.json` and
`adapter_model.safetensors`, which `peft.PeftModel.from_pretrained(base, path)` loads onto the
HF base checkpoint (tests/test_lora.py checks the logits against ours).

PEFT stores `lora_A.weight` [r, in] and `lora_B.weight` [out, r] (scaled by lora_alpha / r)
under `base_model.model.<HF module>`; ours are a [*in, r] and b [r, *out] per layer, so
A = a flattened to [in, r] and transposed, B likewise (heads × head_dim flattened as HF's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rlvr_jax.models import lora
from rlvr_jax.models.config import ArchConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_MODULES = {"attn": "self_attn", "attn_out": "self_attn", "mlp": "mlp"}


def _host(x: jax.Array) -> np.ndarray:
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x), np.float32)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True), np.float32)


def save_peft(
    params: dict, config: ArchConfig, path: str | Path, *, base_model: str | None = None
) -> list[str]:
    """Writes the adapters of `params` (a LoRA policy's) under `path`; returns the adapted
    module names. `base_model` is recorded as `base_model_name_or_path`. Only process 0
    writes (every process must call it: the adapters may need gathering)."""
    from safetensors.numpy import save_file

    adapters = lora.adapters(params)
    if not adapters:
        raise ValueError("save_peft: the params hold no LoRA adapters")
    tensors: dict[str, np.ndarray] = {}
    targets, settings = [], set()
    for name, (tree_path, _) in lora.TARGETS.items():
        try:
            adapter = lora._get(adapters, tree_path)[lora.KEY]
        except KeyError:
            continue
        targets.append(name)
        settings.add((adapter.rank, adapter.scale * adapter.rank, adapter.dropout))
        a, b = _host(adapter.a), _host(adapter.b)
        module = _MODULES[tree_path[1]]
        for i in range(config.n_layers):
            prefix = f"base_model.model.model.layers.{i}.{module}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(
                a[i].reshape(-1, adapter.rank).T
            )
            tensors[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(
                b[i].reshape(adapter.rank, -1).T
            )
    if len(settings) != 1:
        raise ValueError(f"save_peft: adapters of different rank / alpha / dropout {settings}")
    rank, alpha, dropout = settings.pop()
    if jax.process_index() != 0:
        return targets
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": int(rank),
        "lora_alpha": float(alpha),
        "lora_dropout": float(dropout),
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (path / CONFIG_FILE).write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    return targets


def save_lora_exports(model: Any, merged_path: str | Path, adapter_path: str | Path) -> None:
    """The exports of a LoRA policy `model` (`models.Model` whose params hold adapters): the
    merged HF checkpoint at `merged_path` (adapters folded into the kernels, in the param
    dtype; loads in transformers like any checkpoint) and the PEFT adapter directory at
    `adapter_path` (over the base `model.path`)."""
    import dataclasses

    from rlvr_jax.models.model import save_pretrained

    merged = dataclasses.replace(model, params=lora.merge(model.params))
    save_pretrained(merged, merged_path)
    base = None if model.path is None else str(Path(model.path).resolve())
    save_peft(model.params, model.config, adapter_path, base_model=base)
