import math

import pytest
import torch

from bridge_ray.algo.estimators import theta_loss
from bridge_ray.algo.rag import answer_posterior, rag_nll, rag_score_gradient_coefficients
from bridge_ray.algo.retrieval_rl import retrieval_credit, retrieval_rl_loss
from bridge_ray.algo.retriever import retrieval_log_probs
from bridge_ray.algo.retriever_loss import penalty_weights, retrieval_trust_kl, retriever_loss

TAU = 0.4


def _retrieval_batch(m=3, k=5, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(m, d, generator=g), dim=-1).requires_grad_()
    docs = torch.nn.functional.normalize(torch.randn(m, k, d, generator=g), dim=-1)
    answer_logp = -torch.rand(m, k, generator=g) * 6
    return q, docs, answer_logp


def _scores(q, docs):
    return torch.einsum("md,mkd->mk", q, docs)


def test_retrieval_distribution_hand_computed():
    scores = torch.tensor([[0.8, 0.4, 0.0]])
    expected = torch.log_softmax(scores / TAU, -1)
    torch.testing.assert_close(retrieval_log_probs(scores, TAU), expected)
    # padding is excluded from the softmax
    masked = retrieval_log_probs(torch.tensor([[0.8, 0.4, 5.0]]), TAU, torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(masked[0, :2].exp(), torch.softmax(torch.tensor([0.8, 0.4]) / TAU, -1))
    assert masked[0, 2].exp().item() == 0.0
    # a candidate set of one has probability 1
    assert retrieval_log_probs(torch.tensor([[123.0]]), TAU).item() == 0.0


def test_rag_nll_hand_computed():
    rho = torch.tensor([[0.75, 0.25]])
    p = torch.tensor([[0.1, 0.9]])
    nll = rag_nll(rho.log(), p.log())
    assert nll.item() == pytest.approx(-math.log(0.75 * 0.1 + 0.25 * 0.9))
    # averaged over turns
    two = rag_nll(torch.cat([rho, rho]).log(), torch.cat([p, torch.tensor([[1.0, 1.0]])]).log())
    assert two.item() == pytest.approx(-math.log(0.3) / 2)


def test_rag_gradient_matches_closed_form():
    """Autograd through eq. lrag equals eq. app_retrieval_score_gradient (with the temperature)."""
    q, docs, answer_logp = _retrieval_batch()
    log_rho = retrieval_log_probs(_scores(q, docs), TAU)
    rag_nll(log_rho, answer_logp).backward()
    coef = rag_score_gradient_coefficients(log_rho.detach(), answer_logp)
    closed_form = torch.einsum("mk,mkd->md", coef, docs) / TAU / q.shape[0]
    torch.testing.assert_close(q.grad, closed_form, rtol=1e-5, atol=1e-6)
    # coefficients equal rho (1 - p / Σ rho p), written as in the paper
    rho, p = log_rho.detach().exp(), answer_logp.exp()
    torch.testing.assert_close(coef, rho * (1 - p / (rho * p).sum(-1, keepdim=True)), rtol=1e-5, atol=1e-7)


def test_credit_reading_of_posterior_temperature():
    rho_old = torch.tensor([[0.5, 0.3, 0.2]])
    p = torch.tensor([[0.2, 0.6, 0.1]])
    joint = rho_old * p
    torch.testing.assert_close(retrieval_credit(rho_old.log(), p.log(), 1.0), joint / joint.sum())
    torch.testing.assert_close(retrieval_credit(rho_old.log(), p.log(), 0.5), joint**2 / (joint**2).sum())
    assert not retrieval_credit(rho_old.log().requires_grad_(), p.log(), 0.5).requires_grad


def _rl_setup(seed=0):
    q, docs, answer_logp = _retrieval_batch(seed=seed)
    q_old = q.detach() + 0.01 * torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1))
    old_log_rho = retrieval_log_probs(_scores(q_old, docs), TAU)
    credit = retrieval_credit(old_log_rho, answer_logp, 0.5)
    return q, docs, old_log_rho, credit


def test_retrieval_rl_gradient_matches_closed_form_away_from_clip():
    """Autograd through eq. app_retrieval_rl_loss equals eq. app_retrieval_rl_gradient (κ = 1 everywhere)."""
    q, docs, old_log_rho, credit = _rl_setup()
    adv = torch.tensor([1.0, -0.7, 0.4])
    log_rho = retrieval_log_probs(_scores(q, docs), TAU)
    ratio = (log_rho - old_log_rho).exp().detach()
    assert ((ratio - 1).abs() < 0.2).all(), "test setup must stay inside the clip range"
    loss, stats = retrieval_rl_loss(log_rho, old_log_rho, credit, adv, clip_eps=0.2)
    loss.backward()
    assert stats["clipfrac"].item() == 0.0
    rho = log_rho.detach().exp()
    grad_log_rho = (docs - torch.einsum("mk,mkd->md", rho, docs)[:, None, :]) / TAU  # ∇_q log rho_d
    closed_form = -torch.einsum("mk,mkd->md", credit * adv[:, None] * ratio, grad_log_rho) / q.shape[0]
    torch.testing.assert_close(q.grad, closed_form, rtol=1e-5, atol=1e-6)


