"""The JetStream 0.2.2 adapter: the Engine API on our core, and JetStream's own orchestrator
running it in-process; a failing JetStream thread is surfaced, not a process kill."""

from __future__ import annotations

import asyncio
import threading

import helpers_models as H
import numpy as np
import pytest

from rlvr_jax import models
from rlvr_jax.rollout import SamplingParams, generate, make_engine
from rlvr_jax.rollout.backends import jetstream_compat as compat

pytestmark = pytest.mark.slow  # compiles the engine of a chat model (~25 s on two cores)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_js")
    H.build_chat_model(path, seed=2)
    model = models.load_pretrained(path)
    return make_engine(
        model,
        max_slots=4,
        max_len=64,
        sampling=SamplingParams(temperature=0.0),
        stop_token_ids=(),
    )


def test_engine_api_matches_generate(engine):
    api = compat.engine_api()
    assert isinstance(engine, api.Engine)
    assert (engine.max_concurrent_decodes, engine.samples_per_slot) == (4, 1)
    assert engine.max_prefill_length == 32  # largest JetStream bucket <= max_len - 1
    prompt = [5, 17, 42, 99, 3]
    padded = np.zeros(16, np.int32)
    padded[:5] = prompt
    params = engine.load_params()
    state = engine.init_decode_state()
    state = engine.insert(
        engine.prefill(params=params, padded_tokens=padded, true_length=5), state, slot=2
    )
    tokens = []
    for step in range(6):
        state, result = engine.generate(params, state)
        result = result.convert_to_numpy()
        slot = result.get_result_at_slot(2)
        assert slot.valid[0, 0] == 1 and slot.lengths[0] == step + 1
        assert result.get_result_at_slot(0).valid[0, 0] == 0  # empty slots produce nothing
        tokens.append(int(slot.tokens[0, 0]))
    want = generate(engine.core, [prompt], max_new_tokens=6, temperature=0.0)[0].tokens
    assert tokens == want


def test_tokenizer_is_our_hf_tokenizer(engine):
    tok = engine.build_tokenizer(engine.get_tokenizer())
    ids, true_length = tok.encode("hello world", max_prefill_length=32, jax_padding=False)
    assert ids.shape == (16,) and tok.decode(ids[:true_length].tolist()).endswith("hello world")
    # bos / eos / pad of the trained tokenizer: ids 0, 1, 2; stops: EOS only (not pad).
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2)
    assert tok.stop_tokens == {1}


async def _decode_all(orchestrator, pb, requests):
    async def one(request):
        out = []
        async for response in orchestrator.Decode(request):
            out.extend(response.stream_content.samples[0].token_ids)
        return out

    return await asyncio.gather(*(one(r) for r in requests))


def test_jetstream_orchestrator_runs_our_engine(engine):
    orch = compat.orchestrator()
    from jetstream.core.proto import jetstream_pb2 as pb

    params = engine.load_params()
    driver = orch.Driver(
        prefill_engines=[engine],
        generate_engines=[engine],
        prefill_params=[params],
        generate_params=[params],
        interleaved_mode=True,
    )
    try:
        prompts = [[5, 17, 42], [9, 8, 7, 6, 5, 4], [33]]
        requests = [
            pb.DecodeRequest(max_tokens=6, token_content=pb.DecodeRequest.TokenContent(token_ids=p))
            for p in prompts
        ]
        requests.append(
            pb.DecodeRequest(
                max_tokens=4, text_content=pb.DecodeRequest.TextContent(text="hello world")
            )
        )
        outputs = asyncio.run(_decode_all(orch.LLMOrchestrator(driver), pb, requests))
    finally:
        driver.stop()
    # JetStream prepends BOS (id 0) to token requests and emits max_tokens tokens, dropping
    # a stop token; greedy results must equal our scheduler's.
    for prompt, got in zip(prompts, outputs):
        want = generate(
            engine.core, [[0, *prompt]], max_new_tokens=6, temperature=0.0, stop_token_ids=(1,)
        )[0]
        tokens = want.tokens[:-1] if want.finish_reason == "stop" else want.tokens
        assert got == tokens
    tok = engine.build_tokenizer(engine.get_tokenizer())
    text_prompt = tok.hf.encode("hello world")
    want = generate(
        engine.core, [text_prompt], max_new_tokens=4, temperature=0.0, stop_token_ids=(1,)
    )[0]
    assert outputs[3] == (want.tokens[:-1] if want.finish_reason == "stop" else want.tokens)


def test_failing_jetstream_thread_is_surfaced_not_killed(engine, monkeypatch):
    orch = compat.orchestrator()
    assert orch.JetThread is compat.SurfacingThread
    failed = threading.Event()
    seen = []
    remove = compat.on_thread_error(lambda t, e: (seen.append((t, e)), failed.set()))

    def broken_generate(params, decode_state):
        raise RuntimeError("device fell over")

    monkeypatch.setattr(engine, "generate", broken_generate)
    params = engine.load_params()
    driver = orch.Driver(
        prefill_engines=[engine],
        generate_engines=[engine],
        prefill_params=[params],
        generate_params=[params],
        interleaved_mode=True,
    )
    try:
        from jetstream.core.proto import jetstream_pb2 as pb

        request = pb.DecodeRequest(
            max_tokens=3, token_content=pb.DecodeRequest.TokenContent(token_ids=[4, 5])
        )

        async def start_one():
            agen = orch.LLMOrchestrator(driver).Decode(request)
            task = asyncio.ensure_future(agen.__anext__())
            await asyncio.sleep(0)
            assert await asyncio.to_thread(failed.wait, 60)
            task.cancel()

        asyncio.run(start_one())
    finally:
        remove()
        driver.stop()
    ((thread, error),) = seen
    assert thread.name.startswith("generate") and "device fell over" in str(error)
    assert compat.owner_of(thread) is driver
    assert any(e is error for _, e in compat.thread_errors())
