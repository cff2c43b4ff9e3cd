"""A user's own preference loss, selected by `module:function` in tests/test_losses_preference.py
(`dpo.variant: user_preference:hinge`). Nothing here is registered."""

import jax.numpy as jnp


def hinge(
    *,
    chosen_logp,
    rejected_logp,
    ref_chosen_logp,
    ref_rejected_logp,
    beta,
    chosen_len=None,
    rejected_len=None,
    margin=1.0,
):
    """SLiC-style hinge: ℓ = max(0, margin − β·h); aux marks the pairs inside the margin."""
    del chosen_len, rejected_len
    h = (chosen_logp - ref_chosen_logp) - (rejected_logp - ref_rejected_logp)
    loss = jnp.maximum(0.0, margin - beta * h)
    return loss, {"active": (loss > 0).astype(jnp.float32)}


def no_beta(*, chosen_logp, rejected_logp):
    """Lacks most of the contract: rejected when selected."""
    return chosen_logp - rejected_logp
