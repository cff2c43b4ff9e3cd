"""Prompt sources: JSONL / Parquet reading, validation, skipped-row accounting, errors."""

import gzip
import json
import logging
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlvr_jax.config.schema import SourceConfig
from rlvr_jax.data.rows import DataError, PromptRow, UnknownVerifier
from rlvr_jax.data.sources import MAX_LOGGED_SKIPS, load_source, load_sources, source_name

KNOWN = {"math", "ifeval", "code", "judge"}

GOOD = [
    {"prompt": "What is 1 + 1?", "ground_truth": "2", "verifier": "math"},
    {"prompt": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
     "ground_truth": {"instruction_id": ["punctuation:no_comma"], "kwargs": [{}]},
     "verifier": "ifeval", "domain": "chat_if", "verifier_kwargs": {"mode": "all"}},
    {"prompt": "Write add(a, b).", "ground_truth": ["assert add(1, 2) == 3"], "verifier": "code"},
    {"prompt": "Explain tides.", "ground_truth": None, "verifier": "judge"},
    {"prompt": "Compute 6 * 7.", "ground_truth": 42, "verifier": "math", "extra_column": "ignored"},
]  # fmt: skip


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_jsonl_rows_are_validated_and_normalised(tmp_path):
    path = write_lines(tmp_path / "mix.jsonl", [json.dumps(r) for r in GOOD])
    src = load_source(SourceConfig(path=str(path)), known_verifiers=KNOWN)
    assert src.name == "mix" and src.num_skipped == 0 and len(src.rows) == 5
    math_row, chat_row, code_row, judge_row, int_row = src.rows
    assert math_row == PromptRow("What is 1 + 1?", "2", "math", "math", {}, "mix", 0)
    assert chat_row.prompt == (
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
    )
    assert (chat_row.domain, chat_row.verifier_kwargs, chat_row.index) == (
        "chat_if",
        {"mode": "all"},
        1,
    )
    assert code_row.ground_truth == ["assert add(1, 2) == 3"] and code_row.domain == "code"
    assert judge_row.ground_truth is None
    assert int_row.ground_truth == "42"  # numbers become answer strings for math
    assert chat_row.to_dict() == {
        "prompt": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
        "ground_truth": {"instruction_id": ["punctuation:no_comma"], "kwargs": [{}]},
        "verifier": "ifeval",
        "domain": "chat_if",
        "verifier_kwargs": {"mode": "all"},
    }


def test_gzipped_jsonl_and_default_domain(tmp_path):
    path = tmp_path / "rows.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(json.dumps(GOOD[0]) + "\n\n" + json.dumps({**GOOD[0], "domain": "gsm"}) + "\n")
    src = load_source(SourceConfig(path=str(path), domain="arith", weight=2.5))
    assert src.name == "rows" and src.weight == 2.5
    assert [r.domain for r in src.rows] == ["arith", "gsm"]
    assert [r.index for r in src.rows] == [0, 2]  # the blank line 2 is skipped silently


def test_parquet_with_messages_and_json_text_ground_truth(tmp_path):
    table = pa.table({
        "prompt": [[{"role": "user", "content": "Say hi in lowercase."}], [{"role": "user", "content": "2+2?"}]],
        "ground_truth": [json.dumps({"instruction_id": ["change_case:english_lowercase"], "kwargs": [None]}), "4"],
        "verifier": ["ifeval", "math"],
    })  # fmt: skip
    pq.write_table(table, tmp_path / "p.parquet")
    src = load_source(SourceConfig(path=str(tmp_path / "p.parquet")), known_verifiers=KNOWN)
    assert [r.verifier for r in src.rows] == ["ifeval", "math"]
    assert src.rows[0].prompt == ({"role": "user", "content": "Say hi in lowercase."},)
    assert src.rows[0].ground_truth == {
        "instruction_id": ["change_case:english_lowercase"],
        "kwargs": [{}],
    }
    assert src.rows[1].ground_truth == "4"


def test_parquet_struct_ground_truth_drops_null_arguments(tmp_path):
    """pyarrow stores a list of dicts as structs over the union of keys, filling nulls."""
    gts = [
        {"instruction_id": ["startend:end_checker"], "kwargs": [{"end_phrase": "Bye."}]},
        {
            "instruction_id": ["length_constraints:number_words"],
            "kwargs": [{"num_words": 5, "relation": "at least"}],
        },
    ]
    table = pa.table({"prompt": ["a", "b"], "ground_truth": gts, "verifier": ["ifeval", "ifeval"]})
    pq.write_table(table, tmp_path / "s.parquet")
    stored = pq.read_table(tmp_path / "s.parquet").column("ground_truth").to_pylist()
    assert stored[0]["kwargs"][0] == {"end_phrase": "Bye.", "num_words": None, "relation": None}
    src = load_source(SourceConfig(path=str(tmp_path / "s.parquet")))
    assert [r.ground_truth for r in src.rows] == gts


