"""`RewardService`: scores a batch of completions with their rows' verifiers, concurrently.

Each row (a `PromptRow`, or a mapping in the data-row form) names its verifier and ground
truth. Verifier calls run in killable worker processes (`timeout.WorkerPool`) under the
configured timeout and a 4 GiB address-space limit: a verifier that raises, hangs, exhausts
memory or kills its process costs that one sample a reward of 0 (counted in `rewards/errors` or
`rewards/timeouts`), never the run. Rows of the I/O-bound LLM judges (`BATCHED`) go to their
module's `score_rows` on a thread instead (one call per distinct settings); a judge batch that
raises falls back to per-row calls in the pool, a rubric batch's rows become errors (its cache
lives in this process).

The reward of sample i is

    r_i = w[domain_i] · verifier_i(response_i) + format_weight · format_reward(response_i)
          + soft_overlong_penalty(length_i, max_len, overlong_buffer)

with domain weights from `RewardsConfig.domain_weights` (default 1.0); the last term only when
`lengths`, `max_len` and a buffer > 0 are given.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlvr_jax.config.schema import RewardsConfig
from rlvr_jax.data.rows import PromptRow
from rlvr_jax.rewards.format import format_reward, soft_overlong_penalty_N
from rlvr_jax.rewards.registry import verifier_target
from rlvr_jax.rewards.timeout import WORKER_MEMORY_MB, CallResult, WorkerPool, default_workers

logger = logging.getLogger(__name__)

JUDGE = "judge"
RUBRIC = "rubric"
BATCHED: dict[str, bool] = {JUDGE: True, RUBRIC: False}
"""Verifiers scored through `rlvr_jax.rewards.<name>.score_rows` on a thread, and whether a
batch that raises falls back to per-row calls in the worker pool."""
_PRELOAD = ("rlvr_jax.rewards.math", "rlvr_jax.rewards.math.compare")
"""Imported by each worker before its first call (SymPy import time never counts)."""
_MAX_LOGGED_ERRORS = 5


@dataclass(frozen=True)
class ScoreResult:
    """Rewards of one batch and what happened while computing them."""

    rewards: np.ndarray
    """float32[N]: the summed reward of each sample."""
    verifier_scores: np.ndarray
    """float32[N]: the verifier's own score in [0, 1] (0 where it failed)."""
    domains: tuple[str, ...]
    """Domain of each sample (the row's `domain`, default its verifier)."""
    verifiers: tuple[str, ...]
    """Verifier name of each sample."""
    statuses: tuple[str, ...]
    """"ok", "timeout" or "error" per sample."""
    errors: dict[int, str] = field(default_factory=dict)
    """Sample index → what went wrong, for every sample whose status is not "ok"."""
    metrics: dict[str, float] = field(default_factory=dict)
    """`reward/mean`, `reward/<domain>`, `rewards/<verifier>/{mean,count,timeouts,errors}`,
    `rewards/{timeouts,errors}`, `rewards/format/mean`, `rewards/overlong/{mean,fraction}`,
    `rewards/<judge|rubric>/<counter>` (their `COUNTERS`), `time/reward_s`."""


@dataclass(frozen=True)
class _Job:
    index: int
    verifier: str
    target: str
    ground_truth: Any
    kwargs: dict[str, Any]
    domain: str


def verifier_defaults(verifier: str, config: RewardsConfig) -> dict[str, Any]:
    """Service-level defaults for the built-in verifiers (a row's `verifier_kwargs` override)."""
    if verifier == "code":
        return {"mode": config.code_mode}
    if verifier == "ifeval":
        return {"mode": config.ifeval_mode}
    if verifier == JUDGE:
        return {
            "base_url": config.judge_url,
            "model": config.judge_model,
            "api_key_env": config.judge_api_key_env,
        }
    if verifier == RUBRIC:
        return {
            "base_url": config.rubric_url,
            "model": config.rubric_model,
            "api_key_env": config.judge_api_key_env,
            "timeout_s": config.rubric_timeout_s,
            "max_concurrency": config.rubric_max_concurrency,
            "cache_size": config.rubric_cache_size,
        }
    return {}


