"""The engine's KV cache (both layouts): prefill + one token at a time gives the full
forward's logits.

Reference: transformers' full forward over each row's whole sequence (prompt +
continuation), unpadded. Prompts are cached through the engine's own API (`prefill` +
`insert`; the paged engine writes them into its static page assignment), then a jitted,
cache-donating scan feeds the true continuation one token per step, rows at different
positions — the decode functions the engine's `generate` runs.
"""

from __future__ import annotations

import dataclasses
import functools

import helpers_models as H
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import models
from rlvr_jax.rollout import EngineCore, SlotRequest
from rlvr_jax.rollout.device import kernel
from rlvr_jax.rollout.device import paged as paged_core

TOL = 1e-4
LAYOUTS = ["contiguous", "paged"]


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def _decode_scan(dp, state, work, feed_BxN, start_B, *, spec):
    """Teacher-forced decode of N steps: step j feeds feed_BxN[:, j] at start_B + j."""
    active_B = jnp.ones(start_B.shape, jnp.bool_)

    def step(kv, inputs):
        tokens_B, j = inputs
        if spec.kv_layout.name == "paged":
            logits, k, v = paged_core.decode_logits(
                dp, spec, tokens_B, start_B + j, active_B, *kv, work
            )
        else:
            logits, k, v = kernel.decode_logits(dp, spec.config, tokens_B, start_B + j, *kv)
        return (k, v), logits

    steps = jnp.arange(feed_BxN.shape[1], dtype=jnp.int32)
    kv, logits_NxBxV = jax.lax.scan(step, (state.k, state.v), (feed_BxN.T, steps))
    return jnp.transpose(logits_NxBxV, (1, 0, 2)), state.replace(k=kv[0], v=kv[1])


def _engine(model, layout, max_len, **kw):
    paged = dict(page_size=4, geometry_tokens=(8, 16, 8)) if layout == "paged" else {}
    return EngineCore(model, max_slots=4, max_len=max_len, kv_layout=layout, **paged, **kw)


def _prefill_then_decode(core, full_BxT, lengths_B, n_steps):
    """Caches row b's prompt `full_BxT[b, :lengths_B[b]]` in slot b, then decodes the next
    n_steps true tokens. Returns numpy logits [B, N, V] and the state."""
    rows = np.arange(full_BxT.shape[0])
    state = core.init_decode_state()
    for b in rows:
        prefix = core.prefill(core.params, full_BxT[b, : lengths_B[b]].tolist())
        state = core.insert(prefix, state, [int(b)], [SlotRequest(0, 0, n_steps)])
    # the prompt's last token is the first input, at position length - 1
    feed_BxN = np.zeros((core.spec.max_slots, n_steps), np.int32)  # idle slots feed 0 at 0
    start_B = np.zeros((core.spec.max_slots,), np.int32)
    feed_BxN[rows] = np.stack([full_BxT[rows, lengths_B - 1 + j] for j in range(n_steps)], 1)
    start_B[rows] = lengths_B - 1
    work = core.static_work() if core.paged else None
    logits, state = _decode_scan(core.params, state, work, feed_BxN, start_B, spec=core.spec)
    return np.asarray(logits)[rows], state


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("arch", ["llama", "qwen3", "olmo3"])
@pytest.mark.slow
def test_prefill_and_decode_match_full_forward(tmp_path, arch, layout):
    hf_model = H.build_hf_checkpoint(arch, tmp_path, seed=7)
    core = _engine(models.load_pretrained(tmp_path), layout, max_len=16)
    n_steps = 7
    lengths_B = np.array([6, 3, 1], np.int32)  # prompts of different lengths
    full_BxT = H.random_tokens(3, 6 + n_steps, seed=8)
    decoded_BxNxV, _ = _prefill_then_decode(core, full_BxT, lengths_B, n_steps)
    for b, n in enumerate(lengths_B):
        ref_TxV = H.hf_logits(hf_model, full_BxT[b : b + 1, : n + n_steps])[0]
        np.testing.assert_allclose(
            decoded_BxNxV[b], ref_TxV[n - 1 : n - 1 + n_steps], rtol=0, atol=TOL
        )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.slow
