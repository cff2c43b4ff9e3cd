"""`rlvr-filter`: offline difficulty filtering of a prompt file by the starting policy.

    rlvr-filter --config configs/demo.yaml --input data/demo/train.jsonl \\
        --output data/demo/train_filtered.jsonl --histogram hist.png --json stats.json

Each prompt is sampled `--samples` times (8) at temperature 1, top-p 1; prompts with a pass
rate above `--max-pass-rate` (0.625) are dropped and the others written to `--output` exactly
as they are in the input. The model, tokenizer, prompt template, `rollout.max_new_tokens`,
decode slots, `data.max_prompt_len` and verifier settings come from the config; `--model
PATH` replaces `model.path`. Exit status 2 on bad arguments, config or input (the message
names it). The logic lives in `rlvr_jax.eval.difficulty`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from rlvr_jax.eval.difficulty import DEFAULT_MAX_PASS_RATE, DEFAULT_SAMPLES, OUTPUT_SUFFIXES
from rlvr_jax.eval.evaluate import DEFAULT_CHUNK_PROMPTS

PROG = "rlvr-filter"
EXIT_USAGE = 2
PLOT_SUFFIXES = (".png", ".pdf", ".svg")
"""Histogram formats (matplotlib goes by the extension)."""


def build_parser() -> argparse.ArgumentParser:
    """The command line of `rlvr-filter`."""
    p = argparse.ArgumentParser(
        prog=PROG, description="Drop prompts the starting policy already solves too often."
    )
    p.add_argument("--config", help="YAML config file (model, template, rewards, rollout)")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="dotted config overrides")
    p.add_argument("--model", help="policy checkpoint directory (replaces model.path)")
    p.add_argument("--input", required=True, help="prompt file (.jsonl, .jsonl.gz or .parquet)")
    p.add_argument("--output", required=True, help="where the kept rows go (.jsonl)")
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="samples per prompt")
    p.add_argument(
        "--max-pass-rate",
        type=float,
        default=DEFAULT_MAX_PASS_RATE,
        help="drop prompts whose pass rate is above this",
    )
    p.add_argument("--histogram", help="pass-rate histogram image (.png, .pdf or .svg)")
    p.add_argument("--json", help="statistics as JSON")
    p.add_argument("--seed", type=int, help="sampling seed (default: the config's seed)")
    p.add_argument(
        "--chunk-prompts",
        type=int,
        default=DEFAULT_CHUNK_PROMPTS,
        help="prompts generated per chunk (the next generates while one is verified)",
    )
    return p


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments themselves, or None."""
    if args.config is None and args.model is None:
        return "give --config FILE (or at least --model PATH)"
    if args.samples < 1:
        return f"--samples must be >= 1, got {args.samples}"
    if not 0.0 <= args.max_pass_rate <= 1.0:
        return f"--max-pass-rate must be in [0, 1], got {args.max_pass_rate}"
    if args.chunk_prompts < 1:
        return f"--chunk-prompts must be >= 1, got {args.chunk_prompts}"
    if args.seed is not None and args.seed < 0:
        return f"--seed must be >= 0, got {args.seed}"
    if not args.output.lower().endswith(OUTPUT_SUFFIXES):
        return f"--output {args.output!r} must end in one of {OUTPUT_SUFFIXES}"
    if args.histogram and not args.histogram.lower().endswith(PLOT_SUFFIXES):
        return f"--histogram {args.histogram!r} must end in one of {PLOT_SUFFIXES}"
    if Path(args.input).resolve() == Path(args.output).resolve():
        return "--output must not be the --input file"
    return None


def main(argv: list[str] | None = None) -> int:
    """Runs `rlvr-filter`; returns the exit status (0 ok, 2 bad arguments/config/input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or an argparse error (2), already printed
        return int(e.code or 0)
    problem = _argument_problem(args)
    if problem is not None:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    from rlvr_jax.eval.difficulty import filter_source, plot_histogram
    from rlvr_jax.eval.evaluate import resolve_config

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        cfg = resolve_config(args.config, args.overrides, args.model)
        report = filter_source(
            cfg,
            args.input,
            args.output,
            num_samples=args.samples,
            max_pass_rate=args.max_pass_rate,
            seed=cfg.seed if args.seed is None else args.seed,
            chunk_prompts=args.chunk_prompts,
        )
    except (ValueError, FileNotFoundError) as e:  # config, data and model errors name the culprit
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(report.summary())
    print(f"wrote {int(report.kept_P.sum())} rows to {args.output}")
    if args.histogram:
        print(f"histogram: {plot_histogram(report, args.histogram)}")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        print(f"statistics: {path}")
    return 0
