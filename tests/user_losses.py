"""A user's own loss module, selected by `module:function` in tests/test_losses_registry.py.

The tests put tests/ on sys.path and select `user_losses:weighted_pg`, as a YAML config would
(`loss.variant: user_losses:weighted_pg`). Nothing here is registered.
"""

import jax.numpy as jnp

NOT_A_FUNCTION = 3
"""For the test that a non-callable `module:attribute` is rejected."""


def weighted_pg(*, logp, old_logp, advantages, mask, pos_scale=1.0, neg_scale=1.0):
    """Importance-weighted policy gradient with separate weights for positive/negative advantages.

    ℓ = −r·A·(pos_scale if A > 0 else neg_scale), r = exp(logp − old_logp); aux marks A > 0.
    """
    del mask
    scale_BxT = jnp.where(advantages > 0, pos_scale, neg_scale)
    loss_BxT = -jnp.exp(logp - old_logp) * advantages * scale_BxT
    return loss_BxT, {"positive": advantages > 0}


def median_baseline(rewards_PxG):
    """Advantages R − median_g R (a user advantage estimator)."""
    return rewards_PxG - jnp.median(rewards_PxG, axis=1, keepdims=True)


def my_preset():
    """A user preset bundling the variant above with DAPO-like settings."""
    return {
        "variant": "user_losses:weighted_pg",
        "advantage": "user_losses:median_baseline",
        "agg": "seq-mean-token-sum",
        "variant_kwargs": {"pos_scale": 2.0},
    }
