"""Parameters of a decoder: random init (HF-like), abstract shapes, logical axes, and `apply`.

The params pytree (leaves [L, ...] are stacked over layers):

  embedding [V, D]                                       (vocab, embed)
  layers/attn_norm/scale, layers/mlp_norm/scale [L, D]   (layers, norm)
  layers/attn/q_proj/kernel [L, D, N, H]  (+ bias [L, N, H])
  layers/attn/k_proj/kernel, v_proj/kernel [L, D, K, H]  (+ bias [L, K, H])
  layers/attn/q_norm/scale [L, N, H] (OLMo) or [L, H] (Qwen3); k_norm likewise with K
  layers/attn_out/o_proj/kernel [L, N, H, D]  (+ bias [L, D])
  layers/mlp/{gate,up}_proj/kernel [L, D, F], layers/mlp/down_proj/kernel [L, F, D]
  final_norm/scale [D]
  lm_head [D, V]                                         (untied only)
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rlvr_jax.models import lora
from rlvr_jax.models.config import ArchConfig
from rlvr_jax.models.decoder import Decoder
from rlvr_jax.sharding import LEARNER_RULES, Rules, logical_to_sharding, reshard

Dtype = Any


def as_dtype(dtype: Any) -> jnp.dtype:
    """A jnp dtype from a string ("float32", "bfloat16") or dtype-like."""
    try:
        out = jnp.dtype(dtype)
    except TypeError:
        raise ValueError(f"unknown dtype {dtype!r}") from None
    if out not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise ValueError(f"dtype {out} is not a float dtype the models support")
    return out


def _dummy_inputs() -> tuple[jax.Array, jax.Array, jax.Array]:
    tokens = jnp.zeros((1, 1), jnp.int32)
    return tokens, tokens, jnp.ones((1, 1), jnp.int32)


def _boxed_init(config: ArchConfig, dtype: Dtype, rng: jax.Array) -> Any:
    module = Decoder(config, param_dtype=dtype)
    return module.init(rng, *_dummy_inputs())["params"]


def _unboxed_init(rng: jax.Array, config: ArchConfig, dtype: jnp.dtype) -> Any:
    return nn.meta.unbox(_boxed_init(config, dtype, rng))


def init_params(
    config: ArchConfig,
    rng: jax.Array,
    dtype: Dtype = jnp.float32,
    *,
    mesh: Mesh | None = None,
    rules: Rules | None = None,
) -> Any:
    """Random params as HF initialises them: projections and embeddings ~ N(0, init_std)
    (the padding row zeroed), norms 1, biases 0. Jitted; with a `mesh` (and `rules`,
    default the learner's) each leaf is created directly in its sharding."""
    dtype = as_dtype(dtype)
    out_shardings = None
    if mesh is not None:
        rules = LEARNER_RULES if rules is None else rules
        out_shardings = param_shardings(config, mesh, rules)
    init = jax.jit(_unboxed_init, static_argnums=(1, 2), out_shardings=out_shardings)
    return init(rng, config, dtype)


@functools.lru_cache(maxsize=64)
def _abstract(config: ArchConfig, dtype: jnp.dtype) -> Any:
    return jax.eval_shape(
        functools.partial(_unboxed_init, config=config, dtype=dtype), jax.random.key(0)
    )


def abstract_params(config: ArchConfig, dtype: Dtype = jnp.float32) -> Any:
    """ShapeDtypeStruct tree of the params (`jax.eval_shape`: nothing is allocated)."""
    return jax.tree.map(lambda x: x, _abstract(config, as_dtype(dtype)))


@functools.lru_cache(maxsize=64)
def _logical_axes(config: ArchConfig) -> Any:
    boxed = jax.eval_shape(
        functools.partial(_boxed_init, config, jnp.dtype(jnp.float32)), jax.random.key(0)
    )
    return jax.tree.map(
        lambda box: tuple(box.names),
        boxed,
        is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned),
    )


def param_logical_axes(config: ArchConfig) -> Any:
    """Tree of logical-axis-name tuples, same structure as the params."""
    return jax.tree.map(
        lambda names: names, _logical_axes(config), is_leaf=lambda x: isinstance(x, tuple)
    )


def param_shardings(config: ArchConfig, mesh: Mesh, rules: Rules) -> Any:
    """NamedSharding tree of the params of `config` on `mesh` by the logical-axis `rules`."""
    return logical_to_sharding(param_logical_axes(config), mesh, rules, abstract_params(config))


def tree_shardings(params: Any, config: ArchConfig, mesh: Mesh, rules: Rules) -> Any:
    """NamedSharding tree of any params tree of `config` — whole, adapters only, with LoRA
    adapters or quantized kernels (`rlvr_jax.models.lora.axes`) — arrays or abstract."""
    axes = lora.axes(params, param_logical_axes(config))
    return logical_to_sharding(axes, mesh, rules, params)


def shard_params(params: Any, mesh: Mesh, rules: Rules, config: ArchConfig) -> Any:
    """`params` placed on `mesh` by the rules (one `device_put` per array)."""
    return reshard(params, param_shardings(config, mesh, rules))


def apply(
    params: Any,
    config: ArchConfig,
    tokens_BxT: jax.Array,
    positions_BxT: jax.Array,
    segment_ids_BxT: jax.Array,
    *,
    compute_dtype: Dtype = jnp.float32,
    mesh: Mesh | None = None,
    rules: Rules | None = None,
    return_hidden: bool = False,
    remat: bool = False,
    attn_chunk: int = 0,
    attention_impl: str = "auto",
    max_segments: int = 0,
    segment_branches: int = 1,
) -> jax.Array:
    """Logits fp32 [B, T, V] of a packed / padded batch (pure; jit with `config` static).

    Query t attends to keys s <= t with the same segment id (0 conventionally marks padding;
    a pad row position still gets finite logits). `positions_BxT` feed RoPE only.
    `return_hidden` gives the final-norm hidden states [B, T, D] instead (see `lm_head`).
    `mesh`/`rules` add activation sharding constraints; `remat` rematerialises each layer;
    `attention_impl`, `attn_chunk`, `max_segments` and `segment_branches` are
    `rlvr_jax.models.attention.attention`'s `impl`, `chunk`, `max_segments` and `branches`.
    """
    module = Decoder(
        config,
        mode="forward",
        compute_dtype=as_dtype(compute_dtype),
        param_dtype=_param_dtype(params),
        mesh=mesh,
        rules=rules,
        remat=remat,
        attn_chunk=attn_chunk,
        attention_impl=attention_impl,
        max_segments=max_segments,
        segment_branches=segment_branches,
    )
    out, _ = module.apply(
        {"params": params},
        tokens_BxT,
        positions_BxT,
        segment_ids_BxT,
        return_hidden=return_hidden,
    )
    return out


def lm_head(params: Any, config: ArchConfig, hidden_BxTxD: jax.Array) -> jax.Array:
    """fp32 logits [B, T, V] of final hidden states (from `apply(..., return_hidden=True)`);
    lets a caller compute log-probs a chunk of time steps at a time."""
    h32_BxTxD = hidden_BxTxD.astype(jnp.float32)
    if config.tie_embeddings:
        return jnp.einsum("BTD,VD->BTV", h32_BxTxD, params["embedding"].astype(jnp.float32))
    return jnp.einsum("BTD,DV->BTV", h32_BxTxD, params["lm_head"].astype(jnp.float32))


def _param_dtype(params: Any) -> jnp.dtype:
    return jnp.dtype(params["embedding"].dtype)
