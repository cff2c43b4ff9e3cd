"""What a sampler is asked and gives back: request and result types, errors, the `Rollout`
protocol every backend offers, and the capability table `BACKENDS` (read by the config checks,
the builder and the docs): each backend's honoured keys (`Backend.honours`), the settings it
refuses (`Backend.refuses`; `refused(cfg)` names the first one a config sets, and
`config.checks` refuses it at load) and its builder. Budget forcing (`Interrupt`) and multi-turn
requests (`TurnHook`): docs/recipes.md, docs/envs.md.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Literal, Protocol, get_args

from rlvr_jax.rollout.device.sampling import DEFAULT_SAMPLING, SamplingParams
from rlvr_jax.rollout.device.state import REPLAY


class RequestError(ValueError):
    """A request the engine cannot serve (too long, bad ids, too many stop tokens...)."""


class RolloutError(RuntimeError):
    """The stream's driver failed (see `__cause__`) or the stream was stopped."""


OnPush = Literal["keep", "recompute"]
"""`rollout.on_push`: in-flight sequences keep their K/V at a weight push, or recompute it."""
ON_PUSH: tuple[OnPush, ...] = get_args(OnPush)


TokenHook = Callable[[int, list[int], list[float]], None]
"""`on_tokens(sample_index, tokens, logprobs)`: one live sample's new tokens (with its stop token)
and log-probs, called on the driver thread after each decode chunk; quick, never raising."""


class TurnHook(Protocol):
    """What a multi-turn request carries (`rlvr_jax.envs.EnvGroup` is the one we ship)."""

    def next_turn(
        self, sample_index: int, tokens: list[int], finish_reason: str
    ) -> concurrent.futures.Future:
        """Sample `sample_index` stopped with `tokens` (its completion so far) and `finish_reason`.
        Returns at once (driver thread: never raising) a future of the token ids to append, or
        of None: the episode is over."""

    def episode(self, sample_index: int) -> Any:
        """The episode's record once it is over (`Completion.episode`)."""


@dataclasses.dataclass(frozen=True)
class Replay:
    """Teacher forcing (`rescore`): the slot feeds `tokens` instead of drawing and reports their
    log-probs as sampling does, on budget forcing's device arrays (`budget` = `REPLAY`)."""

    tokens: tuple[int, ...]
    budget: int = REPLAY

    def max_new_tokens(self, max_new_tokens: int) -> int:
        if not 0 < len(self.tokens) <= max_new_tokens:
            raise RequestError(
                f"a replay of {len(self.tokens)} tokens needs 1..max_new_tokens={max_new_tokens}"
            )
        return len(self.tokens)

    def sampled(self, n_tokens: int) -> None:  # replayed tokens count as sampled
        del n_tokens


@dataclasses.dataclass(frozen=True)
class Interrupt:
    """One request's budget forcing (docs/recipes.md): after `budget` generated tokens, the decode
    loop feeds and emits `tokens` (not sampled: log-prob 0, `Completion.sampled` False), then the
    completion may generate `answer_budget` more."""

    budget: int
    tokens: tuple[int, ...]
    answer_budget: int

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise RequestError(f"interrupt budget must be >= 1, got {self.budget}")
        if not self.tokens:
            raise RequestError("interrupt tokens must not be empty")
        if self.answer_budget < 1:
            raise RequestError(f"interrupt answer_budget must be >= 1, got {self.answer_budget}")

    @property
    def total(self) -> int:
        """Most tokens an interrupted completion holds."""
        return self.budget + len(self.tokens) + self.answer_budget

    def max_new_tokens(self, max_new_tokens: int) -> int:
        """The slot's budget, `total` (RequestError past `max_new_tokens`)."""
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

    def __post_init__(self) -> None:
        """What any engine refuses; each scheduler's `check` adds its own."""
        if self.num_samples < 1:
            raise RequestError(f"num_samples must be >= 1, got {self.num_samples}")
        if not self.prompt:
            raise RequestError("empty prompt: a request needs at least one prompt token")
        if self.max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.turns is not None and self.interrupt is not None:
            raise RequestError("a multi-turn request cannot use budget forcing (interrupt)")

    def slot_request(self, sample_index: int) -> SlotRequest:
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
    """The params version that computed the prompt's K/V (a shared prefill may predate an
    update; a recomputed sequence's is the recompute's); None = unknown."""
    episode: Any = None
    """A multi-turn sample's episode record (`TurnHook.episode`); None for one turn."""

    @property
    def interrupted(self) -> bool:  # by budget forcing
        return self.episode is None and self.sampled is not None and not all(self.sampled)

    @property
    def policy_version(self) -> int:
        """The completion's version: the oldest among its tokens (ALGORITHMS.md)."""
        return min(self.policy_versions)


Finished = list[tuple[GroupRequest, list[Completion]]]
"""Completed groups of a scheduler step: each request with its completions, in sample order."""


@dataclasses.dataclass(frozen=True)
class CompletedGroup:
    """All `num_samples` completions of one submitted prompt."""

    request_id: Hashable
    meta: Any
    completions: list[Completion]
    """Ordered by sample index; `prompt_index` is the submission order."""
    prompt_tokens: list[int]


