"""Budget forcing (`rollout.interrupt`): at the thinking budget the engine appends the
configured tokens to the running sequence (forced decode steps: the KV cache continues) and
lets it answer within a bound. Checked here: the inserted tokens sit at [budget, budget + F)
with `sampled=False` and log-prob 0, in both KV layouts and with identical tokens; the
log-probs of the tokens sampled after the insertion equal a full re-forward of prompt +
completion by the model (so the cache holds exactly the inserted tokens); tokens before the
budget are those of a run without forcing; preempted interrupted sequences resume
identically; the learner batch masks the inserted tokens; config errors name the keys."""

from __future__ import annotations

import json

import helpers_models as H
import numpy as np
import pytest

from rlvr_jax import models
from rlvr_jax.config import ConfigError, load
from rlvr_jax.rollout import (
    Completion,
    EngineCore,
    GroupRequest,
    RequestError,
    Scheduler,
    generate,
    request_seed,
)
from rlvr_jax.rollout.api import Interrupt
from rlvr_jax.rollout.builder import interrupt_from_config as from_config
from rlvr_jax.training.batch import Sample, collate
from rlvr_jax.training.groups import BatchAssembler, ScoredGroup

SMALL = dict(page_size=4, geometry_tokens=(8, 16, 8))
FORCED = (40, 41, 42)
INTERRUPT = Interrupt(budget=6, tokens=FORCED, answer_budget=5)


def _prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(2, H.VOCAB, n).tolist() for n in lengths]


def _reforward_logprobs(model, prompt, tokens):
    """log softmax(logits)[token] of each completion token from one forward of the whole
    sequence (float64 log-sum-exp)."""
    logits = np.asarray(models.forward(model, np.array([prompt + tokens])))[0].astype(np.float64)
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    return np.array([logp[len(prompt) - 1 + i, t] for i, t in enumerate(tokens)])


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.slow
def test_inserted_tokens_are_not_sampled_and_the_cache_continues(qwen, layout):
    prompts = _prompts([5, 9], seed=1)
    core = EngineCore(qwen, max_slots=4, max_len=40, kv_layout=layout, **SMALL)
    gen = dict(max_new_tokens=20, num_samples=2, seed=3, temperature=1.0)
    done = generate(core, prompts, interrupt=INTERRUPT, **gen)
    free = generate(core, prompts, **gen)  # no stop ids: every sample reaches the budget
    for c, f in zip(done, free):
        b, n = INTERRUPT.budget, len(FORCED)
        assert c.interrupted and f.sampled is None and not f.interrupted
        assert c.tokens[b : b + n] == list(FORCED)
        assert c.sampled == [True] * b + [False] * n + [True] * (len(c.tokens) - b - n)
        assert len(c.tokens) == INTERRUPT.total == 14 and c.finish_reason == "length"
        assert c.logprobs[b : b + n] == [0.0] * n
        # before the budget: the run without forcing (sampling keyed by position)
        assert c.tokens[:b] == f.tokens[:b]
        np.testing.assert_allclose(c.logprobs[:b], f.logprobs[:b], rtol=0, atol=1e-6)
        # after it: the model's own log-probs of prompt + completion, re-forwarded whole
        ref = _reforward_logprobs(qwen, prompts[c.prompt_index], c.tokens)
        mask = np.array(c.sampled)
        np.testing.assert_allclose(np.array(c.logprobs)[mask], ref[mask], rtol=0, atol=2e-5)
        assert c.tokens[b + n :] != f.tokens[b + n :]  # the answer follows the insertion


