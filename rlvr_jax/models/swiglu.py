"""SwiGLU's gate/up half, `silu(x·W_gate + b_gate) * (x·W_up + b_up)`, with a hand-written
backward laid out for XLA.

Why: under autodiff XLA:CPU computed the weight gradients with dg / du transposed to [F, B·T]
(a fusion recomputing SiLU's backward, the step's most expensive op) and recomputed dg for `dx`.
Here the forward is two natural-layout matmuls (x·W_gate, x·W_up; never strided halves of a
[B, T, 2, F] array, which measured slower), and the backward computes dg and du once behind an
optimisation barrier, then dx = dg·W_gateᵀ + du·W_upᵀ, xᵀ·dg and xᵀ·du as four plain matmuls.
The weights arrive stacked (`w_CxDxF`); a tensor-parallel split of F stays local. Residuals are
x and the pre-activations g, u (as autodiff keeps).
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
    g_BxTxF = jnp.einsum("BTD,DF->BTF", x_BxTxD, w_CxDxF[0])
    u_BxTxF = jnp.einsum("BTD,DF->BTF", x_BxTxD, w_CxDxF[1])
    if b_CxF is not None:
        g_BxTxF, u_BxTxF = g_BxTxF + b_CxF[0][None, None], u_BxTxF + b_CxF[1][None, None]
    return g_BxTxF, u_BxTxF


def _act(g_BxTxF, u_BxTxF):
    return jax.nn.silu(g_BxTxF) * u_BxTxF


def _grads(x_BxTxD, w_CxDxF, g, u, dh_BxTxF):
    sig = jax.nn.sigmoid(g)
    # d silu(g) / dg = σ(g) (1 + g (1 − σ(g)))
    dg = dh_BxTxF * u * (sig * (1 + g * (1 - sig)))
    du = dh_BxTxF * (g * sig)
    dg, du = jax.lax.optimization_barrier((dg, du))
    dx_BxTxD = jnp.einsum("BTF,DF->BTD", dg, w_CxDxF[0]) + jnp.einsum("BTF,DF->BTD", du, w_CxDxF[1])
    dw_CxDxF = jnp.stack(
        [jnp.einsum("BTD,BTF->DF", x_BxTxD, dg), jnp.einsum("BTD,BTF->DF", x_BxTxD, du)]
    )
    return dx_BxTxD, dw_CxDxF, (dg, du)


@jax.custom_vjp
def _swiglu(x_BxTxD, w_CxDxF):
    return _act(*_pre(x_BxTxD, w_CxDxF, None))


def _swiglu_fwd(x_BxTxD, w_CxDxF):
    g, u = _pre(x_BxTxD, w_CxDxF, None)
    return _act(g, u), (x_BxTxD, w_CxDxF, g, u)


def _swiglu_bwd(res, dh_BxTxF):
    dx, dw, _ = _grads(*res, dh_BxTxF)
    return dx, dw


_swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


@jax.custom_vjp
def _swiglu_bias(x_BxTxD, w_CxDxF, b_CxF):
    return _act(*_pre(x_BxTxD, w_CxDxF, b_CxF))


def _swiglu_bias_fwd(x_BxTxD, w_CxDxF, b_CxF):
    g, u = _pre(x_BxTxD, w_CxDxF, b_CxF)
    return _act(g, u), (x_BxTxD, w_CxDxF, g, u)


def _swiglu_bias_bwd(res, dh_BxTxF):
    dx, dw, (dg, du) = _grads(*res, dh_BxTxF)
    return dx, dw, jnp.stack([dg.sum(axis=(0, 1)), du.sum(axis=(0, 1))])


_swiglu_bias.defvjp(_swiglu_bias_fwd, _swiglu_bias_bwd)
