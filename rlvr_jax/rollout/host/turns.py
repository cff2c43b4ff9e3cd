"""Multi-turn episodes inside the engine's slots: the scheduler's side of `rlvr_jax.envs`.

A sample of a request with a `TurnHook` that stops is *parked*: it leaves its slot, keeps its
pages (contiguous: its row), and the hook is called with its tokens; its future (the
environment runs on its own workers) is polled at every boundary. None ends the episode; token
ids (a tool's response, the next turn's opener) are written into its pages with `extend` and
decoding resumes. Appended tokens are not sampled (`Completion.sampled` False, log-prob 0) and
carry the version of the turn that follows. The episode's whole budget (generated + appended)
is `max_new_tokens`; a parked sequence that loses its pages resumes exactly, by recompute.
"""

from __future__ import annotations

import concurrent.futures
import logging

from rlvr_jax.rollout.device.kernel import DecodeParams
from rlvr_jax.rollout.host.kv import PagePolicy
from rlvr_jax.rollout.host.sequences import Parked, Seq, Sequences

log = logging.getLogger(__name__)

WAIT_S = 0.02  # how long a scheduler with nothing to decode waits for a parked turn


class Turns:
    """The turns of one scheduler's multi-turn sequences."""

    def __init__(self, seqs: Sequences, kv: PagePolicy):
        self.seqs, self.kv = seqs, kv
        self.count = 0  # turns that ended in tokens appended in place

    def park(self, slot: int, seq: Seq, finish_reason: str) -> None:
        """`seq` (just finished a turn in `slot`, which it has left) waits for its hook."""
        future = seq.request.turns.next_turn(seq.sample_index, list(seq.tokens), finish_reason)
        parked = Parked(seq, future, cached=seq.position, finish_reason=finish_reason)
        self.kv.park(parked, slot)
        self.seqs.park(parked)

    def poll(self, params: DecodeParams, version: int) -> list[tuple[Seq, str]]:
        """Resumes the parked sequences whose hook answered with tokens (when the pages allow);
        returns the ended ones with their finish reasons."""
        finished = []
        for p in self.seqs.parked:
            seq = p.seq
            if p.append is None:
                if not p.future.done():
                    continue
                tokens = self._result(p)
                # the appended tokens must leave room for a generated one (else: truncated)
                room = tokens and len(seq.tokens) + len(tokens) < seq.request.max_new_tokens
                if not room:
                    self.seqs.unpark(p)
                    self.kv.release(seq, None, shard=p.shard)
                    finished.append((seq, p.finish_reason if tokens is None else "length"))
                    continue
                seq.inserted.append((len(seq.tokens), len(seq.tokens) + len(tokens)))
                seq.tokens.extend(tokens)
                seq.logprobs.extend([0.0] * len(tokens))
                seq.versions.extend([version] * len(tokens))
                p.append = tokens
            if self.kv.resume(p, params, version):
                self.seqs.unpark(p)
                self.count += 1
        return finished

    def _result(self, p: Parked) -> list[int] | None:
        try:
            tokens = p.future.result()
        except Exception:  # a hook must not raise; if it does, its episode ends here
            log.exception("multi-turn hook failed; ending the episode")
            return None
        return None if tokens is None else [int(t) for t in tokens]

    def wait(self) -> None:
        """Blocks until a parked hook answers (at most `WAIT_S`)."""
        parked = self.seqs.parked
        waiting = [p.future for p in parked if p.append is None]
        if waiting and len(waiting) == len(parked):
            concurrent.futures.wait(
                waiting, timeout=WAIT_S, return_when=concurrent.futures.FIRST_COMPLETED
            )
