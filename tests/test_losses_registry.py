"""Registries (names, `module:function`, errors), the variant contract, presets and settings."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import losses
from rlvr_jax.config.schema import LossConfig
from rlvr_jax.losses import variants
from rlvr_jax.losses.advantage import ADVANTAGES
from rlvr_jax.losses.presets import PRESETS
from rlvr_jax.losses.registry import Registry, RegistryError


@pytest.fixture
def user_module_path(monkeypatch):
    """Makes tests/user_losses.py importable as `user_losses` (a user's own module)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


@pytest.fixture
def scratch_registries(monkeypatch):
    """Registrations made by a test are undone afterwards."""
    for registry in (variants.LOSSES, PRESETS):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))


# The README's worked example (Losses): r = 1 everywhere, lengths 2 and 1, A = [1, -0.5].
EX_LOGP = jnp.log(jnp.array([[0.5, 0.5, 1.0], [0.25, 1.0, 1.0]]))
EX_MASK = jnp.array([[1, 1, 0], [1, 0, 0]])
EX_ADV = jnp.array([1.0, -0.5])


def test_registered_names_and_aliases():
    assert variants.LOSSES.canonical_names() == (
        "ppo_clip",
        "cispo",
        "gspo",
        "gspo_token",
        "reinforce",
    )
    assert losses.get is losses.get_loss
    assert losses.get("pg") is losses.get("reinforce")
    assert set(PRESETS.canonical_names()) == {
        "olmo3",
        "grpo",
        "dapo",
        "drgrpo",
        "cispo",
        "gspo",
        "ppo",
    }
    assert set(ADVANTAGES.names()) == {
        "grpo",
        "drgrpo",
        "olmo",
        "rloo",
        "reinforce_pp_baseline",
        "reinforce",
    }
    assert set(losses.KL_ESTIMATORS.names()) == {"k1", "k2", "k3"}


@pytest.mark.parametrize(
    ("lookup", "name", "message"),
    [
        (
            losses.get_loss,
            "ppo_clp",
            r"unknown loss variant 'ppo_clp' \(did you mean 'ppo_clip'\?\)",
        ),
        (losses.get_advantage, "rlo", r"did you mean 'rloo'"),
        (losses.get_preset, "olmo", r"unknown loss preset 'olmo' \(did you mean 'olmo3'\?\)"),
        (losses.get_loss, "zzz", r"Choose from: cispo, gspo, gspo_token, pg, ppo_clip, reinforce"),
        (losses.get_loss, "no_such_module_xyz:fn", r"cannot import module 'no_such_module_xyz'"),
        (
            losses.get_loss,
            "user_losses:missing",
            r"module 'user_losses' has no attribute 'missing'",
        ),
        (losses.get_loss, "user_losses:NOT_A_FUNCTION", r"'NOT_A_FUNCTION' .* is not callable"),
        (losses.get_loss, "user_losses:", r"not of the form 'module:function'"),
        (losses.get_loss, 3, r"must be a name"),
    ],
)
def test_lookup_errors(user_module_path, lookup, name, message):
    with pytest.raises(RegistryError, match=message):
        lookup(name)


@pytest.mark.smoke("losses")
def test_user_variant_by_module_function_jitted(user_module_path):
    """The README's worked example (Losses), with tests/user_losses.py as `my_pkg.my_losses`."""

    def loss_fn(lp, agg):
        return losses.policy_loss(
            "user_losses:weighted_pg",
            logp=lp,
            old_logp=EX_LOGP,
            advantages=EX_ADV,
            mask=EX_MASK,
            pos_scale=2.0,
            agg=agg,
        )

    (loss, metrics), grad = jax.jit(jax.value_and_grad(loss_fn, has_aux=True), static_argnums=1)(
        EX_LOGP, "token-mean"
    )
    # ℓ = [[-2, -2, ·], [0.5, ·, ·]]; token-mean (-2 - 2 + 0.5)/3 = -1.166667
    np.testing.assert_allclose(loss, -3.5 / 3, rtol=1e-6)
    # ∂ℓ/∂logp = ℓ (∂r/∂logp = r = 1), divided by 3 tokens
    np.testing.assert_allclose(grad, [[-2 / 3, -2 / 3, 0], [0.5 / 3, 0, 0]], rtol=1e-6)
    np.testing.assert_allclose(metrics["variant/positive"], 2 / 3, rtol=1e-6)
    # seq-mean-token-mean: (-2 + 0.5)/2
    np.testing.assert_allclose(loss_fn(EX_LOGP, "seq-mean-token-mean")[0], -0.75, rtol=1e-6)


