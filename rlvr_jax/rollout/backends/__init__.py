"""Other engines behind the same rollout interface: the JetStream adapter over our engine and
vLLM (each imports its heavy dependency only when built)."""
