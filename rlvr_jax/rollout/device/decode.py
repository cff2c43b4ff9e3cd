"""The engine's device half: a fixed-shape decode state over `max_slots` slots and jitted
pure functions over it (prepare params, prefill, insert, generate). The paged layout's own
functions (chunked prefill into pages, slot activation, page copies) are in
`rlvr_jax.rollout.device.paged`; `generate` serves both layouts.

- `prepare` re-lays the policy's params for decoding, tensor-parallel on the actor mesh
  (weights split by heads / mlp / vocab as `ACTOR_RULES` says; see `decode_param_shardings`).
- `prefill` (contiguous) runs one prompt (all but its last token) padded to a length
  bucket, so the number of compiles is bounded by the number of buckets; no LM head.
- `insert` (contiguous) copies one prefix into any number of slots (group prefix sharing:
  G samples of a prompt are prefilled once) and sets each slot's request (seed, sample
  index, budget, sampling parameters, stop ids).
- `generate` runs up to `n_steps` decode steps in a `lax.while_loop` with the state
  donated, sampling in-step; it stops early once `exit_after` slots have finished in it
  (the host refills them). Contiguous: every slot attends over its whole row. Paged: the
  host's `PagedWork` says which pages each slot reads.

The first generated token is sampled by the first decode step, which feeds the prompt's
last token; prefill and decode therefore share one sampler, keyed by (seed, sample index,
position of the sampled token).

The functions are module-level and take the static `EngineSpec`, so engines with equal
specs share compiled code. `rlvr_jax.rollout.engine.EngineCore` is the host-side wrapper.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.models import lora, quant
from rlvr_jax.rollout.device import kernel
from rlvr_jax.rollout.device.paged import PagedWork
from rlvr_jax.rollout.device.sampling import SamplerMode, sample_tokens
from rlvr_jax.rollout.device.state import (
    CACHE_AXES,
    SLOT_AXES,
    ChunkOutput,
    DecodeState,
    EngineSpec,
    Prefix,
    SlotSettings,
    constrain,
    named,
    replicated,
    start_slots,
    state_shardings,
)
from rlvr_jax.rollout.interrupt import REPLAY

__all__ = [
    "CACHE_AXES",
    "SLOT_AXES",
    "ChunkOutput",
    "DecodeState",
    "EngineSpec",
    "PagedWork",
    "Prefix",
    "SlotSettings",
]


@functools.partial(jax.jit, static_argnames=("spec",))
def prepare(params: Any, *, spec: EngineSpec) -> kernel.DecodeParams:
    """`params` (models layout, already on the engine's devices; LoRA adapters are merged and
    quantized kernels dequantized first, `lora.merge`) in decode layout, its weights stored in
    `spec.weight_dtype`, split tensor-parallel on the actor mesh (`decode_param_shardings`)."""
    tensor = 1 if spec.mesh is None else spec.mesh.shape["tensor"]
    dp = kernel.prepare_params(
        lora.merge(params),
        spec.config,
        spec.compute_dtype,
        kernel.fused_tp(spec.config, tensor),
        spec.weight_dtype or None,
    )
    return constrain(dp, decode_param_shardings(spec, dp))


def decode_param_axes(dp: kernel.DecodeParams) -> Any:
    """Logical axes of decode params (a tree like `dp`, name tuples at the leaves): the
    embedding and LM head split over vocab, the fused q|k|v and o over heads, gate|up and
    down over mlp (the fused ones only when grouped by shard, `kernel.fused_tp`), norms
    and the remaining biases replicated. The dry-run plan sizes the actor with these."""
    tp = dp.layers[0].tp
    heads, mlp = ("heads" if tp > 1 else None), ("mlp" if tp > 1 else None)

    def names(*axes: str | None) -> Any:
        def of(x: Any) -> Any:
            if x is None:
                return None
            return quant.axes_like(x, axes[: x.ndim] + (None,) * (x.ndim - len(axes)))

        return of

    rep = names()
    layers = tuple(
        kernel.LayerWeights(
            attn_norm=rep(w.attn_norm),
            mlp_norm=rep(w.mlp_norm),
            qkv=names(None, heads)(w.qkv),
            qkv_bias=names(heads)(w.qkv_bias),
            q_norm=rep(w.q_norm),
            k_norm=rep(w.k_norm),
            o=names("heads", None)(w.o),
            o_bias=rep(w.o_bias),
            gate_up=names(None, mlp)(w.gate_up),
            gate_up_bias=names(mlp)(w.gate_up_bias),
            down=names("mlp", None)(w.down),
            down_bias=rep(w.down_bias),
            tp=tp,
        )
        for w in dp.layers
    )
    return kernel.DecodeParams(
        embedding=names("vocab", "embed")(dp.embedding),
        layers=layers,
        final_norm=rep(dp.final_norm),
        head=names("embed", "vocab")(dp.head),
    )


def _is_names(x: Any) -> bool:
    return isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x)


def decode_param_shardings(spec: EngineSpec, dp: kernel.DecodeParams) -> Any:
    """NamedSharding tree of decode params on the actor mesh (None without one), from
    `decode_param_axes` and the engine's rules."""
    if spec.mesh is None:
        return None
    return jax.tree.map(
        lambda axes, x: named(spec, axes, x.shape),
        decode_param_axes(dp),
        dp,
        is_leaf=_is_names,
    )


