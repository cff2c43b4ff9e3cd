"""`EngineCore`: the plain-JAX engine for one policy — its params in decode layout on the
actor mesh and the jitted device functions of `rlvr_jax.rollout.core` behind a host API
that validates requests (no TensorFlow, no JetStream)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rlvr_jax import sharding
from rlvr_jax.models import ArchConfig, Model, param_shardings
from rlvr_jax.rollout import core
from rlvr_jax.rollout.core import ChunkOutput, DecodeState, EngineSpec, Prefix, SlotSettings
from rlvr_jax.rollout.kernel import DecodeParams
from rlvr_jax.rollout.sampling import DEFAULT_SAMPLING, UNFILTERED, SamplerMode, SamplingParams


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


class EngineCore:
    """The plain-JAX engine for one policy: params in decode layout on the actor mesh, and
    the jitted prefill / insert / generate over a `DecodeState` (no TensorFlow, no JetStream).

    Args:
      model: the policy (`rlvr_jax.models.Model`).
      max_slots: B, decode slots. max_len: S, positions per slot (prompt + new tokens).
      mesh: the actor mesh (slots and KV cache sharded by `rules`, params replicated);
        None = the first device.
      rules: logical-axis rules (default `sharding.ACTOR_RULES`).
      chunk: decode steps per `generate` call (the host polls between chunks).
      cache_dtype: KV cache dtype (default: the model's compute dtype).
      max_stop_ids: stop token ids a request may carry.
    """

    def __init__(
        self,
        model: Model,
        *,
        max_slots: int,
        max_len: int,
        mesh: Mesh | None = None,
        rules: sharding.Rules | None = None,
        chunk: int = 8,
        cache_dtype: Any = None,
        max_stop_ids: int = 8,
    ):
        if chunk < 1:
            raise ValueError(f"chunk (decode steps per call) must be >= 1, got {chunk}")
        compute = jnp.dtype(model.compute_dtype).name
        self.spec = EngineSpec(
            config=model.config,
            max_slots=max_slots,
            max_len=max_len,
            compute_dtype=compute,
            cache_dtype=compute if cache_dtype is None else jnp.dtype(cache_dtype).name,
            max_stop_ids=max_stop_ids,
            mesh=mesh,
            rules=(sharding.ACTOR_RULES if rules is None else rules) if mesh else None,
        )
        self.chunk = chunk
        self.model = model
        self.params = self.prepare(model.params)
        """The model's params in decode layout (what `load_params` hands JetStream)."""

    @property
    def config(self) -> ArchConfig:
        """The policy's architecture."""
        return self.spec.config

    def prepare(self, params: Any) -> DecodeParams:
        """`params` (models layout, on any mesh) moved to the actor devices and re-laid for
        decoding. Device-to-device (`jax.device_put` to the actor shardings); no host copy."""
        if self.spec.mesh is None:
            target = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            params = jax.device_put(params, target)
        else:
            params = sharding.reshard(
                params, param_shardings(self.config, self.spec.mesh, self.spec.rules)
            )
        return core.prepare(params, spec=self.spec)

    def init_decode_state(self) -> DecodeState:
        """All slots empty."""
        return core.init_state(spec=self.spec)

    def check_request(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        """Raises `RequestError` unless `prompt` (token ids) with `max_new_tokens` new
        tokens fits in a slot. Called when a request is queued, so a bad request fails its
        caller, never the thread that drives the engine."""
        self._check_prompt(np.asarray(prompt, dtype=np.int64).reshape(-1))
        if max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if len(prompt) + max_new_tokens > self.spec.max_len:
            raise RequestError(
                f"prompt of {len(prompt)} tokens + max_new_tokens={max_new_tokens} exceeds "
                f"the engine's max_len={self.spec.max_len} positions per slot"
            )

    def _check_prompt(self, tokens_T: np.ndarray) -> None:
        vocab = self.config.vocab_size
        if tokens_T.size < 1:
            raise RequestError("empty prompt: a request needs at least one prompt token")
        if tokens_T.size > self.spec.max_len - 1:
            raise RequestError(
                f"prompt of {tokens_T.size} tokens: at most {self.spec.max_len - 1} fit "
                f"(max_len={self.spec.max_len})"
            )
        if tokens_T.min() < 0 or tokens_T.max() >= vocab:
            raise RequestError(
                f"prompt token ids must be in [0, {vocab}), got {tokens_T.min()}..{tokens_T.max()}"
            )

    def prefill(self, dp: DecodeParams, tokens: Sequence[int]) -> Prefix:
        """Prefills all but the last token of `tokens` (padded to a length bucket)."""
        tokens_np = np.asarray(tokens, dtype=np.int64).reshape(-1)
        self._check_prompt(tokens_np)
        length = tokens_np.size - 1
        padded_T = np.zeros((self.spec.bucket(length),), np.int32)
        padded_T[:length] = tokens_np[:-1]
        return core.prefill(dp, padded_T, np.int32(length), np.int32(tokens_np[-1]), spec=self.spec)

    def settings(self, slots: Sequence[int], requests: Sequence[SlotRequest]) -> SlotSettings:
        """Host arrays of the per-slot settings of one insert (validated)."""
        b, e = self.spec.max_slots, self.spec.max_stop_ids
        if len(slots) != len(requests) or not 0 < len(slots) <= b:
            raise ValueError(f"insert needs 1..{b} slots with one request each")
        if len(set(slots)) != len(slots) or not all(0 <= s < b for s in slots):
            raise ValueError(f"slots must be distinct in [0, {b}), got {list(slots)}")
        arrays = {
            "slots_B": np.full((b,), b, np.int32),
            "seed_B": np.zeros((b,), np.uint32),
            "sample_B": np.zeros((b,), np.int32),
            "max_new_B": np.zeros((b,), np.int32),
            "temperature_B": np.ones((b,), np.float32),
            "top_k_B": np.zeros((b,), np.int32),
            "top_p_B": np.ones((b,), np.float32),
            "stop_ids_BxE": np.full((b, e), -1, np.int32),
        }
        for i, (slot, r) in enumerate(zip(slots, requests)):
            if not 0 <= r.seed < 2**32:
                raise RequestError(f"seed must be in [0, 2**32), got {r.seed}")
            if any(not 0 <= t < self.config.vocab_size for t in r.stop_token_ids):
                raise RequestError(
                    f"stop token ids must be in [0, {self.config.vocab_size}), "
                    f"got {list(r.stop_token_ids)}"
                )
            if len(r.stop_token_ids) > e:
                raise RequestError(
                    f"{len(r.stop_token_ids)} stop token ids; this engine takes at most {e} "
                    "(EngineCore(max_stop_ids=...))"
                )
            arrays["slots_B"][i] = slot
            arrays["seed_B"][i] = r.seed
            arrays["sample_B"][i] = r.sample_index
            arrays["max_new_B"][i] = r.max_new_tokens
            arrays["temperature_B"][i] = r.sampling.temperature
            arrays["top_k_B"][i] = r.sampling.top_k
            arrays["top_p_B"][i] = r.sampling.top_p
            arrays["stop_ids_BxE"][i, : len(r.stop_token_ids)] = r.stop_token_ids
        return SlotSettings(**arrays)

    def insert(
        self,
        prefix: Prefix,
        state: DecodeState,
        slots: Sequence[int],
        requests: Sequence[SlotRequest],
    ) -> DecodeState:
        """`state` (donated) with `prefix` copied into each of `slots`, which start
        generating for the matching `requests`."""
        settings = self.settings(slots, requests)
        return core.insert(state, prefix, settings, np.int32(len(slots)), spec=self.spec)

    def generate(
        self,
        dp: DecodeParams,
        state: DecodeState,
        *,
        mode: SamplerMode = UNFILTERED,
        n_steps: int | None = None,
        exit_after: int | None = None,
    ) -> tuple[DecodeState, ChunkOutput]:
        """Up to `n_steps` (default `chunk`) decode steps of every live slot; stops early when
        no slot is live or `exit_after` slots have finished in this call. `state` is donated."""
        n_steps = self.chunk if n_steps is None else n_steps
        exit_after = self.spec.max_slots + 1 if exit_after is None else exit_after
        return core.generate(
            dp, state, np.int32(exit_after), spec=self.spec, n_steps=n_steps, mode=mode
        )


def make_engine_core(model: Model, *, max_slots: int, max_len: int, **kwargs: Any) -> EngineCore:
    """The plain-JAX engine (see `EngineCore` for the keyword arguments)."""
    return EngineCore(model, max_slots=max_slots, max_len=max_len, **kwargs)
