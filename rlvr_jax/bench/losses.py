"""The loss lab: `rlvr-bench losses [--batch FILE.npz] [--json FILE]`.

Every registered loss variant (default ranges) and every preset (advantages, TIS, KL,
aggregation) on one batch (`rlvr_jax.losses.batch_file`; without `--batch` a seeded synthetic
one): the loss, ‖∂loss/∂logp‖, the clip fraction and the spread of the per-token weight
|∂loss/∂logp| over unmasked tokens (CV, max/min of the non-zero, the zero-gradient share)."""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.bench import progress
from rlvr_jax.bench.table import Bench
from rlvr_jax.losses import advantages, policy_loss, resolve_loss_settings
from rlvr_jax.losses.batch_file import REQUIRED_ARRAYS, BatchError, load_batch, save_batch
from rlvr_jax.losses.presets import PRESETS
from rlvr_jax.losses.variants import LOSSES

__all__ = ["BatchError", "evaluate", "load_batch", "run_lab", "save_batch", "synthetic_batch"]


def synthetic_batch(
    *, seed: int = 0, groups: int = 8, group_size: int = 8, max_len: int = 256
) -> dict[str, np.ndarray]:
    """A seeded batch with realistic spread: log-uniform lengths from 8 tokens (~10% cut at
    `max_len`, one row all-masked), confident log-probs with an uncertain tail, learner moves
    of ~2% (3% of tokens ~30%), the sampler ~1% off (a quarter of rows stale at ~15%, 0.5% of
    tokens outliers of 1–2 nats), every group holding both outcomes."""
    if min(groups, group_size, max_len) < 1:
        raise ValueError(
            f"groups, group_size and max_len must be >= 1, got {groups}, {group_size}, {max_len}"
        )
    rng = np.random.default_rng(seed)
    rows = groups * group_size
    shape = (rows, max_len)
    lengths_B = np.exp(rng.uniform(np.log(min(8, max_len)), np.log(max_len), rows)).astype(int)
    lengths_B[rng.random(rows) < 0.1] = max_len
    mask_BxT = (np.arange(max_len)[None, :] < lengths_B[:, None]).astype(np.float32)
    mask_BxT[rng.integers(rows)] = 0.0
    uncertain_BxT = rng.random(shape) < 0.3
    old_logp_BxT = -np.where(
        uncertain_BxT, rng.exponential(1.5, shape), rng.exponential(0.02, shape)
    )
    old_logp_BxT = np.maximum(old_logp_BxT, -15.0)
    drift_BxT = rng.normal(0.0, 0.02, shape)
    moved_BxT = rng.random(shape) < 0.03  # tokens the learner moved a lot (clipping acts)
    drift_BxT[moved_BxT] += rng.normal(0.0, 0.3, int(moved_BxT.sum()))
    shift_BxT = rng.normal(0.0, 0.01, shape)
    stale_B = rng.random(rows) < 0.25
    shift_BxT[stale_B] += rng.normal(0.0, 0.15, (int(stale_B.sum()), max_len))
    outlier_BxT = rng.random(shape) < 0.005
    n_outliers = int(outlier_BxT.sum())
    shift_BxT[outlier_BxT] += rng.choice([-1.0, 1.0], n_outliers) * rng.uniform(1, 2, n_outliers)
    pass_rate_P = rng.uniform(0.1, 0.9, groups)
    rewards_PxG = (rng.random((groups, group_size)) < pass_rate_P[:, None]).astype(np.float32)
    if group_size > 1:  # as after zero-variance filtering: every group holds both outcomes
        uniform_P = rewards_PxG.min(axis=1) == rewards_PxG.max(axis=1)
        rewards_PxG[uniform_P, 0] = 1.0 - rewards_PxG[uniform_P, 0]
    advantages_PxG = rewards_PxG - rewards_PxG.mean(axis=1, keepdims=True)  # `olmo`
    ref_logp_BxT = old_logp_BxT + rng.normal(0.0, 0.05, shape)
    return {
        "logp": np.minimum(old_logp_BxT + drift_BxT, 0.0).astype(np.float32),
        "old_logp": old_logp_BxT.astype(np.float32),
        "sampler_logp": np.minimum(old_logp_BxT + shift_BxT, 0.0).astype(np.float32),
        "ref_logp": np.minimum(ref_logp_BxT, 0.0).astype(np.float32),
        "mask": mask_BxT,
        "advantages": advantages_PxG.reshape(-1),
        "rewards": rewards_PxG.reshape(-1),
        "group_size": np.asarray(group_size),
        "max_len": np.asarray(max_len),
    }


def _weight_spread(grad_BxT: np.ndarray, mask_BxT: np.ndarray) -> dict[str, float | None]:
    """Spread of |∂loss/∂logp| over unmasked tokens."""
    g = np.abs(grad_BxT[mask_BxT > 0]).astype(np.float64)
    nonzero = g[g > 0]
    mean = g.mean() if g.size else 0.0
    return {
        "weight_cv": float(g.std() / mean) if mean > 0 else None,
        "weight_max_over_min": float(nonzero.max() / nonzero.min()) if nonzero.size else None,
        "zero_grad_fraction": float(1.0 - nonzero.size / g.size) if g.size else None,
    }


