"""The paged layout's device side: decode over the page pool, `extend`'s attention, page copies,
and the arrays that describe pages to the device (block tables, work lists, the static
assignment). Block tables hold *local* page ids: slot shard s owns its slots and its range of
pages, the pool-touching parts run under `shard_map` (no gather leaves its shard), and one
sequence's prefill runs on every shard, only its owner writing its pages."""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as Pspec

from rlvr_jax.models.config import SLIDING
from rlvr_jax.rollout.device import attention as paged_attention
from rlvr_jax.rollout.device import kernel
from rlvr_jax.rollout.device.attention import PageGeometry
from rlvr_jax.rollout.device.state import EngineSpec, shard_index, shard_map


class PageError(RuntimeError):
    """A page invariant would be broken (double free, foreign page, a work list overflow...)."""


@flax.struct.dataclass
class PagedWork:
    """One decode call's block tables and per-shard work lists ([S, R], local slot ids, padding
    slot = B/S); the sliding lists (None without sliding layers) hold the blocks in each window."""

    table_BxM: jax.Array  # int32 local page ids, 0 = trash
    slot_SxR: jax.Array
    block_SxR: jax.Array
    count_S: jax.Array
    wslot_SxR: jax.Array | None = None
    wblock_SxR: jax.Array | None = None
    wcount_S: jax.Array | None = None


def _window(spec: EngineSpec, layer: int) -> int | None:
    cfg = spec.config
    return cfg.sliding_window if cfg.layer_types[layer] == SLIDING else None


def _heads_spec(spec: EngineSpec) -> Any:
    return None if spec.mesh is None else spec.kv_layout.kv_sharding(spec).spec[0]


def _pool_spec(spec: EngineSpec) -> Pspec:
    """The page pool's partition (KV heads over tensor, pages split like slots)."""
    return Pspec(_heads_spec(spec), spec.slot_spec, None, None)


