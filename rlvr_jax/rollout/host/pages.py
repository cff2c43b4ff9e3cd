"""The page allocator of `host.kv`: reference-counted pages, one range per slot shard, numbered
locally (page 0 of each, the trash page, never allocated). A page is free again once its last
user (a sequence, or a group holding its prompt) releases it; misuse raises `PageError`."""

from __future__ import annotations

import numpy as np

from rlvr_jax.rollout.device.paged import PageError


class PageAllocator:
    """Reference-counted pages in `shards` ranges of `pages_per_shard` (page 0 reserved)."""

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
        return len(self._free[shard])

    @property
    def in_use(self) -> int:
        """Pages held by at least one user, all shards."""
        return int(np.count_nonzero(self.refcount))

    def alloc(self, shard: int, n: int) -> list[int] | None:
        """`n` fresh pages of `shard`, lowest ids first, or None (nothing taken) if too few."""
        free = self._free[shard]
        if n > len(free):
            return None
        pages = [free.pop() for _ in range(n)]
        self.refcount[shard, pages] = 1
        return pages

    def claim(self, shard: int, page: int) -> list[int]:
        """[`page`] of `shard`, which must be free (a contiguous row, bound to its slot)."""
        free = self._free[shard]
        if page not in free:
            raise PageError(f"claim: page {page} of shard {shard} is not free")
        free.remove(page)
        self.refcount[shard, page] = 1
        return [page]

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
