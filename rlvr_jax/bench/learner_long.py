"""`rlvr-bench learner --workload long`: the learner on long-tailed RL lengths (OLMo 3's,
scaled to `cap`; `CPU_CAP` on a CPU), packed rows (`collate_packed`) against padded ones
(`collate`) in interleaved rounds of the real train step (useful tokens/s), and the attention
kernels' peak memory on a one-row micro-batch of `memory_seq` tokens."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import losses
from rlvr_jax.bench import attention_memory, common, progress
from rlvr_jax.bench.inputs import compiled_train_step, random_sample
from rlvr_jax.bench.waste import LengthDistribution

OLMO3 = LengthDistribution.fit(mean=14_700.0, cap=32_768, sigma=0.7)
"""OLMo 3 Think's RL response lengths: clipped log-normal, mean 14.7K of a 32K budget."""
FULL_CAP = 4096
"""The issue's long shape: OLMo 3's lengths scaled to this many tokens per row."""
CPU_CAP = 1024
"""The default on a CPU (the full shape would take hours there); mean/max is kept."""


@dataclasses.dataclass(frozen=True)
class LongWorkload:
    """The long-context learner workload's shape."""

    cap: int = FULL_CAP
    """Row budget: prompt + completion tokens of the longest sample (the full length)."""
    completions: int = 64
    """Samples per optimizer step (the same batch for both layouts)."""
    micro_rows: int = 8
    """Padded rows per micro-batch; the packed token budget is this many full rows."""
    memory_seq: int = 8192
    """Tokens per row of the attention-memory figure."""
    seed: int = 0
    """Seed of the lengths, tokens and params."""

    def __post_init__(self) -> None:
        if self.cap < 128:
            raise ValueError(f"--long-cap must be >= 128 tokens, got {self.cap}")
        if self.memory_seq < 2:
            raise ValueError(f"--long-memory-seq must be >= 2 tokens, got {self.memory_seq}")
        if self.completions < 2 or self.micro_rows < 1 or self.completions % self.micro_rows:
            raise ValueError(
                f"need >= 2 completions and micro_rows ({self.micro_rows}) dividing them "
                f"({self.completions}): set --batch and --n-micro so"
            )

    @property
    def prompt_range(self) -> tuple[int, int]:
        """(shortest, longest) prompt in tokens."""
        return max(self.cap // 64, 1), self.cap // 16

    def lengths(self) -> LengthDistribution:
        """OLMo 3's completion lengths scaled to the room left after the longest prompt."""
        return OLMO3.scaled(self.cap - self.prompt_range[1])


def samples(work: LongWorkload, vocab: int) -> list[Any]:
    """`completions` RL samples: prompts uniform in `prompt_range`, completions of `lengths()`."""
    rng = np.random.default_rng(work.seed)
    lo, hi = work.prompt_range
    lengths = work.lengths().sample(work.completions, work.seed)
    return [random_sample(rng, vocab, int(rng.integers(lo, hi + 1)), n) for n in lengths.tolist()]


def layouts(work: LongWorkload, batch: list[Any]) -> dict[str, tuple[Any, int | None]]:
    """{"padded": (RLBatch, n_micro), "packed": (RLBatch, None)} of the same samples on rows of
    the batch's length bucket T (positions; rows hold T + 1 tokens before the shift)."""
    from rlvr_jax.training.batch import bucket_length, collate, collate_packed

    longest = max(len(s.prompt_tokens) + len(s.tokens) for s in batch)
    T = bucket_length(longest, full=work.cap, min_len=32)
    padded = collate(batch, rows=len(batch), seq_len=T + 1, pad_id=0)
    packed, _ = collate_packed(
        batch, rows=len(batch), seq_len=T + 1, pad_id=0, max_tokens=work.micro_rows * (T + 1)
    )
    return {"padded": (padded, len(batch) // work.micro_rows), "packed": (packed, None)}


def _compile_step(cfg: Any, work: LongWorkload, name: str, arrays: Any, n_micro: int | None):
    """The train step on one layout compiled ahead of time: (call, facts)."""
    from rlvr_jax.training import update

    if losses.resolve_loss_settings(cfg.loss).tis_mode == "mask":
        arrays = arrays.replace(old_logp_BxT=arrays.sampler_logp_BxT)
    rows, T = arrays.tokens.rows, arrays.tokens.length
    progress.line(f"{name}: {rows} rows x {T} positions")
    call, train, compile_s, _, _ = compiled_train_step(
        cfg, arrays, max_len=work.cap, n_micro=n_micro, seed=work.seed
    )
    facts = {
        "compile_s": compile_s,
        "rows": rows,
        "positions": T,
        "n_micro": update.micro_count(arrays.tokens, n_micro),
        "computed_tokens": rows * T,
        "memory": common.compiled_memory(train),
    }
    return call, facts


def _time_interleaved(calls: dict[str, Any], repeats: int) -> dict[str, dict[str, Any]]:
    """`common.time_calls` of the train steps, each checked finite: seconds (all, best), loss."""
    loss: dict[str, float] = {}

    def checked(name: str, call: Any) -> None:
        metrics = jax.device_get(call())
        if not (np.isfinite(metrics["loss"]) and metrics["step_ok"] == 1.0):
            raise RuntimeError(f"the {name} train step is not finite: {metrics}")
        loss[name] = float(metrics["loss"])

    timed = common.time_calls(
        {name: functools.partial(checked, name, call) for name, call in calls.items()}, repeats
    )
    return {name: {"all_s": list(t.wall_s), "cpu_s": list(t.cpu_s), "loss": loss[name],
                   "seconds": t.best, "cpu_seconds": min(t.cpu_s)}
            for name, t in timed.items()}  # fmt: skip


def measure(cfg: Any, work: LongWorkload) -> dict[str, Any]:
    """Packed vs padded train steps, then the kernels' memory; the JSON-able `long` result."""
    arch = cfg.arch()
    batch = samples(work, arch.vocab_size)
    useful = sum(len(s.prompt_tokens) + len(s.tokens) for s in batch)
    dist = work.lengths()
    n_completion = np.asarray([len(s.tokens) for s in batch])
    compiled = {
        name: _compile_step(cfg, work, name, arrays, n_micro)
        for name, (arrays, n_micro) in layouts(work, batch).items()
    }
    timed = _time_interleaved({name: c[0] for name, c in compiled.items()}, cfg.repeats)
    runs = {name: {**timed[name], **compiled[name][1]} for name in compiled}
    tps = {name: useful / r["seconds"] for name, r in runs.items()}
    per_cpu = {name: useful / r["cpu_seconds"] for name, r in runs.items()}
    peak: dict[str, dict[str, float]] = {}
    for kernel in attention_memory.kernels_here(jnp.dtype(cfg.dtype), arch.head_dim):
        progress.line(f"attention memory: {kernel} kernel, 1 row x {work.memory_seq} tokens")
        peak[kernel] = attention_memory.micro_batch_memory(cfg, kernel, work.memory_seq, 1)
    return {
        "useful_tokens_per_s": tps,
        "packed_over_padded": tps["packed"] / tps["padded"],
        "useful_tokens_per_cpu_s": per_cpu,
        "packed_over_padded_cpu": per_cpu["packed"] / per_cpu["padded"],
        "useful_tokens": useful,
        "padding_fraction": {k: 1 - useful / r["computed_tokens"] for k, r in runs.items()},
        "runs": runs,
        "lengths": {
            **dist.describe(),
            "completion_mean": float(n_completion.mean()),
            "completion_max": int(n_completion.max()),
            "mean_over_max": float(n_completion.mean() / dist.cap),
            "prompt_range": list(work.prompt_range),
            "scaled_from": OLMO3.describe(),
        },
        "memory_seq": work.memory_seq,
        "attention_peak_bytes": {k: v["peak_bytes"] for k, v in peak.items()},
        "attention_memory": peak,
        "workload": dataclasses.asdict(work),
        "scaled_down": work.cap < FULL_CAP,
    }


def run(cfg: Any) -> dict[str, Any]:
    """`measure` on the learner config's workload (`long_cap`, 0: the platform's), the roofline."""
    from rlvr_jax.bench.roofline import measure_roofline

    cap = cfg.long_cap or (CPU_CAP if common.machine_info()["platform"] == "cpu" else FULL_CAP)
    work = LongWorkload(cap=cap, completions=cfg.batch, micro_rows=cfg.batch // cfg.n_micro,
                        memory_seq=cfg.long_memory_seq, seed=cfg.seed)  # fmt: skip
    if work.cap < FULL_CAP:
        progress.line(
            f"scaled down: rows of {work.cap} tokens instead of {FULL_CAP} (mean/max kept), "
            f"{work.completions} completions per step"
        )
    roofline = measure_roofline(size=cfg.roofline_size, bandwidth_mib=cfg.roofline_mib)
    return {
        "long": measure(cfg, work),
        "roofline": roofline,
        "config": {"model": cfg.arch().to_hf()},
    }
