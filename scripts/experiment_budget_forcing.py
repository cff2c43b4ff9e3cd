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
fraction of completions interrupted (`rollout/interrupted_fraction`); and, by the harness
(`scripts/experiment_common.py`), held-out pass@1/8/32 (n = 32) of each arm's policy sampled
with that arm's rollout settings. `results.json` keeps `meta` and `arms`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiment_common as harness  # the sibling module
from experiment_common import Arm, Phase

ARMS = ("off", "on")


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

    return {
        "steps": float(len(rows)),
        "reward_mean": mean("reward/mean", rows),
        "reward_last_half": mean("reward/mean", rows[len(rows) // 2 :]),
        "response_length": mean("response_length/mean", rows),
        "interrupted_fraction": mean("rollout/interrupted_fraction", rows),
        "drawn_groups": float(sum(r.get("groups/drawn", 0.0) for r in rows)),
    }


def table(results: dict[str, Any]) -> str:
    """The training figures as markdown (the held-out table comes from the harness)."""
    lines = [
        "| arm | interrupted fraction | reward (all steps) | reward (last half) "
        "| response length | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for arm, r in results["arms"].items():
        if arm == "base":
            continue
        frac = r["interrupted_fraction"]
        frac_text = "— (off)" if frac != frac else f"{frac:.3f}"  # nan: the metric is absent
        lines.append(
            f"| {arm} | {frac_text} | {r['reward_mean']:.3f} | "
            f"{r['reward_last_half']:.3f} | {r['response_length']:.1f} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = harness.parser(__doc__.splitlines()[0], out="runs/budget_forcing", steps=(8, 1))
    p.add_argument("--budget", type=int, default=24, help="thinking budget (tokens)")
    p.add_argument("--answer", type=int, default=20, help="answer budget (tokens)")
    p.add_argument("--text", default="</think> Okay, time to answer.")
    args = p.parse_args(argv)
    steps, s = harness.steps(args), dict(budget=args.budget, text=args.text, answer=args.answer)
    meta = {"steps": steps, **s}

    def finish(ctx: harness.Context, results: dict[str, Any]) -> None:
        meta.update(
            config=args.config,
            overrides=list(args.overrides),
            machine=results["machine"],
            load_before=results["load_before"],
            load_after=results.get("load_after"),
        )
        results.update(meta=meta, extra_markdown=table(results))

    exp = harness.Experiment(
        name="budget_forcing",
        title=f"Budget forcing, {steps} RL steps per arm, thinking budget {args.budget} tokens, "
        f"answer budget {args.answer}, text {args.text!r}",
        arms=tuple(Arm(a, (Phase("rl", steps, "", tuple(arm_overrides(a, **s))),)) for a in ARMS),
        compare=(("on", "off"),),
        record=lambda ctx, rec, rows: {**summarize(rows), "wall_s": rec["train_s"]},
        finish=finish,
    )
    harness.run_main(p, args, exp, argv, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
