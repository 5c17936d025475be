"""The policy learner's pieces that need no Ray: when π_old may come from a training forward."""

import torch
from learner_fixtures import make_policy_batch, tiny_gemma3
from transformers import Gemma3ForCausalLM

from bridge_ray.policy_learner.learner import dropout_active
from bridge_ray.policy_learner.objective import sequence_log_probs


def test_dropout_anywhere_makes_the_training_forward_differ_and_is_detected():
    from peft import LoraConfig, get_peft_model

    plain = tiny_gemma3()
    assert not dropout_active(plain)
    batch = make_policy_batch(plain)
    config = plain.config.to_dict() | {"attention_dropout": 0.5}
    dropping = Gemma3ForCausalLM(type(plain.config).from_dict(config))
    dropping.load_state_dict(plain.state_dict())
    assert dropout_active(dropping)
    with torch.no_grad():
        eval_logp = sequence_log_probs(dropping.eval(), batch)[0]
        train_logp = sequence_log_probs(dropping.train(), batch)[0]
    assert (train_logp - eval_logp).abs().max() > 1e-3, "attention dropout is functional: no module to find"
    for rate, active in ((0.1, True), (0.0, False)):
        lora = LoraConfig(r=2, lora_alpha=2, lora_dropout=rate, target_modules=["q_proj"], task_type="CAUSAL_LM")
        assert dropout_active(get_peft_model(tiny_gemma3(), lora)) is active

