"""`rlvr-bench` started as a user starts it (the installed console script, a fresh process):
`all --quick` runs every benchmark, stays quiet (no absl/orbax INFO) and shows progress; a
benchmark stops within 10 s on SIGTERM / SIGINT. (The other commands: test_cli_subprocess.py.)"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import helpers_cli as C
import pytest
from test_cli_subprocess import STOP_S, _quiet

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent


def test_rlvr_bench_all_quick(tmp_path):
    result = tmp_path / "all.json"
    args = ["all", "--quick", "--json", str(result)]
    proc = C.Proc("rlvr-bench", args, tmp_path, cwd=ROOT)  # e2e reads configs/demo.yaml
    assert proc.wait(1800) == 0, proc.stderr()[-5000:]
    status = json.loads(result.read_text())["status"]
    assert {n for n, s in status.items() if s["status"] == "ok"} == set(status), status
    err = proc.stderr()
    for name in ("roofline", "losses", "verifiers", "decode", "learner", "waste", "e2e"):
        assert re.search(rf"^rlvr-bench {name} \[ *\d+\.\d s\] ", err, re.M), name
    _quiet(err)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["term", "int"])
def test_rlvr_bench_stops_on_a_signal(tmp_path, sig):
    proc = C.Proc("rlvr-bench", ["decode", "--quick"], tmp_path)
    deadline = time.monotonic() + 600
    while "throughput workload" not in proc.stderr():  # inside the work, past the imports
        assert proc.alive(), proc.stderr()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    rc, seconds = proc.stop(sig, STOP_S)
    assert rc == 128 + sig and seconds < STOP_S, proc.stderr()[-3000:]
    assert f"interrupted by {signal.Signals(sig).name}" in proc.stderr()
