"""The device figures benchmarks report: parameter counts (body and head, from a model or its config alone), the
update's model FLOPs, the matmul peak."""

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from bridge_ray.reporting.measures import matmul_gflops, matmul_parameters, model_parameters, update_flops


def _tiny_gemma_dir(path, tied: bool):
    config = Gemma3TextConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=tied)
    config.architectures = ["Gemma3ForCausalLM"]
    config.save_pretrained(path)
    return str(path)


def test_body_and_head_are_counted_apart_and_tied_embeddings_once(tmp_path):
    tied = _tiny_gemma_dir(tmp_path / "tied", tied=True)
    body, head = model_parameters(tied)
    model = Gemma3ForCausalLM(Gemma3TextConfig.from_pretrained(tied))
    assert head == 100 * 16
    assert body == sum(p.numel() for p in model.parameters()) - 100 * 16
    assert matmul_parameters(model) == body + head == sum(p.numel() for p in model.parameters())
    untied_body, untied_head = model_parameters(_tiny_gemma_dir(tmp_path / "untied", tied=False))
    assert (untied_body, untied_head) == (body, head), "an untied head is not part of the body either"
    untied = Gemma3ForCausalLM(Gemma3TextConfig.from_pretrained(tmp_path / "untied"))
    assert matmul_parameters(untied) == body + head, "the input embedding is a lookup"


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
