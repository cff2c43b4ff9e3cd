"""The dry-run plan: parameter count, mesh split and per-device memory, without allocating.

Shapes come from `jax.eval_shape`; per-device bytes divide each array by the mesh axes its
logical axes map to (the learner's and engine's own rules tables). Estimates:
- learner: params + grads + AdamW mu/nu (param dtype, as optax keeps them) + one micro-batch's
  activations (rows split over data × fsdp: `train.micro_batch_size` rows, or the packed rows
  `train.max_tokens_per_micro_batch` holds): per token and layer (12·D + 3·F) values in the
  compute dtype (with `train.remat`, D per layer plus one layer's worth); fp32 logits and
  log-softmax 2·V·4 bytes per position (all, or `train.logits_chunk`); and attention's own
  memory for the kernel `model.attention_impl` resolves to (`models.attention.activation_bytes`).
- PPO's separate critic (`loss.advantage: gae`): its params, grads, moments and activations
  (without logits).
- LoRA (`model.lora`): the frozen base (param dtype, or int8 kernels + scales) plus float32
  adapters, grads and moments of the adapters only; `lora_plan` compares a full run's optimizer
  bytes and finds the fewest learner devices each fits on (`mesh.device_memory_gib`).
- actor: the decode params as the engine lays them out (`rollout.device.kernel.prepare_params`,
  split by `decode_param_axes` and `ACTOR_RULES`; `rollout.weight_dtype` stores matmul weights
  in int8 / fp8, `quantized_actor` reports the bytes freed and the KV tokens they buy; with LoRA
  the actors also hold the base) plus the KV cache in the compute dtype: paged, the pool
  `rollout.kv_pages` / `kv_cache_gib` buys, or contiguous 2·L·slots·S·K·H (S = max prompt + max
  new tokens), slots split over the data axes and KV heads over tensor (when they divide). Its
  concurrency: sequences that fit at the maximum length and at prompt + 0.45 × max new tokens
  (OLMo 3's mean/max, ALGORITHMS.md), at most `rollout.max_slots`.
- `rollout.backend: vllm` (`vllm_kv_plan`): as vLLM sizes itself, `VLLM_GPU_MEMORY_UTILIZATION`
  of each GPU less bf16 weights (split over tensor) and a `VLLM_PROFILE_TOKENS` forward (the
  MLP's 2·F/tp and 4·D bf16 values per token, the rows' fp32 logits) goes to the KV cache
  (bf16, blocks of `VLLM_BLOCK_SIZE`); unknown without `mesh.device_memory_gib`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rlvr_jax.config.schema import Config, MeshAxes
from rlvr_jax.rollout.api import backend, resolve

GiB = 1024**3
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
MEAN_OVER_MAX = 0.45  # OLMo 3's mean / max response length (≈ 14.7K of 32K, ALGORITHMS.md)


class PlanError(ValueError):
    """The plan cannot be made (no architecture, impossible mesh)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    arch: str
    n_params: int
    n_devices: int
    learner_devices: int
    actor_devices: int
    learner_axes: dict[str, int]
    actor_axes: dict[str, int]
    learner_bytes: dict[str, float]
    actor_bytes: dict[str, float]
    device_memory_gib: float
    hardware: str | None
    shared: bool
    kv: dict[str, Any] = dataclasses.field(default_factory=dict)  # `kv_plan`
    attention: str = ""  # the learner's attention kernel on the planned hardware
    micro_batch: str = ""  # one learner micro-batch's layout (rows × positions)
    lora: dict[str, Any] = dataclasses.field(default_factory=dict)  # `lora_plan`; {} without
    quantized_actor: dict[str, Any] = dataclasses.field(default_factory=dict)  # {} when unset

    @property
    def learner_total(self) -> float:
        return sum(self.learner_bytes.values())

    @property
    def actor_total(self) -> float:
        return sum(self.actor_bytes.values())

    @property
    def peak_per_device(self) -> float:
        # on a shared mesh every device holds both halves
        if self.shared:
            return self.learner_total + self.actor_total
        return max(self.learner_total, self.actor_total)

    @property
    def fits(self) -> bool | None:
        if not self.device_memory_gib:
            return None
        return self.peak_per_device <= self.device_memory_gib * GiB


