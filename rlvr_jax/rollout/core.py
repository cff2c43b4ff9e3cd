"""The engine's device half: a fixed-shape decode state over `max_slots` slots and four
jitted pure functions over it (prepare params, prefill, insert, generate).

- `prefill` runs one prompt (all but its last token) padded to a length bucket, so the
  number of compiles is bounded by the number of buckets; it computes no LM head.
- `insert` copies one prefix into any number of slots (group prefix sharing: G samples of
  a prompt are prefilled once) and sets each slot's request (seed, sample index, budget,
  sampling parameters, stop ids).
- `generate` runs up to `n_steps` decode steps in a `lax.while_loop` with the state
  donated, sampling in-step; it stops early once `exit_after` slots have finished in it
  (the host refills them). Every slot decodes every step; finished slots are masked out.

The first generated token is sampled by the first decode step, which feeds the prompt's
last token; prefill and decode therefore share one sampler, keyed by (seed, sample index,
position of the sampled token).

The functions are module-level and take the static `EngineSpec`, so engines with equal
specs share compiled code. `rlvr_jax.rollout.engine.EngineCore` is the host-side wrapper.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from rlvr_jax import sharding
from rlvr_jax.models import ArchConfig
from rlvr_jax.rollout import kernel
from rlvr_jax.rollout.sampling import SamplerMode, sample_tokens

CACHE_AXES = ("cache_batch", "cache_kv_heads", "cache_sequence", "head_dim")
"""Logical axes of one layer's K or V cache [B, K, S, H]."""
SLOT_AXES = ("cache_batch",)
"""Logical axes of a per-slot vector [B]."""


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """Everything static about an engine (hashable: the jitted functions' static arg)."""

    config: ArchConfig
    """The policy's architecture."""
    max_slots: int
    """B: decode slots."""
    max_len: int
    """S: positions per slot (prompt + generated tokens)."""
    compute_dtype: str = "float32"
    """Dtype of the decode weights and activations (the LM head and softmax stay fp32)."""
    cache_dtype: str = "float32"
    """Dtype of the KV cache."""
    max_stop_ids: int = 8
    """E: stop token ids per request."""
    mesh: Mesh | None = None
    """The actor mesh (None: one device)."""
    rules: sharding.Rules | None = None
    """Logical-axis rules on `mesh` (ACTOR_RULES when None)."""

    def __post_init__(self) -> None:
        if self.max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {self.max_slots}")
        if self.max_len < 2:
            raise ValueError(
                f"max_len must be >= 2 (a prompt token and a new one), got {self.max_len}"
            )
        if self.max_stop_ids < 1:
            raise ValueError(f"max_stop_ids must be >= 1, got {self.max_stop_ids}")

    @property
    def prefill_buckets(self) -> tuple[int, ...]:
        """Padded prefix lengths: powers of two from 16, capped by (and ending at) S."""
        buckets, b = [], 16
        while b < self.max_len:
            buckets.append(b)
            b *= 2
        return (*buckets, self.max_len)

    def bucket(self, length: int) -> int:
        """The smallest bucket holding `length` cached tokens."""
        return next(b for b in self.prefill_buckets if b >= length)


@flax.struct.dataclass
class DecodeState:
    """All slots' device state. A slot is live while `active_B`."""

    k: tuple[jax.Array, ...]  # per layer [B, K, S, H]
    v: tuple[jax.Array, ...]
    tokens_B: jax.Array  # int32: the next input token (last sampled, or the prompt's last)
    positions_B: jax.Array  # int32: position of tokens_B
    active_B: jax.Array  # bool
    generated_B: jax.Array  # int32: tokens generated for the slot's request
    max_new_B: jax.Array  # int32
    seed_B: jax.Array  # uint32
    sample_B: jax.Array  # int32
    temperature_B: jax.Array  # float32
    top_k_B: jax.Array  # int32
    top_p_B: jax.Array  # float32
    stop_ids_BxE: jax.Array  # int32, -1 padded


@flax.struct.dataclass
class Prefix:
    """A prefilled prompt: K/V of its first `length` tokens, and its last token."""

    k: tuple[jax.Array, ...]  # per layer [1, K, T, H]
    v: tuple[jax.Array, ...]
    tokens_T: jax.Array  # int32: the cached tokens, right-padded
    length: jax.Array  # int32 []: cached tokens (prompt length - 1)
    last_token: jax.Array  # int32 []


@flax.struct.dataclass
class ChunkOutput:
    """What one `generate` call produced: column c holds decode step c of the chunk."""

    tokens_BxC: jax.Array
    logprobs_BxC: jax.Array
    valid_BxC: jax.Array  # a token was produced by slot b at step c
    active_B: jax.Array  # after the chunk
    generated_B: jax.Array
    steps: jax.Array  # int32 []: decode steps run


