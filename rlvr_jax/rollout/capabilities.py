"""What each actor backend (`rollout.backend`) honours: the one table the config checks, the
builder and the docs read.

Every backend declares the settings it cannot honour (`Backend.refuses`: a key, when it is
"set", and why); `refused(cfg)` names the first one a config sets, and `config.checks` refuses
it at load ("<key> ... is not supported by rollout.backend: <name> (...)"). The engine keys a
backend does honour are listed in `Backend.honours` (key → what it becomes there), and its
builder (`Backend.build`, "module:function") reads them all.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A setting a backend cannot honour."""

    key: str
    """The config key, dotted (`rollout.exact`)."""
    is_set: Callable[[Any], bool]
    """Whether a `Config` sets it (to a value the backend cannot honour)."""
    why: str
    """What the backend lacks, and what to set instead."""


@dataclasses.dataclass(frozen=True)
class Backend:
    """One `rollout.backend`."""

    name: str
    honours: dict[str, str]
    """Engine keys it honours → what each becomes in the backend."""
    refuses: tuple[Refusal, ...] = ()
    on_push: tuple[str, ...] = ("keep",)
    """`rollout.on_push` values it offers."""
    package: str | None = None
    """A package it needs on the machine that runs it (`config.checks.check_runtime`)."""
    install: str = ""
    """How to install `package`."""
    build: str | None = None
    """"module:function" building its `RolloutStream` (`rollout.builder.build_rollout`'s
    arguments); None = our engine, built by `build_rollout` itself."""
    plan: str | None = None
    """"module:function" planning its actor memory for `--dry-run` as `fn(cfg, arch, actor_axes)
    -> (kv plan, actor bytes per device)`; None = our engine's plan."""

    def builder(self) -> Callable[..., Any]:
        return _resolve(self.build)

    def planner(self) -> Callable[..., Any] | None:
        return _resolve(self.plan) if self.plan else None


def _resolve(ref: str) -> Callable[..., Any]:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


_OUR_KEYS = (
    "max_slots", "kv_layout", "page_size", "kv_pages", "kv_cache_gib", "prefill_chunk",
    "decode_chunk", "stop_strings", "weight_dtype", "exact", "interrupt", "on_push",
)  # fmt: skip

JETSTREAM = Backend(
    name="jetstream",
    honours={f"rollout.{k}": "our engine (docs/engine.md)" for k in _OUR_KEYS},
    # `recompute` is our engine's once it re-prefills in-flight slots at a push
    on_push=("keep",),
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
    on_push=("keep", "recompute"),
    package="vllm",
    install="its CPU build in its own venv: bash scripts/setup_env.sh --vllm (docs/vllm.md); "
    "on a GPU machine pip install 'rlvr_jax[vllm]'",
    build="rlvr_jax.rollout.backends.vllm:build_rollout",
    plan="rlvr_jax.training.plan:vllm_kv_plan",
)

BACKENDS = {b.name: b for b in (JETSTREAM, VLLM)}
"""`rollout.backend` → its capabilities."""


def backend(name: str) -> Backend:
    """The capabilities of `rollout.backend: name`."""
    if name not in BACKENDS:
        raise ValueError(f"rollout.backend: {name!r} is not one of {sorted(BACKENDS)}")
    return BACKENDS[name]


def refused(cfg: Any) -> str | None:
    """The first setting of `cfg` (a `Config`) its backend cannot honour, as an error message
    naming the key and the backend; None when it honours them all."""
    b = backend(cfg.rollout.backend)
    for r in b.refuses:
        if r.is_set(cfg):
            return f"{r.key} is not supported by rollout.backend: {b.name} ({r.why})"
    on_push = getattr(cfg.rollout, "on_push", "keep")
    if on_push not in b.on_push:
        return (
            f"rollout.on_push: {on_push} is not supported by rollout.backend: {b.name} "
            f"(it offers {', '.join(b.on_push)})"
        )
    return None