def resolve_axes(axes: MeshAxes, n_devices: int, where: str) -> dict[str, int]:
    """Axis sizes of a sub-mesh of `n_devices` (the -1 axis filled); PlanError names `where`."""
    from rlvr_jax.sharding import resolve_axis_sizes

    try:
        return resolve_axis_sizes(dataclasses.asdict(axes), n_devices)
    except ValueError as e:
        raise PlanError(f"{where}: {e}") from None


def split_counts(n_devices: int, actor_devices: int) -> tuple[int, int, bool]:
    """(learner, actor, shared): the device split `mesh.actor_devices` asks for."""
    if actor_devices == 0:
        return n_devices, n_devices, True
    if not 0 < actor_devices < n_devices:
        raise PlanError(
            f"mesh.actor_devices={actor_devices} must leave at least one of {n_devices} devices "
            "to the learner (0 shares all devices)"
        )
    return n_devices - actor_devices, actor_devices, False


def arch_hf_config(cfg: Config) -> dict[str, Any]:
    """The HF config of the policy: `model.path`/config.json, else `model.hf_config`."""
    path = Path(cfg.model.path) / "config.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise PlanError(f"{path}: not valid JSON: {e}") from None
    if cfg.model.hf_config:
        return dict(cfg.model.hf_config)
    raise PlanError(
        f"model.path {cfg.model.path!r} has no config.json and model.hf_config is not set: "
        "cannot plan the architecture"
    )


def _critic_arch(cfg: Config, policy: Any) -> Any:
    """The separate critic's architecture when the run trains one (`loss.advantage: gae`,
    `critic.kind: separate`): `critic.path`'s config.json, else the policy's; else None."""
    from rlvr_jax import models
    from rlvr_jax.losses import loss_settings_from_config

    try:
        uses_critic = loss_settings_from_config(cfg.loss).uses_critic
    except ValueError as e:
        raise PlanError(str(e)) from None
    if not uses_critic or cfg.critic.kind != "separate":
        return None
    if cfg.critic.path and (Path(cfg.critic.path) / "config.json").is_file():
        return models.read_config(cfg.critic.path)
    return policy


def _sharded_factor(logical: tuple, rules: Any, sizes: dict[str, int], shape: tuple) -> int:
    """Devices one array is split over, as the engine splits it (`logical_to_spec` with the
    divisibility fallback)."""
    from rlvr_jax.sharding import logical_to_spec

    spec = logical_to_spec(logical, rules, types.SimpleNamespace(shape=sizes), shape)
    axes = [a for entry in spec if entry for a in ((entry,) if isinstance(entry, str) else entry)]
    return math.prod(sizes[a] for a in axes)


def _actor_params_bytes(cfg: Config, arch: Any, sizes: dict[str, int]) -> float:
    """Per-device bytes of the engine's decode params (module docstring)."""
    from rlvr_jax import models, sharding
    from rlvr_jax.rollout.device import decode as core
    from rlvr_jax.rollout.device import kernel

    tp = kernel.fused_tp(arch, sizes["tensor"])
    shapes = models.abstract_params(arch, cfg.model.param_dtype)
    dp = jax.eval_shape(
        lambda p: kernel.prepare_params(
            p, arch, cfg.model.compute_dtype, tp, cfg.rollout.weight_dtype
        ),
        shapes,
    )
    return _sharded_bytes(dp, core.decode_param_axes(dp), sharding.ACTOR_RULES, sizes)


