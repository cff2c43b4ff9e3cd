"""The tool-use task (`rlvr_jax.demo.tool_use`, the `lookup` tool of `rlvr_jax.envs.lookup`):
two-token keys in both the prompt and the call, a hidden table, disjoint splits equal to the
shipped data files, traces that tokenize as the environment's episodes and fit the config's
budgets; and the documented ToolEnv command (docs/envs.md), run as written on the warm start
the project builds, calls the tool."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import rlvr_jax
from rlvr_jax.config import load
from rlvr_jax.data import load_tokenizer
from rlvr_jax.data.tokenizer import apply_chat_template
from rlvr_jax.demo import tool_use
from rlvr_jax.envs.lookup import KEYS, SYLLABLES, TABLE, lookup
from rlvr_jax.envs.tools import call_tool, resolve_tool

ROOT = Path(__file__).resolve().parents[1]
DEMO = Path(rlvr_jax.__file__).parent / "demo" / "assets" / "base"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEMO)


def test_keys_are_two_tokens_where_the_model_reads_and_writes_them(tokenizer):
    assert len(KEYS) == len(set(KEYS)) == len(SYLLABLES) ** 2 == 400
    quote = tokenizer.encode(' "', add_special_tokens=False)
    for key in KEYS:
        ids = tokenizer.encode(f' "{key}"', add_special_tokens=False)
        assert len(ids) == len(quote) + 3, key  # ' "', two tokens, '"'
        call = tokenizer.encode(
            tool_use.tool_call("lookup", {"key": key}), add_special_tokens=False
        )
        assert any(call[i : i + len(ids)] == ids for i in range(len(call))), key  # the same ids


def test_the_table_and_the_tool():
    assert set(TABLE) == set(KEYS) and all(100 <= c <= 999 for c in TABLE.values())
    assert len(set(TABLE.values())) > 300  # codes drawn at random, not a function of the key
    tool = resolve_tool("lookup")
    assert tool.schema["function"]["parameters"]["required"] == ["key"]
    key = KEYS[7]
    assert lookup(key) == str(TABLE[key]) == call_tool(tool, {"key": key}, 5.0)[0]
    text, ok, _ = call_tool(tool, {"key": "nokey"}, 5.0)
    assert not ok and text == "error: ValueError: no key 'nokey' in the table"


def test_splits_are_disjoint_and_shipped(tmp_path):
    train, test = tool_use.split_keys()
    assert len(train) == 320 and len(test) == tool_use.TEST_KEYS == 80
    assert not set(train) & set(test) and set(train) | set(test) == set(KEYS)
    paths = tool_use.write_splits(tmp_path)
    for name, path in paths.items():  # the shipped files are this command's output
        assert path.read_text() == (ROOT / "data" / "tool_use" / f"{name}.jsonl").read_text()
    row = json.loads(paths["test"].read_text().splitlines()[0])
    assert (
        row["prompt"] == f'What is the code of "{test[0]}"? Put your final answer in \\boxed{{}}.'
    )
    assert row["ground_truth"] == str(TABLE[test[0]]) and row["verifier"] == "math"


def test_traces_are_the_episodes_and_fit_the_budgets(tokenizer):
    cfg = load(ROOT / "configs" / "tool_use.yaml")
    rows = tool_use.task_rows(tool_use.split_keys()[0][:12])
    traces = tool_use.tool_traces(rows, tokenizer)  # raises unless they tokenize as episodes
    for r, t in zip(rows, traces):
        call = tool_use.tool_call("lookup", {"key": r["key"]})
        assert t["response"].startswith(call + "<|im_end|>")
        assert f"<tool_response>\n{r['ground_truth']}\n</tool_response>" in t["response"]
        assert t["response"].endswith(f"\\boxed{{{r['ground_truth']}}}")
        prompt = len(apply_chat_template(tokenizer, t["prompt"]))
        response = len(tokenizer.encode(t["response"], add_special_tokens=False)) + 1  # EOS
        assert prompt <= cfg.data.max_prompt_len and response <= cfg.rollout.max_new_tokens
    assert [d["response"] for d in tool_use.direct_traces(rows[:1])] == [
        f"\\boxed{{{rows[0]['ground_truth']}}}"
    ]


def docs_command() -> str:
    """The ToolEnv command of docs/envs.md (the first `rlvr-train` line of its first block)."""
    text = (ROOT / "docs" / "envs.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.DOTALL)[1]
    (line,) = [x for x in block.splitlines() if x.startswith("rlvr-train")]
    return line


@pytest.mark.slow
def test_the_documented_tool_env_command_calls_the_tool(tmp_path):
    """docs/envs.md's command from a checkout (configs/ and data/ beside it), as a user runs
    it: the warm start is built on first use and RL's episodes call the tool. Two steps of it
    here, of 2 prompts x 8 samples (`train.max_steps=2 train.prompts_per_batch=2` appended: the
    warm start's SFT does not read them, RL's episodes are a quarter of the config's 8 x 8)."""
    from helpers_cli import Proc, xla_flags

    for name in ("configs", "data"):
        (tmp_path / name).symlink_to(ROOT / name)
    argv = docs_command().split()
    assert argv[:3] == ["rlvr-train", "--config", "configs/tool_use.yaml"]
    # optimized: its 200 SFT steps take a third of the CPU time they take at -O0 (helpers_cli)
    proc = Proc(
        argv[0],
        [*argv[1:], "train.max_steps=2", "train.prompts_per_batch=2"],
        tmp_path,
        XLA_FLAGS=xla_flags(optimize=True),
    )
    assert proc.wait(1800) == 0, proc.stderr()[-3000:]
    warm = json.loads((tmp_path / "runs" / "cache" / "tool_base" / "warm_start.json").read_text())
    assert warm["recipe"]["steps"] == tool_use.WARM_START.steps
    rows = [json.loads(x) for x in (tmp_path / "runs" / "tool_use" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["env/tool_calls"] > 0.5 for r in rows), [r["env/tool_calls"] for r in rows]
    shutil.rmtree(tmp_path / "runs")
