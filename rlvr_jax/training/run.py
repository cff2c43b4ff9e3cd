"""`rlvr-train` after the config is loaded: distributed init, model bootstrap, algorithm dispatch,
graceful shutdown on SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from rlvr_jax.config.schema import Config, MeshConfig
from rlvr_jax.models.bootstrap import ensure_model, resolve_function
from rlvr_jax.training.distributed import init_distributed

__all__ = ["StopFlag", "ensure_model", "main", "resolve_function", "train", "used_devices"]

log = logging.getLogger("rlvr_jax")


class StopFlag:
    """Set by SIGINT/SIGTERM; the loop checks it between steps, checkpoints and exits."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal: int | None = None
        self.where: Callable[[], int] | None = None
        """The trainer's last dispatched step (named in the signal's log line)."""

    def set(self, signum: int | None = None) -> None:
        self.signal = signum
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread

        def handler(signum, _frame):
            if self:
                raise KeyboardInterrupt  # a second signal: stop now
            at = self.where() if self.where is not None else "?"
            log.warning(
                "signal %d at step %s: finishing the current step, then checkpointing", signum, at
            )
            self.set(signum)

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)


def train(cfg: Config, *, stop: StopFlag | None = None) -> None:
    """Builds the trainer of `cfg.algorithm`, runs it to `train.max_steps` (or until `stop` is
    set), and closes it."""
    from rlvr_jax.training.algorithms import get_algorithm
    from rlvr_jax.training.loop import Trainer

    get_algorithm(cfg.algorithm)  # an unknown algorithm is an error before anything is built
    trainer = Trainer(cfg, stop=stop)
    try:
        trainer.run()
    finally:
        trainer.close()


def used_devices(mesh_cfg: MeshConfig) -> list:
    """The devices a run uses: the first `mesh.num_devices` (all when 0)."""
    import jax

    devices = jax.devices()
    n = mesh_cfg.num_devices
    if n < 0 or n > len(devices):
        raise ValueError(f"mesh.num_devices={n}, but {len(devices)} devices are present")
    return devices[:n] if n else devices


def main(cfg: Config) -> int:
    """Runs `cfg.algorithm`; returns the process exit code."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    init_distributed(cfg.mesh.distributed)
    stop = StopFlag()
    stop.install()
    train(cfg, stop=stop)
    return 0
