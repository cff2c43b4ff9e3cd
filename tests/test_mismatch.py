"""Sampler/learner mismatch measured apart from policy lag: each token's lag (`groups.token_lag`),
`rollout.exact`'s replay. The `mismatch/*` and `lag/*` metrics of real runs (sync: all
on-policy; async: lag apart) are checked on tests/test_ledger.py's runs
(`helpers_train.check_mismatch_apart_from_lag`)."""

from types import SimpleNamespace

import pytest
from helpers_train import tiny_run

from rlvr_jax import cli, models
from rlvr_jax.config import ConfigError, load
from rlvr_jax.demo.base_model import SHIPPED_DIR
from rlvr_jax.rollout import EngineCore, RequestError, generate, rescore
from rlvr_jax.rollout.api import Replay
from rlvr_jax.training.groups import token_lag
from rlvr_jax.training.metrics import read_jsonl


def test_token_lag_counts_from_the_oldest_params_of_the_context():
    def lag(versions, prompt, learner):
        return token_lag(SimpleNamespace(policy_versions=versions, prompt_version=prompt), learner)

    assert lag([4, 4, 4], 4, 4) == [0, 0, 0]  # sampled by the learner's own params
    assert lag([3, 3], 3, 4) == [1, 1]  # one version behind
    # an in-flight update after two tokens: the KV cache of the first two came from version 3
    assert lag([3, 3, 4, 4], 3, 4) == [1, 1, 1, 1]
    # a group's prompt prefilled by version 3, this sample admitted after the update
    assert lag([4, 4], 3, 4) == [1, 1]
    assert lag([5, 5], None, 5) == [0, 0]  # prefill version unknown (vLLM)
    assert lag([], 2, 3) == []
    assert lag([0, 0, 1], 0, 0) == [0, 0, 1]  # scored by version 0: the last token is newer


def test_exact_settings_are_checked_with_names():
    with pytest.raises(ConfigError, match=r"rollout\.exact.*rollout\.backend: jetstream"):
        load("configs/demo.yaml", ["rollout.exact=true", "rollout.backend=vllm"])
    with pytest.raises(RequestError, match=r"replay of 3 tokens needs 1\.\.max_new_tokens=2"):
        Replay((5, 6, 7)).max_new_tokens(2)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_replay_reports_what_sampling_reported_bit_for_bit(dtype, layout="contiguous"):
    """An exact engine's slot computes the same numbers whatever else decodes beside it, so
    completions replayed in another company and order get the sampler's log-probs exactly
    (the paged layout: tests/test_bench_mismatch.py)."""
    model = models.load_pretrained(SHIPPED_DIR, dtype=dtype)
    engine = EngineCore(model, max_slots=4, max_len=40, chunk=4, kv_layout=layout, exact=True)
    prompts = [[0, *range(5 + i, 12 + 2 * i)] for i in range(5)]
    done = generate(engine, prompts, max_new_tokens=16, num_samples=2, seed=3)
    order = list(reversed(range(len(done))))[:7]  # other neighbours, other slots
    scored = rescore(engine, [(prompts[done[i].prompt_index], done[i].tokens) for i in order])
    for i, logp in zip(order, scored):
        assert logp == done[i].logprobs


@pytest.mark.slow
def test_exact_run_replays_the_sampler_bit_for_bit(tmp_path):
    """`rollout.exact`: the old log-probs are the completions replayed through the engine's
    decode step with the learner's params — on policy, the sampler's own numbers (bf16, the
    harder case; fp32 replays: the test above and tests/test_bench_mismatch.py)."""
    cfg = tiny_run(tmp_path)
    args = ["--config", str(cfg), "rollout.exact=true", "model.compute_dtype=bfloat16"]
    assert cli.train_main([*args, "train.max_steps=2", "rollout.kv_layout=paged"]) == 0
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    for r in rows:
        assert r["mismatch/tokens"] > 0 and r["lag/tokens"] == 0
        assert r["mismatch/bitwise_equal_fraction"] == 1.0
        assert r["mismatch/max_abs_logp"] == 0.0 and r["mismatch/kl"] == 0.0
        assert r["tis/min"] == r["tis/max"] == 1.0  # nothing to correct
