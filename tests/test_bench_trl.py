"""The TRL peer row of `rlvr-bench e2e`: clear reasons without TRL, a real run with it."""

import importlib.util
from pathlib import Path

import pytest

from rlvr_jax.bench import e2e

ROOT = Path(__file__).resolve().parents[1]


def pretend_trl(monkeypatch, spec):
    """`importlib.util.find_spec("trl")` answers `spec`; every other name as usual."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: spec if name == "trl" else find_spec(name, *a)
    )


def test_without_trl_the_row_is_skipped(monkeypatch, tmp_path):
    pretend_trl(monkeypatch, None)
    row = e2e.trl_peer(e2e.DEFAULT_CONFIG, [], steps=1, warmup=0, out=tmp_path)
    assert row == {
        "status": "skipped",
        "reason": "trl is not installed (pip install trl to add it)",
    }


def test_a_failing_peer_is_reported_not_raised(monkeypatch, tmp_path):
    def boom(cfg, **kwargs):
        raise RuntimeError("generate exploded")

    pretend_trl(monkeypatch, object())
    monkeypatch.setattr("rlvr_jax.bench.trl_peer.run_trl", boom)
    monkeypatch.chdir(ROOT)
    row = e2e.trl_peer(e2e.DEFAULT_CONFIG, [], steps=1, warmup=0, out=tmp_path)
    assert row == {"status": "failed", "reason": "RuntimeError: generate exploded"}


@pytest.mark.slow
def test_quick_setup_trains_with_trl(monkeypatch, tmp_path):
    pytest.importorskip("trl", reason="trl is an optional peer (pip install -e .[trl])")
    monkeypatch.chdir(ROOT)  # the demo config's data paths are relative to the repository
    overrides = [*e2e._QUICK, f"model.path={tmp_path / 'policy'}"]
    row = e2e.trl_peer(e2e.DEFAULT_CONFIG, overrides, steps=1, warmup=1, out=tmp_path)
    assert row["status"] == "ok", row
    assert row["steps_per_s"] > 0 and row["steps"] == 1 and row["warmup"] == 1
    # --quick: 2 prompts × 4 samples of 8 tokens in one optimizer step
    assert row["config"]["per_device_train_batch_size"] == 8
    assert row["config"]["num_generations"] == 4
    assert row["config"]["max_completion_length"] == 8
    assert 0.0 <= row["reward_mean"] <= 1.0