def kv_plan(cfg: Config, arch: Any, sizes: dict[str, int]) -> dict[str, Any]:
    """The actor's KV cache per device and the concurrency it buys (module docstring)."""
    from rlvr_jax import sharding
    from rlvr_jax.rollout.device.layout import kv_layout

    r = cfg.rollout
    seq = cfg.data.max_prompt_len + r.max_new_tokens
    cbytes = _DTYPE_BYTES[cfg.model.compute_dtype]
    shards = _sharded_factor(("cache_batch",), sharding.ACTOR_RULES, sizes, (r.max_slots,))
    k = arch.n_kv_heads
    heads = k // sizes["tensor"] if k % sizes["tensor"] == 0 else k
    per_token = 2 * arch.n_layers * heads * arch.head_dim * cbytes  # per device
    try:
        pool = kv_layout(r.kv_layout).pool(
            arch,
            max_slots=r.max_slots,
            max_len=seq,
            shards=shards,
            tensor=sizes["tensor"],
            cache_dtype=cfg.model.compute_dtype,
            page_size=r.page_size,
            kv_pages=r.kv_pages,
            kv_cache_gib=r.kv_cache_gib,
        )
    except ValueError as e:
        raise PlanError(f"rollout: {e}") from None
    pages, tokens = pool.pages, pool.tokens
    device_bytes = pool.tokens_per_device * per_token
    return {
        "layout": r.kv_layout,
        "page_size": r.page_size,
        "pages": pages,
        "tokens": tokens,
        "bytes_per_device": device_bytes,
        "bytes_per_token_per_device": per_token,
        "shards": shards,
        **_concurrency(cfg, tokens),
    }


# vLLM's defaults (`VllmRollout` overrides none): memory share, KV block tokens, and the tokens
# of the forward it profiles at start-up (offline `max_num_batched_tokens`)
VLLM_GPU_MEMORY_UTILIZATION = 0.9
VLLM_BLOCK_SIZE = 16
VLLM_PROFILE_TOKENS = 8192


