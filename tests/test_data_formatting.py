"""Prompt templates (chat / r1 / plain) with a locally trained tokenizer."""

import pytest

from rlvr_jax.data.formatting import R1_INSTRUCTION, format_prompt, prompt_length_fn
from rlvr_jax.data.rows import PromptRow
from rlvr_jax.data.tokenizer import load_tokenizer

TEXT_ROW = PromptRow("What is 1 + 1?", "2", "math", "math")
CHAT_ROW = PromptRow(
    ({"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}),
    None,
    "judge",
    "judge",
)


@pytest.fixture(scope="module")
def tok(tiny_tokenizer):
    return tiny_tokenizer  # tests/conftest.py


def test_chat_template(tok):
    ids = format_prompt(TEXT_ROW, tok, "chat")
    assert tok.decode(ids) == "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n"
    ids = format_prompt(CHAT_ROW, tok, "chat")
    assert tok.decode(ids) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_r1_template(tok):
    ids = format_prompt(TEXT_ROW, tok, "r1")
    assert tok.decode(ids) == R1_INSTRUCTION + "\nUser: What is 1 + 1?\nAssistant:"
    assert "<think> reasoning process here </think>" in R1_INSTRUCTION
    assert "<answer> answer here </answer>" in R1_INSTRUCTION
    ids = format_prompt(CHAT_ROW, tok, "r1")
    assert tok.decode(ids) == R1_INSTRUCTION + "\nBe terse.\nUser: Hi\nAssistant:"


def test_plain_template(tok):
    ids = format_prompt(TEXT_ROW, tok, "plain")
    assert ids == tok.encode("What is 1 + 1?") and tok.decode(ids) == "What is 1 + 1?"
    assert tok.decode(format_prompt(CHAT_ROW, tok, "plain")) == "Be terse.\n\nHi"


def test_plain_follows_the_tokenizers_bos_policy(tmp_path, tiny_tokenizer_dir):
    """A tokenizer that prepends BOS (like Llama's) gets it in plain and r1 prompts."""
    from tokenizers import Tokenizer, processors

    raw = Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
    raw.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
    )
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        (tmp_path / name).write_bytes((tiny_tokenizer_dir / name).read_bytes())
    raw.save(str(tmp_path / "tokenizer.json"))
    bos_tok = load_tokenizer(tmp_path)
    plain = format_prompt(TEXT_ROW, bos_tok, "plain")
    assert plain[0] == 0 and plain[1:] == format_prompt(
        TEXT_ROW, load_tokenizer(tiny_tokenizer_dir), "plain"
    )
    assert format_prompt(TEXT_ROW, bos_tok, "r1")[0] == 0


def test_deterministic_and_length_fn(tok):
    for template in ("chat", "r1", "plain"):
        ids = format_prompt(TEXT_ROW, tok, template)
        assert ids == format_prompt(TEXT_ROW, tok, template)
        assert all(type(i) is int for i in ids)
        assert prompt_length_fn(tok, template)(TEXT_ROW) == len(ids)


def test_unknown_template(tok):
    with pytest.raises(ValueError, match="unknown prompt template 'alpaca'"):
        format_prompt(TEXT_ROW, tok, "alpaca")
    with pytest.raises(ValueError, match="unknown prompt template"):
        prompt_length_fn(tok, "alpaca")
