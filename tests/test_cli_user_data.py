"""A user's own data, model limits and modules through the installed `rlvr-train`: a JSONL of
`{"question", "answer"}` rows with GSM8K's `#### N` answers trains through
`data.sources[].fields` / `verifier` / `answer_transform`; a run that keeps no group says why at
each step and after three in a row, and samples.jsonl shows what happened; a prompt budget over
the model's context and a `module:function` tool that cannot be imported fail at load (exit 2,
the keys named, nothing started)."""

from __future__ import annotations

import json
from pathlib import Path

import helpers_cli as C
import pytest
from helpers_train import build_policy

pytestmark = pytest.mark.slow


def gsm8k_run(tmp_path: Path) -> Path:
    """Question/answer rows whose answers (seven-digit, written with commas) a random policy
    never produces: every group's rewards are all 0."""
    rows = [
        {
            "question": f"Sam has {a} apples and buys {a + 1} more. How many now?",
            "answer": f"Sam has {a} + {a + 1} apples.\n#### {1_234_567 + a:,}",
        }
        for a in range(16)
    ]
    (tmp_path / "gsm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_policy(tmp_path / "policy", [r["question"] for r in rows] + [r["answer"] for r in rows])
    cfg = tmp_path / "gsm.yaml"
    cfg.write_text(
        f"""# rlvr-train --config {cfg}
model: {{path: {tmp_path / "policy"}}}
mesh: {{num_devices: 1, actor_devices: 0}}
data:
  sources:
    - path: {tmp_path / "gsm.jsonl"}
      fields: {{prompt: question, ground_truth: answer}}
      verifier: math
      answer_transform: gsm8k
  max_prompt_len: 96
rollout: {{mode: sync, num_samples: 4, max_new_tokens: 8, max_slots: 16, decode_chunk: 4}}
loss: {{preset: olmo3}}
filter: {{max_draws: 2}}
rewards: {{workers: 1}}
train: {{max_steps: 3, output_dir: {tmp_path / "out"}, prompts_per_batch: 2}}
log: {{progress_bar: false, tensorboard: false, plots: false, sample_completions: 5}}
"""
    )
    return cfg


def test_a_question_answer_file_trains_and_a_step_that_keeps_nothing_says_why(tmp_path):
    cfg = gsm8k_run(tmp_path)
    proc = C.Proc("rlvr-train", ["--config", str(cfg)], tmp_path)
    assert proc.wait(900) == 0, proc.stderr()[-3000:]
    out = tmp_path / "out"
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["groups/kept"] == 0 and m["reward/mean"] == 0.0 for m in metrics)
    err = proc.stderr()
    for step in (1, 2, 3):  # each step: why (4 groups drawn: prompts_per_batch × max_draws)
        assert f"step {step} trained nothing: kept 0 of 4 groups; 4 had all-equal rewards " in err
    assert "(4 all 0)" in err and "of completions cut at rollout.max_new_tokens=8" in err
    assert err.count("3 steps in a row trained nothing") == 1, err[-3000:]

    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1] * 5 + [2] * 5 + [3] * 5  # log.sample_completions
    truths = {f"{1_234_567 + a}" for a in range(16)}  # the gsm8k transform's, no commas
    for s in samples:
        assert "apples" in s["prompt"] and isinstance(s["completion"], str)
        assert s["ground_truth"] in truths and s["verifier"] == "math"
        assert s["reward"] == 0.0 and s["verifier_score"] == 0.0 and s["group"] == "filtered"
        assert s["finish_reason"] in ("stop", "length")
    first = samples[:5]  # one completion of each of the 4 groups, then a second of the first
    assert len({s["prompt"] for s in first[:4]}) == 4 and first[4]["prompt"] == first[0]["prompt"]


def test_limits_and_modules_fail_at_load_naming_the_keys(tmp_path):
    cfg = gsm8k_run(tmp_path)
    out = tmp_path / "out"
    proc = C.Proc("rlvr-train", ["--config", str(cfg), "data.max_prompt_len=250"], tmp_path)
    assert proc.wait(300) == 2, proc.stderr()[-3000:]
    assert (
        "data.max_prompt_len=250 + rollout.max_new_tokens=8 = 258 positions exceed the model's "
        "max_position_embeddings=256" in proc.stderr()
    )
    tools = ["env.name=tools", "env.tools=[calculator, 'mytools:add']"]
    proc = C.Proc("rlvr-train", ["--config", str(cfg), *tools], tmp_path)
    assert proc.wait(300) == 2, proc.stderr()[-3000:]
    assert "env.tools[1]: cannot import module 'mytools'" in proc.stderr()
    assert f"the module must be in the working directory ({tmp_path})" in proc.stderr()
    assert not out.exists()  # refused before the trainer started
