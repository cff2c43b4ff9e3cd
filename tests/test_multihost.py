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

WORKER = Path(__file__).with_name("multihost_worker.py")
ROOT = WORKER.parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(pid: int, nproc: int, port: int, out: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
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
