"""Evaluation: the unbiased pass@k estimator and held-out evaluation of a policy."""

from rlvr_jax.eval.passk import mean_pass_at_k, pass_at_k

__all__ = ["mean_pass_at_k", "pass_at_k"]
