"""The engine's host driver (`Scheduler`): each step admits waiting requests (`host.kv`), runs
one decode chunk, collects its tokens, and releases finished sequences or parks them between
turns (`host.turns`); `host.sequences` owns every sequence it moves.

Continuous batching refills a finished slot at the next decode step (while requests wait, a
chunk stops as soon as one slot finishes); static batching (the baseline) admits a new batch
only when every slot is free. Both share the jitted calls and per-request randomness, so greedy
tokens are identical. A weight update (`set_params`) takes effect at the next chunk: sequences
keep their K/V (PipelineRL), or recompute it with the new weights (`on_push="recompute"`).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import numpy as np

from rlvr_jax import dispatch
from rlvr_jax.models import lora
from rlvr_jax.rollout.api import ON_PUSH, Finished, GroupRequest, OnPush
from rlvr_jax.rollout.device.kernel import DecodeParams
from rlvr_jax.rollout.device.sampling import SamplerMode
from rlvr_jax.rollout.device.state import ChunkOutput
from rlvr_jax.rollout.engine import EngineCore
from rlvr_jax.rollout.host.kv import PagePolicy, SchedulerStats
from rlvr_jax.rollout.host.sequences import Sequences
from rlvr_jax.rollout.host.turns import Turns
from rlvr_jax.rollout.push import check_complete, check_order, signature

Batching = Literal["continuous", "static"]
BATCHING = ("continuous", "static")
__all__ = ["BATCHING", "Batching", "Scheduler", "SchedulerStats"]


class Scheduler:
    """Drives an `EngineCore` over a queue of `GroupRequest`s on the caller's thread: `num_slots`
    of its slots (default all), `batching` "continuous" or "static", starting from `params` (decode
    layout; default the core's) at policy `version`; `on_push`: at a weight update, in-flight
    sequences "keep" their K/V or "recompute" it with the new weights (`rollout.on_push`)."""

    def __init__(
        self,
        core: EngineCore,
        *,
        batching: Batching = "continuous",
        num_slots: int | None = None,
        params: DecodeParams | None = None,
        version: int = 0,
        on_push: OnPush = "keep",
    ):
        if batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {batching!r}")
        if on_push not in ON_PUSH:
            raise ValueError(f"on_push must be one of {ON_PUSH}, got {on_push!r}")
        total = core.spec.max_slots
        num_slots = total if num_slots is None else num_slots
        if not 1 <= num_slots <= total:
            raise ValueError(
                f"num_slots must be in [1, {total}] (the engine's slots), got {num_slots}"
            )
        self.core = core
        self.batching = batching
        self.num_slots = num_slots
        self.params = core.params if params is None else params
        self.version = version
        self.on_push = on_push
        self.stats = SchedulerStats(kv_capacity=core.kv_capacity)
        self._slots = Sequences(core, num_slots)
        self._kv = PagePolicy(self._slots, core.spec, self.stats)
        self._turns = Turns(self._slots, self._kv)
        self._recompute = False  # set by a push under on_push="recompute"

    # ---- queue ----------------------------------------------------------------------------

    def check(self, request: GroupRequest) -> None:
        """Raises `RequestError` unless the engine can run `request` (called when it is queued)."""
        self.core.check_request(request.prompt, request.max_new_tokens)
        self.core.settings([0], [request.slot_request(0)])  # seed / stop-id checks

    def prepare(self, params: dict) -> DecodeParams:
        """Policy params (models layout, any mesh) in this engine's decode layout; raises
        `push.PartialPushError` unless they are a whole policy of the engine's shapes."""
        whole = self.core.model.params  # (LoRA: after the first push, its adapters alone)
        check_complete(params, signature(whole if "embedding" in params else lora.adapters(whole)))
        return self.core.prepare(params)

    def add(self, request: GroupRequest, *, checked: bool = False) -> None:
        """Queues a request, validated now unless its submitter did (`request.first`: ahead of
        the waiting ones not started)."""
        if not checked:
            self.check(request)
        self._slots.add(request)

    @property
    def waiting(self) -> int:
        """Groups not fully admitted yet (and sequences waiting to be recomputed)."""
        return self._slots.waiting

    @property
    def live(self) -> int:
        return len(self._slots)

    @property
    def parked(self) -> int:
        return len(self._slots.parked)

    @property
    def idle(self) -> bool:
        return self._slots.idle

    @property
    def pages_in_use(self) -> int:
        """Pages of the pool in use now (contiguous: rows)."""
        return self._kv.in_use

    def kv_metrics(self, since: SchedulerStats | None = None) -> dict[str, float]:
        """KV-cache metrics (metrics.jsonl keys): pages in use now; utilisation, preemptions,
        recomputed tokens and concurrency since `since` (a copy of an earlier `stats`)."""
        s = self.stats
        if since is not None:
            diff = {
                f.name: getattr(s, f.name) - getattr(since, f.name) for f in dataclasses.fields(s)
            }
            s = SchedulerStats(**(diff | {"kv_capacity": s.kv_capacity}))
        out = {
            "rollout/kv_pages_in_use": float(self.pages_in_use),
            "rollout/kv_utilisation": s.kv_utilisation,
            "rollout/preemptions": float(s.preemptions),
            "rollout/recomputed_tokens": float(s.recomputed_tokens),
            "rollout/mean_concurrent": s.mean_concurrent,
        }
        if self._turns.count or s.parked_steps:  # multi-turn requests ran
            out["env/parked_slots"] = s.parked_steps / s.decode_steps if s.decode_steps else 0.0
        return out

    def set_params(self, params: DecodeParams, version: int) -> None:
        """Decode with `params` (decode layout) from the next chunk on (`on_push="recompute"`:
        once in-flight K/V is recomputed with them); refuses an old `version`."""
        check_order(version, self.version)
        self.params, self.version = params, version
        self._recompute = self.on_push == "recompute"

    # ---- driving --------------------------------------------------------------------------

    def step(self, *, admit: bool = True) -> Finished:
        """One boundary (parked sequences whose turn is ready resume, waiting requests are
        admitted if `admit`) and one decode chunk; returns the groups completed."""
        finished: Finished = []
        with dispatch.LOCK:  # see rlvr_jax.dispatch: one global enqueue order
            if self._recompute:
                self._kv.recompute_all()
                self._recompute = False
            for seq, reason in self._turns.poll(self.params, self.version):
                finished += seq.group.finish(seq, reason)
            if admit and not (self.batching == "static" and self._slots):
                self._kv.admit(self.params, self.version)
        if not self._slots:
            if not finished:
                self._turns.wait()  # only parked sequences: wait for a turn, not spin
            return finished
        mode = SamplerMode.for_params([seq.request.sampling for seq in self._slots.values()])
        version = self.version
        with dispatch.LOCK:  # pages for the chunk (paged: may preempt), packed rows
            work, rows = self._kv.prepare_decode(self.core.chunk, self.batching)
            refill_soon = self.batching == "continuous" and admit and self._slots.waiting > 0
            live = sum(seq.position for seq in self._slots.values())
            out = self._slots.decode(
                self.params, mode=mode, exit_after=1 if refill_soon else None, work=work, rows=rows
            )
        out = jax.device_get(out)  # waits outside the lock: other threads may enqueue
        steps = int(out.steps)
        self.stats.decode_calls += 1
        self.stats.decode_steps += steps
        self.stats.slot_steps += steps * self.num_slots
        self.stats.kv_token_steps += steps * live
        self.stats.page_steps += steps * self.pages_in_use
        self.stats.row_steps += steps * (rows or self.core.spec.max_slots)
        self.stats.parked_steps += steps * len(self._slots.parked)
        return finished + self._collect(out, steps, version)

    def _collect(self, out: ChunkOutput, steps: int, version: int) -> Finished:
        finished = []
        for slot, seq in list(self._slots.items()):
            valid = np.asarray(out.valid_BxC[slot, :steps])
            new = out.tokens_BxC[slot, :steps][valid].tolist()
            seq.sampled_tokens(new, out.logprobs_BxC[slot, :steps][valid].tolist(), version)
            self.stats.tokens += len(new)
            req = seq.request
            if out.active_B[slot]:
                continue
            self._slots.stop([slot])
            sampled = seq.sampled()
            stopped = bool(seq.tokens) and seq.tokens[-1] in req.stop_token_ids
            stopped = stopped and (sampled is None or sampled[-1])  # a forced token never stops
            finish = "stop" if stopped else "length"
            if req.turns is not None:
                self._turns.park(slot, seq, finish)
                continue
            self._kv.release(seq, slot)
            finished += seq.group.finish(seq, finish)
        return finished

    def run(self) -> Finished:
        """Steps until idle; returns every completed group in completion order."""
        results = []
        while not self.idle:
            results.extend(self.step())
        return results
