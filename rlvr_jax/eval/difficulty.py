"""Offline difficulty filtering (OLMo 3; ALGORITHMS.md, sampling-side techniques).

Each prompt is sampled n times (8) from the starting policy at temperature 1, top-p 1; its
pass rate is k/n, k the samples its verifier scores correct (≥ 0.5). Prompts solved too often
(pass rate > `max_pass_rate`, 5/8) teach little and are dropped; the rest are written back as
they were (a JSONL line byte for byte, a Parquet row as the JSON object of its values). Rows
the loader skips are counted and not written.

    mask_P = keep_mask(counts_P, n=8, max_pass_rate=0.625)  # 6/8 dropped, 5/8 kept
    hist = pass_histogram(counts_P, n=8)                    # prompts with k = 0..8 correct
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_jax.data.rows import DataError
from rlvr_jax.data.synthetic import write_lines
from rlvr_jax.eval.evaluate import DEFAULT_CHUNK_PROMPTS

DEFAULT_SAMPLES = 8
"""n: samples per prompt (OLMo 3)."""

DEFAULT_MAX_PASS_RATE = 0.625
"""Prompts with a pass rate above this are dropped (OLMo 3: 62.5%, i.e. more than 5 of 8)."""

_RATE_TOLERANCE = 1e-9
"""k/n equal to the threshold up to float rounding counts as equal (kept)."""

OUTPUT_SUFFIXES = (".jsonl", ".ndjson")
"""Names the output may have: the loader reads them back as JSONL."""


def pass_rates(counts_P: np.ndarray, n: int) -> np.ndarray:
    """float64[P]: k/n per prompt.

    Raises:
      ValueError: n < 1 or a count outside [0, n].
    """
    counts_P = np.asarray(counts_P)
    if n < 1:
        raise ValueError(f"samples per prompt must be >= 1, got {n}")
    if counts_P.size and (counts_P.min() < 0 or counts_P.max() > n):
        raise ValueError(f"correct counts must lie in [0, {n}], got {counts_P.tolist()}")
    return counts_P.astype(np.float64) / n


def keep_mask(counts_P: np.ndarray, n: int, max_pass_rate: float) -> np.ndarray:
    """bool[P]: True where the prompt is kept, i.e. k/n <= max_pass_rate.

    Raises:
      ValueError: max_pass_rate outside [0, 1], or the counts of `pass_rates`.
    """
    if not 0.0 <= max_pass_rate <= 1.0:
        raise ValueError(f"max_pass_rate must be in [0, 1], got {max_pass_rate}")
    return pass_rates(counts_P, n) <= max_pass_rate + _RATE_TOLERANCE


def pass_histogram(counts_P: np.ndarray, n: int) -> np.ndarray:
    """int64[n + 1]: entry k is the number of prompts with k of n samples correct."""
    pass_rates(counts_P, n)  # validates
    return np.bincount(np.asarray(counts_P, np.int64).reshape(-1), minlength=n + 1)


@dataclass(frozen=True)
class FilterReport:
    """What one filtering run did; `to_json()` is `rlvr-filter --json`'s content."""

    input: str
    """The input file."""
    output: str
    """The file the kept rows went to."""
    model: str
    """The policy that was sampled."""
    num_samples: int
    """n: samples per prompt."""
    max_pass_rate: float
    """Prompts with pass rate above this were dropped."""
    counts_P: np.ndarray
    """int64[P]: correct samples of each scored prompt, in input order."""
    kept_P: np.ndarray
    """bool[P]: which scored prompts were kept."""
    domains: tuple[str, ...]
    """Domain of each scored prompt."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Input rows the loader skipped, by reason."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Sampling settings, verifier failures and timings (merged into the JSON as they are)."""

    def histogram(self) -> list[dict[str, Any]]:
        """One bin per k = 0..n: its pass rate k/n, prompts in it, and whether it is kept."""
        n = self.num_samples
        hist = pass_histogram(self.counts_P, n)
        kept = keep_mask(np.arange(n + 1), n, self.max_pass_rate)
        return [
            {"correct": k, "pass_rate": k / n, "prompts": int(hist[k]), "kept": bool(kept[k])}
            for k in range(n + 1)
        ]

    def to_json(self) -> dict[str, Any]:
        """Counts, kept fraction, histogram bins, per-domain counts, settings and times."""
        scored, kept = len(self.counts_P), int(self.kept_P.sum())
        skipped = sum(self.skipped.values())
        per_domain: dict[str, dict[str, float]] = {}
        rates_P = pass_rates(self.counts_P, self.num_samples)
        for d in sorted(set(self.domains)):
            sel = np.array([dd == d for dd in self.domains])
            per_domain[d] = {
                "scored": int(sel.sum()),
                "kept": int(self.kept_P[sel].sum()),
                "mean_pass_rate": float(rates_P[sel].mean()),
            }
        return {
            "input": self.input,
            "output": self.output,
            "model": self.model,
            "samples": self.num_samples,
            "max_pass_rate": self.max_pass_rate,
            "counts": {
                "rows": scored + skipped,
                "skipped": skipped,
                "scored": scored,
                "kept": kept,
                "dropped": scored - kept,
            },
            "kept_fraction": kept / scored if scored else 0.0,
            "mean_pass_rate": float(rates_P.mean()) if scored else 0.0,
            "skipped": dict(sorted(self.skipped.items())),
            "histogram": self.histogram(),
            "per_domain": per_domain,
            **self.extra,
        }

    def summary(self) -> str:
        """A few lines for the console: counts, then the histogram as a bar per bin."""
        j = self.to_json()
        c = j["counts"]
        lines = [
            f"{c['rows']} rows read, {c['skipped']} skipped by the loader, {c['scored']} scored "
            f"({self.num_samples} samples each): kept {c['kept']} ({j['kept_fraction']:.1%}), "
            f"dropped {c['dropped']} with pass rate > {self.max_pass_rate:g}"
        ]
        top = max((b["prompts"] for b in j["histogram"]), default=0) or 1
        for b in j["histogram"]:
            bar = "#" * round(40 * b["prompts"] / top)
            mark = "kept" if b["kept"] else "drop"
            lines.append(
                f"  {b['correct']:>3}/{self.num_samples:<3} {mark} {b['prompts']:>7d} {bar}"
            )
        return "\n".join(lines)


