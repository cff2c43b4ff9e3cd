"""`rlvr_jax.training.export` and `rlvr-export` without a run: what a checkpoint directory is,
and the errors that say what to give instead (the round trip of a real checkpoint is in
test_cli_subprocess.py and, with LoRA, test_lora_train.py)."""

import pytest

from rlvr_jax.cli import export_main
from rlvr_jax.training.export import (
    checkpoint_config,
    is_checkpoint,
    policy_directory,
    run_config_path,
    write_run_config,
)


def checkpoint(tmp_path, step=3):
    path = tmp_path / "run" / "checkpoints" / str(step)
    (path / "state").mkdir(parents=True)
    return path


def test_what_a_checkpoint_directory_is(tmp_path):
    ckpt = checkpoint(tmp_path)
    assert is_checkpoint(ckpt) and run_config_path(ckpt) == tmp_path / "run" / "run_config.yaml"
    assert not is_checkpoint(tmp_path / "run")  # a run directory
    assert not is_checkpoint(tmp_path / "run" / "checkpoints")
    (tmp_path / "final").mkdir()
    with policy_directory(str(tmp_path / "final"), "c.yaml") as found:  # an HF directory
        assert found == (str(tmp_path / "final"), "c.yaml")


def test_the_run_config_round_trips(tmp_path):
    from rlvr_jax.config import load

    cfg = load(None, [f"model.path={tmp_path / 'base'}", "model.lora.rank=4", "seed=7"])
    ckpt = checkpoint(tmp_path)
    write_run_config(cfg, tmp_path / "run")
    assert checkpoint_config(ckpt) == cfg


def test_errors_name_what_to_give(tmp_path, capsys):
    ckpt = checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"run_config.yaml is missing: pass --config"):
        checkpoint_config(ckpt)
    assert export_main([str(tmp_path / "run"), str(tmp_path / "out")]) == 2
    assert "is not a training checkpoint (<train.output_dir>/checkpoints/<step>" in (
        capsys.readouterr().err
    )
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("kept")
    assert export_main([str(ckpt), str(tmp_path / "full")]) == 2
    assert "exists and is not an empty directory" in capsys.readouterr().err
    assert (tmp_path / "full" / "x").read_text() == "kept"
