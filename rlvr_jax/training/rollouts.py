"""Sources that generate: prompts → the rollout engine → rewards → a learner batch.

`Rollouts` is the part both share: it draws prompts from the resumable mixture, submits them to
the rollout stream (the row rides along as the request's `meta`), takes completed groups, scores
them with the reward service, pushes the learner's weights to the actors, and keeps the exact-
resume bookkeeping: a checkpoint stores the mixture's state before the oldest request not yet
trained on, plus the ids trained on after it, so a restart re-issues exactly the unseen prompts.

- `RolloutSource` (`algorithm: rl`): zero-variance filtering, active sampling, the staleness
  bound (async), advantages → `RLBatch`. Async mode keeps `rollout.queue_size` batches of
  requests in flight, topped up before returning each batch so the actors generate the next
  one while the learner trains on this one.
- `ExpertIterationSource` (`algorithm: expert_iteration`): on-policy rounds of
  `train.prompts_per_batch` prompts, the verified-correct completions → `TokenBatch`.

Single-process runs drive the stream from its own thread; multi-process runs step it on the
caller's thread, so that every process issues the same device computations in one order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlvr_jax import losses
from rlvr_jax.training.batch import TokenBatch, collate_sft
from rlvr_jax.training.groups import (
    BatchAssembler,
    ScoredGroup,
    build_batch,
    rewards_N,
    score_groups,
)
from rlvr_jax.training.recipes.expert import expert_examples, expert_metrics
from rlvr_jax.training.sources import Batch

log = logging.getLogger("rlvr_jax.train")

POLL_S = 0.25
"""How often a waiting source checks the stop flag."""


class Rollouts:
    """Prompts in, scored groups out, over a rollout stream (our engine or vLLM).

    Args:
      stream: a `RolloutStream` (or the vLLM stream): `submit(..., meta=row)`, `get`, `step`,
        `update_weights`, `start`, `stop`.
      prompts: the `PromptIterator` of `data.sources` (rows carry their `prompt_ids`).
      rewards: the `RewardService`.
      num_samples, seed, max_new_tokens: G, the run's seed, the generation budget.
      threaded: drive the stream from its thread (single process) or on the caller's.
      stop: truthy when the run must stop (checked while waiting).
    """

    def __init__(
        self,
        *,
        stream: Any,
        prompts: Any,
        rewards: Any,
        tokenizer: Any,
        num_samples: int,
        seed: int,
        max_new_tokens: int,
        threaded: bool = True,
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.stream, self.prompts, self.rewards, self.tokenizer = (
            stream,
            prompts,
            rewards,
            tokenizer,
        )
        self.num_samples, self.seed, self.max_new_tokens = num_samples, seed, max_new_tokens
        self.threaded, self.stop = threaded, stop
        self.next_request = 0
        self._snapshots: dict[int, dict] = {}  # not trained on yet -> mixture state before it
        self._generating: set[int] = set()  # submitted, not returned by the stream yet
        self._consumed: set[int] = set()  # trained on
        self._skip: set[int] = set()  # trained on before the restart

    # -- requests -------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Requests submitted and not completed yet."""
        return len(self._generating)

    def submit_one(self) -> None:
        """Draws the next unseen prompt and submits it for G samples."""
        while True:
            rid = self.next_request
            snapshot = self.prompts.state()
            row = self.prompts.next_batch(1)[0]
            self.next_request += 1
            if rid in self._skip:  # trained on before the restart
                self._skip.discard(rid)
                continue
            if row.prompt_ids is None:
                raise ValueError(f"row {row.index} of {row.source!r} was loaded without prompt ids")
            self._snapshots[rid] = snapshot
            self._generating.add(rid)
            self.stream.submit(
                rid,
                row.prompt_ids,
                num_samples=self.num_samples,
                seed=self.seed * 1_000_003 + rid,
                meta=row,
            )
            return

    def fill(self, target: int) -> None:
        """Submits prompts until `target` requests are in flight."""
        while self.in_flight < target:
            self.submit_one()

    def completed(self) -> list[Any]:
        """At least one completed group (all that are ready), or [] when asked to stop.
        The groups stay in the resume bookkeeping until `consume`d."""
        done: list[Any] = []
        while not done and not self.stop():
            if not self.threaded:  # groups an evaluation's stepping completed wait in `get`
                done = self.stream.step()
                while self.stream.ready:
                    done.append(self.stream.get())
                continue
            try:
                done = [self.stream.get(timeout=POLL_S)]
            except TimeoutError:
                continue
            while self.stream.ready:
                done.append(self.stream.get())
        self._generating.difference_update(g.request_id for g in done)
        return done

    def score(self, groups: list[Any]) -> tuple[list[ScoredGroup], dict[str, float]]:
        return score_groups(groups, self.rewards, self.tokenizer, max_len=self.max_new_tokens)

    def kv_metrics(self) -> dict[str, float]:
        """The rollout's KV metrics since the previous call (`RolloutStream.kv_metrics`)."""
        return self.stream.kv_metrics()

    def consume(self, request_ids: list[int]) -> None:
        """Marks requests as trained on (they leave the in-flight bookkeeping)."""
        for rid in request_ids:
            self._snapshots.pop(rid, None)
            self._consumed.add(rid)

    # -- the loop's interface -------------------------------------------------------------
    def start(self) -> None:
        if self.threaded:
            self.stream.start()

    def push_weights(self, params: Any, version: int) -> None:
        self.stream.update_weights(params, version)

    def state(self) -> dict:
        oldest = min(self._snapshots) if self._snapshots else self.next_request
        return {
            "data": self._snapshots.get(oldest, self.prompts.state()),
            "next_request": oldest,
            "consumed_after": sorted(i for i in self._consumed if i > oldest),
        }

    def restore(self, state: dict) -> None:
        self.prompts.restore(state["data"])
        self.next_request = int(state["next_request"])
        self._skip = set(state["consumed_after"])

    def close(self) -> None:
        self.stream.stop()