def test_register_decorators(scratch_registries):
    @losses.register_loss("neg_logp_test")
    def neg_logp(*, logp, old_logp, advantages, mask):
        del old_logp, mask
        return -advantages * logp

    assert losses.get("neg_logp_test") is neg_logp
    loss, _ = losses.policy_loss(
        "neg_logp_test", logp=EX_LOGP, old_logp=EX_LOGP, advantages=EX_ADV, mask=EX_MASK
    )
    # −A·logp: row 0: 2·ln 2 (A=1, logp=ln .5), row 1: −0.5·ln 4 → (2 ln 2 − ln 2)/3 = ln 2 / 3
    np.testing.assert_allclose(loss, np.log(2) / 3, rtol=1e-6)
    with pytest.raises(RegistryError, match="already registered"):
        losses.register_loss("ppo_clip")(neg_logp)

    @losses.register_preset("my_test_preset")
    def my_preset():
        return {"variant": "neg_logp_test", "agg": "seq-mean-token-sum"}

    assert losses.resolve_loss_settings("my_test_preset").agg == "seq-mean-token-sum"


def test_registry_rejects_bad_names():
    reg = Registry("thing")
    with pytest.raises(RegistryError, match="without ':'"):
        reg.register("a:b")(len)


def test_variant_contract_errors():
    kwargs = dict(logp=EX_LOGP, old_logp=EX_LOGP, advantages=EX_ADV, mask=EX_MASK)
    with pytest.raises(ValueError, match=r"'reinforce' takes no parameter 'tau'"):
        losses.policy_loss("reinforce", tau=0.2, **kwargs)
    with pytest.raises(ValueError, match=r"takes no parameter 'dual_clp'.*dual_clip"):
        losses.policy_loss("ppo_clip", dual_clp=3.0, **kwargs)
    with pytest.raises(ValueError, match="must accept the keyword arguments logp"):
        losses.policy_loss(lambda *, logp, advantages: -logp, **kwargs)
    with pytest.raises(ValueError, match="needs parameter"):
        losses.policy_loss(lambda *, logp, old_logp, advantages, mask, tau: logp, **kwargs)
    with pytest.raises(ValueError, match=r"returned a loss of shape \(2,\)"):
        losses.policy_loss(lambda **kw: kw["logp"].sum(1), **kwargs)
    with pytest.raises(ValueError, match="eps_low must be >= 0"):
        losses.policy_loss("ppo_clip", eps_low=-0.1, **kwargs)
    with pytest.raises(ValueError, match=r"advantages has shape \(3,\)"):
        losses.policy_loss("ppo_clip", **{**kwargs, "advantages": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"old_logp has shape \(2, 2\)"):
        losses.policy_loss("ppo_clip", **{**kwargs, "old_logp": jnp.ones((2, 2))})
    with pytest.raises(ValueError, match="ratio_denominator must be one of"):
        losses.policy_loss("ppo_clip", ratio_denominator="new", **kwargs)


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        (
            "olmo3",
            dict(
                variant="ppo_clip",
                advantage="olmo",
                eps_low=0.2,
                eps_high=0.272,
                agg="token-mean",
                tis_cap=2.0,
                tis_mode="token",
                kl_coef=0.0,
            ),
        ),
        (
            "grpo",
            dict(
                variant="ppo_clip",
                advantage="grpo",
                eps_low=0.2,
                eps_high=0.2,
                agg="seq-mean-token-mean",
                tis_cap=None,
                kl_coef=0.04,
                kl_estimator="k3",
                kl_mode="loss",
            ),
        ),
        (
            "dapo",
            dict(
                variant="ppo_clip",
                advantage="grpo",
                eps_low=0.2,
                eps_high=0.28,
                agg="token-mean",
                kl_coef=0.0,
            ),
        ),
        ("drgrpo", dict(variant="ppo_clip", advantage="drgrpo", agg="seq-mean-token-sum-norm")),
        ("cispo", dict(variant="cispo", eps_low=None, eps_high=None, agg="token-mean")),
        ("gspo", dict(variant="gspo", eps_low=3e-4, eps_high=4e-4, agg="seq-mean-token-mean")),
    ],
)
def test_presets(preset, expected):
    settings = losses.resolve_loss_settings(preset)
    for key, value in expected.items():
        assert getattr(settings, key) == value, key


def test_explicit_values_override_presets():
    s = losses.resolve_loss_settings("olmo3", eps_high=0.3, agg=None, tis_cap=None)
    assert (s.eps_low, s.eps_high, s.agg, s.tis_cap) == (0.2, 0.3, "token-mean", 2.0)
    # replacing the variant drops the preset's (variant-owned) clip ranges
    s = losses.resolve_loss_settings("olmo3", variant="cispo")
    assert (s.variant, s.eps_low, s.eps_high, s.tis_cap) == ("cispo", None, None, 2.0)
    s = losses.resolve_loss_settings("olmo3", variant="ppo_clip", variant_kwargs={"dual_clip": 3})
    assert (s.eps_high, s.variant_kwargs) == (0.272, {"dual_clip": 3})
    # no preset: the neutral defaults
    s = losses.resolve_loss_settings(None)
    assert (s.variant, s.advantage, s.agg, s.tis_cap, s.kl_coef) == (
        "ppo_clip",
        "grpo",
        "token-mean",
        None,
        0.0,
    )


