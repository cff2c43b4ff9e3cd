"""Rotary position embeddings: HF rope configs → inverse frequencies → rotation of q and k.

Supported `rope_type`s, computed exactly as transformers 5.23 (`modeling_rope_utils.py`) does,
in float32: `default`, `linear`, `llama3`, `yarn`. `dynamic` (whose frequencies depend on the
longest sequence of the current batch, so log-probs would depend on batch composition),
`longrope`, `proportional` and `partial_rotary_factor` < 1 raise `UnsupportedRopeError`.

`ArchConfig` keeps a scaling as a sorted, hashable tuple of `(key, value)` items (None = plain).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.models.errors import ModelConfigError, UnsupportedRopeError

RopeScaling = tuple[tuple[str, Any], ...]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")

# rope_type -> (required keys, optional keys) besides rope_type / rope_theta
_SCALING_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "linear": (frozenset({"factor"}), frozenset()),
    "llama3": (
        frozenset(
            {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
        ),
        frozenset(),
    ),
    "yarn": (
        frozenset({"factor", "original_max_position_embeddings"}),
        frozenset(
            {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}
        ),
    ),
}


def scaling_from_hf(
    rope_params: Mapping[str, Any], *, max_position_embeddings: int, where: str = ""
) -> RopeScaling | None:
    """The canonical scaling tuple of one flat HF rope dict (`rope_parameters` or the legacy
    `rope_scaling`); None for plain RoPE. Unknown keys are ignored, as HF only warns on them."""
    rope_type = rope_params.get("rope_type", rope_params.get("type")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedRopeError(
            f"{where}rope_type {rope_type!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    partial = rope_params.get("partial_rotary_factor")
    if partial is not None and float(partial) != 1.0:
        raise UnsupportedRopeError(f"{where}partial_rotary_factor={partial} is not supported")
    if rope_type == "default":
        return None
    items = dict(rope_params)
    missing_original = items.get("original_max_position_embeddings") is None
    if rope_type in ("llama3", "yarn") and missing_original:
        # transformers' standardize_rope_params fills the pretraining length the same way
        items["original_max_position_embeddings"] = max_position_embeddings
    required, optional = _SCALING_KEYS[rope_type]
    missing = sorted(k for k in required if k not in items)
    if missing:
        raise ModelConfigError(f"{where}rope_type {rope_type!r} needs the keys {missing}")
    if rope_type != "yarn" and items["factor"] is None:
        raise ModelConfigError(f"{where}rope_type {rope_type!r} needs a numeric 'factor'")
    kept = {k: items[k] for k in sorted(required | optional) if k in items}
    for key, value in kept.items():
        if isinstance(value, (list, dict)):
            raise ModelConfigError(f"{where}rope parameter {key!r} must be a scalar, got {value!r}")
    return tuple(sorted({**kept, "rope_type": rope_type}.items()))


def scaling_to_hf(theta: float, scaling: RopeScaling | None) -> dict[str, Any]:
    """The transformers 5 `rope_parameters` dict of one (theta, scaling) pair."""
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": float(theta)}
    if scaling is not None:
        out.update(dict(scaling))
    return out


def _arange_ratio(dim: int) -> np.ndarray:
    """`arange(0, dim, 2) / dim` in float32, as HF builds the RoPE exponents."""
    return np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)


def _yarn(
    dim: int, theta: float, opts: Mapping[str, Any], max_position_embeddings: int
) -> tuple[np.ndarray, float]:
    original = opts["original_max_position_embeddings"]
    factor = opts.get("factor")
    if factor is None:
        factor = max_position_embeddings / original

    def mscale_of(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = opts.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = opts.get("mscale"), opts.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = mscale_of(factor, mscale) / mscale_of(factor, mscale_all_dim)
        else:
            attention_factor = mscale_of(factor)
    beta_fast = opts.get("beta_fast") or 32
    beta_slow = opts.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if opts.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as HF: avoid a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = (1 - ramp).astype(np.float32)
    pos_freqs = np.float32(theta) ** _arange_ratio(dim)
    inv_interp = np.float32(1.0) / (np.float32(factor) * pos_freqs)
    inv_extrap = np.float32(1.0) / pos_freqs
    inv_freq = inv_interp * (1 - extrapolation) + inv_extrap * extrapolation
    return inv_freq.astype(np.float32), float(attention_factor)


def _llama3(dim: int, theta: float, opts: Mapping[str, Any]) -> np.ndarray:
    inv_freq = np.float32(1.0) / (np.float32(theta) ** _arange_ratio(dim))
    factor = opts["factor"]
    low_freq_factor, high_freq_factor = opts["low_freq_factor"], opts["high_freq_factor"]
    old_context = opts["original_max_position_embeddings"]
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / np.float32(factor), inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def inv_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None, max_position_embeddings: int
) -> tuple[np.ndarray, float]:
    """(inv_freq [head_dim // 2] float32, attention scaling of cos/sin) for one rope setting."""
    opts = dict(scaling or ())
    rope_type = opts.get("rope_type", "default")
    if rope_type == "default":
        return (np.float32(1.0) / (np.float32(theta) ** _arange_ratio(head_dim))), 1.0
    if rope_type == "linear":
        inv_freq = np.float32(1.0) / (np.float32(theta) ** _arange_ratio(head_dim))
        return (inv_freq / np.float32(opts["factor"])).astype(np.float32), 1.0
    if rope_type == "llama3":
        return _llama3(head_dim, theta, opts), 1.0
    if rope_type == "yarn":
        return _yarn(head_dim, theta, opts, max_position_embeddings)
    raise UnsupportedRopeError(f"rope_type {rope_type!r} is not supported")


def cos_sin(
    positions_BxT: jax.Array, inv_freq: np.ndarray, attention_scaling: float
) -> tuple[jax.Array, jax.Array]:
    """cos and sin of `positions × inv_freq` (fp32, [B, T, H/2]), times the attention scaling."""
    freqs_BxTxH2 = positions_BxT.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq)[None, None]
    return jnp.cos(freqs_BxTxH2) * attention_scaling, jnp.sin(freqs_BxTxH2) * attention_scaling


def apply_rope(x_BxTxNxH: jax.Array, cos_BxTxH2: jax.Array, sin_BxTxH2: jax.Array) -> jax.Array:
    """Rotates the two halves of the head dimension (HF's `rotate_half` layout), in fp32."""
    half = x_BxTxNxH.shape[-1] // 2
    x = x_BxTxNxH.astype(jnp.float32)
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos_BxTxH2[:, :, None, :], sin_BxTxH2[:, :, None, :]
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x_BxTxNxH.dtype)
