"""PPO with a learned critic: GAE by hand and against a plain-Python recursion (terminal steps,
masked tokens, packed rows), the clipped value loss by hand, the per-batch preparation, a PPO
step's gradients against a reference written here from the formulas, and packed == unpacked
for the preparation, the PPO loss, its gradients and every metric."""

import dataclasses

import helpers_models as H
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_packing import SEQ
from test_packing import samples as packing_samples

from rlvr_jax import losses, models
from rlvr_jax.config.schema import CriticConfig
from rlvr_jax.training import critic as critic_lib
from rlvr_jax.training import learner
from rlvr_jax.training.batch import Sample, collate, collate_packed, mini_batch, sequence_view
from rlvr_jax.training.packing import in_order
from rlvr_jax.training.update import init_state

ARCH = H.tiny_arch()  # the learner tests' model


# -- GAE ------------------------------------------------------------------------------------
def test_gae_by_hand_with_terminal_steps_and_masked_tokens():
    # γ = 0.9, λ = 0.5 (γλ = 0.45); values under the mask's zeros are never read
    mask = [[0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1]]
    rewards = [[0, 0, 0, 1.0, 0, 0], [0, 0, 0, 0, 0, 0.5]]
    values = [[9.0, 0.5, 0.4, 0.8, 7.0, 7.0], [3.0, 3.0, 3.0, 3.0, 0.2, 0.6]]
    adv, ret = losses.gae(
        jnp.array(rewards), jnp.array(values), jnp.array(mask), gamma=0.9, lam=0.5
    )
    # row 0, t = 3 is terminal (V after it = 0): δ3 = 1 − 0.8 = 0.2, A3 = 0.2, R̂3 = 1.0
    #   t = 2: δ2 = 0.9·0.8 − 0.4 = 0.32, A2 = 0.32 + 0.45·0.2 = 0.41, R̂2 = 0.81
    #   t = 1: δ1 = 0.9·0.4 − 0.5 = −0.14, A1 = −0.14 + 0.45·0.41 = 0.0445, R̂1 = 0.5445
    # row 1, terminal at the row's end: δ5 = 0.5 − 0.6 = −0.1 = A5, R̂5 = 0.5
    #   t = 4: δ4 = 0.9·0.6 − 0.2 = 0.34, A4 = 0.34 + 0.45·(−0.1) = 0.295, R̂4 = 0.495
    np.testing.assert_allclose(
        adv, [[0, 0.0445, 0.41, 0.2, 0, 0], [0, 0, 0, 0, 0.295, -0.1]], atol=1e-6
    )
    np.testing.assert_allclose(
        ret, [[0, 0.5445, 0.81, 1.0, 0, 0], [0, 0, 0, 0, 0.495, 0.5]], atol=1e-6
    )
    # γ = λ = 1: every token's advantage is the return-to-go minus its value
    adv1, _ = losses.gae(jnp.array(rewards), jnp.array(values), jnp.array(mask), gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv1[0, 1:4], [0.5, 0.6, 0.2], atol=1e-6)


def gae_reference(rewards, values, mask, gamma, lam, segment_ids=None):
    """GAE by the textbook backward loop, episode by episode: the runs of unmasked positions,
    or (with segment ids) the unmasked positions of each segment."""
    rewards, values, mask = (np.asarray(x, np.float64) for x in (rewards, values, mask))
    adv, ret = np.zeros_like(rewards), np.zeros_like(rewards)
    for b in range(mask.shape[0]):
        on = [t for t in range(mask.shape[1]) if mask[b, t] > 0]
        if segment_ids is None:
            episodes, run = [], []
            for t in on:
                if run and t != run[-1] + 1:
                    episodes.append(run)
                    run = []
                run.append(t)
            episodes += [run] if run else []
        else:
            segs = sorted({int(segment_ids[b, t]) for t in on} - {0})
            episodes = [[t for t in on if segment_ids[b, t] == s] for s in segs]
        for episode in episodes:
            next_adv = next_value = 0.0
            for t in reversed(episode):
                delta = rewards[b, t] + gamma * next_value - values[b, t]
                next_adv = delta + gamma * lam * next_adv
                next_value = values[b, t]
                adv[b, t], ret[b, t] = next_adv, next_adv + values[b, t]
    return adv, ret


