"""Tokenizers: load an HF tokenizer from a local directory (never downloading:
`local_files_only=True`), apply its chat template, and train a tiny byte-level BPE tokenizer
that `transformers.AutoTokenizer` loads offline (what tests and the demo use). `transformers` and
`tokenizers` are imported inside the functions that use them: importing this module is cheap."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML, the chat format of Qwen and OLMo 3: `<|im_start|>role\\ncontent<|im_end|>\\n` per
message, and `<|im_start|>assistant\\n` as the generation prompt."""

_SPECIAL_LITERAL_RE = re.compile(r"<\|[^|<>\s]+\|>")


@dataclass(frozen=True)
class SpecialTokens:
    """The special tokens of a trained tokenizer. Each becomes one id; ids follow this order
    (bos, eos, pad, then `extra`), starting at 0."""

    bos: str = "<|endoftext|>"
    """Beginning-of-sequence token (also the document separator)."""
    eos: str = "<|im_end|>"
    """End-of-sequence token; ends an assistant turn under ChatML, so generation stops on it."""
    pad: str = "<|pad|>"
    """Padding token (never trained on)."""
    extra: tuple[str, ...] = ("<|im_start|>",)
    """Further special tokens (the chat template's turn opener)."""

    def all(self) -> list[str]:
        """All special tokens, in id order."""
        return [self.bos, self.eos, self.pad, *self.extra]


def load_tokenizer(path: str | Path) -> Any:
    """Loads the HF tokenizer in the local directory `path` (never downloads); one without a
    pad token gets EOS as pad. FileNotFoundError / ValueError name `path`. Imports torch via
    `AutoConfig` (1-2 s): the class matters (`Qwen2Tokenizer` splits digits, the fast base
    class on the same files does not)."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"tokenizer directory not found: {str(p)!r}")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a tokenizer from {str(p)!r}: {e}") from e
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer at {str(p)!r} has neither a pad nor an eos token")
        logger.info("tokenizer at %s has no pad token; using eos %r", p, tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def apply_chat_template(
    tokenizer: Any,
    messages: Sequence[Mapping[str, str]],
    *,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template (ending with the assistant
    opener with `add_generation_prompt`); ValueError when it has no template."""
    if not tokenizer.chat_template:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat template; "
            "use prompt_template 'plain' or 'r1', or add a chat template to the tokenizer"
        )
    ids = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
    )
    return [int(i) for i in ids]


def train_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int,
    path: str | Path,
    chat_template: str | None = DEFAULT_TEMPLATE,
    special_tokens: SpecialTokens = SpecialTokens(),
    min_frequency: int = 2,
    model_max_length: int = 4096,
) -> Path:
    """Trains a byte-level BPE tokenizer on `texts` (deterministic; every string round-trips)
    and saves it at `path` as an HF tokenizer directory with a `chat_template`; returns `path`.
    The vocabulary is the special tokens, 256 bytes and at most the rest of `vocab_size` in
    merges seen `min_frequency` times."""
    specials = special_tokens.all()
    if len(set(specials)) != len(specials):
        raise ValueError(f"special tokens must be distinct, got {specials}")
    min_vocab = 256 + len(specials)
    if vocab_size < min_vocab:
        raise ValueError(
            f"vocab_size={vocab_size} is below the {min_vocab} ids that the 256 byte symbols "
            f"and {len(specials)} special tokens need"
        )
    if chat_template is not None:
        _check_template_tokens(chat_template, specials)

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_checked_texts(texts), trainer=trainer)

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    token_map = {
        "bos_token": special_tokens.bos,
        "eos_token": special_tokens.eos,
        "pad_token": special_tokens.pad,
        "additional_special_tokens": list(special_tokens.extra),
    }
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **token_map,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    _write_json(out / "tokenizer_config.json", config)
    _write_json(out / "special_tokens_map.json", token_map)
    return out


def _checked_texts(texts: Iterable[str]) -> Iterable[str]:
    """Yields `texts`, raising on a non-string; raises if there are none."""
    count = 0
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"train_tokenizer: texts[{i}] is {type(text).__name__}, not str")
        count += 1
        yield text
    if count == 0:
        raise ValueError("train_tokenizer: no training texts given")


def _check_template_tokens(template: str, specials: list[str]) -> None:
    """Every `<|...|>` literal in the chat template must be a special token, or the template
    would render it as several byte-pieces that the model never sees as one symbol."""
    missing = sorted(set(_SPECIAL_LITERAL_RE.findall(template)) - set(specials))
    if missing:
        raise ValueError(
            f"chat template uses {missing}, which are not special tokens {specials}; "
            "add them to SpecialTokens.extra"
        )


def _write_json(path: Path, obj: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
