"""`rlvr-bench e2e`: the summary by hand; a step counts when its update has finished; rounds
pool; load flags a run that was not quiet; bad settings and configs are named before any run.
(Its `--quick` run's figures: test_cli_bench_subprocess.py, from `rlvr-bench all --quick`.)"""

import json
import os
import time
from pathlib import Path

import pytest

from rlvr_jax import timeline as tl
from rlvr_jax.bench import e2e, e2e_run, table
from rlvr_jax.cli import bench_main

ROOT = Path(__file__).resolve().parents[1]


def test_summary_arithmetic_by_hand():
    def run(mode, wall, rollout, train, overlap_fraction):
        return e2e.ModeRun(
            mode=mode,
            steps=4,
            wall_s=wall,
            setup_s=1.0,
            busy_s={"rollout": rollout, "train": train},
            overlap_s=0.0,
            overlap_fraction=overlap_fraction,
            split_s={"rollout": rollout, "train": train},
            reward_mean=0.5,
            tokens=100,
            staleness_mean=0.0,
        )

    r = e2e.summarize(run("sync", 8.0, 6.0, 2.0, 0.0), run("async", 6.4, 5.0, 2.0, 0.9))
    assert r["steps_per_s"] == {"sync": 0.5, "async": pytest.approx(4 / 6.4)}
    assert r["tokens_per_s"] == {"sync": 100 / 8.0, "async": pytest.approx(100 / 6.4)}
    assert r["async_over_sync"] == pytest.approx(8.0 / 6.4)
    assert r["time_s"] == {"rollout": 6.0, "train": 2.0}
    assert r["overlap_fraction"] == 0.9  # the async run's
    assert r["projected_speedup_disjoint"] == pytest.approx(8.0 / 6.0)


class FakeTrainer:
    """Records into the timeline as the real trainer's async loop does — the "step" mark right
    after dispatch, the "train" span when the update is done — with each update finishing
    0.5 s after its dispatch, and writes one metrics row per step."""

    def __init__(self, cfg, *, timeline):
        self.cfg, self.timeline = cfg, timeline

    def run(self):
        out = Path(self.cfg.train.output_dir)
        out.mkdir(parents=True)  # as the real trainer makes it
        with open(out / "metrics.jsonl", "w") as f:
            for step in range(1, self.cfg.train.max_steps + 1):
                dispatched = time.perf_counter()
                self.timeline.mark("step")
                self.timeline.add("train", dispatched, dispatched + 0.5)
                row = {"step": step, "throughput/tokens": 10 * step, "time/rollout_s": 0.1}
                f.write(json.dumps({**row, "time/train_s": 0.5, "reward/mean": 0.5}) + "\n")
                time.sleep(0.01)

    def close(self):
        pass


