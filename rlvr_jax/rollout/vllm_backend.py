"""vLLM as the actor backend (GPU only, extra `vllm`): the same rollout interface, with the
learner's weights pushed into the running vLLM engine after each optimizer step.

The parameter export is `hf_weights`: the params in HF names and layouts — exactly the
table `rlvr_jax.models.hf_io.tensor_maps` defines for checkpoints, which is what vLLM's
`load_weights` reads — testable on CPU. vLLM itself is imported only by `VllmRollout`.

Differences from the JAX engine, by vLLM's design: its sampler's randomness is seeded per
request (reproducible, but not the same draws as ours), and its "processed" log-probs
apply top-k/top-p as well as the temperature (identical to ALGORITHMS.md's convention at
top-p = 1, top-k off, which RLVR uses).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from rlvr_jax.models import ArchConfig, Model
from rlvr_jax.models.hf_io import get_path, tensor_maps
from rlvr_jax.rollout.sampling import DEFAULT_SAMPLING, SamplingParams
from rlvr_jax.rollout.scheduler import Completion
from rlvr_jax.rollout.stream import CompletedGroup, RolloutError


def hf_weights(params: Any, config: ArchConfig) -> Iterator[tuple[str, jax.Array]]:
    """(HF tensor name, tensor in HF layout) for every tensor of the checkpoint format.

    Arrays stay where `params` live (layouts are changed on device, one tensor at a time).
    """
    for m in tensor_maps(config):
        leaf = get_path(params, m.path)
        for i, name in enumerate(m.names(config.n_layers)):
            yield name, m.to_hf(leaf[i] if m.stacked else leaf)


def _to_torch_cpu(x: jax.Array) -> Any:
    import torch

    host = np.asarray(jax.device_get(x))
    if host.dtype.name == "bfloat16":  # numpy has no bf16 that torch reads: via fp32
        return torch.from_numpy(host.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(host))


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, Any]]) -> int:
    """Runs inside each vLLM worker (`LLM.collective_rpc`): loads HF-named tensors."""
    worker.model_runner.model.load_weights(weights=weights)
    return len(weights)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            "the vLLM backend needs `pip install rlvr_jax[vllm]` on a GPU machine "
            f"({e}); the JAX engine (rlvr_jax.rollout.make_engine_core) runs everywhere"
        ) from e
    return vllm


class VllmRollout:
    """A running vLLM engine serving `model` (read from `model.path`).

    `rlvr_jax.rollout.generate(rollout, prompts, ...)` samples from it; `update_weights`
    pushes new learner params in. Keyword arguments go to `vllm.LLM`.
    """

    def __init__(self, model: Model, *, dtype: str = "bfloat16", **llm_kwargs: Any):
        if model.path is None:
            raise ValueError("VllmRollout needs a model loaded from a checkpoint directory")
        vllm = _import_vllm()
        self.config = model.config
        self.version = 0
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=model.path, dtype=dtype, logprobs_mode="processed_logprobs", **llm_kwargs
        )

    def update_weights(self, params: Any, version: int) -> None:
        """Loads `params` (models layout) into every vLLM worker; later requests use them.
        The prefix cache (KV of the old weights) is dropped."""
        weights = [(name, _to_torch_cpu(x)) for name, x in hf_weights(params, self.config)]
        self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        self.llm.reset_prefix_cache()
        self.version = version

    def generate_completions(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        sampling: SamplingParams,
        num_samples: int,
        stop_token_ids: tuple[int, ...],
        seeds: Sequence[int],
    ) -> list[Completion]:
        """`generate`'s backend: completions ordered by (prompt_index, sample_index)."""
        from vllm.inputs import TokensPrompt

        params = [
            self._vllm.SamplingParams(
                n=num_samples,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                max_tokens=max_new_tokens,
                stop_token_ids=list(stop_token_ids),
                seed=seed,
                logprobs=0,
                detokenize=False,
            )
            for seed in seeds
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False
        )
        completions = []
        for i, out in enumerate(outputs):
            for j, sample in enumerate(out.outputs):
                tokens = list(sample.token_ids)
                logprobs = [step[t].logprob for step, t in zip(sample.logprobs, tokens)]
                completions.append(
                    Completion(
                        prompt_index=i,
                        sample_index=j,
                        tokens=tokens,
                        logprobs=logprobs,
                        finish_reason="stop" if sample.finish_reason == "stop" else "length",
                        policy_versions=[self.version] * len(tokens),
                    )
                )
        return completions