@pytest.mark.slow
def test_layouts_agree_and_early_stops_are_not_interrupted(qwen):
    prompts = _prompts([3, 7, 12], seed=2)
    stop = (7, 11, 19, 23, 29, 31, 37, 43)  # frequent stops: some end before the budget
    gen = dict(max_new_tokens=20, num_samples=4, seed=5, stop_token_ids=stop, interrupt=INTERRUPT)
    runs = [
        generate(EngineCore(qwen, max_slots=8, max_len=40, kv_layout=k, **SMALL), prompts, **gen)
        for k in ("contiguous", "paged")
    ]
    assert [(c.tokens, c.sampled, c.finish_reason) for c in runs[0]] == [
        (c.tokens, c.sampled, c.finish_reason) for c in runs[1]
    ]
    early = [c for c in runs[0] if len(c.tokens) <= INTERRUPT.budget]
    assert early and all(not c.interrupted and c.finish_reason == "stop" for c in early)
    assert any(c.interrupted for c in runs[0])
    for c in runs[0]:  # a forced token never stops a completion, even a stop id
        assert len(c.tokens) <= INTERRUPT.total


@pytest.mark.slow
def test_a_stop_id_among_the_inserted_tokens_does_not_stop(qwen):
    interrupt = Interrupt(budget=4, tokens=(7, 50), answer_budget=3)
    done = generate(
        EngineCore(qwen, max_slots=2, max_len=32, kv_layout="contiguous"),
        _prompts([6], seed=4),
        max_new_tokens=12,
        seed=1,
        stop_token_ids=(7,),
        interrupt=interrupt,
    )
    c = done[0]
    assert c.tokens[4:6] == [7, 50] and c.sampled[4:6] == [False, False]
    assert len(c.tokens) > 6  # it went on after the forced stop id


@pytest.mark.slow
def test_preempted_interrupted_sequences_resume_identically(qwen):
    # 6 requests of up to 4 + 20 positions on a pool of 24 pages of 4 tokens: the newest are
    # preempted (before, during or after their insertion) and recomputed
    prompts = _prompts([6, 9, 4, 11, 7, 5], seed=5)
    interrupt = Interrupt(budget=7, tokens=FORCED, answer_budget=10)
    kw = dict(max_new_tokens=24, temperature=1.0, num_samples=1, seed=8, interrupt=interrupt)
    roomy = EngineCore(qwen, max_slots=6, max_len=40, **SMALL)
    tight = EngineCore(qwen, max_slots=6, max_len=40, kv_pages=24, **SMALL)
    sched = Scheduler(tight)
    for i, p in enumerate(prompts):
        sched.add(
            GroupRequest(
                i, i, tuple(p), 1, seed=request_seed(8, i), max_new_tokens=24, interrupt=interrupt
            )
        )
    done = sorted((c for _, g in sched.run() for c in g), key=lambda c: c.prompt_index)
    assert sched.stats.preemptions > 0 and sched.stats.recomputed_tokens > 0
    want = generate(roomy, prompts, **kw)
    assert [(c.tokens, c.sampled) for c in done] == [(c.tokens, c.sampled) for c in want]
    np.testing.assert_allclose(
        np.concatenate([c.logprobs for c in done]),
        np.concatenate([c.logprobs for c in want]),
        rtol=0,
        atol=1e-5,
    )
    assert all(c.interrupted for c in done)


def test_requests_that_do_not_fit_are_refused(qwen):
    core = EngineCore(qwen, max_slots=2, max_len=40, kv_layout="contiguous", max_interrupt_ids=3)
    sched = Scheduler(core)
    req = GroupRequest(0, 0, (3, 4), 1, seed=0, max_new_tokens=8)
    with pytest.raises(RequestError, match="max_new_tokens=8"):  # 6 + 3 + 5 > 8
        sched.check(GroupRequest(0, 0, (3, 4), 1, 0, 8, interrupt=INTERRUPT))
    four = Interrupt(6, (*FORCED, 43), 5)
    with pytest.raises(RequestError, match="max_interrupt_ids"):  # 4 ids > 3
        sched.check(GroupRequest(0, 0, (3, 4), 1, 0, 20, interrupt=four))
    with pytest.raises(RequestError, match="inserted token ids must be in"):
        sched.check(GroupRequest(0, 0, (3, 4), 1, 0, 20, interrupt=Interrupt(4, (H.VOCAB,), 2)))
    with pytest.raises(RequestError, match="answer_budget"):
        Interrupt(4, (5,), 0)
    sched.check(req)  # without forcing: unchanged