@functools.partial(jax.jit, static_argnames=("spec",))
def init_state(*, spec: EngineSpec) -> DecodeState:
    """An all-empty decode state (contiguous cache rows or page pools), on the actor mesh."""
    cfg, b = spec.config, spec.max_slots
    empty = spec.kv_layout.empty_cache
    zeros_i = jnp.zeros((b,), jnp.int32)
    state = DecodeState(
        k=tuple(empty(spec) for _ in range(cfg.n_layers)),
        v=tuple(empty(spec) for _ in range(cfg.n_layers)),
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
        budget_B=jnp.full((b,), -1, jnp.int32),
        forced_BxF=jnp.full((b, spec.max_interrupt_ids), -1, jnp.int32),
    )
    return constrain(state, state_shardings(spec))


@functools.partial(jax.jit, static_argnames=("spec",))
def prefill(
    dp: kernel.DecodeParams,
    tokens_T: jax.Array,
    length: jax.Array,
    last_token: jax.Array,
    *,
    spec: EngineSpec,
) -> Prefix:
    """K/V of `tokens_T[:length]` (one prompt minus its last token, bucket-padded) as a
    dense prefix (the contiguous engine's, and the JetStream adapter's in both layouts)."""
    ks, vs = kernel.prefill_kv(dp, spec.config, tokens_T[None, :], length[None], spec.cache_dtype)
    return Prefix(
        k=ks,
        v=vs,
        tokens_T=tokens_T,
        length=length,
        last_token=last_token,
    )


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
        k = tuple(kernel.write_prefix(c, p, start) for c, p in zip(k, prefix.k))
        v = tuple(kernel.write_prefix(c, p, start) for c, p in zip(v, prefix.v))
        return k, v

    k, v = jax.lax.fori_loop(0, count, copy_prefix, (state.k, state.v))
    state = start_slots(state.replace(k=k, v=v), settings, prefix.last_token, prefix.length)
    return constrain(state, state_shardings(spec))


def _decode_one(
    dp: kernel.DecodeParams,
    state: DecodeState,
    work: PagedWork | None,
    spec: EngineSpec,
    mode: SamplerMode,
) -> tuple[DecodeState, jax.Array, jax.Array, jax.Array, jax.Array]:
    """One decode step of every slot: (state, tokens_B, logprobs_B, produced_B, done_B)."""
    logits_BxV, k, v = spec.kv_layout.decode_logits(dp, spec, state, work)
    if spec.mesh is not None:  # the sampler reads whole rows: gather the vocab shards
        logits_BxV = constrain(logits_BxV, named(spec, ("cache_batch", None), logits_BxV.shape))
    next_pos_B = state.positions_B + 1
    forced_token_B, forced_B, replay_B = _forced(state)
    tokens_B, logprobs_B = sample_tokens(
        logits_BxV,
        temperature_B=state.temperature_B,
        top_k_B=state.top_k_B,
        top_p_B=state.top_p_B,
        seed_B=state.seed_B,
        sample_B=state.sample_B,
        position_B=next_pos_B,
        mode=mode,
        forced_B=jnp.where(forced_B, forced_token_B, -1),
    )
    inserted_B = forced_B & ~replay_B  # budget forcing: log-prob 0, never a stop
    logprobs_B = jnp.where(inserted_B, 0.0, logprobs_B)
    produced_B = state.active_B
    generated_B = state.generated_B + produced_B.astype(jnp.int32)
    is_stop_B = jnp.any(tokens_B[:, None] == state.stop_ids_BxE, axis=-1) & ~inserted_B
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


