"""The one owner of an engine's sequences and of the slots' device state (`DecodeState`).

A sequence is in one place at a time: waiting (its group not fully admitted, or to be
recomputed), live in a slot, or parked between turns. Every change of place, and every device
call on the slots or the cache, is a method of `Sequences` (a read-only mapping of the live
sequences by slot); the scheduler, the page policy and the turns call them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections import deque
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from rlvr_jax.rollout.api import Completion, Finished, GroupRequest
from rlvr_jax.rollout.device.kernel import DecodeParams
from rlvr_jax.rollout.device.paged import PagedWork
from rlvr_jax.rollout.device.sampling import SamplerMode
from rlvr_jax.rollout.device.state import ChunkOutput
from rlvr_jax.rollout.engine import EngineCore


@dataclasses.dataclass
class Prefill:
    """K/V of `tokens` (positions 0..) being written into `pages` of `shard`, by chunks."""

    shard: int
    tokens: list[int]
    pages: list[int]
    version: int
    """The params version the writes started with."""
    done: int = 0
    slot: int | None = None
    """The slot reserved for its sequence (a group's first sample) meanwhile."""


@dataclasses.dataclass
class Group:
    """A request whose samples share one prefill of its prompt."""

    request: GroupRequest
    next_sample: int = 0
    done: dict[int, Completion] = dataclasses.field(default_factory=dict)
    prefill: Prefill | None = None
    """The prompt's pages while its samples are not all admitted."""

    def finish(self, seq: Seq, finish_reason: str) -> Finished:
        """Records sample `seq`'s completion; returns the group once that was its last."""
        self.done[seq.sample_index] = seq.completion(finish_reason)
        n = self.request.num_samples
        return [] if len(self.done) < n else [(self.request, [self.done[i] for i in range(n)])]


@dataclasses.dataclass
class Seq:
    """One sample's sequence: its tokens so far (with their log-probs and versions), its pages."""

    group: Group
    sample_index: int
    admitted: int
    """Admission order (preemption takes the newest first)."""
    prompt_version: int | None
    """The params version that computed its prompt's K/V."""
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    pages: list[int] = dataclasses.field(default_factory=list)
    """Its pages in logical order (contiguous: its slot's row)."""
    inserted: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    """[start, end) of each run of appended (not sampled) tokens (`host.turns`)."""

    @property
    def request(self) -> GroupRequest:
        return self.group.request

    @property
    def position(self) -> int:
        """Position of its next input token."""
        return len(self.request.prompt) - 1 + len(self.tokens)

    @property
    def cached(self) -> list[int]:
        """Prompt and tokens: the K/V of all but the last are (or are to be) in its pages."""
        return [*self.request.prompt, *self.tokens]

    def sampled_tokens(self, tokens: list[int], logprobs: list[float], version: int) -> None:
        """Appends `tokens` sampled by policy `version` and streams them to `on_tokens`."""
        self.tokens += tokens
        self.logprobs += logprobs
        self.versions += [version] * len(tokens)
        if tokens and self.request.on_tokens is not None:
            self.request.on_tokens(self.sample_index, tokens, logprobs)

    def stamp(self, version: int) -> None:
        """Gives the tokens appended at its end the `version` of the turn that follows them."""
        if self.inserted and self.inserted[-1][1] == len(self.tokens):
            a, b = self.inserted[-1]
            self.versions[a:b] = [version] * (b - a)

    def sampled(self) -> list[bool] | None:
        """Per-token sampled flags of its completion (None: all sampled)."""
        req, n = self.request, len(self.tokens)
        sampled = None if req.interrupt is None else req.interrupt.sampled(n)
        if self.inserted:
            sampled = sampled or [True] * n
            for a, b in self.inserted:
                sampled[a:b] = [False] * (b - a)
        return sampled

    def completion(self, finish_reason: str) -> Completion:
        req = self.request
        return Completion(
            prompt_index=req.prompt_index,
            sample_index=self.sample_index,
            tokens=self.tokens,
            logprobs=self.logprobs,
            finish_reason=finish_reason,
            policy_versions=self.versions,
            sampled=self.sampled(),
            prompt_version=self.prompt_version,
            episode=None if req.turns is None else req.turns.episode(self.sample_index),
        )


@dataclasses.dataclass
class Resume:
    """A sequence whose K/V was dropped (preempted, or at a push), to be recomputed."""

    seq: Seq
    prefill: Prefill | None = None


@dataclasses.dataclass
class Parked:
    """A sequence between two turns."""

    seq: Seq
    future: concurrent.futures.Future
    cached: int
    """Positions whose K/V are in its pages ([0, cached))."""
    finish_reason: str
    """How its last turn ended ("stop" or "length")."""
    shard: int = 0
    append: list[int] | None = None
    """The tokens to append, once the hook's future has resolved."""


Waiting = Group | Resume


class Sequences(Mapping[int, Seq]):
    """The sequences of one scheduler over `core`'s slots [0, `num_slots`)."""

    def __init__(self, core: EngineCore, num_slots: int):
        self.core = core
        self.num_slots = num_slots
        self._state = core.init_decode_state()
        self._live: dict[int, Seq] = {}
        self._waiting: deque[Waiting] = deque()
        self._parked: list[Parked] = []
        self._reserved: set[int] = set()
        self._admissions = 0

    # ---- the live slots ---------------------------------------------------------------------

    def __getitem__(self, slot: int) -> Seq:
        return self._live[slot]

    def __iter__(self) -> Iterator[int]:
        return iter(self._live)

    def __len__(self) -> int:
        return len(self._live)

    def free_slots(self, lo: int, hi: int) -> list[int]:
        """Slots of [lo, hi) (and of `num_slots`) neither live nor reserved."""
        busy = self._live.keys() | self._reserved
        return [s for s in range(lo, min(hi, self.num_slots)) if s not in busy]

    def reserve(self, slot: int) -> None:  # for a sequence being written into its pages
        self._reserved.add(slot)

    def unreserve(self, slot: int) -> None:
        self._reserved.discard(slot)

    def new_seq(self, group: Group, sample_index: int, prompt_version: int) -> Seq:
        self._admissions += 1
        return Seq(group, sample_index, self._admissions, prompt_version)

    def start(self, slots: Sequence[int], seqs: Sequence[Seq]) -> None:
        """Each of `seqs` (every position but its last in its pages) decodes in its slot from
        its last token."""
        self._state = self.core.activate(
            self._state,
            slots,
            [seq.request.slot_request(seq.sample_index) for seq in seqs],
            [seq.cached[-1] for seq in seqs],
            [seq.position for seq in seqs],
            [len(seq.tokens) for seq in seqs],
        )
        self._live.update(zip(slots, seqs))

    def stop(self, slots: Sequence[int], *, running: bool = False) -> list[Seq]:
        """The sequences of `slots` leave them; `running`: stopped on the device too."""
        if running and slots:
            self._state = self.core.deactivate(self._state, slots)
        return [self._live.pop(slot) for slot in slots]

    def move(self, moves: Sequence[tuple[int, int]]) -> None:
        """Each (src, dst) live sequence moves to slot dst (its pages stay where they are)."""
        self._state = self.core.move_slots(self._state, moves)
        for src, dst in moves:
            self._live[dst] = self._live.pop(src)

    # ---- device calls on the cache ----------------------------------------------------------

    def write(
        self, params: DecodeParams, tokens: list[int], start: int, row: np.ndarray, shard: int
    ) -> None:
        """Writes the K/V of `tokens` at positions `start ..` into the pages `row` of `shard`."""
        self._state = self.core.extend(params, self._state, tokens, start, row, shard)

    def copy(self, copies: Sequence[tuple[int, int, int]]) -> None:
        """Copies each (shard, src, dst) page, all layers."""
        self._state = self.core.copy_pages(self._state, copies)

    def decode(
        self,
        params: DecodeParams,
        *,
        mode: SamplerMode,
        exit_after: int | None,
        work: PagedWork | None,
        rows: int | None,
    ) -> ChunkOutput:
        self._state, out = self.core.generate(
            params, self._state, mode=mode, exit_after=exit_after, work=work, rows=rows
        )
        return out

    # ---- the waiting queue ------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Groups not fully admitted, and sequences waiting to be recomputed."""
        return len(self._waiting)

    @property
    def queue(self) -> tuple[Waiting, ...]:  # head first
        return tuple(self._waiting)

    def add(self, request: GroupRequest) -> None:
        enqueue(self._waiting, request)

    def pop_head(self) -> None:
        self._waiting.popleft()

    def requeue(self, seq: Seq) -> None:
        """Queues `seq` (no pages) to be recomputed: behind the head items holding pages."""
        at = 0
        while at < len(self._waiting) and self._waiting[at].prefill is not None:
            at += 1
        self._waiting.insert(at, Resume(seq))

    # ---- parked between turns ---------------------------------------------------------------

    @property
    def parked(self) -> tuple[Parked, ...]:
        return tuple(self._parked)

    def park(self, parked: Parked) -> None:
        self._parked.append(parked)

    def unpark(self, parked: Parked) -> None:
        self._parked.remove(parked)

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._live and not self._parked


def enqueue(queue: deque[Waiting], request: GroupRequest) -> None:
    """Queues `request`'s group; a `request.first` goes ahead of the waiting ones not started."""
    at = len(queue)
    if request.first:
        at = 0
        while at < len(queue) and _started(queue[at]):
            at += 1
    queue.insert(at, Group(request))


def _started(item: Waiting) -> bool:
    """Whether a waiting item has begun (samples admitted, pages written, or a recompute)."""
    return not isinstance(item, Group) or item.next_sample > 0 or item.prefill is not None
