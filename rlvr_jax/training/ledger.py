"""The prompt ledger, `<output_dir>/ledger.jsonl`: what became of every prompt drawn from the data
stream, one line per prompt, in the order they were settled:

    {"step": 7, "request": 41, "source": "train", "index": 12, "outcome": "trained", "version": 6}

`request` is the prompt's draw number (also its rollout request id and sampling-seed offset);
`source` and `index` its row; `outcome` is `trained` (in batch `step`), `filtered` (zero reward
variance; expert iteration: no completion kept), `stale` (older than `rollout.max_staleness`),
or `pending` (drawn and unsettled when the run ended); `version` the oldest policy version among
its tokens.

Every draw has exactly one line across kills and resumes: lines are appended (fsync'ed) when
the loop takes a step's batch, before its checkpoint, which stores their count; a resume from
checkpoint c keeps the lines of steps <= c (not `pending`) and drops the rest, exactly the
prompts its source state will draw again. Only the sources that sample write it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlvr_jax.training.metrics import truncate_after

log = logging.getLogger("rlvr_jax.train")

OUTCOMES = ("trained", "filtered", "stale", "pending")


def entry(request_id: int, row: Any, outcome: str, version: int | None = None) -> dict[str, Any]:
    """The ledger record of request `request_id` (row `row`) settled as `outcome`, no step."""
    if outcome not in OUTCOMES:
        raise ValueError(f"ledger outcome must be one of {OUTCOMES}, got {outcome!r}")
    out = {"request": int(request_id), "source": row.source, "index": int(row.index)}
    out["outcome"] = outcome
    if version is not None:
        out["version"] = int(version)
    return out


class Ledger:
    """Appends ledger records (one fsync per call); at construction, reconciles the file with
    the checkpoint the run resumes from (`resume_step`, and `expected`: the count of records
    that checkpoint stored, None when unknown)."""

    def __init__(
        self,
        output_dir: str | Path,
        *,
        resume_step: int = 0,
        expected: int | None = None,
        enabled: bool = True,
    ) -> None:
        """`enabled=False` writes nothing (the processes of a multi-process run but one)."""
        self.path = Path(output_dir) / "ledger.jsonl"
        self.enabled = enabled
        self.count = 0
        """Records settled so far (`pending` ones excluded): stored in each checkpoint."""
        self._f = None
        if enabled:
            self.count = self._reconcile(resume_step, expected)
        else:  # the other processes count too: every process saves the same checkpoint meta
            self.count = expected or 0

    def _reconcile(self, resume_step: int, expected: int | None) -> int:
        if not self.path.exists():
            if expected:
                log.warning(
                    "%s is missing; the checkpoint of step %d counted %d records",
                    self.path, resume_step, expected,
                )  # fmt: skip
            return 0
        kept = truncate_after(self.path, resume_step, keep=lambda r: r["outcome"] != "pending")
        if expected is not None and expected != kept:
            log.warning(
                "%s holds %d records up to step %d, but that checkpoint counted %d: the ledger "
                "was edited or lost lines", self.path, kept, resume_step, expected,
            )  # fmt: skip
        return kept

    def write(self, step: int, records: Iterable[dict[str, Any]]) -> None:
        """Appends `records` (from `entry`) as settled in `step`, durably."""
        records = list(records)
        self.count += sum(1 for r in records if r["outcome"] != "pending")
        if not self.enabled or not records:
            return
        if self._f is None:
            self._f = open(self.path, "a")  # noqa: SIM115 (held open; see close())
        self._f.writelines(json.dumps({"step": int(step), **r}) + "\n" for r in records)
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
