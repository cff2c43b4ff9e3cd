"""The page policy of both KV layouts (docs/engine.md): it keeps the allocator and the block
tables and moves sequences through `Sequences`' methods.

- Admission, in queue order (the head blocks the rest): a group's prompt but its last token gets
  a reserved slot and pages in the shard with a free slot and the most free pages (keeping a
  page per live slot free when the pool cannot hold every slot at full length), written
  `prefill_chunk` tokens per boundary (all at once when nothing decodes). Its samples share the
  full pages; the first takes the last, partial page, the others a copy.
- Before each decode chunk every live sequence gets the pages its next tokens need; a shard
  short of them frees parked sequences' pages, then preempts its newest sequences, requeued to
  be recomputed (sampling is keyed by position: they end as they would have). `recompute_all`
  does that to every sequence (`on_push`).
- A parked multi-turn sequence keeps its pages and resumes in a free slot of its shard.

Contiguous: page b + 1 of a shard is slot b's row, bound to it: a slot is free only while its
page is, and a parked sequence resumes in its own slot."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rlvr_jax.rollout.device.kernel import DecodeParams
from rlvr_jax.rollout.device.paged import PagedWork, pages_for, work_lists
from rlvr_jax.rollout.device.state import EngineSpec
from rlvr_jax.rollout.host.pages import PageAllocator
from rlvr_jax.rollout.host.sequences import Group, Parked, Prefill, Resume, Seq, Sequences


@dataclasses.dataclass
class SchedulerStats:
    """Counters of one scheduler; the `*_steps` are sums over decode steps."""

    decode_calls: int = 0
    decode_steps: int = 0
    slot_steps: int = 0
    """decode steps × slots the scheduler uses."""
    tokens: int = 0
    prefills: int = 0
    preemptions: int = 0
    """Sequences that lost their pages because the pool ran short."""
    recomputed_tokens: int = 0
    """Positions prefilled again for sequences whose K/V was dropped."""
    kv_token_steps: int = 0
    """Tokens cached for live sequences."""
    page_steps: int = 0
    row_steps: int = 0
    """Slot rows computed (paged: the packed live rows, rounded up to a row bucket)."""
    kv_capacity: int = 0
    parked_steps: int = 0
    """Sequences parked between turns."""

    @property
    def waste(self) -> float:
        """Fraction of slot-steps that produced no token (ALGORITHMS.md's batching waste)."""
        return 1.0 - self.tokens / self.slot_steps if self.slot_steps else 0.0

    @property
    def mean_concurrent(self) -> float:
        """Sequences decoding per decode step, on average."""
        return self.tokens / self.decode_steps if self.decode_steps else 0.0

    @property
    def kv_utilisation(self) -> float:
        """Fraction of the KV cache holding live tokens, averaged over decode steps."""
        den = self.decode_steps * self.kv_capacity
        return self.kv_token_steps / den if den else 0.0

    @property
    def mean_pages_in_use(self) -> float:
        return self.page_steps / self.decode_steps if self.decode_steps else 0.0


class PagePolicy:
    """Pages, block tables and work lists of one scheduler's `Sequences` (module docstring)."""

    def __init__(self, seqs: Sequences, spec: EngineSpec, stats: SchedulerStats):
        self.seqs, self.spec, self.stats = seqs, spec, stats
        self.allocator = PageAllocator(spec.pages_per_shard, spec.shards)
        self.per_shard = spec.max_slots // spec.shards
        self.table = np.zeros((spec.max_slots, spec.max_pages), np.int32)
        self.bound = not spec.kv_layout.paged  # contiguous: a slot's one page is its row
        full_length = self.per_shard * pages_for(spec.max_len, spec.page_size)
        self.overcommitted = full_length > self.allocator.capacity

    @property
    def in_use(self) -> int:
        return self.allocator.in_use

    def _shard(self, slot: int) -> int:
        return slot // self.per_shard

    def _own_slot(self, shard: int, page: int) -> int:  # bound pages: the row's slot
        return shard * self.per_shard + page - 1

    def _free_slots(self, shard: int) -> list[int]:
        lo = shard * self.per_shard
        free = self.seqs.free_slots(lo, lo + self.per_shard)
        if self.bound:  # a row still held (a group's prompt, a parked sequence) keeps its slot
            free = [s for s in free if not self.allocator.refcount[shard, s - lo + 1]]
        return free

    def _live_in(self, shard: int) -> list[int]:
        return [s for s in self.seqs if self._shard(s) == shard]

    def _alloc(self, shard: int, n: int, slot: int) -> list[int]:
        """`n` fresh pages of `shard` for a sequence of `slot` (bound: that slot's page)."""
        if self.bound:
            return self.allocator.claim(shard, slot - shard * self.per_shard + 1)
        return self.allocator.alloc(shard, n) or []

    def _pick_shard(self, pages: int) -> int | None:
        """The shard with a free slot, room for `pages` (and a page per live slot when
        overcommitted) and the most free pages."""
        best = None
        for shard in range(self.spec.shards):
            free = self.allocator.free(shard)
            mark = len(self._live_in(shard)) if self.overcommitted else 0
            room = self._free_slots(shard) and free >= pages + mark
            if room and (best is None or free > self.allocator.free(best)):
                best = shard
        return best

    def _row(self, pages: list[int]) -> np.ndarray:
        row = np.zeros((self.spec.max_pages,), np.int32)
        row[: len(pages)] = pages
        return row

    def _restart(self, slot: int, seq: Seq, version: int) -> None:
        """`seq` (every position but its last in its pages) decodes again in `slot`."""
        self.table[slot] = self._row(seq.pages)
        self.seqs.start([slot], [seq])
        seq.stamp(version)

    # ---- admission --------------------------------------------------------------------------

    def admit(self, params: DecodeParams, version: int) -> None:
        """Admits from the head of the queue while slots, pages and the prefill budget allow
        (`prefill_chunk` tokens while others decode; contiguous: no budget)."""
        budget = [self.spec.prefill_chunk if self.seqs and not self.bound else math.inf]
        while self.seqs.waiting:
            head = self.seqs.queue[0]
            if isinstance(head, Resume):
                done = self._resume(head, budget, params, version)
            else:
                done = self._group(head, budget, params, version)
            if not done:
                return
            self.seqs.pop_head()

    def _run_prefill(self, pf: Prefill, budget: list[float], params: DecodeParams) -> bool:
        """Writes chunks of `pf` while the budget lasts; True once all are written."""
        chunk = self.spec.prefill_chunk
        while pf.done < len(pf.tokens):
            if budget[0] <= 0:
                return False
            n = min(chunk, len(pf.tokens) - pf.done)
            tokens = pf.tokens[pf.done : pf.done + n]
            self.seqs.write(params, tokens, pf.done, self._row(pf.pages), pf.shard)
            pf.done += n
            budget[0] -= n
        return True

    def _start_prefill(self, tokens: list[int], version: int) -> Prefill | None:
        """Pages of a free slot's shard for `tokens`, that slot reserved (None: no room)."""
        need = pages_for(len(tokens), self.spec.page_size)
        shard = self._pick_shard(need)
        if shard is None:
            return None
        slot = self._free_slots(shard)[0]
        self.seqs.reserve(slot)
        return Prefill(shard, tokens, self._alloc(shard, need, slot), version, slot=slot)

    def _drop_prefill(self, item: Group | Resume) -> None:
        """Releases `item`'s prefill pages (it starts over later)."""
        pf, item.prefill = item.prefill, None
        if pf is not None:
            self.allocator.release(pf.shard, pf.pages)
            if pf.slot is not None:
                self.seqs.unreserve(pf.slot)

    def _group(self, group: Group, budget: list[float], params: DecodeParams, version: int) -> bool:
        req = group.request
        if group.prefill is None:
            group.prefill = self._start_prefill(list(req.prompt[:-1]), version)
            if group.prefill is None:
                return False
            self.stats.prefills += 1
        pf = group.prefill
        if not self._run_prefill(pf, budget, params):
            return False
        full, partial = divmod(len(pf.tokens), self.spec.page_size)
        slots, seqs, copies = [], [], []
        for slot in [pf.slot, *self._free_slots(pf.shard)]:
            if group.next_sample == req.num_samples:
                break
            if slot is None:
                continue
            if slot == pf.slot:  # the first sample: the group's own pages
                pages, shared = list(pf.pages), list(pf.pages)
                self.seqs.unreserve(slot)
                pf.slot = None
            else:
                pages, shared = pf.pages[:full], pf.pages[:full]
                if partial or self.bound:
                    fresh = self._alloc(pf.shard, 1, slot)
                    if not fresh:
                        break
                    if partial:
                        copies.append((pf.shard, pf.pages[full], fresh[0]))
                    pages = pages + fresh
            self.allocator.share(pf.shard, shared)
            seq = self.seqs.new_seq(group, group.next_sample, pf.version)
            seq.pages = pages
            self.table[slot] = self._row(pages)
            slots.append(slot)
            seqs.append(seq)
            group.next_sample += 1
        if copies:
            self.seqs.copy(copies)
        if slots:
            self.seqs.start(slots, seqs)
        if group.next_sample == req.num_samples:
            self._drop_prefill(group)  # the group's own hold on its pages
            return True
        if not self._free_slots(pf.shard) and self.spec.shards > 1:
            # other shards may have room: this prefix is dropped and prefilled again there
            self._drop_prefill(group)
        return False

    def _resume(
        self, item: Resume, budget: list[float], params: DecodeParams, version: int
    ) -> bool:
        seq = item.seq
        if item.prefill is None:
            item.prefill = self._start_prefill(seq.cached[:-1], version)
            if item.prefill is None:
                return False
            self.stats.recomputed_tokens += len(item.prefill.tokens)
        pf = item.prefill
        if not self._run_prefill(pf, budget, params):
            return False
        self.seqs.unreserve(pf.slot)
        seq.pages, seq.prompt_version = pf.pages, pf.version
        self._restart(pf.slot, seq, version)
        return True

    # ---- decoding ---------------------------------------------------------------------------

    def _compact(self) -> None:
        """Packs live slots into [0, live) (one shard): their vectors and block-table rows."""
        n = len(self.seqs)
        holes = self.seqs.free_slots(0, n)
        movers = sorted((s for s in self.seqs if s >= n), reverse=True)
        moves = list(zip(movers, holes))
        if not moves:
            return
        self.seqs.move(moves)
        for src, dst in moves:
            self.table[dst], self.table[src] = self.table[src], 0

    def prepare_decode(self, n_steps: int, batching: str) -> tuple[PagedWork | None, int | None]:
        """Pages for the next `n_steps` tokens of every live sequence (a shard short of them
        preempts its newest); the decode call's work and rows (live slots packed first when
        there are row buckets). Contiguous: (None, None)."""
        if self.bound:
            return None, None
        spec, z = self.spec, self.spec.page_size
        ends = self._ends(n_steps)
        for shard in range(spec.shards):
            live = self._live_in(shard)
            need = {s: max(0, pages_for(ends[s] + 1, z) - len(self.seqs[s].pages)) for s in live}
            victims = sorted(live, key=lambda s: self.seqs[s].admitted)
            if sum(need.values()) > self.allocator.free(shard):  # idle pages first
                self.evict(shard, sum(need.values()))
            while sum(need.values()) > self.allocator.free(shard):
                victim = victims.pop()
                del need[victim]
                self._preempt(victim)
            for s, n in need.items():
                if n:
                    seq = self.seqs[s]
                    seq.pages += self.allocator.alloc(shard, n)
                    self.table[s] = self._row(seq.pages)
        rows = spec.max_slots
        # static batching decodes its whole batch until the longest request ends: no buckets
        if len(spec.row_buckets) > 1 and batching == "continuous":
            self._compact()
            rows = spec.row_bucket(max(self.seqs, default=0) + 1)
        ends = self._ends(n_steps)  # slot ids after preemption and moves
        geometry, window = spec.geometry, spec.config.sliding_window
        lists = dict(slots_per_shard=self.per_shard, shards=spec.shards, length=spec.work_len)
        full = work_lists(ends, dict.fromkeys(ends, 0), geometry=geometry, **lists)
        sliding = (None, None, None)
        if spec.config.has_sliding:
            starts = {s: max(0, self.seqs[s].position - window + 1) for s in ends}
            sliding = work_lists(ends, starts, geometry=geometry, **lists)
        return PagedWork(self.table.copy(), *full, *sliding), rows

    def _ends(self, n_steps: int) -> dict[int, int]:
        last = self.spec.max_len - 1
        return {s: min(seq.position + n_steps - 1, last) for s, seq in self.seqs.items()}

    def _preempt(self, slot: int) -> None:
        (seq,) = self.seqs.stop([slot], running=True)
        self.release(seq, slot)
        self.stats.preemptions += 1
        self.seqs.requeue(seq)

    def release(self, seq: Seq, slot: int | None, *, shard: int | None = None) -> None:
        """Frees the pages of `seq`, of `slot` (or parked in `shard`: `slot` None)."""
        self.allocator.release(self._shard(slot) if shard is None else shard, seq.pages)
        seq.pages = []
        if slot is not None:
            self.table[slot] = 0

    def recompute_all(self) -> None:
        """Drops every sequence's K/V, to be recomputed with the params held now (`on_push`): live
        ones requeued (oldest first, at the head), parked ones' pages freed, prefills restarted."""
        live = sorted(self.seqs, key=lambda s: self.seqs[s].admitted)
        stopped = self.seqs.stop(live, running=True)
        for slot, seq in zip(live, stopped):
            self.release(seq, slot)
        for item in self.seqs.queue:
            self._drop_prefill(item)
        for p in self.seqs.parked:
            if p.seq.pages:
                self.release(p.seq, None, shard=p.shard)
        for seq in reversed(stopped):  # each goes to the head: the oldest ends first
            self.seqs.requeue(seq)

    # ---- multi-turn: parking between turns --------------------------------------------------

    def park(self, parked: Parked, slot: int) -> None:
        """A sequence leaves `slot` until its next turn, keeping its pages."""
        parked.shard = self._shard(slot)
        self.table[slot] = 0

    def evict(self, shard: int, want: int, keep: Parked | None = None) -> None:
        """Frees the pages of `shard`'s parked sequences but `keep` (those still waiting for their
        hook first) until `want` pages are free (they are recomputed when they resume)."""
        for p in sorted(self.seqs.parked, key=lambda p: p.append is not None):
            if self.allocator.free(shard) >= want:
                return
            if p is not keep and p.shard == shard and p.seq.pages:
                self.release(p.seq, None, shard=shard)
                self.stats.preemptions += 1

    def resume(self, parked: Parked, params: DecodeParams, version: int) -> bool:
        """Writes the appended tokens into the parked sequence's pages and restarts it in a free
        slot of its shard (bound: its own); without pages it is requeued to be recomputed. False
        when it must wait (after evicting other parked sequences; with nothing decoding in its
        shard it gives its pages up instead, to be recomputed)."""
        seq, shard = parked.seq, parked.shard
        if not seq.pages:
            self.seqs.requeue(seq)
            return True
        cached = seq.cached
        need = pages_for(len(cached) - 1, self.spec.page_size) - len(seq.pages)
        free = [self._own_slot(shard, seq.pages[0])] if self.bound else self._free_slots(shard)
        if need > self.allocator.free(shard):
            self.evict(shard, need, parked)
        if not free or need > self.allocator.free(shard):
            if self._live_in(shard):
                return False
            self.release(seq, None, shard=shard)  # nothing runs here: recompute it later
            self.stats.preemptions += 1
            self.seqs.requeue(seq)
            return True
        if need:
            seq.pages += self.allocator.alloc(shard, need)
        prefill = Prefill(shard, cached[:-1], seq.pages, version, done=parked.cached)
        self._run_prefill(prefill, [math.inf], params)
        self._restart(free[0], seq, version)
        return True
