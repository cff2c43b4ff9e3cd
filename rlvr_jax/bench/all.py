"""`rlvr-bench all`: every benchmark subcommand in one run, one JSON, one summary table.

Each subcommand module that exists is run in this process through its own `main(argv)` with
`--json` pointed at a temporary file, so its figures are exactly what it would report alone;
a module not built yet is skipped with a note, and a failing one is recorded (its error in
the JSON) without stopping the others. The summary table lists each benchmark's headline
figures (ratios and fractions measured within the same run, which stay meaningful on a
shared machine) and its status.

    rlvr-bench all [--quick] [--json FILE] [--only a,b] [--skip a,b] [--plot-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlvr_jax.bench import common, progress


@dataclasses.dataclass(frozen=True)
class Subcommand:
    """How `all` runs one benchmark."""

    module: str
    """Module with `main(argv) -> int` (accepting `--json FILE`)."""
    argv: tuple[str, ...] = ()
    """Extra arguments of a full run."""
    quick_argv: tuple[str, ...] = ("--quick",)
    """Extra arguments of a `--quick` run (tiny sizes)."""
    headlines: tuple[str, ...] = ()
    """Slash paths (or path prefixes) of the figures the summary table shows."""
    plots: bool = False
    """Whether the subcommand takes `--plot FILE.png`."""


SUBCOMMANDS: dict[str, Subcommand] = {
    "roofline": Subcommand(
        "rlvr_jax.bench.roofline",
        headlines=("matmul_gflops", "memory_gbps"),
    ),
    "losses": Subcommand(
        "rlvr_jax.bench.losses",
        quick_argv=("--groups", "2", "--group-size", "4", "--max-len", "32"),
    ),
    "verifiers": Subcommand(
        "rlvr_jax.bench.verifiers",
        quick_argv=("--n", "40", "--code-n", "4"),
        headlines=("math/verifications_per_s", "code/programs_per_s"),
    ),
    "decode": Subcommand(
        "rlvr_jax.bench.decode",
        headlines=(
            "tokens_per_s",
            "roofline_fraction",
            "decode_step_memory_fraction",
            "ratios",
            "long_tail/waste",
        ),
        plots=True,
    ),
    "learner": Subcommand(
        "rlvr_jax.bench.learner",
        headlines=(
            "tokens_per_s",
            "achieved_flops_fraction",
            "logprob_forward/flops_fraction",
            "mfu/train_step",
        ),
        plots=True,
    ),
    "waste": Subcommand(
        "rlvr_jax.bench.waste",
        headlines=(
            "simulated/static_waste",
            "simulated/continuous_waste",
            "measured/static_waste",
            "measured/continuous_waste",
            "measured/continuous_over_static_wall",
        ),
        plots=True,
    ),
    "e2e": Subcommand(
        "rlvr_jax.bench.e2e",
        headlines=(
            "steps_per_s",
            "tokens_per_s",
            "async_over_sync",
            "overlap_fraction",
            "projected_speedup_disjoint",
        ),
        plots=True,
    ),
    "mismatch": Subcommand(
        "rlvr_jax.bench.mismatch",
        quick_argv=("--quick", "--no-tp"),
        headlines=("mismatch", "mismatch_default", "exact_over_default_tokens_per_s"),
    ),
}
"""Every `rlvr-bench` subcommand `all` knows, in the order it runs them."""


def headline_figures(result: dict[str, Any], paths: Sequence[str]) -> dict[str, Any]:
    """The leaves of `result` at each slash path in `paths`, or under it when it names a
    sub-tree; scalar numbers only (None kept: a figure the benchmark could not produce)."""
    flat = common.flatten(result)
    out: dict[str, Any] = {}
    for path in paths:
        for key, value in flat.items():
            if key == path or key.startswith(path + "/"):
                is_number = isinstance(value, int | float) and not isinstance(value, bool)
                if is_number or value is None:
                    out[key] = value
    return out


def run_one(
    name: str, sub: Subcommand, *, quick: bool, workdir: Path, plot_dir: Path | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Runs one subcommand; (status entry, its JSON result or None)."""
    if importlib.util.find_spec(sub.module) is None:
        return {"status": "skipped", "note": f"module {sub.module} is not built yet"}, None
    out = workdir / f"{name}.json"
    argv = [*(sub.quick_argv if quick else sub.argv), "--json", str(out)]
    if plot_dir is not None and sub.plots:
        argv += ["--plot", str(plot_dir / f"{name}.png")]
    print(f"\n== rlvr-bench {name} {' '.join(argv)}", flush=True)
    progress.begin(f"rlvr-bench {name}")
    start = time.perf_counter()
    try:
        code = importlib.import_module(sub.module).main(argv)
    except SystemExit as e:  # argparse rejected the arguments
        code = e.code if isinstance(e.code, int) else 2
    except Exception as e:
        seconds = time.perf_counter() - start
        traceback.print_exc()
        return {"status": "failed", "seconds": seconds, "note": f"{type(e).__name__}: {e}"}, None
    seconds = time.perf_counter() - start
    if code != 0:
        return {"status": "failed", "seconds": seconds, "note": f"exit code {code}"}, None
    if not out.exists():
        note = "finished without writing its --json file"
        return {"status": "failed", "seconds": seconds, "note": note}, None
    return {"status": "ok", "seconds": seconds}, json.loads(out.read_text())


