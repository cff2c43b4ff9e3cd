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
updates, unless `--ppo-steps` fixes it. Every final policy and the base are evaluated on the
held-out split like `scripts/experiment_rl_vs_sft.py` does (n = 8 samples per prompt, the same
sampling seed for all): pass@1 and pass@8. Written to `<out>`: `results.json`, `results.md`,
and `ppo_vs_grpo.png` (training reward against samples generated, per arm and seed, and the
held-out pass@k). Trailing `key=value` overrides apply to every run. `--quick`: 2 GRPO updates,
8 held-out prompts (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiment_rl_vs_sft as shared  # the evaluation and config helpers

log = logging.getLogger("experiment_ppo_vs_grpo")

ARMS: dict[str, list[str]] = {
    "grpo": [],
    "ppo": [
        "loss.advantage=gae",
        "critic.kind=separate",
        "filter.zero_variance=false",
        "filter.active_sampling=false",
    ],
    "ppo_shared": [
        "loss.advantage=gae",
        "critic.kind=shared",
        "filter.zero_variance=false",
        "filter.active_sampling=false",
    ],
}
"""Each arm's overrides on top of the config (and the user's overrides)."""

COMMON = ["rollout.mode=sync"]
"""Every arm generates exactly the groups its batches ask for (async mode keeps extra requests
in flight, whose surplus groups are drawn and dropped: "samples" would then count those);
overrides given on the command line come after and win."""

QUICK_STEPS = 2


def samples_generated(rows: list[dict[str, Any]], group_size: int) -> list[float]:
    """Cumulative completions generated for training after each step of a metrics.jsonl:
    drawn groups (kept or filtered) and stale-dropped ones, × G."""
    total, out = 0.0, []
    for r in rows:
        total += (r.get("groups/drawn", 0.0) + r.get("groups/stale_dropped", 0.0)) * group_size
        out.append(total)
    return out


def ppo_steps(grpo_samples: float, prompts_per_batch: int, group_size: int) -> int:
    """Updates that generate at least `grpo_samples` completions without filtering."""
    return max(1, math.ceil(grpo_samples / (prompts_per_batch * group_size)))


def train_arm(config: str, common: list[str], arm: str, steps: int, base: Path, out: Path):
    """Trains one arm from `base` into `out`; returns (exported policy, metrics rows)."""
    from rlvr_jax.training.metrics import read_jsonl
    from rlvr_jax.training.run import train

    cfg = shared.load_config(
        config,
        [
            *common,
            *ARMS[arm],
            "algorithm=rl",
            f"train.max_steps={steps}",
            f"train.output_dir={shared.quoted(out)}",
            f"model.path={shared.quoted(base)}",
            "model.create_if_missing=null",
            "eval.every_steps=0",
            "checkpoint.export_hf=true",
        ],
    )
    log.info("training %s for %d steps into %s", arm, steps, out)
    train(cfg)
    final = out / "final"
    if not (final / "config.json").is_file():
        raise RuntimeError(f"the {arm} run into {out} exported no policy")
    return final, read_jsonl(out / "metrics.jsonl")


def arm_record(rows: list[dict[str, Any]], group_size: int, train_s: float) -> dict[str, Any]:
    """What an arm's run trained on, and its curves."""
    samples = samples_generated(rows, group_size)
    curve = {
        "samples": samples,
        "reward": [r.get("reward/mean") for r in rows],
    }
    for key in ("value/explained_variance", "value/loss"):
        if any(key in r for r in rows):
            curve[key] = [r.get(key) for r in rows]
    return {
        "updates": int(rows[-1]["policy_version"]) if rows else 0,
        "samples": samples[-1] if samples else 0.0,
        "trained_groups": sum(r.get("groups/kept", 0.0) for r in rows),
        "train_s": train_s,
        "curve": curve,
    }


def run_experiment(
    config: str,
    user: Sequence[str],
    *,
    steps: int,
    fixed_ppo_steps: int | None,
    seeds: Sequence[int],
    arms: Sequence[str],
    out: Path,
    quick: bool,
) -> dict[str, Any]:
    """Trains and evaluates every arm for every seed; returns (and writes) the results."""
    from rlvr_jax.models.bootstrap import ensure_model
    from rlvr_jax.rewards import RewardService

    quick_eval = [f"eval.max_prompts={shared.QUICK_EVAL_PROMPTS}"] if quick else []
    common = [*COMMON, *user, *quick_eval]
    cfg = shared.load_config(config, common)
    if not cfg.data.sources or not cfg.data.eval_sources:
        raise ValueError(f"{config}: set data.sources and data.eval_sources (the held-out split)")
    P, G = cfg.train.prompts_per_batch, cfg.rollout.num_samples
    base = ensure_model(cfg).absolute()
    results: dict[str, Any] = {
        "config": config,
        "overrides": list(user),
        "grpo_steps": steps,
        "base_model": str(base),
        "prompts_per_batch": P,
        "group_size": G,
        "seeds": {},
    }
    with RewardService(cfg.rewards) as service:
        results["base"] = shared.evaluate(config, common, base, service)
        for seed in seeds:
            runs: dict[str, Any] = {}
            results["seeds"][str(seed)] = runs
            seeded = [*common, f"seed={seed}"]
            for arm in arms:
                if arm == "grpo":
                    n = steps
                elif fixed_ppo_steps is not None:
                    n = fixed_ppo_steps
                else:
                    n = ppo_steps(runs["grpo"]["samples"], P, G)
                t0 = time.perf_counter()
                model, rows = train_arm(config, seeded, arm, n, base, out / arm / f"seed{seed}")
                runs[arm] = {
                    **arm_record(rows, G, time.perf_counter() - t0),
                    **shared.evaluate(config, seeded, model, service),
                }
                write_results(out, results)
    write_results(out, results)
    return results


def mean_over_seeds(results: dict[str, Any], arm: str, key: str) -> float:
    values = [runs[arm][key] for runs in results["seeds"].values() if arm in runs]
    return sum(values) / len(values)


def markdown_table(results: dict[str, Any]) -> str:
    """Per arm and seed: updates, samples, pass@1 / pass@8 (overall and per domain)."""
    base = results["base"]
    domains = sorted(base["per_domain"])
    head = "| policy | seed | updates | samples | pass@1 | pass@8 | " + " | ".join(
        f"{d} pass@1 / @8" for d in domains
    )
    lines = [
        f"# PPO with a critic vs GRPO at equal samples ({results['config']})",
        "",
        f"Held-out: {base['prompts']} prompts × n = 8 samples; batches of "
        f"{results['prompts_per_batch']} prompts × {results['group_size']} samples.",
        "",
        head + " | train s |",
        "|---|---|---:|---:|---:|---:|" + "---:|" * len(domains) + "---:|",
    ]

    def row(name: str, seed: str, r: dict[str, Any]) -> str:
        cells = " | ".join(
            f"{r['per_domain'][d]['pass@1']:.3f} / {r['per_domain'][d]['pass@8']:.3f}"
            for d in domains
        )
        return (
            f"| {name} | {seed} | {r.get('updates', 0)} | {r.get('samples', 0):.0f} | "
            f"{r['pass@1']:.3f} | {r['pass@8']:.3f} | {cells} | {r.get('train_s', 0.0):.0f} |"
        )

    lines.append(row("base", "—", base))
    arms = list(next(iter(results["seeds"].values()), {}))
    for arm in arms:
        for seed, runs in results["seeds"].items():
            if arm in runs:
                lines.append(row(arm, seed, runs[arm]))
    if len(results["seeds"]) > 1:
        lines += ["", "| arm | mean pass@1 | mean pass@8 |", "|---|---:|---:|"]
        for arm in arms:
            p1, p8 = (mean_over_seeds(results, arm, k) for k in ("pass@1", "pass@8"))
            lines.append(f"| {arm} | {p1:.3f} | {p8:.3f} |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    """Training reward against samples generated (per arm and seed, with a moving average),
    and the held-out pass@1 / pass@8 of each arm (mean over seeds) next to the base's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bars) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    arms = list(next(iter(results["seeds"].values()), {}))
    colors = dict(zip(arms, ("tab:blue", "tab:red", "tab:green", "tab:purple")))
    for arm in arms:
        for i, runs in enumerate(results["seeds"].values()):
            if arm not in runs:
                continue
            c = runs[arm]["curve"]
            pts = [(s, r) for s, r in zip(c["samples"], c["reward"]) if isinstance(r, float)]
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            ax.plot(xs, ys, color=colors[arm], alpha=0.25, lw=1)
            k = 5
            smooth = [
                sum(ys[max(0, j - k + 1) : j + 1]) / len(ys[max(0, j - k + 1) : j + 1])
                for j in range(len(ys))
            ]
            ax.plot(xs, smooth, color=colors[arm], lw=2, label=arm if i == 0 else None)
    ax.set_xlabel("completions generated for training")
    ax.set_ylabel("training reward (mean over drawn samples)")
    ax.set_title("reward vs samples (thin: per step; thick: 5-step moving average)")
    ax.grid(alpha=0.3)
    ax.legend()
    names = ["base", *arms]
    p1 = [results["base"]["pass@1"], *(mean_over_seeds(results, a, "pass@1") for a in arms)]
    p8 = [results["base"]["pass@8"], *(mean_over_seeds(results, a, "pass@8") for a in arms)]
    xs = range(len(names))
    bars.bar([x - 0.2 for x in xs], p1, width=0.4, label="pass@1")
    bars.bar([x + 0.2 for x in xs], p8, width=0.4, label="pass@8")
    for x, a, b in zip(xs, p1, p8):
        bars.text(x - 0.2, a + 0.01, f"{a:.3f}", ha="center", fontsize=8)
        bars.text(x + 0.2, b + 0.01, f"{b:.3f}", ha="center", fontsize=8)
    bars.set_xticks(list(xs), names)
    bars.set_ylim(0, 1)
    bars.set_title(f"held-out pass@k ({len(results['seeds'])} seed(s))")
    bars.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_results(out: Path, results: dict[str, Any]) -> None:
    """`results.json`, `results.md` and `ppo_vs_grpo.png` in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if results["seeds"] and all(results["seeds"].values()):
        (out / "results.md").write_text(markdown_table(results))
        plot(results, out / "ppo_vs_grpo.png")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", default="configs/demo.yaml", help="the demo config")
    p.add_argument("--steps", type=int, default=None, help="GRPO updates (default 30)")
    p.add_argument(
        "--ppo-steps", type=int, default=None, help="PPO updates (default: equal samples)"
    )
    p.add_argument("--seeds", default="0", help="comma-separated global seeds")
    p.add_argument("--out", default="runs/ppo_vs_grpo", help="output directory")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {list(ARMS)}")
    p.add_argument("--quick", action="store_true", help="tiny budget (smoke test)")
    p.add_argument("--overwrite", action="store_true", help="replace earlier runs in --out")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    args = p.parse_args(argv)
    steps = args.steps if args.steps is not None else (QUICK_STEPS if args.quick else 30)
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        p.error(f"--arms: unknown {unknown}; expected a subset of {list(ARMS)}")
    arms = [a for a in ARMS if a in arms]  # grpo first: it sets the PPO arms' sample budget
    if "grpo" not in arms and args.ppo_steps is None:
        p.error("without the grpo arm, give --ppo-steps (equal samples need the GRPO run)")
    if steps < 1 or (args.ppo_steps is not None and args.ppo_steps < 1):
        p.error("--steps and --ppo-steps must be >= 1")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        p.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    if not seeds:
        p.error("--seeds: at least one seed")
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
        args.config,
        args.overrides,
        steps=steps,
        fixed_ppo_steps=args.ppo_steps,
        seeds=seeds,
        arms=arms,
        out=out,
        quick=args.quick,
    )
    sys.stdout.write(markdown_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
