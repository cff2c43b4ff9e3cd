"""The learner's typed batches and the one collation that lays sequences out in them.

A sequence is a prompt followed by a completion (RL) or a response (SFT). Rows hold S tokens
before the shift; the learner predicts token t+1 from positions ≤ t, so the arrays live on the
shifted grid of T = S − 1: `input_ids[t] = row[t]`, `target_ids[t] = row[t+1]`; `mask[t] = 1`
where `target_ids[t]` is a trained completion/response token (the stop token included).
`segment_ids` number the sequences of a row from 1 (0 = padding) and `positions` restart at 0
for each, so tokens attend only within their own sequence. Rows beyond the real ones (an
under-filled batch) are all padding and all-masked: they contribute nothing to the loss or to
its denominator.

`collate` (RL samples → `RLBatch`) and `collate_sft` (prompt/response pairs → `TokenBatch`)
share one layout function; `pack` places several sequences on one row.

Letters: B rows, T positions (S − 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import flax.struct
import jax
import numpy as np


@flax.struct.dataclass
class TokenBatch:
    """What every learner step reads: tokens, their targets and layout, and the loss mask."""

    input_ids_BxT: Any
    target_ids_BxT: Any
    positions_BxT: Any
    segment_ids_BxT: Any
    mask_BxT: Any
    """1.0 where `target_ids_BxT` is trained on (float32)."""

    @property
    def rows(self) -> int:
        return int(self.mask_BxT.shape[0])

    @property
    def length(self) -> int:
        return int(self.mask_BxT.shape[1])


@flax.struct.dataclass
class RLBatch(TokenBatch):
    """A policy-gradient batch: `TokenBatch` plus the sampler's log-probs and advantages, and
    the learner-side log-probs a step may need before its first update (None when unused)."""

    sampler_logp_BxT: Any = None
    """The rollout engine's log-prob of each target token (0 off the completions)."""
    advantages_B: Any = None
    """One advantage per row (its completion's); 0 on padding rows."""
    old_logp_BxT: Any = None
    """log π_θold(target) recomputed by the learner (several updates per batch, TIS mask
    mode, reward-KL); None: the step uses stop_gradient(logp)."""
    ref_logp_BxT: Any = None
    """log π_ref(target) under the frozen reference policy (KL on); None otherwise."""


@dataclass(frozen=True)
class Sample:
    """One completion ready for the learner."""

    prompt_tokens: Sequence[int]
    tokens: Sequence[int]
    sampler_logp: Sequence[float]
    advantage: float
    train: bool = True
    """False masks the completion out of the loss (overlong filtering)."""


def take_rows(batch: Any, start: int, stop: int) -> Any:
    """Rows [start, stop) of every array of a batch pytree."""
    return jax.tree.map(lambda x: x[start:stop], batch)


