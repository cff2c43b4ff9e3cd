"""Multi-turn episodes inside the engine's slots (`rollout.turns`): a sample that stops is
parked, its hook's response is appended to the same sequence (paged: into its pages with the
chunked-prefill call; contiguous: into its row) and decoding resumes. Checked here: the
appended tokens are `sampled=False` with log-prob 0 and the policy version of the turn that
follows; every sampled token's log-prob equals a full re-forward of prompt + completion (so
the cache holds exactly the appended tokens); both layouts give the same tokens; parked
sequences preempted under page pressure resume identically; a hook that is slow, raises, or
answers with too many tokens ends nothing but its own episode; on a tensor-parallel mesh the
appended turns equal the single-device ones (both layouts; two slot shards)."""

from __future__ import annotations

import concurrent.futures
import threading

import helpers_models as H
import numpy as np
import pytest

from rlvr_jax import models
from rlvr_jax.rollout import EngineCore, GroupRequest, Scheduler, request_seed

SMALL = dict(page_size=4, geometry_tokens=(8, 16, 8))
STOPS = (7, 11, 19, 23, 29, 31, 37, 43)  # frequent stops: turns end early
RESPONSES = ([50, 51, 52, 53, 54], [60, 61, 62])  # appended after turns 1 and 2


class Hook:
    """Appends RESPONSES[k] after turn k + 1 (turns ended by a stop id), then ends; records
    each call. `delay` answers from a timer thread; `fail` raises in the future."""

    def __init__(self, responses=RESPONSES, delay=0.0, fail=False):
        self.responses, self.delay, self.fail = responses, delay, fail
        self.calls: dict[int, list] = {}
        self.lock = threading.Lock()

    def next_turn(self, i, tokens, finish_reason):
        with self.lock:
            calls = self.calls.setdefault(i, [])
            calls.append((list(tokens), finish_reason))
            turn = len(calls) - 1
        future = concurrent.futures.Future()
        if self.fail:
            future.set_exception(RuntimeError("the tool broke"))
            return future
        more = finish_reason == "stop" and turn < len(self.responses)
        answer = list(self.responses[turn]) if more else None
        if self.delay:
            threading.Timer(self.delay, future.set_result, (answer,)).start()
        else:
            future.set_result(answer)
        return future

    def episode(self, i):
        return {"turns": len(self.calls[i])}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_turns")
    H.build_hf_checkpoint("qwen2", path, seed=7)
    return models.load_pretrained(path)


def _prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(2, H.VOCAB, n).tolist() for n in lengths]


def _run(core, prompts, hooks, *, new=40, samples=2, seed=3):
    sched = Scheduler(core)
    for i, p in enumerate(prompts):
        request = GroupRequest(
            i, i, tuple(p), samples, seed=request_seed(seed, i), max_new_tokens=new,
            stop_token_ids=STOPS, turns=hooks[i],
        )  # fmt: skip
        sched.add(request)
    done = sorted(
        (c for _, g in sched.run() for c in g), key=lambda c: (c.prompt_index, c.sample_index)
    )
    return sched, done


def _reforward_logprobs(model, prompt, tokens):
    logits = np.asarray(models.forward(model, np.array([prompt + tokens])))[0].astype(np.float64)
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    return np.array([logp[len(prompt) - 1 + i, t] for i, t in enumerate(tokens)])


