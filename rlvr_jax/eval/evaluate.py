"""Held-out evaluation: n samples per prompt, verified, summarised as pass@k per domain.

Everything samples through a `rollout.Rollout` (`rollout.build_rollout`). `evaluate_rollout` is
the trainer's in-loop evaluation on its own actor rollout; `evaluate_policy` the same for a
policy outside a run. `rlvr-eval` and `rlvr-filter` load a policy (`load_policy`), open its
rollout (`open_rollout`) and count verified-correct samples per prompt
(`sample_correct_counts`); prompt i is seeded with `rollout.request_seed(seed, i)` whatever the
chunking, so the samples are those of one `rollout.generate(..., seed=seed)` over all prompts.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlvr_jax.eval.passk import mean_pass_at_k

if TYPE_CHECKING:
    from rlvr_jax.rollout import Rollout

log = logging.getLogger(__name__)

CORRECT_THRESHOLD = 0.5
"""A sample counts as correct when its verifier score is at least this."""

DEFAULT_CHUNK_PROMPTS = 256
"""Prompts generated per chunk by `sample_correct_counts`."""

ENGINE_LEN_MULTIPLE = 64
"""Engine positions per slot are rounded up to a multiple of this."""


def correct_counts(
    rows: Sequence[Any], completions: Sequence[Any], texts: Sequence[str], reward_service
) -> tuple[np.ndarray, list[str], dict[str, float]]:
    """Counts of verified-correct samples and the domain of each prompt that `completions`
    cover (`c.prompt_index` indexes `rows`), in prompt-index order, and the service's metrics."""
    by_prompt: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(completions):
        by_prompt[c.prompt_index].append(i)
    flat_rows = [rows[c.prompt_index] for c in completions]
    dict_rows = [r.to_dict() if hasattr(r, "to_dict") else dict(r) for r in flat_rows]
    result = reward_service.score(dict_rows, list(texts))
    ok = result.verifier_scores >= CORRECT_THRESHOLD
    counts = np.array([int(ok[idx].sum()) for _, idx in sorted(by_prompt.items())])
    domains = [result.domains[idx[0]] for _, idx in sorted(by_prompt.items())]
    return counts, domains, dict(result.metrics)


def summarise(
    counts: np.ndarray, domains: Sequence[str], n: int, ks: Sequence[int], prefix: str = ""
) -> dict[str, float]:
    """`<prefix>pass@k` over all prompts and `<prefix><domain>/pass@k` per domain (k <= n)."""
    report = pass_at_k_report(counts, domains, n, [k for k in ks if k <= n])
    out: dict[str, float] = {}
    for k, value in report["pass@k"].items():
        out[f"{prefix}pass@{k}"] = value
        for d, values in report["per_domain"].items():
            out[f"{prefix}{d}/pass@{k}"] = values[k]
    return out


def pass_at_k_report(
    counts_P: np.ndarray, domains: Sequence[str], n: int, ks: Sequence[int]
) -> dict[str, dict]:
    """`{"pass@k": {"1": ..}, "per_domain": {domain: {"1": ..}}}`: the mean unbiased pass@k
    over all P prompts and over each domain's prompts, from `counts_P[i]` correct of `n`.

    Raises:
      ValueError: no prompts, mismatched lengths, or a k outside [1, n].
    """
    counts = [int(c) for c in np.asarray(counts_P).reshape(-1)]
    if not counts:
        raise ValueError("pass_at_k_report: no prompts")
    if len(domains) != len(counts):
        raise ValueError(f"pass_at_k_report: {len(counts)} counts but {len(domains)} domains")
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(f"pass_at_k_report: k={bad} needs 1 <= k <= n={n}")
    by_domain: dict[str, list[int]] = defaultdict(list)
    for c, d in zip(counts, domains):
        by_domain[d].append(c)
    return {
        "pass@k": {str(k): mean_pass_at_k(counts, n, k) for k in ks},
        "per_domain": {
            d: {str(k): mean_pass_at_k(by_domain[d], n, k) for k in ks} for d in sorted(by_domain)
        },
    }


def format_pass_at_k_table(report: dict[str, dict], prompts_per_domain: dict[str, int]) -> str:
    """The report of `pass_at_k_report` as a text table: one row per domain, then `all`."""
    ks = list(report["pass@k"])
    width = max(10, *(len(d) for d in report["per_domain"]))
    header = f"{'domain':<{width}} {'prompts':>8}" + "".join(f" {'pass@' + k:>9}" for k in ks)
    lines = [header, "-" * len(header)]
    for d, values in report["per_domain"].items():
        cells = "".join(f" {values[k]:>9.4f}" for k in ks)
        lines.append(f"{d:<{width}} {prompts_per_domain[d]:>8d}{cells}")
    total = sum(prompts_per_domain.values())
    cells = "".join(f" {report['pass@k'][k]:>9.4f}" for k in ks)
    lines.append(f"{'all':<{width}} {total:>8d}{cells}")
    return "\n".join(lines)


