"""The SFT objective: layout (vs `batch.collate`), loss (by hand and against transformers +
numpy), global normalisation under micro-batching, and the non-finite guard."""

import math

import helpers_models as H
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers_models import build_hf_checkpoint, hf_logits

from rlvr_jax import models
from rlvr_jax.training import batch as rl_batch
from rlvr_jax.training.learner import init_state
from rlvr_jax.training.sft import collate_sft, make_sft_step, pack_examples, sft_loss

sft_loss_jit = jax.jit(sft_loss, static_argnums=1)

PROMPTS = [[5, 6, 7], [8], [9, 10]]
RESPONSES = [[11, 12], [13, 14, 15, 16], [17]]


def test_collate_sft_matches_rl_collate_layout():
    samples = [
        rl_batch.Sample(prompt_tokens=p, tokens=r, sampler_logp=[0.0] * len(r), advantage=0.0)
        for p, r in zip(PROMPTS, RESPONSES)
    ]
    expected = rl_batch.collate(samples, rows=4, seq_len=8, pad_id=0)
    got = collate_sft(PROMPTS, RESPONSES, rows=4, seq_len=8, pad_id=0)
    assert isinstance(got, rl_batch.TokenBatch) and not isinstance(got, rl_batch.RLBatch)
    for key, value in rl_batch.vars_of(got).items():
        np.testing.assert_array_equal(value, getattr(expected.tokens, key), err_msg=key)
        assert value.shape == (4, 7)


def test_collate_sft_packed_layout_by_hand():
    # Row length 8. Example 0 (3 + 2 = 5 tokens) at offset 0; example 1 (1 + 4 = 5) does not
    # fit after it (5 + 5 > 8): row 1, offset 0; example 2 (2 + 1 = 3) fits after it (5 + 3).
    got = collate_sft(PROMPTS, RESPONSES, rows=2, seq_len=8, pad_id=0, pack=True)
    # rows before the shift: [5 6 7 11 12 0 0 0] and [8 13 14 15 16 9 10 17]
    np.testing.assert_array_equal(
        got.input_ids_BxT, [[5, 6, 7, 11, 12, 0, 0], [8, 13, 14, 15, 16, 9, 10]]
    )
    np.testing.assert_array_equal(
        got.target_ids_BxT, [[6, 7, 11, 12, 0, 0, 0], [13, 14, 15, 16, 9, 10, 17]]
    )
    np.testing.assert_array_equal(
        got.segment_ids_BxT, [[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 2, 2]]
    )
    # positions restart at each example; padding keeps counting (never attended to)
    np.testing.assert_array_equal(got.positions_BxT, [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 0, 1]])
    # a target counts when it is a response token: 11, 12 | 13..16 and 17
    np.testing.assert_array_equal(got.mask_BxT, [[0, 0, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0, 1]])


def test_pack_examples_fills_rows_in_order():
    assert pack_examples([4, 4, 3, 5], rows=2, seq_len=8) == [(0, 0), (0, 4), (1, 0), (1, 3)]
    # the third example would need a third row: only the first two are placed
    assert pack_examples([6, 6, 6], rows=2, seq_len=8) == [(0, 0), (1, 0)]
    with pytest.raises(ValueError, match="example 1 has 9 tokens"):
        pack_examples([2, 9], rows=2, seq_len=8)


@pytest.mark.parametrize(
    "prompts, responses, kwargs, message",
    [
        ([[1], []], [[2], [3]], {}, "example 1 has 0 prompt"),
        ([[1]], [[]], {}, "example 0 has 1 prompt and 0 response"),
        ([[1], [2]], [[3]], {}, "2 prompts but 1 responses"),
        ([[1] * 6], [[2] * 3], {}, "example 0 has 9 tokens > 8"),
        ([[1]] * 3, [[2]] * 3, {}, "3 examples do not fit one per row in 2 rows"),
        ([[1] * 4] * 3, [[2] * 3] * 3, {"pack": True}, "do not fit packed into 2 rows"),
    ],
)
def test_collate_sft_rejects_bad_input(prompts, responses, kwargs, message):
    with pytest.raises(ValueError, match=message):
        collate_sft(prompts, responses, rows=2, seq_len=8, pad_id=0, **kwargs)


