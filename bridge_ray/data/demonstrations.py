"""The records of a demonstration file (``warmup.data``), read and checked without a tokenizer, and the gold
passages of the questions the warm-up's gold searches are built from when there is no such file.

One record per line, either a trajectory ``{"question": str, "turns": [{"action": str, "observation": str?},
...]}`` or a chat record ``{"messages": [{"role", "content"}, ...]}`` (system and first user messages form the
prompt, ``assistant`` messages are actions, later ``user`` / ``tool`` messages observations). Reading is apart
from building (:func:`bridge_ray.agent.demonstrations.load_demonstrations`) so that ``train`` refuses a malformed
file before Ray starts, not in the warm-up task after the policy has loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge_ray.data.qa import DataError, QuestionRecord, jsonl_objects

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Step:
    """An action (the policy's text, learnt) or an observation (shown, not learnt)."""

    text: str
    action: bool


@dataclass(frozen=True)
class DemonstrationRecord:
    """One line of the file: the prompt (a question for the template, or a chat record's whole prompt) and the
    steps after it; ``where`` is ``file:line``."""

    where: str
    prompt: str
    chat: bool
    steps: tuple[Step, ...]


def read_demonstrations(path: str | Path) -> list[DemonstrationRecord]:
    """Every record of ``path``; a malformed line is a :class:`DataError` naming the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"demonstration file {path} does not exist")
    records = []
    for where, row in jsonl_objects(path, skip_blank=True):
        if "messages" in row:
            records.append(_chat_record(row["messages"], where))
        elif "turns" in row:
            records.append(_turns_record(row, where))
        else:
            raise DataError(f"{where}: expected a 'turns' (trajectory) or 'messages' (chat) record")
    if not records:
        raise DataError(f"{path}: no demonstrations")
    return records


def gold_passage_ids(record: QuestionRecord) -> list[int]:
    """A question's ``metadata.gold_doc_ids`` as corpus ids ([] when it has none); ids that are not whole numbers
    are a :class:`DataError` naming its file and line."""
    ids = record.metadata.get("gold_doc_ids") or []
    if not isinstance(ids, list) or not all(_corpus_id(d) for d in ids):
        raise DataError(f"{record.origin}: metadata.gold_doc_ids must be a list of corpus ids (whole numbers), "
                        f"got {ids!r}")
    return [int(d) for d in ids]


def _corpus_id(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and value.isdigit())


def check_gold_searches(records: Sequence[QuestionRecord]) -> None:
    """The questions a gold-search warm-up draws from: every one's gold ids readable, and at least one with
    some (a question without them is never demonstrated; with none, there is nothing to demonstrate)."""
    with_gold = [record for record in records if gold_passage_ids(record)]  # every record's ids checked
    if records and not with_gold:
        raise DataError(f"{records[0].origin}: no metadata.gold_doc_ids, nor has any other of the "
                        f"{len(records)} questions: gold-search demonstrations show each question's gold passages")


def _string(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: {what} must be a non-empty string, got {value!r}")
    return value


def _turns_record(row: dict, where: str) -> DemonstrationRecord:
    question = _string(row.get("question"), "question", where)
    turns = row["turns"]
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: turns must be a non-empty list of {{'action', 'observation'?}} objects")
    steps = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or set(turn) - {"action", "observation"}:
            raise DataError(f"{where}: turns[{i}] must be an object with 'action' and optionally 'observation'")
        steps.append(Step(_string(turn.get("action"), f"turns[{i}].action", where), action=True))
        if "observation" in turn:
            steps.append(Step(_string(turn["observation"], f"turns[{i}].observation", where), action=False))
    return DemonstrationRecord(where, question, chat=False, steps=tuple(steps))


def _chat_record(messages: Any, where: str) -> DemonstrationRecord:
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise DataError(f"{where}: messages must be a non-empty list of {{'role', 'content'}} objects")
    roles = [m.get("role") for m in messages]
    if bad := [r for r in roles if r not in ROLES]:
        raise DataError(f"{where}: unknown message role {bad[0]!r} ({', '.join(ROLES)})")
    if "assistant" not in roles:
        raise DataError(f"{where}: no assistant message to learn from")
    first = roles.index("assistant")
    if "user" not in roles[:first]:
        raise DataError(f"{where}: the first assistant message must follow a user message")
    prompt = "\n\n".join(_string(m.get("content"), f"messages[{i}].content", where)
                         for i, m in enumerate(messages[:first]))
    steps = tuple(Step(_string(m.get("content"), f"messages[{i}].content", where), action=m["role"] == "assistant")
                  for i, m in enumerate(messages[first:], start=first))
    return DemonstrationRecord(where, prompt, chat=True, steps=steps)
