"""Learner step, RL loop (sync/async), SFT, checkpointing, metrics, and the dry-run plan."""
