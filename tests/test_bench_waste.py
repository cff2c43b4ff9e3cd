"""`rlvr-bench waste`: slot-step counts by hand, the clipped log-normal, the OLMo 3 regime.
(The engine's measured waste against the simulation of the same lengths: its `--quick` run in
test_cli_bench_subprocess.py.)"""

import math

import numpy as np
import pytest

from rlvr_jax.bench import table, waste
from rlvr_jax.bench.waste import (
    LengthDistribution,
    continuous_steps,
    static_steps,
    wastes,
)


def test_two_requests_two_slots_by_hand():
    # one batch of [1, 3] holds both slots for 3 steps: 6 slot-steps, 4 useful
    assert static_steps([1, 3], 2) == 3
    # continuous: nothing waits, so the short slot idles through the same drain
    assert wastes([1, 3], 2) == pytest.approx({"static_waste": 1 - 4 / 6,
                                               "continuous_waste": 1 - 4 / 6})  # fmt: skip


def test_refill_removes_the_waste_of_waiting_for_the_longest():
    # static: batches [1, 3] (2 slots x 3 steps) and [2] (2 x 2): 10 slot-steps, 6 useful
    assert static_steps([1, 3, 2], 2) == 5
    # continuous: slot a runs 1 then 2 (ends at step 3), slot b runs 3: 2 x 3, no waste
    assert continuous_steps([1, 3, 2], 2) == 3
    # static [4, 1], [1, 1], [1]: 2x4 + 2x1 + 2x1 = 12 for 8 useful; continuous: a=4, b=1+1+1+1
    assert wastes([4, 1, 1, 1, 1], 2) == pytest.approx({"static_waste": 1 - 8 / 12,
                                                        "continuous_waste": 0.0})  # fmt: skip
    # more slots than requests: all B slots count; 4 x 5 = 20 slot-steps for 7 tokens
    assert static_steps([2, 5], 4) == 5 == continuous_steps([2, 5], 4)
    assert wastes([2, 5], 4)["static_waste"] == pytest.approx(1 - 7 / 20)
    # one slot never waits for anyone
    assert wastes([5, 1, 7], 1) == {"static_waste": 0.0, "continuous_waste": 0.0}


def test_continuous_never_wastes_more_than_static():
    lengths = np.random.default_rng(3).integers(1, 100, 300)
    for b in (1, 3, 8, 32):
        assert continuous_steps(lengths, b) <= static_steps(lengths, b)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="slots must be >= 1"):
        static_steps([1], 0)
    with pytest.raises(ValueError, match="positive token counts"):
        continuous_steps([3, 0], 2)
    with pytest.raises(ValueError, match="non-empty"):
        static_steps([], 2)
    with pytest.raises(ValueError, match=r"mean length must be in \(0, cap=100\)"):
        LengthDistribution.fit(mean=150, cap=100, sigma=0.5)
    with pytest.raises(ValueError, match="sigma > 0"):
        LengthDistribution(1.0, 0.0, 10)


def test_fitted_distribution_has_the_asked_mean_and_its_samples_agree():
    dist = LengthDistribution.fit(mean=14_700, cap=32_768, sigma=0.7)
    assert dist.mean() == pytest.approx(14_700, rel=1e-9)
    x = dist.sample(400_000, seed=1)
    assert x.min() >= 1 and x.max() == 32_768
    # Monte Carlo of the closed form (+0.5: lengths are rounded up to whole tokens)
    assert x.mean() == pytest.approx(14_700 + 0.5, rel=5e-3)
    assert (x == 32_768).mean() == pytest.approx(dist.clipped_fraction(), abs=3e-3)
    # without a cap the mean is the log-normal's own e^(mu + sigma^2/2)
    free = LengthDistribution(2.0, 0.5, 10**12)
    assert free.mean() == pytest.approx(math.exp(2.0 + 0.125), rel=1e-9)


def test_scaling_keeps_the_shape():
    dist = LengthDistribution.fit(mean=14_700, cap=32_768, sigma=0.7)
    small = dist.scaled(64)
    # E[min(cX, c cap)] = c E[min(X, cap)] with c = 64 / 32768
    assert small.mean() == pytest.approx(14_700 * 64 / 32_768, rel=1e-9)
    assert small.clipped_fraction() == pytest.approx(dist.clipped_fraction(), rel=1e-9)
    assert small.sigma == dist.sigma and small.cap == 64


def test_olmo3_regime_reproduces_the_reported_static_waste():
    dist = LengthDistribution.fit(mean=14_700, cap=32_768, sigma=0.7)
    sim = waste.simulate(dist, requests=4096, slots=64, sweep=(1, 8, 256), seed=0)
    assert 0.45 <= sim["static_waste"] <= 0.62  # OLMo 3 reports up to 54%
    # at B = 64 almost every batch holds a truncated response: waste -> 1 - mean/cap
    assert sim["static_waste"] == pytest.approx(sim["one_minus_mean_over_cap"], abs=0.01)
    assert sim["continuous_waste"] < 0.05
    assert sim["by_slots"]["1"]["static_waste"] == 0.0
    assert sim["by_slots"]["8"]["static_waste"] < sim["by_slots"]["64"]["static_waste"]


def test_main_rejects_bad_sizes(capsys):
    with pytest.raises(SystemExit) as e:
        table.parse("waste", ["--quick", "--measured-slots", "0"])
    assert e.value.code == 2
    assert "measured_slots must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        table.parse("waste", ["--quick", "--mean", "40000"])
    assert "mean must be in (0, cap=32768)" in capsys.readouterr().err
