"""scripts/experiment_dpo_then_rl.py: its arguments, and a `--quick` run on the tiny setup (a
random policy: the numbers are not meaningful, the pipeline and its bookkeeping are)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from helpers_train import QUICK_RUNS, tiny_run

from rlvr_jax.data import synthetic

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    path = ROOT / "scripts" / "experiment_dpo_then_rl.py"
    spec = importlib.util.spec_from_file_location("experiment_dpo_then_rl", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


exp = load_script()


def test_command_line_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        exp.main(["--rl-steps", "0", "--out", str(tmp_path / "a")])
    assert "--rl-steps must be >= 1" in capsys.readouterr().err
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "results.json").write_text("{}")
    with pytest.raises(SystemExit):
        exp.main(["--out", str(tmp_path / "b")])
    assert "pass --overwrite" in capsys.readouterr().err


def test_dpo_overrides():
    got = exp.dpo_overrides(Path("p.jsonl"), batch=8, variant="ipo", beta=0.5, lr=None)
    assert got == [
        'dpo.sources=[{path: "p.jsonl"}]',
        "dpo.batch_size=8",
        "dpo.variant=ipo",
        "dpo.beta=0.5",
    ]


@pytest.mark.slow
def test_quick_run_goes_sft_pairs_dpo_rl_and_writes_the_table(tmp_path):
    cfg = tiny_run(tmp_path)
    rows = [r for r in synthetic.generate("train", 64, seed=0) if r["domain"] == "arithmetic"]
    synthetic.write_jsonl(
        [{**r, "response": f"\\boxed{{{r['ground_truth']}}}"} for r in rows], tmp_path / "sft.jsonl"
    )
    out = tmp_path / "experiment"
    argv = [
        "--config",
        str(cfg),
        "--quick",
        "--out",
        str(out),
        "--samples",
        "4",
        f"sft.sources=[{{path: {tmp_path / 'sft.jsonl'}}}]",
        "rollout.max_new_tokens=10",
        # a random policy's sampled tokens re-encode into longer text (broken bytes)
        "dpo.max_response_len=64",
        *QUICK_RUNS,
    ]
    assert exp.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["eval"]) == ["base", "strong (SFT)", "DPO", "base → RL", "DPO → RL"]
    for name, r in results["eval"].items():
        assert 0.0 <= r["pass@1"] <= r["pass@8"] <= 1.0, name
    assert results["pairs"]["pairs"] >= 2
    assert (out / "pairs.jsonl").is_file()
    assert results["budget"]["DPO"]["updates"] == 2
    assert results["budget"]["base → RL"]["updates"] == results["budget"]["DPO → RL"]["updates"]
    assert len(results["load_before"]) == 3 and len(results["load_after"]) == 3
    dpo_rows = [
        json.loads(line) for line in (out / "dpo" / "metrics.jsonl").read_text().splitlines()
    ]
    assert all("dpo/accuracy" in r for r in dpo_rows)
    assert "| DPO → RL |" in (out / "results.md").read_text()
