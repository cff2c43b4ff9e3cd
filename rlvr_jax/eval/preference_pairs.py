"""Delta-learning preference pairs (OLMo 3 Think DPO): chosen from a strong model, verified;
rejected from a weak model.

    report = build_pairs(cfg, "prompts.jsonl", "pairs.jsonl", strong="runs/sft/final",
                         weak="runs/cache/demo_base", num_samples=4)

Both models sample `num_samples` completions of every input prompt through the config's
rollout at `rollout.temperature`, top-p 1, prompt i seeded with `rollout.request_seed(seed, i)`;
the reward service (`cfg.rewards`) scores every sample. For each prompt:

- chosen: the strong model's first sample whose verifier score is ≥ 0.5 (verified correct);
- rejected: the weak model's first sample scored < 0.5 (`rejected="incorrect"`, the default:
  the largest delta), or its first sample whatever its score (`"any"`: OLMo 3 keeps the weak
  model's responses unfiltered), different from the chosen text.

Prompts without a pair are counted by reason. Each pair is a JSON line `{"prompt", "chosen",
"rejected", ...}` (`dpo.sources`) with the row's fields and both scores; a response is stored
without the template's separator (`formatting.RESPONSE_SEPARATORS`), so that `encode_response`
lays it out as it was sampled.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_jax.eval.evaluate import CORRECT_THRESHOLD

log = logging.getLogger(__name__)

REJECTED_MODES = ("incorrect", "any")
"""How the rejected response is picked among the weak model's samples."""


@dataclass(frozen=True)
class Sampled:
    """One model's samples of P prompts, decoded and scored."""

    texts: list[list[str]]
    """[P][n] completion texts (the template's separator removed)."""
    scores: np.ndarray
    """float32[P, n]: verifier scores in [0, 1]."""
    truncated: np.ndarray
    """bool[P, n]: cut off by `rollout.max_new_tokens`."""
    generate_s: float
    verify_s: float


@dataclass(frozen=True)
class PairsReport:
    """What one `build_pairs` run did; `to_json()` is `rlvr-prefs --json`'s content."""

    input: str
    output: str
    strong: str
    weak: str
    prompts: int
    """Prompts sampled (the input's usable rows, at most `max_prompts`)."""
    pairs: int
    """Pairs written."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Prompts without a pair, by reason (`no_verified_chosen`, `no_rejected`)."""
    input_skipped: dict[str, int] = field(default_factory=dict)
    """Input rows the loader skipped, by reason (bad rows, prompts over the length limit)."""
    per_domain: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per domain: prompts, pairs, each model's pass@1 (mean verified fraction)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Settings and timings."""

    def to_json(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "output": self.output,
            "strong": self.strong,
            "weak": self.weak,
            "prompts": self.prompts,
            "pairs": self.pairs,
            "skipped": dict(sorted(self.skipped.items())),
            "input_skipped": dict(sorted(self.input_skipped.items())),
            "per_domain": self.per_domain,
            **self.extra,
        }

    def summary(self) -> str:
        lines = [
            f"{self.prompts} prompts: {self.pairs} pairs written to {self.output}"
            + "".join(f", {n} {k}" for k, n in sorted(self.skipped.items()))
        ]
        for d, v in self.per_domain.items():
            lines.append(
                f"  {d}: {v['pairs']:.0f}/{v['prompts']:.0f} pairs; pass@1 strong "
                f"{v['strong_pass@1']:.3f}, weak {v['weak_pass@1']:.3f}"
            )
        return "\n".join(lines)


def strip_separator(text: str, template: str) -> str:
    """`text` without the template's response separator at its start (when it has it)."""
    from rlvr_jax.data.formatting import RESPONSE_SEPARATORS

    sep = RESPONSE_SEPARATORS[template]
    return text[len(sep) :] if sep and text.startswith(sep) else text


def sample_model(
    cfg: Any,
    path: str,
    rows: list[Any],
    *,
    num_samples: int,
    seed: int,
    reward_service: Any,
    label: str,
    progress: bool = True,
) -> Sampled:
    """Loads the policy at `path` (on the actor mesh of `cfg.mesh`), samples every row's prompt
    `num_samples` times, decodes and scores the samples, and releases the model."""
    from tqdm import tqdm

    from rlvr_jax.data.formatting import format_prompt
    from rlvr_jax.eval.evaluate import load_policy, open_rollout
    from rlvr_jax.rollout import SamplingParams, sample_groups

    cfg = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, path=path, create_if_missing=None)
    )
    model, tokenizer = load_policy(cfg)
    template = cfg.data.prompt_template
    prompts = [format_prompt(r, tokenizer, template) for r in rows]
    rollout = open_rollout(cfg, model, tokenizer, max(len(p) for p in prompts))
    sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=1.0)
    t0 = time.perf_counter()
    bar = tqdm(total=len(prompts), desc=f"{label} samples", unit="prompt", disable=not progress)
    try:
        with bar:
            groups = sample_groups(
                rollout,
                prompts,
                num_samples=num_samples,
                seed=seed,
                sampling=sampling,
                on_group=lambda i, g: bar.update(1),
            )
    finally:
        rollout.close()
    generate_s = time.perf_counter() - t0
    completions = [c for g in groups for c in g.completions]
    texts = [tokenizer.decode(c.tokens, skip_special_tokens=True) for c in completions]
    log.info("%s: verifying %d samples", label, len(texts))
    t0 = time.perf_counter()
    result = reward_service.score([r.to_dict() for r in rows for _ in range(num_samples)], texts)
    verify_s = time.perf_counter() - t0
    P = len(prompts)
    del model, rollout
    gc.collect()
    return Sampled(
        texts=[
            [strip_separator(t, template) for t in texts[i * num_samples : (i + 1) * num_samples]]
            for i in range(P)
        ],
        scores=np.asarray(result.verifier_scores, np.float32).reshape(P, num_samples),
        truncated=np.array([c.finish_reason == "length" for c in completions]).reshape(
            P, num_samples
        ),
        generate_s=generate_s,
        verify_s=verify_s,
    )