def _concurrency(cfg: Config, tokens: int) -> dict[str, Any]:
    """The sequences a KV cache of `tokens` holds at once, at the maximum and at the mean
    length (module docstring), at most `rollout.max_slots`."""
    r = cfg.rollout
    seq = cfg.data.max_prompt_len + r.max_new_tokens
    mean = cfg.data.max_prompt_len + MEAN_OVER_MAX * r.max_new_tokens
    return {
        "max_slots": r.max_slots,
        "max_length": seq,
        "mean_length": mean,
        "concurrent_at_max_length": min(r.max_slots, tokens // seq),
        "concurrent_at_mean_length": min(r.max_slots, int(tokens // mean)),
    }


def vllm_kv_plan(cfg: Config, arch: Any, sizes: dict[str, int]) -> tuple[dict, dict]:
    """(the KV plan, the actor's bytes per device) of `rollout.backend: vllm`, as vLLM sizes
    its cache (module docstring)."""
    from rlvr_jax import models

    r = cfg.rollout
    tp = sizes["tensor"]
    engines = sizes["data"] * sizes["fsdp"]
    shapes = jax.tree_util.tree_leaves(models.abstract_params(arch, np.float32))
    weights = sum(math.prod(x.shape) for x in shapes) * 2 / tp  # bf16, split tp ways
    rows = min(r.max_slots, VLLM_PROFILE_TOKENS)
    activations = VLLM_PROFILE_TOKENS * (2 * arch.d_ff / tp + 4 * arch.d_model) * 2
    activations += rows * arch.vocab_size / tp * 4
    heads = arch.n_kv_heads // tp if arch.n_kv_heads % tp == 0 else arch.n_kv_heads
    per_token = 2 * arch.n_layers * max(heads, 1) * arch.head_dim * 2
    memory = cfg.mesh.device_memory_gib * GiB
    kv_bytes = max(VLLM_GPU_MEMORY_UTILIZATION * memory - weights - activations, 0.0)
    per_engine = int(kv_bytes // per_token) // VLLM_BLOCK_SIZE * VLLM_BLOCK_SIZE
    tokens = per_engine * engines
    kv = {
        "layout": "vllm",
        "page_size": VLLM_BLOCK_SIZE,
        "pages": tokens // VLLM_BLOCK_SIZE,
        "tokens": tokens,
        "bytes_per_device": kv_bytes,
        "bytes_per_token_per_device": per_token,
        "shards": engines,
        **_concurrency(cfg, tokens),
        "gpu_memory_utilization": VLLM_GPU_MEMORY_UTILIZATION,
        "sized": bool(memory),
    }
    actor = {"params": weights, "activations": activations, "kv_cache": kv_bytes}
    return kv, actor


def _sharded_bytes(shapes, axes, rules, sizes) -> float:
    """Per-device bytes of an abstract tree split by its logical `axes` under `rules`."""
    from rlvr_jax.rollout.device.decode import is_axes

    flat_shapes = jax.tree_util.tree_leaves(shapes)
    flat_axes = jax.tree_util.tree_leaves(axes, is_leaf=is_axes)
    if len(flat_shapes) != len(flat_axes):
        raise PlanError("param_logical_axes does not match the params tree")
    total = 0.0
    for s, ax in zip(flat_shapes, flat_axes):
        total += math.prod(s.shape) * s.dtype.itemsize / _sharded_factor(ax, rules, sizes, s.shape)
    return total


def policy_shapes(cfg: Config, arch: Any) -> tuple[Any, Any]:
    """(abstract params, their logical axes) of the policy the learner trains: in
    `model.param_dtype`, with `model.lora`'s adapters (float32) and int8 base kernels."""
    from rlvr_jax import models
    from rlvr_jax.models import lora

    lo = cfg.model.lora

    def build(key: jax.Array) -> Any:
        params = models.init_params(arch, key, cfg.model.param_dtype)
        if not lo.rank:
            return params
        if lo.base_dtype != "param":
            params = lora.quantize_base(params, lo.base_dtype)
        return lora.attach(
            params, key, rank=lo.rank, alpha=lo.alpha, dropout=lo.dropout, targets=lo.targets
        )

    shapes = jax.eval_shape(build, jax.random.PRNGKey(0))
    return shapes, lora.axes(shapes, models.param_logical_axes(arch))


def lora_plan(cfg: Config, arch: Any, learner_axes: dict[str, int], n: int) -> dict[str, Any]:
    """LoRA's learner bytes per device (trainable, frozen, optimizer) next to a full run's,
    and the fewest learner devices each needs (`learner_devices_needed`)."""
    from rlvr_jax import sharding
    from rlvr_jax.models import lora

    shapes, axes = policy_shapes(cfg, arch)
    (t_shapes, f_shapes), (t_axes, f_axes) = lora.split(shapes), lora.split(axes)
    rules = sharding.LEARNER_RULES
    full = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, lora=type(cfg.model.lora)())
    )
    full_params = _sharded_bytes(*policy_shapes(full, arch), rules, learner_axes)
    trainable = _sharded_bytes(t_shapes, t_axes, rules, learner_axes)
    return {
        "rank": cfg.model.lora.rank,
        "targets": list(cfg.model.lora.targets),
        "base_dtype": cfg.model.lora.base_dtype,
        "trainable_params": lora.size(t_shapes),
        "trainable_bytes": trainable,
        "frozen_bytes": _sharded_bytes(f_shapes, f_axes, rules, learner_axes),
        "optimizer_bytes": 2 * trainable,
        "full_optimizer_bytes": 2 * full_params,
        "learner_devices_needed": learner_devices_needed(cfg, arch, n),
        "full_learner_devices_needed": learner_devices_needed(full, arch, n),
    }


def learner_devices_needed(cfg: Config, arch: Any, n_max: int) -> int | None:
    """The fewest learner devices (≤ `n_max`, FSDP over what `mesh.learner`'s data and tensor
    axes leave) whose learner memory fits `mesh.device_memory_gib`; None if unknown or none."""
    if not cfg.mesh.device_memory_gib:
        return None
    fixed = cfg.mesh.learner
    step = max(fixed.data, 1) * max(fixed.tensor, 1)
    axes = dataclasses.replace(fixed, fsdp=-1)
    for n in range(step, n_max + 1, step):
        try:
            learner = learner_bytes(cfg, arch, resolve_axes(axes, n, "mesh.learner"))
        except PlanError:
            continue
        if sum(learner.values()) <= cfg.mesh.device_memory_gib * GiB:
            return n
    return None


def _activation_bytes(
    cfg: Config, arch: Any, rows_dev: float, seq: int, cbytes: int, *, logits: bool = True
) -> float:
    """Learner activation memory per device for one micro-batch, attention excluded (module
    docstring); without the LM head's logits when `logits` is False (a critic's trunk)."""
    t = cfg.train
    tokens = rows_dev * seq
    layer = (12 * arch.d_model + 3 * arch.d_ff) * cbytes * tokens
    saved = arch.n_layers * (arch.d_model * cbytes * tokens if t.remat else layer)
    peak_layer = layer if t.remat else 0.0
    positions = t.logits_chunk if 0 < t.logits_chunk < seq else seq
    head = rows_dev * positions * arch.vocab_size * 4 * 2 if logits else 0.0
    return saved + peak_layer + head


def attention_kernel(cfg: Config, arch: Any) -> str:
    """The kernel `model.attention_impl` means on the planned hardware (`mesh.hardware`, else
    this process's platform). PlanError when an explicit choice cannot run there."""
    from rlvr_jax.models import attention
    from rlvr_jax.training.packing import max_segments

    try:
        return attention.resolve_impl(
            cfg.model.attention_impl,
            compute_dtype=cfg.model.compute_dtype,
            head_dim=arch.head_dim,
            max_segments=max_segments(cfg.train.max_tokens_per_micro_batch),
            platform=attention.platform_of(cfg.mesh.hardware),
            check_library=False,
        )
    except attention.AttentionConfigError as e:
        raise PlanError(str(e)) from None


def _attention_bytes(cfg: Config, arch: Any, kernel: str, rows_dev: float, seq: int) -> float:
    from rlvr_jax.models import attention

    return attention.activation_bytes(
        kernel, rows=rows_dev, seq=seq, n_heads=arch.n_heads, head_dim=arch.head_dim,
        n_layers=arch.n_layers, sliding=arch.has_sliding, remat=cfg.train.remat,
        chunk=cfg.train.attn_chunk,
    )  # fmt: skip


def micro_batch_rows(cfg: Config, seq: int, row_multiple: int) -> tuple[int, str]:
    """(rows of one learner micro-batch, its description) at row length `seq`: the packed rows
    of seq + 1 tokens `train.max_tokens_per_micro_batch` holds (`packing.budget_rows`), else
    `train.micro_batch_size` rows (default the whole batch)."""
    from rlvr_jax.training.packing import budget_rows

    t = cfg.train
    if t.max_tokens_per_micro_batch:
        try:
            rows = budget_rows(
                t.max_tokens_per_micro_batch, row_len=seq + 1, row_multiple=row_multiple
            )
        except ValueError as e:
            raise PlanError(f"{e} (rows of max_prompt_len + max_new_tokens + 1)") from None
        return rows, (
            f"{rows} packed rows x {seq} positions (train.max_tokens_per_micro_batch="
            f"{t.max_tokens_per_micro_batch})"
        )
    rows = t.micro_batch_size or t.prompts_per_batch * cfg.rollout.num_samples
    return rows, f"{rows} rows x {seq} positions, one sequence per row"


def learner_bytes(cfg: Config, arch: Any, learner_axes: dict[str, int]) -> dict[str, float]:
    """The learner's per-device memory by part (module docstring)."""
    from rlvr_jax import models, sharding
    from rlvr_jax.models import lora

    cbytes = _DTYPE_BYTES[cfg.model.compute_dtype]
    rules = sharding.LEARNER_RULES
    shapes, axes = policy_shapes(cfg, arch)
    params = _sharded_bytes(shapes, axes, rules, learner_axes)
    trainable = _sharded_bytes(lora.split(shapes)[0], lora.split(axes)[0], rules, learner_axes)
    seq = cfg.data.max_prompt_len + cfg.rollout.max_new_tokens
    rows, _ = micro_batch_rows(cfg, seq, learner_axes["data"] * learner_axes["fsdp"])
    rows_dev = rows / (learner_axes["data"] * learner_axes["fsdp"])
    kernel = attention_kernel(cfg, arch)
    out = {
        "params": params,
        "grads": trainable,
        "optimizer": 2 * trainable,
        "activations": _activation_bytes(cfg, arch, rows_dev, seq, cbytes),
        "attention": _attention_bytes(cfg, arch, kernel, rows_dev, seq),
    }
    critic = _critic_arch(cfg, arch)
    if critic is not None:  # PPO's separate critic: its own trunk, grads, AdamW, activations
        c_shapes = models.abstract_params(critic, cfg.model.param_dtype)
        c_axes = models.param_logical_axes(critic)
        out["critic"] = (
            4 * _sharded_bytes(c_shapes, c_axes, rules, learner_axes)
            + _activation_bytes(cfg, critic, rows_dev, seq, cbytes, logits=False)
            + _attention_bytes(cfg, critic, kernel, rows_dev, seq)
        )
    return out


def quantized_actor(
    cfg: Config, arch: Any, sizes: dict[str, int], kv: dict[str, Any]
) -> dict[str, Any]:
    """`rollout.weight_dtype`'s decode weights per actor device against the compute dtype's,
    and the KV cache the difference would buy."""
    plain = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, weight_dtype=None))
    ours, theirs = _actor_params_bytes(cfg, arch, sizes), _actor_params_bytes(plain, arch, sizes)
    freed = theirs - ours
    return {
        "weight_dtype": cfg.rollout.weight_dtype,
        "params_bytes": ours,
        "compute_dtype_params_bytes": theirs,
        "freed_bytes": freed,
        "freed_kv_tokens": int(freed // kv["bytes_per_token_per_device"]) * kv["shards"],
    }


def make_plan(cfg: Config, n_devices: int | None = None) -> Plan:
    """Computes the plan for `cfg` on `n_devices` (default: `mesh.plan_devices` or local)."""
    from rlvr_jax import models, sharding
    from rlvr_jax.models import lora

    try:
        arch = models.ArchConfig.from_hf(arch_hf_config(cfg))
    except (KeyError, ValueError, TypeError) as e:
        raise PlanError(f"model architecture: {e}") from None
    n = n_devices or cfg.mesh.plan_devices or jax.device_count()
    n_learn, n_act, shared = split_counts(n, cfg.mesh.actor_devices)
    learner_axes = resolve_axes(cfg.mesh.learner, n_learn, "mesh.learner")
    actor_axes = resolve_axes(cfg.mesh.actor, n_act, "mesh.actor")

    shapes = models.abstract_params(arch, np.float32)
    n_params = sum(math.prod(s.shape) for s in jax.tree_util.tree_leaves(shapes))
    seq = cfg.data.max_prompt_len + cfg.rollout.max_new_tokens
    _, micro_batch = micro_batch_rows(cfg, seq, learner_axes["data"] * learner_axes["fsdp"])
    learner = learner_bytes(cfg, arch, learner_axes)
    actor_plan = backend(cfg.rollout.backend).plan
    if actor_plan is not None:
        kv, actor_bytes = resolve(actor_plan)(cfg, arch, actor_axes)
    else:
        kv = kv_plan(cfg, arch, actor_axes)
        actor_bytes = {
            "params": _actor_params_bytes(cfg, arch, actor_axes),
            "kv_cache": kv["bytes_per_device"],
        }
    lora_info: dict[str, Any] = {}
    if cfg.model.lora.rank:  # the actors hold the base to merge pushed adapters into
        lora_info = lora_plan(cfg, arch, learner_axes, n)
        base = lora.strip(policy_shapes(cfg, arch)[0])
        base_axes = lora.axes(base, models.param_logical_axes(arch))
        actor_bytes["lora_base"] = _sharded_bytes(base, base_axes, sharding.ACTOR_RULES, actor_axes)
    quant = quantized_actor(cfg, arch, actor_axes, kv) if cfg.rollout.weight_dtype else {}
    return Plan(
        arch=arch.arch,
        n_params=n_params,
        n_devices=n,
        learner_devices=n_learn,
        actor_devices=n_act,
        learner_axes=learner_axes,
        actor_axes=actor_axes,
        learner_bytes=learner,
        actor_bytes=actor_bytes,
        device_memory_gib=cfg.mesh.device_memory_gib,
        hardware=cfg.mesh.hardware,
        shared=shared,
        kv=kv,
        attention=attention_kernel(cfg, arch),
        micro_batch=micro_batch,
        lora=lora_info,
        quantized_actor=quant,
    )


def format_plan(plan: Plan) -> str:
    """The plan as the table `--dry-run` prints."""

    def gib(b: float) -> str:
        return f"{b / GiB:9.3f} GiB"

    lines = [
        "# plan",
        f"architecture:      {plan.arch}",
        f"parameters:        {plan.n_params:,} ({plan.n_params / 1e9:.3f} B)",
        f"devices:           {plan.n_devices}" + (f"  [{plan.hardware}]" if plan.hardware else ""),
        f"learner sub-mesh:  {plan.learner_devices} devices {plan.learner_axes}",
        f"actor sub-mesh:    {plan.actor_devices} devices {plan.actor_axes}"
        + ("  (shares the learner's devices)" if plan.shared else ""),
        f"learner attention: {plan.attention}",
        f"learner micro-batch: {plan.micro_batch}",
        "per-device memory (estimate):",
    ]
    for k, v in plan.learner_bytes.items():
        lines.append(f"  learner {k:12s} {gib(v)}")
    lines.append(f"  learner total        {gib(plan.learner_total)}")
    for k, v in plan.actor_bytes.items():
        lines.append(f"  actor   {k:12s} {gib(v)}")
    lines.append(f"  actor   total        {gib(plan.actor_total)}")
    lines.append(f"  peak per device      {gib(plan.peak_per_device)}")
    kv = plan.kv
    if kv and kv["layout"] == "vllm" and not kv["sized"]:
        lines.append(
            f"rollout KV cache:  vLLM's, sized at start-up: {kv['gpu_memory_utilization']:g} of "
            "each GPU's memory less the weights and activations (set mesh.device_memory_gib "
            "to plan it)"
        )
    elif kv:
        if kv["layout"] == "vllm":
            lines.append(
                f"rollout KV cache:  vLLM's, {kv['tokens']:,} tokens in blocks of "
                f"{kv['page_size']} ({kv['bytes_per_device'] / GiB:.3f} GiB per actor device: "
                f"{kv['gpu_memory_utilization']:g} of {plan.device_memory_gib:g} GiB less the "
                "weights and activations)"
            )
        else:
            pages = (
                f"{kv['pages']:,} pages of {kv['page_size']}, " if kv["layout"] == "paged" else ""
            )
            lines.append(
                f"rollout KV cache:  {kv['layout']}, {pages}{kv['tokens']:,} tokens "
                f"({kv['bytes_per_device'] / GiB:.3f} GiB per actor device)"
            )
        lines.append(
            f"concurrent seqs:   {kv['concurrent_at_max_length']} at max length "
            f"{kv['max_length']:,}, {kv['concurrent_at_mean_length']} at mean length "
            f"{kv['mean_length']:,.0f} (max_slots {kv['max_slots']})"
        )
    lo = plan.lora
    if lo:

        def devices(n: int | None) -> str:
            return "unknown (set mesh.device_memory_gib)" if n is None else f"{n}"

        lines += [
            f"LoRA:              rank {lo['rank']} on {', '.join(lo['targets'])}, base "
            f"{lo['base_dtype']}; {lo['trainable_params']:,} trainable parameters",
            f"  learner trainable {gib(lo['trainable_bytes'])}, frozen {gib(lo['frozen_bytes'])}"
            f", optimizer {gib(lo['optimizer_bytes'])} (full run {gib(lo['full_optimizer_bytes'])}"
            f", {lo['optimizer_bytes'] / max(lo['full_optimizer_bytes'], 1):.2%})",
            f"  learner devices needed: {devices(lo['learner_devices_needed'])} "
            f"(full run: {devices(lo['full_learner_devices_needed'])})",
        ]
    q = plan.quantized_actor
    if q:
        lines.append(
            f"actor weights:     {q['weight_dtype']} {gib(q['params_bytes'])} per device (compute "
            f"dtype {gib(q['compute_dtype_params_bytes'])}): frees {gib(q['freed_bytes'])}, "
            f"{q['freed_kv_tokens']:,} KV tokens"
        )
    if plan.fits is None:
        lines.append("fits: unknown (set mesh.device_memory_gib to check)")
    else:
        verdict = "yes" if plan.fits else "NO"
        lines.append(f"fits in {plan.device_memory_gib:g} GiB per device: {verdict}")
    return "\n".join(lines)
