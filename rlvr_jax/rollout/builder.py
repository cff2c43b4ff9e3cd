"""The one way to sample from a policy: `build_rollout(cfg.rollout, model, mesh, tokenizer)`, the
only reader of the config's `rollout:` keys (training, evaluation, `rlvr-filter`, `rlvr-prefs`,
`rlvr-serve`); `sample_groups` runs prompts through a rollout (prompt i seeded
`request_seed(seed, i)`)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from rlvr_jax.rollout.api import CompletedGroup, Interrupt, Rollout, TurnHook, backend, resolve
from rlvr_jax.rollout.device.sampling import SamplingParams
from rlvr_jax.rollout.engine import EngineCore
from rlvr_jax.rollout.generation import request_seed
from rlvr_jax.rollout.stream import RolloutStream

if TYPE_CHECKING:  # the schema is not imported at run time (rollout does not depend on config)
    from jax.sharding import Mesh

    from rlvr_jax.config.schema import InterruptConfig, RolloutConfig
    from rlvr_jax.dispatch import DeviceTurns
    from rlvr_jax.models import Model
    from rlvr_jax.timeline import Timeline


def engine_kwargs(cfg: RolloutConfig) -> dict[str, Any]:
    """`EngineCore` keyword arguments of a `rollout:` section (`exact`: room to replay one)."""
    out = {
        "chunk": cfg.decode_chunk,
        "kv_layout": cfg.kv_layout,
        "page_size": cfg.page_size,
        "kv_pages": cfg.kv_pages,
        "kv_cache_gib": cfg.kv_cache_gib,
        "prefill_chunk": cfg.prefill_chunk,
        "weight_dtype": cfg.weight_dtype,
    }
    if cfg.exact:
        out.update(exact=True, max_interrupt_ids=max(16, cfg.max_new_tokens))
    return out


def sampling_params(cfg: RolloutConfig) -> SamplingParams:
    return SamplingParams(cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)


def interrupt_from_config(
    section: InterruptConfig, tokenizer: Any, *, max_new_tokens: int
) -> Interrupt | None:
    """`rollout.interrupt` as an `Interrupt` (None when off); ValueError naming the keys when it
    does not fit `max_new_tokens`."""
    if section.thinking_budget == 0:
        return None
    tokens = tuple(int(t) for t in tokenizer.encode(section.text, add_special_tokens=False))
    if not tokens:
        raise ValueError(f"rollout.interrupt.text {section.text!r} tokenizes to no tokens")
    interrupt = Interrupt(section.thinking_budget, tokens, section.answer_budget)
    if interrupt.total > max_new_tokens:
        raise ValueError(
            f"rollout.interrupt: thinking_budget={section.thinking_budget} + "
            f"{len(tokens)} tokens of text + answer_budget={section.answer_budget} = "
            f"{interrupt.total} exceeds rollout.max_new_tokens={max_new_tokens}"
        )
    return interrupt


def build_rollout(
    cfg: RolloutConfig,
    model: Model,
    mesh: Mesh | None,
    tokenizer: Any,
    *,
    max_len: int | None = None,
    params: dict | None = None,
    version: int = 0,
    max_pending_groups: int = 64,
    max_ready_groups: int = 64,
    timeline: Timeline | None = None,
    compile_ahead: bool | None = None,
    turns: DeviceTurns | None = None,
) -> Rollout:
    """The `rollout.backend` engine for `model` (its params moved to the actor `mesh`; None = one
    device) behind a `Rollout`, not started (`start()` it, or `step()` it in lockstep on every
    process). `max_len`: default the model's `max_position_embeddings`; `params` / `version`:
    start from these (e.g. restored); `compile_ahead`: compile every engine program now (None:
    `cfg.compile_ahead`); the rest as `RolloutStream`'s. Raises ValueError naming the keys: a
    stop string that is not one token, budget forcing that does not fit `max_new_tokens`."""
    from rlvr_jax.data.formatting import stop_token_ids

    if params is not None:
        model = dataclasses.replace(model, params=params)
    forcing = interrupt_from_config(cfg.interrupt, tokenizer, max_new_tokens=cfg.max_new_tokens)
    common = dict(
        max_new_tokens=cfg.max_new_tokens,
        sampling=sampling_params(cfg),
        stop_token_ids=stop_token_ids(model.config, tokenizer, cfg.stop_strings),
        max_pending_groups=max_pending_groups,
        max_ready_groups=max_ready_groups,
        version=version,
        timeline=timeline,
        interrupt=forcing,
        turns=turns,
    )
    other = backend(cfg.backend).build
    if other is not None:  # another engine than ours (`api.BACKENDS`)
        scheduler = resolve(other)(cfg, model, mesh, max_len=max_len, version=version)
        return RolloutStream(None, scheduler=scheduler, **common)
    engine = build_engine(cfg, model, mesh, tokenizer, max_len=max_len)
    if cfg.compile_ahead if compile_ahead is None else compile_ahead:
        engine.compile_ahead()
    return RolloutStream(engine, on_push=cfg.on_push, **common)


def build_engine(
    cfg: RolloutConfig,
    model: Model,
    mesh: Mesh | None,
    tokenizer: Any,
    *,
    max_len: int | None = None,
) -> EngineCore:
    """The `EngineCore` `build_rollout` samples with, and the learner re-scores with under
    `rollout.exact` (`rescore`): the same."""
    kwargs = engine_kwargs(cfg)
    forcing = interrupt_from_config(cfg.interrupt, tokenizer, max_new_tokens=cfg.max_new_tokens)
    if forcing is not None:  # room for the inserted tokens (the default fits most strings)
        kwargs["max_interrupt_ids"] = max(kwargs.get("max_interrupt_ids", 16), len(forcing.tokens))
    return EngineCore(
        model,
        max_slots=cfg.max_slots,
        max_len=max_len or model.config.max_position_embeddings,
        mesh=mesh,
        **kwargs,
    )


def sample_groups(
    rollout: Rollout,
    prompts: Sequence[Sequence[int]],
    *,
    num_samples: int,
    seed: int,
    sampling: SamplingParams | None = None,
    version: int | None = None,
    first_index: int = 0,
    key: Hashable = "sample",
    on_group: Callable[[int, CompletedGroup], None] | None = None,
    turns: Sequence[TurnHook] | None = None,
) -> list[CompletedGroup]:
    """`num_samples` completions of each of `prompts`, in prompt order: prompt i (from
    `first_index`) seeded `request_seed(seed, i)`; `version` pins every request; `on_group(i,
    group)` is called as each completes; `turns[j]` makes prompt j multi-turn."""
    futures = []
    for j, prompt in enumerate(prompts):
        i = first_index + j
        future = _submit(
            rollout,
            (key, i),
            prompt,
            num_samples,
            request_seed(seed, i),
            sampling=sampling,
            version=version,
            **({} if turns is None else {"turns": turns[j]}),
        )
        if on_group is not None:
            future.add_done_callback(
                lambda f, i=i: f.exception() is None and on_group(i, f.result())
            )
        futures.append(future)
    return rollout.wait(futures)


def _submit(
    rollout: Rollout, request_id: Hashable, prompt: Sequence[int], n: int, seed: int, **options: Any
) -> concurrent.futures.Future:
    """`submit(future=True)`, stepping an unstarted rollout while its queue is full."""
    while True:
        try:
            timeout = None if rollout.threaded else 0.0
            return rollout.submit(
                request_id, prompt, n, seed, future=True, timeout=timeout, **options
            )
        except TimeoutError:  # only an unstarted rollout: room is made by stepping it
            rollout.pump()
