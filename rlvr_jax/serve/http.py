"""An OpenAI-compatible HTTP endpoint over a `RolloutStream`, served by aiohttp.

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (both with `stream: true` as
server-sent events, tokens sent as each decode chunk produces them, a final `usage` chunk
with `stream_options.include_usage`, then `data: [DONE]`), `GET /v1/models`, `GET /health`.
Request fields and response shapes: `rlvr_jax.serve.openai_api`.

aiohttp runs on one event loop in a background thread (requests wait on the engine without
holding a thread). The engine's driver thread hands tokens to the loop with
`call_soon_threadsafe`; tokenizing happens on the loop thread only, so the HF tokenizer is never
used from two threads at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import threading
import time
import uuid
from typing import Any

from aiohttp import web

from rlvr_jax.rollout.engine import RequestError
from rlvr_jax.rollout.stream import RolloutError, RolloutStream
from rlvr_jax.serve.openai_api import (
    BadRequest,
    ChoiceText,
    Delta,
    Kind,
    ModelNotFound,
    ParsedRequest,
    check_model,
    choice_object,
    chunk_choice,
    envelope,
    logprobs_object,
    new_id,
    parse_request,
    usage,
)
from rlvr_jax.serve.tools import ToolStream, split_calls

__all__ = ["BadRequest", "OpenAIServer"]

_SHUTDOWN = ("shutdown",)


class _Busy(RuntimeError):
    """The stream's queue is full (HTTP 429)."""


