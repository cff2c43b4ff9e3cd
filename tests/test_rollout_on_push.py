"""`rollout.on_push`: what in-flight sequences do at a weight push. `keep` (the default) goes on
with the K/V the old weights computed; `recompute` drops it and prefills prompt and tokens so
far again with the new weights. Checked against a full re-forward of prompt + completion (an
independent computation): with `recompute`, every token sampled after the push has the new
policy's log-prob given the whole sequence, in both KV layouts; with `keep` it does not (the
check can fail); the tokens before the push keep the old version and log-probs."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from rlvr_jax import config, models
from rlvr_jax.config.checks import ConfigError
from rlvr_jax.rollout import EngineCore, GroupRequest, RolloutStream, SamplingParams, Scheduler

SMALL = dict(page_size=4, geometry_tokens=(8, 16, 8), prefill_chunk=8)
PROMPT = (5, 9, 14, 3, 27, 8, 40, 11, 2, 33)  # 9 cached tokens: prefilled in two chunks


def _moved(params, scale, seed):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: x + scale * rng.standard_normal(x.shape).astype(x.dtype), params)


def _reforward(model, prompt, tokens):
    """log softmax(logits)[token] of each completion token, one forward of the whole sequence."""
    logits = np.asarray(models.forward(model, np.array([[*prompt, *tokens]])))[0]
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    return np.array([logp[len(prompt) - 1 + i, t] for i, t in enumerate(tokens)])


def _run(model, new, layout, on_push):
    """Two samples of PROMPT (greedy, 20 tokens, chunks of 8), the params pushed after the
    first chunk; returns (completions, scheduler)."""
    core = EngineCore(model, max_slots=4, max_len=40, kv_layout=layout, **SMALL)
    sched = Scheduler(core, on_push=on_push)
    sampling = SamplingParams(temperature=0.0)
    sched.add(GroupRequest(0, 0, PROMPT, 2, seed=1, max_new_tokens=20, sampling=sampling))
    assert sched.step() == []  # 8 tokens under version 0
    sched.set_params(core.prepare(new), 1)
    (_, completions), *_ = sched.run()
    return completions, sched


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_recompute_on_push_reprefills_with_the_new_weights(qwen, layout):
    new = _moved(qwen.params, 0.05, seed=1)
    updated = dataclasses.replace(qwen, params=new)
    got, sched = _run(qwen, new, layout, "recompute")
    for c in got:
        assert c.policy_versions == [0] * 8 + [1] * 12 and c.prompt_version == 1
        np.testing.assert_allclose(
            c.logprobs[:8], _reforward(qwen, PROMPT, c.tokens[:8]), rtol=0, atol=2e-5
        )
        np.testing.assert_allclose(
            c.logprobs[8:], _reforward(updated, PROMPT, c.tokens)[8:], rtol=0, atol=2e-5
        )
    # both sequences were prefilled again: prompt and 8 tokens but the last, each
    assert sched.stats.recomputed_tokens == 2 * (len(PROMPT) - 1 + 8)
    assert sched.stats.preemptions == 0 and sched.pages_in_use == 0
    # `keep`: the same tokens sampled before the push, the old K/V after it
    kept, sched = _run(qwen, new, layout, "keep")
    assert [c.tokens[:8] for c in kept] == [c.tokens[:8] for c in got]
    assert sched.stats.recomputed_tokens == 0 and kept[0].prompt_version == 0
    gap = np.abs(kept[0].logprobs[8:] - _reforward(updated, PROMPT, kept[0].tokens)[8:])
    assert gap.max() > 1e-3  # a check that could fail: the old K/V shows


@pytest.mark.slow
def test_recompute_through_the_stream(qwen):
    # the stream's update at a chunk boundary, on a queue with a group waiting for slots
    new = _moved(qwen.params, 0.05, seed=2)
    core = EngineCore(qwen, max_slots=2, max_len=40, **SMALL)
    stream = RolloutStream(
        core, max_new_tokens=12, sampling=SamplingParams(temperature=0.0), on_push="recompute"
    )
    stream.submit("a", list(PROMPT), num_samples=2, seed=0)
    stream.submit("b", list(PROMPT[:4]), num_samples=2, seed=1)  # waits: 2 slots
    assert stream.step() == []
    stream.update_weights(new, version=1)
    groups = []
    while not stream.idle:
        groups += stream.step()
    assert [g.request_id for g in groups] == ["a", "b"]
    a, b = groups
    updated = dataclasses.replace(qwen, params=new)
    for c in a.completions:
        assert c.policy_versions == [0] * 8 + [1] * 4 and c.prompt_version == 1
        np.testing.assert_allclose(
            c.logprobs[8:], _reforward(updated, PROMPT, c.tokens)[8:], rtol=0, atol=2e-5
        )
    for c in b.completions:  # admitted after the push: all of it on the new weights
        assert c.policy_versions == [1] * 12 and c.prompt_version == 1
    assert stream.kv_metrics()["rollout/recomputed_tokens"] == 2 * (len(PROMPT) - 1 + 8)


def test_the_key_is_in_the_schema_and_checked():
    assert config.load(None, ["model.path=m"]).rollout.on_push == "keep"
    cfg = config.load(None, ["model.path=m", "rollout.on_push=recompute"])
    assert cfg.rollout.on_push == "recompute"
    with pytest.raises(ConfigError, match=r"rollout\.on_push"):
        config.load(None, ["model.path=m", "rollout.on_push=sometimes"])
