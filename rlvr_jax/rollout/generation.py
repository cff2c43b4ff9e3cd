"""`generate`: completions for a list of prompts, from a model or an engine; `rescore`: the
log-probs of given completions, replayed through an engine's decode step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlvr_jax.models import Model
from rlvr_jax.rollout.api import Completion, GroupRequest, Interrupt, Replay, RequestError
from rlvr_jax.rollout.device.kernel import DecodeParams
from rlvr_jax.rollout.device.sampling import DEFAULT_SAMPLING, SamplingParams
from rlvr_jax.rollout.engine import EngineCore, core_of
from rlvr_jax.rollout.host.scheduler import BATCHING, Scheduler

DEFAULT_SLOTS = 32  # slots of the engine `generate` builds for a `Model`


def request_seed(seed: int, prompt_index: int) -> int:
    """The per-prompt seed `generate` uses: a 32-bit mix of (seed, prompt_index)."""
    if seed < 0:
        raise RequestError(f"seed must be >= 0, got {seed}")
    h = (seed * 0x9E3779B97F4A7C15 + prompt_index * 0xBF58476D1CE4E5B9 + 1) % 2**64
    h ^= h >> 31
    h = (h * 0x94D049BB133111EB) % 2**64
    return (h ^ (h >> 29)) % 2**32


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _as_core(model_or_engine: object, *, slots: int, len_needed: int) -> EngineCore:
    if isinstance(model_or_engine, Model):  # rounded: repeated calls reuse the compiled engine
        return EngineCore(model_or_engine, max_slots=slots, max_len=_round_up(len_needed, 64))
    try:
        return core_of(model_or_engine)
    except TypeError:
        raise TypeError(
            "generate needs an rlvr_jax.models.Model, an EngineCore, a JetStream engine from "
            f"make_engine, or a vLLM backend; got {type(model_or_engine).__name__}"
        ) from None


def _check_prompts(prompts: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    if isinstance(prompts, str) or not isinstance(prompts, Sequence | np.ndarray):
        raise TypeError("prompts must be a list of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str) or not isinstance(p, Sequence | np.ndarray):
            raise TypeError(f"prompts[{i}] must be a list of token ids, got {type(p).__name__}")
        if not all(isinstance(t, int | np.integer) for t in p):
            raise TypeError(f"prompts[{i}] must hold integer token ids")
        ids = tuple(int(t) for t in p)
        if not ids:
            raise RequestError(f"prompts[{i}] is empty")
        out.append(ids)
    return out


def generate(
    model_or_engine: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    num_samples: int = 1,
    stop_token_ids: Sequence[int] = (),
    seed: int = 0,
    batching: str = "continuous",
    max_slots: int | None = None,
    interrupt: Interrupt | None = None,
) -> list[Completion]:
    """`num_samples` completions of each prompt, ordered by (prompt_index, sample_index), from a
    `Model` (an engine of `max_slots` slots is built, default min(32, samples rounded up to 8)),
    an `EngineCore`, `make_engine`'s engine or a `VllmEngine`. Generation stops at any of
    `stop_token_ids` (EOS not implied) or after `max_new_tokens`; prompt i samples with
    `request_seed(seed, i)` whatever `batching` and `max_slots`. `interrupt`: our engine only."""
    if batching not in BATCHING:
        raise ValueError(f"batching must be one of {BATCHING}, got {batching!r}")
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    ids = _check_prompts(prompts)
    if num_samples < 1:  # before sizing an engine by it
        raise RequestError(f"num_samples must be >= 1, got {num_samples}")
    if hasattr(model_or_engine, "scheduler"):  # vLLM's engine drives its own scheduler
        scheduler = model_or_engine.scheduler()
    else:
        longest = max((len(p) for p in ids), default=1)
        slots = max_slots or min(DEFAULT_SLOTS, _round_up(len(ids) * num_samples, 8))
        core = _as_core(model_or_engine, slots=slots, len_needed=longest + max_new_tokens)
        scheduler = Scheduler(core, batching=batching, num_slots=max_slots)
    for i, prompt in enumerate(ids):
        scheduler.add(
            GroupRequest(
                key=i,
                prompt_index=i,
                prompt=prompt,
                num_samples=num_samples,
                seed=request_seed(seed, i),
                max_new_tokens=max_new_tokens,
                sampling=sampling,
                stop_token_ids=tuple(int(t) for t in stop_token_ids),
                interrupt=interrupt,
            )
        )
    completions = [c for _, group in scheduler.run() for c in group]
    return sorted(completions, key=lambda c: (c.prompt_index, c.sample_index))


def rescore(
    engine: EngineCore,
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    params: DecodeParams | None = None,
    sampling: SamplingParams = DEFAULT_SAMPLING,
) -> list[list[float]]:
    """The per-token log-probs of each (prompt, completion) as `engine` computes them sampling: the
    completion replayed through its decode step (`Replay`) with `params` (default the engine's)
    and `sampling`'s temperature. With `engine.spec.exact` they equal, bit for bit, what sampling
    reported on an engine of the same spec and params. Empty completions give []."""
    scheduler = Scheduler(engine, params=params)
    for i, (prompt, tokens) in enumerate(sequences):
        if len(tokens):
            scheduler.add(
                GroupRequest(
                    key=i,
                    prompt_index=i,
                    prompt=tuple(int(t) for t in prompt),
                    num_samples=1,
                    seed=0,
                    max_new_tokens=len(tokens),
                    sampling=sampling,
                    interrupt=Replay(tuple(int(t) for t in tokens)),
                )
            )
    scored = {req.key: group[0].logprobs for req, group in scheduler.run()}
    return [scored.get(i, []) for i in range(len(sequences))]
