"""Progress of a benchmark on stderr (results stay on stdout): a line per phase, a bar (or a
line per step) inside long phases, each line with the seconds since `begin(prog)` (which
`rlvr-bench` and `rlvr-bench all` call before each benchmark).

    progress.line("timing continuous vs static (2 rounds)")   # rlvr-bench decode [  12.3 s] ...
    for r in progress.steps(range(rounds), "round"): ...      # a bar on a terminal"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

_state = {"prog": "rlvr-bench", "t0": time.perf_counter()}


def begin(prog: str) -> None:
    """Names the benchmark whose progress follows and restarts its clock."""
    _state.update(prog=prog, t0=time.perf_counter())


def line(message: str) -> None:
    """One progress line: `{prog} [seconds since begin] message`."""
    seconds = time.perf_counter() - float(_state["t0"])
    print(f"{_state['prog']} [{seconds:7.1f} s] {message}", file=sys.stderr, flush=True)


def steps(items: Sequence[T], what: str) -> Iterator[T]:
    """`items`, showing progress: a tqdm bar on a terminal, else a line per item."""
    n = len(items)
    if sys.stderr.isatty():
        from tqdm import tqdm

        yield from tqdm(items, desc=f"{_state['prog']} {what}", total=n, file=sys.stderr)
        return
    for i, item in enumerate(items, 1):
        line(f"{what} {i}/{n}")
        yield item
