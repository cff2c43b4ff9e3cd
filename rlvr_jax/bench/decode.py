"""`rlvr-bench decode`: tokens/s of our continuous engine, our static mode and transformers'
`generate` on the same random Qwen2-shaped weights (the throughput workload: `batch` prompts,
`new` tokens each, T = 1, no stop token), continuous against static batching on long-tailed
budgets, and where the engine's time goes (`profile`); `--workload step` times the decode step
alone at `--shapes`. The other workloads (`--workload long|multiturn`, `--weight-dtype`,
`--lora-rank`, `--peer vllm`) live in `decode_long`, `multiturn`, `decode_weights` and
`decode_vllm`. docs/benchmarks.md describes the figures.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import time
from typing import Any

import jax.numpy as jnp
import numpy as np

from rlvr_jax.bench import common, decode_long, decode_vllm, decode_weights, multiturn, progress
from rlvr_jax.bench import engine_timing as timing
from rlvr_jax.bench.common import option
from rlvr_jax.bench.decode_long import QUICK_LONG, LongConfig
from rlvr_jax.bench.inputs import build_models
from rlvr_jax.bench.roofline import best_roofline
from rlvr_jax.bench.table import Bars, Bench
from rlvr_jax.bench.waste import continuous_steps, static_steps, waste
from rlvr_jax.rollout import EngineCore, SamplingParams, generate


@dataclasses.dataclass(frozen=True)
class BenchConfig(common.ModelSize):
    """One `rlvr-bench decode` run: the model (`common.ModelSize`), the sizes, the workload."""

    batch: int = 32
    """Slots, and prompts of the throughput workload."""
    prompt: int = 64
    """Throughput workload: prompt tokens."""
    new: int = 128
    """Throughput workload: generated tokens per prompt."""
    long_requests: int = option(192, "--tail-requests")
    """Long-tailed workload: requests."""
    long_prompt: int = option(32, "--tail-prompt")
    """Long-tailed workload: prompt tokens."""
    long_new: int = option(256, "--tail-new")
    """Long-tailed workload: the longest budget."""
    mean_over_max: float = 0.45
    """Long-tailed workload: mean / max of the budgets."""
    chunk: int = 8
    """Decode steps per engine call."""
    repeats: int = 2
    """Timed repeats per measurement (the best is kept)."""
    seed: int = 0
    """Seed of the weights and prompts."""
    dtype: str = option("float32", choices=("float32", "bfloat16"))
    """Params, activations and KV cache of both models."""
    workload: str = option("short", choices=("short", "long", "all", "multiturn", "step"))
    """short: throughput + long-tailed; long: paged vs contiguous KV; all: the three; multiturn:
    in-slot tool turns vs re-prefilling each turn; step: the decode step alone at --shapes."""
    profile: bool = False
    """The decode step's top ops by time (short/all: the continuous engine's; step: each's)."""
    shapes: str = "32x192,256x1024"
    """Step workload: SLOTSxCONTEXT,... (each weight dtype timed at each)."""
    skip_hf: bool = False
    """Do not time transformers' generate."""
    weight_dtype: str = option("", choices=("float32", "bfloat16", "int8", "fp8"))
    """Decode from weights stored so, against the compute dtype, with the mismatch it causes."""
    lora_rank: int = 0
    """LoRA adapters of this rank: time their push."""
    long: LongConfig = dataclasses.field(default_factory=LongConfig)
    """The long workload's sizes."""
    peer: str = option("", choices=("vllm",))
    """vllm: our continuous engine beside vLLM on the throughput workload."""
    peer_dtypes: tuple[str, ...] = option(decode_vllm.DTYPES, choices=decode_vllm.DTYPES)
    """--peer: the dtypes compared, one HF checkpoint each (repeatable)."""
    quick: bool = option(False, None)
    """The smoke test's sizes (`--quick`): the roofline probe's too."""

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.lora_rank < 0:
            raise ValueError(f"repeats must be >= 1, lora_rank >= 0; got {self.repeats}")
        step_shapes(self.shapes)
        if self.profile and (self.peer or self.workload not in ("short", "all", "step")):
            raise ValueError("--profile: with --workload short, all or step (no --peer)")


