"""Loss presets and `LossSettings`: the `loss:` config section resolved and checked.

A preset is a named bundle of `loss.*` values (a function returning a dict of them), registered
with `@register_preset("name")` or given as `module:function`. `LossSettings` is the
`LossConfig` those keys fill, resolved (None = not set):

    the schema's `unset` defaults  ←  the preset's values  ←  explicit `loss.*` keys

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
| `ppo` | ppo_clip | gae (learned critic) | 0.2 / 0.2 | token-mean | off | 0 |
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax

from rlvr_jax.config.schema import LossConfig
from rlvr_jax.losses import aggregation
from rlvr_jax.losses.advantage import get_advantage
from rlvr_jax.losses.gae import GAE
from rlvr_jax.losses.kl import get_kl_estimator
from rlvr_jax.losses.objective import RATIO_DENOMINATORS, policy_loss, variant_call_params
from rlvr_jax.losses.registry import Registry, display_name
from rlvr_jax.losses.tis import TisConfig, tis_kept_mask
from rlvr_jax.losses.variants import get_loss

PRESETS = Registry("loss preset")
register_preset = PRESETS.register

KL_MODES = ("loss", "reward")
VARIANT_OWNED = ("eps_low", "eps_high", "variant_kwargs")  # dropped with the preset's variant

_FIELDS = {f.name: f for f in dataclasses.fields(LossConfig)}
_SETTING_NAMES = tuple(name for name in _FIELDS if name != "preset")
_POLICY_LOSS_ARGS = tuple(
    name
    for name, p in inspect.signature(policy_loss).parameters.items()
    if p.kind is not inspect.Parameter.VAR_KEYWORD
)
_PASSED_TO_POLICY_LOSS = tuple(name for name in _POLICY_LOSS_ARGS if name in _SETTING_NAMES)


class LossSettingsError(ValueError):
    """Invalid loss settings; the message names the `loss.*` key."""


def get_preset(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """The preset function for a registered name, a `module:function` string or a callable."""
    return PRESETS.get(ref)


@dataclasses.dataclass(frozen=True)
class LossSettings(LossConfig):
    """A `LossConfig` with its preset applied, unset keys at the schema's `unset` defaults, and
    every value checked (errors name the `loss.*` key). It names no preset, so resolving it
    again gives it back. Variant, advantage and KL estimator may be callables."""

    def __post_init__(self):
        for name, value in _resolved(self).items():
            object.__setattr__(self, name, value)
        self._check("variant", lambda: get_loss(self.variant))
        self._check("advantage", lambda: self.uses_critic or get_advantage(self.advantage))
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
        return TisConfig(self.tis_mode, self.tis_cap, self.tis_low, self.tis_high)

    @property
    def reward_kl_coef(self) -> float:
        """β for `kl_reward_penalty` (0 unless kl_mode is `reward`)."""
        return self.kl_coef if self.kl_mode == "reward" else 0.0

    @property
    def uses_critic(self) -> bool:
        """Whether advantages come from a learned critic (`advantage: gae`, PPO)."""
        return self.advantage == GAE

    @property
    def needs_ref_logp(self) -> bool:
        """Whether a reference policy must be kept (β > 0)."""
        return self.kl_coef > 0

    def policy_loss_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `policy_loss` (β is 0 there when kl_mode is `reward`)."""
        kwargs = {name: getattr(self, name) for name in _PASSED_TO_POLICY_LOSS}
        kwargs["kl_coef"] = self.kl_coef if self.kl_mode == "loss" else 0.0
        return {**kwargs, **self.variant_kwargs}

    def loss_denominator(
        self,
        mask: jax.Array,
        *,
        max_len: int | None = None,
        old_logp: jax.Array | None = None,
        sampler_logp: jax.Array | None = None,
    ) -> jax.Array:
        """The whole optimizer batch's denominator for its [B, T] `mask`, counting only the
        TIS-kept tokens in mask mode (which needs `old_logp` and `sampler_logp`)."""
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


def _preset_values(preset: str | Callable[..., Any]) -> dict[str, Any]:
    try:
        values = get_preset(preset)()
    except LossSettingsError:
        raise
    except ValueError as e:  # an unknown or unimportable preset
        raise LossSettingsError(f"loss.preset: {e}") from e
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


