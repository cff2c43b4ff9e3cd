"""Prompt sources: JSONL, Parquet and TFDS files read into validated `PromptRow`s.

A source is read whole into memory (RLVR prompt sets are 10^4-10^6 short rows; the mixture
shuffles each per epoch). Unusable rows are skipped and counted (the first few logged with file
and row); a source with no usable row, a missing file or an unknown format is a `DataError`, a
row with an unknown verifier an `UnknownVerifier` error. The source's `fields`, `verifier` and
`answer_transform` (`data.mapping`) apply to each record before it is validated.

    src = load_source(SourceConfig(path="data/train.jsonl"), known_verifiers={"math"})
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import logging
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_jax.config.refs import is_ref
from rlvr_jax.config.schema import SourceConfig
from rlvr_jax.data.mapping import record_mapper
from rlvr_jax.data.rows import BadRow, DataError, PromptRow, UnknownVerifier, row_from_record

logger = logging.getLogger(__name__)

MAX_LOGGED_SKIPS = 5
"""Skipped rows logged one by one per source; the rest only appear in the summary."""

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")

Record = tuple[int, str, Any]
"""(row index, where the row is for messages, the record dict or a BadRow)."""


@dataclass(frozen=True)
class PromptSource:
    """The usable rows of one source, with its mixture weight and skip counts."""

    name: str
    """Name in logs, metrics and the iterator state."""
    rows: tuple[PromptRow, ...]
    """The valid rows, in file order."""
    weight: float = 1.0
    """Mixture weight (normalised over sources)."""
    location: str = ""
    """File path or TFDS name, for messages."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Skipped rows by reason kind (`bad_json`, `missing_field`, `too_long`, ...)."""

    def __post_init__(self) -> None:
        if not self.rows:
            raise DataError(f"source {self.name!r} has no rows")
        if not self.weight >= 0.0:  # also rejects NaN
            raise DataError(f"source {self.name!r}: weight must be >= 0, got {self.weight}")

    @property
    def num_skipped(self) -> int:
        """Total rows skipped."""
        return sum(self.skipped.values())