class _Generating:
    """The loop's interface of a source over `Rollouts` (`self.rollouts`)."""

    rollouts: Rollouts
    on_policy: bool = True
    """Whether the next batch must be generated by the weights of the last update (sync): the
    loop then pushes them right after dispatching it, else when the update has completed."""

    def push_weights(self, params: Any, version: int) -> None:
        self.rollouts.push_weights(params, version)

    def start(self) -> None:
        self.rollouts.start()

    def state(self) -> dict:
        return self.rollouts.state()

    def restore(self, state: dict) -> None:
        self.rollouts.restore(state)

    def close(self) -> None:
        self.rollouts.close()


class RolloutSource(_Generating):
    """`algorithm: rl`: batches of `prompts_per_batch` kept groups (see module docstring)."""

    def __init__(
        self,
        rollouts: Rollouts,
        settings: losses.LossSettings,
        *,
        prompts_per_batch: int,
        mode: str,
        queue_size: int,
        max_staleness: int,
        zero_variance: bool,
        active_sampling: bool,
        max_draws: int,
        overlong_filter: bool,
        rows: int,
        seq_len: Callable[[list[ScoredGroup]], int],
        pad_id: int,
        max_tokens: int = 0,
        updates: int = 1,
        row_multiple: int = 1,
    ) -> None:
        self.rollouts, self.settings = rollouts, settings
        self.P, self.mode, self.queue_size = prompts_per_batch, mode, queue_size
        self.max_staleness = max_staleness
        self.zero_variance, self.overlong_filter = zero_variance, overlong_filter
        self.cap = prompts_per_batch * max(max_draws, 1) if active_sampling else prompts_per_batch
        self.rows, self.seq_len, self.pad_id = rows, seq_len, pad_id
        self.packing = dict(max_tokens=max_tokens, updates=updates, row_multiple=row_multiple)
        self.on_policy = mode == "sync"

    def next(self, policy_version: int) -> Batch | None:
        r = self.rollouts
        asm = BatchAssembler(
            self.P,
            zero_variance_filter=self.zero_variance,
            max_staleness=self.max_staleness if self.mode == "async" else None,
        )
        taken: list[int] = []
        service: list[dict[str, float]] = []
        t0 = time.perf_counter()
        while not asm.full and asm.drawn < self.cap:
            if self.mode == "async":
                r.fill(self._async_target())
            else:
                r.fill(min(self.P - len(asm.kept), self.cap - asm.drawn))
            done = r.completed()
            if not done:  # stopped: nothing is consumed, the requests stay in flight
                return None
            taken.extend(g.request_id for g in done)
            scored, metrics = r.score(done)
            service.append(metrics)
            for g in scored:
                asm.offer(g, policy_version)
        if r.stop():  # a signal came while these groups were scored: the run stops before
            return None  # this step; they stay in the resume bookkeeping, not consumed
        r.consume(taken)
        if self.mode == "async":  # the actors generate the next batch while this one trains
            r.fill(self._async_target())
        kept = asm.kept
        arrays, slots = None, None
        if kept:
            arrays, slots = build_batch(
                kept,
                self.settings,
                rows=self.rows,
                seq_len=self.seq_len(kept) + 1,
                pad_id=self.pad_id,
                overlong_filter=self.overlong_filter,
                **self.packing,
            )
        metrics = {**merge_service_metrics(service), **asm.metrics(), **r.kv_metrics()}
        metrics["staleness/mean"] = (
            float(np.mean([policy_version - g.version for g in kept])) if kept else 0.0
        )
        metrics["time/rollout_s"] = time.perf_counter() - t0
        return Batch(
            arrays,
            metrics=metrics,
            texts=[g.texts[0] for g in kept if g.texts],
            tokens=sum(len(c.tokens) for g in kept for c in g.completions),
            rewards_B=rewards_N(kept),
            group_size=r.num_samples,
            slots=slots,
        )

    def _async_target(self) -> int:
        """Requests kept in flight in async mode: `rollout.queue_size` batches."""
        return self.P * max(self.queue_size, 1)


