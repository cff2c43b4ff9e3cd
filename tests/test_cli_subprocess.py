"""`rlvr-train`, `rlvr-eval` and `rlvr-filter` started as a user starts them (the installed
console scripts, fresh processes): they run, stay quiet (no absl/orbax INFO), show progress,
and stop within 10 s on SIGTERM / SIGINT (`rlvr-bench`: test_cli_bench_subprocess.py, a file
of its own so that the two xdist workers can share these slow tests)."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import helpers_cli as C
import numpy as np
import pytest
from helpers_train import tiny_run

pytestmark = pytest.mark.slow

TESTS = str(Path(__file__).parent)  # helpers_train:word_parity, the runs' verifier
ROOT = Path(__file__).parent.parent
STOP_S = 10.0  # on idle cores: C.stop_s() scales it by the load
LIBRARY_INFO = re.compile(r"^(I\d{4} |.* INFO (absl|orbax|jax)\b)", re.M)


def _quiet(stderr: str) -> None:
    noisy = LIBRARY_INFO.findall(stderr)
    assert not noisy, f"library INFO lines on stderr: {stderr[:2000]}"


def _steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def test_rlvr_train_runs_a_few_steps_and_its_checkpoints_are_policies(tmp_path):
    cfg = tiny_run(tmp_path)
    proc = C.Proc("rlvr-train", ["--config", str(cfg)], tmp_path, PYTHONPATH=TESTS)
    assert proc.wait(900) == 0, proc.stderr()[-3000:]
    out = tmp_path / "out"
    assert _steps(out) == [1, 2, 3]
    assert (out / "checkpoints" / "2").is_dir() and (out / "final").is_dir()
    _quiet(proc.stderr())

    # rlvr-eval takes a training checkpoint as it takes an HF directory (the run's run_config.yaml
    # says what the checkpoint holds; no --config needed)
    assert (out / "run_config.yaml").is_file()
    report = tmp_path / "eval.json"
    args = ["--model", str(out / "checkpoints" / "3"), "--input", str(tmp_path / "test.jsonl")]
    args += ["--ks", "1", "2", "--max-prompts", "2", "--json", str(report)]
    proc = C.Proc("rlvr-eval", args, tmp_path, PYTHONPATH=TESTS)
    assert proc.wait(600) == 0, proc.stderr()[-3000:]
    assert json.loads(report.read_text())["prompts"] == 2
    _quiet(proc.stderr())

    # so does rlvr-serve, under the name <run>-step<N>
    import openai

    ready = tmp_path / "ready.json"
    args = ["--model", str(out / "checkpoints" / "3"), "--http-port", "0", "--no-grpc"]
    proc = C.Proc("rlvr-serve", [*args, "--ready-file", str(ready)], tmp_path)
    try:
        port = proc.wait_for_file(ready, 300)["http_port"]
        client = openai.OpenAI(api_key="-", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
        assert [m.id for m in client.models.list()] == ["out-step3"]
        answer = client.completions.create(model="out-step3", prompt="1 + 2", max_tokens=2)
        assert answer.usage.completion_tokens >= 1
    finally:
        rc, _ = proc.stop()
    assert rc == 0, proc.stderr()[-3000:]

    # ... because its export is the policy: the last checkpoint's equals the run's final/
    from safetensors.numpy import load_file

    from rlvr_jax.cli import export_main

    exported = tmp_path / "exported"
    assert export_main([str(out / "checkpoints" / "3"), str(exported)]) == 0
    final, mine = (
        load_file(out / "final" / "model.safetensors"),
        load_file(exported / "model.safetensors"),
    )
    assert sorted(final) == sorted(mine)
    for name, tensor in final.items():
        assert np.array_equal(tensor, mine[name]), name
    assert (exported / "tokenizer.json").is_file()
    assert export_main([str(out / "checkpoints" / "3"), str(exported)]) == 2  # not over it


@pytest.mark.parametrize(
    ("sig", "mode"),
    [
        (signal.SIGTERM, "async"),
        (signal.SIGINT, "sync"),
        (signal.SIGTERM, "sync"),
    ],
    ids=["term-async", "int-sync", "term-sync"],
)
def test_rlvr_train_stops_on_a_signal_with_its_checkpoint(tmp_path, sig, mode):
    cfg = tiny_run(tmp_path)
    out = tmp_path / "out"
    args = ["--config", str(cfg), f"rollout.mode={mode}", "train.max_steps=500"]
    args += ["checkpoint.every_steps=1000"]  # the only checkpoint is the one the signal writes
    proc = C.Proc("rlvr-train", args, tmp_path, PYTHONPATH=TESTS)
    deadline = time.monotonic() + 900
    while len(_steps(out)) < 2:
        assert proc.alive(), proc.stderr()[-3000:]
        assert time.monotonic() < deadline, "no training step within 900 s"
        time.sleep(0.2)
    rc, seconds = proc.stop(sig, limit := C.stop_s(STOP_S))
    done = _steps(out)
    # the step the trainer had dispatched when the signal came (it names it); steps are fast
    # here, so the file read before the signal may already be a step or two behind
    named = re.search(r"signal \d+ at step (\d+)", proc.stderr())
    assert named, proc.stderr()[-3000:]
    at_signal = int(named.group(1))
    print(
        f"{signal.Signals(sig).name} after step {at_signal}: exit {rc} in {seconds:.1f} s, "
        f"last step {done[-1]}"
    )
    assert done[-1] <= at_signal + 1, f"steps {at_signal + 1}..{done[-1]} ran after the signal"
    # stopped, not finished: 143 (SIGTERM) or 130 (SIGINT) for a scheduler, and a line saying so
    assert seconds < limit and rc == 128 + sig, (rc, proc.stderr()[-3000:])
    checkpoints = sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    assert checkpoints and checkpoints[-1] == done[-1], (checkpoints, done)
    line = f"stopped at step {done[-1]}, checkpoint written; rerun to resume"
    assert line in proc.stderr(), proc.stderr()[-3000:]
    assert not (out / "final").exists()


def test_rlvr_eval_and_rlvr_filter(tmp_path):
    cfg = tiny_run(tmp_path)
    report = tmp_path / "eval.json"
    args = ["--config", str(cfg), "--input", str(tmp_path / "test.jsonl"), "--ks", "1", "2"]
    proc = C.Proc("rlvr-eval", [*args, "--max-prompts", "4", "--json", str(report)], tmp_path)
    assert proc.wait(600) == 0, proc.stderr()[-3000:]
    assert json.loads(report.read_text())["prompts"] == 4 and "pass@" in proc.stdout()
    _quiet(proc.stderr())

    kept, stats = tmp_path / "kept.jsonl", tmp_path / "filter.json"
    args = ["--config", str(cfg), "--input", str(tmp_path / "test.jsonl"), "--output", str(kept)]
    proc = C.Proc("rlvr-filter", [*args, "--samples", "2", "--json", str(stats)], tmp_path)
    assert proc.wait(600) == 0, proc.stderr()[-3000:]
    assert kept.exists() and json.loads(stats.read_text())
    _quiet(proc.stderr())
