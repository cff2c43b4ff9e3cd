"""The attention kernels (`rlvr_jax.models.attention*`) against the materialised-mask
reference (`layers.segment_masks` + `layers.attend`, itself tested against transformers in
test_models_parity.py): outputs and gradients on random packed / padded segment layouts,
sliding windows, GQA and fully padded rows; memory growth; the platform selection."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.models import attention as A
from rlvr_jax.models.attention_blockwise import blockwise_attention
from rlvr_jax.models.layers import attend, segment_masks


def random_segments(rng, b: int, t: int, *, max_len: int = 15, pad_rows=(-1,)) -> np.ndarray:
    """[B, T] ids: runs of 1..max_len tokens with ids 1, 2, ..., then right padding (0);
    rows listed in `pad_rows` are all padding."""
    out = np.zeros((b, t), np.int32)
    for row in range(b):
        pos, sid = 0, 1
        while pos < t:
            n = int(rng.integers(1, max_len + 1))
            out[row, pos : pos + n] = sid
            pos, sid = pos + n, sid + 1
        out[row, t - int(rng.integers(0, t // 4)) :] = 0
    for row in pad_rows:
        out[row] = 0
    return out


def qkv(rng, b, t, n, k, h, dtype=jnp.float32):
    def x(heads):
        return jnp.asarray(rng.standard_normal((b, t, heads, h)), dtype)

    return x(n), x(k), x(k)


def reference(q, k, v, seg, window):
    full, sliding = segment_masks(jnp.asarray(seg), window)
    return attend(q, k, v, full if sliding is None else sliding)


def value_and_grads(fn, q, k, v, w):
    """(output, d(sum(out * w))/d(q, k, v)) of an attention function."""
    out = fn(q, k, v)
    grads = jax.grad(lambda q, k, v: (fn(q, k, v) * w).sum(), argnums=(0, 1, 2))(q, k, v)
    return out, grads


def assert_same(fn, ref_fn, q, k, v, atol=2e-5):
    w = jnp.asarray(np.random.default_rng(9).standard_normal(q.shape), q.dtype)
    out, grads = value_and_grads(fn, q, k, v, w)
    ref, ref_grads = value_and_grads(ref_fn, q, k, v, w)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=0, atol=atol)
    assert np.abs(np.asarray(ref_grads[2])).max() > 1e-3  # dV is never trivially 0
    for g, r, name in zip(grads, ref_grads, "qkv"):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=0, atol=atol, err_msg=name)


# ---- blockwise ---------------------------------------------------------------------------


@pytest.mark.slow  # the first case compiles for ~10 s on two cores
@pytest.mark.parametrize("window", [None, 1, 3, 17])
@pytest.mark.parametrize("block", [8, 7, 64])  # 7: T is padded up to whole blocks
def test_blockwise_equals_reference(window, block):
    rng = np.random.default_rng(block * 100 + (window or 0))
    seg = random_segments(rng, 3, 40)  # row 2 fully padded
    q, k, v = qkv(rng, 3, 40, 4, 2, 8)
    assert_same(
        lambda q, k, v: blockwise_attention(q, k, v, jnp.asarray(seg), window, block=block),
        lambda q, k, v: reference(q, k, v, seg, window),
        q,
        k,
        v,
    )


@pytest.mark.slow
def test_blockwise_traced_window_and_mha():
    """A window chosen inside jit (per layer in the decoder's scan), N == K, one segment."""
    rng = np.random.default_rng(1)
    seg = np.ones((2, 33), np.int32)
    q, k, v = qkv(rng, 2, 33, 3, 3, 4)
    fn = jax.jit(lambda q, k, v, w: blockwise_attention(q, k, v, jnp.asarray(seg), w, block=8))
    for window in (5, 2**30):
        expected = reference(q, k, v, seg, None if window > 33 else window)
        np.testing.assert_allclose(
            np.asarray(fn(q, k, v, jnp.int32(window))), np.asarray(expected), atol=2e-6
        )


@pytest.mark.slow
def test_blockwise_bf16_close_to_reference():
    rng = np.random.default_rng(2)
    seg = random_segments(rng, 2, 48, pad_rows=())
    q, k, v = qkv(rng, 2, 48, 4, 2, 16, jnp.bfloat16)
    out = blockwise_attention(q, k, v, jnp.asarray(seg), None, block=16)
    ref = reference(q, k, v, seg, None)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(ref, np.float32), rtol=0, atol=3e-2
    )


