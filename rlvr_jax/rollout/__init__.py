"""The rollout engine: a continuous-batching inference engine for the Flax policy.

The one entry point every sampler uses (training, in-loop evaluation, `rlvr-eval`,
`rlvr-filter`, `rlvr-prefs`, `rlvr-serve`)::

    rollout = build_rollout(cfg.rollout, model, actor_mesh, tokenizer, max_len=S).start()
    groups = sample_groups(rollout, prompts, num_samples=8, seed=0)   # or submit/get below
    rollout.update_weights(params, version); rollout.kv_metrics(); rollout.close()

`Rollout` is the protocol (`rlvr_jax.rollout.builder`); `build_rollout` is the only reader of
the config's engine keys (`engine_kwargs(cfg.rollout)` maps them for `EngineCore`).

Device half (plain JAX, runs without TensorFlow or JetStream):
- `EngineCore(model, *, max_slots, max_len, mesh=None, rules=None, chunk=8,
  cache_dtype=None, max_stop_ids=8, kv_layout="paged", page_size=16, kv_pages=None,
  kv_cache_gib=None, prefill_chunk=512, attention="auto")` (or `make_engine_core(...)`;
  `engine_kwargs(cfg.rollout)` maps the config's keys): the policy's params in decode layout,
  tensor-parallel on the actor mesh; a paged KV cache (a pool of pages with its own budget,
  decode reading only live pages, chunked prefill, copy-on-write prefix sharing, preemption
  by recompute; `kv_layout="contiguous"` keeps a fixed row per slot) or the contiguous one;
  `generate` runs up to `chunk` decode steps per call in a `while_loop`, state donated,
  sampling in-step: greedy / temperature / top-k / top-p, keyed by (request seed, sample
  index, position). `compile_ahead()` compiles every program before first use.
- `make_engine(model, *, max_slots, max_len, mesh=None, tokenizer_path=None, sampling=...,
  stop_token_ids=None, seed=0, **core_kwargs)`: the same core behind JetStream 0.2.2's
  `engine_api.Engine` (imports JetStream then, behind `jetstream_compat`'s shim); its
  `build_tokenizer` wraps our HF tokenizer. `engine.core` is the `EngineCore`.

Host half:
- `generate(model_or_engine, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0,
  top_k=0, num_samples=1, stop_token_ids=(), seed=0, batching="continuous",
  max_slots=None) -> list[Completion]`, ordered by (prompt_index, sample_index).
  `Completion(prompt_index, sample_index, tokens, logprobs, finish_reason,
  policy_versions, sampled)`: tokens include the stop token that ended them; finish_reason is
  "stop" or "length"; one policy version per token. Prompt i samples with seed
  `request_seed(seed, i)`. `batching="static"` is the baseline (a batch runs until its
  longest member ends); the tokens are the same either way. `interrupt=Interrupt(budget,
  tokens, answer_budget)` (also `GroupRequest.interrupt`, `RolloutStream(interrupt=...)`)
  forces `tokens` into a completion that reaches `budget` generated tokens, then lets it
  answer (`rlvr_jax.rollout.interrupt`, budget forcing); `Completion.sampled` marks them.
  `GroupRequest.turns` (a `rollout.turns.TurnHook`, e.g. an `rlvr_jax.envs.EnvGroup`; also
  `submit(..., turns=...)`) runs each sample as a multi-turn episode: a stopped sample is
  parked and the hook's response appended to it in place (`sampled=False`), then it resumes.

The trainer's interface, `RolloutStream` (requests in continuously, completed groups out
as soon as all their samples finish, weights swapped in flight)::

    stream = RolloutStream(engine, max_new_tokens=256, sampling=SamplingParams(1.0),
                           stop_token_ids=eos_ids, max_pending_groups=64,
                           max_ready_groups=64).start()
    stream.submit(request_id, prompt_tokens, num_samples=8, seed=s, meta=row)  # blocks if full
    group = stream.get(timeout=None)    # CompletedGroup(request_id, meta, completions,
                                        #                prompt_tokens); samples in order
    stream.update_weights(params, version)  # any thread; learner mesh -> actor mesh now,
                                            # swapped at the next chunk boundary, KV kept
    stream.stop()

`submit_future(...)` returns a `concurrent.futures.Future` instead of queueing for `get`;
its `on_tokens=fn` streams: `fn(sample_index, tokens, logprobs)` is called on the driver thread
after every decode chunk with each live sample's new tokens (`GroupRequest.on_tokens`, called
by the `Scheduler`; the stop token included; quick and never raising).
A driver-thread failure is re-raised by `get` / `submit` / `step` as `RolloutError` (the
original as `__cause__`). Without `start()`, `stream.step()` drives one chunk on the
caller's thread and returns the groups it completed: multi-process runs must do this in
lockstep (every process issues the same device computations in the same order).

Other backends and front ends: `rlvr_jax.rollout.vllm_backend.VllmRollout` (GPU, extra
`vllm`; `hf_weights` exports params under HF names), and `rlvr-serve` (`rlvr_jax.serve`:
JetStream gRPC + OpenAI HTTP with streaming). Importing this package
imports neither TensorFlow, JetStream, torch nor vLLM.
"""

from rlvr_jax.rollout.builder import (
    Rollout,
    build_rollout,
    engine_kwargs,
    sample_groups,
    sampling_params,
)
from rlvr_jax.rollout.core import EngineSpec
from rlvr_jax.rollout.engine import EngineCore, RequestError, SlotRequest, make_engine_core
from rlvr_jax.rollout.generation import generate, request_seed
from rlvr_jax.rollout.interrupt import Interrupt
from rlvr_jax.rollout.jetstream_engine import make_engine
from rlvr_jax.rollout.sampling import SamplingParams
from rlvr_jax.rollout.scheduler import Completion, GroupRequest, Scheduler, SchedulerStats
from rlvr_jax.rollout.stream import CompletedGroup, RolloutError, RolloutStream

__all__ = [
    "CompletedGroup",
    "Completion",
    "EngineCore",
    "EngineSpec",
    "GroupRequest",
    "Interrupt",
    "RequestError",
    "Rollout",
    "RolloutError",
    "RolloutStream",
    "SamplingParams",
    "Scheduler",
    "SchedulerStats",
    "SlotRequest",
    "build_rollout",
    "engine_kwargs",
    "generate",
    "make_engine",
    "make_engine_core",
    "request_seed",
    "sample_groups",
    "sampling_params",
]
