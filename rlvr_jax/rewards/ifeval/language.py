"""Deterministic language identification for the IFEval language checkers.

Wraps the `langdetect` package (the detector the reference IFEval implementation uses; it ships
its 55 language profiles, nothing is downloaded). The reference calls `langdetect.detect`
unseeded, so its answer on short or mixed text can change between runs; here the detector is
built from its own factory with the sampling seed fixed to 0 and the profiles loaded in sorted
order, so one text always gets one answer, on any machine and from any thread. The global
`langdetect.DetectorFactory` is left untouched.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

IFEVAL_LANGUAGES: dict[str, str] = {
    "en": "English",
    "es": "Spanish",
    "pt": "Portuguese",
    "ar": "Arabic",
    "hi": "Hindi",
    "fr": "French",
    "ru": "Russian",
    "de": "German",
    "ja": "Japanese",
    "it": "Italian",
    "bn": "Bengali",
    "uk": "Ukrainian",
    "th": "Thai",
    "ur": "Urdu",
    "ta": "Tamil",
    "te": "Telugu",
    "bg": "Bulgarian",
    "ko": "Korean",
    "pl": "Polish",
    "he": "Hebrew",
    "fa": "Persian",
    "vi": "Vietnamese",
    "ne": "Nepali",
    "sw": "Swahili",
    "kn": "Kannada",
    "mr": "Marathi",
    "gu": "Gujarati",
    "pa": "Punjabi",
    "ml": "Malayalam",
    "fi": "Finnish",
}
"""ISO 639-1 codes the IFEval `language:response_language` instruction may ask for."""

DETECTOR_SEED = 0
"""Seed of langdetect's n-gram sampling."""


@lru_cache(maxsize=1)
def _factory() -> Any:
    """A langdetect `DetectorFactory` with every bundled profile, seeded; built once."""
    try:
        from langdetect.detector_factory import DetectorFactory
        from langdetect.utils.lang_profile import LangProfile
    except ImportError as error:
        raise ImportError(
            "the IFEval language checks need the 'langdetect' package (pip install langdetect)"
        ) from error
    entries = resources.files("langdetect").joinpath("profiles").iterdir()
    profiles = sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.name)
    factory = DetectorFactory()
    for index, entry in enumerate(profiles):
        profile = LangProfile(**json.loads(entry.read_text(encoding="utf-8")))
        factory.add_profile(profile, index, len(profiles))
    factory.set_seed(DETECTOR_SEED)
    return factory


def detect_language(text: str) -> str | None:
    """The language langdetect assigns to `text`, or None when the text has no letters to judge.

    Args:
      text: any text.

    Returns:
      A langdetect code ("en", "fr", "zh-cn", ...), or None where langdetect finds no features
      (empty text, digits and punctuation only); the reference counts that case as followed.
    """
    factory = _factory()
    from langdetect.lang_detect_exception import LangDetectException

    detector = factory.create()
    detector.append(text)
    try:
        return detector.detect()
    except LangDetectException:
        return None
