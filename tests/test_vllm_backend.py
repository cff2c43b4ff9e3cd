"""vLLM backend without vLLM: the parameter export to HF names, the KV budget it is given, the
capability table and the config's refusals (vLLM itself runs in tests/test_vllm_cpu.py, the
`vllm` tier)."""

from __future__ import annotations

import importlib.util

import helpers_models as H
import jax
import numpy as np
import pytest

from rlvr_jax import models
from rlvr_jax.config import ConfigError, load
from rlvr_jax.rollout import api
from rlvr_jax.rollout.backends.vllm import engine_args, hf_weights, kv_cache_bytes


@pytest.mark.parametrize(
    ("tied", "arch"),  # the fast tier runs a tied qwen2
    [
        pytest.param(t, a, marks=() if (t, a) == (True, "qwen2") else pytest.mark.slow)
        for t in (False, True)
        for a in ("llama", "qwen2", "qwen3", "olmo2", "olmo3")
    ],
)
def test_export_equals_the_hf_state_dict(tmp_path, arch, tied):
    hf_model = H.build_hf_checkpoint(arch, tmp_path, seed=5, tie_word_embeddings=tied)
    model = models.load_pretrained(tmp_path)
    exported = dict(hf_weights(model.params, model.config))
    want = {
        k: v.numpy()
        for k, v in hf_model.state_dict().items()
        if not (tied and k == "lm_head.weight")  # tied: vLLM takes the embedding
    }
    assert sorted(exported) == sorted(want)
    for name, value in exported.items():
        assert value.shape == want[name].shape, name
        np.testing.assert_array_equal(np.asarray(value), want[name], err_msg=name)


def test_export_follows_new_params(tmp_path):
    # What update_weights pushes is the params given, not the loaded checkpoint.
    H.build_hf_checkpoint("qwen2", tmp_path, seed=5)
    model = models.load_pretrained(tmp_path)
    doubled = jax.tree.map(lambda x: 2 * x, model.params)
    before = dict(hf_weights(model.params, model.config))
    after = dict(hf_weights(doubled, model.config))
    name = "model.layers.1.self_attn.q_proj.weight"
    np.testing.assert_allclose(np.asarray(after[name]), 2 * np.asarray(before[name]))


@pytest.mark.slow
def test_vllm_backend_without_vllm_is_a_config_error_naming_the_key(tmp_path, capsys):
    from helpers_train import tiny_run

    from rlvr_jax import cli

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    cfg = tiny_run(tmp_path)
    assert cli.train_main(["--config", str(cfg), "rollout.backend=vllm"]) == 2
    err = capsys.readouterr().err
    assert "rollout.backend: vllm" in err and "rlvr_jax[vllm]" in err
    # the dry-run plans for the target machine: no vllm needed
    assert cli.train_main(["--config", str(cfg), "rollout.backend=vllm", "--dry-run"]) == 0


def test_kv_budget_keys_become_vllms_cache_size():
    cfg = models.ArchConfig(arch="llama", vocab_size=64, d_model=256, n_layers=2, n_heads=4,
                            n_kv_heads=2, head_dim=64, d_ff=512)  # fmt: skip
    per_token = 2 * 2 * 2 * 64 * 4  # K and V, layers, KV heads, head dim, fp32
    kw = dict(dtype_bytes=4, max_slots=8, max_len=100, page_size=16)
    # max_slots contiguous rows, each of whole 128-token vLLM blocks
    assert kv_cache_bytes(cfg, **kw) == 8 * 128 * per_token
    assert kv_cache_bytes(cfg, **kw, block=16) == 8 * 112 * per_token
    assert kv_cache_bytes(cfg, **kw, kv_pages=10) == 10 * 16 * per_token
    assert kv_cache_bytes(cfg, **kw, kv_pages=2) == 128 * per_token  # one sequence at least
    assert kv_cache_bytes(cfg, **kw, kv_cache_gib=0.5) == 2**29
    assert kv_cache_bytes(cfg, **kw, tensor_parallel=2) == 8 * 128 * per_token // 2


def test_engine_args_honour_the_engine_keys(tmp_path):
    H.build_hf_checkpoint("qwen2", tmp_path, seed=5)
    model = models.load_pretrained(tmp_path)
    args = engine_args(model, dtype="bfloat16", max_slots=12, max_len=300,
                       kv_cache_memory_bytes=123, prefill_chunk=512, seed=3)  # fmt: skip
    assert args["max_num_seqs"] == 12 and args["max_model_len"] == 300
    assert args["kv_cache_memory_bytes"] == 123 and args["max_num_batched_tokens"] == 512
    assert args["dtype"] == "bfloat16" and args["seed"] == 3 and args["model"] == str(tmp_path)
    assert args["logprobs_mode"] == "processed_logprobs" and not args["enable_chunked_prefill"]
    long = engine_args(model, dtype="float32", max_slots=4, max_len=4096,
                       kv_cache_memory_bytes=1, prefill_chunk=512)  # fmt: skip
    assert long["max_num_batched_tokens"] == 4096  # whole prompts per step


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("rollout.exact=true", "rollout.exact"),
        ("rollout.interrupt.thinking_budget=8", "rollout.interrupt.thinking_budget"),
        ("rollout.weight_dtype=int8", "rollout.weight_dtype"),
        ("model.lora.rank=4", "model.lora.rank"),
        ("env.name=tools", "env.name"),
    ],
)
def test_a_setting_vllm_cannot_honour_is_refused_at_load_naming_key_and_backend(override, key):
    with pytest.raises(ConfigError, match=rf"configs/demo.yaml .*: {key} is not supported by "
                       r"rollout\.backend: vllm \(.*use rollout\.backend: jetstream"):  # fmt: skip
        load("configs/demo.yaml", ["rollout.backend=vllm", override])
    load("configs/demo.yaml", [override] if key != "env.name" else [])  # our engine: fine


def test_on_push_is_offered_by_both_backends():  # a typo: tests/test_rollout_on_push.py
    for backend in ("jetstream", "vllm"):
        cfg = load("configs/demo.yaml", [f"rollout.backend={backend}", "rollout.on_push=recompute"])
        assert cfg.rollout.on_push == "recompute"


def test_no_backend_branch_outside_the_table_and_the_backend_module():
    import re
    from pathlib import Path

    import rlvr_jax

    root = Path(rlvr_jax.__file__).parent
    allowed = {root / "rollout" / "api.py", root / "rollout" / "backends" / "vllm.py"}
    branch = re.compile(r'backend [=!]= "vllm"')
    found = [
        str(p) for p in root.rglob("*.py") if p not in allowed and branch.search(p.read_text())
    ]
    assert found == []
    assert set(api.BACKENDS) == {"jetstream", "vllm"}
    assert api.resolve(api.backend("vllm").build).__name__ == "build_scheduler"
