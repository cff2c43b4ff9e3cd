"""`rlvr-prefs`: pair selection by hand, the installed console script end to end in a fresh
process (pairs that `algorithm: dpo` loads, verified chosen, rejected by the verifier, progress
shown), its samples equal to one `rollout.generate` call, and bad input as named errors."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers_train import tiny_run

from rlvr_jax.config.schema import SourceConfig
from rlvr_jax.eval.preference_pairs import select_pair, strip_separator

TESTS = Path(__file__).resolve().parent


def test_select_pair_takes_a_verified_chosen_and_a_rejected_weak_sample():
    strong = ["a", "b", "c"]
    weak = ["b", "d", "e"]
    # chosen: the first strong sample scored >= 0.5 ("b"); rejected: the first weak sample
    # scored < 0.5 that is not the chosen text ("d": "b" is skipped as identical)
    assert select_pair(strong, np.array([0.0, 1.0, 1.0]), weak, np.array([0.0, 0.0, 1.0])) == (
        1,
        1,
    )
    # `any`: the first weak sample whatever its score (still not the chosen text)
    picked = select_pair(
        strong, np.array([1.0, 0, 0]), weak, np.array([1.0, 1.0, 1.0]), rejected="any"
    )
    assert picked == (0, 0)
    assert select_pair(strong, np.zeros(3), weak, np.zeros(3)) == "no_verified_chosen"
    assert select_pair(strong, np.ones(3), weak, np.ones(3)) == "no_rejected"
    with pytest.raises(ValueError, match="rejected must be one of"):
        select_pair(strong, np.ones(3), weak, np.ones(3), rejected="worst")


def test_strip_separator():
    assert strip_separator("\nThe answer is 5.", "plain") == "The answer is 5."
    assert strip_separator("The answer", "plain") == "The answer"
    assert strip_separator(" <think>", "r1") == "<think>"
    assert strip_separator("\nx", "chat") == "\nx"


def console_script(name: str) -> str:
    exe = shutil.which(name, path=str(Path(sys.executable).parent))
    assert exe is not None, f"{name} is not installed (pip install -e .)"
    return exe


def run_prefs(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(TESTS)}  # the parity verifier of helpers_train
    return subprocess.run(
        [console_script("rlvr-prefs"), *argv], capture_output=True, text=True, env=env, timeout=900
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefs")
    return root, tiny_run(root)


@pytest.mark.slow
def test_bad_input_is_a_named_error(tmp_path):
    missing_model = run_prefs(
        "--strong", str(tmp_path / "nope"), "--weak", str(tmp_path), "--input", "x.jsonl",
        "--output", str(tmp_path / "p.jsonl"),
    )  # fmt: skip
    assert missing_model.returncode == 2
    assert "--strong" in missing_model.stderr and "no config.json" in missing_model.stderr
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    model = str(tmp_path / "m")
    common = ["--strong", model, "--weak", model]
    bad_suffix = run_prefs(*common, "--input", "x.jsonl", "--output", str(tmp_path / "p.txt"))
    assert bad_suffix.returncode == 2 and "must end in one of" in bad_suffix.stderr
    no_input = run_prefs(*common, "--input", str(tmp_path / "x.jsonl"), "--output", "p.jsonl")
    assert no_input.returncode == 2 and "file not found" in no_input.stderr
    zero = run_prefs(*common, "--input", "x", "--output", "p.jsonl", "--samples", "0")
    assert zero.returncode == 2 and "--samples must be >= 1" in zero.stderr


@pytest.mark.slow
def test_console_script_writes_pairs_that_dpo_loads(tiny, tmp_path):
    root, cfg = tiny
    policy = str(root / "policy")
    out, stats = tmp_path / "pairs.jsonl", tmp_path / "stats.json"
    # strong and weak are the same random policy here; the parity verifier passes about half
    # of its samples, so most prompts have a verified and a rejected sample
    result = run_prefs(
        "--config", str(cfg), "--strong", policy, "--weak", policy,
        "--input", str(root / "train.jsonl"), "--output", str(out), "--samples", "4",
        "--max-prompts", "12", "--json", str(stats), "--seed", "3",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "strong samples" in result.stderr and "weak samples" in result.stderr  # progress
    report = json.loads(stats.read_text())
    assert report["prompts"] == 12
    assert report["pairs"] + sum(report["skipped"].values()) == 12
    assert report["pairs"] >= 6
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == report["pairs"]
    for r in records:
        # word_parity: 1 for an even number of words
        assert r["chosen_score"] == 1.0 and len(r["chosen"].split()) % 2 == 0
        assert r["rejected_score"] == 0.0 and len(r["rejected"].split()) % 2 == 1
        assert r["verifier"] == "helpers_train:word_parity" and r["chosen"] != r["rejected"]
    from rlvr_jax.data import load_tokenizer
    from rlvr_jax.data.preferences import load_preference_sources

    (source,) = load_preference_sources(
        [SourceConfig(path=str(out))],
        load_tokenizer(policy),
        "plain",
        max_prompt_len=96,
        max_response_len=32,
    )
    assert len(source.rows) == len(records)
    assert f"{report['pairs']} pairs written" in result.stdout


@pytest.mark.slow
def test_samples_are_those_of_one_generate_call(tiny, monkeypatch):
    root, cfg_path = tiny
    monkeypatch.syspath_prepend(str(TESTS))
    from rlvr_jax import models, rollout
    from rlvr_jax.config import load
    from rlvr_jax.data import format_prompt, load_source, load_tokenizer
    from rlvr_jax.data.formatting import stop_token_ids
    from rlvr_jax.eval.preference_pairs import sample_model
    from rlvr_jax.rewards import RewardService

    cfg = load(str(cfg_path))
    rows = list(load_source(SourceConfig(path=str(root / "train.jsonl"))).rows)[:5]
    policy = str(root / "policy")
    with RewardService(cfg.rewards) as service:
        sampled = sample_model(
            cfg, policy, rows, num_samples=3, seed=11, reward_service=service, label="x"
        )
    model, tokenizer = models.load_pretrained(policy), load_tokenizer(policy)
    completions = rollout.generate(
        model,
        [format_prompt(r, tokenizer, "plain") for r in rows],
        max_new_tokens=cfg.rollout.max_new_tokens,
        num_samples=3,
        stop_token_ids=stop_token_ids(model.config, tokenizer),
        seed=11,
    )
    texts = [
        strip_separator(tokenizer.decode(c.tokens, skip_special_tokens=True), "plain")
        for c in completions
    ]
    assert [t for per in sampled.texts for t in per] == texts
    parity = [float(len(t.split()) % 2 == 0) for t in texts]
    np.testing.assert_array_equal(sampled.scores.reshape(-1), parity)
