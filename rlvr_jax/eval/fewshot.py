"""Few-shot prompting for base models: N solved examples ahead of each prompt.

The examples come from a source file (`rlvr-eval --fewshot N --fewshot-source FILE`): JSONL
or Parquet rows in DESIGN.md's data-row convention that also carry a solution, e.g.

    {"prompt": "Compute 3 + 4. Put your final answer in \\boxed{}.", "verifier": "math",
     "ground_truth": "7", "domain": "arithmetic",
     "solution": "3 + 4 = 7\\nThe answer is \\boxed{7}."}

A row's demonstration is its non-empty `solution`, else `response`, else for synthetic rows
`synthetic.reference_response(row)` (so the synthetic `train.jsonl` serves as it is); other
rows are skipped and counted by reason. The pool is permuted by the seed; each prompt takes
the first N examples of its own domain, then of the others, never its own prompt.

Rendering: each example becomes two chat turns (user: prompt, assistant: solution) after the
prompt's system messages and before its own turns (the examples' system messages are dropped);
the prompt template then renders the turns as usual.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr_jax.data.rows import BadRow, DataError, PromptRow, row_from_record

SOLUTION_FIELDS = ("solution", "response")
"""Record fields holding a demonstration, in order of preference."""

Turns = tuple[tuple[str, str], ...]
"""Chat turns as (role, content) pairs: hashable, comparable."""


@dataclass(frozen=True)
class FewshotExample:
    """One solved example."""

    turns: Turns
    """The example's prompt as chat turns, system messages dropped."""
    solution: str
    """The demonstration answering it."""
    domain: str
    """The row's domain (examples are matched to prompts by domain)."""
    where: str
    """The file and row it came from, for messages."""


@dataclass(frozen=True)
class FewshotPool:
    """The solved examples of a source, in the seeded order prompts draw them in."""

    examples: tuple[FewshotExample, ...]
    """Usable examples, permuted by the seed."""
    skipped: dict[str, int]
    """Rows not usable, by reason (`no_solution`, `missing_field`, `bad_json`, ...)."""
    source: str
    """The file the examples came from."""

    def for_row(self, row: PromptRow, n: int) -> list[FewshotExample]:
        """The `n` examples for `row`: its domain's first, then the others', in pool order,
        leaving out examples whose prompt is `row`'s own.

        Raises:
          ValueError: fewer than `n` examples qualify (the message names the row).
        """
        own = _turns(row.messages())
        candidates = [e for e in self.examples if e.turns != own]
        chosen = [e for e in candidates if e.domain == row.domain][:n]
        if len(chosen) < n:
            chosen += [e for e in candidates if e.domain != row.domain][: n - len(chosen)]
        if len(chosen) < n:
            raise ValueError(
                f"few-shot source {self.source!r} has {len(chosen)} usable examples other than "
                f"the prompt of {row.source!r} row {row.index}; {n} were asked for"
            )
        return chosen


def solution_of(record: Mapping[str, Any]) -> str | None:
    """A record's demonstration (module docstring), or None when it has none."""
    for key in SOLUTION_FIELDS:
        value = record.get(key)
        if isinstance(value, str) and value.strip():
            return value
    from rlvr_jax.data import synthetic

    try:
        return synthetic.reference_response(record)
    except (ValueError, KeyError, TypeError, SyntaxError):
        return None  # not a synthetic row, or one missing the fields its writer needs


def load_fewshot_pool(path: str, *, seed: int) -> FewshotPool:
    """Reads the solved examples of `path` (JSONL or Parquet) and orders them by `seed`.

    Raises:
      DataError: the file is missing, unreadable, of an unknown format, or holds no usable
        example (the message names it and counts the skipped rows by reason).
    """
    from rlvr_jax.config.schema import SourceConfig
    from rlvr_jax.data.rng import stream
    from rlvr_jax.data.sources import READERS, resolve_format, source_name

    cfg = SourceConfig(path=path)
    fmt = resolve_format(cfg)
    if fmt not in ("jsonl", "parquet"):
        raise DataError(f"few-shot source {path!r}: expected a JSONL or Parquet file")
    name = source_name(cfg)
    examples: list[FewshotExample] = []
    skipped: collections.Counter[str] = collections.Counter()
    try:
        for index, where, record in READERS[fmt](cfg):
            try:
                examples.append(_example(record, name=name, index=index, where=f"{path} {where}"))
            except BadRow as e:
                skipped[e.kind] += 1
    except (OSError, EOFError) as e:
        raise DataError(f"few-shot source {path!r}: reading failed: {e}") from e
    if not examples:
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items())) or "no rows"
        raise DataError(f"few-shot source {path!r} holds no solved example ({kinds})")
    order = stream(seed, "fewshot", name).permutation(len(examples))
    return FewshotPool(tuple(examples[int(i)] for i in order), dict(skipped), path)


def _example(record: Any, *, name: str, index: int, where: str) -> FewshotExample:
    if isinstance(record, BadRow):
        raise record
    row = row_from_record(record, source=name, index=index, where=where)
    solution = solution_of(record)
    if solution is None:
        raise BadRow("no_solution", f"{where}: no solution, response or synthetic reference")
    return FewshotExample(_turns(row.messages()), solution, row.domain, where)


def _turns(messages: Sequence[Mapping[str, str]]) -> Turns:
    return tuple((m["role"], m["content"]) for m in messages if m["role"] != "system")


def with_fewshot(row: PromptRow, examples: Sequence[FewshotExample]) -> PromptRow:
    """`row` with the examples' turns ahead of its own (module docstring, Rendering)."""
    if not examples:
        return row
    messages = row.messages()
    system = [m for m in messages if m["role"] == "system"]
    shots = []
    for e in examples:
        shots += [{"role": role, "content": content} for role, content in e.turns]
        shots.append({"role": "assistant", "content": e.solution})
    rest = [m for m in messages if m["role"] != "system"]
    return dataclasses.replace(row, prompt=tuple(system + shots + rest))
