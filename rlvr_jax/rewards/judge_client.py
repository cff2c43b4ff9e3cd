"""`ChatJudge`: the OpenAI-compatible chat-completions client shared by the LLM-judge verifiers.

The judge (`rlvr_jax.rewards.judge`) and the rubric (`rlvr_jax.rewards.rubric`) verifiers send
their own prompts through it; both ask the model to end with `SCORE: <0-10>`.

* Requests go to `{base_url}/chat/completions` (vLLM, SGLang or `rlvr-serve`) from a thread
  pool of `max_concurrency` stdlib-`urllib` workers, so at most that many are in flight, from
  any number of event loops. `timeout_s` bounds connecting and each wait for the server;
  timeouts, connection failures, HTTP 408/429 and 5xx are retried up to `max_retries` times
  after `backoff_s * 2**attempt` seconds; other HTTP errors and malformed replies are not.
* With `model=None` the model is the first one `GET {base_url}/models` lists (looked up once).
* The score is the last `SCORE: x` line after any `<think>` block, x / 10, or `SCORE: a/b` as
  a / b, clamped to [0, 1]. `judge(messages)` never raises: a reply without a score or a
  request that finally fails comes back with `parse_ok=False` (and `error` set for the latter)
  and is counted in `counters()`; what a failure is worth is the caller's decision.
* The API key comes from the environment variable `api_key_env` (no header when unset) and is
  sent only as `Authorization: Bearer ...`; it never appears in logs, reprs, results or
  exception messages (server replies that echo it are redacted).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.client import HTTPException
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

Prompt = str | Sequence[Mapping[str, str]]
"""A prompt: plain text, or chat messages `{"role", "content"}`."""
Messages = list[dict[str, str]]
"""Chat messages sent to the judge."""

SCORE_MAX = 10.0
"""Judges score on 0..SCORE_MAX; the reward is score / SCORE_MAX."""

_SCORE = re.compile(r"score[^\w\-]{0,6}(-?\d+(?:\.\d+)?)(?:\s*/\s*(\d+(?:\.\d+)?))?", re.IGNORECASE)
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class JudgeResult:
    """One judgement."""

    score: float
    """In [0, 1]; 0 when the reply had no score or the request failed."""
    raw: str
    """The judge's reply text ("" when the request failed)."""
    parse_ok: bool
    """Whether a score was found in the reply."""
    error: str | None = None
    """Why the request failed after its retries; None when a reply arrived."""
    timed_out: bool = False
    """Whether the request failed for good because its last attempt timed out."""
    attempts: int = field(default=1, compare=False)
    """Requests sent for this judgement (1 + retries)."""


@dataclass(frozen=True)
class RowScores:
    """What a batched verifier (`score_rows`) gives the reward service for its rows."""

    scores: list[float]
    """Verifier score in [0, 1] per row (0 where the row failed)."""
    statuses: list[str]
    """"ok", "error" or "timeout" per row."""
    errors: list[str]
    """What went wrong per row ("" where ok)."""
    counts: dict[str, int]
    """Batch counters, reported as `rewards/<verifier>/<name>` metrics."""


def batch_prompts(
    what: str, responses: Sequence[str], truths: Sequence[Any], prompts: Sequence[Prompt] | None
) -> Sequence[Prompt]:
    """`prompts` (default: empty ones) after checking one truth and prompt per response;
    `what` names the caller in the ValueError."""
    if len(truths) != len(responses) or (prompts is not None and len(prompts) != len(responses)):
        raise ValueError(f"{what} needs one ground truth (and prompt) per response")
    return prompts if prompts is not None else [""] * len(responses)


def render_prompt(prompt: Prompt) -> str:
    """Plain text of a prompt; chat messages become "role: content" paragraphs."""
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in prompt)


def final_answer(response: str) -> str:
    """The response after its last `</think>`: the judge sees the answer, not the reasoning."""
    return response.rsplit("</think>", 1)[-1].strip()


def parse_score(reply: str) -> float | None:
    """Score in [0, 1] from the judge's last `SCORE: x` (x/10) or `SCORE: a/b` line, else None."""
    matches = _SCORE.findall(_THINK.sub("", reply))
    if not matches:
        return None
    value, denominator = matches[-1]
    scale = float(denominator) if denominator else SCORE_MAX
    if scale <= 0:
        return None
    return min(1.0, max(0.0, float(value) / scale))


