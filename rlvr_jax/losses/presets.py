"""Loss presets and `LossSettings`, the resolved form of the `loss:` config section.

A preset is a named bundle of loss settings (a function returning a dict of `LossSettings`
fields), registered with `@register_preset("name")` or given as `module:function`. Resolution:

    LossSettings defaults  ←  the preset's values  ←  explicit `loss.*` keys (None = not set)

with two rules: `variant_kwargs` dicts are merged (explicit keys win), and the clip ranges and
`variant_kwargs` of a preset belong to the preset's variant — when an explicit `variant` replaces
it, they fall back to the new variant's own defaults unless given explicitly.

| preset | variant | advantage | ε_low / ε_high | agg | TIS | β (KL) |
|---|---|---|---|---|---|---|
| `olmo3` | ppo_clip | olmo | 0.2 / 0.272 | token-mean | token, C = 2 | 0 |
| `grpo` | ppo_clip | grpo | 0.2 / 0.2 | seq-mean-token-mean | off | 0.04, k3, loss |
| `dapo` | ppo_clip | grpo | 0.2 / 0.28 | token-mean | off | 0 |
| `drgrpo` | ppo_clip | drgrpo | 0.2 / 0.2 | seq-mean-token-sum-norm | off | 0 |
| `cispo` | cispo | grpo | ∞ / 0.28 (variant defaults) | token-mean | off | 0 |
| `gspo` | gspo | grpo | 3e-4 / 4e-4 | seq-mean-token-mean | off | 0 |
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax

from rlvr_jax.losses import aggregation

if TYPE_CHECKING:
    from rlvr_jax.config.schema import LossConfig
from rlvr_jax.losses.advantage import get_advantage
from rlvr_jax.losses.kl import get_kl_estimator
from rlvr_jax.losses.objective import RATIO_DENOMINATORS, policy_loss, variant_call_params
from rlvr_jax.losses.registry import Registry, display_name
from rlvr_jax.losses.tis import TisConfig, tis_kept_mask
from rlvr_jax.losses.variants import get_loss

PRESETS = Registry("loss preset")
register_preset = PRESETS.register

KL_MODES = ("loss", "reward")
VARIANT_OWNED = ("eps_low", "eps_high", "variant_kwargs")
"""Preset values that belong to the preset's variant (dropped when the variant is replaced)."""


class LossSettingsError(ValueError):
    """Invalid loss settings; the message names the `loss.*` key."""


