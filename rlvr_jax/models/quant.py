"""Weights stored in int8 or fp8 with one scale per output channel: the frozen base of a QLoRA
learner (`model.lora.base_dtype: int8`) and the actors' decode weights (`rollout.weight_dtype`).

qwix (Google's JAX quantization library) supplies the storage and the rounding: its `QArray`
(a quantized value plus its scale, a pytree that shards, slices and scans like the array it
replaces) and `qwix.quantize` (absmax calibration per channel, int8 rounding and fp8 clipping).
A quantized leaf is used by `dense` — value · scale in the compute dtype — or, in the decode
step, by `project` (x · value, then · scale: the scale of an output channel commutes with the
matmul). qwix is imported only where an array is quantized: a tree without `QArray`s never
loads it.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import jax
import jax.numpy as jnp

QTYPES = {"int8": "int8", "fp8": "float8_e4m3fn"}
"""`rollout.weight_dtype` / `model.lora.base_dtype` name → the stored dtype."""


def is_quantized(x: Any) -> bool:
    """Whether `x` is a qwix `QArray` (never true before qwix was imported)."""
    qwix = sys.modules.get("qwix")
    return qwix is not None and isinstance(x, qwix.QArray)


def quantize(w: jax.Array, qtype: str, reduce_axes: tuple[int, ...]) -> Any:
    """`w` as a `QArray` of `qtype` (`QTYPES`), one absmax scale per index of the axes not in
    `reduce_axes` (those it is reduced over: a kernel's input dims). The scale keeps `w`'s
    dtype and its rank (size 1 on the reduced axes)."""
    import qwix

    if qtype not in QTYPES:
        raise ValueError(f"unknown quantized dtype {qtype!r}; expected one of {list(QTYPES)}")
    channels = tuple(a for a in range(w.ndim) if a not in reduce_axes)
    return qwix.quantize(w, jnp.dtype(QTYPES[qtype]), channelwise_axes=channels)


def dense(x: Any, dtype: Any) -> jax.Array:
    """`x` as a plain array of `dtype` (a `QArray` dequantized: value · scale)."""
    if not is_quantized(x):
        return x.astype(dtype)
    return x.qvalue.astype(dtype) * x.scale.astype(dtype)


def project(x_BxTxI: jax.Array, kernel_IxO: Any) -> jax.Array:
    """`x @ kernel` over the last axis, in the kernel's dtype (a `QArray`: its scale's dtype,
    the int8 / fp8 value upcast inside the matmul and the [1, O] scale applied after it)."""
    if not is_quantized(kernel_IxO):
        return jnp.einsum("...i,io->...o", x_BxTxI.astype(kernel_IxO.dtype), kernel_IxO)
    dtype = kernel_IxO.scale.dtype
    y = jnp.einsum("...i,io->...o", x_BxTxI.astype(dtype), kernel_IxO.qvalue.astype(dtype))
    return y * kernel_IxO.scale.reshape((1,) * (y.ndim - 1) + (-1,))


def axes_like(x: Any, axes: tuple) -> Any:
    """The logical axes of leaf `x` given those of the array it stands for: a `QArray`'s value
    keeps them, its scale drops the reduced (size-1) axes."""
    if not is_quantized(x):
        return axes
    scale = tuple(None if n == 1 else a for a, n in zip(axes, x.scale.shape))
    return type(x)(qvalue=axes, scale=scale, zero_point=None, qtype=x.qtype)


def nbytes(tree: Any) -> int:
    """Bytes of every array in `tree` (a `QArray` counts its value and its scale)."""
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))