def bucket_length(longest: int, *, full: int, min_len: int, multiple: int = 1) -> int:
    """Learner positions T for a batch whose longest prompt + completion has `longest` tokens:
    the smallest min_len·2^k ≥ `longest`, rounded up to `multiple`, capped at `full` (the
    fixed length, also used when `min_len` is 0). A handful of shapes, so a handful of
    compiles, instead of always paying for the longest possible row."""
    if longest > full:
        raise ValueError(f"bucket_length: a row of {longest} tokens exceeds the full length {full}")
    if min_len <= 0:
        return full
    bucket = min_len
    while bucket < longest:
        bucket *= 2
    bucket = -(-bucket // multiple) * multiple
    return min(bucket, full)


def pack_examples(lengths: Sequence[int], *, rows: int, seq_len: int) -> list[tuple[int, int]]:
    """(row, offset) of each example of the longest prefix of `lengths` that fits `rows` rows
    of `seq_len` tokens, filling rows in order: an example goes after the previous one when it
    fits there, else at the start of the next row. Raises ValueError for an example longer than
    `seq_len` or shorter than 2 tokens (nothing to predict)."""
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


def _place(
    what: str, lengths: Sequence[int], *, rows: int, seq_len: int, pack: bool
) -> list[tuple[int, int]]:
    """(row, offset) of every sequence: packed, or one per row. `what` ("collate: sample",
    "collate_sft: example") names a sequence in errors; too-long ones are checked by callers."""
    if pack:
        placements = pack_examples(lengths, rows=rows, seq_len=seq_len)
    else:
        placements = [(i, 0) for i in range(min(len(lengths), rows))]
    if len(placements) < len(lengths):
        how = "packed into" if pack else "one per row in"
        where, noun = what.split(": ")
        raise ValueError(f"{where}: {len(lengths)} {noun}s do not fit {how} {rows} rows")
    return placements


def _lay_out(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    trained: Sequence[bool],
    placements: Sequence[tuple[int, int]],
    *,
    rows: int,
    seq_len: int,
    pad_id: int,
) -> TokenBatch:
    ids_BxS = np.full((rows, seq_len), pad_id, np.int32)
    seg_BxS = np.zeros((rows, seq_len), np.int32)
    pos_BxS = np.broadcast_to(np.arange(seq_len, dtype=np.int32), (rows, seq_len)).copy()
    mask_BxT = np.zeros((rows, seq_len - 1), np.float32)
    for (row, start), p, r, train in zip(placements, prompts, responses, trained):
        n_p, end = len(p), start + len(p) + len(r)
        ids_BxS[row, start : start + n_p] = p
        ids_BxS[row, start + n_p : end] = r
        seg_BxS[row, start:end] = seg_BxS[row, :start].max(initial=0) + 1
        pos_BxS[row, start:end] -= start
        # response token j sits at row index start + n_p + j, i.e. shifted index one less
        if train:
            mask_BxT[row, start + n_p - 1 : end - 1] = 1.0
    return TokenBatch(
        input_ids_BxT=ids_BxS[:, :-1],
        target_ids_BxT=ids_BxS[:, 1:],
        positions_BxT=pos_BxS[:, :-1],
        segment_ids_BxT=seg_BxS[:, :-1],
        mask_BxT=mask_BxT,
    )


def collate(
    samples: Sequence[Sample], *, rows: int, seq_len: int, pad_id: int, pack: bool = False
) -> RLBatch:
    """The RL batch of `samples` (numpy arrays [rows, seq_len − 1], advantages [rows]).

    Raises ValueError naming the sample when its prompt is empty, its log-probs do not match
    its tokens, or the samples do not fit."""
    for i, s in enumerate(samples):
        if len(s.prompt_tokens) == 0:
            raise ValueError(f"collate: sample {i} has an empty prompt")
        if len(s.sampler_logp) != len(s.tokens):
            raise ValueError(
                f"collate: sample {i}: {len(s.sampler_logp)} log-probs for {len(s.tokens)} tokens"
            )
        if not pack and len(s.prompt_tokens) + len(s.tokens) > seq_len:
            raise ValueError(
                f"collate: sample {i} has {len(s.prompt_tokens)} prompt + {len(s.tokens)} "
                f"completion tokens > {seq_len}"
            )
    lengths = [len(s.prompt_tokens) + len(s.tokens) for s in samples]
    placements = _place("collate: sample", lengths, rows=rows, seq_len=seq_len, pack=pack)
    tokens = _lay_out(
        [s.prompt_tokens for s in samples],
        [s.tokens for s in samples],
        [s.train and len(s.tokens) > 0 for s in samples],
        placements,
        rows=rows,
        seq_len=seq_len,
        pad_id=pad_id,
    )
    slogp_BxT = np.zeros((rows, seq_len - 1), np.float32)
    adv_B = np.zeros((rows,), np.float32)
    for (row, start), s in zip(placements, samples):
        first = start + len(s.prompt_tokens) - 1
        slogp_BxT[row, first : first + len(s.tokens)] = s.sampler_logp
        adv_B[row] = s.advantage
    return RLBatch(**vars_of(tokens), sampler_logp_BxT=slogp_BxT, advantages_B=adv_B)


def collate_sft(
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    *,
    rows: int,
    seq_len: int,
    pad_id: int,
    pack: bool = False,
) -> TokenBatch:
    """The SFT batch of prompt/response pairs, each array [rows, seq_len − 1] (one example per
    row, unused rows all padding and masked). With `pack`, examples share rows (see
    `pack_examples`): example k of a row has segment id k + 1 and positions 0, 1, ... from its
    first token.

    Raises ValueError naming the example when a prompt is empty, a response is empty, the lists
    differ in length, or the examples do not fit.
    """
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError(
            f"collate_sft: {len(prompt_ids_list)} prompts but {len(response_ids_list)} responses"
        )
    for i, (p, r) in enumerate(zip(prompt_ids_list, response_ids_list)):
        if len(p) == 0 or len(r) == 0:
            raise ValueError(
                f"collate_sft: example {i} has {len(p)} prompt and {len(r)} response tokens; "
                "both must be non-empty"
            )
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids_list, response_ids_list)]
    too_long = [i for i, n in enumerate(lengths) if n > seq_len]
    if too_long and not pack:
        i = too_long[0]
        raise ValueError(f"collate_sft: example {i} has {lengths[i]} tokens > {seq_len}")
    placements = _place("collate_sft: example", lengths, rows=rows, seq_len=seq_len, pack=pack)
    return _lay_out(
        prompt_ids_list,
        response_ids_list,
        [True] * len(lengths),
        placements,
        rows=rows,
        seq_len=seq_len,
        pad_id=pad_id,
    )


def vars_of(batch: TokenBatch) -> dict[str, Any]:
    """The `TokenBatch` fields of `batch` as keyword arguments (to build a subclass from it)."""
    return {
        "input_ids_BxT": batch.input_ids_BxT,
        "target_ids_BxT": batch.target_ids_BxT,
        "positions_BxT": batch.positions_BxT,
        "segment_ids_BxT": batch.segment_ids_BxT,
        "mask_BxT": batch.mask_BxT,
    }
