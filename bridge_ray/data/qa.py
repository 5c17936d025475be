"""Question sets to one record type: FlashRAG jsonl (also the bundled world's splits) and Search-R1 parquet.

Every record carries a ``uid`` that is unique across a whole mixture of files — ``<source>/<question id>`` —
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


def _answers(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not value or not all(isinstance(a, str) for a in value):
        raise DataError(f"{where}: golden answers must be a non-empty list of strings, got {value!r}")
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


def _searchr1_question(row: dict[str, Any], where: str) -> str:
    """The ``question`` column when present, else the text after the last "Question:" of the user message."""
    if row.get("question") is not None:
        return _text(row["question"], "question", where)
    messages = row.get("prompt")
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: no 'question' column and 'prompt' is not a list of chat messages")
    users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise DataError(f"{where}: 'prompt' holds no user message")
    text = users[-1]
    marker = text.rfind("Question:")
    return _text(text[marker + len("Question:") :] if marker >= 0 else text, "question", where)


def load_searchr1_parquet(path: str | Path) -> list[QuestionRecord]:
    """Search-R1 / verl rows (``data_source``, ``prompt``, ``reward_model.ground_truth.target``, ``extra_info``).

    The question id is the ``id`` column when present, else ``<split>-<extra_info.index>``; either way it is
    qualified by ``data_source``, because ``extra_info.index`` restarts at 0 for every source.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    records = []
    for number, row in enumerate(rows):
        where = f"{path}: row {number}"
        source = _text(row.get("data_source"), "data_source", where)
        ground_truth = (row.get("reward_model") or {}).get("ground_truth") or {}
        target = ground_truth.get("target") if isinstance(ground_truth, dict) else None
        answers = _answers(target if target is not None else row.get("golden_answers"), where)
        if row.get("id") is not None:
            qid = _identifier(row["id"], "id", where)
        else:
            extra = row.get("extra_info") or {}
            if extra.get("index") is None:
                raise DataError(f"{where}: neither an 'id' column nor extra_info.index to identify the question")
            qid = f"{extra.get('split', 'unknown')}-{_identifier(extra['index'], 'extra_info.index', where)}"
        records.append(
            QuestionRecord(
                uid=f"{source}/{qid}",
                question=_searchr1_question(row, where),
                golden_answers=answers,
                source=source,
                metadata={k: row[k] for k in ("ability", "extra_info") if row.get(k) is not None},
                origin=where,
            )
        )
    check_unique_uids(records)
    return records


def load_questions(paths: Iterable[str | Path]) -> list[QuestionRecord]:
    """A mixture of question files (``.jsonl`` FlashRAG, ``.parquet`` Search-R1), uids checked unique."""
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
