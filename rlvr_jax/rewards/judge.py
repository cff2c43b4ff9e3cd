"""LLM-as-a-judge reward through any OpenAI-compatible chat-completions endpoint.

OlmoRL scores chat prompts with a judge model (Qwen3-32B, thinking off) in two ways: against a
reference answer, or open-ended without one; the judge's score is normalised to [0, 1]. This
module is the client for that judge: vLLM, SGLang or our own `rlvr-serve` behind
`{base_url}/chat/completions` (`base_url` ends in `/v1`, as for OpenAI clients).

* `JudgeClient` sends requests from a thread pool of `max_concurrency` workers (stdlib
  `urllib`, no extra dependency), so at most that many are in flight at once, from any number
  of event loops. `timeout_s` bounds connecting and each wait for the server (so it bounds the
  judge's generation time); timeouts, connection failures, HTTP 408/429 and 5xx are retried up
  to `max_retries` times after `backoff_s * 2**attempt` seconds; other HTTP errors are not.
* The judge is asked to end with `SCORE: <0-10>`; the last such line (after any `<think>`
  block) divided by 10, or `SCORE: a/b` as a / b, clamped to [0, 1], is the score. A reply
  without one scores 0 and counts as a parse failure; a request that finally fails scores 0,
  counts as an error and carries the reason in `JudgeResult.error`.
* The API key comes from the environment variable `api_key_env` (no header when unset) and is
  sent only as `Authorization: Bearer ...`; it never appears in logs, reprs, results or
  exception messages (server replies that echo it are redacted).

`reward` and `score_batch` are the verifier entry points (`verifier: judge`); the ground truth
is the reference answer, or None for open-ended scoring.
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
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any

logger = logging.getLogger(__name__)

Prompt = str | Sequence[Mapping[str, str]]
"""A prompt: plain text, or chat messages `{"role", "content"}`."""

SCORE_MAX = 10.0
"""The judge scores on 0..SCORE_MAX; the reward is score / SCORE_MAX."""

SYSTEM_PROMPT = (
    "You are a meticulous, impartial grader of AI assistant responses. Judge only the final "
    "response, not the question's difficulty. Explain your judgement in a few sentences, then "
    "end with one line of the form `SCORE: <integer from 0 to 10>`."
)
REFERENCE_TEMPLATE = """\
Grade the response against the reference answer, which is correct. Score 10 when the response
reaches the same answer and is accurate; lower the score for every error, omission or
contradiction of the reference; score 0 when it is wrong or does not answer.

[Question]
{prompt}

[Reference answer]
{reference}

[Response]
{response}"""
OPEN_TEMPLATE = """\
Grade the response to the user's request for helpfulness, correctness, completeness and how
well it follows the request's instructions. Score 10 for an excellent response, 5 for an
acceptable one with clear flaws, 0 for a wrong, harmful or off-topic one.

[Request]
{prompt}

[Response]
{response}"""

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


@dataclass(frozen=True)
class JudgeItem:
    """One thing to judge: the prompt, the policy's response and an optional reference."""

    prompt: Prompt
    response: str
    reference: str | None = None


def render_prompt(prompt: Prompt) -> str:
    """Plain text of a prompt; chat messages become "role: content" paragraphs."""
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in prompt)


def build_messages(prompt: Prompt, response: str, reference: str | None) -> list[dict[str, str]]:
    """Chat messages asking the judge to score `response` (reference-based or open-ended)."""
    fields = {"prompt": render_prompt(prompt), "response": response}
    if reference is None:
        user = OPEN_TEMPLATE.format(**fields)
    else:
        user = REFERENCE_TEMPLATE.format(reference=reference, **fields)
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


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


class _AttemptError(Exception):
    """One failed request; `retryable` says whether sending it again may help."""

    def __init__(self, message: str, *, retryable: bool, timed_out: bool = False):
        super().__init__(message)
        self.retryable = retryable
        self.timed_out = timed_out