@pytest.mark.parametrize(
    "gamma,lam",
    [
        (1.0, 0.95),
        *(pytest.param(*p, marks=pytest.mark.slow) for p in ((0.9, 0.7), (1.0, 0.0), (0.5, 1.0))),
    ],
)
def test_gae_matches_the_python_recursion(gamma, lam):
    rng = np.random.default_rng(0)
    B, T = 6, 40
    rewards = rng.normal(size=(B, T)).astype(np.float32)
    values = rng.normal(size=(B, T)).astype(np.float32)
    mask = (rng.random((B, T)) < 0.7).astype(np.float32)
    adv, ret = losses.gae(rewards, values, mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(adv, ref_adv, atol=2e-5)
    np.testing.assert_allclose(ret, ref_ret, atol=2e-5)
    # with segment ids: episodes are the segments, masked positions inside them are skipped
    seg = np.sort(rng.integers(0, 4, size=(B, T)), axis=1).astype(np.int32)
    adv, ret = losses.gae(rewards, values, mask, gamma=gamma, lam=lam, segment_ids_BxT=seg)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lam, segment_ids=seg)
    np.testing.assert_allclose(adv, ref_adv, atol=2e-5)
    np.testing.assert_allclose(ret, ref_ret, atol=2e-5)


@pytest.mark.slow
def test_gae_on_a_row_holding_two_completions_equals_each_alone():
    # segment mode over a packed row == GAE of each completion slot on its own
    rng = np.random.default_rng(1)
    samples = [
        Sample([5, 6, 7], [8, 9, 10, 1], [-0.1] * 4, 0.0, reward=1.0),
        Sample([11, 12], [13, 14, 1], [-0.2] * 3, 0.0, reward=0.25),
    ]
    layout = in_order([7, 5], rows=1, seq_len=16)
    batch = collate(samples, rows=1, seq_len=16, pad_id=0, layout=layout)
    seg_RxT = batch.tokens.segment_ids_BxT
    assert seg_RxT[0].tolist()[:12] == [1] * 7 + [2] * 5
    # the reward sits at each completion's last token (the stop token)
    assert batch.rewards_BxT[0, 5] == 1.0 and batch.rewards_BxT[1, 3] == 0.25
    assert batch.rewards_BxT.sum() == 1.25
    values_RxT = rng.normal(size=seg_RxT.shape).astype(np.float32)
    rewards_RxT = np.zeros_like(values_RxT)
    on = batch.mask_BxT > 0
    rewards_RxT.reshape(-1)[batch.gather_BxT[on]] = batch.rewards_BxT[on]
    np.testing.assert_array_equal(sequence_view(batch.tokens.mask_BxT, batch.gather_BxT), on)
    kw = dict(gamma=0.95, lam=0.9)
    adv_RxT, ret_RxT = losses.gae(
        rewards_RxT, values_RxT, batch.tokens.mask_BxT, segment_ids_BxT=seg_RxT, **kw
    )
    values_BxT = sequence_view(values_RxT, batch.gather_BxT)
    adv_BxT, ret_BxT = losses.gae(batch.rewards_BxT, values_BxT, batch.mask_BxT, **kw)
    np.testing.assert_allclose(sequence_view(adv_RxT, batch.gather_BxT) * on, adv_BxT, atol=1e-6)
    np.testing.assert_allclose(sequence_view(ret_RxT, batch.gather_BxT) * on, ret_BxT, atol=1e-6)
    # and each slot equals the recursion of that completion alone
    ref_adv, ref_ret = gae_reference(batch.rewards_BxT, values_BxT, batch.mask_BxT, **kw)
    np.testing.assert_allclose(adv_BxT, ref_adv, atol=1e-6)
    np.testing.assert_allclose(ret_BxT, ref_ret, atol=1e-6)


def test_gae_skips_masked_tokens_inside_a_segment():
    # tokens inserted by the engine (masked) in the middle of one completion: with segment
    # ids the recursion steps over them; without, the mask's runs are separate episodes
    mask = jnp.array([[0, 1, 1, 0, 0, 1, 1]], jnp.float32)
    seg = jnp.ones((1, 7), jnp.int32)
    rewards = jnp.array([[0, 0, 0, 0, 0, 0, 1.0]])
    values = jnp.array([[0, 0.1, 0.2, 5.0, 5.0, 0.3, 0.4]])
    adv, _ = losses.gae(rewards, values, mask, gamma=1.0, lam=1.0, segment_ids_BxT=seg)
    np.testing.assert_allclose(adv[0], [0, 0.9, 0.8, 0, 0, 0.7, 0.6], atol=1e-6)
    adv, _ = losses.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv[0], [0, -0.1, -0.2, 0, 0, 0.7, 0.6], atol=1e-6)


