"""The policy directory of a run: `model.path`, built first by `model.create_if_missing` when
it holds no checkpoint (the demo builds its tiny base model this way)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rlvr_jax.config.refs import import_function
from rlvr_jax.config.schema import Config

log = logging.getLogger("rlvr_jax")


def resolve_function(ref: str, what: str) -> Any:
    """`module:function` → the function, with an error naming `what` when it cannot be found
    (`rlvr_jax.config.refs.import_function`: the working directory is searched too)."""
    return import_function(ref, what)


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
        f"model.path {str(path)!r} has no config.json (and model.create_if_missing is not set): "
        "give an HF checkpoint directory (a run's <train.output_dir>/final is one); rlvr-eval "
        "and rlvr-serve also take a training checkpoint (<train.output_dir>/checkpoints/<step>), "
        "and `rlvr-export CHECKPOINT OUT` writes one's HF export"
    )
