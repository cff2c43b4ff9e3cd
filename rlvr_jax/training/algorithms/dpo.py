"""`algorithm: dpo`: preference pairs and the DPO learner update (the step is `training/dpo.py`).

    rlvr-train --config F algorithm=dpo dpo.sources='[{path: pairs.jsonl}]' dpo.beta=0.1

`PreferenceSource` draws `dpo.batch_size` pairs per step from the seeded, resumable mixture of
`dpo.sources` and lays them out with `dpo.collate_pairs`, the row length bucketed like the RL
batches'.

Reference log-probs come from the frozen starting policy (`model.path`, also on resume):
- `dpo.reference: cache` (default): computed once up front for every pair and kept on disk
  (`training.dpo_reference.ReferenceCache`), reused by later runs on the same model and data;
- `dpo.reference: on_the_fly`: a reference forward on each batch, for datasets much larger
  than a run will see.
A reference-free variant (`simpo`) computes neither.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax
import numpy as np

from rlvr_jax.config.algorithm_checks import dpo_micro_batches as micro_batch_count
from rlvr_jax.config.schema import Config
from rlvr_jax.data.mixture import PromptIterator
from rlvr_jax.data.preferences import load_preference_sources
from rlvr_jax.losses.preference import needs_reference
from rlvr_jax.models import lora
from rlvr_jax.training import learner
from rlvr_jax.training.algorithms.common import Context, Update
from rlvr_jax.training.batch import bucket_length
from rlvr_jax.training.dpo import PreferenceBatch, collate_pairs, make_dpo_step
from rlvr_jax.training.dpo_reference import ReferenceCache, model_fingerprint
from rlvr_jax.training.optimizer import make_optimizer
from rlvr_jax.training.sources import Batch, StaticWeights

log = logging.getLogger(__name__)

REFERENCE_CACHE_SUBDIR = "reference_cache"
"""`dpo.reference_cache_dir`'s default, under `train.output_dir`."""


class PreferenceSource(StaticWeights):
    """`algorithm: dpo`: `dpo.batch_size` preference pairs per step (`collate_pairs`)."""

    def __init__(
        self, ctx: Context, pairs: PromptIterator, cache: ReferenceCache | None = None
    ) -> None:
        cfg = ctx.cfg
        self.pairs, self.per_batch, self.cache = pairs, cfg.dpo.batch_size, cache
        self.groups, self.full_len = micro_batch_count(cfg), full_length(cfg)
        self.min_len, self.multiple = cfg.train.bucket_min_len, ctx.length_multiple
        self.pad_id = ctx.pad_id
        self.sample_completions = cfg.log.sample_completions

    def next(self, policy_version: int) -> Batch:
        del policy_version
        t0 = time.perf_counter()
        rows = self.pairs.next_batch(self.per_batch)
        prompts = [[int(t) for t in r.prompt_ids] for r in rows]
        chosen = [r.chosen_ids for r in rows]
        rejected = [r.rejected_ids for r in rows]
        longest = max(len(p) + max(len(c), len(r)) for p, c, r in zip(prompts, chosen, rejected))
        length = bucket_length(
            longest, full=self.full_len, min_len=self.min_len, multiple=self.multiple
        )
        refs = {}
        if self.cache is not None:
            refs["ref_chosen"] = [self.cache.get(p, c) for p, c in zip(prompts, chosen)]
            refs["ref_rejected"] = [self.cache.get(p, r) for p, r in zip(prompts, rejected)]
        arrays = collate_pairs(
            prompts,
            chosen,
            rejected,
            rows=2 * self.per_batch,
            seq_len=length + 1,
            pad_id=self.pad_id,
            groups=self.groups,
            **refs,
        )
        metrics = {"time/data_s": time.perf_counter() - t0}
        samples = [
            {
                "prompt": row.messages()[-1]["content"],
                "chosen": row.chosen,
                "rejected": row.rejected,
            }
            for row in rows[: self.sample_completions]
        ]
        return Batch(arrays, metrics=metrics, samples=samples, tokens=int(arrays.mask_BxT.sum()))

    def state(self) -> dict:
        return {"dpo": self.pairs.state()}

    def restore(self, state: dict) -> None:
        self.pairs.restore(state["dpo"])


def response_budget(cfg: Config) -> int:
    """`dpo.max_response_len`, or `rollout.max_new_tokens` when unset."""
    budget = cfg.dpo.max_response_len
    return cfg.rollout.max_new_tokens if budget is None else budget


