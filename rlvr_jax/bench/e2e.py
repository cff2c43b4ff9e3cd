"""`rlvr-bench e2e`: the demo RL setup run in sync and in async mode for the same number of
optimizer steps with the same batch shape.

    rlvr-bench e2e [--config configs/demo.yaml] [--steps 6] [--warmup 2] [--set key=value ...]
                   [--preset demo|bench] [--quick] [--json FILE] [--plot FILE.png]

`--preset bench`: the demo's prompts and batch with the 56M-parameter bench model
(`common.bench_arch`, random weights, a tokenizer trained on the prompts) generating 256-token
completions; `demo` (default): the config as given.

Both runs start from the same policy and data; the first `--warmup` steps of each (compiles)
are left out of every figure. Reported:

- `steps_per_s.{sync,async}` over the measured steps, and their ratio `async_over_sync`;
- `time_s.{rollout,train}`: the sync run's split (`time/rollout_s`: waiting for and scoring
  rollouts, `time/train_s`: the update and the weight push), summed over the measured steps;
- `overlap_fraction`: in the async run, the share of the shorter stage's busy time (rollout:
  decode chunks of the driver thread; train: the updates) during which the other was busy too
  (`rlvr_jax.timeline`);
- `projected_speedup_disjoint` = (rollout + train) / max(rollout, train) from the sync split:
  what async buys when the actors and the learner have devices of their own. On one CPU both
  stages share the same cores, so async can only win back the idle gaps.

A TRL GRPOTrainer peer row needs `trl` (not a dependency); without it the row says so. When it
runs, `steps_per_s.trl` and `ratios.async_over_trl` are reported. Every run draws the same
number of groups per optimizer step (`filter.active_sampling=false`, before the user's `--set`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlvr_jax import timeline as tl
from rlvr_jax.bench import common, progress

DEFAULT_CONFIG = "configs/demo.yaml"

# What each run of the benchmark changes in the config (after the user's --set overrides):
# no evaluation, checkpoints, exports, plots or progress bar inside the timed loop.
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

# Every run (before the user's --set): no active sampling, so both sides draw the same number
# of groups per optimizer step (TRL has no zero-variance filter: `--set
# filter.zero_variance=false` trains on every group as drawn, as TRL does).
_MATCHED = ("filter.active_sampling=false",)

# --preset bench: the 56M bench model (random weights) built in the output directory, 256-token
# completions (model.path is set to the run's directory).
_BENCH = (
    "model.create_if_missing=rlvr_jax.bench.e2e:build_bench_policy",
    "model.hf_config=null",
    "rollout.max_new_tokens=256",
    # the learner's [64, 352, 32000] fp32 logits at once took the async run past 22 GB (OOM on
    # a 24 GB machine): micro-batches of 16 rows, the LM head 32 positions at a time (352 = 11 x 32)
    "train.micro_batch_size=16",
    "train.logits_chunk=32",
)
PRESETS = {"demo": (), "bench": _BENCH}
"""`--preset`: overrides of the config for each named workload."""

# --quick: a random 2-layer d=32 policy built in the output directory, 2 prompts × 4 samples.
_QUICK = (
    "model.create_if_missing=rlvr_jax.bench.e2e:build_tiny_policy",
    "model.hf_config=null",
    "train.prompts_per_batch=2",
    "rollout.num_samples=4",
    "rollout.max_new_tokens=8",
    "rollout.max_slots=8",
    "rewards.workers=1",
)


def build_tiny_policy(path: str | Path, cfg: Any) -> Path:
    """`common.tiny_policy` with its tokenizer trained on the config's first 400 training
    prompts of each source (`model.create_if_missing` of `--quick`)."""
    texts = []
    for source in cfg.data.sources:
        with open(source.path, encoding="utf-8") as f:
            texts += [json.loads(line)["prompt"] for _, line in zip(range(400), f)]
    return common.tiny_policy(path, texts, seed=cfg.seed)


def build_bench_policy(path: str | Path, cfg: Any) -> Path:
    """The bench model (`common.bench_arch`: d=512, 8 layers, V=32000, 56M parameters) with
    random weights and a tokenizer trained on the config's prompts (`model.create_if_missing`
    of `--preset bench`)."""
    from rlvr_jax.bench.decode import BenchConfig, hf_config_dict

    texts = []
    for source in cfg.data.sources:
        with open(source.path, encoding="utf-8") as f:
            texts += [json.loads(line)["prompt"] for _, line in zip(range(400), f)]
    return common.tiny_policy(path, texts, seed=cfg.seed, hf_config=hf_config_dict(BenchConfig()))


def load_config(config_path: str | Path, overrides: list[str], *, steps: int, out: Path) -> Any:
    """The config one run of the benchmark trains with: the user's file and `--set` overrides,
    then `_QUIET`, `steps` optimizer steps and its own output directory `out`."""
    from rlvr_jax import config as config_lib

    return config_lib.load(
        config_path,
        [*overrides, *_QUIET, f"train.max_steps={steps}", f"train.output_dir={out}"],
    )


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

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s


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
    t0 = time.perf_counter()
    trainer = Trainer(cfg, timeline=timeline)
    try:
        start = timeline.mark("start")
        trainer.run()
    finally:
        trainer.close()
    ends = timeline.marks("step")
    if len(ends) != warmup + steps:
        raise RuntimeError(f"the {mode} run stopped after {len(ends)} of {warmup + steps} steps")
    window = (ends[warmup - 1] if warmup else start, ends[-1])
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
    )


def trl_peer(
    config_path: str | Path, overrides: list[str], *, steps: int, warmup: int, out: Path
) -> dict[str, Any]:
    """The TRL row: TRL's GRPOTrainer on the same setup (`rlvr_jax.bench.trl_peer`) when `trl`
    is installed (it is never a dependency); a failure of the peer never fails the bench."""
    if importlib.util.find_spec("trl") is None:
        return {"status": "skipped", "reason": "trl is not installed (pip install trl to add it)"}
    try:
        from rlvr_jax.bench.trl_peer import run_trl

        cfg = load_config(config_path, overrides, steps=warmup + steps, out=out / "trl")
        progress.line(f"TRL GRPOTrainer peer: {warmup} warm-up + {steps} timed steps")
        return run_trl(cfg, steps=steps, warmup=warmup, out=out)
    except Exception as e:  # reported in the row: the peer never fails the bench
        return {"status": "failed", "reason": f"{type(e).__name__}: {e}"}


def summarize(sync: ModeRun, async_: ModeRun) -> dict[str, Any]:
    """The headline figures from the two runs."""
    r, t = sync.split_s["rollout"], sync.split_s["train"]
    return {
        "steps_per_s": {"sync": sync.steps_per_s, "async": async_.steps_per_s},
        "async_over_sync": async_.steps_per_s / sync.steps_per_s,
        "time_s": {"rollout": r, "train": t},
        "overlap_fraction": async_.overlap_fraction,
        "projected_speedup_disjoint": (r + t) / max(r, t) if max(r, t) > 0 else None,
        "modes": {
            m.mode: {**dataclasses.asdict(m), "steps_per_s": m.steps_per_s} for m in (sync, async_)
        },
    }


def run(
    config_path: str | Path,
    overrides: list[str],
    *,
    steps: int,
    warmup: int,
    quick: bool,
    preset: str = "demo",
) -> dict[str, Any]:
    """Both modes, sync first, then the TRL peer; the JSON-able result."""
    load_before = common.machine_info()["loadavg"]
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-e2e-") as tmp:
        out = Path(tmp)
        extra = [*_MATCHED, *PRESETS[preset]]
        if quick:
            extra += _QUICK
        if quick or preset != "demo":
            extra.append(f"model.path={out / 'policy'}")
        runs = [
            run_mode(config_path, [*extra, *overrides], mode, steps=steps, warmup=warmup, out=out)
            for mode in ("sync", "async")
        ]
        trl = trl_peer(config_path, [*extra, *overrides], steps=steps, warmup=warmup, out=out)
    summary = summarize(*runs)
    summary["ratios"] = {"async_over_sync": summary["async_over_sync"], "async_over_trl": None}
    if trl["status"] == "ok":
        trl["ours_async_over_trl"] = runs[1].steps_per_s / trl["steps_per_s"]
        summary["steps_per_s"]["trl"] = trl["steps_per_s"]
        summary["ratios"]["async_over_trl"] = trl["ours_async_over_trl"]
    return {
        **summary,
        "peers": {"trl": trl},
        "machine": {**common.machine_info(), "loadavg_before": load_before},
        "config": {
            "config": str(config_path),
            "preset": preset,
            "overrides": [*extra, *overrides],
            "steps": steps,
            "warmup": warmup,
            "quick": quick,
        },
    }


def format_result(result: dict[str, Any]) -> str:
    """The human-readable table."""
    rows = []
    for mode in ("sync", "async"):
        m = result["modes"][mode]
        rows.append(
            [
                mode,
                m["steps_per_s"],
                m["split_s"]["rollout"],
                m["split_s"]["train"],
                m["busy_s"]["rollout"],
                m["busy_s"]["train"],
                m["overlap_fraction"],
                m["reward_mean"],
            ]
        )
    trl = result["peers"]["trl"]
    if trl["status"] == "ok":
        rows.append(["trl", trl["steps_per_s"], *[None] * 5, trl["reward_mean"]])
    table = common.format_table(
        [
            "mode",
            "steps/s",
            "rollout s",
            "train s",
            "decode busy s",
            "train busy s",
            "overlap",
            "reward",
        ],
        rows,
    )
    lines = [
        table,
        f"async / sync steps/s:           {result['async_over_sync']:.3f}",
        f"overlap fraction (async):       {result['overlap_fraction']:.3f}",
        f"projected speedup, own devices: {result['projected_speedup_disjoint']:.3f}",
        f"TRL peer: {trl['status']} ({trl['reason']})"
        if trl["status"] != "ok"
        else f"async / TRL {trl['trl_version']} steps/s: {trl['ours_async_over_trl']:.3f}",
    ]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Steps/s per mode and the sync rollout/train split."""
    panels = [
        common.Panel("optimizer steps per second", "steps/s", bars=result["steps_per_s"]),
        common.Panel("sync split (measured steps)", "seconds", bars=result["time_s"]),
        common.Panel(
            "async busy time",
            "seconds",
            bars={
                **result["modes"]["async"]["busy_s"],
                "both": result["modes"]["async"]["overlap_s"],
            },
        ),
    ]
    return common.save_plot(path, panels, "rlvr-bench e2e")


