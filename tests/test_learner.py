"""The learner step: batch layout, log-prob alignment, gradient accumulation with the global
denominator, skipping non-finite steps, and the sharded step equal to the unsharded one."""

import helpers_models as H
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax import losses, models, sharding
from rlvr_jax.config.schema import TrainConfig
from rlvr_jax.training import learner
from rlvr_jax.training.batch import Sample, TokenBatch, bucket_length, collate
from rlvr_jax.training.optimizer import learning_rate_schedule, make_optimizer

ARCH = H.tiny_arch()


def make_batch(seed=0, rows=4, seq_len=16, lengths=(3, 7, 1, 6)):
    rng = np.random.default_rng(seed)
    samples = [
        Sample(
            rng.integers(3, 60, 5).tolist(),
            rng.integers(3, 60, n).tolist(),
            (-rng.random(n) * 3).tolist(),
            float(rng.normal()),
        )
        for n in lengths
    ]
    return samples, jax.tree.map(
        jnp.asarray, collate(samples, rows=rows, seq_len=seq_len, pad_id=0)
    )


def test_collate_layout_by_hand():
    s = Sample(
        prompt_tokens=[5, 6], tokens=[7, 8, 1], sampler_logp=[-0.1, -0.2, -0.3], advantage=0.5
    )
    b = collate([s], rows=2, seq_len=6, pad_id=0)
    # row = [5 6 7 8 1 0]; inputs = row[:-1], targets = row[1:]
    assert b.tokens.input_ids_BxT.tolist() == [[5, 6, 7, 8, 1], [0] * 5]
    assert b.tokens.target_ids_BxT.tolist() == [[6, 7, 8, 1, 0], [0] * 5]
    # targets 7, 8, 1 (the completion, stop token included) sit at shifted indices 1..3
    assert b.mask_BxT.tolist() == [[0, 1, 1, 1, 0], [0] * 5]
    np.testing.assert_allclose(b.sampler_logp_BxT[0], [0, -0.1, -0.2, -0.3, 0])
    assert b.tokens.segment_ids_BxT.tolist() == [[1, 1, 1, 1, 1], [0] * 5]
    assert b.advantages_B.tolist() == [0.5, 0.0]
    with pytest.raises(ValueError, match="sample 0 has 2 prompt \\+ 3 completion tokens > 4"):
        collate([s], rows=1, seq_len=4, pad_id=0)


def test_bucket_length_by_hand():
    # smallest 32·2^k >= longest, capped at the full length
    assert [bucket_length(n, full=160, min_len=32) for n in (1, 32, 33, 64, 65, 129, 160)] == [
        32,
        32,
        64,
        64,
        128,
        160,
        160,
    ]
    assert bucket_length(50, full=160, min_len=0) == 160  # off: always the full length
    # a multiple of the chunk sizes: 64 -> 96 and 128 -> 144 with multiple 48
    assert bucket_length(40, full=160, min_len=32, multiple=48) == 96
    assert bucket_length(100, full=160, min_len=32, multiple=48) == 144
    assert bucket_length(100, full=130, min_len=32, multiple=48) == 130  # capped
    with pytest.raises(ValueError, match="a row of 161 tokens exceeds the full length 160"):
        bucket_length(161, full=160, min_len=32)


@pytest.mark.parametrize("preset", ["olmo3", "drgrpo"])
@pytest.mark.slow
def test_bucketed_padding_gives_the_full_length_update(preset):
    # the same samples collated to the bucket length and to the full length: same update
    params = models.init_params(ARCH, jax.random.key(2))
    opt = optax.sgd(0.5)
    settings = losses.resolve_loss_settings(preset)
    samples, full = make_batch(seq_len=33)
    longest = max(len(s.prompt_tokens) + len(s.tokens) for s in samples)
    T = bucket_length(longest, full=32, min_len=8)
    assert T == 16 < 32
    short = jax.tree.map(jnp.asarray, collate(samples, rows=4, seq_len=T + 1, pad_id=0))
    step = jax.jit(learner.make_train_step(ARCH, opt, settings, max_len=24))
    (a, ma), (b, mb) = (step(learner.init_state(params, opt), x) for x in (full, short))
    assert float(ma["loss"]) == pytest.approx(float(mb["loss"]), rel=1e-5, abs=1e-7)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_allclose(x, y, atol=1e-6)


