"""Fused attention kernels of the accelerators: cuDNN flash attention (GPU) and splash
attention (Pallas, TPU). Both take the same causal-within-segment problem as
`rlvr_jax.models.attention_blockwise` and never see a [T, T] mask.

cuDNN sees a row as its runs of equal segment ids: `max_segments == 1` (one right-padded
sequence) uses `jax.nn.dot_product_attention(implementation="cudnn")` with `query_seq_lengths`
and `local_window_size=(W - 1, 0)`; packed rows use jax's cuDNN packed layout (`q_seqlen` /
`kv_seqlen` [B, M], `q_offsets` / `kv_offsets` [B, M + 1], M = max_segments + 1 so trailing
padding is a run of its own; Hopper or later). A row must be at most `max_segments` runs of
non-zero ids then at most one run of id 0 (the learner's collation); any other row gets NaN
outputs (the train step then skips, never silently mis-attends).

Splash: `make_splash_mqa` per kv head (its G query heads share one K/V), vmapped over kv heads
and rows, with `SegmentIds` and a `CausalMask` or `LocalMask((W - 1, 0))`; T is padded to a
multiple of 128 (its own segment, cut off). `interpret=True` runs the Pallas interpreter (tests
on CPU). Under a mesh it runs in a `shard_map` over the batch (and heads when N and K divide
the tensor axis).
"""

from __future__ import annotations

import concurrent.futures
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rlvr_jax import sharding
from rlvr_jax.models.attention_blockwise import pad_time

SPLASH_BLOCK = 512
"""Splash tile (queries and keys); T below it uses T rounded up to a multiple of 128."""
_LANES = 128


# ---- cuDNN -------------------------------------------------------------------------------


