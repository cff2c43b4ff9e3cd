"""`rlvr-bench e2e`: the demo RL setup in sync and in async mode for the same optimizer steps and
batch, beside TRL's GRPOTrainer (where `trl` is installed) and, with vLLM installed, our async
trainer on `rollout.backend: vllm` and TRL with vLLM (a peer's failure is reported in its row).
The sides run in `--rounds` interleaved rounds, the first `--warmup` steps left out, a step
counted when its update has finished (`e2e_run.timed_window`). docs/benchmarks.md lists the keys.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from rlvr_jax.bench import common, progress
from rlvr_jax.bench.common import option
from rlvr_jax.bench.e2e_run import (
    SETTLE_BELOW,
    ModeRun,
    load_1min,
    load_config,
    pool,
    quietness,
    run_mode,
    settle,
)
from rlvr_jax.bench.roofline import best_roofline
from rlvr_jax.bench.table import Bars, Bench
from rlvr_jax.models.testing import tiny_policy

DEFAULT_CONFIG = "configs/demo.yaml"

# Every run (before --set): both sides draw the same groups; the step compiles with the first batch
_MATCHED = ("filter.active_sampling=false", "train.compile_ahead=true")

# --preset bench: the 56M bench model (random weights) built in the run's directory, 256 tokens
_BENCH = (
    "model.create_if_missing=rlvr_jax.bench.e2e:build_bench_policy",
    "model.hf_config=null",
    "rollout.max_new_tokens=256",
    # all [64, 352, 32000] fp32 logits at once OOM a 24 GB machine: micro-batches of at most
    # two rows' tokens (a group's prompt + 8 x 256), the LM head 32 positions at a time
    "train.max_tokens_per_micro_batch=4608",
    "train.logits_chunk=32",
)
PRESETS = {"demo": (), "bench": _BENCH}
"""`--preset`: overrides of the config for each named workload."""

# --quick: a random 2-layer policy built in the output directory, 2 prompts × 4 samples, every
# group trained (a random policy's rewards are mostly equal: the filter would leave none).
_QUICK = (
    "filter.zero_variance=false",
    "model.create_if_missing=rlvr_jax.bench.e2e:build_tiny_policy",
    "model.hf_config=null",
    "train.prompts_per_batch=2",
    "rollout.num_samples=4",
    "rollout.max_new_tokens=8",
    "rollout.max_slots=8",
    "rewards.workers=1",
)


def _prompt_texts(cfg: Any) -> list[str]:
    """The config's first 400 training prompts of each source (a tokenizer's corpus)."""
    texts = []
    for source in cfg.data.sources:
        with open(source.path, encoding="utf-8") as f:
            texts += [json.loads(line)["prompt"] for _, line in zip(range(400), f)]
    return texts


def build_tiny_policy(path: str | Path, cfg: Any) -> Path:
    """`models.testing.tiny_policy`, its tokenizer trained on the config's prompts (`--quick`)."""
    return tiny_policy(path, _prompt_texts(cfg), seed=cfg.seed)


def build_bench_policy(path: str | Path, cfg: Any) -> Path:
    """`build_tiny_policy` with the 56M bench model (`common.ModelSize`): `--preset bench`."""
    bench = common.hf_config_dict(common.ModelSize())
    return tiny_policy(path, _prompt_texts(cfg), seed=cfg.seed, hf_config=bench)


