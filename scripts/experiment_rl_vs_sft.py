"""RL vs SFT on the demo task: four recipes from one base checkpoint at equal update budgets;
with seeds and a general-skill probe, the RL-during-pretraining paper's parallel-averaging claim.

    python scripts/experiment_rl_vs_sft.py --config configs/demo.yaml --steps 40 --out runs/rl_sft
    python scripts/experiment_rl_vs_sft.py --config configs/demo.yaml --steps 30 \
        --seeds 0,1,2,3,4 --probe ifeval --out runs/parallel_averaging
    python scripts/experiment_rl_vs_sft.py --config configs/demo.yaml --quick --out /tmp/rl_vs_sft

Arms, each starting from the config's base model and taking `--steps` optimizer updates:

    rl           algorithm: rl — each update: `train.prompts_per_batch` prompts × G samples
    sft          algorithm: sft — each update: `sft.batch_size` examples (default: as many as
                 the RL prompts per update)
    sft_then_rl  ⌊N/2⌋ SFT updates, then N − ⌊N/2⌋ RL updates from the SFT policy
    parallel     algorithm: rl_sft_parallel — each update averages an RL and an SFT update

SFT examples are the synthetic tasks' reference solutions (`sft.synthetic_reference: true`,
unless an override says otherwise). `--probe ifeval` trains every arm on the arithmetic
prompts only and keeps the held-out ifeval prompts as the general-skill probe (the paper: SFT
regresses general skills by 5-8 points, RL and parallel averaging do not). The base model and
every final policy are evaluated by the harness (`scripts/experiment_common.py`: n = 32
samples per prompt, pass@1/8/32 with 95% intervals over seeds and prompts, parallel − each
other arm). Each run is under `<out>/<arm>/` (`<out>/seed<S>/<arm>/` with several seeds).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiment_common as harness  # the sibling module
from experiment_common import Phase

ARMS = ("rl", "sft", "sft_then_rl", "parallel")
"""The arms, in the order they run."""


def arm_phases(arm: str, steps: int) -> list[Phase]:
    """The runs of `arm` for a budget of `steps` updates (each run continues from the last)."""
    if arm == "rl":
        return [Phase("rl", steps)]
    if arm == "sft":
        return [Phase("sft", steps)]
    if arm == "sft_then_rl":
        return [Phase("sft", steps // 2, "sft"), Phase("rl", steps - steps // 2, "rl")]
    if arm == "parallel":
        return [Phase("rl_sft_parallel", steps)]
    raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS}")


def base_overrides(user: Sequence[str], prompts_per_batch: int | None) -> list[str]:
    """Overrides every run gets: the script's defaults, then the user's (which win)."""
    defaults = ["sft.synthetic_reference=true"]
    if prompts_per_batch is not None and not any(o.startswith("sft.batch_size=") for o in user):
        defaults.append(f"sft.batch_size={prompts_per_batch}")
    return [*defaults, *user]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    p = harness.parser(__doc__, out="runs/rl_vs_sft", steps=(40, 2))
    args = p.parse_args(argv)
    steps = harness.steps(args)
    if steps < 2:
        p.error(f"--steps must be >= 2 (sft_then_rl splits it), got {steps}")
    exp = harness.Experiment(
        name="rl_vs_sft",
        title=f"RL vs SFT at {steps} updates",
        arms=tuple(harness.Arm(a, tuple(arm_phases(a, steps))) for a in ARMS),
        defaults=lambda cfg: base_overrides([], cfg.train.prompts_per_batch),
        compare=(*(("parallel", a) for a in ARMS[:3]), *((a, "base") for a in ARMS)),
        finish=lambda ctx, results: results.update(steps=steps),
    )
    harness.run_main(p, args, exp, argv, {"steps": steps})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
