"""The TRL peer of `rlvr-bench e2e`: the same policy, prompts, batch shape and lengths trained by
TRL's `GRPOTrainer` (PyTorch, HF `generate`) for the same number of optimizer steps. `trl` is
optional (`pip install -e .[trl]`); it, `torch`, `datasets` and `transformers` are imported
only inside `run_trl`.

Matched: the policy (fp32), the training rows after our prompt-length filter, the prompt ids
(checked row by row for the text templates), G, P · G completions per optimizer step,
`max_new_tokens`, the sampling settings, AdamW with our learning rate, schedule, betas, ε,
weight decay and clipping, our clip range, no KL, token-level normalisation (TRL's `dapo`) and
our verifiers' rewards. Not matched: our zero-variance filter and active sampling, TIS, source
mixture weights (TRL draws uniformly), the reward service's workers and timeouts."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr_jax.bench import progress
from rlvr_jax.config.schema import Config, RewardsConfig

SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
"""`train.schedule` → transformers' `lr_scheduler_type` (both warm up over `warmup_steps`)."""

NO_STD_ADVANTAGES = ("olmo", "drgrpo")
"""Our advantage estimators that only centre the rewards (TRL's `scale_rewards="none"`)."""


def grpo_args(cfg: Config, *, max_steps: int, output_dir: Path) -> dict[str, Any]:
    """`GRPOConfig` keyword arguments matching `cfg`'s batch shape, lengths, sampling and
    optimizer (one optimizer step = P · G / `updates_per_batch` completions)."""
    from rlvr_jax.losses import loss_settings_from_config

    prompts, group = cfg.train.prompts_per_batch, cfg.rollout.num_samples
    updates = cfg.train.updates_per_batch
    if (prompts * group) % updates:
        raise ValueError(
            f"train.updates_per_batch={updates} must divide the batch of "
            f"{prompts} × {group} completions"
        )
    loss = loss_settings_from_config(cfg.loss)
    eps_low = 0.2 if loss.eps_low is None else loss.eps_low
    return {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": prompts * group // updates,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": updates,
        "num_generations": group,
        "max_completion_length": cfg.rollout.max_new_tokens,
        "temperature": cfg.rollout.temperature,
        "top_p": cfg.rollout.top_p,
        "top_k": cfg.rollout.top_k,
        "learning_rate": cfg.train.learning_rate,
        "lr_scheduler_type": SCHEDULES[cfg.train.schedule],
        "warmup_steps": cfg.train.warmup_steps,
        "weight_decay": cfg.train.weight_decay,
        "adam_beta1": cfg.train.adam_b1,
        "adam_beta2": cfg.train.adam_b2,
        "adam_epsilon": cfg.train.adam_eps,
        "max_grad_norm": cfg.train.max_grad_norm,
        "activation_checkpointing": cfg.train.remat,
        "beta": 0.0,
        "loss_type": "dapo",
        "epsilon": eps_low,
        "epsilon_high": eps_low if loss.eps_high is None else loss.eps_high,
        "scale_rewards": "none" if loss.advantage in NO_STD_ADVANTAGES else "group",
        "max_steps": max_steps,
        "logging_strategy": "steps",
        "logging_steps": 1,
        "eval_strategy": "no",
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "seed": cfg.seed,
        "data_seed": cfg.data.seed,
    }


def prompt_records(cfg: Config, tokenizer: Any) -> list[dict[str, Any]]:
    """The training rows our trainer would draw from (after the prompt-length filter) as TRL
    dataset records; ground truths and verifier kwargs as JSON text (Arrow needs one type)."""
    from rlvr_jax.data import format_prompt, load_sources, prompt_length_fn
    from rlvr_jax.data.formatting import plain_text, r1_text

    template = cfg.data.prompt_template
    sources = load_sources(
        cfg.data.sources,
        token_length=prompt_length_fn(tokenizer, template),
        max_prompt_len=cfg.data.max_prompt_len,
    )
    # plain and r1 prompts go to TRL as text (encoded as we do), chat ones as messages
    texts = {"plain": plain_text, "r1": r1_text}
    records = []
    for row in (row for source in sources for row in source.rows):
        if template in texts:
            prompt = texts[template](row)
            ids = tokenizer(prompt)["input_ids"]  # how TRL encodes a text prompt
            if ids != format_prompt(row, tokenizer, template):
                raise ValueError(f"{row.source} row {row.index}: TRL would see other prompt ids")
        else:
            prompt = row.messages()
        records.append(
            {
                "prompt": prompt,
                "ground_truth": json.dumps(row.ground_truth),
                "verifier": row.verifier,
                "domain": row.domain,
                "verifier_kwargs": json.dumps(row.verifier_kwargs),
            }
        )
    return records


