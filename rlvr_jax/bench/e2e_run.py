"""One side of `rlvr-bench e2e`: a mode's timed training run (`run_mode`), measured so that a
step counts when its update has finished (`timed_window`), its rounds pooled (`pool`), and the
load average that says whether a ratio was measured on a quiet machine (`quietness`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

from rlvr_jax import timeline as tl
from rlvr_jax.bench import progress

# After the user's --set: no evaluation, checkpoint, export, plot or progress bar in the timing.
_QUIET = (
    "checkpoint.every_steps=0",
    "checkpoint.resume=false",
    "checkpoint.export_hf=false",
    "eval.every_steps=0",
    "log.progress_bar=false",
    "log.plots=false",
    "log.tensorboard=false",
    "train.save_batch=null",
)


def load_config(config_path: str | Path, overrides: list[str], *, steps: int, out: Path) -> Any:
    """The config of one run: the user's file and `--set`, then `_QUIET`, `steps` and `out`."""
    from rlvr_jax import config as config_lib

    return config_lib.load(
        config_path,
        [*overrides, *_QUIET, f"train.max_steps={steps}", f"train.output_dir={out}"],
    )


QUIET_LOAD = 0.75 * (os.cpu_count() or 1)
"""A side whose 1-minute load average passed this (0.75 runnable threads a core: 1.5 on two
cores) before or after it is not quiet (`quiet: false`): other processes took cores from it."""


def load_1min() -> float:
    """This machine's 1-minute load average."""
    return os.getloadavg()[0]


SETTLE_BELOW = 0.5 * (os.cpu_count() or 1)
"""`settle`'s default target (`--settle-below`), half a thread a core: a side busy on every core
for ~20 s lifts the 1-minute average by ~28% of its distance to the core count, so one that
starts at 1.0 on two cores ends near 1.3, under `QUIET_LOAD`."""


def settle(
    below: float,
    max_s: float,
    *,
    load: Any = load_1min,
    sleep: Any = time.sleep,
    clock: Any = time.monotonic,
    poll_s: float = 2.0,
) -> float:
    """Waits, at most `max_s` seconds, for the 1-minute load average to fall under `below` (a
    side's threads leave load that would judge the next); the seconds waited."""
    start = clock()
    if load() >= below:
        progress.line(f"waiting up to {max_s:.0f} s for the load to fall under {below}")
    while load() >= below and clock() - start < max_s:
        sleep(min(poll_s, max(max_s - (clock() - start), 0.0)))
    return clock() - start


@dataclasses.dataclass(frozen=True)
class ModeRun:
    """What one mode's run measured (the warm-up steps left out)."""

    mode: str
    steps: int
    wall_s: float
    setup_s: float
    busy_s: dict[str, float]
    overlap_s: float
    overlap_fraction: float
    split_s: dict[str, float]
    reward_mean: float
    tokens: int
    staleness_mean: float
    window_s: tuple[float, float] = (0.0, 0.0)
    """The timed window, seconds after the trainer started (`timed_window`)."""
    update_ends_s: tuple[float, ...] = ()
    """When each update (warm-up included) had finished, seconds after the trainer started."""
    loadavg: tuple[float, float] = (math.nan, math.nan)
    """1-minute load average before and after the run."""
    rounds: int = 1
    """Runs pooled into these figures (`pool`)."""
    groups_drawn: int = 0
    """Groups offered to the timed steps' batches (`groups/drawn`: kept or filtered)."""
    groups_stale: int = 0
    """Groups dropped as stale in the timed steps (`groups/stale_dropped`): decoded, unused."""

    @property
    def stale_share(self) -> float:
        """The share of the generated groups the timed steps dropped as stale."""
        total = self.groups_drawn + self.groups_stale
        return self.groups_stale / total if total else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s

    @property
    def tokens_per_s(self) -> float:
        """Trained (completion) tokens per second of the timed window."""
        return self.tokens / self.wall_s


def timed_window(
    timeline: tl.Timeline, *, warmup: int, steps: int, start: float
) -> tuple[float, float]:
    """(from, to) of the timed steps: from the last warm-up update's end (`start` without
    warm-up) to the last update's end; an async loop dispatches ahead of the device."""
    ends = sorted(end for _, end in timeline.spans("train"))
    if len(ends) != warmup + steps:
        raise RuntimeError(f"{len(ends)} of {warmup + steps} updates finished")
    return (ends[warmup - 1] if warmup else start, ends[-1])


