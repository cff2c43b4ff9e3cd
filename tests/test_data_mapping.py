"""A source's own column names and answers: `data.sources[].fields`, `.verifier`,
`.answer_transform` (`rlvr_jax.data.mapping`), checked at config load, applied at data load;
`module:function` references imported at config load with the key named."""

import json
import textwrap

import pytest

from rlvr_jax.config import ConfigError, load
from rlvr_jax.config.schema import SourceConfig
from rlvr_jax.data.mapping import gsm8k
from rlvr_jax.data.rows import DataError, PromptRow, UnknownVerifier
from rlvr_jax.data.sources import load_source

KNOWN = {"math", "ifeval", "code", "judge"}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    ("answer", "final"),
    [
        ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
        ("He pays 1,000 + 234.\n####  1,234 ", "1234"),
        ("a #### b\n#### -3.5", "-3.5"),  # the last marker counts
    ],
)
def test_gsm8k_takes_the_text_after_the_last_marker(answer, final):
    assert gsm8k(answer) == final


@pytest.mark.parametrize("answer", ["no marker here", "ends with ####  ", 72])
def test_gsm8k_refuses_an_answer_without_one(answer):
    with pytest.raises(ValueError):
        gsm8k(answer)


def test_fields_verifier_and_gsm8k_map_a_question_answer_file(tmp_path):
    path = write_jsonl(
        tmp_path / "gsm.jsonl",
        [
            {"question": "Tom has 3 + 4 apples?", "answer": "3 + 4 = 7\n#### 7"},
            {"question": "Two dozen?", "answer": "2 * 12 = 24\n#### 24", "verifier": "judge"},
            {"question": "No marker", "answer": "just 5"},  # the transform rejects it: skipped
            {"answer": "#### 1"},  # no question: skipped
        ],
    )
    cfg = SourceConfig(
        path=path,
        fields={"prompt": "question", "ground_truth": "answer"},
        verifier="math",
        answer_transform="gsm8k",
    )
    src = load_source(cfg, known_verifiers=KNOWN)
    assert src.rows[0] == PromptRow("Tom has 3 + 4 apples?", "7", "math", "math", {}, "gsm", 0)
    assert (src.rows[1].verifier, src.rows[1].ground_truth) == ("judge", "24")  # the row's own
    assert src.skipped == {"bad_answer": 1, "missing_field": 1}


def test_chat_message_prompts_map_too(tmp_path):
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": messages, "target": 4}])
    cfg = SourceConfig(
        path=path, fields={"prompt": "messages", "ground_truth": "target"}, verifier="math"
    )
    (row,) = load_source(cfg, known_verifiers=KNOWN).rows
    assert row.messages() == messages and row.ground_truth == "4"


def test_a_file_of_its_own_columns_without_mapping_says_what_to_set(tmp_path):
    path = write_jsonl(tmp_path / "own.jsonl", [{"question": "q", "solution": "s"}])
    with pytest.raises(DataError) as e:
        load_source(SourceConfig(path=path), known_verifiers=KNOWN)
    message = str(e.value)
    assert "missing_field: 1" in message and "docs/data.md" in message
    assert "fields" in message and "{prompt: question, ground_truth: answer}" in message


def test_a_module_function_transform_and_verifier(tmp_path, monkeypatch):
    (tmp_path / "user_answers.py").write_text(
        textwrap.dedent(
            """
            def last_word(answer):
                return answer.split()[-1]

            def exact(response, ground_truth, **_):
                return float(response.strip() == ground_truth)
            """
        )
    )
    monkeypatch.chdir(tmp_path)  # the working directory is searched
    path = write_jsonl(tmp_path / "w.jsonl", [{"prompt": "p", "ground_truth": "the answer is 9"}])
    cfg = SourceConfig(
        path=path, verifier="user_answers:exact", answer_transform="user_answers:last_word"
    )
    (row,) = load_source(cfg, known_verifiers=KNOWN).rows
    assert (row.verifier, row.ground_truth) == ("user_answers:exact", "9")


