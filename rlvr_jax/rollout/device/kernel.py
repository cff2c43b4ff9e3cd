"""The engine's forward passes over "decode params": prompt prefill and one-token decode.

`prepare_params` re-lays the policy's params once per weight update into `DecodeParams`:
- one set of arrays per layer: slicing [L, ...] stacks inside a decode step makes XLA:CPU copy
  every weight every step (96 MB/step on the bench model, ~3x slower);
- q|k|v fused into one [D, (N+2K)H] matmul and gate|up into one [D, 2F], columns grouped by
  tensor-parallel shard (`tp`: shard t holds its own q, k, v heads and gate, up columns side
  by side), so the fused matmuls split over the tensor axis with no resharding;
- weights pre-cast to the compute dtype or `weight_dtype` (int8 / fp8: a scale per output
  column, applied after the matmul, `models.quant`); the LM head [D, V] fp32 (bf16 policy and
  compute: [V, D] bf16, the same fp32 logits). bf16 matmuls accumulate in fp32.

The math is the model's own (`rms_norm`, `attend`, masks and RoPE from `rlvr_jax.models`; the
tests check both against transformers). `run_layers` is the layer loop, each layer's attention
a callback, so the contiguous cache (per layer, [B, K, S, H] as consecutive segments,
`attend_segments`) and the paged pool (`device.attention`) share every other line. Decode
attention's scores, softmax and sums are fp32 (q·k on the exact operands, `scores`), so the
layouts agree to fp32 rounding whatever the cache dtype.

Letters: B slots, P prompts, T prompt time, S cache positions, D model, N query heads,
K kv heads, G = N/K, H head dim, E = (N+2K)·H fused q|k|v width, F mlp, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.models import ArchConfig, quant
from rlvr_jax.models.config import SLIDING
from rlvr_jax.models.decoder import rope_tables
from rlvr_jax.models.layers import NEG_INF, cache_masks, rms_norm
from rlvr_jax.models.rope import apply_rope


@flax.struct.dataclass
class LayerWeights:
    """One decoder layer's weights in decode layout (biases / q-k norms None when absent)."""

    attn_norm: jax.Array  # [D]
    mlp_norm: jax.Array  # [D]
    qkv: jax.Array  # [D, E], columns grouped by tensor shard
    qkv_bias: jax.Array | None  # [E]
    q_norm: jax.Array | None  # [N, H] (OLMo) or [H] (Qwen3)
    k_norm: jax.Array | None  # [K, H] or [H]
    o: jax.Array  # [N*H, D]
    o_bias: jax.Array | None  # [D]
    gate_up: jax.Array  # [D, 2F], columns grouped by tensor shard
    gate_up_bias: jax.Array | None  # [2F]
    down: jax.Array  # [F, D]
    down_bias: jax.Array | None  # [D]
    tp: int = flax.struct.field(pytree_node=False, default=1)
    """Tensor shards the fused columns are grouped by."""


@flax.struct.dataclass
class DecodeParams:
    """The policy in decode layout (built by `prepare_params`)."""

    embedding: jax.Array  # [V, D]
    layers: tuple[LayerWeights, ...]
    final_norm: jax.Array  # [D]
    head: jax.Array  # [D, V] float32, or [V, D] bf16 (`_head_dtype`)


def fused_tp(config: ArchConfig, tensor: int) -> int:
    """Tensor shards the fused columns are grouped by: `tensor` when it divides the query heads,
    the KV heads and the MLP width, else 1 (those matmuls then stay whole on every device)."""
    ok = all(x % tensor == 0 for x in (config.n_heads, config.n_kv_heads, config.d_ff))
    return tensor if tensor > 1 and ok else 1


