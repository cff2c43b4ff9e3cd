"""A seeded, resumable weighted mixture over prompt sources.

Draw k picks a source with probability weight / sum(weights) from the Philox stream (seed,
"mixture", k); the source hands out its rows in a per-epoch permutation keyed by (seed,
"shuffle", source name, epoch). The randomness is counter-based, so the state is a few integers:
`state()` returns them (JSON-able) and `restore(state)` continues at the next unseen prompt.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from rlvr_jax.config.schema import DataConfig
from rlvr_jax.data.rng import stream
from rlvr_jax.data.rows import DataError, PromptRow
from rlvr_jax.data.sources import PromptSource, load_sources

STATE_VERSION = 1


class PromptIterator:
    """Draws prompts from weighted sources; deterministic in (sources, seed)."""

    def __init__(self, sources: Sequence[PromptSource], *, seed: int = 0) -> None:
        if not sources:
            raise DataError("PromptIterator needs at least one source")
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise DataError(f"source names must be distinct, got {names}")
        weights = np.array([s.weight for s in sources], dtype=np.float64)
        if not np.all(weights >= 0.0) or not weights.sum() > 0.0:
            raise DataError(f"source weights must be >= 0 with a positive sum, got {weights}")
        self.sources = tuple(sources)
        self.seed = int(seed)
        self.probs = weights / weights.sum()
        self._cdf = np.cumsum(self.probs)
        self._draws = 0
        self._epochs = [0] * len(sources)
        self._cursors = [0] * len(sources)
        self._perms: dict[int, tuple[int, np.ndarray]] = {}  # source -> (epoch, permutation)

    @property
    def draws(self) -> int:
        """Prompts drawn so far."""
        return self._draws

    def next_batch(self, n: int) -> list[PromptRow]:
        """The next `n` prompts."""
        if n < 0:
            raise ValueError(f"next_batch needs n >= 0, got {n}")
        return [self._next() for _ in range(n)]

    def _next(self) -> PromptRow:
        u = stream(self.seed, "mixture", self._draws).random()
        # min() guards against u landing above a cdf that rounds to just under 1.
        s = min(int(np.searchsorted(self._cdf, u, side="right")), len(self.sources) - 1)
        self._draws += 1
        source = self.sources[s]
        if self._cursors[s] == len(source.rows):
            self._epochs[s] += 1
            self._cursors[s] = 0
        row = source.rows[int(self._permutation(s)[self._cursors[s]])]
        self._cursors[s] += 1
        return row

    def _permutation(self, s: int) -> np.ndarray:
        epoch = self._epochs[s]
        cached = self._perms.get(s)
        if cached is None or cached[0] != epoch:
            source = self.sources[s]
            perm = stream(self.seed, "shuffle", source.name, epoch).permutation(len(source.rows))
            cached = self._perms[s] = (epoch, perm)
        return cached[1]

    def state(self) -> dict[str, Any]:
        """The position, as a small JSON-serialisable dict."""
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "draws": self._draws,
            "sources": {
                src.name: {"size": len(src.rows), "epoch": e, "cursor": c}
                for src, e, c in zip(self.sources, self._epochs, self._cursors)
            },
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continues from `state` (from `state()` of an iterator over the same sources and
        seed). Raises ValueError naming what differs."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"iterator state version {state.get('version')!r} != {STATE_VERSION}")
        if state.get("seed") != self.seed:
            raise ValueError(f"iterator state has seed {state.get('seed')!r}, this one {self.seed}")
        saved = state.get("sources")
        names = [s.name for s in self.sources]
        if not isinstance(saved, Mapping) or sorted(saved) != sorted(names):
            got = sorted(saved) if isinstance(saved, Mapping) else saved
            raise ValueError(f"iterator state is for sources {got}, this one has {sorted(names)}")
        epochs, cursors = [], []
        for src in self.sources:
            entry = saved[src.name]
            if entry.get("size") != len(src.rows):
                raise ValueError(
                    f"source {src.name!r} had {entry.get('size')} rows when the state was "
                    f"saved and has {len(src.rows)} now"
                )
            epoch, cursor = int(entry["epoch"]), int(entry["cursor"])
            if epoch < 0 or not 0 <= cursor <= len(src.rows):
                raise ValueError(f"source {src.name!r}: bad epoch/cursor {epoch}/{cursor}")
            epochs.append(epoch)
            cursors.append(cursor)
        draws = int(state["draws"])
        if draws < 0:
            raise ValueError(f"iterator state has draws={draws}")
        self._draws, self._epochs, self._cursors = draws, epochs, cursors
        self._perms.clear()


def build_prompt_iterator(
    cfg: DataConfig,
    *,
    tokenizer: Any = None,
    known_verifiers: Collection[str] | None = None,
    seed: int | None = None,
) -> PromptIterator:
    """Loads `cfg.sources` and mixes them. With a tokenizer, each prompt is tokenized once under
    `cfg.prompt_template` (kept as `row.prompt_ids`) and those longer than `cfg.max_prompt_len`
    tokens are skipped and counted.
    `seed` defaults to `cfg.seed`."""
    if not cfg.sources:
        raise DataError("data.sources is empty: configure at least one prompt source")
    sources = load_sources(
        cfg.sources, known_verifiers=known_verifiers, **_length_filter(cfg, tokenizer)
    )
    return PromptIterator(sources, seed=cfg.seed if seed is None else seed)


def load_eval_rows(
    cfg: DataConfig,
    *,
    tokenizer: Any = None,
    known_verifiers: Collection[str] | None = None,
) -> list[PromptRow]:
    """All rows of `cfg.eval_sources`, in source then file order (no mixing, no shuffle)."""
    sources = load_sources(
        cfg.eval_sources, known_verifiers=known_verifiers, **_length_filter(cfg, tokenizer)
    )
    return [row for src in sources for row in src.rows]


def _length_filter(cfg: DataConfig, tokenizer: Any) -> dict[str, Any]:
    if tokenizer is None:
        return {}
    from rlvr_jax.data.formatting import prompt_encoder

    return {
        "encode": prompt_encoder(tokenizer, cfg.prompt_template),
        "max_prompt_len": cfg.max_prompt_len,
    }
