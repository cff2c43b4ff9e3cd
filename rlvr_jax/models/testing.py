"""The smallest policy a smoke run or a test can train, built locally (nothing downloaded)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

TINY_HF_CONFIG = {
    "model_type": "qwen2",
    "vocab_size": 320,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}
"""A 2-layer d=32 Qwen2 (GQA, q/k/v biases, tied embeddings) over the 320-token tokenizer."""


def tiny_policy(
    path: str | Path, texts: Sequence[str], *, seed: int = 0, hf_config: dict | None = None
) -> Path:
    """A random `TINY_HF_CONFIG` policy with a 320-token byte-level BPE tokenizer trained on
    `texts`, saved in HF format at `path` (bos/eos/pad ids 0/1/2). With `hf_config`, that
    architecture instead (e.g. the bench model's; ids the tokenizer does not have decode to
    nothing)."""
    import jax

    from rlvr_jax import models
    from rlvr_jax.data.tokenizer import train_tokenizer

    train_tokenizer(texts, vocab_size=320, path=path)
    special = dict(eos_token_id=1, bos_token_id=0, pad_token_id=2)
    arch = models.ArchConfig.from_hf({**(hf_config or TINY_HF_CONFIG), **special})
    params = models.init_params(arch, jax.random.key(seed))
    models.save_pretrained(models.Model(config=arch, params=params), path, tokenizer_dir=path)
    return Path(path)
