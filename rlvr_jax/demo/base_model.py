"""The demo's tiny base model: next-token pretraining on the demo corpus, and its bootstrap.

`pretrain(recipe, out_dir)` (command line: `scripts/pretrain_tiny.py`) trains a byte-level BPE
tokenizer on the corpus, then a small Qwen2 decoder from scratch with the SFT step (every token
but a document's first in the loss), and writes an HF directory with `pretrain.json`.
`build_demo_base(path, cfg)` (`model.create_if_missing`) copies the shipped base model
(`rlvr_jax/demo/assets/base`, its RECIPE.md the command and seed) or pretrains one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax

from rlvr_jax import models
from rlvr_jax.config.schema import Config, TrainConfig
from rlvr_jax.data.formatting import RESPONSE_SEPARATORS
from rlvr_jax.data.rng import stream
from rlvr_jax.data.tokenizer import load_tokenizer, train_tokenizer
from rlvr_jax.demo import corpus
from rlvr_jax.training.learner import init_state
from rlvr_jax.training.optimizer import make_optimizer
from rlvr_jax.training.sft import make_sft_step

log = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).parent / "assets" / "base"
"""The shipped base model (made by `scripts/pretrain_tiny.py`), when present."""

RECIPE_FILE = "pretrain.json"
"""Written beside the weights: the recipe and what the run measured."""

TOKENIZER_PROBE = "Compute 3 * (12 - 7). Is 4.\n* Point 2.\n<<Thoughts on (the moon)>> P.S."
"""Text whose ids `pretrain.json` records: a loader that tokenizes it differently than the
pretraining did would feed the model text it never saw (tests check the shipped model)."""

ARCH_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "tie_word_embeddings",
)
"""HF config keys that must agree for a shipped model to stand for a requested architecture."""


@dataclass(frozen=True)
class PretrainRecipe:
    """Everything that determines the base model (with the code version)."""

    seed: int = 0
    """Seeds the corpus problems, their styles and order, and the parameter init."""
    template: str = "plain"
    """Prompt template of the corpus (the trainer's `data.prompt_template`)."""
    styles: corpus.StyleMix = field(default_factory=corpus.StyleMix)
    """How often the corpus answers in each style."""
    problems: int = 8000
    """Distinct training problems the corpus cycles over."""
    vocab_size: int = 512
    """Tokenizer vocabulary (= the model's embedding rows)."""
    d_model: int = 256
    """Residual width."""
    n_layers: int = 2
    """Decoder layers."""
    n_heads: int = 4
    """Query heads (head dim = d_model / n_heads)."""
    n_kv_heads: int = 2
    """Key/value heads (GQA)."""
    d_ff: int = 768
    """SwiGLU hidden width."""
    steps: int = 600
    """Optimizer steps."""
    batch_rows: int = 16
    """Rows per batch, each `seq_len` tokens packed with whole documents."""
    seq_len: int = 256
    """Tokens per row."""
    learning_rate: float = 3e-3
    """Peak AdamW learning rate (cosine decay to 0 after warmup)."""
    warmup_steps: int = 30
    """Linear warmup steps."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    loss_on_prompt: bool = True
    """Train on prompt tokens too (pretraining); False trains on responses only (SFT)."""
    tokenizer_documents: int = 4000
    """Corpus documents the tokenizer is trained on."""

    def __post_init__(self) -> None:
        if self.template not in RESPONSE_SEPARATORS:
            raise ValueError(
                f"PretrainRecipe.template must be one of {list(RESPONSE_SEPARATORS)}, "
                f"got {self.template!r}"
            )
        for name in ("problems", "steps", "batch_rows", "seq_len", "tokenizer_documents"):
            if getattr(self, name) < 1:
                raise ValueError(f"PretrainRecipe.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"PretrainRecipe: d_model={self.d_model} is not a multiple of "
                f"n_heads={self.n_heads}"
            )

    def hf_config(self) -> dict[str, Any]:
        """The HF architecture (token ids are filled in from the tokenizer)."""
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": self.vocab_size,
            "hidden_size": self.d_model,
            "intermediate_size": self.d_ff,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "max_position_embeddings": self.seq_len,
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
        }

    def to_json(self) -> dict[str, Any]:
        """The recipe as plain JSON values."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PretrainRecipe:
        """Inverse of `to_json` (unknown keys are errors naming them)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"PretrainRecipe: unknown keys {unknown}")
        values = dict(data)
        if "styles" in values:
            values["styles"] = corpus.StyleMix(**values["styles"])
        return cls(**values)


DEMO_RECIPE = PretrainRecipe()
"""The recipe of the shipped base model."""


def _train_tokenizer(
    recipe: PretrainRecipe, rows: list[dict], vocab_size: int, out_dir: Path
) -> Any:
    rng = stream(recipe.seed, "demo-tokenizer")
    sep = RESPONSE_SEPARATORS[recipe.template]
    texts = []
    for i in range(recipe.tokenizer_documents):
        row = rows[i % len(rows)]
        texts.append(row["prompt"] + sep + corpus.styled_response(row, rng, recipe.styles)[1])
    train_tokenizer(texts, vocab_size=vocab_size, path=out_dir)
    return load_tokenizer(out_dir)  # its special-token ids go into config.json


def _architecture(hf_config: Mapping[str, Any], tokenizer: Any) -> models.ArchConfig:
    arch = dict(hf_config)
    if len(tokenizer) > arch["vocab_size"]:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens > vocab_size {arch['vocab_size']}"
        )
    arch.update(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return models.ArchConfig.from_hf(arch, source="demo base model")


def pretrain(
    recipe: PretrainRecipe, out_dir: str | Path, *, hf_config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Pretrains `recipe` (with `hf_config`'s architecture when given) into `out_dir`; returns
    what the run measured (wall time, parameters, tokens, last loss and token accuracy), also
    written to `out_dir/pretrain.json`."""
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_config = recipe.hf_config() if hf_config is None else hf_config
    rows = corpus.demo_rows("train", recipe.problems, recipe.seed)
    arch = _architecture(hf_config, _train_tokenizer(recipe, rows, hf_config["vocab_size"], out))
    # transformers picks the tokenizer class by the config's model type (a qwen2 config.json
    # imposes Qwen2's pre-tokenizer on any tokenizer.json): encode the corpus with the tokenizer
    # exactly as every later `load_tokenizer(out)` will load it.
    (out / "config.json").write_text(json.dumps(arch.to_hf(), indent=2, sort_keys=True) + "\n")
    tokenizer = load_tokenizer(out)
    batches = corpus.packed_batches(
        corpus.styled_examples(rows, tokenizer, recipe.template, recipe.styles, recipe.seed),
        rows=recipe.batch_rows,
        seq_len=recipe.seq_len,
        pad_id=tokenizer.pad_token_id,
        loss_on_prompt=recipe.loss_on_prompt,
    )
    optimizer = make_optimizer(
        TrainConfig(
            max_steps=recipe.steps,
            learning_rate=recipe.learning_rate,
            schedule="cosine",
            warmup_steps=recipe.warmup_steps,
            weight_decay=recipe.weight_decay,
            adam_b2=0.98,
            max_grad_norm=1.0,
        )
    )
    params = models.init_params(arch, jax.random.key(recipe.seed))
    state = init_state(params, optimizer)
    step_fn = jax.jit(make_sft_step(arch, optimizer), donate_argnums=0)
    history: list[dict[str, float]] = []
    pending = None
    tokens = 0
    for step in range(recipe.steps):
        state, metrics = step_fn(state, next(batches))
        if pending is not None:  # fetch step N-1's metrics after dispatching step N
            history.append(_fetch(pending))
            tokens += int(history[-1]["sft/tokens"])
            if step % 50 == 0:
                log.info("pretrain step %d: %s", step, history[-1])
        pending = metrics
    history.append(_fetch(pending))
    tokens += int(history[-1]["sft/tokens"])
    model = models.Model(config=arch, params=state.params, path=str(out))
    models.save_pretrained(model, out, tokenizer_dir=out)
    last = history[-min(20, len(history)) :]
    report = {
        "recipe": recipe.to_json(),
        "hf_config": arch.to_hf(),
        "wall_s": round(time.perf_counter() - start, 1),
        "n_params": arch.n_params(),
        "tokens_trained": tokens,
        "skipped_steps": int(state.skipped),
        "final_loss": sum(h["loss"] for h in last) / len(last),
        "final_token_accuracy": sum(h["sft/token_accuracy"] for h in last) / len(last),
        "tokenizer_probe": {"text": TOKENIZER_PROBE, "ids": tokenizer.encode(TOKENIZER_PROBE)},
    }
    (out / RECIPE_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _fetch(metrics: dict[str, jax.Array]) -> dict[str, float]:
    return {k: float(v) for k, v in jax.device_get(metrics).items()}


def shipped_mismatch(shipped_dir: Path, cfg: Config) -> str | None:
    """Why the model in `shipped_dir` cannot stand for `cfg`'s base model, or None if it can
    (it is there, was pretrained with `cfg`'s prompt template, and has the architecture of
    `cfg.model.hf_config` on `ARCH_KEYS`, when that is set)."""
    if not (shipped_dir / "config.json").is_file() or not (shipped_dir / RECIPE_FILE).is_file():
        return f"no shipped base model in {shipped_dir}"
    recipe = json.loads((shipped_dir / RECIPE_FILE).read_text())["recipe"]
    if recipe["template"] != cfg.data.prompt_template:
        return (
            f"the shipped base model was pretrained for prompt template {recipe['template']!r}, "
            f"the config uses {cfg.data.prompt_template!r}"
        )
    wanted = cfg.model.hf_config or {}
    shipped = json.loads((shipped_dir / "config.json").read_text())
    differ = [k for k in ARCH_KEYS if k in wanted and wanted[k] != shipped.get(k)]
    if differ:
        return f"model.hf_config differs from the shipped base model on {differ}"
    return None


def build_demo_base(
    path: str | Path,
    cfg: Config,
    *,
    recipe: PretrainRecipe | None = None,
    shipped_dir: Path | None = SHIPPED_DIR,
) -> Path:
    """Writes the demo's base model to `path`: the shipped one when it fits `cfg`
    (`shipped_mismatch`), else pretrains `recipe` (default `DEMO_RECIPE`; `shipped_dir=None`
    always pretrains) with `cfg.model.hf_config`'s architecture when set. Returns `path`."""
    out = Path(path)
    reason = "shipping disabled" if shipped_dir is None else shipped_mismatch(shipped_dir, cfg)
    if reason is None:
        assert shipped_dir is not None
        out.mkdir(parents=True, exist_ok=True)
        for item in sorted(shipped_dir.iterdir()):
            if item.is_file():
                shutil.copyfile(item, out / item.name)
        log.info("demo base model: copied the shipped model from %s to %s", shipped_dir, out)
        return out
    if recipe is None:
        recipe = dataclasses.replace(DEMO_RECIPE, template=cfg.data.prompt_template)
    log.info("demo base model: pretraining into %s (%s)", out, reason)
    report = pretrain(recipe, out, hf_config=cfg.model.hf_config)
    log.info("demo base model: pretrained in %.0f s (%s)", report["wall_s"], out)
    return out
