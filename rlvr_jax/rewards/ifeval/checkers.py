"""The 25 IFEval instruction checkers, registered by instruction id.

Each checker is a pure function `(response, **arguments) -> bool` with the strict semantics of
the reference implementation (google-research `instruction_following_eval/instructions.py`,
ported in lm-eval `tasks/ifeval`); the docstrings say what each one tests. Where the
reference would crash on a legal input this one answers instead:

* keywords, postscript markers and section splitters are regular expressions in the reference;
  one that is not a valid expression is matched literally here;
* `detectable_format:json_format` answers False for JSON nested too deeply for the parser.

The empty-response rule (a blank response follows no instruction) lives in `check`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rlvr_jax.rewards.ifeval import args, scan
from rlvr_jax.rewards.ifeval.args import RELATIONS, ArgumentError, Param
from rlvr_jax.rewards.ifeval.language import IFEVAL_LANGUAGES, detect_language
from rlvr_jax.rewards.ifeval.text import count_sentences, count_words, split_words


@dataclass(frozen=True)
class Instruction:
    """One registered instruction: its id, its (required) arguments and its checker."""

    instruction_id: str
    params: tuple[Param, ...]
    check: Callable[..., bool]
    constraint: Callable[[dict[str, Any]], str | None] | None = None
    """Cross-argument validation: returns an error message, or None when the arguments fit."""

    def arguments(self, kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
        """Validated, normalised arguments from a ground truth's kwargs for this instruction.

        Raises:
          ArgumentError: a missing, unknown or malformed argument (the message names the id).
        """
        arguments = args.parse_kwargs(self.instruction_id, self.params, kwargs)
        problem = self.constraint(arguments) if self.constraint else None
        if problem:
            raise ArgumentError(f"ifeval instruction {self.instruction_id!r}: {problem}")
        return arguments


INSTRUCTIONS: dict[str, Instruction] = {}
"""Instruction id -> Instruction, for the 25 ids of the reference registry."""


def _register(
    instruction_id: str,
    *params: Param,
    constraint: Callable[[dict[str, Any]], str | None] | None = None,
) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    def decorate(check: Callable[..., bool]) -> Callable[..., bool]:
        INSTRUCTIONS[instruction_id] = Instruction(instruction_id, params, check, constraint)
        return check

    return decorate


def _compare(actual: int, relation: str, threshold: int) -> bool:
    """`actual < threshold` for "less than", `actual >= threshold` for "at least"."""
    return actual < threshold if relation == RELATIONS[0] else actual >= threshold


@lru_cache(maxsize=4096)
def _pattern(template: str, expression: str, flags: int = 0) -> re.Pattern[str]:
    """`template` with `{}` replaced by the ground-truth regular expression `expression`.

    If the result does not compile (where the reference would crash), `expression` is matched
    literally instead.
    """
    try:
        return re.compile(template.replace("{}", expression), flags)
    except re.error:
        return re.compile(template.replace("{}", re.escape(expression)), flags)


# keywords:*


@_register("keywords:existence", args.texts("keywords"))
def keywords_existence(response: str, *, keywords: tuple[str, ...]) -> bool:
    """Every keyword occurs somewhere in the response, ignoring case (substrings count)."""
    return all(_pattern("{}", keyword, re.IGNORECASE).search(response) for keyword in keywords)


@_register(
    "keywords:frequency", args.text("keyword"), args.count("frequency"), args.relation("relation")
)
def keyword_frequency(response: str, *, keyword: str, frequency: int, relation: str) -> bool:
    """The keyword's case-insensitive, non-overlapping occurrence count meets the relation."""
    occurrences = len(_pattern("{}", keyword.strip(), re.IGNORECASE).findall(response))
    return _compare(occurrences, relation, frequency)


@_register("keywords:forbidden_words", args.texts("forbidden_words"))
def forbidden_words(response: str, *, forbidden_words: tuple[str, ...]) -> bool:
    """No forbidden word occurs as a whole word (between `\\b` boundaries), ignoring case."""
    return not any(
        _pattern(r"\b{}\b", word, re.IGNORECASE).search(response) for word in forbidden_words
    )


@_register(
    "keywords:letter_frequency",
    args.letter("letter"),
    args.count("let_frequency"),
    args.relation("let_relation"),
)
def letter_frequency(response: str, *, letter: str, let_frequency: int, let_relation: str) -> bool:
    """The letter's count in the lower-cased response meets the relation."""
    return _compare(response.lower().count(letter), let_relation, let_frequency)


# language / change_case


