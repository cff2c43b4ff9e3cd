"""Multi-process JAX: initialisation from config or the environment, and host data → global
arrays. Every process runs the same program and issues the same multi-device computations in
the same order."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from rlvr_jax.config.schema import DistributedConfig


def init_distributed(cfg: DistributedConfig) -> bool:
    """`jax.distributed.initialize` from `cfg` (unset fields come from the environment, e.g.
    the TPU/SLURM variables JAX reads). Returns whether it initialised."""
    if not cfg.initialize:
        return False
    # CPU collectives between processes go through gloo (inert on GPU/TPU backends); must be
    # set before any backend starts, so no jax.devices() call may come first.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if cfg.transfer_address:
        jax.config.update("jax_cross_host_transfer_socket_address", cfg.transfer_address)
    kwargs = {
        k: v
        for k, v in (
            ("coordinator_address", cfg.coordinator_address),
            ("num_processes", cfg.num_processes),
            ("process_id", cfg.process_id),
        )
        if v is not None
    }
    jax.distributed.initialize(**kwargs)
    return True


def global_array(x: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """A global array from the full host value that every process holds (each process
    fills only its addressable shards)."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx], dtype=x.dtype)


def global_tree(tree: Any, shardings: Any) -> Any:
    return jax.tree_util.tree_map(global_array, tree, shardings)


def move(x: jax.Array, target: jax.sharding.Sharding) -> jax.Array:
    """`x` placed in `target` — also between sub-meshes that span processes.

    One process, or the same device set: a plain `device_put`. Across processes, multi-
    controller JAX cannot `device_put` between different device sets, so the array is first
    replicated over its own devices (an all-gather on the source mesh), then every process
    copies the slices its target devices need from a local replica, device to device, and
    the pieces are assembled into the global target array — no host round trip. This needs
    every process that owns target devices to own source devices too (true when learner and
    actor sub-meshes both span the hosts); otherwise the array goes through the host."""
    src = x.sharding
    if jax.process_count() == 1 or set(src.device_set) == set(target.device_set):
        return jax.device_put(x, target)
    src_procs = {d.process_index for d in src.device_set}
    dst_procs = {d.process_index for d in target.device_set}
    if dst_procs <= src_procs and hasattr(src, "mesh"):
        replicated = jax.sharding.NamedSharding(src.mesh, jax.sharding.PartitionSpec())
        full = jax.device_put(x, replicated)
        local_full = full.addressable_shards[0].data if full.addressable_shards else None
        pieces = [
            jax.device_put(local_full[idx], d)
            for d, idx in target.addressable_devices_indices_map(x.shape).items()
        ]
        return jax.make_array_from_single_device_arrays(x.shape, target, pieces)
    from jax.experimental import multihost_utils

    host = np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return global_array(host, target)


def move_tree(tree: Any, shardings: Any) -> Any:
    """`move` over a pytree (e.g. learner params → actor shardings)."""
    return jax.tree_util.tree_map(move, tree, shardings)