def _one_hot_model():
    """V = D = 4, every layer weight 0, norms 1, embedding E = c·I with 2c = ln 3.

    Each layer adds 0 to the residual, so the final hidden state is RMSNorm(c·e_tok) = 2·e_tok
    (rms of c·e_tok is c/2) and logits = 2·e_tok · E^T = 2c·[v == tok] = ln 3 at the input
    token, 0 elsewhere: log p(same token) = ln 3 − ln(3 + 3) = −ln 2, log p(other) = −ln 6.
    """
    arch = H.micro_arch(vocab_size=4, hidden_size=4, intermediate_size=8, rms_norm_eps=1e-12)
    params = models.abstract_params(arch)  # every value is set below: no random init
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    treedef = jax.tree_util.tree_structure(params)

    def value(path, leaf):
        name = jax.tree_util.keystr(path)
        if "norm" in name:
            return jnp.ones(leaf.shape, leaf.dtype)
        if "embedding" in name:
            return jnp.eye(4, dtype=jnp.float32) * (math.log(3.0) / 2)
        return jnp.zeros(leaf.shape, leaf.dtype)

    return arch, jax.tree_util.tree_unflatten(treedef, [value(p, x) for p, x in flat])


def test_sft_loss_by_hand():
    arch, params = _one_hot_model()
    batch = rl_batch.TokenBatch(
        input_ids_BxT=jnp.array([[0, 1, 2, 3]], jnp.int32),
        target_ids_BxT=jnp.array([[1, 2, 2, 1]], jnp.int32),
        positions_BxT=jnp.array([[0, 1, 2, 3]], jnp.int32),
        segment_ids_BxT=jnp.ones((1, 4), jnp.int32),
        mask_BxT=jnp.array([[0.0, 1.0, 1.0, 1.0]]),
    )
    # masked targets: t=1 (1→2, other: ln 6), t=2 (2→2, same: ln 2), t=3 (3→1, other: ln 6)
    # token mean = (2·ln 6 + ln 2) / 3; argmax is the input token: right only at t=2 → 1/3
    loss, metrics = sft_loss_jit(params, arch, batch)
    np.testing.assert_allclose(float(loss), (2 * math.log(6) + math.log(2)) / 3, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["sft/token_accuracy"]), 1 / 3, rtol=1e-6)
    # a global denominator of 10 tokens: the same sum over 10
    loss10, metrics10 = sft_loss_jit(params, arch, batch, loss_denominator=10.0)
    np.testing.assert_allclose(float(loss10), (2 * math.log(6) + math.log(2)) / 10, rtol=1e-5)
    np.testing.assert_allclose(float(metrics10["sft/token_accuracy"]), 1 / 10, rtol=1e-6)


def test_sft_loss_all_masked_is_zero_not_nan():
    arch, params = _one_hot_model()
    batch = collate_sft([[1]], [[2]], rows=2, seq_len=4, pad_id=0)
    batch.mask_BxT[:] = 0.0
    loss, _ = sft_loss_jit(params, arch, batch)
    assert float(loss) == 0.0


@pytest.fixture(scope="module")
def qwen2_pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")
    torch_model = build_hf_checkpoint("qwen2", path, seed=3)
    return torch_model, models.load_pretrained(path)


def _reference_loss(torch_model, prompts, responses):
    """Σ −log p(response token | prefix) / #response tokens, each example run alone through
    transformers, log-softmax in float64 numpy."""
    total, count = 0.0, 0
    for p, r in zip(prompts, responses):
        seq = np.array([p + r])
        logits = hf_logits(torch_model, seq)[0].astype(np.float64)
        logp = (
            logits
            - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
            - logits.max(-1, keepdims=True)
        )
        for j, token in enumerate(r):
            total -= logp[len(p) + j - 1, token]
            count += 1
    return total / count


