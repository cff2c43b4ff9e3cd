"""Every registered loss variant accepts `policy_loss`'s full public signature: the clip
ranges are ignored by a variant without one; only unknown `variant_kwargs` are errors."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import losses
from rlvr_jax.losses.variants import LOSSES, variant_parameters

B, T = 3, 5


def _inputs():
    rng = np.random.default_rng(0)
    logp = jnp.asarray(-rng.uniform(0.1, 3.0, (B, T)), jnp.float32)
    old = logp + jnp.asarray(rng.normal(0, 0.3, (B, T)), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(B, T)) > 0.2, jnp.float32)
    return {
        "logp": logp,
        "old_logp": old,
        "advantages": jnp.asarray([1.0, -0.5, 0.25]),
        "mask": mask,
        "sampler_logp": old + 0.01,
        "ref_logp": old - 0.02,
    }


FULL = {
    "eps_low": 0.2,
    "eps_high": 0.28,
    "agg": "seq-mean-token-sum-norm",
    "tis_cap": 2.0,
    "tis_mode": "token",
    "kl_coef": 0.01,
    "kl_estimator": "k3",
    "loss_denominator": 7.0,
    "max_len": T,
    "ratio_denominator": "old",
}


@pytest.mark.parametrize("variant", LOSSES.canonical_names())
def test_every_variant_takes_the_full_signature(variant):
    inputs = _inputs()
    loss, metrics = losses.policy_loss(variant, **inputs, **FULL, logits=jnp.zeros((B, T, 4)))
    assert np.isfinite(float(loss)) and np.isfinite(float(metrics["tokens"]))
    own = variant_parameters(LOSSES.get(variant))
    if "eps_low" not in own and "eps_high" not in own:  # no clipping: the ranges are ignored
        no_clip = {k: v for k, v in FULL.items() if k not in ("eps_low", "eps_high")}
        plain, _ = losses.policy_loss(variant, **inputs, **no_clip)
        assert float(loss) == pytest.approx(float(plain), rel=1e-6)


@pytest.mark.parametrize("variant", LOSSES.canonical_names())
def test_only_unknown_variant_kwargs_are_errors(variant):
    with pytest.raises(ValueError, match=rf"'{variant}' takes no parameter 'not_a_param'"):
        losses.policy_loss(variant, **_inputs(), **FULL, not_a_param=1.0)


@pytest.mark.parametrize("variant", LOSSES.canonical_names())
def test_a_config_with_clip_ranges_can_switch_to_any_variant(variant):
    # every preset sets clip ranges; replacing the variant keeps them valid
    s = losses.LossSettings(variant=variant, eps_low=0.2, eps_high=0.28)
    assert s.policy_loss_kwargs()["variant"] == variant
    with pytest.raises(losses.LossSettingsError, match=r"eps_low must be >= 0"):
        losses.LossSettings(variant=variant, eps_low=-0.1)
