"""Preference rows: plain, chat and implicit-prompt forms, what is skipped and counted, and the
loader (JSONL and Parquet) tokenizing prompts and responses once."""

import json

import pytest

from rlvr_jax.config.schema import SourceConfig
from rlvr_jax.data import BadRow, DataError, load_source
from rlvr_jax.data.formatting import encode_response, format_prompt
from rlvr_jax.data.preferences import (
    PreferenceRow,
    load_preference_sources,
    preference_from_record,
)
from rlvr_jax.data.rows import row_from_record

USER = {"role": "user", "content": "Compute 2 + 3."}
SYSTEM = {"role": "system", "content": "Be brief."}


def parse(record):
    return preference_from_record(record, source="s", index=7)


def test_plain_strings():
    row = parse({"prompt": "Compute 2 + 3.", "chosen": "5", "rejected": "6", "extra": 1})
    assert row == PreferenceRow("Compute 2 + 3.", "5", "6", source="s", index=7)
    assert row.messages() == [{"role": "user", "content": "Compute 2 + 3."}]


def test_chat_prompt_with_assistant_message_responses():
    row = parse(
        {
            "prompt": [SYSTEM, USER],
            "chosen": [{"role": "assistant", "content": "5"}],
            "rejected": [{"role": "assistant", "content": "6"}],
        }
    )
    assert row.prompt == (SYSTEM, USER) and (row.chosen, row.rejected) == ("5", "6")


def test_full_conversations_repeat_the_prompt_first():
    # a string prompt repeated as the user message, and chat prompts repeated whole
    row = parse(
        {
            "prompt": "Compute 2 + 3.",
            "chosen": [USER, {"role": "assistant", "content": "5"}],
            "rejected": "6",
        }
    )
    assert (row.chosen, row.rejected) == ("5", "6")


def test_implicit_prompt_is_the_shared_leading_messages():
    row = parse(
        {
            "chosen": [SYSTEM, USER, {"role": "assistant", "content": "5"}],
            "rejected": [SYSTEM, USER, {"role": "assistant", "content": "6"}],
        }
    )
    assert row.prompt == (SYSTEM, USER) and (row.chosen, row.rejected) == ("5", "6")


@pytest.mark.parametrize(
    "record, kind, message",
    [
        ([1], "not_an_object", "not an object"),
        ({"prompt": "p", "chosen": "a"}, "missing_field", "missing field 'rejected'"),
        ({"chosen": "a", "rejected": "b"}, "missing_field", "needed when the responses are"),
        (
            {
                "chosen": [USER, {"role": "assistant", "content": "a"}],
                "rejected": [SYSTEM, {"role": "assistant", "content": "b"}],
            },
            "missing_field",
            "do not share leading prompt messages",
        ),
        ({"prompt": "", "chosen": "a", "rejected": "b"}, "empty_prompt", "'prompt' is empty"),
        ({"prompt": "p", "chosen": "  ", "rejected": "b"}, "empty_response", "'chosen' is empty"),
        ({"prompt": "p", "chosen": "a", "rejected": "a"}, "identical_pair", "the same response"),
        ({"prompt": "p", "chosen": 3, "rejected": "b"}, "wrong_type", "got int"),
        (
            {"prompt": "p", "chosen": [{"role": "user", "content": "x"}], "rejected": "b"},
            "wrong_type",
            "one assistant message after the prompt",
        ),
        (
            {"prompt": "p", "chosen": [{"role": "robot", "content": "x"}], "rejected": "b"},
            "wrong_type",
            "role 'robot'",
        ),
    ],
)
def test_bad_rows_are_skipped_with_a_reason(record, kind, message):
    with pytest.raises(BadRow, match=message) as e:
        parse(record)
    assert e.value.kind == kind


def test_prompt_rows_are_unchanged():
    row = row_from_record(
        {"prompt": "p", "ground_truth": "1", "verifier": "math"}, source="s", index=0, where="x"
    )
    assert row.verifier == "math" and row.response is None


@pytest.fixture(scope="module")
def tokenizer():
    from rlvr_jax.data import load_tokenizer

    return load_tokenizer("rlvr_jax/demo/assets/base")


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "not json\n")
    return path


def test_loader_tokenizes_once_and_counts_skips(tmp_path, tokenizer):
    records = [
        {"prompt": "Compute 2 + 3.", "chosen": "\\boxed{5}", "rejected": "\\boxed{6}"},
        {"prompt": "Compute 1 + 1.", "chosen": "2", "rejected": "2"},
        {"prompt": "Say something long.", "chosen": "word " * 80, "rejected": "x"},
        {"prompt": [USER], "chosen": [{"role": "assistant", "content": "5"}], "rejected": "7"},
    ]
    path = write_jsonl(tmp_path / "pairs.jsonl", records)
    (source,) = load_preference_sources(
        [SourceConfig(path=str(path))], tokenizer, "plain", max_prompt_len=32, max_response_len=20
    )
    assert [r.index for r in source.rows] == [0, 3]
    assert source.skipped == {"identical_pair": 1, "too_long": 1, "bad_json": 1}
    row = source.rows[0]
    assert list(row.prompt_ids) == format_prompt(row, tokenizer, "plain")
    assert list(row.chosen_ids) == encode_response("\\boxed{5}", tokenizer, "plain")
    assert row.rejected_ids[-1] == tokenizer.eos_token_id


def test_loader_reads_parquet_with_message_lists(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(
        [
            {
                "prompt": [USER],
                "chosen": [{"role": "assistant", "content": "5"}],
                "rejected": [{"role": "assistant", "content": "6"}],
            }
        ]
    )
    pq.write_table(table, tmp_path / "pairs.parquet")
    (source,) = load_preference_sources(
        [SourceConfig(path=str(tmp_path / "pairs.parquet"))],
        tokenizer,
        "chat",
        max_prompt_len=64,
        max_response_len=16,
    )
    assert source.rows[0].chosen == "5" and source.rows[0].prompt == (USER,)


def test_no_usable_pair_or_no_source_is_a_data_error(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "a"}])
    with pytest.raises(DataError, match=r"no usable rows; skipped 2 of 2 rows"):
        load_preference_sources(
            [SourceConfig(path=str(path))], tokenizer, "plain", max_prompt_len=8, max_response_len=8
        )
    with pytest.raises(DataError, match=r"dpo\.sources is empty"):
        load_preference_sources([], tokenizer, "plain", max_prompt_len=8, max_response_len=8)


def test_load_source_without_parse_still_wants_prompt_rows(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}])
    with pytest.raises(DataError, match="missing_field"):
        load_source(SourceConfig(path=str(path)))
