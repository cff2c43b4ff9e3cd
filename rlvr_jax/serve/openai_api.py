"""The OpenAI API's request and response shapes, independent of the HTTP server.

`parse_request` turns a request body into a `ParsedRequest` (or `BadRequest` naming the
parameter); `ChoiceText` turns one sample's tokens into text deltas; the `*_response` /
`*_chunk` functions build the JSON the official `openai` client parses.

Fields: `prompt` (a string, a list of token ids, or a list of either) or `messages` (rendered
with the tokenizer's chat template; `tools`, `tool_choice` and tool messages: `serve.tools`),
`max_tokens` (`max_completion_tokens`), `temperature`, `top_p`, `n`, `stop`, `seed`,
`logprobs`, `stream`, `stream_options.include_usage`; `top_k` is accepted as an extension.
Unsupported options (`echo`, `suffix`, penalties, `logit_bias`, `best_of` other than n)
are rejected. Log-probs are those of the sampled tokens (ALGORITHMS.md convention);
`top_logprobs` lists only the sampled token.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from rlvr_jax.rollout.device.sampling import SamplingParams

Kind = Literal["completion", "chat"]

_REJECTED = {
    "echo": False,
    "suffix": None,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": None,
}
_REPLACEMENT = "\ufffd"  # what a decoder shows for an incomplete UTF-8 sequence


class BadRequest(ValueError):
    """A request the endpoint refuses (HTTP 400); `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ModelNotFound(BadRequest):
    """A request for a model the server does not serve (HTTP 404, code `model_not_found`, as
    OpenAI's API answers)."""


def check_model(body: Any, served: list[str]) -> None:
    """Raises `ModelNotFound` listing `served` when `body` names another model (a request
    that names none gets the served one)."""
    model = body.get("model") if isinstance(body, dict) else None
    if model is not None and model not in served:
        raise ModelNotFound(
            f"the model {model!r} does not exist on this server; it serves {served}", "model"
        )


def _field(body: dict, name: str, kinds: tuple[type, ...], default: Any) -> Any:
    """`body[name]` checked against `kinds` (absent or null: `default`)."""
    value = body.get(name)
    if value is None:
        return default
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise BadRequest(f"{name!r} must be {names}, got {value!r}", name)
    return value


@dataclasses.dataclass(frozen=True)
class ParsedRequest:
    """A validated request: what to generate and how to answer."""

    kind: Kind
    prompts: list[list[int]]
    """Token ids of each prompt (chat: one)."""
    n: int
    sampling: SamplingParams
    max_tokens: int
    stop_token_ids: tuple[int, ...]
    """The model's EOS ids plus the one-token stop strings."""
    stop: tuple[str, ...]
    seed: int
    logprobs: bool
    stream: bool
    include_usage: bool
    tools: Any = None
    """The chat request's `serve.tools.ToolRequest` (None: no tools)."""

    @property
    def num_choices(self) -> int:
        """Choices in the answer: n per prompt, prompt-major."""
        return len(self.prompts) * self.n


def parse_request(
    kind: Kind, body: Any, tokenizer: Any, eos_ids: Sequence[int], seeds: Iterator[int]
) -> ParsedRequest:
    """Validates `body`; raises `BadRequest` naming the offending parameter."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for name, neutral in _REJECTED.items():
        if body.get(name, neutral) not in (neutral, None, False, 0, {}):
            raise BadRequest(f"{name!r} is not supported by this server", name)
    stream = bool(_field(body, "stream", (bool,), False))
    options = _field(body, "stream_options", (dict,), None)
    if options is not None and not stream:
        raise BadRequest("'stream_options' is only allowed when 'stream' is true", "stream_options")
    include_usage = bool(_field(options or {}, "include_usage", (bool,), False))
    n = _field(body, "n", (int,), 1)
    if n < 1:
        raise BadRequest(f"'n' must be >= 1, got {n}", "n")
    if _field(body, "best_of", (int,), n) != n:
        raise BadRequest("'best_of' other than n is not supported", "best_of")
    try:
        sampling = SamplingParams(
            temperature=float(_field(body, "temperature", (int, float), 1.0)),
            top_p=float(_field(body, "top_p", (int, float), 1.0)),
            top_k=_field(body, "top_k", (int,), 0),
        )
    except ValueError as e:
        param = next((p for p in ("temperature", "top_p", "top_k") if p in str(e)), None)
        raise BadRequest(str(e), param) from None
    max_tokens = _field(body, "max_tokens", (int,), None)
    max_tokens = _field(
        body, "max_completion_tokens", (int,), 16 if max_tokens is None else max_tokens
    )
    if max_tokens < 1:
        name = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
        raise BadRequest(f"{name!r} must be >= 1, got {max_tokens}", name)
    stop = _field(body, "stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("'stop' must be a string or a list of non-empty strings", "stop")
    stop_ids = list(eos_ids)
    for s in stop:  # a one-token stop string stops generation on that token
        ids = tokenizer.encode(s, add_special_tokens=False)
        if len(ids) == 1:
            stop_ids.append(ids[0])
    seed = _field(body, "seed", (int,), None)
    seed = next(seeds) % 2**32 if seed is None else seed
    tools = None
    if kind == "chat":
        prompts, tools = _chat_prompt(body, tokenizer)
        prompts = [prompts]
        logprobs = bool(_field(body, "logprobs", (bool,), False))
    else:
        prompts = _completion_prompts(body, tokenizer)
        logprobs = _field(body, "logprobs", (int,), None) is not None
    return ParsedRequest(
        kind=kind,
        prompts=prompts,
        n=n,
        sampling=sampling,
        max_tokens=max_tokens,
        stop_token_ids=tuple(dict.fromkeys(stop_ids)),
        stop=tuple(stop),
        seed=seed,
        logprobs=logprobs,
        stream=stream,
        include_usage=include_usage,
        tools=tools,
    )


def _completion_prompts(body: dict, tokenizer: Any) -> list[list[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (
        isinstance(prompt, list) and prompt and isinstance(prompt[0], int)
    ):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest(
            "'prompt' must be a string, a token list, or a non-empty list of them", "prompt"
        )
    ids = []
    for p in prompt:
        if isinstance(p, str):
            ids.append([int(t) for t in tokenizer.encode(p)])
        elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            ids.append(list(p))
        else:
            raise BadRequest("each prompt must be a string or a list of token ids", "prompt")
    return ids


def _chat_prompt(body: dict, tokenizer: Any) -> tuple[list[int], Any]:
    from rlvr_jax.data.tokenizer import apply_chat_template
    from rlvr_jax.serve import tools as tool_api

    try:
        tools = tool_api.parse_tools(body)
        if tools is not None or "tool_calls" in str(body.get("messages")):
            return tool_api.prompt_ids(body, tokenizer, tools), tools
    except tool_api.ToolError as e:
        raise BadRequest(str(e), e.param) from None
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        )
    ):
        raise BadRequest(
            "'messages' must be a non-empty list of {role, content} strings", "messages"
        )
    try:
        return apply_chat_template(tokenizer, messages, add_generation_prompt=True), None
    except ValueError as e:
        raise BadRequest(str(e), "messages") from None


@dataclasses.dataclass
class Delta:
    """What one step of a choice adds: text, and the tokens / log-probs behind it."""

    text: str = ""
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)


class ChoiceText:
    """One sample's text as its tokens arrive (`feed`), then `finish`: the stop token is not
    part of it; text is held back while it ends in an incomplete UTF-8 sequence or could start
    a stop string, which ends the choice. Tokens are checked one at a time, so the streamed
    deltas concatenate to the plain answer's text."""

    def __init__(self, tokenizer: Any, stop_token_ids: Sequence[int], stop: Sequence[str]):
        self.tokenizer = tokenizer
        self.stop_token_ids = frozenset(stop_token_ids)
        self.stop = tuple(stop)
        self.hold = max(map(len, self.stop), default=1) - 1
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.text = ""
        """Text emitted so far."""
        self.finish_reason: str | None = None
        self.tools: Any = None
        """With tools: the `serve.tools.ToolStream` that holds content back around calls."""
        self._offset = 0  # tokens already emitted

    def feed(self, tokens: Sequence[int], logprobs: Sequence[float]) -> Delta:
        """New tokens of this sample; returns what may be shown now."""
        step = 1 if self.stop else max(len(tokens), 1)
        out = Delta()
        for i in range(0, len(tokens), step):
            if self.finish_reason is not None:
                break
            self._extend(tokens[i : i + step], logprobs[i : i + step])
            self._emit(out, self._decode(), final=False)
        return out

    def finish(self, finish_reason: str) -> Delta:
        """The rest of the text once the sample ended with `finish_reason`."""
        out = Delta()
        if self.finish_reason is None:
            self._emit(out, self._decode(), final=True)
            self.finish_reason = self.finish_reason or finish_reason
        return out

    def _extend(self, tokens: Sequence[int], logprobs: Sequence[float]) -> None:
        for t, lp in zip(tokens, logprobs):
            if t in self.stop_token_ids:
                self.finish_reason = "stop"
                return
            self.tokens.append(int(t))
            self.logprobs.append(float(lp))

    def _decode(self) -> str:
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def _emit(self, out: Delta, full: str, *, final: bool) -> None:
        hits = [full.find(s) for s in self.stop if s in full]
        if hits:
            full, final = full[: min(hits)], True
            self.finish_reason = "stop"
        elif self.finish_reason is not None:
            final = True
        safe = len(full)
        if not final:
            safe -= self.hold
            while safe > 0 and full[safe - 1] == _REPLACEMENT:
                safe -= 1
        if (safe <= len(self.text) or not full.startswith(self.text)) and not final:
            return
        new = full[len(self.text) : max(safe, len(self.text))]
        self.text += new
        out.text += new
        out.tokens += self.tokens[self._offset :]
        out.logprobs += self.logprobs[self._offset :]
        self._offset = len(self.tokens)


# ---- response shapes -------------------------------------------------------------------------


def new_id(kind: Kind) -> str:
    """A response id (`cmpl-...` / `chatcmpl-...`)."""
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """The `usage` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def logprobs_object(kind: Kind, tokenizer: Any, delta: Delta, text_offset: int) -> dict:
    """The `logprobs` of a choice (or of a stream chunk) in `kind`'s shape."""
    pieces = [tokenizer.decode([t]) for t in delta.tokens]
    if kind == "chat":
        return {
            "content": [
                {"token": p, "logprob": v, "top_logprobs": [{"token": p, "logprob": v}]}
                for p, v in zip(pieces, delta.logprobs)
            ]
        }
    offsets = list(itertools.accumulate([text_offset, *map(len, pieces)]))[:-1]
    return {
        "tokens": pieces,
        "token_logprobs": list(delta.logprobs),
        "top_logprobs": [{p: lp} for p, lp in zip(pieces, delta.logprobs)],
        "text_offset": offsets,
    }


def choice_object(
    kind: Kind,
    index: int,
    delta: Delta,
    finish_reason: str | None,
    logprobs: dict | None,
    tool_calls: list | None = None,
) -> dict:
    """A complete choice of a plain (non-streamed) answer (chat: with its `tool_calls`,
    `delta.text` then being the content before them, or None)."""
    if kind == "chat":
        body: dict = {"message": {"role": "assistant", "content": delta.text}}
        if tool_calls:
            body["message"]["tool_calls"], finish_reason = tool_calls, "tool_calls"
    else:
        body = {"text": delta.text}
    return {"index": index, **body, "finish_reason": finish_reason, "logprobs": logprobs}


def chunk_choice(
    kind: Kind,
    index: int,
    text: str | None,
    finish_reason: str | None,
    logprobs: dict | None,
    tool_calls: list | None = None,
) -> dict:
    """One choice of a stream chunk; `text` None opens a chat choice (the role delta)."""
    if kind == "chat":
        delta = {"role": "assistant", "content": ""} if text is None else {}
        if text:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(tool_calls)]
            finish_reason = "tool_calls"
        body: dict = {"delta": delta}
    else:
        body = {"text": text or ""}
    return {"index": index, **body, "finish_reason": finish_reason, "logprobs": logprobs}


def envelope(
    kind: Kind, response_id: str, model: str, choices: list, *, chunk: bool, **extra: Any
) -> dict:
    """The object around `choices`: a response (`chunk` False) or a stream chunk."""
    obj = {"chat": "chat.completion", "completion": "text_completion"}[kind]
    if chunk and kind == "chat":
        obj = "chat.completion.chunk"
    return {
        "id": response_id,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        **extra,
    }
