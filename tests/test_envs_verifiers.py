"""Environments written for the `verifiers` package (0.4) run unchanged (`env.name: verifiers`):
`tests/vf_guess.py` defines a multi-turn tool environment with the package's own classes
(`vf.Taskset`, `vf.Task` with weighted `@vf.reward`s, a `vf.Toolset` with a `@vf.tool`, a
`vf.Env` whose `run` drives `interaction.turn`). Checked: its episode turn by turn (the
prompt, a tool call and its result, the env's user turns, the rubric's reward), a tool error,
an episode a limit ends, the rows command, and `rlvr-train` RL steps whose every reward is the
rubric's, recomputed by hand. Skipped only where `verifiers` is not installed (CI has it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

import vf_guess

from rlvr_jax.envs.verifiers_env import VERIFIER, VerifiersEnv, task_rows

CALL = '<tool_call>{"name": "hints_letter", "arguments": {"i": %d}}</tool_call>'


def test_an_episode_turn_by_turn_scored_by_its_rubric():
    env = VerifiersEnv("vf_guess")
    (schema,) = env.tools
    assert schema["function"]["name"] == "hints_letter"
    assert schema["function"]["parameters"]["properties"]["i"]["type"] == "integer"
    assert env.reset({"index": 0}) == [
        {"role": "system", "content": "Answer with one word."},
        {"role": "user", "content": "Guess my 5-letter word."},
    ]
    step = env.step("Let me look. " + CALL % 0)  # a tool call: its result comes back
    assert step.observation == [{"role": "tool", "name": "hints_letter", "content": "a"}]
    assert not step.done and step.info["tool_calls"] == 1 and step.info["tool_errors"] == 0
    step = env.step("banana")  # a wrong guess: the env's user turn (a hint)
    assert step.observation == [{"role": "user", "content": "No. It starts with 'a'."}]
    assert step.info["tool_calls"] == 0
    step = env.step("apple")  # right: the exchange ends, scored by the rubric
    assert step.done and step.observation is None
    assert step.reward == pytest.approx(vf_guess.expected_reward("apple", "apple", 1))
    assert step.reward == pytest.approx(1.0 + 0.5 - 0.1)


def test_a_tool_error_is_shown_and_a_closed_episode_stops():
    env = VerifiersEnv({"id": "vf_guess"})
    env.reset({"index": 2})  # water
    step = env.step(CALL % 9)
    assert step.observation[0]["content"].startswith("error: IndexError")
    assert step.info["tool_errors"] == 1
    step = env.step('<tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    assert "no tool named 'nope'" in step.observation[0]["content"]
    env.close()  # a limit ended the episode: its coroutine stops, nothing is left waiting
    env.close()
    with pytest.raises(ValueError, match="past the end"):
        VerifiersEnv("vf_guess").reset({"index": 99})


@pytest.mark.slow  # a fresh interpreter importing verifiers: 10-20 s
def test_rows_command(tmp_path):
    out = tmp_path / "rows.jsonl"
    subprocess.run(
        [sys.executable, "-m", "rlvr_jax.envs.verifiers_env", "--taskset", "vf_guess",
         "--out", str(out), "--limit", "4"],
        check=True, cwd=Path(__file__).parent, capture_output=True,
    )  # fmt: skip
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 4 and {r["verifier"] for r in rows} == {VERIFIER}
    assert rows[1]["prompt"] == "Guess my 5-letter word." and rows[1]["domain"] == "vf_guess"


@pytest.mark.slow
def test_rl_with_a_verifiers_environment(tmp_path, monkeypatch):
    from helpers_train import tiny_run

    from rlvr_jax import cli
    from rlvr_jax.training import rollouts
    from rlvr_jax.training.metrics import read_jsonl

    cfg = tiny_run(tmp_path)
    config = tmp_path / "policy" / "config.json"  # room for the turns (RoPE: no weights change)
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "max_position_embeddings": 512})
    )
    rows = tmp_path / "vf_rows.jsonl"  # one row per task, in order
    rows.write_text("".join(json.dumps(r) + "\n" for r in task_rows("vf_guess", 100)))
    scored = []
    real = rollouts.score_groups

    def capture(groups, *args, **kwargs):
        out = real(groups, *args, **kwargs)
        scored.extend(out[0])
        return out

    monkeypatch.setattr(rollouts, "score_groups", capture)
    args = [
        "--config", str(cfg), "train.max_steps=2", "rollout.max_new_tokens=192",
        f"data.sources=[{{path: {rows}}}]", "data.max_prompt_len=256",
        "env.name=verifiers", "env.kwargs={taskset: vf_guess}", "env.max_turns=4",
        "rollout.stop_strings=[e, t, a, o, ' ']",  # a random policy's turns end early
    ]  # fmt: skip
    # the shapes of test_envs_train.py's runs (prompt 256 + completion 192 positions): their
    # compiled programs come from the persistent cache, whichever file runs first
    assert cli.train_main(args) == 0
    metrics = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["env/turns"] > 1 for m in metrics)
    episodes = 0
    for g in scored:
        secret = vf_guess.SECRETS[g.row.index]  # the row's task
        for c, reward in zip(g.completions, g.rewards_G):
            rec = c.episode
            if rec.truncated or rec.error:  # a limit ended it: no rubric (reward 0)
                assert reward == 0.0
                continue
            hints = sum(m["role"] == "user" for m in rec.messages) - 1
            assert reward == pytest.approx(vf_guess.expected_reward(secret, rec.final_text, hints))
            episodes += 1
    ends = [(c.episode.truncated, c.episode.error) for g in scored for c in g.completions]
    assert episodes > 0, ends
