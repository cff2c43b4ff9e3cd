"""Hand-derived numbers for every variant, aggregation, KL estimator, TIS mode and metric.

Each expected value has its arithmetic in a comment.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import losses
from rlvr_jax.losses import variants

# One row of four tokens with chosen ratios r = exp(logp − old_logp) and per-token advantages.
R_T = np.array([1.5, 0.5, 1.1, 0.7], np.float32)
A_T = np.array([1.0, 1.0, -1.0, -1.0], np.float32)
LOGP_T = np.array([-0.2, -1.0, -0.5, -2.0], np.float32)
OLD_T = LOGP_T - np.log(R_T)


def _row(x):
    return jnp.asarray(x, jnp.float32)[None, :]


def _variant(fn, logp_T=LOGP_T, old_T=OLD_T, adv_T=A_T, **params):
    """Per-token loss, aux and d(Σ_t ℓ_t)/d logp of a variant called directly."""
    mask = jnp.ones((1, len(logp_T)), jnp.float32)

    def total(lp):
        loss, aux = fn(logp=lp, old_logp=_row(old_T), advantages=_row(adv_T), mask=mask, **params)
        return jnp.sum(loss), (loss, aux)

    grad, (loss, aux) = jax.grad(total, has_aux=True)(_row(logp_T))
    return np.asarray(loss[0]), aux, np.asarray(grad[0])


def test_ppo_clip_asymmetric():
    # ε_low = 0.2, ε_high = 0.28; ℓ = −min(r·A, clip(r, 0.8, 1.28)·A)
    # r=1.5, A=+1: min(1.5, 1.28) = 1.28 → ℓ = −1.28 (clipped, no gradient)
    # r=0.5, A=+1: min(0.5, 0.8)  = 0.5  → ℓ = −0.5  (∂ℓ/∂logp = −r·A = −0.5)
    # r=1.1, A=−1: min(−1.1, −1.1)      → ℓ = 1.1   (∂ = +1.1)
    # r=0.7, A=−1: min(−0.7, −0.8) = −0.8 → ℓ = 0.8 (clipped)
    loss, aux, grad = _variant(variants.ppo_clip, eps_low=0.2, eps_high=0.28)
    np.testing.assert_allclose(loss, [-1.28, -0.5, 1.1, 0.8], rtol=1e-5)
    np.testing.assert_allclose(grad, [0.0, -0.5, 1.1, 0.0], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(aux["clipped"][0], [True, False, False, True])


def test_ppo_clip_default_ranges_are_symmetric():
    # defaults 0.2/0.2: r=1.5, A=1 → clip at 1.2 → ℓ = −1.2
    loss, _, _ = _variant(variants.ppo_clip)
    np.testing.assert_allclose(loss, [-1.2, -0.5, 1.1, 0.8], rtol=1e-5)


def test_ppo_dual_clip():
    # r = 4, A = −1: −min(−4, clip(4, .8, 1.2)·(−1) = −1.2) = 4; dual clip c = 3: min(4, 3) = 3
    # r = 0.5, A = −1: −min(−0.5, −0.8) = 0.8 < 3: unchanged
    r, adv, logp = np.array([4.0, 0.5], np.float32), np.array([-1.0, -1.0]), np.array([-1.0, -1.0])
    loss, _, grad = _variant(variants.ppo_clip, logp, logp - np.log(r), adv)
    np.testing.assert_allclose(loss, [4.0, 0.8], rtol=1e-5)
    np.testing.assert_allclose(grad, [4.0, 0.0], rtol=1e-5)  # −r·A on the unclipped branch
    loss, aux, grad = _variant(variants.ppo_clip, logp, logp - np.log(r), adv, dual_clip=3.0)
    np.testing.assert_allclose(loss, [3.0, 0.8], rtol=1e-5)
    np.testing.assert_allclose(grad, [0.0, 0.0], atol=1e-7)
    np.testing.assert_array_equal(aux["dual_clipped"][0], [True, False])
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        _variant(variants.ppo_clip, dual_clip=0.5)


def test_cispo():
    # defaults ε_low = ∞, ε_high = 0.28: w = min(r, 1.28) = [1.28, 0.5, 1.1, 0.7]
    # ℓ = −w·A·logp: [−1.28·1·(−0.2), −0.5·1·(−1), −1.1·(−1)·(−0.5), −0.7·(−1)·(−2)]
    #             = [0.256, 0.5, −0.55, −1.4];  ∂ℓ/∂logp = −w·A = [−1.28, −0.5, 1.1, 0.7]
    loss, aux, grad = _variant(variants.cispo)
    np.testing.assert_allclose(loss, [0.256, 0.5, -0.55, -1.4], rtol=1e-5)
    np.testing.assert_allclose(grad, [-1.28, -0.5, 1.1, 0.7], rtol=1e-5)
    np.testing.assert_array_equal(aux["clipped"][0], [True, False, False, False])
    # ε_low = 0.2: r = 0.5 and 0.7 are lifted to 0.8 (and keep a gradient: −0.8·A); 1.1 stays
    _, aux, grad = _variant(variants.cispo, eps_low=0.2)
    np.testing.assert_allclose(grad, [-1.28, -0.8, 1.1, 0.8], rtol=1e-5)
    np.testing.assert_array_equal(aux["clipped"][0], [True, True, False, True])


def test_gspo_and_gspo_token():
    # logp − old = [0.3, −0.1, 0.1] (+ one padded token): s = exp(mean) = exp(0.1) = 1.105171
    logp, old = np.array([-1.0, -1.0, -1.0, 0.0]), np.array([-1.3, -0.9, -1.1, -5.0])
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0]])
    adv = jnp.ones((1, 4))
    for fn in (variants.gspo, variants.gspo_token):
        # default ranges 3e-4/4e-4: min(1.105171, 1.0004) → ℓ = −1.0004, clipped everywhere
        loss, aux = fn(logp=_row(logp), old_logp=_row(old), advantages=adv, mask=mask)
        np.testing.assert_allclose(loss[0, :3], [-1.0004] * 3, rtol=1e-6)
        assert bool(jnp.all(aux["clipped"][0, :3]))
        # ε_high = 0.2: unclipped, ℓ = −s·A = −1.105171 on every token
        loss, aux = fn(logp=_row(logp), old_logp=_row(old), advantages=adv, mask=mask, eps_high=0.2)
        np.testing.assert_allclose(loss[0, :3], [-1.105171] * 3, rtol=1e-6)

    # gradient of the FIRST token's loss: gspo spreads ∂s/∂logp_t = s/|o| over the row
    # (−1.105171/3 = −0.368390 on each real token); gspo_token keeps it on token 0 (−s·A).
    def first(fn):
        return jax.grad(
            lambda lp: fn(logp=lp, old_logp=_row(old), advantages=adv, mask=mask, eps_high=0.2)[0][
                0, 0
            ]
        )(_row(logp))[0]

    np.testing.assert_allclose(first(variants.gspo), [-0.368390] * 3 + [0.0], rtol=1e-5)
    np.testing.assert_allclose(first(variants.gspo_token), [-1.105171, 0, 0, 0], rtol=1e-5)


def test_gspo_negative_advantage_clips_low():
    # logp − old = [−0.6, 0]: s = exp(−0.3) = 0.740818; ε = 0.2: −min(−0.740818, −0.8) = 0.8
    loss, aux = variants.gspo(
        logp=_row([-1.6, -1.0]),
        old_logp=_row([-1.0, -1.0]),
        advantages=-jnp.ones((1, 2)),
        mask=jnp.ones((1, 2)),
        eps_low=0.2,
        eps_high=0.2,
    )
    np.testing.assert_allclose(loss[0], [0.8, 0.8], rtol=1e-6)
    assert bool(jnp.all(aux["clipped"]))


def test_reinforce():
    # ℓ = −A·logp: [−2·(−0.2), −(−1)·(−1)] = [0.4, −1.0]; ∂ℓ/∂logp = −A = [−2, 1]
    loss, _, grad = _variant(
        lambda **kw: (variants.reinforce(**kw), {}), [-0.2, -1.0], [-0.3, -1.0], [2.0, -1.0]
    )
    np.testing.assert_allclose(loss, [0.4, -1.0], rtol=1e-6)
    np.testing.assert_allclose(grad, [-2.0, 1.0], rtol=1e-6)
    assert losses.get("pg") is variants.reinforce


# Aggregation: ℓ rows with lengths 4, 2, 1 and an all-masked row holding garbage (NaN).
LOSS_BxT = np.array([[1, 2, 3, 4], [5, 6, 0, 0], [7, 0, 0, 0], [np.nan, 9, 9, 9]], np.float32)
MASK_BxT = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)


@pytest.mark.parametrize(
    ("agg", "expected", "denominator"),
    [
        ("token-mean", 4.0, 7.0),  # (1+2+3+4+5+6+7)/7 = 28/7
        ("seq-mean-token-mean", 5.0, 3.0),  # (2.5 + 5.5 + 7)/3 rows (the empty row not counted)
        ("seq-mean-token-sum", 28 / 3, 3.0),  # (10 + 11 + 7)/3
        ("seq-mean-token-sum-norm", 28 / 24, 24.0),  # 28/(3 rows · max_len 8)
    ],
)
def test_aggregation_modes(agg, expected, denominator):
    got = losses.aggregate(jnp.asarray(LOSS_BxT), jnp.asarray(MASK_BxT), agg, max_len=8)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_allclose(losses.loss_denominator(agg, MASK_BxT, 8), denominator)
    # an explicit (global) denominator replaces the local one: numerator / D
    got = losses.aggregate(
        jnp.asarray(LOSS_BxT), jnp.asarray(MASK_BxT), agg, denominator=56.0, max_len=8
    )
    np.testing.assert_allclose(got, expected * denominator / 56.0, rtol=1e-6)


def test_aggregation_errors():
    with pytest.raises(ValueError, match="needs max_len"):
        losses.aggregate(jnp.asarray(LOSS_BxT), jnp.asarray(MASK_BxT), "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        losses.loss_denominator("seq-mean-token-sum-norm", MASK_BxT, 0)
    # T_max is the generation budget, independent of the padded T (rows may include the prompt)
    assert float(losses.loss_denominator("seq-mean-token-sum-norm", MASK_BxT, 2)) == 6.0
    with pytest.raises(ValueError, match="did you mean 'token-mean'"):
        losses.loss_denominator("token_mean", MASK_BxT)
    # an all-masked batch aggregates to 0, not NaN
    assert float(losses.aggregate(jnp.ones((2, 3)), jnp.zeros((2, 3)), "token-mean")) == 0.0


# KL: δ = ref − logp = [0.5, 0, 1].
KL_LOGP, KL_REF = np.array([-1.0, -0.5, -2.0]), np.array([-0.5, -0.5, -1.0])


@pytest.mark.parametrize(
    ("name", "value", "grad"),
    [
        ("k1", [-0.5, 0.0, -1.0], [1.0, 1.0, 1.0]),  # −δ; ∂/∂logp = +1
        ("k2", [0.125, 0.0, 0.5], [-0.5, 0.0, -1.0]),  # ½δ²; ∂ = −δ
        # e^δ − 1 − δ = [1.648721 − 1.5, 0, 2.718282 − 2]; ∂ = 1 − e^δ
        ("k3", [0.148721, 0.0, 0.718282], [-0.648721, 0.0, -1.718282]),
    ],
)
def test_kl_estimators(name, value, grad):
    fn = losses.get_kl_estimator(name)
    np.testing.assert_allclose(fn(_row(KL_LOGP), _row(KL_REF))[0], value, rtol=1e-5, atol=1e-7)
    g = jax.grad(lambda lp: jnp.sum(fn(lp, _row(KL_REF))))(_row(KL_LOGP))
    np.testing.assert_allclose(g[0], grad, rtol=1e-5, atol=1e-7)


def test_kl_loss_term_and_reward_penalty():
    mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    logp = jnp.array([KL_LOGP, [-1.0, -1.0, 0.0]])
    ref = jnp.array([KL_REF, [-1.0, -2.0, 0.0]])
    # row 1: δ = [0, −1] → k3 = [0, e^−1 − 1 + 1] = [0, 0.367879]
    # penalty β·Σ k3 with β = 0.1: row 0: 1 − 0.1·0.867003 = 0.913300; row 1: 0 − 0.036788
    np.testing.assert_allclose(
        losses.kl_reward_penalty(
            jnp.array([1.0, 0.0]), logp=logp, ref_logp=ref, mask=mask, kl_coef=0.1
        ),
        [0.913300, -0.036788],
        rtol=1e-5,
    )
    # As a loss term (A = 0, so only β·k3 remains), token-mean over 5 tokens, β = 0.5:
    # 0.5·(0.148721 + 0 + 0.718282 + 0 + 0.367879)/5 = 0.5·1.234882/5 = 0.123488
    # TIS with weight 2 everywhere (old − sampler = log 2 ≥ log C) must not touch the KL term.
    kwargs = dict(logp=logp, old_logp=logp, advantages=jnp.zeros(2), mask=mask, ref_logp=ref)
    loss, metrics = losses.policy_loss("reinforce", kl_coef=0.5, **kwargs)
    np.testing.assert_allclose(loss, 0.123488, rtol=1e-5)
    np.testing.assert_allclose(metrics["kl/ref"], 1.234882 / 5, rtol=1e-5)
    loss_tis, _ = losses.policy_loss(
        "reinforce", kl_coef=0.5, sampler_logp=logp - math.log(2.0), tis_cap=2.0, **kwargs
    )
    np.testing.assert_allclose(loss_tis, 0.123488, rtol=1e-5)
    with pytest.raises(ValueError, match="needs ref_logp"):
        losses.policy_loss("reinforce", kl_coef=0.5, **{**kwargs, "ref_logp": None})


# TIS: old − sampler = [[0.5, −0.2, 1.0], [0.1, −3.0, pad]]; ℓ = 1 on every token (reinforce
# with logp = −1 and A = 1), so the token-mean loss is Σ w / (kept tokens).
TIS_MASK = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
TIS_OLD = jnp.array([[-1.0, -1.0, -1.0], [-1.0, -1.0, 0.0]])
TIS_SAMPLER = TIS_OLD - jnp.array([[0.5, -0.2, 1.0], [0.1, -3.0, 0.0]])


def _tis_loss(**tis):
    return losses.policy_loss(
        "reinforce",
        logp=TIS_OLD,
        old_logp=TIS_OLD,
        advantages=jnp.ones(2),
        mask=TIS_MASK,
        sampler_logp=TIS_SAMPLER,
        **tis,
    )


@pytest.mark.parametrize(
    ("tis", "expected", "kept"),
    [
        # ρ = [1.648721, 0.818731, 2.718282 → 2, 1.105171, 0.049787]: Σ = 5.622410, /5
        ({"tis_cap": 2.0}, 1.124482, 5),
        # products: row 0 e^1.3 = 3.669 → 2 (3 tokens), row 1 e^−2.9 = 0.055023 (2 tokens)
        ({"tis_cap": 2.0, "tis_mode": "sequence"}, (6 + 2 * 0.055023) / 5, 5),
        # geometric means: row 0 e^(1.3/3) = 1.542390, row 1 e^−1.45 = 0.234570
        ({"tis_cap": 2.0, "tis_mode": "geometric"}, (3 * 1.542390 + 2 * 0.234570) / 5, 5),
        # mask [0.5, 2]: drops ρ = 2.718 and 0.0498 → 3 kept tokens, weight 1: 3/3 (not 3/5)
        ({"tis_mode": "mask", "tis_low": 0.5, "tis_high": 2.0}, 1.0, 3),
        # mask + cap 1.5: kept weights [1.5, 0.818731, 1.105171] → 3.423902/3
        ({"tis_mode": "mask", "tis_low": 0.5, "tis_high": 2.0, "tis_cap": 1.5}, 3.423902 / 3, 3),
    ],
)
def test_tis_modes(tis, expected, kept):
    loss, metrics = _tis_loss(**tis)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert float(metrics["tokens"]) == kept
    np.testing.assert_allclose(metrics["tis/masked_fraction"], 1 - kept / 5, atol=1e-6)


def test_tis_metrics_and_sampler_learner_kl():
    _, metrics = _tis_loss(tis_cap=2.0)
    np.testing.assert_allclose(metrics["tis/mean"], 1.124482, rtol=1e-5)
    np.testing.assert_allclose(metrics["tis/min"], 0.049787, rtol=1e-5)
    np.testing.assert_allclose(metrics["tis/max"], 2.0, rtol=1e-6)
    np.testing.assert_allclose(metrics["tis/truncated_fraction"], 0.2)  # 1 of 5 above C
    # k3 with δ = old − sampler: e^δ − 1 − δ = [.148721, .018731, .718282, .005171, 2.049787]
    np.testing.assert_allclose(metrics["kl/sampler_learner"], 2.940692 / 5, rtol=1e-5)


def test_tis_kept_mask_helper_and_settings_denominator():
    kept = losses.tis_kept_mask(
        TIS_MASK, old_logp=TIS_OLD, sampler_logp=TIS_SAMPLER, tis_low=0.5, tis_high=2.0
    )
    np.testing.assert_array_equal(kept, [[1, 1, 0], [1, 0, 0]])
    settings = losses.resolve_loss_settings(None, tis_mode="mask", tis_low=0.5, tis_high=2.0)
    denom = settings.loss_denominator(TIS_MASK, old_logp=TIS_OLD, sampler_logp=TIS_SAMPLER)
    assert float(denom) == 3.0


@pytest.mark.parametrize(
    ("tis", "message"),
    [
        ({"tis_cap": 0.0}, "tis_cap must be > 0"),
        ({"tis_cap": 2.0, "tis_low": 0.5}, "only apply to tis_mode='mask'"),
        ({"tis_mode": "mask"}, "needs tis_low and/or tis_high"),
        ({"tis_mode": "mask", "tis_low": 2.0, "tis_high": 1.0}, "tis_low must be < tis_high"),
        ({"tis_cap": 2.0, "tis_mode": "tokens"}, "did you mean 'token'"),
        ({"tis_cap": 2.0, "ratio_denominator": "sampler"}, "ratio_denominator='sampler'"),
    ],
)
def test_tis_errors(tis, message):
    with pytest.raises(ValueError, match=message):
        _tis_loss(**tis)


def test_tis_needs_sampler_logp():
    with pytest.raises(ValueError, match="needs old_logp and sampler_logp"):
        losses.policy_loss(
            "reinforce",
            logp=TIS_OLD,
            old_logp=TIS_OLD,
            advantages=jnp.ones(2),
            mask=TIS_MASK,
            tis_cap=2.0,
        )


def test_policy_loss_metrics():
    logits = jnp.log(jnp.array([0.5, 0.25, 0.125, 0.125]))
    loss, metrics = losses.policy_loss(
        "ppo_clip",
        logp=_row(LOGP_T),
        old_logp=_row(OLD_T),
        advantages=_row(A_T),
        mask=jnp.ones((1, 4)),
        eps_high=0.28,
        logits=jnp.broadcast_to(logits, (1, 4, 4)),
    )
    # per-token ℓ from test_ppo_clip_asymmetric: (−1.28 − 0.5 + 1.1 + 0.8)/4 = 0.03
    np.testing.assert_allclose(loss, 0.03, rtol=1e-4)
    assert float(metrics["clip_fraction"]) == 0.5  # tokens 0 and 3
    np.testing.assert_allclose(metrics["ratio/mean"], 0.95, rtol=1e-5)  # (1.5+.5+1.1+.7)/4
    np.testing.assert_allclose(metrics["ratio/min"], 0.5, rtol=1e-5)
    np.testing.assert_allclose(metrics["ratio/max"], 1.5, rtol=1e-5)
    # k3 with δ = old − logp = −ln r: 1/r − 1 + ln r = [.072132, .306853, .004401, .071896]
    np.testing.assert_allclose(metrics["kl/old_new"], 0.455282 / 4, rtol=1e-4)
    # H = .5 ln 2 + .25 ln 4 + 2·.125 ln 8 = 1.213008
    np.testing.assert_allclose(metrics["entropy"], 1.213008, rtol=1e-5)
    # advantages given per token: mean 0, population std 1
    np.testing.assert_allclose(metrics["advantages/std"], 1.0, rtol=1e-6)
    assert "kl/sampler_learner" not in metrics  # no sampler log-probs given


def test_ratio_denominator_sampler():
    # the ratio is exp(logp − sampler_logp); old_logp is not needed
    sampler = LOGP_T - np.log(R_T)
    loss, metrics = losses.policy_loss(
        "ppo_clip",
        logp=_row(LOGP_T),
        old_logp=None,
        sampler_logp=_row(sampler),
        advantages=_row(A_T),
        mask=jnp.ones((1, 4)),
        eps_high=0.28,
        ratio_denominator="sampler",
    )
    np.testing.assert_allclose(loss, 0.03, rtol=1e-4)
    np.testing.assert_allclose(metrics["ratio/mean"], 0.95, rtol=1e-5)
    with pytest.raises(ValueError, match="needs old_logp"):
        losses.policy_loss(
            "ppo_clip",
            logp=_row(LOGP_T),
            old_logp=None,
            advantages=_row(A_T),
            mask=jnp.ones((1, 4)),
        )


def test_padding_values_never_leak():
    # -inf / NaN under the mask (as a sampler may pad) leave loss, gradient and metrics finite.
    logp = jnp.array([[-1.0, -0.5, jnp.nan]])
    old = jnp.array([[-1.1, -0.4, -jnp.inf]])
    mask = jnp.array([[1.0, 1.0, 0.0]])

    def f(lp):
        return losses.policy_loss(
            "ppo_clip",
            logp=lp,
            old_logp=old,
            sampler_logp=old,
            advantages=jnp.ones(1),
            mask=mask,
            tis_cap=2.0,
            ref_logp=old,
            kl_coef=0.1,
        )

    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(logp)
    assert np.isfinite(float(loss)) and np.isfinite(np.asarray(grad)).all()
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert float(grad[0, 2]) == 0.0


def test_mismatch_metrics_split_the_sampler_learner_kl_by_lag():
    # five masked-in tokens (the sixth is padding); δ = old − sampler
    old = jnp.asarray([[-1.0, -2.0, -0.5], [-3.0, -1.25, 9.0]], jnp.float32)
    sampler = jnp.asarray([[-1.0, -2.5, -0.5], [-2.0, -1.0, 0.0]], jnp.float32)
    mask = jnp.asarray([[1, 1, 1], [1, 1, 0]], jnp.float32)
    lag = jnp.asarray([[0, 0, 1], [0, 2, 0]], jnp.int32)
    m = losses.mismatch_metrics(old, sampler, mask, lag)
    # lag 0 and in the mask: (0,0) δ=0, (0,1) δ=.5, (1,0) δ=-1 — the padding (1,2) excluded
    # k3 = e^δ − 1 − δ: 0, .148721, .367879; mean .172200
    np.testing.assert_allclose(m["mismatch/kl"], (0.148721 + 0.367879) / 3, rtol=1e-5)
    np.testing.assert_allclose(m["mismatch/max_abs_logp"], 1.0)
    np.testing.assert_allclose(m["mismatch/bitwise_equal_fraction"], 1 / 3, rtol=1e-6)
    assert float(m["mismatch/tokens"]) == 3 and float(m["lag/tokens"]) == 2
    # lagging: (0,2) δ=0 → 0, (1,1) δ=-.25 → e^-.25 − .75 = .028801; mean .014400
    np.testing.assert_allclose(m["lag/kl"], 0.028801 / 2, rtol=1e-4)
    none = losses.mismatch_metrics(old, sampler, mask, jnp.ones_like(lag))
    assert float(none["mismatch/kl"]) == 0 and float(none["mismatch/tokens"]) == 0
