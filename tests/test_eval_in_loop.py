"""The in-loop evaluation samples through the trainer's own actor rollout (issue 20): the
same pass@k as `rlvr-eval` for one checkpoint and seed, the config's stop strings applied,
and its completions decoded on the actor sub-mesh."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import pytest
from helpers_train import tiny_run

from rlvr_jax import cli
from rlvr_jax.data import synthetic
from rlvr_jax.training.metrics import read_jsonl

TESTS = Path(__file__).parent


def parity_eval_rows(tmp_path: Path) -> None:
    """Held-out rows scored by `helpers_train:word_parity` (a random policy gets about half
    right, so pass@k is neither 0 nor 1)."""
    rows = synthetic.generate("test", 8, seed=0)
    rows = [{**r, "verifier": "helpers_train:word_parity", "domain": "parity"} for r in rows]
    synthetic.write_jsonl(rows, tmp_path / "test.jsonl")


@pytest.mark.slow
def test_in_loop_pass_at_k_equals_rlvr_eval(tmp_path, monkeypatch):
    from rlvr_jax.eval.cli import main as eval_main

    monkeypatch.syspath_prepend(str(TESTS))
    cfg = tiny_run(tmp_path)
    parity_eval_rows(tmp_path)
    overrides = ["train.max_steps=2", "eval.every_steps=2", "eval.seed=77"]
    assert cli.train_main(["--config", str(cfg), *overrides]) == 0
    row = read_jsonl(tmp_path / "out" / "metrics.jsonl")[-1]
    assert row["step"] == 2 and row["policy_version"] == 2
    assert 0.0 < row["eval/pass@1"] < 1.0, row["eval/pass@1"]

    report = tmp_path / "eval.json"
    argv = ["--config", str(cfg), "--model", str(tmp_path / "out" / "final"), "--seed", "77"]
    argv += ["--ks", "1", "4", "--samples", "4", "--max-prompts", "4", "--json", str(report)]
    assert eval_main(argv) == 0
    j = json.loads(report.read_text())
    assert j["pass@k"]["1"] == pytest.approx(row["eval/pass@1"], abs=1e-12)
    assert j["pass@k"]["4"] == pytest.approx(row["eval/pass@4"], abs=1e-12)
    assert j["generated_tokens"] == row["eval/generated_tokens"]


class Recording:
    """The tokenizer, keeping the token ids of every completion it decodes."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decoded = tokenizer, []

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def decode(self, ids, **kwargs):
        self.decoded.append(list(ids))
        return self.tokenizer.decode(ids, **kwargs)


@pytest.mark.slow
def test_stop_strings_apply_in_evaluation(tmp_path, monkeypatch):
    from rlvr_jax import models
    from rlvr_jax.config import load
    from rlvr_jax.data import load_tokenizer
    from rlvr_jax.eval.evaluate import evaluate_policy
    from rlvr_jax.rewards import RewardService

    monkeypatch.syspath_prepend(str(TESTS))
    cfg_path = tiny_run(tmp_path)
    parity_eval_rows(tmp_path)
    model = models.load_pretrained(tmp_path / "policy")
    tokenizer = load_tokenizer(tmp_path / "policy")

    def completions(stop_strings: list[str]) -> list[list[int]]:
        cfg = load(str(cfg_path), [f"rollout.stop_strings={json.dumps(stop_strings)}"])
        recording = Recording(tokenizer)
        with RewardService(cfg.rewards) as service:
            evaluate_policy(model, recording, cfg, reward_service=service, prefix="")
        return recording.decoded

    free = completions([])
    # the commonest token the policy writes inside a completion that is one token as text
    inside = [t for c in free for t in c[:-1]]
    stop = next(
        t
        for t in sorted(set(inside), key=inside.count, reverse=True)
        if tokenizer.encode(tokenizer.decode([t]), add_special_tokens=False) == [t]
    )
    stopped = completions([tokenizer.decode([stop])])
    assert len(stopped) == len(free) == 4 * 4
    for before, after in zip(free, stopped):  # the same sample, ended at the stop token
        assert after == (before[: before.index(stop) + 1] if stop in before else before)
    assert sum(len(a) < len(b) for a, b in zip(stopped, free)) > 0


@pytest.mark.slow
def test_evaluation_runs_on_the_actor_sub_mesh(tmp_path, monkeypatch):
    from rlvr_jax.config import load
    from rlvr_jax.training.loop import Trainer

    if jax.device_count() < 8:
        pytest.skip("needs the 8 simulated devices of tests/conftest.py")
    monkeypatch.syspath_prepend(str(TESTS))
    cfg_path = tiny_run(tmp_path)
    parity_eval_rows(tmp_path)
    mesh = "{num_devices: 8, actor_devices: 4, learner: {fsdp: -1}, actor: {data: -1}}"
    cfg = load(str(cfg_path), [f"mesh={mesh}", "train.max_steps=1"])
    trainer = Trainer(cfg)
    try:
        trainer.run()
        stream = trainer.source.rollouts.stream
        core = stream.scheduler.core
        actor = set(jax.devices()[4:])
        assert set(core.spec.mesh.devices.flat) == actor
        assert all(leaf.sharding.device_set == actor for leaf in jax.tree.leaves(core.params))
        learner = {d for x in jax.tree.leaves(trainer.state.params) for d in x.sharding.device_set}
        assert learner == set(jax.devices()[:4])
        before = stream.scheduler.stats.tokens
        metrics = trainer.evaluate()
        assert metrics["eval/generated_tokens"] > 0
        # every evaluation token was decoded by the actor engine, with the trained version
        assert stream.scheduler.stats.tokens - before == metrics["eval/generated_tokens"]
        assert stream.version == trainer.version == 1
    finally:
        trainer.close()
