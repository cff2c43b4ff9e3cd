"""`rlvr-bench` started as a user starts it (the installed console script, a fresh process):
`all --quick` runs every benchmark, stays quiet (no absl/orbax INFO) and shows progress, and its
one run is checked benchmark by benchmark (decode, waste, e2e: the figures of each quick run
consistent with each other); a benchmark stops within 10 s on SIGTERM / SIGINT. (The other
commands: test_cli_subprocess.py.)"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import helpers_cli as C
import pytest
from test_cli_subprocess import STOP_S, _quiet

from rlvr_jax.bench import decode, table, waste
from rlvr_jax.bench.waste import continuous_steps, static_steps

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def all_quick(tmp_path_factory):
    """One `rlvr-bench all --quick --json F --plot-dir D` (from the repository root: e2e reads
    configs/demo.yaml), shared by the tests below: (exit code, JSON, stdout, stderr, plots)."""
    tmp = tmp_path_factory.mktemp("all_quick")
    args = ["all", "--quick", "--json", str(tmp / "all.json"), "--plot-dir", str(tmp / "plots")]
    proc = C.Proc("rlvr-bench", args, tmp, cwd=ROOT)
    code = proc.wait(1800)
    result = json.loads((tmp / "all.json").read_text()) if code == 0 else None
    return SimpleNamespace(code=code, result=result, out=proc.stdout(), err=proc.stderr(),
                           plots=tmp / "plots")  # fmt: skip


def _bench(run: SimpleNamespace, name: str) -> dict:
    assert run.code == 0, run.err[-5000:]
    return run.result["benchmarks"][name]


def test_rlvr_bench_all_quick(all_quick):
    assert all_quick.code == 0, all_quick.err[-5000:]
    r = all_quick.result
    assert {n for n, s in r["status"].items() if s["status"] == "ok"} == set(table.SUBCOMMANDS)
    for name in table.SUBCOMMANDS:
        assert re.search(rf"^rlvr-bench {name} \[ *\d+\.\d s\] ", all_quick.err, re.M), name
        assert f"\n{name}: ok (" in all_quick.out  # the summary: each one's status and figures
    _quiet(all_quick.err)
    summary = r["summary"]
    assert summary["roofline"]["matmul_gflops/float32"] > 0
    measured = r["benchmarks"]["waste"]["measured"]
    assert summary["waste"]["measured/static_waste"] == measured["static_waste"]
    assert summary["waste"]["measured/continuous_waste"] < measured["static_waste"]
    assert "measured/continuous_waste" in all_quick.out
    for name in table.SUBCOMMANDS:  # every result says where it ran and with what
        b = r["benchmarks"][name]
        assert len(b["machine"]["loadavg_before"]) == 3 and b["config"]
        png = all_quick.plots / f"{name}.png"
        assert png.read_bytes()[:8] == PNG if table.bench(name).plot else not png.exists()


def test_decode_quick_figures_agree(all_quick):
    r = _bench(all_quick, "decode")
    assert set(r["tokens_per_s"]) == {"continuous", "static", "hf_generate"}
    assert set(r["wall_s"]) == {"continuous", "static"}
    assert all(v > 0 for v in (*r["tokens_per_s"].values(), *r["wall_s"].values()))
    assert r["roofline_fraction"] > 0 and {"platform", "cpu_count"} <= set(r["machine"])
    prof = r["profile"]  # the host's time, measured directly: part of its own run's wall
    assert 0 < prof["host_s"] < prof["host_run_wall_s"] and 0 < prof["host_share"] < 1
    assert prof["host_share"] == pytest.approx(prof["host_s"] / prof["host_run_wall_s"])
    cfg = r["config"]
    assert cfg["batch"] == decode.QUICK.batch and cfg["model"]["model_type"] == "qwen2"
    # The engine took exactly the predicted decode steps on the long-tailed workload.
    lengths = decode.long_tail_lengths(
        cfg["long_requests"], cfg["long_new"], cfg["mean_over_max"], cfg["seed"]
    )
    steps = r["long_tail"]["decode_steps"]
    assert steps["continuous"] == continuous_steps(lengths, cfg["batch"])
    assert steps["static"] == static_steps(lengths, cfg["batch"])


def test_waste_quick_measures_the_engine_as_the_simulation_predicts(all_quick):
    result = _bench(all_quick, "waste")
    assert "measured/predicted/static_waste" in all_quick.out
    assert "simulated/static_waste" in all_quick.out
    m = result["measured"]
    # the engine's own counters equal the exact slot-step count of the same lengths
    assert m["slot_steps"] == m["predicted_slot_steps"]
    assert m["static_waste"] == pytest.approx(m["predicted"]["static_waste"], abs=1e-12)
    assert m["continuous_waste"] == pytest.approx(m["predicted"]["continuous_waste"], abs=1e-12)
    assert m["continuous_waste"] < m["static_waste"]
    assert m["tokens"] == pytest.approx(m["sample_mean"] * m["requests"])
    assert result["distribution"]["simulated"]["mean"] == pytest.approx(14_700)
    assert result["distribution"]["measured"]["cap"] == waste.QUICK.measured_cap


def test_e2e_quick_figures_agree(all_quick):
    r = _bench(all_quick, "e2e")
    trl_ok = r["peers"]["trl"]["status"] == "ok"
    sides = {"sync", "async", "trl"} if trl_ok else {"sync", "async"}
    assert set(r["steps_per_s"]) == set(r["tokens_per_s"]) == sides
    assert r["config"]["rounds"] == 1 and isinstance(r["quiet"], bool)
    assert set(r["load"]["by_side"]) == sides
    assert r["config"]["preset"] == "demo"
    assert r["ratios"]["async_over_sync"] == r["async_over_sync"]
    if trl_ok:
        ratio = r["steps_per_s"]["async"] / r["steps_per_s"]["trl"]
        assert r["ratios"]["async_over_trl"] == pytest.approx(ratio)
    else:
        assert r["ratios"]["async_over_trl"] is None
    overrides = r["config"]["overrides"]
    assert "filter.active_sampling=false" in overrides
    assert "filter.zero_variance=false" in overrides  # --quick: every group trained
    for mode in ("sync", "async"):
        m = r["modes"][mode]
        assert m["steps"] == 2 and m["wall_s"] > 0 and m["tokens"] > 0
        assert m["groups_drawn"] >= 2 and m["groups_stale"] >= 0  # (a batch draws >= 1 group)
        total = m["groups_drawn"] + m["groups_stale"]
        assert m["stale_share"] == pytest.approx(m["groups_stale"] / total)
        assert m["steps_per_s"] == pytest.approx(2 / m["wall_s"])
        assert m["tokens_per_s"] == pytest.approx(m["tokens"] / m["wall_s"])
        # the timed window ends when the last update has finished
        assert m["window_s"][1] >= max(m["update_ends_s"]) and len(m["update_ends_s"]) == 3
        assert m["busy_s"]["rollout"] > 0 and m["busy_s"]["train"] > 0
        # busy time within the measured window
        assert m["busy_s"]["train"] <= m["wall_s"] + 1e-6
        assert 0.0 <= m["reward_mean"] <= 1.0
    # sync mode trains only once every group it waits for is in: the stages never overlap
    assert r["modes"]["sync"]["overlap_fraction"] < 0.05
    assert 0.0 <= r["overlap_fraction"] <= 1.0
    split = r["time_s"]
    assert r["projected_speedup_disjoint"] == pytest.approx(
        (split["rollout"] + split["train"]) / max(split.values())
    )
    assert 1.0 <= r["projected_speedup_disjoint"] <= 2.0
    assert r["config"]["quick"]
    assert r["config"]["settle"]["max_s"] == 0 and set(r["config"]["settle"]["waited_s"]) == {
        "sync", "async", "trl"}  # fmt: skip
    assert r["peers"]["trl"]["status"] in ("skipped", "ok")
    # the machine's measured peak and its CPU go with the figures
    assert r["roofline"]["peak_gflops_fp32"] > 0 and r["roofline"]["memory_gbps"] > 0
    assert "cpu_isa" in r["machine"] or not Path("/proc/cpuinfo").exists()
    assert "ratios/async_over_sync " in all_quick.out and "roofline fp32" in all_quick.out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["term", "int"])
def test_rlvr_bench_stops_on_a_signal(tmp_path, sig):
    proc = C.Proc("rlvr-bench", ["decode", "--quick"], tmp_path)
    deadline = time.monotonic() + 600
    while "compiling and warming up" not in proc.stderr():  # inside the work, past the imports
        assert proc.alive(), proc.stderr()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    rc, seconds = proc.stop(sig, limit := C.stop_s(STOP_S))
    assert rc == 128 + sig and seconds < limit, proc.stderr()[-3000:]
    # said when the work unwinds, or by the watchdog when native code (a compile) outlasts grace_s
    assert f"interrupted by {signal.Signals(sig).name}" in proc.stderr()
