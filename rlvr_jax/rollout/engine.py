"""`EngineCore`: one policy's params in decode layout on the actor mesh, and the jitted functions
of `rlvr_jax.rollout.device` behind a host API that validates requests and builds their host
arrays. The paged pool's default size is what `max_slots` rows of `max_len` take (nothing is
preempted unless `kv_pages` / `kv_cache_gib` ask for less)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rlvr_jax import sharding
from rlvr_jax.models import ArchConfig, Model, lora
from rlvr_jax.models.params import tree_shardings
from rlvr_jax.rollout.api import RequestError, SlotRequest
from rlvr_jax.rollout.device import decode as core
from rlvr_jax.rollout.device import paged
from rlvr_jax.rollout.device.kernel import DecodeParams, storage_dtype
from rlvr_jax.rollout.device.layout import CONTIGUOUS
from rlvr_jax.rollout.device.layout import kv_layout as kv_layout_named
from rlvr_jax.rollout.device.paged import PagedWork
from rlvr_jax.rollout.device.sampling import UNFILTERED, SamplerMode
from rlvr_jax.rollout.device.state import (
    ChunkOutput,
    DecodeState,
    EngineSpec,
    SlotSettings,
    mesh_platform,
)


@dataclasses.dataclass(frozen=True, eq=False)
class Prefix:
    """A prompt for `EngineCore.insert` (JetStream's "prefix"), its K/V written with `params`."""

    tokens: tuple[int, ...]
    params: DecodeParams


class EngineCore:
    """The plain-JAX engine for one policy (no TensorFlow, no JetStream). Arguments not listed
    are `EngineSpec`'s fields of the same name.

    Args:
      mesh: the actor mesh (params tensor-parallel by `rules`, default `sharding.ACTOR_RULES`;
        slots and KV cache over its data axes); None = the first device.
      chunk: decode steps per `generate` call (the host polls between chunks).
      cache_dtype: default the compute dtype (`kernel.storage_dtype`: fp32 for 16-bit on a CPU).
      kv_layout: "paged" (default) or "contiguous" (fixed [S] rows per slot; the baseline).
      kv_pages / kv_cache_gib: the pool's budget, in allocatable pages (all shards) or in GiB
        per actor device; at most one (default: the contiguous layout's memory).
      attention: "auto" | "xla" | "pallas_tpu" | "pallas_gpu" (`attention.select_impl`).
      weight_dtype: default the compute dtype (`kernel.prepare_params`).

    LoRA: given params with adapters, the engine keeps their base on the actor devices and then
    takes adapters alone (`prepare`), merging them into the decode weights.
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
        if cache_dtype is None:
            cache_dtype = storage_dtype(compute, mesh_platform(mesh))
        spec = EngineSpec(
            config=model.config,
            max_slots=max_slots,
            max_len=max_len,
            compute_dtype=compute,
            weight_dtype=weight_dtype or "",
            cache_dtype=jnp.dtype(cache_dtype).name,
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
        self.base: dict | None = None  # the LoRA base, from the first adapted params on
        self.params = self.prepare(model.params)

    @property
    def config(self) -> ArchConfig:
        return self.spec.config

    def prepare(self, params: dict) -> DecodeParams:
        """`params` (models layout, any mesh) moved device-to-device to the actor devices and
        re-laid for decoding. LoRA: whole params with adapters leave their base here
        (`self.base`); after that, `lora.adapters(params)` alone is merged onto it."""
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
        """Raises `RequestError` unless `prompt` + `max_new_tokens` fits a slot and the pool (called
        when a request is queued: it fails its caller, never the driver)."""
        self._check_prompt(np.asarray(prompt, dtype=np.int64).reshape(-1))
        if len(prompt) + max_new_tokens > self.spec.max_len:
            raise RequestError(
                f"prompt of {len(prompt)} tokens + max_new_tokens={max_new_tokens} exceeds "
                f"the engine's max_len={self.spec.max_len} positions per slot"
            )
        problem = self.spec.kv_layout.misfit(self.spec, len(prompt), max_new_tokens)
        if problem is not None:
            raise RequestError(problem)

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
        """`tokens` (a prompt) to `insert` into slots, their K/V computed there with `dp`."""
        tokens_np = np.asarray(tokens, dtype=np.int64).reshape(-1)
        self._check_prompt(tokens_np)
        return Prefix(tuple(tokens_np.tolist()), dp)

    def settings(self, slots: Sequence[int], requests: Sequence[SlotRequest]) -> SlotSettings:
        """Host arrays of the per-slot settings of one insert (validated)."""
        b, e, f = self.spec.max_slots, self.spec.max_stop_ids, self.spec.max_interrupt_ids
        if len(slots) != len(requests) or not 0 < len(slots) <= b:
            raise ValueError(f"insert needs 1..{b} slots with one request each")
        if len(set(slots)) != len(slots) or not all(0 <= s < b for s in slots):
            raise ValueError(f"slots must be distinct in [0, {b}), got {list(slots)}")
        out = SlotSettings.empty(self.spec)
        for i, (slot, r) in enumerate(zip(slots, requests)):
            if not 0 <= r.seed < 2**32:
                raise RequestError(f"seed must be in [0, 2**32), got {r.seed}")
            self._check_ids(r.stop_token_ids, e, "stop", "max_stop_ids")
            out.slots_B[i], out.seed_B[i], out.sample_B[i] = slot, r.seed, r.sample_index
            out.max_new_B[i], out.temperature_B[i] = r.max_new_tokens, r.sampling.temperature
            out.top_k_B[i], out.top_p_B[i] = r.sampling.top_k, r.sampling.top_p
            out.stop_ids_BxE[i, : len(r.stop_token_ids)] = r.stop_token_ids
            if r.interrupt is not None:  # budget forcing, or a replay
                forced = r.interrupt.tokens
                self._check_ids(forced, f, "inserted", "max_interrupt_ids")
                out.max_new_B[i] = r.interrupt.max_new_tokens(r.max_new_tokens)
                out.budget_B[i] = r.interrupt.budget
                out.forced_BxF[i, : len(forced)] = forced
        return out

    def _check_ids(self, ids: Sequence[int], most: int, what: str, knob: str) -> None:
        vocab, also = self.config.vocab_size, " (or replayed)" if what == "inserted" else ""
        if len(ids) > most:
            raise RequestError(
                f"{len(ids)} {what}{also} token ids; this engine takes at most {most} "
                f"(EngineCore({knob}=...))"
            )
        if any(not 0 <= t < vocab for t in ids):
            raise RequestError(f"{what} token ids must be in [0, {vocab}), got {list(ids)}")

    def insert(
        self,
        prefix: Prefix,
        state: DecodeState,
        slots: Sequence[int],
        requests: Sequence[SlotRequest],
    ) -> DecodeState:
        """`state` (donated) with `prefix`'s prompt but its last token written into the static
        pages of each of `slots` (`static_work`; contiguous: its row), which start generating
        for `requests` from that last token (callers that track no pages: JetStream)."""
        spec, chunk = self.spec, self.spec.prefill_chunk
        table, per_shard = paged.static_table(spec), spec.max_slots // spec.shards
        cached = prefix.tokens[:-1]
        for slot in slots:
            if not table[slot, 0]:
                raise ValueError(
                    f"slot {slot} has no pages in the static assignment (the pool serves "
                    f"{self.static_slots} slots of max_len={spec.max_len}; the Scheduler pages "
                    "dynamically)"
                )
            for start in range(0, len(cached), chunk):
                tokens, shard = cached[start : start + chunk], slot // per_shard
                state = self.extend(prefix.params, state, tokens, start, table[slot], shard)
        n = len(slots)
        return self.activate(state, slots, requests, [prefix.tokens[-1]] * n, [len(cached)] * n)

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
        """Up to `n_steps` (default `chunk`) decode steps of every live slot (`state` donated;
        `device.decode.generate`). Paged: without `work`, the static assignment is read whole."""
        spec, n_steps = self.spec, self.chunk if n_steps is None else n_steps
        exit_after = np.int32(spec.max_slots + 1 if exit_after is None else exit_after)
        if work is None:
            work = spec.kv_layout.default_work(spec)
        if rows is not None and rows not in spec.row_buckets:
            raise ValueError(f"rows must be one of {spec.row_buckets}, got {rows}")
        rows = None if rows == spec.max_slots else rows
        return core.generate(
            dp, state, exit_after, work, spec=spec, n_steps=n_steps, mode=mode, rows=rows
        )

    def compile_ahead(self, modes: Sequence[SamplerMode] = (UNFILTERED,)) -> int:
        """Compiles every program the host runs on this engine (`device.compile_ahead`), without
        running them; call it before taking `dispatch.LOCK`. Returns how many."""
        from rlvr_jax.rollout.device import compile_ahead

        return compile_ahead.compile_all(self.spec, self.params, self.chunk, modes)

    def extend(
        self,
        dp: DecodeParams,
        state: DecodeState,
        tokens: Sequence[int],
        start: int,
        table_row: np.ndarray,
        shard: int = 0,
    ) -> DecodeState:
        """`state` (donated) with the K/V of `tokens` (at most `prefill_chunk`) at positions
        `start ..` of the sequence whose pages (local ids in `shard`; contiguous: its row's one
        page) are `table_row` [M], which must already hold positions [0, start)."""
        n = len(tokens)
        if not 0 < n <= self.spec.prefill_chunk:
            raise ValueError(f"extend takes 1..{self.spec.prefill_chunk} tokens, got {n}")
        padded_T = np.zeros((self.spec.chunk_bucket(n),), np.int32)
        padded_T[:n] = tokens
        row_M = np.asarray(table_row, np.int32)
        args = (np.int32(start), np.int32(n), row_M, np.int32(shard))
        return core.extend(dp, state, padded_T, *args, spec=self.spec)

    def activate(
        self,
        state: DecodeState,
        slots: Sequence[int],
        requests: Sequence[SlotRequest],
        tokens: Sequence[int],
        positions: Sequence[int],
        generated: Sequence[int] | None = None,
    ) -> DecodeState:
        """`state` (donated) with `slots` starting (or resuming) `requests`: slot i feeds
        `tokens[i]` at `positions[i]` next, `generated[i]` tokens already produced."""
        settings = self.settings(slots, requests)
        b, n = self.spec.max_slots, len(slots)
        token_B, position_B = np.zeros((b,), np.int32), np.zeros((b,), np.int32)
        token_B[:n], position_B[:n] = tokens, positions
        if generated is not None:
            settings.generated_B[:n] = generated
        return core.activate(state, settings, token_B, position_B, spec=self.spec)

    def deactivate(self, state: DecodeState, slots: Sequence[int]) -> DecodeState:
        """`state` (donated) with `slots` stopped (preempted)."""
        return core.deactivate(state, self._padded(slots), spec=self.spec)

    def copy_pages(self, state: DecodeState, copies: Sequence[tuple[int, int, int]]) -> DecodeState:
        """`state` (donated) with each (shard, src, dst) page copied, all layers."""
        n, shards = self.spec.max_slots, self.spec.shards
        for i in range(0, len(copies), n):
            src, dst, used = np.zeros((shards, n), np.int32), np.zeros((shards, n), np.int32), {}
            for shard, a, b in copies[i : i + n]:
                at = used[shard] = used.get(shard, -1) + 1
                src[shard, at], dst[shard, at] = a, b
            state = core.copy_pages(state, src, dst, spec=self.spec)
        return state

    def move_slots(self, state: DecodeState, moves: Sequence[tuple[int, int]]) -> DecodeState:
        """`state` (donated) with each (src, dst) slot's request moved to dst, src left idle
        (its K/V stay in its pages; the caller moves the block-table rows)."""
        src, dst = (self._padded([m[i] for m in moves]) for i in (0, 1))
        return core.move_slots(state, src, dst, spec=self.spec)

    def _padded(self, slots: Sequence[int]) -> np.ndarray:
        """`slots` padded to [B] with B (unused)."""
        slots_B = np.full((self.spec.max_slots,), self.spec.max_slots, np.int32)
        slots_B[: len(slots)] = slots
        return slots_B

    @property
    def static_slots(self) -> int:
        """Slots the static page assignment serves (`insert`, `generate` without `work`)."""
        return paged.static_slots(self.spec)

    def static_work(self) -> PagedWork:
        """Paged: decode work over every page of the static assignment (`max_len` per slot)."""
        return paged.static_work(self.spec)


def core_of(engine: object) -> EngineCore:
    """The `EngineCore` of `engine`: itself, or the JetStream adapter's (`make_engine`)."""
    if isinstance(engine, EngineCore):
        return engine
    core = getattr(engine, "core", None)
    if isinstance(core, EngineCore):
        return core
    raise TypeError(f"needs an EngineCore or make_engine's engine, got {type(engine).__name__}")
