"""Preference losses (DPO and relatives): one small function per variant, and `preference_loss`.

Inputs are per-sequence log-probs **summed** over each response's tokens, [B] pairs:

    chosen_logp, rejected_logp           log π_θ(y_w | x), log π_θ(y_l | x)   (with gradient)
    ref_chosen_logp, ref_rejected_logp   the same under the frozen reference π_ref
    chosen_len, rejected_len             |y_w|, |y_l| in tokens (the length-normalised variants)

Variants (ℓ in each docstring; h is the margin, β·(log π_θ − log π_ref) the implicit reward):
`dpo` (Rafailov et al. 2023; cDPO with `label_smoothing`), `ipo` (Azar et al. 2023, summed
log-probs), `dpo_norm` (open-instruct's length-normalised DPO, OLMo 3 Think's with β = 5),
`simpo` (Meng et al. 2024, reference-free, margin `gamma`).

A user variant (`module:function`) takes those keyword arrays ([B]; lengths None when not
given), `beta` and its own `dpo.variant_kwargs`, and returns ℓ[B] or (ℓ[B], aux) with [B]
arrays averaged into `dpo/<name>`; aux["chosen_reward"] / ["rejected_reward"] replace the
implicit rewards. `reference_free = True` on the function (as `simpo`) skips the reference.
`preference_loss` is Σ_b m_b·ℓ_b / D, D = Σ m or the whole optimizer batch's pair count
(`loss_denominator`), so micro-batch losses sum to the batch's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.losses.registry import Registry, check_params, display_name, split_output

PREFERENCE_LOSSES = Registry("preference loss")
register_preference_loss = PREFERENCE_LOSSES.register

PREFERENCE_ARRAYS = (  # what every variant receives, with `beta`
    "chosen_logp",
    "rejected_logp",
    "ref_chosen_logp",
    "ref_rejected_logp",
    "chosen_len",
    "rejected_len",
)


def get_preference_loss(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """The preference variant for a registered name, a `module:function` string or a callable."""
    return PREFERENCE_LOSSES.get(ref)


def needs_reference(variant: str | Callable[..., Any]) -> bool:
    """False for a reference-free variant (its function has `reference_free = True`)."""
    return not getattr(get_preference_loss(variant), "reference_free", False)


def _margin_B(chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp) -> jax.Array:
    """h = (log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))."""
    return (chosen_logp - ref_chosen_logp) - (rejected_logp - ref_rejected_logp)


def _lengths(name: str, chosen_len: Any, rejected_len: Any) -> tuple[jax.Array, jax.Array]:
    if chosen_len is None or rejected_len is None:
        raise ValueError(
            f"preference loss {name!r} is length-normalised: give chosen_len and rejected_len"
        )
    return jnp.maximum(chosen_len, 1.0), jnp.maximum(rejected_len, 1.0)


@register_preference_loss("dpo", "sigmoid")
def dpo(
    *,
    chosen_logp: jax.Array,
    rejected_logp: jax.Array,
    ref_chosen_logp: jax.Array,
    ref_rejected_logp: jax.Array,
    beta: float,
    chosen_len: jax.Array | None = None,
    rejected_len: jax.Array | None = None,
    label_smoothing: float = 0.0,
) -> jax.Array:
    """DPO: ℓ = −log σ(β·h); with label smoothing ε (cDPO), −(1−ε)·log σ(β·h) − ε·log σ(−β·h)."""
    del chosen_len, rejected_len
    if isinstance(label_smoothing, int | float) and not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"dpo: label_smoothing must be in [0, 0.5), got {label_smoothing}")
    z_B = beta * _margin_B(chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp)
    return -(1.0 - label_smoothing) * jax.nn.log_sigmoid(z_B) - label_smoothing * (
        jax.nn.log_sigmoid(-z_B)
    )


@register_preference_loss("ipo")
def ipo(
    *,
    chosen_logp: jax.Array,
    rejected_logp: jax.Array,
    ref_chosen_logp: jax.Array,
    ref_rejected_logp: jax.Array,
    beta: float,
    chosen_len: jax.Array | None = None,
    rejected_len: jax.Array | None = None,
) -> jax.Array:
    """IPO: ℓ = (h − 1/(2β))², β playing the paper's τ (the margin is regressed to 1/(2β))."""
    del chosen_len, rejected_len
    h_B = _margin_B(chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp)
    return jnp.square(h_B - 1.0 / (2.0 * beta))


