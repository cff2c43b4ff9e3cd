"""Prompt data: sources (JSONL, Parquet, TFDS), validated rows, prompt templates, the seeded
resumable mixture, tokenizers, and the synthetic verifiable tasks of the demo.

Importing this package is light: transformers, tokenizers, pyarrow and TensorFlow are imported
inside the functions that use them (TensorFlow always through `tf_utils.import_tensorflow`).
"""

from rlvr_jax.data.formatting import (
    TEMPLATES,
    format_prompt,
    prompt_encoder,
    prompt_ids,
    prompt_length_fn,
)
from rlvr_jax.data.mixture import PromptIterator, build_prompt_iterator, load_eval_rows
from rlvr_jax.data.rows import BadRow, DataError, PromptRow, UnknownVerifier, row_from_record
from rlvr_jax.data.sources import PromptSource, load_source, load_sources
from rlvr_jax.data.synthetic import generate, reference_response, write_jsonl
from rlvr_jax.data.tfds_builder import build_synthetic
from rlvr_jax.data.tokenizer import (
    DEFAULT_TEMPLATE,
    SpecialTokens,
    apply_chat_template,
    load_tokenizer,
    train_tokenizer,
)

__all__ = [
    "DEFAULT_TEMPLATE",
    "TEMPLATES",
    "BadRow",
    "DataError",
    "PromptIterator",
    "PromptRow",
    "PromptSource",
    "SpecialTokens",
    "UnknownVerifier",
    "apply_chat_template",
    "build_prompt_iterator",
    "build_synthetic",
    "format_prompt",
    "generate",
    "load_eval_rows",
    "load_source",
    "load_sources",
    "load_tokenizer",
    "prompt_encoder",
    "prompt_ids",
    "prompt_length_fn",
    "reference_response",
    "row_from_record",
    "train_tokenizer",
    "write_jsonl",
]
