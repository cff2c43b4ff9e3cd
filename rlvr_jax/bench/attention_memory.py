"""`rlvr-bench learner --workload attention-memory`: XLA's peak memory of one learner
micro-batch per attention kernel as the row length T grows (`temp_bytes`, `peak_bytes`), the
real train step compiled from abstract shapes; `growth` ≈ 2 linear in T, ≈ 4 quadratic.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax import losses, models
from rlvr_jax.bench import common, progress
from rlvr_jax.bench.inputs import synthetic_batch, train_step
from rlvr_jax.models import attention

SEQS = (1024, 2048, 4096, 8192)
"""Row lengths T measured (the figure is at the last)."""


def kernels_here(compute_dtype: Any, head_dim: int) -> list[str]:
    """The attention kernels that can run on this process's platform, reference first."""
    out = ["xla", "blockwise"]
    for impl in ("splash", "cudnn"):
        with contextlib.suppress(attention.AttentionConfigError):
            kw = dict(compute_dtype=compute_dtype, head_dim=head_dim, max_segments=1)
            out.append(attention.resolve_impl(impl, **kw))
    return out


def micro_batch_memory(cfg: Any, kernel: str, seq: int, rows: int) -> dict[str, float]:
    """XLA's memory of the train step of one `rows` × `seq` micro-batch with `kernel`."""
    from rlvr_jax.training import learner

    arch = cfg.arch()
    with_old_logp = losses.resolve_loss_settings(cfg.loss).tis_mode == "mask"
    memory = dataclasses.replace(cfg.memory(), attention_impl=kernel)
    # chunk sizes must divide T; they never exceed it
    memory = dataclasses.replace(
        memory,
        logits_chunk=memory.logits_chunk if seq % max(memory.logits_chunk, 1) == 0 else 0,
        attn_chunk=memory.attn_chunk if seq % max(memory.attn_chunk, 1) == 0 else 0,
    )
    step, optimizer = train_step(cfg, memory, max_len=seq, n_micro=1)
    params = models.abstract_params(arch)
    state = jax.eval_shape(lambda p: learner.init_state(p, optimizer), params)
    arrays = synthetic_batch(arch, rows=rows, seq=seq, seed=0, with_old_logp=with_old_logp)
    batch = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), arrays)
    compiled, compile_s = common.compile_ahead(step, state, batch, donate=(0,))
    stats = common.compiled_memory(compiled)
    if stats is None:
        raise RuntimeError(f"the {jax.default_backend()} backend reports no memory analysis")
    peak = stats["temp_bytes"] + stats["argument_bytes"] + stats["output_bytes"]
    return {**stats, "peak_bytes": peak, "compile_s": compile_s}


def measure(cfg: Any, *, seqs: tuple[int, ...] = SEQS, rows: int = 1) -> dict[str, Any]:
    """Every kernel here × every T in `seqs`; the JSON-able result (module docstring)."""
    if len(seqs) < 3 or list(seqs) != sorted(seqs):
        raise ValueError(f"seqs must be at least 3 increasing lengths, got {seqs}")
    arch = cfg.arch()
    kernels = kernels_here(jnp.dtype(cfg.dtype), arch.head_dim)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for kernel in kernels:
        table[kernel] = {}
        for seq in seqs:
            one = table[kernel][str(seq)] = micro_batch_memory(cfg, kernel, seq, rows)
            progress.line(
                f"{kernel} T={seq}: temp {one['temp_bytes'] / 2**30:.3f} GiB "
                f"(compiled in {one['compile_s']:.1f} s)"
            )
    last = [str(s) for s in seqs[-3:]]
    temp = {k: [table[k][s]["temp_bytes"] for s in last] for k in kernels}
    growth = {k: (t[2] - t[1]) / max(t[1] - t[0], 1) for k, t in temp.items()}
    top = str(seqs[-1])
    return {
        "rows": rows,
        "seqs": list(seqs),
        "kernels": kernels,
        "memory": table,
        "peak_bytes": {k: table[k][top]["peak_bytes"] for k in kernels},
        "temp_bytes": {k: table[k][top]["temp_bytes"] for k in kernels},
        "growth": growth,
        "over_blockwise": {
            k: table[k][top]["temp_bytes"] / table["blockwise"][top]["temp_bytes"] for k in kernels
        },
    }


def panel(result: dict[str, Any]) -> common.Panel | None:
    """Temp memory against T, one line per kernel (None: not this workload's result)."""
    r = result.get("attention_memory")
    if r is None:
        return None
    lines = {
        k: (r["seqs"], [r["memory"][k][str(s)]["temp_bytes"] / 2**30 for s in r["seqs"]])
        for k in r["kernels"]
    }
    return common.Panel(
        "one micro-batch: XLA temp memory", "GiB", lines=lines, xlabel="T (tokens)", logx=True
    )
