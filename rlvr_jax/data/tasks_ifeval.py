"""Synthetic format/constraint prompts checked by the `ifeval` verifier.

A prompt is a short writing task about a topic plus one or more constraints taken from the
reference IFEval (google-research `instruction_following_eval`), with its exact instruction ids
and kwarg names, so `rlvr_jax.rewards.ifeval.check` scores them as IFEval would. The ids chosen
are ones a small model can learn (case, title, end phrase, keywords, commas, length, quotes,
postscript, bullets). Each id has a kwargs sampler and a description; `reference_response`
writes a response that satisfies every constraint of a row.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

TOPICS = (
    "the ocean",
    "a red bicycle",
    "autumn leaves",
    "a quiet library",
    "mountain hiking",
    "a city park",
    "morning coffee",
    "the night sky",
    "a small garden",
    "train journeys",
    "rainy days",
    "a friendly dog",
    "fresh bread",
    "the desert",
    "a winter morning",
    "an old bridge",
    "learning to swim",
    "a village market",
    "the moon",
    "paper boats",
    "a summer festival",
    "wild flowers",
    "a long river",
    "board games",
    "a lighthouse",
    "snow in the hills",
    "a music lesson",
    "the first day of school",
    "a picnic",
    "honey bees",
)
"""Topics of the writing tasks (no commas, no forbidden words)."""

TASKS = (
    "Write a short note about {topic}.",
    "Describe {topic} in a few sentences.",
    "Write a brief message to a friend about {topic}.",
    "Explain in simple words why people enjoy {topic}.",
)
"""Task phrasings; `{topic}` is a topic."""

KEYWORDS = ("light", "water", "family", "music", "green", "quiet", "history", "color", "time")
"""Pool for `keywords:existence`."""

FORBIDDEN = ("very", "really", "thing", "stuff", "basically", "actually", "awesome", "super")
"""Pool for `keywords:forbidden_words`: words the reference response never writes."""

END_PHRASES = ("Any other questions?", "Is there anything else I can help with?", "That is all.")
"""Pool for `startend:end_checker` (the reference IFEval's two endings and one more)."""

FILLER = (
    "It is a simple pleasure that many people share.",
    "Every season gives it a new look.",
    "People often talk about it with a smile.",
    "It can teach us to slow down and notice small details.",
    "Children and adults enjoy it in their own ways.",
    "A calm moment with it can brighten the whole day.",
)
"""Sentences the reference response pads with (no commas, no forbidden words)."""

CONFLICTS = frozenset(
    {frozenset({"startend:quotation", "detectable_format:title"})}
)  # the reference IFEval's conflict table restricted to DEFAULT_IDS
"""Pairs of ids never combined in one prompt."""


@dataclass(frozen=True)
class Constraint:
    """One IFEval instruction: how to sample its kwargs and how to phrase it."""

    sample: Callable[[np.random.Generator], dict[str, Any]]
    """Draws the kwargs (exact reference names; `{}` for ids without arguments)."""
    describe: Callable[[dict[str, Any]], str]
    """The instruction text for given kwargs."""


def _pick(rng: np.random.Generator, pool: tuple[str, ...], k: int) -> list[str]:
    return sorted(str(pool[i]) for i in rng.choice(len(pool), size=k, replace=False))


def _number_words(rng: np.random.Generator) -> dict[str, Any]:
    if rng.random() < 0.5:
        # The longest reference response (every other constraint at its largest) has 50 words.
        return {"num_words": int(rng.integers(60, 101)), "relation": "less than"}
    return {"num_words": int(rng.integers(20, 61)), "relation": "at least"}


def _quoted(words: list[str]) -> str:
    return " and ".join(f'"{w}"' for w in words)


CONSTRAINTS: dict[str, Constraint] = {
    "change_case:english_lowercase": Constraint(
        lambda rng: {},
        lambda kw: (
            "Your entire response should be in English and in lowercase letters only. "
            "No capital letters are allowed."
        ),
    ),
    "detectable_format:title": Constraint(
        lambda rng: {},
        lambda kw: (
            "Your answer must contain a title wrapped in double angular brackets, "
            "such as <<poem of joy>>."
        ),
    ),
    "startend:end_checker": Constraint(
        lambda rng: {"end_phrase": END_PHRASES[int(rng.integers(0, len(END_PHRASES)))]},
        lambda kw: (
            f"Finish your response with this exact phrase: {kw['end_phrase']} "
            "No other words should follow this phrase."
        ),
    ),
    "keywords:existence": Constraint(
        lambda rng: {"keywords": _pick(rng, KEYWORDS, int(rng.integers(1, 3)))},
        lambda kw: f"Include the keywords {_quoted(kw['keywords'])} in the response.",
    ),
    "keywords:forbidden_words": Constraint(
        lambda rng: {"forbidden_words": _pick(rng, FORBIDDEN, int(rng.integers(1, 3)))},
        lambda kw: f"Do not include the words {_quoted(kw['forbidden_words'])} in the response.",
    ),
    "punctuation:no_comma": Constraint(
        lambda rng: {},
        lambda kw: "In your entire response, refrain from the use of any commas.",
    ),
    "length_constraints:number_words": Constraint(
        _number_words,
        lambda kw: f"Answer with {kw['relation']} {kw['num_words']} words.",
    ),
    "startend:quotation": Constraint(
        lambda rng: {},
        lambda kw: "Wrap your entire response with double quotation marks.",
    ),
    "detectable_content:postscript": Constraint(
        lambda rng: {"postscript_marker": ("P.S.", "P.P.S")[int(rng.integers(0, 2))]},
        lambda kw: (
            "At the end of your response, please explicitly add a postscript "
            f"starting with {kw['postscript_marker']}"
        ),
    ),
    "detectable_format:number_bullet_lists": Constraint(
        lambda rng: {"num_bullets": int(rng.integers(1, 5))},
        lambda kw: (
            f"Your answer must contain exactly {kw['num_bullets']} bullet points. "
            "Use markdown bullet points such as:\n* This is point 1.\n* This is point 2"
        ),
    ),
}
"""The instructions this domain uses, by reference IFEval id."""

DEFAULT_IDS = tuple(CONSTRAINTS)


@dataclass(frozen=True)
class IfevalSpec:
    """The knobs of the constraint domain."""

    min_constraints: int = 1
    """Fewest instructions per prompt."""
    max_constraints: int = 2
    """Most instructions per prompt."""
    instruction_ids: tuple[str, ...] = DEFAULT_IDS
    """Ids drawn from (a subset of `CONSTRAINTS`)."""

    def __post_init__(self) -> None:
        unknown = [i for i in self.instruction_ids if i not in CONSTRAINTS]
        if unknown:
            raise ValueError(f"IfevalSpec: unknown instruction ids {unknown}; known: {DEFAULT_IDS}")
        if not 1 <= self.min_constraints <= self.max_constraints <= len(self.instruction_ids):
            raise ValueError(
                "IfevalSpec needs 1 <= min_constraints <= max_constraints <= "
                f"len(instruction_ids), got {self.min_constraints}, {self.max_constraints}, "
                f"{len(self.instruction_ids)}"
            )


def _sample_ids(rng: np.random.Generator, spec: IfevalSpec) -> list[str]:
    k = int(rng.integers(spec.min_constraints, spec.max_constraints + 1))
    while True:
        order = rng.permutation(len(spec.instruction_ids))[:k]
        ids = [spec.instruction_ids[i] for i in sorted(order)]
        pairs = {frozenset({a, b}) for a in ids for b in ids if a != b}
        if not pairs & CONFLICTS:
            return ids


def make_problem(rng: np.random.Generator, spec: IfevalSpec) -> tuple[str, dict]:
    """One problem: (its canonical key — topic, task and constraints —, the data row)."""
    topic_i = int(rng.integers(0, len(TOPICS)))
    task_i = int(rng.integers(0, len(TASKS)))
    ids = _sample_ids(rng, spec)
    kwargs = [CONSTRAINTS[i].sample(rng) for i in ids]
    descriptions = [CONSTRAINTS[i].describe(kw) for i, kw in zip(ids, kwargs)]
    prompt = " ".join([TASKS[task_i].format(topic=TOPICS[topic_i]), *descriptions])
    row = {
        "prompt": prompt,
        "ground_truth": {"instruction_id": ids, "kwargs": kwargs},
        "verifier": "ifeval",
        "domain": "ifeval",
        "verifier_kwargs": {},
        "topic": TOPICS[topic_i],
    }
    key = f"{topic_i}|{task_i}|{ids}|{kwargs}"
    return key, row


def _count_words(text: str) -> int:
    return len(re.findall(r"\w+", text))


def reference_response(row: dict) -> str:
    """A response that satisfies every constraint of an ifeval row of this domain."""
    ground_truth = row["ground_truth"]
    kw = dict(zip(ground_truth["instruction_id"], ground_truth["kwargs"]))
    length = kw.get("length_constraints:number_words")
    if length is None:
        return _compose(row["topic"], kw, n_filler=1)
    if length["relation"] == "less than":
        text = _compose(row["topic"], kw, n_filler=0)
        if _count_words(text) >= length["num_words"]:
            raise ValueError(f"no reference response fits under {length['num_words']} words")
        return text
    n_filler = 0
    while _count_words(text := _compose(row["topic"], kw, n_filler)) < length["num_words"]:
        n_filler += 1
    return text


def _compose(topic: str, kw: dict[str, dict[str, Any]], n_filler: int) -> str:
    lines = []
    if "detectable_format:title" in kw:
        lines.append(f"<<Thoughts on {topic}>>")
    body = [f"Here is a short note about {topic}."]
    body += [FILLER[i % len(FILLER)] for i in range(n_filler)]
    if "keywords:existence" in kw:
        body.append(f"It brings to mind {' and '.join(kw['keywords:existence']['keywords'])}.")
    lines.append(" ".join(body))
    if "detectable_format:number_bullet_lists" in kw:
        n = kw["detectable_format:number_bullet_lists"]["num_bullets"]
        lines += [f"* Point {i + 1}." for i in range(n)]
    if "detectable_content:postscript" in kw:
        marker = kw["detectable_content:postscript"]["postscript_marker"]
        lines.append(f"{marker} I hope you enjoyed reading this.")
    if "startend:end_checker" in kw:
        lines.append(kw["startend:end_checker"]["end_phrase"])
    text = "\n".join(lines)
    if "startend:quotation" in kw:
        text = f'"{text}"'
    if "change_case:english_lowercase" in kw:
        text = text.lower()
    return text
