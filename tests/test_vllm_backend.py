"""vLLM backend: the parameter export to HF names (CPU), and a real vLLM run (GPU + vLLM)."""

from __future__ import annotations

import importlib.util

import helpers_models as H
import jax
import numpy as np
import pytest

from rlvr_jax import models
from rlvr_jax.rollout.vllm_backend import hf_weights


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "olmo2", "olmo3"])
@pytest.mark.parametrize("tied", [False, True])
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


def _gpu_and_vllm() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (extra `vllm`, GPU machines only)"
    if not any(d.platform == "gpu" for d in jax.devices()):
        return "no GPU visible to JAX"
    return None


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_and_vllm() is not None, reason=str(_gpu_and_vllm()))
def test_vllm_generates_and_takes_pushed_weights(tmp_path):
    from rlvr_jax.rollout import generate
    from rlvr_jax.rollout.vllm_backend import VllmRollout

    hf_model = H.build_hf_checkpoint("qwen2", tmp_path, seed=5)
    model = models.load_pretrained(tmp_path)
    rollout = VllmRollout(model, dtype="float32", gpu_memory_utilization=0.2, enforce_eager=True)
    prompts = [[5, 6, 7], [9, 10]]
    greedy = generate(rollout, prompts, max_new_tokens=6, temperature=0.0)
    want = generate(model, prompts, max_new_tokens=6, temperature=0.0)
    assert [c.tokens for c in greedy] == [c.tokens for c in want]
    logits = H.hf_logits(hf_model, np.array([prompts[0] + greedy[0].tokens]))[0]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(
        greedy[0].logprobs, [logp[2 + i, t] for i, t in enumerate(greedy[0].tokens)], atol=1e-3
    )
    new_params = jax.tree.map(lambda x: 1.5 * x, model.params)
    rollout.update_weights(new_params, version=1)
    after = generate(rollout, prompts, max_new_tokens=6, temperature=0.0)
    import dataclasses

    reference = generate(
        dataclasses.replace(model, params=new_params), prompts, max_new_tokens=6, temperature=0.0
    )
    assert [c.tokens for c in after] == [c.tokens for c in reference]
    assert after[0].policy_versions == [1] * 6
