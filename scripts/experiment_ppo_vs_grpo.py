"""PPO with a learned critic vs GRPO (the `olmo3` preset) on the demo task, at equal samples.

    python scripts/experiment_ppo_vs_grpo.py --config configs/demo.yaml --out runs/ppo_vs_grpo
    python scripts/experiment_ppo_vs_grpo.py --seeds 0,1 --out runs/ppo_vs_grpo seed=0
    python scripts/experiment_ppo_vs_grpo.py --config configs/demo.yaml --quick --out /tmp/pvg

Arms, each from the config's base model, per seed (`--seeds`, the config's global `seed`), all
in `rollout.mode: sync` (so that every drawn group was asked for by a batch):

    grpo         the config as it is (the demo: `olmo3` preset — group-mean advantages, clip
                 0.2/0.272, TIS C = 2, token-mean — with zero-variance filtering and active
                 sampling), `--steps` updates
    ppo          the same loss settings with `loss.advantage: gae` and a separate critic
                 (initialised from the base model, zero value head; `critic.*` defaults: γ = 1,
                 λ = 0.95, value clip 0.2, whitened advantages); no group filtering (a critic
                 needs no reward variance within a group, so every drawn group trains)
    ppo_shared   as `ppo`, with the value head on the policy's trunk (`critic.kind: shared`)

Equal samples: the PPO arms run as many updates as it takes to generate the completions the
`grpo` arm of the same seed generated (its drawn groups, stale-dropped ones included, × G;
active sampling draws more than it trains on), i.e. ⌈samples / (prompts_per_batch × G)⌉
updates, unless `--ppo-steps` fixes it. Every policy is evaluated by the harness
(`scripts/experiment_common.py`: n = 32 samples per prompt, pass@1/8/32 with 95% intervals);
`ppo_vs_grpo.png` plots the training reward against samples generated and the held-out pass@k.
Per arm and seed `results.json` keeps `updates`, `samples`, `trained_groups` and `curve`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiment_common as harness  # the sibling module
from experiment_common import Arm, Phase

NO_FILTER = ("filter.zero_variance=false", "filter.active_sampling=false")
ARMS: dict[str, list[str]] = {
    "grpo": [],
    "ppo": ["loss.advantage=gae", "critic.kind=separate", *NO_FILTER],
    "ppo_shared": ["loss.advantage=gae", "critic.kind=shared", *NO_FILTER],
}
"""Each arm's overrides on top of the config (and the user's overrides)."""

COMMON = ["rollout.mode=sync"]
"""Every arm generates exactly the groups its batches ask for (async mode keeps extra requests
in flight, whose surplus groups are drawn and dropped: "samples" would then count those);
overrides given on the command line come after and win."""


def ppo_steps(grpo_samples: float, prompts_per_batch: int, group_size: int) -> int:
    """Updates that generate at least `grpo_samples` completions without filtering."""
    return max(1, math.ceil(grpo_samples / (prompts_per_batch * group_size)))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    p = harness.parser(__doc__, out="runs/ppo_vs_grpo", steps=(30, 2))
    p.add_argument("--ppo-steps", type=int, help="PPO updates (default: equal samples)")
    args = p.parse_args(argv)
    steps, fixed = harness.steps(args), args.ppo_steps
    if args.arms and "grpo" not in args.arms.split(",") and fixed is None:
        p.error("without the grpo arm, give --ppo-steps (equal samples need the GRPO run)")
    if steps < 1 or (fixed is not None and fixed < 1):
        p.error("--steps and --ppo-steps must be >= 1")

    def equal_samples(ctx: harness.Context, runs: dict[str, Any]) -> int:
        P, G = ctx.cfg.train.prompts_per_batch, ctx.cfg.rollout.num_samples
        return fixed if fixed is not None else ppo_steps(runs["grpo"]["samples"], P, G)

    arms = [
        Arm(a, (Phase("rl", steps if a == "grpo" else equal_samples, "", tuple(o)),))
        for a, o in ARMS.items()
    ]
    exp = harness.Experiment(
        name="ppo_vs_grpo",
        title="PPO with a critic vs GRPO at equal samples",
        arms=tuple(arms),
        defaults=COMMON,
        compare=(("ppo", "grpo"), ("ppo_shared", "grpo")),
        # samples: completions generated (drawn groups, stale-dropped ones included, × G)
        record=lambda ctx, rec, rows: {
            k: rec["budget"][k] for k in ("updates", "samples", "trained_groups")
        },
        finish=lambda ctx, results: results.update(grpo_steps=steps),
    )
    harness.run_main(p, args, exp, argv, {"steps": steps, "ppo_steps": fixed})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
