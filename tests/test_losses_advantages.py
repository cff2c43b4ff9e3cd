"""Advantage estimators: hand-derived values (arithmetic in the comments) and error messages."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import losses
from rlvr_jax.losses.registry import RegistryError

# Two groups of G = 4: a binary group and a spread-out one.
REWARDS_PxG = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 2.0, 5.0]], np.float32)


def test_grpo_group_zscore_unbiased_std():
    # group 0: mean 0.5, deviations ±0.5, unbiased var = 4·0.25/3 = 1/3, std = 0.577350
    #          A = ±0.5 / (0.577350 + 1e-6) = ±0.866024
    # group 1: mean 2, deviations [-2, -1, 0, 3], var = (4+1+0+9)/3 = 14/3, std = 2.160247
    #          A = [-0.925820, -0.462910, 0, 1.388730]
    adv = losses.advantages("grpo", REWARDS_PxG)
    np.testing.assert_allclose(
        adv,
        [[0.866024, -0.866024, -0.866024, 0.866024], [-0.925820, -0.462910, 0.0, 1.388730]],
        rtol=1e-5,
    )


def test_grpo_constant_group_and_single_sample_give_zero():
    # all-equal group: 0 / (0 + ε) = 0; G = 1: no group to compare with, A = 0 (not NaN)
    np.testing.assert_array_equal(losses.advantages("grpo", [[3.0, 3.0, 3.0]]), [[0, 0, 0]])
    np.testing.assert_array_equal(losses.advantages("grpo", [[1.0], [0.0]]), [[0.0], [0.0]])


@pytest.mark.parametrize("name", ["drgrpo", "olmo"])
def test_drgrpo_and_olmo_are_mean_centred(name):
    # R − mean_g R: group 0 mean 0.5, group 1 mean 2
    np.testing.assert_allclose(
        losses.advantages(name, REWARDS_PxG),
        [[0.5, -0.5, -0.5, 0.5], [-2.0, -1.0, 0.0, 3.0]],
        rtol=1e-6,
    )


def test_rloo_matches_leave_one_out_baseline():
    # G/(G−1)·(R − mean) = 4/3·[[.5,-.5,-.5,.5],[-2,-1,0,3]]; e.g. R=5 vs mean(0,1,2) = 1 → 4
    expected = [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [-8 / 3, -4 / 3, 0.0, 4.0]]
    adv = losses.advantages("rloo", REWARDS_PxG)
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    # independent loop: R_i minus the mean of the other G−1 rewards
    loop = [[r[i] - np.delete(r, i).mean() for i in range(len(r))] for r in REWARDS_PxG]
    np.testing.assert_allclose(adv, loop, rtol=1e-6)
    np.testing.assert_array_equal(losses.advantages("rloo", [[1.0], [0.0]]), [[0.0], [0.0]])


def test_reinforce_pp_baseline_whitens_over_batch():
    # A' = [.5,-.5,-.5,.5,-2,-1,0,3], batch mean 0, unbiased var = (4·.25 + 4+1+0+9)/7 = 15/7
    # std = 1.463850; A = A'/(std + 1e-6)
    adv = losses.advantages("reinforce_pp_baseline", REWARDS_PxG)
    np.testing.assert_allclose(
        adv,
        [[0.341565, -0.341565, -0.341565, 0.341565], [-1.366259, -0.683130, 0.0, 2.049389]],
        rtol=1e-5,
    )


def test_reinforce_raw_or_minus_batch_mean():
    np.testing.assert_allclose(losses.advantages("reinforce", REWARDS_PxG), REWARDS_PxG)
    # batch mean = (2 + 8)/8 = 1.25
    np.testing.assert_allclose(
        losses.advantages("reinforce", REWARDS_PxG, subtract_batch_mean=True),
        REWARDS_PxG - 1.25,
    )


def test_advantages_jit_and_user_estimator(monkeypatch):
    jitted = jax.jit(lambda r: losses.advantages("olmo", r))
    np.testing.assert_allclose(
        jitted(REWARDS_PxG), REWARDS_PxG - REWARDS_PxG.mean(1, keepdims=True)
    )
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # tests/user_losses.py
    # user_losses:median_baseline: group 1 median of (0,1,2,5) = 1.5
    adv = losses.advantages("user_losses:median_baseline", REWARDS_PxG)
    np.testing.assert_allclose(adv[1], [-1.5, -0.5, 0.5, 3.5])


def test_advantage_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"\[P, G\]"):
        losses.advantages("grpo", np.zeros(4))
    with pytest.raises(RegistryError, match="did you mean 'grpo'"):
        losses.advantages("grp", REWARDS_PxG)
    with pytest.raises(ValueError, match="returned shape"):
        losses.advantages(lambda r: r[:, 0], REWARDS_PxG)
    assert losses.get_advantage("olmo") is losses.get_advantage("drgrpo")


@pytest.mark.parametrize("name", ["grpo", "olmo", "rloo", "reinforce_pp_baseline", "reinforce"])
def test_host_rewards_stay_on_the_host_and_device_rewards_on_device(name):
    """NumPy rewards (the rollout source's) give NumPy advantages — no XLA program per new
    group count — equal to the jax path's; jax rewards give a jax array."""
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.5]], np.float32)
    host = losses.advantages(name, rewards)
    device = losses.advantages(name, jnp.asarray(rewards))
    assert type(host) is np.ndarray and host.dtype == np.float32
    assert isinstance(device, jax.Array)
    np.testing.assert_allclose(host, np.asarray(device), rtol=1e-6, atol=1e-6)
    assert type(losses.advantages(name, rewards.tolist())) is np.ndarray
