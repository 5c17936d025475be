"""Log-probs through the LM head: block- and slice-wise, with a frozen head's gradient taken in the forward."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from bridge_ray.algo.logprob import token_log_probs
from bridge_ray.engines import lm_head
from bridge_ray.engines.lm_head import head_log_probs, head_logits

VOCAB = 96


def _model(cap: float | None) -> Gemma3ForCausalLM:
    config = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                              final_logit_softcapping=cap)
    torch.manual_seed(0)
    return Gemma3ForCausalLM(config).eval()


def _reference(model, hidden: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """The plain autograd computation: the whole block's logits, then one log-softmax."""
    return token_log_probs(head_logits(model, hidden, temperature), ids)


@pytest.fixture
def small_blocks(monkeypatch):
    """Head blocks of 7 rows and normaliser slices of 2, so that 20 rows cross both kinds of boundary."""
    monkeypatch.setattr(lm_head, "MAX_LOGIT_ELEMENTS", 7 * VOCAB)
    monkeypatch.setattr(lm_head, "LOGSUMEXP_ELEMENTS", 2 * VOCAB)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize(("temperature", "cap"), [(1.0, None), (0.7, None), (0.0, 3.0), (1.3, 3.0)])
def test_a_frozen_heads_log_probs_and_their_gradient_are_autograds(small_blocks, autocast, temperature, cap):
    model = _model(cap).requires_grad_(False)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(20, 32, generator=g)
    ids = torch.randint(0, VOCAB, (20,), generator=g)
    upstream = torch.randn(20, generator=g)
    results = []
    for fn in (head_log_probs, _reference):
        leaf = hidden.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logp = fn(model, leaf, ids, temperature)
        (logp * upstream).sum().backward()
        results.append((logp.detach(), leaf.grad))
    (fused, fused_grad), (plain, plain_grad) = results
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-5)
    # bf16 rounds the gradient's matmul input (onehot − p) in either order of summation: a bf16 ulp of the grads
    torch.testing.assert_close(fused_grad, plain_grad, rtol=1e-2 if autocast else 1e-5, atol=1e-3 if autocast else 1e-6)


def test_a_trained_head_gets_its_own_gradient_as_through_one_block(small_blocks):
    """A trained (tied) head takes the autograd path: the embedding's gradient equals the one-block computation's."""
    g = torch.Generator().manual_seed(2)
    hidden, ids = torch.randn(20, 32, generator=g), torch.randint(0, VOCAB, (20,), generator=g)
    grads = []
    for fn in (head_log_probs, _reference):
        model = _model(None)
        leaf = hidden.clone().requires_grad_(True)
        fn(model, leaf, ids, 0.7).sum().backward()
        grads.append((leaf.grad, model.get_output_embeddings().weight.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_without_gradients_or_rows_it_only_scores(small_blocks):
    model = _model(None).requires_grad_(False)
    hidden, ids = torch.randn(9, 32), torch.randint(0, VOCAB, (9,))
    with torch.no_grad():
        torch.testing.assert_close(head_log_probs(model, hidden, ids), _reference(model, hidden, ids, 1.0))
    assert head_log_probs(model, hidden[:0], ids[:0]).shape == (0,)