# -- sampling a policy through a rollout ---------------------------------------------------


@dataclass(frozen=True)
class SampledCounts:
    """What `sample_correct_counts` measured over P prompts."""

    counts_P: np.ndarray
    """int64[P]: samples per prompt whose verifier score is ≥ `CORRECT_THRESHOLD`."""
    domains: tuple[str, ...]
    """Domain of each prompt."""
    generated_tokens: int
    """Tokens generated over all samples (stop tokens included)."""
    truncated: int
    """Samples cut off by `max_new_tokens` (finish reason "length")."""
    verifier_timeouts: int
    """Samples whose verifier timed out (scored 0)."""
    verifier_errors: int
    """Samples whose verifier failed (scored 0)."""
    generate_s: float
    """Wall time spent generating."""
    verify_s: float
    """Time the reward service spent verifying (overlaps generation)."""

    def stats(self, num_samples: int) -> dict[str, Any]:
        """The JSON report keys `rlvr-eval` and `rlvr-filter` share: truncation, verifier
        failures, tokens and times."""
        return {
            "truncated_fraction": self.truncated / (len(self.counts_P) * num_samples),
            "verifier": {"timeouts": self.verifier_timeouts, "errors": self.verifier_errors},
            "generated_tokens": self.generated_tokens,
            "generate_s": self.generate_s,
            "verify_s": self.verify_s,
        }


def resolve_config(
    path: str | None, overrides: Sequence[str], model_path: str | None = None
) -> Any:
    """The `Config` of a command line: `path` with its dotted `overrides`, and `model_path`
    (when given) as `model.path`, never built (`model.create_if_missing` is cleared).

    Raises:
      ConfigError: the file or an override is invalid (naming the key and the file).
    """
    import json

    from rlvr_jax.config import load

    extra = []
    if model_path is not None:
        extra = [f"model.path={json.dumps(model_path)}", "model.create_if_missing=null"]
    return load(path, [*overrides, *extra])


def actor_mesh(cfg: Any) -> Any:
    """The actor sub-mesh of `cfg.mesh` over the devices a training run of `cfg` would use."""
    from rlvr_jax import sharding

    return sharding.actor_mesh(cfg.mesh)


def load_policy(cfg: Any) -> tuple[Any, Any]:
    """(model, tokenizer) of `cfg.model`, params laid out for decoding on the actor sub-mesh
    of `cfg.mesh` (`actor_mesh`), the model built first when `model.create_if_missing` says
    so."""
    from rlvr_jax import models, sharding
    from rlvr_jax.data import load_tokenizer
    from rlvr_jax.models.bootstrap import ensure_model

    path = ensure_model(cfg)
    model = models.load_pretrained(
        path,
        dtype=cfg.model.param_dtype,
        compute_dtype=cfg.model.compute_dtype,
        mesh=actor_mesh(cfg),
        rules=sharding.ACTOR_RULES,
    )
    return model, load_tokenizer(cfg.model.tokenizer or path)


