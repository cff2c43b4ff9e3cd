"""Two local processes (4 simulated CPU devices each) run learner steps on a fixed batch over
one mesh spanning both, move the params to an actor sub-mesh on the other process's devices,
and agree with a single-process run on 8 devices."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers_cli import xla_flags

WORKER = Path(__file__).with_name("multihost_worker.py")
ROOT = WORKER.parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(pid: int, nproc: int, port: int, out: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the worker sets them
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(pid), str(nproc), str(port), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_two_processes_agree_with_one(tmp_path):
    ref = tmp_path / "single.npz"
    single = launch(0, 1, free_port(), ref)
    out, _ = single.communicate(timeout=600)
    assert single.returncode == 0, out

    port = free_port()
    two = tmp_path / "two.npz"
    procs = [launch(i, 2, port, two) for i in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o

    a = np.load(f"{ref}.0.npz")
    assert a["loss"][2] < a["loss"][0]  # the steps did learn something
    for pid in range(2):
        b = np.load(f"{two}.{pid}.npz")
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b["embedding"], a["embedding"], atol=1e-5)


def train(cfg: Path, out: Path, *overrides: str, nproc: int, pid: int = 0, port: int = 0):
    """`rlvr-train` as one of `nproc` processes (8 // nproc simulated CPU devices each)."""
    env = {**os.environ, "XLA_FLAGS": xla_flags(8 // nproc)}
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = f"{ROOT}:{ROOT / 'tests'}"
    args = [f"train.output_dir={out}", *overrides]
    if nproc > 1:
        args += [
            "mesh.distributed.initialize=true",
            f"mesh.distributed.coordinator_address='127.0.0.1:{port}'",
            f"mesh.distributed.num_processes={nproc}",
            f"mesh.distributed.process_id={pid}",
        ]
    return subprocess.Popen(
        [sys.executable, "-m", "rlvr_jax.cli", "--config", str(cfg), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_all(procs: list[subprocess.Popen]) -> None:
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-4000:]


@pytest.mark.slow
def test_two_process_trainer_matches_one_process_and_resumes(tmp_path):
    # the whole trainer (rollouts stepped in lockstep on each process's main thread, rewards,
    # the learner over a mesh spanning both processes, orbax checkpoints, resume) on 2 x 4
    # devices gives the metrics of one process on 8 that ran its 3 steps without a restart
    from helpers_train import tiny_run

    from rlvr_jax.training.metrics import read_jsonl

    cfg = tiny_run(tmp_path)
    common = (
        "mesh.num_devices=0",
        "mesh.learner={data: 2, fsdp: 4, tensor: 1}",
        "mesh.actor={data: 8, fsdp: 1, tensor: 1}",
        "rollout.mode=sync",
        "checkpoint.every_steps=2",
        "log.tensorboard=false",
    )
    one, two = tmp_path / "one", tmp_path / "two"
    run_all([train(cfg, one, *common, "train.max_steps=3", nproc=1)])
    for steps in (2, 3):  # 2 steps and a checkpoint, then resumed for a third
        port = free_port()
        run_all(
            [
                train(cfg, two, *common, f"train.max_steps={steps}", nproc=2, pid=i, port=port)
                for i in range(2)
            ]
        )
    a, b = read_jsonl(one / "metrics.jsonl"), read_jsonl(two / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        for key in ("loss", "reward/mean", "response_length/mean", "kl/sampler_learner"):
            np.testing.assert_allclose(rb[key], ra[key], rtol=1e-4, atol=1e-5, err_msg=key)
        assert rb["policy_version"] == ra["policy_version"]
    assert (two / "final" / "config.json").is_file()
