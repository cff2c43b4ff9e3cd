"""`Context`: what the run's sources and updates are built from: sizes and batch layout."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from rlvr_jax import losses, sharding
from rlvr_jax.config.schema import Config
from rlvr_jax.training import learner
from rlvr_jax.training.batch import bucket_length, mini_batch
from rlvr_jax.training.distributed import global_array
from rlvr_jax.training.packing import max_segments


@dataclasses.dataclass(frozen=True)
class Context:
    """What sources and updates are built from (the loop builds it once)."""

    cfg: Config
    model: Any
    """The policy on the learner mesh (`models.Model`)."""
    tokenizer: Any
    learner_mesh: Any
    actor_mesh: Any
    settings: losses.LossSettings
    stop: Callable[[], bool]
    timeline: Any = None
    turns: Any = None
    """`dispatch.DeviceTurns` when actors and learner share devices in async mode, else None."""

    @property
    def seq_len(self) -> int:
        """Positions a slot and a learner row hold: prompt + completion."""
        return self.cfg.data.max_prompt_len + self.cfg.rollout.max_new_tokens

    @property
    def rows(self) -> int:
        """Completions per rollout batch."""
        return self.cfg.train.prompts_per_batch * self.cfg.rollout.num_samples

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else (self.model.config.pad_token_id or 0))

    @property
    def memory(self) -> learner.MemoryOptions:
        t = self.cfg.train
        return learner.MemoryOptions(
            remat=t.remat,
            attn_chunk=t.attn_chunk,
            logits_chunk=t.logits_chunk,
            attention_impl=self.cfg.model.attention_impl,
            max_segments=max_segments(t.max_tokens_per_micro_batch),
        )

    @property
    def row_multiple(self) -> int:
        """Devices a batch's rows are split over (the learner mesh's `batch` axes)."""
        return int(np.prod([self.learner_mesh.shape[a] for a in ("data", "fsdp")]))

    @property
    def length_multiple(self) -> int:
        """What a bucketed row length is a multiple of (the attention and logits chunks)."""
        t = self.cfg.train
        return math.lcm(t.attn_chunk or 1, t.logits_chunk or 1)

    def actor_rollout(self, params: Any, version: int, **kwargs: Any) -> Any:
        """An actor rollout (`rollout.build_rollout` on the actor mesh) from `params`."""
        from rlvr_jax.rollout import build_rollout

        return build_rollout(
            self.cfg.rollout, self.model, self.actor_mesh, self.tokenizer, max_len=self.seq_len,
            params=params, version=version, **kwargs,
        )  # fmt: skip

    def batch_sharding(self, shape: tuple[int, ...]) -> jax.sharding.NamedSharding:
        """Where a batch array of `shape` lives on the learner mesh (rows by the `batch` rule)."""
        return sharding.batch_sharding(self.learner_mesh, sharding.LEARNER_RULES, shape)

    def put(self, tree: Any) -> Any:
        """A batch pytree on the learner mesh (`batch_sharding`). Host arrays are the whole
        batch on every process (each fills its own shards); device arrays move if need be."""

        def one(x: Any) -> Any:
            target = self.batch_sharding(x.shape)
            if isinstance(x, jax.Array):
                return jax.device_put(x, target)
            return global_array(x, target)

        return jax.tree.map(one, tree)

    def abstract(self, tree: Any) -> Any:
        """`put(tree)`'s shapes, dtypes and shardings, without the data."""
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.batch_sharding(x.shape)),
            tree,
        )

    def laid_out(self, tree: Any) -> Any:
        """`tree`'s arrays, in a jitted program, laid out as `put` lays out a batch."""
        return jax.tree.map(
            lambda x: jax.lax.with_sharding_constraint(x, self.batch_sharding(x.shape)), tree
        )

    def mini_batches(self, tree: Any, n: int) -> Any:
        """A batch pytree, in a jitted program, as its `n` mini-batches stacked, each laid out."""
        parts = [mini_batch(tree, u, n) for u in range(n)]

        def stacked(*xs: jax.Array) -> jax.Array:
            spec = self.batch_sharding(xs[0].shape).spec
            where = jax.sharding.NamedSharding(self.learner_mesh, P(None, *spec))
            return jax.lax.with_sharding_constraint(jnp.stack(xs), where)

        return jax.tree.map(stacked, *parts)

    def _bucket(self, lengths: Any, *, full: int, multiple: int) -> int:
        """The longest of `lengths` (1 for none) bucketed (`batch.bucket_length`), ≤ `full`."""
        min_len = self.cfg.train.bucket_min_len
        return bucket_length(max(lengths, default=1), full=full, min_len=min_len, multiple=multiple)

    def batch_length(self, groups: list[Any]) -> int:
        """Learner positions T of a batch of scored groups: its longest sequence, bucketed."""
        lengths = (len(g.prompt_tokens) + len(c.tokens) for g in groups for c in g.completions)
        return self._bucket(lengths, full=self.seq_len, multiple=self.length_multiple)

    @functools.cached_property
    def shares_prompts(self) -> bool:
        """Whether RL batches lay each group's prompt out once (`train.share_prompts`)."""
        from rlvr_jax.models.attention import resolve_impl

        t, arch = self.cfg.train, self.model.config
        if not t.share_prompts or arch.has_sliding or t.prompts_per_batch % t.updates_per_batch:
            return False
        groups = t.prompts_per_batch // t.updates_per_batch
        micro = 0 if t.max_tokens_per_micro_batch else t.micro_batch_size
        if micro and groups % (self.rows // t.updates_per_batch // micro):
            return False  # micro-batches would split a group
        kernel = resolve_impl(
            self.cfg.model.attention_impl,
            compute_dtype=self.cfg.model.compute_dtype,
            head_dim=arch.head_dim,
            max_segments=1,
        )
        return kernel in ("blockwise", "xla")

    def completion_length(self, groups: list[Any]) -> int:
        """Positions of a shared-prompt completion slot: the longest completion, bucketed."""
        lengths = (len(c.tokens) for g in groups for c in g.completions)
        full, multiple = self.cfg.rollout.max_new_tokens, self.cfg.train.logits_chunk or 1
        return self._bucket(lengths, full=full, multiple=multiple)

    def group_length(self, groups: list[Any]) -> int:
        """Positions of a shared-prompt row: the longest prompt + G completions, bucketed."""
        lengths = (len(g.prompt_tokens) + sum(len(c.tokens) for c in g.completions) for g in groups)
        r = self.cfg.rollout
        full = self.cfg.data.max_prompt_len + r.num_samples * r.max_new_tokens
        return self._bucket(lengths, full=full, multiple=self.length_multiple)
