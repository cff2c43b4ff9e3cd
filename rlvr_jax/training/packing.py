"""Where each sequence of a batch goes: packed rows and token-budget micro-batches.

A `Layout` places sequences on rows of `row_len` tokens and groups the rows into `n_micro`
micro-batches of equal shape (one compiled step serves them all); a sequence never straddles
rows or micro-batches.

- `one_per_row`: the unpacked layout (sequence i alone in row i).
- `pack_tokens`: first-fit-decreasing into rows (at most `MAX_SEQS_PER_ROW` a row: the bound
  declared to cuDNN's packed attention), as many rows per micro-batch as
  `train.max_tokens_per_micro_batch` allows, the micro-batch count rounded up on the `ladder`
  (a few compiled shapes, at most a third of a micro-batch of padding rows).
- `pack_groups`: shared-prompt groups in the fewest rows of one micro-batch, a group split
  over rows (its prompt copied) where that saves a row.
- `pack_examples`: the in-order next-fit packing of `scripts/pretrain_tiny.py`, kept for the
  shipped base model's bit-identical recipe.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Layout:
    n_micro: int
    """M: micro-batches."""
    rows_per_micro: int
    """R_mb: rows of each micro-batch."""
    seqs_per_micro: int
    """N_mb: sequence slots of each micro-batch (unused slots are empty, all-masked)."""
    places: tuple[tuple[int, int, int, int], ...]
    """(micro-batch, row within it, offset in the row, slot within it) of each sequence."""
    packed: bool = True
    """False for `one_per_row` (any micro-batch split of it is valid)."""

    @property
    def rows(self) -> int:
        return self.n_micro * self.rows_per_micro

    @property
    def slots(self) -> int:
        return self.n_micro * self.seqs_per_micro

    def row(self, i: int) -> int:
        """Global row index of sequence i."""
        m, r, _, _ = self.places[i]
        return m * self.rows_per_micro + r

    def slot(self, i: int) -> int:
        """Global sequence slot of sequence i."""
        m, _, _, s = self.places[i]
        return m * self.seqs_per_micro + s


def one_per_row(n: int, rows: int, what: str = "sequences") -> Layout:
    """Sequence i alone in row i; ValueError naming `what` when they do not fit."""
    if n > rows:
        raise ValueError(f"{n} {what} do not fit one per row in {rows} rows")
    return Layout(1, rows, rows, tuple((0, i, 0, i) for i in range(n)), packed=False)


def ladder(n: int) -> int:
    """The smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (2^k and 3·2^k) that is ≥ n."""
    p = 1
    while p < n:
        if p >= 2 and p * 3 // 2 >= n:
            return p * 3 // 2
        p *= 2
    return p


MAX_SEQS_PER_ROW = 32
"""Sequences `pack_tokens` puts on one row at most."""


def max_segments(max_tokens_per_micro_batch: int) -> int:
    """Sequences a learner row holds at most: `MAX_SEQS_PER_ROW` when batches are packed
    (`train.max_tokens_per_micro_batch` > 0), else 1."""
    return MAX_SEQS_PER_ROW if max_tokens_per_micro_batch else 1


def _ffd_rows(lengths: Sequence[int], row_len: int) -> list[list[int]]:
    """First-fit-decreasing packing into rows of `row_len`, `MAX_SEQS_PER_ROW` a row at most."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        for r, room in enumerate(free):
            if n <= room and len(rows[r]) < MAX_SEQS_PER_ROW:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(row_len - n)
    return rows


