"""HF checkpoint I/O and architecture configs.

References: transformers itself — its config classes (defaults, RoPE standardisation), its
rotary-embedding modules (inverse frequencies), its parameter counts (meta-device models for
real-scale configs) and `from_pretrained` of the directories we write.
"""

from __future__ import annotations

import copy
import json
import math
import weakref

import helpers_models as H
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import models
from rlvr_jax.models import hf_io, rope

TOL = 1e-4


def _params_equal(a, b) -> bool:
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    same_tree = jax.tree.structure(a) == jax.tree.structure(b)
    return same_tree and all(
        x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(leaves_a, leaves_b)
    )


# ---- save → transformers ---------------------------------------------------------------

SAVE_CASES = {
    "llama_tied_llama3": (
        "llama",
        {
            "tie_word_embeddings": True,
            "attention_bias": True,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    "qwen2_sliding": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
    ),
    "qwen3": ("qwen3", {}),
    "olmo2": ("olmo2", {}),
    "olmo3_legacy_rope": (
        "olmo3",
        {
            "rope_theta": 1000.0,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
}


@pytest.mark.slow  # ~4 s a case on two cores (transformers loads and runs each)
@pytest.mark.parametrize("case", sorted(SAVE_CASES))
def test_save_pretrained_loads_in_transformers(tmp_path, case):
    from transformers import AutoModelForCausalLM

    arch, overrides = SAVE_CASES[case]
    hf_model = H.build_hf_checkpoint(arch, tmp_path / "src", seed=3, **copy.deepcopy(overrides))
    model = models.load_pretrained(tmp_path / "src")
    models.save_pretrained(model, tmp_path / "out")

    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == arch
    assert written["architectures"] == [type(hf_model).__name__]
    reloaded, info = AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", attn_implementation="eager", output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    tokens_BxT = H.random_tokens(2, 20, seed=4)
    ref = H.hf_logits(hf_model, tokens_BxT)
    np.testing.assert_allclose(H.hf_logits(reloaded.eval(), tokens_BxT), ref, rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(models.forward(model, tokens_BxT)), ref, atol=TOL, rtol=0)
    # and our own reload of what we wrote is bit-identical
    assert models.read_config(tmp_path / "out") == model.config
    assert _params_equal(models.load_pretrained(tmp_path / "out").params, model.params)


@pytest.mark.slow
def test_sharded_checkpoints_both_ways(tmp_path):
    """HF-sharded input (index.json) loads like a single file; our sharded output carries an
    index that transformers follows."""
    from transformers import AutoModelForCausalLM

    hf_model = H.build_hf_checkpoint("olmo3", tmp_path / "hf", seed=5, max_shard_size="40KB")
    assert (tmp_path / "hf" / hf_io.INDEX_FILE).is_file()
    sharded = models.load_pretrained(tmp_path / "hf")
    hf_model.save_pretrained(str(tmp_path / "single"))
    assert not (tmp_path / "single" / hf_io.INDEX_FILE).exists()
    assert _params_equal(sharded.params, models.load_pretrained(tmp_path / "single").params)

    models.save_pretrained(sharded, tmp_path / "ours", max_shard_bytes=30_000)
    index = json.loads((tmp_path / "ours" / hf_io.INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 3 and all((tmp_path / "ours" / f).is_file() for f in files)
    assert index["metadata"]["total_size"] == 4 * sharded.config.n_params()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager")
    tokens_BxT = H.random_tokens(1, 12, seed=6)
    np.testing.assert_allclose(
        H.hf_logits(reloaded.eval(), tokens_BxT), H.hf_logits(hf_model, tokens_BxT), atol=1e-6
    )
    assert _params_equal(models.load_pretrained(tmp_path / "ours").params, sharded.params)


@pytest.mark.slow
def test_bfloat16_load_and_save(tmp_path):
    from safetensors import safe_open

    H.build_hf_checkpoint("qwen3", tmp_path / "src", seed=7)
    fp32 = models.load_pretrained(tmp_path / "src")
    bf16 = models.load_pretrained(tmp_path / "src", dtype="bfloat16")
    assert bf16.compute_dtype == jnp.bfloat16 and bf16.param_dtype == jnp.bfloat16
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(bf16.params))
    # loading casts exactly like astype from fp32 (round to nearest even)
    expected = jax.tree.map(lambda x: x.astype(jnp.bfloat16), fp32.params)
    assert _params_equal(bf16.params, expected)
    tokens_BxT = H.random_tokens(2, 10, seed=8)
    logits_fp32 = np.asarray(models.forward(fp32, tokens_BxT))
    logits_bf16 = np.asarray(models.forward(bf16, tokens_BxT))
    assert logits_bf16.dtype == np.float32
    assert np.abs(logits_bf16 - logits_fp32).max() < 0.1 * np.abs(logits_fp32).max()

    models.save_pretrained(bf16, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "numpy") as f:
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
    reloaded = models.load_pretrained(tmp_path / "out", dtype="bfloat16")
    assert _params_equal(reloaded.params, bf16.params)


def test_tokenizer_files_are_copied(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    H.build_hf_checkpoint("llama", tmp_path / "src")
    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, H.VOCAB)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>"
    ).save_pretrained(str(tmp_path / "src"))
    model = models.load_pretrained(tmp_path / "src")
    models.save_pretrained(model, tmp_path / "out")
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    assert AutoTokenizer.from_pretrained(tmp_path / "out")("w5 w9")["input_ids"] == [5, 9]
    # without a known tokenizer directory nothing is copied
    models.save_pretrained(models.Model(model.config, model.params), tmp_path / "bare")
    assert not (tmp_path / "bare" / "tokenizer.json").exists()


class _SpyOpen:
    """`safetensors.safe_open` wrapper recording each tensor read: its bytes, and the bytes
    of read arrays alive at once (via weakref finalizers)."""

    reads: list[tuple[str, int]] = []
    alive = {"now": 0, "max": 0}

    real = None  # the genuine safe_open, set by the test

    def __init__(self, *args, **kwargs):
        self._file = _SpyOpen.real(*args, **kwargs)

    def __enter__(self):
        self._file.__enter__()
        return self

    def __exit__(self, *exc):
        return self._file.__exit__(*exc)

    def keys(self):
        return self._file.keys()

    def _record(self, name, array):
        alive, nbytes = _SpyOpen.alive, array.nbytes
        _SpyOpen.reads.append((name, nbytes))
        alive["now"] += nbytes
        alive["max"] = max(alive["max"], alive["now"])
        weakref.finalize(array, lambda: alive.__setitem__("now", alive["now"] - nbytes))
        return array

    def get_tensor(self, name):
        return self._record(name, self._file.get_tensor(name))

    def get_slice(self, name):
        spy, sliced = self, self._file.get_slice(name)

        class Slice:
            def get_shape(self):
                return sliced.get_shape()

            def __getitem__(self, index):
                return spy._record(name, sliced[index])

        return Slice()


def test_loading_reads_each_shard_once_one_tensor_at_a_time(tmp_path, monkeypatch):
    """On a data=2 x fsdp=2 x tensor=2 mesh every byte of the checkpoint is read exactly once
    (each device shard from its own HF slice, replicas shared), and the data read that is
    alive at any moment never exceeds one parameter: the checkpoint is streamed, never
    materialised in host memory."""
    import safetensors

    from rlvr_jax import sharding

    H.build_hf_checkpoint("llama", tmp_path, num_hidden_layers=4)
    plain = models.load_pretrained(tmp_path)
    _SpyOpen.real = safetensors.safe_open
    _SpyOpen.reads, _SpyOpen.alive = [], {"now": 0, "max": 0}
    monkeypatch.setattr(safetensors, "safe_open", _SpyOpen)
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    model = models.load_pretrained(tmp_path, mesh=mesh)
    assert _params_equal(jax.device_get(model.params), jax.device_get(plain.params))
    q = model.params["layers"]["attn"]["q_proj"]["kernel"]
    assert q.addressable_shards[0].data.shape == (4, 32, 2, 16)  # [L, D/fsdp, N/tensor, H]
    assert sum(nbytes for _, nbytes in _SpyOpen.reads) == 4 * model.config.n_params()
    largest_leaf = max(x.nbytes for x in jax.tree.leaves(plain.params))
    assert 0 < _SpyOpen.alive["max"] <= largest_leaf < model.config.n_params() * 4 / 5


def test_loading_with_head_dim_sharded_falls_back_to_whole_reads(tmp_path):
    """A split head_dim axis that is itself sharded is not one HF rectangle: those shards
    are cut from the whole layer tensor instead (same values)."""
    from rlvr_jax import sharding
    from rlvr_jax.models.hf_io import tensor_maps

    H.build_hf_checkpoint("olmo2", tmp_path)
    plain = models.load_pretrained(tmp_path)
    q_map = next(m for m in tensor_maps(plain.config) if m.path[-2:] == ("q_proj", "kernel"))
    assert q_map.hf_index((slice(0, 32), slice(2, 4), slice(None))) == (
        slice(32, 64),  # heads 2..3 of H=16 -> HF rows 32..63
        slice(0, 32),
    )
    assert q_map.hf_index((slice(None), slice(None), slice(0, 8))) is None
    rules = sharding.LEARNER_RULES.replace(heads=None, kv_heads=None, head_dim="tensor")
    mesh = sharding.make_mesh({"fsdp": 2, "tensor": 4})
    model = models.load_pretrained(tmp_path, mesh=mesh, rules=rules)
    q = model.params["layers"]["attn"]["q_proj"]["kernel"]
    assert q.addressable_shards[0].data.shape == (2, 32, 4, 4)
    assert _params_equal(jax.device_get(model.params), jax.device_get(plain.params))


# ---- errors ----------------------------------------------------------------------------


def _rewrite_weights(path, edit):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_missing_unexpected_and_misshapen_tensors(tmp_path):
    H.build_hf_checkpoint("llama", tmp_path)
    name = "model.layers.1.mlp.up_proj.weight"
    weights = tmp_path / "model.safetensors"

    _rewrite_weights(tmp_path, lambda t: t.pop(name))
    with pytest.raises(models.MissingTensorError, match=f"{weights}.*{name!r} is missing"):
        models.load_pretrained(tmp_path)

    _rewrite_weights(
        tmp_path,
        lambda t: t.update(
            {
                name: np.zeros((96, 64), np.float32),
                "model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32),
            }
        ),
    )
    with pytest.raises(models.UnexpectedTensorError, match=r"q_proj\.bias"):
        models.load_pretrained(tmp_path)

    _rewrite_weights(tmp_path, lambda t: t.pop("model.layers.0.self_attn.q_proj.bias"))
    _rewrite_weights(tmp_path, lambda t: t.update({name: np.zeros((95, 64), np.float32)}))
    with pytest.raises(models.CheckpointError, match=r"up_proj.weight.*\(95, 64\).*\(96, 64\)"):
        models.load_pretrained(tmp_path)


def test_directory_errors(tmp_path):
    with pytest.raises(models.CheckpointError, match=r"no config\.json"):
        models.load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**H.BASE["llama"]}))
    with pytest.raises(models.CheckpointError, match=r"expected model\.safetensors"):
        models.load_pretrained(tmp_path)
    (tmp_path / hf_io.INDEX_FILE).write_text(
        json.dumps({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})
    )
    with pytest.raises(models.CheckpointError, match=r"model-00001-of-00002\.safetensors"):
        models.load_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(models.UnsupportedArchitectureError, match=f"{config_file}.*'gpt2'"):
        models.load_pretrained(tmp_path)


