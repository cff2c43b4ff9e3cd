"""Appending tokens to a running sequence of the contiguous layout (`extend_row`): its
row's K/V continue with the new tokens, each attending to the row's earlier positions and
to the tokens before it — the contiguous twin of `paged_core.extend`, used to append an
environment's response between the turns of a multi-turn episode (`rollout.turns`).

On a mesh the slots split over the slot axes: the new tokens' q/k/v are computed on every
shard (batch-1 work, like a paged prefill), only the shard owning the row writes it, and
its attention output is the one kept (a psum of the owner's).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as Pspec

from rlvr_jax.models.config import SLIDING
from rlvr_jax.models.layers import attend
from rlvr_jax.rollout.device import kernel
from rlvr_jax.rollout.device.paged import _shard_index, _shard_map
from rlvr_jax.rollout.device.state import DecodeState, EngineSpec, with_kv


def _extend_local(
    q_TxNxH, k_TxKxH, v_TxKxH, k_BxKxSxH, v_BxKxSxH, write_T, slot, mask_TxS, *, spec
):
    """One shard's part: writes the new K/V into its row of `slot` (when it owns it) and
    attends the new queries to that row."""
    per_shard = k_BxKxSxH.shape[0]
    mine = slot // per_shard == _shard_index(spec)
    local = slot % per_shard
    write_T = jnp.where(mine, write_T, spec.max_len)  # out of range: dropped

    def row(cache_BxKxSxH, new_TxKxH):  # the row of `slot` with the new tokens written
        new_KxTxH = jnp.einsum("TKH->KTH", new_TxKxH).astype(cache_BxKxSxH.dtype)
        return cache_BxKxSxH[local].at[:, write_T].set(new_KxTxH, mode="drop")

    k_row, v_row = row(k_BxKxSxH, k_TxKxH), row(v_BxKxSxH, v_TxKxH)
    keys, values = (jnp.einsum("KSH->SKH", x.astype(jnp.float32))[None] for x in (k_row, v_row))
    # the model's attention (`models.layers.attend`) of the new queries to the row, in fp32
    out_TxNxH = attend(q_TxNxH[None].astype(jnp.float32), keys, values, mask_TxS[None])[0]
    if spec.mesh is not None and spec.slot_spec is not None:
        out_TxNxH = jax.lax.psum(jnp.where(mine, out_TxNxH, 0.0), spec.slot_spec)
    k_BxKxSxH = k_BxKxSxH.at[local].set(jnp.where(mine, k_row, k_BxKxSxH[local]))
    v_BxKxSxH = v_BxKxSxH.at[local].set(jnp.where(mine, v_row, v_BxKxSxH[local]))
    return out_TxNxH, k_BxKxSxH, v_BxKxSxH


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def extend_row(
    dp: kernel.DecodeParams,
    state: DecodeState,
    tokens_T: jax.Array,
    start: jax.Array,
    length: jax.Array,
    slot: jax.Array,
    *,
    spec: EngineSpec,
) -> DecodeState:
    """`state` (donated) with the K/V of `tokens_T[:length]` at positions `start ..` of the
    contiguous row of `slot`, each token attending to the row's positions before it (the
    last W on sliding layers). Positions [0, start) must already be in the row."""
    cfg = spec.config
    t, s = tokens_T.shape[0], spec.max_len
    positions_T = start + jnp.arange(t, dtype=jnp.int32)
    write_T = jnp.where(jnp.arange(t) < length, positions_T, s)
    key_S = jnp.arange(s, dtype=jnp.int32)
    causal_TxS = key_S[None, :] <= positions_T[:, None]
    window = cfg.sliding_window if cfg.has_sliding else None
    masks = (causal_TxS, causal_TxS)
    if window is not None:
        masks = (causal_TxS, causal_TxS & (key_S[None, :] > positions_T[:, None] - window))
    rows = None if spec.mesh is None else spec.kv_layout.kv_sharding(spec)[0].spec
    cache, rep = Pspec(*rows) if rows else Pspec(), Pspec()
    heads = Pspec(None, rows[1] if rows else None, None)

    def attention(i, kv, q_1xTxNxH, k_1xTxKxH, v_1xTxKxH):
        mask = masks[1] if cfg.layer_types[i] == SLIDING else masks[0]
        fn = functools.partial(_extend_local, spec=spec)
        whole = [kernel.join_segments(segments) for segments in kv]  # a copy: a rare call
        out_TxNxH, k_c, v_c = _shard_map(
            spec, fn, (heads, heads, heads, cache, cache, rep, rep, rep), (heads, cache, cache)
        )(q_1xTxNxH[0], k_1xTxKxH[0], v_1xTxKxH[0], *whole, write_T, slot, mask)
        k_c, v_c = kernel.split_segments(k_c, kv[0]), kernel.split_segments(v_c, kv[1])
        return out_TxNxH[None].astype(q_1xTxNxH.dtype), (k_c, v_c)

    _, kv = kernel.run_layers(
        dp, cfg, tokens_T[None], positions_T[None], tuple(zip(state.k, state.v)), attention
    )
    return with_kv(state, kv, spec)
