"""The paged engine's host half, driven by `Scheduler`: pages for prompts and growing
sequences, chunked prefill, copy-on-write prefix sharing, preemption and resumption.

- Admission (the queue in order, the head blocking the rest): a group's prompt (all but its
  last token) gets pages in the shard with a free slot and the most free pages, keeping a
  watermark of one free page per live slot there (when the pool cannot hold every slot at
  full length), and is prefilled `prefill_chunk` tokens
  per boundary while other slots decode (all at once when none do). Its samples then take
  free slots: they share the prompt's full pages (reference counts) and each gets its own
  copy of the last, partial page (the last sample takes the original).
- Before every decode chunk each live slot gets the pages its next `chunk` tokens need.
  When a shard runs short, its most recently admitted slots are preempted: their pages are
  freed and they are requeued (behind a head group that holds pages, else first). A
  resumed sample is recomputed (prompt + its tokens but the last) into fresh pages and
  continues with its count and budget; sampling being keyed by (seed, sample, position), it
  ends with the tokens it would have had.
- A request is refused at queue time if it could not fit the pool alone, so the head of
  the queue always fits once the running slots drain: no deadlock, no out-of-memory.
- A multi-turn sequence parked between turns (`rollout.turns`) leaves its slot and keeps
  its pages; its appended tokens are written into them (`extend`) when it resumes in a free
  slot of its shard. Parked sequences are the first to lose their pages when a shard runs
  short (they resume by recompute, like preempted ones).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from rlvr_jax.rollout.device.paged import PagedWork
from rlvr_jax.rollout.host.pages import PageAllocator, pages_for, work_lists


@dataclasses.dataclass
class _Prefill:
    """K/V of `tokens` (positions 0..) being written into `pages` of `shard`, by chunks."""

    shard: int
    tokens: list[int]
    pages: list[int]
    done: int = 0


@dataclasses.dataclass
class _Resume:
    """A preempted sample waiting to be recomputed into a slot."""

    slot: Any  # scheduler._Slot, with the tokens it had generated
    prefill: _Prefill | None = None
    slot_id: int | None = None


class PagedKV:
    """Pages, block tables and work lists of one `Scheduler` over a paged `EngineCore`."""

    def __init__(self, scheduler: Any):
        self.sched = scheduler
        self.core = scheduler.core
        self.spec = spec = self.core.spec
        self.allocator = PageAllocator(spec.pages_per_shard, spec.shards)
        self.per_shard = spec.max_slots // spec.shards
        self.table = np.zeros((spec.max_slots, spec.max_pages), np.int32)
        self._reserved: set[int] = set()
        full_length = self.per_shard * pages_for(spec.max_len, spec.page_size)
        self._overcommitted = full_length > self.allocator.capacity

    @property
    def in_use(self) -> int:
        """Pages of the pool in use now."""
        return self.allocator.in_use

    # ---- helpers ----------------------------------------------------------------------------

    def _shard(self, slot: int) -> int:
        return slot // self.per_shard

    def _free_slots(self, shard: int) -> list[int]:
        lo = shard * self.per_shard
        busy = self.sched._slots.keys() | self._reserved
        return [
            s for s in range(lo, lo + self.per_shard) if s < self.sched.num_slots and s not in busy
        ]

    def _live_in(self, shard: int) -> list[int]:
        return [s for s in self.sched._slots if self._shard(s) == shard]

    def _pick_shard(self, pages: int) -> int | None:
        """The shard with a free slot and room for `pages` above its watermark, most free
        pages first. The watermark (a page per live slot, against immediate preemption)
        applies only to a pool that cannot hold every slot at full length."""
        best = None
        for shard in range(self.spec.shards):
            free = self.allocator.free(shard)
            mark = len(self._live_in(shard)) if self._overcommitted else 0
            room = self._free_slots(shard) and free >= pages + mark
            if room and (best is None or free > self.allocator.free(best)):
                best = shard
        return best

    def _row(self, pages: list[int]) -> np.ndarray:
        row = np.zeros((self.spec.max_pages,), np.int32)
        row[: len(pages)] = pages
        return row

    def _set_pages(self, slot_id: int, pages: list[int]) -> None:
        self.table[slot_id] = self._row(pages)

    # ---- admission --------------------------------------------------------------------------

    def admit(self) -> None:
        """Admits from the head of the queue while slots, pages and the prefill budget allow."""
        budget = [self.spec.prefill_chunk if self.sched._slots else math.inf]
        waiting = self.sched._waiting
        while waiting:
            head = waiting[0]
            done = (
                self._resume(head, budget)
                if isinstance(head, _Resume)
                else self._group(head, budget)
            )
            if not done:
                return
            waiting.popleft()

    def _run_prefill(self, pf: _Prefill, budget: list[float]) -> bool:
        """Writes chunks of `pf` while the budget lasts; True once all are written."""
        chunk = self.spec.prefill_chunk
        while pf.done < len(pf.tokens):
            if budget[0] <= 0:
                return False
            n = min(chunk, len(pf.tokens) - pf.done)
            self.sched._state = self.core.extend(
                self.sched.params,
                self.sched._state,
                pf.tokens[pf.done : pf.done + n],
                pf.done,
                self._row(pf.pages),
                pf.shard,
            )
            pf.done += n
            budget[0] -= n
        return True

    def _group(self, group: Any, budget: list[float]) -> bool:
        req = group.request
        pf = group.prefill
        if pf is None:
            cached = list(req.prompt[:-1])
            shard = self._pick_shard(pages_for(len(cached), self.spec.page_size))
            if shard is None:
                return False
            pages = self.allocator.alloc(shard, pages_for(len(cached), self.spec.page_size))
            pf = group.prefill = _Prefill(shard, cached, pages)
            group.kv_version = self.sched.version
            self.sched.stats.prefills += 1
        if not self._run_prefill(pf, budget):
            return False
        z = self.spec.page_size
        full, partial = divmod(len(pf.tokens), z)
        slots, samples, copies = [], [], []
        for slot_id in self._free_slots(pf.shard):
            if group.next_sample == req.num_samples:
                break
            last = group.next_sample == req.num_samples - 1
            pages = list(pf.pages[:full])
            if partial and not last:
                fresh = self.allocator.alloc(pf.shard, 1)
                if fresh is None:
                    break
                copies.append((pf.shard, pf.pages[full], fresh[0]))
                pages += fresh
            elif partial:
                pages.append(pf.pages[full])  # the last sample takes the group's own page
            self.allocator.share(pf.shard, pf.pages[:full])
            slot = self.sched._new_slot(group, group.next_sample)
            slot.pages = pages
            self._set_pages(slot_id, pages)
            self.sched._slots[slot_id] = slot
            slots.append(slot_id)
            samples.append(group.next_sample)
            group.next_sample += 1
        if copies:
            self.sched._state = self.core.copy_pages(self.sched._state, copies)
        if slots:
            n = len(pf.tokens)
            self.sched._state = self.core.activate(
                self.sched._state,
                slots,
                [req.slot_request(i) for i in samples],
                [req.prompt[-1]] * len(slots),
                [n] * len(slots),
            )
        if group.next_sample == req.num_samples:
            # the group's own hold; the partial page went to the last sample
            self.allocator.release(pf.shard, pf.pages[:full])
            group.prefill = None
            return True
        if not self._free_slots(pf.shard) and self.spec.shards > 1:
            # other shards may have room: this prefix is dropped and prefilled again there
            self.allocator.release(pf.shard, pf.pages)
            group.prefill = None
        return False

    def _resume(self, item: _Resume, budget: list[float]) -> bool:
        slot = item.slot
        cached = [*slot.group.request.prompt, *slot.tokens]
        if item.prefill is None:
            need = pages_for(len(cached) - 1, self.spec.page_size)
            shard = self._pick_shard(need)
            if shard is None:
                return False
            item.slot_id = self._free_slots(shard)[0]
            self._reserved.add(item.slot_id)
            item.prefill = _Prefill(shard, cached[:-1], self.allocator.alloc(shard, need))
            self.sched.stats.recomputed_tokens += len(cached) - 1
        if not self._run_prefill(item.prefill, budget):
            return False
        self._reserved.discard(item.slot_id)
        slot.pages = item.prefill.pages
        self._set_pages(item.slot_id, slot.pages)
        self.sched._restart(item.slot_id, slot)
        return True

    # ---- decoding ---------------------------------------------------------------------------

    def _compact(self) -> None:
        """Packs live slots into [0, live) (one shard only): a slot's K/V stay in its pages,
        so moving it moves its per-slot vectors and its block-table row."""
        slots = self.sched._slots
        holes = [s for s in range(len(slots)) if s not in slots and s not in self._reserved]
        movers = sorted((s for s in slots if s >= len(slots)), reverse=True)
        moves = list(zip(movers, holes))
        if not moves:
            return
        self.sched._state = self.core.move_slots(self.sched._state, moves)
        for src, dst in moves:
            slots[dst] = slots.pop(src)
            self.table[dst], self.table[src] = self.table[src], 0

    def prepare_decode(self, n_steps: int) -> tuple[PagedWork, int]:
        """Pages for the next `n_steps` tokens of every live slot (preempting the newest
        slots of a shard that runs short), and the work the decode call reads; with one
        shard the live slots are packed first, and the rows to decode are returned too."""
        spec, z = self.spec, self.spec.page_size
        ends = {}
        for shard in range(spec.shards):
            live = self._live_in(shard)
            need = {}
            for s in live:
                slot = self.sched._slots[s]
                ends[s] = min(slot.position + n_steps - 1, spec.max_len - 1)
                need[s] = max(0, pages_for(ends[s] + 1, z) - len(slot.pages))
            victims = sorted(live, key=lambda s: self.sched._slots[s].admitted)
            if sum(need.values()) > self.allocator.free(shard):  # idle pages first
                want = sum(need.values())
                self.sched._turns.evict(shard, functools.partial(self.allocator.free, shard), want)
            while sum(need.values()) > self.allocator.free(shard):
                victim = victims.pop()
                del need[victim], ends[victim]
                self._preempt(victim)
            for s, n in need.items():
                if n:
                    slot = self.sched._slots[s]
                    slot.pages += self.allocator.alloc(shard, n)
                    self._set_pages(s, slot.pages)
        rows = spec.max_slots
        # static batching decodes its whole batch until the longest request ends (what it
        # is, and what the waste model and HF `generate` count): no row buckets there
        if len(spec.row_buckets) > 1 and self.sched.batching == "continuous":
            self._compact()
            rows = spec.row_bucket(max(self.sched._slots, default=0) + 1)
            ends = self._ends(n_steps)  # slot ids after the moves
        geometry, window = spec.geometry, spec.config.sliding_window
        lists = dict(slots_per_shard=self.per_shard, shards=spec.shards, length=spec.work_len)
        full = work_lists(ends, dict.fromkeys(ends, 0), geometry=geometry, **lists)
        sliding = (None, None, None)
        if spec.config.has_sliding:
            starts = {s: max(0, self.sched._slots[s].position - window + 1) for s in ends}
            sliding = work_lists(ends, starts, geometry=geometry, **lists)
        return PagedWork(self.table.copy(), *full, *sliding), rows

    def _ends(self, n_steps: int) -> dict[int, int]:
        last = self.spec.max_len - 1
        return {s: min(v.position + n_steps - 1, last) for s, v in self.sched._slots.items()}

    def _preempt(self, slot_id: int) -> None:
        slot = self.sched._slots.pop(slot_id)
        self.sched._state = self.core.deactivate(self.sched._state, [slot_id])
        self.release(slot, slot_id)
        self.sched.stats.preemptions += 1
        self._requeue(slot)

    def _requeue(self, slot: Any) -> None:
        """Queues `slot` (no pages) to be recomputed: behind head groups holding pages."""
        waiting = self.sched._waiting
        at = 0
        while at < len(waiting) and self._holds_pages(waiting[at]):
            at += 1
        waiting.insert(at, _Resume(slot))

    @staticmethod
    def _holds_pages(item: Any) -> bool:
        return item.prefill is not None

    def release(self, slot: Any, slot_id: int | None, *, shard: int | None = None) -> None:
        """Frees the pages of a finished (or preempted) slot `slot_id` (or of a parked
        sequence of `shard`, holding no slot)."""
        self.allocator.release(self._shard(slot_id) if shard is None else shard, slot.pages)
        slot.pages = []
        if slot_id is not None:
            self.table[slot_id] = 0

    # ---- multi-turn: parking between turns --------------------------------------------------

    def park(self, parked: Any, slot_id: int) -> None:
        """A sequence leaves slot `slot_id` until its next turn, keeping its pages."""
        parked.shard = self._shard(slot_id)
        self.table[slot_id] = 0

    def drop(self, parked: Any) -> None:
        """A parked sequence ended: its pages are freed."""
        self.release(parked.slot, None, shard=parked.shard)

    def resume(self, parked: Any) -> bool:
        """Writes the appended tokens into the parked sequence's pages and makes it decode
        again in a free slot of its shard. Without pages (evicted) it is requeued to be
        recomputed. Returns False when it must wait (no free slot or pages now; other
        parked sequences' pages are taken first, and with nothing decoding in the shard it
        gives up its own pages to be recomputed once the pool has room)."""
        slot, shard = parked.slot, parked.shard
        if not slot.pages:
            self._requeue(slot)
            return True
        cached = [*slot.group.request.prompt, *slot.tokens]
        need = pages_for(len(cached) - 1, self.spec.page_size) - len(slot.pages)
        free = self._free_slots(shard)
        if need > self.allocator.free(shard):
            self.sched._turns.evict(
                shard, functools.partial(self.allocator.free, shard), need, parked
            )
        if not free or need > self.allocator.free(shard):
            if self._live_in(shard):
                return False
            self.release(slot, None, shard=shard)  # nothing runs here: recompute it later
            self.sched.stats.preemptions += 1
            self._requeue(slot)
            return True
        slot.pages += self.allocator.alloc(shard, need)
        self._run_prefill(_Prefill(shard, cached[:-1], slot.pages, parked.cached), [math.inf])
        self._set_pages(free[0], slot.pages)
        self.sched._restart(free[0], slot)
        return True
