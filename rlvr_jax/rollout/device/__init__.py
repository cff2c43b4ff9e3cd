"""The engine's device half: the static spec, the decode state and the jitted functions over
it (prefill, decode, paged writes, sampling), and the KV layouts' geometry. Nothing here imports
`rlvr_jax.rollout.host`."""
