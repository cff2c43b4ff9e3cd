"""The loss lab (`rlvr-bench losses`): synthetic and .npz batches, the table, JSON, errors."""

import json
import math
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.bench import losses as lab
from rlvr_jax.cli import bench_main
from rlvr_jax.losses.presets import PRESETS
from rlvr_jax.losses.variants import LOSSES

SMALL = ["--groups", "2", "--group-size", "4", "--max-len", "32"]


def test_synthetic_batch_is_seeded_and_realistic():
    a = lab.synthetic_batch(seed=3, groups=4, group_size=4, max_len=64)
    b = lab.synthetic_batch(seed=3, groups=4, group_size=4, max_len=64)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    on = a["mask"] > 0
    ratio = np.exp(a["logp"] - a["old_logp"])[on]
    assert 0.005 < np.median(np.abs(ratio - 1)) < 0.05  # ratios around 1 ± a few %
    lengths = a["mask"].sum(1)
    assert len(set(lengths)) > 4 and (lengths == 0).sum() == 1  # varied, one filtered row
    stale = np.abs(a["old_logp"] - a["sampler_logp"])[on]
    assert (stale > 0.2).mean() > 0.01  # some stale tokens
    assert not (a["rewards"].reshape(4, 4).std(1) == 0).any()  # no zero-variance group


@pytest.mark.slow  # ~7 s: compiles every variant and preset once, then reuses them
def test_synthetic_batch_table_json_and_npz_round_trip(tmp_path, capsys):
    path = tmp_path / "sub" / "batch.npz"
    args = ["--seed", "0", *SMALL, "--save-synthetic", str(path)]
    assert bench_main(["losses", *args, "--json", str(tmp_path / "a.json")]) == 0
    table = capsys.readouterr().out
    for name in (*LOSSES.canonical_names(), *PRESETS.canonical_names()):
        assert re.search(rf"^{name} ", table, re.M), name  # a row of the variants or presets
    assert "grad_norm" in table and "clip_fraction" in table
    a = json.loads((tmp_path / "a.json").read_text())
    assert set(a["variants"]) == set(LOSSES.canonical_names())
    assert set(a["presets"]) == set(PRESETS.canonical_names())
    assert a["batch"]["rows"] == 8 and a["batch"]["source"] == "synthetic(seed=0)"
    for entry in (*a["variants"].values(), *a["presets"].values()):
        assert math.isfinite(entry["loss"]) and entry["grad_norm"] > 0
        assert 0.0 <= entry["clip_fraction"] <= 1.0
    # the synthetic batch is built so that clipping and TIS truncation actually act
    assert a["variants"]["ppo_clip"]["clip_fraction"] > 0
    assert a["presets"]["olmo3"]["tis/mean"] != 1.0
    # the batch saved to .npz reads back as it was and gives the same numbers
    loaded = lab.load_batch(path)
    batch = lab.synthetic_batch(seed=0, groups=2, group_size=4, max_len=32)
    assert set(loaded) == set(batch)
    for key in batch:
        np.testing.assert_array_equal(loaded[key], batch[key])
    assert bench_main(["losses", "--batch", str(path), "--json", str(tmp_path / "b.json")]) == 0
    b = json.loads((tmp_path / "b.json").read_text())
    assert a["variants"] == b["variants"] and a["presets"] == b["presets"]
    with pytest.raises(SystemExit):
        bench_main(["losses", "--batch", str(path), "--save-synthetic", str(path)])


def test_save_batch_stores_float32(tmp_path):
    logp = -jnp.ones((2, 3), jnp.bfloat16)  # a trainer's bf16 arrays
    path = lab.save_batch(
        tmp_path / "bf16.npz",
        logp=logp,
        old_logp=logp,
        sampler_logp=logp,
        advantages=jnp.array([1.0, -1.0], jnp.bfloat16),
        mask=jnp.ones((2, 3), bool),
    )
    loaded = lab.load_batch(path)
    assert loaded["logp"].dtype == np.float32 and loaded["mask"].dtype == np.bool_
    np.testing.assert_array_equal(loaded["advantages"], [1.0, -1.0])


