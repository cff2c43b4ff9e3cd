"""The page allocator, the decode work lists, and the decode-attention implementations
(XLA blockwise path against a dense reference; the Pallas kernels in interpret mode)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.rollout.device import attention as pa
from rlvr_jax.rollout.device.paged import pages_for, work_lists
from rlvr_jax.rollout.host.pages import PageAllocator, PageError


def test_allocator_random_operations_never_leak_or_double_free():
    """1,000 random admit / grow / share / finish / preempt operations on 2 shards; after
    each, reference counts equal an independent count of every sequence's pages."""
    rng = np.random.default_rng(0)
    alloc = PageAllocator(pages_per_shard=40, shards=2)
    seqs: list[tuple[int, list[int]]] = []  # (shard, pages) of live sequences
    for _ in range(1000):
        op = rng.choice(["admit", "grow", "share", "finish", "preempt"])
        if op == "admit":
            shard = int(rng.integers(2))
            pages = alloc.alloc(shard, int(rng.integers(1, 6)))
            if pages is not None:
                seqs.append((shard, pages))
        elif op == "share" and seqs:  # a new sample on the full pages of a live prefix
            shard, pages = seqs[rng.integers(len(seqs))]
            full = pages[: int(rng.integers(len(pages) + 1))]
            alloc.share(shard, full)
            own = alloc.alloc(shard, 1)
            if own is None:
                alloc.release(shard, full)
            else:
                seqs.append((shard, full + own))
        elif op == "grow" and seqs:
            shard, pages = seqs[rng.integers(len(seqs))]
            pages.extend(alloc.alloc(shard, 1) or [])
        elif op in ("finish", "preempt") and seqs:
            shard, pages = seqs.pop(rng.integers(len(seqs)))
            alloc.release(shard, pages)
        alloc.check_invariants()
        want = np.zeros_like(alloc.refcount)
        for shard, pages in seqs:
            np.add.at(want[shard], pages, 1)
        np.testing.assert_array_equal(alloc.refcount, want)
        assert alloc.free(0) + alloc.free(1) == 2 * alloc.capacity - int((want > 0).sum())
    for shard, pages in seqs:
        alloc.release(shard, pages)
    assert alloc.in_use == 0 and alloc.free(0) == alloc.free(1) == 39


def test_allocator_refuses_misuse():
    alloc = PageAllocator(pages_per_shard=5)
    assert alloc.alloc(0, 5) is None and alloc.free(0) == 4  # all-or-nothing
    pages = alloc.alloc(0, 2)
    assert pages == [1, 2]  # lowest ids first; page 0 is the trash page
    alloc.release(0, pages)
    with pytest.raises(PageError, match="page 1 of shard 0 is not allocated"):
        alloc.release(0, [1])
    with pytest.raises(PageError, match="not allocated"):
        alloc.share(0, [3])
    with pytest.raises(PageError, match="out of range"):
        alloc.release(0, [0])
    with pytest.raises(PageError, match="listed twice"):
        alloc.release(0, [2, 2])
    alloc.check_invariants()


def test_work_lists_cover_live_blocks_only():
    geometry = pa.make_geometry(4, 16, (8, 16, 8))  # 2-page (8-token) blocks
    ends = {0: 5, 3: 17, 1: 8}  # global slots; 2 slots per shard
    starts = {0: 0, 3: 10, 1: 0}
    slot, block, count = work_lists(
        ends, starts, slots_per_shard=2, shards=2, length=6, geometry=geometry
    )
    # shard 0: slot 0 blocks 0; slot 1 blocks 0-1. shard 1: slot 3 (local 1) blocks 1-2.
    assert count.tolist() == [3, 2]
    assert slot[0].tolist() == [0, 1, 1, 2, 2, 2] and block[0, :3].tolist() == [0, 0, 1]
    assert slot[1].tolist() == [1, 1, 2, 2, 2, 2] and block[1, :2].tolist() == [1, 2]
    assert pages_for(9, 4) == 3
    with pytest.raises(PageError, match="overflows"):
        work_lists({0: 47}, {0: 0}, slots_per_shard=1, shards=1, length=2, geometry=geometry)


