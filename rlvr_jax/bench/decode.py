"""`rlvr-bench decode`: tokens/s of our continuous engine, our static mode and transformers'
`generate` on the same random Qwen2-shaped weights, plus a long-tailed workload comparing
continuous with static batching wall time.

Workload 1 (throughput): `batch` prompts of `prompt` tokens, `new` tokens each, T = 1, no
stop token; tokens/s counts generated tokens only (prefill time included in the wall).
Workload 2 (long tail): `long_requests` prompts of `long_prompt` tokens whose budgets (up
to `long_new`) have mean/max ~ 0.45 (as OLMo 3's ~14K of 32K; prompts short next to the
generations, as in RL), on `batch` slots; static batching pays 1 - mean/max of its
slot-steps, continuous only the final drain.

Workload 3 (`--workload long`, `rlvr_jax.bench.decode_long`): the paged KV cache against
the contiguous one at equal KV memory on long, LogNormal-length rollouts, and decode step
time against live tokens. `--workload short` (the default) runs workloads 1 and 2, `all`
all three. `--workload multiturn` (`rlvr_jax.bench.multiturn`): tool-using episodes with
their turns continued in the slot against re-prefilling the conversation every turn.

`roofline_fraction`: model FLOPs of workload 1 (2 x matmul params per prompt and generated
token, plus attention) per second, over this machine's measured fp32 matmul throughput
(`rlvr-bench roofline`). `profile` splits our engine's time into prefill, decode steps and
the rest (`host_and_other_share`), and `host_share` times the host directly: the scheduler's
Python between device calls in one more continuous run, every device call timed to its result
(`engine_timing.host_share`); `decode_step_memory_fraction` is the bytes a decode step must read
(`common.decode_step_bytes`) per measured step second over the measured memory bandwidth
(and over the datasheet's HBM bandwidth on a GPU/TPU).

`--preset bench` (default; the 56M bench model), `quick` (smoke test), `gpu-1b` (≈1B params,
bf16); `--dtype` sets both models' dtype. On a GPU transformers runs on CUDA too.

`--peer vllm` (`rlvr_jax.bench.decode_vllm`): our continuous engine beside vLLM on one HF
checkpoint per dtype, fp32 and bf16 (or `--dtype`), interleaved rounds; needs vLLM (its CPU
build: `bash scripts/setup_env.sh --vllm`, docs/vllm.md).

`--weight-dtype D` / `--lora-rank R` (`rlvr_jax.bench.decode_weights`): the engine decoding
from weights stored in D (int8, fp8, bfloat16) against the compute dtype on the same run, with
the per-token sampler/learner mismatch it causes, and with LoRA what an adapters-only push
costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import tempfile
import time
from typing import Any

import numpy as np

from rlvr_jax.bench import common, progress
from rlvr_jax.bench.engine_timing import host_share, interleaved_best, profile_engine
from rlvr_jax.bench.inputs import build_models
from rlvr_jax.bench.roofline import best_roofline, machine_info
from rlvr_jax.rollout import (
    EngineCore,
    GroupRequest,
    SamplingParams,
    Scheduler,
    generate,
)
from rlvr_jax.rollout.scheduler import SchedulerStats
from rlvr_jax.rollout.waste import continuous_steps, static_steps, waste


@dataclasses.dataclass(frozen=True)
class BenchConfig(common.ModelSize):
    """Sizes of one benchmark run (the model's: `common.ModelSize`)."""

    batch: int = 32
    """Slots, and prompts of the throughput workload."""
    prompt: int = 64
    new: int = 128
    long_requests: int = 192
    long_prompt: int = 32
    long_new: int = 256
    mean_over_max: float = 0.45
    chunk: int = 8
    repeats: int = 2
    seed: int = 0
    dtype: str = "float32"
    """Params, activations and KV cache of both models (float32 | bfloat16)."""


QUICK = BenchConfig(
    **common.TINY_SIZES, batch=4, prompt=8, new=8, long_requests=12, chunk=4, repeats=1
)
PRESETS = {
    "bench": BenchConfig(),
    "quick": QUICK,
    "gpu-1b": BenchConfig(**common.SIZES_1B, dtype="bfloat16", long_requests=64, long_new=128),
}
"""`--preset`: the 56M bench model (default), the smoke test's tiny one, and the ≈1B model of
`common.SIZES_1B` in bf16 (a shorter long-tailed workload) for one H100/H200-class GPU."""


def long_tail_lengths(n: int, max_len: int, mean_over_max: float, seed: int) -> list[int]:
    """`n` budgets in [1, max_len], the longest = max_len, mean/max ~ `mean_over_max`.

    u ~ Uniform(0, 1) (u = 1 for one request), length = ceil(max_len · u^γ), with γ found by
    bisection so that the mean hits the target: γ > 1 skews towards short, with a tail up to
    the max (the shape of RL response lengths)."""
    if not 0 < mean_over_max < 1 or n < 2 or max_len < 2:
        raise ValueError(
            f"need n >= 2, max_len >= 2, 0 < mean_over_max < 1; got {n}, {max_len}, {mean_over_max}"
        )
    u = np.random.default_rng(seed).uniform(size=n)
    u[np.argmax(u)] = 1.0

    def lengths(gamma: float) -> np.ndarray:
        return np.clip(np.ceil(max_len * u**gamma), 1, max_len).astype(int)

    lo, hi = 1e-3, 1e3  # mean/max falls as gamma grows
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if lengths(mid).mean() / max_len > mean_over_max else (lo, mid)
    return lengths((lo * hi) ** 0.5).tolist()


def _hf_generate(hf: Any, prompts: np.ndarray, new: int) -> float:
    import torch

    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    ids = torch.as_tensor(prompts, dtype=torch.long, device=hf.device)
    with torch.no_grad():
        start = time.perf_counter()
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new,
        )
        if ids.is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    if out.shape[1] != prompts.shape[1] + new:
        raise RuntimeError(f"HF generated {out.shape[1] - prompts.shape[1]} tokens, not {new}")
    return seconds


