"""`rlvr-bench waste`: decode slot-steps wasted by static vs continuous batching (waste =
1 − useful / total slot-steps, ALGORITHMS.md): simulated exactly on OLMo 3's clipped LogNormal
lengths swept over the slots B, and measured on the real engine at a small cap, its counters
(`SchedulerStats`) and wall times beside the simulation of the same lengths.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlvr_jax.bench import common, progress
from rlvr_jax.bench.table import Bars, Bench


def _check(lengths: Sequence[int], slots: int) -> None:
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    if len(lengths) == 0 or min(lengths) < 1:
        raise ValueError("lengths must be a non-empty list of positive token counts")


def static_steps(lengths: Sequence[int], slots: int) -> int:
    """Decode steps of static batching: Σ over consecutive batches of max ℓ in the batch."""
    _check(lengths, slots)
    return sum(max(lengths[i : i + slots]) for i in range(0, len(lengths), slots))


def continuous_steps(lengths: Sequence[int], slots: int) -> int:
    """Decode steps of continuous batching, requests admitted in order into the first free
    slot (a slot freed after step t serves the next request from step t + 1)."""
    _check(lengths, slots)
    free_at = [0] * slots
    for n in lengths:
        heapq.heappush(free_at, heapq.heappop(free_at) + n)
    return max(free_at)


def waste(lengths: Sequence[int], steps: int, slots: int) -> float:
    """Fraction of the `steps` x `slots` slot-steps that produced no token."""
    _check(lengths, slots)
    total = steps * slots
    if total < sum(lengths):
        raise ValueError(f"{steps} steps x {slots} slots cannot hold {sum(lengths)} tokens")
    return 1.0 - sum(lengths) / total


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclasses.dataclass(frozen=True)
class LengthDistribution:
    """ℓ = ⌈min(X, cap)⌉ tokens with X ~ LogNormal(mu, sigma) (ln X ~ Normal(mu, sigma))."""

    mu: float
    """μ: mean of ln X (e^μ is the median before clipping)."""
    sigma: float
    """σ: standard deviation of ln X (the spread)."""
    cap: int
    """The generation budget: longer responses are truncated to it."""

    def __post_init__(self) -> None:
        if self.sigma <= 0 or self.cap < 1 or not math.isfinite(self.mu):
            raise ValueError(
                f"need sigma > 0, cap >= 1 and a finite mu; got mu={self.mu}, "
                f"sigma={self.sigma}, cap={self.cap}"
            )

    @classmethod
    def fit(cls, *, mean: float, cap: int, sigma: float) -> LengthDistribution:
        """The distribution with this `sigma` and `cap` whose clipped mean E[min(X, cap)] is
        `mean` (μ by bisection; the clipped mean increases with μ)."""
        if not 0 < mean < cap:
            raise ValueError(f"the mean length must be in (0, cap={cap}), got {mean}")
        lo, hi = math.log(mean) - 10 * sigma - 10, math.log(cap) + 10 * sigma + 10
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if cls(mid, sigma, cap).mean() < mean else (lo, mid)
        return cls(0.5 * (lo + hi), sigma, cap)

    def mean(self) -> float:
        """E[min(X, cap)] = e^(μ+σ²/2) Φ(a − σ) + cap (1 − Φ(a)), a = (ln cap − μ)/σ."""
        a = (math.log(self.cap) - self.mu) / self.sigma
        body = math.exp(self.mu + self.sigma**2 / 2) * _normal_cdf(a - self.sigma)
        return body + self.cap * (1.0 - _normal_cdf(a))

    def clipped_fraction(self) -> float:
        """P(X ≥ cap): the share of responses truncated at the budget."""
        return 1.0 - _normal_cdf((math.log(self.cap) - self.mu) / self.sigma)

    def scaled(self, cap: int) -> LengthDistribution:
        """The same shape with the budget `cap`: X scaled by cap / self.cap (μ shifted)."""
        return LengthDistribution(self.mu + math.log(cap / self.cap), self.sigma, cap)

    def describe(self) -> dict[str, Any]:
        """The parameters and derived figures, for the JSON and the table."""
        return {
            "kind": "clipped log-normal",
            "mu": self.mu,
            "sigma": self.sigma,
            "cap": self.cap,
            "mean": self.mean(),
            "median_unclipped": math.exp(self.mu),
            "clipped_fraction": self.clipped_fraction(),
        }

    def sample(self, n: int, seed: int) -> np.ndarray:
        """`n` lengths in [1, cap] (int64)."""
        if n < 1:
            raise ValueError(f"need at least one length, got n={n}")
        x = np.random.default_rng(seed).lognormal(self.mu, self.sigma, size=n)
        return np.clip(np.ceil(x), 1, self.cap).astype(np.int64)


STEPS = {"static": static_steps, "continuous": continuous_steps}
"""Each batching mode's decode steps for a list of lengths and a slot count."""


