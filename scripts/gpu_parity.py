"""The parity part of `scripts/gpu_check.sh`: the GPU attention kernels against the XLA reference
on random inputs, written as JSON (`python scripts/gpu_parity.py --json F [--cpu-smoke]`).

- `paged/*`: the Pallas (Triton) paged decode-attention kernel (`decode_pallas_gpu`, the
  engine's `pallas_gpu`) and the engine's XLA path (`decode_xla` over the host's work lists),
  each against a dense float64 reference over the same pages, with scattered page tables and
  random positions, for a bf16 pool (the engine's, in bf16) and an fp32 pool.
- `learner/*`: the learner's cuDNN flash attention (`attention(impl="cudnn")`) against
  `impl="xla"` on the same bf16 inputs upcast to fp32: outputs and the gradients of
  sum(out · w) with respect to q, k and v, for one sequence per row (right-padded) and packed
  rows (several sequences per row), with and without a sliding window.
- `engine/pallas_gpu`: the paged engine end to end with the Pallas decode kernel, greedy, on
  a small random bf16 model: every generated token's log-prob against a teacher-forced forward
  of the whole sequence (`models.forward`).

Errors are ‖out − ref‖ / ‖ref‖ over real positions (padding left out: cuDNN zeroes it). On a
CPU (`--cpu-smoke`, or no GPU) the same code runs tiny: the Pallas kernel in Pallas interpret
mode, the blockwise kernel standing in for cuDNN (the result names the kernel that ran).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.models import attention as A
from rlvr_jax.rollout.device import attention as pa
from rlvr_jax.rollout.device.paged import work_lists

TOL = {"bfloat16": 2e-2, "float32": 2e-3}
"""Largest relative error that passes, by input dtype (bf16 operands land between 1e-3 and
1e-2; fp32 matmuls on a GPU may use TF32, ~3e-4)."""
ENGINE_TOL = 0.02
"""Largest log-prob gap (nats) between the bf16 engine and the bf16 teacher-forced forward
(on a CPU: 0.001; with the kernel reading half of each sequence, 0.11: a random model's
near-uniform logits make attention errors small)."""
GRAD_SLACK = 2.0
"""Gradients may be this many times the output tolerance (two more bf16 matmuls)."""


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Shapes of the checks (the GPU's; `SMOKE` for a CPU)."""

    slots: int = 8
    heads: int = 16
    kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    pages_per_seq: int = 64
    rows: int = 4
    seq: int = 512
    engine_new: int = 16
    engine_layers: int = 2
    """Decoder layers of the engine check's model (every layer runs the same kernel)."""


SMOKE = Sizes(slots=2, heads=4, kv_heads=2, head_dim=16, pages_per_seq=4, rows=2, seq=48,
              engine_new=4, engine_layers=1)  # fmt: skip
"""The CPU smoke's shapes: the Pallas kernel runs interpreted, each layer's compile is seconds
(one layer: the engine check's 44 s -> 30 s at load 13-16, 2-core AVX-512, 2026-12-01)."""


