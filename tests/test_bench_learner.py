"""`rlvr-bench learner`: FLOP counts by hand, the datasheet table, the bench batch, presets and
options, and a real tiny run whose reported figures are checked against each other."""

import dataclasses
import json
import os

import numpy as np
import pytest

from rlvr_jax.bench import common, decode, table
from rlvr_jax.bench import learner as bench
from rlvr_jax.cli import bench_main

TINY = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, vocab=512)


def test_flops_by_hand():
    arch = common.ModelSize(**TINY).arch()
    assert (arch.head_dim, arch.tie_embeddings, arch.qkv_bias) == (16, True, True)
    # per layer: q 64*4*16 + k, v 2*64*2*16 + o 4*16*64 + mlp 3*64*128
    #          = 4096 + 4096 + 4096 + 24576 = 36864; x2 layers + LM head 512*64 = 106496
    assert common.matmul_params(arch) == 106_496
    # the rest of the params: q/k/v biases (64 + 2*32) and two norms (2*64) per layer, final norm
    assert arch.n_params() - common.matmul_params(arch) == 2 * (128 + 128) + 64
    # forward, 4 rows x 32 tokens: 128 * (2*106496 + 4*L*N*H*T = 4*2*4*16*32 = 16384)
    assert common.forward_flops(arch, 4, 32) == 128 * (212_992 + 16_384) == 29_360_128
    assert common.train_flops(arch, 4, 32) == 3 * 29_360_128
    # the same per-token count as `rlvr-bench decode` uses
    assert common.forward_flops(arch, 1, 32) == 32 * common.token_flops(arch, 32)


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("NVIDIA H200", ("NVIDIA H200", 989.0)),
        ("NVIDIA H100 80GB HBM3", ("NVIDIA H100 SXM", 989.0)),
        ("NVIDIA H100 PCIe", ("NVIDIA H100 PCIe", 756.0)),
        ("NVIDIA A100-SXM4-80GB", ("NVIDIA A100", 312.0)),
        ("TPU v5 lite", ("TPU v5e", 197.0)),
        ("TPU v5p", ("TPU v5p", 459.0)),
        ("TPU v5", ("TPU v5p", 459.0)),
        ("TPU v4", ("TPU v4", 275.0)),
        ("cpu", None),
    ],
)
def test_datasheet_peaks(kind, expected):
    sheet = common.datasheet(kind)
    assert (sheet and (sheet["name"], sheet["bf16_tflops"])) == expected


def test_the_bench_model_is_decodes():
    arch = bench.PRESETS["cpu"].arch()
    cfg = decode.BenchConfig()
    assert (arch.arch, arch.d_model, arch.n_layers, arch.vocab_size) == ("qwen2", 512, 8, 32000)
    assert (arch.n_heads, arch.n_kv_heads, arch.d_ff) == (cfg.n_heads, cfg.n_kv_heads, cfg.d_ff)
    big = bench.PRESETS["gpu-1b"]
    assert 0.9e9 < big.arch().n_params() < 1.1e9 and big.dtype == "bfloat16"
    with pytest.raises(TypeError, match="width"):
        common.ModelSize(width=3)


def test_synthetic_batch_is_a_collated_rl_batch():
    arch = common.ModelSize(**TINY).arch()
    b = bench.synthetic_batch(arch, rows=6, seq=40, seed=2, with_old_logp=True)
    t = b.tokens  # one completion per row: the packed rows are the completion slots
    on = b.mask_BxT > 0
    assert (b.gather_BxT[on] == np.arange(6 * 40).reshape(6, 40)[on]).all()
    assert t.input_ids_BxT.shape == b.mask_BxT.shape == b.old_logp_BxT.shape == (6, 40)
    np.testing.assert_array_equal(t.input_ids_BxT[:, 1:], t.target_ids_BxT[:, :-1])
    for mask, seg in zip(b.mask_BxT, t.segment_ids_BxT):
        on = np.flatnonzero(mask)
        assert on.size >= 1 and np.all(np.diff(on) == 1)  # one contiguous completion
        assert seg[: on[-1] + 1].all()  # the prompt and the completion are one segment
    on = b.mask_BxT > 0
    assert np.abs(b.sampler_logp_BxT[on] + np.log(512)).max() < 1.0
    assert (b.old_logp_BxT[~on] == b.sampler_logp_BxT[~on]).all()
    lengths = b.mask_BxT.sum(1)
    assert len(set(lengths.tolist())) > 1  # varied completion lengths


def parse_config(argv):
    return table.parse("learner", argv)


