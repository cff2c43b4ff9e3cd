"""`rlvr-eval`: pass@k of a policy (unbiased estimator), overall and per domain.

    rlvr-eval --config configs/demo.yaml --model runs/demo/final \\
        --input data/demo/test.jsonl --json eval.json
    rlvr-eval --config configs/demo.yaml --input data/demo/test.jsonl \\
        --fewshot 4 --fewshot-source data/demo/train.jsonl
    rlvr-eval --config my_run.yaml --split train --ks 1 8 --max-prompts 128

Prompts come from `--input`, else `data.eval_sources` (`--split eval`) or `data.sources`
(`--split train`, where a base model's pass@k predicts whether RL will help); each is sampled n
times at top-p 1 with the config's model, template, `rollout.max_new_tokens` and verifiers.
Prints a table; `--json FILE` writes `{"pass@k": {"1": ..}, "per_domain": {domain: {"1": ..}},
"n", "prompts", "model", "time_s", ...}`. Exit status 2 on bad arguments, config or input.
"""

from __future__ import annotations

import argparse
import collections
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr_jax.eval.cli_common import (
    EXIT_USAGE as EXIT_USAGE,
)
from rlvr_jax.eval.cli_common import (
    add_chunk_prompts_arg,
    add_config_args,
    run_cli,
    write_json,
)
from rlvr_jax.eval.evaluate import DEFAULT_CHUNK_PROMPTS

PROG = "rlvr-eval"
SPLITS = ("eval", "train")
"""`--split eval` reads `data.eval_sources`, `--split train` reads `data.sources`."""


@dataclass(frozen=True)
class EvalRequest:
    """What one `rlvr-eval` run measures (the flags of the same names)."""

    ks: tuple[int, ...] = (1, 8, 32)
    num_samples: int | None = None
    """n, samples per prompt; None = max(ks)."""
    input: str | None = None
    """Prompt file; None = the config's sources of `split`."""
    split: str = "eval"
    max_prompts: int | None = None
    temperature: float | None = None
    """None = `eval.temperature`."""
    fewshot: int = 0
    fewshot_source: str | None = None
    seed: int | None = None
    """Sampling and few-shot selection seed; None = the config's seed."""
    chunk_prompts: int = DEFAULT_CHUNK_PROMPTS

    @property
    def n(self) -> int:
        """Samples per prompt."""
        return max(self.ks) if self.num_samples is None else self.num_samples

    def problem(self) -> str | None:
        """What is wrong with the request (in command-line terms), or None."""
        if not self.ks or min(self.ks) < 1:
            return f"--ks must be integers >= 1, got {list(self.ks)}"
        if self.n < max(self.ks):
            return f"--samples {self.n} is smaller than the largest k ({max(self.ks)})"
        if self.split not in SPLITS:
            return f"--split must be one of {SPLITS}, got {self.split!r}"
        if self.max_prompts is not None and self.max_prompts < 1:
            return f"--max-prompts must be >= 1, got {self.max_prompts}"
        if self.temperature is not None and not self.temperature >= 0.0:
            return f"--temperature must be >= 0, got {self.temperature}"
        if self.fewshot < 0:
            return f"--fewshot must be >= 0, got {self.fewshot}"
        if self.fewshot > 0 and self.fewshot_source is None:
            return "--fewshot N needs --fewshot-source FILE (solved examples)"
        if self.fewshot == 0 and self.fewshot_source is not None:
            return "--fewshot-source is given but --fewshot is 0"
        if self.seed is not None and self.seed < 0:
            return f"--seed must be >= 0, got {self.seed}"
        if self.chunk_prompts < 1:
            return f"--chunk-prompts must be >= 1, got {self.chunk_prompts}"
        for flag, path in (("--input", self.input), ("--fewshot-source", self.fewshot_source)):
            if path is not None and not Path(path).is_file():
                return f"{flag} file not found: {path!r}"
        return None


def load_rows(
    cfg: Any, request: EvalRequest, tokenizer: Any
) -> tuple[list, dict[str, int], list[str]]:
    """The prompts to evaluate (`--input` or the config's split; at most `max_prompts`), the
    rows the loader skipped (by reason), and where the sources are.

    Raises:
      DataError: no source configured for the split, or an unusable source (naming it).
    """
    from rlvr_jax.config.schema import SourceConfig
    from rlvr_jax.data import DataError, load_sources, prompt_length_fn
    from rlvr_jax.rewards import known_verifiers

    if request.input is not None:
        sources = [SourceConfig(path=request.input)]
    else:
        train = request.split == "train"
        sources = list(cfg.data.sources if train else cfg.data.eval_sources)
        if not sources:
            key = "sources" if train else "eval_sources"
            raise DataError(f"data.{key} is empty in the config: pass --input FILE")
    loaded = load_sources(
        sources,
        known_verifiers=known_verifiers(),
        token_length=prompt_length_fn(tokenizer, cfg.data.prompt_template),
        max_prompt_len=cfg.data.max_prompt_len,
    )
    rows = [row for src in loaded for row in src.rows][: request.max_prompts]
    skipped: dict[str, int] = {}
    for src in loaded:
        for kind, count in src.skipped.items():
            skipped[kind] = skipped.get(kind, 0) + count
    return rows, skipped, [src.location for src in loaded]