class SkipLog:
    """Counts skipped rows by kind; logs the first `MAX_LOGGED_SKIPS`, then one summary."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.counts: collections.Counter[str] = collections.Counter()

    def skip(self, where: str, error: BadRow) -> None:
        """Records one skipped row."""
        self.counts[error.kind] += 1
        if self.total <= MAX_LOGGED_SKIPS:
            logger.warning("%s: skipped %s: %s", self.label, where, error)

    @property
    def total(self) -> int:
        """Rows skipped so far."""
        return sum(self.counts.values())

    def summary(self, kept: int) -> str:
        """One line: how many rows were skipped, by kind."""
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(self.counts.items()))
        return f"skipped {self.total} of {self.total + kept} rows ({kinds})"


def resolve_format(cfg: SourceConfig) -> str:
    """The concrete format of a source (`auto` goes by the file extension)."""
    if cfg.format != "auto":
        return cfg.format
    name = cfg.path.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    raise DataError(
        f"source {cfg.path!r}: cannot tell the format from the extension (known: "
        f"{JSONL_SUFFIXES + PARQUET_SUFFIXES}); set format: jsonl, parquet or tfds"
    )


def source_name(cfg: SourceConfig) -> str:
    """`cfg.name`, else the file name without its data suffixes, else the TFDS name."""
    if cfg.name:
        return cfg.name
    if cfg.format == "tfds":
        return cfg.path
    name = Path(cfg.path).name
    for suffix in sorted(JSONL_SUFFIXES + PARQUET_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return Path(cfg.path).stem


def load_source(
    cfg: SourceConfig,
    *,
    known_verifiers: Collection[str] | None = None,
    token_length: Callable[[PromptRow], int] | None = None,
    max_prompt_len: int | None = None,
    response: Callable[[Mapping[str, Any]], str] | None = None,
    encode: Callable[[PromptRow], Sequence[int]] | None = None,
    parse: Callable[..., Any] | None = None,
) -> PromptSource:
    """Reads and validates one source.

    `known_verifiers`: names rows may use (None = no check). `encode(row)`: the row's prompt
    token ids under the run's template, computed once here and kept as `row.prompt_ids`
    (`formatting.prompt_encoder`); rows longer than `max_prompt_len` tokens are skipped.
    `token_length(row)`: the length alone, when no encoder is given.
    `response(record)`: each row's SFT response (see `row_from_record`); records it rejects
    with BadRow are skipped and counted.
    `parse(record, *, source, index, where)`: validates a record into a row of another kind
    instead of `row_from_record` (preference pairs: `preferences.preference_parser`); it raises
    BadRow for a record to skip.
    """
    fmt = resolve_format(cfg)
    name = source_name(cfg)
    location = cfg.path if fmt != "tfds" else f"tfds:{cfg.path}[{cfg.split}]"
    label = f"source {name!r} ({location})"
    if fmt not in READERS:
        raise DataError(f"{label}: unknown format {fmt!r}; expected one of {sorted(READERS)}")

    mapper = record_mapper(cfg)
    refs: dict[str, str] = {}  # module:function verifiers -> the first row naming each

    def validate(index: int, where: str, record: Any) -> PromptRow:
        if isinstance(record, BadRow):
            raise record
        if mapper is not None:
            record = mapper(record)
        if parse is not None:
            row = parse(record, source=name, index=index, where=f"{label} {where}")
        else:
            row = row_from_record(
                record,
                source=name,
                index=index,
                where=f"{label} {where}",
                default_domain=cfg.domain,
                known_verifiers=known_verifiers,
                response=response,
            )
        if is_ref(getattr(row, "verifier", None)):
            refs.setdefault(row.verifier, where)
        n = None
        if encode is not None:
            ids = np.asarray(encode(row), np.int32)
            ids.setflags(write=False)
            row = dataclasses.replace(row, prompt_ids=ids)
            n = len(ids)
        elif token_length is not None:
            n = token_length(row)
        if n is not None and max_prompt_len is not None and n > max_prompt_len:
            raise BadRow("too_long", f"prompt is {n} tokens > max_prompt_len {max_prompt_len}")
        return row

    skips = SkipLog(label)
    rows: list[PromptRow] = []
    try:
        for index, where, record in READERS[fmt](cfg):
            try:
                rows.append(validate(index, where, record))
            except BadRow as e:
                skips.skip(where, e)
    except (OSError, EOFError) as e:  # a truncated or corrupt file
        raise DataError(f"{label}: reading failed after {len(rows)} rows: {e}") from e
    if not rows:
        detail = skips.summary(0) if skips.total else "it holds no rows"
        raise DataError(f"{label}: no usable rows; {detail}{_mapping_hint(cfg, skips)}")
    if known_verifiers is not None:
        _import_verifiers(refs, label)
    if skips.total:
        logger.warning("%s: %s", label, skips.summary(len(rows)))
    return PromptSource(name, tuple(rows), cfg.weight, location, dict(skips.counts))


def _mapping_hint(cfg: SourceConfig, skips: SkipLog) -> str:
    """What to set when every row lacked a field (files with their own column names)."""
    if not skips.counts.get("missing_field") or cfg.fields:
        return ""
    return (
        "; rows need the fields prompt, ground_truth and verifier (docs/data.md): map a file's "
        "own columns with the source's `fields` (e.g. {prompt: question, ground_truth: answer}) "
        "and set its `verifier`"
    )


def _import_verifiers(refs: Mapping[str, str], label: str) -> None:
    """Imports each `module:function` verifier the rows name (`refs`: verifier -> where the
    first row naming it is), once: a missing module fails here, naming that row, not when the
    first completion is scored."""
    from rlvr_jax.config.refs import import_function

    for ref, where in refs.items():
        try:
            import_function(ref, f"{label} {where} 'verifier'")
        except ValueError as e:
            raise UnknownVerifier(str(e)) from None


def load_sources(cfgs: Sequence[SourceConfig], **options: Any) -> list[PromptSource]:
    """`load_source(c, **options)` for each config (`options`: `known_verifiers`,
    `token_length`, `max_prompt_len`, `response`, `encode`, `parse`, as `load_source` takes
    them); source names must be distinct."""
    names = collections.Counter(source_name(c) for c in cfgs)
    dup = sorted(n for n, k in names.items() if k > 1)
    if dup:
        raise DataError(f"sources share the names {dup}; give each a distinct `name`")
    return [load_source(c, **options) for c in cfgs]


def read_jsonl(cfg: SourceConfig) -> Iterator[Record]:
    """Records of a JSON-lines file (`.gz` compressed or not); blank lines are ignored."""
    path = _existing_file(cfg.path)
    opener = gzip.open if path.name.endswith(".gz") else open
    return _jsonl_records(path, opener)


def _jsonl_records(path: Path, opener: Callable[..., Any]) -> Iterator[Record]:
    with opener(path, "rb") as f:
        for index, raw in enumerate(f):
            if not raw.strip():
                continue
            where = f"line {index + 1}"
            try:
                record = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                yield index, where, BadRow("bad_json", f"undecodable JSON: {e}")
                continue
            yield index, where, record


def read_parquet(cfg: SourceConfig) -> Iterator[Record]:
    """Records of a Parquet file (read in batches with pyarrow)."""
    path = _existing_file(cfg.path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"source {cfg.path!r}: not a readable Parquet file: {e}") from e
    return _parquet_records(parquet)


def _parquet_records(parquet: Any) -> Iterator[Record]:
    import pyarrow as pa

    index = 0
    try:
        for batch in parquet.iter_batches(batch_size=4096):
            for record in batch.to_pylist():
                yield index, f"row {index}", record
                index += 1
    except pa.ArrowException as e:  # corrupt data pages; surfaces as a DataError
        raise OSError(f"Parquet data unreadable at row {index}: {e}") from e


def read_tfds(cfg: SourceConfig) -> Iterator[Record]:
    """Records of a prepared TFDS dataset in `cfg.data_dir` (never downloads)."""
    from rlvr_jax.data.tf_utils import import_tfds

    tfds = import_tfds()
    label = f"TFDS dataset {cfg.path!r} (data_dir={cfg.data_dir!r})"
    try:
        builder = tfds.builder(cfg.path, data_dir=cfg.data_dir)
    except (tfds.core.registered.DatasetNotFoundError, ValueError) as e:
        first_line = str(e).strip().splitlines()[0]  # TFDS appends every dataset it knows
        raise DataError(f"{label}: not found: {first_line}") from None
    if not builder.is_prepared():
        raise DataError(f"{label} is not prepared there (no download is attempted)")
    if cfg.split not in builder.info.splits:
        raise DataError(f"{label} has no split {cfg.split!r}; it has {list(builder.info.splits)}")
    dataset = builder.as_dataset(split=cfg.split, shuffle_files=False)
    return _tfds_records(tfds.as_numpy(dataset))


def _tfds_records(examples: Any) -> Iterator[Record]:
    for index, example in enumerate(examples):
        where = f"example {index}"
        try:
            yield index, where, _decode_example(example)
        except BadRow as e:
            yield index, where, e


def _decode_example(example: dict[str, Any]) -> dict[str, Any]:
    record = {k: v.decode("utf-8") if isinstance(v, bytes) else v for k, v in example.items()}
    for key in ("ground_truth", "verifier_kwargs"):
        if isinstance(record.get(key), str):
            try:
                record[key] = json.loads(record[key])
            except json.JSONDecodeError as e:
                raise BadRow("bad_json", f"{key} is not JSON text: {e}") from None
    return record


def _existing_file(path: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"source file not found: {path!r}")
    return p


READERS: dict[str, Callable[[SourceConfig], Iterator[Record]]] = {
    "jsonl": read_jsonl,
    "parquet": read_parquet,
    "tfds": read_tfds,
}
"""Record readers by source format. Each checks that its file or dataset exists when called
and returns an iterator of (index, where, record-or-BadRow)."""
