"""`rlvr-filter`: offline difficulty filtering of a prompt file by the starting policy.

    rlvr-filter --config configs/demo.yaml --input data/demo/train.jsonl \\
        --output data/demo/train_filtered.jsonl --histogram hist.png --json stats.json

Prompts with a pass rate above `--max-pass-rate` over `--samples` samples are dropped, the rest
written to `--output` as they are in the input (`rlvr_jax.eval.difficulty`). Exit status 2 on
bad arguments, config or input.
"""

from __future__ import annotations

import argparse
from typing import Any

from rlvr_jax.eval.cli_common import EXIT_USAGE as EXIT_USAGE
from rlvr_jax.eval.cli_common import (
    add_chunk_prompts_arg,
    add_config_args,
    run_cli,
    sampling_kwargs,
    sampling_problem,
    write_json,
)
from rlvr_jax.eval.difficulty import (
    DEFAULT_MAX_PASS_RATE,
    DEFAULT_SAMPLES,
    filter_source,
    plot_histogram,
)

PROG = "rlvr-filter"
PLOT_SUFFIXES = (".png", ".pdf", ".svg")
"""Histogram formats (matplotlib goes by the extension)."""


def build_parser() -> argparse.ArgumentParser:
    """The command line of `rlvr-filter`."""
    p = argparse.ArgumentParser(
        prog=PROG, description="Drop prompts the starting policy already solves too often."
    )
    add_config_args(p, "YAML config file (model, template, rewards, rollout)")
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
    add_chunk_prompts_arg(p)
    return p


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments themselves, or None."""
    if args.config is None and args.model is None:
        return "give --config FILE (or at least --model PATH)"
    if not 0.0 <= args.max_pass_rate <= 1.0:
        return f"--max-pass-rate must be in [0, 1], got {args.max_pass_rate}"
    if args.chunk_prompts < 1:
        return f"--chunk-prompts must be >= 1, got {args.chunk_prompts}"
    if args.histogram and not args.histogram.lower().endswith(PLOT_SUFFIXES):
        return f"--histogram {args.histogram!r} must end in one of {PLOT_SUFFIXES}"
    return sampling_problem(args)


def _filter(cfg: Any, args: argparse.Namespace) -> Any:
    kwargs = {"max_pass_rate": args.max_pass_rate, "chunk_prompts": args.chunk_prompts}
    return filter_source(cfg, args.input, args.output, **kwargs, **sampling_kwargs(cfg, args))


def _show(args: argparse.Namespace, report: Any) -> None:
    print(report.summary())
    print(f"wrote {int(report.kept_P.sum())} rows to {args.output}")
    if args.histogram:
        print(f"histogram: {plot_histogram(report, args.histogram)}")
    if args.json:
        write_json(args.json, report.to_json(), "statistics")


def main(argv: list[str] | None = None) -> int:
    """Runs `rlvr-filter`; returns the exit status (0 ok, 2 bad arguments/config/input)."""
    return run_cli(build_parser(), argv, _argument_problem, _filter, _show)
