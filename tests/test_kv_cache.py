"""KV-cache decode: prefill + one token at a time gives the full forward's logits.

Reference: transformers' full forward over each row's whole sequence (prompt + continuation),
unpadded. The decode loop runs the way the rollout engine will: jitted, cache donated,
several steps inside one `lax.scan`, rows at different positions.
"""

from __future__ import annotations

import functools

import helpers_models as H
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import models

TOL = 1e-4


@functools.partial(jax.jit, static_argnames=("config", "compute_dtype"), donate_argnames=("cache",))
def _decode_scan(params, config, cache, tokens_BxN, start_B, compute_dtype=jnp.float32):
    """Teacher-forced decode of N steps: step j feeds tokens_BxN[:, j] at start_B + j."""

    def step(cache, inputs):
        tokens_B, j = inputs
        logits_BxV, cache = models.decode_step(
            params, config, tokens_B, start_B + j, cache, compute_dtype=compute_dtype
        )
        return cache, logits_BxV

    steps = jnp.arange(tokens_BxN.shape[1], dtype=jnp.int32)
    cache, logits_NxBxV = jax.lax.scan(step, cache, (tokens_BxN.T, steps))
    return jnp.transpose(logits_NxBxV, (1, 0, 2)), cache


_prefill = jax.jit(models.prefill, static_argnames=("config", "compute_dtype", "cache_dtype"))


def _prefill_then_decode(
    model, full_BxT, lengths_B, prompt_len, n_steps, max_len, cache_dtype=jnp.float32
):
    """Prefill right-padded prompts into a cache of `max_len` positions, then decode the
    next n_steps tokens of each row (teacher forcing). Returns numpy logits and the cache."""
    rows = np.arange(full_BxT.shape[0])
    prompts_BxT = np.where(np.arange(prompt_len) < lengths_B[:, None], full_BxT[:, :prompt_len], 0)
    dtype = jnp.dtype(model.compute_dtype)
    logits_BxTxV, prefix = _prefill(
        model.params,
        model.config,
        prompts_BxT,
        lengths_B,
        compute_dtype=dtype,
        cache_dtype=cache_dtype,
    )
    cache = models.init_cache(model.config, len(rows), max_len, cache_dtype)
    cache = models.insert(cache, prefix, 0)
    feed_BxN = np.stack([full_BxT[rows, lengths_B + j] for j in range(n_steps)], axis=1)
    decoded_BxNxV, cache = _decode_scan(
        model.params, model.config, cache, feed_BxN, lengths_B, compute_dtype=dtype
    )
    return np.asarray(logits_BxTxV), np.asarray(decoded_BxNxV), cache


@pytest.mark.parametrize("arch", ["llama", "qwen3", "olmo3"])
def test_prefill_and_decode_match_full_forward(tmp_path, arch):
    hf_model = H.build_hf_checkpoint(arch, tmp_path, seed=7)
    model = models.load_pretrained(tmp_path)
    n_steps, prompt_len = 7, 6
    lengths_B = np.array([6, 3, 1], np.int32)  # right-padded prompts of different lengths
    full_BxT = H.random_tokens(3, prompt_len + n_steps, seed=8)
    prefill_BxTxV, decoded_BxNxV, cache = _prefill_then_decode(
        model, full_BxT, lengths_B, prompt_len, n_steps, max_len=16
    )
    assert cache.k.shape == (model.config.n_layers, 3, 16, 2, model.config.head_dim)
    for b, n in enumerate(lengths_B):
        ref_TxV = H.hf_logits(hf_model, full_BxT[b : b + 1, : n + n_steps])[0]
        np.testing.assert_allclose(prefill_BxTxV[b, :n], ref_TxV[:n], rtol=0, atol=TOL)
        np.testing.assert_allclose(decoded_BxNxV[b], ref_TxV[n : n + n_steps], rtol=0, atol=TOL)


def test_sliding_window_decode_beyond_window(tmp_path):
    """OLMo 3 with W=3 decoding 12 steps past a 2-token prompt: sliding layers must forget
    keys older than 3 positions, the full layer must not."""
    hf_model = H.build_hf_checkpoint("olmo3", tmp_path, seed=9)
    model = models.load_pretrained(tmp_path)
    assert model.config.sliding_window == 3
    full_BxT = H.random_tokens(2, 14, seed=10)
    lengths_B = np.array([2, 2], np.int32)
    _, decoded_BxNxV, _ = _prefill_then_decode(
        model, full_BxT, lengths_B, prompt_len=2, n_steps=12, max_len=14
    )
    ref_BxTxV = H.hf_logits(hf_model, full_BxT)
    np.testing.assert_allclose(decoded_BxNxV, ref_BxTxV[:, 2:], rtol=0, atol=TOL)


