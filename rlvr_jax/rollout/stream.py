"""`RolloutStream`: the trainer's interface to the engine — requests in continuously,
completed groups out as soon as all their samples finish, weights swapped in flight.

Driven either by a background thread (`start()`, then `get()`), or synchronously on the
caller's thread (`step()`), which multi-process runs need: every process must issue the
same device computations in the same order, so they step in lockstep instead.

Backpressure: `submit` blocks while `max_pending_groups` groups wait for admission, and the
driver admits no new group while `max_ready_groups` completed groups wait to be taken by
`get` (in-flight groups still finish). Memory is bounded by both plus the slots.

A failure of the driver thread is never swallowed: it is re-raised (as `RolloutError`,
with the original exception as its cause) by the next `get`, `submit` or `step`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

from rlvr_jax import dispatch
from rlvr_jax.rollout.engine import EngineCore
from rlvr_jax.rollout.interrupt import Interrupt
from rlvr_jax.rollout.kernel import DecodeParams
from rlvr_jax.rollout.sampling import DEFAULT_SAMPLING, SamplingParams
from rlvr_jax.rollout.scheduler import Batching, Completion, GroupRequest, Scheduler, TokenHook
from rlvr_jax.timeline import Timeline


class RolloutError(RuntimeError):
    """The stream's driver failed (see `__cause__`) or the stream was stopped."""


@dataclasses.dataclass(frozen=True)
class CompletedGroup:
    """All `num_samples` completions of one submitted prompt."""

    request_id: Hashable
    meta: Any
    completions: list[Completion]
    """Ordered by sample index; `prompt_index` is the submission order."""
    prompt_tokens: list[int]


def _core_of(engine: Any) -> EngineCore:
    if isinstance(engine, EngineCore):
        return engine
    if hasattr(engine, "core") and isinstance(engine.core, EngineCore):
        return engine.core  # the JetStream adapter
    raise TypeError(
        f"RolloutStream needs an EngineCore or make_engine's engine, got {type(engine).__name__}"
    )


