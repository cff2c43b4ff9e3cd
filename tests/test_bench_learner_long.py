"""`rlvr-bench learner --workload long`: OLMo 3's length shape scaled to the cap, the same
samples laid out padded (one per row) and packed (the trainer's `collate_packed`), and a real
tiny run whose figures are checked against each other."""

import json

import numpy as np
import pytest

from rlvr_jax.bench import learner_long as long
from rlvr_jax.cli import bench_main


def test_lengths_are_olmo3_shaped_and_scaled_to_the_cap():
    assert long.OLMO3.mean() / long.OLMO3.cap == pytest.approx(14_700 / 32_768, rel=1e-6)
    work = long.LongWorkload(cap=1024, completions=32, micro_rows=8)
    dist = work.lengths()
    assert dist.sigma == long.OLMO3.sigma and dist.cap == 1024 - 64  # room after a 64-token prompt
    assert dist.mean() / dist.cap == pytest.approx(long.OLMO3.mean() / long.OLMO3.cap, rel=1e-6)
    batch = long.samples(work, vocab=512)
    assert len(batch) == 32
    assert all(16 <= len(s.prompt_tokens) <= 64 and 1 <= len(s.tokens) <= 960 for s in batch)


def test_packed_and_padded_hold_the_same_samples():
    work = long.LongWorkload(cap=1024, completions=32, micro_rows=8)
    batch = long.samples(work, vocab=512)
    out = long.layouts(work, batch)
    padded, n_micro = out["padded"]
    packed, none = out["packed"]
    assert n_micro == 4 and none is None
    assert padded.tokens.rows == 32 and padded.tokens.length == 1024
    # the same completion tokens trained on; packed rows hold ~2 of OLMo 3's completions each
    assert packed.mask_BxT.sum() == padded.mask_BxT.sum() == sum(len(s.tokens) for s in batch)
    assert packed.tokens.length == 1024 and packed.tokens.rows <= 16
    assert packed.tokens.rows % packed.n_micro == 0
    assert packed.tokens.rows // packed.n_micro <= 8  # the budget: 8 full rows per micro-batch
    useful = sum(len(s.prompt_tokens) + len(s.tokens) for s in batch)
    # every token sits in a segment (a row's last token only as a target: shifted grid)
    in_segments = int((packed.tokens.segment_ids_BxT > 0).sum())
    assert useful - packed.tokens.rows <= in_segments <= useful


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="micro_rows"):
        long.LongWorkload(cap=1024, completions=30, micro_rows=8)
    with pytest.raises(ValueError, match="--long-cap"):
        long.LongWorkload(cap=64)
    assert bench_main(["learner", "--quick", "--workload", "long", "--long-cap", "64"]) == 2


@pytest.mark.slow  # ~1 min: two train steps and two attention-memory compiles of the quick model
def test_quick_long_workload_reports_consistent_figures(tmp_path, capsys):
    out, png = tmp_path / "long.json", tmp_path / "long.png"
    argv = ["--quick", "--workload", "long", "--long-cap", "256", "--batch", "16",
            "--n-micro", "4", "--long-memory-seq", "1024", "--json", str(out),
            "--plot", str(png)]  # fmt: skip
    assert bench_main(["learner", *argv]) == 0
    text = capsys.readouterr().out
    assert "long/packed_over_padded " in text and "long/scaled_down" in text
    r = json.loads(out.read_text())["long"]
    runs, tps = r["runs"], r["useful_tokens_per_s"]
    for name in ("packed", "padded"):
        assert tps[name] == pytest.approx(r["useful_tokens"] / runs[name]["seconds"])
        assert runs[name]["seconds"] == min(runs[name]["all_s"])
        assert np.isfinite(runs[name]["loss"])
        computed = runs[name]["rows"] * runs[name]["positions"]
        assert r["padding_fraction"][name] == pytest.approx(1 - r["useful_tokens"] / computed)
    assert r["packed_over_padded"] == pytest.approx(tps["packed"] / tps["padded"])
    cpu = r["useful_tokens_per_cpu_s"]
    assert r["packed_over_padded_cpu"] == pytest.approx(cpu["packed"] / cpu["padded"])
    assert cpu["padded"] == pytest.approx(r["useful_tokens"] / min(runs["padded"]["cpu_s"]))
    assert runs["padded"]["rows"] == 16 and runs["packed"]["rows"] == 8
    assert r["padding_fraction"]["packed"] < r["padding_fraction"]["padded"]
    assert r["scaled_down"] and r["memory_seq"] == 1024
    assert set(r["attention_peak_bytes"]) >= {"xla", "blockwise"}
    assert png.read_bytes()[:4] == b"\x89PNG"
