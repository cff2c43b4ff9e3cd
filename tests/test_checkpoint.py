"""Checkpoints that lose nothing, on real orbax files: a damaged newest checkpoint is named (with
its damaged files), moved aside and the previous one restored; with none intact, a
`CheckpointError` names them all; a save that fails for lack of room (a real EFBIG from
RLIMIT_FSIZE, in a subprocess) is reported with its step and OS error, leaves the earlier
checkpoints restorable, and does not block the next save."""

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers_cli import xla_flags

from rlvr_jax.training.checkpoint import Checkpointer, CheckpointError, abstract_like
from rlvr_jax.training.metrics import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
LOGGER = "rlvr_jax.training.checkpoint"


def make_state(k: float) -> dict:
    """A small train-state-like pytree whose every value depends on `k` (the step)."""
    w = jax.random.normal(jax.random.key(0), (128, 64)) + k
    return {"params": {"w": w, "b": jnp.full((64,), k)}, "step": jnp.int32(k)}


def save_steps(out: Path, steps=(1, 2, 3), **kw) -> Path:
    ckpt = Checkpointer(out, **{"keep": 3, **kw})
    for s in steps:
        ckpt.save(s, make_state(s), {"step": s, "data": {"epoch": 0, "offset": 10 * s}})
    ckpt.close()
    return out / "checkpoints"


def data_files(step_dir: Path) -> list[Path]:
    return sorted((step_dir / "state" / "ocdbt.process_0" / "d").iterdir())


def flip(path: Path, at: float = 0.5, n: int = 16) -> None:
    """Overwrites n bytes in the middle of a file with their complement (same size)."""
    data = bytearray(path.read_bytes())
    i = min(int(len(data) * at), max(len(data) - n, 0))
    data[i : i + n] = bytes(b ^ 0xFF for b in data[i : i + n])
    path.write_bytes(bytes(data))


def assert_state(state, k: float) -> None:
    want = make_state(k)
    for got, exp in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(exp))


