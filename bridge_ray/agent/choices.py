"""The option a multiple-choice answer picks: its letter, its text, or yes/no/maybe (MIRAGE's PubMedQA*, BioASQ).

The policy is asked for a letter but, trained on open-domain QA, often writes the option's text instead; both
count, so accuracy measures the choice rather than the answer format. Anything that names no option of the
question (another letter, free text, nothing) is None: wrong, never a guess (MIRAGE's own parser falls back
to "A", which would credit an empty answer on a quarter of the questions).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from bridge_ray.agent.reward import normalize_answer

# "Answer: B", "The answer is (B)", "Option B", "final answer - B."
_PREFIX = re.compile(r"^(?:(?:the\s+)?(?:final\s+|correct\s+)?answer(?:\s+is)?\s*[:\-]?\s*)?(?:option\s+)?", re.I)
_LETTER_ONLY = re.compile(r"^\(?([A-Za-z])\)?[.:)]?$")
_LETTER_THEN_TEXT = re.compile(r"^\(?([A-Z])[.:)]\s+\S")
_POLAR = ("yes", "no", "maybe")


def extract_choice(answer: str | None, options: Mapping[str, str]) -> str | None:
    """The letter of the option ``answer`` names, or None (see the module docstring for what counts)."""
    if answer is None:
        return None
    text = _PREFIX.sub("", answer.strip(), count=1).strip()
    letter = _LETTER_ONLY.match(text)
    if letter:
        return _known(letter.group(1).upper(), options)
    labelled = _LETTER_THEN_TEXT.match(text)
    if labelled:
        return _known(labelled.group(1), options)
    return _by_text(text, options)


def _known(letter: str, options: Mapping[str, str]) -> str | None:
    return letter if letter in options else None


def _by_text(text: str, options: Mapping[str, str]) -> str | None:
    """The option whose normalised text equals the answer's; for yes/no/maybe options, the answer's first word
    ("Yes, because ..." picks yes)."""
    wanted = normalize_answer(text)
    by_text = {normalize_answer(value): letter for letter, value in options.items()}
    if wanted in by_text:
        return by_text[wanted]
    first = wanted.split(" ", 1)[0]
    return by_text.get(first) if first in _POLAR else None