def run_long_tail(
    core: EngineCore, prompts: list[list[int]], lengths: list[int], batching: str
) -> SchedulerStats:
    """Runs the long-tailed workload to the end; returns the scheduler's counters."""
    sched = Scheduler(core, batching=batching)
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        sched.add(GroupRequest(i, i, tuple(p), 1, seed=i, max_new_tokens=n))
    done = sched.run()
    if sum(len(c.tokens) for _, group in done for c in group) != sum(lengths):
        raise RuntimeError("long-tail workload: wrong number of generated tokens")
    return sched.stats


def run(cfg: BenchConfig, *, skip_hf: bool = False, quick: bool = False) -> dict:
    """Runs both workloads and the roofline probe (`quick`: its tiny sizes); returns the
    JSON-able results."""
    load_before = os.getloadavg()
    rng = np.random.default_rng(cfg.seed)
    progress.line("building the model (random weights, HF and ours)")
    with tempfile.TemporaryDirectory() as tmp:
        hf, model = build_models(cfg, tmp)
    prompts_np = rng.integers(0, cfg.vocab, size=(cfg.batch, cfg.prompt))
    prompts = prompts_np.tolist()
    core = EngineCore(model, max_slots=cfg.batch, max_len=cfg.prompt + cfg.new, chunk=cfg.chunk)
    n_tokens = cfg.batch * cfg.new
    kw = dict(max_new_tokens=cfg.new, temperature=1.0, seed=cfg.seed)
    throughput = {
        b: functools.partial(generate, core, prompts, batching=b, **kw)
        for b in ("continuous", "static")
    }
    if not skip_hf:
        throughput["hf_generate"] = functools.partial(_hf_generate, hf, prompts_np, cfg.new)
        _hf_generate(hf, prompts_np[:, : min(8, cfg.prompt)], 2)  # warm up
    progress.line("throughput workload: compiling and warming up the engine")
    for b in ("continuous", "static"):
        throughput[b]()  # compile + warm up
    walls, outs = interleaved_best(throughput, cfg.repeats)
    for b in ("continuous", "static"):
        if sum(len(c.tokens) for c in outs[b]) != n_tokens:
            raise RuntimeError(f"{b}: wrong number of generated tokens")
    tokens_per_s = {k: n_tokens / v for k, v in walls.items()}

    lengths = long_tail_lengths(cfg.long_requests, cfg.long_new, cfg.mean_over_max, cfg.seed)
    long_prompts = rng.integers(0, cfg.vocab, size=(cfg.long_requests, cfg.long_prompt)).tolist()
    long_core = EngineCore(
        model, max_slots=cfg.batch, max_len=cfg.long_prompt + cfg.long_new, chunk=cfg.chunk
    )
    progress.line("long-tailed workload: compiling and warming up")
    run_long_tail(long_core, long_prompts[: cfg.batch], lengths[: cfg.batch], "continuous")
    long_walls, stats = interleaved_best(
        {
            b: functools.partial(run_long_tail, long_core, long_prompts, lengths, b)
            for b in ("continuous", "static")
        },
        cfg.repeats,
    )
    progress.line("profile: prefill and decode step")
    profile = profile_engine(core, prompts, cfg.repeats)
    host = host_share(core, throughput["continuous"])
    roof = best_roofline(quick)
    config = model.config
    work = cfg.batch * (cfg.prompt + cfg.new) * common.token_flops(config, cfg.prompt + cfg.new / 2)
    fraction = {k: work / wall / (roof["peak_gflops_fp32"] * 1e9) for k, wall in walls.items()}
    prefill_total = profile["prefill_s_per_prompt"] * cfg.batch
    decode_total = profile["decode_ms_per_step"] * 1e-3 * cfg.new
    # the decode step's bytes at the least (weights once, the KV cache at the prompt length)
    itemsize = model.param_dtype.itemsize
    step_bytes = common.decode_step_bytes(
        config, slots=cfg.batch, context=cfg.prompt, param_bytes=itemsize, cache_bytes=itemsize
    )
    step_gbps = step_bytes / (profile["decode_ms_per_step"] * 1e-3) / 1e9
    sheet = roof["datasheet"]
    profile.update(
        {
            "continuous_wall_s": walls["continuous"],
            "prefill_share": prefill_total / walls["continuous"],
            "decode_share": decode_total / walls["continuous"],
            "host_and_other_share": 1 - (prefill_total + decode_total) / walls["continuous"],
            # timed directly: the scheduler's Python between device calls, one more run
            "host_share": host["share"],
            "host_s": host["host_s"],
            "host_run_wall_s": host["wall_s"],
            "decode_step_bytes": step_bytes,
            "decode_step_gbps": step_gbps,
            "decode_step_memory_fraction": step_gbps / roof["memory_gbps"],
            "decode_step_memory_fraction_datasheet": sheet and step_gbps / sheet["hbm_gbps"],
        }
    )
    mean_over_max = float(np.mean(lengths) / np.max(lengths))
    return {
        "tokens_per_s": tokens_per_s,
        "wall_s": long_walls,
        "roofline_fraction": fraction["continuous"],
        "roofline_fraction_by_mode": fraction,
        "decode_step_memory_fraction": profile["decode_step_memory_fraction"],
        "ratios": {
            "continuous_over_hf_tokens_per_s": (
                None if skip_hf else tokens_per_s["continuous"] / tokens_per_s["hf_generate"]
            ),
            "continuous_over_static_wall_long_tail": long_walls["continuous"]
            / long_walls["static"],
        },
        "long_tail": {
            "requests": cfg.long_requests,
            "mean_over_max": mean_over_max,
            "predicted_waste": {
                "static": waste(lengths, static_steps(lengths, cfg.batch), cfg.batch),
                "continuous": waste(lengths, continuous_steps(lengths, cfg.batch), cfg.batch),
            },
            "waste": {k: s.waste for k, s in stats.items()},
            "decode_steps": {k: s.decode_steps for k, s in stats.items()},
            "decode_calls": {k: s.decode_calls for k, s in stats.items()},
        },
        "profile": profile,
        "roofline": roof,
        "machine": {
            **machine_info(load_before),
            "torch_omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "hf_device": str(hf.device),
        },
        "config": {
            **dataclasses.asdict(cfg),
            "model": config.to_hf(),
            "params": config.n_params(),
            "sampling": dataclasses.asdict(SamplingParams()),
        },
    }


