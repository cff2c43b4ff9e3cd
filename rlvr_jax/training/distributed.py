"""Multi-process JAX: initialisation from config or the environment, and host data → global
arrays. Every process runs the same program and issues the same multi-device computations in
the same order."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from rlvr_jax.config.schema import DistributedConfig


def init_distributed(cfg: DistributedConfig) -> bool:
    """`jax.distributed.initialize` from `cfg` (unset: from the environment); whether it ran."""
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
    """A global array from the host value every process holds (each fills its own shards)."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx], dtype=x.dtype)


def global_tree(tree: Any, shardings: Any) -> Any:
    return jax.tree_util.tree_map(global_array, tree, shardings)
