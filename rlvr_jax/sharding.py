"""Device meshes, the logical-axis sharding tables, and moving params between sub-meshes.

Every mesh has the axes (data, fsdp, tensor). Model code names array dimensions logically;
a rules table maps each logical name to mesh axes (STYLE habit 4: one table for the learner,
one for the actor / rollout engine):

  parameters   vocab, embed, heads, kv_heads, head_dim, mlp, layers, norm
  activations  batch, activation_length, activation_embed, activation_heads,
               activation_kv_heads, activation_mlp, activation_vocab
  KV cache     cache_batch, cache_sequence, cache_kv_heads

A mesh axis is applied to a dimension only if it divides it (e.g. 2 KV heads on a tensor
axis of 4 stay replicated, as vLLM does); the rest of the mapping still applies.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
MeshAxesSpec = str | tuple[str, ...] | None


def _as_tuple(axes: MeshAxesSpec) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


class Rules(Mapping[str, MeshAxesSpec]):
    """An immutable, hashable logical-name → mesh-axes table (usable as a static jit arg)."""

    def __init__(self, table: Mapping[str, MeshAxesSpec]):
        for name, axes in table.items():
            for axis in _as_tuple(axes):
                if axis not in MESH_AXES:
                    raise ValueError(f"rule {name!r} -> {axes!r}: unknown mesh axis {axis!r}")
        self._items = tuple(sorted(table.items()))
        self._table = dict(self._items)

    def __getitem__(self, name: str) -> MeshAxesSpec:
        return self._table[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rules) and self._items == other._items

    def __repr__(self) -> str:
        return f"Rules({self._table!r})"

    def replace(self, **updates: MeshAxesSpec) -> Rules:
        """A copy with some logical names remapped."""
        return Rules({**self._table, **updates})


_BATCH = ("data", "fsdp")
LEARNER_RULES = Rules(
    {
        # params: FSDP over `embed`, tensor parallel over heads / mlp / vocab
        "vocab": "tensor",
        "embed": "fsdp",
        "heads": "tensor",
        "kv_heads": "tensor",
        "head_dim": None,
        "mlp": "tensor",
        "layers": None,
        "norm": None,
        # activations: rows over data × fsdp
        "batch": _BATCH,
        "activation_length": None,
        "activation_embed": None,
        "activation_heads": "tensor",
        "activation_kv_heads": "tensor",
        "activation_mlp": "tensor",
        "activation_vocab": "tensor",
        "cache_batch": _BATCH,
        "cache_sequence": None,
        "cache_kv_heads": "tensor",
    }
)
"""Learner: params sharded over fsdp (and tensor), batch over data × fsdp."""

ACTOR_RULES = LEARNER_RULES.replace(embed=None)
"""Actor / rollout engine: params replicated except the tensor-parallel split (no per-step
all-gathers while decoding); decode slots and their KV cache over data × fsdp."""


def resolve_axis_sizes(axes: Mapping[str, int], n_devices: int) -> dict[str, int]:
    """(data, fsdp, tensor) sizes for `n_devices`: missing axes are 1 and the (at most one)
    -1 axis takes the devices left over. Used for real meshes and for dry-run plans."""
    unknown = sorted(set(axes) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"mesh axes {unknown} are unknown (use {', '.join(MESH_AXES)})")
    sizes = {name: int(axes.get(name, 1)) for name in MESH_AXES}
    free = [name for name, size in sizes.items() if size == -1]
    if len(free) > 1 or any(size == 0 or size < -1 for size in sizes.values()):
        raise ValueError(f"mesh axes {sizes}: sizes must be positive, with at most one -1")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if free:
        if n_devices % fixed:
            raise ValueError(f"mesh axes {sizes} do not divide {n_devices} devices")
        sizes[free[0]] = n_devices // fixed
    if math.prod(sizes.values()) != n_devices:
        raise ValueError(
            f"mesh axes {sizes} need {math.prod(sizes.values())} devices, got {n_devices}"
        )
    return sizes


def make_mesh(axes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all). Missing axes are 1; one
    axis may be -1 (takes the devices left over). `tensor` varies fastest, so tensor-parallel
    groups are neighbouring devices."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_axis_sizes(axes, len(devices))
    grid = np.empty(len(devices), dtype=object)
    grid[:] = devices
    shape = tuple(sizes[name] for name in MESH_AXES)
    return Mesh(grid.reshape(shape), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def used_devices(mesh_cfg: Any) -> list[jax.Device]:
    """The devices a run of a `MeshConfig` uses: the first `mesh.num_devices` (all when 0) —
    the trainer's and every sampler's (`rlvr-eval`, `rlvr-filter`, the experiments)."""
    devices = jax.devices()
    n = mesh_cfg.num_devices
    if n > len(devices):
        raise ValueError(f"mesh.num_devices={n}, but {len(devices)} devices are present")
    return devices[:n] if n else devices


def split_devices(
    devices: Sequence[jax.Device], actor_devices: int
) -> tuple[list[jax.Device], list[jax.Device]]:
    """(learner, actor) device lists: the last `actor_devices` go to the actor; 0 shares all."""
    devices = list(devices)
    if actor_devices == 0:
        return devices, devices
    if not 0 < actor_devices < len(devices):
        raise ValueError(
            f"actor_devices={actor_devices} must be 0 (share) or leave at least one of "
            f"{len(devices)} devices to the learner"
        )
    return devices[:-actor_devices], devices[-actor_devices:]


def build_meshes(mesh_cfg: Any, devices: Sequence[jax.Device] | None = None) -> tuple[Mesh, Mesh]:
    """(learner_mesh, actor_mesh) from a `rlvr_jax.config.schema.MeshConfig`, over `devices`
    (default: the run's, `used_devices`)."""
    learner, actor = split_devices(
        used_devices(mesh_cfg) if devices is None else devices, mesh_cfg.actor_devices
    )
    learner_mesh = _sub_mesh("learner", mesh_cfg.learner, learner)
    return learner_mesh, _sub_mesh("actor", mesh_cfg.actor, actor)


def actor_mesh(mesh_cfg: Any) -> Mesh:
    """The actor sub-mesh alone, over the run's devices (a process that only samples: the
    learner's part is not built)."""
    _, actor = split_devices(used_devices(mesh_cfg), mesh_cfg.actor_devices)
    return _sub_mesh("actor", mesh_cfg.actor, actor)


def _sub_mesh(name: str, axes: Any, devices: Sequence[jax.Device]) -> Mesh:
    try:
        return make_mesh(dataclasses.asdict(axes), devices)
    except ValueError as e:
        raise ValueError(f"mesh.{name}: {e}") from None


def logical_to_spec(
    names: Sequence[str | None],
    rules: Mapping[str, MeshAxesSpec],
    mesh: Mesh | None = None,
    shape: Sequence[int] | None = None,
) -> PartitionSpec:
    """PartitionSpec of one array. With `mesh`, size-1 mesh axes are left out; with `mesh`
    and `shape`, a dimension keeps only the leading mesh axes of its rule whose sizes divide
    it. A mesh axis is used at most once per array (later dimensions lose it). Unknown
    logical names raise."""
    used: set[str] = set()
    spec: list[MeshAxesSpec] = []
    for dim, name in enumerate(names):
        if name is None:
            spec.append(None)
            continue
        if name not in rules:
            raise KeyError(f"logical axis {name!r} has no rule (rules: {sorted(rules)})")
        kept: list[str] = []
        size = 1
        for axis in _as_tuple(rules[name]):
            if axis in used:
                continue
            if mesh is not None and mesh.shape[axis] == 1:
                continue  # a size-1 axis shards nothing; keep specs minimal
            if mesh is not None and shape is not None:
                if shape[dim] % (size * mesh.shape[axis]):
                    break
                size *= mesh.shape[axis]
            kept.append(axis)
        used.update(kept)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*spec)