@register_preference_loss("dpo_norm")
def dpo_norm(
    *,
    chosen_logp: jax.Array,
    rejected_logp: jax.Array,
    ref_chosen_logp: jax.Array,
    ref_rejected_logp: jax.Array,
    beta: float,
    chosen_len: jax.Array | None = None,
    rejected_len: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Length-normalised DPO: ℓ = −log σ(β·[(Δ_w)/|y_w| − (Δ_l)/|y_l|]), Δ = log π_θ − log π_ref;
    the implicit rewards are β·Δ/|y|."""
    len_w, len_l = _lengths("dpo_norm", chosen_len, rejected_len)
    r_w = beta * (chosen_logp - ref_chosen_logp) / len_w
    r_l = beta * (rejected_logp - ref_rejected_logp) / len_l
    return -jax.nn.log_sigmoid(r_w - r_l), {"chosen_reward": r_w, "rejected_reward": r_l}


@register_preference_loss("simpo")
def simpo(
    *,
    chosen_logp: jax.Array,
    rejected_logp: jax.Array,
    ref_chosen_logp: jax.Array,
    ref_rejected_logp: jax.Array,
    beta: float,
    chosen_len: jax.Array | None = None,
    rejected_len: jax.Array | None = None,
    gamma: float = 0.5,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """SimPO: ℓ = −log σ(β·log π_θ(y_w)/|y_w| − β·log π_θ(y_l)/|y_l| − γ); no reference (its
    inputs are ignored); the rewards are β·log π_θ(y)/|y|."""
    del ref_chosen_logp, ref_rejected_logp
    len_w, len_l = _lengths("simpo", chosen_len, rejected_len)
    r_w, r_l = beta * chosen_logp / len_w, beta * rejected_logp / len_l
    return -jax.nn.log_sigmoid(r_w - r_l - gamma), {"chosen_reward": r_w, "rejected_reward": r_l}


simpo.reference_free = True  # type: ignore[attr-defined]


def _pair_array(name: str, x: Any, shape: tuple[int, ...] | None) -> jax.Array:
    x = jnp.asarray(x, jnp.float32)
    if x.ndim != 1 or (shape is not None and x.shape != shape):
        want = "[B]" if shape is None else f"[B] = {shape}"
        raise ValueError(f"{name} has shape {x.shape}, expected {want} (one value per pair)")
    return x


def preference_loss(
    variant: str | Callable[..., Any],
    *,
    chosen_logp: jax.Array,
    rejected_logp: jax.Array,
    ref_chosen_logp: jax.Array,
    ref_rejected_logp: jax.Array,
    beta: float,
    chosen_len: jax.Array | None = None,
    rejected_len: jax.Array | None = None,
    mask: jax.Array | None = None,
    loss_denominator: jax.Array | float | None = None,
    **variant_kwargs: Any,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(loss, metrics) of B pairs (module docstring; only `chosen_logp` and `rejected_logp`
    carry a gradient); `mask` [B] marks the pairs that count (default all).

    Metrics, each Σ m·x / D: `dpo/loss`, `dpo/accuracy` (chosen reward > rejected),
    `dpo/reward_margin`, `dpo/chosen_reward`, `dpo/rejected_reward`, `dpo/chosen_logp`,
    `dpo/rejected_logp` (summed log-probs), `dpo/<aux>`. ValueError for bad shapes, β ≤ 0,
    missing lengths or parameters the variant does not take.
    """
    name = display_name(variant)
    fn = get_preference_loss(variant)
    if isinstance(beta, int | float) and not beta > 0:
        raise ValueError(f"preference loss {name!r}: beta must be > 0, got {beta}")
    logp_w = _pair_array("chosen_logp", chosen_logp, None)
    shape = logp_w.shape
    logp_l = _pair_array("rejected_logp", rejected_logp, shape)
    fixed = {
        "ref_chosen_logp": ref_chosen_logp,
        "ref_rejected_logp": ref_rejected_logp,
        "chosen_len": chosen_len,
        "rejected_len": rejected_len,
    }
    fixed = {
        k: None if v is None else jax.lax.stop_gradient(_pair_array(k, v, shape))
        for k, v in fixed.items()
    }
    if fixed["ref_chosen_logp"] is None or fixed["ref_rejected_logp"] is None:
        raise ValueError(f"preference loss {name!r}: give ref_chosen_logp and ref_rejected_logp")
    mask_B = jnp.ones(shape, jnp.float32) if mask is None else _pair_array("mask", mask, shape)
    check_params(fn, f"preference loss {name!r}", (*PREFERENCE_ARRAYS, "beta"), variant_kwargs)
    out = fn(chosen_logp=logp_w, rejected_logp=logp_l, beta=beta, **fixed, **variant_kwargs)
    loss_B, aux = split_output(out, f"preference loss {name!r}", shape, "one loss per pair, [B]")
    if loss_denominator is None:
        loss_denominator = jnp.sum(mask_B)
    denominator = jnp.maximum(jnp.asarray(loss_denominator, jnp.float32), 1.0)

    def mean(x_B: jax.Array) -> jax.Array:
        return jnp.sum(jnp.where(mask_B > 0, x_B, 0.0)) / denominator

    loss = mean(loss_B)
    aux = dict(aux)
    r_w = aux.pop("chosen_reward", beta * (logp_w - fixed["ref_chosen_logp"]))
    r_l = aux.pop("rejected_reward", beta * (logp_l - fixed["ref_rejected_logp"]))
    metrics = {
        "dpo/loss": loss,
        "dpo/accuracy": mean((r_w > r_l).astype(jnp.float32)),
        "dpo/reward_margin": mean(r_w - r_l),
        "dpo/chosen_reward": mean(r_w),
        "dpo/rejected_reward": mean(r_l),
        "dpo/chosen_logp": mean(logp_w),
        "dpo/rejected_logp": mean(logp_l),
    }
    for key, value in aux.items():
        value = jnp.asarray(value, jnp.float32)
        if value.shape != shape:
            raise ValueError(
                f"preference loss {name!r}: aux[{key!r}] has shape {value.shape}, expected one "
                f"value per pair, [B] = {shape}"
            )
        metrics[f"dpo/{key}"] = mean(value)
    metrics = {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}
    return loss, metrics


__all__ = [
    "PREFERENCE_LOSSES",
    "get_preference_loss",
    "needs_reference",
    "preference_loss",
    "register_preference_loss",
]