def messages(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def resume(out: Path, caplog, **kw):
    """`restore_latest` of a fresh Checkpointer on `out`, with this module's logs captured."""
    ckpt = Checkpointer(out, **kw)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        result = ckpt.restore_latest(abstract_like(make_state(0)))
    ckpt.close()
    return result


@pytest.mark.smoke("checkpoint")
def test_save_restore_keep_and_manifest(tmp_path):
    root = save_steps(tmp_path, steps=(1, 2, 3, 4), keep=2)
    assert sorted(os.listdir(root)) == ["3", "4"]  # keep-last-2, nothing half-deleted left
    manifest = json.loads((root / "4" / "rlvr_manifest.process_0.json").read_text())
    assert manifest["checksum"] == "crc32"
    d = data_files(root / "4")[0].relative_to(root / "4").as_posix()
    assert manifest["files"][d][0] == (root / "4" / d).stat().st_size
    assert "meta/metadata" in manifest["files"]
    ckpt = Checkpointer(tmp_path)
    step, state, meta = ckpt.restore_latest(abstract_like(make_state(0)))
    ckpt.close()
    assert (step, meta["data"]["offset"]) == (4, 40)
    assert_state(state, 4)


def test_no_checkpoint_is_none(tmp_path):
    ckpt = Checkpointer(tmp_path)
    assert ckpt.restore_latest(abstract_like(make_state(0))) is None
    assert ckpt.latest_step() is None
    ckpt.close()


def test_damaged_newest_falls_back_and_is_kept(tmp_path, caplog):
    root = save_steps(tmp_path)
    damaged = data_files(root / "3")[:3]
    assert len(damaged) == 3
    for f in damaged:
        flip(f)
    bytes_before = {f.name: f.read_bytes() for f in damaged}
    ckpt = Checkpointer(tmp_path)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        step, state, meta = ckpt.restore_latest(abstract_like(make_state(0)))
    assert (step, meta["step"]) == (2, 2)
    assert_state(state, 2)
    [err] = messages(caplog, logging.ERROR)
    assert err.startswith("checkpoint 3 is damaged (moved to 3.damaged)")
    assert all(f"state/ocdbt.process_0/d/{f.name} (checksum differs)" in err for f in damaged)
    assert "\n" not in err
    warnings = messages(caplog, logging.WARNING)
    assert "falling back to checkpoint 2; steps 3.. will be recomputed" in warnings
    # moved aside, byte for byte, never deleted; orbax no longer lists it
    assert not (root / "3").exists()
    kept = root / "3.damaged" / "state" / "ocdbt.process_0" / "d"
    assert {f.name: (kept / f.name).read_bytes() for f in damaged} == bytes_before
    assert ckpt.latest_step() == 2
    # step 3 is recomputed and saved again; keep-last-2 neither counts nor removes the
    # damaged copy
    ckpt.save(3, make_state(3), {"step": 3})
    ckpt.close()
    assert sorted(os.listdir(root)) == ["2", "3", "3.damaged"]


def test_none_intact_raises_naming_each(tmp_path):
    root = save_steps(tmp_path, steps=(1, 2))
    names = {s: data_files(root / str(s))[-1].name for s in (1, 2)}
    for s in (1, 2):
        flip(root / str(s) / "state" / "ocdbt.process_0" / "d" / names[s])
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(CheckpointError) as info:
        ckpt.restore_latest(abstract_like(make_state(0)))
    msg = str(info.value)
    assert isinstance(info.value, ValueError)  # rlvr-train maps it to exit 2
    assert msg.startswith(f"no intact checkpoint in {root}: checkpoint 2 (moved to 2.damaged)")
    assert "checkpoint 1 (moved to 1.damaged)" in msg
    assert all(f"d/{n} (checksum differs)" in msg for n in names.values())
    assert "checkpoint.resume: false" in msg
    assert sorted(os.listdir(root)) == ["1.damaged", "2.damaged"]
    # a second attempt does not silently start afresh
    with pytest.raises(
        CheckpointError, match=r"moved aside by an earlier run: 1\.damaged, 2\.damaged"
    ):
        ckpt.restore_latest(abstract_like(make_state(0)))
    ckpt.close()


def test_truncated_file(tmp_path, caplog):
    root = save_steps(tmp_path, steps=(1, 2))
    big = max(data_files(root / "2"), key=lambda p: p.stat().st_size)
    size = big.stat().st_size
    with open(big, "r+b") as f:
        f.truncate(size // 3)
    step, state, _ = resume(tmp_path, caplog, verify="size")  # sizes catch a cut-short file
    assert step == 1
    assert_state(state, 1)
    [err] = messages(caplog, logging.ERROR)
    assert f"d/{big.name} (cut short: {size // 3} bytes, {size} written)" in err


def test_missing_manifest_restores_unchecked(tmp_path, caplog):
    root = save_steps(tmp_path, steps=(1, 2))
    (root / "2" / "rlvr_manifest.process_0.json").unlink()  # killed before it was written
    step, state, _ = resume(tmp_path, caplog)
    assert step == 2
    assert_state(state, 2)
    assert any("checkpoint 2 has no manifest" in m for m in messages(caplog, logging.WARNING))


def test_missing_manifest_and_damaged_data_orbax_error_in_one_line(tmp_path, caplog, capfd):
    """Without a manifest the damage shows only as orbax's error (the issue's ZSTD error):
    summarised in one line naming the array and the directory, then the fallback."""
    root = save_steps(tmp_path, steps=(1, 2))
    (root / "2" / "rlvr_manifest.process_0.json").unlink()
    big = max(data_files(root / "2"), key=lambda p: p.stat().st_size)
    flip(big, at=0.0, n=12)  # the zstd frame header
    step, state, _ = resume(tmp_path, caplog)
    assert step == 1
    assert_state(state, 1)
    [err] = messages(caplog, logging.ERROR)
    assert err.startswith("checkpoint 2 is damaged (moved to 2.damaged): orbax cannot restore it:")
    assert "ZSTD" in err and f"{root}/2/state/" in err and "\n" not in err
    assert "Exception ignored" not in capfd.readouterr().err


@pytest.mark.parametrize("manifest", [True, False])
def test_json_sidecar_corrupted(tmp_path, caplog, manifest):
    root = save_steps(tmp_path, steps=(1, 2))
    if not manifest:
        (root / "2" / "rlvr_manifest.process_0.json").unlink()
    side_car = root / "2" / "meta" / "metadata"
    text = side_car.read_text()
    cut = text.rindex("}")
    side_car.write_text(text[:cut] + "]" + text[cut + 1 :])  # same size, no longer JSON
    step, _, meta = resume(tmp_path, caplog)
    assert (step, meta["step"]) == (1, 1)
    [err] = messages(caplog, logging.ERROR)
    want = "meta/metadata (checksum differs)" if manifest else "JSON side-car meta/metadata"
    assert want in err


def test_other_train_state_is_an_error_not_damage(tmp_path):
    root = save_steps(tmp_path, steps=(1, 2))
    other = {"params": {"w": jnp.zeros((256, 64)), "b": jnp.zeros((64,))}, "step": jnp.int32(0)}
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(CheckpointError, match=r"params\.w is \(128, 64\) in the checkpoint, "):
        ckpt.restore_latest(abstract_like(other))
    ckpt.close()
    assert sorted(os.listdir(root)) == ["1", "2"]  # nothing moved


def test_leftovers_of_an_interrupted_save_are_removed(tmp_path, caplog):
    root = save_steps(tmp_path, steps=(1,))
    (root / "2.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
    (root / "0.deleting").mkdir()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        ckpt = Checkpointer(tmp_path)
    assert sorted(os.listdir(root)) == ["1"]
    assert any("2.orbax-checkpoint-tmp" in m for m in messages(caplog, logging.WARNING))
    ckpt.save(2, make_state(2), {"step": 2})
    ckpt.close()
    assert sorted(os.listdir(root)) == ["1", "2"]


FULL_DISK = textwrap.dedent(
    """
    import json, resource, sys
    import jax, jax.numpy as jnp
    from rlvr_jax.training.checkpoint import CheckpointError, Checkpointer, abstract_like

    def state(k):
        return {"w": jax.random.normal(jax.random.key(0), (256, 256)) + k, "b": jnp.full((8,), k)}

    def room(limited):
        # over 64 KiB a file can no longer grow (EFBIG: Python ignores SIGXFSZ); the
        # checkpoint's 256 KiB array cannot be written, its metadata can
        limit = 64 << 10 if limited else resource.RLIM_INFINITY
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    def scenario(out, mode):
        report = {}
        ckpt = Checkpointer(out, keep=1, async_save=mode == "async")
        ckpt.save(1, state(1), {"step": 1})
        ckpt.wait()
        room(False if mode == "none" else True)
        try:
            ckpt.save(2, state(2), {"step": 2})
            report["raised_by"] = "save 3"
            ckpt.save(3, state(3), {"step": 3})  # an asynchronous failure of 2 surfaces here
            report["raised_by"] = None
        except CheckpointError as e:
            report["error"] = str(e)
            if mode == "sync":
                report["raised_by"] = "save 2"
        report["after_failure"] = sorted(p.name for p in ckpt.dir.iterdir())
        step, restored, meta = ckpt.restore_latest(abstract_like(state(0)))
        report["restored"] = [step, meta["step"], float(abs(restored["w"] - state(1)["w"]).max())]
        room(False)
        ckpt.save(2, state(2), {"step": 2})  # with room again, the same step saves
        ckpt.wait()
        room(True)
        try:
            report["late_raised_by"] = "save 3"
            ckpt.save(3, state(3), {"step": 3})
            report["late_raised_by"] = "close"
            ckpt.close()  # an asynchronous failure of 3 surfaces here at the latest
        except CheckpointError as e:
            report["late_error"] = str(e)
        ckpt.close()
        room(False)
        report["final"] = sorted(p.name for p in ckpt.dir.iterdir())
        return report

    reports = {mode: scenario(f"{sys.argv[1]}/{mode}", mode) for mode in ("async", "sync")}
    print("REPORT " + json.dumps(reports))
    """
)


@pytest.mark.slow
def test_save_that_fails_for_lack_of_room(tmp_path):
    """One subprocess (the file-size limit is per process), both save modes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env["XLA_FLAGS"] = xla_flags()  # one device
    proc = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("REPORT "))
    for mode, report in json.loads(line[len("REPORT ") :]).items():
        out = tmp_path / mode / "checkpoints"
        assert report["raised_by"] == ("save 3" if mode == "async" else "save 2")
        err = report["error"]
        assert err.startswith(f"checkpoint 2 could not be written to {out}: ")
        assert "File too large" in err and "[EFBIG]" in err and "\n" not in err
        assert err.endswith("(the earlier checkpoints are untouched: 1)")
        # keep=1, yet the failed save cost nothing; its partial directory is gone
        assert report["after_failure"] == ["1"]
        assert report["restored"] == [1, 1, 0.0]
        # the retry of step 2 worked (then keep-last-1 applied); 3 failed again
        assert report["late_raised_by"] == ("close" if mode == "async" else "save 3")
        assert report["late_error"].startswith(f"checkpoint 3 could not be written to {out}")
        assert report["late_error"].endswith("(the earlier checkpoints are untouched: 2)")
        assert report["final"] == ["2"]
    assert "Traceback" not in proc.stderr  # orbax's tracebacks go to the debug log


WORKER = Path(__file__).with_name("checkpoint_worker.py")


def run_two_processes(out: Path, phase: str) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the worker sets them
    env["PYTHONPATH"] = str(ROOT)
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(pid), "2", str(port), str(out), phase],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for pid in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o
    return [
        json.loads(next(x for x in o.splitlines() if x.startswith("RESULT "))[7:]) for o in outs
    ]


@pytest.mark.slow
def test_two_processes_agree_on_the_checkpoint_to_restore(tmp_path):
    """Each process writes and verifies only its own files; a file of process 1 damaged in
    the newest checkpoint makes both processes fall back to the previous one."""
    run_two_processes(tmp_path, "save")
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        for pid in (0, 1):
            manifest = json.loads(
                (root / str(step) / f"rlvr_manifest.process_{pid}.json").read_text()
            )
            owners = {f.split("/")[1] for f in manifest["files"] if f.startswith("state/ocdbt.")}
            assert owners == {f"ocdbt.process_{pid}"}
    victim = sorted((root / "2" / "state" / "ocdbt.process_1" / "d").iterdir())[-1]
    flip(victim)
    results = run_two_processes(tmp_path, "restore")
    for r in results:
        assert (r["step"], r["meta_step"], r["values_match"]) == (1, 1, True), r
    [err] = results[0]["errors"]  # process 0 names the file that process 1 found damaged
    assert err.startswith("checkpoint 2 is damaged (moved to 2.damaged): process 1: ")
    assert f"state/ocdbt.process_1/d/{victim.name} (checksum differs)" in err
    assert sorted(os.listdir(root)) == ["1", "2.damaged"]


def test_late_tensorstore_callback_is_quiet_and_nothing_else(monkeypatch):
    """After a failed save TensorStore may call back into orbax's closed event loop; Python
    reports it as unraisable. That one goes to the debug log; any other is passed on."""
    import asyncio
    from types import SimpleNamespace

    from rlvr_jax.training import checkpoint_errors

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    checkpoint_errors.quiet_orbax_tracebacks()
    loop = asyncio.new_event_loop()
    loop.close()
    for fn in (lambda: loop.call_soon_threadsafe(print), lambda: 1 / 0):
        try:
            fn()
        except Exception as e:
            args = dict(exc_type=type(e), exc_value=e, exc_traceback=e.__traceback__)
            sys.unraisablehook(SimpleNamespace(**args, err_msg=None, object=None))
    assert [type(u.exc_value) for u in seen] == [ZeroDivisionError]


@pytest.mark.slow
def test_rlvr_train_resumes_past_a_damaged_checkpoint_and_exits_2_with_none_intact(tmp_path):
    """The issue's reproduction, as a user runs it: the same `rlvr-train` command after three
    data files of the newest checkpoint were overwritten in part."""
    from helpers_train import tiny_run

    cmd = [
        str(Path(sys.executable).with_name("rlvr-train")),
        "--config",
        str(tiny_run(tmp_path)),
        "train.max_steps=3",
        "checkpoint.every_steps=1",
        "checkpoint.keep=3",
        "checkpoint.export_hf=false",
        "log.plots=false",
        "log.progress_bar=false",
    ]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
    env["XLA_FLAGS"] = xla_flags()  # one device

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)

    first = run()
    assert first.returncode == 0, first.stderr[-3000:]
    root = tmp_path / "out" / "checkpoints"
    assert sorted(os.listdir(root)) == ["1", "2", "3"]
    damaged = data_files(root / "3")[:3]
    for f in damaged:
        flip(f)

    again = run()
    assert again.returncode == 0, again.stderr[-3000:]
    err = again.stderr
    assert "Traceback" not in err
    assert "checkpoint 3 is damaged (moved to 3.damaged): " in err
    assert all(f"state/ocdbt.process_0/d/{f.name} (checksum differs)" in err for f in damaged)
    assert "falling back to checkpoint 2; steps 3.. will be recomputed" in err
    assert "resumed from checkpoint 2" in err
    assert [r["step"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [1, 2, 3]
    assert sorted(os.listdir(root)) == ["1", "2", "3", "3.damaged"]

    for step in (1, 2, 3):
        flip(data_files(root / str(step))[-1])
    last = run()
    assert last.returncode == 2, last.stderr[-3000:]
    assert "Traceback" not in last.stderr
    assert f"no intact checkpoint in {root}: checkpoint 3 (moved to 3.damaged.2)" in last.stderr
    assert "checkpoint 1 (moved to 1.damaged)" in last.stderr
    assert "moved aside by an earlier run: 3.damaged" in last.stderr
    assert sorted(os.listdir(root)) == ["1.damaged", "2.damaged", "3.damaged", "3.damaged.2"]