def plot(result: dict, path: str) -> Any:
    """Tokens/s by mode, the long-tail wall times, and where the continuous engine's time goes."""
    shares = {k: result["profile"][f"{k}_share"] for k in ("prefill", "decode", "host_and_other")}
    panels = {
        "throughput (batch workload)": ("tokens/s", result["tokens_per_s"]),
        "long-tailed workload": ("wall seconds", result["wall_s"]),
        "continuous engine: share of wall": ("fraction", shares),
    }
    return common.save_bars(path, "rlvr-bench decode", panels)


def main(argv: list[str] | None = None) -> int:
    """`rlvr-bench decode [--workload short|long|all] [--preset bench|quick|gpu-1b] [--dtype D]
    [--json FILE] [--plot FILE.png] [--quick] [--repeats N] [--skip-hf] [--peer vllm]
    [long sizes]`."""
    p = argparse.ArgumentParser(prog="rlvr-bench decode", description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write the results here as JSON")
    p.add_argument("--plot", help="write a PNG plot here")
    p.add_argument("--preset", choices=sorted(PRESETS), default="bench", help="named sizes")
    p.add_argument("--quick", action="store_true", help="same as --preset quick (smoke test)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), help="override the preset's dtype")
    p.add_argument("--repeats", type=int, help="timed repeats per measurement (best is kept)")
    p.add_argument("--skip-hf", action="store_true", help="do not time transformers' generate")
    p.add_argument(
        "--workload",
        choices=("short", "long", "all", "multiturn"),
        default="short",
        help="short: throughput + long-tail (default); long: paged vs contiguous KV; all; "
        "multiturn: in-slot tool turns vs re-prefilling each turn",
    )
    p.add_argument("--long-requests", type=int, help="long workload: requests (default 64)")
    p.add_argument("--paged-slots", type=int, help="long workload: paged engine slots (64)")
    p.add_argument("--long-capacity", type=int, help="long workload: tokens a slot holds (4096)")
    p.add_argument(
        "--weight-dtype",
        choices=("float32", "bfloat16", "int8", "fp8"),
        help="decode weights stored so, against the compute dtype (with the mismatch)",
    )
    p.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters: time their push")
    p.add_argument(
        "--peer", choices=("vllm",), help="vllm: our continuous engine beside vLLM, fp32 and bf16"
    )
    args = p.parse_args(argv)
    quick = args.quick or args.preset == "quick"
    cfg = QUICK if quick else PRESETS[args.preset]
    long_flags = (("requests", args.long_requests), ("paged_slots", args.paged_slots),
                  ("capacity", args.long_capacity))  # fmt: skip
    long_sizes = {k: v for k, v in long_flags if v is not None}
    if any(v < 2 for v in long_sizes.values()):
        p.error("--long-requests, --paged-slots and --long-capacity must be >= 2")
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats must be >= 1")
    overrides = {"repeats": args.repeats, "dtype": args.dtype}
    cfg = dataclasses.replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    if args.peer == "vllm":
        from rlvr_jax.bench import decode_vllm

        dtypes = (args.dtype,) if args.dtype else decode_vllm.DTYPES
        result = decode_vllm.run(cfg, dtypes=dtypes, quick=quick)
        print(decode_vllm.format_result(result))
        return common.write_outputs(result, args.json)
    if args.workload == "multiturn":
        from rlvr_jax.bench import multiturn

        return multiturn.main(cfg, quick, args.json, args.plot)
    if args.weight_dtype or args.lora_rank:
        from rlvr_jax.bench import decode_weights

        if args.lora_rank < 0:
            p.error("--lora-rank must be >= 0")
        result = decode_weights.run(
            cfg, weight_dtype=args.weight_dtype, lora_rank=args.lora_rank, quick=quick
        )
        print(decode_weights.format_result(result))
        return common.write_outputs(result, args.json)
    if args.workload == "long":
        from rlvr_jax.bench import decode_long

        result = decode_long.main_result(cfg, quick, **long_sizes)
        return common.write_outputs(result, args.json)
    result = run(cfg, skip_hf=args.skip_hf, quick=quick)
    if args.workload == "all":
        from rlvr_jax.bench import decode_long

        result["long"] = decode_long.main_result(cfg, quick, **long_sizes)["long"]
    for mode, tps in result["tokens_per_s"].items():
        print(f"tokens/s {mode:12s} {tps:10.1f}")
    for mode, s in result["wall_s"].items():
        print(f"long-tail wall {mode:10s} {s:8.2f} s")
    ratios = result["ratios"]
    if ratios["continuous_over_hf_tokens_per_s"] is not None:
        print(
            f"continuous / hf_generate tokens/s   {ratios['continuous_over_hf_tokens_per_s']:.2f}x"
        )
    print(
        f"continuous / static long-tail wall  {ratios['continuous_over_static_wall_long_tail']:.2f}"
    )
    print(f"roofline fraction (continuous)      {result['roofline_fraction']:.3f}")
    print(f"decode step memory-bandwidth frac.  {result['decode_step_memory_fraction']:.3f}")
    print(f"host share of the continuous run    {result['profile']['host_share']:.3f}")
    return common.write_outputs(result, args.json, args.plot, plot)