@pytest.mark.parametrize(
    "rope_scaling, match",
    [
        ({"rope_type": "dynamic", "factor": 2.0}, "'dynamic' is not supported"),
        ({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}, "'longrope'"),
        (
            {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5},
            "partial_rotary_factor",
        ),
    ],
)
def test_unsupported_rope_is_named(rope_scaling, match):
    hf = {**H.BASE["llama"], "rope_scaling": rope_scaling}
    with pytest.raises(models.UnsupportedRopeError, match=match):
        models.ArchConfig.from_hf(hf, source="x/config.json")


def test_config_errors_are_named():
    with pytest.raises(models.ModelConfigError, match=r"lacks required keys \['hidden_size'\]"):
        models.ArchConfig.from_hf({k: v for k, v in H.BASE["llama"].items() if k != "hidden_size"})
    with pytest.raises(models.ModelConfigError, match="hidden_act 'gelu'"):
        models.ArchConfig.from_hf({**H.BASE["llama"], "hidden_act": "gelu"})
    with pytest.raises(models.ModelConfigError, match="needs the keys"):
        models.ArchConfig.from_hf(
            {**H.BASE["llama"], "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
        )
    with pytest.raises(models.ModelConfigError, match="not a multiple"):
        models.ArchConfig.from_hf({**H.BASE["llama"], "num_key_value_heads": 3})
    cfg = models.ArchConfig.from_hf({**H.BASE["llama"]})
    import dataclasses

    with pytest.raises(models.ModelConfigError, match="cannot be written as LlamaForCausalLM"):
        dataclasses.replace(cfg, qk_norm="head").to_hf()


# ---- configs against transformers -----------------------------------------------------

CONFIG_CASES = [
    {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4},
    {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 32,
        "num_key_value_heads": 2,
        "rope_theta": 5e5,
        "tie_word_embeddings": True,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "eos_token_id": [1, 7],
    },
    {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 512,
        "original_max_position_embeddings": 64,
        "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "mscale": 2.0, "mscale_all_dim": 1.0},
    },
    {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "use_sliding_window": True,
        "sliding_window": 8,
        "max_window_layers": 1,
    },
    {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "sliding_window": 8,
    },  # use_sliding_window off: all full
    {
        "model_type": "qwen3",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },  # Qwen3Config's head_dim default (128) applies
    {
        "model_type": "olmo2",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 1e4,
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 2.0,
        },
    },
    {"model_type": "olmo3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 6},
    {
        "model_type": "olmo3",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_theta": 1e4,
        "max_position_embeddings": 1024,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 128,
            "truncate": False,
        },
    },
]