@_register("language:response_language", args.choice("language", IFEVAL_LANGUAGES))
def response_language(response: str, *, language: str) -> bool:
    """The detected language is `language`; text with nothing to detect counts as followed."""
    detected = detect_language(response)
    return detected is None or detected == language


@_register("change_case:english_capital")
def english_capital(response: str) -> bool:
    """All cased characters are upper case, and the text is English (or undetectable)."""
    return response.isupper() and detect_language(response) in ("en", None)


@_register("change_case:english_lowercase")
def english_lowercase(response: str) -> bool:
    """All cased characters are lower case, and the text is English (or undetectable)."""
    return response.islower() and detect_language(response) in ("en", None)


@_register(
    "change_case:capital_word_frequency",
    args.count("capital_frequency"),
    args.relation("capital_relation"),
)
def capital_word_frequency(response: str, *, capital_frequency: int, capital_relation: str) -> bool:
    """The number of all-capital word tokens (`nltk.word_tokenize` tokens) meets the relation."""
    capitals = sum(1 for word in split_words(response) if word.isupper())
    return _compare(capitals, capital_relation, capital_frequency)


# length_constraints:*


@_register(
    "length_constraints:number_sentences", args.count("num_sentences"), args.relation("relation")
)
def number_sentences(response: str, *, num_sentences: int, relation: str) -> bool:
    """The Punkt-style sentence count meets the relation."""
    return _compare(count_sentences(response), relation, num_sentences)


@_register("length_constraints:number_words", args.count("num_words"), args.relation("relation"))
def number_words(response: str, *, num_words: int, relation: str) -> bool:
    """The number of `\\w+` runs meets the relation."""
    return _compare(count_words(response), relation, num_words)


_PARAGRAPH_DIVIDER = re.compile(r"\s?\*\*\*\s?")


@_register("length_constraints:number_paragraphs", args.count("num_paragraphs"))
def number_paragraphs(response: str, *, num_paragraphs: int) -> bool:
    """Exactly `num_paragraphs` paragraphs divided by `***`; an empty inner paragraph fails.

    Blank text before the first or after the last divider is not a paragraph.
    """
    paragraphs = _PARAGRAPH_DIVIDER.split(response)
    last = len(paragraphs) - 1
    if any(not p.strip() for i, p in enumerate(paragraphs) if 0 < i < last):
        return False
    return sum(1 for p in paragraphs if p.strip()) == num_paragraphs


_FIRST_WORD_STOP = frozenset(".,?!'\"")


def _check_nth_paragraph(arguments: dict[str, Any]) -> str | None:
    if arguments["nth_paragraph"] > arguments["num_paragraphs"]:
        return "nth_paragraph must not exceed num_paragraphs"
    return None


@_register(
    "length_constraints:nth_paragraph_first_word",
    args.count("num_paragraphs"),
    args.count("nth_paragraph", minimum=1),
    args.text("first_word"),
    constraint=_check_nth_paragraph,
)
def nth_paragraph_first_word(
    response: str, *, num_paragraphs: int, nth_paragraph: int, first_word: str
) -> bool:
    """`num_paragraphs` non-blank paragraphs split on "\\n\\n"; paragraph n starts with the word.

    As in the reference, paragraph n is the n-th piece of the raw split (blank pieces
    included), and the compared word is its first whitespace token with leading quotes removed,
    cut at the first of . , ? ! ' ", lower-cased.
    """
    paragraphs = response.split("\n\n")
    non_blank = sum(1 for p in paragraphs if p.strip())
    if nth_paragraph > non_blank:
        return False
    paragraph = paragraphs[nth_paragraph - 1].strip()
    if not paragraph:
        return False
    word = paragraph.split()[0].lstrip("'").lstrip('"')
    cut = next((i for i, c in enumerate(word) if c in _FIRST_WORD_STOP), len(word))
    return non_blank == num_paragraphs and word[:cut].lower() == first_word.lower()


# detectable_content:*


@_register("detectable_content:number_placeholders", args.count("num_placeholders"))
def number_placeholders(response: str, *, num_placeholders: int) -> bool:
    """At least `num_placeholders` square-bracket placeholders such as [address] (one line each)."""
    return scan.count_placeholders(response) >= num_placeholders


# The reference's patterns start with `\s*`, which cannot change whether a search succeeds
# but makes it quadratic on long runs of whitespace; they are left out.
_POSTSCRIPT_PATTERNS = {"P.P.S": r"p\.\s?p\.\s?s", "P.S.": r"p\.\s?s\."}


