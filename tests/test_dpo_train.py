"""`rlvr-train algorithm=dpo` end to end on a tiny random policy: metrics, exact resume, the
reference cache (written once, reused), cached == on-the-fly references, a reference-free
variant, and bad settings as errors naming the key."""

import json
import logging
import shutil

import jax
import numpy as np
import pytest
from helpers_train import tiny_run

from rlvr_jax import cli, models
from rlvr_jax.data import synthetic
from rlvr_jax.training.metrics import read_jsonl


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny_run's policy and config, and `pairs.jsonl`: the arithmetic rows with the right
    boxed answer chosen and a wrong one rejected."""
    root = tmp_path_factory.mktemp("dpo")
    cfg = tiny_run(root)
    rows = [r for r in synthetic.generate("train", 64, seed=0) if r["domain"] == "arithmetic"]
    with (root / "pairs.jsonl").open("w") as f:
        for r in rows:
            wrong = int(r["ground_truth"]) + 1
            pair = {"prompt": r["prompt"], "chosen": f"\\boxed{{{r['ground_truth']}}}"}
            f.write(json.dumps({**pair, "rejected": f"\\boxed{{{wrong}}}"}) + "\n")
    return root, cfg


def args(root, cfg, out, *extra):
    return [
        "--config",
        str(cfg),
        "algorithm=dpo",
        f"dpo.sources=[{{path: {root / 'pairs.jsonl'}}}]",
        "dpo.batch_size=4",
        "train.micro_batch_size=4",  # two micro-batches of two pairs
        "rollout.max_new_tokens=10",
        f"train.output_dir={out}",
        "log.tensorboard=false",
        *extra,
    ]


def params_of(path):
    return jax.tree.leaves(models.load_pretrained(path).params)


@pytest.mark.slow
def test_dpo_runs_resumes_exactly_and_reuses_its_reference_cache(tiny, tmp_path, caplog):
    root, cfg = tiny
    out = tmp_path / "dpo"
    argv = args(
        root, cfg, out, "train.max_steps=3", "checkpoint.every_steps=2", "checkpoint.keep=3"
    )
    assert cli.train_main(argv) == 0
    straight = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in straight] == [1, 2, 3]
    assert [r["policy_version"] for r in straight] == [1, 2, 3]
    # the policy starts as the reference: every margin is 0, ℓ = log 2
    np.testing.assert_allclose(straight[0]["loss"], np.log(2.0), rtol=1e-5)
    for key in (
        "dpo/accuracy",
        "dpo/reward_margin",
        "dpo/chosen_logp",
        "dpo/rejected_logp",
        "dpo/chosen_reward",
        "grad_norm",
    ):
        assert all(np.isfinite(r[key]) for r in straight), key
    assert all(r["dpo/pairs"] == 4.0 for r in straight)
    assert straight[-1]["dpo/reward_margin"] > 0  # the chosen answers gain on the rejected
    (cache,) = (out / "reference_cache").glob("ref_logp-*.npz")
    with np.load(cache) as f:
        assert len(f["values"]) == 2 * 31  # every pair's two responses (31 arithmetic rows)
    written = cache.stat().st_mtime_ns
    straight_params = params_of(out / "final")

    # as if the run had died right after its checkpoint at step 2: the rerun redoes step 3
    shutil.rmtree(out / "checkpoints" / "3")
    shutil.rmtree(out / "final")
    with caplog.at_level(logging.INFO, logger="rlvr_jax"):
        assert cli.train_main(argv) == 0
    assert "reference log-probs: all cached" in caplog.text
    assert cache.stat().st_mtime_ns == written
    resumed = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    for key in ("loss", "dpo/reward_margin", "dpo/accuracy", "grad_norm", "policy_version"):
        assert resumed[2][key] == straight[2][key], key
    for a, b in zip(params_of(out / "final"), straight_params):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_cached_and_on_the_fly_references_train_alike(tiny, tmp_path):
    root, cfg = tiny
    runs = {}
    for mode in ("cache", "on_the_fly"):
        out = tmp_path / mode
        argv = args(root, cfg, out, "train.max_steps=3", f"dpo.reference={mode}")
        assert cli.train_main(argv) == 0
        runs[mode] = read_jsonl(out / "metrics.jsonl")
    assert not (tmp_path / "on_the_fly" / "reference_cache").exists()
    for a, b in zip(runs["cache"], runs["on_the_fly"]):
        for key in ("loss", "dpo/reward_margin", "dpo/chosen_logp"):
            np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-5, err_msg=key)


@pytest.mark.slow
def test_reference_free_variant_computes_no_reference(tiny, tmp_path):
    root, cfg = tiny
    out = tmp_path / "simpo"
    argv = args(root, cfg, out, "train.max_steps=1", "dpo.variant=simpo", "dpo.beta=2.0")
    assert cli.train_main([*argv, "dpo.variant_kwargs={gamma: 0.25}"]) == 0
    assert not (out / "reference_cache").exists()
    (row,) = read_jsonl(out / "metrics.jsonl")
    assert np.isfinite(row["loss"]) and row["loss"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, message",
    [
        (["dpo.variant=dpo_typo"], "dpo.variant / dpo.variant_kwargs / dpo.beta: unknown"),
        (["dpo.variant_kwargs={gamma: 1.0}"], "takes no parameter 'gamma'"),
        (["dpo.beta=0"], "beta must be > 0"),
        (["train.micro_batch_size=3"], "train.micro_batch_size=3 must be even"),
        (["train.micro_batch_size=6"], "must divide the DPO batch"),
        (["dpo.batch_size=0"], "dpo.batch_size must be >= 1"),
        (["dpo.sources=[]"], "dpo.sources is empty"),
        (["dpo.reference=sometimes"], "dpo.reference"),
    ],
)
def test_bad_settings_are_errors_naming_the_key(tiny, tmp_path, capsys, extra, message):
    root, cfg = tiny
    assert cli.train_main([*args(root, cfg, tmp_path / "bad"), *extra]) == 2
    assert message in capsys.readouterr().err