@partial(jax.jit, static_argnames=("settings",))
def _loss_and_grad(arrays: dict[str, jax.Array], settings: tuple[tuple[str, Any], ...]):
    """(loss, metrics), ∂loss/∂logp; jitted once per (settings, shapes) and reused."""

    def loss_fn(logp_BxT):
        return policy_loss(**{**arrays, **dict(settings), "logp": logp_BxT})

    return jax.value_and_grad(loss_fn, has_aux=True)(arrays["logp"])


def evaluate(batch: dict[str, np.ndarray], **loss_kwargs: Any) -> dict[str, float | None]:
    """Loss, ‖∂loss/∂logp‖, clip fraction, weight spread and a few metrics for one setting."""
    arrays = {k: jnp.asarray(batch[k]) for k in (*REQUIRED_ARRAYS, "ref_logp") if k in batch}
    if loss_kwargs.get("agg") == "seq-mean-token-sum-norm":
        loss_kwargs["max_len"] = int(batch.get("max_len", batch["mask"].shape[1]))
    (loss, metrics), grad_BxT = _loss_and_grad(arrays, tuple(sorted(loss_kwargs.items())))
    grad_BxT = np.asarray(grad_BxT)
    out: dict[str, float | None] = {
        "loss": float(loss),
        "grad_norm": float(np.sqrt(np.sum(np.square(grad_BxT, dtype=np.float64)))),
        "clip_fraction": float(metrics["clip_fraction"]),
    }
    out.update(_weight_spread(grad_BxT, batch["mask"]))
    for key in ("tis/mean", "tis/masked_fraction", "kl/sampler_learner", "ratio/max"):
        if key in metrics:
            out[key] = float(metrics[key])
    return {k: (v if v is None or math.isfinite(v) else None) for k, v in out.items()}


def _preset_kwargs(name: str, batch: dict[str, np.ndarray]) -> tuple[dict[str, Any], str]:
    """policy_loss kwargs of a preset on this batch, and a note on what was adapted."""
    settings = resolve_loss_settings(name)
    kwargs = settings.policy_loss_kwargs()
    notes = []
    if settings.uses_critic:  # GAE needs a critic's values: the batch's advantages stand in
        notes.append("adv=batch (gae needs a critic)")
    elif "rewards" in batch:
        rewards_PxG = batch["rewards"].reshape(-1, int(batch["group_size"]))
        adv = np.asarray(advantages(settings.advantage, rewards_PxG)).reshape(-1)
        kwargs["advantages"] = adv
        notes.append(f"adv={settings.advantage}")
    else:
        notes.append("adv=batch")
    if kwargs["kl_coef"] > 0 and "ref_logp" not in batch:
        kwargs["kl_coef"] = 0.0
        notes.append("KL off: no ref_logp")
    return kwargs, ", ".join(notes)


def run_lab(
    batch: dict[str, np.ndarray],
    *,
    variants: list[str] | None = None,
    agg: str = "token-mean",
) -> dict[str, Any]:
    """Every variant (default ranges, `agg`, no TIS/KL) and every preset on one batch."""
    mask = batch["mask"]
    results: dict[str, Any] = {
        "batch": {
            "rows": int(mask.shape[0]),
            "padded_len": int(mask.shape[1]),
            "tokens": int(mask.sum()),
            "variant_agg": agg,
        },
        "variants": {},
        "presets": {},
    }
    for name in progress.steps(variants or LOSSES.canonical_names(), "variant"):
        results["variants"][name] = evaluate(batch, variant=name, agg=agg)
    for name in progress.steps(PRESETS.canonical_names(), "preset"):
        kwargs, note = _preset_kwargs(name, batch)
        adv = kwargs.pop("advantages", None)
        entry = evaluate({**batch, "advantages": adv} if adv is not None else batch, **kwargs)
        results["presets"][name] = {**entry, "note": note}
    return results


@dataclasses.dataclass(frozen=True)
class LabConfig:
    """The batch the lab evaluates and what it evaluates on it."""

    batch: str = ""
    """.npz batch (see `save_batch`); "" = a seeded synthetic batch."""
    seed: int = 0
    """Synthetic batch: its seed."""
    groups: int = 8
    """Synthetic batch: prompts."""
    group_size: int = 8
    """Synthetic batch: completions per prompt."""
    max_len: int = 256
    """Synthetic batch: the generation budget."""
    agg: str = "token-mean"
    """Aggregation of the variant rows."""
    variant: tuple[str, ...] = ()
    """Evaluate only these variants (registered names or module:function; repeatable)."""
    save_synthetic: str = ""
    """Write the synthetic batch to this .npz."""

    def __post_init__(self) -> None:
        if self.batch and self.save_synthetic:
            raise ValueError("--save-synthetic writes the synthetic batch; not with --batch")


def run(cfg: LabConfig) -> dict[str, Any]:
    """`run_lab` on the config's batch (read, or synthesised and maybe saved)."""
    if cfg.batch:
        batch = load_batch(cfg.batch)
    else:
        sizes = dict(groups=cfg.groups, group_size=cfg.group_size, max_len=cfg.max_len)
        batch = synthetic_batch(seed=cfg.seed, **sizes)
        if cfg.save_synthetic:
            save_batch(cfg.save_synthetic, **batch)
    results = run_lab(batch, variants=list(cfg.variant) or None, agg=cfg.agg)
    results["batch"]["source"] = cfg.batch or f"synthetic(seed={cfg.seed})"
    return results


BENCH = Bench(
    LabConfig,
    run,
    presets={"default": LabConfig(), "quick": LabConfig(groups=2, group_size=4, max_len=32)},
    headlines=("batch", "variants", "presets"),
)