def test_gae_rejects_bad_inputs():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="values_BxT has shape"):
        losses.gae(x, jnp.zeros((2, 4)), x, gamma=1.0, lam=0.9)
    with pytest.raises(ValueError, match="lam must be in"):
        losses.gae(x, x, x, gamma=1.0, lam=1.5)
    with pytest.raises(ValueError, match="token-level"):
        losses.advantages("gae", jnp.ones((2, 2)))


# -- value loss -----------------------------------------------------------------------------
def test_value_loss_clipping_by_hand():
    values = jnp.array([[1.0, 0.2, 0.9, 123.0]])
    old = jnp.array([[0.5, 0.5, 0.5, 0.0]])
    returns = jnp.array([[2.0, 0.0, 0.0, 0.0]])
    mask = jnp.array([[1, 1, 1, 0]])

    def f(v, clip):
        return losses.value_loss(v, old_values=old, returns=returns, mask=mask, clip=clip)

    # ε_V = 0.2: V_clip = [0.7, 0.3, 0.7]
    #   token 0: (1 − 2)² = 1 vs (0.7 − 2)² = 1.69 -> 1.69, clipped (its gradient is 0)
    #   token 1: 0.04 vs 0.09 -> 0.09, clipped;  token 2: 0.81 vs 0.49 -> 0.81, not clipped
    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(values, 0.2)
    assert float(loss) == pytest.approx(0.5 * (1.69 + 0.09 + 0.81) / 3)
    assert float(metrics["value/clip_fraction"]) == pytest.approx(2 / 3)
    np.testing.assert_allclose(grad, [[0, 0, 0.9 / 3, 0]], atol=1e-7)
    # unclipped: ½(V − R̂)², gradient (V − R̂) / 3
    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(values, None)
    assert float(loss) == pytest.approx(0.5 * (1 + 0.04 + 0.81) / 3)
    assert float(metrics["value/clip_fraction"]) == 0.0
    np.testing.assert_allclose(grad, [[-1 / 3, 0.2 / 3, 0.9 / 3, 0]], atol=1e-7)


def test_explained_variance_and_whitening_by_hand():
    mask = jnp.array([[1, 1, 1, 1, 0]])
    returns = jnp.array([[1.0, 2.0, 3.0, 4.0, 50.0]])
    # Var R̂ = 1.25; R̂ − V = [0.5, −0.5, 0.5, −0.5] has Var 0.25: 1 − 0.25/1.25 = 0.8
    values = returns + jnp.array([[-0.5, 0.5, -0.5, 0.5, 9.0]])
    assert float(losses.explained_variance(values, returns, mask)) == pytest.approx(0.8)
    assert np.isnan(float(losses.explained_variance(values, jnp.ones((1, 5)), mask)))
    w = losses.whiten(returns, mask)
    np.testing.assert_allclose(w[0], np.array([-1.5, -0.5, 0.5, 1.5, 0]) / np.sqrt(1.25), 1e-5)


# -- the critic on the learner --------------------------------------------------------------
def make_batch(seed=0, rows=4, seq_len=16, lengths=(3, 7, 1, 6)):
    rng = np.random.default_rng(seed)
    samples = [
        Sample(
            rng.integers(3, 60, 5).tolist(),
            rng.integers(3, 60, n).tolist(),
            (-rng.random(n) * 3).tolist(),
            0.0,
            reward=float(rng.integers(0, 2)),
        )
        for n in lengths
    ]
    return jax.tree.map(jnp.asarray, collate(samples, rows=rows, seq_len=seq_len, pad_id=0))


def make_critic(kind, **cfg):
    return critic_lib.Critic(
        CriticConfig(kind=kind, **cfg), ARCH, jnp.float32, learner.MemoryOptions()
    )


def critic_params(kind, seed=3):
    k1, k2 = jax.random.split(jax.random.key(seed))
    # b strongly typed, as the step returns it: a weak-typed one recompiled the step at each
    # state's second call (test_ppo_packed_mini_batches_equal_unpacked_ones: 4 compiles, not 2)
    head = {"w_D": 0.3 * jax.random.normal(k1, (ARCH.d_model,)), "b": jnp.array(0.1, jnp.float32)}
    return (
        {"head": head}
        if kind == "shared"
        else {"head": head, "trunk": models.init_params(ARCH, k2)}
    )