def test_insert_into_slots_leaves_other_rows(tmp_path):
    """Two prompts inserted at slots 1-2 of a 4-slot cache decode correctly; slots 0 and 3
    keep their contents except where their own decode steps wrote."""
    hf_model = H.build_hf_checkpoint("qwen2", tmp_path, seed=11)
    model = models.load_pretrained(tmp_path)
    full_BxT = H.random_tokens(2, 9, seed=12)
    lengths_B = np.array([4, 5], np.int32)
    cfg = model.config
    _, prefix = _prefill(
        model.params, cfg, full_BxT[:, :5] * (np.arange(5) < lengths_B[:, None]), lengths_B
    )
    sentinel = models.KVCache(
        k=jnp.full((cfg.n_layers, 4, 12, cfg.n_kv_heads, cfg.head_dim), 7.0),
        v=jnp.full((cfg.n_layers, 4, 12, cfg.n_kv_heads, cfg.head_dim), -7.0),
    )
    cache = models.insert(sentinel, prefix, 1)
    k = np.asarray(cache.k)
    np.testing.assert_array_equal(k[:, 1:3, :5], np.asarray(prefix.k))
    assert (k[:, [0, 3]] == 7.0).all() and (k[:, 1:3, 5:] == 7.0).all()
    # decode 4 tokens for slots 1-2 (slots 0 and 3 decode garbage at position 0)
    feed = np.zeros((4, 4), np.int32)
    start = np.zeros(4, np.int32)
    feed[1:3] = np.stack([full_BxT[[0, 1], lengths_B + j] for j in range(4)], axis=1)
    start[1:3] = lengths_B
    decoded, cache = _decode_scan(model.params, cfg, cache, feed, start)
    for row, b in ((1, 0), (2, 1)):
        n = lengths_B[b]
        ref = H.hf_logits(hf_model, full_BxT[b : b + 1, : n + 4])[0]
        np.testing.assert_allclose(np.asarray(decoded)[row], ref[n:], rtol=0, atol=TOL)
    k = np.asarray(cache.k)  # idle slots 0 and 3 wrote positions 0..3 only
    assert (k[:, [0, 3], 4:] == 7.0).all() and not (k[:, [0, 3], :4] == 7.0).any()


def test_bfloat16_params_compute_and_cache(tmp_path):
    """bf16 params, compute and cache: the cache really is bf16, logits stay fp32 and within
    bf16 noise of transformers' fp32 logits (but are not bit-equal to the fp32 path)."""
    hf_model = H.build_hf_checkpoint("olmo2", tmp_path, seed=13)
    model = models.load_pretrained(tmp_path, dtype="bfloat16")
    full_BxT = H.random_tokens(2, 10, seed=14)
    lengths_B = np.array([6, 4], np.int32)
    prefill_BxTxV, decoded_BxNxV, cache = _prefill_then_decode(
        model, full_BxT, lengths_B, 6, 4, max_len=12, cache_dtype=jnp.bfloat16
    )
    assert cache.k.dtype == cache.v.dtype == jnp.bfloat16
    assert prefill_BxTxV.dtype == decoded_BxNxV.dtype == np.float32
    for b, n in enumerate(lengths_B):
        ref_TxV = H.hf_logits(hf_model, full_BxT[b : b + 1, : n + 4])[0]
        err = np.abs(decoded_BxNxV[b] - ref_TxV[n:]).max()
        assert 1e-4 < err < 0.05 * np.abs(ref_TxV).max()


def test_cache_shapes_and_axes():
    cfg = models.ArchConfig.from_hf({**H.BASE["llama"], "model_type": "llama"})
    cache = models.init_cache(cfg, 5, 32, "bfloat16")
    assert cache.k.shape == cache.v.shape == (2, 5, 32, 2, 16)
    assert cache.k.dtype == jnp.bfloat16 and (cache.batch, cache.max_len) == (5, 32)
    axes = models.cache_logical_axes()
    assert axes.k == ("layers", "cache_batch", "cache_sequence", "cache_kv_heads", "head_dim")
    with pytest.raises(ValueError, match="prefix of 40 positions > cache of 32"):
        models.insert(cache, models.init_cache(cfg, 1, 40, "bfloat16"), 0)
