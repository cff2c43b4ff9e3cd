"""The learner's side of a weight push (`rlvr_jax.rollout.push` is the actors' contract).

`WeightPusher.push(source, params, version)`:
1. hands the params to the source's actors (`source.push_weights`, not under `dispatch.LOCK`:
   the actors take it only to enqueue the re-lay, so decode chunks keep flowing);
2. probes: `rollout.push_probe_tokens` tokens of a fixed prompt sampled by the actors on a
   request pinned to `version` (it waits for the swap), re-scored by the learner: the largest
   |Δ log p| is `push/probe_max_abs_logp`; above `rollout.push_probe_tolerance`, or with a token
   of another version, the run stops with `StaleWeightsError`. Multi-process runs (streams
   stepped on the main thread) are not probed;
3. reports `push/seconds` (until the probe's result) and `push/bytes`.

It runs in a worker thread joined with `rollout.push_timeout_s`; past it, `PushTimeoutError`
(the worker is abandoned).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import jax
import numpy as np

from rlvr_jax import dispatch
from rlvr_jax.rollout.push import PushTimeoutError, StaleWeightsError, tree_bytes
from rlvr_jax.training import learner
from rlvr_jax.training.algorithms.common import Context
from rlvr_jax.training.batch import Sample, collate
from rlvr_jax.training.sources import StaticWeights

log = logging.getLogger("rlvr_jax.train")

PROBE_TEXT = "The weights were pushed; 1 + 1 = 2, and 2 + 2 ="
"""The probe's prompt (tokenized by the run's tokenizer, cut to `data.max_prompt_len`)."""


class WeightPusher:
    """Pushes the learner's params to a source's actors and probes them (module docstring)."""

    def __init__(self, ctx: Context) -> None:
        r = ctx.cfg.rollout
        self.ctx = ctx
        self.timeout_s = r.push_timeout_s or None
        self.tokens, self.tolerance = r.push_probe_tokens, r.push_probe_tolerance
        ids = list(ctx.tokenizer.encode(PROBE_TEXT))[: ctx.cfg.data.max_prompt_len]
        self.prompt = ids or [ctx.pad_id]
        self.logprob = learner.make_logprob_fn(
            ctx.model.config,
            compute_dtype=ctx.cfg.model.compute_dtype,
            temperature=r.temperature,
            memory=ctx.memory,
        )
        self._compiled: dict[Any, Any] = {}

    def push(self, source: Any, params: Any, version: int, sent: Any = None) -> dict[str, float]:
        """Pushes `sent` (default `params`; LoRA: the adapters alone) of policy `version` to
        `source`'s actors and probes them with `params`; raises `PushTimeoutError`, the actors'
        refusal (`OutOfOrderPushError`, `PartialPushError`) or `StaleWeightsError`."""
        if isinstance(source, StaticWeights):  # no actors: nothing to push
            return {}
        out: dict[str, Any] = {}

        def work() -> None:
            try:
                t0, moved = time.perf_counter(), params if sent is None else sent
                stats = source.push_weights(moved, version)  # enqueues under the lock itself
                group = source.probe(version, self.prompt, self.tokens) if self.tokens else None
                out["push/seconds"] = time.perf_counter() - t0
                out["push/bytes"] = float(tree_bytes(moved))
                out.update(stats or {})  # the actors' own figures, where they give them
                if group is not None:
                    out["push/probe_max_abs_logp"] = self._check(params, version, group)
            except BaseException as e:  # raised on the caller's thread
                out["error"] = e

        worker = threading.Thread(target=work, name=f"push-{version}", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise PushTimeoutError(
                f"the weight push of policy version {version} did not complete within "
                f"rollout.push_timeout_s={self.timeout_s:g} s (hand-over to the actors, swap "
                "and probe); the actors may be hung, or the push needs a larger timeout"
            )
        if "error" in out:
            raise out.pop("error")
        return out

    def _check(self, params: Any, version: int, group: Any) -> float:
        """The probe's largest |Δ log p|; `StaleWeightsError` past the tolerance or version."""
        (c,) = group.completions
        versions = sorted(set(c.policy_versions))
        if versions != [version]:
            raise StaleWeightsError(
                f"after the push of policy version {version}, the actors sampled the probe "
                f"with version(s) {versions}"
            )
        gap = self._max_abs_logp(params, group)
        if not gap <= self.tolerance:
            raise StaleWeightsError(
                f"after the push of policy version {version}, the actors' log-probs of the "
                f"probe differ from the learner's by up to {gap:.4g} "
                f"> rollout.push_probe_tolerance={self.tolerance:g}: they do not hold the "
                "pushed weights"
            )
        return gap

    def _max_abs_logp(self, params: Any, group: Any) -> float:
        """max |learner log p − actor log p| over the probe's sampled tokens."""
        ctx, (c,) = self.ctx, group.completions
        prompt = list(group.prompt_tokens)
        sample = Sample(prompt, list(c.tokens), list(c.logprobs), 0.0, sampled=c.sampled)
        seq_len = ctx.batch_length([group]) + 1
        batch = collate([sample], rows=ctx.row_multiple, seq_len=seq_len, pad_id=ctx.pad_id)
        key = seq_len
        if key not in self._compiled:  # outside the lock: a compile would stall the actors
            abstract = ctx.abstract(batch)
            self._compiled[key] = self.logprob.lower(params, abstract).compile()
        with dispatch.LOCK:
            logp_BxT = self._compiled[key](params, ctx.put(batch))
        learner_T = np.asarray(jax.device_get(logp_BxT))[0]
        mask_T = batch.mask_BxT[0] > 0
        gap_T = np.abs(learner_T - batch.sampler_logp_BxT[0])
        return float(gap_T[mask_T].max()) if mask_T.any() else 0.0
