"""Weights stored in int8 or fp8 with one scale per output channel: the frozen base of a QLoRA
learner (`model.lora.base_dtype: int8`) and the actors' decode weights (`rollout.weight_dtype`).

qwix supplies the storage (`QArray`: value plus scale, a pytree that shards, slices and scans
like the array it replaces) and the rounding (`qwix.quantize`, absmax per channel). A quantized
leaf is used by `dense` (value · scale in the compute dtype) or by `project` (x · value, then
· scale: a per-output-channel scale commutes with the matmul). qwix is imported only when an
array is quantized.
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
    the int8 / fp8 value upcast inside the matmul and the [1, O] scale applied after it).

    A 16-bit matmul accumulates in fp32 and rounds its result once (`matmul`)."""
    if not is_quantized(kernel_IxO):
        return matmul(x_BxTxI.astype(kernel_IxO.dtype), kernel_IxO)
    dtype = kernel_IxO.scale.dtype
    y = matmul(x_BxTxI.astype(dtype), kernel_IxO.qvalue.astype(dtype), out=jnp.float32)
    return (y * kernel_IxO.scale.reshape((1,) * (y.ndim - 1) + (-1,))).astype(dtype)


def matmul(x_BxTxI: jax.Array, w_IxO: jax.Array, out: Any = None) -> jax.Array:
    """`x @ w` over the last axis of two arrays of one dtype, returned in `out` (default that
    dtype), accumulated in fp32 and rounded once: a bf16 -> bf16 dot's result, but XLA:CPU
    upcasts that one's operands every call (3.4x slower) while this one runs natively."""
    out = x_BxTxI.dtype if out is None else out
    if jnp.dtype(x_BxTxI.dtype).itemsize >= 4:
        return jnp.einsum("...i,io->...o", x_BxTxI, w_IxO).astype(out)
    y = jnp.einsum("...i,io->...o", x_BxTxI, w_IxO, preferred_element_type=jnp.float32)
    return y.astype(out)


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
