"""The JetStream `engine_api.Engine` adapter over `EngineCore`, and its HF tokenizer (classes
built on first use, `make_engine`: importing this module imports neither JetStream nor TF).

- `prefill` → `Prefix` (after `existing_prefix`'s tokens); `insert(prefix, state, slot)` → its
  K/V in the slot's static pages, with the next seed of the engine's counter and the slot's
  capacity as budget (the orchestrator enforces `max_tokens`); `generate` → one decode step of
  every slot, `ResultTokens` rows (token, valid, generated length).
- The tokenizer is built once per engine, on the main thread before the orchestrator starts
  (`rlvr-serve` does): its threads importing transformers concurrently fail. The one
  `HFTokenizer` is shared; `encode` / `decode` hold a lock."""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from rlvr_jax.models import Model
from rlvr_jax.rollout.api import SlotRequest
from rlvr_jax.rollout.backends import jetstream_compat
from rlvr_jax.rollout.device.kernel import DecodeParams
from rlvr_jax.rollout.device.sampling import DEFAULT_SAMPLING, SamplerMode, SamplingParams
from rlvr_jax.rollout.device.state import DecodeState
from rlvr_jax.rollout.engine import EngineCore, Prefix

JETSTREAM_BUCKETS = tuple(2**i for i in range(4, 16))  # JetStream 0.2.2's `pad_tokens` lengths


@functools.cache
def tokenizer_class() -> type:
    """`HFTokenizer`: JetStream's `tokenizer_api.Tokenizer` backed by an HF tokenizer."""
    jetstream_compat.engine_api()
    from jetstream.engine import token_utils, tokenizer_api

    class HFTokenizer(tokenizer_api.Tokenizer):
        """An HF tokenizer (local directory) behind JetStream's tokenizer API: `bos_id` is its BOS,
        or its pad id when it has none (a placeholder JetStream prepends; the engine drops it)."""

        def __init__(self, path: str, stop_ids: Sequence[int] = ()):
            from rlvr_jax.data.tokenizer import load_tokenizer

            self.hf = load_tokenizer(path)
            eos = [] if self.hf.eos_token_id is None else [self.hf.eos_token_id]
            self._stop = frozenset([*stop_ids, *eos])
            self._lock = threading.Lock()
            self.decode([*self._stop][:1])  # decoding imports nothing lazily from now on

        @property
        def has_bos(self) -> bool:
            return self.hf.bos_token_id is not None

        def encode(self, s: str, **kwargs: Any) -> tuple[Any, int]:
            """(padded ids, true length); `is_bos` adds the tokenizer's special tokens."""
            with self._lock:
                ids = self.hf.encode(s, add_special_tokens=kwargs.pop("is_bos", True))
            return token_utils.pad_tokens(
                np.asarray(ids, np.int32), self.bos_id, self.pad_id, is_bos=False, **kwargs
            )

        def decode(self, token_ids: list[int], **kwargs: Any) -> str:  # special tokens kept
            with self._lock:
                return self.hf.decode(list(token_ids))

        @property
        def pad_id(self) -> int:  # the tokenizer's EOS when it has no pad
            return int(self.hf.pad_token_id)

        @property
        def eos_id(self) -> int:
            return int(self.hf.eos_token_id if self.hf.eos_token_id is not None else self.pad_id)

        @property
        def bos_id(self) -> int:
            return int(self.hf.bos_token_id) if self.has_bos else self.pad_id

        @property
        def stop_tokens(self) -> set[int]:  # the model's and the tokenizer's EOS
            return set(self._stop)

    return HFTokenizer


