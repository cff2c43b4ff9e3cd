"""Preference pairs: `prompt`, `chosen`, `rejected` rows (JSONL, Parquet, TFDS), validated and
tokenized once when their source loads.

A row is one of:

    {"prompt": "Compute 2 + 3.", "chosen": "\\\\boxed{5}", "rejected": "\\\\boxed{6}"}
    {"prompt": [{"role": "user", "content": "..."}],                  # chat prompt
     "chosen": [{"role": "assistant", "content": "..."}], "rejected": [...]}
    {"chosen": [{"role": "user", ...}, {"role": "assistant", ...}],    # implicit prompt: the
     "rejected": [{"role": "user", ...}, {"role": "assistant", ...}]}  # shared leading messages

A response given as messages may repeat the prompt's messages first; what follows must be one
assistant message. Other fields are ignored. The prompt is formatted with `data.prompt_template`
and a response encoded as the policy writes it (`formatting.encode_response`). Unusable rows are
skipped and counted by reason: `missing_field`, `wrong_type`, `empty_prompt`, `empty_response`,
`identical_pair` (a zero gradient), `too_long` (over `data.max_prompt_len` or
`dpo.max_response_len`, default `rollout.max_new_tokens`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr_jax.data.formatting import encode_response, prompt_encoder
from rlvr_jax.data.rows import BadRow, DataError, _prompt, chat_messages

_MISSING = object()


@dataclass(frozen=True)
class PreferenceRow:
    """One validated preference pair."""

    prompt: str | tuple[dict[str, str], ...]
    """The prompt text, or chat messages."""
    chosen: str
    """The preferred response's text."""
    rejected: str
    """The dispreferred response's text."""
    source: str = ""
    """Name of the source the row came from."""
    index: int = 0
    """Position of the row in its source (0-based)."""
    prompt_ids: Any = field(default=None, compare=False, repr=False)
    """The prompt's token ids under the run's template (set when the source loads)."""
    chosen_ids: tuple[int, ...] = field(default=(), compare=False, repr=False)
    """The chosen response's ids as it follows the prompt (separator, text, EOS)."""
    rejected_ids: tuple[int, ...] = field(default=(), compare=False, repr=False)
    """The rejected response's ids likewise."""

    def messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages (a text prompt is one user message)."""
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return [dict(m) for m in self.prompt]


def preference_from_record(record: Any, *, source: str, index: int) -> PreferenceRow:
    """Validates one record into a `PreferenceRow` (untokenized). Raises BadRow."""
    if not isinstance(record, Mapping):
        raise BadRow("not_an_object", f"row is {type(record).__name__}, not an object")
    chosen = record.get("chosen", _MISSING)
    rejected = record.get("rejected", _MISSING)
    for key, value in (("chosen", chosen), ("rejected", rejected)):
        if value is _MISSING or value is None:
            raise BadRow("missing_field", f"missing field {key!r}")
    raw_prompt = record.get("prompt", _MISSING)
    if raw_prompt is _MISSING or raw_prompt is None:
        prompt = _implicit_prompt(chosen, rejected)
    else:
        prompt = _prompt(raw_prompt)
    chosen_text = _response("chosen", chosen, prompt)
    rejected_text = _response("rejected", rejected, prompt)
    if chosen_text == rejected_text:
        raise BadRow("identical_pair", "'chosen' and 'rejected' are the same response")
    return PreferenceRow(
        prompt=prompt, chosen=chosen_text, rejected=rejected_text, source=source, index=index
    )


def _implicit_prompt(chosen: Any, rejected: Any) -> tuple[dict[str, str], ...]:
    """The messages `chosen` and `rejected` share before their last one (no `prompt` field)."""
    if isinstance(chosen, str) or isinstance(rejected, str):
        raise BadRow(
            "missing_field", "missing field 'prompt' (needed when the responses are strings)"
        )
    c, r = chat_messages("chosen", chosen), chat_messages("rejected", rejected)
    if len(c) < 2 or c[:-1] != r[:-1]:
        raise BadRow(
            "missing_field",
            "missing field 'prompt', and 'chosen' and 'rejected' do not share leading prompt "
            "messages",
        )
    return tuple(c[:-1])


def _response(key: str, value: Any, prompt: str | tuple[dict[str, str], ...]) -> str:
    """The response text of `value`: a string, or the one assistant message after the prompt."""
    if isinstance(value, str):
        text = value
    else:
        messages = chat_messages(key, value)
        prompt_messages = (
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        )
        if messages[: len(prompt_messages)] == prompt_messages:
            messages = messages[len(prompt_messages) :]
        if len(messages) != 1 or messages[0]["role"] != "assistant":
            raise BadRow(
                "wrong_type",
                f"{key!r} must be one assistant message after the prompt, got roles "
                f"{[m['role'] for m in messages]}",
            )
        text = messages[0]["content"]
    if not text.strip():
        raise BadRow("empty_response", f"{key!r} is empty")
    return text


def preference_parser(
    tokenizer: Any, template: str, *, max_response_len: int
) -> Callable[..., PreferenceRow]:
    """`parse(record, *, source, index, where)` for `load_source(..., parse=...)`: the validated
    row with its responses encoded (`chosen_ids`, `rejected_ids`); a response over
    `max_response_len` tokens is a BadRow (`too_long`)."""

    def parse(record: Any, *, source: str, index: int, where: str) -> PreferenceRow:
        del where
        row = preference_from_record(record, source=source, index=index)
        ids = {}
        for key in ("chosen", "rejected"):
            ids[key] = tuple(encode_response(getattr(row, key), tokenizer, template))
            if len(ids[key]) > max_response_len:
                raise BadRow(
                    "too_long",
                    f"the {key} response is {len(ids[key])} tokens > dpo.max_response_len "
                    f"{max_response_len}",
                )
        return PreferenceRow(
            prompt=row.prompt,
            chosen=row.chosen,
            rejected=row.rejected,
            source=source,
            index=index,
            chosen_ids=ids["chosen"],
            rejected_ids=ids["rejected"],
        )

    return parse


def load_preference_sources(
    sources: Sequence[Any],
    tokenizer: Any,
    template: str,
    *,
    max_prompt_len: int,
    max_response_len: int,
) -> list[Any]:
    """The `PromptSource`s of preference pairs (rows are `PreferenceRow`s, tokenized).

    Raises DataError when no source is given, or when a source has no usable pair (the message
    counts the skipped rows by reason)."""
    from rlvr_jax.data.sources import load_sources

    if not sources:
        raise DataError("dpo.sources is empty: configure the preference pairs to train on")
    return load_sources(
        sources,
        encode=prompt_encoder(tokenizer, template),
        max_prompt_len=max_prompt_len,
        parse=preference_parser(tokenizer, template, max_response_len=max_response_len),
    )


__all__ = [
    "PreferenceRow",
    "load_preference_sources",
    "preference_from_record",
    "preference_parser",
]
