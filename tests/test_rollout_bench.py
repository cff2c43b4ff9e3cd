"""`rlvr-bench decode` / `rlvr-bench roofline`: the long-tailed lengths and the FLOP count by
hand, the real entry points run tiny (decode's `--quick` figures: test_cli_bench_subprocess.py,
from `rlvr-bench all --quick`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlvr_jax.bench import common, decode, engine_timing, table
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


HLO = """
%fused_computation.5 (param_0.5: f32[32,32000]) -> f32[32,32000] {
  %param_0.5 = f32[32,32000]{1,0} parameter(0)
  ROOT %exp.1 = f32[32,32000]{1,0} exponential(%param_0.5), metadata={op_name="jit(generate)/while/body/sample/exp"}
}
%fused_computation.27 (param_0.27: f32[32,512], param_1.27: f32[512,32000]) -> f32[32,32000] {
  ROOT %dot_general.16 = f32[32,32000]{1,0} dot(%param_0.27, %param_1.27), lhs_contracting_dims={1}, metadata={op_name="jit(generate)/while/body/lm_head/BD,DV->BV/dot_general"}
}
ENTRY %main (p0: f32[32,512], p1: f32[512,32000]) -> f32[32,32000] {
  %p0 = f32[32,512]{1,0} parameter(0)
  %p1 = f32[512,32000]{1,0} parameter(1)
  %ynn_fusion.27 = f32[32,32000]{1,0} fusion(%p0, %p1), kind=kCustom, calls=%fused_computation.27, metadata={op_name="jit(generate)/while/body/lm_head/BD,DV->BV/dot_general"}
  %while.3 = (s32[], f32[2,4]{1,0}) while(%tuple), condition=%cond, body=%body
  %loop_fusion = f32[32,32000]{1,0} fusion(%ynn_fusion.27), kind=kLoop, calls=%fused_computation.5
  ROOT %copy.1 = f32[32,32000]{1,0} copy(%ynn_fusion.27), metadata={op_name="jit(generate)/while/body/attention/qkv/copy"}
}
"""  # a compiled module's text, abridged: fusions, a while loop and a nested scope


def test_op_profile_labels_ops_from_the_compiled_hlo(monkeypatch):
    ops = engine_timing.hlo_ops(HLO)
    dot = ops["ynn_fusion.27"]
    assert dot["part"] == "lm_head" and dot["opcode"] == "fusion"
    assert dot["what"] == "dot f32[32,512] x f32[512,32000] -> f32[32,32000]"
    assert ops["while.3"]["opcode"] == "while" and ops["while.3"]["part"] == "other"
    assert ops["copy.1"]["part"] == "qkv"  # the innermost scope of the step's parts
    assert ops["loop_fusion"]["part"] == "sample"  # no scope of its own: its called ops' one
    # a while loop's event wraps its body's ops: left out; the rest per step, largest first
    times = {"ynn_fusion.27": (6_000_000, 2), "while.3": (9_000_000, 1), "copy.1": (2_000_000, 2)}
    monkeypatch.setattr(common, "trace_op_times", lambda fn, trace_dir: times)

    class Live:  # a 2-step decode chunk of that program
        core = type("Core", (), {"chunk": 2})
        hlo, chunk = staticmethod(lambda: HLO), staticmethod(lambda: None)

    summary, top = engine_timing.step_profile(Live(), "e", top=2)
    assert summary == {"op_ms_per_step": 4.0, "parts": {"lm_head": 3.0, "qkv": 1.0}}
    assert {k: (v["ms_per_step"], v["calls_per_step"], v["share"]) for k, v in top.items()} == {
        "e ynn_fusion.27": (3.0, 1.0, 0.75),
        "e copy.1": (1.0, 1.0, 0.25),
    }
    assert list(top) == ["e ynn_fusion.27", "e copy.1"]  # largest first


def test_step_options_are_checked():
    assert decode.step_shapes("32x192, 256x1024") == [(32, 192), (256, 1024)]
    with pytest.raises(ValueError, match="'256by1024' is not SLOTSxCONTEXT"):
        decode.step_shapes("32x192,256by1024")
    with pytest.raises(SystemExit):  # a usage error, naming the entry
        table.parse("decode", ["--workload", "step", "--shapes", "4x"])
    with pytest.raises(ValueError, match="--profile: with --workload short, all or step"):
        decode.BenchConfig(workload="long", profile=True)


@pytest.mark.slow  # ~25 s: two engines compiled and traced
def test_decode_step_workload_and_profile_through_the_cli(tmp_path, capsys):
    """`--workload step --profile`: every shape x weight dtype timed and traced, each traced
    op labelled from the compiled program."""
    out = tmp_path / "step.json"
    args = ["decode", "--workload", "step", "--quick", "--profile", "--weight-dtype", "int8",
            "--shapes", "4x32", "--json", str(out)]  # fmt: skip
    assert bench_main(args) == 0
    r = json.loads(out.read_text())
    assert list(r["step"]) == ["4x32 float32", "4x32 int8"]
    for key, entry in r["step"].items():
        assert entry["ms_per_step"] > 0 and entry["memory_fraction"] > 0
        assert entry["tokens_per_s"] == pytest.approx(4e3 / entry["ms_per_step"])
        parts = r["op_profile"][key]["parts"]
        assert {"attention", "mlp", "lm_head", "sample"} <= set(parts)
        assert sum(parts.values()) == pytest.approx(r["op_profile"][key]["op_ms_per_step"])
    top = r["top_ops"]
    assert {k.rsplit(" ", 1)[0] for k in top} == set(r["step"])
    assert all(o["what"] != "?" and 0 < o["share"] <= 1 for o in top.values())  # found in HLO
    # the weights' bytes: int8 reads a quarter of fp32's matmul weights, the same KV
    assert r["step"]["4x32 int8"]["step_bytes"] < r["step"]["4x32 float32"]["step_bytes"]
    assert r["ratios"]["4x32"]["int8_over_float32_tokens_per_s"] > 0
    printed = capsys.readouterr().out
    assert "4x32 int8 " in printed and "op_ms_per_step" in printed


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