def _plan(index: int, row: PromptRow | Mapping[str, Any], config: RewardsConfig) -> _Job:
    """Resolves one row's verifier and its settings; errors name the row."""
    name, truth, row_kwargs, domain, prompt = _fields(index, row)
    try:
        target = verifier_target(name)
    except ValueError as e:
        raise ValueError(f"row {index}: {e}") from None
    kwargs = {**verifier_defaults(name, config), **row_kwargs}
    if name == JUDGE and not (kwargs.get("base_url") and kwargs.get("model")):
        raise ValueError(
            f"row {index}: the judge verifier needs rewards.judge_url and rewards.judge_model "
            "(or base_url and model in the row's verifier_kwargs)"
        )
    if name in BATCHED:
        kwargs.setdefault("prompt", prompt)
    return _Job(index, name, target, truth, kwargs, domain)


def _fields(index: int, row: Any) -> tuple[str, Any, Mapping[str, Any], str, Any]:
    """(verifier, ground truth, verifier_kwargs, domain, prompt) of a row: a `PromptRow` as
    loaded (validated then), a mapping validated here."""
    if isinstance(row, PromptRow):
        return row.verifier, row.ground_truth, row.verifier_kwargs, row.domain, row.prompt
    if not isinstance(row, Mapping):
        raise ValueError(f"row {index}: expected a mapping, got {type(row).__name__}")
    for key in ("verifier", "ground_truth"):
        if key not in row:
            raise ValueError(f"row {index}: missing field {key!r}")
    name = row["verifier"]
    row_kwargs = row.get("verifier_kwargs") or {}
    if not isinstance(row_kwargs, Mapping):
        raise ValueError(f"row {index}: verifier_kwargs must be a mapping, got {row_kwargs!r}")
    if name == RUBRIC:
        rubric = importlib.import_module("rlvr_jax.rewards.rubric")
        try:
            rubric.parse_rubric(row["ground_truth"])
        except ValueError as e:
            raise ValueError(f"row {index}: {e}") from None
    domain = row.get("domain") or name
    if not isinstance(domain, str):
        raise ValueError(f"row {index}: domain must be a string, got {domain!r}")
    return name, row["ground_truth"], row_kwargs, domain, row.get("prompt", "")


def _options(job: _Job) -> dict[str, Any]:
    """A batched job's verifier settings (its kwargs without the row's prompt)."""
    return {k: v for k, v in job.kwargs.items() if k != "prompt"}


def _checked_score(result: CallResult) -> tuple[float, str, str]:
    """(score, status, error) from a worker result; a score outside [0, 1] is an error."""
    if not result.ok:
        return 0.0, result.status, result.error
    value = result.value
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        return 0.0, "error", f"verifier returned {type(value).__name__}, not a number"
    value = float(value)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        return 0.0, "error", f"verifier returned {value}, outside [0, 1]"
    return value, "ok", ""


