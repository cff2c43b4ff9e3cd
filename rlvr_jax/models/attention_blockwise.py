"""Blockwise (flash) attention in plain XLA: online softmax over key blocks, custom backward.
Scores, probabilities and their product with the values are fp32 whatever the compute dtype
(the decode engine's arithmetic), the output in q's dtype.

Memory is O(T · block) per layer: no [B, T, T] mask and no [B, N, T, T] scores ever exist.
The forward keeps, for each block of `block` queries, a running max, sum and output over the
key blocks it can see (FlashAttention-2's recurrence); it saves only the output and the
per-query log-sum-exp (fp32) for the backward. The backward (a `jax.custom_vjp`) walks the key
blocks, recomputes each tile's probabilities from the saved log-sum-exp, accumulates dK and dV
of the block and adds each tile's dQ into one [T] buffer.

The mask is computed per tile from segment ids and token indices: query t sees key s iff
s <= t, segment_ids[t] == segment_ids[s], and t - s < window (the W most recent keys, itself
included). Tiles that causality or the window rule out entirely are skipped (the loops over
key / query blocks have data-dependent bounds). This is `rlvr_jax.models.layers.segment_masks`
+ `attend` computed without the masks; every query sees at least itself.

The tiles are head-major: q, k, v (and dO) are laid out once as [n, B, K, G·b, H] /
[n, B, K, b, H], so each tile's matmuls are batched over (B, K) with the G query heads of a kv
head stacked as rows, without per-tile transposes (1.6x faster than [B, b, K, G, H] on CPU).

Letters: B batch, T time, N query heads, K kv heads, G = N/K, H head dim; n blocks of b
tokens (T padded up to n·b; padding queries form their own segment and are cut off).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rlvr_jax.models.layers import NEG_INF, same_segment

DEFAULT_BLOCK = 512  # queries (and keys) per tile: 512 × 512 fp32 scores per head are 1 MiB
_PAD_SEGMENT = -1  # segment id of the tokens that round T up to whole blocks


def blockwise_attention(
    q_BxTxNxH: jax.Array,
    k_BxTxKxH: jax.Array,
    v_BxTxKxH: jax.Array,
    segment_ids_BxT: jax.Array,
    window: jax.Array | int | None = None,
    *,
    block: int = DEFAULT_BLOCK,
    branches: int = 1,
) -> jax.Array:
    """Causal grouped-query self-attention within segments, `block` queries × keys per tile.

    `window` (a static int or a traced int32 scalar, e.g. chosen per layer inside a scan):
    sliding-window attention over the `window` most recent keys; None = unlimited. Softmax
    in fp32; the output has q's dtype. Differentiable in q, k, v (O(T · block) memory).
    `branches` > 1: shared-prompt rows (`layers.same_segment`).
    """
    b_, t = q_BxTxNxH.shape[:2]
    if k_BxTxKxH.shape[1] != t or segment_ids_BxT.shape != (b_, t):
        raise ValueError(
            f"self-attention shapes: q {q_BxTxNxH.shape}, k {k_BxTxKxH.shape}, "
            f"segment_ids {segment_ids_BxT.shape}"
        )
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if isinstance(window, int) and window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    size = t if t <= block else block
    padded = -(-t // size) * size
    window_ = jnp.asarray(padded if window is None else window, jnp.int32)
    q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, seg = pad_time(
        q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, segment_ids_BxT, padded
    )
    if padded == size:  # one tile: plain autodiff holds the same O(T · block) scores
        return _one_tile(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, seg, window_, branches)
    out = _flash(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, seg, window_, size, branches)
    return out[:, :t]


def _one_tile(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, seg_BxT, window, branches):
    """T <= block: one tile, its mask computed in place, differentiated by autodiff."""
    b, t, n, h = q_BxTxNxH.shape
    kv = k_BxTxKxH.shape[2]
    zero = jnp.zeros((), jnp.int32)
    mask = _tile_mask(zero, zero, t, seg_BxT, seg_BxT, window, branches)
    s = _scores(q_BxTxNxH.reshape(b, t, kv, n // kv, h), k_BxTxKxH, h**-0.5)
    p = jax.nn.softmax(jnp.where(mask, s, NEG_INF), axis=-1)
    out = jnp.einsum("BKGqk,BkKH->BqKGH", p, v_BxTxKxH.astype(jnp.float32))
    return out.reshape(b, t, n, h).astype(q_BxTxNxH.dtype)


def pad_time(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, segment_ids_BxT, padded: int):
    """q, k, v and int32 segment ids with T zero-padded up to `padded`; the added tokens get
    segment id -1 (they attend only to each other and are cut off by the caller)."""
    seg_BxT = segment_ids_BxT.astype(jnp.int32)
    extra = padded - seg_BxT.shape[1]
    if extra == 0:
        return q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, seg_BxT
    pad = ((0, 0), (0, extra), (0, 0), (0, 0))
    q_BxTxNxH, k_BxTxKxH, v_BxTxKxH = (jnp.pad(x, pad) for x in (q_BxTxNxH, k_BxTxKxH, v_BxTxKxH))
    seg_BxT = jnp.pad(seg_BxT, ((0, 0), (0, extra)), constant_values=_PAD_SEGMENT)
    return q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, seg_BxT


def _q_blocks(x_BxTxNxH: jax.Array, kv: int, size: int) -> jax.Array:
    """[B, T, N, H] -> [n, B, K, G·size, H]: query blocks, head-major (each tile's matmuls are
    plain batched matmuls over B, K: no per-tile transposes)."""
    b, t, n_heads, h = x_BxTxNxH.shape
    g = n_heads // kv
    x = x_BxTxNxH.reshape(b, t // size, size, kv, g, h).transpose(1, 0, 3, 4, 2, 5)
    return x.reshape(t // size, b, kv, g * size, h)


def _kv_blocks(x_BxTxKxH: jax.Array, size: int) -> jax.Array:
    """[B, T, K, H] -> [n, B, K, size, H]."""
    b, t, kv, h = x_BxTxKxH.shape
    return x_BxTxKxH.reshape(b, t // size, size, kv, h).transpose(1, 0, 3, 2, 4)


def _q_unblock(x: jax.Array, g: int) -> jax.Array:
    """`_q_blocks`' inverse: [n, B, K, G·size, H] -> [B, n·size, K·G, H]."""
    n, b, kv, gs, h = x.shape
    size = gs // g
    x = x.reshape(n, b, kv, g, size, h).transpose(1, 0, 4, 2, 3, 5)
    return x.reshape(b, n * size, kv * g, h)


