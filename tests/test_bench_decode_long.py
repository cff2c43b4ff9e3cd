"""`rlvr-bench decode --workload long`: the length shape, and a quick run of the installed
console script whose JSON keys (the ones scripts read) and figures are checked against each
other."""

import json

import helpers_cli as C
import numpy as np
import pytest

from rlvr_jax.bench import decode_long


def test_lognormal_lengths_have_olmo3s_mean_over_max_and_hit_the_cap():
    lengths = np.array(decode_long.lognormal_lengths(64, 4096, 0.45, 0.8, seed=0))
    assert lengths.max() == 4096 and lengths.min() >= 1
    assert lengths.mean() / 4096 == pytest.approx(0.45, abs=0.01)
    assert np.median(lengths) < lengths.mean()  # long-tailed
    with pytest.raises(ValueError, match="mean/max"):
        decode_long.lognormal_lengths(64, 4096, 1.2, 0.8, seed=0)


def test_fit_line_recovers_a_line():
    points = {str(f): {"live_tokens": 1000 * f, "ms_per_step": 5 + 2 * f} for f in (1, 2, 4)}
    fit = decode_long.fit_line(points)
    assert fit["intercept_ms"] == pytest.approx(5)
    assert fit["ms_per_1k_live_tokens"] == pytest.approx(2)
    assert fit["r2"] == pytest.approx(1)


@pytest.mark.slow
def test_quick_long_run_writes_the_keys_scripts_read(tmp_path):
    out = tmp_path / "long.json"
    args = ["decode", "--workload", "long", "--quick", "--json", str(out)]
    proc = C.Proc("rlvr-bench", args, tmp_path)
    assert proc.wait(300) == 0, proc.stderr()[-3000:]
    assert "rlvr-bench decode [" in proc.stderr() and "interleaved" in proc.stderr()  # progress
    long = json.loads(out.read_text())["long"]
    layouts = {"paged", "contiguous"}
    for key in ("tokens_per_s", "kv_bytes", "mean_concurrent"):
        assert set(long[key]) == layouts and all(v > 0 for v in long[key].values())
    # the same KV memory (the pool rounds up to whole pages of the shard)
    kv = long["kv_bytes"]
    assert kv["contiguous"] <= kv["paged"] <= kv["contiguous"] * 1.02
    assert 0 < long["kv_utilisation"] <= 1 and long["preemptions"] >= 0
    work = long["workload"]
    assert work["generated_tokens"] == sum(work["lengths"]) and max(work["lengths"]) == 96
    # more sequences share the paged pool than the contiguous rows it replaces
    assert long["mean_concurrent"]["paged"] > long["mean_concurrent"]["contiguous"]
    fills = ["0.125", "0.25", "0.5", "0.75", "1.0"]
    assert (
        list(long["step_ms_at_fill"]) == fills
        and list(long["step_ms_at_fill_fewer_slots"]) == fills
    )
    sweep = long["step_ms_at_fill_fewer_slots_by_layout"]["paged"]
    slots = work["paged_slots"]
    assert [p["live_slots"] for p in sweep.values()] == [round(float(f) * slots) for f in fills]
    all_live = long["step_ms_at_fill_by_layout"]["paged"]
    assert {p["live_slots"] for p in all_live.values()} == {slots}
    assert all_live["1.0"]["live_tokens"] <= work["pool_tokens"]
    ratios = long["ratios"]
    assert ratios["paged_over_contiguous_tokens_per_s"] == pytest.approx(
        long["tokens_per_s"]["paged"] / long["tokens_per_s"]["contiguous"]
    )
    assert ratios["step_ms_quarter_over_full"] == pytest.approx(
        long["step_ms_at_fill"]["0.25"] / long["step_ms_at_fill"]["1.0"]
    )
