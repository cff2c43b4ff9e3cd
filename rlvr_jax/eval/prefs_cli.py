"""`rlvr-prefs`: delta-learning preference pairs from a strong and a weak local model.

    rlvr-prefs --config configs/demo.yaml --strong runs/sft/final --weak runs/cache/demo_base \\
        --input data/demo/train.jsonl --output runs/pairs.jsonl --samples 4 --json stats.json

Chosen: a verified-correct sample of `--strong`; rejected: a sample of `--weak`
(`rlvr_jax.eval.preference_pairs`). The pairs are JSON lines `algorithm: dpo` reads
(`dpo.sources`). Exit status 2 on bad arguments, config, models or input.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rlvr_jax.eval.cli_common import EXIT_USAGE as EXIT_USAGE
from rlvr_jax.eval.cli_common import (
    add_config_args,
    run_cli,
    sampling_kwargs,
    sampling_problem,
    write_json,
)
from rlvr_jax.eval.preference_pairs import REJECTED_MODES, build_pairs

PROG = "rlvr-prefs"


def build_parser() -> argparse.ArgumentParser:
    """The command line of `rlvr-prefs`."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Build DPO pairs: verified responses of a strong model (chosen) against a "
        "weak model's (rejected).",
    )
    add_config_args(p, "YAML config file (template, rollout, rewards, mesh)", model=False)
    p.add_argument("--strong", required=True, help="the strong model's checkpoint directory")
    p.add_argument("--weak", required=True, help="the weak model's checkpoint directory")
    p.add_argument("--input", required=True, help="prompt file (.jsonl, .jsonl.gz or .parquet)")
    p.add_argument("--output", required=True, help="where the pairs go (.jsonl)")
    p.add_argument("--samples", type=int, default=4, help="samples per prompt and model")
    p.add_argument(
        "--rejected",
        choices=REJECTED_MODES,
        default="incorrect",
        help="rejected: a weak sample the verifier rejects (default) or its first sample",
    )
    p.add_argument("--max-prompts", type=int, help="use the first N usable prompts only")
    p.add_argument("--seed", type=int, help="sampling seed (default: the config's seed)")
    p.add_argument("--json", help="statistics as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments themselves, or None."""
    if args.max_prompts is not None and args.max_prompts < 1:
        return f"--max-prompts must be >= 1, got {args.max_prompts}"
    problem = sampling_problem(args)
    if problem is not None:
        return problem
    for flag in ("strong", "weak"):
        path = Path(getattr(args, flag))
        if not (path / "config.json").is_file():
            return f"--{flag} {str(path)!r} is not a model directory (no config.json)"
    if not Path(args.input).is_file():
        return f"--input {args.input!r}: file not found"
    return None


def _build_pairs(cfg: Any, args: argparse.Namespace) -> Any:
    return build_pairs(
        cfg,
        args.input,
        args.output,
        strong=args.strong,
        weak=args.weak,
        rejected=args.rejected,
        max_prompts=args.max_prompts,
        progress=not args.no_progress,
        **sampling_kwargs(cfg, args),
    )


def _show(args: argparse.Namespace, report: Any) -> None:
    print(report.summary())
    if args.json:
        write_json(args.json, report.to_json(), "statistics")


def main(argv: list[str] | None = None) -> int:
    """Runs `rlvr-prefs`; returns the exit status (0 ok, 2 bad arguments/config/input)."""
    parser, problem = build_parser(), _argument_problem
    return run_cli(parser, argv, problem, _build_pairs, _show, model_dest="strong", quiet_absl=True)