BAD_LINES = [
    ('{"prompt": "no verifier", "ground_truth": "1"}', "missing_field", "missing field 'verifier'"),
    ('{"prompt": "x", "ground_truth": "1", "verifier": "math"', "bad_json", "undecodable JSON"),
    ('["not", "an", "object"]', "not_an_object", "not an object"),
    ('{"ground_truth": "1", "verifier": "math"}', "missing_field", "missing field 'prompt'"),
    ('{"prompt": "x", "verifier": "math"}', "missing_field", "missing field 'ground_truth'"),
    ('{"prompt": 5, "ground_truth": "1", "verifier": "math"}', "wrong_type", "'prompt' must be"),
    ('{"prompt": "   ", "ground_truth": "1", "verifier": "math"}', "empty_prompt", "empty"),
    ('{"prompt": [{"role": "bot", "content": "x"}], "ground_truth": "1", "verifier": "math"}', "wrong_type", "role 'bot'"),
    ('{"prompt": "x", "ground_truth": [1], "verifier": "math"}', "wrong_type", "math ground_truth"),
    ('{"prompt": "x", "ground_truth": {"instruction_id": []}, "verifier": "ifeval"}', "wrong_type", "instruction_id"),
    ('{"prompt": "x", "ground_truth": {"instruction_id": ["a"], "kwargs": [{}, {}]}, "verifier": "ifeval"}', "wrong_type", "list of 1"),
    ('{"prompt": "x", "ground_truth": "{not json", "verifier": "ifeval"}', "bad_json", "not JSON"),
    ('{"prompt": "x", "ground_truth": [], "verifier": "code"}', "wrong_type", "empty list"),
    ('{"prompt": "x", "ground_truth": "1", "verifier": "math", "domain": 3}', "wrong_type", "'domain'"),
    ('{"prompt": "x", "ground_truth": "1", "verifier": "math", "verifier_kwargs": [1]}', "wrong_type", "verifier_kwargs"),
    ("\xff\xfe garbage", "bad_json", "undecodable"),
]  # fmt: skip


def test_bad_rows_are_skipped_counted_and_named(tmp_path, caplog):
    good = json.dumps(GOOD[0])
    lines = [good] + [line for line, _, _ in BAD_LINES[:MAX_LOGGED_SKIPS]] + [good]
    path = write_lines(tmp_path / "bad.jsonl", lines)
    with caplog.at_level(logging.WARNING, logger="rlvr_jax.data.sources"):
        src = load_source(SourceConfig(path=str(path)), known_verifiers=KNOWN)
    assert [r.index for r in src.rows] == [0, MAX_LOGGED_SKIPS + 1]
    messages = [r.getMessage() for r in caplog.records]
    for k, (_, _, reason) in enumerate(BAD_LINES[:MAX_LOGGED_SKIPS]):
        line_no = k + 2  # 1-based, after the first good line
        assert any(str(path) in m and f"line {line_no}:" in m and reason in m for m in messages), (
            reason
        )
    assert any(f"skipped {MAX_LOGGED_SKIPS} of {MAX_LOGGED_SKIPS + 2} rows" in m for m in messages)


@pytest.mark.parametrize(("line", "kind", "reason"), BAD_LINES)
def test_each_bad_row_kind(tmp_path, caplog, line, kind, reason):
    path = tmp_path / "one.jsonl"
    path.write_bytes((json.dumps(GOOD[0]) + "\n").encode() + line.encode("latin-1") + b"\n")
    with caplog.at_level(logging.WARNING, logger="rlvr_jax.data.sources"):
        src = load_source(SourceConfig(path=str(path)), known_verifiers=KNOWN)
    assert len(src.rows) == 1 and src.skipped == {kind: 1}
    assert any("line 2:" in r.getMessage() and reason in r.getMessage() for r in caplog.records)


def test_skip_logging_is_rate_limited(tmp_path, caplog):
    lines = [json.dumps(GOOD[0])] + ['{"prompt": "x"}'] * 3000 + ["{broken"] * 2000
    path = write_lines(tmp_path / "many.jsonl", lines)
    with caplog.at_level(logging.WARNING, logger="rlvr_jax.data.sources"):
        src = load_source(SourceConfig(path=str(path)))
    assert src.skipped == {"missing_field": 3000, "bad_json": 2000}
    assert len(caplog.records) == MAX_LOGGED_SKIPS + 1  # the first few, then one summary
    summary = caplog.records[-1].getMessage()
    assert "skipped 5000 of 5001 rows (bad_json: 2000, missing_field: 3000)" in summary


