"""The experiment harness: arms × seeds of `rlvr-train` runs from one start, held-out pass@k
through the one rollout path, bootstrap intervals, one table and one plot per experiment.

An experiment script declares an `Experiment` — its arms, each a list of `Phase`s (one
`rlvr-train` run each: the first from the base model or from another arm's policy of the same
seed, each next one from the last) — and calls `run_main`. For every seed (`--seeds`, default
the config's `seed`; it sets `seed` and `data.seed`, so the data order varies with it) every
arm trains in a subprocess (`rlvr-train --config F key=value ...`;
the command in results.json, its output in `<run>.log`), and its final policy is evaluated on
the held-out split (`data.eval_sources`, `eval.max_prompts`) through
`rlvr_jax.eval.evaluate.sample_rows`'s sampling (what `rlvr-eval` runs): n = 32 samples per
prompt at `eval.temperature`, top-p 1, sampling seed `EVAL_SEED` for every policy; pass@1/8/32
overall and per domain; with `env.name`, episodes of the environment, whose records the
experiment's `episodes` hook summarises. The base model is evaluated the same way once.

`--probe DOMAIN` makes DOMAIN a general-skill probe: the training sources are rewritten without
its rows (`<out>/data/`), the held-out split keeps them, and every table shows it beside the
trained domains. Written to `<out>`: `results.json` (per arm and seed: pass@k, per-prompt
correct counts, budget — updates, RL prompts and completions, SFT examples, training FLOPs
(`flops`) — and curves; over seeds: mean and 95% interval, `experiment_report`), `results.md`,
and `<name>.png`; with the wall time, the machine (fp32 matmul GFLOP/s of `rlvr-bench
roofline`) and the load average before and after. Trailing `key=value` overrides apply to every
run. `--quick` evaluates 8 prompts (a smoke test). Compiled programs are cached across runs
(`JAX_COMPILATION_CACHE_DIR`, default `<out>/jax_cache`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiment_data as data  # the sibling modules
import experiment_report as report

log = logging.getLogger("experiment")

EVAL_SEED = 20_240_601
"""Sampling seed of every held-out evaluation (the same samples' randomness for all)."""
EVAL_KS = (1, 8, 32)
"""pass@k reported; n = 32 samples per prompt."""
QUICK_EVAL_PROMPTS = 8
TRAIN = "import sys; from rlvr_jax.cli import train_main; sys.exit(train_main(sys.argv[1:]))"


@dataclass(frozen=True)
class Phase:
    """One `rlvr-train` run of an arm."""

    algorithm: str
    """`rl`, `sft`, `expert_iteration`, `rl_sft_parallel` or `dpo`."""
    steps: int | Callable[[Context, dict[str, Any]], int]
    """Optimizer steps, or a function of (context, this seed's finished arm records)."""
    subdir: str = "run"
    """Output directory under the arm's."""
    overrides: tuple[str, ...] = ()
    """This run's own overrides (after the common ones; also used to evaluate the arm)."""


@dataclass(frozen=True)
class Arm:
    """A recipe: phases run one after another, evaluated at the end."""

    name: str
    phases: tuple[Phase, ...]
    start: str | None = None
    """The arm (same seed, declared earlier) whose final policy this one starts from; None =
    the base model."""
    dir: str | None = None
    """Output directory under the seed's (default: `name`; "" = the seed's own)."""
    prepare: Callable[[Context, int, dict[str, Path]], list[str]] | None = None
    """Called before the arm trains with (context, seed, final policies of the arms so far);
    returns overrides for its phases (e.g. the preference pairs it builds)."""
    eval_overrides: tuple[str, ...] | None = None
    """The overrides its final policy is evaluated with; None = its last phase's (e.g. an
    SFT phase that cannot run with `env.name` set, evaluated in the environment)."""


@dataclass(frozen=True)
class Experiment:
    """What an experiment script declares."""

    name: str
    """Plot file stem (`<out>/<name>.png`)."""
    title: str
    arms: tuple[Arm, ...]
    defaults: Sequence[str] | Callable[[Any], Sequence[str]] = ()
    """Overrides of every run before the user's (which win); or a function of the config."""
    compare: tuple[tuple[str, str], ...] = ()
    """(a, b) arm pairs whose difference a − b is reported with its interval (b may be base)."""
    record: Callable[[Context, dict[str, Any], list[dict]], dict] | None = None
    """Extra per-arm figures from (context, its record, its metrics rows)."""
    episodes: Callable[[Context, list, list[list[Any]]], dict] | None = None
    """Per-policy figures from its held-out episodes (multi-turn environments): (context,
    the held-out rows, each row's `n` `EpisodeRecord`s; empty without `env.name`) → a dict
    kept under the policy's `episodes`."""
    finish: Callable[[Context, dict[str, Any]], None] | None = None
    """Adds to the results before they are written (views, an `extra_markdown` section)."""
    plot: Callable[[dict[str, Any], Path], None] = report.plot


@dataclass
class Context:
    """One experiment run's settings, shared with the declarations' hooks."""

    config: str
    common: list[str]
    """Every run's overrides: harness defaults, the experiment's, the user's, the probe's."""
    cfg: Any
    """The config with `common`."""
    base: Path
    out: Path
    seeds: list[int]
    quick: bool
    settings: dict[str, Any] = field(default_factory=dict)
    """The script's own settings (recorded in results.json)."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Top-level entries the hooks add to results.json."""

    def seed_dir(self, seed: int) -> Path:
        return self.out if len(self.seeds) == 1 else self.out / f"seed{seed}"

    def load(self, overrides: Sequence[str]) -> Any:
        from rlvr_jax.config import load

        return load(self.config, [*self.common, *overrides])


def quoted(path: Path | str) -> str:
    """A path as a YAML override value."""
    return json.dumps(str(path))


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- the command line ------------------------------------------------------------------------


def parser(doc: str, *, out: str, steps: tuple[int, int] | None = None) -> argparse.ArgumentParser:
    """The arguments every experiment takes; `steps` = (default, --quick default) adds --steps."""
    p = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", default="configs/demo.yaml", help="the demo config")
    p.add_argument("--out", default=out, help="output directory")
    if steps is not None:
        p.add_argument(
            "--steps", type=int, help=f"updates per arm (default {steps[0]}, quick {steps[1]})"
        )
        p.set_defaults(steps_defaults=steps)
    p.add_argument("--seeds", help="comma-separated global seeds (default: the config's seed)")
    p.add_argument("--arms", help="comma-separated subset of the arms (default: all)")
    p.add_argument(
        "--probe", metavar="DOMAIN", help="hold DOMAIN out of training: a general-skill probe"
    )
    p.add_argument("--quick", action="store_true", help="tiny budget (smoke test)")
    p.add_argument("--overwrite", action="store_true", help="replace earlier runs in --out")
    p.add_argument(
        "--merge", nargs="+", metavar="DIR", help="no training: one report in --out of the seeds "
        "that earlier runs of this experiment (their DIR/results.json) finished",
    )  # fmt: skip
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    return p


def steps(args: argparse.Namespace) -> int:
    """--steps, or its default (the --quick one with --quick)."""
    return args.steps if args.steps is not None else args.steps_defaults[bool(args.quick)]


def run_main(
    p: argparse.ArgumentParser,
    args: argparse.Namespace,
    exp: Experiment,
    argv,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Checks the common arguments, runs `exp` and prints its table; returns the results."""
    if args.merge:
        try:
            results = merge(exp, [Path(d) for d in args.merge], Path(args.out))
        except ValueError as e:  # a missing, differing or overlapping run: exit 2 naming it
            p.error(str(e))
        sys.stdout.write(report.markdown(results))
        return results
    names = [a.name for a in exp.arms]
    chosen = [a for a in (args.arms or ",".join(names)).split(",") if a]
    unknown = [a for a in chosen if a not in names]
    if unknown or not chosen:
        p.error(f"--arms: unknown {unknown}; expected a subset of {names}")
    arms = tuple(a for a in exp.arms if a.name in chosen)
    missing = [a.start for a in arms if a.start is not None and a.start not in chosen]
    if missing:
        p.error(f"--arms: {missing} must run too (other arms start from their policies)")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s] if args.seeds else None
    except ValueError:
        p.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    if seeds == []:
        p.error("--seeds: at least one seed")
    out = Path(args.out)
    dirs = [(a.name if a.dir is None else a.dir, ph.subdir) for a in arms for ph in a.phases]
    earlier = [out / d if d else out / sub for d, sub in dirs]
    earlier = [d for d in dict.fromkeys([*earlier, out / "results.json"]) if d.exists()]
    earlier += sorted(out.glob("seed*"))
    if earlier and not args.overwrite:
        p.error(f"{', '.join(map(str, earlier))} exist: pass --overwrite to replace them")
    for path in earlier:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("absl").setLevel(logging.WARNING)
    command = shlex.join(["python", f"scripts/{p.prog}", *(sys.argv[1:] if argv is None else argv)])
    results = run(
        dataclasses.replace(exp, arms=arms),
        args.config,
        args.overrides,
        out=out,
        seeds=seeds,
        quick=args.quick,
        probe=args.probe,
        settings=settings or {},
        command=command,
    )
    sys.stdout.write(report.markdown(results))
    return results


# -- running an experiment -------------------------------------------------------------------


def run(
    exp: Experiment,
    config: str,
    user: Sequence[str],
    *,
    out: Path,
    seeds: list[int] | None,
    quick: bool,
    probe: str | None,
    settings: dict[str, Any],
    command: str,
) -> dict[str, Any]:
    """Trains and evaluates every arm for every seed; returns (and writes) the results."""
    from rlvr_jax.config import load
    from rlvr_jax.models.bootstrap import ensure_model

    t0, load_before = time.perf_counter(), load_average()
    user = [*user, *([f"eval.max_prompts={QUICK_EVAL_PROMPTS}"] if quick else [])]
    cfg = load(config, user)
    defaults = exp.defaults(cfg) if callable(exp.defaults) else exp.defaults
    common = ["eval.every_steps=0", *defaults, *user]
    cfg = load(config, common)
    if not cfg.data.sources or not cfg.data.eval_sources:
        raise ValueError(f"{config}: set data.sources and data.eval_sources (the held-out split)")
    out.mkdir(parents=True, exist_ok=True)
    if probe:
        common += data.probe_overrides(cfg, probe, out / "data")
    base = ensure_model(cfg).absolute()
    seeds = seeds or [cfg.seed]
    ctx = Context(config, common, load(config, common), base, out, seeds, quick, settings)
    cache = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str((out / "jax_cache").absolute()))
    import jax

    jax.config.update("jax_compilation_cache_dir", cache)
    results: dict[str, Any] = {
        "experiment": exp.name,
        "title": exp.title,
        "config": config,
        "overrides": list(user),
        "command": command,
        "settings": settings,
        "probe": probe,
        "base_model": str(base),
        "eval_temperature": cfg.eval.temperature,
        "machine": machine(quick),
        "load_before": load_before,
        "compare": [list(c) for c in exp.compare],
        "seeds": {},
    }
    results["base"] = evaluate(ctx, base, [], results, exp.episodes)
    for seed in seeds:
        records: dict[str, Any] = {}
        results["seeds"][str(seed)] = records
        finals: dict[str, Path] = {}
        for arm in exp.arms:
            finals[arm.name], records[arm.name] = run_arm(ctx, exp, arm, seed, finals, records)
            at = arm.phases[-1].overrides if arm.eval_overrides is None else arm.eval_overrides
            records[arm.name].update(evaluate(ctx, finals[arm.name], at, episodes=exp.episodes))
            write(ctx, exp, results)
    results["load_after"] = load_average()
    results["wall_s"] = time.perf_counter() - t0
    write(ctx, exp, results)
    return results


def run_arm(
    ctx: Context,
    exp: Experiment,
    arm: Arm,
    seed: int,
    finals: dict[str, Path],
    records: dict[str, Any],
) -> tuple[Path, dict[str, Any]]:
    """Trains `arm`'s phases for `seed`; returns its final policy and its record."""
    model = ctx.base if arm.start is None else finals[arm.start]
    extra = arm.prepare(ctx, seed, finals) if arm.prepare else []
    t0, runs, phases = time.perf_counter(), [], []
    for phase in arm.phases:
        n = phase.steps if isinstance(phase.steps, int) else phase.steps(ctx, records)
        run_dir = ctx.seed_dir(seed) / (arm.name if arm.dir is None else arm.dir) / phase.subdir
        overrides = [
            *extra,
            *phase.overrides,
            f"algorithm={phase.algorithm}",
            f"train.max_steps={n}",
            f"train.output_dir={quoted(run_dir.absolute())}",
            f"model.path={quoted(model)}",
            "model.create_if_missing=null",
            "checkpoint.export_hf=true",
            f"seed={seed}",
            f"data.seed={seed}",  # the seed draws the data order too, not only the samples
        ]
        runs.append({"algorithm": phase.algorithm, "steps": n, "from": str(model)})
        runs[-1]["command"] = shlex.join(
            ["rlvr-train", "--config", ctx.config, *ctx.common, *overrides]
        )
        log.info(
            "seed %d, %s: %s for %d steps into %s", seed, arm.name, phase.algorithm, n, run_dir
        )
        model = train(ctx, overrides, run_dir)
        runs[-1]["to"] = str(model)
        phases.append(
            (phase.algorithm, ctx.load(overrides), read_metrics(run_dir / "metrics.jsonl"))
        )
    record = {"runs": runs, "train_s": time.perf_counter() - t0, **data.account(ctx, phases)}
    if exp.record:
        record.update(exp.record(ctx, record, [r for _, _, rows in phases for r in rows]))
    return model, record


def train(ctx: Context, overrides: Sequence[str], run_dir: Path) -> Path:
    """`rlvr-train` in a subprocess (this process's import path, niceness and environment);
    returns the exported policy directory."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = run_dir.parent / f"{run_dir.name}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    args = ["--config", ctx.config, *ctx.common, *overrides]
    with log_path.open("w") as f:
        code = subprocess.run([sys.executable, "-c", TRAIN, *args], stdout=f, stderr=f, env=env)
    if code.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-15:])
        raise RuntimeError(f"rlvr-train exited {code.returncode} ({log_path}):\n{tail}")
    final = run_dir / "final"
    if not (final / "config.json").is_file():
        raise RuntimeError(f"the run into {run_dir} exported no policy")
    return final.absolute()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def evaluate(
    ctx: Context,
    model: Path,
    overrides: Sequence[str],
    results: dict | None = None,
    episodes: Callable[[Context, list, list[list[Any]]], dict] | None = None,
) -> dict:
    """Held-out pass@k (n = 32) of the policy in `model` under the config with `overrides`
    (an arm's last phase's: its rollout settings), with the per-prompt correct counts; with
    `env.name` set, each prompt's samples run as the environment's episodes and `episodes`
    (the experiment's) adds its figures from (context, rows, each prompt's `EpisodeRecord`s)
    under `episodes`. The same sampling as `eval.evaluate.sample_rows` (what `rlvr-eval`
    runs), with the environment's hooks kept to read their episodes."""
    from rlvr_jax.data import load_eval_rows
    from rlvr_jax.data.formatting import stop_token_ids
    from rlvr_jax.eval.evaluate import env_prompts, load_policy, open_rollout, sample_correct_counts
    from rlvr_jax.rewards import RewardService, known_verifiers
    from rlvr_jax.rollout import SamplingParams

    cfg = ctx.load(
        [
            *overrides,
            f"eval.max_prompts={ctx.cfg.eval.max_prompts}",
            f"model.path={quoted(model)}",
            "model.create_if_missing=null",
        ]
    )
    policy, tokenizer = load_policy(cfg)
    rows = load_eval_rows(cfg.data, tokenizer=tokenizer, known_verifiers=known_verifiers())
    stops = stop_token_ids(policy.config, tokenizer, cfg.rollout.stop_strings)
    rows, prompts, turns, runner = env_prompts(cfg, rows[: cfg.eval.max_prompts], tokenizer, stops)
    n = max(EVAL_KS)
    rollout = open_rollout(cfg, policy, tokenizer, max(len(p) for p in prompts))
    try:
        with RewardService(cfg.rewards) as rewards:
            s = sample_correct_counts(
                rollout,
                rows,
                prompts,
                tokenizer=tokenizer,
                reward_service=rewards,
                num_samples=n,
                sampling=SamplingParams(temperature=cfg.eval.temperature, top_p=1.0),
                seed=EVAL_SEED,
                turns=turns,
            )
    finally:
        rollout.close()
        if runner is not None:
            runner.close()
    if results is not None:
        results["heldout"] = {
            "n": n,
            "ks": list(EVAL_KS),
            "seed": EVAL_SEED,
            "prompts": len(rows),
            "temperature": cfg.eval.temperature,
            "domains": list(s.domains),
        }
    counts = s.counts_P.tolist()
    out = {
        **report.pass_at_k(counts, s.domains, n, EVAL_KS),
        "prompts": len(rows),
        "counts": counts,
    }
    if episodes is not None:
        records = [[g.episode(i) for i in range(n)] for g in turns] if turns else []
        out["episodes"] = episodes(ctx, list(rows), records)
    return out


MERGE_SAME = ("experiment", "config", "overrides", "settings", "probe", "heldout", "compare")
"""What runs merged into one report must agree on."""


def merge(exp: Experiment, dirs: list[Path], out: Path) -> dict[str, Any]:
    """One report of earlier runs of `exp` (`--merge`): the seeds each finished (every arm
    evaluated; a seed a stopped run left half-done is left out), the base evaluation of the
    first, and each run's command, machine, load and wall time under `parts`. Raises
    ValueError naming the run that differs in what `MERGE_SAME` lists, or repeats a seed."""
    parts = []
    for d in dirs:
        path = d / "results.json"
        if not path.is_file():
            raise ValueError(f"--merge: {path} does not exist")
        parts.append(json.loads(path.read_text()))
    results = {k: v for k, v in parts[0].items() if k not in ("seeds", "summary", "arms")}
    results.update(seeds={}, parts=[], command=" + ".join(p["command"] for p in parts))
    arms = [a.name for a in exp.arms]
    for d, part in zip(dirs, parts):
        differ = [k for k in MERGE_SAME if part.get(k) != parts[0].get(k)]
        if differ:
            raise ValueError(f"--merge: {d} differs from {dirs[0]} in {differ}")
        done = {s: r for s, r in part["seeds"].items() if all(a in r for a in arms)}
        repeated = sorted(set(done) & set(results["seeds"]))
        if repeated:
            raise ValueError(f"--merge: {d} repeats seeds {repeated}")
        results["seeds"].update(done)
        keys = ("command", "machine", "load_before", "load_after", "wall_s")
        results["parts"].append({"seeds": sorted(done), **{k: part.get(k) for k in keys}})
    results["wall_s"] = sum(p.get("wall_s") or 0.0 for p in parts)
    results["load_after"] = parts[-1].get("load_after")
    out.mkdir(parents=True, exist_ok=True)
    write(Context("", [], None, Path(results["base_model"]), out, [], False, {}), exp, results)
    return results


def write(ctx: Context, exp: Experiment, results: dict[str, Any]) -> None:
    """results.json, results.md and the plot (as far as the experiment has got)."""
    results.update(ctx.extras)
    results["summary"] = report.summarize(results)
    first = next(iter(results["seeds"].values()), {})
    results["arms"] = {  # the first seed's records without counts and curves (older scripts' view)
        a: {k: v for k, v in r.items() if k not in ("counts", "curve")}
        for a, r in {"base": results["base"], **first}.items()
    }
    if exp.finish:
        exp.finish(ctx, results)
    (ctx.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (ctx.out / "results.md").write_text(report.markdown(results))
    exp.plot(results, ctx.out / f"{exp.name}.png")


def machine(quick: bool) -> dict[str, Any]:
    """Where the experiment ran: `rlvr-bench roofline`'s fp32 matmul GFLOP/s, the host, and the
    CPU's model and vector ISA (`bench.common.cpu_info`)."""
    from rlvr_jax.bench.common import cpu_info
    from rlvr_jax.bench.roofline import default_sizes, measure_roofline

    roof = measure_roofline(**default_sizes(quick))
    keys = ("platform", "device_kind", "cpu_count", "processor", "host")
    return {
        "fp32_gflops": roof["matmul_gflops"]["float32"],
        "memory_gbps": roof["memory_gbps"],
        **{k: roof["machine"][k] for k in keys},
        **cpu_info(),
    }
