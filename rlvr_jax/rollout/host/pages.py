"""Host side of the paged KV cache: the page allocator (reference counts, one range per
slot shard) and the per-call arrays the device needs (block tables, decode work lists).

Pages are numbered locally within a shard; page 0 of every shard is the trash page (never
allocated). A page's reference count is the number of sequences (or held prompt prefixes)
that use it: the G samples of a prompt share its full pages, so a page returns to the free
list only when its last user releases it. Every misuse (releasing a free page, sharing a
free page, an id out of range) raises instead of corrupting the pool.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from rlvr_jax.rollout.device.attention import PageGeometry


class PageError(RuntimeError):
    """An allocator invariant would be broken (double free, foreign page...)."""


class PageAllocator:
    """Reference-counted pages in `shards` ranges of `pages_per_shard` (page 0 reserved).

    `alloc` is all-or-nothing and takes the lowest free ids first (compact pools)."""

    def __init__(self, pages_per_shard: int, shards: int = 1):
        if pages_per_shard < 2 or shards < 1:
            raise ValueError(f"need >= 2 pages per shard and >= 1 shard, got {pages_per_shard}")
        self.pages_per_shard = pages_per_shard
        self.shards = shards
        self.refcount = np.zeros((shards, pages_per_shard), np.int32)
        # free lists as stacks, lowest id on top
        self._free = [list(range(pages_per_shard - 1, 0, -1)) for _ in range(shards)]

    @property
    def capacity(self) -> int:
        """Allocatable pages per shard (the trash page excluded)."""
        return self.pages_per_shard - 1

    def free(self, shard: int) -> int:
        """Free pages of `shard`."""
        return len(self._free[shard])

    @property
    def in_use(self) -> int:
        """Pages held by at least one user, all shards."""
        return int(np.count_nonzero(self.refcount))

    def alloc(self, shard: int, n: int) -> list[int] | None:
        """`n` fresh pages of `shard` (refcount 1), or None (nothing taken) if too few."""
        free = self._free[shard]
        if n > len(free):
            return None
        pages = [free.pop() for _ in range(n)]
        self.refcount[shard, pages] = 1
        return pages

    def _check(self, shard: int, pages: list[int], what: str) -> None:
        if not 0 <= shard < self.shards:
            raise PageError(f"{what}: shard {shard} out of range [0, {self.shards})")
        for p in pages:
            if not 0 < p < self.pages_per_shard:
                raise PageError(f"{what}: page {p} out of range [1, {self.pages_per_shard})")
            if self.refcount[shard, p] <= 0:
                raise PageError(f"{what}: page {p} of shard {shard} is not allocated")

    def share(self, shard: int, pages: list[int]) -> None:
        """One more user of each of `pages` (all allocated)."""
        self._check(shard, pages, "share")
        np.add.at(self.refcount[shard], pages, 1)

    def release(self, shard: int, pages: list[int]) -> None:
        """One user fewer of each of `pages`; those left unused return to the free list."""
        if len(set(pages)) != len(pages):
            raise PageError(f"release: pages listed twice in {pages}")
        self._check(shard, pages, "release")
        self.refcount[shard, pages] -= 1
        freed = sorted((p for p in pages if self.refcount[shard, p] == 0), reverse=True)
        free = self._free[shard]
        free.extend(freed)
        if freed:
            free.sort(reverse=True)

    def check_invariants(self) -> None:
        """Raises `PageError` if free lists and reference counts disagree."""
        for s in range(self.shards):
            free = self._free[s]
            if len(set(free)) != len(free):
                raise PageError(f"shard {s}: a page is on the free list twice")
            if 0 in free or self.refcount[s, 0]:
                raise PageError(f"shard {s}: the trash page was allocated")
            if (self.refcount[s] < 0).any():
                raise PageError(f"shard {s}: negative reference count")
            held = set(np.flatnonzero(self.refcount[s]).tolist())
            if held & set(free) or len(held) + len(free) != self.capacity:
                raise PageError(f"shard {s}: free list and reference counts disagree")


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold `tokens` positions."""
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
    """Decode work lists ([S, R] slot, [S, R] block, [S] count) of live slots.

    Slot b (global id) reads blocks `starts[b] // T .. ends[b] // T` (T = tokens per
    block; `ends[b]` the last position it may reach in the call, `starts[b]` the first it
    may attend to). Entries are grouped by slot in slot order; padding carries the local
    slot id `slots_per_shard` (a dropped segment)."""
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


def static_slots(spec: Any) -> int:
    """Slots of a paged engine the static assignment serves: each owns `max_len` positions
    of pages in its shard."""
    per_seq = pages_for(spec.max_len, spec.page_size)
    return min(spec.max_slots // spec.shards, (spec.pages_per_shard - 1) // per_seq) * spec.shards


def static_table(spec: Any) -> np.ndarray:
    """Block tables [B, M] of the static assignment (slots past `static_slots` get none)."""
    per_seq, per_shard = pages_for(spec.max_len, spec.page_size), spec.max_slots // spec.shards
    usable = static_slots(spec) // spec.shards
    table = np.zeros((spec.max_slots, spec.max_pages), np.int32)
    for b in range(spec.max_slots):
        if b % per_shard < usable:
            table[b, :per_seq] = 1 + (b % per_shard) * per_seq + np.arange(per_seq)
    return table


@functools.cache
def static_work(spec: Any) -> Any:
    """`PagedWork` reading every page of the static assignment (a slot's whole `max_len`)."""
    from rlvr_jax.rollout.device.paged import PagedWork

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
