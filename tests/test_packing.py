"""Packed RL batches: the token-budget layout (never splits a sequence, never exceeds the
budget), and packed == unpacked for the loss, its gradient and every metric, for every
aggregation, TIS and KL mode, with micro-batch accumulation."""

import itertools

import helpers_models as H
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax import losses, models
from rlvr_jax.training import learner
from rlvr_jax.training.batch import Sample, collate, collate_packed, mini_batch
from rlvr_jax.training.packing import ladder, pack_tokens

ARCH = H.tiny_arch()  # the learner tests' model

SEQ = 33  # tokens per row before the shift: T = 32


def test_pack_tokens_keeps_sequences_whole_and_within_the_budget():
    rng = np.random.default_rng(0)
    for _ in range(300):
        row_len = int(rng.integers(8, 64))
        max_tokens = row_len * int(rng.integers(1, 6)) + int(rng.integers(0, row_len))
        multiple = int(rng.choice([1, 2]))
        if max_tokens // row_len < multiple:
            continue
        lengths = rng.integers(1, row_len + 1, int(rng.integers(0, 40))).tolist()
        layout = pack_tokens(lengths, row_len=row_len, max_tokens=max_tokens, row_multiple=multiple)
        assert layout.rows_per_micro * row_len <= max_tokens
        assert layout.rows_per_micro % multiple == 0 and layout.seqs_per_micro % multiple == 0
        assert layout.n_micro == ladder(layout.n_micro)
        used: dict[tuple[int, int], list[tuple[int, int]]] = {}
        slots = set()
        for i, (m, r, o, s) in enumerate(layout.places):
            assert 0 <= m < layout.n_micro and 0 <= r < layout.rows_per_micro
            assert 0 <= s < layout.seqs_per_micro
            used.setdefault((m, r), []).append((o, o + lengths[i]))
            slots.add((m, s))
        assert len(slots) == len(lengths)  # one slot per sequence
        for spans in used.values():  # within the row, never overlapping
            spans.sort()
            assert spans[-1][1] <= row_len
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_a_sequence_over_the_budget_is_an_error_naming_it_and_the_key():
    with pytest.raises(ValueError, match=r"sequence 1 has 40 tokens.*max_tokens_per_micro_batch"):
        pack_tokens([10, 40], row_len=64, max_tokens=32)
    with pytest.raises(ValueError, match=r"raise train\.max_tokens_per_micro_batch"):
        pack_tokens([10], row_len=64, max_tokens=32)


