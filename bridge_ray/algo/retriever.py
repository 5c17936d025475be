"""The retriever's distribution over its own top-k candidates (eq. retriever_distribution)."""

from __future__ import annotations

import torch

# A finite stand-in for log 0: keeps padded candidates out of every softmax and logsumexp without
# producing nan in rows that are entirely padding.
NEG_INF = -1e9


def valid_candidates(scores: torch.Tensor, candidate_mask: torch.Tensor | None) -> torch.Tensor:
    """Boolean ``[M, K]`` mask of real (non-padding) candidates; all True when no mask is given."""
    if candidate_mask is None:
        return torch.ones_like(scores, dtype=torch.bool)
    if candidate_mask.shape != scores.shape:
        raise ValueError(f"candidate_mask {tuple(candidate_mask.shape)} != scores {tuple(scores.shape)}")
    return candidate_mask.bool()


def retrieval_log_probs(
    scores: torch.Tensor,
    temperature: float = 0.4,
    candidate_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``log rho_eta(d | h) = log_softmax_{d ∈ N_k(h)} s_eta(h, d) / tau_ret`` (eq. retriever_distribution).

    ``scores [M, K]``: relevance ``f_eta(h)ᵀ g(d)`` of the K logged candidates of each of M retrieval
    turns. The softmax runs over that fixed candidate set, never the corpus. The paper's equation has
    no temperature; its experiments use ``tau_ret = 0.4``, which sharpens a cosine-scale score range.
    Padded candidates (``candidate_mask`` 0) get a log-probability of ``NEG_INF``.
    """
    if temperature <= 0:
        raise ValueError(f"retrieval temperature must be > 0, got {temperature}")
    valid = valid_candidates(scores, candidate_mask)
    logits = torch.where(valid, scores.float() / temperature, torch.full_like(scores, NEG_INF, dtype=torch.float32))
    return torch.where(valid, torch.log_softmax(logits, dim=-1), torch.full_like(logits, NEG_INF))


def turn_weights(valid: torch.Tensor) -> torch.Tensor:
    """Per-turn weights of the empirical mean ``E_{x,i,t}`` over retrieval turns that have a candidate."""
    has_candidate = valid.any(dim=-1).float()
    return has_candidate / has_candidate.sum().clamp(min=1.0)