class VllmStream:
    """`VllmRollout` behind `RolloutStream`'s trainer interface (`submit(..., meta=)`, `get`,
    `ready`, `step`, `update_weights`, `start`, `stop`), so the trainer's rollout source runs on
    either backend (`rollout.backend: vllm`).

    vLLM batches continuously inside each `generate` call; the driver (a thread after `start()`,
    or `step()` on the caller's thread) hands it every request waiting at that moment, so a
    weight update reaches vLLM between two such calls (not mid-call, as our engine's in-flight
    updates do), and every token of a call records the version it ran with.
    """

    def __init__(
        self,
        engine: Any,
        *,
        max_new_tokens: int,
        sampling: SamplingParams = DEFAULT_SAMPLING,
        stop_token_ids: Sequence[int] = (),
        max_pending_groups: int = 64,
        max_ready_groups: int = 64,
        version: int = 0,
    ) -> None:
        self.engine = engine
        self.engine.version = version
        self.max_new_tokens, self.sampling = max_new_tokens, sampling
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.max_pending, self.max_ready = max_pending_groups, max_ready_groups
        self._cond = threading.Condition()
        self._pending: deque[tuple[Hashable, list[int], int, int, Any]] = deque()
        self._ready: deque[CompletedGroup] = deque()
        self._weights: tuple[Any, int] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._error: BaseException | None = None

    def submit(
        self,
        request_id: Hashable,
        prompt_tokens: Sequence[int],
        num_samples: int,
        seed: int,
        meta: Any = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """Queues a prompt for `num_samples` samples; blocks while `max_pending_groups` wait."""
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self._pending) >= self.max_pending:
                self._raise_if_failed()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"submit: {self.max_pending} groups still pending")
                self._cond.wait(left)
            prompt = [int(t) for t in prompt_tokens]
            self._pending.append((request_id, prompt, num_samples, seed, meta))
            self._cond.notify_all()

    def update_weights(self, params: Any, version: int) -> None:
        """New params, loaded into vLLM before its next `generate` call."""
        with self._cond:
            self._weights = (params, version)
            self._cond.notify_all()

    def step(self) -> list[CompletedGroup]:
        """Synchronous drive: every waiting request through one `generate` call."""
        if self._thread is not None:
            raise RuntimeError("this stream is driven by its thread (start() was called)")
        with self._cond:
            batch, weights = self._take_locked()
        return self._generate(batch, weights)

    def _take_locked(self) -> tuple[list, tuple[Any, int] | None]:
        batch, weights = list(self._pending), self._weights
        self._pending.clear()
        self._weights = None
        self._cond.notify_all()
        return batch, weights

    def _generate(self, batch: list, weights: tuple[Any, int] | None) -> list[CompletedGroup]:
        if weights is not None:
            self.engine.update_weights(*weights)
        if not batch:
            return []
        sizes = {n for _, _, n, _, _ in batch}
        groups: list[CompletedGroup] = []
        for size in sorted(sizes):  # one vLLM call per group size (n is per call here)
            part = [b for b in batch if b[2] == size]
            completions = self.engine.generate_completions(
                [p for _, p, _, _, _ in part],
                max_new_tokens=self.max_new_tokens,
                sampling=self.sampling,
                num_samples=size,
                stop_token_ids=self.stop_token_ids,
                seeds=[seed for _, _, _, seed, _ in part],
            )
            for i, (rid, prompt, _, _, meta) in enumerate(part):
                mine = [c for c in completions if c.prompt_index == i]
                groups.append(CompletedGroup(rid, meta, mine, prompt))
        return groups

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and not (
                        self._pending and len(self._ready) < self.max_ready
                    ):
                        self._cond.wait()
                    if self._stopping:
                        return
                    batch, weights = self._take_locked()
                done = self._generate(batch, weights)
                with self._cond:
                    self._ready.extend(done)
                    self._cond.notify_all()
        except BaseException as e:  # surfaced to every caller, never swallowed
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RolloutError(f"vLLM driver failed: {self._error!r}") from self._error

    def get(self, timeout: float | None = None) -> CompletedGroup:
        """The next completed group; `TimeoutError` after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._ready:
                self._raise_if_failed()
                if self._stopping:
                    raise RolloutError("the stream was stopped")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"get: no completed group within {timeout} s")
                self._cond.wait(left)
            group = self._ready.popleft()
            self._cond.notify_all()
            return group

    @property
    def ready(self) -> int:
        with self._cond:
            return len(self._ready)

    def start(self) -> VllmStream:
        self._thread = threading.Thread(target=self._run, name="vllm-driver", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
