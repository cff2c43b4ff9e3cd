"""Generation for the sources that train on it: prompts → the rollout engine → rewards.

`Rollouts` draws prompts from the resumable mixture, submits them to the rollout stream (the row
as the request's `meta`; with `env.name`, the environment renders the prompt and its turns run
in the engine's slots), scores completed groups, pushes weights, and keeps the exact-resume
bookkeeping: a checkpoint stores the mixture's state before the oldest unsettled request plus
the ids settled after it, so a restart re-issues exactly the unsettled prompts (request id k is
the mixture's draw k, as the ledger records). Single-process runs drive the stream from its own
thread; multi-process runs step it on the caller's, so every process issues the same device
computations in one order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from rlvr_jax.training import ledger
from rlvr_jax.training.context import Context
from rlvr_jax.training.groups import ScoredGroup, score_groups

if TYPE_CHECKING:
    from rlvr_jax.rollout import CompletedGroup, Rollout

log = logging.getLogger("rlvr_jax.train")

POLL_S = 0.25
"""How often a waiting source checks the stop flag."""
MAX_SKIPS_IN_A_ROW = 1000
"""Rows whose environment prompt is too long skipped in a row before that is an error."""


class Rollouts:
    """Prompts in, scored groups out, over an actor `Rollout` (our engine or vLLM).

    `prompts`: the `PromptIterator` of `data.sources`; `threaded`: drive the stream from its
    thread (single process) or on the caller's; `stop`: truthy when the run must stop;
    `env`: the `envs.EnvRunner` of a multi-turn environment (None: one turn), whose prompts
    may have `max_prompt_len` tokens.
    """

    def __init__(
        self,
        *,
        stream: Rollout,
        prompts: Any,
        rewards: Any,
        tokenizer: Any,
        num_samples: int,
        seed: int,
        max_new_tokens: int,
        threaded: bool = True,
        stop: Callable[[], bool] = lambda: False,
        env: Any = None,
        max_prompt_len: int = 0,
    ) -> None:
        self.stream, self.prompts, self.rewards = stream, prompts, rewards
        self.tokenizer = tokenizer
        self.num_samples, self.seed, self.max_new_tokens = num_samples, seed, max_new_tokens
        self.threaded, self.stop = threaded, stop
        self.env, self.max_prompt_len = env, max_prompt_len
        self.skipped_prompts = 0
        """Rows an environment rendered longer than `max_prompt_len` (not submitted)."""
        self.next_request = 0
        self._snapshots: dict[int, dict] = {}  # not consumed yet -> mixture state before it
        self._rows: dict[int, Any] = {}  # not consumed yet -> its data row
        self._generating: set[int] = set()  # submitted, not returned by the stream yet
        self._consumed: set[int] = set()  # settled (here or before the restart)
        self._skip: set[int] = set()  # settled before the restart, not re-drawn yet

    # -- requests -------------------------------------------------------------------------
    def submit_one(self) -> None:
        """Draws the next unseen prompt and submits it for G samples."""
        skipped = 0
        while True:
            rid = self.next_request
            snapshot = self.prompts.state()
            row = self.prompts.next_batch(1)[0]
            self.next_request += 1
            if rid in self._skip:  # settled before the restart
                self._skip.discard(rid)
                continue
            if row.prompt_ids is None:
                raise ValueError(f"row {row.index} of {row.source!r} was loaded without prompt ids")
            prompt, options = row.prompt_ids, {}
            if self.env is not None:
                group = self.env.group(row)
                if len(group.prompt_ids) > self.max_prompt_len:
                    self._skip_long(row, len(group.prompt_ids))
                    skipped += 1
                    if skipped > MAX_SKIPS_IN_A_ROW:
                        raise ValueError(
                            f"{skipped} rows in a row: the environment's prompt exceeds "
                            f"data.max_prompt_len={self.max_prompt_len} (the last one has "
                            f"{len(group.prompt_ids)} tokens); raise data.max_prompt_len"
                        )
                    continue
                prompt, options = group.prompt_ids, {"turns": group}
            self._snapshots[rid] = snapshot
            self._rows[rid] = row
            self._generating.add(rid)
            self.stream.submit(
                rid,
                prompt,
                num_samples=self.num_samples,
                seed=self.seed * 1_000_003 + rid,
                meta=row,
                **options,
            )
            return

    def _skip_long(self, row: Any, n: int) -> None:
        if not self.skipped_prompts:
            log.warning(
                "row %d of %r: the environment's prompt has %d tokens > data.max_prompt_len=%d; "
                "such rows are skipped", row.index, row.source, n, self.max_prompt_len,
            )  # fmt: skip
        self.skipped_prompts += 1

    def fill(self, target: int) -> None:
        """Submits prompts until `target` requests are in flight."""
        while len(self._generating) < target:
            self.submit_one()

    def completed(self) -> list[Any]:
        """The completed groups (at least one), or [] when asked to stop; kept until `consume`d."""
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

    def consume(self, request_ids: list[int]) -> None:
        """Marks requests as settled (they leave the in-flight bookkeeping)."""
        for rid in request_ids:
            self._snapshots.pop(rid, None)
            self._rows.pop(rid, None)
            self._consumed.add(rid)

    def pending(self) -> list[dict]:
        """Ledger records (`pending`) of the requests drawn and not consumed, and, after a
        restart, those between the draw cursor and the last request consumed before it
        (replayed from the data iterator, whose position is left as it was)."""
        out = [ledger.entry(rid, row, "pending") for rid, row in sorted(self._rows.items())]
        if self._skip:
            saved, rid = self.prompts.state(), self.next_request
            for row in self.prompts.next_batch(max(self._skip) + 1 - rid):
                if rid not in self._skip:
                    out.append(ledger.entry(rid, row, "pending"))
                rid += 1
            self.prompts.restore(saved)
        return out

    def ledger_metrics(self) -> dict[str, float]:
        """`ledger/drawn` (prompts drawn so far) and `ledger/pending` (drawn, not settled)."""
        return {"ledger/drawn": float(self.next_request), "ledger/pending": float(len(self._rows))}

    def probe(self, version: int, prompt: list[int], max_new_tokens: int) -> CompletedGroup | None:
        """One sample of `prompt` by the actors at policy `version` (pinned, ahead of the
        queue), for `training.push`; None when the stream is stepped on the caller's thread."""
        if not self.threaded:
            return None
        future = self.stream.submit(
            ("push-probe", version), prompt, 1, seed=0, future=True, version=version, first=True,
            max_new_tokens=max_new_tokens, budget_forcing=False,
        )  # fmt: skip
        return future.result()

    # -- the loop's interface -------------------------------------------------------------
    def start(self) -> None:
        if self.threaded:
            self.stream.start()

    def push_weights(self, params: Any, version: int) -> dict[str, float]:
        return self.stream.update_weights(params, version)

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
        self._consumed = set(self._skip)  # still consumed at the next checkpoint

    def close(self) -> None:
        self.stream.stop()
        if self.env is not None:
            self.env.close()


