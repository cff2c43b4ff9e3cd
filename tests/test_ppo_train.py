"""`rlvr-train ... loss.advantage=gae` end to end on the tiny setup: PPO with a separate critic
in sync mode resumes exactly (the critic and its optimizer are in the checkpoint), a shared
critic in async mode on packed batches, and named config errors (compile-ahead:
tests/test_train_loop.py)."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_train import tiny_run

from rlvr_jax import cli
from rlvr_jax.training.metrics import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
RLVR_TRAIN = str(Path(sys.executable).parent / "rlvr-train")
VALUE_KEYS = (
    "value/loss",
    "value/explained_variance",
    "value/mean",
    "value/return_mean",
    "value/clip_fraction",
    "value/grad_norm",
    "policy_loss",
)


def rlvr_train(cfg: Path, *overrides: str) -> None:
    """The installed console script in a fresh process (the verifier lives in tests/)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
    cmd = [RLVR_TRAIN, "--config", str(cfg), "log.progress_bar=false", *overrides]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_ppo_sync_run_resumes_exactly(tmp_path):
    cfg = tiny_run(tmp_path)
    ppo = ["loss.advantage=gae", "critic.kind=separate", "checkpoint.every_steps=2"]
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    rlvr_train(cfg, *ppo, "train.max_steps=2", f"train.output_dir={resumed}")
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == ["2"]
    rlvr_train(cfg, *ppo, "train.max_steps=3", f"train.output_dir={resumed}")
    rlvr_train(cfg, *ppo, "train.max_steps=3", f"train.output_dir={straight}")
    a, b = read_jsonl(resumed / "metrics.jsonl"), read_jsonl(straight / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    for key in VALUE_KEYS:
        assert math.isfinite(a[-1][key]), key
    # step 3 after the restart sees the critic (and its Adam moments) the straight run had
    assert a[-1]["value/mean"] != 0.0
    for key in ("reward/mean", "loss", "value/loss", "value/mean", "value/explained_variance"):
        assert a[-1][key] == pytest.approx(b[-1][key], rel=1e-5, abs=1e-7), key


@pytest.mark.slow
def test_ppo_async_with_a_shared_critic(tmp_path):
    cfg = tiny_run(tmp_path)
    rlvr_train(
        cfg,
        "loss.preset=ppo",
        "critic.kind=shared",
        "rollout.mode=async",
        "train.max_steps=3",
        "train.updates_per_batch=2",
        "train.max_tokens_per_micro_batch=256",  # packed rows, micro-batches by tokens
    )
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["policy_version"] == 6  # two PPO updates per batch
    for key in VALUE_KEYS:
        assert math.isfinite(rows[-1][key]), key
    assert rows[-1]["staleness/mean"] <= 1.0
    assert (tmp_path / "out" / "final" / "config.json").is_file()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["critic.lam=1.5"], "critic.lam must be in [0, 1], got 1.5"),
        (["critic.value_coef=0"], "critic.value_coef must be > 0"),
        (["algorithm=rl_sft_parallel"], "works with algorithm: rl, not rl_sft_parallel"),
        (["critic.path=/nonexistent/critic"], "/nonexistent/critic"),
    ],
)
@pytest.mark.slow
def test_bad_critic_settings_are_named_errors(tmp_path, capsys, overrides, message):
    cfg = tiny_run(tmp_path)
    args = ["--config", str(cfg), "loss.advantage=gae", "sft.batch_size=2", *overrides]
    assert cli.train_main(args) == 2
    assert message in capsys.readouterr().err
