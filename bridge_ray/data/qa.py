"""Question sets to one record type, one loader per format, picked by the file's suffix.

- ``.jsonl``: FlashRAG, one ``{"id", "question", "golden_answers", "metadata"?}`` object a line. A FlashRAG
  dataset root holds ``<root>/<name>/<split>.jsonl`` (``nq/test.jsonl``, ``hotpotqa/dev.jsonl``), and that file's
  path is how a split is named everywhere: a ``data.train`` entry, a ``data.eval`` value, ``eval --data
  NAME=PATH``. Its source is ``<name>/<split>``. The bundled world and ``prepare-data``'s eval sets
  (``<out>/<name>_<split>.jsonl``) are this format too.
- ``.parquet``: Search-R1 and verl-tool rows (verl's RL data): ``data_source``, ``prompt`` (chat messages with
  the question inside their instruction), answers under ``reward_model.ground_truth.target`` (else a
  ``golden_answers`` column), ``extra_info.{split,index}``. Only the bare question is kept, because our own
  prompt template is built around it: the ``question`` column when present (Search-R1 keeps FlashRAG's), else
  verl-tool's ``extra_info.question``, else the text after the first ``Question:`` of the last user message (where
  both tools' templates put it). The source is ``data_source`` less verl-tool's ``searchR1_`` tag, so a data set
  has one name whichever tool wrote the file. ``prepare-data``'s training mix is this format, cut to the
  columns read here (``id``, ``data_source``, ``question``, ``golden_answers``).

Every record carries a ``uid`` that is unique across a whole mixture of files (``<source>/<question id>``)
because GRPO groups rollouts by it; a per-source row index would put questions of different data sets in
one group. A malformed row stops loading with the file and the line (jsonl) or row (parquet); blank jsonl
lines are skipped (a trailing one is what most writers leave).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from bridge_ray.errors import InputError


class DataError(InputError):
    """A malformed question file; the message names the file and the line or row."""


@dataclass(frozen=True)
class QuestionRecord:
    uid: str
    question: str
    golden_answers: list[str]
    source: str
    metadata: dict[str, Any] = field(default_factory=dict)
    origin: str = ""  # "file:line" (jsonl) or "file:row N" (parquet), for messages

    @property
    def question_id(self) -> str:
        """The id within its source (``uid`` is ``<source>/<question id>``): what a rewritten file stores."""
        return self.uid[len(self.source) + 1 :]


def _answers(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not value or not all(isinstance(a, str) for a in value):
        raise DataError(f"{where}: golden answers must be a non-empty list of strings, got {value!r}")
    if blank := [i for i, answer in enumerate(value) if not answer.strip()]:  # every response would cover it
        raise DataError(f"{where}: golden_answers[{blank[0]}] is empty, and an empty answer is found in every "
                        "response: remove it or write the answer")
    return list(value)


def _text(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: {what} must be a non-empty string, got {value!r}")
    return value.strip()


def _identifier(value: Any, what: str, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int) or str(value) == "":
        raise DataError(f"{where}: {what} must be a string or an integer, got {value!r}")
    return str(value)


def default_source(path: Path) -> str:
    """``<directory>/<file stem>``, e.g. ``nq/train`` for FlashRAG's ``nq/train.jsonl``."""
    return f"{path.parent.name}/{path.stem}" if path.parent.name else path.stem