def _state_shardings(spec: EngineSpec) -> Any:
    """NamedSharding tree of a `DecodeState` on the actor mesh (None without a mesh)."""
    if spec.mesh is None:
        return None
    rules = spec.rules if spec.rules is not None else sharding.ACTOR_RULES
    cfg = spec.config
    cache_shape = (spec.max_slots, cfg.n_kv_heads, spec.max_len, cfg.head_dim)

    def named(names: tuple, shape: tuple) -> NamedSharding:
        return NamedSharding(spec.mesh, sharding.logical_to_spec(names, rules, spec.mesh, shape))

    cache = named(CACHE_AXES, cache_shape)
    slot = named(SLOT_AXES, (spec.max_slots,))
    stop = named((*SLOT_AXES, None), (spec.max_slots, spec.max_stop_ids))
    layers = (cache,) * cfg.n_layers
    return DecodeState(layers, layers, *(slot,) * 10, stop)


def _constrain(tree: Any, shardings: Any) -> Any:
    return tree if shardings is None else jax.lax.with_sharding_constraint(tree, shardings)


def _replicated(spec: EngineSpec) -> NamedSharding | None:
    if spec.mesh is None:
        return None
    return NamedSharding(spec.mesh, jax.sharding.PartitionSpec())


@functools.partial(jax.jit, static_argnames=("spec",))
def prepare(params: Any, *, spec: EngineSpec) -> kernel.DecodeParams:
    """`params` (models layout, already on the engine's devices) in decode layout."""
    dp = kernel.prepare_params(params, spec.config, spec.compute_dtype)
    return _constrain(dp, _replicated(spec))


@functools.partial(jax.jit, static_argnames=("spec",))
def init_state(*, spec: EngineSpec) -> DecodeState:
    """An all-empty decode state, placed on the actor mesh."""
    cfg, b = spec.config, spec.max_slots
    cache = [
        jnp.zeros((b, cfg.n_kv_heads, spec.max_len, cfg.head_dim), spec.cache_dtype)
        for _ in range(cfg.n_layers)
    ]
    zeros_i = jnp.zeros((b,), jnp.int32)
    state = DecodeState(
        k=tuple(cache),
        v=tuple(jnp.zeros_like(c) for c in cache),
        tokens_B=zeros_i,
        positions_B=zeros_i,
        active_B=jnp.zeros((b,), jnp.bool_),
        generated_B=zeros_i,
        max_new_B=zeros_i,
        seed_B=jnp.zeros((b,), jnp.uint32),
        sample_B=zeros_i,
        temperature_B=jnp.ones((b,), jnp.float32),
        top_k_B=zeros_i,
        top_p_B=jnp.ones((b,), jnp.float32),
        stop_ids_BxE=jnp.full((b, spec.max_stop_ids), -1, jnp.int32),
    )
    return _constrain(state, _state_shardings(spec))


@functools.partial(jax.jit, static_argnames=("spec",))
def prefill(
    dp: kernel.DecodeParams,
    tokens_T: jax.Array,
    length: jax.Array,
    last_token: jax.Array,
    *,
    spec: EngineSpec,
) -> Prefix:
    """K/V of `tokens_T[:length]` (one prompt minus its last token, bucket-padded)."""
    ks, vs = kernel.prefill_kv(dp, spec.config, tokens_T[None, :], length[None])
    cache_dtype = jnp.dtype(spec.cache_dtype)
    return Prefix(
        k=tuple(k.astype(cache_dtype) for k in ks),
        v=tuple(v.astype(cache_dtype) for v in vs),
        tokens_T=tokens_T,
        length=length,
        last_token=last_token,
    )


@flax.struct.dataclass
class SlotSettings:
    """Per-slot request settings of one insert, padded to [B] (slot index B = unused)."""

    slots_B: jax.Array
    seed_B: jax.Array
    sample_B: jax.Array
    max_new_B: jax.Array
    temperature_B: jax.Array
    top_k_B: jax.Array
    top_p_B: jax.Array
    stop_ids_BxE: jax.Array


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def insert(
    state: DecodeState,
    prefix: Prefix,
    settings: SlotSettings,
    count: jax.Array,
    *,
    spec: EngineSpec,
) -> DecodeState:
    """`state` (donated) with `prefix` copied into slots `settings.slots_B[:count]`, each
    starting its request: position = prefix length, next input = the prompt's last token."""

    def copy_prefix(i, kv):
        k, v = kv
        start = (settings.slots_B[i], 0, 0, 0)
        k = tuple(jax.lax.dynamic_update_slice(c, p, start) for c, p in zip(k, prefix.k))
        v = tuple(jax.lax.dynamic_update_slice(c, p, start) for c, p in zip(v, prefix.v))
        return k, v

    k, v = jax.lax.fori_loop(0, count, copy_prefix, (state.k, state.v))
    slots_B = settings.slots_B

    def put(x_B: jax.Array, value: Any) -> jax.Array:
        return x_B.at[slots_B].set(value, mode="drop")

    state = state.replace(
        k=k,
        v=v,
        tokens_B=put(state.tokens_B, prefix.last_token),
        positions_B=put(state.positions_B, prefix.length),
        active_B=put(state.active_B, True),
        generated_B=put(state.generated_B, 0),
        max_new_B=put(state.max_new_B, settings.max_new_B),
        seed_B=put(state.seed_B, settings.seed_B),
        sample_B=put(state.sample_B, settings.sample_B),
        temperature_B=put(state.temperature_B, settings.temperature_B),
        top_k_B=put(state.top_k_B, settings.top_k_B),
        top_p_B=put(state.top_p_B, settings.top_p_B),
        stop_ids_BxE=state.stop_ids_BxE.at[slots_B].set(settings.stop_ids_BxE, mode="drop"),
    )
    return _constrain(state, _state_shardings(spec))


