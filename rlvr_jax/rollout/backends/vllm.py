"""vLLM as the actor backend (`rollout.backend: vllm`): vLLM's `LLMEngine`, in this process (vLLM
imported only when built), stepped behind the same `RolloutStream` as our engine.

- `VllmScheduler`: samples enter vLLM as slots free up (`rollout.max_slots` at once; a group's
  samples share the prompt's prefix cache), each stream step runs up to `rollout.decode_chunk`
  engine steps, and a group leaves once its last sample finishes.
- Pushes between engine steps: `Worker.reload_weights` loads HF-named tensors in place, in this
  process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: a multi-process engine cannot take tensors
  through `collective_rpc`); each token records the version that sampled it. `rollout.on_push`:
  `keep` leaves in-flight KV as it is (PipelineRL); `recompute` preempts the running requests
  and vLLM recomputes them with the new weights. The prefix cache is salted with the version.
- `engine_args` maps every `rollout:` key vLLM honours (`api.BACKENDS`).

By vLLM's design, its randomness is seeded per request (reproducible, not our draws), and its
"processed" log-probs apply top-k/top-p as well as the temperature (ALGORITHMS.md's convention
at top-p = 1, top-k off).
"""

from __future__ import annotations

import collections
import itertools
import os
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from rlvr_jax.models import ArchConfig, Model
from rlvr_jax.models.hf_io import hf_weights
from rlvr_jax.rollout.api import ON_PUSH, Finished, GroupRequest, RequestError
from rlvr_jax.rollout.generation import request_seed
from rlvr_jax.rollout.host.sequences import Group, Seq, enqueue
from rlvr_jax.rollout.push import PartialPushError, check_complete, check_order, signature

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from rlvr_jax.config.schema import RolloutConfig

VLLM_CPU_BLOCK = 128  # tokens per KV block of vLLM's CPU build (its default; GPUs use 16)


def _to_torch_cpu(x: jax.Array) -> Any:
    import torch

    host = np.asarray(jax.device_get(x))
    if host.dtype.name == "bfloat16":  # numpy has no bf16 that torch reads: via fp32
        return torch.from_numpy(host.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(host))


def torch_weights(params: Any, config: ArchConfig) -> list[tuple[str, Any]]:
    """`hf_weights` as CPU torch tensors: what a push hands to vLLM's workers."""
    return [(name, _to_torch_cpu(x)) for name, x in hf_weights(params, config)]


def reload_on_worker(worker: Any, weights: list[tuple[str, Any]]) -> int:
    """Runs in each vLLM worker (`collective_rpc`): reloads the HF-named tensors in place
    (`load_weights` fails on the CPU build, whose layers are repacked after loading). Returns
    the tensors handed over."""
    worker.reload_weights(weights_iterator=iter(weights))
    _refresh_tied_head(worker.model_runner.get_model())
    return len(weights)


