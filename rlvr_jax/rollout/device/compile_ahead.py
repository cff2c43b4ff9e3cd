"""Compiling an engine's programs ahead of use (`EngineCore.compile_ahead`).

Each jitted device function is lowered on abstract arguments (shapes, dtypes and the
shardings the real calls will pass) and compiled; JAX keeps the executables, so the first
real call only traces. The trainer does this before it takes `rlvr_jax.dispatch.LOCK`, so a
first-time compile of a new bucket never stalls the learner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from rlvr_jax.rollout.device import decode as core
from rlvr_jax.rollout.device.sampling import SamplerMode


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def host_struct(shape: tuple, dtype: Any = np.int32) -> jax.ShapeDtypeStruct:
    """An abstract host array (what the engine passes as numpy)."""
    return jax.ShapeDtypeStruct(shape, np.dtype(dtype))


def _slot_settings(spec: Any) -> core.SlotSettings:
    b, e = spec.max_slots, spec.max_stop_ids
    return core.SlotSettings(
        slots_B=host_struct((b,)),
        seed_B=host_struct((b,), np.uint32),
        sample_B=host_struct((b,)),
        max_new_B=host_struct((b,)),
        temperature_B=host_struct((b,), np.float32),
        top_k_B=host_struct((b,)),
        top_p_B=host_struct((b,), np.float32),
        stop_ids_BxE=host_struct((b, e)),
        generated_B=host_struct((b,)),
        budget_B=host_struct((b,)),
        forced_BxF=host_struct((b, spec.max_interrupt_ids)),
    )


def compile_all(engine: Any, modes: Sequence[SamplerMode]) -> int:
    """Compiles `engine`'s programs (see `EngineCore.compile_ahead`); returns how many."""
    spec = engine.spec
    dp = _abstract(engine.params)
    state = jax.eval_shape(lambda: core.init_state(spec=spec))
    place = (
        core.state_shardings(spec)
        if spec.mesh is not None
        else jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]), state)
    )
    state = jax.tree.map(lambda x, s: x.update(sharding=s), state, place)
    layout = spec.kv_layout
    programs = [core.init_state.lower(spec=spec)]
    programs += layout.lower_programs(engine, dp, state, _slot_settings(spec))
    work = layout.abstract_work(spec)
    for mode in modes:
        for rows in spec.row_buckets:  # `rows` passed as EngineCore.generate passes it
            rows_arg = None if rows == spec.max_slots else rows
            programs.append(
                core.generate.lower(
                    dp,
                    state,
                    host_struct(()),
                    work,
                    spec=spec,
                    n_steps=engine.chunk,
                    mode=mode,
                    rows=rows_arg,
                )
            )
    for program in programs:
        if isinstance(program, jax.stages.Lowered):  # (some come compiled)
            program.compile()
    return len(programs)
