"""`EngineCore`: the plain-JAX engine for one policy — its params in decode layout on the
actor mesh and the jitted device functions of `rlvr_jax.rollout.core` / `paged_core` behind
a host API that validates requests (no TensorFlow, no JetStream).

KV memory: `kv_layout="paged"` (default) keeps one pool of pages; its size is a budget of
its own — `kv_pages` (allocatable pages, all shards) or `kv_cache_gib` (per actor device),
by default what `max_slots` contiguous rows of `max_len` would take, so that no request
is ever preempted unless a smaller budget (or more slots) is asked for. The host half
that hands out pages is `rlvr_jax.rollout.scheduler`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rlvr_jax import sharding
from rlvr_jax.models import ArchConfig, Model
from rlvr_jax.rollout import core, paged_attention, paged_core
from rlvr_jax.rollout.core import ChunkOutput, DecodeState, EngineSpec, Prefix, SlotSettings
from rlvr_jax.rollout.kernel import DecodeParams
from rlvr_jax.rollout.paged_core import PagedWork
from rlvr_jax.rollout.pages import pages_for
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
      max_slots: B, decode slots. max_len: S, positions per sequence (prompt + new tokens).
      mesh: the actor mesh (params split tensor-parallel by `rules`, slots and KV cache
        over its data axes, KV heads over its tensor axis); None = the first device.
      rules: logical-axis rules (default `sharding.ACTOR_RULES`).
      chunk: decode steps per `generate` call (the host polls between chunks).
      cache_dtype: KV cache dtype (default: the model's compute dtype).
      max_stop_ids: stop token ids a request may carry.
      kv_layout: "paged" (default) or "contiguous" (fixed [S] rows per slot; the baseline).
      page_size: tokens per page. prefill_chunk: tokens per prefill chunk (paged).
      kv_pages / kv_cache_gib: the pool's budget, in allocatable pages (all shards) or in
        GiB per actor device; at most one (default: the contiguous layout's memory).
      attention: decode attention of full layers, "auto" | "xla" | "pallas_tpu" |
        "pallas_gpu" (`paged_attention.select_impl`).
      geometry_tokens: (decode block, decode iteration, prefill block) in tokens (paged;
        default `paged_attention.GEOMETRY_TOKENS`).
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
    ):
        if chunk < 1:
            raise ValueError(f"chunk (decode steps per call) must be >= 1, got {chunk}")
        compute = jnp.dtype(model.compute_dtype).name
        spec = EngineSpec(
            config=model.config,
            max_slots=max_slots,
            max_len=max_len,
            compute_dtype=compute,
            cache_dtype=compute if cache_dtype is None else jnp.dtype(cache_dtype).name,
            max_stop_ids=max_stop_ids,
            mesh=mesh,
            rules=(sharding.ACTOR_RULES if rules is None else rules) if mesh else None,
        )
        if kv_layout == "paged":
            platform = (mesh.devices.flat[0] if mesh else jax.devices()[0]).platform
            spec = dataclasses.replace(
                spec,
                kv_layout="paged",
                page_size=page_size,
                num_pages=_pool_pages(spec, page_size, kv_pages, kv_cache_gib),
                prefill_chunk=prefill_chunk,
                attention=paged_attention.select_impl(
                    attention, platform, page_size=page_size, head_dim=model.config.head_dim
                ),
                geometry_tokens=geometry_tokens or paged_attention.GEOMETRY_TOKENS,
            )
        elif kv_layout != "contiguous":
            raise ValueError(f"kv_layout must be 'paged' or 'contiguous', got {kv_layout!r}")
        self.spec = spec
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
                params, sharding.param_shardings(self.config, self.spec.mesh, self.spec.rules)
            )
        return core.prepare(params, spec=self.spec)

    def init_decode_state(self) -> DecodeState:
        """All slots empty (committed to the engine's devices, as every later state is)."""
        state = core.init_state(spec=self.spec)
        if self.spec.mesh is None:
            state = jax.device_put(state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
        return state

    @property
    def paged(self) -> bool:
        """Whether the KV cache is the page pool."""
        return self.spec.kv_layout == "paged"

    @property
    def kv_bytes(self) -> int:
        """Bytes of the KV cache (all layers, K and V, all devices together)."""
        from rlvr_jax.rollout.state import kv_shape

        n = int(np.prod(kv_shape(self.spec)))
        return 2 * self.config.n_layers * n * jnp.dtype(self.spec.cache_dtype).itemsize

    @property
    def kv_capacity(self) -> int:
        """Tokens the KV cache can hold (the trash pages excluded)."""
        s = self.spec
        if not self.paged:
            return s.max_slots * s.max_len
        return (s.num_pages - s.shards) * s.page_size

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
        s = self.spec
        need = pages_for(len(prompt) + max_new_tokens, s.page_size)
        if self.paged and need > s.pages_per_shard - 1:
            raise RequestError(
                f"prompt of {len(prompt)} tokens + max_new_tokens={max_new_tokens} needs "
                f"{need} pages of {s.page_size} tokens, more than the whole KV pool "
                f"({s.pages_per_shard - 1} pages per slot shard; raise rollout.kv_pages or "
                "rollout.kv_cache_gib)"
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

    def extend(
        self,
        dp: DecodeParams,
        state: DecodeState,
        tokens: Sequence[int],
        start: int,
        table_row: np.ndarray,
        shard: int = 0,
    ) -> DecodeState:
        """Paged: `state` (donated) with the K/V of `tokens` (at most `prefill_chunk`) at
        positions `start ..` of the sequence whose pages (local ids in shard `shard`) are
        `table_row` [M]; positions before `start` must already be in those pages."""
        n = len(tokens)
        if not 0 < n <= self.spec.prefill_chunk:
            raise ValueError(f"extend takes 1..{self.spec.prefill_chunk} tokens, got {n}")
        padded_T = np.zeros((self.spec.chunk_bucket(n),), np.int32)
        padded_T[:n] = tokens
        return paged_core.extend(
            dp,
            state,
            padded_T,
            np.int32(start),
            np.int32(n),
            np.asarray(table_row, np.int32),
            np.int32(shard),
            spec=self.spec,
        )

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
        if self.paged:
            return self._insert_static(prefix, state, slots, requests)
        settings = self.settings(slots, requests)
        return core.insert(state, prefix, settings, np.int32(len(slots)), spec=self.spec)

    @property
    def static_slots(self) -> int:
        """Paged: slots the static page assignment serves (`insert` / `generate` without
        `work`, the JetStream adapter): slot b owns pages for `max_len` positions."""
        s = self.spec
        per_seq = pages_for(s.max_len, s.page_size)
        return min(s.max_slots // s.shards, (s.pages_per_shard - 1) // per_seq) * s.shards

    def static_table(self) -> np.ndarray:
        """Paged: the static block tables [B, M] (slots past `static_slots` get none)."""
        s = self.spec
        per_seq, per_shard = pages_for(s.max_len, s.page_size), s.max_slots // s.shards
        usable = self.static_slots // s.shards
        table = np.zeros((s.max_slots, s.max_pages), np.int32)
        for b in range(s.max_slots):
            local = b % per_shard
            if local < usable:
                table[b, :per_seq] = 1 + local * per_seq + np.arange(per_seq)
        return table

    def static_work(self) -> PagedWork:
        """Paged: decode work over every page of the static assignment (each slot reads its
        whole `max_len`: the contiguous layout's cost, for callers that track no pages)."""
        if getattr(self, "_static_work", None) is None:
            from rlvr_jax.rollout.pages import work_lists

            s = self.spec
            usable = [b for b in range(s.max_slots) if self.static_table()[b, 0]]
            ends = dict.fromkeys(usable, s.max_len - 1)
            kw = dict(
                slots_per_shard=s.max_slots // s.shards,
                shards=s.shards,
                length=s.work_len,
                geometry=s.geometry,
            )
            full = work_lists(ends, dict.fromkeys(usable, 0), **kw)
            sliding = full if s.config.has_sliding else (None, None, None)
            self._static_work = PagedWork(self.static_table(), *full, *sliding)
        return self._static_work

    def _insert_static(
        self, prefix: Prefix, state: DecodeState, slots: Sequence[int], requests: Sequence
    ) -> DecodeState:
        s = self.spec
        table = self.static_table()
        for slot in slots:
            if not table[slot, 0]:
                raise ValueError(
                    f"slot {slot} has no pages in the static assignment (the pool serves "
                    f"{self.static_slots} slots of max_len={s.max_len}; the Scheduler pages "
                    "dynamically)"
                )
            shard = slot // (s.max_slots // s.shards)
            state = self.write_prefix(state, prefix, table[slot], shard)
        n = len(slots)
        length, last = int(prefix.length), int(prefix.last_token)
        return self.activate(state, slots, requests, [last] * n, [length] * n)

    def activate(
        self,
        state: DecodeState,
        slots: Sequence[int],
        requests: Sequence[SlotRequest],
        tokens: Sequence[int],
        positions: Sequence[int],
        generated: Sequence[int] | None = None,
    ) -> DecodeState:
        """Paged: `state` (donated) with `slots` starting (or resuming) `requests`: slot i
        feeds `tokens[i]` at `positions[i]` next, `generated[i]` tokens already produced."""
        settings = self.settings(slots, requests)
        b = self.spec.max_slots
        token_B, position_B = np.zeros((b,), np.int32), np.zeros((b,), np.int32)
        token_B[: len(slots)], position_B[: len(slots)] = tokens, positions
        if generated is not None:
            settings.generated_B[: len(slots)] = generated
        return paged_core.activate(state, settings, token_B, position_B, spec=self.spec)

    def deactivate(self, state: DecodeState, slots: Sequence[int]) -> DecodeState:
        """Paged: `state` (donated) with `slots` stopped (preempted)."""
        slots_B = np.full((self.spec.max_slots,), self.spec.max_slots, np.int32)
        slots_B[: len(slots)] = slots
        return paged_core.deactivate(state, slots_B, spec=self.spec)

    def copy_pages(self, state: DecodeState, copies: Sequence[tuple[int, int, int]]) -> DecodeState:
        """Paged: `state` (donated) with each (shard, src, dst) page copied, all layers."""
        n = self.spec.max_slots
        src, dst = (
            np.zeros((self.spec.shards, n), np.int32),
            np.zeros((self.spec.shards, n), np.int32),
        )
        for i in range(0, len(copies), n):
            used = [0] * self.spec.shards
            src[:], dst[:] = 0, 0
            for shard, a, b in copies[i : i + n]:
                src[shard, used[shard]], dst[shard, used[shard]] = a, b
                used[shard] += 1
            state = paged_core.copy_pages(state, src, dst, spec=self.spec)
        return state

    def write_prefix(
        self, state: DecodeState, prefix: Prefix, table_row: np.ndarray, shard: int = 0
    ) -> DecodeState:
        """Paged: `state` (donated) with a dense prefix's K/V written into the pages
        `table_row` of shard `shard`."""
        return paged_core.write_prefix(
            state, prefix, np.asarray(table_row, np.int32), np.int32(shard), spec=self.spec
        )

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
        if self.paged and work is None:
            work = self.static_work()
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

    def move_slots(self, state: DecodeState, moves: Sequence[tuple[int, int]]) -> DecodeState:
        """`state` (donated) with each (src, dst) slot's request moved to dst, src left
        idle (paged: the caller moves the block-table rows)."""
        b = self.spec.max_slots
        src, dst = np.full((b,), b, np.int32), np.full((b,), b, np.int32)
        for i, (a, c) in enumerate(moves):
            src[i], dst[i] = a, c
        return core.move_slots(state, src, dst, spec=self.spec)

    def compile_ahead(self, modes: Sequence[SamplerMode] = (UNFILTERED,)) -> int:
        """Compiles every program the engine runs — prefill buckets (dense, or the paged
        chunk buckets), insert / activate / copy / deactivate, and `generate` for each of
        `modes` at `chunk` steps and at 1 step — without running them, so that the first
        real call finds them compiled (call it before taking `rlvr_jax.dispatch.LOCK`).
        Returns the number of programs compiled."""
        from rlvr_jax.rollout import compile_ahead

        return compile_ahead.compile_all(self, modes)


def _pool_pages(
    spec: EngineSpec, page_size: int, kv_pages: int | None, kv_cache_gib: float | None
) -> int:
    """P, the pool's pages (trash pages included, a multiple of the slot shards)."""
    if spec.max_slots % spec.shards:
        raise ValueError(f"max_slots={spec.max_slots} must split over {spec.shards} slot shards")
    tensor = 1 if spec.mesh is None else spec.mesh.shape["tensor"]
    return pool_pages(
        spec.config,
        max_slots=spec.max_slots,
        max_len=spec.max_len,
        shards=spec.shards,
        tensor=tensor,
        cache_dtype=spec.cache_dtype,
        page_size=page_size,
        kv_pages=kv_pages,
        kv_cache_gib=kv_cache_gib,
    )


def pool_pages(
    config: ArchConfig,
    *,
    max_slots: int,
    max_len: int,
    shards: int,
    tensor: int,
    cache_dtype: Any,
    page_size: int,
    kv_pages: int | None,
    kv_cache_gib: float | None,
) -> int:
    """Pages of a paged engine's pool, all `shards` together, each shard's trash page
    included: `kv_pages` allocatable pages, or what `kv_cache_gib` GiB per device holds
    (KV heads split over `tensor` when it divides them), or by default `max_slots` rows of
    `max_len` positions. Used by `EngineCore` and by the dry-run plan."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if kv_pages is not None and kv_cache_gib is not None:
        raise ValueError("give kv_pages or kv_cache_gib, not both")
    if kv_pages is not None:
        if kv_pages < 1:
            raise ValueError(f"kv_pages must be >= 1, got {kv_pages}")
        per_shard = -(-kv_pages // shards) + 1
    elif kv_cache_gib is not None:
        heads = config.n_kv_heads
        heads = heads // tensor if heads % tensor == 0 else heads
        per_page = 2 * config.n_layers * heads * page_size * config.head_dim
        per_page *= jnp.dtype(cache_dtype).itemsize
        per_shard = int(kv_cache_gib * 1024**3) // per_page
        if per_shard < 2:
            raise ValueError(
                f"kv_cache_gib={kv_cache_gib} holds {per_shard} pages of {per_page} bytes per "
                "device; at least 2 are needed"
            )
    else:
        per_shard = max_slots // shards * pages_for(max_len, page_size) + 1
    return per_shard * shards


def engine_kwargs(rollout_cfg: Any) -> dict[str, Any]:
    """`EngineCore` keyword arguments from a `rlvr_jax.config.schema.RolloutConfig` (KV
    layout and budget, page size, prefill chunk, decode chunk)."""
    return {
        "chunk": rollout_cfg.decode_chunk,
        "kv_layout": rollout_cfg.kv_layout,
        "page_size": rollout_cfg.page_size,
        "kv_pages": rollout_cfg.kv_pages,
        "kv_cache_gib": rollout_cfg.kv_cache_gib,
        "prefill_chunk": rollout_cfg.prefill_chunk,
    }


def make_engine_core(model: Model, *, max_slots: int, max_len: int, **kwargs: Any) -> EngineCore:
    """The plain-JAX engine (see `EngineCore` for the keyword arguments)."""
    return EngineCore(model, max_slots=max_slots, max_len=max_len, **kwargs)