class Rollout(Protocol):
    """What a sampler offers (`RolloutStream`): group requests in, completed groups out, weights
    swapped in flight; driven by its thread (`start`) or stepped (`step`)."""

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
    ) -> concurrent.futures.Future | None: ...  # options: `RolloutStream.submit`

    def get(self, timeout: float | None = None) -> CompletedGroup: ...
    def wait(self, futures: Sequence[concurrent.futures.Future]) -> list[CompletedGroup]: ...
    def update_weights(self, params: Any, version: int) -> dict[str, float] | None: ...
    def kv_metrics(self) -> dict[str, float]: ...
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


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A setting a backend cannot honour."""

    key: str
    """The dotted config key (`rollout.exact`)."""
    is_set: Callable[[Any], bool]
    """Whether a `Config` sets it to a value the backend cannot honour."""
    why: str
    """What the backend lacks, and what to set instead."""


@dataclasses.dataclass(frozen=True)
class Backend:
    """One `rollout.backend`."""

    name: str
    honours: dict[str, str]
    """Engine keys it honours → what each becomes in the backend."""
    refuses: tuple[Refusal, ...] = ()
    package: str | None = None
    """A package it needs on the machine that runs it (`config.checks.check_runtime`)."""
    install: str = ""  # how to install `package`
    build: str | None = None
    """"module:function" building the scheduler `build_rollout`'s stream drives, as
    `fn(cfg.rollout, model, mesh, *, max_len, version)`; None = our engine's `Scheduler`."""
    plan: str | None = None
    """"module:function" planning its actor memory for `--dry-run` as `fn(cfg, arch, actor_axes)
    -> (kv plan, actor bytes per device)`; None = our engine's plan."""


def resolve(ref: str) -> Callable[..., Any]:
    """The function a "module:function" reference names (imported now)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


_OUR_KEYS = (
    "max_slots", "kv_layout", "page_size", "kv_pages", "kv_cache_gib", "prefill_chunk",
    "decode_chunk", "stop_strings", "weight_dtype", "exact", "interrupt", "on_push",
    "compile_ahead",
)  # fmt: skip

JETSTREAM = Backend(
    name="jetstream", honours={f"rollout.{k}": "our engine (docs/engine.md)" for k in _OUR_KEYS}
)

VLLM = Backend(
    name="vllm",
    honours={
        "rollout.max_slots": "max_num_seqs (samples in vLLM at once)",
        "(prompt + rollout.max_new_tokens)": "max_model_len",
        "rollout.kv_cache_gib / kv_pages / (neither: max_slots full rows)": "kv_cache_memory_bytes",
        "rollout.prefill_chunk": "max_num_batched_tokens (whole prompts: at least max_len)",
        "rollout.decode_chunk": "engine steps between the stream's boundaries (pushes, admission)",
        "model.compute_dtype": "dtype",
        "rollout.stop_strings": "stop_token_ids (one token each, as for our engine)",
        "request seeds": "SamplingParams.seed (per sample)",
        "rollout.temperature / top_p / top_k": "SamplingParams",
        "rollout.on_push": "keep: KV kept; recompute: running requests preempted and recomputed",
        "rollout.kv_layout": "ignored: vLLM's cache is always paged (its budget as above)",
        "rollout.page_size": "ignored: vLLM picks its block size (128 tokens on a CPU)",
        "rollout.compile_ahead": "ignored: vLLM compiles its own programs",
    },
    refuses=(
        Refusal(
            "rollout.exact",
            lambda c: c.rollout.exact,
            "it replays completions through our engine's decode step; vLLM computes another "
            "function: use rollout.backend: jetstream or rollout.exact: false",
        ),
        Refusal(
            "rollout.interrupt.thinking_budget",
            lambda c: c.rollout.interrupt.thinking_budget > 0,
            "budget forcing inserts tokens inside our engine's slots: use rollout.backend: "
            "jetstream or set rollout.interrupt.thinking_budget: 0",
        ),
        Refusal(
            "rollout.weight_dtype",
            lambda c: c.rollout.weight_dtype is not None,
            "quantized decode weights are our engine's: use rollout.backend: jetstream or "
            "leave rollout.weight_dtype unset",
        ),
        Refusal(
            "model.lora.rank",
            lambda c: c.model.lora.rank > 0,
            "pushing LoRA adapters into vLLM is not implemented (it loads adapters from disk "
            "per request): use rollout.backend: jetstream or set model.lora.rank: 0",
        ),
        Refusal(
            "env.name",
            lambda c: c.env.name is not None,
            "multi-turn episodes continue inside our engine's slots: use rollout.backend: "
            "jetstream",
        ),
    ),
    package="vllm",
    install="its CPU build in its own venv: bash scripts/setup_env.sh --vllm (docs/vllm.md); "
    "on a GPU machine pip install 'rlvr_jax[vllm]'",
    build="rlvr_jax.rollout.backends.vllm:build_scheduler",
    plan="rlvr_jax.plan:vllm_kv_plan",
)

BACKENDS = {b.name: b for b in (JETSTREAM, VLLM)}  # `rollout.backend` → its capabilities


def backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"rollout.backend: {name!r} is not one of {sorted(BACKENDS)}")
    return BACKENDS[name]


def refused(cfg: Any) -> str | None:
    """The error naming the first setting of `cfg` (a `Config`) its backend cannot honour;
    None when it honours them all."""
    b = backend(cfg.rollout.backend)
    for r in b.refuses:
        if r.is_set(cfg):
            return f"{r.key} is not supported by rollout.backend: {b.name} ({r.why})"
    return None