def step_shapes(text: str) -> list[tuple[int, int]]:
    """`--shapes` ("32x192,256x1024") as (slots, context) pairs; a ValueError naming a bad one."""
    out = []
    for item in text.split(","):
        slots, _, context = item.strip().partition("x")
        if not (slots.isdigit() and context.isdigit() and int(slots) and int(context) > 1):
            raise ValueError(f"--shapes: {item!r} is not SLOTSxCONTEXT (e.g. 256x1024)")
        out.append((int(slots), int(context)))
    return out


QUICK = BenchConfig(
    **common.TINY_SIZES, batch=4, prompt=8, new=8, long_requests=12, chunk=4, repeats=1,
    long=QUICK_LONG, quick=True, shapes="4x32,8x64",
)  # fmt: skip
PRESETS = {
    "bench": BenchConfig(),
    "quick": QUICK,
    "gpu-1b": BenchConfig(**common.SIZES_1B, dtype="bfloat16", long_requests=64, long_new=128),
}
"""`--preset`: the 56M bench model, the smoke test's, and ≈1B in bf16 (`common.SIZES_1B`)."""


def long_tail_lengths(n: int, max_len: int, mean_over_max: float, seed: int) -> list[int]:
    """`n` budgets ceil(max_len · u^γ), u ~ Uniform(0, 1) (1 for one request), γ bisected so
    that mean/max ~ `mean_over_max` (skewed short with a tail to the max, as RL lengths)."""
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
        sample = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new)
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), **sample)
        if ids.is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    if out.shape[1] != prompts.shape[1] + new:
        raise RuntimeError(f"HF generated {out.shape[1] - prompts.shape[1]} tokens, not {new}")
    return seconds


_BATCHING = ("continuous", "static")


def run(cfg: BenchConfig) -> dict:
    """The config's workload (or peer, or decode weights); the JSON-able result."""
    if cfg.peer == "vllm":
        return decode_vllm.run(cfg)
    if cfg.workload == "multiturn":
        return multiturn.run(cfg)
    if cfg.workload == "step":
        return run_step(cfg)
    if cfg.weight_dtype or cfg.lora_rank:
        return decode_weights.run(cfg)
    if cfg.workload == "long":
        return decode_long.run(cfg)
    result = run_short(cfg)
    if cfg.workload == "all":
        result["long"] = decode_long.run(cfg)["long"]
    return result


