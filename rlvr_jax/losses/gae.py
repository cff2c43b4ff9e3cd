"""PPO with a learned critic: GAE advantages per token and the (clipped) value loss.

The completion is a token-level episode: the state s_t is the prompt and the tokens before
o_t, the action is o_t, and the reward is 0 on every token but the last, which gets the
completion's verifier reward R (with `loss.kl_mode: reward`, every token also gets −β·KL_t).
On the learner's shifted grid, position t holds the action `target_ids[t]`, its log-prob and
the critic's V_t = V(s_t) (the value head on the hidden state that predicts `target_ids[t]`).

    δ_t  = r_t + γ·V_{t+1} − V_t          V after the last completion token = 0 (terminal)
    A_t  = δ_t + γλ·A_{t+1} = Σ_l (γλ)^l·δ_{t+l}
    R̂_t = A_t + V_t                       the value targets ("returns")
    ℓ_V  = ½·max((V − R̂)², (V_old + clip(V − V_old, −ε_V, ε_V) − R̂)²)

(Schulman et al. 2016, GAE; PPO's clipped value loss as in OpenAI baselines' PPO2.) γ = 1,
λ = 0.95 are the usual choices for LMs (the "modern RL for LMs" talk).

Episodes are the contiguous runs of the mask, or, with `segment_ids_BxT`, the segments of a
packed row: within a segment, masked positions (the prompt, tokens inserted by the engine) are
skipped — V_{t+1} and A_{t+1} then mean the next *unmasked* position of the same segment —
and the recursion never crosses from one segment to the next. Both are solved by two reverse
linear recurrences x_t = a_t·x_{t+1} + b_t, each an `associative_scan` (log T depth on
accelerators instead of a T-step loop).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.losses.masked import masked_mean, masked_std, masked_sum

GAE = "gae"  # `loss.advantage: gae`, per token on the learner (not in the group registry)
WHITEN_EPS = 1e-8


def _reverse_linear_scan(a_BxT: jax.Array, b_BxT: jax.Array) -> jax.Array:
    """x with x_t = a_t·x_{t+1} + b_t along axis 1 and x_T = 0."""

    def compose(later: tuple, earlier: tuple) -> tuple:
        # x ↦ a_e·(a_l·x + b_l) + b_e: the earlier map applied after the later one
        a_l, b_l = later
        a_e, b_e = earlier
        return a_e * a_l, a_e * b_l + b_e

    _, x_BxT = jax.lax.associative_scan(compose, (a_BxT, b_BxT), reverse=True, axis=1)
    return x_BxT


def _continues(mask_BxT: jax.Array, segment_ids_BxT: Any) -> jax.Array:
    """c_t = 1 where position t + 1 belongs to the same episode as t (float [B, T])."""
    if segment_ids_BxT is None:
        on = mask_BxT > 0
        same_BxT = on[:, :-1] & on[:, 1:]
    else:
        seg = jnp.asarray(segment_ids_BxT)
        if seg.shape != mask_BxT.shape:
            raise ValueError(
                f"segment_ids_BxT has shape {seg.shape}, expected the mask's {mask_BxT.shape}"
            )
        same_BxT = (seg[:, :-1] == seg[:, 1:]) & (seg[:, :-1] != 0)
    last = jnp.zeros((mask_BxT.shape[0], 1), bool)
    return jnp.concatenate([same_BxT, last], axis=1).astype(jnp.float32)


def gae(
    rewards_BxT: jax.Array,
    values_BxT: jax.Array,
    mask_BxT: jax.Array,
    *,
    gamma: float,
    lam: float,
    segment_ids_BxT: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(advantages_BxT, returns_BxT) per the module docstring: float32, 0 where masked, no
    gradient. `mask_BxT` marks the actions; `segment_ids_BxT` (0 = padding) makes each packed
    segment an episode; γ, λ in [0, 1]."""
    r_BxT = jnp.asarray(rewards_BxT, jnp.float32)
    m_BxT = jnp.asarray(mask_BxT).astype(jnp.float32)
    if m_BxT.ndim != 2:
        raise ValueError(f"mask_BxT must be [B, T], got shape {m_BxT.shape}")
    for name, x in (("rewards_BxT", r_BxT), ("values_BxT", jnp.asarray(values_BxT))):
        if x.shape != m_BxT.shape:
            raise ValueError(f"{name} has shape {x.shape}, expected the mask's {m_BxT.shape}")
    for name, x in (("gamma", gamma), ("lam", lam)):
        if isinstance(x, int | float) and not 0.0 <= x <= 1.0:
            raise ValueError(f"gae: {name} must be in [0, 1], got {x}")
    if segment_ids_BxT is not None:  # segment 0 is padding: never an action
        m_BxT = m_BxT * (jnp.asarray(segment_ids_BxT) != 0)
    on = m_BxT > 0
    v_BxT = jnp.where(on, jnp.asarray(values_BxT, jnp.float32), 0.0)
    r_BxT = jnp.where(on, r_BxT, 0.0)
    c_BxT = _continues(m_BxT, segment_ids_BxT)
    off_BxT = 1.0 - m_BxT
    # V̂_t: V_t at an action, else the next action's value within the episode
    v_hat_BxT = _reverse_linear_scan(off_BxT * c_BxT, v_BxT)
    next_v_BxT = c_BxT * jnp.pad(v_hat_BxT[:, 1:], ((0, 0), (0, 1)))
    delta_BxT = m_BxT * (r_BxT + gamma * next_v_BxT - v_BxT)
    # Â_t = δ_t + γλ·c_t·Â_{t+1} at an action, c_t·Â_{t+1} (pass through) elsewhere
    a_hat_BxT = _reverse_linear_scan(c_BxT * (m_BxT * gamma * lam + off_BxT), delta_BxT)
    adv_BxT = m_BxT * a_hat_BxT
    returns_BxT = m_BxT * (adv_BxT + v_BxT)
    return jax.lax.stop_gradient(adv_BxT), jax.lax.stop_gradient(returns_BxT)


