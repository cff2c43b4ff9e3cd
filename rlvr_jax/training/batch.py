"""The learner's typed batches and the collation that lays sequences (prompt + completion or
response) out in them, over a `packing.Layout`.

Rows hold S tokens; the arrays live on the shifted grid of T = S − 1: `input_ids[t] = row[t]`,
`target_ids[t] = row[t+1]`, `mask[t] = 1` where `target_ids[t]` is a trained token (the stop
token included). `segment_ids` number a row's sequences from 1 (0 = padding) and `positions`
restart at 0 for each, so tokens attend within their own sequence. Unused rows are all padding
and all-masked: nothing in the loss or its denominator.

Letters: B rows, T positions (S − 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import flax.struct
import jax
import numpy as np

from rlvr_jax.training.packing import (
    Layout,
    in_order,
    one_per_row,
    pack_alike,
    pack_examples,
    pack_groups,
    pack_groups_row_counts,
    pack_tokens,
)

__all__ = [
    "RLBatch",
    "Sample",
    "TokenBatch",
    "bucket_length",
    "collate",
    "collate_packed",
    "collate_sft",
    "collate_shared",
    "mini_batch",
    "pack_examples",
    "sequence_view",
    "take_rows",
]


@flax.struct.dataclass
class TokenBatch:
    """What every learner step reads: tokens, their targets and layout, and the loss mask."""

    input_ids_BxT: Any
    target_ids_BxT: Any
    positions_BxT: Any
    segment_ids_BxT: Any
    mask_BxT: Any
    """float32: 1 where `target_ids_BxT` is trained on."""
    n_micro: int = flax.struct.field(pytree_node=False, default=0)
    """Micro-batches the rows are laid out for (token-budget packing); 0 = any split."""
    branches: int = flax.struct.field(pytree_node=False, default=1)
    """1, or M > 1 for shared-prompt rows (`collate_shared`: segment id = group · M + branch,
    branch 0 the prompt; `models.layers.same_segment`)."""

    @property
    def rows(self) -> int:
        return int(self.mask_BxT.shape[0])

    @property
    def length(self) -> int:
        return int(self.mask_BxT.shape[1])


@flax.struct.dataclass
class RLBatch:
    """A policy-gradient batch: the packed rows the model reads (`tokens`, R rows) and the
    per-completion arrays the loss reads as if each completion had a row of its own (B slots,
    exactly an unpacked batch's), so every aggregation, TIS and KL mode keeps its per-sequence
    meaning and global denominator however the rows are packed."""

    tokens: TokenBatch
    """The model's input, [R, T] (several completions per row when packed)."""
    gather_BxT: Any
    """int32 [B, T]: where completion b's position t sits in the packed rows (r·T + t' over
    the whole batch; `sequence_view` takes it modulo a mini- or micro-batch's positions)."""
    mask_BxT: Any = None
    """1.0 on completion b's trained tokens (the stop token included)."""
    sampler_logp_BxT: Any = None
    """The rollout engine's log-prob of each target token (0 off the completions)."""
    advantages_B: Any = None
    """One advantage per completion slot; 0 on empty slots."""
    old_logp_BxT: Any = None
    """log π_θold(target) recomputed by the learner; None: the step uses stop_gradient(logp)."""
    ref_logp_BxT: Any = None
    """log π_ref(target) under the frozen reference policy (KL on); None otherwise."""
    rewards_BxT: Any = None
    """PPO: completion b's reward at its last token, 0 elsewhere; None otherwise."""
    values_BxT: Any = None
    """PPO: the critic's V(s_t) before the first update (the value clipping's anchor)."""
    advantages_BxT: Any = None
    """PPO: per-token GAE advantages (used instead of `advantages_B`); None otherwise."""
    returns_BxT: Any = None
    """PPO: the critic's regression targets (GAE advantages + values); None otherwise."""
    lag_BxT: Any = None
    """int32 per completion token: policy versions between the learner's params and the oldest
    that computed the token's context (`groups.token_lag`); 0 feeds `mismatch/*`, > 0
    `lag/kl`; None = unknown (no such metrics)."""
    targets_BxT: Any = None
    """Shared-prompt rows (`collate_shared`): completion slot b's next token at each position
    (its own, where the row continues with another completion); None: the rows' targets."""

    @property
    def n_micro(self) -> int:
        return self.tokens.n_micro


def sequence_view(x_RxT: Any, gather_BxT: Any) -> Any:
    """Per-token values of packed rows [R, T, ...] as completion slots [B, T, ...]; indices are
    taken modulo R·T, so a mini- or micro-batch (equal splits of the rows) reads its own."""
    R, T = x_RxT.shape[:2]
    flat = x_RxT.reshape(R * T, *x_RxT.shape[2:])
    return flat[gather_BxT % (R * T)]


@dataclass(frozen=True)
class Sample:
    """One completion ready for the learner."""

    prompt_tokens: Sequence[int]
    tokens: Sequence[int]
    sampler_logp: Sequence[float]
    advantage: float
    train: bool = True
    """False masks the completion out of the loss (overlong filtering)."""
    reward: float = 0.0
    """The completion's reward (placed at its last token in `RLBatch.rewards_BxT`)."""
    sampled: Sequence[bool] | None = None
    """Per completion token: False masks it out (tokens budget forcing inserted); None: all in."""
    lag: Sequence[int] | None = None
    """Per completion token: its `RLBatch.lag_BxT` (`groups.token_lag`); None = unknown."""

    def token_mask(self) -> np.ndarray:
        """float32 [len(tokens)]: 1 on the tokens trained on."""
        if not self.train:
            return np.zeros((len(self.tokens),), np.float32)
        if self.sampled is None:
            return np.ones((len(self.tokens),), np.float32)
        return np.asarray(self.sampled, np.float32)


def take_rows(batch: Any, start: int, stop: int) -> Any:
    """Rows [start, stop) of every array of a batch pytree."""
    return jax.tree.map(lambda x: x[start:stop], batch)


def mini_batch(batch: Any, u: int, updates: int) -> Any:
    """Part u of `updates` equal parts along every leading axis (and of its `n_micro`)."""

    def part(x: Any) -> Any:
        n = x.shape[0] // updates
        return x[u * n : (u + 1) * n]

    out = jax.tree.map(part, batch)
    tokens = out.tokens if isinstance(out, RLBatch) else out
    if tokens.n_micro:
        tokens = tokens.replace(n_micro=tokens.n_micro // updates)
        out = out.replace(tokens=tokens) if isinstance(out, RLBatch) else tokens
    return out


def bucket_length(longest: int, *, full: int, min_len: int, multiple: int = 1) -> int:
    """Learner positions T for a batch whose longest sequence has `longest` tokens: the
    smallest min_len·2^k ≥ `longest`, rounded up to `multiple`, capped at `full` (also the
    length when `min_len` is 0): a handful of compiled shapes."""
    if longest > full:
        raise ValueError(f"bucket_length: a row of {longest} tokens exceeds the full length {full}")
    if min_len <= 0:
        return full
    bucket = min_len
    while bucket < longest:
        bucket *= 2
    bucket = -(-bucket // multiple) * multiple
    return min(bucket, full)


def _lay_out(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    trained: Sequence[Any],
    layout: Layout,
    *,
    seq_len: int,
    pad_id: int,
) -> TokenBatch:
    """The rows of `layout`; `trained[i]` masks response i (a bool, or one float per token)."""
    rows = layout.rows
    ids_BxS = np.full((rows, seq_len), pad_id, np.int32)
    seg_BxS = np.zeros((rows, seq_len), np.int32)
    pos_BxS = np.broadcast_to(np.arange(seq_len, dtype=np.int32), (rows, seq_len)).copy()
    mask_BxT = np.zeros((rows, seq_len - 1), np.float32)
    for i, (p, r, train) in enumerate(zip(prompts, responses, trained)):
        row, start = layout.row(i), layout.places[i][2]
        n_p, end = len(p), start + len(p) + len(r)
        ids_BxS[row, start : start + n_p] = p
        ids_BxS[row, start + n_p : end] = r
        seg_BxS[row, start:end] = seg_BxS[row, :start].max(initial=0) + 1
        pos_BxS[row, start:end] -= start
        # response token j sits at row index start + n_p + j, i.e. shifted index one less
        mask_BxT[row, start + n_p - 1 : end - 1] = train
    return TokenBatch(
        input_ids_BxT=ids_BxS[:, :-1],
        target_ids_BxT=ids_BxS[:, 1:],
        positions_BxT=pos_BxS[:, :-1],
        segment_ids_BxT=seg_BxS[:, :-1],
        mask_BxT=mask_BxT,
        n_micro=layout.n_micro if layout.packed else 0,
    )


def collate(
    samples: Sequence[Sample],
    *,
    rows: int,
    seq_len: int,
    pad_id: int,
    layout: Layout | None = None,
) -> RLBatch:
    """The RL batch of `samples` (numpy): rows by `layout` (default `one_per_row` in `rows`
    rows) and the per-completion arrays [slots, seq_len − 1]. Raises ValueError naming the
    sample when its prompt is empty, its per-token lists do not match its tokens, or it does
    not fit."""
    for i, s in enumerate(samples):
        if len(s.prompt_tokens) == 0:
            raise ValueError(f"collate: sample {i} has an empty prompt")
        if len(s.sampler_logp) != len(s.tokens):
            raise ValueError(
                f"collate: sample {i}: {len(s.sampler_logp)} log-probs for {len(s.tokens)} tokens"
            )
        for name, what in (("sampled", "sampled flags"), ("lag", "lag values")):
            flags = getattr(s, name)
            if flags is not None and len(flags) != len(s.tokens):
                raise ValueError(
                    f"collate: sample {i}: {len(flags)} {what} for {len(s.tokens)} tokens"
                )
        if len(s.prompt_tokens) + len(s.tokens) > seq_len:
            raise ValueError(
                f"collate: sample {i} has {len(s.prompt_tokens)} prompt + {len(s.tokens)} "
                f"completion tokens > {seq_len}"
            )
    if layout is None:
        layout = one_per_row(len(samples), rows, "samples")
    tokens = _lay_out(
        [s.prompt_tokens for s in samples],
        [s.tokens for s in samples],
        [s.token_mask() for s in samples],
        layout,
        seq_len=seq_len,
        pad_id=pad_id,
    )
    T = seq_len - 1
    batch = _completion_arrays(samples, tokens, layout.slots, T)
    arange_T = np.arange(T, dtype=np.int32)
    for i, s in enumerate(samples):
        b, row, offset = layout.slot(i), layout.row(i), layout.places[i][2]
        n = len(s.prompt_tokens) + len(s.tokens) - 1  # its positions on the shifted grid
        batch.gather_BxT[b, :n] = row * T + offset + arange_T[:n]
        _place_completion(batch, b, len(s.prompt_tokens) - 1, s)
    return batch


def _completion_arrays(
    samples: Sequence[Sample], tokens: TokenBatch, B: int, T: int, *, targets: bool = False
) -> RLBatch:
    """An `RLBatch` over `tokens` with zero per-completion arrays [B, T]."""
    lag = any(s.lag is not None for s in samples)
    return RLBatch(
        tokens=tokens,
        gather_BxT=np.zeros((B, T), np.int32),
        mask_BxT=np.zeros((B, T), np.float32),
        sampler_logp_BxT=np.zeros((B, T), np.float32),
        advantages_B=np.zeros((B,), np.float32),
        rewards_BxT=np.zeros((B, T), np.float32),
        targets_BxT=np.zeros((B, T), np.int32) if targets else None,
        lag_BxT=np.zeros((B, T), np.int32) if lag else None,
    )


def _place_completion(batch: RLBatch, b: int, first: int, s: Sample) -> None:
    """Writes sample `s` into slot `b` of the per-completion arrays, its tokens from `first`."""
    end = first + len(s.tokens)
    batch.mask_BxT[b, first:end] = s.token_mask()
    batch.sampler_logp_BxT[b, first:end] = s.sampler_logp
    if batch.lag_BxT is not None:  # a sample without versions counts as lagging
        batch.lag_BxT[b, first:end] = 1 if s.lag is None else s.lag
    if s.tokens:
        batch.rewards_BxT[b, end - 1] = s.reward
    batch.advantages_B[b] = s.advantage


def collate_packed(
    samples: Sequence[Sample],
    *,
    rows: int,
    seq_len: int,
    pad_id: int,
    max_tokens: int,
    updates: int = 1,
    row_multiple: int = 1,
) -> tuple[RLBatch, np.ndarray]:
    """`collate` packed to `max_tokens` per micro-batch (`packing.pack_tokens`), separately for
    each of `updates` mini-batches of `rows // updates` samples, all one shape. Returns the
    batch and each sample's completion slot."""
    mini = rows // updates
    parts = [samples[u * mini : (u + 1) * mini] for u in range(updates)]
    lengths = [[len(s.prompt_tokens) + len(s.tokens) for s in part] for part in parts]
    layouts = pack_alike(lengths, row_len=seq_len, max_tokens=max_tokens, row_multiple=row_multiple)
    batches = [
        collate(part, rows=0, seq_len=seq_len, pad_id=pad_id, layout=layout)
        for part, layout in zip(parts, layouts)
    ]
    full = jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *batches)
    full = full.replace(tokens=full.tokens.replace(n_micro=layouts[0].n_micro * updates))
    slots = [u * layouts[u].slots + layouts[u].slot(i) for u in range(updates) for i in
             range(len(parts[u]))]  # fmt: skip
    return full, np.asarray(slots, np.int64)


def packed_row_counts(
    rows: int, *, group_size: int, updates: int = 1, row_multiple: int = 1
) -> tuple[int, ...]:
    """Every row count `collate_shared(..., pack=True)` may lay `rows` completions out in."""
    cap = rows // group_size // updates  # groups (packed: rows) of a mini-batch at most
    return tuple(c * updates for c in pack_groups_row_counts(cap, row_multiple))


def collate_shared(
    samples: Sequence[Sample],
    *,
    group_size: int,
    rows: int,
    row_len: int,
    pad_id: int,
    max_tokens: int = 0,
    updates: int = 1,
    row_multiple: int = 1,
    slot_len: int,
    pack: bool = False,
) -> tuple[RLBatch, np.ndarray]:
    """The RL batch of `samples` (groups of `group_size` consecutive samples with one prompt)
    with each group's prompt laid out once, then its G completions. Rows of `row_len`: one per
    group (`max_tokens` = 0), or with `pack` (a step of one micro-batch) the fewest rows, a
    group split over rows after copies of its prompt where that saves one
    (`packing.pack_groups`), or packed to `max_tokens` per micro-batch; separately for each of
    `updates` mini-batches, all the same shape. Completion j is branch j + 1 of its group's
    segment (`TokenBatch.branches` = G + 1): it sees the prompt and itself
    (`models.layers.same_segment`) at the positions it would have alone.

    The per-completion arrays [slots, `slot_len`] hold each completion's own tokens only (the
    loss never reads prompt positions, so the LM head runs over completions alone):
    `gather_BxT` points at the row position whose prefix predicts token t (the prompt's last
    for t = 0), `targets_BxT` carries the tokens. Returns the batch and each sample's slot.
    """
    g = group_size
    if len(samples) % (g * updates) or rows % (g * updates) or len(samples) > rows:
        raise ValueError(
            f"collate_shared: {len(samples)} samples (of {rows}) are not whole groups of {g} "
            f"in each of {updates} mini-batches"
        )
    groups = [samples[i : i + g] for i in range(0, len(samples), g)]
    for i, grp in enumerate(groups):
        if any(list(s.prompt_tokens) != list(grp[0].prompt_tokens) for s in grp):
            raise ValueError(f"collate_shared: group {i} does not share one prompt")
    lengths = [len(grp[0].prompt_tokens) + sum(len(s.tokens) for s in grp) for grp in groups]
    for i, n in enumerate(lengths):
        if n > row_len:
            raise ValueError(f"collate_shared: group {i} has {n} tokens > a row of {row_len}")
    per = len(groups) // updates
    parts = [range(u * per, (u + 1) * per) for u in range(updates)]
    layouts = []
    if pack and not max_tokens:  # (group k of the part, row, offset, completions, its slot)
        cap = rows // g // updates
        packed = [
            pack_groups(
                [(len(groups[i][0].prompt_tokens), [len(x.tokens) for x in groups[i]])
                 for i in part],
                row_len=row_len, rows=cap, row_multiple=row_multiple,
            )
            for part in parts
        ]  # fmt: skip
        rows_u, slots_u = max(n for n, _ in packed), cap * g
        pieces = [[(k, r, o, js, k) for k, r, o, js in pc] for _, pc in packed]
    else:
        if max_tokens:
            layouts = pack_alike(
                [[lengths[i] for i in part] for part in parts],
                what="group",
                row_len=row_len,
                max_tokens=max_tokens,
                row_multiple=row_multiple,
            )
        else:
            layouts = [one_per_row(per, rows // g // updates, "groups") for _ in parts]
        rows_u, slots_u = layouts[0].rows, layouts[0].slots * g
        pieces = [
            [(k, lay.row(k), lay.places[k][2], list(range(g)), lay.slot(k)) for k in range(per)]
            for lay in layouts
        ]
    R, B, T, M = rows_u * updates, slots_u * updates, slot_len, g + 1
    ids = np.full((R, row_len), pad_id, np.int32)
    seg = np.zeros((R, row_len), np.int32)
    pos = np.zeros((R, row_len), np.int32)
    tokens = TokenBatch(
        input_ids_BxT=ids,
        target_ids_BxT=np.zeros_like(ids),  # per slot: `targets_BxT`
        positions_BxT=pos,
        segment_ids_BxT=seg,
        mask_BxT=np.zeros((R, row_len), np.float32),
        n_micro=layouts[0].n_micro * updates if max_tokens else 0,
        branches=M,
    )
    batch = _completion_arrays(samples, tokens, B, T, targets=True)
    slots = np.zeros((len(samples),), np.int64)
    for u, (part, part_pieces) in enumerate(zip(parts, pieces)):
        for k, r, start, js, group_slot in part_pieces:
            i = part[k]
            grp, prompt = groups[i], list(groups[i][0].prompt_tokens)
            row, n_p = u * rows_u + r, len(prompt)
            group_id = 1 + int((seg[row] // M).max(initial=0))
            at = start + n_p
            ids[row, start:at], seg[row, start:at] = prompt, group_id * M
            pos[row, start:at] = np.arange(n_p)
            for j in js:
                s, b = grp[j], u * slots_u + group_slot * g + j
                n_c = len(s.tokens)
                ids[row, at : at + n_c], seg[row, at : at + n_c] = s.tokens, group_id * M + j + 1
                pos[row, at : at + n_c] = n_p + np.arange(n_c)
                if n_c > T:
                    raise ValueError(f"collate_shared: sample {i * g + j} has {n_c} > {T} tokens")
                base = row * row_len  # global: any equal split of the rows (`sequence_view`)
                sources = [start + n_p - 1, *range(at, at + n_c - 1)][:n_c]
                batch.gather_BxT[b, :n_c] = base + np.asarray(sources, np.int32)
                batch.targets_BxT[b, :n_c] = s.tokens
                _place_completion(batch, b, 0, s)
                slots[i * g + j] = b
                at += n_c
    return batch, slots


def collate_sft(
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    *,
    rows: int,
    seq_len: int,
    pad_id: int,
    pack: bool = False,
    max_tokens: int = 0,
    row_multiple: int = 1,
) -> TokenBatch:
    """The SFT batch of prompt/response pairs, each array [rows, seq_len − 1]: one example per
    row; with `pack`, sharing rows in order (`packing.pack_examples`); with `max_tokens`
    (`train.max_tokens_per_micro_batch`), packed to that budget per micro-batch by
    `packing.pack_tokens`, rows a multiple of `row_multiple`, the batch carrying its
    micro-batch count.

    Raises ValueError naming the example when a prompt or response is empty, the lists differ
    in length, or the examples do not fit.
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
    if max_tokens:
        layout = pack_tokens(
            lengths, row_len=seq_len, max_tokens=max_tokens, row_multiple=row_multiple,
            what="SFT example",
        )  # fmt: skip
    elif pack:
        layout = in_order(lengths, rows=rows, seq_len=seq_len)
        if len(layout.places) < len(lengths):
            raise ValueError(
                f"collate_sft: {len(lengths)} examples do not fit packed into {rows} rows"
            )
    else:
        layout = one_per_row(len(lengths), rows, "examples")
    return _lay_out(
        prompt_ids_list, response_ids_list, [True] * len(lengths), layout,
        seq_len=seq_len, pad_id=pad_id,
    )  # fmt: skip


def vars_of(batch: TokenBatch) -> dict[str, Any]:
    """The array fields of `batch` as keyword arguments (to rebuild a `TokenBatch`)."""
    return {
        "input_ids_BxT": batch.input_ids_BxT,
        "target_ids_BxT": batch.target_ids_BxT,
        "positions_BxT": batch.positions_BxT,
        "segment_ids_BxT": batch.segment_ids_BxT,
        "mask_BxT": batch.mask_BxT,
    }
