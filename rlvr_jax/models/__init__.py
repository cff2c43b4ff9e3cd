"""The Flax policy model family: Llama, Qwen2, Qwen3, OLMo 2 and OLMo 3 decoders.

One decoder (`rlvr_jax.models.decoder`) covers all five; an HF `config.json` selects the
variant. How HF fields map onto `ArchConfig`:

| HF config.json                 | ArchConfig                  | notes                          |
|--------------------------------|-----------------------------|--------------------------------|
| model_type / architectures     | arch                        | llama qwen2 qwen3 olmo2 olmo3  |
| vocab_size                     | vocab_size                  | V                              |
| hidden_size                    | d_model                     | D                              |
| num_hidden_layers              | n_layers                    | L                              |
| num_attention_heads            | n_heads                     | N                              |
| num_key_value_heads            | n_kv_heads                  | K (GQA); None → N              |
| head_dim                       | head_dim                    | H; default D/N (Qwen3: 128)    |
| intermediate_size              | d_ff                        | F; SwiGLU (hidden_act silu)    |
| rope_parameters / rope_scaling | rope_theta, rope_scaling    | default linear llama3 yarn     |
| rope_parameters[sliding_...]   | sliding_rope_theta/_scaling | OLMo 3: RoPE per layer type    |
| rms_norm_eps                   | norm_eps                    |                                |
| tie_word_embeddings            | tie_embeddings              | LM head = embedding            |
| attention_bias                 | qkv_bias, o_bias            | Qwen2: q/k/v bias, no o bias   |
| mlp_bias                       | mlp_bias                    | Llama only                     |
| (model type)                   | qk_norm                     | Qwen3 "head", OLMo "full"      |
| (model type)                   | post_norm                   | OLMo: norm block outputs       |
| sliding_window, layer_types    | sliding_window, layer_types | OLMo 3; Qwen use_sliding_window|
| max_position_embeddings        | max_position_embeddings     |                                |
| bos/eos/pad_token_id           | bos/eos/pad_token_id        | eos as a tuple                 |
| initializer_range              | init_std                    | random init only               |

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
