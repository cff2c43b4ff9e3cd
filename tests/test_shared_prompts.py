"""Shared-prompt rows (`batch.collate_shared`, `train.share_prompts`): a group's prompt laid
out once before its G completions gives the same per-completion log-probs, entropies, losses
and gradients as one completion per row (issue 21: the demo's learner read each prompt G
times)."""

from __future__ import annotations

import helpers_models as H
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import models
from rlvr_jax.models.layers import same_segment
from rlvr_jax.training import learner
from rlvr_jax.training.batch import Sample, collate, collate_shared

ARCH = H.tiny_arch()
G = 3


def samples(seed: int = 0, groups: int = 4) -> list[Sample]:
    """`groups` groups of G completions of different lengths (1..9 tokens) sharing a prompt."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        prompt = rng.integers(3, ARCH.vocab_size, size=int(rng.integers(2, 12))).tolist()
        for j in range(G):
            n = int(rng.integers(1, 10))
            out.append(
                Sample(
                    prompt_tokens=prompt,
                    tokens=rng.integers(3, ARCH.vocab_size, size=n).tolist(),
                    sampler_logp=(-rng.random(n)).tolist(),
                    advantage=float(rng.normal()),
                    reward=float(j == 0),
                    sampled=[k != 1 for k in range(n)] if (g, j) == (1, 2) else None,
                    lag=[(k + j) % 2 for k in range(n)],  # (`mismatch/*`, `lag/kl`)
                )
            )
    return out


def completion_view(batch, ss, length: int):
    """`collate`'s per-slot arrays cut to each completion's own positions (shared rows' view)."""

    def cut(x):
        out = np.zeros((len(ss), length, *np.shape(x)[2:]), np.asarray(x).dtype)
        for b, s in enumerate(ss):
            first = len(s.prompt_tokens) - 1
            out[b, : len(s.tokens)] = np.asarray(x)[b, first : first + len(s.tokens)]
        return out

    return cut


def test_same_segment_sees_the_groups_prompt_and_its_own_branch():
    # ids of group 1 with M = 4 branches: 4 = prompt, 5..7 = completions; 8 = group 2's prompt
    seg = jnp.asarray([0, 4, 5, 6, 8, 9])
    seen = np.asarray(same_segment(seg[:, None], seg[None, :], 4))
    want = np.array(
        [
            [1, 0, 0, 0, 0, 0],  # padding (group 0) sees padding only
            [0, 1, 0, 0, 0, 0],  # a prompt token sees its prompt
            [0, 1, 1, 0, 0, 0],  # completion 0 sees the prompt and itself
            [0, 1, 0, 1, 0, 0],  # completion 1: not completion 0
            [0, 0, 0, 0, 1, 0],  # another group's prompt
            [0, 0, 0, 0, 1, 1],
        ],
        bool,
    )
    np.testing.assert_array_equal(seen, want)
    np.testing.assert_array_equal(
        np.asarray(same_segment(seg[:, None], seg[None, :])), np.eye(6, dtype=bool)
    )


@pytest.mark.parametrize("impl", [pytest.param("blockwise", marks=pytest.mark.slow), "xla"])
def test_shared_rows_give_each_completion_its_own_logprobs_and_gradients(impl):
    ss = samples()
    seq_len = max(len(s.prompt_tokens) + len(s.tokens) for s in ss)
    flat = collate(ss, rows=len(ss), seq_len=seq_len, pad_id=0)
    shared, slots = collate_shared(
        ss, group_size=G, rows=len(ss), row_len=48, pad_id=0, slot_len=10
    )
    assert shared.tokens.input_ids_BxT.shape == (4, 48) and shared.tokens.branches == G + 1
    assert shared.mask_BxT.shape == (12, 10)  # the completions' own positions only
    np.testing.assert_array_equal(slots, np.arange(len(ss)))
    cut = completion_view(flat, ss, 10)
    for key in ("mask_BxT", "sampler_logp_BxT", "rewards_BxT", "lag_BxT"):
        np.testing.assert_array_equal(getattr(shared, key), cut(getattr(flat, key)), err_msg=key)
    np.testing.assert_array_equal(shared.advantages_B, flat.advantages_B)
    # a batch of 5 groups' slots with 4 groups present: the fifth row and its slots are empty
    roomy, _ = collate_shared(ss, group_size=G, rows=len(ss) + G, row_len=48, pad_id=0, slot_len=10)
    assert roomy.tokens.input_ids_BxT.shape == (5, 48) and roomy.mask_BxT.shape[0] == 15
    assert not roomy.mask_BxT[12:].any() and not roomy.tokens.segment_ids_BxT[4].any()

    params = models.init_params(ARCH, jax.random.key(1))
    memory = learner.MemoryOptions(attention_impl=impl)
    # a weight per completion token (its index + 1), laid out on either view
    weights = np.zeros(shared.mask_BxT.shape, np.float32)
    weights[:] = np.arange(1.0, 11.0)
    flat_weights = np.zeros(flat.mask_BxT.shape, np.float32)
    for b, s in enumerate(ss):
        first = len(s.prompt_tokens) - 1
        flat_weights[b, first : first + len(s.tokens)] = weights[b, : len(s.tokens)]

    def run(batch, w):
        def f(p):
            logp, ent = learner.sequence_logprobs(
                p, ARCH, batch, compute_dtype=jnp.float32, temperature=0.7,
                with_entropy=True, memory=memory,
            )  # fmt: skip
            return jnp.sum(logp * batch.mask_BxT * w), (logp, ent)

        # one program: op by op the gradient took 16 s (blockwise) and 2-5.5 s (xla)
        grad_fn = jax.jit(jax.value_and_grad(f, has_aux=True))
        (_, (logp, ent)), grads = grad_fn(params)
        return np.asarray(logp * batch.mask_BxT), np.asarray(ent * batch.mask_BxT), grads

    want_logp, want_ent, want_grads = run(jax.tree.map(jnp.asarray, flat), flat_weights)
    logp, ent, grads = run(jax.tree.map(jnp.asarray, shared), weights)
    assert float(np.abs(want_logp).sum()) > 1.0
    np.testing.assert_allclose(logp, cut(want_logp), atol=2e-5)
    np.testing.assert_allclose(ent, cut(want_ent), atol=2e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-4)


def test_shared_rows_packed_to_a_budget_per_mini_batch():
    ss = samples(seed=3, groups=6)
    seq_len = max(len(s.prompt_tokens) + len(s.tokens) for s in ss)
    flat = collate(ss, rows=len(ss), seq_len=seq_len, pad_id=0)
    shared, slots = collate_shared(
        ss,
        group_size=G,
        rows=len(ss),
        row_len=40,
        pad_id=0,
        slot_len=10,
        max_tokens=80,
        updates=2,
    )
    assert shared.tokens.n_micro % 2 == 0  # the two mini-batches' micro-batches
    params = models.init_params(ARCH, jax.random.key(2))
    fn = learner.make_logprob_fn(ARCH, compute_dtype=jnp.float32, temperature=1.0)
    want = fn(params, jax.tree.map(jnp.asarray, flat)) * flat.mask_BxT
    got = np.asarray(fn(params, jax.tree.map(jnp.asarray, shared)))[slots]
    np.testing.assert_allclose(
        got * shared.mask_BxT[slots], completion_view(flat, ss, 10)(want), atol=2e-5
    )


def test_collate_shared_refuses_what_it_cannot_lay_out():
    ss = samples()
    with pytest.raises(ValueError, match="whole groups of 3"):
        collate_shared(ss[:-1], group_size=G, rows=12, row_len=48, pad_id=0, slot_len=20)
    with pytest.raises(ValueError, match="does not share one prompt"):
        collate_shared(ss[1:] + ss[:1], group_size=G, rows=12, row_len=48, pad_id=0, slot_len=20)
    with pytest.raises(ValueError, match=r"group 0 has .* tokens > a row of 8"):
        collate_shared(ss, group_size=G, rows=12, row_len=8, pad_id=0, slot_len=20)


@pytest.mark.slow
def test_groups_packed_into_the_fewest_rows_match_one_group_a_row():
    """`pack=True` (a step of one micro-batch, `RolloutSource` sets it): several groups to a
    row and groups split over rows after copies of their prompt, the row count on the ladder,
    every mini-batch alike; the log-probs and the loss's gradient are those of one group a
    row."""
    ss = samples(seed=5, groups=8)
    lengths = [
        len(ss[i].prompt_tokens) + sum(len(s.tokens) for s in ss[i : i + G])
        for i in range(0, len(ss), G)
    ]
    assert max(lengths) == 27 and sum(lengths[:4]) == 85 and sum(lengths[4:]) == 92
    # rows of 36: each mini-batch's groups take ladder(ceil(85 or 92 / 36)) = 3 rows, which
    # they fill only with some groups split over rows
    kwargs = dict(group_size=G, rows=len(ss), row_len=36, pad_id=0, slot_len=10)
    one, one_slots = collate_shared(ss, updates=2, **kwargs)
    packed, slots = collate_shared(ss, updates=2, pack=True, **kwargs)
    np.testing.assert_array_equal(slots, one_slots)  # slot i = sample i, as unpacked
    assert one.tokens.rows == 8 and packed.tokens.rows == 6  # 2 mini-batches alike
    assert packed.tokens.rows < one.tokens.rows and packed.tokens.n_micro == 0
    per_row = (packed.tokens.segment_ids_BxT // (G + 1)).max(axis=1)
    assert per_row.max() >= 2  # some row holds two groups (or parts of groups)
    prompts = (packed.tokens.segment_ids_BxT % (G + 1) == 0) & (packed.tokens.segment_ids_BxT > 0)
    copies = sum(len(np.unique(row[p])) for row, p in zip(packed.tokens.segment_ids_BxT, prompts))
    assert copies > 8  # some group's prompt laid out twice: the group was split
    for key in ("mask_BxT", "sampler_logp_BxT", "advantages_B", "targets_BxT"):
        np.testing.assert_array_equal(getattr(packed, key), getattr(one, key), err_msg=key)

    params = models.init_params(ARCH, jax.random.key(3))
    fn = learner.make_logprob_fn(ARCH, compute_dtype=jnp.float32, temperature=1.0)
    whole, _ = collate_shared(ss, **kwargs)  # one mini-batch

    def logp(batch):
        return np.asarray(fn(params, jax.tree.map(jnp.asarray, batch))) * batch.mask_BxT

    want = logp(whole)
    assert float(np.abs(want).sum()) > 1.0
    # the whole batch's forward (old and reference log-probs) reads every mini-batch's slots
    # from their own rows (it read the second's from the first's rows before)
    np.testing.assert_allclose(logp(one), want, atol=2e-5)
    np.testing.assert_allclose(logp(packed), want, atol=2e-5)

    def grads(batch):
        def f(p):
            logp = learner.sequence_logprobs(
                p, ARCH, batch, compute_dtype=jnp.float32, temperature=1.0
            )
            return jnp.sum(logp * batch.mask_BxT * batch.advantages_B[:, None])

        return jax.grad(f)(params)

    for a, b in zip(
        jax.tree.leaves(grads(jax.tree.map(jnp.asarray, packed))),
        jax.tree.leaves(grads(jax.tree.map(jnp.asarray, one))),
    ):
        np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-4)
