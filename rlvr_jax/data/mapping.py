"""A source's own column names and answers, mapped onto the data row (docs/data.md).

`data.sources[].fields` renames a file's columns to row fields (`{prompt: question,
ground_truth: answer}`), `data.sources[].verifier` is the verifier of rows that name none, and
`data.sources[].answer_transform` rewrites each ground truth after the mapping: a built-in
(`ANSWER_TRANSFORMS`: `gsm8k`) or `module:function`. `record_mapper(cfg)` applies the three to
each record before it is validated; a record without a mapped column, or whose answer the
transform rejects (ValueError), is skipped and counted (`BadRow`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlvr_jax.config.refs import import_function, is_ref
from rlvr_jax.config.schema import SourceConfig
from rlvr_jax.data.rows import BadRow

ROW_FIELDS = (
    "prompt",
    "ground_truth",
    "verifier",
    "domain",
    "verifier_kwargs",
    "response",
    "chosen",
    "rejected",
)
"""Row fields `fields` may map a column to: a prompt row's, an SFT example's `response`
(`sft.response_field`), a preference pair's `chosen` and `rejected`."""


def gsm8k(answer: Any) -> str:
    """GSM8K's answer field (worked solution, then `#### <answer>`): the text after the last
    `####`, thousands separators dropped (`"... #### 1,234"` → `"1234"`)."""
    if not isinstance(answer, str):
        raise ValueError(f"expected the solution text, got {type(answer).__name__}")
    _, sep, final = answer.rpartition("####")
    final = final.strip().replace(",", "")
    if not sep:
        raise ValueError(f"no '#### <answer>' in {_short(answer)!r}")
    if not final:
        raise ValueError(f"nothing after '####' in {_short(answer)!r}")
    return final


ANSWER_TRANSFORMS: dict[str, Callable[[Any], Any]] = {"gsm8k": gsm8k}
"""Built-in answer transforms by name."""


def answer_transform(ref: str, key: str) -> Callable[[Any], Any]:
    """The transform `ref` names (a built-in or `module:function`); ValueError naming `key`."""
    if ref in ANSWER_TRANSFORMS:
        return ANSWER_TRANSFORMS[ref]
    if is_ref(ref):
        return import_function(ref, key)
    raise ValueError(
        f"{key}: unknown answer transform {ref!r}; built-in: {sorted(ANSWER_TRANSFORMS)}, "
        "or 'module:function'"
    )


def check_fields(fields: Mapping[str, str], key: str) -> None:
    """ValueError naming `key` unless `fields` maps row fields to non-empty column names."""
    bad = sorted(set(fields) - set(ROW_FIELDS))
    if bad:
        raise ValueError(f"{key}: {bad} are not row fields; map any of {list(ROW_FIELDS)}")
    empty = sorted(f for f, column in fields.items() if not column.strip())
    if empty:
        raise ValueError(f"{key}: {empty} map to an empty column name")


@dataclass(frozen=True)
class RecordMapper:
    """One source's mapping (module docstring); call it on a record."""

    fields: Mapping[str, str]
    verifier: str | None = None
    transform: Callable[[Any], Any] | None = None
    transform_name: str = ""

    def __call__(self, record: Any) -> Any:
        if not isinstance(record, Mapping):
            return record  # the validator reports it
        out = dict(record)
        for row_field, column in self.fields.items():
            if column not in record:
                raise BadRow(
                    "missing_field", f"missing field {column!r} (the source's {row_field!r})"
                )
            out[row_field] = record[column]
        if self.verifier is not None and out.get("verifier") is None:
            out["verifier"] = self.verifier
        if self.transform is not None and out.get("ground_truth") is not None:
            try:
                out["ground_truth"] = self.transform(out["ground_truth"])
            except (ValueError, TypeError) as e:
                raise BadRow("bad_answer", f"answer_transform {self.transform_name}: {e}") from None
        return out


def record_mapper(cfg: SourceConfig) -> RecordMapper | None:
    """The mapping of a `SourceConfig` (None when it sets none of `fields`, `verifier`,
    `answer_transform`). Raises ValueError for bad settings (`rlvr_jax.config.check` has
    refused them at load already)."""
    if not (cfg.fields or cfg.verifier or cfg.answer_transform):
        return None
    check_fields(cfg.fields, "fields")
    transform = None
    if cfg.answer_transform:
        transform = answer_transform(cfg.answer_transform, "answer_transform")
    return RecordMapper(dict(cfg.fields), cfg.verifier, transform, cfg.answer_transform or "")


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else "…" + text[-n:]
