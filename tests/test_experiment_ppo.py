"""scripts/experiment_ppo_vs_grpo.py: its sample accounting, its command line, and a `--quick`
run on the tiny setup (a random policy: the numbers are not meaningful, the bookkeeping is)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from helpers_train import QUICK_RUNS, tiny_run

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    path = ROOT / "scripts" / "experiment_ppo_vs_grpo.py"
    spec = importlib.util.spec_from_file_location("experiment_ppo_vs_grpo", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


exp = load_script()


def test_the_equal_sample_budget_by_hand():
    # (samples generated, drawn and stale-dropped groups × G: tests/test_experiment_harness.py)
    # 88 samples at 2 prompts × 8 per update: ⌈88 / 16⌉ = 6 updates
    assert exp.ppo_steps(88, 2, 8) == 6
    assert exp.ppo_steps(96, 2, 8) == 6
    assert exp.ppo_steps(0, 2, 8) == 1


def test_command_line_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        exp.main(["--arms", "grpo,dpo", "--out", str(tmp_path)])
    assert "unknown ['dpo']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        exp.main(["--arms", "ppo", "--out", str(tmp_path)])
    assert "give --ppo-steps" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        exp.main(["--seeds", "a,b", "--out", str(tmp_path)])
    assert "--seeds" in capsys.readouterr().err
    (tmp_path / "grpo").mkdir()
    with pytest.raises(SystemExit):
        exp.main(["--arms", "grpo", "--out", str(tmp_path)])
    assert "pass --overwrite" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_run_gives_ppo_the_samples_of_grpo(tmp_path):
    cfg = tiny_run(tmp_path)
    out = tmp_path / "experiment"
    argv = ["--config", str(cfg), "--quick", "--out", str(out), "--arms", "grpo,ppo_shared"]
    argv += ["--probe", "ifeval"]  # tiny_run trains on `parity` rows: nothing to drop
    assert exp.main([*argv, *QUICK_RUNS]) == 0
    results = json.loads((out / "results.json").read_text())
    runs = results["seeds"]["0"]
    assert list(runs) == ["grpo", "ppo_shared"]
    batch = 2 * 4  # tiny_run: 2 prompts × 4 samples per update
    grpo, ppo = runs["grpo"], runs["ppo_shared"]
    assert grpo["updates"] == 2 and grpo["samples"] >= 2 * batch
    # equal samples: PPO trains on every drawn group, ⌈grpo samples / batch⌉ updates
    assert ppo["updates"] == -(-grpo["samples"] // batch)
    assert grpo["samples"] <= ppo["samples"] < grpo["samples"] + batch
    assert ppo["trained_groups"] * 4 == ppo["samples"]
    assert len(ppo["curve"]["value/explained_variance"]) == ppo["updates"]
    for r in (results["base"], grpo, ppo):
        assert 0.0 <= r["pass@1"] <= r["pass@8"] <= 1.0
    table = (out / "results.md").read_text()
    assert "| ppo_shared | 0 |" in table
    assert "ifeval (probe) pass@32" in table and "| ppo_shared − grpo |" in table
    assert results["probe"] == "ifeval" and "data.sources=" in grpo["runs"][0]["command"]
    assert (out / "ppo_vs_grpo.png").stat().st_size > 10_000
