"""Attention over the paged KV pool [K, P, Z, H] per layer (the layout of JAX's TPU kernel):
sequence b's token at position p is at page `table_BxM[b, p // Z]`, offset `p % Z`; page 0 is
the trash page (idle rows and padding write there; nothing reads it unmasked).

Decode (one query per slot): "xla" (everywhere) walks the host's work list — blocks of
`pages_per_block` pages, `blocks_per_iter` per iteration of a `fori_loop` with a dynamic trip
count, so a step costs what the live tokens cost with one compiled program — and combines the
blocks' partial softmaxes per slot (flash-decoding); sliding layers get their own, shorter list.
"pallas_tpu" / "pallas_gpu": JAX's Pallas kernels, for full-attention layers (`select_impl`).
Prefill chunks (`context_attention`): T new tokens against their sequence's pages, 512 tokens
per iteration with an online softmax. Scores, softmax and value sums are fp32 (`kernel.scores`;
V upcast after loading).

Letters: B slots, N query heads, K kv heads, G = N/K, H head dim, P pages, Z page size,
M pages per sequence (table width), R work blocks, C blocks per iteration, T tokens."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from rlvr_jax.rollout.device.kernel import NEG_INF, scores

IMPLS = ("auto", "xla", "pallas_tpu", "pallas_gpu")  # the engine's `attention` values


@dataclasses.dataclass(frozen=True)
class PageGeometry:
    """How a paged engine walks its pool (static)."""

    page_size: int
    """Z: tokens per page."""
    pages_per_block: int
    """Pages per decode work block (the unit of the host's work list)."""
    blocks_per_iter: int
    """Work blocks gathered per iteration of the decode loop."""
    context_block_pages: int
    """Pages per iteration of the prefill-chunk loop."""

    @property
    def block_tokens(self) -> int:
        return self.page_size * self.pages_per_block


GEOMETRY_TOKENS = (128, 4096, 512)
"""Default (decode block, decode iteration, prefill block) sizes in tokens: blocks big enough for
efficient matmuls, an iteration's gather small enough to stay in cache (bench model, fp32, 32
slots x 192, one AVX-512 core: a 45 ms step with iterations of 4096 as of 2048; 50 ms at 8192)."""


def make_geometry(
    page_size: int, max_pages: int, tokens: tuple[int, int, int] = GEOMETRY_TOKENS
) -> PageGeometry:
    """Geometry of ~`tokens` in whole pages, blocks capped by a sequence's `max_pages`."""
    block, iteration, context = tokens
    pb = max(1, min(block // page_size, max_pages))
    return PageGeometry(
        page_size=page_size,
        pages_per_block=pb,
        blocks_per_iter=max(1, iteration // (pb * page_size)),
        context_block_pages=max(1, min(context // page_size, max_pages)),
    )


def select_impl(requested: str, platform: str, *, page_size: int, head_dim: int) -> str:
    """Full-attention layers' decode attention. "auto": Pallas on TPU (page size a multiple of 8,
    head dim of 128) or GPU (both multiples of 16), else "xla"; an explicit request is honoured,
    or refused with the reason it cannot run."""
    if requested not in IMPLS:
        raise ValueError(f"attention must be one of {IMPLS}, got {requested!r}")
    fits = {
        "pallas_tpu": page_size % 8 == 0 and head_dim % 128 == 0,
        "pallas_gpu": page_size % 16 == 0 and head_dim % 16 == 0,
    }
    if requested == "auto":
        want = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu"}.get(platform)
        return want if want is not None and fits[want] else "xla"
    if requested in fits:
        need = "tpu" if requested == "pallas_tpu" else "gpu"
        if platform.replace("cuda", "gpu") != need:
            raise ValueError(f"attention={requested!r} needs a {need.upper()}, not {platform}")
        if not fits[requested]:
            raise ValueError(
                f"attention={requested!r} cannot run page_size={page_size}, head_dim={head_dim}"
            )
    return requested


def write_tokens(
    k_pages: jax.Array,
    v_pages: jax.Array,
    k_TxKxH: jax.Array,
    v_TxKxH: jax.Array,
    page_T: jax.Array,
    offset_T: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The pool with token t's K/V stored at (`page_T[t]`, `offset_T[t]`) (page 0: trash)."""
    k_KxTxH = jnp.einsum("TKH->KTH", k_TxKxH).astype(k_pages.dtype)
    v_KxTxH = jnp.einsum("TKH->KTH", v_TxKxH).astype(v_pages.dtype)
    k_pages = k_pages.at[:, page_T, offset_T].set(k_KxTxH, mode="promise_in_bounds")
    v_pages = v_pages.at[:, page_T, offset_T].set(v_KxTxH, mode="promise_in_bounds")
    return k_pages, v_pages


def _visible(kpos: jax.Array, qpos: jax.Array, window: int | None) -> jax.Array:
    """Key positions a query at `qpos` sees (broadcasting): causal, and the last W."""
    ok = kpos <= qpos
    return ok if window is None else ok & (kpos > qpos - window)


def decode_xla(
    q_BxNxH: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    positions_B: jax.Array,
    table_BxM: jax.Array,
    slot_R: jax.Array,
    block_R: jax.Array,
    n_blocks: jax.Array,
    *,
    geometry: PageGeometry,
    window: int | None,
) -> jax.Array:
    """Blockwise decode attention over the listed work blocks; [B, N, H] fp32. Entry r is block
    `block_R[r]` (pages `block·pb ..` of the row) of slot `slot_R[r]`, grouped by slot (padding:
    slot = B); the first `n_blocks` entries are computed (rounded up to a whole iteration)."""
    b, n, h = q_BxNxH.shape
    kh, _, z, _ = k_pages.shape
    g = n // kh
    pb, c = geometry.pages_per_block, geometry.blocks_per_iter
    t = pb * z
    r = slot_R.shape[0]
    slot_R = jnp.minimum(slot_R, b)  # padding (and rows past a bucketed call's b): dropped
    q_KxBxGxH = jnp.einsum("BKGH->KBGH", q_BxNxH.reshape(b, kh, g, h))
    page_iota_1xPb = jnp.arange(pb, dtype=jnp.int32)[None, :]
    token_iota_1xT = jnp.arange(t, dtype=jnp.int32)[None, :]

    def body(i, carry):
        m_RxKxG, l_RxKxG, o_RxKxGxH = carry
        start = i * c
        slot_C = jax.lax.dynamic_slice_in_dim(slot_R, start, c)
        block_C = jax.lax.dynamic_slice_in_dim(block_R, start, c)
        row_C = jnp.minimum(slot_C, b - 1)
        pages_CxPb = table_BxM[row_C[:, None], block_C[:, None] * pb + page_iota_1xPb]
        k_KxCxTxH = jnp.take(k_pages, pages_CxPb, axis=1, mode="clip").reshape(kh, c, t, h)
        v_KxCxTxH = jnp.take(v_pages, pages_CxPb, axis=1, mode="clip").reshape(kh, c, t, h)
        q_KxCxGxH = jnp.take(q_KxBxGxH, row_C, axis=1, mode="clip")
        # G-major scores [K, C, G, T]: the values' sum is then a plain [G, T] x [T, H] matmul
        # per (kv head, block) (XLA:CPU's YNNPACK kernel; T-major took a slower generic dot)
        s_KxCxGxT = scores("KCGH,KCTH->KCGT", q_KxCxGxH, k_KxCxTxH) * (h**-0.5)
        kpos_CxT = block_C[:, None] * t + token_iota_1xT
        qpos_Cx1 = jnp.take(positions_B, row_C, mode="clip")[:, None]
        ok_CxT = _visible(kpos_CxT, qpos_Cx1, window) & (slot_C < b)[:, None]
        ok_1xCx1xT = ok_CxT[None, :, None, :]
        s_KxCxGxT = jnp.where(ok_1xCx1xT, s_KxCxGxT, NEG_INF)
        m_KxCxG = jnp.max(s_KxCxGxT, axis=3)
        p_KxCxGxT = jnp.where(ok_1xCx1xT, jnp.exp(s_KxCxGxT - m_KxCxG[..., None]), 0.0)
        l_KxCxG = jnp.sum(p_KxCxGxT, axis=3)
        o_KxCxGxH = jnp.einsum("KCGT,KCTH->KCGH", p_KxCxGxT, v_KxCxTxH.astype(jnp.float32))
        put = functools.partial(jax.lax.dynamic_update_slice_in_dim, start_index=start, axis=0)
        return (
            put(m_RxKxG, jnp.einsum("KCG->CKG", m_KxCxG)),
            put(l_RxKxG, jnp.einsum("KCG->CKG", l_KxCxG)),
            put(o_RxKxGxH, jnp.einsum("KCGH->CKGH", o_KxCxGxH)),
        )

    init = (
        jnp.full((r, kh, g), NEG_INF, jnp.float32),
        jnp.zeros((r, kh, g), jnp.float32),
        jnp.zeros((r, kh, g, h), jnp.float32),
    )
    n_iter = (n_blocks + c - 1) // c
    m_RxKxG, l_RxKxG, o_RxKxGxH = jax.lax.fori_loop(0, n_iter, body, init)
    seg = dict(num_segments=b + 1, indices_are_sorted=True)
    m_BxKxG = jax.ops.segment_max(m_RxKxG, slot_R, **seg)
    scale_RxKxG = jnp.exp(m_RxKxG - jnp.take(m_BxKxG, slot_R, axis=0))
    l_BxKxG = jax.ops.segment_sum(l_RxKxG * scale_RxKxG, slot_R, **seg)
    o_BxKxGxH = jax.ops.segment_sum(o_RxKxGxH * scale_RxKxG[..., None], slot_R, **seg)
    l_BxKxG = jnp.where(l_BxKxG > 0, l_BxKxG, 1.0)  # slots with no work (idle rows)
    return (o_BxKxGxH / l_BxKxG[..., None])[:b].reshape(b, n, h)


def decode_pallas_tpu(
    q_BxNxH: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    positions_B: jax.Array,
    table_BxM: jax.Array,
    *,
    geometry: PageGeometry,
) -> jax.Array:
    """JAX's TPU paged-attention kernel (full attention over [0, position]); [B, N, H]."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    q_BxNxH = q_BxNxH.astype(jnp.float32) * q_BxNxH.shape[-1] ** -0.5
    lengths_B, pb = (positions_B + 1).astype(jnp.int32), geometry.pages_per_block
    out = paged_attention(
        q_BxNxH, k_pages, v_pages, lengths_B, table_BxM, pages_per_compute_block=pb
    )
    return out.astype(jnp.float32)


def gpu_blocks(max_pages: int, pages_per_block: int) -> tuple[int, int, int]:
    """(pages per compute block, padded table width, k splits) for the Triton kernel, which takes
    only power-of-two shapes: the largest power-of-two block within `pages_per_block`, the table
    padded to a power of two (entries past a sequence's length are never read), up to 16 splits."""
    pb = 1 << (max(1, pages_per_block).bit_length() - 1)
    width = max(pb, 1 << (max_pages - 1).bit_length())
    return pb, width, min(16, width // pb)


def decode_pallas_gpu(
    q_BxNxH: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    positions_B: jax.Array,
    table_BxM: jax.Array,
    *,
    geometry: PageGeometry,
    interpret: bool = False,
) -> jax.Array:
    """JAX's GPU (Pallas/Triton) paged-attention kernel; [B, N, H] (`interpret`: CPU tests)."""
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention

    h = q_BxNxH.shape[-1]
    pb, width, splits = gpu_blocks(table_BxM.shape[1], geometry.pages_per_block)
    table = jnp.pad(table_BxM, ((0, 0), (0, width - table_BxM.shape[1])))
    out = paged_attention(
        (q_BxNxH.astype(jnp.float32) * h**-0.5).astype(k_pages.dtype),
        k_pages,
        v_pages,
        table,
        (positions_B + 1).astype(jnp.int32),
        block_h=16,
        pages_per_compute_block=pb,
        k_splits=splits,
        interpret=interpret,
    )
    return out.astype(jnp.float32)


def context_attention(
    q_TxNxH: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    positions_T: jax.Array,
    table_M: jax.Array,
    first: jax.Array,
    end: jax.Array,
    *,
    geometry: PageGeometry,
    window: int | None,
) -> jax.Array:
    """Queries of one sequence at `positions_T` against its pages, keys in [first, end) (`first`
    block-aligned down), `context_block_pages` per iteration, online softmax; [T, N, H] fp32."""
    t, n, h = q_TxNxH.shape
    kh, _, z, _ = k_pages.shape
    g = n // kh
    bp = geometry.context_block_pages
    s = bp * z
    q_KxGxTxH = jnp.einsum("TKGH->KGTH", q_TxNxH.reshape(t, kh, g, h))
    token_iota_S = jnp.arange(s, dtype=jnp.int32)

    def body(j, carry):
        m_KxGxT, l_KxGxT, o_KxGxTxH = carry
        pages_Bp = jax.lax.dynamic_slice_in_dim(table_M, j * bp, bp)
        k_KxSxH = jnp.take(k_pages, pages_Bp, axis=1, mode="clip").reshape(kh, s, h)
        v_KxSxH = jnp.take(v_pages, pages_Bp, axis=1, mode="clip").reshape(kh, s, h)
        scores_KxGxTxS = scores("KGTH,KSH->KGTS", q_KxGxTxH, k_KxSxH) * (h**-0.5)
        kpos_S = j * s + token_iota_S
        ok_TxS = _visible(kpos_S[None, :], positions_T[:, None], window) & (kpos_S < end)[None]
        scores_KxGxTxS = jnp.where(ok_TxS[None, None], scores_KxGxTxS, NEG_INF)
        m_new_KxGxT = jnp.maximum(m_KxGxT, jnp.max(scores_KxGxTxS, axis=-1))
        p_KxGxTxS = jnp.where(
            ok_TxS[None, None], jnp.exp(scores_KxGxTxS - m_new_KxGxT[..., None]), 0.0
        )
        rescale_KxGxT = jnp.exp(m_KxGxT - m_new_KxGxT)
        l_KxGxT = l_KxGxT * rescale_KxGxT + jnp.sum(p_KxGxTxS, axis=-1)
        o_KxGxTxH = o_KxGxTxH * rescale_KxGxT[..., None] + jnp.einsum(
            "KGTS,KSH->KGTH", p_KxGxTxS, v_KxSxH.astype(jnp.float32)
        )
        return m_new_KxGxT, l_KxGxT, o_KxGxTxH

    init = (
        jnp.full((kh, g, t), NEG_INF, jnp.float32),
        jnp.zeros((kh, g, t), jnp.float32),
        jnp.zeros((kh, g, t, h), jnp.float32),
    )
    _, l_KxGxT, o_KxGxTxH = jax.lax.fori_loop(first // s, (end + s - 1) // s, body, init)
    o_KxGxTxH = o_KxGxTxH / jnp.where(l_KxGxT > 0, l_KxGxT, 1.0)[..., None]
    return jnp.einsum("KGTH->TKGH", o_KxGxTxH).reshape(t, n, h)
