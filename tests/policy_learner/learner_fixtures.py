"""Builders shared by the policy-learner tests: a tiny random Gemma 3 causal LM and batches for it."""

from __future__ import annotations

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from bridge_ray.policy_learner.batch import PolicyBatch
from bridge_ray.policy_learner.objective import sequence_log_probs

VOCAB = 96


def tiny_gemma3(seed: int = 0) -> Gemma3ForCausalLM:
    """2 layers, tied embeddings, sliding-window layers: the real policy's architecture in miniature."""
    config = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        sliding_window=16,
    )
    torch.manual_seed(seed)
    return Gemma3ForCausalLM(config).eval()


def make_policy_batch(
    model: torch.nn.Module, seed: int = 1, questions: int = 3, rollouts: int = 2, length: int = 14, shortest: int = 10
) -> PolicyBatch:
    """Two action turns around an observation, ragged right padding (rows of ``shortest`` to ``length`` tokens),
    sampler log-probs near the model's."""
    g = torch.Generator().manual_seed(seed)
    rows = questions * rollouts
    input_ids = torch.randint(0, VOCAB, (rows, length), generator=g)
    ends = torch.randint(shortest, length + 1, (rows,), generator=g)
    attention = (torch.arange(length)[None, :] < ends[:, None]).long()
    action = torch.zeros(rows, length, dtype=torch.long)
    action[:, 3:6] = 1  # turn 0: positions 3-5; observation 6-7; turn 1: from 8 on
    action[:, 8:] = 1
    action *= attention
    turn_ids = (torch.arange(length) >= 8).long().expand(rows, length).clone()
    zeros = torch.zeros(rows, length)
    probe = PolicyBatch(input_ids, attention, action, zeros, turn_ids, zeros[:, 0], zeros[:, 0].long())
    with torch.no_grad():
        logp = sequence_log_probs(model, probe)[0]
    return PolicyBatch(
        input_ids=input_ids,
        attention_mask=attention,
        action_mask=action,
        old_logp=logp + 0.1 * torch.randn(rows, length, generator=g),
        turn_ids=turn_ids,
        advantages=torch.randn(rows, generator=g),
        question_index=torch.arange(questions).repeat_interleave(rollouts),
    )
