"""The RAG likelihood of the answer, marginalised over retrieved candidates (eq. lrag, Appendix A)."""

from __future__ import annotations

import torch

from bridge_ray.algo.retriever import NEG_INF, turn_weights, valid_candidates


def answer_posterior(
    log_rho: torch.Tensor,
    answer_logp: torch.Tensor,
    temperature: float = 1.0,
    candidate_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Answer-conditioned document weights ``softmax_d((log rho(d|h) + log p(y|h,d)) / temperature)``.

    At temperature 1 this is the exact posterior ``rho p / Σ rho p`` of eq. app_retrieval_score_gradient,
    computed in log space so that tiny likelihoods neither underflow nor divide by zero.
    """
    if temperature <= 0:
        raise ValueError(f"posterior temperature must be > 0, got {temperature}")
    valid = valid_candidates(log_rho, candidate_mask)
    joint = torch.where(valid, (log_rho + answer_logp) / temperature, torch.full_like(log_rho, NEG_INF))
    return torch.where(valid, torch.softmax(joint, dim=-1), torch.zeros_like(joint))


def rag_nll(
    log_rho: torch.Tensor,
    answer_logp: torch.Tensor,
    candidate_mask: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """``L_RAG = -E_(h,y) logsumexp_{d ∈ N_k(h)} (log rho_eta(d|h) + log p_theta(y|h,d))`` (eq. lrag).

    ``log_rho, answer_logp [M, K]`` over the M logged retrieval turns of a batch. Gradients flow to
    eta through ``log_rho`` and to theta through ``answer_logp``; the caller detaches whichever side
    is held fixed. Turns whose candidates are all padding are left out of the mean; ``weights [M]``
    (summing to 1) replaces the mean's uniform weights, e.g. by :func:`evidence_turn_weights`.
    """
    valid = valid_candidates(log_rho, candidate_mask)
    joint = torch.where(valid, log_rho + answer_logp, torch.full_like(log_rho, NEG_INF))
    per_turn = torch.logsumexp(joint, dim=-1)
    weights = turn_weights(valid) if weights is None else weights
    return -torch.where(weights > 0, per_turn, torch.zeros_like(per_turn)).mul(weights).sum()


def evidence_turn_weights(
    log_rho: torch.Tensor,
    answer_logp: torch.Tensor,
    candidate_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Turn weights ``p(y|h_t) / Σ_t' p(y|h_t')`` with ``p(y|h) = Σ_d rho(d|h) p_theta(y|h,d)`` (eq. lrag's marginal).

    A turn whose candidates cannot produce the answer (a two-hop question's first hop, a search for the wrong
    bridge entity) has a near-zero marginal, and its normalised posterior over candidates is noise; these weights
    leave such turns out. Weighting ``-log p(y|h_t)`` by ``p(y|h_t)`` at the logged retriever descends
    ``-Σ_t p(y|h_t)``, the likelihood rather than the log-likelihood. Detached: the weights are constants.
    """
    valid = valid_candidates(log_rho, candidate_mask)
    joint = torch.where(valid, log_rho + answer_logp, torch.full_like(log_rho, NEG_INF))
    marginal = torch.logsumexp(joint.detach().float(), dim=-1)
    has_candidate = valid.any(dim=-1)
    if not bool(has_candidate.any()):
        return torch.zeros_like(marginal)
    marginal = torch.where(has_candidate, marginal, torch.full_like(marginal, NEG_INF))
    return torch.where(has_candidate, torch.softmax(marginal, dim=0), torch.zeros_like(marginal))


def rag_score_gradient_coefficients(
    log_rho: torch.Tensor,
    answer_logp: torch.Tensor,
    candidate_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """RAG score-gradient coefficient ``rho(d|h) (1 - p(y|h,d) / Σ_d' rho p)`` (eq. app_retrieval_score_gradient).

    Equal to ``rho - posterior``: the gradient of one turn's ``-log Σ rho p`` with respect to its
    query embedding is ``Σ_d coef_d g(d) / tau_ret``. A negative coefficient means the answer favours
    ``d`` more than the retriever does, so descent pulls the query towards ``g(d)``.
    """
    rho = torch.where(valid_candidates(log_rho, candidate_mask), log_rho.exp(), torch.zeros_like(log_rho))
    return rho - answer_posterior(log_rho, answer_logp, 1.0, candidate_mask)
