"""vLLM backend: the parameter export to HF names (CPU), and a real vLLM run (GPU + vLLM)."""

from __future__ import annotations

import importlib.util

import helpers_models as H
import jax
import numpy as np
import pytest

from rlvr_jax import models
from rlvr_jax.rollout.backends.vllm import hf_weights


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
    from rlvr_jax.rollout.backends.vllm import VllmRollout

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


# -- `rollout.backend: vllm` behind the trainer's stream interface -----------------------


class EngineAsVllm:
    """Stands in for `VllmRollout` where vLLM cannot run (CPU): the same two methods and
    `signature`, backed by our engine, so `VllmStream`'s queueing, grouping, meta and weight
    hand-over are exercised."""

    def __init__(self, model):
        from rlvr_jax.rollout.push import signature

        self.model, self.version, self.calls, self.loaded = model, 0, [], []
        self.signature = signature(model.params)

    def update_weights(self, params, version):
        import dataclasses

        self.model = dataclasses.replace(self.model, params=params)
        self.version = version
        self.loaded.append(version)

    def generate_completions(self, prompts, *, max_new_tokens, sampling, num_samples,
                             stop_token_ids, seeds):  # fmt: skip
        from rlvr_jax.rollout import generate

        self.calls.append(len(prompts))
        out = []
        for i, (prompt, seed) in enumerate(zip(prompts, seeds)):
            for c in generate(self.model, [prompt], max_new_tokens=max_new_tokens,
                              temperature=sampling.temperature, num_samples=num_samples,
                              stop_token_ids=stop_token_ids, seed=seed):  # fmt: skip
                out.append(dataclasses_replace(c, i, self.version))
        return out


def dataclasses_replace(c, prompt_index, version):
    import dataclasses

    return dataclasses.replace(
        c, prompt_index=prompt_index, policy_versions=[version] * len(c.tokens)
    )


@pytest.mark.parametrize("threaded", [True, False])
@pytest.mark.slow
def test_vllm_scheduler_behind_the_stream_groups_requests_with_meta_and_weights(tmp_path, threaded):
    from rlvr_jax.rollout import RolloutStream
    from rlvr_jax.rollout.backends.vllm import VllmScheduler

    H.build_hf_checkpoint("qwen2", tmp_path, seed=5)
    model = models.load_pretrained(tmp_path)
    engine = EngineAsVllm(model)
    stream = RolloutStream(None, scheduler=VllmScheduler(engine, version=3), max_new_tokens=4)
    if threaded:
        stream.start()
    for rid, prompt in enumerate([[5, 6, 7], [9, 10], [11]]):
        stream.submit(rid, prompt, num_samples=2, seed=rid, meta={"row": rid})
    groups = stream.step() if not threaded else [stream.get(timeout=120) for _ in range(3)]
    by_id = {g.request_id: g for g in groups}
    assert sorted(by_id) == [0, 1, 2]
    for rid, g in by_id.items():
        assert g.meta == {"row": rid} and len(g.completions) == 2
        assert [c.sample_index for c in g.completions] == [0, 1]
        assert all(c.policy_versions == [3] * len(c.tokens) for c in g.completions)
    # a weight update is loaded before the next generate call, and tokens record it
    stream.update_weights(jax.tree.map(lambda x: 1.5 * x, model.params), 4)
    stream.submit(9, [5, 6], num_samples=1, seed=0, meta=None)
    (g,) = stream.step() if not threaded else [stream.get(timeout=120)]
    assert engine.loaded == [4] and g.completions[0].policy_versions[0] == 4
    with pytest.raises(ValueError, match="num_samples must be >= 1"):
        stream.submit(10, [5], num_samples=0, seed=0)
    stream.stop()


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


@pytest.mark.slow
def test_trainer_runs_on_the_vllm_backend_source(tmp_path, monkeypatch):
    # rollout.backend: vllm builds VllmStream (not our RolloutStream) behind the same source
    from helpers_train import tiny_run

    from rlvr_jax import config
    from rlvr_jax.rollout.backends import vllm as vllm_backend
    from rlvr_jax.training.loop import Trainer
    from rlvr_jax.training.metrics import read_jsonl

    built = []

    def fake_rollout(model, **_):
        built.append(EngineAsVllm(model))
        return built[-1]

    monkeypatch.setattr(vllm_backend, "VllmRollout", fake_rollout)
    cfg = config.load(
        tiny_run(tmp_path),
        ["rollout.backend=vllm", "train.max_steps=2", "log.progress_bar=false"],
    )
    trainer = Trainer(cfg)
    try:
        stream = trainer.source.rollouts.stream
        assert isinstance(stream.scheduler, vllm_backend.VllmScheduler)
        trainer.run()
    finally:
        trainer.close()
    # each update's weights were loaded into the one engine (step 2 generated with update 1's)
    # (how the driver splits a step's prompts over generate calls depends on thread timing):
    # 4 training prompts, and the probe prompt after each of the two pushes
    assert len(built) == 1 and sum(built[0].calls) == 4 + 2 and built[0].loaded == [1, 2]
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert all(0 <= r["push/probe_max_abs_logp"] < 1e-4 for r in rows), rows
