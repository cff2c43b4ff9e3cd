"""RL from a DPO'd demo base vs RL from the base itself, with the same RL budget (OLMo 3 Think's
SFT → DPO → RLVR pipeline on the embedded demo, every stage on our own parts).

    python scripts/experiment_dpo_then_rl.py --config configs/demo.yaml --out runs/dpo_rl
    python scripts/experiment_dpo_then_rl.py --config configs/demo.yaml --quick --out /tmp/dpo_rl

Stages, each a `rlvr_jax.training.run.train` run (what `rlvr-train` runs) or library call:

1. strong model: `--sft-steps` SFT updates of the base on the synthetic tasks' reference
   solutions (`sft.synthetic_reference: true`, `sft.batch_size` = `train.prompts_per_batch`);
   the weak model is the base itself (delta learning: chosen from the stronger, rejected from
   the weaker);
2. pairs: `rlvr_jax.eval.preference_pairs.build_pairs` (what `rlvr-prefs` runs) on the first
   `--prompts` training prompts, `--samples` samples per prompt and model: chosen = a verified
   strong sample, rejected = a weak sample the verifier rejects;
3. DPO: `--dpo-steps` updates of `algorithm: dpo` from the base on those pairs
   (`dpo.batch_size` = `--dpo-batch`, `dpo.variant`, `dpo.beta`, reference log-probs cached);
4. RL: the config's RL (`algorithm: rl`, e.g. the demo's async olmo3) for `--rl-steps`
   updates, once from the DPO'd model and once from the base (same seed, same budget).

Every policy (base, strong, DPO'd, both RL results) is evaluated on the held-out split with the
same sampling seed: n = 8 samples per prompt at `eval.temperature`, pass@1 and pass@8, overall
and per domain. `<out>/results.json` and `<out>/results.md` hold the table, the budgets, the
times and the machine's load average (`os.getloadavg`) before and after. Trailing `key=value`
overrides apply to every run. `--quick` shrinks everything for a smoke test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiment_rl_vs_sft as rl_vs_sft  # the sibling script: shared stages

log = logging.getLogger("experiment_dpo_then_rl")

DEFAULTS = dict(sft_steps=30, prompts=1024, samples=4, dpo_steps=40, dpo_batch=16, rl_steps=30)
QUICK = dict(sft_steps=2, prompts=16, samples=2, dpo_steps=2, dpo_batch=2, rl_steps=2)
QUICK_EVAL_PROMPTS = 8


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def dpo_overrides(pairs: Path, *, batch: int, variant: str, beta: float, lr: float | None) -> list:
    out = [
        f"dpo.sources=[{{path: {rl_vs_sft.quoted(pairs)}}}]",
        f"dpo.batch_size={batch}",
        f"dpo.variant={variant}",
        f"dpo.beta={beta}",
    ]
    return [*out, *([f"train.learning_rate={lr}"] if lr is not None else [])]


def markdown(results: dict[str, Any]) -> str:
    """The results table (one row per policy, then per-domain pass@k)."""
    ev = results["eval"]
    base = ev["base"]
    s = results["settings"]
    lines = [
        f"# RL from a DPO'd base vs RL from the base ({results['config']})",
        "",
        f"strong = base + {s['sft_steps']} SFT steps; pairs from {s['prompts']} prompts × "
        f"{s['samples']} samples per model: {results['pairs']['pairs']} pairs; DPO "
        f"{s['dpo_steps']} steps × {s['dpo_batch']} pairs ({s['dpo_variant']}, β = "
        f"{s['dpo_beta']}); RL {s['rl_steps']} steps from each start.",
        f"Held-out: {base['prompts']} prompts × n = 8 at T = {results['eval_temperature']}; "
        f"load average {results['load_before']} before, {results.get('load_after', '—')} "
        f"after; {results.get('wall_s', 0.0):.0f} s in all.",
        "",
        "| policy | pass@1 | pass@8 | Δ pass@1 vs base | Δ pass@8 vs base | train s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in ev.items():
        lines.append(
            f"| {name} | {r['pass@1']:.3f} | {r['pass@8']:.3f} | "
            f"{r['pass@1'] - base['pass@1']:+.3f} | {r['pass@8'] - base['pass@8']:+.3f} | "
            f"{results['train_s'].get(name, 0.0):.0f} |"
        )
    domains = sorted(base["per_domain"])
    lines += ["", "| policy | " + " | ".join(f"{d} pass@1 | {d} pass@8" for d in domains) + " |"]
    lines.append("|---|" + "---:|---:|" * len(domains))
    for name, r in ev.items():
        cells = " | ".join(
            f"{r['per_domain'][d]['pass@1']:.3f} | {r['per_domain'][d]['pass@8']:.3f}"
            for d in domains
        )
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines) + "\n"


def write(out: Path, results: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if "base" in results["eval"] and "pairs" in results:
        (out / "results.md").write_text(markdown(results))


def run_experiment(
    config: str,
    user: Sequence[str],
    *,
    out: Path,
    settings: dict[str, Any],
    quick: bool,
) -> dict[str, Any]:
    from rlvr_jax.eval.preference_pairs import build_pairs
    from rlvr_jax.models.bootstrap import ensure_model
    from rlvr_jax.rewards import RewardService

    t_start = time.perf_counter()
    user = [*user, *([f"eval.max_prompts={QUICK_EVAL_PROMPTS}"] if quick else [])]
    cfg = rl_vs_sft.load_config(config, rl_vs_sft.base_overrides(user, None))
    common = rl_vs_sft.base_overrides(user, cfg.train.prompts_per_batch)
    cfg = rl_vs_sft.load_config(config, common)
    if not cfg.data.sources or not cfg.data.eval_sources:
        raise ValueError(f"{config}: set data.sources and data.eval_sources (the held-out split)")
    base = ensure_model(cfg).absolute()
    results: dict[str, Any] = {
        "config": config,
        "overrides": list(user),
        "settings": settings,
        "base_model": str(base),
        "eval_temperature": cfg.eval.temperature,
        "load_before": load_average(),
        "eval": {},
        "train_s": {},
        "budget": {},
    }

    def train(name: str, phase: rl_vs_sft.Phase, model: Path, extra: Sequence[str] = ()) -> Path:
        t0 = time.perf_counter()
        run_out = out / phase.subdir
        final = rl_vs_sft.run_phase(config, [*common, *extra], phase, model, run_out)
        results["train_s"][name] = time.perf_counter() - t0
        results["budget"][name] = rl_vs_sft.phase_budget(phase, cfg, run_out)
        return final.absolute()

    with RewardService(cfg.rewards) as service:

        def evaluate(name: str, model: Path) -> None:
            results["eval"][name] = rl_vs_sft.evaluate(config, common, model, service)
            write(out, results)

        evaluate("base", base)
        strong = train("strong (SFT)", rl_vs_sft.Phase("sft", settings["sft_steps"], "sft"), base)
        evaluate("strong (SFT)", strong)
        pairs_path = out / "pairs.jsonl"
        t0 = time.perf_counter()
        report = build_pairs(
            cfg,
            cfg.data.sources[0].path,
            str(pairs_path),
            strong=str(strong),
            weak=str(base),
            num_samples=settings["samples"],
            seed=cfg.seed,
            max_prompts=settings["prompts"],
        )
        results["pairs"] = report.to_json()
        results["train_s"]["pairs"] = time.perf_counter() - t0
        if report.pairs < settings["dpo_batch"]:
            raise RuntimeError(
                f"only {report.pairs} pairs (fewer than a DPO batch of {settings['dpo_batch']})"
            )
        extra = dpo_overrides(
            pairs_path,
            batch=settings["dpo_batch"],
            variant=settings["dpo_variant"],
            beta=settings["dpo_beta"],
            lr=settings["dpo_lr"],
        )
        dpo = train("DPO", rl_vs_sft.Phase("dpo", settings["dpo_steps"], "dpo"), base, extra)
        evaluate("DPO", dpo)
        for name, start, subdir in (
            ("base → RL", base, "rl_from_base"),
            ("DPO → RL", dpo, "rl_from_dpo"),
        ):
            final = train(name, rl_vs_sft.Phase("rl", settings["rl_steps"], subdir), start)
            evaluate(name, final)
    results["load_after"] = load_average()
    results["wall_s"] = time.perf_counter() - t_start
    write(out, results)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", default="configs/demo.yaml", help="the demo config")
    p.add_argument("--out", default="runs/dpo_then_rl", help="output directory")
    p.add_argument("--quick", action="store_true", help="tiny budget (smoke test)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run in --out")
    for key, value in DEFAULTS.items():
        flag = "--" + key.replace("_", "-")
        p.add_argument(flag, type=int, default=None, help=f"default {value} ({QUICK[key]} quick)")
    p.add_argument("--dpo-variant", default="dpo", help="dpo.variant (default dpo)")
    p.add_argument("--dpo-beta", type=float, default=0.1, help="dpo.beta (default 0.1)")
    p.add_argument(
        "--dpo-lr", type=float, default=None, help="DPO learning rate (default: the config's)"
    )
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    args = p.parse_args(argv)
    settings: dict[str, Any] = {}
    for key in DEFAULTS:
        given = getattr(args, key)
        settings[key] = given if given is not None else (QUICK if args.quick else DEFAULTS)[key]
        if settings[key] < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {settings[key]}")
    settings.update(dpo_variant=args.dpo_variant, dpo_beta=args.dpo_beta, dpo_lr=args.dpo_lr)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        if not args.overwrite:
            p.error(f"{out} is not empty: pass --overwrite to replace it")
        shutil.rmtree(out)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("absl").setLevel(logging.WARNING)
    results = run_experiment(
        args.config, args.overrides, out=out, settings=settings, quick=args.quick
    )
    sys.stdout.write(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