def run_short(cfg: BenchConfig) -> dict:
    """The throughput and long-tailed workloads, the profile and the roofline probe."""
    rng = np.random.default_rng(cfg.seed)
    progress.line("building the model (random weights, HF's twin unless --skip-hf)")
    if cfg.skip_hf:
        hf, model = None, cfg.model(cfg.seed, cfg.dtype)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            hf, model = build_models(cfg, tmp)
    prompts_np = rng.integers(0, cfg.vocab, size=(cfg.batch, cfg.prompt))
    prompts = prompts_np.tolist()
    core = EngineCore(model, max_slots=cfg.batch, max_len=cfg.prompt + cfg.new, chunk=cfg.chunk)
    n_tokens = cfg.batch * cfg.new
    kw = dict(max_new_tokens=cfg.new, temperature=1.0, seed=cfg.seed)
    throughput = {
        b: functools.partial(generate, core, prompts, batching=b, **kw) for b in _BATCHING
    }
    if not cfg.skip_hf:
        throughput["hf_generate"] = functools.partial(_hf_generate, hf, prompts_np, cfg.new)
        _hf_generate(hf, prompts_np[:, : min(8, cfg.prompt)], 2)  # warm up
    walls = timing.timed_generate(throughput, cfg.repeats, n_tokens, warm=_BATCHING)[0]
    tokens_per_s = {k: n_tokens / v for k, v in walls.items()}

    lengths = long_tail_lengths(cfg.long_requests, cfg.long_new, cfg.mean_over_max, cfg.seed)
    long_prompts = rng.integers(0, cfg.vocab, size=(cfg.long_requests, cfg.long_prompt)).tolist()
    long_core = EngineCore(
        model, max_slots=cfg.batch, max_len=cfg.long_prompt + cfg.long_new, chunk=cfg.chunk
    )
    progress.line("long-tailed workload: compiling and warming up")
    timing.run_lengths(long_core, long_prompts[: cfg.batch], lengths[: cfg.batch], "continuous")
    long_runs = {b: functools.partial(timing.run_lengths, long_core, long_prompts, lengths, b)
                 for b in _BATCHING}  # fmt: skip
    long_walls, stats = timing.interleaved_best(long_runs, cfg.repeats)
    progress.line("profile: prefill and decode step")
    profile = timing.profile_engine(core, prompts, cfg.repeats)
    live = timing.LiveSlots(core, prompts[0]) if cfg.profile else None
    ops = live and timing.step_profile(live, "continuous")
    host = timing.host_share(core, throughput["continuous"])
    roof = best_roofline(cfg.quick)
    fraction = timing.roofline_fractions(model.config, cfg, roof, walls)
    wall = walls["continuous"]
    prefill_total = profile["prefill_s_per_prompt"] * cfg.batch
    decode_total = profile["decode_ms_per_step"] * 1e-3 * cfg.new
    step = common.step_bandwidth(  # the KV cache at the prompt length
        model.config, roof, profile["decode_ms_per_step"] * 1e-3, slots=cfg.batch,
        context=cfg.prompt, param_bytes=model.param_dtype.itemsize,
        cache_bytes=jnp.dtype(core.spec.cache_dtype).itemsize,
    )  # fmt: skip
    profile.update(
        continuous_wall_s=wall,
        prefill_share=prefill_total / wall,
        decode_share=decode_total / wall,
        host_and_other_share=1 - (prefill_total + decode_total) / wall,
        host_share=host["share"],
        host_s=host["host_s"],
        host_run_wall_s=host["wall_s"],
        **{f"decode_step_{k.removeprefix('step_')}": v for k, v in step.items()},
    )
    hf_ratio = None if cfg.skip_hf else tokens_per_s["continuous"] / tokens_per_s["hf_generate"]
    return {
        "tokens_per_s": tokens_per_s,
        "wall_s": long_walls,
        "roofline_fraction": fraction["continuous"],
        "roofline_fraction_by_mode": fraction,
        "decode_step_memory_fraction": profile["decode_step_memory_fraction"],
        "ratios": {
            "continuous_over_hf_tokens_per_s": hf_ratio,
            "continuous_over_static_wall_long_tail": long_walls["continuous"]
            / long_walls["static"],
        },
        "long_tail": {
            "requests": cfg.long_requests,
            "mean_over_max": float(np.mean(lengths) / np.max(lengths)),
            "predicted_waste": {
                "static": waste(lengths, static_steps(lengths, cfg.batch), cfg.batch),
                "continuous": waste(lengths, continuous_steps(lengths, cfg.batch), cfg.batch),
            },
            **{
                k: {b: getattr(s, k) for b, s in stats.items()}
                for k in ("waste", "decode_steps", "decode_calls")
            },
        },
        "profile": profile,
        "op_profile": ops and {"continuous": ops[0]},
        "top_ops": ops and ops[1],
        "roofline": roof,
        "machine": {
            "torch_omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "hf_device": str(hf.device) if hf is not None else None,
        },
        "config": {
            "model": model.config.to_hf(),
            "params": model.config.n_params(),
            "sampling": dataclasses.asdict(SamplingParams()),
        },
    }


