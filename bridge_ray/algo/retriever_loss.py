"""The retriever-side objective of one BRIDGE round (eq. eta_loss, eq. penalty-decompose)."""

from __future__ import annotations

import math

import torch

from bridge_ray.algo.rag import rag_nll
from bridge_ray.algo.retrieval_rl import retrieval_credit, retrieval_rl_loss
from bridge_ray.algo.retriever import retrieval_log_probs, turn_weights, valid_candidates


def penalty_weights(gamma: float) -> tuple[float, float]:
    """Weights ``(1/(1+γ), γ/(1+γ))`` of the RL and RAG terms of ``L_γ = J_RL + γ L_RAG``.

    Rescaling ``L_γ`` by ``1/(1+γ)`` keeps the step size comparable across γ. ``γ = 0`` trains the
    retriever on outcome credit alone (Decoupled-RL); ``γ = inf`` on the RAG likelihood alone
    (Decoupled-RAG, RAG-then-RL).
    """
    if gamma < 0 or math.isnan(gamma):
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if math.isinf(gamma):
        return 0.0, 1.0
    return 1.0 / (1.0 + gamma), gamma / (1.0 + gamma)


def retrieval_trust_kl(
    log_rho: torch.Tensor, old_log_rho: torch.Tensor, candidate_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``E_t KL(ρ_η_old(·|h_t) ‖ ρ_η(·|h_t))`` over each turn's logged candidates: a trust region for the retriever.

    Not in the paper. Its η-step bounds only the RL term (the clip of eq. app_retrieval_rl_loss, which binds
    only where advantages are non-zero); this penalty, PPO's KL-penalty form (Schulman et al. 2017), holds the
    whole step near the ranking that logged the batch, so several inner steps on one round's turns cannot fit its
    posterior at any cost to the other queries. Exact, not sampled: the candidate set is the whole support.
    Uniform over turns with a candidate, whatever the loss's turn weights: the turns the loss ignores are the
    ones a large step moves unchecked.
    """
    valid = valid_candidates(log_rho, candidate_mask)
    old_rho = torch.where(valid, old_log_rho.exp(), torch.zeros_like(old_log_rho))
    per_turn = torch.where(valid, old_rho * (old_log_rho - log_rho), torch.zeros_like(log_rho)).sum(dim=-1)
    return (per_turn * turn_weights(valid)).sum()


def retriever_loss(
    scores: torch.Tensor,
    old_scores: torch.Tensor,
    answer_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    gamma: float = 0.25,
    retrieval_temperature: float = 0.4,
    posterior_temperature: float = 0.5,
    clip_eps: float = 0.2,
    candidate_mask: torch.Tensor | None = None,
    turn_weights: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``1/(1+γ) J_RL^eta + γ/(1+γ) L_RAG`` on the logged candidate sets; its eta-gradient is eq. eta_loss / (1+γ).
    With ``kl_coef > 0``, plus ``kl_coef`` × :func:`retrieval_trust_kl` (not in the paper).

    ``scores [M, K]``: current scores ``s_eta(h, d)`` (differentiable in the LoRA factors);
    ``old_scores``: the scores logged at rollout time (``eta_old``); ``answer_logp``: ``log p_theta(y|h,d)``
    from the scorer; ``advantages [M]``: the GRPO advantage of each turn's trajectory. Theta is held
    fixed here, so ``answer_logp`` is detached. ``turn_weights [M]`` (summing to 1, e.g.
    :func:`~bridge_ray.algo.rag.evidence_turn_weights`) replaces the uniform mean over turns (the paper's).
    """
    rl_w, rag_w = penalty_weights(gamma)
    answer_logp = answer_logp.detach().float()
    log_rho = retrieval_log_probs(scores, retrieval_temperature, candidate_mask)
    old_log_rho = retrieval_log_probs(old_scores.detach(), retrieval_temperature, candidate_mask)
    credit = retrieval_credit(old_log_rho, answer_logp, posterior_temperature, candidate_mask)
    rl, stats = retrieval_rl_loss(log_rho, old_log_rho, credit, advantages, clip_eps, candidate_mask, turn_weights)
    rag = rag_nll(log_rho, answer_logp, candidate_mask, turn_weights)
    loss = rl_w * rl + rag_w * rag
    if kl_coef > 0:
        kl = retrieval_trust_kl(log_rho, old_log_rho, candidate_mask)
        loss = loss + kl_coef * kl
        stats = {**stats, "trust_kl": kl.detach()}
    stats = {**stats, "rl_loss": rl.detach(), "rag_nll": rag.detach(), "loss": loss.detach()}
    return loss, stats