@pytest.mark.slow
def test_token_logprobs_match_the_full_forward():
    params = models.init_params(ARCH, jax.random.key(1))
    samples, batch = make_batch()
    logp = learner.sequence_logprobs(
        params, ARCH, batch, compute_dtype=jnp.float32, temperature=0.7
    )
    for i, s in enumerate(samples):
        row = jnp.asarray([list(s.prompt_tokens) + list(s.tokens)])
        model = models.Model(config=ARCH, params=params, compute_dtype=jnp.float32)
        logits = models.forward(model, row)[0] / 0.7
        ref = jax.nn.log_softmax(logits, axis=-1)
        n_p = len(s.prompt_tokens)
        for j, tok in enumerate(s.tokens):
            np.testing.assert_allclose(logp[i, n_p - 1 + j], ref[n_p - 1 + j, tok], atol=1e-5)


@pytest.mark.parametrize("preset", ["olmo3", "grpo", "drgrpo", "gspo"])
@pytest.mark.slow
def test_micro_batches_give_the_full_batch_update(preset):
    params = models.init_params(ARCH, jax.random.key(0))
    opt = optax.sgd(0.5)
    settings = losses.resolve_loss_settings(preset)
    _, batch = make_batch()
    if settings.needs_ref_logp:  # grpo's KL term: any fixed reference log-probs will do
        batch = batch.replace(ref_logp_BxT=batch.sampler_logp_BxT - 0.1)
    results = []
    for n_micro in (1, 2, 4):
        step = jax.jit(learner.make_train_step(ARCH, opt, settings, max_len=15, n_micro=n_micro))
        state, metrics = step(learner.init_state(params, opt), batch)
        results.append((state.params, float(metrics["loss"]), float(metrics["grad_norm"])))
    for p, loss, gnorm in results[1:]:
        assert loss == pytest.approx(results[0][1], rel=1e-5, abs=1e-7)
        assert gnorm == pytest.approx(results[0][2], rel=1e-5)
        for a, b in zip(jax.tree.leaves(results[0][0]), jax.tree.leaves(p)):
            np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.slow
def test_non_finite_step_is_skipped_and_counted():
    params = models.init_params(ARCH, jax.random.key(0))
    opt = optax.sgd(0.1)
    _, batch = make_batch()
    batch = batch.replace(advantages_B=batch.advantages_B.at[0].set(jnp.nan))
    step = jax.jit(
        learner.make_train_step(ARCH, opt, losses.resolve_loss_settings("olmo3"), max_len=12)
    )
    state, metrics = step(learner.init_state(params, opt), batch)
    assert float(metrics["step_ok"]) == 0.0
    assert int(state.step) == 0 and int(state.skipped) == 1
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_sharded_step_equals_unsharded():
    params = models.init_params(ARCH, jax.random.key(0))
    opt = optax.adamw(1e-3)
    settings = losses.resolve_loss_settings("olmo3")
    _, batch = make_batch(rows=8, lengths=(3, 7, 1, 6, 2, 5, 4, 8))
    step = learner.make_train_step(ARCH, opt, settings, max_len=12, n_micro=2)
    ref_state, ref_m = jax.jit(step)(learner.init_state(params, opt), batch)

    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    p_shard = models.param_shardings(ARCH, mesh, sharding.LEARNER_RULES)
    sharded = learner.init_state(sharding.reshard(params, p_shard), opt, mesh=mesh)
    state_sh = jax.tree.map(lambda x: x.sharding, sharded)
    batch_sh = jax.tree.map(
        lambda v: sharding.batch_sharding(mesh, sharding.LEARNER_RULES, v.shape), batch
    )
    batch = jax.device_put(batch, batch_sh)
    new_state, m = learner.jit_train_step(step, state_sh, batch_sh)(sharded, batch)
    assert float(m["loss"]) == pytest.approx(float(ref_m["loss"]), rel=1e-5, abs=1e-7)
    for a, b in zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(new_state.params)):
        np.testing.assert_allclose(a, b, atol=1e-5)
    emb = new_state.params["embedding"]
    assert len(emb.sharding.device_set) == 8


