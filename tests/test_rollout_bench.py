"""`rlvr-bench decode` / `rlvr-bench roofline`: the long-tailed lengths and the FLOP count by
hand, the real entry points run tiny (decode's `--quick` figures: test_cli_bench_subprocess.py,
from `rlvr-bench all --quick`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlvr_jax.bench import common, decode
from rlvr_jax.cli import bench_main
from rlvr_jax.models import ArchConfig


def test_long_tail_lengths_hit_the_target_shape():
    lengths = decode.long_tail_lengths(192, 256, 0.45, seed=0)
    assert len(lengths) == 192 and max(lengths) == 256 and min(lengths) >= 1
    assert np.mean(lengths) / 256 == pytest.approx(0.45, abs=0.005)
    assert np.median(lengths) < np.mean(lengths)  # skewed short, with a long tail
    with pytest.raises(ValueError, match="mean_over_max"):
        decode.long_tail_lengths(10, 16, 1.5, seed=0)


def test_flops_per_token_hand_derived():
    cfg = ArchConfig(
        arch="qwen2",
        vocab_size=100,
        d_model=8,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        head_dim=4,
        d_ff=16,
    )
    # per layer: q|k|v 8*(2+2)*4 = 128, o 2*4*8 = 64, mlp 3*8*16 = 384 -> 576; x2 layers
    # = 1152; LM head 100*8 = 800 -> 1952 matmul params -> 3904 FLOPs. Attention over 10
    # positions: 2 (qk and pv) * 2 layers * 2 heads * 4 * 10 = 320 MACs -> 640 FLOPs.
    assert common.token_flops(cfg, 10) == 3904 + 640


@pytest.mark.smoke("bench")
def test_roofline_quick(tmp_path):
    out = tmp_path / "roof.json"
    assert bench_main(["roofline", "--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["matmul_gflops"]) == {"float32", "bfloat16"}
    assert result["peak_gflops"] == result["matmul_gflops"]["float32"] > 0  # CPU denominator
    assert result["memory_gbps"] > 0 and result["machine"]["platform"] == "cpu"


@pytest.mark.slow  # 6.5 s: over the fast tier's 5 s (the full suite runs it)
def test_multiturn_bench_quick_through_the_cli(tmp_path):
    out, png = tmp_path / "multiturn.json", tmp_path / "multiturn.png"
    args = ["decode", "--workload", "multiturn", "--quick", "--json", str(out), "--plot", str(png)]
    assert bench_main(args) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    r = json.loads(out.read_text())
    m = r["multiturn"]
    assert set(m["tokens_per_s"]) == {"in_slot", "reprefill"}
    assert (
        m["in_slot_over_reprefill"] == m["tokens_per_s"]["in_slot"] / m["tokens_per_s"]["reprefill"]
    )
    # the same episodes both ways: same tokens generated, same turns; re-prefilling the
    # conversation every turn prefills more
    assert m["generated_tokens"]["in_slot"] == m["generated_tokens"]["reprefill"] > 0
    assert m["assistant_turns"]["in_slot"] == m["assistant_turns"]["reprefill"]
    assert m["assistant_turns"]["in_slot"] > r["config"]["episodes"]  # episodes went on
    assert m["prefilled_tokens"]["reprefill"] > m["prefilled_tokens"]["in_slot"]
    assert m["roofline_fraction"] > 0 and "loadavg_after" in r["machine"]


@pytest.mark.slow
def test_rollout_imports_and_core_generation_stay_light():
    # Importing the engine, its servers and backends pulls no TensorFlow, JetStream, torch
    # or vLLM: those load only when a JetStream engine / server / vLLM run is built.
    import subprocess
    import sys

    modules = [
        "rlvr_jax.rollout",
        "rlvr_jax.serve.cli",
        "rlvr_jax.serve.http",
        "rlvr_jax.rollout.backends.jetstream",
        "rlvr_jax.rollout.backends.vllm",
        "rlvr_jax.bench.decode",
        "rlvr_jax.bench.roofline",
    ]
    # ...and the plain-JAX core generates without them (GPU images without TensorFlow).
    code = (
        "import importlib, sys, jax\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "from rlvr_jax import models\n"
        "from rlvr_jax.rollout import generate\n"
        "cfg = models.ArchConfig(arch='llama', vocab_size=64, d_model=16, n_layers=1,\n"
        "                        n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32)\n"
        "model = models.Model(cfg, models.init_params(cfg, jax.random.key(0)))\n"
        "(c,) = generate(model, [[1, 2, 3]], max_new_tokens=3)\n"
        "assert len(c.tokens) == 3\n"
        "heavy = ('tensorflow', 'jetstream', 'torch', 'vllm', 'transformers')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == ""
