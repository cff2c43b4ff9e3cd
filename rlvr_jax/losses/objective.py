"""`policy_loss`: one jittable entry that wraps any variant with TIS, a KL term and aggregation.

    loss, metrics = policy_loss("ppo_clip", logp=logp_BxT, old_logp=old_logp_BxT,
                                advantages=adv_B, mask=mask_BxT, sampler_logp=sampler_logp_BxT,
                                eps_high=0.272, tis_cap=2.0)

Order of operations (ALGORITHMS.md):

1. the ratio's denominator is `old_logp` (`ratio_denominator="old"`) or `sampler_logp`
   (`"sampler"`: no recomputed forward pass needed; `old_logp` may then be None);
2. TIS weights w = sg(min(exp(old_logp − sampler_logp), C)) (or sequence / geometric / mask
   modes, see `tis.py`); `mask` mode removes tokens from the mask (and so from the denominator);
3. the variant's per-token loss ℓ[B,T] on the (kept) mask;
4. per-token total w·ℓ + β·KL(logp, ref_logp)  (the KL term unweighted);
5. aggregation with the optimizer batch's `loss_denominator` (or this batch's own).

Settings are static Python values (close over them before `jax.jit`); arrays may be traced.
Only `logp` carries a gradient. Values under the mask's zeros (even NaN/-inf) are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.losses import aggregation
from rlvr_jax.losses.kl import kl_per_token
from rlvr_jax.losses.masked import masked_mean
from rlvr_jax.losses.metrics import (
    advantage_metrics,
    aux_metrics,
    ratio_metrics,
    tis_metrics,
    token_entropy,
)
from rlvr_jax.losses.registry import check_params, display_name, split_output, takes_any_keyword
from rlvr_jax.losses.tis import TisConfig, tis_weights
from rlvr_jax.losses.variants import CONTRACT_ARRAYS, get_loss, variant_parameters

RATIO_DENOMINATORS = ("old", "sampler")


def _per_token(name: str, x: Any, mask_BxT: jax.Array, *, gradient: bool = False) -> jax.Array:
    """x as float32 [B,T] with zeros under the mask (so padding can never produce NaN)."""
    x = jnp.asarray(x)
    if x.shape != mask_BxT.shape:
        raise ValueError(f"{name} has shape {x.shape}, expected [B, T] = {mask_BxT.shape}")
    x = jnp.where(mask_BxT > 0, x.astype(jnp.float32), 0.0)
    return x if gradient else jax.lax.stop_gradient(x)


def _advantages_BxT(advantages: Any, mask_BxT: jax.Array) -> jax.Array:
    adv = jnp.asarray(advantages)
    batch, length = mask_BxT.shape
    if adv.shape == (batch,):
        adv = jnp.broadcast_to(adv[:, None], (batch, length))
    elif adv.shape != (batch, length):
        raise ValueError(
            f"advantages has shape {adv.shape}, expected [B] = ({batch},) or [B, T] = "
            f"{mask_BxT.shape}"
        )
    return _per_token("advantages", adv, mask_BxT)


def variant_call_params(
    fn: Callable[..., Any],
    name: str,
    clip: dict[str, float | None],
    variant_kwargs: dict[str, Any],
) -> dict[str, Any]:
    """The keywords a variant is called with: the `clip` ranges it takes (None = its default;
    a variant without clipping ignores them) plus `variant_kwargs`, all of which it must take.
    ValueError for a clip range < 0 or a parameter the variant lacks or needs."""
    for key, value in clip.items():
        if isinstance(value, int | float) and not value >= 0:
            raise ValueError(f"{key} must be >= 0, got {value}")
    own, takes_any = variant_parameters(fn), takes_any_keyword(fn)
    params = {k: v for k, v in clip.items() if v is not None and (k in own or takes_any)}
    params |= dict(variant_kwargs)
    check_params(fn, f"loss variant {name!r}", CONTRACT_ARRAYS, params)
    return params


def policy_loss(
    variant: str | Callable[..., Any],
    *,
    logp: jax.Array,
    old_logp: jax.Array | None,
    advantages: jax.Array,
    mask: jax.Array,
    sampler_logp: jax.Array | None = None,
    ref_logp: jax.Array | None = None,
    eps_low: float | None = None,
    eps_high: float | None = None,
    agg: str = "token-mean",
    tis_cap: float | None = None,
    tis_mode: str = "token",
    tis_low: float | None = None,
    tis_high: float | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str | Callable[..., Any] = "k3",
    loss_denominator: jax.Array | float | None = None,
    max_len: int | None = None,
    logits: jax.Array | None = None,
    ratio_denominator: str = "old",
    **variant_kwargs: Any,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(float32 loss, float32 scalar metrics of `metrics.py`) of a batch.

    `logp`, `old_logp` (θ_old; None only with `ratio_denominator="sampler"`), `sampler_logp`
    (the engine's), `ref_logp` (needed when kl_coef > 0) and `mask` are [B, T]; `advantages` [B]
    (broadcast over the row) or [B, T]; `logits` [B, T, V] only feed the entropy metric.
    `eps_low`/`eps_high` None = the variant's defaults; `loss_denominator` is the whole optimizer
    batch's (`loss_denominator()`, None = this batch's own); `max_len` is T_max;
    `variant_kwargs` must all be parameters of the variant. The other settings are described in
    the module docstring, `tis.py`, `kl.py` and `aggregation.py`. ValueError names a bad shape,
    setting or missing input.
    """
    name = display_name(variant)
    fn = get_loss(variant)
    logp_BxT, mask_BxT, given = _per_token_inputs(
        logp, mask, old_logp=old_logp, sampler_logp=sampler_logp, ref_logp=ref_logp
    )
    adv_BxT = _advantages_BxT(advantages, mask_BxT)
    denom_BxT = _ratio_denominator(given, ratio_denominator)
    tis = TisConfig(mode=tis_mode, cap=tis_cap, low=tis_low, high=tis_high)
    w_BxT, loss_mask_BxT, metrics = _tis(tis, given, mask_BxT, ratio_denominator)

    clip = {"eps_low": eps_low, "eps_high": eps_high}
    out = fn(
        logp=logp_BxT,
        old_logp=denom_BxT,
        advantages=adv_BxT,
        mask=loss_mask_BxT,
        **variant_call_params(fn, name, clip, variant_kwargs),
    )
    what = f"loss variant {name!r}"
    policy_BxT, aux = split_output(out, what, mask_BxT.shape, "the per-token loss [B, T]")
    total_BxT = w_BxT * policy_BxT
    if "ref_logp" in given:
        kl_BxT = kl_per_token(kl_estimator, logp_BxT, given["ref_logp"])
        metrics["kl/ref"] = masked_mean(kl_BxT, loss_mask_BxT)
    if _kl_on(kl_coef, given):
        total_BxT = total_BxT + kl_coef * kl_BxT
    loss = aggregation.aggregate(
        total_BxT, loss_mask_BxT, agg, denominator=loss_denominator, max_len=max_len
    )

    metrics.update(aux_metrics(aux, loss_mask_BxT))
    metrics.update(ratio_metrics(logp_BxT, denom_BxT, loss_mask_BxT))
    if "old_logp" in given and "sampler_logp" in given:
        # k3 with δ = old_logp − sampler_logp: KL(sampler‖learner) on the sampler's tokens.
        sampler_kl_BxT = kl_per_token("k3", given["sampler_logp"], given["old_logp"])
        metrics["kl/sampler_learner"] = masked_mean(sampler_kl_BxT, mask_BxT)
    if logits is not None:
        metrics["entropy"] = masked_mean(token_entropy(_logits(logits, mask_BxT)), mask_BxT)
    metrics.update(advantage_metrics(_row_advantages(advantages, adv_BxT), mask_BxT))
    metrics["tokens"] = jnp.sum(loss_mask_BxT)
    metrics = {k: jax.lax.stop_gradient(jnp.asarray(v, jnp.float32)) for k, v in metrics.items()}
    return loss, metrics