@pytest.mark.parametrize("kind", ["separate", "shared"])
@pytest.mark.slow
def test_prepare_computes_values_and_gae_of_the_rollout_tokens(kind):
    policy = models.init_params(ARCH, jax.random.key(0))
    params = critic_params(kind)
    batch = make_batch()
    critic = make_critic(kind, gamma=0.9, lam=0.8, whiten_advantages=False)
    settings = losses.resolve_loss_settings("ppo")
    out, metrics = critic_lib.make_prepare_fn(critic, settings)(policy, params, batch)
    trunk = policy if kind == "shared" else params["trunk"]
    t = batch.tokens
    h = models.apply(
        trunk, ARCH, t.input_ids_BxT, t.positions_BxT, t.segment_ids_BxT, return_hidden=True
    )
    values = np.asarray(h @ params["head"]["w_D"] + params["head"]["b"])
    adv, ret = gae_reference(batch.rewards_BxT, values, batch.mask_BxT, 0.9, 0.8)
    np.testing.assert_allclose(out.values_BxT, values * batch.mask_BxT, atol=1e-5)
    np.testing.assert_allclose(out.advantages_BxT, adv, atol=1e-5)
    np.testing.assert_allclose(out.returns_BxT, ret, atol=1e-5)
    on = np.asarray(batch.mask_BxT) > 0
    ev = 1 - np.var((ret - values)[on]) / np.var(ret[on])
    assert float(metrics["value/explained_variance"]) == pytest.approx(float(ev), rel=1e-4)
    # whitened: mean 0, std 1 over the completion tokens
    critic = dataclasses.replace(critic, cfg=CriticConfig(kind=kind, gamma=0.9, lam=0.8))
    out, _ = critic_lib.make_prepare_fn(critic, settings)(policy, params, batch)
    white = np.asarray(out.advantages_BxT)[on]
    assert abs(white.mean()) < 1e-5 and white.std() == pytest.approx(1.0, rel=1e-4)


@pytest.mark.slow
def test_prepare_subtracts_the_kl_per_token_from_the_rewards():
    policy = models.init_params(ARCH, jax.random.key(0))
    params = critic_params("separate")
    batch = make_batch()
    old = batch.sampler_logp_BxT
    batch = batch.replace(old_logp_BxT=old, ref_logp_BxT=old - 0.3 * batch.mask_BxT)
    critic = make_critic("separate", gamma=1.0, lam=1.0, whiten_advantages=False)
    settings = losses.resolve_loss_settings("ppo", kl_coef=0.5, kl_mode="reward", kl_estimator="k1")
    out, _ = critic_lib.make_prepare_fn(critic, settings)(policy, params, batch)
    # k1 = logp − ref_logp = 0.3 on every completion token: r_t = R·[last] − 0.15
    rewards = np.asarray(batch.rewards_BxT) - 0.15 * np.asarray(batch.mask_BxT)
    adv, _ = gae_reference(rewards, out.values_BxT, batch.mask_BxT, 1.0, 1.0)
    np.testing.assert_allclose(out.advantages_BxT, adv, atol=1e-5)


