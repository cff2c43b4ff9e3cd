"""Tokenizer training → save → AutoTokenizer (offline) load → encode/decode and chat template."""

import json

import pytest

from rlvr_jax.data import synthetic
from rlvr_jax.data.tokenizer import (
    DEFAULT_TEMPLATE,
    SpecialTokens,
    apply_chat_template,
    load_tokenizer,
    train_tokenizer,
)

VOCAB = 512


def corpus() -> list[str]:
    rows = synthetic.generate("train", 300, seed=0)
    return [r["prompt"] for r in rows] + [synthetic.reference_response(r) for r in rows]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return train_tokenizer(corpus(), vocab_size=VOCAB, path=tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load_tokenizer(tok_dir)


def test_directory_layout_and_config(tok_dir):
    assert sorted(p.name for p in tok_dir.iterdir()) == [
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == DEFAULT_TEMPLATE
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == (
        "<|endoftext|>",
        "<|im_end|>",
        "<|pad|>",
    )
    token_map = json.loads((tok_dir / "special_tokens_map.json").read_text())
    assert token_map["additional_special_tokens"] == ["<|im_start|>"]


def test_autotokenizer_loads_offline_with_special_ids(tok_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    # SpecialTokens order: bos, eos, pad, extra → ids 0, 1, 2, 3.
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (0, 1, 2)
    assert hf.convert_tokens_to_ids("<|im_start|>") == 3
    # The corpus has far more than VOCAB - 260 mergeable pairs, so the trainer fills the vocab.
    assert len(hf) == VOCAB


@pytest.mark.parametrize(
    "text",
    ["Compute 3 + 4 * (5 - 2).", "héllo  wörld\n\ttabs  ", "中文 🙂 emoji", " leading space", ""],
)
def test_encode_decode_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=True)
    assert tok.decode(ids) == text


def test_bpe_merges_compress_training_text(tok):
    text = "Write a short note about the ocean."
    assert len(tok.encode(text)) < len(text.encode("utf-8")) / 2


def test_special_tokens_are_single_ids(tok):
    ids = tok.encode("<|im_start|>user<|im_end|>", add_special_tokens=False)
    assert ids[0] == 3 and ids[-1] == 1
    assert tok.decode(ids) == "<|im_start|>user<|im_end|>"


def test_chat_template_round_trip(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    ids = apply_chat_template(tok, messages)
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.decode(ids) == expected
    assert ids == tok.encode(expected, add_special_tokens=False)
    assert all(isinstance(i, int) for i in ids)
    no_gen = apply_chat_template(tok, messages, add_generation_prompt=False)
    assert tok.decode(no_gen) == expected.removesuffix("<|im_start|>assistant\n")


def test_training_is_deterministic(tmp_path, tok_dir):
    again = train_tokenizer(corpus(), vocab_size=VOCAB, path=tmp_path / "again")
    assert (again / "tokenizer.json").read_bytes() == (tok_dir / "tokenizer.json").read_bytes()


def test_missing_directory_error_names_path(tmp_path):
    missing = tmp_path / "no_such_tok"
    with pytest.raises(FileNotFoundError, match="no_such_tok"):
        load_tokenizer(missing)


def test_directory_without_tokenizer_error_names_path(tmp_path):
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(ValueError, match="empty_dir"):
        load_tokenizer(empty)


def test_missing_pad_falls_back_to_eos(tmp_path):
    path = train_tokenizer(["some text here", "more text"] * 5, vocab_size=300, path=tmp_path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["pad_token"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "special_tokens_map.json").unlink()
    tok = load_tokenizer(path)
    assert tok.pad_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id == 1


def test_no_chat_template_is_a_clear_error(tmp_path):
    path = train_tokenizer(["abc abc"] * 4, vocab_size=300, path=tmp_path, chat_template=None)
    tok = load_tokenizer(path)
    with pytest.raises(ValueError, match="no chat template"):
        apply_chat_template(tok, [{"role": "user", "content": "hi"}])


def test_template_tokens_must_be_special(tmp_path):
    template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match=r"<\|user\|>"):
        train_tokenizer(["x"], vocab_size=300, path=tmp_path, chat_template=template)


def test_custom_special_tokens(tmp_path):
    specials = SpecialTokens(bos="<s>", eos="</s>", pad="<pad>", extra=())
    template = "{% for m in messages %}{{ m['content'] }}</s>{% endfor %}"
    path = train_tokenizer(
        ["a b c"] * 3,
        vocab_size=270,
        path=tmp_path,
        chat_template=template,
        special_tokens=specials,
    )
    tok = load_tokenizer(path)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"vocab_size": 259}, ValueError, "below the 260"),
        ({"texts": []}, ValueError, "no training texts"),
        ({"texts": ["ok", 7]}, TypeError, r"texts\[1\] is int"),
        ({"special_tokens": SpecialTokens(eos="<|pad|>")}, ValueError, "distinct"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, error, match):
    args = {"texts": ["hello"], "vocab_size": 300, "path": tmp_path, **kwargs}
    with pytest.raises(error, match=match):
        train_tokenizer(args.pop("texts"), **args)
