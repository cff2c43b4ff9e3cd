"""The engine's host half: admit requests into free slots, run decode chunks, collect
tokens, release finished slots (and, on a paged engine, their pages).

Continuous batching refills a finished slot at the next decode step: while requests are
waiting, a decode chunk stops as soon as one slot finishes, and the next one starts after
the refill. Static batching (the baseline) admits a new batch only when every slot is
free, so a batch lasts as long as its longest member. Both drive the same jitted engine
calls and the same per-request randomness, so greedy tokens are identical either way.

Groups: the G samples of one prompt share one prefill (the prefix is inserted into G
slots, or into as many as are free, the rest later from the same prefix; on a paged engine
they share its pages).

The KV layout's host half admits (`kv_layout.ContiguousKV`, `paged_scheduler.PagedKV`).
Paged engines: admission also needs pages; prompts are
prefilled in chunks interleaved with decode chunks; when running sequences outgrow the
pool, the most recently admitted are preempted and later resumed by recomputation, ending
with the tokens they would have had (sampling is keyed by seed, sample and position).

Multi-turn requests (`GroupRequest.turns`): a sample that stops is parked between turns and
resumed in place with the environment's response appended (`rlvr_jax.rollout.host.turns`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Literal

import jax
import numpy as np

from rlvr_jax import dispatch
from rlvr_jax.models import lora
from rlvr_jax.rollout.device.decode import Prefix
from rlvr_jax.rollout.device.kernel import DecodeParams
from rlvr_jax.rollout.device.sampling import DEFAULT_SAMPLING, SamplerMode, SamplingParams
from rlvr_jax.rollout.engine import EngineCore, RequestError, SlotRequest
from rlvr_jax.rollout.host.turns import TurnHook, Turns, stamp
from rlvr_jax.rollout.interrupt import Interrupt
from rlvr_jax.rollout.push import check_complete, check_order, signature

Batching = Literal["continuous", "static"]
BATCHING = ("continuous", "static")

TokenHook = Callable[[int, list[int], list[float]], None]
"""`on_tokens(sample_index, tokens, logprobs)`: the new tokens of one live sample (the stop
token included when one ends it) and their log-probs, called on the thread that drives the
scheduler right after each decode chunk. It must be quick and must not raise."""


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled completion (DESIGN.md's convention)."""

    prompt_index: int
    sample_index: int
    tokens: list[int]
    """Token ids as sampled; the stop token included when one ended it."""
    logprobs: list[float]
    """log softmax(logits / temperature)[token], full vocabulary, fp32 (temperature 1 when
    greedy)."""
    finish_reason: str
    """"stop" (a stop token was sampled) or "length" (max_new_tokens reached)."""
    policy_versions: list[int]
    """The params version that produced each token."""
    sampled: list[bool] | None = None
    """Per token: False where the engine inserted it (budget forcing, `rollout.interrupt`;
    an environment's responses, `rollout.turns`: not sampled, log-prob 0, never trained
    on); None = every token sampled."""
    prompt_version: int | None = None
    """The params version that computed the prompt's KV cache (a group's samples share one
    prefill, which may predate an in-flight update); None = unknown."""
    episode: Any = None
    """A multi-turn request's record of the sample's episode (`TurnHook.episode`, e.g.
    `rlvr_jax.envs.EpisodeRecord`); None for single-turn requests."""

    @property
    def interrupted(self) -> bool:
        """Whether budget forcing inserted tokens into this completion."""
        return self.episode is None and self.sampled is not None and not all(self.sampled)

    @property
    def policy_version(self) -> int:
        """The completion's version: the oldest among its tokens (ALGORITHMS.md)."""
        return min(self.policy_versions)


