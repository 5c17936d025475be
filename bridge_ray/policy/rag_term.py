"""The RAG likelihood as a function of the policy: ``L_RAG(θ, η)`` with η held fixed (eq. lrag).

The Drop and two-state estimators of Section 3.2 add ``γ ∇θ L_RAG`` terms to the RL gradient, so the answer
likelihoods ``log p_θ(y | h_t, d)`` must carry gradients in θ here, where the samplers' scorer computes
them without. The retriever side enters as fixed log-probabilities ``log ρ_η(d | h_t)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from bridge_ray.algo.rag import rag_nll
from bridge_ray.engines.base import PrefixGroup
from bridge_ray.engines.hf import shared_prefix_log_likelihoods


def answer_log_likelihoods(
    model: PreTrainedModel, groups: Sequence[PrefixGroup], batch_size: int, pad_token_id: int, k: int | None = None
) -> torch.Tensor:
    """``[M, K]`` ``log p_θ(y | h_t, d)`` of every retrieval turn's candidates, differentiable in θ.

    K is ``k``, else the most candidates of a turn; turns with fewer are padded with 0, which the caller's
    candidate mask leaves out.
    """
    k = k if k is not None else max((len(g.continuations) for g in groups), default=0)
    rows = [shared_prefix_log_likelihoods(model, g, batch_size, pad_token_id) for g in groups]
    return torch.stack([torch.nn.functional.pad(row, (0, k - row.numel())) for row in rows]) if rows else (
        torch.zeros(0, k)
    )


def rag_nll_in_theta(
    model: PreTrainedModel,
    groups: Sequence[PrefixGroup],
    log_rho: torch.Tensor,
    candidate_mask: torch.Tensor,
    *,
    batch_size: int,
    pad_token_id: int,
) -> torch.Tensor:
    """``L_RAG(θ, η)`` (eq. lrag) over the M turns of ``groups``, with ``log_rho [M, K]`` of η detached."""
    answer_logp = answer_log_likelihoods(model, groups, batch_size, pad_token_id, k=log_rho.shape[-1])
    return rag_nll(log_rho.detach(), answer_logp, candidate_mask)


def accumulate_rag_nll_gradient(
    model: PreTrainedModel,
    groups: Sequence[PrefixGroup],
    log_rho: torch.Tensor,
    candidate_mask: torch.Tensor,
    *,
    batch_size: int,
    pad_token_id: int,
) -> float:
    """Backward of :func:`rag_nll_in_theta` into the parameters' ``.grad``, one retrieval turn at a time.

    ``L_RAG`` is a mean over turns, so the turns' backwards, each scaled by 1 / (valid turns), add up to the
    whole batch's gradient while only one turn's k continuations are held for autograd (all of them at once
    do not fit in memory for a 270M policy). Returns ``L_RAG``.
    """
    valid = candidate_mask.any(dim=1)
    turns = max(int(valid.sum()), 1)
    total = 0.0
    for m, group in enumerate(groups):
        if not valid[m]:
            continue
        rows = slice(m, m + 1)
        loss = rag_nll_in_theta(
            model, [group], log_rho[rows], candidate_mask[rows], batch_size=batch_size, pad_token_id=pad_token_id
        ) / turns
        loss.backward()
        total += float(loss.detach())
    return total