class JudgeClient:
    """Async client scoring responses with an OpenAI-compatible chat model (see module doc)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "RLVR_JUDGE_API_KEY",
        max_concurrency: int = 8,
        timeout_s: float = 30,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_tokens: int = 512,
        extra_body: Mapping[str, Any] | None = None,
    ):
        """Create a client; nothing is sent until the first `score`.

        Args:
          base_url: e.g. "http://judge:8000/v1"; requests go to `{base_url}/chat/completions`.
          model: the model name the endpoint serves.
          api_key_env: environment variable holding the API key (read now; may be unset).
          max_concurrency: requests in flight at once.
          timeout_s: bound on connecting and on each wait for the server, per attempt.
          max_retries: further attempts after a retryable failure.
          backoff_s: sleep before retry k (0-based) is `backoff_s * 2**k`.
          max_tokens: length limit of the judge's reply.
          extra_body: merged into each request body, e.g.
            `{"chat_template_kwargs": {"enable_thinking": False}}` for Qwen3 on vLLM.
        """
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"judge base_url must be an http(s) URL, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError(f"judge model must be a non-empty string, got {model!r}")
        if max_concurrency < 1 or timeout_s <= 0 or max_retries < 0 or backoff_s < 0:
            raise ValueError(
                "judge needs max_concurrency >= 1, timeout_s > 0, max_retries >= 0 and "
                f"backoff_s >= 0; got {max_concurrency}, {timeout_s}, {max_retries}, {backoff_s}"
            )
        self.url = base_url.rstrip("/") + "/chat/completions"
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
        self._counts = {"parse_failures": 0, "timeouts": 0, "errors": 0, "retries": 0}

    def __repr__(self) -> str:
        key = "set" if self._api_key else "unset"
        return (
            f"JudgeClient(url={self.url!r}, model={self.model!r}, api_key_env="
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

    @property
    def parse_failures(self) -> int:
        """Replies that arrived without a parsable score."""
        return self.counters()["parse_failures"]

    @property
    def timeouts(self) -> int:
        """Attempts that timed out (each may have been retried)."""
        return self.counters()["timeouts"]

    @property
    def errors(self) -> int:
        """Requests that failed for good, after their retries."""
        return self.counters()["errors"]

    @property
    def retries(self) -> int:
        """Attempts re-sent after a retryable failure."""
        return self.counters()["retries"]

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _post(self, body: bytes) -> str:
        """One blocking request (runs in a worker thread); the reply's message content."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                payload = reply.read()
        except urllib.error.HTTPError as error:
            try:
                detail = error.read(300).decode("utf-8", "replace")
            except (HTTPException, OSError, AttributeError):
                detail = ""
            raise _AttemptError(
                f"HTTP {error.code} from {self.url}: {detail}",
                retryable=error.code in _RETRY_STATUS,
            ) from None
        except TimeoutError:
            raise _AttemptError(
                f"timed out after {self.timeout_s}s", retryable=True, timed_out=True
            ) from None
        except urllib.error.URLError as error:
            timed_out = isinstance(error.reason, TimeoutError)
            raise _AttemptError(
                f"cannot reach {self.url}: {error.reason}", retryable=True, timed_out=timed_out
            ) from None
        except (HTTPException, OSError) as error:
            raise _AttemptError(
                f"connection to {self.url} failed: {error!r}", retryable=True
            ) from None
        try:
            content = json.loads(payload)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _AttemptError(
                f"malformed chat-completions reply: {payload[:200]!r}", retryable=False
            ) from None
        return content if isinstance(content, str) else ""

    async def _complete(self, messages: list[dict[str, str]]) -> str:
        """The judge's reply, retrying retryable failures; raises _AttemptError at the end."""
        body = json.dumps(
            {
                "model": self.model,
                "messages": messages,
                "temperature": 0.0,
                "max_tokens": self.max_tokens,
                **self.extra_body,
            }
        ).encode()
        loop = asyncio.get_running_loop()
        for attempt in range(self.max_retries + 1):
            try:
                return await loop.run_in_executor(self._executor, self._post, body)
            except _AttemptError as error:
                if error.timed_out:
                    self._count("timeouts")
                if not error.retryable or attempt == self.max_retries:
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

    async def score(
        self, prompt: Prompt, response: str, reference: str | None = None
    ) -> JudgeResult:
        """Judge one response; never raises for a failed request (see `JudgeResult.error`)."""
        try:
            reply = self._redact(await self._complete(build_messages(prompt, response, reference)))
        except _AttemptError as error:
            message = self._redact(str(error))
            logger.warning("judge request failed for good: %s", message)
            self._count("errors")
            return JudgeResult(score=0.0, raw="", parse_ok=False, error=message)
        score = parse_score(reply)
        if score is None:
            self._count("parse_failures")
            logger.warning("judge reply has no score: %.200r", reply)
            return JudgeResult(score=0.0, raw=reply, parse_ok=False)
        return JudgeResult(score=score, raw=reply, parse_ok=True)

    async def score_batch(
        self, items: Sequence[JudgeItem | Mapping[str, Any]]
    ) -> list[JudgeResult]:
        """Judge many responses concurrently (at most `max_concurrency` in flight), in order.

        Items are `JudgeItem`s or mappings with keys prompt, response and optional reference.
        """
        judged = [item if isinstance(item, JudgeItem) else JudgeItem(**item) for item in items]
        return list(
            await asyncio.gather(*(self.score(i.prompt, i.response, i.reference) for i in judged))
        )

    def score_batch_sync(self, items: Sequence[JudgeItem | Mapping[str, Any]]) -> list[JudgeResult]:
        """`score_batch` for synchronous callers; not callable from inside a running event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.score_batch(items))
        raise RuntimeError("score_batch_sync called inside an event loop; await score_batch()")

    def close(self) -> None:
        """Release the worker threads (idle ones exit; running requests finish)."""
        self._executor.shutdown(wait=False)


_clients: dict[tuple[Any, ...], JudgeClient] = {}
_clients_lock = threading.Lock()


def client_for(base_url: str | None, model: str | None, **options: Any) -> JudgeClient:
    """The process-wide client for these settings (created on first use; counters accumulate).

    Raises:
      ValueError: base_url or model missing (config `rewards.judge_url` / `rewards.judge_model`).
    """
    if not base_url or not model:
        raise ValueError(
            "the judge verifier needs base_url and model (config rewards.judge_url and "
            f"rewards.judge_model); got base_url={base_url!r}, model={model!r}"
        )
    key = (base_url, model, tuple(sorted((k, repr(v)) for k, v in options.items())))
    with _clients_lock:
        if key not in _clients:
            _clients[key] = JudgeClient(base_url, model, **options)
        return _clients[key]


def final_answer(response: str) -> str:
    """The response after its last `</think>`: the judge sees the answer, not the reasoning."""
    return response.rsplit("</think>", 1)[-1].strip()


def _reference(ground_truth: Any) -> str | None:
    if ground_truth is None or isinstance(ground_truth, str):
        return ground_truth
    raise ValueError(
        f"judge ground truth must be a reference string or null, got {type(ground_truth).__name__}"
    )


def score_batch(
    responses: Sequence[str],
    ground_truths: Sequence[str | None],
    *,
    prompts: Sequence[Prompt] | None = None,
    base_url: str | None = None,
    model: str | None = None,
    **options: Any,
) -> list[float]:
    """Judge rewards for a batch of responses (the reward service's batched path).

    Args:
      responses: policy completions; anything up to the last `</think>` is dropped.
      ground_truths: reference answers, or None for open-ended scoring, one per response.
      prompts: the prompts, one per response (default: empty).
      base_url, model, options: `JudgeClient` settings (see `client_for`).

    Returns:
      One reward in [0, 1] per response (0 for an unparsable reply or a failed request).
    """
    if len(ground_truths) != len(responses) or (
        prompts is not None and len(prompts) != len(responses)
    ):
        raise ValueError("judge score_batch needs one ground truth (and prompt) per response")
    client = client_for(base_url, model, **options)
    items = [
        JudgeItem(prompt, final_answer(response), _reference(truth))
        for prompt, response, truth in zip(
            prompts or [""] * len(responses), responses, ground_truths
        )
    ]
    return [result.score for result in client.score_batch_sync(items)]


def reward(
    response: str,
    ground_truth: str | None,
    *,
    prompt: Prompt = "",
    base_url: str | None = None,
    model: str | None = None,
    **options: Any,
) -> float:
    """Judge reward in [0, 1] for one response (see `score_batch`)."""
    return score_batch(
        [response], [ground_truth], prompts=[prompt], base_url=base_url, model=model, **options
    )[0]