def _forced(state: DecodeState) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(token_B, forced_B, replay_B): what a slot emits (and feeds next) instead of a draw.
    Budget forcing (`rlvr_jax.rollout.interrupt`): a slot whose generated count g is in
    [budget, budget + inserted) emits forced token g - budget (log-prob 0, never a stop). A
    replay (budget `REPLAY`) emits forced token g, scored and stopping as a drawn one."""
    f = state.forced_BxF.shape[1]
    replay_B = state.budget_B == REPLAY
    index_B = state.generated_B - jnp.where(replay_B, 0, state.budget_B)
    at_B = jnp.clip(index_B, 0, f - 1)[:, None]
    token_B = jnp.take_along_axis(state.forced_BxF, at_B, axis=1)[:, 0]
    on_B = (state.budget_B >= 0) | replay_B
    forced_B = on_B & (index_B >= 0) & (index_B < f) & (token_B >= 0)
    return token_B, forced_B, replay_B


_SLOT_FIELDS = (
    "tokens_B",
    "positions_B",
    "active_B",
    "generated_B",
    "max_new_B",
    "seed_B",
    "sample_B",
    "temperature_B",
    "top_k_B",
    "top_p_B",
    "stop_ids_BxE",
    "budget_B",
    "forced_BxF",
)


@functools.partial(
    jax.jit, static_argnames=("spec", "n_steps", "mode", "rows"), donate_argnames=("state",)
)
def generate(
    dp: kernel.DecodeParams,
    state: DecodeState,
    exit_after: jax.Array,
    work: PagedWork | None = None,
    *,
    spec: EngineSpec,
    n_steps: int,
    mode: SamplerMode,
    rows: int | None = None,
) -> tuple[DecodeState, ChunkOutput]:
    """Up to `n_steps` decode steps of every live slot (`state` donated); stops early when
    no slot is live or `exit_after` slots have finished during this call. Paged: `work`
    lists the pages each live slot reads (its pages must hold `n_steps` more tokens), and
    `rows` (one of `spec.row_buckets`) decodes only slots [0, rows): the scheduler keeps
    live slots packed there, so a half-empty engine pays half the matmuls. The output then
    has `rows` rows."""
    if rows is not None and rows < spec.max_slots:
        head = {f: getattr(state, f)[:rows] for f in _SLOT_FIELDS}
        sub, out = generate.__wrapped__(
            dp,
            state.replace(**head),
            exit_after,
            work.replace(table_BxM=work.table_BxM[:rows]),
            spec=spec,
            n_steps=n_steps,
            mode=mode,
        )
        merged = {f: getattr(state, f).at[:rows].set(getattr(sub, f)) for f in _SLOT_FIELDS}
        return constrain(sub.replace(**merged), state_shardings(spec)), constrain(
            out, replicated(spec)
        )
    b = state.tokens_B.shape[0]
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
        state, tokens_B, logprobs_B, produced_B, done_B = _decode_one(dp, state, work, spec, mode)
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
    if b < spec.max_slots:  # the rows of a bucketed call: merged by the caller
        return state, out
    # the host reads the chunk's output: replicated, so that every process of a multi-process
    # run can (it is B x C tokens)
    return constrain(state, state_shardings(spec)), constrain(out, replicated(spec))


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def move_slots(
    state: DecodeState, src_B: jax.Array, dst_B: jax.Array, *, spec: EngineSpec
) -> DecodeState:
    """`state` (donated) with slot `src_B[i]`'s request moved to slot `dst_B[i]` (B =
    unused) and the source slots idle: a paged slot's K/V stay in its pages, so a move is
    only its per-slot vectors (the host moves its block-table row)."""
    moved = {}
    for f in _SLOT_FIELDS:
        x = getattr(state, f)
        moved[f] = x.at[dst_B].set(jnp.take(x, src_B, axis=0, mode="clip"), mode="drop")
    moved["active_B"] = moved["active_B"].at[src_B].set(False, mode="drop")
    moved["active_B"] = (
        moved["active_B"].at[dst_B].set(jnp.take(state.active_B, src_B, mode="clip"), mode="drop")
    )
    return constrain(state.replace(**moved), state_shardings(spec))