@dataclasses.dataclass(frozen=True)
class GroupRequest:
    """One prompt and the G samples wanted from it."""

    key: Hashable
    """Returned with the result (the stream's request id)."""
    prompt_index: int
    prompt: tuple[int, ...]
    num_samples: int
    seed: int
    max_new_tokens: int
    sampling: SamplingParams = DEFAULT_SAMPLING
    stop_token_ids: tuple[int, ...] = ()
    meta: Any = None
    on_tokens: TokenHook | None = dataclasses.field(default=None, compare=False)
    """Optional streaming hook (`TokenHook`): sees every sample's tokens as they are made."""
    interrupt: Interrupt | None = None
    """Budget forcing (`rlvr_jax.rollout.interrupt`); None = off."""
    first: bool = False
    """Admitted ahead of the waiting requests not started yet (the weight-push probe)."""
    turns: TurnHook | None = dataclasses.field(default=None, compare=False)
    """Multi-turn episodes (`rlvr_jax.rollout.host.turns`): `max_new_tokens` is then each
    episode's whole budget (generated and appended tokens); None = one turn."""

    def slot_request(self, sample_index: int) -> SlotRequest:
        """What the slot running sample `sample_index` generates for."""
        return SlotRequest(
            self.seed,
            sample_index,
            self.max_new_tokens,
            self.sampling,
            self.stop_token_ids,
            self.interrupt,
        )


@dataclasses.dataclass
class _Group:
    request: GroupRequest
    next_sample: int = 0
    prefix: Prefix | None = None
    done: dict[int, Completion] = dataclasses.field(default_factory=dict)
    prefill: Any = None  # paged: the prompt's pages being (or once) prefilled
    kv_version: int | None = None  # the params version of the prompt's prefill


def _started(item: Any) -> bool:
    """Whether a waiting item has begun (samples admitted, pages prefilled, or a preempted
    sample): a `first` request queues behind those."""
    return not isinstance(item, _Group) or item.next_sample > 0 or item.prefill is not None


@dataclasses.dataclass
class _Slot:
    group: _Group
    sample_index: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    pages: list[int] = dataclasses.field(default_factory=list)  # paged: logical order
    admitted: int = 0  # admission order (paged preemption takes the newest first)
    prompt_version: int | None = None  # its group's `kv_version` when it was admitted
    inserted: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    """[start, end) of each run of appended (not sampled) tokens (`rollout.turns`)."""

    @property
    def position(self) -> int:
        """Position of the slot's next input token (prompt and generated tokens before it)."""
        return len(self.group.request.prompt) - 1 + len(self.tokens)


@dataclasses.dataclass
class SchedulerStats:
    """Counters of one scheduler (waste = 1 - tokens / slot_steps)."""

    decode_calls: int = 0
    decode_steps: int = 0
    slot_steps: int = 0
    """decode steps × slots the scheduler uses."""
    tokens: int = 0
    prefills: int = 0
    preemptions: int = 0
    """Sequences preempted (paged: the pool ran out mid-decode)."""
    recomputed_tokens: int = 0
    """Positions prefilled again to resume preempted sequences."""
    kv_token_steps: int = 0
    """Σ over decode steps of the tokens cached for live sequences."""
    page_steps: int = 0
    """Σ over decode steps of the pages in use (paged)."""
    row_steps: int = 0
    """Σ over decode steps of the slot rows computed (paged engines decode only the packed
    live rows, rounded up to a row bucket)."""
    kv_capacity: int = 0
    """Tokens the KV cache holds (slots × max_len, or the pool's pages × page size)."""
    parked_steps: int = 0
    """Σ over decode steps of the sequences parked between turns (`rollout.turns`)."""

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
        """Pages in use per decode step, on average (paged)."""
        return self.page_steps / self.decode_steps if self.decode_steps else 0.0


