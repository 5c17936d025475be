"""Treated − baseline per data set, as rows and as the table ``bench paired`` and the end of ``train`` print.

The figures are :func:`~bridge_ray.evaluation.paired.paired_set_figures`' (a paired bootstrap over questions);
this module picks the data sets both arms evaluated and lays the rows out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bridge_ray.evaluation.paired import QUESTION_LEVEL, paired_set_figures


def paired_rows(baseline: Sequence[dict[str, dict]], treated: Sequence[dict[str, dict]]) -> list[dict[str, Any]]:
    """One row per data set that every evaluation holds (``EvalTable.questions`` of each seed, in the same seed
    order on both sides): questions, seeds and the paired figures. A ValueError names the set whose questions
    do not pair up."""
    sets = [name for name in baseline[0] if all(name in q for q in (*baseline, *treated))]
    rows = []
    for name in sets:
        try:
            figures = paired_set_figures([q[name] for q in treated], [q[name] for q in baseline])
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        rows.append({"set": name, "questions": len(baseline[0][name]["uid"]), "seeds": len(baseline), **figures})
    return rows


def paired_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows of :func:`paired_rows` as a table, differences in points with their 95% intervals: the pooled row
    of each set, then with several seeds each seed's own (its interval over questions)."""
    lines = ["| set | questions | seed (nth file) | EM diff [95% CI] | recall diff [95% CI] | interval over |",
             "|---|---:|---|---|---|---|"]
    for r in rows:
        seeds = [(f"all {r['seeds']}" if r["seeds"] > 1 else "1", r, r["interval"]),
                 *[(str(n), own, QUESTION_LEVEL) for n, own in enumerate(r.get("per_seed", []), start=1)]]
        for seed, figures, interval in seeds:
            lines.append(f"| {r['set']} | {r['questions']} | {seed} | "
                         f"{_interval(figures, 'diff_em', 'ci_low', 'ci_high')} | "
                         f"{_interval(figures, 'diff_recall_at_3', 'recall_ci_low', 'recall_ci_high')} | {interval} |")
    return "\n".join(lines)


def _interval(figures: dict[str, Any], diff: str, low: str, high: str) -> str:
    """``+d [+low, +high]`` in points, or – where the set has no such figure (recall without gold passages)."""
    return f"{figures[diff]:+.1f} [{figures[low]:+.1f}, {figures[high]:+.1f}]" if diff in figures else "–"