def check_output_path(path: str | Path) -> Path:
    """`path` if it names a JSONL file the loader can read back.

    Raises:
      ValueError: another extension (naming the path and the accepted ones).
    """
    p = Path(path)
    if not p.name.lower().endswith(OUTPUT_SUFFIXES):
        raise ValueError(f"output {str(p)!r} must end in one of {OUTPUT_SUFFIXES}")
    return p


def original_lines(path: str | Path, fmt: str, indices: Iterable[int]) -> dict[int, str]:
    """The input rows at `indices` (source row indices), as JSON lines without newline:
    for JSONL the line exactly as it is in the file; for Parquet the row's values as JSON.

    Raises:
      DataError: the file cannot be read again, or a Parquet value has no JSON form.
    """
    wanted = set(indices)
    if fmt == "jsonl":
        return _jsonl_lines(Path(path), wanted)
    if fmt == "parquet":
        return _parquet_lines(Path(path), wanted)
    raise DataError(f"{path}: rows can be written back from JSONL or Parquet only, not {fmt!r}")


def _jsonl_lines(path: Path, wanted: set[int]) -> dict[int, str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    out: dict[int, str] = {}
    try:
        with opener(path, "rb") as f:
            for index, raw in enumerate(f):  # the same numbering as sources.read_jsonl
                if index in wanted:
                    out[index] = raw.rstrip(b"\r\n").decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: reading the rows back failed: {e}") from e
    return out


def _parquet_lines(path: Path, wanted: set[int]) -> dict[int, str]:
    from rlvr_jax.config.schema import SourceConfig
    from rlvr_jax.data.sources import read_parquet

    try:  # the same reader, so the same numbering
        records = read_parquet(SourceConfig(path=str(path), format="parquet"))
        return {i: _to_json(r, f"{path} row {i}") for i, _, r in records if i in wanted}
    except OSError as e:
        raise DataError(f"{path}: reading the rows back failed: {e}") from e


def _to_json(record: dict[str, Any], where: str) -> str:
    def default(value: Any) -> Any:
        if isinstance(value, bytes):
            return value.decode("utf-8", errors="replace")
        if hasattr(value, "isoformat"):  # dates and times
            return value.isoformat()
        raise DataError(f"{where}: a {type(value).__name__} value has no JSON form")

    return json.dumps(record, ensure_ascii=False, default=default)


def plot_histogram(report: FilterReport, path: str | Path) -> Path:
    """A PNG bar chart of prompts per pass rate k/n, kept bins and dropped bins coloured apart,
    the threshold marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = report.histogram()
    n = report.num_samples
    x = [b["correct"] for b in bins]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    colors = ["tab:blue" if b["kept"] else "tab:gray" for b in bins]
    ax.bar(x, [b["prompts"] for b in bins], color=colors, width=0.8)
    last_kept = max(b["correct"] for b in bins if b["kept"])  # k = 0 is always kept
    ax.axvline(last_kept + 0.5, color="tab:red", linestyle="--", linewidth=1)
    ax.set_xticks(x, [f"{k}/{n}" for k in x])
    ax.set_xlabel(f"pass rate ({n} samples per prompt)")
    ax.set_ylabel("prompts")
    kept, scored = int(report.kept_P.sum()), len(report.counts_P)
    ax.set_title(f"kept {kept} of {scored} (pass rate <= {report.max_pass_rate:g}, blue)")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def check_input_path(path: str | Path) -> str:
    """The format (`jsonl` or `parquet`) of the input file `path`.

    Raises:
      DataError: the file is missing or its extension names neither format.
    """
    from rlvr_jax.config.schema import SourceConfig
    from rlvr_jax.data.sources import resolve_format

    if not Path(path).is_file():
        raise DataError(f"input file not found: {str(path)!r}")
    fmt = resolve_format(SourceConfig(path=str(path)))
    if fmt not in ("jsonl", "parquet"):
        raise DataError(f"input {str(path)!r}: expected a JSONL or Parquet file")
    return fmt


def load_input(cfg: Any, path: str | Path, fmt: str, tokenizer: Any) -> Any:
    """The `data.PromptSource` of the input file `path` (format `fmt`): its rows with a known
    verifier and at most `data.max_prompt_len` tokens under `data.prompt_template`."""
    from rlvr_jax.config.schema import SourceConfig
    from rlvr_jax.data.formatting import prompt_length_fn
    from rlvr_jax.data.sources import load_source
    from rlvr_jax.rewards import known_verifiers

    return load_source(
        SourceConfig(path=path, format=fmt),
        known_verifiers=known_verifiers(),
        token_length=prompt_length_fn(tokenizer, cfg.data.prompt_template),
        max_prompt_len=cfg.data.max_prompt_len,
    )


def filter_source(
    cfg: Any,
    input_path: str,
    output_path: str,
    *,
    num_samples: int = DEFAULT_SAMPLES,
    max_pass_rate: float = DEFAULT_MAX_PASS_RATE,
    seed: int = 0,
    chunk_prompts: int = DEFAULT_CHUNK_PROMPTS,
) -> FilterReport:
    """Filters the prompts of `input_path` by the pass rate of the policy `cfg.model` (module
    docstring) and writes the kept rows, in input order, to `output_path` (JSONL). Prompt i
    samples with `rollout.request_seed(seed, i)`, i its position among the scored rows.

    Raises:
      DataError: a missing, unreadable or empty input file (naming it).
      ValueError: bad settings (an output that is not .jsonl, n < 1, a rate outside [0, 1]).
    """
    from rlvr_jax.eval.evaluate import load_policy, sample_rows

    t0 = time.perf_counter()
    check_output_path(output_path)
    keep_mask(np.zeros(0, np.int64), num_samples, max_pass_rate)  # validates the settings
    fmt = check_input_path(input_path)
    model, tokenizer = load_policy(cfg)
    source = load_input(cfg, input_path, fmt, tokenizer)
    rows = list(source.rows)
    sampled = sample_rows(
        cfg,
        model,
        tokenizer,
        rows,
        num_samples=num_samples,
        temperature=1.0,
        seed=seed,
        chunk_prompts=chunk_prompts,
    )
    kept_P = keep_mask(sampled.counts_P, num_samples, max_pass_rate)
    kept_index = [r.index for r, keep in zip(rows, kept_P) if keep]
    lines = original_lines(input_path, fmt, kept_index)
    write_lines([lines[i] for i in kept_index], output_path)
    return FilterReport(
        input=str(input_path),
        output=str(output_path),
        model=str(cfg.model.path),
        num_samples=num_samples,
        max_pass_rate=max_pass_rate,
        counts_P=sampled.counts_P,
        kept_P=kept_P,
        domains=sampled.domains,
        skipped=dict(source.skipped),
        extra={
            "temperature": 1.0,
            "top_p": 1.0,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "seed": seed,
            **sampled.stats(num_samples),
            "time_s": time.perf_counter() - t0,
        },
    )