def select_pair(
    strong_texts: list[str],
    strong_scores: np.ndarray,
    weak_texts: list[str],
    weak_scores: np.ndarray,
    *,
    rejected: str = "incorrect",
) -> tuple[int, int] | str:
    """(chosen sample index, rejected sample index) of one prompt, or the reason there is none:
    `no_verified_chosen` or `no_rejected`."""
    if rejected not in REJECTED_MODES:
        raise ValueError(f"rejected must be one of {REJECTED_MODES}, got {rejected!r}")
    verified = [i for i, s in enumerate(strong_scores) if s >= CORRECT_THRESHOLD]
    if not verified:
        return "no_verified_chosen"
    c = verified[0]
    for j, (text, score) in enumerate(zip(weak_texts, weak_scores)):
        if text == strong_texts[c] or not text.strip():
            continue
        if rejected == "any" or score < CORRECT_THRESHOLD:
            return c, j
    return "no_rejected"


def build_pairs(
    cfg: Any,
    input_path: str,
    output_path: str,
    *,
    strong: str,
    weak: str,
    num_samples: int = 4,
    seed: int = 0,
    rejected: str = "incorrect",
    max_prompts: int | None = None,
    progress: bool = True,
) -> PairsReport:
    """Samples both models on the prompts of `input_path`, writes the delta-learning pairs to
    `output_path` (JSONL, atomically) and returns the report.

    Raises:
      DataError: a missing, unreadable or empty input (naming it).
      FileNotFoundError: a model directory without config.json.
      ValueError: bad settings (output suffix, n < 1, rejected mode).
    """
    from rlvr_jax.data.synthetic import write_lines
    from rlvr_jax.data.tokenizer import load_tokenizer
    from rlvr_jax.eval.difficulty import check_input_path, check_output_path, load_input
    from rlvr_jax.rewards import RewardService

    t_start = time.perf_counter()
    check_output_path(output_path)
    if num_samples < 1:
        raise ValueError(f"samples per prompt must be >= 1, got {num_samples}")
    if max_prompts is not None and max_prompts < 1:
        raise ValueError(f"max_prompts must be >= 1, got {max_prompts}")
    if rejected not in REJECTED_MODES:
        raise ValueError(f"rejected must be one of {REJECTED_MODES}, got {rejected!r}")
    for what, path in (("strong", strong), ("weak", weak)):
        if not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(f"the {what} model {path!r} has no config.json")
    fmt = check_input_path(input_path)
    tokenizer = load_tokenizer(cfg.model.tokenizer or strong)
    source = load_input(cfg, input_path, fmt, tokenizer)
    rows = list(source.rows)[:max_prompts]
    with RewardService(cfg.rewards) as rewards:
        common = dict(num_samples=num_samples, seed=seed, reward_service=rewards, progress=progress)
        s = sample_model(cfg, strong, rows, label="strong", **common)
        w = sample_model(cfg, weak, rows, label="weak", **common)
    lines, reasons = [], Counter()
    pairs_by_domain: Counter[str] = Counter()
    for i, row in enumerate(rows):
        picked = select_pair(s.texts[i], s.scores[i], w.texts[i], w.scores[i], rejected=rejected)
        if isinstance(picked, str):
            reasons[picked] += 1
            continue
        c, j = picked
        record = {
            "prompt": row.prompt if isinstance(row.prompt, str) else row.messages(),
            "chosen": s.texts[i][c],
            "rejected": w.texts[i][j],
            **{k: v for k, v in row.to_dict().items() if k != "prompt"},
            "chosen_score": float(s.scores[i, c]),
            "rejected_score": float(w.scores[i, j]),
            "source_index": row.index,
        }
        lines.append(json.dumps(record, ensure_ascii=False))
        pairs_by_domain[row.domain] += 1
    write_lines(lines, output_path)
    per_domain = {}
    for d in sorted({r.domain for r in rows}):
        sel = np.array([r.domain == d for r in rows])
        per_domain[d] = {
            "prompts": int(sel.sum()),
            "pairs": pairs_by_domain[d],
            "strong_pass@1": float((s.scores[sel] >= CORRECT_THRESHOLD).mean()),
            "weak_pass@1": float((w.scores[sel] >= CORRECT_THRESHOLD).mean()),
        }
    return PairsReport(
        input=str(input_path),
        output=str(output_path),
        strong=str(strong),
        weak=str(weak),
        prompts=len(rows),
        pairs=len(lines),
        skipped=dict(reasons),
        input_skipped=dict(source.skipped),
        per_domain=per_domain,
        extra={
            "samples": num_samples,
            "rejected": rejected,
            "seed": seed,
            "temperature": cfg.rollout.temperature,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "truncated_fraction": {
                "strong": float(s.truncated.mean()),
                "weak": float(w.truncated.mean()),
            },
            "generate_s": {"strong": s.generate_s, "weak": w.generate_s},
            "verify_s": {"strong": s.verify_s, "weak": w.verify_s},
            "time_s": time.perf_counter() - t_start,
        },
    )
