"""The rollout engine: a continuous-batching inference engine for the Flax policy.

The one entry point every sampler uses (training, in-loop evaluation, `rlvr-eval`,
`rlvr-filter`, `rlvr-prefs`, `rlvr-serve`)::

    rollout = build_rollout(cfg.rollout, model, actor_mesh, tokenizer, max_len=S).start()
    groups = sample_groups(rollout, prompts, num_samples=8, seed=0)   # or submit/get
    rollout.update_weights(params, version); rollout.kv_metrics(); rollout.close()

`Rollout` is the protocol (`rlvr_jax.rollout.builder`); `build_rollout` is the only reader of
the config's engine keys. Device half (plain JAX, no TensorFlow or JetStream): `EngineCore`
(the policy in decode layout on the actor mesh, paged or contiguous KV cache, `generate` of up
to `chunk` decode steps per call) and `make_engine` (the same core behind JetStream's
`engine_api.Engine`). Host half: `generate`, `Scheduler`, `RolloutStream`. How they work and
their host-side API: docs/engine.md. Importing this package imports neither TensorFlow,
JetStream, torch nor vLLM.
"""

from rlvr_jax.rollout.backends.jetstream import make_engine
from rlvr_jax.rollout.builder import (
    Rollout,
    build_engine,
    build_rollout,
    engine_kwargs,
    sample_groups,
    sampling_params,
)
from rlvr_jax.rollout.device.decode import EngineSpec
from rlvr_jax.rollout.device.sampling import SamplingParams
from rlvr_jax.rollout.engine import EngineCore, RequestError, SlotRequest, make_engine_core
from rlvr_jax.rollout.generation import generate, request_seed, rescore
from rlvr_jax.rollout.host.scheduler import Completion, GroupRequest, Scheduler, SchedulerStats
from rlvr_jax.rollout.interrupt import Interrupt
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
    "build_engine",
    "build_rollout",
    "engine_kwargs",
    "generate",
    "make_engine",
    "make_engine_core",
    "request_seed",
    "rescore",
    "sample_groups",
    "sampling_params",
]
