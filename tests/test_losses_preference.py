"""`losses.preference_loss`: each variant's value and gradient derived by hand, every variant
against an independent float64 numpy reference (values, and gradients by central differences),
the global denominator, user variants by `module:function`, and the errors."""

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import losses
from rlvr_jax.losses.preference import needs_reference

BETA = 0.5
# pair 0: h = (−1 − (−2)) − (−3 − (−2)) = 1 + 1 = 2;  pair 1: h = (−2 + 2) − (−1 + 2) = −1
INPUTS = dict(
    chosen_logp=jnp.array([-1.0, -2.0]),
    rejected_logp=jnp.array([-3.0, -1.0]),
    ref_chosen_logp=jnp.array([-2.0, -2.0]),
    ref_rejected_logp=jnp.array([-2.0, -2.0]),
)
LENGTHS = dict(chosen_len=jnp.array([2.0, 4.0]), rejected_len=jnp.array([1.0, 2.0]))


def softplus(x: float) -> float:
    """−log σ(−x) = log(1 + eˣ)."""
    return math.log1p(math.exp(x))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_dpo_by_hand_value_metrics_and_gradient():
    loss, metrics = losses.preference_loss("dpo", beta=BETA, **INPUTS)
    # z = β·h = (1, −0.5); ℓ = −log σ(z) = softplus(−z); the batch mean over 2 pairs
    expected = (softplus(-1.0) + softplus(0.5)) / 2
    np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
    # rewards β·(logp − ref): chosen (0.5, 0), rejected (−0.5, 0.5); margins (1, −0.5)
    np.testing.assert_allclose(float(metrics["dpo/chosen_reward"]), 0.25, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["dpo/rejected_reward"]), 0.0, atol=1e-7)
    np.testing.assert_allclose(float(metrics["dpo/reward_margin"]), 0.25, rtol=1e-6)
    assert float(metrics["dpo/accuracy"]) == 0.5  # pair 0 right, pair 1 wrong
    np.testing.assert_allclose(float(metrics["dpo/chosen_logp"]), -1.5, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["dpo/rejected_logp"]), -2.0, rtol=1e-6)
    assert float(metrics["dpo/loss"]) == float(loss)

    # ∂ℓ/∂logp_w = −β·σ(−z), ∂ℓ/∂logp_l = +β·σ(−z); divided by the 2 pairs
    def of(chosen, rejected):
        inputs = {**INPUTS, "chosen_logp": chosen, "rejected_logp": rejected}
        return losses.preference_loss("dpo", beta=BETA, **inputs)[0]

    g_w, g_l = jax.grad(of, argnums=(0, 1))(INPUTS["chosen_logp"], INPUTS["rejected_logp"])
    expected_w = [-BETA * sigmoid(-1.0) / 2, -BETA * sigmoid(0.5) / 2]
    np.testing.assert_allclose(np.asarray(g_w), expected_w, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g_l), [-g for g in expected_w], rtol=1e-6)


def test_reference_inputs_get_no_gradient():
    def of(ref):
        return losses.preference_loss("dpo", beta=BETA, **{**INPUTS, "ref_chosen_logp": ref})[0]

    np.testing.assert_array_equal(np.asarray(jax.grad(of)(INPUTS["ref_chosen_logp"])), [0.0, 0.0])


def test_dpo_label_smoothing_by_hand():
    loss, _ = losses.preference_loss("dpo", beta=BETA, label_smoothing=0.1, **INPUTS)
    # cDPO: (1 − ε)·softplus(−z) + ε·softplus(z), z = (1, −0.5)
    expected = (0.9 * softplus(-1.0) + 0.1 * softplus(1.0) + 0.9 * softplus(0.5)) / 2 + (
        0.1 * softplus(-0.5)
    ) / 2
    np.testing.assert_allclose(float(loss), expected, rtol=1e-6)


