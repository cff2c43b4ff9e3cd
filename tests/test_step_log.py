"""What a step's logs say (`rlvr_jax.training.step_log`): the samples.jsonl records (every
field, `log.sample_completions` of them, kept groups first), why a step kept no group, and the
warnings for a step that trained nothing and for several in a row; the progress bar's figure."""

import json
import logging

import numpy as np

from rlvr_jax.data.rows import PromptRow
from rlvr_jax.rollout.api import Completion
from rlvr_jax.training.groups import ScoredGroup
from rlvr_jax.training.loop import _postfix
from rlvr_jax.training.metrics import MetricsWriter
from rlvr_jax.training.step_log import EmptySteps, empty_reason, sample_records


class Words:
    """A tokenizer stub: token i is the word WORDS[i]."""

    WORDS = ["<s>", "what", "is", "2+2?", "the", "answer", "4", "five", "hmm"]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(self.WORDS[i] for i in ids if not (skip_special_tokens and i == 0))


def group(rewards, *, finish="stop", tokens=(4, 5, 6), truth="4", verifier="math", rid=0):
    row = PromptRow("what is 2+2?", truth, verifier, verifier, index=rid)
    completions = [
        Completion(0, j, list(tokens), [0.0] * len(tokens), finish, [0] * len(tokens))
        for j in range(len(rewards))
    ]
    texts = [Words().decode(list(tokens)) for _ in rewards]
    r = np.asarray(rewards, np.float32)
    return ScoredGroup(row, [0, 1, 2, 3], completions, r, r, verifier, texts, request_id=rid)


def test_sample_records_carry_every_field_kept_groups_first_round_robin():
    kept_a, kept_b, filtered = group([1, 0]), group([0, 1], rid=1), group([0, 0], rid=2)
    settled = [(filtered, "filtered"), (kept_a, "trained"), (group([1, 1]), "stale"),
               (kept_b, "trained")]  # fmt: skip
    records = sample_records(settled, Words(), 5)
    assert len(records) == 5  # log.sample_completions, not one per kept group
    assert records[0] == {
        "prompt": "<s> what is 2+2?",  # as the model saw it
        "completion": "the answer 4",
        "reward": 1.0,
        "verifier_score": 1.0,
        "ground_truth": "4",
        "verifier": "math",
        "domain": "math",
        "finish_reason": "stop",
        "group": "trained",
    }
    # first completions of the kept groups, then of the filtered one, then second completions;
    # stale groups are left out
    assert [(r["group"], r["reward"]) for r in records] == [
        ("trained", 1.0), ("trained", 0.0), ("filtered", 0.0), ("trained", 0.0),
        ("trained", 1.0),
    ]  # fmt: skip
    assert len(sample_records(settled, Words(), 100)) == 6
    assert sample_records([], Words(), 3) == []


def test_samples_jsonl_lines(tmp_path):
    writer = MetricsWriter(tmp_path, tensorboard=False)
    for i, record in enumerate(sample_records([(group([1, 0]), "trained")], Words(), 2)):
        writer.sample(3, i, record)
    writer.close()
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(x["step"], x["index"], x["reward"]) for x in lines] == [(3, 0, 1.0), (3, 1, 0.0)]
    assert {"prompt", "completion", "ground_truth", "verifier_score"} <= set(lines[0])


def test_empty_reason_counts_equal_rewards_truncation_unreadable_answers_and_errors():
    settled = [
        (group([0, 0], finish="length", tokens=(7, 8)), "filtered"),  # "five hmm": no number
        (group([0, 0], rid=1), "filtered"),
        (group([1, 1], rid=2), "filtered"),
        (group([0, 1], rid=3), "stale"),
    ]
    why = empty_reason(settled, {"rewards/errors": 1.0, "rewards/timeouts": 1.0}, Words(),
                       max_new_tokens=2)  # fmt: skip
    assert why == (
        "kept 0 of 4 groups; 3 had all-equal rewards (2 all 0, 1 all 1); 1 were stale (older "
        "than rollout.max_staleness); 33% of completions cut at rollout.max_new_tokens=2; "
        "33% of math completions give no answer the verifier can read; 2 verifier errors or "
        "timeouts (scored 0)"
    )
    assert empty_reason([(group([0, 0], verifier="code"), "filtered")], {}, Words(),
                        max_new_tokens=9) == (
        "kept 0 of 1 groups; 1 had all-equal rewards (1 all 0); 0% of completions cut at "
        "rollout.max_new_tokens=9"
    )  # fmt: skip


def test_empty_steps_warn_each_step_and_once_per_streak(caplog):
    steps = EmptySteps(warn_after=2)
    with caplog.at_level(logging.WARNING, logger="rlvr_jax.train"):
        for step, trained in enumerate([False, False, False, True, False, False], start=1):
            steps.record(step, trained, f"why {step}")
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if "trained nothing:" in m] == [
        f"step {s} trained nothing: why {s}" for s in (1, 2, 3, 5, 6)
    ]
    streaks = [m for m in messages if "steps in a row trained nothing" in m]
    assert len(streaks) == 2 and streaks[0].startswith("2 steps in a row")


def test_progress_bar_shows_reward_else_loss_never_nan():
    assert _postfix({"reward/mean": 0.25, "loss": 1.0}) == {"reward": "0.250"}
    assert _postfix({"loss": 1.5}) == {"loss": "1.500"}  # SFT: no reward
    assert _postfix({"reward/mean": float("nan"), "loss": 2.0}) == {"loss": "2.000"}
    assert _postfix({}) == {}