def test_options_override_the_preset(capsys):
    _, cfg = parse_config(["--preset", "quick", "--batch", "8", "--dtype", "bf16"])
    assert (cfg.batch, cfg.dtype, cfg.d_model) == (8, "bfloat16", 64)
    _, cfg = parse_config(["--layers", "4", "--n-micro", "4", "--no-profile"])
    assert (cfg.n_layers, cfg.n_micro, cfg.profile, cfg.vocab) == (4, 4, False, 32000)
    _, cfg = parse_config(["--kv-heads", "4", "--heads", "4", "--attention", "xla"])
    assert (cfg.n_kv_heads, cfg.n_heads, cfg.attention_impl) == (4, 4, "xla")
    with pytest.raises(SystemExit):
        parse_config(["--quick", "--n-micro", "3"])
    assert "n_micro=3 must be >= 1 and divide batch=4" in capsys.readouterr().err
    _, cfg = parse_config(["--quick", "--remat", "--attn-chunk", "8", "--logits-chunk", "16"])
    memory = cfg.memory()
    assert (memory.remat, memory.attn_chunk, memory.logits_chunk) == (True, 8, 16)
    with pytest.raises(SystemExit):  # the learner would silently ignore a chunk not dividing T
        parse_config(["--quick", "--logits-chunk", "12"])
    assert "logits_chunk=12 must be 0 (off) or a divisor of seq=32" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(["--quick", "--loss", "no_such_preset"])
    assert "no_such_preset" in capsys.readouterr().err


def test_summary_arithmetic_by_hand():
    cfg = bench.PRESETS["quick"]  # tiny model, 4 rows x 32 tokens = 128 tokens per step
    measured = {
        "timings": {
            "train_step": common.Timings((0.5, 0.25, 0.3), (0.9, 0.4, 0.5)),
            "logprob_forward": common.Timings((0.1, 0.2), (0.2, 0.2)),
        },
        "compile_s": {"train_step": 9.0, "logprob_forward": 4.0},
        "profile": {
            "lm_head_logsoftmax_fwd_bwd": common.Timings((0.05,), (0.1,)),
            "optimizer_update": common.Timings((0.025,), (0.025,)),
        },
        "op_profile": None,
        "memory": None,
        "loss": {"value": 0.1, "grad_norm": 1.0},
        "lora": {"rank": 0, "trainable_params": 1000},
    }
    r = bench.summarize(cfg, measured, peak_gflops=0.5, datasheet=("chip", 0.002))
    # train: 3 * 29,360,128 FLOPs in the best 0.25 s = 0.352321536 GFLOP/s; peak 0.5 GFLOP/s
    assert r["achieved_gflops"]["train_step"] == pytest.approx(0.352321536)
    assert r["achieved_flops_fraction"] == pytest.approx(0.352321536 / 0.5)
    assert r["tokens_per_s"] == {"train_step": 128 / 0.25, "logprob_forward": 128 / 0.1}
    # old-log-prob forward: 29,360,128 FLOPs in 0.1 s = 0.29360128 GFLOP/s
    assert r["logprob_forward"]["flops_fraction"] == pytest.approx(0.29360128 / 0.5)
    assert r["logprob_forward"]["over_train_step_seconds"] == pytest.approx(0.4)
    # MFU against 0.002 TFLOP/s = 2 GFLOP/s
    assert r["mfu"]["train_step"] == pytest.approx(0.352321536 / 2)
    assert r["profile"]["lm_head_logsoftmax_fwd_bwd_s"] == 0.05
    assert r["profile"]["lm_head_logsoftmax_fwd_bwd_share"] == pytest.approx(0.2)
    assert r["profile"]["optimizer_update_share"] == pytest.approx(0.1)
    assert r["seconds"]["all"]["train_step"] == [0.5, 0.25, 0.3]
    # the fastest step used 0.4 CPU-seconds in 0.25 s: 0.4 / (0.25 * cores)
    assert r["cpu_share"]["train_step"] == pytest.approx(0.4 / (0.25 * os.cpu_count()))
    assert bench.summarize(cfg, measured, peak_gflops=1.0, datasheet=None)["mfu"] is None
    # LoRA: no weight gradients of the base, 2 forwards + the adapters' 6 FLOPs per parameter
    # and token: 2 * 29,360,128 + 6 * 1000 * 128 = 59,488,256 FLOPs in 0.25 s
    lo = bench.summarize(dataclasses.replace(cfg, lora_rank=8), measured, peak_gflops=0.5,
                         datasheet=None)  # fmt: skip
    assert lo["achieved_gflops"]["train_step"] == pytest.approx(0.237953024)


def test_peak_denominator():
    roof = {"matmul_gflops": {"float32": 100.0, "bfloat16": 300.0}}
    assert bench._peak_gflops(roof, 120.0, "cpu") == 120.0  # fp32, the larger probe
    assert bench._peak_gflops(roof, 90.0, "cpu") == 100.0
    assert bench._peak_gflops(roof, 90.0, "gpu") == 300.0  # the best dtype on accelerators