def _per_token_inputs(
    logp: Any, mask: Any, **optional: Any
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """logp (with gradient), the float mask, and the optional per-token inputs that were given."""
    logp = jnp.asarray(logp)
    if logp.ndim != 2:
        raise ValueError(f"logp must be [B, T], got shape {logp.shape}")
    mask_BxT = jnp.asarray(mask).astype(jnp.float32)
    if mask_BxT.shape != logp.shape:
        raise ValueError(f"mask has shape {mask_BxT.shape}, expected logp's {logp.shape}")
    logp_BxT = _per_token("logp", logp, mask_BxT, gradient=True)
    given = {k: _per_token(k, v, mask_BxT) for k, v in optional.items() if v is not None}
    return logp_BxT, mask_BxT, given


def _ratio_denominator(given: dict[str, jax.Array], ratio_denominator: str) -> jax.Array:
    if ratio_denominator not in RATIO_DENOMINATORS:
        raise ValueError(
            f"ratio_denominator must be one of {RATIO_DENOMINATORS}, got {ratio_denominator!r}"
        )
    key = "old_logp" if ratio_denominator == "old" else "sampler_logp"
    if key not in given:
        raise ValueError(f"ratio_denominator={ratio_denominator!r} needs {key}")
    return given[key]


def _tis(
    tis: TisConfig, given: dict[str, jax.Array], mask_BxT: jax.Array, ratio_denominator: str
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """(TIS weights, the mask the loss uses, TIS metrics); weights 1 and no metrics when off."""
    if not tis.enabled:
        return jnp.ones_like(mask_BxT), mask_BxT, {}
    if ratio_denominator == "sampler":
        raise ValueError(
            "TIS corrects old_logp against sampler_logp; with ratio_denominator='sampler' "
            "the ratio already is π_θ/π_sampler: set tis_cap=None and tis_mode='token'"
        )
    if "sampler_logp" not in given or "old_logp" not in given:
        raise ValueError("TIS (tis_cap or tis_mode='mask') needs old_logp and sampler_logp")
    w_BxT, keep_BxT, log_rho_BxT = tis_weights(
        tis, old_logp=given["old_logp"], sampler_logp=given["sampler_logp"], mask=mask_BxT
    )
    metrics = tis_metrics(w_BxT, keep_BxT, log_rho_BxT, mask_BxT, tis.cap)
    return w_BxT, mask_BxT * keep_BxT, metrics


def _kl_on(kl_coef: float, given: dict[str, jax.Array]) -> bool:
    """Whether the KL loss term is on (β not a literal 0); checks β ≥ 0 and that ref_logp is
    given."""
    if isinstance(kl_coef, int | float):
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        if kl_coef == 0:
            return False
    if "ref_logp" not in given:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logp (the reference policy's log-probs)")
    return True


def _logits(logits: Any, mask_BxT: jax.Array) -> jax.Array:
    logits_BxTxV = jnp.asarray(logits)
    if logits_BxTxV.ndim != 3 or logits_BxTxV.shape[:2] != mask_BxT.shape:
        raise ValueError(
            f"logits must be [B, T, V] with [B, T] = {mask_BxT.shape}, "
            f"got shape {logits_BxTxV.shape}"
        )
    return logits_BxTxV


def _row_advantages(advantages: Any, adv_BxT: jax.Array) -> jax.Array:
    """[B] advantages as given (masked rows excluded by the stats), else the [B,T] array."""
    adv = jnp.asarray(advantages)
    return jax.lax.stop_gradient(adv.astype(jnp.float32)) if adv.ndim == 1 else adv_BxT
