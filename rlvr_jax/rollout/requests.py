"""What a decode slot is asked to generate, and the error of a request the engine refuses."""

from __future__ import annotations

import dataclasses
from typing import Any

from rlvr_jax.rollout.device.sampling import DEFAULT_SAMPLING, SamplingParams


class RequestError(ValueError):
    """A request the engine cannot serve (too long, bad ids, too many stop tokens...)."""


@dataclasses.dataclass(frozen=True)
class SlotRequest:
    """What one slot generates for (host side; one per sample)."""

    seed: int
    sample_index: int
    max_new_tokens: int
    sampling: SamplingParams = DEFAULT_SAMPLING
    stop_token_ids: tuple[int, ...] = ()
    interrupt: Any = None
    """Budget forcing (an `rlvr_jax.rollout.interrupt.Interrupt`); None = off."""
