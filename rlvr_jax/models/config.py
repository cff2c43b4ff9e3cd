"""`ArchConfig`: the architecture of one decoder (read from / written to an HF `config.json`
by `rlvr_jax.models.hf_config`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlvr_jax.models import hf_config as hf
from rlvr_jax.models import rope
from rlvr_jax.models.errors import ModelConfigError, UnsupportedArchitectureError
from rlvr_jax.models.hf_config import ARCHS, FULL, QK_NORMS, SLIDING

__all__ = ["ARCHS", "FULL", "QK_NORMS", "SLIDING", "ArchConfig"]


@dataclasses.dataclass(frozen=True)
class ArchConfig:
    """A decoder architecture. Frozen and hashable: pass it to `jax.jit` as a static argument."""

    arch: str
    """HF model type: llama | qwen2 | qwen3 | olmo2 | olmo3."""
    vocab_size: int
    """V: rows of the embedding / columns of the LM head."""
    d_model: int
    """D: width of the residual stream (`hidden_size`)."""
    n_layers: int
    """L: decoder layers (`num_hidden_layers`)."""
    n_heads: int
    """N: query heads (`num_attention_heads`)."""
    n_kv_heads: int
    """K: key/value heads (`num_key_value_heads`); N must be a multiple of K (GQA)."""
    head_dim: int
    """H: width of one head (`head_dim`, default D / N)."""
    d_ff: int
    """F: SwiGLU hidden width (`intermediate_size`)."""
    rope_theta: float = 10000.0
    """RoPE base of the full-attention layers (and of the sliding ones unless overridden)."""
    rope_scaling: rope.RopeScaling | None = None
    """RoPE scaling of the full-attention layers as sorted (key, value) items; None = plain."""
    sliding_rope_theta: float | None = None
    """RoPE base of the sliding-window layers when it differs (OLMo 3); None = as full layers."""
    sliding_rope_scaling: rope.RopeScaling | None = None
    """RoPE scaling of the sliding layers; read only when `sliding_rope_theta` is set."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon (`rms_norm_eps`)."""
    tie_embeddings: bool = False
    """LM head shares the embedding matrix (`tie_word_embeddings`)."""
    qkv_bias: bool = False
    """Biases on the q/k/v projections (Qwen2 always; others `attention_bias`)."""
    o_bias: bool = False
    """Bias on the output projection (`attention_bias` except on Qwen2)."""
    mlp_bias: bool = False
    """Biases on the MLP projections (Llama `mlp_bias`)."""
    qk_norm: str | None = None
    """RMSNorm of q and k: None, "head" (Qwen3: over each head) or "full" (OLMo: over the
    whole projection, before splitting heads)."""
    post_norm: bool = False
    """OLMo 2/3 layout: norms applied to the attention / MLP outputs before the residual add
    (instead of to their inputs)."""
    sliding_window: int | None = None
    """W: a sliding layer's query attends to the W most recent keys, itself included."""
    layer_types: tuple[str, ...] = ()
    """Per layer "full_attention" or "sliding_attention"; empty means all full."""
    max_position_embeddings: int = 2048
    """Context length the checkpoint declares (used by yarn's default factor)."""
    bos_token_id: int | None = None
    """Beginning-of-sequence token."""
    eos_token_id: tuple[int, ...] = ()
    """End-of-sequence tokens (any of them stops generation)."""
    pad_token_id: int | None = None
    """Padding token."""
    init_std: float = 0.02
    """Std of the normal init of projections and embeddings (`initializer_range`)."""

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise UnsupportedArchitectureError(
                f"arch {self.arch!r} is not supported (supported: {', '.join(ARCHS)})"
            )
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ModelConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_ff <= 0:
            raise ModelConfigError(f"d_ff must be positive, got {self.d_ff}")
        if self.n_heads % self.n_kv_heads:
            raise ModelConfigError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.qk_norm not in QK_NORMS:
            raise ModelConfigError(f"qk_norm must be one of {QK_NORMS}, got {self.qk_norm!r}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL,) * self.n_layers)
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if len(self.layer_types) != self.n_layers:
            raise ModelConfigError(
                f"layer_types has {len(self.layer_types)} entries for {self.n_layers} layers"
            )
        bad = sorted({t for t in self.layer_types if t not in (FULL, SLIDING)})
        if bad:
            raise ModelConfigError(f"unknown layer_types {bad} (use {FULL!r} or {SLIDING!r})")
        if SLIDING in self.layer_types and (self.sliding_window or 0) < 1:
            raise ModelConfigError("sliding_attention layers need sliding_window >= 1")

    # ---- derived --------------------------------------------------------------------------

    @property
    def has_sliding(self) -> bool:
        """Whether any layer uses sliding-window attention."""
        return SLIDING in self.layer_types

    @property
    def norm_weight_in_fp32(self) -> bool:
        """OLMo's RMSNorm multiplies by its weight before casting back; Llama/Qwen after."""
        return self.arch in ("olmo2", "olmo3")

    def rope_for(self, layer_type: str) -> tuple[float, rope.RopeScaling | None]:
        """(theta, scaling) of the RoPE used by layers of `layer_type`."""
        if layer_type == SLIDING and self.sliding_rope_theta is not None:
            return self.sliding_rope_theta, self.sliding_rope_scaling
        return self.rope_theta, self.rope_scaling

    def n_params(self) -> int:
        """Exact parameter count (embedding counted once when tied)."""
        d, n, k, h, f = self.d_model, self.n_heads, self.n_kv_heads, self.head_dim, self.d_ff
        attn = d * n * h + 2 * d * k * h + n * h * d
        attn += (n * h + 2 * k * h) * self.qkv_bias + d * self.o_bias
        attn += {None: 0, "head": 2 * h, "full": n * h + k * h}[self.qk_norm]
        mlp = 3 * d * f + (2 * f + d) * self.mlp_bias
        per_layer = attn + mlp + 2 * d
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.n_layers * per_layer + d + head

    # ---- HF conversion --------------------------------------------------------------------

    @classmethod
    def from_hf(cls, hf_config: Mapping[str, Any], *, source: str | None = None) -> ArchConfig:
        """Reads an HF `config.json` dict as transformers 5.23 does (defaults included);
        `source` (e.g. the file) prefixes error messages."""
        return cls(**hf.fields_from_hf(hf_config, source=source))

    def to_hf(self) -> dict[str, Any]:
        """The transformers 5 `config.json` dict of this architecture (raises
        `ModelConfigError` if a field cannot be expressed in the HF class of `arch`)."""
        return hf.config_to_hf(self)