def _completion(tokens, sampled):
    return Completion(0, 0, tokens, [-1.0] * len(tokens), "length", [0] * len(tokens), sampled)


def test_batch_masks_inserted_tokens_from_the_loss():
    prompt = [5, 6, 7]
    tokens = [10, 11, 40, 41, 12]
    interrupt = Interrupt(2, (40, 41), 1)
    sampled = interrupt.sampled(5)
    assert interrupt.total == 5 and sampled == [True, True, False, False, True]
    plain, forced = (
        collate([Sample(prompt, tokens, [-1.0] * 5, 1.0, sampled=s)], rows=1, seq_len=10, pad_id=0)
        for s in (None, sampled)
    )
    # completion token j is the target at shifted position len(prompt) - 1 + j = 2 + j
    assert plain.mask_BxT[0].tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0]
    assert forced.mask_BxT[0].tolist() == [0, 0, 1, 1, 0, 0, 1, 0, 0]
    assert forced.tokens.mask_BxT[0].tolist() == [0, 0, 1, 1, 0, 0, 1, 0, 0]
    assert forced.tokens.target_ids_BxT[0, 2:7].tolist() == tokens  # still in the sequence
    masked = collate(
        [Sample(prompt, tokens, [-1.0] * 5, 1.0, train=False, sampled=sampled)],
        rows=1,
        seq_len=10,
        pad_id=0,
    )
    assert masked.mask_BxT.sum() == 0
    with pytest.raises(ValueError, match="sample 0: 2 sampled flags for 5 tokens"):
        collate([Sample(prompt, tokens, [0.0] * 5, 1.0, sampled=[True] * 2)], rows=1,
                seq_len=10, pad_id=0)  # fmt: skip


def test_interrupted_fraction_metric():
    def group(*completions):
        return ScoredGroup(None, [1], list(completions), np.array([0.0, 1.0]),
                           np.array([0.0, 1.0]), "d")  # fmt: skip

    asm = BatchAssembler(2, zero_variance_filter=False)
    asm.offer(
        group(_completion([1, 2], [True, True]), _completion([1, 9, 3], [True, False, True])), 0
    )
    asm.offer(group(_completion([1], [True]), _completion([4], [True])), 0)
    assert asm.metrics()["rollout/interrupted_fraction"] == 0.25
    off = BatchAssembler(1, zero_variance_filter=False)
    off.offer(group(_completion([1], None), _completion([2], None)), 0)
    assert "rollout/interrupted_fraction" not in off.metrics()  # off: metrics unchanged


class _Tok:
    def encode(self, text, add_special_tokens=False):
        return [ord(ch) for ch in text]


def test_config(tmp_path):
    cfg = load(None, ["model.path=m"])
    assert cfg.rollout.interrupt.thinking_budget == 0
    assert from_config(cfg.rollout.interrupt, _Tok(), max_new_tokens=64) is None
    on = ["model.path=m", "rollout.max_new_tokens=40", "rollout.interrupt.thinking_budget=20",
          "rollout.interrupt.text=' ok'", "rollout.interrupt.answer_budget=10"]  # fmt: skip
    it = from_config(load(None, on).rollout.interrupt, _Tok(), max_new_tokens=40)
    assert it == Interrupt(20, (32, 111, 107), 10)
    with pytest.raises(ValueError, match=r"exceeds rollout.max_new_tokens=32"):
        from_config(load(None, on).rollout.interrupt, _Tok(), max_new_tokens=32)
    with pytest.raises(ConfigError, match=r"rollout.interrupt.*rollout.backend: vllm"):
        load(None, [*on, "rollout.backend=vllm"])
    with pytest.raises(ConfigError, match=r"must fit in rollout.max_new_tokens=30"):
        load(None, [*on, "rollout.max_new_tokens=30"])
    with pytest.raises(ConfigError, match="thinking_budget must be >= 0"):
        load(None, ["model.path=m", "rollout.interrupt.thinking_budget=-1"])
    with pytest.raises(ConfigError, match=r"unknown key .rollout.interrupt.budget."):
        load(None, ["model.path=m", "rollout.interrupt.budget=3"])


