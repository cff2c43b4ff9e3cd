"""A training checkpoint as a policy: `rlvr-export CHECKPOINT OUT` writes its HF export, and
`rlvr-eval --model` / `rlvr-serve --model` take a checkpoint directory as they take an HF one.

A checkpoint directory is `<train.output_dir>/checkpoints/<step>`; the run's resolved config
(`<train.output_dir>/run_config.yaml`) says what it holds. Only the policy's params are
restored (LoRA adapters merged into the base); the export is a plain HF directory with the
run's tokenizer, as `<output_dir>/final` is. Only the standard library is imported at the top
(`rlvr-eval --help` stays quick).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rlvr_jax.config.schema import Config

log = logging.getLogger("rlvr_jax")

RUN_CONFIG = "run_config.yaml"
"""The run's resolved config in `train.output_dir` (its own name: a user's `config.yaml` there
is never overwritten)."""


def is_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a training checkpoint directory (`.../checkpoints/<step>`)."""
    p = Path(path)
    return p.name.isdigit() and (p / "state").is_dir() and p.parent.name == "checkpoints"


def run_config_path(checkpoint: str | Path) -> Path:
    """Where the run of `checkpoint` wrote its config."""
    return Path(checkpoint).resolve().parents[1] / RUN_CONFIG


def write_run_config(cfg: Config, output_dir: str | Path) -> Path:
    """Writes `cfg` (resolved) to `<output_dir>/run_config.yaml`; returns the path."""
    from rlvr_jax.config import dump

    path = Path(output_dir) / RUN_CONFIG
    path.write_text(
        f"# The resolved config of the run in {Path(output_dir).resolve()}, written by\n"
        "# rlvr-train: rlvr-export, rlvr-eval and rlvr-serve read it to load its checkpoints.\n"
        + dump(cfg)
    )
    return path


def checkpoint_config(
    checkpoint: str | Path, config: str | Path | None = None, overrides: Sequence[str] = ()
) -> Config:
    """The config `checkpoint` was trained with: `config`, else the run's run_config.yaml."""
    from rlvr_jax.config import load

    _check_is_checkpoint(checkpoint)
    path = Path(config) if config is not None else run_config_path(checkpoint)
    if config is None and not path.is_file():
        raise FileNotFoundError(
            f"{checkpoint} is a training checkpoint, but its run's config {path} is missing: "
            "pass --config with the config it was trained with"
        )
    return load(path, list(overrides))


def load_checkpoint(checkpoint: str | Path, cfg: Config) -> Any:
    """The policy of `checkpoint` as a host `models.Model` (LoRA adapters merged)."""
    import jax
    import numpy as np

    from rlvr_jax import models
    from rlvr_jax.models import lora
    from rlvr_jax.models.bootstrap import ensure_model

    checkpoint = Path(checkpoint)
    _check_is_checkpoint(checkpoint)
    base = ensure_model(cfg)
    if cfg.model.lora.rank:
        model = models.load_pretrained(base, dtype=cfg.model.param_dtype)
        model = models.adapt_lora(model, cfg.model.lora, seed=cfg.seed)
        trainable, frozen = lora.split(model.params)
        config = model.config
        params = lora.merge(lora.combine(_restore_params(checkpoint, trainable), frozen))
    else:
        config = models.read_config(base)
        params = _restore_params(checkpoint, models.abstract_params(config, cfg.model.param_dtype))
    params = jax.tree_util.tree_map(np.asarray, params)
    return models.Model(config=config, params=params, path=str(base))


def _check_is_checkpoint(path: str | Path) -> None:
    if not is_checkpoint(path):
        raise FileNotFoundError(
            f"{path} is not a training checkpoint (<train.output_dir>/checkpoints/<step>, "
            "holding a state/ directory)"
        )


def _restore_params(checkpoint: Path, like: Any) -> Any:
    """The `params` of the checkpoint's train state, shaped like `like`, as numpy arrays."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), like)
    restore = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract)
    args = ocp.args.PyTreeRestore(
        item={"params": abstract}, restore_args={"params": restore}, partial_restore=True
    )
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # orbax warns that the item directory has no metadata file
    try:
        with ocp.PyTreeCheckpointer() as reader:
            return reader.restore(checkpoint / "state", args=args)["params"]
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise ValueError(
            f"{checkpoint}: its params do not restore as the run's config describes them "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): is the config "
            "the one it was trained with?"
        ) from None
    finally:
        absl.setLevel(level)


def export_checkpoint(checkpoint: str | Path, out: str | Path, cfg: Config) -> Path:
    """Writes the HF export of `checkpoint` (trained under `cfg`) to `out`; returns `out`."""
    from rlvr_jax.models import save_pretrained

    model = load_checkpoint(checkpoint, cfg)
    save_pretrained(model, out, tokenizer_dir=cfg.model.tokenizer or model.path)
    return Path(out)


@contextlib.contextmanager
def policy_directory(
    path: str | None, config: str | None = None, overrides: Sequence[str] = ()
) -> Iterator[tuple[str | None, str | None]]:
    """(an HF directory of the policy at `path`, its config): `path` and `config`, unless `path`
    is a training checkpoint: its export in a temporary directory and `config` or the run's."""
    if path is None or not is_checkpoint(path):
        yield path, config
        return
    cfg = checkpoint_config(path, config, overrides)
    config = str(config if config is not None else run_config_path(path))
    with tempfile.TemporaryDirectory(prefix="rlvr_checkpoint_") as tmp:
        log.info(
            "exporting checkpoint %s to a temporary HF directory (rlvr-export writes it once)",
            path,
        )
        yield str(export_checkpoint(path, Path(tmp) / "policy", cfg)), config
