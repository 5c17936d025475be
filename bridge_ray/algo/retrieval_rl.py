"""Outcome credit for retrieval: document-level clipped surrogate (eqs. app_retrieval_credit, app_retrieval_rl_loss)."""

from __future__ import annotations

import torch

from bridge_ray.algo.aggregate import masked_mean
from bridge_ray.algo.grpo import clipped_ratio_objective
from bridge_ray.algo.rag import answer_posterior
from bridge_ray.algo.retriever import turn_weights, valid_candidates


def retrieval_credit(
    old_log_rho: torch.Tensor,
    answer_logp: torch.Tensor,
    posterior_temperature: float = 0.5,
    candidate_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Credit weights ``c̄_{i,t,d}`` that split a trajectory's advantage over its candidates (eq. app_retrieval_credit).

    The paper defines ``c̄ ∝ rho_eta_old(d|h) p_theta(y|h,d)`` and separately names a posterior
    temperature of 0.5 without placing it. We read it as a temperature on the log-space joint:
    ``c̄ = softmax_d((log rho_old(d|h) + log p(y|h,d)) / tau_post)``, i.e. ``c̄ ∝ (rho_old p)^(1/tau_post)``.
    ``tau_post = 1`` recovers the equation exactly; 0.5 sharpens the credit towards the documents
    that best support the gold answer. The weights are constants of the surrogate (detached), as
    eq. app_retrieval_rl_gradient assumes.
    """
    return answer_posterior(old_log_rho, answer_logp, posterior_temperature, candidate_mask).detach()


def retrieval_rl_loss(
    log_rho: torch.Tensor,
    old_log_rho: torch.Tensor,
    credit: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float = 0.2,
    candidate_mask: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``J_RL^eta = -E_{x,i,t} Σ_d c̄ min(r A, clip(r, 1-ε_eta, 1+ε_eta) A)`` (eq. app_retrieval_rl_loss).

    ``r = rho_eta / rho_eta_old`` is the document-level importance ratio of the logged candidates;
    ``advantages [M]`` is the GRPO advantage ``A_i`` of the trajectory each retrieval turn belongs to.
    Away from the clip boundary the gradient is eq. app_retrieval_rl_gradient; past it, zero. ``weights [M]``
    (summing to 1) replaces the expectation's uniform turn weights.
    """
    valid = valid_candidates(log_rho, candidate_mask)
    log_ratio = torch.where(valid, log_rho - old_log_rho, torch.zeros_like(log_rho))
    objective, clipped = clipped_ratio_objective(log_ratio, advantages.reshape(-1, 1).float(), clip_eps, clip_eps)
    per_turn = torch.where(valid, credit * objective, torch.zeros_like(objective)).sum(dim=-1)
    loss = -(per_turn * (turn_weights(valid) if weights is None else weights)).sum()
    with torch.no_grad():
        stats = {"clipfrac": masked_mean(clipped.float(), valid), "approx_kl": masked_mean(-log_ratio, valid)}
    return loss, stats
