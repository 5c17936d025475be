"""Paired comparisons of two arms evaluated on the same questions: the mean difference and its bootstrap interval.

Two presets of ``bench learn`` that share a seed trained on the same question order with the same sampler seeds
and are evaluated on the same held-out questions, so their per-question scores pair up. Differencing question by
question removes the between-question variance (most of it: a question is easy or hard for both arms), and
resampling questions, not runs, gives an interval for the set that was asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PairedDifference:
    diff: float  # mean over seeds of the per-question mean of treated - baseline, in the scores' units
    ci_low: float
    ci_high: float
    questions: int
    seeds: int


def paired_difference(
    treated: Sequence[Sequence[float]],
    baseline: Sequence[Sequence[float]],
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> PairedDifference:
    """``treated[s][q] - baseline[s][q]`` averaged over questions q and seeds s, with a percentile bootstrap
    interval over questions: each resample draws one set of question indices (with replacement) and applies it
    to every seed, since the seeds asked the same questions. ``seed`` fixes the resampling, so a report is
    reproducible."""
    a, b = np.asarray(treated, dtype=float), np.asarray(baseline, dtype=float)
    if a.ndim != 2 or a.shape != b.shape or a.shape[1] == 0:
        raise ValueError(f"treated {a.shape} and baseline {b.shape} must be the same (seeds, questions) shape")
    per_question = (a - b).mean(axis=0)  # the seeds' mean difference on each question
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, per_question.size, size=(resamples, per_question.size))
    means = per_question[picks].mean(axis=1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return PairedDifference(float(per_question.mean()), float(low), float(high), per_question.size, a.shape[0])


def paired_set_figures(treated: Sequence[dict], baseline: Sequence[dict]) -> dict[str, float]:
    """Treated − baseline on one data set, in points: EM and recall@m differences, each with its 95% interval.

    ``treated[s]``, ``baseline[s]``: seed s's per-question record of the set (``EvalTable.questions[name]``:
    ``uid``, ``em``, ``recall``). Recall is left out where a set knows no gold passages (None).
    """
    if len(treated) != len(baseline) or not treated:
        raise ValueError(f"{len(treated)} treated and {len(baseline)} baseline evaluations do not pair up")
    if any(a["uid"] != b["uid"] for a, b in zip(treated, baseline, strict=True)):
        raise ValueError("the two arms were evaluated on different questions (their uids differ)")
    figures: dict[str, float] = {}
    for metric, key, low, high in (("em", "diff_em", "ci_low", "ci_high"),
                                   ("recall", "diff_recall_at_3", "recall_ci_low", "recall_ci_high")):
        if any(v is None for record in (*treated, *baseline) for v in record[metric]):
            continue
        diff = paired_difference([[100 * v for v in a[metric]] for a in treated],
                                 [[100 * v for v in b[metric]] for b in baseline])
        figures |= {key: round(diff.diff, 2), low: round(diff.ci_low, 2), high: round(diff.ci_high, 2)}
    return figures
