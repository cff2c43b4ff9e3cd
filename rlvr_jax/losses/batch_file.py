"""Loss-lab batch files (.npz): what `train.save_batch` writes and `rlvr-bench losses --batch`
reads.

A batch holds `logp`, `old_logp`, `sampler_logp`, `mask` ([B, T]) and `advantages` ([B] or
[B, T]); optional: `ref_logp` [B, T] (presets with a KL term), `rewards` [B] with `group_size`
(presets then compute their own advantages), `max_len` (the generation budget of
`seq-mean-token-sum-norm`). Both directions validate it; errors name the file and the array.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

PER_TOKEN_ARRAYS = ("logp", "old_logp", "sampler_logp", "mask")
REQUIRED_ARRAYS = (*PER_TOKEN_ARRAYS, "advantages")
OPTIONAL_ARRAYS = ("ref_logp", "rewards", "group_size", "max_len")
# stored as float32 whatever the trainer's dtype (bfloat16 included)
FLOAT_ARRAYS = ("logp", "old_logp", "sampler_logp", "ref_logp", "advantages", "rewards")


class BatchError(ValueError):
    """A loss-lab batch that is missing an array or holds a bad one (the message names both)."""


def _check_batch(arrays: dict[str, Any], source: str) -> dict[str, np.ndarray]:
    """Validates and normalises a batch; `source` names the file in errors."""
    unknown = sorted(set(arrays) - set(REQUIRED_ARRAYS) - set(OPTIONAL_ARRAYS))
    if unknown:
        raise BatchError(f"{source}: unexpected array(s) {', '.join(unknown)}")
    for name in REQUIRED_ARRAYS:
        if name not in arrays:
            raise BatchError(
                f"{source}: missing array {name!r} (needs {', '.join(REQUIRED_ARRAYS)})"
            )
    out = {k: np.asarray(v) for k, v in arrays.items()}
    for name, arr in out.items():
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            raise BatchError(f"{source}: array {name!r} has non-numeric dtype {arr.dtype}")
    mask = out["mask"]
    if mask.ndim != 2 or 0 in mask.shape:
        raise BatchError(f"{source}: array 'mask' must be a non-empty [B, T], got {mask.shape}")
    if not np.isin(mask, (0, 1)).all():
        raise BatchError(f"{source}: array 'mask' must hold only 0 and 1")
    batch, length = mask.shape
    on = mask.astype(bool)
    for name in (*PER_TOKEN_ARRAYS[:3], "ref_logp"):
        if name not in out:
            continue
        if out[name].shape != mask.shape:
            raise BatchError(
                f"{source}: array {name!r} has shape {out[name].shape}, "
                f"expected the mask's {mask.shape}"
            )
        if not np.isfinite(out[name][on]).all():
            raise BatchError(f"{source}: array {name!r} has non-finite values on unmasked tokens")
        if (out[name][on] > 1e-4).any():
            raise BatchError(f"{source}: array {name!r} holds log-probs > 0")
    if out["advantages"].shape not in ((batch,), (batch, length)):
        raise BatchError(
            f"{source}: array 'advantages' has shape {out['advantages'].shape}, "
            f"expected [B] = ({batch},) or [B, T] = {mask.shape}"
        )
    if not np.isfinite(out["advantages"]).all():
        raise BatchError(f"{source}: array 'advantages' has non-finite values")
    if ("rewards" in out) != ("group_size" in out):
        raise BatchError(f"{source}: arrays 'rewards' and 'group_size' come together")
    if "rewards" in out:
        group = int(out["group_size"])
        if out["rewards"].shape != (batch,) or out["group_size"].shape != ():
            raise BatchError(
                f"{source}: array 'rewards' must be [B] = ({batch},) and 'group_size' a scalar"
            )
        if group < 1 or batch % group:
            raise BatchError(f"{source}: array 'group_size' = {group} does not divide B = {batch}")
    longest = int(mask.sum(axis=1).max())
    if "max_len" in out and (out["max_len"].shape != () or int(out["max_len"]) < longest):
        raise BatchError(
            f"{source}: array 'max_len' (the generation budget) must be a scalar >= the longest "
            f"completion ({longest} tokens)"
        )
    return out


def save_batch(path: str | Path, **arrays: Any) -> Path:
    """Validates `arrays` (module docstring) and writes them to `path` (.npz); returns it."""
    path = Path(path)
    arrays = {
        k: np.asarray(v).astype(np.float32) if k in FLOAT_ARRAYS else np.asarray(v)
        for k, v in arrays.items()
    }
    batch = _check_batch(arrays, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        np.savez(f, **batch)
    return path


def load_batch(path: str | Path) -> dict[str, np.ndarray]:
    """Reads and validates a loss-lab batch; errors name the file and the array."""
    path = Path(path)
    if not path.is_file():
        raise BatchError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise BatchError(f"{path}: not a readable .npz of numeric arrays ({e})") from e
    return _check_batch(arrays, str(path))