def test_user_preset_merges_variant_kwargs(user_module_path):
    s = losses.resolve_loss_settings("user_losses:my_preset")
    assert (s.variant, s.advantage, s.agg, s.variant_kwargs) == (
        "user_losses:weighted_pg",
        "user_losses:median_baseline",
        "seq-mean-token-sum",
        {"pos_scale": 2.0},
    )
    s = losses.resolve_loss_settings("user_losses:my_preset", variant_kwargs={"neg_scale": 0.5})
    assert s.variant_kwargs == {"pos_scale": 2.0, "neg_scale": 0.5}
    s = losses.resolve_loss_settings("user_losses:my_preset", variant_kwargs={"pos_scale": 3.0})
    assert s.variant_kwargs == {"pos_scale": 3.0}
    with pytest.raises(losses.LossSettingsError, match=r"takes no parameter 'extra'"):
        losses.resolve_loss_settings("user_losses:my_preset", variant_kwargs={"extra": 1})


def test_settings_drive_policy_loss_and_reward_kl():
    s = losses.resolve_loss_settings("grpo", kl_mode="reward")
    assert s.policy_loss_kwargs()["kl_coef"] == 0.0 and s.reward_kl_coef == 0.04
    assert s.needs_ref_logp
    s = losses.resolve_loss_settings("grpo")
    assert s.policy_loss_kwargs()["kl_coef"] == 0.04 and s.reward_kl_coef == 0.0
    # r = 1 and ref = logp + ln 2: δ = ln 2, k3 = 2 − 1 − ln 2 = 0.306853 on every token.
    # ppo_clip ℓ = −A: row 0 [−1, −1], row 1 [0.5]; each row's token mean gains 0.04·k3 = 0.012274
    # seq-mean-token-mean: (−1 + 0.5)/2 + 0.012274 = −0.237726
    loss, _ = losses.policy_loss(
        **s.policy_loss_kwargs(),
        logp=EX_LOGP,
        old_logp=EX_LOGP,
        ref_logp=EX_LOGP + np.log(2),
        advantages=EX_ADV,
        mask=EX_MASK,
    )
    np.testing.assert_allclose(loss, -0.25 + 0.04 * (1 - np.log(2)), rtol=1e-5)


@pytest.mark.parametrize(
    ("explicit", "message"),
    [
        ({"agg": "token_mean"}, r"loss.agg: unknown aggregation 'token_mean'"),
        ({"variant": "ppo"}, r"loss.variant: unknown loss variant 'ppo'"),
        ({"advantage": "zscore"}, r"loss.advantage: unknown advantage estimator"),
        ({"kl_estimator": "k4"}, r"loss.kl_estimator: unknown KL estimator 'k4'"),
        ({"kl_mode": "both"}, r"loss.kl_mode must be one of"),
        ({"kl_coef": -1.0}, r"loss.kl_coef must be >= 0"),
        ({"tis_mode": "mask"}, r"loss.tis_\*: tis_mode='mask' needs tis_low"),
        ({"tis_cap": 2.0, "ratio_denominator": "sampler"}, r"TIS .* must be off"),
        ({"ratio_denominator": "new"}, r"loss.ratio_denominator must be one of"),
        ({"variant_kwargs": {"agg": "x"}}, r"loss.variant_kwargs: agg are loss settings"),
        (
            {"variant": "reinforce", "variant_kwargs": {"tau": 0.1}},
            r"loss.variant_kwargs: .*takes no parameter 'tau'",
        ),
        ({"eps_hi": 0.3}, r"unknown loss setting\(s\) eps_hi"),
    ],
)
def test_settings_errors_name_the_key(explicit, message):
    with pytest.raises(losses.LossSettingsError, match=message):
        losses.resolve_loss_settings(None, **explicit)


def test_preset_errors(user_module_path, scratch_registries):
    with pytest.raises(losses.LossSettingsError, match=r"loss.preset: unknown loss preset 'olmo4'"):
        losses.resolve_loss_settings("olmo4")
    losses.register_preset("bad_key_test")(lambda: {"eps": 0.2})
    with pytest.raises(losses.LossSettingsError, match="sets unknown loss setting"):
        losses.resolve_loss_settings("bad_key_test")
    losses.register_preset("not_dict_test")(lambda: 3)
    with pytest.raises(losses.LossSettingsError, match="must return a dict"):
        losses.resolve_loss_settings("not_dict_test")


def test_settings_from_loss_config():
    s = losses.loss_settings_from_config(LossConfig(preset="dapo", eps_high=0.3, tis_cap=2.0))
    assert (s.variant, s.eps_low, s.eps_high, s.tis_cap, s.agg) == (
        "ppo_clip",
        0.2,
        0.3,
        2.0,
        "token-mean",
    )
    # every LossConfig field is a LossSettings field (besides `preset`)
    s = losses.loss_settings_from_config(LossConfig())
    assert s == losses.resolve_loss_settings(None)