class GeneratingSource:
    """The loop's interface of a source over `Rollouts` (`self.rollouts`)."""

    rollouts: Rollouts
    on_policy: bool = True
    """Sync: the next batch needs the last update's weights (pushed right after its dispatch)."""

    def push_weights(self, params: Any, version: int) -> dict[str, float]:
        return self.rollouts.push_weights(params, version)

    def probe(self, version: int, prompt: list[int], max_new_tokens: int) -> Any:
        return self.rollouts.probe(version, prompt, max_new_tokens)

    def pending(self) -> list[dict]:
        return self.rollouts.pending()

    def start(self) -> None:
        self.rollouts.start()

    def state(self) -> dict:
        return self.rollouts.state()

    def restore(self, state: dict) -> None:
        self.rollouts.restore(state)

    def close(self) -> None:
        self.rollouts.close()


def merge_service_metrics(calls: list[dict[str, float]]) -> dict[str, float]:
    """The reward service's metrics over calls: counts summed, the rest averaged, no `reward/*`."""
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


def build_rollouts(ctx: Context, params: Any, version: int, *, in_flight: int) -> Rollouts:
    """The run's `Rollouts` over `data.sources`, with room for `in_flight` groups."""
    from rlvr_jax.data import build_prompt_iterator
    from rlvr_jax.rewards import RewardService, known_verifiers

    cfg = ctx.cfg
    prompts = build_prompt_iterator(
        cfg.data, tokenizer=ctx.tokenizer, known_verifiers=known_verifiers()
    )
    rewards = RewardService(cfg.rewards, overlong_buffer=cfg.filter.soft_overlong_buffer)
    try:
        stream = ctx.actor_rollout(
            params, version, max_pending_groups=in_flight + 1, max_ready_groups=in_flight + 1,
            timeline=ctx.timeline, turns=ctx.turns,
        )  # fmt: skip
    except BaseException:
        rewards.close()
        raise
    env = None
    if cfg.env.name is not None:
        from rlvr_jax.envs import EnvRunner

        env = EnvRunner(
            cfg.env,
            ctx.tokenizer,
            max_new_tokens=cfg.rollout.max_new_tokens,
            stop_token_ids=stream.stop_token_ids,
        )
    return Rollouts(
        stream=stream,
        prompts=prompts,
        rewards=rewards,
        tokenizer=ctx.tokenizer,
        num_samples=cfg.rollout.num_samples,
        seed=cfg.seed,
        max_new_tokens=cfg.rollout.max_new_tokens,
        threaded=jax.process_count() == 1,
        stop=ctx.stop,
        env=env,
        max_prompt_len=cfg.data.max_prompt_len,
    )
