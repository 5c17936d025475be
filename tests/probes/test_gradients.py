"""The estimators' summary over batches: a percentile bootstrap interval that stays inside the values' range."""

import pytest

from bridge_ray.probes.gradients import mean_interval


def test_the_interval_holds_the_mean_within_the_values_range():
    figure = mean_interval([0.1, 0.2, 0.4, 8.0])
    assert figure["mean"] == pytest.approx(2.175)
    assert 0.1 <= figure["ci_low"] < figure["mean"] < figure["ci_high"] <= 8.0
    assert mean_interval([0.3]) == {"mean": 0.3, "ci_low": 0.3, "ci_high": 0.3}  # one batch: the value itself
