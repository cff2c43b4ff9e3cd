"""Held-out evaluation: n samples per prompt, verified, summarised as pass@k per domain."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlvr_jax.eval.passk import mean_pass_at_k


def correct_counts(
    rows: Sequence[Any], completions: Sequence[Any], texts: Sequence[str], reward_service
) -> tuple[np.ndarray, list[str], dict[str, float]]:
    """Per-prompt counts of verified-correct samples (verifier score ≥ 0.5 counts as correct;
    verifiers are binary except code 'fraction' and ifeval 'fraction' modes)."""
    by_prompt: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(completions):
        by_prompt[c.prompt_index].append(i)
    flat_rows = [rows[c.prompt_index] for c in completions]
    dict_rows = [r.to_dict() if hasattr(r, "to_dict") else dict(r) for r in flat_rows]
    result = reward_service.score(dict_rows, list(texts))
    ok = result.verifier_scores >= 0.5
    counts = np.array([int(ok[idx].sum()) for _, idx in sorted(by_prompt.items())])
    domains = [result.domains[idx[0]] for _, idx in sorted(by_prompt.items())]
    return counts, domains, dict(result.metrics)


def summarise(
    counts: np.ndarray, domains: Sequence[str], n: int, ks: Sequence[int], prefix: str = ""
) -> dict[str, float]:
    """`<prefix>pass@k` over all prompts and `<prefix><domain>/pass@k` per domain."""
    out: dict[str, float] = {}
    for k in ks:
        if k > n:
            continue
        out[f"{prefix}pass@{k}"] = mean_pass_at_k(counts.tolist(), n, k)
        for d in sorted(set(domains)):
            sel = [c for c, dd in zip(counts.tolist(), domains) if dd == d]
            out[f"{prefix}{d}/pass@{k}"] = mean_pass_at_k(sel, n, k)
    return out


def evaluate_policy(
    model,
    tokenizer,
    cfg,
    *,
    reward_service,
    rows: Sequence[Any] | None = None,
    prefix: str = "eval/",
    seed: int = 12345,
) -> dict[str, float]:
    """pass@k of `model` on the held-out rows (`data.eval_sources`, at most `eval.max_prompts`)
    with `eval.num_samples` samples per prompt at `eval.temperature`, top-p 1."""
    from rlvr_jax import rollout
    from rlvr_jax.data import format_prompt, load_eval_rows
    from rlvr_jax.rewards import known_verifiers

    if rows is None:
        rows = load_eval_rows(cfg.data, tokenizer=tokenizer, known_verifiers=known_verifiers())
    rows = list(rows)[: cfg.eval.max_prompts]
    if not rows:
        raise ValueError("evaluation: no held-out rows (set data.eval_sources)")
    prompts = [format_prompt(r, tokenizer, cfg.data.prompt_template) for r in rows]
    n = cfg.eval.num_samples
    stop = tuple(int(t) for t in (model.config.eos_token_id or ()))
    if tokenizer.eos_token_id is not None:
        stop = tuple(sorted({*stop, int(tokenizer.eos_token_id)}))
    t0 = time.perf_counter()
    completions = rollout.generate(
        model,
        prompts,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.eval.temperature,
        num_samples=n,
        stop_token_ids=stop,
        seed=seed,
        max_slots=cfg.rollout.max_slots,
    )
    texts = [tokenizer.decode(c.tokens, skip_special_tokens=True) for c in completions]
    counts, domains, _ = correct_counts(rows, completions, texts, reward_service)
    out = summarise(counts, domains, n, cfg.eval.ks, prefix)
    out[f"{prefix}time_s"] = time.perf_counter() - t0
    out[f"{prefix}prompts"] = float(len(rows))
    return out
