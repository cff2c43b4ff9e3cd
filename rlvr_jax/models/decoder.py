"""The decoder: embedding, a `nn.scan` over identical layers (params stacked on a leading
`layers` axis), final norm and an fp32 LM head.

One module serves three modes that share the same parameters:
- "forward": a packed / padded batch [B, T] with segment ids; returns logits (or hidden states).
- "prefill": like forward, and also returns every layer's rotated K and V ([L, B, T, K, H]).
- "decode":  one token per row [B, 1] against a KV cache [L, B, S, K, H] (carried through
  the layer scan and updated in place at each row's position).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rlvr_jax import sharding
from rlvr_jax.models import rope
from rlvr_jax.models.attention import attention, resolve_impl
from rlvr_jax.models.config import FULL, SLIDING, ArchConfig
from rlvr_jax.models.layers import (
    Mlp,
    OutProjection,
    QKVProjection,
    RMSNorm,
    attend,
    cache_masks,
    segment_masks,
)

Dtype = Any
MODES = ("forward", "prefill", "decode")


@flax.struct.dataclass
class LayerContext:
    """Inputs every layer shares (broadcast through the scan)."""

    cos_full_BxTxH2: jax.Array
    sin_full_BxTxH2: jax.Array
    cos_sliding_BxTxH2: jax.Array | None
    sin_sliding_BxTxH2: jax.Array | None
    mask_full_BxTxS: jax.Array | None
    """[B, T, S] masks: decode mode and the `xla` kernel only."""
    mask_sliding_BxTxS: jax.Array | None
    write_pos_B: jax.Array | None
    segment_ids_BxT: jax.Array | None = None
    """Forward / prefill with a fused kernel: the kernel builds its masks from these."""


def all_sliding(config: ArchConfig) -> bool:
    """Every layer is a sliding-window layer (no per-layer choice needed)."""
    return all(t == SLIDING for t in config.layer_types)


def _pick(is_sliding: jax.Array, sliding: jax.Array | None, full: jax.Array) -> jax.Array:
    """The sliding variant on sliding layers, the full one elsewhere (same when no variant)."""
    return full if sliding is None else jnp.where(is_sliding, sliding, full)


def rope_tables(
    config: ArchConfig, positions_BxT: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None]:
    """cos/sin [B, T, H/2] of the full-attention layers, and of the sliding ones if they differ."""

    def table(layer_type: str) -> tuple[jax.Array, jax.Array]:
        theta, scaling = config.rope_for(layer_type)
        inv_freq, scale = rope.inv_frequencies(
            config.head_dim, theta, scaling, config.max_position_embeddings
        )
        return rope.cos_sin(positions_BxT, inv_freq, scale)

    if not config.has_sliding or config.rope_for(SLIDING) == config.rope_for(FULL):
        return (*table(FULL), None, None)
    return (*table(FULL), *table(SLIDING))


class DecoderLayer(nn.Module):
    """One pre-norm (Llama/Qwen) or post-norm (OLMo) decoder layer; the scan body."""

    config: ArchConfig
    mode: str
    compute_dtype: Dtype
    param_dtype: Dtype
    cache_dtype: Dtype
    mesh: Mesh | None = None
    rules: sharding.Rules | None = None
    attn_chunk: int = 0
    attention_kernel: str = "xla"
    max_segments: int = 0
    segment_branches: int = 1

    @nn.compact
    def __call__(
        self, carry: tuple[jax.Array, Any], xs: tuple[jax.Array, jax.Array], ctx: LayerContext
    ) -> tuple[tuple[jax.Array, Any], Any]:
        cfg = self.config
        x_BxTxD, cache = carry
        layer_idx, is_sliding = xs
        norm = dict(
            eps=cfg.norm_eps, weight_in_fp32=cfg.norm_weight_in_fp32, param_dtype=self.param_dtype
        )
        attn_norm = RMSNorm((cfg.d_model,), ("norm",), name="attn_norm", **norm)
        mlp_norm = RMSNorm((cfg.d_model,), ("norm",), name="mlp_norm", **norm)
        dtypes = dict(compute_dtype=self.compute_dtype, param_dtype=self.param_dtype)
        shard = dict(mesh=self.mesh, rules=self.rules)

        cos = _pick(is_sliding, ctx.cos_sliding_BxTxH2, ctx.cos_full_BxTxH2)
        sin = _pick(is_sliding, ctx.sin_sliding_BxTxH2, ctx.sin_full_BxTxH2)
        h_BxTxD = x_BxTxD if cfg.post_norm else attn_norm(x_BxTxD)
        q_BxTxNxH, k_BxTxKxH, v_BxTxKxH = QKVProjection(cfg, name="attn", **dtypes, **shard)(
            h_BxTxD, cos, sin
        )
        ys = None
        if self.mode == "decode":
            k_LxBxSxKxH, v_LxBxSxKxH = cache
            rows_B = jnp.arange(x_BxTxD.shape[0])
            write = (layer_idx, rows_B, ctx.write_pos_B)
            k_LxBxSxKxH = k_LxBxSxKxH.at[write].set(k_BxTxKxH[:, 0].astype(k_LxBxSxKxH.dtype))
            v_LxBxSxKxH = v_LxBxSxKxH.at[write].set(v_BxTxKxH[:, 0].astype(v_LxBxSxKxH.dtype))
            cache = (k_LxBxSxKxH, v_LxBxSxKxH)
            keys_BxSxKxH = k_LxBxSxKxH[layer_idx].astype(self.compute_dtype)
            values_BxSxKxH = v_LxBxSxKxH[layer_idx].astype(self.compute_dtype)
        else:
            keys_BxSxKxH, values_BxSxKxH = k_BxTxKxH, v_BxTxKxH
            if self.mode == "prefill":
                ys = (k_BxTxKxH.astype(self.cache_dtype), v_BxTxKxH.astype(self.cache_dtype))
        if ctx.segment_ids_BxT is None:  # decode, or the materialised-mask `xla` kernel
            mask_BxTxS = _pick(is_sliding, ctx.mask_sliding_BxTxS, ctx.mask_full_BxTxS)
            attn_BxTxNxH = attend(
                q_BxTxNxH, keys_BxSxKxH, values_BxSxKxH, mask_BxTxS, q_chunk=self.attn_chunk
            )
        else:
            attn_BxTxNxH = attention(
                q_BxTxNxH, keys_BxSxKxH, values_BxSxKxH, ctx.segment_ids_BxT,
                impl=self.attention_kernel,
                sliding_window=cfg.sliding_window if cfg.has_sliding else None,
                is_sliding=is_sliding if cfg.has_sliding and not all_sliding(cfg) else None,
                chunk=self.attn_chunk, max_segments=self.max_segments,
                branches=self.segment_branches, **shard,
            )  # fmt: skip
        out_BxTxD = OutProjection(cfg, name="attn_out", **dtypes)(attn_BxTxNxH)
        if cfg.post_norm:
            out_BxTxD = attn_norm(out_BxTxD)
        x_BxTxD = x_BxTxD + out_BxTxD

        h_BxTxD = x_BxTxD if cfg.post_norm else mlp_norm(x_BxTxD)
        out_BxTxD = Mlp(cfg, name="mlp", **dtypes, **shard)(h_BxTxD)
        if cfg.post_norm:
            out_BxTxD = mlp_norm(out_BxTxD)
        x_BxTxD = sharding.constrain(
            x_BxTxD + out_BxTxD, ("batch", "activation_length", "activation_embed"), **shard
        )
        return (x_BxTxD, cache), ys


def _embed_init(std: float, pad_token_id: int | None):
    """Normal(0, std) rows with the padding row zeroed, as HF initialises `nn.Embedding`."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> jax.Array:
        table = std * jax.random.normal(key, shape, dtype)
        if pad_token_id is not None and 0 <= pad_token_id < shape[0]:
            table = table.at[pad_token_id].set(0)
        return table

    return init


