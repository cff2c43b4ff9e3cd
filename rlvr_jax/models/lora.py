"""LoRA adapters on the decoder's projections, as part of the params tree.

An adapter sits beside the kernel it adapts, at `<projection>/lora` (stacked over layers like
every leaf):

  layers/attn/q_proj/lora = Adapter(a [L, D, r], b [L, r, N, H], scale = alpha / r)

`a` takes the kernel's input dims and `b` its output dims, so the projection becomes

  y = x·W + scale · (x·A)·B                        (`delta`; dropout on x before A)

The projections add that term wherever the tree holds an adapter, so `models.apply` needs no
flag; `strip(params)` is the base (the KL and DPO reference, no second copy), `merge(params)`
the adapted policy as plain weights (HF export, decode weights). `scale` and the dropout rate
are static fields of the node, so they travel with the tree and nothing else needs the LoRA
settings. A is kaiming-uniform and B zero, as in PEFT: training starts at the base.
`split(params)` → (trainable, frozen) (only the adapters train when present), `combine`
inverts it; dropout applies in gradient passes only (`with_dropout`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from rlvr_jax.models.quant import axes_like, dense, is_quantized

KEY = "lora"  # the adapter's key beside `kernel`
# target (HF module name, as PEFT's `target_modules`) → (params path, kernel input dims after L)
TARGETS: dict[str, tuple[tuple[str, ...], int]] = {
    "q_proj": (("layers", "attn", "q_proj"), 1),
    "k_proj": (("layers", "attn", "k_proj"), 1),
    "v_proj": (("layers", "attn", "v_proj"), 1),
    "o_proj": (("layers", "attn_out", "o_proj"), 2),
    "gate_proj": (("layers", "mlp", "gate_proj"), 1),
    "up_proj": (("layers", "mlp", "up_proj"), 1),
    "down_proj": (("layers", "mlp", "down_proj"), 1),
}


@flax.struct.dataclass
class Adapter:
    """One projection's LoRA pair, stacked over layers."""

    a: jax.Array  # [L, *in, r]
    b: jax.Array  # [L, r, *out]
    scale: float = flax.struct.field(pytree_node=False, default=1.0)  # alpha / r
    dropout: float = flax.struct.field(pytree_node=False, default=0.0)  # on the input
    rng: jax.Array | None = None
    """[L, 2] uint32 dropout keys, set by `with_dropout` for one gradient pass; else None."""

    @property
    def rank(self) -> int:
        return self.a.shape[-1]


def delta(x: jax.Array, adapter: Adapter, dtype: Any) -> jax.Array:
    """scale · (x·A)·B of one layer (`adapter` sliced to it: a [*in, r], b [r, *out]); `x`
    ends in the input dims."""
    if adapter.rng is not None and adapter.dropout > 0:
        keep = jax.random.bernoulli(adapter.rng, 1.0 - adapter.dropout, x.shape)
        x = jnp.where(keep, x / (1.0 - adapter.dropout), 0)
    n_in = adapter.a.ndim - 1
    xa = jnp.tensordot(x.astype(dtype), adapter.a.astype(dtype), n_in)
    return jnp.tensordot(xa, adapter.b.astype(dtype), 1) * jnp.asarray(adapter.scale, dtype)