def budget_rows(max_tokens: int, *, row_len: int, row_multiple: int = 1) -> int:
    """Rows of `row_len` a micro-batch of `max_tokens` holds, a multiple of `row_multiple` (the
    devices its rows are split over); ValueError naming the key when none."""
    rows = (max_tokens // row_len) // row_multiple * row_multiple
    if rows < 1:
        raise ValueError(
            f"train.max_tokens_per_micro_batch={max_tokens} holds no {row_multiple} row(s) of "
            f"{row_len} tokens: raise train.max_tokens_per_micro_batch"
        )
    return rows


def pack_tokens(
    lengths: Sequence[int],
    *,
    row_len: int,
    max_tokens: int,
    row_multiple: int = 1,
    what: str = "sequence",
    n_micro: int = 1,
    seqs_per_micro: int = 1,
) -> Layout:
    """Sequences of `lengths` tokens packed into rows of `row_len`, micro-batches of at most
    `max_tokens` tokens, rows and slots a multiple of `row_multiple`; at least `n_micro`
    micro-batches of at least `seqs_per_micro` slots (to give several layouts one shape).
    Raises ValueError naming a sequence that does not fit, and the key to raise."""
    for i, n in enumerate(lengths):
        if n > row_len or n > max_tokens:
            raise ValueError(
                f"{what} {i} has {n} tokens, more than a micro-batch of "
                f"train.max_tokens_per_micro_batch={max_tokens} (rows of {row_len}) holds: "
                "raise train.max_tokens_per_micro_batch"
            )
    rows_per_micro = budget_rows(max_tokens, row_len=row_len, row_multiple=row_multiple)
    rows = _ffd_rows(lengths, row_len)
    n_micro = max(n_micro, ladder(max(1, -(-len(rows) // rows_per_micro))))
    # deal the rows (longest first) to the micro-batch with the fewest tokens that has room
    load = [(0, m) for m in range(n_micro)]
    count = [0] * n_micro
    members: list[list[list[int]]] = [[] for _ in range(n_micro)]
    for row in sorted(rows, key=lambda r: -sum(lengths[i] for i in r)):
        skipped = []
        while True:
            tokens, m = heapq.heappop(load)
            if count[m] < rows_per_micro:
                break
            skipped.append((tokens, m))
        members[m].append(row)
        count[m] += 1
        heapq.heappush(load, (tokens + sum(lengths[i] for i in row), m))
        for item in skipped:
            heapq.heappush(load, item)
    places: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)] * len(lengths)
    most = max(seqs_per_micro, 1)
    for m, micro_rows in enumerate(members):
        slot = 0
        for r, row in enumerate(micro_rows):
            offset = 0
            for i in sorted(row):
                places[i] = (m, r, offset, slot)
                offset += lengths[i]
                slot += 1
        most = max(most, slot)
    seqs_per_micro = -(-most // row_multiple) * row_multiple
    return Layout(n_micro, rows_per_micro, seqs_per_micro, tuple(places))


Piece = tuple[int, int, int, list[int]]
"""(group, row, offset, its completions' indices): a group's prompt and some of its completions
laid out together (`pack_groups`)."""


EXACT_ROWS = 8
"""`pack_groups` uses the exact row count up to this many rows (each compiled with the first
batch), the `ladder` above: the demo's 8 groups fill ~4.2 rows of 512, and the ladder's 6
rows would compute a sixth more than 5."""


def _group_rows(n: int) -> int:
    return n if n <= EXACT_ROWS else ladder(n)


def pack_groups_row_counts(rows: int, row_multiple: int = 1) -> tuple[int, ...]:
    """Every row count `pack_groups` may return for at most `rows` rows."""
    m = row_multiple
    return tuple(sorted({min(rows, -(-_group_rows(n) // m) * m) for n in range(1, rows + 1)}))


def pack_groups(
    groups: Sequence[tuple[int, Sequence[int]]],
    *,
    row_len: int,
    rows: int,
    row_multiple: int = 1,
) -> tuple[int, list[Piece]]:
    """Shared-prompt groups, (prompt length, completion lengths) each, in the fewest rows of
    `row_len`: whole where they fit (first fit, longest first), else their completions spread
    over the rows with the most room, each part after its own copy of the prompt. The row
    count follows the total tokens (`_group_rows`), a multiple of `row_multiple`, at most
    `rows`; a count that leaves a group no room takes the next. Returns (rows used, pieces)."""
    if len(groups) > rows:
        raise ValueError(f"pack_groups: {len(groups)} groups for {rows} rows")
    sizes = [p + sum(cs) for p, cs in groups]
    for i, n in enumerate(sizes):
        if n > row_len:
            raise ValueError(f"pack_groups: group {i} has {n} tokens > a row of {row_len}")
    n = _group_rows(max(1, -(-sum(sizes) // row_len)))
    while True:
        used = min(rows, -(-n // row_multiple) * row_multiple)
        pieces = _place_groups(groups, sizes, row_len, used)
        if pieces is not None:
            return used, pieces
        n = _group_rows(n + 1)


def _place_groups(
    groups: Sequence[tuple[int, Sequence[int]]], sizes: list[int], row_len: int, rows: int
) -> list[Piece] | None:
    """`pack_groups`' placement into exactly `rows` rows; None when a completion finds no room."""
    free = [row_len] * rows
    pieces: list[Piece] = []
    for i in sorted(range(len(groups)), key=lambda i: (-sizes[i], i)):
        prompt, lengths = groups[i]
        whole = next((r for r in range(rows) if free[r] >= sizes[i]), None)
        if whole is not None:
            pieces.append((i, whole, row_len - free[whole], list(range(len(lengths)))))
            free[whole] -= sizes[i]
            continue
        rest = list(range(len(lengths)))
        while rest:
            r = max(range(rows), key=lambda r: (free[r], -r))
            room, take = free[r] - prompt, []
            for j in rest:
                if lengths[j] <= room:
                    take.append(j)
                    room -= lengths[j]
            if not take:
                return None
            pieces.append((i, r, row_len - free[r], take))
            free[r] = room
            rest = [j for j in rest if j not in take]
    return pieces


def pack_alike(
    lengths: Sequence[Sequence[int]], *, what: str = "sequence", **kwargs: int
) -> list[Layout]:
    """`pack_tokens` of each list of `lengths` (a batch's mini-batches), all given one shape."""
    first = [pack_tokens(n, what=what, **kwargs) for n in lengths]
    n_micro = max(x.n_micro for x in first)
    most = max(x.seqs_per_micro for x in first)
    return [pack_tokens(n, **kwargs, n_micro=n_micro, seqs_per_micro=most) for n in lengths]


def pack_examples(lengths: Sequence[int], *, rows: int, seq_len: int) -> list[tuple[int, int]]:
    """(row, offset) of each example of the longest prefix of `lengths` that fits `rows` rows
    of `seq_len`, next-fit in order. Raises ValueError for an example longer than `seq_len` or
    shorter than 2 tokens (nothing to predict)."""
    placements: list[tuple[int, int]] = []
    row, offset = 0, 0
    for i, n in enumerate(lengths):
        if n < 2 or n > seq_len:
            raise ValueError(f"pack_examples: example {i} has {n} tokens; need 2..{seq_len}")
        if offset + n > seq_len:
            row, offset = row + 1, 0
        if row >= rows:
            break
        placements.append((row, offset))
        offset += n
    return placements


def in_order(lengths: Sequence[int], *, rows: int, seq_len: int) -> Layout:
    """`pack_examples` as a one-micro-batch `Layout` (slots in example order)."""
    placements = pack_examples(lengths, rows=rows, seq_len=seq_len)
    places = tuple((0, r, o, s) for s, (r, o) in enumerate(placements))
    return Layout(1, rows, max(len(placements), 1), places)