class Decoder(nn.Module):
    """The full model. `mode` selects forward / prefill / decode; params are the same."""

    config: ArchConfig
    mode: str = "forward"
    compute_dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    cache_dtype: Dtype = jnp.float32
    mesh: Mesh | None = None
    rules: sharding.Rules | None = None
    remat: bool = False
    attn_chunk: int = 0
    """Queries per attention chunk of the `xla` kernel (0 = all at once; see `attend`); the
    tile size of `blockwise` when > 0."""
    attention_impl: str = "xla"
    """Attention in forward/prefill (`rlvr_jax.models.attention`: auto | xla | blockwise |
    cudnn | splash); decode always attends to its cache with masks."""
    max_segments: int = 0
    segment_branches: int = 1
    """Sequences per row at most (0 = unknown); cuDNN's packed layout needs it."""

    @nn.compact
    def __call__(
        self,
        tokens_BxT: jax.Array,
        positions_BxT: jax.Array,
        segment_ids_BxT: jax.Array | None = None,
        cache: tuple[jax.Array, jax.Array] | None = None,
        return_hidden: bool = False,
    ) -> tuple[jax.Array, Any]:
        """Returns (logits fp32 [B, T, V] or final hidden [B, T, D], kv) where kv is None
        (forward), the prefill K/V [L, B, T, K, H] pair, or the updated decode cache pair."""
        cfg = self.config
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        shard = dict(mesh=self.mesh, rules=self.rules)
        embedding_VxD = self.param(
            "embedding",
            nn.with_logical_partitioning(
                _embed_init(cfg.init_std, cfg.pad_token_id), ("vocab", "embed")
            ),
            (cfg.vocab_size, cfg.d_model),
            self.param_dtype,
        )
        x_BxTxD = jnp.take(embedding_VxD, tokens_BxT, axis=0).astype(self.compute_dtype)
        x_BxTxD = sharding.constrain(
            x_BxTxD, ("batch", "activation_length", "activation_embed"), **shard
        )
        kernel = "xla"
        if self.mode != "decode":
            kernel = resolve_impl(
                self.attention_impl, compute_dtype=self.compute_dtype, head_dim=cfg.head_dim,
                max_segments=self.max_segments, branches=self.segment_branches,
            )  # fmt: skip
        ctx = self._context(positions_BxT, segment_ids_BxT, cache, kernel)

        layer_cls = nn.remat(DecoderLayer, prevent_cse=False) if self.remat else DecoderLayer
        layers = nn.scan(
            layer_cls,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=(0, nn.broadcast),
            length=cfg.n_layers,
            metadata_params={nn.PARTITION_NAME: "layers"},
        )(
            cfg,
            self.mode,
            self.compute_dtype,
            self.param_dtype,
            self.cache_dtype,
            name="layers",
            attn_chunk=self.attn_chunk if self.mode != "decode" else 0,
            attention_kernel=kernel,
            max_segments=self.max_segments,
            segment_branches=self.segment_branches,
            **shard,
        )
        layer_idx_L = jnp.arange(cfg.n_layers, dtype=jnp.int32)
        is_sliding_L = jnp.asarray(np.array([t == SLIDING for t in cfg.layer_types]))
        (x_BxTxD, cache), ys = layers((x_BxTxD, cache), (layer_idx_L, is_sliding_L), ctx)
        kv = cache if self.mode == "decode" else ys

        h_BxTxD = RMSNorm(
            (cfg.d_model,),
            ("norm",),
            eps=cfg.norm_eps,
            weight_in_fp32=cfg.norm_weight_in_fp32,
            param_dtype=self.param_dtype,
            name="final_norm",
        )(x_BxTxD)
        if return_hidden:
            return h_BxTxD, kv
        return self._lm_head(h_BxTxD, embedding_VxD), kv

    def _context(
        self,
        positions_BxT: jax.Array,
        segment_ids_BxT: jax.Array | None,
        cache: tuple[jax.Array, jax.Array] | None,
        kernel: str,
    ) -> LayerContext:
        cfg = self.config
        window = cfg.sliding_window if cfg.has_sliding else None
        write_pos_B = kernel_segments_BxT = None
        if self.mode == "decode":
            if cache is None:
                raise ValueError("decode mode needs a cache")
            write_pos_B = positions_BxT[:, 0]
            mask_full, mask_sliding = cache_masks(write_pos_B, cache[0].shape[2], window)
        elif segment_ids_BxT is None:
            raise ValueError(f"{self.mode} mode needs segment ids")
        elif kernel == "xla":
            mask_full, mask_sliding = segment_masks(segment_ids_BxT, window, self.segment_branches)
        else:  # the kernel builds its masks from the segment ids, tile by tile
            mask_full = mask_sliding = None
            kernel_segments_BxT = segment_ids_BxT
        cos_full, sin_full, cos_sliding, sin_sliding = rope_tables(cfg, positions_BxT)
        return LayerContext(
            cos_full, sin_full, cos_sliding, sin_sliding, mask_full, mask_sliding, write_pos_B,
            kernel_segments_BxT,
        )  # fmt: skip

    def _lm_head(self, h_BxTxD: jax.Array, embedding_VxD: jax.Array) -> jax.Array:
        """Logits in fp32 (hidden states and weights upcast), whatever the compute dtype."""
        cfg = self.config
        h32_BxTxD = h_BxTxD.astype(jnp.float32)
        if cfg.tie_embeddings:
            logits_BxTxV = jnp.einsum("BTD,VD->BTV", h32_BxTxD, embedding_VxD.astype(jnp.float32))
        else:
            kernel_DxV = self.param(
                "lm_head",
                nn.with_logical_partitioning(
                    nn.initializers.normal(cfg.init_std), ("embed", "vocab")
                ),
                (cfg.d_model, cfg.vocab_size),
                self.param_dtype,
            )
            logits_BxTxV = jnp.einsum("BTD,DV->BTV", h32_BxTxD, kernel_DxV.astype(jnp.float32))
        return sharding.constrain(
            logits_BxTxV, ("batch", "activation_length", "activation_vocab"), self.mesh, self.rules
        )
