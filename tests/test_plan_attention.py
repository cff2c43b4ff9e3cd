"""The dry-run plan accounts for the attention kernel `model.attention_impl` picks on the
planned hardware (`rlvr_jax.plan`, attention part)."""

from pathlib import Path

import pytest

from rlvr_jax import plan
from rlvr_jax.config import load

ROOT = Path(__file__).resolve().parents[1]
TPU = str(ROOT / "configs" / "olmo3_7b_think_rl_tpu.yaml")
GiB = 1024**3


def _plan(*overrides: str) -> plan.Plan:
    return plan.make_plan(load(TPU, list(overrides)))


def test_tpu_config_plans_splash_attention():
    p = _plan()
    assert p.attention == "splash"
    # one row of 2048 + 32768 tokens per device (16 rows over fsdp 16), 32 heads, remat:
    # one layer's fp32 log-sum-exp, 1 × 32 × 34816 × 4 B
    assert p.learner_bytes["attention"] == 32 * 34816 * 4
    assert p.fits
    assert "learner attention: splash" in plan.format_plan(p)


def test_materialised_masks_do_not_fit_at_32k():
    """The reference path at 34.8K tokens: [T, T] masks (full + sliding) and one layer's
    32 × T × T fp32 probabilities per row — ~150 GiB, far past 95 GiB."""
    p = _plan("model.attention_impl=xla")
    t = 34816
    assert p.learner_bytes["attention"] == 2 * t * t + 32 * t * t * 4
    assert p.learner_bytes["attention"] > 100 * GiB and not p.fits
    chunked = _plan("model.attention_impl=xla", "train.attn_chunk=2048")
    assert chunked.learner_bytes["attention"] == 2 * t * t + 32 * 2048 * t * 4


def test_blockwise_is_linear_in_t():
    """Per token and row: one layer's log-sum-exp (remat) 32 × 4 B plus the fp32 dQ
    accumulator 32 × 128 × 4 B; the 512 × 512 tiles are a constant."""
    one_row = "train.max_tokens_per_micro_batch=0"  # 16 rows (1 per chip) at both lengths
    short = _plan("model.attention_impl=blockwise", "rollout.max_new_tokens=14336", one_row)
    long = _plan("model.attention_impl=blockwise", one_row)
    assert (short.attention, long.attention) == ("blockwise", "blockwise")
    slope = (long.learner_bytes["attention"] - short.learner_bytes["attention"]) / (34816 - 16384)
    assert slope == pytest.approx(32 * 4 + 32 * 128 * 4)
    assert long.learner_bytes["attention"] == pytest.approx(34816 * slope + 32 * 4 * 512 * 512 * 4)


def test_explicit_kernel_that_cannot_run_is_a_named_error():
    with pytest.raises(plan.PlanError, match=r"model\.attention_impl=cudnn needs an NVIDIA GPU"):
        _plan("model.attention_impl=cudnn")


@pytest.mark.parametrize("packed", [False, True])
def test_gpu_plan_resolves_cudnn_with_the_batch_layout_declared(packed):
    """`auto` on an H100 in bf16 needs the rows' segment bound: one sequence per row, or
    `packing.MAX_SEQS_PER_ROW` when packed (the learner passes the same bound)."""
    gpu = str(ROOT / "configs" / "qwen_7b_rl_gpu_vllm.yaml")
    budget = "train.max_tokens_per_micro_batch=" + ("65536" if packed else "0")
    p = plan.make_plan(load(gpu, ["model.attention_impl=auto", budget]))
    assert p.attention == "cudnn"
