"""The engine's jitted functions over a fixed-shape decode state of `max_slots` slots, for both
KV layouts (what differs is a method of the layout): `prepare` (params in decode layout),
`generate` (up to `n_steps` decode steps in a `while_loop`, sampling in-step, stopping once
`exit_after` slots finish), `extend` (the one way K/V enter the cache outside decode: prompt
chunks, recomputes, appended turns), `copy_pages`, `activate` / `deactivate` / `move_slots`.

The first decode step feeds the prompt's last token and samples the first generated one: one
sampler, keyed by (seed, sample index, position). Functions take the static `EngineSpec`, so
engines with equal specs share compiled code.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.models import lora, quant
from rlvr_jax.rollout.device import kernel
from rlvr_jax.rollout.device.paged import PagedWork
from rlvr_jax.rollout.device.sampling import SamplerMode, sample_tokens
from rlvr_jax.rollout.device.state import (
    REPLAY,
    ChunkOutput,
    DecodeState,
    EngineSpec,
    SlotSettings,
    constrain,
    named,
    replicated,
    state_shardings,
    with_kv,
)


@functools.partial(jax.jit, static_argnames=("spec",))
def prepare(params: Any, *, spec: EngineSpec) -> kernel.DecodeParams:
    """`params` (models layout, on the engine's devices; LoRA merged and quantized kernels
    dequantized first) in decode layout, weights in `spec.weight_dtype`, tensor-parallel."""
    tensor = 1 if spec.mesh is None else spec.mesh.shape["tensor"]
    dp = kernel.prepare_params(
        lora.merge(params),
        spec.config,
        spec.compute_dtype,
        kernel.fused_tp(spec.config, tensor),
        spec.weight_dtype or None,
        spec.platform,
    )
    return constrain(dp, decode_param_shardings(spec, dp))


def decode_param_axes(dp: kernel.DecodeParams) -> Any:
    """Logical axes of decode params (a tree like `dp`, name tuples at the leaves; the dry-run
    plan sizes the actor with these): embedding and LM head over vocab, q|k|v and o over heads,
    gate|up and down over mlp (the fused ones only when grouped by shard), the rest replicated."""
    tp = dp.layers[0].tp
    heads, mlp = ("heads" if tp > 1 else None), ("mlp" if tp > 1 else None)
    split = {"qkv": (None, heads), "qkv_bias": (heads,), "o": ("heads", None)}
    split |= {"gate_up": (None, mlp), "gate_up_bias": (mlp,), "down": ("mlp", None)}

    def names(x: Any, *axes: str | None) -> Any:
        return None if x is None else quant.axes_like(x, (*axes, *(None,) * (x.ndim - len(axes))))

    fields = [f.name for f in dataclasses.fields(kernel.LayerWeights) if f.name != "tp"]
    layers = tuple(
        w.replace(**{f: names(getattr(w, f), *split.get(f, ())) for f in fields}) for w in dp.layers
    )
    return dp.replace(
        embedding=names(dp.embedding, "vocab", "embed"),
        layers=layers,
        final_norm=names(dp.final_norm),
        head=names(
            dp.head,
            *(("vocab", "embed") if kernel.head_vocab_major(dp.head) else ("embed", "vocab")),
        ),
    )


def is_axes(x: Any) -> bool:
    """Whether `x` is a leaf of `decode_param_axes` (a tuple of axis names)."""
    return isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x)


def decode_param_shardings(spec: EngineSpec, dp: kernel.DecodeParams) -> Any:
    """NamedSharding tree of `decode_param_axes` on the actor mesh (None without one)."""
    if spec.mesh is None:
        return None
    return jax.tree.map(
        lambda axes, x: named(spec, axes, x.shape), decode_param_axes(dp), dp, is_leaf=is_axes
    )


@functools.partial(jax.jit, static_argnames=("spec",))
def init_state(*, spec: EngineSpec) -> DecodeState:
    """An empty decode state (every slot idle, `SlotSettings.empty`), on the actor mesh."""
    b, layers = spec.max_slots, range(spec.config.n_layers)
    empty = SlotSettings.empty(spec, jnp.full)
    state = DecodeState(
        k=tuple(spec.kv_layout.empty_cache(spec) for _ in layers),
        v=tuple(spec.kv_layout.empty_cache(spec) for _ in layers),
        tokens_B=jnp.zeros((b,), jnp.int32),
        positions_B=jnp.zeros((b,), jnp.int32),
        active_B=jnp.zeros((b,), jnp.bool_),
        **{
            f.name: getattr(empty, f.name) for f in dataclasses.fields(empty) if f.name != "slots_B"
        },
    )
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
    with jax.named_scope("sample"):
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
    """(token_B, forced_B, replay_B): what a slot emits instead of a draw. Budget forcing: a slot
    whose generated count g is in [budget, budget + inserted) emits forced token g - budget
    (log-prob 0, never a stop). A replay (budget `REPLAY`) emits forced token g, scored and
    stopping as a drawn one."""
    f = state.forced_BxF.shape[1]
    replay_B = state.budget_B == REPLAY
    index_B = state.generated_B - jnp.where(replay_B, 0, state.budget_B)
    at_B = jnp.clip(index_B, 0, f - 1)[:, None]
    token_B = jnp.take_along_axis(state.forced_BxF, at_B, axis=1)[:, 0]
    on_B = (state.budget_B >= 0) | replay_B
    forced_B = on_B & (index_B >= 0) & (index_B < f) & (token_B >= 0)
    return token_B, forced_B, replay_B


_SLOT_FIELDS = tuple(f.name for f in dataclasses.fields(DecodeState) if f.name not in ("k", "v"))


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
    """Up to `n_steps` decode steps of every live slot (`state` donated), stopping once no slot is
    live or `exit_after` slots have finished. Paged: `work` lists the pages each slot reads (room
    for `n_steps` more tokens); `rows` (a `spec.row_buckets` entry) decodes slots [0, rows) only
    (the host packs live slots there), the output having `rows` rows."""
    if rows is not None and rows < spec.max_slots:
        head = state.replace(**{f: getattr(state, f)[:rows] for f in _SLOT_FIELDS})
        work = work.replace(table_BxM=work.table_BxM[:rows])
        sub, out = generate.__wrapped__(
            dp, head, exit_after, work, spec=spec, n_steps=n_steps, mode=mode
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
    # replicated: every process of a multi-process run reads the (B x C) output
    return constrain(state, state_shardings(spec)), constrain(out, replicated(spec))


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def move_slots(
    state: DecodeState, src_B: jax.Array, dst_B: jax.Array, *, spec: EngineSpec
) -> DecodeState:
    """`state` (donated) with slot `src_B[i]`'s per-slot vectors moved to slot `dst_B[i]` (B =
    unused), the sources idle (K/V stay in their pages)."""
    moved = {}
    for f in _SLOT_FIELDS:
        x = getattr(state, f)
        moved[f] = x.at[dst_B].set(jnp.take(x, src_B, axis=0, mode="clip"), mode="drop")
    moved["active_B"] = moved["active_B"].at[src_B].set(False, mode="drop")
    moved["active_B"] = (
        moved["active_B"].at[dst_B].set(jnp.take(state.active_B, src_B, mode="clip"), mode="drop")
    )
    return constrain(state.replace(**moved), state_shardings(spec))


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def activate(
    state: DecodeState,
    settings: SlotSettings,
    token_B: jax.Array,
    position_B: jax.Array,
    *,
    spec: EngineSpec,
) -> DecodeState:
    """`state` (donated) with slots `settings.slots_B` (B = unused) starting, or resuming, their
    requests: next input `token_B` at `position_B` (every earlier position in the slot's pages)."""
    values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    values |= {"tokens_B": token_B, "positions_B": position_B, "active_B": True}
    slots_B = values.pop("slots_B")
    state = state.replace(
        **{f: getattr(state, f).at[slots_B].set(x, mode="drop") for f, x in values.items()}
    )
    return constrain(state, state_shardings(spec))


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def deactivate(state: DecodeState, slots_B: jax.Array, *, spec: EngineSpec) -> DecodeState:
    """`state` (donated) with slots `slots_B` (B = unused) stopped (preempted)."""
    state = state.replace(active_B=state.active_B.at[slots_B].set(False, mode="drop"))
    return constrain(state, state_shardings(spec))


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def extend(
    dp: kernel.DecodeParams,
    state: DecodeState,
    tokens_T: jax.Array,
    start: jax.Array,
    length: jax.Array,
    table_M: jax.Array,
    shard: jax.Array,
    *,
    spec: EngineSpec,
) -> DecodeState:
    """`state` (donated) with the K/V of `tokens_T[:length]` at positions `start ..` of the
    sequence whose pages (local ids of `shard`) are `table_M`, which hold [0, start)."""
    t = tokens_T.shape[0]
    positions_T = start + jnp.arange(t, dtype=jnp.int32)
    valid_T = jnp.arange(t) < length
    attention = spec.kv_layout.extend_attention(
        spec, positions_T, valid_T, table_M, shard, start + length
    )
    kv = tuple(zip(state.k, state.v))
    _, kv = kernel.run_layers(dp, spec.config, tokens_T[None], positions_T[None], kv, attention)
    return with_kv(state, kv, spec)


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def copy_pages(
    state: DecodeState, src_SxN: jax.Array, dst_SxN: jax.Array, *, spec: EngineSpec
) -> DecodeState:
    """`state` (donated) with page `src[s, i]` copied to `dst[s, i]` in shard s, every layer
    (a shared prompt's last, partial page; padding pairs are 0 -> 0)."""
    return with_kv(state, spec.kv_layout.copy_pages(spec, state.k, state.v, src_SxN, dst_SxN), spec)
