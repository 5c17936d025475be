"""The paired difference and its bootstrap interval over questions."""

import numpy as np
import pytest

from bridge_ray.evaluation.paired import paired_difference


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