def _pool(seed, k=2, pages=12, z=4, h=16, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    kp = jnp.asarray(rng.standard_normal((k, pages, z, h)), dtype)
    vp = jnp.asarray(rng.standard_normal((k, pages, z, h)), dtype)
    return kp, vp


def _dense_reference(q_BxNxH, kp, vp, table_BxM, positions_B, window=None):
    b, n, h = q_BxNxH.shape
    k = kp.shape[0]
    out = []
    for i in range(b):
        keys = np.asarray(kp[:, table_BxM[i]].astype(jnp.float32)).reshape(k, -1, h)
        vals = np.asarray(vp[:, table_BxM[i]].astype(jnp.float32)).reshape(k, -1, h)
        pos = np.arange(keys.shape[1])
        ok = pos <= positions_B[i]
        if window is not None:
            ok &= pos > positions_B[i] - window
        q = np.asarray(q_BxNxH[i], np.float64).reshape(k, n // k, h) * h**-0.5
        s = np.einsum("kgh,ksh->kgs", q, keys)
        s = np.where(ok, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out.append(np.einsum("kgs,ksh->kgh", p, vals).reshape(n, h))
    return np.stack(out)


def _decode_xla(q, kp, vp, positions, table, geometry, window, *, length):
    """`decode_xla` over the work lists of every row: blocks from its window's start (or 0)
    to its position."""
    ends = {b: int(p) for b, p in enumerate(positions)}
    starts = {b: 0 if window is None else max(0, p - window + 1) for b, p in ends.items()}
    slot, block, count = work_lists(
        ends, starts, slots_per_shard=len(ends), shards=1, length=length, geometry=geometry
    )
    return pa.decode_xla(
        q,
        kp,
        vp,
        jnp.asarray(positions),
        jnp.asarray(table),
        jnp.asarray(slot[0]),
        jnp.asarray(block[0]),
        jnp.asarray(count[0]),
        geometry=geometry,
        window=window,
    )


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.slow
def test_decode_xla_equals_dense_attention(window):
    """Two slots with scattered pages; the work list covers one slot's first block only up
    to its position; blocks are walked 2 per iteration with a dynamic trip count."""
    kp, vp = _pool(1)
    geometry = pa.make_geometry(4, 4, (8, 16, 8))
    table = np.array([[3, 7, 1, 9], [5, 2, 11, 0]], np.int32)
    positions = np.array([14, 9], np.int32)
    q = jnp.asarray(np.random.default_rng(2).standard_normal((2, 4, 16)), jnp.float32)
    got = _decode_xla(q, kp, vp, positions, table, geometry, window, length=6)
    want = _dense_reference(q, kp, vp, table, positions, window)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-6)


def test_context_attention_equals_dense_attention():
    kp, vp = _pool(3)
    geometry = pa.make_geometry(4, 4, (8, 16, 8))
    table = np.array([3, 7, 1, 9], np.int32)
    positions = np.arange(6, 14, dtype=np.int32)  # a chunk at positions 6..13
    q = jnp.asarray(np.random.default_rng(4).standard_normal((8, 4, 16)), jnp.float32)
    for window in (None, 3):
        first = 0 if window is None else 6 - window + 1
        got = pa.context_attention(
            q,
            kp,
            vp,
            jnp.asarray(positions),
            jnp.asarray(table),
            jnp.int32(first),
            jnp.int32(14),
            geometry=geometry,
            window=window,
        )
        want = _dense_reference(q, kp, vp, np.tile(table, (8, 1)), positions, window)
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-6)


def test_select_impl():
    sel = pa.select_impl
    assert sel("auto", "cpu", page_size=16, head_dim=64) == "xla"
    assert sel("auto", "tpu", page_size=16, head_dim=128) == "pallas_tpu"
    assert sel("auto", "tpu", page_size=16, head_dim=64) == "xla"  # kernel needs H % 128
    assert sel("auto", "gpu", page_size=16, head_dim=64) == "pallas_gpu"
    assert sel("auto", "gpu", page_size=4, head_dim=64) == "xla"
    assert sel("xla", "tpu", page_size=16, head_dim=128) == "xla"
    with pytest.raises(ValueError, match="needs a TPU, not cpu"):
        sel("pallas_tpu", "cpu", page_size=16, head_dim=128)
    with pytest.raises(ValueError, match="cannot run page_size=4"):
        sel("pallas_gpu", "gpu", page_size=4, head_dim=64)
    with pytest.raises(ValueError, match="attention must be one of"):
        sel("flash", "cpu", page_size=16, head_dim=64)


def _kernel_case(dtype):
    kp, vp = _pool(5, k=2, pages=17, z=16, h=128, dtype=dtype)
    table = np.array([[3, 7, 1, 9], [5, 2, 11, 16]], np.int32)
    positions = np.array([40, 63], np.int32)
    q = jnp.asarray(np.random.default_rng(6).standard_normal((2, 8, 128)), jnp.float32)
    geometry = pa.make_geometry(16, 4, (32, 64, 64))
    xla = _decode_xla(q, kp, vp, positions, table, geometry, None, length=4)
    return (q, kp, vp, jnp.asarray(positions), jnp.asarray(table)), geometry, np.asarray(xla)


@pytest.mark.parametrize("pages,block", [(3, 8), (3, 3), (4, 4), (5, 2), (64, 8), (129, 8), (1, 8)])
def test_gpu_blocks_are_powers_of_two_that_tile_the_table(pages, block):
    """Triton lowers power-of-two shapes only (the first H200 run failed on a 3-page table)."""
    pb, width, splits = pa.gpu_blocks(pages, block)

    def is_pow2(n):
        return n > 0 and n & (n - 1) == 0

    assert is_pow2(pb) and pb <= block and is_pow2(width) and width >= pages
    assert width % splits == 0 and (width // splits) % pb == 0 and splits <= 16
    assert is_pow2(width // splits)


@pytest.mark.slow
def test_pallas_gpu_kernel_takes_a_three_page_table_in_interpret_mode():
    (q, kp, vp, positions, table), _, _ = _kernel_case(jnp.float32)
    geometry = pa.make_geometry(16, 3, (64, 64, 64))
    want = _decode_xla(q, kp, vp, np.asarray(positions) - 16, np.asarray(table)[:, :3],
                       geometry, None, length=3)  # fmt: skip
    got = pa.decode_pallas_gpu(q, kp, vp, positions - 16, table[:, :3], geometry=geometry,
                               interpret=True)  # fmt: skip
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_pallas_gpu_kernel_equals_xla_in_interpret_mode():
    args, geometry, xla = _kernel_case(jnp.float32)
    got = pa.decode_pallas_gpu(*args, geometry=geometry, interpret=True)
    np.testing.assert_allclose(np.asarray(got), xla, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_pallas_tpu_kernel_equals_xla_in_interpret_mode():
    """The TPU kernel loads K/V as bf16, so both read a bf16 pool (queries stay fp32)."""
    from jax.experimental.pallas import tpu as pltpu

    args, geometry, xla = _kernel_case(jnp.bfloat16)
    with pltpu.force_tpu_interpret_mode():
        got = pa.decode_pallas_tpu(*args, geometry=geometry)
    np.testing.assert_allclose(np.asarray(got), xla, rtol=0, atol=1e-5)
    assert jax.devices()[0].platform == "cpu"
