"""The Flax policy model family: Llama, Qwen2, Qwen3, OLMo 2 and OLMo 3 decoders.

One decoder (`rlvr_jax.models.decoder`) covers all five; an HF `config.json` selects the
variant (how its fields map onto `ArchConfig`: docs/models.md).

Entry points: `load_pretrained` / `save_pretrained` (HF directories), `forward` (a `Model`
on a padded or packed batch), `apply` (the pure jittable forward the learner uses),
`init_params` / `abstract_params` / `param_logical_axes` (params without a
checkpoint), `adapt_lora` (LoRA adapters in the params: `rlvr_jax.models.lora`; PEFT export:
`rlvr_jax.models.peft_io`). Logits are float32 whatever the compute dtype.
"""

from rlvr_jax.models.config import ArchConfig
from rlvr_jax.models.errors import (
    CheckpointError,
    MissingTensorError,
    ModelConfigError,
    UnexpectedTensorError,
    UnsupportedArchitectureError,
    UnsupportedRopeError,
)
from rlvr_jax.models.model import (
    Model,
    adapt_lora,
    forward,
    load_pretrained,
    positions_from_mask,
    read_config,
    save_pretrained,
    segments_from_positions,
)
from rlvr_jax.models.params import (
    abstract_params,
    apply,
    init_params,
    lm_head,
    param_logical_axes,
    param_shardings,
    shard_params,
)

__all__ = [
    "ArchConfig",
    "CheckpointError",
    "MissingTensorError",
    "Model",
    "ModelConfigError",
    "UnexpectedTensorError",
    "UnsupportedArchitectureError",
    "UnsupportedRopeError",
    "abstract_params",
    "adapt_lora",
    "apply",
    "forward",
    "init_params",
    "lm_head",
    "load_pretrained",
    "param_logical_axes",
    "param_shardings",
    "positions_from_mask",
    "read_config",
    "save_pretrained",
    "segments_from_positions",
    "shard_params",
]
