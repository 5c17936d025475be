import math

import pytest
import torch

from bridge_ray.algo.aggregate import aggregation_weights
from bridge_ray.algo.grpo import group_advantages, policy_loss, truncated_is_weights


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    uids = ["q1", "q1", "q1", "q2", "q2", "q3"]
    adv = group_advantages(rewards, uids, eps=0.0)
    # q1: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    std = math.sqrt(1 / 3)
    expected = torch.tensor([(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected)


def test_group_advantages_groups_by_id_not_position():
    rewards = torch.tensor([1.0, 5.0, 0.0, 3.0])
    adv = group_advantages(rewards, torch.tensor([7, 9, 7, 9]), eps=0.0)
    # {1, 0}: centred ±0.5, unbiased std sqrt(0.5); {5, 3}: centred ±1, std sqrt(2)
    torch.testing.assert_close(adv[[0, 2]], torch.tensor([0.5, -0.5]) / math.sqrt(0.5))
    torch.testing.assert_close(adv[[1, 3]], torch.tensor([1.0, -1.0]) / math.sqrt(2.0))


def test_group_advantages_no_std_scaling_is_dr_grpo():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), [0, 0, 0, 0], scale_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_equal_rewards_and_singletons_give_zero_advantage():
    adv = group_advantages(torch.tensor([0.3, 0.3, 0.3, 1.0]), ["a", "a", "a", "b"])
    assert torch.equal(adv, torch.zeros(4))


def _batch(n=4, t=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=g) * 3
    logp = (old + 0.3 * torch.randn(n, t, generator=g)).requires_grad_()
    mask = torch.tensor([[0, 1, 1, 0, 1, 1], [0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [0, 1, 0, 0, 0, 0]][:n])
    return logp, old, mask


def test_policy_loss_hand_computed_clipping():
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 1.0]])).requires_grad_()
    mask = torch.ones(1, 4)
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.2)
    # A > 0: min(r, clip(r)) = [1.2, 0.5, 1.1, 1.0]
    assert loss.item() == pytest.approx(-(1.2 + 0.5 + 1.1 + 1.0) / 4)
    assert stats["clipfrac"].item() == pytest.approx(0.25)
    loss.backward()
    # clipped token (r=1.5) has zero gradient; others d(-r A / 4)/dlogp = -r/4
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5 / 4, -1.1 / 4, -1.0 / 4]]))

    loss_neg, _ = policy_loss(logp.detach(), old, torch.tensor([-1.0]), mask)
    # A < 0: min(-r, -clip(r)) = [-1.5, -0.8, -1.1, -1.0]
    assert loss_neg.item() == pytest.approx((1.5 + 0.8 + 1.1 + 1.0) / 4)


def test_dual_clip_bounds_negative_advantage_loss():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[10.0, 1.0]]))
    loss, _ = policy_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 2), dual_clip=3.0)
    assert loss.item() == pytest.approx((3.0 + 1.0) / 2)
    with pytest.raises(ValueError):
        policy_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 2), dual_clip=0.5)


def test_truncated_is_weights_hand_computed():
    learner = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    sampler = torch.tensor([[-1.5, -1.0, -0.5, float("nan")]])  # garbage off the action tokens is ignored
    mask = torch.tensor([[1, 1, 1, 0]])
    w = truncated_is_weights(learner.requires_grad_(), sampler, mask, cap=1.5)
    # exp(0.5) = 1.65 -> capped at 1.5; exp(-1) = 0.37; equal log-probs -> 1; non-action -> 0
    torch.testing.assert_close(w, torch.tensor([[1.5, math.exp(-1.0), 1.0, 0.0]]))
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(learner, sampler, mask, cap=0.0)


