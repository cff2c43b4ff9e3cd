"""LLM-as-a-judge reward through any OpenAI-compatible chat-completions endpoint.

OlmoRL scores chat prompts with a judge model (Qwen3-32B, thinking off) against a reference
answer (the ground truth) or open-ended (ground truth None), normalised to [0, 1]. This module
holds those two prompts and the entry points of `verifier: judge`; transport, retries, score
parsing and the API key are `judge_client.ChatJudge`'s. A reply without a score, or a request
that fails for good, scores 0 and is counted (`rewards/judge/{parse_failures,request_errors}`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr_jax.rewards.judge_client import (
    SCORE_MAX,
    ChatJudge,
    JudgeResult,
    Prompt,
    RowScores,
    batch_prompts,
    final_answer,
    options_key,
    parse_score,
    render_prompt,
    run_sync,
    shared,
)

__all__ = [
    "COUNTERS",
    "SCORE_MAX",
    "JudgeClient",
    "JudgeItem",
    "JudgeResult",
    "build_messages",
    "client_for",
    "final_answer",
    "parse_score",
    "render_prompt",
    "reward",
    "score_batch",
    "score_rows",
]

COUNTERS = ("parse_failures", "request_errors")
"""Batch counters of `score_rows`: replies without a score, requests that failed for good."""

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


@dataclass(frozen=True)
class JudgeItem:
    """One thing to judge: the prompt, the policy's response and an optional reference."""

    prompt: Prompt
    response: str
    reference: str | None = None


def build_messages(prompt: Prompt, response: str, reference: str | None) -> list[dict[str, str]]:
    """Chat messages asking the judge to score `response` (reference-based or open-ended)."""
    fields = {"prompt": render_prompt(prompt), "response": response}
    if reference is None:
        user = OPEN_TEMPLATE.format(**fields)
    else:
        user = REFERENCE_TEMPLATE.format(reference=reference, **fields)
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


class JudgeClient(ChatJudge):
    """Async client scoring responses, reference-based or open-ended (see module doc)."""

    async def score(
        self, prompt: Prompt, response: str, reference: str | None = None
    ) -> JudgeResult:
        """Judge one response; never raises for a failed request (see `JudgeResult.error`)."""
        return await self.judge(build_messages(prompt, response, reference))

    async def score_batch(
        self, items: Sequence[JudgeItem | Mapping[str, Any]]
    ) -> list[JudgeResult]:
        """Judge many responses concurrently (at most `max_concurrency` in flight), in order.

        Items are `JudgeItem`s or mappings with keys prompt, response and optional reference.
        """
        judged = [item if isinstance(item, JudgeItem) else JudgeItem(**item) for item in items]
        return await self.judge_many(
            [build_messages(i.prompt, i.response, i.reference) for i in judged]
        )

    def score_batch_sync(self, items: Sequence[JudgeItem | Mapping[str, Any]]) -> list[JudgeResult]:
        """`score_batch` for synchronous callers; not callable from inside a running event loop."""
        return run_sync(self.score_batch(items), "score_batch_sync", "score_batch")


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
    key = (base_url, model, options_key(options))
    return shared("judge", key, lambda: JudgeClient(base_url, model, **options))


def _reference(ground_truth: Any) -> str | None:
    if ground_truth is None or isinstance(ground_truth, str):
        return ground_truth
    raise ValueError(
        f"judge ground truth must be a reference string or null, got {type(ground_truth).__name__}"
    )


def score_batch(
    responses: Sequence[str], ground_truths: Sequence[str | None], **settings: Any
) -> list[float]:
    """Judge rewards in [0, 1] of `responses` (anything up to the last `</think>` dropped)
    against reference answers or None; `settings` are `score_rows`' keywords."""
    return score_rows(responses, ground_truths, **settings).scores


def score_rows(
    responses: Sequence[str],
    ground_truths: Sequence[str | None],
    *,
    prompts: Sequence[Prompt] | None = None,
    base_url: str | None = None,
    model: str | None = None,
    **options: Any,
) -> RowScores:
    """`score_batch` for the reward service: every row is "ok" (a failure scores 0, as OlmoRL
    does), and the batch's parse failures and failed requests are counted."""
    prompts = batch_prompts("judge score_batch", responses, ground_truths, prompts)
    items = [
        JudgeItem(prompt, final_answer(response), _reference(truth))
        for prompt, response, truth in zip(prompts, responses, ground_truths)
    ]
    results = client_for(base_url, model, **options).score_batch_sync(items)
    return RowScores(
        scores=[r.score for r in results],
        statuses=["ok"] * len(results),
        errors=[""] * len(results),
        counts={
            "parse_failures": sum(not r.parse_ok and r.error is None for r in results),
            "request_errors": sum(r.error is not None for r in results),
        },
    )


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
