"""DAPO's dynamic sampling: train the policy only on question groups whose rewards differ.

A group whose G rewards are all equal has GRPO advantage exactly 0 (eq. grpo), so it adds nothing to the
policy gradient but still dilutes the token-mean and costs a forward/backward. Over-sampling questions and
keeping the mixed groups gives every update a full batch of signal.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from bridge_ray.algo.grpo import group_index


def mixed_groups(rewards: torch.Tensor, group_ids: torch.Tensor | Sequence[Hashable]) -> torch.Tensor:
    """``[num_groups]`` bool, in order of first appearance: True where the group's rewards are not all equal."""
    r = rewards.reshape(-1).to(torch.float32)
    idx = group_index(group_ids)
    n = int(idx.max()) + 1 if idx.numel() else 0
    low = torch.full((n,), float("inf")).scatter_reduce(0, idx, r, "amin")
    high = torch.full((n,), float("-inf")).scatter_reduce(0, idx, r, "amax")
    return high > low


def keep_mixed_groups(
    rewards: torch.Tensor, group_ids: torch.Tensor | Sequence[Hashable], max_groups: int
) -> torch.Tensor:
    """Row indices of the first ``max_groups`` mixed groups (all rows of each, in the input order).

    Empty when no group is mixed: the caller decides what an update without signal does.
    """
    idx = group_index(group_ids)
    keep = mixed_groups(rewards, group_ids).nonzero().reshape(-1)[:max_groups]
    return torch.isin(idx, keep).nonzero().reshape(-1)
