"""scripts/experiment_rl_vs_sft.py: its arms and budgets, its table, and a `--quick` run on the
tiny setup (a random policy: the numbers are not meaningful, the bookkeeping is)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from helpers_train import QUICK_RUNS, tiny_run

from rlvr_jax.data import synthetic

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    path = ROOT / "scripts" / "experiment_rl_vs_sft.py"
    spec = importlib.util.spec_from_file_location("experiment_rl_vs_sft", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


exp = load_script()


def test_arms_split_the_same_update_budget():
    for steps in (2, 7, 40):
        for arm in exp.ARMS:
            phases = exp.arm_phases(arm, steps)
            assert sum(p.steps for p in phases) == steps, (arm, steps)
    assert [(p.algorithm, p.steps) for p in exp.arm_phases("sft_then_rl", 7)] == [
        ("sft", 3),
        ("rl", 4),
    ]
    assert [p.algorithm for p in exp.arm_phases("parallel", 2)] == ["rl_sft_parallel"]
    with pytest.raises(ValueError, match="unknown arm 'dpo'"):
        exp.arm_phases("dpo", 2)


def test_sft_defaults_yield_to_user_overrides():
    assert exp.base_overrides(["seed=1"], 8) == [
        "sft.synthetic_reference=true",
        "sft.batch_size=8",
        "seed=1",
    ]
    # the user's batch size and reference setting win (later overrides replace earlier ones)
    user = ["sft.batch_size=3", "sft.synthetic_reference=false"]
    assert exp.base_overrides(user, 8) == ["sft.synthetic_reference=true", *user]


def test_command_line_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        exp.main(["--steps", "1", "--out", str(tmp_path)])
    assert "--steps must be >= 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        exp.main(["--arms", "rl,dpo", "--out", str(tmp_path)])
    assert "unknown ['dpo']" in capsys.readouterr().err
    (tmp_path / "rl").mkdir()
    with pytest.raises(SystemExit):
        exp.main(["--arms", "rl", "--out", str(tmp_path)])
    assert "pass --overwrite" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_run_trains_each_recipe_from_the_base_and_writes_the_table(tmp_path):
    cfg = tiny_run(tmp_path)
    # SFT examples with a short response (the parity rows of tiny_run are not synthetic)
    rows = [r for r in synthetic.generate("train", 64, seed=0) if r["domain"] == "arithmetic"]
    synthetic.write_jsonl(
        [{**r, "response": f"\\boxed{{{r['ground_truth']}}}"} for r in rows], tmp_path / "sft.jsonl"
    )
    out = tmp_path / "experiment"
    # sft_then_rl runs the `sft` and `rl` arms' recipes one after the other
    argv = [
        "--config",
        str(cfg),
        "--quick",
        "--out",
        str(out),
        "--arms",
        "sft_then_rl,parallel",
        f"sft.sources=[{{path: {tmp_path / 'sft.jsonl'}}}]",
        "rollout.max_new_tokens=10",
        *QUICK_RUNS,
    ]
    assert exp.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["arms"]) == ["base", "sft_then_rl", "parallel"]
    base = results["base_model"]
    prompts_per_batch, samples = 2, 4  # tiny_run: train.prompts_per_batch, rollout.num_samples
    for name, arm in results["arms"].items():
        assert 0.0 <= arm["pass@1"] <= arm["pass@8"] <= 1.0, name
        assert arm["prompts"] == results["arms"]["base"]["prompts"] > 0
        assert set(arm["per_domain"]) == set(results["arms"]["base"]["per_domain"])
    sft_rl = results["arms"]["sft_then_rl"]
    assert [(r["algorithm"], r["steps"]) for r in sft_rl["runs"]] == [("sft", 1), ("rl", 1)]
    assert sft_rl["runs"][0]["from"] == base  # the same base checkpoint for every arm
    assert sft_rl["runs"][1]["from"] == sft_rl["runs"][0]["to"]  # RL continues from the SFT policy
    assert sft_rl["budget"]["sft_examples"] == prompts_per_batch  # sft.batch_size follows it
    parallel = results["arms"]["parallel"]
    assert parallel["runs"][0]["from"] == base
    assert parallel["budget"]["sft_examples"] == 2 * prompts_per_batch
    for arm in (sft_rl, parallel):
        budget = arm["budget"]
        assert budget["updates"] == 2  # equal update budgets
        assert budget["rl_completions"] == samples * budget["rl_prompts"]
        assert budget["rl_prompts"] >= prompts_per_batch * (1 if arm is sft_rl else 2)
    table = (out / "results.md").read_text()
    for name in ("| base |", "| sft_then_rl |", "| parallel |", "pass@8"):
        assert name in table
    assert (out / "parallel" / "run" / "metrics.jsonl").is_file()
