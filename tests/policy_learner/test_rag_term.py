"""L_RAG(θ, η) with gradients in θ, on the tiny Gemma: turn-by-turn accumulation equals one backward of the mean."""

import torch
from learner_fixtures import tiny_gemma3

from bridge_ray.algo.rag import rag_nll
from bridge_ray.algo.retriever import retrieval_log_probs
from bridge_ray.engines.base import PrefixGroup
from bridge_ray.engines.hf import shared_prefix_log_likelihoods
from bridge_ray.policy_learner.rag_term import accumulate_rag_nll_gradient, answer_log_likelihoods, rag_nll_in_theta


def _groups() -> list[PrefixGroup]:
    return [
        PrefixGroup([2, 5, 9, 11], [[20, 21, 30, 31], [22, 30, 31], [23, 24, 25, 30, 31]], [2, 2, 2]),
        PrefixGroup([2, 7, 8], [[40, 41, 50], [42, 50]], [1, 1]),  # fewer candidates: padded to K = 3
    ]


def _log_rho() -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return retrieval_log_probs(torch.tensor([[0.9, 0.2, -0.3], [0.1, 0.5, 0.0]]), 0.4, mask), mask


def _flat_grad(model: torch.nn.Module) -> torch.Tensor:
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return flat


def test_answer_likelihoods_carry_gradients_and_match_the_scorer():
    model = tiny_gemma3()
    logp = answer_log_likelihoods(model, _groups(), batch_size=2, pad_token_id=0)
    assert logp.shape == (2, 3) and logp.requires_grad
    with torch.no_grad():
        for m, group in enumerate(_groups()):
            scored = shared_prefix_log_likelihoods(model, group, 2, 0)
            torch.testing.assert_close(logp[m, : scored.numel()].detach(), scored)


def test_turn_by_turn_gradient_equals_the_whole_batch_gradient():
    model = tiny_gemma3()
    log_rho, mask = _log_rho()
    whole = rag_nll_in_theta(model, _groups(), log_rho, mask, batch_size=2, pad_token_id=0)
    whole.backward()
    expected = _flat_grad(model)
    value = accumulate_rag_nll_gradient(model, _groups(), log_rho, mask, batch_size=2, pad_token_id=0)
    torch.testing.assert_close(_flat_grad(model), expected, rtol=1e-4, atol=1e-7)
    assert abs(value - float(whole.detach())) < 1e-5 and expected.abs().sum() > 0
    # η enters only through the fixed log ρ: another retriever state gives another θ-gradient
    other = retrieval_log_probs(torch.tensor([[-0.5, 0.2, 0.9], [0.5, 0.1, 0.0]]), 0.4, mask)
    accumulate_rag_nll_gradient(model, _groups(), other, mask, batch_size=2, pad_token_id=0)
    assert not torch.allclose(_flat_grad(model), expected)
    # and the value is eq. (lrag) on the scorer's likelihoods
    with torch.no_grad():
        logp = answer_log_likelihoods(model, _groups(), batch_size=2, pad_token_id=0)
    torch.testing.assert_close(torch.tensor(value), rag_nll(log_rho, logp, mask), rtol=1e-5, atol=1e-6)
