"""The retriever-side objective of one BRIDGE round (eq. eta_loss, eq. penalty-decompose)."""

from __future__ import annotations

import math

import torch

from bridge_ray.algo.rag import rag_nll
from bridge_ray.algo.retrieval_rl import retrieval_credit, retrieval_rl_loss
from bridge_ray.algo.retriever import retrieval_log_probs


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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``1/(1+γ) J_RL^eta + γ/(1+γ) L_RAG`` on the logged candidate sets; its eta-gradient is eq. eta_loss / (1+γ).

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
    stats = {**stats, "rl_loss": rl.detach(), "rag_nll": rag.detach(), "loss": loss.detach()}
    return loss, stats
