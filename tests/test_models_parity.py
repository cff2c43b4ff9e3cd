"""Logits parity of the Flax decoder with transformers 5 (fp32, all positions, max |Δ| <= 1e-4).

Reference: the HF torch model itself (eval mode, eager attention, no_grad), built from a tiny
random config and saved with `save_pretrained`; ours is `load_pretrained` of that directory.
"""

from __future__ import annotations

import copy

import helpers_models as H
import numpy as np
import pytest

from rlvr_jax import models

TOL = 1e-4
IMPLS = ("xla", "blockwise", "splash_interpret")
"""Attention kernels that run on CPU (`rlvr_jax.models.attention`; splash in the Pallas
interpreter); `forward`'s default `auto` is blockwise here."""

CASES = {
    "llama": ("llama", {}),
    "llama_tied": ("llama", {"tie_word_embeddings": True}),
    "llama_rope_linear": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "llama_rope_llama3": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    "llama_rope_yarn_bias": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            "attention_bias": True,
            "mlp_bias": True,
        },
    ),
    "qwen2_tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen2_sliding": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
    ),
    "qwen3": ("qwen3", {}),
    "qwen3_yarn_untruncated": (
        "qwen3",
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 2.0,
                "original_max_position_embeddings": 128,
                "beta_fast": 16,
                "truncate": False,
            }
        },
    ),
    "olmo2": ("olmo2", {}),
    "olmo2_tied_mha": ("olmo2", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "olmo3": ("olmo3", {}),
    # legacy top-level rope_theta/rope_scaling: HF gives them to the full-attention layer only,
    # the sliding layers keep Olmo3Config.default_theta (500000)
    "olmo3_yarn_full_layers": (
        "olmo3",
        {
            "rope_theta": 1000.0,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 32,
                "attention_factor": 1.2,
            },
        },
    ),
}


def _load(tmp_path, arch: str, overrides: dict, seed: int = 0):
    hf_model = H.build_hf_checkpoint(arch, tmp_path, seed=seed, **copy.deepcopy(overrides))
    return hf_model, models.load_pretrained(tmp_path)


@pytest.mark.parametrize(
    "case",  # the fast tier checks olmo3 (sliding + full layers, QK-norm, post-norm)
    [pytest.param(c, marks=() if c == "olmo3" else pytest.mark.slow) for c in sorted(CASES)],
)
def test_logits_match_transformers(tmp_path, case):
    arch, overrides = CASES[case]
    hf_model, model = _load(tmp_path, arch, overrides)
    tokens_BxT = H.random_tokens(2, 24, seed=1)
    # positions 40..63 put the scaled RoPE frequencies (and yarn's ramp) to work
    positions_BxT = np.broadcast_to(np.arange(40, 64, dtype=np.int32), tokens_BxT.shape)
    ref = H.hf_logits(hf_model, tokens_BxT, positions_BxT=positions_BxT)
    assert np.abs(ref).max() > 1.0  # the comparison is not between near-zero logits
    for impl in ("auto", "xla"):
        ours = np.asarray(
            models.forward(model, tokens_BxT, positions_BxT=positions_BxT, attention_impl=impl)
        )
        assert ours.dtype == np.float32 and ours.shape == ref.shape == (2, 24, H.VOCAB)
        np.testing.assert_allclose(ours, ref, rtol=0, atol=TOL, err_msg=impl)


@pytest.mark.slow
def test_config_variants_are_not_interchangeable(tmp_path):
    """Negative control: the parity tolerance does detect an architecture detail (here,
    dropping the sliding window of OLMo 3 changes the logits far beyond 1e-4)."""
    import dataclasses

    hf_model, model = _load(tmp_path, "olmo3", {})
    full_config = dataclasses.replace(
        model.config, layer_types=("full_attention",) * model.config.n_layers
    )
    wrong = dataclasses.replace(model, config=full_config)
    tokens_BxT = H.random_tokens(1, 16, seed=2)
    ref = H.hf_logits(hf_model, tokens_BxT)
    ours = np.asarray(models.forward(model, tokens_BxT))
    bad = np.asarray(models.forward(wrong, tokens_BxT))
    assert np.abs(ours - ref).max() <= TOL
    assert np.abs(bad - ref).max() > 100 * TOL
    # with a window of 3, positions 0..2 see the same keys either way
    np.testing.assert_allclose(bad[:, :3], ref[:, :3], rtol=0, atol=TOL)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("arch", ["llama", "olmo3"])
