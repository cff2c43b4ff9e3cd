"""Actor backends other than our engine, each in one module (`vllm`: vLLM's engine, driven step
by step). Which backend honours which `rollout:` key: `rlvr_jax.rollout.capabilities`."""