def test_schedules_by_hand():
    cfg = TrainConfig(learning_rate=1.0, warmup_steps=4, max_steps=14, schedule="linear")
    lr = learning_rate_schedule(cfg)
    # warmup 0 → 1 over 4 steps, then linear 1 → 0 over the remaining 10
    assert [float(lr(s)) for s in (0, 2, 4, 9, 14)] == pytest.approx([0, 0.5, 1.0, 0.5, 0.0])
    cos = learning_rate_schedule(TrainConfig(learning_rate=2.0, max_steps=10, schedule="cosine"))
    assert float(cos(5)) == pytest.approx(1.0)  # 2 · ½(1 + cos(π/2))
    make_optimizer(TrainConfig(max_grad_norm=0.0))  # clipping off builds too


@pytest.mark.slow
def test_memory_options_do_not_change_the_update():
    """remat, query-chunked attention and chunked log-probs are exact rewrites."""
    params = models.init_params(ARCH, jax.random.key(3))
    opt = optax.sgd(0.5)
    settings = losses.resolve_loss_settings("olmo3")
    _, batch = make_batch(seq_len=17)  # T = 16 positions: chunks of 4
    plain = learner.make_train_step(ARCH, opt, settings, max_len=15)
    mem = learner.MemoryOptions(remat=True, attn_chunk=4, logits_chunk=4)
    lean = learner.make_train_step(ARCH, opt, settings, max_len=15, memory=mem)
    a_state, a_m = jax.jit(plain)(learner.init_state(params, opt), batch)
    b_state, b_m = jax.jit(lean)(learner.init_state(params, opt), batch)
    assert float(b_m["loss"]) == pytest.approx(float(a_m["loss"]), rel=1e-5, abs=1e-7)
    for a, b in zip(jax.tree.leaves(a_state.params), jax.tree.leaves(b_state.params)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    logp_a = learner.sequence_logprobs(
        params, ARCH, batch, compute_dtype=jnp.float32, temperature=1.0
    )
    logp_b = learner.sequence_logprobs(
        params, ARCH, batch, compute_dtype=jnp.float32, temperature=1.0, memory=mem
    )
    np.testing.assert_allclose(logp_a, logp_b, atol=1e-5)


@pytest.mark.parametrize("max_tokens", [0, 4096])
def test_learner_passes_max_segments_to_the_kernel_choice(monkeypatch, max_tokens):
    """`Context.memory` declares the rows' segment bound (1, or the packer's when packed) and
    the learner's forward hands it to the attention resolution, which on a bf16 GPU then picks
    cuDNN (the resolution is spied on here; blockwise runs on this CPU)."""
    from rlvr_jax.config import load
    from rlvr_jax.models import attention, decoder
    from rlvr_jax.training.context import Context
    from rlvr_jax.training.packing import MAX_SEQS_PER_ROW

    cfg = load("configs/demo.yaml", [f"train.max_tokens_per_micro_batch={max_tokens}"])
    ctx = Context(cfg, None, None, None, None, None, None)
    expected = MAX_SEQS_PER_ROW if max_tokens else 1
    assert ctx.memory.max_segments == expected
    seen = []

    def spy(impl, **kw):
        gpu = {**kw, "platform": "gpu", "check_library": False}
        seen.append((kw["max_segments"], attention.resolve_impl(impl, **gpu)))
        return "blockwise"

    params = jax.eval_shape(lambda: models.init_params(ARCH, jax.random.key(0)))
    monkeypatch.setattr(decoder, "resolve_impl", spy)
    ids = jnp.ones((2, 16), jnp.int32)
    batch = TokenBatch(ids, ids, jnp.broadcast_to(jnp.arange(16), (2, 16)), ids, ids * 1.0)
    kw = {"compute_dtype": jnp.bfloat16, "temperature": 1.0, "memory": ctx.memory}
    jax.eval_shape(lambda p: learner.token_logprobs(p, ARCH, batch, **kw), params)  # traced only
    assert seen and all(s == (expected, "cudnn") for s in seen)
