"""Policy losses, advantage estimators, KL estimators, TIS and aggregation (ALGORITHMS.md).

    from rlvr_jax import losses

    adv_PxG = losses.advantages("olmo", rewards_PxG)
    settings = losses.resolve_loss_settings("olmo3", eps_high=0.28)
    denom = settings.loss_denominator(mask_BxT, max_len=T_max, old_logp=..., sampler_logp=...)
    loss, metrics = losses.policy_loss(logp=..., old_logp=..., advantages=adv_PxG.reshape(-1),
                                       mask=mask_BxT, sampler_logp=...,
                                       loss_denominator=denom, **settings.policy_loss_kwargs())

PPO's critic: `gae` (per-token advantages and value targets), `value_loss`. Registries (a
name or `module:function`): `get_loss` (= `get`) / `register_loss`, `get_advantage` /
`register_advantage`, `get_preset` / `register_preset`, and for DPO-style pairs
`preference_loss` / `get_preference_loss` / `register_preference_loss`. The variant contract is
in README.md's Losses section.
"""

from rlvr_jax.losses.advantage import advantages, get_advantage, register_advantage
from rlvr_jax.losses.aggregation import AGGREGATIONS, aggregate, loss_denominator
from rlvr_jax.losses.gae import explained_variance, gae, value_loss, whiten
from rlvr_jax.losses.kl import KL_ESTIMATORS, get_kl_estimator, kl_reward_penalty
from rlvr_jax.losses.masked import masked_mean
from rlvr_jax.losses.metrics import mismatch_metrics, token_entropy
from rlvr_jax.losses.objective import policy_loss
from rlvr_jax.losses.preference import (
    get_preference_loss,
    preference_loss,
    register_preference_loss,
)
from rlvr_jax.losses.presets import (
    LossSettings,
    LossSettingsError,
    get_preset,
    loss_settings_from_config,
    register_preset,
    resolve_loss_settings,
)
from rlvr_jax.losses.registry import RegistryError
from rlvr_jax.losses.tis import TIS_MODES, tis_kept_mask
from rlvr_jax.losses.variants import get_loss, register_loss

get = get_loss

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "TIS_MODES",
    "LossSettings",
    "LossSettingsError",
    "RegistryError",
    "advantages",
    "aggregate",
    "explained_variance",
    "gae",
    "get",
    "get_advantage",
    "get_kl_estimator",
    "get_loss",
    "get_preference_loss",
    "get_preset",
    "kl_reward_penalty",
    "loss_denominator",
    "loss_settings_from_config",
    "masked_mean",
    "mismatch_metrics",
    "policy_loss",
    "preference_loss",
    "register_advantage",
    "register_loss",
    "register_preference_loss",
    "register_preset",
    "resolve_loss_settings",
    "tis_kept_mask",
    "token_entropy",
    "value_loss",
    "whiten",
]