def _get(tree: Any, path: Sequence[str]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _graft(tree: dict, path: Sequence[str], value: Any) -> dict:
    """A copy of nested dicts `tree` with `value` at `path` (the other leaves shared)."""
    if not path:
        return value
    out = dict(tree)
    out[path[0]] = _graft(tree.get(path[0], {}), path[1:], value)
    return out


def check_targets(targets: Sequence[str]) -> None:
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown or not targets:
        raise ValueError(
            f"LoRA targets {list(targets)}: expected a non-empty subset of {list(TARGETS)}"
        )


def attach(
    params: dict,
    rng: jax.Array,
    *,
    rank: int,
    alpha: float,
    dropout: float = 0.0,
    targets: Sequence[str] = tuple(TARGETS),
    shardings: Callable[[Any], Any] | None = None,
) -> dict:
    """`params` with fresh adapters (float32; A ~ U(±1/√fan_in), B = 0) on `targets`.
    `shardings(abstract adapters tree)` → their shardings, to create them in place."""
    check_targets(targets)
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    shapes = {}
    for name in targets:
        path, n_in = TARGETS[name]
        kernel = _get(params, path)["kernel"]
        shapes[name] = (kernel.shape[: 1 + n_in], kernel.shape[1 + n_in :])

    def init(key: jax.Array) -> dict:
        tree: dict = {}
        for i, name in enumerate(targets):
            (n_layers, *ins), outs = shapes[name]
            bound = 1.0 / math.sqrt(math.prod(ins))
            a = jax.random.uniform(
                jax.random.fold_in(key, i), (n_layers, *ins, rank), jnp.float32, -bound, bound
            )
            b = jnp.zeros((n_layers, rank, *outs), jnp.float32)
            node = Adapter(a, b, scale=alpha / rank, dropout=dropout)
            tree = _graft(tree, (*TARGETS[name][0], KEY), node)
        return tree

    out = None if shardings is None else shardings(jax.eval_shape(init, rng))
    return graft(params, jax.jit(init, out_shardings=out)(rng))


def _is_adapter(x: Any) -> bool:
    return isinstance(x, Adapter)


def has_adapters(tree: Any) -> bool:
    return any(_is_adapter(x) for x in jax.tree.leaves(tree, is_leaf=_is_adapter))


def adapters(params: dict) -> dict:
    """The adapters of `params` alone, at their paths (what trains, is pushed, is saved)."""
    out: dict = {}
    for key, value in params.items():
        if _is_adapter(value):
            out[key] = value
        elif isinstance(value, dict):
            sub = adapters(value)
            if sub:
                out[key] = sub
    return out


def strip(params: dict) -> dict:
    """`params` without its adapters: the base model."""
    return {
        k: strip(v) if isinstance(v, dict) else v for k, v in params.items() if not _is_adapter(v)
    }


def graft(base: dict, adapter_tree: dict) -> dict:
    """`base` with the adapters of `adapter_tree` (an `adapters(...)` tree) put back."""
    out = dict(base)
    for key, value in adapter_tree.items():
        out[key] = value if _is_adapter(value) else graft(base.get(key, {}), value)
    return out


def split(tree: Any) -> tuple[Any, Any]:
    """(trainable, frozen) of params (or of a tuple of params trees, each split alone): the
    adapters and the base when the tree holds adapters, else (tree, None)."""
    if isinstance(tree, tuple):
        parts = [split(t) for t in tree]
        return tuple(p[0] for p in parts), tuple(p[1] for p in parts)
    if not isinstance(tree, dict) or not has_adapters(tree):
        return tree, None
    return adapters(tree), strip(tree)


def combine(trainable: Any, frozen: Any) -> Any:
    """The inverse of `split`."""
    if isinstance(trainable, tuple):
        return tuple(combine(t, f) for t, f in zip(trainable, frozen))
    return trainable if frozen is None else graft(frozen, trainable)


def with_dropout(trainable: Any, key: jax.Array) -> Any:
    """`trainable` with fresh dropout keys in every adapter that has a dropout rate (one
    gradient pass's; `key` a raw uint32 [2] key)."""
    leaves, treedef = jax.tree.flatten(trainable, is_leaf=_is_adapter)
    out = []
    for i, x in enumerate(leaves):
        if _is_adapter(x) and x.dropout > 0:
            x = x.replace(rng=jax.random.split(jax.random.fold_in(key, i), x.a.shape[0]))
        out.append(x)
    return jax.tree.unflatten(treedef, out)


def dropout_rate(tree: Any) -> float:
    """The largest adapter dropout rate in `tree` (0 without adapters)."""
    rates = [x.dropout for x in jax.tree.leaves(tree, is_leaf=_is_adapter) if _is_adapter(x)]
    return max(rates, default=0.0)


def merged_kernel(kernel: Any, adapter: Adapter | None, dtype: Any) -> jax.Array:
    """W + scale · A·B (stacked over layers) as a plain array of `dtype` (W dequantized)."""
    w = dense(kernel, jnp.float32)
    if adapter is not None:
        ab = jax.vmap(functools.partial(jnp.tensordot, axes=1))(adapter.a, adapter.b)
        w = w + adapter.scale * ab.astype(jnp.float32)
    return w.astype(dtype)


def merge(params: dict, dtype: Any = None) -> dict:
    """The adapted policy as plain weights: each adapter merged into its kernel, every
    quantized kernel dequantized; kernels in `dtype` (default: the embedding's)."""
    dtype = params["embedding"].dtype if dtype is None else dtype

    def walk(tree: dict) -> dict:
        out = {}
        for key, value in tree.items():
            if _is_adapter(value):
                continue
            if isinstance(value, dict):
                out[key] = walk(value)
            elif key == "kernel" and (KEY in tree or is_quantized(value)):
                out[key] = merged_kernel(value, tree.get(KEY), dtype)
            else:
                out[key] = value
        return out

    return walk(params)


def quantize_base(params: dict, qtype: str) -> dict:
    """`params` with every projection kernel stored as `qtype` (`quant.QTYPES`; one scale per
    layer and output channel): the frozen base of QLoRA. Adapters and other leaves are kept."""
    from rlvr_jax.models.quant import quantize

    out = params
    for path, n_in in TARGETS.values():
        kernel = _get(params, path)["kernel"]
        q = jax.jit(functools.partial(quantize, qtype=qtype, reduce_axes=tuple(range(1, 1 + n_in))))
        out = _graft(out, (*path, "kernel"), q(kernel))
    return out


def axes(params: Any, base_axes: dict) -> Any:
    """The logical axes of a params (or `adapters`) tree with adapters and quantized kernels,
    from the base's (`models.param_logical_axes`): `a` keeps the kernel's input axes, `b` its
    output axes, and the rank is an `embed` axis."""
    if is_quantized(params):
        return axes_like(params, base_axes)
    if not isinstance(params, dict):
        return base_axes
    out = {}
    for key, value in params.items():
        if _is_adapter(value):
            kernel = base_axes["kernel"]
            n_in = value.a.ndim - 2
            a = (*kernel[: 1 + n_in], "embed")
            b = (kernel[0], "embed", *kernel[1 + n_in :])
            out[key] = Adapter(a, b, value.scale, value.dropout, None)
        else:
            out[key] = axes(value, base_axes[key])
    return out


def size(tree: Any) -> int:
    """Parameters of `tree` (e.g. `adapters(params)`)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))