def _hf_config_from_dict(d):
    from transformers import AutoConfig

    kwargs = {"vocab_size": 128, "intermediate_size": 96, "num_hidden_layers": 2, **d}
    return kwargs, AutoConfig.for_model(kwargs.pop("model_type"), **copy.deepcopy(kwargs))


def _hf_rope(hf_cfg, layer_type):
    """(inv_freq, attention_scaling) of transformers' own rotary module for `layer_type`."""
    from transformers import AutoModelForCausalLM

    model_cls = AutoModelForCausalLM._model_mapping[type(hf_cfg)]
    module = __import__(model_cls.__module__, fromlist=["_"])
    rotary_cls = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    rotary = rotary_cls(hf_cfg)
    if hf_cfg.model_type == "olmo3":
        return (
            getattr(rotary, f"{layer_type}_inv_freq").numpy(),
            getattr(rotary, f"{layer_type}_attention_scaling"),
        )
    return rotary.inv_freq.numpy(), rotary.attention_scaling


@pytest.mark.parametrize("index", range(len(CONFIG_CASES)))
def test_from_hf_agrees_with_transformers_config(index):
    kwargs, hf_cfg = _hf_config_from_dict(CONFIG_CASES[index])
    cfg = models.ArchConfig.from_hf({"model_type": hf_cfg.model_type, **kwargs})
    attention = AttentionProbe(hf_cfg)
    assert cfg.n_kv_heads == hf_cfg.num_key_value_heads
    assert cfg.head_dim == attention.head_dim
    assert cfg.norm_eps == hf_cfg.rms_norm_eps
    assert cfg.tie_embeddings == hf_cfg.tie_word_embeddings
    assert cfg.max_position_embeddings == hf_cfg.max_position_embeddings
    hf_eos = hf_cfg.eos_token_id
    hf_eos = () if hf_eos is None else tuple(hf_eos) if isinstance(hf_eos, list) else (hf_eos,)
    assert cfg.eos_token_id == hf_eos
    assert (cfg.bos_token_id, cfg.pad_token_id) == (hf_cfg.bos_token_id, hf_cfg.pad_token_id)
    assert list(cfg.layer_types) == attention.layer_types
    assert [
        cfg.sliding_window if t == "sliding_attention" else None for t in cfg.layer_types
    ] == attention.windows
    for layer_type in sorted(set(cfg.layer_types)):
        theta, scaling = cfg.rope_for(layer_type)
        ours = rope.inv_frequencies(cfg.head_dim, theta, scaling, cfg.max_position_embeddings)
        ref_freq, ref_scale = _hf_rope(hf_cfg, layer_type)
        np.testing.assert_allclose(ours[0], ref_freq, rtol=1e-6)
        assert math.isclose(ours[1], ref_scale, rel_tol=1e-6)
    # to_hf is read back by the same HF class into the same architecture
    from transformers import AutoConfig

    written = cfg.to_hf()
    again = AutoConfig.for_model(written.pop("model_type"), **written)
    assert models.ArchConfig.from_hf(again.to_dict()) == cfg


