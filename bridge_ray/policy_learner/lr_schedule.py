"""The policy learner's learning-rate schedule: linear warmup, then constant or cosine decay."""

from __future__ import annotations

import math
from functools import partial

import torch

from bridge_ray.config import LearnerConfig, OptimConfig


def lr_multiplier(step: int, *, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """Fraction of the peak lr at optimizer step ``step`` (0-based).

    Warmup reaches the peak at step ``warmup - 1`` (the first step already moves the weights); cosine
    then decays to ``min_ratio`` at step ``total`` and stays there.
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"unknown lr schedule {schedule!r}; expected 'constant' or 'cosine'")
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_scheduler(
    optimizer: torch.optim.Optimizer, learner: LearnerConfig, optim: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """``optim.lr`` × :func:`lr_multiplier`, stepped once per optimizer step (DeepSpeed steps it)."""
    rule = partial(
        lr_multiplier,
        warmup=optim.warmup_steps,
        total=total_steps,
        schedule=learner.lr_schedule,
        min_ratio=learner.min_lr_ratio,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, rule)
