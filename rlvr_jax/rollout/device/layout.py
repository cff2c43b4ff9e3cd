"""The engine's KV layout (`kv_layout(name)`, held by `EngineSpec.kv_layout`): everything that
differs between the two on the device is a method of it (cache shape and sharding, the pool a
budget buys, decode and `extend` attention, page copies), so no caller tests a name. The host
(`rlvr_jax.rollout.host`) tracks the pages.

- `PAGED` (default): a pool of `num_pages` pages of `page_size` tokens per layer, [K, P, Z, H];
  slots hold block tables, so KV memory is a budget of its own and decode reads only live pages.
- `CONTIGUOUS` (the baseline): a [K, S, H] row per slot and layer (S = `max_len`); to the host, a
  row is one page of `max_len` bound to its slot (page b + 1 of a shard is slot b's row).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from rlvr_jax.models import ArchConfig
from rlvr_jax.models.config import SLIDING
from rlvr_jax.models.layers import attend
from rlvr_jax.rollout.device import attention as paged_attention
from rlvr_jax.rollout.device import kernel
from rlvr_jax.rollout.device import paged as paged_ops
from rlvr_jax.rollout.device.compile_ahead import host_struct as _host
from rlvr_jax.rollout.device.state import (
    CACHE_AXES,
    POOL_AXES,
    DecodeState,
    EngineSpec,
    named,
    shard_index,
    shard_map,
)


@dataclasses.dataclass(frozen=True)
class KVPool:
    """What a KV budget buys."""

    pages: int
    """Pages of the pool, trash pages included (0 for the contiguous layout)."""
    tokens: int
    """Tokens the cache holds, all devices together (trash pages excluded)."""
    tokens_per_device: int
    """Token rows one device holds (its slot shard's pages or rows)."""


class _Layout:
    """What both layouts share: the arithmetic of `num_pages` pages of `page_size` tokens."""

    def validate(self, spec: EngineSpec) -> None:
        """Raises ValueError unless the pool splits over the slot shards."""
        if spec.page_size < 1 or spec.prefill_chunk < 1:
            raise ValueError("page_size and prefill_chunk must be >= 1")
        if spec.max_slots % spec.shards:
            raise ValueError(
                f"max_slots={spec.max_slots} must split over {spec.shards} slot shards"
            )
        if spec.num_pages % spec.shards or spec.pages_per_shard < 2:
            raise ValueError(
                f"num_pages={spec.num_pages} must be a multiple of the {spec.shards} "
                "slot shards with at least 2 per shard (page 0 of each is reserved)"
            )

    def capacity(self, spec: EngineSpec) -> int:
        """Tokens the cache holds (the trash pages excluded)."""
        return (spec.num_pages - spec.shards) * spec.page_size

    def misfit(self, spec: EngineSpec, prompt_len: int, max_new_tokens: int) -> str | None:
        """Why a sequence cannot fit the pool on its own: it needs more pages than a slot
        shard's whole pool (None when it fits)."""
        need = paged_ops.pages_for(prompt_len + max_new_tokens, spec.page_size)
        if need <= spec.pages_per_shard - 1:
            return None
        return (
            f"prompt of {prompt_len} tokens + max_new_tokens={max_new_tokens} needs "
            f"{need} pages of {spec.page_size} tokens, more than the whole KV pool "
            f"({spec.pages_per_shard - 1} pages per slot shard; raise rollout.kv_pages or "
            "rollout.kv_cache_gib)"
        )


@dataclasses.dataclass(frozen=True)
class Contiguous(_Layout):
    """A fixed row of `max_len` positions per slot."""

    name = "contiguous"
    paged = False

    def validate(self, spec: EngineSpec) -> None:
        """Nothing to check (`configure` gives every slot its page)."""

    def configure(self, spec: EngineSpec, *, prefill_chunk: int, **_: Any) -> EngineSpec:
        """`spec` with one page of `max_len` per slot (the pool settings do not apply)."""
        return dataclasses.replace(
            spec,
            kv_layout=self,
            page_size=spec.max_len,
            num_pages=spec.max_slots + spec.shards,
            prefill_chunk=prefill_chunk,
        )

    def kv_shape(self, spec: EngineSpec) -> tuple[int, ...]:
        """[B, K, S, H]."""
        cfg = spec.config
        return (spec.max_slots, cfg.n_kv_heads, spec.max_len, cfg.head_dim)

    def kv_sharding(self, spec: EngineSpec) -> tuple[NamedSharding, ...]:
        """One per segment (`segments`): rows split like slots, KV heads over the tensor axis."""
        b, k, _, h = self.kv_shape(spec)
        return tuple(named(spec, CACHE_AXES, (b, k, n, h)) for _, n in self.segments(spec))

    def empty_cache(self, spec: EngineSpec) -> tuple[jax.Array, ...]:
        """One layer's K (or V): zeros [B, K, length, H] per segment."""
        b, k, _, h = self.kv_shape(spec)
        return tuple(jnp.zeros((b, k, n, h), spec.cache_dtype) for _, n in self.segments(spec))

    def row_buckets(self, spec: EngineSpec) -> tuple[int, ...]:
        return (spec.max_slots,)

    def pool(
        self, config: ArchConfig, *, max_slots: int, max_len: int, shards: int, **_: Any
    ) -> KVPool:
        """`max_slots` rows of `max_len` (the budget keys do not apply)."""
        return KVPool(0, max_slots * max_len, max_slots // shards * max_len)

    def decode_logits(
        self, dp: kernel.DecodeParams, spec: EngineSpec, state: DecodeState, work: None
    ) -> tuple:
        """(logits fp32 [B, V], k, v) of one decode step of every row, attending over the
        fewest leading segments that hold every live row's positions."""
        span = None
        if len(self.segments(spec)) > 1:
            span = jnp.max(jnp.where(state.active_B, state.positions_B, 0)) + 1
        return kernel.decode_logits(
            dp, spec.config, state.tokens_B, state.positions_B, state.k, state.v, span=span
        )

    def segments(self, spec: EngineSpec) -> tuple[tuple[int, int], ...]:
        """(start, length) of each segment of a layer's cache along S, ending at 1/4, 1/2, 3/4 and
        all of `max_len` (multiples of 16): a decode step reads the leading ones it needs without
        slicing one array (XLA:CPU copies a slice before a dot: 2x slower on the demo). One
        segment with several shards, or exact."""
        s = spec.max_len
        ends: tuple[int, ...] = (s,)
        if spec.shards == 1 and not spec.exact and s >= 64:
            ends = (*sorted({-(-s * q // 4 // 16) * 16 for q in (1, 2, 3)} - {s}), s)
        return tuple((a, e - a) for a, e in zip((0, *ends[:-1]), ends))

    def extend_attention(
        self,
        spec: EngineSpec,
        positions_T: jax.Array,
        valid_T: jax.Array,
        table_M: jax.Array,
        shard: jax.Array,
        end: jax.Array,
    ) -> kernel.Attention:
        """Each layer's attention of `extend`: the new tokens' K/V written into the row of page
        `table_M[0]` (local slot `table_M[0] - 1` of `shard`), each query attending causally to
        the row (the last W on sliding layers)."""
        del end  # the causal mask covers it
        cfg = spec.config
        key_S = jnp.arange(spec.max_len, dtype=jnp.int32)
        causal_TxS = key_S[None, :] <= positions_T[:, None]
        masks = (causal_TxS, causal_TxS)
        if cfg.has_sliding:
            window = cfg.sliding_window
            masks = (causal_TxS, causal_TxS & (key_S[None, :] > positions_T[:, None] - window))
        segments, heads, rep = None, None, PartitionSpec()
        if spec.mesh is not None:
            segments = tuple(sh.spec for sh in self.kv_sharding(spec))
            heads = PartitionSpec(None, segments[0][1], None)
        in_specs = (heads, heads, heads, segments, segments, rep, rep, rep, rep, rep)
        row = table_M[0] - 1

        def attention(i, kv, q_1xTxNxH, k_1xTxKxH, v_1xTxKxH):
            mask_TxS = masks[1] if cfg.layer_types[i] == SLIDING else masks[0]
            fn = functools.partial(_row_extend_local, spec=spec)
            out_TxNxH, k_c, v_c = shard_map(spec, fn, in_specs, (heads, segments, segments))(
                q_1xTxNxH[0], k_1xTxKxH[0], v_1xTxKxH[0], *kv, positions_T, valid_T, row, shard,
                mask_TxS,
            )  # fmt: skip
            return out_TxNxH[None].astype(q_1xTxNxH.dtype), (k_c, v_c)

        return attention

    def copy_pages(
        self, spec: EngineSpec, k: tuple, v: tuple, src_SxN: jax.Array, dst_SxN: jax.Array
    ) -> list[tuple[tuple, tuple]]:
        """Each layer's (k, v) segments with the row of page `src[s, i]` of shard s copied to the
        row of page `dst[s, i]` (page p of shard s is row s·B/S + p − 1; padding pairs dropped)."""
        per_shard = spec.max_slots // spec.shards
        base_Sx1 = jnp.arange(spec.shards, dtype=jnp.int32)[:, None] * per_shard - 1
        src_N = jnp.maximum(src_SxN + base_Sx1, 0).reshape(-1)
        dst_N = jnp.where(dst_SxN > 0, dst_SxN + base_Sx1, spec.max_slots).reshape(-1)

        def copy(segments: tuple) -> tuple:
            return tuple(
                seg.at[dst_N].set(jnp.take(seg, src_N, axis=0), mode="drop") for seg in segments
            )

        return [(copy(k_l), copy(v_l)) for k_l, v_l in zip(k, v)]

    def default_work(self, spec: EngineSpec) -> None:  # each row is read whole
        return None

    abstract_work = default_work


@dataclasses.dataclass(frozen=True)
class Paged(_Layout):
    """A pool of pages; slots hold block tables."""

    name = "paged"
    paged = True

    def configure(
        self,
        spec: EngineSpec,
        *,
        page_size: int,
        kv_pages: int | None,
        kv_cache_gib: float | None,
        prefill_chunk: int,
        attention: str,
        geometry_tokens: tuple[int, int, int] | None,
    ) -> EngineSpec:
        """`spec` with its pool (`pool`), page size, prefill chunk, full layers' decode attention
        for the platform (`attention.select_impl`) and walk geometry."""
        mesh = spec.mesh
        pool = self.pool(
            spec.config,
            max_slots=spec.max_slots,
            max_len=spec.max_len,
            shards=spec.shards,
            tensor=1 if mesh is None else mesh.shape["tensor"],
            cache_dtype=spec.cache_dtype,
            page_size=page_size,
            kv_pages=kv_pages,
            kv_cache_gib=kv_cache_gib,
        )
        return dataclasses.replace(
            spec,
            kv_layout=self,
            page_size=page_size,
            num_pages=pool.pages,
            prefill_chunk=prefill_chunk,
            attention=paged_attention.select_impl(
                attention, spec.platform, page_size=page_size, head_dim=spec.config.head_dim
            ),
            geometry_tokens=geometry_tokens or paged_attention.GEOMETRY_TOKENS,
        )

    def kv_shape(self, spec: EngineSpec) -> tuple[int, ...]:
        """[K, P, Z, H]."""
        cfg = spec.config
        return (cfg.n_kv_heads, spec.num_pages, spec.page_size, cfg.head_dim)

    def kv_sharding(self, spec: EngineSpec) -> NamedSharding:
        """Pages split like slots (each shard its own range), KV heads over tensor."""
        heads = named(spec, POOL_AXES, self.kv_shape(spec)).spec[0]
        return NamedSharding(spec.mesh, PartitionSpec(heads, spec.slot_spec, None, None))

    def empty_cache(self, spec: EngineSpec) -> jax.Array:
        return jnp.zeros(self.kv_shape(spec), spec.cache_dtype)

    def row_buckets(self, spec: EngineSpec) -> tuple[int, ...]:
        """Slot counts a decode call may run on: those of B/8, B/4, B/2 of at least 8, and B
        (just B with several shards, or exact)."""
        b = spec.max_slots
        if spec.shards != 1 or spec.exact:
            return (b,)
        return (*(b // d for d in (8, 4, 2) if b % d == 0 and b // d >= 8), b)

    def pool(
        self,
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
    ) -> KVPool:
        """The pool (trash included) `kv_pages` (all shards) or `kv_cache_gib` (per device, KV
        heads split over `tensor` when it divides them) buys; default `max_slots` rows."""
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
                    f"kv_cache_gib={kv_cache_gib} holds {per_shard} pages of {per_page} bytes "
                    "per device; at least 2 are needed"
                )
        else:
            per_shard = max_slots // shards * paged_ops.pages_for(max_len, page_size) + 1
        n = per_shard * shards
        return KVPool(n, (n - shards) * page_size, per_shard * page_size)

    def decode_logits(
        self,
        dp: kernel.DecodeParams,
        spec: EngineSpec,
        state: DecodeState,
        work: paged_ops.PagedWork,
    ) -> tuple:
        """(logits fp32 [B, V], k, v) of one decode step reading the pages `work` lists."""
        return paged_ops.decode_logits(
            dp, spec, state.tokens_B, state.positions_B, state.active_B, state.k, state.v, work
        )

    extend_attention = staticmethod(paged_ops.extend_attention)
    copy_pages = staticmethod(paged_ops.copy_pages)

    def default_work(self, spec: EngineSpec) -> paged_ops.PagedWork:
        return paged_ops.static_work(spec)

    def abstract_work(self, spec: EngineSpec) -> paged_ops.PagedWork:
        """Abstract `PagedWork` (the shapes the scheduler builds)."""
        s, r = spec.shards, spec.work_len
        lists = (_host((s, r)), _host((s, r)), _host((s,)))
        return paged_ops.PagedWork(
            _host((spec.max_slots, spec.max_pages)),
            *lists,
            *(lists if spec.config.has_sliding else (None, None, None)),
        )


def _row_extend_local(
    q_TxNxH, k_TxKxH, v_TxKxH, k_segments, v_segments, positions_T, valid_T, row, shard, mask_TxS,
    *, spec,
):  # fmt: skip
    """One shard's part: the new K/V written into local row `row` (by its owner), the new
    queries attending to it."""
    mine = shard_index(spec) == shard
    write_T = jnp.where(valid_T & mine, positions_T, spec.max_len)  # out of range: dropped
    row_T = jnp.full_like(positions_T, row)
    k_segments = kernel.write_tokens(k_segments, row_T, write_T, k_TxKxH)
    v_segments = kernel.write_tokens(v_segments, row_T, write_T, v_TxKxH)
    keys_1xSxKxH, values_1xSxKxH = (
        jnp.einsum("KSH->SKH", jnp.concatenate([seg[row] for seg in segs], axis=1))[None]
        for segs in (k_segments, v_segments)
    )
    # the model's attention (fp32 scores, softmax and sums) multiplies operands of one dtype
    qkv = (q_TxNxH[None], keys_1xSxKxH, values_1xSxKxH)
    if q_TxNxH.dtype != keys_1xSxKxH.dtype:
        qkv = tuple(x.astype(jnp.float32) for x in qkv)
    out_TxNxH = attend(*qkv, mask_TxS[None])[0]
    if spec.mesh is not None and spec.slot_spec is not None:
        out_TxNxH = jax.lax.psum(jnp.where(mine, out_TxNxH, 0.0), spec.slot_spec)
    return out_TxNxH, k_segments, v_segments


CONTIGUOUS = Contiguous()
PAGED = Paged()
LAYOUTS = {layout.name: layout for layout in (PAGED, CONTIGUOUS)}


def kv_layout(name: str) -> Contiguous | Paged:
    """The layout called `name` ("paged" or "contiguous")."""
    if name not in LAYOUTS:
        raise ValueError(f"kv_layout must be one of {tuple(LAYOUTS)}, got {name!r}")
    return LAYOUTS[name]


__all__ = ["CONTIGUOUS", "LAYOUTS", "PAGED", "KVPool", "kv_layout"]
