"""Paired comparisons of two arms evaluated on the same questions: the mean difference and its bootstrap interval.

Two presets of ``bench learn`` that share a seed trained on the same question order with the same sampler seeds
and are evaluated on the same held-out questions, so their per-question scores pair up. Differencing question by
question removes the between-question variance (most of it: a question is easy or hard for both arms).

Over three seeds or more the interval is two-level (:func:`two_level_means`): each resample draws seeds and
questions, so it covers what other training seeds would change as well as other questions. With fewer seeds
the spread between seeds cannot be estimated, and the interval resamples questions only, with the seeds averaged
first (:func:`question_level_means`); :attr:`PairedDifference.interval` says which one a figure has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Interval = Literal["seeds+questions", "questions"]
TWO_LEVEL: Interval = "seeds+questions"  # seeds and questions resampled (three seeds or more)
QUESTION_LEVEL: Interval = "questions"  # questions only, the seeds averaged first
MIN_SEEDS_TWO_LEVEL = 3  # two seeds give a seed draw of three distinct means: no spread to speak of


@dataclass(frozen=True)
class PairedDifference:
    diff: float  # mean over seeds of the per-question mean of treated - baseline, in the scores' units
    ci_low: float
    ci_high: float
    questions: int
    seeds: int
    interval: Interval  # what the interval resamples: TWO_LEVEL or QUESTION_LEVEL
    per_seed: tuple[PairedDifference, ...] = ()  # each seed's own difference, question-level (several seeds)


def question_level_means(diffs: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap means of ``diffs [seeds, questions]`` over questions alone: the seeds' mean difference on each
    question, resampled as one set of question indices (the seeds asked the same questions)."""
    per_question = diffs.mean(axis=0)
    picks = rng.integers(0, per_question.size, size=(resamples, per_question.size))
    return per_question[picks].mean(axis=1)


def two_level_means(diffs: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap means of ``diffs [seeds, questions]`` over seeds and questions: each resample draws the seeds with
    replacement and, independently, one set of questions with replacement shared by every drawn seed, and takes the
    mean of the drawn cells (drawn k times, a seed or question weighs k).

    One shared question draw, not a draw within each seed, because seeds and questions are crossed: every seed
    asked the same questions, so a question's difficulty is common to all seeds, and drawing questions afresh
    within each seed would average that common part away and give too narrow an interval. Resampling the rows and
    the columns of a crossed table independently is Owen's pigeonhole bootstrap ("The pigeonhole bootstrap",
    Ann. Appl. Stat. 1(2), 2007), which errs on the wide side; for nested data Davison & Hinkley, *Bootstrap
    Methods and their Application* (1997), Sec. 3.8, likewise resample the top stage (here the seeds) with
    replacement. Three seeds still give a coarse seed draw, whose variance is (S-1)/S of the seeds' own, so the
    interval leans narrow when the seeds disagree much.
    """
    seeds, questions = diffs.shape
    seed_weights = _draw_weights(rng, seeds, resamples)
    question_weights = _draw_weights(rng, questions, resamples)
    return np.einsum("rs,sq,rq->r", seed_weights, diffs, question_weights)


def paired_difference(
    treated: Sequence[Sequence[float]],
    baseline: Sequence[Sequence[float]],
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> PairedDifference:
    """``treated[s][q] - baseline[s][q]`` averaged over questions q and seeds s, with a percentile bootstrap
    interval: two-level (:func:`two_level_means`) over three seeds or more, over questions alone
    (:func:`question_level_means`) below, as ``interval`` says. With several seeds, ``per_seed`` holds each seed's
    own difference and question-level interval. ``seed`` fixes the resampling, so a report is reproducible."""
    a, b = np.asarray(treated, dtype=float), np.asarray(baseline, dtype=float)
    if a.ndim != 2 or a.shape != b.shape or a.shape[1] == 0:
        raise ValueError(f"treated {a.shape} and baseline {b.shape} must be the same (seeds, questions) shape")
    diffs = a - b
    interval = TWO_LEVEL if diffs.shape[0] >= MIN_SEEDS_TWO_LEVEL else QUESTION_LEVEL
    draw = two_level_means if interval == TWO_LEVEL else question_level_means
    means = draw(diffs, resamples, np.random.default_rng(seed))
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    per_seed = tuple(paired_difference(a[s:s + 1], b[s:s + 1], resamples=resamples, level=level, seed=seed)
                     for s in range(a.shape[0])) if a.shape[0] > 1 else ()
    return PairedDifference(float(diffs.mean()), float(low), float(high), diffs.shape[1], diffs.shape[0], interval,
                            per_seed)


def paired_set_figures(treated: Sequence[dict], baseline: Sequence[dict]) -> dict[str, Any]:
    """Treated − baseline on one data set, in points: EM and recall@m differences, each with its 95% interval,
    ``interval`` (what the intervals resample) and, with several seeds, ``per_seed``: each seed's own figures.

    ``treated[s]``, ``baseline[s]``: seed s's per-question record of the set (``EvalTable.questions[name]``:
    ``uid``, ``em``, ``recall``). Recall is left out where a set knows no gold passages (None).
    """
    if len(treated) != len(baseline) or not treated:
        raise ValueError(f"{len(treated)} treated and {len(baseline)} baseline evaluations do not pair up")
    if any(a["uid"] != b["uid"] for a, b in zip(treated, baseline, strict=True)):
        raise ValueError("the two arms were evaluated on different questions (their uids differ)")
    figures: dict[str, Any] = {}
    per_seed: list[dict[str, float]] = [{} for _ in treated] if len(treated) > 1 else []
    for metric, key, low, high in (("em", "diff_em", "ci_low", "ci_high"),
                                   ("recall", "diff_recall_at_3", "recall_ci_low", "recall_ci_high")):
        if any(v is None for record in (*treated, *baseline) for v in record[metric]):
            continue
        diff = paired_difference([[100 * v for v in a[metric]] for a in treated],
                                 [[100 * v for v in b[metric]] for b in baseline])
        for target, d in ((figures, diff), *zip(per_seed, diff.per_seed, strict=True)):
            target |= {key: round(d.diff, 2), low: round(d.ci_low, 2), high: round(d.ci_high, 2)}
        figures["interval"] = diff.interval
    return figures | ({"per_seed": per_seed} if per_seed else {})


def _draw_weights(rng: np.random.Generator, n: int, resamples: int) -> np.ndarray:
    """``[resamples, n]``: how often each of n units is drawn in n draws with replacement, over n."""
    picks = rng.integers(0, n, size=(resamples, n)) + n * np.arange(resamples)[:, None]
    return np.bincount(picks.ravel(), minlength=resamples * n).reshape(resamples, n) / n