def test_ipo_by_hand():
    loss, _ = losses.preference_loss("ipo", beta=BETA, **INPUTS)
    # 1/(2β) = 1: ℓ = (h − 1)² = (1, 4); mean 2.5; ∂ℓ/∂logp_w = 2(h − 1)/2 = (1, −2)
    np.testing.assert_allclose(float(loss), 2.5, rtol=1e-6)
    grad = jax.grad(
        lambda c: losses.preference_loss("ipo", beta=BETA, **{**INPUTS, "chosen_logp": c})[0]
    )(INPUTS["chosen_logp"])
    np.testing.assert_allclose(np.asarray(grad), [1.0, -2.0], rtol=1e-6)


def test_dpo_norm_by_hand():
    loss, metrics = losses.preference_loss("dpo_norm", beta=BETA, **INPUTS, **LENGTHS)
    # per-token margins: pair 0: 1/2 − (−1)/1 = 1.5; pair 1: 0/4 − 1/2 = −0.5; z = β·h̄
    expected = (softplus(-0.75) + softplus(0.25)) / 2
    np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
    # the variant's own rewards β·Δ/|y|: chosen (0.25, 0), rejected (−0.5, 0.25)
    np.testing.assert_allclose(float(metrics["dpo/chosen_reward"]), 0.125, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["dpo/rejected_reward"]), -0.125, rtol=1e-6)
    assert float(metrics["dpo/accuracy"]) == 0.5


def test_simpo_by_hand_ignores_the_reference():
    kwargs = dict(beta=2.0, gamma=0.5, **LENGTHS)
    loss, metrics = losses.preference_loss("simpo", **INPUTS, **kwargs)
    # β·logp/|y|: chosen (−1, −1), rejected (−6, −1); z = r_w − r_l − γ = (4.5, −0.5)
    expected = (softplus(-4.5) + softplus(0.5)) / 2
    np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["dpo/reward_margin"]), 2.5, rtol=1e-6)
    moved = {**INPUTS, "ref_chosen_logp": jnp.array([5.0, -9.0])}
    assert float(losses.preference_loss("simpo", **moved, **kwargs)[0]) == float(loss)
    assert not needs_reference("simpo") and needs_reference("dpo") and needs_reference("dpo_norm")


# -- an independent float64 reference ----------------------------------------------------


def reference(variant, w, lo, rw, rl, lw, ll, beta, **kw):
    """Per-pair losses in numpy float64, from the papers' formulas."""
    log_sigmoid = lambda x: -np.logaddexp(0.0, -x)
    h = (w - rw) - (lo - rl)
    if variant == "dpo":
        eps = kw.get("label_smoothing", 0.0)
        return -(1 - eps) * log_sigmoid(beta * h) - eps * log_sigmoid(-beta * h)
    if variant == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    if variant == "dpo_norm":
        return -log_sigmoid(beta * ((w - rw) / lw - (lo - rl) / ll))
    if variant == "simpo":
        return -log_sigmoid(beta * w / lw - beta * lo / ll - kw.get("gamma", 0.5))
    raise AssertionError(variant)


@pytest.mark.parametrize(
    "variant, kwargs",
    [
        ("dpo", {}),
        ("dpo", {"label_smoothing": 0.2}),
        ("ipo", {}),
        ("dpo_norm", {}),
        ("simpo", {"gamma": 0.3}),
    ],
)
def test_variants_match_an_independent_reference_and_its_numeric_gradient(variant, kwargs):
    rng = np.random.default_rng(7)
    B = 6
    w, lo = rng.normal(-20, 5, B), rng.normal(-20, 5, B)
    rw, rl = w + rng.normal(0, 2, B), lo + rng.normal(0, 2, B)
    lw, ll = rng.integers(1, 30, B).astype(float), rng.integers(1, 30, B).astype(float)
    mask = np.array([1, 1, 0, 1, 1, 1], np.float64)  # pair 2 does not count
    beta = 0.3

    def ours(w_, lo_):
        return losses.preference_loss(
            variant,
            chosen_logp=w_,
            rejected_logp=lo_,
            ref_chosen_logp=jnp.asarray(rw, jnp.float32),
            ref_rejected_logp=jnp.asarray(rl, jnp.float32),
            beta=beta,
            chosen_len=jnp.asarray(lw, jnp.float32),
            rejected_len=jnp.asarray(ll, jnp.float32),
            mask=jnp.asarray(mask, jnp.float32),
            **kwargs,
        )[0]

    def ref(w_, lo_):
        return float((mask * reference(variant, w_, lo_, rw, rl, lw, ll, beta, **kwargs)).sum() / 5)

    args = (jnp.asarray(w, jnp.float32), jnp.asarray(lo, jnp.float32))
    np.testing.assert_allclose(float(ours(*args)), ref(w, lo), rtol=2e-5)
    g_w, g_l = jax.grad(ours, argnums=(0, 1))(*args)
    step = 1e-5
    for grad, which in ((g_w, 0), (g_l, 1)):
        numeric = np.zeros(B)
        for i in range(B):
            plus, minus = [w.copy(), lo.copy()], [w.copy(), lo.copy()]
            plus[which][i] += step
            minus[which][i] -= step
            numeric[i] = (ref(*plus) - ref(*minus)) / (2 * step)
        np.testing.assert_allclose(np.asarray(grad), numeric, rtol=1e-3, atol=1e-6)
    assert float(grad[2]) == 0.0  # the masked pair


