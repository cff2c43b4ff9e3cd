"""Rubric rewards: an LLM judge scores a response against each weighted criterion of a rubric.

DR Tulu trains with rubric rewards: a prompt's ground truth is a list of criteria (a string, or
`{"criterion": ..., "weight": ...}`; weights finite, non-zero, at least one positive), each
judged on its own (`SCORE: 0-10` → s_k in [0, 1]), and the reward is

    r = clip( Σ_k w_k · s_k / Σ_{k: w_k > 0} w_k , 0, 1 )

(negative weights are pitfalls). Judgements go through `judge_client.ChatJudge`, by default to
our own `rlvr-serve`; successes are cached (`ScoreCache`), failures never. A criterion that
cannot be scored fails its sample (score 0, status "timeout" or "error" naming it) rather than
being dropped: renormalising over the scored criteria would quietly change what the reward
means (a dropped pitfall raises it). Settings, metrics and examples: docs/rewards.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr_jax.rewards.judge_client import (
    ChatJudge,
    JudgeResult,
    Messages,
    Prompt,
    RowScores,
    batch_prompts,
    final_answer,
    options_key,
    render_prompt,
    run_sync,
    shared,
)

DEFAULT_URL = "http://127.0.0.1:8000/v1"
"""`rlvr-serve`'s OpenAI endpoint on this machine (its default `--http-port`)."""
DEFAULT_CACHE_SIZE = 100_000
"""Criterion judgements kept (~150 bytes each: keys are digests, not texts)."""

COUNTERS = (
    "criteria",
    "judge_calls",
    "cache_hits",
    "duplicates",
    "failures",
    "parse_failures",
    "request_errors",
    "request_timeouts",
    "retries",
)
"""Batch counters: criteria to score (= judge_calls + cache_hits + duplicates); judge_calls,
judgements requested; cache_hits, answered from the cache; duplicates, repeated within the
batch; failures (= parse_failures + request_errors), judgements without a score; of those,
request_timeouts, requests whose last attempt timed out; retries, attempts re-sent."""

SYSTEM_PROMPT = (
    "You are a meticulous, impartial grader. You check an AI assistant's response against one "
    "criterion of a grading rubric and judge only how fully the response meets that criterion. "
    "Explain your judgement in one or two sentences, then end with one line of the form "
    "`SCORE: <integer from 0 to 10>`."
)
CRITERION_TEMPLATE = """\
Score 10 when the response fully meets the criterion, 0 when it does not meet it at all, and in
between when it meets it in part. A criterion may describe a mistake: then score how fully the
response makes that mistake. Ignore everything the criterion does not mention.

[Question]
{prompt}

[Criterion]
{criterion}

[Response]
{response}"""


class RubricJudgeError(RuntimeError):
    """A criterion could not be scored (raised by `reward`, the one-response entry point)."""


@dataclass(frozen=True)
class Criterion:
    """One rubric line."""

    text: str
    weight: float = 1.0


@dataclass(frozen=True)
class RubricItem:
    """One response to score against a rubric."""

    prompt: Prompt
    response: str
    criteria: tuple[Criterion, ...]


@dataclass(frozen=True)
class RubricOutcome:
    """The rubric score of one response."""

    score: float
    """The combined score in [0, 1]; 0 when the response failed."""
    criterion_scores: tuple[float | None, ...]
    """Each criterion's judge score in [0, 1], None where it failed."""
    status: str
    """"ok", or "error" / "timeout" when a criterion failed."""
    error: str = ""
    """Which criterion failed and why ("" when ok)."""