def main(argv: list[str] | None = None) -> int:
    """`rlvr-bench e2e [options]`."""
    p = argparse.ArgumentParser(prog="rlvr-bench e2e", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=DEFAULT_CONFIG, help="an algorithm: rl config (YAML)")
    p.add_argument("--steps", type=int, help="measured steps per mode (default 6; quick 2)")
    p.add_argument("--warmup", type=int, help="steps left out first (default 2; quick 1)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, as rlvr-train's (repeatable)",
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="demo",
        help="demo: the config as given; bench: the 56M bench model, 256-token completions",
    )
    p.add_argument("--quick", action="store_true", help="a tiny random policy (smoke test)")
    p.add_argument("--json", help="write the results here as JSON")
    p.add_argument("--plot", help="write a PNG plot here")
    args = p.parse_args(argv)
    steps = args.steps if args.steps is not None else (2 if args.quick else 6)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    if steps < 1 or warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if not Path(args.config).is_file():
        p.error(f"--config {args.config}: no such file (run from the repository root)")
    try:  # a bad --set or config fails here, before either run spends any time
        load_config(
            args.config, [*_MATCHED, *PRESETS[args.preset], *args.set],
            steps=warmup + steps, out=Path("unused"),
        )  # fmt: skip
    except ValueError as e:
        p.error(str(e))
    result = run(
        args.config, args.set, steps=steps, warmup=warmup, quick=args.quick, preset=args.preset
    )
    print(format_result(result))
    if args.json:
        print(f"wrote {common.write_json(args.json, result)}", file=sys.stderr)
    if args.plot:
        print(f"wrote {plot(result, args.plot)}", file=sys.stderr)
    return 0
