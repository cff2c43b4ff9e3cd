"""`rlvr-serve`: the OpenAI HTTP endpoint and JetStream's gRPC server, on loopback."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import helpers_models as H
import pytest

from rlvr_jax import models
from rlvr_jax.data.tokenizer import load_tokenizer
from rlvr_jax.rollout import generate
from rlvr_jax.serve.cli import build_parser, serve

VOCAB = H.TOKENIZER_VOCAB


def _wait_ready(ready_file: Path, proc_alive=lambda: True, seconds=180.0) -> dict:
    deadline = time.monotonic() + seconds
    while not ready_file.exists():
        assert proc_alive(), "server exited before it was ready"
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.1)
    return json.loads(ready_file.read_text())


@pytest.fixture(scope="module")
def server(chat_model_dir, tmp_path_factory):
    ready = tmp_path_factory.mktemp("ready") / "ports.json"
    args = build_parser().parse_args(
        [
            "--model",
            str(chat_model_dir),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--max-slots",
            "4",
            "--max-len",
            "64",
            "--temperature",
            "0",
            "--ready-file",
            str(ready),
        ]
    )
    stop = threading.Event()
    result = {}
    thread = threading.Thread(target=lambda: result.update(rc=serve(args, stop)), daemon=True)
    thread.start()
    ports = _wait_ready(ready, thread.is_alive)
    yield ports
    stop.set()
    thread.join(60)
    assert result == {"rc": 0}


def _post(port, path, body):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _expected(chat_model_dir, ids, n_tokens):
    """Greedy tokens / log-probs of our engine on the same checkpoint (EOS = id 1 stops)."""
    c = generate(
        models.load_pretrained(chat_model_dir),
        [ids],
        max_new_tokens=n_tokens,
        temperature=0.0,
        stop_token_ids=(1,),
    )[0]
    if c.finish_reason == "stop":
        return c.tokens[:-1], c.logprobs[:-1]
    return c.tokens, c.logprobs


@pytest.mark.smoke("serve")
def test_one_completion_over_loopback(server):
    """rlvr-serve end to end at the tiniest size: started in-process, it answers one greedy
    completion on its OpenAI endpoint."""
    status, body = _post(
        server["http_port"],
        "/v1/completions",
        {"prompt": "hello", "max_tokens": 2, "temperature": 0},
    )
    assert status == 200, body
    assert body["object"] == "text_completion" and len(body["choices"]) == 1
    assert body["choices"][0]["finish_reason"] in ("length", "stop")
    assert 1 <= body["usage"]["completion_tokens"] <= 2


@pytest.mark.slow
def test_completions_endpoint_answers_on_loopback(server, chat_model_dir):
    port = server["http_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as r:
        assert json.loads(r.read())["data"][0]["id"] == Path(chat_model_dir).name
    tok = load_tokenizer(chat_model_dir)
    status, body = _post(
        port,
        "/v1/completions",
        {
            "prompt": "hello world",
            "max_tokens": 6,
            "temperature": 0,
            "logprobs": 1,
        },
    )
    assert status == 200, body
    tokens, logprobs = _expected(chat_model_dir, tok.encode("hello world"), 6)
    choice = body["choices"][0]
    assert choice["text"] == tok.decode(tokens, skip_special_tokens=True)
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(logprobs, abs=1e-4)
    assert body["usage"]["completion_tokens"] >= len(tokens)
    assert body["object"] == "text_completion"

    status, body = _post(
        port,
        "/v1/completions",
        {
            "prompt": [[5, 6, 7], [8, 9]],
            "max_tokens": 4,
            "n": 2,
            "temperature": 1.0,
            "seed": 3,
        },
    )
    assert status == 200 and len(body["choices"]) == 4
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]


@pytest.mark.slow
def test_chat_completions_endpoint(server, chat_model_dir):
    messages = [{"role": "user", "content": "a plus b"}]
    status, body = _post(
        server["http_port"],
        "/v1/chat/completions",
        {
            "messages": messages,
            "max_tokens": 5,
            "temperature": 0,
        },
    )
    assert status == 200, body
    tok = load_tokenizer(chat_model_dir)
    ids = tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    tokens, _ = _expected(chat_model_dir, ids, 5)
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": tok.decode(tokens, skip_special_tokens=True),
    }
    assert body["object"] == "chat.completion"


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/completions", {"prompt": "hi", "echo": True}, 400, "'echo' is not supported"),
        (
            "/v1/completions",
            {"prompt": "hi", "stream_options": {"include_usage": True}},
            400,
            "'stream_options' is only allowed",
        ),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 500}, 400, "max_len=64"),
        ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
        ("/v1/completions", {"prompt": 5}, 400, "'prompt' must be"),
        ("/v1/completions", {"prompt": "hi", "n": "2"}, 400, "'n' must be int"),
        ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "'messages'"),
        ("/v1/embeddings", {"input": "hi"}, 404, "no route"),
    ],
)
def test_bad_requests_get_clear_errors(server, path, body, status, needle):
    got_status, got = _post(server["http_port"], path, body)
    assert got_status == status and needle in got["error"]["message"]


@pytest.mark.slow
def test_jetstream_grpc_server_answers(server):
    import grpc
    from jetstream.core.proto import jetstream_pb2 as pb
    from jetstream.core.proto import jetstream_pb2_grpc as pb_grpc

    with grpc.insecure_channel(f"127.0.0.1:{server['grpc_port']}") as channel:
        stub = pb_grpc.OrchestratorStub(channel)
        assert stub.HealthCheck(pb.HealthCheckRequest(), timeout=30).is_live
        request = pb.DecodeRequest(
            max_tokens=4, token_content=pb.DecodeRequest.TokenContent(token_ids=[5, 6, 7])
        )
        tokens = [
            t
            for r in stub.Decode(request, timeout=120)
            for t in r.stream_content.samples[0].token_ids
        ]
    assert 1 <= len(tokens) <= 4 and all(0 <= t < VOCAB for t in tokens)


@pytest.mark.slow
def test_a_failed_jetstream_thread_stops_the_server_with_status_1(
    server, chat_model_dir, tmp_path, capsys, monkeypatch
):
    # A second server whose engine's generate raises: it must exit 1 with the error on
    # stderr, and the (idle) module server, which shares the engine class, must not notice.
    import grpc
    from jetstream.core.proto import jetstream_pb2 as pb
    from jetstream.core.proto import jetstream_pb2_grpc as pb_grpc

    from rlvr_jax.rollout.backends.jetstream import engine_class

    def broken_generate(self, params, decode_state):
        raise RuntimeError("device fell over")

    monkeypatch.setattr(engine_class(), "generate", broken_generate)
    ready = tmp_path / "ports.json"
    args = build_parser().parse_args(
        [
            "--model",
            str(chat_model_dir),
            "--no-http",
            "--grpc-port",
            "0",
            "--max-slots",
            "4",
            "--max-len",
            "64",
            "--ready-file",
            str(ready),
        ]
    )
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(rc=serve(args, threading.Event())), daemon=True
    )
    thread.start()
    ports = _wait_ready(ready, thread.is_alive)
    with grpc.insecure_channel(f"127.0.0.1:{ports['grpc_port']}") as channel:
        request = pb.DecodeRequest(
            max_tokens=2, token_content=pb.DecodeRequest.TokenContent(token_ids=[5, 6])
        )
        with pytest.raises(grpc.RpcError):
            list(pb_grpc.OrchestratorStub(channel).Decode(request, timeout=60))
    thread.join(60)
    assert result == {"rc": 1}
    assert "device fell over" in capsys.readouterr().err
    monkeypatch.undo()
    status, _ = _post(server["http_port"], "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert status == 200
