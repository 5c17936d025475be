"""bench speed's arithmetic: parameter counts from a config, the update's model FLOPs, the matmul peak."""

import torch
from transformers import Gemma3TextConfig

from bridge_ray.bench.speed import matmul_gflops, model_parameters, reference_settings, update_flops


def _tiny_gemma_dir(path, tied: bool):
    config = Gemma3TextConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=tied)
    config.architectures = ["Gemma3ForCausalLM"]
    config.save_pretrained(path)
    return str(path)


def test_body_and_head_are_counted_apart_and_tied_embeddings_once(tmp_path):
    from transformers import Gemma3ForCausalLM

    tied = _tiny_gemma_dir(tmp_path / "tied", tied=True)
    body, head = model_parameters(tied)
    model = Gemma3ForCausalLM(Gemma3TextConfig.from_pretrained(tied))
    assert head == 100 * 16
    assert body == sum(p.numel() for p in model.parameters()) - 100 * 16
    untied_body, untied_head = model_parameters(_tiny_gemma_dir(tmp_path / "untied", tied=False))
    assert (untied_body, untied_head) == (body, head), "an untied head is not part of the body either"


def test_update_flops_counts_six_per_trained_token_and_two_per_forward_only_token():
    figures = {"policy/train_tokens": 20.0, "policy/attended_tokens": 10.0, "policy/action_tokens": 4.0,
               "policy/old_logp_tokens": 10.0, "policy/reference_tokens": 20.0}
    real = 1000 * 10 + 100 * 4
    assert update_flops((1000, 100), figures) == 6 * real + 2 * real / 2 + 2 * real
    assert update_flops((1000, 100), figures, lora=True) == 4 * real + 2 * real / 2 + 2 * real, "frozen base"
    assert update_flops((1000, 100), {}) == 0.0


def test_matmul_rate_is_measured_and_threads_are_restored():
    threads = torch.get_num_threads()
    assert matmul_gflops(torch.float32, 1) > 0
    assert torch.get_num_threads() == threads


def test_the_reference_fine_tunes_the_whole_policy_unless_asked_to_keep_the_configs():
    from bridge_ray.config import load_config

    for policy, lora, lr, kl, old_logp in (("full", False, 1e-5, 1e-4, "learner"),
                                           ("config", True, 2e-4, 0.0, "sampler")):
        config = load_config("jobs/configs/local_cpu.yaml", list(reference_settings(policy)))
        grpo = config.algorithm.grpo
        assert (config.learner.lora.enabled, config.optim.lr, config.learner.dtype) == (lora, lr, "float32")
        assert (grpo.kl_coef, grpo.old_logp) == (kl, old_logp)
        assert not config.engine.hf.prefix_cache, "the reference encodes each turn's prompt whole"
        assert not config.engine.hf.merge_adapter, "and serves a LoRA policy's adapter through peft"
    gap = load_config("jobs/configs/local_cpu_gap.yaml", list(reference_settings("config")))
    assert gap.learner.lora.enabled and gap.optim.lr == 5e-5, "the gap world's policy only fits as LoRA"
