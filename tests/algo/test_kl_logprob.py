import math

import pytest
import torch

from bridge_ray.algo.kl import entropy_from_logits, kl_penalty
from bridge_ray.algo.logprob import sequence_log_likelihood, token_log_probs


def test_kl_estimators_hand_computed():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    d = math.log(2.0)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(d)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * d * d)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - math.log(0.5) - 1)


def test_k3_is_unbiased_estimate_of_kl():
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.2, 0.5, 0.3])
    exact = (p * (p / q).log()).sum()
    expected_k3 = (p * kl_penalty(p.log(), q.log(), "k3")).sum()
    expected_k1 = (p * kl_penalty(p.log(), q.log(), "k1")).sum()
    torch.testing.assert_close(expected_k3, exact)
    torch.testing.assert_close(expected_k1, exact)


def test_k3_clamped_and_finite_for_extremes():
    out = kl_penalty(torch.tensor([-1e4, 0.0]), torch.tensor([0.0, -1e4]), "k3")
    assert torch.isfinite(out).all() and out.max() <= 10 and out.min() >= -10
    assert torch.isfinite(kl_penalty(torch.tensor([-1e4]), torch.tensor([0.0]), "k2")).all()
    with pytest.raises(ValueError):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_entropy_uniform_and_masked_vocab():
    assert entropy_from_logits(torch.zeros(4)).item() == pytest.approx(math.log(4))
    logits = torch.tensor([0.0, 0.0, float("-inf"), 1e3])
    assert entropy_from_logits(logits).item() == pytest.approx(0.0, abs=1e-6)
    assert entropy_from_logits(torch.tensor([0.0, 0.0, float("-inf")])).item() == pytest.approx(math.log(2))


def test_token_log_probs_matches_log_softmax_and_answer_sum():
    logits = torch.randn(2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    ref = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    tok = token_log_probs(logits, labels)
    torch.testing.assert_close(tok, ref)
    answer_mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]])
    torch.testing.assert_close(sequence_log_likelihood(tok, answer_mask), (ref * answer_mask).sum(-1))