class RewardService:
    """Concurrent, bounded reward computation (module docstring). Use as a context manager or
    call `close()`: it owns worker processes."""

    def __init__(
        self,
        config: RewardsConfig | None = None,
        *,
        workers: int | None = None,
        timeout_s: float | None = None,
        overlong_buffer: int = 0,
    ):
        """Starts the worker pool. `workers` and `timeout_s` override `config`'s (default
        `RewardsConfig()`; 0 workers = one per CPU core); `overlong_buffer` is L_c of DAPO's
        soft overlong punishment (`filter.soft_overlong_buffer`; 0 = off)."""
        self.config = config if config is not None else RewardsConfig()
        n = workers if workers is not None else (self.config.workers or default_workers())
        self.timeout_s = float(timeout_s if timeout_s is not None else self.config.timeout_s)
        if n < 1:
            raise ValueError(f"RewardService needs workers >= 1, got {n}")
        if self.timeout_s <= 0:
            raise ValueError(f"RewardService needs timeout_s > 0, got {self.timeout_s}")
        if overlong_buffer < 0:
            raise ValueError(f"overlong_buffer must be >= 0, got {overlong_buffer}")
        bad_weights = {k: v for k, v in self.config.domain_weights.items() if not math.isfinite(v)}
        if bad_weights:
            raise ValueError(f"rewards.domain_weights must be finite, got {bad_weights}")
        cfg = self.config
        if not (
            cfg.rubric_timeout_s > 0
            and cfg.rubric_max_concurrency >= 1
            and cfg.rubric_cache_size >= 0
        ):
            raise ValueError(
                "rewards.rubric_timeout_s must be > 0, rewards.rubric_max_concurrency >= 1 and "
                f"rewards.rubric_cache_size >= 0; got {cfg.rubric_timeout_s}, "
                f"{cfg.rubric_max_concurrency}, {cfg.rubric_cache_size}"
            )
        self.overlong_buffer = overlong_buffer
        self.num_workers = n
        self._pool = WorkerPool(n, preload=_PRELOAD, memory_mb=WORKER_MEMORY_MB)
        self._threads = ThreadPoolExecutor(n + len(BATCHED), thread_name_prefix="rlvr-reward")
        self._closed = False

    # -- scoring -------------------------------------------------------------------------
    def score(
        self,
        rows: Sequence[PromptRow | Mapping[str, Any]],
        responses: Sequence[str],
        *,
        lengths: Sequence[int] | np.ndarray | None = None,
        max_len: int | None = None,
    ) -> ScoreResult:
        """Rewards for `responses[i]` judged against `rows[i]` (see module docstring).

        `rows` are `PromptRow`s or mappings with `verifier`, `ground_truth` and optional
        `domain`, `verifier_kwargs`, `prompt`; `lengths` (tokens) and `max_len` (L_max) feed
        the overlong penalty.

        Raises:
          ValueError: mismatched lengths, or a row without a known verifier (naming the row).
        """
        if self._closed:
            raise RuntimeError("RewardService is closed")
        if len(rows) != len(responses):
            raise ValueError(f"{len(rows)} rows but {len(responses)} responses")
        if (lengths is None) != (max_len is None):
            raise ValueError("pass lengths and max_len together (or neither)")
        start = time.perf_counter()
        jobs = [_plan(i, row, self.config) for i, row in enumerate(rows)]
        n = len(jobs)
        extra: dict[str, float] = {}
        penalty_N = np.zeros(n, np.float32)
        if lengths is not None and np.shape(lengths) != (n,):
            raise ValueError(f"lengths has shape {np.shape(lengths)}, expected ({n},)")
        if lengths is not None and max_len is not None and self.overlong_buffer > 0:
            lengths_N = np.asarray(lengths)
            penalty_N = soft_overlong_penalty_N(lengths_N, max_len, self.overlong_buffer)
            extra["rewards/overlong/mean"] = float(penalty_N.mean()) if n else 0.0
            extra["rewards/overlong/fraction"] = float((penalty_N < 0).mean()) if n else 0.0
        format_N = np.zeros(n, np.float32)
        if self.config.format_weight:
            format_N = np.array([format_reward(r) for r in responses], np.float32)
            extra["rewards/format/mean"] = float(format_N.mean()) if n else 0.0

        scores_N, statuses, errors, judge_metrics = self._verify(jobs, responses)
        weights_N = np.array(
            [self.config.domain_weights.get(j.domain, 1.0) for j in jobs], np.float32
        )
        format_weight = np.float32(self.config.format_weight)
        rewards_N = (weights_N * scores_N + format_weight * format_N + penalty_N).astype(np.float32)

        metrics = _metrics(jobs, rewards_N, scores_N, statuses) | extra | judge_metrics
        metrics["time/reward_s"] = time.perf_counter() - start
        return ScoreResult(
            rewards=rewards_N,
            verifier_scores=scores_N,
            domains=tuple(j.domain for j in jobs),
            verifiers=tuple(j.verifier for j in jobs),
            statuses=tuple(statuses),
            errors=errors,
            metrics=metrics,
        )

    def _verify(
        self, jobs: list[_Job], responses: Sequence[str]
    ) -> tuple[np.ndarray, list[str], dict[int, str], dict[str, float]]:
        """Runs every job's verifier: (scores_N, statuses, errors by index, batch metrics)."""
        n = len(jobs)
        scores_N = np.zeros(n, np.float32)
        statuses = ["ok"] * n
        errors: dict[int, str] = {}
        batched: dict[str, list[_Job]] = defaultdict(list)
        for job in jobs:
            if job.verifier in BATCHED:
                batched[job.verifier].append(job)
        batch_futures = [
            self._threads.submit(self._score_batched, name, group, responses)
            for name, group in batched.items()
        ]
        futures = {
            j.index: self._submit(j, responses[j.index]) for j in jobs if j.verifier not in BATCHED
        }
        batch_metrics: dict[str, float] = {}
        results: dict[int, CallResult] = {}
        for batch_future in batch_futures:
            done, failed, metrics = batch_future.result()
            results |= done
            batch_metrics |= metrics
            futures |= {j.index: self._submit(j, responses[j.index]) for j in failed}
        results |= {index: future.result() for index, future in futures.items()}
        for index, result in results.items():
            score, status, error = _checked_score(result)
            scores_N[index] = score
            statuses[index] = status
            if status != "ok":
                errors[index] = f"{jobs[index].verifier}: {error}"
        self._log_errors(errors)
        return scores_N, statuses, errors, batch_metrics

    def _submit(self, job: _Job, response: str) -> Future[CallResult]:
        return self._threads.submit(
            self._pool.call,
            job.target,
            (response, job.ground_truth),
            job.kwargs,
            timeout_s=self.timeout_s,
        )

    def _score_batched(
        self, name: str, jobs: list[_Job], responses: Sequence[str]
    ) -> tuple[dict[int, CallResult], list[_Job], dict[str, float]]:
        """Scores the rows of batched verifier `name`, one `score_rows` call per distinct kwargs.

        Returns results by sample index, the jobs to retry one by one in the pool (a judge
        batch that raised), and the batch counters as `rewards/<name>/<counter>` metrics.
        """
        module = importlib.import_module(f"rlvr_jax.rewards.{name}")
        groups: dict[str, list[_Job]] = defaultdict(list)
        for job in jobs:
            groups[repr(sorted(_options(job).items()))].append(job)
        results: dict[int, CallResult] = {}
        failed: list[_Job] = []
        counts = dict.fromkeys(module.COUNTERS, 0)
        for group in groups.values():
            try:
                rows = module.score_rows(
                    [responses[j.index] for j in group],
                    [j.ground_truth for j in group],
                    prompts=[j.kwargs["prompt"] for j in group],
                    **_options(group[0]),
                )
            except Exception as e:
                logger.warning("%s batch of %d failed: %s", name, len(group), e)
                if BATCHED[name]:
                    failed.extend(group)
                else:
                    error = f"batch failed: {type(e).__name__}: {e}"
                    results |= {j.index: CallResult("error", error=error) for j in group}
                continue
            for key, value in rows.counts.items():
                counts[key] = counts.get(key, 0) + value
            for job, score, status, error in zip(group, rows.scores, rows.statuses, rows.errors):
                ok = status == "ok"
                results[job.index] = CallResult(status, score if ok else None, "" if ok else error)
        metrics = {f"rewards/{name}/{key}": float(value) for key, value in counts.items()}
        return results, failed, metrics

    @staticmethod
    def _log_errors(errors: dict[int, str]) -> None:
        for index in sorted(errors)[:_MAX_LOGGED_ERRORS]:
            logger.warning("reward of sample %d is 0: %s", index, errors[index])
        if len(errors) > _MAX_LOGGED_ERRORS:
            logger.warning("... and %d more failed samples", len(errors) - _MAX_LOGGED_ERRORS)

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stops the worker processes and threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pool.close()
        self._threads.shutdown(wait=True)

    def __enter__(self) -> RewardService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _metrics(
    jobs: list[_Job], rewards_N: np.ndarray, scores_N: np.ndarray, statuses: list[str]
) -> dict[str, float]:
    """Per-domain reward means and per-verifier score means, counts, timeouts and errors."""
    metrics: dict[str, float] = {
        "reward/mean": float(rewards_N.mean()) if len(jobs) else 0.0,
        "rewards/timeouts": float(statuses.count("timeout")),
        "rewards/errors": float(statuses.count("error")),
    }
    by_domain: dict[str, list[int]] = defaultdict(list)
    by_verifier: dict[str, list[int]] = defaultdict(list)
    for job in jobs:
        by_domain[job.domain].append(job.index)
        by_verifier[job.verifier].append(job.index)
    for domain, idx in by_domain.items():
        metrics[f"reward/{domain}"] = float(rewards_N[idx].mean())
    for verifier, idx in by_verifier.items():
        prefix = f"rewards/{verifier}"
        metrics[f"{prefix}/mean"] = float(scores_N[idx].mean())
        metrics[f"{prefix}/count"] = float(len(idx))
        metrics[f"{prefix}/timeouts"] = float(sum(statuses[i] == "timeout" for i in idx))
        metrics[f"{prefix}/errors"] = float(sum(statuses[i] == "error" for i in idx))
    return metrics