def test_retrieval_rl_gradient_zero_past_clip():
    # All credit on document 0, whose ratio exceeds 1 + eps with a positive advantage: kappa = 0.
    scores = torch.tensor([[2.0, 0.0, 0.0]], requires_grad=True)
    old_log_rho = retrieval_log_probs(torch.tensor([[0.0, 0.0, 0.0]]), TAU)
    log_rho = retrieval_log_probs(scores, TAU)
    assert (log_rho - old_log_rho)[0, 0].exp() > 1.2
    credit = torch.tensor([[1.0, 0.0, 0.0]])
    loss, stats = retrieval_rl_loss(log_rho, old_log_rho, credit, torch.tensor([1.0]), clip_eps=0.2)
    loss.backward()
    assert torch.equal(scores.grad, torch.zeros_like(scores))
    assert stats["clipfrac"].item() > 0
    # with a negative advantage the same ratio is not clipped and the gradient flows
    scores.grad = None
    loss, _ = retrieval_rl_loss(retrieval_log_probs(scores, TAU), old_log_rho, credit, torch.tensor([-1.0]))
    loss.backward()
    assert scores.grad.abs().sum() > 0


def test_retriever_loss_combines_with_penalty_weights():
    q, docs, answer_logp = _retrieval_batch()
    old_scores = _scores(q.detach() + 0.05, docs)
    adv = torch.tensor([0.5, -1.0, 1.0])
    kwargs = dict(retrieval_temperature=TAU, posterior_temperature=0.5, clip_eps=0.2)
    loss, stats = retriever_loss(_scores(q, docs), old_scores, answer_logp, adv, gamma=0.25, **kwargs)
    assert loss.item() == pytest.approx(0.8 * stats["rl_loss"].item() + 0.2 * stats["rag_nll"].item(), rel=1e-6)
    rl_only, s0 = retriever_loss(_scores(q, docs), old_scores, answer_logp, adv, gamma=0.0, **kwargs)
    rag_only, s_inf = retriever_loss(_scores(q, docs), old_scores, answer_logp, adv, gamma=math.inf, **kwargs)
    assert rl_only.item() == pytest.approx(s0["rl_loss"].item())
    assert rag_only.item() == pytest.approx(s_inf["rag_nll"].item())
    assert penalty_weights(0.25) == pytest.approx((0.8, 0.2))
    with pytest.raises(ValueError):
        penalty_weights(-1.0)


def test_trust_kl_is_the_exact_kl_of_the_logged_ranking_to_the_new_one():
    old = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.9, 0.1, 0.0]]).clamp(min=1e-30))
    new = torch.log(torch.tensor([[0.25, 0.5, 0.25], [0.5, 0.5, 0.0]]).clamp(min=1e-30))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    by_hand = [0.5 * math.log(2) + 0.25 * math.log(0.5),  # Σ_d old (log old - log new), padding left out
               0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)]
    assert retrieval_trust_kl(new, old, mask).item() == pytest.approx(sum(by_hand) / 2, rel=1e-5)
    scores = torch.randn(2, 3, requires_grad=True)
    log_rho = retrieval_log_probs(scores, TAU, mask)
    kl = retrieval_trust_kl(log_rho, log_rho.detach(), mask)
    kl.backward()
    assert kl.item() == pytest.approx(0.0, abs=1e-7) and scores.grad.abs().max() < 1e-6  # a minimum at eta_old


def test_retriever_loss_adds_the_trust_region_only_when_asked():
    q, docs, answer_logp = _retrieval_batch()
    old_scores = _scores(q.detach() + 0.3, docs)
    adv = torch.tensor([0.5, -1.0, 1.0])
    kwargs = dict(gamma=0.25, retrieval_temperature=TAU, posterior_temperature=0.5, clip_eps=0.2)
    plain, stats = retriever_loss(_scores(q, docs), old_scores, answer_logp, adv, **kwargs)
    bounded, bounded_stats = retriever_loss(_scores(q, docs), old_scores, answer_logp, adv, kl_coef=2.0, **kwargs)
    assert "trust_kl" not in stats and bounded_stats["trust_kl"].item() > 0
    assert bounded.item() == pytest.approx(plain.item() + 2.0 * bounded_stats["trust_kl"].item(), rel=1e-6)