def _resolved(keys: LossConfig) -> dict[str, Any]:
    """Every field of `keys` resolved (see the module docstring); `preset` None."""
    explicit = {name: getattr(keys, name) for name in _SETTING_NAMES}
    explicit = {k: v for k, v in explicit.items() if v is not None}
    values = {} if keys.preset is None else _preset_values(keys.preset)
    if "variant" in explicit and explicit["variant"] != values.get("variant", explicit["variant"]):
        values = {k: v for k, v in values.items() if k not in VARIANT_OWNED}
    kwargs = {**values.get("variant_kwargs", {}), **explicit.pop("variant_kwargs", {})}
    unset = {name: f.metadata.get("unset") for name, f in _FIELDS.items()}
    return {**unset, **values, **explicit, "variant_kwargs": kwargs, "preset": None}


def resolve_loss_settings(
    preset: str | Callable[..., Any] | None = None, **explicit: Any
) -> LossSettings:
    """LossSettings from a preset (or None) and explicit `loss.*` values (None = not set);
    LossSettingsError names the key of an unknown or invalid one."""
    unknown = sorted(set(explicit) - set(_SETTING_NAMES))
    if unknown:
        raise LossSettingsError(
            f"unknown loss setting(s) {', '.join(unknown)}; known: {', '.join(_SETTING_NAMES)}"
        )
    return LossSettings(preset=preset, **explicit)


def loss_settings_from_config(loss_config: LossConfig) -> LossSettings:
    """LossSettings from a `rlvr_jax.config.schema.LossConfig` (its `preset` plus every key)."""
    return LossSettings(**{name: getattr(loss_config, name) for name in _FIELDS})


def _register_builtin(name: str, doc: str, **values: Any) -> None:
    preset = functools.partial(dict, values)
    preset.__doc__ = doc
    register_preset(name)(preset)


_register_builtin(
    "olmo3",
    "OlmoRL (OLMo 3 Think): ppo_clip 0.2/0.272, no-std advantages, token-mean, TIS C = 2.",
    variant="ppo_clip", advantage="olmo", eps_low=0.2, eps_high=0.272, agg="token-mean",
    tis_cap=2.0, tis_mode="token", kl_coef=0.0,
)  # fmt: skip
_register_builtin(
    "grpo",
    "Original GRPO (DeepSeekMath): z-score advantages, 0.2 clip, per-sequence mean, β = 0.04.",
    variant="ppo_clip", advantage="grpo", eps_low=0.2, eps_high=0.2, agg="seq-mean-token-mean",
    kl_coef=0.04, kl_estimator="k3", kl_mode="loss",
)  # fmt: skip
_register_builtin(
    "dapo",
    "DAPO: clip-higher 0.2/0.28, token-level loss, no KL.",
    variant="ppo_clip", advantage="grpo", eps_low=0.2, eps_high=0.28, agg="token-mean",
    kl_coef=0.0,
)  # fmt: skip
_register_builtin(
    "drgrpo",
    "Dr.GRPO: mean-centred advantages, constant normaliser B·T_max, no KL.",
    variant="ppo_clip", advantage="drgrpo", eps_low=0.2, eps_high=0.2,
    agg="seq-mean-token-sum-norm", kl_coef=0.0,
)  # fmt: skip
_register_builtin(
    "cispo",
    "CISPO (MiniMax-M1): clipped IS weight, no lower clip, token-level loss.",
    variant="cispo", advantage="grpo", agg="token-mean", kl_coef=0.0,
)  # fmt: skip
_register_builtin(
    "gspo",
    "GSPO: sequence-level ratio with tiny ranges 3e-4/4e-4 and a per-sequence mean.",
    variant="gspo", advantage="grpo", eps_low=3e-4, eps_high=4e-4, agg="seq-mean-token-mean",
    kl_coef=0.0,
)  # fmt: skip
_register_builtin(
    "ppo",
    "PPO with a learned critic: GAE advantages per token (`critic.*`), 0.2 clip, token-mean.",
    variant="ppo_clip", advantage=GAE, eps_low=0.2, eps_high=0.2, agg="token-mean", kl_coef=0.0,
)  # fmt: skip
