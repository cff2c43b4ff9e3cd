"""The `Update` base every algorithm's learner update is built on.

An update is one pure program `step(state, inputs, reference) -> (state, [metrics] * n)` (the
batch's log-probs, advantages and all `n` optimizer steps), jitted once per input shape with
explicit state shardings, the state donated. `init_state(params)` makes the state and the
program; `inputs(batch)` is its host input; `update(state, batch) -> (state, [metrics], n)`
dispatches it (the loop holds `dispatch.LOCK`), metrics unfetched; `compile(state, batch)`
compiles it before the lock (a compile under it would stall the rollout thread).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.config.algorithm_checks import micro_batches
from rlvr_jax.config.schema import Config
from rlvr_jax.models import lora
from rlvr_jax.training.context import Context
from rlvr_jax.training.sources import Batch
from rlvr_jax.training.update import init_state, jit_train_step


def step_micro_batches(cfg: Config, rows: int, what: str) -> int | None:
    """`micro_batches` of a step over `rows` rows; None when packed (batches carry their own)."""
    n_micro = micro_batches(rows, cfg.train.micro_batch_size, what)
    return None if cfg.train.max_tokens_per_micro_batch else n_micro


class Update:
    """The learner updates' shared part; a subclass gives `step` and, if need be, `inputs`."""

    needs_ref = False
    """Whether the program reads the frozen reference policy (`reference`)."""

    def __init__(self, ctx: Context, optimizer: Any) -> None:
        self.ctx, self.optimizer = ctx, optimizer
        self.program: Callable | None = None
        self._shardings: Any = None  # the train state's
        self._ladders: set[Any] = set()  # row shapes whose `Batch.row_counts` are compiled
        self.reference: Any = None
        """The program's `reference` argument: the starting policy when it reads the reference
        and there is no LoRA (with LoRA, the state's own frozen base: `reference_params`)."""

    def init_state(self, params: Any) -> Any:
        state = self._initial_state(params)
        self._shardings = jax.tree.map(lambda x: x.sharding, state)
        lora_base = lora.split(self.ctx.model.params)[1]
        self.reference = self.ctx.model.params if self.needs_ref and lora_base is None else None
        reference = jax.tree.map(lambda x: x.sharding, self.reference)
        self.program = jit_train_step(self.step, self._shardings, None, reference)
        return state

    def _initial_state(self, params: Any) -> Any:
        return init_state(params, self.optimizer, mesh=self.ctx.learner_mesh)

    def step(self, state: Any, inputs: Any, reference: Any) -> tuple[Any, list[dict]]:
        """The pure program: (the state after the batch's optimizer steps, their metrics)."""
        raise NotImplementedError

    def inputs(self, batch: Batch) -> Any:
        """The program's input on the host (None: the batch trains nothing)."""
        return batch.arrays

    @staticmethod
    def reference_params(state: Any, reference: Any) -> Any:
        """The frozen reference policy of the KL term and of DPO (in the program): `reference`,
        else `state`'s base with the adapters off (LoRA: no copy)."""
        return reference if reference is not None else lora.split(state.params)[1]

    def update(self, state: Any, batch: Batch) -> tuple[Any, list, int]:
        inputs = self.inputs(batch)
        if inputs is None:
            return state, [], 0
        state, metrics = self.program(state, self._given(state, inputs, batch), self.reference)
        return state, metrics, len(metrics)

    def _given(self, state: Any, inputs: Any, batch: Batch) -> Any:
        """`inputs` on the learner mesh, with what is made for the program before it runs."""
        del state, batch
        return self.ctx.put(inputs)

    def compile(self, state: Any, batch: Batch) -> None:
        """Compiles, without running, the program `update(state, batch)` runs and (once per row
        length) those of the batch's other packed-row counts (`Batch.row_counts`), so the
        ladder's shapes compile with the first batch."""
        for one in (batch, *self._row_variants(batch)):
            inputs = self.inputs(one)
            if inputs is not None:
                self._compile(state, self.ctx.abstract(inputs))

    def _compile(self, state: Any, inputs: Any) -> None:
        self.program.lower(state, inputs, self.reference).compile()

    def _row_variants(self, batch: Batch) -> list[Batch]:
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

    def steps(self, state: Any, n: int, one: Callable[[Any, Any], tuple]) -> tuple[Any, list]:
        """`n` optimizer steps `one(state, u) -> (state, metrics)` (a `lax.scan` when n > 1)."""
        if n == 1:
            state, metrics = one(state, 0)
            return state, [metrics]

        def body(state: Any, u: jax.Array) -> tuple[Any, dict]:
            state, metrics = one(state, u)
            return jax.lax.with_sharding_constraint(state, self._shardings), metrics

        state, metrics_N = jax.lax.scan(body, state, jnp.arange(n))
        return state, [jax.tree.map(lambda x, u=u: x[u], metrics_N) for u in range(n)]
