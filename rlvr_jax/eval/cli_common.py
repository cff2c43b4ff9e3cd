"""What `rlvr-eval`, `rlvr-filter` and `rlvr-prefs` share: the config arguments, one run
(parse, check, resolve the config, compute, show; exit status 2 on bad arguments, config or
input, the message naming it) and writing a JSON report."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr_jax.eval.difficulty import OUTPUT_SUFFIXES
from rlvr_jax.eval.evaluate import DEFAULT_CHUNK_PROMPTS, resolve_config
from rlvr_jax.training.export import policy_directory

EXIT_USAGE = 2
"""Exit status on bad arguments, config or input."""


def add_config_args(p: argparse.ArgumentParser, config_help: str, *, model: bool = True) -> None:
    """`--config FILE`, the positional dotted overrides and (with `model`) `--model PATH`."""
    p.add_argument("--config", help=config_help)
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="dotted config overrides")
    if model:
        p.add_argument(
            "--model",
            help="the policy: an HF directory, or a training checkpoint "
            "(<output_dir>/checkpoints/<step>; its run's config when --config is absent); "
            "replaces model.path",
        )


def add_chunk_prompts_arg(p: argparse.ArgumentParser) -> None:
    """`--chunk-prompts N` (default `eval.evaluate.DEFAULT_CHUNK_PROMPTS`)."""
    p.add_argument(
        "--chunk-prompts",
        type=int,
        default=DEFAULT_CHUNK_PROMPTS,
        help="prompts generated per chunk (the next generates while one is verified)",
    )


def sampling_problem(args: argparse.Namespace) -> str | None:
    """What `rlvr-filter` and `rlvr-prefs` check alike: `--samples`, `--seed`, `--output`'s
    suffix and that it is not the `--input` file; None when all is well."""
    if args.samples < 1:
        return f"--samples must be >= 1, got {args.samples}"
    if args.seed is not None and args.seed < 0:
        return f"--seed must be >= 0, got {args.seed}"
    if not args.output.lower().endswith(OUTPUT_SUFFIXES):
        return f"--output {args.output!r} must end in one of {OUTPUT_SUFFIXES}"
    if Path(args.input).resolve() == Path(args.output).resolve():
        return "--output must not be the --input file"
    return None


def sampling_kwargs(cfg: Any, args: argparse.Namespace) -> dict[str, int]:
    """`num_samples` (`--samples`) and `seed` (`--seed`, default the config's seed)."""
    return {"num_samples": args.samples, "seed": cfg.seed if args.seed is None else args.seed}


def write_json(path: str, obj: Any, label: str) -> None:
    """Writes `obj` as indented JSON to `path` (parents created), prints `label: path`."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(obj, indent=2) + "\n")
    print(f"{label}: {out}")


def overrides_last(argv: list[str]) -> list[str]:
    """`argv` with the config overrides (`section.key=value`, or a top-level scalar such as
    `seed=3`) moved behind a `--`: a list option (`--ks 1 4`) followed by an override would
    read it as one of its values."""
    import dataclasses

    from rlvr_jax.config.schema import Config

    if "--" in argv:
        return argv
    top = {f.name: f for f in dataclasses.fields(Config)}

    def is_override(arg: str) -> bool:
        key, eq, _ = arg.partition("=")
        head, dot, _ = key.partition(".")
        if not eq or arg.startswith("-") or head not in top:
            return False  # a section is set key by key (`eval.ks=...`), a scalar whole
        return bool(dot) != (top[head].default_factory is dataclasses.MISSING)

    overrides = [a for a in argv if is_override(a)]
    if not overrides:
        return argv
    return [a for a in argv if not is_override(a)] + ["--", *overrides]


def run_cli(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    problem: Callable[[argparse.Namespace], str | None],
    compute: Callable[[Any, argparse.Namespace], Any],
    show: Callable[[argparse.Namespace, Any], None],
    *,
    model_dest: str = "model",
    quiet_absl: bool = False,
) -> int:
    """Runs the command `parser.prog`: parses `argv`; `problem(args)` (a message: usage error)
    checks it; `compute(cfg, args)` runs on the config of `--config`, the overrides and the path
    in `args.<model_dest>` (an HF directory, or a training checkpoint: exported first, its run's
    config used when `--config` is not given: `training.export.policy_directory`), and
    `show(args, result)` prints. Returns the exit status (0 ok, 2 bad arguments/config/input)."""
    prog = parser.prog
    try:
        args = parser.parse_args(overrides_last(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # --help (0) or an argparse error (2), already printed
        return int(e.code or 0)
    message = problem(args)
    if message is not None:
        parser.print_usage(sys.stderr)
        print(f"{prog}: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if quiet_absl:
        logging.getLogger("absl").setLevel(logging.WARNING)
    try:
        with policy_directory(getattr(args, model_dest), args.config, args.overrides) as found:
            model, config = found
            cfg = resolve_config(config, args.overrides, model)
            result = compute(cfg, args)
    except (ValueError, FileNotFoundError) as e:  # config, data and model errors name the culprit
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    show(args, result)
    return 0
