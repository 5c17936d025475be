"""The three theta-gradient estimators of Section 3.2, as losses whose theta-gradient is the estimator."""

from __future__ import annotations

import torch

from bridge_ray.algo.choices import THETA_ESTIMATORS, ThetaEstimator


def theta_loss(
    estimator: ThetaEstimator,
    rl_loss: torch.Tensor,
    *,
    gamma: float = 0.25,
    rag_nll_penalized: torch.Tensor | None = None,
    rag_nll_lower: torch.Tensor | None = None,
) -> torch.Tensor:
    """Policy loss whose theta-gradient is the chosen estimator of ``∇ J_RL(θ, η*(θ))``.

    - ``bridge``: ``∇θ J_RL(θ, η_γ)`` — both RAG terms of eq. penalty-theorem dropped; one retriever state.
    - ``drop``: ``∇θ [J_RL + γ L_RAG](θ, η_γ)`` — only the value-function term dropped.
    - ``two_state``: ``drop − γ ∇θ L_RAG(θ, η*)`` (eq. penalty-theorem-2), η* a second retriever
      trained on L_RAG alone.

    ``rl_loss`` is the GRPO surrogate (eq. grpo) on rollouts drawn with η_γ. ``rag_nll_penalized`` and
    ``rag_nll_lower`` are :func:`bridge_ray.algo.rag.rag_nll` with the retriever side detached (η_γ
    and η* respectively) and ``log p_theta(y|h,d)`` differentiable in θ.
    """
    if estimator == "bridge":
        return rl_loss
    if rag_nll_penalized is None:
        raise ValueError(f"estimator {estimator!r} needs rag_nll_penalized (L_RAG at eta_gamma)")
    if estimator == "drop":
        return rl_loss + gamma * rag_nll_penalized
    if estimator == "two_state":
        if rag_nll_lower is None:
            raise ValueError("estimator 'two_state' needs rag_nll_lower (L_RAG at eta*)")
        return rl_loss + gamma * (rag_nll_penalized - rag_nll_lower)
    raise ValueError(f"unknown theta estimator {estimator!r}; expected one of {THETA_ESTIMATORS}")


def gradient_agreement(estimate: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """Cosine similarity and relative error ``‖estimate − reference‖ / ‖reference‖`` of two flat gradients.

    The two measures by which Fig. 4a–b compares the BRIDGE and Drop estimators with the two-state one.
    """
    estimate, reference = estimate.double(), reference.double()
    cosine = torch.nn.functional.cosine_similarity(estimate, reference, dim=0)
    relative = (estimate - reference).norm() / reference.norm().clamp(min=1e-30)
    return float(cosine), float(relative)