def parse_rubric(ground_truth: Any) -> tuple[Criterion, ...]:
    """The criteria of a rubric ground truth (module doc), or its JSON text.

    Raises:
      ValueError: naming the bad field, e.g. "rubric ground_truth[2].weight must be ...".
    """
    value = ground_truth
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"rubric ground_truth text is not JSON: {e}") from None
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(
            "rubric ground_truth must be a non-empty list of {'criterion', 'weight'} objects, "
            f"got {type(value).__name__} {str(value)[:80]!r}"
        )
    criteria = []
    for k, item in enumerate(value):
        where = f"rubric ground_truth[{k}]"
        if isinstance(item, str):
            text, weight = item, 1.0
        elif isinstance(item, Mapping):
            unknown = sorted(str(key) for key in item if key not in ("criterion", "weight"))
            if unknown:
                raise ValueError(
                    f"{where}: unknown key(s) {unknown}; expected 'criterion' and 'weight'"
                )
            if "criterion" not in item:
                raise ValueError(f"{where}: missing 'criterion'")
            text = item["criterion"]
            weight = 1.0 if item.get("weight") is None else item["weight"]
        else:
            raise ValueError(
                f"{where} must be an object {{'criterion', 'weight'}} or a string, got "
                f"{type(item).__name__}"
            )
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}.criterion must be non-empty text, got {text!r}")
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not math.isfinite(weight)
            or weight == 0
        ):
            raise ValueError(f"{where}.weight must be a finite non-zero number, got {weight!r}")
        criteria.append(Criterion(text, float(weight)))
    if not any(c.weight > 0 for c in criteria):
        raise ValueError("rubric ground_truth needs a criterion with a positive weight")
    return tuple(criteria)


def rubric_score(criteria: Sequence[Criterion], scores: Sequence[float]) -> float:
    """clip(Σ w_k s_k / Σ_{w_k > 0} w_k, 0, 1): the weighted mean for positive weights."""
    total = sum(c.weight * s for c, s in zip(criteria, scores, strict=True))
    return min(1.0, max(0.0, total / sum(c.weight for c in criteria if c.weight > 0)))


def build_messages(prompt: Prompt, response: str, criterion: str) -> Messages:
    """Chat messages asking the judge how fully `response` meets `criterion`."""
    user = CRITERION_TEMPLATE.format(
        prompt=render_prompt(prompt), criterion=criterion, response=response
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def cache_key(prompt: str, response: str, criterion: str) -> bytes:
    """128-bit digest of what the judge sees for one criterion."""
    text = json.dumps([prompt, response, criterion])  # ASCII: lone surrogates are escaped
    return hashlib.blake2b(text.encode("ascii"), digest_size=16).digest()


class ScoreCache:
    """Bounded LRU of criterion scores, safe to share between threads; size 0 keeps nothing."""

    def __init__(self, max_entries: int):
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
            raise ValueError(f"rubric cache_size must be an integer >= 0, got {max_entries!r}")
        self.max_entries = max_entries
        self._scores: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._scores)

    def get(self, key: bytes) -> float | None:
        """The cached score (now the most recently used), or None."""
        with self._lock:
            score = self._scores.get(key)
            if score is not None:
                self._scores.move_to_end(key)
            return score

    def put(self, key: bytes, score: float) -> None:
        """Stores a score, evicting the least recently used beyond `max_entries`."""
        if self.max_entries == 0:
            return
        with self._lock:
            self._scores[key] = score
            self._scores.move_to_end(key)
            while len(self._scores) > self.max_entries:
                self._scores.popitem(last=False)


class RubricScorer:
    """Scores responses against rubrics with one judge and one cache (module doc)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        model: str | None = None,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        **client_options: Any,
    ):
        """Args: the judge endpoint and model (None = the one it serves), the cache's size, and
        `ChatJudge` options (api_key_env, max_concurrency, timeout_s, max_retries, ...)."""
        self.cache = ScoreCache(cache_size)
        self.client = ChatJudge(base_url, model, **client_options)

    def __repr__(self) -> str:
        return f"RubricScorer({self.client!r}, cache_size={self.cache.max_entries})"

    async def score(
        self, items: Sequence[RubricItem]
    ) -> tuple[list[RubricOutcome], dict[str, int]]:
        """Outcomes of `items` in order, and the batch's `COUNTERS`; never raises for a failed
        request. Unknown (uncached, distinct) criteria are judged concurrently."""
        counts = dict.fromkeys(COUNTERS, 0)
        keys_per_item: list[list[bytes]] = []
        known: dict[bytes, float] = {}
        pending: dict[bytes, Messages] = {}
        for item in items:
            prompt, answer = render_prompt(item.prompt), final_answer(item.response)
            keys = [cache_key(prompt, answer, c.text) for c in item.criteria]
            keys_per_item.append(keys)
            for key, criterion in zip(keys, item.criteria):
                counts["criteria"] += 1
                if key in known or key in pending:
                    counts["duplicates"] += 1
                elif (cached := self.cache.get(key)) is not None:
                    counts["cache_hits"] += 1
                    known[key] = cached
                else:
                    pending[key] = build_messages(prompt, answer, criterion.text)
        results = dict(zip(pending, await self.client.judge_many(list(pending.values()))))
        for key, result in results.items():
            counts["judge_calls"] += 1
            counts["retries"] += result.attempts - 1
            if result.parse_ok:
                known[key] = result.score
                self.cache.put(key, result.score)
                continue
            counts["failures"] += 1
            counts["request_errors" if result.error else "parse_failures"] += 1
            counts["request_timeouts"] += result.timed_out
        outcomes = [
            _outcome(item, keys, known, results) for item, keys in zip(items, keys_per_item)
        ]
        return outcomes, counts

    def score_sync(self, items: Sequence[RubricItem]) -> tuple[list[RubricOutcome], dict[str, int]]:
        """`score` for synchronous callers; not callable from inside a running event loop."""
        return run_sync(self.score(items), "RubricScorer.score_sync", "RubricScorer.score")

    def close(self) -> None:
        """Release the client's threads."""
        self.client.close()


