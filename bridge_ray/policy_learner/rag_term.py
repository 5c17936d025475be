"""The RAG likelihood as a function of the policy: ``L_RAG(θ, η)`` with η held fixed (eq. lrag).

The Drop and two-state estimators of Section 3.2 add ``γ ∇θ L_RAG`` terms to the RL gradient, so the answer
likelihoods ``log p_θ(y | h_t, d)`` must carry gradients in θ here, where the samplers' scorer computes
them without. The retriever side enters as fixed log-probabilities ``log ρ_η(d | h_t)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from bridge_ray.algo.rag import rag_nll
from bridge_ray.engines.base import PrefixGroup
from bridge_ray.engines.hf import shared_prefix_log_likelihoods
from bridge_ray.engines.precision import FP32, Precision

if TYPE_CHECKING:  # type hints only: the control plane imports these modules without transformers
    from transformers import PreTrainedModel


def answer_log_likelihoods(
    model: PreTrainedModel, groups: Sequence[PrefixGroup], batch_size: int, pad_token_id: int, k: int | None = None,
    precision: Precision = FP32,
) -> torch.Tensor:
    """``[M, K]`` fp32 ``log p_θ(y | h_t, d)`` of every retrieval turn's candidates, differentiable in θ.

    K is ``k``, else the most candidates of a turn; turns with fewer are padded with 0, which the caller's
    candidate mask leaves out. The forwards run in ``precision``'s context (the learner's).
    """
    k = k if k is not None else max((len(g.continuations) for g in groups), default=0)
    with precision.context(next(model.parameters()).device.type):
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


def accumulate_rag_terms(
    model: PreTrainedModel,
    groups: Sequence[Sequence[PrefixGroup]],
    log_rhos: Sequence[torch.Tensor],
    coefficients: Sequence[float],
    candidate_masks: Sequence[torch.Tensor],
    turn_weights: Sequence[float],
    *,
    batch_size: int,
    pad_token_id: int,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    precision: Precision = FP32,
) -> list[float]:
    """Backward of ``Σ_m w_m Σ_s c_s ℓ_m(θ, η_s)``, one retrieval turn at a time; returns ``Σ_m w_m ℓ_m(θ, η_s)``
    for each retriever state s.

    ``ℓ_m(θ, η) = -log Σ_d ρ_η(d | h_m) p_θ(y | h_m, d)`` is turn m's term of eq. lrag over state s's candidates
    of turn m: ``groups[s][m]`` scores them, ``log_rhos[s]`` and ``candidate_masks[s]`` [M, K] are their ``log ρ``
    and mask. With ``w_m`` = 1 / (valid turns) the sums are L_RAG and the gradient is ``Σ_s c_s ∇θ L_RAG(θ, η_s)``:
    Drop's ``γ ∇θ L_RAG(θ, η_γ)`` with ``c = (γ,)``, two-state's ``γ ∇θ [L_RAG(θ, η_γ) − L_RAG(θ, η*)]`` with
    ``c = (γ, −γ)``, η* over the logged candidates (the same group object as η_γ's at every turn) or its own.
    A group's k answer likelihoods are computed once for every state that holds it, and only one group's
    continuations are held for autograd at a time (all of a batch's at once do not fit in memory for a 270M
    policy). ``backward`` is where each group's loss goes: the DeepSpeed engine's on a policy rank, whose ZeRO
    stages partition gradients; it runs outside ``precision``'s autocast, which covers the forwards only.
    """
    sums = [0.0] * len(log_rhos)
    for m, weight in enumerate(turn_weights):
        rows = slice(m, m + 1)
        for group in {id(state[m]): state[m] for state in groups}.values():  # distinct groups, in state order
            states = [s for s, state in enumerate(groups) if state[m] is group]
            k = candidate_masks[states[0]].shape[-1]
            answer_logp = answer_log_likelihoods(model, [group], batch_size, pad_token_id, k=k, precision=precision)
            terms = [rag_nll(log_rhos[s][rows].detach().to(answer_logp.device), answer_logp,
                             candidate_masks[s][rows].to(answer_logp.device)) for s in states]
            backward(weight * sum(coefficients[s] * term for s, term in zip(states, terms, strict=True)))
            for s, term in zip(states, terms, strict=True):
                sums[s] += weight * float(term.detach())
    return sums


def accumulate_rag_nll_gradient(
    model: PreTrainedModel,
    groups: Sequence[PrefixGroup],
    log_rho: torch.Tensor,
    candidate_mask: torch.Tensor,
    *,
    batch_size: int,
    pad_token_id: int,
) -> float:
    """Backward of :func:`rag_nll_in_theta` into the parameters' ``.grad``, one retrieval turn at a time
    (:func:`accumulate_rag_terms` with one state and coefficient 1); returns ``L_RAG``."""
    turns, weights = rank_turns(candidate_mask, 0, 1)
    [value] = accumulate_rag_terms(
        model, [[groups[m] for m in turns]], [log_rho[turns]], [1.0], [candidate_mask[turns]], weights,
        batch_size=batch_size, pad_token_id=pad_token_id,
    )
    return value


def rank_turns(candidate_mask: torch.Tensor, rank: int, world_size: int) -> tuple[list[int], list[float]]:
    """Rank ``rank``'s share of the retrieval turns that have a candidate, and each one's weight in the mean.

    Every rank gets the same number of turns (ZeRO's gradient reductions pair up the ranks' backwards, as
    in :meth:`~bridge_ray.policy_learner.batch.PolicyBatch.shard`): a short share is padded with copies of a real turn
    of weight 0. The weights of all ranks' turns sum to 1, so their L_RAG terms add up to the mean over turns.
    """
    valid = torch.nonzero(candidate_mask.bool().any(dim=-1)).reshape(-1).tolist()
    if not valid:
        return [], []
    mine = valid[rank::world_size]
    padding = math.ceil(len(valid) / world_size) - len(mine)
    return mine + [valid[0]] * padding, [1.0 / len(valid)] * len(mine) + [0.0] * padding