def test_sliding_window_decode_beyond_window(tmp_path, layout):
    """OLMo 3 with W=3 decoding 12 steps past a 2-token prompt: sliding layers must forget
    keys older than 3 positions, the full layer must not."""
    hf_model = H.build_hf_checkpoint("olmo3", tmp_path, seed=9)
    core = _engine(models.load_pretrained(tmp_path), layout, max_len=16)
    assert core.config.sliding_window == 3
    full_BxT = H.random_tokens(2, 14, seed=10)
    decoded_BxNxV, _ = _prefill_then_decode(core, full_BxT, np.array([2, 2], np.int32), 12)
    ref_BxTxV = H.hf_logits(hf_model, full_BxT)
    np.testing.assert_allclose(decoded_BxNxV, ref_BxTxV[:, 1:13], rtol=0, atol=TOL)


@pytest.mark.slow
def test_paged_prefill_writes_only_its_own_pages(tmp_path):
    """A prompt extended into pages [5, 2] of a pool full of sentinels changes those pages
    (padding goes to the trash page 0) and nothing else."""
    H.build_hf_checkpoint("qwen2", tmp_path, seed=11)
    core = _engine(models.load_pretrained(tmp_path), "paged", max_len=16)
    state = core.init_decode_state()
    state = state.replace(k=tuple(jnp.full_like(k, 7.0) for k in state.k))
    row = np.zeros((core.spec.max_pages,), np.int32)
    row[:2] = [5, 2]
    state = core.extend(core.params, state, H.random_tokens(1, 6, seed=12)[0].tolist(), 0, row)
    k = np.asarray(state.k[0])
    changed = {p for p in range(k.shape[1]) if (k[:, p] != 7.0).any()}
    assert changed == {0, 5, 2}
    assert (k[:, 2, 2:] == 7.0).all() and not (k[:, 2, :2] == 7.0).any()  # tokens 4-5 only


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.slow
def test_bfloat16_params_compute_and_cache(tmp_path, layout):
    """bf16 params, compute and cache: the cache really is bf16, logits stay fp32 and within
    bf16 noise of transformers' fp32 logits (but are not bit-equal to the fp32 path)."""
    hf_model = H.build_hf_checkpoint("olmo2", tmp_path, seed=13)
    model = models.load_pretrained(tmp_path, dtype="bfloat16")
    core = _engine(model, layout, max_len=12, cache_dtype="bfloat16")
    full_BxT = H.random_tokens(2, 10, seed=14)
    lengths_B = np.array([6, 4], np.int32)
    decoded_BxNxV, state = _prefill_then_decode(core, full_BxT, lengths_B, 4)
    assert {x.dtype for x in jax.tree.leaves((state.k, state.v))} == {jnp.dtype(jnp.bfloat16)}
    assert decoded_BxNxV.dtype == np.float32
    for b, n in enumerate(lengths_B):
        ref_TxV = H.hf_logits(hf_model, full_BxT[b : b + 1, : n + 4])[0]
        err = np.abs(decoded_BxNxV[b] - ref_TxV[n - 1 : n + 3]).max()
        assert 1e-4 < err < 0.05 * np.abs(ref_TxV).max()
    # The default cache of a bf16 engine on a CPU holds the same bf16 values as fp32
    # (`kernel.storage_dtype`): XLA:CPU would convert a bf16 cache to fp32 and back on every
    # step. What is computed does not change: the logits agree to fp32 summation order.
    held = _engine(model, layout, max_len=12)
    assert held.spec.cache_dtype == "float32" and held.spec.compute_dtype == "bfloat16"
    held_BxNxV, held_state = _prefill_then_decode(held, full_BxT, lengths_B, 4)
    for x in jax.tree.leaves((held_state.k, held_state.v)):
        assert x.dtype == jnp.float32 and (x == x.astype(jnp.bfloat16).astype(x.dtype)).all()
    np.testing.assert_allclose(held_BxNxV, decoded_BxNxV, rtol=0, atol=1e-5)


