"""The scheduler's streaming hook: `GroupRequest.on_tokens(sample_index, tokens, logprobs)`,
reached through `RolloutStream.submit(..., on_tokens=..., future=True)`."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rlvr_jax.rollout import EngineCore, GroupRequest, RolloutStream, SamplingParams, Scheduler

CHUNK = 4


@pytest.fixture(scope="module")
def core(qwen):
    return EngineCore(qwen, max_slots=4, max_len=64, chunk=CHUNK)


@pytest.mark.slow
def test_hook_sees_every_token_per_chunk_before_the_group_completes(core):
    calls: list[tuple[int, list[int], list[float], bool]] = []
    resolved = threading.Event()

    def on_tokens(sample, tokens, logprobs):
        calls.append((sample, list(tokens), list(logprobs), resolved.is_set()))

    with RolloutStream(core, max_new_tokens=13).start() as stream:
        future = stream.submit(
            "r",
            [5, 6, 9],
            3,
            seed=11,
            sampling=SamplingParams(1.0),
            on_tokens=on_tokens,
            future=True,
        )
        future.add_done_callback(lambda _: resolved.set())
        group = future.result(timeout=120)
    assert calls and not any(after for *_, after in calls), "a hook call came after the result"
    assert all(1 <= len(tokens) <= CHUNK for _, tokens, _, _ in calls)  # one decode chunk each
    for c in group.completions:
        mine = [call for call in calls if call[0] == c.sample_index]
        assert len(c.tokens) == 13 and len(mine) >= 4  # 13 tokens in chunks of <= 4
        assert [t for _, ts, _, _ in mine for t in ts] == c.tokens
        np.testing.assert_allclose([x for _, _, lps, _ in mine for x in lps], c.logprobs)


@pytest.mark.slow
def test_requests_without_a_hook_are_unchanged(core):
    # the hook is optional and not part of a request's identity
    a = GroupRequest("k", 0, (5, 6), 1, seed=1, max_new_tokens=4)
    b = GroupRequest("k", 0, (5, 6), 1, seed=1, max_new_tokens=4, on_tokens=lambda *_: None)
    assert a == b
    scheduler = Scheduler(core)
    scheduler.add(a)
    [(request, [completion])] = scheduler.run()
    assert request is a and len(completion.tokens) >= 1
