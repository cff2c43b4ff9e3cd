"""Sentence and word splitting for IFEval, and the two instructions that depend on them.

The reference splits with NLTK's trained English Punkt model, which cannot be fetched here.
The hand-checked cases below are ordinary prose whose expected splits were derived by hand
from the Punkt rules (abbreviations, initials, numbers, ellipses, closing quotes); the
NLTK comparisons (when nltk is installed) run NLTK's own Punkt algorithm with our abbreviation
and sentence-starter parameters, and NLTK's `NLTKWordTokenizer`, against our re-implementation.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from rlvr_jax.rewards.ifeval import check
from rlvr_jax.rewards.ifeval.text import (
    ABBREVIATIONS,
    SENTENCE_STARTERS,
    count_sentences,
    count_words,
    split_sentences,
    split_words,
    treebank_tokens,
)

SENTENCES = [
    (
        "The cat sat on the mat. It was happy! Was it hungry? No.",
        ["The cat sat on the mat.", "It was happy!", "Was it hungry?", "No."],
    ),
    # Titles and "p.m." are abbreviations; "p.m." before a lower-case word does not end one.
    (
        "Mr. Smith went to Washington. He met Dr. Jones at 5 p.m. on Monday.",
        ["Mr. Smith went to Washington.", "He met Dr. Jones at 5 p.m. on Monday."],
    ),
    (
        "I like apples, pears, etc. and other fruit.",
        ["I like apples, pears, etc. and other fruit."],
    ),
    # "U.S." + lower case stays; "3.5" has no boundary; "2020." + capital ends a sentence.
    (
        "The U.S. economy grew by 3.5 percent in 2020. Analysts were surprised.",
        ["The U.S. economy grew by 3.5 percent in 2020.", "Analysts were surprised."],
    ),
    # Closing quotes and brackets stay with the sentence they close.
    ('She said, "Stop it!" Then she left.', ['She said, "Stop it!"', "Then she left."]),
    (
        "(This is a parenthetical sentence.) This is another.",
        ["(This is a parenthetical sentence.)", "This is another."],
    ),
    ("Wait... what happened?", ["Wait... what happened?"]),
    # Newlines alone never end a sentence.
    (
        "Line one without period\nLine two without period",
        ["Line one without period\nLine two without period"],
    ),
    (
        "Visit example.com for details. It is free.",
        ["Visit example.com for details.", "It is free."],
    ),
    # Initials followed by a name continue the sentence.
    (
        "J. R. R. Tolkien wrote The Hobbit. It was published in 1937.",
        ["J. R. R. Tolkien wrote The Hobbit.", "It was published in 1937."],
    ),
    # Several marks in one run end one sentence; a number before a lower-case word does not.
    ("Really?! Yes. Chapter 5. then more.", ["Really?!", "Yes.", "Chapter 5. then more."]),
    # Markdown numbered lists: "1." before a capitalised word is a sentence of its own.
    (
        "Steps:\n1. Preheat the oven.\n2. Bake the cake.",
        ["Steps:\n1.", "Preheat the oven.", "2.", "Bake the cake."],
    ),
    ("", []),
    ("   \n ", []),
]


@pytest.mark.parametrize(("text", "expected"), SENTENCES)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected
    assert count_sentences(text) == len(expected)


WORDS = [
    # Clitics split Treebank-style: "ca n't", "it 's"; the final "!" is split off.
    (
        "I can't believe it's NOT BUTTER!",
        ["I", "ca", "n't", "believe", "it", "'s", "NOT", "BUTTER", "!"],
    ),
    # Double quotes become `` and ''; "&" is split off, so AT&T is three tokens.
    ('He said "HELLO" to AT&T.', ["He", "said", "``", "HELLO", "''", "to", "AT", "&", "T", "."]),
    # Two sentences: the first's period is split off, "U.S." inside the second is kept.
    ("GONNA WIN. U.S. TEAM", ["GON", "NA", "WIN", ".", "U.S.", "TEAM"]),
    (
        "Cost: $3.88 (roughly), cannot wait",
        ["Cost", ":", "$", "3.88", "(", "roughly", ")", ",", "can", "not", "wait"],
    ),
]


@pytest.mark.parametrize(("text", "expected"), WORDS)
def test_split_words(text, expected):
    assert split_words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("don't stop-me now", 5), ("", 0), ("naïve café 42", 3)]
)
def test_count_words(text, expected):
    # \w+ runs: don / t / stop / me / now; Unicode letters are word characters.
    assert count_words(text) == expected


@pytest.mark.parametrize(
    ("text", "frequency", "relation", "expected"),
    [
        # Capital tokens: I, NOT, BUTTER = 3 ("ca", "n't", "'s", "!" are not upper case).
        ("I can't believe it's NOT BUTTER!", 3, "at least", True),
        ("I can't believe it's NOT BUTTER!", 3, "less than", False),
        # HELLO, AT, T = 3; the quote tokens `` and '' have no cased letter.
        ('He said "HELLO" to AT&T.', 4, "less than", True),
        # GON, NA, WIN, U.S., TEAM = 5.
        ("GONNA WIN. U.S. TEAM", 5, "at least", True),
        ("GONNA WIN. U.S. TEAM", 6, "at least", False),
        # CAN'T splits into CA + N'T: two capital words.
        ("CAN'T", 2, "at least", True),
    ],
)
def test_capital_word_frequency(text, frequency, relation, expected):
    kwargs = {"capital_frequency": frequency, "capital_relation": relation}
    assert check(text, ["change_case:capital_word_frequency"], [kwargs]) == [expected]


@pytest.mark.parametrize(
    ("text", "num_sentences", "relation", "expected"),
    [
        # 2 sentences (see SENTENCES).
        (
            "Mr. Smith went to Washington. He met Dr. Jones at 5 p.m. on Monday.",
            2,
            "at least",
            True,
        ),
        (
            "Mr. Smith went to Washington. He met Dr. Jones at 5 p.m. on Monday.",
            2,
            "less than",
            False,
        ),
        (
            "Mr. Smith went to Washington. He met Dr. Jones at 5 p.m. on Monday.",
            3,
            "less than",
            True,
        ),
        # 4 sentences: "Steps:\n1.", "Preheat the oven.", "2.", "Bake the cake."
        ("Steps:\n1. Preheat the oven.\n2. Bake the cake.", 4, "at least", True),
        ("Steps:\n1. Preheat the oven.\n2. Bake the cake.", 5, "at least", False),
        # No end mark at all: one sentence.
        ("* a bullet\n* another bullet", 2, "less than", True),
    ],
)
def test_number_sentences(text, num_sentences, relation, expected):
    kwargs = {"num_sentences": num_sentences, "relation": relation}
    assert check(text, ["length_constraints:number_sentences"], [kwargs]) == [expected]


PIECES = [
    *["Hello", "world", "THE", "The", "the", "This", "fox", "Smith", "J.", "K.", "a.", "Mr."],
    *["Dr.", "etc.", "e.g.", "U.S.", "p.m.", "1.", "5.", "2020.", "3.5", ".", "!", "?", "?!"],
    *["...", "..", ". . .", '"', "'", "“", "”", "(", ")", "[", "]", "*", "**", "-", "--", ","],
    *[";", ":", "I", "it", "It", "CAN'T", "don't", "I'm", "gonna", "cannot", "'tis", "AT&T"],
    *["$5", "#1", "@x", "example.com.", "Then", "then", "—", "wanna", "''", "``", "«", "»"],
    *["’s", "\u00a0"],
]


def random_text(rng: random.Random) -> str:
    return "".join(
        rng.choice(PIECES) + rng.choice([" ", " ", "", "\n", "  ", "\n\n"])
        for _ in range(rng.randint(0, 20))
    )


def test_sentences_match_nltk_punkt_algorithm():
    punkt = pytest.importorskip("nltk.tokenize.punkt")
    params = punkt.PunktParameters()
    params.abbrev_types = set(ABBREVIATIONS)
    params.sent_starters = set(SENTENCE_STARTERS)
    # Our rule "a capitalised sentence starter opens a sentence" is Punkt's orthographic
    # heuristic for words seen lower-case mid-sentence and never capitalised mid-sentence.
    params.ortho_context = defaultdict(int, {w: punkt._ORTHO_MID_LC for w in SENTENCE_STARTERS})
    tokenizer = punkt.PunktSentenceTokenizer(params)
    rng = random.Random(0)
    for _ in range(1500):
        text = random_text(rng)
        assert split_sentences(text) == tokenizer.tokenize(text), text
    for text, _ in SENTENCES:
        assert split_sentences(text) == tokenizer.tokenize(text), text


def test_words_match_nltk_word_tokenizer():
    destructive = pytest.importorskip("nltk.tokenize.destructive")
    tokenizer = destructive.NLTKWordTokenizer()
    rng = random.Random(1)
    for _ in range(1500):
        for sentence in split_sentences(random_text(rng)):
            assert treebank_tokens(sentence) == tokenizer.tokenize(sentence), sentence
