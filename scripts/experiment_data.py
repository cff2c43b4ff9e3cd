"""What the arms of an experiment train on (`experiment_common` runs them): the probe's
filtered training sources, the training rows and their prompt lengths, and an arm's budget,
training FLOPs and curves from its runs' metrics rows (`account`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def probe_overrides(cfg: Any, probe: str, data_dir: Path) -> list[str]:
    """`data.sources` rewritten without the `probe` domain's rows (JSONL sources only)."""
    if cfg.sft.sources:
        raise ValueError("--probe filters data.sources; sft.sources is set: filter it yourself")
    sources = []
    for i, src in enumerate(cfg.data.sources):
        path = Path(src.path)
        if not path.name.endswith((".jsonl", ".jsonl.gz")) or path.name.endswith(".gz"):
            raise ValueError(f"--probe: data.sources[{i}] {path} is not a .jsonl file")
        lines = [x for x in path.read_text().splitlines() if x.strip()]
        kept = [x for x in lines if domain_of(json.loads(x), src.domain) != probe]
        target = data_dir / f"{i}_{path.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(x + "\n" for x in kept))
        sources.append(
            {"path": str(target.absolute()), "weight": src.weight, "name": src.name or path.stem}
        )
    evals = {
        domain_of(json.loads(x), s.domain)
        for s in cfg.data.eval_sources
        for x in Path(s.path).read_text().splitlines()
        if x.strip()
    }
    if probe not in evals:
        raise ValueError(
            f"--probe {probe}: no held-out row has that domain (domains: {sorted(evals)})"
        )
    return [f"data.sources={json.dumps(sources)}"]


def domain_of(row: dict[str, Any], default: str | None) -> str:
    return row.get("domain") or default or row.get("verifier", "")


def training_rows(cfg: Any, tokenizer: Any) -> list[Any]:
    """The rows of `data.sources` the trainer would load (`PromptRow`s; `.index` is the line)."""
    from rlvr_jax.data import load_sources
    from rlvr_jax.data.formatting import prompt_length_fn
    from rlvr_jax.rewards import known_verifiers

    length = prompt_length_fn(tokenizer, cfg.data.prompt_template)
    loaded = load_sources(
        cfg.data.sources,
        known_verifiers=known_verifiers(),
        token_length=length,
        max_prompt_len=cfg.data.max_prompt_len,
    )
    return [r for s in loaded for r in s.rows]


_PROMPT_TOKENS: dict[tuple, float] = {}


def prompt_tokens(cfg: Any, tokenizer_path: Path) -> float:
    """Mean prompt length (tokens, under the run's template) of the training sources."""
    from rlvr_jax.data import load_tokenizer
    from rlvr_jax.data.formatting import prompt_length_fn

    key = (tuple(s.path for s in cfg.data.sources), cfg.data.prompt_template, str(tokenizer_path))
    if key not in _PROMPT_TOKENS:
        tokenizer = load_tokenizer(cfg.model.tokenizer or tokenizer_path)
        length = prompt_length_fn(tokenizer, cfg.data.prompt_template)
        lengths = [length(r) for r in training_rows(cfg, tokenizer)]
        _PROMPT_TOKENS[key] = sum(lengths) / max(1, len(lengths))
    return _PROMPT_TOKENS[key]


def account(ctx: Any, phases: list[tuple[str, Any, list[dict]]]) -> dict[str, Any]:
    """An arm's budget and per-step curves from its runs' metrics rows.

    Training FLOPs use the bench's FLOP model (`rlvr_jax.bench.common.token_flops`, 2·P per
    token + attention): rollout decode = every generated completion's (prompt + response)
    tokens at the mean context (as `rlvr-bench decode` counts); learner = 3 × the forward of
    the trained sequences (`train_flops`: forward + backward over kept groups' prompt and
    response tokens; SFT examples likewise); the old-log-prob forward (a forward of the trained
    sequences) only where it runs (`train.updates_per_batch` > 1), also reported alone. Prompt
    lengths are the training sources' mean; padding is not counted."""
    from rlvr_jax.bench.common import forward_flops, token_flops, train_flops
    from rlvr_jax.models.config import ArchConfig

    arch = ArchConfig.from_hf(json.loads((ctx.base / "config.json").read_text()))
    budget = dict.fromkeys(
        (
            "updates",
            "rl_prompts",
            "rl_completions",
            "samples",
            "trained_groups",
            "sft_examples",
            "flops",
            "decode_flops",
            "learner_flops",
            "old_logprob_flops",
        ),
        0.0,
    )
    curve: dict[str, list] = {
        k: [] for k in ("step", "prompts", "samples", "flops", "reward", "eval")
    }
    for algorithm, cfg, rows in phases:
        g, sft_batch = cfg.rollout.num_samples, cfg.sft.batch_size
        lp = prompt_tokens(cfg, ctx.base)
        for r in rows:
            drawn, kept = r.get("groups/drawn", 0.0), r.get("groups/kept", 0.0)
            lr = r.get("response_length/mean", 0.0)
            decode = drawn * g * (lp + lr) * token_flops(arch, lp + lr / 2)
            seq = lp + r.get("tokens", 0.0) / max(1.0, kept * g)
            learner = train_flops(arch, 1, round(seq)) * kept * g if kept else 0.0
            old = (
                forward_flops(arch, 1, round(seq)) * kept * g
                if cfg.train.updates_per_batch > 1
                else 0.0
            )
            if algorithm in ("sft", "rl_sft_parallel"):  # each step also trains an SFT batch
                examples = sft_batch
                budget["sft_examples"] += examples
                sft_seq = lp + r.get("sft/tokens", 0.0) / examples
                learner += train_flops(arch, 1, round(sft_seq)) * examples
            for key, value in (
                ("rl_prompts", drawn),
                ("rl_completions", drawn * g),
                ("trained_groups", kept),
                ("samples", (drawn + r.get("groups/stale_dropped", 0.0)) * g),
                ("decode_flops", decode),
                ("learner_flops", learner),
                ("old_logprob_flops", old),
                ("flops", decode + learner + old),
            ):
                budget[key] += value
            curve["step"].append(len(curve["step"]) + 1)
            for key, name in (
                ("prompts", "rl_prompts"),
                ("samples", "samples"),
                ("flops", "flops"),
            ):
                curve[key].append(budget[name])
            curve["reward"].append(r.get("reward/mean"))
            if any(
                k.startswith("eval/pass@") for k in r
            ):  # an in-loop evaluation (`eval.every_steps`)
                point = {k: curve[k][-1] for k in ("step", "prompts", "samples", "flops")}
                curve["eval"].append(
                    {**point, **{k[5:]: v for k, v in r.items() if k.startswith("eval/pass@")}}
                )
        budget["updates"] += int(rows[-1]["policy_version"]) if rows else 0
    every = [r for _, _, rows in phases for r in rows]
    for key in sorted({k for r in every for k in r if k.startswith("value/")}):
        curve[key] = [r.get(key) for r in every]
    return {"budget": budget, "curve": curve}
