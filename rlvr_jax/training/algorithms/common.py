"""What every algorithm is built from: the run's `Context`, the `Update` base, and the micro-batch
count check they share.

A learner update turns a source's `Batch` into optimizer steps on the learner mesh:
- `init_state(params)`: the train state (sharded like the params);
- `update(state, batch) -> (state, [metrics], n)`: dispatches the `n` optimizer steps (under
  `rlvr_jax.dispatch.LOCK`, by the loop) and returns their device metrics, unfetched;
- `compile(state, batch)`: the same `update` run ahead of the lock on the batch's abstract
  arrays (`Context.abstract`): each jitted call it makes is lowered and compiled instead of run
  (a compile under the lock would stall the rollout thread), and gives its outputs' shapes and
  shardings to what follows. An update therefore moves arrays only through `put`, calls its
  jitted functions through `call`, and takes mini-batches through `mini_batch`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from rlvr_jax import losses, sharding
from rlvr_jax.config.algorithm_checks import micro_batches
from rlvr_jax.config.schema import Config
from rlvr_jax.models import lora
from rlvr_jax.training import learner
from rlvr_jax.training.batch import bucket_length, mini_batch
from rlvr_jax.training.distributed import global_array
from rlvr_jax.training.packing import max_segments
from rlvr_jax.training.update import init_state, jit_train_step


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
    """`dispatch.DeviceTurns` when actors and learner share devices in async mode (else None):
    the rollout decodes in the learner's gaps instead of beside its updates."""

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

    def put(self, tree: Any) -> Any:
        """A batch pytree on the learner mesh, rows split by the `batch` rule. Host arrays are
        the whole batch on every process (each fills its own shards); device arrays move."""
        mesh, rules = self.learner_mesh, sharding.LEARNER_RULES

        def one(x: Any) -> Any:
            target = sharding.batch_sharding(mesh, rules, x.shape)
            if isinstance(x, jax.Array):
                return jax.device_put(x, target)
            return global_array(x, target)

        return jax.tree.map(one, tree)

    def abstract(self, tree: Any) -> Any:
        """`put(tree)`'s shapes, dtypes and shardings, without the data (`tree` may itself be
        abstract)."""
        mesh, rules = self.learner_mesh, sharding.LEARNER_RULES
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(
                x.shape, x.dtype, sharding=sharding.batch_sharding(mesh, rules, x.shape)
            ),
            tree,
        )

    def batch_length(self, groups: list[Any]) -> int:
        """Learner positions T of a batch of scored groups: its longest prompt + completion
        rounded up to a length bucket (`train.bucket_min_len`)."""
        longest = max(
            (len(g.prompt_tokens) + len(c.tokens) for g in groups for c in g.completions),
            default=1,
        )
        return bucket_length(
            longest,
            full=self.seq_len,
            min_len=self.cfg.train.bucket_min_len,
            multiple=self.length_multiple,
        )

    @functools.cached_property
    def shares_prompts(self) -> bool:
        """Whether RL batches lay each group's prompt out once (`train.share_prompts`, where
        it applies)."""
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
        """Positions of a completion slot of shared-prompt rows: the batch's longest completion
        rounded up to a length bucket (`train.bucket_min_len`)."""
        longest = max((len(c.tokens) for g in groups for c in g.completions), default=1)
        return bucket_length(
            longest,
            full=self.cfg.rollout.max_new_tokens,
            min_len=self.cfg.train.bucket_min_len,
            multiple=self.cfg.train.logits_chunk or 1,
        )

    def group_length(self, groups: list[Any]) -> int:
        """Positions of a shared-prompt row (`shares_prompts`) of a batch of scored groups: its
        longest group (prompt + G completions) rounded up to a length bucket."""
        longest = max(
            (len(g.prompt_tokens) + sum(len(c.tokens) for c in g.completions) for g in groups),
            default=1,
        )
        r = self.cfg.rollout
        return bucket_length(
            longest,
            full=self.cfg.data.max_prompt_len + r.num_samples * r.max_new_tokens,
            min_len=self.cfg.train.bucket_min_len,
            multiple=self.length_multiple,
        )