def open_rollout(cfg: Any, model: Any, tokenizer: Any, longest_prompt: int) -> Rollout:
    """The config's rollout for `model` on its mesh, started, its slots holding
    `longest_prompt` + `rollout.max_new_tokens` tokens (rounded up to `ENGINE_LEN_MULTIPLE`).

    Raises:
      ValueError: that exceeds the model's max_position_embeddings.
    """
    from rlvr_jax.rollout import build_rollout

    new = cfg.rollout.max_new_tokens
    limit = model.config.max_position_embeddings
    if longest_prompt + new > limit:
        raise ValueError(
            f"the longest prompt ({longest_prompt} tokens) + rollout.max_new_tokens={new} "
            f"exceeds the model's max_position_embeddings={limit}"
        )
    max_len = -(-(longest_prompt + new) // ENGINE_LEN_MULTIPLE) * ENGINE_LEN_MULTIPLE
    return build_rollout(cfg.rollout, model, model.mesh, tokenizer, max_len=max_len).start()


def sample_correct_counts(
    rollout: Rollout,
    rows: Sequence[Any],
    prompts: Sequence[Sequence[int]],
    *,
    tokenizer: Any,
    reward_service: Any,
    num_samples: int,
    sampling: Any,
    seed: int,
    chunk_prompts: int = DEFAULT_CHUNK_PROMPTS,
    version: int | None = None,
    turns: Sequence[Any] | None = None,
) -> SampledCounts:
    """Samples `num_samples` completions of each of `prompts` (token ids) through `rollout`
    and counts those `rows[i]` verifies as correct.

    Chunk c+1 of `chunk_prompts` prompts generates while chunk c is verified; prompt i samples
    with `rollout.request_seed(seed, i)`, so the chunking changes nothing. `version` pins the
    requests to that policy version; `turns[i]` (from `env_prompts`) runs prompt i's samples as
    multi-turn episodes, verified on their final answers.
    """
    from rlvr_jax.envs.episode import answer_text
    from rlvr_jax.rollout import sample_groups

    if len(rows) != len(prompts):
        raise ValueError(f"{len(rows)} rows but {len(prompts)} prompts")
    if chunk_prompts < 1:
        raise ValueError(f"chunk_prompts must be >= 1, got {chunk_prompts}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    P = len(prompts)
    counts_P = np.zeros(P, np.int64)
    domains = [""] * P
    totals = defaultdict(float)
    start_time = time.perf_counter()

    def collect(start: int, future: Future) -> None:
        counts, chunk_domains, metrics = future.result()
        counts_P[start : start + len(counts)] = counts
        domains[start : start + len(counts)] = chunk_domains
        for key in ("rewards/timeouts", "rewards/errors", "time/reward_s"):
            totals[key] += metrics[key]
        done = start + len(counts)
        elapsed = time.perf_counter() - start_time
        log.info("%d/%d prompts sampled and verified (%.1f s)", done, P, elapsed)

    pending: tuple[int, Future] | None = None
    with ThreadPoolExecutor(1, thread_name_prefix="rlvr-verify") as verifier:
        for start in range(0, P, chunk_prompts):
            t0 = time.perf_counter()
            groups = sample_groups(
                rollout,
                prompts[start : start + chunk_prompts],
                num_samples=num_samples,
                seed=seed,
                sampling=sampling,
                version=version,
                first_index=start,
                key="eval",
                turns=None if turns is None else turns[start : start + chunk_prompts],
            )
            completions = [
                dataclasses.replace(c, prompt_index=start + j)
                for j, g in enumerate(groups)
                for c in g.completions
            ]
            totals["generate_s"] += time.perf_counter() - t0
            totals["tokens"] += sum(len(c.tokens) for c in completions)
            totals["truncated"] += sum(c.finish_reason == "length" for c in completions)
            texts = [answer_text(c, tokenizer) for c in completions]
            if pending is not None:
                collect(*pending)
            future = verifier.submit(correct_counts, rows, completions, texts, reward_service)
            pending = (start, future)
        if pending is not None:
            collect(*pending)
    return SampledCounts(
        counts_P=counts_P,
        domains=tuple(domains),
        generated_tokens=int(totals["tokens"]),
        truncated=int(totals["truncated"]),
        verifier_timeouts=int(totals["rewards/timeouts"]),
        verifier_errors=int(totals["rewards/errors"]),
        generate_s=totals["generate_s"],
        verify_s=totals["time/reward_s"],
    )


def env_prompts(
    cfg: Any,
    rows: Sequence[Any],
    tokenizer: Any,
    stop_token_ids: Sequence[int],
    max_prompt_len: int | None = None,
) -> tuple[list[Any], list[list[int]], list[Any] | None, Any]:
    """(rows, their prompt ids, their multi-turn hooks, the `envs.EnvRunner` to close): with
    `env.name` set, the environment renders each prompt (rows whose prompt then exceeds
    `max_prompt_len`, when given, are left out) and its hook runs the episodes; otherwise
    the prompts are `data.prompt_template`'s and there are no hooks."""
    from rlvr_jax.data.formatting import format_prompt

    if cfg.env.name is None:
        prompts = [format_prompt(r, tokenizer, cfg.data.prompt_template) for r in rows]
        return list(rows), prompts, None, None
    from rlvr_jax.envs import EnvRunner

    runner = EnvRunner(
        cfg.env,
        tokenizer,
        max_new_tokens=cfg.rollout.max_new_tokens,
        stop_token_ids=stop_token_ids,
    )
    limit = max_prompt_len or float("inf")
    kept = [(r, g) for r in rows if len((g := runner.group(r)).prompt_ids) <= limit]
    groups = [g for _, g in kept]
    return [r for r, _ in kept], [g.prompt_ids for g in groups], groups, runner


def _stop_ids(cfg: Any, model: Any, tokenizer: Any) -> tuple[int, ...]:
    from rlvr_jax.data.formatting import stop_token_ids

    return stop_token_ids(model.config, tokenizer, cfg.rollout.stop_strings)


def sample_rows(
    cfg: Any, model: Any, tokenizer: Any, rows: Sequence[Any], *, temperature: float, **options
) -> SampledCounts:
    """`sample_correct_counts` (`options`) of `rows` (formatted with `data.prompt_template`)
    through the config's rollout (`open_rollout`) at `temperature`, top-p 1, verified by
    `cfg.rewards`."""
    from rlvr_jax.rewards import RewardService
    from rlvr_jax.rollout import SamplingParams

    rows, prompts, turns, runner = env_prompts(
        cfg, rows, tokenizer, _stop_ids(cfg, model, tokenizer)
    )
    rollout = open_rollout(cfg, model, tokenizer, max(len(p) for p in prompts))
    sampling = SamplingParams(temperature=temperature, top_p=1.0)
    try:
        with RewardService(cfg.rewards) as rewards:
            return sample_correct_counts(
                rollout,
                rows,
                prompts,
                tokenizer=tokenizer,
                reward_service=rewards,
                sampling=sampling,
                turns=turns,
                **options,
            )
    finally:
        rollout.close()
        if runner is not None:
            runner.close()


# -- held-out evaluation -------------------------------------------------------------------


def _held_out_rows(cfg: Any, tokenizer: Any, rows: Sequence[Any] | None) -> list[Any]:
    """`rows`, by default `data.eval_sources`'s, cut to `eval.max_prompts`."""
    from rlvr_jax.data import load_eval_rows
    from rlvr_jax.rewards import known_verifiers

    if rows is None:
        rows = load_eval_rows(cfg.data, tokenizer=tokenizer, known_verifiers=known_verifiers())
    return list(rows)[: cfg.eval.max_prompts]


def evaluate_rollout(
    rollout: Rollout,
    tokenizer: Any,
    cfg: Any,
    *,
    reward_service: Any,
    rows: Sequence[Any] | None = None,
    prefix: str = "eval/",
    seed: int | None = None,
    version: int | None = None,
) -> dict[str, float]:
    """pass@k on the held-out rows (`data.eval_sources`, at most `eval.max_prompts`):
    `eval.num_samples` samples per prompt at `eval.temperature`, top-p 1, through `rollout`
    (the trainer's actor rollout), seeded by `seed` (default `eval.seed`) as `rlvr-eval` does,
    pinned to policy `version` when given."""
    from rlvr_jax.rollout import SamplingParams

    rows = _held_out_rows(cfg, tokenizer, rows)
    if not rows:
        raise ValueError("evaluation: no held-out rows (set data.eval_sources)")
    rows, prompts, turns, runner = env_prompts(
        cfg, rows, tokenizer, rollout.stop_token_ids, cfg.data.max_prompt_len
    )
    n = cfg.eval.num_samples
    t0 = time.perf_counter()
    try:
        sampled = sample_correct_counts(
            rollout,
            rows,
            prompts,
            tokenizer=tokenizer,
            reward_service=reward_service,
            num_samples=n,
            sampling=SamplingParams(temperature=cfg.eval.temperature, top_p=1.0),
            seed=cfg.eval.seed if seed is None else seed,
            version=version,
            turns=turns,
        )
    finally:
        if runner is not None:
            runner.close()
    out = summarise(sampled.counts_P, sampled.domains, n, cfg.eval.ks, prefix)
    out[f"{prefix}time_s"] = time.perf_counter() - t0
    out[f"{prefix}prompts"] = float(len(rows))
    out[f"{prefix}generated_tokens"] = float(sampled.generated_tokens)
    return out


def evaluate_policy(
    model,
    tokenizer,
    cfg,
    *,
    reward_service,
    rows: Sequence[Any] | None = None,
    prefix: str = "eval/",
    seed: int | None = None,
) -> dict[str, float]:
    """`evaluate_rollout` of `model` (a policy outside a training run, e.g. a checkpoint)
    through the config's rollout on the model's mesh (`open_rollout`)."""
    rows = _held_out_rows(cfg, tokenizer, rows)
    rows, prompts, _, runner = env_prompts(cfg, rows, tokenizer, _stop_ids(cfg, model, tokenizer))
    if runner is not None:
        runner.close()
    longest = max((len(p) for p in prompts), default=1)
    rollout = open_rollout(cfg, model, tokenizer, longest)
    try:
        return evaluate_rollout(
            rollout,
            tokenizer,
            cfg,
            reward_service=reward_service,
            rows=rows,
            prefix=prefix,
            seed=seed,
        )
    finally:
        rollout.close()
