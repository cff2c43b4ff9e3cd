"""RL from a DPO'd demo base vs RL from the base itself, with the same RL budget (OLMo 3 Think's
SFT → DPO → RLVR pipeline on the embedded demo, every stage on our own parts).

    python scripts/experiment_dpo_then_rl.py --config configs/demo.yaml --out runs/dpo_rl
    python scripts/experiment_dpo_then_rl.py --config configs/demo.yaml --quick --out /tmp/dpo_rl

Arms (`rlvr-train` runs, by the harness `scripts/experiment_common.py`):

1. strong (SFT): `--sft-steps` SFT updates of the base on the synthetic tasks' reference
   solutions (`sft.synthetic_reference: true`, `sft.batch_size` = `train.prompts_per_batch`);
   the weak model is the base itself (delta learning: chosen from the stronger, rejected from
   the weaker);
2. DPO: first the pairs, `rlvr_jax.eval.preference_pairs.build_pairs` (what `rlvr-prefs`
   runs) on the first `--prompts` training prompts, `--samples` samples per prompt and model:
   chosen = a verified strong sample, rejected = a weak sample the verifier rejects; then
   `--dpo-steps` updates of `algorithm: dpo` from the base on them (`dpo.batch_size` =
   `--dpo-batch`, `dpo.variant`, `dpo.beta`, reference log-probs cached);
3. base → RL and DPO → RL: the config's RL (e.g. the demo's async olmo3) for `--rl-steps`
   updates from the base and from the DPO'd model (same seed, same budget).

Every policy is evaluated by the harness (n = 32 samples per prompt, pass@1/8/32 with 95%
intervals); `results.json` also keeps the earlier keys (`eval`, `budget`, `train_s`, `pairs`,
`settings`, `load_before`, `load_after`). `--quick` shrinks everything for a smoke test.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiment_common as harness  # the sibling module
from experiment_common import Arm, Phase, quoted

DEFAULTS = dict(sft_steps=30, prompts=1024, samples=4, dpo_steps=40, dpo_batch=16, rl_steps=30)
QUICK = dict(sft_steps=2, prompts=16, samples=2, dpo_steps=2, dpo_batch=2, rl_steps=2)


def dpo_overrides(pairs: Path, *, batch: int, variant: str, beta: float, lr: float | None) -> list:
    out = [
        f"dpo.sources=[{{path: {quoted(pairs)}}}]",
        f"dpo.batch_size={batch}",
        f"dpo.variant={variant}",
        f"dpo.beta={beta}",
    ]
    return [*out, *([f"train.learning_rate={lr}"] if lr is not None else [])]


def make_pairs(ctx: harness.Context, seed: int, finals: dict[str, Path]) -> list[str]:
    """Builds the delta-learning pairs (strong SFT policy vs base); returns the DPO overrides."""
    from rlvr_jax.eval.preference_pairs import build_pairs

    s, path = ctx.settings, ctx.seed_dir(seed) / "pairs.jsonl"
    report = build_pairs(
        ctx.cfg,
        ctx.cfg.data.sources[0].path,
        str(path),
        strong=str(finals["strong (SFT)"]),
        weak=str(ctx.base),
        num_samples=s["samples"],
        seed=seed,
        max_prompts=s["prompts"],
    )
    ctx.extras["pairs"] = report.to_json()
    if report.pairs < s["dpo_batch"]:
        raise RuntimeError(
            f"only {report.pairs} pairs (fewer than a DPO batch of {s['dpo_batch']})"
        )
    return dpo_overrides(
        path, batch=s["dpo_batch"], variant=s["dpo_variant"], beta=s["dpo_beta"], lr=s["dpo_lr"]
    )


def earlier_keys(ctx: harness.Context, results: dict[str, Any]) -> None:
    """The keys this script wrote before the harness: per-policy `eval`, `budget`, `train_s`."""
    arms = results["arms"]
    results["eval"] = arms
    results["budget"] = {a: r["budget"] for a, r in arms.items() if "budget" in r}
    results["train_s"] = {a: r["train_s"] for a, r in arms.items() if "train_s" in r}


def main(argv: Sequence[str] | None = None) -> int:
    p = harness.parser(__doc__, out="runs/dpo_then_rl")
    for key, value in DEFAULTS.items():
        flag = "--" + key.replace("_", "-")
        p.add_argument(flag, type=int, default=None, help=f"default {value} ({QUICK[key]} quick)")
    p.add_argument("--dpo-variant", default="dpo", help="dpo.variant (default dpo)")
    p.add_argument("--dpo-beta", type=float, default=0.1, help="dpo.beta (default 0.1)")
    p.add_argument("--dpo-lr", type=float, help="DPO learning rate (default: the config's)")
    args = p.parse_args(argv)
    s: dict[str, Any] = {}
    for key in DEFAULTS:
        given = getattr(args, key)
        s[key] = given if given is not None else (QUICK if args.quick else DEFAULTS)[key]
        if s[key] < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {s[key]}")
    s.update(dpo_variant=args.dpo_variant, dpo_beta=args.dpo_beta, dpo_lr=args.dpo_lr)
    rl = s["rl_steps"]
    arms = (
        Arm("strong (SFT)", (Phase("sft", s["sft_steps"], "sft"),), dir=""),
        Arm("DPO", (Phase("dpo", s["dpo_steps"], "dpo"),), dir="", prepare=make_pairs),
        Arm("base → RL", (Phase("rl", rl, "rl_from_base"),), dir=""),
        Arm("DPO → RL", (Phase("rl", rl, "rl_from_dpo"),), start="DPO", dir=""),
    )
    exp = harness.Experiment(
        name="dpo_then_rl",
        title="RL from a DPO'd base vs RL from the base",
        arms=arms,
        defaults=lambda cfg: [
            "sft.synthetic_reference=true",
            f"sft.batch_size={cfg.train.prompts_per_batch}",
        ],
        compare=(("DPO → RL", "base → RL"), ("DPO", "base"), ("DPO → RL", "base")),
        finish=earlier_keys,
    )
    harness.run_main(p, args, exp, argv, s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