@pytest.mark.slow
@pytest.mark.parametrize("pack", [False, True])
def test_sft_loss_matches_transformers_reference(qwen2_pair, pack):
    torch_model, model = qwen2_pair
    rng = np.random.default_rng(0)
    lengths = [(3, 5), (1, 7), (6, 2), (4, 4)]
    prompts = [rng.integers(2, 128, n_p).tolist() for n_p, _ in lengths]
    responses = [rng.integers(2, 128, n_r).tolist() for _, n_r in lengths]
    rows = 2 if pack else 4
    batch = collate_sft(prompts, responses, rows=rows, seq_len=17, pad_id=0, pack=pack)
    loss, _ = sft_loss_jit(model.params, model.config, batch)
    np.testing.assert_allclose(
        float(loss), _reference_loss(torch_model, prompts, responses), rtol=2e-5
    )


SGD = optax.sgd(1.0)


@pytest.fixture(scope="module")
def sgd_steps(qwen2_pair):
    """Jitted SFT steps with SGD at lr 1 (new params = params − gradient), by n_micro."""
    _, model = qwen2_pair
    return {n: jax.jit(make_sft_step(model.config, SGD, n_micro=n)) for n in (1, 2)}


@pytest.mark.slow
def test_micro_batching_equals_full_batch_gradient(qwen2_pair, sgd_steps):
    _, model = qwen2_pair
    rng = np.random.default_rng(1)
    # Rows with 1 and 9 response tokens: averaging per-micro-batch means would weight them
    # equally; the global denominator weights every token equally.
    prompts = [rng.integers(2, 128, 2).tolist() for _ in range(4)]
    responses = [rng.integers(2, 128, n).tolist() for n in (1, 1, 9, 9)]
    batch = jax.tree.map(jnp.asarray, collate_sft(prompts, responses, rows=4, seq_len=12, pad_id=0))
    results = {n: step(init_state(model.params, SGD), batch) for n, step in sgd_steps.items()}
    (s1, m1), (s2, m2) = results[1], results[2]
    np.testing.assert_allclose(float(m2["loss"]), float(m1["loss"]), rtol=1e-5)
    np.testing.assert_allclose(
        float(m2["sft/token_accuracy"]), float(m1["sft/token_accuracy"]), atol=1e-6
    )
    assert float(m1["sft/tokens"]) == 20.0
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    # the per-micro-batch average that the global denominator avoids is a different number
    halves = [rl_batch.take_rows(batch, i, i + 2) for i in (0, 2)]
    naive = np.mean([float(sft_loss_jit(model.params, model.config, h)[0]) for h in halves])
    assert abs(naive - float(m1["loss"])) > 1e-3
    assert int(s1.step) == 1 and int(s1.skipped) == 0


@pytest.mark.slow
def test_sft_step_skips_non_finite_updates(qwen2_pair, sgd_steps):
    _, model = qwen2_pair
    params = jax.tree.map(lambda x: x, model.params)
    params["embedding"] = params["embedding"].at[5].set(jnp.nan)
    batch = collate_sft([[5, 6]], [[7, 8]], rows=4, seq_len=12, pad_id=0)
    state, metrics = sgd_steps[1](init_state(params, SGD), batch)
    assert float(metrics["step_ok"]) == 0.0
    assert int(state.step) == 0 and int(state.skipped) == 1
    np.testing.assert_array_equal(
        np.asarray(state.params["layers"]["mlp"]["up_proj"]["kernel"]),
        np.asarray(params["layers"]["mlp"]["up_proj"]["kernel"]),
    )


def test_make_sft_step_rejects_bad_micro_batching():
    arch, params = _one_hot_model()
    with pytest.raises(ValueError, match="n_micro must be >= 1"):
        make_sft_step(arch, SGD, n_micro=0)
    step = make_sft_step(arch, SGD, n_micro=3)
    batch = collate_sft([[1]], [[2]], rows=4, seq_len=4, pad_id=0)
    with pytest.raises(ValueError, match="does not split into 3 micro-batches"):
        step(init_state(params, SGD), batch)