def test_blockwise_rejects_bad_input():
    q = jnp.zeros((1, 8, 2, 4))
    k = jnp.zeros((1, 8, 1, 4))
    with pytest.raises(ValueError, match="window must be >= 1"):
        blockwise_attention(q, k, k, jnp.zeros((1, 8), jnp.int32), 0)
    with pytest.raises(ValueError, match="self-attention shapes"):
        blockwise_attention(q, k, k, jnp.zeros((1, 9), jnp.int32))


def _grad_temp_bytes(kernel: str, t: int) -> int:
    """XLA's temp allocation of d(sum attention)/d(q, k, v) at T = t (compiled, not run)."""
    b, n, kv, h = 1, 4, 2, 16
    args = (
        jax.ShapeDtypeStruct((b, t, n, h), jnp.float32),
        jax.ShapeDtypeStruct((b, t, kv, h), jnp.float32),
        jax.ShapeDtypeStruct((b, t, kv, h), jnp.float32),
        jax.ShapeDtypeStruct((b, t), jnp.int32),
    )

    def loss(q, k, v, seg):
        return A.attention(q, k, v, seg, impl=kernel, chunk=128 if kernel == "blockwise" else 0)

    grad = jax.grad(lambda q, k, v, seg: loss(q, k, v, seg).sum(), argnums=(0, 1, 2))
    return jax.jit(grad).lower(*args).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_blockwise_memory_grows_linearly_in_t():
    """Doubling T doubles blockwise's temp memory (O(T·block)) but quadruples xla's
    (O(T²) masks and scores); at T = 2048 blockwise needs far less."""
    blockwise = [_grad_temp_bytes("blockwise", t) for t in (1024, 2048)]
    xla = [_grad_temp_bytes("xla", t) for t in (1024, 2048)]
    assert blockwise[1] / blockwise[0] < 2.3
    assert xla[1] / xla[0] > 3.5
    assert blockwise[1] * 8 < xla[1]


# ---- splash (Pallas interpreter on CPU; lowering for TPU) --------------------------------


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.slow
def test_splash_interpret_equals_reference(window):
    rng = np.random.default_rng(3)
    seg = random_segments(rng, 2, 200, max_len=90)  # T padded to 256 inside
    q, k, v = qkv(rng, 2, 200, 4, 2, 8)
    assert_same(
        lambda q, k, v: A.attention(
            q, k, v, jnp.asarray(seg), impl="splash_interpret", sliding_window=window
        ),
        lambda q, k, v: reference(q, k, v, seg, window),
        q,
        k,
        v,
        atol=1e-4,
    )


@pytest.mark.slow
def test_splash_per_layer_window_under_jit():
    """`is_sliding` traced (the decoder's scan): a lax.cond between the two static masks."""
    rng = np.random.default_rng(4)
    seg = random_segments(rng, 1, 64, pad_rows=())
    q, k, v = qkv(rng, 1, 64, 2, 1, 8)
    fn = jax.jit(
        lambda s: A.attention(
            q, k, v, jnp.asarray(seg), impl="splash_interpret", sliding_window=3, is_sliding=s
        )
    )
    for sliding, window in ((True, 3), (False, None)):
        np.testing.assert_allclose(
            np.asarray(fn(jnp.asarray(sliding))),
            np.asarray(reference(q, k, v, seg, window)),
            atol=2e-5,
        )


def test_splash_lowers_for_tpu():
    """Mosaic lowering of the real kernel (forward, and dq/dkv kernels of the backward)
    for TPU, from this CPU-only machine."""
    from rlvr_jax.models.attention_kernels import splash_attention

    shapes = [(2, 1024, 8, 128), (2, 1024, 2, 128), (2, 1024, 2, 128)]
    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in shapes]
    args.append(jax.ShapeDtypeStruct((2, 1024), jnp.int32))

    def loss(q, k, v, seg):
        return splash_attention(q, k, v, seg, 256).astype(jnp.float32).sum()

    grad = jax.grad(loss, argnums=(0, 1, 2))
    text = jax.jit(grad).trace(*args).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("tpu_custom_call") == 3


@pytest.mark.slow
def test_splash_sharded_over_a_mesh_equals_unsharded():
    from rlvr_jax import sharding

    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    rng = np.random.default_rng(5)
    seg = jnp.asarray(random_segments(rng, 4, 128, max_len=60))
    q, k, v = qkv(rng, 4, 128, 4, 2, 8)
    common = dict(impl="splash_interpret", sliding_window=None)
    sharded = jax.jit(lambda *a: A.attention(*a, mesh=mesh, **common))(q, k, v, seg)
    np.testing.assert_allclose(
        np.asarray(sharded), np.asarray(reference(q, k, v, seg, None)), atol=2e-5
    )


