"""`EngineCore`: the plain-JAX engine for one policy — its params in decode layout on the
actor mesh and the jitted device functions of `rlvr_jax.rollout.device.decode` / `paged_core` behind
a host API that validates requests (no TensorFlow, no JetStream).

KV memory: `kv_layout="paged"` (default) keeps one pool of pages; its size is a budget of
its own — `kv_pages` (allocatable pages, all shards) or `kv_cache_gib` (per actor device),
by default what `max_slots` contiguous rows of `max_len` would take, so that no request
is ever preempted unless a smaller budget (or more slots) is asked for. The host half
that hands out pages is `rlvr_jax.rollout.host.scheduler`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rlvr_jax import sharding
from rlvr_jax.models import ArchConfig, Model, lora
from rlvr_jax.models.params import tree_shardings
from rlvr_jax.rollout.device import decode as core
from rlvr_jax.rollout.device.decode import (
    ChunkOutput,
    DecodeState,
    EngineSpec,
    Prefix,
    SlotSettings,
)
from rlvr_jax.rollout.device.kernel import DecodeParams
from rlvr_jax.rollout.device.layout import CONTIGUOUS
from rlvr_jax.rollout.device.layout import kv_layout as kv_layout_named
from rlvr_jax.rollout.device.paged import PagedWork
from rlvr_jax.rollout.device.sampling import UNFILTERED, SamplerMode
from rlvr_jax.rollout.engine_paged import PagedOps
from rlvr_jax.rollout.requests import RequestError, SlotRequest


class EngineCore(PagedOps):
    """The plain-JAX engine for one policy: params in decode layout on the actor mesh, and
    the jitted prefill / insert / generate over a `DecodeState` (no TensorFlow, no JetStream).

    Args:
      model: the policy (`rlvr_jax.models.Model`).
      max_slots: B, decode slots. max_len: S, positions per sequence (prompt + new tokens).
      mesh: the actor mesh (params split tensor-parallel by `rules`, slots and KV cache
        over its data axes, KV heads over its tensor axis); None = the first device.
      rules: logical-axis rules (default `sharding.ACTOR_RULES`).
      chunk: decode steps per `generate` call (the host polls between chunks).
      cache_dtype: KV cache dtype (default: the model's compute dtype).
      max_stop_ids: stop token ids a request may carry.
      max_interrupt_ids: inserted token ids a request's budget forcing may carry.
      kv_layout: "paged" (default) or "contiguous" (fixed [S] rows per slot; the baseline).
      page_size: tokens per page. prefill_chunk: tokens per prefill chunk (paged).
      kv_pages / kv_cache_gib: the pool's budget, in allocatable pages (all shards) or in
        GiB per actor device; at most one (default: the contiguous layout's memory).
      attention: decode attention of full layers, "auto" | "xla" | "pallas_tpu" |
        "pallas_gpu" (`paged_attention.select_impl`).
      geometry_tokens: (decode block, decode iteration, prefill block) in tokens (paged;
        default `paged_attention.GEOMETRY_TOKENS`).
      exact: decode every slot every call (`EngineSpec.exact`, `rollout.exact`).
      weight_dtype: storage of the decode matmul weights, "float32" | "bfloat16" | "int8" |
        "fp8" (default: the compute dtype; `kernel.prepare_params`).

    LoRA: given a policy whose params hold adapters (`models.lora`), the engine keeps a copy
    of its base on the actor devices and from then on takes adapters alone (`prepare`), merging
    them into the decode weights.
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
        kv_layout: str = "paged",
        page_size: int = 16,
        kv_pages: int | None = None,
        kv_cache_gib: float | None = None,
        prefill_chunk: int = 512,
        attention: str = "auto",
        geometry_tokens: tuple[int, int, int] | None = None,
        max_interrupt_ids: int = 16,
        exact: bool = False,
        weight_dtype: str | None = None,
    ):
        if chunk < 1:
            raise ValueError(f"chunk (decode steps per call) must be >= 1, got {chunk}")
        compute = jnp.dtype(model.compute_dtype).name
        spec = EngineSpec(
            config=model.config,
            max_slots=max_slots,
            max_len=max_len,
            compute_dtype=compute,
            weight_dtype=weight_dtype or "",
            cache_dtype=compute if cache_dtype is None else jnp.dtype(cache_dtype).name,
            max_stop_ids=max_stop_ids,
            max_interrupt_ids=max_interrupt_ids,
            exact=exact,
            mesh=mesh,
            rules=(sharding.ACTOR_RULES if rules is None else rules) if mesh else None,
            kv_layout=CONTIGUOUS,
        )
        spec = kv_layout_named(kv_layout).configure(
            spec,
            page_size=page_size,
            kv_pages=kv_pages,
            kv_cache_gib=kv_cache_gib,
            prefill_chunk=prefill_chunk,
            attention=attention,
            geometry_tokens=geometry_tokens,
        )
        self.spec = spec
        self.chunk = chunk
        self.model = model
        self.base: Any = None
        """The LoRA base on the actor devices (held from the first adapted params on)."""
        self.params = self.prepare(model.params)
        """The model's params in decode layout (what `load_params` hands JetStream)."""

    @property
    def config(self) -> ArchConfig:
        """The policy's architecture."""
        return self.spec.config

    def prepare(self, params: Any) -> DecodeParams:
        """`params` (models layout, on any mesh) moved to the actor devices and re-laid for
        decoding. Device-to-device (`jax.device_put` to the actor shardings); no host copy.

        LoRA: whole params with adapters leave a copy of their base here (`self.base`); after
        that, `lora.adapters(params)` alone (what a push moves) is merged onto it."""
        if lora.has_adapters(params) and "embedding" in params:
            self.base = self._move(lora.strip(params), copy=True)
            params = lora.adapters(params)
        if "embedding" not in params:
            if self.base is None:
                raise ValueError("adapters without a base: give the engine whole params first")
            params = lora.graft(self.base, self._move(params))
        else:
            params = self._move(params)
        return core.prepare(params, spec=self.spec)

    def _move(self, tree: Any, *, copy: bool = False) -> Any:
        """A params tree (whole or adapters) on the actor devices; `copy`: never aliasing the
        source's buffers (the learner donates its own)."""
        if self.spec.mesh is None:
            target = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            targets = jax.tree.map(lambda _: target, tree)
        else:
            targets = tree_shardings(tree, self.config, self.spec.mesh, self.spec.rules)
        if jax.process_count() == 1:
            return jax.device_put(tree, targets, may_alias=False if copy else None)
        return sharding.reshard(tree, targets)

    def init_decode_state(self) -> DecodeState:
        """All slots empty (committed to the engine's devices, as every later state is)."""
        state = core.init_state(spec=self.spec)
        if self.spec.mesh is None:
            state = jax.device_put(state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
        return state

    @property
    def paged(self) -> bool:
        """Whether the KV cache is the page pool."""
        return self.spec.kv_layout.paged

    @property
    def kv_bytes(self) -> int:
        """Bytes of the KV cache (all layers, K and V, all devices together)."""
        n = int(np.prod(self.spec.kv_layout.kv_shape(self.spec)))
        return 2 * self.config.n_layers * n * jnp.dtype(self.spec.cache_dtype).itemsize

    @property
    def kv_capacity(self) -> int:
        """Tokens the KV cache can hold (the trash pages excluded)."""
        return self.spec.kv_layout.capacity(self.spec)

    def check_request(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        """Raises `RequestError` unless `prompt` (token ids) with `max_new_tokens` new
        tokens fits in a slot (and, paged, in the page pool on its own). Called when a
        request is queued, so a bad request fails its caller, never the thread that drives
        the engine."""
        self._check_prompt(np.asarray(prompt, dtype=np.int64).reshape(-1))
        if max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if len(prompt) + max_new_tokens > self.spec.max_len:
            raise RequestError(
                f"prompt of {len(prompt)} tokens + max_new_tokens={max_new_tokens} exceeds "
                f"the engine's max_len={self.spec.max_len} positions per slot"
            )
        self.spec.kv_layout.check_fits(self.spec, len(prompt), max_new_tokens)

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
            "generated_B": np.zeros((b,), np.int32),
            "budget_B": np.full((b,), -1, np.int32),
            "forced_BxF": np.full((b, self.spec.max_interrupt_ids), -1, np.int32),
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
            if r.interrupt is not None:
                self._set_interrupt(arrays, i, r)
        return SlotSettings(**arrays)

    def _set_interrupt(self, arrays: dict[str, np.ndarray], i: int, r: SlotRequest) -> None:
        """Row `i` of `settings`' arrays for `r`'s budget forcing (or replay)."""
        forced = r.interrupt.tokens
        if len(forced) > self.spec.max_interrupt_ids:
            raise RequestError(
                f"{len(forced)} inserted (or replayed) token ids; this engine takes at most "
                f"{self.spec.max_interrupt_ids} (EngineCore(max_interrupt_ids=...))"
            )
        if any(not 0 <= t < self.config.vocab_size for t in forced):
            raise RequestError(
                f"inserted token ids must be in [0, {self.config.vocab_size}), got {list(forced)}"
            )
        arrays["max_new_B"][i] = r.interrupt.max_new_tokens(r.max_new_tokens)
        arrays["budget_B"][i] = r.interrupt.budget
        arrays["forced_BxF"][i, : len(forced)] = forced

    def insert(
        self,
        prefix: Prefix,
        state: DecodeState,
        slots: Sequence[int],
        requests: Sequence[SlotRequest],
    ) -> DecodeState:
        """`state` (donated) with `prefix` copied into each of `slots`, which start
        generating for the matching `requests`."""
        return self.spec.kv_layout.insert(self, prefix, state, slots, requests)

    def generate(
        self,
        dp: DecodeParams,
        state: DecodeState,
        *,
        mode: SamplerMode = UNFILTERED,
        n_steps: int | None = None,
        exit_after: int | None = None,
        work: PagedWork | None = None,
        rows: int | None = None,
    ) -> tuple[DecodeState, ChunkOutput]:
        """Up to `n_steps` (default `chunk`) decode steps of every live slot; stops early when
        no slot is live or `exit_after` slots have finished in this call. `state` is donated.
        Paged: `work` lists the pages each live slot reads (the Scheduler's); without it,
        the static assignment (`static_work`) is read whole. `rows` (a `spec.row_buckets`
        entry) decodes slots [0, rows) only; the output then has `rows` rows."""
        n_steps = self.chunk if n_steps is None else n_steps
        exit_after = self.spec.max_slots + 1 if exit_after is None else exit_after
        if work is None:
            work = self.spec.kv_layout.default_work(self)
        if rows is not None and rows not in self.spec.row_buckets:
            raise ValueError(f"rows must be one of {self.spec.row_buckets}, got {rows}")
        rows = None if rows == self.spec.max_slots else rows
        return core.generate(
            dp,
            state,
            np.int32(exit_after),
            work,
            spec=self.spec,
            n_steps=n_steps,
            mode=mode,
            rows=rows,
        )

    def compile_ahead(self, modes: Sequence[SamplerMode] = (UNFILTERED,)) -> int:
        """Compiles every program the engine runs — prefill buckets (dense, or the paged
        chunk buckets), insert / activate / copy / deactivate, and `generate` for each of
        `modes` at `chunk` steps and at 1 step — without running them, so that the first
        real call finds them compiled (call it before taking `rlvr_jax.dispatch.LOCK`).
        Returns the number of programs compiled."""
        from rlvr_jax.rollout.device import compile_ahead

        return compile_ahead.compile_all(self, modes)


def make_engine_core(model: Model, *, max_slots: int, max_len: int, **kwargs: Any) -> EngineCore:
    """The plain-JAX engine (see `EngineCore` for the keyword arguments)."""
    return EngineCore(model, max_slots=max_slots, max_len=max_len, **kwargs)
