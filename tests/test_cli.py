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
GPU = str(ROOT / "configs" / "qwen_7b_rl_gpu_vllm.yaml")


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


def test_dry_run_plans_the_vllm_actor_as_vllm_sizes_it(capsys):
    from rlvr_jax import plan
    from rlvr_jax.config import load

    p = plan.make_plan(load(GPU))
    # Qwen2.5-7B on 4 GPUs, tensor-parallel 4: vLLM takes 0.9 × 80 GiB; bf16 weights
    # 7,615,616,512 × 2 B / 4; profile 8192 tokens × (2 × 18944 / 4 + 4 × 3584) × 2 B plus 256
    # sampled rows × 152064 / 4 × 4 B of logits; KV per token 2 × 28 layers × 1 KV head (4 / 4)
    # × 128 × 2 B = 14,336 B; tokens in whole blocks of 16
    weights = 7_615_616_512 * 2 / 4
    activations = 8192 * (2 * 18944 / 4 + 4 * 3584) * 2 + 256 * 152064 / 4 * 4
    kv = 0.9 * 80 * 2**30 - weights - activations
    assert p.actor_bytes == pytest.approx(
        {"params": weights, "activations": activations, "kv_cache": kv}
    )
    assert p.kv["tokens"] == int(kv // 14336) // 16 * 16 == 5_097_136
    assert p.kv["concurrent_at_max_length"] == 256  # max_slots: 5.1M tokens hold 553 × 9,216
    assert cli.train_main(["--config", GPU, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "rollout KV cache:  vLLM's, 5,097,136 tokens in blocks of 16" in out
    assert cli.train_main(["--config", GPU, "--dry-run", "mesh.device_memory_gib=0"]) == 0
    assert "vLLM's, sized at start-up: 0.9 of each GPU's memory" in capsys.readouterr().out


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
