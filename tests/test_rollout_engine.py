"""The rollout engine against transformers on tiny random models (independent reference).

Greedy tokens must equal `transformers` `generate`; the log-prob of every sampled token
must equal log_softmax(HF logits / T) at its position; continuous and static batching must
give the same tokens; groups share one prefill.
"""

from __future__ import annotations

import helpers_models as H
import numpy as np
import pytest

from rlvr_jax import models
from rlvr_jax.bench.waste import continuous_steps, static_steps, waste
from rlvr_jax.rollout import EngineCore, GroupRequest, RequestError, Scheduler, generate

ARCHS = ["llama", "qwen2", "qwen3", "olmo2", "olmo3"]


def _prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(2, H.VOCAB, n).tolist() for n in lengths]


def _hf_greedy(hf_model, prompt, n):
    import torch

    hf_model.generation_config.eos_token_id = None
    hf_model.generation_config.pad_token_id = 0
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf_model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    """(arch, HF torch model, engine over the same weights); one compiled engine per arch."""
    path = tmp_path_factory.mktemp(request.param)
    hf_model = H.build_hf_checkpoint(request.param, path, seed=3)
    return (
        request.param,
        hf_model,
        EngineCore(models.load_pretrained(path), max_slots=4, max_len=32),
    )


@pytest.mark.slow
def test_greedy_tokens_equal_transformers_generate(tiny):
    # Prompt lengths 1 (nothing to prefill), 5, and 9 (> OLMo 3's sliding window of 3).
    arch, hf_model, core = tiny
    prompts = _prompts([1, 5, 9], seed=1)
    got = generate(core, prompts, max_new_tokens=10, temperature=0.0, max_slots=2)
    for c, prompt in zip(got, prompts):
        assert c.tokens == _hf_greedy(hf_model, prompt, 10), f"{arch} prompt {c.prompt_index}"
        assert c.finish_reason == "length" and c.policy_versions == [0] * 10


@pytest.mark.slow
def test_sampled_logprobs_equal_hf_log_softmax(tiny):
    arch, hf_model, core = tiny
    prompts = _prompts([4, 7], seed=2)
    got = generate(core, prompts, max_new_tokens=8, temperature=0.7, num_samples=2, seed=5)
    assert [(c.prompt_index, c.sample_index) for c in got] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for c in got:
        seq = prompts[c.prompt_index] + c.tokens
        logits = H.hf_logits(hf_model, np.array([seq]))[0].astype(np.float64) / 0.7
        logp = (
            logits
            - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))[:, None]
            - logits.max(-1, keepdims=True)
        )
        n = len(prompts[c.prompt_index])
        want = [logp[n - 1 + i, tok] for i, tok in enumerate(c.tokens)]
        np.testing.assert_allclose(c.logprobs, want, atol=2e-4, err_msg=arch)
    # The two samples of a group differ (independent randomness per sample index).
    assert got[0].tokens != got[1].tokens or got[2].tokens != got[3].tokens


@pytest.mark.slow
def test_continuous_equals_static_and_any_slot_count(qwen):
    # Sampling (T=1) with stop tokens: lengths differ, so the schedules differ a lot, but each
    # completion is keyed by (seed, sample, position) and must come out identical.
    prompts = _prompts([3, 6, 2, 8, 5], seed=4)
    kw = dict(max_new_tokens=12, num_samples=3, stop_token_ids=(7, 11, 19, 23), seed=9)
    core = EngineCore(qwen, max_slots=4, max_len=64)
    runs = [
        generate(qwen, prompts, batching="continuous", max_slots=4, **kw),  # builds (4, 64)
        generate(core, prompts, batching="static", **kw),
        generate(core, prompts, batching="continuous", max_slots=1, **kw),
    ]
    for other in runs[1:]:
        assert [(c.tokens, c.finish_reason) for c in other] == [
            (c.tokens, c.finish_reason) for c in runs[0]
        ]
        np.testing.assert_allclose(
            np.concatenate([c.logprobs for c in other]),
            np.concatenate([c.logprobs for c in runs[0]]),
            atol=1e-5,
        )
    reasons = {c.finish_reason for c in runs[0]}
    assert reasons == {"stop", "length"}, "the workload should mix both endings"
    for c in runs[0]:
        if c.finish_reason == "stop":
            assert c.tokens[-1] in kw["stop_token_ids"] and len(c.tokens) <= 12
            assert not set(c.tokens[:-1]) & set(kw["stop_token_ids"])
        else:
            assert len(c.tokens) == 12


@pytest.mark.slow
def test_top_k_and_top_p_reach_the_jitted_sampler(qwen):
    # top_k = 2 leaves two candidates; top_p = 1e-6 then keeps only the most likely one, so
    # sampling at T = 1 must reproduce greedy decoding, with the unfiltered T = 1 log-probs.
    core = EngineCore(qwen, max_slots=4, max_len=64)
    prompts = _prompts([3, 6], seed=8)
    greedy = generate(core, prompts, max_new_tokens=6, temperature=0.0)
    got = generate(
        core, prompts, max_new_tokens=6, temperature=1.0, top_k=2, top_p=1e-6, num_samples=2, seed=3
    )
    for c in got:
        assert c.tokens == greedy[c.prompt_index].tokens
        np.testing.assert_allclose(c.logprobs, greedy[c.prompt_index].logprobs, atol=1e-5)
        assert max(c.logprobs) < 0  # not the log-prob of the filtered distribution (0)


