"""`Model` (config + params + dtypes + placement) and its HF directory I/O and forward."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rlvr_jax import sharding
from rlvr_jax.models import hf_io, lora
from rlvr_jax.models.config import ArchConfig
from rlvr_jax.models.errors import CheckpointError, ModelConfigError
from rlvr_jax.models.params import apply, as_dtype, param_shardings, tree_shardings

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
"""Files `save_pretrained` copies from the source directory when present."""


@dataclasses.dataclass(frozen=True)
class Model:
    """A policy: architecture, params (sharded when `mesh` is set), dtypes and provenance."""

    config: ArchConfig
    """The architecture."""
    params: Any
    """Params pytree of jax arrays (see `rlvr_jax.models.params`)."""
    compute_dtype: Any = jnp.float32
    """Dtype of matmuls and activations (norms, softmax and the LM head stay fp32)."""
    mesh: Mesh | None = None
    """Mesh the params are sharded over, or None (one device)."""
    rules: sharding.Rules | None = None
    """Logical-axis rules used with `mesh`."""
    path: str | None = None
    """The checkpoint directory the model was loaded from (its tokenizer files are copied
    by `save_pretrained`)."""

    @property
    def param_dtype(self) -> jnp.dtype:
        """Storage dtype of the params."""
        return jnp.dtype(self.params["embedding"].dtype)


def read_config(path: str | Path) -> ArchConfig:
    """The `ArchConfig` of a checkpoint directory's `config.json`."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{path}: no config.json")
    try:
        return ArchConfig.from_hf(json.loads(config_file.read_text()), source=str(config_file))
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{config_file}: not valid JSON ({e})") from None


def load_pretrained(
    path: str | Path,
    *,
    dtype: Any = None,
    mesh: Mesh | None = None,
    rules: sharding.Rules | None = None,
    compute_dtype: Any = None,
) -> Model:
    """Loads an HF checkpoint directory in `dtype` (float32; `compute_dtype` defaults to it),
    each tensor streamed into its sharding under `rules` (`LEARNER_RULES`) with a `mesh`."""
    path = Path(path)
    config = read_config(path)
    param_dtype = as_dtype("float32" if dtype is None else dtype)
    shardings = None
    if mesh is not None:
        rules = sharding.LEARNER_RULES if rules is None else rules
        shardings = param_shardings(config, mesh, rules)
    params = hf_io.load_params(path, config, dtype=param_dtype, shardings=shardings)
    return Model(
        config=config,
        params=params,
        compute_dtype=param_dtype if compute_dtype is None else as_dtype(compute_dtype),
        mesh=mesh,
        rules=rules,
        path=str(path),
    )


def save_pretrained(
    model: Model,
    path: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    max_shard_bytes: int = 5 * 2**30,
) -> None:
    """Writes an HF directory that `transformers.AutoModelForCausalLM.from_pretrained`
    loads unchanged: config.json, safetensors with HF names, and the tokenizer files of
    `tokenizer_dir` (default: the directory the model was loaded from), when present."""
    path = Path(path)
    if jax.process_index() == 0:
        path.mkdir(parents=True, exist_ok=True)
    hf_config = model.config.to_hf()
    hf_config["dtype"] = str(model.param_dtype)
    hf_io.save_params(model.params, model.config, path, max_shard_bytes=max_shard_bytes)
    if jax.process_index() != 0:
        return
    (path / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    source = tokenizer_dir if tokenizer_dir is not None else model.path
    if source is None or Path(source).resolve() == path.resolve():
        return
    for name in TOKENIZER_FILES:
        if (Path(source) / name).is_file():
            shutil.copyfile(Path(source) / name, path / name)


def adapt_lora(model: Model, settings: Any, *, seed: int = 0) -> Model:
    """`model` (a `models.Model`) with fresh adapters by `settings` (`model.lora` of the config:
    rank, alpha, dropout, targets, base_dtype), its base kernels int8 when `base_dtype` says
    so, all placed like its params; unchanged when `settings.rank` is 0."""
    if not settings.rank:
        return model
    params = model.params
    if settings.base_dtype != "param":
        params = lora.quantize_base(params, settings.base_dtype)
    shardings = None
    if model.mesh is not None:
        shardings = functools.partial(
            tree_shardings, config=model.config, mesh=model.mesh, rules=model.rules
        )
    params = lora.attach(
        params,
        jax.random.PRNGKey(seed),
        rank=settings.rank,
        alpha=settings.alpha,
        dropout=settings.dropout,
        targets=tuple(settings.targets),
        shardings=shardings,
    )
    return dataclasses.replace(model, params=params)


def positions_from_mask(mask_BxT: np.ndarray) -> np.ndarray:
    """Positions counting real tokens from 0 in each row (left or right padding)."""
    return np.maximum(np.cumsum(mask_BxT, axis=1) - 1, 0).astype(np.int32)


def segments_from_positions(positions_BxT: np.ndarray, mask_BxT: np.ndarray) -> np.ndarray:
    """Segment ids >= 1 of real tokens, 0 for padding. A new segment starts wherever the
    position does not continue the previous one (e.g. restarts at 0: packed rows)."""
    positions_BxT = np.asarray(positions_BxT)
    starts_BxT = np.ones(positions_BxT.shape, dtype=bool)
    starts_BxT[:, 1:] = positions_BxT[:, 1:] != positions_BxT[:, :-1] + 1
    return (np.cumsum(starts_BxT, axis=1) * (np.asarray(mask_BxT) != 0)).astype(np.int32)


_apply_jit = jax.jit(
    apply,
    static_argnames=("config", "compute_dtype", "mesh", "rules", "return_hidden", "attention_impl"),
)


def forward(
    model: Model,
    tokens_BxT: Any,
    *,
    positions_BxT: Any = None,
    mask_BxT: Any = None,
    return_hidden: bool = False,
    attention_impl: str = "auto",
) -> jax.Array:
    """Logits fp32 [B, T, V] (or final hidden states) of a batch; `mask_BxT` (1 real, default
    all) allows padding on either side; `positions_BxT` default to counting real tokens, and
    a row whose positions restart holds packed sequences. Logits at padding are meaningless."""
    tokens_BxT = np.asarray(tokens_BxT, dtype=np.int32)
    if tokens_BxT.ndim != 2:
        raise ValueError(f"tokens_BxT must be 2-D [B, T], got shape {tokens_BxT.shape}")
    mask_BxT = np.ones_like(tokens_BxT) if mask_BxT is None else np.asarray(mask_BxT)
    if positions_BxT is None:
        positions_BxT = positions_from_mask(mask_BxT)
    positions_BxT = np.asarray(positions_BxT, dtype=np.int32)
    for name, x in (("mask_BxT", mask_BxT), ("positions_BxT", positions_BxT)):
        if x.shape != tokens_BxT.shape:
            raise ValueError(f"{name} has shape {x.shape}, tokens_BxT {tokens_BxT.shape}")
    segments_BxT = segments_from_positions(positions_BxT, mask_BxT)
    inputs = (tokens_BxT, positions_BxT, segments_BxT)
    rules = model.rules
    if model.mesh is not None:
        rules = sharding.LEARNER_RULES if rules is None else rules
        inputs = tuple(
            jax.device_put(x, sharding.batch_sharding(model.mesh, rules, x.shape)) for x in inputs
        )
    return _apply_jit(
        model.params,
        model.config,
        *inputs,
        compute_dtype=jnp.dtype(model.compute_dtype),
        mesh=model.mesh,
        rules=rules,
        return_hidden=return_hidden,
        attention_impl=attention_impl,
    )
