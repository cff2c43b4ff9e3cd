"""Streaming answers of the OpenAI endpoint (in process, official `openai` client): tokens
reach the client as decode chunks finish, and a stopping server ends open streams."""

from __future__ import annotations

import threading
import time
import urllib.request

import openai
import pytest

from rlvr_jax import models
from rlvr_jax.data.tokenizer import load_tokenizer
from rlvr_jax.rollout import EngineCore, RolloutStream
from rlvr_jax.serve.http import OpenAIServer

CHUNK_S = 0.25  # each decode chunk is slowed to this


@pytest.fixture
def slow_server(chat_model_dir, request):
    core = EngineCore(models.load_pretrained(chat_model_dir), max_slots=2, max_len=64, chunk=4)
    generate = core.generate

    def slow_generate(*args, **kwargs):
        time.sleep(CHUNK_S)
        return generate(*args, **kwargs)

    core.generate = slow_generate
    stream = RolloutStream(core, max_new_tokens=16).start()
    timeout = getattr(request, "param", 600.0)
    server = OpenAIServer(
        stream, load_tokenizer(chat_model_dir), model_name="tiny", stop_token_ids=(),
        request_timeout=timeout,
    ).start()  # fmt: skip
    yield server
    server.stop()
    stream.stop()


def _client(server):
    return openai.OpenAI(api_key="-", base_url=f"{server.url}/v1", max_retries=0)


@pytest.mark.slow
def test_tokens_arrive_while_the_completion_is_generated(slow_server):
    start = time.monotonic()
    stream = _client(slow_server).completions.create(
        model="tiny", prompt=[5, 6, 7], max_tokens=24, temperature=1.0, seed=1, stream=True
    )
    arrivals = [(time.monotonic() - start, c.choices[0].text) for c in stream if c.choices]
    texted = [t for t, text in arrivals if text]
    total = arrivals[-1][0]
    # 24 tokens in chunks of 4, each >= 0.25 s: the first text is out >= 2 chunks before the end
    assert total >= 6 * CHUNK_S
    assert texted and texted[0] <= total - 2 * CHUNK_S, arrivals
    assert len(texted) >= 3


@pytest.mark.slow
def test_stopping_the_server_ends_open_streams(slow_server):
    stream = _client(slow_server).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=40,
        stream=True,
    )
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    stopper = threading.Thread(target=slow_server.stop)
    t0 = time.monotonic()
    stopper.start()
    with pytest.raises(openai.APIError, match="shutting down"):
        for _ in stream:
            pass
    stopper.join(10)
    assert not stopper.is_alive() and time.monotonic() - t0 < 6


@pytest.mark.parametrize("slow_server", [0.5], indirect=True)  # request_timeout 0.5 s
@pytest.mark.slow
def test_a_timed_out_request_leaves_the_engine_serving(slow_server):
    client = _client(slow_server)
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model="tiny", prompt=[5, 6], max_tokens=24)
    assert e.value.status_code == 504
    time.sleep(6 * CHUNK_S)  # its samples finish in the engine, their future resolved
    slow_server.stream.check()  # the driver thread did not fail
    with urllib.request.urlopen(f"{slow_server.url}/health", timeout=10) as r:
        assert r.status == 200
    chunks = list(client.completions.create(model="tiny", prompt=[5, 6], max_tokens=4, stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"  # (streams have no timeout)