def run_mode(
    config_path: str | Path, overrides: list[str], mode: str, *, steps: int, warmup: int, out: Path
) -> ModeRun:
    """Trains `warmup + steps` steps in `mode` ("sync" or "async"); the measured figures."""
    from rlvr_jax.training.loop import Trainer
    from rlvr_jax.training.metrics import read_jsonl

    cfg = load_config(
        config_path, [*overrides, f"rollout.mode={mode}"], steps=warmup + steps, out=out / mode
    )
    if cfg.algorithm != "rl":
        raise ValueError(f"rlvr-bench e2e runs algorithm: rl; the config has {cfg.algorithm!r}")
    timeline = tl.Timeline()
    progress.line(f"{mode} mode: {warmup} warm-up + {steps} timed training steps")
    load_before, t0 = load_1min(), time.perf_counter()
    trainer = Trainer(cfg, timeline=timeline)
    try:
        start = timeline.mark("start")
        trainer.run()
    finally:
        trainer.close()
    try:
        window = timed_window(timeline, warmup=warmup, steps=steps, start=start)
    except RuntimeError as e:
        raise RuntimeError(f"the {mode} run stopped early: {e}") from None
    rollout, train = timeline.spans("rollout", window), timeline.spans("train", window)
    rows = [r for r in read_jsonl(out / mode / "metrics.jsonl") if r["step"] > warmup]

    def total(key: str) -> float:
        return float(sum(r.get(key, 0.0) for r in rows))

    def mean(key: str) -> float:
        values = [r[key] for r in rows if r.get(key) is not None]
        return float(sum(values) / len(values)) if values else float("nan")

    return ModeRun(
        mode=mode,
        steps=steps,
        wall_s=window[1] - window[0],
        setup_s=start - t0,
        busy_s={"rollout": tl.busy(rollout), "train": tl.busy(train)},
        overlap_s=tl.overlap(rollout, train),
        overlap_fraction=tl.overlap_fraction(rollout, train),
        split_s={"rollout": total("time/rollout_s"), "train": total("time/train_s")},
        reward_mean=mean("reward/mean"),
        tokens=int(total("throughput/tokens")),
        staleness_mean=mean("staleness/mean"),
        window_s=(window[0] - start, window[1] - start),
        update_ends_s=tuple(sorted(end - start for _, end in timeline.spans("train"))),
        loadavg=(load_before, load_1min()),
        groups_drawn=int(total("groups/drawn")),
        groups_stale=int(total("groups/stale_dropped")),
    )


def pool(runs: list[ModeRun]) -> ModeRun:
    """One mode's rounds as one run: totals summed, reward and staleness averaged, the top load."""
    if len(runs) == 1:
        return runs[0]

    def summed(field: str) -> dict[str, float]:
        return {k: sum(getattr(r, field)[k] for r in runs) for k in getattr(runs[0], field)}

    busy = summed("busy_s")
    overlap = sum(r.overlap_s for r in runs)
    return dataclasses.replace(
        runs[0],
        steps=sum(r.steps for r in runs),
        wall_s=sum(r.wall_s for r in runs),
        setup_s=sum(r.setup_s for r in runs),
        busy_s=busy,
        overlap_s=overlap,
        overlap_fraction=overlap / min(busy.values()) if min(busy.values()) > 0 else 0.0,
        split_s=summed("split_s"),
        reward_mean=statistics.fmean(r.reward_mean for r in runs),
        tokens=sum(r.tokens for r in runs),
        staleness_mean=statistics.fmean(r.staleness_mean for r in runs),
        loadavg=tuple(max(r.loadavg[i] for r in runs) for i in (0, 1)),
        rounds=len(runs),
        groups_drawn=sum(r.groups_drawn for r in runs),
        groups_stale=sum(r.groups_stale for r in runs),
    )


def quietness(
    loads: dict[str, tuple[float, float]], threshold: float = QUIET_LOAD
) -> dict[str, Any]:
    """Per side and per ratio, whether the 1-minute load stayed at or under `threshold`."""
    side = {k: max(v) <= threshold for k, v in loads.items()}
    pairs = {"async_over_sync": ("async", "sync"), "async_over_trl": ("async", "trl")}
    ratios = {k: side[a] and side[b] for k, (a, b) in pairs.items() if a in side and b in side}
    return {
        "quiet": all(side.values()),
        "load": {"threshold": threshold, "by_side": loads, "quiet_by_side": side},
        "ratios_quiet": ratios,
    }
