"""Running environments inside the rollout engine: one `Episode` per sample, the
`EnvGroup` a request carries (the engine's `rollout.api.TurnHook`), the `EnvRunner` that
makes them (from the `env:` config section) and owns their worker pool, and the `env/*`
metrics of finished episodes.

Each turn end runs on the pool, off the engine's driver thread: the turn's tokens are
decoded, `Environment.step` runs (tools included), and the observation is rendered through
the chat template into the tokens the engine appends to the same sequence. The runner
enforces the episode's limits: `env.max_turns` assistant turns, and the request's
`max_new_tokens` for everything after the prompt (an observation that does not fit ends the
episode, truncated). An environment that raises ends its episode (recorded in
`EpisodeRecord.error`), never the run.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlvr_jax.envs.base import Message, as_step, env_factory
from rlvr_jax.envs.chat import ChatFormat

if TYPE_CHECKING:  # envs does not import the config at run time
    from rlvr_jax.config.schema import EnvConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass
class EpisodeRecord:
    """What happened in one episode (`Completion.episode`)."""

    messages: list[Message]
    """The conversation: the first messages, then each assistant turn and observation."""
    final_text: str = ""
    """The last assistant turn's text: what the row's verifier scores."""
    reward: float = 0.0
    """The environment's reward contributions, summed (added to the verifier's score)."""
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_latency_s: float = 0.0
    """Seconds spent in tool calls, summed."""
    truncated: bool = False
    """Cut off by `env.max_turns` or the token budget before the environment ended it."""
    error: str | None = None
    """What the environment raised, when it did (the episode ended there)."""


class Episode:
    """One sample's episode: an environment instance and its conversation."""

    def __init__(self, runner: EnvRunner, row: Mapping[str, Any]):
        self.runner = runner
        self.env = runner.factory(**runner.kwargs)
        self.closed = False
        with runner.lock:  # closed when it ends, or with the runner (a group never run)
            runner.open.add(self)
        self.chat = ChatFormat(runner.tokenizer, getattr(self.env, "tools", ()))
        messages = [dict(m) for m in self.env.reset(row)]
        self.record = EpisodeRecord(messages=messages)
        self.prompt_ids = self.chat.prompt_ids(messages)
        self.seen = 0
        """Completion tokens already turned into messages (turns and observations)."""

    def turn(self, tokens: list[int], finish_reason: str) -> list[int] | None:
        """The `TurnHook` answer for this episode (see `rollout.host.turns`). An episode that
        ends (done, truncated or failed) has its environment's `close()` called, when it has
        one."""
        try:
            ids = self._turn(tokens, finish_reason)
        except Exception as e:  # the environment's failure ends its episode only
            log.warning("environment failed; ending the episode: %r", e)
            self.record.error = f"{type(e).__name__}: {e}"
            ids = None
        if ids is None:
            self.close()
        return ids

    def close(self) -> None:
        """Calls the environment's `close()` (once), when it has one."""
        with self.runner.lock:
            if self.closed:
                return
            self.closed = True
            self.runner.open.discard(self)
        close = getattr(self.env, "close", None)
        if callable(close):
            try:
                close()
            except Exception as e:  # a failing close ends nothing else
                log.warning("environment close() failed: %r", e)

    def _turn(self, tokens: list[int], finish_reason: str) -> list[int] | None:
        rec, runner = self.record, self.runner
        new = tokens[self.seen :]
        stop = finish_reason == "stop" and bool(new) and new[-1] in runner.stop_token_ids
        text = runner.tokenizer.decode(new[:-1] if stop else new, skip_special_tokens=True)
        rec.turns += 1
        rec.final_text = text
        rec.messages.append({"role": "assistant", "content": text})
        if finish_reason != "stop":  # the budget ran out mid-turn
            rec.truncated = True
            return None
        step = as_step(self.env.step(text))
        rec.reward += float(step.reward)
        rec.tool_calls += int(step.info.get("tool_calls", 0))
        rec.tool_errors += int(step.info.get("tool_errors", 0))
        rec.tool_latency_s += float(step.info.get("tool_latency_s", 0.0))
        if step.done or not step.observation:
            return None
        if rec.turns >= runner.max_turns:
            rec.truncated = True
            return None
        history = list(rec.messages)
        rec.messages.extend(dict(m) for m in step.observation)
        stop_text = runner.tokenizer.decode(new[-1:]) if stop else ""
        ids = self.chat.observation_ids(history, step.observation, stop_text)
        if len(tokens) + len(ids) >= runner.max_new_tokens:
            rec.truncated = True
            return None
        self.seen = len(tokens) + len(ids)
        return ids


