"""`rlvr-bench learner`: train-step tokens/s of the real learner (the loss preset, `n_micro`
accumulation, AdamW; `inputs.synthetic_batch`) and of the old-log-prob forward, with the FLOPs
fraction achieved (`common.train_flops`; LoRA: the base's forward and activation backward plus
6·P_lora a token) against the measured peak (`_peak_gflops`), `mfu` against the datasheet."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import losses, models
from rlvr_jax.bench import attention_memory, common, learner_long, progress
from rlvr_jax.bench.common import option
from rlvr_jax.bench.inputs import compiled_train_step, synthetic_batch
from rlvr_jax.bench.table import Bars, Bench
from rlvr_jax.models import lora, quant
from rlvr_jax.models.attention import IMPLS, resolve_impl

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
"""Short names `--dtype` takes."""


@dataclasses.dataclass(frozen=True)
class LearnerBenchConfig(common.ModelSize):
    """One learner benchmark: the model (`common.ModelSize`), the batch and how it is timed."""

    batch: int = 32
    """Rows per optimizer step."""
    seq: int = 256
    """Token positions per row the learner computes (prompt + completion, padded)."""
    n_micro: int = 1
    """Gradient-accumulation micro-batches per step (must divide `batch`)."""
    dtype: str = option("float32", choices=("float32", "bfloat16"), type=lambda s: DTYPES.get(s, s))
    """Compute dtype of the matmuls (params, LM head and log-softmax stay fp32; fp32, bf16)."""
    loss: str = "olmo3"
    """Loss preset (`rlvr_jax.losses.resolve_loss_settings`)."""
    remat: bool = False
    """Rematerialise each decoder layer in the backward pass (`train.remat`)."""
    attn_chunk: int = 0
    """Queries per attention chunk, 0 = all at once (`train.attn_chunk`; must divide `seq`)."""
    logits_chunk: int = 0
    """Positions per LM-head + log-softmax chunk, 0 = all at once (`train.logits_chunk`)."""
    attention_impl: str = option("auto", "--attention", choices=IMPLS)
    """Attention kernel (`model.attention_impl`: auto | xla | blockwise | cudnn | splash)."""
    repeats: int = 3
    """Timed calls per measurement after one warm-up call (the best is reported)."""
    seed: int = 0
    """Seed of the params and the batch."""
    roofline_size: int = 2048
    """Square matmul size of the peak probe (large enough to saturate the device)."""
    roofline_mib: int = 256
    """Array size of the bandwidth probe in MiB."""
    profile: bool = True
    """Also time the LM head + log-softmax and the optimizer update on their own."""
    lora_rank: int = 0
    """LoRA rank on every projection (0 = the whole model trains)."""
    weight_dtype: str = option("", choices=("float32", "bfloat16", "int8"))
    """Storage of the weights ("" = float32; with LoRA the frozen base may be int8)."""
    workload: str = option("step", choices=("step", "attention-memory", "long"))
    """step: time the train step; attention-memory: one micro-batch's peak memory per attention
    kernel; long: packed vs padded rows."""
    device_kind: str = ""
    """Device kind for the datasheet lookup ("" = detected)."""
    datasheet_tflops: float = 0.0
    """Datasheet bf16 TFLOP/s, the MFU base (0 = the device's datasheet entry)."""
    trace: str = ""
    """Profile one more step into this directory and list its top ops."""
    seqs: tuple[int, ...] = attention_memory.SEQS
    """attention-memory: the row lengths T."""
    long_cap: int = 0
    """long: tokens per row (0 = 4096; 1024 on a CPU, mean/max kept)."""
    long_memory_seq: int = 8192
    """long: tokens per row of the attention-memory figure."""

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab", "batch",
                     "repeats"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq < 2:
            raise ValueError(f"seq must be >= 2 (a prompt token and a completion), got {self.seq}")
        if self.n_micro < 1 or self.batch % self.n_micro:
            raise ValueError(f"n_micro={self.n_micro} must be >= 1 and divide batch={self.batch}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        if self.lora_rank < 0 or self.weight_dtype not in ("", "float32", "bfloat16", "int8"):
            raise ValueError("lora_rank must be >= 0 and weight_dtype float32|bfloat16|int8")
        if self.weight_dtype == "int8" and not self.lora_rank:
            raise ValueError("--weight-dtype int8 stores a frozen LoRA base: give --lora-rank")
        if len(self.seqs) < 3 or list(self.seqs) != sorted(set(self.seqs)) or self.seqs[0] < 2:
            raise ValueError(f"seqs: need at least 3 increasing lengths >= 2, got {self.seqs}")
        if self.datasheet_tflops < 0:
            raise ValueError(f"datasheet_tflops must be >= 0, got {self.datasheet_tflops}")
        losses.resolve_loss_settings(self.loss)  # a LossSettingsError (ValueError) names it
        for name in ("attn_chunk", "logits_chunk"):
            chunk = getattr(self, name)
            if chunk < 0 or (chunk and (chunk >= self.seq or self.seq % chunk)):
                raise ValueError(
                    f"{name}={chunk} must be 0 (off) or a divisor of seq={self.seq} below it"
                )

    def policy(self) -> Any:
        """The random bench policy: in `weight_dtype`, or LoRA adapters over a base stored so."""
        from rlvr_jax.config.schema import LoraConfig

        arch, key = self.arch(), jax.random.key(self.seed)
        dtype = "bfloat16" if self.weight_dtype == "bfloat16" else "float32"
        model = models.Model(arch, models.init_params(arch, key, dtype))
        base = "int8" if self.weight_dtype == "int8" else "param"
        settings = LoraConfig(rank=self.lora_rank, alpha=2.0 * self.lora_rank, base_dtype=base)
        return models.adapt_lora(model, settings, seed=self.seed)

    def memory(self) -> Any:
        """The learner's `MemoryOptions` of this config."""
        from rlvr_jax.training.learner import MemoryOptions

        return MemoryOptions(
            remat=self.remat,
            attn_chunk=self.attn_chunk,
            logits_chunk=self.logits_chunk,
            attention_impl=self.attention_impl,
            max_segments=1,  # the bench's rows: one sequence each, right-padded
        )


PRESETS: dict[str, LearnerBenchConfig] = {
    # 2-core CPU: micro-batches of 8 rows, the LM head 128 positions a time (temp 9.5 -> 2.5 GB)
    "cpu": LearnerBenchConfig(n_micro=4, logits_chunk=128),
    "quick": LearnerBenchConfig(
        **common.TINY_SIZES, batch=4, seq=32, repeats=1, roofline_size=256, roofline_mib=16
    ),
    "gpu-1b": LearnerBenchConfig(
        **common.SIZES_1B, batch=32, seq=1024, n_micro=2, dtype="bfloat16", repeats=5,
        roofline_size=8192, roofline_mib=1024,
    ),
}  # fmt: skip
"""`cpu` (the default: the bench model, 32 × 256 tokens), `quick`, `gpu-1b` (≈1B, bf16, one GPU)."""


def _profile_pieces(
    cfg: LearnerBenchConfig, arch: models.ArchConfig, params: Any, optimizer: Any
) -> dict[str, common.Timings]:
    """Seconds of the LM head + log-softmax (forward and backward from hidden states, all of
    [B, T, V] at once) and of the optimizer update alone: the step's pieces besides the layers."""
    rng = np.random.default_rng(cfg.seed + 1)
    hidden_BxTxD = jnp.asarray(rng.standard_normal((cfg.batch, cfg.seq, arch.d_model)), jnp.float32)
    targets_BxT = jnp.asarray(rng.integers(0, arch.vocab_size, (cfg.batch, cfg.seq)), jnp.int32)

    def head_loss(p: Any, h_BxTxD: jax.Array) -> jax.Array:
        logits_BxTxV = models.lm_head(p, arch, h_BxTxD)
        logz_BxT = jax.nn.logsumexp(logits_BxTxV, axis=-1)
        picked_BxT = jnp.take_along_axis(logits_BxTxV, targets_BxT[..., None], axis=-1)[..., 0]
        return jnp.sum(picked_BxT - logz_BxT)

    head_params = {k: v for k, v in params.items() if k in ("embedding", "lm_head")}
    argnums = (1,) if lora.has_adapters(params) else (0, 1)  # LoRA: the head is frozen
    head, _ = common.compile_ahead(
        jax.value_and_grad(head_loss, argnums=argnums), head_params, hidden_BxTxD
    )

    params = lora.split(params)[0]  # what the optimizer updates
    grads = jax.tree_util.tree_map(lambda x: jnp.full_like(x, 1e-3), params)
    opt_state = optimizer.init(params)

    def update(g: Any, s: Any, p: Any) -> tuple[Any, Any]:
        import optax

        updates, s = optimizer.update(g, s, p)
        return optax.apply_updates(p, updates), s

    upd, _ = common.compile_ahead(update, grads, opt_state, params)
    return common.time_calls(
        {
            "lm_head_logsoftmax_fwd_bwd": lambda: head(head_params, hidden_BxTxD),
            "optimizer_update": lambda: upd(grads, opt_state, params),
        },
        cfg.repeats,
    )


def _peak_gflops(roofline: dict, after_fp32: float, platform: str) -> float:
    """The denominator: the larger fp32 probe on a CPU, the best dtype's on an accelerator."""
    fp32 = max(roofline["matmul_gflops"]["float32"], after_fp32)
    return fp32 if platform == "cpu" else max(fp32, roofline["matmul_gflops"]["bfloat16"])


def measure(cfg: LearnerBenchConfig, *, trace_dir: str | None = None) -> dict[str, Any]:
    """Times the train step, the old-log-prob forward and the profile pieces; the raw figures."""
    from rlvr_jax.training import learner

    arch = cfg.arch()
    settings = losses.resolve_loss_settings(cfg.loss)
    old_from = "batch" if settings.tis_mode == "mask" else "self"
    params = cfg.policy().params
    arrays = synthetic_batch(
        arch, rows=cfg.batch, seq=cfg.seq, seed=cfg.seed, with_old_logp=old_from == "batch"
    )
    train_call, train, train_compile_s, holder, optimizer = compiled_train_step(
        cfg, arrays, max_len=cfg.seq, n_micro=cfg.n_micro, seed=cfg.seed, params=params
    )
    batch = jax.tree.map(jnp.asarray, arrays)
    timings = common.time_calls({"train_step": train_call}, cfg.repeats)
    metrics = jax.device_get(train_call())
    trainable = lora.split(holder["state"].params)[0]
    if not (np.isfinite(metrics["loss"]) and metrics["step_ok"] == 1.0):
        raise RuntimeError(f"the benchmarked train step is not finite: {metrics}")
    logprob_fn = learner.make_logprob_fn(
        arch, compute_dtype=jnp.dtype(cfg.dtype), temperature=1.0, memory=cfg.memory()
    )
    params = holder["state"].params
    fwd, fwd_compile_s = common.compile_ahead(logprob_fn, params, batch)
    timings |= common.time_calls({"logprob_forward": lambda: fwd(params, batch)}, cfg.repeats)
    return {
        "timings": timings,
        "compile_s": {"train_step": train_compile_s, "logprob_forward": fwd_compile_s},
        "memory": {"train_step": common.compiled_memory(train),
                   "logprob_forward": common.compiled_memory(fwd)},
        "loss": {"value": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"])},
        "lora": {
            "rank": cfg.lora_rank,
            "trainable_params": lora.size(trainable),
            "optimizer_state_bytes": quant.nbytes(holder["state"].opt_state),
            "full_optimizer_state_bytes": 2 * 4 * arch.n_params(),
            "frozen_bytes": quant.nbytes(lora.split(params)[1] or {}),
        },
        "profile": _profile_pieces(cfg, arch, params, optimizer) if cfg.profile else {},
        "op_profile": common.op_profile(train_call, trace_dir) if trace_dir else None,
        "old_from": old_from,
    }  # fmt: skip


def summarize(
    cfg: LearnerBenchConfig,
    measured: dict[str, Any],
    *,
    peak_gflops: float,
    datasheet: tuple[str, float] | None,
) -> dict[str, Any]:
    """The figures of `measured` against `peak_gflops`, MFU against `datasheet` (name, TFLOP/s)."""
    arch = cfg.arch()
    tokens = cfg.batch * cfg.seq
    forward = common.forward_flops(arch, cfg.batch, cfg.seq)
    train = common.train_flops(arch, cfg.batch, cfg.seq)
    if cfg.lora_rank:  # no weight gradients of the frozen base; the adapters' full 6·P·T
        train = 2 * forward + 6.0 * measured["lora"]["trainable_params"] * tokens
    flops = {"train_step": train, "logprob_forward": forward}
    timings: dict[str, common.Timings] = measured["timings"]
    best = {k: t.best for k, t in timings.items()}
    gflops = {k: flops[k] / best[k] / 1e9 for k in flops}
    fraction = {k: v / peak_gflops for k, v in gflops.items()}
    mfu = None
    if datasheet is not None:
        mfu = {"datasheet": datasheet[0], "peak_tflops_bf16": datasheet[1]}
        mfu.update({k: v / (datasheet[1] * 1e3) for k, v in gflops.items()})
    cpus = os.cpu_count() or 1
    profile = {}
    for name, piece in measured["profile"].items():
        profile[f"{name}_s"] = piece.best
        profile[f"{name}_share"] = piece.best / best["train_step"]
        profile[f"{name}_cpu_share"] = piece.cpu_share(cpus)
    return {
        "tokens_per_s": {k: tokens / s for k, s in best.items()},
        "achieved_flops_fraction": fraction["train_step"],
        "logprob_forward": {
            "tokens_per_s": tokens / best["logprob_forward"],
            "flops_fraction": fraction["logprob_forward"],
            "over_train_step_seconds": best["logprob_forward"] / best["train_step"],
        },
        "flops_fraction": fraction,
        "achieved_gflops": gflops,
        "mfu": mfu,
        "seconds": {"best": best, "all": {k: list(t.wall_s) for k, t in timings.items()},
                    "compile": measured["compile_s"]},
        "cpu_share": {k: t.cpu_share(cpus) for k, t in timings.items()},
        "flops": {**flops, "tokens_per_step": tokens, "params": arch.n_params(),
                  "matmul_params": common.matmul_params(arch)},
        "profile": profile,
        "op_profile": measured["op_profile"],
        "memory": measured["memory"],
        "loss": measured["loss"],
        "lora": measured["lora"],
    }  # fmt: skip


def run(cfg: LearnerBenchConfig) -> dict[str, Any]:
    """The config's workload: `run_step`, `attention_memory.run` or `learner_long.run`."""
    if cfg.workload == "attention-memory":
        memory = attention_memory.measure(cfg, seqs=cfg.seqs)
        return {"attention_memory": memory, "config": {"model": cfg.arch().to_hf()}}
    if cfg.workload == "long":
        return learner_long.run(cfg)
    return run_step(cfg)


def run_step(cfg: LearnerBenchConfig) -> dict[str, Any]:
    """The roofline, the learner, the fp32 peak again; MFU where a datasheet applies."""
    from rlvr_jax.bench.roofline import matmul_gflops, measure_roofline

    roofline = measure_roofline(size=cfg.roofline_size, bandwidth_mib=cfg.roofline_mib)
    progress.line("train step and log-prob forward")
    measured = measure(cfg, trace_dir=cfg.trace or None)
    progress.line("fp32 matmul peak again")
    after_fp32 = matmul_gflops(cfg.roofline_size, jnp.float32)
    machine = common.machine_info()
    if cfg.datasheet_tflops:
        datasheet = ("--datasheet-tflops", cfg.datasheet_tflops)
    elif machine["platform"] != "cpu" or cfg.device_kind:
        sheet = common.datasheet(cfg.device_kind or machine["device_kind"])
        datasheet = sheet and (sheet["name"], sheet["bf16_tflops"])
    else:
        datasheet = None
    peak = _peak_gflops(roofline, after_fp32, machine["platform"])
    on_cpu = machine["platform"] == "cpu"
    return {
        **summarize(cfg, measured, peak_gflops=peak, datasheet=datasheet),
        "roofline": {
            "peak_gflops": peak,
            "denominator": "fp32 matmul" if on_cpu else "best-dtype matmul",
            "matmul_gflops": roofline["matmul_gflops"],
            "matmul_gflops_fp32_after": after_fp32,
            "memory_gbps": roofline["memory_gbps"],
        },
        "config": {"old_from": measured["old_from"],
                   "model": cfg.arch().to_hf(), "attention_kernel": attention_kernel(cfg),
                   "loss_settings": dataclasses.asdict(losses.resolve_loss_settings(cfg.loss))},
    }  # fmt: skip


def attention_kernel(cfg: LearnerBenchConfig) -> str:
    """The kernel `cfg.attention_impl` resolves to here for rows of one sequence each."""
    kw = dict(compute_dtype=jnp.dtype(cfg.dtype), head_dim=cfg.arch().head_dim, max_segments=1)
    return resolve_impl(cfg.attention_impl, **kw)


_PIECES = ("lm_head_logsoftmax_fwd_bwd_s", "optimizer_update_s")
BENCH = Bench(
    LearnerBenchConfig,
    run,
    presets=PRESETS,
    headlines=(
        "tokens_per_s",
        "achieved_flops_fraction",
        "logprob_forward/flops_fraction",
        "mfu/train_step",
        "profile/lm_head_logsoftmax_fwd_bwd_share",
        "profile/optimizer_update_share",
        "config/attention_kernel",
        "attention_memory/over_blockwise",
        "attention_memory/growth",
        "long/useful_tokens_per_s",
        "long/packed_over_padded",
        "long/packed_over_padded_cpu",
        "long/scaled_down",
        "long/attention_peak_bytes",
    ),
    plot=(
        Bars("achieved GFLOP/s", "GFLOP/s", "achieved_gflops"),
        Bars("share of the measured matmul peak", "fraction", "flops_fraction"),
        Bars("the step's pieces alone", "seconds", "profile", _PIECES),
        Bars("long: useful tokens/s", "tokens/s", "long/useful_tokens_per_s"),
        Bars("long: one micro-batch's peak memory", "bytes", "long/attention_peak_bytes"),
        attention_memory.panel,
    ),
)