def get_preset(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """The preset function for a registered name, a `module:function` string or a callable."""
    return PRESETS.get(ref)


@dataclass(frozen=True)
class LossSettings:
    """Every loss-level setting of a run, resolved and validated (see `resolve_loss_settings`)."""

    variant: str | Callable[..., Any] = "ppo_clip"
    """Policy loss: registered name, `module:function`, or a callable."""
    advantage: str | Callable[..., Any] = "grpo"
    """Advantage estimator: registered name, `module:function`, or a callable."""
    eps_low: float | None = None
    """Lower clip range; None = the variant's default (ignored by a variant without one)."""
    eps_high: float | None = None
    """Upper clip range; None = the variant's default (ignored by a variant without one)."""
    agg: str = "token-mean"
    """Aggregation mode."""
    tis_cap: float | None = None
    """TIS truncation C; None = no TIS weighting."""
    tis_mode: str = "token"
    """`token`, `sequence`, `geometric` or `mask`."""
    tis_low: float | None = None
    """`mask` mode: lower bound on exp(old_logp − sampler_logp)."""
    tis_high: float | None = None
    """`mask` mode: upper bound on exp(old_logp − sampler_logp)."""
    kl_coef: float = 0.0
    """β of the KL against the reference policy (0 = no reference needed)."""
    kl_estimator: str = "k3"
    """`k1`, `k2`, `k3` (or `module:function`)."""
    kl_mode: str = "loss"
    """`loss`: β·KL added to the per-token loss; `reward`: subtracted from the rewards."""
    ratio_denominator: str = "old"
    """`old` (recomputed log-probs) or `sampler` (the rollout engine's)."""
    variant_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra parameters of the variant (e.g. `dual_clip: 3.0`)."""

    def __post_init__(self):
        object.__setattr__(self, "variant_kwargs", dict(self.variant_kwargs))
        self._check("variant", lambda: get_loss(self.variant))
        self._check("advantage", lambda: get_advantage(self.advantage))
        self._check("agg", lambda: aggregation.get_aggregation(self.agg))
        self._check("kl_estimator", lambda: get_kl_estimator(self.kl_estimator))
        self._check("tis_*", lambda: self.tis)
        if self.kl_mode not in KL_MODES:
            raise LossSettingsError(f"loss.kl_mode must be one of {KL_MODES}, got {self.kl_mode!r}")
        if self.ratio_denominator not in RATIO_DENOMINATORS:
            raise LossSettingsError(
                f"loss.ratio_denominator must be one of {RATIO_DENOMINATORS}, "
                f"got {self.ratio_denominator!r}"
            )
        if not self.kl_coef >= 0:
            raise LossSettingsError(f"loss.kl_coef must be >= 0, got {self.kl_coef}")
        if self.ratio_denominator == "sampler" and self.tis.enabled:
            raise LossSettingsError(
                "loss.ratio_denominator='sampler' makes the ratio π_θ/π_sampler already; "
                "TIS (loss.tis_cap / tis_mode='mask') must be off with it"
            )
        clash = sorted(set(self.variant_kwargs) & set(_POLICY_LOSS_ARGS))
        if clash:
            raise LossSettingsError(
                f"loss.variant_kwargs: {', '.join(clash)} are loss settings, not variant "
                f"parameters; set them as loss.{clash[0]}"
            )
        clip = {"eps_low": self.eps_low, "eps_high": self.eps_high}
        self._check(
            "variant_kwargs",
            lambda: variant_call_params(
                get_loss(self.variant), display_name(self.variant), clip, self.variant_kwargs
            ),
        )

    def _check(self, key: str, check: Callable[[], Any]) -> None:
        try:
            check()
        except ValueError as e:
            raise LossSettingsError(f"loss.{key}: {e}") from e

    @property
    def tis(self) -> TisConfig:
        """The TIS part of the settings."""
        return TisConfig(self.tis_mode, self.tis_cap, self.tis_low, self.tis_high)

    @property
    def reward_kl_coef(self) -> float:
        """β for `kl_reward_penalty` (0 unless kl_mode is `reward`)."""
        return self.kl_coef if self.kl_mode == "reward" else 0.0

    @property
    def needs_ref_logp(self) -> bool:
        """Whether a reference policy must be kept (β > 0)."""
        return self.kl_coef > 0

    def policy_loss_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `policy_loss` (β is 0 there when kl_mode is `reward`)."""
        return {
            "variant": self.variant,
            "eps_low": self.eps_low,
            "eps_high": self.eps_high,
            "agg": self.agg,
            "tis_cap": self.tis_cap,
            "tis_mode": self.tis_mode,
            "tis_low": self.tis_low,
            "tis_high": self.tis_high,
            "kl_coef": self.kl_coef if self.kl_mode == "loss" else 0.0,
            "kl_estimator": self.kl_estimator,
            "ratio_denominator": self.ratio_denominator,
            **self.variant_kwargs,
        }

    def loss_denominator(
        self,
        mask: jax.Array,
        *,
        max_len: int | None = None,
        old_logp: jax.Array | None = None,
        sampler_logp: jax.Array | None = None,
    ) -> jax.Array:
        """The whole optimizer batch's denominator, counting only TIS-kept tokens in mask mode.

        Args:
          mask: [B, T] mask of the whole optimizer batch.
          max_len: the generation budget (for `seq-mean-token-sum-norm`).
          old_logp, sampler_logp: [B, T], needed in TIS `mask` mode.
        """
        if self.tis_mode == "mask":
            if old_logp is None or sampler_logp is None:
                raise ValueError("TIS mask mode: the denominator needs old_logp and sampler_logp")
            mask = tis_kept_mask(
                mask,
                old_logp=old_logp,
                sampler_logp=sampler_logp,
                tis_low=self.tis_low,
                tis_high=self.tis_high,
            )
        return aggregation.loss_denominator(self.agg, mask, max_len)


_SETTING_NAMES = tuple(f.name for f in dataclasses.fields(LossSettings))
_POLICY_LOSS_ARGS = tuple(
    name
    for name, p in inspect.signature(policy_loss).parameters.items()
    if p.kind is not inspect.Parameter.VAR_KEYWORD
)


def _preset_values(preset: str | Callable[..., Any]) -> dict[str, Any]:
    values = get_preset(preset)()
    if not isinstance(values, Mapping):
        raise LossSettingsError(
            f"loss.preset {display_name(preset)!r} must return a dict of loss settings, "
            f"got {type(values).__name__}"
        )
    unknown = sorted(set(values) - set(_SETTING_NAMES))
    if unknown:
        raise LossSettingsError(
            f"loss.preset {display_name(preset)!r} sets unknown loss setting(s) "
            f"{', '.join(unknown)}; known: {', '.join(_SETTING_NAMES)}"
        )
    return dict(values)


def resolve_loss_settings(
    preset: str | Callable[..., Any] | None = None, **explicit: Any
) -> LossSettings:
    """LossSettings from a preset (or None) and explicit `loss.*` values (None = not set).

    Raises:
      LossSettingsError: an unknown preset or setting, or an invalid value; the message names the
        `loss.*` key.
    """
    unknown = sorted(set(explicit) - set(_SETTING_NAMES))
    if unknown:
        raise LossSettingsError(
            f"unknown loss setting(s) {', '.join(unknown)}; known: {', '.join(_SETTING_NAMES)}"
        )
    values: dict[str, Any] = {}
    if preset is not None:
        try:
            values = _preset_values(preset)
        except LossSettingsError:
            raise
        except ValueError as e:  # an unknown or unimportable preset
            raise LossSettingsError(f"loss.preset: {e}") from e
    explicit = {k: v for k, v in explicit.items() if v is not None}
    if "variant" in explicit and explicit["variant"] != values.get("variant", explicit["variant"]):
        values = {k: v for k, v in values.items() if k not in VARIANT_OWNED}
    kwargs = {**values.get("variant_kwargs", {}), **explicit.pop("variant_kwargs", {})}
    return LossSettings(**{**values, **explicit, "variant_kwargs": kwargs})


def loss_settings_from_config(loss_config: LossConfig) -> LossSettings:
    """LossSettings from a `rlvr_jax.config.schema.LossConfig` (its `preset` plus every key)."""
    values = {f.name: getattr(loss_config, f.name) for f in dataclasses.fields(loss_config)}
    return resolve_loss_settings(values.pop("preset"), **values)


@register_preset("olmo3")
def olmo3() -> dict[str, Any]:
    """OlmoRL (OLMo 3 Think): ppo_clip 0.2/0.272, no-std advantages, token-mean, TIS C = 2."""
    return {
        "variant": "ppo_clip",
        "advantage": "olmo",
        "eps_low": 0.2,
        "eps_high": 0.272,
        "agg": "token-mean",
        "tis_cap": 2.0,
        "tis_mode": "token",
        "kl_coef": 0.0,
    }


@register_preset("grpo")
def grpo() -> dict[str, Any]:
    """Original GRPO (DeepSeekMath): z-score advantages, 0.2 clip, per-sequence mean, β = 0.04."""
    return {
        "variant": "ppo_clip",
        "advantage": "grpo",
        "eps_low": 0.2,
        "eps_high": 0.2,
        "agg": "seq-mean-token-mean",
        "kl_coef": 0.04,
        "kl_estimator": "k3",
        "kl_mode": "loss",
    }


@register_preset("dapo")
def dapo() -> dict[str, Any]:
    """DAPO: clip-higher 0.2/0.28, token-level loss, no KL."""
    return {
        "variant": "ppo_clip",
        "advantage": "grpo",
        "eps_low": 0.2,
        "eps_high": 0.28,
        "agg": "token-mean",
        "kl_coef": 0.0,
    }


@register_preset("drgrpo")
def drgrpo() -> dict[str, Any]:
    """Dr.GRPO: mean-centred advantages, constant normaliser B·T_max, no KL."""
    return {
        "variant": "ppo_clip",
        "advantage": "drgrpo",
        "eps_low": 0.2,
        "eps_high": 0.2,
        "agg": "seq-mean-token-sum-norm",
        "kl_coef": 0.0,
    }


@register_preset("cispo")
def cispo() -> dict[str, Any]:
    """CISPO (MiniMax-M1): clipped IS weight, no lower clip, token-level loss."""
    return {"variant": "cispo", "advantage": "grpo", "agg": "token-mean", "kl_coef": 0.0}


@register_preset("gspo")
def gspo() -> dict[str, Any]:
    """GSPO: sequence-level ratio with tiny ranges 3e-4/4e-4 and a per-sequence mean."""
    return {
        "variant": "gspo",
        "advantage": "grpo",
        "eps_low": 3e-4,
        "eps_high": 4e-4,
        "agg": "seq-mean-token-mean",
        "kl_coef": 0.0,
    }
