"""LoRA and quantized weights: the adapted forward against the merged weights and against PEFT
on transformers (the exports), training touching the adapters only, dropout in gradient passes
only, int8 storage, the engine merging pushed adapters onto the base it holds, quantized
decode weights, the config checks and the dry-run plan."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers_models import build_hf_checkpoint, hf_config, hf_logits, random_tokens

from rlvr_jax import models
from rlvr_jax.config import load
from rlvr_jax.config.checks import ConfigError
from rlvr_jax.models import lora, peft_io, quant
from rlvr_jax.rollout.device import kernel
from rlvr_jax.rollout.engine import EngineCore
from rlvr_jax.training.update import gradient_step, init_state

ALL = list(lora.TARGETS)


def settings(rank=4, *, targets=ALL, base_dtype="param", dropout=0.0):
    return types.SimpleNamespace(
        rank=rank, alpha=2.0 * rank, dropout=dropout, targets=targets, base_dtype=base_dtype
    )


def trained(model, seed=3, size=0.1):
    """`model` with its adapters moved off their init (B = 0 would hide a wrong B layout)."""
    adapters = lora.adapters(model.params)
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [x + size * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    params = lora.graft(lora.strip(model.params), jax.tree.unflatten(treedef, leaves))
    return dataclasses.replace(model, params=params)


def tiny_model(arch="llama", **overrides):
    config = models.ArchConfig.from_hf(hf_config(arch, **overrides).to_dict())
    return models.Model(config, models.init_params(config, jax.random.key(0)))


@pytest.mark.slow  # tens of seconds on two loaded cores
def test_adapters_start_at_the_base_and_equal_their_merged_weights():
    base = tiny_model()
    tokens = random_tokens(2, 7)
    adapted = models.adapt_lora(base, settings(targets=["q_proj", "o_proj", "up_proj"]), seed=1)
    # B = 0 at init: the adapted policy is the base
    np.testing.assert_allclose(
        models.forward(adapted, tokens), models.forward(base, tokens), atol=1e-6
    )
    moved = trained(adapted)
    out = np.asarray(models.forward(moved, tokens))
    merged = dataclasses.replace(moved, params=lora.merge(moved.params))
    assert not lora.has_adapters(merged.params)
    np.testing.assert_allclose(out, models.forward(merged, tokens), atol=2e-5)
    assert np.abs(out - np.asarray(models.forward(base, tokens))).max() > 0.1
    # the base with the adapters off (the KL / DPO reference) is the base itself
    stripped = dataclasses.replace(moved, params=lora.strip(moved.params))
    np.testing.assert_array_equal(models.forward(stripped, tokens), models.forward(base, tokens))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2", "olmo3"])
def test_peft_export_loads_in_peft_and_merged_in_transformers_with_our_logits(tmp_path, arch):
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    build_hf_checkpoint(arch, tmp_path / "base")
    model = trained(models.adapt_lora(models.load_pretrained(tmp_path / "base"), settings()))
    tokens = random_tokens(2, 9)
    ours = np.asarray(models.forward(model, tokens))
    peft_io.save_lora_exports(model, tmp_path / "merged", tmp_path / "adapter")

    def hf(path):
        kwargs = dict(dtype=torch.float32, attn_implementation="eager")
        return AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()

    with_adapter = peft.PeftModel.from_pretrained(hf(tmp_path / "base"), tmp_path / "adapter")
    np.testing.assert_allclose(hf_logits(with_adapter.eval(), tokens), ours, atol=1e-4)
    np.testing.assert_allclose(hf_logits(hf(tmp_path / "merged"), tokens), ours, atol=1e-4)
    assert with_adapter.peft_config["default"].r == 4
    assert set(with_adapter.peft_config["default"].target_modules) == set(ALL)


@pytest.mark.slow
@pytest.mark.parametrize("base_dtype", ["param", "int8"])
def test_a_step_trains_the_adapters_only(base_dtype):
    model = models.adapt_lora(tiny_model(), settings(base_dtype=base_dtype))
    optimizer = optax.adam(1e-2)
    state = init_state(model.params, optimizer)
    adapter_leaves = jax.tree.leaves(lora.adapters(model.params))
    assert sum(x.size for x in jax.tree.leaves(state.opt_state)) == 1 + 2 * sum(
        x.size for x in adapter_leaves
    )  # Adam's count and two moments of the adapters: nothing of the base
    tokens = jnp.asarray(random_tokens(4, 6))
    positions = jnp.broadcast_to(jnp.arange(6), (4, 6))
    segments = jnp.ones((4, 6), jnp.int32)

    def loss_fn(params, mb):
        logits = models.apply(
            params, model.config, mb, positions[: mb.shape[0]], segments[: mb.shape[0]]
        )
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[..., 0]), {}

    base_before = jax.tree.leaves(lora.strip(model.params))
    new, metrics, _ = gradient_step(state, loss_fn, tokens, optimizer, 2)
    assert float(metrics["step_ok"]) == 1.0 and float(metrics["grad_norm"]) > 0
    for before, after in zip(base_before, jax.tree.leaves(lora.strip(new.params))):
        np.testing.assert_array_equal(before, after)
    after = lora.adapters(new.params)
    for old, ad in zip(jax.tree.leaves(lora.adapters(model.params), is_leaf=_is_pair),
                       jax.tree.leaves(after, is_leaf=_is_pair)):  # fmt: skip
        # B = 0 at init: dL/dA = xᵀ(dL/dy)Bᵀ·scale = 0, so the first step moves B only
        np.testing.assert_array_equal(old.a, ad.a)
        assert np.abs(np.asarray(ad.b)).max() > 0


def _is_pair(x):
    return isinstance(x, lora.Adapter)


@pytest.mark.slow  # tens of seconds on two loaded cores
def test_dropout_applies_in_gradient_passes_only_keyed_by_the_step():
    model = models.adapt_lora(tiny_model(), settings(dropout=0.5))
    model = trained(model)
    tokens = jnp.asarray(random_tokens(2, 6))
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
    segments = jnp.ones((2, 6), jnp.int32)
    inputs = (tokens, positions, segments)
    trainable, frozen = lora.split(model.params)

    def out(key):
        t = trainable if key is None else lora.with_dropout(trainable, key)
        return np.asarray(models.apply(lora.combine(t, frozen), model.config, *inputs))

    plain = out(None)  # no key (old / reference / sampler log-probs): no dropout
    np.testing.assert_allclose(plain, models.apply(model.params, model.config, *inputs))
    a, b = out(jax.random.PRNGKey(1)), out(jax.random.PRNGKey(2))
    np.testing.assert_array_equal(a, out(jax.random.PRNGKey(1)))
    assert np.abs(a - plain).max() > 1e-3 and np.abs(a - b).max() > 1e-3
    assert lora.dropout_rate(model.params) == 0.5


def test_int8_storage_is_within_half_a_step_per_channel():
    w = (
        jax.random.normal(jax.random.key(0), (3, 16, 5)) * jnp.arange(1, 6)[None, None]
    )  # [L, in, out]
    q = quant.quantize(w, "int8", (1,))
    assert q.qvalue.dtype == jnp.int8 and q.scale.shape == (3, 1, 5)
    # absmax per (layer, output channel) maps to 127.5 (clipped to 127: half a step off, the
    # largest error); every value is rounded to the nearest of the steps absmax / 127.5
    step = jnp.max(jnp.abs(w), axis=1, keepdims=True) / 127.5
    ratio = jnp.abs(quant.dense(q, jnp.float32) - w) / step
    assert float(jnp.max(ratio)) == pytest.approx(0.5, abs=1e-4)
    f8 = quant.quantize(w, "fp8", (1,))
    assert f8.qvalue.dtype == jnp.float8_e4m3fn
    np.testing.assert_allclose(quant.dense(f8, jnp.float32), w, rtol=0.07, atol=1e-6)


def test_the_engine_holds_the_base_and_merges_pushed_adapters():
    model = trained(models.adapt_lora(tiny_model(), settings()))
    engine = EngineCore(model, max_slots=2, max_len=16)
    assert engine.base is not None and not lora.has_adapters(engine.base)
    pushed = trained(model, seed=7)
    from_adapters = engine.prepare(lora.adapters(pushed.params))
    plain = EngineCore(dataclasses.replace(model, params=lora.merge(pushed.params)), max_slots=2,
                       max_len=16)  # fmt: skip
    for a, b in zip(jax.tree.leaves(from_adapters), jax.tree.leaves(plain.params)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    with pytest.raises(ValueError, match="adapters without a base"):
        plain.prepare(lora.adapters(pushed.params))


@pytest.mark.parametrize(
    "weight_dtype", [pytest.param("int8", marks=pytest.mark.slow), "fp8", "bfloat16"]
)
def test_quantized_decode_weights_stay_close_to_float32(weight_dtype):
    model = tiny_model()
    config, params = model.config, model.params
    tokens = jnp.asarray(random_tokens(2, 5))
    positions = jnp.broadcast_to(jnp.arange(5), (2, 5))

    def last_logits(wd):
        dp = kernel.prepare_params(params, config, jnp.float32, weight_dtype=wd)
        caches = (None,) * config.n_layers
        x, _ = kernel.run_layers(dp, config, tokens, positions, caches, _causal(config))
        return np.asarray(kernel.logits(dp, config, x[:, -1])), dp

    ref, _ = last_logits(None)
    out, dp = last_logits(weight_dtype)
    stored = dp.layers[0].qkv.qvalue if quant.is_quantized(dp.layers[0].qkv) else dp.layers[0].qkv
    assert stored.dtype == jnp.dtype(quant.QTYPES.get(weight_dtype, weight_dtype))
    err = np.abs(out - ref).max() / np.abs(ref).max()
    assert 0 < err < {"int8": 0.02, "fp8": 0.1, "bfloat16": 0.02}[weight_dtype]


def _causal(config):
    from rlvr_jax.models.layers import attend

    def dense(i, cache, q, k, v):
        t = q.shape[1]
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (q.shape[0], t, t))
        return attend(q, k, v, mask), cache

    return dense


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.lora.rank=-1"], r"model\.lora\.rank must be >= 0"),
        (
            ["model.lora.rank=8", "model.lora.targets=[q_proj, wq]"],
            r"model\.lora\.targets: \['wq'\]",
        ),
        (["model.lora.rank=8", "model.lora.dropout=1.0"], r"model\.lora\.dropout must be in"),
        (["model.lora.base_dtype=int8"], r"model\.lora\.base_dtype: int8 needs LoRA"),
        (
            ["model.lora.rank=8", "rollout.backend=vllm"],
            r"model\.lora\.rank is not supported by rollout\.backend: vllm",
        ),
        (["rollout.weight_dtype=int8", "rollout.backend=vllm"], r"rollout\.weight_dtype"),
    ],
)
def test_lora_settings_are_checked_at_load_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load("configs/demo.yaml", overrides)


def test_plan_of_lora_rank_8_on_the_demo_keeps_optimizer_state_under_5_percent():
    from rlvr_jax.plan import format_plan, make_plan

    full = make_plan(load("configs/demo.yaml"), n_devices=1)
    lo = make_plan(load("configs/demo.yaml", ["model.lora.rank=8"]), n_devices=1)
    assert lo.lora["optimizer_bytes"] <= 0.05 * full.learner_bytes["optimizer"]
    assert lo.lora["full_optimizer_bytes"] == full.learner_bytes["optimizer"]
    assert lo.learner_bytes["grads"] == lo.lora["trainable_bytes"]
    assert lo.actor_bytes["lora_base"] > 0 and "LoRA:" in format_plan(lo)
    q = make_plan(load("configs/demo.yaml", ["rollout.weight_dtype=int8"]), n_devices=1)
    assert q.actor_bytes["params"] < full.actor_bytes["params"]
    assert q.quantized_actor["freed_bytes"] == pytest.approx(
        full.actor_bytes["params"] - q.actor_bytes["params"]
    )


def test_plan_says_how_many_learner_chips_lora_rank_64_needs_for_olmo3_7b():
    from rlvr_jax.plan import make_plan

    cfg = load("configs/olmo3_7b_think_rl_tpu.yaml", ["model.lora.rank=64"])
    lo = make_plan(cfg).lora
    assert lo["trainable_params"] == 32 * 64 * (
        (4096 + 4096) * 4 + (4096 + 11008) * 3
    )  # per layer: q k v o of D -> D, gate up down of D <-> F, r (in + out) each
    assert 1 <= lo["learner_devices_needed"] <= lo["full_learner_devices_needed"] <= 64
    assert lo["optimizer_bytes"] < 0.05 * lo["full_optimizer_bytes"]


@pytest.mark.slow  # ~30 s: two engines compiled, timed and compared
def test_decode_bench_weight_dtype_and_lora_rank_quick_through_the_cli(tmp_path):
    import json

    from rlvr_jax.cli import bench_main

    out = tmp_path / "decode_weights.json"
    args = ["decode", "--quick", "--weight-dtype", "int8", "--lora-rank", "4", "--json", str(out)]
    assert bench_main(args) == 0
    r = json.loads(out.read_text())
    assert set(r["tokens_per_s"]) == {"float32", "int8"} and min(r["tokens_per_s"].values()) > 0
    # int8 kernels (1 byte + a scale per channel) against fp32's 4 bytes; embedding, norms and
    # head unchanged: smaller, but more than a quarter
    w = r["decode_weight_bytes"]
    assert w["float32"] / 4 < w["int8"] < w["float32"]
    # the fp32 engine is the floor of the mismatch; int8 adds some, within TIS's range
    m = r["mismatch"]
    assert m["float32"]["kl_sampler_learner"] < m["int8"]["kl_sampler_learner"] < 1e-3
    assert m["int8"]["tokens"] == m["float32"]["tokens"] > 0
    push = r["push"]["bytes"]
    assert push["adapters"] < push["whole_policy"]
    assert r["push"]["bytes_fraction"] == pytest.approx(push["adapters"] / push["whole_policy"])
    # merge on push vs apply in the decode step: the same outputs, timed; the verdict follows
    a = r["apply"]
    assert a["outputs_relative_gap"] < 1e-4
    assert a["apply_seconds_per_push"] == pytest.approx(
        a["overhead_per_decode_step_s"] * a["decode_steps_per_push"]
    )
    assert a["faster"] == ("merge" if a["merge_seconds_per_push"] <= a["apply_seconds_per_push"]
                           else "apply")  # fmt: skip