class RolloutStream:
    """Continuous generation over an engine, one request = one prompt × `num_samples`.

    Args:
      engine: an `EngineCore` (or the JetStream adapter from `make_engine`).
      max_new_tokens, sampling, stop_token_ids: per-request defaults (`submit` may override).
      max_pending_groups: submitted groups waiting for slots before `submit` blocks.
      max_ready_groups: completed groups waiting for `get` before admission pauses.
      num_slots: slots used (default all). batching: "continuous" (default) or "static".
      version: policy version of the engine's current params.
      scheduler: drive this scheduler instead of our engine's (`engine` is then unused): an
        object with `Scheduler`'s `check`, `prepare`, `add`, `set_params`, `step`, `waiting`,
        `live`, `idle` — e.g. `vllm_backend.VllmScheduler`.
      timeline: when given, each decode chunk the driver thread runs is recorded in it as a
        "rollout" span (`rlvr_jax.timeline`; `rlvr-bench e2e` measures overlap with it).
      interrupt: budget forcing of every request (`rlvr_jax.rollout.interrupt`); None = off.
    """

    def __init__(
        self,
        engine: Any,
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
    ):
        if max_pending_groups < 1 or max_ready_groups < 1:
            raise ValueError("max_pending_groups and max_ready_groups must be >= 1")
        self.defaults = (max_new_tokens, sampling, tuple(int(t) for t in stop_token_ids))
        self.interrupt = interrupt
        self.max_pending_groups = max_pending_groups
        self.max_ready_groups = max_ready_groups
        if scheduler is None:
            scheduler = Scheduler(
                _core_of(engine), batching=batching, num_slots=num_slots, version=version
            )
        self.scheduler = scheduler
        self._cond = threading.Condition()
        self._incoming: deque[GroupRequest] = deque()
        self._ready: deque[CompletedGroup] = deque()
        self._futures: dict[Hashable, concurrent.futures.Future] = {}
        self._in_flight: set[Hashable] = set()
        self._weights: tuple[DecodeParams, int] | None = None
        self._error: BaseException | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._next_index = 0
        self.timeline = timeline

    # ---- producer side --------------------------------------------------------------------

    def submit(
        self,
        request_id: Hashable,
        prompt_tokens: Sequence[int],
        num_samples: int,
        seed: int,
        meta: Any = None,
        *,
        timeout: float | None = None,
        max_new_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> None:
        """Queues a prompt for `num_samples` samples; blocks while the queue is full (raises
        `TimeoutError` after `timeout` s). Invalid requests raise `RequestError` here."""
        self._enqueue(
            request_id,
            prompt_tokens,
            num_samples,
            seed,
            meta,
            timeout,
            max_new_tokens,
            sampling,
            stop_token_ids,
            future=None,
        )

    def submit_future(
        self,
        request_id: Hashable,
        prompt_tokens: Sequence[int],
        num_samples: int,
        seed: int,
        meta: Any = None,
        *,
        timeout: float | None = None,
        max_new_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        stop_token_ids: Sequence[int] | None = None,
        on_tokens: TokenHook | None = None,
    ) -> concurrent.futures.Future:
        """Like `submit`, but the result goes to the returned future instead of `get`.
        `on_tokens(sample_index, tokens, logprobs)`, when given, is called on the driver
        thread after every decode chunk with each live sample's new tokens (streaming; see
        `scheduler.TokenHook`): quick, never raising, e.g. a `call_soon_threadsafe`."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._enqueue(
            request_id,
            prompt_tokens,
            num_samples,
            seed,
            meta,
            timeout,
            max_new_tokens,
            sampling,
            stop_token_ids,
            future=future,
            on_tokens=on_tokens,
        )
        return future

    def _enqueue(
        self,
        request_id,
        prompt_tokens,
        num_samples,
        seed,
        meta,
        timeout,
        max_new_tokens,
        sampling,
        stop_token_ids,
        *,
        future,
        on_tokens=None,
    ) -> None:
        d_max_new, d_sampling, d_stop = self.defaults
        prompt = tuple(int(t) for t in prompt_tokens)
        request = GroupRequest(
            key=request_id,
            prompt_index=-1,
            prompt=prompt,
            num_samples=num_samples,
            seed=seed,
            max_new_tokens=d_max_new if max_new_tokens is None else max_new_tokens,
            sampling=d_sampling if sampling is None else sampling,
            stop_token_ids=d_stop if stop_token_ids is None else tuple(stop_token_ids),
            meta=meta,
            on_tokens=on_tokens,
            interrupt=self.interrupt,
        )
        self.scheduler.check(request)  # the one validation: bad requests fail their caller
        deadline = None if timeout is None else time.monotonic() + timeout
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
            if future is not None:
                self._futures[request_id] = future
            self._incoming.append(request)
            self._cond.notify_all()

    def update_weights(self, params: Any, version: int) -> None:
        """New policy params (models layout, any mesh); thread-safe. They are moved to the
        actor devices and re-laid now, and swapped in at the next boundary between decode
        chunks; the KV cache is kept (PipelineRL) and tokens record `version`."""
        with dispatch.LOCK:
            prepared = self.scheduler.prepare(params)
        with self._cond:
            self._weights = (prepared, version)
            self._cond.notify_all()

    # ---- consumer side --------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> CompletedGroup:
        """The next completed group (in completion order). Raises `TimeoutError` after
        `timeout` s, `RolloutError` if the driver failed or the stream was stopped."""
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

    # ---- driving --------------------------------------------------------------------------

    def check(self) -> None:
        """Raises `RolloutError` if the driver thread has failed."""
        with self._cond:
            self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RolloutError(f"rollout driver failed: {self._error!r}") from self._error

    def _boundary_locked(self) -> bool:
        """Moves submissions to the scheduler and swaps weights; returns whether to admit."""
        while self._incoming:
            self.scheduler.add(self._incoming.popleft(), checked=True)
        if self._weights is not None:
            self.scheduler.set_params(*self._weights)
            self._weights = None
        self._cond.notify_all()  # submitters waiting for room
        return len(self._ready) < self.max_ready_groups

    def _deliver(self, finished: list) -> list[CompletedGroup]:
        """Routes completed groups: futures are resolved (outside the lock, since their
        callbacks may call back into the stream); the rest are returned."""
        unclaimed, resolved = [], []
        with self._cond:
            for request, completions in finished:
                group = CompletedGroup(request.key, request.meta, completions, list(request.prompt))
                self._in_flight.discard(request.key)
                if request.key in self._futures:
                    resolved.append((self._futures.pop(request.key), group))
                else:
                    unclaimed.append(group)
        for future, group in resolved:
            future.set_result(group)
        return unclaimed

    def step(self) -> list[CompletedGroup]:
        """Synchronous drive: one boundary + one decode chunk on the caller's thread.
        Returns the groups it completed (those submitted with `submit`)."""
        if self._thread is not None:
            raise RuntimeError("this stream is driven by its thread (start() was called)")
        with self._cond:
            self._raise_if_failed()
            self._boundary_locked()
        return self._deliver(self.scheduler.step())

    @property
    def idle(self) -> bool:
        """Nothing submitted is still pending or generating."""
        with self._cond:
            return not self._incoming and self.scheduler.idle

    def _has_work_locked(self) -> bool:
        if self._incoming or self._weights is not None or self.scheduler.live:
            return True
        return bool(self.scheduler.waiting) and len(self._ready) < self.max_ready_groups

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and not self._has_work_locked():
                        self._cond.wait()
                    if self._stopping:
                        return
                    admit = self._boundary_locked()
                if self.timeline is None:
                    unclaimed = self._deliver(self.scheduler.step(admit=admit))
                else:
                    with self.timeline.span("rollout"):
                        unclaimed = self._deliver(self.scheduler.step(admit=admit))
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
        """Starts the background driver thread; returns self."""
        if self._thread is not None:
            raise RuntimeError("the stream is already started")
        self._thread = threading.Thread(target=self._run, name="rollout-driver", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stops the driver after its current chunk; unfinished requests are abandoned
        (their futures fail with `RolloutError`)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._cond:
            futures, self._futures = list(self._futures.values()), {}
        for future in futures:
            future.set_exception(RolloutError("the stream was stopped"))

    def __enter__(self) -> RolloutStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