def rel_err(out: Any, ref: Any, mask: Any = None) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 over `mask` (broadcast over trailing axes); inf when
    `out` holds a NaN or an inf."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if mask is not None:
        mask = np.asarray(mask)
        keep = np.broadcast_to(mask.reshape(mask.shape + (1,) * (out.ndim - mask.ndim)), out.shape)
        out, ref = out[keep], ref[keep]
    if not np.isfinite(out).all():
        return float("inf")
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def guarded(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Runs one check; an exception becomes a failed entry naming it (the others go on)."""
    start = time.perf_counter()
    try:
        out = fn()
    except Exception as e:
        traceback.print_exc()
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(f"[parity] {name}: {'ok' if out['ok'] else 'FAILED'} {out}", file=sys.stderr)
    return {"name": name, **out, "seconds": time.perf_counter() - start}


# ---- paged decode attention ------------------------------------------------------------


def paged_case(sizes: Sizes, dtype: Any, seed: int) -> tuple:
    """(q [B, N, H] fp32, k/v pools [K, P, Z, H] in `dtype`, positions [B], tables [B, M]):
    every slot's pages scattered over the pool (page 0, the trash page, never listed)."""
    rng = np.random.default_rng(seed)
    b, m, z = sizes.slots, sizes.pages_per_seq, sizes.page_size
    shape = (sizes.kv_heads, 1 + b * m, z, sizes.head_dim)
    kp, vp = (jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(2))
    table = (1 + rng.permutation(b * m)).reshape(b, m).astype(np.int32)
    positions = rng.integers(0, m * z, b).astype(np.int32)
    positions[0] = m * z - 1  # one slot at the end of its table
    q = jnp.asarray(rng.standard_normal((b, sizes.heads, sizes.head_dim)), jnp.float32)
    return q, kp, vp, positions, table


def dense_paged(q, kp, vp, positions, table) -> np.ndarray:
    """Attention of each slot's query over its pages' keys up to its position, float64."""
    k, _, _, h = kp.shape
    keys = np.asarray(kp.astype(jnp.float32), np.float64)[:, table]  # [K, B, M, Z, H]
    vals = np.asarray(vp.astype(jnp.float32), np.float64)[:, table]
    b, n = q.shape[:2]
    keys, vals = keys.reshape(k, b, -1, h), vals.reshape(k, b, -1, h)
    qq = np.asarray(q, np.float64).reshape(b, k, n // k, h) * h**-0.5
    s = np.einsum("bkgh,kbsh->bkgs", qq, keys)
    s = np.where(np.arange(s.shape[-1]) <= positions[:, None, None, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bkgs,kbsh->bkgh", p, vals).reshape(b, n, h)


def paged_check(sizes: Sizes, dtype: str, interpret: bool) -> dict[str, Any]:
    """The Pallas kernel and the XLA path against `dense_paged`, one pool dtype."""
    q, kp, vp, positions, table = paged_case(sizes, jnp.dtype(dtype), seed=1)
    geometry = pa.make_geometry(sizes.page_size, sizes.pages_per_seq)
    ref = dense_paged(q, kp, vp, positions, table)
    blocks = sizes.slots * sizes.pages_per_seq // geometry.pages_per_block
    length = -(-blocks // geometry.blocks_per_iter) * geometry.blocks_per_iter  # as the engine's
    ends = {i: int(p) for i, p in enumerate(positions)}
    slot, block, count = work_lists(
        ends, dict.fromkeys(ends, 0), slots_per_shard=sizes.slots, shards=1, length=length,
        geometry=geometry,
    )  # fmt: skip
    args = (q, kp, vp, jnp.asarray(positions), jnp.asarray(table))
    work = (jnp.asarray(slot[0]), jnp.asarray(block[0]), jnp.asarray(count[0]))
    pallas = functools.partial(pa.decode_pallas_gpu, geometry=geometry, interpret=interpret)
    xla = functools.partial(pa.decode_xla, geometry=geometry, window=None)
    errors = {
        "pallas_gpu": rel_err(jax.jit(pallas)(*args), ref),
        "xla": rel_err(jax.jit(xla)(*args, *work), ref),
    }
    tol = TOL[dtype]
    return {"ok": all(e <= tol for e in errors.values()), "errors": errors, "tol": tol,
            "interpret": interpret}  # fmt: skip


# ---- learner attention (cuDNN) ---------------------------------------------------------


def segments(rng: np.random.Generator, rows: int, seq: int, per_row: int) -> np.ndarray:
    """[B, T] segment ids: `per_row` sequences of random lengths (ids 1..), then right padding
    of up to a quarter of the row (the learner's collation, packed when `per_row` > 1)."""
    out = np.zeros((rows, seq), np.int32)
    for r in range(rows):
        used = seq - int(rng.integers(0, seq // 4))
        cuts = np.sort(rng.choice(np.arange(1, used), per_row - 1, replace=False))
        for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, used])):
            out[r, a:b] = i + 1
    return out


def learner_check(sizes: Sizes, kernel: str, per_row: int, window: int | None) -> dict[str, Any]:
    """`kernel` on bf16 inputs against `xla` on the same values in fp32: outputs and grads."""
    rng = np.random.default_rng(per_row * 100 + (window or 0))
    b, t = sizes.rows, sizes.seq

    def x(heads: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal((b, t, heads, sizes.head_dim)), jnp.bfloat16)

    q, k, v = x(sizes.heads), x(sizes.kv_heads), x(sizes.kv_heads)
    seg = jnp.asarray(segments(rng, b, t, per_row))
    real = np.asarray(seg) != 0
    w = jnp.asarray(rng.standard_normal(q.shape) * real[..., None, None], jnp.float32)

    def value_and_grads(impl: str, dtype: Any) -> tuple:
        def loss(q, k, v):
            out = A.attention(q, k, v, seg, impl=impl, sliding_window=window, max_segments=per_row)
            return (out.astype(jnp.float32) * w).sum(), out

        fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
        (_, out), grads = fn(*(y.astype(dtype) for y in (q, k, v)))
        return out, grads

    out, grads = value_and_grads(kernel, jnp.bfloat16)
    ref, ref_grads = value_and_grads("xla", jnp.float32)
    errors = {"out": rel_err(out, ref, real)}
    for name, g, r in zip("qkv", grads, ref_grads):
        errors[f"d{name}"] = rel_err(g, r)
    tol = TOL["bfloat16"]
    ok = errors["out"] <= tol and all(errors[f"d{n}"] <= GRAD_SLACK * tol for n in "qkv")
    return {"ok": ok, "errors": errors, "tol": tol, "grad_tol": GRAD_SLACK * tol,
            "kernel": kernel, "sequences_per_row": per_row, "window": window}  # fmt: skip


# ---- the paged engine end to end -------------------------------------------------------


def engine_check(sizes: Sizes, interpret: bool) -> dict[str, Any]:
    """Greedy generation through the paged engine with the Pallas decode kernel on a small
    random bf16 model; each generated token's log-prob against a teacher-forced forward of the
    whole sequence (`models.forward`, the learner's dense path) in the same dtype."""
    from rlvr_jax import models
    from rlvr_jax.bench import common
    from rlvr_jax.rollout import EngineCore, generate

    heads = dict(n_heads=sizes.heads, n_kv_heads=sizes.kv_heads)
    arch = common.ModelSize(
        d_model=sizes.heads * sizes.head_dim, n_layers=sizes.engine_layers, d_ff=256, vocab=512,
        **heads,
    ).arch()  # fmt: skip
    params = models.init_params(arch, jax.random.key(0))
    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
    model = models.Model(config=arch, params=params, compute_dtype=jnp.bfloat16)
    prompts = np.random.default_rng(3).integers(0, 512, (sizes.slots, 24))
    core = EngineCore(model, max_slots=sizes.slots, max_len=24 + sizes.engine_new,
                      page_size=sizes.page_size, attention="pallas_gpu")  # fmt: skip
    done = generate(core, prompts.tolist(), max_new_tokens=sizes.engine_new, temperature=0.0)
    tokens = np.asarray([c.tokens for c in done])
    logits = models.forward(model, np.concatenate([prompts, tokens], 1))[:, 23:-1]
    ref = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1)[..., 0]
    gap = float(np.abs(np.asarray([c.logprobs for c in done]) - np.asarray(ref)).max())
    return {"ok": bool(gap <= ENGINE_TOL), "max_logprob_gap": gap, "tol": ENGINE_TOL,
            "kernel": core.spec.attention, "interpret": interpret}  # fmt: skip


def _interpreted_pallas_on_cpu() -> None:
    """On a CPU: let the engine take "pallas_gpu" and run that kernel in interpret mode."""
    select = pa.select_impl
    pa.select_impl = lambda requested, platform, **kw: select(
        requested, "gpu" if requested == "pallas_gpu" else platform, **kw
    )
    pa.decode_pallas_gpu = functools.partial(pa.decode_pallas_gpu, interpret=True)


def run(smoke: bool) -> dict[str, Any]:
    """Every check; the JSON-able result."""
    on_gpu = jax.default_backend() == "gpu"
    sizes = SMOKE if smoke or not on_gpu else Sizes()
    interpret = not on_gpu
    kernel = "cudnn" if on_gpu else "blockwise"
    checks = [
        guarded(f"paged/{dtype}", functools.partial(paged_check, sizes, dtype, interpret))
        for dtype in ("bfloat16", "float32")
    ]
    window = sizes.seq // 4
    for per_row, win in ((1, None), (1, window), (3, None), (3, window)):
        name = f"learner/{kernel}/{'packed' if per_row > 1 else 'one_per_row'}"
        name += f"/window{win}" if win else ""
        check = functools.partial(learner_check, sizes, kernel, per_row, win)
        checks.append(guarded(name, check))
    if interpret:
        _interpreted_pallas_on_cpu()
    engine = functools.partial(engine_check, sizes, interpret)
    checks.append(guarded("engine/pallas_gpu", engine))
    return {
        "ok": all(c["ok"] for c in checks),
        "checks": {c["name"]: c for c in checks},
        "sizes": dataclasses.asdict(sizes),
        "learner_kernel": kernel if on_gpu else "blockwise (cuDNN stand-in: no GPU here)",
        "platform": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True, help="write the results here")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny sizes")
    args = p.parse_args(argv)
    result = run(args.cpu_smoke)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"parity: {'ok' if result['ok'] else 'FAILED'}", flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