def test_global_denominator_makes_halves_sum_to_the_whole():
    rng = np.random.default_rng(0)
    arrays = {
        k: jnp.asarray(rng.normal(-10, 3, 4), jnp.float32)
        for k in ("chosen_logp", "rejected_logp", "ref_chosen_logp", "ref_rejected_logp")
    }
    whole, whole_m = losses.preference_loss("dpo", beta=0.2, **arrays)
    halves = [
        losses.preference_loss(
            "dpo",
            beta=0.2,
            mask=jnp.asarray(m, jnp.float32),
            loss_denominator=4.0,
            **arrays,
        )
        for m in ([1, 1, 0, 0], [0, 0, 1, 1])
    ]
    np.testing.assert_allclose(float(sum(h[0] for h in halves)), float(whole), rtol=1e-6)
    for key, value in whole_m.items():
        np.testing.assert_allclose(
            float(sum(h[1][key] for h in halves)), float(value), rtol=1e-5, atol=1e-7
        )


def test_user_variant_by_module_function(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # tests/user_preference.py
    loss, metrics = losses.preference_loss("user_preference:hinge", beta=BETA, margin=1.5, **INPUTS)
    # ℓ = max(0, 1.5 − β·h) = max(0, 1.5 − 1) = 0.5 and max(0, 1.5 + 0.5) = 2.0
    np.testing.assert_allclose(float(loss), 1.25, rtol=1e-6)
    assert float(metrics["dpo/active"]) == 1.0
    assert losses.get_preference_loss("user_preference:hinge").__name__ == "hinge"


def test_registered_names():
    from rlvr_jax.losses.preference import PREFERENCE_LOSSES

    assert set(PREFERENCE_LOSSES.canonical_names()) >= {"dpo", "ipo", "dpo_norm", "simpo"}


@pytest.mark.parametrize(
    "variant, extra, message",
    [
        ("dpo_typo", {}, "unknown preference loss 'dpo_typo'"),
        ("dpo", {"gamma": 1.0}, "takes no parameter 'gamma'"),
        ("dpo", {"beta": 0.0}, "beta must be > 0"),
        ("dpo", {"label_smoothing": 0.7}, "label_smoothing must be in"),
        ("simpo", {"chosen_len": None}, "length-normalised: give chosen_len"),
        ("dpo", {"rejected_logp": jnp.zeros(3)}, r"rejected_logp has shape \(3,\)"),
        ("dpo", {"chosen_logp": jnp.zeros((2, 1))}, "one value per pair"),
        ("user_preference:no_beta", {}, "must accept the keyword arguments"),
        ("nonexistent_module_xyz:f", {}, "cannot import module"),
    ],
)
def test_errors_name_the_problem(monkeypatch, variant, extra, message):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    kwargs = {"beta": BETA, **INPUTS, **LENGTHS, **extra}
    with pytest.raises(ValueError, match=message):
        losses.preference_loss(variant, **kwargs)
