"""Environments written for `openenv-core` (0.3) run unchanged (`env.name: openenv`):
`tests/openenv_spell.py` defines a multi-turn tool environment with the package's own classes
(`MCPEnvironment` with a FastMCP tool, typed `Action` / `Observation`, a `Rubric`). Checked: its
episode turn by turn (the first observation, a tool call and its result, feedback, the
rubric's reward), errors named, and `rlvr-train` RL steps whose every reward is the rubric's,
recomputed by hand. Skipped only where `openenv-core` is not installed (CI has it)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openenv.core")

import openenv_spell

from rlvr_jax.envs.openenv_env import OpenEnvEnv

KWARGS = dict(env="openenv_spell:SpellEnv", action="openenv_spell:SpellAction")
CALL = '<tool_call>{"name": "length", "arguments": {"word": "water"}}</tool_call>'


def test_an_episode_turn_by_turn_scored_by_its_rubric():
    env = OpenEnvEnv(**KWARGS)
    (tool,) = env.tools
    assert tool["function"]["name"] == "length" and env.action_field == "answer"
    assert tool["function"]["parameters"]["properties"] == {"word": {"type": "string"}}
    assert env.reset({"index": 1, "prompt": "Be brief."}) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Spell 'water' backwards."},
    ]
    step = env.step(CALL)
    assert step.observation == [{"role": "tool", "name": "length", "content": "5"}]
    assert step.info["tool_calls"] == 1 and not step.done and step.reward == 0.0
    step = env.step("waetr")  # wrong: feedback, scored 0.25 by the rubric, one more try
    assert step.observation == [{"role": "user", "content": "Not 'waetr'. Try again."}]
    assert step.reward == 0.25 and not step.done
    step = env.step(" retaw")
    assert step.done and step.observation is None and step.reward == 1.0
    env.close()


def test_errors_are_shown_or_named():
    env = OpenEnvEnv(**KWARGS)
    env.reset({"index": 0})
    step = env.step('<tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    assert step.observation[0]["content"].startswith("error:") and step.info["tool_errors"] == 1
    with pytest.raises(ValueError, match="has no field 'text'"):
        OpenEnvEnv(**KWARGS, action_field="text")
    with pytest.raises(ValueError, match="cannot import module"):
        OpenEnvEnv(env="no_such_module:Env")


@pytest.mark.slow
def test_rl_with_an_openenv_environment(tmp_path, monkeypatch):
    from helpers_train import tiny_run

    from rlvr_jax import cli
    from rlvr_jax.envs.verifiers_env import VERIFIER
    from rlvr_jax.training import rollouts
    from rlvr_jax.training.metrics import read_jsonl

    cfg = tiny_run(tmp_path)
    config = tmp_path / "policy" / "config.json"  # room for the turns (RoPE: no weights change)
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "max_position_embeddings": 512})
    )
    rows = tmp_path / "rows.jsonl"  # the prompts' text is not used: the env opens
    rows.write_text("".join(
        json.dumps({"prompt": "Answer.", "ground_truth": "", "verifier": VERIFIER}) + "\n"
        for _ in range(16)
    ))  # fmt: skip
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
        "env.name=openenv", f"env.kwargs={json.dumps(KWARGS)}", "env.max_turns=4",
        "rollout.stop_strings=[e, t, a, o, ' ']",  # a random policy's turns end early
    ]  # fmt: skip
    # the shapes of test_envs_train.py's runs (prompt 256 + completion 192 positions): their
    # compiled programs come from the persistent cache, whichever file runs first
    assert cli.train_main(args) == 0
    metrics = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["env/turns"] > 1 for m in metrics)
    episodes = 0
    for g in scored:
        word = openenv_spell.WORDS[g.row.index % len(openenv_spell.WORDS)]
        for c, reward in zip(g.completions, g.rewards_G):
            rec = c.episode
            if rec.truncated or rec.error:
                continue
            answers = [m["content"] for m in rec.messages if m["role"] == "assistant"]
            first = 0.25 if len(answers) == 2 and expected_partial(word, answers[0]) else 0.0
            assert reward == pytest.approx(first + openenv_spell.expected_reward(word, answers))
            episodes += 1
    ends = [(c.episode.truncated, c.episode.error) for g in scored for c in g.completions]
    assert episodes > 0, ends


def expected_partial(word: str, answer: str) -> bool:
    """A first answer the rubric scores 0.25 (right letters, wrong order)."""
    a = answer.strip().lower()
    return a != word[::-1] and sorted(a) == sorted(word)
