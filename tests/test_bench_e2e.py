"""`rlvr-bench e2e --quick`: both modes run, the figures are consistent with each other."""

import json
from pathlib import Path

import pytest

from rlvr_jax.bench import e2e

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
    assert r["async_over_sync"] == pytest.approx(8.0 / 6.4)
    assert r["time_s"] == {"rollout": 6.0, "train": 2.0}
    assert r["overlap_fraction"] == 0.9  # the async run's
    assert r["projected_speedup_disjoint"] == pytest.approx(8.0 / 6.0)


@pytest.mark.slow
def test_quick_run_writes_consistent_json_and_plot(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the demo config's data paths are relative to the repository
    out, png = tmp_path / "e2e.json", tmp_path / "e2e.png"
    args = ["--quick", "--json", str(out), "--plot", str(png), "--set", "seed=1"]
    args += ["--set", "filter.zero_variance=false"]  # active sampling is off: train every group
    code = e2e.main(args)
    assert code == 0
    r = json.loads(out.read_text())
    trl_ok = r["peers"]["trl"]["status"] == "ok"
    assert set(r["steps_per_s"]) == ({"sync", "async", "trl"} if trl_ok else {"sync", "async"})
    assert r["config"]["preset"] == "demo"
    assert r["ratios"]["async_over_sync"] == r["async_over_sync"]
    if trl_ok:
        ratio = r["steps_per_s"]["async"] / r["steps_per_s"]["trl"]
        assert r["ratios"]["async_over_trl"] == pytest.approx(ratio)
    else:
        assert r["ratios"]["async_over_trl"] is None
    assert "filter.active_sampling=false" in r["config"]["overrides"]
    for mode in ("sync", "async"):
        m = r["modes"][mode]
        assert m["steps"] == 2 and m["wall_s"] > 0 and m["tokens"] > 0
        assert m["steps_per_s"] == pytest.approx(2 / m["wall_s"])
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
    assert r["config"]["quick"] and "seed=1" in r["config"]["overrides"]
    assert r["peers"]["trl"]["status"] in ("skipped", "ok")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "async / sync steps/s" in capsys.readouterr().out


def test_bad_config_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        e2e.main(["--config", str(tmp_path / "missing.yaml")])
    assert "missing.yaml: no such file" in capsys.readouterr().err


def test_bad_override_is_named_before_any_run(capsys):
    config = str(ROOT / "configs" / "demo.yaml")
    with pytest.raises(SystemExit):
        e2e.main(["--config", config, "--set", "train.max_stepz=3"])
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
    assert (cfg.train.micro_batch_size, cfg.train.logits_chunk) == (16, 32)
    assert not cfg.filter.active_sampling
    e2e.build_bench_policy(path, cfg)
    model = models.load_pretrained(path)
    bench = common.bench_arch()
    assert model.config.n_params() == bench.n_params()
    assert 55e6 < bench.n_params() < 57e6
    assert (model.config.d_model, model.config.n_layers, model.config.vocab_size) == (512, 8, 32000)
