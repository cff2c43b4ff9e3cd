"""The tiny test models and tokenizer, defined once (built locally; nothing downloaded).

- `build_hf_checkpoint("olmo3", tmp_path)` writes a tiny random HF checkpoint (one per
  architecture in `BASE`) that both `transformers.AutoModelForCausalLM.from_pretrained` and
  `rlvr_jax.models.load_pretrained` read, and returns the torch model (fp32, eval mode, eager
  attention) for reference logits. Weights are perturbed away from HF's init (norm scales near
  1 but not 1, non-zero biases, larger projections) so that a wrong mapping of any tensor
  changes the logits.
- `tiny_arch()` / `micro_arch()`: the JAX-native architectures of the learner tests (params
  from `rlvr_jax.models.init_params`, no checkpoint on disk).
- `train_tiny_tokenizer(path)`: the 320-token byte-level BPE tokenizer (ChatML template, ids
  bos 0 / eos 1 / pad 2 / im_start 3) trained on `CORPUS`; `build_chat_model(path)`: a tiny
  Qwen2 checkpoint of that vocabulary with the tokenizer beside it (what rlvr-serve serves).

tests/conftest.py turns the common ones into session fixtures (`qwen`, `tiny_tokenizer`,
`chat_model_dir`); the trainer's tiny policy is `helpers_train.build_policy`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 128

BASE: dict[str, dict[str, Any]] = {
    "llama": dict(
        model_type="llama",
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    ),
    "qwen2": dict(
        model_type="qwen2",
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=1000.0,
    ),
    "qwen3": dict(
        model_type="qwen3",
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,  # explicit head_dim != hidden_size / heads
        max_position_embeddings=256,
    ),
    "olmo2": dict(
        model_type="olmo2",
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
    ),
    "olmo3": dict(
        model_type="olmo3",
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,  # layer_types: sliding, sliding, sliding, full
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        sliding_window=3,
        pad_token_id=0,
        eos_token_id=1,
    ),
}


CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a plus b equals c",
    "hello world",
] * 20
"""What the tiny tokenizer is trained on."""
TOKENIZER_VOCAB = 320

TINY_ARCH: dict[str, Any] = dict(
    model_type="qwen2",
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=True,
)
"""The learner tests' model (HF config keys): 2 layers, d=32, GQA 4/2, vocab 64."""

MICRO_ARCH: dict[str, Any] = dict(
    TINY_ARCH,
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=32,
)
"""The smallest model with every part (1 layer, d=16, GQA 2/1, vocab 32): DPO, recipes."""


def tiny_arch(**overrides: Any):
    """`rlvr_jax.models.ArchConfig` of `TINY_ARCH` with `overrides` (HF config keys)."""
    from rlvr_jax import models

    return models.ArchConfig.from_hf({**TINY_ARCH, **overrides})


def micro_arch(**overrides: Any):
    """`rlvr_jax.models.ArchConfig` of `MICRO_ARCH` with `overrides` (HF config keys)."""
    return tiny_arch(**{**MICRO_ARCH, **overrides})


def train_tiny_tokenizer(path: Path) -> Path:
    """Trains the tiny tokenizer (`TOKENIZER_VOCAB` tokens, on `CORPUS`) into `path`."""
    from rlvr_jax.data.tokenizer import train_tokenizer

    return train_tokenizer(CORPUS, vocab_size=TOKENIZER_VOCAB, path=path, min_frequency=1)


def build_chat_model(path: Path, *, seed: int = 4, **overrides: Any) -> Path:
    """A tiny random Qwen2 checkpoint over the tiny tokenizer's vocabulary (EOS id 1, a ChatML
    chat template), the tokenizer saved beside it, at `path`."""
    build_hf_checkpoint("qwen2", path, seed=seed, vocab_size=TOKENIZER_VOCAB, **overrides)
    train_tiny_tokenizer(path)
    return path


def hf_config(arch: str, **overrides: Any):
    """A transformers config object of the tiny `arch` model, with `overrides`."""
    from transformers import AutoConfig

    kwargs = {**BASE[arch], **overrides}
    model_type = kwargs.pop("model_type")
    return AutoConfig.for_model(model_type, **kwargs)


def perturb_(model: Any, seed: int) -> None:
    """Replaces HF's init with weights that make every tensor matter."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.2 * noise)
            else:
                p.copy_(0.15 * noise)


def build_hf_model(arch: str, *, seed: int = 0, **overrides: Any):
    """The tiny torch model (fp32, eval, eager attention) with perturbed random weights."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = hf_config(arch, **overrides)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    perturb_(model, seed)
    return model.eval()


def build_hf_checkpoint(
    arch: str, path: Path, *, seed: int = 0, max_shard_size: str | None = None, **overrides: Any
):
    """Writes the tiny model to `path` (HF `save_pretrained`) and returns the torch model."""
    model = build_hf_model(arch, seed=seed, **overrides)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(str(path), **kwargs)
    return model


def hf_logits(
    model: Any,
    tokens_BxT: np.ndarray,
    *,
    mask_BxT: np.ndarray | None = None,
    positions_BxT: np.ndarray | None = None,
) -> np.ndarray:
    """Reference logits [B, T, V] (fp32 numpy) of the torch model."""
    import torch

    kwargs: dict[str, Any] = {"input_ids": torch.as_tensor(np.asarray(tokens_BxT, np.int64))}
    if mask_BxT is not None:
        kwargs["attention_mask"] = torch.as_tensor(np.asarray(mask_BxT, np.int64))
    if positions_BxT is not None:
        kwargs["position_ids"] = torch.as_tensor(np.array(positions_BxT, np.int64))
    with torch.no_grad():
        return model(**kwargs).logits.float().numpy()


def random_tokens(batch: int, length: int, *, seed: int = 0, low: int = 2) -> np.ndarray:
    """Token ids in [low, VOCAB) (0 and 1 stay free for pad / eos)."""
    return np.random.default_rng(seed).integers(low, VOCAB, size=(batch, length), dtype=np.int32)