def test_retriever_loss_finite_for_extremes():
    scores = torch.tensor([[1e3, -1e3, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # full, a set of one, all padding
    answer_logp = torch.tensor([[-1e4, -1e4, -1e4], [-1e4, 0.0, 0.0], [0.0, 0.0, 0.0]])
    loss, stats = retriever_loss(scores, scores.detach() - 1e3 * torch.eye(3), answer_logp,
                                 torch.tensor([1.0, -1.0, 1.0]), candidate_mask=mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(scores.grad).all()
    assert all(torch.isfinite(v) for v in stats.values())
    assert torch.equal(scores.grad[2], torch.zeros(3)) and torch.equal(scores.grad[1, 1:], torch.zeros(2))
    post = answer_posterior(retrieval_log_probs(scores.detach(), TAU, mask), answer_logp, 1.0, mask)
    assert torch.isfinite(post).all() and post[2].sum() == 0


def test_theta_estimators_are_the_stated_loss_combinations():
    theta = torch.tensor([0.3, -0.2], requires_grad=True)
    log_rho_gamma = torch.log_softmax(torch.tensor([[1.0, 0.0, -1.0]]), -1)
    log_rho_star = torch.log_softmax(torch.tensor([[0.0, 2.0, 0.0]]), -1)

    def answer_logp():
        return torch.log_softmax(torch.stack([theta[0], theta[1], theta.sum()])[None], -1)

    def grad(fn):
        theta.grad = None
        fn().backward()
        return theta.grad.clone()

    def rl():
        return (theta**2).sum()

    gamma = 0.25
    g_rl = grad(rl)
    g_rag_gamma = grad(lambda: rag_nll(log_rho_gamma, answer_logp()))
    g_rag_star = grad(lambda: rag_nll(log_rho_star, answer_logp()))
    bridge = grad(lambda: theta_loss("bridge", rl(), gamma=gamma))
    drop = grad(lambda: theta_loss("drop", rl(), gamma=gamma, rag_nll_penalized=rag_nll(log_rho_gamma, answer_logp())))
    two = grad(lambda: theta_loss("two_state", rl(), gamma=gamma,
                                  rag_nll_penalized=rag_nll(log_rho_gamma, answer_logp()),
                                  rag_nll_lower=rag_nll(log_rho_star, answer_logp())))
    torch.testing.assert_close(bridge, g_rl)
    torch.testing.assert_close(drop, g_rl + gamma * g_rag_gamma)
    torch.testing.assert_close(two, g_rl + gamma * g_rag_gamma - gamma * g_rag_star)
    # when the two retriever states coincide the two-state estimator reduces to BRIDGE
    same = grad(lambda: theta_loss("two_state", rl(), gamma=gamma,
                                   rag_nll_penalized=rag_nll(log_rho_gamma, answer_logp()),
                                   rag_nll_lower=rag_nll(log_rho_gamma, answer_logp())))
    torch.testing.assert_close(same, g_rl)
    with pytest.raises(ValueError, match="rag_nll_penalized"):
        theta_loss("drop", rl())
    with pytest.raises(ValueError, match="rag_nll_lower"):
        theta_loss("two_state", rl(), rag_nll_penalized=rl())


def test_gradient_agreement_is_cosine_and_relative_error():
    from bridge_ray.algo.estimators import gradient_agreement

    reference = torch.tensor([3.0, 4.0])
    assert gradient_agreement(reference * 2, reference) == pytest.approx((1.0, 1.0))
    cosine, relative = gradient_agreement(torch.tensor([4.0, -3.0]), reference)
    assert cosine == pytest.approx(0.0) and relative == pytest.approx(2**0.5)


def test_evidence_weights_leave_out_turns_whose_candidates_cannot_produce_the_answer():
    from bridge_ray.algo.rag import evidence_turn_weights, rag_nll
    from bridge_ray.algo.retriever import retrieval_log_probs

    scores = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[2] = False  # turn 2: padding only
    answer_logp = torch.full((3, 4), -20.0)
    answer_logp[0, 2] = 0.0  # turn 0: one candidate holds the answer
    answer_logp[1] = torch.tensor([-20.0, -17.0, -23.0, -19.0])  # turn 1: none does; the posterior is noise
    weights = evidence_turn_weights(retrieval_log_probs(scores, 0.4, mask), answer_logp, mask)
    assert weights[2] == 0 and weights[1] < 1e-3 and abs(float(weights.sum()) - 1) < 1e-6
    grads = {}
    for name, w in (("uniform", None), ("evidence", weights)):
        eta = scores.clone().requires_grad_(True)
        rag_nll(retrieval_log_probs(eta, 0.4, mask), answer_logp, mask, w).backward()
        grads[name] = eta.grad
    assert grads["uniform"][1].abs().max() > 0.1  # the mean trains turn 1 towards the noise
    assert grads["evidence"][1].abs().max() < 1e-3 * grads["uniform"][1].abs().max() + 1e-4
    assert torch.allclose(grads["evidence"][0], 2 * grads["uniform"][0], rtol=1e-3, atol=1e-4)  # weight ~1, not 1/2