def _token_pages(table_M: jax.Array, positions_T: jax.Array, valid_T: jax.Array, z: int) -> tuple:
    """(page_T, offset_T) of each position in the pages `table_M` (invalid ones: trash page 0)."""
    page_T = jnp.where(valid_T, table_M[jnp.minimum(positions_T // z, table_M.shape[0] - 1)], 0)
    return page_T, positions_T % z


def _decode_local(
    q_BxNxH,
    k_BxKxH,
    v_BxKxH,
    k_pages,
    v_pages,
    positions_B,
    page_B,
    offset_B,
    table_BxM,
    slot_SxR,
    block_SxR,
    count_S,
    *,
    spec: EngineSpec,
    window: int | None,
    impl: str,
):
    k_pages, v_pages = paged_attention.write_tokens(
        k_pages, v_pages, k_BxKxH, v_BxKxH, page_B, offset_B
    )
    g, args = spec.geometry, (q_BxNxH, k_pages, v_pages, positions_B, table_BxM)
    if impl != "xla":  # decode_pallas_tpu or decode_pallas_gpu
        out = getattr(paged_attention, f"decode_{impl}")(*args, geometry=g)
    else:
        lists = (slot_SxR[0], block_SxR[0], count_S[0])
        out = paged_attention.decode_xla(*args, *lists, geometry=g, window=window)
    return out, k_pages, v_pages


def decode_logits(
    dp: kernel.DecodeParams,
    spec: EngineSpec,
    tokens_B: jax.Array,
    positions_B: jax.Array,
    active_B: jax.Array,
    k_pages: tuple[jax.Array, ...],
    v_pages: tuple[jax.Array, ...],
    work: PagedWork,
) -> tuple[jax.Array, tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """One token per slot, its K/V written at its position (idle slots: the trash page), attending
    over the slot's pages. Returns (logits fp32 [B, V], k, v)."""
    z = spec.page_size
    rows_B = jnp.arange(tokens_B.shape[0])
    page_B = jnp.where(active_B, work.table_BxM[rows_B, positions_B // z], 0)
    where = (positions_B, page_B, positions_B % z, work.table_BxM)  # every layer's
    sa, ha = spec.slot_spec, _heads_spec(spec)
    pool, per_slot = _pool_spec(spec), Pspec(sa)
    heads, lists = Pspec(sa, ha, None), Pspec(sa, None)
    in_specs = (heads, heads, heads, pool, pool, per_slot, per_slot, per_slot)
    in_specs = (*in_specs, lists, lists, lists, per_slot)  # table, work lists, counts

    def attention(i, kv, q_Bx1xNxH, k_Bx1xKxH, v_Bx1xKxH):
        window = _window(spec, i)
        sliding = window is not None
        fn = functools.partial(
            _decode_local, spec=spec, window=window, impl="xla" if sliding else spec.attention
        )
        lists_ = (
            (work.wslot_SxR, work.wblock_SxR, work.wcount_S)
            if sliding
            else (work.slot_SxR, work.block_SxR, work.count_S)
        )
        out_BxNxH, kp, vp = shard_map(spec, fn, in_specs, (heads, pool, pool))(
            q_Bx1xNxH[:, 0], k_Bx1xKxH[:, 0], v_Bx1xKxH[:, 0], *kv, *where, *lists_
        )
        return out_BxNxH[:, None].astype(q_Bx1xNxH.dtype), (kp, vp)

    caches = tuple(zip(k_pages, v_pages))
    x_Bx1xD, kv = kernel.run_layers(
        dp, spec.config, tokens_B[:, None], positions_B[:, None], caches, attention
    )
    logits_BxV = kernel.logits(dp, spec.config, x_Bx1xD[:, 0])
    return logits_BxV, tuple(k for k, _ in kv), tuple(v for _, v in kv)


def _extend_local(
    q_TxNxH,
    k_TxKxH,
    v_TxKxH,
    k_pages,
    v_pages,
    positions_T,
    page_T,
    offset_T,
    table_M,
    shard,
    first,
    end,
    *,
    spec: EngineSpec,
    window: int | None,
):
    mine = shard_index(spec) == shard
    page_T = jnp.where(mine, page_T, 0)
    k_pages, v_pages = paged_attention.write_tokens(
        k_pages, v_pages, k_TxKxH, v_TxKxH, page_T, offset_T
    )
    g = spec.geometry
    out = paged_attention.context_attention(
        q_TxNxH, k_pages, v_pages, positions_T, table_M, first, end, geometry=g, window=window
    )
    if spec.mesh is not None and spec.slot_spec is not None:
        out = jax.lax.psum(jnp.where(mine, out, 0.0), spec.slot_spec)
    return out, k_pages, v_pages


def extend_attention(
    spec: EngineSpec,
    positions_T: jax.Array,
    valid_T: jax.Array,
    table_M: jax.Array,
    shard: jax.Array,
    end: jax.Array,
) -> kernel.Attention:
    """Each layer's attention of `decode.extend`: the new tokens' K/V written into the pages
    `table_M` of `shard`, each query attending to positions < `end` of those pages."""
    start = positions_T[0]
    pages = _token_pages(table_M, positions_T, valid_T, spec.page_size)
    where = (positions_T, *pages, table_M, shard)  # every layer's
    pool, rep, heads = _pool_spec(spec), Pspec(), Pspec(None, _heads_spec(spec), None)
    in_specs = (heads, heads, heads, pool, pool, rep, rep, rep, rep, rep, rep, rep)

    def attention(i, kv, q_1xTxNxH, k_1xTxKxH, v_1xTxKxH):
        window = _window(spec, i)
        first = jnp.zeros((), jnp.int32) if window is None else jnp.maximum(start - window + 1, 0)
        fn = functools.partial(_extend_local, spec=spec, window=window)
        out_TxNxH, kp, vp = shard_map(spec, fn, in_specs, (heads, pool, pool))(
            q_1xTxNxH[0], k_1xTxKxH[0], v_1xTxKxH[0], *kv, *where, first, end
        )
        return out_TxNxH[None].astype(q_1xTxNxH.dtype), (kp, vp)

    return attention


def _copy_local(k_pages, v_pages, src_SxN, dst_SxN):
    k_pages = k_pages.at[:, dst_SxN[0]].set(jnp.take(k_pages, src_SxN[0], axis=1))
    v_pages = v_pages.at[:, dst_SxN[0]].set(jnp.take(v_pages, src_SxN[0], axis=1))
    return k_pages, v_pages


def copy_pages(
    spec: EngineSpec, k: tuple, v: tuple, src_SxN: jax.Array, dst_SxN: jax.Array
) -> list[tuple[jax.Array, jax.Array]]:
    """Each layer's (k, v) pools with page `src[s, i]` copied to `dst[s, i]` in shard s
    (`decode.copy_pages`)."""
    pool, lists = _pool_spec(spec), Pspec(spec.slot_spec, None)
    copy = shard_map(spec, _copy_local, (pool, pool, lists, lists), (pool, pool))
    return [copy(k_l, v_l, src_SxN, dst_SxN) for k_l, v_l in zip(k, v)]


# ---- the arrays that describe pages to the device ------------------------------------------


def pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def work_lists(
    ends: dict[int, int],
    starts: dict[int, int],
    *,
    slots_per_shard: int,
    shards: int,
    length: int,
    geometry: PageGeometry,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode work lists ([S, R] slot, [S, R] block, [S] count): slot b (global) reads blocks
    `starts[b] // T .. ends[b] // T` (T tokens per block), in slot order; padding carries the
    local slot id `slots_per_shard` (dropped)."""
    slot_SxR = np.full((shards, length), slots_per_shard, np.int32)
    block_SxR = np.zeros((shards, length), np.int32)
    count_S = np.zeros((shards,), np.int32)
    t = geometry.block_tokens
    for b in sorted(ends):
        s, local = divmod(b, slots_per_shard)
        first, last = starts[b] // t, ends[b] // t
        n, at = last - first + 1, count_S[s]
        if at + n > length:
            raise PageError(f"work list of shard {s} overflows its {length} entries")
        slot_SxR[s, at : at + n] = local
        block_SxR[s, at : at + n] = np.arange(first, last + 1)
        count_S[s] = at + n
    return slot_SxR, block_SxR, count_S


# ---- the static assignment (callers that track no pages: the JetStream adapter) -------------


def static_slots(spec: EngineSpec) -> int:
    """Slots the static assignment serves (each owns `max_len` positions of pages)."""
    per_seq = pages_for(spec.max_len, spec.page_size)
    return min(spec.max_slots // spec.shards, (spec.pages_per_shard - 1) // per_seq) * spec.shards


def static_table(spec: EngineSpec) -> np.ndarray:
    """Block tables [B, M] of the static assignment (slots past `static_slots` get none)."""
    per_seq, per_shard = pages_for(spec.max_len, spec.page_size), spec.max_slots // spec.shards
    usable = static_slots(spec) // spec.shards
    table = np.zeros((spec.max_slots, spec.max_pages), np.int32)
    for b in range(spec.max_slots):
        if b % per_shard < usable:
            table[b, :per_seq] = 1 + (b % per_shard) * per_seq + np.arange(per_seq)
    return table


@functools.cache
def static_work(spec: EngineSpec) -> PagedWork:
    """`PagedWork` reading every page of the static assignment (a slot's whole `max_len`)."""
    table = static_table(spec)
    usable = [b for b in range(spec.max_slots) if table[b, 0]]
    full = work_lists(
        dict.fromkeys(usable, spec.max_len - 1),
        dict.fromkeys(usable, 0),
        slots_per_shard=spec.max_slots // spec.shards,
        shards=spec.shards,
        length=spec.work_len,
        geometry=spec.geometry,
    )
    return PagedWork(table, *full, *(full if spec.config.has_sliding else (None, None, None)))