@pytest.mark.slow
def test_left_and_right_padding(tmp_path, arch, impl):
    hf_model, model = _load(tmp_path, arch, {})
    tokens_BxT = H.random_tokens(4, 10, seed=3)
    lengths = [10, 7, 4, 0]  # the last row is all padding
    left_BxT = np.zeros_like(tokens_BxT)
    right_BxT = np.zeros_like(tokens_BxT)
    for b, n in enumerate(lengths):
        left_BxT[b, 10 - n :] = 1
        right_BxT[b, :n] = 1
    for mask_BxT in (left_BxT, right_BxT):
        padded_BxT = np.where(mask_BxT == 1, tokens_BxT, 0)
        ours = np.asarray(models.forward(model, padded_BxT, mask_BxT=mask_BxT, attention_impl=impl))
        for b in range(len(lengths)):
            assert np.isfinite(ours[b]).all()
            if lengths[b] == 0:
                continue
            # reference: the row's real tokens alone, unpadded
            real = padded_BxT[b][mask_BxT[b] == 1][None]
            ref = H.hf_logits(hf_model, real)[0]
            np.testing.assert_allclose(ours[b][mask_BxT[b] == 1], ref, rtol=0, atol=TOL)


@pytest.mark.smoke("models")
def test_left_padding_matches_hf_padded_batch(tmp_path):
    """Same batch through HF with attention_mask and generate-style position ids."""
    hf_model, model = _load(tmp_path, "qwen3", {})
    tokens_BxT = H.random_tokens(2, 9, seed=4)
    mask_BxT = np.ones_like(tokens_BxT)
    mask_BxT[1, :4] = 0
    positions_BxT = np.cumsum(mask_BxT, axis=1) - 1
    positions_BxT[mask_BxT == 0] = 1  # what HF generate puts at pads
    ours = np.asarray(models.forward(model, tokens_BxT, mask_BxT=mask_BxT))
    ref = H.hf_logits(hf_model, tokens_BxT, mask_BxT=mask_BxT, positions_BxT=positions_BxT)
    real = mask_BxT == 1
    np.testing.assert_allclose(ours[real], ref[real], rtol=0, atol=TOL)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("arch", ["llama", "olmo3"])
@pytest.mark.slow
def test_packed_rows_attend_within_segments(tmp_path, arch, impl):
    hf_model, model = _load(tmp_path, arch, {"tie_word_embeddings": True})
    rng = np.random.default_rng(5)
    # row 0: segments of 5, 3 and 4 tokens; row 1: 7 tokens then 2 pads; positions restart
    row0 = [rng.integers(2, H.VOCAB, n).astype(np.int32) for n in (5, 3, 4)]
    row1 = [rng.integers(2, H.VOCAB, 7).astype(np.int32)]
    tokens_BxT = np.zeros((2, 12), np.int32)
    positions_BxT = np.zeros((2, 12), np.int32)
    mask_BxT = np.zeros((2, 12), np.int32)
    tokens_BxT[0] = np.concatenate(row0)
    positions_BxT[0] = np.concatenate([np.arange(len(s)) for s in row0])
    mask_BxT[0] = 1
    tokens_BxT[1, :7] = row1[0]
    positions_BxT[1, :7] = np.arange(7)
    mask_BxT[1, :7] = 1
    ours = np.asarray(
        models.forward(
            model, tokens_BxT, positions_BxT=positions_BxT, mask_BxT=mask_BxT, attention_impl=impl
        )
    )
    assert np.isfinite(ours).all()
    for b, segments in enumerate((row0, row1)):
        start = 0
        for seg in segments:
            ref = H.hf_logits(hf_model, seg[None])[0]
            np.testing.assert_allclose(ours[b, start : start + len(seg)], ref, rtol=0, atol=TOL)
            start += len(seg)
