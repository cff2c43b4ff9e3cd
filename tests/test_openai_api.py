"""`openai_api`: request validation (400s name the parameter) and `ChoiceText`, the
incremental detokeniser behind streamed answers."""

from __future__ import annotations

import itertools

import pytest

from rlvr_jax.serve.openai_api import BadRequest, ChoiceText, parse_request

EOS = 1  # "<|im_end|>" (ids: bos 0, eos 1, pad 2, im_start 3)


@pytest.fixture(scope="module")
def tok(tiny_tokenizer):
    return tiny_tokenizer


def _parse(tok, body, kind="completion"):
    return parse_request(kind, body, tok, (EOS,), itertools.count(7))


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": 5}, "prompt"),
        ({"prompt": ["a", 3.5]}, "prompt"),
        ({"prompt": "a", "n": "2"}, "n"),
        ({"prompt": "a", "n": 0}, "n"),
        ({"prompt": "a", "temperature": -1}, "temperature"),
        ({"prompt": "a", "top_p": 0}, "top_p"),
        ({"prompt": "a", "stop": [""]}, "stop"),
        ({"prompt": "a", "echo": True}, "echo"),
        ({"prompt": "a", "logit_bias": {"5": 1}}, "logit_bias"),
        ({"prompt": "a", "best_of": 3}, "best_of"),
        ({"prompt": "a", "stream": "yes"}, "stream"),
        ({"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "a", "stream": True, "stream_options": {"include_usage": 1}}, "include_usage"),
    ],
)
def test_bad_requests_name_their_parameter(tok, body, param):
    with pytest.raises(BadRequest) as e:
        _parse(tok, body)
    assert e.value.param == param, str(e.value)


def test_chat_messages_are_checked(tok):
    with pytest.raises(BadRequest) as e:
        _parse(tok, {"messages": [{"role": "user"}]}, kind="chat")
    assert e.value.param == "messages"


def test_a_valid_request(tok):
    r = _parse(
        tok,
        {
            "prompt": ["hello world", [5, 6]],
            "n": 2,
            "stop": ["fox", "d"],
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": 1,
            "max_tokens": 9,
        },
    )
    assert r.prompts == [tok.encode("hello world"), [5, 6]] and r.num_choices == 4
    assert r.stream and r.include_usage and r.logprobs and r.max_tokens == 9
    assert r.seed == 7  # from the server's seed counter
    # "d" is one token: it stops generation itself; "fox" is cut from the text
    assert r.stop_token_ids == (EOS, *tok.encode("d", add_special_tokens=False))


def _stream(text: ChoiceText, tokens, chunk, reason="length"):
    deltas = [
        text.feed(tokens[i : i + chunk], [-0.5] * len(tokens[i : i + chunk]))
        for i in range(0, len(tokens), chunk)
    ]
    deltas.append(text.finish(reason))
    return deltas


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_streamed_text_equals_the_decoded_text(tok, chunk):
    words = "hello world, the lazy dog é ü"  # é / ü: two byte-level tokens each
    tokens = tok.encode(words, add_special_tokens=False)
    deltas = _stream(ChoiceText(tok, (EOS,), ()), tokens, chunk)
    assert "".join(d.text for d in deltas) == words
    assert all("\ufffd" not in d.text for d in deltas)  # half characters are held back
    assert [t for d in deltas for t in d.tokens] == tokens
    if chunk == 1:
        assert sum(bool(d.text) for d in deltas) > 3  # text flows while tokens arrive


def test_the_stop_token_ends_the_choice_and_is_not_text(tok):
    tokens = [*tok.encode("hello world", add_special_tokens=False), EOS]
    text = ChoiceText(tok, (EOS,), ())
    deltas = _stream(text, tokens, 4, reason="stop")
    assert "".join(d.text for d in deltas) == "hello world"
    assert text.finish_reason == "stop" and text.tokens == tokens[:-1]


@pytest.mark.parametrize("chunk", [1, 2, 50])
def test_a_stop_string_cuts_the_text_wherever_the_chunks_fall(tok, chunk):
    tokens = tok.encode("the quick brown fox jumps over", add_special_tokens=False)
    text = ChoiceText(tok, (EOS,), ("fox", "over"))
    deltas = _stream(text, tokens, chunk)
    assert "".join(d.text for d in deltas) == "the quick brown "
    assert text.finish_reason == "stop"
    assert len(text.tokens) < len(tokens)  # tokens after the stop string are dropped
