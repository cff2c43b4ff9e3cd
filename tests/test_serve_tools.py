"""`rlvr-serve` speaks tools: `tools` / `tool_choice` in, `tool_calls` out (plain and
streamed), tool messages in the conversation — checked with the official `openai` client
against the installed console script in a fresh process, serving a tiny model fine-tuned here
to answer one prompt with a Hermes tool call. The request/answer helpers are unit-tested
first."""

from __future__ import annotations

import json
from pathlib import Path

import helpers_cli as C
import helpers_models as H
import numpy as np
import openai
import pytest

import rlvr_jax
from rlvr_jax.serve.tools import (
    ToolError,
    ToolStream,
    parse_tools,
    split_calls,
    template_messages,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
MESSAGES = [{"role": "user", "content": "hello world"}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def test_tool_fields_and_answers():
    assert (
        parse_tools({}) is None and parse_tools({"tools": [WEATHER], "tool_choice": "none"}) is None
    )
    assert parse_tools({"tools": [WEATHER]}).prefix == ""
    assert parse_tools({"tools": [WEATHER], "tool_choice": "required"}).prefix == "<tool_call>"
    named = parse_tools(
        {
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        }
    )
    assert named.prefix == '<tool_call>{"name": "get_weather", "arguments": '
    for body, param in (
        ({"tools": [{"type": "code"}]}, "tools"),
        ({"tools": []}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"function": {"name": "other"}}}, "tool_choice"),
    ):
        with pytest.raises(ToolError) as e:
            parse_tools(body)
        assert e.value.param == param
    history = template_messages(
        [
            *MESSAGES,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]
    )  # fmt: skip
    assert history[1] == {"role": "assistant", "content": CALL}
    assert history[2] == {"role": "tool", "content": "sunny"}
    content, calls = split_calls(f"Let me look. {CALL}")
    assert content == "Let me look." and len(calls) == 1
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert split_calls("<tool_call>{broken</tool_call>") == ("<tool_call>{broken</tool_call>", [])
    # streaming: content shown as it comes, never a piece of the call
    stream, shown = ToolStream(""), ""
    for piece in ["Let me", " look. <tool", "_call>{", '"name": "get_weather", "arguments": ',
                  '{"city": "Paris"}}</tool_call>']:  # fmt: skip
        shown += stream.content(piece)
        assert "<" not in shown
    rest, calls = stream.finish()
    assert shown + rest == "Let me look. " and calls[0]["function"]["name"] == "get_weather"
    stream = ToolStream("")
    assert stream.content("a < b <tool") == "a < b " and stream.finish() == ("<tool", [])


def _memorize(path: Path, steps: int = 300) -> None:
    """Fine-tunes the checkpoint at `path` until greedy decoding of MESSAGES with the
    WEATHER tool answers CALL, and saves it there."""
    import jax
    import jax.numpy as jnp
    import optax

    from rlvr_jax import models
    from rlvr_jax.data import load_tokenizer
    from rlvr_jax.envs import ChatFormat
    from rlvr_jax.rollout import generate

    tokenizer = load_tokenizer(path)
    model = models.load_pretrained(path)
    chat = ChatFormat(tokenizer, [WEATHER])
    prompt = chat.prompt_ids(MESSAGES)
    answer = [*chat.encode(CALL), tokenizer.eos_token_id]
    tokens = np.array([prompt + answer])
    mask = np.zeros(tokens.shape[1] - 1, np.float32)
    mask[len(prompt) - 1 :] = 1.0
    opt = optax.adam(3e-3)

    def loss(params):
        logits = models.forward(models.Model(model.config, params), tokens[:, :-1])[0]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        picked = jnp.take_along_axis(logp, tokens[0, 1:, None], axis=-1)[:, 0]
        return -(picked * mask).sum() / mask.sum()

    @jax.jit
    def step(params, state):
        value, grads = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    params, state = model.params, opt.init(model.params)
    for _ in range(steps):
        params, state, value = step(params, state)
    model = models.Model(model.config, params)
    done = generate(model, [prompt], max_new_tokens=len(answer) + 4, temperature=0.0,
                    stop_token_ids=(tokenizer.eos_token_id,))  # fmt: skip
    assert done[0].tokens == answer, f"not memorized (loss {float(value):.3f})"
    models.save_pretrained(model, path, tokenizer_dir=path)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = H.build_chat_model(tmp_path_factory.mktemp("serve_tools_model"))
    _memorize(path)
    work = tmp_path_factory.mktemp("serve_tools")
    ready = work / "ready.json"
    args = ["--model", str(path), "--http-port", "0", "--grpc-port", "0", "--max-len", "256",
            "--temperature", "0", "--ready-file", str(ready), "--model-name", "policy"]  # fmt: skip
    # the worktree's package in the server process too (the console script is main's venv)
    pythonpath = str(Path(rlvr_jax.__file__).parents[1])
    proc = C.Proc("rlvr-serve", args, work, PYTHONPATH=pythonpath)
    port = proc.wait_for_file(ready, 120.0)["http_port"]
    yield openai.OpenAI(api_key="-", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    proc.stop()


def _ask(client, **kwargs):
    return client.chat.completions.create(
        model="policy", messages=MESSAGES, max_tokens=96, temperature=0.0, **kwargs
    )


@pytest.mark.slow
def test_openai_client_gets_tool_calls(server):
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        answer = _ask(server, tools=[WEATHER], tool_choice=choice).choices[0]
        assert answer.finish_reason == "tool_calls" and answer.message.content is None
        (call,) = answer.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
    # streamed: the call in deltas, no piece of it as content
    chunks = list(_ask(server, tools=[WEATHER], stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert "<tool_call>" not in content and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_")
    assert json.loads("".join(d.function.arguments for d in deltas)) == {"city": "Paris"}
    # tools withheld: no calls; a conversation with a call and its result is accepted
    assert _ask(server, tools=[WEATHER], tool_choice="none").choices[0].message.tool_calls is None
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]  # fmt: skip
    answer = server.chat.completions.create(
        model="policy", messages=history, tools=[WEATHER], max_tokens=8, temperature=0.0
    )
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with pytest.raises(openai.BadRequestError) as e:
        _ask(server, tools=[{"type": "code"}])
    assert e.value.body["param"] == "tools"
