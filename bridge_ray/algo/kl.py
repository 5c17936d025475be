"""KL to the reference policy and the entropy of the sampling distribution (eq. jrl, eq. grpo)."""

from __future__ import annotations

import torch

from bridge_ray.algo.choices import KL_KINDS, KLKind


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLKind = "k3") -> torch.Tensor:
    """Per-token estimate of ``KL(pi_theta || pi_ref)`` from sampled-token log-probs (the β term of eq. grpo).

    With ``x = log pi_ref - log pi_theta`` on a token sampled from pi_theta:
    ``k1 = -x`` (unbiased, high variance), ``k2 = x²/2`` (low variance, biased), ``k3 = e^x - x - 1``
    (unbiased and non-negative; x clamped to ±20 and the result to [-10, 10] so one outlier token
    cannot dominate the loss). Aggregate with :func:`bridge_ray.algo.aggregate.aggregate` over action
    tokens only: observation tokens were not sampled from the policy.
    """
    diff = logp - ref_logp
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "k3":
        x = (-diff).clamp(-20.0, 20.0)
        return (torch.exp(x) - x - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {KL_KINDS}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last axis; from log-softmax, so finite even with -inf logits."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    return -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(dim=-1)