@functools.cache
def engine_class() -> type:
    """`JetStreamEngine`, the `engine_api.Engine` subclass (built once JetStream is imported)."""
    api = jetstream_compat.engine_api()
    from jetstream.engine import tokenizer_pb2

    class JetStreamEngine(api.Engine):
        """Our policy behind JetStream's Engine API (see the module docstring)."""

        def __init__(
            self,
            core: EngineCore,
            *,
            tokenizer_path: str | None,
            sampling: SamplingParams,
            stop_token_ids: Sequence[int],
            seed: int,
        ):
            s = core.spec.max_len
            if s - 1 < JETSTREAM_BUCKETS[0]:
                raise ValueError(f"JetStream needs max_len >= {JETSTREAM_BUCKETS[0] + 1}, got {s}")
            self.core = core
            self.tokenizer_path = tokenizer_path
            self.sampling = sampling
            self.stop_token_ids = tuple(stop_token_ids)
            self.seed = seed
            self.mode = SamplerMode.for_params([sampling])
            self._inserts = 0
            self._strip_bos_placeholder = False  # set by build_tokenizer
            self._placeholder = -1
            self._tokenizers: dict[str, Any] = {}
            self._tokenizer_lock = threading.Lock()

        def prefill(
            self,
            *,
            params: DecodeParams,
            existing_prefix: Prefix | None = None,
            padded_tokens: Any,
            true_length: int,
        ) -> Prefix:
            """The prompt `padded_tokens[:true_length]` (after `existing_prefix`), prefilled."""
            tokens = np.asarray(padded_tokens)[:true_length].tolist()
            if self._strip_bos_placeholder and tokens and tokens[0] == self._placeholder:
                tokens = tokens[1:]
            if existing_prefix is not None:
                tokens = [*existing_prefix.tokens, *tokens]
            return self.core.prefill(params, tokens)

        def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
            """`decode_state` (donated) with `prefix` starting to generate in `slot`."""
            request = SlotRequest(
                seed=(self.seed + self._inserts) % 2**32,
                sample_index=0,
                max_new_tokens=self.core.spec.max_len,  # the slot's capacity ends it first
                sampling=self.sampling,
                stop_token_ids=self.stop_token_ids,
            )
            self._inserts += 1
            return self.core.insert(prefix, decode_state, [slot], [request])

        def generate(self, params: DecodeParams, decode_state: DecodeState) -> tuple:
            """One decode step of every slot: (state, ResultTokens of [B, 3] rows)."""
            decode_state, out = self.core.generate(params, decode_state, mode=self.mode, n_steps=1)
            rows = [out.tokens_BxC[:, 0], out.valid_BxC[:, 0].astype(np.int32), out.generated_B]
            columns = dict(tokens_idx=(0, 1), valid_idx=(1, 2), length_idx=(2, 3))
            data = jax.numpy.stack(rows, axis=1)
            return decode_state, api.ResultTokens(data=data, **columns, samples_per_slot=1)

        def load_params(self, *args: Any, **kwargs: Any) -> DecodeParams:
            return self.core.params

        def init_decode_state(self, *args: Any, **kwargs: Any) -> DecodeState:
            return self.core.init_decode_state()

        def get_prefix_destination_sharding(self) -> Any:
            """Replicated on the engine's mesh (or its one device)."""
            mesh = self.core.spec.mesh
            if mesh is None:
                return jax.sharding.SingleDeviceSharding(jax.devices()[0])
            return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

        def get_tokenizer(self) -> Any:
            if self.tokenizer_path is None:
                raise ValueError("this engine has no tokenizer (make_engine(tokenizer_path=...))")
            return tokenizer_pb2.TokenizerParameters(path=self.tokenizer_path)

        def build_tokenizer(self, metadata: Any) -> Any:
            """The `HFTokenizer` of `metadata.path` (built once; see the module docstring)."""
            with self._tokenizer_lock:
                tokenizer = self._tokenizers.get(metadata.path)
                if tokenizer is None:
                    stops = (*self.stop_token_ids, *self.core.config.eos_token_id)
                    tokenizer = tokenizer_class()(metadata.path, stops)
                    self._tokenizers[metadata.path] = tokenizer
                self._strip_bos_placeholder = not tokenizer.has_bos
                self._placeholder = tokenizer.bos_id
                return tokenizer

        @property
        def max_concurrent_decodes(self) -> int:  # the slots the static pages serve
            return self.core.static_slots

        @property
        def samples_per_slot(self) -> int:
            return 1

        @property
        def max_prefill_length(self) -> int:  # the largest padding bucket that fits a slot
            return max(b for b in JETSTREAM_BUCKETS if b <= self.core.spec.max_len - 1)

        @property
        def mesh(self) -> jax.sharding.Mesh:
            if self.core.spec.mesh is not None:
                return self.core.spec.mesh
            return jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))

        @property
        def colocated_cpus(self) -> None:
            return None

    return JetStreamEngine


def make_engine(
    model: Model,
    *,
    max_slots: int,
    max_len: int,
    mesh: Any = None,
    tokenizer_path: str | None = None,
    sampling: SamplingParams = DEFAULT_SAMPLING,
    stop_token_ids: Sequence[int] | None = None,
    seed: int = 0,
    **core_kwargs: Any,
) -> Any:
    """A JetStream `engine_api.Engine` serving `model` (imports JetStream now; its `EngineCore`
    built of the other keyword arguments is `engine.core`): `tokenizer_path` defaults to the
    model's directory, `stop_token_ids` to its EOS ids; insert i samples with seed `seed + i`."""
    core = EngineCore(model, max_slots=max_slots, max_len=max_len, mesh=mesh, **core_kwargs)
    stops = model.config.eos_token_id if stop_token_ids is None else tuple(stop_token_ids)
    return engine_class()(
        core,
        tokenizer_path=model.path if tokenizer_path is None else str(tokenizer_path),
        sampling=sampling,
        stop_token_ids=stops,
        seed=seed,
    )
