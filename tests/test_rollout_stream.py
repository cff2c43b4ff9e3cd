"""`RolloutStream`: streaming groups, backpressure, in-flight weight updates, error surfacing."""

from __future__ import annotations

import time

import helpers_models as H
import jax
import numpy as np
import pytest

from rlvr_jax.rollout import (
    EngineCore,
    RequestError,
    RolloutError,
    RolloutStream,
    SamplingParams,
    SlotRequest,
    generate,
    request_seed,
)

STOP = (7, 11, 19, 23)
GREEDY = SamplingParams(temperature=0.0)


def _prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(2, H.VOCAB, n).tolist() for n in lengths]


@pytest.fixture(scope="module")
def core(qwen):
    return EngineCore(qwen, max_slots=4, max_len=64)


def _wait(predicate, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


@pytest.mark.slow
def test_threaded_stream_matches_generate(core):
    prompts = _prompts([4, 6, 3, 5], seed=2)
    want = generate(core, prompts, max_new_tokens=10, num_samples=2, seed=3, stop_token_ids=STOP)
    with RolloutStream(core, max_new_tokens=10, stop_token_ids=STOP).start() as stream:
        for i, p in enumerate(prompts):
            stream.submit(("req", i), p, num_samples=2, seed=request_seed(3, i), meta={"i": i})
        groups = {g.request_id: g for g in (stream.get(timeout=120) for _ in prompts)}
    for i, p in enumerate(prompts):
        group = groups["req", i]
        assert group.meta == {"i": i} and group.prompt_tokens == p
        assert [c.sample_index for c in group.completions] == [0, 1]
        for c, w in zip(group.completions, want[2 * i : 2 * i + 2]):
            assert (c.tokens, c.finish_reason) == (w.tokens, w.finish_reason)
            np.testing.assert_allclose(c.logprobs, w.logprobs, atol=1e-5)


@pytest.mark.slow
def test_groups_come_out_as_they_finish(core):
    stream = RolloutStream(core, max_new_tokens=40, sampling=GREEDY).start()
    try:
        stream.submit("long", [5, 6, 7], num_samples=2, seed=0)
        stream.submit("short", [8, 9], num_samples=2, seed=0, max_new_tokens=2)
        first, second = stream.get(timeout=120), stream.get(timeout=120)
    finally:
        stream.stop()
    assert (first.request_id, second.request_id) == ("short", "long")
    assert [len(c.tokens) for c in first.completions] == [2, 2]
    assert [len(c.tokens) for c in second.completions] == [40, 40]


@pytest.mark.slow
def test_backpressure_on_submit_and_on_ready_groups(core):
    idle = RolloutStream(core, max_new_tokens=4, max_pending_groups=1)  # never started
    idle.submit("a", [3, 4], num_samples=1, seed=0)
    with pytest.raises(TimeoutError, match="1 groups still pending"):
        idle.submit("b", [3, 4], num_samples=1, seed=0, timeout=0.05)

    # Each group fills both slots; with one ready group untaken, nothing more is admitted.
    stream = RolloutStream(core, max_new_tokens=3, max_ready_groups=1, num_slots=2).start()
    try:
        for i in range(3):
            stream.submit(i, [5, 6, 7], num_samples=2, seed=i)
        _wait(lambda: stream.ready == 1)
        time.sleep(0.3)
        assert (stream.ready, stream.pending) == (1, 2)
        assert [stream.get(timeout=60).request_id for _ in range(3)] == [0, 1, 2]
    finally:
        stream.stop()


@pytest.mark.slow
def test_weight_update_mid_generation_keeps_kv_and_records_versions(core):
    prompt = _prompts([5], seed=6)[0]
    rng = np.random.default_rng(0)
    new_params = jax.tree.map(
        lambda x: x + 0.3 * rng.standard_normal(x.shape).astype(np.float32), core.model.params
    )
    stream = RolloutStream(core, max_new_tokens=20, sampling=GREEDY)
    stream.submit("x", prompt, num_samples=1, seed=0)
    assert stream.step() == []  # one chunk: 8 tokens under version 0
    stream.update_weights(new_params, version=1)
    groups = []
    while not stream.idle:
        groups += stream.step()
    (c,) = groups[0].completions
    assert c.policy_versions == [0] * 8 + [1] * 12
    assert c.policy_version == 0

    old = generate(core, [prompt], max_new_tokens=20, temperature=0.0)[0].tokens
    assert c.tokens[:8] == old[:8] and c.tokens[8:] != old[8:]
    # Reference: K/V of the prompt and first 7 tokens under the OLD weights, then greedy
    # decoding under the NEW weights from token 8 on.
    new_dp = core.prepare(new_params)
    request = [SlotRequest(0, 0, 12, GREEDY)]

    def continue_with(prefill_params):
        prefix = core.prefill(prefill_params, prompt + c.tokens[:8])
        state = core.insert(prefix, core.init_decode_state(), [0], request)
        _, out = core.generate(new_dp, state, n_steps=12)
        return np.asarray(out.tokens_BxC[0]).tolist()

    assert c.tokens[8:] == continue_with(core.params)
    # Re-prefilling under the new weights would have given other tokens: the cache was kept.
    assert c.tokens[8:] != continue_with(new_dp)


def test_driver_failure_is_surfaced_to_every_caller(core):
    stream = RolloutStream(core, max_new_tokens=4)

    def boom(**kwargs):
        raise RuntimeError("boom in decode")

    stream.scheduler.step = boom
    stream.start()
    future = stream.submit("f", [3, 4], num_samples=1, seed=0, future=True)
    with pytest.raises(RolloutError, match="boom in decode") as info:
        stream.get(timeout=60)
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(RolloutError, match="boom in decode"):
        future.result(timeout=10)
    with pytest.raises(RolloutError):
        stream.submit("late", [3], num_samples=1, seed=0)
    with pytest.raises(RolloutError):
        stream.check()
    stream.stop()


def test_stream_misuse_raises_clearly(core):
    stream = RolloutStream(core, max_new_tokens=4)
    stream.submit("a", [3, 4], num_samples=1, seed=0)
    with pytest.raises(ValueError, match="already in flight"):
        stream.submit("a", [5], num_samples=1, seed=0)
    with pytest.raises(RequestError, match="exceeds the engine's max_len=64"):
        stream.submit("long", [3] * 62, num_samples=1, seed=0)
    with pytest.raises(RequestError, match="num_samples"):
        stream.submit("zero", [3], num_samples=0, seed=0)
    with pytest.raises(RequestError, match=r"token ids must be in \[0, 128\)"):
        stream.submit("oov", [3, 128], num_samples=1, seed=0)  # fails here, not in the driver
    with pytest.raises(RequestError, match="seed"):
        stream.submit("neg", [3], num_samples=1, seed=-1)
    stream.start()
    with pytest.raises(RuntimeError, match="driven by its thread"):
        stream.step()
    assert stream.get(timeout=60).request_id == "a"
    with pytest.raises(TimeoutError):
        stream.get(timeout=0.05)
    stream.stop()
    with pytest.raises(RolloutError, match="stopped"):
        stream.get(timeout=1)
    with pytest.raises(TypeError, match="needs an EngineCore"):
        RolloutStream(object(), max_new_tokens=4)