def run_eval(cfg: Any, request: EvalRequest) -> dict[str, Any]:
    """Evaluates `cfg.model` as `request` says; returns the JSON report.

    Raises:
      ValueError: an invalid request, config, source or few-shot file (naming it).
    """
    from rlvr_jax.eval.evaluate import load_policy, pass_at_k_report, sample_rows
    from rlvr_jax.eval.fewshot import load_fewshot_pool, with_fewshot

    problem = request.problem()
    if problem is not None:
        raise ValueError(problem)
    t0 = time.perf_counter()
    seed = cfg.seed if request.seed is None else request.seed
    temperature = cfg.eval.temperature if request.temperature is None else request.temperature
    model, tokenizer = load_policy(cfg)
    rows, skipped, locations = load_rows(cfg, request, tokenizer)
    fewshot = None
    if request.fewshot:
        pool = load_fewshot_pool(request.fewshot_source, seed=seed)
        rows = [with_fewshot(r, pool.for_row(r, request.fewshot)) for r in rows]
        fewshot = {"n": request.fewshot, "source": pool.source, "skipped": pool.skipped}
    sampled = sample_rows(
        cfg,
        model,
        tokenizer,
        rows,
        num_samples=request.n,
        temperature=temperature,
        seed=seed,
        chunk_prompts=request.chunk_prompts,
    )
    prompts_per_domain = dict(sorted(collections.Counter(sampled.domains).items()))
    return {
        **pass_at_k_report(sampled.counts_P, sampled.domains, request.n, sorted(request.ks)),
        "n": request.n,
        "prompts": len(rows),
        "model": str(cfg.model.path),
        "time_s": time.perf_counter() - t0,
        "prompts_per_domain": prompts_per_domain,
        "mean_correct": float(sampled.counts_P.mean()) / request.n,
        "input": locations,
        "template": cfg.data.prompt_template,
        "temperature": temperature,
        "top_p": 1.0,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "seed": seed,
        "fewshot": fewshot,
        "skipped": skipped,
        **sampled.stats(request.n),
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line of `rlvr-eval`."""
    p = argparse.ArgumentParser(prog=PROG, description="pass@k of a policy, per domain.")
    add_config_args(p, "YAML config file (model, data, rollout, rewards)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--input", help="prompt file (.jsonl, .jsonl.gz or .parquet)")
    where.add_argument(
        "--split", choices=SPLITS, default="eval", help="config sources to evaluate on"
    )
    p.add_argument("--ks", type=int, nargs="+", default=[1, 8, 32], help="k values of pass@k")
    p.add_argument("--samples", type=int, help="samples per prompt (default: the largest k)")
    p.add_argument("--max-prompts", type=int, help="evaluate the first N prompts")
    p.add_argument("--temperature", type=float, help="default: the config's eval.temperature")
    p.add_argument("--fewshot", type=int, default=0, help="solved examples per prompt")
    p.add_argument("--fewshot-source", help="file of solved examples (see rlvr_jax.eval.fewshot)")
    p.add_argument("--seed", type=int, help="sampling seed (default: the config's seed)")
    add_chunk_prompts_arg(p)
    p.add_argument("--json", help="write the report here as JSON")
    return p


def _request(args: argparse.Namespace) -> EvalRequest:
    """The `EvalRequest` of parsed arguments."""
    return EvalRequest(
        ks=tuple(dict.fromkeys(args.ks)),
        num_samples=args.samples,
        input=args.input,
        split=args.split,
        max_prompts=args.max_prompts,
        temperature=args.temperature,
        fewshot=args.fewshot,
        fewshot_source=args.fewshot_source,
        seed=args.seed,
        chunk_prompts=args.chunk_prompts,
    )


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments themselves, or None."""
    problem = _request(args).problem()
    if problem is None and args.config is None and args.model is None:
        problem = "give --config FILE (or at least --model PATH with --input FILE)"
    return problem


def _evaluate(cfg: Any, args: argparse.Namespace) -> dict[str, Any]:
    report = run_eval(cfg, _request(args))
    if args.model is not None:  # as given (a training checkpoint is run from its export)
        report["model"] = args.model
    return report


def _show(args: argparse.Namespace, report: dict[str, Any]) -> None:
    from rlvr_jax.eval.evaluate import format_pass_at_k_table

    print(format_pass_at_k_table(report, report["prompts_per_domain"]))
    print(
        f"n = {report['n']} samples per prompt, {report['prompts']} prompts, "
        f"model {report['model']}, {report['time_s']:.1f} s"
    )
    if args.json:
        write_json(args.json, report, "report")


def main(argv: list[str] | None = None) -> int:
    """Runs `rlvr-eval`; returns the exit status (0 ok, 2 bad arguments/config/input)."""
    return run_cli(build_parser(), argv, _argument_problem, _evaluate, _show)
