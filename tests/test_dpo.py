"""The DPO learner: the pair layout by hand, the loss and gradient through a real model against a
reference that runs each sequence alone, packed == unpacked, micro-batching == one batch,
cached reference sums == per-token reference log-probs, and the reference cache on disk."""

import helpers_models as H
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax import losses, models
from rlvr_jax.training.dpo import collate_pairs, make_dpo_step
from rlvr_jax.training.dpo_reference import (
    ReferenceCache,
    model_fingerprint,
    sequence_key,
)
from rlvr_jax.training.learner import init_state, make_logprob_fn

ARCH = H.micro_arch()
PARAMS = models.init_params(ARCH, jax.random.key(0))
REF_PARAMS = models.init_params(ARCH, jax.random.key(1))
SGD = optax.sgd(1.0)  # new params = params − gradient


def pairs(n: int = 4, seed: int = 0):
    """n pairs of random prompts and responses of different lengths."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, 32, rng.integers(1, 5)).tolist() for _ in range(n)]
    chosen = [rng.integers(3, 32, rng.integers(1, 6)).tolist() for _ in range(n)]
    rejected = [rng.integers(3, 32, rng.integers(1, 6)).tolist() for _ in range(n)]
    return prompts, chosen, rejected


def test_collate_pairs_layout_by_hand():
    batch = collate_pairs(
        [[5, 6], [7]],
        [[8, 9], [10]],
        [[11], [12, 13, 14]],
        rows=4,
        seq_len=6,
        pad_id=0,
        ref_chosen=[-1.5, -2.5],
        ref_rejected=[-3.5, -4.5],
    )
    # rows before the shift: chosen 0, rejected 0, chosen 1, rejected 1
    #   [5 6 8 9 0 0] [5 6 11 0 0 0] [7 10 0 0 0 0] [7 12 13 14 0 0]
    np.testing.assert_array_equal(
        batch.mask_BxT,
        [[0, 1, 1, 0, 0], [0, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]],
    )
    np.testing.assert_array_equal(
        batch.pair_BxT, [[0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]]
    )
    np.testing.assert_array_equal(
        batch.chosen_BxT, [[0, 1, 1, 0, 0], [0] * 5, [1, 0, 0, 0, 0], [0] * 5]
    )
    # each cached sum sits on its response's first target position
    np.testing.assert_array_equal(
        batch.ref_logp_BxT,
        [[0, -1.5, 0, 0, 0], [0, -3.5, 0, 0, 0], [-2.5, 0, 0, 0, 0], [-4.5, 0, 0, 0, 0]],
    )


def test_collate_pairs_packed_keeps_each_group_in_its_rows():
    prompts, chosen, rejected = pairs(4)
    batch = collate_pairs(
        prompts, chosen, rejected, rows=4, seq_len=24, pad_id=0, pack=True, groups=2
    )
    pair_BxT = np.where(batch.mask_BxT > 0, batch.pair_BxT, -1)
    # micro-batch 0 = rows 0-1 holds pairs 0 and 1 only; rows 2-3 pairs 2 and 3
    assert set(pair_BxT[:2].ravel()) - {-1} == {0, 1}
    assert set(pair_BxT[2:].ravel()) - {-1} == {2, 3}
    for p in range(4):  # every response's tokens are counted on the right side
        on = batch.pair_BxT == p
        assert (batch.chosen_BxT * on).sum() == len(chosen[p])
        assert ((batch.mask_BxT - batch.chosen_BxT) * on).sum() == len(rejected[p])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(groups=3), "do not split into 3 micro-batches"),
        (dict(rows=2), "do not fit one per row in 2 rows"),
        (dict(seq_len=4), "tokens > 4"),
    ],
)
def test_collate_pairs_rejects_bad_layouts(kwargs, message):
    prompts, chosen, rejected = pairs(2)
    args = dict(rows=4, seq_len=24, pad_id=0) | kwargs
    with pytest.raises(ValueError, match=message):
        collate_pairs(prompts, chosen, rejected, **args)
    with pytest.raises(ValueError, match="need the same number"):
        collate_pairs(prompts, chosen[:1], rejected, rows=4, seq_len=24, pad_id=0)


def sequence_logp(params, prompt, response):
    """log π(response | prompt) summed: the sequence run alone through the model."""
    ids = jnp.asarray([prompt + response], jnp.int32)
    n = ids.shape[1]
    logits = models.apply(
        params, ARCH, ids, jnp.arange(n, dtype=jnp.int32)[None], jnp.ones((1, n), jnp.int32)
    ).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits[0, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, ids[0, 1:, None], axis=-1)[:, 0]
    return jnp.sum(picked[len(prompt) - 1 :])


def reference_dpo_loss(params, prompts, chosen, rejected, beta):
    """The DPO loss straight from its formula, one sequence at a time."""
    total = 0.0
    for p, c, r in zip(prompts, chosen, rejected):
        h = (sequence_logp(params, p, c) - sequence_logp(REF_PARAMS, p, c)) - (
            sequence_logp(params, p, r) - sequence_logp(REF_PARAMS, p, r)
        )
        total = total - jax.nn.log_sigmoid(beta * h)
    return total / len(prompts)


def ref_sums(prompts, responses):
    return [float(sequence_logp(REF_PARAMS, p, r)) for p, r in zip(prompts, responses)]


@pytest.fixture(scope="module")
def data():
    prompts, chosen, rejected = pairs(4)
    return prompts, chosen, rejected, ref_sums(prompts, chosen), ref_sums(prompts, rejected)


def dpo_step(n_micro=1, variant="dpo", beta=0.7):
    return jax.jit(make_dpo_step(ARCH, SGD, pairs=4, variant=variant, beta=beta, n_micro=n_micro))


def run(step, batch):
    state, metrics = step(init_state(PARAMS, SGD), jax.tree.map(jnp.asarray, batch))
    return state.params, jax.device_get(metrics)


def tree_close(a, b, **tol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)


@pytest.mark.slow
def test_loss_and_gradient_match_the_one_sequence_at_a_time_reference(data):
    prompts, chosen, rejected, ref_w, ref_l = data
    batch = collate_pairs(
        prompts,
        chosen,
        rejected,
        rows=8,
        seq_len=12,
        pad_id=0,
        ref_chosen=ref_w,
        ref_rejected=ref_l,
    )
    params, metrics = run(dpo_step(), batch)
    # one program (each sequence still its own forward): op by op, the gradient took ~40 s
    reference = jax.jit(jax.value_and_grad(reference_dpo_loss), static_argnums=(1, 2, 3, 4))
    static = [tuple(map(tuple, seqs)) for seqs in (prompts, chosen, rejected)]
    expected, grads = reference(PARAMS, *static, 0.7)
    np.testing.assert_allclose(metrics["loss"], float(expected), rtol=1e-5)
    tree_close(params, jax.tree.map(lambda p, g: p - g, PARAMS, grads), rtol=1e-4, atol=1e-6)
    assert metrics["dpo/pairs"] == 4.0 and metrics["step_ok"] == 1.0
    w = np.mean([float(sequence_logp(PARAMS, p, c)) for p, c in zip(prompts, chosen)])
    np.testing.assert_allclose(metrics["dpo/chosen_logp"], w, rtol=1e-5)


@pytest.mark.slow
def test_packed_equals_unpacked(data):
    prompts, chosen, rejected, ref_w, ref_l = data
    refs = dict(ref_chosen=ref_w, ref_rejected=ref_l)
    step = dpo_step()
    flat = collate_pairs(prompts, chosen, rejected, rows=8, seq_len=12, pad_id=0, **refs)
    packed = collate_pairs(
        prompts, chosen, rejected, rows=4, seq_len=24, pad_id=0, pack=True, **refs
    )
    assert packed.mask_BxT.shape[0] < flat.mask_BxT.shape[0]
    assert (packed.segment_ids_BxT.max(axis=1) > 1).any()  # rows hold several sequences
    (p_flat, m_flat), (p_packed, m_packed) = run(step, flat), run(step, packed)
    for key, value in m_flat.items():
        np.testing.assert_allclose(m_packed[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    tree_close(p_packed, p_flat, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("pack", [False, True])
def test_micro_batching_equals_the_full_batch_gradient(data, pack):
    prompts, chosen, rejected, ref_w, ref_l = data
    rows, seq_len = (4, 24) if pack else (8, 12)
    out = {}
    for n in (1, 2, 4):  # 4 micro-batches: one pair each
        batch = collate_pairs(
            prompts,
            chosen,
            rejected,
            rows=rows,
            seq_len=seq_len,
            pad_id=0,
            pack=pack,
            groups=n,
            ref_chosen=ref_w,
            ref_rejected=ref_l,
        )
        out[n] = run(dpo_step(n_micro=n, variant="dpo_norm", beta=2.0), batch)
    p1, m1 = out[1]
    for n, (p, m) in out.items():
        for key in ("loss", "dpo/accuracy", "dpo/reward_margin", "dpo/chosen_logp", "dpo/pairs"):
            np.testing.assert_allclose(m[key], m1[key], rtol=1e-5, atol=1e-6, err_msg=f"{n} {key}")
        tree_close(p, p1, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_cached_sums_equal_per_token_reference_logprobs(data):
    prompts, chosen, rejected, ref_w, ref_l = data
    cached = collate_pairs(
        prompts,
        chosen,
        rejected,
        rows=8,
        seq_len=12,
        pad_id=0,
        ref_chosen=ref_w,
        ref_rejected=ref_l,
    )
    plain = jax.tree.map(
        jnp.asarray, collate_pairs(prompts, chosen, rejected, rows=8, seq_len=12, pad_id=0)
    )
    logprob = make_logprob_fn(ARCH, compute_dtype=jnp.float32, temperature=1.0)
    on_the_fly = plain.replace(ref_logp_BxT=logprob(REF_PARAMS, plain))
    step = dpo_step()
    (p_c, m_c), (p_f, m_f) = run(step, cached), run(step, on_the_fly)
    np.testing.assert_allclose(m_c["loss"], m_f["loss"], rtol=1e-5)
    np.testing.assert_allclose(m_c["dpo/reward_margin"], m_f["dpo/reward_margin"], atol=1e-5)
    tree_close(p_c, p_f, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_starting_from_the_reference_the_loss_is_log_2():
    prompts, chosen, rejected = pairs(4, seed=3)
    batch = collate_pairs(prompts, chosen, rejected, rows=8, seq_len=12, pad_id=0)
    batch = jax.tree.map(jnp.asarray, batch)
    logprob = make_logprob_fn(ARCH, compute_dtype=jnp.float32, temperature=1.0)
    batch = batch.replace(ref_logp_BxT=logprob(PARAMS, batch))
    _, metrics = run(dpo_step(), batch)
    # π = π_ref: every margin is 0, ℓ = −log σ(0) = log 2
    np.testing.assert_allclose(metrics["loss"], np.log(2.0), rtol=1e-6)
    assert metrics["dpo/reward_margin"] == 0.0


def test_make_dpo_step_rejects_bad_settings():
    with pytest.raises(ValueError, match="n_micro must be >= 1"):
        make_dpo_step(ARCH, SGD, pairs=4, n_micro=0)
    with pytest.raises(ValueError, match="pairs must be >= 1"):
        make_dpo_step(ARCH, SGD, pairs=0)


# -- the reference cache -----------------------------------------------------------------


@pytest.mark.slow
def test_reference_cache_fills_saves_reloads_and_checks_its_model(tmp_path, data):
    prompts, chosen, _, ref_w, _ = data
    logprob = make_logprob_fn(ARCH, compute_dtype=jnp.float32, temperature=1.0)
    calls = []

    def forward(batch):
        calls.append(batch.mask_BxT.shape)
        return np.asarray(logprob(REF_PARAMS, jax.tree.map(jnp.asarray, batch)))

    cache = ReferenceCache(tmp_path / "cache", "ab" * 32)
    seqs = list(zip(prompts, chosen))
    kwargs = dict(rows=3, full_len=16, min_len=4, multiple=1, pad_id=0)
    assert cache.fill([*seqs, seqs[0]], forward, **kwargs) == 4  # the repeat is computed once
    assert len(calls) == 2  # 4 sequences, 3 rows at a time
    for (p, c), expected in zip(seqs, ref_w):
        np.testing.assert_allclose(cache.get(p, c), expected, rtol=1e-5)
    cache.save()
    again = ReferenceCache(tmp_path / "cache", "ab" * 32)
    assert again.loaded == 4 and again.fill(seqs, forward, **kwargs) == 0 and len(calls) == 2
    assert again.get(*seqs[1]) == cache.get(*seqs[1])
    with pytest.raises(KeyError, match="no reference log-prob"):
        again.get([1, 2], [3])
    assert sequence_key([1, 2], [3]) != sequence_key([1], [2, 3])
    # a fingerprint whose file name is the same (its first 16 characters) but that differs
    with pytest.raises(ValueError, match="written for another model"):
        ReferenceCache(tmp_path / "cache", "ab" * 31 + "ff")


def test_model_fingerprint_follows_the_files_and_dtypes(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "notes.log").write_text("ignored")
    a = model_fingerprint(tmp_path, param_dtype="float32", compute_dtype="float32")
    (tmp_path / "notes.log").write_text("changed")
    assert model_fingerprint(tmp_path, param_dtype="float32", compute_dtype="float32") == a
    assert model_fingerprint(tmp_path, param_dtype="float32", compute_dtype="bfloat16") != a
    (tmp_path / "model.safetensors").write_bytes(b"weightz")
    assert model_fingerprint(tmp_path, param_dtype="float32", compute_dtype="float32") != a
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        model_fingerprint(tmp_path / "nope", param_dtype="float32", compute_dtype="float32")


def test_preference_loss_is_exported():
    assert losses.preference_loss is not None and "preference_loss" in losses.__all__


@pytest.mark.slow
def test_rows_sharded_over_eight_devices_give_the_one_device_step(data):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    prompts, chosen, rejected, ref_w, ref_l = data
    batch = collate_pairs(
        prompts,
        chosen,
        rejected,
        rows=8,
        seq_len=12,
        pad_id=0,
        ref_chosen=ref_w,
        ref_rejected=ref_l,
    )
    step = dpo_step(n_micro=2)
    expected_params, expected = run(step, batch)
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    sharded = jax.tree.map(lambda x: jax.device_put(jnp.asarray(x), rows), batch)
    params = jax.device_put(PARAMS, NamedSharding(mesh, PartitionSpec()))
    state, metrics = step(init_state(params, SGD), sharded)
    for key in ("loss", "dpo/reward_margin", "dpo/pairs", "grad_norm"):
        np.testing.assert_allclose(float(metrics[key]), expected[key], rtol=1e-5, err_msg=key)
    tree_close(state.params, expected_params, rtol=1e-4, atol=1e-6)