def _is_axes_leaf(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(n, str) or n is None for n in x)


def logical_to_sharding(
    axes_tree: Any, mesh: Mesh, rules: Mapping[str, MeshAxesSpec], shapes_tree: Any = None
) -> Any:
    """NamedSharding tree of a tree of logical-axis tuples. `shapes_tree` (arrays or
    ShapeDtypeStructs of the same structure) enables the divisibility fallback."""
    if shapes_tree is None:
        return jax.tree.map(
            lambda names: NamedSharding(mesh, logical_to_spec(names, rules)),
            axes_tree,
            is_leaf=_is_axes_leaf,
        )
    return jax.tree.map(
        lambda names, x: NamedSharding(mesh, logical_to_spec(names, rules, mesh, x.shape)),
        axes_tree,
        shapes_tree,
        is_leaf=_is_axes_leaf,
    )


def reshard(tree: Any, target_shardings: Any, *, donate: bool = False) -> Any:
    """`tree` moved to `target_shardings` (e.g. learner → actor sub-mesh); values unchanged.
    `donate` frees the source buffers. Works between sub-meshes that span processes too
    (see `move`)."""
    if jax.process_count() == 1:
        return jax.device_put(tree, target_shardings, donate=donate)
    return jax.tree_util.tree_map(move, tree, target_shardings)


def move(x: jax.Array, target: jax.sharding.Sharding) -> jax.Array:
    """`x` placed in `target`, also between sub-meshes that span processes: there (where
    `device_put` cannot go) `x` is all-gathered on its own mesh and each process copies the
    slices its target devices need from a local replica, device to device; through the host
    when a process owns target devices but no source ones."""
    src = x.sharding
    if jax.process_count() == 1 or set(src.device_set) == set(target.device_set):
        return jax.device_put(x, target)
    src_procs = {d.process_index for d in src.device_set}
    dst_procs = {d.process_index for d in target.device_set}
    if dst_procs <= src_procs and isinstance(src, NamedSharding):
        full = jax.device_put(x, NamedSharding(src.mesh, PartitionSpec()))
        local_full = full.addressable_shards[0].data if full.addressable_shards else None
        pieces = [
            jax.device_put(local_full[idx], d)
            for d, idx in target.addressable_devices_indices_map(x.shape).items()
        ]
        return jax.make_array_from_single_device_arrays(x.shape, target, pieces)
    from jax.experimental import multihost_utils

    host = np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jax.make_array_from_callback(host.shape, target, lambda idx: host[idx], dtype=host.dtype)


def constrain(
    x: jax.Array,
    names: Sequence[str | None],
    mesh: Mesh | None,
    rules: Mapping[str, MeshAxesSpec] | None,
) -> jax.Array:
    """`with_sharding_constraint` of an activation by logical names; identity without a
    mesh or rules (single-device use)."""
    if mesh is None or rules is None:
        return x
    spec = logical_to_spec(names, rules, mesh, x.shape)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def batch_sharding(mesh: Mesh, rules: Mapping[str, MeshAxesSpec], shape: Sequence[int]) -> Any:
    """NamedSharding of a [B, ...] input array: rows split by the `batch` rule."""
    names = ("batch",) + (None,) * (len(shape) - 1)
    return NamedSharding(mesh, logical_to_spec(names, rules, mesh, shape))
