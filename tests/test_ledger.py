"""The prompt ledger (`rlvr_jax.training.ledger`): every prompt drawn from the data stream ends in
exactly one outcome — trained (in which step), filtered, stale, or pending at the end — across
kills and resumes.

The file's reconciliation with a checkpoint, and the resume bookkeeping of `Rollouts`, on their
own; then `rlvr-train` for real (the installed console script, fresh processes): an async run
SIGKILLed at three random moments and resumed each time, and a sync run killed once, which
trains the same prompts in the same steps as the uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import helpers_cli as C
import numpy as np
import pytest
from helpers_train import check_mismatch_apart_from_lag, tiny_run

from rlvr_jax import config
from rlvr_jax.data import build_prompt_iterator, load_tokenizer
from rlvr_jax.data.mixture import PromptIterator
from rlvr_jax.data.rows import PromptRow
from rlvr_jax.data.sources import PromptSource
from rlvr_jax.training.ledger import Ledger, entry
from rlvr_jax.training.metrics import read_jsonl
from rlvr_jax.training.rollouts import Rollouts

TESTS = Path(__file__).parent
# this checkout (not whichever the console script was installed from), and the tests' helpers
# (helpers_train:word_parity, the runs' verifier)
PYTHONPATH = f"{TESTS.parent}:{TESTS}"


# -- the file -------------------------------------------------------------------------------


def _row(i: int) -> PromptRow:
    return PromptRow(f"p{i}", "0", "math", "math", source="s", index=i, prompt_ids=np.ones(2))


def test_resume_keeps_the_records_of_its_checkpoint_and_drops_the_rest(tmp_path, caplog):
    ledger = Ledger(tmp_path)
    for step in (1, 2, 3):
        ledger.write(step, [entry(2 * step, _row(0), "trained", step - 1)])
        ledger.write(step, [entry(2 * step + 1, _row(1), "filtered", step - 1)])
    ledger.write(3, [entry(8, _row(2), "pending")])
    assert ledger.count == 6  # pending records are not counted: they are not settled
    ledger.close()
    with open(tmp_path / "ledger.jsonl", "a") as f:
        f.write('{"step": 4, "requ')  # a SIGKILL in the middle of a write
    # resumed from checkpoint 2, which counted the 4 records of steps 1-2
    resumed = Ledger(tmp_path, resume_step=2, expected=4)
    rows = read_jsonl(tmp_path / "ledger.jsonl")
    assert [(r["step"], r["request"], r["outcome"]) for r in rows] == [
        (1, 2, "trained"), (1, 3, "filtered"), (2, 4, "trained"), (2, 5, "filtered"),
    ]  # fmt: skip
    assert resumed.count == 4
    resumed.write(3, [entry(6, _row(0), "stale", 1)])
    assert [r["request"] for r in read_jsonl(tmp_path / "ledger.jsonl")] == [2, 3, 4, 5, 6]
    resumed.close()
    # a checkpoint that counted more records than the file holds is named
    with caplog.at_level("WARNING"):
        Ledger(tmp_path, resume_step=3, expected=9).close()
    assert "holds 5 records up to step 3, but that checkpoint counted 9" in caplog.text
    with pytest.raises(ValueError, match="ledger outcome"):
        entry(0, _row(0), "skipped")


class _Stream:
    """Records submissions; nothing is generated."""

    def __init__(self) -> None:
        self.submitted: list[int] = []

    def submit(self, rid, prompt_ids, **_) -> None:
        self.submitted.append(rid)


def _rollouts() -> Rollouts:
    rows = tuple(_row(i) for i in range(10))
    prompts = PromptIterator([PromptSource("s", rows)], seed=3)
    return Rollouts(
        stream=_Stream(), prompts=prompts, rewards=None, tokenizer=None, num_samples=2, seed=0,
        max_new_tokens=4,
    )  # fmt: skip


def test_resume_bookkeeping_keeps_every_settled_request_across_restarts():
    first = _rollouts()
    first.fill(6)  # requests 0-5 in flight
    first.consume([0, 1, 3, 4])  # completed out of order: 2 and 5 still generating
    state = first.state()
    assert (state["next_request"], state["consumed_after"]) == (2, [3, 4])
    rows = {r["request"]: (r["source"], r["index"]) for r in first.pending()}
    assert sorted(rows) == [2, 5]

    second = _rollouts()
    second.restore(json.loads(json.dumps(state)))  # through the checkpoint's JSON
    # drawn before the restart, not settled, below a settled one: replayed from the data (the
    # checkpoint does not know that 5 was drawn: it is pending once drawn again)
    assert {r["request"]: (r["source"], r["index"]) for r in second.pending()} == {2: rows[2]}
    second.fill(2)  # re-draws 2, skips 3 and 4 (settled before the restart), re-draws 5
    assert second.stream.submitted == [2, 5]
    second.consume([5])  # 2 still generating: 3 and 4 must stay consumed after it
    state = second.state()
    assert (state["next_request"], state["consumed_after"]) == (2, [3, 4, 5])
    assert [r["request"] for r in second.pending()] == [2]

    third = _rollouts()
    third.restore(state)
    third.fill(2)
    assert third.stream.submitted == [2, 6]


# -- rlvr-train, killed and resumed ---------------------------------------------------------


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory) -> str:
    """One persistent compilation cache for the module's processes: a resumed process loads
    the programs the killed one compiled (three times faster to start here). The suite's
    (tests/conftest.py: also the programs other files' runs of the tiny setup compiled)."""
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path_factory.mktemp("xla_cache"))