def _kv_unblock(x: jax.Array) -> jax.Array:
    """`_kv_blocks`' inverse: [n, B, K, size, H] -> [B, n·size, K, H]."""
    n, b, kv, size, h = x.shape
    return x.transpose(1, 0, 3, 2, 4).reshape(b, n * size, kv, h)


def _seg_blocks(seg_BxT: jax.Array, size: int) -> jax.Array:
    """[B, T] -> [n, B, size]."""
    b, t = seg_BxT.shape
    return seg_BxT.reshape(b, t // size, size).swapaxes(0, 1)


def _tile_mask(
    i: jax.Array,
    j: jax.Array,
    size: int,
    seg_q_Bxq: jax.Array,
    seg_k_Bxk: jax.Array,
    window: jax.Array,
    branches: int,
) -> jax.Array:
    """[B, 1, 1, q, k] visibility of key block j from query block i."""
    t_q = i * size + jnp.arange(size)
    s_k = j * size + jnp.arange(size)
    delta_qxk = t_q[:, None] - s_k[None, :]
    allowed_qxk = (delta_qxk >= 0) & (delta_qxk < window)
    same_Bxqxk = same_segment(seg_q_Bxq[:, :, None], seg_k_Bxk[:, None, :], branches)
    return (allowed_qxk[None] & same_Bxqxk)[:, None, None]


def _head_mask(i, j, size, seg_q_Bxq, seg_k_Bxk, window, branches, g) -> jax.Array:
    """`_tile_mask` as [B, 1, G·q, k]: the rows of a head-major tile's scores."""
    mask = _tile_mask(i, j, size, seg_q_Bxq, seg_k_Bxk, window, branches)
    b = mask.shape[0]
    return jnp.broadcast_to(mask, (b, 1, g, size, size)).reshape(b, 1, g * size, size)


def _dot(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _scores(q_BxqxKxGxH: jax.Array, k_BxkxKxH: jax.Array, scale: float) -> jax.Array:
    """`_one_tile`'s [B, K, G, q, k] scores (the flash tiles are head-major)."""
    return _dot("BqKGH,BkKH->BKGqk", q_BxqxKxGxH, k_BxkxKxH) * scale


def _key_range(i: jax.Array, size: int, window: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Key blocks [lo, hi) that query block i can see (causal + window)."""
    lo = jnp.maximum(0, (i * size - window + 1) // size)
    return lo, i + 1


def _query_range(j: jax.Array, size: int, window: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """Query blocks [lo, hi) that can see key block j (causal + window)."""
    last_query = (j + 1) * size - 1 + window - 1
    return j, jnp.minimum(n, last_query // size + 1)


def _forward(q, k, v, seg, window, size, branches):
    """The head-major output blocks [n, B, K, G·size, H] and log-sum-exp [n, B, K, G·size]."""
    b, t, n_heads, h = q.shape
    kv = k.shape[2]
    g = n_heads // kv
    n = t // size
    scale = h**-0.5
    q_n, k_n, v_n = _q_blocks(q, kv, size), _kv_blocks(k, size), _kv_blocks(v, size)
    seg_n = _seg_blocks(seg, size)

    def one_query_block(i):
        q_i, seg_i = q_n[i], seg_n[i]

        def body(j, carry):
            m, sum_, acc = carry
            s = _dot("BKQH,BKkH->BKQk", q_i, k_n[j]) * scale
            mask = _head_mask(i, j, size, seg_i, seg_n[j], window, branches, g)
            m_new = jnp.maximum(m, jnp.where(mask, s, NEG_INF).max(-1))
            p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
            alpha = jnp.exp(m - m_new)
            pv = _dot("BKQk,BKkH->BKQH", p, v_n[j].astype(jnp.float32))
            return m_new, alpha * sum_ + p.sum(-1), alpha[..., None] * acc + pv

        init = (
            jnp.full((b, kv, g * size), NEG_INF, jnp.float32),
            jnp.zeros((b, kv, g * size), jnp.float32),
            jnp.zeros((b, kv, g * size, h), jnp.float32),
        )
        lo, hi = _key_range(i, size, window)
        m, sum_, acc = jax.lax.fori_loop(lo, hi, body, init)
        return (acc / sum_[..., None]).astype(q.dtype), m + jnp.log(sum_)

    return jax.lax.map(one_query_block, jnp.arange(n))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _flash(q, k, v, seg, window, size, branches):
    out_n, _ = _forward(q, k, v, seg, window, size, branches)
    return _q_unblock(out_n, q.shape[2] // k.shape[2])


def _flash_fwd(q, k, v, seg, window, size, branches):
    out_n, lse_n = _forward(q, k, v, seg, window, size, branches)
    return _q_unblock(out_n, q.shape[2] // k.shape[2]), (q, k, v, seg, window, out_n, lse_n)


def _flash_bwd(size, branches, residuals, dout):
    q, k, v, seg, window, out_n, lse_n = residuals
    b, t, n_heads, h = q.shape
    kv = k.shape[2]
    g = n_heads // kv
    n = t // size
    scale = h**-0.5
    q_n, do_n = _q_blocks(q, kv, size), _q_blocks(dout, kv, size)
    # D = rowsum(dO ∘ O): the softmax backward's correction term, [n, B, K, G·q]
    d_n = jnp.sum(do_n.astype(jnp.float32) * out_n.astype(jnp.float32), axis=-1)
    k_n, v_n, seg_n = _kv_blocks(k, size), _kv_blocks(v, size), _seg_blocks(seg, size)
    cdt = q.dtype

    def one_key_block(dq_n, j):
        k_j, v_j, seg_j = k_n[j], v_n[j], seg_n[j]

        def body(i, carry):
            dq_n, dk, dv = carry
            q_i, do_i = q_n[i], do_n[i]
            s = _dot("BKQH,BKkH->BKQk", q_i, k_j) * scale
            mask = _head_mask(i, j, size, seg_n[i], seg_j, window, branches, g)
            p = jnp.where(mask, jnp.exp(s - lse_n[i][..., None]), 0.0)
            dv = dv + _dot("BKQk,BKQH->BKkH", p.astype(cdt), do_i)
            dp = _dot("BKQH,BKkH->BKQk", do_i, v_j)
            ds = (p * (dp - d_n[i][..., None])).astype(cdt)
            dk = dk + scale * _dot("BKQk,BKQH->BKkH", ds, q_i)
            dq_i = scale * _dot("BKQk,BKkH->BKQH", ds, k_j)
            return dq_n.at[i].add(dq_i), dk, dv

        zeros = jnp.zeros((b, kv, size, h), jnp.float32)
        lo, hi = _query_range(j, size, window, n)
        dq_n, dk, dv = jax.lax.fori_loop(lo, hi, body, (dq_n, zeros, zeros))
        return dq_n, (dk, dv)

    dq0 = jnp.zeros((n, b, kv, g * size, h), jnp.float32)
    dq_n, (dk_n, dv_n) = jax.lax.scan(one_key_block, dq0, jnp.arange(n))
    dq = _q_unblock(dq_n, g).astype(q.dtype)
    return dq, _kv_unblock(dk_n).astype(k.dtype), _kv_unblock(dv_n).astype(v.dtype), None, None


_flash.defvjp(_flash_fwd, _flash_bwd)