def _decode_one(
    dp: kernel.DecodeParams, state: DecodeState, spec: EngineSpec, mode: SamplerMode
) -> tuple[DecodeState, jax.Array, jax.Array, jax.Array, jax.Array]:
    """One decode step of every slot: (state, tokens_B, logprobs_B, produced_B, done_B)."""
    logits_BxV, k, v = kernel.decode_logits(
        dp, spec.config, state.tokens_B, state.positions_B, state.k, state.v
    )
    next_pos_B = state.positions_B + 1
    tokens_B, logprobs_B = sample_tokens(
        logits_BxV,
        temperature_B=state.temperature_B,
        top_k_B=state.top_k_B,
        top_p_B=state.top_p_B,
        seed_B=state.seed_B,
        sample_B=state.sample_B,
        position_B=next_pos_B,
        mode=mode,
    )
    produced_B = state.active_B
    generated_B = state.generated_B + produced_B.astype(jnp.int32)
    is_stop_B = jnp.any(tokens_B[:, None] == state.stop_ids_BxE, axis=-1)
    # A token sampled at position S - 1 could not be fed back: the slot is full.
    full_B = next_pos_B >= spec.max_len - 1
    done_B = produced_B & (is_stop_B | (generated_B >= state.max_new_B) | full_B)
    state = state.replace(
        k=k,
        v=v,
        tokens_B=jnp.where(produced_B, tokens_B, state.tokens_B),
        positions_B=jnp.where(produced_B, next_pos_B, state.positions_B),
        active_B=state.active_B & ~done_B,
        generated_B=generated_B,
    )
    return state, tokens_B, logprobs_B, produced_B, done_B


@functools.partial(jax.jit, static_argnames=("spec", "n_steps", "mode"), donate_argnames=("state",))
def generate(
    dp: kernel.DecodeParams,
    state: DecodeState,
    exit_after: jax.Array,
    *,
    spec: EngineSpec,
    n_steps: int,
    mode: SamplerMode,
) -> tuple[DecodeState, ChunkOutput]:
    """Up to `n_steps` decode steps of every live slot (`state` donated); stops early when
    no slot is live or `exit_after` slots have finished during this call."""
    b = spec.max_slots
    out = ChunkOutput(
        tokens_BxC=jnp.zeros((b, n_steps), jnp.int32),
        logprobs_BxC=jnp.zeros((b, n_steps), jnp.float32),
        valid_BxC=jnp.zeros((b, n_steps), jnp.bool_),
        active_B=state.active_B,
        generated_B=state.generated_B,
        steps=jnp.zeros((), jnp.int32),
    )

    def cond(carry):
        state, out, finished = carry
        return (out.steps < n_steps) & jnp.any(state.active_B) & (finished < exit_after)

    def body(carry):
        state, out, finished = carry
        state, tokens_B, logprobs_B, produced_B, done_B = _decode_one(dp, state, spec, mode)
        col = out.steps
        out = out.replace(
            tokens_BxC=out.tokens_BxC.at[:, col].set(tokens_B),
            logprobs_BxC=out.logprobs_BxC.at[:, col].set(logprobs_B),
            valid_BxC=out.valid_BxC.at[:, col].set(produced_B),
            steps=col + 1,
        )
        return state, out, finished + jnp.sum(done_B, dtype=jnp.int32)

    state, out, _ = jax.lax.while_loop(cond, body, (state, out, jnp.zeros((), jnp.int32)))
    out = out.replace(active_B=state.active_B, generated_B=state.generated_B)
    # the host reads the chunk's output: replicated, so that every process of a multi-process
    # run can (it is B x C tokens)
    return _constrain(state, _state_shardings(spec)), _constrain(out, _replicated(spec))
