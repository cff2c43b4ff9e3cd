"""`algorithm: sft`: supervised fine-tuning on examples with a response; its data, source and
update (the step is `training/sft.py`). Expert iteration and parallel averaging reuse them.

    rlvr-train --config F algorithm=sft        # sft.sources (or data.sources)

Examples are prompt rows whose response is their `sft.response_field` (or, with
`sft.synthetic_reference`, the synthetic task's reference solution), trained on as the policy
writes it after the prompt (`data.formatting.encode_response`). Rows without a response or
over the budgets (`data.max_prompt_len`, `rollout.max_new_tokens`) are skipped and counted at
load. Examples are drawn by the seeded, resumable `PromptIterator`, so a run resumes exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlvr_jax.config.schema import Config, SFTConfig
from rlvr_jax.data import synthetic
from rlvr_jax.data.formatting import encode_response, prompt_encoder, prompt_ids
from rlvr_jax.data.mixture import PromptIterator
from rlvr_jax.data.rows import BadRow, DataError, PromptRow
from rlvr_jax.data.sources import load_sources
from rlvr_jax.training.algorithms.common import (
    Context,
    Update,
    step_micro_batches,
)
from rlvr_jax.training.batch import TokenBatch, collate_sft
from rlvr_jax.training.optimizer import make_optimizer
from rlvr_jax.training.sft import make_sft_step
from rlvr_jax.training.sources import Batch, StaticWeights


def response_reader(
    cfg: SFTConfig,
    *,
    length: Callable[[str], int] | None = None,
    max_tokens: int | None = None,
) -> Callable[[Mapping[str, Any]], str]:
    """`record -> response text` for `rows.row_from_record(..., response=...)`:
    `record[cfg.response_field]`, else (with `cfg.synthetic_reference`) the synthetic reference
    solution. Raises BadRow (the row is skipped and counted) when there is none, or when
    `length(text)` exceeds `max_tokens`."""
    field = cfg.response_field

    def read(record: Mapping[str, Any]) -> str:
        text = record.get(field)
        if text is None and cfg.synthetic_reference:
            try:
                text = synthetic.reference_response(record)
            except (ValueError, KeyError) as e:
                raise BadRow(
                    "no_reference", f"no field {field!r} and no synthetic reference: {e}"
                ) from None
        if text is None:
            raise BadRow(
                "missing_response",
                f"missing field {field!r} (sft.response_field; or set sft.synthetic_reference "
                "for the synthetic tasks)",
            )
        if isinstance(text, str) and length is not None and max_tokens is not None:
            n = length(text)
            if n > max_tokens:
                raise BadRow(
                    "too_long", f"the response is {n} tokens > rollout.max_new_tokens {max_tokens}"
                )
        return text

    return read


def build_sft_iterator(cfg: Config, tokenizer: Any, *, seed: int) -> PromptIterator:
    """The SFT examples of `cfg` in a seeded, resumable mixture. Raises DataError when no
    source is named or one has no usable example (counting the skipped rows by reason)."""
    from rlvr_jax.rewards import known_verifiers

    sources = cfg.sft.sources or cfg.data.sources
    if not sources:
        raise DataError("sft.sources and data.sources are both empty: configure SFT examples")
    template = cfg.data.prompt_template
    read = response_reader(
        cfg.sft,
        length=lambda text: len(encode_response(text, tokenizer, template)),
        max_tokens=cfg.rollout.max_new_tokens,
    )
    loaded = load_sources(
        sources,
        known_verifiers=known_verifiers(),
        encode=prompt_encoder(tokenizer, template),
        max_prompt_len=cfg.data.max_prompt_len,
        response=read,
    )
    return PromptIterator(loaded, seed=seed)


def encode_example(row: PromptRow, tokenizer: Any, template: str) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of an SFT row."""
    if row.response is None:
        raise ValueError(
            f"row {row.index} of source {row.source!r} has no response: it is not an SFT example"
        )
    return prompt_ids(row, tokenizer, template), encode_response(row.response, tokenizer, template)


@dataclass(frozen=True)
class SFTSource(StaticWeights):
    """`algorithm: sft`: `rows` examples per step from the seeded, resumable mixture of
    `sft.sources`, one per row or packed to a token budget per micro-batch (`collate_sft`)."""

    examples: PromptIterator
    """SFT rows (`build_sft_iterator`); its state is what a checkpoint stores."""
    tokenizer: Any
    template: str
    """`data.prompt_template`."""
    rows: int
    """Examples per batch (`sft.batch_size`)."""
    seq_len: int
    """Tokens per row before the shift (the arrays have `seq_len − 1` positions)."""
    pad_id: int
    max_tokens: int = 0
    """`train.max_tokens_per_micro_batch` to pack to (0 = one example per row)."""
    row_multiple: int = 1
    """Devices the rows are split over (packed micro-batches hold a multiple of it)."""

    def next_arrays(self) -> TokenBatch:
        """The next batch (numpy arrays [rows, seq_len − 1])."""
        pairs = [
            encode_example(row, self.tokenizer, self.template)
            for row in self.examples.next_batch(self.rows)
        ]
        return collate_sft(
            [p for p, _ in pairs],
            [r for _, r in pairs],
            rows=self.rows,
            seq_len=self.seq_len,
            pad_id=self.pad_id,
            max_tokens=self.max_tokens,
            row_multiple=self.row_multiple,
        )

    def next(self, policy_version: int) -> Batch:
        del policy_version
        t0 = time.perf_counter()
        arrays = self.next_arrays()
        metrics = {"time/data_s": time.perf_counter() - t0}
        return Batch(arrays, metrics=metrics, tokens=int(arrays.mask_BxT.sum()))

    def state(self) -> dict:
        return {"sft": self.examples.state()}

    def restore(self, state: dict) -> None:
        self.examples.restore(state["sft"])


def sft_batches(ctx: Context, *, seed: int, packed: bool = False) -> SFTSource:
    """The run's SFT examples in batches of `sft.batch_size`, drawn with `seed`."""
    cfg = ctx.cfg
    return SFTSource(
        build_sft_iterator(cfg, ctx.tokenizer, seed=seed),
        ctx.tokenizer,
        cfg.data.prompt_template,
        rows=cfg.sft.batch_size,
        seq_len=ctx.seq_len + 1,
        pad_id=ctx.pad_id,
        max_tokens=cfg.train.max_tokens_per_micro_batch if packed else 0,
        row_multiple=ctx.row_multiple,
    )


def source(ctx: Context, params: Any, version: int) -> SFTSource:
    del params, version
    return sft_batches(ctx, seed=ctx.cfg.data.seed, packed=True)


class SFTUpdate(Update):
    """`repeat` SFT steps on each batch of `rows` rows."""

    def __init__(self, ctx: Context, *, rows: int, repeat: int) -> None:
        cfg = ctx.cfg
        optimizer = make_optimizer(cfg.train)
        n_micro = step_micro_batches(cfg, rows, "SFT batch")
        self.train_step = make_sft_step(
            ctx.model.config, optimizer, compute_dtype=cfg.model.compute_dtype, n_micro=n_micro
        )
        super().__init__(ctx, optimizer)
        self.repeat = repeat

    def step(self, state: Any, inputs: TokenBatch, reference: Any) -> tuple[Any, list[dict]]:
        del reference
        return self.steps(state, self.repeat, lambda state, _: self.train_step(state, inputs))


def update(ctx: Context) -> SFTUpdate:
    return SFTUpdate(ctx, rows=ctx.cfg.sft.batch_size, repeat=1)
