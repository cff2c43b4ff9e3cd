"""`rlvr-bench`: every subcommand from one table.

`SUBCOMMANDS` names the subcommands in `rlvr-bench all`'s order; module `rlvr_jax.bench.<name>`
declares the rest in its `BENCH` (a `Bench`): its config dataclass, presets, run function,
headline figures and plot panels.

The flags are the config's fields: `--<field-name>` (a nested dataclass field `long`'s fields:
`--long-<name>`), help from the docstring under the field; `--no-<name>` for a bool that
defaults to true; a tuple of numbers is a comma-separated list, of strings a repeatable flag;
`common.option(default, flag, **argparse)` renames the flag (None: no flag) or adds choices or a
converter. A flag not given keeps the preset's value; the config's `__post_init__` checks the
result (its ValueError is a usage error). Every subcommand also takes `--json FILE` and
`--quick`, `--plot FILE.png` when it has panels, `--preset NAME` when it has more presets.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
import time
import traceback
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr_jax.bench import common, progress

SUBCOMMANDS: dict[str, str] = {
    "roofline": "Matmul throughput and memory bandwidth.",
    "losses": "Loss lab: every registered loss variant on one batch.",
    "verifiers": "Verifier throughput (math, code sandbox).",
    "decode": "Decode tokens/s: continuous, static, HF generate.",
    "learner": "Train-step tokens/s and achieved FLOPs fraction.",
    "waste": "Static vs continuous batching waste.",
    "e2e": "The demo RL setup in sync and async mode.",
    "mismatch": "Sampler vs learner log-probs, default and exact.",
}
"""Every subcommand (its module: `rlvr_jax.bench.<name>`) and its summary, in `all`'s order."""


@dataclasses.dataclass(frozen=True)
class Bars:
    """A bar panel of the numbers at `path` of a result (those in `keys` when given), if any."""

    title: str
    ylabel: str
    path: str
    keys: tuple[str, ...] = ()

    def __call__(self, result: Mapping[str, Any]) -> common.Panel | None:
        values = common.lookup(result, self.path)
        if not isinstance(values, Mapping):
            return None
        bars = {k: v for k, v in values.items() if _is_number(v) and k in (self.keys or values)}
        return common.Panel(self.title, self.ylabel, bars=bars) if bars else None


@dataclasses.dataclass(frozen=True)
class Bench:
    """One subcommand (module docstring)."""

    config: type
    """The config dataclass: its fields are the flags."""
    run: Callable[[Any], dict[str, Any]]
    """Runs the benchmark of a config; the JSON-able result."""
    presets: Mapping[str, Any]
    """Named configs: the first is the default, `quick` the smoke test's (`--quick`)."""
    headlines: tuple[str, ...]
    """Slash paths (or path prefixes) of the figures printed and summed up by `all`."""
    plot: tuple[Callable[[Mapping[str, Any]], common.Panel | None], ...] = ()
    """The plot's panels (`Bars`, or a function of the result), each drawn when it has data."""


def bench(name: str) -> Bench:
    """The `BENCH` of subcommand `name`."""
    if name not in SUBCOMMANDS:
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(SUBCOMMANDS)}")
    return importlib.import_module(f"rlvr_jax.bench.{name}").BENCH


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _docs(cls: type) -> dict[str, str]:
    """The docstrings under the fields of `cls` and of the dataclasses it extends."""
    from rlvr_jax.config.loader import field_docs

    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            docs.update(field_docs(base))
    return docs


def _items(kind: type) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}") from None

    return parse


def _add_flags(p: argparse.ArgumentParser, defaults: Any, prefix: str = "") -> None:
    """A flag per field of the dataclass instance `defaults` (module docstring)."""
    cls = type(defaults)
    hints, docs = typing.get_type_hints(cls), _docs(cls)
    for f in dataclasses.fields(cls):
        extra = dict(f.metadata)
        flag, tp, value = extra.pop("flag", ""), hints[f.name], getattr(defaults, f.name)
        if flag is None:
            continue
        if dataclasses.is_dataclass(tp):
            _add_flags(p, value, f"{prefix}{f.name}.")
            continue
        name = (prefix.replace(".", "-") + f.name).replace("_", "-")
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
        given = shown not in ("", (), None) and tp is not bool
        help_ = docs.get(f.name, "") + (f" (default: {shown})" if given else "")
        kw: dict[str, Any] = {"dest": prefix + f.name, "default": None, "help": help_}
        if tp is bool:
            name = f"no-{name}" if f.default else name
            kw.update(action="store_const", const=not f.default)
            kw["help"] = f"Off: {help_}" if f.default else help_
        elif typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            kw.update({"action": "append"} if item is str else {"type": _items(item)})
        else:  # int, float, str, or one of them | None
            kw["type"] = next(t for t in typing.get_args(tp) or (tp,) if t is not type(None))
        if tp is not bool and "choices" not in extra:
            kw["metavar"] = (flag or name).lstrip("-").upper().replace("-", "_")
        p.add_argument(flag or f"--{name}", **{**kw, **extra})


