"""The engine's static spec and device-state dataclasses, for both KV layouts (`device.layout`
says what differs), and the mesh helpers the device functions share. On a mesh, slots and pages
split over the slot axes of the `cache_batch` rule (each data shard owns its slots and its range
of pages, page 0 of each the trash page) and KV heads over `cache_kv_heads`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlvr_jax import sharding
from rlvr_jax.models import ArchConfig
from rlvr_jax.rollout.device.attention import GEOMETRY_TOKENS, PageGeometry, make_geometry

# logical axes of one layer's contiguous K or V [B, K, S, H], page pool [K, P, Z, H], a slot's [B]
CACHE_AXES = ("cache_batch", "cache_kv_heads", "cache_sequence", "head_dim")
POOL_AXES = ("cache_kv_heads", "cache_batch", None, "head_dim")
SLOT_AXES = ("cache_batch",)
REPLAY = -2
"""`DecodeState.budget_B` of a slot replaying given tokens (`api.Replay`; -1 = no forcing)."""


def mesh_platform(mesh: Mesh | None) -> str:
    """The platform of `mesh`'s devices, "cpu", "gpu" or "tpu" (None: the first device's)."""
    return (mesh.devices.flat[0] if mesh else jax.devices()[0]).platform


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """Everything static about an engine (hashable: the jitted functions' static arg)."""

    config: ArchConfig
    max_slots: int
    """B: decode slots."""
    max_len: int
    """S: positions per sequence (prompt + generated tokens)."""
    compute_dtype: str = "float32"
    """Dtype of the decode weights and activations (the LM head and softmax stay fp32)."""
    weight_dtype: str = ""
    """Storage of the decode matmul weights when not the compute dtype: "float32",
    "bfloat16", "int8" or "fp8" (`rollout.weight_dtype`; `kernel.prepare_params`)."""
    cache_dtype: str = "float32"
    """Dtype of the KV cache."""
    max_stop_ids: int = 8
    """E: stop token ids per request."""
    mesh: Mesh | None = None
    """The actor mesh (None: one device)."""
    rules: sharding.Rules | None = None
    """Logical-axis rules on `mesh` (ACTOR_RULES when None)."""
    kv_layout: Any = None
    """`device.layout`'s `PAGED` or `CONTIGUOUS`."""
    page_size: int = 16
    """Z: tokens per page (contiguous: `max_len`)."""
    num_pages: int = 0
    """P: pages, a trash page per shard included (contiguous: one per slot, its row)."""
    prefill_chunk: int = 256
    """Tokens per prefill chunk."""
    attention: str = "xla"
    """Decode attention of full layers: "xla", "pallas_tpu" or "pallas_gpu" (paged)."""
    geometry_tokens: tuple[int, int, int] = GEOMETRY_TOKENS
    """(decode block, decode iteration, prefill block) sizes in tokens (paged)."""
    max_interrupt_ids: int = 16
    """F: inserted token ids a request's budget forcing (or replay) may carry."""
    exact: bool = False
    """Every decode call runs all `max_slots` rows (`rollout.exact`): XLA:CPU's arithmetic
    depends on the row count, so a slot's then does not depend on what else decodes."""

    def __post_init__(self) -> None:
        if self.max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {self.max_slots}")
        if self.max_len < 2:
            raise ValueError(
                f"max_len must be >= 2 (a prompt token and a new one), got {self.max_len}"
            )
        if self.max_stop_ids < 1:
            raise ValueError(f"max_stop_ids must be >= 1, got {self.max_stop_ids}")
        if self.max_interrupt_ids < 1:
            raise ValueError(f"max_interrupt_ids must be >= 1, got {self.max_interrupt_ids}")
        if self.kv_layout is None:
            raise ValueError("an EngineSpec needs its kv_layout (rlvr_jax.rollout.device.layout)")
        self.kv_layout.validate(self)

    @property
    def chunk_buckets(self) -> tuple[int, ...]:
        """Padded `extend` chunk lengths: powers of two from 16, then min(prefill_chunk, S)."""
        return _powers_up_to(min(self.prefill_chunk, self.max_len))

    def chunk_bucket(self, length: int) -> int:
        """The smallest prefill-chunk bucket holding `length` tokens."""
        return next(b for b in self.chunk_buckets if b >= length)

    @property
    def platform(self) -> str:
        return mesh_platform(self.mesh)

    @property
    def slot_spec(self) -> Any:
        """Mesh axes the slots (and pages) split over, as a PartitionSpec entry."""
        if self.mesh is None:
            return None
        rules = self.rules if self.rules is not None else sharding.ACTOR_RULES
        return sharding.logical_to_spec(SLOT_AXES, rules, self.mesh, (self.max_slots,))[0]

    @property
    def shards(self) -> int:
        """Slot shards: each owns B / shards slots and P / shards pages."""
        axes = self.slot_spec
        if axes is None:
            return 1
        return math.prod(self.mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))

    @property
    def pages_per_shard(self) -> int:
        """Pages of one shard's range (its page 0 is the trash page)."""
        return self.num_pages // self.shards

    @property
    def geometry(self) -> PageGeometry:
        raw = -(-self.max_len // self.page_size)
        return make_geometry(self.page_size, raw, self.geometry_tokens)

    @property
    def max_pages(self) -> int:
        """M: block-table width, ceil(S / Z) rounded up to whole work and prefill blocks."""
        g = self.geometry
        raw = -(-self.max_len // self.page_size)
        step = math.lcm(g.pages_per_block, g.context_block_pages)
        return -(-raw // step) * step

    @property
    def row_buckets(self) -> tuple[int, ...]:
        return self.kv_layout.row_buckets(self)

    def row_bucket(self, live: int) -> int:
        """The smallest row bucket holding `live` packed slots."""
        return next(r for r in self.row_buckets if r >= live)

    @property
    def work_len(self) -> int:
        """R: work-list entries per shard (its pages in blocks, a partial block per slot), rounded
        up to whole decode iterations."""
        g = self.geometry
        r = -(-self.pages_per_shard // g.pages_per_block) + self.max_slots // self.shards
        return -(-r // g.blocks_per_iter) * g.blocks_per_iter


def _powers_up_to(top: int) -> tuple[int, ...]:
    buckets, b = [], 16
    while b < top:
        buckets.append(b)
        b *= 2
    return (*buckets, top)


@flax.struct.dataclass
class DecodeState:
    """All slots' device state. A slot is live while `active_B`."""

    k: tuple[jax.Array, ...]  # per layer: [B, K, S, H] (contiguous) or [K, P, Z, H] (paged)
    v: tuple[jax.Array, ...]
    tokens_B: jax.Array  # int32: the next input token (last sampled, or the prompt's last)
    positions_B: jax.Array  # int32: position of tokens_B
    active_B: jax.Array  # bool
    generated_B: jax.Array  # int32: tokens generated for the slot's request
    max_new_B: jax.Array  # int32
    seed_B: jax.Array  # uint32
    sample_B: jax.Array  # int32
    temperature_B: jax.Array  # float32
    top_k_B: jax.Array  # int32
    top_p_B: jax.Array  # float32
    stop_ids_BxE: jax.Array  # int32, -1 padded
    budget_B: jax.Array  # int32: generated count at which forcing starts (-1: never)
    forced_BxF: jax.Array  # int32: the tokens forced from then on, -1 padded


@flax.struct.dataclass
class ChunkOutput:
    """What one `generate` call produced: column c holds decode step c of the chunk."""

    tokens_BxC: jax.Array
    logprobs_BxC: jax.Array
    valid_BxC: jax.Array  # a token was produced by slot b at step c
    active_B: jax.Array  # after the chunk
    generated_B: jax.Array
    steps: jax.Array  # int32 []: decode steps run


@flax.struct.dataclass
class SlotSettings:
    """Per-slot request settings of one insert, padded to [B] (slot index B = unused);
    `generated_B`: tokens already generated (a resumed sequence continues its count)."""

    slots_B: jax.Array
    seed_B: jax.Array
    sample_B: jax.Array
    max_new_B: jax.Array
    temperature_B: jax.Array
    top_k_B: jax.Array
    top_p_B: jax.Array
    stop_ids_BxE: jax.Array
    generated_B: jax.Array
    budget_B: jax.Array
    """Budget forcing (`api.Interrupt`): -1 off."""
    forced_BxF: jax.Array

    @classmethod
    def empty(cls, spec: EngineSpec, array: Callable = np.full) -> SlotSettings:
        """No slot set: `array(shape, fill, dtype)` per field (numpy, or abstract structs)."""
        b, e, f = spec.max_slots, spec.max_stop_ids, spec.max_interrupt_ids
        fill = {"slots_B": b, "temperature_B": 1, "top_p_B": 1, "budget_B": -1}
        fill |= {"stop_ids_BxE": -1, "forced_BxF": -1}
        shapes = {"stop_ids_BxE": (b, e), "forced_BxF": (b, f)}
        types = {"seed_B": np.uint32, "temperature_B": np.float32, "top_p_B": np.float32}
        return cls(
            **{
                n: array(shapes.get(n, (b,)), fill.get(n, 0), types.get(n, np.int32))
                for n in cls.__dataclass_fields__
            }
        )


def named(spec: EngineSpec, names: tuple, shape: tuple) -> NamedSharding:
    """NamedSharding of an array with logical axes `names` on the engine's mesh."""
    rules = spec.rules if spec.rules is not None else sharding.ACTOR_RULES
    return NamedSharding(spec.mesh, sharding.logical_to_spec(names, rules, spec.mesh, shape))


def state_shardings(spec: EngineSpec) -> Any:
    """NamedSharding tree of a `DecodeState` on the actor mesh (None without a mesh)."""
    if spec.mesh is None:
        return None
    cache = spec.kv_layout.kv_sharding(spec)
    slot = NamedSharding(spec.mesh, PartitionSpec(spec.slot_spec))
    stop = NamedSharding(spec.mesh, PartitionSpec(spec.slot_spec, None))
    layers = (cache,) * spec.config.n_layers
    return DecodeState(layers, layers, *(slot,) * 10, stop, slot, stop)


def replicated(spec: EngineSpec) -> NamedSharding | None:
    """Every device holds the whole array (None without a mesh)."""
    if spec.mesh is None:
        return None
    return NamedSharding(spec.mesh, PartitionSpec())


def with_kv(state: DecodeState, kv: Any, spec: EngineSpec) -> DecodeState:
    """`state` with each layer's (k, v) of `kv` (from `run_layers`), on the engine's shardings."""
    state = state.replace(k=tuple(k for k, _ in kv), v=tuple(v for _, v in kv))
    return constrain(state, state_shardings(spec))


def constrain(tree: Any, shardings: Any) -> Any:
    """`with_sharding_constraint`, or the identity without shardings."""
    return tree if shardings is None else jax.lax.with_sharding_constraint(tree, shardings)


def shard_map(spec: EngineSpec, fn: Callable, in_specs: tuple, out_specs: Any) -> Callable:
    """`fn` under shard_map on the engine's mesh (the plain function without a mesh)."""
    if spec.mesh is None:
        return fn
    return jax.shard_map(
        fn, mesh=spec.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
    )


def shard_index(spec: EngineSpec) -> jax.Array:
    """This shard's index along the slot axes (inside `shard_map`; 0 without a mesh)."""
    axes = spec.slot_spec
    if spec.mesh is None or axes is None:
        return jnp.zeros((), jnp.int32)
    return jax.lax.axis_index(axes)
