"""SwiGLU's hand-written backward (`rlvr_jax.models.swiglu`) equals autodiff of the plain
formula silu(x·W_g + b_g) * (x·W_u + b_u), in fp32 and bf16, with and without biases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.models.swiglu import swiglu_hidden


def plain(x, w_CxDxF, b_CxF):
    g = jnp.einsum("BTD,DF->BTF", x, w_CxDxF[0])
    u = jnp.einsum("BTD,DF->BTF", x, w_CxDxF[1])
    if b_CxF is not None:
        g, u = g + b_CxF[0][None, None], u + b_CxF[1][None, None]
    return jax.nn.silu(g) * u


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("dtype", "atol"), [(jnp.float32, 2e-5), (jnp.bfloat16, 0.1)])
@pytest.mark.slow
def test_swiglu_value_and_gradients_match_autodiff(bias, dtype, atol):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 5, 8)), dtype)
    w = jnp.asarray(0.5 * rng.standard_normal((2, 8, 12)), dtype)
    b = jnp.asarray(rng.standard_normal((2, 12)), dtype) if bias else None
    dh = jnp.asarray(rng.standard_normal((3, 5, 12)), dtype)

    def loss(fn, *args):
        return (fn(*args).astype(jnp.float32) * dh.astype(jnp.float32)).sum()

    argnums = (0, 1, 2) if bias else (0, 1)
    args = (x, w, b)
    ours = jax.grad(lambda *a: loss(swiglu_hidden, *a), argnums=argnums)(*args)
    ref = jax.grad(lambda *a: loss(plain, *a), argnums=argnums)(*args)
    out, expected = swiglu_hidden(*args), plain(*args)
    assert out.dtype == dtype
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(expected, np.float32),
                               rtol=0, atol=atol)  # fmt: skip
    for name, g, r in zip("xwb", ours, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, name
        scale = float(jnp.abs(r.astype(jnp.float32)).max())
        assert scale > 0.1, name
        np.testing.assert_allclose(
            np.asarray(g, np.float32), np.asarray(r, np.float32), rtol=0, atol=atol * scale,
            err_msg=name,
        )  # fmt: skip