def _check_episode(model, prompt, c, hook):
    calls = hook.calls[c.sample_index]
    appended = [r for r, (_, finish) in zip(RESPONSES, calls) if finish == "stop"]
    assert c.episode == {"turns": len(calls)}
    spans = [i for i, s in enumerate(c.sampled) if not s]
    assert len(spans) == sum(map(len, appended[: len(calls) - 1]))
    flat = [t for r in appended for t in r]
    assert [c.tokens[i] for i in spans] == flat[: len(spans)]
    assert all(c.logprobs[i] == 0.0 for i in spans)
    # each turn's hook saw the whole sequence so far, ending with the turn's stop token
    for tokens, finish in calls:
        assert c.tokens[: len(tokens)] == tokens
        assert finish == "length" or tokens[-1] in STOPS
    mask = np.array(c.sampled)
    ref = _reforward_logprobs(model, prompt, c.tokens)
    np.testing.assert_allclose(np.array(c.logprobs)[mask], ref[mask], rtol=0, atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_turns_resume_in_place_with_appended_tokens_masked(qwen, layout):
    prompts = _prompts([5, 9, 3], seed=1)
    hooks = [Hook() for _ in prompts]
    core = EngineCore(qwen, max_slots=4, max_len=64, kv_layout=layout, **SMALL)
    sched, done = _run(core, prompts, hooks)
    assert len(done) == 6 and sched.idle and sched.parked == 0
    assert sched._turns.count > 0  # some episodes went past one turn
    assert any(len(c.episode and hooks[c.prompt_index].calls[c.sample_index]) == 3 for c in done)
    for c in done:
        _check_episode(qwen, prompts[c.prompt_index], c, hooks[c.prompt_index])
    assert sched.kv_metrics()["env/parked_slots"] >= 0.0


@pytest.mark.slow
def test_layouts_agree_and_preempted_parked_sequences_resume_identically(qwen):
    prompts = _prompts([6, 9, 4, 11, 7, 5], seed=5)
    runs = {}
    for name, extra in {
        "contiguous": dict(kv_layout="contiguous"),
        "paged": {},
        "tight": dict(kv_pages=30),  # parked and live sequences lose their pages
    }.items():
        hooks = [Hook(delay=0.01) for _ in prompts]
        core = EngineCore(qwen, max_slots=6, max_len=64, **SMALL, **extra)
        sched, done = _run(core, prompts, hooks, samples=1, new=44)
        runs[name] = (sched, done, hooks)
    sched, tight, hooks = runs["tight"]
    assert sched.stats.preemptions > 0 and sched.stats.recomputed_tokens > 0
    want = [(c.tokens, c.sampled, c.finish_reason) for c in runs["contiguous"][1]]
    for name in ("paged", "tight"):
        assert [(c.tokens, c.sampled, c.finish_reason) for c in runs[name][1]] == want
    np.testing.assert_allclose(
        np.concatenate([c.logprobs for c in tight]),
        np.concatenate([c.logprobs for c in runs["contiguous"][1]]),
        rtol=0,
        atol=1e-5,
    )
    for c in tight:
        _check_episode(qwen, prompts[c.prompt_index], c, hooks[c.prompt_index])


def test_appended_tokens_carry_the_version_of_the_turn_that_follows(qwen):
    prompts = _prompts([5], seed=2)
    core = EngineCore(qwen, max_slots=2, max_len=64, **SMALL)
    sched = Scheduler(core)
    hook = Hook(responses=([50, 51, 52],))
    sched.add(GroupRequest(0, 0, tuple(prompts[0]), 1, seed=4, max_new_tokens=40,
                           stop_token_ids=STOPS, turns=hook))  # fmt: skip
    while not sched.parked and not sched.idle:
        assert not sched.step()
    if sched.idle:
        pytest.skip("the first turn ran out of budget")
    sched.set_params(sched.params, 1)  # a weight update while the sequence is parked
    done = sched.run()
    c = done[0][1][0]
    first = c.sampled.index(False)
    assert set(c.policy_versions[:first]) == {0}
    assert set(c.policy_versions[first:]) == {1}


def test_a_failing_or_overlong_hook_ends_its_episode_only(qwen):
    prompts = _prompts([5, 8], seed=3)
    core = EngineCore(qwen, max_slots=4, max_len=64, **SMALL)
    long_hook = Hook(responses=(list(range(50, 90)),))  # 40 tokens: over the budget of 40
    _, done = _run(core, prompts, [Hook(fail=True), long_hook])
    assert len(done) == 4 and all(c.sampled is None for c in done)  # nothing appended
    for c in done:  # the failed hook ends as the turn did; the overlong one is truncated
        stopped = c.tokens[-1] in STOPS and len(c.tokens) < 40
        assert c.finish_reason == ("stop" if stopped and c.prompt_index == 0 else "length")


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_turns_on_a_tensor_parallel_mesh_match_one_device(qwen, layout):
    from rlvr_jax import sharding

    mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 2}, __import__("jax").devices()[:4])
    prompts = _prompts([5, 7], seed=6)
    got = {}
    for name, m in (("mesh", mesh), ("one", None)):
        core = EngineCore(qwen, max_slots=4, max_len=64, mesh=m, kv_layout=layout, **SMALL)
        got[name] = _run(core, prompts, [Hook(), Hook()])[1]
    assert [c.tokens for c in got["mesh"]] == [c.tokens for c in got["one"]]
    np.testing.assert_allclose(
        np.concatenate([c.logprobs for c in got["mesh"]]),
        np.concatenate([c.logprobs for c in got["one"]]),
        rtol=0,
        atol=1e-4,
    )
