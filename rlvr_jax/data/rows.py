"""`PromptRow`: one validated prompt with its verifier and ground truth.

Every source format maps its records to dicts in DESIGN.md's data-row convention, and
`row_from_record` validates one into a `PromptRow`: `BadRow` for a record to skip and count,
`UnknownVerifier` (fatal) for a verifier that does not exist. SFT rows also carry a `response`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
"""Roles a chat message may have."""

_MISSING = object()


class DataError(ValueError):
    """A data source cannot be used at all; the message names it."""


class UnknownVerifier(DataError):
    """A row names a verifier that is not registered; the message names the row."""


class BadRow(ValueError):
    """A row that is skipped and counted. `kind` groups the reasons in the skip summary."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class PromptRow:
    """One prompt of a source, validated."""

    prompt: str | tuple[dict[str, str], ...]
    """The prompt text, or chat messages (`{"role", "content"}` dicts)."""
    ground_truth: Any
    """JSON value the verifier checks against (math: answer string; ifeval: dict; ...)."""
    verifier: str
    """Verifier name (`math`, `code`, `ifeval`, `judge`, a registered name or module:function)."""
    domain: str
    """Domain for per-domain metrics and reward weights."""
    verifier_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the verifier."""
    source: str = ""
    """Name of the source the row came from."""
    index: int = 0
    """Position of the row in its source (0-based; for JSONL, the line)."""
    response: str | None = None
    """Target response of an SFT example (None for a prompt-only row)."""
    prompt_ids: Any = field(default=None, compare=False, repr=False)
    """The prompt's token ids under the run's template (an int32 array), set once when the
    source is loaded with an encoder (`load_source(..., encode=...)`); None otherwise."""

    def messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages (a text prompt is one user message)."""
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return [dict(m) for m in self.prompt]

    def to_dict(self) -> dict[str, Any]:
        """The row in DESIGN.md's data-row form (what the reward service takes)."""
        prompt = self.prompt if isinstance(self.prompt, str) else self.messages()
        return {
            "prompt": prompt,
            "ground_truth": self.ground_truth,
            "verifier": self.verifier,
            "domain": self.domain,
            "verifier_kwargs": dict(self.verifier_kwargs),
        }


def row_from_record(
    record: Any,
    *,
    source: str,
    index: int,
    where: str,
    default_domain: str | None = None,
    known_verifiers: Collection[str] | None = None,
    response: Callable[[Mapping[str, Any]], str] | None = None,
) -> PromptRow:
    """Validates one record (a dict in the data-row convention) into a `PromptRow`.

    `where` names the record in messages (e.g. "data.jsonl line 18"). Verifier names
    containing ':' (`module:function`) are accepted whatever `known_verifiers` holds.
    `response(record)`, when given, is the row's SFT response: it must return a non-blank
    string (or raise BadRow itself). Raises BadRow (skip and count) or UnknownVerifier (fatal).
    """
    if not isinstance(record, Mapping):
        raise BadRow("not_an_object", f"row is {type(record).__name__}, not an object")
    verifier = record.get("verifier", _MISSING)
    if verifier is _MISSING or verifier is None:
        raise BadRow("missing_field", "missing field 'verifier'")
    if not isinstance(verifier, str) or not verifier.strip():
        raise BadRow("wrong_type", f"'verifier' must be a non-empty string, got {verifier!r}")
    if known_verifiers is not None and verifier not in known_verifiers and ":" not in verifier:
        raise UnknownVerifier(
            f"{where}: unknown verifier {verifier!r}; known: {sorted(known_verifiers)}"
        )
    prompt = _prompt(record.get("prompt", _MISSING))
    ground_truth = _ground_truth(record.get("ground_truth", _MISSING), verifier)
    domain = record.get("domain")
    if domain is None:
        domain = default_domain or verifier
    elif not isinstance(domain, str) or not domain.strip():
        raise BadRow("wrong_type", f"'domain' must be a non-empty string, got {domain!r}")
    kwargs = record.get("verifier_kwargs")
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise BadRow("wrong_type", f"'verifier_kwargs' must be an object, got {kwargs!r}")
    target = None if response is None else _response(response(record))
    return PromptRow(
        prompt=prompt,
        ground_truth=ground_truth,
        verifier=verifier,
        domain=domain,
        verifier_kwargs=dict(kwargs),
        source=source,
        index=index,
        response=target,
    )


def _prompt(value: Any) -> str | tuple[dict[str, str], ...]:
    if value is _MISSING or value is None:
        raise BadRow("missing_field", "missing field 'prompt'")
    if isinstance(value, str):
        if not value.strip():
            raise BadRow("empty_prompt", "'prompt' is empty")
        return value
    if isinstance(value, list | tuple) and not value:
        raise BadRow("empty_prompt", "'prompt' is an empty list of messages")
    return tuple(chat_messages("prompt", value))