def verifier_reward_fn(config: RewardsConfig) -> Callable[..., list[float]]:
    """A TRL reward function: w[domain] · verifier(completion, ground_truth, **kwargs), with our
    service's default verifier kwargs; a verifier that raises scores 0, as in our service."""
    from rlvr_jax.rewards import get_verifier
    from rlvr_jax.rewards.service import verifier_defaults

    def verifier_reward(
        completions: list[Any],
        ground_truth: list[str],
        verifier: list[str],
        domain: list[str],
        verifier_kwargs: list[str],
        **_: Any,
    ) -> list[float]:
        rewards = []
        for completion, truth, name, dom, kwargs in zip(
            completions, ground_truth, verifier, domain, verifier_kwargs, strict=True
        ):
            text = completion if isinstance(completion, str) else completion[-1]["content"]
            try:
                score = float(
                    get_verifier(name)(
                        text,
                        json.loads(truth),
                        **{**verifier_defaults(name, config), **json.loads(kwargs)},
                    )
                )
            except Exception:  # a failing verifier costs the sample, not the run
                score = 0.0
            rewards.append(config.domain_weights.get(dom, 1.0) * score)
        return rewards

    return verifier_reward


def run_trl(
    cfg: Config, *, steps: int, warmup: int, out: Path, use_vllm: bool = False
) -> dict[str, Any]:
    """Trains `warmup + steps` GRPO steps with TRL (`use_vllm`: generating with vLLM colocated);
    steps/s and trained tokens/s over the last `steps`, a step ending at `on_step_end`."""
    import datasets
    import torch
    import transformers
    import trl

    from rlvr_jax.data import load_tokenizer
    from rlvr_jax.models.bootstrap import ensure_model

    path = ensure_model(cfg)
    tokenizer = load_tokenizer(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, local_files_only=True
    )
    args = grpo_args(cfg, max_steps=warmup + steps, output_dir=Path(out) / "trl")
    if use_vllm:
        args.update(use_vllm=True, vllm_mode="colocate")
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    if "activation_checkpointing" not in fields:  # transformers < 5.20 (the vLLM venv's)
        args["gradient_checkpointing"] = args.pop("activation_checkpointing")
    marks: dict[str, Any] = {"begin": None, "steps": []}

    class StepClock(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            marks["begin"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            marks["steps"].append(time.perf_counter())
            progress.line(f"TRL step {state.global_step}/{warmup + steps}")

    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=verifier_reward_fn(cfg.rewards),
        args=trl.GRPOConfig(**args),
        train_dataset=datasets.Dataset.from_list(prompt_records(cfg, tokenizer)),
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    trainer.remove_callback(transformers.PrinterCallback)  # the bench prints its own table
    trainer.train()
    ends = marks["steps"]
    if len(ends) != warmup + steps:
        raise RuntimeError(f"the TRL run stopped after {len(ends)} of {warmup + steps} steps")
    start = ends[warmup - 1] if warmup else marks["begin"]
    timed = [log for log in trainer.state.log_history if log.get("step", 0) > warmup]
    rewards = [log["reward"] for log in timed if log.get("reward") is not None]
    # TRL logs a generation batch's mean completion length once, at the first step that trains
    # on it: × its P · G completions = the tokens those steps trained on (our count's meaning)
    completions = cfg.train.prompts_per_batch * cfg.rollout.num_samples
    lengths = [log["completions/mean_length"] for log in timed if "completions/mean_length" in log]
    tokens = round(sum(lengths) * completions)
    wall = ends[-1] - start
    return {
        "status": "ok",
        "steps_per_s": steps / wall,
        "tokens_per_s": tokens / wall,
        "wall_s": wall,
        "tokens": tokens,
        "trl_version": trl.__version__,
        "steps": steps,
        "warmup": warmup,
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "config": {k: v for k, v in args.items() if k != "output_dir"},
    }
