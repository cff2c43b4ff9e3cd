"""Console entry points. Thin: parse arguments, call into the library, map errors to exit codes."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path

EXIT_USAGE = 2
VERBOSE_FLAG = "--verbose"
"""Every command takes it: the libraries' INFO logs (absl, orbax, JAX, JetStream) too."""


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def _pop_verbose(argv: list[str]) -> tuple[list[str], bool]:
    """`argv` without `--verbose`, and whether it was there (before a `--` separator)."""
    head = argv[: argv.index("--")] if "--" in argv else argv
    if VERBOSE_FLAG not in head:
        return argv, False
    i = argv.index(VERBOSE_FLAG)
    return argv[:i] + argv[i + 1 :], True


def _setup_logging(log_level: str = "warning", verbose: bool = False) -> None:
    from rlvr_jax.logs import setup_logging

    setup_logging(log_level, verbose=verbose)


def _config_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument(VERBOSE_FLAG, action="store_true", help="also show the libraries' INFO logs")
    p.add_argument("--config", help="YAML config file (see configs/)")
    p.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="dotted overrides, values as YAML"
    )
    return p


def _load_config(args: argparse.Namespace):
    from rlvr_jax.config import load

    return load(args.config, list(args.overrides))


def train_main(argv: list[str] | None = None) -> int:
    """`rlvr-train --config FILE [key=value ...] [--dry-run] [--describe]`."""
    p = _config_parser("rlvr-train", "Train a policy with RL from verifiable rewards.")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved config and the parameter/memory plan, then exit",
    )
    p.add_argument(
        "--describe",
        action="store_true",
        help="list every config key (a source's keys too) with its type, default and doc",
    )
    args = p.parse_args(argv)
    from rlvr_jax.config import ConfigError, check_context, describe, dump

    if args.describe:
        for key, tp, default, doc in describe():
            print(f"{key:36s} {tp:28s} {default:14s} {doc}")
        return 0
    try:
        cfg = _load_config(args)
        check_context(cfg, source=args.config or "<defaults>")
    except ConfigError as e:
        return _fail(str(e))
    _setup_logging(cfg.log.log_level, args.verbose)
    if args.dry_run:
        print("# resolved config")
        print(dump(cfg), end="")
        from rlvr_jax.plan import PlanError, format_plan, make_plan

        try:
            plan = make_plan(cfg)
        except PlanError as e:
            return _fail(str(e))
        print(format_plan(plan))
        return 0
    from rlvr_jax.config import check_runtime

    try:
        check_runtime(cfg, source=args.config or "<defaults>")
    except ConfigError as e:
        return _fail(str(e))
    try:
        return _run_library("rlvr_jax.training.run", "main", cfg, what="rlvr-train")
    except (OSError, ValueError) as e:  # bad paths, data, settings: a named error, exit 2
        logging.getLogger("rlvr_jax").debug("rlvr-train failed", exc_info=True)
        return _fail(str(e))


