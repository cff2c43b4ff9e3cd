"""The dry-run plan accounts for packing: with `train.max_tokens_per_micro_batch` the learner's
activation and attention estimates are those of the packed rows that budget holds, counted as
the trainer's packer counts them (`packing.budget_rows`)."""

from pathlib import Path

import pytest

from rlvr_jax import plan
from rlvr_jax.config import load
from rlvr_jax.training import packing

ROOT = Path(__file__).resolve().parents[1]
TPU = str(ROOT / "configs" / "olmo3_7b_think_rl_tpu.yaml")
GiB = 1024**3
T = 2048 + 32768  # max_prompt_len + max_new_tokens of the TPU config


def _plan(*overrides: str) -> plan.Plan:
    return plan.make_plan(load(TPU, list(overrides)))


def test_tpu_config_packs_one_full_row_per_learner_chip_and_fits():
    p = _plan()
    # 557,072 tokens = 16 rows of 34,817 (before the shift) over fsdp 16: one row per chip
    assert p.micro_batch.startswith("16 packed rows x 34816 positions")
    # per token and layer (12·4096 + 3·11008) bf16 values; remat keeps the layer inputs of
    # the 32 layers plus one layer; the LM head 2048 positions × V fp32, twice
    layer = (12 * 4096 + 3 * 11008) * 2 * T
    logits = 2048 * 100278 * 4 * 2
    assert p.learner_bytes["activations"] == 32 * 4096 * 2 * T + layer + logits
    assert p.learner_bytes["attention"] == 32 * T * 4  # splash: one layer's log-sum-exp
    assert p.fits and p.learner_total < 0.3 * 95 * GiB
    assert "learner micro-batch: 16 packed rows" in plan.format_plan(p)


def test_the_budget_sets_the_rows_not_micro_batch_size():
    """Twice the budget: two rows per chip, every per-micro-batch estimate doubles (each is
    linear in the rows per device)."""
    one = _plan()
    two = _plan(f"train.max_tokens_per_micro_batch={32 * (T + 1)}")
    assert two.micro_batch.startswith("32 packed rows")
    for key in ("activations", "attention"):
        assert two.learner_bytes[key] == pytest.approx(2 * one.learner_bytes[key])
    # rows are whole multiples of the 16 learner devices: 47 rows' worth is still 32 rows
    assert _plan(f"train.max_tokens_per_micro_batch={47 * (T + 1)}").learner_bytes == (
        two.learner_bytes
    )
    unpacked = _plan("train.max_tokens_per_micro_batch=0", "train.micro_batch_size=32")
    assert unpacked.learner_bytes == two.learner_bytes
    assert unpacked.micro_batch == f"32 rows x {T} positions, one sequence per row"


def test_shorter_rows_hold_more_of_them():
    """At 16K positions the same budget holds 32 rows (two per chip): the estimate is that of
    32 rows of 16K, not of 16 rows."""
    short = _plan("rollout.max_new_tokens=14336")
    assert short.micro_batch.startswith("32 packed rows x 16384 positions")
    assert packing.budget_rows(557072, row_len=16385, row_multiple=16) == 32
    unpacked = _plan("rollout.max_new_tokens=14336", "train.max_tokens_per_micro_batch=0")
    for key in ("activations", "attention"):
        assert short.learner_bytes[key] == pytest.approx(2 * unpacked.learner_bytes[key])


def test_a_budget_below_one_row_per_device_is_a_named_error():
    with pytest.raises(plan.PlanError, match=r"train\.max_tokens_per_micro_batch=500000 holds no"):
        _plan("train.max_tokens_per_micro_batch=500000")
