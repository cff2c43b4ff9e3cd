"""The rest of the recipe: SFT, expert iteration and RL + SFT parallel averaging.

    rlvr-train --config F algorithm=sft                 # sft.sources (or data.sources)
    rlvr-train --config F algorithm=expert_iteration    # data.sources, verified samples
    rlvr-train --config F algorithm=rl_sft_parallel     # both

- `sft_data`: SFT examples (rows with a response, or the synthetic reference solution) and
  their batches.
- `expert`: verifying sampled completions and keeping the correct ones.
- `parallel`: the jitted pure parallel-averaging step over a state with two optimizer states.
- `trainers`: `SFTTrainer`, `ExpertIterationTrainer`, `ParallelTrainer` — `RLTrainer`s with
  their own data, learner and loop pieces (same metrics, checkpoints, resume, eval, export).
"""

from rlvr_jax.training.recipes.expert import (
    VerifiedGroup,
    expert_examples,
    expert_metrics,
    kept_mask,
    score_verified,
)
from rlvr_jax.training.recipes.parallel import (
    ParallelState,
    gradient_probe,
    init_parallel_state,
    make_parallel_step,
    probe_gradients,
    update_geometry,
)
from rlvr_jax.training.recipes.sft_data import (
    SFTBatcher,
    build_sft_iterator,
    encode_example,
    encode_response,
    response_reader,
)
from rlvr_jax.training.recipes.trainers import (
    ExpertIterationTrainer,
    ParallelTrainer,
    SFTTrainer,
)

__all__ = [
    "ExpertIterationTrainer",
    "ParallelState",
    "ParallelTrainer",
    "SFTBatcher",
    "SFTTrainer",
    "VerifiedGroup",
    "build_sft_iterator",
    "encode_example",
    "encode_response",
    "expert_examples",
    "expert_metrics",
    "gradient_probe",
    "init_parallel_state",
    "kept_mask",
    "make_parallel_step",
    "probe_gradients",
    "response_reader",
    "score_verified",
    "update_geometry",
]
