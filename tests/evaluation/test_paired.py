"""The paired difference and its bootstrap interval: over questions, and over seeds and questions."""

import numpy as np
import pytest

from bridge_ray.evaluation.paired import (
    QUESTION_LEVEL,
    TWO_LEVEL,
    paired_difference,
    paired_set_figures,
    two_level_means,
)


def test_paired_difference_of_a_constant_shift_has_a_zero_width_interval():
    baseline = [[0, 100, 0, 100], [100, 0, 0, 100]]
    treated = [[v + 10 for v in row] for row in baseline]
    diff = paired_difference(treated, baseline)
    assert diff.diff == pytest.approx(10.0) and diff.ci_low == pytest.approx(10.0) == diff.ci_high
    assert (diff.questions, diff.seeds) == (4, 2)


def test_interval_covers_the_mean_and_narrows_with_more_questions():
    rng = np.random.default_rng(1)
    def arms(n):
        baseline = rng.integers(0, 2, size=(3, n)) * 100
        flips = rng.random((3, n)) < 0.2  # the treated arm answers 20% of questions differently, mostly better
        treated = np.where(flips, 100 - baseline * (rng.random((3, n)) < 0.2), baseline)
        return treated.tolist(), baseline.tolist()
    small, large = paired_difference(*arms(50)), paired_difference(*arms(2000))
    for d in (small, large):
        assert d.ci_low <= d.diff <= d.ci_high
    assert large.ci_high - large.ci_low < (small.ci_high - small.ci_low) / 3
    assert large.ci_low > 0, "a real 10-point gain on 2000 paired questions is distinguished from 0"


def test_same_inputs_and_seed_give_the_same_interval_and_shapes_are_checked():
    a, b = [[100, 0, 100, 0, 100]], [[0, 0, 100, 100, 0]]
    assert paired_difference(a, b) == paired_difference(a, b)
    with pytest.raises(ValueError, match="same"):
        paired_difference([[1, 0]], [[1, 0, 1]])


def _seeds_that_disagree(offsets: list[float], questions: int = 200) -> tuple[list, list]:
    """Seed s gains ``offsets[s]`` points on every question, over question-level noise the seeds share."""
    rng = np.random.default_rng(7)
    baseline = rng.integers(0, 2, size=questions) * 100.0
    noise = rng.normal(0, 5, size=questions)
    treated = [baseline + noise + offset for offset in offsets]
    return [t.tolist() for t in treated], [baseline.tolist()] * len(offsets)


def test_seeds_that_disagree_widen_the_two_level_interval():
    """Seeds gaining +30, +2 and -4: averaged first, the questions see a steady +9.3 and a narrow interval; over
    seeds and questions the interval spans most of the seeds' spread, and each seed keeps its own difference."""
    treated, baseline = _seeds_that_disagree([30.0, 2.0, -4.0])
    two = paired_difference(treated, baseline)
    one = paired_difference([np.mean(treated, axis=0)], [baseline[0]])  # the seeds averaged first
    assert two.interval == TWO_LEVEL and one.interval == QUESTION_LEVEL
    assert two.diff == pytest.approx(one.diff)
    assert one.ci_high - one.ci_low < 2.5
    assert two.ci_high - two.ci_low > 10 * (one.ci_high - one.ci_low)
    assert two.ci_low < 2.0 < 20.0 < two.ci_high
    assert [s.diff - two.per_seed[1].diff for s in two.per_seed] == pytest.approx([28.0, 0.0, -6.0])
    assert all(s.interval == QUESTION_LEVEL and s.seeds == 1 and s.ci_low <= s.diff <= s.ci_high
               for s in two.per_seed)


def test_seeds_that_agree_give_about_the_question_level_interval():
    """Identical seeds: the seed draw changes nothing, so both intervals measure the questions alone."""
    treated, baseline = _seeds_that_disagree([5.0, 5.0, 5.0])
    two, one = paired_difference(treated, baseline), paired_difference(treated[:1], baseline[:1])
    assert two.interval == TWO_LEVEL
    assert two.ci_low == pytest.approx(one.ci_low, abs=0.3) and two.ci_high == pytest.approx(one.ci_high, abs=0.3)


def test_fewer_than_three_seeds_are_marked_question_level():
    treated, baseline = _seeds_that_disagree([30.0, -4.0])
    diff = paired_difference(treated, baseline)
    assert diff.interval == QUESTION_LEVEL and len(diff.per_seed) == 2
    averaged = paired_difference([np.mean(treated, axis=0)], [baseline[0]])
    assert (diff.ci_low, diff.ci_high) == pytest.approx((averaged.ci_low, averaged.ci_high))
    assert paired_difference(treated[:1], baseline[:1]).per_seed == ()


def test_two_level_draws_are_deterministic_under_a_fixed_seed():
    treated, baseline = _seeds_that_disagree([30.0, 2.0, -4.0, 8.0])
    assert paired_difference(treated, baseline, seed=3) == paired_difference(treated, baseline, seed=3)
    assert paired_difference(treated, baseline, seed=3) != paired_difference(treated, baseline, seed=4)
    diffs = np.asarray(treated) - np.asarray(baseline)
    means = two_level_means(diffs, 500, np.random.default_rng(0))
    assert means.shape == (500,) and np.array_equal(means, two_level_means(diffs, 500, np.random.default_rng(0)))
    assert diffs.min() <= means.min() and means.max() <= diffs.max()


def test_set_figures_say_what_the_interval_resamples_and_give_each_seed():
    def record(em):
        return {"uid": [f"q{i}" for i in range(len(em))], "em": em, "recall": [None] * len(em)}

    base = [record([0, 1, 0, 1]) for _ in range(3)]
    treated = [record([1, 1, 0, 1]), record([0, 1, 0, 1]), record([1, 1, 1, 1])]
    figures = paired_set_figures(treated, base)
    assert figures["interval"] == TWO_LEVEL and figures["diff_em"] == pytest.approx(25.0, abs=0.01)
    assert [s["diff_em"] for s in figures["per_seed"]] == [25.0, 0.0, 50.0]
    assert "diff_recall_at_3" not in figures and "diff_recall_at_3" not in figures["per_seed"][0]
    single = paired_set_figures(treated[:1], base[:1])
    assert single["interval"] == QUESTION_LEVEL and "per_seed" not in single