def run(names: Sequence[str], *, quick: bool, plot_dir: Path | None = None) -> dict[str, Any]:
    """Runs the named subcommands in order; the combined nested JSON-able result."""
    unknown = sorted(set(names) - set(SUBCOMMANDS))
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; known: {list(SUBCOMMANDS)}")
    if plot_dir is not None:
        plot_dir.mkdir(parents=True, exist_ok=True)
    status, results, summary = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-all-") as tmp:
        for name in names:
            sub = SUBCOMMANDS[name]
            status[name], result = run_one(
                name, sub, quick=quick, workdir=Path(tmp), plot_dir=plot_dir
            )
            if result is not None:
                results[name] = result
                summary[name] = headline_figures(result, sub.headlines)
    return {
        "summary": summary,
        "status": status,
        "benchmarks": results,
        "machine": common.machine_info(),
        "config": {"quick": quick, "benchmarks": list(names)},
    }


def format_summary(result: dict[str, Any]) -> str:
    """One table: each benchmark's status and headline figures."""
    rows = []
    for name, entry in result["status"].items():
        seconds = entry.get("seconds")
        state = entry["status"] + (f" ({seconds:.0f} s)" if seconds is not None else "")
        figures = result["summary"].get(name, {})
        if entry["status"] != "ok" or not figures:
            rows.append([name, state, entry.get("note", ""), None])
            continue
        for i, (figure, value) in enumerate(figures.items()):
            rows.append([name if i == 0 else "", state if i == 0 else "", figure, value])
    load = result["machine"]["loadavg"][0]
    title = f"rlvr-bench all ({'quick' if result['config']['quick'] else 'full'}), load {load:.2f}"
    return title + "\n" + common.format_table(["benchmark", "status", "figure", "value"], rows)


def _names(text: str | None, flag: str, parser: argparse.ArgumentParser) -> list[str]:
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    unknown = sorted(set(names) - set(SUBCOMMANDS))
    if unknown:
        parser.error(f"{flag}: unknown benchmark(s) {unknown}; known: {', '.join(SUBCOMMANDS)}")
    return names


def main(argv: list[str]) -> int:
    """`rlvr-bench all [options]`; exit code 1 when any benchmark failed."""
    p = argparse.ArgumentParser(prog="rlvr-bench all", description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write every benchmark's results here as one JSON")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    p.add_argument("--only", help="comma-separated benchmarks to run (default: all)")
    p.add_argument("--skip", help="comma-separated benchmarks to leave out")
    p.add_argument("--plot-dir", help="write each benchmark's PNG plot into this directory")
    args = p.parse_args(argv)
    only, skip = _names(args.only, "--only", p), _names(args.skip, "--skip", p)
    names = [n for n in SUBCOMMANDS if (not only or n in only) and n not in skip]
    if not names:
        p.error("no benchmark left to run")
    plot_dir = Path(args.plot_dir) if args.plot_dir else None
    result = run(names, quick=args.quick, plot_dir=plot_dir)
    print("\n" + format_summary(result))
    if args.json:
        print(f"wrote {common.write_json(args.json, result)}", file=sys.stderr)
    failed = [n for n, s in result["status"].items() if s["status"] == "failed"]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
