"""Rollouts per prompt (the RL-during-pretraining paper's Appendix D): GRPO with few (n = 4) and
many (n = 32) samples per prompt, on an easy and a hard split of the demo task, against training
prompts seen and against training FLOPs.

    python scripts/experiment_rollouts_per_prompt.py --config configs/demo.yaml --seeds 0,1,2 \
        --out runs/rollouts_per_prompt
    python scripts/experiment_rollouts_per_prompt.py --quick --out /tmp/rpp

Splits (the paper's recipe at our scale): the base model samples each training prompt
`--difficulty-samples` (16) times at temperature 1 (what `rlvr-filter` measures); prompts it
solves at least `--easy-min` (25%: the paper's 16-64 of 64) of the time are the easy split, at
most `--hard-max` (12.5%: ≤ 8 of 64) the hard split (`<out>/data/{easy,hard}.jsonl`).

Arms, per split and seed, from the base model, everything else equal (the config's GRPO —
the demo: `olmo3` preset — in `rollout.mode: sync` without active sampling, so each step draws
exactly `--prompts-per-step` prompts): `rollout.num_samples` = each of `--ns` (4, 32). Equal
completion budgets: each arm generates `--completions` (2048) completions, i.e.
⌈C / (prompts per step · n)⌉ steps, so n = 4 takes 8× the steps and sees 8× the prompts of
n = 32 for about the same training FLOPs. In-loop held-out pass@1/pass@8 (the first
`--curve-prompts` (128) held-out prompts, n = 8, `eval.every_steps`: 4 points for the largest
n, and for the others every as many steps as the largest n takes — one point at the same
prompts seen) give the curves; the final policies get the harness's n = 32 evaluation.
Training FLOPs: `experiment_data.account` (rollout decode + learner forward/backward).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiment_common as harness  # the sibling module
from experiment_common import Arm, Phase, quoted

SPLITS = ("easy", "hard")
CURVE_KS = (1, 8)


def split_rows(ctx: harness.Context, seed: int, finals: dict) -> list[str]:
    """Measures the base model's pass rate on the training prompts and writes the easy and hard
    splits (once per experiment); an arm's `prepare`."""
    from rlvr_jax.eval.evaluate import load_policy, sample_rows

    s = ctx.settings
    if "difficulty" in ctx.extras:
        return []
    sources = ctx.cfg.data.sources
    if len(sources) != 1 or not sources[0].path.endswith(".jsonl"):
        raise ValueError("the easy/hard splits need exactly one .jsonl training source")
    lines = Path(sources[0].path).read_text().splitlines()
    policy, tokenizer = load_policy(ctx.cfg)
    rows = harness.data.training_rows(ctx.cfg, tokenizer)[: s["difficulty_prompts"]]
    k = s["difficulty_samples"]
    sampled = sample_rows(
        ctx.cfg, policy, tokenizer, rows, temperature=1.0, num_samples=k, seed=ctx.cfg.seed
    )
    rate = sampled.counts_P / k
    masks = {"easy": rate >= s["easy_min"], "hard": rate <= s["hard_max"]}
    info: dict[str, Any] = {
        "samples": k,
        "prompts": len(rows),
        "histogram": np.bincount(sampled.counts_P, minlength=k + 1).tolist(),
    }
    for name, mask in masks.items():
        chosen = [lines[r.index] for r, m in zip(rows, mask) if m]
        if not chosen:
            raise ValueError(f"the {name} split is empty (--easy-min / --hard-max)")
        (ctx.out / "data").mkdir(parents=True, exist_ok=True)
        (ctx.out / "data" / f"{name}.jsonl").write_text("".join(x + "\n" for x in chosen))
        domains = [d for d, m in zip(sampled.domains, mask) if m]
        info[name] = {
            "prompts": len(chosen),
            "mean_pass_rate": float(rate[mask].mean()),
            "domains": {d: domains.count(d) for d in sorted(set(domains))},
        }
    ctx.extras["difficulty"] = info
    return []


def curve_points(results: dict[str, Any], arm: str, x: str, k: int) -> tuple[np.ndarray, ...]:
    """(x, mean, min, max) over seeds of an arm's in-loop pass@k, the base at x = 0."""
    ys, xs = [], []
    for runs in results["seeds"].values():
        if arm in runs:
            points = runs[arm]["curve"]["eval"]
            xs.append([0.0, *(p[x] for p in points)])
            ys.append(
                [results["settings"]["base_curve"][f"pass@{k}"], *(p[f"pass@{k}"] for p in points)]
            )
    if not ys:
        return (np.zeros(0),) * 4
    n = min(map(len, ys))
    xs_, ys_ = np.asarray([v[:n] for v in xs]), np.asarray([v[:n] for v in ys])
    return xs_.mean(0), ys_.mean(0), ys_.min(0), ys_.max(0)