class EnvGroup:
    """The episodes of one request's samples: the engine's `TurnHook` (`GroupRequest.turns`).
    `prompt_ids` is the first messages' rendering, shared by every sample."""

    def __init__(self, runner: EnvRunner, row: Mapping[str, Any]):
        self.runner, self.row = runner, row
        first = Episode(runner, row)
        self.prompt_ids = first.prompt_ids
        self._episodes = {0: first}

    def next_turn(
        self, sample_index: int, tokens: list[int], finish_reason: str
    ) -> concurrent.futures.Future:
        return self.runner.pool.submit(self._turn, sample_index, tokens, finish_reason)

    def _turn(self, sample_index: int, tokens: list[int], finish_reason: str) -> list[int] | None:
        episode = self._episodes.get(sample_index)
        if episode is None:
            episode = self._episodes[sample_index] = Episode(self.runner, self.row)
            if episode.prompt_ids != self.prompt_ids:
                episode.record.error = "reset gave this sample another first message"
                return None
        return episode.turn(tokens, finish_reason)

    def episode(self, sample_index: int) -> EpisodeRecord:
        return self._episodes[sample_index].record


class EnvRunner:
    """Episodes of the `env:` section (`EnvConfig`): `group(row)` makes a request's hook,
    `close()` stops the pool; `max_new_tokens` is each episode's budget after the prompt."""

    def __init__(
        self,
        cfg: EnvConfig,
        tokenizer: Any,
        *,
        max_new_tokens: int,
        stop_token_ids: Sequence[int],
    ):
        self.factory = env_factory(cfg.name)
        self.kwargs = dict(cfg.kwargs)
        if cfg.name == "tools":
            self.kwargs.setdefault("tools", list(cfg.tools))
            self.kwargs.setdefault("timeout_s", cfg.tool_timeout_s)
        self.tokenizer = tokenizer
        self.max_turns, self.max_new_tokens = cfg.max_turns, max_new_tokens
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.pool = concurrent.futures.ThreadPoolExecutor(cfg.workers, thread_name_prefix="env")
        self.lock = threading.Lock()
        self.open: set[Episode] = set()
        """Episodes not yet over (closed as they end, the rest by `close()`)."""

    def group(self, row: Any) -> EnvGroup:
        """The hook of one request for data row `row` (a `PromptRow` or a row dict)."""
        if hasattr(row, "to_dict"):
            row = {**row.to_dict(), "index": row.index, "source": row.source}
        return EnvGroup(self, row)

    def close(self) -> None:
        """Stops the pool and closes the episodes still open (those of groups that were
        made but never run, e.g. a prompt over `data.max_prompt_len`)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self.lock:
            episodes = list(self.open)
        for episode in episodes:
            episode.close()


def answer_text(completion: Any, tokenizer: Any) -> str:
    """What the verifier scores: an episode's last assistant turn, else the completion."""
    if completion.episode is not None:
        return completion.episode.final_text
    return tokenizer.decode(completion.tokens, skip_special_tokens=True)


def episode_metrics(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """`env/turns` and `env/tool_calls` (means per episode), `env/tool_errors` (count),
    `env/tool_latency_s` (mean per call), `env/truncated_episodes` (fraction) and
    `env/failed_episodes` (count: the environment raised); {} without episodes."""
    if not records:
        return {}
    calls = sum(r.tool_calls for r in records)
    return {
        "env/turns": float(np.mean([r.turns for r in records])),
        "env/tool_calls": calls / len(records),
        "env/tool_errors": float(sum(r.tool_errors for r in records)),
        "env/tool_latency_s": sum(r.tool_latency_s for r in records) / max(calls, 1),
        "env/truncated_episodes": float(np.mean([r.truncated for r in records])),
        "env/failed_episodes": float(sum(r.error is not None for r in records)),
    }
