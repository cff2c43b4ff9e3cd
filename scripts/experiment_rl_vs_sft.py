"""RL vs SFT on the demo task: four recipes from one base checkpoint at equal update budgets.

    python scripts/experiment_rl_vs_sft.py --config configs/demo.yaml --steps 40 --out runs/rl_sft
    python scripts/experiment_rl_vs_sft.py --config configs/demo.yaml --quick --out /tmp/rl_vs_sft

Arms, each starting from the config's base model and taking `--steps` optimizer updates:

    rl           algorithm: rl — each update: `train.prompts_per_batch` prompts × G samples
    sft          algorithm: sft — each update: `sft.batch_size` examples (default: as many as
                 the RL prompts per update)
    sft_then_rl  ⌊N/2⌋ SFT updates, then N − ⌊N/2⌋ RL updates from the SFT policy
    parallel     algorithm: rl_sft_parallel — each update averages an RL and an SFT update

SFT examples are the synthetic tasks' reference solutions (`sft.synthetic_reference: true`,
unless an override says otherwise). The base model and each arm's final policy are evaluated
on the held-out split (`data.eval_sources`) with `rlvr_jax.eval.evaluate.evaluate_policy`: n = 8
samples per prompt at `eval.temperature`, top-p 1, the same sampling seed for every policy,
giving pass@1 and pass@8 (overall and per domain). Each arm's training run (metrics.jsonl,
curves.png, checkpoints, final/) is under `<out>/<arm>/`; the table is written to
`<out>/results.md` and `<out>/results.json`. Trailing `key=value` overrides apply to every run.
`--quick` is a tiny budget (2 updates, 8 held-out prompts) for smoke tests.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("experiment_rl_vs_sft")

EVAL_SEED = 20_240_601
"""Sampling seed of every held-out evaluation (the same samples' randomness for all)."""

EVAL_KS = (1, 8)
"""pass@k reported; n = 8 samples per prompt."""

QUICK_STEPS = 2
QUICK_EVAL_PROMPTS = 8


@dataclass(frozen=True)
class Phase:
    """One `rlvr-train` run of an arm."""

    algorithm: str
    """`rl`, `sft` or `rl_sft_parallel`."""
    steps: int
    """Optimizer steps of this run."""
    subdir: str
    """Output directory under the arm's."""


def arm_phases(arm: str, steps: int) -> list[Phase]:
    """The runs of `arm` for a budget of `steps` updates (each run continues from the last)."""
    if arm == "rl":
        return [Phase("rl", steps, "run")]
    if arm == "sft":
        return [Phase("sft", steps, "run")]
    if arm == "sft_then_rl":
        return [Phase("sft", steps // 2, "sft"), Phase("rl", steps - steps // 2, "rl")]
    if arm == "parallel":
        return [Phase("rl_sft_parallel", steps, "run")]
    raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS}")


ARMS = ("rl", "sft", "sft_then_rl", "parallel")
"""The arms, in the order they run."""


def quoted(path: Path) -> str:
    """A path as a YAML override value."""
    return json.dumps(str(path))


def base_overrides(user: Sequence[str], prompts_per_batch: int | None) -> list[str]:
    """Overrides every run gets: the script's defaults, then the user's (which win)."""
    defaults = ["sft.synthetic_reference=true"]
    if prompts_per_batch is not None and not any(o.startswith("sft.batch_size=") for o in user):
        defaults.append(f"sft.batch_size={prompts_per_batch}")
    return [*defaults, *user]


def load_config(config: str, overrides: Sequence[str]) -> Any:
    from rlvr_jax.config import load

    return load(config, list(overrides))


def run_phase(config: str, common: Sequence[str], phase: Phase, model: Path, out: Path) -> Path:
    """Trains one phase from `model` into `out`; returns its exported policy directory."""
    from rlvr_jax.training.run import train

    cfg = load_config(
        config,
        [
            *common,
            f"algorithm={phase.algorithm}",
            f"train.max_steps={phase.steps}",
            f"train.output_dir={quoted(out)}",
            f"model.path={quoted(model)}",
            "model.create_if_missing=null",
            "eval.every_steps=0",
            "checkpoint.export_hf=true",
        ],
    )
    log.info("training %s for %d steps into %s", phase.algorithm, phase.steps, out)
    train(cfg)
    final = out / "final"
    if not (final / "config.json").is_file():
        raise RuntimeError(f"the {phase.algorithm} run into {out} exported no policy")
    return final


def phase_budget(phase: Phase, cfg: Any, out: Path) -> dict[str, float]:
    """What a finished phase trained on, from its metrics.jsonl."""
    from rlvr_jax.training.metrics import read_jsonl

    rows = read_jsonl(out / "metrics.jsonl")
    updates = int(rows[-1]["policy_version"]) if rows else 0
    uses_rl = phase.algorithm in ("rl", "rl_sft_parallel")
    uses_sft = phase.algorithm in ("sft", "rl_sft_parallel")
    drawn = sum(r.get("groups/drawn", 0.0) for r in rows) if uses_rl else 0.0
    return {
        "updates": updates,
        "rl_prompts": drawn,
        "rl_completions": drawn * cfg.rollout.num_samples,
        "sft_examples": float(len(rows) * cfg.sft.batch_size) if uses_sft else 0.0,
    }


def evaluate(config: str, common: Sequence[str], model: Path, service: Any) -> dict[str, Any]:
    """Held-out pass@1 / pass@8 of the policy in `model`."""
    from rlvr_jax.eval.evaluate import evaluate_policy, load_policy

    cfg = load_config(
        config,
        [
            *common,
            f"model.path={quoted(model)}",
            "model.create_if_missing=null",
            f"eval.num_samples={max(EVAL_KS)}",
            f"eval.ks={list(EVAL_KS)}",
        ],
    )
    policy, tokenizer = load_policy(cfg)
    flat = evaluate_policy(policy, tokenizer, cfg, reward_service=service, seed=EVAL_SEED)
    result: dict[str, Any] = {f"pass@{k}": flat[f"eval/pass@{k}"] for k in EVAL_KS}
    domains = sorted({key.split("/")[1] for key in flat if key.count("/") == 2})
    result["per_domain"] = {
        d: {f"pass@{k}": flat[f"eval/{d}/pass@{k}"] for k in EVAL_KS} for d in domains
    }
    result["prompts"] = int(flat["eval/prompts"])
    return result


def markdown_table(results: dict[str, Any]) -> str:
    """The results as markdown: one row per policy, then pass@k per domain."""
    arms = results["arms"]
    base = arms["base"]
    lines = [
        f"# RL vs SFT at {results['steps']} updates ({results['config']})",
        "",
        f"Held-out: {base['prompts']} prompts × n = 8 samples at temperature "
        f"{results['eval_temperature']}, seed {EVAL_SEED}.",
        "",
        "| policy | updates | RL prompts | RL samples | SFT examples | pass@1 | pass@8 | "
        "Δ pass@1 | Δ pass@8 | train s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in arms.items():
        b = r.get("budget", {})
        lines.append(
            f"| {name} | {b.get('updates', 0)} | {b.get('rl_prompts', 0):.0f} | "
            f"{b.get('rl_completions', 0):.0f} | {b.get('sft_examples', 0):.0f} | "
            f"{r['pass@1']:.3f} | {r['pass@8']:.3f} | {r['pass@1'] - base['pass@1']:+.3f} | "
            f"{r['pass@8'] - base['pass@8']:+.3f} | {r.get('train_s', 0.0):.0f} |"
        )
    domains = sorted(base["per_domain"])
    if domains:
        lines += [
            "",
            "| policy | " + " | ".join(f"{d} pass@1 | {d} pass@8" for d in domains) + " |",
        ]
        lines.append("|---|" + "---:|---:|" * len(domains))
        for name, r in arms.items():
            cells = " | ".join(
                f"{r['per_domain'][d]['pass@1']:.3f} | {r['per_domain'][d]['pass@8']:.3f}"
                for d in domains
            )
            lines.append(f"| {name} | {cells} |")
    return "\n".join(lines) + "\n"


def run_experiment(
    config: str,
    user_overrides: Sequence[str],
    *,
    steps: int,
    out: Path,
    arms: Sequence[str],
    quick: bool,
) -> dict[str, Any]:
    """Trains and evaluates every arm; returns (and writes) the results."""
    from rlvr_jax.models.bootstrap import ensure_model
    from rlvr_jax.rewards import RewardService

    user = [*user_overrides, *([f"eval.max_prompts={QUICK_EVAL_PROMPTS}"] if quick else [])]
    cfg = load_config(config, base_overrides(user, None))
    common = base_overrides(user, cfg.train.prompts_per_batch)
    cfg = load_config(config, common)
    if not cfg.data.sources or not cfg.data.eval_sources:
        raise ValueError(f"{config}: set data.sources and data.eval_sources (the held-out split)")
    base = ensure_model(cfg).absolute()
    results: dict[str, Any] = {
        "config": config,
        "overrides": list(user_overrides),
        "steps": steps,
        "base_model": str(base),
        "eval_temperature": cfg.eval.temperature,
        "arms": {},
    }
    with RewardService(cfg.rewards) as service:
        results["arms"]["base"] = evaluate(config, common, base, service)
        for arm in arms:
            model, budget, runs, t0 = base, {}, [], time.perf_counter()
            for phase in arm_phases(arm, steps):
                phase_out = out / arm / phase.subdir
                runs.append(
                    {"algorithm": phase.algorithm, "steps": phase.steps, "from": str(model)}
                )
                model = run_phase(config, common, phase, model, phase_out)
                runs[-1]["to"] = str(model)
                for key, value in phase_budget(phase, cfg, phase_out).items():
                    budget[key] = budget.get(key, 0) + value
            train_s = time.perf_counter() - t0
            results["arms"][arm] = {
                **evaluate(config, common, model, service),
                "budget": budget,
                "train_s": train_s,
                "runs": runs,
            }
            write_results(out, results)
    write_results(out, results)
    return results


def write_results(out: Path, results: dict[str, Any]) -> None:
    """`results.json` and `results.md` in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown_table(results))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", default="configs/demo.yaml", help="the demo config")
    p.add_argument("--steps", type=int, default=None, help="optimizer updates per arm (default 40)")
    p.add_argument("--out", default="runs/rl_vs_sft", help="output directory")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {ARMS}")
    p.add_argument("--quick", action="store_true", help="tiny budget (smoke test)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace the arms' earlier runs in --out"
    )
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    args = p.parse_args(argv)
    steps = args.steps if args.steps is not None else (QUICK_STEPS if args.quick else 40)
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        p.error(f"--arms: unknown {unknown}; expected a subset of {ARMS}")
    if steps < 2:
        p.error(f"--steps must be >= 2 (sft_then_rl splits it), got {steps}")
    out = Path(args.out)
    earlier = [out / a for a in arms if (out / a).exists()]
    if earlier and not args.overwrite:
        p.error(f"{', '.join(map(str, earlier))} exist: pass --overwrite to replace them")
    for path in earlier:
        shutil.rmtree(path)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("absl").setLevel(logging.WARNING)
    results = run_experiment(
        args.config, args.overrides, steps=steps, out=out, arms=arms, quick=args.quick
    )
    sys.stdout.write(markdown_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