def _train(tmp: Path, cfg: Path, out: Path, cache: str, *args: str) -> C.Proc:
    overrides = [f"train.output_dir={out}", "checkpoint.every_steps=3", *args]
    return C.Proc(
        "rlvr-train",
        ["--config", str(cfg), *overrides],
        tmp,
        PYTHONPATH=PYTHONPATH,
        JAX_COMPILATION_CACHE_DIR=cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )


def _steps(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(read_jsonl(path)) if path.exists() else 0


def _kill_after(proc: C.Proc, out: Path, steps: int, delay: float) -> None:
    """SIGKILLs `proc` `delay` s after metrics.jsonl shows `steps` steps."""
    deadline = time.monotonic() + 900
    while _steps(out) < steps:
        assert proc.alive(), f"exited before step {steps}:\n{proc.stderr()[-3000:]}"
        assert time.monotonic() < deadline, f"no step {steps} within 900 s"
        time.sleep(0.05)
    time.sleep(delay)
    assert proc.alive(), f"finished before the kill after step {steps}"
    proc.popen.send_signal(signal.SIGKILL)
    proc.popen.wait(30)


def _check_ledger(cfg_path: Path, out: Path) -> list[dict]:
    """The ledger of a finished run: every drawn prompt once, the data order without a gap,
    and per step the outcomes its metrics counted. Returns its records."""
    records = read_jsonl(out / "ledger.jsonl")
    ids = Counter(r["request"] for r in records)
    twice = sorted(i for i, n in ids.items() if n > 1)
    assert not twice, f"prompts with two outcomes: {twice}"
    assert sorted(ids) == list(range(len(ids))), "a gap in the data order"
    # the k-th record is the k-th prompt of the data stream
    cfg = config.load(cfg_path)
    data = build_prompt_iterator(cfg.data, tokenizer=load_tokenizer(cfg.model.path))
    drawn = data.next_batch(len(ids))
    by_id = {r["request"]: r for r in records}
    for k, row in enumerate(drawn):
        assert (by_id[k]["source"], by_id[k]["index"]) == (row.source, row.index), k
    metrics = {r["step"]: r for r in read_jsonl(out / "metrics.jsonl")}
    last = max(metrics)
    for step, m in metrics.items():
        got = Counter(r["outcome"] for r in records if r["step"] == step)
        assert got["trained"] == m["groups/kept"], (step, got, m)
        assert got["filtered"] == m["groups/drawn"] - m["groups/kept"], (step, got, m)
        assert got["stale"] == m["groups/stale_dropped"], (step, got, m)
        assert got["pending"] == (m["ledger/pending"] if step == last else 0), (step, got)
    return records


@pytest.mark.slow
def test_async_run_killed_three_times_has_every_prompt_once(tmp_path, xla_cache):
    seed = random.randrange(1 << 16)
    rng = random.Random(seed)
    print(f"kill moments drawn with seed {seed}")
    cfg, out = tiny_run(tmp_path), tmp_path / "out"
    args = ["rollout.mode=async", "train.max_steps=20", "rollout.queue_size=2"]
    for kill in range(3):
        # at a random moment: 1-3 steps past what the killed process had written (so past its
        # restart), plus up to 0.6 s (a step takes ~0.3 s once compiled): groups are in
        # flight, queued and scored then, and steps after the last checkpoint are recomputed
        target = _steps(out) + rng.randint(1, 3)
        proc = _train(tmp_path, cfg, out, xla_cache, *args)
        _kill_after(proc, out, target, rng.uniform(0.0, 0.6))
        print(f"kill {kill + 1}: after step {_steps(out)} (checkpoints {_checkpoints(out)})")
    proc = _train(tmp_path, cfg, out, xla_cache, *args)
    assert proc.wait(900) == 0, proc.stderr()[-3000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 21))
    check_mismatch_apart_from_lag(rows, "async")  # (one run less than a test of its own)
    records = _check_ledger(cfg, out)
    outcomes = Counter(r["outcome"] for r in records)
    assert outcomes["trained"] >= 20 and outcomes["pending"] > 0, outcomes
    for r in records:  # the staleness bound held for what was trained
        if r["outcome"] == "trained":
            assert r["step"] - 1 - r["version"] <= 1, r


def _checkpoints(out: Path) -> list[int]:
    root = out / "checkpoints"
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.exists() else []


@pytest.mark.slow
def test_sync_run_killed_and_resumed_trains_the_same_prompts_in_the_same_steps(tmp_path, xla_cache):
    seed = random.randrange(1 << 16)
    rng = random.Random(seed)
    cfg = tiny_run(tmp_path)
    args = ["rollout.mode=sync", "train.max_steps=8"]
    whole = _train(tmp_path, cfg, tmp_path / "whole", xla_cache, *args)
    assert whole.wait(900) == 0, whole.stderr()[-3000:]
    check_mismatch_apart_from_lag(read_jsonl(tmp_path / "whole" / "metrics.jsonl"), "sync")
    killed = _train(tmp_path, cfg, tmp_path / "killed", xla_cache, *args)
    at = rng.randint(4, 6)  # past the checkpoint at step 3, before the one at step 6 or after
    delay = rng.uniform(0.0, 0.5)
    print(f"seed {seed}: killed {delay:.2f} s after step {at}")
    _kill_after(killed, tmp_path / "killed", at, delay)
    resumed = _train(tmp_path, cfg, tmp_path / "killed", xla_cache, *args)
    assert resumed.wait(900) == 0, resumed.stderr()[-3000:]

    def outcomes(out: Path) -> list[tuple]:
        return sorted(
            (r["step"], r["request"], r["source"], r["index"], r["outcome"])
            for r in _check_ledger(cfg, out)
        )

    want = outcomes(tmp_path / "whole")
    assert [r for r in want if r[-1] == "trained"], want
    assert outcomes(tmp_path / "killed") == want
