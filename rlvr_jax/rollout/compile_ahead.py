"""Compiling an engine's programs ahead of use (`EngineCore.compile_ahead`).

Each jitted device function is lowered on abstract arguments (shapes, dtypes and the
shardings the real calls will pass) and compiled; JAX keeps the executables, so the first
real call only traces. The trainer does this before it takes `rlvr_jax.dispatch.LOCK`, so a
first-time compile of a new bucket never stalls the learner.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from rlvr_jax.rollout import core, paged_core
from rlvr_jax.rollout.sampling import SamplerMode


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _host(shape: tuple, dtype: Any = np.int32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, np.dtype(dtype))


def _slot_settings(spec: Any) -> core.SlotSettings:
    b, e = spec.max_slots, spec.max_stop_ids
    return core.SlotSettings(
        slots_B=_host((b,)),
        seed_B=_host((b,), np.uint32),
        sample_B=_host((b,)),
        max_new_B=_host((b,)),
        temperature_B=_host((b,), np.float32),
        top_k_B=_host((b,)),
        top_p_B=_host((b,), np.float32),
        stop_ids_BxE=_host((b, e)),
        generated_B=_host((b,)),
        budget_B=_host((b,)),
        forced_BxF=_host((b, spec.max_interrupt_ids)),
    )


def paged_work(spec: Any) -> paged_core.PagedWork:
    """Abstract `PagedWork` of an engine (the shapes the scheduler builds)."""
    s, r = spec.shards, spec.work_len
    lists = (_host((s, r)), _host((s, r)), _host((s,)))
    return paged_core.PagedWork(
        _host((spec.max_slots, spec.max_pages)),
        *lists,
        *(lists if spec.config.has_sliding else (None, None, None)),
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
    scalar = _host(())
    lowered = [core.init_state.lower(spec=spec)]
    if spec.kv_layout == "paged":
        row = _host((spec.max_pages,))
        for t in spec.chunk_buckets:
            lowered.append(
                paged_core.extend.lower(
                    dp, state, _host((t,)), scalar, scalar, row, scalar, spec=spec
                )
            )
        b = spec.max_slots
        slots = _host((b,))
        lowered.append(
            paged_core.activate.lower(state, _slot_settings(spec), slots, slots, spec=spec)
        )
        lowered.append(paged_core.deactivate.lower(state, slots, spec=spec))
        pairs = _host((spec.shards, b))
        lowered.append(paged_core.copy_pages.lower(state, pairs, pairs, spec=spec))
        lowered.append(core.move_slots.lower(state, slots, slots, spec=spec))
        work = paged_work(spec)
    else:
        for t in spec.prefill_buckets:
            prefill = core.prefill.lower(dp, _host((t,)), scalar, scalar, spec=spec).compile()
            prefix = jax.tree.map(  # as the real prefix arrives: placed like prefill's output
                lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                jax.eval_shape(
                    functools.partial(core.prefill, spec=spec), dp, _host((t,)), scalar, scalar
                ),
                prefill.output_shardings,
            )
            lowered.append(
                core.insert.lower(state, prefix, _slot_settings(spec), scalar, spec=spec)
            )
        work = None
    for mode in modes:
        for rows in spec.row_buckets:  # `rows` passed as EngineCore.generate passes it
            rows_arg = None if rows == spec.max_slots else rows
            lowered.append(
                core.generate.lower(
                    dp,
                    state,
                    scalar,
                    work,
                    spec=spec,
                    n_steps=engine.chunk,
                    mode=mode,
                    rows=rows_arg,
                )
            )
    for low in lowered:
        low.compile()
    return len(lowered) + (0 if spec.kv_layout == "paged" else len(spec.prefill_buckets))
