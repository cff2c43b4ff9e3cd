"""Rubric rewards against a stub OpenAI-compatible judge on loopback (`helpers_judge.FakeJudge`:
`[[has:WORD]]` in a criterion scores 10 when WORD is in the response, else 0; `[[score:N]]`,
`[[sleep:S]]`, `[[status:CODE]]`, `[[malformed]]`, `[[reply:TEXT]]` and `[[fail:N:TAG]]` steer
the reply; anything else scores 7)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers_judge import MODEL_ID, fake_judge

from rlvr_jax.config.schema import RewardsConfig, SourceConfig
from rlvr_jax.data.sources import load_source
from rlvr_jax.rewards import rubric
from rlvr_jax.rewards.registry import get_verifier, known_verifiers
from rlvr_jax.rewards.rubric import (
    Criterion,
    RubricItem,
    RubricJudgeError,
    RubricScorer,
    ScoreCache,
    cache_key,
    parse_rubric,
    rubric_score,
)
from rlvr_jax.rewards.service import RewardService

ROWS_FILE = Path(__file__).parent / "data" / "rubric_rows.jsonl"
CAPITAL = [
    {"criterion": "Names Paris as the capital [[has:Paris]]", "weight": 3},
    {"criterion": "Mentions the Seine [[has:Seine]]"},
    "Is concise [[score:5]]",
]
"""On "Paris is the capital.": s = (1, 0, 0.5), r = (3·1 + 1·0 + 1·0.5) / 5 = 0.7."""


@pytest.fixture
def server():
    with fake_judge() as fake:
        yield fake


def make_scorer(server, **options) -> RubricScorer:
    """A private scorer (its own cache) with a short backoff; model looked up from the server."""
    return RubricScorer(server.base_url, **{"backoff_s": 0.01, "max_retries": 0, **options})


def one(scorer: RubricScorer, response: str, criteria, prompt="Capital of France?"):
    outcomes, counts = scorer.score_sync([RubricItem(prompt, response, parse_rubric(criteria))])
    return outcomes[0], counts


# ---- ground truth ----------------------------------------------------------------------------


def test_parse_rubric_forms():
    assert parse_rubric(CAPITAL) == (
        Criterion("Names Paris as the capital [[has:Paris]]", 3.0),
        Criterion("Mentions the Seine [[has:Seine]]", 1.0),
        Criterion("Is concise [[score:5]]", 1.0),
    )
    text = json.dumps([{"criterion": "A", "weight": 2}, {"criterion": "B", "weight": None}])
    assert parse_rubric(text) == (Criterion("A", 2.0), Criterion("B", 1.0))
    assert parse_rubric([{"criterion": "good", "weight": 1}, {"criterion": "bad", "weight": -2}])[
        1
    ] == Criterion("bad", -2.0)


@pytest.mark.parametrize(
    ("ground_truth", "message"),
    [
        (None, "non-empty list"),
        ([], "non-empty list"),
        ({"criterion": "A"}, "non-empty list"),
        ("[{oops", "not JSON"),
        ([7], r"ground_truth\[0\] must be an object"),
        ([{"weight": 1}], r"ground_truth\[0\]: missing 'criterion'"),
        (["A", {"criterion": "  "}], r"ground_truth\[1\]\.criterion must be non-empty"),
        ([{"criterion": "A", "wieght": 2}], r"ground_truth\[0\]: unknown key\(s\) \['wieght'\]"),
        ([{"criterion": "A", "weight": "high"}], r"ground_truth\[0\]\.weight must be a finite"),
        ([{"criterion": "A", "weight": float("nan")}], r"\[0\]\.weight must be a finite"),
        (["A", {"criterion": "B", "weight": 0}], r"ground_truth\[1\]\.weight .* non-zero"),
        ([{"criterion": "A", "weight": True}], r"\[0\]\.weight"),
        ([{"criterion": "A", "weight": -1}], "positive weight"),
    ],
)
def test_bad_rubrics_name_the_field(ground_truth, message):
    with pytest.raises(ValueError, match=message):
        parse_rubric(ground_truth)


def test_rubric_score_by_hand():
    c = [Criterion("a", 2.0), Criterion("b", 1.0), Criterion("c", 1.0)]
    assert rubric_score(c, [1.0, 0.5, 0.0]) == pytest.approx((2 + 0.5 + 0) / 4)
    pitfall = [Criterion("good", 2.0), Criterion("wrong claim", -1.0)]
    assert rubric_score(pitfall, [1.0, 1.0]) == pytest.approx((2 - 1) / 2)
    assert rubric_score(pitfall, [0.25, 1.0]) == 0.0  # (0.5 - 1) / 2 clipped at 0
    assert rubric_score([Criterion("a", 0.5)], [0.8]) == pytest.approx(0.8)


# ---- judging ---------------------------------------------------------------------------------


def test_weighted_mean_and_what_the_judge_sees(server):
    scorer = make_scorer(server)
    outcome, counts = one(
        scorer, "<think>the Seine? [[score:0]]</think>Paris is the capital.", CAPITAL
    )
    assert outcome.status == "ok" and outcome.score == pytest.approx(0.7)
    assert outcome.criterion_scores == pytest.approx((1.0, 0.0, 0.5))
    assert counts["criteria"] == counts["judge_calls"] == 3 and counts["failures"] == 0
    assert {r["model"] for r in server.requests} == {MODEL_ID}  # the served model, looked up
    sent = sorted(server.user_messages())
    assert all("[Question]\nCapital of France?" in m for m in sent)
    assert all(m.endswith("[Response]\nParis is the capital.") for m in sent)  # no reasoning
    assert [m.split("[Criterion]\n")[1].split("\n")[0] for m in sent] == sorted(
        c if isinstance(c, str) else c["criterion"] for c in CAPITAL
    )


def test_chat_prompts_are_rendered(server):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    outcome, _ = one(make_scorer(server), "Hello.", ["Greets [[score:10]]"], prompt=chat)
    assert outcome.score == 1.0
    assert "[Question]\nsystem: Be brief.\n\nuser: Hi?\n" in server.user_messages()[0]


def test_a_second_identical_call_makes_no_request(server):
    scorer = make_scorer(server)
    first, _ = one(scorer, "Paris is the capital.", CAPITAL)
    assert len(server.requests) == 3
    again, counts = one(scorer, "Paris is the capital.", CAPITAL)
    assert len(server.requests) == 3  # all three from the cache
    assert again == first
    assert (counts["cache_hits"], counts["judge_calls"]) == (3, 0)
    # A different response, or the same response to another prompt, is judged afresh.
    _, counts = one(scorer, "Lyon.", CAPITAL)
    _, counts2 = one(scorer, "Paris is the capital.", CAPITAL, prompt="Capital of Texas?")
    assert counts["judge_calls"] == counts2["judge_calls"] == 3 and len(server.requests) == 9


def test_duplicates_within_a_batch_are_sent_once(server):
    scorer = make_scorer(server)
    items = [RubricItem("Q", "Paris.", parse_rubric(CAPITAL)) for _ in range(4)]
    outcomes, counts = scorer.score_sync(items)
    assert len(server.requests) == 3
    assert [o.score for o in outcomes] == pytest.approx([0.7] * 4)
    assert (counts["criteria"], counts["judge_calls"], counts["duplicates"]) == (12, 3, 9)


def test_cache_is_bounded_lru_and_size_zero_keeps_nothing(server):
    cache = ScoreCache(2)
    a, b, c = (cache_key("p", "r", x) for x in "abc")
    cache.put(a, 0.1)
    cache.put(b, 0.2)
    assert cache.get(a) == 0.1  # a is now the most recent
    cache.put(c, 0.3)  # evicts b
    assert (cache.get(a), cache.get(b), cache.get(c), len(cache)) == (0.1, None, 0.3, 2)
    with pytest.raises(ValueError, match="cache_size"):
        ScoreCache(-1)
    scorer = make_scorer(server, cache_size=0)
    one(scorer, "Paris.", CAPITAL)
    _, counts = one(scorer, "Paris.", CAPITAL)
    assert counts["judge_calls"] == 3 and len(server.requests) == 6


def test_cache_is_shared_safely_between_threads(server):
    scorer = make_scorer(server, cache_size=50, max_concurrency=4)
    responses = [f"Paris, answer {i}." for i in range(20)]
    results: dict[int, float] = {}

    def work(worker: int) -> None:
        for k in range(worker, worker + 10):  # overlapping ranges: hits and misses race
            outcome, _ = one(scorer, responses[k % 20], CAPITAL)
            results[k % 20] = outcome.score

    threads = [threading.Thread(target=work, args=(w,)) for w in range(0, 20, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: pytest.approx(0.7) for i in range(20)}
    assert len(scorer.cache) <= 50
    # 20 responses × 3 criteria; each response is scored by two threads, which may race.
    assert 60 <= len(server.requests) <= 120


def test_timeouts_fail_the_sample_and_are_counted(server):
    scorer = make_scorer(server, timeout_s=0.2, max_retries=1)
    rubric_ = [*CAPITAL, {"criterion": "Is slow to judge [[sleep:2]]", "weight": 1}]
    start = time.perf_counter()
    outcome, counts = one(scorer, "Paris is the capital.", rubric_)
    assert time.perf_counter() - start < 1.5  # two 0.2 s attempts, not the server's 2 s
    assert (outcome.status, outcome.score) == ("timeout", 0.0)
    assert outcome.criterion_scores[:3] == pytest.approx((1.0, 0.0, 0.5))
    assert outcome.criterion_scores[3] is None
    assert (
        outcome.error.startswith("criterion 3 ('Is slow to judge") and "timed out" in outcome.error
    )
    assert counts == {
        **dict.fromkeys(rubric.COUNTERS, 0),
        "criteria": 4,
        "judge_calls": 4,
        "failures": 1,
        "request_errors": 1,
        "request_timeouts": 1,
        "retries": 1,
    }
    # The failure is not cached: the next call asks again (and only for that criterion).
    _, counts = one(scorer, "Paris is the capital.", rubric_)
    assert (counts["cache_hits"], counts["judge_calls"]) == (3, 1)


@pytest.mark.parametrize(
    ("directive", "counter", "reason"),
    [
        ("[[reply:Looks fine to me.]]", "parse_failures", "no SCORE line: 'Looks fine to me.'"),
        ("[[malformed]]", "request_errors", "malformed chat-completions reply"),
        ("[[status:404]]", "request_errors", "HTTP 404"),
        ("[[status:503]]", "request_errors", "HTTP 503"),
    ],
)
def test_bad_replies_fail_the_sample_and_are_counted(server, directive, counter, reason):
    scorer = make_scorer(server, max_retries=1)
    outcome, counts = one(scorer, "Paris.", ["Names Paris [[has:Paris]]", f"Odd {directive}"])
    assert (outcome.status, outcome.score) == ("error", 0.0)
    assert outcome.criterion_scores == (1.0, None)
    assert outcome.error.startswith("criterion 1 ('Odd") and reason in outcome.error
    assert counts["failures"] == counts[counter] == 1 and counts["request_timeouts"] == 0
    retried = directive == "[[status:503]]"  # 5xx is retried; 404 and bad bodies are not
    assert counts["retries"] == int(retried) and len(server.requests) == 2 + retried


def test_transient_errors_recover_with_retries(server):
    outcome, counts = one(make_scorer(server, max_retries=2), "Paris.", ["Flaky [[fail:2:x]]"])
    assert outcome.status == "ok" and outcome.score == pytest.approx(0.9)
    assert counts["retries"] == 2 and counts["failures"] == 0


def test_reward_entry_point_and_registry(server):
    assert "rubric" in known_verifiers()
    verify = get_verifier("rubric")
    assert verify is rubric.reward
    url = server.base_url
    score = verify("Paris is the capital.", CAPITAL, prompt="Capital?", base_url=url)
    assert score == pytest.approx(0.7)
    with pytest.raises(RubricJudgeError, match=r"rubric error: criterion 0 .*HTTP 400"):
        verify("x", ["Broken [[status:400]]"], base_url=url, max_retries=0)
    with pytest.raises(ValueError, match=r"response 0: rubric ground_truth\[0\]"):
        verify("x", [{"criterion": ""}], base_url=url)
    assert rubric.scorer_for(url) is rubric.scorer_for(url)  # one cache per settings


# ---- through the reward service ------------------------------------------------------------


def rubric_config(server, **overrides) -> RewardsConfig:
    return RewardsConfig(rubric_url=server.base_url, rubric_timeout_s=0.3, **overrides)


def test_reward_service_scores_rubric_rows(server):
    rows = [
        {"verifier": "rubric", "ground_truth": CAPITAL, "prompt": "Capital of France?"},
        {
            "verifier": "rubric",
            "ground_truth": [*CAPITAL, "Slow [[sleep:3]]"],
            "prompt": "Capital of France?",
            "verifier_kwargs": {"max_retries": 0, "backoff_s": 0.01},
        },
        {"verifier": "rubric", "ground_truth": ["Odd [[reply:no idea]]"], "domain": "chat"},
        {"verifier": "math", "ground_truth": "2"},
    ]
    responses = ["Paris is the capital.", "Paris.", "Hello", r"\boxed{2}"]
    with RewardService(rubric_config(server), workers=1) as svc:
        result = svc.score(rows, responses)
        np.testing.assert_allclose(result.rewards, [0.7, 0.0, 0.0, 1.0], rtol=1e-6)
        assert result.statuses == ("ok", "timeout", "error", "ok")
        assert result.errors[1].startswith("rubric: criterion 3 ('Slow")
        assert "no SCORE line" in result.errors[2]
        m = result.metrics
        assert (m["rewards/rubric/count"], m["rewards/rubric/mean"]) == (3, pytest.approx(0.7 / 3))
        assert (m["rewards/rubric/timeouts"], m["rewards/rubric/errors"]) == (1, 1)
        assert (m["rewards/timeouts"], m["rewards/errors"]) == (1, 1)
        # Row 1's verifier_kwargs make it a group (a judge and a cache) of its own: rows 0 and
        # 2 need 3 + 1 judgements, row 1 needs 4.
        assert m["rewards/rubric/criteria"] == m["rewards/rubric/judge_calls"] == 8
        assert m["rewards/rubric/cache_hits"] == 0
        assert m["rewards/rubric/failures"] == 2 and m["rewards/rubric/request_timeouts"] == 1
        assert m["rewards/rubric/parse_failures"] == 1
        assert m["reward/chat"] == 0.0

        again = svc.score(rows[:1], responses[:1])
        assert again.metrics["rewards/rubric/cache_hits"] == 3
        assert again.metrics["rewards/rubric/judge_calls"] == 0


def test_reward_service_refuses_bad_rubric_rows(server):
    with RewardService(rubric_config(server), workers=1) as svc:
        bad = {"verifier": "rubric", "ground_truth": [{"criterion": "A", "weight": "x"}]}
        with pytest.raises(ValueError, match=r"row 1: rubric ground_truth\[0\]\.weight"):
            svc.score([{"verifier": "math", "ground_truth": "1"}, bad], ["1", "2"])
        assert server.requests == []
    with pytest.raises(ValueError, match=r"rewards\.rubric_timeout_s"):
        RewardService(RewardsConfig(rubric_timeout_s=0), workers=1)
    with pytest.raises(ValueError, match=r"rewards\.rubric_max_concurrency"):
        RewardService(RewardsConfig(rubric_max_concurrency=0), workers=1)


def test_a_failing_rubric_batch_errors_its_rows_only(server):
    rows = [
        {"verifier": "rubric", "ground_truth": CAPITAL, "verifier_kwargs": {"max_concurrency": 0}},
        {"verifier": "rubric", "ground_truth": CAPITAL},
    ]
    with RewardService(rubric_config(server), workers=1) as svc:
        result = svc.score(rows, ["Paris.", "Paris."])
    assert result.statuses == ("error", "ok")
    assert result.errors[0].startswith("rubric: batch failed: ValueError: judge needs")
    assert result.rewards[1] == pytest.approx(0.7) and len(server.requests) == 3


def test_example_rows_load_and_score(server):
    source = load_source(SourceConfig(path=str(ROWS_FILE)), known_verifiers=known_verifiers())
    assert len(source.rows) == 3 and source.skipped == {"wrong_type": 2}
    assert source.rows[2].ground_truth == [
        {"criterion": "Names Canberra as the capital", "weight": 1.0}
    ]
    rows = [row.to_dict() for row in source.rows]
    with RewardService(rubric_config(server), workers=1) as svc:
        result = svc.score(rows, ["An answer."] * 3)
    # The stub scores every criterion 7/10: row 0 (2·.7 + .7 − .7) / 3, rows 1-2 the mean .7.
    np.testing.assert_allclose(result.rewards, [1.4 / 3, 0.7, 0.7], rtol=1e-6)
    assert {r["max_tokens"] for r in server.requests} == {512, 256}  # row 2's verifier_kwargs


# ---- against our own server ----------------------------------------------------------------


@pytest.mark.slow
def test_rubric_judged_by_rlvr_serve(tmp_path):
    """The default judge is `rlvr-serve`: a tiny random model served on loopback. It cannot
    grade, so what this checks is the wire: the served model is looked up, every criterion
    request is answered, and replies without a score fail the sample with a counted reason."""
    import helpers_models as H

    from rlvr_jax.serve.cli import build_parser, serve

    model_dir = H.build_chat_model(tmp_path / "judge", seed=3, max_position_embeddings=2048)
    ready = tmp_path / "ports.json"
    flags = ["--no-grpc", "--http-port", "0", "--max-slots", "2", "--max-len", "2048"]
    args = build_parser().parse_args(
        ["--model", str(model_dir), *flags, "--ready-file", str(ready)]
    )
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(args, stop), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert thread.is_alive() and time.monotonic() < deadline, "rlvr-serve did not start"
            time.sleep(0.1)
        port = json.loads(ready.read_text())["http_port"]
        scorer = RubricScorer(
            f"http://127.0.0.1:{port}/v1", max_tokens=8, max_retries=0, timeout_s=300
        )
        outcome, counts = one(scorer, "Paris.", ["Names Paris as the capital", "Is concise"])
    finally:
        stop.set()
        thread.join(60)
    assert scorer.client._model_lookup.result() == "judge"  # rlvr-serve's id: the directory
    assert counts["judge_calls"] == 2 and counts["request_errors"] == 0
    assert counts["failures"] == counts["parse_failures"]
    assert (outcome.status == "ok") == (counts["failures"] == 0)
    if outcome.status != "ok":
        assert "no SCORE line" in outcome.error and outcome.score == 0.0