def wastes(lengths: Sequence[int], slots: int) -> dict[str, float]:
    """`{static,continuous}_waste` of `lengths` on `slots` slots."""
    return {
        f"{k}_waste": waste(lengths, steps(lengths, slots), slots) for k, steps in STEPS.items()
    }


def simulate(
    dist: LengthDistribution, *, requests: int, slots: int, sweep: Sequence[int], seed: int
) -> dict[str, Any]:
    """Static and continuous waste of `requests` sampled lengths at `slots` and each `sweep` B."""
    lengths = dist.sample(requests, seed).tolist()
    by_slots = {str(b): wastes(lengths, b) for b in sorted({*sweep, slots})}
    return {
        **by_slots[str(slots)],
        "slots": slots,
        "requests": requests,
        "sample_mean": float(np.mean(lengths)),
        "sample_clipped_fraction": lengths.count(dist.cap) / requests,
        "one_minus_mean_over_cap": 1.0 - float(np.mean(lengths)) / dist.cap,
        "by_slots": by_slots,
    }


def measure(cfg: WasteBenchConfig, dist: LengthDistribution) -> dict[str, Any]:
    """Static vs continuous waste and wall time on the engine, beside the simulation of the same
    lengths (drawn from `dist`)."""
    from rlvr_jax.bench.engine_timing import run_lengths
    from rlvr_jax.rollout import EngineCore

    requests, slots, prompt_len = cfg.measured_requests, cfg.measured_slots, cfg.prompt_len
    model_sizes, seed = dict(cfg.model_sizes), cfg.seed
    lengths = dist.sample(requests, seed + 1).tolist()
    model = common.ModelSize(**model_sizes).model(seed)
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, model.config.vocab_size, (requests, prompt_len)).tolist()
    core = EngineCore(model, max_slots=slots, max_len=prompt_len + dist.cap + 8, chunk=cfg.chunk)
    warm = min(requests, 2 * slots)
    stats, walls = {}, {}
    for batching in ("static", "continuous"):
        progress.line(f"engine, {batching} batching: warm up, then {requests} requests")
        run_lengths(core, prompts[:warm], lengths[:warm], batching)  # compile + warm up
        start = time.perf_counter()
        stats[batching] = run_lengths(core, prompts, lengths, batching)
        walls[batching] = time.perf_counter() - start
    predicted = {k: steps(lengths, slots) for k, steps in STEPS.items()}
    tokens = sum(lengths)
    return {
        "static_waste": stats["static"].waste,
        "continuous_waste": stats["continuous"].waste,
        "predicted": wastes(lengths, slots),
        "slot_steps": {k: s.slot_steps for k, s in stats.items()},
        "predicted_slot_steps": {k: n * slots for k, n in predicted.items()},
        "decode_calls": {k: s.decode_calls for k, s in stats.items()},
        "wall_s": walls,
        "tokens_per_s": {k: tokens / s for k, s in walls.items()},
        "continuous_over_static_wall": walls["continuous"] / walls["static"],
        "tokens": tokens,
        "requests": requests,
        "slots": slots,
        "prompt_len": prompt_len,
        "cap": dist.cap,
        "sample_mean": tokens / requests,
        "model": {**model_sizes, "params": model.config.n_params()},
    }