@pytest.mark.slow  # ~10 s: compiles the train step, the forward and the profile pieces
def test_main_quick_reports_consistent_figures(tmp_path, capsys):
    out, png = tmp_path / "l.json", tmp_path / "l.png"
    argv = ["--quick", "--json", str(out), "--plot", str(png), "--device-kind", "NVIDIA H200"]
    argv += ["--trace", str(tmp_path / "trace")]
    assert bench_main(["learner", *argv]) == 0
    assert "train_step" in capsys.readouterr().out
    r = json.loads(out.read_text())
    cfg = bench.PRESETS["quick"]
    tokens = cfg.batch * cfg.seq
    assert r["flops"]["tokens_per_step"] == tokens == 128
    arch = cfg.arch()
    assert r["flops"]["train_step"] == common.train_flops(arch, 4, 32) == 3 * 29_360_128
    assert r["flops"]["logprob_forward"] == 29_360_128
    best = r["seconds"]["best"]
    for name in ("train_step", "logprob_forward"):
        assert r["tokens_per_s"][name] == pytest.approx(tokens / best[name])
        gflops = r["flops"][name] / best[name] / 1e9
        assert r["achieved_gflops"][name] == pytest.approx(gflops)
        assert r["flops_fraction"][name] == pytest.approx(gflops / r["roofline"]["peak_gflops"])
        assert r["mfu"][name] == pytest.approx(gflops / 989e3)  # H200 datasheet, bf16
        assert best[name] == min(r["seconds"]["all"][name])
        assert 0 < r["cpu_share"][name] <= 1.5  # CPU seconds per wall second per core
    assert r["achieved_flops_fraction"] == r["flops_fraction"]["train_step"]
    assert r["logprob_forward"]["flops_fraction"] == r["flops_fraction"]["logprob_forward"]
    peak = r["roofline"]
    assert peak["peak_gflops"] == max(
        peak["matmul_gflops"]["float32"], peak["matmul_gflops_fp32_after"]
    )
    assert np.isfinite(r["loss"]["value"]) and r["loss"]["grad_norm"] > 0
    assert r["memory"]["train_step"]["temp_bytes"] > 0
    assert r["profile"]["lm_head_logsoftmax_fwd_bwd_share"] > 0
    assert r["profile"]["optimizer_update_share"] > 0
    assert r["config"]["old_from"] == "self" and r["config"]["loss"] == "olmo3"
    assert png.read_bytes()[:4] == b"\x89PNG"
    ops = r["op_profile"]  # the profiled step's compiled ops, slowest first
    assert 0 < len(ops) <= 15 and all(op["calls"] >= 1 and 0 < op["share"] <= 1 for op in ops)
    assert [op["ms"] for op in ops] == sorted((op["ms"] for op in ops), reverse=True)
    assert sum(op["share"] for op in ops) <= 1 + 1e-9


@pytest.mark.slow  # ~60 s: compiles the quick model's train step for 2 kernels x 3 lengths
def test_attention_memory_workload(tmp_path, capsys):
    """Per kernel, XLA's memory of one micro-batch: the materialised-mask path grows
    quadratically in T, blockwise linearly (2 to 8 tiles of 512 here)."""
    out, png = tmp_path / "m.json", tmp_path / "m.png"
    argv = ["--quick", "--workload", "attention-memory", "--seqs", "1024,2048,4096",
            "--json", str(out), "--plot", str(png)]  # fmt: skip
    assert bench_main(["learner", *argv]) == 0
    assert "attention_memory/over_blockwise/xla" in capsys.readouterr().out
    r = json.loads(out.read_text())["attention_memory"]
    assert r["kernels"] == ["xla", "blockwise"] and r["seqs"] == [1024, 2048, 4096]
    for k in r["kernels"]:
        temp = [r["memory"][k][str(s)]["temp_bytes"] for s in r["seqs"]]
        assert temp == sorted(temp)
        assert r["growth"][k] == pytest.approx((temp[2] - temp[1]) / (temp[1] - temp[0]))
        top = r["memory"][k]["4096"]
        assert r["peak_bytes"][k] == top["temp_bytes"] + top["argument_bytes"] + top["output_bytes"]
    assert r["growth"]["xla"] > 3.5 and r["growth"]["blockwise"] < 2.3
    assert r["over_blockwise"]["xla"] > 10 and r["over_blockwise"]["blockwise"] == 1
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_seqs_option_is_checked():
    with pytest.raises(SystemExit):
        parse_config(["--seqs", "1024,512,2048"])
