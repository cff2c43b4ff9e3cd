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

from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from rlvr_jax.models import ArchConfig, Model
from rlvr_jax.models.hf_io import get_path, tensor_maps
from rlvr_jax.rollout.api import Completion
from rlvr_jax.rollout.device.sampling import SamplingParams
from rlvr_jax.rollout.push import PartialPushError, check_complete, check_order, signature


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
    pushes new learner params in (the `rollout.push` contract: in version order, whole).
    Keyword arguments go to `vllm.LLM`.
    """

    def __init__(self, model: Model, *, dtype: str = "bfloat16", **llm_kwargs: Any):
        if model.path is None:
            raise ValueError("VllmRollout needs a model loaded from a checkpoint directory")
        vllm = _import_vllm()
        self.config = model.config
        self.signature = signature(model.params)
        """The policy's leaf shapes: a push must match them (`push.check_complete`)."""
        self.version = 0
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=model.path, dtype=dtype, logprobs_mode="processed_logprobs", **llm_kwargs
        )

    def update_weights(self, params: Any, version: int) -> None:
        """Loads `params` (models layout) into every vLLM worker; later requests use them.
        The prefix cache (KV of the old weights) is dropped. Refuses an out-of-order or
        partial push (`rollout.push`), and raises `PartialPushError` when a worker loaded
        fewer tensors than were sent (its weights are then mixed: the run must stop)."""
        check_order(version, self.version)
        check_complete(params, self.signature, version=version)
        weights = [(name, _to_torch_cpu(x)) for name, x in hf_weights(params, self.config)]
        loaded = self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        short = [f"worker {i}: {n}" for i, n in enumerate(loaded) if n != len(weights)]
        if short:
            raise PartialPushError(
                f"weight push of policy version {version}: vLLM loaded fewer than the "
                f"{len(weights)} tensors sent ({', '.join(short)})"
            )
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


class VllmScheduler:
    """`VllmRollout` behind `Scheduler`'s interface, so that a `RolloutStream` drives it
    (`RolloutStream(None, scheduler=VllmScheduler(engine), ...)`) and the trainer's rollout
    source runs on either backend (`rollout.backend: vllm`).

    vLLM batches continuously inside each `generate` call; a step hands it every request waiting
    at that moment, so a weight update reaches vLLM between two such calls (not mid-call, as our
    engine's in-flight updates do), and every token of a call records the version it ran with.
    """

    def __init__(self, engine: Any, *, version: int = 0) -> None:
        self.engine = engine
        self.engine.version = version
        self._waiting: list[Any] = []

    def check(self, request: Any) -> None:
        if request.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {request.num_samples}")
        if not request.prompt or request.max_new_tokens < 1:
            raise ValueError("a request needs a non-empty prompt and max_new_tokens >= 1")
        if request.interrupt is not None or request.turns is not None:
            raise ValueError(
                "budget forcing (rollout.interrupt) and multi-turn environments (env.name) are "
                "not supported with rollout.backend: vllm; use rollout.backend: jetstream"
            )

    def prepare(self, params: Any) -> Any:
        """`params` as they are (vLLM takes the HF-named tensors when they are loaded, in
        `set_params`), once checked whole (`push.PartialPushError`)."""
        check_complete(params, self.engine.signature)
        return params

    def add(self, request: Any, *, checked: bool = False) -> None:
        if not checked:
            self.check(request)
        self._waiting.append(request)

    def set_params(self, params: Any, version: int) -> None:
        check_order(version, self.version)
        self.engine.update_weights(params, version)

    @property
    def version(self) -> int:
        """Policy version of the weights vLLM holds."""
        return self.engine.version

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    live = 0
    """Nothing generates between steps: a step runs its requests to completion."""
    parked = 0
    """No multi-turn episodes (`rollout.turns`) here."""

    @property
    def idle(self) -> bool:
        return not self._waiting

    def step(self, *, admit: bool = True) -> list[tuple[Any, list[Completion]]]:
        """Every waiting request through vLLM (one call per distinct sampling setting)."""
        if not admit:
            return []
        batch, self._waiting = self._waiting, []
        finished = []
        settings = {(r.num_samples, r.max_new_tokens, r.sampling, r.stop_token_ids) for r in batch}
        for n, max_new, sampling, stop_ids in sorted(settings, key=repr):
            part = [
                r
                for r in batch
                if (r.num_samples, r.max_new_tokens, r.sampling, r.stop_token_ids)
                == (n, max_new, sampling, stop_ids)
            ]
            completions = self.engine.generate_completions(
                [r.prompt for r in part],
                max_new_tokens=max_new,
                sampling=sampling,
                num_samples=n,
                stop_token_ids=stop_ids,
                seeds=[r.seed for r in part],
            )
            for i, request in enumerate(part):
                finished.append((request, [c for c in completions if c.prompt_index == i]))
        return finished
