"""Full RL vs LoRA RL (ranks 8 and 32) vs full RL with int8 rollouts, on the demo at equal
samples.

    nice -n 19 python scripts/experiment_lora.py --config configs/demo.yaml --out runs/lora
    python scripts/experiment_lora.py --config configs/demo.yaml --quick --out /tmp/lora

Arms, each from the config's base model, `--steps` updates of the same batches' size:

    full        the config as it is (the demo: `olmo3` preset, TIS C = 2)
    lora8       LoRA rank 8 on every projection (alpha 16), `--lora-lr` (default 10× the
                config's learning rate: LoRA's optimum sits about there)
    lora32      LoRA rank 32 (alpha 64), `--lora-lr`
    full_int8   full RL with the actors decoding from int8 weights (`rollout.weight_dtype`)

Equal samples: every run is `rollout.mode: sync` without active sampling, so each update
draws exactly `train.prompts_per_batch` prompts × G samples. The harness
(`scripts/experiment_common.py`) trains each arm in a subprocess and evaluates the base and
every final policy (held-out pass@1/8/32, n = 32, 95% intervals; LoRA arms are evaluated from
their merged export). This script adds each arm's costs, in `results.md`'s last table: the
median train step seconds (`time/train_s`, the first, compiling step left out), the mean
`push/bytes` and `push/seconds`, the sampler/learner mismatch (`kl/sampler_learner`,
`tis/mean`), the learner's optimizer bytes per device from the dry-run plan and the size of the
last checkpoint, with each as a share of the full arm's.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiment_common as harness  # the sibling module
from experiment_common import Arm, Phase

ARMS: dict[str, tuple[str, ...]] = {
    "full": (),
    "lora8": ("model.lora.rank=8", "model.lora.alpha=16", "train.learning_rate={lr}"),
    "lora32": ("model.lora.rank=32", "model.lora.alpha=64", "train.learning_rate={lr}"),
    "full_int8": ("rollout.weight_dtype=int8",),
}
"""Each arm's overrides on top of the common ones; `{lr}` is `--lora-lr`."""
COMMON = ("rollout.mode=sync", "filter.active_sampling=false")
"""Equal samples: every update draws exactly prompts_per_batch × G completions."""
COSTS = {
    "step_s": "step s (median)",
    "push_bytes": "push bytes",
    "push_seconds": "push s",
    "kl_sampler_learner": "kl(sampler‖learner)",
    "tis_mean": "tis/mean",
    "optimizer_bytes": "optimizer bytes (plan)",
    "checkpoint_bytes": "checkpoint bytes",
}
SHARED = ("push_bytes", "optimizer_bytes", "checkpoint_bytes")
"""Costs also shown as a share of the full arm's."""


def mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def costs(cfg: Any, rows: list[dict[str, Any]], run_dir: Path) -> dict[str, float | None]:
    """One arm's costs from its metrics rows, its config's plan and its last checkpoint."""
    from rlvr_jax.plan import make_plan

    step_s = [r["time/train_s"] for r in rows[1:] if "time/train_s" in r]
    ckpts = sorted((run_dir / "checkpoints").glob("*"), key=lambda p: p.name)
    return {
        "step_s": statistics.median(step_s) if step_s else None,
        "push_bytes": mean_of(rows, "push/bytes"),
        "push_seconds": mean_of(rows, "push/seconds"),
        "kl_sampler_learner": mean_of(rows, "kl/sampler_learner"),
        "tis_mean": mean_of(rows, "tis/mean"),
        "optimizer_bytes": make_plan(cfg, n_devices=1).learner_bytes["optimizer"],
        "checkpoint_bytes": (
            sum(p.stat().st_size for p in ckpts[-1].rglob("*") if p.is_file()) if ckpts else None
        ),
    }


def cost_table(arms: dict[str, dict[str, Any]]) -> str:
    """The costs of the first seed's arms, as markdown."""
    full = arms.get("full", {})
    lines = [
        "| policy | " + " | ".join(COSTS.values()) + " |",
        "|---|" + "---:|" * len(COSTS),
    ]
    for name, r in arms.items():
        if "step_s" not in r:
            continue  # the base
        cells = []
        for key in COSTS:
            v = r[key]
            fmt = ".2e" if key == "kl_sampler_learner" else ",.0f" if key in SHARED else ".4g"
            cell = "—" if v is None else format(v, fmt)
            if key in SHARED and v is not None and full.get(key):
                cell += f" ({v / full[key]:.1%})"
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    p = harness.parser(__doc__, out="runs/lora", steps=(20, 2))
    p.add_argument(
        "--lora-lr", type=float, help="LoRA arms' learning rate (default 10× the config's)"
    )
    args = p.parse_args(argv)
    steps = harness.steps(args)
    if steps < 1:
        p.error("--steps must be >= 1")
    lr = args.lora_lr
    if lr is None:
        from rlvr_jax.config import load

        lr = 10 * load(args.config, args.overrides).train.learning_rate
    overrides = {a: tuple(o.format(lr=lr) for o in ov) for a, ov in ARMS.items()}
    every = f"checkpoint.every_steps={steps}"  # a checkpoint to measure

    def record(ctx: harness.Context, rec: dict[str, Any], rows: list[dict]) -> dict:
        final = Path(rec["runs"][-1]["to"])  # <seed dir>/<arm>/final
        return costs(ctx.load(overrides[final.parent.name]), rows, final.parent)

    exp = harness.Experiment(
        name="lora",
        title=f"Full RL vs LoRA RL vs int8 rollouts at {steps} updates (equal samples)",
        arms=tuple(Arm(a, (Phase("rl", steps, "", (*o, every)),)) for a, o in overrides.items()),
        defaults=COMMON,
        compare=tuple((a, "full") for a in ARMS if a != "full"),
        record=record,
        finish=lambda ctx, results: results.update(
            extra_markdown="Costs (first seed):\n\n" + cost_table(results["arms"])
        ),
    )
    harness.run_main(p, args, exp, argv, {"steps": steps, "lora_learning_rate": lr})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