def samples(seed: int = 0, groups: int = 3, group_size: int = 4) -> list[Sample]:
    """Completions of several groups with varied lengths; the longest fills a row alone."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(groups):
        prompt = rng.integers(3, 60, int(rng.integers(2, 9))).tolist()
        for _ in range(group_size):
            n = int(rng.integers(1, 12))
            out.append(
                Sample(
                    prompt_tokens=prompt,
                    tokens=rng.integers(3, 60, n).tolist(),
                    sampler_logp=(-rng.random(n) * 3).tolist(),
                    advantage=float(rng.normal()),
                    train=bool(rng.random() > 0.1),
                    lag=rng.integers(0, 2, n).tolist(),  # sampled by the learner's params or not
                )
            )
    out[5] = Sample([7] * 8, list(range(3, 3 + SEQ - 8)), [-1.0] * (SEQ - 8), 0.7)  # full row
    return out


def batches(updates: int = 1, max_tokens: int = 96):
    s = samples()
    unpacked = collate(s, rows=len(s), seq_len=SEQ, pad_id=0)
    packed, slots = collate_packed(
        s, rows=len(s), seq_len=SEQ, pad_id=0, max_tokens=max_tokens, updates=updates
    )
    return unpacked, packed, slots


def test_packed_layout_holds_several_completions_per_row_and_the_same_completions():
    unpacked, packed, slots = batches()
    assert packed.tokens.n_micro > 1  # micro-batches by tokens
    assert packed.tokens.rows < unpacked.tokens.rows  # fewer rows: several per row
    assert (packed.tokens.segment_ids_BxT.max(axis=1) > 1).any()
    # the longest completion fills a row on its own
    full_rows = (packed.tokens.segment_ids_BxT > 0).all(axis=1)
    assert full_rows.sum() >= 1
    # the per-completion arrays are the unpacked ones, slot by slot
    for name in ("mask_BxT", "sampler_logp_BxT", "advantages_B", "lag_BxT"):
        np.testing.assert_array_equal(getattr(packed, name)[slots], getattr(unpacked, name))
    # and each completion's targets are where its gather points
    flat = packed.tokens.target_ids_BxT.reshape(-1)
    rows_per_micro = packed.tokens.rows // packed.tokens.n_micro
    T = SEQ - 1
    for i, b in enumerate(slots):
        m = b // (packed.mask_BxT.shape[0] // packed.tokens.n_micro)
        on = unpacked.mask_BxT[i] > 0
        got = flat[m * rows_per_micro * T + packed.gather_BxT[b][on] % (rows_per_micro * T)]
        np.testing.assert_array_equal(got, unpacked.tokens.target_ids_BxT[i][on])


SETTINGS = [
    ("olmo3", {}),
    ("grpo", {}),  # seq-mean-token-mean, KL in the loss
    ("drgrpo", {}),  # seq-mean-token-sum-norm
    ("gspo", {}),  # sequence-level ratios
    ("olmo3", {"agg": "seq-mean-token-sum"}),
    ("olmo3", {"tis_mode": "sequence"}),
    ("olmo3", {"tis_mode": "geometric"}),
    ("olmo3", {"tis_mode": "mask", "tis_cap": None, "tis_low": 0.5, "tis_high": 5.0}),
    ("olmo3", {"kl_coef": 0.05, "kl_estimator": "k2"}),
]


@pytest.mark.slow
@pytest.mark.parametrize("preset, overrides", SETTINGS)
def test_packed_equals_unpacked(preset, overrides):
    settings = losses.resolve_loss_settings(preset, **overrides)
    params = models.init_params(ARCH, jax.random.key(0))
    opt = optax.sgd(0.5)
    unpacked, packed, slots = batches()
    rng = np.random.default_rng(1)
    shape = unpacked.mask_BxT.shape  # old == sampler on about half the tokens (mismatch/*)
    old = unpacked.sampler_logp_BxT + 0.1 * rng.standard_normal(shape) * (rng.random(shape) < 0.5)
    ref = unpacked.sampler_logp_BxT - 0.2
    unpacked = unpacked.replace(old_logp_BxT=old.astype(np.float32), ref_logp_BxT=ref)
    packed_old = np.zeros_like(packed.mask_BxT)
    packed_old[slots] = old
    packed_ref = np.zeros_like(packed.mask_BxT)
    packed_ref[slots] = ref
    packed = packed.replace(old_logp_BxT=packed_old, ref_logp_BxT=packed_ref)
    kw = dict(max_len=24, with_entropy=True)
    plain = jax.jit(learner.make_train_step(ARCH, opt, settings, n_micro=3, **kw))
    packing = jax.jit(learner.make_train_step(ARCH, opt, settings, **kw))
    a_state, a = plain(learner.init_state(params, opt), jax.tree.map(jnp.asarray, unpacked))
    b_state, b = packing(learner.init_state(params, opt), jax.tree.map(jnp.asarray, packed))
    assert sorted(a) == sorted(b) and "mismatch/bitwise_equal_fraction" in a
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=2e-5, atol=2e-6, err_msg=key)
    for x, y in zip(jax.tree.leaves(a_state.params), jax.tree.leaves(b_state.params)):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_packed_mini_batches_equal_unpacked_ones():
    # two optimizer updates per batch: each half of the samples packed on its own
    settings = losses.resolve_loss_settings("olmo3")
    params = models.init_params(ARCH, jax.random.key(3))
    opt = optax.sgd(0.5)
    unpacked, packed, _ = batches(updates=2)
    plain = jax.jit(learner.make_train_step(ARCH, opt, settings, max_len=24))
    packing = jax.jit(learner.make_train_step(ARCH, opt, settings, max_len=24))
    a_state, b_state = (learner.init_state(params, opt) for _ in range(2))
    for u in range(2):
        a_state, a = plain(a_state, jax.tree.map(jnp.asarray, mini_batch(unpacked, u, 2)))
        b_state, b = packing(b_state, jax.tree.map(jnp.asarray, mini_batch(packed, u, 2)))
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5, atol=1e-7)
    for x, y in zip(jax.tree.leaves(a_state.params), jax.tree.leaves(b_state.params)):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_packed_batch_refuses_another_micro_batch_count():
    settings = losses.resolve_loss_settings("olmo3")
    params = models.init_params(ARCH, jax.random.key(0))
    _, packed, _ = batches()
    step = learner.make_train_step(ARCH, optax.sgd(0.1), settings, max_len=24, n_micro=1)
    with pytest.raises(ValueError, match=r"packed for \d+ micro-batches, not 1"):
        jax.eval_shape(step, learner.init_state(params, optax.sgd(0.1)), packed)


def test_pack_groups_fills_the_fewest_rows_splitting_groups_after_prompt_copies():
    from rlvr_jax.training.packing import pack_groups

    def check(groups, row_len, used, pieces):
        spans = {r: [] for r in range(used)}
        seen = {i: [] for i in range(len(groups))}
        for i, r, offset, js in pieces:
            assert js and 0 <= r < used
            spans[r].append((offset, groups[i][0] + sum(groups[i][1][j] for j in js)))
            seen[i] += js
        for parts in spans.values():  # no overlap, within the row
            end = 0
            for offset, n in sorted(parts):
                assert offset >= end and offset + n <= row_len
                end = offset + n
        for i, (_, cs) in enumerate(groups):  # every completion exactly once
            assert sorted(seen[i]) == list(range(len(cs)))

    groups = [(4, [10, 10, 10]), (2, [5, 5]), (6, [8, 8, 8])]  # 34, 12, 30 tokens
    used, pieces = pack_groups(groups, row_len=46, rows=8)
    check(groups, 46, used, pieces)
    assert used == 2 and len(pieces) == 3  # 34 + 12 and 30: whole groups fit 2 rows of 46
    used, pieces = pack_groups(groups, row_len=40, rows=8)
    check(groups, 40, used, pieces)
    assert used == 3  # 2 rows of 40 would need the 12-token group in 2 parts: 2 + 5 each
    # 3 groups of 32 (prompt 2 + 3 x 10) in rows of 60: two whole, the third split over the
    # two rows after a copy of its prompt each (2 + 10 + 10 and 2 + 10): 2 rows, not 3
    groups = [(2, [10, 10, 10])] * 3
    used, pieces = pack_groups(groups, row_len=60, rows=8)
    check(groups, 60, used, pieces)
    assert used == 2 and len(pieces) == 4
    groups = [(2, [10, 10, 10])] * 5  # 160 tokens: ladder(ceil(160 / 60)) = 3 rows
    used, pieces = pack_groups(groups, row_len=60, rows=8)
    check(groups, 60, used, pieces)
    assert used == 3 and len(pieces) > 5
    # a split that would leave a completion no room takes the next row count
    assert pack_groups([(6, [8, 8, 8])] * 3, row_len=48, rows=8)[0] == 3
    assert pack_groups([(2, [3])] * 3, row_len=40, rows=8, row_multiple=2)[0] == 2
    with pytest.raises(ValueError, match="group 1 has 50 tokens > a row of 40"):
        pack_groups([(2, [3]), (10, [40])], row_len=40, rows=8)
    with pytest.raises(ValueError, match="3 groups for 2 rows"):
        pack_groups([(2, [3])] * 3, row_len=40, rows=2)


def test_pack_groups_row_counts_hold_every_count_pack_groups_returns():
    """The counts the learner compiles with the first batch (`Update.compile`): exact up to 8,
    the ladder above, rounded to `row_multiple`; every row count of random batches among them."""
    from rlvr_jax.training.packing import pack_groups, pack_groups_row_counts

    assert pack_groups_row_counts(8) == (1, 2, 3, 4, 5, 6, 7, 8)
    assert pack_groups_row_counts(8, row_multiple=2) == (2, 4, 6, 8)
    assert pack_groups_row_counts(20) == (*range(1, 9), 12, 16, 20)
    from rlvr_jax.training.batch import packed_row_counts  # what RolloutSource hands over

    assert packed_row_counts(64, group_size=8) == (1, 2, 3, 4, 5, 6, 7, 8)
    assert packed_row_counts(64, group_size=8, updates=2) == (2, 4, 6, 8)  # 4 groups each
    rng = np.random.default_rng(0)
    for multiple in (1, 2):
        counts = set(pack_groups_row_counts(8, multiple))
        for _ in range(200):
            groups = [
                (int(rng.integers(2, 40)), rng.integers(1, 60, size=4).tolist())
                for _ in range(int(rng.integers(1, 9)))
            ]
            used, _ = pack_groups(groups, row_len=280, rows=8, row_multiple=multiple)
            assert used in counts
            tokens = sum(p + sum(cs) for p, cs in groups)
            assert used <= max(-(-tokens // 280) + 1, 1) + multiple  # close to the fewest


def test_the_first_packed_batch_brings_its_other_row_counts_to_compile_once():
    """`Update.compile`'s variants: the packed rows (`tokens`) at each other count of
    `Batch.row_counts` (zeros of the same dtypes), the per-completion arrays untouched; once
    per row shape, and none for a batch that lists no counts."""
    import dataclasses

    from rlvr_jax.training.algorithms.common import Update
    from rlvr_jax.training.batch import RLBatch, TokenBatch
    from rlvr_jax.training.sources import Batch

    def rows(r, length):
        ids = [np.ones((r, length), np.int32) for _ in range(4)]
        return TokenBatch(*ids, mask_BxT=np.ones((r, length), np.float32))

    update = Update.__new__(Update)
    update._ladders = set()
    arrays = RLBatch(rows(4, 16), np.zeros((8, 6), np.int32), mask_BxT=np.ones((8, 6), np.float32))
    batch = Batch(arrays, row_counts=(1, 2, 4, 6))
    variants = update._row_variants(batch)
    assert [v.arrays.tokens.mask_BxT.shape for v in variants] == [(1, 16), (2, 16), (6, 16)]
    for v in variants:
        r = v.arrays.tokens.mask_BxT.shape[0]
        for got, like in zip(jax.tree.leaves(v.arrays.tokens), jax.tree.leaves(arrays.tokens)):
            assert got.shape == (r, 16) and got.dtype == like.dtype and not got.any()
        assert v.arrays.gather_BxT is arrays.gather_BxT and v.row_counts == batch.row_counts
    assert update._row_variants(batch) == []  # compiled once per row shape
    longer = dataclasses.replace(batch, arrays=arrays.replace(tokens=rows(4, 32)))
    assert len(update._row_variants(longer)) == 3
    assert update._row_variants(Batch(arrays)) == []