def full_length(cfg: Config) -> int:
    """The longest sequence a DPO row holds: prompt + response budgets."""
    return cfg.data.max_prompt_len + response_budget(cfg)


class DPOUpdate(Update):
    """One DPO step per batch, after the reference log-probs with `dpo.reference: on_the_fly`."""

    def __init__(self, ctx: Context) -> None:
        cfg = ctx.cfg
        d = cfg.dpo
        limit = ctx.model.config.max_position_embeddings
        if full_length(cfg) > limit:
            raise ValueError(
                f"data.max_prompt_len + dpo.max_response_len (or rollout.max_new_tokens) = "
                f"{full_length(cfg)} exceeds the model's max_position_embeddings={limit}"
            )
        optimizer = make_optimizer(cfg.train)
        step = make_dpo_step(
            ctx.model.config,
            optimizer,
            pairs=d.batch_size,
            variant=d.variant,
            beta=d.beta,
            variant_kwargs=d.variant_kwargs,
            n_micro=micro_batch_count(cfg),
            compute_dtype=cfg.model.compute_dtype,
            memory=ctx.memory,
        )
        super().__init__(ctx, optimizer)
        self.train_step = step
        self.needs_ref = d.reference == "on_the_fly" and needs_reference(d.variant)
        if self.needs_ref:
            self.logprob = reference_logprob_fn(ctx)

    def step(self, state: Any, inputs: PreferenceBatch, reference: Any) -> tuple[Any, list]:
        """The reference log-probs (`dpo.reference: on_the_fly`), then one DPO step."""
        if self.needs_ref:
            ref_logp = self.logprob(self.reference_params(state, reference), inputs)
            inputs = inputs.replace(ref_logp_BxT=ref_logp)
        return self.steps(state, 1, lambda state, _: self.train_step(state, inputs))


def reference_logprob_fn(ctx: Context) -> Any:
    """The jitted log-probs of a token batch under the reference (τ = 1)."""
    return learner.make_logprob_fn(
        ctx.model.config,
        compute_dtype=ctx.cfg.model.compute_dtype,
        temperature=1.0,
        memory=ctx.memory,
    )


def _host(x: Any) -> np.ndarray:
    """A (possibly multi-process) device array as one numpy array on every process."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def reference_cache(ctx: Context, sources: list[Any], *, rows: int) -> ReferenceCache:
    """The cache of `dpo.reference_cache_dir`, filled for every pair of `sources` by the
    starting policy (`ctx.model`; with LoRA its base, as stored: int8 kernels are another
    model), saved by process 0 when anything was computed."""
    cfg = ctx.cfg
    directory = cfg.dpo.reference_cache_dir or f"{cfg.train.output_dir}/{REFERENCE_CACHE_SUBDIR}"
    stored = cfg.model.param_dtype
    if cfg.model.lora.rank and cfg.model.lora.base_dtype != "param":
        stored = f"{stored}/{cfg.model.lora.base_dtype} kernels"
    fingerprint = model_fingerprint(
        cfg.model.path, param_dtype=stored, compute_dtype=cfg.model.compute_dtype
    )
    cache = ReferenceCache(directory, fingerprint)
    fn = reference_logprob_fn(ctx)
    params = lora.strip(ctx.model.params)

    def sequences():
        for source in sources:
            for row in source.rows:
                prompt = [int(t) for t in row.prompt_ids]
                yield prompt, row.chosen_ids
                yield prompt, row.rejected_ids

    computed = cache.fill(
        sequences(),
        lambda batch: _host(fn(params, ctx.put(batch))),
        rows=rows,
        full_len=full_length(cfg),
        min_len=cfg.train.bucket_min_len,
        multiple=ctx.length_multiple,
        pad_id=ctx.pad_id,
    )
    if computed and jax.process_index() == 0:
        log.info("reference log-probs: saved %d to %s", len(cache), cache.save())
    return cache


def source(ctx: Context, params: Any, version: int) -> PreferenceSource:
    """`algorithm: dpo`'s source (fixed data: the params and version are not needed)."""
    del params, version
    cfg = ctx.cfg
    d = cfg.dpo
    sources = load_preference_sources(
        d.sources,
        ctx.tokenizer,
        cfg.data.prompt_template,
        max_prompt_len=cfg.data.max_prompt_len,
        max_response_len=response_budget(cfg),
    )
    cache = None
    if d.reference == "cache" and needs_reference(d.variant):
        cache = reference_cache(ctx, sources, rows=2 * d.batch_size)
    return PreferenceSource(ctx, PromptIterator(sources, seed=cfg.data.seed), cache)
