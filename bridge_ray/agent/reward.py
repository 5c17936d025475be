"""Answer extraction and scoring (SQuAD normalisation, as Search-R1 and FlashRAG report their numbers).

Only the *response* is ever read: the prompt may contain an example ``<answer>`` (ours does not, but a
user template might), and reading prompt + response would credit that example whenever the model gives
no answer of its own.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_POLAR = {"yes", "no", "noanswer"}


def extract_answer(response_text: str) -> str | None:
    """The stripped content of the last complete ``<answer>…</answer>`` of the response; None if there is none."""
    matches = _ANSWER.findall(response_text)
    return matches[-1].strip() if matches else None


def normalize_answer(text: str) -> str:
    """Lowercase, drop ASCII punctuation, replace the whole words a/an/the by a space, collapse whitespace."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _golden(golden_answers: str | Sequence[str]) -> list[str]:
    return [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)


def exact_match(prediction: str | None, golden_answers: str | Sequence[str]) -> float:
    """1.0 when the normalised prediction equals any normalised golden answer, else 0.0 (None scores 0)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golden(golden_answers)))


def cover_exact_match(prediction: str | None, golden_answers: str | Sequence[str]) -> float:
    """1.0 when any normalised golden answer is a substring of the normalised prediction ("acc" in FlashRAG)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(g) in pred for g in _golden(golden_answers)))


def f1_score(prediction: str | None, golden_answers: str | Sequence[str]) -> float:
    """Best token-level F1 over the golden answers; yes/no/noanswer must match exactly (else F1 0)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    best = 0.0
    for golden in _golden(golden_answers):
        gold = normalize_answer(golden)
        if (pred in _POLAR or gold in _POLAR) and pred != gold:
            continue
        common = Counter(pred.split()) & Counter(gold.split())
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision, recall = overlap / len(pred.split()), overlap / len(gold.split())
        best = max(best, 2 * precision * recall / (precision + recall))
    return best
