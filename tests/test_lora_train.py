"""`rlvr-train` with LoRA end to end on the tiny policy: RL (sync, packed micro-batches, a KL
reference, resumed; async with an int8 base and int8 rollouts), SFT and DPO. Pushes and
checkpoints carry the adapters only; the exports load in transformers and PEFT."""

import json
from pathlib import Path

import numpy as np
import pytest
from helpers_models import hf_logits
from helpers_train import tiny_run

from rlvr_jax import cli, models
from rlvr_jax.data import synthetic
from rlvr_jax.models import lora
from rlvr_jax.training.metrics import read_jsonl

RANK = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny_run's policy and config, `sft.jsonl` (arithmetic rows with a boxed answer) and
    `pairs.jsonl` (the right boxed answer chosen, a wrong one rejected)."""
    root = tmp_path_factory.mktemp("lora")
    cfg = tiny_run(root)
    rows = [r for r in synthetic.generate("train", 64, seed=0) if r["domain"] == "arithmetic"]
    synthetic.write_jsonl(
        [{**r, "response": f"\\boxed{{{r['ground_truth']}}}"} for r in rows], root / "sft.jsonl"
    )
    with (root / "pairs.jsonl").open("w") as f:
        for r in rows:
            wrong = int(r["ground_truth"]) + 1
            pair = {"prompt": r["prompt"], "chosen": f"\\boxed{{{r['ground_truth']}}}"}
            f.write(json.dumps({**pair, "rejected": f"\\boxed{{{wrong}}}"}) + "\n")
    return root, cfg


def run(cfg: Path, out: Path, *extra: str) -> list[dict]:
    args = ["--config", str(cfg), f"train.output_dir={out}", "log.tensorboard=false"]
    assert cli.train_main([*args, f"model.lora.rank={RANK}", *extra]) == 0
    return read_jsonl(out / "metrics.jsonl")


def adapter_bytes(policy: Path) -> int:
    model = models.adapt_lora(models.load_pretrained(policy), _settings())
    return 4 * lora.size(lora.adapters(model.params))


def _settings():
    from rlvr_jax.config.schema import LoraConfig

    return LoraConfig(rank=RANK)


def checkpoint_arrays(step_dir: Path) -> dict[str, int]:
    """Elements of every array a checkpoint's train state holds, by key path (orbax's tree
    metadata)."""
    tree = json.loads((step_dir / "state" / "_METADATA").read_text())["tree_metadata"]
    return {
        key: int(np.prod(meta["value_metadata"]["write_shape"]))
        for key, meta in tree.items()
        if meta["value_metadata"]["value_type"] == "jax.Array"
    }


@pytest.mark.slow
def test_sync_packed_rl_pushes_and_checkpoints_adapters_only_resumes_and_exports(tiny, tmp_path):
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    root, cfg = tiny
    out = tmp_path / "out"
    extra = ("loss.kl_coef=0.01", f"train.max_tokens_per_micro_batch={3 * 105}",
             "checkpoint.every_steps=2")  # fmt: skip
    rows = run(cfg, out, "train.max_steps=2", *extra)
    assert [r["step"] for r in rows] == [1, 2]
    moved = adapter_bytes(root / "policy")
    policy_bytes = (root / "policy" / "model.safetensors").stat().st_size
    for r in rows:  # every push moved the adapters alone, and says how long it took
        assert r["push/bytes"] == moved and 0 < r["push/seconds"] < 60
        assert np.isfinite(r["loss"]) and r["kl/sampler_learner"] < 1e-6  # fp32 merge: exact
    assert moved < 0.2 * policy_bytes
    # the checkpoint: the adapters, their two AdamW moments and scalars; nothing of the base
    stored = checkpoint_arrays(out / "checkpoints" / "2")
    assert not [k for k in stored if "kernel" in k or "embedding" in k or "norm" in k]
    params = sum(n for k, n in stored.items() if k.startswith("('params'"))
    assert params == moved // 4 and sum(stored.values()) < 3 * params + 100
    resumed = run(cfg, out, "train.max_steps=3", *extra)
    assert [r["step"] for r in resumed] == [1, 2, 3]
    # the last checkpoint is the final policy: its export merges the adapters the same way
    from safetensors.numpy import load_file

    exported = tmp_path / "exported"
    assert cli.export_main([str(out / "checkpoints" / "3"), str(exported)]) == 0
    final, mine = (load_file(d / "model.safetensors") for d in (out / "final", exported))
    assert sorted(final) == sorted(mine)
    for name in final:
        np.testing.assert_allclose(mine[name], final[name], rtol=0, atol=1e-6, err_msg=name)
    # the exports: the merged checkpoint in transformers, the adapter in PEFT, same logits
    tokens = np.random.default_rng(0).integers(2, 300, size=(2, 12))
    ours = np.asarray(models.forward(models.load_pretrained(out / "final"), tokens))
    kwargs = dict(dtype=torch.float32, attn_implementation="eager")
    merged = AutoModelForCausalLM.from_pretrained(out / "final", **kwargs).eval()
    np.testing.assert_allclose(hf_logits(merged, tokens), ours, atol=1e-4)
    base = AutoModelForCausalLM.from_pretrained(root / "policy", **kwargs)
    adapted = peft.PeftModel.from_pretrained(base, out / "final_adapter").eval()
    np.testing.assert_allclose(hf_logits(adapted, tokens), ours, atol=1e-4)
    untrained = np.asarray(models.forward(models.load_pretrained(root / "policy"), tokens))
    assert np.abs(ours - untrained).max() > 1e-4  # the adapters trained


@pytest.mark.slow
def test_async_rl_with_an_int8_base_and_int8_rollouts_reports_the_mismatch(tiny, tmp_path):
    _, cfg = tiny
    rows = run(cfg, tmp_path / "out", "train.max_steps=2", "rollout.mode=async",
               "model.lora.base_dtype=int8", "rollout.weight_dtype=int8")  # fmt: skip
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # the sampler decodes from int8 weights, the learner from the (int8-base) policy in
        # fp32 compute: they differ a little, TIS (olmo3: token, C = 2) corrects it
        assert 0 < r["kl/sampler_learner"] < 0.1
        assert r["tis/mean"] > 0 and r["push/bytes"] > 0


@pytest.mark.slow
def test_sft_and_dpo_train_adapters(tiny, tmp_path):
    root, cfg = tiny
    policy = models.load_pretrained(root / "policy")
    common = ("rollout.max_new_tokens=10", "train.max_steps=2", "train.micro_batch_size=4")
    sft = run(cfg, tmp_path / "sft", "algorithm=sft", f"sft.sources=[{{path: {root / 'sft.jsonl'}}}]",
              "sft.batch_size=8", *common)  # fmt: skip
    dpo = run(cfg, tmp_path / "dpo", "algorithm=dpo", f"dpo.sources=[{{path: {root / 'pairs.jsonl'}}}]",
              "dpo.batch_size=4", "dpo.reference=on_the_fly", *common)  # fmt: skip
    for rows, name in ((sft, "sft"), (dpo, "dpo")):
        assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["loss"]) for r in rows)
        final = models.load_pretrained(tmp_path / name / "final")
        differs = [
            not np.allclose(a, b)
            for a, b in zip(jax_leaves(final.params), jax_leaves(policy.params))
        ]
        assert any(differs)
        assert (tmp_path / name / "final_adapter" / "adapter_config.json").is_file()
    # DPO's reference is the base with the adapters off: at step 1 the adapters are zero
    # (B = 0), so the policy equals its reference and the loss is log 2 exactly
    assert dpo[0]["loss"] == pytest.approx(np.log(2), abs=1e-5)


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)
