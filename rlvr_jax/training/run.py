"""`rlvr-train` after the config is loaded: distributed init, model bootstrap, algorithm dispatch,
graceful shutdown on SIGINT/SIGTERM."""

from __future__ import annotations

import logging

from rlvr_jax.config.schema import Config
from rlvr_jax.shutdown import SignalStop
from rlvr_jax.training.distributed import init_distributed
from rlvr_jax.training.loop import Trainer


def train(cfg: Config, *, stop: SignalStop | None = None) -> None:
    """Runs the trainer of `cfg.algorithm` to `train.max_steps` (or `stop`), then closes it."""
    trainer = Trainer(cfg, stop=stop)
    try:
        trainer.run()
    finally:
        trainer.close()


def main(cfg: Config) -> int:
    """Runs `cfg.algorithm`; returns the process exit code: 0 when it ran to
    `train.max_steps`, 128 + the signal number when SIGTERM (143) or SIGINT (130) stopped it
    (its checkpoint written: a scheduler sees it was stopped, not finished)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    init_distributed(cfg.mesh.distributed)
    stop = SignalStop("rlvr-train", grace_s=None).install()
    try:
        train(cfg, stop=stop)
    finally:
        stop.uninstall()
    return stop.exit_code
