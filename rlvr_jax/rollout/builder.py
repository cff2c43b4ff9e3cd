"""The one way to sample from a policy: `build_rollout(cfg.rollout, model, mesh, tokenizer)`.

Training, the in-loop evaluation, `rlvr-eval`, `rlvr-filter`, `rlvr-prefs` and `rlvr-serve`
all sample through the `Rollout` it returns, so they share the engine settings of the config's
`rollout:` section (KV layout and budget, slots, decode chunk, stop strings, budget forcing,
backend) and the actor mesh they run on. `sample_groups` runs a list of prompts through a
rollout the way every evaluation does: prompt i seeded with `request_seed(seed, i)`, so the
samples do not depend on what else the rollout is generating or on how prompts are chunked.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from rlvr_jax.rollout import capabilities
from rlvr_jax.rollout.generation import request_seed
from rlvr_jax.rollout.interrupt import from_config as interrupt_from_config
from rlvr_jax.rollout.sampling import SamplingParams
from rlvr_jax.rollout.stream import CompletedGroup, RolloutStream

if TYPE_CHECKING:  # the schema is not imported at run time (rollout does not depend on config)
    from rlvr_jax.config.schema import RolloutConfig
    from rlvr_jax.timeline import Timeline


class Rollout(Protocol):
    """What a sampler offers (`RolloutStream` over our engine or vLLM): group requests in
    (one prompt × G samples), completed groups out, weights swapped in flight."""

    def submit(
        self,
        request_id: Hashable,
        prompt_tokens: Sequence[int],
        num_samples: int,
        seed: int,
        meta: Any = None,
        **options: Any,
    ) -> None:
        """Queues a request; its group comes back from `get`."""

    def submit_future(
        self,
        request_id: Hashable,
        prompt_tokens: Sequence[int],
        num_samples: int,
        seed: int,
        meta: Any = None,
        **options: Any,
    ) -> concurrent.futures.Future:
        """Queues a request; its group resolves the returned future (`version=v` pins it)."""

    def get(self, timeout: float | None = None) -> CompletedGroup:
        """The next completed group of `submit`."""

    def wait(self, futures: Sequence[concurrent.futures.Future]) -> list[CompletedGroup]:
        """The groups of `submit_future`'s futures (stepping an unstarted rollout)."""

    def update_weights(self, params: Any, version: int) -> dict[str, float] | None:
        """New policy params (models layout, any mesh), swapped in at the next boundary;
        returns the push's `push/bytes` and `push/seconds` where the backend measures them."""

    def kv_metrics(self) -> dict[str, float]:
        """KV-cache metrics since the previous call ({} where the backend has none)."""

    def close(self) -> None:
        """Stops generating; unfinished futures fail."""


def engine_kwargs(cfg: RolloutConfig) -> dict[str, Any]:
    """`EngineCore` keyword arguments of a `rollout:` config section (KV layout and budget,
    page size, prefill chunk, decode chunk, decode weight dtype, exact; with `exact`, room to
    replay a whole completion, `rescore`)."""
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
    """The sampling settings of a `rollout:` section."""
    return SamplingParams(cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)


def build_rollout(
    cfg: RolloutConfig,
    model: Any,
    mesh: Any,
    tokenizer: Any,
    *,
    max_len: int | None = None,
    params: Any = None,
    version: int = 0,
    max_pending_groups: int = 64,
    max_ready_groups: int = 64,
    timeline: Timeline | None = None,
    compile_ahead: bool = True,
    turns: Any = None,
) -> RolloutStream:
    """The `rollout.backend` engine for `model` on `mesh` (the actor mesh; None = one
    device) behind a `RolloutStream` (not started: `start()` it, or `step()` it in lockstep
    on every process of a multi-process run).

    Args:
      cfg: the config's `rollout:` section — the only reader of its engine keys.
      model: the policy (`models.Model`, any mesh: its params are moved to `mesh`).
      tokenizer: the policy's tokenizer (stop strings and the budget-forcing text).
      max_len: positions per sequence (prompt + `cfg.max_new_tokens`); default the model's
        `max_position_embeddings`.
      params: start from these params instead of `model.params` (e.g. restored ones).
      version: policy version of those params.
      max_pending_groups / max_ready_groups: the stream's backpressure bounds.
      timeline: records the driver's decode chunks as "rollout" spans.
      compile_ahead: compile every engine program now (before the trainer takes
        `dispatch.LOCK`).
      turns: `dispatch.DeviceTurns` of a learner sharing the actors' devices (decode chunks
        then never run beside a train step).

    Raises:
      ValueError: a stop string that is not one token, or budget forcing that does not fit
        `max_new_tokens` (naming the keys).
    """
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
    backend = capabilities.backend(cfg.backend)
    if backend.build is not None:  # another engine than ours (`rollout.capabilities`)
        return backend.builder()(cfg, model, mesh, max_len=max_len, **common)
    engine = build_engine(cfg, model, mesh, tokenizer, max_len=max_len)
    if compile_ahead:
        engine.compile_ahead()
    return RolloutStream(engine, **common)


def build_engine(
    cfg: RolloutConfig, model: Any, mesh: Any, tokenizer: Any, *, max_len: int | None = None
) -> Any:
    """The `EngineCore` `build_rollout` samples with (arguments as there): also the engine
    the learner re-scores with under `rollout.exact` (`rescore`), which must be the same."""
    from rlvr_jax.rollout.engine import EngineCore

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
    rollout: Any,
    prompts: Sequence[Sequence[int]],
    *,
    num_samples: int,
    seed: int,
    sampling: SamplingParams | None = None,
    version: int | None = None,
    first_index: int = 0,
    key: Hashable = "sample",
    on_group: Callable[[int, CompletedGroup], None] | None = None,
    turns: Sequence[Any] | None = None,
) -> list[CompletedGroup]:
    """`num_samples` completions of each of `prompts` through `rollout`, in prompt order.
    Prompt i (counted from `first_index`) samples with `request_seed(seed, i)`, whatever else
    the rollout generates; `version` pins every request to that policy version
    (`RolloutStream.submit_future`); `on_group(i, group)` is called as each completes (on the
    driver thread when the rollout runs one); `turns[j]` makes prompt j multi-turn (its
    `rollout.turns.TurnHook`, e.g. an `rlvr_jax.envs.EnvGroup`)."""
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
    rollout: Any, request_id: Hashable, prompt: Sequence[int], n: int, seed: int, **options: Any
) -> concurrent.futures.Future:
    """`submit_future`, stepping an unstarted rollout while its queue is full."""
    while True:
        try:
            timeout = None if rollout.threaded else 0.0
            return rollout.submit_future(request_id, prompt, n, seed, timeout=timeout, **options)
        except TimeoutError:  # only an unstarted rollout: room is made by stepping it
            rollout.pump()