def run_step(cfg: BenchConfig) -> dict:
    """The step workload (module docstring); the JSON-able result."""
    model, rng = cfg.model(cfg.seed, cfg.dtype), np.random.default_rng(cfg.seed)
    dtypes = tuple(dict.fromkeys((cfg.dtype, cfg.weight_dtype or cfg.dtype)))
    step, seconds, ratios, ops, top = {}, {}, {}, {}, {}
    for slots, context in step_shapes(cfg.shapes):
        prompt, shape = rng.integers(0, cfg.vocab, context).tolist(), f"{slots}x{context}"
        progress.line(f"step {shape}: compiling {', '.join(dtypes)}")
        max_len = context + cfg.chunk * (cfg.repeats + 5)  # warm-up, rounds and the profile
        live = {
            wd: timing.LiveSlots(EngineCore(model, max_slots=slots, max_len=max_len,
                                            chunk=cfg.chunk,
                                            weight_dtype=None if wd == cfg.dtype else wd), prompt)
            for wd in dtypes
        }  # fmt: skip
        for one in live.values():
            if cfg.profile:  # the profiled program runs the timed chunks too: one compile
                one.hlo()
            one.chunk()
        chunks = {wd: one.chunk for wd, one in live.items()}
        best = timing.interleaved_best(chunks, cfg.repeats + 2)[0]
        for wd, one in live.items():
            key, cache = f"{shape} {wd}", jnp.dtype(one.core.spec.cache_dtype).itemsize
            seconds[key] = (best[wd] / cfg.chunk, dict(slots=slots, context=context,
                            param_bytes=common.WEIGHT_BYTES[wd], cache_bytes=cache))  # fmt: skip
            if cfg.profile:
                progress.line(f"step {key}: tracing {cfg.chunk} steps")
                ops[key], more = timing.step_profile(one, key)
                top.update(more)
        for wd in dtypes[1:]:
            ratios[shape] = {f"{wd}_over_{dtypes[0]}_tokens_per_s": best[dtypes[0]] / best[wd]}
        del live
    roof = best_roofline(cfg.quick)
    for key, (step_s, sizes) in seconds.items():
        figures = common.step_bandwidth(model.config, roof, step_s, **sizes)
        step[key] = {"ms_per_step": 1e3 * step_s, "tokens_per_s": sizes["slots"] / step_s,
                     **figures}  # fmt: skip
    return {
        "step": step,
        "ratios": ratios,
        "op_profile": ops or None,
        "top_ops": top or None,
        "roofline": roof,
        "config": {"model": model.config.to_hf(), "params": model.config.n_params()},
    }


_SHARES = ("prefill_share", "decode_share", "host_and_other_share")
BENCH = Bench(
    BenchConfig,
    run,
    presets=PRESETS,
    headlines=(
        "tokens_per_s",
        "roofline_fraction",
        "decode_step_memory_fraction",
        "ratios",
        "long_tail/waste",
        "profile/host_share",
        "long/tokens_per_s",
        "long/ratios",
        "long/kv_utilisation",
        "multiturn/tokens_per_s",
        "multiturn/in_slot_over_reprefill",
        "multiturn/roofline_fraction",
        "peers/vllm/tokens_per_s",
        "mismatch",
        "push/seconds",
        "apply/faster",
        "step",
        "op_profile",
        "top_ops",
    ),
    plot=(
        Bars("throughput (batch workload)", "tokens/s", "tokens_per_s"),
        Bars("long-tailed workload", "wall seconds", "wall_s"),
        Bars("continuous engine: share of wall", "fraction", "profile", _SHARES),
        Bars("long: paged vs contiguous", "tokens/s", "long/tokens_per_s"),
        Bars("multiturn: generated tokens/s", "tokens/s", "multiturn/tokens_per_s"),
        Bars("multiturn: prefilled tokens", "tokens", "multiturn/prefilled_tokens"),
    ),
)
