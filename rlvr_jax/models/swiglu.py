"""SwiGLU's gate/up half, `silu(x·W_gate + b_gate) * (x·W_up + b_up)`, with a hand-written
backward laid out for XLA.

Why (measured on XLA:CPU, `rlvr-bench learner` at the demo model's size): under autodiff the
two projections are two matmuls whose weight gradients `xᵀ·dg`, `xᵀ·du` XLA:CPU computes
with dg / du transposed to [F, B·T] — a loop fusion that recomputes SiLU's backward while
writing in transposed layout, the step's single most expensive op — and a second fusion
computes the same dg in natural layout for `dx`. Here:
- the gate and up kernels run as one matmul over the stacked [2, D, F] weights (stacked, not
  concatenated, so that a tensor-parallel split of F stays local);
- the backward computes [dg, du] once, elementwise, in natural layout;
- dx is one matmul against the stacked weights; the weight gradient is formed as
  `[dg, du]ᵀ · x` behind an optimisation barrier (XLA would otherwise fold the transpose
  back into `xᵀ · [dg, du]`), so that the operand XLA lays out for the matmul is x ([B·T, D],
  D < F) and the result only needs a small [2, F, D] → [2, D, F] transpose.
Residuals are x and the pre-activations [B, T, 2, F] (autodiff keeps the same).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def swiglu_hidden(
    x_BxTxD: jax.Array, w_CxDxF: jax.Array, b_CxF: jax.Array | None = None
) -> jax.Array:
    """silu(gate) * up [B, T, F]; `w_CxDxF` stacks (W_gate, W_up), `b_CxF` their biases.
    Computed in the dtype of x and w (cast them first); differentiable in all three."""
    if b_CxF is None:
        return _swiglu(x_BxTxD, w_CxDxF)
    return _swiglu_bias(x_BxTxD, w_CxDxF, b_CxF)


def _pre(x_BxTxD, w_CxDxF, b_CxF):
    gu_BxTxCxF = jnp.einsum("BTD,CDF->BTCF", x_BxTxD, w_CxDxF)
    if b_CxF is not None:
        gu_BxTxCxF = gu_BxTxCxF + b_CxF[None, None]
    return gu_BxTxCxF


def _act(gu_BxTxCxF):
    g, u = gu_BxTxCxF[:, :, 0], gu_BxTxCxF[:, :, 1]
    return jax.nn.silu(g) * u


def _grads(x_BxTxD, w_CxDxF, gu_BxTxCxF, dh_BxTxF):
    g, u = gu_BxTxCxF[:, :, 0], gu_BxTxCxF[:, :, 1]
    sig = jax.nn.sigmoid(g)
    # d silu(g) / dg = σ(g) (1 + g (1 − σ(g)))
    dg = dh_BxTxF * u * (sig * (1 + g * (1 - sig)))
    du = dh_BxTxF * (g * sig)
    dgu_BxTxCxF = jnp.stack([dg, du], axis=2)
    dx_BxTxD = jnp.einsum("BTCF,CDF->BTD", dgu_BxTxCxF, w_CxDxF)
    dw_CxFxD = jax.lax.optimization_barrier(jnp.einsum("BTCF,BTD->CFD", dgu_BxTxCxF, x_BxTxD))
    return dx_BxTxD, jnp.swapaxes(dw_CxFxD, 1, 2), dgu_BxTxCxF


@jax.custom_vjp
def _swiglu(x_BxTxD, w_CxDxF):
    return _act(_pre(x_BxTxD, w_CxDxF, None))


def _swiglu_fwd(x_BxTxD, w_CxDxF):
    gu = _pre(x_BxTxD, w_CxDxF, None)
    return _act(gu), (x_BxTxD, w_CxDxF, gu)


def _swiglu_bwd(res, dh_BxTxF):
    dx, dw, _ = _grads(*res, dh_BxTxF)
    return dx, dw


_swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


@jax.custom_vjp
def _swiglu_bias(x_BxTxD, w_CxDxF, b_CxF):
    return _act(_pre(x_BxTxD, w_CxDxF, b_CxF))


def _swiglu_bias_fwd(x_BxTxD, w_CxDxF, b_CxF):
    gu = _pre(x_BxTxD, w_CxDxF, b_CxF)
    return _act(gu), (x_BxTxD, w_CxDxF, gu)


def _swiglu_bias_bwd(res, dh_BxTxF):
    dx, dw, dgu = _grads(*res, dh_BxTxF)
    return dx, dw, dgu.sum(axis=(0, 1))


_swiglu_bias.defvjp(_swiglu_bias_fwd, _swiglu_bias_bwd)
