"""The random inputs benchmarks run on: the bench model as an HF twin and ours (`build_models`),
RL learner batches and the trainer's step compiled on one."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_jax.bench import common


def build_models(cfg: Any, path: str | Path) -> tuple[Any, Any]:
    """(HF torch model, our `Model`) of the bench model of `cfg`, the same random weights: HF's
    init (on CUDA when JAX and torch see a GPU) saved at `path` in `cfg.dtype`, loaded back as
    ours. torch's OpenMP threads sleep (`OMP_WAIT_POLICY=PASSIVE` unless set): spinning made
    `generate` up to 10x slower on a shared machine, which would flatter our engine."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import jax
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr_jax.models import load_pretrained

    torch.manual_seed(cfg.seed)
    hf_cfg = dict(common.hf_config_dict(cfg))
    config = AutoConfig.for_model(hf_cfg.pop("model_type"), **hf_cfg)
    on_gpu = jax.default_backend() == "gpu" and torch.cuda.is_available()
    with torch.device("cuda" if on_gpu else "cpu"):
        hf = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, cfg.dtype)).eval()
    hf.save_pretrained(path)
    return hf, load_pretrained(path, dtype=cfg.dtype)


def random_sample(rng: np.random.Generator, vocab: int, n_prompt: int, n: int) -> Any:
    """One RL sample (`batch.Sample`) of `n_prompt` prompt and `n` completion tokens: random
    tokens, sampler log-probs near a random model's −log V, an advantage ~ N(0, 1)."""
    from rlvr_jax.training.batch import Sample

    return Sample(
        prompt_tokens=rng.integers(0, vocab, n_prompt).tolist(),
        tokens=rng.integers(0, vocab, n).tolist(),
        sampler_logp=(-np.log(vocab) + 0.1 * rng.standard_normal(n)).tolist(),
        advantage=float(rng.standard_normal()),
    )


def synthetic_batch(arch: Any, *, rows: int, seq: int, seed: int, with_old_logp: bool) -> Any:
    """A learner batch (`RLBatch`, numpy, T = `seq`) from `collate`: prompts of 1..seq/4 tokens,
    completions filling a random 25..100% of the rest, right-padded."""
    from rlvr_jax.training.batch import collate

    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(rows):
        n_prompt = int(rng.integers(1, max(seq // 4, 1) + 1))
        room = seq + 1 - n_prompt
        n = int(rng.integers(max(room // 4, 1), room + 1))
        samples.append(random_sample(rng, arch.vocab_size, n_prompt, n))
    batch = collate(samples, rows=rows, seq_len=seq + 1, pad_id=0)
    if with_old_logp:
        noise = 0.05 * rng.standard_normal(batch.mask_BxT.shape).astype(np.float32)
        batch = batch.replace(old_logp_BxT=batch.sampler_logp_BxT + noise * batch.mask_BxT)
    return batch


def train_step(cfg: Any, memory: Any, *, max_len: int, n_micro: int | None) -> tuple[Any, Any]:
    """(the trainer's step of the bench model of `cfg` with loss preset `cfg.loss`, AdamW)."""
    import jax.numpy as jnp

    from rlvr_jax import losses
    from rlvr_jax.config.schema import TrainConfig
    from rlvr_jax.training import learner
    from rlvr_jax.training.optimizer import make_optimizer

    optimizer = make_optimizer(TrainConfig())
    step = learner.make_train_step(
        cfg.arch(), optimizer, losses.resolve_loss_settings(cfg.loss), max_len=max_len,
        n_micro=n_micro, compute_dtype=jnp.dtype(cfg.dtype), memory=memory,
    )  # fmt: skip
    return step, optimizer


def compiled_train_step(
    cfg: Any, arrays: Any, *, max_len: int, n_micro: int | None, seed: int, params: Any = None
) -> Any:
    """`train_step` on `arrays`, compiled ahead of time: (call, compiled, compile_s, holder,
    optimizer), `call()` running one step (the state carried in `holder["state"]`) and
    returning its metrics."""
    import jax
    import jax.numpy as jnp

    from rlvr_jax import models
    from rlvr_jax.training import learner
    from rlvr_jax.training.packing import MAX_SEQS_PER_ROW

    if params is None:
        params = models.init_params(cfg.arch(), jax.random.key(seed))
    batch = jax.tree.map(jnp.asarray, arrays)
    packed = int(np.max(arrays.tokens.segment_ids_BxT)) > 1
    memory = dataclasses.replace(cfg.memory(), max_segments=MAX_SEQS_PER_ROW if packed else 1)
    step, optimizer = train_step(cfg, memory, max_len=max_len, n_micro=n_micro)
    holder = {"state": learner.init_state(params, optimizer)}
    train, compile_s = common.compile_ahead(step, holder["state"], batch, donate=(0,))

    def call() -> dict[str, Any]:
        holder["state"], metrics = train(holder["state"], batch)
        return jax.block_until_ready(metrics)

    return call, train, compile_s, holder, optimizer
