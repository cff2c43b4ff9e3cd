"""`rlvr-bench decode --peer vllm`: our continuous engine (`rollout.generate`) and vLLM on
`rlvr-bench decode`'s throughput workload, the same weights (one HF checkpoint per dtype),
prompts and sampling, in interleaved rounds in one process (docs/vllm.md).

vLLM runs as a user would run it: its `LLMEngine` in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), `max_num_seqs` = `batch`, a KV cache of `batch` full
rows, every prompt prefilled in one step, its default compilation (torch.compile, warmed up),
requests added and the engine stepped until done, final outputs only. Needs vLLM's CPU build
(`bash scripts/setup_env.sh --vllm`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from typing import Any

import numpy as np

from rlvr_jax.bench import progress
from rlvr_jax.bench.engine_timing import timed_generate
from rlvr_jax.bench.inputs import build_models
from rlvr_jax.bench.roofline import best_roofline

DTYPES = ("float32", "bfloat16")


def vllm_engine(model: Any, cfg: Any) -> Any:
    """A `VllmEngine` serving `model`'s checkpoint in `cfg.dtype` for the throughput shape."""
    from rlvr_jax.rollout.backends import vllm as backend

    shape = dict(max_slots=cfg.batch, max_len=cfg.prompt + cfg.new)
    dtype_bytes = np.dtype(model.param_dtype).itemsize
    kv_bytes = backend.kv_cache_bytes(model.config, dtype_bytes=dtype_bytes, page_size=16, **shape)
    kw = dict(dtype=cfg.dtype, kv_cache_memory_bytes=kv_bytes, prefill_chunk=cfg.batch * cfg.prompt)
    return backend.VllmEngine(model, backend.engine_args(model, seed=cfg.seed, **kw, **shape))


def vllm_generate(engine: Any, prompts: list[list[int]], new: int, seed: int) -> int:
    """Every prompt through vLLM's engine, T = 1, `new` tokens each (no stop); tokens generated."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    llm, generated = engine.llm, 0
    for i, p in enumerate(prompts):
        params = SamplingParams(
            temperature=1.0, top_p=1.0, top_k=-1, max_tokens=new, min_tokens=new,
            ignore_eos=True, seed=seed + i, detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )  # fmt: skip
        llm.add_request(f"bench-{i}", TokensPrompt(prompt_token_ids=p), params)
    while llm.has_unfinished_requests():
        for out in llm.step():
            if out.finished:
                generated += len(out.outputs[0].token_ids)
    if generated != len(prompts) * new:
        raise RuntimeError(f"vLLM generated {generated} tokens, not {len(prompts) * new}")
    return generated


def run(cfg: Any) -> dict[str, Any]:
    """Both engines on each of `cfg.peer_dtypes` (`decode.BenchConfig`); the JSON-able result."""
    from rlvr_jax.rollout import EngineCore, generate

    dtypes = cfg.peer_dtypes
    if cfg.quick:  # one head of 64 (vLLM's CPU attention refuses the smoke model's head dim 16)
        cfg = dataclasses.replace(cfg, n_heads=1, n_kv_heads=1)
    rng = np.random.default_rng(cfg.seed)
    prompts = rng.integers(0, cfg.vocab, size=(cfg.batch, cfg.prompt)).tolist()
    n_tokens = cfg.batch * cfg.new
    tps: dict[str, dict[str, float]] = {"continuous": {}, "vllm": {}}
    load: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-vllm-") as tmp:
        for dtype in dtypes:
            c = dataclasses.replace(cfg, dtype=dtype)
            progress.line(f"{dtype}: building the model (one HF checkpoint) and both engines")
            _, model = build_models(c, os.path.join(tmp, dtype))  # vLLM reads the checkpoint
            core = EngineCore(model, max_slots=c.batch, max_len=c.prompt + c.new, chunk=c.chunk)
            engine = vllm_engine(model, c)
            fns = {
                "continuous": functools.partial(
                    generate, core, prompts, max_new_tokens=c.new, temperature=1.0, seed=c.seed
                ),
                "vllm": functools.partial(vllm_generate, engine, prompts, c.new, c.seed),
            }
            before = os.getloadavg()[0]
            walls = timed_generate(fns, c.repeats, n_tokens)[0]
            load[dtype] = [before, os.getloadavg()[0]]
            for name, wall in walls.items():
                tps[name][dtype] = n_tokens / wall
            del engine
    progress.line("roofline probe (matmul peak, memory bandwidth)")
    roof = best_roofline(cfg.quick)
    import torch
    import vllm

    return {
        "tokens_per_s": {"continuous": tps["continuous"]},
        "peers": {
            "vllm": {
                "tokens_per_s": tps["vllm"],
                "version": vllm.__version__,
                "torch_threads": torch.get_num_threads(),
            }
        },
        "ratios": {
            "continuous_over_vllm": {d: tps["continuous"][d] / tps["vllm"][d] for d in dtypes}
        },
        "load": {"by_dtype": load, "threshold": 0.75 * (os.cpu_count() or 1)},
        "roofline": roof,
        "machine": {"omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")},
        "config": {**dataclasses.asdict(cfg), "dtypes": list(dtypes)},
    }
