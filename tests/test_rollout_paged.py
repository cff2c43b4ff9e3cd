"""The paged KV cache against the contiguous one (an independent layout of the same math),
and the paged engine's own mechanics: prefix pages, chunked prefill, preemption and
resumption, weight updates, pool limits.

Engines use pages of 4 tokens and small geometry (8-token blocks, 2 blocks per decode
iteration, 8-token prefill blocks) so that every sequence spans several pages, blocks and
loop iterations.
"""

from __future__ import annotations

import dataclasses

import helpers_models as H
import jax
import numpy as np
import pytest

from rlvr_jax import models
from rlvr_jax.rollout import (
    EngineCore,
    GroupRequest,
    RequestError,
    RolloutStream,
    SamplingParams,
    Scheduler,
    generate,
    request_seed,
)

SMALL = dict(page_size=4, geometry_tokens=(8, 16, 8))
STOP = (7, 11, 19)


def _prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(2, H.VOCAB, n).tolist() for n in lengths]


def _same(got, want, atol=1e-5):
    assert [(c.tokens, c.finish_reason) for c in got] == [(c.tokens, c.finish_reason) for c in want]
    np.testing.assert_allclose(
        np.concatenate([c.logprobs for c in got]),
        np.concatenate([c.logprobs for c in want]),
        rtol=0,
        atol=atol,
    )


def _model(tmp_path_factory, arch, **overrides):
    path = tmp_path_factory.mktemp(f"{arch}_paged")
    H.build_hf_checkpoint(arch, path, seed=5, **overrides)
    return models.load_pretrained(path)


