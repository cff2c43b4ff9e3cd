"""HF safetensors ⇄ params: the name/layout table, a streaming loader and a sharded writer.

Loading builds each parameter with `jax.make_array_from_callback`: every device's shard is
assembled from exactly the HF slices it covers (memory-mapped `get_slice`, one layer at a time),
so the host never holds the checkpoint. Writing fetches one layer's tensor at a time into files
of at most `max_shard_bytes` (with `model.safetensors.index.json`, as transformers does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rlvr_jax.models.config import ArchConfig
from rlvr_jax.models.errors import CheckpointError, MissingTensorError, UnexpectedTensorError
from rlvr_jax.models.params import abstract_params

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# tensors some checkpoints carry that no forward pass reads
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """One params leaf ⇄ HF tensor(s). `hf_name` has `{i}` when the leaf is stacked over
    layers. One layer's HF tensor becomes ours by an optional transpose (HF stores linear
    weights [out, in], we use [in, out]) and an optional split of one axis of the result
    into (heads, head_dim)."""

    path: tuple[str, ...]
    """Key path of the leaf in the params tree."""
    hf_name: str
    """HF tensor name (with `{i}` for the layer index)."""
    hf_shape: tuple[int, ...]
    """Shape of one HF tensor."""
    transpose: bool = False
    """Reverse the two axes of the HF tensor."""
    split: tuple[int, int] | None = None
    """(axis, head_dim): split `axis` (after the transpose) into (heads, head_dim)."""

    @property
    def stacked(self) -> bool:
        """Whether the leaf has a leading layers axis."""
        return "{i}" in self.hf_name

    def names(self, n_layers: int) -> list[str]:
        """The HF tensor names of this leaf, in layer order."""
        if not self.stacked:
            return [self.hf_name]
        return [self.hf_name.format(i=i) for i in range(n_layers)]

    def from_hf(self, w: Any) -> Any:
        """One layer's HF tensor (or a slice of it from `hf_index`) in our layout."""
        if self.transpose:
            w = w.T
        if self.split is not None:
            axis, h = self.split
            w = w.reshape((*w.shape[:axis], -1, h, *w.shape[axis + 1 :]))
        return w

    def to_hf(self, x: Any) -> Any:
        """One layer of our leaf (numpy or jax) in the HF layout."""
        if self.split is not None:
            axis, _ = self.split
            x = x.reshape((*x.shape[:axis], -1, *x.shape[axis + 2 :]))
        return x.T if self.transpose else x

    def hf_index(self, index: tuple[slice, ...]) -> tuple[slice, ...] | None:
        """The HF slices holding `index` of one layer of our leaf, or None when they do not
        form one rectangle (a split head_dim axis that is itself sliced)."""
        index = list(index)
        if self.split is not None:
            axis, h = self.split
            if range(h)[index[axis + 1]] != range(h):
                return None
            ours = self.hf_shape[::-1] if self.transpose else self.hf_shape
            heads = range(ours[axis] // h)[index[axis]]
            if heads.step != 1:
                return None
            index[axis : axis + 2] = [slice(heads.start * h, heads.stop * h)]
        return tuple(index[::-1] if self.transpose else index)


def tensor_maps(config: ArchConfig) -> list[TensorMap]:
    """The HF layout of every params leaf of `config`."""
    d, n, k, h, f, v = (
        config.d_model,
        config.n_heads,
        config.n_kv_heads,
        config.head_dim,
        config.d_ff,
        config.vocab_size,
    )
    attn, mlp, layer = ("layers", "attn"), ("layers", "mlp"), "model.layers.{i}."
    maps = [
        TensorMap(("embedding",), "model.embed_tokens.weight", (v, d)),
        TensorMap(("final_norm", "scale"), "model.norm.weight", (d,)),
    ]
    if not config.tie_embeddings:
        maps.append(TensorMap(("lm_head",), "lm_head.weight", (v, d), transpose=True))
    for name, heads in (("q_proj", n), ("k_proj", k), ("v_proj", k)):
        base = f"{layer}self_attn.{name}"
        # HF [heads*H, D] -> ours [D, heads, H]
        maps.append(
            TensorMap((*attn, name, "kernel"), base + ".weight", (heads * h, d), True, (1, h))
        )
        if config.qkv_bias:
            maps.append(
                TensorMap((*attn, name, "bias"), base + ".bias", (heads * h,), False, (0, h))
            )
    o_proj = f"{layer}self_attn.o_proj"
    # HF [D, N*H] -> ours [N, H, D]
    maps.append(
        TensorMap(
            ("layers", "attn_out", "o_proj", "kernel"), o_proj + ".weight", (d, n * h), True, (0, h)
        )
    )
    if config.o_bias:
        maps.append(TensorMap(("layers", "attn_out", "o_proj", "bias"), o_proj + ".bias", (d,)))
    for name, heads in (("q_norm", n), ("k_norm", k)):
        hf_name = f"{layer}self_attn.{name}.weight"
        if config.qk_norm == "full":  # HF [heads*H] -> ours [heads, H]
            maps.append(TensorMap((*attn, name, "scale"), hf_name, (heads * h,), False, (0, h)))
        elif config.qk_norm == "head":
            maps.append(TensorMap((*attn, name, "scale"), hf_name, (h,)))
    for name, hf_shape in (("gate_proj", (f, d)), ("up_proj", (f, d)), ("down_proj", (d, f))):
        base = f"{layer}mlp.{name}"
        maps.append(TensorMap((*mlp, name, "kernel"), base + ".weight", hf_shape, transpose=True))
        if config.mlp_bias:
            maps.append(TensorMap((*mlp, name, "bias"), base + ".bias", hf_shape[:1]))
    if config.post_norm:
        attn_norm, mlp_norm = "post_attention_layernorm", "post_feedforward_layernorm"
    else:
        attn_norm, mlp_norm = "input_layernorm", "post_attention_layernorm"
    maps += [
        TensorMap(("layers", "attn_norm", "scale"), f"{layer}{attn_norm}.weight", (d,)),
        TensorMap(("layers", "mlp_norm", "scale"), f"{layer}{mlp_norm}.weight", (d,)),
    ]
    return maps


def get_path(tree: Any, path: tuple[str, ...]) -> Any:
    """The subtree of nested dicts at `path`."""
    for key in path:
        tree = tree[key]
    return tree


def set_path(tree: dict, path: tuple[str, ...], value: Any) -> None:
    """Sets `tree[path] = value`, creating intermediate dicts."""
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _check_coverage(config: ArchConfig, maps: list[TensorMap]) -> None:
    """Every params leaf has exactly one HF tensor map (guards the table against the model)."""
    leaves = jax.tree_util.tree_flatten_with_path(abstract_params(config))[0]
    ours = sorted(tuple(k.key for k in key_path) for key_path, _ in leaves)
    mapped = sorted(m.path for m in maps)
    if ours != mapped:
        raise RuntimeError(f"HF tensor table {mapped} does not match params {ours}")


# ---- reading ---------------------------------------------------------------------------


def weight_index(path: Path) -> dict[str, Path]:
    """HF tensor name → safetensors file of a checkpoint directory."""
    index_file = path / INDEX_FILE
    if index_file.is_file():
        try:
            weight_map = json.loads(index_file.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index_file}: not a safetensors index ({e})") from None
        files = {name: path / file for name, file in weight_map.items()}
        for file in sorted(set(files.values())):
            if not file.is_file():
                raise CheckpointError(f"{index_file} names {file.name}, which does not exist")
        return files
    single = path / SINGLE_FILE
    candidates = [single] if single.is_file() else sorted(path.glob("*.safetensors"))
    if len(candidates) != 1:
        found = ", ".join(p.name for p in candidates) or "none"
        raise CheckpointError(
            f"{path}: expected {SINGLE_FILE} or {INDEX_FILE} (safetensors files found: {found})"
        )
    from safetensors import safe_open

    with safe_open(str(candidates[0]), framework="numpy") as f:
        return {name: candidates[0] for name in f.keys()}  # noqa: SIM118 (not a dict)


def _checkpoint_label(path: Path, files: dict[str, Path]) -> str:
    if (path / INDEX_FILE).is_file():
        return str(path / INDEX_FILE)
    return ", ".join(sorted({str(p) for p in files.values()})) or str(path)


def _check_tensors(
    path: Path, config: ArchConfig, maps: list[TensorMap], files: dict[str, Path], handles: dict
) -> None:
    """Missing / unexpected / wrongly shaped tensors raise, naming file and tensor."""
    expected: set[str] = set()
    label = _checkpoint_label(path, files)
    for m in maps:
        for name in m.names(config.n_layers):
            expected.add(name)
            if name not in files:
                raise MissingTensorError(f"{label}: tensor {name!r} is missing")
            shape = tuple(handles[files[name]].get_slice(name).get_shape())
            if shape != m.hf_shape:
                raise CheckpointError(
                    f"{files[name]}: tensor {name!r} has shape {shape}, the config "
                    f"implies {m.hf_shape}"
                )
    ignored = {"lm_head.weight"} if config.tie_embeddings else set()
    unexpected = sorted(
        name for name in set(files) - expected - ignored if not name.endswith(_IGNORED_SUFFIXES)
    )
    if unexpected:
        shown = ", ".join(unexpected[:5]) + (" ..." if len(unexpected) > 5 else "")
        raise UnexpectedTensorError(
            f"{label}: {len(unexpected)} tensor(s) the {config.arch} config does not use: "
            f"{shown} (config.json and weights disagree?)"
        )


def _shard_callback(
    m: TensorMap,
    config: ArchConfig,
    shape: tuple[int, ...],
    files: dict[str, Path],
    handles: dict,
    dtype: np.dtype,
) -> Callable[[tuple[slice, ...]], np.ndarray]:
    """make_array_from_callback's callback for one leaf of global `shape`: reads, layer by
    layer, only the HF slice the shard covers (`get_slice`), converts it to our layout and
    copies it into the shard buffer. Replicated shards (the same index on several devices)
    are read once."""
    names = m.names(config.n_layers)
    memo: dict[tuple, np.ndarray] = {}

    def read(name: str, index: tuple[slice, ...]) -> np.ndarray:
        handle = handles[files[name]]
        hf_index = m.hf_index(index)
        if hf_index is None:
            return m.from_hf(handle.get_tensor(name))[index]
        return m.from_hf(handle.get_slice(name)[hf_index])

    def callback(index: tuple[slice, ...]) -> np.ndarray:
        key = tuple((s.start, s.stop, s.step) for s in index)
        if key in memo:
            return memo[key]
        if m.stacked:
            layers = range(config.n_layers)[index[0]]
            sizes = [len(range(n)[s]) for n, s in zip(shape[1:], index[1:])]
            shard = np.empty((len(layers), *sizes), dtype)
            for j, layer in enumerate(layers):
                shard[j] = read(names[layer], index[1:])
        else:
            shard = np.asarray(read(names[0], index), dtype=dtype)
        memo[key] = shard
        return shard

    return callback


def load_params(path: str | Path, config: ArchConfig, *, dtype: Any, shardings: Any = None) -> dict:
    """Params of the checkpoint at `path` in `dtype`, each leaf placed by `shardings`
    (a tree of `jax.sharding.Sharding`; None = the first device)."""
    from safetensors import safe_open

    path = Path(path)
    files = weight_index(path)
    maps = tensor_maps(config)
    if shardings is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    params: dict = {}
    _check_coverage(config, maps)
    with contextlib.ExitStack() as stack:
        handles = {
            file: stack.enter_context(safe_open(str(file), framework="numpy"))
            for file in sorted(set(files.values()))
        }
        _check_tensors(path, config, maps, files, handles)
        np_dtype = np.dtype(dtype)
        abstract = abstract_params(config, np_dtype)
        for m in maps:
            shape = get_path(abstract, m.path).shape
            sharding = device if shardings is None else get_path(shardings, m.path)
            array = jax.make_array_from_callback(
                shape,
                sharding,
                _shard_callback(m, config, shape, files, handles, np_dtype),
                np_dtype,
            )
            # transfers are asynchronous and keep their host buffers alive: finish this
            # leaf before reading the next, so host memory holds one leaf's shards at most
            set_path(params, m.path, array.block_until_ready())
    return params


# ---- writing ---------------------------------------------------------------------------


def _to_host(x: jax.Array | np.ndarray) -> np.ndarray:
    if not isinstance(x, jax.Array):  # already gathered to the host
        return np.asarray(x)
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _hf_tensors(config: ArchConfig, maps: list[TensorMap]) -> Iterator[tuple]:
    """(hf_name, TensorMap, layer or None) in file order."""
    for m in maps:
        for i, name in enumerate(m.names(config.n_layers)):
            yield name, m, i if m.stacked else None


def hf_weights(params: Any, config: ArchConfig) -> Iterator[tuple[str, Any]]:
    """(HF tensor name, tensor in HF layout) of every tensor of the checkpoint format, in file
    order; arrays stay where `params` live (layouts change on device, one tensor at a time: a
    weight push to vLLM, `rollout.backends.vllm`)."""
    for name, m, layer in _hf_tensors(config, tensor_maps(config)):
        leaf = get_path(params, m.path)
        yield name, m.to_hf(leaf if layer is None else leaf[layer])


def save_params(
    params: Any, config: ArchConfig, path: str | Path, *, max_shard_bytes: int = 5 * 2**30
) -> list[str]:
    """Writes params as HF safetensors under `path` (one file, or shards plus an index when
    larger than `max_shard_bytes`). Returns the file names. Only process 0 writes."""
    from safetensors.numpy import save_file

    path = Path(path)
    maps = tensor_maps(config)
    entries = list(_hf_tensors(config, maps))
    itemsize = {id(m): np.dtype(get_path(params, m.path).dtype).itemsize for m in maps}
    shards: list[list[tuple]] = [[]]
    size = 0
    for entry in entries:
        nbytes = int(np.prod(entry[1].hf_shape)) * itemsize[id(entry[1])]
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
    names = (
        [SINGLE_FILE]
        if len(shards) == 1
        else [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    )
    writer = jax.process_index() == 0
    weight_map: dict[str, str] = {}
    total = 0
    for file_name, shard in zip(names, shards):
        tensors = {}
        for hf_name, m, layer in shard:
            leaf = get_path(params, m.path)
            value = _to_host(leaf if layer is None else leaf[layer])
            tensors[hf_name] = np.ascontiguousarray(m.to_hf(value))
            weight_map[hf_name] = file_name
            total += tensors[hf_name].nbytes
        if writer:
            save_file(tensors, str(path / file_name), metadata={"format": "pt"})
        del tensors
    if writer and len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return names