def step_micro_batches(cfg: Config, rows: int, what: str) -> int | None:
    """`micro_batches` of a step over `rows` rows; None with `train.max_tokens_per_micro_batch`
    (packed batches carry their own micro-batch count)."""
    n_micro = micro_batches(rows, cfg.train.micro_batch_size, what)
    return None if cfg.train.max_tokens_per_micro_batch else n_micro


class Update:
    """The shared part of the learner updates: the jitted step and its state, and the ways an
    update touches arrays (`put`, `call`, `mini_batch`) that make `compile` the update itself on
    abstract arrays (see the module docstring)."""

    def __init__(self, ctx: Context, step: Callable, optimizer: Any) -> None:
        self.ctx, self.optimizer, self._pure = ctx, optimizer, step
        self.step: Callable | None = None
        self.abstract = False
        """True while `compile` runs the update on abstract arrays."""
        self._compiled: dict[Any, Any] = {}
        self._ladders: set[Any] = set()  # row shapes whose `Batch.row_counts` are compiled

    def init_state(self, params: Any) -> Any:
        state = self._initial_state(params)
        self.step = jit_train_step(self._pure, jax.tree.map(lambda x: x.sharding, state))
        return state

    def _initial_state(self, params: Any) -> Any:
        return init_state(params, self.optimizer, mesh=self.ctx.learner_mesh)

    def update(self, state: Any, batch: Any) -> tuple[Any, list, int]:
        raise NotImplementedError

    def reference_params(self, state: Any) -> Any:
        """The frozen reference policy of the KL term and of DPO: with LoRA, `state`'s base with
        the adapters off (no copy); else the starting policy (`ctx.model.params`)."""
        frozen = lora.split(state.params)[1]
        return self.ctx.model.params if frozen is None else frozen

    def compile(self, state: Any, batch: Any) -> None:
        """Compiles every jitted program `update(state, batch)` runs, without running them, and
        (once per row length) those of the batch at the other packed-row counts its source may
        hand over (`Batch.row_counts`): the packing ladder's shapes compile with the first batch
        instead of one by one in the steps that first meet them."""
        self.abstract = True
        try:
            self.update(state, batch)
            for other in self._row_variants(batch):
                self.update(state, other)
        finally:
            self.abstract = False

    def _row_variants(self, batch: Any) -> list[Any]:
        """`batch` with its packed rows (`arrays.tokens`) at each other count of
        `batch.row_counts`, the first time its row shape is seen (zeros: only shapes count)."""
        tokens = getattr(batch.arrays, "tokens", None)
        if not batch.row_counts or tokens is None:
            return []
        rows, row_len = tokens.mask_BxT.shape
        rest = batch.arrays.replace(tokens=None)
        key = (row_len, tuple(np.shape(x) for x in jax.tree.leaves(rest)))
        if key in self._ladders:
            return []
        self._ladders.add(key)
        return [
            dataclasses.replace(
                batch,
                arrays=batch.arrays.replace(
                    tokens=jax.tree.map(lambda a, r=r: np.zeros((r, *a.shape[1:]), a.dtype), tokens)
                ),
            )
            for r in batch.row_counts
            if r != rows
        ]

    def put(self, tree: Any) -> Any:
        """`tree` on the learner mesh (`Context.put`); its abstract form while compiling."""
        return self.ctx.abstract(tree) if self.abstract else self.ctx.put(tree)

    def call(self, fn: Callable, *args: Any) -> Any:
        """`fn(*args)` for a jitted `fn`; while compiling, `fn.lower(*args).compile()` (once per
        shape: JAX finds the executable when the call comes) and the outputs' shapes, dtypes and
        shardings."""
        if not self.abstract:
            return fn(*args)
        key = (fn, tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(args)))
        if key not in self._compiled:
            out = fn.lower(*args).compile().out_info
            self._compiled[key] = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), out
            )
        return self._compiled[key]

    def mini_batch(self, tree: Any, u: int, updates: int) -> Any:
        """Part u of `updates` of a batch (`batch.mini_batch`) on the learner mesh; its shapes
        while compiling."""
        part = functools.partial(mini_batch, u=u, updates=updates)
        return self.put(jax.eval_shape(part, tree) if self.abstract else part(tree))
