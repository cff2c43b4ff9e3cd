"""`RolloutStream`: the `Rollout` over a scheduler: requests in continuously, each group out once
all its samples finish, weights swapped in flight. Driven by its thread (`start()`) or on the
caller's (`step()`: multi-process runs step in lockstep). Backpressure: `submit` blocks while
`max_pending_groups` wait, and nothing is admitted while `max_ready_groups` wait for `get`. A
driver failure is re-raised (`RolloutError`, caused by it) by the next `get`, `submit` or `step`."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

import jax

from rlvr_jax import dispatch
from rlvr_jax.rollout.api import (
    CompletedGroup,
    Finished,
    GroupRequest,
    Interrupt,
    OnPush,
    RolloutError,
    TokenHook,
    TurnHook,
)
from rlvr_jax.rollout.device.kernel import DecodeParams
from rlvr_jax.rollout.device.sampling import DEFAULT_SAMPLING, SamplingParams
from rlvr_jax.rollout.engine import core_of
from rlvr_jax.rollout.host.scheduler import Batching, Scheduler
from rlvr_jax.rollout.push import check_order, tree_bytes
from rlvr_jax.timeline import Timeline

__all__ = ["CompletedGroup", "RolloutError", "RolloutStream"]


class RolloutStream:
    """Continuous generation over an engine, one request = one prompt × `num_samples`.

    Args:
      engine: an `EngineCore` (or `make_engine`'s JetStream adapter).
      max_new_tokens, sampling, stop_token_ids: per-request defaults (`submit` may override).
      num_slots, batching, version, on_push: our engine's `Scheduler`'s.
      scheduler: drive this instead (`engine` unused), e.g. `backends.vllm.VllmScheduler`.
      timeline: records each decode chunk as a "rollout" span.
      interrupt: budget forcing of every request (`api.Interrupt`); None = off.
      turns: `dispatch.DeviceTurns` shared with a learner: each chunk runs in an actor turn."""

    def __init__(
        self,
        engine: object,
        *,
        max_new_tokens: int,
        sampling: SamplingParams = DEFAULT_SAMPLING,
        stop_token_ids: Sequence[int] = (),
        max_pending_groups: int = 64,
        max_ready_groups: int = 64,
        num_slots: int | None = None,
        batching: Batching = "continuous",
        version: int = 0,
        timeline: Timeline | None = None,
        scheduler: Any = None,
        interrupt: Interrupt | None = None,
        turns: dispatch.DeviceTurns | None = None,
        on_push: OnPush = "keep",
    ):
        if max_pending_groups < 1 or max_ready_groups < 1:
            raise ValueError("max_pending_groups and max_ready_groups must be >= 1")
        self.defaults = (max_new_tokens, sampling, tuple(int(t) for t in stop_token_ids))
        self.interrupt = interrupt
        self.max_pending_groups = max_pending_groups
        self.max_ready_groups = max_ready_groups
        ours = dict(batching=batching, num_slots=num_slots, version=version, on_push=on_push)
        self.scheduler = Scheduler(core_of(engine), **ours) if scheduler is None else scheduler
        self._cond = threading.Condition()
        self._incoming: deque[GroupRequest] = deque()
        self._ready: deque[CompletedGroup] = deque()
        self._futures: dict[Hashable, concurrent.futures.Future] = {}
        self._in_flight: set[Hashable] = set()
        self._weights: tuple[DecodeParams, int] | None = None
        self._pins: dict[Hashable, int] = {}  # request id -> the version it must run on
        self._pinned_live: set[Hashable] = set()  # pinned requests in the scheduler
        self._kv_mark: Any = None  # the scheduler's stats at the last `kv_metrics`
        self._error: BaseException | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._next_index = 0
        self.timeline = timeline
        self.turns = turns

    # ---- producer side --------------------------------------------------------------------

    def submit(
        self,
        request_id: Hashable,
        prompt_tokens: Sequence[int],
        num_samples: int,
        seed: int,
        meta: Any = None,
        *,
        future: bool = False,
        timeout: float | None = None,
        max_new_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        stop_token_ids: Sequence[int] | None = None,
        version: int | None = None,
        first: bool = False,
        budget_forcing: bool = True,
        on_tokens: TokenHook | None = None,
        turns: TurnHook | None = None,
    ) -> concurrent.futures.Future | None:
        """Queues a prompt for `num_samples` samples; its group comes back from `get`, or resolves
        the future returned (`future=True`). Blocks while the queue is full (`TimeoutError` after
        `timeout` s); an invalid request raises `RequestError` here. `version=v` pins it to
        policy v (admitted once the actors hold v, no update swapped in while it generates; an
        older pin fails with `RolloutError`); `first=True` admits it ahead of the waiting ones
        not started, `budget_forcing=False` turns forcing off (both for the push probe);
        `on_tokens`: `api.TokenHook`; `turns`: each sample a multi-turn episode (`api.TurnHook`)."""
        d_max_new, d_sampling, d_stop = self.defaults
        request = GroupRequest(
            key=request_id,
            prompt_index=-1,
            prompt=tuple(int(t) for t in prompt_tokens),
            num_samples=num_samples,
            seed=seed,
            max_new_tokens=d_max_new if max_new_tokens is None else max_new_tokens,
            sampling=d_sampling if sampling is None else sampling,
            stop_token_ids=d_stop if stop_token_ids is None else tuple(stop_token_ids),
            meta=meta,
            on_tokens=on_tokens,
            interrupt=None if turns is not None or not budget_forcing else self.interrupt,
            turns=turns,
            first=first,
        )
        self.scheduler.check(request)  # the one validation: bad requests fail their caller
        deadline = None if timeout is None else time.monotonic() + timeout
        done = concurrent.futures.Future() if future else None
        with self._cond:
            self._raise_if_failed()
            if request_id in self._in_flight:
                raise ValueError(f"request id {request_id!r} is already in flight")
            while len(self._incoming) >= self.max_pending_groups:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"submit: {self.max_pending_groups} groups still pending")
                self._cond.wait(left)
                self._raise_if_failed()
            request = dataclasses.replace(request, prompt_index=self._next_index)
            self._next_index += 1
            self._in_flight.add(request_id)
            if done is not None:
                self._futures[request_id] = done
            if version is not None:
                self._pins[request_id] = version
            self._incoming.append(request)
            self._cond.notify_all()
        return done

    def update_weights(self, params: Any, version: int) -> dict[str, float]:
        """New policy params (models layout, any mesh; LoRA: adapters alone once the engine has the
        base), thread-safe: re-laid on the actor devices now, swapped in at the next boundary.
        Returns `push/bytes` and `push/seconds` once the actors have them. Waits outside
        `dispatch.LOCK` (held only to enqueue: the driver keeps decoding meanwhile). Refuses an
        old `version` (`OutOfOrderPushError`) and a partial policy (`PartialPushError`)."""
        jax.block_until_ready(params)
        start = time.perf_counter()
        with self._cond:
            check_order(version, self._sent_locked())
        with dispatch.LOCK:
            prepared = self.scheduler.prepare(params)
        jax.block_until_ready(prepared)
        seconds = time.perf_counter() - start
        stats = {"push/bytes": float(tree_bytes(params)), "push/seconds": seconds}
        with self._cond:
            check_order(version, self._sent_locked())  # another thread may have pushed since
            self._weights = (prepared, version)
            self._cond.notify_all()
        return stats

    def _sent_locked(self) -> int:  # the newest version the actors hold or were sent
        return self.scheduler.version if self._weights is None else self._weights[1]

    # ---- consumer side --------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> CompletedGroup:
        """The next completed group (`TimeoutError` after `timeout` s; `RolloutError` if the
        driver failed or the stream was stopped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._ready:
                self._raise_if_failed()
                if self._stopping:
                    raise RolloutError("the stream was stopped")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"get: no completed group within {timeout} s")
                self._cond.wait(left)
            group = self._ready.popleft()
            self._cond.notify_all()
            return group

    @property
    def pending(self) -> int:
        """Groups submitted and not fully admitted."""
        with self._cond:
            return len(self._incoming) + self.scheduler.waiting

    @property
    def ready(self) -> int:
        """Completed groups waiting for `get`."""
        with self._cond:
            return len(self._ready)

    @property
    def version(self) -> int:
        """Policy version the actors decode with now."""
        with self._cond:
            return self.scheduler.version

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The stop ids of a request that names none (the rollout's)."""
        return self.defaults[2]

    @property
    def threaded(self) -> bool:
        """Whether the driver thread runs (`start`); else callers `step` it."""
        return self._thread is not None

    def wait(
        self, futures: Sequence[concurrent.futures.Future], timeout: float | None = None
    ) -> list[CompletedGroup]:
        """The results of `futures` (`submit(future=True)`), in order, once all are done; an
        unstarted stream is stepped here (other groups completed meanwhile stay for `get`)."""
        if not self.threaded:
            while not all(f.done() for f in futures):
                self.pump()
        done, _ = concurrent.futures.wait(futures, timeout)
        if len(done) < len(futures):
            raise TimeoutError(f"wait: {len(futures) - len(done)} requests not done in {timeout} s")
        return [f.result() for f in futures]

    def kv_metrics(self) -> dict[str, float]:
        """`Scheduler.kv_metrics` since the previous call; {} for a backend without them (vLLM)."""
        if not hasattr(self.scheduler, "kv_metrics"):
            return {}
        with self._cond:
            metrics = self.scheduler.kv_metrics(since=self._kv_mark)
            self._kv_mark = dataclasses.replace(self.scheduler.stats)
        return metrics

    # ---- driving --------------------------------------------------------------------------

    def check(self) -> None:
        with self._cond:
            self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RolloutError(f"rollout driver failed: {self._error!r}") from self._error

    def _boundary_locked(self) -> bool:
        """Moves submissions to the scheduler and swaps weights (not while a pinned request is
        queued or generating); returns whether to admit."""
        held = self._admit_incoming_locked()
        if self._weights is not None and not self._pinned_live:
            self.scheduler.set_params(*self._weights)
            self._weights = None
            held = self._admit_incoming_locked()
        self._cond.notify_all()  # submitters waiting for room
        return len(self._ready) < self.max_ready_groups and not held

    def _admit_incoming_locked(self) -> bool:
        """Hands the scheduler every submission it can run now; returns whether pinned ones are
        held back for a later version."""
        held: deque[GroupRequest] = deque()
        while self._incoming:
            request = self._incoming.popleft()
            pin = self._pins.get(request.key)
            if pin is not None and pin != self.scheduler.version:
                if pin > self.scheduler.version:
                    held.append(request)
                    continue
                self._fail_locked(
                    request.key,
                    RolloutError(
                        f"request {request.key!r} is pinned to policy version {pin}, but the "
                        f"actors already hold version {self.scheduler.version}"
                    ),
                )
                continue
            if pin is not None:
                self._pinned_live.add(request.key)
            self.scheduler.add(request, checked=True)
        self._incoming = held
        return bool(held)

    def _fail_locked(self, key: Hashable, error: BaseException) -> None:
        self._in_flight.discard(key)
        self._pins.pop(key, None)
        future = self._futures.pop(key, None)
        if future is not None:
            future.set_exception(error)

    def _deliver(self, finished: Finished) -> list[CompletedGroup]:
        """Resolves the futures of completed groups (outside the lock: callbacks may call back
        into the stream); returns the other groups."""
        unclaimed, resolved = [], []
        with self._cond:
            for request, completions in finished:
                group = CompletedGroup(request.key, request.meta, completions, list(request.prompt))
                self._in_flight.discard(request.key)
                self._pins.pop(request.key, None)
                self._pinned_live.discard(request.key)
                if request.key in self._futures:
                    resolved.append((self._futures.pop(request.key), group))
                else:
                    unclaimed.append(group)
        for future, group in resolved:
            future.set_result(group)
        return unclaimed

    def step(self) -> list[CompletedGroup]:
        """One boundary + one decode chunk on the caller's thread; returns the groups completed
        (those without a future)."""
        if self._thread is not None:
            raise RuntimeError("this stream is driven by its thread (start() was called)")
        with self._cond:
            self._raise_if_failed()
            self._boundary_locked()
        return self._deliver(self._chunk(admit=True))

    def pump(self) -> None:
        """`step`, the groups of `submit` it completes left queued for `get`."""
        stray = self.step()
        with self._cond:
            self._ready.extend(stray)

    @property
    def idle(self) -> bool:
        """Nothing submitted is still pending or generating."""
        with self._cond:
            return not self._incoming and self.scheduler.idle

    def _has_work_locked(self) -> bool:
        if self.scheduler.live or (self._weights is not None and not self._pinned_live):
            return True
        if self.scheduler.parked:  # multi-turn sequences between turns
            return True
        runnable = any(
            self._pins.get(r.key, self.scheduler.version) <= self.scheduler.version
            for r in self._incoming
        )
        return runnable or (
            bool(self.scheduler.waiting) and len(self._ready) < self.max_ready_groups
        )

    def _chunk(self, *, admit: bool) -> Finished:
        """One scheduler step, in an actor turn and a "rollout" span when those are kept."""
        with contextlib.ExitStack() as stack:
            if self.turns is not None:
                stack.enter_context(self.turns.actor())
            if self.timeline is not None:
                stack.enter_context(self.timeline.span("rollout"))
            return self.scheduler.step(admit=admit)

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and not self._has_work_locked():
                        self._cond.wait()
                    if self._stopping:
                        return
                    admit = self._boundary_locked()
                unclaimed = self._deliver(self._chunk(admit=admit))
                with self._cond:
                    self._ready.extend(unclaimed)
                    self._cond.notify_all()
        except BaseException as e:  # surfaced to every caller, never swallowed
            with self._cond:
                self._error = e
                futures, self._futures = list(self._futures.values()), {}
                self._cond.notify_all()
            for future in futures:
                future.set_exception(RolloutError(f"rollout driver failed: {e!r}"))

    def start(self) -> RolloutStream:
        if self._thread is not None:
            raise RuntimeError("the stream is already started")
        self._thread = threading.Thread(target=self._run, name="rollout-driver", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stops the driver after its chunk; unfinished requests' futures fail (`RolloutError`)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._cond:
            futures, self._futures = list(self._futures.values()), {}
        for future in futures:
            future.set_exception(RolloutError("the stream was stopped"))

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> RolloutStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
