"""MIRAGE's ``benchmark.json``: five medical multiple-choice sets, read into question records the agent runs on.

The file (github.com/Teddy-XiongGZ/MIRAGE) is one JSON object: set name -> question id -> ``{"question",
"options": {"A": text, ...}, "answer": "A"}`` (PubMedQA* and BioASQ also carry ``PMID``, unused here). A record
keeps the options in ``metadata["options"]`` (the prompt's ``{options}``) and the answer letter as its golden
answer. Questions come in MIRAGE's order (sorted ids, as its ``QADataset`` indexes them), so ``--max-questions N``
is the same N questions MIRAGE's tools would take. A malformed entry is an error naming the file, the set and the
question id.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge_ray.data.qa import QuestionRecord
from bridge_ray.errors import InputError

# The paper's column order (Table "Medical QA"), with its column names.
MIRAGE_SETS: dict[str, str] = {
    "medqa": "MedQA",
    "medmcqa": "MedMCQA",
    "pubmedqa": "PubMedQA",
    "bioasq": "BioASQ",
    "mmlu": "MMLU-Medical",
}


@dataclass(frozen=True)
class ChoiceQuestion:
    set: str
    id: str
    question: str
    options: dict[str, str]
    answer: str  # the letter of the correct option

    def record(self) -> QuestionRecord:
        """The agent's view: the options ride in ``metadata`` for the prompt, the letter is the golden answer."""
        return QuestionRecord(
            uid=f"{self.set}/{self.id}", question=self.question, golden_answers=[self.answer], source=self.set,
            metadata={"options": dict(self.options)}, origin=f"{self.set}/{self.id}",
        )


def load_benchmark(path: str | Path, sets: Sequence[str] | None = None) -> dict[str, list[ChoiceQuestion]]:
    """The questions of ``sets`` (default: the five of :data:`MIRAGE_SETS` in the file, in that order)."""
    path = Path(path)
    benchmark = _read_object(path)
    if sets is None:
        sets = [name for name in MIRAGE_SETS if name in benchmark] or sorted(benchmark)
    missing = [name for name in sets if name not in benchmark]
    if missing:
        raise InputError(f"{path}: no set {', '.join(map(repr, missing))} (the file has: {', '.join(benchmark)})")
    return {name: _read_set(path, name, benchmark[name]) for name in sets}


def _read_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(f"--benchmark {path}: no such file")
    try:
        benchmark = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a UTF-8 JSON file ({exc})") from None
    if not isinstance(benchmark, dict) or not benchmark:
        raise InputError(f"{path}: expected a JSON object of sets (set name -> question id -> question)")
    return benchmark


def _read_set(path: Path, name: str, questions: Any) -> list[ChoiceQuestion]:
    if not isinstance(questions, dict) or not questions:
        raise InputError(f"{path}: set {name!r} must be a non-empty object of question id -> question")
    return [_read_question(f"{path}: {name}/{qid}", name, qid, questions[qid]) for qid in sorted(questions)]


def _read_question(where: str, name: str, qid: str, item: Any) -> ChoiceQuestion:
    if not isinstance(item, dict):
        raise InputError(f"{where}: expected an object with question, options and answer")
    question, options, answer = item.get("question"), item.get("options"), item.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise InputError(f"{where}: 'question' must be a non-empty string, got {question!r}")
    if not isinstance(options, dict) or len(options) < 2:
        raise InputError(f"{where}: 'options' must be an object of at least two letter -> text, got {options!r}")
    for letter, text in options.items():
        # a number is taken as its text: MIRAGE's builder writes MMLU's options as pandas read them
        number = isinstance(text, int | float) and not isinstance(text, bool)
        if len(letter) != 1 or not letter.isupper() or not (isinstance(text, str) or number):
            raise InputError(f"{where}: option {letter!r}: {text!r}; keys are capital letters, values texts")
    if answer not in options:
        raise InputError(f"{where}: 'answer' {answer!r} is not one of the options {sorted(options)}")
    return ChoiceQuestion(name, qid, question.strip(), {k: str(v) for k, v in options.items()}, answer)
