"""`rlvr-bench mismatch --quick` run as the installed command: the keys, and the figures the
exact path promises (replay: bitwise equal on policy, in fp32 and bf16, on one device and
tensor-parallel)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_run_writes_the_keys_and_replays_bit_for_bit(tmp_path):
    out = tmp_path / "mismatch.json"
    cmd = [sys.executable, "-c", "from rlvr_jax.cli import bench_main; bench_main()"]
    run = subprocess.run(
        [*cmd, "mismatch", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    for dtype in ("float32", "bfloat16"):
        exact = r["mismatch"][dtype]
        assert exact["bitwise_equal_fraction"] == 1.0 and exact["max_abs_logp"] == 0.0
        assert exact["kl"] == 0.0 and exact["tokens"] > 0
        default = r["mismatch_default"][dtype]
        assert 0.0 <= default["kl"] < 1e-4 and default["tokens"] > 0
    assert r["mismatch_default"]["float32"]["max_abs_logp"] < 1e-4
    names = set(r["settings"])
    assert {"float32/paged/1dev", "float32/paged/tp2x4", "bfloat16/paged/tp2x4"} <= names
    for name, s in r["settings"].items():
        assert s["replay"]["before"]["tokens"] > 0 and s["replay"]["after"]["tokens"] > 0
        assert s["replay"]["lag"]["tokens"] > 0 < s["replay"]["lag"]["kl"]  # the update shows
        assert set(r["tokens_per_s"][name]) == {"default", "exact"}
    assert r["exact_over_default_tokens_per_s"] > 0
    assert r["roofline"]["peak_gflops_fp32"] > 0 and len(r["machine"]["loadavg_before"]) == 3
    assert "bitwise" in run.stdout  # the table
