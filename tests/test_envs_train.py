"""`rlvr-train` RL with a tool environment, sync and async, on a tiny random policy: the
turns run inside the engine's slots (tool calls executed, responses appended and masked),
`env/*` metrics are written, samples.jsonl shows whole conversations, and the held-out
evaluation runs the same episodes. A random policy never writes a tool call, so the
environment here is `ToolEnv` (python + calculator) with its first turn's call scripted —
everything after the model's text is the real path."""

from __future__ import annotations

import json

import pytest
from helpers_train import tiny_run

from rlvr_jax import cli
from rlvr_jax.envs import Step, ToolEnv
from rlvr_jax.training.metrics import read_jsonl

CALLS = (
    '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
    '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
    '<tool_call>{"name": "calculator", "arguments": {"expression": "6 / 0"}}</tool_call>'
)


class ScriptedToolEnv(ToolEnv):
    """`ToolEnv` whose first assistant turn is taken to be `CALLS`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.turn = 0

    def step(self, assistant_text: str) -> Step:
        self.turn += 1
        return super().step(CALLS if self.turn == 1 else assistant_text)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_rl_with_tools_in_the_engine(tmp_path, mode):
    cfg = tiny_run(tmp_path)
    # room for the tools' system prompt in the tiny tokenizer (RoPE: no weights change)
    config = tmp_path / "policy" / "config.json"
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "max_position_embeddings": 512})
    )
    out = tmp_path / "out"
    overrides = [
        f"rollout.mode={mode}",
        "train.max_steps=2",
        "rollout.max_new_tokens=192",
        "data.max_prompt_len=256",
        "env.name=test_envs_train:ScriptedToolEnv",
        "env.kwargs={tools: [python, calculator], timeout_s: 20.0}",
        "env.max_turns=3",
        # frequent single-token stops: a random policy's turns end before the budget
        "rollout.stop_strings=[e, t, a, o, ' ']",
        "eval.every_steps=2",
        "eval.max_prompts=2",
        *(["train.max_tokens_per_micro_batch=1024"] if mode == "async" else []),  # packed
    ]
    assert cli.train_main(["--config", str(cfg), *overrides]) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    tools_ran = [r for r in rows if r["env/tool_calls"] > 0]
    assert tools_ran, "no episode reached its scripted tool calls"
    for r in tools_ran:
        assert r["env/turns"] > 1.0 and r["env/tool_errors"] >= 1  # the division by zero
        assert r["env/tool_latency_s"] > 0.0 and 0.0 <= r["env/truncated_episodes"] <= 1.0
        assert r["env/parked_slots"] >= 0.0 and r["env/failed_episodes"] == 0.0
    assert 0.0 <= rows[-1]["eval/pass@1"] <= 1.0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert all(s["prompt"].startswith("<|im_start|>system\n<tools>\n") for s in samples)
    texts = [s["completion"] for s in samples]  # the whole conversation after the prompt
    assert any("<tool_response>\n42\n</tool_response>" in t for t in texts)
    assert any("error: ZeroDivisionError" in t for t in texts)