# A bf16 cache rounds every cached K/V: a 1e-7 difference in summation order between the
# layouts flips the rounding of the odd value by one bf16 ulp (seen: one value of 2 x 20 x
# 2 x 24, giving 3e-4 in later log-probs), so there log-probs agree to bf16 rounding, not
# 1e-5; greedy tokens are identical in every case.
CASES = {
    "gqa": ("llama", {}, None),
    "sliding": ("olmo3", {}, None),  # W = 3: prompts and generations far past the window
    "tied": ("qwen2", {"tie_word_embeddings": True}, None),
    "bf16_cache": ("qwen3", {}, "bfloat16"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.slow
def test_paged_equals_contiguous(tmp_path_factory, case):
    arch, overrides, cache_dtype = CASES[case]
    model = _model(tmp_path_factory, arch, **overrides)
    kw = dict(max_slots=4, max_len=48, cache_dtype=cache_dtype)
    contiguous = EngineCore(model, kv_layout="contiguous", **kw)
    paged = EngineCore(model, prefill_chunk=8, **SMALL, **kw)
    assert paged.spec.kv_layout.name == "paged" and paged.spec.geometry.pages_per_block == 2
    prompts = _prompts([1, 5, 13, 21], seed=1)  # 21 tokens: three prefill chunks
    atol = 1e-5 if cache_dtype is None else 1e-3
    for sampling in (dict(temperature=0.0), dict(temperature=1.0, num_samples=2, seed=4)):
        gen = dict(max_new_tokens=20, stop_token_ids=STOP, **sampling)
        _same(generate(paged, prompts, **gen), generate(contiguous, prompts, **gen), atol)


@pytest.mark.slow
def test_group_samples_share_prompt_pages(qwen):
    core = EngineCore(qwen, max_slots=4, max_len=40, **SMALL)
    sched = Scheduler(core)
    prompt = tuple(_prompts([10], seed=2)[0])  # 9 cached tokens: 2 full pages + 1 partial
    sched.add(GroupRequest(0, 0, prompt, 4, seed=request_seed(0, 0), max_new_tokens=12))
    sched.step()
    pages = [slot.pages for slot in sched._slots.values()]
    alloc = sched._kv.allocator
    shared = pages[0][:2]
    assert all(p[:2] == shared for p in pages) and len({p[2] for p in pages}) == 4
    assert list(alloc.refcount[0, shared]) == [4, 4]  # the group's own hold was released
    # 8 steps from position 9: positions 9..16, 5 pages per sample (2 shared)
    assert sched.pages_in_use == 2 + 4 * 3
    alloc.check_invariants()
    done = sched.run()
    assert alloc.in_use == 0 and len(done[0][1]) == 4
    reference = generate(
        EngineCore(qwen, max_slots=4, max_len=40, kv_layout="contiguous"),
        [list(prompt)],
        max_new_tokens=12,
        num_samples=4,
        seed=0,
    )
    _same(done[0][1], reference)


@pytest.mark.slow
def test_chunked_prefill_equals_one_shot(qwen):
    prompts = _prompts([30, 17], seed=3)
    kw = dict(max_new_tokens=8, temperature=1.0, num_samples=2, seed=2)
    one_shot = generate(
        EngineCore(qwen, max_slots=4, max_len=48, prefill_chunk=64, **SMALL), prompts, **kw
    )
    for chunk in (4, 8, 16):
        core = EngineCore(qwen, max_slots=4, max_len=48, prefill_chunk=chunk, **SMALL)
        _same(generate(core, prompts, **kw), one_shot)


@pytest.mark.slow
def test_preempted_sequences_resume_identically(qwen):
    # 6 requests of up to 36 positions on a pool of 24 pages (96 tokens): they cannot all
    # grow at once, so the newest are preempted, requeued and recomputed.
    prompts = _prompts([6, 9, 4, 11, 7, 5], seed=5)
    kw = dict(max_new_tokens=24, temperature=1.0, num_samples=1, seed=8)
    roomy = EngineCore(qwen, max_slots=6, max_len=40, **SMALL)
    tight = EngineCore(qwen, max_slots=6, max_len=40, kv_pages=24, **SMALL)
    sched = Scheduler(tight)
    streamed = {i: ([], []) for i in range(len(prompts))}  # on_tokens, per prompt

    def hook(i):
        def on_tokens(sample_index, tokens, logprobs):
            assert sample_index == 0
            streamed[i][0].extend(tokens)
            streamed[i][1].extend(logprobs)

        return on_tokens

    for i, p in enumerate(prompts):
        seed = request_seed(8, i)
        sched.add(GroupRequest(i, i, tuple(p), 1, seed, max_new_tokens=24, on_tokens=hook(i)))
    done = sorted((c for _, g in sched.run() for c in g), key=lambda c: c.prompt_index)
    assert sched.stats.preemptions > 0 and sched.stats.recomputed_tokens > 0
    assert sched.pages_in_use == 0
    sched._kv.allocator.check_invariants()
    _same(done, generate(roomy, prompts, **kw))
    metrics = sched.kv_metrics()  # what the trainer logs (over an interval: since a snapshot)
    assert metrics["rollout/preemptions"] == sched.stats.preemptions
    assert metrics["rollout/recomputed_tokens"] == sched.stats.recomputed_tokens
    assert 0.0 < metrics["rollout/kv_utilisation"] <= 1.0
    assert metrics["rollout/kv_pages_in_use"] == 0
    assert sched.kv_metrics(since=dataclasses.replace(sched.stats))["rollout/preemptions"] == 0
    # a preempted and resumed sample streams each token once: nothing recomputed is re-sent
    for c in done:
        assert streamed[c.prompt_index] == (c.tokens, c.logprobs)


@pytest.mark.slow
def test_weight_update_keeps_pages_and_versions(qwen):
    rng = np.random.default_rng(0)
    core = EngineCore(qwen, max_slots=2, max_len=40, **SMALL)
    new = jax.tree.map(
        lambda x: x + 0.3 * rng.standard_normal(x.shape).astype(np.float32), qwen.params
    )
    stream = RolloutStream(core, max_new_tokens=20, sampling=SamplingParams(temperature=0.0))
    stream.submit("x", _prompts([9], seed=6)[0], num_samples=2, seed=0)
    assert stream.step() == []  # 8 tokens under version 0
    pages = [list(s.pages) for s in stream.scheduler._slots.values()]
    stream.update_weights(new, version=1)
    stream.step()  # swapped at the boundary: the pages written so far are kept
    assert [s.pages[: len(p)] for s, p in zip(stream.scheduler._slots.values(), pages)] == pages
    groups = []
    while not stream.idle:
        groups += stream.step()
    for c in groups[0].completions:
        assert c.policy_versions == [0] * 8 + [1] * 12


@pytest.mark.slow
def test_request_larger_than_pool_is_refused_and_others_served(qwen):
    core = EngineCore(qwen, max_slots=2, max_len=64, kv_pages=6, **SMALL)  # 24 tokens
    with pytest.raises(
        RequestError, match=r"needs 8 pages of 4 tokens, more than the whole KV pool"
    ):
        generate(core, [[3] * 10], max_new_tokens=20)
    stream = RolloutStream(core, max_new_tokens=8).start()
    try:
        with pytest.raises(RequestError, match="more than the whole KV pool"):
            stream.submit("big", [3] * 10, num_samples=1, seed=0, max_new_tokens=20)
        stream.submit("ok", [3, 4, 5], num_samples=2, seed=0)
        group = stream.get(timeout=120)
    finally:
        stream.stop()
    assert group.request_id == "ok" and [len(c.tokens) for c in group.completions] == [8, 8]


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.slow
def test_compile_ahead_leaves_nothing_to_compile(qwen, layout):
    import logging

    core = EngineCore(qwen, max_slots=4, max_len=48, kv_layout=layout, **SMALL)
    assert core.compile_ahead() >= 6
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect()
    logging.getLogger("jax").addHandler(handler)
    jax.config.update("jax_log_compiles", True)
    try:
        generate(core, _prompts([3, 28, 9], seed=9), max_new_tokens=10, num_samples=2)
    finally:
        jax.config.update("jax_log_compiles", False)
        logging.getLogger("jax").removeHandler(handler)
    assert not [m for m in messages if m.startswith("Compiling")], messages


@pytest.mark.parametrize(("key", "arg", "compiled"), [
    (True, None, True), (False, None, False), (False, True, True), (True, False, False),
])  # fmt: skip
def test_build_rollout_compiles_ahead_as_rollout_compile_ahead_says(
    qwen, tiny_tokenizer, monkeypatch, key, arg, compiled
):
    """`rollout.compile_ahead` decides unless the caller says (rlvr-serve: never)."""
    from rlvr_jax.config.schema import RolloutConfig
    from rlvr_jax.rollout import build_rollout

    calls = []
    monkeypatch.setattr(EngineCore, "compile_ahead", lambda self, *a: calls.append(self) or 0)
    cfg = RolloutConfig(max_slots=4, compile_ahead=key)
    build_rollout(cfg, qwen, None, tiny_tokenizer, max_len=48, compile_ahead=arg)
    assert len(calls) == compiled


@pytest.mark.slow
def test_packed_rows_equal_full_rows(qwen):
    """16 slots (row buckets 8 and 16): as slots finish, live ones are moved down and the
    engine decodes 8 rows; the completions equal the contiguous engine's."""
    prompts = _prompts([3, 8, 5, 12, 2, 9, 4, 7, 6, 10, 3, 5], seed=11)
    kw = dict(max_new_tokens=20, stop_token_ids=STOP, temperature=1.0, num_samples=2, seed=6)
    core = EngineCore(qwen, max_slots=16, max_len=40, **SMALL)
    assert core.spec.row_buckets == (8, 16)
    sched = Scheduler(core)
    for i, p in enumerate(prompts):
        sched.add(
            GroupRequest(
                i, i, tuple(p), 2, seed=request_seed(6, i), max_new_tokens=20, stop_token_ids=STOP
            )
        )
    got = sorted(
        (c for _, g in sched.run() for c in g), key=lambda c: (c.prompt_index, c.sample_index)
    )
    assert sched.stats.row_steps < 16 * sched.stats.decode_steps  # some chunks ran 8 rows
    assert sched.pages_in_use == 0
    _same(
        got,
        generate(EngineCore(qwen, max_slots=16, max_len=40, kv_layout="contiguous"), prompts, **kw),
    )


@pytest.mark.slow
def test_static_batching_decodes_its_whole_batch(qwen):
    """Static batching keeps its batch shape until the longest request ends (no row buckets:
    what HF `generate` and the waste model count), with the same completions."""
    prompts = _prompts([3, 8, 5, 12, 2, 9], seed=11)
    core = EngineCore(qwen, max_slots=16, max_len=40, **SMALL)
    out = {}
    for batching in ("static", "continuous"):
        sched = Scheduler(core, batching=batching)
        for i, p in enumerate(prompts):
            n = 20 if i == 0 else 4  # one long request: the rest end in the first chunk
            request = GroupRequest(
                i, i, tuple(p), 2, seed=request_seed(6, i), max_new_tokens=n, stop_token_ids=STOP
            )
            sched.add(request)
        done = sorted((c for _, g in sched.run() for c in g), key=lambda c: c.prompt_index)
        out[batching] = (done, sched.stats)
    (static, s_stats), (continuous, c_stats) = out["static"], out["continuous"]
    assert s_stats.row_steps == 16 * s_stats.decode_steps
    assert c_stats.row_steps < 16 * c_stats.decode_steps  # continuous: down to 8 rows
    _same(static, continuous)
