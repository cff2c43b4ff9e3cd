"""What a sampler is asked and gives back: the request and result types, the errors, and the
`Rollout` protocol every backend offers (`RolloutStream` over our engine or over vLLM). Budget
forcing (`Interrupt`, `rollout.interrupt`) and multi-turn requests (`TurnHook`) are described in
docs/recipes.md and docs/envs.md.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

from rlvr_jax.rollout.device.sampling import DEFAULT_SAMPLING, SamplingParams
from rlvr_jax.rollout.device.state import REPLAY


class RequestError(ValueError):
    """A request the engine cannot serve (too long, bad ids, too many stop tokens...)."""


class RolloutError(RuntimeError):
    """The stream's driver failed (see `__cause__`) or the stream was stopped."""


TokenHook = Callable[[int, list[int], list[float]], None]
"""`on_tokens(sample_index, tokens, logprobs)`: the new tokens of one live sample (the stop
token included when one ends it) and their log-probs, called on the thread that drives the
scheduler right after each decode chunk. It must be quick and must not raise."""


class TurnHook(Protocol):
    """What a multi-turn request carries (`rlvr_jax.envs.EnvGroup` is the one we ship)."""

    def next_turn(
        self, sample_index: int, tokens: list[int], finish_reason: str
    ) -> concurrent.futures.Future:
        """Sample `sample_index` stopped with `tokens` (its whole completion so far) and
        `finish_reason` ("stop" or "length"). Returns at once (on the driver thread: quick,
        never raising) a future of the token ids to append, or None: the episode is over."""

    def episode(self, sample_index: int) -> Any:
        """The episode's record once it is over (`Completion.episode`)."""


@dataclasses.dataclass(frozen=True)
class Replay:
    """Teacher forcing through the decode step: the slot feeds `tokens` (a completion sampled
    before) instead of drawing and reports each one's log-prob as sampling does (`rescore`), on
    budget forcing's device arrays (`budget` = `REPLAY`)."""

    tokens: tuple[int, ...]
    budget: int = REPLAY

    def max_new_tokens(self, max_new_tokens: int) -> int:
        """The slot's budget: the replayed tokens (RequestError past `max_new_tokens`)."""
        if not 0 < len(self.tokens) <= max_new_tokens:
            raise RequestError(
                f"a replay of {len(self.tokens)} tokens needs 1..max_new_tokens={max_new_tokens}"
            )
        return len(self.tokens)

    def sampled(self, n_tokens: int) -> None:
        """Replayed tokens count as sampled (no flags)."""
        del n_tokens


@dataclasses.dataclass(frozen=True)
class Interrupt:
    """One request's budget forcing (docs/recipes.md): after `budget` generated tokens, the decode
    loop feeds and emits `tokens` (not sampled: log-prob 0, `Completion.sampled` False), then the
    completion may generate `answer_budget` more."""

    budget: int
    """Generated tokens after which `tokens` are forced (the thinking budget)."""
    tokens: tuple[int, ...]
    """The inserted token ids."""
    answer_budget: int
    """Tokens the completion may generate after the inserted ones."""

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise RequestError(f"interrupt budget must be >= 1, got {self.budget}")
        if not self.tokens:
            raise RequestError("interrupt tokens must not be empty")
        if self.answer_budget < 1:
            raise RequestError(f"interrupt answer_budget must be >= 1, got {self.answer_budget}")

    @property
    def total(self) -> int:
        """Most tokens an interrupted completion holds: budget + inserted + answer."""
        return self.budget + len(self.tokens) + self.answer_budget

    def max_new_tokens(self, max_new_tokens: int) -> int:
        """The slot's generation budget for a request of `max_new_tokens`: `total`, which
        must fit in it (RequestError otherwise)."""
        if self.total > max_new_tokens:
            raise RequestError(
                f"budget forcing needs {self.budget} thinking + {len(self.tokens)} inserted + "
                f"{self.answer_budget} answer = {self.total} tokens, more than "
                f"max_new_tokens={max_new_tokens}"
            )
        return self.total

    def sampled(self, n_tokens: int) -> list[bool]:
        """Per-token flags of a completion of `n_tokens`: False on the inserted tokens."""
        end = self.budget + len(self.tokens)
        return [not self.budget <= i < end for i in range(n_tokens)]


