"""Rollout groups → learner arrays of a few fixed shapes (one compile per length bucket).

A row is prompt + completion, right-padded to S (at most max_prompt_len + max_new_tokens + 1;
the trainer picks S per batch with `bucket_length`). The learner predicts token t+1 from
positions ≤ t, so the arrays live on the shifted grid of T = S − 1: `input_ids[t] = row[t]`,
`target_ids[t] = row[t+1]`; `mask[t] = 1` where `target_ids[t]` is a completion token (the stop
token included: it is trained on); `sampler_logp[t]` is the engine's log-prob of
`target_ids[t]`. Rows beyond the real ones (an under-filled batch) are all-masked and contribute
nothing to the loss or its denominator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sample:
    """One completion ready for the learner."""

    prompt_tokens: Sequence[int]
    tokens: Sequence[int]
    sampler_logp: Sequence[float]
    advantage: float
    train: bool = True
    """False masks the completion out of the loss (overlong filtering)."""


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


def collate(
    samples: Sequence[Sample],
    *,
    rows: int,
    seq_len: int,
    pad_id: int,
) -> dict[str, np.ndarray]:
    """Builds the learner batch: `input_ids`, `target_ids`, `positions`, `segment_ids`, `mask`,
    `sampler_logp` ([rows, seq_len − 1]) and `advantages` ([rows])."""
    if len(samples) > rows:
        raise ValueError(f"collate: {len(samples)} samples do not fit in {rows} rows")
    T = seq_len - 1
    ids_BxS = np.full((rows, seq_len), pad_id, np.int32)
    seg_BxS = np.zeros((rows, seq_len), np.int32)
    mask_BxT = np.zeros((rows, T), np.float32)
    slogp_BxT = np.zeros((rows, T), np.float32)
    adv_B = np.zeros((rows,), np.float32)
    for i, s in enumerate(samples):
        n_p, n_c = len(s.prompt_tokens), len(s.tokens)
        if n_p == 0:
            raise ValueError(f"collate: sample {i} has an empty prompt")
        if n_p + n_c > seq_len:
            raise ValueError(
                f"collate: sample {i} has {n_p} prompt + {n_c} completion tokens > {seq_len}"
            )
        if len(s.sampler_logp) != n_c:
            raise ValueError(
                f"collate: sample {i}: {len(s.sampler_logp)} log-probs for {n_c} tokens"
            )
        ids_BxS[i, :n_p] = s.prompt_tokens
        ids_BxS[i, n_p : n_p + n_c] = s.tokens
        seg_BxS[i, : n_p + n_c] = 1
        # completion token j sits at row index n_p + j, i.e. shifted index n_p + j - 1
        if s.train and n_c:
            mask_BxT[i, n_p - 1 : n_p - 1 + n_c] = 1.0
        slogp_BxT[i, n_p - 1 : n_p - 1 + n_c] = s.sampler_logp
        adv_B[i] = s.advantage
    positions = np.broadcast_to(np.arange(T, dtype=np.int32), (rows, T))
    return {
        "input_ids": ids_BxS[:, :-1],
        "target_ids": ids_BxS[:, 1:],
        "positions": np.ascontiguousarray(positions),
        "segment_ids": seg_BxS[:, :-1],
        "mask": mask_BxT,
        "sampler_logp": slogp_BxT,
        "advantages": adv_B,
    }