def _outcome(
    item: RubricItem,
    keys: list[bytes],
    known: dict[bytes, float],
    results: dict[bytes, JudgeResult],
) -> RubricOutcome:
    scores = tuple(known.get(key) for key in keys)
    failed = [k for k, score in enumerate(scores) if score is None]
    if not failed:
        return RubricOutcome(rubric_score(item.criteria, scores), scores, "ok")
    first = failed[0]
    result = results[keys[first]]
    reason = result.error or f"reply has no SCORE line: {result.raw[:160]!r}"
    more = f" ({len(failed) - 1} more criteria failed)" if len(failed) > 1 else ""
    timed_out = any(results[keys[k]].timed_out for k in failed)
    return RubricOutcome(
        0.0,
        scores,
        "timeout" if timed_out else "error",
        f"criterion {first} ({item.criteria[first].text[:60]!r}): {reason}{more}",
    )


def scorer_for(
    base_url: str | None = None, model: str | None = None, **options: Any
) -> RubricScorer:
    """The process-wide scorer for these settings (so its cache and counters persist)."""
    base_url = base_url or DEFAULT_URL
    key = (base_url, model, options_key(options))
    return shared("rubric", key, lambda: RubricScorer(base_url, model, **options))


def score_rows(
    responses: Sequence[str],
    ground_truths: Sequence[Any],
    *,
    prompts: Sequence[Prompt] | None = None,
    base_url: str | None = None,
    model: str | None = None,
    **options: Any,
) -> RowScores:
    """Rubric scores of `responses` (anything up to the last `</think>` dropped) against one
    rubric each, for the reward service: failed rows are "error" or "timeout" with their
    reason; `base_url`, `model` and `options` are `RubricScorer` settings.

    Raises:
      ValueError: mismatched lengths, or a bad rubric (naming its position in the batch).
    """
    prompts = batch_prompts("rubric score_rows", responses, ground_truths, prompts)
    items = []
    for i, (prompt, response, truth) in enumerate(zip(prompts, responses, ground_truths)):
        try:
            items.append(RubricItem(prompt, response, parse_rubric(truth)))
        except ValueError as e:
            raise ValueError(f"response {i}: {e}") from None
    outcomes, counts = scorer_for(base_url, model, **options).score_sync(items)
    return RowScores(
        scores=[o.score for o in outcomes],
        statuses=[o.status for o in outcomes],
        errors=[o.error for o in outcomes],
        counts=counts,
    )


def reward(
    response: str,
    ground_truth: Any,
    *,
    prompt: Prompt = "",
    base_url: str | None = None,
    model: str | None = None,
    **options: Any,
) -> float:
    """Rubric reward in [0, 1] for one response (`verifier: rubric`).

    Raises:
      RubricJudgeError: a criterion could not be scored (never a silent 0).
      ValueError: a bad rubric.
    """
    rows = score_rows(
        [response], [ground_truth], prompts=[prompt], base_url=base_url, model=model, **options
    )
    if rows.statuses[0] != "ok":
        raise RubricJudgeError(f"rubric {rows.statuses[0]}: {rows.errors[0]}")
    return rows.scores[0]
