import itertools
import math

import pytest
import torch

from bridge_ray.config import LearnerConfig, OptimConfig
from bridge_ray.policy_learner.lr_schedule import lr_multiplier, lr_scheduler


def test_warmup_then_constant():
    rates = [lr_multiplier(s, warmup=4, total=10, schedule="constant", min_ratio=0.0) for s in range(6)]
    assert rates == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_decays_from_peak_to_floor_and_stays():
    rate = [lr_multiplier(s, warmup=2, total=12, schedule="cosine", min_ratio=0.1) for s in range(15)]
    assert rate[:3] == [0.5, 1.0, 1.0]
    assert rate[7] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in itertools.pairwise(rate[2:]))
    assert rate[12:] == [pytest.approx(0.1)] * 3
    with pytest.raises(ValueError, match="unknown lr schedule"):
        lr_multiplier(5, warmup=0, total=10, schedule="linear", min_ratio=0.0)


def test_scheduler_follows_the_config():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=0.1)
    scheduler = lr_scheduler(optimizer, LearnerConfig(lr_schedule="cosine"), OptimConfig(lr=0.1, warmup_steps=2), 6)
    seen = []
    for _ in range(7):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen[:2] == [pytest.approx(0.05), pytest.approx(0.1)]
    assert seen[6] == pytest.approx(0.0, abs=1e-12)
