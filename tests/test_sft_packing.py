"""SFT shares the RL batches' packer: with a token budget (`train.max_tokens_per_micro_batch`)
`collate_sft` packs examples by `packing.pack_tokens`, the batch carries its micro-batch count,
and the SFT step on it equals the step on one example per row."""

import helpers_models as H
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_packing import SEQ  # rows of 33 tokens

from rlvr_jax import models
from rlvr_jax.training import learner
from rlvr_jax.training.batch import collate_sft
from rlvr_jax.training.packing import pack_tokens
from rlvr_jax.training.sft import make_sft_step

ARCH = H.tiny_arch()  # the learner tests' model


def _examples(n: int = 10, seed: int = 0) -> tuple[list, list]:
    rng = np.random.default_rng(seed)
    prompts, responses = [], []
    for _ in range(n):
        n_p = int(rng.integers(1, 8))
        n_r = int(rng.integers(1, SEQ - n_p + 1))
        prompts.append(rng.integers(3, 64, n_p).tolist())
        responses.append(rng.integers(3, 64, n_r).tolist())
    return prompts, responses


def test_a_token_budget_packs_sft_examples_with_the_rl_packer():
    prompts, responses = _examples()
    budget = 2 * SEQ
    packed = collate_sft(prompts, responses, rows=10, seq_len=SEQ, pad_id=0, max_tokens=budget)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    layout = pack_tokens(lengths, row_len=SEQ, max_tokens=budget)
    assert packed.n_micro == layout.n_micro > 1 and packed.rows == layout.rows < 10
    # the same response tokens are trained on, each example one segment restarting at 0
    assert packed.mask_BxT.sum() == sum(len(r) for r in responses)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        row, offset = layout.row(i), layout.places[i][2]
        seq = [*p, *r]
        ids = packed.input_ids_BxT[row, offset : offset + len(seq) - 1]
        np.testing.assert_array_equal(ids, seq[:-1])
        assert packed.positions_BxT[row, offset] == 0
    unpacked = collate_sft(prompts, responses, rows=10, seq_len=SEQ, pad_id=0)
    assert unpacked.n_micro == 0 and unpacked.rows == 10


def test_an_example_over_the_budget_names_it_and_the_key():
    prompts, responses = _examples()
    with pytest.raises(ValueError, match=r"SFT example \d+ .*train\.max_tokens_per_micro_batch"):
        collate_sft(prompts, responses, rows=10, seq_len=SEQ, pad_id=0, max_tokens=20)


@pytest.mark.slow
def test_packed_sft_step_equals_one_example_per_row():
    prompts, responses = _examples(seed=1)
    params = models.init_params(ARCH, jax.random.key(0))
    opt = optax.sgd(0.5)
    unpacked = collate_sft(prompts, responses, rows=10, seq_len=SEQ, pad_id=0)
    packed = collate_sft(prompts, responses, rows=10, seq_len=SEQ, pad_id=0, max_tokens=2 * SEQ)
    plain = jax.jit(make_sft_step(ARCH, opt, n_micro=2))
    packing = jax.jit(make_sft_step(ARCH, opt))  # the batch's own micro-batch count
    a_state, a = plain(learner.init_state(params, opt), jax.tree.map(jnp.asarray, unpacked))
    b_state, b = packing(learner.init_state(params, opt), jax.tree.map(jnp.asarray, packed))
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=2e-5, atol=2e-6, err_msg=key)
    for x, y in zip(jax.tree.leaves(a_state.params), jax.tree.leaves(b_state.params)):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)
