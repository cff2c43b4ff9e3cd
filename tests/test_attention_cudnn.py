"""The cuDNN path without a GPU: how segment ids become cuDNN's sequence lengths / packed
offsets (hand-derived), and `cudnn_attention` end to end with cuDNN replaced by stand-ins
that implement the documented semantics of its arguments: for one sequence per row, jax's own
XLA implementation of `jax.nn.dot_product_attention` with the same arguments; for packed rows,
the packed layout as `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`
documents it (segment m of row b is tokens offsets[b, m] .. offsets[b, m] + seqlen[b, m] − 1)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.cudnn import fused_attention_stablehlo as cudnn
from test_attention import qkv, random_segments, reference

from rlvr_jax.models import attention_kernels as K


@pytest.mark.slow
def test_segment_runs_by_hand():
    seg = jnp.asarray(
        [
            [1, 1, 2, 2, 2, 3, 0, 0],  # three sequences, then padding
            [1, 1, 1, 1, 1, 1, 1, 1],  # one sequence, no padding
            [0, 0, 0, 0, 0, 0, 0, 0],  # fully padded
            [1, 2, 3, 4, 5, 0, 0, 0],  # five runs of one + padding: more than M = 4
        ]
    )
    lengths, starts, ids, count = K.segment_runs(seg, 4)
    np.testing.assert_array_equal(
        lengths, [[2, 3, 1, 2], [8, -1, -1, -1], [8, -1, -1, -1], [1, 1, 1, 1]]
    )
    np.testing.assert_array_equal(
        starts, [[0, 2, 5, 6, -1], [0, -1, -1, -1, -1], [0, -1, -1, -1, -1], [0, 1, 2, 3, -1]]
    )
    np.testing.assert_array_equal(
        ids, [[1, 2, 3, 0], [1, -1, -1, -1], [0, -1, -1, -1], [1, 2, 3, 4]]
    )
    np.testing.assert_array_equal(count, [4, 1, 1, 6])
    ok = K.cudnn_layout_ok(ids, count, 3)
    np.testing.assert_array_equal(ok, [True, True, True, False])


@pytest.mark.slow
def test_layout_check_rejects_what_cudnn_cannot_express():
    seg = jnp.asarray(
        [
            [0, 0, 1, 1, 1, 1],  # left padding: a padding run before a sequence
            [1, 1, 0, 0, 2, 2],  # padding between sequences
            [1, 1, 2, 2, 0, 0],  # two sequences + padding: fine with max_segments 2
        ]
    )
    _, _, ids, count = K.segment_runs(seg, 3)
    np.testing.assert_array_equal(K.cudnn_layout_ok(ids, count, 2), [False, False, True])
    np.testing.assert_array_equal(K.cudnn_layout_ok(ids, count, 1), [False, False, False])


def _public_standin(calls):
    real = jax.nn.dot_product_attention

    def standin(q, k, v, *args, implementation=None, **kwargs):
        assert implementation == "cudnn"
        calls.append(kwargs)
        return real(q, k, v, *args, implementation="xla", **kwargs)

    return standin


def _packed_standin(calls):
    def standin(q, k, v, *, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale, mask_type,
                sliding_window_length):  # fmt: skip
        assert mask_type == cudnn.MaskType.PADDING_CAUSAL
        assert q_offsets.shape[1] == q_seqlen.shape[1] + 1
        calls.append(dict(m=q_seqlen.shape[1], window=sliding_window_length))
        t = q.shape[1]
        idx_T = jnp.arange(t)
        idx_1x1xT = idx_T[None, None]
        m = q_seqlen.shape[1]
        inside_BxMxT = (q_offsets[:, :m, None] <= idx_1x1xT) & (
            idx_1x1xT < q_offsets[:, :m, None] + q_seqlen[:, :, None]
        )
        inside_BxMxT &= (q_seqlen >= 0)[:, :, None]
        member_BxT = jnp.where(inside_BxMxT.any(1), jnp.argmax(inside_BxMxT, axis=1), -1)
        same = (member_BxT[:, :, None] == member_BxT[:, None, :]) & (member_BxT >= 0)[:, :, None]
        delta = idx_T[:, None] - idx_T[None, :]
        ok = same & (delta >= 0)[None]
        if sliding_window_length is not None:
            ok &= (delta < sliding_window_length)[None]
        g = q.shape[2] // k.shape[2]
        kk, vv = (jnp.repeat(x, g, axis=2).astype(jnp.float32) for x in (k, v))
        s = jnp.einsum("BTNH,BSNH->BNTS", q.astype(jnp.float32), kk) * scale
        s = jnp.where(ok[:, None], s, -jnp.inf)
        p = jnp.where(ok[:, None], jax.nn.softmax(s, axis=-1), 0.0)
        return jnp.einsum("BNTS,BSNH->BTNH", p, vv).astype(q.dtype)

    return standin


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.slow
def test_one_sequence_per_row_through_the_public_api(monkeypatch, window):
    calls = []
    monkeypatch.setattr(jax.nn, "dot_product_attention", _public_standin(calls))
    rng = np.random.default_rng(0)
    seg = np.zeros((3, 24), np.int32)
    seg[0, :17] = 1
    seg[1, :] = 1  # no padding; row 2 fully padded
    q, k, v = qkv(rng, 3, 24, 4, 2, 8)
    out = np.asarray(K.cudnn_attention(q, k, v, jnp.asarray(seg), window, max_segments=1))
    ref = np.asarray(reference(q, k, v, seg, window))
    assert calls[0]["is_causal"] and calls[0]["local_window_size"] == (
        None if window is None else (window - 1, 0)
    )
    np.testing.assert_array_equal(calls[0]["query_seq_lengths"], [17, 24, 24])
    real = seg != 0
    np.testing.assert_allclose(out[real], ref[real], atol=2e-6)
    np.testing.assert_allclose(out[2], ref[2], atol=2e-6)  # padding attends to padding
    assert np.all(out[0, 17:] == 0)


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.slow
def test_packed_rows_through_the_packed_layout(monkeypatch, window):
    calls = []
    monkeypatch.setattr(cudnn, "dot_product_attention", _packed_standin(calls))
    rng = np.random.default_rng(1)
    seg = random_segments(rng, 3, 48, max_len=12)  # at most 48 runs; ids 1.. then padding
    max_segments = int(max(len(set(row) - {0}) for row in seg.tolist()))
    q, k, v = qkv(rng, 3, 48, 4, 2, 8)
    out = K.cudnn_attention(q, k, v, jnp.asarray(seg), window, max_segments=max_segments)
    assert calls == [dict(m=max_segments + 1, window=window)]
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(reference(q, k, v, seg, window)), atol=2e-6
    )


@pytest.mark.slow
def test_a_row_beyond_max_segments_is_nan_not_wrong(monkeypatch):
    monkeypatch.setattr(cudnn, "dot_product_attention", _packed_standin([]))
    seg = jnp.asarray([[1, 1, 2, 2, 3, 3, 0, 0], [1, 1, 1, 2, 2, 2, 2, 0]])
    q, k, v = qkv(np.random.default_rng(2), 2, 8, 2, 1, 8)
    out = np.asarray(K.cudnn_attention(q, k, v, seg, None, max_segments=2))
    assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()
    with pytest.raises(ValueError, match="max_segments >= 1"):
        K.cudnn_attention(q, k, v, seg, None, max_segments=0)