def test_cache_shapes_and_axes(tmp_path):
    H.build_hf_checkpoint("llama", tmp_path, seed=15)
    model = models.load_pretrained(tmp_path)
    contiguous = _engine(model, "contiguous", max_len=32, cache_dtype="bfloat16")
    assert contiguous.spec.kv_layout.kv_shape(contiguous.spec) == (4, 2, 32, 16)  # [B, K, S, H]
    paged = _engine(model, "paged", max_len=32, kv_pages=20)
    # [K, P, Z, H], trash page included
    assert paged.spec.kv_layout.kv_shape(paged.spec) == (2, 21, 4, 16)
    assert paged.kv_capacity == 80 and contiguous.kv_capacity == 128
    state = paged.init_decode_state()
    assert len(state.k) == model.config.n_layers and state.k[0].dtype == jnp.float32
    # default budget: what the contiguous rows would take (+ the trash page)
    assert _engine(model, "paged", max_len=32).spec.num_pages == 4 * 8 + 1
    with pytest.raises(ValueError, match="kv_pages or kv_cache_gib, not both"):
        _engine(model, "paged", max_len=32, kv_pages=4, kv_cache_gib=1.0)


@pytest.mark.parametrize("arch", ["llama", "olmo3"])
@pytest.mark.slow
def test_contiguous_decode_reads_the_fewest_segments_that_hold_the_rows(tmp_path, arch):
    """`Contiguous.segments`: each layer's cache is four arrays (a quarter of max_len each)
    and a decode step attends over the fewest leading ones that hold every live row's
    position (`lax.switch`), rows crossing from one segment to the next mid-run; the logits
    are the full forward's (OLMo 3's sliding layers included), and logits and caches those of
    reading every segment to fp rounding (the masked keys add exact zeros, in another
    summation order)."""
    hf_model = H.build_hf_checkpoint(arch, tmp_path, seed=12)
    core = _engine(models.load_pretrained(tmp_path), "contiguous", max_len=64)
    assert core.spec.kv_layout.segments(core.spec) == ((0, 16), (16, 16), (32, 16), (48, 16))
    state = core.init_decode_state()
    assert [x.shape[2] for x in state.k[0]] == [16, 16, 16, 16]

    @functools.partial(jax.jit, static_argnums=(4,), donate_argnums=(0,))
    def scan(kv, feed_BxN, start_B, active_B, fewest):
        def step(kv, inputs):
            tokens_B, j = inputs
            positions_B = start_B + j
            span = jnp.max(jnp.where(active_B, positions_B, 0)) + 1 if fewest else None
            logits, k, v = kernel.decode_logits(
                core.params, core.spec.config, tokens_B, positions_B, *kv, span=span
            )
            return (k, v), logits

        steps = jnp.arange(feed_BxN.shape[1], dtype=jnp.int32)
        return jax.lax.scan(step, kv, (feed_BxN.T, steps))

    n_steps, lengths_B = 30, np.array([9, 3, 14], np.int32)  # positions 2..42: three segments
    full_BxT = H.random_tokens(3, 14 + n_steps, seed=13)
    for b in range(3):
        prefix = core.prefill(core.params, full_BxT[b, : lengths_B[b]].tolist())
        state = core.insert(prefix, state, [b], [SlotRequest(0, 0, n_steps)])
    feed_BxN = np.zeros((core.spec.max_slots, n_steps), np.int32)
    start_B = np.zeros((core.spec.max_slots,), np.int32)
    feed_BxN[:3] = np.stack([full_BxT[np.arange(3), lengths_B - 1 + j] for j in range(n_steps)], 1)
    start_B[:3] = lengths_B - 1
    active_B = np.arange(core.spec.max_slots) < 3  # the idle slot sits at position 0
    copies = [jax.tree.map(jnp.array, (state.k, state.v)) for _ in range(2)]
    (k_s, v_s), logits_s = scan(copies[0], feed_BxN, start_B, active_B, True)
    (k_f, v_f), logits_f = scan(copies[1], feed_BxN, start_B, active_B, False)
    for b, n in enumerate(lengths_B):
        ref_TxV = H.hf_logits(hf_model, full_BxT[b : b + 1, : n + n_steps])[0]
        got_NxV = np.asarray(logits_s)[:, b]
        np.testing.assert_allclose(got_NxV, ref_TxV[n - 1 : n - 1 + n_steps], rtol=0, atol=TOL)
        np.testing.assert_allclose(got_NxV, np.asarray(logits_f)[:, b], rtol=0, atol=1e-5)
    for a, b in zip(jax.tree.leaves((k_s, v_s)), jax.tree.leaves((k_f, v_f))):  # fp rounding
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)
    assert core.spec.kv_layout.segments(dataclasses.replace(core.spec, exact=True)) == ((0, 64),)
