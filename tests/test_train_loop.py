"""`rlvr-train` end to end on a tiny random policy: sync and async modes, metrics with the
DESIGN.md keys, checkpoints, automatic resume, HF export, and exactly-once metrics after a
SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_train import tiny_run

from rlvr_jax import cli
from rlvr_jax.training.metrics import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
DESIGN_KEYS = (
    "step",
    "loss",
    "reward/mean",
    "reward/parity",
    "response_length/mean",
    "clip_fraction",
    "tis/mean",
    "kl/sampler_learner",
    "staleness/mean",
    "groups/filtered_fraction",
    "groups/fill_rate",
    "throughput/tokens_per_s",
    "time/rollout_s",
    "time/train_s",
)


def steps_of(out: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(out / "metrics.jsonl")]


@pytest.mark.smoke("training")
def test_one_step_end_to_end(tmp_path):
    """`rlvr-train` at the tiniest size: one synchronous step (two prompts, four samples of at
    most four tokens), scored, filtered, trained on and logged; no evaluation, plots or export."""
    cfg = tiny_run(tmp_path)
    overrides = ["train.max_steps=1", "rollout.max_new_tokens=4", "log.tensorboard=false"]
    overrides += ["log.plots=false", "checkpoint.every_steps=0", "checkpoint.export_hf=false"]
    assert cli.train_main(["--config", str(cfg), *overrides]) == 0
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and rows[0]["policy_version"] == 1
    for key in DESIGN_KEYS:
        assert key in rows[0], key


@pytest.mark.slow
def test_sync_run_then_resume_continues(tmp_path):
    cfg = tiny_run(tmp_path)
    out = tmp_path / "out"
    args = ["--config", str(cfg), "train.max_steps=2", "eval.every_steps=2", "log.plots=true"]
    assert cli.train_main(args) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert 0.0 <= rows[1]["eval/pass@1"] <= rows[1]["eval/pass@4"] <= 1.0  # held-out eval
    for key in DESIGN_KEYS:
        assert key in rows[-1], key
    assert rows[-1]["staleness/mean"] == 0.0  # sync: trained on the current policy
    assert rows[-1]["policy_version"] == 2
    # the paged engine's KV metrics reach the trainer's metrics
    assert 0.0 < rows[-1]["rollout/kv_utilisation"] <= 1.0
    assert rows[-1]["rollout/preemptions"] >= 0 and rows[-1]["rollout/recomputed_tokens"] >= 0
    assert rows[-1]["rollout/kv_pages_in_use"] >= 0
    assert (out / "final" / "config.json").is_file() and (
        out / "final" / "tokenizer.json"
    ).is_file()
    assert (out / "curves.png").is_file()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["2"]

    # same command, more steps: resumes from the checkpoint at step 2
    assert cli.train_main(["--config", str(cfg), "train.max_steps=4"]) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["policy_version"] == 4
    # the exported policy loads in transformers unchanged
    transformers = pytest.importorskip("transformers")
    transformers.AutoModelForCausalLM.from_pretrained(out / "final")


@pytest.mark.slow
def test_async_sigkill_then_rerun_has_every_step_once(tmp_path):
    cfg = tiny_run(tmp_path)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "rlvr_jax.cli",
        "--config",
        str(cfg),
        "rollout.mode=async",
        "train.max_steps=7",
        "checkpoint.every_steps=2",
    ]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        # past the checkpoint at step 2 (written asynchronously: wait for it), mid-run
        if len(steps_of(out)) >= 3 and (out / "checkpoints" / "2").is_dir():
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (out / "checkpoints" / "2").is_dir()

    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert steps_of(out) == [1, 2, 3, 4, 5, 6, 7]
    last = read_jsonl(out / "metrics.jsonl")[-1]
    assert last["policy_version"] >= 6 and last["staleness/mean"] <= 1.0


@pytest.mark.slow
def test_missing_model_is_a_named_error(tmp_path, capsys):
    cfg = tiny_run(tmp_path)
    meta = json.loads((tmp_path / "policy" / "config.json").read_text())
    assert meta["model_type"] == "qwen2"
    assert cli.train_main(["--config", str(cfg), "model.path=/nonexistent/policy"]) == 2
    assert "/nonexistent/policy" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("ahead", [True, False])
def test_every_packed_row_count_is_compiled_with_the_first_batch(tmp_path, caplog, ahead):
    """`train.compile_ahead`: the first batch's `compile` also compiles the step for every
    other row count its packed groups may take (`Batch.row_counts`), so a later batch of
    another count compiles no `step`; off, that batch compiles it when it comes."""
    import dataclasses

    import jax
    import numpy as np

    from rlvr_jax import config
    from rlvr_jax.training.loop import Trainer

    overrides = ["train.max_steps=1", "log.progress_bar=false", f"train.compile_ahead={ahead}"]
    cfg = config.load(tiny_run(tmp_path), overrides)
    trainer = Trainer(cfg)
    try:
        trainer.source.start()
        batch = trainer.source.next(trainer.version)
        assert batch.row_counts == ((1, 2) if ahead else ())  # 2 groups: 1 or 2 packed rows
        trainer.update.compile(trainer.state, batch)
        tokens = batch.arrays.tokens
        other = 3 - tokens.mask_BxT.shape[0]
        rows = jax.tree.map(lambda a: np.zeros((other, *a.shape[1:]), a.dtype), tokens)
        later = dataclasses.replace(batch, arrays=batch.arrays.replace(tokens=rows))
        with jax.log_compiles(), caplog.at_level("WARNING"):
            state, metrics, _ = trainer.update.update(trainer.state, later)
            jax.block_until_ready((state, metrics))
        trainer.state = state
        compiled = [
            r.getMessage() for r in caplog.records if "Compiling jit(step)" in r.getMessage()
        ]
        assert bool(compiled) != ahead, compiled
    finally:
        trainer.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [[], ["loss.advantage=gae"], ["train.updates_per_batch=2", "loss.kl_coef=0.05"]],
    ids=["grpo", "ppo", "two-updates-kl"],
)
def test_train_step_is_compiled_before_the_dispatch_lock_is_taken(tmp_path, caplog, extra):
    # a compile under rlvr_jax.dispatch.LOCK would stall the rollout thread: `compile` runs the
    # update itself on abstract arrays, so the step for a batch's length bucket (and PPO's
    # values + GAE, the old and reference log-probs, each mini-batch) is compiled ahead and the
    # update compiles no `step` (nor `prepare`, nor the log-probs' `fn`)
    import jax

    from rlvr_jax import config
    from rlvr_jax.training.loop import Trainer

    overrides = ["train.max_steps=1", "log.progress_bar=false", *extra]
    cfg = config.load(tiny_run(tmp_path), overrides)
    trainer = Trainer(cfg)
    try:
        trainer.source.start()
        batch = trainer.source.next(trainer.version)
        trainer.update.compile(trainer.state, batch)
        with jax.log_compiles(), caplog.at_level("WARNING"):
            state, metrics, n = trainer.update.update(trainer.state, batch)
            jax.block_until_ready((state, metrics))
            jax.jit(lambda x: x * 3.25)(1.0)  # a compile that is logged: the capture works
        trainer.state = state
        assert n == cfg.train.updates_per_batch == len(metrics)
        compiled = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
        assert any("jit(<lambda>)" in m for m in compiled), compiled
        ahead = ("jit(step)", "jit(prepare)", "jit(fn)")
        assert not [m for m in compiled if any(name in m for name in ahead)], compiled
        if "loss.advantage=gae" in extra:  # PPO: the critic's metrics come with the step's
            assert "value/explained_variance" in metrics[0]
    finally:
        trainer.close()
