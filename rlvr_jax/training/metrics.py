"""Step metrics: `<output_dir>/metrics.jsonl` (one object per step, `step` from 1), TensorBoard,
and PNG plots of the main curves.

Exactly-once across crashes: each line is flushed and fsync'ed when written; on resume from a
checkpoint at step c, lines with step > c (and a torn last line) are dropped before the run
continues, so after a SIGKILL and a restart every step appears once.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAIN_CURVES = (
    "reward/mean",
    "response_length/mean",
    "loss",
    "clip_fraction",
    "kl/sampler_learner",
    "groups/filtered_fraction",
    "throughput/tokens_per_s",
    "eval/pass@1",
)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Metric rows of a metrics.jsonl; a torn (partially written) last line is ignored."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    for i, line in enumerate(p.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s:%d: dropping a torn metrics line", p, i + 1)
    return rows


def truncate_after(
    path: str | Path, last_step: int, keep: Callable[[dict], bool] = lambda row: True
) -> int:
    """Keeps the rows with `step` ≤ last_step and `keep(row)`, atomically; returns their count."""
    p = Path(path)
    if not p.exists():
        return 0
    kept = [r for r in read_jsonl(p) if int(r.get("step", 0)) <= last_step and keep(r)]
    tmp = p.with_suffix(".jsonl.tmp")
    with open(tmp, "w") as f:
        for r in kept:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    return len(kept)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf; keep them visible
    return v


class MetricsWriter:
    """Appends one JSON line per step (flushed + fsync'ed) and mirrors scalars to TensorBoard."""

    def __init__(
        self,
        output_dir: str | Path,
        *,
        tensorboard: bool = True,
        resume_step: int = 0,
        enabled: bool = True,
    ):
        """`enabled=False` writes nothing (the processes of a multi-process run but one)."""
        self.dir = Path(output_dir)
        self.path = self.dir / "metrics.jsonl"
        self.enabled = enabled
        self._f = None
        self._tb = None
        if not enabled:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        truncate_after(self.path, resume_step)
        self._f = open(self.path, "a")  # noqa: SIM115 (held open for the run; see close())
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(str(self.dir / "tensorboard"))
            except ImportError:  # optional: the JSONL is the record
                log.warning("tensorboardX is not installed; TensorBoard output is off")

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), **{k: _clean(v) for k, v in metrics.items() if k != "step"}}
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, step)

    def sample(self, step: int, index: int, record: Mapping[str, Any]) -> None:
        """A sample record as a samples.jsonl line and as TensorBoard text (`samples/<index>`)."""
        if not self.enabled:
            return
        line = {"step": int(step), "index": index, **record}
        with open(self.dir / "samples.jsonl", "a") as f:
            f.write(json.dumps(line, default=str) + "\n")
        if self._tb is not None:
            text = "\n\n".join(f"**{k}**: {v}" for k, v in record.items())
            self._tb.add_text(f"samples/{index}", text, step)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        if self._tb is not None:
            self._tb.close()


def plot_curves(
    rows: list[dict[str, Any]], out_png: str | Path, keys: Iterable[str] = MAIN_CURVES
) -> Path | None:
    """One PNG with a panel per metric key present in `rows`; None when nothing to plot."""
    present = [k for k in keys if any(isinstance(r.get(k), int | float) for r in rows)]
    if not present:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(present))
    nrows = math.ceil(len(present) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3.2 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, present):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 50 else None)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
