"""rlvr_jax: reinforcement learning from verifiable rewards, JAX-native end to end.

Importing the package is light: TensorFlow, JetStream, torch and vLLM are imported only by the
modules that need them, when they are used. Subpackages: `config`, `models`, `sharding`,
`losses`, `rollout`, `rewards`, `data`, `training`, `eval`, `bench`.
"""

__version__ = "0.1.0"
