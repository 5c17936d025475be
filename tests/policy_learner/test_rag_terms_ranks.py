"""The policy ranks' L_RAG terms (Drop, two-state): what the ranks add together is γ × ∇θ of ``rag_nll_in_theta``."""

import pytest
import torch
from learner_fixtures import tiny_gemma3

from bridge_ray.algo.retriever import retrieval_log_probs
from bridge_ray.engines.base import PrefixGroup
from bridge_ray.policy_learner.rag_term import accumulate_rag_terms, rag_nll_in_theta, rank_turns

GAMMA = 0.25


def _groups() -> list[PrefixGroup]:
    return [
        PrefixGroup([2, 5, 9, 11], [[20, 21, 30, 31], [22, 30, 31], [23, 24, 25, 30, 31]], [2, 2, 2]),
        PrefixGroup([2, 7, 8], [[40, 41, 50], [42, 50]], [1, 1]),
        PrefixGroup([3, 4], [[60, 61], [62, 61], [63, 61]], [1, 1, 1]),
    ]


def _states() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """η_γ's and η*'s log ρ over the same candidates (turn 1 has two, padded to K = 3)."""
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, True]])
    penalized = retrieval_log_probs(torch.tensor([[0.9, 0.2, -0.3], [0.1, 0.5, 0.0], [0.3, 0.3, 0.1]]), 0.4, mask)
    lower = retrieval_log_probs(torch.tensor([[-0.4, 0.8, 0.1], [0.6, -0.2, 0.0], [0.0, 0.9, 0.2]]), 0.4, mask)
    return penalized, lower, mask


def _flat_grad(model: torch.nn.Module) -> torch.Tensor:
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return flat


def _own_groups() -> list[PrefixGroup]:
    """η*'s own candidates of the same three turns (the same prefixes h_t, other passages)."""
    return [
        PrefixGroup([2, 5, 9, 11], [[70, 71, 30, 31], [72, 30, 31], [73, 30, 31]], [2, 2, 2]),
        PrefixGroup([2, 7, 8], [[80, 50], [81, 82, 50], [83, 50]], [1, 1, 1]),
        PrefixGroup([3, 4], [[90, 61], [91, 61], [92, 61]], [1, 1, 1]),
    ]


def _ranks_gradient(model, log_rhos, coefficients, mask, world_size, own=None) -> tuple[torch.Tensor, list[float]]:
    """Every rank's share added into one ``.grad`` (what DeepSpeed's reduction of the ranks' backwards holds);
    η* (the second state) over the logged candidates, or with ``own`` = (its groups, its mask) over those."""
    totals = [0.0] * len(log_rhos)
    groups = _groups()  # one object per turn: every state over the logged candidates holds the same group
    state_groups = [groups, *([own[0]] if own else [groups] * (len(log_rhos) - 1))]
    masks = [mask, *([own[1]] if own else [mask] * (len(log_rhos) - 1))]
    for rank in range(world_size):
        turns, weights = rank_turns(mask, rank, world_size)
        sums = accumulate_rag_terms(model, [[g[m] for m in turns] for g in state_groups],
                                    [r[turns] for r in log_rhos], coefficients, [m[turns] for m in masks], weights,
                                    batch_size=2, pad_token_id=0)
        totals = [t + s for t, s in zip(totals, sums, strict=True)]
    return _flat_grad(model), totals


def _direct(model, log_rho, mask, groups=None) -> tuple[torch.Tensor, float]:
    value = rag_nll_in_theta(model, groups or _groups(), log_rho, mask, batch_size=2, pad_token_id=0)
    value.backward()
    return _flat_grad(model), float(value.detach())


@pytest.mark.parametrize("world_size", [1, 2])
def test_drop_term_is_gamma_times_the_rag_nll_gradient(world_size):
    model = tiny_gemma3()
    penalized, _, mask = _states()
    expected, value = _direct(model, penalized, mask)
    got, [rag_nll] = _ranks_gradient(model, [penalized], [GAMMA], mask, world_size)
    torch.testing.assert_close(got, GAMMA * expected, rtol=1e-4, atol=1e-8)
    assert rag_nll == pytest.approx(value, rel=1e-5) and expected.abs().sum() > 0


def test_two_state_term_subtracts_the_lower_states_gradient():
    model = tiny_gemma3()
    penalized, lower, mask = _states()
    g_penalized, value_penalized = _direct(model, penalized, mask)
    g_lower, value_lower = _direct(model, lower, mask)
    got, sums = _ranks_gradient(model, [penalized, lower], [GAMMA, -GAMMA], mask, world_size=2)
    torch.testing.assert_close(got, GAMMA * (g_penalized - g_lower), rtol=1e-4, atol=1e-7)
    assert sums == pytest.approx([value_penalized, value_lower], rel=1e-5)
    assert not torch.allclose(g_penalized, g_lower), "another retriever state, another θ-gradient"


def test_with_its_own_candidates_eta_stars_term_differentiates_those():
    """two_state.candidates own: η*'s term is ``γ ∇θ L_RAG(θ, η*)`` over its own candidates' continuations."""
    model = tiny_gemma3()
    penalized, _, mask = _states()
    own_mask = torch.ones(3, 3, dtype=torch.bool)
    own = retrieval_log_probs(torch.tensor([[0.2, 0.6, -0.1], [0.4, 0.0, 0.3], [-0.2, 0.5, 0.5]]), 0.4, own_mask)
    g_penalized, value_penalized = _direct(model, penalized, mask)
    g_own, value_own = _direct(model, own, own_mask, _own_groups())
    g_logged, _ = _direct(model, own, own_mask)  # the same log ρ over the logged candidates: another gradient
    got, sums = _ranks_gradient(model, [penalized, own], [GAMMA, -GAMMA], mask, 2, own=(_own_groups(), own_mask))
    torch.testing.assert_close(got, GAMMA * (g_penalized - g_own), rtol=1e-4, atol=1e-7)
    assert sums == pytest.approx([value_penalized, value_own], rel=1e-5)
    assert not torch.allclose(g_own, g_logged), "η*'s own continuations, not the logged ones"


def test_every_rank_gets_as_many_turns_and_the_weights_make_the_mean():
    mask = torch.tensor([[True, False], [False, False], [True, True], [True, True], [True, False]])
    shares = [rank_turns(mask, rank, 3) for rank in range(3)]
    assert [turns for turns, _ in shares] == [[0, 4], [2, 0], [3, 0]], "turn 1 has no candidate; pads repeat turn 0"
    assert [len(w) for _, w in shares] == [2, 2, 2]
    assert sum(sum(w) for _, w in shares) == pytest.approx(1.0)
    assert [w for _, w in shares][1:] == [[0.25, 0.0], [0.25, 0.0]]
    assert rank_turns(torch.zeros(2, 3, dtype=torch.bool), 0, 2) == ([], [])
