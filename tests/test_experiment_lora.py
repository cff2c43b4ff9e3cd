"""scripts/experiment_lora.py: an arm's costs from its metrics rows, plan and checkpoint (by
hand), and the cost table with shares of the full arm. Needs the experiment harness
(scripts/experiment_common.py)."""

import sys
from pathlib import Path

import pytest

from rlvr_jax.config import load

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
pytest.importorskip("experiment_common", reason="needs the experiment harness")
import experiment_lora as exp  # noqa: E402


def test_costs_by_hand_and_the_table(tmp_path):
    rows = [
        {"time/train_s": 9.0, "push/bytes": 100.0, "tis/mean": 1.0},  # compiles: no median
        {"time/train_s": 1.0, "push/bytes": 300.0, "push/seconds": 0.5, "tis/mean": 0.5},
        {"time/train_s": 3.0},
        {"time/train_s": 2.0},
    ]
    for step, sizes in (("step_000001", [7]), ("step_000002", [10, 20])):
        d = tmp_path / "checkpoints" / step / "adapters"
        d.mkdir(parents=True)
        for i, n in enumerate(sizes):
            (d / f"f{i}").write_bytes(b"x" * n)
    full_cfg = load("configs/demo.yaml")
    lora_cfg = load("configs/demo.yaml", ["model.lora.rank=8"])
    got = exp.costs(lora_cfg, rows, tmp_path)
    full = exp.costs(full_cfg, rows, tmp_path)
    assert got["step_s"] == 2.0  # median of 1, 3, 2
    assert got["push_bytes"] == 200.0 and got["push_seconds"] == 0.5 and got["tis_mean"] == 0.75
    assert got["kl_sampler_learner"] is None
    assert got["checkpoint_bytes"] == 30  # the last checkpoint only
    assert 0 < got["optimizer_bytes"] <= 0.05 * full["optimizer_bytes"]  # issue 23's bar

    table = exp.cost_table({"base": {"pass@1": 0.1}, "full": full, "lora8": got})
    lines = table.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| full |")  # header, rule, full, lora8
    share = got["optimizer_bytes"] / full["optimizer_bytes"]
    assert f"({share:.1%})" in lines[3] and "| — |" in lines[3]  # no kl measured
    assert "| 2 | 200 (100.0%) | 0.5 |" in lines[3]  # step s, push bytes, push s