def reference_ppo_loss(policy, cparams, batch, *, kind, eps, coef, clip):
    """PPO's loss from the formulas: ppo_clip with per-token advantages, token mean, plus
    c_V·½·max((V − R̂)², (V_old + clip(V − V_old, ±ε_V) − R̂)²), token mean."""
    t = batch.tokens  # one completion per row: slot b is row b
    inputs = (t.input_ids_BxT, t.positions_BxT, t.segment_ids_BxT)
    logits = models.apply(policy, ARCH, *inputs)
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, t.target_ids_BxT[..., None], axis=-1)[..., 0]
    m = batch.mask_BxT
    n = m.sum()
    ratio = jnp.exp(logp - batch.old_logp_BxT)
    a = batch.advantages_BxT
    pg = -jnp.minimum(ratio * a, jnp.clip(ratio, 1 - eps, 1 + eps) * a)
    trunk = policy if kind == "shared" else cparams["trunk"]
    h = models.apply(trunk, ARCH, *inputs, return_hidden=True)
    v = h @ cparams["head"]["w_D"] + cparams["head"]["b"]
    old, ret = batch.values_BxT, batch.returns_BxT
    v_clip = old + jnp.clip(v - old, -clip, clip)
    vl = 0.5 * jnp.maximum((v - ret) ** 2, (v_clip - ret) ** 2)
    return jnp.sum(m * pg) / n + coef * jnp.sum(m * vl) / n


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["separate", "shared"])
def test_ppo_step_gradient_matches_the_reference(kind):
    policy = models.init_params(ARCH, jax.random.key(0))
    cparams = critic_params(kind)
    rng = np.random.default_rng(5)
    batch = make_batch()
    shape = batch.mask_BxT.shape
    m = np.asarray(batch.mask_BxT)
    t = batch.tokens
    logp = learner.token_logprobs(policy, ARCH, t, compute_dtype=jnp.float32, temperature=1.0)
    h = models.apply(
        policy if kind == "shared" else cparams["trunk"],
        ARCH,
        t.input_ids_BxT,
        t.positions_BxT,
        t.segment_ids_BxT,
        return_hidden=True,
    )
    v_now = h @ cparams["head"]["w_D"] + cparams["head"]["b"]
    # old log-probs and old values away from the current ones: both clips act on some tokens
    batch = batch.replace(
        old_logp_BxT=(logp + rng.normal(0, 0.3, shape)) * m,
        values_BxT=(v_now + rng.normal(0, 0.4, shape)) * m,
        advantages_BxT=jnp.asarray(rng.normal(size=shape) * m, jnp.float32),
        returns_BxT=jnp.asarray(rng.normal(size=shape) * m, jnp.float32),
    )
    batch = jax.tree.map(
        lambda x: jnp.asarray(x, jnp.float32) if x.dtype == jnp.float64 else x, batch
    )
    critic = make_critic(kind, value_coef=0.7, value_clip=0.2)
    settings = losses.resolve_loss_settings("ppo")
    ref_loss, (g_pol, g_crit) = jax.jit(  # one program: op by op it takes seconds
        jax.value_and_grad(
            lambda p: reference_ppo_loss(*p, batch, kind=kind, eps=0.2, coef=0.7, clip=0.2)
        )
    )((policy, cparams))
    sgd = optax.sgd(1.0)  # new params = params − gradient
    for n_micro in (1, 2):
        step = jax.jit(
            critic_lib.make_ppo_step(ARCH, critic, sgd, sgd, settings, max_len=15, n_micro=n_micro)
        )
        state = init_state(policy, sgd)
        cstate = init_state(cparams, sgd)
        state = state.replace(critic=critic_lib.CriticState(cstate.params, cstate.opt_state))
        new, metrics = step(state, batch)
        assert float(metrics["loss"]) == pytest.approx(float(ref_loss), rel=1e-5)
        assert 0 < float(metrics["value/clip_fraction"]) < 1
        assert 0 < float(metrics["clip_fraction"]) < 1
        for before, after, g in zip(
            jax.tree.leaves((policy, cparams)),
            jax.tree.leaves((new.params, new.critic.params)),
            jax.tree.leaves((g_pol, g_crit)),
        ):
            np.testing.assert_allclose(before - after, g, atol=2e-6, rtol=1e-4)
    if kind == "separate":  # the value loss does not reach the policy
        no_value = critic_lib.make_ppo_step(
            ARCH,
            dataclasses.replace(critic, cfg=CriticConfig(value_coef=1e-9)),
            sgd,
            sgd,
            settings,
            max_len=15,
        )
        other, _ = jax.jit(no_value)(state, batch)
        for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(other.params)):
            np.testing.assert_allclose(a, b, atol=1e-6)


# -- packed == unpacked ---------------------------------------------------------------------
def ppo_samples(seed: int = 0) -> list[Sample]:
    """tests/test_packing.py's completions (varied lengths, one fills a row) with 0/1 rewards."""
    rng = np.random.default_rng(seed + 100)
    return [dataclasses.replace(s, reward=float(rng.integers(0, 2))) for s in packing_samples(seed)]


