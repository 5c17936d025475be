"""Log-probabilities of given tokens: the quantities every ratio and likelihood is built from."""

from __future__ import annotations

import torch


def token_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log p(labels[..., t] | logits[..., t, :])`` without materialising the full log-softmax.

    ``logits [..., T, V]`` must already be aligned with ``labels [..., T]`` (i.e. shifted by one for
    a causal LM). Computed in fp32: bf16 log-probs are too coarse for importance ratios.
    """
    logits = logits.float()
    picked = logits.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def sequence_log_likelihood(token_logp: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """``log p(y | context) = Σ_j log p(y_j | context, y_<j)`` over the target (answer) tokens only.

    This is the teacher-forced answer likelihood of Appendix A ("Likelihood computation") that feeds
    eq. lrag and the retrieval credit; prompt, document and padding tokens are excluded by the mask.
    """
    return torch.where(target_mask.bool(), token_logp, torch.zeros_like(token_logp)).sum(dim=-1)
