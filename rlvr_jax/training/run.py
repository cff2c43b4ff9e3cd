"""`rlvr-train` after the config is loaded: distributed init, model bootstrap, algorithm dispatch,
graceful shutdown on SIGINT/SIGTERM."""

from __future__ import annotations

import importlib
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from rlvr_jax.config.schema import Config, MeshConfig
from rlvr_jax.training.distributed import init_distributed

log = logging.getLogger("rlvr_jax")


class StopFlag:
    """Set by SIGINT/SIGTERM; the loop checks it between steps, checkpoints and exits."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal: int | None = None

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
            log.warning("signal %d: finishing the current step, then checkpointing", signum)
            self.set(signum)

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)


def resolve_function(ref: str, what: str) -> Any:
    """`module:function` → the function, with an error naming `what` when it cannot be found."""
    module, _, name = ref.partition(":")
    if not module or not name:
        raise ValueError(f"{what}: expected 'module:function', got {ref!r}")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{what}: cannot import module {module!r}: {e}") from None
    try:
        return getattr(mod, name)
    except AttributeError:
        raise ValueError(f"{what}: module {module!r} has no attribute {name!r}") from None


def ensure_model(cfg: Config) -> Path:
    """The policy directory; built by `model.create_if_missing` when absent."""
    path = Path(cfg.model.path)
    if (path / "config.json").is_file():
        return path
    if cfg.model.create_if_missing:
        builder = resolve_function(cfg.model.create_if_missing, "model.create_if_missing")
        log.info("model.path %s is absent: building it with %s", path, cfg.model.create_if_missing)
        builder(path, cfg)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model.create_if_missing ({cfg.model.create_if_missing}) did not write "
                f"{path / 'config.json'}"
            )
        return path
    raise FileNotFoundError(
        f"model.path {str(path)!r} has no config.json (and model.create_if_missing is not set)"
    )


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
