"""Format reward and DAPO's soft overlong punishment, against values worked out by hand."""

import time

import numpy as np
import pytest

from rlvr_jax.rewards.format import format_reward, soft_overlong_penalty, soft_overlong_penalty_N


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>add 2 and 2</think><answer>4</answer>", 1.0),
        ("  <think>r</think>\n\n<answer>4</answer>\n", 1.0),
        ("<think>r</think><answer>4</answer> trailing text", 0.0),
        ("preamble <think>r</think><answer>4</answer>", 0.0),
        ("<think>r</think> between <answer>4</answer>", 0.0),
        ("<answer>4</answer><think>r</think>", 0.0),  # wrong order
        ("<think>r</think>", 0.0),  # no answer block
        ("<think> </think><answer>4</answer>", 0.0),  # empty reasoning
        ("<think>r</think><answer> </answer>", 0.0),  # empty answer
        ("<think>a</think><think>b</think><answer>4</answer>", 0.0),  # tag twice
        ("<think>r<answer>4</answer></think>", 0.0),  # answer nested in think
        ("4", 0.0),
        ("", 0.0),
    ],
)
def test_format_reward(response, expected):
    assert format_reward(response) == expected


def test_format_reward_with_think_opened_by_the_prompt():
    assert format_reward("reasoning</think><answer>4</answer>", think_in_prompt=True) == 1.0
    assert format_reward("<think>r</think><answer>4</answer>", think_in_prompt=True) == 0.0
    assert format_reward("reasoning</think><answer>4</answer>") == 0.0


def test_format_reward_is_linear_time_on_adversarial_text():
    text = "<think>" + "</think>" * 50_000 + "<answer>"
    start = time.perf_counter()
    assert format_reward(text) == 0.0
    assert time.perf_counter() - start < 0.5


# DAPO, L_max = 20, L_c = 4: the ramp starts after 16 tokens.
#   |o| = 16 -> 0 (last unpunished length)
#   |o| = 17 -> (16 - 17) / 4 = -0.25
#   |o| = 18 -> (16 - 18) / 4 = -0.5
#   |o| = 20 -> (16 - 20) / 4 = -1.0 (at the limit)
#   |o| = 21 -> -1 (beyond the limit)
HAND = [
    (0, 0.0),
    (10, 0.0),
    (16, 0.0),
    (17, -0.25),
    (18, -0.5),
    (19, -0.75),
    (20, -1.0),
    (21, -1.0),
]


@pytest.mark.parametrize("length, expected", HAND)
def test_soft_overlong_penalty_by_hand(length, expected):
    assert soft_overlong_penalty(length, max_len=20, buffer=4) == pytest.approx(expected)


def test_vectorised_penalty_matches_scalar():
    lengths = np.array([n for n, _ in HAND])
    got = soft_overlong_penalty_N(lengths, max_len=20, buffer=4)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [v for _, v in HAND], rtol=0, atol=1e-7)


def test_zero_buffer_is_a_hard_step():
    # L_c = 0: the ramp is empty; 0 up to L_max, -1 beyond.
    assert soft_overlong_penalty(20, max_len=20, buffer=0) == 0.0
    assert soft_overlong_penalty(21, max_len=20, buffer=0) == -1.0
    np.testing.assert_array_equal(soft_overlong_penalty_N(np.array([20, 21]), 20, 0), [0.0, -1.0])


def test_buffer_equal_to_max_len_ramps_from_zero():
    # L_max = L_c = 8: |o| = 2 -> (0 - 2) / 8 = -0.25
    assert soft_overlong_penalty(2, max_len=8, buffer=8) == pytest.approx(-0.25)


@pytest.mark.parametrize(
    "length, max_len, buffer, message",
    [
        (5, 0, 0, "max_len"),
        (5, 10, -1, "buffer"),
        (5, 10, 11, "buffer"),
        (5, 10.5, 2, "max_len"),
        (-1, 10, 2, "length"),
    ],
)
def test_penalty_rejects_bad_arguments(length, max_len, buffer, message):
    with pytest.raises(ValueError, match=message):
        soft_overlong_penalty(length, max_len, buffer)


def test_vectorised_penalty_rejects_bad_shapes():
    with pytest.raises(ValueError, match="1-D"):
        soft_overlong_penalty_N(np.zeros((2, 2)), 10, 2)
    with pytest.raises(ValueError, match=">= 0"):
        soft_overlong_penalty_N(np.array([3, -1]), 10, 2)