def trl_peer(
    config_path: str | Path, overrides: list[str], *, steps: int, warmup: int, out: Path,
    use_vllm: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """The TRL row (`trl_peer.run_trl`, with vLLM colocated: `use_vllm`) when `trl` is installed;
    a failure is reported in the row, never raised."""
    if importlib.util.find_spec("trl") is None:
        return {"status": "skipped", "reason": "trl is not installed (pip install trl to add it)"}
    load_before = load_1min()
    try:
        from rlvr_jax.bench.trl_peer import run_trl

        name = "trl_vllm" if use_vllm else "trl"
        cfg = load_config(config_path, overrides, steps=warmup + steps, out=out / name)
        progress.line(f"TRL GRPOTrainer peer{' with vLLM' * use_vllm}: {warmup} warm-up + "
                      f"{steps} timed steps")  # fmt: skip
        row = run_trl(cfg, steps=steps, warmup=warmup, out=out / name, use_vllm=use_vllm)
    except Exception as e:  # reported in the row: the peer never fails the bench
        return {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
    return {**row, "loadavg": [load_before, load_1min()]}


def pool_trl(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The TRL rounds as one row (totals over totals), or the first row that is not ok."""
    bad = [r for r in rows if r["status"] != "ok"]
    if bad or len(rows) == 1:
        return bad[0] if bad else rows[0]
    wall, tokens = sum(r["wall_s"] for r in rows), sum(r["tokens"] for r in rows)
    rewards = [r["reward_mean"] for r in rows if r["reward_mean"] is not None]
    return {
        **rows[0],
        "steps": sum(r["steps"] for r in rows),
        "wall_s": wall,
        "tokens": tokens,
        "steps_per_s": sum(r["steps"] for r in rows) / wall,
        "tokens_per_s": tokens / wall,
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "loadavg": [max(r["loadavg"][i] for r in rows) for i in (0, 1)],
        "rounds": [{k: r[k] for k in ("steps_per_s", "tokens_per_s", "loadavg")} for r in rows],
    }


def _ratio(a: float, b: float) -> float | None:
    """a / b, None when b is 0 (no tokens trained: every group filtered)."""
    return a / b if b else None


def _mode_row(m: ModeRun) -> dict[str, Any]:
    """A mode's figures in the JSON: its fields and its rates."""
    rates = {"steps_per_s": m.steps_per_s, "tokens_per_s": m.tokens_per_s}
    return {**dataclasses.asdict(m), **rates, "stale_share": m.stale_share}


def summarize(sync: ModeRun, async_: ModeRun) -> dict[str, Any]:
    """The headline figures from the two runs."""
    r, t = sync.split_s["rollout"], sync.split_s["train"]
    return {
        "steps_per_s": {"sync": sync.steps_per_s, "async": async_.steps_per_s},
        "tokens_per_s": {"sync": sync.tokens_per_s, "async": async_.tokens_per_s},
        "async_over_sync": async_.steps_per_s / sync.steps_per_s,
        "time_s": {"rollout": r, "train": t},
        "overlap_fraction": async_.overlap_fraction,
        "projected_speedup_disjoint": (r + t) / max(r, t) if max(r, t) > 0 else None,
        "modes": {m.mode: _mode_row(m) for m in (sync, async_)},
    }


@dataclasses.dataclass(frozen=True)
class E2EConfig:
    """One `rlvr-bench e2e` run."""

    config: str = DEFAULT_CONFIG
    """An `algorithm: rl` config (YAML)."""
    set: tuple[str, ...] = option((), metavar="KEY=VALUE")
    """Config override, as rlvr-train's (repeatable)."""
    preset: str = option("demo", choices=tuple(PRESETS))
    """demo: the config as given; bench: the demo's prompts and batch with the 56M bench model
    (random weights, a tokenizer trained on the prompts) generating 256-token completions."""
    steps: int = 6
    """Measured steps per mode."""
    warmup: int = 2
    """Steps left out first (compiles)."""
    rounds: int = 2
    """Interleaved rounds per side."""
    settle: float = option(0.0, metavar="S")
    """Before each side wait up to S seconds for the 1-minute load to fall under --settle-below."""
    settle_below: float | None = option(None, metavar="LOAD")
    """--settle's target load (default half a thread per core: 1.0 on two cores)."""
    quick: bool = option(False, None)
    """A tiny random policy (the smoke test, `--quick`)."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 0 or self.rounds < 1:
            raise ValueError("steps and rounds must be >= 1 and warmup >= 0")
        if self.settle < 0 or (self.settle_below is not None and self.settle_below <= 0):
            raise ValueError("--settle must be >= 0 and --settle-below > 0")


def _add_side(
    summary: dict, name: str, steps_per_s: float, tokens_per_s: float, async_: ModeRun
) -> None:
    """Side `name`'s rates, and the async run's ratios over them."""
    summary["steps_per_s"][name], summary["tokens_per_s"][name] = steps_per_s, tokens_per_s
    summary["ratios"][f"async_over_{name}"] = async_.steps_per_s / steps_per_s
    summary["ratios"][f"async_over_{name}_tokens"] = _ratio(async_.tokens_per_s, tokens_per_s)


def run(cfg: E2EConfig) -> dict[str, Any]:
    """Every side in `rounds` interleaved rounds, each after `settle` (when > 0); the JSON-able
    result, each side's rounds pooled. A bad config or override fails before any run."""
    if not Path(cfg.config).is_file():
        raise ValueError(f"--config {cfg.config}: no such file (run from the repository root)")
    extra = [*_MATCHED, *PRESETS[cfg.preset]]
    load_config(cfg.config, [*extra, *cfg.set], steps=1, out=Path("unused"))
    below = SETTLE_BELOW if cfg.settle_below is None else cfg.settle_below
    has_vllm = importlib.util.find_spec("vllm") is not None  # our trainer and TRL on vLLM
    sides = ("sync", "async", "trl", *(("vllm", "trl_vllm") if has_vllm else ()))
    rounds: dict[str, list[Any]] = {side: [] for side in sides}
    waited = dict.fromkeys(sides, 0.0)
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-e2e-") as tmp:
        out = Path(tmp)
        extra += _QUICK if cfg.quick else ()
        if cfg.quick or cfg.preset != "demo":
            extra.append(f"model.path={out / 'policy'}")
        overrides = [*extra, *cfg.set]
        for r in range(cfg.rounds):
            if cfg.rounds > 1:
                progress.line(f"round {r + 1}/{cfg.rounds}")
            kw = dict(steps=cfg.steps, warmup=cfg.warmup, out=out / f"round{r}")
            for side in sides:
                if cfg.settle > 0:
                    waited[side] += settle(below, cfg.settle)
                if side in ("sync", "async"):
                    row = run_mode(cfg.config, overrides, side, **kw)
                elif side == "vllm":
                    on_vllm = [*overrides, "rollout.backend=vllm"]
                    row = run_mode(cfg.config, on_vllm, "async", **{**kw, "out": kw["out"] / side})
                else:
                    row = trl_peer(cfg.config, overrides, **kw, use_vllm=side == "trl_vllm")
                rounds[side].append(row)
    # probed after the sides, so that its own load (both cores for seconds) is not theirs
    progress.line("roofline probe (matmul peak, memory bandwidth)")
    roofline = best_roofline(cfg.quick)
    sync, async_ = pool(rounds["sync"]), pool(rounds["async"])
    summary = summarize(sync, async_)
    for mode in ("sync", "async"):
        summary["modes"][mode]["by_round"] = [
            {"steps_per_s": m.steps_per_s, "tokens_per_s": m.tokens_per_s, "loadavg": m.loadavg}
            for m in rounds[mode]
        ]
    summary["ratios"] = {
        "async_over_sync": summary["async_over_sync"],
        "async_over_trl": None,
        "async_over_sync_tokens": _ratio(async_.tokens_per_s, sync.tokens_per_s),
    }
    loads = {"sync": sync.loadavg, "async": async_.loadavg}
    peers = {"trl": (trl := pool_trl(rounds["trl"]))}
    if trl["status"] == "ok":
        trl["ours_async_over_trl"] = async_.steps_per_s / trl["steps_per_s"]
        _add_side(summary, "trl", trl["steps_per_s"], trl["tokens_per_s"], async_)
        loads["trl"] = tuple(trl["loadavg"])
    if has_vllm:
        on_vllm = pool(rounds["vllm"])
        _add_side(summary, "vllm", on_vllm.steps_per_s, on_vllm.tokens_per_s, async_)
        summary["modes"]["vllm"] = _mode_row(on_vllm)
        loads["vllm"] = on_vllm.loadavg
        peers["trl_vllm"] = pool_trl(rounds["trl_vllm"])
        if peers["trl_vllm"]["status"] == "ok":
            loads["trl_vllm"] = tuple(peers["trl_vllm"]["loadavg"])
    return {
        **summary,
        **quietness(loads),
        "peers": peers,
        "roofline": roofline,
        "config": {  # beside the config's fields (`table.run`)
            "overrides": overrides,
            "settle": {"max_s": cfg.settle, "below": below, "waited_s": waited},
        },
    }


BENCH = Bench(
    E2EConfig,
    run,
    presets={"default": E2EConfig(), "quick": E2EConfig(steps=2, warmup=1, rounds=1, quick=True)},
    headlines=(
        "steps_per_s",
        "tokens_per_s",
        "ratios",
        "overlap_fraction",
        "projected_speedup_disjoint",
        "modes/async/stale_share",
        "peers/trl/status",
        "peers/trl_vllm/status",
        "quiet",
    ),
    plot=(
        Bars("optimizer steps per second", "steps/s", "steps_per_s"),
        Bars("trained tokens per second", "tokens/s", "tokens_per_s"),
        Bars("sync split (measured steps)", "seconds", "time_s"),
        Bars("async busy time", "seconds", "modes/async/busy_s"),
    ),
)