class AttentionProbe:
    """head_dim, layer types and per-layer sliding windows as HF's attention modules see them."""

    def __init__(self, hf_cfg):
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_cfg)
        attns = [layer.self_attn for layer in model.model.layers]
        self.head_dim = attns[0].head_dim
        # Llama and OLMo 2 attention modules have no sliding_window attribute at all
        self.windows = [getattr(a, "sliding_window", None) for a in attns]
        self.layer_types = [
            "sliding_attention" if w is not None else "full_attention" for w in self.windows
        ]


REAL_SCALE = {
    "llama3_8b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "qwen3_4b": {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
    },
    "olmo3_7b": {
        "model_type": "olmo3",
        "vocab_size": 100278,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
    },
    "qwen2_0.5b": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
}


@pytest.mark.parametrize("name", sorted(REAL_SCALE))
def test_n_params_matches_transformers_at_real_scale(name):
    """Exact counts of real-scale configs, without allocating: HF on the meta device vs our
    arithmetic vs our `jax.eval_shape` params tree."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    d = dict(REAL_SCALE[name])
    cfg = models.ArchConfig.from_hf(d)
    hf_cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(hf_cfg)
    hf_count = sum(p.numel() for p in hf_model.parameters())  # tied weights counted once
    shapes = models.abstract_params(cfg, jnp.bfloat16)
    assert cfg.n_params() == hf_count
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(shapes)) == hf_count
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(shapes))


@pytest.mark.slow
def test_init_params_axes_and_shapes_agree():
    cfg = models.ArchConfig.from_hf({**H.BASE["olmo3"]})
    params = models.init_params(cfg, jax.random.key(0), dtype="bfloat16")
    shapes = models.abstract_params(cfg, "bfloat16")
    axes = models.param_logical_axes(cfg)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), params) == jax.tree.map(
        lambda x: (x.shape, x.dtype), shapes
    )
    flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
    assert [len(a) for a in flat_axes] == [x.ndim for x in jax.tree.leaves(params)]
    assert axes["layers"]["attn"]["q_proj"]["kernel"] == ("layers", "embed", "heads", "head_dim")
    assert axes["layers"]["attn"]["q_norm"]["scale"] == ("layers", "heads", "head_dim")
    # HF-like init: norms 1, padding row 0, projections ~ N(0, 0.02)
    assert (np.asarray(params["layers"]["attn_norm"]["scale"]) == 1).all()
    assert (np.asarray(params["embedding"][cfg.pad_token_id]) == 0).all()
    q = np.asarray(params["layers"]["attn"]["q_proj"]["kernel"], np.float32)
    assert abs(q.std() - 0.02) < 0.002 and abs(q.mean()) < 0.002