class OpenAIServer:
    """Serves the started `stream` over HTTP on `host:port` (0 = any). `model_name` is the one
    model `/v1/models` lists and a request may name; `stop_token_ids` always stop;
    `request_timeout` bounds a non-streamed request, `shutdown_grace` in-flight answers on
    `stop`."""

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
        shutdown_grace: float = 3.0,
    ):
        self.stream = stream
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.stop_token_ids = tuple(stop_token_ids)
        self.request_timeout = request_timeout
        self.shutdown_grace = shutdown_grace
        self.host = host
        self._port = port
        self._seeds = itertools.count(int(time.time()))
        self._created = int(time.time())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._streams: set[asyncio.Queue] = set()

    @property
    def url(self) -> str:
        """Base URL, e.g. `http://127.0.0.1:8000`."""
        return f"http://{self.host}:{self._port}"

    @property
    def port(self) -> int:
        """The bound port."""
        return self._port

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> OpenAIServer:
        """Binds and serves on a background event-loop thread; returns self. Raises OSError
        when the port cannot be bound."""
        self._loop = asyncio.new_event_loop()
        bound: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._bind())
            except BaseException as e:
                bound.set_exception(e)
                self._loop.close()
                return
            bound.set_result(None)
            self._loop.run_forever()
            self._loop.close()

        self._thread = threading.Thread(target=run, name="openai-http", daemon=True)
        self._thread.start()
        bound.result()
        return self

    async def _bind(self) -> None:
        app = web.Application(client_max_size=16 * 2**20, middlewares=[_json_errors])
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.on_shutdown.append(self._close_streams)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=self.shutdown_grace
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port)
        await site.start()
        self._port = self._runner.addresses[0][1]

    def stop(self) -> None:
        """Stops serving: no new connections, open streams told, in-flight answers get
        `shutdown_grace` seconds; the stream is left to its owner."""
        if self._loop is None or not self._loop.is_running():
            return
        done = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            done.result(timeout=self.shutdown_grace + 2.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    async def _close_streams(self, app: Any) -> None:
        for queue in list(self._streams):
            queue.put_nowait(_SHUTDOWN)

    # ---- handlers ---------------------------------------------------------------------------

    async def _models(self, request: Any) -> Any:
        model = {
            "id": self.model_name,
            "object": "model",
            "created": self._created,
            "owned_by": "rlvr_jax",
        }
        return web.json_response({"object": "list", "data": [model]})

    async def _health(self, request: Any) -> Any:
        try:
            self.stream.check()
        except RolloutError as e:
            return _error(503, str(e), "engine_error")
        return web.json_response({"status": "ok"})

    async def _completions(self, request: Any) -> Any:
        return await self._handle("completion", request)

    async def _chat_completions(self, request: Any) -> Any:
        return await self._handle("chat", request)

    async def _handle(self, kind: Kind, http_request: Any) -> Any:
        try:
            body = json.loads(await http_request.read() or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _error(400, f"invalid JSON: {e}", "invalid_request_error")
        try:
            request = self._parse(kind, body)
            queue: asyncio.Queue | None = asyncio.Queue() if request.stream else None
            futures = self._submit(request, queue)
        except ModelNotFound as e:
            return _error(404, str(e), "invalid_request_error", e.param, "model_not_found")
        except BadRequest as e:
            return _error(400, str(e), "invalid_request_error", e.param)
        except _Busy as e:
            return _error(429, str(e), "rate_limit_error")
        except RolloutError as e:
            return _error(503, str(e), "engine_error")
        if queue is None:
            try:
                return web.json_response(await self._answer(request, futures))
            except RolloutError as e:
                return _error(503, str(e), "engine_error")
            except TimeoutError:
                return _error(504, "generation timed out", "timeout")
        return await self._stream_answer(request, futures, queue, http_request)

    def _parse(self, kind: Kind, body: Any) -> ParsedRequest:
        check_model(body, [self.model_name])
        return parse_request(kind, body, self.tokenizer, self.stop_token_ids, self._seeds)

    def _submit(
        self, request: ParsedRequest, queue: asyncio.Queue | None
    ) -> list[concurrent.futures.Future]:
        """One stream request per prompt (n samples each); with `queue`, token and done
        events of each prompt go to it through the loop."""
        loop = asyncio.get_running_loop()
        futures = []
        for i, prompt in enumerate(request.prompts):
            hook = None if queue is None else _TokenHook(loop, queue, i)
            try:
                future = self.stream.submit(
                    uuid.uuid4().hex,
                    prompt,
                    request.n,
                    (request.seed + i) % 2**32,
                    timeout=0,
                    max_new_tokens=request.max_tokens,
                    sampling=request.sampling,
                    stop_token_ids=request.stop_token_ids,
                    on_tokens=hook,
                    future=True,
                )
            except RequestError as e:  # in the API's words: the engine's budget is max_tokens
                message = str(e).replace("max_new_tokens", "max_tokens")
                raise BadRequest(message, _param_of(str(e))) from None
            except TimeoutError:
                raise _Busy(
                    f"{self.stream.max_pending_groups} requests are waiting; retry later"
                ) from None
            if hook is not None:
                future.add_done_callback(hook.done)
            futures.append(future)
        return futures

    async def _answer(self, request: ParsedRequest, futures: list) -> dict:
        waits = [_awaitable(f) for f in futures]
        groups = await asyncio.wait_for(asyncio.gather(*waits), self.request_timeout)
        choices, used = [], 0
        for group in groups:
            for c in group.completions:
                text = ChoiceText(self.tokenizer, request.stop_token_ids, request.stop)
                delta = _merge(text.feed(c.tokens, c.logprobs), text.finish(c.finish_reason))
                used += len(c.tokens)
                lp = self._logprobs(request, delta, 0)
                calls = None
                if request.tools is not None:
                    delta.text, calls = split_calls(request.tools.prefix + delta.text)
                choices.append(
                    choice_object(request.kind, len(choices), delta, text.finish_reason, lp, calls)
                )
        prompt_tokens = sum(map(len, request.prompts))
        return envelope(
            request.kind,
            new_id(request.kind),
            self.model_name,
            choices,
            chunk=False,
            usage=usage(prompt_tokens, used),
        )

    def _logprobs(self, request: ParsedRequest, delta: Delta, offset: int) -> dict | None:
        if not request.logprobs:
            return None
        return logprobs_object(request.kind, self.tokenizer, delta, offset)

    async def _stream_answer(
        self, request: ParsedRequest, futures: list, queue: asyncio.Queue, http_request: Any
    ) -> Any:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(http_request)
        sse = _SSE(request, self.model_name, response)
        texts = [
            ChoiceText(self.tokenizer, request.stop_token_ids, request.stop)
            for _ in range(request.num_choices)
        ]
        if request.tools is not None:  # content held back around tool calls
            for t in texts:
                t.tools = ToolStream(request.tools.prefix)
        self._streams.add(queue)
        try:
            if request.kind == "chat":  # each chat choice opens with the assistant role
                for i in range(len(texts)):  # one choice per chunk, as OpenAI sends them
                    await sse.send([chunk_choice("chat", i, None, None, None)])
            used, left = 0, len(futures)
            while left:
                event = await queue.get()
                if event is _SHUTDOWN:
                    return await sse.error("the server is shutting down", "server_shutdown")
                if event[0] == "tokens":
                    _, prompt, sample, tokens, logprobs = event
                    index = prompt * request.n + sample
                    await self._send_delta(sse, request, index, texts[index], tokens, logprobs)
                    continue
                _, prompt, future = event
                left -= 1
                try:
                    group = future.result()
                except (RolloutError, concurrent.futures.CancelledError) as e:
                    return await sse.error(f"generation failed: {e}", "engine_error")
                for c in group.completions:
                    index = prompt * request.n + c.sample_index
                    used += len(c.tokens)
                    await self._send_delta(sse, request, index, texts[index], None, c.finish_reason)
            if request.include_usage:
                await sse.send([], usage=usage(sum(map(len, request.prompts)), used))
            await sse.done()
        except ConnectionResetError:
            pass  # the client went away: its samples finish unseen
        finally:
            self._streams.discard(queue)
        return response

    async def _send_delta(
        self,
        sse: _SSE,
        request: ParsedRequest,
        index: int,
        text: ChoiceText,
        tokens: list[int] | None,
        extra: Any,
    ) -> None:
        """Sends what `tokens` (or, with None, the end: `extra` is the finish reason) add."""
        if text.finish_reason is not None and not sse.open_choice(index):
            return
        offset = len(text.text)
        delta = text.finish(extra) if tokens is None else text.feed(tokens, extra)
        finish, calls = text.finish_reason, None
        if text.tools is not None:
            delta.text = text.tools.content(delta.text)
            if finish is not None:
                rest, calls = text.tools.finish()
                delta.text += rest
        if not delta.text and not delta.tokens and finish is None:
            return
        sse.close_choice(index, finish)
        lp = self._logprobs(request, delta, offset)
        await sse.send([chunk_choice(request.kind, index, delta.text, finish, lp, calls)])


class _TokenHook:
    """The stream's `on_tokens` for prompt `prompt`: events onto the loop's queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, prompt: int):
        self.loop, self.queue, self.prompt = loop, queue, prompt

    def _put(self, event: tuple) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: the server stopped
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)

    def __call__(self, sample_index: int, tokens: list[int], logprobs: list[float]) -> None:
        self._put(("tokens", self.prompt, sample_index, tokens, logprobs))

    def done(self, future: concurrent.futures.Future) -> None:
        self._put(("done", self.prompt, future))


class _SSE:
    """Writes one request's server-sent events (`data: {json}\\n\\n`)."""

    def __init__(self, request: ParsedRequest, model: str, response: Any):
        self.request = request
        self.model = model
        self.response = response
        self.id = new_id(request.kind)
        self._finished: set[int] = set()

    def open_choice(self, index: int) -> bool:
        """Whether choice `index` has not sent its finish reason yet."""
        return index not in self._finished

    def close_choice(self, index: int, finish_reason: str | None) -> None:
        if finish_reason is not None:
            self._finished.add(index)

    async def send(self, choices: list, **extra: Any) -> None:
        if self.request.include_usage:
            extra.setdefault("usage", None)
        chunk = envelope(self.request.kind, self.id, self.model, choices, chunk=True, **extra)
        await self.response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

    async def error(self, message: str, kind: str) -> Any:
        error = json.dumps(_error_body(message, kind)).encode()
        await self.response.write(b"data: " + error + b"\n\n")
        await self.response.write_eof()
        return self.response

    async def done(self) -> None:
        await self.response.write(b"data: [DONE]\n\n")
        await self.response.write_eof()


@web.middleware
async def _json_errors(request: Any, handler: Any) -> Any:
    """Unknown routes and methods answer in the API's JSON error shape."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = (
            f"no route {request.method} {request.path}" if e.status in (404, 405) else e.reason
        )
        return _error(
            e.status, message, "not_found" if e.status == 404 else "invalid_request_error"
        )


def _awaitable(future: concurrent.futures.Future) -> asyncio.Future:
    """An asyncio future with `future`'s outcome. Unlike `asyncio.wrap_future`, cancelling it
    (a timed-out or stopped request) does not cancel `future`: the stream resolves it later,
    and resolving a cancelled future would raise on the engine's driver thread."""
    loop = asyncio.get_running_loop()
    out = loop.create_future()

    def copy(done: concurrent.futures.Future) -> None:
        if out.cancelled():
            return
        error = done.exception()
        if error is not None:
            out.set_exception(error)
        else:
            out.set_result(done.result())

    def on_done(done: concurrent.futures.Future) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: the server stopped
            loop.call_soon_threadsafe(copy, done)

    future.add_done_callback(on_done)
    return out


def _merge(a: Delta, b: Delta) -> Delta:
    return Delta(a.text + b.text, a.tokens + b.tokens, a.logprobs + b.logprobs)


_PARAMS = (
    ("max_tokens", ("max_new_tokens", "max_len")),
    ("prompt", ("prompt",)),
    ("seed", ("seed",)),
    ("stop", ("stop",)),
)


def _param_of(message: str) -> str | None:
    """The request parameter an engine `RequestError` is about."""
    return next((param for param, words in _PARAMS if any(w in message for w in words)), None)


def _error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _error(
    status: int, message: str, kind: str, param: str | None = None, code: str | None = None
) -> Any:
    return web.json_response(_error_body(message, kind, param, code), status=status)
