"""The console entry points, run for real (in-process and as installed scripts)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_jax import cli

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "configs" / "demo.yaml")
TPU = str(ROOT / "configs" / "olmo3_7b_think_rl_tpu.yaml")


def test_dry_run_prints_config_and_plan(capsys):
    assert cli.train_main(["--config", DEMO, "--dry-run", "train.max_steps=3"]) == 0
    out = capsys.readouterr().out
    assert "max_steps: 3" in out
    assert "parameters:" in out and "learner sub-mesh:" in out and "peak per device" in out


def test_dry_run_real_scale_config_reports_fit(capsys):
    assert cli.train_main(["--config", TPU, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "architecture:      olmo3" in out
    # OLMo-3-7B: 7.3 B parameters
    line = next(x for x in out.splitlines() if x.startswith("parameters:"))
    n = int(line.split()[1].replace(",", ""))
    assert 7.0e9 < n < 7.6e9
    assert "learner sub-mesh:  16 devices" in out and "actor sub-mesh:    48 devices" in out
    # fp32 params FSDP-sharded 16 ways: 7,298,011,136 × 4 B / 16 = 1.701 GiB per device
    assert "learner params           1.701 GiB" in out
    assert "fits in 95 GiB per device: yes" in out  # with remat + chunked attention/logits


def test_unknown_key_exits_nonzero_naming_it(capsys):
    assert cli.train_main(["--config", DEMO, "--dry-run", "train.max_stepz=3"]) == 2
    err = capsys.readouterr().err
    assert "train.max_stepz" in err and "train.max_steps" in err and "demo.yaml" in err


def test_impossible_mesh_is_a_named_error(capsys):
    code = cli.train_main(["--config", DEMO, "--dry-run", "mesh.learner={data: 3, fsdp: -1}"])
    assert code == 2
    assert "do not divide" in capsys.readouterr().err


def test_describe_lists_keys(capsys):
    assert cli.train_main(["--describe"]) == 0
    out = capsys.readouterr().out
    assert "rollout.max_staleness" in out and "loss.preset" in out


def test_bench_help_and_unknown(capsys):
    assert cli.bench_main(["--help"]) == 0
    assert "losses" in capsys.readouterr().out
    assert cli.bench_main(["nope"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err


@pytest.mark.slow
def test_installed_console_script_dry_run():
    exe = shutil.which("rlvr-train", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "rlvr_jax.cli"]
    ok = subprocess.run([*cmd, "--config", DEMO, "--dry-run"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*cmd, "--config", DEMO, "bogus=1"], capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown key 'bogus'" in bad.stderr
