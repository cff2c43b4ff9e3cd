"""The rest of the recipe: SFT, expert iteration and RL + SFT parallel averaging.

    rlvr-train --config F algorithm=sft                 # sft.sources (or data.sources)
    rlvr-train --config F algorithm=expert_iteration    # data.sources, verified samples
    rlvr-train --config F algorithm=rl_sft_parallel     # both

- `sft_data`: SFT examples (rows with a response, or the synthetic reference solution) and
  their batches.
- `expert`: keeping the verified-correct sampled completions.
- `parallel`: the pure parallel-averaging step (two optimizers' updates averaged).

The loop, sources and steps that run them are `rlvr_jax.training.loop`'s.
"""

from rlvr_jax.training.recipes.expert import expert_examples, expert_metrics, kept_mask
from rlvr_jax.training.recipes.parallel import init_parallel_state, make_parallel_step
from rlvr_jax.training.recipes.sft_data import (
    SFTBatcher,
    build_sft_iterator,
    encode_example,
    encode_response,
    response_reader,
)

__all__ = [
    "SFTBatcher",
    "build_sft_iterator",
    "encode_example",
    "encode_response",
    "expert_examples",
    "expert_metrics",
    "init_parallel_state",
    "kept_mask",
    "make_parallel_step",
    "response_reader",
]
