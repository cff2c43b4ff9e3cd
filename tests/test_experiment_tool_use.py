"""scripts/experiment_tool_use.py: the tool-call record of held-out episodes (by hand), and a
`--quick` run of every arm on the harness (slow)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlvr_jax.envs import EpisodeRecord

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
pytest.importorskip("experiment_common", reason="needs the experiment harness")
import experiment_tool_use as exp  # noqa: E402

PROMPT = 'What is the code of "joyate"? Put your final answer in \\boxed{}.'
BAD_ARGUMENTS = '<tool_call>{"name": "lookup", "arguments": {"k": 1}}</tool_call>'


def call(key: str) -> str:
    return f'<tool_call>{{"name": "lookup", "arguments": {{"key": "{key}"}}}}</tool_call>'


def episode(*turns) -> EpisodeRecord:
    """turns: (assistant text, [tool responses]) pairs; the last text is the final answer."""
    messages = [{"role": "user", "content": PROMPT}]
    for text, responses in turns:
        messages.append({"role": "assistant", "content": text})
        messages += [{"role": "tool", "name": "lookup", "content": r} for r in responses]
    return EpisodeRecord(messages=messages, final_text=turns[-1][0])


def test_tool_stats_by_hand():
    records = [
        episode((call("joyate"), ["600"]), ("\\boxed{600}", [])),  # copied, answered
        episode((call("joyin"), ["512"]), ("\\boxed{600}", [])),  # wrong key, own answer
        episode(
            ('<tool_call>{"name": "lookup", "argu', []),
        ),  # malformed (cut off)
        episode(
            (call("nokey"), ["error: ValueError: no key 'nokey' in the table"]),
            (BAD_ARGUMENTS, ["error: bad arguments for lookup"]),
            ("\\boxed{1}", []),
        ),
        episode(("\\boxed{123}", [])),  # no call
    ]
    ctx = SimpleNamespace(cfg=SimpleNamespace(env=SimpleNamespace(tools=["lookup"])))
    stats = exp.tool_stats(ctx, [{"prompt": PROMPT}], [records])
    assert stats["episodes"] == 5
    assert stats["calling"] == 4 / 5 and stats["calls"] == 5 / 5  # 1 + 1 + 1 + 2
    assert stats["parsed"] == 4 / 5  # the cut-off call does not parse
    assert stats["valid"] == 3 / 4  # `k` is not lookup's argument
    assert stats["errors"] == 1 / 3  # nokey
    assert stats["key_copied"] == 1 / 3  # of the 3 valid lookup calls' keys: joyate
    assert stats["answer_from_tool"] == 1 / 2  # episodes with a result: 600 yes, 512 no
    empty = exp.tool_stats(ctx, [{"prompt": PROMPT}], [[episode(("\\boxed{1}", []))]])
    assert empty["calling"] == 0.0 and empty["parsed"] is None and empty["key_copied"] is None


@pytest.mark.slow
def test_quick_run_of_every_arm(tmp_path, capsys):
    from helpers_train import QUICK_RUNS

    out = tmp_path / "tool_use"
    assert exp.main(["--quick", "--out", str(out), *QUICK_RUNS]) == 0
    results = json.loads((out / "results.json").read_text())
    (runs,) = results["seeds"].values()
    assert list(runs) == ["SFT", "SFT → RL", "SFT (no tool)", "SFT → RL (no tool)"]
    base = results["base_model"]
    assert runs["SFT"]["runs"][0]["from"] == runs["SFT (no tool)"]["runs"][0]["from"] == base
    assert runs["SFT → RL"]["runs"][0]["from"] == runs["SFT"]["runs"][0]["to"]
    assert runs["SFT → RL (no tool)"]["runs"][0]["from"] == runs["SFT (no tool)"]["runs"][0]["to"]
    tool, direct = runs["SFT → RL"]["budget"], runs["SFT → RL (no tool)"]["budget"]
    assert tool["rl_completions"] == direct["rl_completions"] == 2 * 4  # equal samples
    assert runs["SFT"]["episodes"]["episodes"] == 8 * 32  # the tool arms' held-out episodes
    assert runs["SFT (no tool)"]["episodes"]["episodes"] == 0  # single-turn: no episodes
    assert set(results["base_unaided"]) == {"pass@1", "pass@8", "pass@32"}
    table = (out / "results.md").read_text()
    assert "| SFT → RL − SFT → RL (no tool) |" in table and "| key copied |" in table
    assert "answer = tool result |" in table and (out / "tool_use.png").is_file()

    # --merge: one report of the seeds two runs finished (here the run above, its seed renamed)
    other = tmp_path / "other"
    other.mkdir()
    renamed = dict(results, seeds={"7": runs}, command="the other run")
    (other / "results.json").write_text(json.dumps(renamed))
    merged = tmp_path / "merged"
    assert exp.main(["--merge", str(out), str(other), "--out", str(merged)]) == 0
    both = json.loads((merged / "results.json").read_text())
    (seed,) = results["seeds"]
    assert list(both["seeds"]) == [seed, "7"]
    assert [p["seeds"] for p in both["parts"]] == [[seed], ["7"]]
    assert set(both["summary"]["arms"]) == set(results["summary"]["arms"])
    page = (merged / "results.md").read_text()
    assert f"training seeds {seed}, 7" in page and "Run 2 (seeds 7): `the other run`" in page
    for dirs, says in (([out, out], "repeats seeds"), ([out, tmp_path / "nope"], "does not exist")):
        with pytest.raises(SystemExit) as stop:
            exp.main(["--merge", *map(str, dirs), "--out", str(tmp_path / "again")])
        assert stop.value.code == 2 and says in capsys.readouterr().err
