"""HF `config.json` dicts ⇄ `ArchConfig` fields, mirroring transformers 5.23's config classes
(`LlamaConfig`, `Qwen2Config`, `Qwen3Config`, `Olmo2Config`, `Olmo3Config`): their defaults for
absent keys, their legacy keys (`rope_scaling`, top-level `rope_theta`) and their RoPE
standardisation, so a checkpoint means the same thing here as there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlvr_jax.models import rope
from rlvr_jax.models.errors import ModelConfigError, UnsupportedArchitectureError

FULL, SLIDING = "full_attention", "sliding_attention"
"""HF layer types: full causal attention, or a sliding window."""
QK_NORMS = (None, "head", "full")
ARCHS = ("llama", "qwen2", "qwen3", "olmo2", "olmo3")


@dataclasses.dataclass(frozen=True)
class _Family:
    """What an HF model type fixes, and the defaults its config class applies."""

    hf_class: str
    qk_norm: str | None
    post_norm: bool
    defaults: Mapping[str, Any]


_COMMON = {
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "rope_theta": 10000.0,
}
_QWEN = {
    **_COMMON,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
    "num_key_value_heads": 32,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
}
_OLMO = {
    **_COMMON,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 2048,
    "bos_token_id": None,
    "eos_token_id": 50279,
    "pad_token_id": 1,
    "num_key_value_heads": None,
}
FAMILIES: dict[str, _Family] = {
    "llama": _Family(
        "LlamaForCausalLM",
        None,
        False,
        {
            **_COMMON,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 2048,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": None,
            "num_key_value_heads": None,
            "mlp_bias": False,
        },
    ),
    "qwen2": _Family("Qwen2ForCausalLM", None, False, _QWEN),
    "qwen3": _Family("Qwen3ForCausalLM", "head", False, {**_QWEN, "head_dim": 128}),
    "olmo2": _Family("Olmo2ForCausalLM", "full", True, _OLMO),
    "olmo3": _Family(
        "Olmo3ForCausalLM",
        "full",
        True,
        {**_OLMO, "rope_theta": 500000.0, "sliding_window": 4096},
    ),
}
_REQUIRED_HF_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


if tuple(FAMILIES) != ARCHS:
    raise RuntimeError(f"FAMILIES {tuple(FAMILIES)} out of sync with ARCHS {ARCHS}")


def fields_from_hf(hf_config: Mapping[str, Any], *, source: str | None = None) -> dict[str, Any]:
    """`ArchConfig` keyword arguments of an HF config dict; `source` prefixes errors."""
    where = f"{source}: " if source else ""
    model_type = _model_type(hf_config, where)
    family = FAMILIES[model_type]
    cfg = {**family.defaults, **hf_config}
    missing = [k for k in _REQUIRED_HF_KEYS if cfg.get(k) is None]
    if missing:
        raise ModelConfigError(f"{where}config lacks required keys {missing}")
    if cfg["hidden_act"] != "silu":
        raise ModelConfigError(
            f"{where}hidden_act {cfg['hidden_act']!r} is not supported (only 'silu')"
        )
    n_heads = int(cfg["num_attention_heads"])
    n_layers = int(cfg["num_hidden_layers"])
    sliding_window, layer_types = _attention_layout(model_type, cfg, n_layers)
    (theta, scaling), sliding_rope = _rope_layout(model_type, cfg, where)
    bias = bool(cfg["attention_bias"])
    eos = cfg["eos_token_id"]
    return dict(
        arch=model_type,
        vocab_size=int(cfg["vocab_size"]),
        d_model=int(cfg["hidden_size"]),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(cfg["num_key_value_heads"] or n_heads),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // n_heads),
        d_ff=int(cfg["intermediate_size"]),
        rope_theta=theta,
        rope_scaling=scaling,
        sliding_rope_theta=sliding_rope[0] if sliding_rope else None,
        sliding_rope_scaling=sliding_rope[1] if sliding_rope else None,
        norm_eps=float(cfg["rms_norm_eps"]),
        tie_embeddings=bool(cfg["tie_word_embeddings"]),
        qkv_bias=True if model_type == "qwen2" else bias,
        o_bias=False if model_type == "qwen2" else bias,
        mlp_bias=bool(cfg["mlp_bias"]) if model_type == "llama" else False,
        qk_norm=family.qk_norm,
        post_norm=family.post_norm,
        sliding_window=sliding_window,
        layer_types=layer_types,
        max_position_embeddings=int(cfg["max_position_embeddings"]),
        bos_token_id=cfg["bos_token_id"],
        eos_token_id=() if eos is None else tuple(eos) if isinstance(eos, list) else (eos,),
        pad_token_id=cfg["pad_token_id"],
        init_std=float(cfg["initializer_range"]),
    )


def config_to_hf(cfg: Any) -> dict[str, Any]:
    """The transformers 5 `config.json` dict of an `ArchConfig` (raises `ModelConfigError` if a
    field cannot be expressed in the HF class of `cfg.arch`). `models.config` imports this
    module, so `cfg` is typed by what is read of it, not by its class."""
    family = FAMILIES[cfg.arch]
    _check_representable(cfg, family)
    eos: Any = list(cfg.eos_token_id) if len(cfg.eos_token_id) > 1 else None
    if len(cfg.eos_token_id) == 1:
        eos = cfg.eos_token_id[0]
    out: dict[str, Any] = {
        "architectures": [family.hf_class],
        "model_type": cfg.arch,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": cfg.init_std,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": cfg.pad_token_id,
        "attention_dropout": 0.0,
        "use_cache": True,
    }
    if cfg.arch != "qwen2":
        out["attention_bias"] = cfg.qkv_bias
    if cfg.arch == "llama":
        out["mlp_bias"] = cfg.mlp_bias
    if cfg.arch in ("llama", "qwen3") or cfg.head_dim != cfg.d_model // cfg.n_heads:
        out["head_dim"] = cfg.head_dim
    if cfg.arch == "olmo3":
        out["rope_parameters"] = {
            FULL: rope.scaling_to_hf(*cfg.rope_for(FULL)),
            SLIDING: rope.scaling_to_hf(*cfg.rope_for(SLIDING)),
        }
        out["sliding_window"] = cfg.sliding_window
        out["layer_types"] = list(cfg.layer_types)
    else:
        out["rope_parameters"] = rope.scaling_to_hf(cfg.rope_theta, cfg.rope_scaling)
    if cfg.arch in ("qwen2", "qwen3"):
        out["use_sliding_window"] = cfg.has_sliding
        out["sliding_window"] = cfg.sliding_window if cfg.has_sliding else None
        out["layer_types"] = list(cfg.layer_types)
        # read only when layer_types is absent; kept consistent for older readers
        first_sliding = cfg.layer_types.index(SLIDING) if cfg.has_sliding else cfg.n_layers
        out["max_window_layers"] = first_sliding
    return out


def _check_representable(cfg: Any, family: _Family) -> None:
    problems = []
    if (cfg.qk_norm, cfg.post_norm) != (family.qk_norm, family.post_norm):
        problems.append(
            f"qk_norm={cfg.qk_norm!r}/post_norm={cfg.post_norm} (the HF class has "
            f"{family.qk_norm!r}/{family.post_norm})"
        )
    if cfg.arch == "qwen2" and (not cfg.qkv_bias or cfg.o_bias):
        problems.append("qwen2 always has q/k/v biases and no output bias")
    if cfg.arch != "qwen2" and cfg.qkv_bias != cfg.o_bias:
        problems.append("one `attention_bias` covers q/k/v and output projections")
    if cfg.mlp_bias and cfg.arch != "llama":
        problems.append("only llama has `mlp_bias`")
    if cfg.has_sliding and cfg.arch in ("llama", "olmo2"):
        problems.append("sliding-window layers")
    if cfg.sliding_rope_theta is not None and cfg.arch != "olmo3":
        problems.append("a separate sliding-layer RoPE")
    if problems:
        raise ModelConfigError(
            f"this {cfg.arch} config cannot be written as {family.hf_class}: " + "; ".join(problems)
        )


def _model_type(hf_config: Mapping[str, Any], where: str) -> str:
    model_type = hf_config.get("model_type")
    if model_type is None:
        by_class = {f.hf_class: name for name, f in FAMILIES.items()}
        for cls_name in hf_config.get("architectures") or ():
            if cls_name in by_class:
                return by_class[cls_name]
        raise UnsupportedArchitectureError(
            f"{where}config has no model_type and architectures "
            f"{hf_config.get('architectures')} name no supported class "
            f"({', '.join(f.hf_class for f in FAMILIES.values())})"
        )
    if model_type not in FAMILIES:
        raise UnsupportedArchitectureError(
            f"{where}model_type {model_type!r} (architectures "
            f"{hf_config.get('architectures')}) is not supported; supported: "
            f"{', '.join(FAMILIES)}"
        )
    return model_type


def _attention_layout(
    model_type: str, cfg: Mapping[str, Any], n_layers: int
) -> tuple[int | None, tuple[str, ...]]:
    """(sliding_window, layer_types) as the HF attention modules of `model_type` use them."""
    if model_type in ("llama", "olmo2"):
        return None, (FULL,) * n_layers  # these classes never read sliding_window
    if model_type in ("qwen2", "qwen3"):
        window = cfg["sliding_window"] if cfg["use_sliding_window"] else None
        types = cfg.get("layer_types") or [
            SLIDING if window is not None and i >= cfg["max_window_layers"] else FULL
            for i in range(n_layers)
        ]
    else:  # olmo3
        window = cfg["sliding_window"]
        types = cfg.get("layer_types") or [
            SLIDING if (i + 1) % 4 else FULL for i in range(n_layers)
        ]
    if window is None:  # HF attends fully on every layer without a window
        return None, (FULL,) * n_layers
    return int(window), tuple(types)


RopePair = tuple[float, rope.RopeScaling | None]


def _rope_layout(
    model_type: str, cfg: Mapping[str, Any], where: str
) -> tuple[RopePair, RopePair | None]:
    """((theta, scaling) of full layers, (theta, scaling) of sliding layers or None if same)."""
    max_pos = int(cfg["max_position_embeddings"])
    default_theta = FAMILIES[model_type].defaults["rope_theta"]
    if model_type != "olmo3":
        params = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
        if cfg.get("original_max_position_embeddings") is not None:
            params["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
        theta = params.get("rope_theta")
        theta = float(cfg.get("rope_theta") or default_theta) if theta is None else float(theta)
        scaling = rope.scaling_from_hf(params, max_position_embeddings=max_pos, where=where)
        return (theta, scaling), None
    # Olmo3Config.convert_rope_params_to_dict: rope params nested by layer type; a legacy
    # `rope_scaling` updates only the full-attention layers; a legacy top-level `rope_theta`
    # reaches only the full-attention layers (the sliding ones keep the class default).
    nested = cfg.get("rope_parameters")
    if nested is not None and not set(nested) & {FULL, SLIDING}:
        raise ModelConfigError(
            f"{where}olmo3 rope_parameters must be nested by layer type "
            f"({FULL!r}, {SLIDING!r}), got keys {sorted(nested)}"
        )
    nested = nested or {}
    full = dict(nested.get(FULL) or {"rope_type": "default"})
    full.update(cfg.get("rope_scaling") or {})
    sliding = dict(nested.get(SLIDING) or {"rope_type": "default"})
    full.setdefault("rope_theta", cfg.get("rope_theta", default_theta))
    sliding.setdefault("rope_theta", default_theta)
    pairs = []
    for params in (full, sliding):
        # HF's yarn reads `truncate` from the top-level (here: nested) dict, so it is always True
        params.pop("truncate", None)
        scaling = rope.scaling_from_hf(params, max_position_embeddings=max_pos, where=where)
        pairs.append((float(params["rope_theta"]), scaling))
    return pairs[0], pairs[1]
