"""Joining a local multi-process JAX cluster (the worker scripts of the two-process tests)."""

from rlvr_jax.config.schema import DistributedConfig
from rlvr_jax.training.distributed import init_distributed


def init_local(pid: int, nproc: int, port: int) -> None:
    """Process `pid` of `nproc` on this machine, coordinated on 127.0.0.1:`port` (each process
    also takes port + 1 + pid for cross-host transfers)."""
    init_distributed(
        DistributedConfig(
            initialize=True,
            coordinator_address=f"127.0.0.1:{port}",
            num_processes=nproc,
            process_id=pid,
            transfer_address=f"127.0.0.1:{port + 1 + pid}",
        )
    )
