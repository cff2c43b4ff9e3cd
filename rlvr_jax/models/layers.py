"""Decoder building blocks (Flax linen), written as einsums over named dimensions.

Letters: B batch, T query time, S key time, D model, N query heads, K key/value heads,
G = N / K query heads per key/value head, H head dim, F MLP width, V vocab.

Every parameter carries logical axis names (`nn.with_logical_partitioning`); every key
activation is constrained with `rlvr_jax.sharding.constrain` (a no-op without a mesh).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rlvr_jax import sharding
from rlvr_jax.models import lora, rope
from rlvr_jax.models.config import ArchConfig
from rlvr_jax.models.quant import dense
from rlvr_jax.models.swiglu import swiglu_hidden

Dtype = Any

NEG_INF = float(jnp.finfo(jnp.float32).min)
"""The masked-out score of every attention (the engine's and the blockwise kernel's too)."""


def _lead(x: jax.Array, ndim: int) -> jax.Array:
    """`x` with leading unit dims added up to `ndim` (explicit broadcasting)."""
    return x.reshape((1,) * (ndim - x.ndim) + x.shape)


def rms_norm(x: jax.Array, scale: jax.Array, *, eps: float, weight_in_fp32: bool) -> jax.Array:
    """RMSNorm over the trailing `scale.ndim` axes of `x` in fp32, as HF: `weight_in_fp32`
    (OLMo) scales before casting back to `x.dtype`, else (Llama/Qwen) after."""
    axes = tuple(range(x.ndim - scale.ndim, x.ndim))
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=axes, keepdims=True) + eps)
    if weight_in_fp32:
        return (_lead(scale.astype(jnp.float32), x.ndim) * normed).astype(x.dtype)
    return _lead(scale.astype(x.dtype), x.ndim) * normed.astype(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale of `shape` (the trailing dims it normalises over)."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    eps: float
    weight_in_fp32: bool
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param(
            "scale",
            nn.with_logical_partitioning(nn.initializers.ones_init(), self.axes),
            self.shape,
            self.param_dtype,
        )
        return rms_norm(x, scale, eps=self.eps, weight_in_fp32=self.weight_in_fp32)


class Einsum(nn.Module):
    """`einsum(equation, x, kernel)` + bias (the kernel's trailing `out_dims` dims) + the LoRA
    term when the params hold an adapter beside the kernel (`lora.delta`)."""

    equation: str
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    out_dims: int
    use_bias: bool
    init_std: float
    compute_dtype: Dtype
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel, bias = _projection_params(self, self.out_dims)
        cdt = self.compute_dtype
        y = jnp.einsum(self.equation, x.astype(cdt), dense(kernel, cdt))
        adapter = self.get_variable("params", lora.KEY)
        if adapter is not None:
            y = y + lora.delta(x, adapter, cdt)
        if bias is not None:
            y = y + _lead(bias.astype(self.compute_dtype), y.ndim)
        return y


def _projection_params(module: Any, out_dims: int) -> tuple[jax.Array, jax.Array | None]:
    """ "kernel" ~ N(0, init_std) of `module.shape` and, with `module.use_bias`, a zero "bias"
    over the trailing `out_dims` dims (names and logical axes of every projection)."""
    kernel = module.param(
        "kernel",
        nn.with_logical_partitioning(nn.initializers.normal(module.init_std), module.axes),
        module.shape,
        module.param_dtype,
    )
    if not module.use_bias:
        return kernel, None
    bias = module.param(
        "bias",
        nn.with_logical_partitioning(nn.initializers.zeros_init(), module.axes[-out_dims:]),
        module.shape[-out_dims:],
        module.param_dtype,
    )
    return kernel, bias


def log_softmax_parts(x_NxV: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(max [..., 1], exp(x − max) [..., V], log Σ exp(x − max) [...]) of fp32 logits over
    the last axis: the log-softmax the sampler and the learner both compute (one formula, so
    one rounding: log p(v) = x_v − max − log_z, `target_logprobs`). The max is held constant
    for the gradient (log p does not depend on it)."""
    max_Nx1 = jax.lax.stop_gradient(jnp.max(x_NxV, axis=-1, keepdims=True))
    p_NxV = jnp.exp(x_NxV - max_Nx1)
    return max_Nx1, p_NxV, jnp.log(jnp.sum(p_NxV, axis=-1))


def target_logprobs(x_NxV: jax.Array, targets_N: jax.Array) -> jax.Array:
    """log softmax(x)[target] per row, as `log_softmax_parts` computes it."""
    max_Nx1, _, log_z_N = log_softmax_parts(x_NxV)
    x_tok_N = jnp.take_along_axis(x_NxV, targets_N[..., None], axis=-1)[..., 0]
    return x_tok_N - max_Nx1[..., 0] - log_z_N


def same_segment(seg_q: jax.Array, seg_k: jax.Array, branches: int = 1) -> jax.Array:
    """Whether a query of segment `seg_q` may see a key of segment `seg_k` (broadcast): the
    same id; with `branches` > 1 (shared-prompt rows: id = group · branches + branch, branch 0
    the group's prompt, branch j + 1 its j-th completion) also any key of the query's group's
    prompt, so the G completions of a prompt share one copy of it."""
    if branches == 1:
        return seg_q == seg_k
    same_group = seg_q // branches == seg_k // branches
    return same_group & ((seg_k % branches == 0) | (seg_q == seg_k))


def segment_masks(
    segment_ids_BxT: jax.Array, sliding_window: int | None, branches: int = 1
) -> tuple[jax.Array, jax.Array | None]:
    """(full, sliding) boolean masks [B, T, T]: query t sees key s iff s <= t and
    `same_segment`; sliding also t - s < W (HF's `kv_idx > q_idx - W`). Every query sees
    itself, so no softmax row is empty."""
    t = segment_ids_BxT.shape[1]
    idx = jnp.arange(t)
    causal_1xTxT = (idx[:, None] >= idx[None, :])[None]
    same_BxTxT = same_segment(segment_ids_BxT[:, :, None], segment_ids_BxT[:, None, :], branches)
    full_BxTxT = causal_1xTxT & same_BxTxT
    if sliding_window is None:
        return full_BxTxT, None
    near_1xTxT = (idx[:, None] - idx[None, :] < sliding_window)[None]
    return full_BxTxT, full_BxTxT & near_1xTxT


def cache_masks(
    positions_B: jax.Array, max_len_S: int, sliding_window: int | None
) -> tuple[jax.Array, jax.Array | None]:
    """(full, sliding) masks [B, 1, S] of one decode step: a row at position p sees cache
    slots s <= p (slot index == token position), and on sliding layers only s > p - W."""
    idx_1xS = jnp.arange(max_len_S)[None, :]
    pos_Bx1 = positions_B[:, None]
    full_Bx1xS = (idx_1xS <= pos_Bx1)[:, None, :]
    if sliding_window is None:
        return full_Bx1xS, None
    return full_Bx1xS, full_Bx1xS & (idx_1xS > pos_Bx1 - sliding_window)[:, None, :]


def attend(
    q_BxTxNxH: jax.Array,
    k_BxSxKxH: jax.Array,
    v_BxSxKxH: jax.Array,
    mask_BxTxS: jax.Array,
    *,
    q_chunk: int = 0,
) -> jax.Array:
    """Grouped-query attention (query head n uses kv head n // G), fp32 scores, softmax and
    values (as the decode engine), the output in q's dtype. `q_chunk` > 0 (dividing T) takes
    the queries that many at a time, each chunk rematerialised in the backward, so only
    N·q_chunk·S scores live at once; the result is the same."""
    t = q_BxTxNxH.shape[1]
    if q_chunk and t > q_chunk and t % q_chunk == 0:
        return _attend_chunked(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask_BxTxS, q_chunk)
    return _attend(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask_BxTxS)


def _attend_chunked(
    q_BxTxNxH: jax.Array,
    k_BxSxKxH: jax.Array,
    v_BxSxKxH: jax.Array,
    mask_BxTxS: jax.Array,
    chunk: int,
) -> jax.Array:
    b, t, n, h = q_BxTxNxH.shape
    c = t // chunk
    q_CxBxcxNxH = q_BxTxNxH.reshape(b, c, chunk, n, h).swapaxes(0, 1)
    mask_CxBxcxS = mask_BxTxS.reshape(b, c, chunk, -1).swapaxes(0, 1)

    @jax.checkpoint
    def one(args):
        q, mask = args
        return _attend(q, k_BxSxKxH, v_BxSxKxH, mask)

    out_CxBxcxNxH = jax.lax.map(one, (q_CxBxcxNxH, mask_CxBxcxS))
    return out_CxBxcxNxH.swapaxes(0, 1).reshape(b, t, n, h)


def _attend(
    q_BxTxNxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array, mask_BxTxS: jax.Array
) -> jax.Array:
    b, t, n, h = q_BxTxNxH.shape
    k = k_BxSxKxH.shape[2]
    q_BxTxKxGxH = q_BxTxNxH.reshape(b, t, k, n // k, h)
    scores_BxKxGxTxS = jnp.einsum(
        "BTKGH,BSKH->BKGTS", q_BxTxKxGxH, k_BxSxKxH, preferred_element_type=jnp.float32
    ) * (h**-0.5)
    scores_BxKxGxTxS = jnp.where(mask_BxTxS[:, None, None], scores_BxKxGxTxS, NEG_INF)
    probs_BxKxGxTxS = jax.nn.softmax(scores_BxKxGxTxS, axis=-1)
    # fp32 probabilities and values, as the decode engine attends (its cached K/V upcast)
    v32_BxSxKxH = v_BxSxKxH.astype(jnp.float32)
    out_BxTxKxGxH = jnp.einsum("BKGTS,BSKH->BTKGH", probs_BxKxGxTxS, v32_BxSxKxH)
    return out_BxTxKxGxH.reshape(b, t, n, h).astype(q_BxTxNxH.dtype)


class QKVProjection(nn.Module):
    """q, k, v of a layer: projections (+ bias), q/k RMSNorm, RoPE."""

    config: ArchConfig
    compute_dtype: Dtype
    param_dtype: Dtype
    mesh: Mesh | None = None
    rules: sharding.Rules | None = None

    @nn.compact
    def __call__(
        self, x_BxTxD: jax.Array, cos_BxTxH2: jax.Array, sin_BxTxH2: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        cfg = self.config
        d, n, k, h = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        common = dict(
            out_dims=2,
            use_bias=cfg.qkv_bias,
            init_std=cfg.init_std,
            compute_dtype=self.compute_dtype,
            param_dtype=self.param_dtype,
        )
        q_BxTxNxH = Einsum(
            "BTD,DNH->BTNH", (d, n, h), ("embed", "heads", "head_dim"), name="q_proj", **common
        )(x_BxTxD)
        kv_axes = ("embed", "kv_heads", "head_dim")
        k_BxTxKxH = Einsum("BTD,DKH->BTKH", (d, k, h), kv_axes, name="k_proj", **common)(x_BxTxD)
        v_BxTxKxH = Einsum("BTD,DKH->BTKH", (d, k, h), kv_axes, name="v_proj", **common)(x_BxTxD)
        if cfg.qk_norm is not None:
            norm = dict(
                eps=cfg.norm_eps,
                weight_in_fp32=cfg.norm_weight_in_fp32,
                param_dtype=self.param_dtype,
            )
            if cfg.qk_norm == "full":  # OLMo: over the whole projection, all heads at once
                q_shape, q_axes, k_shape, k_axes = (
                    (n, h),
                    ("heads", "head_dim"),
                    (k, h),
                    kv_axes[1:],
                )
            else:  # Qwen3: over each head's H features
                q_shape, q_axes, k_shape, k_axes = (h,), ("head_dim",), (h,), ("head_dim",)
            q_BxTxNxH = RMSNorm(q_shape, q_axes, name="q_norm", **norm)(q_BxTxNxH)
            k_BxTxKxH = RMSNorm(k_shape, k_axes, name="k_norm", **norm)(k_BxTxKxH)
        q_BxTxNxH = rope.apply_rope(q_BxTxNxH, cos_BxTxH2, sin_BxTxH2)
        k_BxTxKxH = rope.apply_rope(k_BxTxKxH, cos_BxTxH2, sin_BxTxH2)
        heads = ("batch", "activation_length", "activation_heads", "head_dim")
        kv_heads = ("batch", "activation_length", "activation_kv_heads", "head_dim")
        return (
            sharding.constrain(q_BxTxNxH, heads, self.mesh, self.rules),
            sharding.constrain(k_BxTxKxH, kv_heads, self.mesh, self.rules),
            sharding.constrain(v_BxTxKxH, kv_heads, self.mesh, self.rules),
        )


class OutProjection(nn.Module):
    """Attention output projection [N, H] -> D."""

    config: ArchConfig
    compute_dtype: Dtype
    param_dtype: Dtype

    @nn.compact
    def __call__(self, attn_BxTxNxH: jax.Array) -> jax.Array:
        cfg = self.config
        return Einsum(
            "BTNH,NHD->BTD",
            (cfg.n_heads, cfg.head_dim, cfg.d_model),
            ("heads", "head_dim", "embed"),
            out_dims=1,
            use_bias=cfg.o_bias,
            init_std=cfg.init_std,
            compute_dtype=self.compute_dtype,
            param_dtype=self.param_dtype,
            name="o_proj",
        )(attn_BxTxNxH)


class Projection(nn.Module):
    """The params of one projection (kernel of `shape`, optional bias on its last dim, the
    LoRA adapter when the params hold one), for callers that do the math themselves; same
    names and init as `Einsum`."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    use_bias: bool
    init_std: float
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self) -> tuple[jax.Array, jax.Array | None, lora.Adapter | None]:
        return (*_projection_params(self, 1), self.get_variable("params", lora.KEY))


class Mlp(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); gate and up as one stacked matmul with a custom
    backward (`rlvr_jax.models.swiglu`), or, with LoRA adapters on them, plain autodiff (the
    frozen kernels then get no weight gradient at all)."""

    config: ArchConfig
    compute_dtype: Dtype
    param_dtype: Dtype
    mesh: Mesh | None = None
    rules: sharding.Rules | None = None

    @nn.compact
    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        cfg = self.config
        d, f, cdt = cfg.d_model, cfg.d_ff, self.compute_dtype
        proj = dict(
            shape=(d, f),
            axes=("embed", "mlp"),
            use_bias=cfg.mlp_bias,
            init_std=cfg.init_std,
            param_dtype=self.param_dtype,
        )
        w_gate, b_gate, a_gate = Projection(name="gate_proj", **proj)()
        w_up, b_up, a_up = Projection(name="up_proj", **proj)()
        w_CxDxF = jnp.stack([dense(w_gate, cdt), dense(w_up, cdt)])
        b_CxF = None if b_gate is None else jnp.stack([b_gate, b_up]).astype(cdt)
        x_BxTxD = x_BxTxD.astype(cdt)
        if a_gate is None and a_up is None:
            hidden_BxTxF = swiglu_hidden(x_BxTxD, w_CxDxF, b_CxF)
        else:
            gu_BxTxCxF = jnp.einsum("BTD,CDF->BTCF", x_BxTxD, w_CxDxF)
            if b_CxF is not None:
                gu_BxTxCxF = gu_BxTxCxF + b_CxF[None, None]
            deltas = [0.0 if a is None else lora.delta(x_BxTxD, a, cdt) for a in (a_gate, a_up)]
            gate_BxTxF, up_BxTxF = gu_BxTxCxF[:, :, 0] + deltas[0], gu_BxTxCxF[:, :, 1] + deltas[1]
            hidden_BxTxF = jax.nn.silu(gate_BxTxF) * up_BxTxF
        hidden_BxTxF = sharding.constrain(
            hidden_BxTxF,
            ("batch", "activation_length", "activation_mlp"),
            self.mesh,
            self.rules,
        )
        return Einsum(
            "BTF,FD->BTD",
            (f, d),
            ("mlp", "embed"),
            out_dims=1,
            use_bias=cfg.mlp_bias,
            init_std=cfg.init_std,
            compute_dtype=cdt,
            param_dtype=self.param_dtype,
            name="down_proj",
        )(hidden_BxTxF)