def run_sync(coroutine: Coroutine[Any, Any, T], name: str, async_name: str) -> T:
    """Runs `coroutine` to completion for the synchronous API `name`; refuses inside a running
    event loop (where the caller should await `async_name` instead)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    coroutine.close()
    raise RuntimeError(f"{name} called inside an event loop; await {async_name}()")


class _AttemptError(Exception):
    """One failed request; `retryable` says whether sending it again may help."""

    def __init__(self, message: str, *, retryable: bool, timed_out: bool = False):
        super().__init__(message)
        self.retryable = retryable
        self.timed_out = timed_out
        self.attempts = 1


def _counter(name: str, doc: str) -> property:
    """A read-only property: the judge's counter `name` (see `ChatJudge.counters`)."""
    return property(lambda self: self.counters()[name], doc=doc)


class ChatJudge:
    """Async chat-completions client returning parsed `JudgeResult`s (see module doc)."""

    def __init__(
        self,
        base_url: str,
        model: str | None,
        *,
        api_key_env: str = "RLVR_JUDGE_API_KEY",
        max_concurrency: int = 8,
        timeout_s: float = 30,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_tokens: int = 512,
        extra_body: Mapping[str, Any] | None = None,
    ):
        """Create a client (settings: module docstring); nothing is sent until the first request.

        Args:
          base_url: e.g. "http://judge:8000/v1".
          api_key_env: environment variable holding the API key (read now; may be unset).
          max_tokens: length limit of the judge's reply.
          extra_body: merged into each request body, e.g.
            `{"chat_template_kwargs": {"enable_thinking": False}}` for Qwen3 on vLLM.
        """
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"judge base_url must be an http(s) URL, got {base_url!r}")
        if model is not None and (not isinstance(model, str) or not model):
            raise ValueError(f"judge model must be a non-empty string or None, got {model!r}")
        if max_concurrency < 1 or timeout_s <= 0 or max_retries < 0 or backoff_s < 0:
            raise ValueError(
                "judge needs max_concurrency >= 1, timeout_s > 0, max_retries >= 0 and "
                f"backoff_s >= 0; got {max_concurrency}, {timeout_s}, {max_retries}, {backoff_s}"
            )
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})
        self._api_key = os.environ.get(api_key_env) or None
        self._executor = ThreadPoolExecutor(max_concurrency, thread_name_prefix="rlvr-judge")
        self._lock = threading.Lock()
        self._model_lookup: Future[str] | None = None
        self._counts = {"parse_failures": 0, "timeouts": 0, "errors": 0, "retries": 0}

    def __repr__(self) -> str:
        key = "set" if self._api_key else "unset"
        return (
            f"{type(self).__name__}(url={self.url!r}, model={self.model!r}, api_key_env="
            f"{self.api_key_env!r} ({key}), max_concurrency={self.max_concurrency}, "
            f"timeout_s={self.timeout_s}, max_retries={self.max_retries})"
        )

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def counters(self) -> dict[str, int]:
        """Snapshot of parse_failures, timeouts (attempts), errors (final failures), retries."""
        with self._lock:
            return dict(self._counts)

    parse_failures = _counter("parse_failures", "Replies that arrived without a parsable score.")
    timeouts = _counter("timeouts", "Attempts that timed out (each may have been retried).")
    errors = _counter("errors", "Requests that failed for good, after their retries.")
    retries = _counter("retries", "Attempts re-sent after a retryable failure.")

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _request(self, url: str, body: bytes | None) -> bytes:
        """One blocking attempt (runs in a worker thread): POST `body`, or GET when None."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        method = "GET" if body is None else "POST"
        request = urllib.request.Request(url, data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return reply.read()
        except urllib.error.HTTPError as error:
            try:
                detail = error.read(300).decode("utf-8", "replace")
            except (HTTPException, OSError, AttributeError):
                detail = ""
            raise _AttemptError(
                f"HTTP {error.code} from {url}: {detail}", retryable=error.code in _RETRY_STATUS
            ) from None
        except TimeoutError:
            raise _AttemptError(
                f"timed out after {self.timeout_s}s", retryable=True, timed_out=True
            ) from None
        except urllib.error.URLError as error:
            timed_out = isinstance(error.reason, TimeoutError)
            raise _AttemptError(
                f"cannot reach {url}: {error.reason}", retryable=True, timed_out=timed_out
            ) from None
        except (HTTPException, OSError) as error:
            raise _AttemptError(f"connection to {url} failed: {error!r}", retryable=True) from None

    def _post_chat(self, body: bytes) -> str:
        """One chat-completions attempt; the reply's message content."""
        payload = self._request(self.url, body)
        try:
            content = json.loads(payload)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _AttemptError(
                f"malformed chat-completions reply: {payload[:200]!r}", retryable=False
            ) from None
        return content if isinstance(content, str) else ""

    def _get_model(self) -> str:
        """One `GET {base_url}/models` attempt; the first model id listed."""
        url = self.base_url + "/models"
        payload = self._request(url, None)
        try:
            model = json.loads(payload)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            model = None
        if not isinstance(model, str) or not model:
            raise _AttemptError(
                f"no model id in the reply of {url} ({payload[:200]!r}); configure the model",
                retryable=False,
            )
        return model

    async def _with_retries(self, send: Callable[[Any], T], arg: Any) -> tuple[T, int]:
        """(`send(arg)` run in the pool, attempts), retrying retryable failures; raises the last
        `_AttemptError` (its `attempts` set) when they run out."""
        loop = asyncio.get_running_loop()
        for attempt in range(self.max_retries + 1):
            try:
                return await loop.run_in_executor(self._executor, send, arg), attempt + 1
            except _AttemptError as error:
                if error.timed_out:
                    self._count("timeouts")
                if not error.retryable or attempt == self.max_retries:
                    error.attempts = attempt + 1
                    raise
                delay = self.backoff_s * 2**attempt
                logger.warning(
                    "judge request failed (%s); retry %d/%d in %.2fs",
                    self._redact(str(error)),
                    attempt + 1,
                    self.max_retries,
                    delay,
                )
                self._count("retries")
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _model_name(self) -> str:
        """The configured model, else the served one: looked up once per client (concurrent
        first requests wait for one lookup; a failed lookup is tried again by the next)."""
        if self.model is not None:
            return self.model
        with self._lock:
            lookup = self._model_lookup
            owner = lookup is None
            if owner:
                lookup = self._model_lookup = Future()
        if owner:
            try:
                model, _ = await self._with_retries(lambda _: self._get_model(), None)
            except BaseException as error:  # waiters must not hang, whatever stopped the lookup
                failure = _AttemptError(
                    f"looking up the served model failed ({error}); configure the model name",
                    retryable=False,
                    timed_out=getattr(error, "timed_out", False),
                )
                failure.attempts = getattr(error, "attempts", 1)
                with self._lock:
                    self._model_lookup = None
                lookup.set_exception(failure)
                if isinstance(error, _AttemptError):
                    raise failure from None
                raise
            lookup.set_result(model)
        return await asyncio.wrap_future(lookup)

    async def _complete(self, messages: Messages) -> tuple[str, int]:
        """(The judge's reply, attempts), retrying retryable failures; raises _AttemptError."""
        body = {
            "model": await self._model_name(),
            "messages": messages,
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
            **self.extra_body,
        }
        return await self._with_retries(self._post_chat, json.dumps(body).encode())

    async def judge(self, messages: Messages) -> JudgeResult:
        """Sends `messages` and parses the score; never raises for a failed request."""
        try:
            reply, attempts = await self._complete(messages)
        except _AttemptError as error:
            message = self._redact(str(error))
            logger.warning("judge request failed for good: %s", message)
            self._count("errors")
            return JudgeResult(
                0.0, "", False, error=message, timed_out=error.timed_out, attempts=error.attempts
            )
        reply = self._redact(reply)
        score = parse_score(reply)
        if score is None:
            self._count("parse_failures")
            logger.warning("judge reply has no score: %.200r", reply)
            return JudgeResult(0.0, reply, False, attempts=attempts)
        return JudgeResult(score, reply, True, attempts=attempts)

    async def judge_many(self, conversations: Sequence[Messages]) -> list[JudgeResult]:
        """`judge` of each conversation, concurrently (at most `max_concurrency` in flight)."""
        return list(await asyncio.gather(*(self.judge(m) for m in conversations)))

    def close(self) -> None:
        """Release the worker threads (idle ones exit; running requests finish)."""
        self._executor.shutdown(wait=False)


_shared: dict[tuple[Any, ...], Any] = {}
_shared_lock = threading.Lock()


def shared(kind: str, key: tuple[Any, ...], make: Callable[[], T]) -> T:
    """The process-wide object of `kind` for settings `key`, made by `make()` on first use
    (clients keep their counters, caches and connections across batches)."""
    full_key = (kind, *key)
    with _shared_lock:
        if full_key not in _shared:
            _shared[full_key] = make()
        return _shared[full_key]


def options_key(options: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A hashable, order-independent key of keyword options."""
    return tuple(sorted((k, repr(v)) for k, v in options.items()))