def chat_messages(key: str, value: Any) -> list[dict[str, str]]:
    """`value` (the field `key`) as validated chat messages; BadRow naming the field otherwise."""
    if not isinstance(value, list | tuple):
        raise BadRow(
            "wrong_type",
            f"{key!r} must be a string or a list of messages, got {type(value).__name__}",
        )
    messages = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping):
            raise BadRow("wrong_type", f"{key} message {i} is {type(m).__name__}, not an object")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise BadRow("wrong_type", f"{key} message {i} has role {role!r}; expected {ROLES}")
        if not isinstance(content, str):
            raise BadRow("wrong_type", f"{key} message {i} content is {type(content).__name__}")
        messages.append({"role": role, "content": content})
    return messages


def _response(value: Any) -> str:
    if not isinstance(value, str):
        raise BadRow("wrong_type", f"the SFT response must be a string, got {type(value).__name__}")
    if not value.strip():
        raise BadRow("empty_response", "the SFT response is empty")
    return value


def _ground_truth(value: Any, verifier: str) -> Any:
    """Checks the ground truth's shape for the built-in verifiers (`GROUND_TRUTH_CHECKS`);
    other verifiers get any JSON value."""
    if value is _MISSING:
        if verifier == "judge":  # open-ended judging has no reference
            return None
        raise BadRow("missing_field", "missing field 'ground_truth'")
    check = GROUND_TRUTH_CHECKS.get(verifier)
    return value if check is None else check(value)


def _math_truth(value: Any) -> str:
    """An answer string; JSON numbers become their text."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise BadRow(
            "wrong_type",
            f"math ground_truth must be a string or number, got {type(value).__name__}",
        )
    text = str(value)
    if not text.strip():
        raise BadRow("wrong_type", "math ground_truth is empty")
    return text


def _code_truth(value: Any) -> list:
    """A non-empty list of tests (or its JSON text)."""
    tests = _decoded(value, list, "code")
    if not tests:
        raise BadRow("wrong_type", "code ground_truth is an empty list of tests")
    return tests


def _judge_truth(value: Any) -> str | None:
    """Reference text, or null for open-ended judging."""
    if value is not None and not isinstance(value, str):
        raise BadRow(
            "wrong_type", f"judge ground_truth must be text or null, got {type(value).__name__}"
        )
    return value


def _ifeval_truth(value: Any) -> dict:
    """`{"instruction_id": [...], "kwargs": [...]}` (or its JSON text). Null kwargs become {},
    and null-valued arguments are dropped: Parquet struct columns give every row the union of
    all argument names, with nulls for the ones a row does not use."""
    value = _decoded(value, dict, "ifeval")
    ids, kwargs = value.get("instruction_id"), value.get("kwargs")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise BadRow(
            "wrong_type",
            f"ifeval ground_truth needs 'instruction_id': a non-empty list of strings, got {ids!r}",
        )
    if kwargs is None:
        kwargs = [{} for _ in ids]
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
        raise BadRow(
            "wrong_type",
            f"ifeval ground_truth 'kwargs' must be a list of {len(ids)} objects, got {kwargs!r}",
        )
    kwargs = [{} if kw is None else kw for kw in kwargs]
    if not all(isinstance(kw, dict) for kw in kwargs):
        raise BadRow(
            "wrong_type", f"ifeval ground_truth 'kwargs' entries must be objects: {kwargs!r}"
        )
    kwargs = [{k: v for k, v in kw.items() if v is not None} for kw in kwargs]
    return {"instruction_id": list(ids), "kwargs": kwargs}


def _rubric_truth(value: Any) -> list:
    """A non-empty list of `{"criterion", "weight"}` (or its JSON text; see
    `rlvr_jax.rewards.rubric.parse_rubric`), normalised to explicit float weights."""
    from rlvr_jax.rewards.rubric import parse_rubric

    try:
        criteria = parse_rubric(value)
    except ValueError as e:
        raise BadRow("wrong_type", str(e)) from None
    return [{"criterion": c.text, "weight": c.weight} for c in criteria]


def _decoded(value: Any, kind: type, verifier: str) -> Any:
    """`value`, decoded from JSON text if it is a string, checked to be a `kind`."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise BadRow("bad_json", f"{verifier} ground_truth text is not JSON: {e}") from None
    if not isinstance(value, kind):
        raise BadRow(
            "wrong_type",
            f"{verifier} ground_truth must be a {kind.__name__}, got {type(value).__name__}",
        )
    return value


GROUND_TRUTH_CHECKS: dict[str, Callable[[Any], Any]] = {
    "math": _math_truth,
    "ifeval": _ifeval_truth,
    "code": _code_truth,
    "judge": _judge_truth,
    "rubric": _rubric_truth,
}
"""Shape checks of the built-in verifiers' ground truths: each returns the normalised value or
raises BadRow. Structured ground truths may arrive as JSON text (common in Parquet exports)."""
