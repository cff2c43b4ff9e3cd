"""Other engines behind the same rollout interface, each in one module: the JetStream adapter
over our engine and vLLM (each imports its heavy dependency only when built). Which backend
honours which `rollout:` key: the capability table, `rlvr_jax.rollout.api`."""