def whiten(x_BxT: jax.Array, mask_BxT: jax.Array, eps: float = WHITEN_EPS) -> jax.Array:
    """(x − mean) / (std + ε) over the unmasked entries (population std); 0 where masked."""
    m_BxT = jnp.asarray(mask_BxT).astype(jnp.float32)
    mean, std = masked_mean(x_BxT, m_BxT), masked_std(x_BxT, m_BxT)
    return jnp.where(m_BxT > 0, (x_BxT - mean) / (std + eps), 0.0)


def explained_variance(values_BxT: jax.Array, returns_BxT: jax.Array, mask_BxT: jax.Array):
    """1 − Var[R̂ − V] / Var[R̂] over the unmasked tokens: 1 is a perfect critic, 0 one no
    better than a constant, < 0 worse; NaN when the returns do not vary."""
    m_BxT = jnp.asarray(mask_BxT).astype(jnp.float32)

    def var(x: jax.Array) -> jax.Array:
        return masked_mean(jnp.square(x - masked_mean(x, m_BxT)), m_BxT)

    var_ret = var(returns_BxT)
    ratio = var(returns_BxT - values_BxT) / jnp.where(var_ret > 0, var_ret, 1.0)
    return jnp.where(var_ret > 0, 1.0 - ratio, jnp.nan)


def value_loss(
    values_BxT: jax.Array,
    *,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    clip: float | None = None,
    denominator: jax.Array | float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The critic's loss Σ m·ℓ_V / denominator and its metrics (`value/loss`,
    `value/clip_fraction`, `value/mean`, `value/error` = mean |V − R̂|).

    Only `values_BxT` carries a gradient; `old_values` (V at rollout) anchors the clip ε_V
    (`clip`: None or 0 = plain ½(V − R̂)²); `returns` are `gae`'s R̂; `denominator` is the
    optimizer batch's token count (None = this call's), so micro-batch losses sum.
    """
    m_BxT = jnp.asarray(mask).astype(jnp.float32)
    values_BxT = jnp.asarray(values_BxT, jnp.float32)
    for name, x in (("old_values", old_values), ("returns", returns)):
        if jnp.shape(x) != values_BxT.shape or m_BxT.shape != values_BxT.shape:
            raise ValueError(
                f"value_loss: values {values_BxT.shape}, {name} {jnp.shape(x)} and mask "
                f"{m_BxT.shape} must have one shape"
            )
    on = m_BxT > 0
    v_BxT = jnp.where(on, values_BxT, 0.0)
    old_BxT = jax.lax.stop_gradient(jnp.where(on, jnp.asarray(old_values, jnp.float32), 0.0))
    ret_BxT = jax.lax.stop_gradient(jnp.where(on, jnp.asarray(returns, jnp.float32), 0.0))
    sq_BxT = jnp.square(v_BxT - ret_BxT)
    if clip:
        v_clip_BxT = old_BxT + jnp.clip(v_BxT - old_BxT, -clip, clip)
        sq_clip_BxT = jnp.square(v_clip_BxT - ret_BxT)
        clipped_BxT = (sq_clip_BxT > sq_BxT).astype(jnp.float32)
        sq_BxT = jnp.maximum(sq_BxT, sq_clip_BxT)
    else:
        clipped_BxT = jnp.zeros_like(sq_BxT)
    if denominator is None:
        denominator = jnp.maximum(jnp.sum(m_BxT), 1.0)
    loss = 0.5 * masked_sum(sq_BxT, m_BxT) / denominator
    metrics = {
        "value/loss": loss,
        "value/clip_fraction": masked_mean(clipped_BxT, m_BxT),
        "value/mean": masked_mean(v_BxT, m_BxT),
        "value/error": masked_mean(jnp.abs(v_BxT - ret_BxT), m_BxT),
    }
    return loss, {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}


__all__ = ["GAE", "explained_variance", "gae", "value_loss", "whiten"]