def _override(cfg: Any, values: Mapping[str, Any], prefix: str = "") -> Any:
    """`cfg` with every field given in `values` (argparse's dests) replaced."""
    changes = {}
    for f in dataclasses.fields(cfg):
        key, value = prefix + f.name, getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and f.metadata.get("flag", "") is not None:
            changes[f.name] = _override(value, values, key + ".")
        elif values.get(key) is not None:
            given = values[key]
            changes[f.name] = tuple(given) if isinstance(given, list) else given
    return dataclasses.replace(cfg, **changes)


def parse(name: str, argv: Sequence[str]) -> tuple[argparse.Namespace, Any]:
    """`rlvr-bench NAME` arguments -> (the arguments, the config they give)."""
    b = bench(name)
    default = next(iter(b.presets))
    p = argparse.ArgumentParser(prog=f"rlvr-bench {name}", description=SUBCOMMANDS[name])
    p.add_argument("--json", help="write the result here as JSON")
    if b.plot:
        p.add_argument("--plot", help="write a PNG plot here")
    p.add_argument("--quick", action="store_true", help="tiny sizes: the smoke test")
    named = len(b.presets) > 2  # (a config may have a field `preset` of its own)
    if named:
        p.add_argument("--preset", choices=list(b.presets), default=default, help="named sizes")
    _add_flags(p, b.presets[default])
    args = p.parse_args(argv)
    base = b.presets["quick" if args.quick else args.preset if named else default]
    try:
        return args, _override(base, vars(args))
    except ValueError as e:
        p.error(str(e))


def run(name: str, argv: Sequence[str]) -> dict[str, Any]:
    """`rlvr-bench NAME ARGV`: runs the benchmark, prints its headline figures, writes its JSON
    and plot; the result, with `machine` (`common.machine_info`) and `config` added."""
    args, cfg = parse(name, argv)
    b = bench(name)
    if args.json:  # a path that cannot be written fails now, not after the measurements
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    result = b.run(cfg)
    machine = {**common.machine_info(load_before), **result.get("machine", {})}
    config = {**dataclasses.asdict(cfg), **result.get("config", {})}
    result = common.jsonable({**result, "machine": machine, "config": config})
    print(format_result(result, b.headlines), flush=True)
    if args.json:
        print(f"wrote {common.write_json(args.json, result)}", file=sys.stderr)
    if getattr(args, "plot", None):
        panels = [panel for draw in b.plot if (panel := draw(result)) is not None]
        print(f"wrote {common.save_plot(args.plot, panels, f'rlvr-bench {name}')}", file=sys.stderr)
    return result


def headline_figures(result: Mapping[str, Any], paths: Sequence[str]) -> dict[str, Any]:
    """The scalar leaves (None kept) of `result` at or under each slash path in `paths`."""
    flat = common.flatten(result)
    out: dict[str, Any] = {}
    for path in paths:
        for key, value in flat.items():
            scalar = isinstance(value, int | float | str) or value is None
            if scalar and (key == path or key.startswith(path + "/")):
                out[key] = value
    return out


def format_result(
    result: Mapping[str, Any], headlines: Sequence[str], *, machine: bool = True
) -> str:
    """The headline figures as text: a headline naming a dict of dicts is a table of its own (a
    row per key), the others rows of one "figure | value" table; then the machine line."""
    rows, tables = [], []
    for path in headlines:
        value = common.lookup(result, path)
        rows_of = isinstance(value, Mapping) and value
        if rows_of and all(isinstance(v, Mapping) for v in value.values()):
            inner = {k: headline_figures(v, list(v)) for k, v in value.items()}
            columns = list(dict.fromkeys(c for leaves in inner.values() for c in leaves))
            cells = [[k, *(leaves.get(c) for c in columns)] for k, leaves in inner.items()]
            tables.append(common.format_table([path, *columns], cells))
        else:
            rows += [[k, v] for k, v in headline_figures(result, [path]).items()]
    figures = [common.format_table(["figure", "value"], rows)] if rows else []
    return "\n\n".join([*figures, *tables, *([machine_line(result)] if machine else [])])