# ---- selection ---------------------------------------------------------------------------

BF16, F32 = jnp.bfloat16, jnp.float32


@pytest.mark.parametrize(
    ("impl", "platform", "dtype", "head_dim", "max_segments", "expected"),
    [
        ("auto", "cpu", F32, 64, 0, "blockwise"),
        ("auto", "cpu", BF16, 64, 4, "blockwise"),
        ("auto", "tpu", F32, 64, 0, "splash"),
        ("auto", "gpu", BF16, 128, 1, "cudnn"),
        ("auto", "gpu", F32, 128, 1, "blockwise"),  # cuDNN flash attention is 16-bit only
        ("auto", "gpu", BF16, 128, 0, "blockwise"),  # segment layout not declared
        ("auto", "gpu", BF16, 100, 1, "blockwise"),  # head dim not a multiple of 8
        ("xla", "tpu", F32, 64, 0, "xla"),
        ("blockwise", "gpu", BF16, 64, 0, "blockwise"),
        ("cudnn", "gpu", BF16, 64, 2, "cudnn"),
        ("splash", "tpu", BF16, 64, 0, "splash"),
        ("splash_interpret", "cpu", F32, 64, 0, "splash_interpret"),
        ("cudnn", "cpu", BF16, 64, 1, "cudnn needs an NVIDIA GPU"),
        ("cudnn", "gpu", F32, 64, 1, "cudnn needs a bf16/fp16 compute dtype"),
        ("cudnn", "gpu", BF16, 512, 1, "head dim that is a multiple of 8 up to 256"),
        ("cudnn", "gpu", BF16, 64, 0, "max_segments >= 1"),
        ("splash", "gpu", BF16, 64, 0, "splash needs a TPU"),
        ("flash", "cpu", F32, 64, 0, "must be one of auto, xla, blockwise, cudnn, splash"),
    ],
)
def test_resolve_impl(impl, platform, dtype, head_dim, max_segments, expected):
    kw = dict(
        compute_dtype=dtype,
        head_dim=head_dim,
        max_segments=max_segments,
        platform=platform,
        check_library=False,
    )
    if expected in A.KERNELS:
        assert A.resolve_impl(impl, **kw) == expected
    else:
        with pytest.raises(A.AttentionConfigError, match=expected):
            A.resolve_impl(impl, **kw)


def test_cudnn_needs_the_library():
    """On this CPU-only install the cuDNN check itself fails, and says why."""
    kw = dict(compute_dtype=BF16, head_dim=64, max_segments=1, platform="gpu")
    assert A.resolve_impl("auto", **kw) == "blockwise"
    with pytest.raises(A.AttentionConfigError, match="cuDNN is not available"):
        A.resolve_impl("cudnn", **kw)


@pytest.mark.parametrize(
    ("hardware", "platform"),
    [("TPU v5p-128 (64 chips)", "tpu"), ("8xH100-80GB", "gpu"), ("4x A100", "gpu")],
)
def test_platform_of_hardware(hardware, platform):
    assert A.platform_of(hardware) == platform
    assert A.platform_of(None) == "cpu"  # this process


def test_activation_bytes_by_hand():
    """rows 2, T 1024, N 4, H 16, 3 layers, one sliding: hand-derived figures."""
    kw = dict(rows=2, seq=1024, n_heads=4, head_dim=16, n_layers=3, sliding=True, remat=False)
    lse = 2 * 4 * 1024 * 4  # 32 KiB per layer
    probs = 2 * 4 * 1024 * 1024 * 4  # 32 MiB per layer
    masks = 2 * 1024 * 1024 * 2  # full + sliding bool masks
    assert A.activation_bytes("xla", **kw) == masks + 3 * probs
    assert A.activation_bytes("xla", **kw, chunk=256) == masks + probs // 4
    work = 2 * 4 * (1024 * 16 + 4 * 512 * 512) * 4
    assert A.activation_bytes("blockwise", **kw) == 3 * lse + work
    assert A.activation_bytes("splash", **{**kw, "remat": True}) == lse
    with pytest.raises(A.AttentionConfigError):
        A.activation_bytes("auto", **kw)
