"""The rollout engine: a continuous-batching inference engine for the Flax policy, in four
layers that import downwards only (docs/engine.md):

    rollout = build_rollout(cfg.rollout, model, actor_mesh, tokenizer, max_len=S).start()
    groups = sample_groups(rollout, prompts, num_samples=8, seed=0)   # or submit/get
    rollout.update_weights(params, version); rollout.kv_metrics(); rollout.close()

- `api`, `builder` (the only reader of `rollout:` keys), `stream`, `generation`, `push`, `engine`;
- `host`: the scheduler, the one owner of the sequences, the page policy, the turns;
- `device`: plain JAX, never importing `host`;
- `backends`: JetStream and vLLM, their dependencies imported only when built.
"""

from rlvr_jax.rollout.api import (
    CompletedGroup,
    Completion,
    GroupRequest,
    Interrupt,
    RequestError,
    Rollout,
    RolloutError,
    SlotRequest,
)
from rlvr_jax.rollout.backends.jetstream import make_engine
from rlvr_jax.rollout.builder import (
    build_engine,
    build_rollout,
    engine_kwargs,
    sample_groups,
    sampling_params,
)
from rlvr_jax.rollout.device.sampling import SamplingParams
from rlvr_jax.rollout.device.state import EngineSpec
from rlvr_jax.rollout.engine import EngineCore
from rlvr_jax.rollout.generation import generate, request_seed, rescore
from rlvr_jax.rollout.host.scheduler import Scheduler, SchedulerStats
from rlvr_jax.rollout.stream import RolloutStream

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
    "request_seed",
    "rescore",
    "sample_groups",
    "sampling_params",
]
