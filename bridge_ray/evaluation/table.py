"""The paper's results table: per-data-set EM, the multi-hop average (M-Avg.) and the overall average (Avg.).

F1, cover-EM and, where gold passages are known (the bundled world), retrieval recall are reported
alongside. A data set whose questions carry a ``type`` (the world: single / two_hop / comparison) is
also broken down by type, and its multi-hop types count towards M-Avg.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bridge_ray.agent.outcomes import QuestionOutcome
from bridge_ray.records import read_record, validated

EVALUATION_FILE = "an evaluation file"  # what read_table's errors say it expected
# Multi-hop benchmarks of the paper's Table 1, and the world's multi-hop question types.
MULTI_HOP_DATASETS = frozenset({"hotpotqa", "2wikimultihopqa", "2wiki", "musique", "bamboogle"})
MULTI_HOP_TYPES = frozenset({"two_hop", "comparison"})


@dataclass(frozen=True)
class Row:
    name: str
    count: int
    em: float
    f1: float
    cover_em: float
    recall: float | None
    multi_hop: bool


def _row(name: str, outcomes: Sequence[QuestionOutcome], multi_hop: bool) -> Row:
    recalls = [o.recall for o in outcomes if o.recall is not None]

    def pct(values: Sequence[float]) -> float | None:
        return 100.0 * sum(values) / len(values) if values else None

    return Row(
        name, len(outcomes), pct([o.em for o in outcomes]), pct([o.f1 for o in outcomes]),
        pct([o.cover_em for o in outcomes]), pct(recalls), multi_hop,
    )


@dataclass
class EvalTable:
    rows: list[Row]  # one per data set, then its per-type rows named "<data set>/<type>"
    m_avg: float | None
    avg: float | None
    # data set -> {"uid", "em", "recall", "answer", "queries"}: per-question lists in question order, for paired
    # comparisons and for reading what the policy did on a question
    questions: dict[str, dict[str, list]] = field(default_factory=dict)

    def to_markdown(self) -> str:
        lines = ["| data set | n | EM | F1 | cover-EM | recall |", "|---|---:|---:|---:|---:|---:|"]
        for r in self.rows:
            lines.append(f"| {r.name} | {r.count} | {r.em:.1f} | {r.f1:.1f} | {r.cover_em:.1f} | {_fmt(r.recall)} |")
        lines.append(f"\n**M-Avg.** (EM, multi-hop) {_fmt(self.m_avg)} · **Avg.** (EM, all data sets) {_fmt(self.avg)}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(
            {"rows": [asdict(r) for r in self.rows], "m_avg": self.m_avg, "avg": self.avg, "questions": self.questions},
            indent=2,
        )

    @classmethod
    def from_json(cls, table: Mapping[str, Any], source: str = "evaluation table") -> EvalTable:
        """The table :meth:`to_json` wrote, checked against :class:`TableRecord` (``source`` names it in the
        error: a file, or a kept evaluation of :mod:`bridge_ray.evaluation.cache`)."""
        return cls.from_record(validated(table, TableRecord, source))

    @classmethod
    def from_record(cls, record: TableRecord) -> EvalTable:
        return cls([Row(**row.model_dump()) for row in record.rows], record.m_avg, record.avg,
                   {name: q.model_dump(exclude_unset=True) for name, q in record.questions.items()})


# The schema of an evaluation file (``eval_<label>.json``, ``eval --out``, a kept evaluation): every reader goes
# through :func:`read_table`, so a damaged or hand-made file is refused naming the file and the field.
Score = Annotated[float, Field(ge=0, le=1)]
Percent = Annotated[float, Field(ge=0, le=100)]


class QuestionRecords(BaseModel):
    """One data set's per-question lists, in question order (``EvalTable.questions[name]``)."""

    model_config = ConfigDict(strict=True, extra="allow")

    uid: list[str | None]
    em: list[Score]
    recall: list[Score | None]
    answer: list[str | None] | None = None
    queries: list[list[str]] | None = None

    @model_validator(mode="after")
    def _one_entry_per_question(self) -> QuestionRecords:
        for name in ("em", "recall", "answer", "queries"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.uid):
                raise ValueError(f"{name} has {len(values)} entries and uid {len(self.uid)}: one per question")
        return self


class RowRecord(BaseModel):
    """One row of the table (:class:`Row`)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    name: str
    count: Annotated[int, Field(ge=1)]
    em: Percent
    f1: Percent
    cover_em: Percent
    recall: Percent | None
    multi_hop: bool


class TableRecord(BaseModel):
    """An evaluation file: its rows, averages and per-question records (other top-level keys are kept out)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    rows: list[RowRecord]
    m_avg: Percent | None
    avg: Percent | None
    questions: dict[str, QuestionRecords]


def read_table(path: str | Path) -> EvalTable:
    """The evaluation file at ``path``, checked field by field (:func:`~bridge_ray.records.read_record`)."""
    return EvalTable.from_record(read_record(path, TableRecord, EVALUATION_FILE))


def summarize(per_dataset: Mapping[str, Sequence[QuestionOutcome]]) -> EvalTable:
    """Rows per data set (and per question type), with the averages of :func:`averages`."""
    rows: list[Row] = []
    for name, outcomes in per_dataset.items():
        if not outcomes:
            raise ValueError(f"data set {name!r} has no evaluated questions")
        rows.append(_row(name, outcomes, name.lower() in MULTI_HOP_DATASETS))
        for t in sorted({o.type for o in outcomes if o.type is not None}):
            rows.append(_row(f"{name}/{t}", [o for o in outcomes if o.type == t], t in MULTI_HOP_TYPES))
    questions = {
        name: {
            "uid": [o.uid for o in outcomes], "em": [o.em for o in outcomes], "recall": [o.recall for o in outcomes],
            "answer": [o.answer for o in outcomes], "queries": [list(o.queries) for o in outcomes],
        }
        for name, outcomes in per_dataset.items()
    }
    return EvalTable(rows, *averages(rows), questions)


def averages(rows: Sequence[Row]) -> tuple[float | None, float | None]:
    """M-Avg. over multi-hop entries and Avg. over data sets.

    As in the paper, both are unweighted means of per-data-set EM. For a data set with typed questions, its
    multi-hop *types* enter M-Avg. (the world has no multi-hop data set of its own).
    """
    datasets = {r.name: r for r in rows if "/" not in r.name}
    parents = [datasets[r.name.split("/")[0]] for r in rows]
    multi_hop = [r.em for r, parent in zip(rows, parents, strict=True)
                 if r.multi_hop and (r is parent or not parent.multi_hop)]
    return _mean(multi_hop), _mean([r.em for r in datasets.values()])


def combined(tables: Sequence[EvalTable]) -> EvalTable:
    """One table of several evaluations' data sets (each measured over its own index), averaged afresh."""
    rows = [row for table in tables for row in table.rows]
    return EvalTable(rows, *averages(rows), {k: v for table in tables for k, v in table.questions.items()})


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "–"
