"""The paged engine's device functions: decode over the page pool, chunked prefill into
pages (`extend`), slot activation, page copies, and writing a dense prefix into pages.

Every function reads pages through host-built block tables of *local* page ids: on a mesh,
shard s of the slot axes owns slots [s·B/S, (s+1)·B/S) and pages [s·P/S, (s+1)·P/S), and the
pool-touching part runs under `shard_map` so that a gather never leaves its shard. KV heads
split over the tensor axis the same way as the contiguous cache's. A single sequence's
prefill runs on every shard (like any batch-1 work on a data-parallel mesh); only the shard
that owns its pages writes them, and its attention output is the one kept.

`extend` is the one way K/V enter the pool outside decode: prompt chunks, the recompute of a
preempted sequence, and (later) forced tokens appended to a running sequence all write
tokens [start, start + length) of a sequence and attend to everything before them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as Pspec

from rlvr_jax.models.config import SLIDING
from rlvr_jax.rollout.device import attention as paged_attention
from rlvr_jax.rollout.device import kernel
from rlvr_jax.rollout.device.state import (
    DecodeState,
    EngineSpec,
    Prefix,
    SlotSettings,
    constrain,
    start_slots,
    state_shardings,
    with_kv,
)


@flax.struct.dataclass
class PagedWork:
    """The host's description of one decode call: block tables and work lists.

    Lists are per shard ([S, R]); slot ids in them are local to the shard, padding entries
    carry slot = B/S. The sliding lists (None without sliding layers) hold only the blocks
    that meet each slot's window."""

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
    """(page_T, offset_T): where each of a sequence's positions goes in its pages `table_M`
    (the trash page 0 for the invalid ones)."""
    page_T = jnp.where(valid_T, table_M[jnp.minimum(positions_T // z, table_M.shape[0] - 1)], 0)
    return page_T, positions_T % z


def _shard_map(spec: EngineSpec, fn: Callable, in_specs: tuple, out_specs: Any) -> Callable:
    """`fn` under shard_map on the engine's mesh (the plain function without a mesh)."""
    if spec.mesh is None:
        return fn
    return jax.shard_map(
        fn, mesh=spec.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
    )


def _shard_index(spec: EngineSpec) -> jax.Array:
    """This shard's index along the slot axes (inside shard_map; 0 without a mesh)."""
    axes = spec.slot_spec
    if spec.mesh is None or axes is None:
        return jnp.zeros((), jnp.int32)
    return jax.lax.axis_index(axes)


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
    g = spec.geometry
    if impl == "pallas_tpu":
        out = paged_attention.decode_pallas_tpu(
            q_BxNxH, k_pages, v_pages, positions_B, table_BxM, geometry=g
        )
    elif impl == "pallas_gpu":
        out = paged_attention.decode_pallas_gpu(
            q_BxNxH, k_pages, v_pages, positions_B, table_BxM, geometry=g
        )
    else:
        out = paged_attention.decode_xla(
            q_BxNxH,
            k_pages,
            v_pages,
            positions_B,
            table_BxM,
            slot_SxR[0],
            block_SxR[0],
            count_S[0],
            geometry=g,
            window=window,
        )
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
    """One token per slot: writes its K/V into the slot's page at its position (idle slots
    write the trash page) and attends over the slot's pages. (logits fp32 [B, V], k, v)."""
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
        out_BxNxH, kp, vp = _shard_map(spec, fn, in_specs, (heads, pool, pool))(
            q_Bx1xNxH[:, 0], k_Bx1xKxH[:, 0], v_Bx1xKxH[:, 0], *kv, *where, *lists_
        )
        return out_BxNxH[:, None].astype(q_Bx1xNxH.dtype), (kp, vp)

    x_Bx1xD, kv = kernel.run_layers(
        dp,
        spec.config,
        tokens_B[:, None],
        positions_B[:, None],
        tuple(zip(k_pages, v_pages)),
        attention,
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
    mine = _shard_index(spec) == shard
    page_T = jnp.where(mine, page_T, 0)
    k_pages, v_pages = paged_attention.write_tokens(
        k_pages, v_pages, k_TxKxH, v_TxKxH, page_T, offset_T
    )
    out = paged_attention.context_attention(
        q_TxNxH,
        k_pages,
        v_pages,
        positions_T,
        table_M,
        first,
        end,
        geometry=spec.geometry,
        window=window,
    )
    if spec.mesh is not None and spec.slot_spec is not None:
        out = jax.lax.psum(jnp.where(mine, out, 0.0), spec.slot_spec)
    return out, k_pages, v_pages


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def extend(
    dp: kernel.DecodeParams,
    state: DecodeState,
    tokens_T: jax.Array,
    start: jax.Array,
    length: jax.Array,
    table_M: jax.Array,
    shard: jax.Array,
    *,
    spec: EngineSpec,
) -> DecodeState:
    """`state` (donated) with the K/V of `tokens_T[:length]` at positions `start ..` of the
    sequence whose pages (shard `shard`, local ids) are `table_M`, each token attending to
    the sequence's earlier tokens. Pages must already hold positions [0, start)."""
    t = tokens_T.shape[0]
    positions_T = start + jnp.arange(t, dtype=jnp.int32)
    pages = _token_pages(table_M, positions_T, jnp.arange(t) < length, spec.page_size)
    where = (positions_T, *pages, table_M, shard)  # every layer's
    end = start + length
    pool, rep, heads = _pool_spec(spec), Pspec(), Pspec(None, _heads_spec(spec), None)
    in_specs = (heads, heads, heads, pool, pool, rep, rep, rep, rep, rep, rep, rep)

    def attention(i, kv, q_1xTxNxH, k_1xTxKxH, v_1xTxKxH):
        window = _window(spec, i)
        first = jnp.zeros((), jnp.int32) if window is None else jnp.maximum(start - window + 1, 0)
        fn = functools.partial(_extend_local, spec=spec, window=window)
        out_TxNxH, kp, vp = _shard_map(spec, fn, in_specs, (heads, pool, pool))(
            q_1xTxNxH[0], k_1xTxKxH[0], v_1xTxKxH[0], *kv, *where, first, end
        )
        return out_TxNxH[None].astype(q_1xTxNxH.dtype), (kp, vp)

    _, kv = kernel.run_layers(
        dp, spec.config, tokens_T[None], positions_T[None], tuple(zip(state.k, state.v)), attention
    )
    return with_kv(state, kv, spec)


def _copy_local(k_pages, v_pages, src_SxN, dst_SxN):
    k_pages = k_pages.at[:, dst_SxN[0]].set(jnp.take(k_pages, src_SxN[0], axis=1))
    v_pages = v_pages.at[:, dst_SxN[0]].set(jnp.take(v_pages, src_SxN[0], axis=1))
    return k_pages, v_pages


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def copy_pages(
    state: DecodeState, src_SxN: jax.Array, dst_SxN: jax.Array, *, spec: EngineSpec
) -> DecodeState:
    """`state` (donated) with page `src[s, i]` copied to `dst[s, i]` in shard s, every layer
    (copy-on-write of a shared prompt's last, partial page; padding pairs are 0 -> 0)."""
    pool, lists = _pool_spec(spec), Pspec(spec.slot_spec, None)
    copy = _shard_map(spec, _copy_local, (pool, pool, lists, lists), (pool, pool))
    return with_kv(state, [copy(k, v, src_SxN, dst_SxN) for k, v in zip(state.k, state.v)], spec)


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def write_prefix(
    state: DecodeState, prefix: Prefix, table_M: jax.Array, shard: jax.Array, *, spec: EngineSpec
) -> DecodeState:
    """`state` (donated) with a dense `Prefix`'s K/V written into the pages `table_M` of
    shard `shard` (the JetStream adapter's insert)."""
    pos_T = jnp.arange(prefix.k[0].shape[2], dtype=jnp.int32)
    pages = _token_pages(table_M, pos_T, pos_T < prefix.length, spec.page_size)
    pool, rep, heads = _pool_spec(spec), Pspec(), Pspec(None, _heads_spec(spec), None)

    def write(k_pages, v_pages, k_TxKxH, v_TxKxH, page_T, offset_T, shard):
        page_T = jnp.where(_shard_index(spec) == shard, page_T, 0)
        return paged_attention.write_tokens(k_pages, v_pages, k_TxKxH, v_TxKxH, page_T, offset_T)

    fn = _shard_map(spec, write, (pool, pool, heads, heads, rep, rep, rep), (pool, pool))
    kv = [
        fn(k, v, jnp.einsum("KTH->TKH", pk[0]), jnp.einsum("KTH->TKH", pv[0]), *pages, shard)
        for k, v, pk, pv in zip(state.k, state.v, prefix.k, prefix.v)
    ]
    return with_kv(state, kv, spec)


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def activate(
    state: DecodeState,
    settings: SlotSettings,
    token_B: jax.Array,
    position_B: jax.Array,
    *,
    spec: EngineSpec,
) -> DecodeState:
    """`state` (donated) with slots `settings.slots_B` (B = unused) starting, or resuming,
    their requests: next input `token_B`, at position `position_B` (its K/V not cached yet;
    every earlier position is in the slot's pages)."""
    state = start_slots(state, settings, token_B, position_B)
    return constrain(state, state_shardings(spec))


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def deactivate(state: DecodeState, slots_B: jax.Array, *, spec: EngineSpec) -> DecodeState:
    """`state` (donated) with slots `slots_B` (B = unused) stopped (preempted)."""
    state = state.replace(active_B=state.active_B.at[slots_B].set(False, mode="drop"))
    return constrain(state, state_shardings(spec))
