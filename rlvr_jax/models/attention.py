"""The attention switch (`model.attention_impl`): which kernel computes training attention.

All kernels compute the same thing: causal grouped-query self-attention within segments
(query t sees key s iff s <= t and segment_ids[t] == segment_ids[s], and on sliding layers
t - s < W), softmax in fp32. They differ in what they hold in memory:

| impl        | where              | held per layer                   | backward             |
|-------------|--------------------|----------------------------------|----------------------|
| `xla`       | any (reference)    | [B,T,T] masks, [B,N,T,T] probs   | autodiff             |
| `blockwise` | any (CPU default)  | [B,N,b,b] tiles: O(T · b)        | custom (flash-style) |
| `cudnn`     | NVIDIA GPU, 16-bit | none (fused kernel)              | cuDNN                |
| `splash`    | TPU                | none (Pallas kernel)             | splash               |

`auto` picks per platform (`resolve_impl`): splash on TPU; cuDNN on a CUDA GPU when the
compute dtype is bf16/fp16, the head dim a multiple of 8 up to 256 and the batch's segment
layout is declared (`max_segments` >= 1, see `attention_kernels`), else blockwise; blockwise on
CPU. `splash_interpret` (not a config value) runs the splash kernel in the Pallas interpreter
on any platform, for tests. Explicit choices that cannot run raise `AttentionConfigError`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rlvr_jax import sharding
from rlvr_jax.models.attention_blockwise import DEFAULT_BLOCK, blockwise_attention
from rlvr_jax.models.attention_kernels import cudnn_attention, splash_attention
from rlvr_jax.models.layers import attend, segment_masks

IMPLS = ("auto", "xla", "blockwise", "cudnn", "splash")
"""Values of `model.attention_impl`."""
KERNELS = ("xla", "blockwise", "cudnn", "splash", "splash_interpret")
"""What `resolve_impl` returns (`splash_interpret`: the splash kernel, Pallas interpreter)."""
_UNLIMITED = 2**30
"""A window no sequence reaches (full-attention layers of a model that also has sliding ones)."""


class AttentionConfigError(ValueError):
    """An attention implementation was asked for where it cannot run."""


SHARED_PROMPT_BLOCK = 256
"""The blockwise tile of shared-prompt rows (`branches` > 1): tiles below the row length let
causality skip part of the G completions (256 beat 128 and one 512 tile on the demo's step)."""


def platform_of(hardware: str | None = None) -> str:
    """ "tpu", "gpu" or "cpu": of a hardware name (`mesh.hardware`, e.g. "TPU v5p-128",
    "8xH100-80GB"), or of this process's default backend when None or unrecognised."""
    name = (hardware or "").lower()
    if "tpu" in name:
        return "tpu"
    if any(tag in name for tag in ("gpu", "h100", "h200", "a100", "b200", "gb200", "l4", "l40")):
        return "gpu"
    backend = jax.default_backend()
    return backend if backend in ("tpu", "gpu") else "cpu"


def cudnn_unsupported(
    platform: str, compute_dtype: Any, head_dim: int, max_segments: int, *, check_library=True
) -> str | None:
    """Why cuDNN flash attention cannot run here (None when it can)."""
    if platform != "gpu":
        return f"needs an NVIDIA GPU (platform is {platform})"
    if jnp.dtype(compute_dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return (
            f"needs a bf16/fp16 compute dtype (model.compute_dtype is {jnp.dtype(compute_dtype)})"
        )
    if head_dim % 8 or head_dim > 256:
        return f"needs a head dim that is a multiple of 8 up to 256 (got {head_dim})"
    if max_segments < 1:
        return "needs the batch's segment layout (max_segments >= 1 sequences per row)"
    if check_library:
        try:
            from jax._src.cudnn.fused_attention_stablehlo import check_cudnn_version

            check_cudnn_version()
        except Exception as e:  # no CUDA plugin / no cuDNN: ROCm or a CPU-only install
            return f"cuDNN is not available ({e})"
    return None


def resolve_impl(
    impl: str,
    *,
    compute_dtype: Any,
    head_dim: int,
    max_segments: int = 0,
    platform: str | None = None,
    check_library: bool = True,
    branches: int = 1,
) -> str:
    """The kernel `impl` (a `model.attention_impl` value, or a `KERNELS` name) means on
    `platform` (default: this process's); raises `AttentionConfigError` naming the key when
    an explicit choice cannot run there. Shared-prompt rows (`branches` > 1) need a kernel
    that builds its mask from the segment ids itself: `auto` is then blockwise."""
    platform = platform or platform_of()
    if branches > 1:
        if impl in ("cudnn", "splash"):
            raise AttentionConfigError(
                f"model.attention_impl={impl} cannot read shared-prompt rows "
                "(train.share_prompts); use auto, blockwise or xla"
            )
        return "blockwise" if impl == "auto" else impl
    if impl == "auto":
        if platform == "tpu":
            return "splash"
        why = cudnn_unsupported(
            platform, compute_dtype, head_dim, max_segments, check_library=check_library
        )
        return "cudnn" if platform == "gpu" and why is None else "blockwise"
    if impl not in KERNELS:
        raise AttentionConfigError(
            f"model.attention_impl must be one of {', '.join(IMPLS)}, got {impl!r}"
        )
    if impl == "splash" and platform != "tpu":
        raise AttentionConfigError(
            f"model.attention_impl=splash needs a TPU (platform is {platform}); use auto, "
            "blockwise or xla"
        )
    if impl == "cudnn":
        why = cudnn_unsupported(
            platform, compute_dtype, head_dim, max_segments, check_library=check_library
        )
        if why is not None:
            raise AttentionConfigError(f"model.attention_impl=cudnn {why}; use auto or blockwise")
    return impl


def attention(
    q_BxTxNxH: jax.Array,
    k_BxTxKxH: jax.Array,
    v_BxTxKxH: jax.Array,
    segment_ids_BxT: jax.Array,
    *,
    impl: str = "auto",
    sliding_window: int | None = None,
    is_sliding: jax.Array | None = None,
    chunk: int = 0,
    max_segments: int = 0,
    mesh: Mesh | None = None,
    rules: sharding.Rules | None = None,
    branches: int = 1,
) -> jax.Array:
    """Causal GQA self-attention within segments with the kernel `impl` resolves to.

    `sliding_window` W applies when `is_sliding` is None; with `is_sliding` (a traced bool,
    e.g. per layer inside a scan) it applies only where true. `chunk` > 0: queries per chunk
    of `xla` (`train.attn_chunk`), the tile of `blockwise`; cudnn/splash ignore it.
    `max_segments`: sequences per row at most (cuDNN's packed layout; 0 = unknown).
    `mesh`/`rules`: splash's `shard_map`. `branches` > 1: shared-prompt rows.
    """
    kernel = resolve_impl(
        impl, compute_dtype=q_BxTxNxH.dtype, head_dim=q_BxTxNxH.shape[-1],
        max_segments=max_segments, branches=branches,
    )  # fmt: skip
    qkv = (q_BxTxNxH, k_BxTxKxH, v_BxTxKxH)
    if kernel == "xla":
        full, sliding = segment_masks(segment_ids_BxT, sliding_window, branches)
        if sliding is not None and is_sliding is not None:
            sliding = jnp.where(is_sliding, sliding, full)
        return attend(*qkv, full if sliding is None else sliding, q_chunk=chunk)
    if kernel == "blockwise":
        window = sliding_window
        if window is not None and is_sliding is not None:
            window = jnp.where(is_sliding, window, _UNLIMITED)
        default = SHARED_PROMPT_BLOCK if branches > 1 else DEFAULT_BLOCK
        return blockwise_attention(
            *qkv, segment_ids_BxT, window, block=chunk if chunk > 0 else default, branches=branches
        )
    if kernel == "cudnn":
        fn = functools.partial(cudnn_attention, max_segments=max_segments)
    else:
        fn = functools.partial(
            splash_attention, interpret=kernel == "splash_interpret", mesh=mesh, rules=rules
        )
    if sliding_window is None:
        return fn(*qkv, segment_ids_BxT, None)
    if is_sliding is None:
        return fn(*qkv, segment_ids_BxT, sliding_window)
    return jax.lax.cond(
        is_sliding,
        lambda ops: fn(*ops, sliding_window),
        lambda ops: fn(*ops, None),
        (*qkv, segment_ids_BxT),
    )


def activation_bytes(
    kernel: str,
    *,
    rows: float,
    seq: int,
    n_heads: int,
    head_dim: int,
    n_layers: int,
    sliding: bool,
    remat: bool,
    chunk: int = 0,
) -> float:
    """Attention's own memory per device for one micro-batch of `rows` × `seq` in the
    learner's forward + backward (beyond q, k, v and the output, which the per-token
    activation estimate counts): the estimate `rlvr-train --dry-run` prints.

    xla: the [B, T, T] bool masks (two with sliding layers) and the fp32 probabilities
    N·q·T·4 per row, q = `chunk` or T, kept for every layer unless remat or chunking;
    blockwise: the fp32 log-sum-exp N·T·4 per row and layer, plus one layer's backward
    working set (the fp32 dQ accumulator N·T·H·4 and four b×b fp32 tiles per head);
    cudnn / splash: the log-sum-exp only (their tiles live on chip)."""
    kept_layers = 1 if remat else n_layers
    lse = rows * n_heads * seq * 4
    if kernel == "xla":
        q = chunk if 0 < chunk < seq else seq
        probs = rows * n_heads * q * seq * 4
        masks = rows * seq * seq * (2 if sliding else 1)
        return masks + (probs if (remat or q < seq) else n_layers * probs)
    if kernel == "blockwise":
        block = min(chunk if chunk > 0 else DEFAULT_BLOCK, seq)
        work = rows * n_heads * (seq * head_dim + 4 * block * block) * 4
        return kept_layers * lse + work
    if kernel in ("cudnn", "splash", "splash_interpret"):
        return kept_layers * lse
    raise AttentionConfigError(f"unknown attention kernel {kernel!r}")