def _grouped(parts: list[jax.Array], tp: int) -> jax.Array:
    """[..., a_i] column blocks concatenated shard by shard: shard t holds the t-th 1/tp of
    every block, in order (plain concatenation when tp = 1)."""
    lead = parts[0].shape[:-1]
    split = [p.reshape(*lead, tp, p.shape[-1] // tp) for p in parts]
    return jnp.concatenate(split, axis=-1).reshape(*lead, -1)


def _flat_bias(layer: dict, name: str, i: int, compute: Any) -> jax.Array | None:
    return layer[name]["bias"][i].reshape(-1).astype(compute) if "bias" in layer[name] else None


def prepare_params(
    params: Any,
    config: ArchConfig,
    compute_dtype: Any,
    tp: int = 1,
    weight_dtype: Any = None,
    platform: str = "",
) -> DecodeParams:
    """`params` (models layout, plain arrays: `lora.merge`) in decode layout, fused columns
    grouped by `tp` shards, matmul weights in `weight_dtype` (default the compute dtype), the
    embedding table in `storage_dtype(..., platform)`. Jittable."""
    compute = jnp.dtype(compute_dtype)
    store = _storage(compute, weight_dtype)
    stack = params["layers"]
    attn, out, mlp = stack["attn"], stack["attn_out"], stack["mlp"]
    d = config.d_model
    layers = []
    for i in range(config.n_layers):
        proj = [attn[n]["kernel"][i].reshape(d, -1) for n in ("q_proj", "k_proj", "v_proj")]
        biases = [_flat_bias(attn, n, i, compute) for n in ("q_proj", "k_proj", "v_proj")]
        gate_up = [mlp[n]["kernel"][i] for n in ("gate_proj", "up_proj")]
        gu_biases = [_flat_bias(mlp, n, i, compute) for n in ("gate_proj", "up_proj")]
        layers.append(
            LayerWeights(
                attn_norm=stack["attn_norm"]["scale"][i],
                mlp_norm=stack["mlp_norm"]["scale"][i],
                qkv=store(_grouped(proj, tp)),
                qkv_bias=None if biases[0] is None else _grouped(biases, tp),
                q_norm=attn["q_norm"]["scale"][i] if "q_norm" in attn else None,
                k_norm=attn["k_norm"]["scale"][i] if "k_norm" in attn else None,
                o=store(out["o_proj"]["kernel"][i].reshape(-1, d)),
                o_bias=_flat_bias(out, "o_proj", i, compute),
                gate_up=store(_grouped(gate_up, tp)),
                gate_up_bias=None if gu_biases[0] is None else _grouped(gu_biases, tp),
                down=store(mlp["down_proj"]["kernel"][i]),
                down_bias=_flat_bias(mlp, "down_proj", i, compute),
                tp=tp,
            )
        )
    embedding = params["embedding"]
    head_DxV = embedding.T if config.tie_embeddings else params["lm_head"]
    head = head_DxV.astype(_head_dtype(head_DxV.dtype, compute))
    return DecodeParams(
        embedding=embedding.astype(storage_dtype(embedding.dtype, platform)),
        layers=tuple(layers),
        final_norm=params["final_norm"]["scale"],
        head=head.T if head_vocab_major(head) else head,
    )


def _head_dtype(param: Any, compute: jnp.dtype) -> jnp.dtype:
    """The LM head's storage: fp32, or bf16 when its params and the compute dtype are bf16 (a
    bf16 x bf16 matmul accumulating in fp32 then gives the same fp32 logits at half the bytes)."""
    bf16 = jnp.dtype(jnp.bfloat16)
    return bf16 if jnp.dtype(param) == bf16 and compute == bf16 else jnp.dtype(jnp.float32)


def head_vocab_major(head: Any) -> bool:
    """Whether the LM head is held [V, D]: a bf16 one (XLA:CPU's bf16 logits matmul, [32, 512] x
    [512, 32000], was 1.9x faster against [V, D] on an AVX-512 BF16 core); fp32 is faster [D, V]."""
    return jnp.dtype(head.dtype).itemsize == 2


def _storage(compute: jnp.dtype, weight_dtype: Any) -> Callable[[jax.Array], Any]:
    """How a [in, out] matmul weight is stored: cast, or quantized per output column."""
    if weight_dtype in quant.QTYPES:
        return lambda w: quant.quantize(w.astype(compute), weight_dtype, (0,))
    dtype = compute if weight_dtype is None else jnp.dtype(weight_dtype)
    return lambda w: w.astype(dtype)


def _norm(config: ArchConfig, x: jax.Array, scale: jax.Array) -> jax.Array:
    return rms_norm(x, scale, eps=config.norm_eps, weight_in_fp32=config.norm_weight_in_fp32)


def _project(x: jax.Array, kernel: Any, bias: jax.Array | None) -> jax.Array:
    """`x @ kernel (+ bias)` over the last axis, in the kernel's dtype (`quant.project`)."""
    y = quant.project(x, kernel)
    return y if bias is None else y + bias.reshape((1,) * (y.ndim - 1) + bias.shape)


def _ungroup(x_BxTxE: jax.Array, widths: tuple[int, ...], tp: int) -> list[jax.Array]:
    """Inverse of `_grouped` on activations: the column blocks, each [B, T, width]."""
    b, t, _ = x_BxTxE.shape
    x = x_BxTxE.reshape(b, t, tp, -1)
    out, start = [], 0
    for w in widths:
        out.append(x[..., start : start + w // tp].reshape(b, t, w))
        start += w // tp
    return out


def _qkv(
    w: LayerWeights, config: ArchConfig, x_BxTxD: jax.Array, cos: jax.Array, sin: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Rotated q [B,T,N,H], k [B,T,K,H] and v [B,T,K,H] of one layer."""
    b, t, _ = x_BxTxD.shape
    n, k, h = config.n_heads, config.n_kv_heads, config.head_dim
    h_BxTxD = x_BxTxD if config.post_norm else _norm(config, x_BxTxD, w.attn_norm)
    qkv_BxTxE = _project(h_BxTxD, w.qkv, w.qkv_bias)
    q_BxTxNH, k_BxTxKH, v_BxTxKH = _ungroup(qkv_BxTxE, (n * h, k * h, k * h), w.tp)
    q_BxTxNxH = q_BxTxNH.reshape(b, t, n, h)
    k_BxTxKxH = k_BxTxKH.reshape(b, t, k, h)
    v_BxTxKxH = v_BxTxKH.reshape(b, t, k, h)
    if w.q_norm is not None:
        q_BxTxNxH = _norm(config, q_BxTxNxH, w.q_norm)
        k_BxTxKxH = _norm(config, k_BxTxKxH, w.k_norm)
    return apply_rope(q_BxTxNxH, cos, sin), apply_rope(k_BxTxKxH, cos, sin), v_BxTxKxH


def _finish_layer(
    w: LayerWeights, config: ArchConfig, x_BxTxD: jax.Array, attn_BxTxNH: jax.Array
) -> jax.Array:
    """Output projection, residual, MLP, residual (pre- or post-norm)."""
    with jax.named_scope("o_proj"):
        out_BxTxD = _project(attn_BxTxNH, w.o, w.o_bias)
        if config.post_norm:
            out_BxTxD = _norm(config, out_BxTxD, w.attn_norm)
        x_BxTxD = x_BxTxD + out_BxTxD
    with jax.named_scope("mlp"):
        h_BxTxD = x_BxTxD if config.post_norm else _norm(config, x_BxTxD, w.mlp_norm)
        gate_up_BxTx2F = _project(h_BxTxD, w.gate_up, w.gate_up_bias)
        f = config.d_ff
        gate_BxTxF, up_BxTxF = _ungroup(gate_up_BxTx2F, (f, f), w.tp)
        hidden_BxTxF = jax.nn.silu(gate_BxTxF) * up_BxTxF
        out_BxTxD = _project(hidden_BxTxF, w.down, w.down_bias)
        if config.post_norm:
            out_BxTxD = _norm(config, out_BxTxD, w.mlp_norm)
        return x_BxTxD + out_BxTxD


def storage_dtype(dtype: Any, platform: str) -> jnp.dtype:
    """The dtype holding values of `dtype` that are only moved (the KV cache, the embedding
    table): `dtype`, but fp32 for a 16-bit float on a CPU, where XLA:CPU's scatters and gathers
    convert the whole 16-bit operand to fp32 and back on every call; fp32 holds the values
    exactly, so only the bytes held change."""
    dtype = jnp.dtype(dtype)
    if platform == "cpu" and jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize == 2:
        return jnp.dtype(jnp.float32)
    return dtype


def scores(equation: str, q: jax.Array, k: jax.Array) -> jax.Array:
    """fp32 `einsum(equation, q, k)` of the exact operands: one dtype multiplies as it is,
    accumulating in fp32 (a bf16 cache is never upcast whole); two dtypes are upcast first."""
    if q.dtype != k.dtype:
        q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    return jnp.einsum(equation, q, k, preferred_element_type=jnp.float32)


def _rope_for_layers(config: ArchConfig, positions_BxT: jax.Array) -> list[tuple]:
    """(cos, sin) per layer, [B, T, H/2] each (sliding layers may use their own RoPE)."""
    cos_f, sin_f, cos_s, sin_s = rope_tables(config, positions_BxT)
    sliding = (cos_f, sin_f) if cos_s is None else (cos_s, sin_s)
    return [sliding if t == SLIDING else (cos_f, sin_f) for t in config.layer_types]


Attention = Callable[[int, Any, jax.Array, jax.Array, jax.Array], tuple[jax.Array, Any]]
"""`(layer, cache_layer, q_BxTxNxH, k_BxTxKxH, v_BxTxKxH) -> (attn_BxTxNxH, cache_layer)`:
one layer's attention for the new tokens, reading (and writing) that layer's cache."""


def run_layers(
    dp: DecodeParams,
    config: ArchConfig,
    tokens_BxT: jax.Array,
    positions_BxT: jax.Array,
    caches: tuple,
    attention: Attention,
) -> tuple[jax.Array, tuple]:
    """The decoder over new tokens at `positions_BxT`, each layer's attention delegated to
    `attention`; returns (final hidden states [B, T, D] before the final norm, caches)."""
    compute = dp.layers[0].qkv.dtype
    b, t = tokens_BxT.shape
    with jax.named_scope("embed"):
        x_BxTxD = jnp.take(dp.embedding, tokens_BxT, axis=0).astype(compute)
        rope = _rope_for_layers(config, positions_BxT)
    new = []
    for i, (w, (cos, sin)) in enumerate(zip(dp.layers, rope)):
        with jax.named_scope("qkv"):
            q_BxTxNxH, k_BxTxKxH, v_BxTxKxH = _qkv(w, config, x_BxTxD, cos, sin)
        with jax.named_scope("attention"):
            attn_BxTxNxH, cache = attention(i, caches[i], q_BxTxNxH, k_BxTxKxH, v_BxTxKxH)
        x_BxTxD = _finish_layer(w, config, x_BxTxD, attn_BxTxNxH.reshape(b, t, -1))
        new.append(cache)
    return x_BxTxD, tuple(new)


def logits(dp: DecodeParams, config: ArchConfig, x_BxD: jax.Array) -> jax.Array:
    """fp32 next-token logits [B, V] of final hidden states [B, D]."""
    with jax.named_scope("lm_head"):
        h_BxD = _norm(config, x_BxD, dp.final_norm).astype(dp.head.dtype)
        if head_vocab_major(dp.head):
            return jnp.einsum("BD,VD->BV", h_BxD, dp.head, preferred_element_type=jnp.float32)
        return quant.matmul(h_BxD, dp.head, out=jnp.float32)


def attend_segments(
    q_BxNxH: jax.Array,
    k_segments: tuple[jax.Array, ...],
    v_segments: tuple[jax.Array, ...],
    mask_BxS: jax.Array,
) -> jax.Array:
    """One query per row against its cache row (GQA), held as consecutive segments [B, K, S_i, H]
    (the mask covers their Σ S_i positions): one softmax over the concatenated scores, values
    summed segment by segment (no segment copied). Returns [B, N, H] fp32."""
    b, n, h = q_BxNxH.shape
    k = k_segments[0].shape[1]
    q_BxKxGxH = q_BxNxH.reshape(b, k, n // k, h)
    parts = [scores("BKGH,BKSH->BKGS", q_BxKxGxH, seg) for seg in k_segments]
    scores_BxKxGxS = jnp.concatenate(parts, axis=-1) * (h**-0.5)
    scores_BxKxGxS = jnp.where(mask_BxS[:, None, None, :], scores_BxKxGxS, NEG_INF)
    probs_BxKxGxS = jax.nn.softmax(scores_BxKxGxS, axis=-1)
    out_BxKxGxH, start = 0.0, 0
    for seg in v_segments:
        probs = probs_BxKxGxS[..., start : start + seg.shape[2]]
        out_BxKxGxH += jnp.einsum("BKGS,BKSH->BKGH", probs, seg.astype(jnp.float32))
        start += seg.shape[2]
    return out_BxKxGxH.reshape(b, n, h)


def write_tokens(
    segments: tuple[jax.Array, ...], rows_B: jax.Array, positions_B: jax.Array, x_BxKxH: jax.Array
) -> tuple:
    """One token's K (or V) per row written at `positions_B` into the segment holding it."""
    out, at = [], 0
    for seg in segments:
        n = seg.shape[2]
        local_B = positions_B - at
        local_B = jnp.where((local_B >= 0) & (local_B < n), local_B, n)  # n: dropped
        out.append(seg.at[rows_B, :, local_B].set(x_BxKxH.astype(seg.dtype), mode="drop"))
        at += n
    return tuple(out)


def decode_logits(
    dp: DecodeParams,
    config: ArchConfig,
    tokens_B: jax.Array,
    positions_B: jax.Array,
    k_cache: tuple[tuple[jax.Array, ...], ...],
    v_cache: tuple[tuple[jax.Array, ...], ...],
    *,
    span: jax.Array | None = None,
) -> tuple[jax.Array, tuple, tuple]:
    """One token per row of the contiguous cache (per layer, segments [B, K, S_i, H],
    `Contiguous.segments`): its K/V written at `positions_B`, attending causally (the last W on
    sliding layers). Returns (logits fp32 [B, V], k, v). With `span` (traced, > every live
    row's position), attention reads only the leading segments covering it (`lax.switch`)."""
    b = tokens_B.shape[0]
    lengths = [seg.shape[2] for seg in k_cache[0]]
    ends = tuple(int(e) for e in np.cumsum(lengths))
    rows_B = jnp.arange(b)
    window = config.sliding_window if config.has_sliding else None
    mask_full_Bx1xS, mask_sliding_Bx1xS = cache_masks(positions_B, ends[-1], window)
    which = None
    if len(ends) > 1 and span is not None:
        which = jnp.minimum(jnp.searchsorted(jnp.asarray(ends), span), len(ends) - 1)

    def reads(m: int) -> Callable:  # attention over the first m segments
        def attend(q_BxNxH, k_segments, v_segments, mask_BxS):
            mask = mask_BxS[:, : ends[m - 1]]
            return attend_segments(q_BxNxH, k_segments[:m], v_segments[:m], mask)

        return attend

    def contiguous(i, kv, q_Bx1xNxH, k_Bx1xKxH, v_Bx1xKxH):
        k_segments = write_tokens(kv[0], rows_B, positions_B, k_Bx1xKxH[:, 0])
        v_segments = write_tokens(kv[1], rows_B, positions_B, v_Bx1xKxH[:, 0])
        mask = mask_sliding_Bx1xS if config.layer_types[i] == SLIDING else mask_full_Bx1xS
        args = (q_Bx1xNxH[:, 0], k_segments, v_segments, mask[:, 0])
        if which is None:
            attn_BxNxH = reads(len(ends))(*args)
        else:
            attn_BxNxH = jax.lax.switch(which, [reads(m) for m in range(1, len(ends) + 1)], *args)
        return attn_BxNxH[:, None].astype(q_Bx1xNxH.dtype), (k_segments, v_segments)

    caches = tuple(zip(k_cache, v_cache))
    x_Bx1xD, kv = run_layers(
        dp, config, tokens_B[:, None], positions_B[:, None], caches, contiguous
    )
    return logits(dp, config, x_Bx1xD[:, 0]), tuple(k for k, _ in kv), tuple(v for _, v in kv)
