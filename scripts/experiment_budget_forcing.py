"""Budget forcing on the demo: the same RL run with and without `rollout.interrupt`.

    python scripts/experiment_budget_forcing.py --config configs/demo.yaml --steps 8 \
        --budget 24 --answer 20 --out runs/budget_forcing
    python scripts/experiment_budget_forcing.py --config configs/demo.yaml --quick --out /tmp/bf

Two arms from the config's base model with the same seed, prompts and update budget:

    off   the config as it is (no interruption)
    on    `rollout.interrupt.thinking_budget=--budget`, `.text=--text`, `.answer_budget=--answer`:
          a completion still going after `--budget` tokens gets the text appended by the
          engine (its KV cache continues) and may answer in `--answer` more tokens

For each arm, from its metrics.jsonl: the training reward (`reward/mean`, over every drawn
completion) averaged over all steps and over the last half, the mean response length, and the
fraction of completions interrupted (`rollout/interrupted_fraction`). Written to
`<out>/results.md` and `<out>/results.json` with the wall time and the load average (the
machine may be shared). Trailing `key=value` overrides apply to both arms.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("experiment_budget_forcing")

ARMS = ("off", "on")
QUICK_STEPS = 1


def arm_overrides(arm: str, *, budget: int, text: str, answer: int) -> list[str]:
    """The overrides that make `arm` (on top of the common ones)."""
    if arm == "off":
        return ["rollout.interrupt.thinking_budget=0"]
    if arm == "on":
        return [
            f"rollout.interrupt.thinking_budget={budget}",
            f"rollout.interrupt.text={json.dumps(text)}",
            f"rollout.interrupt.answer_budget={answer}",
        ]
    raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS}")


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """An arm's figures from its metrics rows (one per step)."""
    if not rows:
        raise ValueError("the run logged no steps")

    def mean(key: str, part: list[dict[str, Any]]) -> float:
        values = [r[key] for r in part if isinstance(r.get(key), int | float)]
        return float(sum(values) / len(values)) if values else float("nan")

    late = rows[len(rows) // 2 :]
    return {
        "steps": float(len(rows)),
        "reward_mean": mean("reward/mean", rows),
        "reward_last_half": mean("reward/mean", late),
        "response_length": mean("response_length/mean", rows),
        "interrupted_fraction": mean("rollout/interrupted_fraction", rows),
        "drawn_groups": float(sum(r.get("groups/drawn", 0.0) for r in rows)),
    }


def run_arm(config: str, overrides: Sequence[str], out: Path) -> dict[str, float]:
    """Trains one arm into `out`; returns its summary and wall time."""
    from rlvr_jax.config import load
    from rlvr_jax.training.metrics import read_jsonl
    from rlvr_jax.training.run import train

    cfg = load(config, [*overrides, f"train.output_dir={json.dumps(str(out))}"])
    t0 = time.perf_counter()
    train(cfg)
    summary = summarize(read_jsonl(out / "metrics.jsonl"))
    summary["wall_s"] = time.perf_counter() - t0
    return summary


def table(results: dict[str, dict[str, float]], meta: dict[str, Any]) -> str:
    """The results as markdown."""
    lines = [
        f"Budget forcing on `{meta['config']}`, {meta['steps']} RL steps per arm, "
        f"thinking budget {meta['budget']} tokens, answer budget {meta['answer']}, "
        f"text {meta['text']!r}; {meta['machine']}, load average {meta['load_before']} "
        f"before, {meta['load_after']} after.",
        "",
        "| arm | interrupted fraction | reward (all steps) | reward (last half) "
        "| response length | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for arm, r in results.items():
        frac = r["interrupted_fraction"]
        frac_text = "— (off)" if frac != frac else f"{frac:.3f}"  # nan: the metric is absent
        lines.append(
            f"| {arm} | {frac_text} | {r['reward_mean']:.3f} | "
            f"{r['reward_last_half']:.3f} | {r['response_length']:.1f} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--budget", type=int, default=24, help="thinking budget (tokens)")
    parser.add_argument("--answer", type=int, default=20, help="answer budget (tokens)")
    parser.add_argument("--text", default="</think> Okay, time to answer.")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} step per arm")
    parser.add_argument("overrides", nargs="*", help="key=value applied to both arms")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    steps = QUICK_STEPS if args.quick else args.steps
    common = [*args.overrides, f"train.max_steps={steps}", "eval.every_steps=0"]
    args.out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "config": args.config,
        "steps": steps,
        "budget": args.budget,
        "answer": args.answer,
        "text": args.text,
        "overrides": list(args.overrides),
        "machine": f"{platform.machine()} x {os.cpu_count()} CPUs",
        "load_before": round(os.getloadavg()[0], 2),
    }
    results = {}
    for arm in ARMS:
        extra = arm_overrides(arm, budget=args.budget, text=args.text, answer=args.answer)
        log.info("arm %s: %s", arm, extra)
        results[arm] = run_arm(args.config, [*common, *extra], args.out / arm)
    meta["load_after"] = round(os.getloadavg()[0], 2)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "arms": results}, indent=1))
    md = table(results, meta)
    (args.out / "results.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
