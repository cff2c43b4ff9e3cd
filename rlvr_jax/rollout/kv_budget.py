"""The paged KV cache's budget: how many pages a configuration buys (shared by
`EngineCore` and the dry-run plan)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from rlvr_jax.models import ArchConfig
from rlvr_jax.rollout.pages import pages_for


def pool_pages(
    config: ArchConfig,
    *,
    max_slots: int,
    max_len: int,
    shards: int,
    tensor: int,
    cache_dtype: Any,
    page_size: int,
    kv_pages: int | None,
    kv_cache_gib: float | None,
) -> int:
    """Pages of a paged engine's pool, all `shards` together, each shard's trash page
    included: `kv_pages` allocatable pages, or what `kv_cache_gib` GiB per device holds
    (KV heads split over `tensor` when it divides them), or by default `max_slots` rows of
    `max_len` positions. Used by `EngineCore` and by the dry-run plan."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if kv_pages is not None and kv_cache_gib is not None:
        raise ValueError("give kv_pages or kv_cache_gib, not both")
    if kv_pages is not None:
        if kv_pages < 1:
            raise ValueError(f"kv_pages must be >= 1, got {kv_pages}")
        per_shard = -(-kv_pages // shards) + 1
    elif kv_cache_gib is not None:
        heads = config.n_kv_heads
        heads = heads // tensor if heads % tensor == 0 else heads
        per_page = 2 * config.n_layers * heads * page_size * config.head_dim
        per_page *= jnp.dtype(cache_dtype).itemsize
        per_shard = int(kv_cache_gib * 1024**3) // per_page
        if per_shard < 2:
            raise ValueError(
                f"kv_cache_gib={kv_cache_gib} holds {per_shard} pages of {per_page} bytes per "
                "device; at least 2 are needed"
            )
    else:
        per_shard = max_slots // shards * pages_for(max_len, page_size) + 1
    return per_shard * shards
