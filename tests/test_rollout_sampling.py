"""The in-step sampler: greedy, temperature, top-k, top-p, keyed randomness, log-probs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from rlvr_jax.rollout.device.sampling import (
    SamplerMode,
    SamplingParams,
    filter_mask,
    sample_tokens,
    uniform_from_key,
)

BOTH = SamplerMode(top_k=True, top_p=True)


def _draw(logits_V, n, *, temperature=1.0, top_k=0, top_p=1.0, mode=None, seed=7):
    """n draws from one logits row: n rows that differ only in their sample index."""
    mode = SamplerMode() if mode is None else mode
    logits_NxV = jnp.broadcast_to(jnp.asarray(logits_V, jnp.float32), (n, len(logits_V)))
    fn = jax.jit(sample_tokens, static_argnames="mode")
    return fn(
        logits_NxV,
        temperature_B=jnp.full((n,), temperature, jnp.float32),
        top_k_B=jnp.full((n,), top_k, jnp.int32),
        top_p_B=jnp.full((n,), top_p, jnp.float32),
        seed_B=jnp.full((n,), seed, jnp.uint32),
        sample_B=jnp.arange(n, dtype=jnp.int32),
        position_B=jnp.full((n,), 11, jnp.int32),
        mode=mode,
    )


def _chi_square_pvalue(tokens, probs):
    """p-value of the observed token counts under `probs` (bins with expected < 5 merged)."""
    n = len(tokens)
    observed = np.bincount(np.asarray(tokens), minlength=len(probs)).astype(np.float64)
    assert observed[probs == 0].sum() == 0, "sampled a token of probability 0"
    expected = probs * n
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs, exp).pvalue


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def test_frequencies_match_softmax_at_temperature():
    # V = 300 spans three 128-token blocks (the last one padded), so block selection,
    # in-block selection and padding are all exercised.
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 1.5, 300).astype(np.float32)
    tokens, logprobs = _draw(logits, 40_000, temperature=0.7)
    probs = _softmax(logits.astype(np.float64) / 0.7)
    assert _chi_square_pvalue(tokens, probs) > 1e-3
    # Reported log-prob = log softmax(logits / T)[token].
    np.testing.assert_allclose(logprobs, np.log(probs)[np.asarray(tokens)], rtol=0, atol=2e-5)


def test_sampler_detects_a_wrong_distribution():
    # The same draws are far from the T=1 distribution: the statistical test has power.
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 1.5, 300).astype(np.float32)
    tokens, _ = _draw(logits, 40_000, temperature=0.7)
    assert _chi_square_pvalue(tokens, _softmax(logits.astype(np.float64))) < 1e-6


def test_top_k_top_p_hand_derived():
    # probs 0.5, 0.2, 0.15, 0.1, 0.05 (logits = log probs).
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05], np.float32))
    # top_k = 2: {0, 1} renormalised by 0.7 -> 5/7, 2/7.
    tok, _ = _draw(logits, 20_000, top_k=2, mode=BOTH)
    assert _chi_square_pvalue(tok, np.array([5 / 7, 2 / 7, 0, 0, 0])) > 1e-3
    # top_p = 0.8: mass strictly above each token: 0, .5, .7, .85, .95 -> keep {0, 1, 2};
    # renormalised by 0.85.
    tok, _ = _draw(logits, 20_000, top_p=0.8, mode=BOTH)
    assert _chi_square_pvalue(tok, np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85) > 1e-3
    # top_k = 3 then top_p = 0.7 on the renormalised top-3 (.588, .235, .176):
    # mass above: 0, .588, .824 -> keep {0, 1}; probs 0.5/0.7, 0.2/0.7.
    tok, logp = _draw(logits, 20_000, top_k=3, top_p=0.7, mode=BOTH)
    assert _chi_square_pvalue(tok, np.array([5 / 7, 2 / 7, 0, 0, 0])) > 1e-3
    # Log-probs stay those of the unfiltered distribution (ALGORITHMS.md convention).
    np.testing.assert_allclose(
        logp, np.log([0.5, 0.2, 0.15, 0.1, 0.05])[np.asarray(tok)], atol=1e-6
    )


@pytest.mark.slow
def test_filter_mask_matches_transformers_warpers():
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2.0, (6, 500)).astype(np.float32)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    for top_k, top_p in [(5, 1.0), (0, 0.9), (40, 0.5), (0, 0.3), (1, 1.0)]:
        scores = torch.from_numpy(logits.copy())
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p < 1.0:
            scores = TopPLogitsWarper(top_p)(None, scores)
        want = np.isfinite(scores.numpy())
        got = filter_mask(
            jnp.asarray(p),
            jnp.full((6,), top_k, jnp.int32),
            jnp.full((6,), top_p, jnp.float32),
            BOTH,
        )
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=f"{top_k=} {top_p=}")


@pytest.mark.slow
def test_greedy_is_first_argmax_with_temperature_one_logprob():
    logits = jnp.array([[1.0, 3.0, 3.0, 0.0], [0.0, -1.0, 2.0, 2.5]], jnp.float32)
    tokens, logprobs = sample_tokens(
        logits,
        temperature_B=jnp.zeros((2,)),
        top_k_B=jnp.zeros((2,), jnp.int32),
        top_p_B=jnp.ones((2,)),
        seed_B=jnp.zeros((2,), jnp.uint32),
        sample_B=jnp.zeros((2,), jnp.int32),
        position_B=jnp.zeros((2,), jnp.int32),
    )
    np.testing.assert_array_equal(tokens, [1, 3])
    # Row 0: log(e^3 / (e^1 + 2e^3 + e^0)); row 1: log(e^2.5 / (1 + e^-1 + e^2 + e^2.5)).
    want = [
        3 - np.log(np.e + 2 * np.e**3 + 1),
        2.5 - np.log(1 + np.exp(-1) + np.e**2 + np.exp(2.5)),
    ]
    np.testing.assert_allclose(logprobs, want, rtol=1e-6)


@pytest.mark.slow
def test_randomness_keyed_by_request_not_row():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(8, 257)), jnp.float32)
    seed = jnp.array([3, 3, 3, 9, 9, 1, 2, 2], jnp.uint32)
    sample = jnp.array([0, 1, 2, 0, 1, 0, 5, 6], jnp.int32)
    pos = jnp.array([4, 4, 4, 70, 70, 1, 9, 9], jnp.int32)
    kw = dict(temperature_B=jnp.ones((8,)), top_k_B=jnp.zeros((8,), jnp.int32))
    kw["top_p_B"] = jnp.ones((8,))
    tok, lp = sample_tokens(logits, seed_B=seed, sample_B=sample, position_B=pos, **kw)
    perm = np.array([5, 2, 7, 0, 3, 6, 1, 4])
    tok_p, lp_p = sample_tokens(
        logits[perm], seed_B=seed[perm], sample_B=sample[perm], position_B=pos[perm], **kw
    )
    np.testing.assert_array_equal(np.asarray(tok)[perm], tok_p)
    np.testing.assert_allclose(np.asarray(lp)[perm], lp_p, rtol=1e-6)


def test_uniforms_are_uniform_and_distinct_per_key():
    n = 65_536
    idx = jnp.arange(n, dtype=jnp.int32)
    by_position = uniform_from_key(jnp.zeros((n,), jnp.uint32), jnp.zeros_like(idx), idx, 1)
    by_sample = uniform_from_key(jnp.full((n,), 5, jnp.uint32), idx, jnp.zeros_like(idx), 1)
    by_seed = uniform_from_key(idx.astype(jnp.uint32), jnp.zeros_like(idx), jnp.zeros_like(idx), 1)
    for u in (by_position, by_sample, by_seed):
        u = np.asarray(u)
        assert u.min() > 0.0 and u.max() < 1.0
        counts = np.histogram(u, bins=64, range=(0, 1))[0]
        assert stats.chisquare(counts).pvalue > 1e-3
    # Lag-1 correlation along positions is what a weak hash would show.
    u = np.asarray(by_position)
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.02


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-0.5)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-1)
    assert SamplingParams(temperature=0.0).greedy
    mode = SamplerMode.for_params([SamplingParams(), SamplingParams(top_p=0.9)])
    assert mode == SamplerMode(top_k=False, top_p=True)
    assert SamplerMode.for_params([SamplingParams(temperature=0.0, top_k=3)]) == SamplerMode()