class Scheduler:
    """Drives an `EngineCore` over a queue of `GroupRequest`s on the caller's thread.

    Args:
      core: the engine. num_slots: slots to use (default all of the engine's).
      batching: "continuous" or "static". params / version: decode params to start with
        (default the core's) and their policy version.
    """

    def __init__(
        self,
        core: EngineCore,
        *,
        batching: Batching = "continuous",
        num_slots: int | None = None,
        params: DecodeParams | None = None,
        version: int = 0,
    ):
        if batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {batching!r}")
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
        self.stats = SchedulerStats(kv_capacity=core.kv_capacity)
        self._state = core.init_decode_state()
        self._waiting: deque[Any] = deque()  # _Group, or (paged) a preempted sample
        self._slots: dict[int, _Slot] = {}
        self._admissions = 0
        self._kv = core.spec.kv_layout.host(self)
        """The KV layout's host half (`kv_layout.ContiguousKV` or `paged_scheduler.PagedKV`):
        admission, pages for each decode chunk, release, parking between turns."""
        self._turns = Turns(self)
        """Sequences parked between the turns of multi-turn requests."""

    # ---- queue ----------------------------------------------------------------------------

    def check(self, request: GroupRequest) -> None:
        """Raises `RequestError` unless the engine can run `request` (prompt fits a slot,
        seed and stop ids valid): called when a request is queued, never at admission."""
        if request.num_samples < 1:
            raise RequestError(f"num_samples must be >= 1, got {request.num_samples}")
        if request.turns is not None and request.interrupt is not None:
            raise RequestError("a multi-turn request cannot use budget forcing (interrupt)")
        self.core.check_request(request.prompt, request.max_new_tokens)
        self.core.settings([0], [request.slot_request(0)])  # seed / stop-id checks

    def prepare(self, params: Any) -> DecodeParams:
        """Policy params (models layout, any mesh) in this engine's decode layout; raises
        `push.PartialPushError` unless they are a whole policy of the engine's shapes."""
        whole = self.core.model.params  # (LoRA: after the first push, its adapters alone)
        check_complete(params, signature(whole if "embedding" in params else lora.adapters(whole)))
        return self.core.prepare(params)

    def add(self, request: GroupRequest, *, checked: bool = False) -> None:
        """Queues a request, validated now (`check`) unless its submitter already did; a
        `request.first` goes ahead of the waiting ones not started yet."""
        if not checked:
            self.check(request)
        at = len(self._waiting)
        if request.first:
            at = 0
            while at < len(self._waiting) and _started(self._waiting[at]):
                at += 1
        self._waiting.insert(at, _Group(request))

    @property
    def waiting(self) -> int:
        """Groups not fully admitted yet."""
        return len(self._waiting)

    @property
    def live(self) -> int:
        """Slots generating now."""
        return len(self._slots)

    @property
    def parked(self) -> int:
        """Sequences parked between turns (`rollout.turns`)."""
        return len(self._turns.parked)

    @property
    def idle(self) -> bool:
        """Nothing waiting, generating or parked."""
        return not self._waiting and not self._slots and not self._turns.parked

    @property
    def pages_in_use(self) -> int:
        """Pages of the pool in use now (0 on a contiguous engine)."""
        return self._kv.in_use

    def kv_metrics(self, since: SchedulerStats | None = None) -> dict[str, float]:
        """KV-cache metrics (slash-separated keys, for metrics.jsonl / TensorBoard): pages in
        use now; utilisation, preemptions, recomputed tokens and concurrency since the
        snapshot `since` (a copy of an earlier `stats`), or since the start."""
        s = self.stats
        if since is not None:
            s = SchedulerStats(
                **{
                    f.name: getattr(s, f.name) - getattr(since, f.name)
                    for f in dataclasses.fields(s)
                    if f.name != "kv_capacity"
                },
                kv_capacity=s.kv_capacity,
            )
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
        """Decode with `params` (decode layout, actor devices) from the next chunk on; a
        `version` not newer than the current one is refused (`push.OutOfOrderPushError`)."""
        check_order(version, self.version)
        self.params, self.version = params, version

    # ---- driving --------------------------------------------------------------------------

    def _free_slots(self) -> list[int]:
        return [s for s in range(self.num_slots) if s not in self._slots]

    def _admit(self) -> None:
        if self.batching == "static" and self._slots:
            return
        self._kv.admit()

    def _new_slot(self, group: _Group, sample_index: int) -> _Slot:
        self._admissions += 1
        return _Slot(
            group, sample_index, admitted=self._admissions, prompt_version=group.kv_version
        )

    def _restart(self, slot_id: int, slot: _Slot) -> None:
        """`slot` (a preempted or parked sequence, every position but its last cached) decodes
        again in slot `slot_id` (its pages, if any, set) from its last token."""
        req = slot.group.request
        self._slots[slot_id] = slot
        self._state = self.core.activate(
            self._state,
            [slot_id],
            [req.slot_request(slot.sample_index)],
            [(slot.tokens or req.prompt)[-1]],
            [slot.position],
            [len(slot.tokens)],
        )
        stamp(slot, self.version)

    def step(self, *, admit: bool = True) -> list[tuple[GroupRequest, list[Completion]]]:
        """One boundary: admit waiting requests (unless `admit` is False), run one decode
        chunk, collect its tokens. Parked multi-turn sequences whose turn is ready resume
        first (admitting or not). Returns the groups that completed, samples in order."""
        with dispatch.LOCK:  # see rlvr_jax.dispatch: one global enqueue order
            finished = self._turns.poll() if self._turns.parked else []
            if admit:
                self._admit()
        if not self._slots:
            if not finished:
                self._turns.wait()  # only parked sequences: wait for a turn, not spin
            return finished
        mode = SamplerMode.for_params([s.group.request.sampling for s in self._slots.values()])
        version = self.version
        with dispatch.LOCK:  # pages for the chunk (paged: may preempt), packed rows
            work, rows = self._kv.prepare_decode(self.core.chunk)
            refill_soon = self.batching == "continuous" and admit and bool(self._waiting)
            live = sum(s.position for s in self._slots.values())
            self._state, out = self.core.generate(
                self.params,
                self._state,
                mode=mode,
                exit_after=1 if refill_soon else None,
                work=work,
                rows=rows,
            )
        out = jax.device_get(out)  # waits outside the lock: other threads may enqueue
        steps = int(out.steps)
        self.stats.decode_calls += 1
        self.stats.decode_steps += steps
        self.stats.slot_steps += steps * self.num_slots
        self.stats.kv_token_steps += steps * live
        self.stats.page_steps += steps * self.pages_in_use
        self.stats.row_steps += steps * (rows or self.core.spec.max_slots)
        self.stats.parked_steps += steps * len(self._turns.parked)
        return finished + self._collect(out, steps, version)

    def _collect(self, out: Any, steps: int, version: int) -> list:
        finished = []
        for slot_id, slot in list(self._slots.items()):
            valid = np.asarray(out.valid_BxC[slot_id, :steps])
            new = out.tokens_BxC[slot_id, :steps][valid].tolist()
            new_logprobs = out.logprobs_BxC[slot_id, :steps][valid].tolist()
            slot.tokens.extend(new)
            slot.logprobs.extend(new_logprobs)
            slot.versions.extend([version] * len(new))
            self.stats.tokens += len(new)
            req = slot.group.request
            if new and req.on_tokens is not None:
                req.on_tokens(slot.sample_index, new, new_logprobs)
            if out.active_B[slot_id]:
                continue
            del self._slots[slot_id]
            sampled = self._sampled(slot)
            stopped = bool(slot.tokens) and slot.tokens[-1] in req.stop_token_ids
            stopped = stopped and (sampled is None or sampled[-1])  # a forced token never stops
            finish = "stop" if stopped else "length"
            if req.turns is not None:
                self._turns.park(slot_id, slot, finish)
                continue
            self._kv.release(slot, slot_id)
            finished.extend(self._finish(slot, finish))
        return finished

    def _sampled(self, slot: _Slot) -> list[bool] | None:
        """Per-token sampled flags of `slot`'s completion (None: all sampled)."""
        req, n = slot.group.request, len(slot.tokens)
        sampled = None if req.interrupt is None else req.interrupt.sampled(n)
        if slot.inserted:
            sampled = sampled or [True] * n
            for a, b in slot.inserted:
                sampled[a:b] = [False] * (b - a)
        return sampled

    def _finish(self, slot: _Slot, finish_reason: str) -> list:
        """Records `slot`'s completion; returns its group when that was the last sample."""
        req = slot.group.request
        slot.group.done[slot.sample_index] = Completion(
            prompt_index=req.prompt_index,
            sample_index=slot.sample_index,
            tokens=slot.tokens,
            logprobs=slot.logprobs,
            finish_reason=finish_reason,
            policy_versions=slot.versions,
            sampled=self._sampled(slot),
            prompt_version=slot.prompt_version,
            episode=None if req.turns is None else req.turns.episode(slot.sample_index),
        )
        if len(slot.group.done) < req.num_samples:
            return []
        done = slot.group.done
        return [(req, [done[i] for i in range(req.num_samples)])]

    def run(self) -> list[tuple[GroupRequest, list[Completion]]]:
        """Steps until idle; returns every completed group in completion order."""
        results = []
        while not self.idle:
            results.extend(self.step())
        return results
