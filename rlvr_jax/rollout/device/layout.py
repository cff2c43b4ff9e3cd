"""The engine's KV layout, chosen once (`kv_layout(name)`) and held by `EngineSpec.kv_layout`.

- `CONTIGUOUS`: every slot owns a [K, S, H] cache row per layer (S = `max_len`): KV memory
  and decode attention scale with `max_slots × max_len` (the baseline).
- `PAGED` (the default): one pool of `num_pages` pages of `page_size` tokens per layer,
  [K, P, Z, H]; slots hold block tables (host-owned, `rlvr_jax.rollout.host.pages`), so KV memory
  is a budget of its own and decode reads only the pages in use.

Everything that differs between the two is a method of the layout: the cache's shape and
sharding, the pool a budget buys, the decode step's attention, inserting a prefilled prompt,
the programs compiled ahead, and the scheduler's host half (`host`). The engine, scheduler,
compile-ahead and the dry-run plan call these instead of testing a name.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rlvr_jax.models import ArchConfig
from rlvr_jax.rollout.device import attention as paged_attention
from rlvr_jax.rollout.device import decode as core
from rlvr_jax.rollout.device import kernel
from rlvr_jax.rollout.device import paged as paged_core
from rlvr_jax.rollout.device.compile_ahead import host_struct as _host
from rlvr_jax.rollout.device.state import CACHE_AXES, POOL_AXES, named
from rlvr_jax.rollout.host import pages
from rlvr_jax.rollout.host.kv import PagedKV
from rlvr_jax.rollout.requests import RequestError


@dataclasses.dataclass(frozen=True)
class KVPool:
    """What a KV budget buys."""

    pages: int
    """Pages of the pool, trash pages included (0 for the contiguous layout)."""
    tokens: int
    """Tokens the cache holds, all devices together (trash pages excluded)."""
    tokens_per_device: int
    """Token rows one device holds (its slot shard's pages or rows)."""


@dataclasses.dataclass(frozen=True)
class Contiguous:
    """A fixed row of `max_len` positions per slot."""

    name = "contiguous"
    paged = False

    def configure(self, spec: Any, **_: Any) -> Any:
        """`spec` with this layout (the pool settings do not apply)."""
        return dataclasses.replace(spec, kv_layout=self)

    def validate(self, spec: Any) -> None:
        """Raises ValueError for settings this layout cannot run (none)."""

    def kv_shape(self, spec: Any) -> tuple[int, ...]:
        """Shape of one layer's K (or V) array: [B, K, S, H]."""
        cfg = spec.config
        return (spec.max_slots, cfg.n_kv_heads, spec.max_len, cfg.head_dim)

    def kv_sharding(self, spec: Any) -> tuple[NamedSharding, ...]:
        """One per segment (`segments`): rows split like slots, KV heads over the tensor axis."""
        b, k, _, h = self.kv_shape(spec)
        return tuple(named(spec, CACHE_AXES, (b, k, n, h)) for _, n in self.segments(spec))

    def empty_cache(self, spec: Any) -> tuple[jax.Array, ...]:
        """One layer's K (or V): zeros, one [B, K, length, H] array per segment."""
        b, k, _, h = self.kv_shape(spec)
        return tuple(jnp.zeros((b, k, n, h), spec.cache_dtype) for _, n in self.segments(spec))

    def row_buckets(self, spec: Any) -> tuple[int, ...]:
        """Every slot decodes every step."""
        return (spec.max_slots,)

    def pool(
        self, config: ArchConfig, *, max_slots: int, max_len: int, shards: int, **_: Any
    ) -> KVPool:
        """`max_slots` rows of `max_len` (the budget keys do not apply)."""
        return KVPool(0, max_slots * max_len, max_slots // shards * max_len)

    def capacity(self, spec: Any) -> int:
        """Tokens the cache holds."""
        return spec.max_slots * spec.max_len

    def check_fits(self, spec: Any, prompt_len: int, max_new_tokens: int) -> None:
        """Any sequence of at most `max_len` fits its row."""

    def decode_logits(self, dp: Any, spec: Any, state: Any, work: Any) -> tuple:
        """(logits fp32 [B, V], k, v) of one decode step of every row, attending over the
        fewest leading segments that hold every live row's positions."""
        span = None
        if len(self.segments(spec)) > 1:
            span = jnp.max(jnp.where(state.active_B, state.positions_B, 0)) + 1
        return kernel.decode_logits(
            dp, spec.config, state.tokens_B, state.positions_B, state.k, state.v, span=span
        )

    def segments(self, spec: Any) -> tuple[tuple[int, int], ...]:
        """(start, length) of each segment of a layer's cache along S: separate arrays ending at
        a quarter, half, three quarters and all of `max_len` (multiples of 16; rows' positions
        are short early on), so that a decode step reads the leading segments it needs without
        copying a prefix of one array (XLA:CPU copies a slice before a dot; the demo's decode
        attention was 2x slower sliced than segmented, `kernel.attend_segments`). One segment
        with several shards, or exact (a row's arithmetic must not depend on the others')."""
        s = spec.max_len
        ends: tuple[int, ...] = (s,)
        if spec.shards == 1 and not spec.exact and s >= 64:
            ends = (*sorted({-(-s * q // 4 // 16) * 16 for q in (1, 2, 3)} - {s}), s)
        return tuple((a, e - a) for a, e in zip((0, *ends[:-1]), ends))

    def insert(self, engine: Any, prefix: Any, state: Any, slots: Sequence, requests: Sequence):
        """`state` (donated) with the dense `prefix` copied into the rows of `slots`."""
        settings = engine.settings(slots, requests)
        return core.insert(state, prefix, settings, np.int32(len(slots)), spec=engine.spec)

    def default_work(self, engine: Any) -> None:
        """No page work: each row is read whole."""
        return None

    def static_slots(self, spec: Any) -> int:
        """Slots a caller tracking no pages can use: all."""
        return spec.max_slots

    def lower_programs(self, engine: Any, dp: Any, state: Any, slot_settings: Any) -> list:
        """The dense prefill of every bucket (compiled: its output's placement is the
        insert's input) and the insert of its prefix (lowered)."""
        spec, scalar = engine.spec, _host(())
        lowered = []
        for t in spec.prefill_buckets:
            prefill = core.prefill.lower(dp, _host((t,)), scalar, scalar, spec=spec).compile()
            lowered.append(prefill)
            prefix = jax.tree.map(  # as the real prefix arrives: placed like prefill's output
                lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                jax.eval_shape(
                    functools.partial(core.prefill, spec=spec), dp, _host((t,)), scalar, scalar
                ),
                prefill.output_shardings,
            )
            lowered.append(core.insert.lower(state, prefix, slot_settings, scalar, spec=spec))
        return lowered

    def abstract_work(self, spec: Any) -> None:
        return None

    def host(self, scheduler: Any) -> ContiguousKV:
        """The scheduler's host half for this layout."""
        return ContiguousKV(scheduler)


@dataclasses.dataclass(frozen=True)
class Paged:
    """A pool of pages; slots hold block tables."""

    name = "paged"
    paged = True

    def configure(
        self,
        spec: Any,
        *,
        page_size: int,
        kv_pages: int | None,
        kv_cache_gib: float | None,
        prefill_chunk: int,
        attention: str,
        geometry_tokens: tuple[int, int, int] | None,
    ) -> Any:
        """`spec` with this layout and its pool: the budget (`pool`), the page size, the
        prefill chunk, the decode attention of full layers (`paged_attention.select_impl`
        for the mesh's platform) and the walk geometry."""
        mesh = spec.mesh
        platform = (mesh.devices.flat[0] if mesh else jax.devices()[0]).platform
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
                attention, platform, page_size=page_size, head_dim=spec.config.head_dim
            ),
            geometry_tokens=geometry_tokens or paged_attention.GEOMETRY_TOKENS,
        )

    def validate(self, spec: Any) -> None:
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

    def kv_shape(self, spec: Any) -> tuple[int, ...]:
        """Shape of one layer's page pool: [K, P, Z, H]."""
        cfg = spec.config
        return (cfg.n_kv_heads, spec.num_pages, spec.page_size, cfg.head_dim)

    def kv_sharding(self, spec: Any) -> NamedSharding:
        """Pages split like slots (each shard its own range), KV heads over tensor."""
        heads = named(spec, POOL_AXES, self.kv_shape(spec)).spec[0]
        return NamedSharding(spec.mesh, PartitionSpec(heads, spec.slot_spec, None, None))

    def empty_cache(self, spec: Any) -> jax.Array:
        """One layer's K (or V) pool: zeros."""
        return jnp.zeros(self.kv_shape(spec), spec.cache_dtype)

    def row_buckets(self, spec: Any) -> tuple[int, ...]:
        """Slot counts a decode call may run on (one shard): B/8, B/4, B/2 (those of at
        least 8) and B; with several shards, or exact, just B."""
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
        """The pool `kv_pages` (allocatable pages, all shards) or `kv_cache_gib` (GiB per
        device, KV heads split over `tensor` when it divides them) buys, by default
        `max_slots` rows of `max_len`; each shard's trash page included."""
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
            per_shard = max_slots // shards * pages.pages_for(max_len, page_size) + 1
        n = per_shard * shards
        return KVPool(n, (n - shards) * page_size, per_shard * page_size)

    def capacity(self, spec: Any) -> int:
        """Tokens the pool holds (the trash pages excluded)."""
        return (spec.num_pages - spec.shards) * spec.page_size

    def check_fits(self, spec: Any, prompt_len: int, max_new_tokens: int) -> None:
        """Raises `RequestError` when the sequence needs more pages than a slot shard's
        whole pool."""
        need = pages.pages_for(prompt_len + max_new_tokens, spec.page_size)
        if need > spec.pages_per_shard - 1:
            raise RequestError(
                f"prompt of {prompt_len} tokens + max_new_tokens={max_new_tokens} needs "
                f"{need} pages of {spec.page_size} tokens, more than the whole KV pool "
                f"({spec.pages_per_shard - 1} pages per slot shard; raise rollout.kv_pages or "
                "rollout.kv_cache_gib)"
            )

    def decode_logits(self, dp: Any, spec: Any, state: Any, work: Any) -> tuple:
        """(logits fp32 [B, V], k, v) of one decode step reading the pages `work` lists."""
        return paged_core.decode_logits(
            dp, spec, state.tokens_B, state.positions_B, state.active_B, state.k, state.v, work
        )

    def insert(self, engine: Any, prefix: Any, state: Any, slots: Sequence, requests: Sequence):
        """`state` (donated) with a dense prefix written into the static page assignment of
        each of `slots` (callers that track no pages: the JetStream adapter)."""
        return engine._insert_static(prefix, state, slots, requests)

    def default_work(self, engine: Any) -> Any:
        """Without the scheduler's work: every page of the static assignment."""
        return engine.static_work()

    def static_slots(self, spec: Any) -> int:
        """Slots the static page assignment serves (each owns `max_len` of pages)."""
        return pages.static_slots(spec)

    def lower_programs(self, engine: Any, dp: Any, state: Any, slot_settings: Any) -> list:
        """Chunked prefill of every chunk bucket, activate / deactivate / copy / move."""
        spec, scalar = engine.spec, _host(())
        row, slots = _host((spec.max_pages,)), _host((spec.max_slots,))
        lowered = [
            paged_core.extend.lower(dp, state, _host((t,)), scalar, scalar, row, scalar, spec=spec)
            for t in spec.chunk_buckets
        ]
        pairs = _host((spec.shards, spec.max_slots))
        lowered.append(paged_core.activate.lower(state, slot_settings, slots, slots, spec=spec))
        lowered.append(paged_core.deactivate.lower(state, slots, spec=spec))
        lowered.append(paged_core.copy_pages.lower(state, pairs, pairs, spec=spec))
        lowered.append(core.move_slots.lower(state, slots, slots, spec=spec))
        return lowered

    def abstract_work(self, spec: Any) -> paged_core.PagedWork:
        """Abstract `PagedWork` of an engine (the shapes the scheduler builds)."""
        s, r = spec.shards, spec.work_len
        lists = (_host((s, r)), _host((s, r)), _host((s,)))
        return paged_core.PagedWork(
            _host((spec.max_slots, spec.max_pages)),
            *lists,
            *(lists if spec.config.has_sliding else (None, None, None)),
        )

    def host(self, scheduler: Any) -> PagedKV:
        """The scheduler's host half: pages, prefill chunks, preemption."""
        return PagedKV(scheduler)


CONTIGUOUS = Contiguous()
PAGED = Paged()
LAYOUTS = {layout.name: layout for layout in (PAGED, CONTIGUOUS)}


def kv_layout(name: str) -> Contiguous | Paged:
    """The layout called `name` ("paged" or "contiguous")."""
    if name not in LAYOUTS:
        raise ValueError(f"kv_layout must be one of {tuple(LAYOUTS)}, got {name!r}")
    return LAYOUTS[name]


class ContiguousKV:
    """The scheduler's host half on a contiguous engine: a group's prompt is prefilled once
    (dense) and inserted into as many free slots as there are, the rest later from the same
    prefix. A multi-turn sequence parked between turns holds its row (`reserved`); its
    appended tokens are written into the row (`extend.extend_row`) when it resumes."""

    def __init__(self, scheduler: Any):
        self.sched = scheduler
        self.in_use = 0
        """Pages in use (none: rows are fixed)."""
        self.reserved: set[int] = set()
        """Rows of parked sequences (`rollout.turns`)."""

    def admit(self) -> None:
        """Fills free slots from the head of the queue."""
        sched, core_ = self.sched, self.sched.core
        free = [s for s in sched._free_slots() if s not in self.reserved]
        while free and sched._waiting:
            group = sched._waiting[0]
            req = group.request
            if group.prefix is None:
                group.prefix = core_.prefill(sched.params, req.prompt)
                group.kv_version = sched.version
                sched.stats.prefills += 1
            n = min(len(free), req.num_samples - group.next_sample)
            slots, free = free[:n], free[n:]
            samples = range(group.next_sample, group.next_sample + n)
            sched._state = core_.insert(
                group.prefix, sched._state, slots, [req.slot_request(i) for i in samples]
            )
            for slot, i in zip(slots, samples):
                sched._slots[slot] = sched._new_slot(group, i)
            group.next_sample += n
            if group.next_sample == req.num_samples:
                group.prefix = None
                sched._waiting.popleft()

    def prepare_decode(self, n_steps: int) -> tuple[None, None]:
        """No pages to hand out; every row decodes."""
        return None, None

    def release(self, slot: Any, slot_id: int | None, **_: Any) -> None:
        """Nothing to free."""

    def park(self, parked: Any, slot_id: int) -> None:
        """A sequence waits for its next turn in its own row."""
        parked.row = slot_id
        self.reserved.add(slot_id)

    def drop(self, parked: Any) -> None:
        """A parked sequence ended: its row is free."""
        self.reserved.discard(parked.row)

    def resume(self, parked: Any) -> bool:
        """Writes the appended tokens into the parked sequence's row and makes it decode
        again from its last one; always succeeds."""
        from rlvr_jax.rollout.extend import extend_row

        sched, core_, slot = self.sched, self.sched.core, parked.slot
        cached = [*slot.group.request.prompt, *slot.tokens]
        new = cached[parked.cached : -1]
        padded = np.zeros((core_.spec.bucket(len(new)),), np.int32)
        padded[: len(new)] = new
        sched._state = extend_row(
            sched.params,
            sched._state,
            padded,
            np.int32(parked.cached),
            np.int32(len(new)),
            np.int32(parked.row),
            spec=core_.spec,
        )
        self.reserved.discard(parked.row)
        sched._restart(parked.row, slot)
        return True


__all__ = ["CONTIGUOUS", "LAYOUTS", "PAGED", "KVPool", "kv_layout"]
