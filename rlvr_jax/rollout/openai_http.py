"""An OpenAI-compatible HTTP endpoint over a `RolloutStream` (stdlib `http.server`).

Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`,
`GET /health`. Requests carry the usual OpenAI fields: `prompt` (a string, a list of
token ids, or a list of either) or `messages` (rendered with the tokenizer's chat
template), `max_tokens` (`max_completion_tokens`), `temperature`, `top_p`, `n`, `stop`,
`seed`, `logprobs`; `top_k` is accepted as an extension. The model's EOS always stops.
A stop string that is one token stops generation there; a longer one cuts the text after
generation. Unsupported options (`stream`, `echo`, `suffix`, penalties, `logit_bias`,
`best_of` > n) are rejected with a 400 naming them. Log-probs are those of the sampled
tokens (ALGORITHMS.md convention); `top_logprobs` lists only the sampled token.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlvr_jax.rollout.engine import RequestError
from rlvr_jax.rollout.sampling import SamplingParams
from rlvr_jax.rollout.stream import CompletedGroup, RolloutError, RolloutStream

_REJECTED = {
    "stream": False,
    "echo": False,
    "suffix": None,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": None,
}


class BadRequest(ValueError):
    """A request the endpoint refuses (HTTP 400); `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _field(body: dict, name: str, kinds: tuple[type, ...], default: Any) -> Any:
    """`body[name]` checked against `kinds` (absent or null: `default`)."""
    value = body.get(name)
    if value is None:
        return default
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise BadRequest(f"{name!r} must be {names}, got {value!r}", name)
    return value


class OpenAIServer:
    """Serves `stream` (started here if not yet) over HTTP on `host:port` (port 0 = any).

    Args:
      stream: the engine's request stream. tokenizer: the HF tokenizer of the model.
      model_name: the id `/v1/models` reports. stop_token_ids: always stop (the EOS ids).
      request_timeout: seconds a request may wait for its completions.
    """

    def __init__(
        self,
        stream: RolloutStream,
        tokenizer: Any,
        *,
        model_name: str,
        stop_token_ids: tuple[int, ...],
        host: str = "127.0.0.1",
        port: int = 0,
        request_timeout: float = 600.0,
    ):
        self.stream = stream
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.stop_token_ids = tuple(stop_token_ids)
        self.request_timeout = request_timeout
        self._seeds = itertools.count(int(time.time()))
        self._httpd = ThreadingHTTPServer((host, port), _handler_class(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. `http://127.0.0.1:8000`."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def port(self) -> int:
        """The bound port."""
        return self._httpd.server_address[1]

    def start(self) -> OpenAIServer:
        """Serves in a background thread; returns self."""
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="openai-http", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops serving (the stream is left to its owner)."""
        self._httpd.shutdown()
        self._httpd.server_close()

    # ---- request handling -----------------------------------------------------------------

    def _sampling(self, body: dict) -> tuple[SamplingParams, int, int, tuple, list[str], int]:
        for name, neutral in _REJECTED.items():
            if body.get(name, neutral) not in (neutral, None, False, 0, {}):
                raise BadRequest(f"{name!r} is not supported by this server", name)
        n = _field(body, "n", (int,), 1)
        if _field(body, "best_of", (int,), n) != n:
            raise BadRequest("'best_of' other than n is not supported", "best_of")
        try:
            sampling = SamplingParams(
                temperature=float(_field(body, "temperature", (int, float), 1.0)),
                top_p=float(_field(body, "top_p", (int, float), 1.0)),
                top_k=_field(body, "top_k", (int,), 0),
            )
        except ValueError as e:
            raise BadRequest(str(e)) from None
        max_tokens = _field(body, "max_tokens", (int,), None)
        max_tokens = _field(
            body, "max_completion_tokens", (int,), 16 if max_tokens is None else max_tokens
        )
        stop = _field(body, "stop", (str, list), [])
        stop = [stop] if isinstance(stop, str) else stop
        if not all(isinstance(s, str) and s for s in stop):
            raise BadRequest("'stop' must be a string or a list of non-empty strings", "stop")
        stop_ids = list(self.stop_token_ids)
        for s in stop:  # a one-token stop string stops generation on that token
            ids = self.tokenizer.encode(s, add_special_tokens=False)
            if len(ids) == 1:
                stop_ids.append(ids[0])
        seed = _field(body, "seed", (int,), None)
        seed = next(self._seeds) % 2**32 if seed is None else seed
        return sampling, n, max_tokens, tuple(dict.fromkeys(stop_ids)), stop, seed

    def _run(self, prompts: list[list[int]], body: dict) -> list[tuple[CompletedGroup, list[str]]]:
        sampling, n, max_tokens, stop_ids, stop_strings, seed = self._sampling(body)
        futures = []
        try:
            for i, prompt in enumerate(prompts):
                futures.append(
                    self.stream.submit_future(
                        uuid.uuid4().hex,
                        prompt,
                        n,
                        (seed + i) % 2**32,
                        max_new_tokens=max_tokens,
                        sampling=sampling,
                        stop_token_ids=stop_ids,
                    )
                )
        except RequestError as e:
            raise BadRequest(str(e)) from None
        return [(f.result(timeout=self.request_timeout), stop_strings) for f in futures]

    def _choice(self, completion: Any, stop_strings: list[str]) -> tuple[str, str, list, list]:
        """(text, finish_reason, tokens, logprobs) with the stop token / string removed."""
        tokens, logprobs = list(completion.tokens), list(completion.logprobs)
        reason = completion.finish_reason
        if reason == "stop":
            tokens, logprobs = tokens[:-1], logprobs[:-1]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cut = [text.index(s) for s in stop_strings if s in text]
        if cut:
            text, reason = text[: min(cut)], "stop"
        return text, reason, tokens, logprobs

    def _logprobs(self, tokens: list[int], logprobs: list[float]) -> dict:
        pieces = [self.tokenizer.decode([t]) for t in tokens]
        offsets = list(itertools.accumulate([0, *map(len, pieces)]))[:-1]
        return {
            "tokens": pieces,
            "token_logprobs": logprobs,
            "top_logprobs": [{p: lp} for p, lp in zip(pieces, logprobs)],
            "text_offset": offsets,
        }

    def completions(self, body: dict) -> dict:
        """The `/v1/completions` response of `body`."""
        prompt = body.get("prompt")
        if isinstance(prompt, str) or (
            isinstance(prompt, list) and prompt and isinstance(prompt[0], int)
        ):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise BadRequest(
                "'prompt' must be a string, a token list, or a non-empty list of them", "prompt"
            )
        ids = [self._encode(p) for p in prompt]
        want_logprobs = _field(body, "logprobs", (int,), None) is not None
        choices, used = [], 0
        for group, stops in self._run(ids, body):
            for c in group.completions:
                text, reason, tokens, logprobs = self._choice(c, stops)
                used += len(c.tokens)
                choices.append(
                    {
                        "index": len(choices),
                        "text": text,
                        "finish_reason": reason,
                        "logprobs": self._logprobs(tokens, logprobs) if want_logprobs else None,
                    }
                )
        return self._envelope("text_completion", choices, sum(map(len, ids)), used)

    def chat_completions(self, body: dict) -> dict:
        """The `/v1/chat/completions` response of `body`."""
        from rlvr_jax.data.tokenizer import apply_chat_template

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
            ids = apply_chat_template(self.tokenizer, messages, add_generation_prompt=True)
        except ValueError as e:
            raise BadRequest(str(e), "messages") from None
        want_logprobs = bool(_field(body, "logprobs", (bool,), False))
        choices, used = [], 0
        for group, stops in self._run([ids], body):
            for c in group.completions:
                text, reason, tokens, logprobs = self._choice(c, stops)
                used += len(c.tokens)
                lp = self._logprobs(tokens, logprobs)
                choices.append(
                    {
                        "index": len(choices),
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": reason,
                        "logprobs": {
                            "content": [
                                {
                                    "token": t,
                                    "logprob": v,
                                    "top_logprobs": [{"token": t, "logprob": v}],
                                }
                                for t, v in zip(lp["tokens"], lp["token_logprobs"])
                            ]
                        }
                        if want_logprobs
                        else None,
                    }
                )
        return self._envelope("chat.completion", choices, len(ids), used)

    def _encode(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            return [int(t) for t in self.tokenizer.encode(prompt)]
        if isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            return prompt
        raise BadRequest("each prompt must be a string or a list of token ids", "prompt")

    def _envelope(
        self, kind: str, choices: list, prompt_tokens: int, completion_tokens: int
    ) -> dict:
        return {
            "id": f"{'chatcmpl' if kind.startswith('chat') else 'cmpl'}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def _handler_class(server: OpenAIServer) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str, param: str | None = None) -> None:
            self._send(status, {"error": {"message": message, "type": kind, "param": param}})

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                model = {"id": server.model_name, "object": "model", "owned_by": "rlvr_jax"}
                self._send(200, {"object": "list", "data": [model]})
            elif self.path == "/health":
                try:
                    server.stream.check()
                except RolloutError as e:
                    self._error(503, str(e), "engine_error")
                    return
                self._send(200, {"status": "ok"})
            else:
                self._error(404, f"no route GET {self.path}", "not_found")

        def do_POST(self) -> None:
            routes = {
                "/v1/completions": server.completions,
                "/v1/chat/completions": server.chat_completions,
            }
            if self.path not in routes:
                self._error(404, f"no route POST {self.path}", "not_found")
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise BadRequest("the request body must be a JSON object")
                self._send(200, routes[self.path](body))
            except json.JSONDecodeError as e:
                self._error(400, f"invalid JSON: {e}", "invalid_request_error")
            except BadRequest as e:
                self._error(400, str(e), "invalid_request_error", e.param)
            except RolloutError as e:
                self._error(503, str(e), "engine_error")
            except TimeoutError:
                self._error(504, "generation timed out", "timeout")

    return Handler
