"""Markdown tables, the one way a bench or a sweep prints one: a header, its alignment row and the rows."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str) -> list[str]:
    """The table's lines; ``align`` has a letter per column, ``l`` (text) or ``r`` (figures)."""
    if len(align) != len(header):
        raise ValueError(f"align {align!r} has {len(align)} letters for {len(header)} columns")
    return ["| " + " | ".join(header) + " |", "|" + "".join("---|" if a == "l" else "---:|" for a in align),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


def mean_std(values: Sequence[float]) -> str:
    """``mean ± std`` to one decimal (std 0 for one value), ``–`` for none: a cell over seeds."""
    if not values:
        return "–"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} ± {std:.1f}"
