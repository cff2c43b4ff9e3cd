"""KV cache for the rollout engine: fixed-shape, one row (slot) per sequence.

Slot index == token position: the K/V of the token at position p of row b live at
`k[:, b, p]`. Keys are stored after RoPE. `prefill` runs right-padded prompts and returns
their K/V; `insert` copies them into slots of a larger cache; `decode_step` appends one token
per row at `positions_B` and attends to slots <= that position (the most recent W on sliding
layers). All three are pure and jittable (`config` and dtypes static); `decode_step` is meant
to run under jit with the cache donated, inside a `lax.scan`/`while_loop` of several steps.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rlvr_jax.models.config import ArchConfig
from rlvr_jax.models.decoder import Decoder
from rlvr_jax.models.params import as_dtype
from rlvr_jax.sharding import Rules

Dtype = Any

CACHE_AXES = ("layers", "cache_batch", "cache_sequence", "cache_kv_heads", "head_dim")
"""Logical axes of `KVCache.k` / `KVCache.v`."""


@flax.struct.dataclass
class KVCache:
    """Rotated keys and values of every layer: k, v [L, B, S, K, H]."""

    k: jax.Array
    v: jax.Array

    @property
    def batch(self) -> int:
        """B: rows (decode slots)."""
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        """S: positions each row can hold."""
        return self.k.shape[2]


def cache_logical_axes() -> KVCache:
    """Logical axes of a `KVCache` (a KVCache of axis-name tuples), for `logical_to_sharding`."""
    return KVCache(k=CACHE_AXES, v=CACHE_AXES)


def init_cache(config: ArchConfig, batch_B: int, max_len_S: int, dtype: Dtype) -> KVCache:
    """An all-zero cache of `batch_B` rows of `max_len_S` positions."""
    shape = (config.n_layers, batch_B, max_len_S, config.n_kv_heads, config.head_dim)
    return KVCache(k=jnp.zeros(shape, as_dtype(dtype)), v=jnp.zeros(shape, as_dtype(dtype)))


def prefill(
    params: Any,
    config: ArchConfig,
    tokens_BxT: jax.Array,
    lengths_B: jax.Array,
    *,
    compute_dtype: Dtype = jnp.float32,
    cache_dtype: Dtype | None = None,
    mesh: Mesh | None = None,
    rules: Rules | None = None,
) -> tuple[jax.Array, KVCache]:
    """Runs right-padded prompts (row b's real tokens are `tokens_BxT[b, :lengths_B[b]]`).

    Returns (logits fp32 [B, T, V], KVCache with S = T). Logits and cache entries at
    t >= length are padding: finite, never attended to by `decode_step` at positions > t-1
    because decode overwrites slot t before reading it.
    """
    t = tokens_BxT.shape[1]
    positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None, :], tokens_BxT.shape)
    segment_ids_BxT = (positions_BxT < lengths_B[:, None]).astype(jnp.int32)
    compute = as_dtype(compute_dtype)
    module = Decoder(
        config,
        mode="prefill",
        compute_dtype=compute,
        param_dtype=params["embedding"].dtype,
        cache_dtype=compute if cache_dtype is None else as_dtype(cache_dtype),
        mesh=mesh,
        rules=rules,
    )
    logits_BxTxV, (k_LxBxTxKxH, v_LxBxTxKxH) = module.apply(
        {"params": params}, tokens_BxT, positions_BxT, segment_ids_BxT
    )
    return logits_BxTxV, KVCache(k=k_LxBxTxKxH, v=v_LxBxTxKxH)


def insert(cache: KVCache, prefix: KVCache, slot: jax.Array | int) -> KVCache:
    """`cache` with rows `slot .. slot + prefix.batch - 1` starting with `prefix`'s positions
    (later positions of those rows are left as they were; decode overwrites them)."""
    if prefix.max_len > cache.max_len:
        raise ValueError(f"prefix of {prefix.max_len} positions > cache of {cache.max_len}")
    start = (0, slot, 0, 0, 0)
    return KVCache(
        k=jax.lax.dynamic_update_slice(cache.k, prefix.k.astype(cache.k.dtype), start),
        v=jax.lax.dynamic_update_slice(cache.v, prefix.v.astype(cache.v.dtype), start),
    )


def decode_step(
    params: Any,
    config: ArchConfig,
    tokens_B: jax.Array,
    positions_B: jax.Array,
    cache: KVCache,
    *,
    compute_dtype: Dtype = jnp.float32,
    mesh: Mesh | None = None,
    rules: Rules | None = None,
) -> tuple[jax.Array, KVCache]:
    """One token per row: writes its K/V at `positions_B` (must be < S) and attends to
    slots <= `positions_B` of its row. Returns (logits fp32 [B, V], updated cache)."""
    module = Decoder(
        config,
        mode="decode",
        compute_dtype=as_dtype(compute_dtype),
        param_dtype=params["embedding"].dtype,
        cache_dtype=cache.k.dtype,
        mesh=mesh,
        rules=rules,
    )
    logits_Bx1xV, (k, v) = module.apply(
        {"params": params},
        tokens_B[:, None],
        positions_B[:, None].astype(jnp.int32),
        None,
        (cache.k, cache.v),
    )
    return logits_Bx1xV[:, 0], KVCache(k=k, v=v)
