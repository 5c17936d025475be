"""The paired rows of two arms' evaluations: the data sets both hold, each paired question by question."""

from __future__ import annotations

import pytest

from bridge_ray.evaluation.paired_report import paired_markdown, paired_rows


def _set(em: list[float], recall: list[float | None]) -> dict:
    return {"uid": [f"q{i}" for i in range(len(em))], "em": em, "recall": recall}


def test_rows_pair_the_sets_both_arms_hold_and_print_their_intervals():
    baseline = {"gap": _set([0, 0, 1, 0], [0, 1, 1, 0]), "world": _set([1, 1], [None, None]), "only": _set([1], [1])}
    treated = {"gap": _set([1, 1, 1, 0], [1, 1, 1, 1]), "world": _set([1, 0], [None, None])}
    rows = paired_rows([baseline], [treated])
    assert [(r["set"], r["questions"], r["seeds"]) for r in rows] == [("gap", 4, 1), ("world", 2, 1)]
    assert rows[0]["diff_em"] == pytest.approx(50.0) and rows[0]["diff_recall_at_3"] == pytest.approx(50.0)
    assert rows[0]["ci_low"] <= 50.0 <= rows[0]["ci_high"]
    assert "diff_recall_at_3" not in rows[1]  # no gold passages: no recall
    lines = paired_markdown(rows).splitlines()
    assert lines[2].startswith(f"| gap | 4 | 1 | +50.0 [{rows[0]['ci_low']:+.1f}, {rows[0]['ci_high']:+.1f}] | +50.0 [")
    assert lines[3].startswith("| world | 2 | 1 | -50.0 [") and "| – |" in lines[3]


def test_other_questions_are_refused_naming_the_set():
    with pytest.raises(ValueError, match=r"^gap: .*different questions"):
        paired_rows([{"gap": _set([0, 1], [0, 1])}], [{"gap": {**_set([0, 1], [0, 1]), "uid": ["q0", "x"]}}])