def test_is_weights_scale_each_token_loss_but_not_the_stats():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]])).requires_grad_()
    mask, adv = torch.ones(1, 3), torch.tensor([1.0])
    is_weights = torch.tensor([[2.0, 0.5, 1.0]])
    loss, stats = policy_loss(logp, old, adv, mask, is_weights=is_weights.requires_grad_())
    # per-token -min(r, clip(r)) A = [-1.2, -0.5, -1.1], times the weights, token-mean
    assert loss.item() == pytest.approx(-(2.0 * 1.2 + 0.5 * 0.5 + 1.0 * 1.1) / 3)
    _, plain = policy_loss(logp, old, adv, mask)
    assert all(torch.equal(stats[k], plain[k]) for k in plain)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5 * 0.5 / 3, -1.0 * 1.1 / 3]]))
    assert is_weights.grad is None, "the weights are detached"


def test_approx_kl_is_mean_old_minus_new_on_action_tokens():
    logp, old, mask = _batch()
    _, stats = policy_loss(logp, old, torch.ones(4), mask)
    m = mask.bool()
    assert stats["approx_kl"].item() == pytest.approx((old - logp.detach())[m].mean().item(), rel=1e-5)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "turn-mean"])
def test_masked_tokens_get_exactly_zero_gradient(agg):
    logp, old, mask = _batch()
    turn_ids = torch.arange(6).repeat(4, 1) // 3
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0])
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=0.99, clip_high=100.0, agg=agg, turn_ids=turn_ids)
    loss.backward()
    assert torch.all(logp.grad[mask == 0] == 0)
    assert torch.all(logp.grad[mask == 1] != 0)


def test_equal_rewards_give_zero_policy_gradient():
    logp, old, mask = _batch()
    adv = group_advantages(torch.ones(4), ["q"] * 4)
    loss, _ = policy_loss(logp, old, adv, mask, agg="turn-mean", turn_ids=torch.zeros(4, 6, dtype=torch.long))
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros_like(logp))


def test_aggregations_hand_computed():
    values = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    turn_ids = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0]])

    def agg(kind):
        return (values * aggregation_weights(mask, kind, turn_ids)).sum().item()

    assert agg("token-mean") == pytest.approx(10 / 4)
    assert agg("seq-mean-token-sum") == pytest.approx((6 + 4) / 2)
    assert agg("seq-mean-token-mean") == pytest.approx((2 + 4) / 2)
    # row 0: turns {1} and {2, 3} -> (1 + 2.5) / 2; row 1: 4
    assert agg("turn-mean") == pytest.approx(((1 + 2.5) / 2 + 4) / 2)


def test_turn_mean_weights_short_turn_like_long_turn():
    # One trajectory: a 1-token turn and a 9-token turn. Each turn gets total weight 1/2.
    mask = torch.ones(1, 10)
    turn_ids = torch.tensor([[0] + [1] * 9])
    w = aggregation_weights(mask, "turn-mean", turn_ids)
    assert w[0, 0].item() == pytest.approx(0.5)
    assert w[0, 1:].sum().item() == pytest.approx(0.5)
    # token-mean, by contrast, gives the short turn 1/10.
    assert aggregation_weights(mask, "token-mean")[0, 0].item() == pytest.approx(0.1)


def test_turn_mean_requires_turn_ids_and_rejects_unknown_agg():
    with pytest.raises(ValueError, match="turn_ids"):
        aggregation_weights(torch.ones(1, 3), "turn-mean")
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregation_weights(torch.ones(1, 3), "mean")


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "turn-mean"])
def test_policy_loss_finite_for_extreme_and_empty_inputs(agg):
    logp = torch.full((3, 5), -1e4, requires_grad=True)
    old = torch.tensor([[-1e4] * 5, [-0.1] * 5, [float("-inf")] * 5])
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    turn_ids = torch.zeros(3, 5, dtype=torch.long)
    loss, stats = policy_loss(logp, old, torch.tensor([1.0, -2.0, 3.0]), mask, agg=agg, turn_ids=turn_ids)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v) for v in stats.values())

    empty = torch.zeros(2, 4, requires_grad=True)
    loss, stats = policy_loss(empty, torch.zeros(2, 4), torch.ones(2), torch.zeros(2, 4), agg=agg,
                              turn_ids=torch.zeros(2, 4, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(empty.grad, torch.zeros(2, 4))
    assert all(v.item() == 0.0 for v in stats.values())
