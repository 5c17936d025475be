"""DAPO dynamic sampling: only groups with mixed rewards train the policy."""

import torch

from bridge_ray.algo.dynamic_sampling import keep_mixed_groups, mixed_groups
from bridge_ray.algo.grpo import group_advantages


def test_mixed_groups_are_those_with_nonzero_advantages():
    rewards = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    uids = ["a", "a", "b", "b", "c", "c", "d", "d"]
    assert mixed_groups(rewards, uids).tolist() == [False, True, False, True]
    nonzero = group_advantages(rewards, uids).reshape(4, 2).ne(0).any(dim=1)
    assert torch.equal(mixed_groups(rewards, uids), nonzero)


def test_keep_mixed_groups_takes_whole_groups_up_to_the_cap():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    uids = ["a", "a", "b", "b", "c", "c", "d", "d"]
    assert keep_mixed_groups(rewards, uids, 2).tolist() == [0, 1, 4, 5]
    assert keep_mixed_groups(rewards, uids, 5).tolist() == [0, 1, 4, 5, 6, 7]
    assert keep_mixed_groups(torch.zeros(4), ["a", "a", "b", "b"], 2).numel() == 0
