"""Pretrains the demo's tiny base model, evaluates it on the held-out split, writes RECIPE.md.

    python scripts/pretrain_tiny.py --out runs/demo_base
    python scripts/pretrain_tiny.py --out rlvr_jax/demo/assets/base     # the shipped copy
    python scripts/pretrain_tiny.py --out /tmp/b --set steps=20 --set styles.worked=0.5

The recipe is `rlvr_jax.demo.base_model.DEMO_RECIPE` with the `--set key=value` overrides
(values parsed as YAML; `styles.<name>` sets a style weight). After pretraining, the model is
evaluated as the demo's `eval` does it — `rlvr_jax.rollout.generate` with n samples per held-out
prompt at temperature 1, top-p 1, scored by the verifiers — and `RECIPE.md` records the command,
seed, recipe, timings and pass@k beside the weights.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import shlex
import sys
import time
from pathlib import Path

import yaml

from rlvr_jax.demo import base_model

DEFAULT_EVAL_DATA = "data/demo/test.jsonl"


def recipe_with_overrides(overrides: list[str]) -> base_model.PretrainRecipe:
    """`DEMO_RECIPE` with `key=value` overrides (YAML values; `styles.<field>` for styles)."""
    values = base_model.DEMO_RECIPE.to_json()
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        head, _, sub = key.partition(".")
        if head not in values or (sub and not isinstance(values[head], dict)):
            raise SystemExit(f"--set: unknown recipe key {key!r}; known: {sorted(values)}")
        if sub and sub not in values[head]:
            raise SystemExit(f"--set: unknown key {key!r}; known: {sorted(values[head])}")
        target = values[head] if sub else values
        target[sub or head] = yaml.safe_load(raw)
    try:
        return base_model.PretrainRecipe.from_json(values)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"--set: {e}") from None


def evaluate(out: Path, recipe: base_model.PretrainRecipe, args: argparse.Namespace) -> dict:
    """pass@k of the model in `out` on the first `--eval-prompts` rows of `--eval-data`, with
    the demo's evaluation (`rlvr_jax.eval.evaluate.evaluate_policy`)."""
    from rlvr_jax import config, models
    from rlvr_jax.data import load_tokenizer
    from rlvr_jax.eval.evaluate import evaluate_policy
    from rlvr_jax.rewards import RewardService

    cfg = config.Config(
        model=config.schema.ModelConfig(path=str(out)),
        data=config.schema.DataConfig(
            eval_sources=[config.schema.SourceConfig(path=args.eval_data)],
            prompt_template=recipe.template,
            max_prompt_len=recipe.seq_len,
        ),
        rollout=config.schema.RolloutConfig(max_new_tokens=args.max_new_tokens, max_slots=64),
        eval=config.schema.EvalConfig(
            num_samples=args.eval_samples,
            ks=[1, args.eval_samples],
            max_prompts=args.eval_prompts,
            temperature=1.0,
        ),
    )
    model = models.load_pretrained(out)
    tokenizer = load_tokenizer(out)
    with RewardService(workers=2) as service:
        return evaluate_policy(
            model, tokenizer, cfg, reward_service=service, prefix="", seed=args.eval_seed
        )


def write_recipe_md(out: Path, report: dict, evaluation: dict | None, command: str) -> Path:
    """RECIPE.md: how the model in `out` was made, and what it measured."""
    recipe = report["recipe"]
    lines = [
        "# The demo's tiny base model",
        "",
        "Made by the project's own script, from nothing downloaded:",
        "",
        "```",
        command,
        "```",
        "",
        f"- seed: {recipe['seed']}",
        f"- parameters: {report['n_params']:,} ({report['hf_config']['model_type']}, "
        f"d_model {recipe['d_model']}, {recipe['n_layers']} layers, vocab {recipe['vocab_size']})",
        f"- pretraining: {recipe['steps']} steps, {report['tokens_trained']:,} tokens trained on, "
        f"{report['wall_s']:.0f} s wall ({report['cpu_s']:.0f} s CPU) on {report['machine']}",
        f"- final training loss {report['final_loss']:.3f}, "
        f"token accuracy {report['final_token_accuracy']:.3f}",
        f"- corpus styles: {json.dumps(recipe['styles'])}",
        "",
        "The full recipe and the measurements are in `pretrain.json`; bit-exactness across CPUs "
        "is not expected.",
    ]
    if evaluation is not None:
        n = evaluation["n"]
        lines += [
            "",
            f"## Held-out pass@k ({evaluation['n']} samples per prompt, temperature 1, top-p 1, "
            f"{int(evaluation['prompts'])} prompts of `{evaluation['data']}`)",
            "",
            f"| domain | pass@1 | pass@{n} |",
            "|---|---|---|",
        ]
        for name in ("all", *evaluation["domains"]):
            p = "" if name == "all" else f"{name}/"
            lines.append(
                f"| {name} | {evaluation[p + 'pass@1']:.3f} | {evaluation[p + f'pass@{n}']:.3f} |"
            )
    path = out / "RECIPE.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", required=True, help="output directory (an HF model directory)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="recipe override, e.g. steps=300 or styles.worked=0.4",
    )
    parser.add_argument("--eval-data", default=DEFAULT_EVAL_DATA, help="held-out JSONL")
    parser.add_argument("--eval-prompts", type=int, default=256, help="0 skips evaluation")
    parser.add_argument("--eval-samples", type=int, default=8, help="n samples per prompt")
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    recipe = recipe_with_overrides(args.set)
    out = Path(args.out)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    report = base_model.pretrain(recipe, out)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    report["cpu_s"] = round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1)
    report["machine"] = (
        f"{platform.machine()} x {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    evaluation = None
    if args.eval_prompts > 0:
        t0 = time.perf_counter()
        result = evaluate(out, recipe, args)
        domains = sorted({k.split("/")[0] for k in result if k.count("/") == 1})
        evaluation = {
            **result,
            "n": args.eval_samples,
            "data": args.eval_data,
            "domains": domains,
            "wall_s": round(time.perf_counter() - t0, 1),
        }
        report["evaluation"] = evaluation
    command = " ".join(
        shlex.quote(a) for a in ["python", "scripts/pretrain_tiny.py", *(argv or sys.argv[1:])]
    )
    report["command"] = command
    (out / base_model.RECIPE_FILE).write_text(json.dumps(report, indent=2) + "\n")
    write_recipe_md(out, report, evaluation, command)
    print(json.dumps({k: report[k] for k in ("wall_s", "cpu_s", "n_params", "final_loss")}))
    if evaluation is not None:
        print(json.dumps({k: v for k, v in evaluation.items() if "pass@" in k}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