def machine_line(result: Mapping[str, Any]) -> str:
    """Where it ran (CPU, ISA, cores, device, roofline, load), and a NOT QUIET line when the
    result says its load was too high (`quiet: false`)."""
    machine = result.get("machine") or {}
    roof = result.get("roofline") or (result if "matmul_gflops" in result else {})
    cpu = machine.get("cpu_model") or machine.get("processor", "?")
    isa = "/".join(machine.get("cpu_isa") or []) or "ISA unknown"
    line = f"machine: {cpu} ({isa}, {machine.get('cpu_count', '?')} cores"
    line += f", {machine.get('device_kind', '?')})"
    peak = roof.get("peak_gflops_fp32") or (roof.get("matmul_gflops") or {}).get("float32")
    if peak:
        gbps = roof.get("memory_gbps", float("nan"))
        line += f"; roofline fp32 {peak:.1f} GFLOP/s, {gbps:.1f} GB/s"
    loads = [machine.get(k) for k in ("loadavg_before", "loadavg_after", "loadavg")]
    loads = [load[0] for load in loads if load]
    if loads:
        line += "; load " + " -> ".join(f"{x:.2f}" for x in loads[:2])
    if result.get("quiet") is False:
        load = result.get("load") or {}
        limit = load.get("threshold", float("nan"))
        loud = {k: max(v) for k, v in (load.get("by_side") or {}).items() if max(v) > limit}
        line += (
            f"\nNOT QUIET: 1-minute load above {limit:g} around "
            + ", ".join(f"{k} ({v:.2f})" for k, v in loud.items())
            + ": ratios measured under load"
        )
    return line


# ---- rlvr-bench all ----------------------------------------------------------------------


def _run_one(name: str, *, quick: bool, plot_dir: Path | None) -> tuple[dict, dict | None]:
    """Runs one subcommand; (status entry, its result or None)."""
    argv = ["--quick"] if quick else []
    print(f"\n== rlvr-bench {name} {' '.join(argv)}", flush=True)
    progress.begin(f"rlvr-bench {name}")
    start = time.perf_counter()
    result, note = None, None
    try:
        if plot_dir is not None and bench(name).plot:
            argv += ["--plot", str(plot_dir / f"{name}.png")]
        result = run(name, argv)
    except SystemExit as e:  # argparse rejected the arguments
        note = f"exit code {e.code if isinstance(e.code, int) else 2}"
    except Exception as e:
        traceback.print_exc()
        note = f"{type(e).__name__}: {e}"
    entry = {"status": "failed" if note else "ok", "seconds": time.perf_counter() - start}
    return ({**entry, "note": note} if note else entry), result


def run_all(names: Sequence[str], *, quick: bool, plot_dir: Path | None = None) -> dict[str, Any]:
    """Runs the named subcommands in order; the combined nested JSON-able result."""
    if plot_dir is not None:
        plot_dir.mkdir(parents=True, exist_ok=True)
    status, results, summary = {}, {}, {}
    for name in names:
        status[name], result = _run_one(name, quick=quick, plot_dir=plot_dir)
        if result is not None:
            results[name] = result
            summary[name] = headline_figures(result, bench(name).headlines)
    return {
        "summary": summary,
        "status": status,
        "benchmarks": results,
        "machine": common.machine_info(),
        "config": {"quick": quick, "benchmarks": list(names)},
    }


def format_summary(result: dict[str, Any]) -> str:
    """Each benchmark's status, then its headline figures (`format_result`)."""
    load = result["machine"]["loadavg"][0]
    kind = "quick" if result["config"]["quick"] else "full"
    lines = [f"rlvr-bench all ({kind}), load {load:.2f}"]
    for name, entry in result["status"].items():
        took = f"{entry['status']} ({entry['seconds']:.0f} s) {entry.get('note', '')}"
        lines.append(f"\n{name}: {took}".rstrip())
        if name in result["benchmarks"]:
            headlines = bench(name).headlines
            lines.append(format_result(result["benchmarks"][name], headlines, machine=False))
    return "\n".join(lines)


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if unknown := sorted(set(names) - set(SUBCOMMANDS)):
        known = ", ".join(SUBCOMMANDS)
        raise argparse.ArgumentTypeError(f"unknown benchmark(s) {unknown}; known: {known}")
    return names


def main_all(argv: list[str]) -> int:
    """`rlvr-bench all`: every subcommand (`--only`, `--skip`) in this process, as it would run
    alone, a failure recorded without stopping the others; exit code 1 when any failed."""
    p = argparse.ArgumentParser(prog="rlvr-bench all", description="Every benchmark, one JSON.")
    p.add_argument("--json", help="write every benchmark's results here as one JSON")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    p.add_argument("--only", type=_names, default=[], help="run only these (comma-separated)")
    p.add_argument("--skip", type=_names, default=[], help="leave these out (comma-separated)")
    p.add_argument("--plot-dir", help="write each benchmark's PNG plot into this directory")
    args = p.parse_args(argv)
    names = [n for n in SUBCOMMANDS if (n in args.only or not args.only) and n not in args.skip]
    if not names:
        p.error("no benchmark left to run")
    plot_dir = Path(args.plot_dir) if args.plot_dir else None
    result = run_all(names, quick=args.quick, plot_dir=plot_dir)
    print("\n" + format_summary(result))
    if args.json:
        print(f"wrote {common.write_json(args.json, result)}", file=sys.stderr)
    failed = [n for n, s in result["status"].items() if s["status"] == "failed"]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