@_register("detectable_content:postscript", args.text("postscript_marker"))
def postscript(response: str, *, postscript_marker: str) -> bool:
    """Some line of the lower-cased response contains the marker ("P.S.", "P.P.S", ...).

    "P.S." and "P.P.S" allow one optional space after each period; other markers are used
    as lower-cased regular expressions.
    """
    marker = postscript_marker.strip()
    if marker in _POSTSCRIPT_PATTERNS:
        found = re.search(_POSTSCRIPT_PATTERNS[marker], response.lower())
    else:
        found = _pattern("{}", marker.lower(), re.MULTILINE).search(response.lower())
    return found is not None


# detectable_format:*


@_register("detectable_format:number_bullet_lists", args.count("num_bullets"))
def number_bullet_lists(response: str, *, num_bullets: int) -> bool:
    """Exactly `num_bullets` lines start with "* " (not "**") or "-" markdown bullets."""
    return scan.count_bullets(response) == num_bullets


CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


@_register("detectable_format:constrained_response")
def constrained_response(response: str) -> bool:
    """The response contains one of "My answer is yes./no./maybe." (case-sensitive)."""
    return any(option in response.strip() for option in CONSTRAINED_RESPONSES)


_HIGHLIGHT = re.compile(r"\*[^\n\*]*\*")
_DOUBLE_HIGHLIGHT = re.compile(r"\*\*[^\n\*]*\*\*")


@_register("detectable_format:number_highlighted_sections", args.count("num_highlights"))
def number_highlighted_sections(response: str, *, num_highlights: int) -> bool:
    """At least `num_highlights` non-blank *single* plus **double** star highlights.

    Counted as the reference does: `*x*` matches and `**x**` matches are found separately;
    in "**bold**" the single-star matches are the blank pairs "**", so it counts once.
    """
    singles = sum(1 for h in _HIGHLIGHT.findall(response) if h.strip("*").strip())
    doubles = sum(1 for h in _DOUBLE_HIGHLIGHT.findall(response) if h[2:-2].strip())
    return singles + doubles >= num_highlights


@_register(
    "detectable_format:multiple_sections",
    args.text("section_spliter"),
    args.count("num_sections"),
)
def multiple_sections(response: str, *, section_spliter: str, num_sections: int) -> bool:
    """At least `num_sections` section headers "<spliter> <number>" (case-sensitive)."""
    splitter = _pattern(r"\s?{}\s?\d+\s?", section_spliter.strip())
    return len(splitter.split(response)) - 1 >= num_sections


_JSON_FENCES = ("```json", "```Json", "```JSON", "```")


@_register("detectable_format:json_format")
def json_format(response: str) -> bool:
    """The response, without one optional ``` / ```json fence, parses as JSON."""
    value = response.strip()
    for fence in _JSON_FENCES:
        value = value.removeprefix(fence)
    value = value.removesuffix("```").strip()
    try:
        json.loads(value)
    except (ValueError, RecursionError):
        return False
    return True


@_register("detectable_format:title")
def title(response: str) -> bool:
    """Some <<title>> on one line has non-blank content."""
    return any(t.lstrip("<").rstrip(">").strip() for t in scan.titles(response))


# combination:* / startend:* / punctuation:*


@_register("combination:two_responses")
def two_responses(response: str) -> bool:
    """Two different non-blank responses separated by "******" (blank ends are allowed)."""
    parts = response.split("******")
    last = len(parts) - 1
    if any(not p.strip() for i, p in enumerate(parts) if 0 < i < last):
        return False
    answers = [p for p in parts if p.strip()]
    return len(answers) == 2 and answers[0].strip() != answers[1].strip()


@_register("combination:repeat_prompt", args.text("prompt_to_repeat"))
def repeat_prompt(response: str, *, prompt_to_repeat: str) -> bool:
    """The response starts with the prompt, ignoring case and surrounding whitespace."""
    return response.strip().lower().startswith(prompt_to_repeat.strip().lower())


@_register("startend:end_checker", args.text("end_phrase"))
def end_checker(response: str, *, end_phrase: str) -> bool:
    """The response ends with the phrase, ignoring case, whitespace and enclosing quotes."""
    return response.strip().strip('"').lower().endswith(end_phrase.strip().lower())


@_register("startend:quotation")
def quotation(response: str) -> bool:
    """The stripped response is wrapped in double quotes (and longer than one character)."""
    value = response.strip()
    return len(value) > 1 and value[0] == '"' and value[-1] == '"'


@_register("punctuation:no_comma")
def no_comma(response: str) -> bool:
    """The response contains no ASCII comma."""
    return "," not in response
