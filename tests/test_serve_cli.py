"""`rlvr-serve` started as a user starts it (the installed console script, a fresh process),
answering JetStream's gRPC proto client and the official `openai` client; SIGTERM while idle,
while streaming, and after an engine failure; 200 concurrent streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
import urllib.request
from pathlib import Path

import grpc
import helpers_cli as C
import helpers_models as H
import openai
import psutil
import pytest
from jetstream.core.proto import jetstream_pb2 as pb
from jetstream.core.proto import jetstream_pb2_grpc as pb_grpc

from rlvr_jax import models
from rlvr_jax.data.tokenizer import apply_chat_template, load_tokenizer
from rlvr_jax.rollout import generate

pytestmark = pytest.mark.slow

VOCAB = H.TOKENIZER_VOCAB
EOS = 1  # the trained tokenizer's <|im_end|>
READY_S = 60.0
STOP_S = 10.0


class Server:
    """A running `rlvr-serve` (both front ends) and its ports."""

    def __init__(self, chat_model_dir: Path, workdir: Path, *extra: str, **env: str):
        self.ready_file = workdir / "ready.json"
        # the engine from a trainer-style config's rollout: section (a flag overrides it):
        # 8 slots over 1,024 tokens of pages
        config = workdir / "serve.yaml"
        config.write_text(
            f"model: {{path: {chat_model_dir}}}\n"
            "rollout: {max_slots: 8, page_size: 8, kv_pages: 128, temperature: 1.0}\n"
        )
        args = ["--model", str(chat_model_dir), "--http-port", "0", "--grpc-port", "0"]
        args += ["--config", str(config), "--max-len", "128", "--temperature", "0"]
        args += ["--model-name", "m"]  # what requests name
        self.proc = C.Proc(
            "rlvr-serve", [*args, "--ready-file", str(self.ready_file), *extra], workdir, **env
        )
        ports = self.proc.wait_for_file(self.ready_file, READY_S)
        self.http, self.grpc = ports["http_port"], ports["grpc_port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/health", timeout=10) as r:
            assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}
        with grpc.insecure_channel(f"127.0.0.1:{self.grpc}") as channel:
            health = pb_grpc.OrchestratorStub(channel).HealthCheck(
                pb.HealthCheckRequest(), timeout=10
            )
            assert health.is_live
        self.ready_s = time.monotonic() - self.proc.started
        assert self.ready_s < READY_S

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            api_key="-", base_url=f"http://127.0.0.1:{self.http}/v1", max_retries=0
        )

    def decode(self, max_tokens: int, **content) -> list:
        with grpc.insecure_channel(f"127.0.0.1:{self.grpc}") as channel:
            request = pb.DecodeRequest(max_tokens=max_tokens, **content)
            stub = pb_grpc.OrchestratorStub(channel)
            return [r.stream_content.samples[0] for r in stub.Decode(request, timeout=120)]


@pytest.fixture(scope="module")
def server(chat_model_dir, tmp_path_factory):
    s = Server(chat_model_dir, tmp_path_factory.mktemp("serve_cli"))
    print(f"rlvr-serve ready (ready file, /health 200, gRPC live) in {s.ready_s:.1f} s")
    yield s
    s.proc.kill()


def test_kv_flags_reach_the_engine_and_conflicts_are_named(tmp_path):
    from rlvr_jax.config.schema import RolloutConfig
    from rlvr_jax.serve.cli import build_parser, rollout_config

    args = build_parser().parse_args(["--model", "m", "--kv-layout", "contiguous"])
    assert rollout_config(args) == RolloutConfig(kv_layout="contiguous")
    # a trainer config's rollout: section sets the engine; flags given override it
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: {path: x}\nrollout: {max_slots: 4, page_size: 8, kv_pages: 64}\n")
    args = build_parser().parse_args(["--model", "m", "--config", str(cfg), "--page-size", "4"])
    assert rollout_config(args) == RolloutConfig(max_slots=4, page_size=4, kv_pages=64)
    args = build_parser().parse_args(["--model", "m", "--config", str(cfg), "--kv-cache-gib", "1"])
    assert rollout_config(args) == RolloutConfig(max_slots=4, page_size=8, kv_cache_gib=1.0)
    # both budgets: refused at once, before any model is loaded (the path does not exist)
    both = ["--model", str(tmp_path / "none"), "--kv-pages", "64", "--kv-cache-gib", "1"]
    proc = C.Proc("rlvr-serve", both, tmp_path)
    assert proc.wait(60) == 2
    assert "--kv-pages or --kv-cache-gib, not both" in proc.stderr()


def _greedy(chat_model_dir, ids, n_tokens):
    c = generate(
        models.load_pretrained(chat_model_dir),
        [ids],
        max_new_tokens=n_tokens,
        temperature=0.0,
        stop_token_ids=(EOS,),
    )[0]
    return c.tokens[:-1] if c.finish_reason == "stop" else c.tokens


def test_openai_client_completions_chat_and_n(server, chat_model_dir):
    tok = load_tokenizer(chat_model_dir)
    client = server.client()
    r = client.completions.create(model="m", prompt="hello world", max_tokens=8, temperature=0)
    assert r.choices[0].text == tok.decode(
        _greedy(chat_model_dir, tok.encode("hello world"), 8), skip_special_tokens=True
    )
    messages = [{"role": "user", "content": "a plus b"}]
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=0)
    ids = apply_chat_template(tok, messages)
    assert r.choices[0].message.content == tok.decode(
        _greedy(chat_model_dir, ids, 6), skip_special_tokens=True
    )
    assert r.usage.prompt_tokens == len(ids)
    r = client.completions.create(model="m", prompt=[[5, 6], [7]], max_tokens=4, n=3, seed=1)
    assert [c.index for c in r.choices] == list(range(6))
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=4, n=2, seed=2)
    assert len(r.choices) == 2 and r.usage.completion_tokens >= 2


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_streaming_with_usage_matches_the_plain_answer(server, kind):
    client = server.client()
    if kind == "chat":
        create = client.chat.completions.create
        kwargs = {"messages": [{"role": "user", "content": "the lazy dog"}]}
    else:
        create, kwargs = client.completions.create, {"prompt": "the lazy dog"}
    kwargs.update(model="m", max_tokens=40, n=2, seed=9, temperature=1.0)
    plain = create(**kwargs)
    chunks = list(create(**kwargs, stream=True, stream_options={"include_usage": True}))
    texts, finish = {}, {}
    for chunk in chunks[:-1]:
        assert chunk.usage is None and len(chunk.choices) == 1
        c = chunk.choices[0]
        piece = c.delta.content if kind == "chat" else c.text
        texts[c.index] = texts.get(c.index, "") + (piece or "")
        if c.finish_reason:
            finish[c.index] = c.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage
    for c in plain.choices:
        assert texts[c.index] == (c.message.content if kind == "chat" else c.text)
        assert finish[c.index] == c.finish_reason
    assert len(chunks) > 4  # text came in pieces, not in one final chunk


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"prompt": "hi", "max_tokens": 500}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": -3}, "max_tokens"),
        ({"prompt": "hi", "top_p": 0}, "top_p"),
        ({"prompt": "hi", "extra_body": {"n": "2"}}, "n"),
        ({"prompt": "hi", "echo": True}, "echo"),
        ({"prompt": [[5, 99999]]}, "prompt"),
    ],
)
def test_bad_input_is_a_400_naming_the_parameter(server, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model="m", **kwargs)
    assert e.value.body["param"] == param, e.value.body
    assert "max_new_tokens" not in e.value.body["message"]  # the API's names, not the engine's


def test_unknown_model_is_a_404_listing_the_served_one(server):
    client = server.client()
    assert [m.id for m in client.models.list()] == ["m"]
    for create, kwargs in (
        (client.completions.create, {"prompt": "hi"}),
        (client.chat.completions.create, {"messages": [{"role": "user", "content": "hi"}]}),
    ):
        with pytest.raises(openai.NotFoundError) as e:
            create(model="gpt-4o", max_tokens=2, **kwargs)
        assert e.value.status_code == 404
        assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
        assert "'gpt-4o' does not exist" in e.value.body["message"]
        assert "['m']" in e.value.body["message"]


def test_jetstream_proto_client(server):
    samples = server.decode(6, token_content=pb.DecodeRequest.TokenContent(token_ids=[5, 6, 7]))
    tokens = [t for s in samples for t in s.token_ids]
    assert 1 <= len(tokens) <= 6 and all(0 <= t < VOCAB for t in tokens)
    samples = server.decode(4, text_content=pb.DecodeRequest.TextContent(text="hello world"))
    assert 1 <= sum(len(s.token_ids) for s in samples) <= 4


def test_200_concurrent_streams_all_complete_and_memory_returns_to_idle(server):
    proc = psutil.Process(server.proc.pid)

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, int, str]:
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": f"hello {i}"}],
            max_tokens=24,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, used = "", None, -1
        async for chunk in stream:
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
            if chunk.usage is not None:
                used = chunk.usage.completion_tokens
        return finish, used, text

    async def load(n: int) -> list:
        url = f"http://127.0.0.1:{server.http}/v1"
        async with openai.AsyncOpenAI(
            api_key="-", base_url=url, max_retries=0, timeout=300
        ) as client:  # one keep-alive pool, up to 1000 connections
            return await asyncio.gather(*(one(client, i) for i in range(n)))

    asyncio.run(load(16))  # compiles every shape the load uses
    time.sleep(1.0)
    idle = proc.memory_info().rss
    t0 = time.monotonic()
    results = asyncio.run(load(200))
    seconds = time.monotonic() - t0
    assert len(results) == 200
    assert all(finish in ("stop", "length") and 1 <= used <= 24 for finish, used, _ in results)
    deadline, after = time.monotonic() + 15, proc.memory_info().rss
    while after > idle + 64 * 2**20 and time.monotonic() < deadline:
        time.sleep(0.5)
        after = proc.memory_info().rss
    print(
        f"200 streams in {seconds:.1f} s; server RSS idle {idle / 2**20:.0f} MiB, "
        f"after {after / 2**20:.0f} MiB"
    )
    assert after <= idle + 64 * 2**20  # back to idle, within allocator slack


def test_sigterm_while_idle(server):
    rc, seconds = server.proc.stop(signal.SIGTERM)
    assert rc == 0 and seconds < STOP_S, server.proc.stderr()
    assert "SIGTERM received" in server.proc.stderr()


def test_sigterm_while_streaming(chat_model_dir, tmp_path):
    # one token per decode call, 0.3 s each: both streams last > 30 s unless stopped
    s = Server(chat_model_dir, tmp_path, "--chunk", "1", RLVR_TEST_SLOW_GENERATE="0.3")
    stream = s.client().completions.create(model="m", prompt="hello", max_tokens=100, stream=True)
    first = next(iter(stream))
    assert first.choices[0].finish_reason is None
    with grpc.insecure_channel(f"127.0.0.1:{s.grpc}") as channel:
        request = pb.DecodeRequest(
            max_tokens=100, token_content=pb.DecodeRequest.TokenContent(token_ids=[5, 6])
        )
        decoding = pb_grpc.OrchestratorStub(channel).Decode(request, timeout=120)
        received = len(next(decoding).stream_content.samples[0].token_ids)  # producing too
        rc, seconds = s.proc.stop(signal.SIGTERM)
        with contextlib.suppress(grpc.RpcError):  # cancelled, or ended by the server
            for response in decoding:
                received += len(response.stream_content.samples[0].token_ids)
        assert received < 100  # cut short, not served to the end
    assert rc == 0 and seconds < STOP_S, s.proc.stderr()
    with pytest.raises((openai.APIError, openai.APIConnectionError)):
        list(stream)


@pytest.mark.parametrize("front_end", ["http", "grpc"])
def test_sigterm_after_an_engine_failure(chat_model_dir, tmp_path, front_end):
    fail = tmp_path / "fail-now"
    s = Server(chat_model_dir, tmp_path, RLVR_TEST_FAIL_FILE=str(fail))
    fail.touch()
    if front_end == "http":
        with pytest.raises((openai.APIError, openai.APIConnectionError)):
            s.client().completions.create(model="m", prompt="hello", max_tokens=4)
    else:
        with pytest.raises(grpc.RpcError):
            s.decode(4, token_content=pb.DecodeRequest.TokenContent(token_ids=[5, 6]))
    rc, seconds = s.proc.stop(signal.SIGTERM)
    assert rc == 1 and seconds < STOP_S
    assert "injected engine failure" in s.proc.stderr()
