"""Multi-turn episodes inside the engine's slots: the scheduler's side of `rlvr_jax.envs`.

A request with a `TurnHook` (`GroupRequest.turns`) runs each sample as an episode. When a
sample stops (a stop token, or its budget), its sequence is *parked*: it leaves its decode
slot (paged: its pages are kept; contiguous: its row is held), and the hook is called with
the sample's tokens on the driver thread; it returns at once with a future, and the
environment's work (parsing the turn, running tools, rendering the response) runs on the
hook's own worker pool. At every boundary the scheduler polls the parked futures:

- None: the episode is over; the sample becomes its `Completion` (its pages freed).
- token ids (the tool's response rendered through the chat template, and the next
  assistant turn's opener): they are appended to the same sequence — the paged layout
  writes them into the sequence's pages with the chunked-prefill call (`paged_core.extend`),
  the contiguous one into its row (`rollout.extend.extend_row`) — and decoding resumes in a
  free slot. Nothing before them is recomputed.

The appended tokens are part of the completion but not sampled: `Completion.sampled` marks
them False (log-prob 0; masked out of the loss and of the TIS / mismatch statistics, as
budget forcing's are) and they carry the policy version of the turn that follows. Sampling
stays keyed by (seed, sample, position), so a parked sequence that is preempted under page
pressure (its pages freed) and recomputed later resumes exactly. The episode's whole budget
(generated + appended tokens) is the request's `max_new_tokens`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from typing import Any, Protocol

log = logging.getLogger(__name__)

WAIT_S = 0.02
"""How long a scheduler with nothing to decode waits for a parked episode's turn."""


class TurnHook(Protocol):
    """What a multi-turn request carries (`rlvr_jax.envs.EnvGroup` is the one we ship)."""

    def next_turn(
        self, sample_index: int, tokens: list[int], finish_reason: str
    ) -> concurrent.futures.Future:
        """Sample `sample_index` stopped with `tokens` (all of its completion so far: turns
        and appended responses) and `finish_reason` ("stop" or "length"). Returns at once;
        the future resolves to the token ids to append (the episode goes on) or None (it is
        over). Runs on the driver thread: it must be quick and must not raise."""

    def episode(self, sample_index: int) -> Any:
        """The episode's record once it is over (`Completion.episode`)."""


@dataclasses.dataclass
class Parked:
    """A sequence between two turns."""

    slot: Any
    """The scheduler's `_Slot` (tokens, log-probs, versions, pages)."""
    future: concurrent.futures.Future
    cached: int
    """Positions whose K/V are in the sequence's pages / row ([0, cached))."""
    finish_reason: str
    """How its last turn ended ("stop" or "length")."""
    shard: int = 0
    """Paged: the slot shard holding its pages."""
    row: int | None = None
    """Contiguous: the slot whose row holds its K/V (reserved while parked)."""
    append: list[int] | None = None
    """The tokens to append, once the hook's future has resolved to them."""


def stamp(slot: Any, version: int) -> None:
    """Gives the tokens appended at the end of `slot`'s sequence the policy `version` of the
    turn that follows them (called when the sequence resumes decoding)."""
    if slot.inserted and slot.inserted[-1][1] == len(slot.tokens):
        a, b = slot.inserted[-1]
        slot.versions[a:b] = [version] * (b - a)


class Turns:
    """The parked sequences of one `Scheduler` (its `_turns`)."""

    def __init__(self, scheduler: Any):
        self.sched = scheduler
        self.parked: list[Parked] = []
        self.count = 0
        """Turns that ended in a tool response appended in place."""

    def park(self, slot_id: int, slot: Any, finish_reason: str) -> None:
        """`slot` (just finished a turn in `slot_id`) waits for its hook."""
        req = slot.group.request
        future = req.turns.next_turn(slot.sample_index, list(slot.tokens), finish_reason)
        p = Parked(slot, future, cached=slot.position, finish_reason=finish_reason)
        self.sched._kv.park(p, slot_id)
        self.parked.append(p)

    def poll(self) -> list:
        """Resolves the parked sequences whose hook has answered: resumes those that go on
        (when the KV layout has room) and finishes the others. Returns the groups completed."""
        finished = []
        for p in list(self.parked):
            if p.append is None:
                if not p.future.done():
                    continue
                tokens = self._result(p)
                if tokens is None or not self._fits(p, tokens):
                    self.parked.remove(p)
                    self.sched._kv.drop(p)
                    finish = p.finish_reason if tokens is None else "length"
                    finished.extend(self.sched._finish(p.slot, finish))
                    continue
                slot = p.slot
                slot.inserted.append((len(slot.tokens), len(slot.tokens) + len(tokens)))
                slot.tokens.extend(tokens)
                slot.logprobs.extend([0.0] * len(tokens))
                slot.versions.extend([self.sched.version] * len(tokens))
                p.append = tokens
            if self.sched._kv.resume(p):
                self.parked.remove(p)
                self.count += 1
        return finished

    def _result(self, p: Parked) -> list[int] | None:
        try:
            tokens = p.future.result()
        except Exception:  # a hook must not raise; if it does, its episode ends here
            log.exception("multi-turn hook failed; ending the episode")
            return None
        return None if tokens is None else [int(t) for t in tokens]

    def _fits(self, p: Parked, tokens: list[int]) -> bool:
        """Whether the appended tokens leave room for one more generated token within the
        request's budget (else the episode ends, truncated)."""
        req = p.slot.group.request
        return bool(tokens) and len(p.slot.tokens) + len(tokens) < req.max_new_tokens

    def wait(self) -> None:
        """Blocks until a parked hook answers (at most `WAIT_S`)."""
        waiting = [p.future for p in self.parked if p.append is None]
        if waiting and len(waiting) == len(self.parked):
            concurrent.futures.wait(
                waiting, timeout=WAIT_S, return_when=concurrent.futures.FIRST_COMPLETED
            )

    def evict(self, shard: int, free: Any, want: int, keep: Parked | None = None) -> None:
        """Paged: frees the pages of parked sequences of `shard` but `keep` (those still
        waiting for their hook first) until `free()` reaches `want`; they are recomputed
        when they resume, exactly as preempted sequences are."""
        order = sorted(self.parked, key=lambda p: p.append is not None)
        for p in order:
            if free() >= want:
                return
            if p is not keep and p.shard == shard and p.slot.pages:
                self.sched._kv.release(p.slot, None, shard=shard)
                self.sched.stats.preemptions += 1