def test_a_modes_window_ends_when_its_last_update_has_finished(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("rlvr_jax.training.loop.Trainer", FakeTrainer)
    m = e2e.run_mode(e2e.DEFAULT_CONFIG, [], "async", steps=3, warmup=1, out=tmp_path)
    assert len(m.update_ends_s) == 4
    # the window runs from the warm-up update's end to the last update's end, not to the
    # last step's dispatch mark (0.5 s earlier)
    assert m.window_s[1] >= max(m.update_ends_s)
    assert m.window_s == pytest.approx((m.update_ends_s[0], m.update_ends_s[-1]))
    assert m.wall_s == pytest.approx(m.update_ends_s[-1] - m.update_ends_s[0])
    assert m.tokens == 20 + 30 + 40  # the timed steps' rows only
    assert m.tokens_per_s == pytest.approx(90 / m.wall_s)
    assert m.busy_s["train"] == pytest.approx(m.wall_s)  # clipped to the window
    assert len(m.loadavg) == 2


def test_timed_window_needs_every_update_finished():
    timeline = tl.Timeline()
    start = timeline.mark("start")
    timeline.add("train", start, start + 1.0)
    timeline.add("train", start + 0.5, start + 3.0)
    assert e2e_run.timed_window(timeline, warmup=1, steps=1, start=start) == (start + 1, start + 3)
    assert e2e_run.timed_window(timeline, warmup=0, steps=2, start=start) == (start, start + 3)
    with pytest.raises(RuntimeError, match="2 of 3 updates finished"):
        e2e_run.timed_window(timeline, warmup=1, steps=2, start=start)


def test_rounds_pool_as_totals_and_load_flags_quiet():
    def run(wall, tokens, load, drawn=8, stale=0):
        return e2e.ModeRun(
            mode="async", steps=2, wall_s=wall, setup_s=1.0,
            busy_s={"rollout": wall / 2, "train": wall / 4}, overlap_s=wall / 8,
            overlap_fraction=0.5, split_s={"rollout": 1.0, "train": 1.0}, reward_mean=0.25,
            tokens=tokens, staleness_mean=1.0, loadavg=load, groups_drawn=drawn,
            groups_stale=stale,
        )  # fmt: skip

    assert run(1.0, 1, (0, 0), drawn=0).stale_share == 0.0
    m = e2e_run.pool([run(2.0, 100, (0.5, 1.0), 16, 4), run(6.0, 300, (1.2, 0.9), 14, 6)])
    assert (m.groups_drawn, m.groups_stale, m.stale_share) == (30, 10, 0.25)
    assert (m.steps, m.wall_s, m.tokens, m.rounds) == (4, 8.0, 400, 2)
    assert m.steps_per_s == 0.5 and m.tokens_per_s == 50.0
    assert m.overlap_fraction == pytest.approx(1.0 / 2.0)  # 1 s of both / 2 s of train
    assert m.loadavg == (1.2, 1.0)
    loads = {"sync": (0.9, 1.4), "async": (1.0, 1.2), "trl": (1.6, 1.1)}
    q = e2e_run.quietness(loads, threshold=1.5)  # a 2-core machine's (0.75 a core)
    assert not q["quiet"] and q["load"]["quiet_by_side"]["trl"] is False
    assert q["ratios_quiet"] == {"async_over_sync": True, "async_over_trl": False}
    assert e2e_run.quietness({"sync": (0.2, 0.3), "async": (1.5, 0.1)}, threshold=1.5)["quiet"]
    assert e2e_run.quietness(loads, threshold=12.0)["quiet"]  # 16 cores: their own threads
    assert 0.75 * (os.cpu_count() or 1) == e2e_run.QUIET_LOAD
    trl = e2e.pool_trl(
        [{"status": "ok", "steps": 2, "wall_s": 4.0, "tokens": 80, "reward_mean": 0.5,
          "steps_per_s": 0.5, "tokens_per_s": 20.0, "loadavg": [1.0, 2.0]},
         {"status": "ok", "steps": 2, "wall_s": 1.0, "tokens": 20, "reward_mean": None,
          "steps_per_s": 2.0, "tokens_per_s": 20.0, "loadavg": [0.5, 0.5]}]
    )  # fmt: skip
    assert (trl["steps_per_s"], trl["tokens_per_s"], trl["reward_mean"]) == (0.8, 20.0, 0.5)
    assert trl["loadavg"] == [1.0, 2.0]
    failed = {"status": "failed", "reason": "x"}
    assert e2e.pool_trl([trl, failed]) == failed


def test_settle_waits_for_the_load_to_fall_and_gives_up_at_its_cap():
    class Fake:  # a clock that sleeping advances, and a load that decays as it does
        def __init__(self, loads):
            self.t, self.loads = 0.0, loads

        def clock(self):
            return self.t

        def sleep(self, s):
            self.t += s

        def load(self):
            return self.loads[min(int(self.t // 2), len(self.loads) - 1)]

    f = Fake([1.9, 1.6, 1.2, 0.9, 0.5])  # one reading per 2 s poll
    waited = e2e_run.settle(1.0, 60.0, load=f.load, sleep=f.sleep, clock=f.clock, poll_s=2.0)
    assert waited == 6.0 and f.load() == 0.9
    f = Fake([2.0])  # never quiet: stops at the cap, no sleep past it
    waited = e2e_run.settle(1.0, 5.0, load=f.load, sleep=f.sleep, clock=f.clock, poll_s=2.0)
    assert waited == 5.0
    f = Fake([0.3])  # already quiet: no wait
    assert e2e_run.settle(1.0, 60.0, load=f.load, sleep=f.sleep, clock=f.clock) == 0.0
    assert e2e_run.SETTLE_BELOW == 0.5 * (os.cpu_count() or 1) < e2e_run.QUIET_LOAD


def test_bad_settle_is_refused(capsys):
    for args in (["--settle", "-1"], ["--settle", "10", "--settle-below", "0"]):
        with pytest.raises(SystemExit):
            table.parse("e2e", ["--config", str(ROOT / "configs" / "demo.yaml"), *args])
        assert "--settle must be >= 0" in capsys.readouterr().err


def test_bad_config_is_named(tmp_path, capsys):
    assert bench_main(["e2e", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such file" in capsys.readouterr().err


def test_bad_override_is_named_before_any_run(capsys):
    config = str(ROOT / "configs" / "demo.yaml")
    assert bench_main(["e2e", "--config", config, "--set", "train.max_stepz=3"]) == 2
    err = capsys.readouterr().err
    assert "train.max_stepz" in err and "train.max_steps" in err


@pytest.mark.slow
def test_bench_preset_is_the_bench_model_with_256_token_completions(tmp_path, monkeypatch):
    """`--preset bench`: no active sampling, 256 new tokens, and a policy of the 56M bench
    model (random weights, the prompts' tokenizer) built where the run points model.path."""
    from rlvr_jax import models
    from rlvr_jax.bench import common

    monkeypatch.chdir(ROOT)
    path = tmp_path / "policy"
    overrides = [*e2e._MATCHED, *e2e.PRESETS["bench"], f"model.path={path}"]
    cfg = e2e.load_config(e2e.DEFAULT_CONFIG, overrides, steps=1, out=tmp_path / "out")
    assert cfg.rollout.max_new_tokens == 256 and cfg.model.hf_config is None
    # micro-batches by a token budget (as many as the kept groups need), the LM head in chunks
    assert (cfg.train.max_tokens_per_micro_batch, cfg.train.logits_chunk) == (4608, 32)
    assert cfg.train.micro_batch_size == 0
    assert not cfg.filter.active_sampling
    e2e.build_bench_policy(path, cfg)
    model = models.load_pretrained(path)
    bench = common.ModelSize().arch()
    assert model.config.n_params() == bench.n_params()
    assert 55e6 < bench.n_params() < 57e6
    assert (model.config.d_model, model.config.n_layers, model.config.vocab_size) == (512, 8, 32000)