@pytest.mark.slow
def test_lab_numbers_by_hand(tmp_path):
    """reinforce on logp = −1, A = [1, −1], two full rows of T = 4 tokens, token-mean:
    ℓ = −A·logp = A → loss (4 − 4)/8 = 0; ∂loss/∂logp = −A/8 = ∓0.125 on all 8 tokens →
    ‖g‖ = sqrt(8·0.125²) = 0.353553; |g| is constant: cv 0, max/min 1, no zero gradients."""
    logp = -np.ones((2, 4), np.float32)
    lab.save_batch(
        tmp_path / "b.npz",
        logp=logp,
        old_logp=logp,
        sampler_logp=logp,
        advantages=np.array([1.0, -1.0]),
        mask=np.ones((2, 4)),
    )
    results = lab.run_lab(lab.load_batch(tmp_path / "b.npz"), variants=["reinforce"])
    row = results["variants"]["reinforce"]
    assert row["loss"] == pytest.approx(0.0, abs=1e-7)
    assert row["grad_norm"] == pytest.approx(0.353553, rel=1e-5)
    assert row["weight_cv"] == pytest.approx(0.0, abs=1e-7)
    assert row["weight_max_over_min"] == pytest.approx(1.0)
    assert row["zero_grad_fraction"] == 0.0
    # presets run on the same batch, using the batch's advantages (no rewards given)
    assert results["presets"]["olmo3"]["note"] == "adv=batch"
    assert results["presets"]["grpo"]["note"] == "adv=batch, KL off: no ref_logp"


@pytest.mark.slow
def test_user_variant_in_the_lab(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    assert (
        bench_main(["losses", *SMALL, "--variant", "user_losses:weighted_pg", "--variant", "cispo"])
        == 0
    )
    table = capsys.readouterr().out
    assert re.search("^user_losses:weighted_pg ", table, re.M) and re.search("^cispo ", table, re.M)
    assert not re.search("^gspo_token ", table, re.M)


def _write(path, **arrays):
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return str(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mask": None}, r"missing array 'mask'"),
        ({"old_logp": np.zeros((2, 3), np.float32)}, r"array 'old_logp' has shape \(2, 3\)"),
        ({"advantages": np.zeros(3)}, r"array 'advantages' has shape \(3,\)"),
        ({"sampler_logp": np.full((2, 4), np.nan)}, r"array 'sampler_logp' has non-finite"),
        ({"logp": np.full((2, 4), 0.5)}, r"array 'logp' holds log-probs > 0"),
        ({"mask": np.full((2, 4), 2.0)}, r"array 'mask' must hold only 0 and 1"),
        ({"rewards": np.zeros(2)}, r"'rewards' and 'group_size' come together"),
        (
            {"rewards": np.zeros(2), "group_size": np.asarray(3)},
            r"'group_size' = 3 does not divide",
        ),
        ({"max_len": np.asarray(2)}, r"array 'max_len' .* >= the longest completion \(4 tokens\)"),
        ({"extra": np.zeros(2)}, r"unexpected array\(s\) extra"),
    ],
)
def test_bad_npz_errors_name_file_and_array(tmp_path, capsys, change, message):
    arrays = {
        "logp": -np.ones((2, 4), np.float32),
        "old_logp": -np.ones((2, 4), np.float32),
        "sampler_logp": -np.ones((2, 4), np.float32),
        "advantages": np.ones(2, np.float32),
        "mask": np.ones((2, 4), np.float32),
    }
    arrays.update(change)
    path = _write(tmp_path / "bad.npz", **{k: v for k, v in arrays.items() if v is not None})
    with pytest.raises(lab.BatchError, match=message) as err:
        lab.load_batch(path)
    assert str(err.value).startswith(path)
    assert bench_main(["losses", "--batch", path]) == 2
    stderr = capsys.readouterr().err
    assert path in stderr and "error" in stderr


def test_unreadable_or_missing_file(tmp_path, capsys):
    assert bench_main(["losses", "--batch", str(tmp_path / "nope.npz")]) == 2
    assert "nope.npz: no such file" in capsys.readouterr().err
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(lab.BatchError, match=r"junk.npz: not a readable .npz"):
        lab.load_batch(tmp_path / "junk.npz")
    with pytest.raises(lab.BatchError, match=r"x\.npz: missing array 'old_logp'"):
        lab.save_batch(tmp_path / "x.npz", logp=np.zeros((1, 1)))
    assert not (tmp_path / "x.npz").exists()


def test_unknown_variant_is_a_clear_error(capsys):
    assert bench_main(["losses", *SMALL, "--variant", "ppo_clp"]) == 2
    assert "did you mean 'ppo_clip'" in capsys.readouterr().err