def _decode(raw: bytes, where: str) -> str:
    """One line as UTF-8; decoding line by line is what lets the error name the line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})") from None


def jsonl_objects(path: Path, skip_blank: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
    """``("file:line", object)`` for every line of a JSONL file; a line that is not a UTF-8 JSON object is an
    error naming the file and the line (a blank one too, unless ``skip_blank``)."""
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            where = f"{path}:{number}"
            line = _decode(raw, where)
            if skip_blank and not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def load_flashrag_jsonl(path: str | Path, source: str | None = None) -> list[QuestionRecord]:
    """One record per line ``{"id", "question", "golden_answers", "metadata"?}``; blank lines are skipped."""
    path = Path(path)
    source = source or default_source(path)
    records = []
    for where, row in jsonl_objects(path, skip_blank=True):
        for key in ("id", "question", "golden_answers"):
            if key not in row:
                raise DataError(f"{where}: missing key {key!r}")
        metadata = row.get("metadata", {})
        if not isinstance(metadata, dict):
            raise DataError(f"{where}: metadata must be an object, got {type(metadata).__name__}")
        qid = _identifier(row["id"], "id", where)
        records.append(
            QuestionRecord(
                uid=f"{source}/{qid}",
                question=_text(row["question"], "question", where),
                golden_answers=_answers(row["golden_answers"], where),
                source=source,
                metadata=metadata,
                origin=where,
            )
        )
    check_unique_uids(records)
    return records


VERL_TOOL_TAG = "searchR1_"  # verl-tool's prefix on Search-R1's data_source ("searchR1_nq")
QUESTION_MARKER = "Question:"  # where Search-R1's and verl-tool's templates put the question


def _parquet_source(row: dict[str, Any], where: str) -> str:
    source = _text(row.get("data_source"), "data_source", where)
    return _text(source.removeprefix(VERL_TOOL_TAG), "data_source", where)


def _parquet_question(row: dict[str, Any], where: str) -> str:
    """The bare question: the ``question`` column, else ``extra_info.question``, else dug out of the prompt."""
    if row.get("question") is not None:
        return _text(row["question"], "question", where)
    extra = row.get("extra_info")
    if isinstance(extra, dict) and extra.get("question") is not None:
        return _text(extra["question"], "extra_info.question", where)
    return _question_in_prompt(row.get("prompt"), where)


def _question_in_prompt(messages: Any, where: str) -> str:
    """The text after the first ``Question:`` of the last user message; the first, so that a question which
    itself says "Question:" stays whole (the instructions before it never do)."""
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: no 'question' column and 'prompt' is not a list of chat messages")
    users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise DataError(f"{where}: 'prompt' holds no user message")
    _, marker, question = users[-1].partition(QUESTION_MARKER)
    if not marker:
        raise DataError(
            f"{where}: no 'question' column or extra_info.question, and the user message has no "
            f"{QUESTION_MARKER!r} to find the question after"
        )
    return _text(question, f"the text after {QUESTION_MARKER!r} in the prompt", where)


def _parquet_answers(row: dict[str, Any], where: str) -> list[str]:
    """``reward_model.ground_truth.target`` (verl's reward input; a bare list or string is taken too), else
    ``golden_answers``."""
    reward = row.get("reward_model")
    truth = reward.get("ground_truth") if isinstance(reward, dict) else None
    if isinstance(truth, dict):
        truth = truth.get("target")
    answers = truth if truth is not None else row.get("golden_answers")
    if answers is None:
        raise DataError(f"{where}: no answers (neither reward_model.ground_truth.target nor golden_answers)")
    return _answers(answers, where)


def _parquet_id(row: dict[str, Any], where: str) -> str:
    """The ``id`` column, else ``<split>-<extra_info.index>``; qualified by the source in the uid, because
    Search-R1's index restarts at 0 for every source."""
    if row.get("id") is not None:
        return _identifier(row["id"], "id", where)
    extra = row.get("extra_info")
    index = extra.get("index") if isinstance(extra, dict) else None
    if index is None:
        raise DataError(f"{where}: neither an 'id' column nor extra_info.index to identify the question")
    return f"{extra.get('split') or 'unknown'}-{_identifier(index, 'extra_info.index', where)}"


def load_searchr1_parquet(path: str | Path) -> list[QuestionRecord]:
    """Search-R1 / verl-tool rows (see the module docstring), one record per row."""
    path = Path(path)
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    records = []
    for number, row in enumerate(rows):
        where = f"{path}: row {number}"
        source = _parquet_source(row, where)
        records.append(
            QuestionRecord(
                uid=f"{source}/{_parquet_id(row, where)}",
                question=_parquet_question(row, where),
                golden_answers=_parquet_answers(row, where),
                source=source,
                metadata={k: row[k] for k in ("ability", "extra_info") if row.get(k) is not None},
                origin=where,
            )
        )
    check_unique_uids(records)
    return records


def load_questions(paths: Iterable[str | Path]) -> list[QuestionRecord]:
    """A mixture of question files (``.jsonl`` FlashRAG, ``.parquet`` Search-R1 / verl-tool), uids checked unique."""
    records: list[QuestionRecord] = []
    for path in map(Path, paths):
        if path.suffix == ".jsonl":
            records.extend(load_flashrag_jsonl(path))
        elif path.suffix == ".parquet":
            records.extend(load_searchr1_parquet(path))
        else:
            raise DataError(f"{path}: unknown question file type (expected .jsonl or .parquet)")
    check_unique_uids(records)
    return records


def check_unique_uids(records: Sequence[QuestionRecord]) -> None:
    seen: dict[str, str] = {}
    for record in records:
        if record.uid in seen:
            raise DataError(f"duplicate question uid {record.uid!r} at {record.origin} (first at {seen[record.uid]})")
        seen[record.uid] = record.origin
