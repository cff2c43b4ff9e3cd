"""The paged engine's low-level device calls, as methods of `EngineCore` (a mixin):
chunked prefill into pages, slot activation / deactivation / moves, page copies, dense
prefixes written into pages, and the static page assignment of callers that track no
pages (the JetStream adapter). The `Scheduler` (`paged_scheduler.PagedKV`) drives them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlvr_jax.rollout.device import decode as core
from rlvr_jax.rollout.device import paged as paged_core
from rlvr_jax.rollout.device.decode import DecodeState, Prefix
from rlvr_jax.rollout.device.kernel import DecodeParams
from rlvr_jax.rollout.device.paged import PagedWork
from rlvr_jax.rollout.host import pages
from rlvr_jax.rollout.requests import SlotRequest


class PagedOps:
    """Methods of `EngineCore` for the paged layout (`self.spec`, `self.settings` and
    `self.write_prefix` come from the engine)."""

    spec: Any

    def extend(
        self,
        dp: DecodeParams,
        state: DecodeState,
        tokens: Sequence[int],
        start: int,
        table_row: np.ndarray,
        shard: int = 0,
    ) -> DecodeState:
        """Paged: `state` (donated) with the K/V of `tokens` (at most `prefill_chunk`) at
        positions `start ..` of the sequence whose pages (local ids in shard `shard`) are
        `table_row` [M]; positions before `start` must already be in those pages."""
        n = len(tokens)
        if not 0 < n <= self.spec.prefill_chunk:
            raise ValueError(f"extend takes 1..{self.spec.prefill_chunk} tokens, got {n}")
        padded_T = np.zeros((self.spec.chunk_bucket(n),), np.int32)
        padded_T[:n] = tokens
        return paged_core.extend(
            dp,
            state,
            padded_T,
            np.int32(start),
            np.int32(n),
            np.asarray(table_row, np.int32),
            np.int32(shard),
            spec=self.spec,
        )

    @property
    def static_slots(self) -> int:
        """Paged: slots the static page assignment serves (`insert` / `generate` without
        `work`, the JetStream adapter): slot b owns pages for `max_len` positions."""
        return pages.static_slots(self.spec)

    def static_work(self) -> PagedWork:
        """Paged: decode work over every page of the static assignment (each slot reads its
        whole `max_len`: the contiguous layout's cost, for callers that track no pages)."""
        return pages.static_work(self.spec)

    def _insert_static(
        self, prefix: Prefix, state: DecodeState, slots: Sequence[int], requests: Sequence
    ) -> DecodeState:
        s = self.spec
        table = pages.static_table(s)
        for slot in slots:
            if not table[slot, 0]:
                raise ValueError(
                    f"slot {slot} has no pages in the static assignment (the pool serves "
                    f"{self.static_slots} slots of max_len={s.max_len}; the Scheduler pages "
                    "dynamically)"
                )
            shard = slot // (s.max_slots // s.shards)
            state = self.write_prefix(state, prefix, table[slot], shard)
        n = len(slots)
        length, last = int(prefix.length), int(prefix.last_token)
        return self.activate(state, slots, requests, [last] * n, [length] * n)

    def activate(
        self,
        state: DecodeState,
        slots: Sequence[int],
        requests: Sequence[SlotRequest],
        tokens: Sequence[int],
        positions: Sequence[int],
        generated: Sequence[int] | None = None,
    ) -> DecodeState:
        """Paged: `state` (donated) with `slots` starting (or resuming) `requests`: slot i
        feeds `tokens[i]` at `positions[i]` next, `generated[i]` tokens already produced."""
        settings = self.settings(slots, requests)
        b = self.spec.max_slots
        token_B, position_B = np.zeros((b,), np.int32), np.zeros((b,), np.int32)
        token_B[: len(slots)], position_B[: len(slots)] = tokens, positions
        if generated is not None:
            settings.generated_B[: len(slots)] = generated
        return paged_core.activate(state, settings, token_B, position_B, spec=self.spec)

    def deactivate(self, state: DecodeState, slots: Sequence[int]) -> DecodeState:
        """Paged: `state` (donated) with `slots` stopped (preempted)."""
        slots_B = np.full((self.spec.max_slots,), self.spec.max_slots, np.int32)
        slots_B[: len(slots)] = slots
        return paged_core.deactivate(state, slots_B, spec=self.spec)

    def copy_pages(self, state: DecodeState, copies: Sequence[tuple[int, int, int]]) -> DecodeState:
        """Paged: `state` (donated) with each (shard, src, dst) page copied, all layers."""
        n = self.spec.max_slots
        src, dst = (
            np.zeros((self.spec.shards, n), np.int32),
            np.zeros((self.spec.shards, n), np.int32),
        )
        for i in range(0, len(copies), n):
            used = [0] * self.spec.shards
            src[:], dst[:] = 0, 0
            for shard, a, b in copies[i : i + n]:
                src[shard, used[shard]], dst[shard, used[shard]] = a, b
                used[shard] += 1
            state = paged_core.copy_pages(state, src, dst, spec=self.spec)
        return state

    def write_prefix(
        self, state: DecodeState, prefix: Prefix, table_row: np.ndarray, shard: int = 0
    ) -> DecodeState:
        """Paged: `state` (donated) with a dense prefix's K/V written into the pages
        `table_row` of shard `shard`."""
        return paged_core.write_prefix(
            state, prefix, np.asarray(table_row, np.int32), np.int32(shard), spec=self.spec
        )

    def move_slots(self, state: DecodeState, moves: Sequence[tuple[int, int]]) -> DecodeState:
        """`state` (donated) with each (src, dst) slot's request moved to dst, src left
        idle (paged: the caller moves the block-table rows)."""
        b = self.spec.max_slots
        src, dst = np.full((b,), b, np.int32), np.full((b,), b, np.int32)
        for i, (a, c) in enumerate(moves):
            src[i], dst[i] = a, c
        return core.move_slots(state, src, dst, spec=self.spec)