def _refresh_tied_head(model: Any) -> None:
    """Re-derives a tied LM head's packed copy (vLLM-CPU's `process_weights_after_loading`) from
    the reloaded embedding: `reload_weights` re-processes only the layers it loaded, so a tied
    head kept its old copy (the push probe saw |Δ log p| of 1.2 after pushing new embeddings)."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or head.weight is not embed.weight:
        return
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)


def _import_vllm() -> Any:
    # in-process engine: our pushes hand torch tensors to the worker's `reload_weights`
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
        raise RuntimeError(
            "rollout.backend: vllm runs vLLM's engine in this process (weight pushes hand "
            "tensors to its worker): unset VLLM_ENABLE_V1_MULTIPROCESSING or set it to 0"
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            "rollout.backend: vllm needs vLLM: its CPU build in its own venv "
            "(bash scripts/setup_env.sh --vllm; docs/vllm.md) or pip install 'rlvr_jax[vllm]' "
            f"on a GPU machine ({e}); rollout.backend: jetstream (our engine) runs everywhere"
        ) from e
    return vllm


def kv_cache_bytes(
    config: ArchConfig,
    *,
    dtype_bytes: int,
    max_slots: int,
    max_len: int,
    page_size: int,
    kv_pages: int | None = None,
    kv_cache_gib: float | None = None,
    tensor_parallel: int = 1,
    block: int = VLLM_CPU_BLOCK,
) -> int:
    """vLLM's `kv_cache_memory_bytes` per device for our budget keys: `kv_cache_gib` as given;
    else `kv_pages` pages of `page_size` tokens or (neither) `max_slots` rows of `max_len`
    (rounded up to whole vLLM blocks of `block` tokens), split over the tensor-parallel devices."""
    if kv_cache_gib is not None:
        return int(kv_cache_gib * 2**30)
    row = -(-max_len // block) * block
    tokens = max(kv_pages * page_size, row) if kv_pages is not None else max_slots * row
    per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * dtype_bytes
    return -(-tokens * per_token // tensor_parallel)


def engine_args(
    model: Model,
    *,
    dtype: str,
    max_slots: int,
    max_len: int,
    kv_cache_memory_bytes: int,
    prefill_chunk: int,
    seed: int = 0,
    tensor_parallel: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    """`vllm.EngineArgs` keyword arguments of our engine keys (`api.VLLM.honours`): whole prompts
    per step, log-probs after temperature, token ids in and out (no tokenizer); `extra`
    overrides (e.g. `enforce_eager`)."""
    if model.path is None:
        raise ValueError("rollout.backend: vllm needs a model loaded from a checkpoint directory")
    args = {
        "model": str(model.path),
        "dtype": dtype,
        "skip_tokenizer_init": True,
        "max_num_seqs": max_slots,
        "max_model_len": max_len,
        "kv_cache_memory_bytes": kv_cache_memory_bytes,
        # whole prompts per step: vLLM-CPU fails on a seeded request whose prompt is split over
        # steps ("CPU Generator does not use offset", its partial-prefill bookkeeping)
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(prefill_chunk, max_slots, max_len),
        "enable_prefix_caching": True,
        "logprobs_mode": "processed_logprobs",
        "seed": seed,
        "tensor_parallel_size": tensor_parallel,
        "disable_log_stats": True,
    }
    return {**args, **extra}


class VllmEngine:
    """A vLLM `LLMEngine` in this process serving `model` from `model.path` (`model.params`'
    shapes are the push contract), built from `args` (`engine_args`); `chunk`: engine steps per
    `VllmScheduler.step`; `on_push`: `keep` or `recompute` (module docstring)."""

    def __init__(self, model: Model, args: dict[str, Any], *, chunk: int = 8,
                 on_push: str = "keep") -> None:  # fmt: skip
        if on_push not in ON_PUSH:
            raise ValueError(f"rollout.on_push must be one of {ON_PUSH}, got {on_push!r}")
        vllm = _import_vllm()
        from vllm.v1.engine.llm_engine import LLMEngine

        self._vllm = vllm
        self.config = model.config
        self.signature = signature(model.params)
        self.args = dict(args)
        self.max_slots = int(args["max_num_seqs"])
        self.chunk = chunk
        self.on_push = on_push
        self.version = 0
        self.llm = LLMEngine.from_engine_args(vllm.EngineArgs(**args))
        self.steps = 0  # engine steps run so far

    def load(self, weights: list[tuple[str, Any]], version: int, *, initial: bool = False) -> None:
        """Loads `torch_weights(...)` into every worker between engine steps. Refuses an
        out-of-order push (unless `initial`: the weights it starts from); `PartialPushError`
        when a worker took fewer tensors than sent (its weights are mixed: the run must stop)."""
        if not initial:
            check_order(version, self.version)
        loaded = self.llm.collective_rpc(reload_on_worker, args=(weights,))
        short = [f"worker {i}: {n}" for i, n in enumerate(loaded) if n != len(weights)]
        if short:
            raise PartialPushError(
                f"weight push of policy version {version}: vLLM loaded fewer than the "
                f"{len(weights)} tensors sent ({', '.join(short)})"
            )
        self.llm.reset_prefix_cache(reset_running_requests=self.on_push == "recompute")
        self.version = version

    def prepare(self, params: Any, version: int | None = None) -> list[tuple[str, Any]]:
        """Policy params checked whole (`PartialPushError`) as host tensors for `load`."""
        check_complete(params, self.signature, version=version)
        return torch_weights(params, self.config)

    def update_weights(self, params: Any, version: int, *, initial: bool = False) -> None:
        """`load(prepare(params))`; `initial`: the params it starts from (any version)."""
        self.load(self.prepare(params, version), version, initial=initial)

    def sampling_params(self, request: GroupRequest, sample_index: int) -> Any:
        """vLLM's `SamplingParams` of one sample, seeded `request_seed(request.seed, sample)`."""
        from vllm.sampling_params import RequestOutputKind

        s = request.sampling
        return self._vllm.SamplingParams(
            n=1,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else -1,
            max_tokens=request.max_new_tokens,
            stop_token_ids=list(request.stop_token_ids),
            seed=request_seed(request.seed, sample_index),
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def scheduler(self) -> VllmScheduler:
        """A `VllmScheduler` of this engine at its version (what `rollout.generate` drives)."""
        return VllmScheduler(self, version=self.version)


class VllmScheduler:
    """`VllmEngine` behind `Scheduler`'s interface (`RolloutStream(None, scheduler=...)`), with
    our scheduler's groups and samples (`host.sequences.Group`, `Seq`)."""

    parked = 0
    """No multi-turn episodes (`rollout.turns`) here."""

    def __init__(self, engine: VllmEngine, *, version: int = 0) -> None:
        self.engine = engine
        engine.version = version
        self._waiting: collections.deque[Group] = collections.deque()
        self._live: dict[str, Seq] = {}
        self._ids = itertools.count()

    # ---- queue ----------------------------------------------------------------------------

    def check(self, request: GroupRequest) -> None:
        """Raises `RequestError` past `max_model_len`, or for budget forcing or multi-turn."""
        limit = int(self.engine.args["max_model_len"])
        if len(request.prompt) + request.max_new_tokens > limit:
            raise RequestError(
                f"prompt of {len(request.prompt)} tokens + max_new_tokens="
                f"{request.max_new_tokens} exceed vLLM's max_model_len={limit}"
            )
        if request.interrupt is not None or request.turns is not None:
            raise RequestError(
                "budget forcing (rollout.interrupt) and multi-turn environments (env.name) are "
                "not supported by rollout.backend: vllm; use rollout.backend: jetstream"
            )

    def prepare(self, params: Any) -> list[tuple[str, Any]]:  # off the driver thread
        return self.engine.prepare(params)

    def add(self, request: GroupRequest, *, checked: bool = False) -> None:
        """Queues a request, checked now unless its submitter did."""
        if not checked:
            self.check(request)
        enqueue(self._waiting, request)

    def set_params(self, weights: list[tuple[str, Any]], version: int) -> None:
        self.engine.load(weights, version)
        if self.engine.on_push == "recompute":  # vLLM recomputes their KV with these weights
            for seq in self._live.values():
                seq.prompt_version = version

    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def waiting(self) -> int:
        """Groups not fully handed to vLLM."""
        return len(self._waiting)

    @property
    def live(self) -> int:
        """Samples in vLLM (queued there or generating)."""
        return len(self._live)

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._live

    # ---- driving --------------------------------------------------------------------------

    def _admit(self) -> None:
        """Hands waiting samples to vLLM while fewer than `max_slots` are in it."""
        from vllm.inputs import TokensPrompt

        while self._waiting and len(self._live) < self.engine.max_slots:
            group = self._waiting[0]
            req, n = group.request, next(self._ids)
            prompt = TokensPrompt(
                prompt_token_ids=list(req.prompt), cache_salt=f"policy-{self.version}"
            )
            sampling = self.engine.sampling_params(req, group.next_sample)
            self.engine.llm.add_request(str(n), prompt, sampling)
            self._live[str(n)] = Seq(group, group.next_sample, n, self.version)
            group.next_sample += 1
            if group.next_sample == req.num_samples:
                self._waiting.popleft()

    def step(self, *, admit: bool = True) -> Finished:
        """Admits waiting samples (if `admit`), then runs engine steps until `decode_chunk` have
        run, a sample finished while others wait, or vLLM is empty. Returns completed groups."""
        if admit:
            self._admit()
        finished: Finished = []
        for _ in range(self.engine.chunk):
            if not self._live:
                break
            ended = self._collect(self.engine.llm.step())
            self.engine.steps += 1
            for seq, reason in ended:
                finished += seq.group.finish(seq, reason)
            if ended and admit and self._waiting:
                break  # refill the freed slots at the next boundary
        return finished

    def run(self) -> Finished:  # every completed group, in completion order
        results: Finished = []
        while not self.idle:
            results += self.step()
        return results

    def _collect(self, outputs: list[Any]) -> list[tuple[Seq, str]]:
        """Appends each live sample's new tokens; returns (sample, finish reason) of those ended."""
        ended = []
        for out in outputs:
            seq = self._live.get(out.request_id)
            if seq is None:
                continue
            (c,) = out.outputs
            new = list(c.token_ids)
            logprobs = [float(step[t].logprob) for step, t in zip(c.logprobs or [], new)]
            if len(logprobs) != len(new):
                raise RuntimeError(
                    f"vLLM returned {len(new)} tokens but {len(logprobs)} log-probs for a sample"
                )
            seq.sampled_tokens(new, logprobs, self.version)
            if out.finished:
                del self._live[out.request_id]
                reason = c.finish_reason
                if reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM ended a sample with finish_reason={reason!r}")
                ended.append((seq, reason))
        return ended


def build_scheduler(cfg: RolloutConfig, model: Model, mesh: Mesh | None, *, max_len: int | None,
                    version: int = 0) -> VllmScheduler:  # fmt: skip
    """`rollout.backend: vllm`'s scheduler: a `VllmEngine` of `cfg` (the `rollout:` section)
    serving `model` in its compute dtype, tensor-parallel over the mesh's `tensor` axis, built
    from `model.path`, then `model.params` pushed into it as policy `version`."""
    tensor = 1 if mesh is None else int(dict(mesh.shape).get("tensor", 1))
    dtype = jax.numpy.dtype(model.compute_dtype)
    max_len = max_len or model.config.max_position_embeddings
    kv = kv_cache_bytes(
        model.config, dtype_bytes=dtype.itemsize, max_slots=cfg.max_slots, max_len=max_len,
        page_size=cfg.page_size, kv_pages=cfg.kv_pages, kv_cache_gib=cfg.kv_cache_gib,
        tensor_parallel=tensor,
    )  # fmt: skip
    args = engine_args(
        model, dtype=dtype.name, max_slots=cfg.max_slots, max_len=max_len,
        kv_cache_memory_bytes=kv, prefill_chunk=cfg.prefill_chunk, tensor_parallel=tensor,
    )  # fmt: skip
    engine = VllmEngine(model, args, chunk=cfg.decode_chunk, on_push=cfg.on_push)
    engine.update_weights(model.params, version, initial=True)  # not the disk's: these
    return VllmScheduler(engine, version=version)