def test_a_row_verifier_that_cannot_be_imported_names_the_row(tmp_path):
    path = write_jsonl(
        tmp_path / "r.jsonl",
        [
            {"prompt": "p", "ground_truth": "1", "verifier": "math"},
            {"prompt": "q", "ground_truth": "1", "verifier": "no_such_module_xyz:score"},
        ],
    )
    with pytest.raises(UnknownVerifier, match=r"line 2 'verifier': cannot import module"):
        load_source(SourceConfig(path=path), known_verifiers=KNOWN)


def _load(tmp_path, *overrides):
    return load(None, [f"model.path={tmp_path / 'none'}", *overrides])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.sources=[{path: x, fields: {question: prompt}}]", "data.sources[0].fields"),
        ("data.eval_sources=[{path: x, answer_transform: gsm9}]", "data.eval_sources[0]."
         "answer_transform: unknown answer transform 'gsm9'"),
        ("sft.sources=[{path: x, verifier: 'no_such_mod_q:v'}]", "sft.sources[0].verifier: "
         "cannot import module 'no_such_mod_q'"),
        ("data.sources=[{path: x, answer_transform: 'os:no_such_fn'}]",
         "data.sources[0].answer_transform: module 'os' has no attribute 'no_such_fn'"),
    ],
)  # fmt: skip
def test_bad_mappings_fail_at_config_load_naming_the_key(tmp_path, override, message):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, override)
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.name=no_such_env_mod:make"], "env.name: cannot import module 'no_such_env_mod'"),
        (["env.name=tools", "env.tools=[calculator, 'mytools_absent:add']"],
         "env.tools[1]: cannot import module 'mytools_absent'"),
        (["env.name=tools", "env.tools=[abacus]"], "env.tools[0]: 'abacus' is not one of"),
        (["env.name=nowhere"], "env.name 'nowhere' is not one of"),
    ],
)  # fmt: skip
def test_missing_env_and_tool_modules_fail_at_load(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, *overrides)
    assert message in str(e.value)


def test_a_tool_module_in_the_working_directory_is_found_and_checked(tmp_path, monkeypatch):
    (tmp_path / "mytools_here.py").write_text(
        "def add(a: int, b: int) -> int:\n    return a + b\n\ndef untyped(a):\n    return a\n"
    )
    monkeypatch.chdir(tmp_path)
    cfg = _load(tmp_path, "env.name=tools", "env.tools=[calculator, 'mytools_here:add']")
    assert cfg.env.tools == ["calculator", "mytools_here:add"]
    with pytest.raises(ConfigError, match=r"env.tools\[0\]: .*needs a type annotation"):
        _load(tmp_path, "env.name=tools", "env.tools=['mytools_here:untyped']")


def test_context_is_checked_against_the_model(tmp_path, capsys):
    from rlvr_jax.cli import train_main
    from rlvr_jax.config import check_context

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    ok = load(None, [f"model.path={model}", "data.max_prompt_len=192", "rollout.max_new_tokens=64"])
    check_context(ok)
    long = [f"model.path={model}", "data.max_prompt_len=200", "rollout.max_new_tokens=64"]
    with pytest.raises(ConfigError) as e:
        check_context(load(None, long))
    assert (
        "data.max_prompt_len=200 + rollout.max_new_tokens=64 = 264 positions exceed the "
        f"model's max_position_embeddings=256 ({model / 'config.json'})" in str(e.value)
    )
    inline = ["model.hf_config={max_position_embeddings: 128}", "algorithm=dpo"]
    with pytest.raises(ConfigError, match=r"dpo.max_response_len=100 = 356 .*\(model.hf_config\)"):
        check_context(_load(tmp_path, *inline, "dpo.max_response_len=100"))
    check_context(_load(tmp_path))  # no model at hand: nothing to check against
    assert train_main(["--dry-run", *long]) == 2  # rlvr-train checks it right after the load
    assert "264 positions exceed" in capsys.readouterr().err
