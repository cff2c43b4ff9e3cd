"""The embedded demo end to end: evaluate the base model, train with RL, evaluate again, report.

    python -m rlvr_jax.demo.pipeline --config configs/demo.yaml [key=value ...]

Writes `<train.output_dir>/report.json` (`pass_at_1_before`, `pass_at_1_after`,
`pass_at_8_before`, `pass_at_8_after`, `steps`, `wall_seconds` — the run itself, set-up
excluded — plus per-domain figures) and `report.png` (reward and length curves, pass@k before
and after). Held-out pass@k uses `eval.num_samples` samples per prompt at `eval.temperature`
on `data.eval_sources`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from rlvr_jax.logs import setup_logging

log = logging.getLogger("rlvr_jax.demo")


def _evaluate(model_path: Path, cfg: Any, rewards: Any) -> dict[str, float]:
    from rlvr_jax import models
    from rlvr_jax.data import load_tokenizer
    from rlvr_jax.eval.evaluate import evaluate_policy

    model = models.load_pretrained(model_path, dtype=cfg.model.param_dtype)
    tokenizer = load_tokenizer(cfg.model.tokenizer or model_path)
    return evaluate_policy(model, tokenizer, cfg, reward_service=rewards, prefix="")


def run_demo(cfg: Any) -> dict[str, Any]:
    """Runs the demo for `cfg`; returns the report (also written next to the metrics)."""
    from rlvr_jax.models.bootstrap import ensure_model
    from rlvr_jax.rewards import RewardService
    from rlvr_jax.shutdown import SignalStop
    from rlvr_jax.training.loop import Trainer

    out = Path(cfg.train.output_dir)
    base = ensure_model(cfg)  # the shipped / cached base model, or pretrained now
    t0 = time.perf_counter()
    with RewardService(cfg.rewards) as rewards:
        log.info("evaluating the base model on the held-out split")
        before = _evaluate(base, cfg, rewards)
    log.info("base model: %s", _fmt(before))
    stop = SignalStop("rlvr_jax.demo", grace_s=None).install()
    trainer = Trainer(cfg, stop=stop)
    try:
        trainer.run()
        steps = int(trainer.steps_done)
    finally:
        trainer.close()
        stop.uninstall()
    with RewardService(cfg.rewards) as rewards:
        log.info("evaluating the trained policy on the held-out split")
        after = _evaluate(out / "final", cfg, rewards)
    log.info("after RL: %s", _fmt(after))
    report = {
        "pass_at_1_before": before["pass@1"],
        "pass_at_1_after": after["pass@1"],
        "pass_at_8_before": before.get("pass@8"),
        "pass_at_8_after": after.get("pass@8"),
        "steps": steps,
        "wall_seconds": time.perf_counter() - t0,
        "before": before,
        "after": after,
        "config": {
            "preset": cfg.loss.preset,
            "mode": cfg.rollout.mode,
            "samples_per_prompt": cfg.rollout.num_samples,
            "prompts_per_batch": cfg.train.prompts_per_batch,
            "eval_samples": cfg.eval.num_samples,
        },
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_report(report, out / "metrics.jsonl", out / "report.png")
    return report


def _fmt(m: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in sorted(m.items()) if k.startswith("pass@"))


def plot_report(report: dict[str, Any], metrics_path: Path, out_png: Path) -> Path:
    """Reward and response-length curves, and pass@k before/after, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlvr_jax.training.metrics import read_jsonl

    rows = read_jsonl(metrics_path)
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, key, title in (
        (axes[0], "reward/mean", "reward (training batches)"),
        (axes[1], "response_length/mean", "response length (tokens)"),
    ):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    ks = [k for k in ("1", "8") if report.get(f"pass_at_{k}_before") is not None]
    xs = range(len(ks))
    before = [report[f"pass_at_{k}_before"] for k in ks]
    after = [report[f"pass_at_{k}_after"] for k in ks]
    axes[2].bar([x - 0.2 for x in xs], before, width=0.4, label="before RL")
    axes[2].bar([x + 0.2 for x in xs], after, width=0.4, label="after RL")
    axes[2].set_xticks(list(xs), [f"pass@{k}" for k in ks])
    axes[2].set_ylim(0, 1)
    axes[2].set_title("held-out pass@k")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


def main(argv: list[str] | None = None) -> int:
    from rlvr_jax.config import ConfigError, load

    p = argparse.ArgumentParser(prog="python -m rlvr_jax.demo.pipeline", description=__doc__)
    p.add_argument("--config", default="configs/demo.yaml")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value")
    p.add_argument("--verbose", action="store_true", help="also show the libraries' INFO logs")
    args = p.parse_args(argv)
    try:
        cfg = load(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    setup_logging(cfg.log.log_level, verbose=args.verbose)
    if Path(cfg.train.output_dir, "checkpoints").exists():
        # the demo is a fresh run each time: an old run would be resumed, not repeated
        import shutil

        shutil.rmtree(cfg.train.output_dir)
    report = run_demo(cfg)
    print(json.dumps({k: v for k, v in report.items() if k not in ("before", "after")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
