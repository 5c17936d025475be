"""The paper's medical QA table: per MIRAGE set, reasoning quality (judge) with accuracy, and two averages.

Macro averages weight the sets equally; micro averages weight the questions equally (MedMCQA's 4,183 questions
then count for over half of the five sets' 7,663), as the paper reports both. Reasoning quality of a set is the
mean of ``score * 25`` over the judgments that gave a score (0-4 -> 0-100); those that gave none (no rationale,
unparseable, an error) are counted apart rather than scored 0, so a flaky judge shows as a count, not as bad
reasoning.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from bridge_ray.data.mirage import MIRAGE_SETS


@dataclass(frozen=True)
class Answered:
    """One evaluated question: whether the choice was right and, when judged, the judge's 0-4 score."""

    correct: bool
    judged: bool = False
    score: int | None = None


@dataclass(frozen=True)
class SetResult:
    name: str
    count: int
    accuracy: float  # percent
    reasoning: float | None  # 0-100; None when not judged or no judgment gave a score
    scored: int  # judgments with a score
    unscored: int  # judgments without one (no rationale, unparseable, error)


@dataclass(frozen=True)
class MirageRow:
    """One checkpoint's row of the table."""

    label: str
    sets: list[SetResult]
    macro_accuracy: float
    micro_accuracy: float
    macro_reasoning: float | None
    micro_reasoning: float | None


def summarize_mirage(label: str, per_set: Mapping[str, Sequence[Answered]]) -> MirageRow:
    """Per-set accuracy and reasoning, and their macro and micro averages."""
    sets, every = [], []
    for name, answered in per_set.items():
        if not answered:
            raise ValueError(f"set {name!r} has no evaluated questions")
        scores = [a.score for a in answered if a.score is not None]
        sets.append(
            SetResult(
                name, len(answered), _pct([a.correct for a in answered]), _mean([25.0 * s for s in scores]),
                len(scores), sum(a.judged and a.score is None for a in answered),
            )
        )
        every.extend(answered)
    reasonings = [s.reasoning for s in sets if s.reasoning is not None]
    return MirageRow(
        label,
        sets,
        macro_accuracy=_mean([s.accuracy for s in sets]),
        micro_accuracy=_pct([a.correct for a in every]),
        macro_reasoning=_mean(reasonings) if len(reasonings) == len(sets) else None,
        micro_reasoning=_mean([25.0 * a.score for a in every if a.score is not None]),
    )


def _pct(flags: Sequence[bool]) -> float:
    return 100.0 * sum(flags) / len(flags)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _cell(reasoning: float | None, accuracy: float) -> str:
    return f"{accuracy:.2f}" if reasoning is None else f"{reasoning:.2f} ({accuracy:.2f})"


def mirage_markdown(rows: Sequence[MirageRow]) -> str:
    """The table in the paper's layout: one row per checkpoint, "reasoning (accuracy)" cells when judged."""
    names = [s.name for s in rows[0].sets]
    header = [MIRAGE_SETS.get(n, n) for n in names] + ["Macro Avg.", "Micro Avg."]
    lines = [f"| checkpoint | {' | '.join(header)} |", "|---" + "|---:" * len(header) + "|"]
    for row in rows:
        cells = [_cell(s.reasoning, s.accuracy) for s in row.sets]
        cells += [_cell(row.macro_reasoning, row.macro_accuracy), _cell(row.micro_reasoning, row.micro_accuracy)]
        lines.append(f"| {row.label} | {' | '.join(cells)} |")
    counts = ", ".join(f"{s.name} {s.count}" for s in rows[0].sets)
    lines.append(f"\nQuestions: {counts}. Cells: reasoning quality (judge, 0-100) with accuracy in parentheses when "
                 "a judge ran, else accuracy (%).")
    for row in rows:
        unscored = [f"{s.name} {s.unscored}" for s in row.sets if s.unscored]
        if unscored:
            lines.append(f"{row.label}: judgments without a score (left out of reasoning): {', '.join(unscored)}")
    return "\n".join(lines)


def mirage_json(rows: Sequence[MirageRow]) -> str:
    return json.dumps({"rows": [asdict(r) for r in rows]}, indent=2)
