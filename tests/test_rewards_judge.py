"""LLM judge client against a real HTTP server on loopback (`helpers_judge.FakeJudge`; its
docstring lists the directives that steer its replies)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import pytest
from helpers_judge import MODEL_ID, fake_judge

from rlvr_jax.rewards import judge
from rlvr_jax.rewards.judge import JudgeClient, JudgeItem, JudgeResult, parse_score

SECRET = "sk-test-9f8e7d6c5b4a"


@pytest.fixture
def server():
    with fake_judge() as fake:
        yield fake


def make_client(server, **options) -> JudgeClient:
    options = {"timeout_s": 5, "backoff_s": 0.01, **options}
    return JudgeClient(server.base_url, "judge-model", **options)


# ---- score parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Good answer.\nSCORE: 7", 0.7),  # 7 / 10
        ("Score: **8**", 0.8),
        ("score = 4.5", 0.45),
        ("SCORE: 3/4", 0.75),  # explicit denominator: 3 / 4
        ("I'd give a score of 2. Actually, SCORE: 9", 0.9),  # the last score wins
        ("<think>SCORE: 2</think>Final. SCORE: 6", 0.6),  # reasoning is ignored
        ("SCORE: 12", 1.0),  # clamped from 1.2
        ("SCORE: -3", 0.0),  # clamped from -0.3
        ("The response is great.", None),
        ("SCORE: 3/0", None),
        ("<think>SCORE: 5", None),  # unterminated reasoning only
    ],
)
def test_parse_score(reply, expected):
    score = parse_score(reply)
    assert score == (None if expected is None else pytest.approx(expected))


# ---- requests --------------------------------------------------------------------------------


def test_scores_and_templates(server):
    client = make_client(server, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    results = client.score_batch_sync(
        [
            JudgeItem("What is 2+2?", "It is 4. [[score:8]]", reference="4"),
            {"prompt": [{"role": "user", "content": "Write a haiku."}], "response": "[[score:15]]"},
        ]
    )
    assert results[0] == JudgeResult(0.8, "The response is fine.\nSCORE: 8", True)
    assert results[1].score == 1.0 and results[1].parse_ok  # 15/10 clamped
    first, second = sorted(server.requests, key=lambda r: "[[score:8]]" not in str(r))
    assert first["model"] == "judge-model" and first["temperature"] == 0.0
    assert first["chat_template_kwargs"] == {"enable_thinking": False}
    assert first["messages"][0]["role"] == "system"
    reference_prompt = first["messages"][1]["content"]
    assert "[Reference answer]\n4\n" in reference_prompt
    assert "[Question]\nWhat is 2+2?" in reference_prompt
    open_prompt = second["messages"][1]["content"]
    assert "[Reference answer]" not in open_prompt
    assert "[Request]\nuser: Write a haiku." in open_prompt
    assert server.authorization == [None, None]  # no key in the environment: no header
    assert client.counters() == {"parse_failures": 0, "timeouts": 0, "errors": 0, "retries": 0}


def test_garbage_reply_scores_zero_and_counts(server):
    client = make_client(server)
    result = asyncio.run(client.score("Q", "[[reply:I cannot grade this.]]"))
    assert result == JudgeResult(0.0, "I cannot grade this.", False)
    assert client.parse_failures == 1 and client.errors == 0


def test_timeouts_are_retried_then_fail(server):
    client = make_client(server, timeout_s=0.2, max_retries=1)
    start = time.perf_counter()
    result = asyncio.run(client.score("Q", "[[sleep:2.0]]"))
    elapsed = time.perf_counter() - start
    assert result.score == 0.0 and not result.parse_ok and "timed out" in result.error
    # Two attempts of ~0.2 s each plus a 0.01 s backoff, not the server's 2 s per attempt.
    assert 0.4 <= elapsed < 1.5
    assert client.counters() == {"parse_failures": 0, "timeouts": 2, "errors": 1, "retries": 1}


def test_server_errors_are_retried_with_backoff(server):
    client = make_client(server, max_retries=3, backoff_s=0.05)
    start = time.perf_counter()
    result = asyncio.run(client.score("Q", "[[fail:2:a]]"))
    elapsed = time.perf_counter() - start
    assert result.score == pytest.approx(0.9) and result.error is None
    assert server.attempts["a"] == 3  # 500, 500, then success
    assert client.retries == 2 and client.errors == 0
    assert elapsed >= 0.05 + 0.1  # backoff_s * 2**0 + backoff_s * 2**1
    # With fewer retries than failures the request fails for good.
    result = asyncio.run(make_client(server, max_retries=1).score("Q", "[[fail:5:b]]"))
    assert "HTTP 500" in result.error and server.attempts["b"] == 2


@pytest.mark.parametrize("directive", ["[[status:400]]", "[[status:401]]", "[[malformed]]"])
def test_client_errors_are_not_retried(server, directive):
    client = make_client(server, max_retries=3)
    result = asyncio.run(client.score("Q", directive))
    assert result.score == 0.0 and result.error
    assert len(server.requests) == 1
    assert client.counters() == {"parse_failures": 0, "timeouts": 0, "errors": 1, "retries": 0}


def test_unreachable_endpoint():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = JudgeClient(f"http://127.0.0.1:{port}/v1", "m", max_retries=2, backoff_s=0.01)
    result = client.score_batch_sync([JudgeItem("Q", "A")])[0]
    assert result.score == 0.0 and "cannot reach" in result.error
    assert client.retries == 2 and client.errors == 1


def test_concurrency_is_bounded_and_order_kept(server):
    client = make_client(server, max_concurrency=3)
    items = [JudgeItem("Q", f"[[sleep:0.25]] [[score:{i}]]") for i in range(9)]
    start = time.perf_counter()
    results = client.score_batch_sync(items)
    elapsed = time.perf_counter() - start
    assert [r.score for r in results] == pytest.approx([i / 10 for i in range(9)])
    assert 2 <= server.max_in_flight <= 3
    # 9 requests of 0.25 s, 3 at a time: at least 3 rounds, and well under 9 serial ones.
    assert 3 * 0.25 <= elapsed < 9 * 0.25


def test_api_key_is_sent_but_never_logged(server, monkeypatch, caplog):
    monkeypatch.setenv("MY_JUDGE_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    client = make_client(server, api_key_env="MY_JUDGE_KEY", max_retries=1)
    results = client.score_batch_sync(
        [
            JudgeItem("Q", "[[score:5]]"),
            JudgeItem("Q", "[[fail:9:k]]"),  # 500s whose body echoes the Authorization header
            JudgeItem("Q", "[[status:401]]"),
            JudgeItem("Q", f"[[reply:I saw {SECRET}]]"),  # a reply echoing the key
        ]
    )
    assert set(server.authorization) == {f"Bearer {SECRET}"}
    assert results[0].score == 0.5
    assert "HTTP 500" in results[1].error and "***" in results[1].error
    assert "judge request failed" in caplog.text  # the failures were logged...
    texts = [caplog.text, repr(client), str(client), *map(repr, results)]
    assert all(SECRET not in text for text in texts)  # ...without the key
    assert "api_key_env='MY_JUDGE_KEY' (set)" in repr(client)


def test_sync_api_refuses_a_running_loop(server):
    client = make_client(server)

    async def inside():
        with pytest.raises(RuntimeError, match="await score_batch"):
            client.score_batch_sync([JudgeItem("Q", "A")])
        return await client.score_batch([JudgeItem("Q", "[[score:3]]")])

    assert asyncio.run(inside())[0].score == pytest.approx(0.3)


def test_served_model_is_looked_up_once(server):
    client = JudgeClient(server.base_url, None, backoff_s=0.01)
    items = [JudgeItem("Q", f"[[score:{i}]]") for i in range(4)]
    results = client.score_batch_sync(items)  # four concurrent first requests
    assert [r.score for r in results] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert {request["model"] for request in server.requests} == {MODEL_ID}
    assert server.model_lookups == 1
    client.score_batch_sync(items[:1])
    assert server.model_lookups == 1


def test_failed_model_lookup_fails_the_requests_and_is_retried_later():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = JudgeClient(f"http://127.0.0.1:{port}/v1", None, max_retries=1, backoff_s=0.01)
    results = client.score_batch_sync([JudgeItem("Q", "A"), JudgeItem("Q", "B")])
    assert all(r.error and "looking up the served model failed" in r.error for r in results)
    assert all(r.attempts == 2 and not r.parse_ok for r in results)
    assert client._model_lookup is None  # the next request looks it up again


def test_results_report_attempts_and_final_timeouts(server):
    client = make_client(server, timeout_s=0.2, max_retries=2)
    ok, slow, flaky = client.score_batch_sync(
        [
            JudgeItem("Q", "[[score:5]]"),
            JudgeItem("Q", "[[sleep:1.0]]"),
            JudgeItem("Q", "[[fail:1:t]]"),
        ]
    )
    assert (ok.attempts, ok.timed_out) == (1, False)
    assert (slow.attempts, slow.timed_out, slow.parse_ok) == (3, True, False)
    assert (flaky.attempts, flaky.timed_out, flaky.score) == (2, False, pytest.approx(0.9))


@pytest.mark.parametrize(
    ("args", "options", "message"),
    [
        (("ftp://x/v1", "m"), {}, "http"),
        (("http://x/v1", ""), {}, "model"),
        (("http://x/v1", "m"), {"max_concurrency": 0}, "max_concurrency"),
        (("http://x/v1", "m"), {"timeout_s": 0}, "timeout_s"),
    ],
)
def test_bad_settings(args, options, message):
    with pytest.raises(ValueError, match=message):
        JudgeClient(*args, **options)


# ---- verifier entry points -------------------------------------------------------------------


def test_module_reward_and_score_batch(server):
    url = server.base_url
    response = "<think>Let me think hard [[score:1]]</think>The answer is 4. [[score:8]]"
    assert judge.reward(response, "4", prompt="2+2?", base_url=url, model="m") == pytest.approx(0.8)
    sent = server.requests[-1]["messages"][1]["content"]
    assert "think hard" not in sent and "[Response]\nThe answer is 4." in sent
    scores = judge.score_batch(
        ["[[score:2]]", "[[reply:no idea]]"], [None, "ref"], base_url=url, model="m"
    )
    assert scores == pytest.approx([0.2, 0.0])
    assert judge.client_for(url, "m").parse_failures == 1  # the shared client counted it


def test_module_entry_points_validate_inputs(server):
    with pytest.raises(ValueError, match=r"rewards\.judge_url"):
        judge.reward("x", None, base_url=None, model="m")
    with pytest.raises(ValueError, match="reference string or null"):
        judge.reward("x", {"reference": "4"}, base_url=server.base_url, model="m")
    with pytest.raises(ValueError, match="one ground truth"):
        judge.score_batch(["a", "b"], [None], base_url=server.base_url, model="m")