def ppo_batches(updates: int = 1):
    s = ppo_samples()
    unpacked = collate(s, rows=len(s), seq_len=SEQ, pad_id=0)
    packed, slots = collate_packed(
        s, rows=len(s), seq_len=SEQ, pad_id=0, max_tokens=96, updates=updates
    )
    assert packed.n_micro > updates and packed.tokens.rows < unpacked.tokens.rows
    np.testing.assert_array_equal(packed.rewards_BxT[slots], unpacked.rewards_BxT)
    rng = np.random.default_rng(1)
    old = unpacked.sampler_logp_BxT + 0.1 * rng.standard_normal(unpacked.mask_BxT.shape)
    ref = unpacked.sampler_logp_BxT - 0.2 * unpacked.mask_BxT
    unpacked = unpacked.replace(old_logp_BxT=old.astype(np.float32), ref_logp_BxT=ref)
    on_slots = {}
    for name in ("old_logp_BxT", "ref_logp_BxT"):
        x = np.zeros_like(packed.mask_BxT)
        x[slots] = getattr(unpacked, name)
        on_slots[name] = x
    packed = packed.replace(**on_slots)
    return jax.tree.map(jnp.asarray, unpacked), jax.tree.map(jnp.asarray, packed), slots


def critic_state(params, opt):
    c = init_state(params, opt)
    return critic_lib.CriticState(c.params, c.opt_state)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, overrides",
    [
        ("separate", {}),
        ("shared", {}),
        ("separate", {"kl_coef": 0.05, "kl_mode": "reward", "kl_estimator": "k3"}),
        ("shared", {"agg": "seq-mean-token-mean", "kl_coef": 0.05, "kl_estimator": "k2"}),
    ],
)
def test_ppo_packed_equals_unpacked(kind, overrides):
    settings = losses.resolve_loss_settings("ppo", **overrides)
    policy = models.init_params(ARCH, jax.random.key(0))
    cparams = critic_params(kind)
    critic = make_critic(kind, gamma=0.95, lam=0.9, value_clip=0.2, value_coef=0.5)
    unpacked, packed, slots = ppo_batches()
    prepare = critic_lib.make_prepare_fn(critic, settings)
    a_batch, a_metrics = prepare(policy, cparams, unpacked)
    b_batch, b_metrics = prepare(policy, cparams, packed)
    for name in ("values_BxT", "advantages_BxT", "returns_BxT"):
        np.testing.assert_allclose(
            getattr(b_batch, name)[slots], getattr(a_batch, name), rtol=1e-5, atol=2e-6
        )
    for key in a_metrics:
        np.testing.assert_allclose(b_metrics[key], a_metrics[key], rtol=1e-5, err_msg=key)
    opt = optax.sgd(0.5)
    kw = dict(max_len=24)
    plain = jax.jit(critic_lib.make_ppo_step(ARCH, critic, opt, opt, settings, n_micro=3, **kw))
    packing = jax.jit(critic_lib.make_ppo_step(ARCH, critic, opt, opt, settings, **kw))
    states = [init_state(policy, opt).replace(critic=critic_state(cparams, opt)) for _ in range(2)]
    a_state, a = plain(states[0], a_batch)
    b_state, b = packing(states[1], b_batch)
    assert sorted(a) == sorted(b)
    assert float(a["value/loss"]) > 0
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=2e-5, atol=2e-6, err_msg=key)
    after = (a_state.params, a_state.critic.params), (b_state.params, b_state.critic.params)
    for x, y in zip(*(jax.tree.leaves(t) for t in after)):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_ppo_packed_mini_batches_equal_unpacked_ones():
    # two PPO updates per batch, each half of the samples packed on its own
    settings = losses.resolve_loss_settings("ppo")
    policy = models.init_params(ARCH, jax.random.key(3))
    cparams = critic_params("separate")
    critic = make_critic("separate", value_clip=0.2)
    unpacked, packed, _ = ppo_batches(updates=2)
    prepare = critic_lib.make_prepare_fn(critic, settings)
    opt = optax.sgd(0.1)  # two steps: keep float noise from compounding
    step = jax.jit(critic_lib.make_ppo_step(ARCH, critic, opt, opt, settings, max_len=24))
    a_state, b_state = (
        init_state(policy, opt).replace(critic=critic_state(cparams, opt)) for _ in range(2)
    )
    a_full, _ = prepare(policy, cparams, unpacked)
    b_full, _ = prepare(policy, cparams, packed)
    for u in range(2):
        a_state, a = step(a_state, mini_batch(a_full, u, 2))
        b_state, b = step(b_state, mini_batch(b_full, u, 2))
        for key in ("loss", "value/loss", "policy_loss", "value/error", "value/mean"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-7, err_msg=key)
    after = (a_state.params, a_state.critic.params), (b_state.params, b_state.critic.params)
    for x, y in zip(*(jax.tree.leaves(t) for t in after)):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)