@dataclasses.dataclass(frozen=True)
class SlotRequest:
    """What one slot generates for (host side; one per sample)."""

    seed: int
    sample_index: int
    max_new_tokens: int
    sampling: SamplingParams = DEFAULT_SAMPLING
    stop_token_ids: tuple[int, ...] = ()
    interrupt: Interrupt | Replay | None = None
    """Budget forcing (or a replay, `rescore`); None = off."""


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
    interrupt: Interrupt | Replay | None = None
    """Budget forcing (`Interrupt`), or a replay (`rescore`); None = off."""
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


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled completion (DESIGN.md's convention)."""

    prompt_index: int
    sample_index: int
    tokens: list[int]
    """Token ids as sampled; the stop token included when one ended it."""
    logprobs: list[float]
    """log softmax(logits / T)[token] over the full vocabulary, fp32 (T = 1 when greedy)."""
    finish_reason: str
    """"stop" (a stop token was sampled) or "length" (max_new_tokens reached)."""
    policy_versions: list[int]
    """The params version that produced each token."""
    sampled: list[bool] | None = None
    """Per token: False where the engine inserted it (budget forcing; an environment's
    responses): log-prob 0, never trained on. None = every token sampled."""
    prompt_version: int | None = None
    """The params version that computed the prompt's K/V (a group's shared prefill may predate
    an in-flight update; a recomputed sequence's is the recompute's); None = unknown."""
    episode: Any = None
    """A multi-turn sample's episode record (`TurnHook.episode`); None for one turn."""

    @property
    def interrupted(self) -> bool:
        """Whether budget forcing inserted tokens into this completion."""
        return self.episode is None and self.sampled is not None and not all(self.sampled)

    @property
    def policy_version(self) -> int:
        """The completion's version: the oldest among its tokens (ALGORITHMS.md)."""
        return min(self.policy_versions)


@dataclasses.dataclass(frozen=True)
class CompletedGroup:
    """All `num_samples` completions of one submitted prompt."""

    request_id: Hashable
    meta: Any
    completions: list[Completion]
    """Ordered by sample index; `prompt_index` is the submission order."""
    prompt_tokens: list[int]


class Rollout(Protocol):
    """What a sampler offers (`RolloutStream`): group requests (prompt × G samples) in, completed
    groups out, weights swapped in flight; driven by its thread (`start`) or stepped (`step`)."""

    def submit(
        self,
        request_id: Hashable,
        prompt_tokens: Sequence[int],
        num_samples: int,
        seed: int,
        meta: Any = None,
        *,
        future: bool = False,
        **options: Any,
    ) -> concurrent.futures.Future | None:
        """Queues a request: its group comes back from `get`, or resolves the future returned
        (`future=True`); `RolloutStream.submit` lists the options."""

    def get(self, timeout: float | None = None) -> CompletedGroup:
        """The next completed group of `submit`."""

    def wait(self, futures: Sequence[concurrent.futures.Future]) -> list[CompletedGroup]:
        """The groups of `futures` (stepping an unstarted rollout)."""

    def update_weights(self, params: Any, version: int) -> dict[str, float] | None:
        """New policy params, swapped in at the next boundary (`push/*` figures, if any)."""

    def kv_metrics(self) -> dict[str, float]:
        """KV-cache metrics since the previous call ({} where the backend has none)."""

    def start(self) -> Rollout: ...
    def step(self) -> list[CompletedGroup]: ...
    def pump(self) -> None: ...
    def check(self) -> None: ...
    def stop(self, timeout: float | None = None) -> None: ...
    def close(self) -> None: ...

    @property
    def threaded(self) -> bool: ...
    @property
    def ready(self) -> int: ...
    @property
    def version(self) -> int: ...
    @property
    def stop_token_ids(self) -> tuple[int, ...]: ...
