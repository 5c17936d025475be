"""Multi-turn GRPO for the policy (paper Section 2.1, eq. grpo)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch

from bridge_ray.algo.aggregate import aggregate, aggregation_weights
from bridge_ray.algo.choices import Aggregation

LOG_RATIO_CLAMP = 20.0


def group_index(group_ids: torch.Tensor | Sequence[Hashable]) -> torch.Tensor:
    """Dense 0..G-1 index of each sample's group; accepts a tensor or any hashable ids (uids)."""
    if isinstance(group_ids, torch.Tensor):
        return torch.unique(group_ids, return_inverse=True)[1].reshape(-1)
    seen: dict[Hashable, int] = {}
    return torch.tensor([seen.setdefault(g, len(seen)) for g in group_ids], dtype=torch.long)


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable],
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> torch.Tensor:
    """GRPO advantage of eq. (grpo): ``A_i = (R_i - mean_g R) / (std_g R + eps)`` per question group.

    The std is the unbiased one. A group of one has no baseline to compare against and a group of
    equal rewards carries no preference, so both get exactly 0. ``scale_by_std=False`` gives the
    Dr. GRPO variant ``R_i - mean_g R``. Group by the question id, never by a dataset row index.
    """
    r = rewards.reshape(-1).to(torch.float32)
    idx = group_index(group_ids).to(r.device)
    if idx.numel() != r.numel():
        raise ValueError(f"{r.numel()} rewards but {idx.numel()} group ids")
    n_groups = int(idx.max().item()) + 1 if idx.numel() else 0
    count = torch.zeros(n_groups, device=r.device).index_add_(0, idx, torch.ones_like(r))
    mean = torch.zeros(n_groups, device=r.device).index_add_(0, idx, r) / count.clamp(min=1)
    centred = r - mean[idx]
    sq = torch.zeros(n_groups, device=r.device).index_add_(0, idx, centred**2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()[idx]
    adv = centred / (std + eps) if scale_by_std else centred
    return torch.where((count[idx] > 1) & (std > 0), adv, torch.zeros_like(adv))


def clipped_ratio_objective(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped term ``min(r A, clip(r, 1-ε_low, 1+ε_high) A)`` and where clipping bound.

    Shared by the token-level policy surrogate (eq. grpo) and the document-level retrieval surrogate
    (eq. app_retrieval_rl_loss). The log-ratio is clamped to ±20 before ``exp`` so that a stale or
    extreme log-prob cannot overflow.
    """
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    return torch.minimum(unclipped, clipped), clipped < unclipped


def truncated_is_weights(
    learner_logp: torch.Tensor, sampler_logp: torch.Tensor, action_mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance weights ``min(π_learner_old(a) / π_sampler(a), C)`` per action token, 0 elsewhere.

    The rollout engine's kernels and precision (and, with asynchronous rounds, its older weights) make
    the distribution that drew the tokens differ from the learner's π_old. Weighting each token's
    surrogate by this ratio corrects the mismatch; truncating at ``C`` bounds the variance (truncated
    importance sampling, Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy
    RL training", as in verl). Detached: it is a weight, not a path for the gradient.
    """
    if cap <= 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    mask = action_mask.bool()
    log_w = torch.where(mask, learner_logp - sampler_logp, torch.zeros_like(learner_logp))
    weights = torch.exp(log_w.clamp(max=math.log(cap)))
    return torch.where(mask, weights, torch.zeros_like(weights)).detach()


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: Aggregation = "token-mean",
    turn_ids: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped multi-turn GRPO surrogate of eq. (grpo), to minimise, on action tokens only.

    ``logp``, ``old_logp``, ``action_mask``: ``[N, T]``; ``advantages``: ``[N]``, broadcast to every
    action token of its trajectory. Observation and prompt tokens (mask 0) get exactly zero
    gradient. ``dual_clip`` (c > 1) bounds the loss of negative-advantage tokens by ``-c A``.
    Returns the loss and detached stats: ``clipfrac``, ``approx_kl`` (mean of old - new log-prob),
    ``ratio_mean``, all over action tokens.

    ``token_weights [N, T]`` replaces ``agg``/``turn_ids``: weights from
    :func:`~bridge_ray.algo.aggregate.aggregation_weights` on a whole mini-batch, sliced to this shard,
    so that a data-parallel or micro-batched update sums to the whole mini-batch's loss. The stats then
    reduce with the same weights, so they also sum over shards.

    ``is_weights [N, T]`` (e.g. :func:`truncated_is_weights`) multiply each token's loss, detached,
    before the aggregation; the statistics describe the ratio and ignore them.
    """
    mask = action_mask.bool()
    log_ratio = torch.where(mask, logp - old_logp, torch.zeros_like(logp))
    adv = advantages.reshape(-1, 1).to(logp.dtype)
    objective, clipped = clipped_ratio_objective(log_ratio, adv, clip_low, clip_high)
    token_loss = -objective
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        token_loss = torch.where(adv < 0, torch.minimum(token_loss, -dual_clip * adv), token_loss)
    if is_weights is not None:
        token_loss = token_loss * is_weights.detach().to(token_loss.dtype)
    if token_weights is None:
        weights, stat_weights = aggregation_weights(mask, agg, turn_ids), aggregation_weights(mask)
    elif token_weights.shape != mask.shape:
        raise ValueError(f"token_weights {tuple(token_weights.shape)} != action_mask {tuple(mask.shape)}")
    else:
        weights = stat_weights = torch.where(mask, token_weights.to(logp.dtype), torch.zeros_like(logp))
    loss = aggregate(token_loss, weights)
    with torch.no_grad():
        stats = {
            "clipfrac": aggregate(clipped.float(), stat_weights),
            "approx_kl": aggregate(-log_ratio, stat_weights),
            "ratio_mean": aggregate(torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)), stat_weights),
        }
    return loss, stats
