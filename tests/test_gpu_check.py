"""`scripts/gpu_check.sh`: the driver goes on past a failing or capped part and records it, a
part past its cap is stopped with its whole process group, and `--cpu-smoke` runs every part
for real (tiny, on the CPU, the GPU image's missing packages unimportable)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_cli import xla_flags

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = sys.modules["gpu_check"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def test_the_driver_records_each_part_and_goes_on(tmp_path, monkeypatch, capsys):
    """roofline writes its JSON; learner exits 1 without one; decode-bench runs out of time;
    e2e still runs after them. Every outcome lands in the JSON and the summary."""
    ran = []

    def fake(cmd, env, cap_s, log):
        name = cmd[cmd.index("--part") + 1]
        ran.append(name)
        assert env["JAX_COMPILATION_CACHE_DIR"] and cap_s > 0
        log.write(f"{name} says hello\n".encode())
        log.flush()
        if name in ("roofline", "e2e"):
            out = {"matmul_gflops": {"bfloat16": 1.5}, "steps_per_s": {"sync": 2.0}}
            Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(out))
            return 0, "done"
        return (1, "done") if name == "learner" else (-15, "timeout")

    monkeypatch.setattr(gpu_check, "run_subprocess", fake)
    parts = "roofline,learner,decode-bench,e2e"
    assert gpu_check.main(["--out", str(tmp_path), "--only", parts, "--budget", "100"]) == 1
    assert ran == parts.split(",")
    r = json.loads((tmp_path / "gpu_check.json").read_text())
    status = {name: entry["status"] for name, entry in r["parts"].items()}
    assert status == {"roofline": "ok", "learner": "failed", "decode-bench": "timeout", "e2e": "ok"}
    assert r["parts"]["learner"]["error"] == "learner says hello"  # the tail of its log
    assert "cap" in r["parts"]["decode-bench"]["error"]
    assert r["parts"]["roofline"]["result"]["matmul_gflops"]["bfloat16"] == 1.5
    summary = (tmp_path / "summary.txt").read_text()
    assert "matmul_gflops/bfloat16" in summary and "timeout" in summary
    assert "learner says hello" in (tmp_path / "gpu_check.log").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gpu_check.json", "gpu_check.log", "summary.txt",
    ]  # fmt: skip
    assert "== e2e: ok" in capsys.readouterr().out


def test_unknown_parts_are_named(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--only", "roofline,warp-drive"])
    assert "warp-drive" in capsys.readouterr().err


def test_a_part_past_its_cap_is_stopped_with_its_children(tmp_path):
    """The part and a grandchild it started both go at the cap (SIGTERM to the group)."""
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)"
    )
    start = time.perf_counter()
    with open(tmp_path / "log", "wb") as log:
        _, how = gpu_check.run_subprocess([sys.executable, "-c", code], dict(os.environ), 2, log)
    assert how == "timeout" and time.perf_counter() - start < 20
    child = int(pid_file.read_text())
    time.sleep(0.5)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()


@pytest.mark.slow
def test_cpu_smoke_runs_every_part(tmp_path):
    """Every part ok. The smoke's own 3-minute budget is a wall-clock target, which a test
    beside other xdist workers on 2 cores cannot hold (CI: the e2e part hit its 24 s remainder
    after 150 s of the others on a cold XLA cache), so the test raises the budget and checks the
    parts' results; the driver's capping is checked above with a fake part."""
    env = {**os.environ, "XLA_FLAGS": xla_flags()}  # one CPU device
    env["PYTHON"] = sys.executable
    out = tmp_path / "out"
    cmd = ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu-smoke", "--out", str(out)]
    proc = subprocess.run(
        [*cmd, "--budget", "600"], env=env, capture_output=True, text=True, timeout=700
    )
    r = json.loads((out / "gpu_check.json").read_text())
    status = {name: entry["status"] for name, entry in r["parts"].items()}
    assert proc.returncode == 0, f"{status}\n{proc.stdout[-3000:]}"
    assert list(status) == [p.name for p in gpu_check.PARTS]
    assert set(status.values()) == {"ok"}
    parts = {name: entry["result"] for name, entry in r["parts"].items()}
    assert set(parts["env"]["absent"]) == set(gpu_check.ABSENT)  # none of them was needed
    assert parts["parity"]["ok"] and len(parts["parity"]["checks"]) == 7
    assert parts["learner"]["config"]["attention_kernel"] == "blockwise"
    for name in ("decode-bench", "decode-1b"):
        assert parts[name]["config"]["dtype"] == "bfloat16"
        assert parts[name]["decode_step_memory_fraction"] > 0
    assert parts["decode-bench"]["ratios"]["continuous_over_hf_tokens_per_s"] > 0
    assert parts["decode-long"]["long"]["ratios"]["paged_over_contiguous_tokens_per_s"] > 0
    step = parts["decode-profile"]  # the step alone, traced (its int8 engine: the GPU's only)
    assert step["step"]["4x32 bfloat16"]["ms_per_step"] > 0
    assert {"mlp", "lm_head"} <= set(step["op_profile"]["4x32 bfloat16"]["parts"])
    assert parts["roofline"]["datasheet"] is None  # CPUs have no datasheet entry
    assert set(parts["e2e"]["tokens_per_s"]) >= {"sync", "async"}
    summary = (out / "summary.txt").read_text()
    assert all(p.name in summary for p in gpu_check.PARTS) and summary in proc.stdout
    assert len(list(out.iterdir())) <= 8  # what comes back from a device run
