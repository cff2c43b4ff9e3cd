"""The linear scans against the reference's own regular expressions, and their speed."""

from __future__ import annotations

import random
import re
import time

import pytest

from rlvr_jax.rewards.ifeval import check
from rlvr_jax.rewards.ifeval.scan import count_bullets, count_placeholders, titles

PLACEHOLDER = re.compile(r"\[.*?\]")
STAR_BULLET = re.compile(r"^\s*\*[^\*].*$", re.MULTILINE)
DASH_BULLET = re.compile(r"^\s*-.*$", re.MULTILINE)
TITLE = re.compile(r"<<[^\n]+>>")


def random_texts(seed: int, count: int):
    rng = random.Random(seed)
    atoms = ["[", "]", "*", "**", "-", " ", "  ", "\t", "\n", "\n\n", "<<", ">>", "<", ">", "x"]
    for _ in range(count):
        yield "".join(rng.choice(atoms) for _ in range(rng.randint(0, 30)))


def test_scans_equal_the_regular_expressions():
    for text in random_texts(0, 4000):
        assert count_placeholders(text) == len(PLACEHOLDER.findall(text)), text
        expected_bullets = len(STAR_BULLET.findall(text)) + len(DASH_BULLET.findall(text))
        assert count_bullets(text) == expected_bullets, text
        assert titles(text) == TITLE.findall(text), text


@pytest.mark.parametrize(
    ("text", "placeholders", "bullets", "found_titles"),
    [
        # "[a\nb]" is not a placeholder (no newline inside); "[c]" is.
        ("[a\nb] and [c]", 1, 0, []),
        # Star bullets need a non-star second character, which may be the newline itself:
        # "*\nx" is one bullet that runs to the end of "x".
        ("* one\n\n  - two\n**no**\n*\nx", 0, 3, []),
        # Greedy titles: from the first "<<" to the last ">>" of the line.
        ("<<a>> b <<c>>\n<<>>\n<< d >>", 0, 0, ["<<a>> b <<c>>", "<< d >>"]),
    ],
)
def test_scans_by_hand(text, placeholders, bullets, found_titles):
    assert count_placeholders(text) == placeholders
    assert count_bullets(text) == bullets
    assert titles(text) == found_titles


@pytest.mark.parametrize(
    ("text", "instruction_id", "kwargs"),
    [
        ("[" * 40_000, "detectable_content:number_placeholders", {"num_placeholders": 1}),
        ("x" + "\n" * 40_000, "detectable_format:number_bullet_lists", {"num_bullets": 1}),
        ("<<" * 20_000, "detectable_format:title", None),
        ("x" + " " * 40_000, "detectable_content:postscript", {"postscript_marker": "P.S."}),
    ],
)
def test_degenerate_responses_are_fast(text, instruction_id, kwargs):
    # The reference's backtracking patterns take seconds here (quadratic); ours are linear.
    start = time.perf_counter()
    assert check(text, [instruction_id], [kwargs]) == [False]
    assert time.perf_counter() - start < 0.5