class ExpertIterationSource(_Generating):
    """`algorithm: expert_iteration`: each step is one on-policy round — `prompts_per_batch`
    prompts issued after the previous update reached the engine, every completion verified, the
    completions whose verifier score is at least `min_score` laid out as an SFT batch of
    prompts × samples rows (rows not filled are masked; a round that keeps nothing makes no
    update). No group is filtered. Extra metrics: `expert/*`."""

    def __init__(
        self,
        rollouts: Rollouts,
        *,
        prompts_per_batch: int,
        min_score: float,
        rows: int,
        seq_len: int,
        pad_id: int,
        max_tokens: int = 0,
        row_multiple: int = 1,
    ) -> None:
        self.rollouts, self.P, self.min_score = rollouts, prompts_per_batch, min_score
        self.rows, self.full_len, self.pad_id = rows, seq_len, pad_id
        self.max_tokens, self.row_multiple = max_tokens, row_multiple

    def next(self, policy_version: int) -> Batch | None:
        r = self.rollouts
        t0 = time.perf_counter()
        r.fill(self.P)
        done: list[Any] = []
        while len(done) < self.P:
            more = r.completed()
            if not more:
                return None
            done.extend(more)
        r.consume([g.request_id for g in done])
        groups, metrics = r.score(done)
        asm = BatchAssembler(self.P, zero_variance_filter=False)
        for g in groups:
            asm.offer(g, policy_version)
        metrics = {
            **metrics,
            **asm.metrics(),
            **expert_metrics(groups, min_score=self.min_score),
            **r.kv_metrics(),
        }
        metrics["staleness/mean"] = 0.0
        metrics["time/rollout_s"] = time.perf_counter() - t0
        prompts, responses = expert_examples(groups, min_score=self.min_score)
        arrays: TokenBatch | None = None
        if prompts:
            arrays = collate_sft(
                prompts, responses, rows=self.rows, seq_len=self.full_len + 1, pad_id=self.pad_id,
                max_tokens=self.max_tokens, row_multiple=self.row_multiple,
            )  # fmt: skip
        return Batch(
            arrays,
            metrics=metrics,
            texts=[g.texts[0] for g in groups if g.texts],
            tokens=sum(len(c.tokens) for g in groups for c in g.completions),
        )


def merge_service_metrics(calls: list[dict[str, float]]) -> dict[str, float]:
    """The reward service's metrics over several calls: counts summed, the rest averaged.
    `reward/*` are left to the batch assembler (over every drawn group, once)."""
    keys = {k for m in calls for k in m if not k.startswith("reward/")}
    out = {}
    for k in sorted(keys):
        values = [m[k] for m in calls if k in m]
        summed = k.endswith(("/count", "/timeouts", "/errors", "_s")) or k in (
            "rewards/timeouts",
            "rewards/errors",
        )
        out[k] = float(np.sum(values) if summed else np.mean(values))
    return out