def plot(results: dict[str, Any], path: Path) -> None:
    """Rows: the splits; columns: pass@1 and pass@8 against prompts seen and training FLOPs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(18, 7.5), squeeze=False)
    for row, split in enumerate(SPLITS):
        for col, (k, x) in enumerate([(k, x) for k in CURVE_KS for x in ("prompts", "flops")]):
            ax = axes[row][col]
            for i, n in enumerate(results["settings"]["ns"]):
                xs, mean, lo, hi = curve_points(results, f"{split} n={n}", x, k)
                ax.plot(xs, mean, "o-", color=f"C{i}", ms=3, label=f"n = {n}")
                ax.fill_between(xs, lo, hi, color=f"C{i}", alpha=0.2)
            label = "training prompts seen" if x == "prompts" else "training FLOPs"
            ax.set(xlabel=label, ylabel=f"held-out pass@{k}", title=f"{split} split: pass@{k}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    seeds = ", ".join(results["seeds"])
    fig.suptitle(f"{results['title']} — mean over seeds {seeds} (band: min–max)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def matched(results: dict[str, Any]) -> str:
    """Each arm's in-loop pass@1 / pass@8 at the largest n's final prompts seen, and at the end
    (equal completions), as markdown."""
    ns = results["settings"]["ns"]
    lines = [
        "| split | n | at prompts seen | pass@1 | pass@8 | at the end: prompts | "
        "completions | training TFLOP | pass@1 | pass@8 |",
        "|---|---:|" + "---:|" * 8,
    ]
    for split in SPLITS:
        big = [
            r[f"{split} n={max(ns)}"]
            for r in results["seeds"].values()
            if f"{split} n={max(ns)}" in r
        ]
        if not big:
            continue
        target = big[0]["curve"]["eval"][-1]["prompts"] if big[0]["curve"]["eval"] else 0.0
        for n in ns:
            recs = [r[f"{split} n={n}"] for r in results["seeds"].values() if f"{split} n={n}" in r]
            if not recs or not all(r["curve"]["eval"] for r in recs):
                continue
            at = [min(r["curve"]["eval"], key=lambda p: abs(p["prompts"] - target)) for r in recs]
            end = [r["curve"]["eval"][-1] for r in recs]
            m = lambda pts, key: float(np.mean([p[key] for p in pts]))
            lines.append(
                f"| {split} | {n} | {m(at, 'prompts'):.0f} | {m(at, 'pass@1'):.3f} | "
                f"{m(at, 'pass@8'):.3f} | {m(end, 'prompts'):.0f} | {m(end, 'samples'):.0f} | "
                f"{m(end, 'flops') / 1e12:.2f} | {m(end, 'pass@1'):.3f} | {m(end, 'pass@8'):.3f} |"
            )
    return "In-loop held-out pass@k (n = 8, mean over seeds):\n\n" + "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = harness.parser(__doc__, out="runs/rollouts_per_prompt")
    p.add_argument("--ns", default="4,32", help="samples per prompt of the arms (default 4,32)")
    p.add_argument("--prompts-per-step", type=int, help="default: train.prompts_per_batch")
    p.add_argument("--completions", type=int, help="completions per arm (default 2048, quick 32)")
    p.add_argument("--curve-prompts", type=int, help="in-loop held-out prompts (128, quick 8)")
    p.add_argument("--difficulty-samples", type=int, help="samples per prompt (16, quick 4)")
    p.add_argument(
        "--difficulty-prompts", type=int, help="training prompts measured (all; quick 32)"
    )
    p.add_argument("--easy-min", type=float, default=0.25, help="easy: base pass rate >= this")
    p.add_argument("--hard-max", type=float, default=0.125, help="hard: base pass rate <= this")
    args = p.parse_args(argv)
    try:
        ns = sorted({int(x) for x in args.ns.split(",") if x})
    except ValueError:
        p.error(f"--ns: expected comma-separated integers, got {args.ns!r}")
    q = args.quick
    s = dict(
        ns=ns,
        completions=args.completions or (32 if q else 2048),
        curve_prompts=args.curve_prompts or (8 if q else 128),
        difficulty_samples=args.difficulty_samples or (4 if q else 16),
        difficulty_prompts=args.difficulty_prompts or (32 if q else None),
        easy_min=args.easy_min,
        hard_max=args.hard_max,
    )
    if len(ns) < 2 or ns[0] < 2 or s["completions"] < 1:
        p.error("--ns: two or more values >= 2 (GRPO needs a group); --completions >= 1")
    ppb = args.prompts_per_step
    if ppb is None:
        from rlvr_jax.config import load

        ppb = load(args.config, list(args.overrides)).train.prompts_per_batch
    steps = {n: math.ceil(s["completions"] / (ppb * n)) for n in ns}
    every = {n: steps[ns[-1]] if n != ns[-1] else max(1, steps[n] // 4) for n in ns}
    s.update(prompts_per_step=ppb, steps=steps, eval_every=every)

    data = (Path(args.out) / "data").absolute()

    def arm(split: str, n: int) -> Arm:
        overrides = (
            f"rollout.num_samples={n}",
            f"train.prompts_per_batch={ppb}",
            f"data.sources=[{{path: {quoted(data / f'{split}.jsonl')}}}]",
            f"eval.every_steps={every[n]}",
            "eval.num_samples=8",
            "eval.ks=[1, 8]",
            f"eval.max_prompts={s['curve_prompts']}",
        )
        return Arm(
            f"{split} n={n}",
            (Phase("rl", steps[n], "", overrides),),
            dir=f"{split}_n{n}",
            prepare=split_rows,
        )

    def finish(ctx: harness.Context, results: dict[str, Any]) -> None:
        from rlvr_jax.eval.passk import mean_pass_at_k

        head = results["base"]["counts"][: s["curve_prompts"]]
        s["base_curve"] = {f"pass@{k}": mean_pass_at_k(head, 32, k) for k in CURVE_KS}
        results["extra_markdown"] = matched(results)

    big, small = ns[-1], ns[0]
    exp = harness.Experiment(
        name="rollouts_per_prompt",
        title=f"GRPO with n = {', '.join(map(str, ns))} samples per prompt at {s['completions']} "
        f"completions per arm, easy and hard splits",
        arms=tuple(arm(split, n) for split in SPLITS for n in ns),
        defaults=("rollout.mode=sync", "filter.active_sampling=false"),
        compare=tuple((f"{x} n={big}", f"{x} n={small}") for x in SPLITS),
        finish=finish,
        plot=plot,
    )
    harness.run_main(p, args, exp, argv, s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