def segment_runs(
    segment_ids_BxT: jax.Array, max_runs: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Runs of equal segment ids of each row: (lengths [B, M], starts [B, M + 1], ids [B, M],
    count [B]), M = `max_runs`; unused slots hold -1 (cuDNN's packed-layout convention). A
    row with more than M runs keeps its first M (`count` tells how many it has)."""
    b, t = segment_ids_BxT.shape
    seg_BxT = segment_ids_BxT.astype(jnp.int32)
    first_BxT = jnp.concatenate([jnp.ones((b, 1), bool), seg_BxT[:, 1:] != seg_BxT[:, :-1]], 1)
    run_BxT = jnp.cumsum(first_BxT, axis=1, dtype=jnp.int32) - 1
    count_B = run_BxT[:, -1] + 1
    slot_BxT = jnp.minimum(run_BxT, max_runs)  # slot M collects the runs beyond M
    rows_BxT = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
    t_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t))
    empty_BxM1 = jnp.full((b, max_runs + 1), -1, jnp.int32)
    at = (rows_BxT, slot_BxT)
    starts = empty_BxM1.at[at].max(jnp.where(first_BxT, t_BxT, -1)).at[:, max_runs].set(-1)
    lengths = jnp.zeros((b, max_runs + 1), jnp.int32).at[at].add(1)[:, :max_runs]
    used_BxM = jnp.arange(max_runs)[None] < count_B[:, None]
    ids = empty_BxM1.at[at].max(seg_BxT)[:, :max_runs]
    return jnp.where(used_BxM, lengths, -1), starts, ids, count_B


def cudnn_layout_ok(ids_BxM: jax.Array, count_B: jax.Array, max_segments: int) -> jax.Array:
    """[B] bool: the row is at most `max_segments` runs of non-zero ids, then at most one run
    of padding (id 0); a fully padded row (one run of 0) is fine too."""
    m = ids_BxM.shape[1]
    slot_BxM = jnp.arange(m)[None]
    used_BxM = slot_BxM < count_B[:, None]
    n_real_B = (used_BxM & (ids_BxM != 0)).sum(axis=1)
    pad_inside_B = ((slot_BxM < count_B[:, None] - 1) & (ids_BxM == 0)).any(axis=1)
    return (count_B <= m) & (n_real_B <= max_segments) & ~pad_inside_B


def cudnn_attention(
    q_BxTxNxH: jax.Array,
    k_BxTxKxH: jax.Array,
    v_BxTxKxH: jax.Array,
    segment_ids_BxT: jax.Array,
    window: int | None,
    *,
    max_segments: int,
) -> jax.Array:
    """cuDNN flash attention of rows holding up to `max_segments` sequences (module doc)."""
    if max_segments < 1:
        raise ValueError(f"cuDNN attention needs max_segments >= 1, got {max_segments}")
    lengths, starts, ids, count = segment_runs(segment_ids_BxT, max_segments + 1)
    ok_B = cudnn_layout_ok(ids, count, max_segments)
    if max_segments == 1:
        first_B = lengths[:, 0]
        out = jax.nn.dot_product_attention(
            q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, is_causal=True,
            query_seq_lengths=first_B, key_value_seq_lengths=first_B,
            local_window_size=None if window is None else (window - 1, 0),
            implementation="cudnn",
        )  # fmt: skip
        # queries past the first run are masked out by cuDNN: make them finite (zero)
        t_1xT = jnp.arange(q_BxTxNxH.shape[1])[None]
        out = jnp.where((t_1xT < first_B[:, None])[:, :, None, None], out, 0)
    else:
        from jax._src.cudnn import fused_attention_stablehlo as cudnn

        out = cudnn.dot_product_attention(
            q_BxTxNxH, k_BxTxKxH, v_BxTxKxH,
            q_seqlen=lengths, kv_seqlen=lengths, q_offsets=starts, kv_offsets=starts,
            scale=q_BxTxNxH.shape[-1] ** -0.5, mask_type=cudnn.MaskType.PADDING_CAUSAL,
            sliding_window_length=window,
        )  # fmt: skip
    return jnp.where(ok_B[:, None, None, None], out, jnp.nan).astype(q_BxTxNxH.dtype)


# ---- splash (TPU) ------------------------------------------------------------------------


def splash_block(t: int) -> int:
    """The splash tile for T tokens: `SPLASH_BLOCK`, or T rounded up to 128 when shorter."""
    return min(SPLASH_BLOCK, -(-t // _LANES) * _LANES)


def _splash_kernel(t: int, groups: int, window: int | None, block: int, interpret: bool):
    """A splash MQA kernel for T tokens and `groups` query heads per kv head; its mask tables
    (numpy, built once per shape) become constants of whatever trace calls it."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    infos, kwargs = _splash_tables(t, groups, window, block, interpret)
    return sk.SplashAttentionKernel(*(jax.tree.map(jnp.asarray, i) for i in infos), **kwargs)


@functools.lru_cache(maxsize=32)
def _splash_tables(t: int, groups: int, window: int | None, block: int, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    if window is None:
        mask = sa.CausalMask((t, t))
    else:
        mask = sa.LocalMask((t, t), window_size=(window - 1, 0), offset=0)
    sizes = dict.fromkeys(
        ("block_q", "block_kv", "block_kv_compute", "block_q_dkv", "block_kv_dkv",
         "block_kv_dkv_compute", "block_q_dq", "block_kv_dq"), block,
    )  # fmt: skip

    def build():
        kernel = sa.make_splash_mqa_single_device(
            sa.MultiHeadMask([mask] * groups),
            block_sizes=sa.BlockSizes(**sizes),
            interpret=interpret,
        )
        infos = (kernel.fwd_mask_info, kernel.dq_mask_info, kernel.dkv_mask_info)
        return jax.tree.map(np.asarray, infos), kernel.kwargs

    # JAX's trace state is per thread: built on a fresh thread, the tables are concrete even
    # when the first call comes from inside a transformation (flax's scan traces its body)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(build).result()


def splash_attention(
    q_BxTxNxH: jax.Array,
    k_BxTxKxH: jax.Array,
    v_BxTxKxH: jax.Array,
    segment_ids_BxT: jax.Array,
    window: int | None,
    *,
    interpret: bool = False,
    mesh: Mesh | None = None,
    rules: sharding.Rules | None = None,
) -> jax.Array:
    """Splash attention (module doc); `mesh`/`rules` wrap it in a `shard_map`."""
    fn = functools.partial(_splash_local, window=window, interpret=interpret)
    if mesh is None or mesh.size == 1:
        return fn(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, segment_ids_BxT)
    rules = sharding.LEARNER_RULES if rules is None else rules
    # heads split only where the tensor axis divides both N and K (then device d holds the
    # query heads of its own kv heads); rows over the batch axes
    n, k = q_BxTxNxH.shape[2], k_BxTxKxH.shape[2]
    heads = sharding.logical_to_spec(("activation_heads",), rules, mesh, (math.gcd(n, k),))[0]
    batch = sharding.logical_to_spec(("batch",), rules, mesh, segment_ids_BxT.shape[:1])[0]
    qkv = jax.sharding.PartitionSpec(batch, None, heads, None)
    seg = jax.sharding.PartitionSpec(batch, None)
    return jax.shard_map(
        fn, mesh=mesh, in_specs=(qkv, qkv, qkv, seg), out_specs=qkv, check_vma=False
    )(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, segment_ids_BxT)


def _splash_local(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, segment_ids_BxT, *, window, interpret):
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    b, t, n, h = q_BxTxNxH.shape
    kv = k_BxTxKxH.shape[2]
    block = splash_block(t)
    padded = -(-t // block) * block
    q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, seg_BxT = pad_time(
        q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, segment_ids_BxT, padded
    )
    kernel = _splash_kernel(padded, n // kv, window, block, interpret)
    scale = jnp.asarray(h**-0.5, q_BxTxNxH.dtype)
    q_BxKxGxTxH = jnp.einsum("BTKGH->BKGTH", (q_BxTxNxH * scale).reshape(b, padded, kv, -1, h))
    k_BxKxTxH = jnp.einsum("BTKH->BKTH", k_BxTxKxH)
    v_BxKxTxH = jnp.einsum("BTKH->BKTH", v_BxTxKxH)

    def one_row(q_KxGxTxH, k_KxTxH, v_KxTxH, seg_T):
        ids = SegmentIds(q=seg_T, kv=seg_T)
        return jax.vmap(lambda q, k, v: kernel(q, k, v, segment_ids=ids))(
            q_KxGxTxH, k_KxTxH, v_KxTxH
        )

    out_BxKxGxTxH = jax.vmap(one_row)(q_BxKxGxTxH, k_BxKxTxH, v_BxKxTxH, seg_BxT)
    out_BxTxNxH = jnp.einsum("BKGTH->BTKGH", out_BxKxGxTxH).reshape(b, padded, n, h)
    return out_BxTxNxH[:, :t].astype(q_BxTxNxH.dtype)