def test_overlong_prompts_are_skipped(tmp_path, caplog):
    rows = [{"prompt": "word " * n, "ground_truth": "1", "verifier": "math"} for n in (3, 10, 5)]
    path = write_lines(tmp_path / "len.jsonl", [json.dumps(r) for r in rows])
    with caplog.at_level(logging.WARNING):
        src = load_source(
            SourceConfig(path=str(path)),
            token_length=lambda row: len(row.prompt.split()),
            max_prompt_len=5,
        )
    assert [r.index for r in src.rows] == [0, 2] and src.skipped == {"too_long": 1}
    assert any("line 2:" in r.getMessage() and "10 tokens > max_prompt_len 5" in r.getMessage()
               for r in caplog.records)  # fmt: skip


def test_unknown_verifier_is_an_error_naming_the_row(tmp_path):
    rows = [GOOD[0], {"prompt": "x", "ground_truth": "1", "verifier": "poetry"}]
    path = write_lines(tmp_path / "unk.jsonl", [json.dumps(r) for r in rows])
    with pytest.raises(UnknownVerifier, match=r"unk\.jsonl\) line 2: unknown verifier 'poetry'"):
        load_source(SourceConfig(path=str(path)), known_verifiers=KNOWN)
    # module:function verifiers are imported once each when the source loads
    rows[1]["verifier"] = "helpers_train:word_parity"
    write_lines(path, [json.dumps(r) for r in rows])
    assert len(load_source(SourceConfig(path=str(path)), known_verifiers=KNOWN).rows) == 2
    rows[1]["verifier"] = "my_pkg.rewards:score"
    write_lines(path, [json.dumps(r) for r in rows])
    with pytest.raises(UnknownVerifier, match=r"line 2 'verifier': cannot import module 'my_pkg"):
        load_source(SourceConfig(path=str(path)), known_verifiers=KNOWN)


def test_entirely_unusable_sources(tmp_path):
    with pytest.raises(DataError, match=r"source file not found: .*nothing\.jsonl"):
        load_source(SourceConfig(path=str(tmp_path / "nothing.jsonl")))
    with pytest.raises(DataError, match=r"rows\.csv.*cannot tell the format"):
        load_source(SourceConfig(path=str(tmp_path / "rows.csv")))
    all_bad = write_lines(tmp_path / "allbad.jsonl", ["{oops", '{"prompt": "x"}'])
    with pytest.raises(DataError, match=r"allbad.*no usable rows; skipped 2 of 2 rows"):
        load_source(SourceConfig(path=str(all_bad)))
    empty = write_lines(tmp_path / "empty.jsonl", [""])
    with pytest.raises(DataError, match=r"empty.*no usable rows; it holds no rows"):
        load_source(SourceConfig(path=str(empty)))
    not_parquet = write_lines(tmp_path / "fake.parquet", ["hello"])
    with pytest.raises(DataError, match=r"fake\.parquet.*not a readable Parquet file"):
        load_source(SourceConfig(path=str(not_parquet)))


def test_truncated_gzip_is_an_error_naming_the_source(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    payload = "".join(json.dumps({**GOOD[0], "prompt": f"q{i}"}) + "\n" for i in range(2000))
    data = gzip.compress(payload.encode())
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        DataError, match=r"'cut' \(.*cut\.jsonl\.gz\): reading failed after \d+ rows"
    ):
        load_source(SourceConfig(path=str(path)))


def test_explicit_format_overrides_extension(tmp_path):
    path = write_lines(tmp_path / "rows.txt", [json.dumps(GOOD[0])])
    src = load_source(SourceConfig(path=str(path), format="jsonl", name="custom"))
    assert src.name == "custom" and src.rows[0].source == "custom"


def test_source_names_must_be_distinct(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    p1 = write_lines(tmp_path / "a" / "train.jsonl", [json.dumps(GOOD[0])])
    p2 = write_lines(tmp_path / "b" / "train.jsonl", [json.dumps(GOOD[0])])
    with pytest.raises(DataError, match=r"share the names \['train'\]"):
        load_sources([SourceConfig(path=str(p1)), SourceConfig(path=str(p2))])
    both = load_sources([SourceConfig(path=str(p1)), SourceConfig(path=str(p2), name="b")])
    assert [s.name for s in both] == ["train", "b"]


def test_source_name_strips_data_suffixes():
    assert source_name(SourceConfig(path="/x/gsm8k.jsonl.gz")) == "gsm8k"
    assert source_name(SourceConfig(path="/x/if.parquet")) == "if"
    assert (
        source_name(SourceConfig(path="rlvr_synthetic/tiny", format="tfds"))
        == "rlvr_synthetic/tiny"
    )


def test_importing_the_data_package_is_light():
    code = (
        "import sys, rlvr_jax.data; "
        "heavy = {'tensorflow', 'tensorflow_datasets', 'transformers', 'tokenizers', 'torch', 'pyarrow', 'jax'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