def _run_library(module: str, fn: str, *args, what: str) -> int:
    """Calls `module:fn(*args)`; a module that does not exist yet is reported, not faked."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and module.startswith(e.name):
            print(
                f"{what}: not yet available in this version (module {module} is not built yet)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        raise
    return int(getattr(mod, fn)(*args) or 0)


def bench_main(argv: list[str] | None = None) -> int:
    """`rlvr-bench SUBCOMMAND [options]` (`rlvr_jax.bench.table`; `all`: every one of them); each
    subcommand has `--json FILE`. SIGTERM/SIGINT stop it within 10 s (exit 128 + signal
    number)."""
    from rlvr_jax.bench.table import SUBCOMMANDS

    commands = {**SUBCOMMANDS, "all": "Every benchmark, one JSON and one table."}
    argv_given = argv is not None
    argv, verbose = _pop_verbose(list(sys.argv[1:] if argv is None else argv))
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: rlvr-bench SUBCOMMAND [--json FILE] [options]\n\nsubcommands:")
        for name, doc in commands.items():
            print(f"  {name:10s} {doc}")
        return 0 if argv else EXIT_USAGE
    name, rest = argv[0], argv[1:]
    if name not in commands:
        return _fail(f"unknown benchmark {name!r}; choose from {', '.join(commands)}")
    _setup_logging(verbose=verbose)
    from rlvr_jax.bench import progress, table
    from rlvr_jax.shutdown import Interrupted, SignalStop

    progress.begin(f"rlvr-bench {name}")
    signals = SignalStop(f"rlvr-bench {name}", raise_in_main=True).install()
    try:
        if name == "all":
            return table.main_all(rest)
        table.run(name, rest)
        return 0
    except (OSError, ValueError) as e:  # a bad file, batch, config or setting: exit 2
        logging.getLogger("rlvr_jax").debug("rlvr-bench failed", exc_info=True)
        return _fail(f"rlvr-bench {name}: {e}")
    except Interrupted as e:
        print(f"rlvr-bench {name}: interrupted by {e}", file=sys.stderr)
        if argv_given:
            return 128 + e.signum
        from rlvr_jax.shutdown import exit_now

        exit_now(128 + e.signum)  # the console script: no slow interpreter teardown
    finally:
        signals.uninstall()


def _simple(module: str, what: str) -> Callable[[list[str] | None], int]:
    def main(argv: list[str] | None = None) -> int:
        argv, verbose = _pop_verbose(list(sys.argv[1:] if argv is None else argv))
        _setup_logging(verbose=verbose)
        return _run_library(module, "main", argv, what=what)

    main.__doc__ = f"`{what}`: see `{what} --help`."
    return main


eval_main = _simple("rlvr_jax.eval.cli", "rlvr-eval")
filter_main = _simple("rlvr_jax.eval.filter_cli", "rlvr-filter")
prefs_main = _simple("rlvr_jax.eval.prefs_cli", "rlvr-prefs")


def export_main(argv: list[str] | None = None) -> int:
    """`rlvr-export CHECKPOINT OUT [--config FILE]`: a training checkpoint's HF export."""
    argv, verbose = _pop_verbose(list(sys.argv[1:] if argv is None else argv))
    p = argparse.ArgumentParser(
        prog="rlvr-export",
        description="Write the HF export of a training checkpoint (<output_dir>/checkpoints/"
        "<step>): the policy's params, LoRA adapters merged, with the run's tokenizer files; "
        "rlvr-eval, rlvr-serve and transformers then load OUT as they load a run's final/.",
    )
    p.add_argument("checkpoint", help="<train.output_dir>/checkpoints/<step>")
    p.add_argument("out", help="directory to write (new or empty)")
    p.add_argument(
        "--config",
        help="the config the run was trained with (default: <train.output_dir>/run_config.yaml, "
        "which rlvr-train writes)",
    )
    args = p.parse_args(argv)
    _setup_logging(verbose=verbose)
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return _fail(f"{out} exists and is not an empty directory: give a new OUT")
    from rlvr_jax.training.export import checkpoint_config, export_checkpoint

    try:
        cfg = checkpoint_config(args.checkpoint, args.config)
        export_checkpoint(args.checkpoint, out, cfg)
    except (OSError, ValueError) as e:
        return _fail(str(e))
    print(f"rlvr-export: wrote the HF export of {args.checkpoint} to {out}")
    return 0


def serve_main(argv: list[str] | None = None) -> int:
    """`rlvr-serve`: see `rlvr-serve --help` (it takes `--verbose` itself). Started as the
    console script (`argv` None), the process ends as soon as the servers have stopped."""
    args = list(sys.argv[1:] if argv is None else argv)
    rc = _run_library("rlvr_jax.serve.cli", "main", args, what="rlvr-serve")
    if argv is None:
        from rlvr_jax.shutdown import exit_now

        exit_now(rc)
    return rc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(train_main())