@pytest.mark.slow
def test_trainer_runs_with_budget_forcing(tmp_path):
    from helpers_train import tiny_run

    from rlvr_jax import cli
    from rlvr_jax.training.metrics import read_jsonl

    cfg = tiny_run(tmp_path)
    args = ["--config", str(cfg), "train.max_steps=1", "rollout.max_new_tokens=16",
            "rollout.interrupt.thinking_budget=4", "rollout.interrupt.text=' ok'",
            "rollout.interrupt.answer_budget=4", "log.sample_completions=4"]  # fmt: skip
    for layout in ("paged", "contiguous"):
        out = tmp_path / layout
        assert (
            cli.train_main([*args, f"rollout.kv_layout={layout}", f"train.output_dir={out}"]) == 0
        )
        row = read_jsonl(out / "metrics.jsonl")[-1]
        assert 0.0 < row["rollout/interrupted_fraction"] <= 1.0  # a random policy rarely stops
        lines = (out / "samples.jsonl").read_text().splitlines()
        texts = [json.loads(x)["completion"] for x in lines]
        assert any(" ok" in t for t in texts)


def _load_script():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "experiment_budget_forcing.py"
    spec = importlib.util.spec_from_file_location("experiment_budget_forcing", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_experiment_script_arms_and_summary():
    exp = _load_script()
    assert exp.arm_overrides("off", budget=8, text="x", answer=4) == [
        "rollout.interrupt.thinking_budget=0"
    ]
    on = exp.arm_overrides("on", budget=8, text="</think> ok", answer=4)
    cfg = load(None, ["model.path=m", *on])  # the overrides parse back to the values
    assert (cfg.rollout.interrupt.thinking_budget, cfg.rollout.interrupt.answer_budget) == (8, 4)
    assert cfg.rollout.interrupt.text == "</think> ok"
    rows = [
        {"reward/mean": 0.2, "response_length/mean": 30.0, "rollout/interrupted_fraction": 0.5},
        {"reward/mean": 0.4, "response_length/mean": 20.0, "rollout/interrupted_fraction": 0.3},
        {"reward/mean": 0.6, "response_length/mean": 10.0, "rollout/interrupted_fraction": 0.1},
    ]
    s = exp.summarize(rows)
    assert s["reward_mean"] == pytest.approx(0.4) and s["reward_last_half"] == pytest.approx(0.5)
    assert s["interrupted_fraction"] == pytest.approx(0.3) and s["response_length"] == 20.0
    assert np.isnan(exp.summarize([{"reward/mean": 0.1}])["interrupted_fraction"])
    with pytest.raises(ValueError, match="unknown arm"):
        exp.arm_overrides("both", budget=1, text="x", answer=1)


@pytest.mark.slow
def test_forcing_on_a_mesh_equals_one_device(qwen):
    """Slots (and their forced tokens) split over 4 data shards, heads over 2 tensor shards:
    the same tokens, flags and log-probs as one device."""
    import jax

    from rlvr_jax import sharding

    if jax.device_count() < 8:
        pytest.skip("needs the 8 simulated devices of tests/conftest.py")
    mesh = sharding.make_mesh({"data": 4, "tensor": 2})
    prompts = _prompts([5, 9, 3, 7], seed=6)
    gen = dict(max_new_tokens=20, num_samples=2, seed=2, interrupt=INTERRUPT)
    got = generate(EngineCore(qwen, max_slots=8, max_len=40, mesh=mesh, **SMALL), prompts, **gen)
    want = generate(EngineCore(qwen, max_slots=8, max_len=40, **SMALL), prompts, **gen)
    assert [(c.tokens, c.sampled) for c in got] == [(c.tokens, c.sampled) for c in want]
    assert all(c.interrupted for c in got)
    np.testing.assert_allclose(
        np.concatenate([c.logprobs for c in got]),
        np.concatenate([c.logprobs for c in want]),
        rtol=0,
        atol=1e-5,
    )