@dataclasses.dataclass(frozen=True)
class WasteBenchConfig:
    """Sizes of one `rlvr-bench waste` run."""

    mean: float = 14_700.0
    """Target mean response length of the simulated regime (tokens)."""
    cap: int = 32_768
    """Generation budget of the simulated regime (tokens)."""
    sigma: float = 0.7
    """σ of the log-normal (its spread); μ is fitted to `mean`."""
    requests: int = 8192
    """Simulated requests."""
    slots: int = 64
    """B of the headline simulated figure."""
    sweep: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    """B values of the simulated sweep."""
    measured_cap: int = 64
    """Budget of the scaled-down engine run (the distribution is scaled to it)."""
    measured_requests: int = 512
    """Requests of the engine run."""
    measured_slots: int = 16
    """Engine slots."""
    prompt_len: int = 8
    """Prompt tokens per engine request."""
    chunk: int = 8
    """Decode steps per engine call."""
    model_sizes: tuple[tuple[str, int], ...] = common.option(
        (("d_model", 256), ("n_layers", 4), ("n_heads", 4), ("n_kv_heads", 2), ("d_ff", 768),
         ("vocab", 4096)),
        flag=None,
    )  # fmt: skip
    """The engine's small random bench-shaped model (large enough that decode steps, not the
    host's per-call overhead, dominate the wall time)."""
    seed: int = 0
    """Seed of the lengths, prompts and params."""

    def __post_init__(self) -> None:
        for name in ("requests", "slots", "measured_cap", "measured_requests", "measured_slots",
                     "prompt_len", "chunk"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.sigma <= 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        if not 0 < self.mean < self.cap:
            raise ValueError(f"mean must be in (0, cap={self.cap}), got {self.mean}")
        if self.measured_cap > self.cap:
            raise ValueError(f"measured_cap={self.measured_cap} must not exceed cap={self.cap}")


QUICK = WasteBenchConfig(
    requests=512, sweep=(1, 4, 16, 64), measured_cap=16, measured_requests=24, measured_slots=4,
    model_sizes=tuple(common.TINY_SIZES.items()),
)  # fmt: skip


def run(cfg: WasteBenchConfig) -> dict[str, Any]:
    """The simulation and the engine measurement; the nested JSON-able result."""
    dist = LengthDistribution.fit(mean=cfg.mean, cap=cfg.cap, sigma=cfg.sigma)
    small = dist.scaled(cfg.measured_cap)
    progress.line(f"simulating {cfg.requests} requests")
    simulated = simulate(
        dist, requests=cfg.requests, slots=cfg.slots, sweep=cfg.sweep, seed=cfg.seed
    )
    return {
        "simulated": simulated,
        "measured": measure(cfg, small),
        "distribution": {"simulated": dist.describe(), "measured": small.describe()},
    }


def _sweep(result: dict[str, Any]) -> common.Panel:
    """Simulated waste against the slots B, beside 1 - mean/cap."""
    sim = result["simulated"]
    bs = [int(b) for b in sim["by_slots"]]
    lines = {
        kind: (bs, [v[f"{kind}_waste"] for v in sim["by_slots"].values()])
        for kind in ("static", "continuous")
    }
    lines["1 - mean/cap"] = (bs, [sim["one_minus_mean_over_cap"]] * len(bs))
    return common.Panel(
        "simulated waste vs slots", "waste", lines=lines, xlabel="slots B", logx=True
    )


BENCH = Bench(
    WasteBenchConfig,
    run,
    presets={"default": WasteBenchConfig(), "quick": QUICK},
    headlines=(
        "simulated/static_waste",
        "simulated/continuous_waste",
        "measured/static_waste",
        "measured/continuous_waste",
        "measured/predicted",
        "measured/continuous_over_static_wall",
    ),
    plot=(
        _sweep,
        Bars("engine: measured waste", "waste", "measured", ("static_waste", "continuous_waste")),
        Bars("engine: simulated on its lengths", "waste", "measured/predicted"),
        Bars("engine: wall seconds", "seconds", "measured/wall_s"),
    ),
)