@pytest.mark.smoke("rollout")
def test_group_prefix_is_prefilled_once_and_batching_waste(qwen):
    core = EngineCore(qwen, max_slots=4, max_len=64)
    prompts = _prompts([5, 6], seed=5)
    stats = {}
    for batching in ("continuous", "static"):
        sched = Scheduler(core, batching=batching)
        for i, p in enumerate(prompts):
            sched.add(
                GroupRequest(
                    i,
                    i,
                    tuple(p),
                    num_samples=3,
                    seed=i,
                    max_new_tokens=10,
                    stop_token_ids=(5, 9, 13),
                )
            )
        done = sched.run()
        assert sorted(req.key for req, _ in done) == [0, 1]
        stats[batching] = sched.stats
    # 2 prompts x 3 samples on 4 slots: one prefill per prompt (the second group is split
    # over two admissions but reuses its prefix).
    assert stats["continuous"].prefills == 2 and stats["static"].prefills == 2
    assert stats["continuous"].tokens == stats["static"].tokens
    # waste = 1 - tokens / (steps x slots); static can only waste more slot-steps.
    s = stats["static"]
    assert s.waste == pytest.approx(1 - s.tokens / (s.decode_steps * 4))
    assert stats["continuous"].decode_steps <= stats["static"].decode_steps


def test_waste_arithmetic_hand_derived():
    # 3 slots; lengths 5 1 1 2 4 1 3 (17 tokens).
    lengths = [5, 1, 1, 2, 4, 1, 3]
    # static: batches (5,1,1) (2,4,1) (3) -> 5 + 4 + 3 = 12 steps; waste 1 - 17/36.
    assert static_steps(lengths, 3) == 12
    # continuous, slots' free times in admission order: [0,0,0] -> 5 -> 1 -> 1 ->
    # 2 starts at 1 (ends 3) -> 4 starts at 1 (ends 5) -> 1 starts at 3 (ends 4) ->
    # 3 starts at 4 (ends 7): 7 steps; waste 1 - 17/21.
    assert continuous_steps(lengths, 3) == 7
    assert waste(lengths, 12, 3) == pytest.approx(1 - 17 / 36)
    assert waste(lengths, 7, 3) == pytest.approx(1 - 17 / 21)
    with pytest.raises(ValueError, match="cannot hold"):
        waste(lengths, 5, 3)


def test_measured_steps_equal_the_waste_prediction(qwen):
    # Budgets force the lengths (no stop token): the engine must take exactly the predicted
    # number of decode steps in both modes (continuous: a freed slot is refilled at the
    # very next step; static: a batch lasts as long as its longest member).
    core = EngineCore(qwen, max_slots=4, max_len=64)
    lengths = [9, 2, 5, 1, 12, 3, 3, 7, 1, 6]
    for batching, predict in (("continuous", continuous_steps), ("static", static_steps)):
        sched = Scheduler(core, batching=batching, num_slots=3)
        for i, n in enumerate(lengths):
            sched.add(GroupRequest(i, i, (5, 6, 7), num_samples=1, seed=i, max_new_tokens=n))
        done = sched.run()
        assert sorted(len(g[0].tokens) for _, g in done) == sorted(lengths)
        assert sched.stats.decode_steps == predict(lengths, 3), batching
        assert sched.stats.waste == pytest.approx(waste(lengths, predict(lengths, 3), 3))


def test_request_errors_name_the_problem(qwen):
    core = EngineCore(qwen, max_slots=2, max_len=16)
    with pytest.raises(RequestError, match="exceeds the engine's max_len=16"):
        generate(core, [[3] * 10], max_new_tokens=7)
    with pytest.raises(RequestError, match=r"token ids must be in \[0, 128\)"):
        generate(core, [[3, 500]], max_new_tokens=2)
    with pytest.raises(RequestError, match="prompts\\[1\\] is empty"):
        generate(core, [[3], []], max_new_tokens=2)
    with pytest.raises(ValueError, match="batching must be one of"):
        generate(core, [[3]], max_new_tokens=2, batching="dynamic")
    with pytest.raises(RequestError, match="at most 8"):
        generate(core, [[3]], max_new_tokens=2, stop_token_ids=tuple(range(9)))
    with pytest.raises(ValueError, match="num_slots must be in \\[1, 2\\]"):
        generate(core, [[3]], max_new_tokens=2, max_slots=3)
    with pytest.raises(TypeError, match=r"needs an rlvr_jax\.models\.Model"):
        generate("not a model", [[3]], max_new_tokens=2)
