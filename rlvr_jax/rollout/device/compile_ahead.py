"""Compiling an engine's programs ahead of use (`EngineCore.compile_ahead`): each jitted function
lowered on abstract arguments (the real calls' shapes, dtypes and shardings) and compiled before
the trainer takes `dispatch.LOCK`, so a first compile never stalls the learner."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from rlvr_jax.rollout.device import decode as core
from rlvr_jax.rollout.device.kernel import DecodeParams
from rlvr_jax.rollout.device.sampling import SamplerMode
from rlvr_jax.rollout.device.state import EngineSpec, SlotSettings, state_shardings


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def host_struct(shape: tuple, dtype: Any = np.int32) -> jax.ShapeDtypeStruct:
    """An abstract host array (what the engine passes as numpy)."""
    return jax.ShapeDtypeStruct(shape, np.dtype(dtype))


def compile_all(
    spec: EngineSpec, params: DecodeParams, chunk: int, modes: Sequence[SamplerMode]
) -> int:
    """Compiles what the scheduler runs on an engine of `spec` (`extend` of every chunk bucket,
    activate / deactivate / copy / move, `generate` of every row bucket and each of `modes` at
    `chunk` steps) on `params`' avals; returns how many."""
    dp = _abstract(params)
    state = jax.eval_shape(lambda: core.init_state(spec=spec))
    place = (
        state_shardings(spec)
        if spec.mesh is not None
        else jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]), state)
    )
    state = jax.tree.map(lambda x, s: x.update(sharding=s), state, place)
    scalar, row = host_struct(()), host_struct((spec.max_pages,))
    slots, pairs = host_struct((spec.max_slots,)), host_struct((spec.shards, spec.max_slots))
    programs = [core.init_state.lower(spec=spec)]
    programs += [
        core.extend.lower(dp, state, host_struct((t,)), scalar, scalar, row, scalar, spec=spec)
        for t in spec.chunk_buckets
    ]
    settings = SlotSettings.empty(spec, lambda shape, _, dtype: host_struct(shape, dtype))
    programs.append(core.activate.lower(state, settings, slots, slots, spec=spec))
    programs.append(core.deactivate.lower(state, slots, spec=spec))
    programs.append(core.copy_pages.lower(state, pairs, pairs, spec=spec))
    if len(spec.row_buckets) > 1:
        programs.append(core.move_slots.lower(state, slots, slots, spec=spec))
    work = spec.kv_layout.abstract_work(spec)
    generate = functools.partial(core.generate.lower, dp, state, scalar, work, spec=spec)
    for mode in modes:
        for rows in spec.row_buckets:  # `rows` passed as EngineCore.generate passes it
            rows_arg = None if rows == spec.max_slots else rows
            programs.append(generate(n_steps=chunk, mode=mode, rows=rows_arg))
    for program in programs:
        program.compile()
    return len(programs)
